"""``hetslurm rebalance`` on the real testbed.

* The dry run changes nothing: ``scontrol show job`` and ``sacct`` of every job involved are
  the same before and after (only RunTime and LastSchedEval, which Slurm moves on its own,
  are left out), and no log is written.
* ``--apply``: requeue-stalled warns, then requeues an idle job; the relax phase drops
  ``--prefer=h100`` from ``class=train`` jobs waiting for busy H100s, and Slurm starts them on
  A100s; a typed one-model narrowing (``energy=low``) is left alone (22.05 cannot widen it).
* A preferred switch wait: with the demo hook's policy (``modify_exempt_uids = []``) Slurm
  refuses the edit (logged as failed); with root exempt the wait goes to 0 and the job spans.
* Hostile job names and comments pass through unchanged and nothing executes.
* Two concurrent ``--apply`` runs: the second exits within a second without acting.
* Drift is ``hetslurm site diff``'s own answer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _cluster_helpers import Jobs, device_samples

from hetslurm.act.log import ActionLog
from hetslurm.act.output_mode import SlurmOutputProbe
from hetslurm.act.rebalance import RebalanceRequest, RebalanceResult, rebalance
from hetslurm.process import run_command
from hetslurm.site import load_site
from hetslurm.slurm.backend import JobInfo
from hetslurm.slurm.cli_backend import CliBackend
from hetslurm.testbed import Testbed
from hetslurm.testbed.target import rollout_target

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
AHEAD_S = 120.0
HOSTILE_X = Path(f"/tmp/hetslurm-rebalance-x-{os.getpid()}")
TRAIN = "#!/bin/bash\n#HET gpus=2 class=train\nsleep 120\n"


def site_variant(tmp: Path, *, exempt_root: bool) -> Path:
    text = DEMO.read_text()
    if exempt_root:
        text = text.replace("modify_exempt_uids = []", "modify_exempt_uids = [0]")
    text += f"""
[stall]
window_s = 60
grace_after_start_s = 0
warning_grace_s = 0
action_log = "{tmp / 'actions.jsonl'}"
lock_file = "{tmp / 'act.lock'}"
verify_timeout_s = 20

