"""The cluster as contiguous arrays: static layout from the site, live state on top.

:class:`ClusterModel` is what the placement kernels read. It is built once from a resolved
:class:`~hetslurm.site.model.Site` (or, for tests and synthetic clusters, from a list of
:class:`NodeLayout`), validated here once, and then trusted by ``hetslurm._core``.

Arrays (N nodes, G GPUs, F FPGAs, D NUMA domains, C cores, S switches; every array is
C-contiguous and read-only):

====================  ========  =====  ============================================================
name                  shape     dtype  meaning
====================  ========  =====  ============================================================
cores_total           (N,)      int32  physical cores (sockets x cores per socket), >= 1
threads_per_core      (N,)      int32  to turn Slurm CPU counts into cores
mem_total_mib         (N,)      int64  RealMemory, MiB
gpu_model             (N,)      int32  index into ``gpu_models`` (site preference order), -1 none
gpu_count             (N,)      int32  GPUs in the node
gpu_offsets           (N+1,)    int64  CSR: node i owns GPUs ``gpu_offsets[i]:gpu_offsets[i+1]``
gpu_island            (G,)      int32  NVLink island id (node-local numbering)
gpu_numa              (G,)      int32  NUMA domain, node-local, < the node's domain count
gpu_mem_mib           (G,)      int64  GPU memory, MiB (0 = unknown: fails any minimum)
fpga_model            (N,)      int32  index into ``fpga_models``, -1 none
fpga_count            (N,)      int32  FPGAs in the node
fpga_offsets          (N+1,)    int64  CSR over the F FPGAs
numa_offsets          (N+1,)    int64  CSR: node i owns domains ``numa_offsets[i]:...[i+1]``
numa_cores            (D,)      int32  cores per NUMA domain
core_offsets          (N+1,)    int64  CSR over the C cores (node-local core index = position)
core_numa             (C,)      int32  node-local NUMA domain of each core
leaf                  (N,)      int32  leaf switch id (a site without switches gets one leaf)
switch_parent         (S,)      int32  parent switch id, -1 for the root (exactly one root)
switch_level          (S,)      int32  0 for a leaf, else 1 + the highest child level
weight                (N,)      int64  Slurm node Weight (lower is allocated first)
power_idle_w          (N,)      int32  node idle watts (without devices)
power_busy_w          (N,)      int32  node busy watts
gpu_idle_w/busy_w     (N,)      int32  watts of one GPU of the node, idle / busy
fpga_idle_w/busy_w    (N,)      int32  watts of one FPGA of the node, idle / busy
====================  ========  =====  ============================================================

The live state (:class:`StateArrays`) adds per GPU/FPGA/core free flags (uint8), free memory
(int64 MiB), node availability (uint8) and ``free_at`` (float64, epoch seconds): the earliest
time a running job on the node ends, ``inf`` when none is known to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hetslurm.errors import PlacementError

if TYPE_CHECKING:
    from hetslurm._core import PlacementCore
    from hetslurm.placement.state import LiveState
    from hetslurm.site.model import Site

# --- layouts shared with hetslurm/_core.pxd (a unit test checks they agree) -----------------
R_GPUS, R_FPGAS, R_CORES, R_MEM, R_MIN_GPU_MEM, R_NODES = 0, 1, 2, 3, 4, 5
R_NVLINK, R_NUMA, R_SWITCH, R_CPU_ONLY, N_REQ = 6, 7, 8, 9, 10
#: Per-node score terms, in kernel order; see docs/placement.md "The score".
TERMS = ("model", "islands", "numa", "leftover", "load", "energy", "weight")
N_T = len(TERMS)
W_SWITCH = N_T
N_W = N_T + 1
#: Per-node evaluation status, by code (0 = fits, else the first constraint that fails).
STATUSES = (
    "fits",
    "unavailable",
    "cpu_only",
    "gpu_model",
    "gpu_count",
    "gpu_mem",
    "gpu_free",
    "nvlink",
    "fpga_model",
    "fpga_count",
    "fpga_free",
    "cores",
    "numa",
    "memory",
)
ST_FITS = 0
PL_PLACED, PL_FEW_NODES, PL_SWITCH = 0, 1, 2
I_TOTAL, I_LEVELS, I_SWITCH, I_TOUCHED, I_FITTING, I_BEST_LEAF = 0, 1, 2, 3, 4, 5
I_NEXT_NODE, I_NEXT_SCORE, N_INFO = 6, 7, 8

#: Most GPUs (or FPGAs) one node may list; the site schema allows the same.
MAX_NODE_DEVICES = 64
MAX_NUMA = 64
MAX_NODE_CORES = 16 * 1024
#: Watts per device or node, as the site schema bounds them.
MAX_WATTS = 100_000
MAX_WEIGHT = 1 << 32
MAX_MEM_MIB = 1 << 40


@dataclass(frozen=True)
class GpuLayout:
    """One GPU of a node: NVLink island, NUMA domain (node-local) and memory in MiB."""

    island: int
    numa: int
    memory_mib: int = 0


@dataclass(frozen=True)
class NodeLayout:
    """One node's static layout, the input of :meth:`ClusterModel.from_layouts`.

    ``cores_per_numa`` lists the cores of each NUMA domain; core ids run in that order
    (domain 0's cores first), as :meth:`hetslurm.site.model.NodeSpec.numa_cores` numbers them.
    """

    name: str
    cores_per_numa: tuple[int, ...]
    mem_mib: int
    gpu_model: str | None = None
    gpus: tuple[GpuLayout, ...] = ()
    fpga_model: str | None = None
    fpgas: int = 0
    leaf: str | None = None
    weight: int = 1
    threads_per_core: int = 1
    power_idle_w: int = 0
    power_busy_w: int = 0
    gpu_idle_w: int = 0
    gpu_busy_w: int = 0
    fpga_idle_w: int = 0
    fpga_busy_w: int = 0


@dataclass(frozen=True, eq=False)
class StateArrays:
    """Live usage as arrays aligned with a :class:`ClusterModel` (all read-only).

    Attributes:
        available: shape (N,), uint8; 0 = drained, down, reserved or unknown to Slurm.
        gpu_free: shape (G,), uint8; 1 = free.
        fpga_free: shape (F,), uint8; 1 = free.
        core_free: shape (C,), uint8; 1 = free (see docs/placement.md for how cores in use
            are derived when Slurm does not say which).
        mem_free_mib: shape (N,), int64.
        free_at: shape (N,), float64 epoch seconds; earliest end of a running job on the node,
            ``inf`` when none is known.
        time: epoch seconds the state describes (0 for an empty cluster).
        load_milli: shape (N,), int32 in 0..1000; the measured load per mille (mean GPU
            utilization over a recent window, :mod:`hetslurm.metrics.measured`); 0 = idle or
            unknown. ``None`` (the default) is 0 everywhere: nothing measured.
    """

    available: npt.NDArray[np.uint8]
    gpu_free: npt.NDArray[np.uint8]
    fpga_free: npt.NDArray[np.uint8]
    core_free: npt.NDArray[np.uint8]
    mem_free_mib: npt.NDArray[np.int64]
    free_at: npt.NDArray[np.float64]
    time: float = 0.0
    load_milli: npt.NDArray[np.int32] | None = None


@dataclass(frozen=True)
class KernelRequest:
    """A request validated against one :class:`ClusterModel`, in the kernel's terms.

    Built by :func:`hetslurm.placement.place.compile_request`; the kernels and the
    plain-Python reference both read it. ``gpu_rank[m]`` is the rank of GPU model ``m`` in the
    request (0 = first choice, -1 = not allowed); ``weights`` holds the seven term weights
    then the switch weight.
    """

    nodes: int
    gpus: int
    fpgas: int
    cores: int
    mem_mib: int
    min_gpu_mem_mib: int
    nvlink: bool
    numa: bool
    switch: bool
    cpu_only: bool
    gpu_rank: tuple[int, ...]
    fpga_rank: tuple[int, ...]
    weights: tuple[int, ...]

    def vector(self) -> npt.NDArray[np.int64]:
        """The kernel's ``req`` vector, shape (N_REQ,), int64."""
        fields = [0] * N_REQ
        fields[R_GPUS] = self.gpus
        fields[R_FPGAS] = self.fpgas
        fields[R_CORES] = self.cores
        fields[R_MEM] = self.mem_mib
        fields[R_MIN_GPU_MEM] = self.min_gpu_mem_mib
        fields[R_NODES] = self.nodes
        fields[R_NVLINK] = int(self.nvlink)
        fields[R_NUMA] = int(self.numa)
        fields[R_SWITCH] = int(self.switch)
        fields[R_CPU_ONLY] = int(self.cpu_only)
        return np.array(fields, dtype=np.int64)


def _ro(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    out = np.ascontiguousarray(array)
    out.flags.writeable = False
    return out


def _csr(counts: Sequence[int]) -> npt.NDArray[np.int64]:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


@dataclass(frozen=True, eq=False)
class ClusterModel:
    """The cluster's static layout and live state as arrays (see the module docstring).

    Build with :meth:`from_site` or :meth:`from_layouts`; apply live usage with
    :meth:`with_state`. Instances are immutable; the compiled core built from them is cached.
    """

    names: tuple[str, ...]
    gpu_models: tuple[str, ...]
    fpga_models: tuple[str, ...]
    switch_names: tuple[str, ...]
    cores_total: npt.NDArray[np.int32]
    threads_per_core: npt.NDArray[np.int32]
    mem_total_mib: npt.NDArray[np.int64]
    gpu_model: npt.NDArray[np.int32]
    gpu_count: npt.NDArray[np.int32]
    gpu_offsets: npt.NDArray[np.int64]
    gpu_island: npt.NDArray[np.int32]
    gpu_numa: npt.NDArray[np.int32]
    gpu_mem_mib: npt.NDArray[np.int64]
    fpga_model: npt.NDArray[np.int32]
    fpga_count: npt.NDArray[np.int32]
    fpga_offsets: npt.NDArray[np.int64]
    numa_offsets: npt.NDArray[np.int64]
    numa_cores: npt.NDArray[np.int32]
    core_offsets: npt.NDArray[np.int64]
    core_numa: npt.NDArray[np.int32]
    leaf: npt.NDArray[np.int32]
    switch_parent: npt.NDArray[np.int32]
    switch_level: npt.NDArray[np.int32]
    weight: npt.NDArray[np.int64]
    power_idle_w: npt.NDArray[np.int32]
    power_busy_w: npt.NDArray[np.int32]
    gpu_idle_w: npt.NDArray[np.int32]
    gpu_busy_w: npt.NDArray[np.int32]
    fpga_idle_w: npt.NDArray[np.int32]
    fpga_busy_w: npt.NDArray[np.int32]
    state: StateArrays
    #: Default MiB per core when a request names no memory (the site's DefMemPerCPU).
    def_mem_per_cpu_mib: int | None = None
    #: Slurm partitions: name -> node names (empty: the model knows none, every node counts).
    partitions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: The partition a job that names none goes to (Slurm's ``Default=YES``).
    default_partition: str | None = None
    #: 1 for the nodes a job of one partition may use (:meth:`in_partition`); None: all.
    scope: npt.NDArray[np.uint8] | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_site(cls, site: Site) -> ClusterModel:
        """The site's nodes, devices, NUMA layout, switch tree, weights and power, all free."""
        layouts = []
        for node in site.nodes:
            spec = node.spec
            per = node.cores // node.numa_nodes
            gpus = tuple(
                GpuLayout(d.island, d.numa, d.memory_mib or 0) for d in node.gpus
            )
            gspec, fspec = spec.gpus, spec.fpgas
            layouts.append(
                NodeLayout(
                    name=node.name,
                    cores_per_numa=(per,) * node.numa_nodes,
                    mem_mib=spec.memory,
                    gpu_model=gspec.model if gspec else None,
                    gpus=gpus,
                    fpga_model=fspec.model if fspec else None,
                    fpgas=len(node.fpgas),
                    leaf=node.leaf_switch,
                    weight=node.weight,
                    threads_per_core=spec.threads_per_core,
                    power_idle_w=round(spec.power_idle_watts),
                    power_busy_w=round(spec.power_busy_watts),
                    gpu_idle_w=round(gspec.power_idle_watts or 0) if gspec else 0,
                    gpu_busy_w=round(gspec.power_busy_watts or 0) if gspec else 0,
                    fpga_idle_w=round(fspec.power_idle_watts or 0) if fspec else 0,
                    fpga_busy_w=round(fspec.power_busy_watts or 0) if fspec else 0,
                )
            )
        parents: dict[str, str | None] = {name: None for name in site.switches}
        for name, sw in site.switches.items():
            for child in sw.switches:
                parents[child] = name
        model = cls.from_layouts(
            layouts,
            switches=parents,
            gpu_models=site.gpu_models(),
            fpga_models=site.fpga_models(),
            def_mem_per_cpu_mib=site.scheduling.def_mem_per_cpu,
        )
        parts = {n: p.nodes for n, p in site.partitions.items()}
        parts.update({n: r.nodes for n, r in site.ranked.items()})
        return replace(model, partitions=parts, default_partition=site.default_partition(),
                       _cache={})

    @classmethod
    def from_layouts(
        cls,
        nodes: Sequence[NodeLayout],
        *,
        switches: Mapping[str, str | None] | None = None,
        gpu_models: Sequence[str] | None = None,
        fpga_models: Sequence[str] | None = None,
        def_mem_per_cpu_mib: int | None = None,
    ) -> ClusterModel:
        """Build and validate the arrays from node layouts (all resources free).

        Args:
            nodes: The nodes, in the order placements list them.
            switches: Switch name to parent name (None for the root), in id order. Empty or
                None: one implicit leaf holds every node (Slurm's flat topology).
            gpu_models: GPU models in preference order; default: as first seen.
            fpga_models: FPGA models likewise.
            def_mem_per_cpu_mib: Memory per core for requests that name none.

        Raises:
            PlacementError: The layout is inconsistent; the message names the node or switch.
        """
        gmodels = list(gpu_models or [])
        fmodels = list(fpga_models or [])
        for n in nodes:
            if n.gpu_model is not None and n.gpu_model not in gmodels:
                if gpu_models is not None:
                    raise PlacementError(f"node {n.name}: GPU model '{n.gpu_model}' not listed")
                gmodels.append(n.gpu_model)
            if n.fpga_model is not None and n.fpga_model not in fmodels:
                if fpga_models is not None:
                    raise PlacementError(f"node {n.name}: FPGA model '{n.fpga_model}' not listed")
                fmodels.append(n.fpga_model)
        tree = dict(switches or {})
        if not tree:
            # Slurm without topology/tree treats the cluster as flat: one leaf.
            tree = {"": None}
            nodes = [replace(n, leaf="") for n in nodes]
        sw_names = tuple(tree)
        sw_id = {s: i for i, s in enumerate(sw_names)}
        parent = np.full(len(sw_names), -1, dtype=np.int32)
        for s, p in tree.items():
            if p is not None:
                if p not in sw_id:
                    raise PlacementError(f"switch '{s}': unknown parent '{p}'")
                parent[sw_id[s]] = sw_id[p]
        if int((parent < 0).sum()) != 1:
            raise PlacementError("the switch tree must have exactly one root")
        level = _levels(parent)
        names = tuple(n.name for n in nodes)
        if len(set(names)) != len(names):
            raise PlacementError("node names must be unique")
        leaf = np.empty(len(nodes), dtype=np.int32)
        for i, n in enumerate(nodes):
            if n.leaf is None or n.leaf not in sw_id:
                raise PlacementError(f"node {n.name}: leaf switch {n.leaf!r} is not in the tree")
            leaf[i] = sw_id[n.leaf]
            if level[leaf[i]] != 0:
                raise PlacementError(f"node {n.name}: switch '{n.leaf}' is not a leaf")
            _check_node(n)
        gpus = [g for n in nodes for g in n.gpus]
        core_numa = [d for n in nodes for d, c in enumerate(n.cores_per_numa) for _ in range(c)]

        def i32(values: Sequence[int]) -> npt.NDArray[np.int32]:
            return _ro(np.asarray(values, dtype=np.int32).reshape(-1))

        def i64(values: Sequence[int]) -> npt.NDArray[np.int64]:
            return _ro(np.asarray(values, dtype=np.int64).reshape(-1))

        model = cls(
            names=names,
            gpu_models=tuple(gmodels),
            fpga_models=tuple(fmodels),
            switch_names=sw_names,
            cores_total=i32([sum(n.cores_per_numa) for n in nodes]),
            threads_per_core=i32([n.threads_per_core for n in nodes]),
            mem_total_mib=i64([n.mem_mib for n in nodes]),
            gpu_model=i32([gmodels.index(n.gpu_model) if n.gpu_model else -1 for n in nodes]),
            gpu_count=i32([len(n.gpus) for n in nodes]),
            gpu_offsets=_ro(_csr([len(n.gpus) for n in nodes])),
            gpu_island=i32([g.island for g in gpus]),
            gpu_numa=i32([g.numa for g in gpus]),
            gpu_mem_mib=i64([g.memory_mib for g in gpus]),
            fpga_model=i32([fmodels.index(n.fpga_model) if n.fpga_model else -1 for n in nodes]),
            fpga_count=i32([n.fpgas for n in nodes]),
            fpga_offsets=_ro(_csr([n.fpgas for n in nodes])),
            numa_offsets=_ro(_csr([len(n.cores_per_numa) for n in nodes])),
            numa_cores=i32([c for n in nodes for c in n.cores_per_numa]),
            core_offsets=_ro(_csr([sum(n.cores_per_numa) for n in nodes])),
            core_numa=i32(core_numa),
            leaf=_ro(leaf),
            switch_parent=_ro(parent),
            switch_level=_ro(level),
            weight=i64([n.weight for n in nodes]),
            power_idle_w=i32([n.power_idle_w for n in nodes]),
            power_busy_w=i32([n.power_busy_w for n in nodes]),
            gpu_idle_w=i32([n.gpu_idle_w for n in nodes]),
            gpu_busy_w=i32([n.gpu_busy_w for n in nodes]),
            fpga_idle_w=i32([n.fpga_idle_w for n in nodes]),
            fpga_busy_w=i32([n.fpga_busy_w for n in nodes]),
            state=_empty_state(len(nodes), len(gpus), sum(n.fpgas for n in nodes),
                               len(core_numa), [n.mem_mib for n in nodes]),
            def_mem_per_cpu_mib=def_mem_per_cpu_mib,
        )
        return model

    # ------------------------------------------------------------------ state
    @property
    def n_nodes(self) -> int:
        return len(self.names)

    def node_index(self, name: str) -> int:
        """Index of node ``name``; ``KeyError`` when the cluster has no such node."""
        index: dict[str, int] | None = self._cache.get("index")
        if index is None:
            index = self._cache["index"] = {n: i for i, n in enumerate(self.names)}
        return index[name]

    def largest(self) -> tuple[int, int, int]:
        """Most GPUs, FPGAs and cores of any node (0 for an empty cluster); cached."""
        big: tuple[int, int, int] | None = self._cache.get("largest")
        if big is None:
            def top(a: npt.NDArray[np.int32]) -> int:
                return int(np.max(a)) if a.size else 0

            big = self._cache["largest"] = (
                top(self.gpu_count), top(self.fpga_count), top(self.cores_total)
            )
        return big

    def in_partition(self, partition: str | None) -> ClusterModel:
        """The cluster as a job of ``partition`` sees it (``None``: the default partition, as
        Slurm gives a job that names none): nodes outside it unavailable, here and in
        :meth:`empty`. The model itself when it knows no partitions or the partition holds
        every node; cached per partition.

        Raises:
            PlacementError: ``partition`` names a partition the model does not know (Slurm
                refuses such a job at submission).
        """
        name = partition or self.default_partition
        if not name or not self.partitions:
            return self
        key = ("partition", name)
        cached: ClusterModel | None = self._cache.get(key)
        if cached is not None:
            return cached
        allowed: set[str] = set()
        for p in name.split(","):
            if p not in self.partitions:
                raise PlacementError(f"partition '{p}' is not one of the site's: "
                                     + ", ".join(sorted(self.partitions)))
            allowed.update(self.partitions[p])
        if all(n in allowed for n in self.names):
            out = self
        else:
            scope = _ro(np.asarray([n in allowed for n in self.names], dtype=np.uint8))
            out = replace(self, scope=scope, _cache={}).with_arrays(self.state)
            if "live" in self._cache:
                out._cache["live"] = self._cache["live"]
        self._cache[key] = out
        return out

    def only(self, nodes: Iterable[str]) -> ClusterModel:
        """The cluster with every node outside ``nodes`` unavailable, for a caller that has
        decided where the job may run (Slurm's live partitions, a simulated policy): the
        site's partitions no longer narrow it in :func:`~hetslurm.placement.place.place`."""
        allowed = set(nodes)
        st = self.state
        avail = np.asarray([bool(a) and n in allowed for n, a in zip(self.names, st.available,
                                                                     strict=True)],
                           dtype=np.uint8)
        out = replace(self, partitions={}, default_partition=None, _cache={})
        return out.with_arrays(replace(st, available=avail))

    def empty(self) -> ClusterModel:
        """The same cluster with nothing running and every node available (cached: "cannot
        place" answers evaluate it, and its compiled core is built once); within
        :meth:`in_partition`'s scope when it has one."""
        cached: ClusterModel | None = self._cache.get("empty")
        if cached is None:
            state = _empty_state(self.n_nodes, len(self.gpu_island),
                                 int(self.fpga_offsets[-1]), len(self.core_numa),
                                 self.mem_total_mib.tolist())
            if self.scope is not None:
                state = replace(state, available=self.scope)
            cached = replace(self, state=state, _cache={})
            self._cache["empty"] = cached
        return cached

    def with_core(self, state: StateArrays, core: PlacementCore) -> ClusterModel:
        """The same cluster with ``state`` and ``core`` already holding it, unchecked: for a
        caller that takes resources from one core (:meth:`PlacementCore.take`) and from
        copies of this model's state arrays alike, rather than build a model and a core per
        change (relax's batch path). ``state`` must be this model's arrays with entries
        marked busy (read-only). The caches that depend on the static arrays and scope only
        (node index, largest node, the empty cluster and its answers) are shared; the live
        state is not carried, as :meth:`with_arrays` does not carry it."""
        if self.names:
            self.node_index(self.names[0])  # builds the shared index once
        cache = {k: v for k, v in self._cache.items() if k in ("index", "largest", "empty")}
        cache["core"] = core
        return replace(self, state=state, _cache=cache)

    def with_arrays(self, state: StateArrays) -> ClusterModel:
        """The same cluster with ``state`` applied (checked for shape, dtype and range).

        Raises:
            PlacementError: An array has the wrong length or values.
        """
        sizes = {
            "available": self.n_nodes,
            "gpu_free": len(self.gpu_island),
            "fpga_free": int(self.fpga_offsets[-1]),
            "core_free": len(self.core_numa),
            "mem_free_mib": self.n_nodes,
            "free_at": self.n_nodes,
        }
        fixed: dict[str, Any] = {}
        for name, size in sizes.items():
            raw = np.asarray(getattr(state, name))
            if raw.shape != (size,):
                raise PlacementError(f"state {name} has shape {raw.shape}, expected ({size},)")
            if name == "free_at":
                fixed[name] = _ro(raw.astype(np.float64))
                continue
            if raw.size and raw.dtype.kind not in "biu":
                raise PlacementError(f"state {name} must hold integers, got {raw.dtype}")
            if name == "mem_free_mib":
                if raw.size and (raw.min() < 0 or (raw > self.mem_total_mib).any()):
                    raise PlacementError("state mem_free_mib must be within 0..node memory")
                fixed[name] = _ro(raw.astype(np.int64))
            else:
                if raw.size and not np.isin(raw, (0, 1)).all():
                    raise PlacementError(f"state {name} must hold only 0 and 1")
                fixed[name] = _ro(raw.astype(np.uint8))
        if self.scope is not None:
            fixed["available"] = _ro(fixed["available"] & self.scope)
        fixed["load_milli"] = self._load_array(state.load_milli)
        return replace(self, state=StateArrays(time=float(state.time), **fixed), _cache={})

    def _load_array(self, load: Any) -> npt.NDArray[np.int32] | None:
        if load is None:
            return None
        raw = np.asarray(load)
        if raw.shape != (self.n_nodes,):
            raise PlacementError(
                f"state load_milli has shape {raw.shape}, expected ({self.n_nodes},)")
        if raw.size and raw.dtype.kind not in "iu":
            raise PlacementError(f"state load_milli must hold integers, got {raw.dtype}")
        if raw.size and (raw.min() < 0 or raw.max() > 1000):
            raise PlacementError("state load_milli must be within 0..1000 (per mille)")
        out: npt.NDArray[np.int32] = _ro(raw.astype(np.int32))
        return out

    def with_measured_load(self, load_milli: npt.NDArray[Any] | Sequence[int]) -> ClusterModel:
        """The same cluster and state with a measured load per node (per mille, 0..1000,
        aligned with :attr:`names`; 0 = idle or unknown), for the score's load term.

        Raises:
            PlacementError: Wrong length, not integers, or outside 0..1000.
        """
        out = replace(self, state=replace(self.state, load_milli=self._load_array(load_milli)),
                      _cache={})
        if "live" in self._cache:
            out._cache["live"] = self._cache["live"]
        return out

    def with_gpu_watts(self, watts: Mapping[str, tuple[int, int]]) -> ClusterModel:
        """The same cluster with the (idle, busy) watts of one GPU replaced for the models
        in ``watts`` (e.g. measured ones, :func:`hetslurm.metrics.measured.gpu_watts`); the
        energy term reads busy minus idle. Models the cluster lacks are ignored.

        Raises:
            PlacementError: A figure outside 0..MAX_WATTS.
        """
        idle, busy = self.gpu_idle_w.copy(), self.gpu_busy_w.copy()
        for name, (w_idle, w_busy) in watts.items():
            if name not in self.gpu_models:
                continue
            if not (0 <= w_idle <= MAX_WATTS and 0 <= w_busy <= MAX_WATTS):
                raise PlacementError(f"GPU {name}: watts must be within 0..{MAX_WATTS}")
            on = self.gpu_model == self.gpu_models.index(name)
            idle[on] = int(w_idle)
            busy[on] = int(w_busy)
        out = replace(self, gpu_idle_w=_ro(idle), gpu_busy_w=_ro(busy), _cache={})
        if "live" in self._cache:
            out._cache["live"] = self._cache["live"]
        return out

    def with_state(self, live: LiveState) -> ClusterModel:
        """The same cluster with live usage applied.

        Nodes the live state does not list are unavailable (Slurm does not know them); nodes
        it lists that the site lacks are ignored. Cores in use come from the jobs' CPU ids
        when known, else from the node's allocated CPU count (docs/placement.md, "Live state").

        Raises:
            PlacementError: A device index in the state is outside the node's devices.
        """
        n = self.n_nodes
        available = np.zeros(n, dtype=np.uint8)
        gpu_free = np.ones(len(self.gpu_island), dtype=np.uint8)
        fpga_free = np.ones(int(self.fpga_offsets[-1]), dtype=np.uint8)
        core_free = np.ones(len(self.core_numa), dtype=np.uint8)
        mem_free = self.mem_total_mib.copy()
        free_at = np.full(n, math.inf)
        for node in live.nodes:
            try:
                i = self.node_index(node.name)
            except KeyError:
                continue
            available[i] = node.available
            ga, gb = int(self.gpu_offsets[i]), int(self.gpu_offsets[i + 1])
            for g in node.gpus_used:
                if not 0 <= g < gb - ga:
                    raise PlacementError(f"state: node {node.name} has no GPU index {g}")
                gpu_free[ga + g] = 0
            fa, fb = int(self.fpga_offsets[i]), int(self.fpga_offsets[i + 1])
            for f in node.fpgas_used:
                if not 0 <= f < fb - fa:
                    raise PlacementError(f"state: node {node.name} has no FPGA index {f}")
                fpga_free[fa + f] = 0
            used = self._cores_in_use(i, node.cpus_alloc, node.gpus_used, node.cpu_ids())
            ca = int(self.core_offsets[i])
            for c in used:
                core_free[ca + c] = 0
            mem_free[i] = max(0, int(self.mem_total_mib[i]) - node.mem_alloc_mib)
            ends = [j.end_time for j in node.jobs if j.end_time is not None]
            if ends:
                free_at[i] = min(ends)
        state = StateArrays(available, gpu_free, fpga_free, core_free, mem_free, free_at,
                            time=live.time)
        out = self.with_arrays(state)
        # place() estimates "when" by replaying job ends, which needs the jobs, not the arrays.
        out._cache["live"] = live
        return out

    def _cores_in_use(
        self, i: int, cpus_alloc: int, gpus_used: Sequence[int], cpu_ids: Sequence[int] | None
    ) -> list[int]:
        """Node-local cores in use: exact from CPU ids, else attributed by NUMA domain.

        Slurm numbers CPUs core-major (CPU = core * threads + thread), so a CPU id maps to
        core ``id // threads``. Without ids, the allocated count is rounded up to whole cores
        and attributed to the NUMA domains of the GPUs in use first (Slurm binds a GPU job's
        cores next to its GPUs when gres.conf lists ``Cores=``), then to the other domains in
        order, lowest cores first.
        """
        threads = int(self.threads_per_core[i])
        total = int(self.cores_total[i])
        if cpu_ids is not None:
            return sorted({c // threads for c in cpu_ids if 0 <= c // threads < total})
        want = min(total, -(-max(cpus_alloc, 0) // threads))
        da, db = int(self.numa_offsets[i]), int(self.numa_offsets[i + 1])
        ga = int(self.gpu_offsets[i])
        first = sorted({int(self.gpu_numa[ga + g]) for g in gpus_used})
        order = first + [d for d in range(db - da) if d not in first]
        starts = np.concatenate(([0], np.cumsum(self.numa_cores[da:db])))
        used: list[int] = []
        for d in order:
            take = min(want - len(used), int(self.numa_cores[da + d]))
            used += range(int(starts[d]), int(starts[d]) + take)
            if len(used) == want:
                break
        return sorted(used)

    # ------------------------------------------------------------------ kernels
    def core(self) -> PlacementCore:
        """The compiled core over this model's arrays and state (built once, cached).

        Raises:
            CoreNotBuiltError: The extension is missing.
        """
        cached = self._cache.get("core")
        if cached is None:
            cached = self.new_core()
            self._cache["core"] = cached
        return cached

    def new_core(self, state: StateArrays | None = None) -> PlacementCore:
        """A fresh core with its own copy of the state (batch placement consumes it), or of
        ``state`` (trusted: the replay's own arrays, of this model's shapes and dtypes)."""
        from hetslurm.placement._load import load_core

        return load_core().PlacementCore(**self.core_arguments(state))

    def core_arguments(self, state: StateArrays | None = None) -> dict[str, Any]:
        """The keyword arguments of ``hetslurm._core.PlacementCore`` for this model and
        ``state`` (default: the model's own): every array the kernels index, in one place."""
        s = self.state if state is None else state
        return {
            "cores_total": self.cores_total,
            "mem_total": self.mem_total_mib,
            "gpu_model": self.gpu_model,
            "gpu_offsets": self.gpu_offsets,
            "gpu_island": self.gpu_island,
            "gpu_numa": self.gpu_numa,
            "gpu_mem": self.gpu_mem_mib,
            "fpga_model": self.fpga_model,
            "fpga_offsets": self.fpga_offsets,
            "numa_offsets": self.numa_offsets,
            "core_offsets": self.core_offsets,
            "core_numa": self.core_numa,
            "leaf": self.leaf,
            "switch_parent": self.switch_parent,
            "switch_level": self.switch_level,
            "weight": self.weight,
            "gpu_dyn_w": self._dyn("gpu"),
            "fpga_dyn_w": self._dyn("fpga"),
            "n_gpu_models": len(self.gpu_models),
            "n_fpga_models": len(self.fpga_models),
            "available": s.available,
            "gpu_free": s.gpu_free,
            "fpga_free": s.fpga_free,
            "core_free": s.core_free,
            "mem_free": s.mem_free_mib,
            "load_milli": s.load_milli,
        }

    def _dyn(self, kind: str) -> npt.NDArray[np.int32]:
        """Busy-minus-idle watts of one device per node, never negative."""
        key = f"dyn_{kind}"
        if key not in self._cache:
            busy = self.gpu_busy_w if kind == "gpu" else self.fpga_busy_w
            idle = self.gpu_idle_w if kind == "gpu" else self.fpga_idle_w
            self._cache[key] = _ro(np.maximum(busy - idle, 0).astype(np.int32))
        out: npt.NDArray[np.int32] = self._cache[key]
        return out


def _levels(parent: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Switch levels (leaf 0, else 1 + highest child); refuses cycles."""
    s = len(parent)
    level = np.zeros(s, dtype=np.int32)
    for start in range(s):
        cur, height, seen = start, 0, set()
        while cur >= 0:
            if cur in seen:
                raise PlacementError("the switch tree has a cycle")
            seen.add(cur)
            level[cur] = max(level[cur], height)
            cur = int(parent[cur])
            height += 1
    return level


def _check_node(n: NodeLayout) -> None:
    def bad(message: str) -> PlacementError:
        return PlacementError(f"node {n.name}: {message}")

    if not n.cores_per_numa or len(n.cores_per_numa) > MAX_NUMA:
        raise bad(f"needs 1..{MAX_NUMA} NUMA domains")
    if min(n.cores_per_numa) < 1 or sum(n.cores_per_numa) > MAX_NODE_CORES:
        raise bad(f"each NUMA domain needs >= 1 core, at most {MAX_NODE_CORES} in all")
    if not 1 <= n.mem_mib <= MAX_MEM_MIB:
        raise bad("memory out of range")
    if len(n.gpus) > MAX_NODE_DEVICES or not 0 <= n.fpgas <= MAX_NODE_DEVICES:
        raise bad(f"at most {MAX_NODE_DEVICES} GPUs and FPGAs")
    if bool(n.gpus) != (n.gpu_model is not None) and n.gpus:
        raise bad("GPUs without a model")
    if n.fpgas and n.fpga_model is None:
        raise bad("FPGAs without a model")
    for g in n.gpus:
        if not 0 <= g.numa < len(n.cores_per_numa):
            raise bad(f"GPU NUMA domain {g.numa} is not one of its domains")
        if not 0 <= g.island < 1 << 31 or not 0 <= g.memory_mib <= MAX_MEM_MIB:
            raise bad("GPU island or memory out of range")
    if not 0 <= n.weight < MAX_WEIGHT or not 1 <= n.threads_per_core <= 8:
        raise bad("weight or threads per core out of range")
    watts = (n.power_idle_w, n.power_busy_w, n.gpu_idle_w, n.gpu_busy_w, n.fpga_idle_w,
             n.fpga_busy_w)
    if not all(0 <= w <= MAX_WATTS for w in watts):
        raise bad(f"power must be within 0..{MAX_WATTS} W")


def _empty_state(n: int, g: int, f: int, c: int, mem: Sequence[int]) -> StateArrays:
    return StateArrays(
        available=_ro(np.ones(n, dtype=np.uint8)),
        gpu_free=_ro(np.ones(g, dtype=np.uint8)),
        fpga_free=_ro(np.ones(f, dtype=np.uint8)),
        core_free=_ro(np.ones(c, dtype=np.uint8)),
        mem_free_mib=_ro(np.asarray(mem, dtype=np.int64).reshape(-1)),
        free_at=_ro(np.full(n, math.inf)),
    )
