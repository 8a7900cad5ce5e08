"""``hetslurm bench``: benchmarks that print JSON (they report; they do not assert)."""

from __future__ import annotations

import click

from hetslurm.cli.output import emit, format_option


@click.group()
def bench() -> None:
    """Benchmarks. Each prints its figures (use --format json for the record)."""


@bench.command("testbed")
@click.option("--site", "site_file", type=click.Path(dir_okay=False), default=None,
              help="Site file [default: site-configs/demo.toml].")
@click.option("--jobs", type=click.IntRange(1, 100_000), default=200, show_default=True,
              help="Held batch jobs to submit for the submit-rate figure.")
@format_option
def bench_testbed_cmd(site_file: str | None, jobs: int, output_format: str) -> None:
    """Boot a fresh testbed in a temporary folder and time it.

    Reports: up (cold, with MariaDB initialisation, and warm) until every node is idle;
    down until nothing is left running; sbatch submissions per second; the controller's
    own average time per submit (sdiag, REQUEST_SUBMIT_BATCH_JOB). Needs root.
    """
    from hetslurm.testbed.bench import bench_testbed

    res = bench_testbed(site_file, jobs=jobs)
    emit([{"metric": k, "value": v} for k, v in res.items()], output_format,
         title="testbed benchmark", document=res)


def register(cli: click.Group) -> None:
    cli.add_command(bench)
