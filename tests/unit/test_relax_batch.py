"""Relax in batch (docs/act.md#relax-in-batch): the pending jobs placed in waves against one
snapshot, on threads, and placed again only where an earlier job took a node the answer may
read. The plan must be the sequential one, decision for decision (evidence included), on the
benchmark's state and on varied small ones; and a core that takes resources must answer as
one built from the arrays with them taken."""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _rebalance_fixtures import NOW, cluster, demo_site, energy_low, fill, pending, record, running

from hetslurm.act.rebalance import _Snapshot
from hetslurm.act.relax import RelaxPlan, consume, plan_relax
from hetslurm.lab.bench_placement import half_loaded, synthetic_layouts
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import _run, compile_request, place
from hetslurm.placement.state import LiveState
from hetslurm.request.language import Locality, Request
from hetslurm.site import Site
from hetslurm.site.schema import Rebalance
from hetslurm.slurm.backend import JobInfo, Switches
from hetslurm.slurm.units import GresItem

pytest.importorskip("hetslurm._core", reason="compiled core not built")

SITE = demo_site()


def _plans(fake: FakeSlurm, site: Site, pol: Rebalance, now: float,
           ways: tuple[tuple[int, bool], ...] = ((1, False), (1, True), (2, True), (3, True))
           ) -> list[tuple[RelaxPlan, dict[str, Any]]]:
    """The relax plan of ``fake`` each way (threads, batch), as rebalance builds it."""
    nodes, jobs = fake.nodes(), fake.jobs()
    live = LiveState.from_backend(_Snapshot(nodes, jobs), now=now)
    parts = {p.name: p.nodes for p in fake.partitions()}
    out = []
    for threads, batch in ways:
        model = ClusterModel.from_site(site).with_state(live)
        stats: dict[str, Any] = {}
        plan, skipped = plan_relax(jobs, site, pol, model, partitions=parts, now=now,
                                   threads=threads, batch=batch, stats=stats)
        assert skipped == []
        out.append((plan, stats))
    return out


def _assert_same(plans: list[tuple[RelaxPlan, dict[str, Any]]]) -> None:
    ref = plans[0][0]
    for plan, stats in plans[1:]:
        assert plan.quiet == ref.quiet, stats
        assert len(plan.decisions) == len(ref.decisions), stats
        for a, b in zip(plan.decisions, ref.decisions, strict=True):
            assert a == b, (stats, a.job)


# ------------------------------------------------------------------ the benchmark's state
@pytest.mark.parametrize("max_relax", [20, 10_000])
def test_batch_equals_sequential_on_the_bench_state(max_relax: int) -> None:
    from hetslurm.lab.bench_rebalance import NOW as BNOW
    from hetslurm.lab.bench_rebalance import _site_toml
    from hetslurm.lab.bench_rebalance import cluster as bench_cluster
    from hetslurm.site.load import parse_site

    with tempfile.TemporaryDirectory() as tmp:
        site = parse_site(_site_toml(64, Path(tmp)), "<bench>")
    fake = bench_cluster(400, 64, 160)
    pol = Rebalance(max_relax_per_run=max_relax)
    plans = _plans(fake, site, pol, BNOW)
    _assert_same(plans)
    rules = Counter(d.rule for d in plans[0][0].decisions)
    # The benchmark's state, smaller: 80 relaxable jobs, 112 H100 GPUs free (56 jobs' worth).
    assert rules["relax"] == min(max_relax, 56)
    assert rules["would-not-start"] == (24 if max_relax > 80 else 0)
    batch = plans[2][1]
    assert batch["threads"] == 2 and batch["snapshot_answers"] >= rules["relax"]


# ------------------------------------------------------------------ varied small states
def _train(job_id: int, waited_h: float, **kw: Any) -> JobInfo:
    rec = record("gpus=2 class=train", "h100|a100", "tres_per_node,features,partition")
    return pending(job_id, waited_h=waited_h, tres_per_node=(GresItem("gpu", None, 2),),
                   features="h100|a100", prefer="h100", admin_comment=rec, **kw)


def _switchy(job_id: int, waited_h: float) -> JobInfo:
    return pending(job_id, waited_h=waited_h, partition="batch", switches=Switches(1, 3600),
                   admin_comment=record("nodes=2 cores=4 locality=switch switch-wait=3600",
                                        "", "min_nodes,max_nodes,req_switch,wait4switch"))


