"""The rebalance ``weights`` phase: measured GPU load (and, with ``[weights] cpu_load``, a
CPU-only node's CPULoad) to node ``Weight=``, through Slurm.

:mod:`hetslurm.policy.weights` judges; this module reads what it needs (the live nodes, the
site's weights, the store's samples, what the action log says hetslurm last wrote) and, with
``apply``, writes each new weight with ``scontrol update NodeName=... Weight=...``, reads it
back, and logs an ``action`` entry (``source = "weights"``, an ``action_id``, the node, the
weight written, the one before, why). A dry run reads only.

A weight set with ``scontrol`` is lost on ``scontrol reconfigure`` and on a controller
restart: every run compares the live weight with the last one written and writes it again
(``reassert``), saying so. Protection against acting twice: each node is re-read right
before it is written; a node that already shows the target is left alone (``already``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetslurm.act.log import ActionLog, select_undo, undoable_actions
from hetslurm.errors import HetslurmError
from hetslurm.policy.weights import (
    WeightDecision,
    WeightRules,
    cpu_load_of,
    decide,
    node_loads,
)
from hetslurm.site.model import Site
from hetslurm.site.schema import Collector, Weights
from hetslurm.slurm.backend import NodeInfo, SlurmBackend

SOURCE = "weights"


@dataclass
class WeightPlan:
    decisions: list[WeightDecision] = field(default_factory=list)

    def changes(self) -> list[WeightDecision]:
        return [d for d in self.decisions if d.action in ("set", "reassert")]

    def to_dict(self) -> dict[str, Any]:
        return {"decisions": [d.to_dict() for d in self.decisions]}


@dataclass(frozen=True)
class WeightOutcome:
    node: str
    action: str
    weight: int
    previous: int
    result: str  # done | already | failed: ... | not shown: ...
    action_id: str | None = None


def rules_of(site: Site) -> WeightRules:
    """``[weights]`` with its stale limit resolved (3 collector intervals by default)."""
    w = site.sections.get("weights")
    w = w if isinstance(w, Weights) else Weights()
    coll = site.sections.get("collector")
    interval = coll.interval_s if isinstance(coll, Collector) else 30.0
    stale = float(w.stale_s) if w.stale_s is not None else 3.0 * float(interval)
    return WeightRules(band=w.band, window_s=float(w.window_s), min_samples=w.min_samples,
                       stale_s=stale, hysteresis=w.hysteresis,
                       release_util_pct=float(w.release_util_pct), hold_s=float(w.hold_s),
                       cpu_load=w.cpu_load)


def written(entries: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, float | None]]:
    """Per node, from the action log: the last weight hetslurm wrote and when it last
    *moved* it (a re-assertion writes the same weight again and is no move)."""
    out: dict[str, tuple[int, float | None]] = {}
    for e in entries:
        if e.get("source") != SOURCE or e.get("result") != "done":
            continue
        node, weight, t = e.get("node"), e.get("weight"), e.get("t")
        if not isinstance(node, str) or isinstance(weight, bool) or not isinstance(weight, int):
            continue
        moved = t if e.get("action") == "set" and isinstance(t, int | float) else None
        prev = out.get(node)
        out[node] = (weight, moved if moved is not None else (prev[1] if prev else None))
    return out


def plan_weights(nodes: Sequence[NodeInfo], site: Site, samples: Any, rules: WeightRules,
                 last: Mapping[str, tuple[int, float | None]], *, now: float) -> WeightPlan:
    """A decision per GPU node of the site that Slurm lists, and per CPU-only node (no GPU,
    no FPGA) with ``[weights] cpu_load`` (its load from Slurm's CPULoad)."""
    gpu_nodes = {n.name: n.gpus[0].model for n in site.nodes if n.gpus}
    loads = node_loads(samples, gpu_nodes, since=now - rules.window_s, now=now)
    live = {n.name: n for n in nodes}
    plan = WeightPlan()
    for spec in site.nodes:
        node = live.get(spec.name)
        if node is None:
            continue
        if spec.gpus:
            model, load = spec.gpus[0].model, loads[spec.name]
        elif rules.cpu_load and not spec.fpgas:
            model = "cpu"
            load = cpu_load_of(spec.name, node.cpu_load, node.cpus_total or spec.cpus,
                               node.state)
        else:
            continue
        wrote, moved = last.get(spec.name, (None, None))
        plan.decisions.append(decide(spec.name, model, spec.weight, node.weight, wrote,
                                     moved, load, rules, now))
    return plan


def apply_weights(backend: SlurmBackend, plan: WeightPlan, log: ActionLog, *,
                  now: float) -> list[WeightOutcome]:
    """Write each change, read it back, log it (one ``action`` entry per node written)."""
    out: list[WeightOutcome] = []
    for d in plan.changes():
        try:
            fresh = backend.node(d.node)
        except HetslurmError as exc:
            out.append(WeightOutcome(d.node, d.action, d.target, d.live_weight,
                                     f"failed: {exc}"))
            continue
        if fresh.weight == d.target and d.last_written == d.target:
            out.append(WeightOutcome(d.node, d.action, d.target, fresh.weight, "already"))
            continue
        action_id = f"weight-{int(now)}-{d.node}"
        result = _write(backend, d.node, d.target)
        log.append("action", {"t": now, "source": SOURCE, "action_id": action_id,
                              "node": d.node, "action": d.action, "weight": d.target,
                              "previous": fresh.weight, "site_weight": d.site_weight,
                              "mean_util_pct": d.mean_util_pct, "why": d.why,
                              "result": result})
        out.append(WeightOutcome(d.node, d.action, d.target, fresh.weight, result, action_id))
    return out


def _write(backend: SlurmBackend, node: str, weight: int) -> str:
    """Set ``node``'s weight and read it back: ``done``, ``not shown: ...`` or
    ``failed: ...``."""
    try:
        backend.set_node_weight(node, weight)
        shown = backend.node(node).weight
    except HetslurmError as exc:
        return f"failed: {exc}"
    return "done" if shown == weight else f"not shown: Slurm shows {shown}"


def run_weights(backend: SlurmBackend, site: Site, samples: Any, log: ActionLog, *,
                apply: bool, now: float | None = None, nodes: Sequence[NodeInfo] | None = None
                ) -> tuple[WeightPlan, list[WeightOutcome]]:
    """The phase: plan from the live nodes (``nodes``: a read already made) and, with
    ``apply``, act."""
    now = time.time() if now is None else now
    rules = rules_of(site)
    if rules.band == 0:
        return WeightPlan(), []
    last = written(log.entries("action", now=now))
    plan = plan_weights(nodes if nodes is not None else backend.nodes(), site, samples, rules,
                        last, now=now)
    return plan, (apply_weights(backend, plan, log, now=now) if apply else [])


# ------------------------------------------------------------------ undo
@dataclass(frozen=True)
class WeightUndo:
    """One undo step: put ``node`` back to ``weight`` (``none``: left alone, ``detail`` says
    why)."""

    undo: str
    node: str
    action: str  # "weight" or "none"
    weight: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"undo": self.undo, "node": self.node, "action": self.action,
                "weight": self.weight, "detail": self.detail}


