"""Advice from the audit (``hetslurm advise``, issue 22 item 5).

One pass over the site's accounting (and the metrics store when given) proposes a whole site
file that ``hetslurm site diff`` shows and ``site apply`` applies:

* class rankings (``[classes.NAME] devices``) and ``[levers.speed]`` from the speeds
  measured by :mod:`hetslurm.audit.speeds` (:mod:`hetslurm.audit.ranking` decides the orders);
* classification rules (``[classify]``) for recurring jobs that never used a GPU
  (:mod:`hetslurm.audit.classes`);
* a default memory per node for each class (``[classes.NAME] mem_per_node``, which the hook
  gives a job of the class that asks for no memory): the ``quantile`` of the class's
  measured MaxRSS times ``headroom``, rounded up to 256 MiB;
* GPUs per job per class as advice comments only: a GPU count is the request's own meaning
  (``gpus=``), and no enforced default for it exists;
* from measured energy (:mod:`hetslurm.audit.energy_advice`), ``[hook] energy_low_models``
  and the energy lever's per-model GPU watts.

Every change carries its evidence as ``#`` comments above the table it changes; the text is
checked by the site loader before it is returned. Nothing is guessed: a class with too few
measured runs gets no proposal and a note saying why, and a learned speed for a GPU model the
site lacks refuses the whole proposal (:func:`hetslurm.audit.ranking.check_models`).
"""

from __future__ import annotations

import math
import re
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetslurm.audit.classes import ClassResult, learn_classes, usage_by_job
from hetslurm.audit.energy import site_speeds
from hetslurm.audit.energy_advice import EnergyAdvice, energy_advice, merge_energy
from hetslurm.audit.ranking import (
    ClassRanking,
    _toml_tables,
    complete_speed_table,
    rank_classes,
)
from hetslurm.audit.speeds import SpeedResult, learn_speeds, shown
from hetslurm.errors import ConfigError, MetricsError
from hetslurm.site.importer import toml_value
from hetslurm.site.model import Site, class_nodes
from hetslurm.site.schema import Usage
from hetslurm.slurm.sacct import JobUsage, SacctRecords

#: A proposed memory is rounded up to this (MiB): a default, not a measurement.
MEM_STEP_MIB = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: Run states whose MaxRSS says what the job needed (a running job's is not final).
_ENDED = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY",
                    "NODE_FAIL", "PREEMPTED", "DEADLINE"})


@dataclass(frozen=True)
class AdviseRequest:
    """What ``hetslurm advise`` was asked (the CLI's options as one typed object)."""

    since: float
    until: float
    sacct_file: str | None = None
    store: str | None = None
    min_jobs: int = 3
    min_mem_jobs: int = 10
    mem_quantile: float = 0.95
    mem_headroom: float = 1.2
    classify_mode: str = "suggest"
    cpu_class: str | None = None
    use_scripts: bool = True
    max_scripts: int = 5000
    script_cache: str | None = None


@dataclass
class MemoryAdvice:
    """One class's measured peak memory and the default proposed from it."""

    wclass: str
    runs: int
    measured: int
    p50_mib: float | None = None
    quantile_mib: float | None = None
    max_mib: float | None = None
    current: int | None = None
    proposed: int | None = None
    note: str = ""

    @property
    def changed(self) -> bool:
        return self.proposed is not None and self.proposed != self.current

    def evidence(self, quantile: float, headroom: float) -> str:
        if self.quantile_mib is None:
            return f"{self.wclass}: memory: {self.note}"
        return (f"{self.wclass}: MaxRSS of {self.measured} one-node runs: p50 "
                f"{self.p50_mib:.0f} MiB, p{quantile * 100:g} {self.quantile_mib:.0f} MiB, "
                f"max {self.max_mib:.0f} MiB; x{headroom:g}, rounded up to {MEM_STEP_MIB} MiB: "
                f"{self.proposed} MiB (now: "
                f"{'none' if self.current is None else str(self.current) + ' MiB'})")

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.wclass, "runs": self.runs, "measured": self.measured,
                "p50_mib": self.p50_mib, "quantile_mib": self.quantile_mib,
                "max_mib": self.max_mib, "current": self.current, "proposed": self.proposed,
                "changed": self.changed, "note": self.note}


