"""Python signatures of the compiled placement core (see _core.pyx for the policy).

Every entry point checks the lengths, offsets and ids it indexes with and raises ValueError
on a mismatch; values (0/1 flags, ranges, model names) are checked by
:mod:`hetslurm.placement.gpus` and :mod:`hetslurm.placement.model`, the APIs to call.
"""

from typing import Any

import numpy as np
import numpy.typing as npt

NO_FIT: int
ISLAND_SHIFT: int
LEFTOVER_SHIFT: int
TERM_BITS: int

class GpuChooser:
    """Scratch space for Cython callers; it has no Python-level methods."""

    @property
    def capacity(self) -> int: ...
    def __init__(self, capacity: int) -> None: ...

def choose_gpus(
    free: npt.NDArray[np.uint8],
    island: npt.NDArray[np.int32],
    numa: npt.NDArray[np.int32],
    n: int,
    out: npt.NDArray[np.int32],
) -> int:
    """Choose ``n`` GPUs in one node; write them to ``out[:n]``; return the score or -1."""

def choose_gpus_batch(
    offsets: npt.NDArray[np.int64],
    free: npt.NDArray[np.uint8],
    island: npt.NDArray[np.int32],
    numa: npt.NDArray[np.int32],
    n: int,
    scores: npt.NDArray[np.int64],
    out: npt.NDArray[np.int32],
) -> None:
    """Choose ``n`` GPUs in each CSR node; fill ``scores[i]`` and, on a fit, ``out[i]``."""

LAYOUT: dict[str, int]

