"""Requeue stalled GPU jobs: decide from ``[stall]`` and ``[usage]``, then act with guards.

Two steps, so a dry run is the first step alone:

1. :func:`plan` judges every running GPU job. "Idle" is the audit's own rule
   (:func:`hetslurm.audit.tables.idle_jobs` over the last ``window_s``): every sample of
   every GPU known and below the thresholds, with enough coverage. Unknown is never idle.
   Then the rules below pick one action per job; a requeue, hold or cancel must follow a
   logged warning by ``warning_grace_s``, so a first idle sighting only warns.
2. :func:`execute` (``--apply``) re-reads each job right before acting and skips it when
   anything changed (state, restarts, start time, exemptions), acts through the access
   layer (``requeue Incomplete``, ``requeuehold Incomplete``, ``scancel``), checks that Slurm
   shows the job pending/held with its restart count raised (or cancelled), and only then
   notifies. One job's failure is logged and never stops the others.

Rules, first match wins (docs/act.md): ``in-grace``, ``not-idle``, ``unknown-metrics``,
``exempt-user``/``-account``/``-partition``/``-qos``, ``on-idle-notify``,
``on-idle-downgrade``, ``het-job``, ``non-batch``, ``no-requeue``, ``cap-reached``,
``output-not-append``, ``idle``.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hetslurm.act import notify as notifier
from hetslurm.act.log import ActionLog
from hetslurm.act.output_mode import OutputProbe
from hetslurm.errors import HetslurmError
from hetslurm.site.schema import Stall, Usage
from hetslurm.slurm.backend import JobInfo, NotFoundError, SlurmBackend

#: Actions that change a job; each needs a matured warning first.
CHANGING = ("requeue", "requeue_hold", "cancel")
#: Rules whose jobs are not idle (or not judged): summarised per run, not logged one by one.
QUIET_RULES = ("in-grace", "not-idle")

_RECORD = re.compile(r"(?:^|\s)([a-z][a-z0-9_-]{0,31}):(\{[^{}]*\})")


@dataclass(frozen=True)
class Evidence:
    """What the samples of one job said over the window (``None``: no known sample)."""

    window_start: float
    window_end: float
    samples: int
    known_samples: int
    expected_samples: float
    mean_util_pct: float | None
    max_util_pct: float | None
    max_memory_mib: float | None
    idle: bool


@dataclass(frozen=True)
class Decision:
    """One job judged: the rule that fired and the action it leads to.

    ``action`` is what this run does (``none``, ``notify``, ``warn``, ``wait``, or one of
    :data:`CHANGING`); ``planned`` is what the rule asks for once warned.
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
    restarts: int
    start: float | None
    rule: str
    planned: str
    action: str
    reason: str
    on_idle: str | None = None
    output_mode: str | None = None
    evidence: Evidence | None = None

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
        }

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
        by_job = {o.job: o for o in self.outcomes}
        out = []
        for d in self.decisions:
            row = d.row()
            if self.applied:
                o = by_job.get(d.job)
                row["result"] = o.result if o else "logged"
            out.append(row)
        return out


# ----------------------------------------------------------------------------- evidence
def _epoch(job: JobInfo) -> float | None:
    return job.start_time.timestamp() if job.start_time is not None else None


def job_gpus(job: JobInfo) -> tuple[int, str | None]:
    """GPUs the job holds (all nodes) and the first model named."""
    n, model = 0, None
    for items in job.allocated_gres.values():
        for it in items:
            if it.name == "gpu":
                n += it.count
                model = model or it.type
    return n, model


