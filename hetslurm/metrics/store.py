"""The embedded metrics store: a shared folder of immutable per-node segments.

Layout (docs/metrics-and-audit.md)::

    <root>/<node>/<YYYY-MM-DD>/seg-<t0_ms>-<t1_ms>-<host>-<pid>-<seq>-<rand>.arrow
    <root>/<node>/<YYYY-MM-DD>/cmp-<t0_ms>-<t1_ms>-<host>-<pid>-<seq>-<rand>.parquet

A segment of fewer than :data:`SMALL_ROWS` samples (a collector's flush) is an Arrow IPC file
(``.arrow``, uncompressed); a bigger one (a compacted day) is Parquet (``.parquet``, zstd).
Readers take either suffix whatever the size, so a store written before small segments were
Arrow files reads as before. Reading the last hour is opening thousands of small files, and
an Arrow file costs a tenth of a Parquet one to open (no Thrift footer, no pages to decode;
docs/collector.md, "What a read of the last hour costs").

A segment is written to a dot-named temporary file in its final folder and renamed into
place, so a reader sees a whole segment or none. Names are unique per writer (host, pid,
sequence, random), so many collectors and a compactor can share the folder; a clock that
jumps back cannot make two segments collide. Compaction (``cmp-``) writes the merged segment
first and removes its inputs after, so a reader may see both for a moment: readers drop
duplicate samples (same node, minor and time).

Readers refuse, and count, segments that are symlinks, not regular files, owned by an
untrusted user, writable by others, unreadable (truncated, corrupt) or forged (wrong
columns, samples of another node, times outside the name's range, or readings
no collector writes: NaN, infinite, negative, utilization over 100, an interval outside
``[collector] interval_s``'s range). Refusals make a read
*partial*; nothing refused is deleted.

The folders are checked too (:mod:`hetslurm.fsguard`), by writers and readers alike: a root,
node or day folder writable by group or others, or owned by an untrusted user, lets someone
else delete or replace segments (and fewer samples can make a job look idle), so the store
refuses to write into or read from it with :class:`hetslurm.errors.PermissionsError`. Such a
folder can only come from an admin (no user can create one inside a root that passes), so
refusing the whole read is not something a user can provoke. Writers make folders 0755
whatever their umask.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import math
import os
import re
import secrets
import shutil
import socket
import stat
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetslurm import fsguard
from hetslurm.errors import MetricsError
from hetslurm.metrics.samples import (
    CATEGORICAL,
    COLUMNS,
    HEALTH_COLUMNS,
    arrow_schema,
    value_bounds,
)
from hetslurm.site.names import NODE_RE

if TYPE_CHECKING:
    from hetslurm.metrics.window_cache import WindowCache
    from hetslurm.site.model import Site

_SEG_RE = re.compile(r"^(seg|cmp)-(\d+)-(\d+)-([A-Za-z0-9_.-]+)\.(parquet|arrow)$")
_DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: Text columns, read dictionary-encoded (pandas categoricals).
_DICT_COLUMNS = list(CATEGORICAL)
#: Refusal reasons, in the order reports list them.
REFUSALS = ("symlink", "not_regular", "untrusted_owner", "writable_by_others", "corrupt",
            "forged", "unknown_name")

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class Segment:
    path: Path
    node: str
    kind: str  # seg | cmp
    t0: float
    t1: float


@dataclass
class ReadReport:
    """What a read found: segments read, samples, refusals by reason, and problems."""

    segments: int = 0
    #: Of ``segments``, how many came from a read cache rather than their files.
    cached: int = 0
    samples: int = 0
    duplicates_dropped: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return bool(sum(self.refused.values()))

    def refuse(self, reason: str, path: Path, detail: str = "") -> None:
        self.refused[reason] += 1
        if len(self.problems) < 50:
            self.problems.append(f"{reason}: {path}{': ' + detail if detail else ''}")

    def to_dict(self) -> dict[str, Any]:
        return {"segments": self.segments, "cached": self.cached, "samples": self.samples,
                "duplicates_dropped": self.duplicates_dropped,
                "refused": {r: self.refused.get(r, 0) for r in REFUSALS},
                "partial": self.partial, "problems": list(self.problems)}


def _ms(t: float) -> int:
    return round(t * 1000)


def day_of(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


class SegmentStore:
    """A store folder. ``trusted_uids`` adds owners to root and the current user."""

    def __init__(self, root: str | Path, trusted_uids: Iterable[int] = ()) -> None:
        self.root = Path(root)
        self.trusted = set(fsguard.trusted_uids(trusted_uids))
        self._seq = 0
        self._tag = f"{_safe(socket.gethostname())}-{os.getpid()}"

    @classmethod
    def of_site(cls, root: str | Path, site: Site | None) -> SegmentStore:
        """The store at ``root`` trusting the site's ``[collector] trusted_uids`` too."""
        conf = site.sections.get("collector") if site is not None else None
        return cls(root, conf.trusted_uids if conf is not None else ())

    # ------------------------------------------------------------------ writing
    def _name(self, kind: str, t0: float, t1: float, suffix: str) -> str:
        self._seq += 1
        return (f"{kind}-{_ms(t0)}-{_ms(t1)}-{self._tag}-{self._seq}-"
                f"{secrets.token_hex(4)}{suffix}")

    def _node_dir(self, node: str) -> Path:
        if not NODE_RE.match(node) or node in (".", ".."):
            raise MetricsError(f"'{node}' is not a node name the store accepts")
        return self.root / node

    def write(self, node: str, rows: Sequence[dict[str, Any]] | Any, *,
              kind: str = "seg") -> Path | None:
        """Write one immutable segment of ``node``'s samples (dict rows or an Arrow table).

        Returns its path, or None when there was nothing to write.
        """
        import pyarrow as pa

        schema = arrow_schema()
        table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(
            [dict(r) for r in rows], schema=schema)
        if table.num_rows == 0:
            return None
        times = table.column("time").to_pylist()
        t0, t1 = min(times), max(times)
        node_dir = self._node_dir(node)
        folder = node_dir / day_of(t0)
        fsguard.make_dir(self.root, "metric store", self.trusted, follow=True)
        fsguard.make_dir(node_dir, "metric store node folder", self.trusted)
        fsguard.make_dir(folder, "metric store day folder", self.trusted)
        target = folder / self._name(kind, t0, t1,
                                     ".arrow" if table.num_rows < SMALL_ROWS else ".parquet")
        _write_atomic(table, target)
        return target

    # ------------------------------------------------------------------ listing
    def nodes(self, report: ReadReport | None = None) -> list[str]:
        if not self.root.is_dir():
            return []
        self._check_root()
        out = []
        for p in sorted(self.root.iterdir()):
            if p.name.startswith("."):
                continue
            if p.is_symlink():
                if report:
                    report.refuse("symlink", p)
                continue
            if p.is_dir() and NODE_RE.match(p.name):
                fsguard.check_dir(p, "metric store node folder", self.trusted)
                out.append(p.name)
        return out

    def _check_root(self) -> None:
        # A root that is a symlink is an admin's choice (the store kept on another disk);
        # the folder it points at is what is checked.
        fsguard.check_dir(self.root, "metric store", self.trusted, follow=True)

    def segments(self, node: str, since: float | None = None, until: float | None = None,
                 report: ReadReport | None = None) -> list[Segment]:
        """Segments of ``node`` whose time range meets ``[since, until)``."""
        base = self._node_dir(node)
        out: list[Segment] = []
        if base.is_symlink():
            if report:
                report.refuse("symlink", base)
            return out
        if not base.is_dir():
            return out
        fsguard.check_dir(base, "metric store node folder", self.trusted)
        lo_day = day_of(since - 86400) if since is not None else None
        hi_day = day_of(until) if until is not None else None
        # Names sorted as strings (sorting Path objects costs ten times more), Paths made
        # only for the segments kept.
        for day_name in sorted(os.listdir(base)):
            if not _DAY_RE.match(day_name):
                continue
            day = base / day_name
            if day.is_symlink():
                if report:
                    report.refuse("symlink", day)
                continue
            # A segment lives under the day its first sample fell on; it may run past it.
            if (lo_day and day_name < lo_day) or (hi_day and day_name > hi_day):
                continue
            fsguard.check_dir(day, "metric store day folder", self.trusted)
            for name in sorted(os.listdir(day)):
                if name.startswith("."):
                    continue  # a writer's temporary file
                m = _SEG_RE.match(name)
                if not m:
                    if report:
                        report.refuse("unknown_name", day / name)
                    continue
                t0, t1 = int(m.group(2)) / 1000, int(m.group(3)) / 1000
                if since is not None and t1 < since:
                    continue
                if until is not None and t0 >= until:
                    continue
                out.append(Segment(day / name, node, m.group(1), t0, t1))
        return out

    # ------------------------------------------------------------------ reading
    def _open_checked(self, seg: Segment, report: ReadReport,
                      columns: Sequence[str] | None = None) -> Any | None:
        """Read one segment as an Arrow table, or refuse it (counted in ``report``)."""
        got = self._read_checked(seg, report, columns)
        return None if got is None else got[0]

    def _read_checked(self, seg: Segment, report: ReadReport,
                      columns: Sequence[str] | None = None, *, values: bool = True
                      ) -> tuple[Any, float, float] | None:
        """One segment as (Arrow table, first time, last time), or None when refused.

        The file is opened once (``O_NOFOLLOW``: a symlink fails to open) and the checks
        run on that descriptor's ``fstat``, so what is checked is what is read: its bytes
        are read through the same descriptor and parsed from memory. The first and last
        time are NaN when the time column holds nulls or NaN. ``values=False`` leaves the
        range check of the readings to the caller (:meth:`read` runs it once on all).
        FileNotFoundError (compacted away since the listing) is the caller's.
        """
        data = self._read_bytes(seg)
        got = data if isinstance(data, tuple) else _parse(seg, data, columns, values)
        return _parsed(seg, report, got)

    def _read_bytes(self, seg: Segment) -> bytes | tuple[str, str]:
        """The bytes of a segment that passes the file checks, or (refusal reason,
        detail). Touches no shared state, so it may run on any thread."""
        try:
            fd = os.open(seg.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            return "symlink" if seg.path.is_symlink() else "corrupt", exc.strerror or ""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return "not_regular", ""
            if st.st_uid not in self.trusted:
                return "untrusted_owner", f"uid {st.st_uid}"
            if st.st_mode & stat.S_IWOTH:
                return "writable_by_others", ""
            try:
                return _read_fd(fd, st.st_size)
            except OSError as exc:
                return "corrupt", exc.strerror or ""
        finally:
            os.close(fd)

    def _load(self, seg: Segment, columns: Sequence[str] | None, values: bool
              ) -> _Parsed | _Unchecked | None:
        """:meth:`_read_bytes` then :func:`_parse`, for a worker thread; None when the
        file is gone (compacted away since the listing).

        With ``values=False`` (:meth:`read`), an Arrow segment in the store's own layout
        comes back :class:`_Unchecked`: read and validated, its segment checks (node, times)
        left to :func:`_unchecked_problems`, which runs them on all such segments at once.
        """
        try:
            data = self._read_bytes(seg)
        except FileNotFoundError:
            return None
        if isinstance(data, tuple):
            return data
        if not values and seg.path.suffix == ".arrow":
            batch = _parse_ipc_quick(data, columns)
            if batch is not None:
                return _Unchecked(batch)
        return _parse(seg, data, columns, values)

    def _read_all(self, since: float | None, until: float | None,
                  nodes: Iterable[str] | None, report: ReadReport | None,
                  progress: Progress | None, columns: Sequence[str] | None,
                  *, values: bool = True, workers: int = 1,
                  reuse: Mapping[str, Any] | None = None
                  ) -> Iterator[tuple[Segment, Any, float, float]]:
        """Every planned segment that passes, in plan order. With ``workers`` > 1, that
        many threads open, check and parse segments (the system calls and Arrow's parsing
        release the GIL); refusals are still recorded here, in plan order. A segment whose
        path is in ``reuse`` is not opened: its table there is yielded (times NaN).

        With ``values=False`` a segment may come back :class:`_Unchecked` (times NaN,
        counted in ``report.segments``): the caller runs :func:`_unchecked_problems`."""
        from concurrent.futures import Future, ThreadPoolExecutor

        report = report if report is not None else ReadReport()
        if self.root.is_dir():
            self._check_root()
        wanted = list(nodes) if nodes is not None else self.nodes(report)
        plan = deque(s for n in wanted for s in self.segments(n, since, until, report))
        planned = {s.path for s in plan}
        done = 0
        seen: set[Path] = set()
        pool = (ThreadPoolExecutor(workers, thread_name_prefix="hetslurm-store")
                if workers > 1 and len(plan) > 1 else None)
        inflight: deque[tuple[Segment, Future[_Parsed | _Unchecked | None]]] = deque()
        fut: Future[_Parsed | _Unchecked | None]
        limit = 8 * workers
        try:
            while plan or inflight:
                if plan and (len(inflight) < limit or pool is None):
                    seg = plan.popleft()
                    if seg.path in seen:
                        continue
                    seen.add(seg.path)
                    cached = reuse.get(str(seg.path)) if reuse else None
                    if cached is not None:
                        fut = Future()
                        fut.set_result((cached, math.nan, math.nan))
                    elif pool is None:
                        fut = Future()
                        fut.set_result(self._load(seg, columns, values))
                    else:
                        fut = pool.submit(self._load, seg, columns, values)
                    inflight.append((seg, fut))
                    if pool is not None and plan and len(inflight) < limit:
                        continue
                seg, fut = inflight.popleft()
                loaded = fut.result()
                if loaded is None:
                    # Compacted away between listing and opening: its samples are in a
                    # newer cmp- segment of the same node, which a fresh listing shows.
                    for s in self.segments(seg.node, since, until):
                        if s.path not in seen and s.path not in planned:
                            planned.add(s.path)
                            plan.append(s)
                    continue
                done += 1
                if progress:
                    progress(done, done + len(plan) + len(inflight))
                if isinstance(loaded, _Unchecked):
                    report.segments += 1
                    yield seg, loaded, math.nan, math.nan
                    continue
                got = _parsed(seg, report, loaded)
                if got is not None:
                    report.segments += 1
                    yield seg, *got
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def read(self, since: float | None = None, until: float | None = None,
             nodes: Iterable[str] | None = None, progress: Progress | None = None,
             columns: Sequence[str] | None = None, workers: int | None = None,
             cache: WindowCache | None = None) -> tuple[Any, ReadReport]:
        """Samples with ``since <= time < until`` as a pandas DataFrame, and a report.

        ``columns`` limits what is read (``time`` and ``node`` always are); the others are
        absent from the frame. ``workers`` threads parse segments (default: up to 4, no
        more than the CPUs this process may use).

        Every segment is checked whole, as :meth:`_read_checked` checks it; the range
        check of the readings runs once over all of them (one pass over each column, not
        one per segment) and, only when it finds a bad reading, again per segment to
        refuse the ones that hold it. The window is then cut once, on the whole.

        ``cache`` (:mod:`hetslurm.metrics.window_cache`): segments an earlier read accepted
        are taken from it instead of being opened again, and this read's accepted segments
        replace its content; the frame is the one a read without it gives.
        """
        import pyarrow.compute as pc

        report = ReadReport()
        read: list[tuple[Segment, Any]] = []
        workers = _default_workers() if workers is None else max(1, workers)
        reuse = cache.load() if cache is not None else None
        if cache is not None and cache.miss:
            report.problems.append(f"read cache not used: {cache.miss}")
        for seg, table, _lo, _hi in self._read_all(since, until, nodes, report, progress,
                                                   columns, values=False, workers=workers,
                                                   reuse=reuse):
            read.append((seg, table))
        read = self._check_unchecked(read, report, columns)
        report.cached = sum(1 for seg, _ in read if reuse and str(seg.path) in reuse)
        merged = _concat([t for _, t in read]) if read else None
        if merged is not None and _out_of_range(merged):
            kept = []
            for seg, table in read:
                wrong = _out_of_range(table)
                if wrong:
                    report.refuse("forged", seg.path, wrong)
                    report.segments -= 1
                else:
                    kept.append((seg, table))
            read = kept
            merged = _concat([t for _, t in read]) if read else None
        if merged is None:
            return empty_frame(), report
        ranges: dict[str, list[tuple[float, float]]] = {}
        for seg, _ in read:
            ranges.setdefault(seg.node, []).append((seg.t0, seg.t1))
        if cache is not None:
            problem = cache.save(merged, [(str(seg.path), table.num_rows)
                                          for seg, table in read])
            if problem:
                report.problems.append(problem)
        read.clear()
        reuse = None
        t = merged.column("time")
        mask = None
        if since is not None:
            mask = pc.greater_equal(t, since)
        if until is not None:
            m2 = pc.less(t, until)
            mask = m2 if mask is None else pc.and_(mask, m2)
        if mask is not None:
            # Nulls and NaN in the time column fail both tests and are dropped.
            mask = pc.fill_null(mask, False)
            if not pc.all(mask).as_py():
                merged = merged.filter(mask)
        # self_destruct frees each Arrow column as it is converted: one copy, not two.
        frame = merged.to_pandas(self_destruct=True, split_blocks=True)
        del merged
        if _overlapping(ranges) and "minor" in frame.columns:
            before = len(frame)
            frame = frame.drop_duplicates(subset=["node", "minor", "time"], keep="first")
            report.duplicates_dropped = before - len(frame)
        frame = frame.reset_index(drop=True)
        report.samples = len(frame)
        return normalise_frame(frame), report

    def _check_unchecked(self, read: list[tuple[Segment, Any]], report: ReadReport,
                         columns: Sequence[str] | None) -> list[tuple[Segment, Any]]:
        """``read`` with each :class:`_Unchecked` segment checked (all at once) and turned
        into a table; one that fails is read again the whole way, which refuses it with
        the reason and detail a one-segment read gives."""
        import pyarrow as pa

        pending = [i for i, (_, t) in enumerate(read) if isinstance(t, _Unchecked)]
        if not pending:
            return read
        flagged = _unchecked_problems([read[i][0] for i in pending],
                                      [read[i][1].batch for i in pending])
        suspect = {pending[k] for k in flagged}
        out: list[tuple[Segment, Any]] = []
        for i, (seg, t) in enumerate(read):
            if not isinstance(t, _Unchecked):
                out.append((seg, t))
            elif i not in suspect:
                out.append((seg, pa.Table.from_batches([t.batch])))
            else:
                report.segments -= 1
                try:
                    got = self._read_checked(seg, report, columns)
                except FileNotFoundError:
                    report.refuse("corrupt", seg.path, "removed while it was read")
                    continue
                if got is not None:
                    report.segments += 1
                    out.append((seg, got[0]))
        return out

    def latest(self, max_age_s: float, now: float | None = None) -> Any:
        """The newest sample of every GPU seen in the last ``max_age_s`` seconds."""
        now = time.time() if now is None else now
        frame, _ = self.read(since=now - max_age_s)
        if frame.empty:
            return frame
        frame = frame.sort_values("time")
        return frame.groupby(["node", "minor"], observed=True, sort=False).tail(1)

    # ------------------------------------------------------------------ upkeep
    def compact(self, older_than_s: float = 3600, now: float | None = None,
                nodes: Iterable[str] | None = None) -> dict[str, int]:
        """Merge each node's and day's segments older than ``older_than_s`` into one.

        Refused segments are left in place (and counted); inputs are removed only after the
        merged segment is safely renamed into place.
        """
        import pyarrow as pa

        now = time.time() if now is None else now
        stats = Counter[str]()
        for node in (list(nodes) if nodes is not None else self.nodes()):
            with self._lock(node):
                by_day: dict[str, list[Segment]] = {}
                for seg in self.segments(node):
                    if seg.t1 < now - older_than_s:
                        by_day.setdefault(seg.path.parent.name, []).append(seg)
                for segs in by_day.values():
                    if len(segs) < 2:
                        continue
                    report = ReadReport()
                    good: list[tuple[Segment, Any]] = []
                    for seg in segs:
                        with contextlib.suppress(FileNotFoundError):
                            table = self._open_checked(seg, report)
                            if table is not None:
                                good.append((seg, _plain(table)))
                    stats["refused"] += sum(report.refused.values())
                    if len(good) < 2:
                        continue
                    merged = pa.concat_tables([t for _, t in good]).sort_by("time")
                    self.write(node, merged, kind="cmp")
                    for seg, _ in good:
                        seg.path.unlink(missing_ok=True)
                    stats["merged"] += len(good)
                    stats["written"] += 1
        return dict(stats)

    def prune(self, retention_days: int, now: float | None = None) -> int:
        """Remove day folders older than ``retention_days``; returns how many."""
        now = time.time() if now is None else now
        cutoff = day_of(now - retention_days * 86400)
        removed = 0
        for node in self.nodes():
            with self._lock(node):
                for day in sorted(self._node_dir(node).iterdir()):
                    if _DAY_RE.match(day.name) and day.name < cutoff and not day.is_symlink():
                        shutil.rmtree(day)
                        removed += 1
        return removed

    @contextlib.contextmanager
    def _lock(self, node: str) -> Iterator[None]:
        d = self._node_dir(node)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / ".compact.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", text)[:40] or "host"


