#!/usr/bin/env bash
# The whole test suite: the same set-up as the demo, then ruff, mypy, and the unit,
# slurmctld and cluster tests (the cluster tests boot the real local testbed themselves).
# Run as root on Debian 12: bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff" >&2
ruff check hetslurm tests
echo "== mypy" >&2
mypy
echo "== pytest (unit, slurmctld, cluster)" >&2
# Run from tests/ so 'import hetslurm' finds the installed package, not the source tree.
pytest -p no:cacheprovider -q "$@"

echo "== the hook under Lua 5.2, 5.3 and 5.4 (what RPM builds of job_submit/lua link)" >&2
for lua in lua52 lua53 lua54; do
    HETSLURM_LUA=$lua pytest -p no:cacheprovider -q tests/unit/test_hook_*.py \
        tests/unit/test_hostile_scripts.py tests/unit/test_request*.py \
        tests/unit/test_decision_record.py tests/unit/test_explain_options.py
done
