"""The discrete-event replay: Slurm's priority order, FCFS and EASY backfill, placed by the
same compiled core as ``hetslurm place``.

Model of one scheduling pass at time ``t`` (after the ends and submissions at ``t``):

1. Pending jobs in priority order (priority class, then submit time, then trace order).
2. FCFS: each job is placed (committed) while it fits; the first that does not is the head.
3. EASY reservation for the head: running jobs are released in the order of their planned
   end (start + time limit) until the head fits; that end is the shadow time ``s`` and the
   placement found there is reserved (nodes, GPUs, cores, memory).
4. Backfill over the next ``backfill_depth`` jobs: a job whose time limit ends by ``s`` may
   take anything free now; a longer one may take only what the reservation leaves (the
   reserved GPUs and cores masked, memory kept for the head at ``s``).

Partitions are node masks: a job is placed on a core whose unavailable nodes are those
outside its partition. Cores are rebuilt lazily from the state arrays when a commit on
another core touched their nodes (about 0.1 ms for the case study's 225 nodes).

Speed (``replay(..., fast=True)``, the default; ``fast=False`` is the reference path that
asks the core every time, and gives the same starts and placements, tests/unit/
test_simulate_perf.py). Every state keeps free GPUs and cores per node beside the free
flags. A request shape (compiled request and partition) has a static set of nodes that can
ever hold it (partition, model, device counts, CPU-only); on a state it fits only if at
least ``nodes`` of them have enough free GPUs, cores and memory. That count check is what
the core's per-node test reduces to for requests without NVLink, NUMA, switch, FPGA or
GPU-memory constraints (every request the traces produce): for those shapes the check is
the answer, and the core is called only to commit a placement that will succeed, or once for
the reservation's placement at the shadow time. For other shapes the check only rules out
(it is necessary) and the core decides. A shape the check refused on the free state stays
refused until the next job ends (resources only shrink until then). The reservation's
binary search probes the counts after releasing the first ``k`` running jobs (sums per node
over :class:`_RunTable`, the running jobs' allocations in arrays) instead of building a
core per probe; it makes the same probes in the same order, so it finds the same shadow
time. The head's placement at the shadow time, and the leftovers long backfill jobs may
use, are computed only when such a job is tried (from a copy of the state taken with the
reservation).
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

if TYPE_CHECKING:
    from hetslurm._core import PlacementCore
    from hetslurm.simulate.workload import SimJob

#: Verdicts of a count check.
_NO, _YES, _ASK = 0, 1, 2


@dataclass
class Alloc:
    """What a started job holds: node indices, global GPU and core indices, MiB per node."""

    nodes: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    cores: npt.NDArray[np.int64]
    mem: int


@dataclass
class JobRecord:
    """The outcome of one job."""

    job: SimJob
    submit: float  # after the load multiplier
    start: float
    end: float
    model: int  # GPU model index of its first node, -1 for a CPU-only node
    alloc: Alloc


@dataclass
class _State:
    """Free flags per GPU, FPGA and core, free memory per node, and free GPUs and cores per
    node (kept in step by :meth:`take`, :meth:`give` and :meth:`mask`)."""

    available: npt.NDArray[np.uint8]
    gpu_free: npt.NDArray[np.uint8]
    fpga_free: npt.NDArray[np.uint8]
    core_free: npt.NDArray[np.uint8]
    mem_free: npt.NDArray[np.int64]
    gpu_cnt: npt.NDArray[np.int64]
    core_cnt: npt.NDArray[np.int64]

    @classmethod
    def empty(cls, model: ClusterModel, lay: _Layout) -> _State:
        s = model.state
        n = model.n_nodes
        gpu_cnt = np.bincount(lay.gpu_node[s.gpu_free.astype(bool)], minlength=n)
        core_cnt = np.bincount(lay.core_node[s.core_free.astype(bool)], minlength=n)
        return cls(s.available.copy(), s.gpu_free.copy(), s.fpga_free.copy(),
                   s.core_free.copy(), s.mem_free_mib.copy(), gpu_cnt.astype(np.int64),
                   core_cnt.astype(np.int64))

    def copy(self) -> _State:
        return _State(self.available.copy(), self.gpu_free.copy(), self.fpga_free.copy(),
                      self.core_free.copy(), self.mem_free.copy(), self.gpu_cnt.copy(),
                      self.core_cnt.copy())

    def take(self, a: Alloc) -> None:
        """Take ``a`` (every GPU and core of it free here)."""
        k = len(a.nodes)
        self.gpu_free[a.gpus] = 0
        self.core_free[a.cores] = 0
        self.mem_free[a.nodes] -= a.mem
        self.gpu_cnt[a.nodes] -= len(a.gpus) // k
        self.core_cnt[a.nodes] -= len(a.cores) // k

    def give(self, a: Alloc) -> None:
        """Give ``a`` back (every GPU and core of it taken here)."""
        k = len(a.nodes)
        self.gpu_free[a.gpus] = 1
        self.core_free[a.cores] = 1
        self.mem_free[a.nodes] += a.mem
        self.gpu_cnt[a.nodes] += len(a.gpus) // k
        self.core_cnt[a.nodes] += len(a.cores) // k

    def mask(self, gpus: npt.NDArray[np.int64], cores: npt.NDArray[np.int64],
             lay: _Layout) -> None:
        """Mark ``gpus`` and ``cores`` taken, whether or not they are free here."""
        g = gpus[self.gpu_free[gpus] != 0]
        c = cores[self.core_free[cores] != 0]
        self.gpu_free[g] = 0
        self.core_free[c] = 0
        np.subtract.at(self.gpu_cnt, lay.gpu_node[g], 1)
        np.subtract.at(self.core_cnt, lay.core_node[c], 1)


@dataclass(frozen=True)
class _Layout:
    """The node of every GPU and core."""

    gpu_node: npt.NDArray[np.int64]
    core_node: npt.NDArray[np.int64]

    @classmethod
    def of(cls, model: ClusterModel) -> _Layout:
        n = np.arange(model.n_nodes, dtype=np.int64)
        return cls(np.repeat(n, np.diff(model.gpu_offsets)),
                   np.repeat(n, np.diff(model.core_offsets)))


class _Shape:
    """One request shape (compiled request, partition): the core's arguments, output
    buffers, and the count check."""

    def __init__(self, model: ClusterModel, kr: KernelRequest, part: str,
                 mask: npt.NDArray[np.uint8], fast: bool) -> None:
        self.kr, self.part = kr, part
        k = kr.nodes
        self.k, self.ng, self.nc, self.mem = k, kr.gpus, kr.cores, kr.mem_mib
        self.req = kr.vector()
        self.mrank = np.asarray(kr.gpu_rank, dtype=np.int32).reshape(-1)
        self.frank = np.asarray(kr.fpga_rank, dtype=np.int32).reshape(-1)
        self.w = np.asarray(kr.weights, dtype=np.int64)
        self.out_nodes = np.full(max(k, 1), -1, dtype=np.int32)
        self.out_gpus = np.full(max(k * kr.gpus, 1), -1, dtype=np.int32)
        self.out_fpgas = np.full(max(k * kr.fpgas, 1), -1, dtype=np.int32)
        self.out_cores = np.full(max(k * kr.cores, 1), -1, dtype=np.int32)
        self.out_terms = np.zeros(max(k * N_T, 1), dtype=np.int64)
        self.out_info = np.zeros(N_INFO, dtype=np.int64)
        # Nodes that can ever hold one share of the request (the core's static tests).
        ok = (model.state.available & mask).astype(bool)
        gpu_count = np.diff(model.gpu_offsets)
        fpga_count = np.diff(model.fpga_offsets)
        if kr.cpu_only:
            ok &= (gpu_count == 0) & (fpga_count == 0)
        exact = fast and not (kr.nvlink or kr.numa or kr.switch) and kr.fpgas == 0
        if kr.gpus > 0:
            gm = model.gpu_model
            rank = np.asarray(kr.gpu_rank, dtype=np.int64)
            allowed = np.zeros(len(gm), dtype=bool)
            has = gm >= 0
            allowed[has] = rank[gm[has]] >= 0
            qual = np.add.reduceat(
                np.append(model.gpu_mem_mib >= kr.min_gpu_mem_mib, False).astype(np.int64),
                model.gpu_offsets[:-1]) * (gpu_count > 0)
            ok &= allowed & (qual >= kr.gpus)
            # Free GPUs stand for free qualifying GPUs only where every GPU qualifies.
            exact = exact and bool(np.all(qual[ok] == gpu_count[ok]))
        if kr.fpgas > 0:
            fm = model.fpga_model
            frank = np.asarray(kr.fpga_rank, dtype=np.int64)
            fok = np.zeros(len(fm), dtype=bool)
            fok[fm >= 0] = frank[fm[fm >= 0]] >= 0
            ok &= fok & (fpga_count >= kr.fpgas)
        self.idx = np.flatnonzero(ok)
        self.fast, self.exact = fast, exact

    def check(self, gpu_cnt: npt.NDArray[np.int64] | npt.NDArray[np.float64],
              core_cnt: npt.NDArray[np.int64] | npt.NDArray[np.float64],
              mem_free: npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> int:
        """_NO: cannot fit these free counts; _YES: fits; _ASK: the core must say."""
        if not self.fast:
            return _ASK
        idx = self.idx
        fit = core_cnt[idx] >= self.nc
        if self.ng:
            fit &= gpu_cnt[idx] >= self.ng
        if self.mem > 0:
            fit &= mem_free[idx] >= self.mem
        if int(np.count_nonzero(fit)) < self.k:
            return _NO
        return _YES if self.exact else _ASK

    def verdict(self, s: _State) -> int:
        return self.check(s.gpu_cnt, s.core_cnt, s.mem_free)


@dataclass
class Stats:
    """Counters the replay keeps while it runs."""

    passes: int = 0
    reservations: int = 0  # computed; a pass with the same head and running set reuses one
    placements_tried: int = 0
    backfilled: int = 0
    queue_area: float = 0.0  # integral of pending jobs over time
    saturated_s: float = 0.0  # time with at least one pending job
    saturated_completions: int = 0
    core_calls: int = 0  # placement-core calls (the count checks answer the rest)
    core_builds: int = 0


@dataclass
class ReplayResult:
    records: list[JobRecord]
    stats: Stats
    makespan: float
    first_submit: float
    unfinished: int = 0
    extra: dict[str, float] = field(default_factory=dict)


@dataclass
class _Memo:
    """The running set's version (bumped on every start and end) and the last reservation."""

    version: int = 0
    key: tuple[int, int] | None = None
    value: _Reservation | None = None


