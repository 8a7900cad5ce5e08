"""Every audit table, computed with pandas from jobs (sacct) and samples (the store).

Definitions (docs/metrics-and-audit.md, ``[usage]`` in the site file):

* a sample stands for ``interval_s`` seconds of one GPU; it is *known* when its status is
  ``ok`` and it has a utilization; anything else (missing, stale, MIG, not supported, lost)
  is *unknown*, and unknown is never idle;
* used GPU-hours = sum of utilization/100 x interval; busy GPU-hours = interval of samples
  at or above ``busy_threshold_pct``; idle GPU-hours = interval of known samples below
  ``idle_threshold_pct`` while a job held the GPU;
* a job is *idle* when, in some window of ``idle_window_s`` (its whole run when shorter),
  every sample of every GPU is known and below ``idle_threshold_pct`` (and below
  ``idle_memory_mib`` when set), and *every allocated GPU* (node, Slurm index) has samples
  for at least ``min_coverage`` of the window's wall time: each distinct instant of a
  device once, for its ``interval_s`` capped at ``[collector] interval_s``. A GPU with no
  rows (its node's collector down, a device unreported) is unknown (:func:`judge_windows`);
* wait = start - eligible, per run (``sacct --duplicates`` gives a requeued job a row per
  start).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from hetslurm.site.model import Site
from hetslurm.site.schema import Usage

#: Relative speeds used for right-size advice when the site's ``[usage] speed`` is empty
#: (dense FP16/BF16 tensor throughput, A100 = 1; a rough public ranking).
DEFAULT_SPEED = {"b200": 6.0, "h200": 3.2, "h100": 3.0, "gh200": 3.2, "l40s": 1.1,
                 "a100": 1.0, "l40": 0.6, "a40": 0.5, "a10": 0.4, "v100": 0.4, "l4": 0.4,
                 "t4": 0.2}
TABLES = ("by_gpu_model", "by_partition", "by_account", "by_user", "by_class", "idle_jobs",
          "wait", "fragmentation", "right_size", "placement", "hook_decisions")


@dataclass
class AuditResult:
    """Named tables and what they were computed from."""

    tables: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.meta.get("partial"))

    def document(self) -> dict[str, Any]:
        """One JSON-able object: ``meta`` and each table as a list of row objects."""
        out: dict[str, Any] = {"meta": self.meta}
        for name, frame in self.tables.items():
            out[name] = records(frame)
        return out


def records(frame: Any) -> list[dict[str, Any]]:
    import pandas as pd

    rows = []
    for rec in frame.to_dict("records"):
        clean: dict[str, Any] = {}
        for k, v in rec.items():
            if v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v)):
                clean[k] = None
            elif hasattr(v, "item"):
                clean[k] = v.item()
            else:
                clean[k] = v
        rows.append(clean)
    return rows


def _h(seconds: Any) -> Any:
    return seconds / 3600.0


def prepare_samples(samples: Any, usage: Usage, since: float, until: float) -> Any:
    """Samples in range with per-sample GPU-hours columns added."""
    inside = (samples["time"] >= since) & (samples["time"] < until)
    # The store already cut the range; copy only when something is cut here.
    s = samples if bool(inside.all()) else samples[inside].copy()
    # float64 arithmetic whatever the source stored (the store keeps float32), so files
    # and Prometheus give identical sums.
    util = s["utilization_pct"].astype("float64")
    # Compared as it is stored (categorical): no string made per sample; missing is not ok.
    known = (s["status"] == "ok").fillna(False).astype(bool) & util.notna()
    w = s["interval_s"].astype("float64").fillna(0.0) / 3600.0
    s["known"] = known
    s["w_h"] = w
    s["used_h"] = (util.fillna(0.0) / 100.0 * w).where(known, 0.0)
    s["busy_h"] = w.where(known & (util >= usage.busy_threshold_pct), 0.0)
    idle = known & (util < usage.idle_threshold_pct)
    if usage.idle_memory_mib is not None:
        idle &= s["memory_used_mib"].fillna(math.inf) < usage.idle_memory_mib
    s["idle_h"] = w.where(idle, 0.0)
    s["unknown_h"] = w.where(~known, 0.0)
    s["held"] = s["job_id"].notna()
    return s


def prepare_jobs(jobs: Any, since: float, until: float, now: float) -> Any:
    """GPU job runs overlapping the range, with clipped allocated GPU-hours."""
    j = jobs[(jobs["gpus"] > 0) & jobs["start"].notna()].copy()
    end = j["end"].fillna(min(now, until))
    lo = j["start"].clip(lower=since)
    hi = end.clip(upper=until)
    j["alloc_s"] = (hi - lo).clip(lower=0.0)
    j["run_start"] = lo
    j["run_end"] = hi
    # Filter last: assigning a Series to an empty frame would grow it back.
    j = j[(j["alloc_s"] > 0) | ((j["start"] < until) & (end > since))].copy()
    j["allocated_gpu_hours"] = j["alloc_s"] * j["gpus"] / 3600.0
    return j


def per_job(s: Any) -> Any:
    """Used/busy/idle/unknown GPU-hours and utilization per job id from samples."""
    import pandas as pd

    if not s["held"].any():
        return pd.DataFrame(columns=["used_gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                                     "unknown_gpu_hours", "sampled_gpu_hours",
                                     "mean_util_pct", "max_util_pct", "max_memory_mib"])
    # Held samples are those with a job id, and grouping by job id leaves out the others:
    # no copy of the held rows is needed. One grouping serves every column.
    cols = s[["job_id", "used_h", "busy_h", "idle_h", "unknown_h", "w_h",
              "memory_used_mib"]].assign(util_known=s["utilization_pct"].where(s["known"]))
    g = cols.groupby("job_id", observed=True)
    sums = g[["used_h", "busy_h", "idle_h", "unknown_h", "w_h"]].sum()
    out = pd.DataFrame({
        "used_gpu_hours": sums["used_h"], "busy_gpu_hours": sums["busy_h"],
        "idle_gpu_hours": sums["idle_h"], "unknown_gpu_hours": sums["unknown_h"],
        "sampled_gpu_hours": sums["w_h"], "max_util_pct": g["util_known"].max(),
        "max_memory_mib": g["memory_used_mib"].max(),
    })
    del cols, g, sums
    known_h = out["sampled_gpu_hours"] - out["unknown_gpu_hours"]
    out["mean_util_pct"] = (100.0 * out["used_gpu_hours"] / known_h).where(known_h > 0)
    out.index = out.index.astype("int64")
    return out


def _summary(j: Any, pj: Any, key: str) -> Any:
    import pandas as pd

    if j.empty:
        return pd.DataFrame(columns=[key, "jobs", "gpus", "allocated_gpu_hours",
                                     "used_gpu_hours", "busy_gpu_hours", "idle_gpu_hours",
                                     "unknown_gpu_hours", "unsampled_gpu_hours",
                                     "utilization_pct"])
    per = j.groupby("job_id", observed=True).agg(
        k=(key, "last"), gpus=("gpus", "max"), allocated=("allocated_gpu_hours", "sum"))
    per = per.join(pj, how="left")
    g = per.groupby("k", observed=True)
    out = pd.DataFrame({
        "jobs": g.size(), "gpus": g["gpus"].sum(), "allocated_gpu_hours": g["allocated"].sum(),
        "used_gpu_hours": g["used_gpu_hours"].sum(min_count=0),
        "busy_gpu_hours": g["busy_gpu_hours"].sum(min_count=0),
        "idle_gpu_hours": g["idle_gpu_hours"].sum(min_count=0),
        "unknown_gpu_hours": g["unknown_gpu_hours"].sum(min_count=0),
        "sampled": g["sampled_gpu_hours"].sum(min_count=0),
    })
    out["unsampled_gpu_hours"] = (out["allocated_gpu_hours"] - out["sampled"]).clip(lower=0)
    out["utilization_pct"] = (100 * out["used_gpu_hours"] / out["allocated_gpu_hours"]).where(
        out["allocated_gpu_hours"] > 0)
    out = out.drop(columns=["sampled"]).reset_index().rename(columns={"k": key})
    out[key] = out[key].astype(str)
    return out.sort_values("allocated_gpu_hours", ascending=False).reset_index(drop=True)


def by_gpu_model(j: Any, s: Any, pj: Any) -> Any:
    import pandas as pd

    out = _summary(j, pj, "gpu_model")
    # GPU-hours of samples no job held: capacity left free, by the model of the device.
    free = s[~s["held"] & s["attributed"].fillna(False).astype(bool)]
    free_h = (free.groupby(free["gpu_model"].astype(str), observed=True)["w_h"].sum()
              .rename("unallocated_gpu_hours").rename_axis("gpu_model").reset_index())
    out["gpu_model"] = out["gpu_model"].astype(str)
    out = out.merge(free_h, how="outer", on="gpu_model")
    out["unallocated_gpu_hours"] = out["unallocated_gpu_hours"].fillna(0.0)
    for c in ("jobs", "gpus"):
        out[c] = out[c].fillna(0).astype("int64")
    out["allocated_gpu_hours"] = out["allocated_gpu_hours"].fillna(0.0)
    out = out[out["gpu_model"].astype(str) != ""]
    return pd.DataFrame(out).sort_values("gpu_model").reset_index(drop=True)


def _windows(jid: Any, k: Any, cols: dict[str, Any]) -> tuple[Any, Any]:
    """Per (job_id, k) window of samples: known and all samples, highest utilization and
    memory, and the window's length (first); what ``frame.groupby(["job_id", "k"])``
    gives, with each row's window (its position in that frame; -1 for a NaN ``k``).
    Every one of these is exact whatever the order of the additions, so when the pair fits
    in one integer they come from numpy on that key, sorted, rather than from hashing ten
    million pairs with a float."""
    import numpy as np
    import pandas as pd

    key = None
    if len(jid) and np.isfinite(k).all():
        lo = int(jid.min())
        kbits = int(k.max()).bit_length()
        if (int(jid.max()) - lo).bit_length() + kbits <= 62:
            key = jid - lo
            key <<= kbits
            key |= k.astype(np.int64)
    if key is None:
        frame = pd.DataFrame({"job_id": jid, "k": k, **cols})
        g = frame.groupby(["job_id", "k"])
        out = pd.DataFrame({
            "n_known": g["known"].sum(), "n": g.size(), "max_util": g["util"].max(),
            "max_mem": g["mem"].max(), "win": g["win"].first()}).reset_index()
        return out, g.ngroup().fillna(-1).to_numpy(dtype=np.int64)
    order = np.argsort(key, kind="stable")
    key.sort(kind="stable")
    new = np.empty(len(key), dtype=bool)
    new[0] = True
    np.not_equal(key[1:], key[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    del new
    gk = key[starts]
    del key
    ends = np.append(starts[1:], len(order))
    group = np.empty(len(order), dtype=np.int64)
    group[order] = np.repeat(np.arange(len(starts), dtype=np.int64), ends - starts)
    known = np.cumsum(cols["known"][order], dtype=np.int64)
    n_known = known[ends - 1] - np.where(starts > 0, known[starts - 1], 0)
    del known
    w = pd.DataFrame({
        "job_id": (gk >> kbits) + lo, "k": (gk & ((1 << kbits) - 1)).astype("float64"),
        "n_known": n_known, "n": (ends - starts).astype(np.int64),
        "max_util": np.fmax.reduceat(cols["util"][order], starts),
        "max_mem": np.fmax.reduceat(cols["mem"][order], starts),
        "win": cols["win"][order[starts]],
    })
    return w, group


def _float64_at(col: Any, sel: Any) -> Any:
    """``col.to_numpy(dtype="float64", na_value=nan)[sel]``, converting only the rows
    selected when the column is a plain numpy float (as the store gives float32)."""
    import numpy as np

    if isinstance(col.dtype, np.dtype) and col.dtype.kind == "f":
        return col.to_numpy()[sel].astype(np.float64)
    return col.to_numpy(dtype="float64", na_value=np.nan)[sel]


def interval_cap(site: Site | None) -> float:
    """The most seconds one sample may stand for: the site's ``[collector] interval_s``
    (what the collectors are configured to take), the schema's default without a site."""
    from hetslurm.site.schema import Collector

    conf = site.sections.get("collector") if site is not None else None
    return float(getattr(conf, "interval_s", None) or Collector().interval_s)