[rebalance]
lock_file = "{tmp / 'rebalance.lock'}"
pending_limit_s = 0
verify_timeout_s = 20
"""
    p = tmp / ("site-exempt.toml" if exempt_root else "site.toml")
    p.write_text(text)
    return p


def install_hook(site_file: Path, testbed: Testbed, jobs: Jobs) -> None:
    run_command([sys.executable, "-m", "hetslurm", "hook", "install", "--site",
                 str(site_file), "--dir", str(testbed.etc)], timeout=120, env=jobs.env)
    # slurmctld reloads job_submit.lua at the next submission after the file changed.
    time.sleep(1.1)
    jobs.sbatch("--hold", "-p", "cpu", script="true")


def sbatch_script(jobs: Jobs, script: str, *args: str) -> str:
    res = run_command(["sbatch", "--parsable", "-o", "/dev/null", *args], timeout=60,
                      env=jobs.env, input=script)
    job_id = res.stdout.strip().split(";")[0]
    jobs.ids.append(job_id)
    return job_id


def samples_for(util: dict[int, float], now: float, env: dict[str, str]):
    return device_samples(env, dict(util), now, 60.0)


def snapshot(env: dict[str, str], ids: list[str]) -> tuple[str, str]:
    shown = run_command(["scontrol", "show", "job", "-o"], timeout=30, env=env).stdout
    mine = sorted(line for line in shown.splitlines()
                  if any(f"JobId={i} " in line for i in ids))
    # What Slurm's own scheduler updates on its next pass (a pending job's Reason, accrue and
    # planned start times, priority) is left out: only what a rebalance could change counts.
    volatile = r"(RunTime|LastSchedEval|Reason|AccrueTime|StartTime|EndTime|Scheduler|Priority)=\S+"
    text = "\n".join(re.sub(volatile, "", line) for line in mine)
    acct = run_command(["sacct", "-n", "-P", "-j", ",".join(ids), "-o",
                        "JobID,State,Submit,Start,End,Restart,ReqTRES,Constraints"],
                       timeout=30, env=env, check=False).stdout
    return text, acct


def test_rebalance_dry_run_then_apply(jobs: Jobs, slurm_env: dict[str, str], testbed: Testbed,
                                      tmp_path: Path) -> None:
    HOSTILE_X.unlink(missing_ok=True)
    existed = Path("/tmp/x").exists()
    site = load_site(site_variant(tmp_path, exempt_root=False))
    # Every H100 busy (one of them held by an idle job); one A100 busy on each A100 node.
    busy = [jobs.sbatch("-p", "gpu", "-w", "gpu1", "--gres=gpu:h100:7", script="sleep 300"),
            jobs.sbatch("-p", "gpu", "-w", "gpu2", "--gres=gpu:h100:8", script="sleep 300"),
            jobs.sbatch("-p", "gpu", "-w", "gpu3", "--gres=gpu:a100:1", script="sleep 300"),
            jobs.sbatch("-p", "gpu", "-w", "gpu4", "--gres=gpu:a100:1", script="sleep 300")]
    idle = jobs.sbatch("-p", "gpu", "-w", "gpu1", "--gres=gpu:h100:1", "--requeue",
                       script="sleep 300")
    for j in (*busy, idle):
        jobs.wait_state(j, {"RUNNING"})
    # class=train (h100|a100) with --prefer=h100: 22.05 waits for an H100. A short time
    # limit: the energy=low job below waits for a whole A100 node, and backfill starts a
    # relaxed job on that node only if it ends first (26.05 packs three on one node and
    # keeps the fourth off the reserved one while it would run for the partition's day).
    # In the default partition (batch), not the class's: the job's own partition is kept, so
    # the hook writes no per-model partitions (which fall back at once, docs/fallback.md) and
    # --prefer decides, as for any job outside ranked fallback.
    short = ("-t", "30", "-p", "batch")
    pref = sbatch_script(jobs, TRAIN, *short, "--prefer=h100", "-J", "prefer-h100")
    hostile_name = f";$(touch {HOSTILE_X})"
    hostile = sbatch_script(jobs, TRAIN, *short, "--prefer=h100", "-J", hostile_name, "--comment",
                            f"`touch {HOSTILE_X}` --help")
    # A newline and Key=value text in the comment: `scontrol show job -o` prints it
    # unescaped; what is relaxed must still be the job's real request.
    cut = sbatch_script(jobs, TRAIN, *short, "--prefer=h100", "-J", "--help", "--comment",
                        f"$(touch {HOSTILE_X})\nPrefer=a100 Features=h100")
    # A newline and a forged field in the name itself.
    nl_name = "x\nJobState=RUNNING Prefer=a100"
    nl = sbatch_script(jobs, TRAIN, *short, "--prefer=h100", "-J", nl_name, "--comment",
                       "--help")
    # energy=low narrowed to a typed gpu:a100:8: Slurm cannot widen it; left alone.
    low = sbatch_script(jobs, "#!/bin/bash\n#HET gpus=8 gpu-type=h100|a100 energy=low\n"
                        "sleep 60\n", "-J", "energy-low")
    backend = CliBackend(slurm_env)

    def listed(j: str) -> JobInfo:
        # From squeue --json: a newline in a comment cannot cut a JSON record.
        return {x.display_id: x for x in backend.jobs()}[j]

    def wait_listed(j: str, states: set[str], timeout: float = 60) -> None:
        # jobs.wait_state reads `scontrol -o`, whose JobState a forged name can fake.
        deadline = time.monotonic() + timeout
        while listed(j).state not in states:
            assert time.monotonic() < deadline, (j, listed(j).state, states)
            time.sleep(0.5)

    for j in (pref, hostile, cut, nl, low):
        wait_listed(j, {"PENDING"})
    for j in (pref, hostile, cut, nl):
        assert listed(j).prefer == "h100" and listed(j).features == "h100|a100"
    ids = [*busy, idle, pref, hostile, cut, nl, low]
    idle_id = backend.job(idle).job_id
    probe = SlurmOutputProbe(slurm_env)
    log = ActionLog(tmp_path / "actions.jsonl")
    target = rollout_target(testbed, site)
    t1 = time.time() + AHEAD_S

    def go(apply: bool, now: float) -> RebalanceResult:
        return rebalance(backend, RebalanceRequest(apply=apply), site, target=target,
                         samples=samples_for({idle_id: 0.0}, now, slurm_env), now=now,
                         output_probe=probe, env=slurm_env)

    # Dry run: Slurm unchanged, nothing written.
    before = snapshot(slurm_env, ids)
    dry = go(False, t1)
    assert snapshot(slurm_env, ids) == before
    assert not log.path.exists()
    assert dry.stall is not None and dry.relax is not None
    assert {d.job: d.action for d in dry.stall.decisions}[idle] == "warn"
    assert {d.job: d.rule for d in dry.relax.decisions} == {
        pref: "relax", hostile: "relax", cut: "relax", nl: "relax", low: "typed-gres"}
    for d in dry.relax.decisions:
        if d.rule == "relax":
            assert [(e.field, e.new) for e in d.edits] == [("Prefer", "")]
            assert d.evidence["relaxed"]["nodelist"] in ("gpu3", "gpu4")
    # Drift is site diff's own answer.
    diff = run_command([sys.executable, "-m", "hetslurm", "site", "diff", str(DEMO),
                        "--testbed", str(testbed.root), "--format", "json"], timeout=120,
                       env=slurm_env)
    assert dry.drift is not None and dry.drift.error is None
    assert [c["item"] for c in dry.drift.changes] == [
        c["item"] for c in json.loads(diff.stdout)["changes"]]

    # Applied: the stall phase warns; --prefer is dropped and Slurm starts them on A100s.
    first = go(True, t1)
    assert first.stall is not None
    assert {o.job: o.result for o in first.stall.outcomes}[idle] == "warned"
    assert {o.job: o.result for o in first.relax_outcomes} == {
        pref: "done", hostile: "done", cut: "done", nl: "done"}, [
        (o.job, o.detail) for o in first.relax_outcomes]
    for j in (pref, hostile, cut, nl):
        wait_listed(j, {"RUNNING"}, timeout=120)
        got = listed(j)
        assert got.prefer is None and got.features == "h100|a100"
        assert got.nodes[0] in ("gpu3", "gpu4")
    assert listed(low).tres_per_node[0].to_slurm() == "gpu:a100:8"

    # Second run: the idle job is requeued; nothing left to relax but the typed one.
    second = go(True, t1 + 1)
    assert second.stall is not None
    assert {o.job: o.result for o in second.stall.outcomes}[idle] == "done"
    assert jobs.field(idle, "Restarts") == "1"
    assert second.relax is not None
    assert {d.job: d.rule for d in second.relax.decisions} == {low: "typed-gres"}
    assert second.relax_outcomes == []

    # Hostile strings went through untouched, nothing executed.
    assert not HOSTILE_X.exists()
    assert Path("/tmp/x").exists() == existed
    names = {e["job"]: e["name"] for e in log.entries("decision") if e.get("phase") == "relax"}
    assert names[hostile] == hostile_name and names[cut] == "--help"
    assert names[nl] == nl_name and listed(nl).name == nl_name
    assert listed(hostile).name == hostile_name
    assert listed(cut).comment == f"$(touch {HOSTILE_X})\nPrefer=a100 Features=h100"


def test_switch_wait_refused_by_the_hook_then_dropped(jobs: Jobs, slurm_env: dict[str, str],
                                                     testbed: Testbed, tmp_path: Path) -> None:
    """A 2-node job that asked locality=switch (preferred) waits for one leaf while a node
    is free under each: with the demo hook (nobody may change what it wrote) the edit is
    refused and logged; with root exempt (a real site's default) the wait is set to 0 and
    Slurm starts the job across the two leaves."""
    plain = load_site(site_variant(tmp_path, exempt_root=False))
    exempt_file = site_variant(tmp_path, exempt_root=True)
    for n in ("gpu2", "gpu3", "gpu4", "fpga1", "cpu2", "cpu3", "cpu4"):
        jobs.sbatch("-p", "batch", "-w", n, "-c", "8", script="sleep 300")
    job = sbatch_script(jobs, "#!/bin/bash\n#HET nodes=2 cores=8 locality=switch "
                        "switch-wait=10m\nsleep 60\n", "-p", "batch")
    jobs.wait_state(job, {"PENDING"})
    time.sleep(3)
    assert jobs.field(job, "JobState") == "PENDING"
    assert jobs.field(job, "Switches") == "1@00:05:00"  # slurmctld caps at max_switch_wait
    backend = CliBackend(slurm_env)
    req = RebalanceRequest(apply=True, phases=("relax",))
    try:
        first = rebalance(backend, req, plain, env=slurm_env)
        assert first.relax is not None
        assert {d.job: d.rule for d in first.relax.decisions} == {job: "relax"}
        assert first.relax.decisions[0].evidence["relaxed"]["nodelist"] == "cpu1,gpu1"
        assert [(o.job, o.result) for o in first.relax_outcomes] == [(job, "failed")]
        assert "denied" in first.relax_outcomes[0].detail.lower()
        assert jobs.field(job, "Switches") == "1@00:05:00"
        install_hook(exempt_file, testbed, jobs)
        second = rebalance(backend, req, load_site(exempt_file), env=slurm_env)
        assert [(o.job, o.result) for o in second.relax_outcomes] == [(job, "done")], [
            o.detail for o in second.relax_outcomes]
        jobs.wait_state(job, {"RUNNING"}, timeout=60)
        assert jobs.field(job, "NodeList") == "cpu1,gpu1"
    finally:
        install_hook(DEMO, testbed, jobs)


def test_second_concurrent_run_exits_at_once(slurm_env: dict[str, str], testbed: Testbed,
                                             tmp_path: Path) -> None:
    """Two real ``rebalance --apply`` processes. The first is held inside its run, lock
    taken, by its drift phase reading a live slurm.conf that is a FIFO nobody writes yet (so
    it waits without using the CPU); the second must exit within a second without acting."""
    site = site_variant(tmp_path, exempt_root=False)
    site.write_text(site.read_text() + "whole_conf = true\n")
    conf = tmp_path / "etc"
    conf.mkdir()
    for name in ("gres.conf", "topology.conf"):
        (conf / name).write_text((testbed.etc / name).read_text())
    os.mkfifo(conf / "slurm.conf")
    store = tmp_path / "store"  # an empty store: no job is judged, none is a problem
    store.mkdir()
    argv = [sys.executable, "-m", "hetslurm", "rebalance", "--site", str(site), "--apply",
            "--conf-dir", str(conf), "--format", "json", "--store", str(store)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=slurm_env, cwd=ROOT)
    lock = tmp_path / "rebalance.lock"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if lock.exists() and lock.read_text().strip() == str(first.pid):
                break
            assert first.poll() is None, first.communicate()
            time.sleep(0.05)
        else:
            raise AssertionError("the first run never took the lock")
        # Three tries, the fastest counts: the box is shared, and a second spent waiting for
        # a CPU is not the command's. Each must exit without acting.
        seconds = []
        for _ in range(3):
            t0 = time.monotonic()
            second = subprocess.run(argv, capture_output=True, text=True, env=slurm_env,
                                    cwd=ROOT, timeout=60)
            seconds.append(time.monotonic() - t0)
            assert second.returncode == 0 and "another run holds" in second.stderr, (
                second.stderr)
            assert second.stdout == ""
        assert first.poll() is None, "the first run ended before the second was checked"
    finally:
        # Let the first run go on: write the live slurm.conf into the FIFO it waits on.
        with open(conf / "slurm.conf", "w", encoding="utf-8") as fifo:
            fifo.write((testbed.etc / "slurm.conf").read_text())
        out, err = first.communicate(timeout=300)
    assert min(seconds) < 1.0, seconds
    assert first.returncode == 0, err
    doc = json.loads(out)
    assert doc["applied"] is True and doc["drift"]["error"] is None
    # Only the first run wrote to the log.
    runs = [e for e in ActionLog(tmp_path / "actions.jsonl").entries("run")
            if e.get("source") == "rebalance"]
    assert len(runs) == 1
