"""Energy per job from the NVML energy counter (docs/metrics-and-audit.md, "Energy").

NVML's total energy counter (``energy_j``, joules since the driver loaded) is read with every
GPU sample. A job's energy on one GPU is the sum of the counter's increments between two
consecutive samples of that GPU that the job held both of; the time between them is
*covered*. Every other sampled interval of the job is *unknown energy*, never estimated:

* the job's first sample on a GPU (the interval before it may have started before the job);
* a sample whose previous one on the GPU is missing for longer than ``max_gap`` sampling
  intervals (the collector was down, the segment lost);
* a counter that went backwards (a driver reload) or that the device did not report.

``coverage_pct`` says how much of the sampled GPU-time the energy covers, so a reader can
tell a low figure from a short one.
"""

from __future__ import annotations

from typing import Any

#: A gap longer than this many sampling intervals between two samples is not bridged.
MAX_GAP_INTERVALS = 1.5

JOB_COLUMNS = ("job_id", "user", "account", "class", "gpu_model", "gpus", "energy_j",
               "energy_kwh", "covered_gpu_hours", "unknown_gpu_hours", "coverage_pct",
               "mean_power_w")
GROUP_COLUMNS = ("by", "key", "jobs", "energy_kwh", "covered_gpu_hours", "unknown_gpu_hours",
                 "coverage_pct", "mean_power_w")
#: The job dimensions the ``energy`` table sums over, and the job column each reads.
GROUPS = (("user", "user"), ("account", "account"), ("class", "wclass"),
          ("gpu_model", "gpu_model"))


def energy_per_job(s: Any, *, max_gap: float = MAX_GAP_INTERVALS) -> Any:
    """Per job id: ``energy_j``, ``covered_s`` and ``unknown_s`` (GPU-seconds) from
    samples (columns time, node, minor, job_id, energy_j, interval_s)."""
    import numpy as np
    import pandas as pd

    cols = ["energy_j", "covered_s", "unknown_s"]
    held = s[s["job_id"].notna() & s["minor"].notna()] if len(s) else s
    if not len(held):
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in cols},
                            index=pd.Index([], dtype="int64", name="job_id"))
    d = s.loc[s["minor"].notna(), ["time", "node", "minor", "job_id", "energy_j",
                                   "interval_s"]]
    col = d["node"]
    node = (col.cat.codes.to_numpy().astype(np.int64)
            if isinstance(col.dtype, pd.CategoricalDtype) else pd.factorize(col)[0])
    minor = d["minor"].to_numpy(dtype="float64").astype(np.int64)
    time = d["time"].to_numpy(dtype="float64")
    # One integer per device (node, minor); samples in (device, time) order. When the device
    # and the time in milliseconds fit one int64 key, one argsort of it (a third of a
    # lexsort's time on ten million samples).
    dev = node * (int(minor.max()) + 1 if len(minor) else 1) + minor
    t_ms = np.rint((time - time.min()) * 1000.0).astype(np.int64) if len(time) else time
    tbits = int(t_ms.max()).bit_length() if len(time) else 0
    if len(dev) and int(dev.max()).bit_length() + tbits <= 62:
        order = np.argsort((dev << tbits) | t_ms)
    else:
        order = np.lexsort((time, dev))
    dev, time = dev[order], time[order]
    job = d["job_id"].to_numpy(dtype="float64")[order]
    energy = d["energy_j"].to_numpy(dtype="float64")[order]
    interval = d["interval_s"].to_numpy(dtype="float64")[order]
    same_dev = np.zeros(len(order), dtype=bool)
    same_dev[1:] = dev[1:] == dev[:-1]
    prev_job = np.full(len(order), np.nan)
    prev_job[1:] = job[:-1]
    dt = np.full(len(order), np.nan)
    dt[1:] = time[1:] - time[:-1]
    de = np.full(len(order), np.nan)
    de[1:] = energy[1:] - energy[:-1]
    with np.errstate(invalid="ignore"):
        covered = (same_dev & ~np.isnan(job) & (prev_job == job) & (dt > 0)
                   & (dt <= max_gap * np.where(interval > 0, interval, np.inf))
                   & np.isfinite(de) & (de >= 0))
    mine = ~np.isnan(job)
    weight = np.where(np.isfinite(interval), interval, 0.0)
    frame = pd.DataFrame({
        "job_id": job[mine].astype(np.int64),
        "energy_j": np.where(covered, de, 0.0)[mine],
        "covered_s": np.where(covered, dt, 0.0)[mine],
        "unknown_s": np.where(covered, 0.0, weight)[mine],
    })
    return frame.groupby("job_id")[cols].sum()


def energy_tables(j: Any, s: Any) -> tuple[Any, Any]:
    """``energy_jobs`` (one row per GPU job run in the range, its energy and coverage) and
    ``energy`` (sums by user, account, class and GPU model)."""
    import numpy as np
    import pandas as pd

    per = energy_per_job(s)
    if j.empty:
        jobs = pd.DataFrame(columns=list(JOB_COLUMNS))
    else:
        runs = j.groupby("job_id", observed=True).agg(
            user=("user", "last"), account=("account", "last"), wclass=("wclass", "last"),
            gpu_model=("gpu_model", "last"), gpus=("gpus", "max"))
        runs = runs.join(per, how="left")
        for c in ("energy_j", "covered_s", "unknown_s"):
            runs[c] = runs[c].fillna(0.0)
        jobs = _figures(runs).reset_index().rename(columns={"wclass": "class"})
        for c in ("user", "account", "class", "gpu_model"):
            jobs[c] = jobs[c].astype(str)
        jobs["gpus"] = jobs["gpus"].astype("int64")
        jobs = jobs[list(JOB_COLUMNS)].sort_values("energy_j", ascending=False)
        jobs = jobs.reset_index(drop=True)
    parts = []
    for name, col in GROUPS:
        if jobs.empty:
            continue
        key = "class" if col == "wclass" else col
        g = jobs.groupby(jobs[key].astype(str), observed=True)
        sums = pd.DataFrame({
            "jobs": g.size(), "energy_j": g["energy_j"].sum(),
            "covered_s": g["covered_gpu_hours"].sum() * 3600.0,
            "unknown_s": g["unknown_gpu_hours"].sum() * 3600.0,
        })
        out = _figures(sums).reset_index(names="key")
        out.insert(0, "by", name)
        parts.append(out)
    if not parts:
        return jobs, pd.DataFrame(columns=list(GROUP_COLUMNS))
    groups = pd.concat(parts, ignore_index=True)
    groups["jobs"] = groups["jobs"].astype(np.int64)
    return jobs, groups[list(GROUP_COLUMNS)]


def _figures(frame: Any) -> Any:
    """kWh, GPU-hours, coverage and mean power from energy_j, covered_s, unknown_s."""
    sampled = frame["covered_s"] + frame["unknown_s"]
    frame["energy_kwh"] = frame["energy_j"] / 3.6e6
    frame["covered_gpu_hours"] = frame["covered_s"] / 3600.0
    frame["unknown_gpu_hours"] = frame["unknown_s"] / 3600.0
    frame["coverage_pct"] = (100.0 * frame["covered_s"] / sampled).where(sampled > 0)
    frame["mean_power_w"] = (frame["energy_j"] / frame["covered_s"]).where(
        frame["covered_s"] > 0)
    return frame.drop(columns=["covered_s", "unknown_s"])
