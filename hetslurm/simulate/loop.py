"""The discrete-event replay: one event loop, the backfill model a plug-in, every placement
by the same compiled core as ``hetslurm place``.

The loop (:func:`replay`) owns what every model shares: submissions (trace time divided by
the load) and ends as events; at each event time the ends, then the submissions, then one
scheduling pass; the pending queue in priority order (priority class, submit time, trace
order), the running jobs and their allocations (:class:`RunTable`), the free state
(:class:`State`) and the counters (:class:`Stats`). A pass is

1. the main scheduler: pending jobs in order, each placed (committed) while it fits. The
   first that does not is the head; what happens after it is the plug-in's
   :attr:`Backfill.fcfs`: strict FCFS stops there (EASY), Slurm's main scheduler skips only
   later jobs of the head's partition (its "failed partition") and goes on;
2. the plug-in's backfill (:meth:`Backfill.run`) when some job is still pending.

Plug-ins: :class:`hetslurm.simulate.easy.Easy` (one reservation, for the head, of the GPUs,
cores and memory its placement takes) and :class:`hetslurm.simulate.slurm_backfill.SlurmRules`
(Slurm 22.05's conservative whole-node reservations, ``bf_window``). Slow, obviously correct
twins of both live with the tests (``tests/unit/replay_reference.py``), which check that the
loop gives the same starts and placements on seeded workloads and trace slices.

Partitions are node masks: a job is placed on a core whose unavailable nodes are those
outside its partition. A core is built from the state arrays when a partition is first
asked for; after that, when a job starts or ends on its nodes, it takes those nodes' state
from the arrays (``PlacementCore.refresh``, the same core as a rebuilt one) instead of
being rebuilt (about 0.1 ms for the case study's 225 nodes).

Count checks. Every state keeps free GPUs and cores per node beside the free flags. A
request shape (compiled request and partition, :class:`Shape`) has a static set of nodes
that can ever hold one share of it, which the core gives (``PlacementCore.static_fit``:
partition, CPU-only, device models and counts, GPU memory); on a state it fits only if at
least ``nodes`` of them have enough free GPUs, cores and memory. That count check is what
the core's per-node test reduces to for requests without NVLink, NUMA, switch, FPGA or
GPU-memory constraints (every request the traces produce): for those shapes the check is
the answer, and the core is called only to commit a placement that will succeed. For other
shapes the check only rules out (it is necessary) and the core decides. A shape the check
refused on the free state stays refused until the next job ends (resources only shrink
until then).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from hetslurm.placement.model import (
    N_INFO,
    N_T,
    PL_PLACED,
    ST_FITS,
    ClusterModel,
    KernelRequest,
    StateArrays,
)
from hetslurm.placement.place import static_fit
from hetslurm.placement.spans import Releases

if TYPE_CHECKING:
    from hetslurm._core import PlacementCore
    from hetslurm.simulate.workload import SimJob

#: Verdicts of a count check.
NO, YES, ASK = 0, 1, 2

#: A pending job: (priority, submit time after the load, position in the jobs).
Pending = tuple[int, float, int]


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
class State:
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
    def empty(cls, model: ClusterModel, lay: Layout) -> State:
        s = model.state
        n = model.n_nodes
        gpu_cnt = np.bincount(lay.gpu_node[s.gpu_free.astype(bool)], minlength=n)
        core_cnt = np.bincount(lay.core_node[s.core_free.astype(bool)], minlength=n)
        return cls(s.available.copy(), s.gpu_free.copy(), s.fpga_free.copy(),
                   s.core_free.copy(), s.mem_free_mib.copy(), gpu_cnt.astype(np.int64),
                   core_cnt.astype(np.int64))

    def copy(self) -> State:
        return State(self.available.copy(), self.gpu_free.copy(), self.fpga_free.copy(),
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
             lay: Layout) -> None:
        """Mark ``gpus`` and ``cores`` taken, whether or not they are free here."""
        g = gpus[self.gpu_free[gpus] != 0]
        c = cores[self.core_free[cores] != 0]
        self.gpu_free[g] = 0
        self.core_free[c] = 0
        np.subtract.at(self.gpu_cnt, lay.gpu_node[g], 1)
        np.subtract.at(self.core_cnt, lay.core_node[c], 1)


@dataclass(frozen=True)
class Layout:
    """The node of every GPU and core."""

    gpu_node: npt.NDArray[np.int64]
    core_node: npt.NDArray[np.int64]

    @classmethod
    def of(cls, model: ClusterModel) -> Layout:
        n = np.arange(model.n_nodes, dtype=np.int64)
        return cls(np.repeat(n, np.diff(model.gpu_offsets)),
                   np.repeat(n, np.diff(model.core_offsets)))


class Shape:
    """One request shape (compiled request, partition): the core's arguments, output
    buffers, and the count check over the nodes the core says can ever hold one share
    (``static``: a core of the partition, asked by :func:`~hetslurm.placement.place.
    static_fit`)."""

    def __init__(self, model: ClusterModel, kr: KernelRequest, part: str,
                 static: PlacementCore, lay: Layout) -> None:
        self.kr, self.part = kr, part
        k = kr.nodes
        self.k, self.ng, self.nc, self.mem = k, kr.gpus, kr.cores, kr.mem_mib
        self.req = kr.vector()
        self.mrank = np.asarray(kr.gpu_rank, dtype=np.int32).reshape(-1)
        self.frank = np.asarray(kr.fpga_rank, dtype=np.int32).reshape(-1)
        self.w = np.asarray(kr.weights, dtype=np.int64)
        #: The score is the node weight alone (every term but the weight's is 0), and that
        #: term's weight: a backfill model may choose nodes by weight without the core.
        self.weight_only = not bool(np.any(self.w[:-2]))
        self.weight_term = int(self.w[6])
        self.out_nodes = np.full(max(k, 1), -1, dtype=np.int32)
        self.out_gpus = np.full(max(k * kr.gpus, 1), -1, dtype=np.int32)
        self.out_fpgas = np.full(max(k * kr.fpgas, 1), -1, dtype=np.int32)
        self.out_cores = np.full(max(k * kr.cores, 1), -1, dtype=np.int32)
        self.out_terms = np.zeros(max(k * N_T, 1), dtype=np.int64)
        self.out_info = np.zeros(N_INFO, dtype=np.int64)
        self.idx = np.flatnonzero(static_fit(model, kr, core=static) == ST_FITS)
        exact = not (kr.nvlink or kr.numa or kr.switch) and kr.fpgas == 0
        if kr.gpus > 0 and exact:
            # Free GPUs stand for free qualifying GPUs only where every GPU qualifies.
            short = np.zeros(model.n_nodes, dtype=bool)
            short[lay.gpu_node[model.gpu_mem_mib < kr.min_gpu_mem_mib]] = True
            exact = not bool(short[self.idx].any())
        self.exact = exact

    def check(self, gpu_cnt: npt.NDArray[np.int64], core_cnt: npt.NDArray[np.int64],
              mem_free: npt.NDArray[np.int64]) -> int:
        """NO: cannot fit these free counts; YES: fits; ASK: the core must say."""
        idx = self.idx
        fit = core_cnt[idx] >= self.nc
        if self.ng:
            fit &= gpu_cnt[idx] >= self.ng
        if self.mem > 0:
            fit &= mem_free[idx] >= self.mem
        if int(np.count_nonzero(fit)) < self.k:
            return NO
        return YES if self.exact else ASK

    def verdict(self, s: State) -> int:
        return self.check(s.gpu_cnt, s.core_cnt, s.mem_free)

    def fitting(self, s: State) -> list[int]:
        """The nodes whose free counts hold one share of this shape (for a report)."""
        idx = self.idx
        fit = s.core_cnt[idx] >= self.nc
        if self.ng:
            fit &= s.gpu_cnt[idx] >= self.ng
        if self.mem > 0:
            fit &= s.mem_free[idx] >= self.mem
        out: list[int] = idx[fit].tolist()
        return out


@dataclass
class Stats:
    """Counters the replay keeps while it runs."""

    passes: int = 0
    reservations: int = 0  # computed (EASY: a pass with the same head and running set
    # reuses one; Slurm: one per tested job that cannot start now)
    backfilled: int = 0
    queue_area: float = 0.0  # integral of pending jobs over time
    saturated_s: float = 0.0  # time with at least one pending job
    saturated_completions: int = 0
    core_calls: int = 0  # placement-core calls (the count checks answer the rest)
    core_builds: int = 0
    core_refreshes: int = 0  # cores kept in step with a state change (no build)
    #: Times the free counts and the placement core disagreed (the counts admitted what
    #: the core refused): the core's answer was taken and the replay went on. The first
    #: few, each with its time, job, request and the nodes the counts offered.
    disagreements: int = 0
    disagreement_examples: list[dict[str, object]] = field(default_factory=list)

    def disagree(self, t: float, job: SimJob, what: str, nodes: Sequence[int]) -> None:
        """Count one disagreement (kept as an example while there are few)."""
        self.disagreements += 1
        if len(self.disagreement_examples) < MAX_DISAGREEMENT_EXAMPLES:
            self.disagreement_examples.append({
                "time": t, "job": job.id, "what": what, "request": repr(job.kr),
                "partition": job.partition, "nodes_counted_free": [int(n) for n in nodes[:8]],
            })


#: Disagreements kept as examples per replay.
MAX_DISAGREEMENT_EXAMPLES = 10


class Disagreement(RuntimeError):
    """The free counts admitted a placement that the placement core refused."""

    def __init__(self, what: str, sh: Shape, nodes: Sequence[int] = ()) -> None:
        super().__init__(f"placement core refused {what} the count check admits: {sh.kr} in "
                         f"partition {sh.part!r}")
        self.what, self.shape, self.nodes = what, sh, list(nodes)


@dataclass
class ReplayResult:
    records: list[JobRecord]
    stats: Stats
    makespan: float
    first_submit: float
    unfinished: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Cores:
    """Placement cores per partition mask over one state: each built from the state when
    first asked for, then kept in step with it node by node (:meth:`touched`)."""

    def __init__(self, model: ClusterModel, masks: Mapping[str, npt.NDArray[np.uint8]],
                 node_sets: Mapping[str, frozenset[int]], stats: Stats) -> None:
        self.model, self.masks, self.node_sets, self.stats = model, masks, node_sets, stats
        self.cores: dict[str, PlacementCore] = {}

    def get(self, part: str, state: State) -> PlacementCore:
        core = self.cores.get(part)
        if core is None:
            core = new_core(self.model, state, self.masks[part])
            self.stats.core_builds += 1
            self.cores[part] = core
        return core

    def touched(self, nodes: npt.NDArray[np.int64], keep: str | None, state: State) -> None:
        """``state`` changed on ``nodes`` (a job started or ended there): each core but
        ``keep``'s (which made the change itself) takes those nodes' state from it
        (``PlacementCore.refresh``: the same core as one built from ``state``)."""
        if not self.cores:
            return
        hit = set(nodes.tolist())
        idx = None
        for part, core in self.cores.items():
            if part != keep and hit & self.node_sets[part]:
                if idx is None:
                    idx = np.ascontiguousarray(nodes, dtype=np.int64)
                core.refresh(idx, state.available & self.masks[part], state.gpu_free,
                             state.fpga_free, state.core_free, state.mem_free)
                self.stats.core_refreshes += 1


def new_core(model: ClusterModel, state: State, usable: npt.NDArray[np.uint8]
             ) -> PlacementCore:
    """A core of ``state`` where only ``usable`` nodes are available."""
    return model.new_core(StateArrays(
        available=state.available & usable, gpu_free=state.gpu_free,
        fpga_free=state.fpga_free, core_free=state.core_free,
        mem_free_mib=np.maximum(state.mem_free, 0), free_at=model.state.free_at))


def try_place(core: PlacementCore, sh: Shape, model: ClusterModel, commit: bool,
              stats: Stats) -> Alloc | None:
    """The core's placement of ``sh`` (committed on the core when ``commit``)."""
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


