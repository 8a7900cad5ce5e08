"""``hetslurm status``: GPUs, FPGAs, cores and memory by model and state."""

from __future__ import annotations

import os

import click

from hetslurm.cli.options import backend_option, format_option
from hetslurm.cli.output import emit
from hetslurm.slurm import get_backend
from hetslurm.status import cluster_status


@click.command("status")
@backend_option(default="auto")
@format_option
def status(backend: str, output_format: str) -> None:
    """Show the live cluster by device class.

    Nodes by class and state; GPUs and FPGAs by model, cores and memory: total,
    allocated, free and unavailable (on drained, down or reserved nodes). Slurm's
    commands are pointed at a cluster by SLURM_CONF.
    """
    result = cluster_status(get_backend(backend, env=dict(os.environ)))
    if output_format == "json":
        emit(result.rows(), output_format, document=result.to_dict())
        return
    if output_format == "table":
        emit(result.node_rows(), output_format, title="Nodes")
    emit(result.rows(), output_format, title="Resources")
