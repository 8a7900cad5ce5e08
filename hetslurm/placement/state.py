"""Live cluster state: what is in use now, and when it frees up.

:class:`LiveState` is plain data: per node the GPU and FPGA indices in use, allocated CPUs and
memory, whether Slurm would start new work there, and the running jobs with their expected
end times. It comes from a Slurm backend (:meth:`LiveState.from_backend`) or from a JSON file
(:meth:`LiveState.from_json`, schema ``hetslurm-state/1``, documented in docs/placement.md),
and becomes kernel arrays through :meth:`hetslurm.placement.model.ClusterModel.with_state`.

Placement never imports the Slurm access layer (docs/ARCHITECTURE: placement must not know
where its arrays came from); :meth:`LiveState.from_backend` reads any object with the
``nodes()``/``jobs()`` shape of :class:`hetslurm.slurm.backend.SlurmBackend`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from hetslurm.errors import PlacementError

SCHEMA = "hetslurm-state/1"
#: Job states whose resources are held (Slurm 22.05 keeps a COMPLETING job's GRES until its
#: epilog ends; a SUSPENDED job keeps its GRES and memory).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})


class _GresLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def indices(self) -> tuple[int, ...] | None: ...


class NodeLike(Protocol):
    """What :meth:`LiveState.from_backend` reads of a node (``hetslurm.slurm.NodeInfo``)."""

    @property
    def name(self) -> str: ...
    @property
    def state(self) -> frozenset[str]: ...
    @property
    def unavailable(self) -> bool: ...
    @property
    def cpus_alloc(self) -> int: ...
    @property
    def memory_alloc_mib(self) -> int: ...
    @property
    def gres_used_indices(self) -> Mapping[tuple[str, str | None], tuple[int, ...]]: ...


class JobLike(Protocol):
    """What :meth:`LiveState.from_backend` reads of a job (``hetslurm.slurm.JobInfo``)."""

    @property
    def job_id(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def start_time(self) -> datetime | None: ...
    @property
    def end_time(self) -> datetime | None: ...
    @property
    def time_limit(self) -> object: ...
    @property
    def allocated_gres(self) -> Mapping[str, Sequence[_GresLike]]: ...
    @property
    def cpu_ids(self) -> Mapping[str, Sequence[int]]: ...


class BackendLike(Protocol):
    """The two reads :meth:`LiveState.from_backend` needs (``hetslurm.slurm.SlurmBackend``)."""

    def nodes(self) -> Sequence[NodeLike]: ...
    def jobs(self) -> Sequence[JobLike]: ...


@dataclass(frozen=True)
class RunningJob:
    """A job holding resources on one node.

    Attributes:
        job_id: Slurm's id, as text (``"42"``, ``"7_3"``).
        end_time: Expected end, epoch seconds (Slurm's EndTime, else start + time limit);
            None when unknown or unlimited.
        gpus: Node-local GPU indices it holds.
        fpgas: Node-local FPGA indices it holds.
        cpu_ids: Slurm CPU ids it holds on the node (``scontrol show job -d`` ``CPU_IDs=``);
            None when the source did not say.
        cpus: CPUs it holds on the node; None = unknown (the node's allocation is then
            split evenly over its jobs when one of them ends, see :meth:`LiveState.at`).
        mem_mib: Memory it holds on the node; None = unknown (split likewise).
    """

    job_id: str
    end_time: float | None = None
    gpus: tuple[int, ...] = ()
    fpgas: tuple[int, ...] = ()
    cpu_ids: tuple[int, ...] | None = None
    cpus: int | None = None
    mem_mib: int | None = None


@dataclass(frozen=True)
class NodeState:
    """One node's usage.

    Attributes:
        name: Slurm node name.
        available: False when Slurm starts no new work here (drained, down, reserved, ...).
        gpus_used / fpgas_used: Node-local indices in use.
        cpus_alloc: CPUs (hardware threads) allocated, as Slurm's CPUAlloc.
        mem_alloc_mib: Memory allocated, MiB.
        flags: Slurm state words, informational (``("MIXED", "DRAIN")``).
        jobs: Jobs holding resources here.
    """

    name: str
    available: bool = True
    gpus_used: tuple[int, ...] = ()
    fpgas_used: tuple[int, ...] = ()
    cpus_alloc: int = 0
    mem_alloc_mib: int = 0
    flags: tuple[str, ...] = ()
    jobs: tuple[RunningJob, ...] = ()

    def cpu_ids(self) -> tuple[int, ...] | None:
        """CPU ids in use, when every job here says which; else None."""
        if not self.jobs or any(j.cpu_ids is None for j in self.jobs):
            return None
        return tuple(sorted({c for j in self.jobs for c in (j.cpu_ids or ())}))


@dataclass(frozen=True)
class LiveState:
    """Usage of every node at one moment (``time``, epoch seconds)."""

    time: float
    nodes: tuple[NodeState, ...] = ()
    source: str = ""
    _by_name: dict[str, NodeState] = field(default_factory=dict, repr=False, compare=False)

    def node(self, name: str) -> NodeState:
        if not self._by_name:
            self._by_name.update({n.name: n for n in self.nodes})
        return self._by_name[name]

    # ------------------------------------------------------------------ backends
    @classmethod
    def from_backend(cls, backend: BackendLike, *, now: float | None = None) -> LiveState:
        """Read nodes and jobs from a Slurm backend.

        Device indices come from the nodes' ``GresUsed=...(IDX:...)`` and the jobs'
        allocated GRES; CPU ids from the jobs' ``cpu_ids`` (node to ids; the CLI backend
        reads them from ``scontrol show job -d``'s ``CPU_IDs=``). A job whose source gave
        no ids for a node gets ``cpu_ids=None`` there, and cores in use on that node are then
        attributed by NUMA domain (see
        :meth:`hetslurm.placement.model.ClusterModel.with_state`).
        """
        stamp = time.time() if now is None else now
        jobs_on: dict[str, list[RunningJob]] = {}
        for job in backend.jobs():
            if job.state not in HOLDING_STATES:
                continue
            end = _end_time(job)
            cpu_map = job.cpu_ids
            for host in job.nodes:
                gpus: set[int] = set()
                fpgas: set[int] = set()
                for item in job.allocated_gres.get(host, ()):
                    target = gpus if item.name == "gpu" else fpgas if item.name == "fpga" else None
                    if target is not None and item.indices:
                        target.update(item.indices)
                ids = cpu_map.get(host)
                jobs_on.setdefault(host, []).append(
                    RunningJob(
                        job_id=str(job.job_id),
                        end_time=end,
                        gpus=tuple(sorted(gpus)),
                        fpgas=tuple(sorted(fpgas)),
                        cpu_ids=None if ids is None else tuple(sorted(ids)),
                    )
                )
        nodes = []
        for info in backend.nodes():
            used: dict[str, set[int]] = {"gpu": set(), "fpga": set()}
            for (gname, _), idx in info.gres_used_indices.items():
                if gname in used:
                    used[gname].update(idx)
            nodes.append(
                NodeState(
                    name=info.name,
                    available=not info.unavailable,
                    gpus_used=tuple(sorted(used["gpu"])),
                    fpgas_used=tuple(sorted(used["fpga"])),
                    cpus_alloc=info.cpus_alloc,
                    mem_alloc_mib=info.memory_alloc_mib,
                    flags=tuple(sorted(info.state)),
                    jobs=tuple(jobs_on.get(info.name, ())),
                )
            )
        return cls(time=stamp, nodes=tuple(nodes), source=getattr(backend, "name", ""))

    # ------------------------------------------------------------------ time
    def end_times(self) -> list[float]:
        """Distinct known end times of running jobs after ``time``, ascending."""
        return sorted({j.end_time for n in self.nodes for j in n.jobs
                       if j.end_time is not None and j.end_time > self.time})

    def at(self, when: float) -> LiveState:
        """The state at ``when`` if nothing new starts: jobs ending by then release all.

        A job's CPUs and memory, when the source did not give them, are estimated as an even
        share of its node's allocation.
        """
        nodes = []
        for n in self.nodes:
            gone = [j for j in n.jobs if j.end_time is not None and j.end_time <= when]
            if not gone:
                nodes.append(n)
                continue
            keep = tuple(j for j in n.jobs if j not in gone)
            share = len(n.jobs)
            cpus = sum(j.cpus if j.cpus is not None else n.cpus_alloc // share for j in gone)
            mem = sum(j.mem_mib if j.mem_mib is not None else n.mem_alloc_mib // share
                      for j in gone)
            freed_g = {g for j in gone for g in j.gpus}
            freed_f = {f for j in gone for f in j.fpgas}
            held_g = {g for j in keep for g in j.gpus}
            held_f = {f for j in keep for f in j.fpgas}
            nodes.append(
                replace(
                    n,
                    gpus_used=tuple(g for g in n.gpus_used if g not in freed_g or g in held_g),
                    fpgas_used=tuple(f for f in n.fpgas_used if f not in freed_f or f in held_f),
                    cpus_alloc=0 if not keep else max(0, n.cpus_alloc - cpus),
                    mem_alloc_mib=0 if not keep else max(0, n.mem_alloc_mib - mem),
                    jobs=keep,
                )
            )
        return LiveState(time=max(when, self.time), nodes=tuple(nodes), source=self.source)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """The ``hetslurm-state/1`` object (see docs/placement.md)."""
        return {
            "schema": SCHEMA,
            "time": self.time,
            "source": self.source,
            "nodes": [
                {
                    "name": n.name,
                    "available": n.available,
                    "flags": list(n.flags),
                    "gpus_used": list(n.gpus_used),
                    "fpgas_used": list(n.fpgas_used),
                    "cpus_alloc": n.cpus_alloc,
                    "mem_alloc_mib": n.mem_alloc_mib,
                    "jobs": [
                        {
                            "id": j.job_id,
                            "end_time": j.end_time,
                            "gpus": list(j.gpus),
                            "fpgas": list(j.fpgas),
                            "cpu_ids": None if j.cpu_ids is None else list(j.cpu_ids),
                            "cpus": j.cpus,
                            "mem_mib": j.mem_mib,
                        }
                        for j in n.jobs
                    ],
                }
                for n in self.nodes
            ],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> LiveState:
        """Parse a ``hetslurm-state/1`` document.

        Raises:
            PlacementError: Not JSON, another schema, or a field of the wrong type (the
                message names the field).
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlacementError(f"state file is not JSON: {e}") from e
        except RecursionError as e:
            # json decodes nested arrays recursively; a state is three levels deep.
            raise PlacementError("state file is not JSON: nested too deeply") from e
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Any) -> LiveState:
        """Build from the ``hetslurm-state/1`` object (also the ``[state]`` of golden files).

        ``schema`` may be omitted (golden files); ``time`` defaults to 0, every node field
        but ``name`` to its empty value.

        Raises:
            PlacementError: Wrong schema, unknown key or wrong type; the key is named.
        """
        obj = _obj(data, "state", {"schema", "time", "source", "nodes"})
        schema = obj.get("schema", SCHEMA)
        if schema != SCHEMA:
            raise PlacementError(f"state schema is {schema!r}; this hetslurm reads {SCHEMA!r}")
        nodes = []
        for k, raw in enumerate(_list(obj.get("nodes", []), "nodes")):
            where = f"nodes[{k}]"
            n = _obj(raw, where, {"name", "available", "flags", "gpus_used", "fpgas_used",
                                  "cpus_alloc", "mem_alloc_mib", "jobs"})
            jobs = []
            for m, rawj in enumerate(_list(n.get("jobs", []), f"{where}.jobs")):
                jw = f"{where}.jobs[{m}]"
                j = _obj(rawj, jw, {"id", "end_time", "gpus", "fpgas", "cpu_ids", "cpus",
                                    "mem_mib"})
                ids = j.get("cpu_ids")
                jobs.append(
                    RunningJob(
                        job_id=str(_typed(j.get("id", ""), (str, int), f"{jw}.id")),
                        end_time=_time(j.get("end_time"), f"{jw}.end_time"),
                        gpus=_ints(j.get("gpus", []), f"{jw}.gpus"),
                        fpgas=_ints(j.get("fpgas", []), f"{jw}.fpgas"),
                        cpu_ids=None if ids is None else _ints(ids, f"{jw}.cpu_ids"),
                        cpus=_opt_count(j.get("cpus"), f"{jw}.cpus"),
                        mem_mib=_opt_count(j.get("mem_mib"), f"{jw}.mem_mib"),
                    )
                )
            nodes.append(
                NodeState(
                    name=_typed(n.get("name"), (str,), f"{where}.name"),
                    available=_typed(n.get("available", True), (bool,), f"{where}.available"),
                    flags=tuple(_typed(f, (str,), f"{where}.flags")
                                for f in _list(n.get("flags", []), f"{where}.flags")),
                    gpus_used=_ints(n.get("gpus_used", []), f"{where}.gpus_used"),
                    fpgas_used=_ints(n.get("fpgas_used", []), f"{where}.fpgas_used"),
                    cpus_alloc=_count(n.get("cpus_alloc", 0), f"{where}.cpus_alloc"),
                    mem_alloc_mib=_count(n.get("mem_alloc_mib", 0), f"{where}.mem_alloc_mib"),
                    jobs=tuple(jobs),
                )
            )
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise PlacementError("state lists a node twice")
        return cls(
            time=_time(obj.get("time", 0), "time") or 0.0,
            nodes=tuple(nodes),
            source=_typed(obj.get("source", ""), (str,), "source"),
        )


