"""The loop with EASY backfill (free-count checks, prefix-sum reservation search) against
its reference twin (replay_reference.py: a new placement core for every question): the same
starts, the same nodes, GPUs and cores for every job, and the same scheduling counters."""

from __future__ import annotations

import pytest
from replay_cases import outcome, synthetic, trace_jobs
from replay_reference import replay_easy_reference

from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.easy import replay
from hetslurm.simulate.loop import ReplayResult
from hetslurm.simulate.workload import SimJob


def _same(model: ClusterModel, jobs: list[SimJob], parts: dict[str, tuple[int, ...]],
          depth: int, load: float = 1.0) -> ReplayResult:
    fast = replay(model, jobs, parts, backfill_depth=depth, load=load)
    slow = replay_easy_reference(model, jobs, parts, backfill_depth=depth, load=load)
    assert outcome(fast) == outcome(slow)
    # (``reservations`` counts those computed: the loop reuses one while the head and the
    # running set stay the same, the reference computes it every pass.)
    for key in ("passes", "backfilled", "queue_area", "saturated_s",
                "saturated_completions"):
        assert getattr(fast.stats, key) == getattr(slow.stats, key), key
    assert fast.unfinished == slow.unfinished == 0
    return fast


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_reference_on_a_synthetic_queue(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    model, parts = case_study
    jobs = synthetic(model, 600, seed)
    res = _same(model, jobs, parts, depth=50, load=2.0)
    # The mix queues (else nothing is tested) and backfills.
    assert res.stats.queue_area > 0 and res.stats.backfilled > 0 and res.stats.reservations > 0


@pytest.mark.parametrize("policy", ["slurm-default", "hetslurm"])
@pytest.mark.parametrize(("rel", "fmt", "n", "load"), [
    ("sia-philly/philly.csv", "philly", 1000, 0.1),
    ("alibaba-gpu-v2023/openb_pod_list_default.csv", "alibaba", 1000, 8.0),
])
def test_fast_path_equals_reference_on_trace_slices(rel: str, fmt: str, n: int, load: float,
                                                    policy: str) -> None:
    model, jobs, parts, depth = trace_jobs(rel, fmt, n, policy)
    res = _same(model, jobs, parts, depth=depth, load=load)
    assert res.stats.queue_area > 0
