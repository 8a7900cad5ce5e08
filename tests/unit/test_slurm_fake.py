"""The lab's in-memory fake: index allocation, freeing, drain, updates, and recorded loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.lab.fake_slurm import FakeSlurm, load_recorded
from hetslurm.slurm.backend import NodeInfo, NodeStateChange, NotFoundError
from hetslurm.slurm.units import GresItem

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def small_cluster() -> FakeSlurm:
    return FakeSlurm(
        nodes=[
            NodeInfo(
                "gpu1",
                frozenset({"IDLE"}),
                cpus_total=8,
                weight=10,
                gres_total={("gpu", "a100"): 4},
                active_features=("gpu", "a100"),
            ),
            NodeInfo(
                "gpu2",
                frozenset({"IDLE"}),
                cpus_total=8,
                weight=1,
                gres_total={("gpu", "h100"): 4},
                active_features=("gpu", "h100"),
            ),
            NodeInfo(
                "fpga1",
                frozenset({"IDLE"}),
                cpus_total=4,
                weight=20,
                gres_total={("fpga", "u280"): 2},
            ),
        ]
    )


def test_jobs_take_lowest_free_indices_and_free_them() -> None:
    fake = small_cluster()
    a = fake.submit("#!/bin/bash\n#SBATCH --gres=gpu:a100:2\nsleep 1\n")
    b = fake.submit("sleep", ["--gres=gpu:a100:1"])
    assert fake.job(a).allocated_gres == {"gpu1": (GresItem("gpu", "a100", 2, (0, 1)),)}
    assert fake.job(b).gres_on("gpu1") == {("gpu", "a100"): (2,)}
    assert fake.node("gpu1").gres_used_indices == {("gpu", "a100"): (0, 1, 2)}
    assert fake.node("gpu1").state == {"MIXED"}
    fake.cancel(a)
    assert fake.job(a).state == "CANCELLED"
    assert fake.node("gpu1").gres_used_indices == {("gpu", "a100"): (2,)}
    c = fake.submit("sleep", ["--gres=gpu:a100:2"])
    assert fake.job(c).gres_on("gpu1") == {("gpu", "a100"): (0, 1)}


def test_untyped_request_follows_node_weight() -> None:
    fake = small_cluster()
    job = fake.submit("sleep", ["--gres=gpu:1"])
    # gpu2 has the lower weight, and Slurm allocates lower weights first.
    assert fake.job(job).nodes == ("gpu2",)


def test_drained_node_takes_no_new_job_but_keeps_its_running_one() -> None:
    fake = small_cluster()
    running = fake.submit("sleep", ["--gres=fpga:u280:1"])
    fake.update_node("fpga1", NodeStateChange.DRAIN, reason="bad card")
    node = fake.node("fpga1")
    assert node.state == {"MIXED", "DRAIN"} and node.reason == "bad card"
    assert fake.job(running).state == "RUNNING"
    waiting = fake.submit("sleep", ["--gres=fpga:u280:1"])
    assert fake.job(waiting).state == "PENDING"
    fake.update_node("fpga1", NodeStateChange.RESUME)
    assert fake.job(waiting).state == "RUNNING"
    assert fake.job(waiting).gres_on("fpga1") == {("fpga", "u280"): (1,)}


def test_drain_needs_a_reason() -> None:
    with pytest.raises(ValueError, match="reason"):
        small_cluster().update_node("gpu1", NodeStateChange.DRAIN)


def test_update_only_pending_jobs_like_slurm() -> None:
    fake = small_cluster()
    held = fake.submit("sleep", ["-H", "--gres=gpu:a100:1"])
    fake.update_job(
        held, tres_per_node=[GresItem("gpu", "h100", 2)], features="h100|a100", prefer="h100"
    )
    job = fake.job(held)
    assert job.tres_per_node == (GresItem("gpu", "h100", 2),)
    assert (job.features, job.prefer) == ("h100|a100", "h100")
    fake.release(held)
    assert fake.job(held).gres_on("gpu2") == {("gpu", "h100"): (0, 1)}
    with pytest.raises(BackendError, match="no longer pending"):
        fake.update_job(held, features="a100")
    with pytest.raises(ValueError, match="at least one"):
        fake.update_job(held)


def test_requeue_frees_devices_and_counts_restarts() -> None:
    fake = small_cluster()
    job = fake.submit("sleep", ["--gres=gpu:h100:4", "-H"])
    fake.release(job)
    fake.requeue_hold(job)
    j = fake.job(job)
    assert (j.state, j.restarts, j.allocated_gres) == ("PENDING", 1, {})
    assert fake.node("gpu2").gres_used == {}
    fake.release(job)
    fake.requeue(job)
    assert fake.job(job).restarts == 2


def test_missing_objects_raise_not_found() -> None:
    fake = small_cluster()
    with pytest.raises(NotFoundError):
        fake.node("nope")
    with pytest.raises(NotFoundError):
        fake.job(999)


def test_load_recorded_snapshot() -> None:
    fake = load_recorded(DATA)
    assert len(fake.nodes()) == 5
    assert fake.job("11+1").gres_on("gpu2") == {("gpu", "h100"): (3,)}
    assert {q.name for q in fake.qos()} == {"normal", "gpu_high"}
    assert [p.name for p in fake.partitions()] == ["all", "gpu", "fpga", "cpu"]
    # New ids continue after the recorded ones.
    assert fake.submit("sleep", ["-H"]) > 14

