"""`hetslurm status --format json` agrees with counts derived from `scontrol show node -d`."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterator

import pytest
from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.process import run_command

# States in which Slurm starts no new work on a node (see hetslurm/status.py).
_UNAVAILABLE = ("DRAIN", "DOWN", "NOT_RESPONDING", "FAIL", "RESERVED", "MAINTENANCE",
                "POWERED_DOWN", "FUTURE", "INVALID_REG", "REBOOT")


def _independent_counts(env: dict[str, str]) -> dict[tuple[str, str], dict[str, int]]:
    """Per (gres, model): total/allocated/free/unavailable, parsed here from scontrol text."""
    out = run_command(["scontrol", "show", "node", "-d", "-o"], timeout=30, env=env).stdout
    counts: dict[tuple[str, str], dict[str, int]] = defaultdict(
        lambda: {"total": 0, "allocated": 0, "free": 0, "unavailable": 0})
    for line in out.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        state = fields["State"]
        used: dict[tuple[str, str], int] = {}
        for m in re.finditer(r"(\w+):(\w+):(\d+)", fields.get("GresUsed", "")):
            used[(m.group(1), m.group(2))] = int(m.group(3))
        for m in re.finditer(r"(\w+):(\w+):(\d+)", fields.get("Gres", "")):
            key = (m.group(1), m.group(2))
            total = int(m.group(3))
            alloc = used.get(key, 0)
            c = counts[key]
            c["total"] += total
            c["allocated"] += alloc
            if any(flag in state for flag in _UNAVAILABLE):
                c["unavailable"] += total - alloc
            else:
                c["free"] += total - alloc
    return dict(counts)


def _status_json(env: dict[str, str]) -> dict[tuple[str, str], dict[str, int]]:
    res = CliRunner().invoke(cli, ["status", "--format", "json", "--backend", "cli"],
                             env={"SLURM_CONF": env["SLURM_CONF"], "PATH": env["PATH"]})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    return {(r["resource"], r["model"]): {k: r[k] for k in ("total", "allocated", "free",
                                                              "unavailable")}
            for r in (*doc["gpus"], *doc["fpgas"])}


@pytest.fixture
def drained(slurm_env: dict[str, str]) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for node in names:
        run_command(["scontrol", "update", f"NodeName={node}", "State=RESUME"], timeout=30,
                    env=slurm_env)


def test_status_matches_scontrol_while_jobs_run_and_after_a_drain(
    jobs: Jobs, slurm_env: dict[str, str], drained: list[str]
) -> None:
    ids = [jobs.sbatch("--gres=gpu:h100:3"), jobs.sbatch("--gres=gpu:a100:2"),
           jobs.sbatch("--gres=fpga:u280:1")]
    for job in ids:
        jobs.wait_state(job, {"RUNNING"})
    busy = _status_json(slurm_env)
    assert busy == _independent_counts(slurm_env)
    assert busy[("gpu", "h100")]["allocated"] == 3
    assert busy[("gpu", "a100")]["allocated"] == 2
    assert busy[("fpga", "u280")]["allocated"] == 1

    # Drain the node running the a100 job: its other GPUs become unavailable, the job's
    # stay allocated; an idle node drained makes all of its GPUs unavailable.
    a100_node = jobs.field(ids[1], "NodeList")
    idle_a100 = {"gpu3", "gpu4"} - {a100_node}
    for node in (a100_node, *idle_a100):
        run_command(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                     "Reason=hetslurm-test"], timeout=30, env=slurm_env)
        drained.append(node)
    after = _status_json(slurm_env)
    assert after == _independent_counts(slurm_env)
    assert after[("gpu", "a100")] == {"total": 16, "allocated": 2, "free": 0, "unavailable": 14}
