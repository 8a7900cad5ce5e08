"""The local test cluster: a real heterogeneous Slurm 22.05 with accounting, on loopback.

One state folder holds everything: the rendered configuration (``etc/``), the project's own
munge daemon and key, a MariaDB data directory, Slurm's spool and state, emulated device
files and ``testbed.json`` (ports, pids, digest). The daemons:

    munged -> mariadbd -> slurmdbd -> (sacctmgr: cluster, account, user, QOS)
           -> slurmctld -> one slurmd per site node (NodeAddr=127.0.0.1, own Port)

Facts this rests on are in SLURM-TESTBED.md (shared with the project) and docs/testbed.md.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shlex
import socket
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetslurm import fsguard
from hetslurm.errors import BackendError, CommandError, PlacementError, TestbedError
from hetslurm.levers.rollout import classify
from hetslurm.process import run_command
from hetslurm.site import Site, load_site
from hetslurm.site.examples import example
from hetslurm.site.find import ETC_ENV
from hetslurm.site.render import Runtime, device_files, render, write_rendered
from hetslurm.slurm import versions
from hetslurm.slurm.cli_backend import CliBackend
from hetslurm.slurm.rest_backend import JWT_ENV, REST_URL_ENV
from hetslurm.testbed import packages, procs, roots
from hetslurm.testbed.procs import Proc

Log = Callable[[str], None]

ACCOUNT = "hetslurm"
#: QOS per priority level (``#HET priority=``); 'normal' exists in every slurmdbd.
QOS_LEVELS = {"high": 1000, "normal": 0, "low": 0}
NODE_WAIT_S = 120.0
DAEMON_WAIT_S = 60.0
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; leave room for suffixes

# The Slurm daemons the testbed starts, stops and records by name: its daemon start-up is
# the one place outside hetslurm/slurm/ that names Slurm programs (everything it asks a
# running Slurm goes through the access layer; tests/unit/test_slurm_binaries.py).
SLURMCTLD = "slurmctld"
SLURMD = "slurmd"
SLURMDBD = "slurmdbd"
#: The REST daemon: JWT only, run as an unprivileged user (docs/slurm-access.md, "REST").
SLURMRESTD = "slurmrestd"
REST_USER, REST_GROUP = "nobody", "nogroup"
#: How long the tokens ``rest_env`` asks ``scontrol token`` for last, seconds.
REST_TOKEN_LIFESPAN_S = 24 * 3600
#: Forked by slurmctld (and slurmstepd by slurmd); ours when they carry the testbed's mark.
SLURMSCRIPTD = "slurmscriptd"
#: Forked by slurmd for each job step (the benchmarks count its CPU time).
SLURMSTEPD = "slurmstepd"


DIR_ENV = "HETSLURM_TESTBED_DIR"
SHARE_ENV = "HETSLURM_TESTBED_SHARE"
#: In a root: the state folder of the testbed that runs it (one testbed per root).
ROOT_OWNER = "HETSLURM-TESTBED"
#: Where the host's own Slurm programs are looked up (never a testbed's wrappers).
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def default_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$HETSLURM_TESTBED_DIR``, else ``./.testbed``."""
    env = os.environ if env is None else env
    return Path(env.get(DIR_ENV) or Path.cwd() / ".testbed").absolute()


def default_site() -> Path:
    """The site a testbed boots when the site rule finds none: the shipped demo site."""
    return example("demo.toml")