def capped_interval(interval: Any, cap: float) -> Any:
    """Seconds each sample stands for, as float64: its own ``interval_s`` within
    ``[0, cap]`` (missing or NaN: 0). A sample states its own interval, and a forged or
    broken one (``interval_s = 1e6``) must not cover a window by itself."""
    import numpy as np

    out = np.array(interval, dtype=np.float64)
    np.nan_to_num(out, copy=False, nan=0.0, posinf=cap, neginf=0.0)
    np.clip(out, 0.0, cap, out=out)
    return out


def device_codes(node: Any, slurm_index: Any) -> tuple[Any, dict[str, int]]:
    """One integer per sample naming its device, ``(node code << 16) | Slurm GRES index``
    (-1 when the sample names no node or no index: it covers no device), and each node
    name's code. ``node`` is a label column, ``slurm_index`` a column or None."""
    import numpy as np

    codes, names = _str_codes(node)
    if slurm_index is None:
        return np.full(len(codes), -1, dtype=np.int64), {n: i for i, n in enumerate(names)}
    idx = slurm_index.to_numpy(dtype="float64", na_value=np.nan)
    ok = (codes >= 0) & np.isfinite(idx) & (idx >= 0) & (idx < 1 << 16)
    out = np.where(ok, (codes << 16) | np.where(ok, idx, 0).astype(np.int64), -1)
    return out, {n: i for i, n in enumerate(names)}


