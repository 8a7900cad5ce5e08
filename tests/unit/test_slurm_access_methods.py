"""The access layer's typed methods beyond nodes and jobs: the controller (config, ping,
reconfigure, node states), job chores (active ids, cancel, batch script, output files),
accounting (sacct records) and the accounting database (sacctmgr), each on the CLI backend
with stand-in commands; the parsers on recorded and 22.05-format output."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from _slurm_stubs import stub_backend

from hetslurm.act.output_mode import SlurmOutputProbe
from hetslurm.errors import CommandError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.slurm import Association, NotSupportedError, OutputFiles, get_backend, parse
from hetslurm.slurm.backend import NodeInfo, NotFoundError, SlurmBackend
from hetslurm.slurm.cli_backend import COMMANDS, CliBackend, missing_commands
from hetslurm.slurm.sacct import SacctDocumentError, SacctRecordError, parse_sacct_document

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"

# Output in Slurm 22.05.8's formats (the shape of each command's lines), small enough to read.
CONFIG = """Configuration data as of 2026-11-30T02:53:03
AccountingStorageType   = accounting_storage/slurmdbd
JobFileAppend           = 1
SchedulerParameters     = bf_max_job_test=100,bf_window=60
SLURM_CONF              = /clusters/test/slurm.conf

Cgroup Support Configuration:
JobFileAppend           = 0
"""
PING_UP = "Slurmctld(primary) at localhost is UP\n"
SINFO_STATES = "gpu1 mixed\ngpu2 idle\ngpu2 idle\ngpu3 drained\ngpu4 down*\n"
SQUEUE_IDS = "12\n13\n14\n"
SCRIPT = "#!/bin/bash\n#SBATCH --open-mode=append\nsleep 60\n"
ASSOC = "root||normal\nhetslurm||\nhetslurm|root|high,low,normal\nlvfast|alice|\n"

STUB = """#!/bin/sh
echo "$SLURM_CONF $(basename "$0") $*" >> "$HB_LOG"
case "$(basename "$0") $*" in
  "scontrol show config") printf '%s' "$HB_CONFIG" ;;
  "scontrol ping") if [ -n "$HB_DOWN" ]; then
      echo "Slurmctld(primary) at localhost is DOWN"; exit 1; fi; printf '%s' "$HB_PING" ;;
  "scontrol reconfigure") ;;
  "sinfo -h -N -o %N %T") printf '%s' "$HB_SINFO" ;;
  "squeue -h -o %A") printf '%s' "$HB_SQUEUE" ;;
  "scancel "*) echo "scancel: error: Kill job error on job id 13: Job/step already" \
    "completing or completed" >&2; exit 1 ;;
  "scontrol write batch_script 7 -") printf '%s' "$HB_SCRIPT" ;;
  "scontrol write batch_script 999 -"|"scontrol show job -o 999")
    echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  "scontrol show job -o 7") cat "$HB_DATA/scontrol_show_job_7_d_o.txt" ;;
  "sacct --allusers --duplicates -S "*" --json") cat "$HB_DATA/sacct.json" ;;
  "sacctmgr -n -P show cluster format=cluster") echo hetdemo ;;
  "sacctmgr -n -P show account format=account") printf 'hetslurm\\nroot\\n' ;;
  "sacctmgr -n -P show assoc cluster=hetdemo format=account,user,qos") printf '%s' "$HB_ASSOC" ;;
  "sacctmgr -i -n -P add cluster hetdemo")
    echo " This cluster hetdemo already exists.  Not adding."; exit 1 ;;
  "sacctmgr -i -n -P add qos broken"*) echo " Unknown option: Bogus=1" >&2; exit 1 ;;
  "sacctmgr -i "*) echo " Done" ;;
  "scontrol --version") echo "slurm 22.05.8" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


@pytest.fixture()
def cli(tmp_path: Path) -> CliBackend:
    return stub_backend(tmp_path, STUB, COMMANDS,
                        SLURM_CONF="/clusters/test/slurm.conf", HB_DATA=str(DATA),
                        HB_LOG=str(tmp_path / "log"), HB_CONFIG=CONFIG, HB_PING=PING_UP,
                        HB_SINFO=SINFO_STATES, HB_SQUEUE=SQUEUE_IDS, HB_SCRIPT=SCRIPT,
                        HB_ASSOC=ASSOC)


