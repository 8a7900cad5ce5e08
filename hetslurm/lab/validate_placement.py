"""Measure whether Slurm kept a placement: the testbed check of issue 4.

:func:`~hetslurm.placement.enact.slurm_args` turns a placement into the sbatch options that
pin what Slurm can be told; :func:`compare` reads back what Slurm gave a job and says
whether the in-node locality the placement predicted held. :func:`run_sequence` runs a
scripted sequence of mixed submissions against a live cluster and reports the figures.

This module talks to Slurm only through the objects it is handed (a backend with the
``SlurmBackend`` shape and a ``submit``/``cancel`` pair).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetslurm.placement.enact import slurm_args
from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import Placement, place
from hetslurm.placement.state import BackendLike, LiveState
from hetslurm.request.language import Request

# --- what Slurm gave, against what was predicted ----------------------------------------------


@dataclass(frozen=True)
class NodeCheck:
    """One node of a job: predicted and actual GPU indices and cores, and the verdicts."""

    name: str
    predicted_gpus: tuple[int, ...]
    actual_gpus: tuple[int, ...]
    predicted_cores: tuple[int, ...]
    actual_cores: tuple[int, ...]
    predicted_islands: int
    actual_islands: int
    predicted_numa: int
    actual_numa: int
    locality_kept: bool
    exact: bool


@dataclass(frozen=True)
class Check:
    """One submission: where it was placed, where Slurm ran it, and whether locality held."""

    request: str
    job_id: str
    predicted_nodes: tuple[str, ...]
    actual_nodes: tuple[str, ...]
    nodes: tuple[NodeCheck, ...]
    offered_held_gpu: bool

    @property
    def same_nodes(self) -> bool:
        return self.predicted_nodes == self.actual_nodes

    @property
    def locality_kept(self) -> bool:
        return self.same_nodes and all(n.locality_kept for n in self.nodes)

    @property
    def exact(self) -> bool:
        return self.same_nodes and all(n.exact for n in self.nodes)

    def miss(self) -> str:
        """Why locality did not hold ('' when it did)."""
        if not self.same_nodes:
            return f"ran on {self.actual_nodes}, predicted {self.predicted_nodes}"
        out = []
        for n in self.nodes:
            if not n.locality_kept:
                out.append(
                    f"{n.name}: GPUs {list(n.actual_gpus)} ({n.actual_islands} island(s)), "
                    f"cores {list(n.actual_cores)} ({n.actual_numa} NUMA domain(s)); "
                    f"predicted GPUs {list(n.predicted_gpus)} ({n.predicted_islands}), cores "
                    f"{list(n.predicted_cores)} ({n.predicted_numa})"
                )
        return "; ".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "job_id": self.job_id,
            "nodes": list(self.actual_nodes),
            "predicted_nodes": list(self.predicted_nodes),
            "locality_kept": self.locality_kept,
            "exact": self.exact,
            "offered_held_gpu": self.offered_held_gpu,
            "per_node": {
                n.name: {"gpus": list(n.actual_gpus), "predicted_gpus": list(n.predicted_gpus),
                         "cores": list(n.actual_cores),
                         "predicted_cores": list(n.predicted_cores)}
                for n in self.nodes
            },
            "miss": self.miss(),
        }


def _span(model: ClusterModel, i: int, gpus: Sequence[int], cores: Sequence[int]
          ) -> tuple[int, int]:
    """NVLink islands spanned by ``gpus`` and NUMA domains spanned by ``gpus`` and ``cores``
    on node ``i`` (node-local indices)."""
    ga, ca = int(model.gpu_offsets[i]), int(model.core_offsets[i])
    islands = {int(model.gpu_island[ga + g]) for g in gpus}
    numa = {int(model.gpu_numa[ga + g]) for g in gpus} | {int(model.core_numa[ca + c])
                                                          for c in cores}
    return len(islands), len(numa)


def compare(model: ClusterModel, placement: Placement, job_id: str,
            actual_nodes: Sequence[str], actual_gpus: Mapping[str, Sequence[int]],
            actual_cpu_ids: Mapping[str, Sequence[int]], request_text: str = "",
            held: Mapping[str, Sequence[int]] | None = None) -> Check:
    """Compare a placement with what Slurm allocated.

    Locality holds on a node when Slurm's GPUs span no more NVLink islands, and its GPUs and
    cores no more NUMA domains, than predicted; "exact" when the GPU indices and cores are
    the predicted ones. ``held`` (node to GPU indices running jobs held when the placement
    was made) flags a placement that offered a held GPU.
    """
    checks = []
    offered = False
    for node in placement.nodes:
        i = model.node_index(node.name)
        threads = int(model.threads_per_core[i])
        gpus = tuple(sorted(actual_gpus.get(node.name, ())))
        cores = tuple(sorted({c // threads for c in actual_cpu_ids.get(node.name, ())}))
        p_isl, p_numa = _span(model, i, node.gpus, node.cores)
        a_isl, a_numa = _span(model, i, gpus, cores)
        offered |= bool(set(node.gpus) & set((held or {}).get(node.name, ())))
        checks.append(NodeCheck(
            name=node.name, predicted_gpus=node.gpus, actual_gpus=gpus,
            predicted_cores=node.cores, actual_cores=cores, predicted_islands=p_isl,
            actual_islands=a_isl, predicted_numa=p_numa, actual_numa=a_numa,
            locality_kept=len(gpus) == len(node.gpus) and a_isl <= p_isl and a_numa <= p_numa,
            exact=gpus == node.gpus and cores == node.cores,
        ))
    return Check(request=request_text, job_id=job_id,
                 predicted_nodes=tuple(n.name for n in placement.nodes),
                 actual_nodes=tuple(actual_nodes), nodes=tuple(checks), offered_held_gpu=offered)


# --- the scripted sequence -------------------------------------------------------------------


class Submitter(Protocol):
    """What :func:`run_sequence` needs to start and stop jobs (``SlurmBackend`` has both)."""

    def submit(self, script: str, args: Sequence[str] = ()) -> int: ...
    def cancel(self, job_id: int | str) -> None: ...


class JobReader(Protocol):
    """Reads one job's allocation (``SlurmBackend.job``)."""

    def job(self, job_id: int | str) -> Any: ...


