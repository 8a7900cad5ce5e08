"""A fake NVML for tests and the demo, selected by ``[collector] nvml = "fake"``.

It imports nothing of NVML. A *scenario* (JSON) says which devices each emulated node has
(their minor numbers, as the testbed's device files have them) and what each one reads over
time. NVML's enumeration order and the UUIDs are shuffled with a seed, so code that maps a
Slurm index to an NVML device by position, by name or by UUID order gets it wrong here.

Scenario file::

    {
      "seed": 7,
      "start": 1796000000.0,              # timeline offsets count from here
      "default_utilization": 0,
      "nodes": {"gpu1": {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
                         "minors": [135, 134, 133, 132, 131, 130, 129, 128]}},
      "gpus": {"gpu1/131": {"utilization": [[0, 90], [30, 5]],   # or a number
                            "memory_used_mib": 20000, "power_w": [[0, 450], [90, 120]],
                            "throttle": "hw_slowdown", "ecc_uncorrectable": 2,
                            "xid": [[45, 79]], "lost": 0, "hang": 0,
                            "fault": "lost", "fault_from": 60}}  # not_supported|lost|mig|missing
    }

``utilization``, ``memory_used_mib`` and ``power_w`` are a number or a step function
``[[offset, value], ...]``; the energy counter is the integral of ``power_w`` since ``start``
(joules), so it grows with the power scripted. ``throttle`` is one name of
:data:`~hetslurm.metrics.samples.THROTTLE_REASONS` (unset: none active), ``ecc_uncorrectable``
a count, ``xid`` a code or a list of ``[offset, code]`` events (each is reported once, by the
first read at or after it), ``lost`` 1 makes the device lost and ``hang`` 1 makes every read
of its node block until the key is cleared (a hung driver, for the collector's timeout).
``hetslurm testbed fake`` edits these keys by Slurm GPU index (:mod:`fake_script`).

The file is re-read when it changes, so a running collector follows a script that a test or
the demo rewrites while jobs run.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import uuid as uuid_mod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetslurm.errors import MetricsError
from hetslurm.metrics.nvml import NvmlSource
from hetslurm.metrics.samples import (
    STATUS_LOST,
    STATUS_MIG,
    STATUS_MISSING,
    STATUS_NOT_SUPPORTED,
    STATUS_OK,
    THROTTLE_REASONS,
    GpuReading,
)
from hetslurm.textfile import read_text_file

FAULTS = ("not_supported", "lost", "mig", "missing")
#: The status of a device scripted with a fault that still reads (lost and missing do not).
_FAULT_STATUS = {"mig": STATUS_MIG, "not_supported": STATUS_NOT_SUPPORTED}
#: What the fake calls each site model (NVML's device names).
MODEL_NAMES = {"h100": ("NVIDIA H100 80GB HBM3", 81559.0),
               "a100": ("NVIDIA A100-SXM4-40GB", 40960.0)}


@dataclass
class Scenario:
    """A scenario in memory; :meth:`save` writes it atomically."""

    seed: int = 7
    start: float = 0.0
    default_utilization: float = 0.0
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpus: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> Scenario:
        text = read_text_file(path, what="fake NVML scenario")
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise MetricsError(f"fake NVML scenario {path} cannot be read: {exc}") from exc
        if not isinstance(raw, dict):
            raise MetricsError(f"fake NVML scenario {path} is not a JSON object")
        unknown = set(raw) - {"seed", "start", "default_utilization", "nodes", "gpus"}
        if unknown:
            raise MetricsError(f"fake NVML scenario {path}: unknown keys {sorted(unknown)}")
        sc = cls(seed=int(raw.get("seed", 7)), start=float(raw.get("start", 0.0)),
                 default_utilization=float(raw.get("default_utilization", 0.0)),
                 nodes=dict(raw.get("nodes", {})), gpus=dict(raw.get("gpus", {})))
        for key, g in sc.gpus.items():
            if g.get("fault") is not None and g["fault"] not in FAULTS:
                raise MetricsError(f"fake NVML scenario {path}: gpus.{key}.fault must be one "
                                   f"of {', '.join(FAULTS)}")
            if g.get("throttle") is not None and g["throttle"] not in THROTTLE_REASONS:
                raise MetricsError(f"fake NVML scenario {path}: gpus.{key}.throttle must be "
                                   f"one of {', '.join(THROTTLE_REASONS)}")
        return sc

    def save(self, path: str | Path) -> None:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"seed": self.seed, "start": self.start,
                       "default_utilization": self.default_utilization,
                       "nodes": self.nodes, "gpus": self.gpus}, fh, indent=1, sort_keys=True)
        os.replace(tmp, p)

    def set_gpu(self, node: str, minor: int, **values: Any) -> None:
        """Script one device: ``utilization`` (number or [[offset, pct], ...]),
        ``memory_used_mib``, ``power_w``, ``throttle``, ``ecc_uncorrectable``, ``xid``,
        ``lost``, ``hang``, ``fault``, ``fault_from`` (see the module docstring)."""
        self.gpus.setdefault(f"{node}/{minor}", {}).update(values)

    def hangs(self, node: str) -> bool:
        """Whether a device of ``node`` is scripted to hang its reads."""
        return any(key.split("/", 1)[0] == node and bool(g.get("hang"))
                   for key, g in self.gpus.items())


def scenario_for_devices(devices: Mapping[str, Iterable[tuple[int, str]]], *, seed: int = 7,
                         start: float = 0.0) -> Scenario:
    """A scenario whose nodes have exactly the given devices: node -> [(minor, model)]."""
    sc = Scenario(seed=seed, start=start)
    for node, devs in devices.items():
        devs = list(devs)
        model = devs[0][1] if devs else ""
        name, total = MODEL_NAMES.get(model, (f"NVIDIA {model.upper()}", 16384.0))
        sc.nodes[node] = {"name": name, "memory_total_mib": total,
                          "minors": [m for m, _ in devs]}
    return sc


def _value_at(spec: Any, offset: float, default: float) -> float:
    if spec is None:
        return default
    if isinstance(spec, int | float):
        return float(spec)
    value = default
    for at, v in spec:  # a step function: the last point at or before `offset`
        if float(at) <= offset:
            value = float(v)
    return value


def _integral(spec: Any, offset: float) -> float:
    """The integral of a number or step function over ``[0, offset]`` (0 before its first
    point): joules from watts."""
    if isinstance(spec, int | float):
        return float(spec) * max(offset, 0.0)
    total, level, since = 0.0, 0.0, 0.0
    for at, v in sorted((float(a), float(v)) for a, v in spec):
        at = max(at, 0.0)
        if at >= offset:
            break
        total += level * (at - since)
        level, since = v, at
    return total + level * max(offset - since, 0.0)


def _events(spec: Any) -> list[tuple[float, int]]:
    """An ``xid`` key as sorted ``(offset, code)`` events (a bare code happens at 0)."""
    if spec is None:
        return []
    if isinstance(spec, int | float):
        return [(0.0, int(spec))]
    return sorted((float(a), int(c)) for a, c in spec)


@dataclass(frozen=True)
class DeviceState:
    """What one scripted device reads at one offset (``xid``: its last scripted event)."""

    status: str
    utilization_pct: float | None
    memory_used_mib: float | None
    memory_total_mib: float
    power_w: float | None
    energy_j: float | None
    throttle_reasons: str | None
    ecc_uncorrectable: int | None
    xid: int | None
    mig_mode: int | None
    hang: bool


def device_state(sc: Scenario, node: str, minor: int, offset: float) -> DeviceState:
    """The one place that decides what a scripted device reads at ``offset`` (both the
    fake NVML and ``hetslurm testbed fake --list`` ask it)."""
    spec = sc.nodes.get(node, {})
    g = sc.gpus.get(f"{node}/{minor}", {})
    fault = g.get("fault") if offset >= float(g.get("fault_from", 0)) else None
    if bool(g.get("lost")):
        fault = "lost"
    total = float(spec.get("memory_total_mib", 16384.0))
    events = [code for at, code in _events(g.get("xid")) if at <= offset]
    xid = events[-1] if events else None
    hang = bool(g.get("hang"))
    if fault in ("lost", "missing"):
        status = STATUS_LOST if fault == "lost" else STATUS_MISSING
        return DeviceState(status, None, None, total, None, None, None, None, xid, None, hang)
    status = _FAULT_STATUS.get(fault or "", STATUS_OK)
    util = _value_at(g.get("utilization"), offset, sc.default_utilization)
    power = None if g.get("power_w") is None else _value_at(g["power_w"], offset, 0.0)
    supported = status != STATUS_NOT_SUPPORTED
    return DeviceState(
        status=status,
        utilization_pct=util if status == STATUS_OK else None,
        memory_used_mib=_value_at(g.get("memory_used_mib"), offset, 0.0),
        memory_total_mib=total,
        power_w=power,
        # A counter that grows with the power scripted; None where power is unscripted.
        energy_j=None if power is None else _integral(g["power_w"], offset),
        throttle_reasons=str(g.get("throttle") or "") if supported else None,
        ecc_uncorrectable=int(g.get("ecc_uncorrectable", 0)) if supported else None,
        xid=xid, mig_mode=1 if fault == "mig" else 0, hang=hang,
    )


class FakeNvml(NvmlSource):
    """Reads a :class:`Scenario` (from a file, re-read when it changes, or in memory).

    An XID event is reported by the first read of its node at or after it (a read covers
    ``(previous read, now]``, the first ``[creation, now]``), as NVML's event set reports
    each event once. A node scripted to ``hang`` blocks its reads until
    the key is cleared or :meth:`close` is called.
    """

    #: How often a hung read looks again at the scenario, seconds.
    HANG_POLL_S = 0.05

    def __init__(self, scenario: Scenario | str | Path, clock: Any = None) -> None:
        import time

        self._path = None if isinstance(scenario, Scenario) else Path(scenario)
        self._scenario = scenario if isinstance(scenario, Scenario) else Scenario.load(scenario)
        self._mtime = self._path.stat().st_mtime_ns if self._path else 0
        self._clock = clock or time.time
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._created = self._clock() - self._scenario.start
        self._read_until: dict[str, float] = {}

    @property
    def scenario(self) -> Scenario:
        with self._lock:  # reads of several nodes may run at once (the collector's threads)
            if self._path is not None:
                try:
                    mtime = self._path.stat().st_mtime_ns
                except OSError:
                    mtime = self._mtime  # keep the last good scenario while it is replaced
                if mtime != self._mtime:
                    self._scenario = Scenario.load(self._path)
                    self._mtime = mtime
            return self._scenario

    def close(self) -> None:
        self._closed.set()  # a hung read returns

    def read(self, node: str) -> list[GpuReading]:
        while self.scenario.hangs(node):
            if self._closed.wait(self.HANG_POLL_S):
                raise MetricsError(f"fake NVML closed while a read of {node} hung")
        sc = self.scenario
        spec = sc.nodes.get(node)
        if spec is None:
            return []
        minors = [int(m) for m in spec.get("minors", [])]
        rng = random.Random(f"{sc.seed}/{node}")  # noqa: S311 - a test shuffle
        order = list(minors)
        rng.shuffle(order)  # NVML enumerates by PCI bus id, not by minor or Slurm index
        uuids = {m: str(uuid_mod.UUID(int=rng.getrandbits(128), version=4)) for m in minors}
        offset = self._clock() - sc.start
        with self._lock:
            first = node not in self._read_until
            since = self._read_until.get(node, self._created)
            self._read_until[node] = max(since, offset)
        out: list[GpuReading] = []
        for nvml_index, minor in enumerate(m for m in order
                                           if not self._gone(sc, node, m, offset)):
            d = device_state(sc, node, minor, offset)
            fresh = [c for at, c in _events(sc.gpus.get(f"{node}/{minor}", {}).get("xid"))
                     if (at >= since if first else at > since) and at <= offset]
            base: dict[str, Any] = dict(nvml_index=nvml_index, minor=minor,
                                        uuid=f"GPU-{uuids[minor]}",
                                        name=str(spec.get("name", "NVIDIA fake")),
                                        xid=fresh[-1] if fresh else None)
            if d.status == STATUS_LOST:
                out.append(GpuReading(**base, status=STATUS_LOST, error="GPU is lost"))
                continue
            out.append(GpuReading(
                **base, utilization_pct=d.utilization_pct, memory_used_mib=d.memory_used_mib,
                memory_total_mib=d.memory_total_mib, power_w=d.power_w, energy_j=d.energy_j,
                mig_mode=d.mig_mode, status=d.status, throttle_reasons=d.throttle_reasons,
                ecc_uncorrectable=d.ecc_uncorrectable,
            ))
        return out

    @staticmethod
    def _gone(sc: Scenario, node: str, minor: int, offset: float) -> bool:
        g = sc.gpus.get(f"{node}/{minor}", {})
        return bool(g.get("fault") == "missing" and offset >= float(g.get("fault_from", 0)))
