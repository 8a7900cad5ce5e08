"""Hostile-input corpus for metric segments (issue 18): the files
:class:`hetslurm.metrics.store.SegmentStore` reads, and what the idle rule makes of what
it accepts.

Every class of case has an exact oracle: the segment is refused with a named reason
(``corrupt``, ``forged``) and a detail naming the column or the fault, the rest of the store
still read, nothing deleted; or it is accepted with exactly the samples written, and then
judged as the docs say (a future sample is outside every window that ends now; duplicated
rows and a forged ``interval_s`` cannot make a job idle). Hand-written classes first, then
a seeded generator of segments, each mutated by one class and checked against its oracle.
No exception other than the store's report (or a :class:`MetricsError` from a write) may
come out.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

import pytest

from hetslurm.errors import MetricsError
from hetslurm.metrics.samples import CATEGORICAL, COLUMNS, arrow_schema
from hetslurm.metrics.store import SegmentStore, day_of
from hetslurm.policy.stall import idle_evidence
from hetslurm.site.schema import Usage

T0 = 1_796_000_000.0
NODE = "gpu1"
#: The format :func:`forge` writes in: every case runs once per segment format the store
#: reads (a collector's small segments are Arrow IPC, compacted ones Parquet). "arrow" is
#: the store's own Arrow layout (text dictionary-encoded, one record batch), which the read
#: checks on all segments at once; "arrow-plain" plain text columns, read one by one.
_FORMAT = {"suffix": ".parquet", "layout": "parquet"}


@pytest.fixture(autouse=True, params=["parquet", "arrow", "arrow-plain"])
def segment_format(request: pytest.FixtureRequest) -> Any:
    _FORMAT.update(suffix=".parquet" if request.param == "parquet" else ".arrow",
                   layout=request.param)
    yield request.param
    _FORMAT.update(suffix=".parquet", layout="parquet")


def rows(n: int = 10, gpus: int = 2, *, t0: float = T0, step: float = 30.0,
         job: int | None = 7, util: float = 0.0) -> list[dict[str, Any]]:
    """``n`` ticks of ``gpus`` GPUs of NODE: what a collector writes."""
    out = []
    for k in range(n):
        for g in range(gpus):
            r = dict.fromkeys(COLUMNS)
            r.update(time=t0 + k * step, node=NODE, nvml_index=g, minor=135 - g, uuid=f"u{g}",
                     gpu_model="h100", slurm_index=g, job_id=job, job_gpus="0-1",
                     utilization_pct=util, memory_used_mib=100.0, memory_total_mib=81559.0,
                     power_w=70.0, energy_j=1e6, mig_mode=0, status="ok", interval_s=step,
                     attributed=True, clock_jump=False)
            out.append(r)
    return out


def forge(root: Path, table: Any, name_t0: float | None = None,
          name_t1: float | None = None, tag: str = "x") -> Path:
    """Write ``table`` as a segment of NODE the way a hostile user with write access to the
    folder would (no store code), named for its time range unless told otherwise."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if name_t0 is None or name_t1 is None:
        mm = pc.min_max(table.column("time"))
        name_t0, name_t1 = mm["min"].as_py(), mm["max"].as_py()
    folder = root / NODE / day_of(name_t0)
    folder.mkdir(parents=True, exist_ok=True)
    suffix = _FORMAT["suffix"]
    p = folder / f"seg-{round(name_t0 * 1000)}-{round(name_t1 * 1000)}-forger-1-1-{tag}{suffix}"
    if suffix == ".arrow":
        if _FORMAT["layout"] == "arrow":
            # As the store writes it: text columns dictionary-encoded, one record batch.
            table = table.combine_chunks()
            for i, f in enumerate(table.schema):
                if f.name in CATEGORICAL and pa.types.is_string(f.type):
                    table = table.set_column(i, pa.field(f.name, pa.dictionary(
                        pa.int32(), pa.string())), table.column(i).dictionary_encode())
        with pa.ipc.new_file(p, table.schema) as w:
            w.write_table(table)
    else:
        pq.write_table(table, p)
    return p


def table_of(rs: list[dict[str, Any]], schema: Any = None) -> Any:
    import pyarrow as pa

    return pa.Table.from_pylist(rs, schema=schema or arrow_schema())


def read_all(root: Path) -> tuple[Any, Any]:
    return SegmentStore(root).read()


