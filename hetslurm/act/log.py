"""The action log: append-only JSON lines, one object per decision, warning, action, notice.

Each entry is written with one ``write`` on a descriptor opened ``O_APPEND``, so concurrent
writers (a rebalance and a manual run) interleave whole lines, never halves. Nothing is ever
rewritten; warnings are entries of this log, so the warning that must precede an action is
evidence anyone can read. Readers skip a line that does not parse (a torn last line after a
crash) and count it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hetslurm.act import ActError

#: Entry kinds: ``decision`` (a judged job and its evidence), ``warning`` (the notice that
#: must precede an action), ``action`` (what was done and what Slurm showed afterwards),
#: ``notify`` (a notice sent), ``run`` (one run's summary).
KINDS = ("decision", "warning", "action", "notify", "run")


class ActionLog:
    """An append-only JSON-lines file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.bad_lines = 0

    def append(self, kind: str, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Write one entry (``kind`` and ``logged_at``, wall-clock epoch, are added)."""
        if kind not in KINDS:
            raise ValueError(f"unknown log entry kind {kind!r}")
        rec = {"kind": kind, "logged_at": round(time.time(), 3), **entry}
        line = json.dumps(rec, sort_keys=True, ensure_ascii=True, default=str) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o640)
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

    def entries(self, kind: str | None = None) -> Iterator[dict[str, Any]]:
        """Every parseable entry in order (of one ``kind`` when given)."""
        self.bad_lines = 0
        try:
            fh = open(self.path, encoding="ascii", errors="replace")  # noqa: SIM115
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ActError(f"cannot read action log {self.path}: {exc.strerror}") from exc
        with fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.bad_lines += 1
                    continue
                if isinstance(rec, dict) and (kind is None or rec.get("kind") == kind):
                    yield rec
