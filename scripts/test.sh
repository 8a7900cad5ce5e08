#!/usr/bin/env bash
# The whole test suite: the same set-up as the demo, then ruff, mypy, and the unit,
# slurmctld and cluster tests (the cluster tests boot the real local testbed themselves),
# then the release tier of the cluster tests on the other supported releases (on Debian 12:
# Slurm 24.11 and 26.05, each from its cached Debian root, built when missing:
# docs/testbed.md).
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
        tests/unit/test_decision_record.py tests/unit/test_explain_options.py \
        tests/unit/test_classify.py
done

# The cluster tests whose outcome depends on the Slurm release: jobs, the hook, the access
# layer's reads, audit against sacct, requeue, ranked fallback, the testbed's own life,
# drains and node weights through scontrol (reasons and weights read back per release).
RELEASE_TIER=(
    tests/cluster/test_backend_contract.py
    tests/cluster/test_site_import_live.py
    tests/cluster/test_accounting_usage.py
    tests/cluster/test_learn_speeds_live.py
    tests/cluster/test_classify_live.py
    tests/cluster/test_advise_live.py
    tests/cluster/test_testbed_jobs.py
    tests/cluster/test_hook_cluster.py
    tests/cluster/test_metrics_collect.py
    tests/cluster/test_act_requeue.py
    tests/cluster/test_prefer_fallback.py
    tests/cluster/test_ranked_fallback.py
    tests/cluster/test_status_live.py
    tests/cluster/test_place_live.py
    tests/cluster/test_slurm_free_text_live.py
    tests/cluster/test_health_live.py
    tests/cluster/test_weights_live.py
)
# Every supported release but the host's own (the suite above ran on that one), each from its
# cached Debian root; HETSLURM_RELEASE_TIERS="24.11 26.05" names them instead ("" for none).
if [ -z "${HETSLURM_RELEASE_TIERS+set}" ]; then
    HETSLURM_RELEASE_TIERS=$(python -c 'from hetslurm.testbed import roots
from hetslurm.testbed.cluster import Testbed
print(" ".join(r for r in roots.SUITES if r != Testbed().host_release))')
fi
for release in $HETSLURM_RELEASE_TIERS; do
    echo "== the release tier on Slurm $release" >&2
    start=$SECONDS
    HETSLURM_TEST_SLURM=$release HETSLURM_TEST_TESTBED_DIR="$PWD/.testbed-tests-$release" \
        pytest -p no:cacheprovider -q "${RELEASE_TIER[@]}"
    echo "== release tier $release: $((SECONDS - start)) s" >&2
done
