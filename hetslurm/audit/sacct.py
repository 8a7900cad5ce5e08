"""Jobs from ``sacct --json`` (Slurm 22.05, ``openapi/dbv0.0.38``) as one DataFrame.

sacct keeps a job's GPU *count* (``gres/gpu``, and ``gres/gpu:<model>`` only when the job
asked for a model by name) but never which GPU indices it had: those come from the
collector's samples. A job that asked for "any of" several models is recorded untyped, so
its model is taken from its node list and the site.

The parser streams the ``jobs`` array one record at a time, so a million-job document does
not become a million nested dicts at once; a record that is not a usable job is skipped and
counted, never fatal.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hetslurm.errors import HetslurmError, MetricsError
from hetslurm.site.model import Site
from hetslurm.slurm.run import run_command
from hetslurm.slurm.units import expand_hostlist

SACCT_TIMEOUT_S = 600.0
_WS = re.compile(r"[ \t\n\r]*")
JOB_COLUMNS = ("job_id", "run", "name", "user", "account", "partition", "state", "submit",
               "eligible", "start", "end", "elapsed", "nodes", "gpus", "gpu_model",
               "typed", "constraints", "comment", "admin_comment", "wclass")


@dataclass
class SacctResult:
    """Jobs (one row per run: ``--duplicates`` gives requeued jobs one row per start)."""

    jobs: Any  # pandas.DataFrame with JOB_COLUMNS
    records: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.skipped > 0


def run_sacct(env: Mapping[str, str] | None, since: float, until: float) -> str:
    """``sacct --json`` for every user and every run in the range (text, unparsed)."""

    def iso(t: float) -> str:
        return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")  # sacct: local time

    argv = ["sacct", "--json", "--allusers", "--duplicates", "-S", iso(since), "-E", iso(until)]
    try:
        return run_command(argv, timeout=SACCT_TIMEOUT_S, env=env).stdout
    except HetslurmError as exc:
        raise MetricsError(f"sacct failed: {exc}") from exc


def _skip(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def iter_sacct_jobs(text: str) -> Iterator[Any]:
    """Yield each element of the top-level ``jobs`` array of a sacct JSON document."""
    dec = json.JSONDecoder()
    try:
        i = _skip(text, 0)
        if text[i:i + 1] != "{":
            raise MetricsError("sacct output is not a JSON object (does this sacct speak "
                               "--json? it needs Slurm 21.08 or later)")
        i = _skip(text, i + 1)
        found = False
        while text[i:i + 1] != "}":
            key, i = dec.raw_decode(text, i)
            i = _skip(text, i)
            if text[i:i + 1] != ":":
                raise MetricsError(f"sacct output is malformed near character {i}")
            i = _skip(text, i + 1)
            if key == "jobs" and text[i:i + 1] == "[":
                found = True
                i = _skip(text, i + 1)
                while text[i:i + 1] != "]":
                    obj, i = dec.raw_decode(text, i)
                    yield obj
                    i = _skip(text, i)
                    if text[i:i + 1] == ",":
                        i = _skip(text, i + 1)
                i += 1
            else:
                _, i = dec.raw_decode(text, i)
            i = _skip(text, i)
            if text[i:i + 1] == ",":
                i = _skip(text, i + 1)
            if i >= len(text):
                raise MetricsError("sacct output ends in the middle of the document")
        if not found:
            raise MetricsError("sacct output has no 'jobs' array")
    except json.JSONDecodeError as exc:
        raise MetricsError(f"sacct output is not valid JSON: {exc.msg} at character "
                           f"{exc.pos}") from exc
    except IndexError as exc:
        raise MetricsError("sacct output ends in the middle of the document") from exc


def _num(value: Any) -> int | float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    if value is None:
        return 0
    raise ValueError(f"not a number: {value!r}")


_CLASS_RE = re.compile(r"(?:^|[\s;,])class=([A-Za-z0-9_-]+)")


class ModelResolver:
    """A job's GPU model: its typed gres, else the models of its nodes in the site."""

    def __init__(self, site: Site | None) -> None:
        self.node_model: dict[str, str] = {}
        if site is not None:
            for n in site.nodes:
                if n.gpus:
                    self.node_model[n.name] = n.gpus[0].model
        self._cache: dict[str, str | None] = {}

    def from_nodes(self, nodes: str | None) -> str | None:
        if not nodes:
            return None
        if nodes not in self._cache:
            models = {self.node_model.get(n) for n in expand_hostlist(nodes)}
            models.discard(None)
            self._cache[nodes] = (models.pop() if len(models) == 1 else
                                  ("mixed" if models else None))
        return self._cache[nodes]


