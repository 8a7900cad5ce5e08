"""A real Slurm 22.05 slurmctld accepts the whole configuration hetslurm renders.

For each shipped site the test starts its own munged and slurmctld in a temporary folder, on
loopback with free ports, and compares what ``scontrol`` reports (nodes with typed gres,
features and weight; partitions; the switch tree) with the site model. No slurmd runs, so
nodes show as UNKNOWN or DOWN+NOT_RESPONDING; that is expected.

The daemons are stopped by the pids they recorded (SIGTERM, then SIGKILL); a daemon that
will not go away fails the test's teardown instead of being ignored.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import hostlist
import pytest

from hetslurm.process import run_command
from hetslurm.site import NodeSpec, Site, load_site
from hetslurm.site.render import Runtime, device_files, render, write_rendered
from hetslurm.slurm import versions

pytestmark = pytest.mark.slurmctld

ROOT = Path(__file__).resolve().parents[2]
SITES = [ROOT / "site-configs" / "demo.toml", ROOT / "site-configs" / "case-study.toml"]
SBIN = "/usr/sbin:/usr/bin:/sbin:/bin"


def _which(name: str) -> str | None:
    # Daemons live in /usr/sbin, which is not on every user's PATH.
    return shutil.which(name) or shutil.which(name, path=SBIN)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    with ExitStack() as stack:
        ports = []
        for _ in range(count):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"  # a zombie has exited; its parent just has not reaped it yet


def _wait(predicate: Callable[[], object], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


@dataclass
class Daemons:
    """Daemons this test started, by recorded pid, and how to stop exactly them."""

    started: list[tuple[str, int]] = field(default_factory=list)

    def record(self, name: str, pid_file: Path, cmdline_mark: str, log: Path) -> int:
        if not _wait(lambda: pid_file.is_file() and pid_file.read_text().strip(), 15):
            pytest.fail(f"{name} wrote no pid file {pid_file}; log:\n{_tail(log)}")
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        # Never signal a pid we did not start (a recycled pid would show another cmdline).
        assert cmdline_mark in cmdline, f"pid {pid} from {pid_file} is not ours: {cmdline!r}"
        self.started.append((name, pid))
        return pid

    def stop_all(self) -> list[str]:
        """Stop in reverse start order; return what could not be stopped."""
        problems = []
        for name, pid in reversed(self.started):
            if not _alive(pid):
                continue

            def gone(p: int = pid) -> bool:
                return not _alive(p)

            try:
                os.kill(pid, signal.SIGTERM)
                if not _wait(gone, 15):
                    os.kill(pid, signal.SIGKILL)
                    if not _wait(gone, 5):
                        problems.append(f"{name} (pid {pid}) survived SIGKILL")
                    else:
                        problems.append(f"{name} (pid {pid}) ignored SIGTERM; killed")
            except ProcessLookupError:
                pass  # it exited between the check and the signal
            except OSError as exc:
                problems.append(f"{name} (pid {pid}): {exc}")
        self.started.clear()
        return problems


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({path} unreadable: {exc})"


@dataclass(frozen=True)
class Controller:
    site: Site
    env: dict[str, str]
    folder: Path

    def scontrol(self, *args: str) -> str:
        return run_command(["scontrol", *args], timeout=30, env=self.env).stdout


def _start_munged(folder: Path, daemons: Daemons) -> Path:
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))  # what `dd if=/dev/urandom bs=1 count=1024` makes
    key.chmod(0o400)
    sock = folder / "munge.sock"
    log = folder / "munged.log"
    run_command([_which("munged") or "munged", f"--socket={sock}", f"--key-file={key}",
                 f"--pid-file={folder / 'munged.pid'}", f"--log-file={log}",
                 f"--seed-file={folder / 'munged.seed'}"], timeout=30)
    daemons.record("munged", folder / "munged.pid", str(sock), log)
    return sock


def _make_device_files(site: Site, rt: Runtime) -> None:
    for f in device_files(site, rt):
        path = Path(f.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        assert f.major is not None and f.minor is not None
        try:
            os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(f.major, f.minor))
        except PermissionError:
            # Without CAP_MKNOD; slurmctld never stats gres files, only slurmd does.
            path.touch(0o600)


@pytest.fixture(params=SITES, ids=[p.stem for p in SITES])
def controller(request: pytest.FixtureRequest) -> Iterator[Controller]:
    ctld = _which("slurmctld")
    if ctld is None:
        pytest.skip("slurmctld is not installed (apt-get install slurmctld munge)")
    for tool in ("munged", "scontrol"):
        if _which(tool) is None:
            pytest.fail(f"slurmctld is installed but {tool} is not")
    site = load_site(request.param)
    # munged refuses a socket folder others cannot traverse, and pytest's tmp_path sits in
    # a 0700 folder; so a folder of our own under the system temp dir, mode 0711.
    folder = Path(tempfile.mkdtemp(prefix="hetslurm-ctld-"))
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
            emulate=True,
            # root in CI; whoever runs the test otherwise, so slurmctld need not setuid.
            slurm_user=pwd.getpwuid(os.geteuid()).pw_name,
            cgroup_disabled=versions.installed()[0].needs_cgroup_disabled,
        )
        write_rendered(render(site, whole=True, runtime=rt), folder)
        for sub in ("ctld", "run", "log", "spool"):
            (folder / sub).mkdir()
        _make_device_files(site, rt)
        conf = folder / "slurm.conf"
        env = {**os.environ, "SLURM_CONF": str(conf),
               "PATH": os.environ.get("PATH", "") + ":" + SBIN}
        log = folder / "log" / "slurmctld.log"
        run_command([ctld, "-f", str(conf)], timeout=60, env=env)
        daemons.record("slurmctld", folder / "run" / "slurmctld.pid", str(conf), log)
        c = Controller(site, env, folder)

        def answers() -> bool:
            r = run_command(["scontrol", "ping"], timeout=10, env=env, check=False)
            return " is UP" in r.stdout

        if not _wait(answers, 30, step=0.5):
            pytest.fail(f"slurmctld did not answer on port {ctld_port}; log:\n{_tail(log)}")
        yield c
    finally:
        problems = daemons.stop_all()
        if problems:
            pytest.fail("teardown: " + "; ".join(problems) + f" (left {folder} for a look)")
        shutil.rmtree(folder)


def _records(text: str, key: str) -> dict[str, dict[str, str]]:
    """``scontrol show ... -o`` lines as {name: {Key: value}} (values without blanks)."""
    out = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z_]+)=(\S*)", line))
        if key in fields:
            out[fields[key]] = fields
    return out


def _expected_gres(node: NodeSpec) -> str:
    parts = [f"{kind}:{devs[0].model}:{len(devs)}"
             for kind, devs in (("gpu", node.gpus), ("fpga", node.fpgas)) if devs]
    return ",".join(parts) or "(null)"


def test_nodes_carry_typed_gres_features_and_weight(controller: Controller) -> None:
    site = controller.site
    nodes = _records(controller.scontrol("show", "node", "-o"), "NodeName")
    assert set(nodes) == {n.name for n in site.nodes}
    for n in site.nodes:
        got = nodes[n.name]
        # slurmd adds socket affinity "(S:0-1)" once it registers; none runs here.
        assert re.sub(r"\(S:[^)]*\)", "", got["Gres"]) == _expected_gres(n), n.name
        assert got["AvailableFeatures"].split(",") == list(n.features), n.name
        assert int(got["Weight"]) == n.weight, n.name
        assert int(got["CPUTot"]) == n.cpus, n.name
        assert int(got["Sockets"]) == n.spec.sockets, n.name
        assert int(got["CoresPerSocket"]) == n.spec.cores_per_socket, n.name
        assert int(got["RealMemory"]) == n.spec.memory, n.name
        assert got["NodeAddr"] == "127.0.0.1"


def test_partitions_match_the_site(controller: Controller) -> None:
    site = controller.site
    parts = _records(controller.scontrol("show", "partition", "-o"), "PartitionName")
    assert set(parts) == set(site.partitions) | set(site.ranked)
    # Ranked fallback's per-model partitions: the base's nodes of one model, its every word.
    for name, ranked in site.ranked.items():
        got, base = parts[name], parts[ranked.base]
        assert set(hostlist.expand_hostlist(got["Nodes"])) == set(ranked.nodes), name
        assert got["Default"] == "NO"
        # (TRES, TotalCPUs and TotalNodes count the nodes, which differ by design.)
        same = {k for k in base if k not in ("PartitionName", "Nodes", "Default", "TotalCPUs",
                                              "TotalNodes", "TRES")}
        assert {k: got[k] for k in same} == {k: base[k] for k in same}, name
    for name, part in site.partitions.items():
        got = parts[name]
        # Slurm expands Nodes=ALL itself; the site resolved it to every node as well.
        assert set(hostlist.expand_hostlist(got["Nodes"])) == set(part.nodes), name
        assert got["Default"] == ("YES" if part.spec.default else "NO"), name
        assert got["State"] == "UP"
        for key, value in part.spec.options.items():
            assert got[key] == value, (name, key)


def test_switch_tree_matches_the_site(controller: Controller) -> None:
    site = controller.site
    switches = _records(controller.scontrol("show", "topology"), "SwitchName")
    assert set(switches) == set(site.switches)
    for name, sw in site.switches.items():
        got = switches[name]
        if sw.nodes is not None:
            assert got["Level"] == "0"
            members = {n.name for n in site.nodes if n.leaf_switch == name}
            assert set(hostlist.expand_hostlist(got["Nodes"])) == members, name
        else:
            assert set(got["Switches"].split(",")) == set(sw.switches), name
            assert int(got["Level"]) > 0


def test_global_keys_are_in_effect(controller: Controller) -> None:
    config = controller.scontrol("show", "config")
    assert re.search(r"^GresTypes\s+= gpu,fpga$", config, re.M)
    assert re.search(r"^SelectType\s+= select/cons_tres$", config, re.M)
    if controller.site.switches:
        assert re.search(r"^TopologyPlugin\s+= topology/tree$", config, re.M)
    mem = controller.site.scheduling.def_mem_per_cpu
    if mem:
        assert re.search(rf"^DefMemPerCPU\s+= {mem}$", config, re.M)
