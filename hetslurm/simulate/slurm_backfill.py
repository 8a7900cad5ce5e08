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

import bisect
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
from hetslurm.simulate.engine import (
    Alloc,
    JobRecord,
    ReplayResult,
    Stats,
    _Cores,
    _Placer,
    _Released,
    _RunTable,
    _Shape,
    _State,
    _try,
    setup,
)

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


def _replay_reference(
    model: ClusterModel,
    jobs: Sequence[SimJob],
    partitions: Mapping[str, Sequence[int]],
    *,
    backfill_depth: int,
    load: float,
    window_s: float,
    progress: Callable[[int], None] | None,
) -> ReplayResult:
    """The reference path of :func:`replay_slurm`: a new placement core for every probe."""
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
                                     planned_end, backfill_depth, window_s, start, stats)
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
              window_s: float, start: Callable[[int, Alloc, float], None],
              stats: Stats) -> set[int]:
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
        times = [w for w in times if w <= t + window_s]
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


def replay_slurm(
    model: ClusterModel,
    jobs: Sequence[SimJob],
    partitions: Mapping[str, Sequence[int]],
    *,
    backfill_depth: int,
    load: float = 1.0,
    window_s: float = math.inf,
    progress: Callable[[int], None] | None = None,
    fast: bool = True,
) -> ReplayResult:
    """Replay ``jobs`` (submit times divided by ``load``) with Slurm's main scheduler and
    conservative whole-node backfill; arguments as :func:`hetslurm.simulate.engine.replay`
    (``backfill_depth``: Slurm's ``bf_max_job_test``, jobs tested per backfill pass;
    ``window_s``: ``bf_window``, a job that cannot start within it gets no reservation).

    ``fast=False`` is the reference path (a new placement core for every probe); the
    default answers the probes from free counts per node (see the module's docstring) and
    gives the same starts and placements (tests/unit/test_simulate_slurm_fast.py).
    """
    if not fast:
        return _replay_reference(model, jobs, partitions, backfill_depth=backfill_depth,
                                 load=load, window_s=window_s, progress=progress)
    masks, _, _, now, stats, cores_now, shapes = setup(model, jobs, partitions, True)
    submit = {j.index: j.submit / load for j in jobs}
    events: list[tuple[float, int, int]] = [(submit[j.index], 1, i) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    pending: list[tuple[int, float, int]] = []
    running: dict[int, JobRecord] = {}
    planned_end: dict[int, float] = {}
    records: list[JobRecord] = []
    last_t = 0.0
    gpu_model_of = model.gpu_model
    table = _RunTable()
    placer = _Placer(model, stats)

    memo = _PassMemo()

    def start(pos: int, alloc: Alloc, t: float) -> None:
        memo.version += 1
        job = jobs[pos]
        m = int(gpu_model_of[int(alloc.nodes[0])])
        runtime = job.runtime.get(m, job.runtime.get(-1, 0.0)) if m >= 0 else job.runtime[-1]
        rec = JobRecord(job, submit[job.index], t, t + runtime, m, alloc)
        now.take(alloc)
        running[pos] = rec
        planned_end[pos] = t + job.time_limit
        table.add(pos, alloc, t + job.time_limit)
        heapq.heappush(events, (rec.end, 0, pos))

    cx = _FastCtx(model, jobs, shapes, masks, now, cores_now, placer, table, running,
                  planned_end, stats, start, backfill_depth, window_s, memo)
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
                table.remove(pos)
                memo.version += 1
                now.give(rec.alloc)
                cores_now.touched(rec.alloc.nodes, None)
                records.append(rec)
                ended = True
                if was_saturated:
                    stats.saturated_completions += 1
            else:
                j = jobs[pos]
                bisect.insort(pending, (j.priority, submit[j.index], pos))
        if ended:
            placer.refused.clear()
        if pending:
            stats.passes += 1
            started = _main_fast(t, cx, pending)
            if backfill_depth > 0 and len(started) < len(pending):
                started |= _backfill_fast(t, cx, pending, started)
            for q in sorted(started, reverse=True):
                del pending[q]
        if progress is not None and ended:
            progress(len(records))
    makespan = max((r.end for r in records), default=0.0)
    first = min(submit.values()) if submit else 0.0
    return ReplayResult(records, stats, makespan, first, unfinished=len(pending))


@dataclass
class _FastCtx:
    """What the fast path's passes share."""

    model: ClusterModel
    jobs: Sequence[SimJob]
    shapes: list[_Shape]
    masks: Mapping[str, npt.NDArray[np.uint8]]
    now: _State
    cores_now: _Cores
    placer: _Placer
    table: _RunTable
    running: dict[int, JobRecord]
    planned_end: dict[int, float]
    stats: Stats
    start: Callable[[int, Alloc, float], None]
    depth: int
    window_s: float
    memo: _PassMemo


@dataclass
class _PassMemo:
    """The running set's version (bumped on every start and end) and what the last backfill
    pass found for each job it tested, in order, if it started none: a pass with the same
    running set finds the same reservations for the same jobs (no candidate time lies
    between the two passes: every planned end is still ahead), except that a job that got
    none may now find one inside the window's later end; it is tested again."""

    version: int = 0
    at: int = -1
    tested: list[tuple[int, float, list[int]] | tuple[int, None, None]] = field(
        default_factory=list)


def _main_fast(t: float, cx: _FastCtx, pending: list[tuple[int, float, int]]) -> set[int]:
    started: set[int] = set()
    failed: set[str] = set()
    for q, (_, _, pos) in enumerate(pending):
        part = cx.jobs[pos].partition
        if part in failed:
            continue
        cx.stats.placements_tried += 1
        sh = cx.shapes[pos]
        alloc = cx.placer.place(sh, cx.now, cx.cores_now, commit=True, is_now=True)
        if alloc is None:
            failed.add(part)
            continue
        cx.cores_now.touched(alloc.nodes, sh.part)
        cx.start(pos, alloc, t)
        started.add(q)
    return started


class _ReleaseView:
    """The running jobs' holdings per node in the order of their planned ends: what each
    node has free once the jobs ending by a time have ended, for every such time at once
    (cumulative sums within each node's entries)."""

    def __init__(self, now: _State, table: _RunTable) -> None:
        live = np.flatnonzero(table.live)
        ent = live[np.lexsort((table.end[live], table.node[live]))]
        node = table.node[ent]
        self.node, self.end = node, table.end[ent]
        same = np.zeros(len(ent), dtype=bool)
        same[1:] = node[1:] == node[:-1]
        self.same_prev = same
        starts = np.flatnonzero(~same)
        sizes = np.diff(np.append(starts, len(ent)))

        def cum(per: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
            cs: npt.NDArray[np.int64] = np.cumsum(per[ent])
            before = np.concatenate((np.zeros(1, dtype=np.int64), cs))[starts]
            out: npt.NDArray[np.int64] = cs - np.repeat(before, sizes)
            return out

        self.g = now.gpu_cnt[node] + cum(table.g)
        self.c = now.core_cnt[node] + cum(table.c)
        self.m = now.mem_free[node] + cum(table.m)

    def earliest(self, sh: _Shape, now: _State, t: float, n: int) -> npt.NDArray[np.float64]:
        """Per node, the earliest time one share of ``sh`` fits there (``t`` if now,
        ``inf`` if never or outside the shape's nodes), reservations aside."""
        fit_now = now.core_cnt >= sh.nc
        ok = self.c >= sh.nc
        if sh.ng:
            fit_now &= now.gpu_cnt >= sh.ng
            ok &= self.g >= sh.ng
        if sh.mem > 0:
            fit_now &= now.mem_free >= sh.mem
            ok &= self.m >= sh.mem
        first = ok.copy()
        first[1:] &= ~(self.same_prev[1:] & ok[:-1])
        e = np.full(n, np.inf)
        e[self.node[first]] = np.maximum(self.end[first], t)
        e[fit_now] = t
        out = np.full(n, np.inf)
        out[sh.idx] = e[sh.idx]
        return out


class _NodeResv:
    """The whole-node reservations of one backfill pass: per node its spans, sorted and
    disjoint (a reservation only takes nodes free of others for its window), in a padded
    array (row = node, ``inf`` beyond the node's count), and all spans in lists for the
    multi-node test."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reserved = np.zeros(n, dtype=bool)
        self.cnt = np.zeros(n, dtype=np.int64)
        self.rs = np.full((n, 4), math.inf)
        self.re = np.full((n, 4), math.inf)
        self.node: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []

    def add(self, nodes: list[int], start: float, end: float) -> None:
        for node in nodes:
            c = int(self.cnt[node])
            if c == self.rs.shape[1]:
                pad = np.full((self.n, c), math.inf)
                self.rs = np.hstack((self.rs, pad))
                self.re = np.hstack((self.re, pad.copy()))
            row_s, row_e = self.rs[node], self.re[node]
            at = int(np.searchsorted(row_s[:c], start, side="right"))
            row_s[at + 1: c + 1] = row_s[at:c].copy()
            row_e[at + 1: c + 1] = row_e[at:c].copy()
            row_s[at], row_e[at] = start, end
            self.cnt[node] = c + 1
            self.reserved[node] = True
            self.node.append(node)
            self.start.append(start)
            self.end.append(end)

    def push(self, nodes: npt.NDArray[np.int64], s: npt.NDArray[np.float64],
             limit: float) -> npt.NDArray[np.float64]:
        """For each of ``nodes``, the earliest time >= ``s`` at which it is free of
        reservations for ``limit`` seconds (one pass over its spans: they are sorted and
        disjoint, so a span before the moved start is already behind it)."""
        s = s.copy()
        for j in range(int(self.cnt[nodes].max())):
            rs, re = self.rs[nodes, j], self.re[nodes, j]
            hit = (rs < s + limit) & (s < re)
            s[hit] = re[hit]
        return s

    def blocked(self, when: float, limit: float) -> npt.NDArray[np.bool_]:
        """Nodes with a reservation overlapping [when, when + limit)."""
        out = np.zeros(self.n, dtype=bool)
        if self.node:
            start, end = np.asarray(self.start), np.asarray(self.end)
            out[np.asarray(self.node)[(start < when + limit) & (when < end)]] = True
        return out


def _backfill_fast(t: float, cx: _FastCtx, pending: list[tuple[int, float, int]],
                   done: set[int]) -> set[int]:
    """:func:`_backfill` answered from free counts: for exact shapes (every request the
    traces produce) the earliest start per node comes from :class:`_ReleaseView` and the
    whole-node reservations met so far; the core is asked only to place a job that starts
    now beside reservations, or a multi-node reservation. Other shapes probe like the
    reference."""
    model, now, stats = cx.model, cx.now, cx.stats
    n = model.n_nodes
    horizon = t + cx.window_s
    weight = model.weight
    resv = _NodeResv(n)
    view: _ReleaseView | None = None
    raws: dict[int, npt.NDArray[np.float64]] = {}  # per shape, while the view holds
    # Per shape, the shortest limit that found no start within the window: a job of that
    # shape with a limit no shorter finds none either (reservations only grow in a pass).
    hopeless: dict[int, float] = {}
    memo = cx.memo
    reuse = memo.tested if memo.at == memo.version else []
    tested_now: list[tuple[int, float, list[int]] | tuple[int, None, None]] = []
    started: set[int] = set()
    tested = 0
    for q, (_, _, pos) in enumerate(pending):
        if q in done:
            continue
        if tested >= cx.depth:
            break
        job = cx.jobs[pos]
        sh = cx.shapes[pos]
        limit = job.time_limit
        if tested < len(reuse) and reuse[tested][0] == pos:
            entry = reuse[tested]
            if entry[1] is not None and entry[2] is not None:
                tested += 1
                resv.add(entry[2], entry[1], entry[1] + limit)
                stats.reservations += 1
                tested_now.append(entry)
                continue
        elif tested < len(reuse):
            reuse = []  # another job here: what follows was found with other reservations
        tested += 1
        if limit >= hopeless.get(id(sh), math.inf):
            found = None
        elif not sh.exact:
            found = _probe_core(t, cx, sh, resv, limit, horizon)
        else:
            raw = raws.get(id(sh))
            if raw is None:
                if view is None:
                    view = _ReleaseView(now, cx.table)
                raw = raws[id(sh)] = view.earliest(sh, now, t, n)
            found = _earliest_exact(t, cx, sh, raw, resv, limit, horizon, weight)
        if found is None:
            hopeless[id(sh)] = min(limit, hopeless.get(id(sh), math.inf))
            tested_now.append((pos, None, None))
            continue
        reuse = []  # a job that found nothing last time found something: the rest differs
        when, nodes, alloc = found
        if when == t:
            keep: str | None = None
            if alloc is None:  # nothing blocks it now: the partition's core commits it
                alloc = cx.placer.place(sh, now, cx.cores_now, commit=True, is_now=True)
                if alloc is None:
                    raise RuntimeError(f"placement core refused a backfill start the count "
                                       f"check admits: {sh.kr}")
                keep = sh.part
            cx.cores_now.touched(alloc.nodes, keep)
            cx.start(pos, alloc, t)
            stats.backfilled += 1
            started.add(q)
            view = None
            raws.clear()
        else:
            resv.add(nodes, when, when + limit)
            stats.reservations += 1
            tested_now.append((pos, when, nodes))
    memo.at = -1 if started else memo.version
    memo.tested = tested_now
    return started


def _earliest_exact(t: float, cx: _FastCtx, sh: _Shape, raw: npt.NDArray[np.float64],
                    resv: _NodeResv, limit: float, horizon: float,
                    weight: npt.NDArray[np.int64]
                    ) -> tuple[float, list[int], Alloc | None] | None:
    """The earliest time within the window ``sh`` fits on nodes free of reservations for
    its whole limit, the nodes, and (starting now beside a reservation) the allocation."""
    n = len(raw)
    reserved = resv.reserved
    if sh.k == 1:
        e = np.where(reserved, math.inf, raw)
        when = float(e.min())
        # A reserved node can only do better than the best free one if its own earliest
        # time is no later: push those past their reservations.
        maybe = np.flatnonzero(reserved & (raw <= when))
        if len(maybe):
            pushed = resv.push(maybe, raw[maybe], limit)
            e[maybe] = pushed
            when = min(when, float(pushed.min()))
        if when > horizon:
            return None
        feasible = e == when
    else:
        cands = sorted({float(x) for x in raw[np.isfinite(raw)]}
                       | {re for re in resv.end if re > t})
        for when in cands:
            if when > horizon:
                return None
            feasible = (raw <= when) & ~resv.blocked(when, limit)
            if int(np.count_nonzero(feasible)) >= sh.k:
                break
        else:
            return None
    if when == t:
        if not resv.node or bool(np.all(feasible[sh.idx] | (raw[sh.idx] != t))):
            return when, [], None  # nothing now is blocked: the partition's core places it
        alloc = _core_place(cx, sh, cx.now, feasible)
        return when, [], alloc
    if not any(sh.w[:-2]) and (sh.k == 1 or len(cx.model.switch_parent) == 1):
        # The core's choice where the score is the node weight alone and one switch holds
        # every node (or one node is asked for): the k lowest scores (node weight times its
        # term weight), ties to the lower index.
        cand = np.flatnonzero(feasible)
        key = weight[cand] * (int(sh.w[6]) * (n + 1)) + cand
        best = cand[np.argsort(key, kind="stable")[: sh.k]]
        return when, sorted(best.tolist()), None
    state = _state_at(cx, when)
    alloc = _core_place(cx, sh, state, feasible)
    return when, alloc.nodes.tolist(), None


def _state_at(cx: _FastCtx, when: float) -> _State:
    """The state once every running job planned to end by ``when`` has ended."""
    rel = _Released(cx.now.copy(), cx.table, cx.running, cx.model.n_nodes)
    ends = [cx.planned_end[int(p)] for p in rel.order]
    k = bisect.bisect_right(ends, when)
    return rel.state_after(k) if k else rel.now


def _core_place(cx: _FastCtx, sh: _Shape, state: _State,
                usable: npt.NDArray[np.bool_]) -> Alloc:
    arrays = StateArrays(
        available=state.available & cx.masks[sh.part] & usable.astype(np.uint8),
        gpu_free=state.gpu_free, fpga_free=state.fpga_free, core_free=state.core_free,
        mem_free_mib=np.maximum(state.mem_free, 0), free_at=cx.model.state.free_at)
    core = cx.model.new_core(arrays)
    cx.stats.core_builds += 1
    alloc = _try(core, sh, cx.model, False, cx.stats)
    if alloc is None:
        raise RuntimeError(f"placement core refused a placement the count check admits: "
                           f"{sh.kr} in partition {sh.part!r}")
    return alloc


def _probe_core(t: float, cx: _FastCtx, sh: _Shape, resv: _NodeResv, limit: float,
                horizon: float) -> tuple[float, list[int], Alloc | None] | None:
    """The reference's probe for shapes the counts do not decide (NVLink, NUMA, switch,
    FPGA, GPU memory): the core at every candidate time."""
    ends = sorted(e for e in cx.planned_end.values() if e > t)
    times = sorted({t, *ends, *(re for re in resv.end if re > t)})
    for when in times:
        if when > horizon:
            return None
        state = cx.now if when == t else _state_at(cx, when)
        usable = ~resv.blocked(when, limit)
        arrays = StateArrays(
            available=state.available & cx.masks[sh.part] & usable.astype(np.uint8),
            gpu_free=state.gpu_free, fpga_free=state.fpga_free, core_free=state.core_free,
            mem_free_mib=np.maximum(state.mem_free, 0), free_at=cx.model.state.free_at)
        cx.stats.core_builds += 1
        alloc = _try(cx.model.new_core(arrays), sh, cx.model, False, cx.stats)
        if alloc is None:
            continue
        return when, alloc.nodes.tolist(), alloc if when == t else None
    return None
