"""Device health -> drain, one path: the rules, the plan, acting, undo (docs/act.md#device-health).

Synthetic sample rows (the columns the collector writes, with the three health columns) and
the lab's in-memory Slurm; nothing here starts a daemon.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hetslurm.act.health import (
    HealthPolicy,
    apply_rollback,
    health_pass,
    plan_rollback,
    policy_for,
)
from hetslurm.act.log import ActionLog
from hetslurm.errors import ConfigError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.policy import health as H
from hetslurm.slurm.backend import JobInfo, NodeInfo, NodeStateChange
from hetslurm.slurm.units import GresItem

NOW = 1_800_000_000.0
STEP = 30.0
RULES = H.HealthRules(stale_s=90.0)
DRAIN = HealthPolicy(mode="drain", rules=RULES, max_drain_share=1.0, verify_timeout_s=0.01)


def node(name: str, model: str = "a100", n: int = 4, state: str = "IDLE",
         reason: str | None = None, drain: bool = False) -> NodeInfo:
    flags = {state} | ({"DRAIN"} if drain else set())
    return NodeInfo(name, frozenset(flags), reason=reason, gres_total={("gpu", model): n})


def rows(node_name: str, idx: int, *, n: int = 12, end: float = NOW, status: str = "ok",
         model: str = "a100", **cols: Any) -> list[dict[str, Any]]:
    """``n`` samples of one GPU, one per STEP, the last at ``end``."""
    out = []
    for k in range(n):
        r = {"time": end - (n - 1 - k) * STEP, "node": node_name, "slurm_index": idx,
             "minor": 128 + idx, "gpu_model": model, "status": status,
             "throttle_reasons": "", "ecc_uncorrectable": 0, "xid": None}
        r.update(cols)
        out.append(r)
    return out


def healthy(node_name: str, n: int = 4, **kw: Any) -> list[dict[str, Any]]:
    return [r for i in range(n) for r in rows(node_name, i, **kw)]


def verdict(samples: list[dict[str, Any]], rules: H.HealthRules = RULES) -> H.DeviceVerdict:
    (nh,) = H.judge(samples, rules, NOW).values()
    (v,) = nh.devices
    return v


def log_at(tmp_path: Path) -> ActionLog:
    return ActionLog(tmp_path / "actions.jsonl")


def run(backend: FakeSlurm, samples: list[dict[str, Any]], log: ActionLog, *,
        apply: bool = True, pol: HealthPolicy = DRAIN, now: float = NOW) -> Any:
    return health_pass(backend, None, log, apply=apply, now=now, samples=samples, policy=pol,
                       sleep=lambda _: None)


# ------------------------------------------------------------------ the rules
@pytest.mark.parametrize("status", ["lost", "missing"])
def test_a_gone_device_is_unhealthy(status: str) -> None:
    v = verdict(rows("gpu1", 2, status=status))
    assert v.verdict == H.UNHEALTHY and v.rules == ("lost",)
    assert v.evidence == status and v.device == "GPU 2 (minor 130)"


def test_ecc_at_the_threshold_is_unhealthy_below_is_not() -> None:
    assert verdict(rows("gpu1", 0, ecc_uncorrectable=3)).evidence == "ecc_uncorrectable=3"
    rules = H.HealthRules(ecc_uncorrectable_max=4, stale_s=90.0)
    assert verdict(rows("gpu1", 0, ecc_uncorrectable=3), rules).verdict == H.HEALTHY
    assert verdict(rows("gpu1", 0, ecc_uncorrectable=4), rules).verdict == H.UNHEALTHY


def test_an_xid_of_the_list_is_unhealthy_another_is_not() -> None:
    r = rows("gpu1", 0)
    r[3]["xid"] = 79
    v = verdict(r)
    assert v.verdict == H.UNHEALTHY and v.evidence == "xid=79"
    r[3]["xid"] = 13  # a graphics engine exception: the application's, not the device's
    assert verdict(r).verdict == H.HEALTHY


def test_throttling_must_persist_over_the_whole_span() -> None:
    # 12 samples at 30 s: 330 s of hw_slowdown -> unhealthy.
    v = verdict(rows("gpu1", 0, throttle_reasons="hw_slowdown,sw_power_cap"))
    assert v.verdict == H.UNHEALTHY and v.evidence == "throttled hw_slowdown 330s"
    # Too short a spell (5 samples: 120 s).
    assert verdict(rows("gpu1", 0, n=5, throttle_reasons="hw_slowdown")).verdict == H.HEALTHY
    # One sample without throttling inside the span breaks it.
    r = rows("gpu1", 0, throttle_reasons="hw_thermal_slowdown")
    r[-4]["throttle_reasons"] = ""
    assert verdict(r).verdict == H.HEALTHY
    # The power cap alone is the limit at work, not a fault.
    assert verdict(rows("gpu1", 0, throttle_reasons="sw_power_cap")).verdict == H.HEALTHY
    # Unknown throttle readings never count as throttled.
    r = rows("gpu1", 0, throttle_reasons="hw_slowdown")
    r[-2]["throttle_reasons"] = None
    assert verdict(r).verdict == H.HEALTHY


def test_one_sample_is_never_persistent() -> None:
    rules = H.HealthRules(throttle_persist_s=1, stale_s=90.0)
    assert verdict(rows("gpu1", 0, n=1, throttle_reasons="hw_slowdown"),
                   rules).verdict == H.HEALTHY


def test_stale_and_unknown_samples_are_unknown_whatever_they_say() -> None:
    stale = verdict(rows("gpu1", 0, end=NOW - 120, status="lost"))
    assert stale.verdict == H.UNKNOWN and "no sample for 120s" in stale.evidence
    r = rows("gpu1", 0, ecc_uncorrectable=5)
    r[-1]["status"] = "unknown"
    assert verdict(r).verdict == H.UNKNOWN


def test_missing_columns_read_as_none() -> None:
    r = [{k: v for k, v in x.items() if k not in ("throttle_reasons", "ecc_uncorrectable",
                                                   "xid")} for x in rows("gpu1", 0)]
    assert verdict(r).verdict == H.HEALTHY


def test_rules_can_be_switched_off() -> None:
    rules = H.HealthRules(rules=("lost",), stale_s=90.0)
    assert verdict(rows("gpu1", 0, ecc_uncorrectable=9), rules).verdict == H.HEALTHY


# ------------------------------------------------------------------ the plan and acting
def cluster(*nodes: NodeInfo, jobs: tuple[JobInfo, ...] = ()) -> FakeSlurm:
    return FakeSlurm(nodes=nodes, jobs=jobs)


def test_unhealthy_device_drains_the_whole_node_naming_gpu_and_evidence(tmp_path: Path
                                                                        ) -> None:
    job = JobInfo(job_id=7, state="RUNNING", nodes=("gpu1",),
                  allocated_gres={"gpu1": (GresItem("gpu", "a100", 1, (0,)),)})
    backend = cluster(node("gpu1", state="MIXED"), node("gpu2"), jobs=(job,))
    samples = healthy("gpu1") + healthy("gpu2")
    for r in samples:
        if r["node"] == "gpu1" and r["slurm_index"] == 2:
            r["ecc_uncorrectable"] = 3
    log = log_at(tmp_path)
    res = run(backend, samples, log)
    (d,) = res.plan.decisions
    assert d.node == "gpu1" and d.action == "drain"
    assert d.reason == "hetslurm: gpu1 GPU 2 (minor 130) ecc_uncorrectable 3"
    assert d.running_jobs == ("7",) and "finish there: 7" in d.detail
    assert res.outcomes[0].result == "done"
    n1 = backend.node("gpu1")
    assert n1.drained and n1.reason == d.reason
    # Draining kills nothing.
    assert backend.job(7).state == "RUNNING"
    assert not backend.node("gpu2").drained
    acts = list(log.entries("action"))
    assert acts[-1]["action"] == "drain" and acts[-1]["result"] == "done"
    assert acts[-1]["action_id"] == f"drain-{int(NOW)}-gpu1"
    assert res.plan.quiet == {"healthy": 1, "unknown": 0}


def test_stale_or_unknown_never_drains_nor_undrains(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"), node("gpu2"))
    log = log_at(tmp_path)
    stale = [dict(r, status="lost") for r in healthy("gpu1", end=NOW - 600)]
    res = run(backend, stale, log)
    assert res.plan.decisions == [] and res.plan.quiet["unknown"] == 2
    assert not backend.node("gpu1").drained
    # Our drain, then the collector stops: the node stays drained ("waiting").
    run(backend, healthy("gpu1", status="lost"), log)
    assert backend.node("gpu1").drained
    res = run(backend, healthy("gpu1", end=NOW + 3000), log, now=NOW + 4000)
    assert [d.rule for d in res.plan.decisions] == ["waiting"]
    assert backend.node("gpu1").drained
    # Three of four devices healthy, the fourth without samples: still waiting.
    res = run(backend, healthy("gpu1", n=3, end=NOW + 4000), log, now=NOW + 4000)
    assert [d.rule for d in res.plan.decisions] == ["waiting"]
    assert "1 GPU(s) without samples" in res.plan.decisions[0].detail


@pytest.mark.parametrize("state,reason,drain", [
    ("DOWN", "Not responding", False),
    ("IDLE", "nhc: fan 2 failed", True),
    ("MIXED", "admin maintenance", True),
])
def test_admin_drained_and_down_nodes_are_left_alone(tmp_path: Path, state: str, reason: str,
                                                     drain: bool) -> None:
    backend = cluster(node("gpu1", state=state, reason=reason, drain=drain))
    log = log_at(tmp_path)
    res = run(backend, healthy("gpu1", status="lost"), log)
    (d,) = res.plan.decisions
    assert d.rule == "left-alone" and d.action == "none" and "left alone" in d.detail
    assert backend.node("gpu1").reason == reason
    # And once the devices are healthy nothing undrains it.
    res = run(backend, healthy("gpu1"), log)
    assert backend.node("gpu1").reason == reason
    assert ("DRAIN" in backend.node("gpu1").state) == drain
    assert not [e for e in log.entries("action") if e.get("result") == "done"]


def test_undrain_only_when_our_reason_and_our_log_entry(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"), node("gpu2"))
    log = log_at(tmp_path)
    run(backend, healthy("gpu1", status="lost") + healthy("gpu2"), log)
    assert backend.node("gpu1").drained
    # A hetslurm:-looking reason nobody logged (an older collector's, or typed by hand).
    backend.update_node("gpu2", NodeStateChange.DRAIN, "hetslurm: GPU lost (NVML) minor 3")
    res = run(backend, healthy("gpu1") + healthy("gpu2"), log)
    by = {d.node: d for d in res.plan.decisions}
    assert by["gpu1"].rule == "undrain" and by["gpu2"].rule == "not-ours"
    assert not backend.node("gpu1").drained
    assert backend.node("gpu2").drained
    undrain = [e for e in log.entries("action") if e.get("action") == "undrain"]
    assert undrain[-1]["result"] == "done"


def test_our_drain_whose_reason_an_admin_changed_is_theirs(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    log = log_at(tmp_path)
    run(backend, healthy("gpu1", status="lost"), log)
    backend.update_node("gpu1", NodeStateChange.DRAIN, "hetslurm: keep out, RMA pending")
    res = run(backend, healthy("gpu1"), log)
    assert [d.rule for d in res.plan.decisions] == ["not-ours"]
    assert backend.node("gpu1").drained


def test_share_cap_defers_the_rest_most_severe_first(tmp_path: Path) -> None:
    nodes = [node(f"gpu{i}") for i in range(1, 9)]  # 32 a100
    backend = cluster(*nodes)
    samples = healthy("gpu1", ecc_uncorrectable=1) + healthy("gpu2", status="lost")
    samples += healthy("gpu3", ecc_uncorrectable=1) + healthy("gpu4")
    pol = HealthPolicy(mode="drain", rules=RULES, max_drain_share=0.25, verify_timeout_s=0.01)
    res = run(backend, samples, log_at(tmp_path), pol=pol)
    by = {d.node: d.rule for d in res.plan.decisions}
    # 0.25 x 32 = 8 GPUs: two 4-GPU nodes; the lost GPU goes first.
    assert by == {"gpu2": "drain", "gpu1": "drain", "gpu3": "deferred"}
    assert res.plan.cap == {"a100": (8, 8)}
    assert not backend.node("gpu3").drained
    assert "max_drain_share 0.25" in next(d.detail for d in res.plan.decisions
                                          if d.node == "gpu3")


def test_acting_twice_is_prevented(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    log = log_at(tmp_path)
    samples = healthy("gpu1", ecc_uncorrectable=2)
    plan = run(backend, samples, log, apply=False).plan
    # Someone drains it between the plan and the action: the re-read skips it.
    backend.update_node("gpu1", NodeStateChange.DRAIN, "admin: bad PSU")
    from hetslurm.act.health import apply_health

    out = apply_health(backend, plan, DRAIN, log, now=NOW, sleep=lambda _: None)
    assert [o.result for o in out] == ["skipped"]
    assert backend.node("gpu1").reason == "admin: bad PSU"
    # Two runs in a row: the second finds it already drained by us.
    backend.update_node("gpu1", NodeStateChange.UNDRAIN)
    run(backend, samples, log)
    res = run(backend, samples, log, now=NOW + 1)
    assert [d.rule for d in res.plan.decisions] == ["already-drained"]
    drains = [e for e in log.entries("action") if e.get("action") == "drain"
              and e.get("result") == "done"]
    assert len(drains) == 1


def test_dry_run_and_report_mode_change_nothing(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    log = log_at(tmp_path)
    res = run(backend, healthy("gpu1", status="lost"), log, apply=False)
    assert res.plan.decisions[0].action == "drain" and res.outcomes == []
    assert not log.path.exists()
    report = HealthPolicy(mode="report", rules=RULES, max_drain_share=1.0)
    res = run(backend, healthy("gpu1", status="lost"), log, pol=report)
    assert [o.result for o in res.outcomes] == ["report"]
    assert not backend.node("gpu1").drained


def test_plan_json_keys_are_stable(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    doc = run(backend, healthy("gpu1", status="lost"), log_at(tmp_path),
              apply=False).to_dict()
    json.dumps(doc)
    assert set(doc) == {"mode", "decisions", "quiet", "cap", "outcomes", "problems"}
    assert set(doc["decisions"][0]) == {"node", "rule", "action", "reason", "detail", "state",
                                        "devices", "gpus", "running_jobs"}
    assert set(doc["decisions"][0]["devices"][0]) == {
        "node", "slurm_index", "minor", "model", "verdict", "rules", "evidence", "last_sample"}


# ------------------------------------------------------------------ rollback
def test_rollback_by_action_id_undoes_our_drain_and_our_undrain(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"), node("gpu2"))
    log = log_at(tmp_path)
    run(backend, healthy("gpu1", status="lost") + healthy("gpu2", status="lost"), log)
    assert backend.node("gpu1").drained and backend.node("gpu2").drained
    # Undo only gpu1's drain? --to undoes it and everything later: both drains are one run,
    # gpu2's logged after gpu1's.
    steps = plan_rollback(backend, log, f"drain-{int(NOW)}-gpu2")
    assert [(s.node, s.action) for s in steps] == [("gpu2", "undrain")]
    out = apply_rollback(backend, steps, DRAIN, log, now=NOW + 10, sleep=lambda _: None)
    assert [o.result for o in out] == ["done"]
    assert not backend.node("gpu2").drained and backend.node("gpu1").drained
    # Undone already: not offered again.
    with pytest.raises(ConfigError):
        plan_rollback(backend, log, f"drain-{int(NOW)}-gpu2")
    # An undrain of ours, rolled back: drained again with the reason it had.
    run(backend, healthy("gpu1", end=NOW + 100) + healthy("gpu2", end=NOW + 100), log,
        now=NOW + 100)
    assert not backend.node("gpu1").drained
    steps = plan_rollback(backend, log, None)
    assert [(s.node, s.action) for s in steps] == [("gpu1", "drain")]
    apply_rollback(backend, steps, DRAIN, log, now=NOW + 110, sleep=lambda _: None)
    n1 = backend.node("gpu1")
    assert n1.drained and n1.reason == "hetslurm: gpu1 GPU 0 (minor 128) lost; GPU 1 (minor " \
        "129) lost; GPU 2 (minor 130) lost; GPU 3 (minor 131) lost"
    # ... and it counts as ours again: the health step may undrain it.
    res = run(backend, healthy("gpu1", end=NOW + 200), log, now=NOW + 200)
    assert [d.rule for d in res.plan.decisions] == ["undrain"]


def test_rollback_leaves_a_node_someone_else_drained(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    log = log_at(tmp_path)
    run(backend, healthy("gpu1", status="lost"), log)
    backend.update_node("gpu1", NodeStateChange.DRAIN, "nhc: disk full")
    (s,) = plan_rollback(backend, log, None)
    assert s.action == "none" and "left alone" in s.detail
    apply_rollback(backend, [s], DRAIN, log, now=NOW + 5, sleep=lambda _: None)
    assert backend.node("gpu1").reason == "nhc: disk full"


def test_rollback_never_touches_a_down_node(tmp_path: Path) -> None:
    backend = cluster(node("gpu1"))
    log = log_at(tmp_path)
    run(backend, healthy("gpu1", status="lost"), log)
    backend.update_node("gpu1", NodeStateChange.DOWN, "Not responding")
    (s,) = plan_rollback(backend, log, None)
    assert s.action == "none" and "down" in s.detail


# ------------------------------------------------------------------ drain_lost_gpu
def _site(tmp_path: Path, extra: str) -> Any:
    from hetslurm.site import load_site

    demo = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
    p = tmp_path / "site.toml"
    p.write_text(demo.read_text() + "\n" + extra)
    return load_site(p)


def test_drain_lost_gpu_maps_onto_the_lost_rule(tmp_path: Path) -> None:
    pol = policy_for(_site(tmp_path, "[collector]\ndrain_lost_gpu = true\ninterval_s = 10\n"))
    assert pol.mode == "drain" and pol.rules.rules == ("lost",)
    assert pol.rules.stale_s == 30.0
    # Without it nothing drains unless [health] says so; the plan is still reported.
    pol = policy_for(_site(tmp_path, ""))
    assert pol.mode == "report" and pol.rules.rules == H.RULES
    pol = policy_for(_site(tmp_path, '[health]\nmode = "drain"\n'))
    assert pol.mode == "drain" and pol.rules.rules == H.RULES
    with pytest.raises(ConfigError, match="drain_lost_gpu"):
        policy_for(_site(tmp_path, '[collector]\ndrain_lost_gpu = true\n'
                                   '[health]\nrules = ["ecc"]\n'))


def test_drain_lost_gpu_site_drains_only_lost(tmp_path: Path) -> None:
    site = _site(tmp_path, "[collector]\ndrain_lost_gpu = true\n")
    pol = policy_for(site)
    backend = cluster(node("gpu1"), node("gpu2"))
    samples = healthy("gpu1", status="missing") + healthy("gpu2", ecc_uncorrectable=9)
    pol = HealthPolicy(mode=pol.mode, rules=pol.rules, max_drain_share=1.0,
                       verify_timeout_s=0.01)
    res = run(backend, samples, log_at(tmp_path), pol=pol)
    assert [d.node for d in res.plan.decisions] == ["gpu1"]
    assert backend.node("gpu1").drained and not backend.node("gpu2").drained


# ------------------------------------------------------------------ rebalance and the CLI
def test_rebalance_runs_the_health_phase_and_can_skip_it(tmp_path: Path) -> None:
    from hetslurm.act.rebalance import RebalanceRequest, rebalance

    site = _site(tmp_path, '[health]\nmode = "drain"\nmax_drain_share = 1.0\n'
                           'verify_timeout_s = 0.01\n')
    names = [n.name for n in site.nodes if n.gpus]
    backend = cluster(*(node(n, n=len(site.node(n).gpus)) for n in names))
    victim = names[0]
    samples = [r for n in names for r in healthy(n, n=len(site.node(n).gpus))]
    for r in samples:
        if r["node"] == victim and r["slurm_index"] == 0:
            r["xid"] = 79
    logf = str(tmp_path / "a.jsonl")
    req = RebalanceRequest(apply=True, action_log=logf, lock_file=str(tmp_path / "l"),
                           phases=("health",))
    res = rebalance(backend, req, site, samples=samples, now=NOW)
    assert res.health is not None and [d.node for d in res.health.plan.decisions] == [victim]
    assert backend.node(victim).reason == f"hetslurm: {victim} GPU 0 (minor 128) xid 79"
    assert res.rows()[0]["phase"] == "health" and res.to_dict()["health"]["mode"] == "drain"
    skip = RebalanceRequest(apply=False, action_log=logf, phases=("relax",))
    assert rebalance(backend, skip, site, samples=samples, now=NOW).health is None


def test_help_teaches_with_examples() -> None:
    from click.testing import CliRunner

    from hetslurm.cli import cli

    for argv in (["rebalance", "--help"], ["rebalance", "rollback", "--help"]):
        res = CliRunner().invoke(cli, argv)
        assert res.exit_code == 0 and "Examples:" in res.output
        assert "hetslurm rebalance rollback --to" in res.output
    res = CliRunner().invoke(cli, ["rebalance", "--apply", "rollback"])
    assert res.exit_code == 2 and "--apply belong after 'rollback'" in res.output


# ------------------------------------------------------------------ the vectorised judge
def _random_frame(rng: Any, n: int) -> Any:
    import pandas as pd

    recs = []
    for _ in range(n):
        recs.append({
            "time": rng.choice([NOW - 400, NOW - 300, NOW - 100, NOW - 50, NOW - 10, NOW - 5,
                                NOW, NOW + 1, float("nan")]),
            "node": rng.choice(["a", "b", "c", None]),
            "slurm_index": rng.choice([0, 1, 2, None, 1.0]),
            "minor": rng.choice([None, 128.0, 129.0]),
            "gpu_model": rng.choice([None, "h100", "a100"]),
            "status": rng.choice(["ok", "ok", "ok", "lost", "unknown", "error", None,
                                  "missing"]),
            "throttle_reasons": rng.choice(["", "", "gpu_idle", "hw_slowdown",
                                            "hw_slowdown,gpu_idle", None]),
            "ecc_uncorrectable": rng.choice([0, 0, 0, 1, 3, None]),
            "xid": rng.choice([None] * 6 + [48, 13])})
    f = pd.DataFrame(recs)
    for c in ("node", "gpu_model", "status", "throttle_reasons"):
        f[c] = f[c].astype("category")
    f["xid"] = f["xid"].astype("Int32")
    f["ecc_uncorrectable"] = f["ecc_uncorrectable"].astype("Int64")
    f["slurm_index"] = f["slurm_index"].astype("float64")
    return f


def test_the_vectorised_judge_gives_the_row_judges_verdicts() -> None:
    """judge_frame takes a column path for devices that can only be healthy and the row
    path for the rest: on random frames (nulls, NaN times, every status, XIDs in and out
    of the list, counted and uncounted throttle reasons, each rule on or off) it answers
    exactly what judge answers on the same rows."""
    import random

    rng = random.Random(5)
    fast = slow = 0
    for _ in range(300):
        f = _random_frame(rng, rng.randint(1, 60))
        rules = H.HealthRules(throttle_persist_s=rng.choice([0, 50, 300]),
                              stale_s=rng.choice([5, 90, 1000]),
                              rules=tuple(rng.sample(H.RULES, rng.randint(0, 4))))
        want = H.judge(H.frame_rows(f), rules, NOW)
        assert H.judge_frame(f, rules, NOW) == want
        for nh in want.values():
            for d in nh.devices:
                fast += d.verdict == H.HEALTHY
                slow += d.verdict != H.HEALTHY
    assert fast > 50 and slow > 50  # both paths were taken


def test_health_pass_judges_a_frame_as_it_judges_rows(tmp_path: Path) -> None:
    import pandas as pd

    samples = healthy("g1") + rows("g2", 0, ecc_uncorrectable=3) + rows("g2", 1)
    back = FakeSlurm(nodes=[node("g1"), node("g2", n=2)])
    by_rows = health_pass(back, None, log_at(tmp_path), apply=False, now=NOW,
                          samples=samples, policy=DRAIN)
    by_frame = health_pass(back, None, log_at(tmp_path), apply=False, now=NOW,
                           samples=pd.DataFrame(samples), policy=DRAIN)
    assert by_rows.plan.to_dict() == by_frame.plan.to_dict()
    assert [d.node for d in by_frame.plan.decisions if d.action == "drain"] == ["g2"]
