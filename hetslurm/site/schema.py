"""The site file's schema: frozen, typed, strict, unknown keys refused.

These pydantic models describe what may be *written* in a site file. Cross-references
(which nodes a partition names, which GPUs an NVLink island holds) are checked afterwards
by :mod:`hetslurm.site.load`, which also resolves the file into :class:`hetslurm.site.model.Site`.

Limits ("absurd counts") are deliberately generous but finite: a typo such as
``count = 80`` GPUs in a node is caught, a real 8-GPU or 16-socket machine is not.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
)

SCHEMA_VERSION = 1

MAX_DEVICES_PER_NODE = 64
MAX_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB
MAX_WATTS = 100_000

_MEM_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEM_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def _memory_mib(value: Any) -> Any:
    """Accept an integer (MiB, as slurm.conf's RealMemory) or a string such as "16G"."""
    if isinstance(value, bool):
        raise ValueError("memory must be a number of MiB or a string such as '16G'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _MEM_RE.match(value)
        if not m:
            raise ValueError(f"'{value}' is not a memory size; write e.g. 16000 (MiB) or '16G'")
        mib = int(m.group(1)) * _MEM_FACTOR[m.group(2).upper()]
        if mib != int(mib):
            raise ValueError(f"'{value}' is not a whole number of MiB")
        return int(mib)
    raise ValueError("memory must be a number of MiB or a string such as '16G'")


MemoryMiB = Annotated[int, BeforeValidator(_memory_mib), Field(ge=1, le=MAX_MEMORY_MIB)]
Watts = Annotated[StrictFloat, Field(ge=0, le=MAX_WATTS)]


class _Strict(BaseModel):
    # Lax mode so TOML arrays become tuples; scalars use Strict* types so "4" is not a count.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceGroup(_Strict):
    """GPUs or FPGAs of one model in a node class."""

    model: str
    count: Annotated[StrictInt, Field(ge=1, le=MAX_DEVICES_PER_NODE)]
    memory: MemoryMiB | None = None
    #: GPU indices grouped by NVLink island; a GPU in no island is an island of its own.
    nvlink_islands: tuple[tuple[StrictInt, ...], ...] = ()
    #: NUMA domain of each device by index; default: islands map to domains when their
    #: numbers match, otherwise devices are spread evenly in index order.
    numa: tuple[StrictInt, ...] | None = None
    power_idle_watts: Watts | None = None
    power_busy_watts: Watts | None = None
    #: Device files as a hostlist expression (``/dev/nvidia[0-7]``); the default follows the
    #: driver's naming. The testbed replaces it with its own character devices.
    files: str | None = None


class NodeClass(_Strict):
    """One kind of node: cores and NUMA layout, memory, devices, power."""

    sockets: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    cores_per_socket: Annotated[StrictInt, Field(ge=1, le=1024)]
    threads_per_core: Annotated[StrictInt, Field(ge=1, le=8)] = 1
    #: NUMA domains; cores split evenly between them in core order. Default: one per socket.
    numa_nodes: Annotated[StrictInt, Field(ge=1, le=64)] | None = None
    memory: MemoryMiB
    gpus: DeviceGroup | None = None
    fpgas: DeviceGroup | None = None
    #: Extra node features; hetslurm adds gpu/fpga/cpu and the device model names itself.
    features: tuple[str, ...] = ()
    power_idle_watts: Watts = 0.0
    power_busy_watts: Watts = 0.0


class Partition(_Strict):
    """A Slurm partition over a hostlist expression of site nodes (or ``ALL``)."""

    nodes: str
    default: StrictBool = False
    max_time: str = "UNLIMITED"
    default_time: str | None = None
    #: Extra raw ``Key=Value`` partition options hetslurm does not model (e.g. OverSubscribe).
    options: dict[str, str] = Field(default_factory=dict)


class Switch(_Strict):
    """A switch of the tree: a leaf lists nodes, an upper level lists switches."""

    nodes: str | None = None
    switches: tuple[str, ...] = ()
    #: Relative link speed, rendered as topology.conf ``LinkSpeed``.
    link_speed: Annotated[StrictInt, Field(ge=1)] | None = None


class Scheduling(_Strict):
    """Site-wide order of preference between device models.

    Rendered as node ``Weight=`` (Slurm allocates the lowest weight first), so an OR of
    model features (``h100|a100``) falls back in this order. CPU-only nodes get the lowest
    weight of all so CPU work fills them before it touches a device node.
    """

    gpu_model_order: tuple[str, ...] = ()
    fpga_model_order: tuple[str, ...] = ()
    #: Default memory per CPU in MiB (``DefMemPerCPU``) so jobs without ``--mem`` share nodes.
    def_mem_per_cpu: MemoryMiB | None = None


class WorkloadClass(_Strict):
    """A workload class users name with ``#HET class=`` (the hook issue extends this)."""

    devices: tuple[str, ...] = ()
    partition: str | None = None
    qos: str | None = None
    description: str = ""


class SiteFile(_Strict):
    """The whole file as written. Named sections beyond the core live in ``SECTIONS``."""

    schema_version: StrictInt
    name: str
    description: str = ""
    scheduling: Scheduling = Scheduling()
    node_classes: dict[str, NodeClass]
    nodes: dict[str, str]
    partitions: dict[str, Partition] = Field(default_factory=dict)
    switches: dict[str, Switch] = Field(default_factory=dict)


#: Named sections later capabilities add, each with its own schema. A file that lacks a
#: section gets its default; a new capability registers its section here (or through
#: :func:`register_section`) without touching ``SiteFile``, so old files keep loading.
SECTIONS: dict[str, tuple[Any, Any]] = {
    # name: (type validated by pydantic, default when absent)
    "classes": (dict[str, WorkloadClass], {}),
}


def register_section(name: str, type_: Any, default: Any) -> None:
    """Add a named top-level section with its own schema (used by later capabilities)."""
    if name in SiteFile.model_fields or name in SECTIONS:
        raise ValueError(f"site section '{name}' is already defined")
    SECTIONS[name] = (type_, default)
