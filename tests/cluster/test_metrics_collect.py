"""Fake-NVML samples on the real testbed: attribution by device minor, and the audit.

Four GPU jobs run at once: two on the same node (one busy, one idle), one typed A100 job
and one "any of h100|a100" job that sacct records as untyped gres/gpu. The fake NVML
enumerates devices in a shuffled order with random UUIDs, and the testbed's device files
have minors that differ from Slurm's indices, so only the index -> File= -> minor -> NVML
path attributes samples to the right jobs.
"""

from __future__ import annotations

import html.parser
import json
import os
import time
from pathlib import Path

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.audit.report import plot, write_html
from hetslurm.audit.run import AuditRequest, run_audit
from hetslurm.cli import cli
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
from hetslurm.metrics.gres import device_minor, load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.site import Site
from hetslurm.slurm import get_backend
from hetslurm.slurm.units import expand_hostlist, format_indices
from hetslurm.testbed import Testbed

SLEEP_S = 20
BUSY_PCT = 85.0
#: Watts the fake scripts per job's GPUs (the idle job's are unscripted: no energy counter).
POWER_W = {"busy": 310.0, "a100": 240.0, "any": 275.0}


def _sacct_seconds(jobs: Jobs, job_id: str) -> tuple[int, str]:
    """(End - Start) in seconds and the node list, from sacct's text output."""
    rec = jobs.sacct(job_id, "Start,End,NodeList,State")
    start = time.mktime(time.strptime(rec["Start"], "%Y-%m-%dT%H:%M:%S"))
    end = time.mktime(time.strptime(rec["End"], "%Y-%m-%dT%H:%M:%S"))
    return int(end - start), rec["NodeList"]


