"""`hetslurm place --state live` on the real testbed (issue 4, "Done when").

Loaded with running jobs, place must never offer a GPU a running job holds; a job submitted
with place's node list and gres starts on those nodes and keeps the in-node locality place
predicted (one NVLink island, NUMA-local cores) in >= 95 % of 50 mixed submissions.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.lab.validate_placement import held_gpus, run_sequence, start_load
from hetslurm.placement import ClusterModel, LiveState
from hetslurm.request.language import parse_request, resolve
from hetslurm.site import Site
from hetslurm.slurm import get_backend

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


def _place(env: dict[str, str], *args: str) -> dict[str, object]:
    res = CliRunner(env={"SLURM_CONF": env["SLURM_CONF"], "PATH": env["PATH"]}).invoke(
        cli, ["place", "--site", str(DEMO), "--format", "json", *args])
    assert res.exit_code == 0, res.output
    doc: dict[str, object] = json.loads(res.stdout)
    return doc


def _track(jobs: Jobs, ids: list[int]) -> None:
    jobs.ids.extend(str(i) for i in ids if str(i) not in jobs.ids)


def test_place_live_never_offers_held_gpus(slurm_env: dict[str, str], jobs: Jobs,
                                           tmp_path: Path) -> None:
    backend = get_backend("cli", env=slurm_env)
    ids: list[int] = []
    try:
        start_load(backend, ids)
    finally:
        _track(jobs, ids)
    held = held_gpus(backend)
    assert held, "the load jobs hold GPUs"
    for text in ("gpus=1", "gpus=2 gpu-type=h100", "gpus=4 gpu-type=a100 locality=nvlink",
                 "gpus=5 gpu-type=h100|a100", "gpus=7"):
        doc = _place(slurm_env, "--request", text, "--state", "live")
        assert doc["placeable"], doc["reason"]
        nodes = doc["nodes"]
        assert isinstance(nodes, dict)
        for name, node in nodes.items():
            assert not set(node["gpus"]) & set(held.get(name, ())), (text, name, node, held)
    # 8 h100 GPUs: gpu1 and gpu2 each have a load job, so busy now, not impossible.
    busy = _place(slurm_env, "--request", "gpus=8 gpu-type=h100", "--state", "live")
    assert busy["placeable"] is False and busy["status"] == "busy"
    assert busy["blocking"] == "gpu_free" and busy["earliest_start"] is not None
    # The dump read back answers the same as live.
    dump = tmp_path / "state.json"
    res = CliRunner(env={"SLURM_CONF": slurm_env["SLURM_CONF"], "PATH": slurm_env["PATH"]}).invoke(
        cli, ["state", "dump", "--out", str(dump)])
    assert res.exit_code == 0, res.output
    state = LiveState.from_json(dump.read_text())
    assert {n.name for n in state.nodes} >= {"gpu1", "gpu2", "gpu3", "gpu4", "fpga1"}
    # Exact cores: every running job carries its CPU ids from scontrol -d.
    assert all(j.cpu_ids is not None for n in state.nodes for j in n.jobs)
    live = _place(slurm_env, "--request", "gpus=2 gpu-type=a100", "--state", "live")
    again = _place(slurm_env, "--request", "gpus=2 gpu-type=a100", "--state", str(dump))
    assert live["nodes"] == again["nodes"]


def test_place_locality_kept_in_scripted_sequence(slurm_env: dict[str, str], jobs: Jobs,
                                                  demo_site: Site) -> None:
    backend = get_backend("cli", env=slurm_env)
    model = ClusterModel.from_site(demo_site)
    ids: list[int] = []
    try:
        start_load(backend, ids)
        report = run_sequence(
            model, backend, lambda t: resolve(parse_request(t), demo_site), n=50, seed=4,
            durations_s=(10, 45), log=print, submitted=ids,
        )
    finally:
        _track(jobs, ids)
    doc = report.to_dict()
    print(json.dumps({k: v for k, v in doc.items() if k not in ("inexact",)}, indent=1))
    out = os.environ.get("HETSLURM_PLACE_REPORT")
    if out:
        Path(out).write_text(json.dumps(doc, indent=1))
    assert report.submitted == 50
    assert report.offered_held_gpu == 0
    assert report.same_nodes == 50, [c.miss() for c in report.checks if not c.same_nodes]
    assert report.locality_rate >= 0.95, doc["misses"]
