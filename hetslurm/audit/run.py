"""One audit end to end: read accounting and samples, compute the tables, mark gaps.

Nothing here raises for bad input that still leaves something to report: a failing or
garbled sacct, refused segments or an empty range become ``meta.partial`` and
``meta.problems``; the tables hold what could be computed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetslurm.audit.sacct import (
    JOB_COLUMNS,
    SacctResult,
    parse_sacct_json,
    read_accounting,
    sacct_result,
)
from hetslurm.audit.tables import AuditResult, audit
from hetslurm.errors import MetricsError
from hetslurm.metrics.store import Progress, SegmentStore
from hetslurm.site.model import Site
from hetslurm.site.schema import Usage
from hetslurm.textfile import MAX_DATA_BYTES, read_file_bytes

#: The sample columns the audit uses (the store reads only these).
AUDIT_COLUMNS = ("time", "node", "minor", "slurm_index", "gpu_model", "job_id", "job_gpus",
                 "utilization_pct", "memory_used_mib", "status", "interval_s", "attributed",
                 "clock_jump", "energy_j")


@dataclass(frozen=True)
class AuditRequest:
    """What ``hetslurm audit`` was asked (the CLI's options as one typed object)."""

    since: float
    until: float
    store: str | None = None
    prometheus: str | None = None
    sacct_file: str | None = None
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    models: tuple[str, ...] = ()


def empty_jobs() -> Any:
    import pandas as pd

    types = dict.fromkeys(("submit", "eligible", "start", "end", "elapsed"), "float64")
    types.update(job_id="int64", gpus="int64", run="int64")
    return pd.DataFrame({c: pd.Series(dtype=types.get(c, "object")) for c in JOB_COLUMNS})


def load_jobs(req: AuditRequest, site: Site | None, env: Mapping[str, str] | None
              ) -> tuple[SacctResult | None, str | None]:
    """Jobs from a sacct JSON file or a live ``sacct``; (None, why) when neither works."""
    try:
        if req.sacct_file:
            # A file the user named that cannot be read is a usage error (ConfigError), not
            # "accounting unavailable"; what it holds is judged like sacct's own output.
            text = read_file_bytes(req.sacct_file, what="sacct JSON file",
                                   max_bytes=MAX_DATA_BYTES)
            return parse_sacct_json(text, site), None
        return sacct_result(read_accounting(env, req.since, req.until), site), None
    except MetricsError as exc:
        return None, str(exc)


def run_audit(req: AuditRequest, site: Site | None, *, env: Mapping[str, str] | None = None,
              usage: Usage | None = None, progress: Progress | None = None,
              now: float | None = None) -> AuditResult:
    from hetslurm.metrics.store import empty_frame

    now = time.time() if now is None else now
    problems: list[str] = []
    partial = False
    sacct, why = load_jobs(req, site, env)
    if sacct is None:
        problems.append(f"accounting unavailable, job tables are empty: {why}")
        partial = True
        jobs = empty_jobs()
    else:
        jobs = sacct.jobs
        problems += sacct.problems
        partial |= sacct.partial
    store_report: dict[str, Any] | None = None
    if req.prometheus:
        from hetslurm.metrics.promread import read_prometheus

        try:
            samples = read_prometheus(req.prometheus, req.since, req.until)
        except MetricsError as exc:
            problems.append(f"samples unavailable: {exc}")
            partial = True
            samples = empty_frame()
    elif req.store:
        samples, report = SegmentStore.of_site(req.store, site).read(
            req.since, req.until, progress=progress, columns=AUDIT_COLUMNS)
        store_report = report.to_dict()
        if report.partial:
            partial = True
            problems.append(f"{sum(report.refused.values())} segment(s) refused: "
                            + ", ".join(f"{k} {v}" for k, v in report.refused.items() if v))
    else:
        samples = empty_frame()
        problems.append("no metrics store or Prometheus given: utilization tables are empty")
    _release_arrow_memory()
    jobs = _filter(jobs, req)
    result = audit(jobs, samples, site, since=req.since, until=req.until, now=now, usage=usage)
    result.meta["problems"] = problems + result.meta["problems"]
    result.meta["partial"] = partial
    result.meta["store"] = store_report
    result.meta["sacct_records"] = sacct.records if sacct else 0
    result.meta["sacct_skipped"] = sacct.skipped if sacct else 0
    return result


def _release_arrow_memory() -> None:
    """Hand back what Arrow's allocator keeps after reading: it caches freed buffers for
    reuse, and reading ten million samples leaves hundreds of MB cached that the tables,
    computed with numpy and pandas, never reuse."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def _filter(jobs: Any, req: AuditRequest) -> Any:
    out = jobs
    for col, wanted in (("user", req.users), ("account", req.accounts),
                        ("partition", req.partitions), ("gpu_model", req.models)):
        if wanted:
            out = out[out[col].astype(str).isin(wanted)]
    return out
