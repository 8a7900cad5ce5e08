"""The replay engine on a toy cluster: waits derived by hand for FCFS, EASY backfill,
reservations, priority and partitions."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import ScoreWeights, compile_request
from hetslurm.request.language import Request
from hetslurm.simulate.easy import replay
from hetslurm.simulate.params import PolicyParams
from hetslurm.simulate.workload import SimJob, node_weights
from hetslurm.site.load import load_site

TOY = """
schema_version = 1
name = "toy"
[scheduling]
gpu_model_order = ["v100", "k80"]
[node_classes.v100x2]
sockets = 1
cores_per_socket = 4
memory = "16G"
[node_classes.v100x2.gpus]
model = "v100"
count = 2
[node_classes.k80x2]
sockets = 1
cores_per_socket = 4
memory = "16G"
[node_classes.k80x2.gpus]
model = "k80"
count = 2
[node_classes.cpu4]
sockets = 1
cores_per_socket = 4
memory = "16G"
[nodes]
"g1" = "v100x2"
"g2" = "k80x2"
"c1" = "cpu4"
[partitions.gpu]
nodes = "g1,g2"
[partitions.cpu]
nodes = "c1"
default = true
[classes.vision]
devices = ["v100", "k80"]
partition = "gpu"
[classes.rl]
devices = ["k80", "v100"]
partition = "gpu"
[classes.preprocess]
devices = ["cpu"]
partition = "cpu"
"""

# Slurm's cons_tres with equal weights: lowest Weight, then node order (no best fit).
SLURM = ScoreWeights(model=0, islands=0, numa=0, leftover=0, load=0, energy=0, weight=1)


UNIFORM = PolicyParams("slurm-default", "uniform", "gpu", "*", False, False, {})


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ClusterModel:
    path = tmp_path_factory.mktemp("toy") / "toy.toml"
    path.write_text(TOY)
    # Every node Weight=1, as Slurm without hetslurm's levers: node order decides.
    return node_weights(ClusterModel.from_site(load_site(path)), UNIFORM)


PARTS = {"*": (0, 1, 2), "gpu": (0, 1), "cpu": (2,)}


def job(model: ClusterModel, i: int, submit: float, run: float, *, gpus: int = 0,
        models: tuple[str, ...] = (), cores: int = 1, limit: float | None = None,
        prio: int = 1, part: str = "*", nodes: int = 1, mem: int | None = None) -> SimJob:
    req = Request(nodes=nodes, gpus_per_node=gpus, gpu_models=models, cores_per_node=cores,
                  cpu_only=part == "cpu", mem_per_node_mib=mem)
    kr = compile_request(model, req, SLURM)
    return SimJob(index=i, id=f"j{i}", cls="x", submit=submit, priority=prio, partition=part,
                  kr=kr, runtime={-1: run, 0: run, 1: run},
                  time_limit=run if limit is None else limit, gpus=gpus * nodes)


def waits(model: ClusterModel, jobs: list[SimJob], depth: int = 100,
          load: float = 1.0) -> dict[str, float]:
    res = replay(model, jobs, PARTS, backfill_depth=depth, load=load)
    assert res.unfinished == 0
    return {r.job.id: r.start - r.submit for r in res.records}


def starts(model: ClusterModel, jobs: list[SimJob],
           depth: int = 100) -> dict[str, tuple[float, str]]:
    res = replay(model, jobs, PARTS, backfill_depth=depth)
    return {r.job.id: (r.start, model.names[int(r.alloc.nodes[0])]) for r in res.records}


def test_fcfs_second_job_waits_for_the_first(model: ClusterModel) -> None:
    # Both want both V100s: j1 starts when j0 ends at 100, having arrived at 10.
    jobs = [job(model, 0, 0, 100, gpus=2, models=("v100",)),
            job(model, 1, 10, 50, gpus=2, models=("v100",))]
    assert waits(model, jobs) == {"j0": 0, "j1": 90}


def test_first_fit_in_node_order_with_equal_weights(model: ClusterModel) -> None:
    # Any model, equal weights: g1 first, then g2; a CPU job in "*" lands on g1's cores.
    jobs = [job(model, 0, 0, 10, gpus=2), job(model, 1, 0, 10, gpus=2),
            job(model, 2, 0, 10, cores=1)]
    got = starts(model, jobs)
    assert got == {"j0": (0, "g1"), "j1": (0, "g2"), "j2": (0, "g1")}


def test_easy_backfill_short_job_fills_the_hole(model: ClusterModel) -> None:
    # j0 holds 1 V100 until 100; j1 (2 V100) is the head, reserved at 100. j2 (1 V100,
    # limit 50) ends at 52 <= 100: backfilled at 2. j3 (1 V100, limit 200) would end after
    # 100 on the GPU the head needs: it waits for j1 (100..130) and starts at 130.
    v = ("v100",)
    jobs = [job(model, 0, 0, 100, gpus=1, models=v), job(model, 1, 1, 30, gpus=2, models=v),
            job(model, 2, 2, 50, gpus=1, models=v), job(model, 3, 3, 200, gpus=1, models=v)]
    w = waits(model, jobs)
    assert w == {"j0": 0, "j1": 99, "j2": 0, "j3": 127}


def test_without_backfill_everything_waits_in_order(model: ClusterModel) -> None:
    # Same queue, backfill off: j1 at 100-130, then j2 and j3 together at 130.
    v = ("v100",)
    jobs = [job(model, 0, 0, 100, gpus=1, models=v), job(model, 1, 1, 30, gpus=2, models=v),
            job(model, 2, 2, 50, gpus=1, models=v), job(model, 3, 3, 200, gpus=1, models=v)]
    assert waits(model, jobs, depth=0) == {"j0": 0, "j1": 99, "j2": 128, "j3": 127}


def test_long_job_backfills_on_resources_the_reservation_leaves(model: ClusterModel) -> None:
    # j0 holds g1's V100s until 100; j1 (V100 only) is the head, reserved on g1 at 100.
    # j2 (any model, limit 500) ends after 100 but fits on g2's K80s, which the reservation
    # does not need: starts at 2. j3 (1 GPU) finds nothing free; it starts when j1 ends.
    jobs = [job(model, 0, 0, 100, gpus=2, models=("v100",)),
            job(model, 1, 1, 10, gpus=2, models=("v100",)),
            job(model, 2, 2, 500, gpus=2),
            job(model, 3, 3, 500, gpus=1)]
    assert starts(model, jobs) == {"j0": (0, "g1"), "j1": (100, "g1"), "j2": (2, "g2"),
                                   "j3": (110, "g1")}


def test_backfill_respects_time_limits_not_runtimes(model: ClusterModel) -> None:
    # j2 really runs 10 s but its limit (200) ends after the shadow time 100 and it would
    # take the head's GPU: Slurm plans with the limit, so it waits for the head.
    v = ("v100",)
    jobs = [job(model, 0, 0, 100, gpus=1, models=v), job(model, 1, 1, 30, gpus=2, models=v),
            job(model, 2, 2, 10, gpus=1, models=v, limit=200)]
    assert waits(model, jobs) == {"j0": 0, "j1": 99, "j2": 128}


def test_reservation_keeps_memory_for_the_head(model: ClusterModel) -> None:
    # c1 has 16384 MiB. j0 holds 12288 until 100; the head j1 needs 14336: reserved at 100,
    # leaving 2048 there. j2 (4096, limit 500) fits now but would take memory the head needs
    # at 100: it waits until j1 ends at 110. j3 (4096, limit 50) ends by 100: backfilled.
    jobs = [job(model, 0, 0, 100, part="cpu", mem=12288),
            job(model, 1, 1, 10, part="cpu", mem=14336),
            job(model, 2, 2, 500, part="cpu", mem=4096),
            job(model, 3, 3, 50, part="cpu", mem=4096)]
    assert waits(model, jobs) == {"j0": 0, "j1": 99, "j2": 108, "j3": 0}


def test_priority_beats_submit_order(model: ClusterModel) -> None:
    # g1 busy until 100; j1 (normal) and j2 (high, later) both wait for it: j2 goes first.
    v = ("v100",)
    jobs = [job(model, 0, 0, 100, gpus=2, models=v),
            job(model, 1, 1, 10, gpus=2, models=v, prio=1),
            job(model, 2, 5, 10, gpus=2, models=v, prio=0)]
    assert starts(model, jobs)["j2"] == (100, "g1")
    assert starts(model, jobs)["j1"] == (110, "g1")


def test_partition_keeps_cpu_jobs_on_cpu_nodes(model: ClusterModel) -> None:
    # Five 1-core jobs on a 4-core CPU-only partition: the fifth waits 20 s, although the
    # GPU nodes' cores are idle.
    jobs = [job(model, i, 0, 20, part="cpu") for i in range(5)]
    got = starts(model, jobs)
    assert {n for _, n in got.values()} == {"c1"}
    assert sorted(s for s, _ in got.values()) == [0, 0, 0, 0, 20]


def test_load_multiplier_compresses_arrivals(model: ClusterModel) -> None:
    # At load 2 the second job arrives at 5 instead of 10: it waits 95.
    jobs = [job(model, 0, 0, 100, gpus=2, models=("v100",)),
            job(model, 1, 10, 50, gpus=2, models=("v100",))]
    assert waits(model, jobs, load=2.0) == {"j0": 0, "j1": 95}


def test_multi_node_job_waits_for_both_nodes(model: ClusterModel) -> None:
    # 4 GPUs = 2 nodes x 2: it starts when the 1-GPU job on g2 ends at 40.
    jobs = [job(model, 0, 0, 40, gpus=1, models=("k80",)),
            job(model, 1, 1, 10, gpus=2, nodes=2)]
    assert waits(model, jobs) == {"j0": 0, "j1": 39}


def test_cores_and_memory_are_released(model: ClusterModel) -> None:
    # Each job takes all 4 cores of c1: strictly one after another.
    jobs = [job(model, i, 0, 10, cores=4, part="cpu") for i in range(3)]
    assert sorted(waits(model, jobs).values()) == [0, 10, 20]


def test_fixture_site_is_what_the_tests_assume(model: ClusterModel, tmp_path: Path) -> None:
    assert model.names == ("g1", "g2", "c1")
    assert model.gpu_models == ("v100", "k80")
