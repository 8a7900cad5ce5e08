"""The rebalance weights phase on a fake demo cluster: a busy node goes behind its twin (never
behind another model), a reset weight is re-asserted, a dry run changes nothing, a second run
does not act twice, and the log says what was written and why."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from _rebalance_fixtures import NOW, _node, demo_site

from hetslurm.act.log import ActionLog
from hetslurm.act.weights import rules_of, run_weights, written
from hetslurm.errors import ConfigError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.site import Site


def _cluster(site: Site) -> FakeSlurm:
    nodes = [replace(_node(site, n.name), weight=n.weight) for n in site.nodes]
    return FakeSlurm(nodes)


def _samples(site: Site, busy: dict[str, float], *, t0: float = NOW - 300,
             n: int = 10) -> pd.DataFrame:
    rows = []
    for spec in site.nodes:
        for g in spec.gpus:
            for k in range(n):
                rows.append({"time": t0 + 30 * k, "node": spec.name, "status": "ok",
                             "slurm_index": g.index,
                             "utilization_pct": busy.get(spec.name, 0.0)})
    return pd.DataFrame(rows)


def _gpu_pair(site: Site) -> tuple[str, str, str]:
    by_model: dict[str, list[str]] = {}
    for n in site.nodes:
        if n.gpus:
            by_model.setdefault(n.gpus[0].model, []).append(n.name)
    model, names = next((m, v) for m, v in by_model.items() if len(v) >= 2)
    return model, names[0], names[1]


def test_busy_node_moves_within_its_band_and_the_log_says_why(tmp_path: Path) -> None:
    site = demo_site()
    _model, busy, other = _gpu_pair(site)
    slurm = _cluster(site)
    log = ActionLog(tmp_path / "actions.jsonl")
    samples = _samples(site, {busy: 95.0})

    plan, outcomes = run_weights(slurm, site, samples, log, apply=False, now=NOW)
    assert outcomes == [] and not log.path.exists()  # a dry run writes nothing
    d = {x.node: x for x in plan.decisions}
    band = rules_of(site).band
    assert d[busy].action == "set" and d[busy].target == site.node(busy).weight + band
    assert d[other].action == "keep" and d[other].target == site.node(other).weight
    # Never past the next model's weight: bands stay apart.
    weights = sorted({n.weight for n in site.nodes if n.gpus})
    assert all(d[busy].target < w for w in weights if w > site.node(busy).weight)

    plan, outcomes = run_weights(slurm, site, samples, log, apply=True, now=NOW)
    assert [(o.node, o.result) for o in outcomes] == [(busy, "done")]
    assert slurm.node(busy).weight == site.node(busy).weight + band
    entry = [e for e in log.entries("action") if e["source"] == "weights"][-1]
    assert entry["node"] == busy and entry["weight"] == slurm.node(busy).weight
    assert entry["previous"] == site.node(busy).weight and "95%" in entry["why"]
    assert entry["action_id"]

    # A second run at once: nothing to do (hysteresis and the log say it is there).
    plan, outcomes = run_weights(slurm, site, samples, log, apply=True, now=NOW + 30)
    assert outcomes == []


def test_reset_by_reconfigure_is_reasserted_then_released_after_hold(tmp_path: Path) -> None:
    site = demo_site()
    _model, busy, _other = _gpu_pair(site)
    slurm = _cluster(site)
    log = ActionLog(tmp_path / "actions.jsonl")
    run_weights(slurm, site, _samples(site, {busy: 95.0}), log, apply=True, now=NOW)
    moved = slurm.node(busy).weight
    # `site apply` reconfigured: Slurm shows slurm.conf's weight again.
    slurm.set_node_weight(busy, site.node(busy).weight)
    _plan, outcomes = run_weights(slurm, site, _samples(site, {busy: 95.0}, t0=NOW), log,
                                 apply=True, now=NOW + 300)
    assert [(o.node, o.action, o.result) for o in outcomes] == [(busy, "reassert", "done")]
    assert slurm.node(busy).weight == moved
    # The load is gone (the fake was cleared): within the hold nothing moves...
    quiet = _samples(site, {}, t0=NOW + 300)
    _plan, outcomes = run_weights(slurm, site, quiet, log, apply=True, now=NOW + 590)
    assert outcomes == [] and slurm.node(busy).weight == moved
    # ...after it, the node returns to the site's weight.
    _plan, outcomes = run_weights(slurm, site, quiet, log, apply=True, now=NOW + 601)
    assert [(o.node, o.result) for o in outcomes] == [(busy, "done")]
    assert slurm.node(busy).weight == site.node(busy).weight


def test_no_samples_moves_nothing(tmp_path: Path) -> None:
    site = demo_site()
    slurm = _cluster(site)
    log = ActionLog(tmp_path / "actions.jsonl")
    plan, outcomes = run_weights(slurm, site, _samples(site, {})[:0], log, apply=True, now=NOW)
    assert outcomes == [] and {d.action for d in plan.decisions} == {"unknown"}


def test_written_reads_the_last_weight_and_the_last_move() -> None:
    entries = [
        {"source": "weights", "result": "done", "node": "gpu1", "weight": 105, "t": 10.0,
         "action": "set"},
        {"source": "weights", "result": "done", "node": "gpu1", "weight": 105, "t": 20.0,
         "action": "reassert"},
        {"source": "weights", "result": "failed: x", "node": "gpu1", "weight": 100, "t": 30.0,
         "action": "set"},
        {"source": "stall", "result": "done", "node": "gpu1", "weight": 1, "t": 40.0},
    ]
    assert written(entries) == {"gpu1": (105, 10.0)}


def test_rollback_by_id_restores_the_weight_only_while_ours(tmp_path: Path) -> None:
    from hetslurm.act.weights import apply_rollback, plan_rollback

    site = demo_site()
    _model, busy, _other = _gpu_pair(site)
    slurm = _cluster(site)
    log = ActionLog(tmp_path / "actions.jsonl")
    _plan, outcomes = run_weights(slurm, site, _samples(site, {busy: 95.0}), log, apply=True,
                                  now=NOW)
    aid = outcomes[0].action_id
    assert aid == f"weight-{int(NOW)}-{busy}"
    steps = plan_rollback(slurm, log, aid)
    assert [(s.node, s.action, s.weight) for s in steps] == [
        (busy, "weight", site.node(busy).weight)]
    # Dry run: nothing changed.
    assert slurm.node(busy).weight == site.node(busy).weight + 5
    done = apply_rollback(slurm, steps, log, now=NOW + 1)
    assert [o.result for o in done] == ["done"]
    assert slurm.node(busy).weight == site.node(busy).weight
    # Undone once: nothing left to undo; an unknown id is a clear error.
    assert plan_rollback(slurm, log) == []
    with pytest.raises(ConfigError, match="no weight change"):
        plan_rollback(slurm, log, aid)


def test_rollback_leaves_a_weight_changed_since_alone(tmp_path: Path) -> None:
    from hetslurm.act.weights import apply_rollback, plan_rollback

    site = demo_site()
    _model, busy, _other = _gpu_pair(site)
    slurm = _cluster(site)
    log = ActionLog(tmp_path / "actions.jsonl")
    run_weights(slurm, site, _samples(site, {busy: 95.0}), log, apply=True, now=NOW)
    slurm.set_node_weight(busy, 500)  # an admin
    steps = plan_rollback(slurm, log)
    assert [(s.action, "changed since" in s.detail) for s in steps] == [("none", True)]
    assert apply_rollback(slurm, steps, log, now=NOW + 1) == []
    assert slurm.node(busy).weight == 500


def test_cpu_nodes_move_by_slurms_cpuload_when_asked(tmp_path: Path) -> None:
    # The testbed's slurmd share one host (one CPULoad everywhere), so the CPULoad rule is
    # tested here: a CPU-only node whose load average is 95% of its CPUs goes behind its
    # twin; a node Slurm gives no load for, or one that is DOWN, is unknown; GPU and FPGA
    # nodes keep their own rules; without [weights] cpu_load no CPU node is judged.
    from hetslurm.site.schema import Weights

    site = demo_site()
    cpus = [n.name for n in site.nodes if not n.gpus and not n.fpgas]
    assert len(cpus) >= 2
    busy, idle = cpus[0], cpus[1]
    rest = cpus[2:]
    loads = {busy: 7.6, idle: 0.1}  # 8 CPUs each (the fixture's nodes)
    nodes = [replace(_node(site, n.name), weight=n.weight, cpu_load=loads.get(n.name))
             for n in site.nodes]
    slurm = FakeSlurm(nodes)
    log = ActionLog(tmp_path / "actions.jsonl")
    quiet = _samples(site, {})
    plan, _ = run_weights(slurm, site, quiet, log, apply=False, now=NOW)
    assert not {d.node for d in plan.decisions} & set(cpus)

    on = replace(site, sections={**site.sections, "weights": Weights(cpu_load=True)})
    plan, outcomes = run_weights(slurm, on, quiet, log, apply=True, now=NOW)
    d = {x.node: x for x in plan.decisions}
    band = rules_of(on).band
    assert d[busy].action == "set" and d[busy].model == "cpu"
    assert d[busy].target == site.node(busy).weight + band
    assert "CPULoad 7.6 on 8 CPUs (95%)" in d[busy].why
    assert d[idle].action == "keep" and d[idle].target == site.node(idle).weight
    for name in rest:
        assert d[name].action == "unknown" and "no CPULoad" in d[name].why
    assert not {n.name for n in site.nodes if n.fpgas} & set(d)
    assert [(o.node, o.result) for o in outcomes] == [(busy, "done")]
    assert slurm.node(busy).weight == site.node(busy).weight + band

    # DOWN: its last reading is no reading of now; nothing moves (the weight stays).
    down = [replace(n, state=frozenset({"DOWN"})) if n.name == busy else n
            for n in slurm.nodes()]
    plan, _ = run_weights(FakeSlurm(down), on, quiet, log, apply=False, now=NOW + 900)
    d = {x.node: x for x in plan.decisions}
    assert d[busy].action == "unknown" and "DOWN" in d[busy].why
