"""The audit's fast paths against plain pandas references, on seeded random data.

The sacct reader (msgspec, records decoded one by one into typed structs) and the numpy
kernels behind per_job, idle_jobs and fragmentation replaced pandas group-bys that copied
the samples; each reference here is that pandas code, and the results must be identical
(``check_exact``), not merely close. Bad sacct input is covered too: a record of the wrong
shape is skipped and counted, a broken document is one clear error, never a crash.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_audit_tables import job, sacct_doc

from hetslurm.audit import tables as T
from hetslurm.audit.sacct import MAX_LISTED_PROBLEMS, parse_sacct_json
from hetslurm.errors import MetricsError
from hetslurm.policy import idle as idle_rule
from hetslurm.site.schema import Usage

T0 = 1_796_000_000


# ----------------------------------------------------------------- random samples
def random_samples(seed: int, n: int = 4000, *, negative_times: bool = False) -> Any:
    """Samples as the store gives them (categoricals, nullable ints, float32 metrics) with
    what makes the fast paths branch: repeated (node, time) pairs, missing models and
    nodes, unheld and unattributed samples, unknown statuses, and intervals that change
    inside a job's window."""
    rng = np.random.default_rng(seed)
    nodes = np.array([f"n{i}" for i in range(7)])
    base = -5000.0 if negative_times else float(T0)
    time = base + rng.integers(0, 400, n) * 15.0 + rng.choice([0.0, 0.25], n)
    job = rng.integers(1, 40, n).astype("float64")
    job[rng.random(n) < 0.2] = np.nan
    model = rng.choice(np.array(["h100", "a100", None], dtype=object), n, p=[0.5, 0.45, 0.05])
    node = rng.choice(nodes, n).astype(object)
    node[rng.random(n) < 0.02] = None
    util = rng.random(n).astype("float32") * 100
    util[rng.random(n) < 0.4] = 1.0  # many idle samples, so some windows are idle
    util[rng.random(n) < 0.05] = np.nan
    status = rng.choice(np.array(["ok", "mig", "lost", None], dtype=object), n,
                        p=[0.9, 0.04, 0.03, 0.03])
    frame = pd.DataFrame({
        "time": time, "node": pd.Categorical(node),
        "minor": pd.array(rng.integers(128, 136, n), dtype="Int64"),
        "slurm_index": pd.array(np.where(rng.random(n) < 0.03, np.nan,
                                         rng.integers(0, 8, n)), dtype="Int64"),
        "gpu_model": pd.Categorical(model),
        "job_id": pd.array(job, dtype="Int64"),
        "job_gpus": pd.Categorical(rng.choice(["0", "0-1", "2-3", "4-7"], n)),
        "utilization_pct": util,
        "memory_used_mib": np.where(rng.random(n) < 0.1, np.nan,
                                    rng.random(n) * 4000).astype("float32"),
        "status": pd.Categorical(status),
        "interval_s": rng.choice(np.array([15.0, 15.0, 15.0, 30.0], dtype="float32"), n),
        "attributed": pd.array(rng.random(n) < 0.95, dtype="boolean"),
        "clock_jump": pd.array(np.zeros(n, bool), dtype="boolean"),
    })
    return frame


def prepared(seed: int, **kw: Any) -> Any:
    s = random_samples(seed, **kw)
    return idle_rule.prepare_samples(s, Usage(), float(s["time"].min()), float(s["time"].max()) + 1)


def random_jobs(s: Any) -> Any:
    ids = sorted(int(x) for x in s["job_id"].dropna().unique())
    t_lo = float(s["time"].min())
    docs = [job(i, "n1", 1 + i % 3, int(t_lo) - 50 + 7 * i, int(t_lo) + 3000 + 11 * i)
            for i in ids]
    return parse_sacct_json(sacct_doc(*docs)).jobs


# ----------------------------------------------------------------- references
def ref_per_job(s: Any) -> Any:
    held = s[s["held"]]
    g = held.groupby("job_id", observed=True)
    out = pd.DataFrame({
        "used_gpu_hours": g["used_h"].sum(), "busy_gpu_hours": g["busy_h"].sum(),
        "idle_gpu_hours": g["idle_h"].sum(), "unknown_gpu_hours": g["unknown_h"].sum(),
        "sampled_gpu_hours": g["w_h"].sum(),
        "max_util_pct": held["utilization_pct"].where(held["known"]).groupby(
            held["job_id"], observed=True).max(),
        "max_memory_mib": g["memory_used_mib"].max(),
    })
    known_h = out["sampled_gpu_hours"] - out["unknown_gpu_hours"]
    out["mean_util_pct"] = (100.0 * out["used_gpu_hours"] / known_h).where(known_h > 0)
    out.index = out.index.astype("int64")
    return out


