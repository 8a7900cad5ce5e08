"""The resolved site: every node expanded, every device placed on its island, NUMA domain
and cores. Built only by :func:`hetslurm.site.load.load_site`, after validation, so code
that receives a :class:`Site` can trust it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from hetslurm.site.schema import NodeClass, Partition, Scheduling, Switch

DeviceKind = Literal["gpu", "fpga"]

#: Node ``Weight=`` bands (lower is allocated first by Slurm): CPU-only nodes first, then
#: FPGA nodes, then GPU nodes in the site's model order, ``WEIGHT_STEP`` apart.
WEIGHT_CPU = 1
WEIGHT_FPGA_BASE = 10
WEIGHT_GPU_BASE = 100
WEIGHT_STEP = 10


@dataclass(frozen=True)
class Device:
    """One GPU or FPGA of a node, by Slurm index (the order of gres.conf ``File=`` lines)."""

    kind: DeviceKind
    model: str
    index: int
    island: int
    numa: int
    cores: tuple[int, ...]
    memory_mib: int | None


@dataclass(frozen=True)
class NodeSpec:
    """A node of the site with its class resolved."""

    name: str
    class_name: str
    spec: NodeClass
    features: tuple[str, ...]
    weight: int
    leaf_switch: str | None
    gpus: tuple[Device, ...]
    fpgas: tuple[Device, ...]

    @property
    def cores(self) -> int:
        return self.spec.sockets * self.spec.cores_per_socket

    @property
    def cpus(self) -> int:
        return self.cores * self.spec.threads_per_core

    @property
    def numa_nodes(self) -> int:
        return self.spec.numa_nodes or self.spec.sockets

    def numa_cores(self, domain: int) -> tuple[int, ...]:
        per = self.cores // self.numa_nodes
        return tuple(range(domain * per, (domain + 1) * per))


@dataclass(frozen=True)
class ResolvedPartition:
    name: str
    spec: Partition
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RankedPartition:
    """One overlapping per-model partition hetslurm renders for ranked fallback: the GPU
    nodes of ``model`` in partition ``base``, with ``base``'s limits and tier."""

    name: str
    base: str
    model: str
    nodes: tuple[str, ...]


def ranked_name(base: str, model: str) -> str:
    """The per-model partition of ``base`` for ``model`` (``gpu`` + ``a100`` -> ``gpu_a100``)."""
    return f"{base}_{model}"


@dataclass(frozen=True)
class Site:
    """A validated site. ``nodes`` keep the file's order within each hostlist entry."""

    path: str
    name: str
    description: str
    scheduling: Scheduling
    node_classes: Mapping[str, NodeClass]
    nodes: tuple[NodeSpec, ...]
    partitions: Mapping[str, ResolvedPartition]
    switches: Mapping[str, Switch]
    sections: Mapping[str, Any] = field(default_factory=dict)
    #: The per-model partitions of ranked fallback, by name (empty with
    #: ``ranked_fallback = "weights"`` or when no partition holds two GPU models).
    ranked: Mapping[str, RankedPartition] = field(default_factory=dict)

    def ranked_of(self, base: str) -> dict[str, str]:
        """Model -> per-model partition of partition ``base`` (empty when it has none)."""
        return {r.model: r.name for r in self.ranked.values() if r.base == base}

    def ranked_list(self, base: str | None, models: Sequence[str]) -> str | None:
        """The per-model partitions of ``base`` for ``models`` in their order, as ``-p``
        text, when at least two of them exist (one model needs no fallback); else None."""
        of = self.ranked_of(base) if base else {}
        names = [of[m] for m in models if m in of]
        return ",".join(names) if len(names) >= 2 else None

    def default_partition(self) -> str | None:
        return next((n for n, p in self.partitions.items() if p.spec.default), None)

    @cached_property
    def _node_index(self) -> dict[str, NodeSpec]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> NodeSpec:
        """The node called ``name`` (KeyError when the site has none)."""
        return self._node_index[name]

    def gpu_models(self) -> tuple[str, ...]:
        """GPU models in the site's preference order (unlisted ones after, by name)."""
        return _ordered({c.gpus.model for c in self.node_classes.values() if c.gpus},
                        self.scheduling.gpu_model_order)

    def gpu_memory_mib(self) -> dict[str, int | None]:
        """Memory per GPU model in MiB; the smallest where node classes disagree, ``None``
        where any class leaves it unknown. The smallest, because a feature constraint for
        the model may land on any of its nodes."""
        out: dict[str, int | None] = {}
        for spec in self.node_classes.values():
            g = spec.gpus
            if g is None:
                continue
            if g.model in out:
                have = out[g.model]
                out[g.model] = None if have is None or g.memory is None else min(have, g.memory)
            else:
                out[g.model] = g.memory
        return out

    def fpga_models(self) -> tuple[str, ...]:
        return _ordered({c.fpgas.model for c in self.node_classes.values() if c.fpgas},
                        self.scheduling.fpga_model_order)


