"""``hetslurm learn``: what this site's own accounting says (issue 22)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from hetslurm.cli.options import format_option, site_option, site_path, site_path_or_none
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
              help="Also write a proposed [levers.speed] section (TOML) to this file; with "
                   "--rank, also the proposed [classes.NAME] devices orders.")
@click.option("--scripts/--no-scripts", "use_scripts", default=True, show_default=True,
              help="Tell recurring jobs apart by a hash of their stored batch script "
                   "(AccountingStoreFlags=job_script), read only for jobs that ran on two "
                   "models, and cached; --no-scripts: by user and job name only.")
@click.option("--max-scripts", type=click.IntRange(0), default=5000, show_default=True,
              help="Most stored scripts read from accounting in one run (the rest are read "
                   "by later runs; cached hashes are not counted).")
@click.option("--script-cache", type=click.Path(dir_okay=False), default=None,
              help="Where script hashes are cached [default: "
                   "$XDG_CACHE_HOME/hetslurm/script-hashes.json, else ~/.cache/...].")
@click.option("--rank", is_flag=True,
              help="Also propose each class's devices order from the measured ratios "
                   "(fastest first where the 95%% intervals separate; otherwise the site's "
                   "order). Needs the site.")
@click.option("--site-out", "site_out", type=click.Path(dir_okay=False), default=None,
              help="Write the whole site file with the proposed orders and [levers.speed] "
                   "merged (implies --rank), for `hetslurm site diff` and `site apply`.")
@format_option
def speeds_cmd(site_file: str | None, since: str, until: str, sacct_file: str | None,
               min_jobs: int, out_path: str | None, use_scripts: bool, max_scripts: int,
               script_cache: str | None, rank: bool, site_out: str | None,
               output_format: str) -> None:
    """How fast each GPU model ran this site's jobs, per workload class.

    Completed runs of recurring jobs (same user, job name and batch script) on different
    models are compared by a least-squares fit of log run time (one effect per job, one per
    model), so a long job does not make its model look slow. ratio = the reference model's
    run time over this model's (2.0: twice as fast); the reference is the first model of the
    site's gpu_model_order with enough runs. Rows: class, model, ratio, ci_low, ci_high
    (95 %), n. Where a job's script is not stored, its recurring job is (user, job name),
    and the notes say so.

    \b
    Example:
      hetslurm learn speeds --since now-30d --format json
      hetslurm learn speeds --out speeds.toml   # then merge into the site's [levers]
      hetslurm learn speeds --rank --site-out proposed.toml && hetslurm site diff proposed.toml
    """
    from hetslurm.audit.ranking import merged_site, rank_classes, ranking_section
    from hetslurm.audit.sacct import parse_sacct_json, read_accounting, sacct_result
    from hetslurm.audit.scripts import attach_hashes, default_cache_path, read_script_hashes
    from hetslurm.audit.speeds import jobs_for_scripts, learn_speeds, speed_section
    from hetslurm.cli.audit_cmd import time_range
    from hetslurm.errors import ConfigError, MetricsError
    from hetslurm.site import load_site
    from hetslurm.site.render import write_rendered
    from hetslurm.textfile import MAX_DATA_BYTES, read_file_bytes, read_text_file

    rank = rank or site_out is not None
    t0, t1 = time_range(since, until)
    path = site_path_or_none(site_file)
    site = load_site(path) if path else None
    if rank and site is None:
        raise ConfigError("--rank and --site-out need the site file (--site)")
    try:
        if sacct_file:
            acct = parse_sacct_json(read_file_bytes(sacct_file, what="sacct JSON file",
                                                    max_bytes=MAX_DATA_BYTES), site)
        else:
            acct = sacct_result(read_accounting(dict(os.environ), t0, t1), site)
    except MetricsError as exc:
        raise ConfigError(f"accounting could not be read: {exc}") from exc
    jobs = acct.jobs
    notes: list[str] = []
    if use_scripts and jobs is not None and len(jobs):
        from hetslurm.slurm import get_backend

        reader = None if sacct_file else get_backend("cli", dict(os.environ))
        cache = Path(script_cache) if script_cache else default_cache_path()
        hashes = read_script_hashes(jobs_for_scripts(jobs, min_jobs=min_jobs), reader,
                                    cache, limit=max_scripts)
        notes += hashes.notes
        jobs = attach_hashes(jobs, hashes)
    order = site.scheduling.gpu_model_order if site is not None else ()
    res = learn_speeds(jobs, model_order=order, min_jobs=min_jobs)
    notes = res.notes + notes
    rankings = rank_classes(res, site) if rank and site is not None else []
    merged = None
    if site_out and site is not None and path is not None:
        text, more = merged_site(read_text_file(path, what="site file"), str(path), res, site,
                                 rankings)
        merged, notes = text, notes + more
    rows = [r.to_dict() for r in res.rows]
    doc: dict[str, object] = {"rows": rows, "runs": res.runs, "left_out": res.left_out,
                              "notes": notes, "skipped_records": acct.skipped,
                              "since": t0, "until": t1}
    if rank:
        doc["rankings"] = [rk.to_dict() for rk in rankings]
    emit(rows, output_format, title=f"speeds from {res.runs} completed GPU runs",
         document=doc)
    for note in notes:
        click.echo(f"hetslurm learn speeds: {note}", err=True)
    for rk in rankings:
        click.echo(f"hetslurm learn speeds: class {rk.wclass}: "
                   + (f"proposed {', '.join(rk.proposed)} (site: {', '.join(rk.site_order)})"
                      if rk.changed else f"stays {', '.join(rk.site_order)}"), err=True)
    if out_path:
        day = "%Y-%m-%d"
        source = (f"{res.runs} runs between {time.strftime(day, time.localtime(t0))} and "
                  f"{time.strftime(day, time.localtime(t1))}")
        out = Path(out_path)
        text = speed_section(res, source=source) + (ranking_section(rankings) if rank else "")
        write_rendered({out.name: text}, out.parent or ".")
        click.echo(f"hetslurm learn speeds: wrote {out_path}", err=True)
    if merged is not None and site_out:
        target = Path(site_out)
        write_rendered({target.name: merged}, target.parent or ".")
        click.echo(f"hetslurm learn speeds: wrote {site_out}", err=True)


@learn.command("classes")
@site_option()
@click.option("--since", default="now-30d", show_default=True,
              help="Start: epoch, ISO 8601 or now-N{s,m,h,d}.")
@click.option("--until", default="now", show_default=True, help="End (exclusive).")
@click.option("--sacct-file", type=click.Path(dir_okay=False), default=None,
              help="Read accounting from this 'sacct --json' output instead of running sacct.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store of the site].")
@click.option("--min-jobs", type=click.IntRange(1), default=3, show_default=True,
              help="Fewest runs with evidence for a rule (fewer: reported, never guessed).")
@click.option("--cpu-class", default=None,
              help="The CPU class rules point to [default: the site's only CPU class].")
@click.option("--mode", type=click.Choice(["off", "suggest", "apply"]), default="suggest",
              show_default=True, help="The mode written into the proposed [classify].")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the proposed [classify] section (TOML) to this file (not "
                   "written when nothing is proposed).")
@format_option
def classes_cmd(site_file: str | None, since: str, until: str, sacct_file: str | None,
                store: str | None, min_jobs: int, cpu_class: str | None, mode: str,
                out_path: str | None, output_format: str) -> None:
    """Which class recurring jobs without class= belong to, from what their runs did.

    Runs of the same user and job name are judged by the collector's samples of their job
    ids: a job whose runs never used a GPU (every sample below [usage] idle_threshold_pct,
    or no GPU held), at least --min-jobs of them, gets a rule for the site's CPU class; CPU
    time and IO from accounting are shown as evidence. Rows: user, name, runs, the evidence,
    declared (classes the runs named), class (proposed) and note. The rules go into the
    site's [classify] section; with mode suggest the hook tells the user, with apply it
    applies the class (docs/learn.md).

    \b
    Example:
      hetslurm learn classes --since now-30d
      hetslurm learn classes --out classify.toml   # then merge into the site file
    """
    from hetslurm.audit.classes import (
        CLASS_COLUMNS,
        classify_section,
        learn_classes,
        usage_by_job,
    )
    from hetslurm.audit.run import AUDIT_COLUMNS
    from hetslurm.audit.sacct import sacct_result
    from hetslurm.cli.audit_cmd import time_range
    from hetslurm.errors import ConfigError, MetricsError
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.site import load_site
    from hetslurm.site.render import write_rendered
    from hetslurm.slurm.sacct import SacctDocumentError, parse_sacct_document
    from hetslurm.textfile import MAX_DATA_BYTES, read_file_bytes

    t0, t1 = time_range(since, until)
    site = load_site(site_path(site_file))
    try:
        if sacct_file:
            records = parse_sacct_document(read_file_bytes(
                sacct_file, what="sacct JSON file", max_bytes=MAX_DATA_BYTES))
        else:
            from hetslurm.audit.sacct import read_accounting

            records = read_accounting(dict(os.environ), t0, t1)
    except (MetricsError, SacctDocumentError) as exc:
        raise ConfigError(f"accounting could not be read: {exc}") from exc
    acct = sacct_result(records, site)
    folder = store or site.sections["collector"].store
    samples, report = SegmentStore.of_site(folder, site).read(t0, t1, columns=AUDIT_COLUMNS)
    res = learn_classes(acct.jobs, samples, site, since=t0, until=t1,
                        usage_of=usage_by_job(records), min_jobs=min_jobs,
                        cpu_class=cpu_class)
    rows = [r.to_dict() for r in res.rows]
    doc = {"rows": rows, "proposed": len(res.proposed()), "runs": res.runs,
           "cpu_class": res.cpu_class, "left_out": res.left_out, "problems": res.problems,
           "skipped_records": acct.skipped, "store": report.to_dict(), "since": t0,
           "until": t1}
    emit([{c: r[c] for c in CLASS_COLUMNS} for r in rows], output_format,
         title=f"classes from {res.runs} runs of {len(rows)} recurring jobs", document=doc)
    for problem in res.problems:
        click.echo(f"hetslurm learn classes: {problem}", err=True)
    for why, n in res.left_out.items():
        if n:
            click.echo(f"hetslurm learn classes: left out {n} run(s): {why}", err=True)
    if not res.proposed():
        click.echo("hetslurm learn classes: no rule proposed (see the note of each row)"
                   + ("; nothing written" if out_path else ""), err=True)
        return
    if out_path:
        day = "%Y-%m-%d"
        source = (f"{res.runs} runs between {time.strftime(day, time.localtime(t0))} and "
                  f"{time.strftime(day, time.localtime(t1))}")
        out = Path(out_path)
        write_rendered({out.name: classify_section(res, mode=mode, source=source)},
                       out.parent or ".")
        click.echo(f"hetslurm learn classes: wrote {len(res.proposed())} rule(s) to "
                   f"{out_path}", err=True)
