"""Whole-node reservations of a backfill pass, and the earliest start of a shape beside them.

Slurm's conservative backfill (``sched/backfill``) gives each pending job it tests a
reservation of whole nodes for its time limit; the simulator's ``slurm`` model
(:mod:`hetslurm.simulate.slurm_backfill`) asks, for every tested job, the earliest time a
shape fits on nodes free of those reservations. :class:`NodeSpans` is the compiled answer
(``hetslurm._core``); :class:`NodeSpansReference` is the same rule in plain Python, the
executable definition the kernel is tested against (tests/unit/test_node_spans.py).

The rule. Each node holds spans ``[start, end)`` sorted by start, disjoint. ``raw[i]`` is the
earliest time one share of the shape fits on node ``i`` with reservations aside (``inf``:
never).

* ``push(i, x, limit)``: walk node ``i``'s spans in start order; a span that overlaps
  ``[x, x + limit)`` moves ``x`` to its end; the first span starting at or after ``x +
  limit`` ends the walk.
* One node (``earliest_one``): ``first`` is the lowest ``raw`` among nodes without spans;
  a node with spans counts only if ``raw <= first``, at ``push(raw)``; the answer is the
  lowest of these, and among the nodes that reach it the one with the lowest ``weight *
  mult + index`` (the core's choice where the score is the node weight alone).
* A run of one-node jobs (``reserve_ones``): ``earliest_one`` for each in order, a span on
  its node when the answer is after ``t`` and within the horizon, nothing (and the shape's
  "hopeless" limit lowered) when there is none; the run stops before a job that could start
  at ``t``.
* Several nodes (``earliest_multi``): the first candidate time (a finite ``raw``, or a
  span's end after ``t``), up to the horizon, at which ``k`` nodes have ``raw <= when`` and
  no span overlapping ``[when, when + limit)``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from hetslurm._core import NodeSpans, Releases

__all__ = ["NodeSpans", "NodeSpansReference", "Releases"]


class NodeSpansReference:
    """:class:`NodeSpans` in plain Python (same methods, same answers)."""

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"NodeSpans: n is {n}, must be >= 0")
        self.n, self.count = n, 0
        self.starts: list[list[float]] = [[] for _ in range(n)]
        self.ends: list[list[float]] = [[] for _ in range(n)]
        self._e: list[float] = [math.inf] * n
        self._when = math.inf

    def add(self, nodes: Iterable[int], start: float, end: float) -> None:
        for node in nodes:
            row = self.starts[node]
            at = bisect.bisect_right(row, start)
            row.insert(at, start)
            self.ends[node].insert(at, end)
            self.count += 1

    def _push(self, node: int, x: float, limit: float) -> float:
        for a, b in zip(self.starts[node], self.ends[node], strict=True):
            if a >= x + limit:
                break
            if x < b:
                x = b
        return x

    def _overlaps(self, node: int, when: float, limit: float) -> bool:
        return any(a < when + limit and when < b
                   for a, b in zip(self.starts[node], self.ends[node], strict=True))

    def reserved(self) -> npt.NDArray[np.bool_]:
        return np.array([bool(row) for row in self.starts], dtype=bool)

    def spans(self, node: int) -> list[tuple[float, float]]:
        return list(zip(self.starts[node], self.ends[node], strict=True))

    def push(self, nodes: Iterable[int], starts: Iterable[float],
             limit: float) -> npt.NDArray[np.float64]:
        return np.array([self._push(int(i), float(x), limit)
                         for i, x in zip(nodes, starts, strict=True)], dtype=np.float64)

    def blocked(self, when: float, limit: float) -> npt.NDArray[np.bool_]:
        return np.array([self._overlaps(i, when, limit) for i in range(self.n)], dtype=bool)

    def ends_after(self, t: float) -> list[float]:
        return [b for row in self.ends for b in row if b > t]

    def earliest_one(self, raw: npt.NDArray[np.float64], limit: float, t: float,
                     weight: npt.NDArray[np.int64], mult: int) -> tuple[float, int, bool]:
        free = [float(raw[i]) for i in range(self.n) if not self.starts[i]]
        first = min(free, default=math.inf)
        e = [math.inf] * self.n
        blocked_now = False
        for i in range(self.n):
            x = float(raw[i])
            if not self.starts[i]:
                e[i] = x
            elif x <= first:
                e[i] = self._push(i, x, limit)
                blocked_now |= x == t and e[i] != t
        when = min(e, default=math.inf)
        best = -1
        if when < math.inf:
            best = min((int(weight[i]) * mult + i, i) for i in range(self.n) if e[i] == when)[1]
        self._e, self._when = e, when
        return when, best, blocked_now and when == t

    def reserve_ones(self, raws: npt.NDArray[np.float64], slot: npt.NDArray[np.int64],
                     sid: npt.NDArray[np.int64], limit: npt.NDArray[np.float64],
                     mult: npt.NDArray[np.int64], hopeless: npt.NDArray[np.float64],
                     weight: npt.NDArray[np.int64], t: float, horizon: float,
                     when_out: npt.NDArray[np.float64],
                     node_out: npt.NDArray[np.int64]) -> int:
        m = len(slot)
        for name, a in (("sid", sid), ("limit", limit), ("mult", mult),
                        ("when_out", when_out), ("node_out", node_out)):
            if len(a) != m:
                raise ValueError(f"NodeSpans.reserve_ones: {name} has {len(a)} entries, "
                                 f"expected {m} (one per job)")
        for j in range(m):
            node_out[j] = -1
            lim = float(limit[j])
            if lim >= hopeless[sid[j]]:
                when_out[j] = math.inf
                continue
            when, best, _ = self.earliest_one(raws[slot[j]], lim, t, weight, int(mult[j]))
            if when > horizon or when == math.inf:
                when_out[j] = math.inf
                hopeless[sid[j]] = min(hopeless[sid[j]], lim)
                continue
            if when == t:
                return j
            when_out[j], node_out[j] = when, best
            self.add([best], when, when + lim)
        return m

    def feasible_last(self) -> npt.NDArray[np.bool_]:
        return np.array([self._when < math.inf and x == self._when for x in self._e],
                        dtype=bool)

    def earliest_multi(self, raw: npt.NDArray[np.float64], k: int, limit: float, t: float,
                       horizon: float) -> float:
        cands = sorted({float(x) for x in raw if x < math.inf} | set(self.ends_after(t)))
        for when in cands:
            if when > horizon:
                break
            if sum(1 for i in range(self.n)
                   if raw[i] <= when and not self._overlaps(i, when, limit)) >= k:
                return when
        return math.inf
