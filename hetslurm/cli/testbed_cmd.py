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


@testbed.command("fake")
@_DIR
@click.option("--list", "list_only", is_flag=True,
              help="Show what every fake GPU reports now instead of changing anything.")
@format_option
@click.argument("target", required=False, metavar="NODE[/INDEX]")
@click.argument("settings", nargs=-1, metavar="KEY=VALUE... | clear")
def fake(state_dir: str | None, list_only: bool, output_format: str, target: str | None,
         settings: tuple[str, ...]) -> None:
    """Make the testbed's fake GPUs misbehave (the fake NVML a collector reads).

    INDEX is Slurm's GPU index on NODE (mapped to the device minor through the testbed's
    gres.conf File= lines, as the collector maps it); without it every GPU of NODE changes.
    Keys: util (%), mem_used_mib, power_w (the energy counter integrates it), throttle
    (hw_slowdown, hw_thermal_slowdown, hw_power_brake, sw_thermal_slowdown, sw_power_cap,
    or none), ecc_uncorrectable (count), xid (code, reported once), lost (0/1), hang (0/1:
    the node's NVML reads block). The bare word `clear` resets the GPU or node. What is set
    lasts until `clear` or `testbed down`; a running collector follows it at its next tick.

    \b
      hetslurm testbed fake gpu1/3 util=95 power_w=600 throttle=hw_slowdown
      hetslurm testbed fake gpu1/0 xid=79 ecc_uncorrectable=2
      hetslurm testbed fake gpu2 hang=1          # every GPU of gpu2 stops answering
      hetslurm testbed fake gpu2 clear
      hetslurm testbed fake --list --format json
      hetslurm collect --all-nodes --nvml fake --fake-scenario .testbed/fake-nvml.json
    """
    from hetslurm.errors import MetricsError
    from hetslurm.metrics import fake_script
    from hetslurm.testbed.cluster import SLURMCTLD

    tb = _tb(state_dir)
    scenario = tb.fake_scenario
    if not tb.gres_conf.is_file():
        raise MetricsError(f"no testbed in {tb.root} (no {tb.gres_conf}); start it with "
                           "`hetslurm testbed up`")
    if not scenario.is_file():
        st = tb.load_state()
        if st is None or not tb.running(st).get(SLURMCTLD):
            raise MetricsError(f"no fake NVML scenario at {scenario} and the testbed in "
                               f"{tb.root} is not running; start it with `hetslurm testbed up`")
        fake_script.new_scenario(tb.gres_conf, scenario)
        click.echo(f"testbed: made the fake NVML scenario {scenario} from {tb.gres_conf}",
                   err=True)
    if list_only:
        if target or settings:
            raise click.UsageError("--list takes no NODE or settings")
        rows = fake_script.list_fake(scenario, tb.gres_conf)
        emit(rows, output_format, title=f"fake GPUs ({scenario})")
        return
    if not target:
        raise click.UsageError("give NODE[/INDEX] and KEY=VALUE... (or --list)")
    changed = fake_script.set_fake(scenario, tb.gres_conf, target, settings)
    click.echo(f"testbed fake: {target}: {' '.join(settings)} "
               f"(Slurm index -> minor: "
               f"{', '.join(f'{i}->{m}' for i, m in sorted(changed.items()))})", err=True)
