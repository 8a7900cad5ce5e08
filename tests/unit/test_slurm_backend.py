"""get_backend and the CLI backend, with stand-in Slurm commands serving recordings."""

from __future__ import annotations

from pathlib import Path

import pytest
from _slurm_stubs import stub_backend

from hetslurm.errors import BackendError, CommandError
from hetslurm.slurm import get_backend
from hetslurm.slurm.backend import NodeStateChange, NotFoundError, Switches
from hetslurm.slurm.cli_backend import CliBackend
from hetslurm.slurm.units import GresItem

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"

# One stand-in for every Slurm CLI: logs SLURM_CONF and argv, prints a recording.
STUB = """#!/bin/sh
echo "$SLURM_CONF $(basename "$0") $*" >> "$HB_LOG"
case "$(basename "$0") $*" in
  "sinfo --json") cat "$HB_DATA/sinfo.json" ;;
  "squeue --json") cat "$HB_DATA/squeue.json" ;;
  "scontrol show job -d -o") cat "$HB_DATA/scontrol_show_job_d_o.txt" ;;
  "scontrol show job -d -o 7") cat "$HB_DATA/scontrol_show_job_7_d_o.txt" ;;
  "scontrol show job -d -o 999")
    echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  "scontrol show node -d -o gpu1") cat "$HB_DATA/scontrol_show_node_gpu1_d_o.txt" ;;
  "scontrol show node -d -o nope") cat "$HB_DATA/scontrol_show_node_missing.txt"; exit 1 ;;
  "scontrol show partition -o") cat "$HB_DATA/scontrol_show_partition_o.txt" ;;
  "scontrol --version") cat "$HB_DATA/scontrol_version.txt" ;;
  "sacctmgr show qos -P") cat "$HB_DATA/sacctmgr_show_qos_P.txt" ;;
  "sbatch --parsable"*) cat > "$HB_LOG.stdin"; echo "77" ;;
  "scontrol update JobId=1 "*) echo "Job is no longer pending execution for job 1" >&2; exit 1 ;;
  "scontrol "*|"scancel "*) ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


@pytest.fixture()
def backend(tmp_path: Path) -> CliBackend:
    return stub_backend(tmp_path, STUB,
                        ("sinfo", "squeue", "scontrol", "sacctmgr", "sbatch", "scancel"),
                        SLURM_CONF="/clusters/test/slurm.conf", HB_DATA=str(DATA),
                        HB_LOG=str(tmp_path / "log"))


def calls(backend: CliBackend) -> list[str]:
    return Path(backend.env["HB_LOG"]).read_text().splitlines()


def test_reads_use_the_given_slurm_conf(backend: CliBackend) -> None:
    assert len(backend.nodes()) == 5
    assert backend.version() == (22, 5, 8)
    assert all(c.startswith("/clusters/test/slurm.conf ") for c in calls(backend))


def test_jobs_take_indices_from_scontrol(backend: CliBackend) -> None:
    jobs = {j.display_id: j for j in backend.jobs()}
    assert jobs["7"].gres_on("gpu2") == {("gpu", "h100"): (1, 2)}
    assert jobs["8"].state == "COMPLETED"


def test_single_objects(backend: CliBackend) -> None:
    assert backend.node("gpu1").gres_used_indices == {("gpu", "a100"): (0, 1)}
    assert backend.job(7).admin_comment == "hetslurm: rewrote gpu-type"
    with pytest.raises(NotFoundError):
        backend.node("nope")
    with pytest.raises(NotFoundError):
        backend.job(999)
    assert [p.name for p in backend.partitions()][:2] == ["all", "gpu"]
    assert backend.qos()[1].name == "gpu_high"


def test_submit_sends_script_text_on_stdin(backend: CliBackend) -> None:
    assert backend.submit("#!/bin/bash\nsleep 1\n", ["-p", "gpu"]) == 77
    assert Path(backend.env["HB_LOG"] + ".stdin").read_text() == "#!/bin/bash\nsleep 1\n"


def test_changes_reach_scontrol(backend: CliBackend) -> None:
    backend.update_job(
        6,
        tres_per_node=[GresItem("gpu", "h100", 2)],
        features="h100|a100",
        prefer="h100",
        switches=Switches(1, 60),
        nodelist=["gpu2", "gpu1"],
    )
    backend.requeue(5, incomplete=True)
    backend.update_node("gpu1", NodeStateChange.DRAIN, "bad fan")
    log = "\n".join(calls(backend))
    assert "Gres=gpu:h100:2" in log and "Switches=1@00:01:00" in log
    assert "ReqNodeList=gpu[1-2]" in log
    assert "requeue Incomplete 5" in log
    assert "State=DRAIN Reason=bad fan" in log


def test_failed_update_carries_slurms_words(backend: CliBackend) -> None:
    with pytest.raises(CommandError, match="no longer pending") as info:
        backend.update_job(1, features="a100")
    assert info.value.failure.returncode == 1


def test_get_backend_choices() -> None:
    assert isinstance(get_backend("cli", env={"SLURM_CONF": "/x"}), CliBackend)
    with pytest.raises(BackendError, match="unknown Slurm backend"):
        get_backend("slurmrestd")


def test_pyslurm_chosen_explicitly_says_why_not(backend: CliBackend) -> None:
    # pyslurm is not installed here (PyPI builds only for Slurm 25.11).
    with pytest.raises(BackendError, match="pyslurm"):
        get_backend("pyslurm", env=dict(backend.env))


def test_auto_falls_back_to_the_cli(backend: CliBackend) -> None:
    chosen = get_backend("auto", env=dict(backend.env))
    assert chosen.name == "cli"
