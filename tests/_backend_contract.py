"""The backend contract: what every SlurmBackend (fake, CLI, REST) must answer alike.

Each check takes a backend and a held job it may change (submitted by the caller, so the
fake and the real testbed can each submit their own way). The fake runs them in the unit
tier (tests/unit/test_backend_contract_fake.py), the CLI and REST backends on the real testbed
(tests/cluster/test_backend_contract.py, every release of the release tier).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from hetslurm.slurm import GresItem, JobInfo, NotFoundError, SlurmBackend

#: A job id no controller of the tests holds.
NO_SUCH_JOB = "4999999"


def wait_job(backend: SlurmBackend, job_id: int, pred: Callable[[JobInfo], bool],
             what: str, timeout: float = 20.0) -> JobInfo:
    """The job once ``pred`` holds (the controller may take a moment), else fail."""
    deadline = time.monotonic() + timeout
    while True:
        job = backend.job(job_id)
        if pred(job):
            return job
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id}: {what} not seen within {timeout:.0f}s: {job}")
        time.sleep(0.3)


def check_nodes(backend: SlurmBackend) -> None:
    nodes = backend.nodes()
    names = [n.name for n in nodes]
    assert names and len(set(names)) == len(names), names
    for n in nodes:
        one = backend.node(n.name)
        assert (one.name, dict(one.gres_total), one.features, one.weight, one.cpus_total,
                one.memory_total_mib) == (n.name, dict(n.gres_total), n.features, n.weight,
                                          n.cpus_total, n.memory_total_mib)
    with pytest.raises(NotFoundError):
        backend.node("no-such-node")


def check_partitions(backend: SlurmBackend) -> None:
    parts = backend.partitions()
    names = {n.name for n in backend.nodes()}
    assert parts, "no partitions"
    assert len({p.name for p in parts}) == len(parts)
    assert sum(p.default for p in parts) <= 1
    for p in parts:
        assert set(p.nodes) <= names, (p.name, p.nodes)


def check_job_lifecycle(backend: SlurmBackend, job_id: int) -> None:
    """``job_id`` is a held, pending job of the caller's."""
    job = backend.job(job_id)
    assert job.state == "PENDING" and (job.reason or "").startswith("JobHeld"), job
    assert job_id in {j.job_id for j in backend.jobs()}
    gres = (GresItem("gpu", "h100", 1),)
    backend.update_job(job_id, features="h100", admin_comment="contract check",
                       tres_per_node=gres)
    job = backend.job(job_id)
    assert job.features == "h100", job.features
    assert job.admin_comment == "contract check", job.admin_comment
    assert job.tres_per_node == gres, job.tres_per_node
    backend.release(job_id)
    wait_job(backend, job_id, lambda j: not (j.reason or "").startswith("JobHeld"),
             "the release")
    job = backend.job(job_id)
    if job.state == "PENDING":
        backend.hold(job_id)
        wait_job(backend, job_id, lambda j: (j.reason or "").startswith("JobHeld"), "the hold")
    backend.cancel(job_id)
    wait_job(backend, job_id, lambda j: j.state == "CANCELLED", "the cancel")


def check_not_found(backend: SlurmBackend) -> None:
    for act in (backend.job, backend.cancel, backend.hold, backend.release):
        with pytest.raises(NotFoundError):
            act(NO_SUCH_JOB)
    with pytest.raises(NotFoundError):
        backend.update_job(NO_SUCH_JOB, admin_comment="x")


CHECKS = {
    "nodes": check_nodes,
    "partitions": check_partitions,
    "not_found": check_not_found,
}
