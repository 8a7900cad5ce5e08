"""Measured energy in ``hetslurm advise`` (issue 23 item 4; docs/learn.md, "Energy").

Two proposals, each from figures other modules already compute (one source of truth):

* ``[hook] energy_low_models``, the models ``energy=low`` narrows to: from the audit's
  energy per unit of work (:func:`hetslurm.audit.energy.energy_per_work`, Wh per reference
  GPU-hour = NVML energy of covered GPU-time over the site's speed). **Rule**: only when
  every GPU model of the site has a figure from at least ``min_jobs`` jobs with covered
  energy; then the models within :data:`ENERGY_LOW_WITHIN` of the lowest figure, in the
  site's model order. A model with no figure cannot be called dear, so a partial
  measurement proposes nothing and says which models lack one.
* the energy lever's watts (``power_busy_watts`` / ``power_idle_watts`` of each node
  class's GPUs, which :func:`hetslurm.site.levers.device_scores` ranks models by): the
  placement score's measured watts (:func:`hetslurm.metrics.measured.gpu_watts`, mean
  ``power_w`` of busy and of idle samples), over the advised range, with the site's
  ``[placement] energy_min_samples``. A model with too few samples keeps the site file's.

Every figure is labelled with its source (``measured`` or ``site file``) in the JSON output,
in the notes and in the proposed file's comments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetslurm.audit.energy import ALL_CLASSES, energy_per_work, energy_tables, site_speeds
from hetslurm.metrics.measured import ModelWatts, gpu_watts
from hetslurm.site.model import Site
from hetslurm.site.schema import HookPolicy, PlacementSection, Usage

#: A model is "low energy" when its Wh per reference GPU-hour is at most this much above the
#: lowest measured (10 %: within the spread of a month's mix of jobs).
ENERGY_LOW_WITHIN = 0.10


@dataclass
class WattsFigure:
    """One GPU model's watts for the lever and where they came from."""

    model: str
    source: str  # "measured" or "site file"
    busy_w: float | None
    idle_w: float | None
    site_busy_w: float | None
    site_idle_w: float | None
    busy_samples: int = 0
    idle_samples: int = 0
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "source": self.source, "busy_w": self.busy_w,
                "idle_w": self.idle_w, "site_busy_w": self.site_busy_w,
                "site_idle_w": self.site_idle_w, "busy_samples": self.busy_samples,
                "idle_samples": self.idle_samples, "note": self.note}


@dataclass
class EnergyAdvice:
    """What advise proposes from measured energy, and the figures behind it."""

    per_work: Any = None  # DataFrame: energy_per_work rows of class "*"
    #: Per model: Wh per reference GPU-hour and jobs with covered energy, where measured.
    figures: dict[str, tuple[float, int]] = field(default_factory=dict)
    current_low: tuple[str, ...] = ()
    proposed_low: tuple[str, ...] | None = None
    low_note: str = ""
    watts: list[WattsFigure] = field(default_factory=list)

    @property
    def low_changed(self) -> bool:
        return self.proposed_low is not None and self.proposed_low != self.current_low

    def to_dict(self) -> dict[str, Any]:
        from hetslurm.audit.tables import records

        return {"per_work": records(self.per_work) if self.per_work is not None else [],
                "energy_low_models": {
                    "current": list(self.current_low),
                    "proposed": (list(self.proposed_low) if self.proposed_low is not None
                                 else None),
                    "changed": self.low_changed,
                    "rule": f"models within {ENERGY_LOW_WITHIN:.0%} of the lowest measured "
                            "Wh per reference GPU-hour, when every GPU model is measured",
                    "note": self.low_note},
                "watts": [w.to_dict() for w in self.watts]}


def _site_watts(site: Site) -> dict[str, tuple[float | None, float | None]]:
    out: dict[str, tuple[float | None, float | None]] = {}
    for spec in site.node_classes.values():
        if spec.gpus is not None:
            out.setdefault(spec.gpus.model, (spec.gpus.power_busy_watts,
                                             spec.gpus.power_idle_watts))
    return out


