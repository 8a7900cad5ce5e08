"""Placement: where a job's devices go, inside a node and across nodes.

Importing this package never loads the compiled core; the first call that needs a kernel does
(through :mod:`hetslurm.placement._load`) and raises ``CoreNotBuiltError`` if it is missing.
"""

from __future__ import annotations

from hetslurm.placement.gpus import (
    MAX_NODE_GPUS,
    MAX_REQUEST,
    GpuBatchChoice,
    GpuChoice,
    choose_gpus,
    choose_gpus_batch,
)
from hetslurm.placement.reference import NO_FIT, pack_score, unpack_score

__all__ = [
    "MAX_NODE_GPUS",
    "MAX_REQUEST",
    "NO_FIT",
    "GpuBatchChoice",
    "GpuChoice",
    "choose_gpus",
    "choose_gpus_batch",
    "pack_score",
    "unpack_score",
]
