"""Python signatures of the compiled placement core (see _core.pyx for the policy).

The kernels trust their inputs; use :mod:`hetslurm.placement.gpus`, which validates.
"""

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
