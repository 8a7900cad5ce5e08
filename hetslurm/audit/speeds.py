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
    #: How recurring jobs were matched (by script, or by user and name only), for the reader.
    notes: list[str] = field(default_factory=list)

    def measured(self) -> list[SpeedRow]:
        return [r for r in self.rows if r.ratio is not None]


def _usable(jobs: Any, res: SpeedResult) -> Any:
    """The runs a fit can use (completed, one GPU model, a run time), with the reasons the
    others were left out counted in ``res.left_out``: a DataFrame with ``wclass``,
    ``model``, ``y`` (log elapsed), ``group`` (int64 code of user and job name), ``job_id``,
    ``submit`` and ``script`` (the script hash, "" when not known)."""
    import pandas as pd

    df = jobs
    keep = (df["state"].astype(str) == "COMPLETED").to_numpy()
    res.left_out["not completed"] = int((~keep).sum())
    gpu = keep & (df["gpus"].fillna(0).astype(float) > 0).to_numpy()
    res.left_out["no GPU"] = int((keep & ~gpu).sum())
    model = df["gpu_model"].astype(object).fillna("").astype(str)
    mixed = model.str.contains(r"[|,]", regex=True).to_numpy()
    single = gpu & (model != "").to_numpy() & ~mixed
    res.left_out["model unknown or mixed"] = int((gpu & ~single).sum())
    elapsed = df["elapsed"].astype(float).fillna(0).to_numpy()
    ok = single & (elapsed > 0)
    res.left_out["no run time"] = int((single & ~ok).sum())
    d = df[ok]
    user = pd.factorize(d["user"].astype(object).fillna("").to_numpy())[0]
    name = pd.factorize(d["name"].astype(object).fillna("").to_numpy())[0]
    group = pd.factorize(user.astype(np.int64) * (int(name.max(initial=0)) + 1) + name)[0]
    wclass = d["wclass"].astype(object).fillna("").astype(str).replace("", "-")
    script = (d["script"].astype(object).fillna("").astype(str) if "script" in d
              else pd.Series("", index=d.index))
    return pd.DataFrame({
        "wclass": wclass.to_numpy(), "model": model[ok].to_numpy(),
        "y": np.log(elapsed[ok]), "group": group.astype(np.int64),
        "job_id": d["job_id"].to_numpy() if "job_id" in d else np.arange(len(d)),
        "submit": (d["submit"].astype(float).fillna(0).to_numpy() if "submit" in d
                   else np.zeros(len(d))),
        "script": script.to_numpy()})


def _comparing(u: Any, min_jobs: int) -> Any:
    """bool[runs] of ``_usable``'s frame: the runs whose recurring job (user and name) ran on
    two or more of its class's models with ``min_jobs`` runs: the only runs a script hash
    can move between recurring jobs in a way that changes a ratio."""
    import pandas as pd

    cls = pd.factorize(u["wclass"].to_numpy())[0].astype(np.int64)
    mod = pd.factorize(u["model"].to_numpy())[0].astype(np.int64)
    cm = cls * (int(mod.max(initial=0)) + 1) + mod
    cm_inv = np.unique(cm, return_inverse=True)[1]
    enough = np.bincount(cm_inv)[cm_inv] >= min_jobs
    grp = u["group"].to_numpy()
    cg = pd.factorize(cls * (int(grp.max(initial=0)) + 1) + grp)[0]
    # Distinct enough-models per (class, group).
    pairs = np.unique(np.stack([cg[enough], mod[enough]]), axis=1)
    spread = np.bincount(pairs[0], minlength=int(cg.max(initial=-1)) + 1)
    return enough & (spread[cg] >= 2)


def jobs_for_scripts(jobs: Any, *, min_jobs: int = 3) -> Any:
    """``(job_id, submit)`` of the runs whose script hash can change the fit (see
    :func:`_comparing`), one row per job: a DataFrame, recurring job by recurring job."""
    u = _usable(jobs, SpeedResult()) if jobs is not None and len(jobs) else None
    if u is None or len(u) == 0:
        import pandas as pd

        return pd.DataFrame({"job_id": [], "submit": [], "group": []})
    u = u[_comparing(u, min_jobs)]
    return (u[["job_id", "submit", "group"]].drop_duplicates("job_id")
            .sort_values(["group", "job_id"], kind="stable").reset_index(drop=True))


