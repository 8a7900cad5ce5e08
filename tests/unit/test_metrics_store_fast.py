"""The segment store's fast read of many small segments: one open per file, the checks on
that open file, segments inside the window taken whole, small segments written for cheap
reading; and that none of it lets a refused segment through."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hetslurm.metrics.samples import COLUMNS
from hetslurm.metrics.store import SMALL_ROWS, ReadReport, SegmentStore, day_of

T0 = 1_796_000_000.0
STALL = ("time", "node", "minor", "job_id", "utilization_pct", "status", "interval_s")


def rows(node: str, t0: float, n: int, minors: int = 2) -> list[dict[str, Any]]:
    out = []
    for k in range(n):
        for m in range(minors):
            r = dict.fromkeys(COLUMNS)
            r.update(time=t0 + k, node=node, minor=130 + m, slurm_index=m, status="ok",
                     utilization_pct=float((10 * m + k) % 101), interval_s=1.0,
                     attributed=True,
                     clock_jump=False, job_id=5 if m == 0 else None)
            out.append(r)
    return out


def _codec(path: Path) -> str:
    import pyarrow.parquet as pq

    return str(pq.ParquetFile(path).metadata.row_group(0).column(0).compression)


def test_small_segments_are_arrow_files_and_big_ones_zstd_parquet(tmp_path: Path) -> None:
    import pyarrow as pa

    from hetslurm.metrics.store import _expected_schema

    st = SegmentStore(tmp_path)
    small = st.write("gpu1", rows("gpu1", T0, 40))
    big = st.write("gpu1", rows("gpu1", T0 + 100, SMALL_ROWS))
    assert small is not None and big is not None
    assert small.suffix == ".arrow" and big.suffix == ".parquet"
    assert _codec(big) == "ZSTD"
    # One uncompressed record batch, text columns dictionary-encoded: read as it lies.
    reader = pa.ipc.open_file(small)
    assert reader.num_record_batches == 1 and reader.schema.equals(_expected_schema())
    frame, rep = st.read()
    assert len(frame) == 80 + 2 * SMALL_ROWS and not rep.partial
    assert str(frame["node"].dtype) == "category" and frame["job_id"].dtype.name == "Int64"


def test_small_parquet_segments_of_earlier_versions_still_read(tmp_path: Path) -> None:
    """Before small segments were Arrow files they were uncompressed Parquet without the
    stored Arrow schema; a store holding both reads and compacts as one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hetslurm.metrics.samples import CATEGORICAL, arrow_schema

    st = SegmentStore(tmp_path)
    old = tmp_path / "gpu1" / day_of(T0)
    old.mkdir(parents=True)
    table = pa.Table.from_pylist(rows("gpu1", T0, 10), schema=arrow_schema())
    name = f"seg-{int(T0 * 1000)}-{int((T0 + 9) * 1000)}-old-1-1-ab.parquet"
    pq.write_table(table, old / name, compression="none", use_dictionary=list(CATEGORICAL),
                   store_schema=False)
    os.chmod(old / name, 0o644)
    new = st.write("gpu1", rows("gpu1", T0 + 10, 10))
    assert new is not None and new.suffix == ".arrow"
    frame, rep = st.read(columns=STALL)
    assert len(frame) == 40 and rep.segments == 2 and not rep.partial
    assert sorted(frame["time"].unique()) == [T0 + k for k in range(20)]
    stats = st.compact(older_than_s=60, now=T0 + 100_000)
    assert stats["merged"] == 2 and stats["written"] == 1
    after, rep = st.read(columns=STALL)
    assert len(after) == 40 and rep.segments == 1


