"""``PlacementCore.refresh``: a core kept in step with a changing state node by node is the
same core as one built from that state: the same state arrays, the same free-capacity
indexes, the same placement for every request (what the simulator's cores rely on)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetslurm.placement.model import (
    N_INFO,
    N_T,
    PL_PLACED,
    ClusterModel,
    KernelRequest,
    StateArrays,
)
from hetslurm.site.load import load_site

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model() -> ClusterModel:
    return ClusterModel.from_site(load_site(ROOT / "site-configs" / "case-study.toml"))


def _core(model: ClusterModel, s: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    return model.new_core(StateArrays(
        available=s["available"], gpu_free=s["gpu_free"], fpga_free=s["fpga_free"],
        core_free=s["core_free"], mem_free_mib=np.maximum(s["mem_free"], 0),
        free_at=model.state.free_at))


def _kr(model: ClusterModel, nodes: int, gpus: int, cores: int, *, nvlink: bool = False,
        numa: bool = False, scored: bool = False) -> KernelRequest:
    return KernelRequest(
        nodes=nodes, gpus=gpus, fpgas=0, cores=cores, mem_mib=4096, min_gpu_mem_mib=0,
        nvlink=nvlink, numa=numa, switch=False, cpu_only=gpus == 0,
        gpu_rank=tuple(range(len(model.gpu_models))) if gpus else (-1,) * len(model.gpu_models),
        fpga_rank=(-1,) * len(model.fpga_models),
        weights=(1, 1, 1, 1, 1, 1, 1, 1) if scored else (0, 0, 0, 0, 0, 0, 1, 0))


def _requests(model: ClusterModel) -> list[KernelRequest]:
    return [_kr(model, 1, 0, 4), _kr(model, 1, 1, 2, scored=True),
            _kr(model, 1, 4, 8, nvlink=True), _kr(model, 2, 8, 16),
            _kr(model, 1, 2, 4, numa=True, scored=True)]


def _place_all(core, model: ClusterModel) -> list[tuple[int, list[int], list[int]]]:  # type: ignore[no-untyped-def]
    got = []
    for kr in _requests(model):
        k = kr.nodes
        nodes = np.full(k, -1, np.int32)
        gpus = np.full(max(k * kr.gpus, 1), -1, np.int32)
        fpgas = np.full(max(k * kr.fpgas, 1), -1, np.int32)
        cores = np.full(max(k * kr.cores, 1), -1, np.int32)
        terms = np.zeros(max(k * N_T, 1), np.int64)
        info = np.zeros(N_INFO, np.int64)
        status = core.place(kr.vector(), np.asarray(kr.gpu_rank, np.int32).reshape(-1),
                            np.asarray(kr.fpga_rank, np.int32).reshape(-1),
                            np.asarray(kr.weights, np.int64), False, nodes, gpus, fpgas,
                            cores, terms, info)
        got.append((int(status), nodes.tolist(), gpus.tolist() if status == PL_PLACED else []))
    return got


def _same(a, b, model: ClusterModel) -> None:  # type: ignore[no-untyped-def]
    sa, sb = a.state(), b.state()
    for key in sa:
        assert np.array_equal(sa[key], sb[key]), key
    assert a.index_buckets() == b.index_buckets()
    assert a.fpga_index_buckets() == b.fpga_index_buckets()
    assert _place_all(a, model) == _place_all(b, model)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_refreshed_core_is_a_rebuilt_one(model: ClusterModel, data: st.DataObject) -> None:
    n = model.n_nodes
    s = {"available": model.state.available.copy(), "gpu_free": model.state.gpu_free.copy(),
         "fpga_free": model.state.fpga_free.copy(), "core_free": model.state.core_free.copy(),
         "mem_free": model.state.mem_free_mib.copy()}
    mask = np.ones(n, np.uint8)
    mask[data.draw(st.lists(st.integers(0, n - 1), max_size=n // 3))] = 0
    masked = dict(s, available=s["available"] & mask)
    kept = _core(model, masked)
    for _ in range(data.draw(st.integers(1, 6))):
        nodes = np.array(sorted(set(data.draw(st.lists(st.integers(0, n - 1), min_size=1,
                                                        max_size=6)))), np.int64)
        seed = data.draw(st.integers(0, 2**32 - 1))
        rng = np.random.default_rng(seed)
        for i in nodes.tolist():
            g0, g1 = model.gpu_offsets[i], model.gpu_offsets[i + 1]
            c0, c1 = model.core_offsets[i], model.core_offsets[i + 1]
            f0, f1 = model.fpga_offsets[i], model.fpga_offsets[i + 1]
            s["gpu_free"][g0:g1] = rng.integers(0, 2, g1 - g0)
            s["core_free"][c0:c1] = rng.integers(0, 2, c1 - c0)
            s["fpga_free"][f0:f1] = rng.integers(0, 2, f1 - f0)
            # Negative memory (a state that overcommits) reads as 0, as in a rebuilt core.
            s["mem_free"][i] = int(rng.integers(-4096, int(model.mem_total_mib[i]) + 1))
            s["available"][i] = int(rng.integers(0, 2))
        masked = dict(s, available=s["available"] & mask)
        kept.refresh(nodes, masked["available"], masked["gpu_free"], masked["fpga_free"],
                     masked["core_free"], masked["mem_free"])
        _same(kept, _core(model, masked), model)


def test_refresh_after_a_commit_gives_back_what_the_commit_took(model: ClusterModel) -> None:
    # The simulator's case: a job placed and committed on one core ends; the core takes the
    # freed node's state from the arrays and is again the empty cluster's core.
    s = {"available": model.state.available.copy(), "gpu_free": model.state.gpu_free.copy(),
         "fpga_free": model.state.fpga_free.copy(), "core_free": model.state.core_free.copy(),
         "mem_free": model.state.mem_free_mib.copy()}
    empty = _core(model, s)
    core = _core(model, s)
    kr = _kr(model, 1, 2, 4)
    nodes = np.full(1, -1, np.int32)
    gpus, fpgas = np.full(2, -1, np.int32), np.full(1, -1, np.int32)
    cores = np.full(4, -1, np.int32)
    status = core.place(kr.vector(), np.asarray(kr.gpu_rank, np.int32).reshape(-1),
                        np.asarray(kr.fpga_rank, np.int32).reshape(-1),
                        np.asarray(kr.weights, np.int64), True, nodes, gpus, fpgas, cores,
                        np.zeros(N_T, np.int64), np.zeros(N_INFO, np.int64))
    assert status == PL_PLACED
    assert core.state()["mem_free"][nodes[0]] == s["mem_free"][nodes[0]] - 4096
    core.refresh(nodes.astype(np.int64), s["available"], s["gpu_free"], s["fpga_free"],
                 s["core_free"], s["mem_free"])
    _same(core, empty, model)
