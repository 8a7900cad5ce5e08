"""The parameter file, both policies on a toy site (hand-derived outcomes), and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_simulate_engine import TOY

from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.placement.model import ClusterModel
from hetslurm.simulate import params as params_mod
from hetslurm.simulate.easy import replay
from hetslurm.simulate.params import Params, load_params
from hetslurm.simulate.traces import TraceJob
from hetslurm.simulate.workload import (
    build_jobs,
    classify,
    gavel_throughputs,
    node_weights,
    partition_names,
    partition_nodes,
    runtimes,
)
from hetslurm.site.load import load_site
from hetslurm.site.model import Site
from hetslurm.traces import traces_dir

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "site-configs" / "simulate-params.toml"
POLICIES = ("slurm-default", "hetslurm")
ALL = ("slurm-default", "slurm-cpu-partition", "slurm-speed-weights", "slurm-tuned", "hetslurm")


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Site:
    path = tmp_path_factory.mktemp("toy") / "toy.toml"
    path.write_text(TOY)
    return load_site(path)


def params_with(tmp_path: Path, **swap: str) -> Params:
    """The shipped file with some lines replaced (key = the line's start)."""
    lines = SHIPPED.read_text().splitlines()
    for start, new in swap.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(start)]
        assert len(hits) == 1, start
        lines[hits[0]] = new
    p = tmp_path / "params.toml"
    p.write_text("\n".join(lines) + "\n")
    return load_params(p)


@pytest.fixture
def params(tmp_path: Path) -> Params:
    # The toy site has only the vision, rl and preprocess classes: untyped jobs are vision.
    return params_with(tmp_path, untyped_shares="untyped_shares = { vision = 1.0 }")


def test_shipped_params_load() -> None:
    p = load_params(SHIPPED)
    assert tuple(p.policies) == ALL == params_mod.POLICIES
    assert ALL[:-1] == params_mod.BASELINES
    assert p.speed("vision", "v100") == 6.59
    assert p.policies["slurm-default"].node_weights == "uniform"
    assert p.policies["hetslurm"].use_classes


def test_params_refuse_unknown_and_missing_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[jobs\] unknown key 'cores_per_gpus' \(did you mean "
                       r"'cores_per_gpu'\?\)"):
        params_with(tmp_path, cores_per_gpu="cores_per_gpu = 4\ncores_per_gpus = 4")
    with pytest.raises(ConfigError, match=r"\[jobs\] lacks 'cores_per_gpu'"):
        params_with(tmp_path, cores_per_gpu="")
    with pytest.raises(ConfigError, match="fractional_gpu = 'half' is not one of"):
        params_with(tmp_path, fractional_gpu='fractional_gpu = "half"')
    with pytest.raises(ConfigError, match="no speed for class 'vision' on model 'h100'"):
        load_params(SHIPPED).speed("vision", "h100")


def replay_policy(site: Site, params: Params, jobs: list[TraceJob], fmt: str = "philly",
                  policies: tuple[str, ...] = POLICIES,
                  ) -> dict[str, dict[str, tuple[float, float, str]]]:
    built, _ = build_jobs(jobs, fmt, site, params, policies)
    base = ClusterModel.from_site(site)
    out = {}
    for p in policies:
        model = node_weights(base, params.policies[p], params)
        parts = {n: partition_nodes(site, model, n) for n in partition_names(built[p])}
        res = replay(model, built[p], parts, backfill_depth=10)
        out[p] = {r.job.id: (r.start, r.end, model.names[int(r.alloc.nodes[0])])
                  for r in res.records}
    return out


def test_cpu_job_on_gpu_node_cores_pushes_gpu_job_to_k80(toy: Site, params: Params) -> None:
    # A 4-core CPU job at 0, then a 1-GPU vision job (4 cores per GPU) at 1, 100 s on P100.
    # slurm-default: every Weight=1, node order: the CPU job takes all of g1's cores, so the
    # GPU job runs on g2's K80: 100 x 4.99 / 1.0 = 499 s. hetslurm: the CPU job goes to the
    # cpu partition, the GPU job to g1's V100 (lowest weight): 100 x 4.99 / 6.59 s.
    jobs = [TraceJob("cpu", 0, 100, 0, cores=4), TraceJob("gpu", 1, 100, 1)]
    got = replay_policy(toy, params, jobs)
    assert got["slurm-default"]["cpu"] == (0, 100, "g1")
    assert got["slurm-default"]["gpu"] == pytest.approx((1, 500, "g2"))
    assert got["hetslurm"]["cpu"] == (0, 100, "c1")
    assert got["hetslurm"]["gpu"] == pytest.approx((1, 1 + 100 * 4.99 / 6.59, "g1"))


