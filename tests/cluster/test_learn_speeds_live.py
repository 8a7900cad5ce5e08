"""``hetslurm learn speeds`` recovers per-model speed factors from real accounting (issue 22,
"Done when"): 32 one-GPU jobs whose run time depends on the model they land on (a script that
sleeps 20 s on an H100 node and 40 s on an A100 node), run on the testbed at once (16 GPUs of
each model), read back from sacct: the A100's ratio is 0.5 within 10 %.

sacct's elapsed time is whole seconds and includes the job's launch: with 6 s and 12 s a loaded
CI machine recorded 7 s on H100 (ratio 0.57, 26.05 tier); at 20 s and 40 s one second more is
at most 5 %."""

from __future__ import annotations

import json
import time
from pathlib import Path

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.process import run_command

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
SCRIPT = ('case "$SLURMD_NODENAME" in gpu1|gpu2) sleep 20 ;; gpu3|gpu4) sleep 40 ;; '
          "*) sleep 1 ;; esac")


def test_learn_speeds_recovers_the_model_factor(jobs: Jobs, cli_env: dict[str, str]) -> None:
    t0 = time.time() - 5
    ids = [jobs.sbatch("-p", "gpu", "--gres=gpu:1", "-J", "speedprobe", script=SCRIPT)
           for _ in range(32)]
    for j in ids:
        jobs.wait_state(j, {"COMPLETED"}, timeout=180)
    deadline = time.monotonic() + 60
    while True:  # slurmdbd records each end a moment after it
        out = run_command(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                          timeout=60, env=jobs.env).stdout
        done = [ln for ln in out.splitlines() if ln.endswith("|COMPLETED")]
        if len(done) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(1)
    res = CliRunner().invoke(cli, ["learn", "speeds", "--site", str(DEMO), "--since", str(t0),
                                   "--format", "json"], env=cli_env)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {(r["class"], r["model"]): r for r in (doc["rows"] if isinstance(doc, dict) else doc)}
    a100 = rows[("-", "a100")]
    print(json.dumps([rows[("-", "h100")], a100]))
    assert rows[("-", "h100")]["ratio"] == 1.0
    assert abs(a100["ratio"] - 0.5) <= 0.05, a100
    assert a100["n"] >= 8 and rows[("-", "h100")]["n"] >= 8
    assert a100["ci_low"] <= a100["ratio"] <= a100["ci_high"]
