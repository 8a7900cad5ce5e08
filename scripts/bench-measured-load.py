"""Kernel cost of the measured-load input (docs/placement.md, "Measured load and energy").

The `hetslurm bench placement` cluster (synthetic, half loaded) and request mix, timed at the
compiled call (`PlacementCore.place`, inputs prepared beforehand) in three settings:

* ``default``: the default weights (load weight 0), no measured load;
* ``load``: load weight 10, no measured load;
* ``load+measured``: load weight 10, a measured load per node drawn uniformly in 0..1000
  (skipped when the installed package predates ``load_milli``).

``kinds`` instead times each request kind of the mix alone (median of 400 calls, best of 5;
default weights), which is steadier on a shared machine.

Prints one JSON object. Usage (run it against two builds to compare them, alternating):

    python scripts/bench-measured-load.py [NODES] [CALLS] [REPEATS]
    python scripts/bench-measured-load.py kinds
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np


def kinds() -> dict[str, float]:
    from hetslurm.lab.bench_placement import half_loaded, synthetic_layouts, synthetic_requests
    from hetslurm.placement import ClusterModel
    from hetslurm.placement.model import N_INFO, N_T
    from hetslurm.placement.place import _arrays, compile_request

    layouts, tree = synthetic_layouts(10_000)
    model = half_loaded(ClusterModel.from_layouts(layouts, switches=tree))
    core = model.core()
    seen: dict[str, Any] = {}
    for r in synthetic_requests(2000):
        seen.setdefault(repr(r), r)
    out: dict[str, float] = {}
    for k, r in enumerate(seen.values()):
        kr = compile_request(model, r)
        a = _arrays(kr)
        width = 1 + kr.nodes * max(kr.gpus, kr.fpgas, kr.cores, N_T)
        bufs = [np.full(width, -1, dtype=np.int32) for _ in range(4)]
        terms, info = np.zeros(width, dtype=np.int64), np.zeros(N_INFO, dtype=np.int64)
        best = []
        for _ in range(5):
            ts = []
            for _ in range(400):
                t0 = time.perf_counter_ns()
                core.place(*a, False, *bufs, terms, info)
                ts.append(time.perf_counter_ns() - t0)
            best.append(float(np.median(ts)) / 1e3)
        out[f"{k}: {kr.nodes}x{kr.gpus} GPU {kr.fpgas} FPGA {kr.cores} cores"] = round(min(best), 2)
    return out


def main(argv: list[str]) -> dict[str, Any]:
    from hetslurm.lab.bench_placement import half_loaded, synthetic_layouts, synthetic_requests
    from hetslurm.placement import ClusterModel, ScoreWeights
    from hetslurm.placement.model import N_INFO, N_T
    from hetslurm.placement.place import _arrays, compile_request

    nodes = int(argv[0]) if argv else 10_000
    calls = int(argv[1]) if len(argv) > 1 else 5000
    repeats = int(argv[2]) if len(argv) > 2 else 3
    layouts, tree = synthetic_layouts(nodes)
    base = half_loaded(ClusterModel.from_layouts(layouts, switches=tree))
    requests = synthetic_requests(calls)
    settings: list[tuple[str, Any, ScoreWeights]] = [
        ("default", base, ScoreWeights()),
        ("load", base, ScoreWeights(load=10)),
    ]
    if hasattr(base, "with_measured_load"):
        rng = np.random.default_rng(3)
        loaded = base.with_measured_load(rng.integers(0, 1001, nodes, dtype=np.int32))
        settings.append(("load+measured", loaded, ScoreWeights(load=10)))
    out: dict[str, Any] = {"nodes": nodes, "calls": calls, "repeats": repeats, "results": {}}
    for name, model, weights in settings:
        core = model.core()
        compiled = [compile_request(model, r, weights) for r in requests]
        width = 1 + max(kr.nodes * max(kr.gpus, kr.fpgas, kr.cores, N_T) for kr in compiled)
        bufs = [np.full(width, -1, dtype=np.int32) for _ in range(4)]
        terms = np.zeros(width, dtype=np.int64)
        info = np.zeros(N_INFO, dtype=np.int64)
        args = [_arrays(kr) for kr in compiled]
        p50s, means = [], []
        for _ in range(repeats):
            times = []
            for a in args:
                t0 = time.perf_counter_ns()
                core.place(*a, False, *bufs, terms, info)
                times.append((time.perf_counter_ns() - t0) / 1e3)
            p50s.append(float(np.percentile(times, 50)))
            means.append(float(np.mean(times)))
        out["results"][name] = {"kernel_p50_us": [round(x, 2) for x in p50s],
                                "kernel_mean_us": [round(x, 2) for x in means]}
    return out


if __name__ == "__main__":
    json.dump(kinds() if sys.argv[1:2] == ["kinds"] else main(sys.argv[1:]), sys.stdout,
              indent=1)
    sys.stdout.write("\n")
