"""The one place that imports the compiled core ``hetslurm._core``.

Everything else reaches the kernels through :func:`load_core`, so a checkout where the
extension was never built still imports, and fails only when a placement is asked for, with
one line saying how to build it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from hetslurm.errors import CoreNotBuiltError

if TYPE_CHECKING:
    from hetslurm._core import PlacementCore

BUILD_HINT = (
    "the compiled placement core hetslurm._core is not built; run `pip install .` "
    "(or `python setup.py build_ext --inplace` in a source checkout)"
)


class CoreModule(Protocol):
    """What hetslurm uses from ``hetslurm._core``; mypy checks the stub against it."""

    NO_FIT: int
    ISLAND_SHIFT: int
    LEFTOVER_SHIFT: int
    TERM_BITS: int
    LAYOUT: dict[str, int]
    # The node-level kernels (class); see hetslurm/_core.pyi for its signature.
    PlacementCore: type[PlacementCore]

    def choose_gpus(
        self,
        free: npt.NDArray[np.uint8],
        island: npt.NDArray[np.int32],
        numa: npt.NDArray[np.int32],
        n: int,
        out: npt.NDArray[np.int32],
    ) -> int: ...

    def choose_gpus_batch(
        self,
        offsets: npt.NDArray[np.int64],
        free: npt.NDArray[np.uint8],
        island: npt.NDArray[np.int32],
        numa: npt.NDArray[np.int32],
        n: int,
        scores: npt.NDArray[np.int64],
        out: npt.NDArray[np.int32],
    ) -> None: ...


def load_core() -> CoreModule:
    """Import and return ``hetslurm._core``.

    Raises:
        CoreNotBuiltError: The extension is missing or does not load (e.g. built for another
            Python); the message is one line naming the build command.
    """
    try:
        # Not `from hetslurm import _core`: that returns a cached package attribute and would
        # ignore a None entry in sys.modules, the standard way to block a module.
        import hetslurm._core as core
    except ImportError as e:
        raise CoreNotBuiltError(BUILD_HINT) from e
    return core
