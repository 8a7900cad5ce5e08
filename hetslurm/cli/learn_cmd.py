"""``hetslurm learn``: what this site's own accounting says (issue 22)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from hetslurm.cli.options import format_option, site_option, site_path_or_none
from hetslurm.cli.output import emit


@click.group()
def learn() -> None:
    """Learn from this site's accounting: how fast each GPU model runs its jobs."""


@learn.command("speeds")
@site_option(when_missing="defaults")
@click.option("--since", default="now-30d", show_default=True,
              help="Start: epoch, ISO 8601 or now-N{s,m,h,d}.")
@click.option("--until", default="now", show_default=True, help="End (exclusive).")
@click.option("--sacct-file", type=click.Path(dir_okay=False), default=None,
              help="Read accounting from this 'sacct --json' output instead of running sacct.")
@click.option("--min-jobs", type=click.IntRange(2), default=3, show_default=True,
              help="Fewest runs of a model in a class for a ratio (fewer: reported as too "
                   "few, never guessed).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write a proposed [levers.speed] section (TOML) to this file.")
@format_option
def speeds_cmd(site_file: str | None, since: str, until: str, sacct_file: str | None,
               min_jobs: int, out_path: str | None, output_format: str) -> None:
    """How fast each GPU model ran this site's jobs, per workload class.

    Completed runs of recurring jobs (same user and job name) on different models are
    compared by a least-squares fit of log run time (one effect per job, one per model), so
    a long job does not make its model look slow. ratio = the reference model's run time
    over this model's (2.0: twice as fast); the reference is the first model of the site's
    gpu_model_order with enough runs. Rows: class, model, ratio, ci_low, ci_high (95 %), n.

    \b
    Example:
      hetslurm learn speeds --since now-30d --format json
      hetslurm learn speeds --out speeds.toml   # then merge into the site's [levers]
    """
    from hetslurm.audit.sacct import parse_sacct_json, read_accounting, sacct_result
    from hetslurm.audit.speeds import learn_speeds, speed_section
    from hetslurm.cli.audit_cmd import time_range
    from hetslurm.errors import ConfigError, MetricsError
    from hetslurm.site import load_site
    from hetslurm.site.render import write_rendered
    from hetslurm.textfile import MAX_DATA_BYTES, read_file_bytes

    t0, t1 = time_range(since, until)
    path = site_path_or_none(site_file)
    site = load_site(path) if path else None
    try:
        if sacct_file:
            acct = parse_sacct_json(read_file_bytes(sacct_file, what="sacct JSON file",
                                                    max_bytes=MAX_DATA_BYTES), site)
        else:
            acct = sacct_result(read_accounting(dict(os.environ), t0, t1), site)
    except MetricsError as exc:
        raise ConfigError(f"accounting could not be read: {exc}") from exc
    order = site.scheduling.gpu_model_order if site is not None else ()
    res = learn_speeds(acct.jobs, model_order=order, min_jobs=min_jobs)
    rows = [r.to_dict() for r in res.rows]
    doc = {"rows": rows, "runs": res.runs, "left_out": res.left_out,
           "skipped_records": acct.skipped, "since": t0, "until": t1}
    emit(rows, output_format, title=f"speeds from {res.runs} completed GPU runs",
         document=doc)
    if out_path:
        day = "%Y-%m-%d"
        source = (f"{res.runs} runs between {time.strftime(day, time.localtime(t0))} and "
                  f"{time.strftime(day, time.localtime(t1))}")
        out = Path(out_path)
        write_rendered({out.name: speed_section(res, source=source)}, out.parent or ".")
        click.echo(f"hetslurm learn speeds: wrote {out_path}", err=True)
