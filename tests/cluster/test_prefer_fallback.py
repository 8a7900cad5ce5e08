"""How ``--prefer`` ranks GPU models and falls back on the testbed's Slurm release (issue 20;
measured by hand in docs/versions.md, kept here per release): the preferred model when it is
free; when it is full, the other model of the constraint — at once on 26.05, at the next
backfill pass (up to bf_interval, 30 s) on 22.05 and 24.11."""

from __future__ import annotations

import time

from _cluster_helpers import Jobs
from test_hook_cluster import A100, H100

from hetslurm.slurm import versions
from hetslurm.testbed import Testbed

#: One backfill interval (the testbed's default 30 s) and room for a slow machine.
BACKFILL_WAIT_S = 75.0
AT_ONCE_S = 10.0


def _prefer_a100(jobs: Jobs) -> str:
    return jobs.sbatch("-p", "gpu", "--gres=gpu:1", "--constraint=a100|h100", "--prefer=a100",
                       script="sleep 120")


def test_prefer_ranks_then_falls_back_as_the_release_does(jobs: Jobs, testbed: Testbed) -> None:
    release = versions.release(testbed.slurm_release)
    first = _prefer_a100(jobs)
    jobs.wait_state(first, {"RUNNING"}, timeout=60)
    assert jobs.field(first, "NodeList") in A100  # H100 has the lower weight: --prefer won
    jobs.cancel_all()
    jobs.ids.clear()
    fillers = [jobs.sbatch("-w", node, "-p", "gpu", "--gres=gpu:a100:8", script="sleep 300")
               for node in sorted(A100)]
    for f in fillers:
        jobs.wait_state(f, {"RUNNING"}, timeout=60)
    t0 = time.monotonic()
    job = _prefer_a100(jobs)
    jobs.wait_state(job, {"RUNNING"}, timeout=BACKFILL_WAIT_S)
    waited = time.monotonic() - t0
    assert jobs.field(job, "NodeList") in H100
    if release.prefer_falls_back_at_once:
        assert waited < AT_ONCE_S, f"Slurm {release.name}: fell back after {waited:.1f}s"
