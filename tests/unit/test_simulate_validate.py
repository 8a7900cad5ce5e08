"""``hetslurm simulate --validate`` without a testbed: the committed workload files, what
each policy submits (checked through the real hook in-process), the simulator's side, the
comparison, sacct parsing and the CLI. The testbed side runs in
tests/cluster/test_simulate_validate.py."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import ConfigError, TestbedError
from hetslurm.lab import validate_simulate as v
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.params import load_params
from hetslurm.simulate.workload import node_weights
from hetslurm.site.load import load_site
from hetslurm.slurm import NodeInfo
from hetslurm.slurm.sacct import parse_sacct_document

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "site-configs" / "validate-workload.toml"
SMALL = ROOT / "site-configs" / "validate-workload-small.toml"


def _plan(path: Path, n: int | None = None) -> tuple[v.Workload, v.Plan]:
    w = v.load_workload(path).head(n)
    site, params = load_site(w.site_file), load_params(w.params_file)
    return w, v.plan(w, site, params, v.POLICIES)


@pytest.mark.parametrize("path", [FULL, SMALL])
def test_committed_workloads_load_and_every_job_is_replayable(path: Path) -> None:
    w, pl = _plan(path)
    assert len(w.jobs) == (100 if path == FULL else 40)
    kinds = {j.cls for j in w.jobs}
    assert kinds == {"train", "inference", None}  # GPU jobs of two classes and CPU jobs
    assert w.jobs[0].submit == 0
    for wj, rt in zip(w.jobs, pl.runtimes, strict=True):
        slowest = max(x for x in rt.values() if math.isfinite(x))
        assert slowest + w.hold_extra_s <= wj.limit_min * 60


def _write(tmp_path: Path, body: str, base: Path = FULL, params: str | None = None) -> Path:
    """``base``'s head (its site and params as absolute paths, or ``params`` of
    site-configs instead) with ``body`` as its jobs."""
    conf = ROOT / "site-configs"
    head, _, _ = base.read_text().partition("[workload]")
    for key in ("site", "params"):
        name = tomllib.loads(head)[key]
        head = head.replace(f'{key} = "{name}"',
                            f'{key} = "{conf / (params if key == "params" and params else name)}"')
    p = tmp_path / "w.toml"
    p.write_text(head + "[workload]\njobs = [\n" + body + "\n]\n")
    return p


@pytest.mark.parametrize(("body", "message"), [
    ('{ id = "a", submit = 0, gpus = 0, cores = 2, runtime = 5, limit_min = 1, x = 1 }',
     "unknown key 'x'"),
    ('{ id = "a", submit = 0, gpus = 1, cores = 2, runtime = 5, limit_min = 1 }',
     "a GPU job names its class"),
    ('{ id = "a", submit = 0, gpus = 0, cores = 2, runtime = 5, limit_min = 1 },\n'
     '{ id = "a", submit = 1, gpus = 0, cores = 2, runtime = 5, limit_min = 1 }',
     "appears twice"),
    ('{ id = "a", submit = 5, gpus = 0, cores = 2, runtime = 5, limit_min = 1 },\n'
     '{ id = "b", submit = 1, gpus = 0, cores = 2, runtime = 5, limit_min = 1 }',
     "submit order"),
    ('{ id = "a", submit = 0, gpus = 0, cores = 2, runtime = 5, limit_min = 0 }',
     "limit_min = 0"),
])
def test_bad_workloads_are_refused_naming_the_job(tmp_path: Path, body: str,
                                                  message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        v.load_workload(_write(tmp_path, body))


def test_a_limit_below_the_slowest_runtime_is_refused(tmp_path: Path) -> None:
    # 61 s on an A100, the slower model for training: over a 1-minute limit.
    p = _write(tmp_path, '{ id = "t", submit = 0, class = "train", gpus = 1, cores = 2, '
                         'runtime = 61, limit_min = 1 }')
    w = v.load_workload(p)
    with pytest.raises(ConfigError, match="runs up to 61 s, over its limit of 1 min"):
        v.plan(w, load_site(w.site_file), load_params(w.params_file), v.POLICIES)


def test_scripts_submit_plain_options_or_het_directives_and_sleep_per_model() -> None:
    from hetslurm.hook.explain import explain

    w, pl = _plan(SMALL)
    site = pl.site
    model = ClusterModel.from_site(site)
    gpu = next(i for i, j in enumerate(w.jobs) if j.cls == "train")
    cpu = next(i for i, j in enumerate(w.jobs) if j.cls is None)
    plain = v.job_script("slurm-default", w.jobs[gpu], pl.jobs["slurm-default"][gpu],
                         pl.runtimes[gpu], site, model)
    assert "#SBATCH -p gpu" in plain and f"#SBATCH --gres=gpu:{w.jobs[gpu].gpus}" in plain
    assert "#HET" not in plain
    # Training runs twice as fast on an H100 (gpu[3-4]) as on an A100 (gpu[1-2]).
    a100 = w.jobs[gpu].runtime
    assert f"gpu1|gpu2) sleep {a100:.3f} ;;" in plain
    assert f"gpu3|gpu4) sleep {a100 / 2:.3f} ;;" in plain
    assert "cpu1" not in plain
    plain_cpu = v.job_script("slurm-default", w.jobs[cpu], pl.jobs["slurm-default"][cpu],
                             pl.runtimes[cpu], site, model)
    assert "#SBATCH -p cpu" in plain_cpu and "--gres" not in plain_cpu
    assert f"gpu1|gpu2|gpu3|gpu4|cpu1|cpu2) sleep {w.jobs[cpu].runtime:.3f}" in plain_cpu
    het = v.job_script("hetslurm", w.jobs[gpu], pl.jobs["hetslurm"][gpu], pl.runtimes[gpu],
                       site, model)
    assert f"#HET gpus={w.jobs[gpu].gpus} class=train" in het and "-p " not in het
    # What the real hook makes of it is what the simulator's hetslurm policy submits.
    writes = dict(explain(het, site).writes)
    assert writes["partition"] == "gpu_h100,gpu_a100"
    assert writes["features"] == "h100|a100"
    het_cpu = v.job_script("hetslurm", w.jobs[cpu], pl.jobs["hetslurm"][cpu],
                           pl.runtimes[cpu], site, model)
    writes = dict(explain(het_cpu, site).writes)
    assert writes["partition"] == "cpu" and writes["features"] == "cpu"
    assert pl.jobs["hetslurm"][cpu].partition == "cpu"


def test_node_order_is_slurm_conf_order_without_hetslurm_and_h100_first_with_it() -> None:
    _w, pl = _plan(SMALL)
    plain = node_weights(ClusterModel.from_site(pl.site),
                         pl.params.policies["slurm-default"])
    assert [int(x) for x in plain.weight] == [1] * 6
    het = node_weights(ClusterModel.from_site(pl.site), pl.params.policies["hetslurm"])
    # gpu[1-2] are the A100s, listed first; the site's weights put the H100s (100) first.
    assert [int(x) for x in het.weight] == [110, 110, 100, 100, 1, 1]
    # CPU jobs stay on CPU nodes under both policies (validate-params.toml says why).
    assert {j.partition for j in pl.jobs["slurm-default"] if j.gpus == 0} == {"cpu"}
    assert v.all_nodes_partition(pl.site) == "batch"


def test_simulated_waits_count_from_submission_with_the_latency_terms() -> None:
    w, pl = _plan(SMALL, 1)  # one job on an empty cluster
    plain = v.simulate_plan(w, pl, "hetslurm", latency=False)
    assert plain.waits == [0.0]
    lat = v.simulate_plan(w, pl, "hetslurm")
    assert lat.waits == [pytest.approx(w.start_latency_s)]
    # An inference job: its class ranks the A100 first (ranked fallback, docs/fallback.md),
    # whatever the site's weights say, and its runtime is given on an A100.
    assert w.jobs[0].cls == "inference"
    assert lat.where == ["a100"]
    assert lat.end[0] - lat.start[0] == pytest.approx(w.jobs[0].runtime + w.hold_extra_s)
    fig = lat.figures()
    assert fig["jobs"] == 1 and fig["makespan_s"] == pytest.approx(lat.end[0])


def test_compare_passes_within_ten_percent_or_the_absolute_margin() -> None:
    t = v.Target(relative=0.10, wait_abs_s=3.0, makespan_abs_s=5.0)
    rows = v.compare({"mean_wait_s": 40.0, "makespan_s": 200.0},
                     {"mean_wait_s": 44.5, "makespan_s": 221.0}, t)
    wait, span = rows
    assert wait["diff"] == -4.5 and wait["margin"] == 4.45 and wait["pass"] is False
    assert span["rel_diff"] == pytest.approx(-0.095, abs=1e-3) and span["pass"] is True
    small = v.compare({"mean_wait_s": 4.0, "makespan_s": 60.0},
                      {"mean_wait_s": 6.5, "makespan_s": 64.0}, t)
    assert [r["pass"] for r in small] == [True, True]  # 2.5 s <= 3 s; 4 s <= 5 s
    assert v.compare({"mean_wait_s": 1.0, "makespan_s": 2.0}, None, t)[0]["pass"] is None


def _accounting(*rows: tuple[int, int, int, int, str, str]) -> FakeSlurm:
    """A controller whose accounting holds these runs (job id, submit, start, end, state,
    nodes), as sacct --json records of Slurm 22.05 (openapi/dbv0.0.38; hand-written, the
    fields and shapes of tests/data/slurm/sacct.json)."""
    jobs = [{"job_id": j, "array": {"job_id": 0, "task_id": None}, "name": "w", "nodes": where,
             "state": {"current": state, "reason": "None"},
             "time": {"submission": sub, "eligible": sub, "start": start, "end": end,
                      "elapsed": end - start if end else 0}, "steps": []}
            for j, sub, start, end, state, where in rows]
    doc = {"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], "jobs": jobs}
    return FakeSlurm(accounting=parse_sacct_document(json.dumps(doc)))


T0 = 1_796_014_800  # 2026-11-30T05:00:00Z


def test_sacct_records_become_times_from_the_first_submission() -> None:
    fake = _accounting((41, T0, T0 + 1, T0 + 31, "COMPLETED", "gpu3"),
                       (42, T0 + 2, T0 + 31, T0 + 61, "COMPLETED", "cpu1"),
                       (43, T0, T0 + 1, T0 + 2, "COMPLETED", "gpu1"))  # not this run's
    sub = v._Submitted({41: 0, 42: 1})
    got = v._sacct(fake, sub, 2)
    assert got.submit == [0.0, 2.0] and got.start == [1.0, 31.0] and got.end == [31.0, 61.0]
    assert got.waits == [1.0, 29.0] and got.where == ["gpu3", "cpu1"]
    assert got.figures()["makespan_s"] == 61.0
    assert v._models(got.where, load_site(ROOT / "site-configs" / "validate-site.toml")) \
        == ["h100", "cpu"]


def test_a_job_that_did_not_complete_fails_the_run() -> None:
    fake = _accounting((7, T0, T0 + 1, T0 + 61, "TIMEOUT", "gpu1"))
    with pytest.raises(TestbedError, match=r"did not complete: \{7: 'TIMEOUT'\}"):
        v._sacct(fake, v._Submitted({7: 0}), 1)


def test_a_run_still_going_is_not_a_finished_record() -> None:
    # sacct --json's end is 0 until the job ends ("not yet").
    fake = _accounting((7, T0, T0 + 1, 0, "RUNNING", "gpu1"))
    with pytest.raises(TestbedError, match="sacct has 0 of 1 finished records"):
        v._sacct(fake, v._Submitted({7: 0}), 1, timeout=-1)


def test_waiting_reads_the_queue_until_our_jobs_leave_it() -> None:
    fake = FakeSlurm(nodes=[NodeInfo("n1", frozenset({"IDLE"}), cpus_total=4)])
    sub = v._Submitted({fake.submit("#!/bin/sh\n"): 0, fake.submit("#!/bin/sh\n"): 1})
    seen: list[int] = []
    with pytest.raises(TestbedError, match="2 jobs still queued or running"):
        v._wait_done(fake, sub, "hetslurm", -1, lambda _w, done, _n: seen.append(done))
    fake.cancel_jobs(list(sub.ids))
    v._wait_done(fake, sub, "hetslurm", 10, lambda _w, done, _n: seen.append(done))
    assert seen == [0, 2]


def test_cli_sim_only_prints_both_policies_and_refuses_trace_options() -> None:
    res = CliRunner().invoke(cli, ["simulate", "--validate", str(SMALL), "--sim-only",
                                   "--jobs", "10", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["meta"]["jobs"] == 10 and doc["meta"]["testbed"] is False
    assert {(r["policy"], r["measure"]) for r in doc["rows"]} == {
        (p, m) for p in v.POLICIES for m in ("mean_wait_s", "makespan_s")}
    assert set(doc["policies"]["hetslurm"]) >= {"sim", "sim_without_latency",
                                                 "sim_easy_backfill", "sim_models"}
    assert doc["meta"]["backfill"] == "slurm"
    bad = CliRunner().invoke(cli, ["simulate", "--validate", str(SMALL), "--trace", "x.csv"])
    assert bad.exit_code == 2 and "--trace: not with --validate" in bad.output
    alone = CliRunner().invoke(cli, ["simulate", "--sim-only"])
    assert alone.exit_code == 2 and "go with --validate" in alone.output
    missing = CliRunner().invoke(cli, ["simulate", "--site", "x.toml"])
    assert missing.exit_code == 2 and "missing --trace, --trace-format, --params" \
        in missing.output


def test_progress_bar_is_silent_off_a_terminal() -> None:
    from hetslurm.cli.simulate_cmd import progress_bar

    with progress_bar() as bar:
        assert bar is None  # pytest's stderr is not a terminal




# --- the 1,000-job workload: two nodes, two priority classes, another Slurm release ----------

LARGE = ROOT / "site-configs" / "validate-workload-large.toml"


def test_the_large_workload_is_the_one_its_command_draws() -> None:
    from hetslurm.lab import validate_workload as g

    # The file's header names the command; the file is what it prints, unedited.
    assert "python -m hetslurm.lab.validate_workload --jobs 1000 --seed 1" in LARGE.read_text()
    assert LARGE.read_text() == g.render(g.draw(1000, 1), 1, g.SCHEDULER_PARAMETERS)
    assert g.draw(50, 1) == g.draw(1000, 1)[:50] and g.draw(50, 2) != g.draw(50, 1)


def test_the_large_workload_has_two_node_jobs_and_priorities_both_policies_replay() -> None:
    w, pl = _plan(LARGE)
    assert len(w.jobs) == 1000
    multi = [i for i, j in enumerate(w.jobs) if j.nodes > 1]
    high = [i for i, j in enumerate(w.jobs) if j.priority == "high"]
    assert len(multi) == 61 and len(high) == 152
    for p in v.POLICIES:
        assert all(pl.jobs[p][i].kr.nodes == 2 and pl.jobs[p][i].kr.gpus == 4 for i in multi)
        assert {pl.jobs[p][i].priority for i in high} == {0}  # high, before normal (1)
    assert pl.params.backfill_window_s == 60 and "bf_window=1" in w.scheduler_parameters
    assert pl.params.backfill_depth == 500 and "bf_max_job_test=500" in w.scheduler_parameters


def test_a_two_node_high_priority_job_submits_n_qos_or_het_words() -> None:
    from hetslurm.hook.explain import explain

    w, pl = _plan(LARGE)
    site, model = pl.site, ClusterModel.from_site(pl.site)
    i = next(i for i, j in enumerate(w.jobs) if j.nodes == 2 and j.priority == "high")
    plain = v.job_script("slurm-default", w.jobs[i], pl.jobs["slurm-default"][i],
                         pl.runtimes[i], site, model)
    assert "#SBATCH -N 2" in plain and "#SBATCH --gres=gpu:4" in plain
    assert "#SBATCH --qos=high" in plain and "#SBATCH -c 8" in plain
    het = v.job_script("hetslurm", w.jobs[i], pl.jobs["hetslurm"][i], pl.runtimes[i],
                       site, model)
    assert "#HET nodes=2 gpus=8 class=train priority=high" in het
    writes = dict(explain(het, site).writes)
    assert writes["qos"] == "high" and writes["min_nodes"] == 2
    assert writes["partition"] == "gpu_h100,gpu_a100"


def _write_large(tmp_path: Path, body: str, params: str | None = None) -> Path:
    return _write(tmp_path, body, LARGE, params)


def test_a_high_priority_job_starts_before_an_earlier_normal_one(tmp_path: Path) -> None:
    # Four 8-core CPU jobs fill the four CPU nodes (CPU jobs stay there under both
    # policies); the first ends at 0.4 + 20 s, the others at 30.4 s. N (normal) is queued
    # at 1 s, H (high) at 2 s: H takes the node freed at 20.4 s, N the next at 30.4 s.
    fill = "\n".join(f'{{ id = "f{k}", submit = 0, gpus = 0, cores = 8, runtime = {rt}, '
                     'limit_min = 1 },' for k, rt in enumerate((20, 30, 30, 30)))
    p = _write_large(tmp_path, fill + '\n'
                     '{ id = "n", submit = 1, gpus = 0, cores = 8, runtime = 10, limit_min = 1 },\n'
                     '{ id = "h", submit = 2, gpus = 0, cores = 8, runtime = 10, limit_min = 1, '
                     'priority = "high" }')
    w, pl = _plan(p)
    for policy in v.POLICIES:
        out = v.simulate_plan(w, pl, policy)
        assert out.start[-1] == pytest.approx(20.4) and out.start[-2] == pytest.approx(30.4)


@pytest.mark.parametrize(("job", "message"), [
    ('{ id = "a", submit = 0, class = "train", gpus = 6, nodes = 4, cores = 2, runtime = 5, '
     'limit_min = 1 }', "6 GPUs do not split evenly over 4 nodes"),
    ('{ id = "a", submit = 0, gpus = 0, nodes = 2, cores = 2, runtime = 5, limit_min = 1 }',
     "a CPU job runs on one node"),
    ('{ id = "a", submit = 0, gpus = 0, cores = 2, runtime = 5, limit_min = 1, '
     'priority = "urgent" }', "priority = 'urgent' is not one of high, normal"),
])
def test_bad_nodes_and_priorities_are_refused(tmp_path: Path, job: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        v.load_workload(_write_large(tmp_path, job))


def test_nodes_the_site_would_not_give_and_priorities_not_replayed_are_refused(
        tmp_path: Path) -> None:
    # 8 GPUs need two of the site's 4-GPU nodes; the file says one.
    w = v.load_workload(_write_large(tmp_path, '{ id = "a", submit = 0, class = "train", '
                                     'gpus = 8, cores = 2, runtime = 5, limit_min = 1 }'))
    with pytest.raises(ConfigError, match="names 1 nodes; the site holds its 8 GPUs on 2"):
        v.plan(w, load_site(w.site_file), load_params(w.params_file), v.POLICIES)
    # validate-params.toml maps no priority and slurm-default ignores it there.
    w = v.load_workload(_write_large(
        tmp_path, '{ id = "a", submit = 0, gpus = 0, cores = 2, runtime = 5, limit_min = 1, '
                  'priority = "high" }', "validate-params.toml"))
    with pytest.raises(ConfigError, match=r"priority high, which .* does not replay.*"
                                          r"off in slurm-default"):
        v.plan(w, load_site(w.site_file), load_params(w.params_file), v.POLICIES)


def test_cli_slurm_release_goes_with_a_testbed_run_only() -> None:
    both = CliRunner().invoke(cli, ["simulate", "--validate", str(SMALL), "--sim-only",
                                    "--slurm", "24.11"])
    assert both.exit_code == 2 and "--slurm: not with --sim-only" in both.output
    bad = CliRunner().invoke(cli, ["simulate", "--validate", str(SMALL), "--slurm", "23.02"])
    assert bad.exit_code == 2 and "Slurm 23.02 is not supported" in bad.output
    alone = CliRunner().invoke(cli, ["simulate", "--slurm", "24.11"])
    assert alone.exit_code == 2 and "go with --validate" in alone.output


def test_the_first_node_of_a_node_list_is_the_batch_host() -> None:
    assert v._first_node("gpu[3,5]") == "gpu3" and v._first_node("cpu2") == "cpu2"
    assert v._first_node("gpu[") is None
    site = load_site(ROOT / "site-configs" / "validate-site-large.toml")
    assert v._models(["gpu[3,5]", "gpu[7-8]", "cpu1"], site) == ["a100", "h100", "cpu"]


def test_the_large_check_replays_the_testbeds_clock_phase_and_reports_the_spread() -> None:
    # The 1,000-job check names cons_tres's will-run test; its batches align to the wall
    # clock's 30 s, so the simulator replays the testbed's phase (0 without a testbed)
    # and reports the figures at ten phases (how a phase moves a start:
    # test_simulate_validate_backfill.py).
    _w, pl = _plan(LARGE, 120)
    assert pl.params.will_run == "batched"
    assert v.clock_phase(1_765_000_024.96) == 4.96  # 1_765_000_020 is a multiple of 30
    res = v.validate(LARGE, policies=["slurm-default"], jobs=120, sim_only=True)
    entry = res.policies["slurm-default"]
    assert entry["sim_clock_phase_s"] == 0.0
    spread = entry["sim_clock_phases"]
    assert spread["phases_s"] == [3.0 * i for i in range(10)]
    for key in ("mean_wait_s", "makespan_s"):
        row = spread[key]
        assert len(row["per_phase"]) == 10
        assert row["min"] <= row["median"] <= row["max"]
        assert row["per_phase"][0] == entry["sim"][key]  # phase 0 is the replay's
