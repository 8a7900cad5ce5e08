"""The embedded metrics store: a shared folder of immutable per-node Parquet segments.

Layout (docs/metrics-and-audit.md)::

    <root>/<node>/<YYYY-MM-DD>/seg-<t0_ms>-<t1_ms>-<host>-<pid>-<seq>-<rand>.parquet
    <root>/<node>/<YYYY-MM-DD>/cmp-<t0_ms>-<t1_ms>-<host>-<pid>-<seq>-<rand>.parquet

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
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    from hetslurm.site.model import Site

_SEG_RE = re.compile(r"^(seg|cmp)-(\d+)-(\d+)-([A-Za-z0-9_.-]+)\.parquet$")
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
        return {"segments": self.segments, "samples": self.samples,
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
    def _name(self, kind: str, t0: float, t1: float) -> str:
        self._seq += 1
        return (f"{kind}-{_ms(t0)}-{_ms(t1)}-{self._tag}-{self._seq}-"
                f"{secrets.token_hex(4)}.parquet")

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
        target = folder / self._name(kind, t0, t1)
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
        for day in sorted(base.iterdir()):
            if not _DAY_RE.match(day.name):
                continue
            if day.is_symlink():
                if report:
                    report.refuse("symlink", day)
                continue
            # A segment lives under the day its first sample fell on; it may run past it.
            if (lo_day and day.name < lo_day) or (hi_day and day.name > hi_day):
                continue
            fsguard.check_dir(day, "metric store day folder", self.trusted)
            for p in sorted(day.iterdir()):
                if p.name.startswith("."):
                    continue  # a writer's temporary file
                m = _SEG_RE.match(p.name)
                if not m:
                    if report:
                        report.refuse("unknown_name", p)
                    continue
                seg = Segment(p, node, m.group(1), int(m.group(2)) / 1000,
                              int(m.group(3)) / 1000)
                if since is not None and seg.t1 < since:
                    continue
                if until is not None and seg.t0 >= until:
                    continue
                out.append(seg)
        return out

    # ------------------------------------------------------------------ reading
    def _open_checked(self, seg: Segment, report: ReadReport,
                      columns: Sequence[str] | None = None) -> Any | None:
        """Read one segment as an Arrow table, or refuse it (counted in ``report``)."""
        got = self._read_checked(seg, report, columns)
        return None if got is None else got[0]

    def _read_checked(self, seg: Segment, report: ReadReport,
                      columns: Sequence[str] | None = None
                      ) -> tuple[Any, float, float] | None:
        """One segment as (Arrow table, first time, last time), or None when refused.

        The file is opened once (``O_NOFOLLOW``: a symlink fails to open) and the checks
        run on that descriptor's ``fstat``, so what is checked is what is read: its bytes
        are read through the same descriptor and parsed from memory. The first and last
        time are NaN when the time column holds nulls or NaN.
        """
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            fd = os.open(seg.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise
        except OSError as exc:
            reason = "symlink" if seg.path.is_symlink() else "corrupt"
            report.refuse(reason, seg.path, exc.strerror or "")
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                report.refuse("not_regular", seg.path)
                return None
            if st.st_uid not in self.trusted:
                report.refuse("untrusted_owner", seg.path, f"uid {st.st_uid}")
                return None
            if st.st_mode & stat.S_IWOTH:
                report.refuse("writable_by_others", seg.path)
                return None
            try:
                data = _read_fd(fd, st.st_size)
            except OSError as exc:
                report.refuse("corrupt", seg.path, exc.strerror or "")
                return None
        finally:
            os.close(fd)
        try:
            buf = pa.py_buffer(data)
            try:
                pf = pq.ParquetFile(buf, read_dictionary=_DICT_COLUMNS, pre_buffer=False)
            except KeyError:
                # A text column is missing: the plain schema says which way it is forged.
                missing = (_schema_problem(pq.ParquetFile(buf, pre_buffer=False).schema_arrow)
                           or "a text column is missing")
                report.refuse("forged", seg.path, missing)
                return None
            wrong = _schema_problem(pf.schema_arrow)
            if wrong:
                report.refuse("forged", seg.path, wrong)
                return None
            cols = None if columns is None else list(dict.fromkeys(["time", "node", *columns]))
            have = set(pf.schema_arrow.names)
            # One thread: a segment is small, and a thread pool per file costs more than
            # it saves.
            table = pf.read(columns=None if cols is None else [c for c in cols if c in have],
                            use_threads=False)
            table = _with_missing_columns(table, COLUMNS if cols is None else cols)
        except (pa.ArrowException, OSError, ValueError) as exc:
            report.refuse("corrupt", seg.path, str(exc).splitlines()[0][:120])
            return None
        problem, lo, hi = _forgery(table, seg)
        if problem:
            report.refuse("forged", seg.path, problem)
            return None
        return table, lo, hi

    def _read_all(self, since: float | None, until: float | None,
                  nodes: Iterable[str] | None, report: ReadReport | None,
                  progress: Progress | None, columns: Sequence[str] | None
                  ) -> Iterator[tuple[Segment, Any, float, float]]:
        report = report if report is not None else ReadReport()
        if self.root.is_dir():
            self._check_root()
        wanted = list(nodes) if nodes is not None else self.nodes(report)
        plan = deque(s for n in wanted for s in self.segments(n, since, until, report))
        planned = {s.path for s in plan}
        done = 0
        seen: set[Path] = set()
        while plan:
            seg = plan.popleft()
            if seg.path in seen:
                continue
            seen.add(seg.path)
            try:
                got = self._read_checked(seg, report, columns)
            except FileNotFoundError:
                # Compacted away between listing and opening: its samples are in a newer
                # cmp- segment of the same node, which a fresh listing shows.
                for s in self.segments(seg.node, since, until):
                    if s.path not in seen and s.path not in planned:
                        planned.add(s.path)
                        plan.append(s)
                continue
            done += 1
            if progress:
                progress(done, done + len(plan))
            if got is not None:
                report.segments += 1
                yield seg, *got

    def read(self, since: float | None = None, until: float | None = None,
             nodes: Iterable[str] | None = None, progress: Progress | None = None,
             columns: Sequence[str] | None = None) -> tuple[Any, ReadReport]:
        """Samples with ``since <= time < until`` as a pandas DataFrame, and a report.

        ``columns`` limits what is read (``time`` and ``node`` always are); the others are
        absent from the frame.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        report = ReadReport()
        tables = []
        ranges: dict[str, list[tuple[float, float]]] = {}
        lo_bound = -math.inf if since is None else since
        hi_bound = math.inf if until is None else until
        for seg, table, lo, hi in self._read_all(since, until, nodes, report, progress,
                                                 columns):
            # A segment whose samples all lie in the window (checked on its samples, not
            # its name; NaN fails both tests) is taken whole.
            if not lo_bound <= lo <= hi < hi_bound:
                t = table.column("time")
                mask = None
                if since is not None:
                    mask = pc.greater_equal(t, since)
                if until is not None:
                    m2 = pc.less(t, until)
                    mask = m2 if mask is None else pc.and_(mask, m2)
                if mask is not None:
                    table = table.filter(mask)
            tables.append(table)
            ranges.setdefault(seg.node, []).append((seg.t0, seg.t1))
        if not tables:
            return empty_frame(), report
        merged = pa.concat_tables(tables, promote_options="permissive")
        tables.clear()
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


