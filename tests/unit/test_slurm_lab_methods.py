"""The access layer's methods the lab's benchmarks and experiments use: the controller's
statistics (sdiag, sdiag -r), submitting with sbatch's messages (a script file, script
text or --wrap), squeue's ids of a chosen set of jobs or states, and sacct records of
given jobs; each on the CLI backend with stand-in commands and on the fake.

The sdiag report below is hand-written in Slurm 22.05's format (the lines and spacing of
src/sdiag/sdiag.c's printf formats; no recording of sdiag exists in tests/data/slurm/); the
squeue and sbatch lines likewise; the sacct document is the recording
tests/data/slurm/sacct.json."""

from __future__ import annotations

from pathlib import Path

import pytest
from _slurm_stubs import stub_backend

from hetslurm.errors import CommandError
from hetslurm.lab.fake_slurm import FakeSlurm, load_recorded
from hetslurm.slurm import (
    SUBMIT_BATCH_RPC,
    ControllerStats,
    JobInfo,
    NodeInfo,
    NotSupportedError,
    RpcStats,
    Submission,
    parse,
)
from hetslurm.slurm.backend import SlurmBackend
from hetslurm.slurm.cli_backend import COMMANDS, CliBackend

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"

SDIAG = """*******************************************************
sdiag output at Mon Nov 30 05:00:00 2026 (1796014800)
Data since      Mon Nov 30 04:55:00 2026 (1796014500)
*******************************************************
Server thread count:  3
Agent queue size:     0
Agent count:          0
Agent thread count:   0
DBD Agent queue size: 17

Jobs submitted: 3
Jobs started:   0
Jobs completed: 0
Jobs canceled:  0
Jobs failed:    0

Job states ts:  Mon Nov 30 05:00:00 2026 (1796014800)
Jobs pending:   3
Jobs running:   0

Main schedule statistics (microseconds):
\tLast cycle:   102
\tMax cycle:    1070
\tTotal cycles: 12
\tMean cycle:   250
\tMean depth cycle:  3
\tCycles per minute: 2
\tLast queue length: 3

Backfilling stats
\tTotal backfilled jobs (since last slurm start): 0
\tTotal backfilled jobs (since last stats cycle start): 0
\tTotal backfilled heterogeneous job components: 0
\tTotal cycles: 0
\tLast cycle when: N/A
\tLast cycle: 0
\tMax cycle:  0
\tLast depth cycle: 0
\tLast depth cycle (try sched): 0
\tLast queue length: 0
\tLast table size: 0

Latency for 1000 calls to gettimeofday(): 18 microseconds

Remote Procedure Call statistics by message type
\tREQUEST_PARTITION_INFO                  ( 2009) count:12     ave_time:128    total_time:1544
\tREQUEST_SUBMIT_BATCH_JOB                ( 4003) count:3      ave_time:701    total_time:2104
\tMESSAGE_NODE_REGISTRATION_STATUS        ( 1002) count:2      ave_time:260    total_time:520

Remote Procedure Call statistics by user
\troot            (       0) count:17     ave_time:245    total_time:4168
\tREQUEST_SUBMIT_BATCH_JOB (    1001) count:99     ave_time:1      total_time:99

Pending RPC statistics
\tNo pending RPCs
"""