def undoable(entries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """hetslurm's completed weight changes not yet undone, oldest first."""
    return [e for e in undoable_actions(entries, SOURCE, ("set", "reassert"))
            if isinstance(e.get("previous"), int) and isinstance(e.get("weight"), int)]


def plan_rollback(backend: SlurmBackend, log: ActionLog, to: str | None = None
                  ) -> list[WeightUndo]:
    """What undoing would do, newest first: ``to`` (an action id) and every later weight
    change; without it, the changes of the latest run that made any. A node whose live
    weight is no longer the one written is left alone.

    Raises:
        ConfigError: ``to`` names no completed, not yet undone weight change.
    """
    todo = select_undo(undoable(log.entries("action")), to, "weight change", log.path)
    steps: list[WeightUndo] = []
    for e in reversed(todo):
        aid, node = str(e["action_id"]), str(e["node"])
        try:
            live = backend.node(node)
        except HetslurmError as exc:
            steps.append(WeightUndo(aid, node, "none", 0, f"left alone: {exc}"))
            continue
        if live.weight != e["weight"]:
            steps.append(WeightUndo(aid, node, "none", live.weight,
                                    f"left alone: Weight={live.weight}, not the {e['weight']} "
                                    "hetslurm wrote (changed since)"))
        else:
            steps.append(WeightUndo(aid, node, "weight", int(e["previous"]),
                                    f"Weight={e['weight']} back to {e['previous']}"))
    return steps


def apply_rollback(backend: SlurmBackend, steps: Sequence[WeightUndo], log: ActionLog, *,
                   now: float) -> list[WeightOutcome]:
    """Carry out the undo steps (the caller holds the run lock); each re-reads its node."""
    out: list[WeightOutcome] = []
    entries = {str(e.get("action_id")): e for e in log.entries("action")
               if e.get("source") == SOURCE}
    for s in steps:
        if s.action == "none":
            continue
        written_w = entries.get(s.undo, {}).get("weight")
        try:
            live = backend.node(s.node)
        except HetslurmError as exc:
            out.append(WeightOutcome(s.node, "rollback", s.weight, 0, f"failed: {exc}"))
            continue
        if live.weight != written_w:
            result = f"skipped: Weight={live.weight} now, not {written_w}"
        else:
            result = _write(backend, s.node, s.weight)
        aid = f"weight-rollback-{int(now)}-{s.node}"
        log.append("action", {"t": now, "source": SOURCE, "action_id": aid, "node": s.node,
                              "action": "rollback", "rollback_of": s.undo, "weight": s.weight,
                              "previous": live.weight, "result": result})
        out.append(WeightOutcome(s.node, "rollback", s.weight, live.weight, result, aid))
    return out
