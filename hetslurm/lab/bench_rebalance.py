"""``hetslurm bench rebalance``: one dry-run rebalance pass on a synthetic cluster, and the
same pass the per-job way (one metrics read per job).

The synthetic state (docs/act.md#benchmark), fixed by ``seed``:

* ``nodes`` 8-GPU nodes (default ``ceil(jobs x 1.25 / 8)``: 1 563 at 10 000 jobs), the first
  half H100, the rest A100, 2 sockets x 32 cores, under leaf switches of 32 nodes; one
  partition ``gpu``;
* ``jobs`` running 1-GPU jobs (the A100s filled first, then H100s; so every A100 is busy and
  about 40 % of the H100s are free), started two hours before the pass;
* an hour of samples per running job at ``interval_s`` (30 s: 120 samples per job, 1 200 000
  at 10 000 jobs); one job in ten idle (0-3 %), the rest busy (20-95 %); written as
  ``segments_per_node`` Parquet segments per node (12 = the collector's 5-minute flush);
* ``pending`` pending jobs (1 000), waited two hours: half ``#HET gpus=2 gpu-type=h100|a100
  energy=low`` narrowed to ``Features=a100`` (relaxable), a quarter ``class=train`` (nothing
  to relax), a quarter without a record;
* the site rendered into a folder as the "live" configuration (drift: no change).

The pass is :func:`hetslurm.act.rebalance.rebalance` with ``apply=False`` over every
phase, in a child process: ``pass_peak_rss_mb`` is that process's peak right after the pass
(the synthetic cluster and the pass), ``peak_rss_mb`` its peak over everything it ran. The
state is generated in a process of its own (Linux keeps a process's peak RSS across fork and
exec, so a child of a big parent would report the parent's). The per-job way reads the store
once per job (that job's node and window), judges it with the same rule, and is timed on
``per_job_sample`` jobs and scaled to all; relax and drift cost the same both ways and are
added to it.

``relax_batch`` (:func:`relax_side_by_side`): the relax plan of every pending job, with
``max_relax_per_run`` raised to the queue so that each relaxable job is placed and takes
what it gets, the sequential way and the batch way (docs/act.md#relax-in-batch) on the same
state; the batch way on as many threads as the process may use CPUs and on one thread,
best of three each (the sequential way once: it is the slow one). The child fails if any run
decides differently.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hetslurm.lab.child import python_module
from hetslurm.lab.synthetic_site import gpu_site_toml
from hetslurm.process import run_command

NOW = 1_790_000_000.0
WINDOW_S = 3600
PER_LEAF = 32


def _site_toml(nodes: int, root: Path, interval_s: float = 30.0) -> str:
    # [collector] interval_s: what one sample may stand for when idleness is judged.
    return gpu_site_toml(nodes, "bench-rebalance", per_leaf=PER_LEAF, extra=f"""[scheduling]