#: The mixed requests of the sequence (request text, weight). GPU counts 1-4 of either model
#: or both, locality levels, an FPGA job and CPU-only jobs, as a small site would see them.
MIX: tuple[tuple[str, int], ...] = (
    ("gpus=1 gpu-type=h100|a100", 4),
    ("gpus=2 gpu-type=h100|a100", 4),
    ("gpus=2 gpu-type=a100 locality=nvlink", 2),
    ("gpus=3 gpu-type=h100|a100 cores=3", 2),
    ("gpus=4 gpu-type=h100|a100 locality=nvlink:required", 3),
    ("gpus=4 gpu-type=a100|h100 cores=4 locality=numa", 2),
    ("gpus=1 gpu-type=h100 cores=2", 2),
    ("gpus=8 gpu-type=h100|a100 cores=8", 1),
    ("fpga=u280:1 cores=2", 1),
    ("cores=2", 1),
)

#: Background load before the sequence: (sbatch options, what it stands for). They hold
#: GPUs in awkward places (one GPU of an island, three of four) so best fit has work to do.
LOAD: tuple[tuple[str, ...], ...] = (
    ("-w", "gpu1", "--gres=gpu:h100:1", "-c", "1"),
    ("-w", "gpu2", "--gres=gpu:h100:3", "-c", "2"),
    ("-w", "gpu3", "--gres=gpu:a100:1", "-c", "1"),
    ("-w", "gpu4", "--gres=gpu:a100:2", "-c", "1"),
    ("-w", "cpu1", "-c", "4"),
)


@dataclass
class SequenceReport:
    """The figures of one :func:`run_sequence`."""

    submitted: int = 0
    locality_kept: int = 0
    exact: int = 0
    same_nodes: int = 0
    offered_held_gpu: int = 0
    busy_skips: int = 0
    checks: list[Check] = field(default_factory=list)

    @property
    def locality_rate(self) -> float:
        return self.locality_kept / self.submitted if self.submitted else 0.0

    @property
    def exact_rate(self) -> float:
        return self.exact / self.submitted if self.submitted else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "same_nodes": self.same_nodes,
            "locality_kept": self.locality_kept,
            "locality_rate": round(self.locality_rate, 4),
            "exact": self.exact,
            "exact_rate": round(self.exact_rate, 4),
            "offered_held_gpu": self.offered_held_gpu,
            "busy_retries": self.busy_skips,
            "misses": [c.to_dict() for c in self.checks if not c.locality_kept],
            "inexact": [c.to_dict() for c in self.checks if c.locality_kept and not c.exact],
        }


def held_gpus(backend: BackendLike) -> dict[str, tuple[int, ...]]:
    """GPU indices running jobs hold, per node, from the jobs' own allocations.

    A second source beside the nodes' ``GresUsed`` that :class:`LiveState` reads, so "never
    offers a held GPU" is checked against what Slurm says each job holds.
    """
    out: dict[str, set[int]] = {}
    for job in backend.jobs():
        if job.state not in ("RUNNING", "COMPLETING", "SUSPENDED"):
            continue
        for node, items in job.allocated_gres.items():
            for it in items:
                if it.name == "gpu" and it.indices:
                    out.setdefault(node, set()).update(it.indices)
    return {n: tuple(sorted(g)) for n, g in out.items()}


