"""Faults on the testbed (issue 18): accounting down while the audit and rebalance run, the
metric store's disk full under the collector. Each: nothing lost, nothing acted on, a clear
message, the exit code of docs/cli.md."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetslurm.errors import PARTIAL_EXIT
from hetslurm.metrics.fake_nvml import scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


@pytest.fixture
def dbd_down(testbed: Testbed) -> Iterator[None]:
    testbed.stop_daemon("slurmdbd")
    try:
        yield
    finally:
        testbed.start_daemon("slurmdbd")


def hetslurm(env: dict[str, str], *args: str, timeout: float = 300
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetslurm", *args], capture_output=True,
                          text=True, env=env, cwd="/tmp", timeout=timeout)


def test_audit_with_slurmdbd_down(slurm_env: dict[str, str], tmp_path: Path,
                                  dbd_down: None) -> None:
    """The report is printed (empty job tables), marked partial, the reason on stderr, and
    the exit status says "partial" (9), not success."""
    res = hetslurm(slurm_env, "audit", "--site", str(DEMO), "--store", str(tmp_path / "store"),
                   "--format", "json")
    assert res.returncode == PARTIAL_EXIT, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    assert "accounting unavailable" in res.stderr and "sacct" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["meta"]["partial"] is True


def test_rebalance_with_slurmdbd_down(slurm_env: dict[str, str], tmp_path: Path,
                                      testbed: Testbed, dbd_down: None) -> None:
    """--apply with accounting down: requeue-stalled and relax run from slurmctld, drift
    (which reads QOS from slurmdbd) cannot; nothing is acted on, the run says which phase
    failed and exits 9."""
    log = tmp_path / "actions.jsonl"
    res = hetslurm(slurm_env, "rebalance", "--site", str(DEMO), "--apply", "--format", "json",
                   "--store", str(tmp_path / "store"), "--log", str(log),
                   "--lock", str(tmp_path / "rebalance.lock"), "--testbed", str(testbed.root))
    assert res.returncode == PARTIAL_EXIT, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    assert any(p.startswith("drift:") and "sacctmgr" in p for p in doc["problems"]), doc
    acted = [r for r in doc.get("rows", []) if r.get("result") in ("requeued", "updated")]
    assert not acted
    # the lock was released: a second run takes it (and fails the same way)
    again = hetslurm(slurm_env, "rebalance", "--site", str(DEMO), "--apply", "--format",
                     "json", "--store", str(tmp_path / "store"), "--log", str(log),
                     "--lock", str(tmp_path / "rebalance.lock"), "--testbed", str(testbed.root))
    assert again.returncode == PARTIAL_EXIT and "another run holds" not in again.stderr


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 KiB tmpfs: the metric store's disk, full after a few segments."""
    mnt = tmp_path / "store"
    mnt.mkdir(mode=0o755)
    run_command(["mount", "-t", "tmpfs", "-o", "size=96k,mode=0755", "tmpfs", str(mnt)],
                timeout=30)
    try:
        yield mnt
    finally:
        run_command(["umount", str(mnt)], timeout=30, check=False)


def test_collector_with_the_store_disk_full(slurm_env: dict[str, str], testbed: Testbed,
                                            tmp_path: Path, small_disk: Path) -> None:
    """The store's disk fills while the collector runs: it keeps sampling (each failed
    segment's samples kept for the next flush), ends with one line naming what it could not
    write and exit 1 (MetricsError), and what it wrote before is intact and readable."""
    gres = load_gres_conf(testbed.etc / "gres.conf")
    devices = {n: [(int(m), d.model or "") for d in devs
                   if (m := device_minor(d.path)) is not None] for n, devs in gres.items()}
    scen = tmp_path / "scenario.json"
    scenario_for_devices(devices, seed=5, start=time.time()).save(scen)
    res = hetslurm(slurm_env, "collect", "--all-nodes", "--nvml", "fake", "--fake-scenario",
                   str(scen), "--store", str(small_disk), "--gres-conf",
                   str(testbed.etc / "gres.conf"), "--interval", "0.2", "--flush", "0.2",
                   "--ticks", "60", timeout=120)
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("hetslurm: error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "samples not written" in errors[0] and "No space left on device" in errors[0]
    assert "kept in memory for the next flush" in res.stderr
    frame, report = SegmentStore(small_disk).read()
    assert len(frame) > 0 and not report.partial
    assert not list(small_disk.rglob(".tmp-*"))
