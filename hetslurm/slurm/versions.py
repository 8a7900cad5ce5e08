"""The Slurm releases hetslurm supports, and what differs between them (docs/versions.md).

Every fact here was measured on a real controller of that release (``../shared/SLURM-VERSIONS.md``
and the testbed); a release not listed is refused by name rather than guessed at.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from hetslurm.errors import BackendError, ConfigError
from hetslurm.process import run_command
from hetslurm.slurm.parse import parse_slurm_version


@dataclass(frozen=True)
class Release:
    """One supported Slurm release (``major.minor``) and its differences."""

    name: str
    #: How ``tres_per_node``/``tres_per_job`` name a gres: 22.05 takes ``gres:gpu:a100:1`` and
    #: refuses ``gres/``; 24.11 and 26.05 take ``gres/gpu:a100:1`` and refuse ``gres:``
    #: ("Invalid Trackable RESource (TRES) specification").
    gres_prefix: str
    #: slurmd exits at start without a cgroup.conf saying ``CgroupPlugin=disabled`` where no
    #: cgroup filesystem is set up for it ("No filesystem mounted on /sys/fs/cgroup"), even
    #: with proctrack/linuxproc and task/none; 22.05 needs no cgroup.conf there.
    needs_cgroup_disabled: bool = False
    #: The ``--json`` option that asks for a schema hetslurm reads: 22.05 prints only its
    #: v0.0.38; 24.11 (v0.0.40-42) and 26.05 (v0.0.42-45) both print data_parser v0.0.42.
    json_option: str = "--json"
    #: What makes ``squeue`` list every job the controller holds, finished ones included:
    #: 22.05's ``squeue --json`` ignores filters and lists them all; 24.11 on honour
    #: ``-t`` and hide finished jobs unless asked for ``-t all``.
    all_jobs: tuple[str, ...] = ()
    #: The listing with one record per node: 22.05's ``sinfo --json``; 24.11 on group
    #: nodes there, ``scontrol show node --json`` lists each.
    node_listing: tuple[str, ...] = ("sinfo",)
    #: A Lua error the script does not catch rejects the job (26.05: the plugin returns
    #: ``ESLURM_LUA_FUNC_FAILED_RUNTIME_ERROR``); before, it was logged and the job accepted
    #: with whatever the script had set until then.
    lua_error_rejects: bool = False
    #: ``--prefer=a100 --constraint='a100|h100'`` with every A100 busy starts on an H100 at
    #: once (26.05: the main scheduler falls back); before, the job waits, reason
    #: ``Priority``, until the next backfill pass (up to ``bf_interval``). docs/versions.md.
    prefer_falls_back_at_once: bool = False
    #: The slurmrestd API the REST backend speaks, when this release serves it: 24.11 and
    #: 26.05 serve data_parser v0.0.42 (the CLIs' schema); 22.05's slurmrestd serves only
    #: v0.0.36-38, so ``--backend rest`` is refused there (docs/slurm-access.md, "REST").
    rest_api: str | None = None
    #: ``sacct --json -B -j ID,...`` fills each job record's ``script`` (data_parser v0.0.42,
    #: seen on 24.11.5: one call for many jobs, each script in its own JSON string); 22.05's
    #: v0.0.38 records have no ``script``, so there each job is one ``sacct -B -j ID``.
    json_batch_scripts: bool = False


RELEASES: dict[str, Release] = {
    "22.05": Release("22.05", gres_prefix="gres:"),
    "24.11": Release("24.11", gres_prefix="gres/", needs_cgroup_disabled=True,
                     json_option="--json=v0.0.42", all_jobs=("-t", "all"),
                     node_listing=("scontrol", "show", "node"), rest_api="v0.0.42",
                     json_batch_scripts=True),
    "26.05": Release("26.05", gres_prefix="gres/", needs_cgroup_disabled=True,
                     json_option="--json=v0.0.42", all_jobs=("-t", "all"),
                     node_listing=("scontrol", "show", "node"), lua_error_rejects=True,
                     prefer_falls_back_at_once=True, rest_api="v0.0.42",
                     json_batch_scripts=True),
}
#: Slurm's programs a testbed run from another release's Debian root wraps, and where the
#: root holds each: the daemons it starts, and the clients the access layer, the tests and a
#: user's shell call by name (docs/testbed.md).
PROGRAMS: dict[str, str] = {
    **dict.fromkeys(("slurmctld", "slurmd", "slurmdbd", "slurmrestd"), "usr/sbin"),
    **dict.fromkeys(("sbatch", "salloc", "srun", "squeue", "sinfo", "scontrol", "scancel",
                     "sacct", "sacctmgr", "sdiag", "sprio", "sshare", "sstat", "sreport",
                     "strigger"), "usr/bin"),
}
#: The release the hook is rendered for when nothing says otherwise (Debian 12's Slurm).
DEFAULT = "22.05"


def release(version: str | tuple[int, ...]) -> Release:
    """The supported release of ``version`` (``"24.11"``, ``"24.11.5"``, ``(24, 11, 5)`` or
    ``scontrol --version``'s ``"slurm 24.11.5"``).

    Raises:
        ConfigError: not a version, or a release hetslurm does not support (named, with the
            supported ones).
    """
    text = ".".join(str(v) for v in version) if isinstance(version, tuple) else version
    m = re.search(r"(\d+)\.(\d+)", text)
    if not m:
        raise ConfigError(f"'{text}' is not a Slurm version; supported: {', '.join(RELEASES)}")
    name = f"{int(m.group(1))}.{int(m.group(2)):02d}"
    if name not in RELEASES:
        raise ConfigError(
            f"Slurm {name} is not supported; hetslurm supports {', '.join(RELEASES)}")
    return RELEASES[name]


def installed(slurm_conf: str | os.PathLike[str] | None = None, *,
              root: str | os.PathLike[str] | None = None,
              path: str | None = None) -> tuple[Release, str]:
    """The supported release of the Slurm installed here: ``slurmctld -V`` or ``slurmd -V``
    where a daemon is installed (they need no configuration), else ``scontrol --version``,
    which on 22.05 needs a readable slurm.conf (``slurm_conf``, else ``$SLURM_CONF``, else
    Slurm's default). ``root``: ask the Slurm installed in that Debian root (through chroot).
    ``path``: look the programs up there instead of ``$PATH`` (the system's own Slurm, not
    a testbed's wrappers). Returns the release and the full version (``"24.11.5"``).

    Raises:
        BackendError: no Slurm answers here; the message says to name the release instead.
        ConfigError: the Slurm here is a release hetslurm does not support.
    """
    env = dict(os.environ)
    if slurm_conf is not None:
        env["SLURM_CONF"] = os.fspath(slurm_conf)
    if path is not None:
        env["PATH"] = path
    tried = []
    prefix = ["chroot", os.fspath(root)] if root is not None else []
    for argv in (["slurmctld", "-V"], ["slurmd", "-V"], ["scontrol", "--version"]):
        conf = env.get("SLURM_CONF")
        if argv[0] == "scontrol" and conf and not os.path.isfile(conf):
            # scontrol would retry a missing file for a minute before it gives up.
            tried.append(f"{conf} does not exist")
            continue
        try:
            major, minor, micro = parse_slurm_version(
                run_command([*prefix, *argv], timeout=10, env=env).stdout)
            return release((major, minor)), f"{major}.{minor:02d}.{micro}"
        except BackendError as e:
            tried.append(str(e))
    raise BackendError(f"cannot tell which Slurm runs here ({'; '.join(tried)}); give "
                       f"--slurm-version ({', '.join(RELEASES)})")
