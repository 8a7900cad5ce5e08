"""Load a site file: TOML → strict schema → cross-checks → resolved :class:`Site`.

Every problem becomes one :class:`hetslurm.errors.ConfigError` naming the file, the dotted
key and the line it was written on. The first problem (in file order) is reported; fixing
files one error at a time is what admins do with slurm.conf too.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import hostlist
from pydantic import BaseModel, TypeAdapter, ValidationError

from hetslurm import fsguard
from hetslurm.errors import ConfigError
from hetslurm.site import levers as site_levers
from hetslurm.site import names
from hetslurm.site.locate import KeyPath, LineIndex
from hetslurm.site.model import (
    NodeSpec,
    RankedPartition,
    ResolvedPartition,
    Site,
    class_features,
    class_nodes,
    class_weight,
    place_devices,
    ranked_name,
)
from hetslurm.site.schema import SCHEMA_VERSION, SECTIONS, DeviceGroup, Levers, NodeClass, SiteFile
from hetslurm.textfile import read_text_file

MAX_NODES = 100_000
_TIME_RE = re.compile(r"^(UNLIMITED|INFINITE|(\d+-)?\d+(:\d{1,2}){0,2})$")


class _Ctx:
    """Turns a key path into a ConfigError with file and line."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.index = LineIndex(text)

    def error(self, key: KeyPath, message: str) -> ConfigError:
        return ConfigError(
            message, file=self.path, key=_dotted(key), line=self.index.line_of(key)
        )


def _dotted(key: Sequence[str | int]) -> str:
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            s = str(part)
            if not re.fullmatch(r"[A-Za-z0-9_-]+", s):
                s = f'"{s}"'
            out += ("." if out else "") + s
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ``did you mean 'x'?`` suffix, or an empty string when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def load_site(path: str | Path) -> Site:
    """Read, validate and resolve a site file.

    Raises:
        ConfigError: the file is unreadable, not UTF-8 text, not TOML, or breaks a rule; the
            message names the file, key and line.
    """
    p = Path(path)
    return parse_site(read_text_file(p, what="site file"), str(p))


def load_site_as_root(path: str | Path) -> Site:
    """:func:`load_site` for a command that acts on the cluster (``rebalance``, ``act``);
    see :func:`read_site_as_root`."""
    return parse_site(read_site_as_root(path), str(path))


def read_site_as_root(path: str | Path) -> str:
    """The text of a site file that steers a run acting on the cluster.

    Running as root, the file (a symlink is followed to it) must be owned by root and
    writable by nobody else: otherwise whoever can write it chooses what root requeues,
    which lock file root writes and which folders it reads (:mod:`hetslurm.fsguard`).
    Another user's run acts with that user's rights only, and is not checked.

    Raises:
        PermissionsError: running as root, the file is writable by group or others or owned
            by another user.
        ConfigError: the file cannot be read or is not UTF-8 text.
    """
    p = Path(path)
    try:
        if os.geteuid() == 0:
            data = fsguard.read_checked(os.path.realpath(p), "site file", trusted=(0,))
        else:
            data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read site file: {exc.strerror}", file=str(p)) from exc
    from hetslurm.textfile import decode_text

    return decode_text(data, what="site file", file=str(p))


def parse_site(text: str, path: str = "<site>") -> Site:
    """Like :func:`load_site` on text already read (``path`` only labels errors)."""
    ctx = _Ctx(path, text)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise ConfigError(
            f"not valid TOML: {exc}", file=path, line=int(m.group(1)) if m else None
        ) from exc
    except RecursionError as exc:
        # tomllib parses nested arrays and inline tables recursively; a site file has no
        # reason to nest more than a few levels.
        raise ConfigError("not valid TOML: arrays or inline tables nested too deeply",
                          file=path) from exc

    version = raw.get("schema_version")
    if version is None:
        raise ConfigError(
            f"missing 'schema_version' (this hetslurm reads schema_version = {SCHEMA_VERSION})",
            file=path,
            key="schema_version",
            line=1,
        )
    if version != SCHEMA_VERSION:
        raise ctx.error(
            ("schema_version",),
            f"schema_version {version!r} is not supported; this hetslurm reads "
            f"{SCHEMA_VERSION}",
        )

    sections: dict[str, Any] = {}
    core = dict(raw)
    for name, (type_, default) in SECTIONS.items():
        if name in core:
            sections[name] = _validate(ctx, TypeAdapter(type_), core.pop(name), (name,), type_)
        else:
            sections[name] = default
    known = list(SiteFile.model_fields) + list(SECTIONS)
    for key in core:
        if key not in SiteFile.model_fields:
            raise ctx.error((key,), f"unknown key '{key}'{did_you_mean(key, known)}")
    model: SiteFile = _validate(ctx, TypeAdapter(SiteFile), core, (), SiteFile)
    return _resolve(ctx, model, sections)


