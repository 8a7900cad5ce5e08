"""The shipped cron line and systemd units for ``hetslurm rebalance`` parse, and the command
they run is one the CLI accepts."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

from hetslurm.cli.rebalance_cmd import rebalance

CONFIGS = Path(__file__).resolve().parents[2] / "site-configs"


def _args_accepted(argv: list[str]) -> None:
    assert argv[0].endswith("/hetslurm") and argv[1] == "rebalance", argv
    ctx = rebalance.make_context("rebalance", argv[2:])
    assert ctx.params["apply_"] is True


def test_cron_line() -> None:
    lines = [ln for ln in (CONFIGS / "hetslurm-rebalance.cron").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    env = [ln for ln in lines if "=" in ln.split()[0]]
    jobs = [ln for ln in lines if ln not in env]
    assert len(jobs) == 1
    fields = jobs[0].split(None, 6)
    minute, hour, dom, month, dow, user, command = fields
    assert (minute, hour, dom, month, dow, user) == ("*/5", "*", "*", "*", "*", "root")
    words = shlex.split(command.split(">")[0])
    assert words[:2] == ["timeout", "280"]
    _args_accepted(words[2:])
    assert any(ln.startswith("HETSLURM_SITE=/") for ln in env)


def test_systemd_units() -> None:
    service = configparser.ConfigParser(strict=True, interpolation=None)
    service.optionxform = str  # type: ignore[assignment,method-assign]
    service.read_string((CONFIGS / "hetslurm-rebalance.service").read_text())
    assert service["Service"]["Type"] == "oneshot"
    _args_accepted(shlex.split(service["Service"]["ExecStart"]))
    assert int(service["Service"]["TimeoutStartSec"]) < 300
    timer = configparser.ConfigParser(strict=True, interpolation=None)
    timer.optionxform = str  # type: ignore[assignment,method-assign]
    timer.read_string((CONFIGS / "hetslurm-rebalance.timer").read_text())
    assert timer["Timer"]["OnUnitInactiveSec"] == "5min"
    assert timer["Install"]["WantedBy"] == "timers.target"
