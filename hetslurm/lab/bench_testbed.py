"""``hetslurm bench testbed``: how fast the local cluster boots, stops and takes jobs.

A benchmark, not a test: it reports numbers (JSON) and asserts nothing. It runs its own
testbed in a fresh temporary state folder, so a developer's running testbed is untouched.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from hetslurm.process import run_command
from hetslurm.site import load_site
from hetslurm.testbed.cluster import Testbed, default_site
from hetslurm.testbed.procs import marked_pids

_SDIAG_SUBMIT = re.compile(r"REQUEST_SUBMIT_BATCH_JOB\s*\(\s*\d+\)\s*count:(\d+)\s*ave_time:(\d+)")


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
        env = tb.env()
        run_command(["sdiag", "-r"], timeout=30, env=env)
        t0 = time.perf_counter()
        for _ in range(jobs):
            # Held jobs: the controller's submit path is measured, not job execution.
            run_command(["sbatch", "--hold", "--parsable", "-o", "/dev/null",
                         "--wrap", "true"], timeout=60, env=env)
        wall = time.perf_counter() - t0
        results["sbatch_per_s"] = round(jobs / wall, 1)
        sdiag = run_command(["sdiag"], timeout=30, env=env).stdout
        m = _SDIAG_SUBMIT.search(sdiag)
        results["ctld_submit_count"] = int(m.group(1)) if m else None
        results["ctld_submit_avg_us"] = int(m.group(2)) if m else None
        down1 = tb.down()
        results["down_s"] = down1["seconds"]
        results["left_running_after_down"] = len(marked_pids(str(root)))
        warm = tb.up(site_file)
        results["up_warm_s"] = round(warm.seconds, 3)
        down2 = tb.down()
        results["down_warm_s"] = down2["seconds"]
        results["left_running_after_down_warm"] = len(marked_pids(str(root)))
    finally:
        if tb.running().get("slurmctld") or tb.running().get("munged"):
            tb.down()
        if not keep_dir:
            shutil.rmtree(root, ignore_errors=True)
    return results
