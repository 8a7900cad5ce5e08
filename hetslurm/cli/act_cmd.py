"""``hetslurm act``: act on running jobs (``requeue-stalled``); docs/act.md."""

from __future__ import annotations

import os

import click

from hetslurm.cli.options import backend_option, format_option, site_option, site_path_or_none
from hetslurm.cli.output import emit


@click.group("act")
def act() -> None:
    """Act on running jobs: give back the GPUs of stalled ones, with guards.

    Every command is a dry run unless given --apply; with --apply each decision, warning,
    action and notice goes to the append-only action log ([stall] action_log).
    """


@act.command("requeue-stalled")
@site_option(when_missing="defaults")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store of the site].")
@click.option("--apply", "apply_", is_flag=True,
              help="Act (warn, requeue, hold, cancel, downgrade, notify); without it nothing "
              "changes.")
@click.option("--log", "action_log", type=click.Path(dir_okay=False), default=None,
              help="Action log (JSON lines) [default: [stall] action_log].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), default=None,
              help="Lock file that keeps runs from overlapping [default: [stall] lock_file].")
@backend_option(default="cli")
@format_option
def requeue_stalled(site_file: str | None, store: str | None, apply_: bool,
                    action_log: str | None, lock_file: str | None, backend: str,
                    output_format: str) -> None:
    """Find running GPU jobs idle over the [stall] window and requeue them safely.

    Prints the decision table: job, user, GPUs, utilization over the window, the rule that
    fired and the action. A requeue, hold or cancel happens only with --apply, only after a
    logged warning at least [stall] warning_grace_s old, and is checked in Slurm (pending or
    held, restarts raised) before the user is notified. A job whose #HET line says
    on-idle=downgrade is requeued held, its request moved to the next cheaper GPU model the
    site allows, and released; a heterogeneous job is requeued through its leader only when
    every component is idle. A second --apply run while one holds the lock exits 0 at once
    without acting.
    """
    from hetslurm.act import LockBusy
    from hetslurm.act.output_mode import SlurmOutputProbe
    from hetslurm.act.run import StallRequest
    from hetslurm.act.run import requeue_stalled as run
    from hetslurm.site.load import load_site_as_root
    from hetslurm.slurm import get_backend

    # The site ([stall], [usage]) by the one rule; without one, the built-in defaults.
    path = site_path_or_none(site_file)
    site = load_site_as_root(path) if path else None
    env = dict(os.environ)
    req = StallRequest(apply=apply_, store=store, action_log=action_log, lock_file=lock_file)
    try:
        result = run(get_backend(backend, env=env), req, site=site,
                     output_probe=SlurmOutputProbe(env), env=env)
    except LockBusy as exc:
        click.echo(f"hetslurm act requeue-stalled: {exc}", err=True)
        return
    for problem in result.problems:
        click.echo(f"hetslurm act requeue-stalled: {problem}", err=True)
    title = "requeue-stalled (applied)" if result.applied else "requeue-stalled (dry run)"
    emit(result.rows(), output_format, title=title, document={
        "applied": result.applied, "problems": result.problems,
        "decisions": [d.to_dict() for d in result.decisions],
        "outcomes": [o.__dict__ for o in result.outcomes]})