STUB = """#!/bin/sh
echo "$(basename "$0") $*" | sed "s/ $//" >> "$HB_LOG"
case "$(basename "$0") $*" in
  "sdiag ") printf '%s' "$HB_SDIAG" ;;
  "sdiag -r") echo "Reset scheduling statistics" ;;
  "sbatch --parsable --hold -o /dev/null "*/job.sh)
    echo "sbatch: hetslurm: placed on h100|a100" >&2; echo "17;hetdemo" ;;
  "sbatch --parsable --hold -o /dev/null --wrap true") echo 18 ;;
  "sbatch --parsable -J text") cat > "$HB_LOG.stdin"; echo 19 ;;
  "sbatch --parsable "*/refused.sh)
    echo "sbatch: error: hetslurm: gpus=99 is more than any node has" >&2
    echo "sbatch: error: Batch job submission failed: Unspecified error" >&2; exit 1 ;;
  "squeue -h -o %i") printf '7\\n5_1\\n5_[2-3%%2]\\n11+1\\n' ;;
  "squeue -h -t all -o %i") printf '7\\n8\\n' ;;
  "squeue -h -j 5 -t PD -o %i") printf '5_[2-3%%2]\\n' ;;
  "squeue -h -j 999 -o %i")
    echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  "squeue -h -t bogus -o %i")
    echo "squeue: error: Invalid job state specified: bogus" >&2; exit 1 ;;
  "sacct --allusers -X -j 5 --json"|"sacct -j 8,9 --json") cat "$HB_DATA/sacct.json" ;;
  "scontrol --version") echo "slurm 22.05.8" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


@pytest.fixture()
def cli(tmp_path: Path) -> CliBackend:
    return stub_backend(tmp_path, STUB, COMMANDS, HB_DATA=str(DATA),
                        HB_LOG=str(tmp_path / "log"), HB_SDIAG=SDIAG)


def ran(b: CliBackend) -> list[str]:
    return Path(b.env["HB_LOG"]).read_text().splitlines()


# ---------------------------------------------------------------- sdiag
def test_sdiag_report_to_typed_statistics() -> None:
    got = parse.parse_sdiag(SDIAG)
    assert (got.server_thread_count, got.agent_queue_size, got.dbd_agent_queue_size,
            got.jobs_submitted) == (3, 0, 17, 3)
    assert got.rpc(SUBMIT_BATCH_RPC) == RpcStats(count=3, mean_us=701, total_us=2104)
    # Only the section by message type: the user section's lines have the same shape.
    assert set(got.rpcs) == {"REQUEST_PARTITION_INFO", SUBMIT_BATCH_RPC,
                             "MESSAGE_NODE_REGISTRATION_STATUS"}
    # A type slurmctld served none of since the reset is not listed: zero.
    assert got.rpc("REQUEST_CANCEL_JOB") == RpcStats(0, 0, 0)


def test_sdiag_without_the_counters_says_unknown() -> None:
    # Right after "sdiag -r" no RPC is listed; output that is not a report gives nothing.
    reset = SDIAG.split("Remote Procedure Call statistics by message type")[0]
    assert parse.parse_sdiag(reset).rpcs == {}
    assert parse.parse_sdiag("sdiag: error: slurm_get_statistics: Unable to contact "
                             "slurm controller") == ControllerStats()


def test_controller_stats_and_reset_run_sdiag(cli: CliBackend) -> None:
    assert cli.controller_stats().rpc(SUBMIT_BATCH_RPC).total_us == 2104
    cli.reset_controller_stats()
    assert ran(cli) == ["sdiag", "sdiag -r"]


# ---------------------------------------------------------------- sbatch
def test_submit_batch_keeps_the_id_and_what_sbatch_said(cli: CliBackend,
                                                         tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#HET gpus=2\ntrue\n")
    got = cli.submit_batch(script, ["--hold", "-o", "/dev/null"])
    assert got == Submission(17, "sbatch: hetslurm: placed on h100|a100\n")
    assert cli.submit_batch(args=["--hold", "-o", "/dev/null"], wrap="true").job_id == 18
    assert cli.submit_batch("#!/bin/sh\ntrue\n", ["-J", "text"]).job_id == 19
    assert Path(cli.env["HB_LOG"] + ".stdin").read_text() == "#!/bin/sh\ntrue\n"
    assert ran(cli) == [f"sbatch --parsable --hold -o /dev/null {script}",
                        "sbatch --parsable --hold -o /dev/null --wrap true",
                        "sbatch --parsable -J text"]


def test_a_refused_submission_carries_sbatchs_message(cli: CliBackend,
                                                      tmp_path: Path) -> None:
    script = tmp_path / "refused.sh"
    script.write_text("#!/bin/sh\n#HET gpus=99\ntrue\n")
    with pytest.raises(CommandError, match="Batch job submission failed") as err:
        cli.submit_batch(script)
    assert "gpus=99 is more than any node has" in err.value.failure.stderr


def test_submit_batch_needs_a_script_or_a_command() -> None:
    backend = CliBackend({})
    with pytest.raises(ValueError, match="script or a command"):
        backend.submit_batch()
    with pytest.raises(ValueError, match="script or a command"):
        backend.submit_batch("#!/bin/sh\n", wrap="true")


# ---------------------------------------------------------------- squeue
def test_queued_ids_as_squeue_prints_them(cli: CliBackend) -> None:
    assert cli.queued_ids() == ["7", "5_1", "5_[2-3%2]", "11+1"]
    assert cli.queued_ids(states=["all"]) == ["7", "8"]
    assert cli.queued_ids(jobs=[5], states=["PD"]) == ["5_[2-3%2]"]
    assert cli.queued_ids(jobs=[999]) == []  # gone: squeue -j fails, nothing is queued
    with pytest.raises(CommandError, match="Invalid job state"):
        cli.queued_ids(states=["bogus"])
    assert ran(cli) == ["squeue -h -o %i", "squeue -h -t all -o %i",
                        "squeue -h -j 5 -t PD -o %i", "squeue -h -j 999 -o %i",
                        "squeue -h -t bogus -o %i"]


# ---------------------------------------------------------------- sacct
def test_accounting_of_given_jobs(cli: CliBackend) -> None:
    records = cli.accounting_jobs_by_id([5], all_users=True, allocations_only=True)
    assert len(records) == 12  # the stand-in prints the whole recording
    assert len(cli.accounting_jobs_by_id([8, 9])) == 12
    assert cli.accounting_jobs_by_id([]).raws == []  # nothing asked, nothing run
    # The release is asked once (it picks the --json option), then sacct twice.
    assert ran(cli) == ["scontrol --version", "sacct --allusers -X -j 5 --json",
                        "sacct -j 8,9 --json"]


# ---------------------------------------------------------------- the fake
def test_the_fake_counts_submissions_until_a_reset() -> None:
    fake = FakeSlurm(nodes=[NodeInfo("n1", frozenset({"IDLE"}), cpus_total=1)])
    a = fake.submit("#!/bin/sh\ntrue\n", ["--hold", "-o", "/dev/null"])
    b = fake.submit("#!/bin/sh\n#HET gpus=1\ntrue\n")
    assert fake.job(a).reason == "JobHeldUser"
    stats = fake.controller_stats()
    assert stats.rpc(SUBMIT_BATCH_RPC).count == 2 and stats.jobs_submitted == 2
    fake.reset_controller_stats()
    assert fake.controller_stats().rpc(SUBMIT_BATCH_RPC).count == 0
    assert fake.controller_stats().dbd_agent_queue_size == 0
    assert fake.queued_ids() == [str(a), str(b)]


def test_the_fake_queue_by_job_and_state() -> None:
    fake = FakeSlurm(jobs=[JobInfo(5, state="PENDING", array_job_id=5, array_task_spec="2-3"),
                           JobInfo(6, state="RUNNING", array_job_id=5, array_task_id=1),
                           JobInfo(7, state="RUNNING"), JobInfo(8, state="COMPLETED")])
    assert fake.queued_ids() == ["5_[2-3]", "5_1", "7"]
    assert fake.queued_ids(jobs=[5]) == ["5_[2-3]", "5_1"]
    assert fake.queued_ids(states=["PD"]) == ["5_[2-3]"]
    assert fake.queued_ids(states=["R", "completed"]) == ["5_1", "7", "8"]
    assert fake.queued_ids(states=["all"]) == ["5_[2-3]", "5_1", "7", "8"]
    assert fake.queued_ids(jobs=[999]) == []


def test_the_fake_accounting_of_given_jobs() -> None:
    fake = load_recorded(DATA)

    def ids(refs: list[int]) -> list[int]:
        records = fake.accounting_jobs_by_id(refs)
        return [records.decode(r).job_id for r in records.raws]

    assert ids([5]) == [13, 14]  # the array's id takes in its tasks
    assert ids([8, 9]) == [8, 9]
    assert ids([999]) == []


def test_a_backend_without_these_methods_says_so() -> None:
    class Minimal(FakeSlurm):
        name = "minimal"

    calls = {"controller_stats": (), "reset_controller_stats": (), "queued_ids": (),
             "submit_batch": ("#!/bin/sh\n",), "accounting_jobs_by_id": ([1],)}
    for method, args in calls.items():
        with pytest.raises(NotSupportedError, match="not supported by the 'minimal'"):
            getattr(SlurmBackend, method)(Minimal(), *args)
