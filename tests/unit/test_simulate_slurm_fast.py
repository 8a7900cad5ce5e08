"""The loop with Slurm's rules (free counts per node, whole-node reservations kept per node)
against its reference twin (replay_reference.py: a new placement core for every probe):
the same starts, the same nodes, GPUs and cores for every job, the same numbers of
reservations and backfilled jobs, with and without a backfill window."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from replay_cases import outcome, synthetic, trace_jobs
from replay_reference import replay_slurm_reference

from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.loop import ReplayResult
from hetslurm.simulate.slurm_backfill import replay_slurm
from hetslurm.simulate.workload import SimJob, partition_nodes
from hetslurm.site.load import load_site

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site-configs" / "case-study.toml"


def _same(model: ClusterModel, jobs: list[SimJob], parts: dict[str, tuple[int, ...]],
          depth: int, load: float, window: float = math.inf) -> ReplayResult:
    fast = replay_slurm(model, jobs, parts, backfill_depth=depth, load=load, window_s=window)
    slow = replay_slurm_reference(model, jobs, parts, backfill_depth=depth, load=load,
                                  window_s=window)
    assert outcome(fast) == outcome(slow)
    for key in ("passes", "reservations", "backfilled", "queue_area", "saturated_s",
                "saturated_completions"):
        assert getattr(fast.stats, key) == getattr(slow.stats, key), key
    assert fast.unfinished == slow.unfinished == 0
    return fast


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_reference_on_a_synthetic_queue(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    # Multi-node jobs, CPU jobs in two partitions, NVLink/NUMA/switch requests (the core
    # decides those), priorities and loose limits.
    model, parts = case_study
    res = _same(model, synthetic(model, 300, seed), parts, depth=50, load=2.0)
    assert res.stats.reservations > 0 and res.stats.backfilled > 0


def test_a_window_leaves_far_jobs_unreserved(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]]) -> None:
    model, parts = case_study
    jobs = synthetic(model, 300, 3)
    wide = _same(model, jobs, parts, depth=50, load=2.0)
    narrow = _same(model, jobs, parts, depth=50, load=2.0, window=600.0)
    # With a 10-minute window most would-be reservations lie beyond it.
    assert narrow.stats.reservations < wide.stats.reservations


@pytest.mark.parametrize("policy", ["slurm-default", "hetslurm"])
@pytest.mark.parametrize(("rel", "fmt", "n", "load", "window"), [
    ("sia-philly/philly.csv", "philly", 400, 0.1, math.inf),
    ("sia-philly/philly.csv", "philly", 400, 0.1, 3600.0),
    ("alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba", 400, 8.0, 86400.0),
])
def test_fast_path_equals_reference_on_trace_slices(rel: str, fmt: str, n: int, load: float,
                                                    window: float, policy: str) -> None:
    model, jobs, parts, depth = trace_jobs(rel, fmt, n, policy)
    res = _same(model, jobs, parts, depth=depth, load=load, window=window)
    assert res.stats.queue_area > 0 and res.stats.reservations > 0


def test_fast_path_equals_reference_on_a_flat_site_with_multi_node_jobs() -> None:
    # validate-site.toml has no switches (one implicit leaf), where the fast path chooses a
    # multi-node reservation's nodes itself (the k lowest node weights) instead of asking
    # the core: 2-node 8-GPU jobs among 1-4 GPU and CPU jobs, under both weightings.
    import random

    from hetslurm.placement.place import ScoreWeights, compile_request
    from hetslurm.request.language import Request
    from hetslurm.simulate.params import PolicyParams
    from hetslurm.simulate.workload import node_weights

    site = load_site(ROOT / "site-configs" / "validate-site.toml")
    slurm = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0, weight=1)
    for weights in ("site", "uniform"):
        model = node_weights(ClusterModel.from_site(site), PolicyParams(
            "p", weights, "gpu", "cpu", False, False, {}))
        assert len(model.switch_parent) == 1
        parts = {n: partition_nodes(site, model, n) for n in ("gpu", "cpu")}
        rng = random.Random(7)
        jobs, t = [], 0.0
        for i in range(150):
            t += rng.expovariate(1 / 20)
            run = rng.choice((30.0, 120.0, 600.0)) * rng.uniform(0.5, 1.5)
            gpus = rng.choice((0, 1, 2, 4, 8, 8))
            nodes = 2 if gpus == 8 else 1
            req = Request(nodes=nodes, gpus_per_node=gpus // nodes,
                          cores_per_node=rng.choice((1, 2, 4)), cpu_only=gpus == 0)
            jobs.append(SimJob(index=i, id=f"f{i}", cls="x", submit=t,
                               priority=rng.choice((0, 1, 1)),
                               partition="cpu" if gpus == 0 else "gpu",
                               kr=compile_request(model, req, slurm),
                               runtime={m: run for m in (-1, 0, 1)},
                               time_limit=run * rng.choice((1.0, 2.0)), gpus=gpus))
        res = _same(model, jobs, parts, depth=50, load=1.0)
        assert res.stats.reservations > 0 and res.stats.backfilled > 0
