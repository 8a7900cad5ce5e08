"""The cached Debian roots of other Slurm releases (hetslurm/testbed/roots.py): where they
live, when one counts as ready, and what refuses to build. The real build ran by hand on this
machine (docs/testbed.md); these tests need no network."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hetslurm.errors import ConfigError, TestbedError
from hetslurm.testbed import roots


def test_the_host_mirror_from_deb822_and_one_line_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n"
        "URIs: http://deb.debian.org/debian\nSuites: bookworm\n")
    assert roots.host_mirror(tmp_path) == "http://deb.debian.org/debian"
    other = tmp_path / "old"
    other.mkdir()
    (other / "sources.list").write_text(
        "# comment\ndeb [arch=amd64] http://mirror.example/debian/ bookworm main\n")
    assert roots.host_mirror(other) == "http://mirror.example/debian"
    empty = tmp_path / "none"
    empty.mkdir()
    with pytest.raises(TestbedError, match="no Debian mirror found"):
        roots.host_mirror(empty)


def test_only_a_finished_root_is_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(roots.ROOTS_ENV, str(tmp_path))
    assert roots.root_path("24.11") == tmp_path / "trixie"
    assert roots.root_path("26.05") == tmp_path / "sid"
    (tmp_path / "trixie").mkdir()
    assert roots.ready_root("24.11") is None  # half-built: no READY
    (tmp_path / "trixie" / roots.READY).write_text("24.11.5\n")
    ready = roots.ready_root("24.11")
    assert ready is not None and ready.slurm_version == "24.11.5"
    # A ready root is reused: no build step runs (none could here).
    assert roots.build_root("24.11.5") == ready


def test_what_refuses_to_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(roots.ROOTS_ENV, str(tmp_path))
    with pytest.raises(TestbedError, match=r"Slurm 22\.05 runs from the host.s own packages"):
        roots.build_root("22.05")
    with pytest.raises(ConfigError, match=r"Slurm 21\.08 is not supported"):
        roots.build_root("21.08")
    monkeypatch.setattr(roots.os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedError, match=r"building the Slurm 26\.05 root needs root"):
        roots.build_root("26.05")


def _fake_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rel in ("usr/sbin/slurmctld", "usr/sbin/slurmdbd", "usr/bin/sbatch", "usr/bin/squeue"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    return root


def test_wrappers_run_the_roots_programs_in_the_callers_folder(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    bindir = tmp_path / "bin"
    written = roots.write_wrappers(root, bindir, "24.11")
    # Only what the root has: no wrapper that would run a missing program.
    assert sorted(written) == ["sbatch", "slurmctld", "slurmdbd", "squeue"]
    ctld = (bindir / "slurmctld").read_text()
    assert f'exec /usr/sbin/chroot {root} /usr/bin/env -C "$d" /usr/sbin/slurmctld "$@"' in ctld
    assert f'[ -d {root}"$d" ] || d=/' in ctld  # a folder the root cannot see: run in /
    assert '/usr/bin/env -C "$d" /usr/bin/sbatch "$@"' in (bindir / "sbatch").read_text()
    for name in written:
        assert (bindir / name).stat().st_mode & 0o111
        res = subprocess.run(["sh", "-n", str(bindir / name)], capture_output=True, check=False)
        assert res.returncode == 0, res.stderr


def test_mount_points_see_bind_mounts_and_escaped_names(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\n"
                      "/dev/vda /var/cache/r/trixie/tmp ext4 rw 0 0\n"
                      "/dev/vda /var/cache/r/trixie/my\\040dir ext4 rw 0 0\n")
    got = roots.mount_points(mounts)
    assert "/var/cache/r/trixie/tmp" in got
    assert "/var/cache/r/trixie/my dir" in got


def test_shared_folders_are_bound_once_outermost_first(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    outer = tmp_path / "share"
    inner = outer / "testbed"
    inner.mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    ran: list[list[str]] = []
    monkeypatch.setattr(roots, "_step", lambda what, argv, timeout, env=None: ran.append(argv))
    monkeypatch.setattr(roots, "is_mounted", lambda p: False)
    done = roots.bind_shared(root, [inner, outer, other, tmp_path / "missing", Path("/")])
    # The inner folder is seen through the outer one; a missing folder and / are not bound.
    assert [a[-2] for a in ran] == [str(other), str(outer)]
    assert all(a[:2] == ["mount", "--bind"] for a in ran)
    assert done == [str(root / other.relative_to("/")), str(root / outer.relative_to("/"))]
    assert (root / inner.relative_to("/")).parent.is_dir()


def test_missing_in_root_reads_the_roots_dpkg_status(tmp_path: Path) -> None:
    from hetslurm.testbed.roots import PACKAGES, missing_in_root

    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    installed = [p for p in PACKAGES if p != "slurmrestd"]
    paras = [f"Package: {p}\nStatus: install ok installed\nVersion: 1\n" for p in installed]
    paras.append("Package: slurmrestd\nStatus: deinstall ok config-files\nVersion: 1\n")
    status.write_text("\n".join(paras))
    assert missing_in_root(tmp_path) == ["slurmrestd"]
    assert missing_in_root(tmp_path / "nothing-here") == []
