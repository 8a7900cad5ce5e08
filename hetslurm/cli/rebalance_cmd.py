"""``hetslurm rebalance``: the cron entry point (health, requeue-stalled, weights, relax,
drift), and ``hetslurm rebalance rollback`` (undo drains and weights by action id);
docs/act.md."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

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


@click.group("rebalance", invoke_without_command=True)
@site_option()
@click.option("--apply", "apply_", is_flag=True,
              help="Act (drain, undrain, requeue, weights, relax, notify); without it nothing "
                   "changes anywhere.")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store of the site].")
@click.option("--log", "action_log", type=click.Path(dir_okay=False), default=None,
              help="Action log (JSON lines) [default: [rebalance] or [stall] action_log].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), default=None,
              help="Run lock [default: [rebalance] lock_file].")
@click.option("--budget", "budget_s", type=click.FloatRange(min=0.0), default=None,
              help="Seconds after which no new work starts [default: [rebalance] "
                   "time_budget_s].")
@click.option("--only", "only", type=click.Choice(["health", "requeue-stalled", "weights",
                                                  "relax", "drift"]),
              multiple=True, help="Run only these phases (repeatable) [default: the site's].")
@click.option("--skip-health", is_flag=True,
              help="Do not run the device-health phase (no drain, no undrain) this time.")
@click.option("--read-cache", "read_cache", type=click.Path(dir_okay=False), default=None,
              help="The store read's cache: segments the last pass read are not opened "
                   "again; '' for none [default: [rebalance] read_cache, else "
                   "rebalance-window.arrow beside the run lock].")
@testbed_target_option
@conf_dir_option(site_key="[rebalance] conf_dir")
@backend_option(default="cli")
@format_option
@click.pass_context
def rebalance(ctx: click.Context, site_file: str | None, apply_: bool, store: str | None,
              action_log: str | None, lock_file: str | None, budget_s: float | None,
              only: tuple[str, ...], skip_health: bool, read_cache: str | None,
              testbed_dir: str | None, conf_dir: str | None, backend: str,
              output_format: str) -> None:
    """One cron tick: drain sick GPU nodes, requeue stalled GPU jobs, move node weights by
    measured load, relax long-pending jobs, report drift.

    \b
    0. health ([health]): a node with an unhealthy GPU (lost, uncorrected ECC, an XID of
       the attention list, persistent hardware or thermal throttling) is drained as a whole
       (Slurm cannot drain one GPU; running jobs finish) with Reason="hetslurm: <node> GPU
       <i> (minor <m>) <evidence>"; a node hetslurm drained is undrained when all its GPUs
       are healthy again. DOWN nodes and nodes drained for another reason are left alone;
       stale or unknown samples never act; at most [health] max_drain_share of a model's
       GPUs per pass. [health] mode = "report" lists without acting.
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

    \b
    Examples:
      hetslurm rebalance                           dry run: what each phase would do
      hetslurm rebalance --only health --format json
      hetslurm rebalance --apply --skip-health     act, but leave node drains alone
      hetslurm rebalance rollback --to drain-1800000000-gpu1 --apply
    """
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params
                 if ctx.get_parameter_source(p.name or "") is not
                 click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)} belong after "
                                   f"'{ctx.invoked_subcommand}'")
        return
    got = _site_and_lock(site_file, lock_file, apply_, "hetslurm rebalance")
    if got is None:
        return
    path, text, lock = got
    try:
        phases = only or None
        if skip_health:
            from hetslurm.act.rebalance import PHASES

            phases = tuple(p for p in (only or PHASES) if p != "health")
        _run(path, text, lock, apply_, store, action_log, budget_s, phases, testbed_dir,
             conf_dir, backend, output_format, read_cache)
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
         action_log: str | None, budget_s: float | None, only: tuple[str, ...] | None,
         testbed_dir: str | None, conf_dir: str | None, backend: str, output_format: str,
         read_cache: str | None = None) -> None:
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
                           budget_s=budget_s, phases=only, read_cache=read_cache)
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


@rebalance.command("rollback")
@site_option()
@click.option("--to", "to", default=None, metavar="ACTION_ID",
              help="Undo this action and every later one of its phase (health, or weights "
                   "for a weight-... id), newest first [default: the actions of the latest "
                   "run that acted].")
@click.option("--apply", "apply_", is_flag=True,
              help="Undo; without it nothing changes (the steps are listed).")
@click.option("--log", "action_log", type=click.Path(dir_okay=False), default=None,
              help="Action log (JSON lines) [default: [rebalance] or [stall] action_log].")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False), default=None,
              help="Run lock [default: [rebalance] lock_file].")
@backend_option(default="cli")
@format_option
def rollback(site_file: str | None, to: str | None, apply_: bool, action_log: str | None,
             lock_file: str | None, backend: str, output_format: str) -> None:
    """Undo hetslurm's node drains, undrains and weight changes, by action id.

    Each drain or undrain the health phase made has an action id in the action log
    (`"action_id": "drain-1800000000-gpu1"`, also in `rebalance --format json`). Undoing a
    drain undrains the node (State=UNDRAIN), only while its reason is still the one that
    drain set; undoing an undrain drains it again with the reason it had. A node that is
    DOWN, or drained by anyone else since, is left alone. Every step is re-checked right
    before it acts and logged with "rollback_of".

    Each weight change of the weights phase has an id too ("weight-1800000000-gpu1"):
    undoing it writes the weight the node had before, only while the node still shows the
    one hetslurm wrote. Without --to both kinds of the latest run are undone.

    The health phase judges the node again at the next rebalance: a node whose GPU is still
    unhealthy is drained again (set [health] mode = "report", or run rebalance with
    --skip-health, to keep it in service); the weights phase likewise moves a still busy
    node again (set [weights] band = 0 to stop it).

    \b
    Examples:
      hetslurm rebalance rollback                  dry run: undo the latest run's actions
      hetslurm rebalance rollback --to drain-1800000000-gpu1 --apply
      hetslurm rebalance rollback --format json
    """
    got = _site_and_lock(site_file, lock_file, apply_, "hetslurm rebalance rollback")
    if got is None:
        return
    path, text, lock = got
    try:
        _rollback(path, text, to, apply_, action_log, backend, output_format)
    finally:
        if lock is not None:
            lock.release()


def _site_and_lock(site_file: str | None, lock_file: str | None, apply_: bool, who: str
                   ) -> tuple[str, str, RunLock | None] | None:
    """The site's path and text, and with ``apply_`` the rebalance lock, held; None (said on
    stderr) when another run holds it."""
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
            click.echo(f"{who}: {exc}", err=True)
            return None
    return path, text, lock


def _rollback(path: str, text: str, to: str | None, apply_: bool, action_log: str | None,
              backend: str, output_format: str) -> None:
    import time

    from hetslurm.act.health import apply_rollback, plan_rollback, policy_for
    from hetslurm.act.log import ActionLog
    from hetslurm.act.rebalance import policy_of
    from hetslurm.act.run import context_for
    from hetslurm.site import parse_site
    from hetslurm.slurm import get_backend

    site = parse_site(text, path)
    log = ActionLog(action_log or policy_of(site).action_log
                    or context_for(site).stall.action_log)
    log.check()
    from hetslurm.act import weights as W

    slurm = get_backend(backend, env=dict(os.environ))
    # An id names its phase: weight changes are "weight-...", drains and undrains the rest.
    weights_id = to is not None and to.startswith("weight-")
    steps = [] if weights_id else plan_rollback(slurm, log, to)
    wsteps = W.plan_rollback(slurm, log, to) if to is None or weights_id else []
    outcomes: list[Any] = []
    if apply_:
        now = time.time()
        outcomes = [*apply_rollback(slurm, steps, policy_for(site), log, now=now),
                    *W.apply_rollback(slurm, wsteps, log, now=now)]
    results = {(o.node, o.action in ("rollback",)): o for o in outcomes}
    every: list[Any] = [*steps, *wsteps]
    rows = []
    for st in every:
        o = results.get((st.node, isinstance(st, W.WeightUndo)))
        rows.append({**st.to_dict(), "result": o.result if o is not None else "",
                     "action_id": o.action_id if o is not None else ""})
    if not steps and not wsteps:
        click.echo("hetslurm rebalance rollback: no health action or weight change to undo",
                   err=True)
    title = "rollback (applied)" if apply_ else "rollback (dry run)"
    emit(rows, output_format, title=title,
         document={"applied": apply_, "to": to,
                   "steps": [st.to_dict() for st in every],
                   "outcomes": [o.__dict__ for o in outcomes]})