def energy_advice(jobs: Any, samples: Any, prepared: Any, site: Site, *,
                  speeds: dict[str, dict[str, float]] | None = None, since: float,
                  until: float, min_jobs: int) -> EnergyAdvice:
    """The measured figures and what they propose (see the module's rules).

    Args:
        speeds: :func:`hetslurm.audit.energy.site_speeds` of the site the proposal will
            be (advise's measured ratios when it proposes them); default: ``site``'s.
        jobs: accounting (:func:`hetslurm.audit.sacct.sacct_result`'s frame).
        samples: the store's samples over the range, raw (``power_w`` for the watts).
        prepared: the same after :func:`hetslurm.policy.idle.prepare_samples`, or None.
    """
    from hetslurm.policy.idle import prepare_jobs

    speeds = site_speeds(site) if speeds is None else speeds
    hook: HookPolicy = site.sections.get("hook") or HookPolicy()
    models = tuple(site.gpu_models())
    out = EnergyAdvice(current_low=tuple(m for m in models if m in hook.energy_low_models))
    usage: Usage = site.sections.get("usage") or Usage()
    conf: PlacementSection = site.sections.get("placement") or PlacementSection()
    measured: dict[str, ModelWatts] = {}
    if samples is not None and len(samples) and "power_w" in samples:
        measured = gpu_watts(samples, now=until, window_s=max(until - since, 1e-3),
                             busy_pct=float(usage.busy_threshold_pct),
                             idle_pct=float(usage.idle_threshold_pct),
                             min_samples=conf.energy_min_samples)
    for model, (busy, idle) in _site_watts(site).items():
        w = measured.get(model)
        if w is None:
            out.watts.append(WattsFigure(model, "site file", busy, idle, busy, idle, note=(
                f"not measured: fewer than {conf.energy_min_samples} busy and idle samples "
                "with a power reading in the range")))
        else:
            out.watts.append(WattsFigure(model, "measured", float(w.busy_w), float(w.idle_w),
                                         busy, idle, w.busy_samples, w.idle_samples))
    if prepared is None or jobs is None or len(jobs) == 0 or not len(prepared):
        out.low_note = "no samples or no jobs in the range: energy_low_models not proposed"
        return out
    per_job, _ = energy_tables(prepare_jobs(jobs, since, until, until), prepared)
    work = energy_per_work(per_job, speeds)
    out.per_work = work[work["class"] == ALL_CLASSES].reset_index(drop=True)
    covered = per_job[per_job["covered_gpu_hours"] > 0].groupby("gpu_model").size()
    for row in out.per_work.itertuples(index=False):
        value = row.wh_per_ref_gpu_hour
        if isinstance(value, float) and math.isfinite(value):
            out.figures[str(row.gpu_model)] = (float(value), int(covered.get(row.gpu_model, 0)))
    if not speeds:
        out.low_note = ("the site file has no speeds ([levers] speed): no energy per unit of "
                        "work, energy_low_models not proposed")
        return out
    lacking = [m for m in models if out.figures.get(m, (0.0, 0))[1] < min_jobs]
    if lacking:
        out.low_note = (f"energy_low_models not proposed: no measured energy per unit of work "
                        f"from {min_jobs} or more jobs for {', '.join(lacking)} (a model "
                        "not measured cannot be called dear)")
        return out
    low = min(out.figures[m][0] for m in models)
    out.proposed_low = tuple(m for m in models
                             if out.figures[m][0] <= low * (1 + ENERGY_LOW_WITHIN))
    return out


def merge_energy(adv: EnergyAdvice, site: Site, data: dict[str, Any],
                 note: Callable[..., None], changes: list[str]) -> None:
    """Write the proposals into the parsed site ``data``, with their evidence as comments
    (``note(path, *lines)``) and one line per change in ``changes``."""
    evidence = [f"  {m}: {v:.1f} Wh per reference GPU-hour from {n} jobs"
                for m, (v, n) in sorted(adv.figures.items())]
    if adv.low_changed:
        assert adv.proposed_low is not None
        data.setdefault("hook", {})["energy_low_models"] = list(adv.proposed_low)
        changes.append(f"hook.energy_low_models: {', '.join(adv.current_low) or 'none'} -> "
                       f"{', '.join(adv.proposed_low)} (measured energy per unit of work)")
        note(("hook",), "advise: energy_low_models from measured energy per unit of work "
             f"(models within {ENERGY_LOW_WITHIN:.0%} of the lowest):", *evidence)
    by_model = {w.model: w for w in adv.watts}
    for cname, spec in site.node_classes.items():
        if spec.gpus is None or cname not in data.get("node_classes", {}):
            continue
        w = by_model.get(spec.gpus.model)
        if w is None:
            continue
        path = ("node_classes", cname, "gpus")
        if w.source != "measured":
            note(path, f"advise: watts of {w.model} from the site file ({w.note})")
            continue
        table = data["node_classes"][cname].setdefault("gpus", {})
        before = (table.get("power_busy_watts"), table.get("power_idle_watts"))
        table["power_busy_watts"] = w.busy_w
        table["power_idle_watts"] = w.idle_w
        if before != (w.busy_w, w.idle_w):
            changes.append(f"node_classes.{cname}.gpus power_busy_watts/power_idle_watts: "
                           f"{_w(before[0])}/{_w(before[1])} -> {_w(w.busy_w)}/{_w(w.idle_w)}"
                           " (measured)")
        note(path, f"advise: watts of {w.model} measured: busy {_w(w.busy_w)} over "
             f"{w.busy_samples} samples, idle {_w(w.idle_w)} over {w.idle_samples} samples "
             f"(site file had {_w(w.site_busy_w)} / {_w(w.site_idle_w)})")


def _w(v: Any) -> str:
    return "none" if v is None else f"{float(v):g} W"


def energy_notes(adv: EnergyAdvice) -> list[str]:
    """One line per figure for the CLI's stderr: which came from measurement, which from
    the site file."""
    lines = [f"energy: {m}: {v:.1f} Wh per reference GPU-hour (measured, {n} jobs)"
             for m, (v, n) in sorted(adv.figures.items())]
    for w in adv.watts:
        if w.source == "measured":
            lines.append(f"energy: {w.model} watts busy {_w(w.busy_w)}, idle {_w(w.idle_w)} "
                         f"(measured; site file: {_w(w.site_busy_w)}, {_w(w.site_idle_w)})")
        else:
            lines.append(f"energy: {w.model} watts busy {_w(w.busy_w)}, idle {_w(w.idle_w)} "
                         f"(site file; {w.note})")
    if adv.low_note:
        lines.append(f"energy: {adv.low_note}")
    elif adv.proposed_low is not None:
        lines.append("energy: energy_low_models "
                     + (f"{', '.join(adv.current_low) or 'none'} -> " if adv.low_changed
                        else "stay ")
                     + ", ".join(adv.proposed_low) + " (measured)")
    return lines
