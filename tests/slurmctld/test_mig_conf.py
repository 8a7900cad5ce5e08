"""Slurm 22.05 accepts the MIG lever's rendering: typed gres per MIG profile and gres.conf
``MultipleFiles=`` lines (parent GPU + MIG capability files).

slurmctld alone never opens gres.conf files, so this test also starts one slurmd, for the
MIG node: slurmd parses gres.conf, checks every ``MultipleFiles`` path (emulated character
devices, made the way the testbed makes them) and registers the node's gres; the node must
then come up IDLE (not INVAL) with every MIG type and count the site gives it.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_rendered_conf_accepted import (
    SBIN,
    Controller,
    Daemons,
    _free_ports,
    _make_device_files,
    _records,
    _start_munged,
    _tail,
    _wait,
    _which,
)

from hetslurm.process import run_command
from hetslurm.site import levers, load_site
from hetslurm.site.render import Runtime, render, write_rendered
from hetslurm.slurm import versions

pytestmark = pytest.mark.slurmctld

ROOT = Path(__file__).resolve().parents[2]
MIG_SITE = ROOT / "tests" / "data" / "levers" / "mig.toml"
MIG_NODE = "mig1"


@contextmanager
def _mig_cluster(remove: str | None = None) -> Iterator[tuple[Controller, int]]:
    """slurmctld + the MIG node's slurmd on the rendered MIG site; yields the controller and
    slurmd's exit status (0: it started). ``remove`` names an emulated device file to delete
    before slurmd starts."""
    ctld, slurmd = _which("slurmctld"), _which("slurmd")
    if ctld is None or slurmd is None:
        pytest.skip("slurmctld/slurmd are not installed (apt-get install slurmctld slurmd)")
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to validate gres.conf device files")
    site = load_site(MIG_SITE)
    folder = Path(tempfile.mkdtemp(prefix="hetslurm-mig-"))
    folder.chmod(0o711)
    daemons = Daemons()
    try:
        sock = _start_munged(folder, daemons)
        ctld_port, slurmd_port, *node_ports = _free_ports(2 + len(site.nodes))
        rt = Runtime(
            state_dir=str(folder), slurmctld_addr="127.0.0.1", slurmctld_port=ctld_port,
            slurmd_port=slurmd_port,
            node_ports={n.name: p for n, p in zip(site.nodes, node_ports, strict=True)},
            node_addr="127.0.0.1", device_dir=str(folder / "dev"), munge_socket=str(sock),
            emulate=True, slurm_user=pwd.getpwuid(os.geteuid()).pw_name,
            # 24.11+ slurmd exits without cgroup.conf saying CgroupPlugin=disabled here.
            cgroup_disabled=versions.installed()[0].needs_cgroup_disabled,
        )
        write_rendered(render(site, whole=True, runtime=rt), folder)
        for sub in ("ctld", "run", "log", "spool", f"spool/{MIG_NODE}"):
            (folder / sub).mkdir()
        _make_device_files(site, rt)
        if remove:
            (folder / "dev" / MIG_NODE / remove).unlink()
        conf = folder / "slurm.conf"
        env = {**os.environ, "SLURM_CONF": str(conf),
               "PATH": os.environ.get("PATH", "") + ":" + SBIN}
        log = folder / "log" / "slurmctld.log"
        run_command([ctld, "-f", str(conf)], timeout=60, env=env)
        daemons.record("slurmctld", folder / "run" / "slurmctld.pid", str(conf), log)

        def answers() -> bool:
            r = run_command(["scontrol", "ping"], timeout=10, env=env, check=False)
            return " is UP" in r.stdout

        if not _wait(answers, 30, step=0.5):
            pytest.fail(f"slurmctld did not answer on port {ctld_port}; log:\n{_tail(log)}")
        dlog = folder / "log" / f"slurmd-{MIG_NODE}.log"
        # slurmd waits ~20 s for a missing gres.conf file before it gives up: 22.05 before it
        # daemonizes, 24.11 after, so a slurmd expected to fail runs in the foreground (-D).
        fg = ["-D"] if remove else []
        res = run_command([slurmd, *fg, "-f", str(conf), "-N", MIG_NODE], timeout=90, env=env,
                          check=False)
        if res.returncode == 0:
            daemons.record("slurmd", folder / "run" / f"slurmd-{MIG_NODE}.pid", MIG_NODE, dlog)
        yield Controller(site, env, folder), res.returncode
    finally:
        problems = daemons.stop_all()
        if problems:
            pytest.fail("teardown: " + "; ".join(problems) + f" (left {folder} for a look)")
        shutil.rmtree(folder)


@pytest.fixture(scope="module")
def mig_cluster() -> Iterator[Controller]:
    with _mig_cluster() as (ctl, rc):
        assert rc == 0, _tail(ctl.folder / "log" / f"slurmd-{MIG_NODE}.log")
        yield ctl


def test_gres_conf_names_parent_gpu_and_mig_capability_files(mig_cluster: Controller) -> None:
    gres = (mig_cluster.folder / "gres.conf").read_text()
    lines = [ln for ln in gres.splitlines() if f"NodeName={MIG_NODE} " in ln]
    assert len(lines) == 8  # 2 GPUs x 4 slices
    first = lines[0].split()
    files = next(t for t in first if t.startswith("MultipleFiles=")).split("=", 1)[1]
    dev = mig_cluster.folder / "dev" / MIG_NODE
    assert files.split(",") == [str(dev / "nvidia0"), str(dev / "nvidia-cap3"),
                                str(dev / "nvidia-cap4")]
    assert not any(t.startswith("File=") for ln in lines for t in ln.split())


def test_slurmd_registers_the_mig_types(mig_cluster: Controller) -> None:
    site = mig_cluster.site
    node = site.node(MIG_NODE)
    want = dict(levers.node_mig_gres(site, node))
    assert want == {"a100_3g_20gb": 2, "a100_2g_10gb": 2, "a100_1g_5gb": 4}
    got: dict[str, str] = {}

    def registered() -> bool:
        nonlocal got
        got = _records(mig_cluster.scontrol("show", "node", "-o", MIG_NODE), "NodeName")[MIG_NODE]
        return got.get("State", "").startswith("IDLE")

    log = mig_cluster.folder / "log" / f"slurmd-{MIG_NODE}.log"
    assert _wait(registered, 60, step=1), f"node state {got.get('State')}; slurmd log:\n" \
        f"{_tail(log)}\nslurmctld log:\n{_tail(mig_cluster.folder / 'log' / 'slurmctld.log')}"
    # slurmd adds socket affinity "(S:0)" when it registers.
    gres = {m.group(1): int(m.group(2))
            for m in re.finditer(r"gpu:([a-z0-9_]+):(\d+)", got["Gres"])}
    assert gres == want, f"{got['Gres']}; slurmd log:\n{_tail(log)}"
    assert got["AvailableFeatures"].split(",") == ["gpu", "a100"]
    # The whole-GPU node beside it keeps its plain type.
    other = _records(mig_cluster.scontrol("show", "node", "-o", "gpu1"), "NodeName")["gpu1"]
    assert re.sub(r"\(S:[^)]*\)", "", other["Gres"]) == "gpu:h100:1"


def test_slurmd_checks_every_multiple_files_path() -> None:
    # A missing capability file of one slice: slurmd refuses to start, naming it. So the
    # records above were really read and every path stat()ed, not skipped.
    with _mig_cluster(remove="nvidia-cap22") as (ctl, rc):
        log = _tail(ctl.folder / "log" / f"slurmd-{MIG_NODE}.log")
        assert rc != 0, log
        assert re.search(r"fatal: can't stat gres.conf file \S*/nvidia-cap22", log), log
