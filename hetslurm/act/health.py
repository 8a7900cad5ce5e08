"""Device health -> drain, one path: plan, act, undo (docs/act.md#device-health).

Slurm cannot drain one GPU, so an unhealthy device drains its whole node: no new job starts
there, running jobs finish (a drain never kills them; the plan lists them). The reason
starts ``hetslurm:`` and names the device and the evidence
(``hetslurm: gpu1 GPU 2 (minor 131) ecc_uncorrectable=3``).

A node is undrained (``State=UNDRAIN``: clears the drain, never resumes a DOWN node) only
when its reason is still exactly the one hetslurm's own logged drain set, and every device
is healthy again. A node that is DOWN, or drained for any other reason (a site's node
health check owns its drains), is left alone. Unknown (stale or unreadable samples) never
drains nor undrains. At most ``[health] max_drain_share`` of a model's GPUs are drained in
one pass; the rest is deferred to a later pass.

:func:`plan_health` changes nothing; :func:`apply_health` re-reads each node right before
acting, acts through the access layer, reads it back and logs every step;
:func:`plan_rollback` / :func:`apply_rollback` undo logged actions by id.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetslurm.act.log import ActionLog, select_undo, undoable_actions
from hetslurm.errors import ConfigError, HetslurmError
from hetslurm.policy import health as H
from hetslurm.slurm.backend import JobInfo, NodeInfo, NodeStateChange, SlurmBackend

if TYPE_CHECKING:
    from hetslurm.site.model import Site

SOURCE = "health"
PREFIX = "hetslurm:"
#: Job states in which a job holds its node (it finishes there after a drain).
HOLDING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "CONFIGURING"})
#: Rules that only count in the summary.
QUIET_RULES = ("healthy", "unknown")


# ------------------------------------------------------------------ the policy
@dataclass(frozen=True)
class HealthPolicy:
    """``[health]`` resolved against ``[collector]`` (see :func:`policy_for`)."""

    mode: str = "report"
    rules: H.HealthRules = field(default_factory=H.HealthRules)
    max_drain_share: float = 0.25
    verify_timeout_s: float = 10.0


def policy_for(site: Site | None) -> HealthPolicy:
    """The health policy of ``site``; ``[collector] drain_lost_gpu`` decides the defaults.

    ``drain_lost_gpu = true`` with no ``[health] mode`` gives ``mode = "drain"`` and, with no
    ``[health] rules``, only the ``lost`` rule: what the collector used to do. Otherwise the
    mode defaults to ``report`` and the rules to all four.

    Raises:
        ConfigError: ``drain_lost_gpu = true`` and ``[health]`` switches the lost rule or
            draining off (the two settings contradict each other).
    """
    from hetslurm.site.schema import Collector, Health

    sections = site.sections if site is not None else {}
    coll = sections.get("collector") or Collector()
    conf = sections.get("health") or Health()
    legacy = bool(coll.drain_lost_gpu)
    mode = conf.mode or ("drain" if legacy else "report")
    if conf.rules is not None:
        rules = tuple(conf.rules)
    elif legacy and conf.mode is None:
        rules = ("lost",)
    else:
        rules = H.RULES
    if legacy and (mode != "drain" or "lost" not in rules):
        raise ConfigError("[collector] drain_lost_gpu = true asks for lost GPUs to drain their "
                          f"node, but [health] has mode = {mode!r}, rules = {list(rules)}; "
                          "remove drain_lost_gpu (the [health] section now decides)")
    stale = float(conf.stale_s) if conf.stale_s is not None else 3.0 * float(coll.interval_s)
    return HealthPolicy(
        mode=mode,
        rules=H.HealthRules(rules=rules, ecc_uncorrectable_max=conf.ecc_uncorrectable_max,
                            xids=frozenset(conf.xids),
                            throttle_reasons=frozenset(conf.throttle_reasons),
                            throttle_persist_s=float(conf.throttle_persist_s), stale_s=stale),
        max_drain_share=float(conf.max_drain_share),
        verify_timeout_s=float(conf.verify_timeout_s))


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class HealthDecision:
    """What the pass decided for one node.

    ``rule``: ``drain``, ``deferred`` (the share cap), ``already-drained``, ``left-alone``
    (DOWN, or drained for another reason), ``not-ours`` (a ``hetslurm:`` reason the action
    log did not set), ``undrain``, ``waiting`` (our drain, a device still unknown).
    ``action``: ``drain``, ``undrain`` or ``none``. ``reason``: the reason a drain sets, or
    the node's current one.
    """

    node: str
    rule: str
    action: str
    reason: str
    detail: str
    state: str
    devices: tuple[H.DeviceVerdict, ...] = ()
    gpus: Mapping[str, int] = field(default_factory=dict)
    running_jobs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "rule": self.rule, "action": self.action,
                "reason": self.reason, "detail": self.detail, "state": self.state,
                "devices": [d.to_dict() for d in self.devices], "gpus": dict(self.gpus),
                "running_jobs": list(self.running_jobs)}


@dataclass
class HealthPlan:
    mode: str
    decisions: list[HealthDecision] = field(default_factory=list)
    quiet: dict[str, int] = field(default_factory=dict)
    #: Model -> (GPUs this pass would drain, the most it may).
    cap: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "decisions": [d.to_dict() for d in self.decisions],
                "quiet": dict(self.quiet),
                "cap": {m: {"draining": a, "max": b} for m, (a, b) in self.cap.items()}}


@dataclass(frozen=True)
class HealthOutcome:
    """What happened to one node: ``done``, ``skipped``, ``failed``, ``not-changed`` or
    ``report`` (``[health] mode = "report"``: nothing is done)."""

    node: str
    action: str
    result: str
    action_id: str = ""
    detail: str = ""


def ours(log_entries: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Node -> hetslurm's latest completed health action on it (drain or undrain)."""
    last: dict[str, Mapping[str, Any]] = {}
    for e in log_entries:
        if (e.get("kind") == "action" and e.get("source") == SOURCE
                and e.get("result") == "done" and isinstance(e.get("node"), str)
                and e.get("action") in ("drain", "undrain")):
            last[e["node"]] = e
    return last