def ref_fragmentation(s: Any) -> Any:
    cols = ["gpu_model", "free_gpu_hours", "stranded_gpu_hours",
            "free_on_idle_nodes_gpu_hours", "stranded_share", "mean_stranded_gpus"]
    a = s[s["attributed"].fillna(False).astype(bool) & s["slurm_index"].notna()]
    if a.empty:
        return pd.DataFrame(columns=cols)
    g = a.groupby(["node", "time"], observed=True)
    snap = pd.DataFrame({"n": g.size(), "held": g["held"].sum(), "w": g["w_h"].first(),
                         "model": g["gpu_model"].first()}).reset_index()
    snap["free"] = snap["n"] - snap["held"]
    partly = (snap["held"] > 0) & (snap["free"] > 0)
    snap["free_h"] = snap["free"] * snap["w"]
    snap["stranded_h"] = snap["free_h"].where(partly, 0.0)
    snap["idle_node_h"] = snap["free_h"].where(snap["held"] == 0, 0.0)
    snap["stranded_n"] = snap["free"].where(partly, 0)
    gm = snap.groupby(snap["model"].astype(str))
    out = pd.DataFrame({"free_gpu_hours": gm["free_h"].sum(),
                        "stranded_gpu_hours": gm["stranded_h"].sum(),
                        "free_on_idle_nodes_gpu_hours": gm["idle_node_h"].sum()})
    out["stranded_share"] = (out["stranded_gpu_hours"] / out["free_gpu_hours"]).where(
        out["free_gpu_hours"] > 0)
    per_time = snap.groupby([snap["model"].astype(str), "time"])["stranded_n"].sum()
    out["mean_stranded_gpus"] = per_time.groupby(level=0).mean()
    return out.reset_index().rename(columns={"model": "gpu_model"})[cols]


def ref_windows(jid: Any, k: Any, cols: dict[str, Any]) -> tuple[Any, Any]:
    frame = pd.DataFrame({"job_id": jid, "k": k, **cols})
    g = frame.groupby(["job_id", "k"])
    return pd.DataFrame({
        "n_known": g["known"].sum(), "n": g.size(), "max_util": g["util"].max(),
        "max_mem": g["mem"].max(), "win": g["win"].first()}).reset_index(), \
        g.ngroup().to_numpy(dtype=np.int64)


def assert_windows_equal(got: tuple[Any, Any], want: tuple[Any, Any]) -> None:
    pd.testing.assert_frame_equal(got[0], want[0], check_exact=True)
    np.testing.assert_array_equal(got[1], want[1])  # each row's window


# ----------------------------------------------------------------- fast == reference
@pytest.mark.parametrize("seed", range(6))
def test_per_job_is_the_pandas_reference(seed: int) -> None:
    s = prepared(seed)
    pd.testing.assert_frame_equal(T.per_job(s), ref_per_job(s), check_exact=True)


@pytest.mark.parametrize("seed", range(6))
def test_fragmentation_is_the_pandas_reference(seed: int) -> None:
    s = prepared(seed)
    pd.testing.assert_frame_equal(T.fragmentation(s), ref_fragmentation(s), check_exact=True)


def test_fragmentation_without_the_integer_key_is_the_reference_too() -> None:
    # Negative times have no order-keeping bit pattern: the two-sort path runs.
    s = prepared(3, negative_times=True)
    assert T._pair_key(T._codes(s["node"]).astype(np.int64), s["time"].to_numpy()) is None
    pd.testing.assert_frame_equal(T.fragmentation(s), ref_fragmentation(s), check_exact=True)


def test_pair_key_orders_as_the_pairs() -> None:
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 50, 5000)
    time = T0 + rng.integers(0, 10**6, 5000) / 1000.0
    key = T._pair_key(codes, time)
    assert key is not None
    by_key = np.argsort(key, kind="stable")
    by_pair = np.lexsort((time, codes))
    assert (by_key == by_pair).all()


