"""Replay cases shared by the fast-path-against-reference tests of both backfill models
(test_simulate_perf.py: EASY; test_simulate_slurm_fast.py: Slurm rules): the case-study
site, a synthetic queueing mix, slices of the real traces, and what two replays are
compared on."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from hetslurm.placement.model import ClusterModel, KernelRequest
from hetslurm.placement.place import ScoreWeights, compile_request
from hetslurm.request.language import Locality, Request
from hetslurm.simulate.loop import ReplayResult
from hetslurm.simulate.params import load_params
from hetslurm.simulate.traces import Trace, read_trace
from hetslurm.simulate.workload import (
    SimJob,
    build_jobs,
    node_weights,
    partition_names,
    partition_nodes,
)
from hetslurm.site.load import load_site
from hetslurm.traces import traces_dir

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site-configs" / "case-study.toml"
PARAMS = ROOT / "site-configs" / "simulate-params.toml"
SLURM = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0, weight=1)


def case_study() -> tuple[ClusterModel, dict[str, tuple[int, ...]]]:
    """The case-study model and its partitions' nodes."""
    site = load_site(SITE)
    model = ClusterModel.from_site(site)
    parts = {n: partition_nodes(site, model, n) for n in ("*", "gpu", "cpu")}
    return model, parts


def outcome(res: ReplayResult) -> dict[int, tuple[float, list[int], list[int], list[int]]]:
    """What two replays are compared on: each job's start, nodes, GPUs and cores."""
    return {r.job.index: (r.start, r.alloc.nodes.tolist(), r.alloc.gpus.tolist(),
                          r.alloc.cores.tolist()) for r in res.records}


def synthetic(model: ClusterModel, n: int, seed: int) -> list[SimJob]:
    """A queueing mix on the case study: 1-8 GPUs (multi-node above 4), model subsets,
    CPU jobs in the CPU partition and in all nodes, memory, priorities, limits above
    runtimes, and a share of NVLink/NUMA/switch-required requests (the core decides those)."""
    rng = random.Random(seed)
    krs: dict[Request, KernelRequest] = {}
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 40)
        run = rng.choice((30.0, 120.0, 600.0, 3600.0)) * rng.uniform(0.5, 1.5)
        if rng.random() < 0.3:
            part = rng.choice(("cpu", "*"))
            req = Request(cores_per_node=rng.choice((1, 8, 24, 48)),
                          mem_per_node_mib=rng.choice((None, 4000, 120_000)),
                          cpu_only=part == "cpu")
        else:
            part = "gpu"
            gpus = rng.choice((1, 1, 2, 4, 8))
            nodes = 2 if gpus == 8 else 1
            loc = Locality()
            r = rng.random()
            if r < 0.25:
                # At most 2 GPUs on one node: a NUMA domain of the case study holds them.
                gpus, nodes = rng.choice((1, 2)), 1
                loc = (Locality(nvlink="required") if r < 0.1 else
                       Locality(numa="required") if r < 0.2 else Locality(switch="required"))
            req = Request(nodes=nodes, gpus_per_node=gpus // nodes,
                          gpu_models=rng.choice(((), ("v100",), ("p100", "k80"))),
                          cores_per_node=rng.choice((1, 4, 8)),
                          mem_per_node_mib=rng.choice((None, 64_000)), locality=loc)
        kr = krs.get(req)
        if kr is None:
            kr = krs[req] = compile_request(model, req, SLURM)
        jobs.append(SimJob(index=i, id=f"s{i}", cls="x", submit=t, priority=rng.choice((0, 1, 1)),
                           partition=part, kr=kr,
                           runtime={m: run for m in (-1, 0, 1, 2)},
                           time_limit=run * rng.choice((1.0, 1.5, 3.0)), gpus=0))
    return jobs


@cache
def _read(path: Path, fmt: str) -> Trace:
    return read_trace(path, fmt)


def trace_jobs(rel: str, fmt: str, n: int, policy: str
                ) -> tuple[ClusterModel, list[SimJob], dict[str, tuple[int, ...]], int]:
    path = traces_dir() / rel
    if not path.is_file():
        pytest.skip(f"{path} missing (set HETSLURM_TRACES)")
    site = load_site(SITE)
    params = load_params(PARAMS)
    trace = _read(path, fmt)
    jobs, _ = build_jobs(trace.jobs[:n], fmt, site, params, [policy])
    model = node_weights(ClusterModel.from_site(site), params.policies[policy])
    parts = {p: partition_nodes(site, model, p) for p in partition_names(jobs[policy])}
    return model, jobs[policy], parts, params.backfill_depth
