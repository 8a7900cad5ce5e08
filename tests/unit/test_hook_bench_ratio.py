"""The controller figure of ``hetslurm bench hook``: rounds of the two sides run back to
back, and the ratio held to the 1.1x target is the median of the pairs' ratios, so a slow
stretch of the machine that hits both rounds of a pair cancels out."""

from __future__ import annotations

import pytest

from hetslurm.hook.bench import depth_result


def test_paired_ratio_cancels_a_slow_stretch() -> None:
    # Pairs 3 and 4 ran while the VM was twice as slow: the medians of each side move,
    # the pairs' ratios do not.
    with_us = [1050, 1060, 2100, 2120, 1040]
    without_us = [1000, 1000, 2000, 2000, 1000]
    got = depth_result(0, with_us, without_us, [], [])
    assert got["paired_ratios"] == [1.05, 1.06, 1.05, 1.06, 1.04]
    assert got["ratio"] == 1.05
    assert got["with_hook_us"] == 1060 and got["without_hook_us"] == 1000
    assert got["ratio_of_medians"] == 1.06
    assert "cpu_ratio" not in got


def test_a_costly_hook_shows_in_the_ratio_and_the_cpu_figures() -> None:
    got = depth_result(1000, [1500, 1600, 1550], [1000, 1000, 1000], [300.0, 310.0],
                       [150.0, 160.0])
    assert got["ratio"] == 1.55
    assert got["pending"] == 1000
    assert got["with_hook_cpu_us"] == 305.0 and got["without_hook_cpu_us"] == 155.0
    assert got["cpu_ratio"] == pytest.approx(1.968, abs=1e-3)


def test_rounds_must_pair() -> None:
    with pytest.raises(ValueError):
        depth_result(0, [1000, 1000], [1000], [], [])