def _end_time(job: JobLike) -> float | None:
    if job.end_time is not None:
        return job.end_time.timestamp()
    limit = job.time_limit
    if job.start_time is not None and isinstance(limit, int) and not isinstance(limit, bool):
        return job.start_time.timestamp() + limit
    return None


def _obj(data: Any, where: str, keys: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise PlacementError(f"state {where} must be an object")
    unknown = set(data) - keys
    if unknown:
        raise PlacementError(f"state {where}: unknown key(s) {sorted(unknown)}")
    return data


def _list(data: Any, where: str) -> Iterable[Any]:
    if not isinstance(data, list | tuple):
        raise PlacementError(f"state {where} must be a list")
    return data


def _typed(value: Any, types: tuple[type, ...], where: str) -> Any:
    if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
        names = " or ".join(t.__name__ for t in types)
        raise PlacementError(f"state {where} must be {names}, got {value!r}")
    return value


def _count(value: Any, where: str) -> int:
    v: int = _typed(value, (int,), where)
    if v < 0:
        raise PlacementError(f"state {where} must be >= 0, got {v}")
    return v


def _opt_count(value: Any, where: str) -> int | None:
    return None if value is None else _count(value, where)


def _ints(value: Any, where: str) -> tuple[int, ...]:
    return tuple(sorted({_count(v, where) for v in _list(value, where)}))


def _time(value: Any, where: str) -> float | None:
    if value is None:
        return None
    v = _typed(value, (int, float), where)
    if not math.isfinite(v):
        raise PlacementError(f"state {where} must be finite")
    return float(v)
