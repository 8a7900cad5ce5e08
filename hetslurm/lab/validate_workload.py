"""Draw a workload for ``hetslurm simulate --validate`` (docs/simulate.md, "Fidelity").

The committed workload files are drawn once by this module and kept as drawn; nothing in
them is fitted to a result. ``site-configs/validate-workload-large.toml`` is::

    python -m hetslurm.lab.validate_workload --jobs 1000 --seed 1 \\
        > site-configs/validate-workload-large.toml

Each job is training (1, 2 or 4 GPUs on one node, or 8 on two nodes), inference (1 or 2
GPUs) or CPU-only (1, 2 or 4 cores), with 2 cores per GPU, a runtime on the reference model
drawn uniformly per kind, a time limit of 1 or 2 minutes (users' estimates, 1.8-24 times
the runtime), and ``priority = "high"`` for a share of them. Arrivals are Poisson with a
rate that changes by phase (a busy phase in the middle builds a queue, so backfill, its
window and the priority order all act).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: Share of each kind of job, then per kind: {(GPUs, nodes): share} or {cores: share}.
SHARES = {"train": 0.40, "inference": 0.25, "cpu": 0.35}
TRAIN_GPUS = {(1, 1): 0.35, (2, 1): 0.30, (4, 1): 0.20, (8, 2): 0.15}
INFER_GPUS = {(1, 1): 0.60, (2, 1): 0.40}
CPU_CORES = {1: 0.40, 2: 0.35, 4: 0.25}
#: Runtime range on the A100 (the reference model), seconds, per kind.
RUNTIME = {"train": (6.0, 34.0), "inference": (5.0, 24.0), "cpu": (6.0, 36.0)}
CORES_PER_GPU = 2
HIGH_SHARE = 0.15
LONG_LIMIT_SHARE = 0.3
#: (seconds, arrivals per second): steady, busy, steady, draining.
PHASES = ((150.0, 1.3), (150.0, 2.6), (150.0, 1.3), (180.0, 1.0))


@dataclass(frozen=True)
class Drawn:
    id: str
    submit: int
    cls: str | None
    gpus: int
    nodes: int
    cores: int
    runtime: int
    limit_min: int
    priority: str


def _pick(rng: random.Random, shares: Mapping[T, float]) -> T:
    """One key, with probability its share (one draw of ``rng``)."""
    r, acc = rng.random(), 0.0
    for key, share in shares.items():
        acc += share
        if r < acc:
            return key
    return key


def draw(n: int, seed: int) -> list[Drawn]:
    """``n`` jobs, the same for the same ``seed``."""
    rng = random.Random(seed)  # noqa: S311 - a reproducible workload, not secrets
    jobs: list[Drawn] = []
    t = 0.0
    phase, phase_end = 0, PHASES[0][0]
    for i in range(n):
        while phase + 1 < len(PHASES) and t >= phase_end:
            phase += 1
            phase_end += PHASES[phase][0]
        t += rng.expovariate(PHASES[phase][1])
        kind = _pick(rng, SHARES)
        lo, hi = RUNTIME[kind]
        runtime = round(rng.uniform(lo, hi))
        if kind == "cpu":
            cores = _pick(rng, CPU_CORES)
            gpus, nodes, cls = 0, 1, None
        else:
            gpus, nodes = _pick(rng, TRAIN_GPUS if kind == "train" else INFER_GPUS)
            cores, cls = CORES_PER_GPU * gpus // nodes, kind
        limit = 2 if rng.random() < LONG_LIMIT_SHARE else 1
        prio = "high" if rng.random() < HIGH_SHARE else "normal"
        jobs.append(Drawn(f"j{i + 1:04d}", int(t), cls, gpus, nodes, cores, runtime, limit,
                          prio))
    return jobs


def render(jobs: Sequence[Drawn], seed: int, scheduler_parameters: str) -> str:
    """The workload file (schema ``hetslurm-validate-workload/1``)."""
    kinds = {k: sum(1 for j in jobs if (j.cls or "cpu") == k) for k in SHARES}
    multi = sum(1 for j in jobs if j.nodes > 1)
    high = sum(1 for j in jobs if j.priority == "high")
    span = jobs[-1].submit if jobs else 0
    out = [
        "# The 1,000-job workload of `hetslurm simulate --validate` (docs/simulate.md,",
        '# "Fidelity"), drawn once and committed as drawn (nothing fitted to a result):',
        f"#   python -m hetslurm.lab.validate_workload --jobs {len(jobs)} --seed {seed}",
        f"# {kinds['train']} training, {kinds['inference']} inference, {kinds['cpu']} CPU "
        f"jobs over {span} s; {multi} of two nodes, {high} with priority high.",
        "# Runtimes are on an A100 (validate-params-large.toml [speeds]: training runs twice",
        "# as fast on an H100, inference 1.25x); each GPU job takes 2 cores per GPU, on each",
        "# of its nodes. Arrivals: Poisson, 1.3/s, then 2.6/s for 150 s (a queue builds),",
        "# then 1.3/s and 1.0/s.",
        'schema = "hetslurm-validate-workload/1"',
        'site = "validate-site-large.toml"',
        'params = "validate-params-large.toml"',
        "",
        "[testbed]",
        "# As validate-workload.toml (time compressed about 60x), and: bf_window=1 (one",
        "# minute; a job that cannot start within it gets no reservation, and 30% of the",
        "# jobs have a 2-minute limit), bf_max_job_test=500 (Slurm's default, said here as",
        "# the simulator's backfill_depth says it).",
        f'scheduler_parameters = "{scheduler_parameters}"',
        "",
        "[model]",
        '# As validate-workload.toml: Slurm\'s backfill rules, the latency terms measured',
        "# there (the same testbed, the same scheduler intervals).",
        'backfill = "slurm"',
        "start_latency_s = 0.4",
        "hold_extra_s = 0.0",
        "",
        "[target]",
        "relative = 0.10",
        "wait_abs_s = 3.0",
        "makespan_abs_s = 5.0",
        "",
        "[workload]",
        "jobs = [",
    ]
    for j in jobs:
        fields = [f'id = "{j.id}"', f"submit = {j.submit}"]
        if j.cls is not None:
            fields.append(f'class = "{j.cls}"')
        fields += [f"gpus = {j.gpus}"]
        if j.nodes > 1:
            fields.append(f"nodes = {j.nodes}")
        fields += [f"cores = {j.cores}", f"runtime = {j.runtime}", f"limit_min = {j.limit_min}"]
        if j.priority != "normal":
            fields.append(f'priority = "{j.priority}"')
        out.append("  { " + ", ".join(fields) + " },")
    out += ["]", ""]
    return "\n".join(out)


SCHEDULER_PARAMETERS = ("bf_interval=1,bf_resolution=1,sched_interval=1,bf_window=1,"
                        "bf_max_job_test=500")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hetslurm.lab.validate_workload",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    sys.stdout.write(render(draw(args.jobs, args.seed), args.seed, SCHEDULER_PARAMETERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
