"""The cached Debian roots of other Slurm releases (hetslurm/testbed/roots.py): where they
live, when one counts as ready, and what refuses to build. The real build ran by hand on this
machine (docs/testbed.md); these tests need no network."""

from __future__ import annotations

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
