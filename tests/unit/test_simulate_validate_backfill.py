"""The Slurm-rules replay (hetslurm/simulate/slurm_backfill.py) on a toy cluster: waits
derived by hand, each case where Slurm 22.05's backfill differs from the engine's EASY
backfill (every tested job reserved; reservations of whole nodes; failed partitions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import ScoreWeights, compile_request
from hetslurm.request.language import Request
from hetslurm.simulate.easy import replay
from hetslurm.simulate.measures import measure
from hetslurm.simulate.params import PolicyParams
from hetslurm.simulate.slurm_backfill import replay_slurm
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
           depth: int = 100) -> dict[str, tuple[float, str]]:
    run = replay_slurm if slurm else replay
    res = run(model, jobs, PARTS, backfill_depth=depth)
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
