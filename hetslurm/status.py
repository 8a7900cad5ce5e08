"""``hetslurm status``: the live cluster by device class.

Counting rules (also in ``docs/slurm-access.md``), per node and then summed:

- ``allocated``: what Slurm reports in use (``GresUsed``/``CPUAlloc``/``AllocMem``),
  whatever the node's state: a MIXED+DRAIN node's allocated GPUs stay allocated.
- ``unavailable``: the rest of a node on which Slurm starts no new work for the general
  queue: DRAIN (draining or drained), DOWN, NOT_RESPONDING, FAIL, reserved or in
  maintenance (an active reservation), powered down, FUTURE, INVALID_REG, reboot pending.
  An idle drained node's GPUs are unavailable, not free.
- ``free``: the rest of a node that is none of the above.

So ``total == allocated + free + unavailable`` for every row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hetslurm.slurm.backend import NodeInfo, SlurmBackend

#: GRES names shown as their own device class; any other GRES is listed under its name.
GPU = "gpu"
FPGA = "fpga"


@dataclass(frozen=True)
class ResourceCount:
    """Totals for one resource kind; ``total == allocated + free + unavailable``."""

    resource: str
    model: str | None
    total: int = 0
    allocated: int = 0
    free: int = 0
    unavailable: int = 0
    nodes: int = 0
    unit: str = "count"

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "model": self.model,
            "unit": self.unit,
            "total": self.total,
            "allocated": self.allocated,
            "free": self.free,
            "unavailable": self.unavailable,
            "nodes": self.nodes,
        }


@dataclass(frozen=True)
class ClusterStatus:
    """What ``hetslurm status`` shows.

    ``nodes_by_state`` maps a node class (``gpu``, ``fpga``, ``cpu``: a node with any GPU
    is a GPU node) to ``{state label: node count}`` (labels: idle, mixed, allocated,
    draining, drained, down, reserved, ...). ``devices`` has one row per GRES model,
    ``cores`` and ``memory`` (MiB) one each.
    """

    nodes_by_state: dict[str, dict[str, int]] = field(default_factory=dict)
    devices: tuple[ResourceCount, ...] = ()
    cores: ResourceCount = field(default_factory=lambda: ResourceCount("cores", None))
    memory: ResourceCount = field(default_factory=lambda: ResourceCount("memory", None, unit="MiB"))

    @property
    def gpus(self) -> tuple[ResourceCount, ...]:
        return tuple(d for d in self.devices if d.resource == GPU)

    @property
    def fpgas(self) -> tuple[ResourceCount, ...]:
        return tuple(d for d in self.devices if d.resource == FPGA)

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows: one per device model, then cores, then memory."""
        return [r.to_dict() for r in (*self.devices, self.cores, self.memory)]

    def node_rows(self) -> list[dict[str, Any]]:
        """Flat rows: one per (node class, state)."""
        return [
            {"class": cls, "state": state, "nodes": n}
            for cls, states in self.nodes_by_state.items()
            for state, n in states.items()
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_by_state": {k: dict(v) for k, v in self.nodes_by_state.items()},
            "gpus": [d.to_dict() for d in self.gpus],
            "fpgas": [d.to_dict() for d in self.fpgas],
            "other_devices": [d.to_dict() for d in self.devices if d.resource not in (GPU, FPGA)],
            "cores": self.cores.to_dict(),
            "memory": self.memory.to_dict(),
        }


def node_class(node: NodeInfo) -> str:
    """``gpu`` if the node has any GPU, else ``fpga`` if any FPGA, else ``cpu``."""
    names = {name for (name, _), count in node.gres_total.items() if count}
    if GPU in names:
        return GPU
    if FPGA in names:
        return FPGA
    return "cpu"


class _Acc:
    def __init__(self) -> None:
        self.total = self.allocated = self.free = self.unavailable = self.nodes = 0

    def add(self, total: int, allocated: int, unavailable_node: bool) -> None:
        allocated = min(max(allocated, 0), total)
        rest = total - allocated
        self.total += total
        self.allocated += allocated
        if unavailable_node:
            self.unavailable += rest
        else:
            self.free += rest
        self.nodes += 1

    def result(self, resource: str, model: str | None, unit: str = "count") -> ResourceCount:
        return ResourceCount(
            resource,
            model,
            self.total,
            self.allocated,
            self.free,
            self.unavailable,
            self.nodes,
            unit,
        )


def summarize(nodes: Iterable[NodeInfo]) -> ClusterStatus:
    """Count nodes, devices, cores and memory by the rules in this module's docstring."""
    by_state: dict[str, dict[str, int]] = {}
    devices: dict[tuple[str, str | None], _Acc] = {}
    cores, memory = _Acc(), _Acc()
    for node in nodes:
        states = by_state.setdefault(node_class(node), {})
        states[node.state_label] = states.get(node.state_label, 0) + 1
        out = node.unavailable
        for key, total in node.gres_total.items():
            if total:
                devices.setdefault(key, _Acc()).add(total, node.gres_used.get(key, 0), out)
        cores.add(node.cpus_total, node.cpus_alloc, out)
        memory.add(node.memory_total_mib, node.memory_alloc_mib, out)
    order = {GPU: 0, FPGA: 1}
    keys = sorted(devices, key=lambda k: (order.get(k[0], 2), k[0], k[1] or ""))
    return ClusterStatus(
        nodes_by_state={c: dict(sorted(s.items())) for c, s in sorted(by_state.items())},
        devices=tuple(devices[k].result(k[0], k[1]) for k in keys),
        cores=cores.result("cores", None),
        memory=memory.result("memory", None, unit="MiB"),
    )


def cluster_status(backend: SlurmBackend) -> ClusterStatus:
    """The live cluster's status, read through ``backend``."""
    return summarize(backend.nodes())
