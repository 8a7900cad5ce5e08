"""Free text in `scontrol show job -o` cannot forge a job's fields.

scontrol prints names, comments, commands and paths unescaped, so a job named
``x Restarts=0 JobState=COMPLETED`` (or holding a line break and a whole forged line) would
read as other fields. The CLI backend takes every field from ``squeue --json`` and trusts
scontrol's allocation detail only for jobs whose free text cannot forge anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.slurm import parse

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def squeue_doc(**changes: object) -> str:
    doc = json.loads((DATA / "squeue.json").read_text())
    first = doc["jobs"][0]
    first.update(changes)
    return json.dumps(doc)


def test_clean_jobs_are_trusted() -> None:
    jobs, risky = parse.parse_squeue_json_checked(squeue_doc())
    assert jobs and risky == set()
    details = parse.parse_scontrol_jobs((DATA / "scontrol_show_job_d_o.txt").read_text())
    trusted = parse.trusted_details(details, risky)
    assert set(trusted) == {d.job_id for d in details}


@pytest.mark.parametrize("field,value", [
    ("name", "x Restarts=0 JobState=COMPLETED"),
    ("comment", "line\nJobId=99 GRES=gpu:h100:8(IDX:0-7)"),
    ("command", "/tmp/a b.sh GRES=gpu:h100:8(IDX:0-7)"),
    ("standard_output", "/tmp/out\r"),
    ("current_working_directory", "/home/u Nodes=gpu1"),
    ("admin_comment", "Restarts=0"),
])
def test_free_text_that_could_forge_marks_the_job(field: str, value: str) -> None:
    jobs, risky = parse.parse_squeue_json_checked(squeue_doc(**{field: value}))
    assert risky == {jobs[0].job_id}


@pytest.mark.parametrize("field,value", [
    ("admin_comment", 'hetslurm:{"v":1,"req":"gpus=2 class=train locality=nvlink:required"}'),
    ("command", "/tmp/a=b.sh"),
    ("current_working_directory", "/home/u/k=v"),
    ("name", "lr=0.1 bs=64"),
])
def test_other_key_value_text_is_trusted(field: str, value: str) -> None:
    # '=' alone cannot forge: only a blank followed by a key the parser reads can (every
    # #HET job's decision record holds "gpus=2 class=..." and must keep its detail).
    _jobs, risky = parse.parse_squeue_json_checked(squeue_doc(**{field: value}))
    assert risky == set()


def test_forged_line_for_another_job_drops_both() -> None:
    text = (DATA / "scontrol_show_job_d_o.txt").read_text()
    details = parse.parse_scontrol_jobs(text)
    victim = details[0]
    forged = (f"JobId={victim.job_id} JobName=forged UserId=root(0) JobState=RUNNING "
              "Restarts=7 NodeList=gpu1\n")
    both = parse.parse_scontrol_jobs(text + forged)
    trusted = parse.trusted_details(both, set())
    assert victim.job_id not in trusted
    assert all(d.restarts != 7 for d in trusted.values())


def test_ambiguous_scontrol_output_is_named() -> None:
    clean = (DATA / "scontrol_show_job_7_d_o.txt").read_text()
    assert parse.ambiguous_scontrol_job(clean) is None
    line = clean.splitlines()[0]
    forged_name = line.replace("JobName=", "JobName=x Restarts=9 JobState=COMPLETED y", 1)
    why = parse.ambiguous_scontrol_job(forged_name)
    assert why and "Restarts" in why and "JobState" in why
    broken = line.replace("JobName=", "JobName=x\nQOS=forged y", 1)
    assert parse.ambiguous_scontrol_job(broken) == (
        "a line without JobId (free text holds a line break)")


def test_json_error_still_refused() -> None:
    with pytest.raises(BackendError):
        parse.parse_squeue_json_checked("not json")
