"""``hetslurm rebalance``: one cron tick of everything hetslurm does to a live cluster.

Five phases, in this order, under one lock and one time budget (``[rebalance]``):

0. **health** (:mod:`hetslurm.act.health`, ``[health]``): a node with an unhealthy GPU is
   drained (running jobs finish), a node hetslurm drained whose GPUs are healthy again is
   undrained; first, so the phases after it see drained nodes as unavailable;
1. **requeue-stalled** (:func:`hetslurm.act.run.requeue_stalled`, its own policy, lock and
   warnings): idle GPU jobs give their GPUs back first, so the next phase sees them free;
2. **weights** (:mod:`hetslurm.act.weights`, ``[weights]``): measured GPU load moves node
   ``Weight=`` within each model's band, and a weight a reconfigure reset is written again;
3. **relax** (:mod:`hetslurm.act.relax`): pending jobs that waited past ``pending_limit_s``
   and asked for preferred locality or a ranked model list get a relaxed request when the
   placement core says the relaxed one would start now;
4. **drift** (:mod:`hetslurm.act.drift`): the site file against the live configuration.

A dry run (the default) reads only: no Slurm command that changes anything, no log entry,
no lock. With ``apply`` a second concurrent run finds the lock held and raises
:class:`hetslurm.act.LockBusy` before reading anything. When the budget is spent no new
phase or job is started; what was skipped is listed.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetslurm.act import ActError, LockBusy
from hetslurm.act.drift import DriftReport, drift
from hetslurm.act.health import HealthRun, health_pass
from hetslurm.act.lock import RunLock
from hetslurm.act.log import ActionLog
from hetslurm.act.relax import RelaxOutcome, RelaxPlan, apply_relax, plan_relax
from hetslurm.act.run import StallRequest, context_for, requeue_stalled
from hetslurm.act.stall import RunResult
from hetslurm.act.weights import WeightOutcome, WeightPlan
from hetslurm.errors import ConfigError, HetslurmError
from hetslurm.policy.stall import OutputProbe
from hetslurm.site.schema import Rebalance
from hetslurm.slurm.backend import JobInfo, NodeInfo, SlurmBackend

if TYPE_CHECKING:
    from hetslurm.levers.live import Target
    from hetslurm.site.model import Site

PHASES = ("health", "requeue-stalled", "weights", "relax", "drift")


@dataclass(frozen=True)
class RebalanceRequest:
    """What ``hetslurm rebalance`` was asked; None means "the site's [rebalance] value"."""

    apply: bool = False
    store: str | None = None
    action_log: str | None = None
    lock_file: str | None = None
    budget_s: float | None = None
    phases: tuple[str, ...] | None = None
    #: The read cache's path ("" for none); None: the site's ``[rebalance] read_cache``.
    read_cache: str | None = None


@dataclass
class RebalanceResult:
    applied: bool
    budget_s: float
    seconds: float = 0.0
    health: HealthRun | None = None
    stall: RunResult | None = None
    relax: RelaxPlan | None = None
    relax_outcomes: list[RelaxOutcome] = field(default_factory=list)
    weights: WeightPlan | None = None
    weight_outcomes: list[WeightOutcome] = field(default_factory=list)
    drift: DriftReport | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def over_budget(self) -> bool:
        return any(s["why"] == "time budget" for s in self.skipped)

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per stall decision, relax decision, drift change and skipped item."""
        out: list[dict[str, Any]] = []
        if self.health is not None:
            by_node = {(o.node, o.action): o.result for o in self.health.outcomes}
            for h in self.health.plan.decisions:
                out.append({"phase": "health", "job": ",".join(h.running_jobs),
                            "rule": h.rule, "action": h.action,
                            "result": by_node.get((h.node, h.action), ""),
                            "detail": f"{h.node}: {h.detail}"
                            + (f" [{h.reason}]" if h.action == "drain" else "")})
        if self.stall is not None:
            results = {o.job: o.result for o in self.stall.outcomes}
            for d in self.stall.decisions:
                out.append({"phase": "requeue-stalled", "job": d.job, "rule": d.rule,
                            "action": d.action, "result": results.get(d.job, ""),
                            "detail": d.reason})
        if self.weights is not None:
            wres = {o.node: o.result for o in self.weight_outcomes}
            for w in self.weights.decisions:
                out.append({"phase": "weights", "job": w.node, "rule": w.action,
                            "action": (f"Weight={w.target}" if w.action in ("set", "reassert")
                                       else ""),
                            "result": wres.get(w.node, ""), "detail": w.why})
        if self.relax is not None:
            results = {o.job: o.result for o in self.relax_outcomes}
            for r in self.relax.decisions:
                row = r.row()
                out.append({"phase": "relax", "job": r.job, "rule": r.rule,
                            "action": r.action, "result": results.get(r.job, ""),
                            "detail": (f"{row['edits']}: " if row["edits"] else "")
                            + r.detail})
        if self.drift is not None:
            if self.drift.error:
                out.append({"phase": "drift", "job": "", "rule": "error", "action": "",
                            "result": "", "detail": self.drift.error})
            for c in self.drift.changes:
                out.append({"phase": "drift", "job": "", "rule": f"{c['file']}: {c['item']}",
                            "action": c["action"], "result": "",
                            "detail": f"{c['old']!s} -> {c['new']!s}"})
        for s in self.skipped:
            out.append({"phase": s["phase"], "job": s.get("job", ""), "rule": "skipped",
                        "action": "", "result": "", "detail": s["why"]})
        return out

    def to_dict(self) -> dict[str, Any]:
        stall = None
        if self.stall is not None:
            stall = {"decisions": [d.to_dict() for d in self.stall.decisions],
                     "outcomes": [o.__dict__ for o in self.stall.outcomes],
                     "problems": self.stall.problems}
        relax = None
        if self.relax is not None:
            relax = {"decisions": [d.to_dict() for d in self.relax.decisions],
                     "outcomes": [o.__dict__ for o in self.relax_outcomes],
                     "quiet": self.relax.quiet}
        weights = None
        if self.weights is not None:
            weights = {**self.weights.to_dict(),
                       "outcomes": [o.__dict__ for o in self.weight_outcomes]}
        return {"applied": self.applied, "seconds": round(self.seconds, 3),
                "budget_s": self.budget_s, "over_budget": self.over_budget,
                "health": None if self.health is None else self.health.to_dict(),
                "requeue_stalled": stall, "weights": weights, "relax": relax,
                "drift": None if self.drift is None else self.drift.to_dict(),
                "skipped": self.skipped, "problems": self.problems}