@dataclass
class GpuAdvice:
    """GPUs per run of one class (advice only: no default is enforced)."""

    wclass: str
    gpu_runs: int
    p50: float
    p95: float
    max: int
    sampled: int = 0
    mean_util_pct: float | None = None

    def line(self) -> str:
        text = (f"{self.wclass}: advice only (no enforced default): GPUs per run over "
                f"{self.gpu_runs} GPU runs: p50 {self.p50:g}, p95 {self.p95:g}, max {self.max}")
        if self.mean_util_pct is not None:
            text += (f"; mean GPU utilization {self.mean_util_pct:.0f}% over {self.sampled} "
                     "sampled runs")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.wclass, "gpu_runs": self.gpu_runs, "p50": self.p50,
                "p95": self.p95, "max": self.max, "sampled": self.sampled,
                "mean_util_pct": self.mean_util_pct}


@dataclass
class Advice:
    """The proposal: the whole site text (None when nothing changes) and its parts."""

    site_text: str | None
    runs: int
    speeds: SpeedResult
    rankings: list[ClassRanking] = field(default_factory=list)
    speed_table: dict[str, dict[str, float]] = field(default_factory=dict)
    classes: ClassResult | None = None
    new_rules: int = 0
    memory: list[MemoryAdvice] = field(default_factory=list)
    gpus: list[GpuAdvice] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped_records: int = 0
    energy: EnergyAdvice | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"changes": self.changes, "runs": self.runs, "notes": self.notes,
                "rankings": [rk.to_dict() for rk in self.rankings],
                "speeds": [r.to_dict() for r in self.speeds.rows],
                "speed_table": self.speed_table,
                "classify_rules": self.new_rules,
                "classify": [r.to_dict() for r in self.classes.proposed()]
                if self.classes else [],
                "memory": [m.to_dict() for m in self.memory],
                "gpus": [g.to_dict() for g in self.gpus],
                "skipped_records": self.skipped_records,
                "energy": self.energy.to_dict() if self.energy is not None else None,
                "written": self.site_text is not None}


def comment(text: str) -> str:
    """One ``#`` line; control characters (a job name can hold any) shown escaped, so no
    text can end the comment and start a TOML line."""
    return "# " + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)[:300]


def _quantiles(values: Any, q: float) -> tuple[float, float, float]:
    import numpy as np

    return (float(np.quantile(values, 0.5)), float(np.quantile(values, q)),
            float(np.max(values)))


def memory_advice(jobs: Any, usage_of: Mapping[int, JobUsage], site: Site, *,
                  quantile: float = 0.95, headroom: float = 1.2,
                  min_jobs: int = 10) -> list[MemoryAdvice]:
    """Per class of the site: the measured MaxRSS of its ended one-node runs and the default
    memory per node proposed from it (None, with a note, when it cannot be)."""
    import numpy as np
    import pandas as pd

    classes = site.sections.get("classes") or {}
    if not classes or jobs is None or len(jobs) == 0:
        return []
    ids = np.fromiter(usage_of.keys(), dtype="int64", count=len(usage_of))
    rss = np.fromiter((u.max_rss_mib if u.max_rss_mib is not None else np.nan
                       for u in usage_of.values()), dtype="float64", count=len(usage_of))
    by_id = pd.Series(rss, index=ids)
    by_id = by_id[~by_id.index.duplicated(keep="last")]
    j = jobs[jobs["state"].astype(str).isin(_ENDED)]
    j = j.drop_duplicates("job_id", keep="last")
    wclass = j["wclass"].astype(str)
    nodes = j["nodes"].astype(str)
    # MaxRSS is the largest task's: per node only where the run had one node.
    one_node = (nodes != "") & ~nodes.str.contains(r"[\[,]", regex=True)
    frame = pd.DataFrame({"wclass": wclass.to_numpy(), "one": one_node.to_numpy(),
                          "rss": by_id.reindex(j["job_id"].to_numpy()).to_numpy()})
    runs = frame.groupby("wclass").size()
    ok = frame[frame["one"] & frame["rss"].notna() & (frame["rss"] > 0)]
    groups = {str(k): g["rss"].to_numpy() for k, g in ok.groupby("wclass")}
    out = []
    for cname in sorted(classes):
        wc = classes[cname]
        n_runs = int(runs.get(cname, 0))
        values = groups.get(cname)
        adv = MemoryAdvice(cname, n_runs, 0 if values is None else len(values),
                           current=wc.mem_per_node)
        out.append(adv)
        if n_runs == 0:
            adv.note = "no ended run of the class in the range"
            continue
        if values is None or len(values) < min_jobs:
            adv.note = (f"too few one-node runs with a measured MaxRSS ({adv.measured}, need "
                        f"{min_jobs}; jobacct_gather must be on and a run last one "
                        "JobAcctGatherFrequency): no default proposed")
            continue
        adv.p50_mib, adv.quantile_mib, adv.max_mib = _quantiles(values, quantile)
        want = max(MEM_STEP_MIB,
                   math.ceil(adv.quantile_mib * headroom / MEM_STEP_MIB) * MEM_STEP_MIB)
        allowed = (set(site.partitions[wc.partition].nodes) if wc.partition is not None
                   else None)
        sizes = [n.spec.memory for n in class_nodes(site.nodes, wc.devices, allowed)]
        if sizes and want > max(sizes):
            adv.note = (f"{want} MiB would exceed every node of the class (largest "
                        f"{max(sizes)} MiB): no default proposed")
            continue
        adv.proposed = want
    return out


