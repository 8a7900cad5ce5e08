"""``hetslurm bench learn``: ``hetslurm learn speeds`` on a synthetic million-run month.

Synthetic data set (documented in docs/learn.md): ``jobs`` completed one-GPU runs in
``sacct --json`` form (22.05 field names) on a site of ``nodes`` 8-GPU nodes (half H100,
half A100, :func:`~hetslurm.lab.synthetic_site.gpu_site_toml`) whose one workload class
``train`` lists ``a100`` before ``h100``. ``groups`` recurring jobs (user, job name), each
with its own typical run time (log-normal, median 1 h) and, for every other name, two
different scripts, the second running 1.5x as long. Each run lands on a random node; an A100
takes twice an H100's time, times 5 % noise. The script-hash cache is filled beforehand for
every job (as a previous run would have left it), so the "with scripts" run measures the
hashing path without a slurmdbd.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetslurm.lab.child import python_module
from hetslurm.lab.peakrss import CLI_ENTRY, parse_marker
from hetslurm.lab.synthetic_site import gpu_site_toml
from hetslurm.process import run_command

T_START = 1_790_000_000.0
DAYS = 30
Log = Callable[[str], None]
#: The truth the fit should find: A100 runs take twice as long as H100 runs.
A100_RATIO = 0.5
#: Median of the recurring jobs' typical peak memory (MiB) when ``usage`` is asked for.
RSS_MEDIAN_MIB = 4096.0


def site_toml(nodes: int) -> str:
    return gpu_site_toml(nodes, "synth", extra=(
        '[classes.train]\ndevices = ["a100", "h100"]\npartition = "gpu"\n'))


def generate(out: Path, jobs: int, nodes: int = 1000, groups: int = 20_000,
             seed: int = 1, usage: bool = False) -> dict[str, Any]:
    """Write ``out/sacct.json``, ``out/site.toml`` and ``out/script-hashes.json``; with
    ``usage``, each record also carries one step with its CPU time and MaxRSS (each
    recurring job its own typical peak, log-normal with median :data:`RSS_MEDIAN_MIB`, times
    5 % noise), as jobacct_gather/linux records them."""
    import numpy as np

    from hetslurm.audit.scripts import CACHE_VERSION, cache_key, script_hash

    rng = np.random.default_rng(seed)
    group = rng.integers(0, groups, jobs)
    variant = np.where(group % 2 == 0, rng.integers(0, 2, jobs), 0)
    base = rng.lognormal(np.log(3600.0), 1.0, groups)
    node = rng.integers(0, nodes, jobs)
    half = max(1, nodes // 2)
    a100 = node >= half
    elapsed = (base[group] * np.where(variant == 1, 1.5, 1.0)
               * np.where(a100, 1 / A100_RATIO, 1.0) * rng.lognormal(0.0, 0.05, jobs))
    elapsed = np.maximum(1, elapsed.round()).astype(np.int64)
    submit = (T_START + rng.random(jobs) * DAYS * 86400).astype(np.int64)
    start = submit + 60
    rss = (rng.lognormal(np.log(RSS_MEDIAN_MIB), 0.5, groups)[group]
           * rng.lognormal(0.0, 0.05, jobs) * 2**20).astype(np.int64)
    names = [f"g{i + 1:05d}" for i in range(nodes)]
    hashes = [script_hash(f"#!/bin/sh\n# variant {v}\n") for v in (0, 1)]
    cache: dict[str, str | None] = {}
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sacct.json", "w", encoding="utf-8") as fh:
        fh.write('{"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [], '
                 '"jobs": [\n')
        for i in range(jobs):
            g = int(group[i])
            model = "a100" if a100[i] else "h100"
            rec = {"job_id": i + 1, "name": f"job{g}", "user": f"u{g % 200:03d}",
                   "account": "acct", "partition": "gpu",
                   "state": {"current": "COMPLETED", "reason": "None"},
                   "time": {"submission": int(submit[i]), "eligible": int(submit[i]),
                            "start": int(start[i]), "end": int(start[i] + elapsed[i]),
                            "elapsed": int(elapsed[i])},
                   "nodes": names[node[i]], "constraints": "",
                   "comment": {"administrator": None, "job": None, "system": None},
                   "tres": {"allocated": [
                       {"type": "cpu", "name": None, "id": 1, "count": 4},
                       {"type": "gres", "name": "gpu", "id": 1001, "count": 1},
                       {"type": "gres", "name": f"gpu:{model}", "id": 1002, "count": 1}]}}
            if usage:
                rec["steps"] = [{"time": {"total": {"seconds": int(elapsed[i]),
                                                    "microseconds": 0}},
                                 "tres": {"requested": {"max": [
                                     {"type": "mem", "name": None, "id": 2,
                                      "count": int(rss[i])}]}}}]
            fh.write(("," if i else "") + json.dumps(rec) + "\n")
            cache[cache_key(i + 1, float(submit[i]))] = hashes[int(variant[i])]
        fh.write("]}\n")
    with open(out / "script-hashes.json", "w", encoding="utf-8") as fh:
        json.dump({"version": CACHE_VERSION, "hashes": cache}, fh, separators=(",", ":"))
    (out / "site.toml").write_text(site_toml(nodes))
    return {"jobs": jobs, "groups": groups, "nodes": nodes, "since": T_START,
            "until": T_START + (DAYS + 2) * 86400}


def _run_cli(root: Path, made: dict[str, Any], scripts: bool) -> dict[str, Any]:
    argv = python_module(
        "hetslurm.lab.peakrss", CLI_ENTRY, "learn", "speeds", "--site", str(root / "site.toml"),
        "--sacct-file", str(root / "sacct.json"), "--since", str(made["since"]),
        "--until", str(made["until"]), "--format", "json", "--rank",
        "--script-cache", str(root / "script-hashes.json"),
        "--scripts" if scripts else "--no-scripts")
    t0 = time.perf_counter()
    res = run_command(argv, timeout=3600, env=dict(os.environ))
    seconds = time.perf_counter() - t0
    doc = json.loads(res.stdout)
    # No gpu_model_order in the synthetic site: a100 (first by name) is the reference.
    h100: dict[str, Any] = next((r for r in doc["rows"] if r["model"] == "h100"), {})
    peak = parse_marker(res.stderr)
    return {"seconds": round(seconds, 2),
            "peak_rss_mb": round(peak / 1024, 1) if peak is not None else None,
            "rows": len(doc["rows"]), "runs": doc["runs"], "h100_ratio": h100.get("ratio"),
            "h100_ci": [h100.get("ci_low"), h100.get("ci_high")],
            "proposed_train": next((rk["proposed"] for rk in doc.get("rankings", [])), None),
            "notes": doc["notes"]}


def _fit_comparison(root: Path, runs: int) -> dict[str, Any]:
    """The vectorised fit and the dense reference on the first ``runs`` runs, in-process."""
    from hetslurm.audit.sacct import parse_sacct_json
    from hetslurm.audit.speeds import learn_speeds
    from hetslurm.site.load import parse_site

    site = parse_site((root / "site.toml").read_text(), "<synthetic>")
    jobs = parse_sacct_json((root / "sacct.json").read_bytes(), site).jobs
    small = jobs.iloc[:runs]
    out: dict[str, Any] = {"runs": runs}
    ratios = {}
    for label, ref in (("vectorised", False), ("reference", True)):
        t0 = time.perf_counter()
        res = learn_speeds(small, model_order=("h100",), reference=ref)
        out[f"{label}_seconds"] = round(time.perf_counter() - t0, 3)
        ratios[label] = {(r.wclass, r.model): r.ratio for r in res.rows}
    out["same_ratios"] = ratios["vectorised"] == ratios["reference"]
    t0 = time.perf_counter()
    learn_speeds(jobs, model_order=("h100",))
    out["vectorised_seconds_all_runs"] = round(time.perf_counter() - t0, 2)
    out["all_runs"] = len(jobs)
    return out


def bench_learn(jobs: int = 1_000_000, nodes: int = 1000, groups: int = 20_000,
                reference_runs: int = 2000, workdir: str | None = None,
                log: Log = lambda _m: None) -> dict[str, Any]:
    """Generate the data set, then time ``learn speeds`` with and without script hashes,
    each in a child process, and the fit against its dense reference in-process."""
    with tempfile.TemporaryDirectory(prefix="hetslurm-bench-learn-", dir=workdir) as tmp:
        root = Path(tmp)
        log(f"generating {jobs} runs of {groups} recurring jobs in {root}")
        t0 = time.perf_counter()
        made = generate(root, jobs, nodes, groups)
        gen_s = time.perf_counter() - t0
        log("learn speeds --no-scripts")
        without = _run_cli(root, made, scripts=False)
        log("learn speeds --scripts (cache filled)")
        with_scripts = _run_cli(root, made, scripts=True)
        log(f"fit: vectorised and reference on {reference_runs} runs")
        fit = _fit_comparison(root, reference_runs) if reference_runs else None
        return {"jobs": jobs, "groups": groups, "nodes": nodes,
                "generate_seconds": round(gen_s, 1), "without_scripts": without,
                "with_scripts": with_scripts, "fit": fit, "true_h100_ratio": 1 / A100_RATIO,
                "targets": {"seconds": 60}}


def bench_advise(jobs: int = 1_000_000, nodes: int = 1000, groups: int = 20_000,
                 workdir: str | None = None, log: Log = lambda _m: None) -> dict[str, Any]:
    """The same data set with per-run MaxRSS: time ``hetslurm advise --no-scripts --out``
    in a child process (the whole command: sacct's JSON read once, usage decoded, speeds,
    rankings, classification, memory, the merged site checked and written)."""
    with tempfile.TemporaryDirectory(prefix="hetslurm-bench-advise-", dir=workdir) as tmp:
        root = Path(tmp)
        log(f"generating {jobs} runs of {groups} recurring jobs (with MaxRSS) in {root}")
        t0 = time.perf_counter()
        made = generate(root, jobs, nodes, groups, usage=True)
        gen_s = time.perf_counter() - t0
        out = root / "proposed.toml"
        argv = python_module(
            "hetslurm.lab.peakrss", CLI_ENTRY, "advise", "--site", str(root / "site.toml"),
            "--sacct-file", str(root / "sacct.json"), "--since", str(made["since"]),
            "--until", str(made["until"]), "--format", "json", "--no-scripts",
            "--out", str(out))
        log("advise --no-scripts --out")
        t0 = time.perf_counter()
        res = run_command(argv, timeout=3600, env=dict(os.environ))
        seconds = time.perf_counter() - t0
        doc = json.loads(res.stdout)
        peak = parse_marker(res.stderr)
        memory: dict[str, Any] = next((m for m in doc["memory"] if m["class"] == "train"), {})
        return {"jobs": jobs, "groups": groups, "nodes": nodes,
                "generate_seconds": round(gen_s, 1), "seconds": round(seconds, 2),
                "peak_rss_mb": round(peak / 1024, 1) if peak is not None else None,
                "runs": doc["runs"], "changes": doc["changes"],
                "proposed_train": next((rk["proposed"] for rk in doc["rankings"]), None),
                "train_mem_quantile_mib": memory.get("quantile_mib"),
                "train_mem_per_node": memory.get("proposed"),
                "written": out.exists(), "targets": {"seconds": 60}}
