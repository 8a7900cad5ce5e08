"""Requeue stalled GPU jobs: decide from ``[stall]`` and ``[usage]``, then act with guards.

Two steps, so a dry run is the first step alone:

1. :func:`plan` judges every running GPU job. "Idle" is the audit's own rule
   (:func:`hetslurm.policy.idle.judge_windows` over the last ``window_s``): every sample of
   every GPU known and below the thresholds, with enough coverage. Unknown is never idle.
   Then the rules below pick one action per job; a requeue, hold or cancel must follow a
   logged warning by ``warning_grace_s``, so a first idle sighting only warns.
2. :func:`execute` (``--apply``) re-reads each job right before acting and skips it when
   anything changed (state, restarts, start time, exemptions), acts through the access
   layer (``requeue Incomplete``, ``requeuehold Incomplete``, ``scancel``), checks that Slurm
   shows the job pending/held with its restart count raised (or cancelled), and only then
   notifies. One job's failure is logged and never stops the others.

Rules, first match wins (docs/act.md): ``in-grace``, ``not-idle``, ``unknown-metrics``,
``exempt-user``/``-account``/``-partition``/``-qos``, ``on-idle-notify``, ``non-batch``,
``no-requeue``, ``cap-reached``, ``output-not-append``, ``on-idle-downgrade``, ``idle``.
A heterogeneous job's components are judged one by one and then together (``het-job``):
the job is requeued, held or cancelled through its leader only when every component would
get that same action on its own; a component is never acted on alone.

``on-idle=downgrade`` (the user's opt-in, from the hook's decision record) turns the last
rule into a downgrade: ``requeuehold Incomplete``, ``scontrol update`` of the request to the
next cheaper GPU model the site allows (:func:`downgrade_for`; never a node list), release,
and a check that Slurm shows the job pending with the new request and its restarts raised.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hetslurm.act import notify as notifier
from hetslurm.act.log import ActionLog
from hetslurm.act.output_mode import OutputProbe
from hetslurm.errors import BackendError, HetslurmError
from hetslurm.request.record import DecisionRecord, find_record
from hetslurm.site.schema import Collector, Stall, Usage
from hetslurm.slurm.backend import JobInfo, NotFoundError, SlurmBackend
from hetslurm.slurm.units import GresItem, parse_gres

#: Actions that change a job; each needs a matured warning first.
CHANGING = ("requeue", "requeue_hold", "cancel", "downgrade")
#: Changing actions Slurm applies to a whole het job when given its leader's id (a het job
#: is never downgraded).
THROUGH_LEADER = ("requeue", "requeue_hold", "cancel")
#: Rules whose jobs are not idle (or not judged): summarised per run, not logged one by one.
QUIET_RULES = ("in-grace", "not-idle")



@dataclass(frozen=True)
class Evidence:
    """What the samples of one job said over the window (``None``: no known sample).

    ``expected_samples`` is what the allocation gives at the collector's configured interval
    (``[collector] interval_s``); ``gpus`` the allocated GPUs, ``covered_gpus`` those with
    samples for at least ``[usage] min_coverage`` of the window (idle needs all of them),
    counted only when every sample was known and below the thresholds (else 0: the window
    was decided without it).
    """

    window_start: float
    window_end: float
    samples: int
    known_samples: int
    expected_samples: float
    mean_util_pct: float | None
    max_util_pct: float | None
    max_memory_mib: float | None
    idle: bool
    gpus: int = 0
    covered_gpus: int = 0


@dataclass(frozen=True)
class Downgrade:
    """The relaxed request of an ``on-idle=downgrade`` job: the next cheaper GPU model.

    ``gres`` and ``features`` are the new ``Gres=``/``Features=`` values (``None``: that
    field stays as it is); ``old_gres``/``old_features`` what the job had.
    """

    from_model: str
    to_model: str
    gres: str | None = None
    features: str | None = None
    old_gres: str | None = None
    old_features: str | None = None

    def describe(self) -> str:
        what = [f"{k}={v}" for k, v in (("Gres", self.gres), ("Features", self.features))
                if v is not None]
        return f"downgrade {self.from_model} -> {self.to_model} ({', '.join(what)})"


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


def allocated_devices(job: JobInfo) -> list[tuple[str, int]] | None:
    """The (node, Slurm GRES index) of every GPU the job holds; None when Slurm did not
    name the indices of some of them (then only their number can be checked)."""
    out: list[tuple[str, int]] = []
    for node, items in job.allocated_gres.items():
        for it in items:
            if it.name != "gpu":
                continue
            if it.indices is None or len(it.indices) != it.count:
                return None
            out.extend((node, i) for i in it.indices)
    return out


def idle_evidence(jobs: Sequence[JobInfo], samples: Any, usage: Usage, *, window_s: int,
                  now: float, max_interval_s: float | None = None) -> dict[int, Evidence]:
    """Per job id, the audit's idle verdict over ``[now - window_s, now)`` and its numbers.

    The verdict is :func:`hetslurm.policy.idle.judge_windows` over each job's allocated
    devices (from Slurm): every one must be reported for ``min_coverage`` of the window.
    ``max_interval_s``: the most one sample may stand for (``[collector] interval_s``).
    """
    import numpy as np
    import pandas as pd

    from hetslurm.policy.idle import (
        interval_cap,
        judge_windows,
        prepare_jobs,
        prepare_samples,
    )

    cap = interval_cap(None) if max_interval_s is None else max_interval_s

    since = now - window_s
    w_usage = usage.model_copy(update={"idle_window_s": window_s})
    rows = []
    for j in jobs:
        gpus, model = job_gpus(j)
        # One row per job here, so "run" (which run is the last) only needs to be a number.
        rows.append({"job_id": j.job_id, "run": j.restarts or 0, "gpus": gpus,
                     "start": _epoch(j), "end": np.nan, "user": j.user or "",
                     "account": j.account or "", "partition": j.partition or "",
                     "gpu_model": model or "", "nodes": ",".join(j.nodes)})
    frame = pd.DataFrame(rows, columns=["job_id", "run", "gpus", "start", "end", "user",
                                        "account", "partition", "gpu_model", "nodes"])
    frame = frame.astype({"job_id": "int64", "run": "int64", "gpus": "int64",
                          "start": "float64", "end": "float64"})
    jf = prepare_jobs(frame, since, now, now)
    need = {"time", "node", "job_id", "utilization_pct", "memory_used_mib", "status",
            "interval_s"}
    if samples is None or len(samples) == 0 or not need <= set(samples.columns):
        s = None
    else:
        s = prepare_samples(samples.copy(), w_usage, since, now)
        s = s[s["held"]]
    judged: dict[int, tuple[bool, int]] = {}
    if s is not None and len(s) and len(jf):
        allocated = {j.job_id: devs for j in jobs
                     if (devs := allocated_devices(j)) is not None}
        # Coverage only where it decides (every sample known and below the thresholds):
        # counting devices of a busy job's window would cost most of the run.
        _, w = judge_windows(jf, s, w_usage, max_interval_s=cap, allocated=allocated)
        # One window per job here (its run inside [since, now) is at most window_s long);
        # the first, should a run shorter than one interval make two.
        for row in w.sort_values(["job_id", "k"]).groupby("job_id").head(1).itertuples():
            judged[int(row.job_id)] = (bool(row.idle), int(row.covered_gpus))
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
        })
        stats = {int(k): v for k, v in stats_frame.to_dict("index").items()}
    for j in jobs:
        gpus, _ = job_gpus(j)
        st = stats.get(j.job_id, {})

        def num(key: str, st: Mapping[str, Any] = st) -> float | None:
            v = st.get(key)
            return None if v is None or (isinstance(v, float) and v != v) else float(v)

        idle, covered = judged.get(j.job_id, (False, 0))
        out[j.job_id] = Evidence(
            window_start=since, window_end=now, samples=int(st.get("n", 0)),
            known_samples=int(st.get("known", 0)),
            expected_samples=window_s / cap * gpus,
            mean_util_pct=num("mean"), max_util_pct=num("max"), max_memory_mib=num("mem"),
            idle=idle, gpus=gpus, covered_gpus=covered)
    return out


# ----------------------------------------------------------------------------- the rules
def decision_record(job: JobInfo, field_name: str = "admin_comment",
                    key: str = "hetslurm") -> DecisionRecord | None:
    """The hook's decision record of ``job`` (:func:`hetslurm.request.record.find_record`)."""
    if field_name == "none":
        return None
    return find_record(job.comment if field_name == "comment" else job.admin_comment, key)


