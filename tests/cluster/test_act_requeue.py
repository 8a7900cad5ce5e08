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
from _cluster_helpers import Jobs, device_samples

from hetslurm.act.log import ActionLog
from hetslurm.act.output_mode import SlurmOutputProbe
from hetslurm.act.run import StallRequest, context_for, requeue_stalled
from hetslurm.act.stall import Context, execute, job_gpus, plan
from hetslurm.errors import HetslurmError
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.site import Site
from hetslurm.site.schema import Stall, Usage
from hetslurm.slurm.backend import JobInfo
from hetslurm.slurm.cli_backend import CliBackend
from hetslurm.testbed import Testbed

AHEAD_S = 120.0
WINDOW_S = 60
HOSTILE_X = Path(f"/tmp/hetslurm-act-x-{os.getpid()}")


def sbatch_script(jobs: Jobs, script: str, *args: str) -> str:
    res = run_command(["sbatch", "--parsable", *args], timeout=60, env=jobs.env, input=script)
    job_id = res.stdout.strip().split(";")[0]
    jobs.ids.append(job_id)
    return job_id


def samples_for(util: dict[int, float | None], now: float, env: dict[str, str]):
    """Samples every 5 s over the window on each GPU the job holds; ``None``: MIG (unknown)."""
    return device_samples(env, util, now, WINDOW_S)


def snapshot(env: dict[str, str], ids: list[str]) -> tuple[str, str]:
    shown = run_command(["scontrol", "show", "job", "-o"], timeout=30, env=env).stdout
    mine = sorted(line for line in shown.splitlines()
                  if any(f"JobId={i} " in line or f"ArrayJobId={i} " in line
                         or f"HetJobId={i} " in line for i in ids))
    # RunTime ticks every second; everything else must stand still.
    text = "\n".join(re.sub(r"RunTime=\S+", "", line) for line in mine)
    acct = run_command(["sacct", "-n", "-P", "-j", ",".join(ids), "-o",
                        "JobID,State,Submit,Start,End,Restart"], timeout=30,
                       env=env, check=False).stdout
    return text, acct


HET_SCRIPT = ("#!/bin/sh\n#SBATCH -p gpu --gres=gpu:1 -o /dev/null --requeue -t 10\n"
              "#SBATCH hetjob\n#SBATCH -p gpu --gres=gpu:1 --requeue -t 10\nsleep 300\n")


def listed(env: dict[str, str], ref: str) -> JobInfo:
    """The job as ``squeue --json`` lists it (a forged name cannot fool JSON)."""
    return next(j for j in CliBackend(env).jobs() if j.display_id == ref)


