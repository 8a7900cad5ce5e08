#!/usr/bin/env bash
# Shared set-up for scripts/demo.sh and scripts/test.sh, on a fresh Debian 12 as root:
# system packages for building, a virtual environment in .venv, hetslurm installed into it
# with its compiled core, and the Debian packages of the local Slurm testbed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
    echo "setup: run as root (the testbed starts Slurm daemons and installs Debian packages)" >&2
    exit 1
fi

PY=${PYTHON:-python3}
need_apt=()
command -v "$PY" >/dev/null 2>&1 || need_apt+=(python3)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
if command -v "$PY" >/dev/null 2>&1; then
    "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
    inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
    [ -f "$inc/Python.h" ] || need_apt+=(python3-dev)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# A regular (non-editable) install: the tests import the installed package, compiled core
# included, exactly as a user gets it.
echo "setup: installing hetslurm (compiling hetslurm._core)" >&2
.venv/bin/python -m pip install -q ".[dev]"
.venv/bin/hetslurm testbed install