@dataclass(frozen=True)
class SiteModels:
    """What a downgrade needs from the site: its GPU models from most to least expensive,
    their memory, and which partitions and workload classes have which models.

    ``order`` is by ``[levers] cost_per_device_hour`` when every model has a cost (ties in
    the site's order), else the site's ``gpu_model_order`` (preferred first, lesser after).
    """

    order: tuple[str, ...] = ()
    cost: Mapping[str, float] = field(default_factory=dict)
    memory_mib: Mapping[str, int | None] = field(default_factory=dict)
    partitions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    classes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def cheaper(self, model: str) -> list[str]:
        """Models strictly cheaper than ``model``, the nearest (most expensive) first."""
        if model not in self.order:
            return []
        after = list(self.order[self.order.index(model) + 1:])
        if self.cost and model in self.cost:
            return [m for m in after if self.cost.get(m, float("inf")) < self.cost[model]]
        return after

    @classmethod
    def from_site(cls, site: Any) -> SiteModels:
        """From a :class:`hetslurm.site.model.Site`."""
        models = tuple(site.gpu_models())
        levers = site.sections.get("levers")
        raw_cost = dict(getattr(levers, "cost_per_device_hour", None) or {})
        cost = {m: float(raw_cost[m]) for m in models if m in raw_cost}
        if models and len(cost) == len(models):
            order = tuple(sorted(models, key=lambda m: (-cost[m], models.index(m))))
        else:
            order, cost = models, {}
        partitions: dict[str, frozenset[str]] = {}
        for name, part in site.partitions.items():
            have: set[str] = set()
            for n in part.nodes:
                have.update(d.model for d in site.node(n).gpus)
            partitions[name] = frozenset(have)
        raw_classes = site.sections.get("classes") or {}
        classes = {name: tuple(d for d in wc.devices if d in models)
                   for name, wc in raw_classes.items()}
        return cls(order=order, cost=cost, memory_mib=dict(site.gpu_memory_mib()),
                   partitions=partitions, classes=classes)


