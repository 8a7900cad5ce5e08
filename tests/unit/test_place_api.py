"""place()/place_batch() validation, bad input, the live-state schema and the backend reader."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetslurm.errors import PlacementError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.placement import model as layout
from hetslurm.placement.model import ClusterModel, NodeLayout, StateArrays
from hetslurm.placement.place import ScoreWeights, place, place_batch
from hetslurm.placement.reference import _ST
from hetslurm.placement.state import SCHEMA, LiveState, NodeState, RunningJob
from hetslurm.request.language import Locality, Request
from hetslurm.site.load import load_site
from hetslurm.slurm.backend import JobInfo, NodeInfo
from hetslurm.slurm.units import GresItem

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
core = pytest.importorskip("hetslurm._core", reason="compiled core not built")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> ClusterModel:
    return ClusterModel.from_site(load_site(ROOT / "site-configs/demo.toml"))


def test_kernel_layout_matches_python_constants() -> None:
    names = {k: v for k, v in vars(layout).items() if k.isupper() and k in core.LAYOUT}
    assert names == {k: core.LAYOUT[k] for k in names}
    assert len(names) >= 20
    assert core.LAYOUT["N_T"] == len(layout.TERMS)
    assert core.LAYOUT["N_ST"] == len(layout.STATUSES)
    assert {name: code for code, name in enumerate(layout.STATUSES)} == _ST


def test_model_arrays_from_site(demo: ClusterModel) -> None:
    assert demo.names[:5] == ("gpu1", "gpu2", "gpu3", "gpu4", "fpga1")
    assert demo.gpu_models == ("h100", "a100")
    assert demo.gpu_model.tolist() == [0, 0, 1, 1, -1, -1, -1, -1, -1]
    assert demo.gpu_offsets.tolist()[:6] == [0, 8, 16, 24, 32, 32]
    assert demo.gpu_island[:8].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert demo.gpu_numa[:8].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert demo.numa_cores.tolist() == [4] * 18
    assert demo.core_numa[:8].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert demo.switch_names == ("leaf1", "leaf2", "spine")
    assert demo.switch_parent.tolist() == [2, 2, -1]
    assert demo.switch_level.tolist() == [0, 0, 1]
    assert demo.fpga_count.tolist()[4] == 2
    assert (demo.gpu_busy_w[0], demo.gpu_idle_w[0]) == (700, 70)
    assert demo.weight.tolist()[:5] == [100, 100, 110, 110, 10]
    for name in ("cores_total", "gpu_island", "leaf", "weight"):
        array = getattr(demo, name)
        assert array.flags.c_contiguous and not array.flags.writeable


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (Request(gpus_per_node=-1), "gpus_per_node must be >= 0"),
        (Request(nodes=0), "nodes must be >= 1"),
        (Request(cores_per_node=0), "cores_per_node must be >= 1"),
        (Request(gpus_per_node=2**32 - 2), "not a count"),
        (Request(gpus_per_node=2**64 - 1), "not a count"),
        (Request(nodes=2**32 - 2), "not a count"),
        (Request(mem_per_node_mib=-5), "mem_per_node_mib"),
        (Request(gpus_per_node=1, gpu_models=("h10",)),
         "unknown GPU model 'h10'.*did you mean 'h100'"),
        (Request(fpgas_per_node=1, fpga_models=("xyz",)), "unknown FPGA model 'xyz'"),
        (Request(nodes=3, gpus_per_job=4), "does not split evenly"),
        (Request(gpus_per_node=True), "must be an integer"),
    ],
)
def test_bad_requests_raise(demo: ClusterModel, request_: Request, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        place(demo, request_)


@pytest.mark.parametrize(
    ("request_", "blocking"),
    [
        (Request(gpus_per_node=10**6), "gpu_count"),
        (Request(gpus_per_node=2**31 - 1), "gpu_count"),
        (Request(fpgas_per_node=3), "fpga_count"),
        (Request(cores_per_node=10**6), "cores"),
        (Request(mem_per_node_mib=10**9), "memory"),
        (Request(nodes=10), "nodes"),
        (Request(nodes=4, gpus_per_node=8, locality=Locality(switch="required"),
                 gpu_models=("h100",)), "nodes"),
    ],
)
def test_oversize_requests_cannot_place(demo: ClusterModel, request_: Request,
                                        blocking: str) -> None:
    got = place(demo, request_)
    assert not got.placeable and got.impossible
    assert got.blocking == blocking
    assert got.reason.startswith("impossible")


def test_empty_cluster_cannot_place() -> None:
    empty = ClusterModel.from_layouts([])
    got = place(empty, Request(gpus_per_node=1))
    assert not got.placeable and got.impossible and "no nodes" in got.reason
    assert place_batch(empty, [Request()])[0].impossible


def test_score_weights_validated() -> None:
    with pytest.raises(PlacementError, match="score weight load"):
        ScoreWeights(load=-1)
    with pytest.raises(PlacementError, match="score weight model"):
        ScoreWeights(model=2**40)


def test_placement_json_shape(demo: ClusterModel) -> None:
    got = place(demo, Request(nodes=2, gpus_per_node=4, gpu_models=("h100",)))
    data = json.loads(json.dumps(got.to_dict()))
    assert data["placeable"] is True
    assert data["nodelist"] == "gpu[1-2]"
    assert data["nodes"]["gpu1"]["gpus"] == [0, 1, 2, 3]
    assert set(data["terms"]) == {*layout.TERMS, "switch"}
    assert data["score"] == sum(data["weighted"].values())
    assert "lowest score" in data["reason"]


def test_batch_consumes_in_order(demo: ClusterModel) -> None:
    reqs = [Request(gpus_per_node=4, gpu_models=("h100",))] * 5 + [Request(gpus_per_node=8)]
    got = place_batch(demo, reqs)
    assert [(p.nodelist, p.nodes[0].gpus if p.nodes else ()) for p in got[:4]] == [
        ("gpu1", (0, 1, 2, 3)), ("gpu1", (4, 5, 6, 7)),
        ("gpu2", (0, 1, 2, 3)), ("gpu2", (4, 5, 6, 7)),
    ]
    assert not got[4].placeable and not got[4].impossible and got[4].blocking == "busy"
    assert got[5].nodelist == "gpu3"
    # The model itself is untouched.
    assert place(demo, reqs[0]).nodelist == "gpu1"


def test_batch_error_names_request(demo: ClusterModel) -> None:
    with pytest.raises(PlacementError, match="request 1:"):
        place_batch(demo, [Request(), Request(nodes=0)])


def test_state_arrays_validated(demo: ClusterModel) -> None:
    s = demo.state
    with pytest.raises(PlacementError, match="gpu_free has shape"):
        demo.with_arrays(StateArrays(s.available, s.gpu_free[:3], s.fpga_free, s.core_free,
                                     s.mem_free_mib, s.free_at))
    with pytest.raises(PlacementError, match="only 0 and 1"):
        demo.with_arrays(StateArrays(s.available * 2, s.gpu_free, s.fpga_free, s.core_free,
                                     s.mem_free_mib, s.free_at))


def test_layout_errors() -> None:
    with pytest.raises(PlacementError, match="NUMA domain 2"):
        ClusterModel.from_layouts([NodeLayout("a", (2, 2), 100, "h100",
                                              (layout.GpuLayout(0, 2, 0),))])
    with pytest.raises(PlacementError, match="exactly one root"):
        ClusterModel.from_layouts([NodeLayout("a", (2,), 100, leaf="x")],
                                  switches={"x": None, "y": None})
    with pytest.raises(PlacementError, match="not a leaf"):
        ClusterModel.from_layouts([NodeLayout("a", (2,), 100, leaf="root")],
                                  switches={"root": None, "x": "root"})


# --- live state ----------------------------------------------------------------------------


def sample_state() -> LiveState:
    return LiveState(
        time=1000.0,
        source="test",
        nodes=(
            NodeState("gpu1", gpus_used=(0, 1), cpus_alloc=2, mem_alloc_mib=2048,
                      flags=("MIXED",),
                      jobs=(RunningJob("7", 2000.0, gpus=(0, 1), cpu_ids=(4, 5)),)),
            NodeState("gpu2", available=False, flags=("DRAIN", "IDLE")),
        ),
    )


def test_state_json_round_trip() -> None:
    state = sample_state()
    text = state.to_json()
    data = json.loads(text)
    assert data["schema"] == SCHEMA == "hetslurm-state/1"
    assert data["nodes"][0]["jobs"][0]["cpu_ids"] == [4, 5]
    assert LiveState.from_json(text) == state


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="hetslurm-state/9"), "schema"),
        (lambda d: d["nodes"][0].update(gpus_used=[-1]), r"nodes\[0\].gpus_used must be >= 0"),
        (lambda d: d["nodes"][0].update(colour="red"), "unknown key"),
        (lambda d: d["nodes"][0].update(available="yes"), "available must be bool"),
        (lambda d: d["nodes"].append(d["nodes"][0]), "twice"),
    ],
)
def test_state_json_rejects(mutate: Any, message: str) -> None:
    data = sample_state().to_dict()
    mutate(data)
    with pytest.raises(PlacementError, match=message):
        LiveState.from_dict(data)


def test_state_applied_to_model(demo: ClusterModel) -> None:
    m = demo.with_state(sample_state())
    assert m.state.gpu_free[:8].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    # Exact CPU ids: cores 4 and 5 (threads_per_core = 1).
    assert m.state.core_free[:8].tolist() == [1, 1, 1, 1, 0, 0, 1, 1]
    assert m.state.available.tolist()[:3] == [1, 0, 0]  # gpu3 is not in the state: unknown
    assert m.state.free_at[0] == 2000.0
    assert m.state.mem_free_mib[0] == 16384 - 2048


def test_cores_attributed_to_gpu_domain_without_cpu_ids(demo: ClusterModel) -> None:
    state = LiveState(0.0, (NodeState("gpu1", gpus_used=(5,), cpus_alloc=2),))
    m = demo.with_state(state)
    # GPU 5 sits on NUMA 1 (cores 4-7): its job's 2 CPUs are assumed to be cores 4 and 5.
    assert m.state.core_free[:8].tolist() == [1, 1, 1, 1, 0, 0, 1, 1]


def test_bad_device_index_in_state(demo: ClusterModel) -> None:
    with pytest.raises(PlacementError, match="no GPU index 9"):
        demo.with_state(LiveState(0.0, (NodeState("gpu1", gpus_used=(9,)),)))


def test_state_at_releases_ended_jobs() -> None:
    later = sample_state().at(2000.0)
    assert later.node("gpu1").gpus_used == ()
    assert later.node("gpu1").jobs == ()
    assert later.node("gpu1").cpus_alloc == 0
    assert sample_state().end_times() == [2000.0]


def test_from_backend_reads_fake_slurm(demo: ClusterModel) -> None:
    start = datetime(2024, 1, 1, tzinfo=UTC)
    fake = FakeSlurm(
        nodes=[
            NodeInfo("gpu1", frozenset({"MIXED"}), cpus_total=8, cpus_alloc=2,
                     memory_total_mib=16384, memory_alloc_mib=4096,
                     gres_used_indices={("gpu", "h100"): (0, 1)}),
            NodeInfo("gpu2", frozenset({"IDLE", "DRAIN"}), cpus_total=8),
            NodeInfo("fpga1", frozenset({"MIXED"}), cpus_total=8, cpus_alloc=1,
                     gres_used_indices={("fpga", "u280"): (1,)}),
        ],
        jobs=[
            JobInfo(9, state="RUNNING", nodes=("gpu1",), start_time=start, time_limit=3600,
                    allocated_gres={"gpu1": (GresItem("gpu", "h100", 2, (0, 1)),)}),
            JobInfo(10, state="PENDING"),
        ],
    )
    live = LiveState.from_backend(fake, now=5.0)
    assert live.source == "fake"
    gpu1 = live.node("gpu1")
    assert gpu1.gpus_used == (0, 1) and gpu1.cpus_alloc == 2 and gpu1.mem_alloc_mib == 4096
    assert gpu1.jobs == (RunningJob("9", start.timestamp() + 3600, gpus=(0, 1)),)
    assert live.node("gpu2").available is False
    assert live.node("fpga1").fpgas_used == (1,)
    m = demo.with_state(live)
    got = place(m, Request(gpus_per_node=2, gpu_models=("h100",)))
    # Never a GPU a running job holds; gpu2 is drained.
    assert got.nodelist == "gpu1" and got.nodes[0].gpus == (2, 3)
    busy = place(m, Request(gpus_per_node=8, gpu_models=("h100",)))
    assert not busy.placeable and not busy.impossible
    assert busy.earliest_start == start.timestamp() + 3600


def test_kernel_never_offers_busy_gpus(demo: ClusterModel) -> None:
    rng = np.random.default_rng(7)
    for _ in range(200):
        used = {n: tuple(int(g) for g in np.flatnonzero(rng.random(8) < 0.5)) for n in
                ("gpu1", "gpu2", "gpu3", "gpu4")}
        live = LiveState(0.0, tuple(NodeState(n, gpus_used=used.get(n, ())) for n in demo.names))
        m = demo.with_state(live)
        got = place(m, Request(gpus_per_node=int(rng.integers(1, 5))))
        for node in got.nodes:
            assert not set(node.gpus) & set(used[node.name])
