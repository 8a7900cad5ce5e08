"""``site import`` from a running cluster: the access layer's nodes, partitions, switches and
configuration turned into :class:`hetslurm.site.importer.ImportedCluster`.

Here and not in ``site`` because it talks to a live Slurm (the site room never does); the
drafting and writing are the site room's, shared with the offline import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hetslurm.errors import BackendError
from hetslurm.site import importer
from hetslurm.site.importer import (
    GresDevice,
    ImportedCluster,
    ImportedNode,
    ImportedPartition,
    ImportedSwitch,
)
from hetslurm.slurm import NotSupportedError, SlurmBackend, units


def from_backend(backend: SlurmBackend, *, gres_conf: str | Path | None = None,
                 gres_outputs: Sequence[tuple[str | None, str | Path]] = (),
                 name: str | None = None) -> ImportedCluster:
    """Build the intermediate from the live cluster.

    Nodes (layout, memory, gres counts, features, weight), partitions (nodes, default,
    times, QOS) and the switch tree come from ``backend``; device files, ``Cores=`` and
    ``Links=`` only from ``gres_conf`` or ``slurmd -G`` output (Slurm's commands do not
    print them). ClusterName, DefMemPerCPU and SelectTypeParameters come from the
    controller's configuration when the backend can read it.

    Raises:
        BackendError: Slurm could not be asked.
        SiteImportError: a file given does not parse.
    """
    notes: list[tuple[tuple[str, ...], str]] = []
    nodes = tuple(
        ImportedNode(
            name=n.name, cpus=n.cpus_total or None, sockets=n.sockets,
            cores_per_socket=n.cores_per_socket, threads_per_core=n.threads_per_core,
            memory_mib=n.memory_total_mib or None,
            gres={k: v for k, v in n.gres_total.items() if v},
            features=n.features, weight=n.weight, where=f"node {n.name}")
        # Slurm lists nodes in slurm.conf order, which the site keeps.
        for n in backend.nodes())
    all_names = [n.name for n in nodes]
    devices: dict[str, tuple[GresDevice, ...]] = {}
    sources = [f"the live cluster ({backend.name} backend)"]
    if gres_conf is not None:
        devices = importer.parse_gres_conf(gres_conf, all_names)
        sources.append(str(gres_conf))
    devices.update(importer.apply_gres_outputs(gres_outputs, nodes))
    sources += [str(f) for _, f in gres_outputs]

    partitions = []
    for p in backend.partitions():
        # scontrol prints Nodes=ALL as written in slurm.conf; JSON may give the expansion.
        covers_all = p.nodes == ("ALL",) or set(p.nodes) == set(all_names)
        if covers_all and p.nodes != ("ALL",):
            notes.append((("partitions", p.name, "nodes"), "holds every node; written as ALL "
                          "(Slurm printed the node list, not what slurm.conf says)"))
        options = {"QOS": p.qos} if p.qos else {}
        partitions.append(ImportedPartition(
            name=p.name, nodes=None if covers_all else tuple(p.nodes), default=p.default,
            max_time=units.format_time(p.max_time),
            default_time=units.format_time(p.default_time) if p.default_time else None,
            state=p.state, options=options, where=f"partition {p.name}"))

    switches: tuple[ImportedSwitch, ...] = ()
    try:
        switches = tuple(ImportedSwitch(s.name, s.nodes, s.switches, s.link_speed)
                         for s in backend.topology())
    except NotSupportedError:
        notes.append((("nodes",), f"the '{backend.name}' backend cannot read the switch tree; "
                      "no [switches] written"))
    except BackendError as exc:
        # A cluster without topology/tree may answer with an error rather than no switch.
        notes.append((("nodes",), f"the switch tree could not be read ({str(exc)[:120]}); "
                      "no [switches] written"))

    config: dict[str, str] = {}
    try:
        config = backend.config()
    except BackendError:
        notes.append((("name",), "the controller's configuration could not be read"))
    low = {k.lower(): v for k, v in config.items()}
    dmpc = None
    mem = units.memory_mib(low["defmempercpu"]) if "defmempercpu" in low else None
    if isinstance(mem, int) and mem > 0:
        dmpc = mem
    dist = None
    if "selecttypeparameters" in low:
        dist = ("block" if "CR_CORE_DEFAULT_DIST_BLOCK" in low["selecttypeparameters"].upper()
                else "cyclic")
    return ImportedCluster(
        name=name or low.get("clustername"), nodes=nodes, partitions=tuple(partitions),
        switches=switches, devices=devices, def_mem_per_cpu=dmpc, core_distribution=dist,
        notes=tuple(notes), sources=tuple(sources))

