"""Golden placement cases: a tiny site, a live state, a request, the exact expected answer.

Each file in tests/data/placement/golden holds a one-line ``intent``; ``site`` names a file
in site-configs/ (without .toml) or ``site_toml`` inlines one. ``[state]`` is the
hetslurm-state/1 object; nodes it leaves out are added idle and available, so a case lists
only what differs from an idle cluster. Every case is also checked against the plain-Python
reference.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import ScoreWeights, compile_request, place
from hetslurm.placement.reference import place_reference
from hetslurm.placement.state import LiveState
from hetslurm.request.language import Locality, Request
from hetslurm.site.load import load_site, parse_site

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
pytest.importorskip("hetslurm._core", reason="compiled core not built")

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = sorted((ROOT / "tests/data/placement/golden").glob("*.toml"))


def load_case(path: Path) -> tuple[ClusterModel, Request, ScoreWeights, dict[str, Any]]:
    case = tomllib.loads(path.read_text(encoding="utf-8"))
    assert set(case) <= {"intent", "site", "site_toml", "request", "state", "weights", "expect"}
    assert isinstance(case["intent"], str) and case["intent"] and "\n" not in case["intent"]
    if "site_toml" in case:
        site = parse_site(case["site_toml"], str(path))
    else:
        site = load_site(ROOT / "site-configs" / f"{case['site']}.toml")
    model = ClusterModel.from_site(site)
    state = dict(case.get("state", {}))
    listed = {n["name"] for n in state.get("nodes", [])}
    state["nodes"] = [*state.get("nodes", []),
                      *({"name": n} for n in model.names if n not in listed)]
    model = model.with_state(LiveState.from_dict(state))
    raw = dict(case["request"])
    if "locality" in raw:
        raw["locality"] = Locality(**raw["locality"])
    for key in ("gpu_models", "fpga_models"):
        if key in raw:
            raw[key] = tuple(raw[key])
    return model, Request(**raw), ScoreWeights(**case.get("weights", {})), case["expect"]


def test_enough_golden_cases() -> None:
    assert len(GOLDEN) >= 25


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path: Path) -> None:
    model, request, weights, expect = load_case(path)
    got = place(model, request, weights)
    assert got.placeable == expect["placeable"], got.reason
    if got.placeable:
        nodes = {n.name: {"gpus": list(n.gpus), "fpgas": list(n.fpgas), "cores": list(n.cores)}
                 for n in got.nodes}
        assert nodes == expect["nodes"], got.reason
        assert list(nodes) == [n for n in model.names if n in nodes]  # cluster order
        for term, value in expect.get("terms", {}).items():
            assert got.terms[term] == value, (term, got.terms)
        if "switch_levels" in expect:
            assert got.terms["switch"] == expect["switch_levels"]
        assert got.score == sum(got.weighted.values())
        kr = compile_request(model, request, weights)
        ref = place_reference(model, kr)
        assert ref.total == got.score
        assert tuple(model.names[i] for i in ref.nodes) == tuple(nodes)
    else:
        assert got.impossible == expect["impossible"], got.reason
        assert got.blocking == expect["blocking"], got.reason
        assert not got.nodes and got.score is None
    for text in expect.get("reason_contains", []):
        assert text in got.reason, got.reason
    if "earliest_start" in expect:
        assert got.earliest_start == expect["earliest_start"], got.reason