def idle_evidence(jobs: Sequence[JobInfo], samples: Any, usage: Usage, *, window_s: int,
                  now: float) -> dict[int, Evidence]:
    """Per job id, the audit's idle verdict over ``[now - window_s, now)`` and its numbers."""
    import numpy as np
    import pandas as pd

    from hetslurm.audit.tables import idle_jobs, per_job, prepare_jobs, prepare_samples

    since = now - window_s
    w_usage = usage.model_copy(update={"idle_window_s": window_s})
    rows = []
    for j in jobs:
        gpus, model = job_gpus(j)
        rows.append({"job_id": j.job_id, "run": j.restarts, "gpus": gpus,
                     "start": _epoch(j), "end": np.nan, "user": j.user or "",
                     "account": j.account or "", "partition": j.partition or "",
                     "gpu_model": model or "", "nodes": ",".join(j.nodes)})
    frame = pd.DataFrame(rows, columns=["job_id", "run", "gpus", "start", "end", "user",
                                        "account", "partition", "gpu_model", "nodes"])
    frame = frame.astype({"job_id": "int64", "run": "int64", "gpus": "int64",
                          "start": "float64", "end": "float64"})
    jf = prepare_jobs(frame, since, now, now)
    need = {"time", "job_id", "utilization_pct", "memory_used_mib", "status", "interval_s"}
    if samples is None or len(samples) == 0 or not need <= set(samples.columns):
        s = None
    else:
        s = prepare_samples(samples.copy(), w_usage, since, now)
        s = s[s["held"]]
    idle_ids: set[int] = set()
    if s is not None and len(s) and len(jf):
        idle = idle_jobs(jf, s, per_job(s), w_usage)
        idle_ids = {int(x) for x in idle["job_id"].tolist()}
    out: dict[int, Evidence] = {}
    stats: dict[int, dict[str, Any]] = {}
    if s is not None and len(s):
        g = s.groupby(s["job_id"].astype("int64"))
        util = s["utilization_pct"].astype("float64").where(s["known"])
        stats_frame = pd.DataFrame({
            "n": g.size(), "known": g["known"].sum(),
            "mean": util.groupby(s["job_id"].astype("int64")).mean(),
            "max": util.groupby(s["job_id"].astype("int64")).max(),
            "mem": s["memory_used_mib"].astype("float64").groupby(
                s["job_id"].astype("int64")).max(),
            "interval": g["interval_s"].median(),
        })
        stats = {int(k): v for k, v in stats_frame.to_dict("index").items()}
    for j in jobs:
        gpus, _ = job_gpus(j)
        st = stats.get(j.job_id, {})

        def num(key: str, st: Mapping[str, Any] = st) -> float | None:
            v = st.get(key)
            return None if v is None or (isinstance(v, float) and v != v) else float(v)

        interval = num("interval")
        out[j.job_id] = Evidence(
            window_start=since, window_end=now, samples=int(st.get("n", 0)),
            known_samples=int(st.get("known", 0)),
            expected_samples=(window_s / interval * gpus) if interval else 0.0,
            mean_util_pct=num("mean"), max_util_pct=num("max"), max_memory_mib=num("mem"),
            idle=j.job_id in idle_ids)
    return out


# ----------------------------------------------------------------------------- the rules
def decision_record(job: JobInfo, field_name: str = "admin_comment",
                    key: str = "hetslurm") -> dict[str, Any]:
    """The hook's ``<key>:{...}`` segment of the job (docs/hook.md), or ``{}``."""
    if field_name == "none":
        return {}
    text = job.comment if field_name == "comment" else job.admin_comment
    for m in _RECORD.finditer(text or ""):
        if m.group(1) == key:
            try:
                rec = json.loads(m.group(2))
            except json.JSONDecodeError:
                return {}
            return rec if isinstance(rec, dict) else {}
    return {}


@dataclass(frozen=True)
class Context:
    """What the rules need besides the job: policy, thresholds, the hook's record field."""

    stall: Stall
    usage: Usage
    record_field: str = "admin_comment"
    record_key: str = "hetslurm"

    @property
    def window_s(self) -> int:
        return self.stall.window_s or self.usage.idle_window_s


