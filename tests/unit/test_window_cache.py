"""The read cache of a recurring windowed read (hetslurm/metrics/window_cache.py): a read
with it gives the frame a read without it gives, takes unchanged segments from it, reads
new ones, never caches a refused segment, and treats any doubtful cache file as a miss."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hetslurm.metrics.samples import COLUMNS
from hetslurm.metrics.store import SegmentStore
from hetslurm.metrics.window_cache import WindowCache

T0 = 1_796_000_000.0
COLS = ["time", "node", "minor", "slurm_index", "job_id", "utilization_pct", "status"]


def rows(node: str, t0: float, n: int, minors: int = 2, util: float = 10.0
         ) -> list[dict[str, Any]]:
    out = []
    for k in range(n):
        for m in range(minors):
            r = dict.fromkeys(COLUMNS)
            r.update(time=t0 + k, node=node, minor=130 + m, slurm_index=m, status="ok",
                     utilization_pct=util + m, interval_s=1.0, attributed=True,
                     clock_jump=False, job_id=5 if m == 0 else None)
            out.append(r)
    return out


def fill(st: SegmentStore, t0: float, segs: int) -> None:
    for n in ("g1", "g2"):
        for k in range(segs):
            st.write(n, rows(n, t0 + 10 * k, 5))


def test_a_cached_read_is_the_cold_read_and_opens_only_new_segments(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path / "store")
    fill(st, T0, 4)
    wc = WindowCache(tmp_path / "run" / "cache.arrow", st.root, COLS)
    cold, rep0 = st.read(T0 + 3, T0 + 40, columns=COLS[2:], cache=wc)
    assert rep0.cached == 0 and rep0.segments == 8
    assert oct((tmp_path / "run" / "cache.arrow").stat().st_mode & 0o777) == "0o600"
    again, rep1 = st.read(T0 + 3, T0 + 40, columns=COLS[2:], cache=wc)
    assert rep1.cached == 8 and again.equals(cold)
    # Five minutes later: one new segment per node, the window moved.
    for n in ("g1", "g2"):
        st.write(n, rows(n, T0 + 40, 5, util=50.0))
    warm, rep2 = st.read(T0 + 12, T0 + 50, columns=COLS[2:], cache=wc)
    plain, rep3 = st.read(T0 + 12, T0 + 50, columns=COLS[2:])
    assert warm.equals(plain) and len(plain) == 2 * 2 * (3 + 5 + 5 + 5)
    assert rep2.cached == 6 and rep2.segments == rep3.segments == 8
    # Segments that left the window left the cache too.
    _, rep4 = st.read(T0 + 12, T0 + 50, columns=COLS[2:], cache=wc)
    assert rep4.cached == 8


def test_a_refused_segment_is_never_cached(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path / "store")
    fill(st, T0, 2)
    bad = rows("g1", T0 + 20, 3)
    bad[0]["utilization_pct"] = 250.0
    st.write("g1", bad)
    wc = WindowCache(tmp_path / "cache.arrow", st.root, COLS)
    for _ in range(2):
        frame, rep = st.read(columns=COLS[2:], cache=wc)
        assert rep.refused["forged"] == 1 and rep.segments == 4 and len(frame) == 40
    assert rep.cached == 4


def test_a_doubtful_cache_is_a_miss(tmp_path: Path) -> None:
    st = SegmentStore(tmp_path / "store")
    fill(st, T0, 2)
    path = tmp_path / "cache.arrow"
    cold, _ = st.read(columns=COLS[2:], cache=WindowCache(path, st.root, COLS))
    # Other columns asked: a miss, the cold frame.
    other = WindowCache(path, st.root, [*COLS, "power_w"])
    assert other.load() == {} and other.miss is not None
    # Writable by others: refused, said, and the read is the cold one.
    os.chmod(path, 0o666)
    wc = WindowCache(path, st.root, COLS)
    frame, rep = st.read(columns=COLS[2:], cache=wc)
    assert frame.equals(cold) and rep.cached == 0
    assert any("read cache not used" in p and "writable" in p for p in rep.problems)
    # Rewritten by that read with mode 0600; a damaged file is a miss too.
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_bytes(b"not arrow")
    frame, rep = st.read(columns=COLS[2:], cache=WindowCache(path, st.root, COLS))
    assert frame.equals(cold) and rep.cached == 0
    assert any("unreadable" in p for p in rep.problems)
    # A symlink in its place is refused, not followed.
    path.unlink()
    os.symlink(tmp_path / "elsewhere", path)
    frame, rep = st.read(columns=COLS[2:], cache=WindowCache(path, st.root, COLS))
    assert frame.equals(cold) and any("symlink" in p for p in rep.problems)
