"""A replay with Slurm 22.05's own backfill rules: conservative, whole nodes.

:mod:`hetslurm.simulate.easy` models EASY backfill (one reservation, for the head, of the
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

A plug-in of the replay loop (:mod:`hetslurm.simulate.loop`): the loop's main scheduler
runs first with Slurm's rule (jobs in priority order, each started when it fits; once one
does not, later jobs of the same partition wait for backfill, Slurm's "failed partition"),
then :class:`SlurmRules`. Placement is the compiled core's.

Speed: free counts per node answer the probes (see docs/simulate.md, "Speed"); the
reference twin (``tests/unit/replay_reference.py``) builds a placement core for every probe
and gives the same starts, placements and reservations.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hetslurm.placement.model import StateArrays
from hetslurm.placement.spans import NodeSpans
from hetslurm.simulate.loop import (
    ASK,
    YES,
    Alloc,
    Disagreement,
    Pending,
    Released,
    Replay,
    ReplayResult,
    RunTable,
    Shape,
    State,
    new_core,
    try_place,
)
from hetslurm.simulate.loop import replay as replay_loop
from hetslurm.simulate.params import WILL_RUN

if TYPE_CHECKING:
    from hetslurm.placement.model import ClusterModel
    from hetslurm.simulate.workload import SimJob


#: What a backfill pass found for one tested job: (position, start, nodes), or (position,
#: None, None) when it found no start within the window.
_Tested = tuple[int, float, list[int]] | tuple[int, None, None]


@dataclass
class _PassMemo:
    """What the last backfill pass found for each job it tested, in order, if it started
    none, and the running set's version then: a pass with the same running set finds the
    same reservations for the same jobs (no candidate time lies between the two passes:
    every planned end is still ahead), except that a job that got none may now find one
    inside the window's later end; it is tested again."""

    at: int = -1
    tested: list[_Tested] = field(default_factory=list)


@dataclass
class _ShapeIndex:
    """One replay's shapes as numbers, for the compiled run of one-node jobs: per job
    position its shape id and time limit; per shape id the shape, whether the weight alone
    picks its one node from free counts (exact, one node, weight-only score: the run's
    jobs) and its weight multiplier."""

    replay: Replay
    shapes: list[Shape]
    sid: npt.NDArray[np.int64]
    limit: npt.NDArray[np.float64]
    fast: npt.NDArray[np.bool_]
    mult: npt.NDArray[np.int64]

    @classmethod
    def of(cls, r: Replay) -> _ShapeIndex:
        ids: dict[int, int] = {}
        shapes: list[Shape] = []
        sid = np.empty(len(r.shapes), dtype=np.int64)
        for pos, sh in enumerate(r.shapes):
            k = ids.get(id(sh))
            if k is None:
                k = ids[id(sh)] = len(shapes)
                shapes.append(sh)
            sid[pos] = k
        n = r.model.n_nodes
        return cls(r, shapes, sid,
                   np.array([j.time_limit for j in r.jobs], dtype=np.float64),
                   np.array([sh.exact and sh.k == 1 and sh.weight_only for sh in shapes],
                            dtype=bool),
                   np.array([sh.weight_term * (n + 1) for sh in shapes], dtype=np.int64))


