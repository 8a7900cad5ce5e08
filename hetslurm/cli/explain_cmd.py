"""``hetslurm explain``: run the hook on a job script in-process and show the rewrite."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from hetslurm.cli.options import (
    EMPTY,
    format_option,
    measured_options,
    site_option,
    site_path,
    slurm_release,
    slurm_version_option,
    state_option,
)
from hetslurm.cli.output import emit

if TYPE_CHECKING:
    from hetslurm.placement import ClusterModel, ScoreWeights
    from hetslurm.placement.state import LiveState


def _sbatch_options(f: Callable[..., None]) -> Callable[..., None]:
    # The options come from the one table the #SBATCH parser reads, so the two cannot drift.
    from hetslurm.hook.explain import SBATCH_OPTIONS

    f = click.option("--requeue/--no-requeue", "requeue", default=None,
                     help="As sbatch --requeue / --no-requeue.")(f)
    for o in reversed(SBATCH_OPTIONS):
        decls = [f"--{o.long}"] + ([f"-{o.short}"] if o.short else [])
        f = click.option(*decls, o.attr, default=None, help=o.help)(f)
    return f


@click.command("explain")
@click.argument("script", metavar="JOB_SCRIPT", required=False,
                type=click.Path(dir_okay=False, allow_dash=True))
@site_option()
@click.option("--hook", "hook_file", type=click.Path(dir_okay=False), default=None,
              help="Run this installed job_submit.lua instead of rendering one for --site.")
@_sbatch_options
@click.option("--user", default="root", show_default=True, help="Submitting user's name.")
@state_option(default="empty")
@measured_options
@slurm_version_option
@format_option
def explain_cmd(script: str | None, site_file: str | None, hook_file: str | None, user: str,
                state_spec: str, measured: bool | None, measured_energy: bool | None,
                slurm_version: str | None, output_format: str, **sbatch: Any) -> None:
    """Show what the job_submit hook would do to JOB_SCRIPT, and where it would run now.

    Runs the same job_submit.lua slurmctld runs, in-process (Lua 5.1 through lupa, or
    $HETSLURM_LUA), with a strict stand-in for the plugin of --slurm-version: fields the
    hook writes, the messages the user would see, the decision record, and `hetslurm
    place`'s answer for the request. Without
    JOB_SCRIPT it explains an srun/salloc job (give --comment 'het: ...'). #SBATCH lines of
    the script count as the options above, passed to the hook in the fields Slurm 22.05
    fills from them; options given here win. The placement scores with the site's
    [placement.weights] (shown) and, with --measured, the measured load.
    """
    from hetslurm.cli.place_cmd import apply_measured, weights_line
    from hetslurm.hook.explain import JobOptions, explain
    from hetslurm.site import load_site
    from hetslurm.textfile import read_text_file, read_text_stream

    text: str | None = None
    # Scripts keep any bytes (Slurm passes them as bytes; the hook judges them); the size
    # and regular-file checks still apply.
    if script == "-":
        text = read_text_stream(sys.stdin.buffer, what="job script", label="<stdin>",
                                errors="surrogateescape")
    elif script:
        text = read_text_file(script, what="job script", errors="surrogateescape")
    site = load_site(site_path(site_file))
    opts = JobOptions(user=user, **sbatch)
    hook_text = read_text_file(hook_file, what="--hook file") if hook_file else None
    def measure(model: ClusterModel, live: LiveState | None,
                weights: ScoreWeights) -> tuple[ClusterModel, dict[str, Any]]:
        return apply_measured(site, model, weights, state_spec=state_spec, live=live,
                              measured=measured, measured_energy=measured_energy)

    ex = explain(text, site, opts, hook_text=hook_text,
                 state=None if state_spec == EMPTY else state_spec,
                 slurm=slurm_release(slurm_version, fallback=True), measure=measure)
    doc = ex.to_dict()
    if output_format == "json":
        emit([], "json", document=doc)
        return
    rows: list[dict[str, Any]] = [{"what": "outcome", "value": ex.outcome}]
    rows += [{"what": "message", "value": m} for m in ex.messages]
    rows += [{"what": f"set {f}", "value": v} for f, v in ex.writes]
    p = ex.placement
    if p is not None:
        rows.append({"what": "place: nodelist" if p.get("placeable") else "place: cannot",
                     "value": p.get("nodelist") or p.get("blocking") or ""})
        rows.append({"what": "place: why", "value": p.get("reason", "")})
        if "weights" in p:
            rows.append({"what": "place: weights", "value": weights_line(p["weights"])})
    if ex.placement_note:
        rows.append({"what": "placement note", "value": ex.placement_note})
    emit(rows, output_format, title=f"hook {ex.hook.get('build', '?')} on "
         f"{script or 'srun/salloc'}", document=doc)