@dataclass(frozen=True)
class Context:
    """What the rules need besides the job: policy, thresholds, the hook's record field,
    the site's GPU models (for downgrades) and the hook's ``scontrol update`` rule."""

    stall: Stall
    usage: Usage
    record_field: str = "admin_comment"
    record_key: str = "hetslurm"
    #: ``None``: no site, so no job can be downgraded (it is notified instead).
    models: SiteModels | None = None
    #: uids whose ``scontrol update`` may change fields the hook wrote (``[hook]``).
    modify_exempt_uids: tuple[int, ...] = (0,)
    #: The uid this run acts as (the hook judges ``scontrol update`` by it).
    uid: int = field(default_factory=os.geteuid)
    #: The most seconds one sample may stand for: ``[collector] interval_s`` (a sample's own
    #: ``interval_s`` is capped at it, so a forged one cannot cover a window alone).
    max_interval_s: float = field(default_factory=lambda: float(Collector().interval_s))

    @property
    def window_s(self) -> int:
        return self.stall.window_s or self.usage.idle_window_s


#: Characters of a constraint expression hetslurm does not rewrite (counts, brackets, ...).
_COMPLEX_FEATURES = re.compile(r"[\[\]()*,:!\s]")


def _min_gpu_mem_mib(rec: DecisionRecord | None) -> float:
    req = rec.parsed() if rec is not None else None
    return float(req.min_gpu_mem_mib or 0) if req is not None else 0.0


def _gres_text(items: Sequence[GresItem]) -> str:
    return ",".join(it.to_slurm() for it in items)


