"""``hetslurm bench placement``: decision latency, batch throughput and memory of the core.

Clusters (each measured in a fresh interpreter, so peak RSS is that entry's alone):

* ``synthetic-1000`` / ``synthetic-10000``: 70 % 8-GPU nodes of three models (h100, a100,
  l40s; two NVLink islands of 4, one per socket), 10 % nodes with two FPGAs, 20 % CPU-only;
  2 sockets x 16 cores; a three-level switch tree (32 nodes per leaf, 8 leaves per spine,
  one core switch); half loaded (each GPU, FPGA and core busy with probability 1/2, memory
  30-70 % in use).
* ``alibaba-1523``: the real node inventory of Alibaba's 2023 GPU cluster
  (``$HETSLURM_TRACES/alibaba-gpu-v2023/openb_node_list_all_node.csv``: cores, memory, GPU
  count and model per node). The trace has no topology, so it is synthesised: two NUMA
  domains per node (cores split evenly, GPUs split evenly in index order); 8-GPU nodes have
  two NVLink islands of 4 (one per socket, as in HGX/DGX boards), 4-GPU nodes one island,
  1- and 2-GPU nodes (T4, P100, A10: PCIe cards) one island per GPU; GPU memory from the
  public model specs (0 = unknown for the anonymised G2/G3); nodes in file order, 32 per
  leaf switch, 8 leaves per spine, one core switch. Requests are the trace's own pods
  (``openb_pod_list_default.csv``: GPUs, a shared GPU counted as one, cores =
  ceil(cpu_milli / 1000)), cycled to fill the sample; half loaded as above.

Per entry: ``p50_us``/``p99_us`` of :func:`~hetslurm.placement.place.place` called from
Python (validation, kernel and result objects included) over a request mix;
``kernel_p50_us`` of the compiled call alone; ``reference_p50_us`` of the plain-Python
implementation (:func:`~hetslurm.placement.reference.place_reference`) on the first requests
of the same sample, and ``speedup`` = reference p50 / API p50 on those same requests;
``batch_s`` for :func:`~hetslurm.placement.place.place_batch` of ``batch_jobs`` requests;
``peak_rss_mb`` of the entry's process. Benchmarks report; nothing here asserts a timing.
"""

from __future__ import annotations

import csv
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from hetslurm.placement.model import ClusterModel, GpuLayout, NodeLayout, StateArrays
from hetslurm.request.language import Locality, Request
from hetslurm.traces import traces_dir

#: Targets from issue 4 at 10,000 nodes (reported beside the figures, never asserted).
TARGETS = {"p50_us": 200.0, "p99_us": 1000.0, "speedup": 50.0, "batch_s": 2.0,
           "peak_rss_mb": 300.0}
SYNTH_MODELS = ("h100", "a100", "l40s")
ALIBABA_DIR = "alibaba-gpu-v2023"
ALIBABA_NODES = "openb_node_list_all_node.csv"
ALIBABA_PODS = "openb_pod_list_default.csv"
#: GPU memory of the trace's models (MiB, public specs); G2/G3 are anonymised.
ALIBABA_GPU_MEM = {"T4": 16384, "P100": 16384, "V100M16": 16384, "V100M32": 32768,
                   "A10": 24576}
NODES_PER_LEAF, LEAVES_PER_SPINE = 32, 8

Log = Callable[[str], None]


# --- clusters ---------------------------------------------------------------------------------


def _tree(n: int) -> tuple[list[str], dict[str, str | None]]:
    """Leaf of each node and a three-level tree: leaves -> spines -> one core switch."""
    leaves = math.ceil(n / NODES_PER_LEAF)
    spines = math.ceil(leaves / LEAVES_PER_SPINE)
    tree: dict[str, str | None] = {"core": None}
    tree.update({f"spine{s}": "core" for s in range(spines)})
    tree.update({f"leaf{x}": f"spine{x // LEAVES_PER_SPINE}" for x in range(leaves)})
    return [f"leaf{i // NODES_PER_LEAF}" for i in range(n)], tree


