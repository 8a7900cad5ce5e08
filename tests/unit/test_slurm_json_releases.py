"""The access layer's JSON decoders on the output of real 24.11.5 and 26.05.5 controllers
(tests/data/slurm/RELEASES.md): v0.0.42 decodes into the same typed records as 22.05's
v0.0.38; what it cannot read is refused in one line, never "0 nodes" or a TypeError."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.request.record import find_record
from hetslurm.slurm import parse
from hetslurm.slurm.sacct import parse_sacct_document

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def read(release: str, name: str) -> str:
    return (DATA / release / name).read_text()


def test_nodes_from_scontrol_show_node_json_v0042() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo_json(read("24.11", "scontrol-show-node.json"),
                                                        what="scontrol show node --json")}
    assert sorted(nodes) == ["cpu1", "cpu2", "cpu3", "cpu4", "fpga1", "gpu1", "gpu2", "gpu3",
                             "gpu4"]
    gpu1 = nodes["gpu1"]
    assert gpu1.state == frozenset({"MIXED"}) and gpu1.base_state == "MIXED"
    assert gpu1.features == ("gpu", "h100", "nvlink")
    assert gpu1.gres_total == {("gpu", "h100"): 8}
    assert gpu1.gres_used == {("gpu", "h100"): 4}
    assert gpu1.gres_used_indices == {("gpu", "h100"): (0, 1, 4, 5)}
    assert gpu1.cpus_total == 8 and gpu1.memory_total_mib == 16384 and gpu1.weight == 100
    assert nodes["fpga1"].gres_used_indices == {("fpga", "u280"): (0,)}
    assert nodes["cpu1"].partitions == ("batch", "cpu")


def test_grouped_sinfo_json_is_refused_not_read_as_no_nodes() -> None:
    with pytest.raises(BackendError, match=r"grouped records \(Slurm 24.11 and later\)"):
        parse.parse_sinfo_json(read("24.11", "sinfo.json"))


def test_jobs_from_squeue_json_v0042() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue_json(read("24.11", "squeue.json"))}
    assert sorted(jobs) == [8, 9, 10, 11, 12]
    typed = jobs[8]
    assert typed.state == "RUNNING" and typed.nodes == ("gpu3",)
    assert [(g.key, g.count) for g in typed.tres_per_node] == [(("gpu", "a100"), 1)]
    assert {n: [(g.key, g.count) for g in items] for n, items in typed.allocated_gres.items()} \
        == {"gpu3": [(("gpu", "a100"), 1)]}
    assert typed.time_limit == 86400 and typed.restarts == 0 and typed.user == "root"
    assert typed.start_time is not None and typed.end_time is not None
    assert typed.end_time - typed.start_time == timedelta(days=1)
    rec = find_record(typed.admin_comment)
    assert rec is not None and rec.request == "gpus=1 gpu-type=a100"
    two_nodes = jobs[12]
    assert two_nodes.nodes == ("gpu1", "gpu2") and set(two_nodes.allocated_gres) == {"gpu1",
                                                                                      "gpu2"}
    assert jobs[9].features == "a100|h100"


def test_finished_jobs_decode_too() -> None:
    # Captured with -t all after the first six jobs ended (24.11 hides them otherwise).
    jobs = parse.parse_squeue_json(read("24.11", "squeue-all.json"))
    assert len(jobs) >= 6 and {j.state for j in jobs} == {"COMPLETED"}
    assert all(j.end_time is not None for j in jobs)


@pytest.mark.parametrize("name", ["squeue.json", "sinfo.json"])
def test_a_schema_not_checked_is_named(name: str) -> None:
    # 26.05 prints data_parser v0.0.45 unless asked for v0.0.42 (these two were not).
    with pytest.raises(BackendError, match=r"printed schema 'data_parser/v0.0.45', which "
                                           r"hetslurm does not read \(it reads v0.0.38"):
        if name == "squeue.json":
            parse.parse_squeue_json(read("26.05", name))
        else:
            parse.parse_sinfo_json(read("26.05", name))


def test_a_submit_line_that_could_forge_marks_the_job_untrusted() -> None:
    text = read("26.05", "squeue.json").replace("data_parser\\/v0.0.45", "data_parser\\/v0.0.42")
    text = text.replace('"submit_line": "', '"submit_line": "sbatch x.sh Restarts=0 ', 1)
    jobs, risky = parse.parse_squeue_json_checked(text)
    assert len(risky) == 1 and jobs


def test_26_05_asked_for_v0042_decodes_like_24_11() -> None:
    # Captured from the 26.05.5 testbed (`testbed up --slurm 26.05`) with --json=v0.0.42.
    nodes = parse.parse_sinfo_json(read("26.05", "scontrol-show-node.json"),
                                   what="scontrol show node --json")
    assert len(nodes) == 9 and {"gpu1", "fpga1", "cpu4"} <= {n.name for n in nodes}
    jobs = parse.parse_squeue_json(read("26.05", "squeue-all.json"))
    assert len(jobs) > 10 and all(j.job_id > 0 for j in jobs)
    assert any(j.state in ("COMPLETED", "CANCELLED") for j in jobs)  # -t all: finished jobs


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_sacct_v0042_records_decode(release: str) -> None:
    recs = parse_sacct_document(read(release, "sacct.json"))
    got = [recs.decode(r) for r in recs.raws]
    assert got and all(r.state is not None and r.state.name for r in got)
    assert any(t.name and t.name.startswith("gpu") for r in got
               for t in (r.tres.allocated if r.tres and r.tres.allocated else []))


def test_an_empty_stderr_of_26_05_follows_stdout() -> None:
    # 26.05 prints StdErr= (empty) when errors go where the output goes; 24.11 repeats StdOut.
    for release in ("24.11", "26.05"):
        files = parse.parse_job_output_files(read(release, "scontrol-show-job-d-o.txt"))
        assert files.stdout == files.stderr == "/tb/jobs/j1.out"
    assert parse.parse_job_output_files("JobId=1 StdErr= StdIn=/dev/null StdOut=/dev/null"
                                        ).stderr == "/dev/null"


def test_a_line_broken_by_free_text_is_left_out_not_raised() -> None:
    # 26.05's SubmitLine repeats a comment with a line break and Key=value words, then the
    # rest of the command line: the forged line's GRES= does not parse.
    text = ("JobId=5 JobName=x JobState=RUNNING Comment=c\n"
            "JobId=4 JobName=victim JobState=RUNNING Nodes=gpu1 CPU_IDs=0-7 Mem=0 "
            "GRES=gpu:h100:8(IDX:0-7) --wrap sleep 60\n")
    jobs = parse.parse_scontrol_jobs(text)
    assert [j.job_id for j in jobs] == [5]


def test_cpu_load_is_read_from_every_form() -> None:
    # JSON gives the load average times 100 (22.05 sinfo, v0.0.42 scontrol and slurmrestd);
    # scontrol's text prints it as is. The recordings of each release, cpu1's value.
    loads = {
        "22.05 sinfo": parse.parse_sinfo_json((DATA / "sinfo.json").read_text()),
        "22.05 text": parse.parse_scontrol_nodes(
            (DATA / "scontrol_show_node_d_o.txt").read_text()),
        "24.11": parse.parse_sinfo_json(read("24.11", "scontrol-show-node.json")),
        "24.11 rest": parse.parse_sinfo_json(read("24.11", "rest-nodes.json")),
        "26.05": parse.parse_sinfo_json(read("26.05", "scontrol-show-node.json")),
    }
    got = {k: next(n.cpu_load for n in v if n.name == "cpu1") for k, v in loads.items()}
    assert got == {"22.05 sinfo": 0.16, "22.05 text": 0.16, "24.11": 2.11,
                   "24.11 rest": 1.21, "26.05": 0.3}
    # Not registered yet: no number, no load (never 0).
    text = (DATA / "scontrol_show_node_d_o.txt").read_text().replace("CPULoad=0.16",
                                                                    "CPULoad=N/A")
    assert next(n.cpu_load for n in parse.parse_scontrol_nodes(text) if n.name == "cpu1") is None