class _Cores:
    """Placement cores per partition mask, rebuilt lazily from a state."""

    def __init__(self, model: ClusterModel, masks: Mapping[str, npt.NDArray[np.uint8]],
                 node_sets: Mapping[str, frozenset[int]], stats: Stats) -> None:
        self.model, self.masks, self.node_sets, self.stats = model, masks, node_sets, stats
        self.cores: dict[str, PlacementCore] = {}

    def get(self, part: str, state: _State) -> PlacementCore:
        core = self.cores.get(part)
        if core is None:
            arrays = StateArrays(
                available=state.available & self.masks[part], gpu_free=state.gpu_free,
                fpga_free=state.fpga_free, core_free=state.core_free,
                mem_free_mib=np.maximum(state.mem_free, 0), free_at=self.model.state.free_at,
            )
            core = self.model.new_core(arrays)
            self.stats.core_builds += 1
            self.cores[part] = core
        return core

    def touched(self, nodes: npt.NDArray[np.int64], keep: str | None) -> None:
        if not self.cores:
            return
        hit = set(nodes.tolist())
        for part in list(self.cores):
            if part != keep and hit & self.node_sets[part]:
                del self.cores[part]


def _try(core: PlacementCore, sh: _Shape, model: ClusterModel, commit: bool,
         stats: Stats) -> Alloc | None:
    stats.core_calls += 1
    status = core.place(sh.req, sh.mrank, sh.frank, sh.w, commit, sh.out_nodes, sh.out_gpus,
                        sh.out_fpgas, sh.out_cores, sh.out_terms, sh.out_info)
    if status != PL_PLACED:
        return None
    k, ng, nc = sh.k, sh.ng, sh.nc
    n = sh.out_nodes[:k].astype(np.int64)
    g = sh.out_gpus[: k * ng].reshape(k, ng).astype(np.int64)
    c = sh.out_cores[: k * nc].reshape(k, nc).astype(np.int64)
    g_glob = (g + model.gpu_offsets[n][:, None]).reshape(-1)
    c_glob = (c + model.core_offsets[n][:, None]).reshape(-1)
    return Alloc(n, g_glob, c_glob, sh.mem)