@dataclass(frozen=True)
class _Snapshot:
    """One read of nodes and jobs, shared by the phases (``LiveState.from_backend`` reads
    this instead of asking Slurm again)."""

    node_list: Sequence[NodeInfo]
    job_list: Sequence[JobInfo]

    def nodes(self) -> Sequence[NodeInfo]:
        return self.node_list

    def jobs(self) -> Sequence[JobInfo]:
        return self.job_list


def policy_of(site: Site) -> Rebalance:
    pol = site.sections.get("rebalance")
    return pol if isinstance(pol, Rebalance) else Rebalance()


def rebalance(backend: SlurmBackend, req: RebalanceRequest, site: Site, *,
              target: Target | None = None, samples: Any = None, now: float | None = None,
              output_probe: OutputProbe | None = None, env: Mapping[str, str] | None = None,
              clock: Callable[[], float] = time.monotonic,
              policy: Rebalance | None = None,
              lock: RunLock | None = None) -> RebalanceResult:
    """One rebalance run (see the module). ``target`` is where drift is read (None: no
    drift report). ``samples`` given (tests, the benchmark) skips the metrics store.
    ``lock``: the run lock, already held by the caller (the CLI takes it before loading
    anything, so a second run exits at once); without it an applying run takes its own.

    Raises:
        LockBusy: ``req.apply`` and another run holds the lock (nothing was read or done).
        ConfigError: the rebalance and stall locks are the same file.
    """
    pol = policy or policy_of(site)
    ctx = context_for(site)
    lock_path = lock.path if lock is not None else Path(req.lock_file or pol.lock_file)
    if lock_path == Path(ctx.stall.lock_file):
        raise ConfigError(f"[rebalance] lock_file and [stall] lock_file are both {lock_path}: "
                          "the requeue-stalled phase could never take its own lock")
    budget = float(req.budget_s if req.budget_s is not None else pol.time_budget_s)
    t0 = clock()
    deadline = t0 + budget
    # An applying run takes its own lock unless the caller holds it (LockBusy: it exits).
    with RunLock(lock_path) if req.apply and lock is None else contextlib.nullcontext():
        res = _run(backend, req, site, pol, target=target, samples=samples, now=now,
                   output_probe=output_probe, env=env, clock=clock, deadline=deadline,
                   budget=budget)
    res.seconds = clock() - t0
    return res


