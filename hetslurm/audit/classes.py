"""Classes from history (``hetslurm learn classes``, issue 22).

For each recurring job (same user and job name) the runs in the range say, through the
classification rule of :mod:`hetslurm.policy.classify`, whether it ever used its GPUs (the
collector's samples of its job ids); accounting adds CPU time and IO as evidence shown to the
user. A job whose runs never used a GPU gets a proposed rule for the site's CPU class; the
rules become a ``[classify]`` section (:func:`classify_section`) that the site file takes,
and ``hetslurm hook install`` renders them into the hook as a lookup table.

Bad input gives rows saying why, never a rule: too few runs with evidence, a job name the
hook cannot key on (control characters, longer than the schema allows), an empty user or
name, a site without a CPU class.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetslurm.audit.tables import per_job
from hetslurm.policy.classify import cpu_classes, infer, run_gpu_use
from hetslurm.policy.idle import prepare_samples
from hetslurm.request.record import find_record
from hetslurm.site.hook_rules import hook_policy
from hetslurm.site.model import Site
from hetslurm.site.schema import MAX_CLASSIFY_NAME, Usage
from hetslurm.slurm.sacct import JobUsage, SacctRecordError, SacctRecords

CLASS_COLUMNS = ("user", "name", "runs", "with_evidence", "gpu_runs", "idle_runs",
                 "used_runs", "max_util_pct", "max_memory_mib", "cpu_cores_avg", "io_mib",
                 "declared", "class", "evidence", "note")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
#: Run states that ended (a running or pending run says nothing yet).
_ENDED = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "OUT_OF_MEMORY",
                    "NODE_FAIL", "PREEMPTED", "DEADLINE", "BOOT_FAIL"})


@dataclass
class ClassRow:
    user: str
    name: str
    runs: int = 0
    with_evidence: int = 0
    gpu_runs: int = 0
    idle_runs: int = 0
    used_runs: int = 0
    max_util_pct: float | None = None
    max_memory_mib: float | None = None
    cpu_cores_avg: float | None = None
    io_mib: float | None = None
    declared: str = ""
    wclass: str | None = None
    evidence: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "name": self.name, "runs": self.runs,
                "with_evidence": self.with_evidence, "gpu_runs": self.gpu_runs,
                "idle_runs": self.idle_runs, "used_runs": self.used_runs,
                "max_util_pct": self.max_util_pct, "max_memory_mib": self.max_memory_mib,
                "cpu_cores_avg": self.cpu_cores_avg, "io_mib": self.io_mib,
                "declared": self.declared, "class": self.wclass, "evidence": self.evidence,
                "note": self.note}


@dataclass
class ClassResult:
    rows: list[ClassRow] = field(default_factory=list)
    #: The CPU class rules point to (None: the site has none, nothing is proposed).
    cpu_class: str | None = None
    runs: int = 0
    left_out: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def proposed(self) -> list[ClassRow]:
        return [r for r in self.rows if r.wclass is not None]


def name_problem(text: str) -> str | None:
    """Why a user or job name cannot key a rule, or None."""
    if not text:
        return "empty"
    if _CONTROL.search(text):
        return "holds control characters"
    if len(text) > MAX_CLASSIFY_NAME:
        return f"longer than {MAX_CLASSIFY_NAME} characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "not valid text"
    return None


def learn_classes(jobs: Any, samples: Any, site: Site, *, since: float, until: float,
                  usage_of: Mapping[int, JobUsage] | None = None, min_jobs: int = 3,
                  cpu_class: str | None = None, usage: Usage | None = None) -> ClassResult:
    """Per recurring job (user, job name): the runs' evidence and the proposed class.

    Args:
        jobs: sacct's jobs (:func:`hetslurm.audit.sacct.sacct_result`).
        samples: the collector's samples in the range (the audit's columns).
        site: the site (its classes, ``[usage]`` thresholds, record field).
        usage_of: CPU time and IO per job id from accounting (evidence shown, not judged).
        min_jobs: fewest runs with evidence for a rule.
        cpu_class: the CPU class to propose (default: the site's only one).
    """
    usage = usage or site.sections.get("usage") or Usage()
    res = ClassResult()
    choices = cpu_classes(site)
    if cpu_class is not None:
        if cpu_class not in choices:
            res.problems.append(f"'{cpu_class}' is not a CPU class of the site (CPU classes: "
                                f"{', '.join(choices) or 'none'}): nothing proposed")
        else:
            res.cpu_class = cpu_class
    elif len(choices) == 1:
        res.cpu_class = choices[0]
    elif not choices:
        res.problems.append("the site has no CPU class (a class with devices = [\"cpu\"]): "
                            "nothing proposed")
    else:
        res.problems.append(f"the site has several CPU classes ({', '.join(choices)}): "
                            "choose one with --cpu-class; nothing proposed")
    if jobs is None or len(jobs) == 0:
        return res
    s = prepare_samples(samples, usage, since, until)
    pj = per_job(s)
    policy = hook_policy(site)
    ended = jobs["state"].astype(str).isin(_ENDED)
    res.left_out["not ended"] = int((~ended).sum())
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    bad_names: dict[str, int] = {}
    for row in jobs[ended].to_dict("records"):
        user, name = str(row["user"] or ""), str(row["name"] or "")
        problem = name_problem(user) or name_problem(name)
        if problem:
            bad_names[problem] = bad_names.get(problem, 0) + 1
            continue
        groups.setdefault((user, name), []).append(row)
    for problem, n in sorted(bad_names.items()):
        res.left_out[f"user or job name {problem}"] = n
    for (user, name), runs in sorted(groups.items()):
        res.rows.append(_row(user, name, runs, pj, usage, usage_of or {}, policy.record_field,
                             policy.record_key, res.cpu_class, min_jobs))
        res.runs += len(runs)
    return res


def _row(user: str, name: str, runs: list[dict[str, Any]], pj: Any, usage: Usage,
         usage_of: Mapping[int, JobUsage], record_field: str, record_key: str,
         cpu_class: str | None, min_jobs: int) -> ClassRow:
    out = ClassRow(user, name, runs=len(runs))
    uses: list[str] = []
    declared: set[str] = set()
    cpu_s = elapsed = io = 0.0
    have_cpu = have_io = False
    utils: list[float] = []
    mems: list[float] = []
    for r in runs:
        jid, gpus = int(r["job_id"]), int(r["gpus"] or 0)
        ev = pj.loc[jid] if jid in pj.index else None
        util = mem = known = None
        if ev is not None:
            util, mem = _num(ev["max_util_pct"]), _num(ev["max_memory_mib"])
            known = float(ev["sampled_gpu_hours"]) - float(ev["unknown_gpu_hours"])
        use = run_gpu_use(gpus, util, mem, known, usage)
        uses.append(use)
        if gpus > 0:
            out.gpu_runs += 1
            if util is not None:
                utils.append(util)
            if mem is not None:
                mems.append(mem)
        text = r.get(record_field) if record_field != "none" else None
        rec = find_record(str(text) if text else None, record_key)
        if rec is not None and rec.declared_class:
            declared.add(rec.declared_class)
        u = usage_of.get(jid)
        if u is not None:
            have_cpu = True
            cpu_s += u.cpu_s
            elapsed += float(r["elapsed"] or 0)
            if u.disk_read_bytes is not None or u.disk_write_bytes is not None:
                have_io = True
                io += ((u.disk_read_bytes or 0) + (u.disk_write_bytes or 0)) / 2**20
    out.with_evidence = sum(1 for u in uses if u != "unknown")
    out.idle_runs = uses.count("idle")
    out.used_runs = uses.count("used")
    out.max_util_pct = round(max(utils), 1) if utils else None
    out.max_memory_mib = round(max(mems), 1) if mems else None
    out.cpu_cores_avg = round(cpu_s / elapsed, 3) if have_cpu and elapsed > 0 else None
    out.io_mib = round(io, 1) if have_io else None
    out.declared = ",".join(sorted(declared))
    verdict = infer(uses, cpu_class, min_jobs=min_jobs)
    out.note = verdict.note
    if verdict.wclass is not None:
        out.wclass = verdict.wclass
        out.evidence = _evidence(out)
    return out


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def _evidence(r: ClassRow) -> str:
    parts = [f"{r.with_evidence} runs"]
    if r.gpu_runs:
        parts.append(f"{r.gpu_runs} held GPUs, max util {r.max_util_pct or 0:.0f}%")
        if r.max_memory_mib is not None:
            parts.append(f"max GPU mem {r.max_memory_mib:.0f} MiB")
    else:
        parts.append("no GPU held")
    if r.cpu_cores_avg is not None:
        parts.append(f"{r.cpu_cores_avg:.2f} CPU cores avg")
    if r.io_mib is not None:
        parts.append(f"IO {r.io_mib:.0f} MiB")
    return ", ".join(parts)[:200]


def usage_by_job(records: SacctRecords) -> dict[int, JobUsage]:
    """CPU time and IO per job id from accounting (records of another shape left out; a
    requeued job's last record wins)."""
    out: dict[int, JobUsage] = {}
    for raw in records.raws:
        try:
            u = records.usage(raw)
        except SacctRecordError:
            continue
        out[u.job_id] = u
    return out


def _toml_string(s: str) -> str:
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def classify_section(result: ClassResult, *, mode: str = "suggest", source: str = "") -> str:
    """A proposed ``[classify]`` section (TOML) holding the proposed rules."""
    lines = ["# Proposed by `hetslurm learn classes`" + (f" from {source}" if source else "")
             + ".",
             "# Review, then merge into the site file and `hetslurm hook install` (modes: off,",
             "# suggest: the hook tells the user; apply: the hook applies the class).", "",
             "[classify]", f"mode = {_toml_string(mode)}", "rules = ["]
    for r in result.proposed():
        assert r.wclass is not None
        lines.append(f"  {{ user = {_toml_string(r.user)}, name = {_toml_string(r.name)}, "
                     f"class = {_toml_string(r.wclass)}, "
                     f"evidence = {_toml_string(r.evidence)} }},")
    lines.append("]")
    return "\n".join(lines) + "\n"
