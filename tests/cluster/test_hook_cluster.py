"""The job_submit hook on the real slurmctld of the testbed (Slurm 22.05, job_submit/lua).

`testbed up` installs the hook rendered from site-configs/demo.toml. Each test submits with
#HET directives through sbatch, srun or salloc and checks what `scontrol show job` shows and
where the job ran.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster_helpers import Jobs

from hetslurm.hook.install import check_hook, install_text, set_installed_mode
from hetslurm.hook.render import render_hook
from hetslurm.process import run_command
from hetslurm.site import Site
from hetslurm.testbed import Testbed

DEMO_FILE = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
H100 = {"gpu1", "gpu2"}
A100 = {"gpu3", "gpu4"}
CPU = {"cpu1", "cpu2", "cpu3", "cpu4"}


def show(jobs: Jobs, job_id: str) -> dict[str, str]:
    out = run_command(["scontrol", "show", "job", "-o", job_id], timeout=30, env=jobs.env).stdout
    fields: dict[str, str] = {}
    # AdminComment holds spaces only if others put them there; split on " Key=".
    for m in re.finditer(r"(?:^|\s)([A-Za-z/:_]+)=(.*?)(?=\s[A-Za-z/:_]+=|$)", out.strip()):
        fields.setdefault(m.group(1), m.group(2))
    fields["_raw"] = out
    return fields


def sbatch(jobs: Jobs, tmp_path: Path, text: str, *args: str, check: bool = True
           ) -> tuple[str | None, str]:
    path = tmp_path / f"job{time.monotonic_ns()}.sh"
    path.write_text(text)
    res = run_command(["sbatch", "--parsable", "-o", "/dev/null", *args, str(path)], timeout=60,
                      env=jobs.env, check=False)
    if res.returncode != 0:
        if check:
            raise AssertionError(res.stderr)
        return None, res.stderr
    job_id = res.stdout.strip().split(";")[0]
    jobs.ids.append(job_id)
    return job_id, res.stderr


def running_on(jobs: Jobs, job_id: str) -> set[str]:
    jobs.wait_state(job_id, {"RUNNING", "COMPLETED"}, timeout=60)
    nodelist = show(jobs, job_id)["NodeList"]
    out = run_command(["scontrol", "show", "hostnames", nodelist], timeout=30, env=jobs.env)
    return set(out.stdout.split())


def record(fields: dict[str, str]) -> str:
    m = re.search(r"AdminComment=.*?(hetslurm:\{[^}]*\})", fields["_raw"])
    assert m, fields["_raw"]
    return m.group(1)


@pytest.fixture
def hook_restored(testbed: Testbed, demo_site: Site) -> Iterator[Path]:
    """Tests that replace the hook get it back (validated and with a newer mtime) after."""
    yield testbed.etc
    install_text(render_hook(demo_site, slurm=testbed.slurm_release).text, testbed.etc)


def test_sbatch_class_train_lands_on_a_gpu_node(jobs: Jobs, tmp_path: Path) -> None:
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=2 class=train\nsleep 30\n")
    assert job_id
    f = show(jobs, job_id)
    # Submitted to the class's per-model partitions in its order; Slurm shows the one it
    # runs in once it starts (docs/fallback.md).
    assert f["Partition"] in ("gpu_h100,gpu_a100", "gpu_h100", "gpu_a100")
    assert f["Features"] == "h100|a100"
    assert f["TresPerNode"] == f"{jobs.gres}gpu:2"
    rec = record(f)
    assert '"class":"train"' in rec and '"set":"tres_per_node,features,partition"' in rec
    assert running_on(jobs, job_id) <= H100 | A100


def test_sbatch_single_model_is_typed_gres(jobs: Jobs, tmp_path: Path) -> None:
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=1 gpu-type=a100 no-requeue\n"
                       "sleep 30\n")
    assert job_id
    f = show(jobs, job_id)
    assert f["TresPerNode"] == f"{jobs.gres}gpu:a100:1"
    assert f["Requeue"] == "0"
    assert f["Features"] == "(null)"
    assert running_on(jobs, job_id) <= A100


def test_sbatch_cpu_and_fpga_classes(jobs: Jobs, tmp_path: Path) -> None:
    io, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET class=io cores=2\nsleep 30\n")
    fpga, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET fpga=1 class=stream\nsleep 30\n")
    assert io and fpga
    f = show(jobs, io)
    assert (f["Partition"], f["Features"], f["MinCPUsNode"]) == ("cpu", "cpu", "2")
    assert running_on(jobs, io) <= CPU
    g = show(jobs, fpga)
    assert (g["Partition"], g["TresPerNode"]) == ("fpga", f"{jobs.gres}fpga:u280:1")
    assert running_on(jobs, fpga) == {"fpga1"}


def test_sbatch_switch_and_binding(jobs: Jobs, tmp_path: Path) -> None:
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET nodes=2 gpus-per-node=1 gpu-type=h100 "
                       "locality=switch:required,nvlink:required switch-wait=2m\nsleep 30\n")
    assert job_id
    f = show(jobs, job_id)
    assert f["Switches"] == "1@00:02:00"
    assert f["NumNodes"].startswith("2")
    assert f["TresPerNode"] == f"{jobs.gres}gpu:h100:1"
    assert running_on(jobs, job_id) == H100


def cpu_ids(jobs: Jobs, job_id: str) -> tuple[str, set[int]]:
    """The node and Slurm's abstract CPU ids of a running one-node job (scontrol -d)."""
    jobs.wait_state(job_id, {"RUNNING"}, timeout=60)
    out = run_command(["scontrol", "show", "job", "-d", job_id], timeout=30, env=jobs.env).stdout
    m = re.search(r"Nodes=(\S+) CPU_IDs=(\S+)", out)
    assert m, out
    ids: set[int] = set()
    for part in m.group(2).split(","):
        lo, _, hi = part.partition("-")
        ids.update(range(int(lo), int(hi or lo) + 1))
    return m.group(1), ids