def device_coverage(group: Any, dev: Any, time: Any, weight: Any) -> Any:
    """Seconds of each (group, device) covered by its samples: every distinct sample
    instant of the device counted once (duplicated rows, as a compaction interrupted
    between its write and its clean-up leaves, do not count twice), for its capped
    interval (the largest, when copies differ). Rows with ``dev < 0`` cover nothing.

    Returns a Series indexed by ``(g, dev)``."""
    import pandas as pd

    frame = pd.DataFrame({"g": group, "dev": dev, "t": time, "w": weight})
    frame = frame[frame["dev"] >= 0]
    per_instant = frame.groupby(["g", "dev", "t"], sort=False)["w"].max()
    return per_instant.groupby(level=["g", "dev"]).sum()


def judge_windows(j: Any, s: Any, usage: Usage, *, max_interval_s: float,
                  allocated: Mapping[int, Collection[tuple[str, int]]] | None = None,
                  every_window: bool = False) -> tuple[Any, Any]:
    """The idle rule over every window of every job run in ``j`` with held samples in ``s``.

    Returns ``(last, w)``: the last run of each job (indexed by job id) and one row per
    (job_id, k) window with ``n_known``, ``n``, ``max_util``, ``max_mem``, ``win`` (its
    wall time), ``gpus`` (allocated), ``covered_gpus`` (allocated devices with samples for
    at least ``min_coverage`` of ``win``) and ``idle``. Coverage is judged per device
    (node, Slurm GRES index) against the window's wall time: a sample stands for its own
    ``interval_s`` capped at ``max_interval_s`` (:func:`capped_interval`), each instant of
    a device once (:func:`device_coverage`); a device with no rows covers nothing, so a
    job with an unreported node or GPU is never idle (unknown is never idle).

    ``allocated`` (job id -> its (node, index) pairs, as ``act`` reads them from Slurm)
    limits coverage to those devices; without it (sacct has no indices) the distinct
    devices the job's samples name count. ``covered_gpus`` is computed for the windows
    whose samples are all known and below the thresholds (the only ones it can decide),
    or for every window with ``every_window``.
    """
    import numpy as np
    import pandas as pd

    wcols = ["job_id", "k", "n_known", "n", "max_util", "max_mem", "win", "gpus",
             "covered_gpus", "idle"]
    empty = pd.DataFrame(columns=wcols)
    if j.empty or s.empty:
        return j.iloc[:0].set_index("job_id"), empty
    last = j.sort_values("run").groupby("job_id").tail(1).set_index("job_id")
    # The held samples of jobs in sacct, as arrays (no copy of the frame's other columns).
    sel = (s["held"] & s["job_id"].isin(last.index)).to_numpy(dtype=bool)
    if not sel.any():
        return last, empty
    jid = s["job_id"].to_numpy(dtype="int64", na_value=0)[sel]
    at = last.index.get_indexer(jid)
    start = last["run_start"].to_numpy()[at]
    dur = (last["run_end"] - last["run_start"]).to_numpy()[at]
    del at
    interval = capped_interval(s["interval_s"].to_numpy()[sel], max_interval_s)
    # In place where the arrays are ours: ten million rows a column, each fresh array is
    # 80 MB of new pages for the kernel to map and zero.
    win = np.maximum(dur, interval, out=dur)
    np.minimum(win, float(usage.idle_window_s), out=win)
    t = s["time"].to_numpy(dtype="float64")[sel]
    k = t - start
    k /= win
    np.floor(k, out=k)
    del start, dur
    keep = k >= 0
    arrays = {"win": win, "known": s["known"].to_numpy()[sel],
              "util": _float64_at(s["utilization_pct"], sel),
              "mem": _float64_at(s["memory_used_mib"], sel)}
    del win
    rows = np.flatnonzero(sel)
    del sel
    if not keep.all():
        jid, k, t, interval, rows = jid[keep], k[keep], t[keep], interval[keep], rows[keep]
        arrays = {c: v[keep] for c, v in arrays.items()}
    del keep
    w, group = _windows(jid, k, arrays)
    del k, arrays
    w["gpus"] = last["gpus"].reindex(w["job_id"].to_numpy()).to_numpy(dtype=np.int64)
    judged = ((w["n_known"] == w["n"]) & (w["max_util"] < usage.idle_threshold_pct)
              & (w["gpus"] > 0))
    if usage.idle_memory_mib is not None:
        judged &= w["max_mem"] < usage.idle_memory_mib
    want = np.ones(len(w), dtype=bool) if every_window else judged.to_numpy()
    pick = np.flatnonzero(want[group] if len(group) else np.zeros(0, dtype=bool))
    dev, node_code = device_codes(s["node"].iloc[rows[pick]],
                                  s["slurm_index"].iloc[rows[pick]]
                                  if "slurm_index" in s.columns else None)
    if allocated is not None and len(pick):
        allowed = [(jid_, (node_code[n] << 16) | i) for jid_, devs in allocated.items()
                   for n, i in devs if n in node_code and 0 <= i < 1 << 16]
        mine = pd.MultiIndex.from_arrays([jid[pick], dev]).isin(allowed)
        dev = np.where(mine, dev, -1)
    cov = device_coverage(group[pick], dev, t[pick], interval[pick])
    g_of = cov.index.get_level_values("g").to_numpy(dtype=np.int64)
    enough = cov.to_numpy() >= usage.min_coverage * w["win"].to_numpy()[g_of]
    w["covered_gpus"] = np.bincount(g_of[enough], minlength=len(w)).astype(np.int64)
    w["idle"] = judged & (w["covered_gpus"] >= w["gpus"])
    return last, w[wcols]