def _relaxed_features(features: str | None, models: Sequence[str], to: str
                      ) -> tuple[str | None, str | None]:
    """``(new Features=, why not)`` with every GPU model term replaced by ``to``.

    Handles what the hook and users write: ``h100|a100`` (an OR of models), ``nvlink&h100``
    (an AND of plain features). ``None`` as the new value: the expression names no model.
    Anything richer (brackets, counts, an OR mixing models and other features) is refused.
    """
    text = (features or "").strip()
    if not text:
        return None, None
    if _COMPLEX_FEATURES.search(text) or ("|" in text and "&" in text):
        return None, f"the constraint {text!r} is not a plain OR or AND: not rewritten"
    if "|" in text:
        terms = text.split("|")
        named = [t for t in terms if t in models]
        if not named:
            return None, None
        if len(named) != len(terms):
            return None, (f"the constraint {text!r} mixes GPU models and other features "
                          "in an OR: not rewritten")
        return to, None
    terms = text.split("&")
    if not any(t in models for t in terms):
        return None, None
    out: list[str] = []
    for t in terms:
        t = to if t in models else t
        if t not in out:
            out.append(t)
    return "&".join(out), None


def downgrade_for(job: JobInfo, rec: DecisionRecord | None, ev: Evidence | None, ctx: Context
                  ) -> tuple[Downgrade | None, str]:
    """The next cheaper GPU model for ``job`` and the request that asks for it, or
    ``(None, why not)``.

    The model must be cheaper than the one the job runs on (:class:`SiteModels` order), one
    of its workload class's models (the record's ``class``; any site model without one),
    present in the job's partition, and have at least the memory the job asked for
    (``min-gpu-mem`` in the record's ``req``) and the most it used in the window
    (:meth:`Site.gpu_memory_mib`; unknown memory never qualifies against a floor). The new
    request retypes a typed ``--gres`` and replaces the model terms of ``--constraint``;
    a job that named no model gets the model as a constraint. Never a node list. The hook's
    ``scontrol update`` rule is respected: a field the hook wrote is changed only by a uid
    in ``[hook] modify_exempt_uids``.
    """
    site = ctx.models
    if site is None or not site.order:
        return None, "no site GPU models known: nothing to downgrade to"
    _, current = job_gpus(job)
    if current is None:
        return None, "the job's GPU model is unknown"
    if current not in site.order:
        return None, f"{current} is not a GPU model of the site"
    allowed = set(site.order)
    cls = rec.workload_class if rec is not None else None
    if cls is not None and site.classes.get(cls):
        allowed &= set(site.classes[cls])
    parts = [p for p in (job.partition or "").split(",") if p in site.partitions]
    if parts:
        allowed &= set().union(*(site.partitions[p] for p in parts))
    floor = max(_min_gpu_mem_mib(rec),
                ev.max_memory_mib if ev is not None and ev.max_memory_mib else 0.0)

    def fits(m: str) -> bool:
        mem = site.memory_mib.get(m)
        return floor <= 0 or (mem is not None and mem >= floor)

    cheaper = site.cheaper(current)
    candidates = [m for m in cheaper if m in allowed and fits(m)]
    if not candidates:
        why = f"no GPU model cheaper than {current}"
        if cheaper:
            why += (f" that the job may use ({', '.join(cheaper)}: outside its class or "
                    f"partition, or under {floor:.0f} MiB)")
        return None, why + ": nothing to downgrade to"
    to = candidates[0]
    if any(it.name == "gpu" and it.type for it in (*job.tres_per_job, *job.tres_per_task)):
        return None, ("the GPU model is named in --gpus/--gpus-per-task, which scontrol "
                      "update cannot retype")
    gres: str | None = None
    if any(it.name == "gpu" and it.type for it in job.tres_per_node):
        gres = _gres_text([GresItem(it.name, to, it.count) if it.name == "gpu" and it.type
                           else GresItem(it.name, it.type, it.count)
                           for it in job.tres_per_node])
    features, refused = _relaxed_features(job.features, site.order, to)
    if refused:
        return None, refused
    if gres is None and features is None:
        # The job accepted any model: ask for the cheaper one as a constraint.
        have = (job.features or "").strip()
        if have and "|" in have:
            return None, f"the constraint {have!r} is an OR: {to} not added"
        features = f"{have}&{to}" if have else to
    wrote = set(rec.set_fields) if rec is not None else set()
    touched = [f for f, v in (("tres_per_node", gres), ("features", features)) if v is not None]
    hook_owned = [f for f in touched if f in wrote]
    if ctx.record_field != "none" and hook_owned and ctx.uid not in ctx.modify_exempt_uids:
        return None, (f"{', '.join(hook_owned)} was set by the hook and uid {ctx.uid} is not "
                      "in [hook] modify_exempt_uids: the hook would refuse the update")
    old_gres = _gres_text(job.tres_per_node) if job.tres_per_node else None
    return Downgrade(current, to, gres=gres, features=features, old_gres=old_gres,
                     old_features=job.features), ""


