"""`hetslurm place` and `hetslurm state dump` through the command line, without Slurm.

States come from files in the hetslurm-state/1 schema or the fake backend (recorded 22.05
output); bad input must end in one clear line and the documented exit code, or in a
"cannot place" answer that names the reason.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from hetslurm.cli import cli
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.lab.validate_placement import compare
from hetslurm.placement import ClusterModel, LiveState, NodeState, RunningJob, place
from hetslurm.placement.enact import slurm_args
from hetslurm.request.language import Request
from hetslurm.site import load_site
from hetslurm.slurm import GresItem, JobInfo, NodeInfo

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
RECORDING = ROOT / "tests" / "data" / "slurm"


def run(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner(env=env).invoke(cli, list(args))


def place_json(*args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    res = run("place", "--site", str(DEMO), "--format", "json", *args, env=env)
    assert res.exit_code == 0, res.output
    doc: dict[str, object] = json.loads(res.stdout)
    return doc


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    """gpu1: GPUs 0-2 held (island 0 has one free); gpu2 drained; gpu3 GPU 4 held."""
    live = LiveState(
        time=1000.0,
        nodes=(
            NodeState("gpu1", gpus_used=(0, 1, 2), cpus_alloc=3, mem_alloc_mib=3072,
                      jobs=(RunningJob("1", 4600.0, gpus=(0, 1, 2), cpu_ids=(0, 1, 2)),)),
            NodeState("gpu2", available=False, flags=("DRAIN", "IDLE")),
            NodeState("gpu3", gpus_used=(4,), cpus_alloc=1, mem_alloc_mib=1024,
                      jobs=(RunningJob("2", 2000.0, gpus=(4,), cpu_ids=(4,)),)),
            NodeState("gpu4"), NodeState("fpga1"),
            *(NodeState(f"cpu{i}") for i in range(1, 5)),
        ),
        source="test",
    )
    path = tmp_path / "state.json"
    path.write_text(live.to_json())
    return path


# --- answers ----------------------------------------------------------------------------------


def test_json_has_the_documented_keys(state_file: Path) -> None:
    doc = place_json("--request", "gpus=1 gpu-type=h100", "--state", str(state_file))
    assert {"placeable", "nodelist", "nodes", "score", "reason", "terms", "weighted",
            "impossible", "blocking", "earliest_start", "sbatch_args"} <= set(doc)
    # Best fit: the one free GPU of gpu1's used island, with a core on its socket.
    assert doc["placeable"] is True and doc["nodelist"] == "gpu1"
    nodes = doc["nodes"]
    assert isinstance(nodes, dict) and list(nodes) == ["gpu1"]
    gpu1 = nodes["gpu1"]
    assert (gpu1["gpus"], gpu1["fpgas"], gpu1["cores"]) == ([3], [], [3])
    assert (gpu1["gpu_model"], gpu1["fpga_model"]) == ("h100", None)
    # Score = weighted terms: 4 GPUs left free x 100 + node weight 100.
    assert gpu1["terms"]["leftover"] == 4 and doc["score"] == gpu1["score"] == 500
    assert doc["sbatch_args"] == ["-w", "gpu1", "-N", "1", "--ntasks-per-node=1",
                                  "--cpus-per-task=1", "--gpus=h100:1",
                                  "--gres-flags=enforce-binding"]


def test_table_names_nodes_devices_score_and_why(state_file: Path) -> None:
    res = run("place", "--site", str(DEMO), "--request", "gpus=4 gpu-type=a100 cores=2",
              "--state", str(state_file))
    assert res.exit_code == 0, res.output
    out = res.stdout
    # Both a100 nodes have a whole free island; leftover counts the node's free GPUs after
    # placing, so gpu3 (GPU 4 held: 3 left) beats gpu4 (4 left).
    assert "placeable:  yes, on gpu3" in out
    assert "gpus 0,1,2,3 (a100)" in out and "cores 0,1" in out
    assert "score:" in out and "why:" in out and "sbatch:" in out


def test_multi_node_nodelist_is_a_hostlist() -> None:
    doc = place_json("--request", "nodes=2 gpus=16 gpu-type=a100", "--state", "empty")
    assert doc["nodelist"] == "gpu[3-4]"
    assert doc["terms"]["switch"] == 0  # type: ignore[index]


def test_busy_names_the_constraint_and_earliest_start(state_file: Path) -> None:
    doc = place_json("--request", "gpus=8 gpu-type=h100", "--state", str(state_file))
    assert doc["placeable"] is False and doc["impossible"] is False
    assert doc["status"] == "busy" and doc["blocking"] == "gpu_free"
    assert "busy now" in str(doc["reason"])
    assert doc["earliest_start"] == 4600.0 and doc["sbatch_args"] is None
    res = run("place", "--site", str(DEMO), "--request", "gpus=8 gpu-type=h100",
              "--state", str(state_file))
    assert res.exit_code == 0
    assert "placeable:  no (busy)" in res.stdout and "earliest:" in res.stdout


def test_impossible_names_the_constraint() -> None:
    doc = place_json("--request", "gpus=8 locality=nvlink:required", "--state", "empty")
    assert doc["placeable"] is False and doc["impossible"] is True
    assert doc["blocking"] == "nvlink" and "impossible on this cluster" in str(doc["reason"])


def test_state_from_fake_backend_is_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """--state live reads the backend get_backend('auto') returns; here a fake one."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    fake = FakeSlurm(
        nodes=[NodeInfo(n, frozenset({"IDLE"}), cpus_total=8, memory_total_mib=16384)
               for n in ("gpu2", "gpu3", "gpu4", "fpga1")]
        + [NodeInfo("gpu1", frozenset({"MIXED"}), cpus_total=8, cpus_alloc=2,
                    memory_total_mib=16384, memory_alloc_mib=2048,
                    gres_used_indices={("gpu", "h100"): (4, 5)})],
        jobs=[JobInfo(9, state="RUNNING", nodes=("gpu1",), start_time=start, time_limit=60,
                      allocated_gres={"gpu1": (GresItem("gpu", "h100", 2, (4, 5)),)},
                      cpu_ids={"gpu1": (4, 5)})],
    )
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: fake)
    doc = place_json("--request", "gpus=2 gpu-type=h100", "--state", "live")
    # Island {4-7} keeps two free GPUs: best fit takes them, cores on that socket and not
    # the ones the job holds (exact CPU ids).
    assert doc["nodes"]["gpu1"]["gpus"] == [6, 7]  # type: ignore[index]
    assert doc["nodes"]["gpu1"]["cores"] == [6]  # type: ignore[index]
    res = run("state", "dump", env=None)
    assert res.exit_code == 0, res.output
    dumped = LiveState.from_json(res.stdout)
    assert dumped.node("gpu1").jobs[0].cpu_ids == (4, 5)
    assert dumped.node("gpu1").gpus_used == (4, 5)


