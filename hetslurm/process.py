"""The one way hetslurm runs a subprocess (Slurm's CLIs go through the access layer in
``hetslurm/slurm/``, which runs them with this; other tools — mariadb, apt-get, cc, a
notifier — use it directly).

Every external command (Slurm's CLIs, daemons, tools) goes through :func:`run_command`:
an argument list (never a shell), a timeout always, and on timeout the whole process
group is killed, because Slurm's CLIs can leave helpers behind (``sbatch --wait``,
``srun`` steps) that would otherwise outlive the call.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetslurm.errors import BackendError, CommandError, CommandFailure

#: How long a killed process group gets to go away before we stop waiting on its pipes.
_KILL_GRACE_S = 5.0


@dataclass(frozen=True)
class CommandResult:
    """What a finished command returned (``subprocess.CompletedProcess``-like)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_command(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    cwd: str | os.PathLike[str] | None = None,
) -> CommandResult:
    """Run ``argv`` and return its output as text.

    Args:
        argv: program and arguments; a plain string is refused so no shell word-splitting
            can sneak in.
        timeout: seconds before the process group is killed; required on purpose.
        env: the complete environment for the child (``None`` inherits ours).
        input: text written to the child's stdin.
        check: raise :class:`CommandError` when the exit status is non-zero.
        cwd: the child's working directory (``None``: ours).

    Raises:
        BackendError: the executable does not exist (or cannot be executed).
        CommandError: non-zero exit with ``check``, or the timeout passed (always raised);
            ``.failure`` carries argv, returncode, stderr and ``timed_out``.
    """
    if isinstance(argv, str | bytes):
        raise TypeError("run_command takes an argument list, not a string")
    args = tuple(str(a) for a in argv)
    if not args:
        raise ValueError("run_command needs at least the program name")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Slurm prints job names and comments as users wrote them, not always UTF-8:
            # an undecodable byte becomes U+FFFD rather than an exception in every caller.
            errors="replace",
            env=dict(env) if env is not None else None,
            cwd=cwd,
            # Own process group, so a timeout can take down the children too.
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise BackendError(
            f"executable '{args[0]}' not found (is it installed and on PATH?)"
        ) from exc
    except PermissionError as exc:
        raise BackendError(f"executable '{args[0]}' cannot be run: {exc}") from exc
    try:
        stdout, stderr = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            _, stderr = proc.communicate(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            stderr = ""
        failure = CommandFailure(
            argv=args, returncode=proc.returncode, stderr=stderr or "", timed_out=True
        )
        raise CommandError(
            f"'{' '.join(args)}' timed out after {timeout:g}s and was killed", failure
        ) from None
    except BaseException:
        # KeyboardInterrupt and friends: do not leave the group running behind us.
        _kill_group(proc)
        proc.wait()
        raise
    if check and proc.returncode != 0:
        failure = CommandFailure(argv=args, returncode=proc.returncode, stderr=stderr)
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else "no stderr"
        raise CommandError(
            f"'{' '.join(args)}' failed with exit status {proc.returncode}: {detail}", failure
        )
    return CommandResult(argv=args, returncode=proc.returncode, stdout=stdout, stderr=stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