class SlurmRules:
    """Slurm 22.05's backfill: up to ``depth`` pending jobs (``bf_max_job_test``) in
    priority order, each started now if it fits on nodes free of every earlier reservation
    for its whole time limit, else given a whole-node reservation at the earliest time it
    fits, within ``window_s`` (``bf_window``)."""

    fcfs = False

    def __init__(self, depth: int, window_s: float = math.inf, *,
                 will_run: str = "exact", clock_phase_s: float = 0.0,
                 slurm_version: tuple[int, ...] | None = None) -> None:
        if will_run not in WILL_RUN:
            raise ValueError(f"will_run is {will_run!r}; one of {', '.join(WILL_RUN)}")
        self.depth, self.window_s, self.will_run = depth, window_s, will_run
        self.phase = clock_phase_s
        #: The "batched" test as Slurm ``slurm_version`` runs it (None: the newest).
        self.relevant = slurm_version is None or tuple(slurm_version) >= LAST_RELEVANT_SINCE
        self.memo = _PassMemo()
        self.ix: _ShapeIndex | None = None
        self.hopeless = np.zeros(0)
        self.slot_of = np.zeros(0, dtype=np.int64)

    def reset(self) -> None:
        self.memo = _PassMemo()
        self.ix = None

    def run(self, t: float, r: Replay, pending: list[Pending], head: int,
            started: set[int]) -> None:
        """Each job is answered from free counts: for exact shapes (every request the
        traces produce) the earliest start per node comes from ``Replay.releases`` and the
        whole-node reservations met so far; the core is asked only to place a job that
        starts now beside reservations, or a multi-node reservation. Other shapes probe the
        core at every candidate time. Runs of one-node jobs whose node the weight alone
        picks are answered in one compiled call (``NodeSpans.reserve_ones``), up to the
        first that could start now."""
        if self.depth <= 0:
            return
        if self.will_run == "batched":
            self._run_batched(t, r, pending, started)
            return
        if self.ix is None or self.ix.replay is not r:
            self.ix = _ShapeIndex.of(r)
            # Per shape id, the shortest limit that found no start within the window: a
            # job of that shape with a limit no shorter finds none either (reservations
            # only grow in a pass). Reset to inf for the shapes a pass met.
            self.hopeless = np.full(len(self.ix.shapes), math.inf)
            # Per shape id, its row of earliest fits in ``raws`` (-1: none yet) until
            # something starts.
            self.slot_of = np.full(len(self.ix.shapes), -1, dtype=np.int64)
        ix, hopeless, slot_of = self.ix, self.hopeless, self.slot_of
        model, stats = r.model, r.stats
        n = model.n_nodes
        horizon = t + self.window_s
        weight = model.weight
        # The jobs this pass tests: the first ``depth`` not started by the main scheduler.
        head_n = self.depth + len(started)
        cands = [(q, e[2]) for q, e in enumerate(pending[:head_n]) if q not in started]
        del cands[self.depth:]
        m = len(cands)
        cpos_l = [p for _, p in cands]
        cpos = np.array(cpos_l, dtype=np.int64)
        csid = ix.sid[cpos]
        climit = ix.limit[cpos]
        cmult = ix.mult[csid]
        slow_at = [*np.flatnonzero(~ix.fast[csid]).tolist(), m]  # where a run must end
        when_out = np.empty(m, dtype=np.float64)
        node_out = np.empty(m, dtype=np.int64)
        resv = NodeSpans(n)
        assigned: list[int] = []  # the shape ids with a row, in row order
        raws = np.empty((min(m, len(ix.shapes)), n), dtype=np.float64)
        memo = self.memo
        reuse = memo.tested if memo.at == r.version else []
        tested_now: list[_Tested] = []
        start_count = len(started)

        def raw_of(k: int) -> npt.NDArray[np.float64]:
            row = int(slot_of[k])
            if row < 0:
                row = len(assigned)
                slot_of[k] = row
                assigned.append(k)
                _earliest_fits(r, ix.shapes[k], t, raws[row])
            out: npt.NDArray[np.float64] = raws[row]
            return out

        def forget_raws() -> None:
            slot_of[assigned] = -1
            assigned.clear()

        try:
            i = 0
            while i < m:
                q, pos = cands[i]
                k = int(csid[i])
                sh = ix.shapes[k]
                limit = float(climit[i])
                if i < len(reuse) and reuse[i][0] == pos:
                    entry = reuse[i]
                    if entry[1] is not None and entry[2] is not None:
                        resv.add(entry[2], entry[1], entry[1] + limit)
                        stats.reservations += 1
                        tested_now.append(entry)
                        i += 1
                        continue
                elif i < len(reuse):
                    reuse = []  # another job here: what follows was found with other reservations
                if (not reuse or i >= len(reuse)) and ix.fast[k]:
                    # A run of one-node weight-only jobs, answered in one call.
                    end = slow_at[bisect.bisect_left(slow_at, i)]
                    rows = slot_of[csid[i:end]]
                    if (rows < 0).any():
                        for x in np.unique(csid[i:end][rows < 0]).tolist():
                            raw_of(x)
                        rows = slot_of[csid[i:end]]
                    stop = resv.reserve_ones(raws, rows, csid[i:end], climit[i:end],
                                             cmult[i:end], hopeless, weight, t, horizon,
                                             when_out[i:end], node_out[i:end])
                    ws = when_out[i:i + stop].tolist()
                    found_n = 0
                    for p, w, nd in zip(cpos_l[i:i + stop], ws, node_out[i:i + stop].tolist(),
                                        strict=True):
                        if w == math.inf:
                            tested_now.append((p, None, None))
                        else:
                            tested_now.append((p, w, [nd]))
                            found_n += 1
                    stats.reservations += found_n
                    i += stop
                    if i == end:
                        continue
                    # Job i could start now: decided one by one below.
                    q, pos = cands[i]
                    k = int(csid[i])
                    sh = ix.shapes[k]
                    limit = float(climit[i])
                i += 1
                if limit >= hopeless[k]:
                    found = None
                elif not sh.exact:
                    found = _probe_core(t, r, sh, resv, limit, horizon)
                else:
                    raw = raw_of(k)
                    try:
                        found = _earliest_exact(t, r, sh, raw, resv, limit, horizon, weight)
                        if found is not None and found[0] == t and found[2] is None:
                            # Nothing blocks it now: the partition's core commits it.
                            if not r.start_now(pos, t, ranked=False):
                                raise Disagreement("a backfill start", sh,
                                                   np.flatnonzero(raw == t).tolist())
                            found = None
                            stats.backfilled += 1
                            started.add(q)
                            forget_raws()
                            reuse = []
                            continue
                    except Disagreement as exc:
                        # The counts and the core disagree: the core decides, asked at every
                        # candidate time as for the shapes the counts do not decide.
                        stats.disagree(t, r.jobs[pos], exc.what, exc.nodes)
                        found = _probe_core(t, r, sh, resv, limit, horizon)
                if found is None:
                    hopeless[k] = min(limit, hopeless[k])
                    tested_now.append((pos, None, None))
                    continue
                reuse = []  # a job that found nothing last time found something: the rest differs
                when, nodes, alloc = found
                if when == t:
                    assert alloc is not None
                    r.start(pos, alloc, t)
                    r.cores_now.touched(alloc.nodes, None, r.now)
                    stats.backfilled += 1
                    started.add(q)
                    forget_raws()
                else:
                    resv.add(nodes, when, when + limit)
                    stats.reservations += 1
                    tested_now.append((pos, when, nodes))
        finally:
            # What this pass found per shape is not the next pass's.
            hopeless[csid] = math.inf
            forget_raws()
        memo.at = -1 if len(started) > start_count else r.version
        memo.tested = tested_now


    def _run_batched(self, t: float, r: Replay, pending: list[Pending],
                     started: set[int]) -> None:
        """The pass as ``sched/backfill`` and cons_tres's will-run test run it
        (:func:`_try_later`): the jobs the main scheduler left, in priority order, one
        test per job and partition (a job of ranked partitions is tested in each, in its
        order, and may hold a reservation in each: Slurm's default, without
        ``bf_one_resv_per_job``), up to ``depth`` tests; each started now on the nodes the
        map leaves it, else given a whole-node reservation at the will-run test's start,
        within the window."""
        window_end = t + self.window_s
        space = _NodeSpace(r.model.n_nodes, t, window_end)
        weight = r.model.weight
        tests = 0
        run = _RunOrder.of(r)
        for q, e in enumerate(pending):
            if tests >= self.depth:
                break
            if q in started:
                continue
            pos = e[2]
            limit = float(r.jobs[pos].time_limit)
            for sh in r.ranked.get(pos) or (r.shapes[pos],):
                if tests >= self.depth:
                    break
                tests += 1
                if run.version != r.version:
                    run = _RunOrder.of(r)
                found = _try_later(t, r, sh, space, limit, window_end, weight, self.phase,
                                   self.relevant, run)
                if found is None:
                    continue
                when, use, nodes = found
                if when == t:
                    alloc = _core_place(r, sh, r.now, use)
                    r.start(pos, alloc, t)
                    r.cores_now.touched(alloc.nodes, None, r.now)
                    r.stats.backfilled += 1
                    started.add(q)
                    break
                space.add(nodes, when, when + limit)
                r.stats.reservations += 1