class Placer:
    """Placement on a state through its cores, the count check first."""

    def __init__(self, model: ClusterModel, stats: Stats) -> None:
        self.model, self.stats = model, stats
        # Shapes the count check refused on the free state: resources only shrink until the
        # next job ends, so they stay refused until then (``clear`` on every end).
        self.refused: set[int] = set()

    def place(self, sh: Shape, state: State, cores: Cores, commit: bool,
              is_now: bool = False) -> Alloc | None:
        if is_now and id(sh) in self.refused:
            return None
        v = sh.verdict(state)
        if v == NO:
            if is_now:
                self.refused.add(id(sh))
            return None
        if v == YES and not commit:
            return PROBE
        alloc = try_place(cores.get(sh.part, state), sh, self.model, commit, self.stats)
        if alloc is None and v == YES:
            raise Disagreement("a request", sh, sh.fitting(state))
        return alloc


#: What a successful probe (commit=False) answers when no placement is needed.
PROBE = Alloc(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
              np.zeros(0, dtype=np.int64), 0)


class RunTable:
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


class Released:
    """Free counts and states once the first k jobs of the release order have ended: per
    node sums over the table's entries of those jobs."""

    def __init__(self, now: State, table: RunTable, running: Mapping[int, JobRecord],
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

    def state_after(self, k: int) -> State:
        """The same as giving the first k allocations back one by one (they are disjoint)."""
        s = self.now.copy()
        allocs = [self.running[int(p)].alloc for p in self.order[:k]]
        s.gpu_free[np.concatenate([a.gpus for a in allocs])] = 1
        s.core_free[np.concatenate([a.cores for a in allocs])] = 1
        s.gpu_cnt, s.core_cnt, s.mem_free = self.counts_after(k)
        return s


class Replay:
    """What one replay's loop and its backfill plug-in share: the cluster and its partition
    masks, the jobs and their shapes, the free state and its cores, the running jobs (by
    position in ``jobs``) and the counters. ``version`` changes on every start and end (a
    plug-in may keep what it found while the running set stays the same)."""

    def __init__(self, model: ClusterModel, jobs: Sequence[SimJob],
                 partitions: Mapping[str, Sequence[int]], load: float) -> None:
        self.model, self.jobs = model, jobs
        self.masks: dict[str, npt.NDArray[np.uint8]] = {}
        self.node_sets: dict[str, frozenset[int]] = {}
        for name, idx in partitions.items():
            m = np.zeros(model.n_nodes, dtype=np.uint8)
            m[list(idx)] = 1
            self.masks[name], self.node_sets[name] = m, frozenset(idx)
        self.lay = Layout.of(model)
        self.stats = Stats()
        self.now = State.empty(model, self.lay)
        self.cores_now = Cores(model, self.masks, self.node_sets, self.stats)
        self.placer = Placer(model, self.stats)
        self.table = RunTable()
        #: The running jobs' holdings per node in planned-end order (the slurm model's
        #: earliest fits).
        self.releases = Releases(model.n_nodes)
        #: Per partition, a core of the empty cluster and its availability (backfill
        #: plug-ins place weight-only shapes on it: ``slurm_backfill._place_on_empty``).
        self.empty_cores: dict[str, tuple[PlacementCore, npt.NDArray[np.uint8]]] = {}
        self.running: dict[int, JobRecord] = {}
        self.planned_end: dict[int, float] = {}
        self.version = 0
        # One shape per distinct request and partition; the partitions' empty cores say
        # which nodes can ever hold each (not counted in the stats: no placement asks them).
        static = {name: new_core(model, self.now, m) for name, m in self.masks.items()}
        interned: dict[tuple[KernelRequest, str], Shape] = {}

        def shape(kr: KernelRequest, part: str) -> Shape:
            sh = interned.get((kr, part))
            if sh is None:
                sh = Shape(model, kr, part, static[part], self.lay)
                interned[(kr, part)] = sh
            return sh

        self.shapes: list[Shape] = [shape(j.kr, j.partition) for j in jobs]
        #: Ranked fallback: the shapes the main scheduler tries in order (the job's
        #: per-model partitions); backfill plans with ``shapes`` (their union).
        self.ranked: dict[int, list[Shape]] = {
            pos: [shape(j.kr, p) for p in j.ranked] for pos, j in enumerate(jobs) if j.ranked}
        self.submit = {j.index: j.submit / load for j in jobs}
        self.events: list[tuple[float, int, int]] = [
            (self.submit[j.index], 1, i) for i, j in enumerate(jobs)]
        heapq.heapify(self.events)

    def start(self, pos: int, alloc: Alloc, t: float) -> None:
        """Start job ``pos`` at ``t`` on ``alloc`` (free in the state)."""
        self.version += 1
        self.now.take(alloc)
        job = self.jobs[pos]
        m = int(self.model.gpu_model[int(alloc.nodes[0])])
        runtime = job.runtime.get(m, job.runtime.get(-1, 0.0)) if m >= 0 else job.runtime[-1]
        rec = JobRecord(job, self.submit[job.index], t, t + runtime, m, alloc)
        self.running[pos] = rec
        self.planned_end[pos] = t + job.time_limit
        self.table.add(pos, alloc, t + job.time_limit)
        k = len(alloc.nodes)
        self.releases.add(pos, np.ascontiguousarray(alloc.nodes, dtype=np.int64),
                          len(alloc.gpus) // k, len(alloc.cores) // k, alloc.mem,
                          t + job.time_limit)
        heapq.heappush(self.events, (rec.end, 0, pos))

    def end(self, pos: int) -> JobRecord:
        """End running job ``pos``: its resources are free again."""
        self.version += 1
        rec = self.running.pop(pos)
        self.planned_end.pop(pos)
        self.table.remove(pos)
        self.releases.remove(pos, np.ascontiguousarray(rec.alloc.nodes, dtype=np.int64))
        self.now.give(rec.alloc)
        self.cores_now.touched(rec.alloc.nodes, None, self.now)
        return rec

    def start_now(self, pos: int, t: float, *, ranked: bool = True,
                  failed: set[str] | None = None) -> bool:
        """Place job ``pos`` on the free state and start it, if it fits; with ``ranked``
        (the main scheduler) in the first of its ranked partitions where it fits, as Slurm
        tries a job's partitions in order. Backfill plans and starts with the union
        (``ranked=False``): a model of Slurm's main scheduler only (docs/simulate.md).

        ``failed``: the main scheduler's failed partitions in this pass. A partition in it
        is not tried; one where the job does not fit is added to it (Slurm's job queue
        holds one record per job and partition, and a record that cannot start marks its
        partition failed: ``PART_FLAG_SCHED_FAILED`` in job_scheduler.c ``_schedule``)."""
        alloc = None
        for sh in (self.ranked.get(pos) if ranked else None) or (self.shapes[pos],):
            if failed is not None and sh.part in failed:
                continue
            try:
                alloc = self.placer.place(sh, self.now, self.cores_now, commit=True,
                                          is_now=True)
            except Disagreement as exc:  # the core decides: it does not fit there now
                self.stats.disagree(t, self.jobs[pos], exc.what, exc.nodes)
                alloc = None
            if alloc is not None:
                break
            if failed is not None:
                failed.add(sh.part)
        if alloc is None:
            return False
        self.start(pos, alloc, t)
        self.cores_now.touched(alloc.nodes, sh.part, self.now)
        return True

    def main(self, t: float, pending: list[Pending], fcfs: bool) -> tuple[set[int], int]:
        """The main scheduler: pending jobs in order, each started if it fits. Returns the
        queue indices started and the head (the first that did not fit, -1 if none); with
        ``fcfs`` it stops at the head, else it skips later jobs' records in failed
        partitions: a job of ranked fallback is tried in each of its partitions that has
        not failed, in its order, and each where it does not fit fails (Slurm's records
        per job and partition, adjacent in its queue: same priority, submission and id)."""
        started: set[int] = set()
        failed: set[str] = set()
        head = -1
        for q, (_, _, pos) in enumerate(pending):
            if self.start_now(pos, t, failed=failed):
                started.add(q)
                continue
            if head < 0:
                head = q
            if fcfs:
                break
        return started, head


class Backfill(Protocol):
    """A backfill model: how the main scheduler goes on after the head, and the backfill
    pass after it. One instance serves one replay at a time (:meth:`reset` starts one)."""

    #: True: the main scheduler stops at the head (strict FCFS); False: it skips only later
    #: jobs of the head's partition (and of any other partition that fails).
    fcfs: bool

    def reset(self) -> None:
        """Forget what an earlier replay left."""

    def run(self, t: float, r: Replay, pending: list[Pending], head: int,
            started: set[int]) -> None:
        """Backfill at ``t`` after the main scheduler: start jobs (``r.start``) and add
        their queue indices to ``started``."""


def replay(model: ClusterModel, jobs: Sequence[SimJob], partitions: Mapping[str, Sequence[int]],
           backfill: Backfill, *, load: float = 1.0,
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """Replay ``jobs`` (submit times divided by ``load``) on ``model`` with ``backfill``.

    Args:
        model: the cluster as the policy renders it (node weights), empty.
        jobs: the policy's jobs; each names its partition.
        partitions: node indices of each partition name the jobs use.
        backfill: the backfill model (:class:`~hetslurm.simulate.easy.Easy`,
            :class:`~hetslurm.simulate.slurm_backfill.SlurmRules`).
        load: arrival-rate multiplier (2 = jobs arrive twice as fast).
        progress: called with the number of jobs finished so far, now and then.
    """
    r = Replay(model, jobs, partitions, load)
    backfill.reset()
    events, stats = r.events, r.stats
    pending: list[Pending] = []  # sorted
    records: list[JobRecord] = []
    last_t = 0.0
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
                records.append(r.end(pos))
                ended = True
                if was_saturated:
                    stats.saturated_completions += 1
            else:
                j = jobs[pos]
                bisect.insort(pending, (j.priority, r.submit[j.index], pos))
        if ended:
            r.placer.refused.clear()
        if pending:
            stats.passes += 1
            started, head = r.main(t, pending, backfill.fcfs)
            if head >= 0:
                backfill.run(t, r, pending, head, started)
            for q in sorted(started, reverse=True):
                del pending[q]
        if progress is not None and ended:
            progress(len(records))
    makespan = max((rec.end for rec in records), default=0.0)
    first = min(r.submit.values()) if r.submit else 0.0
    return ReplayResult(records, stats, makespan, first, unfinished=len(pending))