def test_baselines_keep_cpu_work_off_gpu_nodes_their_own_way(toy: Site,
                                                            params: Params) -> None:
    # Two 4-core CPU jobs at 0 (c1 holds one), then a 1-GPU vision job at 1 (100 s on P100).
    # slurm-cpu-partition / slurm-tuned: both CPU jobs in the cpu partition (c1), one after
    # the other; the GPU job on g1's V100. slurm-speed-weights: the first CPU job on c1
    # (Weight 1), the second on the fastest GPU node, g1 (Weight 2), so the GPU job runs on
    # g2's K80 (Weight 3): 100 x 4.99 / 1.0 s.
    jobs = [TraceJob("cpu-a", 0, 100, 0, cores=4), TraceJob("cpu-b", 0, 100, 0, cores=4),
            TraceJob("gpu", 1, 100, 1)]
    got = replay_policy(toy, params, jobs, policies=ALL[:-1])
    v100 = pytest.approx((1, 1 + 100 * 4.99 / 6.59, "g1"))
    for p in ("slurm-cpu-partition", "slurm-tuned"):
        assert got[p]["cpu-a"] == (0, 100, "c1") and got[p]["cpu-b"] == (100, 200, "c1"), p
        assert got[p]["gpu"] == v100, p
    sw = got["slurm-speed-weights"]
    assert sw["cpu-a"] == (0, 100, "c1") and sw["cpu-b"] == (0, 100, "g1")
    assert sw["gpu"] == pytest.approx((1, 500, "g2"))
    # slurm-default: Weight=1 and slurm.conf order, g1 then g2 take the CPU jobs.
    assert got["slurm-default"]["cpu-a"] == (0, 100, "g1")
    assert got["slurm-default"]["cpu-b"] == (0, 100, "g2")


def test_speed_weights_order_models_by_their_geometric_mean_speed(toy: Site,
                                                                  params: Params) -> None:
    from dataclasses import replace

    from hetslurm.simulate.workload import model_speed, speed_weights

    base = ClusterModel.from_site(toy)
    assert list(base.names) == ["g1", "g2", "c1"]
    assert speed_weights(base, params) == [2, 3, 1]  # V100 is faster than K80 on average
    # K80 faster on the geometric mean (sqrt(4 x 1) = 2 against sqrt(1 x 3) = 1.73): first.
    swapped = replace(params, speeds={"vision": {"v100": 1.0, "k80": 4.0},
                                      "rl": {"v100": 3.0, "k80": 1.0}})
    assert model_speed(swapped, "k80") == pytest.approx(2.0)
    assert speed_weights(base, swapped) == [3, 2, 1]
    w = node_weights(base, swapped.policies["slurm-tuned"], swapped).weight
    assert list(w) == [3, 2, 1] and not w.flags.writeable
    with pytest.raises(ConfigError, match="needs the parameter file's"):
        node_weights(base, swapped.policies["slurm-tuned"])


