"""``hetslurm bench accounting``: what ``jobacct_gather/linux`` costs slurmd, slurmstepd and
the controller, against ``jobacct_gather/none``, side by side in one run (issue 22, item 2).

A benchmark, not a test: it reports numbers and asserts nothing. For each setting it boots a
testbed of its own in a fresh temporary folder (the site with ``[accounting] gather`` set),
times ``submits`` held submissions in slurmctld (sdiag), then runs ``jobs`` one-core jobs of
``seconds`` each at once and adds up the CPU time of the testbed's slurmctld, slurmd and
slurmstepd processes over that run (read from /proc every half second; a slurmstepd's last
reading before it exits counts).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetslurm.site import load_site
from hetslurm.slurm import SUBMIT_BATCH_RPC
from hetslurm.testbed.cluster import SLURMCTLD, SLURMD, SLURMSTEPD, Testbed, default_site
from hetslurm.testbed.procs import marked_pids, proc_name

Log = Callable[[str], None]
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _run_setting(site_text: str, gather: str, *, jobs: int, seconds: int, submits: int,
                 slurm: str | None, log: Log) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="hsa-", dir="/tmp"))
    site_file = root / "site.toml"
    site_file.write_text(site_text + f'\n[accounting]\ngather = "{gather}"\n')
    tb = Testbed(root, slurm=slurm)
    out: dict[str, Any] = {"gather": gather}
    try:
        log(f"{gather}: booting a testbed in {root}")
        tb.up(site_file)
        b = tb.slurm()
        b.reset_controller_stats()
        held = [b.submit_batch(args=["--hold", "-o", "/dev/null"], wrap="true").job_id
                for _ in range(submits)]
        rpc = b.controller_stats().rpcs.get(SUBMIT_BATCH_RPC)
        out["ctld_submit_avg_us"] = rpc.mean_us if rpc else None
        b.cancel_jobs(held)
        mark = str(root)
        before = {p: _cpu_s(p) for p in marked_pids(mark)}
        log(f"{gather}: {jobs} jobs of {seconds} s")
        ids = [b.submit_batch(args=["-p", "cpu", "-c", "1", "-o", "/dev/null"],
                              wrap=f"sleep {seconds}").job_id for _ in range(jobs)]
        last: dict[int, tuple[str, float]] = {}
        deadline = time.monotonic() + seconds + 120
        while time.monotonic() < deadline:
            for p in marked_pids(mark):
                c = _cpu_s(p)
                if c is not None:
                    last[p] = (proc_name(p), c)
            if not b.queued_ids(ids):
                break
            time.sleep(0.5)
        per: dict[str, float] = {}
        for p, (name, c) in last.items():
            group = next((g for g in (SLURMSTEPD, SLURMCTLD, SLURMD) if name.startswith(g)), "")
            if group:
                per[group] = per.get(group, 0.0) + c - (before.get(p) or 0.0)
        out.update({f"{k}_cpu_s": round(v, 3) for k, v in sorted(per.items())})
        out["jobs"] = jobs
    finally:
        if tb.running().get(SLURMCTLD) or tb.running().get("munged"):
            tb.down()
        shutil.rmtree(root, ignore_errors=True)
    return out


def bench_accounting(site_path: str | None = None, *, jobs: int = 16, seconds: int = 65,
                     submits: int = 200, slurm: str | None = None,
                     log: Log = lambda _m: None) -> dict[str, Any]:
    """Both settings, one after the other; the ratios are linux / none."""
    site_file = Path(site_path) if site_path else default_site()
    load_site(site_file)  # a bad site fails before any testbed boots
    text = site_file.read_text()
    if "\n[accounting]" in "\n" + text:
        raise ValueError(f"{site_file} has its own [accounting]; the benchmark sets it")
    rows = [_run_setting(text, g, jobs=jobs, seconds=seconds, submits=submits, slurm=slurm,
                         log=log) for g in ("none", "linux")]
    none, linux = rows
    ratios = {k: round(linux[k] / none[k], 3) for k in linux
              if k.endswith(("_us", "_cpu_s")) and isinstance(none.get(k), (int, float))
              and none[k]}
    return {"rows": rows, "ratio_linux_vs_none": ratios, "seconds": seconds,
            "submits": submits, "slurm": slurm or "host"}
