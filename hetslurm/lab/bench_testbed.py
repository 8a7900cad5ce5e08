"""``hetslurm bench testbed``: how fast the local cluster boots, stops and takes jobs.

A benchmark, not a test: it reports numbers (JSON) and asserts nothing. It runs its own
testbed in a fresh temporary state folder, so a developer's running testbed is untouched.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hetslurm.site import load_site
from hetslurm.slurm import SUBMIT_BATCH_RPC
from hetslurm.testbed.cluster import SLURMCTLD, Testbed, default_site
from hetslurm.testbed.procs import marked_pids


def bench_testbed(site_path: str | None = None, jobs: int = 200,
                  keep_dir: bool = False) -> dict[str, Any]:
    """Boot a fresh testbed twice, submit ``jobs`` held batch jobs, and time everything."""
    site_file = Path(site_path) if site_path else default_site()
    site = load_site(site_file)
    root = Path(tempfile.mkdtemp(prefix="hsb-", dir="/tmp"))
    tb = Testbed(root)
    results: dict[str, Any] = {"site": str(site_file), "nodes": len(site.nodes), "jobs": jobs}
    try:
        cold = tb.up(site_file)
        results["up_cold_s"] = round(cold.seconds, 3)  # includes MariaDB initialisation
        slurm = tb.slurm()
        slurm.reset_controller_stats()
        t0 = time.perf_counter()
        for _ in range(jobs):
            # Held jobs: the controller's submit path is measured, not job execution.
            slurm.submit_batch(args=["--hold", "-o", "/dev/null"], wrap="true")
        wall = time.perf_counter() - t0
        results["sbatch_per_s"] = round(jobs / wall, 1)
        submits = slurm.controller_stats().rpcs.get(SUBMIT_BATCH_RPC)
        results["ctld_submit_count"] = submits.count if submits else None
        results["ctld_submit_avg_us"] = submits.mean_us if submits else None
        down1 = tb.down()
        results["down_s"] = down1["seconds"]
        results["left_running_after_down"] = len(marked_pids(str(root)))
        warm = tb.up(site_file)
        results["up_warm_s"] = round(warm.seconds, 3)
        down2 = tb.down()
        results["down_warm_s"] = down2["seconds"]
        results["left_running_after_down_warm"] = len(marked_pids(str(root)))
    finally:
        if tb.running().get(SLURMCTLD) or tb.running().get("munged"):
            tb.down()
        if not keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    return results
