"""Cost per call of the access layer's backends on a running cluster (``hetslurm bench
backend``): the CLI backend (a process per Slurm command) against the REST backend (one
HTTP/1.1 connection to slurmrestd), operation by operation, side by side in one run."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from hetslurm.slurm import SlurmBackend, get_backend

Log = Callable[[str], None]

#: What is timed: reads every tool does, and one change on a held job of the benchmark's own.
OPERATIONS = ("nodes", "node", "jobs", "job", "partitions", "update_job", "hold_release")


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _time(fn: Callable[[], object], calls: int) -> list[float]:
    fn()  # warm: connection, caches (the release, a node's threads)
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def _operations(b: SlurmBackend, node: str, job_id: int) -> dict[str, Callable[[], object]]:
    def hold_release() -> None:
        b.release(job_id)
        b.hold(job_id)

    return {
        "nodes": b.nodes,
        "node": lambda: b.node(node),
        "jobs": b.jobs,
        "job": lambda: b.job(job_id),
        "partitions": b.partitions,
        "update_job": lambda: b.update_job(job_id, admin_comment="bench"),
        "hold_release": hold_release,
    }


def bench_backends(env: Mapping[str, str], *, calls: int = 50,
                   backends: tuple[str, ...] = ("cli", "rest"),
                   log: Log = lambda _m: None) -> dict[str, Any]:
    """Time each operation ``calls`` times on each backend; rows of backend, operation,
    calls, p50_ms, p99_ms, plus the REST speedup per operation (CLI p50 / REST p50)."""
    made: dict[str, SlurmBackend] = {name: get_backend(name, env=env) for name in backends}
    first = made[backends[0]]
    node = first.nodes()[0].name
    job_id = first.submit("#!/bin/sh\nsleep 600\n", ["-H", "-o", "/dev/null", "-J",
                                                    "hs-bench-backend"])
    rows: list[dict[str, Any]] = []
    try:
        for name, b in made.items():
            ops = _operations(b, node, job_id)
            for op in OPERATIONS:
                log(f"{name} {op} x{calls}")
                ms = _time(ops[op], calls)
                rows.append({"backend": name, "operation": op, "calls": calls,
                             "p50_ms": round(statistics.median(ms), 3),
                             "p99_ms": round(_percentile(ms, 0.99), 3)})
    finally:
        first.cancel(job_id)
        for b in made.values():
            close = getattr(b, "close", None)
            if close is not None:
                close()
    p50 = {(r["backend"], r["operation"]): r["p50_ms"] for r in rows}
    speedup = {op: round(p50[("cli", op)] / p50[("rest", op)], 2) for op in OPERATIONS
               if ("cli", op) in p50 and ("rest", op) in p50 and p50[("rest", op)] > 0}
    return {"rows": rows, "speedup_rest_vs_cli_p50": speedup, "job_id": job_id}