def wait_running(jobs: Jobs, ref: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if listed(jobs.env, ref).state == "RUNNING":
            return
        time.sleep(1.0)
    queue = run_command(["squeue", "-o", "%i %T %r %b %N"], timeout=30, env=jobs.env).stdout
    raise AssertionError(f"job {ref} not RUNNING after {timeout}s\n{queue}")


def het_script(directive: str) -> str:
    return f"#!/bin/sh\n#SBATCH -t 10\n#HET {directive}\nsleep 300\n"


def test_requeue_stalled_batch(jobs: Jobs, slurm_env: dict[str, str], demo_site: Site,
                               tmp_path: Path) -> None:
    """25 jobs, each with exactly one intended outcome; every decision logged with its
    reason; hostile names and comments pass through Slurm, the log and the notifier."""
    existed = Path("/tmp/x").exists()
    gpu = ("-p", "gpu", "--gres=gpu:1", "-o", "/dev/null")
    # Heterogeneous jobs start from the backfill scheduler (up to 30 s): submit them first.
    het_idle = sbatch_script(jobs, HET_SCRIPT)
    het_mixed = sbatch_script(jobs, HET_SCRIPT)
    # Downgrade opt-ins next, so the H100s are still free for them.
    dg_ok = sbatch_script(jobs, het_script("on-idle=downgrade"), "-p", "gpu",
                          "--gres=gpu:h100:1", "-o", "/dev/null", "--requeue")
    dg_hook = sbatch_script(jobs, het_script("gpus=1 class=train on-idle=downgrade"),
                            "-o", "/dev/null", "--requeue")
    dg_cheapest = sbatch_script(jobs, het_script("on-idle=downgrade"), "-p", "gpu",
                                "--gres=gpu:a100:1", "-o", "/dev/null", "--requeue")
    on_notify = sbatch_script(jobs, het_script("gpus=1 on-idle=notify"), "-p", "gpu",
                              "-o", "/dev/null", "--requeue")
    busy = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    idle = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    exempt = jobs.sbatch("-p", "batch", "--gres=gpu:1", "-o", "/dev/null", "--requeue",
                         script="sleep 300")
    norequeue = jobs.sbatch(*gpu, "--no-requeue", script="sleep 300")
    array = jobs.sbatch(*gpu, "--requeue", "--array=0-1", script="sleep 300")
    hostile = jobs.sbatch(*gpu, "--requeue", "-J", f";$(touch {HOSTILE_X})",
                          "--comment", f"`touch {HOSTILE_X}` --help", script="sleep 300")
    # A newline in the name forges fields of scontrol's one-line record; the access layer
    # reads squeue's JSON, so the job is judged and requeued on its real fields. (Its output
    # is appended, so the output probe does not stop it first.)
    forged = sbatch_script(jobs, "#!/bin/sh\n#SBATCH --open-mode=append\nsleep 300\n",
                           *gpu, "--requeue", "-J", "--help\nJobState=PENDING Restarts=9",
                           "--comment", f"x\n;$(touch {HOSTILE_X})\n`touch {HOSTILE_X}`")
    missing = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    mig = jobs.sbatch(*gpu, "--requeue", script="sleep 300")
    truncating = sbatch_script(jobs, "#!/bin/sh\nsleep 300\n", *gpu[:4], "--requeue",
                               "-o", str(tmp_path / "out-%j.txt"))
    appending = sbatch_script(jobs, "#!/bin/sh\n#SBATCH --open-mode=append\nsleep 300\n",
                              *gpu[:4], "--requeue", "-o", str(tmp_path / "app-%j.txt"))
    # An interactive allocation (BatchFlag=0): Slurm cannot requeue it; cancel after warning.
    granted = run_command(["salloc", "--no-shell", "-p", "gpu", "--gres=gpu:1", "-t", "5",
                           "-J", "interactive"], timeout=60, env=jobs.env)
    interactive = re.findall(r"Granted job allocation (\d+)", granted.stderr + granted.stdout)[0]
    jobs.ids.append(interactive)
    het_refs = [f"{h}+{k}" for h in (het_idle, het_mixed) for k in (0, 1)]
    for j in [*het_refs, dg_ok, dg_hook, dg_cheapest, on_notify, busy, idle, exempt,
              norequeue, f"{array}_0", f"{array}_1", hostile, forged, missing, mig, truncating,
              appending, interactive]:
        wait_running(jobs, j)
    # Ends on its own between the first decision and the action.
    finishing = jobs.sbatch(*gpu, "--requeue", script="sleep 40")
    wait_running(jobs, finishing)
    ids = [het_idle, het_mixed, dg_ok, dg_hook, dg_cheapest, on_notify, busy, idle, exempt,
           norequeue, array, hostile, forged, missing, mig, truncating, appending,
           interactive, finishing]

    backend = CliBackend(slurm_env)
    probe = SlurmOutputProbe(slurm_env)
    now_listed = backend.jobs()
    by_ref = {j.display_id: j.job_id for j in now_listed}
    models = {j.display_id: job_gpus(j)[1] for j in now_listed}
    assert models[dg_ok] == "h100" and models[dg_hook] == "h100", models
    assert models[dg_cheapest] == "a100"
    util: dict[int, float | None] = {by_ref[r]: 0.0 for r in (
        *het_refs, dg_ok, dg_hook, dg_cheapest, on_notify, idle, exempt, norequeue,
        f"{array}_1", finishing, hostile, forged, truncating, appending, interactive)}
    for r in (busy, f"{array}_0", f"{het_mixed}+1"):
        util[by_ref[r]] = 70.0
    util[by_ref[mig]] = None  # MIG: unknown, never idle
    # `missing` has no samples at all.
    log = ActionLog(tmp_path / "actions.jsonl")
    notes = tmp_path / "notes.jsonl"
    argv_file = tmp_path / "argv.txt"
    notifier = tmp_path / "notifier"
    notifier.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {argv_file}\ncat >> {notes}\n")
    notifier.chmod(0o755)
    site_ctx = context_for(demo_site)
    ctx = dataclasses.replace(site_ctx, usage=Usage(), stall=Stall(
        window_s=WINDOW_S, grace_after_start_s=0, warning_grace_s=0,
        exempt_partitions=("batch",), verify_timeout_s=20, non_batch_action="cancel",
        notify_command=(str(notifier), "{job}", "{user}", "{action}", "{rule}"),
        action_log=str(log.path), lock_file=str(tmp_path / "lock")))
    assert ctx.modify_exempt_uids == ()  # the demo site exempts nobody from the hook's rule

    # Dry run: Slurm is unchanged (scontrol and sacct), the log is not written.
    before = snapshot(slurm_env, ids)
    t1 = time.time() + AHEAD_S
    dry = plan(backend, samples_for(util, t1, slurm_env), ctx, now=t1, log=log, output_probe=probe)
    assert snapshot(slurm_env, ids) == before
    assert not log.path.exists()
    got = {d.job: (d.rule, d.action) for d in dry}
    want_first = {
        f"{het_idle}+0": ("het-job", "warn"), f"{het_idle}+1": ("het-job", "none"),
        f"{het_mixed}+0": ("het-job", "notify"), f"{het_mixed}+1": ("not-idle", "none"),
        dg_ok: ("on-idle-downgrade", "warn"), dg_hook: ("on-idle-downgrade", "notify"),
        dg_cheapest: ("on-idle-downgrade", "notify"), on_notify: ("on-idle-notify", "notify"),
        busy: ("not-idle", "none"), idle: ("idle", "warn"),
        exempt: ("exempt-partition", "none"), norequeue: ("no-requeue", "none"),
        f"{array}_0": ("not-idle", "none"), f"{array}_1": ("idle", "warn"),
        finishing: ("idle", "warn"), hostile: ("idle", "warn"), forged: ("idle", "warn"),
        missing: ("unknown-metrics", "none"), mig: ("unknown-metrics", "none"),
        truncating: ("output-not-append", "notify"), appending: ("idle", "warn"),
        interactive: ("non-batch", "warn"),
    }
    assert len(want_first) >= 20
    assert got == want_first
    reasons = {d.job: d.reason for d in dry}
    dg = next(d for d in dry if d.job == dg_ok)
    assert dg.downgrade is not None and dg.downgrade.gres == "gpu:a100:1"
    assert dg.row()["change"] == "downgrade h100 -> a100 (Gres=gpu:a100:1)"
    assert "modify_exempt_uids" in reasons[dg_hook]
    assert "no GPU model cheaper than a100" in reasons[dg_cheapest]
    assert f"{het_mixed}+1 is not-idle" in reasons[f"{het_mixed}+0"]
    assert "unknown" in reasons[mig] and "no samples" in reasons[missing]
    leader = next(d for d in dry if d.job == f"{het_idle}+0")
    assert leader.target == het_idle and leader.planned == "requeue"

    # First applied run: warnings and notices only.
    first = execute(backend, dry, ctx, log, now=t1, output_probe=probe, env=slurm_env)
    assert {o.job for o in first if o.result == "warned"} == {
        f"{het_idle}+0", dg_ok, idle, f"{array}_1", finishing, hostile, forged, appending,
        interactive}
    assert {o.job for o in first if o.result == "notified"} == {
        f"{het_mixed}+0", dg_hook, dg_cheapest, on_notify, truncating}
    assert snapshot(slurm_env, ids)[0].count("Restarts=1") == 0
    jobs.wait_state(finishing, {"COMPLETED"}, timeout=90)

    # Second run, one second later on the policy's clock: the warned jobs are acted on.
    t2 = t1 + 1
    second_plan = plan(backend, samples_for(util, t2, slurm_env), ctx, now=t2, log=log,
                       output_probe=probe)
    assert finishing not in {d.job for d in second_plan}  # ended: not a running job now
    # The finishing job ended after the first decision: acting on that decision is refused
    # by the re-check.
    stale = [d for d in dry if d.job == finishing]
    out = {o.job: o for o in execute(backend, second_plan + [
        dataclasses.replace(d, action="requeue") for d in stale],
        ctx, log, now=t2, output_probe=probe, env=slurm_env)}
    results = {j: out[j].result for j in out}
    assert results == {
        f"{het_idle}+0": "done", f"{het_idle}+1": "logged", f"{het_mixed}+0": "logged",
        dg_ok: "done", dg_hook: "logged", dg_cheapest: "logged", on_notify: "logged",
        idle: "done", exempt: "logged", norequeue: "logged", f"{array}_1": "done",
        finishing: "skipped", hostile: "done", forged: "done", missing: "logged",
        mig: "logged", truncating: "logged", appending: "done", interactive: "done",
    }, {j: (o.result, o.detail) for j, o in out.items()}
    for j in (idle, f"{array}_1", hostile, appending, dg_ok, *het_refs[:2]):
        assert jobs.field(j, "Restarts") == "1", j
        assert jobs.field(j, "JobState") == "PENDING", j
    # The downgraded job: released (not held) and asking for the cheaper model.
    assert "held" not in jobs.field(dg_ok, "Reason").lower()
    assert jobs.field(dg_ok, "TresPerNode") == f"{jobs.gres}gpu:a100:1"
    assert out[interactive].result == "done"
    assert jobs.field(interactive, "JobState") == "CANCELLED"
    for j in (busy, exempt, norequeue, f"{array}_0", truncating, missing, mig,
              dg_hook, dg_cheapest, on_notify, *het_refs[2:]):
        assert jobs.field(j, "Restarts") == "0", j
        assert jobs.field(j, "JobState") == "RUNNING", j
    # The forged job's one-line record lies (Restarts=9): read the JSON listing.
    assert (listed(slurm_env, forged).state, listed(slurm_env, forged).restarts) == (
        "PENDING", 1)
    assert jobs.field(finishing, "JobState") == "COMPLETED"
    # requeue Incomplete on a finished job never re-runs it.
    # Slurm may refuse outright or accept and do nothing; either way it must not run again.
    with contextlib.suppress(HetslurmError):
        backend.requeue(finishing, incomplete=True)
    assert jobs.field(finishing, "JobState") == "COMPLETED"
    assert jobs.field(finishing, "Restarts") == "0"

    # Every decision is in the log with its reason; the busy ones are counted per run.
    logged: dict[str, set[tuple[str, str]]] = {}
    for e in log.entries("decision"):
        assert e["reason"], e
        logged.setdefault(e["job"], set()).add((e["rule"], e["reason"]))
    quiet_jobs = {j for j, (rule, _) in want_first.items() if rule == "not-idle"}
    assert set(logged) == set(want_first) - quiet_jobs
    for j, (rule, _) in want_first.items():
        if j not in quiet_jobs:
            assert (rule, reasons[j]) in logged[j], j
    runs = list(log.entries("run"))
    assert [r["quiet"] for r in runs] == [{"not-idle": len(quiet_jobs)}] * 2
    steps = [(e["step"], e["result"]) for e in log.entries("action") if e["job"] == dg_ok]
    assert steps == [("requeue_hold", "done"), ("update", "done"), ("release", "done")]
    het_action = next(e for e in log.entries("action") if e["job"] == f"{het_idle}+0")
    assert het_action["target"] == het_idle and het_action["result"] == "done"

    # Hostile strings went through untouched, nothing executed.
    assert not HOSTILE_X.exists()
    assert Path("/tmp/x").exists() == existed
    names = {e["job"]: e["name"] for e in log.entries("decision")}
    assert names[hostile] == f";$(touch {HOSTILE_X})"
    assert names[forged] == "--help\nJobState=PENDING Restarts=9"
    assert all(json.loads(json.dumps(e)) for e in log.entries())
    sent = [json.loads(line) for line in notes.read_text().splitlines()]
    by_job = {(n["job"], n["action"]) for n in sent}
    assert {(hostile, "warn"), (forged, "warn"), (hostile, "requeue"),
            (dg_ok, "downgrade"), (f"{het_idle}+0", "requeue")} <= by_job
    assert {n["name"] for n in sent if n["job"] == forged} == {
        "--help\nJobState=PENDING Restarts=9"}
    # Placeholders never carry a name or comment: each argv line is an id, user, action
    # or rule.
    argv_lines = set(argv_file.read_text().splitlines())
    assert not any("touch" in a or "JobState" in a for a in argv_lines)


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
