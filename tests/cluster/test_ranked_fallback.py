"""Ranked fallback, enforced by Slurm (issue 22 item 1, docs/fallback.md), on the testbed's
release: the demo site's classes rank the GPU models in opposite orders (inference: A100 then
H100; train: H100 then A100) and the node weights can serve only one of them. The hook submits
each job to the per-model partitions of its partition in its own order, so:

* on an idle cluster each class lands on its first model, job after job;
* 24 one-GPU inference jobs at once take the 16 A100 GPUs and then 8 H100 GPUs, started by
  the scheduling Slurm runs on submission, well inside one ``sched_interval`` (the testbed
  keeps Slurm's default, 60 s; no backfill pass needed);
* with every GPU busy a job waits in all of its partitions and takes whichever model frees
  first, while a ``wait-for=first`` job waits for its first model only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from _cluster_helpers import Jobs
from test_hook_cluster import A100, DEMO_FILE, H100, running_on, sbatch, show

from hetslurm.process import run_command

#: Slurm's default sched_interval (the testbed sets none): the bound the issue names.
SCHED_INTERVAL_S = 60.0


def _script(het: str, seconds: int) -> str:
    return f"#!/bin/bash\n#HET {het}\nsleep {seconds}\n"


def _submit(jobs: Jobs, tmp_path: Path, het: str, seconds: int = 300) -> str:
    job_id, _ = sbatch(jobs, tmp_path, _script(het, seconds), "-o", "/dev/null")
    assert job_id is not None
    return job_id


def _wait_done(jobs: Jobs, job_id: str) -> None:
    jobs.wait_state(job_id, {"COMPLETED"}, timeout=60)


def _explained_node(tmp_path: Path, env: dict[str, str], het: str) -> str:
    """The node ``hetslurm explain --state live`` predicts for a one-node request."""
    script = tmp_path / "explain.sh"
    script.write_text(_script(het, 0))
    # cwd away from the checkout (a fresh clone's tree has no compiled core).
    out = run_command([sys.executable, "-m", "hetslurm", "explain", str(script), "--site",
                       str(DEMO_FILE), "--state", "live", "--format", "json"], timeout=120,
                      env={**os.environ, **env}, cwd=tmp_path).stdout
    doc = json.loads(out)
    assert doc["placement"] and doc["placement"]["placeable"], doc.get("placement_note")
    (node,) = doc["placement"]["nodes"]
    return str(node)


@pytest.mark.parametrize(("wclass", "first"), [("inference", A100), ("train", H100)])
def test_each_class_gets_its_first_model_job_after_job(jobs: Jobs, tmp_path: Path,
                                                       slurm_env: dict[str, str],
                                                       wclass: str, first: set[str]) -> None:
    """20 jobs, each submitted after the previous one ended: all on the class's first
    model, although the site's node weights put H100 first for everyone; and the node
    `explain` predicts on the idle testbed is the one Slurm picks (item 6)."""
    predicted = _explained_node(tmp_path, slurm_env, f"class={wclass} gpus=1")
    for i in range(20):
        job = _submit(jobs, tmp_path, f"class={wclass} gpus=1", seconds=0)
        nodes = running_on(jobs, job)
        assert nodes <= first, (wclass, job, nodes)
        if i == 0:
            assert nodes == {predicted}, (predicted, nodes)
        _wait_done(jobs, job)
        fields = show(jobs, job)
        assert fields["Partition"] == ("gpu_a100" if first == A100 else "gpu_h100")


def test_24_inference_jobs_fill_a100_then_h100_and_full_cluster_falls_back(
        jobs: Jobs, tmp_path: Path) -> None:
    t0 = time.monotonic()
    ids = [_submit(jobs, tmp_path, "class=inference gpus=1") for _ in range(24)]
    submitted = time.monotonic()
    deadline = submitted + SCHED_INTERVAL_S
    nodes: dict[str, str] = {}
    while time.monotonic() < deadline and len(nodes) < len(ids):
        for j in ids:
            if j not in nodes and show(jobs, j)["JobState"] == "RUNNING":
                nodes[j] = show(jobs, j)["NodeList"]
        time.sleep(0.5)
    started = time.monotonic() - submitted
    assert len(nodes) == 24, f"{len(nodes)}/24 running {started:.1f}s after submission"
    on_a100 = [j for j, n in nodes.items() if n in A100]
    on_h100 = [j for j, n in nodes.items() if n in H100]
    assert (len(on_a100), len(on_h100)) == (16, 8), nodes
    # The first 16 submitted (the queue's order) took the A100s.
    assert set(on_a100) == set(ids[:16])
    print(f"24 jobs: 16 A100 + 8 H100, all running {started:.1f}s after the last submission "
          f"({submitted - t0:.1f}s to submit; sched_interval {SCHED_INTERVAL_S:.0f}s)")

    # Fill the last 8 H100 GPUs: every GPU of the gpu partition is busy now.
    fill = [_submit(jobs, tmp_path, "class=train gpus=1") for _ in range(8)]
    for j in fill:
        jobs.wait_state(j, {"RUNNING"}, timeout=SCHED_INTERVAL_S)
    # wait-for=first waits for an A100 only; the plain job takes whichever model frees first.
    patient = _submit(jobs, tmp_path, "class=inference gpus=1 wait-for=first")
    plain = _submit(jobs, tmp_path, "class=inference gpus=1")
    assert show(jobs, patient)["Partition"] == "gpu_a100"
    assert show(jobs, plain)["Partition"] == "gpu_a100,gpu_h100"
    time.sleep(2)
    assert show(jobs, patient)["JobState"] == "PENDING"
    assert show(jobs, plain)["JobState"] == "PENDING"

    jobs_cancel(jobs, fill[0])  # an H100 frees first
    jobs.wait_state(plain, {"RUNNING"}, timeout=SCHED_INTERVAL_S)
    assert show(jobs, plain)["NodeList"] in H100
    assert show(jobs, plain)["Partition"] == "gpu_h100"
    time.sleep(2)
    assert show(jobs, patient)["JobState"] == "PENDING"

    jobs_cancel(jobs, on_a100[0])  # then an A100
    jobs.wait_state(patient, {"RUNNING"}, timeout=SCHED_INTERVAL_S)
    assert show(jobs, patient)["NodeList"] in A100
    jobs.cancel_all()
    # Accounting keeps the partition each ran in.
    assert jobs.sacct(plain, "Partition")["Partition"] == "gpu_h100"
    assert jobs.sacct(patient, "Partition")["Partition"] == "gpu_a100"


def jobs_cancel(jobs: Jobs, job_id: str) -> None:
    run_command(["scancel", job_id], timeout=30, env=jobs.env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if show(jobs, job_id)["JobState"] not in ("RUNNING", "COMPLETING"):
            return
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} did not end after scancel")


def test_naming_a_per_model_partition_is_refused(jobs: Jobs, tmp_path: Path) -> None:
    job, err = sbatch(jobs, tmp_path, "#!/bin/bash\nsleep 1\n", "-p", "gpu_a100", check=False)
    assert job is None
    assert "gpu_a100" in err and "ranked fallback" in err and "-p gpu" in err
