"""The read cache of a recurring windowed read (``hetslurm rebalance`` every few minutes).

Each pass of the rebalance reads the last hour of the store: with the collector's 5-minute
segments, about eleven of every twelve files it opens were read, checked and parsed by the
pass before. Segments are immutable (a name is written once: writer, pid, sequence and a
random part; compaction writes new names and removes its inputs), so a segment's path names
its content. The cache keeps the segments one read accepted, whole (not cut to the window),
in one Arrow IPC file, and the next read takes from it every segment its listing still
shows instead of opening it again. What is new (the last flush, a compacted segment) is read
and checked as always.

The file is the reader's own (root's, for the cron entry point): opened without following a
symlink, refused unless it is a regular file owned by a trusted user and writable by no one
else, written to a temporary name in its folder and renamed into place (mode 0600). Any
doubt (another store, other columns, another version, a damaged file) makes it a miss: the
read is the cold one. A segment the store refuses is never cached, so it is refused again
by every read, as without the cache. What a cached segment held is what its first read
accepted; a file changed in place afterwards (which no hetslurm writer does) is not seen.

Layout: the accepted segments' rows, segment after segment, in the columns read; schema
metadata ``hetslurm-window-cache`` holds JSON ``{"v", "root", "columns", "segments":
[[path, rows], ...]}``.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetslurm import fsguard
from hetslurm.errors import PermissionsError

VERSION = 1
KEY = b"hetslurm-window-cache"


class WindowCache:
    """The cache file at ``path`` for reads of the store at ``root`` in ``columns``."""

    def __init__(self, path: str | Path, root: str | Path, columns: Sequence[str]) -> None:
        self.path = Path(path)
        self.root = os.path.realpath(root)
        self.columns = list(columns)
        #: Why the last load missed (None: it hit, or nothing was there).
        self.miss: str | None = None

    def load(self) -> dict[str, Any]:
        """Segment path -> its cached Arrow table (slices of one memory map); empty on a
        miss, ``miss`` saying why when something was there but could not be used."""
        import pyarrow as pa

        self.miss = None
        try:
            fd = fsguard.open_checked(self.path, os.O_RDONLY, "rebalance read cache")
        except FileNotFoundError:
            return {}
        except (PermissionsError, OSError) as exc:
            self.miss = str(exc)
            return {}
        try:
            try:
                # Mapped, not copied: the tables are slices of the file's pages (the map
                # lives as long as they do).
                data = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            reader = pa.ipc.open_file(pa.py_buffer(data))
            meta = json.loads((reader.schema.metadata or {}).get(KEY, b"{}"))
            if meta.get("v") != VERSION or meta.get("root") != self.root \
                    or meta.get("columns") != self.columns:
                self.miss = "written for another store, version or set of columns"
                return {}
            table = reader.read_all()
            table = table.replace_schema_metadata(None)
            out: dict[str, Any] = {}
            off = 0
            for path, rows in meta["segments"]:
                out[str(path)] = table.slice(off, int(rows))
                off += int(rows)
            if off != table.num_rows:
                self.miss = "its index does not match its rows"
                return {}
            return out
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            self.miss = f"unreadable: {str(exc).splitlines()[0][:120] if str(exc) else exc}"
            return {}

    def save(self, table: Any, segments: Sequence[tuple[str, int]]) -> str | None:
        """Write ``table``, the accepted segments of this read (whole, one after the other
        in the order of ``segments``: ``(path, rows)``); returns a problem line instead of
        raising."""
        import pyarrow as pa

        try:
            folder = self.path.parent
            fsguard.make_dir(folder, "rebalance read cache folder")
            meta = {"v": VERSION, "root": self.root, "columns": self.columns,
                    "segments": [[p, int(n)] for p, n in segments]}
            if sum(n for _, n in segments) != table.num_rows:
                raise ValueError("the segments' rows do not add up to the table's")
            # One dictionary per text column for the whole file (the IPC file format
            # allows no dictionary replacement between batches).
            table = table.unify_dictionaries().combine_chunks()
            table = table.replace_schema_metadata({KEY: json.dumps(meta).encode()})
            fd, tmp = tempfile.mkstemp(prefix=".window-cache-", dir=folder)
            try:
                with os.fdopen(fd, "wb") as fh, pa.ipc.new_file(fh, table.schema) as w:
                    w.write_table(table, max_chunksize=1 << 20)
                os.chmod(tmp, 0o600)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return None
        except (PermissionsError, OSError, ValueError, pa.ArrowException) as exc:
            return f"read cache {self.path} not written: {exc}"
