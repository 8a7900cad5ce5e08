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

echo "== #HET directives: the job_submit hook rewrites them into Slurm fields (docs/directives.md)"
$HS hook check --dir "$(dirname "$SLURM_CONF")" --format json || true
HET=/tmp/hetslurm-demo/het
mkdir -p "$HET"
printf '#!/bin/bash\n#HET gpus=2 class=train\nsleep 20\n' > "$HET/train.sh"
printf '#!/bin/bash\n#HET gpus=2 class=inference\nsleep 20\n' > "$HET/inference.sh"
printf '#!/bin/bash\n#HET gpus=4 gpu-type=h100 locality=nvlink:required\nsleep 20\n' > "$HET/nvlink.sh"
printf '#!/bin/bash\n#HET fpga=1 class=stream\nsleep 20\n' > "$HET/stream.sh"
printf '#!/bin/bash\n#HET class=io cores=2 no-requeue\nsleep 20\n' > "$HET/io.sh"
printf '#!/bin/bash\n#HET gpus=2 gpu-type=a10\nsleep 20\n' > "$HET/typo.sh"
echo "-- what the hook will do to train.sh (hetslurm explain, same Lua in-process)"
$HS explain "$HET/train.sh" --site "$SITE"
hids=()
for name in train inference nvlink stream io; do
    hids+=("$(sbatch --parsable -J "het-$name" -o "$OUT/het-%x-%j.out" "$HET/$name.sh")")
done
echo "-- a typo is refused at submission, with the line and what is accepted:"
sbatch -o /dev/null "$HET/typo.sh" || true
echo "-- srun carries its request in the comment:"
srun --comment="het: class=io" bash -c 'echo "srun job ran on $SLURMD_NODENAME"'
for _ in $(seq 30); do
    [ -z "$(squeue -h -t PD -o %i)" ] && break
    sleep 1
done
echo "-- where they landed (partition, features, gres, nodes):"
squeue -j "$(IFS=,; echo "${hids[*]}")" -o '%.6i %.16j %.8T %.10P %.12f %.22b %.8N'
echo "-- and why (the decision record in AdminComment):"
for id in "${hids[@]}"; do
    scontrol show job "$id" | grep -E '^JobId|AdminComment' | sed 's/^ *//' | paste -sd' '
done

# GPU metrics (fake NVML) while jobs run, one of them idle, then the utilization audit.
HS=$HS bash scripts/demo-audit.sh

# `hetslurm rebalance` (the cron entry point) catches a job whose GPUs idle and requeues it.
HS=$HS bash scripts/demo-rebalance.sh

echo "The testbed keeps running; stop it with: $HS testbed down"
