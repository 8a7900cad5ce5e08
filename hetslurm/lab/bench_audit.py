"""``hetslurm bench audit``: the audit on a synthetic million-job month, and a real
comparison with the per-job way on the testbed.

Synthetic data set (documented in docs/metrics-and-audit.md): ``jobs`` job records in
``sacct --json`` form (22.05 field names) on ``nodes`` 8-GPU nodes (half h100, half a100),
spread over 30 days; each job holds 1 or 2 GPUs and has exactly ``samples // jobs`` samples
taken every ``interval_s`` seconds (60 s by default), written as one Parquet segment per
node. One job in ten is idle (utilization 0-3 %), the rest busy (20-95 %).
"""

from __future__ import annotations

import json
import os
import resource
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hetslurm.lab.child import python_module
from hetslurm.lab.peakrss import CLI_ENTRY, parse_marker
from hetslurm.lab.synthetic_site import gpu_site_toml
from hetslurm.process import run_command
from hetslurm.site.load import parse_site
from hetslurm.site.model import Site

T_START = 1_790_000_000.0  # a fixed month, so runs are comparable
DAYS = 30

Log = Callable[[str], None]


def _site_toml(nodes: int, interval_s: float = 60.0) -> str:
    # The collector's interval is what one sample may stand for in the idle rule.
    return gpu_site_toml(nodes, "synth", extra=f"[collector]\ninterval_s = {interval_s}\n")


def synthetic_site(nodes: int) -> Site:
    return parse_site(_site_toml(nodes), "<synthetic>")


