"""One run at a time: an advisory ``flock`` on a lock file, taken without waiting.

``flock`` is released by the kernel when the process dies, so a crashed run never leaves a
stale lock behind (unlike a pid file).

The lock decides whether a root run may act, and taking it writes to the file, so both the
file and its folder are checked (:mod:`hetslurm.fsguard`): a symlinked, group- or
other-writable or foreign-owned lock or lock folder is refused with
:class:`hetslurm.errors.PermissionsError` (otherwise any user could hold the lock forever,
or point a root run's write at another file). The file is opened without following a
symlink, and it is emptied only when it holds nothing but a pid: a lock path that names
some other file (a typo in the site file) leaves that file as it was.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path
from types import TracebackType

from hetslurm import fsguard
from hetslurm.act import ActError, LockBusy
from hetslurm.errors import PermissionsError

#: What a lock file may hold: empty, or the pid a run wrote.
_PID_ONLY = re.compile(rb"\A(\d{1,10}\n?)?\Z")


class RunLock:
    """``with RunLock(path):`` holds the lock or raises :class:`LockBusy` at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fsguard.make_dir(self.path.parent, "lock folder")
            fd = fsguard.open_checked(self.path, os.O_RDWR | os.O_CREAT, "lock file",
                                      create_mode=0o600)
        except OSError as exc:
            raise ActError(f"cannot open lock file {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LockBusy(f"another run holds {self.path}; exiting without acting") from None
        except OSError as exc:
            os.close(fd)
            raise ActError(f"cannot lock {self.path}: {exc.strerror}") from exc
        if not _PID_ONLY.match(os.pread(fd, 16, 0)):
            os.close(fd)
            raise PermissionsError(f"refusing lock file {self.path}: it holds something other "
                                   "than a pid; name a lock file of its own")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