def test_numa_required_cpu_job_gets_one_socket(jobs: Jobs, tmp_path: Path) -> None:
    # The demo's CPU nodes have 2 sockets x 4 cores; Slurm numbers abstract CPUs socket by
    # socket (0-3 socket 0, 4-7 socket 1). Two cores of socket 0 are taken first, so a
    # 4-core job can only stay on one socket by taking socket 1 whole.
    node = "cpu2"
    busy = jobs.sbatch("-w", node, "-p", "cpu", "-c", "2", script="sleep 60")
    busy_node, busy_ids = cpu_ids(jobs, busy)
    assert busy_node == node and busy_ids <= {0, 1, 2, 3}
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET class=io cores=4 "
                       "locality=numa:required\nsleep 60\n", "-w", node)
    assert job_id
    f = show(jobs, job_id)
    assert f["Socks/Node"] == "1" and f["ReqB:S:C:T"] == "0:0:4:*"
    assert "sockets_per_node,cores_per_socket" in f["AdminComment"]
    got_node, ids = cpu_ids(jobs, job_id)
    assert got_node == node
    assert ids == {4, 5, 6, 7}, f"the numa job spans sockets: CPU_IDs {sorted(ids)}"


def test_explain_live_state_matches_where_the_job_runs(jobs: Jobs, tmp_path: Path,
                                                       slurm_env: dict[str, str]) -> None:
    # Fill every H100 GPU, so the class's first model is busy and only A100 nodes can take
    # the job now; explain with live state must say so before the job is submitted.
    for node in sorted(H100):
        jobs.wait_state(jobs.sbatch("-w", node, "-p", "gpu", "--gres=gpu:h100:8",
                                    script="sleep 120"), {"RUNNING"}, timeout=60)
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/sh\n#HET gpus=2 class=train\nsleep 60\n")
    env = {**os.environ, **slurm_env}
    # cwd away from the checkout: `python -m` puts the cwd first on sys.path, and the source
    # tree of a fresh clone has no compiled core (the installed package has).
    out = run_command([sys.executable, "-m", "hetslurm", "explain", str(script), "--site",
                       str(DEMO_FILE), "--state", "live", "--format", "json"], timeout=120,
                      env=env, cwd=tmp_path).stdout
    doc = json.loads(out)
    assert doc["outcome"] == "rewritten"
    assert doc["placement"] is not None, doc.get("placement_note")
    predicted = set(doc["placement"]["nodes"])
    assert doc["placement"]["placeable"] and predicted and predicted <= A100, doc["placement"]
    job_id, _ = sbatch(jobs, tmp_path, script.read_text())
    assert job_id
    assert running_on(jobs, job_id) <= A100


