"""The action log: append-only JSON lines, one object per decision, warning, action, notice.

Each entry is written with one ``write`` on a descriptor opened ``O_APPEND``, so concurrent
writers (a rebalance and a manual run) interleave whole lines, never halves. Nothing is ever
rewritten; warnings are entries of this log, so the warning that must precede an action is
evidence anyone can read.

Because a warning in this log is what lets a later run requeue a job, the log carries power:
it is opened without following a symlink and refused (:class:`hetslurm.errors.PermissionsError`)
when it is writable by group or others or owned by anyone but root or the running user
(:mod:`hetslurm.fsguard`).

The reader is the one typed reader of what :meth:`ActionLog.append` writes. It skips, and
counts by reason in :attr:`ActionLog.skipped`, every line that is not an entry this writer
could have written: a torn last line after a crash, bytes outside ASCII (the writer escapes
everything), a line longer than :data:`MAX_LINE` (read in bounded pieces, never whole), text
that is not JSON or not an object, an unknown kind, a field of the wrong type, and, when the
reader is given the run's clock, an entry dated after it (a clock that jumped back must not
let a stale warning mask a valid one, nor a forged one postpone it forever). Duplicate
entries are yielded as they are: every consumer keys what it reads (latest warning per job,
notices as a set), so a line copied twice counts once.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hetslurm import fsguard
from hetslurm.act import ActError

#: Entry kinds: ``decision`` (a judged job and its evidence), ``warning`` (the notice that
#: must precede an action), ``action`` (what was done and what Slurm showed afterwards),
#: ``notify`` (a notice sent), ``run`` (one run's summary).
KINDS = ("decision", "warning", "action", "notify", "run")

#: Longest line the reader takes, in bytes. The largest entry written (a decision of a big
#: heterogeneous job with its evidence) is a few KiB.
MAX_LINE = 1 << 20

#: Why the reader skipped a line, in the order reports list them.
SKIP_REASONS = ("torn", "not_ascii", "too_long", "not_json", "not_object", "bad_kind",
                "bad_field", "future")

_INT = "int"
_NUM = "number"
_STR = "str"
_BOOL = "bool"
#: Fields a consumer of each kind relies on, with their types (all kinds: ``logged_at``;
#: ``t``, the run's clock, is checked wherever it is present).
REQUIRED: dict[str, dict[str, str]] = {
    "warning": {"t": _NUM, "job_id": _INT, "restarts": _INT},
    "notify": {"job_id": _INT, "restarts": _INT, "rule": _STR, "ok": _BOOL},
}


class ActionLog:
    """An append-only JSON-lines file.

    ``trusted`` adds owners to root and the running user (:func:`hetslurm.fsguard.problem`).
    """

    def __init__(self, path: str | Path, trusted: Iterable[int] = ()) -> None:
        self.path = Path(path)
        self.trusted = fsguard.trusted_uids(trusted)
        #: Lines the last :meth:`entries` call skipped, by reason (:data:`SKIP_REASONS`).
        self.skipped: Counter[str] = Counter()

    @property
    def bad_lines(self) -> int:
        """How many lines the last :meth:`entries` call skipped."""
        return sum(self.skipped.values())

    def skipped_text(self) -> str:
        """``"3 line(s) skipped: torn 1, future 2"``, or an empty string."""
        if not self.bad_lines:
            return ""
        parts = ", ".join(f"{r} {self.skipped[r]}" for r in SKIP_REASONS if self.skipped[r])
        return f"action log {self.path}: {self.bad_lines} line(s) skipped: {parts}"

    def check(self) -> None:
        """Refuse the log now, before a run reads Slurm or acts, if it exists and cannot be
        trusted (see :meth:`entries`)."""
        fd = self._open_to_read()
        if fd is not None:
            os.close(fd)

    def _open_to_read(self) -> int | None:
        """A descriptor of the checked log; ``None`` when there is no log yet."""
        try:
            return fsguard.open_checked(self.path, os.O_RDONLY, "action log", self.trusted)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ActError(f"cannot read action log {self.path}: {exc.strerror}") from exc

    def append(self, kind: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Write one entry (``kind`` and ``logged_at``, wall-clock epoch, are added)."""
        if kind not in KINDS:
            raise ValueError(f"unknown log entry kind {kind!r}")
        rec = {"kind": kind, "logged_at": round(time.time(), 3), **entry}
        line = json.dumps(rec, sort_keys=True, ensure_ascii=True, default=str) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = fsguard.open_checked(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT,
                                      "action log", self.trusted, create_mode=0o640)
        except OSError as exc:
            raise ActError(f"cannot open action log {self.path}: {exc.strerror}") from exc
        try:
            size = os.fstat(fd).st_size
            # A torn last line (a crash mid-write) is closed first, so it costs one entry,
            # not two.
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line
            os.write(fd, line.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return rec

    def entries(self, kind: str | None = None, *, now: float | None = None
                ) -> Iterator[dict[str, Any]]:
        """Every valid entry in order (of one ``kind`` when given); with ``now`` (the run's
        clock), entries whose ``t`` is later are skipped as ``future``.

        Every line is checked whatever ``kind`` asks for, so :attr:`skipped` describes the
        whole file after any call.

        Raises:
            PermissionsError: the log is a symlink, not a regular file, or untrusted.
            ActError: it exists and cannot be read.
        """
        self.skipped = Counter()
        fd = self._open_to_read()
        if fd is None:
            return
        with os.fdopen(fd, "rb") as fh:
            while True:
                raw = fh.readline(MAX_LINE + 1)
                if not raw:
                    break
                if len(raw) > MAX_LINE:
                    while raw and not raw.endswith(b"\n"):
                        raw = fh.readline(MAX_LINE)  # the rest of it, a bounded piece at a time
                    self.skipped["too_long"] += 1
                    continue
                rec, why = parse_line(raw, now)
                if rec is None:
                    self.skipped[why] += 1
                elif kind is None or rec["kind"] == kind:
                    yield rec


def parse_line(raw: bytes, now: float | None = None) -> tuple[dict[str, Any] | None, str]:
    """One log line as an entry, or ``(None, reason)`` (a :data:`SKIP_REASONS` value)."""
    complete = raw.endswith(b"\n")
    if not raw.isascii():
        return None, "not_ascii"
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError):
        # ValueError covers JSONDecodeError and integers past Python's digit limit;
        # RecursionError a line of ``[[[[...``.
        return None, "not_json" if complete else "torn"
    if not isinstance(rec, dict):
        return None, "not_object"
    kind = rec.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return None, "bad_kind"
    if not _is(rec.get("logged_at"), _NUM) or ("t" in rec and not _is(rec["t"], _NUM)):
        return None, "bad_field"
    for name, typ in REQUIRED.get(kind, {}).items():
        if not _is(rec.get(name), typ):
            return None, "bad_field"
    if now is not None and "t" in rec and rec["t"] > now:
        return None, "future"
    return rec, ""


