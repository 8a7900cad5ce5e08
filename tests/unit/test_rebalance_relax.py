"""rebalance's relax phase on a fake demo cluster: only relaxing edits, only when the placement
core says the relaxed request starts now, re-read before editing, one failure never stops the
others."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _rebalance_fixtures import (
    HOUR,
    NOW,
    cluster,
    demo_site,
    energy_low,
    fill,
    pending,
    record,
    running,
)

from hetslurm.act.log import ActionLog
from hetslurm.act.rebalance import RebalanceRequest, RebalanceResult, rebalance
from hetslurm.errors import BackendError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.site.schema import Rebalance
from hetslurm.slurm.backend import Switches
from hetslurm.slurm.units import GresItem

SITE = demo_site()
A100_FULL = fill("gpu3", "a100", 100) + fill("gpu4", "a100", 200)
H100_FULL = fill("gpu1", "h100", 300) + fill("gpu2", "h100", 400)


def policy(tmp: Path, **kw: Any) -> Rebalance:
    return Rebalance(**{"lock_file": str(tmp / "rebalance.lock"),
                        "action_log": str(tmp / "actions.jsonl"), "verify_timeout_s": 0.01,
                        "pending_limit_s": 3600, **kw})


def run(fake: FakeSlurm, tmp: Path, *, apply: bool = False, **kw: Any) -> RebalanceResult:
    return rebalance(fake, RebalanceRequest(apply=apply, phases=("relax",)), SITE, now=NOW,
                     policy=policy(tmp, **kw))


def rules(res: RebalanceResult) -> dict[str, tuple[str, str]]:
    assert res.relax is not None
    return {d.job: (d.rule, d.action) for d in res.relax.decisions}


def test_energy_low_job_widened_back_to_its_own_list(tmp_path: Path) -> None:
    fake = cluster(SITE, *A100_FULL, energy_low(10))
    dry = run(fake, tmp_path)
    assert rules(dry) == {"10": ("relax", "relax")}
    d = dry.relax.decisions[0] if dry.relax else None
    assert d is not None
    # The widened list keeps its order through the per-model partitions (docs/fallback.md).
    assert [(e.kind, e.field, e.old, e.new) for e in d.edits] == [
        ("models", "Features", "a100", "h100|a100"),
        ("models", "Partition", "gpu", "gpu_h100,gpu_a100")]
    assert d.evidence["held"]["placeable"] is False
    assert d.evidence["relaxed"]["nodelist"] == "gpu1"
    # The dry run changed nothing and wrote nothing.
    assert fake.job(10).features == "a100"
    assert not (tmp_path / "actions.jsonl").exists()

    done = run(fake, tmp_path, apply=True)
    assert [(o.job, o.result) for o in done.relax_outcomes] == [("10", "done")]
    j = fake.job(10)
    assert j.features == "h100|a100" and j.tres_per_node == (GresItem("gpu", None, 2),)
    assert j.partition == "gpu_h100,gpu_a100"
    log = ActionLog(tmp_path / "actions.jsonl")
    acts = list(log.entries("action"))
    assert [(a["job"], a["result"]) for a in acts] == [("10", "done")]
    assert [e["field"] for e in acts[0]["edits"]] == ["Features", "Partition"]
    # Acting twice: the next run finds nothing left to relax.
    again = run(fake, tmp_path, apply=True)
    assert rules(again) == {}
    assert again.relax is not None and again.relax.quiet == {"nothing-to-relax": 1}


def test_no_edit_when_relaxing_would_not_help(tmp_path: Path) -> None:
    # Every GPU busy: the relaxed request would not start now either.
    fake = cluster(SITE, *A100_FULL, *H100_FULL, energy_low(10))
    assert rules(run(fake, tmp_path)) == {"10": ("would-not-start", "none")}
    # A100s free: the job fits as it is and waits for something else (priority, limits).
    fake = cluster(SITE, energy_low(11))
    assert rules(run(fake, tmp_path)) == {"11": ("fits-as-is", "none")}
    # Not waited long enough, or pending for a reason a wider request would not fix.
    fake = cluster(SITE, *A100_FULL, energy_low(12, waited_h=0.5),
                   energy_low(13, reason="Dependency"), energy_low(14, reason="JobHeldUser"))
    got = rules(run(fake, tmp_path, apply=True))
    assert got == {"12": ("not-long-enough", "none"), "13": ("pending-reason", "none"),
                   "14": ("pending-reason", "none")}
    for jid in (12, 13, 14):
        assert fake.job(jid).features == "a100"


def test_typed_narrowing_is_not_widened(tmp_path: Path) -> None:
    # Slurm 22.05 refuses typed -> untyped gres on a pending job: say so, edit nothing.
    fake = cluster(SITE, *A100_FULL, energy_low(15, typed=True),
                   energy_low(16, typed=True, waited_h=0.1))
    res = run(fake, tmp_path, apply=True)
    assert rules(res) == {"15": ("typed-gres", "none")}
    assert res.relax is not None and res.relax.quiet == {"nothing-to-relax": 1}
    assert fake.job(15).tres_per_node == (GresItem("gpu", "a100", 2),)
    assert res.relax_outcomes == []


def test_jobs_without_a_record_or_a_relaxable_request_are_left_alone(tmp_path: Path) -> None:
    own = pending(20, tres_per_node=(GresItem("gpu", "a100", 2),))  # no #HET at all
    single = pending(21, tres_per_node=(GresItem("gpu", "a100", 2),),
                     admin_comment=record("gpus=2 gpu-type=a100", "a100", "tres_per_node"))
    # The user's own --constraint was kept by the hook: not the hook's list to widen.
    kept = pending(22, tres_per_node=(GresItem("gpu", None, 2),), features="a100",
                   admin_comment=record("gpus=2 gpu-type=h100|a100 energy=low", "a100",
                                        "tres_per_node", kept="features"))
    # A comment a user wrote is not the record when the site keeps it in AdminComment.
    forged = pending(23, tres_per_node=(GresItem("gpu", None, 2),), features="a100",
                     comment=record("gpus=2 gpu-type=h100|a100 energy=low", "a100", "x"))
    fake = cluster(SITE, *A100_FULL, own, single, kept, forged)
    res = run(fake, tmp_path, apply=True)
    assert rules(res) == {}
    assert res.relax is not None
    assert res.relax.quiet == {"no-record": 2, "nothing-to-relax": 2}
    assert fake.job(22).features == "a100"


def test_prefer_dropped_when_it_names_models_of_the_list(tmp_path: Path) -> None:
    train = record("gpus=2 class=train", "h100|a100", "tres_per_node,features,partition")
    job = pending(30, tres_per_node=(GresItem("gpu", None, 2),), features="h100|a100",
                  prefer="h100", admin_comment=train)
    other = pending(31, tres_per_node=(GresItem("gpu", None, 2),), features="h100|a100",
                    prefer="nvlink", admin_comment=train)  # not a model: the user's own
    fake = cluster(SITE, *H100_FULL, job, other)
    res = run(fake, tmp_path, apply=True)
    assert rules(res) == {"30": ("relax", "relax")}
    assert fake.job(30).prefer is None and fake.job(30).features == "h100|a100"
    assert fake.job(31).prefer == "nvlink"


def test_switch_wait_dropped_only_when_preferred(tmp_path: Path) -> None:
    # CPU-only 2-node jobs in partition batch; one fully free node per leaf switch.
    busy = [replace(running(500 + i, n, "h100", ()), allocated_gres={},
                    cpu_ids={n: tuple(range(8))})
            for i, n in enumerate(("gpu2", "gpu3", "gpu4", "fpga1", "cpu2", "cpu3", "cpu4"))]
    pref = pending(40, partition="batch", switches=Switches(1, 3600),
                   admin_comment=record("nodes=2 cores=8 locality=switch switch-wait=3600", "",
                                        "min_nodes,max_nodes,req_switch,wait4switch"))
    req = pending(41, partition="batch", switches=Switches(1, 3600),
                  admin_comment=record("nodes=2 cores=8 locality=switch:required "
                                       "switch-wait=3600", "",
                                       "min_nodes,max_nodes,req_switch,wait4switch"))
    fake = cluster(SITE, *busy, pref, req)
    res = run(fake, tmp_path, apply=True)
    assert rules(res) == {"40": ("relax", "relax")}
    d = res.relax.decisions[0] if res.relax else None
    assert d is not None and d.evidence["relaxed"]["nodelist"] == "cpu1,gpu1"
    assert fake.job(40).switches == Switches(1, 0)
    assert fake.job(41).switches == Switches(1, 3600)


def test_two_jobs_are_not_promised_the_same_gpus(tmp_path: Path) -> None:
    # Two h100 GPUs free on gpu1; two energy=low jobs of 2 GPUs each: only the longer
    # waiting one is relaxed, the other would not start once the first has them.
    fake = cluster(SITE, *A100_FULL, *fill("gpu1", "h100", 300, 6),
                   *fill("gpu2", "h100", 400), energy_low(50, waited_h=3),
                   energy_low(51, waited_h=2))
    assert rules(run(fake, tmp_path)) == {"50": ("relax", "relax"),
                                          "51": ("would-not-start", "none")}


def test_run_limit(tmp_path: Path) -> None:
    fake = cluster(SITE, *A100_FULL, energy_low(60, waited_h=3), energy_low(61))
    assert rules(run(fake, tmp_path, max_relax_per_run=1)) == {
        "60": ("relax", "relax"), "61": ("run-limit", "none")}


def test_recheck_before_editing_and_failures_do_not_stop_the_others(tmp_path: Path) -> None:
    fake = cluster(SITE, *A100_FULL, energy_low(70, waited_h=4), energy_low(71, waited_h=3),
                   energy_low(72, waited_h=2))
    pol = policy(tmp_path)
    dry = rebalance(fake, RebalanceRequest(phases=("relax",)), SITE, now=NOW, policy=pol)
    assert dry.relax is not None
    # Between the decision and the edit: 70 is edited by someone else, 71's update fails.
    fake.update_job(70, features="h100")

    class Failing(FakeSlurm):
        def update_job(self, job_id: Any, **kw: Any) -> None:
            if str(job_id) == "71":
                raise BackendError("slurm_update error: Access/permission denied")
            super().update_job(job_id, **kw)

    failing = Failing(nodes=fake.nodes(), jobs=fake.jobs(), partitions=fake.partitions())
    from hetslurm.act.relax import apply_relax

    log = ActionLog(tmp_path / "actions.jsonl")
    outcomes, late = apply_relax(failing, dry.relax.decisions, log, now=NOW,
                                 verify_timeout_s=0.01)
    assert late == []
    got = {o.job: o.result for o in outcomes}
    assert got["70"] == "skipped" and got["71"] == "failed" and got["72"] == "done"
    assert "features changed" in next(o.detail for o in outcomes if o.job == "70")
    assert failing.job(72).features == "h100|a100"
    assert failing.job(70).features == "h100"
    results = {e["job"]: e["result"] for e in log.entries("action")}
    assert results == {"70": "skipped", "71": "failed", "72": "done"}


def test_a_job_that_started_meanwhile_is_skipped(tmp_path: Path) -> None:
    fake = cluster(SITE, *A100_FULL, energy_low(80))
    dry = run(fake, tmp_path)
    assert dry.relax is not None
    fake._jobs[80] = replace(fake.job(80), state="RUNNING")
    from hetslurm.act.relax import apply_relax

    outcomes, _ = apply_relax(fake, dry.relax.decisions, ActionLog(tmp_path / "a.jsonl"),
                              now=NOW)
    assert [(o.result, o.detail) for o in outcomes] == [("skipped", "now RUNNING")]
    assert fake.job(80).features == "a100"


def test_hostile_names_and_comments_are_data(tmp_path: Path) -> None:
    names = [";$(touch /tmp/x)", "`touch /tmp/x`", "a\nJobState=RUNNING", "--help"]
    jobs = [energy_low(90 + i, name=n, comment=n, waited_h=5 - i) for i, n in enumerate(names)]
    fake = cluster(SITE, *A100_FULL, *jobs)
    res = run(fake, tmp_path, apply=True)
    assert rules(res)["90"] == ("relax", "relax")
    logged = {e["job"]: e["name"] for e in ActionLog(tmp_path / "actions.jsonl")
              .entries("decision")}
    assert logged == {str(90 + i): n for i, n in enumerate(names)}
    json.dumps(res.to_dict(), default=str)


def test_time_budget_stops_new_work_and_says_what_was_skipped(tmp_path: Path) -> None:
    ticks = iter(float(i) for i in range(1000))
    fake = cluster(SITE, *A100_FULL, energy_low(95), energy_low(96), energy_low(97))
    res = rebalance(fake, RebalanceRequest(apply=True, phases=("relax",), budget_s=3.5),
                    SITE, now=NOW, policy=policy(tmp_path), clock=lambda: next(ticks))
    assert res.over_budget
    assert {s["job"] for s in res.skipped if s["phase"] == "relax"}
    judged = set(rules(res))
    skipped = {s["job"] for s in res.skipped}
    # Every job was judged or listed as skipped (judged ones may be skipped at the edit).
    assert judged | skipped == {"95", "96", "97"}
    assert not {o.job for o in res.relax_outcomes} & skipped
    # Nothing that was skipped was touched.
    for jid in skipped:
        assert fake.job(int(jid)).features == "a100"


@pytest.mark.parametrize("waited_h", [1.5])
def test_waited_counts_from_eligible_time(tmp_path: Path, waited_h: float) -> None:
    from datetime import UTC, datetime

    j = energy_low(98, waited_h=waited_h,
                   eligible_time=datetime.fromtimestamp(NOW - 0.2 * HOUR, tz=UTC))
    fake = cluster(SITE, *A100_FULL, j)
    assert rules(run(fake, tmp_path)) == {"98": ("not-long-enough", "none")}


def test_a_job_that_fits_as_is_takes_its_devices_first(tmp_path: Path) -> None:
    # Two A100s free: the longer-waiting job fits as it is and Slurm will start it there, so
    # the next one cannot count on them; two H100s free: that one is widened.
    fake = cluster(SITE, *fill("gpu3", "a100", 100, 6), *fill("gpu4", "a100", 200),
                   *fill("gpu1", "h100", 300, 6), *fill("gpu2", "h100", 400),
                   energy_low(52, waited_h=3), energy_low(53, waited_h=2))
    assert rules(run(fake, tmp_path)) == {"52": ("fits-as-is", "none"),
                                          "53": ("relax", "relax")}


def test_shadow_mode_records_are_not_acted_on(tmp_path: Path) -> None:
    job = energy_low(54)
    shadow = job.admin_comment.replace('"mode":"enforce"', '"mode":"shadow"') \
        if job.admin_comment else None
    fake = cluster(SITE, *A100_FULL, replace(job, admin_comment=shadow))
    res = run(fake, tmp_path)
    assert rules(res) == {}
    assert res.relax is not None and res.relax.quiet == {"no-record": 1}


def _waiting_for_a100(job_id: int, req: str, *, waited_h: float) -> Any:
    """``#HET gpus=1 class=inference wait-for=first...``: the hook put it in gpu_a100 only."""
    return pending(job_id, waited_h=waited_h, partition="gpu_a100",
                   tres_per_node=(GresItem("gpu", None, 1),), features="a100|h100",
                   admin_comment=record(req, "a100|h100", "tres_per_node,features,partition",
                                        **{"class": "inference"}))