def _validate(ctx: _Ctx, adapter: TypeAdapter[Any], data: Any, base: KeyPath, type_: Any) -> Any:
    try:
        return adapter.validate_python(data)
    except ValidationError as exc:
        errs = exc.errors()
        locs = [_data_loc(data, e["loc"], e["type"]) for e in errs]
        # Report the problem written first in the file; a missing key only after the rest,
        # because a misspelled key causes both and "did you mean" is the useful message.
        order = sorted(range(len(errs)), key=lambda i: (
            errs[i]["type"] == "missing", ctx.index.line_of((*base, *locs[i])) or 0))
        first, rel = errs[order[0]], locs[order[0]]
        loc: KeyPath = (*base, *rel)
        if first["type"] == "extra_forbidden":
            bad = str(loc[-1])
            allowed = _fields_at(type_, rel[:-1])
            msg = f"unknown key '{bad}'{did_you_mean(bad, allowed)}"
        elif first["type"] == "missing":
            msg = f"required key '{loc[-1]}' is missing"
        else:
            msg = _humanise(first)
        raise ctx.error(loc, msg) from None


def _data_loc(data: Any, loc: Sequence[str | int], err_type: str) -> KeyPath:
    """The part of a pydantic error location that names keys of the file.

    pydantic inserts the tried union member (``int``, ``DeviceGroup``,
    ``function-before[...]``) into locations. A name test cannot tell those from keys a
    user wrote (``MaxNodes`` in partition options, a partition called ``GPU``), so walk
    the data instead: a part is a key when the data holds it, or when it is the last part
    of a "missing" error.
    """
    out: list[str | int] = []
    cur = data
    for i, part in enumerate(loc):
        in_dict = isinstance(cur, dict) and part in cur
        in_list = isinstance(cur, list | tuple) and isinstance(part, int) and 0 <= part < len(cur)
        if in_dict or in_list:
            out.append(part)
            cur = cur[part]
        elif err_type == "missing" and i == len(loc) - 1 and isinstance(cur, dict):
            out.append(part)
    return tuple(out)


def _humanise(err: Any) -> str:
    msg = str(err["msg"])
    value = err.get("input")
    if err["type"] in {"int_type", "float_type", "string_type", "bool_type", "tuple_type",
                       "dict_type", "model_type", "list_type"}:
        return f"{msg} (got {value!r})"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return msg


def _fields_at(type_: Any, loc: KeyPath) -> list[str]:
    """Keys a mapping at ``loc`` inside ``type_`` may hold, for 'did you mean' hints."""
    t = type_
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            if isinstance(part, str) and part in t.model_fields:
                t = t.model_fields[part].annotation
                continue
            return []
        origin = get_origin(t)
        if origin is dict:
            t = get_args(t)[1]
        elif origin is tuple or origin is list:
            t = get_args(t)[0]
        else:
            return []
    t = _unwrap(t)
    if isinstance(t, type) and issubclass(t, BaseModel):
        return list(t.model_fields)
    return []


def _unwrap(t: Any) -> Any:
    args = [a for a in get_args(t) if a is not type(None)]
    if get_origin(t) is not None and get_origin(t).__name__ in {"Union", "UnionType"}:
        return args[0] if args else t
    if type(t).__name__ == "UnionType":
        return args[0] if args else t
    if get_origin(t).__class__.__name__ == "_AnnotatedAlias" or hasattr(t, "__metadata__"):
        return get_args(t)[0]
    return t


def _expand(ctx: _Ctx, key: KeyPath, expr: str) -> list[str]:
    try:
        hosts = [h for h in hostlist.expand_hostlist(expr) if h]
    except hostlist.BadHostlist as exc:
        raise ctx.error(key, f"'{expr}' is not a valid hostlist expression ({exc})") from None
    if not hosts:
        raise ctx.error(key, f"hostlist '{expr}' names no hosts")
    if len(hosts) > MAX_NODES:
        raise ctx.error(key, f"hostlist '{expr}' names {len(hosts)} hosts (at most {MAX_NODES})")
    return hosts


