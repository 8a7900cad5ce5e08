"""The Slurm-rules replay (hetslurm/simulate/slurm_backfill.py) on a toy cluster: waits
derived by hand, each case where Slurm 22.05's backfill differs from the engine's EASY
backfill (every tested job reserved; reservations of whole nodes; failed partitions)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import ScoreWeights, compile_request
from hetslurm.request.language import Request
from hetslurm.simulate.easy import replay
from hetslurm.simulate.loop import Replay
from hetslurm.simulate.measures import measure
from hetslurm.simulate.params import PolicyParams
from hetslurm.simulate.slurm_backfill import _NodeSpace, _try_later, replay_slurm
from hetslurm.simulate.workload import SimJob, node_weights
from hetslurm.site.load import load_site

# Two 4-GPU nodes (4 cores each) and a CPU node, one model.
TOY = """
schema_version = 1
name = "toy"
[node_classes.g4]
sockets = 1
cores_per_socket = 4
memory = "16G"
[node_classes.g4.gpus]
model = "a100"
count = 4
[node_classes.cpu4]
sockets = 1
cores_per_socket = 4
memory = "16G"
[nodes]
"g[1-2]" = "g4"
"c1" = "cpu4"
[partitions.gpu]
nodes = "g[1-2]"
[partitions.cpu]
nodes = "c1"
default = true
"""

SLURM = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0, weight=1)
UNIFORM = PolicyParams("slurm-default", "uniform", "gpu", "cpu", False, False, {})
PARTS = {"gpu": (0, 1), "cpu": (2,)}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ClusterModel:
    path: Path = tmp_path_factory.mktemp("toy") / "toy.toml"
    path.write_text(TOY)
    return node_weights(ClusterModel.from_site(load_site(path)), UNIFORM)


def job(model: ClusterModel, i: int, submit: float, run: float, limit: float, *,
        gpus: int = 0, cores: int = 1, part: str = "gpu") -> SimJob:
    req = Request(gpus_per_node=gpus, cores_per_node=cores, cpu_only=part == "cpu")
    return SimJob(index=i, id=f"j{i}", cls="x", submit=submit, priority=1, partition=part,
                  kr=compile_request(model, req, SLURM), runtime={-1: run, 0: run},
                  time_limit=limit, gpus=gpus)


def starts(model: ClusterModel, jobs: list[SimJob], *, slurm: bool = True,
           depth: int = 100, will_run: str = "exact",
           version: tuple[int, ...] | None = None) -> dict[str, tuple[float, str]]:
    if slurm:
        res = replay_slurm(model, jobs, PARTS, backfill_depth=depth, will_run=will_run,
                           slurm_version=version)
    else:
        res = replay(model, jobs, PARTS, backfill_depth=depth)
    assert res.unfinished == 0
    return {r.job.id: (r.start, model.names[int(r.alloc.nodes[0])]) for r in res.records}


def test_a_reservation_takes_whole_nodes(model: ClusterModel) -> None:
    # t=0: j0 (2 GPUs) on g1, j1 (4 GPUs) on g2, both until 100. t=1: j2 (3 GPUs) is the
    # head: it fits at 100, on g1 (first in node order). t=2: j3 (1 GPU, limit 200) would
    # still run at 100. EASY reserves only the head's 3 GPUs of g1 (those of the empty
    # node's first choice), so one of g1's two free GPUs is left and j3 takes it at 2.
    # Slurm reserves all of g1 from 100: j3 may not start there now, g2 is full, so it
    # waits for the ends at 100, where the main scheduler puts it beside the head on g1.
    jobs = [job(model, 0, 0, 100, 100, gpus=2), job(model, 1, 0, 100, 100, gpus=4),
            job(model, 2, 1, 100, 100, gpus=3), job(model, 3, 2, 10, 200, gpus=1)]
    assert starts(model, jobs, slurm=False)["j3"] == (2, "g1")
    slurm = starts(model, jobs)
    assert slurm["j2"] == (100, "g1") and slurm["j3"] == (100, "g1")


def test_every_tested_job_is_reserved_not_only_the_head(model: ClusterModel) -> None:
    # t=0: j0 (3 GPUs) on g1, j1 (2 GPUs) on g2 (g1 has one left), both until 100. t=1:
    # j2 and j3 (4 GPUs each) wait: the head j2 fits at 100 on g1, j3 at 100 on g2. t=2:
    # j4 (2 GPUs, limit 150) would still run at 100. EASY reserves only for j2 (on g1), so
    # j4 takes g2's two free GPUs at 2. Slurm also reserves g2 for j3 from 100: j4 fits
    # nowhere now, and after 100 both nodes are busy until 200, where it starts on g1.
    jobs = [job(model, 0, 0, 100, 100, gpus=3), job(model, 1, 0, 100, 100, gpus=2),
            job(model, 2, 1, 100, 100, gpus=4), job(model, 3, 1, 100, 100, gpus=4),
            job(model, 4, 2, 10, 150, gpus=2)]
    assert starts(model, jobs, slurm=False)["j4"] == (2, "g2")
    slurm = starts(model, jobs)
    assert slurm["j2"] == (100, "g1") and slurm["j3"] == (100, "g2")
    assert slurm["j4"] == (200, "g1")
    # With a backfill depth of 1 (bf_max_job_test=1) only j2 is tested, and j4 is not
    # tested at all: it starts when the main scheduler reaches it, at 200.
    assert starts(model, jobs, depth=1)["j4"] == (200, "g1")


def test_a_short_job_runs_beside_reservations_that_start_after_it(
        model: ClusterModel) -> None:
    # As above, but j4's limit (90) ends at 92 <= 100, before both reservations: it starts
    # at 2 on g2 under both rules.
    jobs = [job(model, 0, 0, 100, 100, gpus=3), job(model, 1, 0, 100, 100, gpus=2),
            job(model, 2, 1, 100, 100, gpus=4), job(model, 3, 1, 100, 100, gpus=4),
            job(model, 4, 2, 10, 90, gpus=2)]
    assert starts(model, jobs)["j4"] == (2, "g2")
    assert starts(model, jobs, slurm=False)["j4"] == (2, "g2")


def test_a_blocked_partition_does_not_stop_another(model: ClusterModel) -> None:
    # The GPU head waits; a CPU job behind it starts at once in its own partition (the main
    # scheduler skips only the failed partition), and the measures read the result.
    jobs = [job(model, 0, 0, 50, 60, gpus=4), job(model, 1, 0, 50, 60, gpus=4),
            job(model, 2, 1, 10, 60, gpus=4), job(model, 3, 2, 10, 60, cores=4, part="cpu")]
    got = starts(model, jobs)
    assert got["j2"] == (50, "g1") and got["j3"] == (2, "c1")
    res = replay_slurm(model, jobs, PARTS, backfill_depth=100)
    row = measure(model, res)
    assert row["jobs"] == 4 and row["mean_wait_s"] == pytest.approx((0 + 0 + 49 + 0) / 4)


# --- cons_tres's will-run test (will_run = "batched") ------------------------------------


def test_the_batched_will_run_start_is_the_last_removed_jobs_end(model: ClusterModel) -> None:
    # t=0: j0 (3 GPUs, limit 60) on g1, j1 (CPU, limit 70) on c1, j2 (4 GPUs, limit 200)
    # on g2. t=1: j3 (4 GPUs) cannot start. The exact rule reserves g1 from j0's end, 60,
    # so j4 (1 GPU, limit 60, from t=2) may not take g1's free GPU (it would run past 60)
    # and starts on g1 at 60, after j3 ran 50-60. The will-run test walks the planned ends
    # 60, 70, 200 from the barrier 90 (60 rounded up to the clock's 30 s): it removes j0,
    # passes over j1 unchecked (no node in j3's partition), so it removes j2 too, whatever
    # its end; j3 fits then and is planned from j2's end, 200 (Slurm 24.11). That
    # reservation leaves j4 g1's free GPU at once. Slurm 25.05.1 on plans j3 from the last
    # removed job on the node it chose, g1: j0's end, 60, and j4 waits as with the exact
    # rule.
    jobs = [job(model, 0, 0, 50, 60, gpus=3), job(model, 1, 0, 65, 70, cores=4, part="cpu"),
            job(model, 2, 0, 150, 200, gpus=4), job(model, 3, 1, 10, 100, gpus=4),
            job(model, 4, 2, 10, 60, gpus=1)]
    exact = starts(model, jobs)
    old = starts(model, jobs, will_run="batched", version=(24, 11, 5))
    new = starts(model, jobs, will_run="batched", version=(26, 5, 5))
    assert exact["j3"] == old["j3"] == new["j3"] == (50, "g1")
    assert exact["j4"] == new["j4"] == (60, "g1")
    assert old["j4"] == (2, "g1")
    assert starts(model, jobs, will_run="batched") == new  # no version: the newest rules


@pytest.mark.parametrize(("phase", "start"), [(0.0, 100.0), (20.0, 100.0), (25.0, 60.0)])
def test_the_will_run_batches_follow_the_wall_clock(model: ClusterModel, phase: float,
                                                    start: float) -> None:
    # j0 (limit 60) on g1 and j1 (limit 100) on g2 from t=0; at t=1 j2 (4 GPUs) fits once
    # j0 is gone. The barrier is 60 rounded up to the next 30 s of the wall clock: with
    # the clock at a multiple of 30 at t=0 (phase 0) it is 90 and the first batch takes
    # every end up to 120, j1's 100 included, so j2 starts at 100; at phase 20 the barrier
    # is 70 and the batch ends at 100, j1 still in; at phase 25 it is 65, the batch ends at
    # 95 and holds j0 alone: j2 starts at 60. On g1 each time (both nodes hold it; g1
    # first). Slurm 24.11's rule; 25.05.1's below.
    jobs = [job(model, 0, 0, 50, 60, gpus=4), job(model, 1, 0, 90, 100, gpus=4),
            job(model, 2, 1, 10, 60, gpus=4)]
    r = Replay(model, jobs, PARTS, 1.0)
    assert r.start_now(0, 0.0, ranked=False) and r.start_now(1, 0.0, ranked=False)
    got = _try_later(1.0, r, r.shapes[2], _NodeSpace(model.n_nodes, 1.0, math.inf), 60.0,
                     math.inf, model.weight, phase, relevant=False)
    assert got is not None
    assert (got[0], got[2]) == (start, [0])
    # Slurm 25.05.1 on: the last removed job on g1, the node chosen, is j0: 60 at any phase.
    newer = _try_later(1.0, r, r.shapes[2], _NodeSpace(model.n_nodes, 1.0, math.inf), 60.0,
                       math.inf, model.weight, phase, relevant=True)
    assert newer is not None and (newer[0], newer[2]) == (60.0, [0])


def test_the_node_space_map_ends_at_the_window() -> None:
    # The map of a pass at 0 with a 60 s window. A reservation from 60 takes nothing (the
    # map ends there: Slurm's _add_reservation finds no segment to split); one from 30 to
    # 90 is cut at 60.
    base = np.ones(3, dtype=bool)
    sp = _NodeSpace(3, 0.0, 60.0)
    sp.add([0], 60.0, 120.0)
    assert (sp.begin, sp.end) == ([0.0], [60.0])
    assert sp.usable(0.0, 60.0, base)[0].all()
    sp.add([1], 30.0, 90.0)
    assert (sp.begin, sp.end) == ([0.0, 30.0], [30.0, 60.0])
    # A job ending exactly where the reservation begins may not use its nodes (Slurm tests
    # begin_time <= end_time), one ending a second earlier may; the overlap test after
    # the will-run test is strict (begin < end).
    assert sp.usable(0.0, 30.0, base)[0].tolist() == [True, False, True]
    assert sp.usable(0.0, 29.0, base)[0].all()
    assert not sp.overlaps([1], 0.0, 30.0) and sp.overlaps([1], 0.0, 31.0)


def test_the_node_space_map_says_when_nodes_free_up() -> None:
    # g1 reserved until 20: a job from 0 for 30 s may use g2 only, and later_start is 20,
    # where g1 becomes free (Slurm tries again from there).
    sp = _NodeSpace(2, 0.0, 60.0)
    sp.add([0], 0.0, 20.0)
    use, later = sp.usable(0.0, 30.0, np.ones(2, dtype=bool))
    assert use.tolist() == [False, True] and later == 20.0


def test_the_main_scheduler_fails_each_ranked_partition_where_a_job_does_not_fit(
        model: ClusterModel) -> None:
    # Ranked fallback over two one-node partitions, p1 = g1 then p2 = g2 (Slurm's queue: a
    # record per job and partition, adjacent). j0 (2 GPUs) starts on g1. j1 (4 GPUs) does
    # not fit in p1, which fails, and starts in p2 on g2. j2 (2 GPUs) would fit on g1's two
    # free GPUs, but its p1 record is skipped (p1 failed in this pass) and p2 is full: the
    # main scheduler leaves it to backfill. j3 (CPU) in its own partition starts.
    parts = {**PARTS, "p1": (0,), "p2": (1,)}
    ranked = ("p1", "p2")
    jobs = [replace(job(model, 0, 0, 50, 60, gpus=2), ranked=ranked),
            replace(job(model, 1, 0, 50, 60, gpus=4), ranked=ranked),
            replace(job(model, 2, 0, 50, 60, gpus=2), ranked=ranked),
            job(model, 3, 0, 50, 60, cores=1, part="cpu")]
    r = Replay(model, jobs, parts, 1.0)
    pending = [(1, 0.0, i) for i in range(4)]
    started, head = r.main(0.0, pending, fcfs=False)
    assert started == {0, 1, 3} and head == 2
    assert [model.names[int(r.running[p].alloc.nodes[0])] for p in (0, 1, 3)] == \
        ["g1", "g2", "c1"]
