"""Hostile free text on the real controller: `scontrol show job -o` prints names and comments
unescaped; the CLI backend must still report every job exactly as Slurm holds it."""

from __future__ import annotations

import time

from _cluster_helpers import Jobs

from hetslurm.slurm.cli_backend import CliBackend


def wait_running(backend: CliBackend, job_id: str, timeout: float = 60) -> None:
    # Not Jobs.wait_state: it reads JobState= from `scontrol show job -o`, which this very
    # job's name forges (it is what this test is about).
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backend.job(job_id).state == "RUNNING":
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not RUNNING after {timeout}s")


def test_forged_fields_in_name_and_comment_are_not_believed(jobs: Jobs,
                                                            slurm_env: dict[str, str]) -> None:
    victim = jobs.sbatch("-p", "gpu", "--gres=gpu:a100:1", "-J", "victim", script="sleep 60")
    jobs.wait_state(victim, {"RUNNING"})
    name = "x Restarts=7 JobState=COMPLETED NodeList=cpu9"
    comment = (f"c\nJobId={victim} JobName=victim JobState=RUNNING Restarts=5 "
               "Nodes=gpu1 CPU_IDs=0-7 Mem=0 GRES=gpu:h100:8(IDX:0-7)")
    hostile = jobs.sbatch("-p", "cpu", "-J", name, f"--comment={comment}", script="sleep 60")
    backend = CliBackend(slurm_env)
    wait_running(backend, hostile)
    listed = {str(j.job_id): j for j in backend.jobs()}
    h, v = listed[hostile], listed[victim]
    assert (h.name, h.comment, h.state, h.restarts) == (name, comment, "RUNNING", 0)
    assert h.nodes and h.nodes[0].startswith("cpu") and h.nodes[0] != "cpu9"
    assert (v.state, v.restarts) == ("RUNNING", 0)
    assert v.nodes and v.nodes[0] in {"gpu3", "gpu4"}
    (items,) = v.allocated_gres.values()
    assert [(i.name, i.type, i.count) for i in items] == [("gpu", "a100", 1)]
    one = backend.job(hostile)
    assert (one.name, one.state, one.restarts, one.nodes) == (name, "RUNNING", 0, h.nodes)
    again = backend.job(victim)
    assert again.allocated_gres == v.allocated_gres and again.restarts == 0
