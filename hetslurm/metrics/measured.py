"""Measured inputs of the placement score: per-node load and per-model GPU watts from samples.

The score's ``load`` and ``energy`` terms (docs/placement.md, "The score") can read what the
collector measured instead of what Slurm allocated and what the site file says a device
draws. The two pure functions here turn a sample frame (the store's columns: ``node``,
``slurm_index``, ``gpu_model``, ``utilization_pct``, ``power_w``, ``status``, ``time``) into
those inputs; :func:`read_measured` reads the frame from the store.

Unknown is never guessed high: a sample whose status is not ``ok`` or that lacks the reading
is dropped, a node with no usable sample in the window (stale, unknown, or CPU-only: no GPU
samples at all) gets load 0, and a model with too few samples keeps the site's watts.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hetslurm.metrics.samples import STATUS_OK

if TYPE_CHECKING:
    from hetslurm.site.model import Site

#: Columns :func:`node_load_milli` and :func:`gpu_watts` read.
LOAD_COLUMNS = ("node", "slurm_index", "utilization_pct", "status", "time")
WATTS_COLUMNS = ("gpu_model", "utilization_pct", "power_w", "status", "time")


@dataclass(frozen=True)
class ModelWatts:
    """Measured watts of one GPU of a model: mean ``power_w`` of its idle and busy samples."""

    idle_w: int
    busy_w: int
    idle_samples: int
    busy_samples: int


def _usable(frame: Any, value: str, now: float, window_s: float) -> Any:
    """Samples in ``[now - window_s, now]`` with status ok and a reading of ``value``."""
    t = frame["time"]
    keep = ((t >= now - window_s) & (t <= now) & (frame["status"].astype(str) == STATUS_OK)
            & frame[value].notna())
    return frame.loc[keep]


def node_load_milli(frame: Any, names: Sequence[str], *, now: float,
                    window_s: float) -> npt.NDArray[np.int32]:
    """Each node's measured load, per mille: the mean over its GPUs of each GPU's mean
    utilization in the window ``[now - window_s, now]``, times 10, rounded.

    Args:
        frame: GPU samples (pandas DataFrame with :data:`LOAD_COLUMNS`).
        names: Node names; the result is aligned with them.
        now: End of the window (epoch seconds; the state's time). Samples after it are
            ignored (a clock ahead is not "recent").
        window_s: Window length, seconds (> 0).

    Returns:
        shape (len(names),), int32 in 0..1000. 0 where nothing usable was measured: a
        CPU-only node, a node whose samples are all older than the window (stale), or whose
        samples are all unknown (status other than ``ok``, no utilization).
    """
    out = np.zeros(len(names), dtype=np.int32)
    if not names:
        return out
    where = {n: i for i, n in enumerate(names)}
    for node, u in node_usage(frame, now=now, window_s=window_s).items():
        i = where.get(node)
        if i is not None:
            out[i] = int(min(1000, max(0, round(u.mean_pct * 10))))
    return out


@dataclass(frozen=True)
class NodeUsage:
    """One node's usable GPU samples in a window: the mean over its GPUs of each GPU's
    mean utilization, how many samples, and the newest one's time."""

    mean_pct: float
    samples: int
    newest: float


def node_usage(frame: Any, *, now: float, window_s: float) -> dict[str, NodeUsage]:
    """Per node with at least one usable sample (status ok, a utilization, a Slurm index)
    in ``[now - window_s, now]``: :class:`NodeUsage`. The one reading of "how busy is a
    node" that the placement score (:func:`node_load_milli`) and the rebalance weights
    (:mod:`hetslurm.policy.weights`) share."""
    if len(frame) == 0:
        return {}
    use = _usable(frame, "utilization_pct", now, window_s)
    use = use.loc[use["slurm_index"].notna()]
    if use.empty:
        return {}
    use = use.assign(node=use["node"].astype(str))
    per_gpu = use.groupby(["node", "slurm_index"], observed=True, sort=False)[
        "utilization_pct"].mean()
    per_node = per_gpu.groupby(level=0, sort=False).mean()
    g = use.groupby("node", observed=True, sort=False)
    counts, newest = g.size(), g["time"].max()
    return {str(n): NodeUsage(float(per_node[n]), int(counts[n]), float(newest[n]))
            for n in per_node.index}


def gpu_watts(frame: Any, *, now: float, window_s: float, busy_pct: float, idle_pct: float,
              min_samples: int) -> dict[str, ModelWatts]:
    """Per GPU model, the mean ``power_w`` of busy samples (utilization >= ``busy_pct``) and
    of idle ones (< ``idle_pct``) in ``[now - window_s, now]``.

    A model is listed only when it has at least ``min_samples`` of each (else the caller
    keeps the site's figures); unknown samples (status other than ``ok``, no power or no
    utilization) are dropped.
    """
    out: dict[str, ModelWatts] = {}
    if len(frame) == 0:
        return out
    use = _usable(frame, "power_w", now, window_s)
    use = use.loc[use["utilization_pct"].notna() & use["gpu_model"].notna()]
    util = use["utilization_pct"]
    for name, rows in use.groupby(use["gpu_model"].astype(str), sort=True):
        busy = rows.loc[util.loc[rows.index] >= busy_pct, "power_w"]
        idle = rows.loc[util.loc[rows.index] < idle_pct, "power_w"]
        if len(busy) < min_samples or len(idle) < min_samples:
            continue
        out[str(name)] = ModelWatts(idle_w=round(float(idle.mean())),
                                    busy_w=round(float(busy.mean())),
                                    idle_samples=len(idle), busy_samples=len(busy))
    return out


@dataclass
class Measured:
    """What :func:`read_measured` found: the inputs and a summary for the output."""

    load_milli: npt.NDArray[np.int32] | None = None
    watts: dict[str, ModelWatts] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)