def learn_speeds(jobs: Any, *, model_order: Sequence[str] = (), min_jobs: int = 3,
                 reference: bool = False) -> SpeedResult:
    """Per class and model: the speed ratio against the class's reference model.

    Args:
        jobs: DataFrame with columns ``user``, ``name``, ``wclass``, ``state``, ``gpus``,
            ``gpu_model``, ``elapsed`` (seconds) — :func:`~hetslurm.audit.sacct.sacct_result`
            — and optionally ``script``: a hash of each run's batch script, "" where it is
            not known. A recurring job is (user, name, script) where every run of the (user,
            name) has a hash, else (user, name) (counted in ``notes``).
        model_order: The site's GPU model order (the first one present is the reference).
        min_jobs: Fewest runs of a model in a class for a ratio.
        reference: Fit with the dense design matrix (the first implementation; tests and
            ``bench learn`` compare the two on small inputs).
    """
    import pandas as pd

    res = SpeedResult()
    if jobs is None or len(jobs) == 0:
        return res
    u = _usable(jobs, res)
    res.runs = len(u)
    if res.runs == 0:
        return res
    group = u["group"].to_numpy()
    script = u["script"].to_numpy()
    known = script != ""
    scode = pd.factorize(script)[0].astype(np.int64) + 1
    ngroups = int(group.max()) + 1
    all_known = np.bincount(group, known, minlength=ngroups) == np.bincount(group,
                                                                            minlength=ngroups)
    keys = group * (int(scode.max()) + 1) + np.where(all_known[group], scode, 0)
    if known.any():
        comparing = _comparing(u, min_jobs)
        g_cmp = np.unique(group[comparing])
        partly = np.unique(group[comparing & ~all_known[group]])
        kinds = np.unique(np.stack([group[comparing & all_known[group]],
                                    scode[comparing & all_known[group]]]), axis=1)[0]
        split = int((np.bincount(kinds, minlength=ngroups) > 1).sum()) if len(kinds) else 0
        res.notes.append(f"{len(g_cmp) - len(partly)} of {len(g_cmp)} recurring jobs (user "
                         "and job name) that ran on two models matched by script too"
                         + (f"; {split} of them ran different scripts under one name and "
                            "were split" if split else ""))
        if len(partly):
            res.notes.append(f"{len(partly)} recurring job(s) matched by user and job name "
                             "only: some of their runs have no stored script")
    else:
        res.notes.append("recurring jobs matched by user and job name only (no script "
                         "hashes)")
    fit = _fit_class_dense if reference else _fit_class
    classes = u["wclass"].to_numpy()
    models = u["model"].to_numpy()
    y = u["y"].to_numpy()
    for wclass in sorted(set(classes.tolist())):
        sel = classes == wclass
        res.rows += fit(wclass, keys[sel], models[sel], y[sel], model_order, min_jobs)
    return res


def _fit_class(wclass: str, keys: Any, models: Any, y: Any, model_order: Sequence[str],
               min_jobs: int) -> list[SpeedRow]:
    """One class's fit, without the dense design matrix (one column per recurring job would
    be runs x jobs, terabytes at a million runs).

    By the Frisch-Waugh-Lovell theorem the model effects of ``y = job + model`` are the
    least-squares fit of the job-demeaned ``y`` on the job-demeaned model indicators: per-job
    sums by ``bincount`` and an (M-1) x (M-1) system, O(runs x models).

    Args:
        keys: int64[runs], the recurring job of each run (any integer codes).
        models: object/str[runs], each run's GPU model.
        y: float64[runs], log elapsed seconds.
    """
    names, mcode = np.unique(models.astype(str), return_inverse=True)
    counts_arr = np.bincount(mcode, minlength=len(names))
    counts = {str(m): int(c) for m, c in zip(names, counts_arr, strict=True)}
    enough = [m for m, c in counts.items() if c >= min_jobs]
    rows = [SpeedRow(wclass, m, c, None, note=f"too few jobs ({c} < {min_jobs})")
            for m, c in counts.items() if c < min_jobs]
    if not enough:
        return rows
    ranked = [m for m in model_order if m in enough] + sorted(m for m in enough
                                                               if m not in model_order)
    ref = ranked[0]
    rows.append(SpeedRow(wclass, ref, counts[ref], ref, 1.0, 1.0, 1.0, "reference"))
    others = [m for m in ranked if m != ref]
    if not others:
        return rows
    index = {str(m): i for i, m in enumerate(names)}
    # Columns: the non-reference models with enough runs; -1 for the reference.
    col_of = np.full(len(names), -1, dtype=np.int64)
    for i, m in enumerate(others):
        col_of[index[m]] = i
    use = counts_arr[mcode] >= min_jobs
    kcode = np.unique(keys[use], return_inverse=True)[1]
    col, yv = col_of[mcode[use]], y[use]
    n, k, p = len(yv), int(kcode.max()) + 1, len(others)
    size = np.bincount(kcode, minlength=k).astype(float)
    y_t = yv - (np.bincount(kcode, yv, minlength=k) / size)[kcode]
    # Demeaned indicators, one column per non-reference model: n x p (p is a handful).
    x_t = np.zeros((n, p))
    for j in range(p):
        d = (col == j).astype(float)
        x_t[:, j] = d - (np.bincount(kcode, d, minlength=k) / size)[kcode]
    a = x_t.T @ x_t
    a_inv = np.linalg.pinv(a)
    beta = a_inv @ (x_t.T @ y_t)
    resid = y_t - x_t @ beta
    dof = n - k - int(np.linalg.matrix_rank(a)) if p else n - k
    sigma2 = float(resid @ resid) / dof if dof > 0 else math.nan
    linked = _linked(kcode, mcode[use], index[ref])
    for j, m in enumerate(others):
        if index[m] not in linked:
            rows.append(SpeedRow(wclass, m, counts[m], ref, note=(
                f"not comparable with {ref}: no recurring job (same user, name and script) "
                "ran on both")))
            continue
        b = float(beta[j])
        row = SpeedRow(wclass, m, counts[m], ref, round(math.exp(-b), 4))
        if dof > 0:
            half = _t975(dof) * math.sqrt(max(float(a_inv[j, j]) * sigma2, 0.0))
            row.ci_low, row.ci_high = round(math.exp(-b - half), 4), round(math.exp(-b + half), 4)
        else:
            row.note = "no interval: as many parameters as runs"
        rows.append(row)
    return rows