def test_exact_cores_from_cpu_ids() -> None:
    site = load_site(DEMO)
    model = ClusterModel.from_site(site)
    live = LiveState(0.0, (NodeState("gpu1", gpus_used=(0,), cpus_alloc=2,
                                     jobs=(RunningJob("1", None, gpus=(0,), cpu_ids=(5, 6)),)),))
    m = model.with_state(live)
    ca = int(m.core_offsets[0])
    assert m.state.core_free[ca:ca + 8].tolist() == [1, 1, 1, 1, 1, 0, 0, 1]


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus=-1", "gpus=-1"),
        ("gpus=4294967294", "4294967294"),
        ("gpus=18446744073709551615", "18446744073709551615"),
        ("gpus=1000000", "1000000"),
        ("gpus=60000", "at most 64 per node"),
        ("cores=0", "cores=0"),
        ("nodes=0", "nodes=0"),
        ("gpus=1 gpu-type=b200", "b200"),
        ("gpus=1 gpu-type=h10", "did you mean 'h100'"),
        ("fpga=u250:1", "u250"),
        ("gpus=3 nodes=2", "split evenly"),
        ("gpus=two", "gpus"),
    ],
)
def test_bad_requests_are_one_line_exit_5(text: str, needle: str) -> None:
    res = run("place", "--site", str(DEMO), "--request", text, "--state", "empty")
    assert res.exit_code == 5, res.output
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetslurm: error:") and needle in lines[0]


@pytest.mark.parametrize(
    ("text", "blocking"),
    [
        ("gpus=0 fpga=u280:3", "fpga_count"),
        ("gpus=64", "gpu_count"),
        ("gpus=9", "gpu_count"),
        ("nodes=5 gpus-per-node=8", "nodes"),
        ("nodes=65536", "nodes"),
        ("cores=16384", "cores"),
        ("gpus=1 mem=1T", "memory"),
    ],
)
def test_too_big_is_cannot_place_with_reason(text: str, blocking: str) -> None:
    doc = place_json("--request", text, "--state", "empty")
    assert doc["placeable"] is False and doc["impossible"] is True
    assert doc["blocking"] == blocking and "impossible" in str(doc["reason"])


