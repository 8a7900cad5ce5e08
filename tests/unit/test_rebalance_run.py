"""``hetslurm rebalance`` as a whole: the lock, the dry run, requeue-stalled then relax on
the GPUs it freed, drift, the [rebalance] section and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from _act_fixtures import append_probe
from _rebalance_fixtures import DEMO, NOW, cluster, energy_low, fill
from click.testing import CliRunner

from hetslurm.act import LockBusy
from hetslurm.act.drift import live_target
from hetslurm.act.lock import RunLock
from hetslurm.act.rebalance import RebalanceRequest, rebalance
from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.site import Site, load_site
from hetslurm.site.render import render, write_rendered

ROOT = Path(__file__).resolve().parents[2]
# The demo site without [levers] (whose QOS part reads slurmdbd), plus the act sections.
BASE = DEMO.read_text().split("# Slurm settings hetslurm derives")[0]


def site_file(tmp: Path, **rebalance_keys: Any) -> Path:
    keys: dict[str, Any] = {"lock_file": str(tmp / "rebalance.lock"), "verify_timeout_s": 0.01,
                            **rebalance_keys}
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    p = tmp / "site.toml"
    p.write_text(BASE + f"""
[stall]
window_s = 3600
grace_after_start_s = 0
warning_grace_s = 0
action_log = "{tmp / 'actions.jsonl'}"
lock_file = "{tmp / 'act.lock'}"
verify_timeout_s = 1