def idle_jobs(j: Any, s: Any, pj: Any, usage: Usage, *,
              max_interval_s: float | None = None) -> Any:
    """Jobs with an idle window (:func:`judge_windows`), the first such window each.

    ``max_interval_s``: the most one sample may stand for (default: the schema's
    ``[collector] interval_s``)."""
    import pandas as pd

    cols = ["job_id", "user", "account", "partition", "gpu_model", "gpus", "nodes",
            "idle_from", "idle_window_s", "max_util_pct", "allocated_gpu_hours",
            "used_gpu_hours"]
    cap = interval_cap(None) if max_interval_s is None else max_interval_s
    last, w = judge_windows(j, s, usage, max_interval_s=cap)
    hit = w[w["idle"].astype(bool)].sort_values(["job_id", "k"]).groupby("job_id").head(1)
    if hit.empty:
        return pd.DataFrame(columns=cols)
    out = last.loc[hit["job_id"].to_numpy()].reset_index()
    out["idle_from"] = (out["run_start"].to_numpy() + hit["k"].to_numpy() * hit["win"].to_numpy())
    out["idle_window_s"] = hit["win"].to_numpy()
    out["max_util_pct"] = hit["max_util"].to_numpy()
    alloc = j.groupby("job_id")["allocated_gpu_hours"].sum()
    out["allocated_gpu_hours"] = alloc.reindex(out["job_id"]).to_numpy()
    out["used_gpu_hours"] = pj["used_gpu_hours"].reindex(out["job_id"]).to_numpy()
    for c in ("user", "account", "partition", "gpu_model"):
        out[c] = out[c].astype(str)
    return out[cols].sort_values("allocated_gpu_hours", ascending=False).reset_index(drop=True)


