"""hetslurm status: counting rules, the recorded cluster, and the thin command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli.status_cmd import status
from hetslurm.lab.fake_slurm import FakeSlurm, load_recorded
from hetslurm.slurm.backend import NodeInfo, NodeStateChange
from hetslurm.status import ClusterStatus, cluster_status, summarize

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
A100 = ("gpu", "a100")


def gpu_node(name: str, state: set[str], used: int = 0) -> NodeInfo:
    return NodeInfo(
        name,
        frozenset(state),
        cpus_total=8,
        cpus_alloc=used,
        memory_total_mib=1000,
        memory_alloc_mib=100 * used,
        gres_total={A100: 4},
        gres_used={A100: used} if used else {},
    )


def a100(s: ClusterStatus) -> tuple[int, int, int, int]:
    (row,) = s.gpus
    return row.total, row.allocated, row.free, row.unavailable


@pytest.mark.parametrize(
    ("state", "used", "expected"),
    [
        ({"IDLE"}, 0, (4, 0, 4, 0)),
        ({"MIXED"}, 1, (4, 1, 3, 0)),
        # Idle but drained: nothing free, all unavailable.
        ({"IDLE", "DRAIN"}, 0, (4, 0, 0, 4)),
        # Draining: allocated stays allocated, the rest is unavailable.
        ({"MIXED", "DRAIN"}, 3, (4, 3, 0, 1)),
        ({"DOWN"}, 0, (4, 0, 0, 4)),
        ({"IDLE", "NOT_RESPONDING"}, 0, (4, 0, 0, 4)),
        ({"MIXED", "RESERVED", "MAINTENANCE"}, 2, (4, 2, 0, 2)),
        ({"ALLOCATED"}, 4, (4, 4, 0, 0)),
    ],
)
def test_counting_rules(state: set[str], used: int, expected: tuple[int, ...]) -> None:
    assert a100(summarize([gpu_node("g", state, used)])) == expected


def test_recorded_cluster() -> None:
    s = cluster_status(load_recorded(DATA))
    rows = {(d.resource, d.model): d for d in s.devices}
    a, h, f = rows[("gpu", "a100")], rows[("gpu", "h100")], rows[("fpga", "u280")]
    # gpu1 is MIXED+DRAIN with 2 of 4 a100 in use.
    assert (a.total, a.allocated, a.free, a.unavailable) == (4, 2, 0, 2)
    assert (h.total, h.allocated, h.free, h.unavailable) == (4, 4, 0, 0)
    # fpga1 sits in an active maintenance reservation.
    assert (f.total, f.allocated, f.free, f.unavailable) == (2, 1, 0, 1)
    assert s.nodes_by_state == {
        "cpu": {"allocated": 1, "mixed": 1},
        "fpga": {"reserved": 1},
        "gpu": {"draining": 1, "mixed": 1},
    }
    assert s.cores.total == 28 and s.cores.allocated == 4 + 1 + 1 + 1 + 3
    assert s.memory.total == 56000 and s.memory.unit == "MiB"
    for row in (*s.devices, s.cores, s.memory):
        assert row.total == row.allocated + row.free + row.unavailable


def test_status_follows_the_fake_through_a_drain() -> None:
    fake = FakeSlurm(nodes=[gpu_node("g1", {"IDLE"}), gpu_node("g2", {"IDLE"})])
    fake.submit("sleep", ["--gres=gpu:a100:1"])
    assert a100(cluster_status(fake)) == (8, 1, 7, 0)
    fake.update_node("g2", NodeStateChange.DRAIN, reason="test")
    assert a100(cluster_status(fake)) == (8, 1, 3, 4)


def test_cli_json_and_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hetslurm.cli.status_cmd.get_backend",
                        lambda *a, **k: load_recorded(DATA))
    runner = CliRunner()
    res = runner.invoke(status, ["--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert [g["model"] for g in doc["gpus"]] == ["a100", "h100"]
    assert doc["gpus"][0]["unavailable"] == 2
    assert doc["fpgas"][0]["model"] == "u280"
    assert doc["nodes_by_state"]["gpu"]["draining"] == 1
    table = runner.invoke(status, [])
    assert table.exit_code == 0 and "a100" in table.output and "unavailable" in table.output
    csv = runner.invoke(status, ["--format", "csv"])
    assert csv.output.splitlines()[0].startswith("resource,model,unit,total")


def test_status_registered_on_the_main_cli() -> None:
    from hetslurm.cli import cli

    assert "status" in cli.commands