@dataclass(frozen=True)
class Verdict:
    """One job judged on its own (a het component too): see :func:`judge`."""

    rule: str
    planned: str
    reason: str
    on_idle: str | None = None
    output_mode: str | None = None
    downgrade: Downgrade | None = None


def verdict(job: JobInfo, ev: Evidence | None, ctx: Context, now: float,
            output_probe: OutputProbe | None) -> Verdict:
    """The rule for one running GPU job on its own (het jobs are judged together by
    :func:`plan` afterwards)."""
    st = ctx.stall
    start = _epoch(job)
    age = now - start if start is not None else 0.0
    need = max(st.grace_after_start_s, ctx.window_s)
    rec = decision_record(job, ctx.record_field, ctx.record_key)
    on_idle = rec.on_idle if rec is not None else None

    def v(rule: str, planned: str, reason: str, mode: str | None = None,
          dg: Downgrade | None = None) -> Verdict:
        return Verdict(rule, planned, reason, on_idle, mode, dg)

    if start is None or age < need:
        return v("in-grace", "none", f"running {age:.0f}s < {need}s")
    if ev is None or not ev.idle:
        if ev is not None and ev.samples and ev.known_samples < ev.samples and (
                ev.max_util_pct is None or ev.max_util_pct < ctx.usage.idle_threshold_pct):
            return v("unknown-metrics", "none", f"{ev.samples - ev.known_samples} unknown "
                     "sample(s) in the window: unknown is never idle")
        if ev is None or ev.samples == 0:
            return v("unknown-metrics", "none", "no samples in the window")
        if (ev.max_util_pct is not None and ev.max_util_pct < ctx.usage.idle_threshold_pct
                and ev.covered_gpus < ev.gpus):
            return v("unknown-metrics", "none", f"{ev.covered_gpus} of {ev.gpus} allocated "
                     f"GPU(s) reported for {ctx.usage.min_coverage:.0%} of the window "
                     f"({ev.known_samples} known sample(s) of {ev.expected_samples:.0f} "
                     "expected): unknown is never idle")
        return v("not-idle", "none", "busy in the window")
    for rule, value, listed in (("exempt-user", job.user, st.exempt_users),
                                ("exempt-account", job.account, st.exempt_accounts),
                                ("exempt-partition", job.partition, st.exempt_partitions),
                                ("exempt-qos", job.qos, st.exempt_qos)):
        if value is not None and value in listed:
            return v(rule, "none", f"{value} is exempt")
    if on_idle == "notify":
        return v("on-idle-notify", "notify", "the job asked on-idle=notify")
    if job.restarts is None:
        # A missing count read as 0 would pass the cap for a job requeued many times over;
        # a warning is tied to a run by the count too, so no changing action is possible.
        return v("restarts-unknown", "none", "Slurm did not report the job's restart count: "
                 f"the requeue cap ({st.max_requeues}) and the run a warning names cannot "
                 "be checked")
    if not job.batch:
        return v("non-batch", st.non_batch_action, "interactive job: Slurm cannot requeue it")
    asked = rec.parsed() if rec is not None else None
    if not job.requeue or (asked is not None and asked.no_requeue):
        return v("no-requeue", "none",
                 "the job refuses requeue (--no-requeue or #HET no-requeue)")
    if job.restarts >= st.max_requeues:
        return v("cap-reached", st.over_cap_action,
                 f"restarts {job.restarts} >= cap {st.max_requeues}")
    # A het job's output is its leader's (the batch script belongs to the leader).
    ref = str(job.het_job_id) if job.het_job_id else job.display_id
    mode = output_probe(ref) if output_probe is not None else "unknown"
    if (mode not in ("append", "discarded") and st.action != "notify"
            and st.no_append_action == "notify"):
        return v("output-not-append", "notify",
                 f"output mode {mode}: a requeue would truncate it", mode)
    if on_idle == "downgrade":
        if st.action == "notify":
            return v("on-idle-downgrade", "notify",
                     "on-idle=downgrade, but [stall] action is notify", mode)
        if job.het_job_id:
            return v("on-idle-downgrade", "notify",
                     "on-idle=downgrade: a heterogeneous job is not downgraded", mode)
        dg, why = downgrade_for(job, rec, ev, ctx)
        if dg is None:
            return v("on-idle-downgrade", "notify", f"on-idle=downgrade: {why}", mode)
        return v("on-idle-downgrade", "downgrade", f"idle over the window: {dg.describe()}",
                 mode, dg)
    return v("idle", st.action, "idle over the window", mode)


