"""The backend contract (tests/_backend_contract.py) on the fake backend.

The same checks run against the CLI and REST backends on the real testbed
(tests/cluster/test_backend_contract.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _backend_contract import CHECKS, check_job_lifecycle

from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.slurm import NodeInfo, PartitionInfo, SlurmBackend


def _fake() -> FakeSlurm:
    nodes = [NodeInfo("gpu1", frozenset({"IDLE"}), features=("h100",), cpus_total=8,
                      memory_total_mib=16384, gres_total={("gpu", "h100"): 8}),
             NodeInfo("cpu1", frozenset({"IDLE"}), cpus_total=8, memory_total_mib=16384)]
    parts = [PartitionInfo("batch", ("gpu1", "cpu1"), default=True),
             PartitionInfo("gpu", ("gpu1",))]
    return FakeSlurm(nodes=nodes, partitions=parts)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_contract_fake(name: str) -> None:
    check: Callable[[SlurmBackend], None] = CHECKS[name]
    check(_fake())


def test_contract_fake_job_lifecycle() -> None:
    fake = _fake()
    job_id = fake.submit("#!/bin/sh\n#SBATCH --hold\nsleep 1\n")
    check_job_lifecycle(fake, job_id)