def _ParquetReader() -> Any:
    """Arrow's Parquet reader without ``pq.ParquetFile``'s wrapper, whose per-file Python
    work (nested-path maps, schema conversions) costs a fifth of a small segment's read;
    ``ParquetFile`` itself where this pyarrow lacks it."""
    try:
        from pyarrow._parquet import ParquetReader
    except ImportError:  # pragma: no cover - every pyarrow >= 14 has it
        return _FileReader()
    return ParquetReader()


class _FileReader:
    """``pq.ParquetFile`` behind the three calls :func:`_parse` makes."""

    def open(self, buf: Any, **kw: Any) -> None:
        import pyarrow.parquet as pq

        self._pf = pq.ParquetFile(buf, **kw)
        self.schema_arrow = self._pf.schema_arrow

    def read_all(self, column_indices: Any, use_threads: bool) -> Any:
        names = None if column_indices is None else \
            [self.schema_arrow.names[i] for i in column_indices]
        return self._pf.read(columns=names, use_threads=use_threads)


#: What :func:`_parse` gives back: (table, first time, last time) or (reason, detail).
_Parsed = tuple[Any, float, float] | tuple[str, str]


def _parse(seg: Segment, data: bytes, columns: Sequence[str] | None, values: bool
           ) -> _Parsed:
    """A segment's bytes as (Arrow table, first time, last time), or (refusal reason,
    detail). Touches no shared state, so it may run on any thread."""
    import pyarrow as pa

    decode = _decode_ipc if seg.path.suffix == ".arrow" else _decode_parquet
    try:
        table = decode(data, _wanted(columns))
    except (pa.ArrowException, OSError, ValueError) as exc:
        return "corrupt", str(exc).splitlines()[0][:120]
    if isinstance(table, str):
        return "forged", table
    problem, lo, hi = _forgery(table, seg, values=values)
    if problem:
        return "forged", problem
    return table, lo, hi


