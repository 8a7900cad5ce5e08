"""slurmrestd's v0.0.42 answers, recorded on the 24.11 and 26.05 testbeds (tests/data/slurm/
RELEASES.md), read by the parsers the REST backend uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.slurm import UNLIMITED
from hetslurm.slurm.parse import (
    parse_partitions_json,
    parse_scontrol_jobs,
    parse_sinfo_json,
    parse_squeue_json,
    with_core_cpu_ids,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
RELEASES = ("24.11", "26.05")


def _read(release: str, name: str) -> str:
    return (DATA / release / name).read_text()


@pytest.mark.parametrize("release", RELEASES)
def test_nodes_and_partitions(release: str) -> None:
    nodes = {n.name: n for n in parse_sinfo_json(_read(release, "rest-nodes.json"))}
    assert len(nodes) == 9
    assert nodes["gpu1"].gres_total == {("gpu", "h100"): 8}
    assert nodes["fpga1"].gres_total == {("fpga", "u280"): 2}
    parts = {p.name: p for p in parse_partitions_json(_read(release, "rest-partitions.json"))}
    assert set(parts) == {"batch", "gpu", "fpga", "cpu"}
    assert set(parts["batch"].nodes) == set(nodes)
    assert parts["gpu"].nodes == ("gpu1", "gpu2", "gpu3", "gpu4")
    assert parts["gpu"].max_time == 86400 and parts["gpu"].default_time is None
    assert parts["gpu"].tres["gres/gpu:h100"] == 16
    assert parts["batch"].state == "UP" and parts["batch"].max_time is not UNLIMITED


@pytest.mark.parametrize("release", RELEASES)
def test_cpu_ids_from_job_resources_equal_scontrol(release: str) -> None:
    doc = json.loads(_read(release, "rest-jobs.json"))
    threads = {n["name"]: n["threads"] for n in json.loads(_read(release, "rest-nodes.json"))
               ["nodes"]}
    jobs = [with_core_cpu_ids(j, raw, threads)
            for j, raw in zip(parse_squeue_json(json.dumps(doc)), doc["jobs"], strict=True)]
    (detail,) = parse_scontrol_jobs(_read(release, "rest-scontrol-show-job-d-o.txt"))
    (job,) = [j for j in jobs if j.job_id == detail.job_id]
    assert job.state == "RUNNING"
    assert job.cpu_ids == detail.cpu_ids and sum(map(len, job.cpu_ids.values())) == 3
    assert job.allocated_gres == detail.allocated_gres


def test_partition_of_the_wrong_shape_names_the_field() -> None:
    doc = {"partitions": [{"name": "p", "maximums": "soon"}],
           "meta": {"plugin": {"data_parser": "data_parser/v0.0.42"}}}
    with pytest.raises(BackendError, match=r"partition 'p'.*maximums"):
        parse_partitions_json(json.dumps(doc))
    doc = {"partitions": [{"nodes": {"configured": "a[1-2]"}}]}
    with pytest.raises(BackendError, match="'name' is missing"):
        parse_partitions_json(json.dumps(doc))


def test_job_resources_of_the_wrong_shape_leave_the_job_alone() -> None:
    (job,) = parse_squeue_json(json.dumps({"jobs": [{"job_id": 5, "job_state": "RUNNING"}]}))
    for raw in ({"job_resources": "x"}, {"job_resources": {"nodes": {"allocation": [
            {"name": "n", "sockets": [{"cores": [{"index": "0", "status": ["ALLOCATED"]}]}]}]}}},
            None):
        assert with_core_cpu_ids(job, raw, {}) == job