def gpu_advice(jobs: Any, pj: Any, site: Site) -> list[GpuAdvice]:
    """GPUs per ended GPU run of each site class, and their mean utilization where sampled."""
    import numpy as np

    classes = site.sections.get("classes") or {}
    if not classes or jobs is None or len(jobs) == 0:
        return []
    j = jobs[jobs["state"].astype(str).isin(_ENDED) & (jobs["gpus"] > 0)]
    j = j.drop_duplicates("job_id", keep="last")
    out = []
    wclass = j["wclass"].astype(str).to_numpy()
    gpus = j["gpus"].to_numpy()
    job_ids = j["job_id"].to_numpy()
    util = (pj["mean_util_pct"].reindex(job_ids).to_numpy() if pj is not None and len(pj)
            else np.full(len(j), np.nan))
    for cname in sorted(classes):
        mask = wclass == cname
        if not mask.any():
            continue
        g = gpus[mask]
        u = util[mask]
        u = u[~np.isnan(u)]
        out.append(GpuAdvice(cname, int(mask.sum()), float(np.quantile(g, 0.5)),
                             float(np.quantile(g, 0.95)), int(g.max()), len(u),
                             round(float(u.mean()), 1) if len(u) else None))
    return out


def propose(jobs: Any, usage_of: Mapping[int, JobUsage], samples: Any, site: Site,
            site_text: str, site_label: str, req: AdviseRequest) -> Advice:
    """Everything proposed from one range of accounting (and samples), as one site text.

    Raises:
        ConfigError: a learned speed names a GPU model the site lacks, or the proposed site
            does not load (the loader's message); nothing is to be written then.
    """
    from hetslurm.audit.tables import per_job
    from hetslurm.policy.idle import prepare_samples
    from hetslurm.site.load import parse_site

    speeds = learn_speeds(jobs, model_order=site.scheduling.gpu_model_order,
                          min_jobs=max(2, req.min_jobs))
    rankings = rank_classes(speeds, site)
    adv = Advice(None, speeds.runs, speeds, rankings, notes=list(speeds.notes))
    cres = learn_classes(jobs, samples, site, since=req.since, until=req.until,
                         usage_of=usage_of, min_jobs=req.min_jobs, cpu_class=req.cpu_class)
    adv.classes = cres
    adv.notes += cres.problems
    adv.memory = memory_advice(jobs, usage_of, site, quantile=req.mem_quantile,
                               headroom=req.mem_headroom, min_jobs=req.min_mem_jobs)
    usage = site.sections.get("usage") or Usage()
    pj = prepared = None
    if samples is not None and len(samples):
        prepared = prepare_samples(samples, usage, req.since, req.until)
        pj = per_job(prepared)
    adv.gpus = gpu_advice(jobs, pj, site)
    _merge(adv, site, site_text, site_label, req, energy_inputs=(jobs, samples, prepared))
    if adv.site_text is not None:
        parse_site(adv.site_text, "<advised site>")
    return adv


