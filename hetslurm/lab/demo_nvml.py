"""Helpers that script the fake NVML for the demo (``scripts/demo-audit.sh``).

``python -m hetslurm.lab.demo_nvml scenario GRES_CONF OUT`` writes a scenario with every GPU
gres.conf names (minors read from the device files); ``python -m hetslurm.lab.demo_nvml
busy SCENARIO GRES_CONF JOBID PCT`` makes the GPUs a running job holds read PCT percent.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from hetslurm.metrics.fake_nvml import Scenario, scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.slurm import get_backend


def make_scenario(gres_conf: str, out: str, seed: int = 7) -> None:
    gres = load_gres_conf(gres_conf)
    devices = {n: [(m, d.model or "") for d in ds if (m := device_minor(d.path)) is not None]
               for n, ds in gres.items()}
    scenario_for_devices(devices, seed=seed, start=time.time()).save(out)


def make_busy(scenario: str, gres_conf: str, job_id: int, pct: float) -> list[str]:
    gres = load_gres_conf(gres_conf)
    job = get_backend("cli", env=dict(os.environ)).job(job_id)
    sc = Scenario.load(scenario)
    done = []
    for node in job.allocated_gres:
        for key, idx in job.gres_on(node).items():
            if key[0] != "gpu":
                continue
            for i in idx:
                minor = device_minor(gres[node][i].path)
                if minor is not None:
                    sc.set_gpu(node, minor, utilization=pct, memory_used_mib=4096)
                    done.append(f"{node}:{i}->minor {minor}")
    sc.save(scenario)
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetslurm.lab.demo_nvml")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("scenario")
    a.add_argument("gres_conf")
    a.add_argument("out")
    b = sub.add_parser("busy")
    b.add_argument("scenario")
    b.add_argument("gres_conf")
    b.add_argument("job_id", type=int)
    b.add_argument("pct", type=float)
    args = p.parse_args(argv)
    if args.cmd == "scenario":
        make_scenario(args.gres_conf, args.out)
    else:
        for line in make_busy(args.scenario, args.gres_conf, args.job_id, args.pct):
            print(f"job {args.job_id}: {line} busy at {args.pct:g}%", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