def _inference(job_id: int, waited_h: float) -> JobInfo:
    req = "gpus-per-node=1 class=inference wait-for=first,max=1800"
    return pending(job_id, waited_h=waited_h, partition="gpu_a100",
                   tres_per_node=(GresItem("gpu", None, 1),), features="a100|h100",
                   admin_comment=record(req, "a100|h100", "tres_per_node,features,partition",
                                        **{"class": "inference"}))


def _random_state(seed: int) -> FakeSlurm:
    rng = random.Random(seed)
    jobs: list[JobInfo] = []
    jid = 1000
    for node, model in (("gpu1", "h100"), ("gpu2", "h100"), ("gpu3", "a100"),
                        ("gpu4", "a100")):
        # The A100s mostly full (energy=low jobs narrowed to them wait), H100s partly.
        busy = rng.choice((8, 8, 8, 6, rng.randint(0, 8)) if model == "a100" else
                          (8, 6, 4, 2, rng.randint(0, 8)))
        jobs += fill(node, model, jid, busy)
        jid += 10
    for node in ("cpu1", "cpu2", "cpu3", "cpu4", "fpga1"):
        if rng.random() < 0.5:
            jobs.append(replace(running(jid, node, "h100", ()), allocated_gres={},
                                cpu_ids={node: tuple(range(rng.randint(1, 8)))}))
            jid += 1
    makers = (
        lambda i, w: energy_low(i, waited_h=w),
        lambda i, w: energy_low(i, waited_h=w, typed=True),
        _train, _switchy, _inference,
        lambda i, w: pending(i, waited_h=w, tres_per_node=(GresItem("gpu", None, 1),)),
        lambda i, w: energy_low(i, waited_h=w, reason="Dependency"),
    )
    for k in range(rng.randint(3, 14)):
        make = rng.choice(makers)
        jobs.append(make(2000 + k, rng.choice((0.2, 1.5, 2.0, 3.0, 5.0))))
    return cluster(SITE, *jobs)


@pytest.mark.parametrize("seed", range(40))
def test_batch_equals_sequential_on_varied_states(seed: int) -> None:
    fake = _random_state(seed)
    pol = Rebalance(max_relax_per_run=random.Random(seed).choice((1, 2, 5, 20)))
    _assert_same(_plans(fake, SITE, pol, NOW))


def test_later_jobs_see_what_earlier_ones_took_in_batch() -> None:
    # Two H100 GPUs free: the first of two energy=low jobs takes them; the second's snapshot
    # answer (placed) is stale and placed again (would not start), as sequentially.
    fake = cluster(SITE, *fill("gpu3", "a100", 100), *fill("gpu4", "a100", 200),
                   *fill("gpu1", "h100", 300, 6), *fill("gpu2", "h100", 400),
                   energy_low(50, waited_h=3), energy_low(51, waited_h=2))
    plans = _plans(fake, SITE, Rebalance(), NOW, ways=((1, False), (2, True)))
    _assert_same(plans)
    assert [d.rule for d in plans[1][0].decisions] == ["relax", "would-not-start"]
    assert plans[1][1]["placed_again"] >= 1


def test_the_site_knobs_pick_the_path() -> None:
    fake = _random_state(3)
    nodes, jobs = fake.nodes(), fake.jobs()
    live = LiveState.from_backend(_Snapshot(nodes, jobs), now=NOW)
    parts = {p.name: p.nodes for p in fake.partitions()}
    plans = []
    for knobs, threads, batch in (({"relax_batch": False}, 1, False),
                                  ({"relax_threads": 1}, 1, True),
                                  ({"relax_threads": 3}, 3, True)):
        stats: dict[str, Any] = {}
        plan, _ = plan_relax(jobs, SITE, Rebalance(**knobs),
                             ClusterModel.from_site(SITE).with_state(live), partitions=parts,
                             now=NOW, stats=stats)
        plans.append((plan, stats))
        assert stats["threads"] == threads
        assert ("snapshot_answers" in stats) == batch
    _assert_same(plans)


def test_relax_threads_is_typed() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        Rebalance(relax_threads=0)
    with pytest.raises(ValidationError):
        Rebalance(relax_threads="2")  # type: ignore[arg-type]
    assert Rebalance().relax_threads == 1 and Rebalance().relax_batch is True


