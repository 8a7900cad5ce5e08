#!/usr/bin/env bash
# The metrics part of the demo: collect fake-NVML samples while GPU jobs run (one of them
# idle), then print the audit. Needs the testbed up and SLURM_CONF pointing at it; called
# from scripts/demo.sh after `testbed up`. Run as root: bash scripts/demo-audit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
HS=${HS:-.venv/bin/hetslurm}
PY=${PY:-.venv/bin/python}  # run with -P: the installed package, not the tree in the cwd
SITE=${HETSLURM_SITE:-site-configs/demo.toml}
: "${SLURM_CONF:?point SLURM_CONF at the testbed: eval \"\$($HS testbed env)\"}"
GRES="$(dirname "$SLURM_CONF")/gres.conf"
WORK=${HETSLURM_DEMO_METRICS:-/tmp/hetslurm-demo-metrics}
rm -rf "$WORK" && mkdir -p "$WORK"

echo "== GPU metrics: fake NVML devices from $GRES (shuffled order, random UUIDs)"
$PY -P -m hetslurm.lab.demo_nvml scenario "$GRES" "$WORK/scenario.json"
since=$(date +%s)
sb() { sbatch --parsable -o /dev/null "$@"; }
busy1=$(sb -J train-busy --gres=gpu:h100:2 -w gpu1 --wrap 'sleep 30')
idle1=$(sb -J forgot-gpus --gres=gpu:h100:2 -w gpu1 --wrap 'sleep 30')
busy2=$(sb -J infer-busy --gres=gpu:a100:4 --wrap 'sleep 30')
echo "submitted: busy $busy1 (h100), idle $idle1 (h100, same node), busy $busy2 (a100)"
for _ in $(seq 30); do
    [ -z "$(squeue -h -t PD -j "$busy1,$idle1,$busy2" -o %i)" ] && break
    sleep 1
done
$PY -P -m hetslurm.lab.demo_nvml busy "$WORK/scenario.json" "$GRES" "$busy1" 85
$PY -P -m hetslurm.lab.demo_nvml busy "$WORK/scenario.json" "$GRES" "$busy2" 60

echo "== hetslurm collect (fake NVML, every GPU node of the testbed, 2 s interval)"
$HS collect --all-nodes --nvml fake --fake-scenario "$WORK/scenario.json" \
    --store "$WORK/store" --interval 2 --flush 10 &
collector=$!
for _ in $(seq 60); do
    [ -z "$(squeue -h -j "$busy1,$idle1,$busy2" -o %i 2>/dev/null)" ] && break
    sleep 1
done
kill -TERM "$collector"
wait "$collector" || true
sleep 2   # slurmdbd records the last job ends

echo "== hetslurm audit (sacct from slurmdbd + the samples): GPU-hours by model, idle jobs"
$HS audit --site "$SITE" --store "$WORK/store" --since "$since" --until now \
    --table by_gpu_model --table idle_jobs --table fragmentation --table placement
$HS audit --site "$SITE" --store "$WORK/store" --since "$since" --until now \
    --format html --out "$WORK/audit.html" --plot "$WORK/plots" >/dev/null
echo "HTML report: $WORK/audit.html; charts: $WORK/plots/"
