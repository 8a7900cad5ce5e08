"""The testbed as a rollout target: ``hetslurm site diff|apply|rollback --testbed DIR``.

Its configuration is one whole slurm.conf in ``<dir>/etc`` rendered with the testbed's
runtime (ports, paths, emulated devices); a restart stops and starts exactly the
slurmctld and slurmd the testbed recorded.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from hetslurm.errors import RolloutError, TestbedError
from hetslurm.hook.install import InstalledHook
from hetslurm.levers.live import Target, ping
from hetslurm.site import Site, load_site
from hetslurm.testbed import procs
from hetslurm.testbed.cluster import DAEMON_WAIT_S, SLURMCTLD, Testbed


class TestbedDaemons:
    """Reconfigure or restart the testbed's own slurmctld and slurmd."""

    __test__ = False

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb

    def reconfigure(self) -> None:
        self.tb.slurm().reconfigure()

    def restart(self, nodes: Sequence[str]) -> None:
        tb = self.tb
        st = tb.existing_state()
        tb._stop_slurm(st)
        tb.spawn_ctld(st)
        deadline = time.monotonic() + DAEMON_WAIT_S
        while (why := ping(tb.env())) is not None:
            proc = tb.ctld_proc(st)
            procs.reap()
            if proc is None or not proc.alive():
                raise RolloutError(f"slurmctld exited at start ({why}); see "
                                   f"{tb.root}/log/slurmctld.log")
            if time.monotonic() > deadline:
                raise RolloutError(f"slurmctld does not answer after {DAEMON_WAIT_S:.0f}s: {why}")
            time.sleep(0.3)
        for name in nodes:
            tb.spawn_slurmd(st, name)


def rollout_target(tb: Testbed, site: Site) -> Target:
    """A rollout target for a running testbed, rendering ``site`` with its runtime."""
    st = tb.existing_state()
    if not tb.running(st).get(SLURMCTLD):
        raise TestbedError(f"the testbed in {tb.root} is not running; `hetslurm testbed up`")
    if st.cluster != site.name:
        raise TestbedError(f"{tb.root} runs cluster '{st.cluster}', the site is '{site.name}'")
    # New nodes get ports in a scratch copy here; prepare() records them for real.
    scratch = copy.deepcopy(st)
    tb._assign_node_ports(scratch, site)

    def prepare(new_site: Site) -> None:
        live = tb.existing_state()
        live.node_ports = dict(scratch.node_ports)  # the ports the files were rendered with
        live.site = new_site.path
        tb.save_state(live)
        for node in new_site.nodes:
            (tb.root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        tb._make_devices(new_site, live)

    return Target(conf_dir=tb.etc, daemons=TestbedDaemons(tb), whole=True,
                  runtime=tb.runtime(scratch), env=tb.env(),
                  backup_dir=tb.root / "levers-backups", prepare=prepare,
                  hook=InstalledHook(tb.etc))


def choose_target(site: Site | None, *, testbed_dir: str | Path | None,
                  live: Callable[[], Target]) -> tuple[Site | None, Target]:
    """The testbed-or-live choice of ``site diff|apply|rollback`` and ``rebalance``.

    With ``testbed_dir``, the testbed there (its whole slurm.conf and its own daemons; the site
    defaults to the one it runs); else ``live()``, a target on the folder of
    :func:`hetslurm.slurm.conf.slurm_conf_dir` built by the caller (systemd restarts for a
    rollout, read-only for drift).

    Raises:
        TestbedError: no testbed in ``testbed_dir``, or it is not running.
    """
    if testbed_dir is None:
        return site, live()
    tb = Testbed(testbed_dir)
    if site is None:
        site = load_site(tb.existing_state().site)
    return site, rollout_target(tb, site)
