"""Measured load to node ``Weight``: which weight each GPU node should carry now.

Pure judgement, no Slurm call and no file (``hetslurm.act.weights`` reads the store and
Slurm, and acts). The site renders one weight per model (``hetslurm.site.model``:
``class_weight``, 10 apart); measurement moves a node only within its model's **band**,
``site weight .. site weight + band`` with ``band`` at most 9, so bands of different models
never overlap and the model order classes and the site rely on never changes: a busy H100
node may go behind the other H100 nodes, never behind an A100 node.

The level of a node (0..band) follows the mean utilization of its GPUs over the window,
``round(band x util / 100)``, with two brakes against a flapping measurement:

* **hysteresis**: a node moves only when its new level differs from its current one by at
  least ``hysteresis`` levels (default 2), except a move back to level 0 when the load has
  fallen below ``release_util_pct`` (so a node returns to the site's weight);
* **hold**: a node that moved less than ``hold_s`` ago stays where it is.

Unknown never moves anything: a node with fewer than ``min_samples`` known samples (status
``ok``, a utilization) in the window, or none newer than ``stale_s``, keeps its weight and the
plan says why.

CPU-only nodes (``[weights] cpu_load = true``) have no device samples: their load is Slurm's
own reading, ``CPULoad`` (the load average slurmd reports) over the node's CPUs, as a
percentage capped at 100 (:func:`cpu_load_of`). It is one live reading, not a window of
samples, so ``min_samples`` and ``stale_s`` do not apply; hysteresis and hold do, and a node
Slurm gives no load for (not registered, down, not responding) is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetslurm.metrics.measured import node_usage
from hetslurm.site.model import WEIGHT_STEP

#: The widest band a model may get: one less than the step between the site's model
#: weights, so bands never meet.
MAX_BAND = WEIGHT_STEP - 1


@dataclass(frozen=True)
class WeightRules:
    """``[weights]`` as the judgement needs it (``hetslurm.site.schema.Weights``)."""

    band: int = 5
    window_s: float = 600.0
    min_samples: int = 3
    stale_s: float = 180.0
    hysteresis: int = 2
    release_util_pct: float = 20.0
    hold_s: float = 600.0
    #: CPU-only nodes move too, by Slurm's CPULoad.
    cpu_load: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.band <= MAX_BAND:
            raise ValueError(f"band must be 0..{MAX_BAND}, got {self.band}")


@dataclass(frozen=True)
class NodeLoad:
    """What the store said of one node over the window."""

    node: str
    samples: int  # known samples (status ok with a utilization)
    newest: float | None  # time of the newest known sample
    mean_util_pct: float | None
    #: ``store``: the collector's samples; ``cpuload``: Slurm's CPULoad, one live reading
    #: (``detail`` says what was read, or why nothing was).
    source: str = "store"
    detail: str | None = None


#: Node states in which slurmd's CPULoad is not a reading of now.
_NO_LOAD_STATES = frozenset({"DOWN", "NOT_RESPONDING", "FUTURE", "UNKNOWN", "POWERED_DOWN",
                             "POWER_DOWN"})


def cpu_load_of(node: str, cpu_load: float | None, cpus: int,
                state: frozenset[str]) -> NodeLoad:
    """A CPU-only node's load from Slurm's ``CPULoad`` over its ``cpus``."""
    bad = sorted(state & _NO_LOAD_STATES)
    if bad:
        return NodeLoad(node, 0, None, None, "cpuload",
                        f"node is {'+'.join(bad)}: its CPULoad is not a reading of now")
    if cpu_load is None or cpus <= 0:
        return NodeLoad(node, 0, None, None, "cpuload", "Slurm shows no CPULoad for it")
    return NodeLoad(node, 1, None, min(100.0, 100.0 * cpu_load / cpus), "cpuload",
                    f"CPULoad {cpu_load:g} on {cpus} CPUs")


@dataclass(frozen=True)
class WeightDecision:
    """One GPU node: its site weight, the weight it carries now, the one it should carry.

    ``action``: ``set`` (write ``target``), ``keep`` (nothing to do), ``reassert`` (the live
    weight is not the one hetslurm last wrote: a reconfigure or restart reset it; write
    ``target`` again) or ``unknown`` (no usable measurement: nothing moves).
    """

    node: str
    model: str
    site_weight: int
    live_weight: int
    last_written: int | None
    target: int
    level: int | None
    mean_util_pct: float | None
    action: str
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "model": self.model, "site_weight": self.site_weight,
                "live_weight": self.live_weight, "last_written": self.last_written,
                "target": self.target, "level": self.level,
                "mean_util_pct": None if self.mean_util_pct is None
                else round(self.mean_util_pct, 1),
                "action": self.action, "why": self.why}


def node_loads(samples: Any, nodes: Mapping[str, str], *, since: float,
               now: float) -> dict[str, NodeLoad]:
    """Per GPU node (``nodes``: name -> model), its usable samples in ``[since, now]``
    (:func:`hetslurm.metrics.measured.node_usage`, the placement score's reading too)."""
    out = {n: NodeLoad(n, 0, None, None) for n in nodes}
    if samples is None or not len(samples):
        return out
    for node, u in node_usage(samples, now=now, window_s=now - since).items():
        if node in out:
            out[node] = NodeLoad(node, u.samples, u.newest, u.mean_pct)
    return out


def decide(node: str, model: str, site_weight: int, live_weight: int,
           last_written: int | None, last_change: float | None, load: NodeLoad,
           rules: WeightRules, now: float) -> WeightDecision:
    """The weight one node should carry (see the module's rules)."""
    # The level the node carries now: what hetslurm last wrote, else the live weight read
    # as a level when it lies inside the band (a weight outside the band is the site's).
    current = last_written if last_written is not None else live_weight
    cur_level = current - site_weight if 0 <= current - site_weight <= rules.band else 0

    def out(target: int, level: int | None, action: str, why: str) -> WeightDecision:
        if action in ("keep", "unknown") and last_written is not None \
                and live_weight != last_written:
            action = "reassert"
            why += (f"; the live weight {live_weight} is not the {last_written} hetslurm "
                    "last wrote (a reconfigure or restart reset it): written again")
            target = last_written
        return WeightDecision(node, model, site_weight, live_weight, last_written, target,
                              level, load.mean_util_pct, action, why)

    if load.source == "cpuload":
        if load.mean_util_pct is None:
            return out(current, None, "unknown", f"{load.detail}: nothing moves")
    elif load.samples < rules.min_samples or load.mean_util_pct is None:
        return out(current, None, "unknown",
                   f"{load.samples} known sample(s) in the window, {rules.min_samples} needed: "
                   "nothing moves")
    elif load.newest is None or now - load.newest > rules.stale_s:
        age = "none" if load.newest is None else f"{now - load.newest:.0f} s old"
        return out(current, None, "unknown",
                   f"newest sample {age} (stale after {rules.stale_s:.0f} s): nothing moves")
    util = min(max(load.mean_util_pct, 0.0), 100.0)
    level = math.floor(rules.band * util / 100.0 + 0.5)
    releasing = level == 0 and cur_level != 0 and util < rules.release_util_pct
    if abs(level - cur_level) < rules.hysteresis and not releasing:
        return out(site_weight + cur_level, level, "keep",
                   f"mean utilization {util:.0f}% gives level {level}, within {rules.hysteresis}"
                   f" of the current {cur_level}")
    if last_change is not None and now - last_change < rules.hold_s:
        return out(site_weight + cur_level, level, "keep",
                   f"level {level} wanted, but the node moved {now - last_change:.0f} s ago "
                   f"(hold {rules.hold_s:.0f} s)")
    target = site_weight + level
    if target == live_weight and last_written == target:
        return out(target, level, "keep", f"already at {target}")
    measured = (f"{load.detail} ({util:.0f}%)" if load.source == "cpuload"
                else f"mean utilization {util:.0f}% over the window")
    return out(target, level, "set",
               f"{measured}: level {level} of {rules.band}, weight {target} "
               f"(site {site_weight})")
