"""Measured load and energy in the placement score, and the site's ``[placement.weights]``.

The load term is max(allocated share after placing, measured load) in the kernel and in
the reference; the buckets' lower bounds must stay true bounds, so pruning never drops the
best node (the kernel is compared with the reference and the brute-force optimum on random
states with random measured loads and load weights that dominate the score).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_place_properties import clusters, fits_kernel, kernel_view, ref_view, requests

from hetslurm.cli import cli
from hetslurm.errors import ConfigError, PlacementError
from hetslurm.metrics.measured import gpu_watts, node_load_milli
from hetslurm.placement import ClusterModel, ScoreWeights, place
from hetslurm.placement.model import (
    I_LEVELS,
    I_TOTAL,
    TERMS,
    GpuLayout,
    KernelRequest,
    NodeLayout,
)
from hetslurm.placement.place import MAX_SCORE_WEIGHT, _evaluate, _run
from hetslurm.placement.reference import (
    PlainCluster,
    evaluate_node_reference,
    place_bruteforce,
    place_reference,
)
from hetslurm.request.language import Request
from hetslurm.site import load_site
from hetslurm.site.schema import MAX_SCORE_WEIGHT as SCHEMA_MAX_SCORE_WEIGHT

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
core = pytest.importorskip("hetslurm._core", reason="compiled core not built")

T_LOAD = TERMS.index("load")
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


# ----------------------------------------------------------------- kernel == reference
@st.composite
def measured(draw: st.DrawFn, max_nodes: int = 16) -> tuple[ClusterModel, KernelRequest]:
    """A random cluster and state with random measured loads, and a request whose load
    weight is nonzero (often dominant, so the load bound decides the bucket order)."""
    model = draw(clusters(max_nodes=max_nodes))
    loads = draw(st.lists(st.sampled_from([0, 0, 1, 250, 500, 999, 1000]),
                          min_size=model.n_nodes, max_size=model.n_nodes))
    kr = draw(requests())
    w = list(kr.weights)
    w[T_LOAD] = draw(st.sampled_from([1, 3, 100, 10_000]))
    return model.with_measured_load(np.asarray(loads, dtype=np.int32)), replace(
        kr, weights=tuple(w))


MEASURED = settings(max_examples=400, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@MEASURED
@given(measured())
def test_kernel_matches_reference_with_measured_load(case: tuple[ClusterModel,
                                                                 KernelRequest]) -> None:
    model, kr = case
    ev = _evaluate(model.new_core(), model.n_nodes, kr)
    pc = PlainCluster.from_model(model)
    refs = [evaluate_node_reference(pc, i, kr) for i in range(model.n_nodes)]
    assert ev.status.tolist() == [r.status for r in refs]
    # Every fitting node's load term is the larger of the two, in both.
    for i, r in enumerate(refs):
        if r.status == 0:
            assert r.terms[T_LOAD] >= int(model.state.load_milli[i])  # type: ignore[index]
            assert ev.terms[i].tolist() == list(r.terms)
    if fits_kernel(model, kr):
        assert kernel_view(model, kr) == ref_view(place_reference(model, kr))


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(measured(max_nodes=10))
def test_pruned_search_finds_the_optimum_with_measured_load(
        case: tuple[ClusterModel, KernelRequest]) -> None:
    """The bucket bounds stay lower bounds: the index search (which stops at the first
    bucket whose bound exceeds the best found) equals the brute-force optimum."""
    model, kr = case
    if not fits_kernel(model, kr):
        return
    oracle = place_bruteforce(model, kr)
    raw = _run(model.new_core(), kr)
    assert raw.status == oracle.status
    if oracle.status == 0:
        assert (raw.info[I_TOTAL], raw.info[I_LEVELS], raw.nodes) == (
            oracle.total, oracle.levels, oracle.nodes)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(measured())
def test_single_node_search_equals_best_of_every_node(
        case: tuple[ClusterModel, KernelRequest]) -> None:
    """One node asked: the pruned search returns min (score, node) over all nodes as
    ``evaluate`` (no index, no bound) scores them."""
    model, kr = case
    kr = replace(kr, nodes=1)
    if not fits_kernel(model, kr):
        return
    ev = _evaluate(model.new_core(), model.n_nodes, kr)
    fit = [(int(ev.scores[i]), i) for i in range(model.n_nodes) if ev.status[i] == 0]
    raw = _run(model.new_core(), kr)
    if not fit:
        assert raw.status != 0
        return
    assert raw.status == 0
    assert (raw.info[I_TOTAL], raw.nodes[0]) == min(fit)


def test_zero_measured_load_changes_nothing() -> None:
    model = _two_nodes()
    kr_model = model.with_measured_load(np.zeros(2, dtype=np.int32))
    req = Request(gpus_per_node=2, cores_per_node=2)
    w = ScoreWeights(load=50)
    assert place(model, req, weights=w).to_dict() == place(kr_model, req, weights=w).to_dict()


# ------------------------------------------------------------- the load weight decides
def _two_nodes() -> ClusterModel:
    gpus = tuple(GpuLayout(g // 4, g // 4, 80_000) for g in range(8))
    return ClusterModel.from_layouts([NodeLayout(f"n{i}", (8, 8), 64_000, "h100", gpus)
                                      for i in range(2)])


def test_load_weight_sends_the_job_to_the_less_loaded_identical_node() -> None:
    model = _two_nodes().with_measured_load([700, 100])
    req = Request(gpus_per_node=1)
    # Without a load weight, identical nodes tie and the lower index wins.
    assert place(model, req).nodelist == "n0"
    p = place(model, req, weights=ScoreWeights(load=1))
    assert p.nodelist == "n1"
    assert p.terms["load"] == 100
    # Measured load below the allocated share: the share counts (max, not sum).
    low = _two_nodes().with_measured_load([1, 0])
    assert place(low, req, weights=ScoreWeights(load=1)).terms["load"] == 1000 // 16


@pytest.mark.parametrize(("load", "match"), [
    ([0], "shape"), ([0, 1001], "0..1000"), ([-1, 0], "0..1000"), ([0.5, 0.0], "integers"),
])
def test_measured_load_is_validated(load: list[Any], match: str) -> None:
    with pytest.raises(PlacementError, match=match):
        _two_nodes().with_measured_load(np.asarray(load))


def test_core_refuses_out_of_range_load() -> None:
    args = _two_nodes().core_arguments()
    with pytest.raises(ValueError, match="load_milli"):
        core.PlacementCore(**{**args, "load_milli": np.array([0, 1001], dtype=np.int32)})
    with pytest.raises(ValueError, match="load_milli"):
        core.PlacementCore(**{**args, "load_milli": np.array([0], dtype=np.int32)})


def test_measured_load_survives_partition_scoping() -> None:
    model = _two_nodes().with_measured_load([700, 100])
    again = model.only(["n0", "n1"])
    assert again.state.load_milli is not None
    assert again.state.load_milli.tolist() == [700, 100]


def test_measured_watts_replace_the_site_figures() -> None:
    model = _two_nodes()
    req = Request(gpus_per_node=2)
    assert place(model, req, weights=ScoreWeights(energy=1)).terms["energy"] == 0
    hot = model.with_gpu_watts({"h100": (60, 560), "nosuch": (1, 2)})
    assert place(hot, req, weights=ScoreWeights(energy=1)).terms["energy"] == 2 * 500
    with pytest.raises(PlacementError, match="watts"):
        model.with_gpu_watts({"h100": (0, 10**9)})


# ------------------------------------------------------------------ store -> arrays
def _frame(rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    cols = ["node", "slurm_index", "gpu_model", "utilization_pct", "power_w", "status", "time"]
    return pd.DataFrame(rows, columns=cols)


NOW = 10_000.0


def test_node_load_is_the_mean_of_each_gpus_mean() -> None:
    frame = _frame([
        # gpu1: GPU 0 at 100 % (two samples), GPU 1 at 0 and 40 -> (100 + 20) / 2 = 60 %.
        ("gpu1", 0, "h100", 100.0, 500.0, "ok", NOW - 10),
        ("gpu1", 0, "h100", 100.0, 500.0, "ok", NOW - 20),
        ("gpu1", 1, "h100", 0.0, 60.0, "ok", NOW - 10),
        ("gpu1", 1, "h100", 40.0, 200.0, "ok", NOW - 500),
        # gpu2: stale (older than the window) -> unknown -> 0.
        ("gpu2", 0, "h100", 90.0, 500.0, "ok", NOW - 601),
        # gpu3: unknown statuses and missing readings -> 0, never guessed high.
        ("gpu3", 0, "h100", 95.0, 500.0, "lost", NOW - 5),
        ("gpu3", 1, "h100", None, None, "ok", NOW - 5),
        ("gpu3", 2, "h100", 99.0, 500.0, "ok", NOW + 60),  # from the future: ignored
        # gpu4: one usable GPU among unknown ones -> its value; rounding to per mille.
        ("gpu4", 0, "a100", 33.34, 300.0, "ok", NOW - 1),
        ("gpu4", 1, "a100", 100.0, 300.0, "mig", NOW - 1),
        # unmatched GPU (no Slurm index): not attributable to the node's GPUs.
        ("gpu5", None, "a100", 100.0, 300.0, "ok", NOW - 1),
        # a node the cluster does not know: ignored.
        ("ghost", 0, "a100", 100.0, 300.0, "ok", NOW - 1),
    ])
    names = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "cpu1"]
    got = node_load_milli(frame, names, now=NOW, window_s=600)
    assert got.dtype == np.int32
    assert got.tolist() == [600, 0, 0, 333, 0, 0]  # cpu1: CPU-only, nothing measured -> 0


def test_node_load_of_an_empty_frame_is_zero() -> None:
    assert node_load_milli(_frame([]), ["a", "b"], now=NOW, window_s=60).tolist() == [0, 0]
    assert node_load_milli(_frame([]), [], now=NOW, window_s=60).tolist() == []


def test_gpu_watts_need_enough_busy_and_idle_samples() -> None:
    rows = []
    for k in range(4):
        rows.append(("gpu1", 0, "h100", 90.0, 600.0 + k, "ok", NOW - k))  # busy
        rows.append(("gpu1", 1, "h100", 1.0, 70.0, "ok", NOW - k))  # idle
        rows.append(("gpu1", 2, "h100", 7.0, 999.0, "ok", NOW - k))  # neither
    rows.append(("gpu1", 3, "h100", 90.0, 5000.0, "lost", NOW))  # unknown: dropped
    rows.append(("gpu1", 3, "h100", 90.0, 5000.0, "ok", NOW - 10**6))  # stale: dropped
    rows += [("gpu2", 0, "a100", 90.0, 400.0, "ok", NOW)] * 10  # no idle samples
    frame = _frame(rows)
    got = gpu_watts(frame, now=NOW, window_s=3600, busy_pct=10, idle_pct=5, min_samples=4)
    assert set(got) == {"h100"}
    w = got["h100"]
    assert (w.idle_w, w.busy_w, w.idle_samples, w.busy_samples) == (70, 602, 4, 4)
    assert gpu_watts(frame, now=NOW, window_s=3600, busy_pct=10, idle_pct=5,
                     min_samples=5) == {}


# ------------------------------------------------------------ [placement] in the site
def _site_with(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "site.toml"
    path.write_text(DEMO.read_text(encoding="utf-8") + "\n" + section, encoding="utf-8")
    return path


def test_site_weights_are_read_and_unset_keys_keep_the_defaults(tmp_path: Path) -> None:
    site = load_site(_site_with(tmp_path, "[placement.weights]\nload = 7\nswitch = 0\n"))
    w = ScoreWeights.from_site(site)
    assert w == replace(ScoreWeights(), load=7, switch=0)
    assert ScoreWeights.from_site(load_site(DEMO)) == ScoreWeights()
    assert SCHEMA_MAX_SCORE_WEIGHT == MAX_SCORE_WEIGHT


@pytest.mark.parametrize(("section", "key", "match"), [
    ("[placement.weights]\nlaod = 1\n", "laod", "did you mean 'load'"),
    ("[placement.weights]\nload = 16777217\n", "load", "16777216"),
    ("[placement.weights]\nenergy = -1\n", "energy", "0"),
    ("[placement.weights]\nnuma = true\n", "numa", "integer"),
    ("[placement.weights]\nmodel = 1.5\n", "model", "integer"),
    ("[placement]\nload_window_s = 0\n", "load_window_s", "1"),
    ("[placement]\nwindow = 5\n", "window", "not allowed|unknown"),
])
def test_bad_placement_sections_are_refused_naming_the_key(
        tmp_path: Path, section: str, key: str, match: str) -> None:
    path = _site_with(tmp_path, section)
    with pytest.raises(ConfigError, match=match) as info:
        load_site(path)
    assert key in str(info.value)


# -------------------------------------------------------------- place / explain output
def test_place_shows_the_site_weights(tmp_path: Path) -> None:
    site = _site_with(tmp_path, "[placement.weights]\nload = 9\nleftover = 3\n")
    res = CliRunner().invoke(cli, ["place", "--site", str(site), "--state", "empty",
                                   "--request", "gpus=1", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["weights"] == ScoreWeights(load=9, leftover=3).to_dict()
    assert doc["measured"] == {"load": False, "energy": False}
    # The score uses them: weighted load = 9 x the load term.
    assert doc["weighted"]["load"] == 9 * doc["terms"]["load"]
    table = CliRunner().invoke(cli, ["place", "--site", str(site), "--state", "empty",
                                     "--request", "gpus=1"])
    assert table.exit_code == 0, table.output
    assert "weights:    model 1000000, islands 100000, numa 10000, leftover 3, load 9," \
        in table.stdout


def test_place_measured_reads_the_store(tmp_path: Path) -> None:
    """--measured with a store holding gpu1 busy and gpu2 idle: the load weight moves a
    1-GPU job to the less-loaded node, and the JSON says what was measured."""
    from hetslurm.metrics.samples import COLUMNS
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.placement import LiveState, NodeState

    store = tmp_path / "store"
    store.mkdir(mode=0o755)
    now = 1_000_000.0

    def sample(node: str, idx: int, pct: float) -> dict[str, Any]:
        row: dict[str, Any] = dict.fromkeys(COLUMNS)
        row.update(time=now - 30, node=node, nvml_index=idx, minor=idx, uuid=f"{node}-{idx}",
                   gpu_model="h100", slurm_index=idx, utilization_pct=pct, power_w=300.0,
                   status="ok", interval_s=30.0, attributed=True, clock_jump=False)
        return row

    s = SegmentStore(store)
    s.write("gpu1", [sample("gpu1", g, 90.0) for g in range(8)])
    s.write("gpu2", [sample("gpu2", g, 10.0) for g in range(8)])
    site = _site_with(tmp_path, f'[collector]\nstore = "{store}"\n\n'
                                "[placement.weights]\nload = 1000\n")
    names = [n.name for n in load_site(site).nodes]
    state = tmp_path / "state.json"
    state.write_text(LiveState(time=now, nodes=tuple(NodeState(n) for n in names),
                               source="test").to_json())

    def run(*extra: str) -> dict[str, Any]:
        res = CliRunner().invoke(cli, ["place", "--site", str(site), "--state", str(state),
                                       "--request", "gpus=1 gpu-type=h100", "--format",
                                       "json", *extra])
        assert res.exit_code == 0, res.output
        out: dict[str, Any] = json.loads(res.stdout)
        return out

    on = run()  # default: the load weight is nonzero and the store exists
    assert on["measured"]["load"]["by_node"] == {"gpu1": 900, "gpu2": 100}
    # The h100 nodes are gpu1 and gpu2, identical and idle in Slurm's eyes.
    assert on["nodelist"] == "gpu2"
    assert on["terms"]["load"] == max(100, 1000 // 8)  # one of 8 cores allocated
    off = run("--no-measured")
    assert off["measured"] == {"load": False, "energy": False}
    assert off["nodelist"] == "gpu1"


def test_explain_shows_the_site_weights(tmp_path: Path) -> None:
    site = _site_with(tmp_path, "[placement.weights]\nenergy_low = 5\n")
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#HET gpus=1 class=train\ntrue\n")
    res = CliRunner().invoke(cli, ["explain", str(job), "--site", str(site), "--format",
                                   "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["placement"]["weights"] == ScoreWeights(energy_low=5).to_dict()
    table = CliRunner().invoke(cli, ["explain", str(job), "--site", str(site)])
    assert table.exit_code == 0, table.output
    assert "energy_low 5" in table.stdout
