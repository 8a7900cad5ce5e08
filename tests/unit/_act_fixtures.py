"""Shared builders for the act unit tests: a fake cluster of running GPU jobs and samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.policy.stall import Context
from hetslurm.site.schema import Stall, Usage
from hetslurm.slurm.backend import JobInfo, NodeInfo
from hetslurm.slurm.units import GresItem

NOW = 1_800_000_000.0
HOUR = 3600.0
INTERVAL = 30.0


def node(name: str) -> NodeInfo:
    return NodeInfo(name, frozenset({"MIXED"}), cpus_total=64, cpus_alloc=8,
                    gres_total={("gpu", "a100"): 8}, gres_used={("gpu", "a100"): 8},
                    gres_used_indices={("gpu", "a100"): tuple(range(8))})


def job(job_id: int, *, gpus: int = 2, started_h: float = 3.0, now: float = NOW,
        **kw: Any) -> JobInfo:
    n = f"n{job_id % 4}"
    base = JobInfo(
        job_id=job_id, name=f"job{job_id}", user="alice", account="phys", partition="gpu",
        qos="normal", state="RUNNING", nodes=(n,),
        allocated_gres={n: (GresItem("gpu", "a100", gpus, tuple(range(gpus))),)},
        start_time=datetime.fromtimestamp(now - started_h * HOUR, tz=UTC),
        submit_time=datetime.fromtimestamp(now - started_h * HOUR - 60, tz=UTC),
    )
    return replace(base, **kw)


def cluster(*jobs: JobInfo) -> FakeSlurm:
    return FakeSlurm(nodes=[node(f"n{i}") for i in range(4)], jobs=jobs)


def samples(util: Mapping[int, float | None], gpus: Mapping[int, int] | None = None, *,
            start: float = NOW - 2 * HOUR, end: float = NOW, status: str = "ok") -> Any:
    """One sample per GPU per INTERVAL for each job id; ``None`` utilization: unknown."""
    import pandas as pd

    rows = []
    t = start
    while t < end:
        for jid, u in util.items():
            for g in range((gpus or {}).get(jid, 2)):
                rows.append({"time": t, "node": f"n{jid % 4}", "minor": g,
                             "slurm_index": g, "job_id": jid,
                             "utilization_pct": u, "memory_used_mib": 100.0,
                             "status": status if u is not None else "lost",
                             "interval_s": INTERVAL})
        t += INTERVAL
    frame = pd.DataFrame(rows, columns=["time", "node", "minor", "slurm_index", "job_id",
                                        "utilization_pct", "memory_used_mib", "status",
                                        "interval_s"])
    return frame.astype({"job_id": "Int64", "slurm_index": "Int64", "utilization_pct": "float32",
                         "memory_used_mib": "float32"})


def ctx(**stall: Any) -> Context:
    base: dict[str, Any] = {"window_s": 3600, "grace_after_start_s": 1800,
                            "warning_grace_s": 1800, "max_requeues": 2,
                            "action_log": "/nonexistent/log", "lock_file": "/nonexistent/lock",
                            "verify_timeout_s": 0.01}
    base.update(stall)
    return Context(stall=Stall(**base), usage=Usage())


def append_probe(_: str) -> str:
    return "append"
