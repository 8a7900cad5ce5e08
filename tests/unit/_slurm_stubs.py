"""A CLI backend whose Slurm commands are one stand-in shell script (shared by the access
layer's unit tests)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from hetslurm.slurm.cli_backend import CliBackend


def stub_backend(tmp_path: Path, script: str, names: Iterable[str], **env: str) -> CliBackend:
    """``names`` in a fresh bin folder first on PATH, each running ``script``; ``env`` added
    to the backend's environment."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in names:
        exe = bindir / name
        exe.write_text(script)
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return CliBackend({"PATH": f"{bindir}:{os.environ['PATH']}", **env}, timeout=20)
