"""From trace jobs to what each policy submits: class, request, runtime per GPU model.

The class of a job is a property of the job (what it computes), so it is decided once, from
the trace's fields and the parameter file; a policy decides only whether the class rewrites
the request (``hetslurm``) or not (``slurm-default``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from hetslurm.errors import ConfigError, PlacementError
from hetslurm.placement.model import ClusterModel, KernelRequest
from hetslurm.placement.place import ScoreWeights, compile_request, place
from hetslurm.policy.ranking import proposed_order
from hetslurm.request.language import Request, resolve
from hetslurm.simulate.params import Params, PolicyParams
from hetslurm.simulate.traces import TraceError, TraceJob
from hetslurm.site.model import Site
from hetslurm.traces import traces_dir

PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}


@dataclass(frozen=True)
class SimJob:
    """One job as one policy submits it.

    Attributes:
        index: position in the trace (ties in priority and submit time go by it).
        submit: submit time after the load multiplier, seconds.
        priority: 0 high, 1 normal, 2 low.
        partition: node mask name ("*" = all nodes).
        kr: the compiled request the placement core reads.
        runtime: seconds by GPU model index of the model (-1 = CPU-only node).
        time_limit: what backfill plans with (runtime on the slowest allowed model x factor).
        ranked: ranked fallback (docs/fallback.md): the per-model partitions the hook submits
            the job to, in its order; the main scheduler starts it in the first one where it
            fits now. Empty: ``partition`` alone.
    """

    index: int
    id: str
    cls: str
    submit: float
    priority: int
    partition: str
    kr: KernelRequest
    runtime: Mapping[int, float]
    time_limit: float
    gpus: int
    ranked: tuple[str, ...] = ()


def partition_names(jobs: Sequence[SimJob]) -> set[str]:
    """Every partition the jobs name, ranked fallback's per-model ones included."""
    return {p for j in jobs for p in (j.partition, *j.ranked)}


def ranked_for(site: Site, req: Request, partition: str) -> tuple[str, ...]:
    """The per-model partitions the hook submits ``req`` to in ``partition`` (as hethook.lua's
    rank: two or more models, each per-model partition with enough nodes for the job)."""
    listed = site.ranked_list(partition, req.gpu_models) if req.gpus_per_node else None
    names = tuple(n for n in (listed or "").split(",")
                  if n and len(site.ranked[n].nodes) >= req.nodes)
    return names if len(names) >= 2 else ()


@dataclass(frozen=True)
class Classified:
    job: TraceJob
    cls: str
    io_standin: bool
    gpus: int  # whole GPUs after rounding
    #: The site models the trace lets the job run on (its ``gpu_models`` mapped); empty: any.
    spec: tuple[str, ...] = ()


