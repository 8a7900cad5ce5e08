"""The segment store: atomic immutable segments, refusal of unsafe or damaged ones,
compaction that loses nothing while readers read."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from hetslurm.metrics.samples import COLUMNS
from hetslurm.metrics.store import SegmentStore


def rows(node: str, t0: float, n: int, minors: int = 2) -> list[dict[str, Any]]:
    out = []
    for k in range(n):
        for m in range(minors):
            r = dict.fromkeys(COLUMNS)
            r.update(time=t0 + k, node=node, minor=130 + m, slurm_index=m, status="ok",
                     utilization_pct=float(10 * m), interval_s=1.0, attributed=True,
                     clock_jump=False, job_id=5 if m == 0 else None)
            out.append(r)
    return out


T0 = 1_796_000_000.0


def test_round_trip_and_time_range(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    st.write("gpu1", rows("gpu1", T0, 10))
    st.write("gpu2", rows("gpu2", T0 + 5, 10))
    frame, rep = st.read()
    assert len(frame) == 40 and rep.segments == 2 and not rep.partial
    frame, _ = st.read(since=T0 + 5, until=T0 + 10)
    assert len(frame) == 20 and frame["time"].between(T0 + 5, T0 + 9.5).all()
    assert frame["job_id"].dtype.name == "Int64"
    frame, _ = st.read(since=T0 + 1000, until=T0 + 2000)
    assert frame.empty


def test_writers_leave_no_partial_files_and_temp_files_are_ignored(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    p = st.write("gpu1", rows("gpu1", T0, 3))
    assert p is not None and not p.name.startswith(".")
    (p.parent / ".tmp-seg-in-progress.parquet").write_bytes(b"PAR1 half")
    frame, rep = st.read()
    assert len(frame) == 6 and not rep.partial
    assert st.write("gpu1", []) is None


def _table(path: Path) -> Any:
    """A segment file as an Arrow table, whichever format it is in."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".arrow":
        return pa.ipc.open_file(path).read_all()
    return pq.read_table(path)


def _files(folder: Path, kind: str = "") -> list[Path]:
    """The segment files under ``folder`` (of one kind: seg or cmp), any format."""
    return [p for p in folder.rglob(f"{kind}*") if p.is_file() and p.suffix in (
        ".arrow", ".parquet") and not p.name.startswith(".")]


def _good(st: SegmentStore) -> Path:
    p = st.write("gpu1", rows("gpu1", T0, 4))
    assert p is not None
    return p


def test_symlinked_segment_is_refused(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path / "store")
    good = _good(st)
    elsewhere = tmp_path / f"elsewhere{good.suffix}"
    elsewhere.write_bytes(good.read_bytes())
    link = good.with_name(f"{good.stem}-x{good.suffix}")
    link.symlink_to(elsewhere)
    frame, rep = st.read()
    assert rep.refused["symlink"] == 1 and rep.partial and len(frame) == 8