def wait(jobs: Any, since: float, until: float) -> Any:
    import pandas as pd

    cols = ["wclass", "gpu_model", "jobs", "mean_wait_s", "median_wait_s", "p90_wait_s",
            "max_wait_s"]
    j = jobs[jobs["start"].notna() & jobs["eligible"].notna()
             & (jobs["start"] >= since) & (jobs["start"] < until)].copy()
    if j.empty:
        return pd.DataFrame(columns=cols)
    j["wait_s"] = (j["start"] - j["eligible"]).clip(lower=0)
    j["gpu_model"] = j["gpu_model"].astype(str).where(j["gpus"] > 0, "none")
    j["wclass"] = j["wclass"].astype(str)
    g = j.groupby(["wclass", "gpu_model"], observed=True)["wait_s"]
    out = pd.DataFrame({"jobs": g.size(), "mean_wait_s": g.mean(), "median_wait_s": g.median(),
                        "p90_wait_s": g.quantile(0.9), "max_wait_s": g.max()}).reset_index()
    return out[cols]


def _codes(col: Any) -> Any:
    """Integer codes of a column in its sort order (categories' order for a categorical,
    as groupby orders them), -1 for a missing value."""
    import numpy as np
    import pandas as pd

    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.cat.codes.to_numpy()  # int8 to int32: as small as the categories allow
    codes, _ = pd.factorize(col, sort=True)
    return np.asarray(codes, dtype=np.int64)


def _str_codes(col: Any) -> tuple[Any, list[str]]:
    """Codes of a label column into its distinct values as sorted strings (-1: missing):
    what grouping by ``col.astype(str)`` sees, without making a string per row."""
    import numpy as np
    import pandas as pd

    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.cat.codes.to_numpy().astype(np.int64)
        labels = [str(c) for c in col.cat.categories]
    else:
        codes, uniq = pd.factorize(col)
        codes = np.asarray(codes, dtype=np.int64)
        labels = [str(c) for c in uniq]
    names = sorted(set(labels))
    pos = {n: i for i, n in enumerate(names)}
    remap = np.array([pos[x] for x in labels] + [-1], dtype=np.int64)
    return remap[codes], names


def _pair_key(codes: Any, time: Any) -> Any:
    """One int64 per (code, time) ordered as the pairs are, or None when the values do not
    fit. A non-negative float's bits, read as an integer, order as the float does and
    differ exactly when it differs, so (bits - smallest) fits in few bits over an audit's
    range (2**43 for a month of epoch seconds)."""
    import numpy as np

    if not len(time):
        return None
    bits = time.view(np.int64)
    low = int(bits.min())
    if low < 0:  # a negative time (or -0.0): not in bit order
        return None
    shift = (int(bits.max()) - low).bit_length()
    if int(codes.max()).bit_length() + shift > 62:
        return None
    key = codes.astype(np.int64) << shift  # in place from here: one array of the size
    key += bits
    key -= low
    return key


def _snapshots(s: Any, mask: Any) -> dict[str, Any]:
    """One entry per (node, time) of the masked samples, in (node, time) order, as numpy
    arrays: ``time``, ``n`` samples, ``held`` of them held by a job, ``w`` (GPU-hours of
    the first sample) and ``model`` (row of the first sample with a model, else of the
    first); what ``groupby(["node", "time"])`` with size/sum/first gives, without copying
    the samples or hashing float pairs."""
    import numpy as np

    node = _codes(s["node"])
    time = s["time"].to_numpy(dtype="float64")
    mask = mask & (node >= 0) & ~np.isnan(time)
    rows = None if mask.all() else np.flatnonzero(mask)
    del mask
    t = time if rows is None else time[rows]
    if rows is not None:
        node = node[rows]
    # Sort by (node, time), stably, so each group keeps its rows in the frame's order.
    key = _pair_key(node, t)
    if key is not None:
        del node, t
        order = np.argsort(key, kind="stable")  # nearly sorted already: a node's rows
        key.sort(kind="stable")                  # come together, mostly in time order
        new = np.empty(len(key), dtype=bool)
        np.not_equal(key[1:], key[:-1], out=new[1:])
        del key
    else:
        order = np.argsort(t, kind="stable")
        order = order[np.argsort(node[order], kind="stable")]
        node, t = node[order], t[order]
        new = np.empty(len(order), dtype=bool)
        new[1:] = (node[1:] != node[:-1]) | (t[1:] != t[:-1])
        del node, t
    if len(new):
        new[0] = True
    rows = order if rows is None else rows[order]
    del order
    starts = np.flatnonzero(new)
    del new
    ends = np.append(starts[1:], len(rows))
    held = s["held"].to_numpy(dtype=bool)[rows]
    held_n = (np.add.reduceat(held, starts, dtype=np.int64) if len(starts)
              else np.zeros(0, dtype=np.int64))
    del held
    first = rows[starts]
    # groupby's first() skips missing values: the first row of the group with a model.
    has_model = s["gpu_model"].notna().to_numpy()
    model_rows = first
    if not has_model.all():
        known_pos = np.flatnonzero(has_model[rows])
        k = np.searchsorted(known_pos, starts)
        found = k < len(known_pos)
        found[found] = known_pos[k[found]] < ends[found]
        model_rows = first.copy()
        model_rows[found] = rows[known_pos[k[found]]]
        del known_pos, k, found
    n = ends - starts
    del has_model, ends, starts, rows
    return {"time": time[first], "n": n, "held": held_n,
            "w": s["w_h"].to_numpy(dtype="float64")[first], "model_rows": model_rows}


