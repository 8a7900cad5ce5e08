"""requeue-stalled on the real testbed: a batch of jobs gives exactly the intended actions.

Utilization is synthetic (samples built for the live job ids, the way the collector would
attribute them); the clock the policy sees is two minutes ahead, so jobs a few seconds old
count as past the window. Everything Slurm-side is real: the decision reads squeue and
scontrol, the actions are ``scontrol requeue Incomplete``, and the checks read Slurm back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from pathlib import Path

import pytest
from _cluster_helpers import Jobs

from hetslurm.act.log import ActionLog
from hetslurm.act.output_mode import SlurmOutputProbe
from hetslurm.act.run import StallRequest, requeue_stalled
from hetslurm.act.stall import Context, execute, plan
from hetslurm.errors import HetslurmError
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.site.schema import Stall, Usage
from hetslurm.slurm.cli_backend import CliBackend
from hetslurm.slurm.run import run_command
from hetslurm.testbed import Testbed

AHEAD_S = 120.0
WINDOW_S = 60
HOSTILE_X = Path(f"/tmp/hetslurm-act-x-{os.getpid()}")


def sbatch_script(jobs: Jobs, script: str, *args: str) -> str:
    res = run_command(["sbatch", "--parsable", *args], timeout=60, env=jobs.env, input=script)
    job_id = res.stdout.strip().split(";")[0]
    jobs.ids.append(job_id)
    return job_id


def samples_for(util: dict[int, float], now: float):  # -> pandas.DataFrame
    import pandas as pd

    rows = []
    t = now - WINDOW_S
    while t < now:
        for jid, u in util.items():
            rows.append({"time": t, "node": "gpu1", "minor": 0, "job_id": jid,
                         "utilization_pct": u, "memory_used_mib": 10.0, "status": "ok",
                         "interval_s": 5.0})
        t += 5.0
    return pd.DataFrame(rows).astype({"job_id": "Int64"})


def snapshot(env: dict[str, str], ids: list[str]) -> tuple[str, str]:
    shown = run_command(["scontrol", "show", "job", "-o"], timeout=30, env=env).stdout
    mine = sorted(line for line in shown.splitlines()
                  if any(f"JobId={i} " in line or f"ArrayJobId={i} " in line for i in ids))
    # RunTime ticks every second; everything else must stand still.
    text = "\n".join(re.sub(r"RunTime=\S+", "", line) for line in mine)
    acct = run_command(["sacct", "-n", "-P", "-j", ",".join(ids), "-o",
                        "JobID,State,Submit,Start,End,Restart"], timeout=30,
                       env=env, check=False).stdout
    return text, acct


def test_requeue_stalled_batch(jobs: Jobs, slurm_env: dict[str, str], tmp_path: Path) -> None:
    existed = Path("/tmp/x").exists()
    gpu = ("-p", "gpu", "--gres=gpu:1", "-o", "/dev/null")
    busy = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    idle = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    exempt = jobs.sbatch("-p", "batch", "--gres=gpu:1", "-o", "/dev/null", "--requeue",
                         script="sleep 300")
    norequeue = jobs.sbatch(*gpu, "--no-requeue", script="sleep 300")
    array = jobs.sbatch(*gpu, "--requeue", "--array=0-1", script="sleep 300")
    finishing = jobs.sbatch(*gpu, "--requeue", script="sleep 6")
    hostile = jobs.sbatch(*gpu, "--requeue", "-J", f";$(touch {HOSTILE_X})",
                          "--comment", f"`touch {HOSTILE_X}` --help", script="sleep 300")
    truncating = sbatch_script(jobs, "#!/bin/sh\nsleep 300\n", *gpu[:4], "--requeue",
                               "-o", str(tmp_path / "out-%j.txt"))
    appending = sbatch_script(jobs, "#!/bin/sh\n#SBATCH --open-mode=append\nsleep 300\n",
                              *gpu[:4], "--requeue", "-o", str(tmp_path / "app-%j.txt"))
    # An interactive allocation (BatchFlag=0): Slurm cannot requeue it; cancel after warning.
    granted = run_command(["salloc", "--no-shell", "-p", "gpu", "--gres=gpu:1", "-t", "5",
                           "-J", "interactive"], timeout=60, env=jobs.env)
    interactive = re.findall(r"Granted job allocation (\d+)", granted.stderr + granted.stdout)[0]
    jobs.ids.append(interactive)
    ids = [busy, idle, exempt, norequeue, array, finishing, hostile, truncating, appending,
           interactive]
    for j in [busy, idle, exempt, norequeue, f"{array}_0", f"{array}_1", finishing, hostile,
              truncating, appending, interactive]:
        jobs.wait_state(j, {"RUNNING"}, timeout=60)

    backend = CliBackend(slurm_env)
    probe = SlurmOutputProbe(slurm_env)
    by_ref = {j.display_id: j.job_id for j in backend.jobs()}
    util = {by_ref[r]: 0.0 for r in (idle, exempt, norequeue, f"{array}_1", finishing,
                                      hostile, truncating, appending, interactive)}
    util[by_ref[busy]] = 70.0
    util[by_ref[f"{array}_0"]] = 70.0
    log = ActionLog(tmp_path / "actions.jsonl")
    ctx = Context(stall=Stall(window_s=WINDOW_S, grace_after_start_s=0, warning_grace_s=0,
                              exempt_partitions=("batch",), verify_timeout_s=20,
                              non_batch_action="cancel",
                              action_log=str(log.path), lock_file=str(tmp_path / "lock")),
                  usage=Usage())

    # Dry run: Slurm is unchanged (scontrol and sacct), the log is not written.
    before = snapshot(slurm_env, ids)
    t1 = time.time() + AHEAD_S
    dry = plan(backend, samples_for(util, t1), ctx, now=t1, log=log, output_probe=probe)
    assert snapshot(slurm_env, ids) == before
    assert not log.path.exists()
    got = {d.job: (d.rule, d.action) for d in dry}
    want_first = {
        busy: ("not-idle", "none"), idle: ("idle", "warn"),
        exempt: ("exempt-partition", "none"), norequeue: ("no-requeue", "none"),
        f"{array}_0": ("not-idle", "none"), f"{array}_1": ("idle", "warn"),
        finishing: ("idle", "warn"), hostile: ("idle", "warn"),
        truncating: ("output-not-append", "notify"), appending: ("idle", "warn"),
        interactive: ("non-batch", "warn"),
    }
    assert {k: got[k] for k in want_first} == want_first

    # First applied run: warnings only.
    first = execute(backend, dry, ctx, log, now=t1, output_probe=probe)
    assert {o.job for o in first if o.result == "warned"} == {
        idle, f"{array}_1", finishing, hostile, appending, interactive}
    jobs.wait_state(finishing, {"COMPLETED"}, timeout=30)

    # Second run, one second later on the policy's clock: the warned jobs are acted on.
    t2 = t1 + 1
    second_plan = plan(backend, samples_for(util, t2), ctx, now=t2, log=log,
                       output_probe=probe)
    # The finishing job ended after the first decision: decided again it is gone, and acting
    # on the first decision is refused by the re-check.
    stale = [d for d in dry if d.job == finishing]
    out = {o.job: o for o in execute(backend, second_plan + [
        dataclasses.replace(d, action="requeue") for d in stale],
        ctx, log, now=t2, output_probe=probe)}
    for j in (idle, f"{array}_1", hostile, appending):
        assert out[j].result == "done", (j, out[j])
        assert jobs.field(j, "Restarts") == "1"
        assert jobs.field(j, "JobState") == "PENDING"
    assert out[interactive].result == "done"
    assert jobs.field(interactive, "JobState") == "CANCELLED"
    assert out[finishing].result == "skipped"
    for j in (busy, exempt, norequeue, f"{array}_0", truncating):
        assert jobs.field(j, "Restarts") == "0", j
        assert jobs.field(j, "JobState") == "RUNNING", j
    assert jobs.field(finishing, "JobState") == "COMPLETED"
    # requeue Incomplete on a finished job never re-runs it.
    # Slurm may refuse outright or accept and do nothing; either way it must not run again.
    with contextlib.suppress(HetslurmError):
        backend.requeue(finishing, incomplete=True)
    assert jobs.field(finishing, "JobState") == "COMPLETED"
    assert jobs.field(finishing, "Restarts") == "0"

    # Hostile strings went through untouched, nothing executed.
    assert not HOSTILE_X.exists()
    assert Path("/tmp/x").exists() == existed
    names = {e["job"]: e["name"] for e in log.entries("decision")}
    assert names[hostile] == f";$(touch {HOSTILE_X})"
    assert all(json.loads(json.dumps(e)) for e in log.entries())


@pytest.fixture(autouse=True)
def _no_leftover_marker() -> None:
    HOSTILE_X.unlink(missing_ok=True)


def test_collector_samples_drive_the_decision(jobs: Jobs, slurm_env: dict[str, str],
                                              testbed: Testbed, tmp_path: Path) -> None:
    """The metrics path end to end: fake NVML -> collector -> store -> requeue-stalled.

    Three jobs on gpu2: busy, idle, and idle on a GPU in MIG mode (unknown, never idle).
    Only the idle one is warned and then requeued.
    """
    gres = load_gres_conf(testbed.etc / "gres.conf")
    devices = {n: [(int(m), d.model or "") for d in devs
                   if (m := device_minor(d.path)) is not None] for n, devs in gres.items()}
    scenario = scenario_for_devices(devices, seed=5, start=time.time())
    scen_path = tmp_path / "scenario.json"
    scenario.save(scen_path)
    gpu = ("-p", "gpu", "-w", "gpu2", "--gres=gpu:1", "-o", "/dev/null", "--requeue")
    busy = jobs.sbatch(*gpu, script="sleep 300")
    idle = jobs.sbatch(*gpu, script="sleep 300")
    mig = jobs.sbatch(*gpu, script="sleep 300")
    for j in (busy, idle, mig):
        jobs.wait_state(j, {"RUNNING"})
    backend = CliBackend(slurm_env)
    for j, values in ((busy, {"utilization": 90}), (mig, {"fault": "mig"})):
        for node, idx in backend.job(j).allocated_gres.items():
            for it in idx:
                for i in it.indices or ():
                    minor = os.minor(os.stat(testbed.root / "dev" / node / f"nvidia{i}")
                                     .st_rdev)
                    scenario.set_gpu(node, minor, **values)
    scenario.save(scen_path)
    store = SegmentStore(tmp_path / "store")
    Collector(["gpu2"], FakeNvml(scen_path), backend, gres, store, interval_s=1.0,
              flush_s=2.0).run(duration_s=8)

    log = tmp_path / "actions.jsonl"
    ctx = Context(stall=Stall(window_s=60, grace_after_start_s=0, warning_grace_s=0,
                              action_log=str(log), lock_file=str(tmp_path / "lock")),
                  usage=Usage(min_coverage=0.05))
    # The policy's clock 55 s ahead: the jobs are past the 60 s window, and the window
    # still holds the last few seconds the collector sampled.
    t1 = time.time() + 55
    req = StallRequest(apply=True, store=str(store.root))
    probe = SlurmOutputProbe(slurm_env)
    first = requeue_stalled(backend, req, now=t1, output_probe=probe, env=slurm_env,
                            context=ctx)
    got = {d.job: (d.rule, d.action) for d in first.decisions}
    assert got[busy] == ("not-idle", "none")
    assert got[idle] == ("idle", "warn")
    assert got[mig][0] == "unknown-metrics"
    second = requeue_stalled(backend, req, now=t1 + 1, output_probe=probe, env=slurm_env,
                             context=ctx)
    assert {o.job: o.result for o in second.outcomes if o.action == "requeue"} == {
        idle: "done"}
    assert jobs.field(idle, "Restarts") == "1"
    assert jobs.field(busy, "Restarts") == "0" and jobs.field(mig, "Restarts") == "0"
    reasons = {e["job"]: e["reason"] for e in ActionLog(log).entries("decision")}
    assert "unknown" in reasons[mig]