class _Tables(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.tables += tag == "table"


def test_collect_attributes_samples_and_audit_finds_the_idle_job(
    jobs: Jobs, slurm_env: dict[str, str], testbed: Testbed, demo_site: Site, tmp_path: Path
) -> None:
    gres = load_gres_conf(testbed.etc / "gres.conf")
    devices = {n: [(device_minor(d.path), d.model or "") for d in devs]
               for n, devs in gres.items()}
    assert all(m is not None for devs in devices.values() for m, _ in devs)
    scenario = scenario_for_devices(
        {n: [(int(m), model) for m, model in devs if m is not None]
         for n, devs in devices.items()}, seed=11, start=time.time())
    scen_path = tmp_path / "scenario.json"
    scenario.save(scen_path)

    t_submit = time.time() - 1
    busy = jobs.sbatch("--gres=gpu:h100:2", "-w", "gpu1", script=f"sleep {SLEEP_S}")
    idle = jobs.sbatch("--gres=gpu:h100:2", "-w", "gpu1", script=f"sleep {SLEEP_S}")
    a100 = jobs.sbatch("--gres=gpu:a100:4", script=f"sleep {SLEEP_S}")
    anyg = jobs.sbatch("--gres=gpu:1", "-C", "h100|a100", "-p", "gpu",
                       script=f"sleep {SLEEP_S}")
    ids = {"busy": busy, "idle": idle, "a100": a100, "any": anyg}
    for j in ids.values():
        jobs.wait_state(j, {"RUNNING"})

    backend = get_backend("cli", env=slurm_env)
    alloc: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, j in ids.items():
        info = backend.job(int(j))
        alloc[name] = {n: idx for n in info.allocated_gres
                       for key, idx in info.gres_on(n).items() if key[0] == "gpu"}
        if name == "idle":
            continue
        for node, idx in alloc[name].items():
            for i in idx:
                # The test finds minors by the testbed's file naming; the collector reads
                # gres.conf. Both must agree for the samples to land on the right job.
                minor = os.minor(os.stat(testbed.root / "dev" / node / f"nvidia{i}").st_rdev)
                scenario.set_gpu(node, minor, utilization=BUSY_PCT, memory_used_mib=2000,
                                 power_w=POWER_W[name])
    scenario.save(scen_path)
    assert set(alloc["busy"]) == set(alloc["idle"]) == {"gpu1"}

    store = SegmentStore(tmp_path / "store")
    coll = Collector(sorted(gres), FakeNvml(scen_path), backend, gres, store,
                     interval_s=1.0, flush_s=5.0)
    coll.run(duration_s=SLEEP_S + 4)
    samples, report = store.read()
    assert not report.partial and len(samples) > 0

    # Attribution: every job's samples sit exactly on its allocated (node, index) pairs.
    for name, j in ids.items():
        mine = samples[samples["job_id"] == int(j)]
        got = {(str(n), int(i)) for n, i in zip(mine["node"], mine["slurm_index"], strict=True)}
        want = {(n, i) for n, idx in alloc[name].items() for i in idx}
        assert got == want, name
        assert set(mine["job_gpus"].astype(str)) == {format_indices(alloc[name][n])
                                                     for n in alloc[name]}
        util = mine["utilization_pct"].dropna()
        assert (util == (0.0 if name == "idle" else BUSY_PCT)).all(), name
    gpu1 = samples[samples["node"] == "gpu1"]
    assert (gpu1["nvml_index"] != gpu1["slurm_index"]).any()  # shuffled enumeration
    assert (gpu1["minor"] != gpu1["slurm_index"]).all()

    # The audit, from the real slurmdbd and the store.
    expected: dict[str, float] = {}
    for name, j in ids.items():
        secs, nodes = _sacct_seconds(jobs, j)
        assert abs(secs - SLEEP_S) <= 2, (name, secs)
        model = demo_site.node(expand_hostlist(nodes)[0]).gpus[0].model
        gpus = sum(len(v) for v in alloc[name].values())
        expected[model] = expected.get(model, 0.0) + secs * gpus / 3600
    result = run_audit(AuditRequest(since=t_submit, until=time.time() + 1,
                                    store=str(store.root)), demo_site, env=slurm_env)
    assert not result.partial, result.meta["problems"]
    by_model = result.tables["by_gpu_model"].set_index("gpu_model")
    for model, hours in expected.items():
        assert abs(by_model.loc[model, "allocated_gpu_hours"] - hours) <= 0.01 * hours
    idle_ids = set(result.tables["idle_jobs"]["job_id"].astype(int))
    assert int(idle) in idle_ids
    assert not idle_ids & {int(busy), int(a100)}
    assert by_model["used_gpu_hours"].sum() > 0
    for name in ("by_partition", "by_account", "by_user", "by_class", "wait",
                 "fragmentation", "placement"):
        assert len(result.tables[name]) > 0, name
    # gpu1 had 4 of 8 GPUs in use: the other 4 were stranded there.
    frag = result.tables["fragmentation"].set_index("gpu_model")
    assert frag.loc["h100", "stranded_gpu_hours"] > 0

    pngs = plot(result, tmp_path / "plots")
    import matplotlib.image

    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert matplotlib.image.imread(p).shape[0] > 100
    page = tmp_path / "audit.html"
    with page.open("w") as fh:
        write_html(result, fh, pngs)
    parser = _Tables()
    parser.feed(page.read_text())
    assert parser.tables == len(result.tables)

    # The command line over the same data: JSON with the named tables.
    res = CliRunner().invoke(cli, ["audit", "--since", str(t_submit), "--until", "now",
                                   "--store", str(store.root), "--format", "json"],
                             env={**slurm_env, "HETSLURM_SITE": demo_site.path})
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert {r["job_id"] for r in doc["idle_jobs"]} >= {int(idle)}
    assert {"gpu_model", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours"} <= set(
        doc["by_gpu_model"][0])

    # Energy per job from the fake's energy counter: the counter's increments over the
    # covered GPU-seconds are the scripted watts (within 1%), most of each job is covered,
    # and the job whose GPUs have no counter has no energy, none of it covered.
    energy = {r["job_id"]: r for r in doc["energy_jobs"]}
    for name, watts in POWER_W.items():
        row = energy[int(ids[name])]
        assert abs(row["mean_power_w"] - watts) <= 0.01 * watts, (name, row)
        assert row["coverage_pct"] >= 50, (name, row)
        covered_s = row["covered_gpu_hours"] * 3600
        assert abs(row["energy_j"] - watts * covered_s) <= 0.01 * watts * covered_s, row
    assert energy[int(idle)]["energy_j"] == 0 and energy[int(idle)]["coverage_pct"] == 0
    users = {r["key"]: r for r in doc["energy"] if r["by"] == "user"}
    assert sum(u["energy_kwh"] for u in users.values()) > 0
