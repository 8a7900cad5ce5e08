"""One run at a time: an advisory ``flock`` on a lock file, taken without waiting.

``flock`` is released by the kernel when the process dies, so a crashed run never leaves a
stale lock behind (unlike a pid file). The lock file is opened without following a symlink,
so a planted link cannot make a root run truncate or create another file.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

from hetslurm.act import ActError, LockBusy


class RunLock:
    """``with RunLock(path):`` holds the lock or raises :class:`LockBusy` at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
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
