"""Debian roots that carry a Slurm release the host does not ship (docs/testbed.md).

A root is built once with ``debootstrap --variant=minbase`` from the mirror the host's apt
already uses, gets Slurm, MariaDB and munge from that Debian release, and is cached under
:func:`roots_dir` (``$HETSLURM_ROOTS``, default ``/var/cache/hetslurm/roots``). Only a root
that finished every step carries the ``READY`` file (with the Slurm version it was checked
to run); a failed build says which step failed and leaves no ``READY`` behind, and the next
build starts that root afresh. Facts in ``../shared/SLURM-VERSIONS.md``.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hetslurm.errors import BackendError, TestbedError
from hetslurm.process import run_command
from hetslurm.slurm import versions

ROOTS_ENV = "HETSLURM_ROOTS"
DEFAULT_ROOTS = Path("/var/cache/hetslurm/roots")
READY = "READY"

#: The Debian release that ships each Slurm release the host may lack.
SUITES = {"24.11": "trixie", "26.05": "sid"}
#: What a root needs (the same daemons as the host testbed, from the root's own release).
PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge",
            "mariadb-server", "python3", "slurmrestd", "slurm-wlm-jwt-plugin")
#: Inside a root: the mounts a Slurm daemon needs, mounted for the build and the run.
MOUNTS = (
    ("proc", "proc", ("-t", "proc")),
    ("sysfs", "sys", ("-t", "sysfs")),
    ("devpts", "dev/pts", ("-t", "devpts", "-o", "newinstance,ptmxmode=0666")),
    ("tmpfs", "dev/shm", ("-t", "tmpfs")),
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class Root:
    """A ready root: where it is and the Slurm version it runs."""

    release: str
    path: Path
    slurm_version: str


def roots_dir() -> Path:
    return Path(os.environ.get(ROOTS_ENV) or DEFAULT_ROOTS)


def root_path(release: str) -> Path:
    return roots_dir() / SUITES[release]


def ready_root(release: str) -> Root | None:
    """The cached root for ``release`` if its build finished, else None."""
    path = root_path(release)
    marker = path / READY
    if not marker.is_file():
        return None
    return Root(release, path, marker.read_text().strip())


def missing_in_root(path: Path) -> list[str]:
    """Packages of :data:`PACKAGES` the root's dpkg database does not list as installed."""
    status = path / "var/lib/dpkg/status"
    installed = set()
    try:
        text = status.read_text(errors="replace")
    except OSError:
        return []  # no dpkg database to ask: nothing to add by apt either
    for para in text.split("\n\n"):
        m = re.search(r"^Package: (\S+)$", para, re.M)
        if m and re.search(r"^Status: install ok installed$", para, re.M):
            installed.add(m.group(1))
    return [p for p in PACKAGES if p not in installed]


def host_mirror(sources: Path = Path("/etc/apt")) -> str:
    """The Debian mirror the host's apt uses (deb822 ``URIs:`` or a one-line ``deb``).

    Raises:
        TestbedError: no Debian mirror is configured.
    """
    candidates = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]
    for f in candidates:
        if not f.is_file() or not (f.suffix in (".list", ".sources") or f.name == "sources.list"):
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s*", line)
            if m:
                return m.group(1)
    raise TestbedError(f"no Debian mirror found in {sources}/sources.list(.d); the roots of "
                       "other Slurm releases are built from the mirror the host uses")


def _step(what: str, argv: list[str], timeout: float, env: dict[str, str] | None = None
          ) -> str:
    try:
        return run_command(argv, timeout=timeout, env=env).stdout
    except BackendError as e:
        raise TestbedError(f"building the root: {what} failed: {e}") from e


@contextlib.contextmanager
def mounted(path: Path) -> Iterator[None]:
    """The root's proc, sys, a private devpts and a tmpfs shm, unmounted on the way out
    (a mount left behind would outlive the process)."""
    done: list[str] = []
    try:
        done = mount_system(path)
        yield
    finally:
        unmount(done)


def mount_points(mounts: Path = Path("/proc/self/mounts")) -> set[str]:
    """Where something is mounted now (a bind mount of a folder of the same filesystem
    included, which ``os.path.ismount`` does not see)."""
    out = set()
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) > 1:
            # /proc/self/mounts escapes space, tab, newline and backslash as octal.
            out.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1]))
    return out


def is_mounted(path: str | Path) -> bool:
    return os.fspath(path) in mount_points()


def mount_system(path: Path) -> list[str]:
    """Mount the root's proc, sys, a private devpts and a tmpfs shm where they are not mounted
    yet; returns what it mounted (for :func:`unmount`)."""
    done: list[str] = []
    try:
        for source, target, opts in MOUNTS:
            where = path / target
            where.mkdir(parents=True, exist_ok=True)
            if is_mounted(where):
                continue
            _step(f"mounting {target}", ["mount", *opts, source, str(where)], 30)
            done.append(str(where))
    except TestbedError:
        unmount(done)
        raise
    return done