def running_site(env: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
    """The fourth place of the site rule (:mod:`hetslurm.site.find`): the site the testbed in
    ``$HETSLURM_TESTBED_DIR`` (else ``./.testbed``) was brought up with, when its slurmctld
    runs. Returns where it looked (for the error that names every place) and the file."""
    env = os.environ if env is None else env
    root = default_dir(env)
    where = f"no running testbed in {root} (${DIR_ENV}{'' if env.get(DIR_ENV) else ' unset'})"
    try:
        tb = Testbed(root)
    except TestbedError:  # a path too long for the testbed's sockets holds no testbed
        return where, None
    return where, tb.running_site()


@dataclass
class State:
    """What ``testbed.json`` records between commands."""

    site: str
    cluster: str
    ports: dict[str, int]
    node_ports: dict[str, int]
    db_password: str
    procs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The Slurm release it runs ("" in a state written before releases: the host's).
    slurm: str = ""
    #: What ``up`` mounted for a root (its proc, sys, ... and the shared folders), for ``down``.
    mounts: list[str] = field(default_factory=list)

    def proc(self, name: str) -> Proc | None:
        d = self.procs.get(name)
        return Proc(**d) if d else None


@dataclass(frozen=True)
class UpResult:
    action: str  # started | already-up | reconfigured | restarted
    seconds: float
    nodes: int
    detail: str = ""


class Testbed:
    """The testbed in one state folder."""

    __test__ = False  # not a pytest class

    def __init__(self, root: Path | str | None = None, log: Log | None = None,
                 ctld_env: Mapping[str, str] | None = None, slurm: str | None = None) -> None:
        self.root = Path(root).absolute() if root else default_dir()
        #: The release asked for (``up --slurm``); None: the one it runs, else the host's.
        self.wanted: str | None = versions.release(slurm).name if slurm else None
        self.log: Log = log or (lambda _msg: None)
        # Added to slurmctld's environment only when this object starts it (the hook
        # benchmark's Lua timer); the other daemons never get it.
        self.ctld_env: dict[str, str] = dict(ctld_env or {})
        sock = self.root / "munge" / "munge.sock"
        if len(str(sock)) > SOCKET_PATH_MAX:
            raise TestbedError(f"state folder path too long for unix sockets: {self.root} "
                               "(use --dir with a shorter path)")

    # ---- paths -------------------------------------------------------------------------
    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def state_file(self) -> Path:
        return self.root / "testbed.json"

    @property
    def gres_conf(self) -> Path:
        return self.etc / "gres.conf"

    @property
    def fake_scenario(self) -> Path:
        """The fake NVML scenario ``hetslurm testbed fake`` edits and a collector run with
        ``--nvml fake --fake-scenario`` on it follows; removed by :meth:`down`."""
        return self.root / "fake-nvml.json"

    @property
    def bindir(self) -> Path:
        """Where the wrappers of a root's Slurm programs live (first on ``PATH``)."""
        return self.root / "bin"

    @property
    def jwt_key(self) -> Path:
        """The HS256 key slurmctld and slurmdbd check slurmrestd's tokens with (mode 600)."""
        return self.etc / "jwt_hs256.key"

    @property
    def munge_sock(self) -> Path:
        return self.root / "munge" / "munge.sock"

    @property
    def db_sock(self) -> Path:
        return self.root / "mysql" / "mysql.sock"

    def env(self) -> dict[str, str]:
        """Environment for commands aimed at this cluster: Slurm's (``SLURM_CONF``) and
        hetslurm's own (the config root and this testbed), so nothing reads the host's /etc."""
        return dict(os.environ, **self.env_vars())

    def env_vars(self) -> dict[str, str]:
        """``SLURM_CONF``, ``HETSLURM_ETC`` (this testbed's etc/, its config root) and
        ``HETSLURM_TESTBED_DIR`` (so the site rule finds this testbed's site)."""
        out = {"SLURM_CONF": str(self.conf), ETC_ENV: str(self.etc), DIR_ENV: str(self.root)}
        st = self.load_state()
        if st is not None and SLURMRESTD in st.ports:
            out[REST_URL_ENV] = self.rest_url(st)
        if self.in_root:
            rest = [p for p in os.environ.get("PATH", "").split(os.pathsep)
                    if p and p != str(self.bindir)]
            out["PATH"] = os.pathsep.join([str(self.bindir), *rest])
        return out

    def rest_url(self, st: State) -> str:
        return f"http://127.0.0.1:{st.ports[SLURMRESTD]}"

    def rest_env(self, lifespan_s: int = REST_TOKEN_LIFESPAN_S) -> dict[str, str]:
        """``HETSLURM_REST_URL`` and a fresh ``SLURM_JWT`` for root (``scontrol token``).

        Raises:
            TestbedError: the testbed runs no slurmrestd.
            CommandError: scontrol could not make a token.
        """
        st = self.existing_state()
        if SLURMRESTD not in st.ports or not self.running(st).get(SLURMRESTD):
            raise TestbedError(f"the testbed in {self.root} runs no slurmrestd")
        return {REST_URL_ENV: self.rest_url(st),
                JWT_ENV: self.slurm().token(lifespan_s=lifespan_s)}

    def slurm(self) -> CliBackend:
        """The access layer aimed at this cluster (its SLURM_CONF)."""
        return CliBackend(self.env())

    def env_line(self) -> str:
        """The ``export`` lines for ``eval "$(hetslurm testbed env)"``; on a root, ``PATH``
        gets the wrappers of the root's Slurm programs in front of the shell's own."""
        lines = []
        for k, v in self.env_vars().items():
            if k == "PATH":
                lines.append(f'export PATH={shlex.quote(str(self.bindir))}:"$PATH"')
            else:
                lines.append(f"export {k}={shlex.quote(v)}")
        return "\n".join(lines)

    def running_site(self) -> Path | None:
        """The site file this testbed was brought up with, when its slurmctld runs.

        Running as root, a state file others could have written is not believed: it would
        choose the site a root command (``rebalance``, ``act``) reads.
        """
        try:
            st_file = os.lstat(self.state_file)
        except OSError:
            return None
        if os.geteuid() == 0 and fsguard.problem(st_file, (0,)) is not None:
            return None
        st = self.load_state()
        if st is None or not self.running(st).get(SLURMCTLD):
            return None
        return Path(st.site)

    # ---- state -------------------------------------------------------------------------
    def load_state(self) -> State | None:
        if not self.state_file.exists():
            return None
        try:
            return State(**json.loads(self.state_file.read_text()))
        except (ValueError, TypeError) as exc:
            raise TestbedError(f"{self.state_file} is damaged ({exc}); remove the folder "
                               "after checking nothing of it runs") from exc

    def save_state(self, st: State) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(st.__dict__, indent=2, sort_keys=True))
        tmp.replace(self.state_file)

    def runtime(self, st: State) -> Runtime:
        return Runtime(
            state_dir=str(self.root),
            slurmctld_host="localhost",
            slurmctld_addr="127.0.0.1",
            slurmctld_port=st.ports[SLURMCTLD],
            slurmd_port=st.ports[SLURMD],
            node_ports=st.node_ports,
            node_addr="127.0.0.1",
            slurmdbd_host="127.0.0.1",
            slurmdbd_port=st.ports[SLURMDBD],
            munge_socket=str(self.munge_sock),
            device_dir=str(self.root / "dev"),
            slurm_user="root",
            emulate=True,
            # `up` installs hetslurm's hook (install_hook) before it renders slurm.conf.
            job_submit_lua=(self.etc / "job_submit.lua").exists(),
            cgroup_disabled=versions.release(self.slurm_release).needs_cgroup_disabled,
            jwt_key=str(self.jwt_key),
        )

    def running(self, st: State | None = None) -> dict[str, bool]:
        st = st or self.load_state()
        if st is None:
            return {}
        out = {}
        for name in st.procs:
            p = st.proc(name)
            out[name] = bool(p and p.alive())
        return out

    # ---- up ----------------------------------------------------------------------------
    def up(self, site_path: Path | str | None = None) -> UpResult:
        """Install what is missing, start every daemon, wait until every node is idle.

        Idempotent: on a running testbed it compares the newly rendered configuration with
        the one in use and does nothing, ``scontrol reconfigure`` (partitions only) or a
        restart of slurmctld and the slurmd (nodes, gres, topology, global keys changed).
        """
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise TestbedError("the testbed runs its daemons as root; run as root")
        site_file = Path(site_path) if site_path else (self.running_site() or default_site())
        site = load_site(site_file)
        st = self.load_state()
        if st is not None and self.running(st).get(SLURMCTLD):
            runs = st.slurm or self.host_release
            if runs != self.slurm_release:
                raise TestbedError(
                    f"the testbed in {self.root} runs Slurm {runs}; one release at a time: "
                    f"`hetslurm testbed down` first, or use another --dir for {self.slurm_release}")
        # Before any package or daemon: the testbed is Slurm *with* the hook, never without.
        self.check_hook(site)
        installed = packages.ensure_packages(self.log)
        if installed:
            self.log(f"installed: {' '.join(installed)}")
        packages.check_binaries()
        if self.in_root:
            st = self._prepare_root(st, site)
        if st is not None and st.cluster != site.name:
            raise TestbedError(
                f"{self.root} holds cluster '{st.cluster}', the site is '{site.name}': bring it "
                "down and use another --dir")
        if st is not None and self.running(st).get(SLURMCTLD):
            return self._update_running(site, str(site_file.absolute()), st, t0)
        if st is None:
            st = self._new_state(site, str(site_file.absolute()))
        else:
            st.site = str(site_file.absolute())
            self._assign_node_ports(st, site)
        if st.slurm != self.slurm_release:
            st.slurm = self.slurm_release
            self.save_state(st)
        self._start_all(site, st)
        nodes = self.wait_nodes_idle(site)
        return UpResult("started", time.monotonic() - t0, nodes)

    def _new_state(self, site: Site, site_file: str) -> State:
        names = [SLURMCTLD, SLURMD, SLURMDBD, "mariadb", SLURMRESTD]
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        st = State(site=site_file, cluster=site.name, ports=ports, node_ports={},
                   db_password=secrets.token_hex(16), slurm=self.slurm_release)
        self._assign_node_ports(st, site)
        self.root.mkdir(parents=True, exist_ok=True)
        self.save_state(st)
        return st

    def _assign_node_ports(self, st: State, site: Site) -> None:
        if SLURMRESTD not in st.ports:  # a state written before slurmrestd joined
            taken = set(st.ports.values()) | set(st.node_ports.values())
            st.ports[SLURMRESTD] = free_ports(1, exclude=taken)[0]
        wanted = [n.name for n in site.nodes]
        st.node_ports = {k: v for k, v in st.node_ports.items() if k in wanted}
        new = [n for n in wanted if n not in st.node_ports]
        taken = set(st.ports.values()) | set(st.node_ports.values())
        for name, port in zip(new, free_ports(len(new), exclude=taken), strict=True):
            st.node_ports[name] = port

    def _write_config(self, site: Site, st: State) -> dict[str, str]:
        for d in ("etc", "ctld", "run", "log", "dev"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.install_hook(site)
        files = render(site, whole=True, runtime=self.runtime(st))
        for node in site.nodes:
            (self.root / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        if not self.jwt_key.exists():
            # slurm.conf(5) AuthAltParameters: owned by SlurmUser or root, not readable by
            # others; 32 random bytes as Slurm's jwt.html does.
            fd = os.open(self.jwt_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(32))
        write_rendered(files, self.etc)
        dbd = self.etc / "slurmdbd.conf"
        dbd_text = "\n".join([
            "# slurmdbd.conf for the hetslurm testbed (mode 600: it holds the DB password)",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_sock}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={st.ports[SLURMDBD]}",
            "SlurmUser=root",
            f"PidFile={self.root}/run/slurmdbd.pid",
            f"LogFile={self.root}/log/slurmdbd.log",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={st.ports['mariadb']}",
            "StorageUser=slurm",
            f"StoragePass={st.db_password}",
            "StorageLoc=slurm_acct_db",
            "AuthAltTypes=auth/jwt",
            f"AuthAltParameters=jwt_key={self.jwt_key}",
            "",
        ])
        fd = os.open(dbd, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(dbd_text)
        os.chmod(dbd, 0o600)  # slurmdbd refuses a config others can read
        self._make_devices(site, st)
        return files

    @functools.cached_property
    def host_release(self) -> str:
        """The release of the host's own Slurm (its system programs, never a testbed's
        wrappers); where none is installed yet, the one the host's Debian ships."""
        try:
            return versions.installed(path=SYSTEM_PATH)[0].name
        except BackendError:
            return debian_release()

    @functools.cached_property
    def slurm_release(self) -> str:
        """The release this testbed runs: the one asked for, else the one it was brought up
        with, else the host's."""
        if self.wanted:
            return self.wanted
        try:
            st = self.load_state()
        except TestbedError:
            st = None
        return st.slurm if st is not None and st.slurm else self.host_release

    def slurm_version(self) -> str | None:
        """The full version of the Slurm it runs (``"24.11.5"``), None when unknown (a root
        not built yet, no Slurm installed)."""
        if self.in_root:
            ready = roots.ready_root(self.slurm_release)
            return ready.slurm_version if ready else None
        try:
            return versions.installed(path=SYSTEM_PATH)[1]
        except BackendError:
            return None

    @property
    def in_root(self) -> bool:
        """Whether its Slurm runs inside a cached Debian root (a release the host lacks)."""
        return self.slurm_release != self.host_release

    @functools.cached_property
    def slurm_root(self) -> roots.Root | None:
        """The ready root of its release (built now when missing), or None when the host's
        own Slurm runs it."""
        if not self.in_root:
            return None
        return roots.build_root(self.slurm_release, log=self.log)

    def shared_folders(self) -> list[Path]:
        """Host folders a root must see at the same path: the state folder (configuration,
        sockets, device files), /tmp and /home (job scripts and output), the folder ``up``
        ran in (a job's default working folder) and ``$HETSLURM_TESTBED_SHARE`` (``:``-
        separated)."""
        extra = [Path(p) for p in os.environ.get(SHARE_ENV, "").split(os.pathsep) if p]
        return [self.root, Path("/tmp"), Path("/home"), Path.cwd(), *extra]  # noqa: S108

    def _prepare_root(self, st: State | None, site: Site) -> State:
        """The root's Slurm made ready to run: root built, wrappers written, its system
        folders and the shared folders mounted (recorded in the state for ``down``)."""
        root = self.slurm_root
        assert root is not None
        owner_file = root.path / ROOT_OWNER
        owner = owner_file.read_text().strip() if owner_file.is_file() else ""
        if owner and owner != str(self.root):
            try:
                other = Testbed(owner)
                busy = bool(other.running().get(SLURMCTLD))
            except TestbedError:
                busy = False
            if busy:
                raise TestbedError(
                    f"the Slurm {self.slurm_release} root {root.path} is in use by the testbed "
                    f"in {owner}; one testbed per root: bring that one down first")
        owner_file.write_text(f"{self.root}\n")
        if st is None:
            st = self._new_state(site, str(Path(site.path).absolute()))
        roots.write_wrappers(root.path, self.bindir, self.slurm_release)
        st.mounts = [m for m in st.mounts if roots.is_mounted(m)]
        st.mounts += roots.mount_system(root.path)
        self.save_state(st)
        st.mounts += roots.bind_shared(root.path, self.shared_folders())
        self.save_state(st)
        self.log(f"Slurm {root.slurm_version} runs from {root.path}")
        return st

    def check_hook(self, site: Site) -> None:
        """Render the site's hook and check it in Lua 5.1 as ``hook install`` does.

        Raises:
            TestbedError: it cannot be rendered or checked (lupa missing) or fails its checks.
        """
        from hetslurm.hook.install import validate_text
        from hetslurm.hook.render import render_hook

        try:
            res = validate_text(render_hook(site, slurm=self.slurm_release).text, site)
        except PlacementError as exc:
            raise TestbedError(f"the job_submit hook cannot be checked ({exc}); the testbed "
                               "does not boot without it") from exc
        if not res.ok:
            raise TestbedError(f"the rendered job_submit hook {res.error}; the testbed does "
                               "not boot without it")

    def install_hook(self, site: Site) -> None:
        """Render the site's job_submit hook into etc/ (validated first; see docs/hook.md).

        Raises:
            TestbedError: the hook cannot be rendered or checked (lupa missing): the testbed
                is the real system with the hook, so it refuses to boot without it.
        """
        from hetslurm.hook.install import install_hook

        try:
            res = install_hook(site, self.etc, slurm=self.slurm_release)
        except PlacementError as exc:
            raise TestbedError(f"the job_submit hook cannot be installed ({exc}); the testbed "
                               "does not boot without it") from exc
        if res.changed:
            self.log(f"installed job_submit.lua (build {res.build}, mode {res.mode})")

    def _make_devices(self, site: Site, st: State) -> None:
        # gres.conf File= must name character devices (a plain file makes the node INVAL);
        # minors differ from indices so index->device mapping bugs show up.
        for f in device_files(site, self.runtime(st)):
            path = Path(f.path)
            path.parent.mkdir(parents=True, exist_ok=True)
            assert f.major is not None and f.minor is not None
            dev = os.makedev(f.major, f.minor)
            if path.exists():
                s = path.stat()
                if stat.S_ISCHR(s.st_mode) and s.st_rdev == dev:
                    continue
                path.unlink()
            os.mknod(path, 0o660 | stat.S_IFCHR, dev)

    def _start(self, st: State, name: str, argv: list[str], log_name: str,
               extra_env: Mapping[str, str] | None = None) -> None:
        p = st.proc(name)
        if p and p.alive():
            return
        env = self.env()
        env.update(extra_env or {})
        proc = procs.start_daemon(name, argv, self.root / "log" / log_name, env,
                                  mark=str(self.root))
        st.procs[name] = proc.to_dict()
        self.save_state(st)

    def _start_all(self, site: Site, st: State) -> None:
        self.log(f"rendering configuration into {self.etc}")
        self._write_config(site, st)
        self._start_munge(st)
        self._start_db(st)
        self._start_dbd(st)
        self._register(site)
        self._start_ctld(st)
        self._start_slurmds(site, st)
        self._start_rest(st)

    def _start_rest(self, st: State) -> None:
        """slurmrestd on loopback, JWT only (``rest_auth/jwt``): it refuses to run as root or
        SlurmUser, so it drops to nobody:nogroup (``-u``/``-g``); ``SLURM_JWT=daemon`` makes it
        pass each client's token on to slurmctld."""
        self.log("starting slurmrestd")
        # It runs as nobody and reads slurm.conf and the files beside it: a state folder made
        # by mkdtemp (mode 700, the benchmarks' own testbeds) would hide them. Nothing secret
        # is readable there (munge key 400, slurmdbd.conf and the JWT key 600).
        for d in (self.root, self.etc):
            mode = d.stat().st_mode
            if mode & 0o005 != 0o005:
                d.chmod(stat.S_IMODE(mode) | 0o005)
        uid, gid = self._rest_ids()
        self._start(st, SLURMRESTD, [
            SLURMRESTD, "-a", "rest_auth/jwt", "-u", uid, "-g", gid,
            f"127.0.0.1:{st.ports[SLURMRESTD]}",
        ], "slurmrestd.out", {"SLURM_JWT": "daemon"})
        wait_for(lambda: _port_open(st.ports[SLURMRESTD]), DAEMON_WAIT_S, SLURMRESTD,
                 self.root / "log" / "slurmrestd.out")

    def _rest_ids(self) -> tuple[str, str]:
        """nobody's uid and nogroup's gid as numbers, from the passwd/group files of the
        system slurmrestd runs on: 26.05's slurmrestd did not resolve ``-u nobody`` in its
        root though getent did (tried); numbers work on every release."""
        etc = (self.slurm_root.path if self.slurm_root else Path("/")) / "etc"
        ids = []
        for file, name in (("passwd", REST_USER), ("group", REST_GROUP)):
            try:
                lines = (etc / file).read_text().splitlines()
            except OSError as exc:
                raise TestbedError(f"cannot read {etc / file}: {exc}") from exc
            found = [ln.split(":")[2] for ln in lines if ln.split(":")[0] == name
                     and len(ln.split(":")) > 2]
            if not found or not found[0].isdigit():
                raise TestbedError(f"no {name} in {etc / file}: slurmrestd needs an "
                                   "unprivileged user to run as")
            ids.append(found[0])
        return ids[0], ids[1]

    def _start_munge(self, st: State) -> None:
        mdir = self.root / "munge"
        mdir.mkdir(parents=True, exist_ok=True)
        os.chmod(mdir, 0o755)  # noqa: S103 - munged refuses a socket dir writable by others
        key = mdir / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(1024))
        self.log("starting munged")
        self._start(st, "munged", [
            "munged", "--foreground", "--force", f"--socket={self.munge_sock}",
            f"--key-file={key}", f"--pid-file={mdir}/munged.pid",
            f"--log-file={self.root}/log/munged.log", f"--seed-file={mdir}/munged.seed",
        ], "munged.out")
        wait_for(lambda: self.munge_sock.exists(), DAEMON_WAIT_S, "munged socket",
                 self.root / "log" / "munged.log")

    def _mysql(self, sql: str) -> None:
        run_command(["mariadb", f"--socket={self.db_sock}", "-u", "root", "-e", sql],
                    timeout=60)

    def _start_db(self, st: State) -> None:
        data = self.root / "mysql" / "data"
        fresh = not (data / "mysql").exists()
        if fresh:
            self.log("initialising MariaDB")
            data.mkdir(parents=True, exist_ok=True)
            run_command(["mariadb-install-db", "--user=root", f"--datadir={data}",
                         "--auth-root-authentication-method=socket", "--skip-test-db"],
                        timeout=300)
        self.log("starting mariadbd")
        self._start(st, "mariadbd", [
            "mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
            f"--socket={self.db_sock}", f"--port={st.ports['mariadb']}",
            "--bind-address=127.0.0.1", f"--pid-file={self.root}/mysql/mariadbd.pid",
            f"--log-error={self.root}/log/mariadbd.log",
            # slurmdbd's documented recommendations for InnoDB.
            "--innodb-buffer-pool-size=256M", "--innodb-lock-wait-timeout=900",
        ], "mariadbd.out")
        wait_for(lambda: self._db_ready(), DAEMON_WAIT_S, "MariaDB",
                 self.root / "log" / "mariadbd.log")
        pw = st.db_password
        self._mysql(
            "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;")

    def _db_ready(self) -> bool:
        if not self.db_sock.exists():
            return False
        res = run_command(["mariadb", f"--socket={self.db_sock}", "-u", "root", "-e",
                           "SELECT 1"], timeout=20, check=False)
        return res.returncode == 0

    def _start_dbd(self, st: State) -> None:
        self.log("starting slurmdbd")
        self._start(st, SLURMDBD, [SLURMDBD, "-D"], "slurmdbd.out")
        wait_for(lambda: self._sacctmgr_ok(), DAEMON_WAIT_S, SLURMDBD,
                 self.root / "log" / "slurmdbd.log")

    def _sacctmgr_ok(self) -> bool:
        try:
            CliBackend(self.env(), timeout=20).clusters()
        except CommandError:
            return False
        return True

    def _register(self, site: Site) -> None:
        """Cluster, account, user and QOS records; each step skips what exists."""
        self.log("registering cluster, account, users and QOS in slurmdbd")
        slurm = self.slurm()
        try:
            if site.name not in slurm.clusters():
                slurm.add_cluster(site.name, exist_ok=True)
            have_qos = {q.name for q in slurm.qos()}
            for qos, prio in QOS_LEVELS.items():
                if qos not in have_qos:
                    slurm.add_qos(qos, {"Priority": str(prio)}, exist_ok=True)
            if ACCOUNT not in slurm.accounts():
                slurm.add_account(ACCOUNT, site.name, description="hetslurm testbed",
                                  organization="hetslurm", exist_ok=True)
            if "root" not in {a.user for a in slurm.associations(site.name)}:
                slurm.add_user("root", ACCOUNT, site.name, exist_ok=True)
            slurm.set_user_qos("root", list(QOS_LEVELS), "normal")
        except CommandError as exc:
            raise TestbedError(f"registering in slurmdbd failed: {exc}") from exc

    def _start_ctld(self, st: State) -> None:
        self.log("starting slurmctld")
        self.spawn_ctld(st, self.ctld_env)
        wait_for(lambda: self._ctld_up(), DAEMON_WAIT_S, SLURMCTLD,
                 self.root / "log" / "slurmctld.log")

    def _ctld_up(self) -> bool:
        return self.slurm().ping() is None

    def spawn_ctld(self, st: State, extra_env: Mapping[str, str] | None = None) -> None:
        """Start slurmctld in the foreground of its own process group (no wait)."""
        self._start(st, SLURMCTLD, [SLURMCTLD, "-D", "-f", str(self.conf)], "slurmctld.out",
                    extra_env)

    def ctld_proc(self, st: State) -> Proc | None:
        return st.proc(SLURMCTLD)

    def spawn_slurmd(self, st: State, node: str) -> None:
        """Start the slurmd of one site node (``-N``: many on one host, each its own port)."""
        self._start(st, f"{SLURMD}:{node}", [SLURMD, "-D", "-f", str(self.conf), "-N", node],
                    f"slurmd-{node}.out")

    def _start_slurmds(self, site: Site, st: State) -> None:
        self.log(f"starting {len(site.nodes)} slurmd")
        for node in site.nodes:
            self.spawn_slurmd(st, node.name)

    def node_states(self) -> dict[str, str]:
        return self.slurm().node_states()

    def wait_nodes_idle(self, site: Site, timeout: float = NODE_WAIT_S) -> int:
        want = {n.name for n in site.nodes}
        last: dict[str, str] = {}

        def idle() -> bool:
            nonlocal last
            last = self.node_states()
            return want <= {n for n, s in last.items() if s == "idle"}

        try:
            wait_for(idle, timeout, "all nodes idle", None)
        except TestbedError as exc:
            bad = {n: s for n, s in last.items() if n in want and s != "idle"}
            raise TestbedError(f"nodes not idle after {timeout:.0f}s: {bad}; see "
                               f"{self.root}/log/slurmd-<node>.log") from exc
        return len(want)

    def _update_running(self, site: Site, site_file: str, st: State, t0: float) -> UpResult:
        old = {p.name: p.read_text() for p in self.etc.glob("*.conf") if p.name != "slurmdbd.conf"}
        self._assign_node_ports(st, site)
        # The hook is reloaded by slurmctld itself (by mtime); only a new JobSubmitPlugins
        # line in slurm.conf needs the restart below.
        self.install_hook(site)
        new = render(site, whole=True, runtime=self.runtime(st))
        # One classifier for `up` and `site apply` (hetslurm.levers.rollout).
        plan = classify(dict(old), dict(new))
        changed = list(plan.files)
        if not changed:
            # Still make sure every daemon of the site runs (a slurmd may have died).
            self._start_slurmds(site, st)
            self._start_rest(st)
            n = self.wait_nodes_idle(site)
            return UpResult("already-up", time.monotonic() - t0, n, "configuration unchanged")
        st.site = site_file
        self.save_state(st)
        if not plan.needs_restart:
            self._write_config(site, st)
            self.slurm().reconfigure()
            n = self.wait_nodes_idle(site)
            return UpResult("reconfigured", time.monotonic() - t0, n,
                            f"{', '.join(changed)} changed: scontrol reconfigure")
        # Node, gres and topology changes need slurmctld and slurmd restarted in 22.05.
        self.log(f"{', '.join(changed)} changed: restarting slurmctld and slurmd")
        self._stop_slurm(st)
        self._write_config(site, st)
        self._start_ctld(st)
        self._start_slurmds(site, st)
        self._start_rest(st)
        n = self.wait_nodes_idle(site)
        return UpResult("restarted", time.monotonic() - t0, n,
                        f"{', '.join(changed)} changed: restart needed")

    def restart_ctld(self) -> None:
        """Stop slurmctld and start it again on the configuration files as they are now (not
        rendered again: a benchmark that edited slurm.conf itself keeps its edit)."""
        self.stop_daemon(SLURMCTLD)
        self.start_daemon(SLURMCTLD)

    def stop_daemon(self, name: str) -> None:
        """Stop one of the controller-side daemons alone, ``slurmctld`` or ``slurmdbd`` (fault
        tests: the controller or accounting down while the rest runs); start_daemon brings it
        back."""
        if name not in (SLURMCTLD, SLURMDBD):
            raise TestbedError(f"stop_daemon: {name!r} is not slurmctld or slurmdbd")
        st = self.existing_state()
        p = st.proc(name)
        if p is not None:
            procs.stop(p, timeout=30)
            st.procs.pop(name, None)
            self.save_state(st)

    def start_daemon(self, name: str) -> None:
        """Start ``slurmctld`` or ``slurmdbd`` again after stop_daemon; waits until it answers."""
        st = self.existing_state()
        if name == SLURMDBD:
            self._start_dbd(st)
        elif name == SLURMCTLD:
            self._start_ctld(st)
        else:
            raise TestbedError(f"start_daemon: {name!r} is not slurmctld or slurmdbd")

    def existing_state(self) -> State:
        """:meth:`load_state` where a testbed must exist."""
        st = self.load_state()
        if st is None:
            raise TestbedError(f"no testbed in {self.root}; start it with `hetslurm testbed up`")
        return st

    # ---- down --------------------------------------------------------------------------
    def down(self) -> dict[str, Any]:
        """Cancel every job, stop exactly the daemons we started, leave nothing running."""
        t0 = time.monotonic()
        st = self.load_state()
        if st is None:
            return {"stopped": [], "killed": [], "seconds": 0.0}
        cancelled = 0
        if self.running(st).get(SLURMCTLD):
            cancelled = self._cancel_all()
        killed: list[str] = []
        stopped: list[str] = []
        stopped_slurm, killed_slurm = self._stop_slurm(st)
        stopped += stopped_slurm
        killed += killed_slurm
        for name in (SLURMDBD, "mariadbd", "munged"):
            p = st.proc(name)
            if p is None:
                continue
            if p.alive():
                if procs.stop(p, timeout=30):
                    killed.append(name)
                stopped.append(name)
            st.procs.pop(name, None)
            self.save_state(st)
        # Anything still carrying our mark (a slurmstepd that did not end) is ours to end.
        leftovers = procs.marked_pids(str(self.root))
        for pid in leftovers:
            name = procs.proc_name(pid)
            start = procs.proc_starttime(pid)
            if start is not None and procs.stop(procs.Proc(name, pid, start), timeout=10):
                killed.append(f"{name}:{pid}")
        remaining = procs.marked_pids(str(self.root))
        if remaining:
            raise TestbedError(f"processes of the testbed still run: {remaining}")
        if self.in_root:
            owner_file = roots.root_path(self.slurm_release) / ROOT_OWNER
            if owner_file.is_file() and owner_file.read_text().strip() == str(self.root):
                owner_file.unlink()
        # What `testbed fake` scripted lasts until `clear` or down.
        self.fake_scenario.unlink(missing_ok=True)
        if st.mounts:
            stuck = roots.unmount(st.mounts)
            st.mounts = stuck
            self.save_state(st)
            if stuck:
                raise TestbedError(f"could not unmount {', '.join(stuck)}")
        return {"stopped": stopped, "killed": killed, "jobs_cancelled": cancelled,
                "seconds": round(time.monotonic() - t0, 3)}

    def _cancel_all(self) -> int:
        slurm = self.slurm()
        try:
            ids = slurm.active_job_ids()
        except CommandError:
            ids = []
        if ids:
            slurm.cancel_jobs(ids)

            def drained() -> bool:
                return not slurm.active_job_ids()

            try:
                wait_for(drained, 60, "jobs to end", None)
            except TestbedError:
                self.log("some jobs did not end within 60s; stopping daemons anyway")
        # Wait for slurmstepd/slurmscriptd children of our daemons to finish on their own.
        ours = {SLURMCTLD, SLURMSCRIPTD, SLURMD, SLURMDBD, SLURMRESTD, "mariadbd", "munged"}
        try:
            wait_for(lambda: all(procs.proc_name(p) in ours
                                 for p in procs.marked_pids(str(self.root))),
                     30, "slurmstepd to end", None)
        except TestbedError:
            self.log("slurmstepd still running after 30s; they will be stopped")
        return len(ids)

    def _stop_slurm(self, st: State) -> tuple[list[str], list[str]]:
        stopped, killed = [], []
        names = [n for n in st.procs if n.startswith(f"{SLURMD}:")] + [SLURMRESTD, SLURMCTLD]
        # SIGTERM all slurmd at once: each takes a moment to shut down.
        live = []
        for name in names:
            p = st.proc(name)
            if p and p.alive() and name != SLURMCTLD:  # slurmrestd too: it reads slurm.conf once
                os.kill(p.pid, 15)
                live.append(p)
        for p in live:
            if procs.stop(p, timeout=20):
                killed.append(p.name)
        for name in names:
            p = st.proc(name)
            if name == SLURMCTLD and p and p.alive() and procs.stop(p, timeout=30):
                killed.append(name)
            if p:
                stopped.append(name)
            st.procs.pop(name, None)
        self.save_state(st)
        return stopped, killed

    # ---- status ------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        st = self.load_state()
        if st is None:
            return {"dir": str(self.root), "exists": False, "daemons": {}, "nodes": {},
                    "slurm_version": None}
        alive = self.running(st)
        nodes: dict[str, str] = {}
        if alive.get(SLURMCTLD):
            try:
                nodes = self.node_states()
            except CommandError:
                nodes = {}
        return {
            "dir": str(self.root),
            "exists": True,
            "cluster": st.cluster,
            "site": st.site,
            "slurm_conf": str(self.conf),
            "slurm_release": self.slurm_release,
            "slurm_version": self.slurm_version(),
            "root": str(roots.root_path(self.slurm_release)) if self.in_root else None,
            "ports": st.ports,
            "daemons": {n: {"pid": st.procs[n]["pid"], "alive": a} for n, a in alive.items()},
            "nodes": nodes,
        }


def debian_release(os_release: Path = Path("/etc/debian_version")) -> str:
    """The Slurm release the host's Debian ships (12: 22.05, 13: 24.11, unstable: 26.05), for
    a host that has no Slurm installed yet; the default release elsewhere."""
    try:
        text = os_release.read_text().strip()
    except OSError:
        return versions.DEFAULT
    major = text.split(".")[0]
    return {"12": "22.05", "13": "24.11"}.get(major, "26.05" if "sid" in text else
                                               versions.DEFAULT)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_ports(n: int, exclude: set[int] | None = None) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (bound with port 0)."""
    exclude = exclude or set()
    socks: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in exclude and port not in ports:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


def wait_for(pred: Callable[[], bool], timeout: float, what: str, log_file: Path | None) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.1
    while time.monotonic() < deadline:
        procs.reap()
        try:
            if pred():
                return
        except CommandError:
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    hint = f"; see {log_file}" if log_file else ""
    raise TestbedError(f"timed out after {timeout:.0f}s waiting for {what}{hint}")
