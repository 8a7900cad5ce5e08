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
from hetslurm.placement.model import ClusterModel, GpuLayout, NodeLayout, StateArrays
from hetslurm.placement.place import (
    NodeEvaluation,
    NodePlacement,
    Placement,
    ScoreWeights,
    evaluate_nodes,
    place,
    place_batch,
)
from hetslurm.placement.reference import NO_FIT, pack_score, unpack_score
from hetslurm.placement.state import LiveState, NodeState, RunningJob

__all__ = [
    "MAX_NODE_GPUS",
    "MAX_REQUEST",
    "NO_FIT",
    "ClusterModel",
    "GpuBatchChoice",
    "GpuChoice",
    "GpuLayout",
    "LiveState",
    "NodeEvaluation",
    "NodeLayout",
    "NodePlacement",
    "NodeState",
    "Placement",
    "RunningJob",
    "ScoreWeights",
    "StateArrays",
    "choose_gpus",
    "choose_gpus_batch",
    "evaluate_nodes",
    "pack_score",
    "place",
    "place_batch",
    "unpack_score",
]