[rebalance]
{extra}""")
    return p


def idle_samples(job_ids: dict[int, tuple[str, int]], now: float) -> Any:
    import pandas as pd

    rows = []
    t = now - 3600.0
    while t < now:
        for jid, (node, minor) in job_ids.items():
            rows.append({"time": t, "node": node, "minor": minor, "slurm_index": minor,
                         "job_id": jid,
                         "utilization_pct": 0.0, "memory_used_mib": 1.0, "status": "ok",
                         "interval_s": 30.0})
        t += 30.0
    return pd.DataFrame(rows).astype({"job_id": "Int64"})


def test_section_defaults_and_unknown_keys(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path, pending_limit_s=600))
    pol = site.sections["rebalance"]
    assert pol.pending_limit_s == 600 and pol.time_budget_s == 240
    assert pol.relax_kinds == ("switch-wait", "models", "prefer", "wait-for")
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(ConfigError, match="pending_limit"):
        load_site(site_file(bad, pending_limt_s=600))
    with pytest.raises(ConfigError):
        load_site(site_file(bad, relax_kinds=["pin-to-node"]))


def test_requeue_stalled_frees_gpus_then_relax_uses_them(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path))
    # Every GPU busy; two h100 jobs on gpu1 have idled for an hour; an energy=low job
    # (narrowed to a100) waits. Once the idle ones are requeued, widening it would start it.
    jobs = [*fill("gpu3", "a100", 100), *fill("gpu4", "a100", 200),
            *fill("gpu1", "h100", 300), *fill("gpu2", "h100", 400), energy_low(10)]
    fake = cluster(site, *jobs)
    samples = idle_samples({306: ("gpu1", 6), 307: ("gpu1", 7)}, NOW)
    log = tmp_path / "actions.jsonl"

    def go(apply: bool, now: float = NOW) -> Any:
        return rebalance(fake, RebalanceRequest(apply=apply, action_log=str(log)), site,
                         samples=samples, now=now, output_probe=append_probe)

    def acting(res: Any) -> dict[str, str]:
        return {d.job: d.action for d in res.stall.decisions if d.action != "none"}

    def results(res: Any) -> dict[str, str]:
        return {o.job: o.result for o in res.stall.outcomes if o.result != "logged"}

    before = fake.jobs()
    dry = go(False)
    assert fake.jobs() == before and not log.exists()
    assert acting(dry) == {"306": "warn", "307": "warn"}
    assert {d.job: d.rule for d in dry.relax.decisions} == {"10": "would-not-start"}

    first = go(True)  # warns only
    assert results(first) == {"306": "warned", "307": "warned"}
    assert {d.job: d.rule for d in first.relax.decisions} == {"10": "would-not-start"}
    second = go(True, NOW + 1)  # requeues both; their h100s are free for the widened job
    assert results(second) == {"306": "done", "307": "done"}
    assert {d.job: d.rule for d in second.relax.decisions} == {"10": "relax"}
    assert second.relax.decisions[0].evidence["relaxed"]["gpus"] == {"gpu1": [6, 7]}
    assert [o.result for o in second.relax_outcomes] == ["done"]
    assert fake.job(10).features == "h100|a100"
    kinds = [e["kind"] for e in map(json.loads, log.read_text().splitlines())]
    assert kinds.count("run") == 4  # each applied run: stall's summary and rebalance's


def test_lock_second_run_exits_at_once_without_acting(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path))
    fake = cluster(site, *fill("gpu3", "a100", 100), *fill("gpu4", "a100", 200),
                   energy_low(10))
    with RunLock(tmp_path / "rebalance.lock"):
        t0 = time.monotonic()
        with pytest.raises(LockBusy):
            rebalance(fake, RebalanceRequest(apply=True, phases=("relax",)), site, now=NOW)
        assert time.monotonic() - t0 < 1.0
    assert fake.job(10).features == "a100"
    assert not (tmp_path / "actions.jsonl").exists()
    # A dry run takes no lock.
    with RunLock(tmp_path / "rebalance.lock"):
        rebalance(fake, RebalanceRequest(phases=("relax",)), site, now=NOW)


def test_same_lock_for_both_is_refused(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path, lock_file=str(tmp_path / "act.lock")))
    with pytest.raises(ConfigError, match="lock_file"):
        rebalance(cluster(site), RebalanceRequest(), site, now=NOW)


def _conf(site: Site, folder: Path) -> None:
    write_rendered(render(site, whole=True), folder)


def test_drift_is_the_site_diff(tmp_path: Path) -> None:
    site = load_site(site_file(tmp_path))
    conf = tmp_path / "etc"
    _conf(site, conf)
    target = live_target(str(conf), True, {})
    res = rebalance(cluster(site), RebalanceRequest(phases=("drift",)), site, target=target,
                    now=NOW)
    assert res.drift is not None and res.drift.error is None and res.drift.changes == ()
    text = (conf / "slurm.conf").read_text().replace("Weight=100 ", "Weight=7 ", 1)
    (conf / "slurm.conf").write_text(text)
    res = rebalance(cluster(site), RebalanceRequest(phases=("drift",)), site, target=target,
                    now=NOW)
    assert res.drift is not None and len(res.drift.changes) == 1
    change = res.drift.changes[0]
    assert change["file"] == "slurm.conf" and "Weight=7" in str(change["old"])
    assert change["action"] in ("reconfigure", "restart")
    # Read only: the file is as drift found it.
    assert (conf / "slurm.conf").read_text() == text
    # An unreadable live side is a problem, not a crash.
    missing = live_target(str(tmp_path / "nowhere"), True, {})
    res = rebalance(cluster(site), RebalanceRequest(phases=("drift",)), site, target=missing,
                    now=NOW)
    assert res.drift is not None and len(res.drift.changes) > 0


def test_cli_json_and_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = site_file(tmp_path, pending_limit_s=600)
    site = load_site(path)
    fake = cluster(site, *fill("gpu3", "a100", 100), *fill("gpu4", "a100", 200),
                   energy_low(10, eligible_time=datetime.fromtimestamp(time.time() - 3600,
                                                                       tz=UTC)))
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: fake)
    monkeypatch.setattr("hetslurm.act.output_mode.SlurmOutputProbe",
                        lambda *a, **k: append_probe)
    conf = tmp_path / "etc"
    _conf(site, conf)
    args = ["rebalance", "--site", str(path), "--conf-dir", str(conf), "--format", "json",
            "--store", str(tmp_path / "nostore")]
    res = CliRunner().invoke(cli, args)
    # no metrics store: requeue-stalled cannot judge a job, which makes the run partial (9)
    assert res.exit_code == 9, res.output
    doc = json.loads(res.stdout)
    assert any("no metrics store" in p for p in doc["problems"])
    assert set(doc) >= {"applied", "seconds", "budget_s", "requeue_stalled", "relax", "drift",
                        "skipped", "problems"}
    assert doc["applied"] is False
    assert [(d["job"], d["rule"]) for d in doc["relax"]["decisions"]] == [("10", "relax")]
    assert fake.job(10).features == "a100"
    with RunLock(tmp_path / "rebalance.lock"):
        busy = CliRunner().invoke(cli, [*args, "--apply"])
    assert busy.exit_code == 0
    assert "another run holds" in busy.stderr and busy.stdout == ""
    assert fake.job(10).features == "a100"
    done = CliRunner().invoke(cli, [*args, "--apply"])
    assert done.exit_code == 9, done.output  # relax done, requeue-stalled could not judge
    assert json.loads(done.stdout)["relax"]["outcomes"][0]["result"] == "done"
    assert fake.job(10).features == "h100|a100"


def test_second_process_exits_within_a_second(tmp_path: Path) -> None:
    """The real command in a second process, while this one holds the lock."""
    path = site_file(tmp_path)
    with RunLock(tmp_path / "rebalance.lock"):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "hetslurm", "rebalance", "--site",
                              str(path), "--apply"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        took = time.monotonic() - t0
    assert out.returncode == 0 and "another run holds" in out.stderr, out.stderr
    assert out.stdout == ""
    # Interpreter start and imports included; the box is shared, so allow some slack.
    assert took < 3.0, took


def test_cli_backend_reads_switch_requests_from_squeue_columns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What `squeue -h -t PD -O JobID:24,ReqSwitch:12,Wait4Switch:24` printed on the
    testbed (22.05 caps the wait at max_switch_wait, 5:00); squeue --json has no such field."""
    from hetslurm.errors import CommandError, CommandFailure
    from hetslurm.process import CommandResult
    from hetslurm.slurm.backend import Switches
    from hetslurm.slurm.cli_backend import CliBackend

    printed = ("4                       1           5:00                    \n"
               "3                       1           0:00                    \n"
               "2                       0           0:00                    \n"
               "garbage Switches=9 x\n")
    b = CliBackend({})
    seen: list[tuple[str, ...]] = []

    def fake(*argv: str, **_kw: Any) -> CommandResult:
        seen.append(argv)
        return CommandResult(tuple(argv), 0, printed, "")

    monkeypatch.setattr(b, "_run", fake)
    assert b._switch_requests() == {4: Switches(1, 300), 3: Switches(1, 0)}
    assert seen == [("squeue", "-h", "-t", "PD", "-O", "JobID:24,ReqSwitch:12,Wait4Switch:24")]

    def failing(*argv: str, **_kw: Any) -> CommandResult:
        raise CommandError("squeue failed", CommandFailure(argv=argv, returncode=1, stderr=""))

    monkeypatch.setattr(b, "_run", failing)
    assert b._switch_requests() == {}
