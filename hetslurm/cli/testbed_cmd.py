"""``hetslurm testbed``: the local real Slurm cluster (up, status, env, down)."""

from __future__ import annotations

import click

from hetslurm.cli.options import format_option, site_option, site_path_or_none
from hetslurm.cli.output import emit
from hetslurm.testbed import Testbed

_DIR = click.option("--dir", "state_dir", type=click.Path(file_okay=False), default=None,
                    help="State folder [default: $HETSLURM_TESTBED_DIR or ./.testbed].")


def _tb(state_dir: str | None, slurm: str | None = None) -> Testbed:
    return Testbed(state_dir, log=lambda msg: click.echo(f"testbed: {msg}", err=True),
                   slurm=slurm)


@click.group()
def testbed() -> None:
    """A real heterogeneous Slurm cluster on this machine, for demos and tests.

    \b
    As root on Debian, `up` installs missing packages (slurmctld, slurmd, slurmdbd,
    munge, mariadb-server) without starting their system services, then starts its own
    munged, MariaDB + slurmdbd, slurmctld and one slurmd per site node, all on loopback
    with free ports, under one state folder. GPUs and FPGAs are emulated character devices.
    `--slurm 24.11|26.05` runs that release's Slurm from a cached Debian root
    (built on first use, about two minutes; see docs/testbed.md).

    \b
      hetslurm testbed up                    # start (or update) the demo site
      hetslurm testbed up --slurm 24.11      # the same cluster on Slurm 24.11
      eval "$(hetslurm testbed env)"         # point sbatch/squeue/sacct at it
      sbatch --gres=gpu:a100:2 --wrap 'echo $CUDA_VISIBLE_DEVICES'
      hetslurm testbed down                  # stop exactly what up started
    """


@testbed.command("up")
@site_option(when_missing="demo")
@_DIR
@click.option("--slurm", "slurm", metavar="RELEASE", default=None,
              help="Slurm release to run: 22.05, 24.11 or 26.05 [default: the one this "
                   "testbed runs, else the host's]. A release the host's Debian does not ship "
                   "runs from a cached Debian root.")
def up(site_file: str | None, state_dir: str | None, slurm: str | None) -> None:
    """Start the cluster and wait until every node is idle.

    Idempotent: on a running cluster it renders the site again and does nothing, runs
    `scontrol reconfigure` (partitions changed) or restarts slurmctld and slurmd (nodes,
    gres or topology changed), and says which.
    """
    tb = _tb(state_dir, slurm)
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
    """Print the export lines (SLURM_CONF, HETSLURM_ETC, HETSLURM_TESTBED_DIR, and on a
    root PATH with wrappers that run the root's sbatch, squeue, sacct, scontrol ...); use:
    eval "$(hetslurm testbed env)"."""
    click.echo(_tb(state_dir).env_line())


@testbed.command("status")
@_DIR
@format_option
def status(state_dir: str | None, output_format: str) -> None:
    """Daemons (pid, alive), node states and the Slurm version of the testbed."""
    st = _tb(state_dir).status()
    rows = [{"daemon": n, "pid": d["pid"], "alive": d["alive"]}
            for n, d in st["daemons"].items()]
    rows += [{"daemon": f"node {n}", "pid": "", "alive": s} for n, s in st["nodes"].items()]
    emit(rows, output_format, title=f"testbed {st['dir']} (Slurm {st['slurm_version']})",
         document=st)
