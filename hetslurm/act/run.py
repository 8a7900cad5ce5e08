"""One ``requeue-stalled`` run end to end: samples from the store, plan, and with ``apply``
the lock, the action log and the actions."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetslurm.act.lock import RunLock
from hetslurm.act.log import ActionLog
from hetslurm.act.stall import RunResult, execute, plan
from hetslurm.policy.stall import Context, OutputProbe, SiteModels
from hetslurm.site.model import Site
from hetslurm.site.schema import Stall, Usage
from hetslurm.slurm.backend import SlurmBackend

#: The sample columns the stall decision reads.
STALL_COLUMNS = ("time", "node", "minor", "slurm_index", "job_id", "utilization_pct",
                 "memory_used_mib", "status", "interval_s")


@dataclass(frozen=True)
class StallRequest:
    """What ``hetslurm act requeue-stalled`` was asked."""

    apply: bool = False
    store: str | None = None
    action_log: str | None = None
    lock_file: str | None = None


def context_for(site: Site | None) -> Context:
    """The policy, thresholds, decision-record field, GPU models (for downgrades) and the
    hook's ``scontrol update`` rule of ``site`` (defaults, and no downgrades, without one)."""
    if site is None:
        return Context(stall=Stall(), usage=Usage())
    from hetslurm.policy.idle import interval_cap

    hook = site.sections.get("hook")
    return Context(stall=site.sections.get("stall") or Stall(),
                   usage=site.sections.get("usage") or Usage(),
                   record_field=getattr(hook, "record_field", "admin_comment"),
                   record_key=getattr(hook, "record_key", "hetslurm"),
                   models=SiteModels.from_site(site),
                   modify_exempt_uids=tuple(getattr(hook, "modify_exempt_uids", (0,))),
                   max_interval_s=interval_cap(site))


def read_samples(store: str | None, site: Site | None, since: float, until: float, *,
                 columns: Sequence[str] = STALL_COLUMNS, cache: str | None = None
                 ) -> tuple[Any, list[str]]:
    """Samples of the window from the store; refusals become problems (fewer samples can
    only make a job look less idle: unknown is never idle). ``cache``: the path of a read
    cache (:mod:`hetslurm.metrics.window_cache`) for a read that recurs."""
    from hetslurm.metrics.store import SegmentStore, empty_frame
    from hetslurm.metrics.window_cache import WindowCache

    if not store or not Path(store).is_dir():
        return empty_frame(), [f"no metrics store at {store!r}: no job can be judged idle"]
    cols = list(dict.fromkeys(["time", "node", *columns]))
    wc = WindowCache(cache, store, cols) if cache else None
    frame, report = SegmentStore.of_site(store, site).read(since, until, columns=cols,
                                                           cache=wc)
    problems = list(report.problems) if wc is not None and not report.partial else []
    if report.partial:
        problems.append(f"{sum(report.refused.values())} segment(s) refused")
        problems.extend(p for p in report.problems if p.startswith("read cache"))
    return frame, problems


def requeue_stalled(backend: SlurmBackend, req: StallRequest, *, site: Site | None = None,
                    samples: Any = None, now: float | None = None,
                    output_probe: OutputProbe | None = None,
                    env: Mapping[str, str] | None = None,
                    context: Context | None = None) -> RunResult:
    """Plan (and with ``req.apply`` carry out) one run; see :mod:`hetslurm.act.stall`.

    ``samples`` given (tests) skips the store. A dry run takes no lock and writes nothing;
    it reads the action log, so its table shows which jobs are already warned.
    ``context`` replaces the policy taken from ``site``.
    Raises :class:`hetslurm.act.LockBusy` when another applying run holds the lock.
    """
    ctx = context or context_for(site)
    now = time.time() if now is None else now
    problems: list[str] = []
    log = ActionLog(req.action_log or ctx.stall.action_log)
    log.check()
    if samples is None:
        store = req.store
        if store is None and site is not None and site.sections.get("collector") is not None:
            store = site.sections["collector"].store
        samples, problems = read_samples(store, site, now - ctx.window_s, now)
    if not req.apply:
        decisions = plan(backend, samples, ctx, now=now, log=log, output_probe=output_probe)
        return RunResult(decisions, problems=problems + _log_problems(log))
    with RunLock(req.lock_file or ctx.stall.lock_file):
        decisions = plan(backend, samples, ctx, now=now, log=log, output_probe=output_probe)
        problems += _log_problems(log)
        outcomes = execute(backend, decisions, ctx, log, now=now, output_probe=output_probe,
                           env=env)
    return RunResult(decisions, outcomes, applied=True, problems=problems)


def _log_problems(log: ActionLog) -> list[str]:
    """The lines the last read of ``log`` skipped, as one problem (empty: none)."""
    text = log.skipped_text()
    return [text] if text else []
