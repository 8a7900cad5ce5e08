"""One simulation: a trace, a site, the parameters, policies x loads; measures and ratios."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetslurm.errors import ConfigError
from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.easy import Easy
from hetslurm.simulate.loop import Backfill, ReplayResult, replay
from hetslurm.simulate.measures import measure
from hetslurm.simulate.params import BASELINES, Params
from hetslurm.simulate.slurm_backfill import SlurmRules
from hetslurm.simulate.traces import Trace, TraceJob
from hetslurm.simulate.workload import (
    SimJob,
    build_jobs,
    node_weights,
    partition_names,
    partition_nodes,
    trace_values,
)
from hetslurm.site.model import Site


@dataclass(frozen=True)
class RunTrace:
    """Per-job outcomes of one replay, for plots: waits (s) and (start, end, GPUs)."""

    waits: list[float]
    intervals: list[tuple[float, float, int]]


@dataclass(frozen=True)
class SimulationResult:
    """Rows (one per policy, load and seed) and a summary per policy."""

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    traces: dict[tuple[str, float], RunTrace] = field(default_factory=dict, repr=False)
    #: With several seeds: per (policy, load), each measure's median and min-max.
    spread: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {"meta": self.meta, "rows": self.rows, "summary": self.summary}
        if self.spread:
            out["spread"] = self.spread
        return out


def run_replay(params: Params, model: ClusterModel, jobs: Sequence[SimJob],
               parts: Mapping[str, Sequence[int]], *, load: float,
               backfill: str | None = None,
               progress: Callable[[int], None] | None = None) -> ReplayResult:
    """One replay with the backfill model ``backfill`` (default: ``[scheduler] backfill``)."""
    return replay(model, jobs, parts, backfill_model(params, backfill), load=load,
                  progress=progress)


def backfill_model(params: Params, name: str | None = None) -> Backfill:
    """The loop's plug-in for the backfill model ``name`` (default: ``[scheduler]
    backfill``), with the parameter file's depth and window."""
    if (name or params.backfill) == "slurm":
        return SlurmRules(params.backfill_depth, params.backfill_window_s,
                          will_run=params.will_run)
    return Easy(params.backfill_depth)


@dataclass
class TaskResult:
    """What one replay task (a seed and some policies, every load) produced."""

    rows: list[dict[str, Any]]
    dropped: dict[str, int]
    jobs_replayed: int
    examples: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    traces: dict[tuple[str, float], RunTrace] = field(default_factory=dict)


def replay_task(site: Site, sample: Sequence[TraceJob], fmt: str, params: Params, *,
                policies: Sequence[str], run: Sequence[str], loads: Sequence[float],
                seed: int, keep_traces: bool = True, label_seed: bool = False,
                progress: Callable[[str, int, int], None] | None = None,
                on_row: Callable[[dict[str, Any]], None] | None = None) -> TaskResult:
    """Replay ``sample`` under each of ``run`` (of ``policies``, which decide together
    which jobs are dropped) at each load, with seed ``seed``; each row handed to ``on_row``
    the moment it is done. ``progress`` gets each replay's label (``"<policy> load <x>"``,
    then ``" seed <s>"`` with ``label_seed``), its finished jobs and its total."""
    p_seed = replace(params, seed=seed)
    jobs, dropped = build_jobs(sample, fmt, site, p_seed, policies)
    base = ClusterModel.from_site(site)
    out = TaskResult([], dropped, len(jobs[policies[0]]) if policies else 0)
    for p in run:
        model = node_weights(base, p_seed.policy(p), p_seed)
        names = partition_names(jobs[p])
        parts = {name: partition_nodes(site, model, name) for name in names}
        for load in loads:
            began = time.perf_counter()
            tick = None
            if progress is not None:
                label = f"{p} load {load:g}" + (f" seed {seed}" if label_seed else "")

                def tick(done: int, _l: str = label, _n: int = len(jobs[p])) -> None:
                    progress(_l, done, _n)
            row: dict[str, Any] = {"policy": p, "load": load, "seed": seed}
            try:
                res = run_replay(p_seed, model, jobs[p], parts, load=load, progress=tick)
            except (ConfigError, KeyboardInterrupt):
                raise
            except Exception as exc:
                # An internal error of the replay: this row says so and the sweep goes on.
                row["error"] = f"{type(exc).__name__}: {exc}"
            else:
                row.update(measure(model, res))
                row["internal_disagreements"] = res.stats.disagreements
                if res.stats.disagreement_examples:
                    out.examples[f"{p}@{load:g}#{seed}"] = res.stats.disagreement_examples
                if keep_traces:
                    out.traces[(p, load)] = RunTrace(
                        [r.start - r.submit for r in res.records],
                        [(r.start, r.end, r.job.gpus) for r in res.records],
                    )
            row["seconds"] = round(time.perf_counter() - began, 3)
            out.rows.append(row)
            if on_row is not None:
                on_row(row)
    return out


