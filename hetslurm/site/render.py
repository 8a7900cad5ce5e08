"""Render a :class:`Site` into Slurm's own configuration files.

Pure and deterministic: the same site and runtime give the same bytes, nothing is read from
a live cluster, and nothing is written here (``write_rendered`` does that, only after
rendering succeeded). Two modes:

* fragments (default): ``Include``-able pieces for an existing slurm.conf — node lines,
  partitions and the global keys hetslurm needs — plus gres.conf and topology.conf;
* whole: a complete slurm.conf for a standalone cluster (the testbed uses it), with the
  daemons' ports, paths and accounting taken from a :class:`Runtime`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hostlist

from hetslurm.site import levers
from hetslurm.site.model import Device, NodeSpec, Site

GRES_TYPES = ("gpu", "fpga")
NVIDIA_MAJOR = 195  # /dev/nvidiaN character devices (Linux devices.txt)
FPGA_MAJOR = 240  # first of the "local/experimental" majors; emulated FPGAs only
#: nvidia-caps' major is assigned at driver load (see /proc/devices); emulated ones use this.
MIG_CAP_MAJOR = 241  # a "local/experimental" major; emulated MIG capability files only
MIG_CAP_DIR = "/dev/nvidia-caps"

EMULATED_MINOR_BASE = 128  # above any per-node index (at most 64 devices of a kind)

FRAGMENT_FILES = ("hetslurm-globals.conf", "hetslurm-nodes.conf", "hetslurm-partitions.conf")


@dataclass(frozen=True)
class Runtime:
    """Where and how a whole slurm.conf runs. The defaults are Debian's system layout.

    The testbed sets loopback addresses, free ports, one state folder and emulated devices.
    """

    state_dir: str | None = None
    slurmctld_host: str = "localhost"
    slurmctld_addr: str | None = None
    slurmctld_port: int = 6817
    slurmd_port: int = 6818
    #: Per-node slurmd ports, for many slurmd on one host (the testbed). Requires node_addr.
    node_ports: Mapping[str, int] = field(default_factory=dict)
    node_addr: str | None = None
    slurmdbd_host: str | None = None
    slurmdbd_port: int = 6819
    munge_socket: str | None = None
    #: Emulated device files live under ``device_dir/<node>/``; None means real devices.
    device_dir: str | None = None
    slurm_user: str = "slurm"
    #: Let slurmd accept nodes bigger than the host (``SlurmdParameters=config_overrides``)
    #: and use the process-tracking plugins that need no cgroup setup.
    emulate: bool = False
    job_submit_lua: bool = False
    #: Write a cgroup.conf with ``CgroupPlugin=disabled``: slurmd 24.11 and later exits at
    #: start where no cgroup filesystem is set up for it, even with the plugins above.
    cgroup_disabled: bool = False
    #: JWT key file for ``AuthAltTypes=auth/jwt`` (slurmrestd's tokens); None: munge only.
    jwt_key: str | None = None


@dataclass(frozen=True)
class DeviceFile:
    """One device file gres.conf names, and (when emulated) the character device to make.

    ``kind`` is ``gpu``, ``fpga`` or ``mig_cap``: a MIG capability file
    (``/dev/nvidia-caps/nvidia-cap<minor>``) of slice ``mig_slice`` of GPU ``index``; a
    slice has two, its GPU instance's and its compute instance's (see levers.mig_cap_minors).
    """

    node: str
    kind: str
    index: int
    path: str
    major: int | None = None
    minor: int | None = None
    mig_slice: int | None = None


def device_files(site: Site, runtime: Runtime | None = None) -> list[DeviceFile]:
    """Every device file of every node, in Slurm index order.

    With ``runtime.device_dir`` set, files are emulated: ``<dir>/<node>/nvidia<i>`` with
    minor numbers deliberately *not* equal to the index (GPU i of n gets minor
    ``EMULATED_MINOR_BASE + n-1-i``: reversed, and never equal to any index), so anything
    that maps Slurm indices to devices by position instead of by minor is caught.
    """
    out: list[DeviceFile] = []
    for node in site.nodes:
        for kind, devices in (("gpu", node.gpus), ("fpga", node.fpgas)):
            if not devices:
                continue
            count = len(devices)
            group = node.spec.gpus if kind == "gpu" else node.spec.fpgas
            assert group is not None
            if runtime is not None and runtime.device_dir:
                stem = "nvidia" if kind == "gpu" else "fpga"
                major = NVIDIA_MAJOR if kind == "gpu" else FPGA_MAJOR
                for d in devices:
                    out.append(DeviceFile(node.name, kind, d.index,
                                          f"{runtime.device_dir}/{node.name}/{stem}{d.index}",
                                          major, EMULATED_MINOR_BASE + count - 1 - d.index))
            else:
                if group.files:
                    paths = hostlist.expand_hostlist(group.files)
                else:
                    stem = "/dev/nvidia" if kind == "gpu" else "/dev/xclmgmt"
                    paths = [f"{stem}{i}" for i in range(count)]
                out.extend(DeviceFile(node.name, kind, i, p) for i, p in enumerate(paths))
        out += _mig_cap_files(site, node, runtime)
    return out


def _mig_cap_files(site: Site, node: NodeSpec, runtime: Runtime | None) -> list[DeviceFile]:
    """The MIG capability files of a node's slices: slice j of GPU g is GPU instance j of
    g with compute instance 0 (the order ``nvidia-smi mig -cgi <profiles> -C`` creates them
    in, on a GPU without other instances; docs/levers.md)."""
    emulated = runtime is not None and runtime.device_dir
    out = []
    for d in node.gpus:
        for j, _profile in enumerate(levers.node_mig(site, node)):
            for minor in levers.mig_cap_minors(d.index, j):
                if emulated:
                    assert runtime is not None
                    out.append(DeviceFile(node.name, "mig_cap", d.index,
                                          f"{runtime.device_dir}/{node.name}/nvidia-cap{minor}",
                                          MIG_CAP_MAJOR, minor, j))
                else:
                    out.append(DeviceFile(node.name, "mig_cap", d.index,
                                          f"{MIG_CAP_DIR}/nvidia-cap{minor}", mig_slice=j))
    return out


#: The last site digested and its digest: one render writes it into several headers.
_last_digest: tuple[Site, str] | None = None


def site_digest(site: Site) -> str:
    """A short digest of what rendering depends on, written into every file's header
    (remembered for the last site object: a Site is immutable)."""
    global _last_digest
    if _last_digest is not None and _last_digest[0] is site:
        return _last_digest[1]
    digest = _site_digest(site)
    _last_digest = (site, digest)
    return digest


def _site_digest(site: Site) -> str:
    h = hashlib.sha256()
    for node in site.nodes:
        h.update(repr((node.name, node.spec, node.features, node.weight,
                       node.leaf_switch)).encode())
    for name in sorted(site.partitions):
        h.update(repr((name, site.partitions[name].spec, site.partitions[name].nodes)).encode())
    for name in sorted(site.switches):
        h.update(repr((name, site.switches[name])).encode())
    h.update(repr(site.scheduling).encode())
    if site.sections.get("levers") is not None:
        h.update(repr(site.sections["levers"]).encode())
        if site.sections["levers"].mig:  # not in its repr (schema.Levers.mig)
            h.update(repr(sorted(site.sections["levers"].mig.items())).encode())
    return h.hexdigest()[:16]


def _header(site: Site, what: str) -> list[str]:
    return [
        f"# {what} for cluster '{site.name}', rendered by hetslurm from its site file.",
        f"# hetslurm-site-digest: {site_digest(site)}",
        "# Do not edit: change the site file and render again.",
        "",
    ]


def _ranges(values: Iterable[int]) -> str:
    """[0,1,2,3,6] -> '0-3,6' (Slurm's index list form)."""
    vals = sorted(set(values))
    parts: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        parts.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(parts)


def accounting_tres(site: Site) -> str:
    """``AccountingStorageTRES``: every gres and every typed GPU/FPGA, so sacct shows models."""
    tres = ["gres/gpu"]
    tres += [f"gres/gpu:{m}" for m in site.gpu_models()]
    tres.append("gres/fpga")
    tres += [f"gres/fpga:{m}" for m in site.fpga_models()]
    tres += [f"gres/gpu:{t}" for t in levers.mig_types(site)]
    if levers.has_shards(site):
        tres.append("gres/shard")
    return ",".join(tres)


def _global_lines(site: Site, *, accounting: bool = True) -> list[str]:
    shard = ("shard",) if levers.has_shards(site) else ()
    lines = [f"GresTypes={','.join((*GRES_TYPES, *shard))}"]
    if accounting:
        # slurmctld 22.05 refuses to start with gres TRES and no slurmdbd ("fatal: slurmdbd
        # is required to run with TRES gres/gpu"), so a whole conf without one omits it.
        lines.append(f"AccountingStorageTRES={accounting_tres(site)}")
    lines.append("PriorityType=priority/multifactor")
    lines += _accounting_lines(site, accounting=accounting)
    lines += levers.global_lines(site, accounting=accounting)
    if site.switches:
        lines.append("TopologyPlugin=topology/tree")
    if site.scheduling.def_mem_per_cpu:
        lines.append(f"DefMemPerCPU={site.scheduling.def_mem_per_cpu}")
    return lines


def _accounting_lines(site: Site, *, accounting: bool) -> list[str]:
    """What Slurm measures per job (``[accounting]``): task sampling for sacct/sstat, and the
    batch script kept by slurmdbd (only where there is one)."""
    conf = site.sections["accounting"]
    lines = [f"JobAcctGatherType=jobacct_gather/{conf.gather}"]
    if conf.gather != "none":
        lines.append(f"JobAcctGatherFrequency=task={conf.gather_frequency_s}")
    if accounting and conf.store_job_script:
        lines.append("AccountingStoreFlags=job_script")
    return lines


def _gres_string(node: NodeSpec, shards: int = 0, mig: Sequence[tuple[str, int]] = ()) -> str:
    parts = []
    if mig:
        # A MIG-split GPU is only its slices, each a gpu of its own type.
        parts += [f"gpu:{t}:{n}" for t, n in mig]
    elif node.gpus:
        parts.append(f"gpu:{node.gpus[0].model}:{len(node.gpus)}")
    if shards:
        parts.append(f"shard:{shards}")
    if node.fpgas:
        parts.append(f"fpga:{node.fpgas[0].model}:{len(node.fpgas)}")
    return ",".join(parts)


def _node_attrs(node: NodeSpec, shards: int = 0, mig: Sequence[tuple[str, int]] = ()) -> str:
    s = node.spec
    attrs = [
        f"CPUs={node.cpus}",
        "Boards=1",
        f"SocketsPerBoard={s.sockets}",
        f"CoresPerSocket={s.cores_per_socket}",
        f"ThreadsPerCore={s.threads_per_core}",
        f"RealMemory={s.memory}",
    ]
    gres = _gres_string(node, shards, mig)
    if gres:
        attrs.append(f"Gres={gres}")
    attrs.append(f"Feature={','.join(node.features)}")
    attrs.append(f"Weight={node.weight}")
    return " ".join(attrs)


def _node_lines(site: Site, runtime: Runtime | None) -> list[str]:
    lines: list[str] = []
    if runtime is not None and runtime.node_ports:
        # Many slurmd on one host: each node needs its own line for its own Port.
        for node in site.nodes:
            addr = f" NodeAddr={runtime.node_addr}" if runtime.node_addr else ""
            attrs = _node_attrs(node, levers.node_shards(site, node),
                                levers.node_mig_gres(site, node))
            lines.append(f"NodeName={node.name}{addr} Port={runtime.node_ports[node.name]} "
                         f"{attrs} State=UNKNOWN")
        return lines
    # Group consecutive nodes with identical attributes into one hostlist line.
    groups: list[tuple[str, list[str]]] = []
    for node in site.nodes:
        attrs = _node_attrs(node, levers.node_shards(site, node),
                            levers.node_mig_gres(site, node))
        if groups and groups[-1][0] == attrs:
            groups[-1][1].append(node.name)
        else:
            groups.append((attrs, [node.name]))
    return [f"NodeName={hostlist.collect_hostlist(names)} {attrs} State=UNKNOWN"
            for attrs, names in groups]


def _partition_lines(site: Site, *, accounting: bool = True) -> list[str]:
    lines = []
    limits: dict[str, list[str]] = {}
    for name, part in site.partitions.items():
        nodes = "ALL" if part.spec.nodes == "ALL" else hostlist.collect_hostlist(list(part.nodes))
        attrs = [f"MaxTime={part.spec.max_time}"]
        if part.spec.default_time:
            attrs.append(f"DefaultTime={part.spec.default_time}")
        attrs += [f"{k}={v}" for k, v in part.spec.options.items()]
        attrs += levers.partition_attrs(site, part, accounting=accounting)
        attrs.append("State=UP")
        limits[name] = attrs
        lines.append(" ".join([f"PartitionName={name}", f"Nodes={nodes}",
                               f"Default={'YES' if part.spec.default else 'NO'}", *attrs]))
    if site.ranked:
        # docs/fallback.md: one partition per GPU model over the same nodes, with the base
        # partition's limits, tier, QOS and preemption word for word, so a job submitted to
        # several of them (in its own order) gets the first model free now, at once.
        lines += ["# Ranked fallback: one overlapping partition per GPU model (hetslurm's;",
                  "# the job_submit hook refuses jobs that name them, docs/fallback.md)."]
        for r in site.ranked.values():
            lines.append(" ".join([f"PartitionName={r.name}",
                                   f"Nodes={hostlist.collect_hostlist(list(r.nodes))}",
                                   "Default=NO", *limits[r.base]]))
    return lines


def _links(devices: tuple[Device, ...], d: Device) -> str:
    # Slurm's Links=: per other device the number of links, -1 for the device itself.
    return ",".join(
        "-1" if o.index == d.index else ("1" if o.island == d.island else "0") for o in devices
    )


def render_gres_conf(site: Site, runtime: Runtime | None = None) -> str:
    """gres.conf: one line per device, ``Cores=`` from its NUMA domain, ``Links=`` from its
    NVLink island. Slurm 22.05 keeps a job inside one island only through core affinity
    (measured: with ``Links=`` alone a 4-GPU job was split across islands), so ``Cores=``
    matters more than ``Links=`` here."""
    all_files = device_files(site, runtime)
    files = {(f.node, f.kind, f.index): f.path for f in all_files if f.kind != "mig_cap"}
    caps: dict[tuple[str, int, int], list[str]] = {}
    for f in all_files:
        if f.kind == "mig_cap" and f.mig_slice is not None:
            caps.setdefault((f.node, f.index, f.mig_slice), []).append(f.path)
    lines = _header(site, "gres.conf")
    lines.append("AutoDetect=off")
    # Nodes whose device lines are identical share one NodeName=<hostlist> block; emulated
    # devices have per-node paths, so every node gets its own block there.
    blocks: dict[tuple[str, ...], list[str]] = {}
    for node in site.nodes:
        body: list[str] = []
        mig = levers.node_mig(site, node)
        for kind, devices in (("gpu", node.gpus), ("fpga", node.fpgas)):
            for d in devices:
                parent = files[(node.name, kind, d.index)]
                if kind == "gpu" and mig:
                    # One record per slice: the parent GPU and the slice's capability files.
                    body += [f"Name=gpu Type={levers.mig_type(d.model, p)} MultipleFiles="
                             f"{','.join([parent, *caps[(node.name, d.index, j)]])} "
                             f"Cores={_ranges(d.cores)}" for j, p in enumerate(mig)]
                    continue
                entry = (f"Name={kind} Type={d.model} File={files[(node.name, kind, d.index)]} "
                         f"Cores={_ranges(d.cores)}")
                if kind == "gpu" and len(devices) > 1:
                    entry += f" Links={_links(devices, d)}"
                body.append(entry)
        shards = levers.node_shards(site, node)
        if shards:
            # 22.05 spreads a node's shards evenly over its GPUs; no File= needed.
            body.append(f"Name=shard Count={shards}")
        if body:
            blocks.setdefault(tuple(body), []).append(node.name)
    for body_key, node_names in blocks.items():
        nl = hostlist.collect_hostlist(node_names)
        lines += [f"NodeName={nl} {b}" for b in body_key]
    return "\n".join(lines) + "\n"


def render_topology_conf(site: Site) -> str:
    """topology.conf for topology/tree: leaves list nodes, upper switches list switches."""
    lines = _header(site, "topology.conf")
    for name, sw in site.switches.items():
        if sw.nodes is not None:
            members = [n.name for n in site.nodes if n.leaf_switch == name]
            line = f"SwitchName={name} Nodes={hostlist.collect_hostlist(members)}"
        else:
            line = f"SwitchName={name} Switches={','.join(sw.switches)}"
        if sw.link_speed:
            line += f" LinkSpeed={sw.link_speed}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _whole_slurm_conf(site: Site, rt: Runtime) -> str:
    state = rt.state_dir
    ctld_host = rt.slurmctld_host + (f"({rt.slurmctld_addr})" if rt.slurmctld_addr else "")
    lines = _header(site, "slurm.conf")
    lines += [
        f"ClusterName={site.name}",
        f"SlurmctldHost={ctld_host}",
        f"SlurmctldPort={rt.slurmctld_port}",
        f"SlurmdPort={rt.slurmd_port}",
        f"SlurmUser={rt.slurm_user}",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
    ]
    if rt.munge_socket:
        lines.append(f"AuthInfo=socket={rt.munge_socket}")
    if rt.jwt_key:
        lines += ["AuthAltTypes=auth/jwt", f"AuthAltParameters=jwt_key={rt.jwt_key}"]
    if state:
        lines += [
            f"StateSaveLocation={state}/ctld",
            f"SlurmdSpoolDir={state}/spool/%n",
            f"SlurmctldPidFile={state}/run/slurmctld.pid",
            f"SlurmdPidFile={state}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={state}/log/slurmctld.log",
            f"SlurmdLogFile={state}/log/slurmd-%n.log",
        ]
    else:
        lines += [
            "StateSaveLocation=/var/spool/slurmctld",
            "SlurmdSpoolDir=/var/spool/slurmd",
            "SlurmctldPidFile=/run/slurmctld.pid",
            "SlurmdPidFile=/run/slurmd.pid",
            "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
            "SlurmdLogFile=/var/log/slurm/slurmd.log",
        ]
    if rt.emulate:
        lines += [
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
        ]
    else:
        lines += ["ProctrackType=proctrack/cgroup", "TaskPlugin=task/affinity,task/cgroup"]
    lines += [
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory"
        + (",CR_CORE_DEFAULT_DIST_BLOCK" if site.scheduling.core_distribution == "block" else ""),
        "SchedulerType=sched/backfill",
        "ReturnToService=2",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=300",
    ]
    if rt.slurmdbd_host:
        lines += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            f"AccountingStorageHost={rt.slurmdbd_host}",
            f"AccountingStoragePort={rt.slurmdbd_port}",
            "AccountingStorageEnforce=associations,limits,qos",
        ]
        if rt.munge_socket:
            # Connections to slurmdbd authenticate through the munge socket named here, not
            # AuthInfo (slurm.conf(5), AccountingStoragePass).
            lines.append(f"AccountingStoragePass={rt.munge_socket}")
    if rt.job_submit_lua:
        lines.append("JobSubmitPlugins=lua")
    lines += _global_lines(site, accounting=bool(rt.slurmdbd_host))
    lines += ["", "# Nodes", *_node_lines(site, rt)]
    lines += ["", "# Partitions", *_partition_lines(site, accounting=bool(rt.slurmdbd_host))]
    return "\n".join(lines) + "\n"


