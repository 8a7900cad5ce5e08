"""The free-capacity indexes on a bench-shaped cluster: candidates, answers and upkeep.

The GPU index is keyed (GPU model, free GPUs, most free GPUs in one NVLink island), the FPGA
index (FPGA model, free FPGAs); CPU-only requests walk only nodes without devices. The search
may only skip nodes that cannot fit, so every answer must equal the plain-Python reference,
and the number of nodes examined shows the skipping happens.
"""

from __future__ import annotations

import pytest

from hetslurm.errors import PlacementError
from hetslurm.lab.bench_placement import half_loaded, synthetic_layouts, synthetic_requests
from hetslurm.placement.model import (
    I_FITTING,
    I_LEVELS,
    I_TOTAL,
    I_TOUCHED,
    ClusterModel,
    StateArrays,
)
from hetslurm.placement.place import _run, compile_request, place, place_batch
from hetslurm.placement.reference import PlainCluster, place_batch_reference, place_reference
from hetslurm.request.language import Locality, Request

core = pytest.importorskip("hetslurm._core", reason="compiled core not built")


@pytest.fixture(scope="module")
def bench_model() -> ClusterModel:
    layouts, tree = synthetic_layouts(320)
    return half_loaded(ClusterModel.from_layouts(layouts, switches=tree))


REQUESTS = [
    Request(fpgas_per_node=1, cores_per_node=2),
    Request(fpgas_per_node=2, cores_per_node=2),
    Request(nodes=3, fpgas_per_node=1),
    Request(cores_per_node=8, mem_per_node_mib=32768, cpu_only=True),
    Request(nodes=4, cores_per_node=8, cpu_only=True),
    Request(gpus_per_node=1, cpu_only=True),
    Request(cores_per_node=30),
    Request(gpus_per_node=4, gpu_models=("a100", "l40s"), cores_per_node=8,
            locality=Locality(nvlink="preferred")),
    Request(gpus_per_node=4, locality=Locality(nvlink="required")),
    Request(gpus_per_node=3, locality=Locality(nvlink="required", numa="required")),
    Request(gpus_per_node=5, locality=Locality(nvlink="required")),
    Request(nodes=2, gpus_per_node=8, cores_per_node=16, locality=Locality(switch="preferred")),
    Request(gpus_per_node=8, gpu_models=("h100",), cores_per_node=16),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: f"{r}"[:60])
def test_index_search_equals_reference(bench_model: ClusterModel, request_: Request) -> None:
    kr = compile_request(bench_model, request_)
    raw = _run(bench_model.new_core(), kr)
    ref = place_reference(bench_model, kr, PlainCluster.from_model(bench_model))
    assert raw.status == ref.status
    if ref.status == 0:
        assert raw.nodes == ref.nodes
        assert raw.gpus == tuple(c.gpus for c in ref.choices)
        assert raw.fpgas == tuple(c.fpgas for c in ref.choices)
        assert raw.cores == tuple(c.cores for c in ref.choices)
        assert raw.info[I_TOTAL] == ref.total
        assert raw.info[I_LEVELS] == ref.levels
    else:
        assert raw.info[I_FITTING] == ref.fitting


def test_fpga_and_cpu_only_requests_skip_other_nodes(bench_model: ClusterModel) -> None:
    with_fpga = int((bench_model.fpga_count > 0).sum())
    no_device = int(((bench_model.fpga_count == 0) & (bench_model.gpu_count == 0)).sum())
    for request_, most in [
        (Request(nodes=3, fpgas_per_node=1), with_fpga),
        (Request(nodes=4, cores_per_node=8, cpu_only=True), no_device),
        (Request(gpus_per_node=1, cpu_only=True), 0),
    ]:
        raw = _run(bench_model.new_core(), compile_request(bench_model, request_))
        assert 0 <= raw.info[I_TOUCHED] <= most, request_
    # Single-node searches stop at the first node that meets the bound.
    raw = _run(bench_model.new_core(),
               compile_request(bench_model, Request(fpgas_per_node=1, cores_per_node=2)))
    assert raw.info[I_TOUCHED] < with_fpga


def test_batch_keeps_both_indexes_and_matches_reference(bench_model: ClusterModel) -> None:
    krs = [compile_request(bench_model, r) for r in synthetic_requests(400, seed=5)]
    core_obj = bench_model.new_core()
    got = []
    for kr in krs:
        raw = _run(core_obj, kr, commit=True)
        got.append(raw.nodes if raw.status == 0 else raw.status)
    assert got == [r.nodes if r.status == 0 else r.status
                   for r in place_batch_reference(bench_model, krs)]
    state = core_obj.state()
    again = bench_model.with_arrays(StateArrays(
        available=state["available"], gpu_free=state["gpu_free"],
        fpga_free=state["fpga_free"], core_free=state["core_free"],
        mem_free_mib=state["mem_free"], free_at=bench_model.state.free_at,
    )).new_core()
    assert again.index_buckets() == core_obj.index_buckets()
    assert again.fpga_index_buckets() == core_obj.fpga_index_buckets()
    # The API's batch path agrees with the loop above.
    placed = place_batch(bench_model, synthetic_requests(400, seed=5))
    assert [p.placeable for p in placed] == [not isinstance(g, int) for g in got]


def test_compile_cache_keeps_type_checks(bench_model: ClusterModel) -> None:
    good = Request(gpus_per_node=1)
    assert compile_request(bench_model, good) == compile_request(bench_model, good)
    for bad in (Request(gpus_per_node=True), Request(gpus_per_node=1.0)):  # type: ignore[arg-type]
        with pytest.raises(PlacementError, match="must be an integer"):
            compile_request(bench_model, bad)
    # Repeated placements reuse buffers; earlier answers stay intact.
    first = place(bench_model, Request(gpus_per_node=2))
    nodes = first.to_dict()
    place(bench_model, Request(nodes=2, gpus_per_node=8, cores_per_node=16))
    assert first.to_dict() == nodes