def _check_group(ctx: _Ctx, key: KeyPath, group: DeviceGroup, spec: NodeClass) -> None:
    problem = names.model_name_problem(group.model)
    if problem:
        raise ctx.error((*key, "model"), problem)
    seen: dict[int, int] = {}
    for i, island in enumerate(group.nvlink_islands):
        for g in island:
            if not 0 <= g < group.count:
                raise ctx.error(
                    (*key, "nvlink_islands"),
                    f"island {i} names GPU {g}, but the node has GPUs 0-{group.count - 1}",
                )
            if g in seen:
                raise ctx.error(
                    (*key, "nvlink_islands"), f"GPU {g} is in islands {seen[g]} and {i}"
                )
            seen[g] = i
    numa_nodes = spec.numa_nodes or spec.sockets
    if group.numa is not None:
        if len(group.numa) != group.count:
            raise ctx.error(
                (*key, "numa"),
                f"lists {len(group.numa)} NUMA domains for {group.count} devices",
            )
        for d in group.numa:
            if not 0 <= d < numa_nodes:
                raise ctx.error(
                    (*key, "numa"), f"NUMA domain {d} does not exist (0-{numa_nodes - 1})"
                )
    if (
        group.power_idle_watts is not None
        and group.power_busy_watts is not None
        and group.power_busy_watts < group.power_idle_watts
    ):
        raise ctx.error((*key, "power_busy_watts"), "busy power is below idle power")
    if group.files is not None:
        files = _expand(ctx, (*key, "files"), group.files)
        if len(files) != group.count:
            raise ctx.error(
                (*key, "files"), f"names {len(files)} device files for {group.count} devices"
            )


def _check_class(ctx: _Ctx, name: str, spec: NodeClass) -> None:
    key: KeyPath = ("node_classes", name)
    problem = names.ident_problem(name, "node class")
    if problem:
        raise ctx.error(key, problem)
    cores = spec.sockets * spec.cores_per_socket
    numa_nodes = spec.numa_nodes or spec.sockets
    if cores % numa_nodes:
        raise ctx.error(
            (*key, "numa_nodes"), f"{cores} cores do not split evenly into {numa_nodes} domains"
        )
    if spec.power_busy_watts < spec.power_idle_watts:
        raise ctx.error((*key, "power_busy_watts"), "busy power is below idle power")
    for feat in spec.features:
        problem = names.model_name_problem(feat)
        if problem:
            raise ctx.error((*key, "features"), problem.replace("gres type and ", ""))
    if spec.gpus:
        _check_group(ctx, (*key, "gpus"), spec.gpus, spec)
    if spec.fpgas:
        _check_group(ctx, (*key, "fpgas"), spec.fpgas, spec)
        if spec.fpgas.nvlink_islands:
            raise ctx.error((*key, "fpgas", "nvlink_islands"), "FPGAs have no NVLink islands")
    if spec.gpus and spec.fpgas and spec.gpus.model == spec.fpgas.model:
        raise ctx.error((*key, "fpgas", "model"), "an FPGA model cannot share a GPU model's name")


def _check_order(ctx: _Ctx, key: KeyPath, order: tuple[str, ...], present: set[str]) -> None:
    seen = set()
    for m in order:
        if m in seen:
            raise ctx.error(key, f"model '{m}' is listed twice")
        seen.add(m)
        if m not in present:
            raise ctx.error(
                key, f"model '{m}' is not in any node class{did_you_mean(m, present)}"
            )