def site_gpu_models(names: Sequence[str], site_models: Sequence[str],
                    aliases: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A trace's GPU model names as the site's models: ``(site models, unknown names)``.

    A name maps through ``aliases`` (``[jobs] trace_gpu_models`` of the parameter file),
    else to the site model of the same name, case aside (Alibaba's ``V100M16`` is the
    generated site's ``v100m16``). A name that maps to no model of the site is unknown.
    """
    by_lower = {m.lower(): m for m in site_models}
    mapped: list[str] = []
    unknown: list[str] = []
    for name in names:
        target = aliases.get(name, name)
        m = by_lower.get(target.lower())
        if m is None:
            unknown.append(name)
        elif m not in mapped:
            mapped.append(m)
    return tuple(mapped), tuple(unknown)


def classify(job: TraceJob, params: Params) -> Classified | None:
    """The job's class and whole-GPU count; ``None`` when fractional GPUs are dropped."""
    gpus = job.gpus
    if gpus == 0:
        return Classified(job, params.cpu_class, False, 0)
    if job.gpu_milli < 1000 and params.fractional_gpu == "drop":
        return None
    if 0 < job.gpu_milli < params.io_gpu_milli_below:
        return Classified(job, params.cpu_class, True, gpus)
    if job.job_type is not None:
        for prefix, cls in params.gavel_family.items():
            if job.job_type.startswith(prefix):
                return Classified(job, cls, False, gpus)
        raise ConfigError(f"{params.path}: [classify.gavel_family] has no family for job type "
                          f"'{job.job_type}'")
    return Classified(job, _draw(job.id, params.untyped_shares, params.seed), False, gpus)


def _draw(key: str, shares: Mapping[str, float], seed: int = 0) -> str:
    """A class drawn by a stable hash of the job id (and the seed, where not 0), in
    proportion to ``shares``."""
    salted = key if seed == 0 else f"{seed}/{key}"
    u = int.from_bytes(hashlib.sha256(salted.encode()).digest()[:8], "big") / 2.0**64
    total = sum(shares.values())
    acc = 0.0
    for name in sorted(shares):
        acc += shares[name] / total
        if u < acc:
            return name
    return sorted(shares)[-1]


@cache
def _gavel_table(path: str) -> dict[str, dict[tuple[str, int], float]]:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    key = re.compile(r"^\('(?P<type>.+)', (?P<scale>\d+)\)$")
    out: dict[str, dict[tuple[str, int], float]] = {}
    for model, entries in raw.items():
        table = out.setdefault(model, {})
        for k, v in entries.items():
            m = key.match(k)
            if m is None or not isinstance(v, dict) or not isinstance(v.get("null"), int | float):
                continue
            table[(m["type"], int(m["scale"]))] = float(v["null"])
    return out


def gavel_throughputs() -> dict[str, dict[tuple[str, int], float]]:
    """Gavel's measured steps/s per model, (job type, scale factor), isolated."""
    path = traces_dir() / "gavel" / "simulation_throughputs.json"
    if not path.is_file():
        raise TraceError(f"{path}: Gavel's throughput table is missing (set HETSLURM_TRACES)")
    return _gavel_table(str(path))


def runtimes(c: Classified, fmt: str, models: Sequence[str], params: Params) -> dict[int, float]:
    """Seconds on each GPU model (index into ``models``) and on CPU-only nodes (-1)."""
    job = c.job
    out: dict[int, float] = {}
    if c.gpus == 0 or c.io_standin:
        base = float(job.duration or 0.0)
        out[-1] = base * (params.cpu_slowdown_of_io_jobs if c.io_standin else 1.0)
        for i in range(len(models)):
            # CPU work on a GPU node's cores runs at the same speed; an IO-bound stand-in
            # runs as long on any GPU model (the GPU is not what limits it).
            out[i] = base
        return _cut(out, params)
    if job.steps is not None and job.job_type is not None:
        table = gavel_throughputs()
        for i, m in enumerate(models):
            if m not in table:
                raise ConfigError(f"Gavel's table has no model '{m}'; it has {sorted(table)}")
            scales = [s for (t, s) in table[m] if t == job.job_type and s <= c.gpus]
            if not scales:
                raise TraceError(f"Gavel's table has no throughput for '{job.job_type}'")
            # Scale factors the table lacks (12, 16, 32, ...) use the largest measured
            # scale below them: a conservative runtime.
            tput = table[m][(job.job_type, max(scales))]
            # Gavel records 0 steps/s where the job does not run on the model (memory).
            out[i] = job.steps / tput if tput > 0 else math.inf
        return _cut(out, params)
    ref = params.reference_model.get(fmt)
    if ref is None:
        raise ConfigError(f"{params.path}: [runtime] reference_model has no entry for '{fmt}'")
    base = float(job.duration or 0.0)
    for i, m in enumerate(models):
        out[i] = base * params.speed(c.cls, ref) / params.speed(c.cls, m)
    return _cut(out, params)


def _cut(out: dict[int, float], params: Params) -> dict[int, float]:
    if params.max_runtime_s > 0:
        return {k: min(v, params.max_runtime_s) for k, v in out.items()}
    return out


def node_weights(model: ClusterModel, policy: PolicyParams,
                 params: Params | None = None) -> ClusterModel:
    """The cluster as the policy renders it: the site's weights, Slurm's default 1, or by
    speed (:func:`speed_weights`, which needs ``params``)."""
    if policy.node_weights == "site":
        return model
    import numpy as np

    if policy.node_weights == "speed":
        if params is None:
            raise ConfigError(f"[policy.{policy.name}] node_weights = \"speed\" needs the "
                              "parameter file's [speeds]")
        weight = np.asarray(speed_weights(model, params), dtype=np.int64)
    else:
        weight = np.ones_like(model.weight)
    weight.flags.writeable = False
    return replace(model, weight=weight, _cache={})


def model_speed(params: Params, model: str) -> float:
    """One GPU model's speed over every class: the geometric mean of its ``[speeds]``
    (classes that do not name the model aside; 0 if none does)."""
    vals = [row[model] for row in params.speeds.values() if model in row]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else 0.0


def speed_weights(model: ClusterModel, params: Params) -> list[int]:
    """Node ``Weight=`` as an admin sets it by speed without hetslurm: CPU-only nodes 1
    (Slurm takes the lowest first, so CPU work fills them before any device node), then one
    step per GPU model from the fastest (:func:`model_speed`; ties by name), then FPGA-only
    nodes."""
    order = sorted(model.gpu_models, key=lambda m: (-model_speed(params, m), m))
    rank = {m: i for i, m in enumerate(order)}
    out = []
    for i in range(model.n_nodes):
        g = int(model.gpu_model[i])
        if g >= 0 and int(model.gpu_count[i]) > 0:
            out.append(2 + rank[model.gpu_models[g]])
        elif int(model.fpga_count[i]) > 0:
            out.append(2 + len(order))
        else:
            out.append(1)
    return out


def learned_site(site: Site, params: Params) -> Site:
    """``site`` with each class's ``devices`` re-ranked as ``hetslurm learn speeds --rank``
    would propose from the parameter file's ``[speeds]`` (the ``speeds`` part of the whole
    system): the same rule (:func:`hetslurm.policy.ranking.proposed_order`) with each speed
    taken as measured exactly (a zero-width interval), so a model moves ahead of one listed
    before it whenever it is faster for the class. A class without ``[speeds]`` keeps its
    order (so does one with fewer than two models that have a speed: nothing to compare);
    ``site`` itself when nothing moves."""
    classes = dict(site.sections.get("classes", {}))
    moved = False
    for name, wc in classes.items():
        row = params.speeds.get(name)
        if row is None:
            continue
        order = tuple(wc.devices)
        new = proposed_order(order, {d: (row[d], row[d]) for d in order if d in row})
        if new != order:
            classes[name] = wc.model_copy(update={"devices": new})
            moved = True
    if not moved:
        return site
    return replace(site, sections={**site.sections, "classes": classes})


def score_weights(policy: PolicyParams) -> ScoreWeights:
    return ScoreWeights(**policy.score)


def request_for(c: Classified, policy: PolicyParams, params: Params, site: Site,
                model: ClusterModel, times: Mapping[int, float]) -> tuple[Request, str, int]:
    """The request, partition and priority the policy submits for a classified job."""
    job = c.job
    cpu_only = c.gpus == 0 or (c.io_standin and policy.use_classes)
    gpus = 0 if cpu_only else c.gpus
    cores = job.cores if job.cores is not None else (
        params.cores_per_gpu * gpus if gpus else params.cores_per_cpu_job)
    models = site.gpu_models()
    # A model the job cannot run on (Gavel: 0 steps/s) is one its user would not ask for.
    # So is one outside the trace's own constraint (Alibaba's gpu_spec), under any policy: it
    # is the user's --constraint / typed --gres, not a rewrite.
    runnable = tuple(m for i, m in enumerate(model.gpu_models)
                     if math.isfinite(times[i]) and (not c.spec or m in c.spec))
    asked: tuple[str, ...] = () if len(runnable) == len(model.gpu_models) else runnable
    if policy.use_classes and gpus:
        probe = resolve(Request(gpus_per_node=1, workload_class=c.cls), site)
        allowed = tuple(m for m in (probe.gpu_models or models) if m in runnable) or runnable
        if allowed != probe.gpu_models:
            asked = allowed
    else:
        allowed = runnable or models
    per_node_max = max((int(model.gpu_count[i]) for i in range(model.n_nodes)
                        if model.gpu_model[i] >= 0 and model.gpu_models[model.gpu_model[i]]
                        in allowed), default=0)
    if gpus:
        nodes = math.ceil(gpus / per_node_max) if per_node_max else 1
    else:
        # A CPU job wider than a node (SWF's 128-processor jobs) spans the fewest nodes of
        # the largest core count it may use (CPU-only nodes under hetslurm's CPU class).
        kinds = model.gpu_count == 0 if cpu_only and policy.use_classes else model.gpu_count >= 0
        import numpy as np

        widest = int(np.max(model.cores_total[kinds])) if kinds.any() else 1
        nodes = max(1, math.ceil(cores / widest))
    per_node = math.ceil(gpus / nodes) if gpus else 0
    req = Request(
        nodes=nodes, gpus_per_node=per_node, cores_per_node=max(1, math.ceil(cores / nodes)),
        mem_per_node_mib=None if job.mem_mib is None else math.ceil(job.mem_mib / nodes),
        workload_class=c.cls if policy.use_classes else None,
        gpu_models=asked if gpus else (),
        given=("gpu-type",) if asked and gpus else (),
    )
    partition = policy.cpu_partition if cpu_only else policy.gpu_partition
    if policy.use_classes:
        # Alibaba pods may ask 0 MiB, which the #HET grammar cannot say (mem=0 is Slurm's
        # "the whole node"): the hook's meaning does not read memory, so resolve without it
        # and keep the trace's 0 for placement.
        mem = req.mem_per_node_mib
        req = replace(resolve(replace(req, mem_per_node_mib=mem or None), site),
                      mem_per_node_mib=mem)
        if partition == "class":
            partition = req.partition or "*"
    elif partition == "class":
        raise ConfigError(f"{params.path}: [policy.{policy.name}] partition 'class' needs "
                          "use_classes = true")
    # Only hetslurm's CPU class keeps CPU work off device nodes (feature "cpu"); without
    # rewrites a CPU job may land on any node of its partition.
    req = replace(req, cpu_only=cpu_only and policy.use_classes,
                  gpu_models=req.gpu_models if gpus else ())
    prio = "normal"
    if policy.use_priority and job.qos is not None:
        prio = params.priority_by_qos.get(job.qos, "normal")
    return req, partition, PRIORITY_RANK[prio]


def build_jobs(
    trace_jobs: Sequence[TraceJob], fmt: str, site: Site, params: Params,
    policies: Sequence[str],
) -> tuple[dict[str, list[SimJob]], dict[str, int]]:
    """Each policy's jobs at load 1, the same jobs for every policy.

    A job that cannot run on the empty cluster under any of ``policies`` (larger than the
    cluster, more cores than a node) is dropped from all of them, so the policies replay the
    same work. A GPU job whose trace names GPU models of which none is the site's (or none
    it can run on) is dropped too (``gpu_spec_no_site_model``). Returns the jobs per policy
    and the dropped counts by reason.
    """
    base = ClusterModel.from_site(site)
    pols = {p: params.policy(p) for p in policies}
    empty_models = {p: node_weights(base, pols[p], params) for p in policies}
    # The site each policy's hook reads: with the ``speeds`` part, the class orders
    # ``learn speeds --rank`` proposes (one site object, so one Lua runtime, for all).
    learned = learned_site(site, params)
    sites = {p: site if "speeds" in pols[p].without else learned for p in policies}
    dropped = {"fractional": 0, "oversize": 0, "gpu_spec_no_site_model": 0}
    out: dict[str, list[SimJob]] = {p: [] for p in policies}
    verdicts: dict[tuple[str, Request, str], bool] = {}
    for index, tj in enumerate(trace_jobs):
        c = classify(tj, params)
        if c is None:
            dropped["fractional"] += 1
            continue
        times = runtimes(c, fmt, base.gpu_models, params)
        if tj.gpu_models and c.gpus:
            spec, _ = site_gpu_models(tj.gpu_models, base.gpu_models, params.trace_gpu_models)
            if not any(math.isfinite(times[base.gpu_models.index(m)]) for m in spec):
                dropped["gpu_spec_no_site_model"] += 1
                continue
            c = replace(c, spec=spec)
        made: dict[str, SimJob] = {}
        for p in policies:
            pol = pols[p]
            model = empty_models[p]
            req, partition, prio = request_for(c, pol, params, sites[p], model, times)
            key = (p, req, partition)
            if key not in verdicts:
                verdicts[key] = _fits_empty(model, req, partition, site, pol)
            if not verdicts[key]:
                break
            kr = compile_request(model, req, score_weights(pol))
            allowed = [m for m, r in enumerate(kr.gpu_rank) if r >= 0] if kr.gpus else []
            if kr.cpu_only:
                limit_base = times[-1]
            elif kr.gpus:
                limit_base = max(times[m] for m in allowed if math.isfinite(times[m]))
            else:
                limit_base = max(times.values())
            made[p] = SimJob(
                index=index, id=tj.id, cls=c.cls, submit=tj.submit, priority=prio,
                partition=partition, kr=kr, runtime=times,
                time_limit=limit_base * params.time_limit_factor, gpus=kr.gpus * kr.nodes,
                ranked=(ranked_for(site, req, partition)
                        if pol.use_classes and "fallback" not in pol.without else ()),
            )
        if len(made) != len(policies):
            dropped["oversize"] += 1
            continue
        for p, j in made.items():
            out[p].append(j)
    return out, dropped


def trace_values(trace_jobs: Sequence[TraceJob], site: Site, params: Params,
                 policies: Sequence[str]) -> dict[str, object]:
    """What the replay made of the trace's values that a site or the parameters interpret,
    for the output's ``meta``: each GPU model name of the trace's constraints (Alibaba
    ``gpu_spec``) with the site model it maps to (``null``: none, the alternative is
    dropped; a job left with none is dropped, ``dropped.gpu_spec_no_site_model``), and each
    QOS that ``[jobs] priority_by_qos`` does not name (replayed as ``normal`` by the policies
    that use priorities)."""
    models = site.gpu_models()
    names: dict[str, int] = {}
    with_spec = partly = 0
    for tj in trace_jobs:
        if tj.gpu_models and tj.gpus:
            with_spec += 1
            _, unknown = site_gpu_models(tj.gpu_models, models, params.trace_gpu_models)
            partly += bool(unknown) and len(unknown) < len(tj.gpu_models)
            for n in tj.gpu_models:
                names[n] = names.get(n, 0) + 1

    def site_model(name: str) -> str | None:
        mapped, _ = site_gpu_models([name], models, params.trace_gpu_models)
        return mapped[0] if mapped else None

    spec: dict[str, object] = {
        "jobs": with_spec, "jobs_partly_unknown": partly,
        "names": {n: {"jobs": k, "site_model": site_model(n)} for n, k in sorted(names.items())},
    }
    qos: dict[str, int] = {}
    if any(params.policy(p).use_priority for p in policies):
        for tj in trace_jobs:
            if tj.qos is not None and tj.qos not in params.priority_by_qos:
                qos[tj.qos] = qos.get(tj.qos, 0) + 1
    return {"gpu_spec": spec, "qos_not_in_priority_by_qos": qos}


def partition_nodes(site: Site, model: ClusterModel, name: str) -> tuple[int, ...]:
    """Node indices of a partition ("*" = every node).

    Raises:
        ConfigError: the site has no such partition.
    """
    if name == "*":
        return tuple(range(model.n_nodes))
    part = site.partitions.get(name) or site.ranked.get(name)
    if part is None:
        raise ConfigError(f"partition '{name}' is not in site '{site.name}'; partitions: "
                          f"{', '.join(site.partitions)} (or '*' for all nodes)")
    return tuple(model.node_index(n) for n in part.nodes)


def _fits_empty(model: ClusterModel, req: Request, partition: str, site: Site,
                pol: PolicyParams) -> bool:
    # The policy's partition decides here (it may be '*'), not the request's own.
    idx = partition_nodes(site, model, partition)
    masked = model.only(model.names[i] for i in idx)
    try:
        return place(masked, req, score_weights(pol)).placeable
    except PlacementError:
        return False
