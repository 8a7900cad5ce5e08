"""The simulator against the real Slurm: the committed small workload
(site-configs/validate-workload-small.toml, 40 jobs) replayed on a testbed of its own under
both policies and in the simulator, mean wait and makespan within the workload's target
(docs/simulate.md, "Fidelity"). About 3 minutes; the full 100-job check is the documented
`hetslurm simulate --validate` command."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hetslurm.lab.validate_simulate import POLICIES, validate
from hetslurm.testbed.procs import marked_pids

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "site-configs" / "validate-workload-small.toml"


def test_small_workload_simulated_within_target_of_the_testbed() -> None:
    if os.geteuid() != 0:
        raise AssertionError("cluster tests need root (the testbed starts Slurm daemons)")
    root = Path(f"/tmp/hsvt{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    try:
        res = validate(SMALL, testbed_dir=root)
    finally:
        left = marked_pids(str(root))
        shutil.rmtree(root, ignore_errors=True)
    assert left == [], f"testbed processes left running: {left}"
    assert {(r["policy"], r["measure"]) for r in res.rows} == {
        (p, m) for p in POLICIES for m in ("mean_wait_s", "makespan_s")}
    for p in POLICIES:
        bed = res.policies[p]["testbed"]
        assert bed["jobs"] == 40
        # The queue contended: jobs waited, so the comparison is about something.
        assert bed["mean_wait_s"] > 3, bed
    assert res.passed, res.rows