class _Placer:
    """Placement on a state through its cores, the count check first."""

    def __init__(self, model: ClusterModel, stats: Stats) -> None:
        self.model, self.stats = model, stats
        # Shapes the count check refused on the free state: resources only shrink until the
        # next job ends, so they stay refused until then (``clear`` on every end).
        self.refused: set[int] = set()

    def place(self, sh: _Shape, state: _State, cores: _Cores, commit: bool,
              is_now: bool = False) -> Alloc | None:
        if is_now and id(sh) in self.refused:
            return None
        v = sh.verdict(state)
        if v == _NO:
            if is_now:
                self.refused.add(id(sh))
            return None
        if v == _YES and not commit:
            return _PROBE
        alloc = _try(cores.get(sh.part, state), sh, self.model, commit, self.stats)
        if alloc is None and v == _YES:
            raise RuntimeError(f"placement core refused a request the count check admits: "
                               f"{sh.kr} in partition {sh.part!r}")
        return alloc


#: What a successful probe (commit=False) answers when no placement is needed.
_PROBE = Alloc(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
               np.zeros(0, dtype=np.int64), 0)


@dataclass
class _Ctx:
    """What one replay's scheduling passes share."""

    model: ClusterModel
    jobs: Sequence[SimJob]
    shapes: list[_Shape]  # per position in jobs
    running: dict[int, JobRecord]
    planned_end: dict[int, float]
    now: _State
    cores_now: _Cores
    masks: Mapping[str, npt.NDArray[np.uint8]]
    node_sets: Mapping[str, frozenset[int]]
    depth: int
    stats: Stats
    start: Callable[[int, Alloc, float], None]
    memo: _Memo
    lay: _Layout
    placer: _Placer
    table: _RunTable


