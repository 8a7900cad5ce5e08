"""EASY backfill, a plug-in of the replay loop (:mod:`hetslurm.simulate.loop`).

After strict FCFS has found the head (the first pending job that does not fit):

1. Reservation for the head: running jobs are released in the order of their planned end
   (start + time limit) until the head fits; that end is the shadow time ``s`` and the
   placement found there is reserved (nodes, GPUs, cores, memory).
2. Backfill over the next ``depth`` jobs: a job whose time limit ends by ``s`` may take
   anything free now; a longer one may take only what the reservation leaves (the reserved
   GPUs and cores masked, memory kept for the head at ``s``).

Within a pass a request shape that failed (now, or inside the reservation's leftovers) is
not tried again there: resources only shrink during a pass.

Speed: the reservation's binary search probes the free counts after releasing the first
``k`` running jobs (:class:`~hetslurm.simulate.loop.Released`, sums per node over the run
table) instead of building a core per probe, and asks the core only where the counts do not
decide; the head's placement at the shadow time, and the leftovers long jobs may use, are
computed only when such a job is tried (from a copy of the state taken with the
reservation). The reference twin (``tests/unit/replay_reference.py``) asks a new core at
every probe and gives the same starts and placements.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetslurm.simulate.loop import (
    ASK,
    YES,
    Alloc,
    Cores,
    Pending,
    Released,
    Replay,
    ReplayResult,
    Shape,
    State,
    try_place,
)
from hetslurm.simulate.loop import replay as replay_loop

if TYPE_CHECKING:
    from hetslurm.placement.model import ClusterModel
    from hetslurm.simulate.workload import SimJob


class Reservation:
    """The head's reservation: the shadow time (``inf``: the head never fits), and the state
    and the head's placement then, found on first use (only backfill candidates that end
    after the shadow time need them)."""

    def __init__(self, shadow: float, find: Callable[[], tuple[State, Alloc | None]]) -> None:
        self.shadow = shadow
        self._find = find
        self._found: tuple[State, Alloc] | None = None

    def placement(self) -> tuple[State, Alloc]:
        if self._found is None:
            s, a = self._find()
            if a is None:
                raise RuntimeError("placement core refused a reservation the count check "
                                   "admits")
            self._found = (s, a)
        return self._found


class Easy:
    """EASY backfill over the ``depth`` jobs after the head (``backfill_depth``)."""

    fcfs = True

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.reset()

    def reset(self) -> None:
        # The reservation is a function of the head and the running set (the state is the
        # empty cluster minus what runs): kept while neither changed.
        self.key: tuple[int, int] | None = None
        self.value: Reservation | None = None

    def run(self, t: float, r: Replay, pending: list[Pending], head: int,
            started: set[int]) -> None:
        if self.depth <= 0:
            return
        hpos = pending[head][2]
        window = range(head + 1, min(len(pending), head + 1 + self.depth))
        now, cores_now, shapes, stats = r.now, r.cores_now, r.shapes, r.stats
        # (shape id, 0 = against the free state, 1 = against the reservation's leftovers)
        failed = {(id(shapes[hpos]), 0)}
        # Nothing can be backfilled unless some candidate fits now: check that first (one
        # check per distinct request) and skip the reservation search when none does.
        if not _any_fits_now(r, pending, window, failed):
            return
        if self.key != (hpos, r.version) or self.value is None:
            self.value = _reservation(r, shapes[hpos])
            self.key = (hpos, r.version)
            stats.reservations += 1
        resv_of = self.value
        shadow = resv_of.shadow
        if math.isinf(shadow):
            return  # the head cannot fit even when everything running ends: no backfill
        # What backfill jobs that end after the shadow time may use (``resv``): now, minus
        # the head's reserved devices and cores, and memory kept for the head at the shadow
        # time. Built when the first such job is tried: from ``now`` as it is then, which is
        # the same as building it first and masking every short job's allocation since.
        resv: State | None = None
        fut_mem = now.mem_free
        cores_resv = Cores(r.model, r.masks, r.node_sets, stats)
        for q in window:
            pos = pending[q][2]
            sh = shapes[pos]
            short = t + r.jobs[pos].time_limit <= shadow
            key = (id(sh), 0 if short else 1)
            if key in failed:
                continue
            if short:
                if not r.start_now(pos, t, ranked=False):
                    failed.add(key)
                    continue
                if resv is not None:
                    alloc = r.running[pos].alloc
                    resv.mask(alloc.gpus, alloc.cores, r.lay)
                    resv.mem_free = np.minimum(now.mem_free, fut_mem)
                    cores_resv.touched(alloc.nodes, None, resv)
            else:
                if resv is None:
                    future, reserved = resv_of.placement()
                    fut_mem = future.mem_free.copy()
                    fut_mem[reserved.nodes] -= reserved.mem
                    resv = now.copy()
                    resv.mask(reserved.gpus, reserved.cores, r.lay)
                    resv.mem_free = np.minimum(resv.mem_free, fut_mem)
                got = r.placer.place(sh, resv, cores_resv, commit=True)
                if got is None:
                    failed.add(key)
                    continue
                resv.take(got)
                fut_mem[got.nodes] -= got.mem
                r.start(pos, got, t)
                cores_now.touched(got.nodes, None, now)
                cores_resv.touched(got.nodes, sh.part, resv)
            stats.backfilled += 1
            started.add(q)


def _any_fits_now(r: Replay, pending: list[Pending], window: range,
                  failed: set[tuple[int, int]]) -> bool:
    seen: set[int] = set()
    for q in window:
        sh = r.shapes[pending[q][2]]
        key = id(sh)
        if key in seen or (key, 0) in failed:
            continue
        seen.add(key)
        if r.placer.place(sh, r.now, r.cores_now, commit=False, is_now=True) is not None:
            return True
        # Resources only shrink during a pass: it fits neither now nor inside the
        # reservation's leftovers.
        failed.add((key, 0))
        failed.add((key, 1))
    return False


def _reservation(r: Replay, sh: Shape) -> Reservation:
    """The head's reservation: running jobs end in the order of their planned end until the
    head fits (binary search over how many end: fitting only grows as they end). Probes
    read free counts and ask the core only where the counts do not decide."""
    model = r.model
    found: dict[int, tuple[State, Alloc | None]] = {}
    # A copy: the placement may be asked for after this pass started more jobs.
    rel = Released(r.now.copy(), r.table, r.running, model.n_nodes)
    order = rel.order

    def core_fits(k: int) -> tuple[State, Alloc | None]:
        if k not in found:
            s = rel.state_after(k)
            core = Cores(model, r.masks, r.node_sets, r.stats).get(sh.part, s)
            found[k] = (s, try_place(core, sh, model, False, r.stats))
        return found[k]

    def fits(k: int) -> bool:
        v = sh.check(*rel.counts_after(k))
        if v == ASK:
            return core_fits(k)[1] is not None
        return v == YES

    lo, hi = 1, len(order)
    if hi == 0 or not fits(hi):
        now = r.now
        return Reservation(math.inf, lambda: (now, None))
    best = hi
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            best, hi = mid, mid
        else:
            lo = mid + 1
    return Reservation(r.planned_end[int(order[best - 1])], lambda: core_fits(best))


def replay(model: ClusterModel, jobs: Sequence[SimJob], partitions: Mapping[str, Sequence[int]],
           *, backfill_depth: int, load: float = 1.0,
           progress: Callable[[int], None] | None = None) -> ReplayResult:
    """The loop with EASY backfill (arguments as :func:`hetslurm.simulate.loop.replay`)."""
    return replay_loop(model, jobs, partitions, Easy(backfill_depth), load=load,
                       progress=progress)