def test_zero_gpus_is_a_cpu_request() -> None:
    doc = place_json("--request", "gpus=0 cores=2", "--state", "empty")
    assert doc["placeable"] is True and str(doc["nodelist"]).startswith("cpu")


def test_empty_cluster_state_is_busy_everywhere(tmp_path: Path) -> None:
    """A state that lists no node: Slurm knows none of the site's nodes, none is usable."""
    path = tmp_path / "empty.json"
    path.write_text(LiveState(time=5.0).to_json())
    doc = place_json("--request", "gpus=1", "--state", str(path))
    assert doc["placeable"] is False and doc["blocking"] == "unavailable"


def test_empty_cluster_model_cannot_place() -> None:
    empty = ClusterModel.from_layouts([])
    got = place(empty, Request(gpus_per_node=1))
    assert not got.placeable and got.impossible and "no nodes" in got.reason


@pytest.mark.parametrize(
    ("content", "exit_code", "needle"),
    [
        ("not json", 5, "not JSON"),
        ('{"schema": "other/1"}', 5, "other/1"),
        ('{"nodes": [{"name": "gpu1", "gpus_used": [-1]}]}', 5, "gpus_used"),
        ('{"nodes": [{"name": "gpu1", "gpus_used": [9]}]}', 5, "no GPU index 9"),
        ('{"nodes": [{"name": "gpu1", "colour": 1}]}', 5, "colour"),
    ],
)
def test_bad_state_files(tmp_path: Path, content: str, exit_code: int, needle: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    res = run("place", "--site", str(DEMO), "--request", "gpus=1", "--state", str(path))
    assert res.exit_code == exit_code, res.output
    assert needle in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_missing_state_file_and_bad_site(tmp_path: Path) -> None:
    res = run("place", "--site", str(DEMO), "--request", "gpus=1", "--state",
              str(tmp_path / "nope.json"))
    assert res.exit_code == 2 and "cannot read state file" in res.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 1\nname = 'x'\n[nodez]\n")
    res = run("place", "--site", str(bad), "--request", "gpus=1", "--state", "empty")
    assert res.exit_code == 2 and res.stderr.startswith("hetslurm: error:")


def test_live_without_slurm_is_a_backend_error(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm commands to find
    res = run("place", "--site", str(DEMO), "--request", "gpus=1", "--state", "live")
    assert res.exit_code == 4, res.output
    assert len(res.stderr.strip().splitlines()) == 1


# --- enactment and comparison -----------------------------------------------------------------


def test_slurm_args_and_compare() -> None:
    site = load_site(DEMO)
    model = ClusterModel.from_site(site)
    req = Request(nodes=2, gpus_per_node=2, gpu_models=("h100", "a100"), cores_per_node=2,
                  mem_per_node_mib=2048)
    p = place(model, req)
    assert slurm_args(model, req, p) == [
        "-w", "gpu[1-2]", "-N", "2", "--ntasks-per-node=1", "--cpus-per-task=2",
        "--gres=gpu:h100:2", "--gres-flags=enforce-binding", "--mem=2048M"]
    same = compare(model, p, "7", ("gpu1", "gpu2"), {"gpu1": (0, 1), "gpu2": (0, 1)},
                   {"gpu1": (0, 1), "gpu2": (0, 1)})
    assert same.locality_kept and same.exact and not same.offered_held_gpu
    # Other indices in one island, cores on its socket: locality kept, not exact.
    moved = compare(model, p, "7", ("gpu1", "gpu2"), {"gpu1": (4, 5), "gpu2": (0, 1)},
                    {"gpu1": (4, 5), "gpu2": (0, 1)})
    assert moved.locality_kept and not moved.exact
    # Split over islands and sockets: a miss, explained.
    split = compare(model, p, "7", ("gpu1", "gpu2"), {"gpu1": (3, 4), "gpu2": (0, 1)},
                    {"gpu1": (0, 1), "gpu2": (0, 1)}, held={"gpu1": (1,)})
    assert not split.locality_kept and "2 island(s)" in split.miss()
    assert split.offered_held_gpu
    with pytest.raises(ValueError, match="placeable"):
        slurm_args(model, req, place(model, Request(gpus_per_node=9)))
    one = Request(gpus_per_node=2, fpgas_per_node=0, cores_per_node=3)
    assert slurm_args(model, one, place(model, one))[-3:] == [
        "--cpus-per-task=3", "--gpus=h100:2", "--gres-flags=enforce-binding"]
    fpga = Request(fpgas_per_node=1, cores_per_node=2)
    assert slurm_args(model, fpga, place(model, fpga))[-2:] == [
        "--cpus-per-task=2", "--gres=fpga:u280:1"]
