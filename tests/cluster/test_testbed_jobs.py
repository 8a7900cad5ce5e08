"""Jobs on the real testbed land where the rendered configuration says they should."""

from __future__ import annotations

from _cluster_helpers import Jobs, nodes_with

from hetslurm.site import Site
from hetslurm.slurm.units import expand_hostlist


def test_typed_gpu_job_runs_on_its_model_and_sacct_shows_typed_gres(
    jobs: Jobs, demo_site: Site
) -> None:
    a100_nodes = nodes_with(demo_site, lambda n: bool(n.gpus) and n.gpus[0].model == "a100")
    job = jobs.sbatch("--gres=gpu:a100:2", script="sleep 2")
    jobs.wait_state(job, {"COMPLETED"})
    rec = jobs.sacct(job, "NodeList,AllocTRES,State")
    assert rec["NodeList"] in a100_nodes
    assert "gres/gpu:a100=2" in rec["AllocTRES"].split(",")


def test_fpga_job_lands_on_the_fpga_node(jobs: Jobs, demo_site: Site) -> None:
    fpga_nodes = nodes_with(demo_site, lambda n: bool(n.fpgas))
    job = jobs.sbatch("--gres=fpga:u280:1")
    jobs.wait_state(job, {"RUNNING"})
    assert set(expand_hostlist(jobs.field(job, "NodeList"))) <= fpga_nodes
    rec = jobs.sacct(job, "NodeList,AllocTRES")
    assert "gres/fpga:u280=1" in rec["AllocTRES"].split(",")


def test_cpu_job_fills_cpu_only_nodes_first(jobs: Jobs, demo_site: Site) -> None:
    # Rendered weights: CPU-only nodes weigh least, so a job that needs no device and may
    # run anywhere (partition batch = ALL) starts on a CPU-only node.
    cpu_nodes = nodes_with(demo_site, lambda n: not n.gpus and not n.fpgas)
    job = jobs.sbatch("-p", "batch", "-c", "2")
    jobs.wait_state(job, {"RUNNING"})
    assert jobs.field(job, "NodeList") in cpu_nodes


def test_or_of_models_falls_back_in_the_site_order(jobs: Jobs, demo_site: Site) -> None:
    # SLURM-TESTBED.md: with features "h100|a100" and lower Weight on h100 nodes, whole-node
    # GPU jobs fill the h100 nodes first and then go to a100 nodes at once (no waiting).
    h100 = nodes_with(demo_site, lambda n: bool(n.gpus) and n.gpus[0].model == "h100")
    a100 = nodes_with(demo_site, lambda n: bool(n.gpus) and n.gpus[0].model == "a100")
    ids = [jobs.sbatch("--gres=gpu:8", "-C", "h100|a100", "-c", "1") for _ in range(4)]
    for job in ids:
        jobs.wait_state(job, {"RUNNING"})
    placed = [jobs.field(job, "NodeList") for job in ids]
    assert set(placed[:2]) == h100
    assert set(placed[2:]) == a100
