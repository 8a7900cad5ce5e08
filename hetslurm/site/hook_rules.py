"""The job_submit hook's policy table, rendered from the site: pure and deterministic.

The hook (``job_submit/hethook.lua``) decides with this table only, so Python and Lua cannot
drift: the site file is the one source of classes, model order, model memory, feature and gres
names, QOS per priority and who may ask for ``priority=high``. :func:`hook_rules` builds plain
data (also shown by ``hetslurm hook render --rules``); :func:`lua_literal` writes it as a Lua
5.1 table constructor that ``hetslurm.hook.render`` embeds in ``job_submit.lua``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from hetslurm.site.model import Site
from hetslurm.site.schema import Classify, HookPolicy, WorkloadClass

#: Bumped when the table's shape changes (the hook refuses nothing; tests pin the shape).
RULES_VERSION = 1

#: The node feature hetslurm gives CPU-only nodes (hetslurm/site/model.py class_features).
CPU_FEATURE = "cpu"
#: The gres names the site renders (hetslurm/site/render.py GRES_TYPES).
GPU_GRES = "gpu"
FPGA_GRES = "fpga"

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LUA_KEYWORDS = frozenset(
    [
        "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
        "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"
    ]
)


def hook_policy(site: Site) -> HookPolicy:
    """The site's ``[hook]`` section (its defaults when the file has none)."""
    policy = site.sections.get("hook")
    return policy if isinstance(policy, HookPolicy) else HookPolicy()


def gpu_memory(site: Site) -> dict[str, int]:
    """Memory per GPU model in MiB (:meth:`Site.gpu_memory_mib`), unknown models left out."""
    return {m: v for m, v in sorted(site.gpu_memory_mib().items()) if v is not None}


def hook_rules(site: Site) -> dict[str, Any]:
    """The policy table as plain data (JSON-able; sets become ``{name: True}`` maps).

    The ``digest`` field hashes everything else, so ``hetslurm hook check`` can tell which
    rules the controller runs.
    """
    policy = hook_policy(site)
    gpu_models = list(site.gpu_models())
    fpga_models = list(site.fpga_models())
    raw_classes: Mapping[str, WorkloadClass] = site.sections.get("classes") or {}
    classes: dict[str, dict[str, Any]] = {}
    for name in sorted(raw_classes):
        wc = raw_classes[name]
        entry: dict[str, Any] = {
            "devices": list(wc.devices),
            "cpu_only": CPU_FEATURE in wc.devices,
            # The class's devices of each kind, in its order: what the hook asks for when a
            # request names the class and no model (rendered here, not worked out per job).
            "gpu_models": [d for d in wc.devices if d in gpu_models],
            "fpga_models": [d for d in wc.devices if d in fpga_models],
        }
        # ... and the GPU list as the feature text the hook's fast path writes ("h100|a100").
        entry["gpu_text"] = "|".join(entry["gpu_models"])
        if wc.partition is not None:
            entry["partition"] = wc.partition
        # The class's ranked per-model partitions in its order, for a job that names no
        # partition of its own (the fast path writes it as is; resolve works it out likewise).
        rank = site.ranked_list(wc.partition or site.default_partition(), entry["gpu_models"])
        if rank:
            entry["rank"] = rank
        if wc.qos is not None:
            entry["qos"] = wc.qos
        if wc.mem_per_node is not None:
            # MiB per node for a job of the class that asks for no memory (stage_class_mem).
            entry["mem"] = wc.mem_per_node
        classes[name] = entry
    users = list(policy.high_priority_users)
    rules: dict[str, Any] = {
        "version": RULES_VERSION,
        "site": site.name,
        "gpu_models": gpu_models,
        "fpga_models": fpga_models,
        "gpu_mem": gpu_memory(site),
        "gpu_gres": GPU_GRES,
        "fpga_gres": FPGA_GRES,
        "cpu_feature": CPU_FEATURE,
        "classes": classes,
        "class_names": sorted(classes),
        "priority_qos": dict(sorted(policy.priority_qos.items())),
        "high_priority": {
            "anyone": "*" in users,
            "users": {u: True for u in sorted(users) if u != "*"},
            "accounts": {a: True for a in sorted(policy.high_priority_accounts)},
        },
        "modify_exempt": {uid: True for uid in sorted(policy.modify_exempt_uids)},
        "energy_low_models": [m for m in gpu_models if m in policy.energy_low_models],
        # Ranked fallback (docs/fallback.md): partition -> model -> its per-model partition,
        # and each per-model partition's base and model (the hook refuses jobs naming one).
        "default_partition": site.default_partition(),
        "ranked": {base: site.ranked_of(base)
                   for base in sorted({r.base for r in site.ranked.values()})},
        "ranked_nodes": {r.name: len(r.nodes) for r in site.ranked.values()},
        "internal": {r.name: {"base": r.base, "model": r.model}
                     for r in sorted(site.ranked.values(), key=lambda r: r.name)},
        "switch_wait_default": policy.switch_wait_default_s,
        "record": {
            "field": policy.record_field,
            "key": policy.record_key,
            "max_bytes": policy.record_max_bytes,
            "max_field_bytes": policy.record_max_field_bytes,
        },
    }
    classify = classify_table(site)
    if classify is not None:
        rules["classify"] = classify
    rules["digest"] = rules_digest(rules)
    return rules


