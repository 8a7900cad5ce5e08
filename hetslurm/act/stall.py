"""Requeue stalled GPU jobs: judge by the stall rules, then act with guards.

Two steps, so a dry run is the first step alone:

1. :func:`plan` lists the running GPU jobs and judges each by the rules of
   :mod:`hetslurm.policy.stall` (idle evidence, one verdict per job, het jobs together); a
   requeue, hold or cancel must follow a logged warning by ``warning_grace_s``, so a first
   idle sighting only warns.
2. :func:`execute` (``--apply``) re-reads each job right before acting and skips it when
   anything changed (state, restarts, start time, exemptions), acts through the access
   layer (``requeue Incomplete``, ``requeuehold Incomplete``, ``scancel``), checks that Slurm
   shows the job pending/held with its restart count raised (or cancelled), and only then
   notifies. One job's failure is logged and never stops the others.

A heterogeneous job is requeued, held or cancelled through its leader only when every
component would get that same action on its own; a component is never acted on alone.

``on-idle=downgrade`` (the user's opt-in, from the hook's decision record) turns the last
rule into a downgrade: ``requeuehold Incomplete``, ``scontrol update`` of the request to the
next cheaper GPU model the site allows (:func:`~hetslurm.policy.stall.downgrade_for`; never
a node list), release, and a check that Slurm shows the job pending with the new request and
its restarts raised.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hetslurm.act import notify as notifier
from hetslurm.act.log import ActionLog
from hetslurm.errors import BackendError, HetslurmError
from hetslurm.policy.stall import (
    THROUGH_LEADER,
    Context,
    Downgrade,
    Evidence,
    OutputProbe,
    gate,
    gres_text,
    het_verdicts,
    idle_evidence,
    job_gpus,
    start_epoch,
    verdict,
)
from hetslurm.slurm.backend import JobInfo, NotFoundError, SlurmBackend
from hetslurm.slurm.units import parse_gres

#: Rules whose jobs are not idle (or not judged): summarised per run, not logged one by one.
QUIET_RULES = ("in-grace", "not-idle")


@dataclass(frozen=True)
class Component:
    """One component of a heterogeneous job as judged, re-checked before acting on it."""

    job: str
    job_id: int
    name: str
    restarts: int | None
    start: float | None
    evidence: Evidence | None = None


@dataclass(frozen=True)
class Decision:
    """One job judged: the rule that fired and the action it leads to.

    ``action`` is what this run does (``none``, ``notify``, ``warn``, ``wait``, or one of
    :data:`~hetslurm.policy.stall.CHANGING`); ``planned`` is what the rule asks for once warned.
    """

    job: str
    job_id: int
    name: str
    user: str | None
    account: str | None
    partition: str | None
    qos: str | None
    gpus: int
    gpu_model: str | None
    state: str
    #: None: Slurm did not report it (such a job is never requeued, see ``restarts-unknown``).
    restarts: int | None
    start: float | None
    rule: str
    planned: str
    action: str
    reason: str
    on_idle: str | None = None
    output_mode: str | None = None
    evidence: Evidence | None = None
    #: The new request when ``planned`` is ``downgrade``.
    downgrade: Downgrade | None = None
    #: The id Slurm is told to act on when it is not ``job`` (a het job's leader).
    target: str | None = None
    #: Every component of a het job acted on through its leader (re-checked, verified).
    components: tuple[Component, ...] = ()

    def row(self) -> dict[str, Any]:
        ev = self.evidence
        return {
            "job": self.job, "user": self.user, "gpus": self.gpus,
            "util_mean_pct": None if ev is None or ev.mean_util_pct is None
            else round(ev.mean_util_pct, 1),
            "util_max_pct": None if ev is None or ev.max_util_pct is None
            else round(ev.max_util_pct, 1),
            "known": None if ev is None else f"{ev.known_samples}/{ev.samples}",
            "rule": self.rule, "action": self.action, "planned": self.planned,
            "change": self.change(),
        }

    def change(self) -> str | None:
        """What a changing action would do beyond its name (shown in the dry run)."""
        if self.downgrade is not None:
            return self.downgrade.describe()
        if self.components:
            return (f"{self.planned} het job {self.target} ({len(self.components)} "
                    "components) through its leader")
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """What happened to one decision under ``--apply``."""

    job: str
    action: str
    result: str  # done, skipped, failed, not-requeued, warned, notified, logged
    detail: str = ""
    notified: bool | None = None


@dataclass
class RunResult:
    decisions: list[Decision]
    outcomes: list[Outcome] = field(default_factory=list)
    applied: bool = False
    problems: list[str] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        results = {o.job: o.result for o in self.outcomes}
        rows = [d.row() for d in self.decisions]
        if self.applied:
            for d, row in zip(self.decisions, rows, strict=True):
                row["result"] = results.get(d.job, "logged")
        return rows


def _warnings(log: ActionLog | None, now: float) -> dict[tuple[int, int | None], float]:
    """Latest warning time (the run's clock) per (job id, restarts); the log's reader has
    skipped warnings dated after ``now``, which would otherwise mask an earlier one.

    A warning logged without a restart count names no run, so it never matures."""
    out: dict[tuple[int, int | None], float] = {}
    if log is None:
        return out
    for e in log.entries("warning", now=now):
        try:
            k = (int(e["job_id"]), int(e["restarts"]))
            out[k] = max(out.get(k, 0.0), float(e["t"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def plan(backend: SlurmBackend, samples: Any, ctx: Context, *, now: float | None = None,
         log: ActionLog | None = None, output_probe: OutputProbe | None = None,
         jobs: Iterable[JobInfo] | None = None) -> list[Decision]:
    """Judge every running job that holds GPUs; changes nothing anywhere."""
    now = time.time() if now is None else now
    listed = list(backend.jobs() if jobs is None else jobs)
    running = [j for j in listed if j.state == "RUNNING" and job_gpus(j)[0] > 0]
    evidence = idle_evidence(running, samples, ctx.usage, window_s=ctx.window_s, now=now,
                             max_interval_s=ctx.max_interval_s)
    warned = _warnings(log, now)
    own = {j.job_id: verdict(j, evidence.get(j.job_id), ctx, now, output_probe)
           for j in running}
    het: dict[int, list[JobInfo]] = {}
    for j in listed:
        if j.het_job_id:
            het.setdefault(j.het_job_id, []).append(j)
    for het_id in {j.het_job_id for j in running if j.het_job_id}:
        own.update(het_verdicts(het[het_id], own, ctx))
    out = []
    for j in sorted(running, key=lambda j: j.job_id):
        ev = evidence.get(j.job_id)
        x = own[j.job_id]
        action = gate(x.planned, warned.get((j.job_id, j.restarts)), ctx, now)
        gpus, model = job_gpus(j)
        target: str | None = None
        components: tuple[Component, ...] = ()
        if x.rule == "het-job" and x.planned in THROUGH_LEADER and j.het_job_id:
            target = str(j.het_job_id)
            components = tuple(
                Component(m.display_id, m.job_id, m.name, m.restarts, start_epoch(m),
                          evidence.get(m.job_id))
                for m in sorted(het[j.het_job_id], key=lambda m: m.het_job_offset or 0))
        out.append(Decision(
            job=j.display_id, job_id=j.job_id, name=j.name, user=j.user, account=j.account,
            partition=j.partition, qos=j.qos, gpus=gpus, gpu_model=model, state=j.state,
            restarts=j.restarts, start=start_epoch(j), rule=x.rule, planned=x.planned,
            action=action, reason=x.reason, on_idle=x.on_idle, output_mode=x.output_mode,
            evidence=ev, downgrade=x.downgrade, target=target, components=components))
    return out


# ----------------------------------------------------------------------------- acting
def _changed(before: Decision | Component, now_job: JobInfo) -> str | None:
    if now_job.name != before.name:
        # The listing (JSON) and the single read (``scontrol -o``) disagree: a name holding
        # ``Key=value`` text or a newline can forge fields of a one-line record, so the
        # fresh read is not trusted and the job is left alone.
        return "the job's record reads differently now (name); not trusted"
    if now_job.state != "RUNNING":
        return f"now {now_job.state}"
    if now_job.restarts != before.restarts:
        return f"restarts changed {before.restarts} -> {now_job.restarts} (requeued meanwhile)"
    if start_epoch(now_job) != before.start:
        return "started again meanwhile"
    return None


_HELD_STATES = ("REQUEUE_HOLD",)
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
          "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def _held(j: JobInfo) -> bool:
    return "held" in (j.reason or "").lower() or j.state in _HELD_STATES


def _wait_for(backend: SlurmBackend, ref: str, restarts_before: int | None, want: str,
              timeout: float, sleep: Callable[[float], None]) -> tuple[bool, str]:
    """Read Slurm back until ``ref`` shows ``want`` or ``timeout`` passes.

    ``cancel``: CANCELLED. ``requeue``: PENDING with restarts raised. ``requeue_hold``:
    pending and held with restarts raised. ``released``: restarts raised, not held, pending
    or started again.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            j = backend.job(ref)
        except NotFoundError:
            return False, "job vanished after the action"
        except BackendError as exc:
            # slurmctld restarting right after the action: it keeps its state, so read
            # again until it answers or the timeout passes (never act a second time).
            seen = f"Slurm did not answer: {exc}"
        else:
            seen = f"state {j.state}, restarts {j.restarts}, reason {j.reason}"
            # An unknown count (before or now) never shows a requeue happened.
            raised = (j.restarts is not None and restarts_before is not None
                      and j.restarts > restarts_before)
            if want == "cancel":
                if j.state == "CANCELLED":
                    return True, seen
            else:
                if raised and want == "requeue" and j.state == "PENDING":
                    return True, seen
                if raised and want == "requeue_hold" and (
                        (j.state == "PENDING" and _held(j)) or j.state in _HELD_STATES):
                    return True, seen
                if raised and want == "released" and not _held(j) and j.state in (
                        "PENDING", "CONFIGURING", "RUNNING"):
                    return True, seen
                if j.state in _ENDED:
                    return False, seen
        if time.monotonic() >= deadline:
            return False, seen
        sleep(0.5)


def _verify(backend: SlurmBackend, d: Decision, action: str, timeout: float,
            sleep: Callable[[float], None]) -> tuple[bool, str]:
    """Slurm shows the action done: for a het job on every component, within ``timeout``."""
    if not d.components:
        return _wait_for(backend, d.target or d.job, d.restarts, action, timeout, sleep)
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    for c in d.components:
        ok, what = _wait_for(backend, c.job, c.restarts, action,
                             max(0.0, deadline - time.monotonic()), sleep)
        seen.append(f"{c.job}: {what}")
        if not ok:
            return False, "; ".join(seen)
    return True, "; ".join(seen)


def execute(backend: SlurmBackend, decisions: Sequence[Decision], ctx: Context,
            log: ActionLog, *, now: float | None = None,
            output_probe: OutputProbe | None = None,
            env: Mapping[str, str] | None = None,
            sleep: Callable[[float], None] = time.sleep) -> list[Outcome]:
    """Log every decision and carry out the non-quiet ones; never raises for one job."""
    now = time.time() if now is None else now
    st = ctx.stall
    notified: set[tuple[int, int | None, str]] = set()
    for e in log.entries("notify", now=now):
        try:
            if e.get("ok"):
                r = e["restarts"]  # null: Slurm did not report the count then
                notified.add((int(e["job_id"]), None if r is None else int(r), str(e["rule"])))
        except (KeyError, TypeError, ValueError):
            continue  # a malformed entry is not evidence of a notice
    outcomes: list[Outcome] = []
    quiet: dict[str, int] = {}

    def tell(d: Decision, action: str, extra: Mapping[str, Any] | None = None) -> bool:
        key = (d.job_id, d.restarts, d.rule)
        if action == "notify" and key in notified:
            return False  # one notice per job, run and rule, not one per cron tick
        payload = {"job": d.job, "job_id": d.job_id, "user": d.user, "action": action,
                   "rule": d.rule, "reason": d.reason, "name": d.name, **(extra or {})}
        ok, detail = notifier.send(st.notify_command, payload, timeout=st.notify_timeout_s,
                                   env=env)
        log.append("notify", {"t": now, "job": d.job, "job_id": d.job_id,
                              "restarts": d.restarts, "rule": d.rule, "action": action,
                              "ok": ok, "detail": detail})
        if ok:
            notified.add(key)
        return ok

    for d in decisions:
        if d.rule in QUIET_RULES:
            quiet[d.rule] = quiet.get(d.rule, 0) + 1
            continue
        try:
            log.append("decision", {"t": now, **d.to_dict()})
            if d.action in ("none", "wait"):
                outcomes.append(Outcome(d.job, d.action, "logged", d.reason))
            elif d.action == "notify":
                sent = tell(d, "notify")
                outcomes.append(Outcome(d.job, "notify", "notified" if sent else "logged",
                                        d.reason, sent))
            elif d.action == "warn":
                log.append("warning", {"t": now, "job": d.job, "job_id": d.job_id,
                                       "restarts": d.restarts, "rule": d.rule,
                                       "planned": d.planned,
                                       "not_before": now + st.warning_grace_s})
                sent = tell(d, "warn", {"planned": d.planned,
                                        "not_before": now + st.warning_grace_s})
                outcomes.append(Outcome(d.job, "warn", "warned", d.planned, sent))
            else:
                outcomes.append(_act(backend, d, ctx, log, now, output_probe, sleep, tell))
        except Exception as exc:  # one job's failure never stops the others
            detail = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(HetslurmError):
                log.append("action", {"t": now, "job": d.job, "job_id": d.job_id,
                                      "action": d.action, "result": "failed",
                                      "detail": detail})
            outcomes.append(Outcome(d.job, d.action, "failed", detail))
    log.append("run", {"t": now, "decisions": len(decisions), "quiet": quiet,
                       "results": dict(Counter(o.result for o in outcomes))})
    return outcomes


def _recheck(backend: SlurmBackend, d: Decision, ctx: Context, now: float,
             output_probe: OutputProbe | None) -> str | None:
    """Why the decision no longer holds (``None``: act). Reads Slurm again: the job (every
    component of a het job) must be unchanged and judged the same way."""
    try:
        fresh = backend.job(d.job)
    except NotFoundError:
        return "the job is gone"
    why = _changed(d, fresh)
    if why is not None:
        return why
    if d.components:
        for c in d.components:
            try:
                comp = backend.job(c.job)
            except NotFoundError:
                return f"component {c.job} is gone"
            why = _changed(c, comp)
            if why is None:
                own = verdict(comp, c.evidence, ctx, now, output_probe)
                if own.planned != d.planned:
                    why = f"the rule is now {own.rule} -> {own.planned}"
            if why is not None:
                return f"component {c.job}: {why}"
        return None
    x = verdict(fresh, d.evidence, ctx, now, output_probe)
    if (x.rule, x.planned) != (d.rule, d.planned):
        return f"the rule is now {x.rule} -> {x.planned}"
    if x.downgrade != d.downgrade:
        return "the downgrade is now " + (x.downgrade.describe() if x.downgrade else "none")
    return None


def _act(backend: SlurmBackend, d: Decision, ctx: Context, log: ActionLog, now: float,
         output_probe: OutputProbe | None, sleep: Callable[[float], None],
         tell: Callable[[Decision, str, Mapping[str, Any] | None], bool]) -> Outcome:
    def record(result: str, detail: str, **more: Any) -> Outcome:
        """Log one step's result; the outcome it makes when it is the last step."""
        log.append("action", {"t": now, "job": d.job, "job_id": d.job_id,
                              "restarts_before": d.restarts, "action": d.action,
                              "result": result, "detail": detail, **more})
        return Outcome(d.job, d.action, result, detail)

    # Re-read and re-judge right before acting: the job may have ended, been requeued by
    # Slurm's own preemption, or changed its flags since the decision.
    why = _recheck(backend, d, ctx, now, output_probe)
    if why is not None:
        return record("skipped", why)
    if d.action == "downgrade":
        return _downgrade(backend, d, ctx, record, sleep, tell)
    ref = d.target or d.job
    more: dict[str, Any] = {"target": ref} if d.target else {}
    if d.action == "requeue":
        backend.requeue(ref, incomplete=True)
    elif d.action == "requeue_hold":
        backend.requeue_hold(ref, incomplete=True)
    else:
        backend.cancel(ref)
    ok, seen = _verify(backend, d, d.action, ctx.stall.verify_timeout_s, sleep)
    if not ok:
        return record("not-requeued" if d.action != "cancel" else "not-cancelled", seen, **more)
    out = record("done", seen, **more)
    out.notified = tell(d, d.action, {"verified": seen, **more})
    return out


def _request_shows(j: JobInfo, dg: Downgrade) -> str | None:
    """``None`` when ``j``'s request is the downgraded one, else what it shows."""
    gres = gres_text(j.tres_per_node) if j.tres_per_node else None
    if dg.gres is not None and gres != dg.gres:
        return f"Gres={gres}"
    if dg.features is not None and (j.features or "") != dg.features:
        return f"Features={j.features}"
    return None


def _downgrade(backend: SlurmBackend, d: Decision, ctx: Context,
               record: Callable[..., Outcome], sleep: Callable[[float], None],
               tell: Callable[[Decision, str, Mapping[str, Any] | None], bool]) -> Outcome:
    """requeuehold Incomplete, update the request, release; each step checked and logged.

    If Slurm refuses the update, the job is released with its own request (held is worse
    for its user than requeued) and the result is ``not-downgraded``.
    """
    dg = d.downgrade
    assert dg is not None
    timeout = ctx.stall.verify_timeout_s
    facts = {"downgrade": asdict(dg)}
    backend.requeue_hold(d.job, incomplete=True)
    ok, seen = _wait_for(backend, d.job, d.restarts, "requeue_hold", timeout, sleep)
    held = record("done" if ok else "not-requeued", seen, step="requeue_hold", **facts)
    if not ok:
        return held
    update_error: str | None = None
    try:
        backend.update_job(d.job,
                           tres_per_node=parse_gres(dg.gres) if dg.gres is not None else None,
                           features=dg.features)
        update_error = _request_shows(backend.job(d.job), dg)
        if update_error is not None:
            update_error = f"Slurm shows {update_error} after the update"
    except HetslurmError as exc:
        update_error = f"{type(exc).__name__}: {exc}"
    record("failed" if update_error else "done", update_error or dg.describe(),
           step="update", **facts)
    try:
        backend.release(d.job)
    except HetslurmError as exc:
        return record("failed", f"held and not released: {type(exc).__name__}: {exc}",
                      step="release", **facts)
    ok, seen = _wait_for(backend, d.job, d.restarts, "released", timeout, sleep)
    if ok and update_error is None:
        try:
            shown = _request_shows(backend.job(d.job), dg)
        except NotFoundError:
            shown = "the job is gone"
        if shown is not None:
            ok, seen = False, f"{seen}; request {shown}"
    if update_error is not None:
        detail = f"{update_error}; released with its own request: {seen}"
        out = record("not-downgraded" if ok else "not-requeued", detail, step="release",
                     **facts)
        if ok:
            out.notified = tell(d, "requeue", {"verified": seen, "not_downgraded": update_error})
        return out
    out = record("done" if ok else "not-requeued", seen, step="release", **facts)
    if ok:
        out.detail = f"{dg.describe()}: {seen}"
        out.notified = tell(d, "downgrade", {"verified": seen, **facts})
    return out
