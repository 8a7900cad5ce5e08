"""Import an existing cluster into a site file: Slurm's own files → one intermediate →
one TOML (or JSON) writer whose output :func:`hetslurm.site.load.parse_site` accepts.

Pure: everything here reads text it is given (or files it is pointed at) and never talks to
a running Slurm. The live half (``scontrol``/``sinfo`` through the access layer) is
:func:`hetslurm.levers.site_import.from_backend`, which builds the same
:class:`ImportedCluster` and hands it to :func:`draft_site`.

Readers, each raising :class:`~hetslurm.errors.SiteImportError` with ``FILE:LINE`` on bad
input:

* :func:`parse_slurm_conf`: ``NodeName``/``PartitionName`` lines (hostlists, ``DEFAULT``
  lines, trailing-backslash continuations, ``#`` comments, ``Include``) and the few global
  keys a site holds;
* :func:`parse_gres_conf`: ``Name``/``Type``/``File``/``Cores``/``Links``/``Count`` lines,
  ``NodeName=`` ranges, ``AutoDetect``, ``File=/dev/nvidia[0-3]`` ranges;
* :func:`parse_topology_conf`: ``SwitchName``/``Switches``/``Nodes``/``LinkSpeed``;
* :func:`parse_gres_output`: what ``slurmd -G`` prints, one ``Gres Name=... Index=...`` line
  per device (any prefix before ``Gres `` is ignored);
* :func:`parse_topo_matrix`: ``nvidia-smi topo -m``; NVLink islands are the connected
  components of ``NV#`` links, NUMA domains come from the ``NUMA Affinity`` column.

Where a value had to be assumed, the writer puts a ``# guessed: <why>`` comment above it.
"""

from __future__ import annotations

import glob
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import hostlist

from hetslurm.errors import ConfigError, SiteImportError
from hetslurm.site import names
from hetslurm.site.model import (
    WEIGHT_CPU,
    WEIGHT_FPGA_BASE,
    WEIGHT_GPU_BASE,
    WEIGHT_STEP,
    place_devices,
)
from hetslurm.site.schema import DeviceGroup, NodeClass
from hetslurm.textfile import read_text_file

DEVICE_KINDS = ("gpu", "fpga")
#: Device files render.py writes when a class names none (the drivers' own naming).
DEFAULT_FILE_STEM = {"gpu": "/dev/nvidia", "fpga": "/dev/xclmgmt"}
#: slurm.conf files a site render writes as fragments (render.FRAGMENT_FILES), read in this
#: order when a folder has no slurm.conf.
FRAGMENTS = ("hetslurm-globals.conf", "hetslurm-nodes.conf", "hetslurm-partitions.conf")
MAX_INCLUDE_DEPTH = 16

_GRES_KEYS = {"nodename", "name", "type", "file", "files", "cores", "cpus", "links", "count",
              "flags", "autodetect", "multiplefiles"}
_TOPO_KEYS = {"switchname", "switches", "nodes", "linkspeed"}
_PART_MODELLED = {"partitionname", "nodes", "default", "maxtime", "defaulttime", "state"}
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_TOPO_CELL_RE = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|PXN|NV\d+)$")


# ------------------------------------------------------------------------------ records
@dataclass(frozen=True)
class GresDevice:
    """One device as gres.conf or ``slurmd -G`` describes it (``where`` is ``FILE:LINE``)."""

    name: str
    type: str | None
    file: str | None
    cores: tuple[int, ...] | None
    links: tuple[int, ...] | None
    where: str


@dataclass(frozen=True)
class ImportedNode:
    """One node as read from slurm.conf or the access layer (memory in MiB)."""

    name: str
    cpus: int | None = None
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    memory_mib: int | None = None
    #: ``(name, type) -> count``, e.g. ``("gpu", "h100") -> 8``.
    gres: Mapping[tuple[str, str | None], int] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    weight: int | None = None
    where: str = ""


@dataclass(frozen=True)
class ImportedPartition:
    name: str
    #: Node names, or None for ``Nodes=ALL``.
    nodes: tuple[str, ...] | None
    default: bool = False
    max_time: str | None = None
    default_time: str | None = None
    state: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)
    where: str = ""


@dataclass(frozen=True)
class ImportedSwitch:
    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    link_speed: int | None = None


@dataclass(frozen=True)
class TopoMatrix:
    """``nvidia-smi topo -m`` of one node: NVLink islands and the NUMA domain per GPU."""

    gpus: int
    islands: tuple[tuple[int, ...], ...]
    numa: tuple[int | None, ...]
    where: str


@dataclass(frozen=True)
class ImportedCluster:
    """What both builders produce; :func:`draft_site` turns it into a site file."""

    name: str | None
    nodes: tuple[ImportedNode, ...]
    partitions: tuple[ImportedPartition, ...] = ()
    switches: tuple[ImportedSwitch, ...] = ()
    #: Devices per node from gres.conf or ``slurmd -G`` output, in index order.
    devices: Mapping[str, tuple[GresDevice, ...]] = field(default_factory=dict)
    def_mem_per_cpu: int | None = None
    core_distribution: str | None = None
    #: ``# guessed:`` notes about the whole import (key path, why).
    notes: tuple[tuple[tuple[str, ...], str], ...] = ()
    #: Where each part came from, for the file's header.
    sources: tuple[str, ...] = ()


# ------------------------------------------------------------------------------ helpers
def _err(where: str, message: str) -> SiteImportError:
    file, _, line = where.rpartition(":")
    if file and line.isdigit():
        return SiteImportError(message, file=file, line=int(line))
    return SiteImportError(message, file=where or None)