def _earliest_fits(r: Replay, sh: Shape, t: float, out: npt.NDArray[np.float64]) -> None:
    """Per node, into ``out``: the earliest time one share of ``sh`` fits there (``t`` if
    now, ``inf`` if never or outside the shape's nodes), reservations aside."""
    now = r.now
    r.releases.earliest(sh.idx, sh.ng, sh.nc, sh.mem, now.gpu_cnt, now.core_cnt,
                        now.mem_free, t, out)


class ReleaseViewReference:
    """The numpy twin of ``Releases.earliest`` (``hetslurm._core``), the executable
    definition it is tested against (tests/unit/test_node_spans.py): the running jobs'
    holdings per node in the order of their planned ends: what each node has free once the
    jobs ending by a time have ended, for every such time at once (cumulative sums within
    each node's entries).

    A job still running at ``t`` whose planned end is not after ``t`` (a zero time limit:
    SWF logs hold jobs that ran 0 s) holds its resources for the whole pass at ``t`` (its
    end is the next event at the same time): it is planned to release them at the first
    time after ``t`` that a pass tests, the earliest planned end after ``t`` (every
    reservation ends later than that), never at ``t`` itself."""

    def __init__(self, now: State, table: RunTable, t: float) -> None:
        live = np.flatnonzero(table.live)
        ent = live[np.lexsort((table.end[live], table.node[live]))]
        node = table.node[ent]
        end = table.end[ent]
        later = end[end > t]
        self.node, self.end = node, np.where(end > t, end, later.min() if len(later)
                                             else math.inf)
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

    def earliest(self, sh: Shape, now: State, t: float, n: int) -> npt.NDArray[np.float64]:
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


