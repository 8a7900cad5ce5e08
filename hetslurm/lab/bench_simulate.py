"""``hetslurm bench simulate``: replay speed per policy on the Alibaba and Philly traces."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetslurm.errors import ConfigError
from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.params import BACKFILLS, Params
from hetslurm.simulate.run import run_replay
from hetslurm.simulate.traces import TraceError, read_trace
from hetslurm.simulate.workload import build_jobs, node_weights, partition_names, partition_nodes
from hetslurm.site.model import Site
from hetslurm.traces import traces_dir

#: (name, path under $HETSLURM_TRACES, format, load): loads chosen so that the 100-GPU case
#: study queues but does not diverge (docs/evidence.md: Alibaba bounded up to about 4,
#: Philly up to about 0.05).
DEFAULT_RUNS = (
    ("alibaba", "alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba", 4.0),
    ("philly", "sia-philly/philly.csv", "philly", 0.05),
)


def bench_simulate(site: Site, params: Params, *, policies: Sequence[str],
                   limit: int | None = None,
                   runs: Sequence[tuple[str, str, str, float]] = DEFAULT_RUNS,
                   loads: Mapping[str, Sequence[float]] | None = None,
                   backfills: Sequence[str] = ("easy", "slurm"),
                   ) -> list[dict[str, Any]]:
    """Time one replay per trace, load, backfill model and policy (job preparation
    excluded). Each row carries the machine's 1-minute load average before and after it
    (``loadavg_1m``) and, for a model other than EASY, its time over the EASY replay of
    the same trace, load and policy in this run (``vs_easy``; EASY runs first).

    ``loads`` replaces a run's load by the given ones, by trace name (``{"philly": [0.1,
    0.2]}``); traces it does not name keep their default load.

    Raises:
        TraceError: ``$HETSLURM_TRACES`` lacks a trace.
        ConfigError: ``loads`` names a trace the runs lack, or a load <= 0.
    """
    if not backfills or any(b not in BACKFILLS for b in backfills):
        raise ConfigError(f"backfill models must be among {', '.join(BACKFILLS)}")
    names = {r[0] for r in runs}
    for name, xs in (loads or {}).items():
        if name not in names:
            raise ConfigError(f"no benchmark trace '{name}'; traces: {', '.join(sorted(names))}")
        if not xs or any(x <= 0 for x in xs):
            raise ConfigError(f"loads for '{name}' must be > 0")
    root = traces_dir()
    base = ClusterModel.from_site(site)
    out: list[dict[str, Any]] = []
    for name, rel, fmt, default_load in runs:
        path = Path(root) / rel
        if not path.is_file():
            raise TraceError(f"{path}: trace missing (set HETSLURM_TRACES)")
        trace = read_trace(path, fmt)
        sample = trace.jobs[:limit]
        jobs, dropped = build_jobs(sample, fmt, site, params, policies)
        for load, bf, p in ((x, b, p) for x in (loads or {}).get(name, (default_load,))
                            for b in backfills for p in policies):
            model = node_weights(base, params.policy(p), params)
            parts = {n: partition_nodes(site, model, n) for n in partition_names(jobs[p])}
            avg_before = os.getloadavg()[0]
            began = time.perf_counter()
            res = run_replay(params, model, jobs[p], parts, load=load, backfill=bf)
            seconds = time.perf_counter() - began
            span = max(res.makespan - res.first_submit, 1e-9)
            easy = next((r["seconds"] for r in out if r["trace"] == name and r["load"] == load
                         and r["policy"] == p and r["model"] == "easy"), None)
            out.append({
                "trace": name, "policy": p, "model": bf, "backfill": bf, "load": load,
                # The seed of the class draw (simulate --seed); the bench times seed 0.
                "seed": params.seed, "jobs": len(jobs[p]),
                "dropped": sum(dropped.values()), "seconds": round(seconds, 3),
                "vs_easy": (round(seconds / easy, 2) if bf != "easy" and easy else None),
                "loadavg_1m": [round(avg_before, 2), round(os.getloadavg()[0], 2)],
                "jobs_per_s": round(len(jobs[p]) / seconds, 1) if seconds > 0 else None,
                "mean_queue_depth": round(res.stats.queue_area / span, 3),
                "scheduling_passes": res.stats.passes,
                "reservations": res.stats.reservations,
                "core_calls": res.stats.core_calls,
                "core_builds": res.stats.core_builds,
            })
    return out
