"""``hetslurm rebalance``: the cron entry point (requeue-stalled, weights, relax, drift);
docs/act.md."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from hetslurm.cli.options import (
    backend_option,
    conf_dir_option,
    format_option,
    site_option,
    site_path,
    testbed_target_option,
)
from hetslurm.cli.output import emit
from hetslurm.errors import PARTIAL_EXIT

if TYPE_CHECKING:
    from hetslurm.act.lock import RunLock


@click.command("rebalance")
@site_option()
@click.option("--apply", "apply_", is_flag=True,
              help="Act (requeue, weights, relax, notify); without it nothing changes anywhere.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store of the site].")
@click.option("--log", "action_log", type=click.Path(dir_okay=False), default=None,
              help="Action log (JSON lines) [default: [rebalance] or [stall] action_log].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), default=None,
              help="Run lock [default: [rebalance] lock_file].")
@click.option("--budget", "budget_s", type=click.FloatRange(min=0.0), default=None,
              help="Seconds after which no new work starts [default: [rebalance] "
                   "time_budget_s].")
@click.option("--only", "only", type=click.Choice(["requeue-stalled", "weights", "relax", "drift"]),
              multiple=True, help="Run only these phases (repeatable) [default: the site's].")
@testbed_target_option
@conf_dir_option(site_key="[rebalance] conf_dir")
@backend_option(default="cli")
@format_option
def rebalance(site_file: str | None, apply_: bool, store: str | None, action_log: str | None,
              lock_file: str | None, budget_s: float | None, only: tuple[str, ...],
              testbed_dir: str | None, conf_dir: str | None, backend: str,
              output_format: str) -> None:
    """One cron tick: requeue stalled GPU jobs, move node weights by measured load, relax
    long-pending jobs, report drift.

    \b
    1. requeue-stalled: exactly `hetslurm act requeue-stalled` ([stall]).
    2. weights: the mean GPU utilization of each GPU node over [weights] window_s moves
       its Weight= within its model's band (site weight .. + band, never past the next
       model), with hysteresis and a hold time; a weight `scontrol reconfigure` reset is
       written again. Missing or stale samples move nothing.
    3. relax: pending jobs that waited past [rebalance] pending_limit_s and asked for
       preferred switch locality or a ranked GPU list get only relaxing edits (switch
       wait 0, the model list widened back to the job's own, --prefer dropped), and only
       when the placement core says the relaxed request would start now.
    4. drift: `hetslurm site diff` of the site against the live files, reported only.

    A dry run unless --apply. With --apply a second concurrent run exits 0 at once,
    saying so on stderr, without acting. After [rebalance] time_budget_s no new phase or
    job starts; what was skipped is listed.
    """
    from hetslurm.act import LockBusy
    from hetslurm.act.lock import RunLock
    from hetslurm.site.load import read_site_as_root

    path = str(site_path(site_file))
    # Read once, and as root only from a file root alone can write: the lock path below
    # comes from it, and root truncates the file it names.
    text = read_site_as_root(path)
    # The lock first, before the site is validated or anything heavy is imported: a second
    # run must exit at once.
    lock = RunLock(lock_file or _lock_file(text)) if apply_ else None
    if lock is not None:
        try:
            lock.acquire()
        except LockBusy as exc:
            click.echo(f"hetslurm rebalance: {exc}", err=True)
            return
    try:
        _run(path, text, lock, apply_, store, action_log, budget_s, only, testbed_dir, conf_dir,
             backend, output_format)
    finally:
        if lock is not None:
            lock.release()


def _lock_file(site_text: str) -> str:
    """``[rebalance] lock_file`` read straight from the TOML (validated later with the rest)."""
    import tomllib

    from hetslurm.site.schema import Rebalance

    try:
        raw = tomllib.loads(site_text)
    except tomllib.TOMLDecodeError:
        raw = {}
    section = raw.get("rebalance")
    value = section.get("lock_file") if isinstance(section, dict) else None
    return value if isinstance(value, str) else str(Rebalance.model_fields["lock_file"].default)


def _run(path: str, text: str, lock: RunLock | None, apply_: bool, store: str | None,
         action_log: str | None, budget_s: float | None, only: tuple[str, ...],
         testbed_dir: str | None, conf_dir: str | None, backend: str, output_format: str) -> None:
    from hetslurm.act.drift import live_target
    from hetslurm.act.output_mode import SlurmOutputProbe
    from hetslurm.act.rebalance import RebalanceRequest, policy_of
    from hetslurm.act.rebalance import rebalance as run
    from hetslurm.site import parse_site
    from hetslurm.slurm import get_backend

    site = parse_site(text, path)
    pol = policy_of(site)
    env = dict(os.environ)
    from hetslurm.testbed.target import choose_target

    _, target = choose_target(site, testbed_dir=testbed_dir,
                              live=lambda: live_target(conf_dir or pol.conf_dir,
                                                       pol.whole_conf, env))
    req = RebalanceRequest(apply=apply_, store=store, action_log=action_log,
                           budget_s=budget_s, phases=only or None)
    result = run(get_backend(backend, env=env), req, site, target=target,
                 output_probe=SlurmOutputProbe(env), env=env,
                 lock=lock)
    for problem in result.problems:
        click.echo(f"hetslurm rebalance: {problem}", err=True)
    for item in result.skipped:
        click.echo(f"hetslurm rebalance: skipped {item['phase']} {item.get('job', '')}: "
                   f"{item['why']}", err=True)
    title = "rebalance (applied)" if result.applied else "rebalance (dry run)"
    emit(result.rows(), output_format, title=title, document=result.to_dict())
    if result.problems:
        # Some phase could not run (accounting down, no store, a refused file): what did run
        # is in the report; cron sees a status of its own (docs/cli.md).
        sys.exit(PARTIAL_EXIT)