def ran(b: CliBackend) -> list[str]:
    """The commands run, without the SLURM_CONF each was given (checked once below)."""
    lines = Path(b.env["HB_LOG"]).read_text().splitlines()
    assert all(ln.startswith("/clusters/test/slurm.conf ") for ln in lines)
    return [ln.split(" ", 1)[1] for ln in lines]


# ---------------------------------------------------------------- the controller
def test_config_ping_reconfigure_node_states(cli: CliBackend) -> None:
    config = cli.config()
    assert config["JobFileAppend"] == "1"  # the main section wins over cgroup's
    assert config["SchedulerParameters"] == "bf_max_job_test=100,bf_window=60"
    assert cli.ping() is None
    cli.reconfigure()
    assert cli.node_states() == {"gpu1": "mixed", "gpu2": "idle", "gpu3": "drained",
                                 "gpu4": "down*"}
    assert ran(cli) == ["scontrol show config", "scontrol ping", "scontrol reconfigure",
                        "sinfo -h -N -o %N %T"]


def test_ping_says_why_the_controller_does_not_answer(cli: CliBackend) -> None:
    down = CliBackend({**cli.env, "HB_DOWN": "1"})
    assert down.ping() == "Slurmctld(primary) at localhost is DOWN"


# ---------------------------------------------------------------- job chores
def test_active_ids_cancel_script_and_output_files(cli: CliBackend) -> None:
    assert cli.active_job_ids() == [12, 13, 14]
    cli.cancel_jobs([12, 13, "14_1"])  # one already ended: not an error
    cli.cancel_jobs([])  # nothing to run
    assert cli.batch_script(7) == SCRIPT
    assert cli.job_output_files(7) == OutputFiles("/tmp/hb-cluster/jobs/slurm-7.out",
                                                  "/tmp/hb-cluster/jobs/slurm-7.out")
    with pytest.raises(NotFoundError):
        cli.batch_script(999)
    with pytest.raises(NotFoundError):
        cli.job_output_files(999)
    assert ran(cli)[:4] == ["squeue -h -o %A", "scancel 12 13 14_1",
                            "scontrol write batch_script 7 -", "scontrol show job -o 7"]


def test_output_files_from_scontrol_text() -> None:
    line = (DATA / "scontrol_show_job_7_d_o.txt").read_text()
    assert parse.parse_job_output_files(line).stdout == "/tmp/hb-cluster/jobs/slurm-7.out"
    # A job name holding "StdOut=/dev/null" makes the field ambiguous: unknown, not /dev/null.
    forged = line.replace("JobName=pref", "JobName=x StdOut=/dev/null", 1)
    assert parse.parse_job_output_files(forged) == OutputFiles(
        None, "/tmp/hb-cluster/jobs/slurm-7.out")
    assert parse.parse_job_output_files("") == OutputFiles()


def test_output_probe_reads_through_the_backend() -> None:
    fake = FakeSlurm(nodes=[NodeInfo("n1", frozenset({"IDLE"}), cpus_total=4)])
    a = fake.submit("#!/bin/sh\n#SBATCH --open-mode=append\ntrue\n")
    d = fake.submit("#!/bin/sh\ntrue\n", ["-o", "/dev/null", "-e", "/dev/null"])
    u = fake.submit("#!/bin/sh\ntrue\n")
    probe = SlurmOutputProbe(backend=fake)
    assert [probe(str(j)) for j in (a, d, u, 999)] == ["append", "discarded", "unknown",
                                                        "unknown"]
    fake.config_values["JobFileAppend"] = "1"
    assert SlurmOutputProbe(backend=fake)(str(u)) == "append"


# ---------------------------------------------------------------- accounting
def test_accounting_jobs_run_sacct_and_decode_the_recording(cli: CliBackend) -> None:
    since = datetime(2026, 11, 30, 1, 0, 0).timestamp()
    records = cli.accounting_jobs(since, since + 3600)
    jobs = [records.decode(r) for r in records.raws]
    assert len(records) == 12 and [j.job_id for j in jobs][:3] == [1, 2, 3]
    assert all(j.time.submission for j in jobs)
    assert ran(cli) == ["scontrol --version",
                        "sacct --allusers --duplicates -S 2026-11-30T01:00:00 "
                        "-E 2026-11-30T02:00:00 --json"]
    assert [r["job_id"] for r in records.plain()][:3] == [1, 2, 3]