def generate(out: Path, jobs: int, samples: int, nodes: int = 1000,
             interval_s: float = 60.0, seed: int = 1) -> dict[str, Any]:
    """Write ``out/sacct.json`` and ``out/store/``; returns what was made."""
    import numpy as np
    import pyarrow as pa

    from hetslurm.metrics.samples import arrow_schema
    from hetslurm.metrics.store import SegmentStore

    rng = np.random.default_rng(seed)
    per_job = max(1, samples // jobs)
    gpus = np.where(rng.random(jobs) < 0.5, 1, 2) if per_job % 2 == 0 else np.ones(jobs, int)
    ticks = per_job // gpus
    node = rng.integers(0, nodes, jobs)
    base_idx = rng.integers(0, 7, jobs)  # 2-GPU jobs take base, base+1
    submit = T_START + rng.random(jobs) * DAYS * 86400
    wait = rng.exponential(300.0, jobs).round()
    start = (submit + wait).round()
    dur = ticks * interval_s
    end = start + dur
    idle = rng.random(jobs) < 0.1
    typed = rng.random(jobs) < 0.7
    users = [f"u{i:03d}" for i in range(200)]
    accounts = [f"acct{i:02d}" for i in range(20)]
    half = max(1, nodes // 2)
    names = [f"g{i + 1:05d}" for i in range(nodes)]
    model = np.where(node < half, "h100", "a100")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sacct.json", "w", encoding="utf-8") as fh:
        fh.write('{"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], '
                 '"jobs": [\n')
        for i in range(jobs):
            tres = [{"type": "cpu", "name": None, "id": 1, "count": 4},
                    {"type": "gres", "name": "gpu", "id": 1001, "count": int(gpus[i])}]
            if typed[i]:
                tres.append({"type": "gres", "name": f"gpu:{model[i]}", "id": 1002,
                             "count": int(gpus[i])})
            rec = {"job_id": i + 1, "name": "job", "user": users[i % 200],
                   "account": accounts[i % 20], "partition": "gpu",
                   "state": {"current": "COMPLETED", "reason": "None"},
                   "time": {"submission": int(submit[i]), "eligible": int(submit[i]),
                            "start": int(start[i]), "end": int(end[i]),
                            "elapsed": int(dur[i])},
                   "nodes": names[node[i]], "constraints": "" if typed[i] else "h100|a100",
                   "comment": {"administrator": None, "job": None, "system": None},
                   "tres": {"allocated": tres}}
            fh.write(("," if i else "") + json.dumps(rec) + "\n")
        fh.write("]}\n")
    # Samples: job-major arrays, then one segment per node.
    reps = (gpus * ticks).astype(int)
    jid = np.repeat(np.arange(1, jobs + 1), reps)
    j = jid - 1
    k = np.concatenate([np.tile(np.arange(t), g) for t, g in zip(ticks, gpus, strict=True)]) \
        if jobs <= 10_000 else _tiles(ticks, gpus)
    gpu_off = np.concatenate([np.repeat(np.arange(g), t) for t, g in
                              zip(ticks, gpus, strict=True)]) \
        if jobs <= 10_000 else _offsets(ticks, gpus)
    t = start[j] + k * interval_s
    util = np.where(idle[j], rng.random(len(j)) * 3.0, 20 + rng.random(len(j)) * 75)
    index = base_idx[j] + gpu_off
    n = len(j)
    job_gpus = np.array([f"{b}-{b + 1}" for b in range(8)] + [str(b) for b in range(8)])
    jg = job_gpus[np.where(gpus[j] == 2, base_idx[j], 8 + base_idx[j])]
    cols = {
        "time": t.astype("float64"), "node": np.array(names)[node[j]],
        "nvml_index": index.astype("int16"), "minor": (135 - index).astype("int32"),
        "uuid": np.array([f"GPU-{x:08x}" for x in range(8)])[index],
        "gpu_model": model[j], "slurm_index": index.astype("int16"),
        "job_id": jid.astype("int64"), "job_gpus": jg,
        "utilization_pct": util.astype("float32"),
        "memory_used_mib": np.full(n, 1000.0, "float32"),
        "memory_total_mib": np.where(model[j] == "h100", 81559.0, 40960.0).astype("float32"),
        "power_w": np.full(n, 300.0, "float32"), "energy_j": np.zeros(n),
        "mig_mode": np.zeros(n, "int8"), "status": np.full(n, "ok"),
        "interval_s": np.full(n, interval_s, "float32"), "attributed": np.ones(n, bool),
        "clock_jump": np.zeros(n, bool),
        # Healthy devices: every reason read and none active, no ECC error, no XID.
        "throttle_reasons": np.full(n, ""), "ecc_uncorrectable": np.zeros(n, "int64"),
        "xid": pa.nulls(n, pa.int32()),
    }
    table = pa.table(cols, schema=arrow_schema())
    order = np.argsort(node[j], kind="stable")
    table = table.take(pa.array(order))
    node_sorted = node[j][order]
    bounds = np.flatnonzero(np.diff(node_sorted)) + 1
    starts = np.concatenate([[0], bounds])
    stops = np.concatenate([bounds, [n]])
    store = SegmentStore(out / "store")
    for a, b in zip(starts, stops, strict=True):
        store.write(names[node_sorted[a]], table.slice(int(a), int(b - a)))
    del table, cols
    return {"jobs": jobs, "samples": int(n), "nodes": nodes, "interval_s": interval_s,
            "idle_jobs": int(idle.sum()), "since": T_START, "until": T_START + (DAYS + 2) * 86400,
            "expected_allocated_gpu_hours": float((dur * gpus).sum() / 3600)}


def _tiles(ticks: Any, gpus: Any) -> Any:
    import numpy as np

    reps = ticks * gpus
    pos = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    return pos % np.repeat(ticks, reps)


def _offsets(ticks: Any, gpus: Any) -> Any:
    import numpy as np

    reps = ticks * gpus
    pos = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
    return pos // np.repeat(ticks, reps)


def _release_memory() -> None:
    """Give back what generating left cached (Arrow's pool keeps freed buffers), so the
    machine has it while the audit runs."""
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()


def bench_synthetic(jobs: int = 1_000_000, samples: int = 10_000_000, nodes: int = 1000,
                    workdir: str | None = None, log: Log = lambda _m: None) -> dict[str, Any]:
    """Generate the data set, then time ``hetslurm audit`` on it in a child process."""
    tmp = tempfile.TemporaryDirectory(prefix="hetslurm-bench-audit-", dir=workdir)
    root = Path(tmp.name)
    try:
        log(f"generating {jobs} jobs and {samples} samples in {root}")
        t0 = time.perf_counter()
        made = generate(root, jobs, samples, nodes)
        gen_s = time.perf_counter() - t0
        _release_memory()
        site_file = root / "site.toml"
        site_file.write_text(_site_toml(nodes, made["interval_s"]))
        log("running the audit")
        # peakrss runs the CLI and reports the audit's own peak memory (see its docstring:
        # ru_maxrss of a child would include this process's size when it was spawned).
        argv = python_module(
            "hetslurm.lab.peakrss", CLI_ENTRY, "audit", "--site", str(site_file),
            "--sacct-file", str(root / "sacct.json"), "--store", str(root / "store"),
            "--since", str(made["since"]), "--until", str(made["until"]), "--format", "json")
        t0 = time.perf_counter()
        res = run_command(argv, timeout=3600, env=dict(os.environ))
        seconds = time.perf_counter() - t0
        peak_kb = parse_marker(res.stderr)
        if peak_kb is None:  # no /proc: the rusage figure, an upper bound
            peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        doc = json.loads(res.stdout)
        alloc = sum(r["allocated_gpu_hours"] for r in doc["by_gpu_model"])
        return {"jobs": jobs, "samples": made["samples"], "interval_s": made["interval_s"],
                "nodes": nodes, "seconds": round(seconds, 2),
                "peak_rss_mb": round(peak_kb / 1024, 1), "generate_seconds": round(gen_s, 1),
                "allocated_gpu_hours": round(alloc, 3),
                "expected_allocated_gpu_hours": round(made["expected_allocated_gpu_hours"], 3),
                "idle_jobs_found": len(doc["idle_jobs"]), "idle_jobs_made": made["idle_jobs"],
                "targets": {"seconds": 60, "peak_rss_mb": 4096}}
    finally:
        tmp.cleanup()


def bench_real(env: Mapping[str, str], site: Site, n_jobs: int, workdir: Path,
               log: Log = lambda _m: None) -> dict[str, Any]:
    """On the testbed: run ``n_jobs`` 1-GPU jobs under the fake-NVML collector, then audit
    them at once and the per-job way (``sacct -j`` and a store read per job)."""
    import threading

    from hetslurm.audit.run import AuditRequest, run_audit
    from hetslurm.audit.sacct import sacct_result
    from hetslurm.audit.tables import per_job
    from hetslurm.errors import BackendError
    from hetslurm.metrics.collector import Collector, resolve_gres
    from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
    from hetslurm.metrics.gres import device_minor
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.policy.idle import prepare_samples
    from hetslurm.site.schema import Usage
    from hetslurm.slurm import get_backend

    gres = resolve_gres(None, env)
    devs = {n: [(device_minor(d.path) or 0, d.model or "") for d in ds] for n, ds in gres.items()}
    sc = scenario_for_devices(devs, start=time.time())
    sc.default_utilization = 42.0
    scen = workdir / "scenario.json"
    sc.save(scen)
    store = SegmentStore(workdir / "store")
    backend = get_backend("cli", env=env)
    coll = Collector(sorted(gres), FakeNvml(scen), backend, gres, store, interval_s=1.0,
                     flush_s=10.0)
    since = time.time() - 1
    array_id = backend.submit_batch(
        args=["-o", "/dev/null", f"--array=0-{n_jobs - 1}", "--gres=gpu:1", "-p", "gpu",
              "-c", "1"], wrap="sleep 2").job_id
    log(f"submitted array {array_id} of {n_jobs} jobs")

    def pending() -> bool:
        try:
            return bool(backend.queued_ids(jobs=[array_id]))
        except BackendError:  # squeue failed: taken as nothing left, as before
            return False

    t = threading.Thread(target=lambda: coll.run(until=lambda: not pending(),
                                                 duration_s=1800))
    t.start()
    t.join()
    until = time.time() + 1
    time.sleep(3)  # slurmdbd records the last ends
    usage = site.sections.get("usage") or Usage()
    t0 = time.perf_counter()
    result = run_audit(AuditRequest(since=since, until=until, store=str(store.root)), site,
                       env=env, usage=usage)
    bulk_s = time.perf_counter() - t0
    jobs = result.meta["jobs"]
    # The per-job way: one sacct and one store read per job.
    sacct_all = sacct_result(backend.accounting_jobs_by_id(
        [array_id], all_users=True, allocations_only=True), site).jobs
    ids = sorted(int(x) for x in sacct_all["job_id"])
    t0 = time.perf_counter()
    per: dict[int, tuple[float, float]] = {}
    for jid in ids:
        one = sacct_result(backend.accounting_jobs_by_id([jid]), site).jobs
        one = one[one["job_id"] == jid]
        frame, _ = store.read(since, until)
        frame = frame[frame["job_id"] == jid]
        s = prepare_samples(frame, usage, since, until)
        pj = per_job(s)
        r = one.iloc[-1]
        alloc = max(0.0, (r["end"] - r["start"])) * r["gpus"] / 3600 if r["start"] else 0.0
        per[jid] = (alloc, float(pj["used_gpu_hours"].sum()) if len(pj) else 0.0)
    per_job_s = time.perf_counter() - t0
    bulk_pj = per_job(prepare_samples(store.read(since, until)[0], usage, since, until))
    from hetslurm.policy.idle import prepare_jobs

    bj = prepare_jobs(sacct_all, since, until, until).set_index("job_id")
    same = all(abs(bj.loc[j, "allocated_gpu_hours"] - per[j][0]) < 1e-9 and
               abs((bulk_pj["used_gpu_hours"].get(j, 0.0)) - per[j][1]) < 1e-9 for j in ids)
    return {"real_jobs": len(ids), "audited_job_runs": jobs, "bulk_seconds": round(bulk_s, 3),
            "per_job_seconds": round(per_job_s, 2),
            "speedup_vs_per_job": round(per_job_s / bulk_s, 1) if bulk_s else None,
            "same_results": same}