class PlacementCore:
    """Cluster arrays, live state, free-capacity index; built by ClusterModel.new_core()."""

    @property
    def n_nodes(self) -> int: ...
    @property
    def n_gpu_models(self) -> int: ...
    @property
    def n_fpga_models(self) -> int: ...
    @property
    def n_switches(self) -> int: ...
    @property
    def max_gpus(self) -> int: ...
    @property
    def max_numa(self) -> int: ...
    @property
    def max_fpgas(self) -> int: ...
    def __init__(
        self,
        *,
        cores_total: npt.NDArray[np.int32],
        mem_total: npt.NDArray[np.int64],
        gpu_model: npt.NDArray[np.int32],
        gpu_offsets: npt.NDArray[np.int64],
        gpu_island: npt.NDArray[np.int32],
        gpu_numa: npt.NDArray[np.int32],
        gpu_mem: npt.NDArray[np.int64],
        fpga_model: npt.NDArray[np.int32],
        fpga_offsets: npt.NDArray[np.int64],
        numa_offsets: npt.NDArray[np.int64],
        core_offsets: npt.NDArray[np.int64],
        core_numa: npt.NDArray[np.int32],
        leaf: npt.NDArray[np.int32],
        switch_parent: npt.NDArray[np.int32],
        switch_level: npt.NDArray[np.int32],
        weight: npt.NDArray[np.int64],
        gpu_dyn_w: npt.NDArray[np.int32],
        fpga_dyn_w: npt.NDArray[np.int32],
        n_gpu_models: int,
        n_fpga_models: int,
        available: npt.NDArray[np.uint8],
        gpu_free: npt.NDArray[np.uint8],
        fpga_free: npt.NDArray[np.uint8],
        core_free: npt.NDArray[np.uint8],
        mem_free: npt.NDArray[np.int64],
        load_milli: npt.NDArray[np.int32] | None = None,
    ) -> None: ...
    def place(
        self,
        req: npt.NDArray[np.int64],
        mrank: npt.NDArray[np.int32],
        frank: npt.NDArray[np.int32],
        w: npt.NDArray[np.int64],
        commit: bool,
        nodes_out: npt.NDArray[np.int32],
        gpus_out: npt.NDArray[np.int32],
        fpgas_out: npt.NDArray[np.int32],
        cores_out: npt.NDArray[np.int32],
        terms_out: npt.NDArray[np.int64],
        info: npt.NDArray[np.int64],
    ) -> int:
        """Place one request; return PL_PLACED (0) or why not; fill the outputs."""
    def place_batch(
        self,
        reqs: npt.NDArray[np.int64],
        mranks: npt.NDArray[np.int32],
        franks: npt.NDArray[np.int32],
        ws: npt.NDArray[np.int64],
        node_off: npt.NDArray[np.int64],
        gpu_off: npt.NDArray[np.int64],
        fpga_off: npt.NDArray[np.int64],
        core_off: npt.NDArray[np.int64],
        nodes_out: npt.NDArray[np.int32],
        gpus_out: npt.NDArray[np.int32],
        fpgas_out: npt.NDArray[np.int32],
        cores_out: npt.NDArray[np.int32],
        terms_out: npt.NDArray[np.int64],
        status: npt.NDArray[np.int8],
        info: npt.NDArray[np.int64],
    ) -> None:
        """Place requests in order, each consuming what it gets."""
    def take(
        self,
        node: int,
        gpus: npt.NDArray[np.int32],
        fpgas: npt.NDArray[np.int32],
        cores: npt.NDArray[np.int32],
        mem: int,
    ) -> None:
        """Mark one node's devices, cores and memory busy (state and index)."""
    def refresh(
        self,
        nodes: npt.NDArray[np.int64],
        available: npt.NDArray[np.uint8],
        gpu_free: npt.NDArray[np.uint8],
        fpga_free: npt.NDArray[np.uint8],
        core_free: npt.NDArray[np.uint8],
        mem_free: npt.NDArray[np.int64],
    ) -> None:
        """Set some nodes' state from whole-cluster state arrays (state and index)."""
    def evaluate(
        self,
        req: npt.NDArray[np.int64],
        mrank: npt.NDArray[np.int32],
        frank: npt.NDArray[np.int32],
        w: npt.NDArray[np.int64],
        status: npt.NDArray[np.int8],
        terms: npt.NDArray[np.int64],
        scores: npt.NDArray[np.int64],
    ) -> None:
        """Evaluate every node: status, terms and score."""
    def static_fit(
        self,
        req: npt.NDArray[np.int64],
        mrank: npt.NDArray[np.int32],
        frank: npt.NDArray[np.int32],
        status: npt.NDArray[np.int8],
    ) -> None:
        """Per node, ST_FITS where it could ever hold one share, else the first static ST_*."""
    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Copies of the live state arrays."""
    def index_buckets(self) -> dict[tuple[int, int, int], list[int]]:
        """The GPU free-capacity index: (GPU model id, free GPUs, most free GPUs in one NVLink
        island) -> nodes (for tests)."""
    def fpga_index_buckets(self) -> dict[tuple[int, int], list[int]]:
        """The FPGA free-capacity index: (FPGA model id, free FPGAs) -> nodes (for tests)."""

class NodeSpans:
    """Whole-node reservations of one backfill pass (see hetslurm.placement.spans)."""

    @property
    def n(self) -> int: ...
    @property
    def count(self) -> int: ...
    def __init__(self, n: int) -> None: ...
    def add(self, nodes: Any, start: float, end: float) -> None: ...
    def reserved(self) -> npt.NDArray[np.bool_]: ...
    def spans(self, node: int) -> list[tuple[float, float]]: ...
    def push(self, nodes: Any, starts: Any, limit: float) -> npt.NDArray[np.float64]: ...
    def blocked(self, when: float, limit: float) -> npt.NDArray[np.bool_]: ...
    def ends_after(self, t: float) -> list[float]: ...
    def earliest_one(self, raw: npt.NDArray[np.float64], limit: float, t: float,
                     weight: npt.NDArray[np.int64], mult: int) -> tuple[float, int, bool]: ...
    def reserve_ones(self, raws: npt.NDArray[np.float64], slot: npt.NDArray[np.int64],
                     sid: npt.NDArray[np.int64], limit: npt.NDArray[np.float64],
                     mult: npt.NDArray[np.int64], hopeless: npt.NDArray[np.float64],
                     weight: npt.NDArray[np.int64], t: float, horizon: float,
                     when_out: npt.NDArray[np.float64],
                     node_out: npt.NDArray[np.int64]) -> int: ...
    def feasible_last(self) -> npt.NDArray[np.bool_]: ...
    def earliest_multi(self, raw: npt.NDArray[np.float64], k: int, limit: float, t: float,
                       horizon: float) -> float: ...


class Releases:
    """Running jobs' holdings per node in planned-end order (see the slurm backfill model)."""

    @property
    def n(self) -> int: ...
    @property
    def count(self) -> int: ...
    def __init__(self, n: int) -> None: ...
    def add(self, job: int, nodes: npt.NDArray[np.int64], gpus: int, cores: int, mem: int,
            end: float) -> None: ...
    def remove(self, job: int, nodes: npt.NDArray[np.int64]) -> None: ...
    def earliest(self, idx: npt.NDArray[np.int64], gpus: int, cores: int, mem: int,
                 gpu_cnt: npt.NDArray[np.int64], core_cnt: npt.NDArray[np.int64],
                 mem_free: npt.NDArray[np.int64], t: float,
                 out: npt.NDArray[np.float64]) -> None: ...