def test_sacct_documents_refused_whole_and_records_one_by_one() -> None:
    with pytest.raises(SacctDocumentError, match="not a JSON object"):
        parse_sacct_document("sacct: error: slurmdbd not responding")
    with pytest.raises(SacctDocumentError, match=r"schema 'openapi/v0\.0\.39'"):
        parse_sacct_document('{"meta": {"plugin": {"type": "openapi/v0.0.39"}}, "jobs": []}')
    records = parse_sacct_document('{"jobs": [{"job_id": "x", "time": {}}]}')
    with pytest.raises(SacctRecordError, match="job_id"):
        records.decode(records.raws[0])


# ---------------------------------------------------------------- the accounting database
def test_sacctmgr_reads(cli: CliBackend) -> None:
    assert cli.clusters() == ["hetdemo"]
    assert cli.accounts() == ["hetslurm", "root"]
    assert cli.associations("hetdemo") == [
        Association("root", None, frozenset({"normal"})),
        Association("hetslurm", None, frozenset()),
        Association("hetslurm", "root", frozenset({"high", "low", "normal"})),
        Association("lvfast", "alice", frozenset()),
    ]


def test_sacctmgr_changes(cli: CliBackend) -> None:
    cli.add_cluster("hetdemo", exist_ok=True)  # exists: fine when asked so
    with pytest.raises(CommandError, match="already exists"):
        cli.add_cluster("hetdemo")
    cli.add_account("hetslurm", "hetdemo", description="hetslurm testbed",
                    organization="hetslurm")
    cli.add_user("root", "hetslurm", "hetdemo")
    cli.set_user_qos("root", ["high", "normal"], "normal")
    cli.add_qos("lvtrain", {"Priority": "10", "MaxWall": "1-00:00:00"}, description="train")
    cli.modify_qos("lvtrain", {"MaxTRESPerUser": "gres/gpu:h100=-1"})
    cli.modify_qos("lvtrain", {})  # nothing to change: nothing run
    cli.delete_qos("lvtrain")
    cli.grant_qos("lvtrain", "user", "alice", "hetdemo", account="lvfast")
    cli.grant_qos("lvtrain", "account", "lvfast", "hetdemo", revoke=True)
    with pytest.raises(ValueError, match="user"):
        cli.grant_qos("lvtrain", "group", "x", "hetdemo")
    with pytest.raises(CommandError, match="Unknown option"):
        cli.add_qos("broken", {"Bogus": "1"})
    assert ran(cli) == [
        "sacctmgr -i -n -P add cluster hetdemo",
        "sacctmgr -i -n -P add cluster hetdemo",
        "sacctmgr -i -n -P add account hetslurm Cluster=hetdemo Description=hetslurm testbed "
        "Organization=hetslurm",
        "sacctmgr -i -n -P add user root Account=hetslurm Cluster=hetdemo",
        "sacctmgr -i -n -P modify user root set QOS=high,normal DefaultQOS=normal",
        "sacctmgr -i -n -P add qos lvtrain Priority=10 MaxWall=1-00:00:00 Description=train",
        "sacctmgr -i -n -P modify qos where name=lvtrain set MaxTRESPerUser=gres/gpu:h100=-1",
        "sacctmgr -i -n -P delete qos where name=lvtrain",
        "sacctmgr -i -n -P modify user where name=alice cluster=hetdemo account=lvfast set "
        "qos+=lvtrain",
        "sacctmgr -i -n -P modify account where name=lvfast cluster=hetdemo set qos-=lvtrain",
        "sacctmgr -i -n -P add qos broken Bogus=1",
    ]


# ---------------------------------------------------------------- support and commands
def test_a_backend_without_a_method_says_so() -> None:
    class Minimal(FakeSlurm):
        name = "minimal"

    for method in ("config", "ping", "reconfigure", "node_states", "active_job_ids"):
        with pytest.raises(NotSupportedError, match="not supported by the 'minimal'"):
            getattr(SlurmBackend, method)(Minimal())


def test_missing_commands_looks_on_the_given_path(cli: CliBackend) -> None:
    assert missing_commands(cli.env) == []
    assert missing_commands({"PATH": "/nonexistent"}) == list(COMMANDS)


def test_get_backend_cli_carries_the_env(cli: CliBackend) -> None:
    b = get_backend("cli", cli.env)
    assert b.config()["SLURM_CONF"] == "/clusters/test/slurm.conf"
