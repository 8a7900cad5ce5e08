"""Slurm's GPU pick once it has a one-node job's cores (hetslurm.placement.slurm_pick)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import place
from hetslurm.placement.slurm_pick import slurm_gpu_pick, spans_sockets
from hetslurm.placement.state import LiveState, NodeState, RunningJob
from hetslurm.request.language import Request
from hetslurm.site.load import load_site

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"


@pytest.fixture(scope="module")
def demo() -> ClusterModel:
    return ClusterModel.from_site(load_site(DEMO))


# gpu1: 8 H100, GPUs 0-3 island 0 on NUMA 0 (cores 0-3), GPUs 4-7 island 1 on NUMA 1 (4-7).
FREE = [g not in (0, 1, 4) for g in range(8)]


def test_cores_on_one_socket_take_that_socket(demo: ClusterModel) -> None:
    assert slurm_gpu_pick(demo, 0, (6, 7), 3, FREE) == (5, 6, 7)
    assert slurm_gpu_pick(demo, 0, (2,), 2, FREE) == (2, 3)
    # Fewer free GPUs on the socket than asked: Slurm finds no more there.
    assert slurm_gpu_pick(demo, 0, (2,), 3, FREE) == (2, 3)


def test_cores_across_sockets_anchor_on_the_lowest_linked_pair(demo: ClusterModel) -> None:
    # Measured on 26.05 (CI, job 96): cores 2,6,7 with GPUs 0,1,4 held gave GPUs 2,3,7.
    assert slurm_gpu_pick(demo, 0, (2, 6, 7), 3, FREE) == (2, 3, 7)
    # Two GPUs: the pair 2,3 wins over 5,6,7 because it comes first.
    assert slurm_gpu_pick(demo, 0, (2, 6), 2, FREE) == (2, 3)
    # One GPU is not link-pruned: the first free GPU of the lowest socket with cores.
    assert slurm_gpu_pick(demo, 0, (2, 6), 1, FREE) == (2,)
    assert spans_sockets(demo, 0, (2, 6, 7)) and not spans_sockets(demo, 0, (5, 6, 7))


def test_no_linked_pair_keeps_the_lowest_first(demo: ClusterModel) -> None:
    free = [g in (3, 4, 7) for g in range(8)]
    # Pair 4,7 is linked (island 1): it is kept, 3 dropped.
    assert slurm_gpu_pick(demo, 0, (0, 4), 2, free) == (4, 7)
    free = [g in (3, 4) for g in range(8)]
    assert slurm_gpu_pick(demo, 0, (0, 4), 2, free) == (3, 4)


def test_place_predicts_slurms_gpus_when_cores_span_sockets(demo: ClusterModel) -> None:
    # GPUs 0,1,4 held; cores 0,1 (socket 0) and 4,5 (socket 1) held: a 3-GPU, 3-core job
    # fits island 1's GPUs 5,6,7 but only 2 cores are free next to them.
    state = LiveState(0.0, (NodeState("gpu1", gpus_used=(0, 1, 4), cpus_alloc=4, jobs=(
        RunningJob("1", gpus=(0, 1), cpu_ids=(0, 1)), RunningJob("2", gpus=(4,), cpu_ids=(4, 5)),
    )),))
    p = place(demo.with_state(state), Request(gpus_per_node=3, gpu_models=("h100",),
                                              cores_per_node=3))
    assert p.placeable
    (node,) = p.nodes
    assert spans_sockets(demo, 0, node.cores)
    assert node.gpus == slurm_gpu_pick(demo, 0, node.cores, 3, FREE) == (2, 3, 7)
    assert "Slurm will take GPU(s) [2, 3, 7] (2 NVLink islands)" in p.reason
    # Cores on one socket: the kernel's choice stands.
    q = place(demo.with_state(state), Request(gpus_per_node=2, gpu_models=("h100",)))
    assert not spans_sockets(demo, 0, q.nodes[0].cores)
    assert "Slurm will take" not in q.reason