def _is(value: Any, typ: str) -> bool:
    # bool is an int in Python, and JSON's true must not pass for a job id or a time.
    if isinstance(value, bool):
        return typ == _BOOL
    if typ == _INT:
        return isinstance(value, int) and value >= 0
    if typ == _NUM:
        if not isinstance(value, int | float):
            return False
        try:
            return math.isfinite(value)
        except OverflowError:  # an integer too large for a float
            return False
    if typ == _STR:
        return isinstance(value, str)
    return False


def undoable_actions(entries: Iterable[Mapping[str, Any]], source: str,
                     actions: Iterable[str]) -> list[Mapping[str, Any]]:
    """``source``'s completed ``actions`` (with an ``action_id``) that no completed entry
    with ``rollback_of`` has undone, oldest first (undo steps are not undone again)."""
    wanted = set(actions)
    done: list[Mapping[str, Any]] = []
    undone: set[str] = set()
    for e in entries:
        if e.get("kind", "action") != "action" or e.get("source") != source:
            continue
        if isinstance(e.get("rollback_of"), str):
            if e.get("result") == "done":
                undone.add(e["rollback_of"])
            continue
        if (e.get("result") == "done" and isinstance(e.get("action_id"), str)
                and e.get("action") in wanted):
            done.append(e)
    return [e for e in done if e["action_id"] not in undone]


def select_undo(todo: list[Mapping[str, Any]], to: str | None, what: str,
                path: str | Path) -> list[Mapping[str, Any]]:
    """Of ``todo`` (undoable, oldest first): ``to`` and every later one, or without ``to``
    those of the latest run (the same ``t`` as the last).

    Raises:
        ConfigError: ``to`` is not among them (the message lists the last few ids).
    """
    from hetslurm.errors import ConfigError

    if to is not None:
        ids = [str(e["action_id"]) for e in todo]
        if to not in ids:
            raise ConfigError(f"no {what} {to!r} to undo in {path} (ids: "
                              f"{', '.join(ids[-5:]) or 'none'})")
        return todo[ids.index(to):]
    if not todo:
        return []
    t_last = todo[-1].get("t")
    return [e for e in todo if e.get("t") == t_last]
