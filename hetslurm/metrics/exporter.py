"""``hetslurm exporter``: the store's newest samples as Prometheus metrics.

Every GPU's newest sample is served with the sample's own timestamp, so Prometheus stores
it at the time it was taken, not at scrape time; scraping more often than the collector
writes (``flush_s`` equal to ``interval_s``) then stores every sample once, and the audit
reading Prometheus sees the same samples as one reading the files.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

from hetslurm.metrics.store import SegmentStore

#: metric name -> (sample column, factor from the column's unit, help)
METRICS: dict[str, tuple[str, float, str]] = {
    "hetslurm_gpu_utilization_percent": ("utilization_pct", 1.0,
                                         "GPU utilization from NVML (NaN: unknown)"),
    "hetslurm_gpu_memory_used_bytes": ("memory_used_mib", 1048576.0, "GPU memory used"),
    "hetslurm_gpu_memory_total_bytes": ("memory_total_mib", 1048576.0, "GPU memory total"),
    "hetslurm_gpu_power_watts": ("power_w", 1.0, "GPU power draw"),
    "hetslurm_gpu_energy_joules": ("energy_j", 1.0, "GPU energy since the driver loaded"),
    "hetslurm_gpu_sample_interval_seconds": ("interval_s", 1.0,
                                             "time one sample stands for"),
}
LABELS = ("node", "minor", "slurm_index", "nvml_index", "uuid", "gpu_model", "job_id",
          "job_gpus", "status", "attributed", "clock_jump")


def _label(value: Any) -> str:
    import pandas as pd

    try:
        if pd.isna(value):  # None, NaN, pd.NA, NaT
            return ""
    except (TypeError, ValueError):  # an array-like value
        pass
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _timestamp(t: float) -> float:
    # prometheus_client writes int(ts * 1000): aim at the middle of the millisecond so the
    # truncation cannot turn 0.326 into 0.325.
    return (round(t * 1000) + 0.5) / 1000.0


class StoreCollector:
    """A prometheus-client custom collector over a :class:`SegmentStore`."""

    def __init__(self, store: SegmentStore, max_age_s: float = 600.0) -> None:
        self.store = store
        self.max_age_s = max_age_s

    def describe(self) -> list[Any]:
        return []  # unchecked collector: samples are only known at scrape time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        frame = self.store.latest(self.max_age_s)
        families = {name: GaugeMetricFamily(name, text, labels=list(LABELS))
                    for name, (_, _, text) in METRICS.items()}
        for rec in frame.to_dict("records"):
            labels = [_label(rec[k]) for k in LABELS]
            ts = _timestamp(float(rec["time"]))
            for name, (col, factor, _) in METRICS.items():
                v = rec[col]
                value = math.nan if _label(v) == "" else float(v) * factor
                families[name].add_metric(labels, value, timestamp=ts)
        yield from families.values()


def serve(store: SegmentStore, port: int, addr: str = "127.0.0.1",
          max_age_s: float = 600.0) -> Any:
    """Start the HTTP endpoint in a thread; returns the server (``.shutdown()`` stops it)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store, max_age_s))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server


def serve_forever(store: SegmentStore, port: int, addr: str = "127.0.0.1",
                  max_age_s: float = 600.0) -> None:
    server = serve(store, port, addr, max_age_s)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()
