"""up / update / down / up again, on a testbed of its own (not the session one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetslurm.process import run_command
from hetslurm.testbed import Testbed
from hetslurm.testbed.procs import marked_pids, proc_name

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"


def _show(tb: Testbed, kind: str, name: str) -> str:
    return run_command(["scontrol", "show", kind, "-o", name], timeout=30, env=tb.env()).stdout


def test_up_is_idempotent_updates_in_place_and_down_leaves_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root")
    # A short state path: munge's and MariaDB's unix sockets live under it.
    root = Path(f"/tmp/hst-{os.getpid()}")
    site = tmp_path / "site.toml"
    text = DEMO.read_text()
    site.write_text(text)
    tb = Testbed(root)
    try:
        first = tb.up(site)
        assert first.action == "started"
        assert first.nodes == 9
        daemons = {n: tb.load_state().procs[n]["pid"] for n in tb.running()}  # type: ignore[union-attr]
        assert {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd:gpu1"} <= set(daemons)

        again = tb.up(site)
        assert again.action == "already-up"
        assert {n: tb.load_state().procs[n]["pid"] for n in tb.running()} == daemons  # type: ignore[union-attr]

        # A partition change only needs `scontrol reconfigure`.
        site.write_text(text.replace('nodes = "fpga1"\nmax_time = "1-00:00:00"',
                                     'nodes = "fpga1"\nmax_time = "02:00:00"'))
        assert tb.up(site).action == "reconfigured"
        assert "MaxTime=02:00:00" in _show(tb, "partition", "fpga")

        # A node's memory changes: slurmd must restart (a new feature alone applies on
        # scontrol reconfigure, hetslurm.levers.rollout).
        site.write_text(site.read_text().replace(
            "[node_classes.cpu8]\nsockets = 2",
            '[node_classes.cpu8]\nfeatures = ["ssd"]\nsockets = 2',
        ).replace('memory = "16G"\npower_idle_watts = 100',
                  'memory = "15G"\npower_idle_watts = 100'))
        res = tb.up(site)
        assert res.action == "restarted"
        assert "AvailableFeatures=cpu,ssd" in _show(tb, "node", "cpu1")

        down = tb.down()
        assert "slurmctld" in down["stopped"] and "mariadbd" in down["stopped"]
        left = [(p, proc_name(p)) for p in marked_pids(str(root))]
        assert left == []
        assert tb.running() == {}

        # A second up after down works (database and state kept).
        assert tb.up(site).action == "started"
        assert set(tb.node_states().values()) == {"idle"}
    finally:
        tb.down()
        assert marked_pids(str(root)) == []
