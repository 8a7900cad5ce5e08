"""Access to Slurm: one interface, two backends, and Slurm's units in one place.

``get_backend()`` picks an implementation of :class:`SlurmBackend`:

- ``cli``: Slurm's command-line tools (JSON where 22.05 has it);
- ``pyslurm``: only when pyslurm imports and was built for the running Slurm;
- ``auto``: pyslurm when usable, else the CLIs.

Importing this package runs nothing and imports no optional binding.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetslurm.errors import BackendError
from hetslurm.slurm.backend import (
    SUBMIT_BATCH_RPC,
    Association,
    ControllerStats,
    GresKey,
    JobInfo,
    NodeInfo,
    NodeStateChange,
    NotFoundError,
    NotSupportedError,
    OutputFiles,
    PartitionInfo,
    QosInfo,
    RpcStats,
    SlurmBackend,
    Submission,
    Switches,
    SwitchInfo,
)
from hetslurm.slurm.units import UNLIMITED, GresItem, Unlimited

BACKENDS = ("auto", "cli", "rest", "pyslurm")

__all__ = [
    "BACKENDS",
    "SUBMIT_BATCH_RPC",
    "UNLIMITED",
    "Association",
    "ControllerStats",
    "GresItem",
    "GresKey",
    "JobInfo",
    "NodeInfo",
    "NodeStateChange",
    "NotFoundError",
    "NotSupportedError",
    "OutputFiles",
    "PartitionInfo",
    "QosInfo",
    "RpcStats",
    "SlurmBackend",
    "Submission",
    "SwitchInfo",
    "Switches",
    "Unlimited",
    "get_backend",
]


def get_backend(name: str = "auto", env: Mapping[str, str] | None = None) -> SlurmBackend:
    """Return a Slurm backend.

    Args:
        name: ``auto``, ``cli``, ``rest`` (slurmrestd: ``HETSLURM_REST_URL`` and
            ``SLURM_JWT``) or ``pyslurm``.
        env: extra environment for Slurm's commands (e.g. ``SLURM_CONF``).

    Raises:
        BackendError: an unknown name, or ``pyslurm`` chosen where it cannot be used.
    """
    if name == "cli":
        from hetslurm.slurm.cli_backend import CliBackend

        return CliBackend(env)
    if name == "rest":
        from hetslurm.slurm.rest_backend import RestBackend
        return RestBackend(env)
    if name == "pyslurm":
        from hetslurm.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(env)
    if name == "auto":
        from hetslurm.slurm.cli_backend import CliBackend
        from hetslurm.slurm.pyslurm_backend import PyslurmBackend, load_pyslurm, usable

        cli = CliBackend(env)
        if load_pyslurm() is not None and usable(cli.version())[0]:
            return PyslurmBackend(env)
        return cli
    raise BackendError(f"unknown Slurm backend '{name}'; choose one of {', '.join(BACKENDS)}")