def test_segment_writable_by_others_is_refused(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    p = _good(st)
    os.chmod(p, 0o666)
    frame, rep = st.read()
    assert rep.refused["writable_by_others"] == 1 and frame.empty


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_segment_of_an_untrusted_owner_is_refused_unless_trusted(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    p = _good(st)
    os.chown(p, 4242, 4242)
    _, rep = st.read()
    assert rep.refused["untrusted_owner"] == 1
    frame, rep = SegmentStore(tmp_path, trusted_uids=[4242]).read()
    assert not rep.partial and len(frame) == 8


def test_truncated_and_corrupt_segments_are_refused_and_kept(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    a = _good(st)
    b = st.write("gpu1", rows("gpu1", T0 + 100, 4))
    assert b is not None
    data = a.read_bytes()
    a.write_bytes(data[: len(data) // 2])
    c = b.with_name(f"{b.stem}0{b.suffix}")
    c.write_bytes(b"not an Arrow file at all")
    d = b.with_name(f"{b.stem}1.parquet")
    d.write_bytes(b"not parquet at all")
    frame, rep = st.read()
    assert rep.refused["corrupt"] == 3 and len(frame) == 8
    assert a.exists() and c.exists() and d.exists()  # refused segments are never deleted


def test_forged_segments_are_refused(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    st = SegmentStore(tmp_path)
    # Samples of gpu2 written under gpu1's folder.
    p = st.write("gpu2", rows("gpu2", T0, 2))
    assert p is not None
    forged_dir = tmp_path / "gpu1" / p.parent.name
    forged_dir.mkdir(parents=True)
    os.rename(p, forged_dir / p.name)
    # Other columns.
    pq.write_table(pa.table({"time": [T0], "node": ["gpu1"]}),
                   forged_dir / f"seg-{int(T0 * 1000)}-{int(T0 * 1000)}-x-1-2-ab.parquet")
    # Times outside the range its name claims.
    q = st.write("gpu1", rows("gpu1", T0, 2))
    assert q is not None
    os.rename(q, q.parent / f"seg-1-2-{q.name.split('-', 3)[3]}")
    # A name that is not a segment's.
    (forged_dir / "evil.parquet").write_bytes(b"x")
    _, rep = st.read()
    assert rep.refused["forged"] == 3 and rep.refused["unknown_name"] == 1


def test_compaction_merges_and_loses_nothing(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    for k in range(6):
        st.write("gpu1", rows("gpu1", T0 + 10 * k, 10))
    before, _ = st.read()
    stats = st.compact(older_than_s=60, now=T0 + 1000)
    assert stats["merged"] == 6 and stats["written"] == 1 and not stats["refused"]
    after, rep = st.read()
    assert len(_files(tmp_path / "gpu1")) == 1
    cols = ["time", "minor", "utilization_pct"]
    assert after[cols].sort_values(cols).reset_index(drop=True).equals(
        before[cols].sort_values(cols).reset_index(drop=True))
    assert rep.duplicates_dropped == 0


def test_compaction_keeps_refused_segments(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    for k in range(3):
        st.write("gpu1", rows("gpu1", T0 + 10 * k, 5))
    bad = _files(tmp_path / "gpu1")[0]
    bad.write_bytes(b"garbage")
    stats = st.compact(older_than_s=60, now=T0 + 1000)
    assert stats["merged"] == 2 and stats["refused"] == 1 and bad.exists()


def test_readers_during_compaction_see_every_sample_once(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    for k in range(40):
        st.write("gpu1", rows("gpu1", T0 + 10 * k, 10))
    expected = 40 * 10 * 2
    counts: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            frame, _ = SegmentStore(tmp_path).read()
            counts.append(len(frame))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    SegmentStore(tmp_path).compact(older_than_s=60, now=T0 + 10_000)
    stop.set()
    for t in threads:
        t.join()
    assert counts and set(counts) == {expected}


def test_many_writers_never_collide(tmp_path: Path) -> None:
    def writer(i: int) -> None:
        st = SegmentStore(tmp_path)
        for _ in range(5):
            st.write("gpu1", rows("gpu1", T0, 1))  # same times on purpose

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_files(tmp_path / "gpu1", "seg-")) == 20


def test_prune_removes_old_days(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    st.write("gpu1", rows("gpu1", T0, 2))
    st.write("gpu1", rows("gpu1", T0 + 40 * 86400, 2))
    assert st.prune(retention_days=30, now=T0 + 41 * 86400) == 1
    frame, _ = st.read()
    assert len(frame) == 4


def test_node_names_cannot_escape_the_store(tmp_path: Path) -> None:
    from hetslurm.errors import MetricsError

    with pytest.raises(MetricsError):
        SegmentStore(tmp_path).write("../etc", rows("x", T0, 1))


def _write_old_segment(st: SegmentStore, node: str, t0: float, n: int,
                       suffix: str = ".parquet") -> Path:
    """A segment as a store written before the device-health columns existed: the same
    schema without them, through the store's own writer path (name, atomic rename)."""
    import pyarrow as pa

    from hetslurm.metrics import store as store_mod
    from hetslurm.metrics.samples import HEALTH_COLUMNS, arrow_schema

    old = pa.schema([f for f in arrow_schema() if f.name not in HEALTH_COLUMNS])
    table = pa.Table.from_pylist(
        [{k: v for k, v in r.items() if k not in HEALTH_COLUMNS} for r in rows(node, t0, n)],
        schema=old)
    folder = st.root / node / store_mod.day_of(t0)
    folder.mkdir(parents=True, exist_ok=True)
    for d in (st.root, st.root / node, folder):
        d.chmod(0o755)
    # Stores of that age wrote Parquet; the Arrow file of the same schema reads alike.
    target = folder / st._name("seg", t0, t0 + n - 1, suffix)
    store_mod._write_atomic(table, target)
    return target


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_segments_older_than_the_health_columns_read_with_them_null(tmp_path: Path,
                                                                   suffix: str) -> None:
    st = SegmentStore(tmp_path)
    _write_old_segment(st, "gpu1", T0, 3, suffix)
    new = rows("gpu1", T0 + 10, 2)
    new[0].update(throttle_reasons="hw_slowdown,sw_power_cap", ecc_uncorrectable=3, xid=79)
    new[1].update(throttle_reasons="", ecc_uncorrectable=0)
    st.write("gpu1", new)
    frame, rep = st.read()
    assert not rep.partial and rep.segments == 2 and len(frame) == 10
    frame = frame.sort_values(["time", "minor"]).reset_index(drop=True)
    old, fresh = frame.iloc[:6], frame.iloc[6:]
    assert old["throttle_reasons"].isna().all() and old["ecc_uncorrectable"].isna().all()
    assert old["xid"].isna().all()
    assert list(fresh["throttle_reasons"].iloc[:2]) == ["hw_slowdown,sw_power_cap", ""]
    assert frame["ecc_uncorrectable"].dtype.name == "Int64"
    assert list(fresh["ecc_uncorrectable"].iloc[:2]) == [3, 0]
    assert fresh["xid"].iloc[0] == 79 and fresh["xid"].isna().sum() == 3
    # Asking for the new columns only, of an old segment alone, reads them null too.
    only_old, rep = st.read(until=T0 + 5, columns=["xid", "throttle_reasons"])
    assert len(only_old) == 6 and only_old["xid"].isna().all() and not rep.partial


def test_old_and_new_segments_compact_into_the_current_schema(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    _write_old_segment(st, "gpu1", T0, 3)
    new = rows("gpu1", T0 + 10, 2)
    new[0]["xid"] = 48
    st.write("gpu1", new)
    assert st.compact(older_than_s=0, now=T0 + 100)["merged"] == 2
    (seg,) = st.segments("gpu1")
    assert _table(seg.path).schema.names == list(COLUMNS)
    frame, rep = st.read()
    assert len(frame) == 10 and not rep.partial and frame["xid"].dropna().tolist() == [48]


def test_a_segment_lacking_other_columns_is_still_forged(tmp_path: Path) -> None:
    import pyarrow as pa

    from hetslurm.metrics import store as store_mod
    from hetslurm.metrics.samples import arrow_schema

    st = SegmentStore(tmp_path)
    p = _good(st)
    drop = pa.schema([f for f in arrow_schema() if f.name != "power_w"])
    table = pa.Table.from_pylist([{k: v for k, v in r.items() if k != "power_w"}
                                  for r in rows("gpu1", T0, 4)], schema=drop)
    p.unlink()
    store_mod._write_atomic(table, p)
    _, rep = st.read()
    assert rep.refused["forged"] == 1


def test_health_values_out_of_range_are_forged(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path)
    bad = rows("gpu1", T0, 2)
    bad[1]["ecc_uncorrectable"] = -1
    st.write("gpu1", bad)
    _, rep = st.read()
    assert rep.refused["forged"] == 1


def test_threads_read_what_one_thread_reads_and_refuse_the_same(tmp_path: Path) -> None:
    """read() parses segments on threads and checks readings once over all of them: the
    frame and the refusals are those of a one-thread read, a segment with one bad reading
    among many good ones is refused alone, and a windowed read cuts the same samples."""
    st = SegmentStore(tmp_path)
    for n in ("g1", "g2", "g3"):
        for k in range(6):
            st.write(n, rows(n, T0 + 10 * k, 5))
    # One reading no collector writes (utilization 250 %) in one segment of g2.
    bad = rows("g2", T0 + 100, 3)
    bad[1]["utilization_pct"] = 250.0
    p = st.write("g2", bad)
    assert p is not None and _table(p).num_rows == 6
    one, rep1 = st.read(workers=1)
    many, rep4 = st.read(workers=4)
    assert one.equals(many) and len(one) == 3 * 6 * 5 * 2
    assert rep1.to_dict() == rep4.to_dict()
    assert rep4.refused["forged"] == 1 and rep4.segments == 18
    assert "utilization_pct" in rep4.problems[0]
    w1, _ = st.read(T0 + 12, T0 + 33, workers=1)
    w4, _ = st.read(T0 + 12, T0 + 33, workers=3)
    assert w1.equals(w4) and sorted(set(w4["time"])) == [T0 + k for k in range(12, 33)
                                                         if k % 10 < 5]


def test_the_reader_fallback_reads_what_arrows_reader_reads(tmp_path: Path,
                                                            monkeypatch: Any) -> None:
    """Where pyarrow lacks its low-level Parquet reader, pq.ParquetFile reads the same."""
    import hetslurm.metrics.store as store_mod

    st = SegmentStore(tmp_path)
    p = st.write("g1", rows("g1", T0, store_mod.SMALL_ROWS))  # big: Parquet
    assert p is not None and p.suffix == ".parquet"
    fast, _ = st.read(columns=["utilization_pct", "job_id"])
    monkeypatch.setattr(store_mod, "_ParquetReader", store_mod._FileReader)
    slow, rep = st.read(columns=["utilization_pct", "job_id"])
    assert slow.equals(fast) and rep.segments == 1 and len(fast) == 2 * store_mod.SMALL_ROWS