def simulate(
    site: Site, trace: Trace, params: Params, *, policies: Sequence[str],
    loads: Sequence[float], first: int = 0, limit: int | None = None,
    seeds: Sequence[int] = (0,), workers: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` (jobs ``first .. first+limit``) under each policy at each load, once
    per seed of the random choices (:func:`hetslurm.simulate.workload.classify`; seed 0
    is the draw every earlier release made).

    Each (policy, load, seed) row is handed to ``on_row`` as soon as it is done. An internal
    error of one replay becomes that row's ``error`` (its measures absent) and the sweep goes
    on; ``meta.failed_rows`` counts them. Each row's ``internal_disagreements`` counts the
    times the free counts admitted what the placement core refused (the core decided);
    ``meta.disagreement_examples`` keeps the first few per row, with job and nodes. With
    ``workers`` > 1 the (seed, policy) tasks run in that many child processes
    (:mod:`hetslurm.simulate.parallel`); the rows are the same as in one process. With more
    than one seed the summary holds the median over the seeds and each figure's min-max
    (``spread``), and ``spread`` the same per (policy, load) (docs/simulate.md).

    Raises:
        ConfigError: a policy the parameter file does not define, a load <= 0, a seed < 0
            or given twice, a partition the site lacks, or a speed the parameter file lacks.
    """
    # Each policy refused here, before any replay, when it is not one.
    without = {p: sorted(params.policy(p).without) for p in policies}
    if not loads or any(x <= 0 for x in loads):
        raise ConfigError("--load values must be > 0")
    if not seeds or any(x < 0 for x in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seed values must be distinct integers >= 0, got {list(seeds)}")
    if workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}")
    sample = trace.jobs[first: None if limit is None else first + limit]
    if not sample:
        raise ConfigError(f"{trace.path}: no job in the selected range")
    t0 = sample[0].submit
    sample = tuple(replace(j, submit=j.submit - t0) for j in sample)
    tasks = [(seed, p) for seed in seeds for p in policies]
    results: list[TaskResult]
    if workers > 1 and len(tasks) > 1:
        from hetslurm.simulate.parallel import run_parallel

        results = run_parallel(site, trace, params, policies=policies, loads=loads,
                               first=first, limit=limit, tasks=tasks, workers=workers,
                               keep_traces_seed=seeds[0], progress=progress, on_row=on_row)
    else:
        results = [replay_task(site, sample, trace.format, params, policies=policies,
                               run=policies, loads=loads, seed=seed,
                               keep_traces=seed == seeds[0], label_seed=len(seeds) > 1,
                               progress=progress, on_row=on_row) for seed in seeds]
    order = {(seed, p, x): i for i, (seed, p, x) in enumerate(
        (seed, p, x) for seed in seeds for p in policies for x in loads)}
    rows = sorted((r for res in results for r in res.rows),
                  key=lambda r: order[(r["seed"], r["policy"], r["load"])])
    traces: dict[tuple[str, float], RunTrace] = {}
    examples: dict[str, list[dict[str, object]]] = {}
    for res in results:
        traces.update(res.traces)
        examples.update(res.examples)
    first_seed = [res for res in results if res.rows and res.rows[0]["seed"] == seeds[0]]
    head = first_seed[0] if first_seed else results[0]
    if len(seeds) == 1:
        summary = _summary(rows, params, policies, loads)
        spread: list[dict[str, Any]] = []
        strongest = strongest_baseline(rows, params, policies, loads)
    else:
        summary, spread, strongest = _seeded_summary(rows, params, policies, loads, seeds)
    meta = {
        "site": site.name, "trace": trace.path, "format": trace.format,
        "first": first, "jobs_selected": len(sample),
        "jobs_replayed": head.jobs_replayed,
        "dropped": head.dropped, "skipped_by_reader": trace.skipped,
        "compression": trace.compression, "unused_columns": list(trace.unused_columns),
        "trace_values": trace_values(sample, site, params, policies), "params": params.path,
        "backfill": params.backfill, "backfill_depth": params.backfill_depth,
        "backfill_window_s": params.backfill_window_s,
        "without": {p: parts for p, parts in without.items() if parts},
        "seeds": list(seeds), "workers": workers,
        "failed_rows": sum(1 for r in rows if "error" in r),
        "disagreement_examples": examples,
        "strongest_baseline": strongest,
    }
    if len(seeds) > 1:
        by_seed = {res.rows[0]["seed"]: res.jobs_replayed for res in results if res.rows}
        meta["jobs_replayed_by_seed"] = {str(k): by_seed[k] for k in seeds if k in by_seed}
    return SimulationResult(rows, summary, meta, traces, spread)


#: Row measures whose median and min-max over the seeds ``spread`` gives.
SPREAD_KEYS = ("jobs", "unfinished", "mean_wait_s", "median_wait_s", "p95_wait_s",
               "mean_jct_s", "makespan_s", "completions_per_h_saturated", "mean_queue_depth",
               "energy_kwh")


def _median(vals: Sequence[float]) -> float:
    v = sorted(vals)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def _stat(vals: Sequence[Any]) -> tuple[float | None, list[float] | None]:
    """The median and [min, max] of the numbers among ``vals`` (None where there is none)."""
    nums = [float(v) for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums:
        return None, None
    return round(_median(nums), 4), [round(min(nums), 4), round(max(nums), 4)]


def _seeded_summary(rows: list[dict[str, Any]], params: Params, policies: Sequence[str],
                    loads: Sequence[float], seeds: Sequence[int],
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The summary as the median over seeds, its spread, and the per-(policy, load) spread.

    The strongest baseline is decided once, on the median rows (a baseline with a failed row
    at any seed ranks last), and every seed's ratios are against it."""
    by = {(r["seed"], r["policy"], r["load"]): r for r in rows}
    spread: list[dict[str, Any]] = []
    med_rows: list[dict[str, Any]] = []
    for p in policies:
        for x in loads:
            rs = [by[(s, p, x)] for s in seeds]
            entry: dict[str, Any] = {"policy": p, "load": x, "seeds": len(seeds),
                                     "failed": sum(1 for r in rs if "error" in r)}
            med: dict[str, Any] = {"policy": p, "load": x}
            for k in SPREAD_KEYS:
                m, mm = _stat([r.get(k) for r in rs])
                entry[k] = {"median": m, "min": None if mm is None else mm[0],
                            "max": None if mm is None else mm[1]}
                med[k] = m
            if entry["failed"]:
                med["error"] = f"{entry['failed']} seed(s) failed"
            spread.append(entry)
            med_rows.append(med)
    strongest = strongest_baseline(med_rows, params, policies, loads)
    per_seed = [{e["policy"]: e for e in _summary(
        [r for r in rows if r["seed"] == s], params, policies, loads, strongest=strongest)}
        for s in seeds]
    summary = []
    for p in policies:
        entries = [ps[p] for ps in per_seed]
        out: dict[str, Any] = {"policy": p, "seeds": len(seeds)}
        out_spread: dict[str, Any] = {}

        def merge(key: str, vals: list[Any], into: dict[str, Any], sp: dict[str, Any]) -> None:
            m, mm = _stat(vals)
            into[key] = m
            sp[key] = mm

        for key, v0 in entries[0].items():
            if key in ("policy", "baseline", "bounded_mean_wait_s"):
                out[key] = v0
            elif key == "vs":
                out["vs"], out_spread["vs"] = {}, {}
                for b in v0:
                    out["vs"][b], out_spread["vs"][b] = {}, {}
                    for k2 in v0[b]:
                        merge(k2, [e["vs"][b][k2] for e in entries], out["vs"][b],
                              out_spread["vs"][b])
            else:
                merge(key, [e.get(key) for e in entries], out, out_spread)
        out["spread"] = out_spread
        summary.append(out)
    return summary, spread, strongest


def strongest_baseline(rows: list[dict[str, Any]], params: Params,
                       policies: Sequence[str], loads: Sequence[float]) -> str | None:
    """The baseline of the run a claim must beat: the highest bounded load
    (:func:`_bounded`), then the lowest mean wait summed over the swept loads; a baseline
    with a failed row ranks below every complete one. ``None``: no baseline was replayed."""
    by = {(r["policy"], r["load"]): r for r in rows}
    cands = [p for p in policies if p in BASELINES]
    if not cands:
        return None

    def key(b: str) -> tuple[int, float, float]:
        rs = [by[(b, x)] for x in loads]
        if any("error" in r for r in rs):
            return (1, 0.0, 0.0)
        mbl = _bounded(by, b, params, loads)
        return (0, -(mbl if mbl is not None else -1.0), sum(r["mean_wait_s"] for r in rs))

    return min(cands, key=lambda b: (key(b), cands.index(b)))


def _bounded(by: dict[tuple[str, float], dict[str, Any]], p: str, params: Params,
             loads: Sequence[float]) -> float | None:
    """The highest swept load at which ``p``'s mean wait is bounded with every job done."""
    ok = [x for x in loads if "error" not in by[(p, x)]
          and by[(p, x)]["mean_wait_s"] <= params.bounded_mean_wait_s
          and by[(p, x)]["unfinished"] == 0]
    return max(ok) if ok else None


def _versus(by: dict[tuple[str, float], dict[str, Any]], p: str, b: str, params: Params,
            loads: Sequence[float]) -> dict[str, Any]:
    """``p`` against baseline ``b`` (docs/simulate.md, "Summary")."""
    mp, mb = _bounded(by, p, params, loads), _bounded(by, b, params, loads)
    out: dict[str, Any] = {"sustainable_load_ratio": _ratio(mp, mb)}
    for x in loads:
        a, c = by[(p, x)], by[(b, x)]
        out[f"mean_wait_ratio@{x:g}"] = _ratio(a.get("mean_wait_s"), c.get("mean_wait_s"))
        out[f"jct_ratio@{x:g}"] = _ratio(a.get("mean_jct_s"), c.get("mean_jct_s"))
    return out


def _summary(rows: list[dict[str, Any]], params: Params, policies: Sequence[str],
             loads: Sequence[float], *, strongest: str | None = "") -> list[dict[str, Any]]:
    """Per policy: the highest load whose mean wait is bounded, its ratios against the
    strongest baseline of the run (flat keys, ``baseline`` names it; ``strongest`` fixes
    it, the default decides it from ``rows``) and against each other baseline (``vs``)."""
    by = {(r["policy"], r["load"]): r for r in rows}
    if strongest == "":
        strongest = strongest_baseline(rows, params, policies, loads)
    out = []
    for p in policies:
        entry: dict[str, Any] = {
            "policy": p,
            "max_bounded_load": _bounded(by, p, params, loads),
            "bounded_mean_wait_s": params.bounded_mean_wait_s,
        }
        if strongest is not None and p != strongest:
            entry["baseline"] = strongest
            entry.update(_versus(by, p, strongest, params, loads))
        others = [b for b in policies if b in BASELINES and b != p]
        if others:
            entry["vs"] = {b: _versus(by, p, b, params, loads) for b in others}
        out.append(entry)
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)
