"""Faults on the testbed (issue 18): accounting down while the audit and rebalance run.
Each: nothing acted on, one clear line, the exit code of docs/cli.md."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetslurm.errors import PARTIAL_EXIT
from hetslurm.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


@pytest.fixture
def dbd_down(testbed: Testbed) -> Iterator[None]:
    testbed.stop_dbd()
    try:
        yield
    finally:
        testbed.start_dbd()


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