def judge(job: JobInfo, ev: Evidence | None, ctx: Context, now: float,
          output_probe: OutputProbe | None) -> tuple[str, str, str, str | None, str | None]:
    """``(rule, planned action, reason, on_idle, output_mode)`` for one running GPU job."""
    x = verdict(job, ev, ctx, now, output_probe)
    return x.rule, x.planned, x.reason, x.on_idle, x.output_mode


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


def _het_verdicts(members: Sequence[JobInfo], own: Mapping[int, Verdict],
                  ctx: Context) -> dict[int, Verdict]:
    """Het components judged together: the job is acted on through its leader only when
    every component runs, holds GPUs, and on its own would get the same changing action
    (:data:`CHANGING`: requeued as ``idle``, cancelled as ``non-batch``, held as
    ``cap-reached``).

    A component is never acted on alone: Slurm refuses to requeue a component's own id,
    and from 24.11 cancelling component 0 cancels the whole het job, busy components too.
    A component without GPUs has no samples, and unknown is never idle. When one component
    blocks, every component that would have been acted on is notified (``het-job``); the
    others keep their own rule.
    """
    het_id = members[0].het_job_id
    blockers: list[str] = []
    actions: set[str] = set()
    for m in sorted(members, key=lambda m: m.het_job_offset or 0):
        mine = own.get(m.job_id)
        if m.state != "RUNNING":
            blockers.append(f"{m.display_id} is {m.state}")
        elif mine is None:
            blockers.append(f"{m.display_id} holds no GPU: unknown is never idle")
        elif mine.planned not in THROUGH_LEADER:
            blockers.append(f"{m.display_id} is {mine.rule}")
        else:
            actions.add(mine.planned)
    if len(actions) > 1:
        blockers.append("the components would get different actions "
                        f"({', '.join(sorted(actions))})")
    leader = next((m for m in members if m.job_id == het_id), None)
    if leader is None:
        blockers.append(f"the leader {het_id} is not listed")
    out: dict[int, Verdict] = {}
    for m in members:
        mine = own.get(m.job_id)
        if mine is None:
            continue
        if not blockers:
            if m.job_id == het_id:
                out[m.job_id] = replace(
                    mine, rule="het-job", reason=f"every component of het job {het_id} is "
                    f"idle and qualifies: {mine.planned} through the leader")
            else:
                out[m.job_id] = replace(mine, rule="het-job", planned="none",
                                        reason=f"acted on through the leader {het_id}")
        elif mine.rule == "idle" or mine.planned in CHANGING:
            out[m.job_id] = replace(
                mine, rule="het-job", planned="notify", downgrade=None,
                reason="idle, but a het job is requeued only when every component "
                       f"qualifies: {'; '.join(blockers)}")
        else:
            out[m.job_id] = mine
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
        own.update(_het_verdicts(het[het_id], own, ctx))
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
                Component(m.display_id, m.job_id, m.name, m.restarts, _epoch(m),
                          evidence.get(m.job_id))
                for m in sorted(het[j.het_job_id], key=lambda m: m.het_job_offset or 0))
        out.append(Decision(
            job=j.display_id, job_id=j.job_id, name=j.name, user=j.user, account=j.account,
            partition=j.partition, qos=j.qos, gpus=gpus, gpu_model=model, state=j.state,
            restarts=j.restarts, start=_epoch(j), rule=x.rule, planned=x.planned,
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
    if _epoch(now_job) != before.start:
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
    seen = "?"
    while True:
        try:
            j = backend.job(ref)
        except NotFoundError:
            return False, "job vanished after the action"
        except BackendError as exc:
            # slurmctld restarting right after the action: it keeps its state, so read
            # again until it answers or the timeout passes (never act a second time).
            seen = f"Slurm did not answer: {exc}"
            if time.monotonic() >= deadline:
                return False, seen
            sleep(0.5)
            continue
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
                       "results": _count(o.result for o in outcomes)})
    return outcomes


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


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
    def record(result: str, detail: str, **more: Any) -> None:
        log.append("action", {"t": now, "job": d.job, "job_id": d.job_id,
                              "restarts_before": d.restarts, "action": d.action,
                              "result": result, "detail": detail, **more})

    # Re-read and re-judge right before acting: the job may have ended, been requeued by
    # Slurm's own preemption, or changed its flags since the decision.
    why = _recheck(backend, d, ctx, now, output_probe)
    if why is not None:
        record("skipped", why)
        return Outcome(d.job, d.action, "skipped", why)
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
        result = "not-requeued" if d.action != "cancel" else "not-cancelled"
        record(result, seen, **more)
        return Outcome(d.job, d.action, result, seen)
    record("done", seen, **more)
    sent = tell(d, d.action, {"verified": seen, **more})
    return Outcome(d.job, d.action, "done", seen, sent)


