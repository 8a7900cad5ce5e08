"""Debian packages the testbed needs, installed without starting their system services."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hetslurm.errors import TestbedError
from hetslurm.process import run_command
from hetslurm.slurm.cli_backend import missing_commands

#: What SLURM-TESTBED.md found sufficient on Debian 12 (Slurm 22.05.8, job_submit_lua in
#: slurm-wlm-basic-plugins, linked against Lua 5.1).
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "munge",
    "libslurm-dev",
    "mariadb-server",
    "slurmrestd",
    "slurm-wlm-jwt-plugin",
)
#: Daemons and tools whose presence proves the packages work (checked after install); the
#: Slurm client commands are the access layer's to check (``missing_commands``).
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "munged", "mariadbd", "mariadb-install-db",
            "mariadb")

_POLICY_RC = Path("/usr/sbin/policy-rc.d")


def missing_packages() -> list[str]:
    """Packages of :data:`PACKAGES` that dpkg does not report as installed."""
    missing = []
    for pkg in PACKAGES:
        res = run_command(["dpkg-query", "-W", "-f=${Status}", pkg], timeout=30, check=False)
        if res.returncode != 0 or "install ok installed" not in res.stdout:
            missing.append(pkg)
    return missing


def ensure_packages(log: object = print) -> list[str]:
    """Install missing packages; return what was installed.

    Services are kept from starting: ``policy-rc.d`` answering 101 is Debian's documented way
    to tell maintainer scripts not to start daemons (the testbed starts its own, on its own
    ports and sockets).
    """
    if shutil.which("dpkg-query") is None:
        raise TestbedError("the testbed needs Debian (dpkg/apt not found)")
    missing = missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0:
        raise TestbedError(f"packages missing ({', '.join(missing)}); run as root to install them")
    log(f"installing Debian packages: {' '.join(missing)}")  # type: ignore[operator]
    apt_install(missing)
    still = missing_packages()
    if still:
        raise TestbedError(f"apt-get did not install: {', '.join(still)}")
    return missing


def apt_install(pkgs: list[str]) -> None:
    """``apt-get install`` as root with services kept from starting.

    ``policy-rc.d`` answering 101 is Debian's documented way to tell maintainer scripts not
    to start daemons; an existing one is left alone.
    """
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    created_policy = False
    if not _POLICY_RC.exists():
        _POLICY_RC.write_text("#!/bin/sh\n# written by hetslurm during apt-get\nexit 101\n")
        _POLICY_RC.chmod(0o755)
        created_policy = True
    try:
        run_command(["apt-get", "update", "-qq"], timeout=600, env=env)
        run_command(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *pkgs],
                    timeout=1800, env=env)
    finally:
        if created_policy:
            _POLICY_RC.unlink(missing_ok=True)


def check_binaries() -> None:
    absent = [b for b in BINARIES if shutil.which(b) is None] + missing_commands()
    if absent:
        raise TestbedError(f"missing programs after install: {', '.join(absent)}")
