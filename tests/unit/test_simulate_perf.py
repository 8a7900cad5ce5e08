"""The replay's fast path (free-count checks, prefix-sum reservation search) against its
reference path (``fast=False``: the placement core asked every time): the same starts, the
same nodes, GPUs and cores for every job, and the same scheduling counters."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from hetslurm.placement.model import ClusterModel, KernelRequest
from hetslurm.placement.place import ScoreWeights, compile_request
from hetslurm.placement.request import Locality, Request
from hetslurm.simulate.engine import ReplayResult, replay
from hetslurm.simulate.params import load_params
from hetslurm.simulate.traces import Trace, read_trace
from hetslurm.simulate.workload import SimJob, build_jobs, node_weights, partition_nodes
from hetslurm.site.load import load_site
from hetslurm.traces import traces_dir

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site-configs" / "case-study.toml"
PARAMS = ROOT / "site-configs" / "simulate-params.toml"
SLURM = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0, weight=1)


def _outcome(res: ReplayResult) -> dict[int, tuple[float, list[int], list[int], list[int]]]:
    return {r.job.index: (r.start, r.alloc.nodes.tolist(), r.alloc.gpus.tolist(),
                          r.alloc.cores.tolist()) for r in res.records}


def _same(model: ClusterModel, jobs: list[SimJob], parts: dict[str, tuple[int, ...]],
          depth: int, load: float = 1.0) -> ReplayResult:
    fast = replay(model, jobs, parts, backfill_depth=depth, load=load)
    slow = replay(model, jobs, parts, backfill_depth=depth, load=load, fast=False)
    assert _outcome(fast) == _outcome(slow)
    for key in ("passes", "reservations", "placements_tried", "backfilled", "queue_area",
                "saturated_s", "saturated_completions"):
        assert getattr(fast.stats, key) == getattr(slow.stats, key), key
    assert fast.unfinished == slow.unfinished == 0
    # The fast path asks the core far less: only to commit, or for a reservation's placement.
    assert fast.stats.core_calls < slow.stats.core_calls
    return fast


def _synthetic(model: ClusterModel, n: int, seed: int) -> list[SimJob]:
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


@pytest.fixture(scope="module")
def case_study() -> tuple[ClusterModel, dict[str, tuple[int, ...]]]:
    site = load_site(SITE)
    model = ClusterModel.from_site(site)
    parts = {n: partition_nodes(site, model, n) for n in ("*", "gpu", "cpu")}
    return model, parts


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_reference_on_a_synthetic_queue(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    model, parts = case_study
    jobs = _synthetic(model, 600, seed)
    res = _same(model, jobs, parts, depth=50, load=2.0)
    # The mix queues (else nothing is tested) and backfills.
    assert res.stats.queue_area > 0 and res.stats.backfilled > 0 and res.stats.reservations > 0


@cache
def _read(path: Path, fmt: str) -> Trace:
    return read_trace(path, fmt)


def _trace_jobs(rel: str, fmt: str, n: int, policy: str
                ) -> tuple[ClusterModel, list[SimJob], dict[str, tuple[int, ...]], int]:
    path = traces_dir() / rel
    if not path.is_file():
        pytest.skip(f"{path} missing (set HETSLURM_TRACES)")
    site = load_site(SITE)
    params = load_params(PARAMS)
    trace = _read(path, fmt)
    jobs, _ = build_jobs(trace.jobs[:n], fmt, site, params, [policy])
    model = node_weights(ClusterModel.from_site(site), params.policies[policy])
    parts = {p: partition_nodes(site, model, p) for p in {j.partition for j in jobs[policy]}}
    return model, jobs[policy], parts, params.backfill_depth


@pytest.mark.parametrize("policy", ["slurm-default", "hetslurm"])
@pytest.mark.parametrize(("rel", "fmt", "n", "load"), [
    ("sia-philly/philly.csv", "philly", 1000, 0.1),
    ("alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba", 1000, 8.0),
])
def test_fast_path_equals_reference_on_trace_slices(rel: str, fmt: str, n: int, load: float,
                                                    policy: str) -> None:
    model, jobs, parts, depth = _trace_jobs(rel, fmt, n, policy)
    res = _same(model, jobs, parts, depth=depth, load=load)
    assert res.stats.queue_area > 0