def drained_by_us(node: NodeInfo, last: Mapping[str, Mapping[str, Any]]) -> bool:
    """The node is drained, its reason starts ``hetslurm:``, and hetslurm's latest action on
    it is the drain that set exactly this reason."""
    entry = last.get(node.name)
    return (node.drained and (node.reason or "").startswith(PREFIX) and entry is not None
            and entry.get("action") == "drain" and entry.get("reason") == node.reason)


def _gpus_of(node: NodeInfo) -> dict[str, int]:
    out: dict[str, int] = {}
    for (kind, model), n in node.gres_total.items():
        if kind == "gpu":
            out[model or "gpu"] = out.get(model or "gpu", 0) + int(n)
    return out


def _running_on(jobs: Sequence[JobInfo]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for j in jobs:
        if j.state in HOLDING:
            for n in j.nodes:
                out.setdefault(n, []).append(j.display_id)
    return out


def plan_health(nodes: Sequence[NodeInfo], jobs: Sequence[JobInfo], verdicts:
                Mapping[str, H.NodeHealth], pol: HealthPolicy,
                log_entries: Iterable[Mapping[str, Any]],
                expected_gpus: Mapping[str, int] | None = None) -> HealthPlan:
    """Decide, changing nothing. ``expected_gpus``: node -> GPU count the site gives it (an
    undrain needs every one judged healthy; default: the node's GPU GRES count)."""
    last = ours(log_entries)
    running = _running_on(jobs)
    totals: dict[str, int] = {}
    for n in nodes:
        for model, cnt in _gpus_of(n).items():
            totals[model] = totals.get(model, 0) + cnt
    limit = {m: math.floor(pol.max_drain_share * t + 1e-9) for m, t in totals.items()}
    taken = dict.fromkeys(totals, 0)
    plan = HealthPlan(mode=pol.mode)
    quiet = {r: 0 for r in QUIET_RULES}
    wants: list[tuple[int, str, HealthDecision]] = []
    for n in nodes:
        nh = verdicts.get(n.name, H.NodeHealth(n.name))
        gpus = _gpus_of(n)
        jobs_here = tuple(running.get(n.name, ()))
        label = n.state_label
        bad = nh.unhealthy
        expected = (expected_gpus or {}).get(n.name, sum(gpus.values()) or None)

        def d(rule: str, action: str, reason: str, detail: str, *, node: NodeInfo = n,
              devs: tuple[H.DeviceVerdict, ...] = nh.devices, gpus: dict[str, int] = gpus,
              jobs_here: tuple[str, ...] = jobs_here, label: str = label) -> HealthDecision:
            return HealthDecision(node.name, rule, action, reason, detail, label, devs, gpus,
                                  jobs_here)

        current = n.reason or ""
        if n.drained and current.startswith(PREFIX):
            if not drained_by_us(n, last):
                plan.decisions.append(d("not-ours", "none", current,
                                        "left alone: hetslurm's action log has no drain that "
                                        "set this reason"))
            elif "DOWN" in n.state:
                plan.decisions.append(d("left-alone", "none", current, "left alone: DOWN"))
            elif bad:
                plan.decisions.append(d("already-drained", "none", current,
                                        "drained by hetslurm; still unhealthy: "
                                        + H.reason_text(n.name, bad)[len(PREFIX) + 1:]))
            elif nh.all_healthy(expected):
                plan.decisions.append(d("undrain", "undrain", current,
                                        f"all {len(nh.devices)} GPU(s) healthy again"))
            else:
                unknown = [x.device for x in nh.devices if x.verdict == H.UNKNOWN]
                missing = (expected or 0) - len(nh.devices)
                why = ", ".join(unknown) or "no device"
                if missing > 0:
                    why += f"; {missing} GPU(s) without samples"
                plan.decisions.append(d("waiting", "none", current,
                                        f"drained by hetslurm; unknown: {why}"))
            continue
        if not bad:
            unknown_dev = any(x.verdict == H.UNKNOWN for x in nh.devices) or not nh.devices
            quiet["unknown" if unknown_dev else "healthy"] += 1
            continue
        if "DOWN" in n.state or "FAIL" in n.state:
            plan.decisions.append(d("left-alone", "none", current,
                                    f"left alone: {label}" + (f": {current}" if current
                                                              else "")))
            continue
        if n.drained:
            plan.decisions.append(d("left-alone", "none", current,
                                    f"left alone: {current or 'drained without a reason'}"))
            continue
        reason = H.reason_text(n.name, bad)
        sev = min(x.severity for x in bad)
        wants.append((sev, n.name, d("drain", "drain", reason, _drain_detail(jobs_here))))
    for _, _, dec in sorted(wants, key=lambda w: (w[0], w[1])):
        over = [m for m, c in dec.gpus.items() if taken.get(m, 0) + c > limit.get(m, 0)]
        if over:
            m = over[0]
            plan.decisions.append(HealthDecision(
                dec.node, "deferred", "none", dec.reason,
                f"deferred: draining it would take {taken[m] + dec.gpus[m]} of {totals[m]} "
                f"{m} GPUs out this pass (max_drain_share {pol.max_drain_share:g}: "
                f"{limit[m]})", dec.state, dec.devices, dec.gpus, dec.running_jobs))
            continue
        for m, c in dec.gpus.items():
            taken[m] = taken.get(m, 0) + c
        plan.decisions.append(dec)
    plan.quiet = quiet
    plan.cap = {m: (taken[m], limit[m]) for m in totals if taken[m]}
    return plan


def _drain_detail(jobs: tuple[str, ...]) -> str:
    if not jobs:
        return "whole node drained (Slurm cannot drain one GPU); no job running"
    return (f"whole node drained (Slurm cannot drain one GPU); {len(jobs)} running job(s) "
            f"finish there: {', '.join(jobs)}")


# ------------------------------------------------------------------ acting
def _action_id(kind: str, now: float, node: str) -> str:
    return f"{kind}-{int(now)}-{node}"


def _recheck(node: NodeInfo, dec: HealthDecision,
             last: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why the node's live state no longer allows the decision (None: it does)."""
    if "DOWN" in node.state or "FAIL" in node.state:
        return f"node is {node.state_label} now"
    if dec.action == "drain":
        if node.drained:
            return f"drained since the plan: {node.reason or 'no reason'}"
        return None
    if not drained_by_us(node, last):
        return f"not drained by hetslurm any more: {node.state_label}: {node.reason or ''}"
    if node.reason != dec.reason:
        return f"reason changed since the plan: {node.reason or ''}"
    return None


def _set_node(backend: SlurmBackend, name: str, action: str, reason: str,
              verify_timeout_s: float, sleep: Callable[[float], None],
              clock: Callable[[], float]) -> tuple[str, str]:
    """Drain or undrain, then read back until Slurm shows it. (result, detail)."""
    try:
        if action == "drain":
            backend.update_node(name, NodeStateChange.DRAIN, reason)
        else:
            backend.update_node(name, NodeStateChange.UNDRAIN)
    except HetslurmError as exc:
        return "failed", str(exc)[:300]
    end = clock() + verify_timeout_s
    while True:
        try:
            now = backend.node(name)
        except HetslurmError as exc:
            return "not-changed", f"cannot read {name} back: {exc}"[:300]
        if action == "drain" and now.drained and now.reason == reason:
            return "done", now.state_label
        if action == "undrain" and not now.drained:
            return "done", now.state_label
        if clock() >= end:
            return "not-changed", f"Slurm shows {now.state_label}: {now.reason or ''}"
        sleep(0.2)


def apply_health(backend: SlurmBackend, plan: HealthPlan, pol: HealthPolicy, log: ActionLog,
                 *, now: float, run_source: str = "rebalance",
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> list[HealthOutcome]:
    """Carry out ``plan`` (the caller holds the run lock). Every non-quiet decision is logged;
    each drain or undrain re-reads its node first and is skipped when the node changed."""
    outcomes: list[HealthOutcome] = []
    for dec in plan.decisions:
        log.append("decision", {"t": now, "source": SOURCE, "run_source": run_source,
                                "phase": "health", "mode": pol.mode, **dec.to_dict()})
        if dec.action == "none":
            continue
        if pol.mode != "drain":
            outcomes.append(HealthOutcome(dec.node, dec.action, "report",
                                          detail="[health] mode is report"))
            continue
        aid = _action_id(dec.action, now, dec.node)
        outcomes.append(_act(backend, dec.node, dec.action, dec.reason, dec, log, aid, now,
                             pol, sleep, clock, evidence=[x.to_dict() for x in dec.devices],
                             running_jobs=list(dec.running_jobs)))
    return outcomes


def _act(backend: SlurmBackend, node: str, action: str, reason: str,
         dec: HealthDecision | None, log: ActionLog, aid: str, now: float,
         pol: HealthPolicy, sleep: Callable[[float], None], clock: Callable[[], float],
         **extra: Any) -> HealthOutcome:
    entry: dict[str, Any] = {"t": now, "source": SOURCE, "node": node, "action": action,
                             "action_id": aid, "reason": reason, **extra}
    try:
        live = backend.node(node)
    except HetslurmError as exc:
        log.append("action", {**entry, "result": "skipped", "detail": str(exc)[:300]})
        return HealthOutcome(node, action, "skipped", aid, str(exc)[:300])
    if dec is not None:
        why = _recheck(live, dec, ours(log.entries("action")))
        if why:
            log.append("action", {**entry, "result": "skipped", "detail": why})
            return HealthOutcome(node, action, "skipped", aid, why)
    # The reason the node had before (an undo of an undrain sets it again).
    entry["previous_reason"] = live.reason
    result, detail = _set_node(backend, node, action, reason, pol.verify_timeout_s, sleep,
                               clock)
    log.append("action", {**entry, "result": result, "detail": detail})
    return HealthOutcome(node, action, result, aid, detail)


# ------------------------------------------------------------------ undo
@dataclass(frozen=True)
class RollbackStep:
    """Undoing one logged action: ``undrain`` an our-drain, ``drain`` an our-undrain, or
    ``none`` (``detail`` says why it is left alone)."""

    undo: str
    node: str
    action: str
    reason: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"undo": self.undo, "node": self.node, "action": self.action,
                "reason": self.reason, "detail": self.detail}


def undoable(entries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """hetslurm's completed health actions not yet undone, oldest first (undo steps
    themselves are not undone again: run the health step, or drain by hand)."""
    return undoable_actions(entries, SOURCE, ("drain", "undrain"))


def plan_rollback(backend: SlurmBackend, log: ActionLog, to: str | None = None
                  ) -> list[RollbackStep]:
    """What undoing would do, newest first: ``to`` (an action id) and every later health
    action; without it, the actions of the latest run that acted.

    Raises:
        ConfigError: ``to`` names no completed, not yet undone health action.
    """
    todo = select_undo(undoable(log.entries("action")), to, "health action", log.path)
    last = ours(log.entries("action"))
    steps = []
    for e in reversed(todo):
        node = str(e["node"])
        try:
            live = backend.node(node)
        except HetslurmError as exc:
            steps.append(RollbackStep(e["action_id"], node, "none", "", f"left alone: {exc}"))
            continue
        steps.append(_undo_step(e, live, last))
    return steps


def _undo_step(e: Mapping[str, Any], live: NodeInfo,
               last: Mapping[str, Mapping[str, Any]]) -> RollbackStep:
    aid, node, did = str(e["action_id"]), live.name, str(e["action"])
    if "DOWN" in live.state or "FAIL" in live.state:
        return RollbackStep(aid, node, "none", "", f"left alone: {live.state_label}")
    if did == "drain":
        if drained_by_us(live, last) and live.reason == e.get("reason"):
            return RollbackStep(aid, node, "undrain", live.reason or "",
                                "our drain; reason unchanged")
        return RollbackStep(aid, node, "none", "",
                            f"left alone: {live.state_label}: {live.reason or 'no reason'} "
                            "(not our drain any more)")
    prev = e.get("reason")
    if live.drained:
        return RollbackStep(aid, node, "none", "",
                            f"left alone: drained since: {live.reason or 'no reason'}")
    if not isinstance(prev, str) or not prev.startswith(PREFIX):
        return RollbackStep(aid, node, "none", "", "left alone: no hetslurm reason to restore")
    return RollbackStep(aid, node, "drain", prev, "drain again with the reason it had")


def apply_rollback(backend: SlurmBackend, steps: Sequence[RollbackStep], pol: HealthPolicy,
                   log: ActionLog, *, now: float,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> list[HealthOutcome]:
    """Carry out the undo steps (the caller holds the run lock); each re-checks its node."""
    out = []
    for s in steps:
        if s.action == "none":
            log.append("action", {"t": now, "source": SOURCE, "node": s.node, "action": "none",
                                  "rollback_of": s.undo, "result": "skipped",
                                  "detail": s.detail})
            out.append(HealthOutcome(s.node, "none", "skipped", "", s.detail))
            continue
        try:
            live = backend.node(s.node)
        except HetslurmError as exc:
            out.append(HealthOutcome(s.node, s.action, "skipped", "", str(exc)[:300]))
            continue
        last = ours(log.entries("action"))
        entry = next((e for e in log.entries("action") if e.get("action_id") == s.undo), None)
        again = _undo_step(entry, live, last) if entry is not None else None
        if again is None or again.action != s.action or again.reason != s.reason:
            why = again.detail if again is not None else "the action is gone from the log"
            log.append("action", {"t": now, "source": SOURCE, "node": s.node,
                                  "action": s.action, "rollback_of": s.undo,
                                  "result": "skipped", "detail": f"changed since the plan: "
                                                                 f"{why}"})
            out.append(HealthOutcome(s.node, s.action, "skipped", "", why))
            continue
        aid = _action_id(f"rollback-{s.action}", now, s.node)
        out.append(_act(backend, s.node, s.action, s.reason, None, log, aid, now, pol, sleep,
                        clock, rollback_of=s.undo))
    return out


# ------------------------------------------------------------------ samples
def read_health_samples(store: str | None, site: Site | None, rules: H.HealthRules,
                        now: float) -> tuple[Any, list[str]]:
    """The rule columns of the last ``rules.window_s`` from the store; a missing store or a
    refused segment becomes a problem (fewer samples only make devices unknown)."""
    from pathlib import Path

    from hetslurm.metrics.samples import COLUMNS
    from hetslurm.metrics.store import SegmentStore

    if not store or not Path(store).is_dir():
        return None, [f"no metrics store at {store!r}: every device is unknown"]
    cols = [c for c in H.COLUMNS if c in COLUMNS]
    frame, report = SegmentStore.of_site(store, site).read(now - rules.window_s, now,
                                                          columns=cols)
    problems = []
    if report.partial:
        problems.append(f"{sum(report.refused.values())} segment(s) refused")
    return frame, problems


def rows_in_window(samples: Any, rules: H.HealthRules, now: float) -> Any:
    """The samples of an in-memory frame (or list of row dicts) inside the health window,
    of the same kind."""
    if samples is None:
        return []
    if isinstance(samples, list):
        lo = now - rules.window_s
        return [r for r in samples if lo <= float(r["time"]) <= now]
    if len(samples) == 0:
        return samples
    return samples[(samples["time"] >= now - rules.window_s) & (samples["time"] <= now)]


def judge_samples(samples: Any, rules: H.HealthRules, now: float) -> dict[str, H.NodeHealth]:
    """Verdicts of a frame (vectorised, :func:`~hetslurm.policy.health.judge_frame`) or of
    row dicts (:func:`~hetslurm.policy.health.judge`): the same rules either way."""
    if samples is None:
        return {}
    if isinstance(samples, list):
        return H.judge(samples, rules, now)
    return H.judge_frame(samples, rules, now)


def expected_gpus(site: Site | None) -> dict[str, int]:
    """Node -> the GPU count the site gives it (empty without a site)."""
    if site is None:
        return {}
    return {n.name: len(n.gpus) for n in site.nodes}


# ------------------------------------------------------------------ one pass
@dataclass
class HealthRun:
    """One health pass: the plan, what was done, problems (a store not readable...)."""

    plan: HealthPlan
    outcomes: list[HealthOutcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.plan.to_dict(), "outcomes": [o.__dict__ for o in self.outcomes],
                "problems": self.problems}


def health_pass(backend: SlurmBackend, site: Site | None, log: ActionLog, *, apply: bool,
                now: float, store: str | None = None, samples: Any = None,
                policy: HealthPolicy | None = None, nodes: Sequence[NodeInfo] | None = None,
                jobs: Sequence[JobInfo] | None = None,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> HealthRun:
    """Judge every node's GPUs and (with ``apply``, the caller holding the lock) drain and
    undrain. ``samples`` (a frame or rows; tests) replaces the store."""
    pol = policy or policy_for(site)
    problems: list[str] = []
    if samples is not None:
        rows = rows_in_window(samples, pol.rules, now)
    else:
        if store is None and site is not None and site.sections.get("collector") is not None:
            store = site.sections["collector"].store
        rows, problems = read_health_samples(store, site, pol.rules, now)
    verdicts = judge_samples(rows, pol.rules, now)
    nodes = backend.nodes() if nodes is None else nodes
    jobs = backend.jobs() if jobs is None else jobs
    plan = plan_health(nodes, jobs, verdicts, pol, log.entries("action", now=now),
                       expected_gpus(site))
    run = HealthRun(plan, problems=problems)
    if apply:
        run.outcomes = apply_health(backend, plan, pol, log, now=now, sleep=sleep, clock=clock)
    return run
