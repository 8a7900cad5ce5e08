"""A replay with Slurm 22.05's own backfill rules: conservative, whole nodes.

:mod:`hetslurm.simulate.engine` models EASY backfill (one reservation, for the head, of the
GPUs, cores and memory its placement takes). Slurm 22.05's ``sched/backfill`` does more,
as its log shows with ``DebugFlags=Backfill,BackfillMap`` on the testbed
(docs/simulate.md, "Fidelity"):

* every pending job it tests gets a reservation, in priority order, not only the first
  (``_dump_job_sched: JobId=16 to start at ..., end at ... on nodes gpu2``), up to
  ``bf_max_job_test``;
* a reservation is of **whole nodes** for the job's time limit: its nodes leave the
  backfill map for that window (``_dump_node_space_table``), so a later job that would still
  run then may not use any part of them, even GPUs and cores the reserved job leaves free;
* a job is tested for "now" only on nodes without such an overlapping reservation
  (``Test JobId=16 ... on gpu[2-4]``).

The main scheduler (at every submission and end) runs first: jobs in priority order, each
started when it fits; once one does not, later jobs of the same partition wait for backfill
(Slurm's "failed partition"). Placement is the compiled core's, as in the engine.

The result has the engine's types (:class:`~hetslurm.simulate.engine.ReplayResult`), so
:func:`~hetslurm.simulate.measures.measure` reads it unchanged.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hetslurm.placement.model import (
    N_INFO,
    N_T,
    PL_PLACED,
    ClusterModel,
    KernelRequest,
    StateArrays,
)
from hetslurm.simulate.engine import Alloc, JobRecord, ReplayResult, Stats

if TYPE_CHECKING:
    from hetslurm.simulate.workload import SimJob


@dataclass
class _Free:
    """Free GPUs, FPGAs, cores (flags) and memory per node (MiB)."""

    gpu: npt.NDArray[np.uint8]
    fpga: npt.NDArray[np.uint8]
    core: npt.NDArray[np.uint8]
    mem: npt.NDArray[np.int64]

    def copy(self) -> _Free:
        return _Free(self.gpu.copy(), self.fpga.copy(), self.core.copy(), self.mem.copy())

    def take(self, a: Alloc) -> None:
        self.gpu[a.gpus] = 0
        self.core[a.cores] = 0
        self.mem[a.nodes] -= a.mem

    def give(self, a: Alloc) -> None:
        self.gpu[a.gpus] = 1
        self.core[a.cores] = 1
        self.mem[a.nodes] += a.mem


@dataclass(frozen=True)
class _Resv:
    """A backfill reservation: whole nodes from ``start`` to ``end`` (time limit)."""

    nodes: frozenset[int]
    start: float
    end: float


def _place(model: ClusterModel, free: _Free, usable: npt.NDArray[np.uint8],
           kr: KernelRequest) -> Alloc | None:
    """The core's placement of ``kr`` on ``free`` restricted to ``usable`` nodes."""
    s = model.state
    core = model.new_core(StateArrays(usable, free.gpu, free.fpga, free.core,
                                      np.maximum(free.mem, 0), s.free_at))
    k = kr.nodes
    nodes = np.full(max(k, 1), -1, dtype=np.int32)
    gpus = np.full(max(k * kr.gpus, 1), -1, dtype=np.int32)
    fpgas = np.full(max(k * kr.fpgas, 1), -1, dtype=np.int32)
    cores = np.full(max(k * kr.cores, 1), -1, dtype=np.int32)
    terms = np.zeros(max(k * N_T, 1), dtype=np.int64)
    info = np.zeros(N_INFO, dtype=np.int64)
    status = core.place(kr.vector(), np.asarray(kr.gpu_rank, dtype=np.int32).reshape(-1),
                        np.asarray(kr.fpga_rank, dtype=np.int32).reshape(-1),
                        np.asarray(kr.weights, dtype=np.int64), False, nodes, gpus, fpgas,
                        cores, terms, info)
    if status != PL_PLACED:
        return None
    n = nodes[:k].astype(np.int64)
    g = gpus[: k * kr.gpus].reshape(k, kr.gpus).astype(np.int64)
    c = cores[: k * kr.cores].reshape(k, kr.cores).astype(np.int64)
    return Alloc(n, (g + model.gpu_offsets[n][:, None]).reshape(-1),
                 (c + model.core_offsets[n][:, None]).reshape(-1), kr.mem_mib)


