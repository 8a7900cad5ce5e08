"""``hetslurm simulate``: replay a real trace under each policy (docs/simulate.md)."""

from __future__ import annotations

import click

from hetslurm.cli.output import emit, format_option

_ROW_KEYS = ("policy", "load", "jobs", "unfinished", "mean_wait_s", "median_wait_s",
             "p95_wait_s", "mean_jct_s", "completions_per_h_saturated", "mean_queue_depth",
             "energy_kwh", "seconds")


@click.command("simulate")
@click.option("--site", "site_file", required=True, type=click.Path(dir_okay=False),
              help="Site file (e.g. site-configs/case-study.toml).")
@click.option("--trace", "trace_file", required=True, type=click.Path(dir_okay=False),
              help="Trace file (see $HETSLURM_TRACES, docs/simulate.md).")
@click.option("--trace-format", required=True,
              type=click.Choice(("alibaba", "philly", "gavel", "swf")), help="Trace format.")
@click.option("--params", "params_file", required=True, type=click.Path(dir_okay=False),
              help="Assumptions file (site-configs/simulate-params.toml).")
@click.option("--policy", "policies", multiple=True,
              type=click.Choice(("slurm-default", "hetslurm")),
              help="Policy to replay (repeat; default: both).")
@click.option("--load", "loads", multiple=True, type=float,
              help="Arrival-rate multiplier (repeat for a sweep; default 1).")
@click.option("--first", default=0, show_default=True, type=click.IntRange(min=0),
              help="Skip this many jobs of the trace (by submit time).")
@click.option("--jobs", "limit", default=None, type=click.IntRange(min=1),
              help="Replay at most this many jobs from --first [default: all].")
@click.option("--plot", "plot_dir", default=None, type=click.Path(file_okay=False),
              help="Write wait CDF, wait vs load and GPUs busy over time (PNG) here.")
@format_option
def simulate(site_file: str, trace_file: str, trace_format: str, params_file: str,
             policies: tuple[str, ...], loads: tuple[float, ...], first: int,
             limit: int | None, plot_dir: str | None, output_format: str) -> None:
    """Replay a trace through Slurm's FCFS + EASY backfill as each policy configures it.

    Prints one row per policy and load (waits in seconds, energy in kWh) and, with
    --format json, the full measures, a summary per policy (highest load with bounded mean
    wait, ratios to slurm-default) and what was dropped. Progress goes to stderr.
    """
    from hetslurm.simulate.params import load_params
    from hetslurm.simulate.run import simulate as run_simulation
    from hetslurm.simulate.traces import read_trace
    from hetslurm.site.load import load_site

    site = load_site(site_file)
    params = load_params(params_file)
    trace = read_trace(trace_file, trace_format)
    chosen = policies or ("slurm-default", "hetslurm")
    last: dict[str, int] = {}

    def progress(policy: str, done: int, total: int) -> None:
        step = max(total // 10, 1)
        if done // step != last.get(policy, -1):
            last[policy] = done // step
            click.echo(f"simulate: {policy}: {done}/{total} jobs done", err=True)

    result = run_simulation(site, trace, params, policies=chosen, loads=loads or (1.0,),
                            first=first, limit=limit, progress=progress)
    if plot_dir is not None:
        from hetslurm.simulate.plots import write_plots

        for path in write_plots(result, plot_dir):
            click.echo(f"simulate: wrote {path}", err=True)
    rows = [{k: _round(r.get(k)) for k in _ROW_KEYS} for r in result.rows]
    emit(rows, output_format, title=f"simulate {trace_format} on {site.name}",
         document=result.to_dict())


def _round(value: object) -> object:
    return round(value, 2) if isinstance(value, float) else value


def register(cli: click.Group) -> None:
    cli.add_command(simulate)
