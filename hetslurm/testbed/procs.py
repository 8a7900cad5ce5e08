"""Daemons the testbed starts, and how it finds and stops exactly those.

Every daemon runs in the foreground (``-D``/``-F``) in a session of its own, so the pid
``Popen`` returns *is* the daemon: no pid files to race. A pid is recorded with its start
time from ``/proc/<pid>/stat``, so a recycled pid is never mistaken for ours.

slurmstepd and slurmscriptd are not started by us directly; slurmd and slurmctld fork them.
They inherit the environment, so each daemon gets ``HETSLURM_TESTBED=<state dir>`` and the
testbed recognises its own descendants by that mark — never by process name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetslurm.errors import TestbedError

MARK = "HETSLURM_TESTBED"
_CHILDREN: list[subprocess.Popen[bytes]] = []


@dataclass(frozen=True)
class Proc:
    """A daemon we started: its pid and the kernel's start time for that pid."""

    name: str
    pid: int
    starttime: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def alive(self) -> bool:
        return proc_starttime(self.pid) == self.starttime


def proc_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), None if gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rindex(")") + 2 :].split()
    if rest[0] == "Z":
        return None
    return int(rest[19])


def start_daemon(name: str, argv: Sequence[str], log_file: Path, env: Mapping[str, str],
                 mark: str) -> Proc:
    """Start a foreground daemon detached in its own session; return its record."""
    full_env = dict(env)
    full_env[MARK] = mark
    with open(log_file, "ab") as log:
        try:
            p = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=full_env,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError as exc:
            raise TestbedError(f"cannot start {name}: '{argv[0]}' not found") from exc
    # Keep the handle: dropping it makes Popen warn that the child still runs, which is
    # the point of a daemon. reap() collects the exit status of those that end.
    _CHILDREN.append(p)
    start = proc_starttime(p.pid)
    if start is None:
        raise TestbedError(f"{name} exited at once; see {log_file}")
    return Proc(name, p.pid, start)


def marked_pids(mark: str) -> list[int]:
    """Processes whose environment carries ``HETSLURM_TESTBED=<mark>``."""
    want = f"{MARK}={mark}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if want in environ.split(b"\0") and proc_starttime(int(entry.name)) is not None:
            found.append(int(entry.name))
    return sorted(found)


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def stop(proc: Proc, timeout: float = 20.0) -> bool:
    """SIGTERM, wait, then SIGKILL; True if it had to be killed."""
    if not proc.alive():
        return False
    os.kill(proc.pid, signal.SIGTERM)
    if _wait_gone(lambda: proc.alive(), timeout):
        return False
    os.kill(proc.pid, signal.SIGKILL)
    if not _wait_gone(lambda: proc.alive(), 5):
        raise TestbedError(f"{proc.name} (pid {proc.pid}) survived SIGKILL")
    return True


def reap() -> None:
    """Collect exit statuses of daemons this process started, so none stays a zombie."""
    for p in list(_CHILDREN):
        if p.poll() is not None:
            _CHILDREN.remove(p)


def _wait_gone(alive: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reap()
        if not alive():
            return True
        time.sleep(0.1)
    reap()
    return not alive()
