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

    def __init__(self, depth: int, window_s: float = math.inf) -> None:
        self.depth, self.window_s = depth, window_s
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
                 load: float = 1.0, window_s: float = math.inf,
                 progress: Callable[[int], None] | None = None) -> ReplayResult:
    """The loop with Slurm's rules (``backfill_depth``: ``bf_max_job_test``, jobs tested per
    backfill pass; ``window_s``: ``bf_window``, a job that cannot start within it gets no
    reservation; the rest as :func:`hetslurm.simulate.loop.replay`)."""
    return replay_loop(model, jobs, partitions, SlurmRules(backfill_depth, window_s),
                       load=load, progress=progress)
