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
from hetslurm.simulate.traces import Trace
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
    """Rows (one per policy and load) and a summary per policy."""

    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    meta: dict[str, Any] = field(default_factory=dict)
    traces: dict[tuple[str, float], RunTrace] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "rows": self.rows, "summary": self.summary}


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
        return SlurmRules(params.backfill_depth, params.backfill_window_s)
    return Easy(params.backfill_depth)


def simulate(
    site: Site, trace: Trace, params: Params, *, policies: Sequence[str],
    loads: Sequence[float], first: int = 0, limit: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> SimulationResult:
    """Replay ``trace`` (jobs ``first .. first+limit``) under each policy at each load.

    Each (policy, load) row is handed to ``on_row`` as soon as it is done. An internal error
    of one replay becomes that row's ``error`` (its measures absent) and the sweep goes on;
    ``meta.failed_rows`` counts them. Each row's ``internal_disagreements`` counts the
    times the free counts admitted what the placement core refused (the core decided);
    ``meta.disagreement_examples`` keeps the first few per row, with job and nodes.

    Raises:
        ConfigError: a policy the parameter file does not define, a load <= 0, a partition
            the site lacks, or a speed the parameter file lacks.
    """
    for p in policies:
        if p not in params.policies:
            raise ConfigError(f"{params.path}: no [policy.{p}]; defined: "
                              f"{', '.join(params.policies)}")
    if not loads or any(x <= 0 for x in loads):
        raise ConfigError("--load values must be > 0")
    sample = trace.jobs[first: None if limit is None else first + limit]
    if not sample:
        raise ConfigError(f"{trace.path}: no job in the selected range")
    t0 = sample[0].submit
    sample = tuple(replace(j, submit=j.submit - t0) for j in sample)
    jobs, dropped = build_jobs(sample, trace.format, site, params, policies)
    base = ClusterModel.from_site(site)
    rows: list[dict[str, Any]] = []
    traces: dict[tuple[str, float], RunTrace] = {}
    examples: dict[str, list[dict[str, object]]] = {}
    for p in policies:
        model = node_weights(base, params.policies[p], params)
        names = partition_names(jobs[p])
        parts = {name: partition_nodes(site, model, name) for name in names}
        for load in loads:
            began = time.perf_counter()
            tick = None
            if progress is not None:
                def tick(done: int, _p: str = p, _n: int = len(jobs[p])) -> None:
                    progress(_p, done, _n)
            row: dict[str, Any] = {"policy": p, "load": load}
            try:
                res = run_replay(params, model, jobs[p], parts, load=load, progress=tick)
            except (ConfigError, KeyboardInterrupt):
                raise
            except Exception as exc:
                # An internal error of the replay: this row says so and the sweep goes on.
                row["error"] = f"{type(exc).__name__}: {exc}"
            else:
                row.update(measure(model, res))
                row["internal_disagreements"] = res.stats.disagreements
                if res.stats.disagreement_examples:
                    examples[f"{p}@{load:g}"] = res.stats.disagreement_examples
                traces[(p, load)] = RunTrace(
                    [r.start - r.submit for r in res.records],
                    [(r.start, r.end, r.job.gpus) for r in res.records],
                )
            row["seconds"] = round(time.perf_counter() - began, 3)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    summary = _summary(rows, params, policies, loads)
    meta = {
        "site": site.name, "trace": trace.path, "format": trace.format,
        "first": first, "jobs_selected": len(sample),
        "jobs_replayed": len(jobs[policies[0]]) if policies else 0,
        "dropped": dropped, "skipped_by_reader": trace.skipped,
        "compression": trace.compression, "unused_columns": list(trace.unused_columns),
        "trace_values": trace_values(sample, site, params, policies), "params": params.path,
        "backfill": params.backfill, "backfill_depth": params.backfill_depth,
        "backfill_window_s": params.backfill_window_s,
        "failed_rows": sum(1 for r in rows if "error" in r),
        "disagreement_examples": examples,
        "strongest_baseline": strongest_baseline(rows, params, policies, loads),
    }
    return SimulationResult(rows, summary, meta, traces)


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
             loads: Sequence[float]) -> list[dict[str, Any]]:
    """Per policy: the highest load whose mean wait is bounded, its ratios against the
    strongest baseline of the run (flat keys, ``baseline`` names it) and against each
    other baseline (``vs``)."""
    by = {(r["policy"], r["load"]): r for r in rows}
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