def _resolve(ctx: _Ctx, f: SiteFile, sections: dict[str, Any]) -> Site:
    if not re.fullmatch(r"[a-z][a-z0-9_-]{0,39}", f.name):
        raise ctx.error(
            ("name",),
            "cluster name must be lowercase letters, digits, '_' or '-', starting with a "
            "letter, at most 40 characters (Slurm lowercases ClusterName)",
        )
    if not f.node_classes:
        raise ctx.error(("node_classes",), "no node classes defined")
    for cname, spec in f.node_classes.items():
        _check_class(ctx, cname, spec)
    gpu_present = {c.gpus.model for c in f.node_classes.values() if c.gpus}
    fpga_present = {c.fpgas.model for c in f.node_classes.values() if c.fpgas}
    if gpu_present & fpga_present:
        raise ctx.error(("node_classes",), "a model name is used for both a GPU and an FPGA")
    _check_order(ctx, ("scheduling", "gpu_model_order"), f.scheduling.gpu_model_order,
                 gpu_present)
    _check_order(ctx, ("scheduling", "fpga_model_order"), f.scheduling.fpga_model_order,
                 fpga_present)
    gpu_order = (*f.scheduling.gpu_model_order,
                 *sorted(gpu_present - set(f.scheduling.gpu_model_order)))
    fpga_order = (*f.scheduling.fpga_model_order,
                  *sorted(fpga_present - set(f.scheduling.fpga_model_order)))
    levers = _resolve_levers(ctx, sections, gpu_present, fpga_present)
    _check_mig(ctx, levers, f.node_classes, gpu_present | fpga_present)
    if levers is not None and levers.weight_from == "power_cost":
        # Power and cost rank the models; the site's written order must agree (or be absent).
        gpu_order, fpga_order, f = _levers_order(ctx, f, levers, gpu_order, fpga_order)

    # Nodes.
    if not f.nodes:
        raise ctx.error(("nodes",), "no nodes defined")
    node_class: dict[str, str] = {}
    order: list[str] = []
    for expr, cname in f.nodes.items():
        key: KeyPath = ("nodes", expr)
        if cname not in f.node_classes:
            raise ctx.error(
                key, f"unknown node class '{cname}'{did_you_mean(cname, f.node_classes)}"
            )
        for host in _expand(ctx, key, expr):
            if not names.NODE_RE.match(host):
                raise ctx.error(key, f"'{host}' is not a valid Slurm node name")
            if host in node_class:
                raise ctx.error(key, f"node '{host}' is defined twice")
            node_class[host] = cname
            order.append(host)
    if len(order) > MAX_NODES:
        raise ctx.error(("nodes",), f"{len(order)} nodes (at most {MAX_NODES})")

    # Partitions.
    partitions: dict[str, ResolvedPartition] = {}
    defaults = [n for n, p in f.partitions.items() if p.default]
    if len(defaults) > 1:
        raise ctx.error(("partitions", defaults[1], "default"),
                        f"partitions '{defaults[0]}' and '{defaults[1]}' are both default")
    for pname, part in f.partitions.items():
        key = ("partitions", pname)
        problem = names.ident_problem(pname, "partition")
        if problem:
            raise ctx.error(key, problem)
        if part.nodes == "ALL":
            pnodes = list(order)
        else:
            pnodes = _expand(ctx, (*key, "nodes"), part.nodes)
            for host in pnodes:
                if host not in node_class:
                    raise ctx.error((*key, "nodes"), f"node '{host}' is not defined in [nodes]")
        for tkey in ("max_time", "default_time"):
            val = getattr(part, tkey)
            if val is not None and not _TIME_RE.match(val):
                raise ctx.error((*key, tkey), f"'{val}' is not a Slurm time ([D-]HH:MM:SS, "
                                "minutes, or UNLIMITED)")
        for okey in part.options:
            if okey.lower() in {"nodes", "default", "maxtime", "defaulttime", "partitionname"}:
                raise ctx.error((*key, "options", okey), f"'{okey}' has its own key here")
            if okey.lower() == "state":
                # The renderer writes State=UP on every partition line.
                raise ctx.error((*key, "options", okey), "'State' is always rendered as UP")
            if not re.fullmatch(r"[A-Za-z]+", okey):
                raise ctx.error((*key, "options", okey), f"'{okey}' is not a Slurm option name")
            if not re.fullmatch(r"[^\s#]+", part.options[okey]):
                # A blank, newline or '#' would end the value inside slurm.conf and let the
                # rest become another option, another line or a comment.
                raise ctx.error((*key, "options", okey), f"value {part.options[okey]!r} must "
                                "not be empty or hold blanks, newlines or '#'")
        # Option order carries no meaning to Slurm; sort it so the rendered bytes (and the
        # site digest) do not depend on the order keys were written in.
        part = part.model_copy(update={"options": dict(sorted(part.options.items()))})
        partitions[pname] = ResolvedPartition(pname, part, tuple(pnodes))

    leaf_of = _check_switches(ctx, f, node_class)

    nodes = []
    for host in order:
        spec = f.node_classes[node_class[host]]
        nodes.append(
            NodeSpec(
                name=host,
                class_name=node_class[host],
                spec=spec,
                features=class_features(spec),
                weight=class_weight(spec, gpu_order, fpga_order),
                leaf_switch=leaf_of.get(host),
                gpus=place_devices(spec, "gpu"),
                fpgas=place_devices(spec, "fpga"),
            )
        )

    ranked = _ranked_partitions(ctx, f, partitions, nodes, gpu_order)
    _check_classes_section(ctx, sections.get("classes", {}), gpu_present | fpga_present,
                           partitions, nodes)
    _check_hook_section(ctx, sections.get("hook"), gpu_present)
    _check_levers_section(ctx, levers, nodes, partitions)
    _check_usage_section(ctx, sections.get("usage"), gpu_present)
    _check_stall_section(ctx, sections.get("stall"), partitions)
    _check_classify_section(ctx, sections.get("classify"), sections.get("classes", {}))
    return Site(
        path=ctx.path,
        name=f.name,
        description=f.description,
        scheduling=f.scheduling,
        node_classes=dict(f.node_classes),
        nodes=tuple(nodes),
        partitions=partitions,
        switches=dict(f.switches),
        sections=sections,
        ranked=ranked,
    )