def class_nodes(nodes: Sequence[NodeSpec], devices: Sequence[str],
                allowed: Collection[str] | None = None) -> list[NodeSpec]:
    """The nodes a workload class with ``devices`` can run on (those with one of its device
    models; for ``cpu``, those without devices; all when it names none), within ``allowed``
    (its partition's nodes) when given."""
    wanted = set(devices)
    out = []
    for n in nodes:
        if allowed is not None and n.name not in allowed:
            continue
        have = {d.model for d in (*n.gpus, *n.fpgas)}
        if not wanted or have & wanted or ("cpu" in wanted and not have):
            out.append(n)
    return out


def _ordered(models: set[str], order: tuple[str, ...]) -> tuple[str, ...]:
    head = [m for m in order if m in models]
    return (*head, *sorted(models - set(head)))


def class_weight(spec: NodeClass, gpu_order: tuple[str, ...], fpga_order: tuple[str, ...]) -> int:
    """Node ``Weight=`` for a node class (see the ``WEIGHT_*`` bands)."""
    if spec.gpus:
        return WEIGHT_GPU_BASE + WEIGHT_STEP * gpu_order.index(spec.gpus.model)
    if spec.fpgas:
        return WEIGHT_FPGA_BASE + WEIGHT_STEP * fpga_order.index(spec.fpgas.model)
    return WEIGHT_CPU


def class_features(spec: NodeClass) -> tuple[str, ...]:
    """Features hetslurm adds (device kind and model) followed by the class's own."""
    feats: list[str] = []
    if spec.gpus:
        feats += ["gpu", spec.gpus.model]
    if spec.fpgas:
        feats += ["fpga", spec.fpgas.model]
    if not spec.gpus and not spec.fpgas:
        feats.append("cpu")
    feats += [f for f in spec.features if f not in feats]
    return tuple(feats)


def place_devices(spec: NodeClass, kind: DeviceKind) -> tuple[Device, ...]:
    """Resolve island, NUMA domain and local cores of every device of one kind."""
    group = spec.gpus if kind == "gpu" else spec.fpgas
    if group is None:
        return ()
    numa_nodes = spec.numa_nodes or spec.sockets
    island_of: dict[int, int] = {}
    for i, island in enumerate(group.nvlink_islands):
        for g in island:
            island_of[g] = i
    next_island = len(group.nvlink_islands)
    islands = []
    for g in range(group.count):
        if g not in island_of:
            island_of[g] = next_island
            next_island += 1
        islands.append(island_of[g])
    if group.numa is not None:
        numa = list(group.numa)
    elif group.nvlink_islands and len(group.nvlink_islands) == numa_nodes and len(
        island_of
    ) == group.count and next_island == numa_nodes:
        # Islands that coincide with NUMA domains: island k sits on domain k.
        numa = islands
    else:
        numa = [g * numa_nodes // group.count for g in range(group.count)]
    per = spec.sockets * spec.cores_per_socket // numa_nodes
    return tuple(
        Device(
            kind=kind,
            model=group.model,
            index=g,
            island=islands[g],
            numa=numa[g],
            cores=tuple(range(numa[g] * per, (numa[g] + 1) * per)),
            memory_mib=group.memory,
        )
        for g in range(group.count)
    )
