"""The guards around acting: the run lock, the append-only log, the dry run changing nothing,
hostile job names and comments passing through untouched, the [stall] schema and the CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _act_fixtures import NOW, append_probe, cluster, ctx, job, samples
from click.testing import CliRunner

from hetslurm.act import LockBusy
from hetslurm.act.lock import RunLock
from hetslurm.act.log import ActionLog
from hetslurm.act.notify import notifier_argv
from hetslurm.act.output_mode import script_open_mode
from hetslurm.act.run import StallRequest, requeue_stalled
from hetslurm.act.stall import execute, plan
from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.policy.stall import Context
from hetslurm.site import load_site
from hetslurm.site.schema import Usage

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


def warned(log: ActionLog, jid: int, ref: str | None = None) -> None:
    log.append("warning", {"t": NOW - 1800, "job": ref or str(jid), "job_id": jid,
                           "restarts": 0, "rule": "idle", "planned": "requeue"})


def test_second_run_exits_at_once_without_acting(tmp_path: Path) -> None:
    fake = cluster(job(1))
    log = ActionLog(tmp_path / "a.jsonl")
    warned(log, 1)
    before = log.path.read_bytes()
    c = ctx(action_log=str(log.path), lock_file=str(tmp_path / "lock"))
    req = StallRequest(apply=True)
    with RunLock(tmp_path / "lock"):
        t0 = time.monotonic()
        with pytest.raises(LockBusy):
            _run(fake, c, req)
        assert time.monotonic() - t0 < 1.0
    assert fake.job(1).state == "RUNNING"
    assert log.path.read_bytes() == before
    # Released: the next run acts.
    out = _run(fake, c, req)
    assert [o.result for o in out.outcomes] == ["done"]


def _run(fake, c: Context, req: StallRequest):  # type: ignore[no-untyped-def]
    return requeue_stalled(fake, req, samples=samples({1: 0.0}), now=NOW,
                           output_probe=append_probe, context=c)


def test_lock_is_released_when_the_holder_dies(tmp_path: Path) -> None:
    lock = tmp_path / "lock"
    pid = os.fork()
    if pid == 0:  # the child takes the lock and dies without releasing it
        RunLock(lock).acquire()
        os._exit(0)
    os.waitpid(pid, 0)
    with RunLock(lock):
        pass


def test_lock_refuses_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(Exception, match="lock"):
        RunLock(tmp_path / "lock").acquire()
    assert target.read_text() == "keep"


def test_log_is_append_only_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = ActionLog(tmp_path / "a.jsonl")
    log.append("decision", {"job": "1"})
    with open(log.path, "a") as fh:
        fh.write('{"kind": "warning", "job"')  # a crash mid-line
    log.append("action", {"job": "2"})
    entries = list(log.entries())
    assert [e["kind"] for e in entries] == ["decision", "action"]
    assert log.bad_lines == 1
    assert log.path.read_text().startswith('{"job": "1"')
    with pytest.raises(ValueError):
        log.append("oops", {})


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    fake = cluster(job(1), job(2, batch=False), job(3, restarts=5))
    log = ActionLog(tmp_path / "a.jsonl")
    warned(log, 1)
    before_log = log.path.read_bytes()
    before = fake.jobs()
    c = ctx(action_log=str(log.path), lock_file=str(tmp_path / "lock"),
            non_batch_action="cancel", over_cap_action="requeue_hold")
    res = requeue_stalled(fake, StallRequest(apply=False),
                          samples=samples({1: 0.0, 2: 0.0, 3: 0.0}), now=NOW,
                          output_probe=append_probe, context=c)
    assert [d.action for d in res.decisions] == ["requeue", "warn", "warn"]
    assert not res.applied and res.outcomes == []
    assert fake.jobs() == before
    assert log.path.read_bytes() == before_log
    assert not (tmp_path / "lock").exists()


HOSTILE = ["a;$(touch {x})", "b`touch {x}`", "c\n$(touch {x})\n", "--help", "d' \"; rm -rf /"]


def test_hostile_names_and_comments_pass_through_untouched(tmp_path: Path) -> None:
    x = tmp_path / "x"
    names = [h.format(x=x) for h in HOSTILE]
    jobs = [job(i + 1, name=n, comment=n, admin_comment=n) for i, n in enumerate(names)]
    fake = cluster(*jobs)
    log = ActionLog(tmp_path / "a.jsonl")
    for i in range(len(names)):
        warned(log, i + 1)
    stdin_copy = tmp_path / "stdin"
    argv_copy = tmp_path / "argv"
    script = tmp_path / "notifier"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {argv_copy}\n"
                      f"cat >> {stdin_copy}\n")
    script.chmod(0o755)
    c = ctx(notify_command=(str(script), "--job={job}", "{user}", "{action}"))
    d = plan(fake, samples(dict.fromkeys(range(1, len(names) + 1), 0.0)), c, now=NOW,
             log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert [o.result for o in out] == ["done"] * len(names)
    assert not x.exists() and not Path("/tmp/x").exists()
    notes = [json.loads(line) for line in stdin_copy.read_text().splitlines()]
    assert sorted(n["name"] for n in notes) == sorted(names)
    logged = {e["job"]: e["name"] for e in log.entries("decision")}
    assert sorted(logged.values()) == sorted(names)
    assert argv_copy.read_text().splitlines()[:3] == ["--job=1", "alice", "requeue"]


def test_notifier_argv_replaces_inside_elements_only() -> None:
    argv = notifier_argv(["/bin/n", "{job}", "x{user}y"], {"job": "1 2", "user": "$(id)"})
    assert argv == ["/bin/n", "1 2", "x$(id)y"]


@pytest.mark.parametrize(("script", "mode"), [
    ("#!/bin/bash\n#SBATCH --open-mode=append\nrun\n", "append"),
    ("#!/bin/bash\n#SBATCH --open-mode append -t 5\nrun\n", "append"),
    ("#!/bin/bash\n#SBATCH --open-mode=append\n#SBATCH --open-mode=truncate\n", "truncate"),
    ("#!/bin/bash\nrun\n#SBATCH --open-mode=append\n", None),  # after a command: ignored
    ("#!/bin/bash\n#SBATCH -J x\n", None),
])
def test_script_open_mode(script: str, mode: str | None) -> None:
    assert script_open_mode(script) == mode


def _site(tmp_path: Path, stall: str) -> Path:
    p = tmp_path / "site.toml"
    p.write_text(DEMO.read_text() + "\n[stall]\n" + stall)
    return p


def test_stall_section_loads_and_is_checked(tmp_path: Path) -> None:
    site = load_site(_site(tmp_path, 'max_requeues = 1\nexempt_users = ["ops"]\n'
                                     'notify_command = ["/usr/bin/logger", "{job}"]\n'))
    st = site.sections["stall"]
    assert st.max_requeues == 1 and st.exempt_users == ("ops",)
    assert isinstance(site.sections["usage"], Usage)
    for bad, key in (("max_requeus = 1\n", "max_requeus"),
                     ('notify_command = ["logger"]\n', "notify_command"),
                     ('action = "delete"\n', "action"),
                     ('exempt_partitions = ["nosuch"]\n', "exempt_partitions")):
        with pytest.raises(ConfigError) as e:
            load_site(_site(tmp_path, bad))
        assert key in str(e.value)


def test_cli_dry_run_prints_the_table(tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: cluster())
    res = CliRunner().invoke(cli, ["act", "requeue-stalled", "--format", "json", "--log",
                                   str(tmp_path / "a.jsonl"),
                                   "--store", str(tmp_path / "nostore")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["applied"] is False and doc["decisions"] == []
    assert "no metrics store" in res.stderr
    assert not (tmp_path / "a.jsonl").exists()


def test_cli_apply_with_the_lock_held_exits_zero_at_once(tmp_path: Path) -> None:
    with RunLock(tmp_path / "lock"):
        res = CliRunner().invoke(cli, ["act", "requeue-stalled", "--apply", "--lock",
                                       str(tmp_path / "lock"), "--log",
                                       str(tmp_path / "a.jsonl")])
    assert res.exit_code == 0
    assert "another run holds" in res.stderr
    assert not (tmp_path / "a.jsonl").exists()
