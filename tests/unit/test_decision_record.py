"""The decision record: one format written by the Lua hook, one typed Python decoder
(issue 19, item 2). The round trip runs over the whole generated hook corpus."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_hook_corpus import corpus

from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.request.language import format_request, parse_request
from hetslurm.request.record import RECORD_VERSION, DecisionRecord, find_record
from hetslurm.site import Site, load_site

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


def _gpu_text(fields: dict[str, object]) -> str | None:
    """The GPU models as Slurm holds them: a typed gres's model, else the feature list."""
    for entry in str(fields.get("tres_per_node") or "").split(","):
        parts = entry.split(":")
        if parts[:2] == ["gres", "gpu"]:
            if len(parts) == 4:
                return parts[2]
            return str(fields.get("features") or "any")
    return None


def test_every_record_of_the_corpus_round_trips(demo: Site) -> None:
    rt = HookRuntime(render_hook(demo).text)
    checked = empty = 0
    failures: list[str] = []
    for cid, job, _kind, _expect in corpus(demo):
        res = rt.submit(job)
        if res.rc != 0 or not res.writes:
            continue
        fields = dict(res.writes)
        rec = find_record(fields.get("admin_comment"))
        if rec is None:
            failures.append(f"{cid}: no record in {fields.get('admin_comment')!r}")
            continue
        checked += 1
        want_set = tuple(f for f, _ in res.writes if f != "admin_comment")
        req = rec.parsed()
        problems = []
        if rec.version != RECORD_VERSION or not rec.enforced or rec.rules is None:
            problems.append(f"header {rec}")
        if rec.set_fields != want_set:
            problems.append(f"set {rec.set_fields} != {want_set}")
        if rec.source != ("comment" if "comment" in job else "script"):
            problems.append(f"src {rec.source}")
        if rec.request is None:
            # An empty request ("#HET" alone, "het: "): the hook leaves "req" out.
            empty += 1
            if rec.workload_class or rec.gpu or rec.fpga:
                problems.append(f"no req but {rec}")
        elif req is None or format_request(req) != rec.request:
            problems.append(f"req {rec.request!r} is not canonical")
        elif req.workload_class != rec.workload_class:
            problems.append(f"class {rec.workload_class} != {req.workload_class}")
        elif req.energy != (rec.energy or "normal") or req.on_idle != rec.on_idle:
            problems.append(f"energy/on_idle {rec.energy}/{rec.on_idle}")
        if req is not None and req.gpus_per_node and rec.gpu != _gpu_text(fields):
            problems.append(f"gpu {rec.gpu!r} != {_gpu_text(fields)!r} ({fields})")
        if problems:
            failures.append(f"{cid}: " + "; ".join(problems))
    assert not failures, f"{len(failures)} records:\n" + "\n".join(failures[:20])
    assert checked > 3000 and empty < checked // 10, (checked, empty)


def test_a_request_parsed_from_the_record_is_the_one_submitted(demo: Site) -> None:
    rt = HookRuntime(render_hook(demo).text)
    text = "gpus=2 class=train energy=low on-idle=notify no-requeue"
    res = rt.submit({"script": f"#!/bin/sh\n#HET {text}\ntrue\n"})
    rec = find_record(res.fields["admin_comment"])
    assert rec is not None and rec.parsed() is not None
    assert rec.parsed() == parse_request(format_request(parse_request(text)))
    assert (rec.workload_class, rec.gpu, rec.energy, rec.on_idle) == (
        "train", "a100", "low", "notify")
    assert rec.gpu_models == ("a100",)


@pytest.mark.parametrize(("text", "want"), [
    # the hook's own, after other tools' text (jobstats' JS1:)
    ('JS1:abc hetslurm:{"v":1,"rules":"r","mode":"enforce","src":"script",'
     '"outcome":"rewrite","class":"train","gpu":"h100|a100","set":"tres_per_node,features",'
     '"kept":"qos","req":"gpus=2 class=train"}',
     DecisionRecord(1, rules="r", mode="enforce", source="script", outcome="rewrite",
                    workload_class="train", gpu="h100|a100",
                    set_fields=("tres_per_node", "features"), kept=("qos",),
                    request="gpus=2 class=train")),
    # a record cut to its bound (optional fields dropped from the end)
    ('hetslurm:{"v":1,"rules":"r","mode":"shadow"}',
     DecisionRecord(1, rules="r", mode="shadow")),
    # a later version: the fields this reader knows
    ('hetslurm:{"v":2,"outcome":"rewrite","req":"gpus=1","new":"x"}',
     DecisionRecord(2, outcome="rewrite", request="gpus=1")),
])
def test_records_decode(text: str, want: DecisionRecord) -> None:
    assert find_record(text) == want


@pytest.mark.parametrize("text", [
    None, "", "no record here", "hetslurm:", "hetslurm:{", 'hetslurm:{"v":1',
    'hetslurm:{"v":1} hetslurm:{"v":1}',           # two markers: neither is trusted
    'xhetslurm:{"v":1}',                            # not at a word start
    'hetslurm:{"outcome":"rewrite"}',               # no version
    'hetslurm:{"v":0}', 'hetslurm:{"v":"1"}', 'hetslurm:{"v":true}', 'hetslurm:{"v":1.5}',
    'hetslurm:{"v":1,"req":2}', 'hetslurm:{"v":1,"set":null,"class":["x"]}',
    'hetslurm:{"v":1,"class":{}}',
    'hetslurm:[1]',
])
def test_what_is_not_a_record(text: str | None) -> None:
    assert find_record(text) is None


def test_the_key_is_the_sites() -> None:
    text = 'site:{"v":1,"class":"io"}'
    assert find_record(text) is None
    rec = find_record(text, "site")
    assert rec is not None and rec.workload_class == "io"