def setup(model: ClusterModel, jobs: Sequence[SimJob], partitions: Mapping[str, Sequence[int]],
          fast: bool) -> tuple[dict[str, npt.NDArray[np.uint8]], dict[str, frozenset[int]],
                               _Layout, _State, Stats, _Cores, list[_Shape]]:
    """What a replay starts from (shared with :mod:`hetslurm.simulate.slurm_backfill`): a node
    mask and node set per partition, the layout, the empty state, the counters, the
    partitions' cores, and each job's request shape (one per distinct request and
    partition)."""
    masks: dict[str, npt.NDArray[np.uint8]] = {}
    node_sets: dict[str, frozenset[int]] = {}
    for name, idx in partitions.items():
        m = np.zeros(model.n_nodes, dtype=np.uint8)
        m[list(idx)] = 1
        masks[name], node_sets[name] = m, frozenset(idx)
    lay = _Layout.of(model)
    stats = Stats()
    interned: dict[tuple[KernelRequest, str], _Shape] = {}
    shapes: list[_Shape] = []
    for j in jobs:
        sh = interned.get((j.kr, j.partition))
        if sh is None:
            sh = _Shape(model, j.kr, j.partition, masks[j.partition], fast)
            interned[(j.kr, j.partition)] = sh
        shapes.append(sh)
    return (masks, node_sets, lay, _State.empty(model, lay), stats,
            _Cores(model, masks, node_sets, stats), shapes)


