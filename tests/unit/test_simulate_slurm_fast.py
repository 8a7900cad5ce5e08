"""The Slurm-rules replay's fast path (free counts per node, whole-node reservations kept
per node) against its reference path (``fast=False``: a new placement core for every
probe): the same starts, the same nodes, GPUs and cores for every job, the same numbers of
reservations and backfilled jobs, with and without a backfill window."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_simulate_perf import _outcome, _synthetic, _trace_jobs

from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.engine import ReplayResult
from hetslurm.simulate.slurm_backfill import replay_slurm
from hetslurm.simulate.workload import SimJob, partition_nodes
from hetslurm.site.load import load_site

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "site-configs" / "case-study.toml"


def _same(model: ClusterModel, jobs: list[SimJob], parts: dict[str, tuple[int, ...]],
          depth: int, load: float, window: float = math.inf) -> ReplayResult:
    fast = replay_slurm(model, jobs, parts, backfill_depth=depth, load=load, window_s=window)
    slow = replay_slurm(model, jobs, parts, backfill_depth=depth, load=load, window_s=window,
                        fast=False)
    assert _outcome(fast) == _outcome(slow)
    for key in ("passes", "reservations", "backfilled", "queue_area", "saturated_s",
                "saturated_completions"):
        assert getattr(fast.stats, key) == getattr(slow.stats, key), key
    assert fast.unfinished == slow.unfinished == 0
    return fast


@pytest.fixture(scope="module")
def case_study() -> tuple[ClusterModel, dict[str, tuple[int, ...]]]:
    site = load_site(SITE)
    model = ClusterModel.from_site(site)
    parts = {n: partition_nodes(site, model, n) for n in ("*", "gpu", "cpu")}
    return model, parts


@pytest.mark.parametrize("seed", [1, 2])
def test_fast_path_equals_reference_on_a_synthetic_queue(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    # Multi-node jobs, CPU jobs in two partitions, NVLink/NUMA/switch requests (the core
    # decides those), priorities and loose limits.
    model, parts = case_study
    res = _same(model, _synthetic(model, 300, seed), parts, depth=50, load=2.0)
    assert res.stats.reservations > 0 and res.stats.backfilled > 0


def test_a_window_leaves_far_jobs_unreserved(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]]) -> None:
    model, parts = case_study
    jobs = _synthetic(model, 300, 3)
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
    model, jobs, parts, depth = _trace_jobs(rel, fmt, n, policy)
    res = _same(model, jobs, parts, depth=depth, load=load, window=window)
    assert res.stats.queue_area > 0 and res.stats.reservations > 0