def _logical_lines(text: str, path: str) -> list[tuple[int, str]]:
    """(first line number, text) with comments removed and ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    buf = ""
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(?<!\\)#.*", "", raw).replace("\\#", "#").rstrip()
        if not buf:
            start = no
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _pairs(line: str, where: str) -> list[tuple[str, str]]:
    try:
        words = shlex.split(line, posix=True)
    except ValueError as exc:
        raise _err(where, f"cannot split the line into Key=Value words ({exc})") from None
    out = []
    for w in words:
        key, eq, value = w.partition("=")
        if not eq or not key:
            raise _err(where, f"'{w}' is not Key=Value")
        out.append((key, value))
    return out


def _int(value: str, where: str, key: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise _err(where, f"{key}={value} is not a whole number") from None


def _hosts(expr: str, where: str, key: str) -> tuple[str, ...]:
    try:
        return tuple(h for h in hostlist.expand_hostlist(expr) if h)
    except hostlist.BadHostlist as exc:
        raise _err(where, f"{key}={expr} is not a valid hostlist ({exc})") from None


def _index_list(text: str, where: str, key: str) -> tuple[int, ...]:
    """``0-3,8`` (gres.conf ``Cores=``) to ``(0, 1, 2, 3, 8)``."""
    out: list[int] = []
    for part in text.split(","):
        a, dash, b = part.strip().partition("-")
        if not a.isdigit() or (dash and not b.isdigit()):
            raise _err(where, f"{key}={text} is not a list of numbers and ranges")
        lo, hi = int(a), int(b) if dash else int(a)
        if hi < lo or hi - lo > 1 << 16:
            raise _err(where, f"{key}={text} holds a bad range '{part}'")
        out += range(lo, hi + 1)
    return tuple(out)


def _links(text: str, where: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise _err(where, f"Links={text} is not a list of numbers") from None


def _memory(value: str, where: str, key: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGT]?)", value.strip(), re.IGNORECASE)
    if not m:
        raise _err(where, f"{key}={value} is not a memory size")
    factor = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return int(int(m.group(1)) * factor)


def parse_gres_string(text: str, where: str) -> dict[tuple[str, str | None], int]:
    """slurm.conf ``Gres=gpu:h100:8,fpga:u280:2`` (``(S:0-1)`` suffixes dropped)."""
    out: dict[tuple[str, str | None], int] = {}
    if text.strip().lower() in ("", "(null)", "none"):
        return out
    for raw in re.split(r",(?![^(]*\))", text):
        item = re.sub(r"\(.*\)$", "", raw.strip())
        parts = item.split(":")
        count = 1
        if len(parts) >= 2 and re.fullmatch(r"\d+[KMG]?", parts[-1]):
            num = parts.pop()
            count = int(num[:-1]) * {"K": 1024, "M": 1 << 20, "G": 1 << 30}[num[-1]] \
                if num[-1] in "KMG" else int(num)
        if len(parts) > 2 or not parts[0]:
            raise _err(where, f"Gres={text}: '{raw}' is not name[:type][:count]")
        key = (parts[0], parts[1] if len(parts) == 2 and parts[1] else None)
        if count:
            out[key] = out.get(key, 0) + count
    return out


# ---------------------------------------------------------------------------- slurm.conf
@dataclass
class SlurmConf:
    """What :func:`parse_slurm_conf` read: nodes and partitions in file order, global keys
    (lower-cased names) with the last value."""

    nodes: list[ImportedNode] = field(default_factory=list)
    partitions: list[ImportedPartition] = field(default_factory=list)
    globals: dict[str, str] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


def parse_slurm_conf(path: str | Path, *, _conf: SlurmConf | None = None,
                     _depth: int = 0) -> SlurmConf:
    """Read a slurm.conf (following ``Include``) into nodes, partitions and global keys.

    Raises:
        SiteImportError: a line that does not parse, named by file and line.
        ConfigError: the file cannot be read.
    """
    conf = _conf if _conf is not None else SlurmConf()
    p = Path(path)
    conf.files.append(str(p))
    text = read_text_file(p, what="slurm.conf")
    node_default: dict[str, str] = {}
    part_default: dict[str, str] = {}
    for no, line in _logical_lines(text, str(p)):
        where = f"{p}:{no}"
        head = line.split(None, 1)
        if head[0].lower() == "include":
            if len(head) < 2:
                raise _err(where, "Include names no file")
            if _depth >= MAX_INCLUDE_DEPTH:
                raise _err(where, f"Include nested deeper than {MAX_INCLUDE_DEPTH} files")
            target = Path(head[1].strip())
            if not target.is_absolute():
                target = p.parent / target
            matches = sorted(glob.glob(str(target))) if glob.has_magic(str(target)) \
                else [str(target)]
            for m in matches:
                parse_slurm_conf(m, _conf=conf, _depth=_depth + 1)
            continue
        pairs = _pairs(line, where)
        key0, val0 = pairs[0]
        rest = {k.lower(): v for k, v in pairs[1:]}
        if key0.lower() == "nodename":
            if val0.upper() == "DEFAULT":
                node_default.update(rest)
                continue
            attrs = {**node_default, **rest}
            node = _node_from_attrs(val0, attrs, where)
            conf.nodes += [replace(node, name=h) for h in _hosts(val0, where, "NodeName")]
        elif key0.lower() == "partitionname":
            if val0.upper() == "DEFAULT":
                part_default.update(rest)
                continue
            conf.partitions.append(_partition_from_attrs(val0, pairs[1:], part_default, where))
        elif key0.lower() in ("nodeset", "frontendname", "downnodes"):
            continue
        else:
            if len(pairs) != 1:
                # A global line holds one Key=Value; values with blanks are quoted.
                conf.globals[key0.lower()] = " ".join(f"{k}={v}" for k, v in pairs)[
                    len(key0) + 1:]
            else:
                conf.globals[key0.lower()] = val0
    return conf


#: slurm.conf spellings of the node keys read here, for messages.
_NODE_KEYS = {k.lower(): k for k in ("Boards", "SocketsPerBoard", "Sockets", "CoresPerSocket",
                                     "ThreadsPerCore", "CPUs", "Procs", "Weight")}


def _node_from_attrs(name: str, a: Mapping[str, str], where: str) -> ImportedNode:
    def num(key: str) -> int | None:
        return _int(a[key], where, _NODE_KEYS[key]) if key in a else None

    boards = num("boards") or 1
    sockets = num("socketsperboard")
    sockets = sockets * boards if sockets else num("sockets")
    features = a.get("feature", a.get("features", ""))
    return ImportedNode(
        name=name,
        cpus=num("cpus") or num("procs"),
        sockets=sockets,
        cores_per_socket=num("corespersocket"),
        threads_per_core=num("threadspercore"),
        memory_mib=_memory(a["realmemory"], where, "RealMemory") if "realmemory" in a else None,
        gres=parse_gres_string(a.get("gres", ""), where),
        features=tuple(f for f in features.split(",") if f),
        weight=num("weight"),
        where=where,
    )


def _partition_from_attrs(name: str, pairs: Sequence[tuple[str, str]],
                          default: Mapping[str, str], where: str) -> ImportedPartition:
    merged: dict[str, tuple[str, str]] = {k: (k, v) for k, v in default.items()}
    for k, v in pairs:
        merged[k.lower()] = (k, v)
    a = {k: v for k, (_, v) in merged.items()}
    nodes_expr = a.get("nodes", "")
    nodes = None if nodes_expr.upper() == "ALL" else _hosts(nodes_expr, where, "Nodes")
    options = {orig: v for k, (orig, v) in merged.items() if k not in _PART_MODELLED}
    return ImportedPartition(
        name=name, nodes=nodes, default=a.get("default", "NO").upper() == "YES",
        max_time=a.get("maxtime"), default_time=a.get("defaulttime"),
        state=a.get("state"), options=dict(sorted(options.items())), where=where)


# ----------------------------------------------------------------------------- gres.conf
def parse_gres_conf(path: str | Path, nodes: Sequence[str]) -> dict[str, tuple[GresDevice, ...]]:
    """Devices per node from a gres.conf, in file order (= Slurm's index order).

    ``nodes`` are every node of the cluster: a line without ``NodeName=`` applies to all of
    them. ``AutoDetect`` lines are accepted and skipped (the devices then come from
    ``--gres-output``); ``Count=`` lines without ``File=`` add device-less entries.

    Raises:
        SiteImportError: a line that does not parse or a key gres.conf does not have.
    """
    p = Path(path)
    text = read_text_file(p, what="gres.conf")
    return parse_gres_text(text, str(p), nodes)


def parse_gres_text(text: str, label: str,
                    nodes: Sequence[str]) -> dict[str, tuple[GresDevice, ...]]:
    """:func:`parse_gres_conf` on text already read (``label`` names it in errors)."""
    out: dict[str, list[GresDevice]] = {}
    for no, line in _logical_lines(text, label):
        where = f"{label}:{no}"
        a: dict[str, str] = {}
        for k, v in _pairs(line, where):
            if k.lower() not in _GRES_KEYS:
                raise _err(where, f"unknown gres.conf key '{k}'")
            a[k.lower()] = v
        if "name" not in a:
            if set(a) <= {"autodetect", "nodename"}:
                continue
            raise _err(where, "a gres.conf device line needs Name=")
        if "multiplefiles" in a:
            raise _err(where, "MultipleFiles= (MIG slices, shared devices) is not imported; "
                       "give the plain GPU lines")
        targets = _hosts(a["nodename"], where, "NodeName") if "nodename" in a else tuple(nodes)
        cores = None
        for key in ("cores", "cpus"):
            if key in a:
                cores = _index_list(a[key], where, "Cores")
        links = _links(a["links"], where) if "links" in a else None
        gtype = a.get("type") or None
        files_expr = a.get("file") or a.get("files")
        if files_expr:
            files = list(_hosts(files_expr, where, "File"))
            devs = [GresDevice(a["name"], gtype, f, cores, links, where) for f in files]
        else:
            count = parse_gres_string(f"x:{a['count']}", where).get(("x", None), 1) \
                if "count" in a else 1
            devs = [GresDevice(a["name"], gtype, None, cores, links, where)] * count
        for n in targets:
            out.setdefault(n, []).extend(devs)
    return {n: tuple(d) for n, d in out.items()}


def parse_gres_output(path: str | Path) -> tuple[GresDevice, ...]:
    """Devices of one node from what ``slurmd -G`` printed (its stderr saved to a file).

    Accepted: every line holding ``Gres Name=<name> ...``, whatever precedes ``Gres `` (a
    ``slurmd: `` or ``slurmd-<host>: `` prefix, a ``[timestamp]``); the fields are Slurm's
    ``Name= Type= Count= Index= ID= File= Cores= CoreCnt= Links= Flags=``, ``(null)`` meaning
    none. Devices are ordered by ``Index=``. Other lines are ignored.

    Raises:
        SiteImportError: a ``Gres`` line that does not parse, or no ``Gres`` line at all.
    """
    p = Path(path)
    text = read_text_file(p, what="slurmd -G output")
    found: list[tuple[int, GresDevice]] = []
    for no, raw in enumerate(text.splitlines(), 1):
        m = re.search(r"\bGres (Name=.*)$", raw)
        if not m:
            continue
        where = f"{p}:{no}"
        a = {k.lower(): v for k, v in _pairs(m.group(1), where)}

        def val(key: str, a: Mapping[str, str] = a) -> str | None:
            v = a.get(key)
            return None if v is None or v in ("(null)", "") else v

        index = _int(a.get("index", str(len(found))), where, "Index")
        cores = val("cores")
        links = val("links")
        found.append((index, GresDevice(
            a["name"], val("type"), val("file"),
            _index_list(cores, where, "Cores") if cores else None,
            _links(links, where) if links else None, where)))
    if not found:
        raise _err(f"{p}", "no 'Gres Name=...' line: expected what `slurmd -G` prints")
    return tuple(d for _, d in sorted(found, key=lambda t: t[0]))


# ------------------------------------------------------------------------- topology.conf
def parse_topology_conf(path: str | Path) -> tuple[ImportedSwitch, ...]:
    """Switches of a topology.conf (topology/tree), in file order."""
    p = Path(path)
    text = read_text_file(p, what="topology.conf")
    out = []
    for no, line in _logical_lines(text, str(p)):
        where = f"{p}:{no}"
        a: dict[str, str] = {}
        for k, v in _pairs(line, where):
            if k.lower() not in _TOPO_KEYS:
                raise _err(where, f"unknown topology.conf key '{k}'")
            a[k.lower()] = v
        if "switchname" not in a:
            raise _err(where, "a topology.conf line starts with SwitchName=")
        out.append(ImportedSwitch(
            name=a["switchname"],
            nodes=_hosts(a["nodes"], where, "Nodes") if "nodes" in a else (),
            switches=_hosts(a["switches"], where, "Switches") if "switches" in a else (),
            link_speed=_int(a["linkspeed"], where, "LinkSpeed") if "linkspeed" in a else None))
    return tuple(out)


# ------------------------------------------------------------------- nvidia-smi topo -m
def parse_topo_matrix(path: str | Path) -> TopoMatrix:
    """NVLink islands and NUMA domains from ``nvidia-smi topo -m`` output.

    The header row names ``GPU0 GPU1 ...`` (then NICs, ``CPU Affinity``, ``NUMA Affinity``);
    each ``GPU<i>`` row holds ``X`` for itself and ``NV#``, ``SYS``, ``NODE``, ``PHB``,
    ``PXB``, ``PIX`` or ``PXN`` per other device. Columns are tab-separated (runs of two or
    more blanks are accepted too); colour escapes are removed. An island is a connected
    component of ``NV#`` links; a GPU with none is an island of its own.
    """
    p = Path(path)
    text = _ANSI_RE.sub("", read_text_file(p, what="nvidia-smi topo -m output"))

    def cells(line: str) -> list[str]:
        parts = line.split("\t") if "\t" in line else re.split(r"\s{2,}", line)
        return [c.strip() for c in parts]

    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for no, line in enumerate(text.splitlines(), 1):
        if header is None:
            if re.search(r"(^|\s)GPU0(\s|$)", line):
                header = cells(line)
                if header and header[0] == "GPU0":
                    header = ["", *header]
            continue
        if not line.strip() or line.strip().startswith("Legend"):
            if rows:
                break
            continue
        row = cells(line)
        if re.fullmatch(r"GPU\d+", row[0]):
            rows.append((no, row))
    if header is None:
        raise _err(str(p), "no header row naming GPU0: expected `nvidia-smi topo -m` output")
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    n = len(gpu_cols)
    numa_col = next((i for i, h in enumerate(header) if h.lower() == "numa affinity"), None)
    if len(rows) != n:
        raise _err(str(p), f"the header names {n} GPUs but {len(rows)} GPU rows follow")
    adj: dict[int, set[int]] = {i: set() for i in range(n)}
    numa: list[int | None] = []
    for r, (no, row) in enumerate(rows):
        where = f"{p}:{no}"
        if row[0] != f"GPU{r}":
            raise _err(where, f"expected the row of GPU{r}, found {row[0]}")
        if len(row) < len(header) - 1:
            raise _err(where, f"{len(row)} columns, the header has {len(header)}")
        for g, col in enumerate(gpu_cols):
            cell = row[col] if col < len(row) else ""
            if not _TOPO_CELL_RE.match(cell):
                raise _err(where, f"'{cell}' (GPU{r} to GPU{g}) is not X, NV#, SYS, NODE, "
                           "PHB, PXB, PIX or PXN")
            if (cell == "X") != (g == r):
                raise _err(where, f"GPU{r} to GPU{g} is '{cell}'; X marks a GPU's own column")
            if cell.startswith("NV") and cell != "NODE":
                adj[r].add(g)
                adj[g].add(r)
        value = row[numa_col] if numa_col is not None and numa_col < len(row) else "N/A"
        if value.isdigit():
            numa.append(int(value))
        elif value in ("N/A", ""):
            numa.append(None)
        else:
            raise _err(where, f"NUMA Affinity '{value}' is not a number or N/A")
    return TopoMatrix(n, _components(adj), tuple(numa), str(p))


def _components(adj: Mapping[int, set[int]]) -> tuple[tuple[int, ...], ...]:
    """Connected components with two or more members, each sorted, by first member."""
    seen: set[int] = set()
    out = []
    for start in sorted(adj):
        if start in seen:
            continue
        stack, comp = [start], set()
        while stack:
            v = stack.pop()
            if v in comp:
                continue
            comp.add(v)
            stack += adj[v] - comp
        seen |= comp
        if len(comp) > 1:
            out.append(tuple(sorted(comp)))
    return tuple(out)


# ---------------------------------------------------------------------- offline builder
def read_conf_dir(conf_dir: str | Path) -> tuple[SlurmConf, Path]:
    """slurm.conf of ``conf_dir`` (following Include), or the three fragments ``site
    render`` writes when there is no slurm.conf."""
    d = Path(conf_dir)
    if not d.is_dir():
        raise SiteImportError("not a folder", file=str(d))
    if (d / "slurm.conf").exists():
        return parse_slurm_conf(d / "slurm.conf"), d
    present = [d / f for f in FRAGMENTS if (d / f).exists()]
    if not present:
        raise SiteImportError("no slurm.conf (nor hetslurm-*.conf fragments) here", file=str(d))
    conf = SlurmConf()
    for f in present:
        parse_slurm_conf(f, _conf=conf)
    return conf, d


def from_conf(conf_dir: str | Path, *, gres_conf: str | Path | None = None,
              gres_outputs: Sequence[tuple[str | None, str | Path]] = (),
              name: str | None = None) -> ImportedCluster:
    """Build the intermediate from a Slurm configuration folder.

    Reads ``slurm.conf`` (or the ``hetslurm-*.conf`` fragments), ``gres.conf`` (or
    ``gres_conf``) and ``topology.conf`` when present.
    """
    conf, d = read_conf_dir(conf_dir)
    nodes = _merge_nodes(conf.nodes)
    gres_path = Path(gres_conf) if gres_conf else d / "gres.conf"
    names_ = [n.name for n in nodes]
    devices: dict[str, tuple[GresDevice, ...]] = {}
    sources = [*conf.files]
    if gres_conf is not None or gres_path.exists():
        devices = parse_gres_conf(gres_path, names_)
        sources.append(str(gres_path))
    devices.update(apply_gres_outputs(gres_outputs, nodes))
    sources += [str(f) for _, f in gres_outputs]
    switches: tuple[ImportedSwitch, ...] = ()
    if (d / "topology.conf").exists():
        switches = parse_topology_conf(d / "topology.conf")
        sources.append(str(d / "topology.conf"))
    g = conf.globals
    notes: list[tuple[tuple[str, ...], str]] = []
    dist = None
    if "selecttypeparameters" in g:
        dist = "block" if "CR_CORE_DEFAULT_DIST_BLOCK" in g["selecttypeparameters"].upper() \
            else "cyclic"
    dmpc = None
    if "defmempercpu" in g:
        dmpc = _memory(g["defmempercpu"], conf.files[0], "DefMemPerCPU")
    return ImportedCluster(
        name=name or g.get("clustername"), nodes=tuple(nodes),
        partitions=tuple(conf.partitions), switches=switches, devices=devices,
        def_mem_per_cpu=dmpc, core_distribution=dist, notes=tuple(notes),
        sources=tuple(sources))


def _merge_nodes(nodes: Iterable[ImportedNode]) -> list[ImportedNode]:
    """One record per node; a later line for the same node replaces the earlier one."""
    out: dict[str, ImportedNode] = {}
    for n in nodes:
        out[n.name] = n
    return list(out.values())


def apply_gres_outputs(outputs: Sequence[tuple[str | None, str | Path]],
                       nodes: Sequence[ImportedNode]) -> dict[str, tuple[GresDevice, ...]]:
    """Devices per node from ``slurmd -G`` files: ``(hostlist, file)`` applies to those
    nodes; ``(None, file)`` to every node whose gres counts match the file's devices."""
    out: dict[str, tuple[GresDevice, ...]] = {}
    for selector, path in outputs:
        devs = parse_gres_output(path)
        counts: dict[tuple[str, str | None], int] = {}
        for dv in devs:
            counts[(dv.name, dv.type)] = counts.get((dv.name, dv.type), 0) + 1
        if selector:
            targets = _hosts(selector, str(path), "--gres-output")
            unknown = [t for t in targets if t not in {n.name for n in nodes}]
            if unknown:
                raise SiteImportError(f"--gres-output {selector}={path}: node '{unknown[0]}' "
                                      "is not a node of the cluster")
        else:
            targets = tuple(n.name for n in nodes
                            if {k: v for k, v in n.gres.items() if k[0] in DEVICE_KINDS}
                            == {k: v for k, v in counts.items() if k[0] in DEVICE_KINDS})
            if not targets:
                raise SiteImportError(f"{path}: no node has exactly these devices "
                                      f"({_counts_text(counts)}); name the nodes with "
                                      f"--gres-output NODES={path}")
        for t in targets:
            out[t] = devs
    return out


def _counts_text(counts: Mapping[tuple[str, str | None], int]) -> str:
    return ",".join(f"{k[0]}:{k[1]}:{v}" if k[1] else f"{k[0]}:{v}"
                    for k, v in sorted(counts.items(), key=str)) or "none"


# ----------------------------------------------------------------------- site drafting
@dataclass
class SiteDraft:
    """A site file as data plus its ``# guessed:`` comments (key path → reasons)."""

    data: dict[str, Any]
    guessed: dict[tuple[str, ...], list[str]] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)

    def guess(self, path: tuple[str, ...], why: str) -> None:
        self.guessed.setdefault(path, [])
        if why not in self.guessed[path]:
            self.guessed[path].append(why)