def job_class(site: Site | None, partition: str | None, *texts: str | None) -> str:
    """The workload class: ``class=X`` written by the hook, else the partition's class."""
    for t in texts:
        if t:
            m = _CLASS_RE.search(t)
            if m:
                return m.group(1)
    if site is not None and partition:
        classes = site.sections.get("classes", {})
        names = [c for c, wc in classes.items() if wc.partition == partition]
        if len(names) == 1:
            return str(names[0])
    return ""


def parse_sacct_json(text: str, site: Site | None = None) -> SacctResult:
    """Parse sacct's JSON into :class:`SacctResult` (streaming; bad records skipped)."""
    import pandas as pd

    rows: list[tuple[Any, ...]] = []
    add = rows.append
    resolver = ModelResolver(site)
    class_of: dict[tuple[str, str, str], str] = {}
    runs: dict[int, int] = {}
    res = SacctResult(jobs=None)
    for rec in iter_sacct_jobs(text):
        res.records += 1
        try:
            row = _job_row(rec, resolver, site, class_of)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            res.skipped += 1
            if len(res.problems) < 20:
                res.problems.append(f"sacct record {res.records} skipped: {exc!r}")
            continue
        jid = row[0]
        run = runs.get(jid, 0)
        runs[jid] = run + 1
        add(row if run == 0 else (jid, run, *row[2:]))
    frame = pd.DataFrame.from_records(rows, columns=list(JOB_COLUMNS), nrows=len(rows))
    del rows
    for c in ("submit", "eligible", "start", "end", "elapsed"):
        col = pd.to_numeric(frame[c], errors="coerce").astype("float64")
        # sacct --json writes 0 for "not yet" (no start, no end).
        frame[c] = col.where(col > 0) if c != "elapsed" else col
    frame["job_id"] = frame["job_id"].astype("int64")
    frame["gpus"] = frame["gpus"].astype("int64")
    for c in ("user", "account", "partition", "state", "gpu_model", "wclass"):
        frame[c] = frame[c].astype("category")
    res.jobs = frame
    return res


def _job_row(rec: Mapping[str, Any], resolver: ModelResolver, site: Site | None,
             class_of: dict[tuple[str, str, str], str]) -> tuple[Any, ...]:
    t = rec["time"]
    gpus = 0
    typed: str | None = None
    for tres in (rec.get("tres") or {}).get("allocated") or []:
        if tres.get("type") != "gres":
            continue
        name = tres.get("name") or ""
        count = int(tres.get("count") or 0)
        if name == "gpu":
            gpus = count
        elif name.startswith("gpu:"):
            typed = name.split(":", 1)[1]
    nodes = rec.get("nodes") or ""
    if nodes in ("None assigned", "(null)"):
        nodes = ""
    model = typed or resolver.from_nodes(nodes) if gpus else None
    comment = rec.get("comment") or {}
    partition = rec.get("partition") or ""
    admin, jcomment = comment.get("administrator") or "", comment.get("job") or ""
    ckey = (partition, admin, jcomment)
    if ckey not in class_of:
        class_of[ckey] = job_class(site, partition, admin, jcomment)
    # In JOB_COLUMNS order; times stay raw here (0 = "not yet") and become NaN in bulk.
    return (int(rec["job_id"]), 0, str(rec.get("name") or ""), str(rec.get("user") or ""),
            str(rec.get("account") or ""), partition,
            str((rec.get("state") or {}).get("current") or ""),
            _num(t.get("submission")), _num(t.get("eligible")), _num(t.get("start")),
            _num(t.get("end")), _num(t.get("elapsed")), nodes, gpus, model or "",
            typed is not None, str(rec.get("constraints") or ""), str(jcomment), str(admin),
            class_of[ckey])


def now_epoch() -> float:
    return datetime.now(UTC).timestamp()
