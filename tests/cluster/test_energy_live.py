"""Measured energy on the testbed (issue 23 item 4): the audit's energy per unit of work and
`hetslurm advise` proposing the measured cheaper model for `energy=low`.

The demo site says `energy_low_models = ["a100"]`, with speeds H100 = sqrt(3 x 2) = 2.449 x
A100. Three 2-GPU jobs run on an H100 node and three on an A100 node; `testbed fake` makes
their GPUs draw 300 W (H100) and 250 W (A100), and the other GPUs of those nodes' classes
idle at 60 W and 50 W. Per unit of work the H100 then costs 300 / 2.449 = 122.5 Wh per
A100-hour against the A100's 250: the audit's `energy_per_work` shows it, `advise` proposes
`energy_low_models = ["h100"]` and the measured watts, each labelled measured. The testbed's
Slurm gathers no energy (no AcctGatherEnergyType; Debian ships no gpu_nvml), so the audit
says there is nothing to reconcile.
"""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path
from typing import Any

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.audit.energy import NO_SLURM_ENERGY
from hetslurm.cli import cli
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml
from hetslurm.metrics.gres import load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.site import load_site
from hetslurm.slurm import get_backend
from hetslurm.testbed import Testbed

SLEEP_S = 30
BUSY_W = {"gpu1": 300.0, "gpu3": 250.0}
IDLE_W = {"gpu1": 60.0, "gpu2": 60.0, "gpu3": 50.0, "gpu4": 50.0}
MODEL = {"gpu1": "h100", "gpu3": "a100"}
H100_SPEED = 6.0 ** 0.5  # the demo's geometric mean of train 3.0 and inference 2.0


def _cli(args: list[str], env: dict[str, str]) -> Any:
    res = CliRunner().invoke(cli, args, env=env)
    assert res.exit_code == 0, res.output
    return res


def _wait_queue_empty(env: dict[str, str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not run_command(["squeue", "-h", "-o", "%i"], timeout=30, env=env).stdout.split():
            return
        time.sleep(0.5)
    raise AssertionError(f"jobs still queued {timeout}s into the test")


def test_energy_per_work_and_advise_energy_low(jobs: Jobs, testbed: Testbed,
                                               cli_env: dict[str, str],
                                               slurm_env: dict[str, str],
                                               tmp_path: Path) -> None:
    site_file = Path(testbed.existing_state().site)
    env = {**cli_env, "HETSLURM_TESTBED_DIR": str(testbed.root)}
    fake = ["testbed", "fake", "--dir", str(testbed.root)]
    store = tmp_path / "store"
    # The window opens after every earlier test's jobs have ended: sacct's -S is whole
    # seconds, so a job that ended a second before this test (the previous test's, cancelled
    # at its teardown) would count among this window's GPU jobs.
    _wait_queue_empty(slurm_env)
    time.sleep(2.1)
    t_submit = time.time() - 1
    try:
        for node, watts in IDLE_W.items():
            _cli([*fake, node, "util=0", f"power_w={watts:g}"], env)
        # Job names differ by model: no recurring job links them, so advise learns no speeds
        # and the demo's stand.
        ids = {node: [jobs.sbatch("-J", f"energy-{node}", f"--gres=gpu:{MODEL[node]}:2",
                                  "-w", node, script=f"sleep {SLEEP_S}") for _ in range(3)]
               for node in BUSY_W}
        backend = get_backend("cli", env=slurm_env)
        for node, js in ids.items():
            for j in js:
                jobs.wait_state(j, {"RUNNING"})
                held = [i for key, idx in backend.job(int(j)).gres_on(node).items()
                        if key[0] == "gpu" for i in idx]
                assert len(held) == 2, held
                for i in held:
                    _cli([*fake, f"{node}/{i}", "util=90", f"power_w={BUSY_W[node]:g}"], env)
        gres = load_gres_conf(testbed.etc / "gres.conf")
        Collector(sorted(gres), FakeNvml(testbed.fake_scenario), backend, gres,
                  SegmentStore(store), interval_s=1.0, flush_s=5.0).run(duration_s=SLEEP_S + 2)
        for js in ids.values():
            for j in js:
                jobs.wait_state(j, {"COMPLETED"}, timeout=90)
                jobs.sacct(j, "State")  # slurmdbd has the record
    finally:
        for node in IDLE_W:
            _cli([*fake, node, "clear"], env)
    until = str(time.time() + 1)

    res = _cli(["audit", "--site", str(site_file), "--since", str(t_submit), "--until", until,
                "--store", str(store), "--format", "json"], env)
    doc = json.loads(res.stdout)
    work = {r["gpu_model"]: r for r in doc["energy_per_work"] if r["class"] == "*"}
    assert abs(work["h100"]["wh_per_ref_gpu_hour"] - 300.0 / H100_SPEED) <= 0.02 * 122.5, work
    assert abs(work["a100"]["wh_per_ref_gpu_hour"] - 250.0) <= 0.02 * 250.0, work
    assert work["h100"]["reference"] == "a100" and work["h100"]["jobs"] == 3
    rec = doc["meta"]["energy_reconciliation"]
    assert rec["jobs_with_slurm_energy"] == 0 and rec["note"] == NO_SLURM_ENERGY

    out = tmp_path / "proposed.toml"
    res = _cli(["advise", "--site", str(site_file), "--since", str(t_submit), "--until", until,
                "--store", str(store), "--no-scripts", "--out", str(out), "--format", "json"],
               env)
    adv = json.loads(res.stdout)["energy"]
    assert adv["energy_low_models"]["current"] == ["a100"]
    assert adv["energy_low_models"]["proposed"] == ["h100"], adv
    watts = {w["model"]: w for w in adv["watts"]}
    assert watts["h100"]["source"] == watts["a100"]["source"] == "measured"
    assert (watts["h100"]["busy_w"], watts["h100"]["idle_w"]) == (300.0, 60.0)
    assert (watts["a100"]["busy_w"], watts["a100"]["idle_w"]) == (250.0, 50.0)
    assert "energy: h100 watts busy 300 W, idle 60 W (measured; site file: 700 W, 70 W)" \
        in res.stderr
    proposed = tomllib.loads(out.read_text())
    assert proposed["hook"]["energy_low_models"] == ["h100"]
    assert proposed["node_classes"]["h100x8"]["gpus"]["power_busy_watts"] == 300.0
    assert load_site(out).sections["hook"].energy_low_models == ("h100",)
