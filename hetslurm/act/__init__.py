"""Acting on running jobs: give back GPUs of stalled jobs, safely (docs/act.md).

Mechanisms here (the action log, the run lock, the stall executor; the stall rules are
:mod:`hetslurm.policy.stall`); the command line is ``hetslurm act`` in
:mod:`hetslurm.cli.act_cmd`. Nothing here runs a shell: Slurm is reached through
:class:`hetslurm.slurm.backend.SlurmBackend` and the site's notifier through
:func:`hetslurm.process.run_command` with an argv list.
"""

from __future__ import annotations

from hetslurm.errors import HetslurmError


class ActError(HetslurmError):
    """An ``act`` run could not start (its log or lock is unusable)."""


class LockBusy(ActError):
    """Another run holds the lock; this one did nothing."""


__all__ = ["ActError", "LockBusy"]