def _ranked_partitions(ctx: _Ctx, f: SiteFile, partitions: dict[str, ResolvedPartition],
                       nodes: Sequence[NodeSpec], gpu_order: Sequence[str]
                       ) -> dict[str, RankedPartition]:
    """One overlapping partition per GPU model of every partition whose nodes hold two or
    more GPU models (``[scheduling] ranked_fallback = "partitions"``, docs/fallback.md)."""
    if f.scheduling.ranked_fallback != "partitions":
        return {}
    by_name = {n.name: n for n in nodes}
    out: dict[str, RankedPartition] = {}
    for pname, part in partitions.items():
        by_model: dict[str, list[str]] = {}
        for host in part.nodes:
            gpus = by_name[host].gpus
            if gpus:
                by_model.setdefault(gpus[0].model, []).append(host)
        if len(by_model) < 2:
            continue
        for model in sorted(by_model, key=list(gpu_order).index):
            name = ranked_name(pname, model)
            if name in partitions:
                raise ctx.error(("partitions", name),
                                f"partition '{name}' is the name hetslurm gives partition "
                                f"'{pname}''s {model} nodes for ranked fallback; rename it, or "
                                "set [scheduling] ranked_fallback = \"weights\"")
            out[name] = RankedPartition(name, pname, model, tuple(by_model[model]))
    return out


def _check_switches(ctx: _Ctx, f: SiteFile, node_class: dict[str, str]) -> dict[str, str]:
    leaf_of: dict[str, str] = {}
    parent: dict[str, str] = {}
    for sname, sw in f.switches.items():
        key: KeyPath = ("switches", sname)
        problem = names.ident_problem(sname, "switch")
        if problem:
            raise ctx.error(key, problem)
        if (sw.nodes is None) == (not sw.switches):
            raise ctx.error(key, "a switch lists either 'nodes' (a leaf) or 'switches', "
                            "exactly one of them")
        if sw.nodes is not None:
            for host in _expand(ctx, (*key, "nodes"), sw.nodes):
                if host not in node_class:
                    raise ctx.error((*key, "nodes"), f"node '{host}' is not defined in [nodes]")
                if host in leaf_of:
                    raise ctx.error((*key, "nodes"),
                                    f"node '{host}' is already under switch '{leaf_of[host]}'")
                leaf_of[host] = sname
        for child in sw.switches:
            if child not in f.switches:
                raise ctx.error((*key, "switches"),
                                f"unknown switch '{child}'{did_you_mean(child, f.switches)}")
            if child == sname:
                raise ctx.error((*key, "switches"), "a switch cannot contain itself")
            if child in parent:
                raise ctx.error((*key, "switches"),
                                f"switch '{child}' already hangs under '{parent[child]}'")
            parent[child] = sname
    for sname in f.switches:
        seen = {sname}
        cur = sname
        while cur in parent:
            cur = parent[cur]
            if cur in seen:
                # Name a switch on the cycle, not the (possibly innocent) one we started from.
                raise ctx.error(("switches", cur), f"the switch tree has a cycle through '{cur}'")
            seen.add(cur)
    if f.switches:
        missing = [h for h in node_class if h not in leaf_of]
        if missing:
            raise ctx.error(("switches",), f"node(s) {hostlist.collect_hostlist(missing)} are "
                            "under no leaf switch; Slurm's topology/tree would not use them")
        roots = [s for s in f.switches if s not in parent]
        if len(roots) > 1:
            raise ctx.error(("switches",), f"the tree has {len(roots)} roots ({', '.join(roots)})"
                            "; add a top switch so jobs may span them")
    return leaf_of