def _earliest_exact(t: float, cx: Replay, sh: Shape, raw: npt.NDArray[np.float64],
                    resv: NodeSpans, limit: float, horizon: float,
                    weight: npt.NDArray[np.int64]
                    ) -> tuple[float, list[int], Alloc | None] | None:
    """The earliest time within the window ``sh`` fits on nodes free of reservations for
    its whole limit, the nodes, and (starting now beside a reservation) the allocation."""
    n = len(raw)
    if sh.k == 1:
        when, best, blocked_now = resv.earliest_one(raw, limit, t, weight,
                                                    sh.weight_term * (n + 1))
        if when > horizon or when == math.inf:  # inf: no node can ever hold it
            return None
        if when == t:
            if not blocked_now:
                return when, [], None  # nothing now is blocked: the partition's core places it
            return when, [], _core_place(cx, sh, cx.now, resv.feasible_last())
        if sh.weight_only:
            # The core's choice where the score is the node weight alone: the lowest
            # score (node weight times its term weight), ties to the lower index.
            return when, [best], None
        feasible = resv.feasible_last()
    else:
        when = resv.earliest_multi(raw, sh.k, limit, t, horizon)
        if when == math.inf:
            return None
        feasible = (raw <= when) & ~resv.blocked(when, limit)
        if when == t:
            if not resv.count or bool(np.all(feasible[sh.idx] | (raw[sh.idx] != t))):
                return when, [], None  # nothing now is blocked: the partition's core places it
            return when, [], _core_place(cx, sh, cx.now, feasible)
    if sh.k > 1 and sh.weight_only and len(cx.model.switch_parent) == 1:
        # The core's choice where the score is the node weight alone and one switch holds
        # every node: the k lowest scores (node weight times its term weight), ties to the
        # lower index.
        cand = np.flatnonzero(feasible)
        if len(cand) == sh.k:
            return when, cand.tolist(), None
        key = weight[cand] * (sh.weight_term * (n + 1)) + cand
        lowest = cand[np.argsort(key, kind="stable")[: sh.k]]
        return when, sorted(lowest.tolist()), None
    if sh.weight_only:
        # Where the score is the node weight (and the switch tree) alone, the core's choice
        # depends on the state only through which nodes hold the shape: the feasible ones
        # (each holds one share at ``when``, counts exact). The partition's empty-cluster
        # core with only those available chooses the same nodes.
        alloc = _place_on_empty(cx, sh, feasible)
    else:
        alloc = _core_place(cx, sh, _state_at(cx, when), feasible)
    return when, alloc.nodes.tolist(), None


