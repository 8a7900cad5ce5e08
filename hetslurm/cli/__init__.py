"""The ``hetslurm`` command line: thin click commands over the library.

Every command parses its options, calls one library function and renders what it returns.
Library errors (:class:`hetslurm.errors.HetslurmError`) become one line on stderr and the
error family's exit code; ``-v`` shows the traceback as well.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from hetslurm import __version__
from hetslurm.errors import HetslurmError


class _Group(click.Group):
    """Turns library errors into one line and a documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HetslurmError as exc:
            if ctx.obj and ctx.obj.get("verbose"):
                traceback.print_exc()
            click.echo(f"hetslurm: error: {exc}", err=True)
            sys.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Show tracebacks and debug messages.")
@click.version_option(__version__, prog_name="hetslurm")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """hetslurm: make Slurm good at heterogeneous clusters.

    hetslurm describes a site (nodes with different GPU models, FPGAs and CPU-only nodes) in
    one TOML file, renders Slurm's own configuration from it, and runs a real local Slurm
    cluster for trying it out. Slurm stays the scheduler.

    \b
    Start here:
      hetslurm site check site-configs/demo.toml     validate a site file
      hetslurm site render site-configs/demo.toml --out /tmp/conf
      hetslurm testbed up                            boot the local demo cluster
      eval "$(hetslurm testbed env)"                 point Slurm's commands at it
      hetslurm status                                GPUs/FPGAs/cores by model and state

    Exit codes: 0 ok, 1 other error, 2 bad configuration or usage, 3 compiled core missing,
    4 Slurm backend failure, 5 placement error, 6 testbed failure, 7 rollout failed
    (site apply/rollback; the message says whether it was rolled back), 8 a file that
    carries power has unsafe permissions (symlink, writable by others, foreign owner).
    """
    ctx.ensure_object(dict)
    ctx.obj["verbose"] = verbose


def _register() -> None:
    # Each group lives in its own module; their heavy imports happen inside the commands,
    # so `hetslurm --help` stays fast and a missing optional dependency breaks only its
    # own command.
    from hetslurm.cli import (
        act_cmd,
        advise_cmd,
        audit_cmd,
        bench_cmd,
        collect_cmd,
        explain_cmd,
        exporter_cmd,
        hook_cmd,
        learn_cmd,
        place_cmd,
        rebalance_cmd,
        simulate_cmd,
        site_cmd,
        status_cmd,
        testbed_cmd,
    )

    for command in (site_cmd.site, testbed_cmd.testbed, status_cmd.status, bench_cmd.bench,
                    hook_cmd.hook, explain_cmd.explain_cmd, collect_cmd.collect,
                    audit_cmd.audit_cmd, exporter_cmd.exporter, place_cmd.place_cmd,
                    place_cmd.state, simulate_cmd.simulate, act_cmd.act, rebalance_cmd.rebalance,
                    learn_cmd.learn, advise_cmd.advise_cmd):
        cli.add_command(command)


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="hetslurm")
