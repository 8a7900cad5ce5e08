"""Permission checks for every file and folder that carries power (docs/cli.md, "Files
that carry power").

A file carries power when what it says is acted on: the installed ``job_submit.lua`` runs
inside slurmctld, the site file steers what a root ``rebalance`` does, the action log holds
the warnings that let a job be requeued, the lock decides whether a run may act, and the
metric store's folders hold the samples a job is judged idle on. Each is trusted only when
nobody but its owner can write it and its owner is root, the running user or a uid the site
names. One rule, everywhere:

* not a symlink (checked with ``lstat``; where a file is opened, ``O_NOFOLLOW`` makes the
  open itself fail on one, so nothing can be swapped in between the check and the open);
* not writable by group or others: a group member can change a group-writable file as
  surely as anyone can change a world-writable one;
* owned by a trusted uid (root and the running user; callers add uids the site trusts).

Opened files are checked on the descriptor (``fstat``), so what is checked is what is read.
A refusal is one :class:`~hetslurm.errors.PermissionsError` line naming the path, what is
wrong with it and the command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hetslurm.errors import ConfigError, PermissionsError

#: Write bits that give someone other than the owner power over a file or folder.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def trusted_uids(extra: Iterable[int] = ()) -> frozenset[int]:
    """Root, the running user and ``extra``."""
    return frozenset({0, os.geteuid(), *extra})


def problem(st: os.stat_result, trusted: Iterable[int] | None = None) -> str | None:
    """Why a file or folder with this ``stat`` cannot be trusted, or None."""
    owners = trusted_uids() if trusted is None else frozenset(trusted)
    if st.st_uid not in owners:
        return f"owned by uid {st.st_uid}, not by {_names(owners)}"
    bits = st.st_mode & OTHERS_WRITE
    if bits:
        who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(bits, "group and others")
        return f"writable by {who} (mode {mode_text(st)})"
    return None


def mode_text(st: os.stat_result) -> str:
    """The permission bits as ``chmod`` takes them, e.g. ``0644``."""
    return f"{stat.S_IMODE(st.st_mode):04o}"


def _names(owners: frozenset[int]) -> str:
    return "root" if owners == {0} else "uid " + "/".join(str(u) for u in sorted(owners))


def _refuse(what: str, path: str | Path, why: str, fix: str) -> PermissionsError:
    return PermissionsError(f"refusing {what} {path}: {why}; {fix}")


def _fix(path: str | Path, why: str) -> str:
    if why.startswith("owned"):
        return f"chown root {path} (or trust its owner)"
    return f"run chmod go-w {path}"


def check_stat(st: os.stat_result, path: str | Path, what: str,
               trusted: Iterable[int] | None = None) -> None:
    """Raise :class:`PermissionsError` when ``st`` (of ``path``) cannot be trusted."""
    why = problem(st, trusted)
    if why:
        raise _refuse(what, path, why, _fix(path, why))


def check_dir(path: str | Path, what: str, trusted: Iterable[int] | None = None, *,
              follow: bool = False) -> os.stat_result:
    """Check the folder ``path``; ``follow`` accepts a symlink to a trusted folder (a store
    root an admin linked elsewhere), checking the folder it points at.

    Raises:
        PermissionsError: a symlink (unless ``follow``), not a folder, or untrusted.
        FileNotFoundError: the folder does not exist.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        if not follow:
            raise _refuse(what, path, "it is a symlink", "replace it with a real folder")
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(what, path, "it is not a folder", "remove it")
    check_stat(st, path, what, trusted)
    return st


def make_dir(path: str | Path, what: str, trusted: Iterable[int] | None = None, *,
             follow: bool = False) -> None:
    """Create the folder ``path`` (mode 0755, its parents as ``mkdir -p`` does) unless it
    exists, then :func:`check_dir` it."""
    p = Path(path)
    if not p.parent.exists():
        p.parent.mkdir(parents=True, exist_ok=True)
    # An explicit 0755: a umask can only take bits away, so a collector started with
    # umask 002 still makes folders its group cannot write.
    with contextlib.suppress(FileExistsError):
        p.mkdir(mode=0o755)
    check_dir(p, what, trusted, follow=follow)


def open_checked(path: str | Path, flags: int, what: str,
                 trusted: Iterable[int] | None = None, *, create_mode: int = 0o600) -> int:
    """Open a regular file without following a symlink and check it on its descriptor.

    Returns the descriptor (the caller closes it).

    Raises:
        PermissionsError: a symlink, not a regular file, or untrusted.
        FileNotFoundError: the file does not exist (and ``flags`` has no ``O_CREAT``).
        OSError: any other failure to open it.
    """
    try:
        # O_NONBLOCK: a FIFO planted under the name must not hang the open.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, create_mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(what, path, "it is a symlink",
                          "remove the link and name the real file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(what, path, "it is not a regular file", "remove it")
        check_stat(st, path, what, trusted)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_checked(path: str | Path, what: str, trusted: Iterable[int] | None = None, *,
                 max_bytes: int = 64 << 20) -> bytes:
    """The bytes of a checked regular file (see :func:`open_checked`).

    Raises:
        ConfigError: the file is larger than ``max_bytes`` (no configuration file is).
    """
    fd = open_checked(path, os.O_RDONLY, what, trusted)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ConfigError(f"{what} is larger than {max_bytes} bytes", file=str(path))
    return data

