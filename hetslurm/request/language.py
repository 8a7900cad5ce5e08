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
* :func:`resolve` — what a :class:`Request` means on one site, decided by the hook's own Lua
  (``hethook.resolve``): models checked, ``class=`` expanded into device models, partition
  and QOS, ``min-gpu-mem`` and ``energy=low`` turned into the models the hook enforces.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from hetslurm.errors import PlacementError

if TYPE_CHECKING:
    from hetslurm.site.model import Site

Level = Literal["required", "preferred"]
Priority = Literal["high", "normal", "low"]
Energy = Literal["normal", "low"]
OnIdle = Literal["notify", "requeue", "downgrade"]


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
    #: ``wait-for=first``: wait for the first model of a ranked GPU list instead of falling
    #: back at once; ``wait_for_max_s`` bounds that wait (``wait-for=first,max=30m``).
    wait_for: Literal["first"] | None = None
    wait_for_max_s: int | None = None
    #: Keys the text named, in order (``gpus``, ``gpu-type``, ...): an explicit value versus a
    #: default, which the hook's precedence rules and :func:`resolve` need.
    given: tuple[str, ...] = ()
    #: Set by :func:`resolve` from the workload class; the grammar has no key for them.
    partition: str | None = None
    qos: str | None = None
    #: The class runs on CPU-only nodes (its devices are ``["cpu"]``); set by :func:`resolve`.
    cpu_only: bool = False
    #: ``gpu_models`` before ``energy=low`` narrowed them (what rebalance's relax may widen a
    #: pending job back to); set by :func:`resolve`, equal to ``gpu_models`` when nothing was
    #: narrowed.
    own_gpu_models: tuple[str, ...] = ()
    #: Ranked fallback (docs/fallback.md), set by :func:`resolve`: the per-model partitions
    #: the hook submits the job to, in its order (only the first with ``wait-for=first``),
    #: and the whole ranked list; empty when the job has no ranked GPU list there.
    partitions: tuple[str, ...] = ()
    rank_all: tuple[str, ...] = ()


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
    from hetslurm.request import _lua

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
    known = {f for f in Request.__dataclass_fields__} - {"partition", "qos", "cpu_only",
                                                         "own_gpu_models", "partitions",
                                                         "rank_all"}
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
    wait_for = table.get("wait_for")
    if wait_for not in (None, "first"):
        raise ValueError(f"hetreq wait_for={wait_for!r} is not 'first'")
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
        wait_for=wait_for,
        wait_for_max_s=_opt_int(table, "wait_for_max_s"),
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
    :func:`resolve` sets (``partition``, ``qos``, ``cpu_only``, ``own_gpu_models``), which
    have no key.
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
    elif "gpu-type" in r.given and (r.gpus_per_node or r.gpus_per_job):
        words.append("gpu-type=any")  # explicit: it beats the class's models
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
    if r.wait_for is not None:
        bound = f",max={r.wait_for_max_s}" if r.wait_for_max_s is not None else ""
        words.append(f"wait-for={r.wait_for}{bound}")
    return " ".join(words)


# Resolving against a site ---------------------------------------------------------------------


def resolve(request: Request, site: Site, *, job_partition: str | None = None) -> Request:
    """What ``request`` means on ``site``, decided by the hook's own Lua (``hethook.resolve``).

    The meaning is written once, in the Lua that slurmctld runs (docs/directives.md): an
    explicit ``gpu-type=`` (``any`` included) beats the class's GPU models; ``min-gpu-mem``
    keeps the models with enough memory; ``energy=low`` narrows them to the site's
    low-energy models when any acceptable one is; a ``devices = ["cpu"]`` class runs on
    CPU-only nodes; ``priority=`` picks the site's QOS for it, else the class's. Python runs
    that same function through lupa on the request's canonical text and the rules rendered
    from ``site``, so ``place``, ``explain``, ``simulate`` and ``relax`` read what the hook
    enforces.

    ``job_partition`` is the job's own ``--partition`` when it names one: ranked fallback
    then ranks inside it (or not at all, when it differs from the class's).

    Returns:
        A new :class:`Request` with ``gpu_models`` (the models the hook enforces, in
        preference order), ``own_gpu_models`` (before ``energy=low`` narrowed them),
        ``fpga_models``, ``partition``, ``qos``, ``cpu_only``, and ``partitions`` /
        ``rank_all`` (ranked fallback's per-model partitions).

    Raises:
        PlacementError: the hook would reject the request on this site (its message, without
            the line prefix), or lupa is missing.
    """
    out = _resolved(_site_meaning(site), format_request(request), job_partition)
    if isinstance(out, str):
        raise PlacementError(out)
    gpu, own, fpga, partition, qos, cpu_only, ranked, rank_all = out
    return replace(
        request,
        gpu_models=gpu if gpu is not None else (),
        own_gpu_models=own if own is not None else (),
        fpga_models=fpga if fpga is not None else request.fpga_models,
        partition=partition,
        qos=qos,
        cpu_only=cpu_only,
        partitions=tuple(ranked.split(",")) if ranked else (),
        rank_all=tuple(rank_all.split(",")) if rank_all else (),
    )


_MEANINGS: dict[int, tuple[Site, Any]] = {}


def _site_meaning(site: Site) -> Any:
    """The hook's resolve for ``site``'s rendered rules (one Lua runtime per site object)."""
    hit = _MEANINGS.get(id(site))
    if hit is not None and hit[0] is site:
        return hit[1]
    from hetslurm.request import _lua
    from hetslurm.site.hook_rules import hook_rules, lua_literal

    fn = _lua.meaning(lua_literal(hook_rules(site)))
    if len(_MEANINGS) >= 64:
        _MEANINGS.clear()
    _MEANINGS[id(site)] = (site, fn)
    return fn


_Resolved = tuple[tuple[str, ...] | None, tuple[str, ...] | None, tuple[str, ...] | None,
                  str | None, str | None, bool, str | None, str | None]


@functools.lru_cache(maxsize=4096)
def _resolved(fn: Any, text: str, job_partition: str | None = None) -> _Resolved | str:
    """The Lua result for one request text as plain values, or the rejection's message."""
    from hetslurm.request import _lua

    result = fn(text.encode("utf-8", "surrogatepass"),
                None if job_partition is None else job_partition.encode("utf-8", "replace"))
    parts = tuple(result) if isinstance(result, tuple) else (result,)
    first, third = parts[0], (parts[2] if len(parts) > 2 else None)
    if first is None:
        return str(_lua.to_python(third)) if third is not None else "invalid request"
    r = _lua.to_python(first)
    if not isinstance(r, dict):
        raise TypeError(f"hethook.resolve returned {r!r}, not a table")

    def models(key: str) -> tuple[str, ...] | None:
        value = r.get(key)
        if value is None:
            return None
        return tuple(value) if isinstance(value, list) else ()

    def word(key: str) -> str | None:
        value = r.get(key)
        return value if isinstance(value, str) else None

    return (models("gpu_models"), models("own_gpu_models"), models("fpga_models"),
            word("partition"), word("qos"), bool(r.get("cpu_only")), word("partitions"),
            word("rank_all"))