def replay(
    model: ClusterModel,
    jobs: Sequence[SimJob],
    partitions: Mapping[str, Sequence[int]],
    *,
    backfill_depth: int,
    load: float = 1.0,
    progress: Callable[[int], None] | None = None,
    fast: bool = True,
) -> ReplayResult:
    """Replay ``jobs`` (submit times divided by ``load``) on ``model``.

    Args:
        model: the cluster as the policy renders it (node weights), empty.
        jobs: the policy's jobs; each names its partition.
        partitions: node indices of each partition name the jobs use.
        backfill_depth: how many jobs after the head backfill considers.
        load: arrival-rate multiplier (2 = jobs arrive twice as fast).
        progress: called with the number of jobs finished so far, now and then.
        fast: answer placements by free counts where they decide (the default); False asks
            the placement core every time (the reference path: the same result, slower).
    """
    masks, node_sets, lay, now, stats, cores_now, shapes = setup(model, jobs, partitions, fast)
    submit = {j.index: j.submit / load for j in jobs}
    events: list[tuple[float, int, int]] = [(submit[j.index], 1, i) for i, j in enumerate(jobs)]
    heapq.heapify(events)
    pending: list[tuple[int, float, int]] = []  # (priority, submit, position in jobs), sorted
    running: dict[int, JobRecord] = {}
    planned_end: dict[int, float] = {}
    records: list[JobRecord] = []
    last_t = 0.0
    first = min(submit.values()) if submit else 0.0
    gpu_model_of = model.gpu_model
    memo = _Memo()
    table = _RunTable()

    def start(pos: int, alloc: Alloc, t: float) -> None:
        memo.version += 1
        job = jobs[pos]
        m = int(gpu_model_of[int(alloc.nodes[0])])
        runtime = job.runtime.get(m, job.runtime.get(-1, 0.0)) if m >= 0 else job.runtime[-1]
        rec = JobRecord(job, submit[job.index], t, t + runtime, m, alloc)
        running[pos] = rec
        planned_end[pos] = t + job.time_limit
        table.add(pos, alloc, t + job.time_limit)
        heapq.heappush(events, (rec.end, 0, pos))

    ctx = _Ctx(model, jobs, shapes, running, planned_end, now, cores_now, masks, node_sets,
               backfill_depth, stats, start, memo, lay, _Placer(model, stats), table)
    while events:
        t = events[0][0]
        if pending:
            stats.queue_area += len(pending) * (t - last_t)
            stats.saturated_s += t - last_t
        was_saturated = bool(pending)
        last_t = t
        changed_nodes: list[npt.NDArray[np.int64]] = []
        while events and events[0][0] == t:
            _, kind, pos = heapq.heappop(events)
            if kind == 0:
                rec = running.pop(pos)
                planned_end.pop(pos)
                table.remove(pos)
                memo.version += 1
                now.give(rec.alloc)
                changed_nodes.append(rec.alloc.nodes)
                records.append(rec)
                if was_saturated:
                    stats.saturated_completions += 1
            else:
                j = jobs[pos]
                bisect.insort(pending, (j.priority, submit[j.index], pos))
        if changed_nodes:
            ctx.placer.refused.clear()
        for nodes in changed_nodes:
            cores_now.touched(nodes, None)
        if pending:
            _schedule(t, ctx, pending)
        if progress is not None and changed_nodes:
            progress(len(records))
    makespan = max((r.end for r in records), default=0.0)
    return ReplayResult(records, stats, makespan, first, unfinished=len(pending))


def _schedule(t: float, cx: _Ctx, pending: list[tuple[int, float, int]]) -> None:
    cx.stats.passes += 1
    started: set[int] = set()
    # (shape id, 0 = against the free state, 1 = against the reservation's leftovers)
    failed: set[tuple[int, int]] = set()
    head = -1
    now, cores_now, shapes = cx.now, cx.cores_now, cx.shapes
    for q, (_, _, pos) in enumerate(pending):
        sh = shapes[pos]
        if (id(sh), 0) in failed:
            head = q
            break
        cx.stats.placements_tried += 1
        alloc = cx.placer.place(sh, now, cores_now, commit=True, is_now=True)
        if alloc is None:
            failed.add((id(sh), 0))
            head = q
            break
        now.take(alloc)
        cores_now.touched(alloc.nodes, sh.part)
        cx.start(pos, alloc, t)
        started.add(q)
    if head >= 0 and cx.depth > 0:
        _backfill(t, cx, pending, head, started, failed)
    for q in sorted(started, reverse=True):
        del pending[q]