def _place_on_empty(cx: Replay, sh: Shape, usable: npt.NDArray[np.bool_]) -> Alloc:
    """The core's placement of ``sh`` on the empty cluster where only ``usable`` nodes of
    its partition are available: one core per partition per replay, its availability
    changed node by node (``PlacementCore.refresh``)."""
    empty = cx.model.state
    avail = empty.available & cx.masks[sh.part] & usable.astype(np.uint8)
    kept = cx.empty_cores.get(sh.part)
    if kept is None:
        core = cx.model.new_core(StateArrays(
            available=avail, gpu_free=empty.gpu_free, fpga_free=empty.fpga_free,
            core_free=empty.core_free, mem_free_mib=empty.mem_free_mib,
            free_at=empty.free_at))
        cx.stats.core_builds += 1
    else:
        core, last = kept
        changed = np.flatnonzero(avail != last)
        if len(changed):
            core.refresh(changed, avail, empty.gpu_free, empty.fpga_free, empty.core_free,
                         empty.mem_free_mib)
            cx.stats.core_refreshes += 1
    cx.empty_cores[sh.part] = (core, avail)
    alloc = try_place(core, sh, cx.model, False, cx.stats)
    if alloc is None:
        raise Disagreement("a placement", sh, np.flatnonzero(usable).tolist())
    return alloc


def _state_at(cx: Replay, when: float) -> State:
    """The state once every running job planned to end by ``when`` has ended."""
    rel = Released(cx.now.copy(), cx.table, cx.running, cx.model.n_nodes)
    ends = [cx.planned_end[int(p)] for p in rel.order]
    k = bisect.bisect_right(ends, when)
    return rel.state_after(k) if k else rel.now


def _core_place(cx: Replay, sh: Shape, state: State,
                usable: npt.NDArray[np.bool_]) -> Alloc:
    core = new_core(cx.model, state, cx.masks[sh.part] & usable.astype(np.uint8))
    cx.stats.core_builds += 1
    alloc = try_place(core, sh, cx.model, False, cx.stats)
    if alloc is None:
        raise Disagreement("a placement", sh, np.flatnonzero(usable).tolist())
    return alloc


def _probe_core(t: float, cx: Replay, sh: Shape, resv: NodeSpans, limit: float,
                horizon: float) -> tuple[float, list[int], Alloc | None] | None:
    """The reference's probe for shapes the counts do not decide (NVLink, NUMA, switch,
    FPGA, GPU memory): the core at every candidate time."""
    ends = sorted(e for e in cx.planned_end.values() if e > t)
    times = sorted({t, *ends, *resv.ends_after(t)})
    for when in times:
        if when > horizon:
            return None
        state = cx.now if when == t else _state_at(cx, when)
        usable = ~resv.blocked(when, limit)
        core = new_core(cx.model, state, cx.masks[sh.part] & usable.astype(np.uint8))
        cx.stats.core_builds += 1
        alloc = try_place(core, sh, cx.model, False, cx.stats)
        if alloc is None:
            continue
        return when, alloc.nodes.tolist(), alloc if when == t else None
    return None


def replay_slurm(model: ClusterModel, jobs: Sequence[SimJob],
                 partitions: Mapping[str, Sequence[int]], *, backfill_depth: int,
                 load: float = 1.0, window_s: float = math.inf, will_run: str = "exact",
                 clock_phase_s: float = 0.0, slurm_version: tuple[int, ...] | None = None,
                 progress: Callable[[int], None] | None = None) -> ReplayResult:
    """The loop with Slurm's rules (``backfill_depth``: ``bf_max_job_test``, jobs tested per
    backfill pass; ``window_s``: ``bf_window``, a job that cannot start within it gets no
    reservation; ``will_run``, ``clock_phase_s`` and ``slurm_version``:
    :class:`SlurmRules`; the rest as :func:`hetslurm.simulate.loop.replay`)."""
    return replay_loop(model, jobs, partitions,
                       SlurmRules(backfill_depth, window_s, will_run=will_run,
                                  clock_phase_s=clock_phase_s, slurm_version=slurm_version),
                       load=load, progress=progress)


