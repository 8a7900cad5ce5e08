"""The Prometheus path round-trips the file store's numbers.

Debian's ``prometheus`` (installed here if no_jobs, its system service kept from starting)
runs on a free loopback port with its own config and data folder and scrapes
``hetslurm exporter`` every 250 ms while the collector writes one segment per 1 s tick.
The audit read from Prometheus must equal the audit read from the files. Needs no testbed.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from hetslurm.audit.run import AuditRequest, run_audit
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.exporter import serve
from hetslurm.metrics.fake_nvml import FakeNvml, scenario_for_devices
from hetslurm.metrics.gres import parse_gres_conf
from hetslurm.metrics.promread import read_prometheus
from hetslurm.metrics.store import SegmentStore
from hetslurm.site import Site
from hetslurm.slurm.backend import JobInfo
from hetslurm.slurm.units import GresItem
from hetslurm.testbed.packages import apt_install

TICKS = 8


def _ensure_prometheus() -> str:
    found = shutil.which("prometheus")
    if found:
        return found
    apt_install(["prometheus"])
    found = shutil.which("prometheus")
    assert found, "apt-get installed prometheus but there is no prometheus binary"
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())  # type: ignore[no-any-return]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, SegmentStore]]:
    binary = _ensure_prometheus()
    store = SegmentStore(tmp_path / "store")
    exp_port, prom_port = _free_port(), _free_port()
    server = serve(store, exp_port, max_age_s=3600)
    conf = tmp_path / "prometheus.yml"
    conf.write_text(
        "global: {scrape_interval: 250ms, scrape_timeout: 200ms}\n"
        "scrape_configs:\n"
        f"  - job_name: hetslurm\n    static_configs: [{{targets: ['127.0.0.1:{exp_port}']}}]\n")
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(  # a daemon for this test only; stopped by its pid below
        [binary, f"--config.file={conf}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{prom_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                doc = _get(f"{url}/api/v1/query?query=up")
                res = doc["data"]["result"]  # type: ignore[index]
                if res and res[0]["value"][1] == "1":
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus never scraped the exporter"
            time.sleep(0.25)
        yield url, store
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        server.shutdown()
        log.close()


def test_prometheus_round_trips_the_store(prometheus: tuple[str, SegmentStore],
                                          demo_site: Site, tmp_path: Path) -> None:
    url, store = prometheus
    gres = parse_gres_conf("NodeName=gpu1 Name=gpu Type=h100 File=/emu/gpu1/nvidia[0-7]\n")
    minors = {f"/emu/gpu1/nvidia{i}": 135 - i for i in range(8)}
    sc = scenario_for_devices({"gpu1": [(135 - i, "h100") for i in range(8)]}, seed=5)
    sc.set_gpu("gpu1", 135, utilization=[[0, 10], [1e10, 99]], power_w=300)
    sc.set_gpu("gpu1", 134, utilization=73.5, memory_used_mib=12345)
    sc.set_gpu("gpu1", 131, fault="not_supported")
    t_start = time.time()
    jobs = [JobInfo(job_id=41, state="RUNNING", nodes=("gpu1",), start_time=None,
                    allocated_gres={"gpu1": (GresItem("gpu", "h100", 2, (0, 1)),)}),
            JobInfo(job_id=42, state="RUNNING", nodes=("gpu1",),
                    allocated_gres={"gpu1": (GresItem("gpu", "h100", 1, (4,)),)})]
    coll = Collector(["gpu1"], FakeNvml(sc), FakeSlurm(jobs=jobs), gres, store,
                     minor_of=minors.get, interval_s=1.0, flush_s=1.0)
    coll.run(ticks=TICKS)
    time.sleep(1.5)  # a few more scrapes of the last segment
    since, until = t_start - 1, time.time() + 1

    files, report = store.read(since, until)
    prom = read_prometheus(url, since, until)
    assert len(files) == TICKS * 8 and not report.partial
    key = ["time", "minor"]
    a = files.sort_values(key).reset_index(drop=True)
    b = prom.sort_values(key).reset_index(drop=True)
    assert len(b) == len(a), "Prometheus missed or duplicated samples"
    for col in ("time", "minor", "slurm_index", "job_id", "utilization_pct", "memory_used_mib",
                "memory_total_mib", "power_w", "interval_s"):
        assert a[col].astype("float64").fillna(-1).tolist() == b[col].astype(
            "float64").fillna(-1).tolist(), col
    assert a["status"].astype(str).tolist() == b["status"].astype(str).tolist()
    assert a["job_gpus"].astype(str).tolist() == b["job_gpus"].astype(str).tolist()

    # The same audit numbers from both sources (no jobs in accounting: sample-side tables).
    no_jobs = tmp_path / "no-jobs.json"
    no_jobs.write_text('{"jobs": []}')
    via_files = run_audit(AuditRequest(since, until, store=str(store.root),
                                       sacct_file=str(no_jobs)), demo_site, now=until).tables
    via_prom = run_audit(AuditRequest(since, until, prometheus=url, sacct_file=str(no_jobs)),
                         demo_site, now=until).tables
    for name in via_files:
        pd.testing.assert_frame_equal(via_files[name], via_prom[name], check_dtype=False,
                                      obj=name)
    assert via_files["by_gpu_model"]["unallocated_gpu_hours"].iloc[0] > 0