def draft_site(cluster: ImportedCluster,
               topo: Sequence[tuple[str | None, TopoMatrix]] = ()) -> SiteDraft:
    """Turn the intermediate into a site file's data.

    ``topo``: ``(selector, matrix)``, the selector a GPU model or a hostlist of nodes (None:
    every GPU node whose GPU count equals the matrix's).

    Raises:
        SiteImportError: the cluster cannot be a site (a node with two GPU models, devices in
            gres.conf that disagree with the node's Gres=, no nodes).
    """
    draft = SiteDraft({"schema_version": 1})
    for path, why in cluster.notes:
        draft.guess(path, why)
    if not cluster.nodes:
        raise SiteImportError("the cluster has no nodes")
    draft.header = ["Imported by `hetslurm site import` from " + ", ".join(cluster.sources)
                    if cluster.sources else "Imported by `hetslurm site import`",
                    "Check every '# guessed:' line before using this file."]
    cname = (cluster.name or "").lower()
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", cname):
        fixed = re.sub(r"[^a-z0-9_-]", "-", cname)[:40].strip("-")
        fixed = fixed if fixed[:1].isalpha() else "imported"
        draft.guess(("name",), f"ClusterName {cluster.name!r} unusable as a site name"
                    if cluster.name else "no ClusterName found")
        cname = fixed
    draft.data["name"] = cname

    # Per node: its class's attributes.
    node_attrs: dict[str, tuple[Any, ...]] = {}
    class_data: dict[tuple[Any, ...], dict[str, Any]] = {}
    class_guess: dict[tuple[Any, ...], list[tuple[tuple[str, ...], str]]] = {}
    models: dict[str, dict[str, list[int]]] = {"gpu": {}, "fpga": {}}
    feature_drops: list[str] = []
    class_files: dict[tuple[Any, ...], dict[str, dict[str, str]]] = {}
    for node in cluster.nodes:
        data, guesses, dropped = _node_class(node, cluster.devices.get(node.name, ()), topo)
        feature_drops += dropped
        # Device files join a class afterwards: nodes that differ only in them (the
        # testbed's per-node emulated devices) stay one class.
        files = {k: data[k].pop("files") for k in ("gpus", "fpgas")
                 if data.get(k) and "files" in data[k]}
        key = _freeze(data)
        node_attrs[node.name] = key
        class_data.setdefault(key, data)
        class_files.setdefault(key, {})[node.name] = files
        class_guess.setdefault(key, [])
        for g in guesses:
            if g not in class_guess[key]:
                class_guess[key].append(g)
        for kind in DEVICE_KINDS:
            group = data.get(f"{kind}s")
            if group:
                models[kind].setdefault(group["model"], []).extend(
                    [node.weight] if node.weight is not None else [])

    # Scheduling: model order from the live weights (lowest weight is allocated first).
    sched: dict[str, Any] = {}
    for kind in DEVICE_KINDS:
        weights = models[kind]
        order = sorted(weights, key=lambda m: (min(weights[m], default=WEIGHT_GPU_BASE), m))
        if len(order) > 1:
            sched[f"{kind}_model_order"] = order
    if cluster.def_mem_per_cpu:
        sched["def_mem_per_cpu"] = cluster.def_mem_per_cpu
    if cluster.core_distribution:
        sched["core_distribution"] = cluster.core_distribution
    if sched:
        draft.data["scheduling"] = sched

    # Classes, named after what they hold.
    class_names: dict[tuple[Any, ...], str] = {}
    used: set[str] = set()
    for key, data in class_data.items():
        base = _class_name(data)
        name, i = base, 2
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        class_names[key] = name
    classes: dict[str, Any] = {}
    for key, data in class_data.items():
        cn = class_names[key]
        classes[cn] = data
        for group in ("gpus", "fpgas"):
            if not data.get(group):
                continue
            per_node = {n: f.get(group) for n, f in class_files[key].items()}
            distinct = set(per_node.values())
            if len(distinct) == 1:
                only = distinct.pop()
                if only is not None:
                    data[group]["files"] = only
            else:
                example = ", ".join(f"{n}: {f or 'default'}" for n, f in
                                    list(per_node.items())[:2])
                draft.guess(("node_classes", cn, group, "files"),
                            f"device files differ between the nodes of this class ({example}"
                            ", ...); the drivers' default names are written (split the class "
                            "to keep them)")
        for path, why in class_guess[key]:
            draft.guess(("node_classes", cn, *path), why)
        draft.guess(("node_classes", cn),
                    "power figures are not in Slurm's configuration; left at 0 (set "
                    "power_idle_watts/power_busy_watts for [levers] weights)")
    draft.data["node_classes"] = classes
    for f in dict.fromkeys(feature_drops):
        draft.guess(("nodes",), f"feature '{f}' dropped: {names.model_name_problem(f)}")

    # Weights the site will render, against the ones read.
    gpu_order = _full_order(sched.get("gpu_model_order", []), models["gpu"])
    fpga_order = _full_order(sched.get("fpga_model_order", []), models["fpga"])
    off: list[str] = []
    for node in cluster.nodes:
        data = class_data[node_attrs[node.name]]
        want = _band_weight(data, gpu_order, fpga_order)
        if node.weight is not None and node.weight != want:
            off.append(f"{node.name} {node.weight}->{want}")
    if off:
        draft.guess(("nodes",), "Weight= is rendered from hetslurm's bands (CPU 1, FPGA 10+, "
                    f"GPU 100+ by model order), not copied: {', '.join(off[:6])}"
                    + (" ..." if len(off) > 6 else ""))

    # Nodes: consecutive nodes of one class share a hostlist entry.
    entries: list[tuple[list[str], str]] = []
    for node in cluster.nodes:
        cn = class_names[node_attrs[node.name]]
        if entries and entries[-1][1] == cn:
            entries[-1][0].append(node.name)
        else:
            entries.append(([node.name], cn))
    draft.data["nodes"] = {_hostlist(ns): cn for ns, cn in entries}

    all_nodes = [n.name for n in cluster.nodes]
    parts: dict[str, Any] = {}
    ranked = _ranked_partitions(cluster)
    for p in cluster.partitions:
        if p.name in ranked:
            draft.guess(("partitions",), f"partition {p.name} not kept: it is {ranked[p.name]}'s "
                        "per-model partition of ranked fallback, which hetslurm renders from "
                        "the site (docs/fallback.md)")
            continue
        parts[p.name] = _partition(p, all_nodes, draft)
    if parts:
        draft.data["partitions"] = parts
    if cluster.switches:
        sws: dict[str, Any] = {}
        for s in cluster.switches:
            sw: dict[str, Any] = {}
            if s.nodes:
                sw["nodes"] = hostlist.collect_hostlist(list(s.nodes))
            if s.switches:
                sw["switches"] = list(s.switches)
            if s.link_speed:
                sw["link_speed"] = s.link_speed
            sws[s.name] = sw
        draft.data["switches"] = sws
    return draft