def judge(job: JobInfo, ev: Evidence | None, ctx: Context, now: float,
          output_probe: OutputProbe | None) -> tuple[str, str, str, str | None, str | None]:
    """``(rule, planned action, reason, on_idle, output_mode)`` for one running GPU job."""
    st = ctx.stall
    start = _epoch(job)
    age = now - start if start is not None else 0.0
    need = max(st.grace_after_start_s, ctx.window_s)
    rec = decision_record(job, ctx.record_field, ctx.record_key)
    on_idle = rec.get("on_idle") if isinstance(rec.get("on_idle"), str) else None
    if start is None or age < need:
        return "in-grace", "none", f"running {age:.0f}s < {need}s", on_idle, None
    if ev is None or not ev.idle:
        if ev is not None and ev.samples and ev.known_samples < ev.samples and (
                ev.max_util_pct is None or ev.max_util_pct < ctx.usage.idle_threshold_pct):
            return ("unknown-metrics", "none", f"{ev.samples - ev.known_samples} unknown "
                    "sample(s) in the window: unknown is never idle", on_idle, None)
        if ev is None or ev.samples == 0:
            return "unknown-metrics", "none", "no samples in the window", on_idle, None
        if ev.max_util_pct is not None and ev.max_util_pct < ctx.usage.idle_threshold_pct:
            return ("unknown-metrics", "none", f"{ev.known_samples} known sample(s) of "
                    f"{ev.expected_samples:.0f} expected: coverage too low", on_idle, None)
        return "not-idle", "none", "busy in the window", on_idle, None
    for rule, value, listed in (("exempt-user", job.user, st.exempt_users),
                                ("exempt-account", job.account, st.exempt_accounts),
                                ("exempt-partition", job.partition, st.exempt_partitions),
                                ("exempt-qos", job.qos, st.exempt_qos)):
        if value is not None and value in listed:
            return rule, "none", f"{value} is exempt", on_idle, None
    if on_idle == "notify":
        return "on-idle-notify", "notify", "the job asked on-idle=notify", on_idle, None
    if on_idle == "downgrade":
        return ("on-idle-downgrade", "notify", "on-idle=downgrade is not implemented yet: "
                "notify only", on_idle, None)
    if job.het_job_id:
        return "het-job", "notify", "heterogeneous jobs are not requeued yet", on_idle, None
    if not job.batch:
        return ("non-batch", st.non_batch_action, "interactive job: Slurm cannot requeue it",
                on_idle, None)
    if not job.requeue or "no-requeue" in str(rec.get("req", "")).split():
        return "no-requeue", "none", "the job refuses requeue (--no-requeue or #HET "\
            "no-requeue)", on_idle, None
    if job.restarts >= st.max_requeues:
        return ("cap-reached", st.over_cap_action, f"restarts {job.restarts} >= cap "
                f"{st.max_requeues}", on_idle, None)
    mode = output_probe(job.display_id) if output_probe is not None else "unknown"
    if (mode not in ("append", "discarded") and st.action != "notify"
            and st.no_append_action == "notify"):
        return ("output-not-append", "notify", f"output mode {mode}: a requeue would "
                "truncate it", on_idle, mode)
    return "idle", st.action, "idle over the window", on_idle, mode


def _warnings(log: ActionLog | None) -> dict[tuple[int, int], float]:
    """Latest warning time (the run's clock) per (job id, restarts)."""
    out: dict[tuple[int, int], float] = {}
    if log is None:
        return out
    for e in log.entries("warning"):
        try:
            k = (int(e["job_id"]), int(e["restarts"]))
            out[k] = max(out.get(k, 0.0), float(e["t"]))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def gate(planned: str, warned_at: float | None, ctx: Context, now: float) -> str:
    """A changing action waits for a warning ``warning_grace_s`` old (from an earlier run)."""
    if planned not in CHANGING:
        return planned
    grace = ctx.stall.warning_grace_s
    # A warning stays valid for grace + window: one about an idle spell long over does not.
    if warned_at is None or warned_at >= now or now - warned_at > grace + ctx.window_s:
        return "warn"
    if now - warned_at < grace:
        return "wait"
    return planned


def plan(backend: SlurmBackend, samples: Any, ctx: Context, *, now: float | None = None,
         log: ActionLog | None = None, output_probe: OutputProbe | None = None,
         jobs: Iterable[JobInfo] | None = None) -> list[Decision]:
    """Judge every running job that holds GPUs; changes nothing anywhere."""
    now = time.time() if now is None else now
    running = [j for j in (backend.jobs() if jobs is None else jobs)
               if j.state == "RUNNING" and job_gpus(j)[0] > 0]
    evidence = idle_evidence(running, samples, ctx.usage, window_s=ctx.window_s, now=now)
    warned = _warnings(log)
    out = []
    for j in sorted(running, key=lambda j: j.job_id):
        ev = evidence.get(j.job_id)
        rule, planned, reason, on_idle, mode = judge(j, ev, ctx, now, output_probe)
        action = gate(planned, warned.get((j.job_id, j.restarts)), ctx, now)
        gpus, model = job_gpus(j)
        out.append(Decision(
            job=j.display_id, job_id=j.job_id, name=j.name, user=j.user, account=j.account,
            partition=j.partition, qos=j.qos, gpus=gpus, gpu_model=model, state=j.state,
            restarts=j.restarts, start=_epoch(j), rule=rule, planned=planned, action=action,
            reason=reason, on_idle=on_idle, output_mode=mode, evidence=ev))
    return out


