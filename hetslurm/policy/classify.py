"""Classification from evidence: which class a job's runs say it belongs to (issue 22).

Shared by ``hetslurm learn classes`` (:mod:`hetslurm.audit.classes`, which proposes the
site's ``[classify]`` rules from history) and the audit's agreement table
(:func:`hetslurm.audit.tables.class_agreement`), so the class the audit checks a declared
class against is the class ``learn`` would propose from the same evidence.

The rule, per run (one sacct record and the collector's samples of its job id), with the
site's ``[usage]`` idle thresholds (:mod:`hetslurm.policy.idle`):

* ``none``: the run held no GPU;
* ``idle``: it held GPUs and every known sample stayed below ``idle_threshold_pct`` (and
  below ``idle_memory_mib`` when the site sets it): it never used them;
* ``used``: some known sample reached the threshold;
* ``unknown``: it held GPUs but no sample of it is known (no collector, MIG, lost GPU):
  never counted as idle.

A recurring job (same user and job name) whose runs with evidence are all ``none`` or
``idle``, at least ``min_jobs`` of them, belongs to the site's CPU class (a class whose
devices are ``["cpu"]``). Runs that used their GPUs say "a GPU class" but not which one, so
no rule is proposed for them. CPU time and IO from accounting are reported beside the
verdict (they explain it to the user) but do not change it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from hetslurm.site.model import Site
from hetslurm.site.schema import Usage

USES = ("none", "idle", "used", "unknown")


def run_gpu_use(gpus: int, max_util_pct: float | None, max_memory_mib: float | None,
                known_hours: float | None, usage: Usage) -> str:
    """``none``, ``idle``, ``used`` or ``unknown`` for one run (see the module)."""
    if gpus <= 0:
        return "none"
    if not known_hours or known_hours <= 0 or max_util_pct is None or _nan(max_util_pct):
        return "unknown"
    if max_util_pct >= usage.idle_threshold_pct:
        return "used"
    if usage.idle_memory_mib is not None and (
            max_memory_mib is None or _nan(max_memory_mib)
            or max_memory_mib >= usage.idle_memory_mib):
        return "used"
    return "idle"


def _nan(v: float) -> bool:
    return isinstance(v, float) and math.isnan(v)


def cpu_classes(site: Site | None) -> list[str]:
    """The site's CPU classes (devices ``["cpu"]``), in name order."""
    if site is None:
        return []
    classes = site.sections.get("classes") or {}
    return sorted(n for n, wc in classes.items() if tuple(wc.devices) == ("cpu",))


@dataclass(frozen=True)
class Inference:
    """What the runs of one job say: ``kind`` ``cpu`` (never used a GPU), ``gpu`` (used
    one) or None (not enough evidence); ``wclass`` the class for ``cpu`` (None when the site
    has no CPU class); ``note`` why, in a few words."""

    kind: str | None
    wclass: str | None
    note: str


def infer(uses: Sequence[str], cpu_class: str | None, *, min_jobs: int = 1) -> Inference:
    """The class the runs' GPU use (:func:`run_gpu_use` of each) points to."""
    known = [u for u in uses if u != "unknown"]
    if len(known) < min_jobs:
        return Inference(None, None, f"too few runs with evidence ({len(known)} < {min_jobs})")
    used = sum(1 for u in known if u == "used")
    if used:
        return Inference("gpu", None, f"{used} of {len(known)} runs used their GPUs")
    if cpu_class is None:
        return Inference("cpu", None, "no run used a GPU, but the site has no CPU class "
                         "(a class with devices = [\"cpu\"])")
    return Inference("cpu", cpu_class, f"no run of {len(known)} used a GPU")
