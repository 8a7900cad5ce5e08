"""The idle rule: when a GPU sample counts as idle, and when a whole job is idle.

Shared by the audit (its idle tables, ``hetslurm.audit.tables``) and ``act`` (the stall
verdict, :mod:`hetslurm.policy.stall`), so a job the audit calls idle is the job ``act`` may
requeue; the simulator will use the same rule. Definitions (docs/metrics-and-audit.md,
``[usage]`` in the site file):

* a sample stands for ``interval_s`` seconds of one GPU; it is *known* when its status is
  ``ok`` and it has a utilization; anything else (missing, stale, MIG, not supported, lost)
  is *unknown*, and unknown is never idle;
* used GPU-hours = sum of utilization/100 x interval; busy GPU-hours = interval of samples
  at or above ``busy_threshold_pct``; idle GPU-hours = interval of known samples below
  ``idle_threshold_pct`` while a job held the GPU (:func:`prepare_samples`);
* a job is *idle* when, in some window of ``idle_window_s`` (its whole run when shorter),
  every sample of every GPU is known and below ``idle_threshold_pct`` (and below
  ``idle_memory_mib`` when set), and *every allocated GPU* (node, Slurm index) has samples
  for at least ``min_coverage`` of the window's wall time: each distinct instant of a
  device once, for its ``interval_s`` capped at ``[collector] interval_s``. A GPU with no
  rows (its node's collector down, a device unreported) is unknown (:func:`judge_windows`).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

from hetslurm.site.model import Site
from hetslurm.site.schema import Usage


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

    codes, names = str_codes(node)
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
                  allocated: Mapping[int, Collection[tuple[str, int]]] | None = None
                  ) -> tuple[Any, Any]:
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
    whose samples are all known and below the thresholds (the only ones it can decide).
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
    pick = np.flatnonzero(judged.to_numpy()[group] if len(group) else np.zeros(0, dtype=bool))
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


def str_codes(col: Any) -> tuple[Any, list[str]]:
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