def _backfill(t: float, cx: _Ctx, pending: list[tuple[int, float, int]], head: int,
              started: set[int], failed: set[tuple[int, int]]) -> None:
    hpos = pending[head][2]
    window = range(head + 1, min(len(pending), head + 1 + cx.depth))
    now, cores_now, shapes, stats, memo = cx.now, cx.cores_now, cx.shapes, cx.stats, cx.memo
    # Nothing can be backfilled unless some candidate fits now: check that first (one check
    # per distinct request) and skip the reservation search when none does. The outcome is
    # the same; deep queues on a full cluster get much cheaper.
    if not _any_fits_now(cx, pending, window, failed):
        return
    # The reservation is a function of the head and the running set (the state is the empty
    # cluster minus what runs): reuse it while neither changed.
    if memo.key != (hpos, memo.version) or memo.value is None:
        memo.value = _reservation(cx, shapes[hpos])
        memo.key = (hpos, memo.version)
        stats.reservations += 1
    shadow = memo.value.shadow
    if math.isinf(shadow):
        return  # the head cannot fit even when everything running ends: no backfill
    # What backfill jobs that end after the shadow time may use (``resv``): now, minus the
    # head's reserved devices and cores, and memory kept for the head at the shadow time.
    # Built when the first such job is tried: from ``now`` as it is then, which is the same
    # as building it first and masking every short job's allocation since.
    resv: _State | None = None
    fut_mem = now.mem_free
    cores_resv = _Cores(cx.model, cx.masks, cx.node_sets, stats)
    jobs, placer = cx.jobs, cx.placer
    for q in window:
        pos = pending[q][2]
        sh = shapes[pos]
        short = t + jobs[pos].time_limit <= shadow
        key = (id(sh), 0 if short else 1)
        if key in failed:
            continue
        stats.placements_tried += 1
        if short:
            alloc = placer.place(sh, now, cores_now, commit=True, is_now=True)
            if alloc is None:
                failed.add(key)
                continue
            now.take(alloc)
            cores_now.touched(alloc.nodes, sh.part)
            if resv is not None:
                resv.mask(alloc.gpus, alloc.cores, cx.lay)
                resv.mem_free = np.minimum(now.mem_free, fut_mem)
                cores_resv.touched(alloc.nodes, None)
        else:
            if resv is None:
                future, reserved = memo.value.placement()
                fut_mem = future.mem_free.copy()
                fut_mem[reserved.nodes] -= reserved.mem
                resv = now.copy()
                resv.mask(reserved.gpus, reserved.cores, cx.lay)
                resv.mem_free = np.minimum(resv.mem_free, fut_mem)
            alloc = placer.place(sh, resv, cores_resv, commit=True)
            if alloc is None:
                failed.add(key)
                continue
            now.take(alloc)
            resv.take(alloc)
            fut_mem[alloc.nodes] -= alloc.mem
            cores_now.touched(alloc.nodes, None)
            cores_resv.touched(alloc.nodes, sh.part)
        stats.backfilled += 1
        cx.start(pos, alloc, t)
        started.add(q)


def _any_fits_now(cx: _Ctx, pending: list[tuple[int, float, int]], window: range,
                  failed: set[tuple[int, int]]) -> bool:
    seen: set[int] = set()
    shapes = cx.shapes
    for q in window:
        sh = shapes[pending[q][2]]
        key = id(sh)
        if key in seen or (key, 0) in failed:
            continue
        seen.add(key)
        cx.stats.placements_tried += 1
        if cx.placer.place(sh, cx.now, cx.cores_now, commit=False, is_now=True) is not None:
            return True
        # Resources only shrink during a pass: it fits neither now nor inside the
        # reservation's leftovers.
        failed.add((key, 0))
        failed.add((key, 1))
    return False


class _RunTable:
    """What running jobs hold, one entry per job and node (node, GPUs, cores, MiB, planned
    end), in arrays: a reservation finds the release order and the free counts after the
    first k releases without a loop over the running jobs."""

    def __init__(self) -> None:
        self.free: list[int] = []
        self.slots: dict[int, list[int]] = {}
        self.pos = np.zeros(0, dtype=np.int64)
        self.node = np.zeros(0, dtype=np.int64)
        self.g = np.zeros(0, dtype=np.int64)
        self.c = np.zeros(0, dtype=np.int64)
        self.m = np.zeros(0, dtype=np.int64)
        self.end = np.zeros(0, dtype=np.float64)
        self.live = np.zeros(0, dtype=bool)
        self._grow()

    def _grow(self) -> None:
        old = len(self.pos)
        cap = max(2 * old, 256)
        for name in ("pos", "node", "g", "c", "m", "end", "live"):
            a = getattr(self, name)
            b = np.zeros(cap, dtype=a.dtype)
            b[:old] = a
            setattr(self, name, b)
        self.free.extend(range(cap - 1, old - 1, -1))

    def add(self, pos: int, a: Alloc, end: float) -> None:
        k = len(a.nodes)
        while len(self.free) < k:
            self._grow()
        sl = [self.free.pop() for _ in range(k)]
        self.slots[pos] = sl
        self.pos[sl] = pos
        self.node[sl] = a.nodes
        self.g[sl] = len(a.gpus) // k
        self.c[sl] = len(a.cores) // k
        self.m[sl] = a.mem
        self.end[sl] = end
        self.live[sl] = True

    def remove(self, pos: int) -> None:
        sl = self.slots.pop(pos)
        self.live[sl] = False
        self.free.extend(sl)

    def order(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                             npt.NDArray[np.int64]]:
        """Entries in release order (planned end, then position: a job's entries together),
        the jobs in that order, and the number of entries of the first k jobs at k - 1."""
        live = np.flatnonzero(self.live)
        ent = live[np.lexsort((self.pos[live], self.end[live]))]
        jp = self.pos[ent]
        first = np.flatnonzero(np.concatenate(([True], jp[1:] != jp[:-1])))
        ends = np.append(first[1:], len(ent)).astype(np.int64)
        return ent, jp[first], ends


