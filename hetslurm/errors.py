"""One exception tree for the whole library.

Every error hetslurm raises on purpose derives from :class:`HetslurmError`. The CLI turns
them into one line on stderr and a documented exit code (see ``docs/cli.md``); anything
else is a bug and shows a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Exit status of a command that printed its report but could not do all of it: an input it
#: reads (accounting, the metric store) or one of its phases failed, and the report and
#: stderr say which (docs/cli.md). Not an error class: nothing is raised, the output stands.
PARTIAL_EXIT = 9


class HetslurmError(Exception):
    """Base of every error hetslurm raises deliberately."""

    #: Process exit status the CLI uses for this family of errors.
    exit_code: int = 1


class ConfigError(HetslurmError):
    """A site file (or other configuration) is invalid.

    Carries the file, the dotted key and the 1-based line so the message can point at it.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        line: int | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.key = key
        self.line = line
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = []
        if self.file:
            where.append(f"{self.file}:{self.line}" if self.line else self.file)
        if self.key:
            where.append(f"key '{self.key}'")
        prefix = ": ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


class SiteImportError(ConfigError):
    """``site import`` cannot read a Slurm file it was given (the message names the file and
    line) or cannot make a valid site of the cluster (exit 2, like an invalid site)."""


class CoreNotBuiltError(HetslurmError):
    """The compiled placement core ``hetslurm._core`` is missing or stale."""

    exit_code = 3


class BackendError(HetslurmError):
    """Talking to Slurm failed (a command, its output, or an optional binding)."""

    exit_code = 4


@dataclass
class CommandFailure:
    """What a failed subprocess left behind, kept on :class:`CommandError`."""

    argv: tuple[str, ...]
    returncode: int | None
    stderr: str
    timed_out: bool = False


class CommandError(BackendError):
    """A subprocess exited non-zero or ran past its timeout."""

    def __init__(self, message: str, failure: CommandFailure) -> None:
        self.failure = failure
        super().__init__(message)


class PlacementError(HetslurmError):
    """A placement request is malformed or cannot be satisfied."""

    exit_code = 5


class TestbedError(HetslurmError):
    """The local test cluster could not be installed, started, checked or stopped."""

    exit_code = 6

    __test__ = False  # not a pytest test class despite the name


class MetricsError(HetslurmError):
    """GPU metrics could not be collected, stored, read or audited (NVML missing, a store
    that cannot be written, accounting input that cannot be used)."""


class RolloutError(HetslurmError):
    """``site apply`` or ``site rollback`` failed; ``rolled_back`` says whether the previous
    configuration was restored (and the cluster found healthy on it)."""

    exit_code = 7

    def __init__(self, message: str, *, rolled_back: bool = False) -> None:
        self.rolled_back = rolled_back
        super().__init__(message)


class PermissionsError(HetslurmError):
    """A file or folder that carries power (the installed hook, the site file a root run
    reads, the action log, the run lock, the metric store's folders) is a symlink, writable
    by someone other than its owner, or owned by an untrusted user (:mod:`hetslurm.fsguard`).
    """

    exit_code = 8