def bind_shared(path: Path, shared: Iterable[Path]) -> list[str]:
    """Bind-mount each host folder of ``shared`` at the same path inside the root (the
    testbed's state, job scripts and output), skipping one already visible through another;
    returns what it mounted (for :func:`unmount`)."""
    done: list[str] = []
    seen: list[Path] = []
    try:
        folders = {Path(p).resolve() for p in shared}
        for folder in sorted(folders, key=lambda p: (len(p.parts), str(p))):
            if folder == Path("/") or any(folder.is_relative_to(s) for s in seen):
                continue
            if not folder.is_dir():
                continue
            where = path / folder.relative_to("/")
            where.mkdir(parents=True, exist_ok=True)
            seen.append(folder)
            if is_mounted(where):
                continue
            _step(f"sharing {folder} with the root", ["mount", "--bind", str(folder),
                                                      str(where)], 30)
            done.append(str(where))
    except TestbedError:
        unmount(done)
        raise
    return done


def unmount(targets: Iterable[str]) -> list[str]:
    """Unmount ``targets`` in reverse order (lazily: a daemon's last file may still close);
    returns those that would not unmount."""
    failed = []
    for where in reversed(list(targets)):
        if not is_mounted(where):
            continue
        res = run_command(["umount", "-l", where], timeout=30, check=False)
        if res.returncode != 0:
            failed.append(where)
    return failed


def write_wrappers(path: Path, bindir: Path, release: str) -> list[str]:
    """Small scripts in ``bindir``, one per Slurm program of the root, that run that program
    inside the root in the caller's folder (``/`` when the root cannot see it), keeping the
    caller's environment (``SLURM_CONF``, the testbed's mark). ``exec`` all the way, so a
    daemon started through its wrapper keeps the pid it was started with."""
    bindir.mkdir(parents=True, exist_ok=True)
    written = []
    q = shlex.quote(str(path))
    for name, where in versions.PROGRAMS.items():
        if not (path / where / name).exists():
            continue
        text = (
            "#!/bin/sh\n"
            f"# hetslurm testbed: Slurm {release}'s {name}, run inside {path}\n"
            'd=$PWD\n'
            f'[ -d {q}"$d" ] || d=/\n'
            f'exec /usr/sbin/chroot {q} /usr/bin/env -C "$d" /{where}/{name} "$@"\n')
        w = bindir / name
        tmp = w.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(w)
        written.append(name)
    return written


def in_root(path: Path, argv: list[str], *, timeout: float, what: str) -> str:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LC_ALL": "C"}
    return _step(what, ["chroot", str(path), *argv], timeout, env)


def build_root(release: str, *, log: Log = print, mirror: str | None = None) -> Root:
    """Build (or reuse) the cached root of ``release``.

    Raises:
        ConfigError: not a supported release.
        TestbedError: a step failed (named, with the package apt could not install), or the
            host lacks what it takes (root, debootstrap's package).
    """
    name = versions.release(release).name
    if name not in SUITES:
        raise TestbedError(f"Slurm {name} runs from the host's own packages, not a root")
    ready = ready_root(name)
    if ready is not None:
        missing = missing_in_root(ready.path)
        if missing:
            # A root cached before a package joined PACKAGES gets just the new ones.
            if os.geteuid() != 0:
                raise TestbedError(f"the Slurm {name} root lacks {' '.join(missing)}; "
                                   "run as root to install them")
            log(f"installing {' '.join(missing)} in the root {ready.path}")
            with mounted(ready.path):
                in_root(ready.path, ["apt-get", "update", "-q"], timeout=600,
                        what="apt-get update")
                in_root(ready.path, ["apt-get", "install", "-y", "-q",
                                     "--no-install-recommends", *missing],
                        timeout=1800, what="apt-get install")
        return ready
    if os.geteuid() != 0:
        raise TestbedError(f"building the Slurm {name} root needs root")
    path = root_path(name)
    if path.exists():
        log(f"removing the unfinished root {path}")
        for _, target, _ in MOUNTS:  # a crashed build may have left them
            if is_mounted(path / target):
                run_command(["umount", "-l", str(path / target)], timeout=30, check=False)
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("debootstrap") is None:
        log("installing debootstrap")
        _step("apt-get install debootstrap", ["apt-get", "install", "-y", "-q", "debootstrap"],
              600, {**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    source = mirror or host_mirror()
    suite = SUITES[name]
    log(f"debootstrap {suite} into {path} from {source}")
    _step(f"debootstrap {suite}", ["debootstrap", "--variant=minbase",
                                   "--include=ca-certificates", suite, str(path), source], 1200)
    apt_conf = path / "etc/apt/apt.conf.d"
    # sid's Release file may be past its Valid-Until; signatures stay checked.
    (apt_conf / "99no-valid-until").write_text('Acquire::Check-Valid-Until "false";\n')
    policy = path / "usr/sbin/policy-rc.d"  # packages start no services in the root
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    with mounted(path):
        in_root(path, ["apt-get", "update", "-q"], timeout=600, what="apt-get update")
        log(f"installing {' '.join(PACKAGES)} in the root")
        try:
            in_root(path, ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                           *PACKAGES], timeout=1800, what="apt-get install")
        except TestbedError as e:
            raise TestbedError(f"{e} (packages: {' '.join(PACKAGES)})") from e
    try:
        got, version = versions.installed(root=path)
    except BackendError as e:
        raise TestbedError(f"building the root: its Slurm does not answer: {e}") from e
    if got.name != name:
        raise TestbedError(f"the {suite} root runs Slurm {version}, not {name}")
    (path / READY).write_text(version + "\n")
    log(f"root ready: {path} (Slurm {version})")
    return Root(name, path, version)