def _wanted(columns: Sequence[str] | None) -> list[str] | None:
    """The columns a read of ``columns`` gives, in order: time and node first (None: all)."""
    return None if columns is None else list(dict.fromkeys(["time", "node", *columns]))


def _decode_parquet(data: bytes, cols: list[str] | None) -> Any:
    """A Parquet segment's ``cols`` (None: all) as a table, or what makes its schema not the
    store's (a string). Arrow errors are the caller's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = pa.py_buffer(data)
    try:
        reader = _ParquetReader()
        reader.open(buf, read_dictionary=_DICT_COLUMNS, pre_buffer=False)
    except KeyError:
        # A text column is missing: the plain schema says which way it is forged.
        return (_schema_problem(pq.ParquetFile(buf, pre_buffer=False).schema_arrow)
                or "a text column is missing")
    schema = reader.schema_arrow
    wrong = _schema_problem(schema)
    if wrong:
        return wrong
    # The store's schema is flat: a field's index is its Parquet column's. One thread:
    # a segment is small, and a thread pool per file costs more than it saves.
    index = None if cols is None else [i for i in (schema.get_field_index(c)
                                                   for c in cols) if i >= 0]
    table = reader.read_all(column_indices=index, use_threads=False)
    return _with_missing_columns(table, COLUMNS if cols is None else cols)


def _decode_ipc(data: bytes, cols: list[str] | None) -> Any:
    """:func:`_decode_parquet` for an Arrow IPC segment (``.arrow``).

    The record batches are validated in full (offsets, dictionary indices, UTF-8) before
    anything reads them: an IPC file is used as it lies in memory, so a corrupt one must not
    reach a kernel. Text columns come back dictionary-encoded, as from Parquet.
    """
    import pyarrow as pa

    reader = pa.ipc.open_file(pa.py_buffer(data))
    schema = reader.schema
    wrong = _schema_problem(schema)
    if wrong:
        return wrong
    table = reader.read_all()
    table.validate(full=True)
    names = schema.names
    if cols is not None:
        have = [c for c in cols if c in names]
        if have != names:
            table = table.select(have)
    return _with_missing_columns(_as_expected(table), COLUMNS if cols is None else cols)


class _Unchecked:
    """An Arrow segment read and validated whose segment checks are still to run."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch


