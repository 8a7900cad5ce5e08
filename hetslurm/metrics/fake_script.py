"""Scripting the fake NVML by Slurm GPU index: what ``hetslurm testbed fake`` does.

A target is ``NODE`` (every GPU of the node) or ``NODE/INDEX`` with INDEX Slurm's GPU index
on the node, turned into the device minor through gres.conf ``File=`` the way the collector
does (:func:`~hetslurm.metrics.gres.minors_by_index`), never by position. Settings are
``key=value`` words or the bare word ``clear``; they are all checked before the scenario is
written, so bad input leaves it unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetslurm.errors import MetricsError
from hetslurm.metrics import gres as gres_mod
from hetslurm.metrics.fake_nvml import Scenario, device_state, scenario_for_devices
from hetslurm.metrics.gres import GresDevice, MinorOf, load_gres_conf, minors_by_index
from hetslurm.metrics.samples import THROTTLE_REASONS

#: Command-line key -> (scenario key, kind). ``power_w`` and ``xid`` are appended as timed
#: steps/events so that the energy counter integrates the power and each XID is seen once.
KEYS: dict[str, tuple[str, str]] = {
    "util": ("utilization", "pct"),
    "mem_used_mib": ("memory_used_mib", "amount"),
    "power_w": ("power_w", "amount"),
    "throttle": ("throttle", "reason"),
    "ecc_uncorrectable": ("ecc_uncorrectable", "count"),
    "xid": ("xid", "code"),
    "lost": ("lost", "flag"),
    "hang": ("hang", "flag"),
}
CLEAR = "clear"
#: ``throttle=none`` removes a scripted throttle reason.
NO_THROTTLE = "none"


@dataclass(frozen=True)
class FakeChange:
    """One ``testbed fake`` call, parsed: the target and what to set."""

    node: str
    index: int | None  # None: every GPU of the node
    clear: bool = False
    values: dict[str, Any] = field(default_factory=dict)  # command-line key -> checked value


def parse_change(target: str, settings: Sequence[str]) -> FakeChange:
    """Parse ``NODE[/INDEX]`` and ``key=value``/``clear`` words (no gres.conf needed yet).

    Raises:
        MetricsError: A malformed target, an unknown key, a value of the wrong kind.
    """
    node, sep, idx = target.partition("/")
    if not node:
        raise MetricsError(f"'{target}' is not NODE or NODE/INDEX")
    index: int | None = None
    if sep:
        if not idx.isdigit():
            raise MetricsError(f"'{target}': the GPU index after '/' must be a number "
                               "(Slurm's GPU index on the node)")
        index = int(idx)
    clear = False
    values: dict[str, Any] = {}
    if not settings:
        raise MetricsError(f"nothing to set on {target}: give key=value ({', '.join(KEYS)}) "
                           f"or '{CLEAR}'")
    for word in settings:
        if word == CLEAR:
            clear = True
            continue
        key, eq, raw = word.partition("=")
        if not eq:
            raise MetricsError(f"'{word}' is not key=value or '{CLEAR}'")
        if key not in KEYS:
            raise MetricsError(f"unknown key '{key}' (keys: {', '.join(KEYS)})")
        values[key] = _value(key, KEYS[key][1], raw)
    return FakeChange(node, index, clear, values)


def _value(key: str, kind: str, raw: str) -> Any:
    if kind == "reason":
        if raw == NO_THROTTLE or raw in THROTTLE_REASONS:
            return raw
        raise MetricsError(f"throttle={raw}: not a throttle reason (one of "
                           f"{', '.join(THROTTLE_REASONS)}, or {NO_THROTTLE})")
    try:
        number = float(raw) if kind in ("pct", "amount") else int(raw)
    except ValueError:
        what = "a number" if kind in ("pct", "amount") else "a whole number"
        raise MetricsError(f"{key}={raw}: not {what}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise MetricsError(f"{key}={raw}: not a finite number")
    if number < 0:
        raise MetricsError(f"{key}={raw}: must not be negative")
    if kind == "pct" and number > 100:
        raise MetricsError(f"{key}={raw}: a percentage is at most 100")
    if kind == "flag" and number not in (0, 1):
        raise MetricsError(f"{key}={raw}: 0 or 1")
    if kind == "code" and number == 0:
        raise MetricsError(f"{key}={raw}: XID codes start at 1")
    return number


def target_minors(gres: Mapping[str, list[GresDevice]], node: str, index: int | None,
                  minor_of: MinorOf) -> dict[int, int]:
    """Slurm index -> device minor of the target's GPUs (gres.conf ``File=`` -> minor).

    Raises:
        MetricsError: The node has no GPU in gres.conf, or the index is out of range, or
            its device file is not a character device.
    """
    devices = gres.get(node)
    if not devices:
        known = ", ".join(sorted(gres)) or "none"
        raise MetricsError(f"unknown node '{node}': gres.conf lists GPUs on {known}")
    if index is not None and not 0 <= index < len(devices):
        raise MetricsError(f"{node}/{index}: index out of range ({node} has GPU indices "
                           f"0-{len(devices) - 1})")
    minors = minors_by_index(devices, minor_of)
    wanted = [index] if index is not None else [d.index for d in devices]
    unread = [i for i in wanted if i not in minors]
    if unread:
        raise MetricsError(f"{node}: no device minor for GPU index "
                           f"{','.join(map(str, unread))} (its gres.conf File= is not a "
                           "character device)")
    return {i: minors[i] for i in wanted}


def apply_change(sc: Scenario, change: FakeChange, minors: Mapping[int, int],
                 now: float) -> None:
    """Script each target device in ``sc`` (in memory) at wall time ``now``."""
    offset = now - sc.start
    for minor in minors.values():
        key = f"{change.node}/{minor}"
        if change.clear:
            sc.gpus.pop(key, None)
        g = sc.gpus.setdefault(key, {})
        for cli_key, value in change.values.items():
            name, kind = KEYS[cli_key]
            if cli_key == "power_w":
                # A step at `offset`, so energy integrates what was scripted before it.
                old = g.get("power_w")
                steps = [[0.0, float(old)]] if isinstance(old, int | float) else list(old or [])
                g["power_w"] = [*steps, [offset, value]]
            elif cli_key == "xid":
                old_x = g.get("xid")
                events = [[0.0, int(old_x)]] if isinstance(old_x, int | float) else list(
                    old_x or [])
                g["xid"] = [*events, [offset, value]]
            elif cli_key == "throttle" and value == NO_THROTTLE:
                g.pop("throttle", None)
            elif kind == "flag":
                if value:
                    g[name] = 1
                else:
                    g.pop(name, None)
            else:
                g[name] = value
        if not g:
            sc.gpus.pop(key, None)


def _gres(gres_conf: str | Path) -> dict[str, list[GresDevice]]:
    return load_gres_conf(gres_conf)


def _minor_of(minor_of: MinorOf | None) -> MinorOf:
    # Looked up when called, so a test can stand in for the character devices.
    return minor_of if minor_of is not None else gres_mod.device_minor


def set_fake(scenario: str | Path, gres_conf: str | Path, target: str,
             settings: Sequence[str], *, minor_of: MinorOf | None = None,
             clock: Callable[[], float] = time.time) -> dict[int, int]:
    """Parse, check and apply one ``testbed fake`` call to the scenario file (rewritten
    atomically only when everything checked). Returns the Slurm index -> minor changed."""
    change = parse_change(target, settings)
    sc = Scenario.load(scenario)
    minors = target_minors(_gres(gres_conf), change.node, change.index, _minor_of(minor_of))
    missing = [m for m in minors.values()
               if m not in [int(x) for x in sc.nodes.get(change.node, {}).get("minors", [])]]
    if missing:
        raise MetricsError(f"the fake NVML scenario {scenario} has no device minor "
                           f"{','.join(map(str, missing))} on {change.node}; it was made for "
                           "another gres.conf")
    apply_change(sc, change, minors, clock())
    sc.save(scenario)
    return minors


def new_scenario(gres_conf: str | Path, out: str | Path, *, minor_of: MinorOf | None = None,
                 now: float | None = None, seed: int = 7) -> Scenario:
    """A scenario with every GPU gres.conf names (minors from the device files), saved."""
    of = _minor_of(minor_of)
    devices = {n: [(m, d.model or "") for d in ds if (m := of(d.path)) is not None]
               for n, ds in _gres(gres_conf).items()}
    sc = scenario_for_devices(devices, seed=seed, start=time.time() if now is None else now)
    sc.save(out)
    return sc


#: The columns of :func:`list_fake`, in order (``--format json`` keys).
LIST_COLUMNS = ("node", "slurm_index", "minor", "status", "util", "mem_used_mib", "power_w",
                "energy_j", "throttle", "ecc_uncorrectable", "xid", "lost", "hang")


def list_fake(scenario: str | Path, gres_conf: str | Path, *, minor_of: MinorOf | None = None,
              clock: Callable[[], float] = time.time) -> list[dict[str, Any]]:
    """What every fake GPU of gres.conf reports now, by node and Slurm index (``xid``: the
    last XID scripted, which a collector reports once)."""
    sc = Scenario.load(scenario)
    offset = clock() - sc.start
    of = _minor_of(minor_of)
    rows: list[dict[str, Any]] = []
    for node, devices in sorted(_gres(gres_conf).items()):
        known = {int(x) for x in sc.nodes.get(node, {}).get("minors", [])}
        for index, minor in sorted(minors_by_index(devices, of).items()):
            if minor not in known:
                continue
            d = device_state(sc, node, minor, offset)
            g = sc.gpus.get(f"{node}/{minor}", {})
            rows.append(dict(zip(LIST_COLUMNS, (
                node, index, minor, d.status, d.utilization_pct, d.memory_used_mib,
                d.power_w, None if d.energy_j is None else round(d.energy_j, 3),
                d.throttle_reasons, d.ecc_uncorrectable, d.xid, int(bool(g.get("lost"))),
                int(d.hang)), strict=True)))
    return rows