# ------------------------------------------------------------------ PlacementCore.take
@pytest.fixture(scope="module")
def loaded() -> ClusterModel:
    layouts, tree = synthetic_layouts(96)
    return half_loaded(ClusterModel.from_layouts(layouts, switches=tree))


TAKE_REQUESTS = [
    Request(gpus_per_node=1),
    Request(gpus_per_node=2, cores_per_node=4),
    Request(gpus_per_node=4, locality=Locality(nvlink="required")),
    Request(fpgas_per_node=1, cores_per_node=2),
    Request(cores_per_node=8, cpu_only=True),
    Request(nodes=2, gpus_per_node=2, cores_per_node=8, locality=Locality(switch="preferred")),
    Request(gpus_per_node=8, cores_per_node=16),
]


def test_a_core_that_takes_answers_as_a_fresh_one(loaded: ClusterModel) -> None:
    # Take what a run of placements chose (twice for some: taken stays taken), from one
    # core; after each take its state, indexes and answers equal a core built anew from the
    # arrays consume() writes.
    rng = random.Random(7)
    core = loaded.new_core()
    model = loaded
    for step in range(30):
        req = rng.choice(TAKE_REQUESTS)
        got = place(model, req)
        if not got.placeable:
            continue
        for n in got.nodes:
            i = model.node_index(n.name)
            mem = req.mem_per_node_mib or req.cores_per_node * (model.def_mem_per_cpu_mib or 0)
            for _ in range(1 + step % 2):
                core.take(i, np.asarray(n.gpus, np.int32), np.asarray(n.fpgas, np.int32),
                          np.asarray(n.cores, np.int32), mem)
        model = consume(model, got, req)
        fresh = model.new_core()
        for name, arr in fresh.state().items():
            assert np.array_equal(core.state()[name], arr), (step, name)
        assert core.index_buckets() == fresh.index_buckets()
        assert core.fpga_index_buckets() == fresh.fpga_index_buckets()
        for r in TAKE_REQUESTS:
            kr = compile_request(model, r)
            assert _run(core, kr) == _run(fresh, kr), (step, r)


def test_take_refuses_indices_outside_the_node(loaded: ClusterModel) -> None:
    core = loaded.new_core()
    before = core.state()
    none = np.zeros(0, np.int32)
    for args in ((loaded.n_nodes, none, none, none, 0),
                 (0, np.asarray([99], np.int32), none, none, 0),
                 (0, none, none, np.asarray([-1], np.int32), 0),
                 (0, none, none, none, -5)):
        with pytest.raises(ValueError, match=r"PlacementCore\.take"):
            core.take(*args)
    after = core.state()
    assert all(np.array_equal(before[k], after[k]) for k in before)


# ------------------------------------------------------------------ bench rebalance's report
def _small_bench() -> tuple[Site, FakeSlurm]:
    from hetslurm.lab.bench_rebalance import _site_toml
    from hetslurm.lab.bench_rebalance import cluster as bench_cluster
    from hetslurm.site.load import parse_site

    with tempfile.TemporaryDirectory() as tmp:
        site = parse_site(_site_toml(64, Path(tmp)), "<bench>")
    return site, bench_cluster(400, 64, 160)


def test_bench_reports_both_ways_side_by_side() -> None:
    from hetslurm.lab.bench_rebalance import relax_side_by_side

    site, fake = _small_bench()
    got = relax_side_by_side(site, fake, repeats=1, threads=2)
    assert got["same_decisions"] is True and got["threads"] == 2
    assert got["pending"] == 160 and got["placed_jobs"] == 80
    assert got["rules"]["relax"] == 56 and got["rules"]["would-not-start"] == 24
    assert got["ratio"] == pytest.approx(got["sequential_s"] / got["batch_s"], rel=0.1)


def test_bench_fails_loudly_when_the_ways_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    import hetslurm.act.relax as relax
    from hetslurm.lab.bench_rebalance import relax_side_by_side

    real = relax.plan_relax

    def skewed(*a: Any, **kw: Any) -> Any:
        plan, skipped = real(*a, **kw)
        if kw.get("batch"):
            plan = RelaxPlan(plan.decisions[:-1], plan.quiet)
        return plan, skipped

    monkeypatch.setattr(relax, "plan_relax", skewed)
    site, fake = _small_bench()
    with pytest.raises(RuntimeError, match="decided differently"):
        relax_side_by_side(site, fake, repeats=1, threads=2)