@pytest.mark.parametrize("seed", range(6))
def test_idle_windows_are_the_pandas_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 5000
    jid = rng.integers(1, 60, n).astype(np.int64)
    k = rng.integers(0, 9, n).astype("float64")
    cols = {"win": rng.choice([600.0, 3600.0], n),
            "known": rng.random(n) < 0.9,
            "util": np.where(rng.random(n) < 0.05, np.nan, rng.random(n) * 100),
            "mem": np.where(rng.random(n) < 0.05, np.nan, rng.random(n) * 1000)}
    assert_windows_equal(idle_rule._windows(jid, k, cols), ref_windows(jid, k, cols))
    # An infinite window index (a zero-length window) takes the grouped path.
    k[0] = math.inf
    assert_windows_equal(idle_rule._windows(jid, k, cols), ref_windows(jid, k, cols))


@pytest.mark.parametrize("seed", range(4))
def test_idle_jobs_match_the_windows_of_the_reference(seed: int) -> None:
    s = prepared(seed)
    jobs = random_jobs(s)
    j = idle_rule.prepare_jobs(jobs, float(s["time"].min()) - 100, float(s["time"].max()) + 100,
                       now=float(s["time"].max()) + 100)
    usage = Usage(idle_window_s=600, min_coverage=0.01, idle_threshold_pct=50.0)
    out = T.idle_jobs(j, s, T.per_job(s), usage)
    assert not out.empty  # the data is made so that some windows are idle
    # Each job found idle has a window whose known samples are all below the threshold.
    held = s[s["held"] & s["known"]]
    for _, row in out.iterrows():
        mine = held[(held["job_id"] == row["job_id"]) & (held["time"] >= row["idle_from"])
                    & (held["time"] < row["idle_from"] + row["idle_window_s"])]
        assert len(mine) and (mine["utilization_pct"] < 50.0).all()


