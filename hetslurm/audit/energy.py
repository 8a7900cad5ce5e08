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

**Energy per unit of work** (``energy_per_work``): where the site knows its GPU models'
speeds (``[levers] speed`` or ``speed_table``, the figures the energy/cost lever ranks by,
:func:`hetslurm.site.levers.relative_speed`), a model's watt-hours per *reference
GPU-hour*: the energy of its covered GPU-hours over the work those hours did, counted in
hours of the reference model (the slowest, speed 1.0)::

    wh_per_ref_gpu_hour = (energy_j / 3600) / (covered_gpu_hours * speed) = mean_power_w / speed

A model without a speed gets no figure and a note, never a guess.

**Slurm's own figure** (``slurm_energy_j``): where ``AcctGatherEnergyType`` gathers energy
(``acct_gather_energy/gpu``), sacct records it per step; :func:`hetslurm.slurm.sacct.job_energy_j`
reads the job's. :func:`reconcile` compares the two over the jobs that have both (a job
Slurm has no figure for is left out, never counted as 0).
"""

from __future__ import annotations

from typing import Any

#: A gap longer than this many sampling intervals between two samples is not bridged.
MAX_GAP_INTERVALS = 1.5

JOB_COLUMNS = ("job_id", "user", "account", "class", "gpu_model", "gpus", "energy_j",
               "energy_kwh", "covered_gpu_hours", "unknown_gpu_hours", "coverage_pct",
               "mean_power_w", "slurm_energy_j", "nvml_minus_slurm_j", "nvml_minus_slurm_pct")
GROUP_COLUMNS = ("by", "key", "jobs", "energy_kwh", "covered_gpu_hours", "unknown_gpu_hours",
                 "coverage_pct", "mean_power_w")
WORK_COLUMNS = ("class", "gpu_model", "jobs", "energy_kwh", "covered_gpu_hours",
                "coverage_pct", "mean_power_w", "speed", "reference", "wh_per_ref_gpu_hour",
                "note")
#: ``class`` of the rows over every class (speeds the lever's way: ``billing_workload``, or
#: the geometric mean over the workload types).
ALL_CLASSES = "*"
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
        g = j.groupby("job_id", observed=True)
        runs = g.agg(user=("user", "last"), account=("account", "last"),
                     wclass=("wclass", "last"), gpu_model=("gpu_model", "last"),
                     gpus=("gpus", "max"))
        # A requeued job's runs each have their figure; NaN only when none has one.
        runs["slurm_energy_j"] = (g["slurm_energy_j"].sum(min_count=1) if "slurm_energy_j" in j
                                  else np.nan)
        runs = runs.join(per, how="left")
        for c in ("energy_j", "covered_s", "unknown_s"):
            runs[c] = runs[c].fillna(0.0)
        jobs = _figures(runs).reset_index().rename(columns={"wclass": "class"})
        both = _both(jobs)
        jobs["nvml_minus_slurm_j"] = (jobs["energy_j"] - jobs["slurm_energy_j"]).where(both)
        jobs["nvml_minus_slurm_pct"] = (100.0 * jobs["nvml_minus_slurm_j"]
                                        / jobs["slurm_energy_j"]).where(both)
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


def _both(jobs: Any) -> Any:
    """Jobs with a Slurm figure and some covered NVML energy (the ones compared)."""
    return jobs["slurm_energy_j"].notna() & (jobs["covered_gpu_hours"] > 0)


#: What the audit says when sacct has energy for no job.
NO_SLURM_ENERGY = ("Slurm accounted no energy for any GPU job in the range (no "
                   "AcctGatherEnergyType, or acct_gather_energy/gpu without its NVML "
                   "support): nothing to reconcile")


def reconcile(jobs: Any) -> dict[str, Any]:
    """The NVML-derived energy against Slurm's over the jobs that have both, in total and
    per GPU model: ``meta.energy_reconciliation`` of the audit.

    Args:
        jobs: the ``energy_jobs`` table (:data:`JOB_COLUMNS`).
    """
    with_slurm = int(jobs["slurm_energy_j"].notna().sum()) if len(jobs) else 0
    out: dict[str, Any] = {"gpu_jobs": len(jobs), "jobs_with_slurm_energy": with_slurm,
                           "jobs_with_both": 0}
    if not with_slurm:
        out["note"] = NO_SLURM_ENERGY
        return out
    both = jobs[_both(jobs)]
    out["jobs_with_both"] = len(both)
    if both.empty:
        out["note"] = ("no job with a Slurm energy figure has covered NVML energy (no "
                       "samples of it in the store)")
        return out
    out.update(_compare(both))
    out["by_gpu_model"] = [{"gpu_model": str(m), **_compare(g)}
                           for m, g in both.groupby(both["gpu_model"].astype(str))]
    out["note"] = ("NVML counts only covered GPU-time (nvml_coverage_pct); Slurm's figure "
                   "spans what acct_gather_energy measured for the job's steps")
    return out


def _compare(both: Any) -> dict[str, Any]:
    nvml, slurm = float(both["energy_j"].sum()), float(both["slurm_energy_j"].sum())
    sampled = float((both["covered_gpu_hours"] + both["unknown_gpu_hours"]).sum())
    return {"jobs": len(both), "nvml_kwh": nvml / 3.6e6, "slurm_kwh": slurm / 3.6e6,
            "nvml_minus_slurm_kwh": (nvml - slurm) / 3.6e6,
            "nvml_minus_slurm_pct": 100.0 * (nvml - slurm) / slurm if slurm > 0 else None,
            "nvml_coverage_pct": (100.0 * float(both["covered_gpu_hours"].sum()) / sampled
                                  if sampled > 0 else None)}


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


def site_speeds(site: Any) -> dict[str, dict[str, float]]:
    """The site's relative GPU speeds as the levers read them: ``{class: {model: speed}}``
    with :data:`ALL_CLASSES` for the lever's own figure (``billing_workload``, else the
    geometric mean over the types) and one entry per workload type that every GPU model
    has a speed for (learned speeds key their types by class). The slowest model of each
    is 1.0. Empty when the site has no speeds."""
    from hetslurm.site.levers import gpu_speeds, relative_speed

    if site is None:
        return {}
    overall = gpu_speeds(site)
    if not overall:
        return {}
    out = {ALL_CLASSES: overall}
    lv = site.sections["levers"]  # gpu_speeds found speeds, so the section is there
    models = list(overall)
    rows = [set(lv.speed.get(m, {})) for m in models]
    for wtype in sorted(set.intersection(*rows)) if rows else ():
        out[wtype] = relative_speed(lv.speed, models, wtype)
    return out


def energy_per_work(jobs: Any, speeds: dict[str, dict[str, float]]) -> Any:
    """``energy_per_work``: per GPU model (class :data:`ALL_CLASSES`), and per class and
    model where the class is a workload type of the speed table, the measured energy of
    the covered GPU-hours per reference GPU-hour of work.

    Args:
        jobs: the ``energy_jobs`` table (:data:`JOB_COLUMNS`).
        speeds: :func:`site_speeds`.
    """
    import numpy as np
    import pandas as pd

    if jobs.empty:
        return pd.DataFrame(columns=list(WORK_COLUMNS))
    covered_s = jobs["covered_gpu_hours"] * 3600.0
    sampled_s = covered_s + jobs["unknown_gpu_hours"] * 3600.0
    frame = pd.DataFrame({"class": jobs["class"].astype(str),
                          "gpu_model": jobs["gpu_model"].astype(str),
                          "energy_j": jobs["energy_j"], "covered_s": covered_s,
                          "sampled_s": sampled_s})
    parts = []
    for keys in (["gpu_model"], ["class", "gpu_model"]):
        g = frame.groupby(keys, observed=True)
        sums = pd.DataFrame({"jobs": g.size(), "energy_j": g["energy_j"].sum(),
                             "covered_s": g["covered_s"].sum(),
                             "sampled_s": g["sampled_s"].sum()}).reset_index()
        if "class" not in keys:
            sums.insert(0, "class", ALL_CLASSES)
        else:
            # Per class only where the speed table has that class as a workload type.
            sums = sums[sums["class"].isin([c for c in speeds if c != ALL_CLASSES])]
        parts.append(sums)
    out = pd.concat(parts, ignore_index=True)
    out["energy_kwh"] = out["energy_j"] / 3.6e6
    out["covered_gpu_hours"] = out["covered_s"] / 3600.0
    out["coverage_pct"] = (100.0 * out["covered_s"] / out["sampled_s"]).where(
        out["sampled_s"] > 0)
    out["mean_power_w"] = (out["energy_j"] / out["covered_s"]).where(out["covered_s"] > 0)
    speed, reference, notes = [], [], []
    for wclass, model, power in zip(out["class"], out["gpu_model"], out["mean_power_w"],
                                    strict=True):
        table = speeds.get(wclass, {})
        sp = table.get(model)
        speed.append(np.nan if sp is None else sp)
        reference.append(min(table, key=lambda m: (table[m], m)) if table else None)
        if not speeds:
            notes.append("no speeds in the site file ([levers] speed): no figure")
        elif sp is None:
            notes.append(f"no speed for {model!r} in the site file: no figure")
        elif not np.isfinite(power):
            notes.append("no covered GPU-time: no figure")
        else:
            notes.append("")
    out["speed"] = pd.Series(speed, index=out.index, dtype="float64")
    out["reference"] = reference
    out["wh_per_ref_gpu_hour"] = out["mean_power_w"] / out["speed"]
    out["note"] = notes
    out["jobs"] = out["jobs"].astype(np.int64)
    return out[list(WORK_COLUMNS)].sort_values(["class", "gpu_model"]).reset_index(drop=True)
