"""Which Slurm a testbed runs, and what a root changes in its environment (no daemons: the
real boots are the cluster tier's, with ``HETSLURM_TEST_SLURM``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import ConfigError, TestbedError
from hetslurm.site.examples import example
from hetslurm.testbed import Testbed
from hetslurm.testbed import cluster as cluster_mod


def _tb(tmp_path: Path, *, host: str, wanted: str | None = None) -> Testbed:
    tb = Testbed(tmp_path / "tb", slurm=wanted)
    tb.__dict__["host_release"] = host  # cached_property: no Slurm asked
    return tb


def test_a_release_the_host_lacks_runs_from_a_root_with_wrappers_first_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"/usr/bin:{tmp_path / 'tb' / 'bin'}:/bin")
    tb = _tb(tmp_path, host="22.05", wanted="24.11")
    assert tb.in_root
    path = tb.env_vars()["PATH"].split(":")
    assert path == [str(tb.bindir), "/usr/bin", "/bin"]  # once, first
    assert f'export PATH={tb.bindir}:"$PATH"' in tb.env_line().splitlines()
    # 24.11's slurmd needs cgroup.conf saying CgroupPlugin=disabled.
    st = cluster_mod.State(site="s", cluster="c", ports={"slurmctld": 1, "slurmd": 2,
                                                          "slurmdbd": 3}, node_ports={},
                           db_password="x")
    assert tb.runtime(st).cgroup_disabled


def test_the_hosts_release_needs_no_root_and_keeps_path(tmp_path: Path) -> None:
    tb = _tb(tmp_path, host="22.05", wanted="22.05")
    assert not tb.in_root
    assert "PATH" not in tb.env_vars()
    assert "PATH" not in tb.env_line()
    assert tb.slurm_root is None


def test_without_slurm_a_testbed_keeps_the_release_it_was_brought_up_with(
        tmp_path: Path) -> None:
    root = tmp_path / "tb"
    root.mkdir()
    (root / "testbed.json").write_text(json.dumps({
        "site": "s", "cluster": "c", "ports": {}, "node_ports": {}, "db_password": "x",
        "slurm": "26.05"}))
    assert _tb(tmp_path, host="22.05").slurm_release == "26.05"
    # A state written before releases were recorded is the host's.
    (root / "testbed.json").write_text(json.dumps({
        "site": "s", "cluster": "c", "ports": {}, "node_ports": {}, "db_password": "x"}))
    assert _tb(tmp_path, host="22.05").slurm_release == "22.05"


def test_a_second_release_while_one_runs_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_mod.os, "geteuid", lambda: 0)
    root = tmp_path / "tb"
    root.mkdir()
    (root / "testbed.json").write_text(json.dumps({
        "site": "s", "cluster": "hetdemo", "ports": {}, "node_ports": {},
        "db_password": "x", "slurm": "24.11"}))
    tb = _tb(tmp_path, host="22.05", wanted="26.05")
    monkeypatch.setattr(Testbed, "running", lambda self, st=None: {"slurmctld": True})
    with pytest.raises(TestbedError, match=r"runs Slurm 24\.11; one release at a time"):
        tb.up(example("demo.toml"))


def test_an_unsupported_release_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Slurm 21\.08 is not supported"):
        Testbed(tmp_path / "tb", slurm="21.08")
    res = CliRunner().invoke(cli, ["testbed", "up", "--slurm", "21.08", "--dir",
                                   str(tmp_path / "tb")])
    assert res.exit_code != 0
    assert "Slurm 21.08 is not supported; hetslurm supports 22.05, 24.11, 26.05" in res.output
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize(("text", "release"), [("12.8", "22.05"), ("13.1", "24.11"),
                                               ("trixie/sid", "26.05"), ("11.9", "22.05")])
def test_the_release_a_hosts_debian_ships(tmp_path: Path, text: str, release: str) -> None:
    f = tmp_path / "debian_version"
    f.write_text(text + "\n")
    assert cluster_mod.debian_release(f) == release


def test_status_of_no_testbed_says_no_version(tmp_path: Path) -> None:
    st = _tb(tmp_path, host="22.05").status()
    assert st["exists"] is False and st["slurm_version"] is None