def _linked(kcode: Any, mcode: Any, ref: int) -> set[int]:
    """Models (codes) connected to ``ref`` through recurring jobs that ran on two of them."""
    m = int(mcode.max()) + 1
    present = np.zeros((int(kcode.max()) + 1, m), dtype=np.int64)
    present[kcode, mcode] = 1
    adjacent = (present.T @ present) > 0  # models x models: some job ran on both
    linked, frontier = {ref}, [ref]
    while frontier:
        for other in np.flatnonzero(adjacent[frontier.pop()]).tolist():
            if other not in linked:
                linked.add(other)
                frontier.append(other)
    return linked


def _fit_class_dense(wclass: str, keys: Any, models: Any, y: Any, model_order: Sequence[str],
               min_jobs: int) -> list[SpeedRow]:
    """The reference fit: the dense design matrix (one column per recurring job and per
    model) and ``numpy.linalg.lstsq``, as first written; small inputs only."""
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
    linked = _linked_dense(keys, models, ref)
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    dof = len(y) - np.linalg.matrix_rank(x)
    resid = y - x @ beta
    sigma2 = float(resid @ resid) / dof if dof > 0 else math.nan
    cov = np.linalg.pinv(x.T @ x) * sigma2
    for m in others:
        if m not in linked:
            rows.append(SpeedRow(wclass, m, counts[m], ref, note=(
                f"not comparable with {ref}: no recurring job (same user, name and script) "
                "ran on both")))
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


def _linked_dense(keys: Any, models: Any, ref: str) -> set[str]:
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


def shown(name: str) -> str:
    """A class or model name as it may appear in a comment or a one-line message: as it is
    when it is a valid site name (or ``-``), else quoted with its control characters escaped
    and cut to 40 characters (a class comes from a job's comment, which users can write)."""
    from hetslurm.site.names import ident_problem

    return name if name == "-" or ident_problem(name, "name") is None else repr(name[:40])


def speed_section(result: SpeedResult, *, source: str = "") -> str:
    """A proposed ``[levers.speed]`` section (TOML) from the measured rows: per model, per
    class, the ratio against the class's reference. Unmeasured pairs are left out and named
    in comments; so is a class or model whose name is not a valid site name."""
    from hetslurm.site.importer import toml_key

    lines = ["# Proposed by `hetslurm learn speeds`" + (f" from {source}" if source else "") + ".",
             "# Ratios: run time on the reference model over run time on this model; review",
             "# before merging into the site file ([levers] speed).", ""]
    per_model: dict[str, dict[str, SpeedRow]] = {}
    for r in result.measured():
        if shown(r.wclass) != r.wclass or shown(r.model) != r.model:
            lines.append(f"# {shown(r.wclass)}/{shown(r.model)}: left out: not a valid class "
                         "or model name")
            continue
        per_model.setdefault(r.model, {})[r.wclass] = r
    for r in result.rows:
        if r.ratio is None:
            lines.append(f"# {shown(r.wclass)}/{shown(r.model)}: not measured: {r.note}")
    for model in sorted(per_model):
        lines += ["", f"[levers.speed.{model}]"]
        for wclass, r in sorted(per_model[model].items()):
            ci = (f"  # 95% {r.ci_low}-{r.ci_high}, n={r.n}" if r.ci_low is not None
                  else f"  # n={r.n}")
            lines.append(f"{toml_key(wclass)} = {r.ratio}{ci}")
    return "\n".join(lines) + "\n"
