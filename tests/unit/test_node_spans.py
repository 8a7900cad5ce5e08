"""The compiled NodeSpans against its plain-Python reference on random reservations."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hetslurm.placement.spans import NodeSpans, NodeSpansReference


def _pair(seed: int, n: int) -> tuple[NodeSpans, NodeSpansReference, random.Random]:
    rng = random.Random(seed)
    fast, ref = NodeSpans(n), NodeSpansReference(n)
    for _ in range(rng.randrange(0, 3 * n)):
        nodes = rng.sample(range(n), rng.randint(1, min(3, n)))
        a = float(rng.randrange(0, 200))
        b = a + rng.randrange(1, 50)
        fast.add(nodes, a, b)
        ref.add(nodes, a, b)
    return fast, ref, rng


@pytest.mark.parametrize("seed", range(60))
def test_same_answers_as_the_reference(seed: int) -> None:
    n = 1 + seed % 9
    fast, ref, rng = _pair(seed, n)
    assert fast.count == ref.count
    assert [fast.spans(i) for i in range(n)] == [ref.spans(i) for i in range(n)]
    assert (fast.reserved() == ref.reserved()).all()
    t = float(rng.randrange(0, 100))
    assert sorted(fast.ends_after(t)) == sorted(ref.ends_after(t))
    for _ in range(10):
        raw = np.array([math.inf if rng.random() < 0.2 else t + rng.randrange(0, 3) * 10.0
                        for _ in range(n)])
        limit = float(rng.randrange(1, 60))
        weight = np.array([rng.randrange(1, 4) for _ in range(n)], dtype=np.int64)
        mult = rng.randrange(1, 3) * (n + 1)
        assert fast.earliest_one(raw, limit, t, weight, mult) == ref.earliest_one(
            raw, limit, t, weight, mult)
        assert (fast.feasible_last() == ref.feasible_last()).all()
        k = rng.randint(1, n)
        assert fast.earliest_multi(raw, k, limit, t, t + 150) == ref.earliest_multi(
            raw, k, limit, t, t + 150)
        when = t + rng.randrange(0, 100)
        assert (fast.blocked(when, limit) == ref.blocked(when, limit)).all()
        nodes = list(range(n))
        assert (fast.push(nodes, raw, limit) == ref.push(nodes, raw, limit)).all()


def test_bad_input_is_a_value_error() -> None:
    s = NodeSpans(3)
    with pytest.raises(ValueError, match="outside"):
        s.add([3], 0.0, 1.0)
    with pytest.raises(ValueError, match="raw"):
        s.earliest_one(np.zeros(2), 1.0, 0.0, np.zeros(3, dtype=np.int64), 4)


@pytest.mark.parametrize("seed", range(40))
def test_reserve_ones_same_as_the_reference(seed: int) -> None:
    # A run of one-node jobs over a few shapes: the same stop, starts, nodes, hopeless
    # limits and spans as the reference, which is earliest_one then add, job by job.
    n = 1 + seed % 7
    fast, ref, rng = _pair(1000 + seed, n)
    t = float(rng.randrange(0, 100))
    shapes = rng.randint(1, 3)
    raws = np.array([[math.inf if rng.random() < 0.2 else t + rng.randrange(0, 4) * 10.0
                      for _ in range(n)] for _ in range(shapes)])
    if seed % 2:
        raws[raws == t] += 5.0  # nothing fits now: the run goes to its end
    m = rng.randint(1, 12)
    slot = np.array([rng.randrange(shapes) for _ in range(m)], dtype=np.int64)
    sid = slot + 1
    limit = np.array([float(rng.randrange(1, 60)) for _ in range(m)])
    mult = np.array([(n + 1) * rng.randint(1, 2) for _ in range(m)], dtype=np.int64)
    weight = np.array([rng.randrange(1, 4) for _ in range(n)], dtype=np.int64)
    horizon = t + rng.choice([30.0, 150.0, math.inf])
    outs = []
    for spans in (fast, ref):
        hopeless = np.full(shapes + 1, math.inf)
        when, node = np.zeros(m), np.zeros(m, dtype=np.int64)
        stop = spans.reserve_ones(raws, slot, sid, limit, mult, hopeless, weight, t, horizon,
                                  when, node)
        outs.append((stop, when[:stop].tolist(), node[:stop].tolist(), hopeless.tolist(),
                     [spans.spans(i) for i in range(n)]))
    assert outs[0] == outs[1]
    if seed % 2:
        assert outs[0][0] == m


def test_reserve_ones_refuses_mismatched_arrays() -> None:
    s = NodeSpans(3)
    one = np.zeros(1, dtype=np.int64)
    args = (np.zeros((2, 3)), one, one, np.ones(1), one, np.full(1, math.inf),
            np.zeros(3, dtype=np.int64), 0.0, 10.0, np.zeros(1), np.zeros(1, dtype=np.int64))
    assert s.reserve_ones(*args) == 0  # raw 0 == t: the job could start now
    bad = list(args)
    bad[1] = np.array([2], dtype=np.int64)
    with pytest.raises(ValueError, match="slot"):
        s.reserve_ones(*bad)
    bad = list(args)
    bad[3] = np.ones(2)
    with pytest.raises(ValueError, match="limit has 2 entries"):
        s.reserve_ones(*bad)
    bad = list(args)
    bad[0] = np.zeros((2, 4))
    with pytest.raises(ValueError, match="raws"):
        s.reserve_ones(*bad)
    assert s.count == 0


@pytest.mark.parametrize("seed", range(40))
def test_releases_same_as_the_numpy_reference(seed: int) -> None:
    # Random running sets built by starts and ends (zero limits included: entries whose
    # planned end is not after t), asked for random shapes: the compiled index gives the
    # numpy view's earliest fits node by node.
    from hetslurm.placement.spans import Releases
    from hetslurm.simulate.loop import Alloc, RunTable, State
    from hetslurm.simulate.slurm_backfill import ReleaseViewReference

    rng = random.Random(seed)
    n = 1 + seed % 6
    rel, table = Releases(n), RunTable()
    held: dict[int, tuple[list[int], int, int, int]] = {}
    t = float(rng.randrange(10, 50))
    for job in range(rng.randrange(0, 25)):
        nodes = sorted(rng.sample(range(n), rng.randint(1, n)))
        g, c, m = rng.randrange(0, 3), rng.randrange(1, 4), rng.randrange(0, 3) * 1000
        end = rng.choice([t, t - 5.0, t + rng.randrange(1, 40) * 5.0])
        nd = np.array(nodes, dtype=np.int64)
        rel.add(job, nd, g, c, m, end)
        table.add(job, Alloc(nd, np.zeros(g * len(nodes), np.int64),
                             np.zeros(c * len(nodes), np.int64), m), end)
        held[job] = (nodes, g, c, m)
        if rng.random() < 0.3:
            gone = rng.choice(sorted(held))
            rel.remove(gone, np.array(held.pop(gone)[0], dtype=np.int64))
            table.remove(gone)
    assert rel.count == sum(len(v[0]) for v in held.values())
    cnt = lambda hi: np.array([rng.randrange(0, hi) for _ in range(n)], dtype=np.int64)  # noqa: E731
    now = State(np.ones(n, np.uint8), np.zeros(1, np.uint8), np.zeros(0, np.uint8),
                np.zeros(1, np.uint8), cnt(4000), cnt(3), cnt(5))
    view = ReleaseViewReference(now, table, t)

    class Sh:
        pass

    for _ in range(10):
        sh = Sh()
        sh.ng, sh.nc = rng.randrange(0, 5), rng.randrange(0, 9)  # type: ignore[attr-defined]
        sh.mem = rng.choice([0, 1500, 5000])  # type: ignore[attr-defined]
        sh.idx = np.array(sorted(rng.sample(range(n), rng.randint(0, n))), dtype=np.int64)  # type: ignore[attr-defined]
        out = np.zeros(n)
        rel.earliest(sh.idx, sh.ng, sh.nc, sh.mem, now.gpu_cnt, now.core_cnt,  # type: ignore[attr-defined]
                     now.mem_free, t, out)
        want = view.earliest(sh, now, t, n)  # type: ignore[arg-type]
        assert out.tolist() == want.tolist()


def test_releases_refuse_bad_input() -> None:
    from hetslurm.placement.spans import Releases

    rel = Releases(2)
    with pytest.raises(ValueError, match="nodes"):
        rel.add(0, np.array([2], dtype=np.int64), 1, 1, 0, 5.0)
    rel.add(0, np.array([0], dtype=np.int64), 1, 1, 0, 5.0)
    with pytest.raises(ValueError, match="job 1 holds nothing on node 0"):
        rel.remove(1, np.array([0], dtype=np.int64))
    with pytest.raises(ValueError, match="out has 1 entries"):
        rel.earliest(np.array([0], dtype=np.int64), 0, 1, 0, np.zeros(2, np.int64),
                     np.zeros(2, np.int64), np.zeros(2, np.int64), 0.0, np.zeros(1))
    assert rel.count == 1
