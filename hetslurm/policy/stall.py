"""The stall rules: whether a running GPU job is idle, and what ``[stall]`` does about it.

Pure judgement, no Slurm call: a job's facts as the access layer lists them
(:class:`~hetslurm.slurm.backend.JobInfo`), its GPU samples and the hook's decision record
in; an :class:`Evidence`, a :class:`Verdict` and, for ``on-idle=downgrade``, the
:class:`Downgrade` out. ``hetslurm.act.stall`` lists the jobs, gates and acts; the simulator
will judge by the same rules.

"Idle" is the audit's own rule (:func:`hetslurm.policy.idle.judge_windows` over the last
``window_s``): every sample of every GPU known and below the thresholds, with enough
coverage. Unknown is never idle. Rules, first match wins (docs/act.md): ``in-grace``,
``not-idle``, ``unknown-metrics``, ``exempt-user``/``-account``/``-partition``/``-qos``,
``on-idle-notify``, ``non-batch``, ``no-requeue``, ``cap-reached``, ``output-not-append``,
``on-idle-downgrade``, ``idle``. A heterogeneous job's components are judged one by one and
then together (``het-job``, :func:`het_verdicts`). A requeue, hold or cancel must follow a
warning by ``warning_grace_s`` (:func:`gate`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetslurm.request.record import DecisionRecord, find_record
from hetslurm.site.schema import Collector, Stall, Usage
from hetslurm.slurm.backend import JobInfo
from hetslurm.slurm.units import GresItem

#: Actions that change a job; each needs a matured warning first.
CHANGING = ("requeue", "requeue_hold", "cancel", "downgrade")
#: Changing actions Slurm applies to a whole het job when given its leader's id (a het job
#: is never downgraded).
THROUGH_LEADER = ("requeue", "requeue_hold", "cancel")
#: A job's output mode by its id: ``append``, ``truncate`` (the script says so), ``discarded``
#: (/dev/null) or ``unknown`` (``hetslurm.act.output_mode``).
OutputProbe = Callable[[str], str]


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


# ----------------------------------------------------------------------------- evidence
def start_epoch(job: JobInfo) -> float | None:
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

    from hetslurm.policy.idle import interval_cap, judge_windows, prepare_jobs, prepare_samples

    cap = interval_cap(None) if max_interval_s is None else max_interval_s
    since = now - window_s
    w_usage = usage.model_copy(update={"idle_window_s": window_s})
    rows = []
    for j in jobs:
        gpus, model = job_gpus(j)
        # One row per job here, so "run" (which run is the last) only needs to be a number.
        rows.append({"job_id": j.job_id, "run": j.restarts or 0, "gpus": gpus,
                     "start": start_epoch(j), "end": np.nan, "user": j.user or "",
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
        job_id = s["job_id"].astype("int64")
        util = s["utilization_pct"].astype("float64").where(s["known"]).groupby(job_id)
        stats_frame = pd.DataFrame({
            "n": util.size(), "known": s["known"].groupby(job_id).sum(),
            "mean": util.mean(), "max": util.max(),
            "mem": s["memory_used_mib"].astype("float64").groupby(job_id).max(),
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
        partitions = {name: frozenset(d.model for n in part.nodes for d in site.node(n).gpus)
                      for name, part in site.partitions.items()}
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


def gres_text(items: Sequence[GresItem]) -> str:
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
        gres = gres_text([GresItem(it.name, to, it.count) if it.name == "gpu" and it.type
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
    old_gres = gres_text(job.tres_per_node) if job.tres_per_node else None
    return Downgrade(current, to, gres=gres, features=features, old_gres=old_gres,
                     old_features=job.features), ""


@dataclass(frozen=True)
class Verdict:
    """One job judged on its own (a het component too): see :func:`verdict`."""

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
    start = start_epoch(job)
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


def het_verdicts(members: Sequence[JobInfo], own: Mapping[int, Verdict],
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