def _merge(adv: Advice, site: Site, site_text: str, site_label: str,
           req: AdviseRequest, energy_inputs: tuple[Any, Any, Any] | None = None) -> None:
    try:
        data = tomllib.loads(site_text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{site_label}: not TOML: {exc}") from exc
    comments: dict[tuple[str, ...], list[str]] = {}

    def note(path: tuple[str, ...], *lines: str) -> None:
        comments.setdefault(path, []).extend(comment(t) for t in lines)

    for rk in adv.rankings:
        path = ("classes", rk.wclass)
        if rk.changed:
            data["classes"][rk.wclass]["devices"] = list(rk.proposed)
            adv.changes.append(f"classes.{rk.wclass}.devices: {', '.join(rk.site_order)} -> "
                               f"{', '.join(rk.proposed)}")
            note(path, f"advise: devices {', '.join(rk.site_order)} -> "
                 f"{', '.join(rk.proposed)}: a device moves ahead only where its 95% "
                 "interval lies wholly above another's", *(f"  {e}" for e in rk.evidence))
        else:
            note(path, f"advise: devices stay {', '.join(rk.site_order)} (no interval "
                 "separates a faster device from one listed before it)",
                 *(f"  {e}" for e in rk.evidence))
    for m in adv.memory:
        path = ("classes", m.wclass)
        if m.changed:
            data["classes"][m.wclass]["mem_per_node"] = m.proposed
            adv.changes.append(f"classes.{m.wclass}.mem_per_node: "
                               f"{m.current if m.current is not None else 'none'} -> "
                               f"{m.proposed} MiB")
            note(path, "advise: mem_per_node: the hook gives it to a job of the class that "
                 "asks for no memory", "  " + m.evidence(req.mem_quantile, req.mem_headroom))
        elif m.note and m.runs:
            note(path, f"advise: no mem_per_node: {m.note}")
    for g in adv.gpus:
        note(("classes", g.wclass), "advise: " + g.line())
    _merge_speeds(adv, site, data, note)
    _merge_classify(adv, data, note, req)
    if energy_inputs is not None:
        # Energy per unit of work with the speeds the proposed file will carry: the
        # measured ratios just merged, else the site's.
        speeds = site_speeds(_parsed(data) if adv.speed_table else site)
        adv.energy = energy_advice(*energy_inputs, site, speeds=speeds, since=req.since,
                                   until=req.until, min_jobs=req.min_jobs)
        merge_energy(adv.energy, site, data, note, adv.changes)
    if not adv.changes:
        return
    day = "%Y-%m-%d"
    span = (f"{time.strftime(day, time.localtime(req.since))} to "
            f"{time.strftime(day, time.localtime(req.until))}")
    head = [comment(f"{site_label} with the changes `hetslurm advise` proposes from "
                    f"{adv.runs} measured GPU runs ({span})."),
            comment("Written from the parsed file: its own comments are not kept. Review with "
                    "`hetslurm site diff`, then `site apply`; `site rollback` undoes it."),
            *(comment(f"  change: {c}") for c in adv.changes)]
    for k in ("schema_version", "name", "description"):
        if k in data:
            head.append(f"{k} = {toml_value(data.pop(k))}")
    lines: list[str] = []
    try:
        _toml_tables(data, (), lines, comments)
    except TypeError as exc:  # a TOML date or time: no site key holds one
        raise ConfigError(f"{site_label}: cannot write the proposed site: {exc}") from exc
    adv.site_text = "\n".join(head + lines) + "\n"


def _merge_speeds(adv: Advice, site: Site, data: dict[str, Any], note: Any) -> None:
    table, why = complete_speed_table(adv.speeds, site)
    levers = data.get("levers") if isinstance(data.get("levers"), dict) else None
    if why:
        adv.notes.append(f"[levers.speed] not proposed: {why}")
        return
    if levers is not None and levers.get("speed_table"):
        adv.notes.append("[levers.speed] not proposed: the site reads levers.speed_table")
        return
    old = (levers or {}).get("speed") or {}
    # The measured classes replace theirs; a class not measured keeps the site's ratios.
    merged = {m: dict(row) for m, row in old.items() if isinstance(row, dict)}
    for m, row in table.items():
        merged.setdefault(m, {}).update(row)
    if merged == old:
        return
    data.setdefault("levers", {})["speed"] = merged
    problem = _load_problem(data)
    if problem is not None:
        # E.g. a written gpu_model_order the measured speeds now contradict: the rest of
        # the advice stands, this part is left to the admin.
        if old:
            data["levers"]["speed"] = old
        else:
            del data["levers"]["speed"]
        adv.notes.append(f"[levers.speed] not proposed: the site with the measured ratios "
                         f"does not load: {problem}")
        return
    adv.speed_table = table
    adv.changes.append("levers.speed: measured ratios for "
                       + ", ".join(sorted({c for row in table.values() for c in row})))
    rows = {(r.wclass, r.model): r for r in adv.speeds.rows}
    for model, per in table.items():
        ev = []
        for c in per:
            r = rows.get((c, model))
            if r is not None:
                ev.append(f"  {shown(c)}: {r.ratio} (95% {r.ci_low}-{r.ci_high}, n={r.n}"
                          f"{', reference' if r.note == 'reference' else ''})")
        note(("levers", "speed", model), f"advise: measured speed of {model} per class "
             "(the reference model's run time over this model's)", *ev)


def _parsed(data: dict[str, Any]) -> Site:
    """The site ``data`` loaded (ConfigError or TypeError when it does not load)."""
    from hetslurm.site.load import parse_site

    lines: list[str] = []
    top = {k: v for k, v in data.items() if not isinstance(v, dict)}
    _toml_tables({k: v for k, v in data.items() if isinstance(v, dict)}, (), lines)
    return parse_site("\n".join(f"{k} = {toml_value(v)}" for k, v in top.items()) + "\n"
                      + "\n".join(lines) + "\n", "<advised site>")


def _load_problem(data: dict[str, Any]) -> str | None:
    """Why the site ``data`` would not load (the loader's message), or None."""
    try:
        _parsed(data)
    except (ConfigError, TypeError) as exc:
        return str(exc)
    return None


def _merge_classify(adv: Advice, data: dict[str, Any], note: Any,
                    req: AdviseRequest) -> None:
    cres = adv.classes
    if cres is None or not cres.proposed():
        return
    section = data.get("classify")
    if not isinstance(section, dict):
        section = {}
    rules = list(section.get("rules") or [])
    have = {(str(r.get("user")), str(r.get("name"))) for r in rules if isinstance(r, dict)}
    added = 0
    for r in cres.proposed():
        if (r.user, r.name) in have or r.wclass is None:
            continue
        rules.append({"user": r.user, "name": r.name, "class": r.wclass,
                      "evidence": r.evidence})
        added += 1
    if not added:
        return
    mode = section.get("mode") or req.classify_mode
    section = {"mode": mode, "rules": rules}
    data["classify"] = section
    adv.new_rules = added
    adv.changes.append(f"classify: {added} rule(s) for class {cres.cpu_class} (mode {mode})")
    note(("classify",), f"advise: {added} rule(s) added for recurring jobs whose runs never "
         f"used a GPU (at least {req.min_jobs} runs each; evidence in each rule)")


def read_inputs(req: AdviseRequest, site: Site, env: Mapping[str, str] | None
                ) -> tuple[Any, dict[int, JobUsage], Any, list[str], int]:
    """Accounting (read once: the jobs and what each used), script hashes where asked, and
    the store's samples: (jobs, usage_of, samples, notes, skipped records)."""
    from hetslurm.audit.run import AUDIT_COLUMNS
    from hetslurm.audit.sacct import read_accounting, sacct_result
    from hetslurm.metrics.store import SegmentStore, empty_frame
    from hetslurm.slurm.sacct import SacctDocumentError, parse_sacct_document
    from hetslurm.textfile import MAX_DATA_BYTES, read_file_bytes

    records: SacctRecords
    try:
        if req.sacct_file:
            records = parse_sacct_document(read_file_bytes(
                req.sacct_file, what="sacct JSON file", max_bytes=MAX_DATA_BYTES))
        else:
            records = read_accounting(env, req.since, req.until)
    except (MetricsError, SacctDocumentError) as exc:
        raise ConfigError(f"accounting could not be read: {exc}") from exc
    acct = sacct_result(records, site)
    jobs = acct.jobs
    notes = list(acct.problems)
    if req.use_scripts and jobs is not None and len(jobs):
        from hetslurm.audit.scripts import attach_hashes, default_cache_path, read_script_hashes
        from hetslurm.audit.speeds import jobs_for_scripts
        from hetslurm.slurm import get_backend

        reader = None if req.sacct_file else get_backend("cli", env)
        cache = Path(req.script_cache) if req.script_cache else default_cache_path()
        hashes = read_script_hashes(jobs_for_scripts(jobs, min_jobs=max(2, req.min_jobs)),
                                    reader, cache, limit=req.max_scripts)
        notes += hashes.notes
        jobs = attach_hashes(jobs, hashes)
    usage_of = usage_by_job(records)
    del records
    if req.store:
        # power_w: the measured watts of the energy advice (metrics.measured.gpu_watts).
        samples, report = SegmentStore.of_site(req.store, site).read(
            req.since, req.until, columns=(*AUDIT_COLUMNS, "power_w"))
        if report.partial:
            notes.append(f"{sum(report.refused.values())} segment(s) of the store refused")
    else:
        samples = empty_frame()
    return jobs, usage_of, samples, notes, acct.skipped


def advise(req: AdviseRequest, site: Site, site_text: str, site_label: str,
           env: Mapping[str, str] | None = None) -> Advice:
    """Read accounting once (and the store when given) and propose (:func:`propose`)."""
    jobs, usage_of, samples, notes, skipped = read_inputs(req, site, env)
    adv = propose(jobs, usage_of, samples, site, site_text, site_label, req)
    adv.notes = notes + adv.notes
    adv.skipped_records = skipped
    return adv
