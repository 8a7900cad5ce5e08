"""Every audit table, computed with pandas from jobs (sacct) and samples (the store).

The idle rule (which samples are known, idle or busy; when a job is idle) is
:mod:`hetslurm.policy.idle`, the one ``act`` judges stalled jobs by; these tables apply it.
Beyond it (docs/metrics-and-audit.md, ``[usage]`` in the site file):

* wait = start - eligible, per run (``sacct --duplicates`` gives a requeued job a row per
  start).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hetslurm.audit.energy import energy_per_work, energy_tables, reconcile, site_speeds
from hetslurm.policy.idle import (
    interval_cap,
    judge_windows,
    prepare_jobs,
    prepare_samples,
    str_codes,
)
from hetslurm.site.model import Site
from hetslurm.site.schema import Usage

#: Relative speeds used for right-size advice when the site's ``[usage] speed`` is empty
#: (dense FP16/BF16 tensor throughput, A100 = 1; a rough public ranking).
DEFAULT_SPEED = {"b200": 6.0, "h200": 3.2, "h100": 3.0, "gh200": 3.2, "l40s": 1.1,
                 "a100": 1.0, "l40": 0.6, "a40": 0.5, "a10": 0.4, "v100": 0.4, "l4": 0.4,
                 "t4": 0.2}
TABLES = ("by_gpu_model", "by_partition", "by_account", "by_user", "by_class", "idle_jobs",
          "wait", "fragmentation", "right_size", "placement", "hook_decisions",
          "class_agreement", "energy_jobs", "energy", "energy_per_work")
AGREEMENT_COLUMNS = ("class", "cpu_only", "jobs", "with_evidence", "inferred_cpu",
                     "inferred_gpu", "agreed", "agreement_pct", "rule_jobs", "rule_agreed")


@dataclass
class AuditResult:
    """Named tables and what they were computed from."""

    tables: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.meta.get("partial"))


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
    codes, names = str_codes(pd.Series(s["gpu_model"].array.take(snap["model_rows"])))
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


def class_agreement(jobs: Any, pj: Any, site: Site | None, usage: Usage, *, since: float,
                    until: float) -> Any:
    """For jobs that declared a class: how often the class inferred from the same evidence
    (:mod:`hetslurm.policy.classify`, what ``learn classes`` proposes from) agreed.

    Per declared class: ``jobs``; ``with_evidence`` (ended runs whose GPU use is known, or
    that held no GPU); ``inferred_cpu`` / ``inferred_gpu`` (the evidence says the job never
    used a GPU / used one); ``agreed`` (a CPU-only class inferred cpu, a device class
    inferred gpu) and ``agreement_pct`` of ``with_evidence``; ``rule_jobs`` / ``rule_agreed``
    the same against the site's ``[classify]`` rules (same user and job name). A class the
    hook applied from the rules is not a declared class and is left out. Jobs: those that
    ran in ``[since, until)``, or were submitted then and never started.
    """
    import pandas as pd

    from hetslurm.policy.classify import cpu_classes, infer, run_gpu_use
    from hetslurm.request.record import find_record
    from hetslurm.site.hook_rules import hook_policy
    from hetslurm.site.schema import Classify, HookPolicy

    policy = hook_policy(site) if site is not None else HookPolicy()
    cf = site.sections.get("classify") if site is not None else None
    rules = ({(r.user, r.name): r.wclass for r in cf.rules} if isinstance(cf, Classify)
             else {})
    cpu = set(cpu_classes(site))
    per: dict[str, dict[str, int]] = {}
    if policy.record_field != "none" and jobs is not None and len(jobs):
        cols = ["job_id", "user", "name", "gpus", "start", "submit", "end",
                policy.record_field]
        start = jobs["start"].fillna(0).astype(float)
        end = jobs["end"].fillna(0).astype(float)
        ran = (start > 0) & (start < until) & ((end <= 0) | (end > since))
        submit = jobs["submit"].fillna(0).astype(float)
        waiting = (start <= 0) & (submit >= since) & (submit < until)
        for r in jobs.loc[ran | waiting, cols].to_dict("records"):
            rec = find_record(str(r[policy.record_field] or "") or None, policy.record_key)
            declared = rec.declared_class if rec is not None else None
            if not declared:
                continue
            row = per.setdefault(declared, dict.fromkeys(AGREEMENT_COLUMNS[2:], 0))
            row["jobs"] += 1
            ruled = rules.get((str(r["user"]), str(r["name"])))
            if ruled is not None:
                row["rule_jobs"] += 1
                row["rule_agreed"] += ruled == declared
            if not r["start"] or r["start"] != r["start"]:
                continue  # never started: no evidence
            jid = int(r["job_id"])
            ev = pj.loc[jid] if jid in pj.index else None
            known = (float(ev["sampled_gpu_hours"]) - float(ev["unknown_gpu_hours"])
                     if ev is not None else None)
            use = run_gpu_use(int(r["gpus"] or 0),
                              None if ev is None else _maybe(ev["max_util_pct"]),
                              None if ev is None else _maybe(ev["max_memory_mib"]),
                              known, usage)
            verdict = infer([use], "cpu")
            if verdict.kind is None:
                continue
            row["with_evidence"] += 1
            row["inferred_" + verdict.kind] += 1
            row["agreed"] += (verdict.kind == "cpu") == (declared in cpu)
    out = []
    for name in sorted(per):
        row = per[name]
        pct = 100.0 * row["agreed"] / row["with_evidence"] if row["with_evidence"] else None
        out.append({"class": name, "cpu_only": name in cpu, **row,
                    "agreement_pct": None if pct is None else round(pct, 1)})
    return pd.DataFrame(out, columns=list(AGREEMENT_COLUMNS))


def _maybe(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


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
    tables["class_agreement"] = class_agreement(jobs, pj, site, usage, since=since,
                                                until=until)
    tables["energy_jobs"], tables["energy"] = energy_tables(j, s)
    tables["energy_per_work"] = energy_per_work(tables["energy_jobs"], site_speeds(site))
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
        "energy_reconciliation": reconcile(tables["energy_jobs"]),
        "partial": False, "problems": [],
    }
    if meta["clock_jump_samples"]:
        meta["problems"].append(f"{meta['clock_jump_samples']} samples were taken across a "
                                "clock jump; their times may be off")
    if j.empty and s.empty:
        meta["problems"].append("no jobs and no samples in the range")
    return AuditResult(tables, meta)
