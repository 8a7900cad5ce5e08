"""``hetslurm audit``: GPU-hours allocated, used and idle; idle jobs; wait; fragmentation;
right-size advice; placement quality."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime

import click

from hetslurm.cli.options import format_option, site_option, site_path_or_none
from hetslurm.errors import PARTIAL_EXIT

_REL_RE = re.compile(r"^now(?:-(\d+(?:\.\d+)?)([smhd]))?$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_when(text: str, now: float) -> float:
    """Epoch seconds, ISO 8601 (local time unless it has an offset), or ``now[-N{s,m,h,d}]``."""
    m = _REL_RE.match(text.strip())
    if m:
        return now - (float(m.group(1)) * _UNIT[m.group(2)] if m.group(1) else 0.0)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise click.BadParameter(f"'{text}' is not a time (epoch, ISO 8601 or now-2h)") from exc


def time_range(since: str, until: str) -> tuple[float, float]:
    """``--since``/``--until`` as epoch seconds; a usage error when the range is empty."""
    now = time.time()
    t0, t1 = parse_when(since, now), parse_when(until, now)
    if t1 <= t0:
        raise click.BadParameter("--until must be after --since", param_hint="--until")
    return t0, t1


@click.command("audit")
@site_option(when_missing="defaults")
@click.option("--since", default="now-1d", show_default=True,
              help="Start: epoch, ISO 8601 or now-N{s,m,h,d}.")
@click.option("--until", default="now", show_default=True, help="End (exclusive).")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store of the site].")
@click.option("--prometheus", default=None,
              help="Read samples from this Prometheus URL instead of the store.")
@click.option("--sacct-file", type=click.Path(dir_okay=False), default=None,
              help="Read accounting from this 'sacct --json' output instead of running sacct.")
@click.option("--user", "users", multiple=True, help="Only these users (repeatable).")
@click.option("--account", "accounts", multiple=True, help="Only these accounts.")
@click.option("--partition", "partitions", multiple=True, help="Only these partitions.")
@click.option("--model", "models", multiple=True, help="Only jobs on these GPU models.")
@click.option("--table", "tables", multiple=True,
              help="Print only these tables (table/csv formats).")
@click.option("--idle-window", type=click.IntRange(1), default=None,
              help="Override [usage] idle_window_s.")
@format_option(extra=("parquet", "html"),
               more_help="json is one object of named tables; parquet needs --out DIR; html "
                         "goes to --out FILE or stdout.")
@click.option("--out", "out_path", type=click.Path(), default=None,
              help="Where parquet (a folder) or html (a file) goes.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Also write PNG charts into this folder.")
def audit_cmd(site_file: str | None, since: str, until: str, store: str | None,
              prometheus: str | None, sacct_file: str | None, users: tuple[str, ...],
              accounts: tuple[str, ...], partitions: tuple[str, ...],
              models: tuple[str, ...], tables: tuple[str, ...], idle_window: int | None,
              output_format: str, out_path: str | None, plot_dir: str | None) -> None:
    """Audit GPU use from accounting (sacct) and the collector's samples.

    Tables: by_gpu_model, by_partition, by_account, by_user, by_class (GPU-hours
    allocated/used/busy/idle), idle_jobs, wait, fragmentation, right_size, placement,
    hook_decisions. Bad input (sacct failing, refused segments, an empty range) gives a
    result marked partial, with the reasons in meta.problems; never a crash.
    """
    from hetslurm.audit.report import (
        plot,
        print_tables,
        write_csv,
        write_html,
        write_json,
        write_parquet,
    )
    from hetslurm.audit.run import AuditRequest, run_audit
    from hetslurm.audit.tables import TABLES
    from hetslurm.site import load_site
    from hetslurm.site.schema import Usage

    for t in tables:
        if t not in TABLES:
            raise click.BadParameter(f"unknown table '{t}' (one of {', '.join(TABLES)})",
                                     param_hint="--table")
    if output_format == "parquet" and not out_path:
        raise click.UsageError("--format parquet needs --out DIR")
    t0, t1 = time_range(since, until)
    path = site_path_or_none(site_file)
    site = load_site(path) if path else None
    usage: Usage = site.sections["usage"] if site is not None else Usage()
    if idle_window is not None:
        usage = usage.model_copy(update={"idle_window_s": idle_window})
    if store is None and prometheus is None and site is not None:
        store = site.sections["collector"].store
    req = AuditRequest(since=t0, until=t1, store=store, prometheus=prometheus,
                       sacct_file=sacct_file, users=users, accounts=accounts,
                       partitions=partitions, models=models)
    result = run_audit(req, site, env=dict(os.environ), usage=usage,
                       progress=_progress_bar())
    images = plot(result, plot_dir) if plot_dir else []
    chosen = list(tables) or None
    if output_format == "json":
        write_json(result, sys.stdout)
    elif output_format == "csv":
        write_csv(result, sys.stdout, chosen)
    elif output_format == "parquet":
        assert out_path is not None
        for p in write_parquet(result, out_path):
            click.echo(str(p), err=True)
    elif output_format == "html":
        if out_path:
            with open(out_path, "w", encoding="utf-8") as fh:
                write_html(result, fh, images)
        else:
            write_html(result, sys.stdout, images)
    else:
        print_tables(result, chosen)
    if result.partial and output_format != "table":
        click.echo("hetslurm audit: partial result: " + "; ".join(result.meta["problems"]),
                   err=True)
    if result.partial:
        sys.exit(PARTIAL_EXIT)


def _progress_bar() -> Callable[[int, int], None] | None:
    """A progress callback drawing a bar on stderr when it is a terminal."""
    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import Progress

    prog = Progress(console=Console(stderr=True), transient=True)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if task is None:
            prog.start()
            task = prog.add_task("reading segments", total=total)
        prog.update(task, completed=done, total=total)
        if done >= total:
            prog.stop()

    return update
