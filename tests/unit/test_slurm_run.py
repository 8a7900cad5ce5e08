"""run_command: argv only, a timeout always, the process group killed on timeout."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from hetslurm.errors import BackendError, CommandError
from hetslurm.process import run_command


def test_returns_output_and_passes_env_and_input() -> None:
    res = run_command(
        [sys.executable, "-c", "import os,sys; print(os.environ['HB_X'], sys.stdin.read())"],
        timeout=30,
        env={**os.environ, "HB_X": "hello"},
        input="from-stdin",
    )
    assert res.returncode == 0
    assert res.stdout.strip() == "hello from-stdin"


def test_nonzero_exit_raises_with_failure_data() -> None:
    argv = [sys.executable, "-c", "import sys; sys.stderr.write('boom\\n'); sys.exit(3)"]
    with pytest.raises(CommandError) as info:
        run_command(argv, timeout=30)
    failure = info.value.failure
    assert failure.returncode == 3
    assert failure.argv == tuple(argv)
    assert "boom" in failure.stderr
    assert failure.timed_out is False
    assert "boom" in str(info.value)


def test_check_false_returns_nonzero() -> None:
    res = run_command([sys.executable, "-c", "raise SystemExit(2)"], timeout=30, check=False)
    assert res.returncode == 2


def test_missing_executable_names_the_binary() -> None:
    with pytest.raises(BackendError) as info:
        run_command(["hb-no-such-binary-xyz", "--json"], timeout=5)
    assert not isinstance(info.value, CommandError)
    assert "hb-no-such-binary-xyz" in str(info.value)


def test_string_argv_is_refused() -> None:
    with pytest.raises(TypeError):
        run_command("echo hi", timeout=5)


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    # A killed orphan may linger as a zombie until its new parent reaps it.
    return "\nState:\tZ" not in status


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '60'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    with pytest.raises(CommandError) as info:
        run_command([sys.executable, "-c", script], timeout=1.5)
    assert info.value.failure.timed_out is True
    assert time.monotonic() - start < 15
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)
