"""How ``--prefer`` ranks GPU models and falls back on the testbed's Slurm release (issue 20;
measured by hand in docs/versions.md, kept here per release): the preferred model when it is
free; when it is full, the other model of the constraint — at once on 26.05, at the next
backfill pass (up to bf_interval, 30 s) on 22.05 and 24.11."""

from __future__ import annotations

import time

from _cluster_helpers import Jobs
from test_hook_cluster import A100, H100

from hetslurm.process import run_command
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


def test_overlapping_model_partitions_follow_the_order_and_fall_back_at_once(
        jobs: Jobs, testbed: Testbed) -> None:
    """One submission to two partitions, one per GPU model on the same nodes as `gpu`, equal
    PriorityTier: the order in -p decides while both are free, and with the first one's
    nodes full the job starts in the second at once (no backfill wait) — on every release
    measured (22.05, 24.11, 26.05; docs/versions.md)."""
    env = jobs.env

    def scontrol(*args: str) -> None:
        run_command(["scontrol", *args], timeout=30, env=env, check=False)

    parts = {"inf_a100": "gpu[3-4]", "inf_h100": "gpu[1-2]"}
    try:
        for name, nodes in parts.items():
            scontrol("create", f"PartitionName={name}", f"Nodes={nodes}", "PriorityTier=1",
                     "State=UP")
        first = jobs.sbatch("-p", "inf_a100,inf_h100", "--gres=gpu:1", script="sleep 120")
        jobs.wait_state(first, {"RUNNING"}, timeout=30)
        assert jobs.field(first, "NodeList") in A100
        jobs.cancel_all()
        jobs.ids.clear()
        for node in sorted(A100):
            jobs.wait_state(jobs.sbatch("-w", node, "-p", "gpu", "--gres=gpu:a100:8",
                                        script="sleep 300"), {"RUNNING"}, timeout=60)
        t0 = time.monotonic()
        job = jobs.sbatch("-p", "inf_a100,inf_h100", "--gres=gpu:1", script="sleep 120")
        jobs.wait_state(job, {"RUNNING"}, timeout=AT_ONCE_S)
        assert time.monotonic() - t0 < AT_ONCE_S
        assert jobs.field(job, "NodeList") in H100
    finally:
        jobs.cancel_all()
        jobs.ids.clear()
        for name in parts:
            scontrol("delete", f"PartitionName={name}")
