"""``hetslurm simulate``: replay a real trace under each policy, or check the simulator against
the testbed with ``--validate`` (docs/simulate.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import click

from hetslurm.cli.options import site_option, site_path
from hetslurm.cli.output import emit, format_option

_ROW_KEYS = ("policy", "load", "jobs", "unfinished", "mean_wait_s", "median_wait_s",
             "p95_wait_s", "mean_jct_s", "completions_per_h_saturated", "mean_queue_depth",
             "energy_kwh", "seconds")
_DEFAULT_WORKLOAD = "site-configs/validate-workload.toml"


def _default_workload() -> str:
    """The shipped workload (the checkout's or the installed one, never the cwd's)."""
    from hetslurm.site.examples import example

    return str(example(Path(_DEFAULT_WORKLOAD).name))


@click.command("simulate")
@site_option()
@click.option("--trace", "trace_file", default=None, type=click.Path(dir_okay=False),
              help="Trace file (see $HETSLURM_TRACES, docs/simulate.md).")
@click.option("--trace-format", default=None,
              type=click.Choice(("alibaba", "philly", "gavel", "swf")), help="Trace format.")
@click.option("--params", "params_file", default=None, type=click.Path(dir_okay=False),
              help="Assumptions file (site-configs/simulate-params.toml).")
@click.option("--policy", "policies", multiple=True,
              type=click.Choice(("slurm-default", "slurm-cpu-partition", "slurm-speed-weights",
                                 "slurm-tuned", "hetslurm", "all")),
              help="Policy to replay (repeat; default: slurm-default and hetslurm; all: the "
                   "four Slurm baselines and hetslurm). Each policy's ratios are against "
                   "the strongest baseline replayed (docs/simulate.md).")
@click.option("--without", "without", multiple=True, metavar="PART[,PART]",
              help="Also replay hetslurm with these parts of the whole system switched off "
                   "(fallback: ranked fallback; speeds: the class rankings learn speeds "
                   "proposes), as policy hetslurm-without-PART[+PART]; repeat for an "
                   "ablation table in one run (docs/simulate.md, \"The whole system\").")
@click.option("--load", "loads", multiple=True, type=float,
              help="Arrival-rate multiplier (repeat for a sweep; default 1).")
@click.option("--first", default=0, show_default=True, type=click.IntRange(min=0),
              help="Skip this many jobs of the trace (by submit time).")
@click.option("--jobs", "limit", default=None, type=click.IntRange(min=1),
              help="Replay at most this many jobs from --first [default: all].")
@click.option("--seed", "seeds", multiple=True, type=click.IntRange(min=0),
              help="Seed of the replay's random choices (the class drawn for a job the "
                   "trace leaves untyped; repeat for several: each figure is then the "
                   "median over the seeds with its min-max) [default: 0].")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Replay the (seed, policy) tasks in this many processes at once (one "
                   "core each).")
@click.option("--rows-out", "rows_out", default=None, type=click.Path(dir_okay=False),
              help="Append each (policy, load) row to this file as one JSON line the moment "
                   "it is done, so a sweep stopped part-way keeps every finished row.")
@click.option("--plot", "plot_dir", default=None, type=click.Path(file_okay=False),
              help="Write wait CDF, wait vs load and GPUs busy over time (PNG) here.")
@click.option("--validate", "workload_file", is_flag=False, flag_value=_DEFAULT_WORKLOAD,
              default=None, type=click.Path(dir_okay=False),
              help="Replay a committed workload on the testbed and in the simulator and "
                   f"compare (default workload: {_DEFAULT_WORKLOAD}); needs root.")
@click.option("--dir", "testbed_dir", default=None, type=click.Path(file_okay=False),
              help="--validate: the testbed's state folder (short path) [default: a new "
                   "hsv* folder in $TMPDIR, removed after].")
@click.option("--sim-only", is_flag=True,
              help="--validate: the simulator's side only (no testbed).")
@click.option("--slurm", "slurm", metavar="RELEASE", default=None,
              help="--validate: the Slurm release the testbed runs (22.05, 24.11 or 26.05) "
                   "[default: the host's]; one the host lacks runs from its cached Debian "
                   "root (docs/testbed.md).")
@click.option("--speed-exponent", default=1.0, show_default=True,
              type=click.FloatRange(min=0),
              help="Raise every [speeds] value of --params to this power (0: all models "
                   "equally fast; 2: every speed ratio squared): the speed sensitivity "
                   "sweep of docs/evidence.md.")
@click.option("--backfill", default=None, type=click.Choice(("slurm", "easy")),
              help="Backfill model instead of --params' [scheduler] backfill: slurm "
                   "(Slurm 22.05's rules, validated on the testbed) or easy (EASY "
                   "backfill, one reservation).")
@format_option
def simulate(site_file: str | None, trace_file: str | None, trace_format: str | None,
             params_file: str | None, policies: tuple[str, ...], loads: tuple[float, ...],
             first: int, limit: int | None, plot_dir: str | None, workload_file: str | None,
             testbed_dir: str | None, sim_only: bool, speed_exponent: float,
             backfill: str | None, rows_out: str | None, seeds: tuple[int, ...],
             workers: int, without: tuple[str, ...], slurm: str | None,
             output_format: str) -> None:
    """Replay a trace through Slurm's priority order and backfill as each policy
    configures it.

    The backfill model is --params' [scheduler] backfill (the committed file: slurm, Slurm
    22.05's conservative whole-node backfill, the model --validate checks), or --backfill.

    Prints one row per policy and load (waits in seconds, energy in kWh) and, with
    --format json, the full measures, a summary per policy (highest load with bounded mean
    wait, ratios to the strongest baseline replayed and to each other one) and what was
    dropped. A progress bar goes to stderr.
    An internal error of one replay fails that row only (its "error" says why; the others
    are printed; exit status 1); --rows-out keeps each row as it finishes. With several
    --seed each figure of the summary is the median over the seeds with its min-max;
    --workers 2 replays on both cores of a 2-core machine.

    With --validate [WORKLOAD] it replays the committed workload on the local testbed
    (sbatch, #HET directives for hetslurm) and in the simulator, and prints per policy
    mean wait and makespan of both, their difference and whether it is within the
    workload's target; exit status 1 when a figure misses it.
    """
    from hetslurm.errors import ConfigError
    from hetslurm.simulate.params import POLICIES, parse_without, variant_name

    chosen = (POLICIES if "all" in policies
              else tuple(dict.fromkeys(policies)) or ("slurm-default", "hetslurm"))
    try:
        variants = tuple(dict.fromkeys(variant_name(parse_without(w)) for w in without))
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    chosen = (*chosen, *(v for v in variants if v not in chosen))
    if workload_file is not None:
        given = [name for name, v in (("--site", site_file), ("--trace", trace_file),
                                      ("--trace-format", trace_format),
                                      ("--params", params_file), ("--plot", plot_dir))
                 if v is not None] + (["--load"] if loads else []) + (
                     ["--first"] if first else []) + (
                     ["--speed-exponent"] if speed_exponent != 1.0 else []) + (
                     ["--backfill"] if backfill else []) + (
                     ["--rows-out"] if rows_out else []) + (
                     ["--seed"] if seeds else []) + (["--workers"] if workers != 1 else []) + (
                     ["--without"] if without else [])
        if given:
            raise click.UsageError(f"{', '.join(given)}: not with --validate (the workload "
                                   "file fixes the site, parameters and jobs)")
        path = _default_workload() if workload_file == _DEFAULT_WORKLOAD else workload_file
        if slurm is not None and sim_only:
            raise click.UsageError("--slurm: not with --sim-only (no testbed runs)")
        if slurm is not None:
            from hetslurm.slurm import versions

            try:
                slurm = versions.release(slurm).name
            except ConfigError as exc:
                raise click.UsageError(f"--slurm: {exc}") from None
        _validate(path, chosen, limit, testbed_dir, sim_only, slurm, output_format)
        return
    if testbed_dir is not None or sim_only or slurm is not None:
        raise click.UsageError("--dir, --sim-only and --slurm go with --validate")
    missing = [name for name, v in (("--trace", trace_file), ("--trace-format", trace_format),
                                    ("--params", params_file)) if v is None]
    if missing:
        raise click.UsageError(f"missing {', '.join(missing)} (or use --validate)")
    assert trace_file and trace_format and params_file
    from hetslurm.simulate.params import load_params
    from hetslurm.simulate.run import simulate as run_simulation
    from hetslurm.simulate.traces import read_trace
    from hetslurm.site.load import load_site

    site = load_site(site_path(site_file))
    params = load_params(params_file)
    if speed_exponent != 1.0:
        params = params.with_speed_exponent(speed_exponent)
    if backfill is not None:
        params = replace(params, backfill=backfill)
    trace = read_trace(trace_file, trace_format)
    swept = loads or (1.0,)
    on_row = _row_writer(rows_out) if rows_out else None
    with progress_bar() as bar:
        result = run_simulation(site, trace, params, policies=chosen, loads=swept,
                                first=first, limit=limit, seeds=tuple(seeds) or (0,),
                                workers=workers, progress=bar, on_row=on_row)
    if plot_dir is not None:
        from hetslurm.simulate.plots import write_plots

        for written in write_plots(result, plot_dir):
            click.echo(f"simulate: wrote {written}", err=True)
    failed = [r for r in result.rows if "error" in r]
    keys = _ROW_KEYS if len(set(seeds)) < 2 else (*_ROW_KEYS[:2], "seed", *_ROW_KEYS[2:])
    keys = (*keys, "error") if failed else keys
    rows = [{k: _round(r.get(k)) for k in keys} for r in result.rows]
    emit(rows, output_format, title=f"simulate {trace_format} on {site.name}",
         document=result.to_dict())
    for r in failed:
        click.echo(f"simulate: {r['policy']} at load {r['load']:g} failed: {r['error']}",
                   err=True)
    disagreed = sum(r.get("internal_disagreements") or 0 for r in result.rows)
    if disagreed:
        click.echo(f"simulate: the placement core overruled the free counts {disagreed} "
                   "time(s) (meta.disagreement_examples); please report it", err=True)
    if failed:
        raise SystemExit(1)


def _row_writer(path: str) -> Callable[[dict[str, object]], None]:
    """Append a row as one JSON line, the file opened and closed for each (a row is done
    every few seconds at most); refused at once when the file cannot be written."""
    import json

    from hetslurm.errors import ConfigError

    def write(row: dict[str, object]) -> None:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row, sort_keys=False) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write --rows-out: {exc.strerror}", file=path) from exc

    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write --rows-out: {exc.strerror}", file=path) from exc
    return write


def _validate(path: str, policies: tuple[str, ...], limit: int | None,
              testbed_dir: str | None, sim_only: bool, slurm: str | None,
              output_format: str) -> None:
    from hetslurm.lab.validate_simulate import validate

    def log(msg: str) -> None:
        click.echo(f"simulate --validate: {msg}", err=True)

    with progress_bar() as progress:
        result = validate(path, policies=policies, jobs=limit, testbed_dir=testbed_dir,
                          sim_only=sim_only, progress=progress, log=log, slurm=slurm)
    emit(result.rows, output_format, title=f"simulate --validate {path}",
         document=result.to_dict())
    if not result.passed:
        sys.exit(1)


@contextmanager
def progress_bar() -> Iterator[Callable[[str, int, int], None] | None]:
    """A rich progress bar on stderr, one task per label (``None`` when stderr is not a
    terminal: nothing is printed then)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    tasks: dict[str, TaskID] = {}
    last: dict[str, int] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True)) as prog:

        def update(label: str, done: int, total: int) -> None:
            # A count that goes back is the next replay of the same label (the next load).
            if label not in tasks or done < last[label]:
                runs = sum(1 for k in tasks if k == label or k.startswith(label + " #"))
                key = label if not runs else f"{label} #{runs + 1}"
                tasks[label] = prog.add_task(key, total=total)
            last[label] = done
            prog.update(tasks[label], completed=done, total=total)

        yield update


def _round(value: object) -> object:
    return round(value, 2) if isinstance(value, float) else value
