"""Choose GPUs inside a node: the validated Python API over the compiled kernel.

The policy (fewest NVLink islands, then best fit, then fewest NUMA domains, then lowest
indices) and the packed score are defined in :mod:`hetslurm.placement.reference`; see also
``docs/placement.md``. Inputs are checked here once; the kernel itself checks only the
lengths it indexes with (ValueError).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hetslurm.errors import PlacementError
from hetslurm.placement._load import load_core
from hetslurm.placement.reference import NO_FIT, unpack_score

#: Largest request accepted. It bounds the islands term of the score (islands <= n).
MAX_REQUEST = 1 << 16
#: Most GPUs one node may list. Real nodes carry at most 16; the exact search grows
#: quadratically with the GPU count and exponentially with NUMA domains that cross islands,
#: so the limit keeps a pathological node under a second (docs/placement.md, "Cost").
MAX_NODE_GPUS = 64
_ID_MAX = int(np.iinfo(np.int32).max)


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The GPUs chosen in one node.

    Attributes:
        indices: Node-local GPU indices, ascending; empty when the node cannot fit the request.
        score: Packed score, lower is better; ``NO_FIT`` (-1) when it cannot.
    """

    indices: tuple[int, ...]
    score: int

    @property
    def fits(self) -> bool:
        """Whether the node holds the request."""
        return self.score != NO_FIT

    @property
    def terms(self) -> dict[str, int]:
        """The score's terms: ``islands``, ``leftover``, ``numa``; ``{}`` on no fit."""
        return unpack_score(self.score)


@dataclass(frozen=True, eq=False)
class GpuBatchChoice:
    """The GPUs chosen in each of several nodes (read-only arrays).

    Attributes:
        scores: shape (nodes,), int64; packed score per node, -1 where it does not fit.
        indices: shape (nodes, n), int32; chosen node-local indices per node, ascending; rows
            of nodes that do not fit are all -1.
    """

    scores: npt.NDArray[np.int64]
    indices: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    def node(self, i: int) -> GpuChoice:
        """The choice for node ``i`` as a :class:`GpuChoice`."""
        score = int(self.scores[i])
        if score == NO_FIT:
            return GpuChoice((), NO_FIT)
        return GpuChoice(tuple(int(j) for j in self.indices[i]), score)