def render(site: Site, *, whole: bool = False, runtime: Runtime | None = None) -> dict[str, str]:
    """Render every file; returns file name → content (nothing is written).

    Args:
        site: a loaded site.
        whole: write a complete slurm.conf instead of Include-able fragments.
        runtime: daemons' ports and paths for ``whole`` (Debian's defaults when None).
    """
    files: dict[str, str] = {}
    if whole:
        files["slurm.conf"] = _whole_slurm_conf(site, runtime or Runtime())
    else:
        files["hetslurm-globals.conf"] = "\n".join(
            [*_header(site, "Global keys hetslurm needs"), *_global_lines(site)]) + "\n"
        files["hetslurm-nodes.conf"] = "\n".join(
            [*_header(site, "Node lines"), *_node_lines(site, runtime)]) + "\n"
        files["hetslurm-partitions.conf"] = "\n".join(
            [*_header(site, "Partitions"), *_partition_lines(site)]) + "\n"
    files["gres.conf"] = render_gres_conf(site, runtime)
    if runtime is not None and runtime.cgroup_disabled:
        files["cgroup.conf"] = ("# rendered by hetslurm: no cgroup filesystem is set up for "
                                "these slurmd\nCgroupPlugin=disabled\n")
    if site.switches:
        files["topology.conf"] = render_topology_conf(site)
    return files


def write_rendered(files: Mapping[str, str], out_dir: str | Path) -> list[Path]:
    """Write rendered files atomically (temp file + rename), each readable by Slurm."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in sorted(files.items()):
        target = out / name
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        written.append(target)
    return written
