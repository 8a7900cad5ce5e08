"""Files that carry power are refused when someone else could have written them
(hetslurm.fsguard): the installed hook, the metric store's folders, the action log, the run
lock and the site file a root rebalance reads. Each refusal is one line and exit code 8; the
ordinary 0644/0755 cases keep working.

The tests run as root, so "another user" is uid 65534 (nobody), set with chown.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm import fsguard
from hetslurm.act.lock import RunLock
from hetslurm.act.log import ActionLog
from hetslurm.cli import cli
from hetslurm.errors import PermissionsError
from hetslurm.metrics.store import SegmentStore
from hetslurm.site import load_site
from hetslurm.site.load import read_site_as_root

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
NOBODY = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    assert lines[0].startswith("hetslurm: error: refusing") or "unsafe" in lines[0], lines[0]
    return lines[0]


# The rule ----------------------------------------------------------------------------------


def test_the_rule(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    for mode, why in ((0o644, None), (0o600, None), (0o664, "writable by its group"),
                      (0o646, "writable by others"), (0o666, "writable by group and others")):
        os.chmod(f, mode)
        got = fsguard.problem(os.stat(f))
        assert got == (None if why is None else f"{why} (mode {mode:04o})")


@needs_root
def test_the_rule_on_owners(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    os.chown(f, NOBODY, -1)
    assert fsguard.problem(os.stat(f)) == "owned by uid 65534, not by root"
    assert fsguard.problem(os.stat(f), fsguard.trusted_uids([NOBODY])) is None


# The installed hook ------------------------------------------------------------------------


@pytest.fixture()
def installed(tmp_path: Path) -> Path:
    pytest.importorskip("lupa")
    from hetslurm.hook.install import install_hook

    conf = tmp_path / "etc"
    conf.mkdir()
    install_hook(load_site(DEMO), conf)
    return conf


def _install(conf: Path, *args: str) -> object:
    return CliRunner().invoke(cli, ["hook", "install", "--slurm-version", "22.05",
                                    "--site", str(DEMO), "--dir", str(conf),
                                    "--format", "json", *args])


def test_identical_world_writable_hook_is_replaced_not_unchanged(installed: Path) -> None:
    hook = installed / "job_submit.lua"
    text = hook.read_text()
    hook.chmod(0o666)
    inode = hook.stat().st_ino
    res = _install(installed)
    assert res.exit_code == 0, res.output  # type: ignore[attr-defined]
    assert "replaced" in res.stderr and "mode 0666" in res.stderr  # type: ignore[attr-defined]
    st = hook.stat()
    assert fsguard.mode_text(st) == "0644" and st.st_ino != inode  # a fresh file
    assert hook.read_text() == text
    # Now safe and identical: unchanged again.
    again = _install(installed)
    assert again.exit_code == 0 and "replaced" not in again.stderr  # type: ignore[attr-defined]
    assert '"changed": false' in again.stdout  # type: ignore[attr-defined]


def test_check_reports_mode_and_owner_and_refuses_an_unsafe_hook(installed: Path) -> None:
    hook = installed / "job_submit.lua"
    ok = CliRunner().invoke(cli, ["hook", "check", "--dir", str(installed), "--format", "json",
                                   "--slurm-version", "22.05"])
    assert ok.exit_code == 0, ok.output
    assert '"file_mode": "0644"' in ok.stdout and '"permissions": "ok"' in ok.stdout
    assert f'"owner_uid": {os.geteuid()}' in ok.stdout
    hook.chmod(0o666)
    bad = CliRunner().invoke(cli, ["hook", "check", "--dir", str(installed), "--format", "json",
                                   "--slurm-version", "22.05"])
    assert bad.exit_code == 8
    assert '"file_mode": "0666"' in bad.stdout
    line = one_line(bad.stderr)
    assert "writable by group and others (mode 0666)" in line


@needs_root
def test_foreign_owned_hook_is_refused_and_left_alone(installed: Path) -> None:
    hook = installed / "job_submit.lua"
    os.chown(hook, NOBODY, -1)
    before = (hook.read_bytes(), hook.stat().st_mtime_ns)
    res = _install(installed)
    assert res.exit_code == 8  # type: ignore[attr-defined]
    assert "owned by uid 65534" in one_line(res.stderr)  # type: ignore[attr-defined]
    assert (hook.read_bytes(), hook.stat().st_mtime_ns) == before
    assert hook.stat().st_uid == NOBODY


def test_disable_refuses_to_rewrite_an_unsafe_hook(installed: Path) -> None:
    hook = installed / "job_submit.lua"
    hook.chmod(0o646)
    before = hook.read_bytes()
    res = CliRunner().invoke(cli, ["hook", "disable", "--dir", str(installed)])
    assert res.exit_code == 8
    assert "writable by others (mode 0646)" in one_line(res.stderr)
    assert hook.read_bytes() == before


def test_symlinked_hook_is_refused(installed: Path, tmp_path: Path) -> None:
    hook = installed / "job_submit.lua"
    elsewhere = tmp_path / "elsewhere.lua"
    hook.rename(elsewhere)
    hook.symlink_to(elsewhere)
    res = _install(installed)
    assert res.exit_code == 8  # type: ignore[attr-defined]
    assert "symlink" in one_line(res.stderr)  # type: ignore[attr-defined]
    assert hook.is_symlink()


def test_install_refuses_a_conf_folder_others_can_write(installed: Path) -> None:
    installed.chmod(0o777)
    res = _install(installed)
    assert res.exit_code == 8  # type: ignore[attr-defined]
    assert "Slurm configuration folder" in one_line(res.stderr)  # type: ignore[attr-defined]


# The metric store --------------------------------------------------------------------------


ROW = {"time": 1_700_000_000.0, "node": "n1", "minor": 0, "job_id": 1,
       "utilization_pct": 50.0, "status": "ok", "interval_s": 30.0}


def test_normal_store_folders_work(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path / "store")
    store.write("n1", [ROW])
    frame, report = store.read()
    assert len(frame) == 1 and not report.partial


def test_writer_makes_folders_0755_whatever_its_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        seg = SegmentStore(tmp_path / "store").write("n1", [ROW])
    finally:
        os.umask(old)
    assert seg is not None
    for d in (seg.parent, seg.parent.parent, seg.parent.parent.parent):
        assert fsguard.mode_text(d.stat()) == "0755", d


@pytest.mark.parametrize("level", ["root", "node", "day"])
def test_a_0777_store_folder_is_refused_for_reading_and_writing(tmp_path: Path,
                                                                level: str) -> None:
    store = SegmentStore(tmp_path / "store")
    seg = store.write("n1", [ROW])
    assert seg is not None
    folder = {"root": store.root, "node": seg.parent.parent, "day": seg.parent}[level]
    folder.chmod(0o777)
    with pytest.raises(PermissionsError, match=r"writable by group and others \(mode 0777\)"):
        store.read()
    with pytest.raises(PermissionsError, match="refusing metric store"):
        store.write("n1", [ROW])
    assert list(seg.parent.iterdir()) == [seg]  # nothing written


def test_a_group_writable_node_folder_is_refused(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path / "store")
    seg = store.write("n1", [ROW])
    assert seg is not None
    seg.parent.parent.chmod(0o775)
    with pytest.raises(PermissionsError, match=r"node folder .* writable by its group"):
        store.read(nodes=["n1"])


@needs_root
def test_a_store_folder_of_another_user_is_refused_unless_trusted(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path / "store")
    seg = store.write("n1", [ROW])
    assert seg is not None
    os.chown(seg.parent.parent, NOBODY, -1)
    with pytest.raises(PermissionsError, match="owned by uid 65534"):
        store.read()
    frame, _ = SegmentStore(tmp_path / "store", trusted_uids=[NOBODY]).read()
    assert len(frame) == 1


def test_audit_refuses_a_0777_store_with_one_line(tmp_path: Path) -> None:
    store = SegmentStore(tmp_path / "store")
    seg = store.write("n1", [ROW])
    assert seg is not None
    seg.parent.parent.chmod(0o777)
    sacct = tmp_path / "sacct.json"
    sacct.write_text('{"jobs": []}')
    res = CliRunner().invoke(cli, ["audit", "--site", str(DEMO), "--store", str(store.root),
                                   "--sacct-file", str(sacct), "--since", "2023-11-01",
                                   "--until", "2023-11-30"])
    assert res.exit_code == 8, res.output
    assert "node folder" in one_line(res.stderr)


# The action log ----------------------------------------------------------------------------


def test_a_symlinked_action_log_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    ActionLog(real).append("run", {"t": 1.0})
    before = real.read_bytes()
    link = tmp_path / "actions.jsonl"
    link.symlink_to(real)
    log = ActionLog(link)
    with pytest.raises(PermissionsError, match=r"refusing action log .*: it is a symlink"):
        list(log.entries())
    with pytest.raises(PermissionsError, match="symlink"):
        log.append("run", {"t": 2.0})
    assert real.read_bytes() == before


@pytest.mark.parametrize("mode", [0o666, 0o662, 0o620])
def test_an_action_log_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    log = ActionLog(tmp_path / "a.jsonl")
    log.append("run", {"t": 1.0})
    log.path.chmod(mode)
    with pytest.raises(PermissionsError, match=f"mode {mode:04o}"):
        list(log.entries())


@needs_root
def test_an_action_log_of_another_user_is_refused(tmp_path: Path) -> None:
    log = ActionLog(tmp_path / "a.jsonl")
    log.append("run", {"t": 1.0})
    os.chown(log.path, NOBODY, -1)
    with pytest.raises(PermissionsError, match="owned by uid 65534"):
        list(log.entries())


def test_a_normal_action_log_works(tmp_path: Path) -> None:
    log = ActionLog(tmp_path / "logs" / "a.jsonl")
    log.append("run", {"t": 1.0})
    assert fsguard.mode_text(log.path.stat()) == "0640"
    assert [e["kind"] for e in log.entries()] == ["run"]


def test_requeue_stalled_refuses_a_symlinked_log_with_one_line(tmp_path: Path) -> None:
    real = tmp_path / "real.jsonl"
    real.write_text("")
    link = tmp_path / "actions.jsonl"
    link.symlink_to(real)
    site = tmp_path / "site.toml"
    site.write_text(DEMO.read_text() + f'\n[stall]\naction_log = "{link}"\n')
    res = CliRunner().invoke(cli, ["act", "requeue-stalled", "--site", str(site),
                                   "--store", str(tmp_path / "none")])
    assert res.exit_code == 8, res.output
    assert "action log" in one_line(res.stderr)


# The lock ----------------------------------------------------------------------------------


def test_a_symlinked_lock_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    (tmp_path / "lock").symlink_to(target)
    with pytest.raises(PermissionsError, match=r"refusing lock file .*: it is a symlink"):
        RunLock(tmp_path / "lock").acquire()
    assert target.read_text() == "keep"


def test_a_symlinked_lock_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "run").symlink_to(tmp_path / "real")
    with pytest.raises(PermissionsError, match=r"refusing lock folder .*: it is a symlink"):
        RunLock(tmp_path / "run" / "act.lock").acquire()
    assert not (tmp_path / "real" / "act.lock").exists()


def test_a_lock_or_lock_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "run" / "act.lock"
    with RunLock(lock):
        pass
    lock.chmod(0o666)
    with pytest.raises(PermissionsError, match=r"refusing lock file .*\(mode 0666\)"):
        RunLock(lock).acquire()
    lock.chmod(0o600)
    lock.parent.chmod(0o1777)
    with pytest.raises(PermissionsError, match=r"refusing lock folder .*\(mode 1777\)"):
        RunLock(lock).acquire()


@needs_root
def test_a_lock_of_another_user_is_refused(tmp_path: Path) -> None:
    lock = tmp_path / "act.lock"
    lock.write_text("")
    os.chown(lock, NOBODY, -1)
    with pytest.raises(PermissionsError, match="owned by uid 65534"):
        RunLock(lock).acquire()


def test_a_lock_path_naming_another_file_leaves_it_alone(tmp_path: Path) -> None:
    other = tmp_path / "passwd"
    other.write_text("root:x:0:0:root:/root:/bin/bash\n")
    other.chmod(0o644)
    with pytest.raises(PermissionsError, match="holds something other than a pid"):
        RunLock(other).acquire()
    assert other.read_text() == "root:x:0:0:root:/root:/bin/bash\n"


def test_a_normal_lock_works_and_holds_a_pid(tmp_path: Path) -> None:
    lock = tmp_path / "run" / "act.lock"
    with RunLock(lock):
        assert lock.read_text() == f"{os.getpid()}\n"
        assert fsguard.mode_text(lock.parent.stat()) == "0755"
    with RunLock(lock):  # a pid left behind is what a lock file holds
        pass


# The site file a root rebalance reads ------------------------------------------------------


def _site(tmp_path: Path, mode: int) -> Path:
    site = tmp_path / "site.toml"
    site.write_text(DEMO.read_text() + f'\n[rebalance]\nlock_file = "{tmp_path}/r.lock"\n')
    site.chmod(mode)
    return site


@needs_root
@pytest.mark.parametrize("mode", [0o666, 0o646, 0o664])
def test_rebalance_as_root_refuses_a_site_file_others_can_write(tmp_path: Path,
                                                                mode: int) -> None:
    site = _site(tmp_path, mode)
    res = CliRunner().invoke(cli, ["rebalance", "--site", str(site), "--apply"])
    assert res.exit_code == 8, res.output
    assert f"refusing site file {site}" in one_line(res.stderr)
    assert not (tmp_path / "r.lock").exists()  # refused before the lock path was used


@needs_root
def test_rebalance_as_root_refuses_a_site_file_of_another_user(tmp_path: Path) -> None:
    site = _site(tmp_path, 0o644)
    os.chown(site, NOBODY, -1)
    res = CliRunner().invoke(cli, ["rebalance", "--site", str(site)])
    assert res.exit_code == 8
    assert "owned by uid 65534, not by root" in one_line(res.stderr)
    with pytest.raises(PermissionsError):
        read_site_as_root(site)


@needs_root
def test_a_root_owned_0644_site_file_is_read(tmp_path: Path) -> None:
    site = _site(tmp_path, 0o644)
    assert read_site_as_root(site) == site.read_text()
    link = tmp_path / "current.toml"
    link.symlink_to(site)  # an admin's link to the file in use is followed
    assert read_site_as_root(link) == site.read_text()



@needs_root
def test_a_site_file_that_is_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    os.mkfifo(site, 0o644)
    res = CliRunner().invoke(cli, ["rebalance", "--site", str(site)])
    assert res.exit_code == 8
    assert "it is not a regular file" in one_line(res.stderr)