def fragmentation(s: Any) -> Any:
    """Free GPUs stranded on partly used nodes, from the samples' snapshots of each node."""
    import numpy as np
    import pandas as pd

    cols = ["gpu_model", "free_gpu_hours", "stranded_gpu_hours", "free_on_idle_nodes_gpu_hours",
            "stranded_share", "mean_stranded_gpus"]
    mask = (s["attributed"].fillna(False).astype(bool).to_numpy(dtype=bool)
            & s["slurm_index"].notna().to_numpy())
    if not mask.any():
        return pd.DataFrame(columns=cols)
    snap = _snapshots(s, mask)
    free = snap["n"] - snap["held"]
    partly = (snap["held"] > 0) & (free > 0)
    free_h = free * snap["w"]
    codes, names = _str_codes(pd.Series(s["gpu_model"].array.take(snap["model_rows"])))
    key = pd.Categorical.from_codes(codes, names)

    def by_model(values: Any) -> Any:
        return pd.Series(values).groupby(key, observed=True).sum()

    out = pd.DataFrame({"free_gpu_hours": by_model(free_h),
                        "stranded_gpu_hours": by_model(np.where(partly, free_h, 0.0)),
                        "free_on_idle_nodes_gpu_hours": by_model(
                            np.where(snap["held"] == 0, free_h, 0.0))})
    out.index = pd.Index(out.index.astype(str), name="model")
    out["stranded_share"] = (out["stranded_gpu_hours"] / out["free_gpu_hours"]).where(
        out["free_gpu_hours"] > 0)
    # Snapshots per model: average over distinct times of the total stranded GPUs then.
    # Counts are whole numbers, so the mean is their exact total over the distinct times.
    stranded = np.where(partly, free, 0)
    mean = {}
    for i, name in enumerate(names):
        sel = codes == i
        if sel.any():
            mean[name] = int(stranded[sel].sum()) / len(pd.unique(snap["time"][sel]))
    out["mean_stranded_gpus"] = pd.Series(mean, dtype="float64")
    return out.reset_index().rename(columns={"model": "gpu_model"})[cols]


def right_size(j: Any, pj: Any, site: Site | None, usage: Usage) -> Any:
    import numpy as np
    import pandas as pd

    cols = ["job_id", "user", "gpu_model", "gpus", "mean_util_pct", "max_memory_mib",
            "suggested_model", "speed_ratio", "expected_util_pct", "allocated_gpu_hours"]
    speed = dict(usage.speed) if usage.speed else dict(DEFAULT_SPEED)
    memory: dict[str, float] = {}
    if site is not None:
        for n in site.nodes:
            if n.gpus and n.gpus[0].memory_mib:
                memory[n.gpus[0].model] = float(n.gpus[0].memory_mib)
        models = set(site.gpu_models())
        speed = {m: v for m, v in speed.items() if m in models}
    if j.empty or pj.empty or len(speed) < 2:
        return pd.DataFrame(columns=cols)
    per = j.groupby("job_id").agg(user=("user", "last"), gpu_model=("gpu_model", "last"),
                                  gpus=("gpus", "max"),
                                  allocated_gpu_hours=("allocated_gpu_hours", "sum"))
    per = per.join(pj[["mean_util_pct", "max_memory_mib"]], how="inner")
    per["gpu_model"] = per["gpu_model"].astype(str)
    per = per[per["mean_util_pct"].notna() & per["gpu_model"].isin(list(speed))].copy()
    own = per["gpu_model"].map(speed).astype(float)
    per["suggested_model"] = None
    per["speed_ratio"] = np.nan
    per["expected_util_pct"] = np.nan
    # Slowest first: the cheapest model that still keeps the job under the target.
    for cand, sp in sorted(speed.items(), key=lambda kv: kv[1]):
        ratio = own / sp
        expected = per["mean_util_pct"] * ratio
        mem_ok = per["max_memory_mib"].isna() | (per["max_memory_mib"] <= memory.get(cand, np.inf))
        ok = (per["suggested_model"].isna() & (sp < own) & mem_ok
              & (expected <= usage.right_size_target_pct))
        per.loc[ok, "suggested_model"] = cand
        per.loc[ok, "speed_ratio"] = ratio[ok]
        per.loc[ok, "expected_util_pct"] = expected[ok]
    out = per[per["suggested_model"].notna()].reset_index()
    out["user"] = out["user"].astype(str)
    return out[cols].sort_values("allocated_gpu_hours", ascending=False).reset_index(drop=True)


