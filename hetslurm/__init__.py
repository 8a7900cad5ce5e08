"""hetslurm: make Slurm good at heterogeneous clusters.

Importing this package has no side effects: it needs no Slurm, no GPU, no pyslurm and does
not load the compiled core until a placement function asks for it.
"""

from __future__ import annotations

from hetslurm.errors import (
    BackendError,
    CommandError,
    ConfigError,
    CoreNotBuiltError,
    HetslurmError,
    PlacementError,
    TestbedError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CommandError",
    "ConfigError",
    "CoreNotBuiltError",
    "HetslurmError",
    "PlacementError",
    "TestbedError",
    "__version__",
]