def _check_classes_section(ctx: _Ctx, classes: dict[str, Any], models: set[str],
                           partitions: dict[str, ResolvedPartition],
                           nodes: list[NodeSpec] | None = None) -> None:
    for cname, wc in classes.items():
        key: KeyPath = ("classes", cname)
        problem = names.ident_problem(cname, "workload class")
        if problem:
            raise ctx.error(key, problem)
        if "cpu" in wc.devices and len(wc.devices) > 1:
            raise ctx.error((*key, "devices"), "'cpu' (CPU-only nodes) cannot be mixed with "
                            "device models in one class")
        for dev in wc.devices:
            if dev != "cpu" and dev not in models:
                raise ctx.error((*key, "devices"), f"device type '{dev}' is not a model of "
                                f"this site{did_you_mean(dev, models | {'cpu'})}")
        if wc.partition is not None and wc.partition not in partitions:
            raise ctx.error((*key, "partition"), f"unknown partition '{wc.partition}'"
                            f"{did_you_mean(wc.partition, partitions)}")
        if wc.mem_per_node is not None and nodes is not None:
            _check_class_memory(ctx, key, wc, nodes, partitions)


def _check_class_memory(ctx: _Ctx, key: KeyPath, wc: Any, nodes: list[NodeSpec],
                        partitions: dict[str, ResolvedPartition]) -> None:
    """A class's default memory must fit one node it can run on: a larger one would leave
    every job of the class pending for ever (Slurm keeps a job no node can hold)."""
    allowed = set(partitions[wc.partition].nodes) if wc.partition is not None else None
    sizes = [n.spec.memory for n in class_nodes(nodes, wc.devices, allowed)]
    if sizes and wc.mem_per_node > max(sizes):
        raise ctx.error((*key, "mem_per_node"), f"{wc.mem_per_node} MiB is more than any node "
                        f"of the class has (largest: {max(sizes)} MiB)")


def _check_classify_section(ctx: _Ctx, classify: Any, classes: dict[str, Any]) -> None:
    if classify is None:
        return
    seen: dict[tuple[str, str], int] = {}
    for i, rule in enumerate(classify.rules):
        key: KeyPath = ("classify", "rules", i)
        if rule.wclass not in classes:
            raise ctx.error((*key, "class"), f"unknown class '{rule.wclass}'"
                            f"{did_you_mean(rule.wclass, classes)}; classes: "
                            f"{', '.join(sorted(classes)) or '(none)'}")
        first = seen.setdefault((rule.user, rule.name), i)
        if first != i:
            raise ctx.error(key, f"a second rule for user {rule.user!r} and job name "
                            f"{rule.name!r} (the first is rule {first}); keep one")


def _check_hook_section(ctx: _Ctx, hook: Any, gpu_models: set[str]) -> None:
    if hook is None:
        return
    for level, qos in hook.priority_qos.items():
        key: KeyPath = ("hook", "priority_qos", level)
        if level not in ("high", "normal", "low"):
            raise ctx.error(key, f"unknown priority '{level}'"
                            f"{did_you_mean(level, ['high', 'normal', 'low'])}; "
                            "levels: high, normal, low")
        problem = names.ident_problem(qos, "QOS")
        if problem:
            raise ctx.error(key, problem)
    for i, model in enumerate(hook.energy_low_models):
        if model not in gpu_models:
            raise ctx.error(("hook", "energy_low_models", i), f"'{model}' is not a GPU model of "
                            f"this site{did_you_mean(model, gpu_models)}")


def _check_stall_section(ctx: _Ctx, stall: Any, partitions: Any) -> None:
    """``[stall]``: exempt partitions exist; the notifier and the log and lock are absolute
    paths."""
    if stall is None:
        return
    for i, part in enumerate(stall.exempt_partitions):
        if partitions and part not in partitions:
            raise ctx.error(("stall", "exempt_partitions", i), f"'{part}' is not a partition "
                            f"of this site{did_you_mean(part, list(partitions))}")
    if stall.notify_command and not stall.notify_command[0].startswith("/"):
        # An absolute path: a cron job's PATH must not decide which program is run as root.
        raise ctx.error(("stall", "notify_command", 0),
                        "the notifier must be an absolute path (it runs with no shell)")
    for key in ("action_log", "lock_file"):
        if not getattr(stall, key).startswith("/"):
            raise ctx.error(("stall", key), "must be an absolute path")


def _check_usage_section(ctx: _Ctx, usage: Any, gpu_models: set[str]) -> None:
    """``[usage] speed`` names GPU models of this site (a typo would silently drop advice)."""
    if usage is None:
        return
    for model in usage.speed:
        if model not in gpu_models:
            raise ctx.error(("usage", "speed", model), f"'{model}' is not a GPU model of this "
                            f"site{did_you_mean(model, gpu_models)}")