class _NodeSpace:
    """One backfill pass's node space map (``sched/backfill``'s ``node_space``): segments
    ``[begin, end)`` from the pass's start to the window's end, each with the nodes no
    reservation of the pass holds then. A reservation splits the segments at its start and
    end and takes its nodes out of those between; the map ends at the window's end, so a
    reservation is cut there, and one that starts there takes nothing."""

    def __init__(self, n: int, t: float, window_end: float) -> None:
        self.begin = [t]
        self.end = [window_end]
        self.avail = [np.ones(n, dtype=bool)]

    def _split(self, x: float) -> int:
        """The index of the segment that begins at ``x``, splitting one there (``len``
        when ``x`` is at or past the map's end)."""
        if x >= self.end[-1]:
            return len(self.begin)
        x = max(x, self.begin[0])
        i = bisect.bisect_right(self.begin, x) - 1
        if self.begin[i] == x:
            return i
        self.begin.insert(i + 1, x)
        self.end.insert(i + 1, self.end[i])
        self.end[i] = x
        self.avail.insert(i + 1, self.avail[i].copy())
        return i + 1

    def add(self, nodes: Sequence[int], start: float, end: float) -> None:
        a = self._split(start)
        b = self._split(end)
        for i in range(a, b):
            self.avail[i][list(nodes)] = False

    def usable(self, start: float, end: float, base: npt.NDArray[np.bool_]
               ) -> tuple[npt.NDArray[np.bool_], float]:
        """The nodes of ``base`` free in every segment that ends after ``start`` and begins
        by ``end`` (Slurm tests ``begin_time <= end_time``), and ``later_start``: the end of
        the first such segment after which nodes become free that the job could not use
        (0: none), else, as Slurm does when none is found, the end of the segment after the
        first one beyond ``end``, if another follows it."""
        use = base.copy()
        later = 0.0
        n = len(self.begin)
        for j in range(n):
            if self.end[j] > start and j + 1 < n and later == 0.0:
                nxt = base & self.avail[j + 1]
                cur = use & self.avail[j]
                if bool(np.any(nxt & ~cur)):
                    later = self.end[j]
            if self.end[j] <= start:
                continue
            if self.begin[j] <= end:
                use &= self.avail[j]
            else:
                if later == 0.0 and j + 2 < n:
                    later = self.end[j + 1]
                break
        return use, later

    def overlaps(self, nodes: Sequence[int], start: float, end: float) -> bool:
        """Whether a segment overlapping ``[start, end)`` lacks one of ``nodes``
        (``_test_resv_overlap``)."""
        idx = list(nodes)
        return any(self.end[j] > start and self.begin[j] < end
                   and not bool(self.avail[j][idx].all()) for j in range(len(self.begin)))


#: cons_tres's will-run test batches running jobs by planned end in windows from a
#: barrier aligned to this many seconds of the wall clock, doubling the window after each
#: failed test.
WILL_RUN_WINDOW_S = 30


#: Slurm 25.05.1 on ("Prevent jobs running on unneeded nodes delay backfill jobs", commit
#: 977bb2ee4f: ``_get_last_relevant_job``) plans a job from the last removed job that ran
#: on the nodes the test chose; before, from the last removed job wherever it ran.
LAST_RELEVANT_SINCE = (25, 5, 1)