#: Segments of fewer rows are written the small way (see :func:`_write_options`).
SMALL_ROWS = 2048


def _write_options(rows: int) -> dict[str, Any]:
    """How a segment of ``rows`` samples is encoded.

    Big segments (a compacted day) are zstd-compressed and dictionary-encoded throughout. A
    collector's flush (80 rows at 8 GPUs, 30 s and 300 s) is uncompressed, with dictionary
    encoding for the text columns only, and without the serialized Arrow schema in its
    footer (the Parquet types read back as the same schema): on so few rows compression
    saves next to nothing, and a reader's cost is per file, column chunk and page (the
    footer, a decompression, a dictionary page), which for small files is nearly all the
    cost of reading them.
    """
    if rows >= SMALL_ROWS:
        return {"compression": "zstd"}
    return {"compression": "none", "use_dictionary": list(CATEGORICAL), "store_schema": False}


def _write_atomic(table: Any, target: Path) -> None:
    import pyarrow.parquet as pq

    tmp = target.parent / f".tmp-{target.name}"
    try:
        with open(tmp, "wb") as fh:
            pq.write_table(table, fh, **_write_options(table.num_rows))
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.rename(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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

    schema = arrow_schema()
    for name in wanted:
        if name not in table.schema.names:
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


def _forgery(table: Any, seg: Segment) -> tuple[str | None, float, float]:
    """What makes ``table`` not ``seg``'s (None: nothing), and its first and last time
    (NaN when the time column holds nulls or NaN)."""
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
    wrong = _out_of_range(table)
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
