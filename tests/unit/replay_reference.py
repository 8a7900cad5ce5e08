"""The replay's reference twins: slow, obviously correct versions of both backfill models,
which the product loop (:mod:`hetslurm.simulate.loop` with its plug-ins) must match on
seeded workloads (test_simulate_perf.py: EASY; test_simulate_slurm_fast.py: Slurm rules).

No count checks, no caches across passes, no run table: free flags and memory only, and a
new placement core for every question. What stays is what defines the models (the rules
in each plug-in's docstring): within a pass, a request shape that failed is not tried
again (EASY); the reservation search releases running jobs in the order of their planned
end (binary search over how many).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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
from hetslurm.simulate.loop import Alloc, JobRecord, ReplayResult, Stats
from hetslurm.simulate.workload import SimJob

Pending = list[tuple[int, float, int]]


@dataclass
class Free:
    """Free GPUs, FPGAs, cores (flags) and memory per node (MiB)."""

    gpu: npt.NDArray[np.uint8]
    fpga: npt.NDArray[np.uint8]
    core: npt.NDArray[np.uint8]
    mem: npt.NDArray[np.int64]

    def copy(self) -> Free:
        return Free(self.gpu.copy(), self.fpga.copy(), self.core.copy(), self.mem.copy())

    def take(self, a: Alloc) -> None:
        self.gpu[a.gpus] = 0
        self.core[a.cores] = 0
        self.mem[a.nodes] -= a.mem

    def give(self, a: Alloc) -> None:
        self.gpu[a.gpus] = 1
        self.core[a.cores] = 1
        self.mem[a.nodes] += a.mem


def place(model: ClusterModel, free: Free, usable: npt.NDArray[np.uint8],
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


@dataclass
class Ctx:
    """One reference replay: the cluster, partition masks, free state, running jobs."""

    model: ClusterModel
    jobs: Sequence[SimJob]
    masks: dict[str, npt.NDArray[np.uint8]]
    free: Free
    running: dict[int, JobRecord]
    planned_end: dict[int, float]
    stats: Stats
    start: Callable[[int, Alloc, float], None]

    def fit(self, pos: int, free: Free, usable: npt.NDArray[np.uint8] | None = None,
            *, ranked: bool = False, failed: set[str] | None = None) -> Alloc | None:
        """Where job ``pos`` fits on ``free``; with ``ranked`` (the main scheduler) in the
        first of its ranked partitions where it fits (docs/fallback.md). ``failed``: the
        pass's failed partitions, skipped; each tried where the job does not fit joins
        them (Slurm's one queue record per job and partition)."""
        job = self.jobs[pos]
        for part in (job.ranked if ranked else ()) or (job.partition,):
            if failed is not None and part in failed:
                continue
            mask = self.masks[part]
            alloc = place(self.model, free, mask if usable is None else mask & usable, job.kr)
            if alloc is not None:
                return alloc
            if failed is not None:
                failed.add(part)
        return None


Pass = Callable[[float, Ctx, Pending], set[int]]


def reference_loop(model: ClusterModel, jobs: Sequence[SimJob],
                   partitions: Mapping[str, Sequence[int]], one_pass: Pass, *,
                   load: float) -> ReplayResult:
    """The event loop: ends, then submissions, then ``one_pass``, at every event time."""
    masks: dict[str, npt.NDArray[np.uint8]] = {}
    for name, idx in partitions.items():
        m = np.zeros(model.n_nodes, dtype=np.uint8)
        m[list(idx)] = 1
        masks[name] = m & model.state.available
    s = model.state
    free = Free(s.gpu_free.copy(), s.fpga_free.copy(), s.core_free.copy(),
                s.mem_free_mib.copy())
    stats = Stats()
    submit = {j.index: j.submit / load for j in jobs}
    events = [(submit[j.index], 1, i) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    pending: Pending = []
    running: dict[int, JobRecord] = {}
    planned_end: dict[int, float] = {}
    records: list[JobRecord] = []
    last_t = 0.0

    def start(pos: int, alloc: Alloc, t: float) -> None:
        job = jobs[pos]
        m = int(model.gpu_model[int(alloc.nodes[0])])
        runtime = job.runtime.get(m, job.runtime.get(-1, 0.0)) if m >= 0 else job.runtime[-1]
        rec = JobRecord(job, submit[job.index], t, t + runtime, m, alloc)
        free.take(alloc)
        running[pos] = rec
        planned_end[pos] = t + job.time_limit
        heapq.heappush(events, (rec.end, 0, pos))

    cx = Ctx(model, jobs, masks, free, running, planned_end, stats, start)
    while events:
        t = events[0][0]
        if pending:
            stats.queue_area += len(pending) * (t - last_t)
            stats.saturated_s += t - last_t
        was_saturated = bool(pending)
        last_t = t
        while events and events[0][0] == t:
            _, kind, pos = heapq.heappop(events)
            if kind == 0:
                rec = running.pop(pos)
                planned_end.pop(pos)
                free.give(rec.alloc)
                records.append(rec)
                if was_saturated:
                    stats.saturated_completions += 1
            else:
                j = jobs[pos]
                pending.append((j.priority, submit[j.index], pos))
        if pending:
            stats.passes += 1
            pending.sort()
            started = one_pass(t, cx, pending)
            pending[:] = [p for q, p in enumerate(pending) if q not in started]
    makespan = max((r.end for r in records), default=0.0)
    first = min(submit.values()) if submit else 0.0
    return ReplayResult(records, stats, makespan, first, unfinished=len(pending))


# --- EASY -------------------------------------------------------------------------------


def easy_pass(depth: int) -> Pass:
    """Strict FCFS, then EASY backfill over the ``depth`` jobs after the head."""

    def one_pass(t: float, cx: Ctx, pending: Pending) -> set[int]:
        started: set[int] = set()
        failed: set[tuple[tuple[KernelRequest, str], int]] = set()

        def key(pos: int) -> tuple[KernelRequest, str]:
            return cx.jobs[pos].kr, cx.jobs[pos].partition

        head = -1
        for q, (_, _, pos) in enumerate(pending):
            alloc = cx.fit(pos, cx.free, ranked=True)
            if alloc is None:
                failed.add((key(pos), 0))
                head = q
                break
            cx.start(pos, alloc, t)
            started.add(q)
        if head < 0 or depth <= 0:
            return started
        window = range(head + 1, min(len(pending), head + 1 + depth))
        # Some candidate must fit now (one try per request), else nothing can backfill.
        seen = set()
        for q in window:
            k = key(pending[q][2])
            if k in seen or (k, 0) in failed:
                continue
            seen.add(k)
            if cx.fit(pending[q][2], cx.free) is not None:
                break
            failed |= {(k, 0), (k, 1)}
        else:
            return started
        hpos = pending[head][2]
        order = sorted(cx.running, key=lambda p: (cx.planned_end[p], p))

        def after(n: int) -> Free:
            s = cx.free.copy()
            for p in order[:n]:
                s.give(cx.running[p].alloc)
            return s

        if not order or cx.fit(hpos, after(len(order))) is None:
            return started
        lo, hi = 1, len(order)
        while lo < hi:
            mid = (lo + hi) // 2
            if cx.fit(hpos, after(mid)) is not None:
                hi = mid
            else:
                lo = mid + 1
        shadow = cx.planned_end[order[lo - 1]]
        future = after(lo)
        reserved = cx.fit(hpos, future)
        assert reserved is not None
        fut_mem = future.mem.copy()
        fut_mem[reserved.nodes] -= reserved.mem
        # What jobs ending after the shadow time may use: the reserved GPUs and cores
        # masked, each node's memory kept for the head then.
        resv = cx.free.copy()
        resv.gpu[reserved.gpus] = 0
        resv.core[reserved.cores] = 0
        resv.mem = np.minimum(resv.mem, fut_mem)
        for q in window:
            pos = pending[q][2]
            short = t + cx.jobs[pos].time_limit <= shadow
            k2 = (key(pos), 0 if short else 1)
            if k2 in failed:
                continue
            alloc = cx.fit(pos, cx.free if short else resv)
            if alloc is None:
                failed.add(k2)
                continue
            cx.start(pos, alloc, t)
            if short:
                resv.gpu[alloc.gpus] = 0
                resv.core[alloc.cores] = 0
                resv.mem = np.minimum(cx.free.mem, fut_mem)
            else:
                resv.take(alloc)
                fut_mem[alloc.nodes] -= alloc.mem
            cx.stats.backfilled += 1
            started.add(q)
        return started

    return one_pass


def replay_easy_reference(model: ClusterModel, jobs: Sequence[SimJob],
                          partitions: Mapping[str, Sequence[int]], *, backfill_depth: int,
                          load: float = 1.0) -> ReplayResult:
    return reference_loop(model, jobs, partitions, easy_pass(backfill_depth), load=load)


# --- Slurm's rules ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Resv:
    """A backfill reservation: whole nodes from ``start`` to ``end`` (time limit)."""

    nodes: frozenset[int]
    start: float
    end: float


def slurm_pass(depth: int, window_s: float) -> Pass:
    """Slurm's main scheduler (failed partitions), then its conservative whole-node
    backfill."""

    def one_pass(t: float, cx: Ctx, pending: Pending) -> set[int]:
        started: set[int] = set()
        failed: set[str] = set()
        for q, (_, _, pos) in enumerate(pending):
            alloc = cx.fit(pos, cx.free, ranked=True, failed=failed)
            if alloc is None:
                continue
            cx.start(pos, alloc, t)
            started.add(q)
        if depth > 0 and len(started) < len(pending):
            started |= _slurm_backfill(t, cx, pending, started, depth, window_s)
        return started

    return one_pass


def _slurm_backfill(t: float, cx: Ctx, pending: Pending, done: set[int], depth: int,
                    window_s: float) -> set[int]:
    """Each of the next ``depth`` pending jobs, in priority order, starts now if it fits
    without touching a reservation's nodes during its time limit, else gets a whole-node
    reservation at the earliest time it fits."""
    started: set[int] = set()
    resvs: list[_Resv] = []
    tested = 0
    for q, (_, _, pos) in enumerate(pending):
        if q in done:
            continue
        if tested >= depth:
            break
        tested += 1
        limit = cx.jobs[pos].time_limit
        # Running jobs (including those started in this pass) in the order of planned end.
        order = sorted(cx.running, key=lambda p: (cx.planned_end[p], p))
        ends = [cx.planned_end[p] for p in order]
        times = sorted({t, *(e for e in ends if e > t), *(r.end for r in resvs if r.end > t)})
        times = [w for w in times if w <= t + window_s]
        state = cx.free.copy()
        released = 0
        for when in times:
            # A job still running now holds its resources now, whatever its planned end (a
            # zero time limit plans it to end now; its end is the next event at t).
            while when > t and released < len(order) and ends[released] <= when:
                state.give(cx.running[order[released]].alloc)
                released += 1
            usable = np.ones(cx.model.n_nodes, dtype=np.uint8)
            for r in resvs:
                if r.start < when + limit and when < r.end:
                    usable[list(r.nodes)] = 0
            alloc = cx.fit(pos, state, usable)
            if alloc is None:
                continue
            if when == t:
                cx.start(pos, alloc, t)
                cx.stats.backfilled += 1
                started.add(q)
            else:
                resvs.append(_Resv(frozenset(alloc.nodes.tolist()), when, when + limit))
                cx.stats.reservations += 1
            break
    return started


def replay_slurm_reference(model: ClusterModel, jobs: Sequence[SimJob],
                           partitions: Mapping[str, Sequence[int]], *, backfill_depth: int,
                           load: float = 1.0, window_s: float = math.inf) -> ReplayResult:
    return reference_loop(model, jobs, partitions, slurm_pass(backfill_depth, window_s),
                          load=load)
