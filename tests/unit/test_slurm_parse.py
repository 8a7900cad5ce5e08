"""Parsers over real Slurm 22.05.8 output recorded in tests/data/slurm/.

The recording: gpu1 (4 a100, drained while a 2-GPU job ran), gpu2 (4 h100, all in use),
fpga1 (2 u280, inside an active MAINT reservation), cpu1/cpu2; jobs typed-GPU, --gpus,
FPGA, CPU, an array with a throttle, a het job, held and finished jobs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.slurm import parse
from hetslurm.slurm.units import UNLIMITED, GresItem

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_recorded_schema_versions_are_the_tested_ones() -> None:
    for name in ("sinfo.json", "squeue.json", "sacct.json"):
        doc = json.loads(read(name))
        assert parse.json_plugin(doc) in parse.TESTED_JSON_PLUGINS
        assert doc["meta"]["Slurm"]["release"] == "22.05.8"
    assert parse.parse_slurm_version(read("scontrol_version.txt")) == (22, 5, 8)


def test_sinfo_json_nodes() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo_json(read("sinfo.json"))}
    assert set(nodes) == {"cpu1", "cpu2", "fpga1", "gpu1", "gpu2"}
    gpu1 = nodes["gpu1"]
    assert gpu1.state == {"MIXED", "DRAIN"}
    assert gpu1.state_label == "draining"
    assert gpu1.reason == "hb: bad fan"
    assert gpu1.gres_total == {("gpu", "a100"): 4}
    assert gpu1.gres_used == {("gpu", "a100"): 2}
    assert gpu1.gres_used_indices == {("gpu", "a100"): (0, 1)}
    assert (gpu1.cpus_total, gpu1.cpus_alloc) == (8, 1)
    assert (gpu1.memory_total_mib, gpu1.memory_alloc_mib) == (16000, 500)
    assert gpu1.features == ("gpu", "a100")
    assert gpu1.weight == 10
    assert gpu1.partitions == ("all", "gpu")
    # "fpga:0" in a GPU node's GresUsed is a GresType the node lacks, not a device.
    assert ("fpga", None) not in gpu1.gres_used
    fpga1 = nodes["fpga1"]
    assert fpga1.state == {"MIXED", "MAINTENANCE", "RESERVED"}
    assert fpga1.unavailable
    assert fpga1.gres_used_indices == {("fpga", "u280"): (0,)}
    assert nodes["cpu1"].gres_total == {}


def test_scontrol_nodes_agree_with_sinfo_json() -> None:
    from_json = {n.name: n for n in parse.parse_sinfo_json(read("sinfo.json"))}
    from_text = {n.name: n for n in parse.parse_scontrol_nodes(read("scontrol_show_node_d_o.txt"))}
    assert from_json == from_text


def test_scontrol_node_reason_drops_who_and_when() -> None:
    (node,) = parse.parse_scontrol_nodes(read("scontrol_show_node_gpu1_d_o.txt"))
    assert node.reason == "hb: bad fan"


def test_missing_node_output_parses_to_nothing() -> None:
    assert parse.parse_scontrol_nodes(read("scontrol_show_node_missing.txt")) == []


def test_squeue_json_jobs_ids_and_requests() -> None:
    jobs = {j.display_id: j for j in parse.parse_squeue_json(read("squeue.json"))}
    assert {
        "1",
        "2",
        "3",
        "4",
        "5_0",
        "5_1",
        "5_[2-3%2]",
        "6",
        "7",
        "8",
        "9",
        "10",
        "11+0",
        "11+1",
    } == set(jobs)
    j1 = jobs["1"]
    assert j1.tres_per_node == (GresItem("gpu", "a100", 2),)
    assert j1.allocated_gres == {"gpu1": (GresItem("gpu", "a100", 2, (0, 1)),)}
    assert j1.time_limit == 3600
    assert j1.batch and j1.requeue and j1.restarts == 0
    j2 = jobs["2"]
    assert j2.tres_per_job == (GresItem("gpu", "h100", 1),)
    assert j2.tres_per_node == ()
    assert j2.qos == "gpu_high"
    assert j2.comment == "user comment"
    assert jobs["3"].allocated_gres == {"fpga1": (GresItem("fpga", "u280", 1, (0,)),)}
    # A running job whose OR-constraint was met shows the chosen feature, prefer cleared.
    assert jobs["7"].features == "h100"
    assert jobs["7"].prefer is None
    assert jobs["7"].admin_comment == "hetslurm: rewrote gpu-type"
    assert jobs["6"].state == "PENDING" and jobs["6"].start_time is None
    assert jobs["10"].reason == "JobHeldUser"
    assert jobs["4"].time_limit is UNLIMITED  # MaxTime=INFINITE partition, JSON null
    assert jobs["5_[2-3%2]"].array_task_id is None
    assert jobs["5_1"].array_job_id == 5
    assert jobs["11+1"].het_job_id == 11
    assert jobs["11+1"].gres_on("gpu2") == {("gpu", "h100"): (3,)}
    assert jobs["8"].state == "COMPLETED"  # 22.05's squeue --json lists finished jobs too
    assert jobs["1"].submit_time is not None and jobs["1"].end_time is not None


def test_scontrol_jobs_agree_with_squeue_json() -> None:
    from_json = {j.job_id: j for j in parse.parse_squeue_json(read("squeue.json"))}
    from_text = {j.job_id: j for j in parse.parse_scontrol_jobs(read("scontrol_show_job_d_o.txt"))}
    assert set(from_json) == set(from_text)
    for job_id, a in from_json.items():
        b = from_text[job_id]
        assert a.display_id == b.display_id
        assert a.allocated_gres == b.allocated_gres, job_id
        assert a.nodes == b.nodes
        assert a.tres_per_node == b.tres_per_node
        assert a.tres_per_job == b.tres_per_job
        assert a.time_limit == b.time_limit
        assert a.comment == b.comment
        assert a.admin_comment == b.admin_comment
        assert (a.state, a.partition, a.qos, a.user) == (b.state, b.partition, b.qos, b.user)
        assert a.submit_time == b.submit_time


def test_all_gpu_indices_in_use_match_between_nodes_and_jobs() -> None:
    nodes = parse.parse_sinfo_json(read("sinfo.json"))
    jobs = parse.parse_scontrol_jobs(read("scontrol_show_job_d_o.txt"))
    for node in nodes:
        held: dict[tuple[str, str | None], set[int]] = {}
        for job in jobs:
            if job.state == "RUNNING":
                for key, idx in job.gres_on(node.name).items():
                    held.setdefault(key, set()).update(idx)
        assert {k: tuple(sorted(v)) for k, v in held.items()} == dict(node.gres_used_indices)


def test_requeued_jobs() -> None:
    jobs = {
        j.job_id: j
        for j in parse.parse_scontrol_jobs(read("scontrol_show_job_d_o_after_requeue.txt"))
    }
    assert jobs[1].state == "PENDING" and jobs[1].restarts == 1
    assert jobs[1].reason == "BeginTime"
    # Requeue restores the submitted OR-constraint and prefer.
    assert jobs[7].features == "h100|a100" and jobs[7].prefer == "h100"
    assert jobs[7].reason == "job_requeued_in_held_state"
    again = {j.job_id: j for j in parse.parse_squeue_json(read("squeue_after_requeue.json"))}
    assert again[1].restarts == 1 and again[1].allocated_gres == {}


def test_partitions() -> None:
    parts = {
        p.name: p for p in parse.parse_scontrol_partitions(read("scontrol_show_partition_o.txt"))
    }
    assert parts["all"].default and parts["all"].max_time is UNLIMITED
    assert parts["gpu"].nodes == ("gpu1", "gpu2")
    assert parts["gpu"].max_time == 2 * 86400 and parts["gpu"].default_time == 3600
    assert parts["gpu"].tres["gres/gpu:a100"] == 4
    assert parts["all"].tres["mem"] == 56000


def test_qos() -> None:
    qos = {q.name: q for q in parse.parse_sacctmgr_qos(read("sacctmgr_show_qos_P.txt"))}
    assert qos["gpu_high"].priority == 100
    assert qos["gpu_high"].max_wall == 86400
    assert qos["gpu_high"].max_tres_per_user == {"gres/gpu": 4}
    assert qos["normal"].max_wall is None


def test_scontrol_pairs_keep_spaces_equals_and_repeats() -> None:
    pairs = parse.scontrol_pairs(
        "JobId=3 Comment=two words  TRES=cpu=1,mem=500M Nodes=a CPU_IDs=0 GRES= "
        "Nodes=b[1-2] GRES=gpu:x:1(IDX:1) Power="
    )
    assert ("Comment", "two words") in pairs
    assert ("TRES", "cpu=1,mem=500M") in pairs
    assert [v for k, v in pairs if k == "Nodes"] == ["a", "b[1-2]"]
    assert parse.parse_job_gres_detail(pairs) == {
        "b1": (GresItem("gpu", "x", 1, (1,)),),
        "b2": (GresItem("gpu", "x", 1, (1,)),),
    }


def test_sbatch_parsable_and_errors() -> None:
    assert parse.parse_sbatch_parsable(read("sbatch_parsable.txt")) == 16
    assert parse.parse_sbatch_parsable("42;hbrec\n") == 42
    with pytest.raises(BackendError):
        parse.parse_sbatch_parsable("sbatch: error: oops")
    with pytest.raises(BackendError, match="reported errors"):
        parse.parse_squeue_json('{"meta": {}, "errors": [{"error": "x"}], "jobs": []}')
    with pytest.raises(BackendError, match="JSON"):
        parse.parse_sinfo_json("sinfo: error: no controller")


def test_unknown_json_fields_are_tolerated() -> None:
    doc = json.loads(read("sinfo.json"))
    for n in doc["nodes"]:
        n["field_from_a_newer_slurm"] = {"x": 1}
    doc["new_top_level"] = []
    assert len(parse.parse_sinfo_json(json.dumps(doc))) == 5


def test_scontrol_jobs_cpu_ids_per_node() -> None:
    jobs = {j.display_id: j for j in parse.parse_scontrol_jobs(read("scontrol_show_job_d_o.txt"))}
    assert jobs["4"].cpu_ids == {"cpu1": (0, 1)}
    assert jobs["11+1"].cpu_ids == {"gpu2": (4,)}
    assert jobs["6"].cpu_ids == {}  # pending: no allocation yet
    # The running jobs' CPU ids on a node add up to the node's CPUAlloc and never overlap.
    nodes = parse.parse_scontrol_nodes(read("scontrol_show_node_d_o.txt"))
    for node in nodes:
        held = [c for j in jobs.values() if j.state == "RUNNING"
                for c in j.cpu_ids.get(node.name, ())]
        assert len(held) == len(set(held)) == node.cpus_alloc, node.name


def test_scontrol_job_cpu_ids_one_group_per_node_set() -> None:
    # A multi-node job prints one "Nodes= CPU_IDs= Mem= GRES=" group per set of nodes that
    # hold the same ids (format as Slurm 22.05 prints it with -d -o).
    line = ("JobId=21 JobName=x JobState=RUNNING NodeList=gpu[1-3] JOB_GRES=gpu:h100:4   "
            "Nodes=gpu[1-2] CPU_IDs=0-1,4 Mem=3072 GRES=gpu:h100:2(IDX:0-1) "
            "Nodes=gpu3 CPU_IDs=6-7 Mem=2048 GRES=gpu:h100:2(IDX:4-5) MinCPUsNode=1")
    (job,) = parse.parse_scontrol_jobs(line)
    assert job.cpu_ids == {"gpu1": (0, 1, 4), "gpu2": (0, 1, 4), "gpu3": (6, 7)}
    assert job.gres_on("gpu3") == {("gpu", "h100"): (4, 5)}
    # A line whose CPU_IDs do not parse is not Slurm's to believe: left out, not guessed.
    assert parse.parse_scontrol_jobs("JobId=22 Nodes=gpu1 CPU_IDs=zero GRES=") == []


@pytest.mark.parametrize("raw", ["absent", None, 0xFFFFFFFE, 0xFFFFFFFF])
def test_a_missing_restart_count_is_unknown_not_zero(raw: object) -> None:
    # Issue 18, finding 7: read as 0, a missing count defeated the requeue cap.
    doc = json.loads(read("squeue.json"))
    for j in doc["jobs"]:
        if raw == "absent":
            j.pop("restart_cnt", None)
        else:
            j["restart_cnt"] = raw
    assert {j.restarts for j in parse.parse_squeue_json(json.dumps(doc))} == {None}
    line = read("scontrol_show_job_7_d_o.txt").replace("Restarts=0 ", "")
    assert "Restarts=" not in line
    assert [j.restarts for j in parse.parse_scontrol_jobs(line)] == [None]