def _resolve_levers(ctx: _Ctx, sections: dict[str, Any], gpu_present: set[str],
                    fpga_present: set[str]) -> Levers | None:
    """Check ``[levers]`` keys that name models, read a referenced speed table, and store
    the resolved section back (so rendering never reads a file)."""
    lv = sections.get("levers")
    if not isinstance(lv, Levers):
        return None
    models = gpu_present | fpga_present
    for m in lv.cost_per_device_hour:
        if m not in models:
            raise ctx.error(("levers", "cost_per_device_hour", m), f"'{m}' is not a device model "
                            f"of this site{did_you_mean(m, models)}")
    for m in lv.shards:
        if m not in gpu_present:
            raise ctx.error(("levers", "shards", m), f"'{m}' is not a GPU model of this site"
                            f"{did_you_mean(m, gpu_present)}")
    if lv.speed and lv.speed_table:
        raise ctx.error(("levers", "speed_table"), "give either 'speed' or 'speed_table', not both")
    speed = dict(lv.speed)
    key: KeyPath = ("levers", "speed")
    if lv.speed_table:
        key = ("levers", "speed_table")
        try:
            speed = site_levers.load_speed_table(lv.speed_table, Path(ctx.path).parent)
        except site_levers.SpeedTableError as exc:
            raise ctx.error(key, str(exc)) from None
        # A shared table may measure models this site lacks; keep the site's own.
        speed = {m: v for m, v in speed.items() if m in gpu_present}
    else:
        for m in speed:
            if m not in gpu_present:
                raise ctx.error(("levers", "speed", m), f"'{m}' is not a GPU model of this site"
                                f"{did_you_mean(m, gpu_present)}")
    if speed:
        missing = sorted(gpu_present - set(speed))
        if missing:
            raise ctx.error(key, f"no speed for GPU model(s) {', '.join(missing)}: billing by "
                            "speed needs every model")
        if lv.billing_workload is not None:
            for m, row in speed.items():
                if lv.billing_workload not in row:
                    raise ctx.error(("levers", "billing_workload"),
                                    f"workload type '{lv.billing_workload}' has no speed for "
                                    f"'{m}'{did_you_mean(lv.billing_workload, row)}")
        elif not set.intersection(*(set(row) for row in speed.values())):
            raise ctx.error(key, "no workload type has a speed for every GPU model")
    if lv.priority_decay_half_life is not None and not _TIME_RE.match(
            lv.priority_decay_half_life):
        raise ctx.error(("levers", "priority_decay_half_life"),
                        f"'{lv.priority_decay_half_life}' is not a Slurm time")
    resolved: Levers = lv.model_copy(update={"speed": speed, "speed_table": lv.speed_table})
    sections["levers"] = resolved
    return resolved


def _check_mig(ctx: _Ctx, lv: Levers | None, classes: dict[str, NodeClass],
               models: set[str]) -> None:
    """``[levers.mig]``: GPU models of this site, split into profiles their card has."""
    if lv is None:
        return
    for m, profiles in lv.mig.items():
        key: KeyPath = ("levers", "mig", m)
        gpus = [c.gpus for c in classes.values() if c.gpus]
        memory = [g.memory for g in gpus if g.model == m]
        if not memory:
            raise ctx.error(key, f"'{m}' is not a GPU model of this site"
                            f"{did_you_mean(m, {g.model for g in gpus})}")
        if m in lv.shards:
            raise ctx.error(key, f"'{m}' has both shards and MIG slices; give one of them")
        sizes = sorted({x for x in memory if x is not None})
        if len(sizes) > 1:
            raise ctx.error(key, f"node classes give '{m}' different memory sizes; a MIG split "
                            "needs one card")
        problem = site_levers.mig_problem(m, profiles, sizes[0] if sizes else None)
        if problem:
            raise ctx.error(key, problem)
        clash = [t for t in (site_levers.mig_type(m, p) for p in profiles) if t in models]
        if clash:
            raise ctx.error(key, f"MIG type '{clash[0]}' is also a device model of this site")