# ----------------------------------------------------------------------------- acting
def _changed(before: Decision, now_job: JobInfo) -> str | None:
    if now_job.name != before.name:
        # The listing (JSON) and the single read (``scontrol -o``) disagree: a name holding
        # ``Key=value`` text or a newline can forge fields of a one-line record, so the
        # fresh read is not trusted and the job is left alone.
        return "the job's record reads differently now (name); not trusted"
    if now_job.state != "RUNNING":
        return f"now {now_job.state}"
    if now_job.restarts != before.restarts:
        return f"restarts changed {before.restarts} -> {now_job.restarts} (requeued meanwhile)"
    if _epoch(now_job) != before.start:
        return "started again meanwhile"
    return None


def _verify(backend: SlurmBackend, d: Decision, action: str, timeout: float,
            sleep: Callable[[float], None]) -> tuple[bool, str]:
    deadline = time.monotonic() + timeout
    seen = "?"
    while True:
        try:
            j = backend.job(d.job)
        except NotFoundError:
            return False, "job vanished after the action"
        seen = f"state {j.state}, restarts {j.restarts}, reason {j.reason}"
        if action == "cancel":
            if j.state == "CANCELLED":
                return True, seen
        else:
            raised = j.restarts > d.restarts
            held = "held" in (j.reason or "").lower()
            if raised and action == "requeue" and j.state == "PENDING":
                return True, seen
            if raised and action == "requeue_hold" and (
                    (j.state == "PENDING" and held) or j.state == "REQUEUE_HOLD"):
                return True, seen
            if j.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                return False, seen
        if time.monotonic() >= deadline:
            return False, seen
        sleep(0.5)


def execute(backend: SlurmBackend, decisions: Sequence[Decision], ctx: Context,
            log: ActionLog, *, now: float | None = None,
            output_probe: OutputProbe | None = None,
            env: Mapping[str, str] | None = None,
            sleep: Callable[[float], None] = time.sleep) -> list[Outcome]:
    """Log every decision and carry out the non-quiet ones; never raises for one job."""
    now = time.time() if now is None else now
    st = ctx.stall
    notified: set[tuple[int, int, str]] = set()
    for e in log.entries("notify"):
        try:
            if e.get("ok"):
                notified.add((int(e["job_id"]), int(e["restarts"]), str(e["rule"])))
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
                       "results": _count(o.result for o in outcomes)})
    return outcomes


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _act(backend: SlurmBackend, d: Decision, ctx: Context, log: ActionLog, now: float,
         output_probe: OutputProbe | None, sleep: Callable[[float], None],
         tell: Callable[[Decision, str, Mapping[str, Any] | None], bool]) -> Outcome:
    def record(result: str, detail: str, **more: Any) -> None:
        log.append("action", {"t": now, "job": d.job, "job_id": d.job_id,
                              "restarts_before": d.restarts, "action": d.action,
                              "result": result, "detail": detail, **more})

    # Re-read and re-judge right before acting: the job may have ended, been requeued by
    # Slurm's own preemption, or changed its flags since the decision.
    try:
        fresh = backend.job(d.job)
    except NotFoundError:
        record("skipped", "the job is gone")
        return Outcome(d.job, d.action, "skipped", "the job is gone")
    why = _changed(d, fresh)
    if why is None:
        rule, planned, _, _, _ = judge(fresh, d.evidence, ctx, now, output_probe)
        if (rule, planned) != (d.rule, d.planned):
            why = f"the rule is now {rule} -> {planned}"
    if why is not None:
        record("skipped", why)
        return Outcome(d.job, d.action, "skipped", why)
    if d.action == "requeue":
        backend.requeue(d.job, incomplete=True)
    elif d.action == "requeue_hold":
        backend.requeue_hold(d.job, incomplete=True)
    else:
        backend.cancel(d.job)
    ok, seen = _verify(backend, d, d.action, ctx.stall.verify_timeout_s, sleep)
    if not ok:
        result = "not-requeued" if d.action != "cancel" else "not-cancelled"
        record(result, seen)
        return Outcome(d.job, d.action, result, seen)
    record("done", seen)
    sent = tell(d, d.action, {"verified": seen})
    return Outcome(d.job, d.action, "done", seen, sent)