@dataclass(frozen=True)
class _RunOrder:
    """The running jobs' table entries in order of planned end (then position), the same
    for every job a pass tests until something starts (``version``: the replay's then):
    per entry its job's index in that order, per job its first entry and planned end."""

    version: int
    ent: npt.NDArray[np.int64]
    pos: npt.NDArray[np.int64]
    end: npt.NDArray[np.float64]
    first: npt.NDArray[np.int64]
    job_of: npt.NDArray[np.int64]

    @classmethod
    def of(cls, r: Replay) -> _RunOrder:
        tab = r.table
        live = np.flatnonzero(tab.live)
        jp, end = tab.pos[live], tab.end[live]
        order = np.lexsort((jp, end))
        jp, end = jp[order], end[order]
        new_job = np.concatenate(([True], jp[1:] != jp[:-1])) if len(jp) else \
            np.zeros(0, dtype=bool)
        return cls(r.version, live[order], jp, end, np.flatnonzero(new_job),
                   np.cumsum(new_job) - 1)


def _will_run(t: float, r: Replay, sh: Shape, use: npt.NDArray[np.bool_], start_res: float,
              later: float, phase: float, run: _RunOrder | None = None
              ) -> tuple[float, npt.NDArray[np.bool_], npt.NDArray[np.float64]] | None:
    """cons_tres's ``_future_run_test`` on the nodes ``use``: when it says the job can
    start, and the nodes that hold one share of it then.

    Running jobs with a node in ``use`` that are planned to end before ``start_res`` are
    gone first; if the job fits then, it starts at ``start_res``. Else the running jobs
    are walked in order of planned end and those with a node in ``use`` removed, a batch
    at a time, testing after each batch. The first removed job's end, rounded up to the
    next multiple of 30 s of the wall clock (``phase``: the clock's seconds past such a
    multiple at time 0), is the barrier; a batch ends when the job after the last removed
    one ends more than the window (30 s, doubled after each failed test until that job is
    within it) after the barrier. Only that successor is checked: a job without a node in
    ``use`` is passed over unchecked, so the job after it is removed whatever its end. No
    job ending after ``later`` (when set) is removed. The job's start is the planned end
    of the **last job removed**, wherever that job ran (Slurm before 25.05.1); also
    returned, per node, the latest planned end of a job removed in a batch that ran there
    (-inf: none), from which 25.05.1 on takes the start (:data:`LAST_RELEVANT_SINCE`).
    ``run``: the pass's :class:`_RunOrder` (built here when None or stale)."""
    tab = r.table
    if run is None or run.version != r.version:
        run = _RunOrder.of(r)
    if not len(run.ent):
        return None
    ent, jp, end, first, job_of = run.ent, run.pos, run.end, run.first, run.job_of
    n_jobs = len(first)
    job_end = end[first]
    on_use = use[tab.node[ent]]
    overlap = np.zeros(n_jobs, dtype=bool)
    np.logical_or.at(overlap, job_of, on_use)
    removed = np.zeros(n_jobs, dtype=bool)
    n = r.model.n_nodes
    now = r.now
    holds = np.zeros(n, dtype=bool)
    holds[sh.idx] = True
    holds &= use

    def fits() -> npt.NDArray[np.bool_] | None:
        gone = ent[removed[job_of] & on_use]
        nodes = tab.node[gone]
        ok = holds & (now.core_cnt + np.bincount(nodes, tab.c[gone], n) >= sh.nc)
        if sh.ng:
            ok &= now.gpu_cnt + np.bincount(nodes, tab.g[gone], n) >= sh.ng
        if sh.mem > 0:
            ok &= now.mem_free + np.bincount(nodes, tab.m[gone], n) >= sh.mem
        if int(np.count_nonzero(ok)) < sh.k:
            return None
        if not sh.exact:
            state = now.copy()
            for j in np.flatnonzero(removed).tolist():
                state.give(r.running[int(jp[first[j]])].alloc)
            core = new_core(r.model, state, r.masks[sh.part] & use.astype(np.uint8))
            r.stats.core_builds += 1
            if try_place(core, sh, r.model, False, r.stats) is None:
                return None
        return ok

    def batch_ends(early: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
        out = np.full(n, -math.inf)
        sel = (removed & ~early)[job_of] & on_use
        np.maximum.at(out, tab.node[ent[sel]], end[sel])
        return out

    i = 0
    early = np.zeros(n_jobs, dtype=bool)
    if start_res > t:
        early = job_end < start_res
        removed |= early & overlap
        ok = fits()
        if ok is not None:
            return start_res, ok, np.full(n, -math.inf)
        i = int(np.count_nonzero(early))
    w = WILL_RUN_WINDOW_S
    barrier = -1.0
    more = True
    while more:
        last = -1
        nxt = -1
        while True:
            if i >= n_jobs:
                more = False
                break
            j = i
            i += 1
            if later and job_end[j] > later:
                more = False
                break
            if not overlap[j]:
                continue
            if barrier < 0:
                e = float(job_end[j])
                barrier = e + (w - math.fmod(e + phase, w))
            removed[j] = True
            last = j
            if i >= n_jobs:
                more = False
                nxt = -1
                break
            nxt = i
            if job_end[nxt] > barrier + w:
                break
        if last < 0:
            break
        ok = fits()
        if ok is not None:
            return float(job_end[last]), ok, batch_ends(early)
        w *= 2
        while nxt >= 0 and job_end[nxt] > barrier + w:
            w *= 2
    return None


def _try_later(t: float, r: Replay, sh: Shape, space: _NodeSpace, limit: float,
               window_end: float, weight: npt.NDArray[np.int64], phase: float,
               relevant: bool = True, run: _RunOrder | None = None
               ) -> tuple[float, npt.NDArray[np.bool_], list[int]] | None:
    """``sched/backfill``'s test of one pending job (its ``TRY_LATER`` loop): from now, the
    nodes the map leaves it for its limit, the will-run test's start there
    (:func:`_will_run`), and, when the nodes that start would take overlap a reservation
    or nodes free up at ``later_start``, again from then. Returns the start, the nodes it
    may use (a start now) and the nodes it reserves (a later start), or None (no start
    within the window). ``relevant``: Slurm 25.05.1 or later (:data:`LAST_RELEVANT_SINCE`):
    the start is the latest planned end of a removed job on the nodes chosen. ``run``: the
    pass's running jobs in end order (:class:`_RunOrder`)."""
    base = r.masks[sh.part].astype(bool)
    n = r.model.n_nodes
    mult = sh.weight_term * (n + 1)
    start_res = t
    for _ in range(4 * n + 16):
        if start_res > window_end:
            return None
        use, later = space.usable(start_res, start_res + limit, base)
        if int(np.count_nonzero(use)) < sh.k:
            if later:
                start_res = later
                continue
            return None
        if start_res == t:
            fit_now = sh.check(np.where(use, r.now.gpu_cnt, -1),
                               np.where(use, r.now.core_cnt, -1),
                               np.where(use, r.now.mem_free, -1))
            if fit_now == YES or (fit_now == ASK and _fits_core(r, sh, use)):
                return t, use, []
        found = _will_run(t, r, sh, use, start_res, later, phase, run)
        if found is None:
            if later:
                start_res = later
                continue
            return None
        when, feasible, ends_on = found
        if sh.weight_only and sh.exact and (sh.k == 1 or len(r.model.switch_parent) == 1):
            cand = np.flatnonzero(feasible)
            key = weight[cand] * mult + cand
            nodes = sorted(cand[np.argsort(key, kind="stable")[: sh.k]].tolist())
        else:
            state = _state_at(r, np.nextafter(when, -math.inf)
                              if when == start_res and start_res > t else when)
            nodes = _core_place(r, sh, state, feasible).nodes.tolist()
        if relevant:
            on_chosen = float(ends_on[nodes].max())
            if on_chosen > -math.inf:
                when = on_chosen
        if space.overlaps(nodes, when, when + limit):
            start_res = when
            continue
        if later and when > later:
            start_res = later
            continue
        if when > window_end:
            return None
        return when, use, nodes
    return None


def _fits_core(r: Replay, sh: Shape, use: npt.NDArray[np.bool_]) -> bool:
    """Whether the core places ``sh`` on the free state within ``use``."""
    core = new_core(r.model, r.now, r.masks[sh.part] & use.astype(np.uint8))
    r.stats.core_builds += 1
    return try_place(core, sh, r.model, False, r.stats) is not None