def test_strongest_baseline_and_the_ratios_against_it(params: Params) -> None:
    from hetslurm.simulate.run import _summary, strongest_baseline

    def row(p: str, load: float, wait: float, **kw: object) -> dict[str, object]:
        return {"policy": p, "load": load, "mean_wait_s": wait, "mean_jct_s": wait + 100,
                "unfinished": 0, **kw}

    bound = params.bounded_mean_wait_s
    rows = [row("slurm-default", 1, 100), row("slurm-default", 2, bound + 1),
            row("slurm-tuned", 1, 50), row("slurm-tuned", 2, 200),
            row("slurm-cpu-partition", 1, 40), row("slurm-cpu-partition", 2, 300),
            row("hetslurm", 1, 20), row("hetslurm", 2, 100)]
    pols = ("slurm-default", "slurm-tuned", "slurm-cpu-partition", "hetslurm")
    # Both bounded at 2: the lower summed wait wins (tuned 250 < cpu-partition 340).
    assert strongest_baseline(rows, params, pols, (1, 2)) == "slurm-tuned"
    summ = {e["policy"]: e for e in _summary(rows, params, pols, (1, 2))}
    het = summ["hetslurm"]
    assert het["baseline"] == "slurm-tuned" and het["max_bounded_load"] == 2
    assert het["mean_wait_ratio@1"] == 0.4 and het["mean_wait_ratio@2"] == 0.5
    assert het["jct_ratio@2"] == pytest.approx(200 / 300, abs=1e-4)
    assert het["sustainable_load_ratio"] == 1.0
    assert het["vs"]["slurm-default"]["sustainable_load_ratio"] == 2.0
    assert set(het["vs"]) == {"slurm-default", "slurm-tuned", "slurm-cpu-partition"}
    assert "baseline" not in summ["slurm-tuned"] and "throughput_ratio@1" not in het
    # A baseline with a failed row cannot be the strongest; no baseline, no comparison.
    rows[3] = {"policy": "slurm-tuned", "load": 2, "error": "RuntimeError: x"}
    assert strongest_baseline(rows, params, pols, (1, 2)) == "slurm-cpu-partition"
    assert strongest_baseline(rows, params, ("hetslurm",), (1, 2)) is None


def test_hetslurm_requests_carry_the_class(toy: Site, params: Params) -> None:
    built, dropped = build_jobs([TraceJob("g", 0, 100, 1), TraceJob("c", 0, 10, 0)],
                                "philly", toy, params, POLICIES)
    assert dropped == {"fractional": 0, "oversize": 0, "gpu_spec_no_site_model": 0}
    het = {j.id: j for j in built["hetslurm"]}
    dflt = {j.id: j for j in built["slurm-default"]}
    assert het["g"].partition == "gpu" and het["g"].cls == "vision"
    assert het["g"].kr.gpu_rank == (0, 1)  # vision: v100 then k80
    assert het["c"].partition == "cpu" and het["c"].kr.cpu_only
    assert dflt["c"].partition == "*" and not dflt["c"].kr.cpu_only
    # The time limit covers the slowest allowed model (K80): 100 x 4.99 s.
    assert het["g"].time_limit == pytest.approx(499)


def test_oversize_and_fractional_jobs(toy: Site, params: Params, tmp_path: Path) -> None:
    jobs = [TraceJob("big", 0, 10, 8), TraceJob("half", 0, 10, 1, gpu_milli=500),
            TraceJob("ok", 0, 10, 1)]
    built, dropped = build_jobs(jobs, "alibaba", toy, params, POLICIES)
    # 8 GPUs = 4 nodes x 2 on a cluster of 2 GPU nodes: dropped for both policies.
    assert dropped == {"fractional": 0, "oversize": 1, "gpu_spec_no_site_model": 0}
    assert [j.id for j in built["hetslurm"]] == ["half", "ok"]
    assert built["hetslurm"][0].gpus == 1  # 0.5 GPU holds a whole GPU (round-up)
    drop = params_with(tmp_path, untyped_shares="untyped_shares = { vision = 1.0 }",
                       fractional_gpu='fractional_gpu = "drop"')
    _, dropped = build_jobs(jobs, "alibaba", toy, drop, POLICIES)
    assert dropped == {"fractional": 1, "oversize": 1, "gpu_spec_no_site_model": 0}


def test_io_standin_runs_on_cpu_nodes_only_under_hetslurm(toy: Site, tmp_path: Path) -> None:
    p = params_with(tmp_path, untyped_shares="untyped_shares = { vision = 1.0 }",
                    io_gpu_milli_below="io_gpu_milli_below = 500",
                    cpu_slowdown_of_io_jobs="cpu_slowdown_of_io_jobs = 2.0")
    got = replay_policy(toy, p, [TraceJob("io", 0, 100, 1, gpu_milli=300, cores=1)], "alibaba")
    assert got["slurm-default"]["io"] == (0, 100, "g1")  # holds a whole GPU
    assert got["hetslurm"]["io"] == (0, 200, "c1")  # CPU node, 2x slower (assumed)