def synthetic_layouts(n: int, seed: int = 0) -> tuple[list[NodeLayout], dict[str, str | None]]:
    """``n`` nodes: 70 % 8-GPU (three models), 10 % 2-FPGA, 20 % CPU-only, shuffled."""
    rng = np.random.default_rng(seed)
    kinds = rng.permutation(np.repeat([0, 1, 2], [round(n * 0.7), round(n * 0.1),
                                                  n - round(n * 0.7) - round(n * 0.1)]))
    leaves, tree = _tree(n)
    mem = {"h100": 81920, "a100": 40960, "l40s": 49152}
    watts = {"h100": (70, 700), "a100": (50, 400), "l40s": (40, 350)}
    out = []
    for i, kind in enumerate(kinds):
        base = NodeLayout(name=f"n{i:05d}", cores_per_numa=(16, 16), mem_mib=512 * 1024,
                          leaf=leaves[i], weight=1, power_idle_w=200, power_busy_w=600)
        if kind == 0:
            m = SYNTH_MODELS[int(rng.integers(0, 3))]
            gpus = tuple(GpuLayout(island=g // 4, numa=g // 4, memory_mib=mem[m])
                         for g in range(8))
            out.append(replace(base, gpu_model=m, gpus=gpus, weight=100 + SYNTH_MODELS.index(m),
                               gpu_idle_w=watts[m][0], gpu_busy_w=watts[m][1]))
        elif kind == 1:
            out.append(replace(base, fpga_model="u280", fpgas=2, weight=10, fpga_idle_w=25,
                               fpga_busy_w=225))
        else:
            out.append(base)
    return out, tree


def alibaba_layouts(path: Path) -> tuple[list[NodeLayout], dict[str, str | None]]:
    """The trace's nodes with the synthesised topology described in the module docstring."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    leaves, tree = _tree(len(rows))
    out = []
    for i, r in enumerate(rows):
        cores = max(2, int(r["cpu_milli"]) // 1000)
        half = cores // 2
        count = int(r["gpu"])
        model = r["model"] or None
        per_island = 4 if count >= 4 else 1
        per_numa = max(1, count // 2)
        gpus = tuple(
            GpuLayout(island=g // per_island, numa=min(g // per_numa, 1),
                      memory_mib=ALIBABA_GPU_MEM.get(model or "", 0))
            for g in range(count)
        ) if model and count else ()
        out.append(NodeLayout(
            name=r["sn"], cores_per_numa=(half, cores - half), mem_mib=int(r["memory_mib"]),
            gpu_model=model if gpus else None, gpus=gpus, leaf=leaves[i],
            weight=1 if not gpus else 100,
        ))
    return out, tree


def half_loaded(model: ClusterModel, seed: int = 1) -> ClusterModel:
    """Each GPU, FPGA and core busy with probability 1/2; memory 30-70 % in use."""
    rng = np.random.default_rng(seed)

    def flags(size: int) -> Any:
        return (rng.random(size) >= 0.5).astype(np.uint8)

    n = model.n_nodes
    mem_free = (model.mem_total_mib * rng.uniform(0.3, 0.7, n)).astype(np.int64)
    state = StateArrays(
        available=np.ones(n, dtype=np.uint8),
        gpu_free=flags(len(model.gpu_island)),
        fpga_free=flags(int(model.fpga_offsets[-1])),
        core_free=flags(len(model.core_numa)),
        mem_free_mib=mem_free,
        free_at=np.full(n, math.inf),
        time=0.0,
    )
    return model.with_arrays(state)


# --- requests ---------------------------------------------------------------------------------


def synthetic_requests(count: int, seed: int = 2) -> list[Request]:
    """A mix: 1/2/4/8-GPU jobs with model lists and locality, 2-node jobs, FPGA, CPU."""
    rng = np.random.default_rng(seed)
    mix: list[tuple[float, Request]] = [
        (0.25, Request(gpus_per_node=1)),
        (0.15, Request(gpus_per_node=2, gpu_models=("h100", "a100"), cores_per_node=4)),
        (0.15, Request(gpus_per_node=4, gpu_models=("a100", "l40s"), cores_per_node=8,
                       locality=Locality(nvlink="preferred"))),
        (0.05, Request(gpus_per_node=8, gpu_models=("h100",), cores_per_node=16)),
        (0.05, Request(nodes=2, gpus_per_node=8, cores_per_node=16,
                       locality=Locality(switch="preferred"))),
        (0.05, Request(gpus_per_node=2, cores_per_node=4, locality=Locality(nvlink="required",
                                                                            numa="required"))),
        (0.10, Request(fpgas_per_node=1, cores_per_node=2)),
        (0.20, Request(cores_per_node=8, mem_per_node_mib=32768, cpu_only=True)),
    ]
    p = np.asarray([w for w, _ in mix])
    picks = rng.choice(len(mix), size=count, p=p / p.sum())
    return [mix[int(k)][1] for k in picks]


def alibaba_requests(path: Path, count: int, max_cores: int) -> list[Request]:
    """The trace's pods as requests (whole GPUs; a shared GPU counts as one), cycled."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    base = []
    for r in rows:
        gpus = int(r["num_gpu"])
        cores = min(max_cores, max(1, math.ceil(int(r["cpu_milli"]) / 1000)))
        base.append(Request(gpus_per_node=gpus, cores_per_node=cores,
                            mem_per_node_mib=int(r["memory_mib"]) or None))
    return [base[i % len(base)] for i in range(count)]


# --- measurement ------------------------------------------------------------------------------


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def measure(name: str, model: ClusterModel, requests: Sequence[Request], *, calls: int,
            reference_calls: int, batch_jobs: int, log: Log) -> dict[str, Any]:
    """Time one cluster (see the module docstring for what each figure is)."""
    from hetslurm.placement.model import N_INFO, N_T
    from hetslurm.placement.place import _arrays, compile_request, place, place_batch
    from hetslurm.placement.reference import PlainCluster, place_reference

    sample = [requests[i % len(requests)] for i in range(calls)]
    model.core()  # build and cache the compiled core (and its index) outside the timing
    for req in sample[:50]:
        place(model, req)  # warm caches and the allocator
    api: list[float] = []
    placed = 0
    for req in sample:
        t0 = time.perf_counter_ns()
        p = place(model, req)
        api.append((time.perf_counter_ns() - t0) / 1e3)
        placed += p.placeable
    # The compiled call alone, with inputs and outputs prepared beforehand.
    core = model.core()
    kern: list[float] = []
    compiled = [compile_request(model, r) for r in sample]
    width = 1 + max(kr.nodes * max(kr.gpus, kr.fpgas, kr.cores, N_T) for kr in compiled)
    o_nodes, o_gpus, o_fpgas, o_cores = (np.full(width, -1, dtype=np.int32) for _ in range(4))
    terms = np.zeros(width, dtype=np.int64)
    info = np.zeros(N_INFO, dtype=np.int64)
    for kr in compiled:
        args = _arrays(kr)
        t0 = time.perf_counter_ns()
        core.place(*args, False, o_nodes, o_gpus, o_fpgas, o_cores, terms, info)
        kern.append((time.perf_counter_ns() - t0) / 1e3)
    log(f"{name}: place() p50 {_pct(api, 50):.1f} us, p99 {_pct(api, 99):.1f} us; "
        f"kernel p50 {_pct(kern, 50):.1f} us")
    pc = PlainCluster.from_model(model)
    ref: list[float] = []
    for kr in compiled[:reference_calls]:
        t0 = time.perf_counter_ns()
        place_reference(model, kr, pc)
        ref.append((time.perf_counter_ns() - t0) / 1e3)
    same = api[:reference_calls]
    log(f"{name}: reference p50 {_pct(ref, 50):.0f} us over {len(ref)} requests")
    batch = [requests[i % len(requests)] for i in range(batch_jobs)]
    b0 = time.perf_counter()
    results = place_batch(model, batch)
    batch_s = time.perf_counter() - b0
    log(f"{name}: batch of {batch_jobs} in {batch_s:.2f} s")
    return {
        "name": name,
        "nodes": model.n_nodes,
        "gpus": len(model.gpu_island),
        "gpu_models": len(model.gpu_models),
        "calls": len(api),
        "placeable_share": round(placed / len(api), 3) if api else None,
        "p50_us": round(_pct(api, 50), 2),
        "p99_us": round(_pct(api, 99), 2),
        "max_us": round(max(api), 1) if api else None,
        "kernel_p50_us": round(_pct(kern, 50), 2),
        "kernel_p99_us": round(_pct(kern, 99), 2),
        "reference_calls": len(ref),
        "reference_p50_us": round(_pct(ref, 50), 1),
        "speedup": round(_pct(ref, 50) / _pct(same, 50), 1) if ref else None,
        "batch_jobs": batch_jobs,
        "batch_s": round(batch_s, 3),
        "batch_placed": sum(r.placeable for r in results),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def run_entry(name: str, *, calls: int, reference_calls: int, batch_jobs: int,
              log: Log) -> dict[str, Any]:
    """Build and measure one entry (``synthetic-N`` or ``alibaba``) in this process.

    Raises:
        FileNotFoundError: ``alibaba`` and the traces folder is missing.
        ValueError: an unknown entry name.
    """
    t0 = time.perf_counter()
    if name.startswith("synthetic-"):
        n = int(name.split("-", 1)[1])
        layouts, tree = synthetic_layouts(n)
        requests = synthetic_requests(max(calls, batch_jobs))
    elif name == "alibaba":
        folder = traces_dir() / ALIBABA_DIR
        nodes_csv = folder / ALIBABA_NODES
        if not nodes_csv.is_file():
            raise FileNotFoundError(f"{nodes_csv} is missing (set HETSLURM_TRACES)")
        layouts, tree = alibaba_layouts(nodes_csv)
        requests = alibaba_requests(folder / ALIBABA_PODS, max(calls, batch_jobs),
                                    max_cores=max(sum(x.cores_per_numa) for x in layouts))
        name = f"alibaba-{len(layouts)}"
    else:
        raise ValueError(f"unknown benchmark entry {name!r}")
    model = half_loaded(ClusterModel.from_layouts(layouts, switches=tree))
    log(f"{name}: built in {time.perf_counter() - t0:.1f} s")
    out = measure(name, model, requests, calls=calls, reference_calls=reference_calls,
                  batch_jobs=batch_jobs, log=log)
    out["build_s"] = round(time.perf_counter() - t0, 2)
    return out


def bench_placement(sizes: Sequence[int] = (1000, 10_000), *, alibaba: bool = True,
                    calls: int = 5000, reference_calls: int = 20, batch_jobs: int = 10_000,
                    log: Log = lambda _m: None) -> dict[str, Any]:
    """Run every entry in its own interpreter and collect ``{"results": [...], ...}``."""
    from hetslurm.lab.child import python_module
    from hetslurm.process import run_command

    names = [f"synthetic-{n}" for n in sizes] + (["alibaba"] if alibaba else [])
    results: list[dict[str, Any]] = []
    skipped: list[dict[str, str]] = []
    for name in names:
        if name == "alibaba" and not (traces_dir() / ALIBABA_DIR / ALIBABA_NODES).is_file():
            msg = (f"skipped: {traces_dir() / ALIBABA_DIR / ALIBABA_NODES} not found "
                   "(set HETSLURM_TRACES to the traces folder)")
            log(f"alibaba: {msg}")
            skipped.append({"name": "alibaba", "reason": msg})
            continue
        argv = python_module("hetslurm.lab.bench_placement", name, str(calls),
                             str(reference_calls), str(batch_jobs))
        res = run_command(argv, timeout=1800)
        for line in res.stderr.splitlines():
            log(line)
        results.append(json.loads(res.stdout))
    return {"results": results, "skipped": skipped, "targets_at_10000_nodes": TARGETS,
            "python": sys.version.split()[0], "cpus": os.cpu_count()}


def _main(argv: Sequence[str]) -> None:
    name, calls, ref_calls, batch = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    out = run_entry(name, calls=calls, reference_calls=ref_calls, batch_jobs=batch,
                    log=lambda m: print(m, file=sys.stderr, flush=True))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    _main(sys.argv[1:])