def test_zstd_segments_of_earlier_versions_still_read_and_compact(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hetslurm.metrics.samples import arrow_schema

    st = SegmentStore(tmp_path)
    # A segment as earlier versions wrote it (zstd, every column dictionary-encoded).
    old = tmp_path / "gpu1" / day_of(T0)
    old.mkdir(parents=True)
    table = pa.Table.from_pylist(rows("gpu1", T0, 10), schema=arrow_schema())
    name = f"seg-{int(T0 * 1000)}-{int((T0 + 9) * 1000)}-old-1-1-ab.parquet"
    pq.write_table(table, old / name, compression="zstd")
    os.chmod(old / name, 0o644)
    for k in range(1, 4):
        st.write("gpu1", rows("gpu1", T0 + 1000 * k, 10))
    frame, rep = st.read()
    assert len(frame) == 80 and rep.segments == 4 and not rep.partial
    # Compaction keeps every sample, whatever each input's encoding.
    stats = st.compact(older_than_s=60, now=T0 + 100_000)
    assert stats["merged"] == 4 and stats["written"] == 1
    after, rep = st.read()
    assert len(after) == 80 and rep.segments == 1
    cols = ["time", "minor", "utilization_pct"]
    assert after[cols].sort_values(cols).reset_index(drop=True).equals(
        frame[cols].sort_values(cols).reset_index(drop=True))


@pytest.mark.parametrize(("since", "until", "expect"), [
    (None, None, 60),  # no window: everything
    (T0, T0 + 30, 60),  # every segment inside: taken whole
    (T0 + 5, T0 + 25, 40),  # the window cuts the first and last segments
    (T0 + 10, T0 + 20, 20),  # exactly the middle segment (until is exclusive)
    (T0 + 9, T0 + 10, 2),  # the last sample of the first segment
    (T0 + 29.5, T0 + 100, 0),  # after every sample
])
def test_window_is_exact_whether_a_segment_is_inside_or_cut(
        tmp_path: Path, since: float | None, until: float | None, expect: int) -> None:
    st = SegmentStore(tmp_path)
    for k in range(3):
        st.write("gpu1", rows("gpu1", T0 + 10 * k, 10))
    frame, _ = st.read(since, until, columns=STALL)
    assert len(frame) == expect
    if expect:
        lo = -1e18 if since is None else since
        hi = 1e18 if until is None else until
        assert frame["time"].between(lo, hi, inclusive="left").all()
        assert set(frame.columns) == set(STALL)


def test_each_segment_is_opened_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = SegmentStore(tmp_path)
    for k in range(5):
        st.write("gpu1", rows("gpu1", T0 + 10 * k, 10))
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if str(path).endswith((".parquet", ".arrow")):
            opened.append(str(path))
            assert flags & os.O_NOFOLLOW  # a symlink can never be opened through
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", counting_open)
    frame, rep = st.read(columns=STALL)
    assert len(frame) == 100 and rep.segments == 5
    assert len(opened) == 5 and len(set(opened)) == 5


def test_segment_swapped_for_a_symlink_after_listing_is_refused(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path / "store")
    p = st.write("gpu1", rows("gpu1", T0, 4))
    assert p is not None
    (seg,) = st.segments("gpu1")
    elsewhere = tmp_path / "elsewhere.arrow"
    os.rename(p, elsewhere)
    p.symlink_to(elsewhere)
    rep = ReadReport()
    assert st._open_checked(seg, rep) is None
    assert rep.refused["symlink"] == 1


def test_fifo_in_place_of_a_segment_is_refused_without_blocking(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    p = st.write("gpu1", rows("gpu1", T0, 4))
    assert p is not None
    fifo = p.parent / p.name.replace(".arrow", "0.arrow")
    os.mkfifo(fifo)
    frame, rep = st.read()
    assert rep.refused["not_regular"] == 1 and len(frame) == 8


def test_empty_and_truncated_small_segments_are_corrupt(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    a = st.write("gpu1", rows("gpu1", T0, 4))
    b = st.write("gpu1", rows("gpu1", T0 + 100, 4))
    c = st.write("gpu1", rows("gpu1", T0 + 200, 4))
    assert a is not None and b is not None and c is not None
    a.write_bytes(b"")
    data = b.read_bytes()
    b.write_bytes(data[:-10])  # the footer's tail gone
    frame, rep = st.read()
    assert rep.refused["corrupt"] == 2 and len(frame) == 8 and a.exists() and b.exists()


def _forge(st: SegmentStore, tmp_path: Path, table: Any, t0: float, t1: float) -> Path:
    import pyarrow.parquet as pq

    folder = tmp_path / "gpu1" / day_of(t0)
    folder.mkdir(parents=True, exist_ok=True)
    n = len(os.listdir(folder))
    p = folder / f"seg-{int(t0 * 1000)}-{int(t1 * 1000)}-forger-1-1-{n}.parquet"
    pq.write_table(table, p, use_dictionary=False)
    return p


def test_forgeries_the_fast_checks_must_not_miss(tmp_path: Path) -> None:
    import pyarrow as pa

    from hetslurm.metrics.samples import arrow_schema

    st = SegmentStore(tmp_path)
    st.write("gpu1", rows("gpu1", T0, 2))
    schema = arrow_schema()
    # Another node's samples, the node column written plain (no dictionary).
    _forge(st, tmp_path, pa.Table.from_pylist(rows("gpu2", T0, 2), schema=schema), T0, T0 + 1)
    # Mixed nodes.
    _forge(st, tmp_path, pa.Table.from_pylist(rows("gpu1", T0, 1) + rows("gpu2", T0, 1),
                                              schema=schema), T0, T0)
    # A null node.
    nulls = rows("gpu1", T0, 1)
    nulls[0]["node"] = None
    _forge(st, tmp_path, pa.Table.from_pylist(nulls, schema=schema), T0, T0)
    # Every time NaN (no range at all): refused, not a crash.
    nan = rows("gpu1", T0, 1)
    for r in nan:
        r["time"] = float("nan")
    _forge(st, tmp_path, pa.Table.from_pylist(nan, schema=schema), T0, T0)
    # An infinite time: refused, not a crash.
    inf = rows("gpu1", T0, 1)
    inf[0]["time"] = float("inf")
    _forge(st, tmp_path, pa.Table.from_pylist(inf, schema=schema), T0, T0)
    # A NaN beside in-range times, one time past the name's range.
    late = rows("gpu1", T0, 2)
    late[0]["time"] = float("nan")
    late[-1]["time"] = T0 + 50
    _forge(st, tmp_path, pa.Table.from_pylist(late, schema=schema), T0, T0 + 1)
    # A text column of another type (the dictionary read must not hide it).
    bad = pa.Table.from_pylist(rows("gpu1", T0, 1), schema=schema)
    bad = bad.set_column(bad.schema.get_field_index("status"), "status",
                         pa.array([1] * bad.num_rows, pa.int32()))
    _forge(st, tmp_path, bad, T0, T0)
    frame, rep = st.read()
    assert rep.refused["forged"] == 7 and len(frame) == 4
    frame, rep = st.read(T0, T0 + 10, columns=STALL)
    assert rep.refused["forged"] == 7 and len(frame) == 4


def test_nan_time_inside_a_segment_is_dropped_by_a_window(tmp_path: Path) -> None:
    import pyarrow as pa

    from hetslurm.metrics.samples import arrow_schema

    st = SegmentStore(tmp_path)
    rs = rows("gpu1", T0, 3)
    rs[0]["time"] = float("nan")
    _forge(st, tmp_path, pa.Table.from_pylist(rs, schema=arrow_schema()), T0, T0 + 2)
    frame, rep = st.read(T0, T0 + 10)
    assert not rep.partial and len(frame) == 5 and frame["time"].notna().all()


def test_a_read_plan_of_many_segments_is_read_in_order_once(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    for k in range(200):
        st.write("gpu1", rows("gpu1", T0 + 2 * k, 2, minors=1))
    seen: list[tuple[int, int]] = []
    frame, rep = st.read(progress=lambda d, t: seen.append((d, t)))
    assert len(frame) == 400 and rep.segments == 200
    assert seen[-1] == (200, 200) and [d for d, _ in seen] == list(range(1, 201))
    assert frame["time"].is_monotonic_increasing


def test_arrow_segments_checked_together_are_refused_as_one_by_one(tmp_path: Path) -> None:
    """A read takes the store's own Arrow segments the quick way (validated, then node and
    times checked on all at once); each forgery that way is refused with the reason and
    detail the one-segment check gives, and the honest segments around it are read."""
    import pyarrow as pa

    from hetslurm.metrics.store import _parse_ipc_quick

    st = SegmentStore(tmp_path)
    honest = [st.write("gpu1", rows("gpu1", T0 + 100 * k, 3)) for k in range(3)]
    assert all(p is not None and p.suffix == ".arrow" for p in honest)
    # Samples of gpu2 under gpu1; a name whose range the times leave; a null time.
    other = st.write("gpu2", rows("gpu2", T0 + 1000, 3))
    assert other is not None
    moved = tmp_path / "gpu1" / other.parent.name / other.name
    os.rename(other, moved)
    late = st.write("gpu1", rows("gpu1", T0 + 2000, 3))
    assert late is not None
    renamed = late.with_name(f"seg-{int(T0 * 1000)}-{int((T0 + 1) * 1000)}-x-1-1-ab.arrow")
    os.rename(late, renamed)
    forged = [moved, renamed]
    for p in forged:
        assert _parse_ipc_quick(p.read_bytes(), STALL) is not None  # the quick way
    expected = ReadReport()
    for seg in st.segments("gpu1"):
        if seg.path in forged:
            assert st._open_checked(seg, expected) is None
    frame, rep = st.read(columns=STALL)
    assert rep.refused == expected.refused and sorted(rep.problems) == sorted(
        expected.problems)
    assert rep.refused["forged"] == 2 and rep.segments == 3 and len(frame) == 3 * 3 * 2
    # A null time is not a forgery (a windowed read drops it): read, not refused.
    from hetslurm.metrics import store as store_mod
    from hetslurm.metrics.samples import arrow_schema

    with_null = rows("gpu1", T0 + 3000, 3)
    with_null[0]["time"] = None
    p = tmp_path / "gpu1" / day_of(T0) / st._name("seg", T0 + 3000, T0 + 3002, ".arrow")
    store_mod._write_atomic(pa.Table.from_pylist(with_null, schema=arrow_schema()), p)
    batch = pa.ipc.open_file(p).get_batch(0)
    assert batch.column("time").null_count == 1
    frame, rep = st.read(columns=STALL)
    assert rep.refused["forged"] == 2 and rep.segments == 4 and len(frame) == 3 * 3 * 2 + 6
