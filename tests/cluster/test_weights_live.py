"""Measured load moves node weights on the testbed (issue 23, "Done when", first item).

gpu1 and gpu2 are the demo's two H100 nodes, equal to Slurm (Weight=100), and Slurm picks
gpu1 first. The fake NVML says gpu1's GPUs are 95% busy; a collector writes that to a store;
`hetslurm rebalance --apply --only weights` moves gpu1 to 105 (the top of the H100 band,
under the A100s' 110), and the next four one-GPU H100 jobs run on gpu2. A `site apply` that
reconfigures resets gpu1 to 100 (and says so); the next run writes 105 again. After
`testbed fake gpu1 clear` and the hold time, gpu1 returns to 100. `scontrol show node` shows
each step.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml
from hetslurm.metrics.gres import load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.slurm import get_backend
from hetslurm.testbed import Testbed

HOLD_S = 20
WINDOW_S = 30


def _cli(args: list[str], env: dict[str, str]) -> Any:
    res = CliRunner().invoke(cli, args, env=env)
    assert res.exit_code == 0, res.output
    return res


def _weight(env: dict[str, str], node: str) -> int:
    out = run_command(["scontrol", "show", "node", "-o", node], timeout=30, env=env).stdout
    m = re.search(r"\bWeight=(\d+)", out)
    assert m, out
    return int(m.group(1))


def _collect(testbed: Testbed, env: dict[str, str], store: Path, ticks: int) -> None:
    gres = load_gres_conf(testbed.etc / "gres.conf")
    coll = Collector(sorted(gres), FakeNvml(testbed.fake_scenario),
                     get_backend("cli", env=env), gres, SegmentStore(store),
                     interval_s=1.0, flush_s=1.0)
    coll.run(ticks=ticks)


def _rebalance(site: Path, store: Path, log: Path, lock: Path, env: dict[str, str]
               ) -> dict[str, Any]:
    res = _cli(["rebalance", "--site", str(site), "--apply", "--only", "weights",
                "--store", str(store), "--log", str(log), "--lock", str(lock),
                "--format", "json"], env)
    return dict(json.loads(res.stdout))


def test_busy_node_goes_behind_its_twin_and_comes_back(jobs: Jobs, testbed: Testbed,
                                                       cli_env: dict[str, str],
                                                       slurm_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    site_file = Path(testbed.existing_state().site)
    text = site_file.read_text()
    # The session's site with a short hold (and a window the test's samples fill).
    site = tmp_path / "site.toml"
    site.write_text(text + f"\n[weights]\nband = 5\nwindow_s = {WINDOW_S}\n"
                    f"hold_s = {HOLD_S}\nmin_samples = 3\nstale_s = 30\n")
    store, log, lock = tmp_path / "store", tmp_path / "actions.jsonl", tmp_path / "rb.lock"
    env = {**cli_env, "HETSLURM_TESTBED_DIR": str(testbed.root)}
    assert _weight(slurm_env, "gpu1") == _weight(slurm_env, "gpu2") == 100
    try:
        _cli(["testbed", "fake", "--dir", str(testbed.root), "gpu1", "util=95"], env)
        _collect(testbed, slurm_env, store, ticks=5)
        doc = _rebalance(site, store, log, lock, env)
        dec = {d["node"]: d for d in doc["weights"]["decisions"]}
        assert dec["gpu1"]["action"] == "set" and dec["gpu1"]["target"] == 105, dec["gpu1"]
        assert dec["gpu2"]["action"] == "keep" and dec["gpu3"]["target"] == 110
        assert _weight(slurm_env, "gpu1") == 105 and _weight(slurm_env, "gpu2") == 100

        # The next four one-GPU H100 jobs go to the idle twin.
        ids = [jobs.sbatch("--gres=gpu:h100:1", "-p", "gpu", script="sleep 30")
               for _ in range(4)]
        for j in ids:
            jobs.wait_state(j, {"RUNNING"})
        where = {run_command(["squeue", "-h", "-o", "%N", "-j", j], timeout=30,
                             env=slurm_env).stdout.strip() for j in ids}
        assert where == {"gpu2"}, where
        jobs.cancel_all()

        # A site apply that reconfigures resets the weight, says so; the next run re-asserts.
        changed = tmp_path / "changed.toml"
        changed.write_text(text.replace('nodes = "fpga1"\nmax_time = "1-00:00:00"',
                                        'nodes = "fpga1"\nmax_time = "02:00:00"'))
        assert changed.read_text() != text
        res = _cli(["site", "apply", str(changed), "--testbed", str(testbed.root),
                    "--format", "json"], env)
        try:
            applied = json.loads(res.stdout)
            assert applied["applied"] and applied["action"] == "reconfigure", applied
            assert any("gpu1 105 -> 100" in n for n in applied["notes"]), applied["notes"]
            assert _weight(slurm_env, "gpu1") == 100
            _collect(testbed, slurm_env, store, ticks=2)
            doc = _rebalance(site, store, log, lock, env)
            dec = {d["node"]: d for d in doc["weights"]["decisions"]}
            assert dec["gpu1"]["action"] == "reassert", dec["gpu1"]
            assert _weight(slurm_env, "gpu1") == 105
        finally:
            _cli(["site", "rollback", "--testbed", str(testbed.root), "--format", "json"],
                 env)

        # The load goes away: once the busy samples have left the window and the hold has
        # passed, gpu1 is back at 100.
        _cli(["testbed", "fake", "--dir", str(testbed.root), "gpu1", "clear"], env)
        cleared = time.time()
        first = next(e for e in _entries(log) if e.get("action") == "set")
        wait = max(first["t"] + HOLD_S, cleared + WINDOW_S) - time.time()
        if wait > 0:
            time.sleep(wait + 0.5)
        _collect(testbed, slurm_env, store, ticks=4)
        doc = _rebalance(site, store, log, lock, env)
        dec = {d["node"]: d for d in doc["weights"]["decisions"]}
        assert dec["gpu1"]["action"] == "set" and dec["gpu1"]["target"] == 100, dec["gpu1"]
        assert _weight(slurm_env, "gpu1") == 100
    finally:
        # Whatever happened, the session testbed leaves with its own weights.
        for node in ("gpu1", "gpu2"):
            run_command(["scontrol", "update", f"NodeName={node}", "Weight=100"], timeout=30,
                        env=slurm_env)
        _cli(["testbed", "fake", "--dir", str(testbed.root), "gpu1", "clear"], env)


def _entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()
            and json.loads(line).get("source") == "weights"]
