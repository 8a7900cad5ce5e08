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
                            "memory_used_mib": 20000, "power_w": 450,
                            "fault": "lost", "fault_from": 60}}  # not_supported|lost|mig|missing
    }

The file is re-read when it changes, so a running collector follows a script that a test or
the demo rewrites while jobs run.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
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
    STATUS_NOT_SUPPORTED,
    STATUS_OK,
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
        ``memory_used_mib``, ``power_w``, ``fault``, ``fault_from``."""
        self.gpus.setdefault(f"{node}/{minor}", {}).update(values)


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


class FakeNvml(NvmlSource):
    """Reads a :class:`Scenario` (from a file, re-read when it changes, or in memory)."""

    def __init__(self, scenario: Scenario | str | Path, clock: Any = None) -> None:
        import time

        self._path = None if isinstance(scenario, Scenario) else Path(scenario)
        self._scenario = scenario if isinstance(scenario, Scenario) else Scenario.load(scenario)
        self._mtime = self._path.stat().st_mtime_ns if self._path else 0
        self._clock = clock or time.time

    @property
    def scenario(self) -> Scenario:
        if self._path is not None:
            try:
                mtime = self._path.stat().st_mtime_ns
            except OSError:
                mtime = self._mtime  # keep the last good scenario while it is replaced
            if mtime != self._mtime:
                self._scenario = Scenario.load(self._path)
                self._mtime = mtime
        return self._scenario

    def read(self, node: str) -> list[GpuReading]:
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
        out: list[GpuReading] = []
        for nvml_index, minor in enumerate(m for m in order
                                           if not self._gone(sc, node, m, offset)):
            g = sc.gpus.get(f"{node}/{minor}", {})
            fault = g.get("fault") if offset >= float(g.get("fault_from", 0)) else None
            total = float(spec.get("memory_total_mib", 16384.0))
            base: dict[str, Any] = dict(nvml_index=nvml_index, minor=minor,
                                        uuid=f"GPU-{uuids[minor]}",
                                        name=str(spec.get("name", "NVIDIA fake")))
            if fault == "lost":
                out.append(GpuReading(**base, status=STATUS_LOST, error="GPU is lost"))
                continue
            util = _value_at(g.get("utilization"), offset, sc.default_utilization)
            mem = _value_at(g.get("memory_used_mib"), offset, 0.0)
            power = None if g.get("power_w") is None else _value_at(g["power_w"], offset, 0.0)
            status = _FAULT_STATUS.get(fault or "", STATUS_OK)
            out.append(GpuReading(
                **base,
                utilization_pct=util if status == STATUS_OK else None,
                memory_used_mib=mem, memory_total_mib=total,
                power_w=power,
                # A plausible counter: grows with time; None where power is unscripted.
                energy_j=None if power is None else power * max(offset, 0.0),
                mig_mode=1 if fault == "mig" else 0, status=status,
            ))
        return out

    @staticmethod
    def _gone(sc: Scenario, node: str, minor: int, offset: float) -> bool:
        g = sc.gpus.get(f"{node}/{minor}", {})
        return bool(g.get("fault") == "missing" and offset >= float(g.get("fault_from", 0)))