@functools.lru_cache(maxsize=64)
def _quick_indices(columns: tuple[str, ...] | None) -> list[int] | None:
    """Field indices, in the order a read gives them, of ``columns`` plus time and node in
    the store's schema (None: every column)."""
    cols = _wanted(columns)
    if cols is None:
        return None
    names = _expected_schema().names
    return [names.index(c) for c in cols if c in names]


def _parse_ipc_quick(data: bytes, columns: Sequence[str] | None) -> Any | None:
    """The columns of an Arrow segment written in the store's own layout (its schema, one
    record batch), validated in full, as a record batch; None for anything else, which
    :func:`_parse` then reads (and refuses, if it must) the whole way."""
    import pyarrow as pa

    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        if reader.num_record_batches != 1 or not reader.schema.equals(_expected_schema()):
            return None
        batch = reader.get_batch(0)
        index = _quick_indices(None if columns is None else tuple(columns))
        if index is not None:
            batch = batch.select(index)
        batch.validate(full=True)
    except (pa.ArrowException, OSError, ValueError):
        return None
    return batch


def _unchecked_problems(segs: Sequence[Segment], batches: Sequence[Any]) -> set[int]:
    """Positions of the batches that may fail :func:`_forgery`'s segment checks: no samples, a
    node other than its segment's or a null one, a time that is null, NaN or outside the
    name's range. Times are checked on all batches at once; a batch named here is read
    again the whole way, so a false alarm costs time, never a sample."""
    import numpy as np
    import pyarrow as pa

    suspect: set[int] = set()
    lengths = np.fromiter((b.num_rows for b in batches), dtype=np.int64, count=len(batches))
    for k, (seg, b, n) in enumerate(zip(segs, batches, lengths.tolist(), strict=True)):
        node = b.column("node")
        if (n == 0 or node.null_count or len(node.dictionary) != 1
                or node.dictionary[0].as_py() != seg.node):
            suspect.add(k)
    nonempty = lengths > 0
    if not nonempty.any():
        return suspect
    times = pa.chunked_array([b.column("time") for b in batches],
                             type=pa.float64()).to_numpy()
    starts = (np.cumsum(lengths) - lengths)[nonempty]
    lo, hi = np.minimum.reduceat(times, starts), np.maximum.reduceat(times, starts)
    t0 = np.fromiter((s.t0 for s in segs), dtype=np.float64, count=len(segs))[nonempty]
    t1 = np.fromiter((s.t1 for s in segs), dtype=np.float64, count=len(segs))[nonempty]
    with np.errstate(invalid="ignore"):
        # round(x * 1000) as _ms rounds (half to even, as numpy does); NaN compares false.
        ok = (np.isfinite(lo) & np.isfinite(hi) & (np.round(lo * 1000) >= np.round(t0 * 1000))
              & (np.round(hi * 1000) <= np.round(t1 * 1000)))
    nulls = np.fromiter((b.column("time").null_count for b in batches), dtype=np.int64,
                        count=len(batches))[nonempty]
    ok &= nulls == 0
    where = np.flatnonzero(nonempty)
    suspect.update(where[np.flatnonzero(~ok)].tolist())
    return suspect


