"""Classification from evidence (issue 22 item 4): the ``[classify]`` section, its rendering
into the hook's rules, the hook's suggest / apply / off under each release's stand-in,
``learn classes`` on synthetic history and the audit's agreement table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from hetslurm.audit.classes import classify_section, learn_classes
from hetslurm.audit.tables import class_agreement, per_job
from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.metrics.store import normalise_frame
from hetslurm.policy.idle import prepare_samples
from hetslurm.request.record import find_record
from hetslurm.site import parse_site
from hetslurm.site.hook_rules import hook_rules
from hetslurm.site.schema import Usage

ROOT = Path(__file__).resolve().parents[2]
DEMO_TEXT = (ROOT / "site-configs" / "demo.toml").read_text()
HOSTILE = 'we"ird]]\\ %s $(x) ]=] é'
RELEASES = ("22.05", "24.11", "26.05")


def site_with(mode: str, rules: str = "", extra: str = "") -> Any:
    body = rules or (
        '  { user = "ann", name = "prep.sh", class = "io", evidence = "3 runs, 3 held GPUs, '
        'max util 0%" },\n'
        f'  {{ user = "bob", name = {json.dumps(HOSTILE, ensure_ascii=False)}, class = "io" }},\n')
    return parse_site(DEMO_TEXT + extra + f'\n[classify]\nmode = "{mode}"\nrules = [\n{body}]\n')


def script(line: str = "") -> str:
    return "#!/bin/bash\n" + (line + "\n" if line else "") + "srun true\n"


# -- the site section ---------------------------------------------------------------------------

@pytest.mark.parametrize(("rule", "problem"), [
    ('{ user = "ann", name = "x", class = "nope" }', "unknown class 'nope'"),
    ('{ user = "ann", name = "x\\n", class = "io" }',
     "classify.rules[0].name': holds a control character"),
    ('{ user = "", name = "x", class = "io" }', "classify.rules[0].user"),
    ('{ user = "ann", name = "x", class = "io", why = "" }', "why"),
])
def test_bad_rules_are_refused_with_the_key_named(rule: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(problem)):
        site_with("suggest", f"  {rule},\n")


def test_a_second_rule_for_the_same_job_is_refused() -> None:
    rule = '  { user = "ann", name = "x", class = "io" },\n'
    with pytest.raises(ConfigError, match="a second rule"):
        site_with("suggest", rule * 2)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"classify\.mode"):
        site_with("sometimes")


# -- rendering -------------------------------------------------------------------------------

def test_off_or_no_rules_render_no_table_and_leave_the_digest_alone() -> None:
    plain = hook_rules(parse_site(DEMO_TEXT))
    assert "classify" not in plain
    off = hook_rules(site_with("off"))
    assert "classify" not in off and off["digest"] == plain["digest"]
    empty = parse_site(DEMO_TEXT + '\n[classify]\nmode = "apply"\n')
    assert hook_rules(empty)["digest"] == plain["digest"]


def test_rules_render_as_a_name_then_user_lookup() -> None:
    rules = hook_rules(site_with("suggest"))
    table = rules["classify"]
    assert table["mode"] == "suggest"
    assert table["names"]["prep.sh"]["ann"].split("\t")[0] == "io"
    # One string per rule (class, tab, why): no table per rule in the controller's heap.
    assert table["names"][HOSTILE]["bob"] == "io\t"


# -- the hook --------------------------------------------------------------------------------

def runtime(mode: str, release: str, **kw: Any) -> HookRuntime:
    return HookRuntime(render_hook(site_with(mode, **kw), slurm=release).text)


@pytest.mark.parametrize("release", RELEASES)
def test_suggest_tells_and_records_and_changes_nothing_else(release: str) -> None:
    rt = runtime("suggest", release)
    plain = rt.submit({"user_name": "ann", "name": "prep.sh", "script": script()})
    assert plain.accepted and plain.user_messages == (
        "hetslurm: class=io suggested from this job's history (3 runs, 3 held GPUs, max util "
        "0%); to use it, add '#HET class=io'",)
    assert set(plain.fields) == {"admin_comment"}
    rec = find_record(plain.fields["admin_comment"])
    assert rec is not None and rec.inferred_class == "io" and rec.classified == "suggest"
    assert rec.source == "history" and rec.workload_class is None and rec.declared_class is None
    gpu = rt.submit({"user_name": "ann", "name": "prep.sh", "script": script("#HET gpus=1")})
    assert gpu.accepted and gpu.fields["tres_per_node"].endswith("gpu:1")
    assert "partition" not in gpu.fields and len(gpu.user_messages) == 1
    rec = find_record(gpu.fields["admin_comment"])
    assert rec is not None and rec.request == "gpus=1" and rec.classified == "suggest"


@pytest.mark.parametrize("release", RELEASES)
def test_apply_moves_the_job_to_the_cpu_class(release: str) -> None:
    rt = runtime("apply", release)
    for job in ({"script": script()}, {"script": script("#HET gpus=1 mem=2G")},
                {"comment": "het: gpus=2"}):
        res = rt.submit({"user_name": "ann", "name": "prep.sh", **job})
        assert res.accepted, res
        f = res.fields
        assert f["partition"] == "cpu" and f["features"] == "cpu" and "tres_per_node" not in f
        assert "applied from this job's history" in res.user_messages[-1]
        rec = find_record(f["admin_comment"])
        assert rec is not None and rec.workload_class == "io" and rec.classified == "apply"
        assert rec.declared_class is None
        want = {"script": "history" if job.get("script") == script() else "script",
                "comment": "comment"}
        assert rec.source == want["comment" if "comment" in job else "script"]
    kept = rt.submit({"user_name": "ann", "name": "prep.sh",
                      "script": script("#HET mem=2G gpus=1")})
    assert kept.fields["min_mem_per_node"] == 2048 and "left out: gpus=1" in kept.user_messages[-1]


@pytest.mark.parametrize("release", RELEASES)
def test_apply_never_turns_an_accepted_job_into_a_rejected_one(release: str) -> None:
    rt = runtime("apply", release)
    prefix = "gres:" if release == "22.05" else "gres/"
    # The job's own --gres asks for a GPU: the CPU class would be refused, so only suggested.
    res = rt.submit({"user_name": "ann", "name": "prep.sh", "script": script(),
                     "tres_per_node": f"{prefix}gpu:1"})
    assert res.accepted and "partition" not in res.fields
    assert "suggested" in res.user_messages[0] and "not applied" in res.user_messages[0]
    assert "#HET line" not in res.user_messages[0]
    assert find_record(res.fields["admin_comment"]).classified == "suggest"  # type: ignore


@pytest.mark.parametrize("mode", ["suggest", "apply"])
def test_declared_classes_other_jobs_and_mistakes_are_left_alone(mode: str) -> None:
    rt = runtime(mode, "26.05")
    plain = runtime("off", "26.05")
    cases = [
        {"user_name": "ann", "name": "prep.sh", "script": script("#HET gpus=1 class=train")},
        {"user_name": "ann", "name": "other", "script": script("#HET gpus=1")},
        {"user_name": "carl", "name": "prep.sh", "script": script()},
        {"user_name": "ann", "name": "prep.sh", "script": script("#HET gpu=1")},  # mistake
        {"name": "prep.sh", "script": script()},  # no user name
        {"user_name": "ann", "script": script()},  # no job name
    ]
    for job in cases:
        got, want = rt.submit(job), plain.submit(job)
        assert (got.rc, got.user_messages) == (want.rc, want.user_messages), job
        assert {k: v for k, v in got.fields.items() if k != "admin_comment"} == \
            {k: v for k, v in want.fields.items() if k != "admin_comment"}
        assert '"infer"' not in str(got.fields.get("admin_comment"))


@pytest.mark.parametrize("release", RELEASES)
def test_hostile_names_are_looked_up_exactly(release: str) -> None:
    rt = runtime("suggest", release)
    hit = rt.submit({"user_name": "bob", "name": HOSTILE, "script": script()})
    assert hit.accepted and find_record(hit.fields["admin_comment"]).inferred_class == "io"  # type: ignore
    for name in (HOSTILE[:-1], HOSTILE + " ", "we.ird", "%s", "prep.sh\x00", "\n" * 3):
        miss = rt.submit({"user_name": "bob", "name": name, "script": script()})
        assert miss.accepted and miss.fields == {} and not miss.log, name


def test_shadow_mode_only_logs() -> None:
    rt = HookRuntime(render_hook(site_with("apply"), mode="shadow", slurm="26.05").text)
    res = rt.submit({"user_name": "ann", "name": "prep.sh", "script": script()})
    assert res.accepted and res.fields == {} and not res.user_messages
    assert any("partition=cpu" in text for _, text in res.log)


def test_the_same_job_decides_the_same_twice() -> None:
    rt = runtime("apply", "26.05")
    job = {"user_name": "ann", "name": "prep.sh", "script": script("#HET gpus=1")}
    assert rt.submit(job).fields == rt.submit(job).fields


# -- learn classes ---------------------------------------------------------------------------

def _jobs(rows: list[tuple[int, str, str, int, str]]) -> Any:
    """(job_id, user, name, gpus, admin_comment) -> sacct_result-like jobs."""
    return pd.DataFrame([{"job_id": j, "run": 0, "name": n, "user": u, "account": "a",
                          "partition": "gpu", "state": "COMPLETED", "submit": 900.0,
                          "eligible": 900.0, "start": 1000.0, "end": 1060.0, "elapsed": 60.0,
                          "nodes": "gpu1", "gpus": g, "gpu_model": "h100" if g else "",
                          "typed": False, "constraints": "", "comment": "",
                          "admin_comment": c, "wclass": ""} for j, u, n, g, c in rows])


def _samples(util: dict[int, float]) -> Any:
    rows = [{"time": 1000.0 + t, "node": "gpu1", "minor": 0, "slurm_index": 0,
             "gpu_model": "h100", "job_id": jid, "job_gpus": "0", "utilization_pct": u,
             "memory_used_mib": 0.0, "status": "ok", "interval_s": 5.0, "attributed": True,
             "clock_jump": False} for jid, u in util.items() for t in range(0, 60, 5)]
    return normalise_frame(pd.DataFrame(rows))


def test_learn_classes_proposes_the_cpu_class_for_jobs_that_never_used_a_gpu() -> None:
    site = parse_site(DEMO_TEXT)
    jobs = _jobs([(1, "ann", "prep.sh", 1, ""), (2, "ann", "prep.sh", 1, ""),
                  (3, "ann", "prep.sh", 1, ""), (4, "ann", "train.sh", 1, ""),
                  (5, "ann", "train.sh", 1, ""), (6, "ann", "train.sh", 1, ""),
                  (7, "cy", "few.sh", 1, ""), (8, "cy", "few.sh", 1, ""),
                  (9, "cy", "bad\nname", 1, "")])
    util = {1: 0.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 90.0, 6: 0.0, 7: 0.0, 8: 0.0, 9: 0.0}
    res = learn_classes(jobs, _samples(util), site, since=0, until=2000)
    rows = {(r.user, r.name): r for r in res.rows}
    assert res.cpu_class == "io"
    assert rows[("ann", "prep.sh")].wclass == "io" and rows[("ann", "prep.sh")].idle_runs == 3
    assert "3 runs" in rows[("ann", "prep.sh")].evidence
    assert rows[("ann", "train.sh")].wclass is None
    assert rows[("ann", "train.sh")].note == "1 of 3 runs used their GPUs"
    assert rows[("cy", "few.sh")].wclass is None and "too few" in rows[("cy", "few.sh")].note
    assert ("cy", "bad\nname") not in rows
    assert res.left_out["user or job name holds control characters"] == 1
    # The section is a site file's [classify]: it loads, with its rules, back.
    section = classify_section(res, mode="apply")
    site2 = parse_site(DEMO_TEXT + "\n" + section)
    cf = site2.sections["classify"]
    assert cf.mode == "apply" and [(r.user, r.name, r.wclass) for r in cf.rules] == [
        ("ann", "prep.sh", "io")]


def test_hostile_names_round_trip_through_the_section_into_the_hook() -> None:
    site = parse_site(DEMO_TEXT)
    names = [HOSTILE, 'q"uote', "back\\slash", "tab\there"[:3] + "x", "ünï", "[[x]]", "a' or '1"]
    jobs = _jobs([(i * 10 + k, "ann", n, 1, "") for i, n in enumerate(names) for k in range(3)])
    res = learn_classes(jobs, _samples({int(j): 0.0 for j in jobs["job_id"]}), site,
                        since=0, until=2000)
    assert sorted(r.name for r in res.proposed()) == sorted(names)
    site2 = parse_site(DEMO_TEXT + "\n" + classify_section(res, mode="suggest"))
    rt = HookRuntime(render_hook(site2, slurm="26.05").text)
    for n in names:
        got = rt.submit({"user_name": "ann", "name": n, "script": script()})
        assert got.accepted and "class=io suggested" in got.user_messages[0], n


def test_a_site_without_a_cpu_class_gets_no_rule() -> None:
    text = DEMO_TEXT.replace('devices = ["cpu"]', 'devices = ["a100"]')
    site = parse_site(text)
    jobs = _jobs([(k, "ann", "prep.sh", 1, "") for k in range(1, 5)])
    res = learn_classes(jobs, _samples(dict.fromkeys(range(1, 5), 0.0)), site, since=0,
                        until=2000)
    assert not res.proposed() and "no CPU class" in res.problems[0]
    assert "no CPU class" in res.rows[0].note


def test_learn_classes_cli_says_so_and_writes_nothing_when_nothing_is_proposed(
        tmp_path: Path) -> None:
    sacct = {"meta": {}, "jobs": []}
    (tmp_path / "sacct.json").write_text(json.dumps(sacct))
    out = tmp_path / "classify.toml"
    res = CliRunner().invoke(cli, ["learn", "classes", "--site",
                                   str(ROOT / "site-configs" / "demo.toml"), "--sacct-file",
                                   str(tmp_path / "sacct.json"), "--store",
                                   str(tmp_path / "store"), "--out", str(out), "--format",
                                   "json"])
    assert res.exit_code == 0, res.output
    assert "no rule proposed" in res.stderr and not out.exists()
    assert json.loads(res.stdout)["proposed"] == 0


# -- the audit's agreement -------------------------------------------------------------------

def test_agreement_counts_declared_classes_against_the_evidence() -> None:
    site = site_with("suggest")
    rec = 'hetslurm:{"v":1,"mode":"enforce","src":"script","outcome":"rewrite","class":"%s"%s}'
    jobs = _jobs([
        (1, "ann", "a", 1, rec % ("train", "")),   # used its GPU: agrees
        (2, "ann", "b", 1, rec % ("train", "")),   # never used it: disagrees
        (3, "ann", "prep.sh", 0, rec % ("io", "")),  # CPU job in the CPU class; rule agrees
        (4, "ann", "c", 1, rec % ("io", ',"infer":"io","how":"apply"')),  # applied: left out
        (5, "ann", "d", 1, ""),                    # no class declared
    ])
    usage = Usage()
    s = prepare_samples(_samples({1: 80.0, 2: 0.0, 4: 0.0, 5: 0.0}), usage, 0, 2000)
    table = class_agreement(jobs, per_job(s), site, usage, since=0, until=2000)
    got = table.set_index("class").to_dict("index")
    assert got["train"]["jobs"] == 2 and got["train"]["agreed"] == 1
    assert got["train"]["agreement_pct"] == 50.0 and got["train"]["inferred_gpu"] == 1
    assert got["io"]["jobs"] == 1 and got["io"]["agreed"] == 1 and got["io"]["cpu_only"]
    assert got["io"]["rule_jobs"] == 1 and got["io"]["rule_agreed"] == 1