class _Released:
    """Free counts and states once the first k jobs of the release order have ended: per
    node sums over the table's entries of those jobs."""

    def __init__(self, now: _State, table: _RunTable, running: Mapping[int, JobRecord],
                 n: int) -> None:
        ent, self.order, self.ends = table.order()
        self.now, self.running, self.n = now, running, n
        self.nodes, self.g, self.c, self.m = (table.node[ent], table.g[ent], table.c[ent],
                                              table.m[ent])

    def _added(self, k: int, per: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        cut = int(self.ends[k - 1])
        return np.bincount(self.nodes[:cut], per[:cut], self.n).astype(np.int64)

    def counts_after(self, k: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                            npt.NDArray[np.int64]]:
        """Free GPUs, free cores and free memory per node."""
        now = self.now
        return (now.gpu_cnt + self._added(k, self.g), now.core_cnt + self._added(k, self.c),
                now.mem_free + self._added(k, self.m))

    def state_after(self, k: int) -> _State:
        """The same as giving the first k allocations back one by one (they are disjoint)."""
        s = self.now.copy()
        allocs = [self.running[int(p)].alloc for p in self.order[:k]]
        s.gpu_free[np.concatenate([a.gpus for a in allocs])] = 1
        s.core_free[np.concatenate([a.cores for a in allocs])] = 1
        s.gpu_cnt, s.core_cnt, s.mem_free = self.counts_after(k)
        return s


class _Reservation:
    """The head's reservation: the shadow time (``inf``: the head never fits), and the state
    and the head's placement then, found on first use (only backfill candidates that end
    after the shadow time need them)."""

    def __init__(self, shadow: float, find: Callable[[], tuple[_State, Alloc | None]]
                 ) -> None:
        self.shadow = shadow
        self._find = find
        self._found: tuple[_State, Alloc] | None = None

    def placement(self) -> tuple[_State, Alloc]:
        if self._found is None:
            s, a = self._find()
            if a is None:
                raise RuntimeError("placement core refused a reservation the count check "
                                   "admits")
            self._found = (s, a)
        return self._found


def _never(now: _State) -> _Reservation:
    return _Reservation(math.inf, lambda: (now, None))


def _reservation(cx: _Ctx, sh: _Shape) -> _Reservation:
    """The head's reservation: running jobs end in the order of their planned end until the
    head fits (binary search over how many end: fitting only grows as they end).

    The reference path (``fast=False``) asks the core at every probe, on the state rebuilt
    by giving back each job. The fast path probes free counts (:class:`_Released`) and asks
    the core only where the counts do not decide, and once for the placement at the shadow
    time when a backfill candidate needs it; the probes are the same, so the shadow time is
    the same.
    """
    model = cx.model
    found: dict[int, tuple[_State, Alloc | None]] = {}
    state_after: Callable[[int], _State]
    if sh.fast:
        # A copy: the placement may be asked for after this pass started more jobs.
        rel = _Released(cx.now.copy(), cx.table, cx.running, model.n_nodes)
        order: Sequence[int] | npt.NDArray[np.int64] = rel.order
        state_after = rel.state_after
    else:
        order = sorted(cx.running, key=lambda p: (cx.planned_end[p], p))

        def state_after(k: int) -> _State:
            s = cx.now.copy()
            for p in order[:k]:
                s.give(cx.running[p].alloc)
            return s

    def core_fits(k: int) -> tuple[_State, Alloc | None]:
        if k not in found:
            s = state_after(k)
            core = _Cores(model, cx.masks, cx.node_sets, cx.stats).get(sh.part, s)
            found[k] = (s, _try(core, sh, model, False, cx.stats))
        return found[k]

    def fits(k: int) -> bool:
        v = sh.check(*rel.counts_after(k)) if sh.fast else _ASK
        if v == _ASK:
            return core_fits(k)[1] is not None
        return v == _YES

    lo, hi = 1, len(order)
    if hi == 0 or not fits(hi):
        return _never(cx.now)
    best = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, hi = mid, mid
        else:
            lo = mid + 1
    return _Reservation(cx.planned_end[int(order[best - 1])], lambda: core_fits(best))
