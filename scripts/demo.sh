#!/usr/bin/env bash
# The main job: set everything up, boot the local heterogeneous Slurm cluster and run a few
# jobs of each device class through it. Run as root on Debian 12: bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
HS=.venv/bin/hetslurm
SITE=${HETSLURM_SITE:-site-configs/demo.toml}

$HS site check "$SITE"
eval "$($HS testbed up --site "$SITE")"
echo "== the cluster (hetslurm status)"
$HS status

echo "== submitting jobs of each device class"
OUT=/tmp/hetslurm-demo
mkdir -p "$OUT"
sb() { sbatch --parsable -o "$OUT/%x-%j.out" "$@"; }
ids=()
ids+=("$(sb -J train-h100 --gres=gpu:h100:4 --wrap 'echo GPUs=$CUDA_VISIBLE_DEVICES; sleep 20')")
ids+=("$(sb -J infer-a100 --gres=gpu:a100:2 --wrap 'echo GPUs=$CUDA_VISIBLE_DEVICES; sleep 20')")
ids+=("$(sb -J any-gpu --gres=gpu:1 -C 'h100|a100' --wrap 'sleep 20')")
ids+=("$(sb -J stream-fpga --gres=fpga:u280:1 --wrap 'sleep 20')")
ids+=("$(sb -J io-cpu -p cpu -c 2 --wrap 'sleep 20')")
echo "submitted: ${ids[*]}"
for _ in $(seq 30); do
    [ -z "$(squeue -h -t PD -o %i)" ] && break
    sleep 1
done
squeue -o '%.6i %.12j %.8T %.10N %b'
echo "== while they run"
$HS status
for _ in $(seq 60); do
    [ -z "$(squeue -h -o %i)" ] && break
    sleep 1
done
echo "== accounting (sacct): the typed gres each job got"
sacct -X -j "$(IFS=,; echo "${ids[*]}")" -o JobID,JobName%12,NodeList,AllocTRES%70,State
echo "== what the GPU jobs saw (CUDA_VISIBLE_DEVICES set by Slurm from gres.conf)"
cat "$OUT"/train-h100-*.out "$OUT"/infer-a100-*.out 2>/dev/null || true
echo "The testbed keeps running; stop it with: $HS testbed down"