def read_measured(site: Site, names: Sequence[str], *, now: float | None = None,
                  load: bool = True, energy: bool = False,
                  store_root: str | None = None) -> Measured:
    """Read the site's metrics store (``[collector] store``) for the inputs asked.

    Windows and counts come from ``[placement]``, busy/idle thresholds from ``[usage]``.
    A store that does not exist yields nothing measured (load 0, the site's watts).

    Raises:
        PermissionsError: The store's folders are unsafe (see :mod:`hetslurm.metrics.store`).
    """
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.site.schema import Collector, PlacementSection, Usage

    now = time.time() if now is None else now
    conf: PlacementSection = site.sections.get("placement") or PlacementSection()
    usage: Usage = site.sections.get("usage") or Usage()
    collector: Collector = site.sections.get("collector") or Collector()
    root = store_root or collector.store
    store = SegmentStore.of_site(root, site)
    out = Measured(summary={"store": root})
    if load:
        frame, report = store.read(since=now - conf.load_window_s, until=now + 1e-3,
                                   columns=list(LOAD_COLUMNS))
        out.load_milli = node_load_milli(frame, names, now=now, window_s=conf.load_window_s)
        out.summary["load"] = {
            "window_s": conf.load_window_s, "samples": report.samples,
            "partial": report.partial,
            "nodes_measured": int((out.load_milli > 0).sum()),
            "by_node": {n: int(v) for n, v in zip(names, out.load_milli, strict=True) if v},
        }
    if energy:
        frame, report = store.read(since=now - conf.energy_window_s, until=now + 1e-3,
                                   columns=list(WATTS_COLUMNS))
        out.watts = gpu_watts(frame, now=now, window_s=conf.energy_window_s,
                              busy_pct=float(usage.busy_threshold_pct),
                              idle_pct=float(usage.idle_threshold_pct),
                              min_samples=conf.energy_min_samples)
        out.summary["energy"] = {
            "window_s": conf.energy_window_s, "samples": report.samples,
            "partial": report.partial, "min_samples": conf.energy_min_samples,
            "models": {m: {"idle_w": w.idle_w, "busy_w": w.busy_w,
                           "idle_samples": w.idle_samples, "busy_samples": w.busy_samples}
                       for m, w in out.watts.items()},
        }
    return out


def watts_pairs(watts: Mapping[str, ModelWatts]) -> dict[str, tuple[int, int]]:
    """``{model: (idle_w, busy_w)}`` for ``ClusterModel.with_gpu_watts``."""
    return {m: (w.idle_w, w.busy_w) for m, w in watts.items()}