def good_neighbour(root: Path) -> int:
    """An honest segment beside every hostile one: it must always still be read."""
    rs = rows(3, t0=T0 + 10_000)
    SegmentStore(root).write(NODE, rs)
    return len(rs)


def assert_refused(root: Path, reason: str, detail: str) -> None:
    ok = good_neighbour(root)
    frame, rep = read_all(root)
    assert rep.refused[reason] == 1 and sum(rep.refused.values()) == 1, rep.problems
    assert detail in rep.problems[0], rep.problems
    assert len(frame) == ok and rep.partial


# ------------------------------------------------------------------ unreadable files
def test_every_truncation_of_a_segment_is_corrupt_and_kept(tmp_path: Path) -> None:
    data = forge(tmp_path / "src", table_of(rows())).read_bytes()
    for cut in [0, 1, 4, len(data) // 3, len(data) // 2, len(data) - 8, len(data) - 1]:
        root = tmp_path / f"c{cut}"
        p = forge(root, table_of(rows()))
        p.write_bytes(data[:cut])
        assert_refused(root, "corrupt", "")
        assert p.exists()


@pytest.mark.parametrize("payload", [b"", b"PAR1", b"PAR1" + b"\x00" * 64 + b"PAR1",
                                     b"ARROW1", b"ARROW1\x00\x00" + b"\xff" * 64 + b"ARROW1",
                                     os.urandom(4096), b"\xff" * 100])
def test_garbage_bytes_are_corrupt(tmp_path: Path, payload: bytes) -> None:
    p = forge(tmp_path, table_of(rows()))
    p.write_bytes(payload)
    assert_refused(tmp_path, "corrupt", "")


# ------------------------------------------------------------------ wrong schema / dtypes
@pytest.mark.parametrize(("change", "detail"), [
    ("drop:utilization_pct", "are not the store's"),
    ("drop:node", "column"),
    ("extra:evil", "are not the store's"),
    ("rename:interval_s", "are not the store's"),
    ("reorder", "are not the store's"),
])
def test_a_wrong_schema_is_forged(tmp_path: Path, change: str, detail: str) -> None:
    t = table_of(rows())
    kind, _, col = change.partition(":")
    if kind == "drop":
        t = t.drop_columns([col])
    elif kind == "extra":
        t = t.append_column(col, t.column("time"))
    elif kind == "rename":
        t = t.rename_columns([c if c != col else "interval" for c in t.column_names])
    else:
        t = t.select(list(reversed(t.column_names)))
    forge(tmp_path, t)
    assert_refused(tmp_path, "forged", detail)


@pytest.mark.parametrize(("column", "arrow_type"), [
    ("utilization_pct", "int64"), ("utilization_pct", "string"), ("interval_s", "float64"),
    ("job_id", "float64"), ("time", "int64"), ("slurm_index", "int64"), ("status", "binary"),
    ("attributed", "int8"),
])
def test_a_wrong_dtype_is_forged_naming_the_column(tmp_path: Path, column: str,
                                                    arrow_type: str) -> None:
    import pyarrow as pa

    schema = arrow_schema()
    i = schema.get_field_index(column)
    t = table_of(rows())
    t = t.set_column(i, pa.field(column, arrow_type), t.column(column).cast(arrow_type))
    forge(tmp_path, t)
    assert_refused(tmp_path, "forged", f"column {column} is")


# ------------------------------------------------------------------ impossible readings
BAD_VALUES = {
    "utilization_pct": [math.nan, math.inf, -math.inf, -1.0, 100.5, 1e9],
    "memory_used_mib": [math.nan, math.inf, -1.0],
    "memory_total_mib": [math.nan, -0.5],
    "power_w": [math.nan, math.inf, -70.0],
    "energy_j": [math.nan, -1.0, math.inf],
    "interval_s": [0.0, -30.0, math.nan, math.inf, 1e6, 3600.5],
}


@pytest.mark.parametrize(("column", "value"), [
    (c, v) for c, vs in BAD_VALUES.items() for v in vs])
def test_a_reading_no_collector_writes_is_forged_naming_the_column(
        tmp_path: Path, column: str, value: float) -> None:
    rs = rows()
    rs[len(rs) // 2][column] = value
    forge(tmp_path, table_of(rs))
    assert_refused(tmp_path, "forged", f"column {column} holds")


@pytest.mark.parametrize("column", sorted(BAD_VALUES))
def test_nulls_and_the_edges_of_each_range_are_accepted(tmp_path: Path, column: str) -> None:
    rs = rows()
    rs[0][column] = None  # NVML gave no value: allowed, the sample is unknown or empty
    rs[1][column] = {"utilization_pct": 100.0, "interval_s": 3600.0}.get(column, 0.0)
    if column == "interval_s":
        rs[2][column] = 0.05  # a collector may run faster than the schema's minimum
    forge(tmp_path, table_of(rs))
    frame, rep = read_all(tmp_path)
    assert not rep.partial and len(frame) == len(rs)


# ------------------------------------------------------------------ times
def test_times_outside_the_name_or_not_finite_are_forged(tmp_path: Path) -> None:
    for i, (t, t0, t1) in enumerate([(T0 + 5000, T0, T0 + 270),  # past the name's end
                                     (T0 - 1, T0, T0 + 270),  # before its start
                                     (math.inf, T0, T0 + 270)]):
        root = tmp_path / str(i)
        rs = rows()
        rs[3]["time"] = t
        forge(root, table_of(rs), t0, t1)
        assert_refused(root, "forged", "outside the name's range")


def test_an_all_nan_time_segment_is_forged(tmp_path: Path) -> None:
    rs = rows(1, 1)
    rs[0]["time"] = math.nan
    forge(tmp_path, table_of(rs), T0, T0)
    assert_refused(tmp_path, "forged", "outside the name's range")


def test_future_samples_are_read_but_outside_every_window_ending_now(tmp_path: Path) -> None:
    # A clock a day ahead: the samples are stored and read back as written, but a window
    # that ends now never holds them, so a job with only those is unknown (never idle).
    future = T0 + 86_400
    forge(tmp_path, table_of(rows(120, t0=future)))
    frame, rep = read_all(tmp_path)
    assert not rep.partial and len(frame) == 240
    windowed, _ = SegmentStore(tmp_path).read(T0 - 3600, T0)
    assert windowed.empty
    ev = judge(frame, now=T0)
    assert not ev.idle and ev.samples == 0


# ------------------------------------------------------------------ duplicates and intervals
def judge(frame: Any, now: float, gpus: int = 2) -> Any:
    from datetime import UTC, datetime

    from hetslurm.slurm.backend import JobInfo
    from hetslurm.slurm.units import GresItem

    job = JobInfo(7, state="RUNNING", nodes=(NODE,),
                  allocated_gres={NODE: (GresItem("gpu", "h100", gpus, tuple(range(gpus))),)},
                  start_time=datetime.fromtimestamp(now - 7200, tz=UTC))
    return idle_evidence([job], frame, Usage(), window_s=3600, now=now, max_interval_s=30.0)[7]


def test_duplicated_rows_are_read_as_written_and_count_once(tmp_path: Path) -> None:
    # 40 of the hour's 120 ticks, every row written three times: a third of the window.
    rs = rows(40, t0=T0 - 1200)
    forge(tmp_path, table_of(rs * 3))
    frame, rep = read_all(tmp_path)
    assert not rep.partial and len(frame) == 3 * len(rs)
    ev = judge(frame, now=T0)
    assert not ev.idle and ev.covered_gpus == 0
    honest = rows(120, t0=T0 - 3600)
    forge(tmp_path, table_of(honest), tag="y")
    frame, _ = read_all(tmp_path)
    assert judge(frame, now=T0).idle  # the full hour: idle, duplicates or not


def test_a_collector_interval_cannot_be_forged_into_coverage(tmp_path: Path) -> None:
    # The largest interval the store accepts (3600 s) on one sample per GPU: capped at the
    # collector's 30 s, it covers a 120th of the window.
    rs = rows(1, t0=T0 - 60, step=3600.0)
    forge(tmp_path, table_of(rs))
    frame, rep = read_all(tmp_path)
    assert not rep.partial and len(frame) == 2
    ev = judge(frame, now=T0)
    assert not ev.idle and ev.covered_gpus == 0


def test_a_gpu_missing_from_the_segments_keeps_the_job_unknown(tmp_path: Path) -> None:
    forge(tmp_path, table_of(rows(120, 2, t0=T0 - 3600)))
    frame, _ = read_all(tmp_path)
    ev = judge(frame, now=T0, gpus=4)  # the job holds 4 GPUs, 2 are reported
    assert not ev.idle and (ev.gpus, ev.covered_gpus) == (4, 2)


def test_writing_a_forbidden_node_name_is_a_metrics_error(tmp_path: Path) -> None:
    for bad in ("../etc", ".", "a/b", "", "x" * 300, "n\x00"):
        with pytest.raises(MetricsError, match="not a node name"):
            SegmentStore(tmp_path).write(bad, rows(1, 1))


# ------------------------------------------------------------------ seeded generator
CLASSES = ("honest", "truncate", "garbage", "drop_column", "dtype", "bad_value", "null_value",
           "time_outside", "duplicate", "future", "huge_interval_capped")


def make_case(rng: random.Random, root: Path, i: int) -> tuple[str, str, int]:
    """Write one segment of a random class; returns (class, reason or "", rows expected)."""
    import pyarrow as pa

    n = rng.randint(1, 30)
    gpus = rng.randint(1, 8)
    t0 = T0 + i * 10_000 + rng.random() * 100
    rs = rows(n, gpus, t0=round(t0, 3), step=rng.choice([1.0, 15.0, 30.0]),
              util=rng.choice([0.0, 3.0, 55.5, 100.0]),
              job=rng.choice([None, 7, 2**40]))
    cls = rng.choice(CLASSES)
    tag = f"g{i}"
    if cls == "bad_value":
        col = rng.choice(sorted(BAD_VALUES))
        rng.choice(rs)[col] = rng.choice(BAD_VALUES[col])
    elif cls == "null_value":
        rng.choice(rs)[rng.choice(sorted(BAD_VALUES))] = None
    elif cls == "time_outside":
        rng.choice(rs)["time"] = t0 + 5000
    elif cls == "duplicate":
        rs = rs + [dict(r) for r in rng.sample(rs, rng.randint(1, len(rs)))]
    elif cls == "future":
        for r in rs:
            r["time"] += 10 * 86_400
    elif cls == "huge_interval_capped":
        for r in rs:
            r["interval_s"] = 3600.0
    table = table_of(rs)
    if cls == "drop_column":
        table = table.drop_columns([rng.choice(list(COLUMNS)[1:])])
    elif cls == "dtype":
        col = rng.choice(["utilization_pct", "interval_s", "time", "minor"])
        to = {"utilization_pct": "float64", "interval_s": "int32", "time": "float32",
              "minor": "int64"}[col]
        table = table.set_column(table.schema.get_field_index(col), pa.field(col, to),
                                 table.column(col).cast(to))
    if cls == "time_outside":
        p = forge(root, table, t0, t0 + 30 * 31, tag=tag)
    else:
        p = forge(root, table, tag=tag)
    if cls == "truncate":
        data = p.read_bytes()
        p.write_bytes(data[: rng.randrange(len(data))])
    elif cls == "garbage":
        data = bytearray(p.read_bytes())
        for _ in range(rng.randint(1, 20)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        p.write_bytes(bytes(data))
        return cls, "maybe", len(rs)
    reason = {"truncate": "corrupt", "drop_column": "forged", "dtype": "forged",
              "bad_value": "forged", "time_outside": "forged"}.get(cls, "")
    return cls, reason, len(rs)


@pytest.mark.parametrize("seed", range(3))
def test_seeded_segments_meet_their_oracle(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(40):
        root = tmp_path / f"s{i}"
        cls, reason, n = make_case(rng, root, i)
        frame, rep = read_all(root)
        refused = sum(rep.refused.values())
        if reason == "maybe":
            # Random byte flips: refused as corrupt or forged, or (a flip in padding or a
            # value still in range) read whole; never half a segment, never a traceback.
            assert (refused == 1 and len(frame) == 0
                    and set(rep.refused) <= {"corrupt", "forged"}) or \
                (refused == 0 and len(frame) == n), (cls, rep.problems)
        elif reason:
            assert rep.refused[reason] == 1 and refused == 1 and len(frame) == 0, (
                cls, rep.problems)
        else:
            assert refused == 0 and len(frame) == n, (cls, rep.problems)
            assert rep.duplicates_dropped == 0
        assert any((root / NODE).rglob(f"*{_FORMAT['suffix']}"))  # a refusal deletes nothing