def _run(backend: SlurmBackend, req: RebalanceRequest, site: Site, pol: Rebalance, *,
         target: Target | None, samples: Any, now: float | None,
         output_probe: OutputProbe | None, env: Mapping[str, str] | None,
         clock: Callable[[], float], deadline: float, budget: float) -> RebalanceResult:
    from hetslurm.placement.model import ClusterModel
    from hetslurm.placement.state import LiveState

    now = time.time() if now is None else now
    wanted = {"health": pol.health, "requeue-stalled": pol.requeue_stalled,
              "weights": pol.weights, "relax": pol.relax, "drift": pol.drift}
    if req.phases is not None:
        wanted = {p: p in req.phases for p in PHASES}
    if target is None:
        wanted["drift"] = False
    res = RebalanceResult(applied=req.apply, budget_s=budget)
    ctx = context_for(site)
    log = ActionLog(req.action_log or pol.action_log or ctx.stall.action_log)
    log.check()

    def out_of_time(phase: str) -> bool:
        if clock() >= deadline:
            res.skipped.append({"phase": phase, "why": "time budget"})
            return True
        return False

    readers = [p for p in ("health", "requeue-stalled", "weights") if wanted[p]]
    if samples is None and len(readers) > 1:
        samples = _read_once(req, site, readers, now, res)
    if wanted["health"] and not out_of_time("health"):
        _health(backend, req, site, res, log, samples=samples, now=now, clock=clock)

    if wanted["requeue-stalled"] and not out_of_time("requeue-stalled"):
        sreq = StallRequest(apply=req.apply, store=req.store,
                            action_log=req.action_log or pol.action_log)
        try:
            res.stall = requeue_stalled(backend, sreq, site=site, samples=samples, now=now,
                                        output_probe=output_probe, env=env)
            res.problems.extend(f"requeue-stalled: {p}" for p in res.stall.problems)
        except LockBusy as exc:
            res.skipped.append({"phase": "requeue-stalled", "why": str(exc)})
        except ActError as exc:
            res.problems.append(f"requeue-stalled: {exc}")

    if wanted["weights"] and not out_of_time("weights"):
        from hetslurm.act.weights import rules_of, run_weights

        wsamples = samples
        if wsamples is None:
            from hetslurm.act.run import read_samples

            store = _store_of(req, site)
            wsamples, problems = read_samples(store, site, now - rules_of(site).window_s, now)
            res.problems.extend(f"weights: {p}" for p in problems)
        try:
            res.weights, res.weight_outcomes = run_weights(backend, site, wsamples, log,
                                                           apply=req.apply, now=now)
        except HetslurmError as exc:
            res.problems.append(f"weights: {exc}")

    if wanted["relax"] and not out_of_time("relax"):
        # One read of the cluster for the decision; each edit re-reads its own job.
        nodes = backend.nodes()
        jobs = backend.jobs()
        live = LiveState.from_backend(_Snapshot(nodes, jobs), now=now)
        model = ClusterModel.from_site(site).with_state(live)
        parts = {p.name: p.nodes for p in backend.partitions()}
        plan, unjudged = plan_relax(jobs, site, pol, model, partitions=parts, now=now,
                                    record_field=ctx.record_field,
                                    record_key=ctx.record_key, deadline=deadline,
                                    clock=clock)
        res.relax = plan
        res.skipped.extend({"phase": "relax", "job": j, "why": "time budget"}
                           for j in unjudged)
        if req.apply:
            outcomes, late = apply_relax(backend, plan.decisions, log, now=now,
                                         verify_timeout_s=pol.verify_timeout_s,
                                         deadline=deadline, clock=clock)
            res.relax_outcomes = outcomes
            res.skipped.extend({"phase": "relax", "job": j, "why": "time budget"}
                               for j in late)

    if wanted["drift"] and target is not None and not out_of_time("drift"):
        res.drift = drift(site, target)
        if res.drift.error:
            res.problems.append(f"drift: {res.drift.error}")

    if req.apply:
        log.append("run", {"t": now, "source": "rebalance",
                           "health_results": (dict(Counter(o.result
                                                           for o in res.health.outcomes))
                                              if res.health else None),
                           "seconds": round(clock() - (deadline - budget), 3),
                           "stall_decisions": len(res.stall.decisions) if res.stall else None,
                           "relax_decisions": len(res.relax.decisions) if res.relax else None,
                           "weight_changes": ([o.result for o in res.weight_outcomes]
                                              if res.weights else None),
                           "relax_results": dict(Counter(o.result for o in res.relax_outcomes)),
                           "drift_changes": (len(res.drift.changes) if res.drift else None),
                           "skipped": res.skipped})
    return res


