"""Measured load to node Weight: bands, hysteresis, hold, unknown, re-assertion."""

from __future__ import annotations

import pandas as pd
import pytest

from hetslurm.policy.weights import NodeLoad, WeightDecision, WeightRules, decide, node_loads

RULES = WeightRules(band=5, min_samples=3, stale_s=120, hysteresis=2, release_util_pct=20,
                    hold_s=600)
NOW = 10_000.0


def _load(util: float | None, samples: int = 10, age: float = 10.0) -> NodeLoad:
    return NodeLoad("gpu1", samples, None if util is None else NOW - age, util)


def _decide(util: float | None, *, live: int = 100, last: int | None = None,
            changed: float | None = None, **kw: float) -> WeightDecision:
    return decide("gpu1", "h100", 100, live, last, changed, _load(util, **kw), RULES, NOW)


def test_a_busy_node_moves_to_the_top_of_its_band_never_past_it() -> None:
    d = _decide(95.0)
    assert d.action == "set" and d.target == 105 and d.level == 5
    # The band never reaches the next model's weight (110 for the A100 nodes).
    assert decide("gpu1", "h100", 100, 100, None, None, _load(100.0),
                  WeightRules(band=9), NOW).target == 109


def test_small_changes_stay_put_hysteresis() -> None:
    d = _decide(55.0, live=103, last=103)  # level 3 of 5 (55% -> 2.75 -> 3)
    assert d.action == "keep" and d.target == 103
    d = _decide(35.0, live=103, last=103)  # level 2: one step, not enough
    assert d.action == "keep"
    d = _decide(10.0, live=103, last=103)  # level 1 (0.5 rounds up): two steps down
    assert d.action == "set" and d.target == 101


def test_release_to_the_site_weight_when_the_load_is_gone() -> None:
    d = _decide(2.0, live=101, last=101)  # level 0, one below: the release rule moves it
    assert d.action == "set" and d.target == 100


def test_a_node_that_moved_recently_holds() -> None:
    d = _decide(95.0, live=100, last=100, changed=NOW - 60)
    assert d.action == "keep" and d.target == 100
    assert "hold" in d.why
    d = _decide(95.0, live=100, last=100, changed=NOW - 601)
    assert d.action == "set" and d.target == 105


@pytest.mark.parametrize("kw", [dict(util=None, samples=0), dict(util=90.0, samples=2),
                                dict(util=90.0, age=500.0)])
def test_missing_or_stale_data_moves_nothing(kw: dict[str, float | None]) -> None:
    util = kw.pop("util")
    d = _decide(util, live=103, last=103, **kw)  # type: ignore[arg-type]
    assert d.action == "unknown" and d.target == 103


def test_a_reset_weight_is_written_again_and_said() -> None:
    # The site apply reconfigured: the node shows its site weight, hetslurm wrote 105.
    d = _decide(95.0, live=100, last=105)
    assert d.action == "reassert" and d.target == 105
    assert "reset" in d.why
    # Even while the measurement is unknown, the last written weight is re-asserted.
    d = _decide(None, samples=0, live=100, last=105)
    assert d.action == "reassert" and d.target == 105


def test_a_weight_outside_the_band_is_read_as_the_site_weight() -> None:
    # An admin's 500 (or the site's own weight): level 0, and a busy node moves into the band.
    d = _decide(95.0, live=500)
    assert d.action == "set" and d.target == 105


def test_band_is_bounded() -> None:
    with pytest.raises(ValueError, match="band"):
        WeightRules(band=10)


def test_node_loads_from_store_samples() -> None:
    s = pd.DataFrame({
        "time": [9000.0, 9500.0, 9600.0, 9700.0, 9800.0, 9900.0],
        "node": pd.Categorical(["gpu1", "gpu1", "gpu1", "gpu2", "gpu2", "cpu1"]),
        "slurm_index": [0, 0, 1, 0, 1, None],
        "status": pd.Categorical(["ok", "ok", "lost", "ok", "ok", "ok"]),
        "utilization_pct": [10.0, 90.0, None, 50.0, None, 5.0],
    })
    loads = node_loads(s, {"gpu1": "h100", "gpu2": "h100", "gpu3": "a100"}, since=9400.0,
                       now=10_000.0)
    assert loads["gpu1"].samples == 1 and loads["gpu1"].mean_util_pct == 90.0
    assert loads["gpu2"].samples == 1 and loads["gpu2"].newest == 9700.0
    assert loads["gpu3"].samples == 0 and loads["gpu3"].mean_util_pct is None
    assert "cpu1" not in loads