def test_same_jobs_replayed_by_both_policies(toy: Site, params: Params) -> None:
    # 0 or 1 GPU: a 2-GPU job needs 2 x 4 cores, more than a toy node has (dropped).
    jobs = [TraceJob(f"j{i}", i * 7.0, 50 + i, i % 2) for i in range(30)]
    built, _ = build_jobs(jobs, "philly", toy, params, POLICIES)
    assert [j.id for j in built["hetslurm"]] == [j.id for j in built["slurm-default"]]
    got = replay_policy(toy, params, jobs)
    for p in POLICIES:
        assert len(got[p]) == 30
        submit = {j.id: j.submit for j in jobs}
        assert all(start >= submit[i] and end > start for i, (start, end, _) in got[p].items())


def test_cli_json(toy: Site, tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-09 07:{i:02d}:00,{300 + 10 * i},{1 + i % 2},0,a\n" for i in range(20)))
    params = tmp_path / "p.toml"
    params.write_text(SHIPPED.read_text().replace(
        "untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, rl = 0.035 }",
        "untyped_shares = { vision = 0.5, rl = 0.5 }"))
    r = CliRunner().invoke(cli, [
        "simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "philly",
        "--params", str(params), "--load", "1", "--load", "4", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [(row["policy"], row["load"]) for row in doc["rows"]] == [
        ("slurm-default", 1.0), ("slurm-default", 4.0), ("hetslurm", 1.0), ("hetslurm", 4.0)]
    # The 2-GPU jobs need 8 cores (4 per GPU): no toy node has them, so they are dropped.
    assert doc["meta"]["dropped"] == {"fractional": 0, "oversize": 10,
                                      "gpu_spec_no_site_model": 0}
    assert doc["meta"]["unused_columns"] == ["gpu_time", "cluster"]
    assert doc["meta"]["compression"] is None
    assert all(row["jobs"] == 10 and row["unfinished"] == 0 for row in doc["rows"])
    assert "mean_wait_ratio@4" in doc["summary"][1]
    assert doc["summary"][1]["baseline"] == doc["meta"]["strongest_baseline"] == "slurm-default"
    plots = tmp_path / "plots"
    r = CliRunner().invoke(cli, [
        "simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "philly",
        "--params", str(params), "--load", "1", "--load", "4", "--plot", str(plots)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in plots.iterdir()) == [
        "gpus_busy.png", "wait_cdf.png", "wait_vs_load.png"]
    assert all(p.stat().st_size > 1000 for p in plots.iterdir())
    bad = CliRunner().invoke(cli, [
        "simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "alibaba",
        "--params", str(params)])
    assert bad.exit_code == 2
    assert "header lacks column" in bad.output


TRACES = traces_dir()


@pytest.mark.skipif(not (TRACES / "gavel" / "simulation_throughputs.json").is_file(),
                    reason=f"Gavel's throughput table not found under {TRACES} "
                    "(set HETSLURM_TRACES)")
def test_gavel_runtimes_come_from_the_measured_table() -> None:
    site = load_site(ROOT / "site-configs" / "case-study.toml")
    params = load_params(SHIPPED)
    table = gavel_throughputs()
    a3c = classify(TraceJob("a", 0, None, 1, job_type="A3C", steps=1000), params)
    assert a3c is not None and a3c.cls == "rl"
    times = runtimes(a3c, "gavel", site.gpu_models(), params)
    assert times[0] == pytest.approx(1000 / table["v100"][("A3C", 1)])
    assert times[2] == pytest.approx(1000 / table["k80"][("A3C", 1)])
    # ResNet-50 at batch 128 on 2 GPUs does not run on K80 (0 steps/s in Gavel's table):
    # both policies leave K80 out of the job's models.
    big = TraceJob("r", 0, None, 2, job_type="ResNet-50 (batch size 128)", steps=1000)
    built, _ = build_jobs([big], "gavel", site, params, POLICIES)
    for p in POLICIES:
        assert built[p][0].kr.gpu_rank[2] == -1
        assert built[p][0].kr.gpu_rank[0] >= 0


@pytest.mark.skipif(not (TRACES / "sia-philly" / "philly.csv").is_file(),
                    reason=f"shared traces not found at {TRACES} (set HETSLURM_TRACES)")
def test_bench_simulate_reports_each_trace_and_policy() -> None:
    from hetslurm.lab.bench_simulate import bench_simulate

    site, params = load_site(ROOT / "site-configs" / "case-study.toml"), load_params(SHIPPED)
    rows = bench_simulate(site, params, policies=POLICIES, limit=50)
    # Both backfill models by default, each trace's policies side by side.
    assert [(r["trace"], r["backfill"], r["policy"]) for r in rows] == [
        (t, b, p) for t in ("alibaba", "philly") for b in ("easy", "slurm") for p in POLICIES]
    for r in rows:
        assert {"trace", "policy", "backfill", "model", "seed", "load", "jobs", "seconds",
                "jobs_per_s", "mean_queue_depth", "loadavg_1m", "vs_easy"} <= set(r)
        assert 0 < r["jobs"] <= 50 and r["seconds"] > 0 and len(r["loadavg_1m"]) == 2
        # Each slurm row against the EASY row of the same trace, load and policy.
        assert (r["vs_easy"] is None) == (r["model"] == "easy")
    only = bench_simulate(site, params, policies=POLICIES, limit=20, backfills=("slurm",))
    assert {r["backfill"] for r in only} == {"slurm"}
    with pytest.raises(ConfigError, match="backfill models"):
        bench_simulate(site, params, policies=POLICIES, limit=20, backfills=("fifo",))


def test_cpu_job_wider_than_a_node_spans_nodes(toy: Site, params: Params) -> None:
    # 10 cores on 4-core nodes: 3 nodes x 4 cores (whole per-node shares), CPU nodes only
    # under hetslurm: the toy has one, so the job is dropped there and for both policies.
    built, dropped = build_jobs([TraceJob("w", 0, 10, 0, cores=10)], "swf", toy, params,
                                POLICIES)
    assert dropped == {"fractional": 0, "oversize": 1, "gpu_spec_no_site_model": 0}
    built, dropped = build_jobs([TraceJob("w", 0, 10, 0, cores=10)], "swf", toy, params,
                                ("slurm-default",))
    assert dropped == {"fractional": 0, "oversize": 0, "gpu_spec_no_site_model": 0}
    kr = built["slurm-default"][0].kr
    assert (kr.nodes, kr.cores) == (3, 4)


def test_speed_exponent_raises_every_ratio(toy: Site, params: Params) -> None:
    # Exponent 0: every model equally fast; 2: every ratio squared; the runtime on a model
    # is duration x (speed[ref] / speed[m]) ** exponent (ref = p100 for Philly).
    flat, square = params.with_speed_exponent(0), params.with_speed_exponent(2)
    assert flat.speed("vision", "v100") == flat.speed("vision", "k80") == 1.0
    assert square.speed("vision", "v100") == pytest.approx(6.59 ** 2)
    assert params.with_speed_exponent(1).speeds == params.speeds
    c = classify(TraceJob("j", 0, 100.0, 1), params)
    assert c is not None
    models = ("v100", "k80")
    base = runtimes(c, "philly", models, params)
    sq = runtimes(c, "philly", models, square)
    assert sq[1] == pytest.approx(100 * (4.99 / 1.0) ** 2)
    assert sq[0] / 100 == pytest.approx((base[0] / 100) ** 2)
    assert runtimes(c, "philly", models, flat) == {0: 100.0, 1: 100.0}
    with pytest.raises(ConfigError, match="must be a finite number >= 0"):
        params.with_speed_exponent(-1)


def test_cli_speed_exponent(toy: Site, tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-09 07:{10 * i:02d}:00,{300 + 10 * i},1,0,a\n" for i in range(6)))
    params = tmp_path / "p.toml"
    params.write_text(SHIPPED.read_text().replace(
        "untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, rl = 0.035 }",
        "untyped_shares = { vision = 1.0 }"))
    args = ["simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "philly",
            "--params", str(params), "--policy", "slurm-default", "--format", "json"]
    jct = {}
    for e in ("0", "1"):
        r = CliRunner().invoke(cli, [*args, "--speed-exponent", e])
        assert r.exit_code == 0, r.output
        jct[e] = json.loads(r.stdout)["rows"][0]["mean_jct_s"]
    # One vision job every 10 minutes, none waits: it runs on the toy's first node (V100)
    # for duration x 4.99 / 6.59 (P100 is Philly's reference model), or for its duration
    # with exponent 0.
    assert jct["0"] == pytest.approx(sum(300 + 10 * i for i in range(6)) / 6)
    assert jct["1"] == pytest.approx(jct["0"] * 4.99 / 6.59)
    bad = CliRunner().invoke(cli, [*args, "--speed-exponent", "-1"])
    assert bad.exit_code == 2


ALIBABA_SITE = ROOT / "site-configs" / "alibaba-openb.toml"


def test_alibaba_layout_has_a_speed_for_every_class_and_model() -> None:
    site = load_site(ALIBABA_SITE)
    params = load_params(SHIPPED)
    assert set(site.gpu_models()) == {"v100m32", "v100m16", "g3", "g2", "p100", "a10", "t4"}
    for cls in params.untyped_shares:
        for m in site.gpu_models():
            assert params.speed(cls, m) > 0
    # The V100s are Gavel's measured v100; T4 and A10 scale P100 by memory bandwidth.
    assert params.speed("vision", "v100m16") == params.speed("vision", "v100")
    assert params.speed("language", "t4") == pytest.approx(2.98 * 320 / 732, abs=0.01)
    assert params.speed("language", "a10") == pytest.approx(2.98 * 600 / 732, abs=0.01)
    assert set(site.partitions) == {"cpu", "gpu"}


def test_a_pod_asking_zero_memory_is_replayed_under_both_policies(toy: Site,
                                                                  params: Params) -> None:
    # Alibaba pods may ask 0 MiB; the #HET grammar has no mem=0, so the hook's meaning is
    # asked without it, and placement still sees the trace's 0.
    jobs = [TraceJob("z", 0, 10, 1, cores=1, mem_mib=0)]
    built, dropped = build_jobs(jobs, "alibaba", toy, params, POLICIES)
    assert sum(dropped.values()) == 0
    assert [j.kr.mem_mib for p in POLICIES for j in built[p]] == [0, 0]


def test_trace_gpu_constraint_is_honoured_by_every_policy(toy: Site, params: Params,
                                                          tmp_path: Path) -> None:
    # A vision job (V100 first) that its trace lets run only on K80 runs on g2's K80 under
    # both policies, though g1's V100 is free; 'K80|T4' the same (T4 is not a site model,
    # that alternative is dropped and named in meta); 'T4' alone cannot run here: dropped.
    jobs = [TraceJob("k80", 0, 100, 1, cores=1, gpu_models=("K80",)),
            TraceJob("either", 1, 100, 1, cores=1, gpu_models=("K80", "T4")),
            TraceJob("t4", 2, 100, 1, cores=1, gpu_models=("T4",)),
            TraceJob("any", 3, 100, 1, cores=1)]
    got = replay_policy(toy, params, jobs)
    for p in POLICIES:
        assert got[p]["k80"][2] == "g2" and got[p]["either"][2] == "g2"
        assert got[p]["any"][2] == "g1"
        assert "t4" not in got[p]
    _, dropped = build_jobs(jobs, "alibaba", toy, params, POLICIES)
    assert dropped["gpu_spec_no_site_model"] == 1
    from hetslurm.simulate.workload import site_gpu_models, trace_values

    meta = trace_values(jobs, toy, params, POLICIES)["gpu_spec"]
    assert meta == {"jobs": 3, "jobs_partly_unknown": 1,
                    "names": {"K80": {"jobs": 2, "site_model": "k80"},
                              "T4": {"jobs": 2, "site_model": None}}}
    # [jobs] trace_gpu_models maps a name the site spells otherwise.
    assert site_gpu_models(("Tesla-K80", "V100"), ("v100", "k80"), {"Tesla-K80": "k80"}) == (
        ("k80", "v100"), ())
    aliased = params_with(tmp_path, untyped_shares="untyped_shares = { vision = 1.0 }",
                          cores_per_gpu='cores_per_gpu = 4\ntrace_gpu_models = { T4 = "k80" }')
    got = replay_policy(toy, aliased, jobs)
    assert got["hetslurm"]["t4"][2] == "g2"


def test_a_failing_replay_loses_its_row_not_the_sweep(toy: Site, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import hetslurm.simulate.run as run

    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-09 07:{i:02d}:00,{300 + 10 * i},1,0,a\n" for i in range(10)))
    params = tmp_path / "p.toml"
    params.write_text(SHIPPED.read_text().replace(
        "untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, rl = 0.035 }",
        "untyped_shares = { vision = 0.5, rl = 0.5 }"))
    real = run.run_replay
    calls = []

    def flaky(*args: object, **kw: object) -> object:
        calls.append(kw["load"])
        if len(calls) == 2:
            raise RuntimeError("placement core refused a backfill start (test)")
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(run, "run_replay", flaky)
    out = tmp_path / "rows.jsonl"
    r = CliRunner().invoke(cli, [
        "simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "philly",
        "--params", str(params), "--load", "1", "--load", "2", "--format", "json",
        "--rows-out", str(out)])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["failed_rows"] == 1
    assert [("error" in row, row["policy"], row["load"]) for row in doc["rows"]] == [
        (False, "slurm-default", 1.0), (True, "slurm-default", 2.0),
        (False, "hetslurm", 1.0), (False, "hetslurm", 2.0)]
    assert doc["rows"][1]["error"].startswith("RuntimeError: placement core refused")
    assert all(row["internal_disagreements"] == 0 for row in doc["rows"] if "error" not in row)
    assert "simulate: slurm-default at load 2 failed: RuntimeError" in r.stderr
    # The summary has no ratio where a row is missing, and the others stand.
    het = doc["summary"][1]
    assert het["mean_wait_ratio@2"] is None and "mean_wait_ratio@1" in het
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["policy"], x["load"]) for x in lines] == [(x["policy"], x["load"])
                                                         for x in doc["rows"]]


def test_cli_policy_all_replays_every_baseline(toy: Site, tmp_path: Path) -> None:
    # Alibaba pods: every other one CPU-only (4 cores), the others one whole GPU (1 core).
    trace = tmp_path / "pods.csv"
    trace.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n" + "".join(
            f"p{i},{4000 if i % 2 else 1000},1024,{0 if i % 2 else 1},{0 if i % 2 else 1000},,"
            f"LS,Succeeded,{30 * i},{30 * i + 400},{30 * i}\n" for i in range(12)))
    params = tmp_path / "p.toml"
    params.write_text(SHIPPED.read_text().replace(
        "untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, rl = 0.035 }",
        "untyped_shares = { vision = 1.0 }"))
    r = CliRunner().invoke(cli, [
        "simulate", "--site", toy.path, "--trace", str(trace), "--trace-format", "alibaba",
        "--params", str(params), "--policy", "all", "--load", "1", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [row["policy"] for row in doc["rows"]] == list(ALL)
    strongest = doc["meta"]["strongest_baseline"]
    assert strongest in ALL[:-1]
    het = doc["summary"][-1]
    assert het["policy"] == "hetslurm" and het["baseline"] == strongest
    assert set(het["vs"]) == set(ALL[:-1])
    # The strongest baseline's mean wait is the lowest of the baselines' (one load).
    waits = {row["policy"]: row["mean_wait_s"] for row in doc["rows"]}
    assert waits[strongest] == min(waits[p] for p in ALL[:-1])
    # --validate replays only the policies its workload defines: refused, one line.
    bad = CliRunner().invoke(cli, ["simulate", "--validate", "--sim-only", "--policy",
                                   "slurm-tuned"])
    assert bad.exit_code != 0 and "unknown policy 'slurm-tuned'" in bad.output


def _mixed_trace(tmp_path: Path, n: int = 16) -> tuple[Path, Path]:
    """Philly jobs the toy site's untyped shares split between vision and rl (by the
    seed's draw), and the shipped parameters with those shares."""
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-09 07:{2 * i:02d}:00,{600 + 37 * i},1,0,a\n" for i in range(n)))
    params = tmp_path / "p.toml"
    params.write_text(SHIPPED.read_text().replace(
        "untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, rl = 0.035 }",
        "untyped_shares = { vision = 0.5, rl = 0.5 }"))
    return trace, params


def test_seeds_change_the_draw_and_the_summary_gives_median_and_spread(
        toy: Site, tmp_path: Path) -> None:
    from dataclasses import replace

    from hetslurm.simulate.run import simulate
    from hetslurm.simulate.traces import read_trace

    trace_file, params_file = _mixed_trace(tmp_path)
    params = load_params(params_file)
    trace = read_trace(trace_file, "philly")
    draws = {s: [classify(j, replace(params, seed=s)).cls for j in trace.jobs]  # type: ignore[union-attr]
             for s in (0, 1, 2)}
    assert draws[0] != draws[1] != draws[2] and {"vision", "rl"} <= set(draws[1])
    seen: list[str] = []
    res = simulate(toy, trace, params, policies=POLICIES, loads=(1.0, 3.0), seeds=(0, 1, 2),
                   progress=lambda label, done, total: seen.append(label))
    assert [(r["seed"], r["policy"], r["load"]) for r in res.rows] == [
        (s, p, x) for s in (0, 1, 2) for p in POLICIES for x in (1.0, 3.0)]
    assert {"slurm-default load 1 seed 0", "hetslurm load 3 seed 2"} <= set(seen)
    # Seed 0 alone is the draw every earlier release made: the same rows.
    alone = simulate(toy, trace, params, policies=POLICIES, loads=(1.0, 3.0))
    strip = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in alone.rows] == [
        {k: v for k, v in r.items() if k not in strip} for r in res.rows if r["seed"] == 0]
    # Per (policy, load): the median and min-max over the three seeds.
    waits = {(r["policy"], r["load"]): [] for r in res.rows}
    for r in res.rows:
        waits[(r["policy"], r["load"])].append(r["mean_wait_s"])
    for e in res.spread:
        w = sorted(waits[(e["policy"], e["load"])])
        assert e["seeds"] == 3 and e["mean_wait_s"] == {
            "median": round(w[1], 4), "min": round(w[0], 4), "max": round(w[2], 4)}
    het = res.summary[1]
    ratios = sorted(r["mean_wait_s"] / d["mean_wait_s"] if d["mean_wait_s"] else None
                    for r, d in zip([r for r in res.rows if r["policy"] == "hetslurm"
                                     and r["load"] == 3.0],
                                    [r for r in res.rows if r["policy"] == "slurm-default"
                                     and r["load"] == 3.0], strict=True))
    assert het["seeds"] == 3 and het["baseline"] == "slurm-default"
    assert het["mean_wait_ratio@3"] == pytest.approx(ratios[1], abs=1e-4)
    assert het["spread"]["mean_wait_ratio@3"] == pytest.approx([ratios[0], ratios[2]],
                                                               abs=1e-4)
    assert res.meta["seeds"] == [0, 1, 2]
    with pytest.raises(ConfigError, match="distinct integers"):
        simulate(toy, trace, params, policies=POLICIES, loads=(1.0,), seeds=(1, 1))


def test_workers_replay_in_child_processes_with_the_same_rows(toy: Site,
                                                              tmp_path: Path) -> None:
    trace_file, params_file = _mixed_trace(tmp_path)
    rows_out = tmp_path / "rows.jsonl"
    args = ["simulate", "--site", toy.path, "--trace", str(trace_file), "--trace-format",
            "philly", "--params", str(params_file), "--load", "1", "--load", "3", "--seed",
            "0", "--seed", "5", "--speed-exponent", "2", "--format", "json"]
    one = CliRunner().invoke(cli, args)
    two = CliRunner().invoke(cli, [*args, "--workers", "2", "--rows-out", str(rows_out)])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    a, b = json.loads(one.stdout), json.loads(two.stdout)

    def strip(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    assert strip(a["rows"]) == strip(b["rows"]) and a["summary"] == b["summary"]
    assert a["spread"] == b["spread"] and b["meta"]["workers"] == 2
    assert len(rows_out.read_text().splitlines()) == 8
    # A child that cannot replay turns its rows into error rows; the others stand.
    from hetslurm.simulate import parallel

    site = load_site(toy.path)
    params = load_params(params_file)
    from hetslurm.simulate.traces import read_trace

    trace = read_trace(trace_file, "philly")
    res = parallel.run_parallel(site, trace, params, policies=POLICIES, loads=(1.0,),
                                first=0, limit=None, tasks=[(0, "hetslurm")], workers=1,
                                keep_traces_seed=0, timeout_s=0.01)
    assert res[0].rows[0]["error"].startswith("WorkerError: the replay's child ran past")
    # A child's refusal (here: the trace file went away) is the parent's, one line.
    from dataclasses import replace

    with pytest.raises(ConfigError, match=r"gone\.csv"):
        parallel.run_parallel(site, replace(trace, path=str(tmp_path / "gone.csv")), params,
                              policies=POLICIES, loads=(1.0,), first=0, limit=None,
                              tasks=[(0, "hetslurm"), (1, "hetslurm")], workers=2,
                              keep_traces_seed=0)