def replay_slurm(
    model: ClusterModel,
    jobs: Sequence[SimJob],
    partitions: Mapping[str, Sequence[int]],
    *,
    backfill_depth: int,
    load: float = 1.0,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``jobs`` (submit times divided by ``load``) with Slurm's main scheduler and
    conservative whole-node backfill; arguments as :func:`hetslurm.simulate.engine.replay`
    (``backfill_depth``: Slurm's ``bf_max_job_test``, jobs tested per backfill pass)."""
    masks: dict[str, npt.NDArray[np.uint8]] = {}
    for name, idx in partitions.items():
        m = np.zeros(model.n_nodes, dtype=np.uint8)
        m[list(idx)] = 1
        masks[name] = m & model.state.available
    s = model.state
    free = _Free(s.gpu_free.copy(), s.fpga_free.copy(), s.core_free.copy(),
                 s.mem_free_mib.copy())
    stats = Stats()
    submit = {j.index: j.submit / load for j in jobs}
    events: list[tuple[float, int, int]] = [(submit[j.index], 1, i) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    pending: list[tuple[int, float, int]] = []
    running: dict[int, JobRecord] = {}
    planned_end: dict[int, float] = {}
    records: list[JobRecord] = []
    last_t = 0.0
    gpu_model_of = model.gpu_model

    def start(pos: int, alloc: Alloc, t: float) -> None:
        job = jobs[pos]
        m = int(gpu_model_of[int(alloc.nodes[0])])
        runtime = job.runtime.get(m, job.runtime.get(-1, 0.0)) if m >= 0 else job.runtime[-1]
        rec = JobRecord(job, submit[job.index], t, t + runtime, m, alloc)
        free.take(alloc)
        running[pos] = rec
        planned_end[pos] = t + job.time_limit
        heapq.heappush(events, (rec.end, 0, pos))

    while events:
        t = events[0][0]
        if pending:
            stats.queue_area += len(pending) * (t - last_t)
            stats.saturated_s += t - last_t
        was_saturated = bool(pending)
        last_t = t
        ended = False
        while events and events[0][0] == t:
            _, kind, pos = heapq.heappop(events)
            if kind == 0:
                rec = running.pop(pos)
                planned_end.pop(pos)
                free.give(rec.alloc)
                records.append(rec)
                ended = True
                if was_saturated:
                    stats.saturated_completions += 1
            else:
                j = jobs[pos]
                pending.append((j.priority, submit[j.index], pos))
        if pending:
            stats.passes += 1
            pending.sort()
            started = _main(t, model, jobs, pending, masks, free, start, stats)
            if backfill_depth > 0 and len(started) < len(pending):
                started |= _backfill(t, model, jobs, pending, started, masks, free, running,
                                     planned_end, backfill_depth, start, stats)
            if started:
                pending[:] = [p for q, p in enumerate(pending) if q not in started]
        if progress is not None and ended:
            progress(len(records))
    makespan = max((r.end for r in records), default=0.0)
    first = min(submit.values()) if submit else 0.0
    return ReplayResult(records, stats, makespan, first, unfinished=len(pending))


def _main(t: float, model: ClusterModel, jobs: Sequence[SimJob],
          pending: list[tuple[int, float, int]], masks: Mapping[str, npt.NDArray[np.uint8]],
          free: _Free, start: Callable[[int, Alloc, float], None], stats: Stats) -> set[int]:
    """Slurm's main scheduler: priority order; a job that does not fit blocks the later
    jobs of its partition until backfill."""
    started: set[int] = set()
    failed: set[str] = set()
    for q, (_, _, pos) in enumerate(pending):
        job = jobs[pos]
        if job.partition in failed:
            continue
        stats.placements_tried += 1
        alloc = _place(model, free, masks[job.partition], job.kr)
        if alloc is None:
            failed.add(job.partition)
            continue
        start(pos, alloc, t)
        started.add(q)
    return started


def _backfill(t: float, model: ClusterModel, jobs: Sequence[SimJob],
              pending: list[tuple[int, float, int]], done: set[int],
              masks: Mapping[str, npt.NDArray[np.uint8]], free: _Free,
              running: Mapping[int, JobRecord], planned_end: Mapping[int, float], depth: int,
              start: Callable[[int, Alloc, float], None], stats: Stats) -> set[int]:
    """One backfill pass: each of the next ``depth`` pending jobs, in priority order, starts
    now if it fits without touching a reservation's nodes during its time limit, else gets
    a whole-node reservation at the earliest time it fits."""
    started: set[int] = set()
    resvs: list[_Resv] = []
    tested = 0
    for q, (_, _, pos) in enumerate(pending):
        if q in done:
            continue
        if tested >= depth:
            break
        tested += 1
        job = jobs[pos]
        limit = job.time_limit
        # Running jobs (including those started in this pass) in the order of planned end.
        order = sorted(running, key=lambda p: (planned_end[p], p))
        ends = [planned_end[p] for p in order]
        times = sorted({t, *(e for e in ends if e > t), *(r.end for r in resvs if r.end > t)})
        state = free.copy()
        released = 0
        for when in times:
            while released < len(order) and ends[released] <= when:
                state.give(running[order[released]].alloc)
                released += 1
            usable = masks[job.partition].copy()
            for r in resvs:
                if r.start < when + limit and when < r.end:
                    usable[list(r.nodes)] = 0
            stats.placements_tried += 1
            alloc = _place(model, state, usable, job.kr)
            if alloc is None:
                continue
            if when == t:
                start(pos, alloc, t)
                stats.backfilled += 1
                started.add(q)
            else:
                resvs.append(_Resv(frozenset(alloc.nodes.tolist()), when, when + limit))
                stats.reservations += 1
            break
    return started