def _levers_order(ctx: _Ctx, f: SiteFile, lv: Levers, gpu_order: tuple[str, ...],
                  fpga_order: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...], SiteFile]:
    orders = {"gpu": gpu_order, "fpga": fpga_order}
    update: dict[str, tuple[str, ...]] = {}
    for kind in ("gpu", "fpga"):
        scores = site_levers.device_scores(f.node_classes, lv, kind)
        if not scores:
            continue
        derived = site_levers.derived_order(scores)
        written = getattr(f.scheduling, f"{kind}_model_order")
        if written and derived != orders[kind]:
            detail = ", ".join(f"{m} {scores[m]:.3g}" for m in derived)
            raise ctx.error(("scheduling", f"{kind}_model_order"),
                            f"lists {', '.join(written)}, but power and cost per unit of work "
                            f"rank {', '.join(derived)} (scores {detail}); remove the order to "
                            "let the levers set it, or set levers.weight_from = \"order\"")
        orders[kind] = derived
        update[f"{kind}_model_order"] = derived
    if update:
        f = f.model_copy(update={"scheduling": f.scheduling.model_copy(update=update)})
    return orders["gpu"], orders["fpga"], f


def _check_levers_section(ctx: _Ctx, lv: Levers | None, nodes: Sequence[NodeSpec],
                          partitions: dict[str, ResolvedPartition]) -> None:
    if lv is None:
        return
    by_name = {n.name: n for n in nodes}
    gpus = {n.gpus[0].model for n in nodes if n.gpus}
    fpgas = {n.fpgas[0].model for n in nodes if n.fpgas}
    lever_keys = {"maxcpuspernode", "maxmempernode", "tresbillingweights"}
    for pname, part in partitions.items():
        taken = [k for k in part.spec.options if k.lower() in lever_keys]
        if taken and (pname in lv.gpu_reserve or lv.speed):
            raise ctx.error(("partitions", pname, "options", taken[0]),
                            f"'{taken[0]}' is set by [levers]; remove it from the options")
    for pname, res in lv.gpu_reserve.items():
        key: KeyPath = ("levers", "gpu_reserve", pname)
        if pname not in partitions:
            raise ctx.error(key, f"unknown partition '{pname}'{did_you_mean(pname, partitions)}")
        members = [by_name[n] for n in partitions[pname].nodes]
        dev = [n for n in members if n.gpus or n.fpgas]
        if not dev:
            raise ctx.error(key, f"partition '{pname}' has no GPU or FPGA node to reserve for")
        cap_cpus = min(n.cpus for n in dev) - res.cores * min(n.spec.threads_per_core for n in dev)
        if res.cores and cap_cpus < 1:
            raise ctx.error((*key, "cores"), f"reserving {res.cores} cores leaves no CPU for "
                            f"jobs of '{pname}' on its smallest device node")
        cap_mem = min(n.spec.memory for n in dev) - (res.memory or 0)
        if res.memory and cap_mem < 1:
            raise ctx.error((*key, "memory"), "reserving this much memory leaves none for jobs "
                            f"of '{pname}' on its smallest device node")
        # Slurm 22.05 applies MaxCPUsPerNode/MaxMemPerNode to every node of the partition.
        capped = [n.name for n in members if not (n.gpus or n.fpgas)
                  and ((res.cores and n.cpus > cap_cpus)
                       or (res.memory and n.spec.memory > cap_mem))]
        if capped:
            raise ctx.error(key, f"partition '{pname}' also holds CPU-only node(s) "
                            f"{hostlist.collect_hostlist(capped)}, which the limit would cap "
                            "too (Slurm applies it to every node of a partition); reserve on a "
                            "partition of device nodes only")
    for qname, q in lv.qos.items():
        key = ("levers", "qos", qname)
        problem = names.ident_problem(qname, "QOS")
        if problem:
            raise ctx.error(key, problem)
        for field in ("max_tres_per_user", "max_tres_per_job"):
            for tres in getattr(q, field):
                if tres not in site_levers.QOS_TRES_KEYS and tres not in gpus | fpgas:
                    choices = set(site_levers.QOS_TRES_KEYS) | gpus | fpgas
                    raise ctx.error((*key, field, tres), f"'{tres}' is neither a device model "
                                    f"of this site nor one of gpu, fpga, shard, cpu, node, mem"
                                    f"{did_you_mean(tres, choices)}")
        if q.max_wall is not None and not _TIME_RE.match(q.max_wall):
            raise ctx.error((*key, "max_wall"), f"'{q.max_wall}' is not a Slurm time")
        for i, who in enumerate((*q.accounts, *q.users)):
            if not re.fullmatch(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]*", who):
                field = "accounts" if i < len(q.accounts) else "users"
                raise ctx.error((*key, field), f"'{who}' is not an account or user name")