def _check_request(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise PlacementError(f"GPU count must be an integer, got {n!r}")
    count = operator.index(n)
    if not 1 <= count <= MAX_REQUEST:
        raise PlacementError(f"GPU count must be between 1 and {MAX_REQUEST}, got {count}")
    return count


def _vector(name: str, values: npt.ArrayLike) -> npt.NDArray[np.generic]:
    array = np.asarray(values)
    if array.ndim != 1:
        raise PlacementError(f"{name} must be one-dimensional, got shape {array.shape}")
    # An empty list arrives as float64; it holds no value that could be wrong.
    if array.size and array.dtype.kind not in "biu":
        raise PlacementError(f"{name} must hold integers, got dtype {array.dtype}")
    return array


def _flags(name: str, values: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    array = _vector(name, values)
    if array.size and not np.isin(array, (0, 1)).all():
        raise PlacementError(f"{name} must hold only 0 (busy) and 1 (free)")
    return np.ascontiguousarray(array, dtype=np.uint8)


def _ids(name: str, values: npt.ArrayLike, length: int) -> npt.NDArray[np.int32]:
    array = _vector(name, values)
    if array.shape[0] != length:
        raise PlacementError(f"{name} has {array.shape[0]} entries, expected {length}")
    if array.size and array.dtype.kind != "b":
        ids: npt.NDArray[Any] = array
        low, high = int(np.min(ids)), int(np.max(ids))
        if low < 0 or high > _ID_MAX:
            raise PlacementError(f"{name} ids must be in [0, {_ID_MAX}], got {low}..{high}")
    return np.ascontiguousarray(array, dtype=np.int32)


def choose_gpus(
    free: npt.ArrayLike, island: npt.ArrayLike, numa: npt.ArrayLike, n: int | np.integer[Any]
) -> GpuChoice:
    """Choose ``n`` GPUs in one node.

    Args:
        free: shape (G,), 0/1 or bool; 1 = the GPU is free.
        island: shape (G,), integers >= 0; NVLink island of each GPU (any numbering).
        numa: shape (G,), integers >= 0; NUMA domain of each GPU (any numbering).
        n: GPUs wanted, 1..``MAX_REQUEST``.

    Returns:
        The choice; ``fits`` is False when fewer than ``n`` GPUs are free.

    Raises:
        PlacementError: An argument has the wrong shape, type or range.
        CoreNotBuiltError: The compiled core is missing.
    """
    count = _check_request(n)
    free_a = _flags("free", free)
    if free_a.shape[0] > MAX_NODE_GPUS:
        raise PlacementError(f"a node may list at most {MAX_NODE_GPUS} GPUs, got {free_a.shape[0]}")
    island_a = _ids("island", island, free_a.shape[0])
    numa_a = _ids("numa", numa, free_a.shape[0])
    out = np.empty(count, dtype=np.int32)
    score = int(load_core().choose_gpus(free_a, island_a, numa_a, count, out))
    if score == NO_FIT:
        return GpuChoice((), NO_FIT)
    return GpuChoice(tuple(int(j) for j in out), score)


def choose_gpus_batch(
    offsets: npt.ArrayLike,
    free: npt.ArrayLike,
    island: npt.ArrayLike,
    numa: npt.ArrayLike,
    n: int | np.integer[Any],
) -> GpuBatchChoice:
    """Choose ``n`` GPUs in each of many nodes given in CSR form, in one GIL-free kernel call.

    Args:
        offsets: shape (nodes + 1,), integers; node i owns GPUs ``offsets[i]:offsets[i + 1]``
            of the flat arrays. Starts at 0, never decreases, ends at G.
        free: shape (G,), 0/1 or bool; 1 = free.
        island: shape (G,), integers >= 0; NVLink island per GPU.
        numa: shape (G,), integers >= 0; NUMA domain per GPU.
        n: GPUs wanted on each node, 1..``MAX_REQUEST``.

    Returns:
        Per-node scores and chosen node-local indices.

    Raises:
        PlacementError: An argument has the wrong shape, type or range.
        CoreNotBuiltError: The compiled core is missing.
    """
    count = _check_request(n)
    raw_offsets = _vector("offsets", offsets)
    free_a = _flags("free", free)
    if raw_offsets.shape[0] < 1:
        raise PlacementError("offsets needs at least one entry (0 for no nodes)")
    offsets_a = np.ascontiguousarray(raw_offsets, dtype=np.int64)
    widths = np.diff(offsets_a)
    if offsets_a[0] != 0 or offsets_a[-1] != free_a.shape[0] or (widths < 0).any():
        raise PlacementError(
            f"offsets must start at 0, never decrease and end at {free_a.shape[0]} (GPUs given)"
        )
    if widths.size and int(widths.max()) > MAX_NODE_GPUS:
        raise PlacementError(f"a node may list at most {MAX_NODE_GPUS} GPUs")
    island_a = _ids("island", island, free_a.shape[0])
    numa_a = _ids("numa", numa, free_a.shape[0])
    nodes = offsets_a.shape[0] - 1
    scores = np.full(nodes, NO_FIT, dtype=np.int64)
    # -1 rows are the documented "no fit" value; the kernel leaves those rows untouched.
    out = np.full((nodes, count), -1, dtype=np.int32)
    load_core().choose_gpus_batch(offsets_a, free_a, island_a, numa_a, count, scores, out)
    scores.flags.writeable = False
    out.flags.writeable = False
    return GpuBatchChoice(scores, out)