def test_bounded_wait_for_first_is_widened_after_its_max(tmp_path: Path) -> None:
    req = "gpus-per-node=1 class=inference wait-for=first,max=1800"
    fake = cluster(SITE, *A100_FULL, *H100_FULL, _waiting_for_a100(10, req, waited_h=1.0),
                   _waiting_for_a100(11, req, waited_h=0.25))
    dry = run(fake, tmp_path)
    # Widened although nothing is free: the bound is the user's, not a placement question.
    assert rules(dry) == {"10": ("wait-for-max", "relax"), "11": ("not-long-enough", "none")}
    d = next(d for d in dry.relax.decisions if d.job == "10") if dry.relax else None
    assert d is not None
    assert [(e.kind, e.field, e.old, e.new) for e in d.edits] == [
        ("wait-for", "Partition", "gpu_a100", "gpu_a100,gpu_h100")]
    assert "1800s" in next(x for x in dry.relax.decisions if x.job == "11").detail
    assert fake.job(10).partition == "gpu_a100"  # the dry run changed nothing
    done = run(fake, tmp_path, apply=True)
    assert [(o.job, o.result) for o in done.relax_outcomes] == [("10", "done")]
    assert fake.job(10).partition == "gpu_a100,gpu_h100"
    again = run(fake, tmp_path, apply=True)
    assert "10" not in rules(again)


def test_unbounded_wait_for_first_is_never_widened(tmp_path: Path) -> None:
    req = "gpus-per-node=1 class=inference wait-for=first"
    fake = cluster(SITE, *A100_FULL, _waiting_for_a100(10, req, waited_h=48.0))
    res = run(fake, tmp_path, apply=True)
    assert rules(res) == {}
    assert fake.job(10).partition == "gpu_a100"
