"""Classification from evidence on the real testbed (issue 22 item 4, "Done when").

Three runs of one job (same user and job name, ``#HET gpus=1``, no ``class=``) hold a GPU
that the fake NVML reports at 0 % the whole time; the collector attributes the samples to
their job ids. ``hetslurm learn classes`` (real sacct, the store) proposes the site's CPU
class ``io`` for that job; the proposal becomes the site's ``[classify]`` section and the
hook is installed with it. A new submission of the same job is then

* ``suggest``: told on sbatch's stderr which class the hook would use and why, recorded in
  AdminComment (``"infer":"io","how":"suggest"``), its GPU request left as it was;
* ``apply``: moved to the CPU class: partition ``cpu``, feature ``cpu``, no GPU, recorded
  (``"class":"io"``, ``"how":"apply"``), and told.

A job of another name, and a hostile job name that no rule holds, are left alone.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.slurm import get_backend
from hetslurm.testbed import Testbed

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
NAME = f"prep-classify-{os.getpid()}"
RUN_S = 12
SCRIPT = f"#!/bin/sh\n#HET gpus=1\nsleep {RUN_S}\n"


def install(site_file: Path, testbed: Testbed, jobs: Jobs) -> None:
    run_command([sys.executable, "-m", "hetslurm", "hook", "install", "--site",
                 str(site_file), "--dir", str(testbed.etc)], timeout=120, env=jobs.env)
    # slurmctld reloads job_submit.lua at the next submission after the file changed.
    time.sleep(1.1)
    jobs.sbatch("--hold", "-p", "cpu", script="true")


@pytest.fixture
def hook_restored(testbed: Testbed, jobs: Jobs) -> Iterator[None]:
    yield
    install(DEMO, testbed, jobs)


def submit(jobs: Jobs, script: str, name: str) -> tuple[str, str]:
    """sbatch the script (from stdin) under ``name``: the job id and sbatch's stderr."""
    res = run_command(["sbatch", "--parsable", "-o", "/dev/null", "-J", name], timeout=60,
                      env=jobs.env, input=script)
    job_id = res.stdout.strip().split(";")[0]
    jobs.ids.append(job_id)
    return job_id, res.stderr


def show(jobs: Jobs, job_id: str) -> str:
    return run_command(["scontrol", "show", "job", job_id], timeout=30, env=jobs.env).stdout


def field(text: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    assert m, (key, text)
    return m.group(1)


def record(text: str) -> dict[str, object]:
    m = re.search(r"AdminComment=.*?hetslurm:(\{[^}]*\})", text)
    assert m, text
    return dict(json.loads(m.group(1)))


def test_a_job_that_never_used_its_gpu_is_told_then_moved(
        jobs: Jobs, slurm_env: dict[str, str], cli_env: dict[str, str], testbed: Testbed,
        tmp_path: Path, hook_restored: None) -> None:
    gres = load_gres_conf(testbed.etc / "gres.conf")
    devices = {n: [(int(m), d.model or "") for d in devs
                   if (m := device_minor(d.path)) is not None] for n, devs in gres.items()}
    scenario = scenario_for_devices(devices, seed=5, start=time.time())
    for node, devs in devices.items():
        for minor, _ in devs:  # every GPU idle: the runs never use theirs
            scenario.set_gpu(node, minor, utilization=0.0, memory_used_mib=0.0)
    scen_path = tmp_path / "scenario.json"
    scenario.save(scen_path)

    # 1. History: three runs holding a GPU they never use, sampled by the collector.
    t0 = time.time() - 2
    first = [submit(jobs, SCRIPT, NAME)[0] for _ in range(3)]
    for j in first:
        jobs.wait_state(j, {"RUNNING"}, timeout=90)
        assert jobs.field(j, "TresPerNode").endswith("gpu:1")
    store = SegmentStore(tmp_path / "store")
    coll = Collector(sorted(gres), FakeNvml(scen_path), get_backend("cli", env=slurm_env),
                     gres, store, interval_s=1.0, flush_s=4.0)
    coll.run(duration_s=RUN_S - 2)
    for j in first:
        jobs.wait_state(j, {"COMPLETED"}, timeout=90)
        jobs.sacct(j, "State,End")  # slurmdbd has the end
    samples, _ = store.read()
    for j in first:
        mine = samples[samples["job_id"] == int(j)]
        assert len(mine) > 0 and (mine["utilization_pct"].dropna() == 0).all(), j

    # 2. learn classes proposes the CPU class for this job, from sacct and the store.
    out = tmp_path / "classify.toml"
    res = CliRunner().invoke(cli, ["learn", "classes", "--site", str(DEMO), "--since",
                                   str(t0), "--store", str(store.root), "--format", "json",
                                   "--out", str(out)], env=cli_env)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {(r["user"], r["name"]): r for r in doc["rows"]}
    user = run_command(["id", "-un"], timeout=10).stdout.strip()
    row = rows[(user, NAME)]
    assert row["class"] == "io" and row["idle_runs"] == 3 and row["used_runs"] == 0, row
    assert out.exists() and f'name = "{NAME}"' in out.read_text()

    # Too few runs: the same command with --min-jobs 4 proposes nothing and writes nothing.
    none_out = tmp_path / "none.toml"
    res = CliRunner().invoke(cli, ["learn", "classes", "--site", str(DEMO), "--since",
                                   str(t0), "--store", str(store.root), "--min-jobs", "4",
                                   "--out", str(none_out)], env=cli_env)
    assert res.exit_code == 0 and "no rule proposed" in res.stderr and not none_out.exists()

    # 3. suggest: told and recorded, nothing else changed.
    proposal = out.read_text()
    site = tmp_path / "site.toml"
    site.write_text(DEMO.read_text() + "\n" + proposal)
    install(site, testbed, jobs)
    job, err = submit(jobs, SCRIPT, NAME)
    assert "class=io suggested from this job's history" in err, err
    text = show(jobs, job)
    rec = record(text)
    assert rec["infer"] == "io" and rec["how"] == "suggest" and "class" not in rec, rec
    assert field(text, "TresPerNode").endswith("gpu:1") and field(text, "Partition") != "cpu"
    print("suggest:", err.strip(), "|", rec)
    # Another name, and a hostile one, are not classified.
    for other in ("another-job", "x;$(touch /tmp/hetslurm-classify-x)\"}]]"):
        j, e = submit(jobs, SCRIPT, other)
        assert "suggested" not in e and '"infer"' not in show(jobs, j)
    assert not Path("/tmp/hetslurm-classify-x").exists()

    # 4. apply: moved to the CPU class, visibly.
    site.write_text(DEMO.read_text() + "\n" + proposal.replace('mode = "suggest"',
                                                               'mode = "apply"'))
    install(site, testbed, jobs)
    job, err = submit(jobs, SCRIPT, NAME)
    assert "class=io applied from this job's history" in err and "gpus=1" in err, err
    text = show(jobs, job)
    rec = record(text)
    assert rec["class"] == "io" and rec["how"] == "apply" and rec["infer"] == "io", rec
    assert field(text, "Partition") == "cpu" and field(text, "Features") == "cpu"
    assert "gpu" not in (re.search(r"TresPerNode=(\S*)", text) or ["", ""])[1]
    jobs.wait_state(job, {"RUNNING", "COMPLETED"}, timeout=90)
    assert re.match(r"cpu\d", jobs.field(job, "NodeList")), jobs.field(job, "NodeList")
    print("apply:", err.strip(), "|", rec)
