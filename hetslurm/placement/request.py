"""The request: what a job needs, in one typed form for the whole project.

The text grammar (``gpus=4 gpu-type=h100|a100 locality=nvlink``) is parsed by the Lua module
``job_submit/hetreq.lua`` — the same code the job_submit hook runs inside slurmctld — and
reaches Python through lupa (:func:`parse_request`), so the grammar exists once.
``docs/requests.md`` documents every element and how Slurm 22.05 enacts it.

Three steps, each a pure function:

* :func:`parse_request` — text to :class:`Request` through the Lua grammar (syntax, bounds and
  the request's own consistency);
* :func:`request_from_table` — the table hetreq.lua returns to :class:`Request` (also what
  ``explain`` uses on tables the hook produced);
* :func:`format_request` — the canonical text of a :class:`Request` (round-trips);
* :func:`resolve` — a :class:`Request` checked against one site: models exist, ``class=``
  expanded into device models, partition and QOS, ``min-gpu-mem`` turned into models.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from hetslurm.errors import PlacementError

if TYPE_CHECKING:
    from hetslurm.site.model import Site
    from hetslurm.site.schema import WorkloadClass

Level = Literal["required", "preferred"]
Priority = Literal["high", "normal", "low"]
Energy = Literal["normal", "low"]
OnIdle = Literal["notify", "requeue", "downgrade"]

#: A class whose devices are only this pseudo-model runs on CPU-only nodes (feature ``cpu``).
CPU_DEVICE = "cpu"


@dataclass(frozen=True)
class Locality:
    """Locality levels; in-node (nvlink, numa) and across-node (switch) are independent.

    ``None`` means "do not care". ``switch_wait_s`` is how long Slurm may hold the job
    waiting for one leaf switch before it spans (``--switches=1@<wait>``).
    """

    nvlink: Level | None = None
    numa: Level | None = None
    switch: Level | None = None
    switch_wait_s: int | None = None


@dataclass(frozen=True)
class Request:
    """One job's needs. Counts are per node unless named ``*_per_job``.

    ``gpu_models`` is a ranked any-of list (first = most wanted); empty means any model.
    ``gpus_per_job`` (when set) is split evenly over ``nodes``; ``gpus_per_node`` is then
    derived and must divide exactly.
    """

    nodes: int = 1
    gpus_per_node: int = 0
    gpus_per_job: int | None = None
    gpu_models: tuple[str, ...] = ()
    min_gpu_mem_mib: int | None = None
    fpgas_per_node: int = 0
    fpga_models: tuple[str, ...] = ()
    cores_per_node: int = 1
    mem_per_node_mib: int | None = None
    locality: Locality = field(default_factory=Locality)
    workload_class: str | None = None
    priority: Priority = "normal"
    energy: Energy = "normal"
    no_requeue: bool = False
    on_idle: str | None = None
    #: Keys the text named, in order (``gpus``, ``gpu-type``, ...): an explicit value versus a
    #: default, which the hook's precedence rules and :func:`resolve` need.
    given: tuple[str, ...] = ()
    #: Set by :func:`resolve` from the workload class; the grammar has no key for them.
    partition: str | None = None
    qos: str | None = None
    #: The class runs on CPU-only nodes (its devices are ``["cpu"]``); set by :func:`resolve`.
    cpu_only: bool = False

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


# Parsing --------------------------------------------------------------------------------------


def parse_request(text: str) -> Request:
    """Parse request text (``gpus=4 gpu-type=h100|a100 locality=nvlink``).

    The grammar is ``job_submit/hetreq.lua``, run through lupa's Lua 5.1; see
    ``docs/requests.md``. Models are only checked for their spelling here; :func:`resolve`
    checks them against a site.

    Raises:
        PlacementError: the text is not a valid request (the message names the token and
            what is accepted), or lupa is missing.
    """
    from hetslurm.placement import _lua

    return request_from_table(_lua.parse_table(text))


_LOCALITY_FIELDS = frozenset({"nvlink", "numa", "switch", "switch_wait_s"})
_LEVELS = frozenset(get_args(Level))


def request_from_table(table: Mapping[str, Any]) -> Request:
    """Build a :class:`Request` from the table ``hetreq.parse`` returns (as plain Python).

    The table is trusted to be hetreq's, but its shape is checked field by field so that a
    drift between the Lua module and this dataclass fails loudly.

    Raises:
        ValueError: a field is unknown or has the wrong type (a bug, not a user error).
    """
    known = {f for f in Request.__dataclass_fields__} - {"partition", "qos", "cpu_only"}
    # ``tokens`` (key -> the word that gave it) is the hook's fast "was this key given?"
    # set; it must name exactly the keys of ``given``.
    unknown = set(table) - known - {"tokens"}
    if unknown:
        raise ValueError(f"hetreq table has fields Request does not know: {sorted(unknown)}")
    tokens = table.get("tokens") or {}
    if not isinstance(tokens, Mapping) or set(tokens) != set(table.get("given") or ()):
        raise ValueError(f"hetreq tokens={tokens!r} do not match given={table.get('given')!r}")
    loc = table.get("locality") or {}
    if not isinstance(loc, Mapping) or set(loc) - _LOCALITY_FIELDS:
        raise ValueError(f"hetreq locality table is malformed: {loc!r}")
    levels: dict[str, Level | None] = {}
    for name in ("nvlink", "numa", "switch"):
        value = loc.get(name)
        if value is not None and value not in _LEVELS:
            raise ValueError(f"hetreq locality {name}={value!r} is not a level")
        levels[name] = cast("Level | None", value)
    locality = Locality(
        nvlink=levels["nvlink"],
        numa=levels["numa"],
        switch=levels["switch"],
        switch_wait_s=_opt_int(loc, "switch_wait_s"),
    )
    priority = _choice(table, "priority", get_args(Priority), "normal")
    energy = _choice(table, "energy", get_args(Energy), "normal")
    on_idle = table.get("on_idle")
    if on_idle is not None and on_idle not in get_args(OnIdle):
        raise ValueError(f"hetreq on_idle={on_idle!r} is not an action")
    no_requeue = table.get("no_requeue", False)
    if not isinstance(no_requeue, bool):
        raise ValueError(f"hetreq no_requeue={no_requeue!r} is not a boolean")
    workload_class = table.get("workload_class")
    if workload_class is not None and not isinstance(workload_class, str):
        raise ValueError(f"hetreq workload_class={workload_class!r} is not a string")
    return Request(
        nodes=_int(table, "nodes", 1),
        gpus_per_node=_int(table, "gpus_per_node", 0),
        gpus_per_job=_opt_int(table, "gpus_per_job"),
        gpu_models=_strs(table, "gpu_models"),
        min_gpu_mem_mib=_opt_int(table, "min_gpu_mem_mib"),
        fpgas_per_node=_int(table, "fpgas_per_node", 0),
        fpga_models=_strs(table, "fpga_models"),
        cores_per_node=_int(table, "cores_per_node", 1),
        mem_per_node_mib=_opt_int(table, "mem_per_node_mib"),
        locality=locality,
        workload_class=workload_class,
        priority=cast(Priority, priority),
        energy=cast(Energy, energy),
        no_requeue=no_requeue,
        on_idle=on_idle,
        given=_strs(table, "given"),
    )


def _opt_int(table: Mapping[str, Any], key: str) -> int | None:
    value = table.get(key)
    if value is None:
        return None
    # Lua 5.1 numbers are doubles; lupa hands integral ones over as int, but accept an
    # integral float too and refuse anything else.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"hetreq {key}={value!r} is not a non-negative integer")
    return value


def _int(table: Mapping[str, Any], key: str, default: int) -> int:
    value = _opt_int(table, key)
    return default if value is None else value


def _strs(table: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = table.get(key)
    if value is None or (isinstance(value, Mapping) and not value):
        return ()  # an empty Lua table converts to {}
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"hetreq {key}={value!r} is not a list")
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"hetreq {key}={value!r} holds a non-string")
    return tuple(value)


def _choice(table: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = table.get(key, default)
    if value not in allowed:
        raise ValueError(f"hetreq {key}={value!r} is not one of {allowed}")
    return cast(str, value)


def format_request(request: Request) -> str:
    """The canonical text of a request: keys in documentation order, defaults left out.

    ``parse_request(format_request(r))`` equals ``r`` apart from ``given`` and the fields
    :func:`resolve` sets (``partition``, ``qos``, ``cpu_only``), which have no key.
    """
    r = request
    words: list[str] = []
    if r.nodes != 1:
        words.append(f"nodes={r.nodes}")
    if r.gpus_per_job is not None:
        words.append(f"gpus={r.gpus_per_job}")
    elif r.gpus_per_node:
        words.append(f"gpus-per-node={r.gpus_per_node}")
    if r.gpu_models:
        words.append("gpu-type=" + "|".join(r.gpu_models))
    if r.min_gpu_mem_mib is not None:
        words.append(f"min-gpu-mem={r.min_gpu_mem_mib}M")
    if r.fpga_models:
        words.append("fpga=" + "|".join(r.fpga_models) + f":{r.fpgas_per_node}")
    elif r.fpgas_per_node:
        words.append(f"fpga={r.fpgas_per_node}")
    if r.cores_per_node != 1:
        words.append(f"cores={r.cores_per_node}")
    if r.mem_per_node_mib is not None:
        words.append(f"mem={r.mem_per_node_mib}M")
    loc = r.locality
    items = [
        f"{name}:{level}"
        for name, level in (("nvlink", loc.nvlink), ("numa", loc.numa), ("switch", loc.switch))
        if level is not None
    ]
    if items:
        words.append("locality=" + ",".join(items))
    if loc.switch_wait_s is not None:
        words.append(f"switch-wait={loc.switch_wait_s}")
    if r.workload_class is not None:
        words.append(f"class={r.workload_class}")
    if r.priority != "normal":
        words.append(f"priority={r.priority}")
    if r.energy != "normal":
        words.append(f"energy={r.energy}")
    if r.no_requeue:
        words.append("no-requeue")
    if r.on_idle is not None:
        words.append(f"on-idle={r.on_idle}")
    return " ".join(words)


# Resolving against a site ---------------------------------------------------------------------


def resolve(request: Request, site: Site) -> Request:
    """Check ``request`` against ``site`` and make its class and memory floor explicit.

    Precedence (documented in docs/requests.md):

    1. an explicit ``gpu-type=`` (``any`` included) or ``fpga=model...`` beats the class's
       devices of that kind; ``fpga=N`` without a model takes the class's FPGA models;
    2. the class's devices rank only the kinds the request asks for; a class of
       ``devices = ["cpu"]`` runs on CPU-only nodes and refuses GPU or FPGA counts;
    3. ``min-gpu-mem`` drops, from the class's or the site's models, those with less memory
       (in the site's order); a model the user named that is too small is an error.

    Returns:
        A new :class:`Request` with ``gpu_models``/``fpga_models`` expanded, ``partition``,
        ``qos`` and ``cpu_only`` from the class.

    Raises:
        PlacementError: an unknown class or model, a class that contradicts the request, or
            no GPU model with enough memory.
    """
    gpu_site = site.gpu_models()
    fpga_site = site.fpga_models()
    gpu_models = request.gpu_models
    fpga_models = request.fpga_models
    partition = qos = None
    cpu_only = False
    explicit_gpu_models = "gpu-type" in request.given and bool(gpu_models)
    explicit_fpga_models = bool(fpga_models)

    for m in gpu_models:
        _check_model(m, gpu_site, "GPU", "gpu-type", site)
    for m in fpga_models:
        _check_model(m, fpga_site, "FPGA", "fpga", site)
    if request.gpus_per_node and not gpu_site:
        raise PlacementError(f"the request asks for GPUs; site '{site.name}' has none")
    if request.fpgas_per_node and not fpga_site:
        raise PlacementError(f"the request asks for FPGAs; site '{site.name}' has none")

    if request.workload_class is not None:
        wc = _workload_class(request.workload_class, site)
        partition, qos = wc.partition, wc.qos
        name = request.workload_class
        unknown = [d for d in wc.devices if d != CPU_DEVICE and d not in (*gpu_site, *fpga_site)]
        if unknown:
            raise PlacementError(
                f"class '{name}' names device {unknown[0]!r}, which site '{site.name}' lacks"
            )
        if CPU_DEVICE in wc.devices:
            if len(wc.devices) > 1:
                raise PlacementError(
                    f"class '{name}' mixes 'cpu' with device models; fix the site's [classes]"
                )
            if request.gpus_per_node or request.fpgas_per_node:
                raise PlacementError(
                    f"class={name} runs on CPU-only nodes; drop the GPU/FPGA keys or choose "
                    f"another class ({_class_names(site)})"
                )
            cpu_only = True
        if request.gpus_per_node and "gpu-type" not in request.given:
            gpu_models = tuple(d for d in wc.devices if d in gpu_site)
        if request.fpgas_per_node and not explicit_fpga_models:
            fpga_models = tuple(d for d in wc.devices if d in fpga_site)

    if request.min_gpu_mem_mib is not None:
        gpu_models = _with_memory(
            request.min_gpu_mem_mib, gpu_models or gpu_site, explicit_gpu_models, site
        )

    return replace(
        request,
        gpu_models=gpu_models,
        fpga_models=fpga_models,
        partition=partition,
        qos=qos,
        cpu_only=cpu_only,
    )


def _check_model(model: str, known: tuple[str, ...], kind: str, key: str, site: Site) -> None:
    if model in known:
        return
    close = difflib.get_close_matches(model, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    offered = ", ".join(known) if known else "none"
    raise PlacementError(
        f"{key}: {kind} model '{model}' is not in site '{site.name}'{hint}; its {kind} models: "
        f"{offered}"
    )


def _class_names(site: Site) -> str:
    classes = site.sections.get("classes") or {}
    return ", ".join(sorted(classes)) or "the site defines none"


def _workload_class(name: str, site: Site) -> WorkloadClass:
    classes: Mapping[str, WorkloadClass] = site.sections.get("classes") or {}
    if name in classes:
        return classes[name]
    close = difflib.get_close_matches(name, list(classes), n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise PlacementError(
        f"class={name}: site '{site.name}' has no such class{hint}; classes: {_class_names(site)}"
    )


def gpu_memory_mib(site: Site) -> dict[str, int | None]:
    """Memory per GPU model in MiB (:meth:`hetslurm.site.Site.gpu_memory_mib`)."""
    return site.gpu_memory_mib()


def _with_memory(
    floor_mib: int, models: tuple[str, ...], explicit: bool, site: Site
) -> tuple[str, ...]:
    memory = gpu_memory_mib(site)

    def size(m: str) -> str:
        mib = memory.get(m)
        return "unknown" if mib is None else f"{mib} MiB"

    keep = tuple(m for m in models if (memory.get(m) or 0) >= floor_mib)
    if explicit and keep != models:
        small = [m for m in models if m not in keep]
        raise PlacementError(
            f"min-gpu-mem={floor_mib}M: gpu-type {small[0]} has {size(small[0])}; drop it or "
            "lower min-gpu-mem"
        )
    if not keep:
        sizes = ", ".join(f"{m} {size(m)}" for m in models)
        raise PlacementError(f"min-gpu-mem={floor_mib}M: no GPU model qualifies ({sizes})")
    return keep
