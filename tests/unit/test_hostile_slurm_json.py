"""Hostile-input corpus for Slurm's JSON (issue 18): ``squeue --json`` and ``sinfo --json``
as :mod:`hetslurm.slurm.parse` reads them, ``sacct --json`` as :mod:`hetslurm.audit.sacct`
does, and the bytes :func:`hetslurm.process.run_command` turns into text.

Every case has an exact oracle: a value the field must parse to (None for a sentinel or a
missing key, UNLIMITED for an infinite time limit, the string as written), or an error of
hetslurm's tree (:class:`BackendError` for squeue/sinfo, :class:`MetricsError` or a skipped
and counted record for sacct) whose message names the field. Any other exception type is a
bug. Hand-written classes first, then a seeded generator that mutates the recorded 22.05
documents one field at a time and checks each mutation against the same oracle.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from hetslurm.audit.sacct import parse_sacct_json
from hetslurm.errors import BackendError, MetricsError
from hetslurm.process import run_command
from hetslurm.slurm import parse
from hetslurm.slurm.units import INFINITE, INFINITE64, NO_VAL, NO_VAL64, UNLIMITED

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
SQUEUE = json.loads((DATA / "squeue.json").read_text())
SINFO = json.loads((DATA / "sinfo.json").read_text())
SACCT = json.loads((DATA / "sacct.json").read_text())

# ------------------------------------------------------------------ squeue: the field table
#: 32-bit counts and ids -> the JobInfo attribute they fill.
UINT = {"job_id": "job_id", "array_job_id": "array_job_id", "array_task_id": "array_task_id",
        "het_job_id": "het_job_id", "het_job_offset": "het_job_offset",
        "time_limit": "time_limit", "restart_cnt": "restarts"}
TIMES = {"submit_time": "submit_time", "eligible_time": "eligible_time",
         "start_time": "start_time", "end_time": "end_time"}
#: Free text: ``name`` is kept as written; the others are stripped, placeholders None.
TEXT = {"name": "name", "user_name": "user", "account": "account", "partition": "partition",
        "qos": "qos", "state_reason": "reason", "array_task_string": "array_task_spec",
        "comment": "comment", "admin_comment": "admin_comment", "features": "features",
        "prefer": "prefer"}
#: Strings with a grammar (hostlist, TRES, state).
PARSED = {"nodes": "nodes", "tres_per_node": "tres_per_node", "tres_per_job": "tres_per_job",
          "tres_per_task": "tres_per_task", "job_state": "state"}
FLAGS = {"batch_flag": "batch", "requeue": "requeue"}
LISTS = {"gres_detail": "allocated_gres"}
ALL_FIELDS = {**UINT, **TIMES, **TEXT, **PARSED, **FLAGS, **LISTS}

#: What a missing key (or ``null``) reads as; "error": the job cannot be read.
ABSENT: dict[str, Any] = {
    **dict.fromkeys(TIMES.values()), **dict.fromkeys(TEXT.values()),
    "job_id": "error", "array_job_id": None, "array_task_id": None, "het_job_id": None,
    "het_job_offset": None, "time_limit": UNLIMITED, "restarts": None, "name": "",
    "nodes": (), "tres_per_node": (), "tres_per_job": (), "tres_per_task": (),
    "state": "UNKNOWN", "batch": True, "requeue": True, "allocated_gres": {},
}
#: Wrong JSON types for each kind of field (every one an error naming the field).
WRONG = {
    "uint": ["12", 1.5, True, [], {}, 1e300],
    "time": ["2026-01-01", 1.5, False, [1], {"number": 1}],
    "text": [5, 1.5, True, ["x"], {"a": 1}],
    "flag": ["true", 1, 0, [], {}],
    "list": ["gpu:1", [1], {"a": "b"}, 7],
}
ODD_TEXT = ["\x00nul", "\u202eevil", "é😀\u200b", "x" * 20_000, "  padded  ", "(null)", "N/A",
            "tab\there", "\\u0000", "\ufffd"]


def kind(field: str) -> str:
    if field in UINT:
        return "uint"
    if field in TIMES:
        return "time"
    if field in FLAGS:
        return "flag"
    if field in LISTS:
        return "list"
    return "text"


def one_job_doc(job: dict[str, Any]) -> str:
    return json.dumps({"meta": SQUEUE["meta"], "errors": [], "jobs": [job]})


def base_job(i: int = 0) -> dict[str, Any]:
    return copy.deepcopy(SQUEUE["jobs"][i])


def read_one(job: dict[str, Any]) -> Any:
    jobs = parse.parse_squeue_json(one_job_doc(job))
    assert len(jobs) == 1
    return jobs[0]


def expect_error(job: dict[str, Any], field: str) -> None:
    with pytest.raises(BackendError, match=f"field '{field}'"):
        parse.parse_squeue_json(one_job_doc(job))


def oracle_absent(job: dict[str, Any], field: str) -> tuple[str, Any]:
    """(attribute, value) a job with ``field`` missing or null reads as; the attribute is
    None when the job must be refused."""
    want = ABSENT[ALL_FIELDS[field]]
    if want == "error":
        return "", None
    attr = ALL_FIELDS[field]
    if field == "array_task_id" or (field == "array_job_id" and not job.get("array_job_id")):
        return "array_task_id", None
    if field == "het_job_offset":
        return attr, None
    if field == "nodes" and job.get("gres_detail"):
        return attr, ()
    return attr, want


def oracle_sentinel(field: str, value: int) -> Any:
    """What a Slurm sentinel in ``field`` reads as ("error": refused)."""
    if field in TIMES:
        return None
    if value in (NO_VAL64, INFINITE64):
        return "error"  # a 64-bit sentinel cannot be a 32-bit field's value
    if field == "job_id":
        return "error"
    if field == "time_limit":
        return UNLIMITED if value == INFINITE else None
    return None


# ------------------------------------------------------------------ documents
@pytest.mark.parametrize(("text", "why"), [
    ("", "did not print JSON"),
    ("squeue: error: Invalid user", "did not print JSON"),
    ("null", "not an object"),
    ("[]", "not an object"),
    ("42", "not an object"),
    ('"jobs"', "not an object"),
    ("[" * 100_000, "nested too deeply|did not print JSON"),
    ('{"jobs": [{"job_id": 1' + "0" * 5000 + "}]}", "did not print JSON"),
    ('{"jobs": [], "errors": [{"error": "x", "errno": 1}]}', "reported errors"),
    ('{"meta": {"plugin": {"type": "openapi/v0.0.40"}}, "jobs": []}', "openapi/v0.0.40"),
    ('{"meta": {"plugin": {"type": "", "data_parser": "data_parser/v0.0.41"}}, "jobs": []}',
     "data_parser/v0.0.41"),
    ('{"jobs": {"1": {}}}', "'jobs' is dict, not a list"),
    ('{"jobs": [5]}', "job 0 is int, not a JSON object"),
    ('{"jobs": [{"name": "x"}]}', "field 'job_id' is missing"),
])
def test_broken_squeue_documents_are_one_backend_error(text: str, why: str) -> None:
    with pytest.raises(BackendError, match=why):
        parse.parse_squeue_json(text)


def test_a_meta_of_the_wrong_shape_is_no_version_and_an_empty_document_no_jobs() -> None:
    assert parse.parse_squeue_json('{"meta": 5, "jobs": []}') == []
    assert parse.parse_squeue_json('{"meta": {"plugin": []}}') == []
    assert parse.parse_sinfo_json('{"meta": {"plugin": {"type": "openapi/v0.0.38"}}}') == []


def test_every_truncation_of_the_recording_is_one_backend_error() -> None:
    text = one_job_doc(base_job())
    for cut in range(0, len(text) - 1, 7):
        with pytest.raises(BackendError, match="did not print JSON"):
            parse.parse_squeue_json(text[:cut])


def test_bytes_that_are_not_utf8_are_replaced_not_fatal() -> None:
    raw = one_job_doc(base_job()).encode().replace(b'"a100x2"', b'"a1\xff\xfex2"')
    assert read_one_bytes(raw).name == "a1\ufffd\ufffdx2"


def read_one_bytes(raw: bytes) -> Any:
    return parse.parse_squeue_json_checked(raw)[0][0]


def test_run_command_replaces_undecodable_output() -> None:
    # A job name of raw bytes reaches hetslurm through the Slurm commands' stdout.
    out = run_command([sys.executable, "-c",
                       "import sys; sys.stdout.buffer.write(b'{\"n\": \"\\xff\\xc3\"}')"],
                      timeout=30)
    assert out.stdout == '{"n": "\ufffd\ufffd"}'


# ------------------------------------------------------------------ squeue fields, every class
@pytest.mark.parametrize("field", sorted(ALL_FIELDS))
def test_a_missing_or_null_field_reads_as_its_documented_default(field: str) -> None:
    for how in ("missing", "null"):
        job = base_job(10)  # 'held': pending, no allocation
        if how == "missing":
            job.pop(field, None)
        else:
            job[field] = None
        attr, want = oracle_absent(job, field)
        if not attr:
            expect_error(job, field)
        else:
            assert getattr(read_one(job), attr) == want, (field, how)


@pytest.mark.parametrize("field", sorted({**UINT, **TIMES}))
@pytest.mark.parametrize("value", [NO_VAL, INFINITE, NO_VAL64, INFINITE64])
def test_sentinels_in_every_numeric_field(field: str, value: int) -> None:
    job = base_job(11)  # a het leader: het_job_offset is read
    job["array_job_id"] = 5 if field == "array_task_id" else job["array_job_id"]
    job[field] = value
    want = oracle_sentinel(field, value)
    if want == "error":
        expect_error(job, field)
        return
    got = read_one(job)
    attr = ALL_FIELDS[field]
    if field == "het_job_id":
        assert got.het_job_id is None and got.het_job_offset is None
    elif field == "array_job_id":
        assert got.array_job_id is None and got.array_task_id is None
    else:
        assert getattr(got, attr) == want


@pytest.mark.parametrize("field", sorted(ALL_FIELDS))
def test_wrong_types_are_refused_naming_the_field(field: str) -> None:
    for bad in WRONG[kind(field)]:
        if kind(field) == "uint" and field == "array_task_id":
            continue  # read only for an array task: see the next test
        job = base_job(11)
        job[field] = bad
        expect_error(job, field)


def test_an_array_tasks_id_of_the_wrong_type_is_refused() -> None:
    job = base_job(4)  # task 13 of array 5
    job["array_task_id"] = "0"
    expect_error(job, "array_task_id")


@pytest.mark.parametrize("field", sorted({**UINT, **TIMES}))
@pytest.mark.parametrize("value", [-1, 2**70, 10**30])
def test_negative_and_huge_numbers_are_refused(field: str, value: int) -> None:
    job = base_job(4 if field == "array_task_id" else 11)  # an array task, a het component
    job[field] = value
    expect_error(job, field)


def test_a_time_past_what_a_time_can_be_is_refused_not_an_overflow() -> None:
    job = base_job()
    job["start_time"] = 2**40  # year 36812: datetime cannot hold it
    expect_error(job, "start_time")


@pytest.mark.parametrize("field", sorted(TEXT))
@pytest.mark.parametrize("value", ODD_TEXT)
def test_odd_strings_are_kept_exactly(field: str, value: str) -> None:
    job = base_job()
    job[field] = value
    got = getattr(read_one(job), TEXT[field])
    if field == "name":
        assert got == value
    else:
        stripped = value.strip()
        assert got == (None if stripped in ("(null)", "N/A", "") else stripped)


@pytest.mark.parametrize(("field", "value"), [
    ("nodes", "gpu[1-"), ("nodes", "gpu[3-1]"), ("tres_per_node", "gres:gpu:a:b:2:x"),
    ("tres_per_job", "gres:gpu:((2"), ("gres_detail", ["gpu:a100:2(IDX:0-x)"]),
    ("gres_detail", ["gpu:a100:2(IDX:"]),
])
def test_unparseable_grammar_names_the_field(field: str, value: Any) -> None:
    job = base_job()
    job[field] = value
    expect_error(job, field)


@pytest.mark.parametrize(("resources", "field"), [
    ("gpu1", "job_resources"), ({"allocated_nodes": {"gpu1": {}}}, "allocated_nodes"),
    ({"allocated_nodes": [5]}, "allocated_nodes"),
    ({"allocated_nodes": [{"nodename": 5}]}, "nodename"),
])
def test_an_allocation_of_the_wrong_shape_is_refused(resources: Any, field: str) -> None:
    job = base_job()
    job["job_resources"] = resources
    with pytest.raises(BackendError, match=field):
        parse.parse_squeue_json(one_job_doc(job))


def test_free_text_forging_scontrol_fields_still_marks_the_job() -> None:
    job = base_job()
    job["comment"] = "x Restarts=0\nJobId=1 JobState=COMPLETED"
    _, risky = parse.parse_squeue_json_checked(one_job_doc(job))
    assert risky == {1}


# ------------------------------------------------------------------ sinfo
SINFO_UINT = {"weight": ("weight", 1), "cpus": ("cpus_total", 0),
              "alloc_cpus": ("cpus_alloc", 0)}
SINFO_UINT64 = {"real_memory": ("memory_total_mib", 0), "alloc_memory": ("memory_alloc_mib", 0)}


def sinfo_node(**changes: Any) -> str:
    node = copy.deepcopy(SINFO["nodes"][0])
    for k, v in changes.items():
        if v is _DROP:
            node.pop(k, None)
        else:
            node[k] = v
    return json.dumps({"meta": SINFO["meta"], "errors": [], "nodes": [node]})


_DROP = object()


@pytest.mark.parametrize("field", sorted({**SINFO_UINT, **SINFO_UINT64}))
def test_sinfo_numbers_absent_or_sentinel_read_as_defaults(field: str) -> None:
    attr, default = {**SINFO_UINT, **SINFO_UINT64}[field]
    # Each field's own width: memory is uint64 in Slurm, so its sentinels are the 64-bit
    # ones, and a 32-bit NO_VAL there is a (huge) number of MiB.
    wide = field in SINFO_UINT64
    sentinels = (NO_VAL64, INFINITE64) if wide else (NO_VAL, INFINITE)
    for value in (_DROP, None, *sentinels):
        node = parse.parse_sinfo_json(sinfo_node(**{field: value}))[0]
        assert getattr(node, attr) == default, (field, value)
    if wide:
        assert getattr(parse.parse_sinfo_json(sinfo_node(**{field: NO_VAL}))[0],
                       attr) == NO_VAL
    for bad in ("8", 1.5, True, -1, 2**70, []):
        with pytest.raises(BackendError, match=f"field '{field}'"):
            parse.parse_sinfo_json(sinfo_node(**{field: bad}))


@pytest.mark.parametrize(("changes", "field"), [
    ({"name": _DROP}, "name"), ({"name": 5}, "name"), ({"state": ["IDLE"]}, "state"),
    ({"state_flags": "DRAIN"}, "state_flags"), ({"state_flags": [1]}, "state_flags"),
    ({"partitions": "gpu"}, "partitions"), ({"gres": "gpu:a:b:c:d"}, "gres"),
    ({"gres_used": 3}, "gres_used"), ({"reason": {"x": 1}}, "reason"),
])
def test_sinfo_wrong_shapes_name_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(BackendError, match=f"field '{field}'"):
        parse.parse_sinfo_json(sinfo_node(**changes))


def test_sinfo_odd_strings_and_missing_lists() -> None:
    node = parse.parse_sinfo_json(sinfo_node(reason="  \u202efan\x00 ", state_flags=None,
                                             partitions=_DROP, features=None))[0]
    assert node.reason == "\u202efan\x00" and node.partitions == () and node.features == ()
    assert node.state == frozenset({"ALLOCATED"})


# ------------------------------------------------------------------ sacct
def sacct_doc(*jobs: Any, meta: Any = None) -> str:
    return json.dumps({"meta": SACCT["meta"] if meta is None else meta, "errors": [],
                       "jobs": list(jobs)})


def sacct_job(**time: Any) -> dict[str, Any]:
    rec = copy.deepcopy(SACCT["jobs"][0])
    rec["time"].update(time)
    return rec


@pytest.mark.parametrize("value", [NO_VAL, INFINITE, NO_VAL64, INFINITE64, 0, -5])
@pytest.mark.parametrize("field", ["submission", "eligible", "start", "end"])
def test_sacct_time_sentinels_are_not_yet(field: str, value: int) -> None:
    res = parse_sacct_json(sacct_doc(sacct_job(**{field: value})))
    col = {"submission": "submit"}.get(field, field)
    assert res.skipped == 0 and math.isnan(res.jobs[col].iloc[0])


@pytest.mark.parametrize(("text", "why"), [
    (sacct_doc(meta={"plugin": {"type": "openapi/dbv0.0.40"}}), "openapi/dbv0.0.40"),
    (sacct_doc(meta={"plugin": {"type": "", "data_parser": "data_parser/v0.0.41"}}),
     "data_parser/v0.0.41"),
    ('{"jobs": [' + "[" * 100_000 + "]" * 100_000 + "]}", "nested too deeply"),
    ('{"jobs": [{"job_id": 1, "time": {}', "ends in the middle"),
    ('{"jobs": 5}', "no 'jobs' array"),
])
def test_broken_sacct_documents_are_one_metrics_error(text: str, why: str) -> None:
    with pytest.raises(MetricsError, match=why):
        parse_sacct_json(text)


@pytest.mark.parametrize(("change", "where"), [
    ({"job_id": "1"}, "job_id"), ({"job_id": 2**70}, "job_id"), ({"time": None}, "time"),
    ({"nodes": 5}, "nodes"), ({"tres": {"allocated": [{"type": "gres", "name": "gpu",
                                                       "count": 2**40}]}}, "out of range"),
    ({"state": "RUNNING"}, "state"), ({"comment": ["x"]}, "comment"),
])
def test_sacct_records_of_the_wrong_shape_are_skipped_and_counted(
        change: dict[str, Any], where: str) -> None:
    bad = copy.deepcopy(SACCT["jobs"][0])
    bad.update(change)
    res = parse_sacct_json(sacct_doc(bad, SACCT["jobs"][1]))
    assert (res.records, res.skipped, len(res.jobs)) == (2, 1, 1)
    assert where in res.problems[0]


# ------------------------------------------------------------------ seeded generator
MUTATIONS = ("absent", "null", "sentinel", "wrong_type", "negative", "huge", "odd_text")


def mutate(rng: random.Random) -> tuple[dict[str, Any], str, str, Any]:
    job = base_job(rng.randrange(len(SQUEUE["jobs"])))
    field = rng.choice(sorted(ALL_FIELDS))
    how = rng.choice(MUTATIONS)
    value: Any = None
    if how == "absent":
        job.pop(field, None)
    elif how == "null":
        job[field] = None
    elif how == "sentinel" and field in {**UINT, **TIMES}:
        value = job[field] = rng.choice([NO_VAL, INFINITE, NO_VAL64, INFINITE64])
    elif how == "wrong_type":
        value = job[field] = rng.choice(WRONG[kind(field)])
    elif how in ("negative", "huge") and field in {**UINT, **TIMES}:
        value = job[field] = -rng.randrange(1, 2**31) if how == "negative" else \
            rng.randrange(2**64, 2**80)
    elif how == "odd_text" and field in TEXT:
        value = job[field] = rng.choice(ODD_TEXT)
    else:
        how = "none"
    return job, field, how, value


def check(job: dict[str, Any], field: str, how: str, value: Any) -> None:
    read = (field != "array_task_id" or bool(job.get("array_job_id"))) and (
        field != "het_job_offset" or bool(job.get("het_job_id")))
    if how in ("absent", "null"):
        attr, want = oracle_absent(job, field)
        if not attr:
            expect_error(job, field)
        elif field == "nodes" and job.get("gres_detail") and not job.get("job_resources"):
            read_one(job)  # the allocation then has no nodes to pair with: see above
        else:
            assert getattr(read_one(job), attr) == want
    elif how == "sentinel":
        want = oracle_sentinel(field, value)
        if want == "error" and read:
            expect_error(job, field)
        elif field not in ("het_job_id", "array_job_id") and read:
            assert getattr(read_one(job), ALL_FIELDS[field]) == want
        else:
            read_one(job)
    elif how in ("wrong_type", "negative", "huge"):
        if read:
            expect_error(job, field)
        else:
            assert getattr(read_one(job), ALL_FIELDS[field]) is None
    elif how == "odd_text":
        got = getattr(read_one(job), TEXT[field])
        want = value if field == "name" else (
            None if value.strip() in ("(null)", "N/A", "") else value.strip())
        assert got == want
    else:
        read_one(job)


@pytest.mark.parametrize("seed", range(8))
def test_seeded_mutations_of_the_recording_meet_the_oracle(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(150):
        job, field, how, value = mutate(rng)
        try:
            check(job, field, how, value)
        except BackendError as exc:  # the oracle expected a value
            raise AssertionError(f"{field} {how} {value!r:.40}: unexpected {exc}") from exc


@pytest.mark.parametrize("seed", range(4))
def test_seeded_byte_noise_is_a_backend_error_or_a_parse(seed: int) -> None:
    # Random bytes flipped anywhere in a document: it parses, or it is one BackendError.
    rng = random.Random(seed)
    text = one_job_doc(base_job(rng.randrange(len(SQUEUE["jobs"])))).encode()
    for _ in range(150):
        raw = bytearray(text)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        with contextlib.suppress(BackendError):
            parse.parse_squeue_json_checked(bytes(raw))


@pytest.mark.parametrize("seed", range(4))
def test_seeded_sacct_mutations_are_parsed_or_skipped_never_fatal(seed: int) -> None:
    rng = random.Random(seed)
    good = SACCT["jobs"]
    for _ in range(40):
        recs = copy.deepcopy(good)
        victim = rng.randrange(len(recs))
        key = rng.choice(["job_id", "time", "name", "user", "nodes", "tres", "state",
                          "comment", "partition"])
        recs[victim][key] = rng.choice([None, "x", -1, 2**70, [], {}, 1.5, True, NO_VAL64])
        res = parse_sacct_json(sacct_doc(*recs))
        assert res.records == len(recs)
        assert res.skipped in (0, 1) and len(res.jobs) == len(recs) - res.skipped
        assert (res.skipped == 1) == bool(res.problems)