gpu_model_order = ["h100", "a100"]
def_mem_per_cpu = 1024
[classes.train]
devices = ["h100", "a100"]
partition = "gpu"
[hook]
energy_low_models = ["a100"]
[stall]
window_s = {WINDOW_S}
action_log = "{root / 'actions.jsonl'}"
lock_file = "{root / 'act.lock'}"
[rebalance]
lock_file = "{root / 'rebalance.lock'}"
pending_limit_s = 3600
[collector]
interval_s = {interval_s}
""")


def _names(nodes: int) -> list[str]:
    return [f"g{i + 1:05d}" for i in range(nodes)]


def cluster(jobs: int, nodes: int, pending: int) -> Any:
    """The synthetic FakeSlurm (deterministic): running jobs, pending jobs, nodes."""
    from hetslurm.lab.fake_slurm import FakeSlurm
    from hetslurm.slurm.backend import JobInfo, NodeInfo, PartitionInfo
    from hetslurm.slurm.units import GresItem

    names = _names(nodes)
    half = max(1, nodes // 2)
    model = {n: ("h100" if i < half else "a100") for i, n in enumerate(names)}
    # A100 nodes first, then H100: job k holds GPU k % 8 of the k // 8-th node in that order.
    order = names[half:] + names[:half]
    start = datetime.fromtimestamp(NOW - 2 * 3600, tz=UTC)
    running = []
    used: dict[str, list[int]] = {}
    for k in range(jobs):
        node = order[k // 8]
        gpu = k % 8
        used.setdefault(node, []).append(gpu)
        running.append(JobInfo(
            job_id=k + 1, name=f"job{k + 1}", user=f"u{k % 200:03d}", account="a",
            partition="gpu", state="RUNNING", nodes=(node,),
            allocated_gres={node: (GresItem("gpu", model[node], 1, (gpu,)),)},
            cpu_ids={node: (gpu * 8,)}, start_time=start, submit_time=start,
            time_limit=86400, requeue=True))
    waited = datetime.fromtimestamp(NOW - 2 * 3600, tz=UTC)
    queue = []
    for p in range(pending):
        jid = jobs + 1 + p
        kind = p % 4
        base = JobInfo(job_id=jid, name=f"pend{jid}", user="alice", partition="gpu",
                       state="PENDING", reason="Resources", submit_time=waited,
                       eligible_time=waited)
        if kind in (0, 1):
            rec = ('hetslurm:{"v":1,"outcome":"rewrite","gpu":"a100",'
                   '"set":"tres_per_node,features","energy":"low",'
                   '"req":"gpus=2 gpu-type=h100|a100 energy=low"}')
            queue.append(replace(base, admin_comment=rec, features="a100",
                                 tres_per_node=(GresItem("gpu", None, 2),)))
        elif kind == 2:
            rec = ('hetslurm:{"v":1,"outcome":"rewrite","gpu":"h100|a100",'
                   '"set":"tres_per_node,features,partition","req":"gpus=2 class=train"}')
            queue.append(replace(base, admin_comment=rec, features="h100|a100",
                                 tres_per_node=(GresItem("gpu", None, 2),)))
        else:
            queue.append(replace(base, tres_per_node=(GresItem("gpu", None, 1),)))
    node_infos = []
    for n in names:
        idx = tuple(sorted(used.get(n, ())))
        key = ("gpu", model[n])
        node_infos.append(NodeInfo(
            n, frozenset({"MIXED" if idx else "IDLE"}), cpus_total=64,
            cpus_alloc=len(idx), memory_total_mib=512 * 1024, gres_total={key: 8},
            gres_used={key: len(idx)} if idx else {},
            gres_used_indices={key: idx} if idx else {}, partitions=("gpu",),
            features=("gpu", model[n]), active_features=("gpu", model[n])))
    return FakeSlurm(nodes=node_infos, jobs=[*running, *queue],
                     partitions=[PartitionInfo("gpu", nodes=tuple(names), default=True)])


def generate(root: Path, jobs: int, nodes: int, interval_s: float, segments_per_node: int,
             seed: int = 1) -> dict[str, Any]:
    """Write the site, its rendered configuration and the metrics store under ``root``."""
    import numpy as np
    import pyarrow as pa

    from hetslurm.metrics.samples import arrow_schema
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.site.load import parse_site
    from hetslurm.site.render import render, write_rendered

    site_text = _site_toml(nodes, root, interval_s)
    (root / "site.toml").write_text(site_text)
    write_rendered(render(parse_site(site_text, "<bench>"), whole=True), root / "etc")
    rng = np.random.default_rng(seed)
    names = _names(nodes)
    half = max(1, nodes // 2)
    order = np.array(names[half:] + names[:half])
    ticks = int(WINDOW_S / interval_s)
    jid = np.repeat(np.arange(1, jobs + 1), ticks)
    k = np.tile(np.arange(ticks), jobs)
    t = NOW - WINDOW_S + k * interval_s
    node_of = order[(jid - 1) // 8]
    gpu = (jid - 1) % 8
    idle = rng.random(jobs) < 0.1
    util = np.where(idle[jid - 1], rng.random(len(jid)) * 3.0, 20 + rng.random(len(jid)) * 75)
    n = len(jid)
    is_h = np.isin(node_of, np.array(names[:half]))
    cols = {
        "time": t.astype("float64"), "node": node_of, "nvml_index": gpu.astype("int16"),
        "minor": gpu.astype("int32"), "uuid": np.array([f"GPU-{x:08x}" for x in range(8)])[gpu],
        "gpu_model": np.where(is_h, "h100", "a100"), "slurm_index": gpu.astype("int16"),
        "job_id": jid.astype("int64"), "job_gpus": gpu.astype(str),
        "utilization_pct": util.astype("float32"),
        "memory_used_mib": np.full(n, 1000.0, "float32"),
        "memory_total_mib": np.where(is_h, 81559.0, 40960.0).astype("float32"),
        "power_w": np.full(n, 300.0, "float32"), "energy_j": np.zeros(n),
        "mig_mode": np.zeros(n, "int8"), "status": np.full(n, "ok"),
        "interval_s": np.full(n, interval_s, "float32"), "attributed": np.ones(n, bool),
        "clock_jump": np.zeros(n, bool),
        # Healthy devices: every reason read and none active, no ECC error, no XID.
        "throttle_reasons": np.full(n, ""), "ecc_uncorrectable": np.zeros(n, "int64"),
        "xid": pa.nulls(n, pa.int32()),
    }
    table = pa.table(cols, schema=arrow_schema())
    # Node-major, time-minor, then cut each node's hour into segments_per_node pieces.
    order_idx = np.lexsort((t, node_of))
    table = table.take(pa.array(order_idx))
    node_sorted = node_of[order_idx]
    t_sorted = t[order_idx]
    piece = np.floor((t_sorted - (NOW - WINDOW_S)) / (WINDOW_S / segments_per_node))
    key = np.char.add(node_sorted.astype(str), piece.astype(int).astype(str))
    bounds = np.flatnonzero(key[1:] != key[:-1]) + 1
    starts = np.concatenate([[0], bounds])
    stops = np.concatenate([bounds, [n]])
    store = SegmentStore(root / "store")
    for a, b in zip(starts, stops, strict=True):
        store.write(str(node_sorted[a]), table.slice(int(a), int(b - a)))
    return {"samples": int(n), "segments": len(starts), "idle_jobs": int(idle.sum())}


def relax_side_by_side(site: Any, backend: Any, now: float = NOW, repeats: int = 3,
                       threads: int | None = None) -> dict[str, Any]:
    """The relax plan of every pending job (``max_relax_per_run`` raised to the queue, so
    each relaxable job is placed and takes what it gets), the sequential way and the batch
    way (docs/act.md#relax-in-batch), timed side by side on the same state.

    Raises:
        RuntimeError: the two ways decide differently (the batch path must be exact).
    """
    from hetslurm.act.rebalance import _Snapshot, policy_of
    from hetslurm.act.relax import default_relax_threads, plan_relax
    from hetslurm.act.run import context_for
    from hetslurm.placement.model import ClusterModel
    from hetslurm.placement.state import LiveState

    ctx = context_for(site)
    nodes, jobs = backend.nodes(), backend.jobs()
    n_pending = sum(j.state == "PENDING" for j in jobs)
    pol = policy_of(site)
    pol = pol.model_copy(update={"max_relax_per_run": max(pol.max_relax_per_run,
                                                          min(n_pending, 10_000))})
    live = LiveState.from_backend(_Snapshot(nodes, jobs), now=now)
    parts = {p.name: p.nodes for p in backend.partitions()}
    n_threads = threads or default_relax_threads()

    def one(threads: int, batch: bool) -> tuple[Any, float, dict[str, Any]]:
        model = ClusterModel.from_site(site).with_state(live)
        stats: dict[str, Any] = {}
        t0 = time.perf_counter()
        plan, skipped = plan_relax(jobs, site, pol, model, partitions=parts, now=now,
                                   record_field=ctx.record_field, record_key=ctx.record_key,
                                   threads=threads, batch=batch, stats=stats)
        dt = time.perf_counter() - t0
        assert not skipped
        return plan, dt, stats

    seq, seq_s, _ = one(1, False)
    runs = [one(n_threads, True) for _ in range(repeats)]
    ones = [one(1, True) for _ in range(repeats)]
    for plan, _, stats in [*runs, *ones]:
        if plan != seq:
            diff = next((f"{a.job}: {a.rule} vs {b.rule}" for a, b in
                         zip(plan.decisions, seq.decisions, strict=False) if a != b),
                        f"{len(plan.decisions)} vs {len(seq.decisions)} decisions")
            raise RuntimeError(f"relax batch ({stats}) decided differently from the "
                               f"sequential path: {diff}")
    batch_s = sorted(dt for _, dt, _ in runs)
    one_s = sorted(dt for _, dt, _ in ones)
    rules: dict[str, int] = dict(seq.quiet)
    for d in seq.decisions:
        rules[d.rule] = rules.get(d.rule, 0) + 1
    stats = runs[0][2]
    return {"pending": n_pending, "max_relax_per_run": pol.max_relax_per_run,
            "placed_jobs": stats["snapshot_answers"], "threads": n_threads,
            "sequential_s": round(seq_s, 3), "batch_s": round(batch_s[0], 3),
            "batch_s_runs": [round(x, 3) for x in batch_s],
            "batch_one_thread_s": round(one_s[0], 3),
            "batch_one_thread_s_runs": [round(x, 3) for x in one_s],
            "ratio": round(seq_s / batch_s[0], 1) if batch_s[0] else None,
            "threads_gain": round(one_s[0] / batch_s[0], 2) if batch_s[0] else None,
            "snapshot_s": stats["snapshot_s"], "placed_again": stats["placed_again"],
            "same_decisions": True, "rules": rules}


def _child(root: Path, params: dict[str, Any]) -> dict[str, Any]:
    """The timed part, in its own process: one dry-run pass, then the per-job way."""
    from hetslurm.act.drift import live_target
    from hetslurm.act.rebalance import PHASES, RebalanceRequest, rebalance
    from hetslurm.act.run import STALL_COLUMNS, context_for
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.policy.stall import idle_evidence, verdict
    from hetslurm.site import load_site

    site = load_site(root / "site.toml")
    backend = cluster(params["jobs"], params["nodes"], params["pending"])
    target = live_target(str(root / "etc"), True, {})
    store = str(root / "store")

    def probe(_: str) -> str:
        return "append"

    # Cold: no read cache (the first pass after a reboot, or read_cache = "").
    req = RebalanceRequest(apply=False, store=store, budget_s=3600, read_cache="")
    t0 = time.perf_counter()
    res = rebalance(backend, req, site, target=target, now=NOW, output_probe=probe)
    seconds = time.perf_counter() - t0
    pass_peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Warm: the steady state of a cron entry every 5 minutes. The pass of 5 minutes before
    # (its window ends where the last 5-minute segment of each node starts) fills the
    # cache; the pass at NOW then opens only each node's last segment.
    cache = str(root / "rebalance-window.arrow")
    t1 = time.perf_counter()
    rebalance(backend, replace(req, read_cache=cache), site, target=target,
              now=NOW - WINDOW_S / params["segments_per_node"], output_probe=probe)
    prime_seconds = time.perf_counter() - t1
    t1 = time.perf_counter()
    warm = rebalance(backend, replace(req, read_cache=cache), site, target=target, now=NOW,
                     output_probe=probe)
    warm_seconds = time.perf_counter() - t1
    for key in ("health", "requeue_stalled", "weights", "relax"):
        if warm.to_dict()[key] != res.to_dict()[key]:
            raise RuntimeError(f"the read cache changed the {key} phase's decisions")
    phases = {}
    for phase in PHASES:
        t1 = time.perf_counter()
        rebalance(backend, RebalanceRequest(store=store, budget_s=3600, phases=(phase,),
                                            read_cache=""), site,
                  target=target, now=NOW, output_probe=probe)
        phases[phase] = round(time.perf_counter() - t1, 3)
    assert res.stall is not None and res.relax is not None and res.drift is not None
    rules: dict[str, int] = {}
    for d in res.stall.decisions:
        rules[d.rule] = rules.get(d.rule, 0) + 1
    relax: dict[str, int] = dict(res.relax.quiet)
    for r in res.relax.decisions:
        relax[r.rule] = relax.get(r.rule, 0) + 1

    relax_batch = relax_side_by_side(site, backend)

    # The per-job way: one store read per job (its node, the window), the same rule.
    ctx = context_for(site)
    seg = SegmentStore(store)
    running = [j for j in backend.jobs() if j.state == "RUNNING"]
    sample = running[:: max(1, len(running) // params["per_job_sample"])]
    sample = sample[: params["per_job_sample"]]
    same = 0
    by_job = {d.job_id: d.rule for d in res.stall.decisions}
    t1 = time.perf_counter()
    for j in sample:
        frame, _ = seg.read(NOW - ctx.window_s, NOW, nodes=list(j.nodes), columns=STALL_COLUMNS)
        frame = frame[frame["job_id"] == j.job_id]
        ev = idle_evidence([j], frame, ctx.usage, window_s=ctx.window_s, now=NOW)
        rule = verdict(j, ev.get(j.job_id), ctx, NOW, probe).rule
        same += rule == by_job.get(j.job_id)
    per_job_each = (time.perf_counter() - t1) / max(1, len(sample))
    per_job_stall = per_job_each * len(running)
    # The other phases cost the same both ways.
    per_job_pass = per_job_stall + sum(v for k, v in phases.items() if k != "requeue-stalled")
    return {"seconds": round(seconds, 3), "warm_seconds": round(warm_seconds, 3),
            "prime_seconds": round(prime_seconds, 3), "phase_seconds": phases,
            "pass_peak_rss_mb": round(pass_peak_kb / 1024, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "stall_rules": rules, "relax_rules": relax,
            "drift_changes": len(res.drift.changes),
            "relax_batch": relax_batch,
            "per_job_sampled": len(sample), "per_job_same_rule": same,
            "per_job_seconds_per_job": round(per_job_each, 5),
            "per_job_pass_seconds_est": round(per_job_pass, 1),
            "speedup": round(per_job_pass / seconds, 1) if seconds else None}


def bench_rebalance(jobs: int = 10_000, nodes: int | None = None, interval_s: float = 30.0,
                    segments_per_node: int = 12, pending: int = 1000,
                    per_job_sample: int = 300, workdir: str | None = None,
                    log: Any = lambda _m: None) -> dict[str, Any]:
    """Generate the state, then time the pass (and the per-job way) in a child process."""
    nodes = nodes or math.ceil(jobs * 1.25 / 8)
    if nodes * 8 < jobs:
        raise ValueError(f"{nodes} nodes of 8 GPUs cannot hold {jobs} 1-GPU jobs")
    with tempfile.TemporaryDirectory(prefix="hetslurm-bench-rebalance-", dir=workdir) as tmp:
        root = Path(tmp)
        log(f"generating {jobs} jobs on {nodes} nodes, an hour of samples at {interval_s} s")
        params = {"jobs": jobs, "nodes": nodes, "pending": pending, "interval_s": interval_s,
                  "segments_per_node": segments_per_node, "per_job_sample": per_job_sample}
        t0 = time.perf_counter()
        gen = run_command(python_module("hetslurm.lab.bench_rebalance", "generate", str(root),
                                        json.dumps(params)), timeout=3600, env=dict(os.environ))
        gen_s = time.perf_counter() - t0
        made = json.loads(gen.stdout)
        log("timing the pass and the per-job way")
        out = run_command(python_module("hetslurm.lab.bench_rebalance", "pass", str(root),
                                        json.dumps(params)), timeout=3600, env=dict(os.environ))
    res = json.loads(out.stdout)
    return {"jobs": jobs, "nodes": nodes, "pending": pending, "interval_s": interval_s,
            "samples": made["samples"], "segments": made["segments"],
            "idle_jobs_made": made["idle_jobs"], **res,
            "generate_seconds": round(gen_s, 1),
            "targets": {"seconds": 10.0, "relax_batch_s": 1.0},
            "met": res["seconds"] <= 10.0, "warm_met": res["warm_seconds"] <= 10.0,
            "relax_batch_met": (res["relax_batch"]["batch_s"] <= 1.0
                                and res["relax_batch"]["batch_s"]
                                < res["relax_batch"]["sequential_s"])}


if __name__ == "__main__":
    _mode, _root, _params = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
    if _mode == "generate":
        print(json.dumps(generate(_root, _params["jobs"], _params["nodes"],
                                  _params["interval_s"], _params["segments_per_node"])))
    else:
        print(json.dumps(_child(_root, _params)))