# ----------------------------------------------------------------- sacct
def test_records_of_the_wrong_shape_are_skipped_and_counted() -> None:
    good = job(7, "gpu1", 2, T0, T0 + 60)
    bad: list[Any] = [
        1, "x", None, [], {"job_id": 1},                       # not a job / no time
        {"job_id": True, "time": {}},                            # a bool is not an id
        {"job_id": 2, "time": {"start": "soon"}},                # a time that is text
        {"job_id": 3, "time": {}, "tres": {"allocated": [{"type": "gres", "name": "gpu",
                                                           "count": "2"}]}},
        {"job_id": 99999999999999999999, "time": {}},            # past int64
        {"job_id": 4, "time": {}, "tres": {"allocated": [{"type": "gres", "name": "gpu",
                                                           "count": 1e300}]}},
        {"job_id": 5, "time": {}, "comment": "not an object"},
        {"job_id": 6, "time": {}, "nodes": "gpu[1-",            # not a hostlist
         "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]}},
    ]
    doc = json.dumps({"jobs": [good, *bad, good]})
    res = parse_sacct_json(doc)
    assert res.records == len(bad) + 2 and res.skipped == len(bad) and res.partial
    assert list(res.jobs["job_id"]) == [7, 7] and list(res.jobs["run"]) == [0, 1]
    assert all(p.startswith("sacct record ") for p in res.problems)
    assert "$.time.start" in res.problems[6]  # says where in the record


def test_many_bad_records_list_a_few_and_count_the_rest() -> None:
    doc = json.dumps({"jobs": [{"job_id": "x"}] * (MAX_LISTED_PROBLEMS + 5)})
    res = parse_sacct_json(doc)
    assert res.skipped == MAX_LISTED_PROBLEMS + 5 and res.jobs.empty
    assert len(res.problems) == MAX_LISTED_PROBLEMS + 1
    assert res.problems[-1] == "... and 5 more sacct records skipped"


def test_invalid_utf8_in_a_record_skips_that_record() -> None:
    good = json.dumps(job(1, "gpu1", 1, T0, T0 + 60)).encode()
    broken = good.replace(b'"j1"', b'"j\xff"').replace(b'"job_id": 1', b'"job_id": 2')
    res = parse_sacct_json(b'{"jobs": [' + good + b"," + broken + b"]}")
    assert res.skipped == 1 and "utf-8" in res.problems[0].lower()
    assert list(res.jobs["job_id"]) == [1]


REC_TRAIN = 'hetslurm:{"v":1,"outcome":"rewrite","class":"train","req":"gpus=4 class=train"}'


def test_bytes_and_text_give_the_same_jobs() -> None:
    doc = sacct_doc(job(1, "gpu1", 2, T0, T0 + 60), job(2, "gpu3", 4, T0, T0 + 90,
                                                         typed=None, comment=REC_TRAIN))
    a, b = parse_sacct_json(doc), parse_sacct_json(doc.encode())
    pd.testing.assert_frame_equal(a.jobs, b.jobs, check_exact=True)
    assert list(a.jobs["gpu_model"]) == ["h100", ""]  # no site: an untyped job's model is ""
    assert list(a.jobs["wclass"]) == ["", "train"]


def test_an_empty_jobs_array_gives_an_empty_frame_of_the_right_types() -> None:
    res = parse_sacct_json('{"meta": {}, "errors": [], "jobs": []}')
    assert res.records == 0 and not res.partial and res.jobs.empty
    assert res.jobs["start"].dtype == "float64" and res.jobs["job_id"].dtype == "int64"


def test_every_truncation_is_one_clear_error() -> None:
    doc = sacct_doc(job(1, "gpu1", 2, T0, T0 + 60), job(2, "gpu1", 1, T0, T0 + 60))
    for cut in range(len(doc.rstrip())):
        with pytest.raises(MetricsError, match=r"^sacct output"):
            parse_sacct_json(doc[:cut])


@pytest.mark.parametrize(("text", "why"), [
    ('{"jobs": 5}', "no 'jobs' array"),
    ('{"jobs": null}', "no 'jobs' array"),
    ('{"jobs": [1,, 2]}', "not valid JSON"),
    ('{"jobs": []} trailing', "not valid JSON"),
    ("\ufeff[]", "not a JSON object"),
])
def test_broken_documents_say_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(MetricsError, match=why):
        parse_sacct_json(text)


# ----------------------------------------------------------------- benchmark measure
def test_the_benchmark_measures_the_audit_not_the_process_that_spawned_it() -> None:
    import resource
    import subprocess

    from hetslurm.lab.child import python_module
    from hetslurm.lab.peakrss import CLI_ENTRY, parse_marker

    ballast = np.ones(300 * 2**20 // 8)  # 300 MiB touched here, in the parent
    res = subprocess.run(python_module("hetslurm.lab.peakrss", CLI_ENTRY, "--help"),
                         capture_output=True, text=True, timeout=120, check=True)
    own = parse_marker(res.stderr)
    assert own is not None and own < 200 * 1024, res.stderr
    # What the benchmark used to read: the child's rusage counts the parent's 300 MiB.
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss >= 300 * 1024
    del ballast


def test_peak_marker_parsing() -> None:
    from hetslurm.lab.peakrss import MARKER, parse_marker, peak_rss_kb

    assert parse_marker(f"partial result: x\n{MARKER} 1234\n") == 1234
    assert parse_marker("nothing here\n") is None
    assert parse_marker(f"{MARKER} x\n") is None
    kb = peak_rss_kb()
    assert kb is None or kb > 0


# ----------------------------------------------------------------- idle: per-device coverage
def coverage_samples(seed: int) -> tuple[Any, Any, dict[int, list[tuple[str, int]]]]:
    """Jobs of 1-4 GPUs on 1-2 nodes, each GPU sampled every 15 s with gaps (whole GPUs or
    nodes unreported, random drops), duplicated rows, stale rows on GPUs the job does not
    hold, intervals that lie (10^6, 0, negative, NaN), rows without a Slurm index; most
    jobs idle. Returns (prepared samples, prepared jobs, allocation by job id)."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    docs = []
    alloc: dict[int, list[tuple[str, int]]] = {}
    for jid in range(1, 31):
        nodes = [f"n{(jid + i) % 5}" for i in range(1 + int(rng.random() < 0.3))]
        per = int(rng.integers(1, 3))
        alloc[jid] = [(n, i) for n in nodes for i in range(per)]
        start = T0 + int(rng.integers(0, 600))
        dur = int(rng.choice([300, 1200, 2400]))
        docs.append(job(jid, ",".join(nodes), len(alloc[jid]), start, start + dur))
        idle = rng.random() < 0.7
        devices = list(alloc[jid])
        if rng.random() < 0.3:
            devices = devices[: max(0, len(devices) - 1)]  # one GPU unreported
        if rng.random() < 0.2:
            devices.append((nodes[0], 7))  # a GPU the job does not hold
        keep = rng.choice([1.0, 0.8, 0.4])
        for node, idx in devices:
            for t in range(start, start + dur, 15):
                if rng.random() > keep:
                    continue
                row = {"time": float(t), "node": node, "slurm_index": idx, "job_id": jid,
                       "utilization_pct": float(rng.random() * (3 if idle else 90)),
                       "memory_used_mib": 10.0, "status": "ok" if rng.random() > 0.002
                       else "lost",
                       "interval_s": float(rng.choice([15.0, 15.0, 15.0, 30.0, 1e6, 0.0,
                                                       -5.0, np.nan],
                                                      p=[0.6, 0.2, 0.1, 0.05, 0.01, 0.01,
                                                         0.01, 0.02]))}
                if rng.random() < 0.01:
                    row["slurm_index"] = None
                rows.append(row)
                if rng.random() < 0.05:
                    rows.append(dict(row))  # a duplicate
    frame = pd.DataFrame(rows)
    frame = frame.astype({"job_id": "Int64", "slurm_index": "Int64",
                          "utilization_pct": "float32", "memory_used_mib": "float32",
                          "interval_s": "float32"})
    frame["node"] = frame["node"].astype("category")
    frame["status"] = frame["status"].astype("category")
    since, until = float(frame["time"].min()), float(frame["time"].max()) + 1
    s = idle_rule.prepare_samples(frame, Usage(), since, until)
    j = idle_rule.prepare_jobs(parse_sacct_json(sacct_doc(*docs)).jobs, since, until, now=until)
    return s, j, alloc


def ref_idle_windows(j: Any, s: Any, usage: Usage, cap: float,
                     alloc: dict[int, list[tuple[str, int]]] | None) -> set[tuple[int, int]]:
    """The idle rule of docs/metrics-and-audit.md, one sample at a time in plain Python."""
    last = {r.job_id: r for r in j.sort_values("run").groupby("job_id").tail(1).itertuples()}
    windows: dict[tuple[int, int], list[Any]] = {}
    for r in s[s["held"]].itertuples():
        lj = last.get(int(r.job_id))
        if lj is None:
            continue
        w = 0.0 if math.isnan(r.interval_s) else min(max(float(r.interval_s), 0.0), cap)
        win = min(max(lj.run_end - lj.run_start, w), usage.idle_window_s)
        k = math.floor((r.time - lj.run_start) / win)
        if k >= 0:
            windows.setdefault((lj.job_id, k), []).append((r, win, w))
    out = set()
    for (jid, k), rs in windows.items():
        win = rs[0][1]
        if not all(r.known for r, _, _ in rs) or last[jid].gpus <= 0:
            continue
        if max(float(r.utilization_pct) for r, _, _ in rs) >= usage.idle_threshold_pct:
            continue
        seen: dict[tuple[str, int], dict[float, float]] = {}
        for r, _, w in rs:
            if r.node is None or pd.isna(r.slurm_index):
                continue
            dev = (str(r.node), int(r.slurm_index))
            if alloc is not None and dev not in alloc.get(jid, []):
                continue
            at = seen.setdefault(dev, {})
            at[r.time] = max(at.get(r.time, 0.0), w)
        covered = sum(1 for at in seen.values()
                      if sum(at.values()) >= usage.min_coverage * win)
        if covered >= last[jid].gpus:
            out.add((jid, k))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("by_allocation", [False, True])
def test_idle_coverage_is_the_plain_python_rule(seed: int, by_allocation: bool) -> None:
    s, j, alloc = coverage_samples(seed)
    usage = Usage(idle_window_s=600)
    _, w = idle_rule.judge_windows(j, s, usage, max_interval_s=30.0,
                           allocated=alloc if by_allocation else None)
    got = {(int(r.job_id), int(r.k)) for r in w[w["idle"].astype(bool)].itertuples()}
    want = ref_idle_windows(j, s, usage, 30.0, alloc if by_allocation else None)
    assert got == want
    assert want and len(want) < len(w)  # the data gives both verdicts