def test_energy_low_one_answer_from_explain_place_and_the_hook(jobs: Jobs, tmp_path: Path,
                                                             slurm_env: dict[str, str]
                                                             ) -> None:
    """Issue 19: both A100 nodes busy, the H100 nodes idle, `#HET gpus=1 energy=low`. The hook
    writes an A100 gres; explain and place (live state) say it cannot start now and never
    name an H100 node; the job waits, and runs on the A100 node that frees."""
    fillers = {node: jobs.sbatch("-w", node, "-p", "gpu", "--gres=gpu:a100:8",
                                 script="sleep 300") for node in sorted(A100)}
    for f in fillers.values():
        jobs.wait_state(f, {"RUNNING"}, timeout=60)
    script = tmp_path / "low.sh"
    script.write_text("#!/bin/sh\n#HET gpus=1 energy=low\nsleep 60\n")
    env = {**os.environ, **slurm_env}

    def hetslurm(*args: str) -> dict:
        return json.loads(run_command([sys.executable, "-m", "hetslurm", *args, "--site",
                                       str(DEMO_FILE), "--state", "live", "--format", "json"],
                                      timeout=120, env=env, cwd=tmp_path).stdout)

    ex = hetslurm("explain", str(script))
    writes = {w["field"]: w["value"] for w in ex["writes"]}
    assert writes["tres_per_node"] == f"{jobs.gres}gpu:a100:1", writes
    assert ex["placement"] is not None, ex.get("placement_note")
    assert not ex["placement"]["placeable"], ex["placement"]
    assert not set(ex["placement"]["nodes"]) & H100
    pl = hetslurm("place", "--request", "gpus=1 energy=low")
    assert not pl["placeable"] and not set(pl.get("nodes") or []) & H100, pl
    job_id, _ = sbatch(jobs, tmp_path, script.read_text())
    assert job_id
    time.sleep(3)
    assert show(jobs, job_id)["JobState"] == "PENDING"  # H100 idle, the job waits for an A100
    run_command(["scancel", fillers["gpu4"]], timeout=30, env=jobs.env)
    assert running_on(jobs, job_id) == {"gpu4"}


def test_priority_high_outranks_normal(jobs: Jobs, tmp_path: Path) -> None:
    # priority=high puts the job in QOS "high" (priority 1000); the rendered
    # PriorityWeightQOS makes that count in multifactor priority. --begin keeps both pending
    # (a held job's priority is 0).
    hi, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=1 class=train priority=high\ntrue\n",
                   "--begin=now+3600")
    lo, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=1 class=train\ntrue\n",
                   "--begin=now+3600")
    assert hi and lo
    out = run_command(["squeue", "-h", "-j", f"{hi},{lo}", "-o", "%i %q %Q"], timeout=30,
                      env=jobs.env).stdout
    rows = {r.split()[0]: r.split()[1:] for r in out.strip().splitlines()}
    assert rows[hi][0] == "high" and rows[lo][0] == "normal"
    assert int(rows[hi][1]) >= int(rows[lo][1]) + 50_000, rows


def test_explicit_option_wins_and_user_is_told(jobs: Jobs, tmp_path: Path) -> None:
    job_id, err = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=1 class=train\nsleep 30\n",
                         "--partition=batch")
    assert job_id
    assert "#HET line 2: --partition=batch kept over class=train's partition gpu" in err
    f = show(jobs, job_id)
    assert f["Partition"] == "batch" and f["Features"] == "h100|a100"


def test_rejected_job_shows_the_message(jobs: Jobs, tmp_path: Path) -> None:
    job_id, err = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=2 gpu-type=a10\ntrue\n",
                         check=False)
    assert job_id is None
    assert ("sbatch: error: #HET line 2: gpu-type: GPU model 'a10' is not in site 'hetdemo' "
            "(did you mean 'a100'?); its GPU models: h100, a100") in err
    assert "Invalid generic resource (gres) specification" in err


def test_srun_with_comment_runs_on_the_class(jobs: Jobs) -> None:
    res = run_command(["srun", "--comment=het: class=io", "printenv", "SLURMD_NODENAME"],
                      timeout=120, env=jobs.env)
    assert res.stdout.strip() in CPU
    res = run_command(["srun", "--comment=het: gpus=1 gpu-type=a100", "printenv",
                       "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES"], timeout=120, env=jobs.env)
    node, devices = res.stdout.split()
    assert node in A100 and devices == "0"


def test_srun_rejection_on_stderr(jobs: Jobs) -> None:
    res = run_command(["srun", "--comment=het: gpus=lots", "true"], timeout=120, env=jobs.env,
                      check=False)
    assert res.returncode != 0
    assert ("--comment het:: 'gpus=lots': GPUs per job must be a whole number from 0 to 65536"
            in res.stderr)


