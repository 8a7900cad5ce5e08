"""``hetslurm testbed``: the local real Slurm cluster (up, status, env, down)."""

from __future__ import annotations

import click

from hetslurm.cli.options import format_option, site_option, site_path_or_none
from hetslurm.cli.output import emit
from hetslurm.testbed import Testbed

_DIR = click.option("--dir", "state_dir", type=click.Path(file_okay=False), default=None,
                    help="State folder [default: $HETSLURM_TESTBED_DIR or ./.testbed].")


def _tb(state_dir: str | None) -> Testbed:
    return Testbed(state_dir, log=lambda msg: click.echo(f"testbed: {msg}", err=True))


@click.group()
def testbed() -> None:
    """A real heterogeneous Slurm 22.05 cluster on this machine, for demos and tests.

    \b
    As root on Debian 12, `up` installs missing packages (slurmctld, slurmd, slurmdbd,
    munge, mariadb-server) without starting their system services, then starts its own
    munged, MariaDB + slurmdbd, slurmctld and one slurmd per site node, all on loopback
    with free ports, under one state folder. GPUs and FPGAs are emulated character devices.

    \b
      hetslurm testbed up                    # start (or update) the demo site
      eval "$(hetslurm testbed env)"         # point sbatch/squeue/sacct at it
      sbatch --gres=gpu:a100:2 --wrap 'echo $CUDA_VISIBLE_DEVICES'
      hetslurm testbed down                  # stop exactly what up started
    """


@testbed.command("up")
@site_option(when_missing="demo")
@_DIR
def up(site_file: str | None, state_dir: str | None) -> None:
    """Start the cluster and wait until every node is idle.

    Idempotent: on a running cluster it renders the site again and does nothing, runs
    `scontrol reconfigure` (partitions changed) or restarts slurmctld and slurmd (nodes,
    gres or topology changed), and says which.
    """
    tb = _tb(state_dir)
    # The site rule's first three places here; the fourth is this testbed's own site, which
    # up() takes (else the shipped demo) when given None.
    res = tb.up(site_path_or_none(site_file, testbed=None))
    detail = f" ({res.detail})" if res.detail else ""
    click.echo(f"testbed {res.action}: {res.nodes} nodes idle in {res.seconds:.1f}s{detail}",
               err=True)
    click.echo(tb.env_line())


@testbed.command("install")
def install() -> None:
    """Install the Debian packages the testbed needs (root), starting none of their services."""
    from hetslurm.testbed import packages

    done = packages.ensure_packages(lambda msg: click.echo(f"testbed: {msg}", err=True))
    packages.check_binaries()
    click.echo(f"installed: {' '.join(done)}" if done else "all packages present", err=True)


@testbed.command("down")
@_DIR
def down(state_dir: str | None) -> None:
    """Cancel all jobs, stop exactly the daemons `up` started, leave nothing running."""
    res = _tb(state_dir).down()
    click.echo(f"testbed down in {res['seconds']}s: stopped {len(res['stopped'])} daemons"
               + (f", killed {', '.join(res['killed'])}" if res["killed"] else ""), err=True)


@testbed.command("env")
@_DIR
def env(state_dir: str | None) -> None:
    """Print the export lines (SLURM_CONF, HETSLURM_ETC, HETSLURM_TESTBED_DIR); use:
    eval "$(hetslurm testbed env)"."""
    click.echo(_tb(state_dir).env_line())


@testbed.command("status")
@_DIR
@format_option
def status(state_dir: str | None, output_format: str) -> None:
    """Daemons (pid, alive) and node states of the testbed."""
    st = _tb(state_dir).status()
    rows = [{"daemon": n, "pid": d["pid"], "alive": d["alive"]}
            for n, d in st["daemons"].items()]
    rows += [{"daemon": f"node {n}", "pid": "", "alive": s} for n, s in st["nodes"].items()]
    emit(rows, output_format, title=f"testbed {st['dir']}", document=st)