def _request_shows(j: JobInfo, dg: Downgrade) -> str | None:
    """``None`` when ``j``'s request is the downgraded one, else what it shows."""
    gres = _gres_text(j.tres_per_node) if j.tres_per_node else None
    if dg.gres is not None and gres != dg.gres:
        return f"Gres={gres}"
    if dg.features is not None and (j.features or "") != dg.features:
        return f"Features={j.features}"
    return None


def _downgrade(backend: SlurmBackend, d: Decision, ctx: Context,
               record: Callable[..., None], sleep: Callable[[float], None],
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
    record("done" if ok else "not-requeued", seen, step="requeue_hold", **facts)
    if not ok:
        return Outcome(d.job, d.action, "not-requeued", seen)
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
        detail = f"held and not released: {type(exc).__name__}: {exc}"
        record("failed", detail, step="release", **facts)
        return Outcome(d.job, d.action, "failed", detail)
    ok, seen = _wait_for(backend, d.job, d.restarts, "released", timeout, sleep)
    if ok and update_error is None:
        try:
            shown = _request_shows(backend.job(d.job), dg)
        except NotFoundError:
            shown = "the job is gone"
        if shown is not None:
            ok, seen = False, f"{seen}; request {shown}"
    if update_error is not None:
        result = "not-downgraded"
        detail = f"{update_error}; released with its own request: {seen}"
        record(result if ok else "not-requeued", detail, step="release", **facts)
        if not ok:
            return Outcome(d.job, d.action, "not-requeued", detail)
        sent = tell(d, "requeue", {"verified": seen, "not_downgraded": update_error})
        return Outcome(d.job, d.action, result, detail, sent)
    record("done" if ok else "not-requeued", seen, step="release", **facts)
    if not ok:
        return Outcome(d.job, d.action, "not-requeued", seen)
    sent = tell(d, "downgrade", {"verified": seen, **facts})
    return Outcome(d.job, d.action, "done", f"{dg.describe()}: {seen}", sent)