def classify_table(site: Site) -> dict[str, Any] | None:
    """The ``[classify]`` rules as the hook's lookup table, or None (mode ``off`` or no
    rules: then the table is absent and the hook's check is one missing-field read).

    ``names`` maps a job name to ``{user: "CLASS\tWHY"}``: the hook reads the job's name,
    and only when some rule has that name the user, so a job no rule names costs one table
    lookup (docs/hook.md, "Classification from history"). Each rule is one string, not a
    table: the controller's Lua heap holds one small table per job name instead of three
    per rule, which is what its garbage collector walks (p99 with 2,000 rules, docs/hook.md).
    """
    cf = site.sections.get("classify")
    if not isinstance(cf, Classify) or cf.mode == "off" or not cf.rules:
        return None
    names: dict[str, dict[str, str]] = {}
    for rule in cf.rules:
        # The loader refuses control characters in evidence, so a tab separates safely.
        names.setdefault(rule.name, {})[rule.user] = f"{rule.wclass}\t{rule.evidence}"
    return {"mode": cf.mode, "names": names}


def rules_digest(rules: Mapping[str, Any]) -> str:
    """16 hex digits over the table without its digest (stable key order)."""
    body = {k: v for k, v in rules.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _lua_string(s: str) -> str:
    out = ['"']
    for ch in s.encode("utf-8"):
        if ch in (0x22, 0x5C):
            out.append("\\" + chr(ch))
        elif 0x20 <= ch < 0x7F:
            out.append(chr(ch))
        else:
            out.append(f"\\{ch:03d}")
    out.append('"')
    return "".join(out)


def _lua_key(k: Any) -> str:
    if isinstance(k, bool):
        raise TypeError("boolean keys are not rendered")
    if isinstance(k, int):
        return f"[{k}]"
    if isinstance(k, str) and _IDENT.match(k) and k not in _LUA_KEYWORDS:
        return k
    return f"[{_lua_string(str(k))}]"


def lua_literal(value: Any, indent: str = "") -> str:
    """A Lua 5.1 table constructor for plain data (dict, list, str, int, bool, None).

    Integers are written as digits; floats are refused (a count must never reach Slurm as
    ``2.0``). Dict keys are written in sorted order, so the text is deterministic.
    """
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        raise TypeError(f"refusing to render float {value!r} into the hook")
    if isinstance(value, str):
        return _lua_string(value)
    inner = indent + "  "
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = sorted(value.items(), key=lambda kv: (str(type(kv[0])), kv[0]))
        body = ",\n".join(f"{inner}{_lua_key(k)} = {lua_literal(v, inner)}" for k, v in items)
        return "{\n" + body + ",\n" + indent + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "{}"
        return "{ " + ", ".join(lua_literal(v, inner) for v in value) + " }"
    raise TypeError(f"cannot render {type(value).__name__} into the hook")