def _as_expected(table: Any) -> Any:
    """``table`` with each column in the type a read gives (text dictionary-encoded): a
    no-op for what :meth:`SegmentStore.write` wrote."""
    import pyarrow as pa

    expected = _expected_schema()
    target = pa.schema([expected.field(name) for name in table.schema.names])
    return table if table.schema.equals(target) else table.cast(target)


def _parsed(seg: Segment, report: ReadReport, got: _Parsed
            ) -> tuple[Any, float, float] | None:
    """:func:`_parse`'s answer, a refusal recorded in ``report``."""
    if len(got) == 2:
        report.refuse(got[0], seg.path, got[1])
        return None
    return got


def _default_workers() -> int:
    """Threads that parse segments: up to 4, no more than the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def _concat(tables: list[Any]) -> Any:
    import pyarrow as pa

    return pa.concat_tables(tables, promote_options="permissive")


def _read_fd(fd: int, size: int) -> bytes:
    """The ``size`` bytes (from fstat) of ``fd``, fewer when the file is shorter."""
    parts: list[bytes] = []
    got = 0
    while got < size:
        chunk = os.read(fd, size - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


#: Segments of fewer rows are Arrow IPC files (:func:`_write_ipc`), others zstd Parquet.
#: A collector's flush (80 rows at 8 GPUs, 30 s and 300 s) is small: a reader's cost for it
#: is per file, which Arrow keeps to a footer read and a validation; a compacted day is big,
#: and compressed Parquet is a quarter of its size.
SMALL_ROWS = 2048


def _write_atomic(table: Any, target: Path) -> None:
    import pyarrow.parquet as pq

    tmp = target.parent / f".tmp-{target.name}"
    try:
        with open(tmp, "wb") as fh:
            if target.suffix == ".arrow":
                _write_ipc(table, fh)
            else:
                pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_ipc(table: Any, fh: Any) -> None:
    """A small segment as an Arrow IPC file: one record batch, uncompressed, text columns
    dictionary-encoded (the schema :func:`_expected_schema` reads back), so a reader maps
    it as it lies without a decode step."""
    import pyarrow as pa

    table = _as_expected(table.combine_chunks())
    with pa.ipc.new_file(fh, table.schema) as writer:
        writer.write_table(table)


def _plain(table: Any) -> Any:
    """Dictionary columns back to plain strings (the schema segments are written in)."""
    return table.cast(arrow_schema())


@functools.cache
def _expected_schema() -> Any:
    """The schema a segment written by :meth:`SegmentStore.write` reads back with."""
    import pyarrow as pa

    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type))
                      if f.name in CATEGORICAL else f for f in arrow_schema()])


#: The columns of a segment written before the device-health columns existed.
_OLDER_COLUMNS = [c for c in COLUMNS if c not in HEALTH_COLUMNS]


def _with_missing_columns(table: Any, wanted: Iterable[str]) -> Any:
    """``table`` with every column of ``wanted`` it lacks (a segment written before that
    column existed: only HEALTH_COLUMNS pass the schema check) appended as nulls, in the
    store's type, so old and new segments concatenate and compact alike."""
    import pyarrow as pa

    have = set(table.schema.names)
    missing = [name for name in wanted if name not in have]
    if not missing:
        return table  # the common case: one set, no column touched
    schema = arrow_schema()
    for name in missing:
        table = table.append_column(schema.field(name),
                                    pa.nulls(table.num_rows, schema.field(name).type))
    return table


