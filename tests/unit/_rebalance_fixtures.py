"""A fake demo cluster (site-configs/demo.toml's nodes) with pending #HET jobs, for the
rebalance unit tests."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.site import Site, load_site
from hetslurm.slurm.backend import JobInfo, NodeInfo, PartitionInfo
from hetslurm.slurm.units import GresItem

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
NOW = 1_800_000_000.0
HOUR = 3600.0


def demo_site() -> Site:
    return load_site(DEMO)


def record(req: str, gpu: str, set_: str, **more: str) -> str:
    seg: dict[str, Any] = {"v": 1, "rules": "x", "mode": "enforce", "src": "script",
                           "outcome": "rewrite", "gpu": gpu, "set": set_, **more, "req": req}
    return "hetslurm:" + json.dumps(seg, separators=(",", ":"))


def _node(site: Site, name: str) -> NodeInfo:
    n = site.node(name)
    gres: dict[Any, int] = {}
    for d in (*n.gpus, *n.fpgas):
        gres[(d.kind, d.model)] = gres.get((d.kind, d.model), 0) + 1
    feats = n.features
    parts = tuple(p for p, spec in {**site.partitions, **site.ranked}.items()
                  if name in spec.nodes)
    return NodeInfo(name, frozenset({"IDLE"}), cpus_total=8, memory_total_mib=16384,
                    gres_total=gres, features=tuple(feats), active_features=tuple(feats),
                    partitions=parts)


def running(job_id: int, node: str, model: str, gpus: tuple[int, ...], *,
            cores: int = 1) -> JobInfo:
    return JobInfo(job_id=job_id, name=f"run{job_id}", user="bob", partition="gpu",
                   state="RUNNING", nodes=(node,),
                   allocated_gres={node: (GresItem("gpu", model, len(gpus), gpus),)},
                   cpu_ids={node: tuple(range(cores))},
                   start_time=datetime.fromtimestamp(NOW - HOUR, tz=UTC),
                   time_limit=86400)


def pending(job_id: int, *, waited_h: float = 2.0, **kw: Any) -> JobInfo:
    t = datetime.fromtimestamp(NOW - waited_h * HOUR, tz=UTC)
    base = JobInfo(job_id=job_id, name=f"pend{job_id}", user="alice", partition="gpu",
                   state="PENDING", reason="Resources", submit_time=t, eligible_time=t)
    return replace(base, **kw)


def energy_low(job_id: int, *, typed: bool = False, **kw: Any) -> JobInfo:
    """``#HET gpus=2 gpu-type=h100|a100 energy=low``, narrowed to a100 by the hook: as a
    feature on an untyped gres, or (``typed``, what the 22.05-era hook writes for one model)
    as a typed gres."""
    req = "gpus=2 gpu-type=h100|a100 energy=low"
    if typed:
        return pending(job_id, tres_per_node=(GresItem("gpu", "a100", 2),),
                       admin_comment=record(req, "a100", "tres_per_node", energy="low"), **kw)
    return pending(job_id, tres_per_node=(GresItem("gpu", None, 2),), features="a100",
                   admin_comment=record(req, "a100", "tres_per_node,features", energy="low"),
                   **kw)


def fill(node: str, model: str, first_id: int, n: int = 8) -> list[JobInfo]:
    """Jobs holding ``n`` GPUs of ``node``, one each."""
    return [running(first_id + i, node, model, (i,), cores=1) for i in range(n)]


def cluster(site: Site, *jobs: JobInfo) -> FakeSlurm:
    """The demo nodes with ``jobs``; node usage follows the running jobs."""
    nodes = {n.name: _node(site, n.name) for n in site.nodes}
    for j in jobs:
        if j.state != "RUNNING":
            continue
        for host, items in j.allocated_gres.items():
            n = nodes[host]
            used = dict(n.gres_used_indices)
            cnt = dict(n.gres_used)
            for it in items:
                used[it.key] = tuple(sorted(set(used.get(it.key, ())) | set(it.indices or ())))
                cnt[it.key] = len(used[it.key])
            nodes[host] = replace(n, gres_used_indices=used, gres_used=cnt,
                                  cpus_alloc=n.cpus_alloc + len(j.cpu_ids.get(host, ())),
                                  state=frozenset({"MIXED"}))
    parts = [PartitionInfo(p, nodes=spec.nodes)
             for p, spec in {**site.partitions, **site.ranked}.items()]
    return FakeSlurm(nodes=nodes.values(), jobs=jobs, partitions=parts)
