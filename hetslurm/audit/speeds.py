"""How fast each GPU model ran this site's own jobs (``hetslurm learn speeds``, issue 22).

From accounting (one row per completed run, as :func:`hetslurm.audit.sacct.sacct_result`
builds it: user, job name, class from the hook's decision record, GPU model, elapsed time),
per workload class: a recurring job (same user and job name) that ran on several models
says how their run times compare. The model is fitted by least squares on log run time,

    log(elapsed) = job effect (one per recurring job) + model effect (one per model),

so a job that is always long does not make its model look slow. A model's **ratio** is the
reference model's run time over its own, exp(-effect): 2.0 = twice as fast as the reference
(the first model of the site's ``gpu_model_order`` that has enough runs in the class, else
the first in name order). The 95 % interval comes from the fit's standard error
(Student's t). A model with fewer than ``min_jobs`` runs in a class, or one no recurring job
links to the reference (no job ran on both, directly or through a third model), gets a row
saying so, never a guessed number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Student's t, two-sided 95 %, by degrees of freedom (1-30); larger uses the normal 1.96.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
SPEED_COLUMNS = ("class", "model", "ratio", "ci_low", "ci_high", "n", "reference", "note")


def _t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass
class SpeedRow:
    wclass: str
    model: str
    n: int
    reference: str | None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.wclass, "model": self.model, "ratio": self.ratio,
                "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n,
                "reference": self.reference, "note": self.note}


@dataclass
class SpeedResult:
    rows: list[SpeedRow] = field(default_factory=list)
    #: Completed single-model GPU runs read, and what was left out and why.
    runs: int = 0
    left_out: dict[str, int] = field(default_factory=dict)

    def measured(self) -> list[SpeedRow]:
        return [r for r in self.rows if r.ratio is not None]


def learn_speeds(jobs: Any, *, model_order: Sequence[str] = (), min_jobs: int = 3
                 ) -> SpeedResult:
    """Per class and model: the speed ratio against the class's reference model.

    Args:
        jobs: DataFrame with columns ``user``, ``name``, ``wclass``, ``state``, ``gpus``,
            ``gpu_model``, ``elapsed`` (seconds) — :func:`~hetslurm.audit.sacct.sacct_result`.
        model_order: The site's GPU model order (the first one present is the reference).
        min_jobs: Fewest runs of a model in a class for a ratio.
    """
    res = SpeedResult()
    if jobs is None or len(jobs) == 0:
        return res
    df = jobs
    keep = (df["state"].astype(str) == "COMPLETED")
    res.left_out["not completed"] = int((~keep).sum())
    gpu = keep & (df["gpus"].fillna(0).astype(float) > 0)
    res.left_out["no GPU"] = int((keep & ~gpu).sum())
    model = df["gpu_model"].fillna("").astype(str)
    single = gpu & (model != "") & ~model.str.contains(r"[|,]", regex=True)
    res.left_out["model unknown or mixed"] = int((gpu & ~single).sum())
    elapsed = df["elapsed"].fillna(0).astype(float)
    ok = single & (elapsed > 0)
    res.left_out["no run time"] = int((single & ~ok).sum())
    d = df[ok]
    res.runs = len(d)
    if res.runs == 0:
        return res
    classes = d["wclass"].fillna("").astype(str).replace("", "-")
    keys = d["user"].fillna("").astype(str) + "\x00" + d["name"].fillna("").astype(str)
    y_all = np.log(elapsed[ok].to_numpy())
    models_all = model[ok].to_numpy()
    for wclass in sorted(set(classes)):
        sel = (classes == wclass).to_numpy()
        res.rows += _fit_class(wclass, keys.to_numpy()[sel], models_all[sel], y_all[sel],
                               model_order, min_jobs)
    return res


def _fit_class(wclass: str, keys: Any, models: Any, y: Any, model_order: Sequence[str],
               min_jobs: int) -> list[SpeedRow]:
    counts = {m: int((models == m).sum()) for m in sorted(set(models))}
    enough = [m for m, c in counts.items() if c >= min_jobs]
    rows = [SpeedRow(wclass, m, c, None, note=f"too few jobs ({c} < {min_jobs})")
            for m, c in counts.items() if c < min_jobs]
    if not enough:
        return rows
    ranked = [m for m in model_order if m in enough] + sorted(m for m in enough
                                                               if m not in model_order)
    ref = ranked[0]
    use = np.isin(models, enough)
    keys, models, y = keys[use], models[use], y[use]
    key_ids = {k: i for i, k in enumerate(sorted(set(keys)))}
    others = [m for m in ranked if m != ref]
    col = {m: len(key_ids) + i for i, m in enumerate(others)}
    x = np.zeros((len(y), len(key_ids) + len(others)))
    x[np.arange(len(y)), [key_ids[k] for k in keys]] = 1.0
    for i, m in enumerate(models):
        if m in col:
            x[i, col[m]] = 1.0
    rows.append(SpeedRow(wclass, ref, counts[ref], ref, 1.0, 1.0, 1.0, "reference"))
    if not others:
        return rows
    linked = _linked(keys, models, ref)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - np.linalg.matrix_rank(x)
    resid = y - x @ beta
    sigma2 = float(resid @ resid) / dof if dof > 0 else math.nan
    cov = np.linalg.pinv(x.T @ x) * sigma2
    for m in others:
        if m not in linked:
            rows.append(SpeedRow(wclass, m, counts[m], ref, note=(
                f"not comparable with {ref}: no recurring job (same user and name) ran on "
                "both")))
            continue
        b = float(beta[col[m]])
        ratio = math.exp(-b)
        row = SpeedRow(wclass, m, counts[m], ref, round(ratio, 4))
        if dof > 0:
            half = _t975(dof) * math.sqrt(max(float(cov[col[m], col[m]]), 0.0))
            row.ci_low, row.ci_high = round(math.exp(-b - half), 4), round(math.exp(-b + half), 4)
        else:
            row.note = "no interval: as many parameters as runs"
        rows.append(row)
    return rows


def _linked(keys: Any, models: Any, ref: str) -> set[str]:
    """Models connected to ``ref`` through recurring jobs that ran on two of them."""
    by_key: dict[str, set[str]] = {}
    for k, m in zip(keys, models, strict=True):
        by_key.setdefault(str(k), set()).add(str(m))
    linked, frontier = {ref}, [ref]
    while frontier:
        cur = frontier.pop()
        for ms in by_key.values():
            if cur in ms:
                for m in ms - linked:
                    linked.add(m)
                    frontier.append(m)
    return linked


def speed_section(result: SpeedResult, *, source: str = "") -> str:
    """A proposed ``[levers.speed]`` section (TOML) from the measured rows: per model, per
    class, the ratio against the class's reference. Unmeasured pairs are left out and named
    in comments."""
    lines = ["# Proposed by `hetslurm learn speeds`" + (f" from {source}" if source else "") + ".",
             "# Ratios: run time on the reference model over run time on this model; review",
             "# before merging into the site file ([levers] speed).", ""]
    per_model: dict[str, dict[str, SpeedRow]] = {}
    for r in result.measured():
        per_model.setdefault(r.model, {})[r.wclass] = r
    for r in result.rows:
        if r.ratio is None:
            lines.append(f"# {r.wclass}/{r.model}: not measured: {r.note}")
    for model in sorted(per_model):
        lines += ["", f"[levers.speed.{model}]"]
        for wclass, r in sorted(per_model[model].items()):
            ci = (f"  # 95% {r.ci_low}-{r.ci_high}, n={r.n}" if r.ci_low is not None
                  else f"  # n={r.n}")
            key = wclass if wclass.replace("_", "").replace("-", "").isalnum() and \
                wclass != "-" else f'"{wclass}"'
            lines.append(f"{key} = {r.ratio}{ci}")
    return "\n".join(lines) + "\n"