def _schema_problem(schema: Any) -> str | None:
    import pyarrow as pa

    if schema.equals(_expected_schema()):
        return None  # the common case, in one comparison; anything else is examined below
    names = schema.names
    if names != list(COLUMNS) and names != _OLDER_COLUMNS:
        return f"columns {names} are not the store's"
    for f in arrow_schema():
        if f.name not in names:
            continue  # a column added since (HEALTH_COLUMNS): read as null
        got = schema.field(f.name).type
        if pa.types.is_dictionary(got):
            got = got.value_type
        if got != f.type:
            return f"column {f.name} is {got}, not {f.type}"
    return None


def _forgery(table: Any, seg: Segment, *, values: bool = True
             ) -> tuple[str | None, float, float]:
    """What makes ``table`` not ``seg``'s (None: nothing), and its first and last time
    (NaN when the time column holds nulls or NaN). ``values=False`` leaves out the range
    check of the readings (:func:`_out_of_range`), which the caller then runs."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    nan = math.nan
    if table.num_rows == 0:
        return "no samples", nan, nan
    col = table.column("node")
    # Fast path: a dictionary column without nulls whose every dictionary holds only this
    # node can hold no other value. Anything else is checked value by value.
    if not (col.null_count == 0 and pa.types.is_dictionary(col.type)
            and all(c.dictionary.to_pylist() == [seg.node] for c in col.chunks)):
        nodes = pc.unique(col.cast(pa.string())).to_pylist()
        if nodes != [seg.node]:
            return f"holds samples of {nodes}, stored under {seg.node}", nan, nan
    times = np.asarray(table.column("time").to_numpy())  # nulls become NaN
    first, last = float(times.min()), float(times.max())  # NaN if any is
    if math.isnan(first):
        # Nulls or NaN: the range of the other samples, as Arrow computes it (a windowed
        # read drops the timeless rows; so does every judgement of a window).
        bounds = pc.min_max(table.column("time"))
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
    else:
        lo, hi = first, last
    if (lo is None or not (math.isfinite(lo) and math.isfinite(hi))  # all NaN, or infinite
            or _ms(lo) < _ms(seg.t0) or _ms(hi) > _ms(seg.t1)):
        return f"sample times {lo}..{hi} lie outside the name's range", nan, nan
    wrong = _out_of_range(table) if values else None
    if wrong:
        return wrong, nan, nan
    return None, first, last


_bounds = functools.cache(value_bounds)


def _out_of_range(table: Any) -> str | None:
    """The first reading no collector writes (NaN, infinite, negative, a utilization over
    100, an interval outside ``[collector] interval_s``'s range), named with its column;
    None when every value read is in range. Nulls are allowed (NVML gave no value)."""
    import numpy as np
    import numpy.typing as npt

    names = table.schema.names  # one list, not one per column looked up
    for name, (lo, hi) in _bounds().items():
        if name not in names:
            continue
        col = table.column(names.index(name))
        nulls = col.null_count
        if nulls == len(col):
            continue
        a = col.to_numpy()  # nulls read as NaN: told apart from real NaN by their count
        # fmin/fmax skip NaN; a NaN that is not a null is counted on its own.
        f: npt.NDArray[np.float64] = np.asarray(a, dtype=np.float64)
        if (float(np.fmin.reduce(f)) >= lo and float(np.fmax.reduce(f)) <= hi
                and np.count_nonzero(np.isnan(a)) == nulls):
            continue
        valid = np.ones(len(a), dtype=bool)
        if nulls:
            valid = col.is_valid().to_numpy(zero_copy_only=False)
        bad = a[valid & ~((a >= lo) & (a <= hi))][0]
        return f"column {name} holds {float(bad)!r}, outside [{lo:g}, {hi:g}]"
    return None


def _overlapping(ranges: dict[str, list[tuple[float, float]]]) -> bool:
    for spans in ranges.values():
        spans = sorted(spans)
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            if s2 <= e1:
                return True
    return False


def empty_frame() -> Any:
    import pandas as pd

    return normalise_frame(pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS}))


def normalise_frame(frame: Any) -> Any:
    """Column types the audit relies on: nullable ids, float metrics, categorical labels."""
    import pandas as pd

    out = frame
    have = set(out.columns)
    for col in ("job_id", "slurm_index", "minor", "nvml_index", "ecc_uncorrectable", "xid"):
        if col in have:
            out[col] = out[col].astype("Int64")
    for col in ("utilization_pct", "memory_used_mib", "memory_total_mib", "power_w",
                "interval_s"):
        if col in have and out[col].dtype.kind != "f":
            out[col] = pd.to_numeric(out[col], errors="coerce").astype("float64")
    out["time"] = pd.to_numeric(out["time"], errors="coerce").astype("float64")
    for col in CATEGORICAL:
        if col in have and not isinstance(out[col].dtype, pd.CategoricalDtype):
            out[col] = out[col].astype("category")
    for col in ("attributed", "clock_jump"):
        if col in have:
            out[col] = out[col].astype("boolean")
    return out
