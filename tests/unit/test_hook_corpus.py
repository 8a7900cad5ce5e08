"""A generated corpus of more than 10,000 job scripts through the real hook (lupa Lua 5.1), each
with its exact expected outcome, and never an uncaught error.

Expected outcomes: the request is parsed and resolved by the Python API (``parse_request`` +
``resolve``, which run the hook's own grammar and ``resolve`` step) and the resolved request is
mapped to Slurm fields by the table in docs/directives.md (``expected_fields``). So this checks
the hook's *staging* step against the documented table and every message against its family;
whether the staged fields make Slurm run the job where hetslurm predicts is
tests/unit/test_request_agreement.py, whose oracle is the site's nodes, not a table.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from hetslurm.errors import PlacementError
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import CallResult, HookRuntime
from hetslurm.request.language import Request, parse_request, resolve
from hetslurm.site import Site, load_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261130
MAX_SCRIPT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


@pytest.fixture(scope="module")
def rt(demo: Site) -> HookRuntime:
    return HookRuntime(render_hook(demo).text)


# The oracle ---------------------------------------------------------------------------------

PRIORITY_QOS = {"high": "high", "low": "low"}
ENERGY_LOW = ("a100",)


def expected_fields(r: Request, site: Site) -> tuple[dict[str, Any], bool]:
    """What the hook writes for a resolved request on a job with no options of its own, and
    whether it tells the user something (a note)."""
    out: dict[str, Any] = {}
    note = False
    given = set(r.given)
    gres: list[str] = []
    features: list[str] = []
    models: list[str] = []
    if r.gpus_per_node > 0:
        models = list(r.gpu_models)
        if r.energy == "low":
            keep = [m for m in (models or list(site.gpu_models())) if m in ENERGY_LOW]
            note = not keep
            models = keep or models
        if len(models) == 1:
            gres.append(f"gres:gpu:{models[0]}:{r.gpus_per_node}")
        else:
            gres.append(f"gres:gpu:{r.gpus_per_node}")
            if len(models) > 1:
                features.append("|".join(models))
    if r.fpgas_per_node > 0:
        if len(r.fpga_models) == 1:
            gres.append(f"gres:fpga:{r.fpga_models[0]}:{r.fpgas_per_node}")
        else:
            gres.append(f"gres:fpga:{r.fpgas_per_node}")
            if len(r.fpga_models) > 1:
                features.append("|".join(r.fpga_models))
    if r.cpu_only:
        features.append("cpu")
    if gres:
        out["tres_per_node"] = ",".join(gres)
    if features:
        out["features"] = features[0]
    if r.partition:
        out["partition"] = r.partition
    # Ranked fallback: two or more models go to the per-model partitions of the class's
    # partition (else the default, batch) in the request's order (docs/fallback.md).
    # Only per-model partitions with enough nodes for the job (it runs in one partition).
    ranked = [f"{r.partition or 'batch'}_{m}" for m in models
              if f"{r.partition or 'batch'}_{m}" in site.ranked
              and len(site.ranked[f"{r.partition or 'batch'}_{m}"].nodes) >= r.nodes]
    if len(ranked) > 1:
        out["partition"] = ",".join(ranked)
    qos = PRIORITY_QOS.get(r.priority) if "priority" in given else None
    qos = qos or r.qos
    if qos:
        out["qos"] = qos
    if "nodes" in given:
        out["min_nodes"] = out["max_nodes"] = r.nodes
    if "cores" in given:
        out["pn_min_cpus"] = r.cores_per_node
    if r.mem_per_node_mib is not None:
        out["min_mem_per_node"] = r.mem_per_node_mib
    loc = r.locality
    devices = r.gpus_per_node > 0 or r.fpgas_per_node > 0
    if loc.nvlink == "required" or (loc.numa == "required" and devices):
        out["bitflags"] = 16
    if loc.numa == "required" and not devices:
        out["sockets_per_node"] = 1
        if "cores" in given:
            out["cores_per_socket"] = r.cores_per_node
    if loc.switch and r.nodes > 1:
        out["req_switch"] = 1
        out["wait4switch"] = loc.switch_wait_s if loc.switch_wait_s is not None else 300
    if r.no_requeue:
        out["requeue"] = 0
    if loc.switch and r.nodes == 1:
        note = True
    return out, note


# Generators ---------------------------------------------------------------------------------

GPU_TYPES = ["h100", "a100", "h100|a100", "a100|h100", "any", "v100", "h100|v100"]
CLASSES = ["train", "inference", "stream", "io", "nope"]
MEMS = ["16G", "40G", "60G", "80G", "100G", "512M", "1T"]
LOCALITIES = ["nvlink", "numa", "switch", "nvlink:required", "numa:required",
              "switch:required", "nvlink,numa:required", "numa,switch"]
JUNK_NUMBERS = ["-1", "+4", "1.5", "1e3", "0x10", "4294967294", "18446744073709551615",
                "99999999999999999999", "inf", "nan", "4abc", " ", "\u0663", "٣", "1_000",
                "65537", "1000000", "2^31"]
UNICODE = ["héllo wörld", "日本語のコメント", "emoji 🚀🔥", "\u200b zero width", "Ω≈ç√∫",
           "עברית", "\x7f\x01 control"]


def random_request(rnd: random.Random) -> list[str]:
    words: list[str] = []
    if rnd.random() < 0.7:
        words.append(rnd.choice(["gpus", "gpus-per-node"]) + f"={rnd.choice([0, 1, 2, 4, 8])}")
        if rnd.random() < 0.5:
            words.append("gpu-type=" + rnd.choice(GPU_TYPES))
        if rnd.random() < 0.2:
            words.append("min-gpu-mem=" + rnd.choice(MEMS))
    if rnd.random() < 0.4:
        words.append("class=" + rnd.choice(CLASSES))
    if rnd.random() < 0.2:
        words.append("fpga=" + rnd.choice(["1", "2", "u280", "u280:2", "0"]))
    if rnd.random() < 0.3:
        words.append(f"nodes={rnd.choice([1, 2, 4])}")
    if rnd.random() < 0.2:
        words.append(f"cores={rnd.choice([1, 2, 4, 8])}")
    if rnd.random() < 0.2:
        words.append("mem=" + rnd.choice(["1G", "2048", "4G"]))
    if rnd.random() < 0.3:
        words.append("locality=" + rnd.choice(LOCALITIES))
        if "switch" in words[-1] and rnd.random() < 0.5:
            words.append("switch-wait=" + rnd.choice(["60", "10m", "1:00:00"]))
    if rnd.random() < 0.15:
        words.append("priority=" + rnd.choice(["normal", "low", "high"]))
    if rnd.random() < 0.15:
        words.append("energy=" + rnd.choice(["low", "normal"]))
    if rnd.random() < 0.1:
        words.append("no-requeue")
    if rnd.random() < 0.1:
        words.append("on-idle=" + rnd.choice(["notify", "downgrade"]))
    rnd.shuffle(words)
    return words


def wrap(rnd: random.Random, words: list[str]) -> tuple[str, int]:
    """A script holding ``words`` on one or more #HET lines, with noise around them.

    Returns the script and the line number of its first #HET line.
    """
    lines = ["#!/bin/bash"]
    for _ in range(rnd.randint(0, 3)):
        lines.append(rnd.choice(["#SBATCH -t 10", "", "   ", "# " + rnd.choice(UNICODE),
                                 "  # indented", "#SBATCH --comment=x"]))
    first = len(lines) + 1
    chunks: list[list[str]] = [[]]
    for w in words:
        if chunks[-1] and rnd.random() < 0.3:
            chunks.append([])
        chunks[-1].append(w)
    for chunk in chunks:
        lines.append("#HET " + (" " * rnd.randint(1, 3)).join(chunk) if chunk else "#HET")
        if rnd.random() < 0.2:
            lines.append("#SBATCH -N 1" if rnd.random() < 0.5 else "")
    lines += ["srun hostname", "#HET gpus=99 after the header is ignored"]
    return "\n".join(lines) + "\n", first


def _resolve_words(message: str) -> str:
    """The words the hook's message shares with resolve()'s for the same mistake."""
    for words in ("is not in site", "has no such class", "runs on CPU-only nodes",
                  "min-gpu-mem=", "has none"):
        if words in message:
            return words
    raise AssertionError(f"resolve() gave a message the corpus does not know: {message}")


def show(token: str) -> str:
    # Per byte, as the Lua grammar sees UTF-8.
    out = "".join(chr(b) if 0x20 <= b < 0x7F else "?" for b in token.encode("utf-8"))
    return "'" + (out[:37] + "..." if len(out) > 40 else out) + "'"


Case = tuple[str, dict[str, Any], str, Any]  # id, job values, kind, expectation


def corpus(site: Site) -> list[Case]:
    rnd = random.Random(SEED)
    cases: list[Case] = []
    # 1. random requests, scripts and comments: 8,000
    for i in range(8000):
        words = random_request(rnd)
        text = " ".join(words)
        job = {"comment": "het: " + text} if i % 5 == 0 else {"script": wrap(rnd, words)[0]}
        try:
            parsed = parse_request(text)
        except PlacementError as e:
            cases.append((f"req{i}", job, "reject-endswith", str(e)))
            continue
        try:
            r = resolve(parsed, site)
        except PlacementError as e:
            cases.append((f"req{i}", job, "reject-contains", _resolve_words(str(e))))
            continue
        fields, note = expected_fields(r, site)
        cases.append((f"req{i}", job, "fields-with-note" if note else "fields", fields))
    # 2. malformed and huge numbers: exact message
    for i in range(1200):
        key = rnd.choice(["gpus", "gpus-per-node", "nodes", "cores"])
        junk = rnd.choice(JUNK_NUMBERS) + ("9" * rnd.randint(0, 50) if rnd.random() < 0.2 else "")
        if not junk.strip():
            junk = "x" + junk
        junk = junk.replace(" ", "_")
        script, first = wrap(rnd, [f"{key}={junk}"])
        cases.append((f"num{i}", {"script": script}, "reject-line", (first, show(f"{key}={junk}"))))
    # 3. conflicting keys: the same key twice, on different lines
    for i in range(800):
        key = rnd.choice(["gpus=1", "class=train", "nodes=2", "energy=low", "priority=low",
                          "mem=1G", "cores=2"])
        other = key.split("=")[0] + "=" + rnd.choice(["3", "io", "normal", "4G"])
        pad = ["#SBATCH -N1"] * rnd.randint(0, 3)
        script = "\n".join(["#!/bin/sh", f"#HET {key}", *pad, f"#HET {other}", "true"]) + "\n"
        line = 3 + len(pad)
        cases.append((f"dup{i}", {"script": script}, "reject-exact",
                      f"#HET line {line}: {show(other)}: key '{key.split('=')[0]}' is given twice "
                      f"(first as {show(key)})"))
    # 4. unicode and binary-ish scripts without directives: unchanged
    for i in range(500):
        body = "".join(rnd.choice(UNICODE) + "\n" for _ in range(rnd.randint(1, 20)))
        header = "".join("# " + rnd.choice(UNICODE) + "\n" for _ in range(rnd.randint(0, 5)))
        cases.append((f"uni{i}", {"script": "#!/bin/sh\n" + header + body}, "unchanged", None))
    # 5. unicode inside directives: rejected with a printable ASCII message
    for i in range(300):
        word = (rnd.choice(["gpu-type=", "class=", "", "locality="]) + "\u00e9"
                + rnd.choice(UNICODE))
        script, first = wrap(rnd, [word.split()[0]])
        cases.append((f"unidir{i}", {"script": script}, "reject-line",
                      (first, show(word.split()[0]))))
    return cases


def big_cases() -> list[Case]:
    """64 KiB lines, 100,000 directive lines, scripts up to (and past) the 4 MB limit."""
    bound = ("reject-exact", "#HET line 2: the #HET lines hold more than 1024 bytes of request "
             "(the size of a Slurm comment); shorten them")
    cases: list[Case] = []
    long_line = "#HET " + "gpus=1 " * (65536 // 7)
    cases.append(("line64k", {"script": "#!/bin/sh\n" + long_line + "\ntrue\n"}, *bound))
    cases.append(("comment64k", {"script": "#!/bin/sh\n#" + "x" * 65536 + "\n#HET gpus=1\n"},
                  "fields", {"tres_per_node": "gres:gpu:1"}))
    cases.append(("body64k", {"script": "#!/bin/sh\n#HET gpus=1\n" + "y" * 65536 + "\n"},
                  "fields", {"tres_per_node": "gres:gpu:1"}))
    many = "#!/bin/sh\n" + "#HET energy=normal\n" * 100_000 + "true\n"
    cases.append(("dir100k", {"script": many}, "reject-exact",
                  "#HET line 66: more than 64 #HET lines; a request has at most 32 words, so put "
                  "several on one line"))
    empty_many = "#!/bin/sh\n" + "#HET\n" * 100_000 + "true\n"
    cases.append(("emptydir100k", {"script": empty_many}, "reject-exact",
                  "#HET line 66: more than 64 #HET lines; a request has at most 32 words, so put "
                  "several on one line"))
    sbatch_many = "#!/bin/sh\n" + "#SBATCH --comment=x\n" * 100_000 + "#HET gpus=2\ntrue\n"
    # The header is walked at most MAX_HEADER_LINES (10,000) lines toward a #HET line: past
    # that the job is refused, never read slowly (docs/security.md).
    cases.append(("sbatch100k", {"script": sbatch_many}, "reject-exact",
                  "script line 10001: more than 10000 header lines before a line starting "
                  "with #HET; put the #HET lines at the top of the script"))
    sbatch_most = "#!/bin/sh\n" + "#SBATCH --comment=x\n" * 9_998 + "#HET gpus=2\ntrue\n"
    cases.append(("sbatch10k", {"script": sbatch_most}, "fields",
                  {"tres_per_node": "gres:gpu:2"}))
    filler = "#" + "z" * 1022 + "\n"
    header4m = "#!/bin/sh\n" + filler * ((MAX_SCRIPT - 100) // len(filler))
    cases.append(("header4m", {"script": header4m + "#HET gpus=4\ntrue\n"}, "fields",
                  {"tres_per_node": "gres:gpu:4"}))
    body4m = "#!/bin/sh\n#HET class=io\n" + ("echo " + "b" * 1018 + "\n") * 4090
    cases.append(("body4m", {"script": body4m}, "fields", {"features": "cpu", "partition": "cpu"}))
    past = "#!/bin/sh\n" + filler * (MAX_SCRIPT // len(filler) + 2) + "#HET gpus=4\ntrue\n"
    cases.append(("past4m", {"script": past}, "unchanged", None))  # never read past 4 MB
    huge_token = "#!/bin/sh\n#HET gpus=" + "9" * 1000 + "\n"
    cases.append(("hugenum", {"script": huge_token}, "reject-line",
                  (2, show("gpus=" + "9" * 1000))))
    return cases


def check(res: CallResult, kind: str, expect: Any) -> str | None:
    """None when ``res`` is what ``kind``/``expect`` says, else why not."""
    if not res.ok:
        return f"uncaught error: {res.error}"
    if any(level == "error" for level, _ in res.log):
        return f"internal error logged: {res.log}"
    fields = {f: v for f, v in res.writes if f != "admin_comment"}
    if kind in ("fields", "fields-with-note"):
        if res.rc != 0:
            return f"rejected: {res.user_messages}"
        if fields != expect:
            return f"wrote {fields}, expected {expect}"
        if kind == "fields" and res.user_messages:
            return f"unexpected notes {res.user_messages}"
        if fields and not res.fields.get("admin_comment", "").startswith("hetslurm:{"):
            return "no decision record"
        return None
    if kind == "unchanged":
        return None if res.rc == 0 and not res.writes else f"changed: {res.writes}"
    if res.rc == 0 or res.writes:
        return f"accepted: {res.writes}"
    if len(res.user_messages) != 1:
        return f"messages: {res.user_messages}"
    msg = res.user_messages[0]
    if not (msg.isascii() and msg.isprintable()):
        return f"message not printable ASCII: {msg!r}"
    if kind == "reject-exact":
        return None if msg == expect else f"message {msg!r} != {expect!r}"
    located = re.match(r"^(#HET line \d+|--comment het:): ", msg)
    if kind == "reject-endswith":
        ok = located and msg.endswith(": " + expect)
        return None if ok else f"message {msg!r} does not end with {expect!r}"
    if kind == "reject-contains":
        return None if located and expect in msg else f"message {msg!r} lacks {expect!r}"
    if kind == "reject-line":
        line, token = expect
        prefix = f"#HET line {line}: {token}"
        return None if msg.startswith(prefix) else f"message {msg!r} lacks {prefix!r}"
    return f"unknown kind {kind}"


def test_corpus(rt: HookRuntime, demo: Site) -> None:
    cases = corpus(demo) + big_cases()
    assert len(cases) >= 10_000
    failures = []
    for case_id, job, kind, expect in cases:
        res = rt.submit({"user_name": "root", **job})
        why = check(res, kind, expect)
        if why:
            failures.append(f"{case_id}: {why}")
    assert not failures, f"{len(failures)} of {len(cases)} failed:\n" + "\n".join(failures[:20])


def test_corpus_covers_every_outcome(demo: Site) -> None:
    kinds = {kind for _, _, kind, _ in corpus(demo)}
    assert kinds >= {"fields", "fields-with-note", "reject-endswith", "reject-contains",
                     "reject-line",
                     "reject-exact", "unchanged"}