_LOCALITY_RE = re.compile(r"locality=([A-Za-z0-9_-]+)")


def _island_stats(site: Site | None, node: str, idx_text: str,
                  specs: dict[str, Any] | None = None) -> tuple[int, int, str | None]:
    """(islands used, fewest islands that could hold them, leaf switch) of one node.

    ``specs``: the site's nodes by name, when the caller looks up many (else a scan)."""
    from hetslurm.slurm.units import parse_indices

    if site is None:
        return 0, 0, None
    try:
        spec = specs[node] if specs is not None else site.node(node)
    except KeyError:
        return 0, 0, None
    idx = parse_indices(idx_text)
    if not spec.gpus or not idx:
        return 0, 0, spec.leaf_switch
    sizes: dict[int, int] = {}
    for d in spec.gpus:
        sizes[d.island] = sizes.get(d.island, 0) + 1
    used = {spec.gpus[i].island for i in idx if i < len(spec.gpus)}
    return len(used), math.ceil(len(idx) / max(sizes.values())), spec.leaf_switch


def _per_distinct(col: Any, fn: Any) -> list[Any]:
    """``[fn(str(v)) for v in col]``, calling ``fn`` once per distinct value (a missing
    value reads ``"nan"``, as iterating the column and ``str()`` give)."""
    import numpy as np
    import pandas as pd

    codes, uniq = pd.factorize(col)
    vals = [fn(str(u)) for u in uniq]
    vals.append(fn(str(np.nan)))
    return [vals[c] for c in codes.tolist()]


def placement(j: Any, s: Any, site: Site | None) -> tuple[Any, Any]:
    """Multi-GPU jobs: NVLink islands and leaf switches used; and the hook's asks met?"""
    import numpy as np
    import pandas as pd

    from hetslurm.slurm.units import expand_hostlist

    pcols = ["job_id", "gpus", "nodes", "gpu_indices", "islands_used", "min_islands",
             "split_across_islands", "leaf_switches", "crosses_switches"]
    hcols = ["job_id", "asked_models", "got_model", "model_met", "asked_locality",
             "locality_met"]
    if j.empty:
        return pd.DataFrame(columns=pcols), pd.DataFrame(columns=hcols)
    last = j.sort_values("run").groupby("job_id").tail(1).set_index("job_id")
    specs: dict[str, Any] = {}
    for spec in site.nodes if site is not None else ():
        specs.setdefault(spec.name, spec)
    # Grouping by job id leaves out samples no job held (no copy of the held rows).
    # Groups unsorted, then sorted once: faster than groupby's own sort, and first() does
    # not depend on the order of the groups.
    pairs = (s[["job_id", "node", "job_gpus"]].groupby(["job_id", "node"], observed=True,
                                                       sort=False)["job_gpus"].first()
             .sort_index().astype(str).reset_index()) if bool(s["held"].any()) \
        else pd.DataFrame(columns=["job_id", "node", "job_gpus"])
    pairs["job_id"] = pairs["job_id"].astype("int64")
    pairs["node"] = pairs["node"].astype(str)
    pairs["text"] = pairs["node"] + ":" + pairs["job_gpus"]
    # Island statistics once per distinct (node, indices), not once per job.
    codes, _ = pd.factorize(pairs["text"], use_na_sentinel=False)
    _, first = np.unique(codes, return_index=True)
    stats = [_island_stats(site, n, i, specs) for n, i in
             zip(pairs["node"].to_numpy()[first], pairs["job_gpus"].to_numpy()[first],
                 strict=True)]
    pairs["islands_used"] = np.array([x[0] for x in stats], dtype=np.int64)[codes] \
        if stats else np.zeros(0, dtype=np.int64)
    pairs["min_islands"] = np.array([x[1] for x in stats], dtype=np.int64)[codes] \
        if stats else np.zeros(0, dtype=np.int64)
    g = pairs.groupby("job_id")
    text = g["text"].first()
    multi_node = pairs["job_id"].duplicated(keep=False)
    if multi_node.any():  # the Python join only for the few jobs on several nodes
        text.update(pairs[multi_node].groupby("job_id")["text"].agg(" ".join))
    per = pd.DataFrame({"islands_used": g["islands_used"].sum(),
                        "min_islands": g["min_islands"].sum(), "gpu_indices": text})
    multi = last[last["gpus"] > 1].join(per, how="left")
    leaf_cache: dict[str, int] = {}

    def leaves(nodes: str) -> int:
        if nodes not in leaf_cache:
            found = set()
            for n in expand_hostlist(nodes) if nodes else ():
                found.add(_island_stats(site, n, "", specs)[2])
            found.discard(None)
            leaf_cache[nodes] = len(found)
        return leaf_cache[nodes]

    out = pd.DataFrame({
        "job_id": multi.index.astype("int64"), "gpus": multi["gpus"].to_numpy(),
        "nodes": multi["nodes"].to_numpy(),
        "gpu_indices": multi["gpu_indices"].fillna("").to_numpy(),
        "islands_used": multi["islands_used"].fillna(0).astype("int64").to_numpy(),
        "min_islands": multi["min_islands"].fillna(0).astype("int64").to_numpy(),
    })
    out["split_across_islands"] = (out["gpu_indices"] != "") & (
        out["islands_used"] > out["min_islands"])
    out["leaf_switches"] = [leaves(n) for n in out["nodes"].tolist()]
    out["crosses_switches"] = out["leaf_switches"] > 1
    # The hook's decisions: models asked through an OR of features, locality through the
    # admin comment it writes; compared with what Slurm gave.
    models = set(site.gpu_models()) if site is not None else None

    def asked(c: str) -> str:
        return "|".join(m for m in re.split(r"[|&,]", c)
                        if m and (models is None or m in models))

    h = last[["constraints", "admin_comment", "comment", "gpu_model", "gpus"]].copy()
    h["asked_models"] = _per_distinct(h["constraints"], asked)
    h["asked_locality"] = (h["admin_comment"].astype(str) + " " + h["comment"].astype(str)
                           ).str.extract(_LOCALITY_RE.pattern, expand=False).fillna("")
    h = h[(h["asked_models"] != "") | (h["asked_locality"] != "")]
    got = h["gpu_model"].astype(str)
    h["got_model"] = got
    met_cache: dict[tuple[str, str], bool | None] = {}

    def model_met(g: str, a: str) -> bool | None:
        key = (g, a)
        if key not in met_cache:
            met_cache[key] = (g in a.split("|")) if a else None
        return met_cache[key]

    h["model_met"] = [model_met(g, a) for g, a in
                      zip(got.tolist(), h["asked_models"].tolist(), strict=True)]
    split = out.set_index("job_id")["split_across_islands"]
    met: list[bool | None] = [None] * len(h)
    # Only a job that asked for NVLink locality is judged (the others stay None).
    for pos in np.flatnonzero((h["asked_locality"] == "nvlink").to_numpy(dtype=bool)):
        jid = h.index[pos]
        nodes = last.at[jid, "nodes"]
        if h["gpus"].iat[pos] > 1 and jid in split.index and per["gpu_indices"].get(jid):
            met[pos] = bool(not split[jid] and len(expand_hostlist(nodes)) == 1)
    h["locality_met"] = met
    hook = h.reset_index()[hcols]
    return out[pcols], hook