def test_salloc_with_comment(jobs: Jobs) -> None:
    res = run_command(["salloc", "--no-shell", "--comment=het: fpga=u280", "--time=5"],
                      timeout=120, env=jobs.env)
    m = re.search(r"Granted job allocation (\d+)", res.stderr)
    assert m, res.stderr
    jobs.ids.append(m.group(1))
    f = show(jobs, m.group(1))
    assert f["TresPerNode"] == f"{jobs.gres}fpga:u280:1"
    assert f["NodeList"] == "fpga1"


def test_array_tasks_all_rewritten(jobs: Jobs, tmp_path: Path) -> None:
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET class=io\nsleep 30\n", "--array=0-2")
    assert job_id
    time.sleep(2)
    out = run_command(["squeue", "-h", "-j", job_id, "-o", "%i %P %f %N"], timeout=30,
                      env=jobs.env).stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    assert len(rows) >= 1
    for row in rows:
        assert row[1] == "cpu" and row[2] == "cpu"
    tasks = [r[0] for r in rows if "_" in r[0] and "[" not in r[0]]
    for task in tasks:
        assert running_on(jobs, task) <= CPU


def test_het_job_components(jobs: Jobs, tmp_path: Path) -> None:
    text = ("#!/bin/sh\n#HET class=io\n#SBATCH hetjob\n"
            "#SBATCH --comment=\"het: gpus=1 gpu-type=h100\"\nsleep 30\n")
    job_id, _ = sbatch(jobs, tmp_path, text)
    assert job_id
    first, second = show(jobs, f"{job_id}+0"), show(jobs, f"{job_id}+1")
    assert (first["Partition"], first["Features"]) == ("cpu", "cpu")
    assert second["TresPerNode"] == f"{jobs.gres}gpu:h100:1"
    assert running_on(jobs, f"{job_id}+0") <= CPU
    assert running_on(jobs, f"{job_id}+1") <= H100


def test_scontrol_update_cannot_undo_the_rewrite(jobs: Jobs, tmp_path: Path) -> None:
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpus=1 class=train\nsleep 30\n",
                       "--hold")
    assert job_id
    res = run_command(["scontrol", "update", f"job={job_id}", "Features=a100"], timeout=30,
                      env=jobs.env, check=False)
    assert res.returncode != 0 and "Access/permission denied" in res.stderr
    assert show(jobs, job_id)["Features"] == "h100|a100"
    # Fields the hook did not write stay editable.
    run_command(["scontrol", "update", f"job={job_id}", "TimeLimit=10"], timeout=30,
                env=jobs.env)
    assert show(jobs, job_id)["TimeLimit"] == "00:10:00"


def test_broken_script_keeps_the_previous_one(jobs: Jobs, tmp_path: Path, testbed: Testbed,
                                              hook_restored: Path) -> None:
    target = hook_restored / "job_submit.lua"
    good_build = check_hook(hook_restored)["installed_build"]
    # A broken job_submit.lua deployed by mistake (not through `hook install`).
    target.write_text("this is not lua (\n")
    later = int(time.time()) + 2
    import os

    os.utime(target, (later, later))
    job_id, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET class=io\nsleep 30\n")
    assert job_id
    f = show(jobs, job_id)
    assert (f["Partition"], f["Features"]) == ("cpu", "cpu")  # the previous hook ran
    log = (testbed.root / "log" / "slurmctld.log").read_text(errors="replace")
    assert "using previous script" in log
    status = check_hook(hook_restored, testbed.root / "log" / "slurmctld.log")
    assert status["loads"] is False and status["running_build"] == good_build


def test_kill_switch_and_shadow_on_the_controller(jobs: Jobs, tmp_path: Path, testbed: Testbed,
                                                  hook_restored: Path) -> None:
    for mode in ("off", "shadow"):
        set_installed_mode(hook_restored, mode)
        job_id, _err = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET class=io\nsleep 30\n")
        assert job_id
        f = show(jobs, job_id)
        assert f["Partition"] == "batch" and f["Features"] == "(null)", mode
        rejected, _ = sbatch(jobs, tmp_path, "#!/bin/sh\n#HET gpu=1\ntrue\n")
        assert rejected  # neither off nor shadow rejects
    log = (testbed.root / "log" / "slurmctld.log").read_text(errors="replace")
    assert "hetslurm shadow: " in log
    status = check_hook(hook_restored, testbed.root / "log" / "slurmctld.log")
    assert status["in_sync"] and status["running_mode"] == "shadow"