def _full_order(order: Sequence[str], present: Iterable[str]) -> list[str]:
    return [*order, *sorted(set(present) - set(order))]


def _band_weight(data: Mapping[str, Any], gpu_order: Sequence[str],
                 fpga_order: Sequence[str]) -> int:
    if data.get("gpus"):
        return WEIGHT_GPU_BASE + WEIGHT_STEP * list(gpu_order).index(data["gpus"]["model"])
    if data.get("fpgas"):
        return WEIGHT_FPGA_BASE + WEIGHT_STEP * list(fpga_order).index(data["fpgas"]["model"])
    return WEIGHT_CPU


def _hostlist(names_: list[str]) -> str:
    expr: str = hostlist.collect_hostlist(names_)
    return expr if list(hostlist.expand_hostlist(expr)) == names_ else ",".join(names_)


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple((k, _freeze(v)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def _class_name(data: Mapping[str, Any]) -> str:
    parts = [f"{data[k]['model']}x{data[k]['count']}" for k in ("gpus", "fpgas") if data.get(k)]
    if parts:
        return "_".join(parts)
    return f"cpu{data['sockets'] * data['cores_per_socket'] * data.get('threads_per_core', 1)}"


def _node_class(node: ImportedNode, devices: Sequence[GresDevice],
                topo: Sequence[tuple[str | None, TopoMatrix]]
                ) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], str]], list[str]]:
    guesses: list[tuple[tuple[str, ...], str]] = []
    where = node.where or f"node {node.name}"
    sockets, cps, tpc = node.sockets, node.cores_per_socket, node.threads_per_core
    if not (sockets and cps):
        cpus = node.cpus or ((sockets or 1) * (cps or 1) * (tpc or 1))
        tpc = tpc or 1
        sockets = sockets or 1
        cps = max(cpus // (sockets * tpc), 1)
        guesses.append(((), f"no socket/core layout for {node.name}; {cpus} CPUs taken as "
                        f"{sockets} socket(s) x {cps} cores x {tpc} thread(s)"))
    tpc = tpc or 1
    if node.memory_mib is None:
        raise _err(where, f"node {node.name} has no RealMemory; a site needs each node's memory")
    data: dict[str, Any] = {"sockets": sockets, "cores_per_socket": cps}
    if tpc != 1:
        data["threads_per_core"] = tpc
    data["memory"] = node.memory_mib
    models: dict[str, str] = {}
    for (gname, gtype), count in node.gres.items():
        if gname not in DEVICE_KINDS:
            guesses.append(((), f"gres '{gname}' of {node.name} is not imported (only gpu "
                            "and fpga are modelled; shards and MIG are [levers])"))
            continue
        if gname in models:
            raise _err(where, f"node {node.name} has two {gname} types ({models[gname]}, "
                       f"{gtype}); a site node class holds one model per device kind")
        model = gtype
        if model is None:
            model = f"unknown_{gname}"
            guesses.append(((f"{gname}s", "model"), f"Gres={gname}:{count} has no type"))
        elif names.model_name_problem(model):
            fixed = re.sub(r"[^a-z0-9_]", "_", model.lower())[:31]
            fixed = fixed if fixed[:1].isalpha() else f"m{fixed}"[:31]
            guesses.append(((f"{gname}s", "model"), f"gres type '{model}' renamed to "
                            f"'{fixed}' ({names.model_name_problem(model)})"))
            model = fixed
        models[gname] = model
    for kind in DEVICE_KINDS:
        if kind not in models:
            continue
        count = sum(c for (gname, _), c in node.gres.items() if gname == kind)
        devs = [d for d in devices if d.name == kind]
        group, g_guess = _device_group(node, kind, models[kind], count, devs, data, topo)
        data[f"{kind}s"] = group
        guesses += [((f"{kind}s", *p), w) for p, w in g_guess]
    feats = []
    dropped = []
    auto = {"gpu", "fpga", "cpu", *models.values()}
    for f in node.features:
        if f in auto or f in feats:
            continue
        if names.model_name_problem(f):
            dropped.append(f)
        else:
            feats.append(f)
    if feats:
        data["features"] = feats
    return data, guesses, dropped


def _device_group(node: ImportedNode, kind: str, model: str, count: int,
                  devs: Sequence[GresDevice], cls: Mapping[str, Any],
                  topo: Sequence[tuple[str | None, TopoMatrix]]
                  ) -> tuple[dict[str, Any], list[tuple[tuple[str, ...], str]]]:
    guesses: list[tuple[tuple[str, ...], str]] = []
    group: dict[str, Any] = {"model": model, "count": count}
    if devs and len(devs) != count:
        raise _err(devs[0].where, f"names {len(devs)} {kind} devices for {node.name}, whose "
                   f"Gres= has {count}")
    sockets, cps = cls["sockets"], cls["cores_per_socket"]
    total = sockets * cps
    files = [d.file for d in devs]
    default_files = [f"{DEFAULT_FILE_STEM[kind]}{i}" for i in range(count)]
    if devs and all(files) and files != default_files:
        group["files"] = _hostlist([str(f) for f in files])
    islands: tuple[tuple[int, ...], ...] = ()
    numa: list[int] | None = None
    numa_nodes = sockets
    matrix = _topo_for(node, kind, model, count, topo)
    links = [d.links for d in devs]
    if kind == "gpu" and matrix is not None:
        islands = matrix.islands
    elif kind == "gpu" and devs and all(links):
        adj: dict[int, set[int]] = {i: set() for i in range(count)}
        for i, row in enumerate(links):
            assert row is not None
            if len(row) != count:
                raise _err(devs[i].where, f"Links= has {len(row)} entries for {count} devices")
            for j, v in enumerate(row):
                if j != i and v > 0:
                    adj[i].add(j)
                    adj[j].add(i)
        islands = _components(adj)
    elif kind == "gpu" and count > 1:
        guesses.append((("nvlink_islands",), "NVLink islands unknown (no Links= in gres.conf "
                        "or slurmd -G output, no --topo); every GPU is its own island"))
    if islands:
        group["nvlink_islands"] = [list(i) for i in islands]
    cores = [d.cores for d in devs]
    if matrix is not None and all(v is not None for v in matrix.numa):
        numa = [int(v) for v in matrix.numa if v is not None]
        numa_nodes = max(sockets, max(numa) + 1)
        if total % numa_nodes:
            guesses.append((("numa",), f"--topo {matrix.where} gives NUMA domains "
                            f"0-{max(numa)}, which do not split {total} cores evenly"))
            numa = [min(v * sockets // numa_nodes, sockets - 1) for v in numa]
            numa_nodes = sockets
    elif devs and all(cores):
        found = _numa_from_cores([tuple(c) for c in cores if c is not None], sockets, total)
        if found is None:
            per = total // sockets
            numa = [min(min(c or (0,)) // per, sockets - 1) for c in cores]
            guesses.append((("numa",), "Cores= of some device is not one whole NUMA domain; "
                            "each device put on the domain of its first core (rendered "
                            "Cores= will be whole domains)"))
        else:
            numa_nodes, numa = found
            guesses.append((("numa",), "NUMA domain of each device read from its Cores= "
                            "range (Slurm does not store NUMA domains)"))
    else:
        guesses.append((("numa",), "NUMA placement unknown (no Cores= and no NUMA Affinity "
                        "from --topo); devices are spread evenly over NUMA domains"))
    if numa is not None:
        spec = NodeClass(sockets=sockets, cores_per_socket=cps, numa_nodes=numa_nodes,
                         memory=1, gpus=DeviceGroup(model=model, count=count,
                                                    nvlink_islands=islands))
        default = [d.numa for d in place_devices(spec, "gpu")]
        if numa != default:
            group["numa"] = numa
    if numa_nodes != sockets:
        group["_numa_nodes"] = numa_nodes
    return group, guesses


def _numa_from_cores(cores: Sequence[tuple[int, ...]], sockets: int,
                     total: int) -> tuple[int, list[int]] | None:
    """(numa_nodes, domain per device) such that every device's cores are exactly one
    domain, trying one domain per socket first."""
    candidates = [sockets, *(n for n in range(1, min(total, 64) + 1)
                             if n != sockets and total % n == 0)]
    for n in candidates:
        if total % n:
            continue
        per = total // n
        out = []
        for c in cores:
            d = c[0] // per if c else -1
            if d < 0 or d >= n or tuple(c) != tuple(range(d * per, (d + 1) * per)):
                break
            out.append(d)
        else:
            return n, out
    return None


def _topo_for(node: ImportedNode, kind: str, model: str, count: int,
              topo: Sequence[tuple[str | None, TopoMatrix]]) -> TopoMatrix | None:
    if kind != "gpu":
        return None
    for selector, m in topo:
        if selector is None:
            hit = m.gpus == count
        elif selector == model:
            hit = True
        else:
            try:
                hit = node.name in hostlist.expand_hostlist(selector)
            except hostlist.BadHostlist:
                hit = False
        if hit:
            if m.gpus != count:
                raise _err(m.where, f"the matrix has {m.gpus} GPUs, node {node.name} has "
                           f"{count}")
            return m
    return None


def _ranked_partitions(cluster: ImportedCluster) -> dict[str, str]:
    """Partitions that are hetslurm's own per-model partitions (``<base>_<model>`` over the
    base partition's nodes of that GPU model), each with its base's name."""
    model_of = {n.name: t for n in cluster.nodes for (g, t) in n.gres if g == "gpu" and t}
    everyone = [n.name for n in cluster.nodes]
    out: dict[str, str] = {}
    for base in cluster.partitions:
        members = everyone if base.nodes is None else base.nodes
        for model in sorted({model_of[n] for n in members if n in model_of}):
            want = tuple(n for n in members if model_of.get(n) == model)
            for p in cluster.partitions:
                if p.name == f"{base.name}_{model}" and p.nodes == want:
                    out[p.name] = base.name
    return out


def _partition(p: ImportedPartition, all_nodes: Sequence[str], draft: SiteDraft
               ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if p.nodes is None:
        out["nodes"] = "ALL"
    else:
        unknown = [n for n in p.nodes if n not in set(all_nodes)]
        if unknown:
            raise _err(p.where, f"partition {p.name} names node '{unknown[0]}', which no "
                       "NodeName line defines")
        out["nodes"] = _hostlist(list(p.nodes)) if p.nodes else ""
        if not p.nodes:
            raise _err(p.where, f"partition {p.name} has no nodes; a site partition needs some")
    if p.default:
        out["default"] = True
    if p.max_time and p.max_time.upper() != "UNLIMITED":
        out["max_time"] = p.max_time
    if p.default_time:
        out["default_time"] = p.default_time
    if p.state and p.state.upper() != "UP":
        draft.guess(("partitions", p.name), f"State={p.state} not kept: a site renders every "
                    "partition State=UP")
    opts = {}
    for k, v in p.options.items():
        if not re.fullmatch(r"[A-Za-z]+", k) or not re.fullmatch(r"[^\s#]+", v):
            draft.guess(("partitions", p.name), f"option {k}={v!r} not kept (a site option "
                        "is letters = a value without blanks or '#')")
            continue
        opts[k] = v
    if opts:
        out["options"] = opts
    return out


# ---------------------------------------------------------------------------- writers
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _clean(data: Any) -> Any:
    """The draft's data without the private ``_numa_nodes`` marker (moved to its class)."""
    if isinstance(data, dict):
        return {k: _clean(v) for k, v in data.items() if not k.startswith("_")}
    return data


def _with_numa_nodes(data: dict[str, Any]) -> dict[str, Any]:
    out = dict(data)
    classes = {}
    for cn, c in data.get("node_classes", {}).items():
        c2 = dict(c)
        for kind in DEVICE_KINDS:
            g = c.get(f"{kind}s")
            if g and "_numa_nodes" in g:
                c2.setdefault("numa_nodes", g["_numa_nodes"])
        order = ["sockets", "cores_per_socket", "threads_per_core", "numa_nodes", "memory",
                 "features", "gpus", "fpgas"]
        classes[cn] = {k: c2[k] for k in order if k in c2}
    if classes:
        out["node_classes"] = classes
    cleaned: dict[str, Any] = _clean(out)
    return cleaned


def site_data(draft: SiteDraft) -> dict[str, Any]:
    """The site file as plain data (what the TOML holds)."""
    return _with_numa_nodes(draft.data)


def to_toml(draft: SiteDraft) -> str:
    """The site file as TOML, with ``# guessed:`` comments above what was assumed."""
    data = site_data(draft)
    lines = [f"# {h}" for h in draft.header]
    printed = _printed_paths(data)
    # A guess about a key the file leaves out (islands it could not find) goes above the
    # nearest table or key that is written.
    placed: dict[tuple[str, ...], list[str]] = {}
    for path, whys in draft.guessed.items():
        at = path
        while at and at not in printed:
            at = at[:-1]
        placed.setdefault(at or ("name",), []).extend(whys)

    def comments(path: tuple[str, ...]) -> list[str]:
        return [f"# guessed: {why}" for why in placed.get(path, [])]

    for k in ("schema_version", "name"):
        lines += comments((k,))
        lines.append(f"{k} = {_value(data[k])}")

    def table(path: tuple[str, ...], body: Mapping[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict) or k == "options"}
        subs = {k: v for k, v in body.items() if isinstance(v, dict) and k != "options"}
        lines.append("")
        lines.extend(comments(path))
        lines.append("[" + ".".join(_key(p) for p in path) + "]")
        for k, v in scalars.items():
            lines.extend(comments((*path, k)))
            lines.append(f"{_key(k)} = {_value(v)}")
        for k, v in subs.items():
            table((*path, k), v)

    if "scheduling" in data:
        table(("scheduling",), data["scheduling"])
    for cn, c in data["node_classes"].items():
        table(("node_classes", cn), c)
    table(("nodes",), data["nodes"])
    for pn, p in data.get("partitions", {}).items():
        table(("partitions", pn), p)
    for sn, s in data.get("switches", {}).items():
        table(("switches", sn), s)
    return "\n".join(lines) + "\n"


def _printed_paths(data: Mapping[str, Any], base: tuple[str, ...] = ()
                   ) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for k, v in data.items():
        out.add((*base, k))
        if isinstance(v, dict) and k != "options":
            out |= _printed_paths(v, (*base, k))
    return out


def to_json(draft: SiteDraft) -> str:
    """The same site as JSON, with the guesses as a list (for scripts; ``site check`` reads
    TOML)."""
    doc = {"site": site_data(draft),
           "guessed": [{"key": ".".join(p), "why": w}
                       for p, ws in draft.guessed.items() for w in ws]}
    return json.dumps(doc, indent=2) + "\n"


def validate(text: str, label: str) -> None:
    """Raise :class:`SiteImportError` unless ``text`` loads as a site (``site check``'s
    rules)."""
    from hetslurm.site.load import parse_site

    try:
        parse_site(text, label)
    except ConfigError as exc:
        raise SiteImportError(f"the imported site is not valid: {exc}") from exc


# ---------------------------------------------------------------- comparing two clusters
def conf_view(conf_dir: str | Path, *, files: bool = True,
              partition_keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Nodes, gres and partitions of a Slurm configuration folder, normalised so two
    folders that configure the same cluster compare equal: hostlists expanded, keys sorted,
    times in seconds, ``Nodes=ALL`` expanded, ``Links=`` reduced to linked or not.

    Runtime parts are left out: ``NodeAddr``, ``Port``, ``State`` of nodes (and, with
    ``files=False``, the device files, which the testbed emulates per node).
    ``partition_keys``: compare only these partition keys (lower-case; default all).
    """
    conf, d = read_conf_dir(conf_dir)
    nodes = _merge_nodes(conf.nodes)
    names_ = [n.name for n in nodes]
    devices = parse_gres_conf(d / "gres.conf", names_) if (d / "gres.conf").exists() else {}
    view_nodes = {}
    for n in nodes:
        view_nodes[n.name] = {
            "cpus": n.cpus, "sockets": n.sockets, "cores_per_socket": n.cores_per_socket,
            "threads_per_core": n.threads_per_core or 1, "memory_mib": n.memory_mib,
            "gres": sorted(f"{k[0]}:{k[1]}:{v}" for k, v in n.gres.items()),
            "features": sorted(n.features), "weight": n.weight if n.weight is not None else 1}
    view_gres = {}
    for node, devs in devices.items():
        view_gres[node] = [
            {"name": dv.name, "type": dv.type, "file": dv.file if files else None,
             "cores": list(dv.cores or ()),
             "links": [min(x, 1) if x >= 0 else -1 for x in dv.links] if dv.links else None}
            for dv in devs]
    keep = {k.lower() for k in partition_keys} if partition_keys is not None else None
    view_parts = {}
    for p in conf.partitions:
        attrs: dict[str, Any] = {
            "nodes": sorted(names_ if p.nodes is None else p.nodes),
            "default": p.default, "maxtime": _seconds(p.max_time or "UNLIMITED"),
            "defaulttime": _seconds(p.default_time) if p.default_time else None,
            **{k.lower(): v for k, v in p.options.items()}}
        if keep is not None:
            attrs = {k: v for k, v in attrs.items() if k in keep}
        view_parts[p.name] = attrs
    return {"nodes": view_nodes, "gres": view_gres, "partitions": view_parts}


def view_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Lines naming each node, gres block or partition where two :func:`conf_view` differ."""
    out = []
    for part in ("nodes", "gres", "partitions"):
        left, right = a.get(part, {}), b.get(part, {})
        for name in sorted(set(left) | set(right)):
            if left.get(name) != right.get(name):
                out.append(f"{part} {name}: {left.get(name)!r} != {right.get(name)!r}")
    return out


def _seconds(text: str) -> int | str:
    t = text.strip().upper()
    if t in ("UNLIMITED", "INFINITE"):
        return "UNLIMITED"
    days = 0
    if "-" in t:
        d, _, t = t.partition("-")
        days = int(d)
        nums = [int(x) for x in t.split(":")] + [0, 0]
        return days * 86400 + nums[0] * 3600 + nums[1] * 60 + nums[2]
    nums = [int(x) for x in t.split(":")]
    if len(nums) == 3:
        return nums[0] * 3600 + nums[1] * 60 + nums[2]
    return nums[0] * 60 + (nums[1] if len(nums) == 2 else 0)



#: The writers' TOML key and value, for other writers of site-file text (``learn speeds``).
toml_key = _key
toml_value = _value