def audit(jobs: Any, samples: Any, site: Site | None, *, since: float, until: float,
          now: float, usage: Usage | None = None) -> AuditResult:
    """Compute every table of :data:`TABLES` for ``[since, until)``."""
    usage = usage or (site.sections.get("usage") if site is not None else None) or Usage()
    s = prepare_samples(samples, usage, since, until)
    j = prepare_jobs(jobs, since, until, now)
    pj = per_job(s)
    tables: dict[str, Any] = {"by_gpu_model": by_gpu_model(j, s, pj)}
    for key, name in (("partition", "by_partition"), ("account", "by_account"),
                      ("user", "by_user"), ("wclass", "by_class")):
        tables[name] = _summary(j, pj, key)
    tables["by_class"] = tables["by_class"].rename(columns={"wclass": "class"})
    tables["idle_jobs"] = idle_jobs(j, s, pj, usage, max_interval_s=interval_cap(site))
    tables["wait"] = wait(jobs, since, until).rename(columns={"wclass": "class"})
    tables["fragmentation"] = fragmentation(s)
    tables["right_size"] = right_size(j, pj, site, usage)
    tables["placement"], tables["hook_decisions"] = placement(j, s, site)
    held_ids = set(s.loc[s["held"], "job_id"].astype("int64").unique()) if len(s) else set()
    meta: dict[str, Any] = {
        "since": since, "until": until, "jobs": len(j), "samples": len(s),
        "unknown_samples": int((~s["known"]).sum()) if len(s) else 0,
        "unattributed_samples": int((~s["attributed"].fillna(False).astype(bool)).sum())
        if len(s) else 0,
        "clock_jump_samples": int(s["clock_jump"].fillna(False).astype(bool).sum())
        if len(s) else 0,
        "samples_of_jobs_not_in_sacct": len(held_ids - set(j["job_id"].tolist())),
        "usage": usage.model_dump(),
        "partial": False, "problems": [],
    }
    if meta["clock_jump_samples"]:
        meta["problems"].append(f"{meta['clock_jump_samples']} samples were taken across a "
                                "clock jump; their times may be off")
    if j.empty and s.empty:
        meta["problems"].append("no jobs and no samples in the range")
    return AuditResult(tables, meta)
