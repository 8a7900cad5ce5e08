"""Measures of one replay: waits, completion times, utilisation by device, energy,
throughput in saturated periods, queue depth."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.loop import ReplayResult


def measure(model: ClusterModel, result: ReplayResult) -> dict[str, Any]:
    """One flat row of measures (seconds, fractions, kWh).

    Utilisation of a device type = busy device-seconds / (devices x span), span = first
    submission to last completion. Energy = every node and GPU idle for the span, plus each
    job's GPUs at busy-minus-idle watts and its share of its nodes' cores at the node's
    busy-minus-idle watts (the site's ``power_*_watts``).
    """
    recs = result.records
    span = max(result.makespan - result.first_submit, 1e-9)
    waits = np.asarray([r.start - r.submit for r in recs]) if recs else np.zeros(1)
    jct = np.asarray([r.end - r.submit for r in recs]) if recs else np.zeros(1)
    gpu_busy: dict[str, float] = defaultdict(float)
    core_busy = {"cpu_nodes": 0.0, "gpu_nodes": 0.0}
    dyn_j = 0.0
    for r in recs:
        run = r.end - r.start
        a = r.alloc
        for n in a.nodes.tolist():
            gm = int(model.gpu_model[n])
            ga, gb = int(model.gpu_offsets[n]), int(model.gpu_offsets[n + 1])
            ng = int(((a.gpus >= ga) & (a.gpus < gb)).sum())
            ca, cb = int(model.core_offsets[n]), int(model.core_offsets[n + 1])
            nc = int(((a.cores >= ca) & (a.cores < cb)).sum())
            if gm >= 0:
                gpu_busy[model.gpu_models[gm]] += ng * run
            core_busy["gpu_nodes" if model.gpu_count[n] else "cpu_nodes"] += nc * run
            dyn_j += run * (ng * max(int(model.gpu_busy_w[n]) - int(model.gpu_idle_w[n]), 0)
                            + nc / int(model.cores_total[n])
                            * max(int(model.power_busy_w[n]) - int(model.power_idle_w[n]), 0))
    idle_w = float(model.power_idle_w.sum() + (model.gpu_count * model.gpu_idle_w).sum())
    row: dict[str, Any] = {
        "jobs": len(recs),
        "unfinished": result.unfinished,
        "mean_wait_s": float(waits.mean()),
        "median_wait_s": float(np.median(waits)),
        "p95_wait_s": float(np.percentile(waits, 95)),
        "mean_jct_s": float(jct.mean()),
        "makespan_s": float(span),
        "completions_per_h_saturated": (
            result.stats.saturated_completions / result.stats.saturated_s * 3600
            if result.stats.saturated_s > 0 else None),
        "saturated_fraction": result.stats.saturated_s / span,
        "mean_queue_depth": result.stats.queue_area / span,
        "backfilled": result.stats.backfilled,
    }
    for i, m in enumerate(model.gpu_models):
        count = int(model.gpu_count[model.gpu_model == i].sum())
        row[f"util_gpu_{m}"] = gpu_busy[m] / (count * span) if count else None
    for kind, mask in (("cpu_nodes", model.gpu_count == 0), ("gpu_nodes", model.gpu_count > 0)):
        total = int(model.cores_total[mask].sum())
        row[f"util_cores_{kind}"] = core_busy[kind] / (total * span) if total else None
    row["energy_kwh"] = (idle_w * span + dyn_j) / 3.6e6
    return row
