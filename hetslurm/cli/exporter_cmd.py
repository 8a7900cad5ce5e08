"""``hetslurm exporter``: serve the store's newest samples as Prometheus metrics."""

from __future__ import annotations

import click


@click.command("exporter")
@click.option("--store", type=click.Path(file_okay=False), required=True,
              help="Metrics store folder the collectors write.")
@click.option("--port", type=click.IntRange(1, 65535), default=9445, show_default=True,
              help="TCP port to listen on.")
@click.option("--addr", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default).")
@click.option("--max-age", type=click.FloatRange(1), default=600.0, show_default=True,
              help="Serve a GPU's newest sample only if it is at most this old, seconds.")
def exporter(store: str, port: int, addr: str, max_age: float) -> None:
    """Serve every GPU's newest sample, with its own timestamp, at /metrics.

    Metrics: hetslurm_gpu_utilization_percent (NaN when unknown), _memory_used_bytes,
    _memory_total_bytes, _power_watts, _energy_joules, _sample_interval_seconds; labels
    node, minor, slurm_index, uuid, gpu_model, job_id, job_gpus, status. Let Prometheus
    scrape more often than the collector flushes.
    """
    from hetslurm.metrics.exporter import serve_forever
    from hetslurm.metrics.store import SegmentStore

    click.echo(f"hetslurm exporter: http://{addr}:{port}/metrics", err=True)
    serve_forever(SegmentStore(store), port, addr, max_age)