def start_load(backend: Any, submitted: list[int], *, duration_s: int = 600,
               timeout_s: float = 30.0) -> list[int]:
    """Submit :data:`LOAD` and wait until every job of it runs (the background for
    :func:`run_sequence`); ids are appended to ``submitted`` as they exist."""
    ids = []
    for args in LOAD:
        job_id = backend.submit(f"#!/bin/sh\nsleep {duration_s}\n",
                                ["-o", "/dev/null", "-J", "hs-load", "-t", "15", *args])
        submitted.append(job_id)
        ids.append(job_id)
    for job_id in ids:
        _wait_running(backend, job_id, timeout_s)
    return ids


def run_sequence(
    model: ClusterModel,
    backend: Any,
    resolve_text: Callable[[str], Request],
    *,
    n: int = 50,
    seed: int = 4,
    durations_s: tuple[int, int] = (20, 90),
    start_timeout_s: float = 30.0,
    log: Callable[[str], None] = lambda _m: None,
    submitted: list[int] | None = None,
) -> SequenceReport:
    """Place and submit ``n`` mixed requests one after another on a live cluster.

    Each step reads the live state (``LiveState.from_backend``), places a request drawn from
    :data:`MIX`, submits it with :func:`slurm_args` and a short ``sleep``, waits until it
    runs and compares what Slurm gave it (:func:`compare`). When a request is busy, the
    oldest job this sequence started is cancelled and the step retried, so the cluster stays
    loaded without running dry. The caller owns cleanup: every job id is appended to
    ``submitted`` as soon as it exists.

    Args:
        model: The cluster's static model (from the site the testbed renders).
        backend: A ``SlurmBackend`` (``nodes``, ``jobs``, ``job``, ``submit``, ``cancel``).
        resolve_text: Request text to a resolved :class:`Request` (parse + resolve).
        n: Submissions to check.
        seed: The sequence is reproducible for a seed (as far as Slurm's state allows).
        durations_s: Job run time range, seconds.
        start_timeout_s: How long a submission may stay pending before it counts as not
            started (Slurm's scheduler starts a pinned job that fits within a second or two).
        log: Progress messages.
        submitted: Receives every job id this function submits.
    """
    rng = random.Random(seed)  # noqa: S311 - a reproducible test sequence, not secrets
    texts = [t for t, w in MIX for _ in range(w)]
    mine: list[int] = [] if submitted is None else submitted
    live_jobs: list[int] = []
    report = SequenceReport()
    attempts = 0
    while report.submitted < n:
        attempts += 1
        if attempts > 4 * n:
            raise RuntimeError(f"gave up after {attempts} attempts ({report.submitted} checked)")
        text = rng.choice(texts)
        request = resolve_text(text)
        live = LiveState.from_backend(backend)
        held = held_gpus(backend)
        placed = place(model.with_state(live), request)
        if not placed.placeable:
            report.busy_skips += 1
            if live_jobs:
                oldest = live_jobs.pop(0)
                backend.cancel(oldest)
                _wait_gone(backend, oldest, start_timeout_s)
            continue
        args = slurm_args(model, request, placed)
        duration = rng.randint(*durations_s)
        job_id = backend.submit(f"#!/bin/sh\nsleep {duration}\n",
                                ["-o", "/dev/null", "-J", "hs-validate", "-t", "5", *args])
        mine.append(job_id)
        live_jobs.append(job_id)
        info = _wait_running(backend, job_id, start_timeout_s)
        gpus = {node: tuple(sorted(i for it in items if it.name == "gpu"
                                   for i in (it.indices or ())))
                for node, items in info.allocated_gres.items()}
        check = compare(model, placed, str(job_id), info.nodes, gpus, info.cpu_ids,
                        request_text=text, held=held)
        report.checks.append(check)
        report.submitted += 1
        report.same_nodes += check.same_nodes
        report.locality_kept += check.locality_kept
        report.exact += check.exact
        report.offered_held_gpu += check.offered_held_gpu
        log(f"{report.submitted:2d} {text:45s} {placed.nodelist:8s} "
            f"{'kept' if check.locality_kept else 'MISS'} {'exact' if check.exact else ''} "
            f"{check.miss()}")
    return report


def _wait_running(backend: JobReader, job_id: int, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    info = backend.job(job_id)
    while info.state != "RUNNING":
        if info.state not in ("PENDING", "CONFIGURING") or time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} is {info.state} ({info.reason}), not RUNNING")
        time.sleep(0.2)
        info = backend.job(job_id)
    return info


def _wait_gone(backend: BackendLike, job_id: int, timeout_s: float) -> None:
    """Wait until a cancelled job no longer holds resources (COMPLETING still holds GRES)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        held = [j for j in backend.jobs() if j.job_id == job_id
                and j.state in ("RUNNING", "COMPLETING", "SUSPENDED")]
        if not held:
            return
        time.sleep(0.2)
