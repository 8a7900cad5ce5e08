"""The loop with Slurm's rules (free counts per node, whole-node reservations kept per node)
against its reference twin (replay_reference.py: a new placement core for every probe):
the same starts, the same nodes, GPUs and cores for every job, the same numbers of
reservations and backfilled jobs, with and without a backfill window."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

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


def _generated(model: ClusterModel, n: int, seed: int) -> list[SimJob]:
    """A generated trace on ``model``: bursts of 1-core and whole-node CPU jobs in every
    partition, a share of GPU jobs, and runtimes of 0 s (SWF grid logs hold thousands: a job
    planned to end the instant it starts) beside 1 s to an hour; limits equal to runtimes."""
    import random

    from replay_cases import SLURM

    from hetslurm.placement.place import compile_request
    from hetslurm.request.language import Request

    rng = random.Random(seed)
    # The widest node each partition's jobs may use ("cpu": CPU-only nodes).
    widest = {"*": int(model.cores_total.max()),
              "gpu": int(model.cores_total[model.gpu_count > 0].max()),
              "cpu": int(model.cores_total[model.gpu_count == 0].max())}
    krs = {}
    jobs, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / rng.choice((0.2, 2.0, 20.0)))
        run = rng.choice((0.0, 0.0, 1.0, 30.0, 600.0, 3600.0))
        gpus = rng.choice((0, 0, 0, 1, 2))
        part = "gpu" if gpus else rng.choice(("*", "cpu"))
        req = Request(gpus_per_node=gpus, cores_per_node=rng.choice((1, 1, 4, widest[part])),
                      mem_per_node_mib=rng.choice((None, 4000)), cpu_only=part == "cpu")
        if req not in krs:
            krs[req] = compile_request(model, req, SLURM)
        jobs.append(SimJob(index=i, id=f"z{i}", cls="x", submit=t, priority=rng.choice((0, 1)),
                           partition=part, kr=krs[req],
                           runtime={m: run for m in (-1, *range(len(model.gpu_models)))},
                           time_limit=run, gpus=gpus))
    return jobs


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_zero_length_jobs_never_lend_what_they_hold(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    # Issue 24: a 188k-job SWF grid trace stopped with "placement core refused a backfill
    # start the count check admits" (a 1-core CPU job). A job started in a pass with a 0 s
    # limit is planned to end at that very time: the backfill's release view counted its
    # cores free *now*, and the reference loop gave them to a second job at once (both
    # wrong: it holds them until its end event, the next at the same time). Both now plan
    # its release for the next time a pass tests, and agree job for job.
    model, parts = case_study
    jobs = _generated(model, 250, seed)
    res = _same(model, jobs, parts, depth=50, load=8.0)
    assert res.stats.backfilled > 0 and res.stats.reservations > 0
    # No core is ever given to two jobs at once.
    spans: dict[int, list[tuple[float, float]]] = {}
    for r in res.records:
        for c in r.alloc.cores.tolist():
            spans.setdefault(c, []).append((r.start, r.end))
    for held in spans.values():
        held.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(held))


def test_a_disagreement_is_reported_and_the_core_decides(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Free counts that lie (every node "fits now") must not stop the replay: each start the
    # core refuses is counted, kept as an example with the job and the nodes, and the job is
    # decided by the core at every candidate time, so the replay is the honest one.
    from hetslurm.simulate import slurm_backfill

    model, parts = case_study
    jobs = _generated(model, 150, 5)
    honest = replay_slurm(model, jobs, parts, backfill_depth=50, load=8.0)
    assert honest.stats.disagreements == 0

    def lying(r: object, sh: object, t: float, out: Any) -> None:
        out[:] = t

    monkeypatch.setattr(slurm_backfill, "_earliest_fits", lying)
    res = replay_slurm(model, jobs, parts, backfill_depth=50, load=8.0)
    assert res.stats.disagreements > 0
    ex = res.stats.disagreement_examples[0]
    assert ex["what"] == "a backfill start" and ex["job"].startswith("z")
    assert ex["nodes_counted_free"]
    assert outcome(res) == outcome(honest)
    assert res.unfinished == 0


@pytest.mark.parametrize("seed", range(12))
def test_weight_only_reservation_nodes_do_not_depend_on_the_state(
        case_study: tuple[ClusterModel, dict[str, tuple[int, ...]]], seed: int) -> None:
    # A multi-node reservation of a weight-only shape is placed on the partition's
    # empty-cluster core with only the feasible nodes available (_place_on_empty): the
    # same nodes as the core of the state at the reservation's start, whatever that state
    # holds, with the default switch weight and a small one, on the case study's tree.
    import random

    import numpy as np
    from replay_cases import SLURM

    from hetslurm.placement.place import ScoreWeights, compile_request
    from hetslurm.request.language import Request
    from hetslurm.simulate.loop import Replay, Shape, State, new_core, try_place
    from hetslurm.simulate.slurm_backfill import _place_on_empty

    model, parts = case_study
    assert len(model.switch_parent) > 1
    rng = random.Random(seed)
    if seed % 2:
        weights = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0,
                               weight=1, switch=3)
    else:
        weights = SLURM
    r = Replay(model, [], parts, 1.0)
    for _ in range(5):
        gpus = rng.choice((0, 1, 2, 4))
        req = Request(nodes=rng.choice((2, 3, 4)), gpus_per_node=gpus,
                      cores_per_node=rng.choice((1, 8)), cpu_only=gpus == 0)
        kr = compile_request(model, req, weights)
        part = "gpu" if gpus else rng.choice(("cpu", "*"))
        sh = Shape(model, kr, part, new_core(model, r.now, r.masks[part]), r.lay)
        assert sh.exact and sh.weight_only
        # A random state: each node's GPUs and cores taken at random.
        s: State = r.now.copy()
        for i in range(model.n_nodes):
            g0, g1 = int(model.gpu_offsets[i]), int(model.gpu_offsets[i + 1])
            c0, c1 = int(model.core_offsets[i]), int(model.core_offsets[i + 1])
            s.gpu_free[g0:g1] = [rng.random() < 0.5 for _ in range(g1 - g0)]
            s.core_free[c0:c1] = [rng.random() < 0.6 for _ in range(c1 - c0)]
            s.gpu_cnt[i] = int(s.gpu_free[g0:g1].sum())
            s.core_cnt[i] = int(s.core_free[c0:c1].sum())
        fits = np.zeros(model.n_nodes, dtype=bool)
        fits[sh.fitting(s)] = True
        feasible = fits & np.array([rng.random() < 0.7 for _ in range(model.n_nodes)])
        if int(np.count_nonzero(feasible[sh.idx])) < sh.k:
            continue
        want = try_place(new_core(model, s, r.masks[part] & feasible.astype(np.uint8)), sh,
                         model, False, r.stats)
        assert want is not None
        got = _place_on_empty(r, sh, feasible)
        assert got.nodes.tolist() == want.nodes.tolist()
