"""What a configuration change needs in Slurm 22.05: nothing, ``scontrol reconfigure``, or
a restart of slurmctld and every slurmd.

Pure: compares two sets of rendered files (name -> text) line by line, keyed by what each
line configures (a node, a partition, a global key, a gres.conf node block, a switch), and
classifies each change. Unknown keys restart: a needless restart costs seconds, a missed one
leaves daemons running an old configuration. The testbed's ``up`` and ``site apply`` both
decide through :func:`classify`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

# "sacctmgr" is the label of a QOS change (written to the accounting database, no daemon
# involved): output a user reads (docs/cli.md), not a command hetslurm runs here.
Action = Literal["reconfigure", "restart", "sacctmgr", "hook"]
QOS_ACTION: Action = "sacctmgr"
#: A new job_submit.lua: slurmctld reloads it by itself at the next submission (by mtime;
#: hetslurm/hook/install.py), so it needs no daemon action, only ``hook install``'s checks.
HOOK_ACTION: Action = "hook"
ACTION_RANK: dict[Action, int] = {QOS_ACTION: 0, HOOK_ACTION: 0, "reconfigure": 1,
                                  "restart": 2}

#: Global keys ``scontrol reconfigure`` applies (slurm.conf(5) 22.05 names no restart for
#: them; PriorityFlags/TRESBillingWeights/PriorityWeight* measured on the testbed).
RECONFIGURE_KEYS = frozenset(k.lower() for k in (
    "DefMemPerCPU", "DefMemPerNode", "DefMemPerGPU", "DefCpuPerGPU", "MaxMemPerCPU",
    "MaxMemPerNode", "PriorityFlags", "PriorityCalcPeriod", "PriorityDecayHalfLife",
    "PriorityFavorSmall", "PriorityMaxAge", "PriorityUsageResetPeriod",
    "PriorityWeightAge", "PriorityWeightAssoc", "PriorityWeightFairshare",
    "PriorityWeightJobSize", "PriorityWeightPartition", "PriorityWeightQOS",
    "PriorityWeightTRES", "SchedulerParameters", "MinJobAge", "KillWait", "InactiveLimit",
    "DebugFlags", "SlurmctldDebug", "SlurmdDebug",
))
#: Node attributes ``scontrol reconfigure`` applies (Weight and Feature measured on 22.05.8:
#: the node showed the new values right after the reconfigure).
RECONFIGURE_NODE_ATTRS = frozenset({"weight", "feature", "features"})

#: Global keys whose comma-separated values are sets to Slurm.
ORDERLESS_KEYS = frozenset({"accountingstoragetres", "grestypes"})

_HEADER = re.compile(r"^\s*(#|$)")


@dataclass(frozen=True)
class Change:
    """One configured thing that differs; ``old``/``new`` are None when added/removed."""

    file: str
    item: str
    old: str | None
    new: str | None
    action: Action
    reason: str

    def to_dict(self) -> dict[str, str | None]:
        return {"file": self.file, "item": self.item, "action": self.action,
                "reason": self.reason, "old": self.old, "new": self.new}


_Maker = Callable[[str, str, str | None, str | None], Change]


@dataclass(frozen=True)
class Plan:
    """Every change and the strongest action they need together."""

    changes: tuple[Change, ...] = field(default_factory=tuple)

    @property
    def action(self) -> Action | None:
        if not self.changes:
            return None
        return max((c.action for c in self.changes), key=ACTION_RANK.__getitem__)

    @property
    def needs_restart(self) -> bool:
        return self.action == "restart"

    @property
    def files(self) -> tuple[str, ...]:
        """Configuration files with a change (QOS changes name no file; the hook is
        installed apart, and reloaded by slurmctld without a reconfigure)."""
        return tuple(sorted({c.file for c in self.changes
                             if c.action not in (QOS_ACTION, HOOK_ACTION)}))

    def __add__(self, other: Plan) -> Plan:
        return Plan((*self.changes, *other.changes))


def _lines(text: str | None) -> list[str]:
    if text is None:
        return []
    return [ln.strip() for ln in text.splitlines() if not _HEADER.match(ln)]


def _words(line: str) -> dict[str, str]:
    return {k.lower(): v for k, _, v in (tok.partition("=") for tok in line.split())}


def _slurm_entries(text: str | None) -> dict[str, str]:
    """slurm.conf (or a fragment) keyed: ``NodeName=x``, ``PartitionName=y``, ``Key``."""
    out: dict[str, str] = {}
    for ln in _lines(text):
        head = ln.split(None, 1)[0]
        name, _, value = head.partition("=")
        if name.lower() in {"nodename", "partitionname", "nodeset", "frontendname"}:
            out[f"{name}={value}"] = ln
        elif name.lower() == "include":
            out[ln] = ln
        elif name.lower() in ORDERLESS_KEYS:
            # A list whose order Slurm ignores: the same TRES in another order is no change.
            out[name] = f"{name}={','.join(sorted(value.split(',')))}"
        else:
            out[name] = ln
    return out


def _gres_entries(text: str | None) -> dict[str, str]:
    """gres.conf keyed by node list (a node's lines together), global lines by key."""
    blocks: dict[str, list[str]] = {}
    for ln in _lines(text):
        w = _words(ln)
        key = f"NodeName={w['nodename']}" if "nodename" in w else ln.split("=", 1)[0]
        blocks.setdefault(key, []).append(ln)
    return {k: "\n".join(v) for k, v in blocks.items()}


def _topology_entries(text: str | None) -> dict[str, str]:
    return {ln.split(None, 1)[0]: ln for ln in _lines(text)}


def _slurm_change(file: str, item: str, old: str | None, new: str | None) -> Change:
    if item.startswith("PartitionName="):
        return Change(file, item, old, new, "reconfigure", "partitions are re-read by "
                      "scontrol reconfigure")
    if item.startswith("NodeName="):
        if old is None or new is None:
            return Change(file, item, old, new, "restart", "adding or removing a node needs "
                          "slurmctld and every slurmd restarted")
        a, b = _words(old), _words(new)
        diff = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
        if diff <= RECONFIGURE_NODE_ATTRS:
            return Change(file, item, old, new, "reconfigure",
                          f"{', '.join(sorted(diff))} of a node apply on scontrol reconfigure")
        return Change(file, item, old, new, "restart",
                      f"node {', '.join(sorted(diff - RECONFIGURE_NODE_ATTRS))} changed: "
                      "slurmd registers hardware and gres only when it starts")
    key = item.split("=", 1)[0]
    if key.lower() in RECONFIGURE_KEYS:
        return Change(file, item, old, new, "reconfigure", f"{key} applies on reconfigure")
    return Change(file, item, old, new, "restart", f"{key} changed: slurm.conf(5) needs a "
                  "restart for it (or it is not known to apply on reconfigure)")


def _gres_change(file: str, item: str, old: str | None, new: str | None) -> Change:
    return Change(file, item, old, new, "restart", "gres.conf (Count, Cores=, Type, File) is "
                  "read by slurmd at start; 22.05 needs slurmctld and slurmd restarted")


def _topology_change(file: str, item: str, old: str | None, new: str | None) -> Change:
    return Change(file, item, old, new, "reconfigure", "topology.conf(5): applies on "
                  "scontrol reconfigure")


def classify(old: Mapping[str, str | None], new: Mapping[str, str | None]) -> Plan:
    """Changes between two sets of files (file name -> text, None or absent: no file).

    Comments and blank lines (the rendered header with its digest) are ignored.
    """
    changes: list[Change] = []
    for name in sorted(set(old) | set(new)):
        o, n = old.get(name), new.get(name)
        if name == "gres.conf":
            changes += _diff(name, _gres_entries(o), _gres_entries(n), _gres_change)
        elif name == "topology.conf":
            changes += _diff(name, _topology_entries(o), _topology_entries(n), _topology_change)
        elif name.endswith(".conf"):
            changes += _diff(name, _slurm_entries(o), _slurm_entries(n), _slurm_change)
        elif _lines(o) != _lines(n):
            changes.append(Change(name, name, o, n, "restart", "unknown file changed"))
    return Plan(tuple(changes))


def _diff(file: str, old: dict[str, str], new: dict[str, str], make: _Maker) -> list[Change]:
    out = []
    for item in [*old, *(k for k in new if k not in old)]:
        a, b = old.get(item), new.get(item)
        if a != b:
            out.append(make(file, item, a, b))
    return out