def read_cache_of(req: RebalanceRequest, site: Site) -> str:
    """The read cache's path ("": none): the request's, else ``[rebalance] read_cache``,
    else ``rebalance-window.arrow`` beside the run lock."""
    if req.read_cache is not None:
        return req.read_cache
    pol = policy_of(site)
    if pol.read_cache is not None:
        return pol.read_cache
    lock = req.lock_file or pol.lock_file
    return str(Path(lock).parent / "rebalance-window.arrow")


def _store_of(req: RebalanceRequest, site: Site) -> str | None:
    """The metrics store: ``--store``, else the site's ``[collector] store``."""
    coll = site.sections.get("collector")
    return req.store or (coll.store if coll is not None else None)


def _read_once(req: RebalanceRequest, site: Site, readers: Sequence[str], now: float,
               res: RebalanceResult) -> Any:
    """One read of the metrics store for every phase that judges samples (each keeps to its
    own window and columns): the union of their columns over the longest window."""
    from hetslurm.act.run import STALL_COLUMNS, context_for, read_samples
    from hetslurm.act.weights import rules_of

    since, cols = now, set()
    if "health" in readers:
        from hetslurm.act.health import policy_for
        from hetslurm.metrics.samples import COLUMNS
        from hetslurm.policy.health import COLUMNS as HEALTH_COLUMNS

        with contextlib.suppress(ConfigError):  # the health phase says so itself
            since = min(since, now - policy_for(site).rules.window_s)
        cols |= {c for c in HEALTH_COLUMNS if c in COLUMNS}
    if "requeue-stalled" in readers:
        since = min(since, now - context_for(site).window_s)
        cols |= set(STALL_COLUMNS)
    if "weights" in readers:
        since = min(since, now - rules_of(site).window_s)
        cols |= {"time", "node", "slurm_index", "status", "utilization_pct"}
    store = _store_of(req, site)
    cache = read_cache_of(req, site)
    samples, problems = read_samples(store, site, since, now, columns=tuple(sorted(cols)),
                                     cache=cache or None)
    res.problems.extend(problems)
    return samples


def _health(backend: SlurmBackend, req: RebalanceRequest, site: Site, res: RebalanceResult,
            log: ActionLog, *, samples: Any, now: float, clock: Callable[[], float]) -> None:
    """The health phase; ``[health] mode = "off"`` skips it, listed."""
    from hetslurm.act.health import policy_for

    try:
        hpol = policy_for(site)
    except ConfigError as exc:
        res.problems.append(f"health: {exc}")
        return
    if hpol.mode == "off":
        res.skipped.append({"phase": "health", "why": "[health] mode = off"})
        return
    try:
        res.health = health_pass(backend, site, log, apply=req.apply, now=now,
                                 store=req.store, samples=samples, policy=hpol, clock=clock)
    except HetslurmError as exc:
        res.problems.append(f"health: {exc}")
        return
    res.problems.extend(f"health: {p}" for p in res.health.problems)
