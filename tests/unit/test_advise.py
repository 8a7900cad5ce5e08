"""``hetslurm advise`` (issue 22 item 5): one pass over accounting proposes a whole site file
with class rankings, [levers.speed], [classify] rules and a memory default per class, each
with its evidence; bad input (a model the site lacks, too few jobs, hostile names) gives a
clear message and nothing written. The live path (apply, rollback) is
tests/cluster/test_advise_live.py."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from hetslurm.audit.advise import AdviseRequest, comment, propose
from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.lab.bench_learn import generate
from hetslurm.metrics.store import empty_frame
from hetslurm.site.load import parse_site
from hetslurm.slurm.sacct import JobUsage

ROOT = Path(__file__).resolve().parents[2]
DEMO_TEXT = (ROOT / "site-configs" / "demo.toml").read_text()
REQ = AdviseRequest(since=0, until=10_000, use_scripts=False)


def _row(job_id: int, user: str, name: str, node: str, gpus: int, elapsed: float,
         wclass: str) -> dict[str, Any]:
    model = {"gpu1": "h100", "gpu2": "h100", "gpu3": "a100", "gpu4": "a100"}.get(node, "")
    return {"job_id": job_id, "run": 0, "name": name, "user": user, "account": "a",
            "partition": "gpu" if gpus else "cpu", "state": "COMPLETED", "submit": 900.0,
            "eligible": 900.0, "start": 1000.0, "end": 1000.0 + elapsed, "elapsed": elapsed,
            "nodes": node, "gpus": gpus, "gpu_model": model if gpus else "", "typed": False,
            "constraints": "", "comment": "", "admin_comment": "", "wclass": wclass}


def _history(a100_factor: float = 0.5, runs: int = 6) -> tuple[Any, dict[int, JobUsage]]:
    """Class ``train`` jobs of four recurring names, each run ``runs`` times on an H100 and
    on an A100 (an A100 run takes ``a100_factor`` of an H100's, with a little noise), a CPU
    job that holds no GPU, one with a hostile name, runs of a hostile class."""
    rows, usage = [], {}
    jid = 0
    for g in range(4):
        for k in range(runs):
            for node, f in (("gpu1", 1.0), ("gpu3", a100_factor)):
                jid += 1
                rows.append(_row(jid, "ann", f"job{g}", node, 1,
                                 (600.0 + 100 * g) * f * (1 + 0.01 * (k % 3)), "train"))
                usage[jid] = JobUsage(jid, 10.0, 1000.0 + 10 * jid, None, None)
    for name in ("prep.sh", "x\n[evil]"):
        for _ in range(3):
            jid += 1
            rows.append(_row(jid, "ann", name, "cpu1", 0, 60.0, "io"))
    for _ in range(3):
        jid += 1
        rows.append(_row(jid, "bo", "t", "gpu1", 1, 60.0, "tr\nain = 1"))
    return pd.DataFrame(rows), usage


def test_advise_proposes_orders_memory_speeds_and_rules_with_their_evidence() -> None:
    site = parse_site(DEMO_TEXT)
    jobs, usage = _history()
    adv = propose(jobs, usage, empty_frame(), site, DEMO_TEXT, "demo.toml", REQ)
    assert adv.site_text is not None
    text = adv.site_text
    proposed = parse_site(text, "<advised>")  # the loader's check, again
    classes = proposed.sections["classes"]
    # A100 runs take half an H100's: the intervals separate, a100 moves ahead for train.
    assert classes["train"].devices == ("a100", "h100")
    assert classes["inference"].devices == ("a100", "h100")  # unmeasured: unchanged
    # MaxRSS 1010..1480 MiB over 48 runs: p95 ~1457 x 1.2 = 1749 -> 1792 MiB.
    mem = next(m for m in adv.memory if m.wclass == "train")
    assert mem.measured == 48 and classes["train"].mem_per_node == 1792
    assert classes["io"].mem_per_node is None  # no MaxRSS measured: no default
    cf = proposed.sections["classify"]
    assert [(r.user, r.name, r.wclass) for r in cf.rules] == [("ann", "prep.sh", "io")]
    assert cf.mode == "suggest"
    # The measured speeds (A100 twice an H100 for train) contradict the demo's written
    # gpu_model_order once the levers weigh them: that part alone is left out, and said so.
    data = tomllib.loads(text)
    assert data["levers"]["speed"] == tomllib.loads(DEMO_TEXT)["levers"]["speed"]
    assert any(n.startswith("[levers.speed] not proposed: the site with the measured ratios "
                            "does not load:") and "gpu_model_order" in n for n in adv.notes)
    assert len(adv.changes) == 3, adv.changes
    # Without the written order the ratios are merged: train measured, inference kept.
    free = DEMO_TEXT.replace('gpu_model_order = ["h100", "a100"]\n', "")
    adv = propose(jobs, usage, empty_frame(), parse_site(free), free, "demo.toml", REQ)
    assert adv.site_text is not None and len(adv.changes) == 4, adv.changes
    speed = tomllib.loads(adv.site_text)["levers"]["speed"]
    assert speed["a100"]["train"] == pytest.approx(2.0, abs=0.05)
    assert speed["h100"] == {"train": 1.0, "inference": 2.0}
    # The evidence sits above the table it changes; no text of a job escapes a comment.
    head = text.index("[classes.train]")
    block = text[text.rindex("\n\n", 0, head):head]
    assert "# advise: devices h100, a100 -> a100, h100" in block
    assert "MaxRSS of 48 one-node runs" in block and "advice only" in block
    assert "\n[evil]" not in text and "tr\nain" not in text
    assert all(ln.startswith("#") or "=" in ln or ln.startswith("[") or ln in ("", "]")
               or ln.startswith("  {") for ln in text.splitlines()), text


def test_a_model_the_site_lacks_refuses_the_whole_proposal() -> None:
    site = parse_site(DEMO_TEXT)
    jobs, usage = _history()
    jobs.loc[jobs["gpu_model"] == "a100", "gpu_model"] = "v100"
    with pytest.raises(ConfigError, match="measured GPU model v100, which site 'hetdemo' lacks"):
        propose(jobs, usage, empty_frame(), site, DEMO_TEXT, "demo.toml", REQ)


def test_too_few_jobs_propose_nothing_and_say_why() -> None:
    site = parse_site(DEMO_TEXT)
    jobs, usage = _history(runs=2)
    prep = jobs[jobs["name"] == "prep.sh"]
    jobs = pd.concat([jobs[(jobs["name"] == "job0") & (jobs["job_id"] != 1)], prep.iloc[:2]])
    adv = propose(jobs, usage, empty_frame(), site, DEMO_TEXT, "demo.toml", REQ)
    assert adv.site_text is None and adv.changes == []
    mem = next(m for m in adv.memory if m.wclass == "train")
    assert mem.proposed is None and "too few" in mem.note and mem.measured == 3
    assert not adv.speeds.measured() and not adv.rankings[0].changed
    assert adv.classes is not None and not adv.classes.proposed()
    assert "too few" in next(r for r in adv.classes.rows if r.name == "prep.sh").note


def test_a_memory_default_no_node_holds_is_not_proposed() -> None:
    site = parse_site(DEMO_TEXT)
    jobs, usage = _history()
    usage = {k: JobUsage(k, 1.0, 40_000.0, None, None) for k in usage}
    adv = propose(jobs, usage, empty_frame(), site, DEMO_TEXT, "demo.toml", REQ)
    mem = next(m for m in adv.memory if m.wclass == "train")
    assert mem.proposed is None and "exceed every node" in mem.note


def test_comment_escapes_control_characters() -> None:
    assert comment("a\nb\rc\x1b[31m\u2028d") == "# a\\x0ab\\x0dc\\x1b[31m\\x2028d"


# -- the command ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def month(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("advise")
    made = generate(root, 3000, nodes=10, groups=300, usage=True)
    return root, made


def _advise(root: Path, made: dict[str, Any], site: Path, out: Path, *more: str) -> Any:
    return CliRunner().invoke(cli, [
        "advise", "--site", str(site), "--sacct-file", str(root / "sacct.json"), "--since",
        str(made["since"]), "--until", str(made["until"]), "--no-scripts", "--format", "json",
        "--out", str(out), *more])


def test_advise_cli_writes_a_site_that_loads(month: tuple[Path, dict[str, Any]],
                                             tmp_path: Path) -> None:
    root, made = month
    out = tmp_path / "proposed.toml"
    res = _advise(root, made, root / "site.toml", out)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["written"] and doc["out"] == str(out)
    assert doc["changes"][0] == "classes.train.devices: a100, h100 -> h100, a100"
    site = parse_site(out.read_text())
    assert site.sections["classes"]["train"].devices == ("h100", "a100")
    assert site.sections["classes"]["train"].mem_per_node is not None
    assert f"wrote 3 change(s) to {out}" in res.stderr


def test_advise_cli_bad_input_changes_nothing(month: tuple[Path, dict[str, Any]],
                                              tmp_path: Path) -> None:
    root, made = month
    out = tmp_path / "proposed.toml"
    lacking = tmp_path / "site.toml"
    lacking.write_text((root / "site.toml").read_text().replace('"a100"', '"l40s"'))
    res = _advise(root, made, lacking, out)
    assert res.exit_code == 2 and not out.exists()
    assert res.stderr.splitlines() == [
        "hetslurm: error: learned speeds measured GPU model a100, which site 'synth' lacks "
        "(its GPU models: h100, l40s); narrow --since or fix the site"]
    # Too few jobs: two runs propose nothing, write nothing, and say so.
    few = tmp_path / "few"
    generate(few, 2, nodes=10, groups=1, usage=True)
    res = _advise(few, made, root / "site.toml", out)
    assert res.exit_code == 0 and not out.exists()
    assert "nothing to propose" in res.stderr and json.loads(res.stdout)["changes"] == []
