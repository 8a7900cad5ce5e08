#!/usr/bin/env bash
# The rebalance part of the demo: a GPU job that holds two GPUs and does nothing (fake NVML
# reads 0 %), the collector watching it, and `hetslurm rebalance` catching it: a dry run
# (nothing changes), then --apply twice: the warning first, then the requeue, checked in
# Slurm. Needs the testbed up and SLURM_CONF pointing at it; called from scripts/demo.sh.
# Run as root: bash scripts/demo-rebalance.sh   (about a minute and a half)
set -euo pipefail
cd "$(dirname "$0")/.."
HS=${HS:-.venv/bin/hetslurm}
PY=${PY:-.venv/bin/python}  # run with -P: the installed package, not the tree in the cwd
: "${SLURM_CONF:?point SLURM_CONF at the testbed: eval \"\$($HS testbed env)\"}"
GRES="$(dirname "$SLURM_CONF")/gres.conf"
TB=${HETSLURM_TESTBED_DIR:-$PWD/.testbed}
WORK=${HETSLURM_DEMO_REBALANCE:-/tmp/hetslurm-demo-rebalance}
rm -rf "$WORK" && mkdir -p "$WORK"

# The demo site plus a policy sized for a demo: a 60 s idle window (the shortest the schema
# allows; a real site judges an hour) and no grace, so one minute of samples is enough.
SITE="$WORK/site.toml"
cat "${HETSLURM_SITE:-site-configs/demo.toml}" > "$SITE"
cat >> "$SITE" <<EOF

[stall]
window_s = 60
grace_after_start_s = 0
warning_grace_s = 0
action_log = "$WORK/actions.jsonl"
lock_file = "$WORK/act.lock"

[rebalance]
lock_file = "$WORK/rebalance.lock"
EOF

echo "== rebalance: a job that holds GPUs and does nothing"
$PY -P -m hetslurm.lab.demo_nvml scenario "$GRES" "$WORK/scenario.json"
sb() { sbatch --parsable -o /dev/null --requeue "$@"; }
idle=$(sb -J forgot-gpus -p gpu -w gpu1 --gres=gpu:h100:2 --wrap 'sleep 600')
busy=$(sb -J training -p gpu --gres=gpu:a100:2 --wrap 'sleep 600')
for _ in $(seq 30); do
    [ -z "$(squeue -h -t PD -j "$idle,$busy" -o %i)" ] && break
    sleep 1
done
$PY -P -m hetslurm.lab.demo_nvml busy "$WORK/scenario.json" "$GRES" "$busy" 85
echo "submitted: idle $idle (2 x h100, 0 %), busy $busy (2 x a100, 85 %)"
$HS collect --all-nodes --nvml fake --fake-scenario "$WORK/scenario.json" \
    --store "$WORK/store" --interval 2 --flush 5 2>/dev/null &
collector=$!
trap 'kill -TERM "$collector" 2>/dev/null || true; scancel "$idle" "$busy" 2>/dev/null || true' EXIT
echo "-- collecting a minute of samples (fake NVML, 2 s interval)"
sleep 66

# shellcheck disable=SC2206  # HS may be "python -m hetslurm"
RB=($HS rebalance --site "$SITE" --store "$WORK/store" --testbed "$TB")
echo "-- hetslurm rebalance (dry run: nothing changes, nothing is written). Its drift rows are"
echo "   what \`hetslurm site apply\` would still do: the testbed boots without the site's QOS."
"${RB[@]}"
echo "-- hetslurm rebalance --apply: the first sighting only warns (logged, user notified)"
"${RB[@]}" --apply --only requeue-stalled
sleep 1
echo "-- hetslurm rebalance --apply again: warned and still idle, so it is requeued"
"${RB[@]}" --apply --only requeue-stalled
echo "-- what Slurm shows for the idle job now:"
scontrol show job "$idle" | grep -oE '(JobState|Restarts|Reason)=[^ ]+' | paste -sd' '
echo "-- the action log ($WORK/actions.jsonl), one JSON object per line:"
$PY - "$WORK/actions.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    e = json.loads(line)
    what = e.get("result") or e.get("rule") or ""
    src = e.get("source", "requeue-stalled")
    print(f"  {e['kind']:<8} {src:<16} job={e.get('job', '-'):<4} {e.get('action', '')} {what}")
PY
