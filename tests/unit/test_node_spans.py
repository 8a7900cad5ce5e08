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
