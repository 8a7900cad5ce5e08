"""The ``[levers]`` section turned into Slurm settings (pure; docs/levers.md).

What is computed here, from a validated site only:

* the order of device models by energy and cost per unit of work, which becomes node
  ``Weight=`` (Slurm allocates the lowest weight first);
* ``TRESBillingWeights`` and ``PriorityWeightTRES`` per GPU model, scaled by measured speed,
  so fair share charges an hour on a fast GPU more than an hour on a slow one;
* partition limits that keep cores and memory of device nodes free for device work;
* ``gres/shard`` counts, and the QOS records (as data; sacctmgr is the levers package's job).

The one read from disk is a speed table the site names (``speed_table = "gavel:..."``), at
load time. Rendering stays pure: :mod:`hetslurm.site.render` calls the helpers below.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from hetslurm.site.names import model_name_problem
from hetslurm.site.schema import Levers, NodeClass, QosLever
from hetslurm.traces import TRACES_ENV, traces_dir

if TYPE_CHECKING:
    from hetslurm.site.model import NodeSpec, ResolvedPartition, Site

GAVEL_PREFIX = "gavel:"

_GAVEL_KEY = re.compile(r"^\('(?P<job>.+)', (?P<gpus>\d+)\)$")
_BATCH = re.compile(r" \(batch size \d+\)$")

Kind = Literal["gpu", "fpga"]


class SpeedTableError(ValueError):
    """A speed table file cannot be read or holds no usable numbers."""


def expand_traces(ref: str) -> str:
    """Expand ``$HETSLURM_TRACES`` (default: :func:`hetslurm.traces.traces_dir`)."""
    traces = str(traces_dir())
    return ref.replace("${" + TRACES_ENV + "}", traces).replace("$" + TRACES_ENV, traces)


def read_gavel(path: Path) -> dict[str, dict[str, float]]:
    """Gavel's ``simulation_throughputs.json`` as ``{model: {job family: steps/s}}``.

    Only single-GPU, isolated (``"null"``) throughputs of the consolidated keys (``k80``,
    not ``k80_unconsolidated``). A family (``ResNet-50``) is the geometric mean over its
    batch sizes, counting only batch sizes every model ran (0.0 marks an out-of-memory run).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpeedTableError(f"cannot read Gavel throughputs {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise SpeedTableError(f"{path} is not Gavel's throughput table")
    per_job: dict[str, dict[str, float]] = {}
    for model, jobs in raw.items():
        if model.endswith("_unconsolidated") or not isinstance(jobs, dict):
            continue
        for key, entry in jobs.items():
            m = _GAVEL_KEY.match(key)
            if not m or m.group("gpus") != "1" or not isinstance(entry, dict):
                continue
            value = entry.get("null")
            if isinstance(value, int | float):
                per_job.setdefault(m.group("job"), {})[model] = float(value)
    models = sorted({m for row in per_job.values() for m in row})
    families: dict[str, dict[str, list[float]]] = {}
    for job, row in per_job.items():
        if set(row) != set(models) or min(row.values()) <= 0:
            continue
        fam = _BATCH.sub("", job)
        for model, value in row.items():
            families.setdefault(fam, {}).setdefault(model, []).append(value)
    if not families:
        raise SpeedTableError(f"{path} holds no job type measured on every model")
    return {model: {fam: _geomean(vals[model]) for fam, vals in sorted(families.items())}
            for model in models}


def load_speed_table(ref: str, base_dir: Path) -> dict[str, dict[str, float]]:
    """Resolve ``speed_table`` (``gavel:<path>``; relative paths from the site file)."""
    if not ref.startswith(GAVEL_PREFIX):
        raise SpeedTableError(f"speed_table '{ref}' must start with '{GAVEL_PREFIX}' (the one "
                              "table format hetslurm reads)")
    path = Path(expand_traces(ref[len(GAVEL_PREFIX):]))
    if not path.is_absolute():
        path = base_dir / path
    return read_gavel(path)


def _geomean(values: Iterable[float]) -> float:
    vals = list(values)
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def relative_speed(speed: Mapping[str, Mapping[str, float]], models: Iterable[str],
                   workload: str | None = None) -> dict[str, float]:
    """Speed of each model relative to the slowest (which gets 1.0).

    With ``workload`` the ratio of that type; otherwise the geometric mean of the per-type
    ratios over the types every model has (a mean of ratios, so a type measured in larger
    units does not dominate).
    """
    ms = list(models)
    if not ms:
        return {}
    if workload is not None:
        raw = {m: speed[m][workload] for m in ms}
    else:
        common = set.intersection(*(set(speed[m]) for m in ms))
        if not common:
            raise ValueError("the speed table has no workload type common to every model")
        ref = ms[0]
        raw = {m: _geomean(speed[m][t] / speed[ref][t] for t in sorted(common)) for m in ms}
    low = min(raw.values())
    return {m: raw[m] / low for m in ms}


def device_scores(node_classes: Mapping[str, NodeClass], levers: Levers,
                  kind: Kind) -> dict[str, float]:
    """Every model of one kind scored by its energy and cost per unit of work (lower is
    filled first).

    A device's power is its busy power plus its share of the host's busy power; its work
    per hour is its relative speed (1.0 without a speed table, and always for FPGAs). The
    energy term is used only when every model has a power figure, the cost term only when
    every model has a cost; the score is ``b·E/E_min + (1-b)·C/C_min`` with the terms
    there are. Empty when neither term exists (weights then follow the site's order).
    """
    watts: dict[str, list[float]] = {}
    for spec in node_classes.values():
        group = spec.gpus if kind == "gpu" else spec.fpgas
        if group is None:
            continue
        if group.power_busy_watts is None:
            watts.setdefault(group.model, []).append(math.nan)
        else:
            watts.setdefault(group.model, []).append(
                group.power_busy_watts + spec.power_busy_watts / group.count)
    models = sorted(watts)
    if not models:
        return {}
    speeds = (relative_speed(levers.speed, models, levers.billing_workload)
              if kind == "gpu" and levers.speed else dict.fromkeys(models, 1.0))
    power = {m: sum(w) / len(w) for m, w in watts.items()}
    have_power = all(not math.isnan(p) for p in power.values())
    have_cost = all(m in levers.cost_per_device_hour for m in models)
    if not have_power and not have_cost:
        return {}
    energy = {m: power[m] / speeds[m] for m in models} if have_power else None
    cost = ({m: float(levers.cost_per_device_hour[m]) / speeds[m] for m in models}
            if have_cost else None)
    b = float(levers.energy_cost_balance)
    if energy is None:
        b = 0.0
    elif cost is None:
        b = 1.0
    out = {}
    for m in models:
        score = 0.0
        if energy is not None:
            score += b * _ratio(energy[m], min(energy.values()))
        if cost is not None:
            score += (1 - b) * _ratio(cost[m], min(cost.values()))
        out[m] = score
    return out


def _ratio(value: float, low: float) -> float:
    return value / low if low > 0 else (1.0 if value == 0 else math.inf)


def derived_order(scores: Mapping[str, float]) -> tuple[str, ...]:
    """Models by score, lowest first (name breaks ties, so the order is deterministic)."""
    return tuple(sorted(scores, key=lambda m: (round(scores[m], 9), m)))


# ---------------------------------------------------------------- rendering helpers
def _levers(site: Site) -> Levers | None:
    lv = site.sections.get("levers")
    return lv if isinstance(lv, Levers) else None


def _num(x: float) -> str:
    """A weight as Slurm reads it: plain decimal, at most 4 decimals, no exponent."""
    text = f"{x:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def gpu_speeds(site: Site) -> dict[str, float]:
    """Relative speed per GPU model (slowest 1.0); empty without a speed table."""
    lv = _levers(site)
    if lv is None or not lv.speed:
        return {}
    return relative_speed(lv.speed, site.gpu_models(), lv.billing_workload)


def billing_weights(site: Site) -> str | None:
    """``TRESBillingWeights`` for every partition: an hour on GPU model m costs
    ``billing_gpu * speed(m)`` units, where the slowest model has speed 1."""
    lv = _levers(site)
    speeds = gpu_speeds(site)
    if lv is None or not speeds:
        return None
    parts = [f"CPU={_num(lv.billing_cpu)}"]
    if lv.billing_mem_gib:
        parts.append(f"Mem={_num(lv.billing_mem_gib)}G")
    # Typed GPUs only: Slurm adds every listed TRES, so GRES/gpu beside GRES/gpu:h100 would
    # bill a typed GPU twice.
    parts += [f"GRES/gpu:{m}={_num(lv.billing_gpu * speeds[m])}" for m in site.gpu_models()]
    parts += [f"GRES/gpu:{t}={_num(lv.billing_gpu * speeds[m] * share)}"
              for t, (m, share) in mig_billing(site).items()]
    return ",".join(parts)


def global_lines(site: Site, *, accounting: bool = True) -> list[str]:
    """Global slurm.conf keys the levers set (after ``PriorityType``).

    Typed GPU TRES exist only with accounting (``AccountingStorageTRES``); slurmctld 22.05
    refuses weights naming them otherwise ("is not a configured TRES type"), so a
    configuration without slurmdbd gets no billing or TRES priority weights.
    """
    lv = _levers(site)
    if lv is None:
        return []
    lines = []
    if accounting and billing_weights(site) and lv.billing_max_tres:
        lines.append("PriorityFlags=MAX_TRES")
    speeds = gpu_speeds(site)
    if accounting and lv.priority_weight_gpu is not None and speeds:
        top = max(speeds.values())
        weights = ",".join(f"GRES/gpu:{m}={round(lv.priority_weight_gpu * speeds[m] / top)}"
                           for m in site.gpu_models())
        lines.append(f"PriorityWeightTRES={weights}")
    if lv.priority_weight_fairshare is not None:
        lines.append(f"PriorityWeightFairshare={lv.priority_weight_fairshare}")
    if any(q.priority > 0 for q in lv.qos.values()):
        lines.append(f"PriorityWeightQOS={lv.priority_weight_qos}")
    if lv.priority_calc_period_min is not None:
        lines.append(f"PriorityCalcPeriod={lv.priority_calc_period_min}")
    if lv.priority_decay_half_life is not None:
        lines.append(f"PriorityDecayHalfLife={lv.priority_decay_half_life}")
    return lines


def has_shards(site: Site) -> bool:
    lv = _levers(site)
    return bool(lv and lv.shards)


def node_shards(site: Site, node: NodeSpec) -> int:
    """``gres/shard`` count of a node: shards per GPU of its model times its GPUs."""
    lv = _levers(site)
    if lv is None or not node.gpus:
        return 0
    return lv.shards.get(node.gpus[0].model, 0) * len(node.gpus)


def reserve_limits(site: Site, part: ResolvedPartition) -> dict[str, int]:
    """``MaxCPUsPerNode``/``MaxMemPerNode`` that keep a partition's jobs off the cores and
    memory its device nodes keep for device work (empty when the partition has none)."""
    lv = _levers(site)
    if lv is None or part.name not in lv.gpu_reserve:
        return {}
    res = lv.gpu_reserve[part.name]
    dev = [site.node(n) for n in part.nodes if site.node(n).gpus or site.node(n).fpgas]
    out = {}
    if dev and res.cores:
        out["MaxCPUsPerNode"] = min(n.cpus for n in dev) - res.cores * min(
            n.spec.threads_per_core for n in dev)
    if dev and res.memory:
        out["MaxMemPerNode"] = min(n.spec.memory for n in dev) - res.memory
    return out


def partition_attrs(site: Site, part: ResolvedPartition, *, accounting: bool = True
                    ) -> list[str]:
    """Lever keys of one partition line (billing only with accounting, as above)."""
    attrs = [f"{k}={v}" for k, v in reserve_limits(site, part).items()]
    bw = billing_weights(site) if accounting else None
    if bw:
        attrs.append(f"TRESBillingWeights={bw}")
    return attrs


#: Limit keys of a QOS that are not device models, and the TRES they stand for.
QOS_TRES_KEYS = {"gpu": "gres/gpu", "fpga": "gres/fpga", "shard": "gres/shard", "cpu": "cpu",
                 "node": "node", "mem": "mem"}


def qos_tres(site: Site, limits: Mapping[str, int]) -> dict[str, int]:
    """A QOS limit table with Slurm's TRES names (``h100`` -> ``gres/gpu:h100``)."""
    gpus, fpgas = set(site.gpu_models()), set(site.fpga_models())
    out = {}
    for key, value in limits.items():
        if key in QOS_TRES_KEYS:
            out[QOS_TRES_KEYS[key]] = value
        elif key in gpus:
            out[f"gres/gpu:{key}"] = value
        elif key in fpgas:
            out[f"gres/fpga:{key}"] = value
        else:  # load_site refuses other keys
            raise KeyError(key)
    return dict(sorted(out.items()))


def qos_records(site: Site) -> dict[str, QosLever]:
    """The QOS the site asks for, by name (empty without ``[levers.qos]``)."""
    lv = _levers(site)
    return dict(lv.qos) if lv else {}


# ---------------------------------------------------------------- MIG partitioning
#: Compute and memory slices of a MIG-capable GPU (A100 and H100 alike).
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8
#: /proc/driver/nvidia-caps/mig-minors: ``config`` 1, ``monitor`` 2, then per GPU 15 GPU
#: instances of 9 minors each (the instance's ``access`` file, then compute instances 0-7).
MIG_MINOR_BASE = 3
MIG_MINORS_PER_GI = 9
MIG_GIS_PER_GPU = 15


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a card (NVIDIA MIG user guide, "Supported MIG Profiles")."""

    name: str
    compute: int  # compute slices, of MIG_COMPUTE_SLICES
    memory: int  # memory slices, of MIG_MEMORY_SLICES
    max_count: int  # most instances of this profile one GPU can hold


@dataclass(frozen=True)
class MigCard:
    name: str
    memory_gb: int
    profiles: Mapping[str, MigProfile]

    def gb(self, memory_slices: int) -> int:
        return memory_slices * self.memory_gb // MIG_MEMORY_SLICES


def _card(name: str, gb: int, unit: int) -> MigCard:
    rows = [(f"1g.{unit}gb", 1, 1, 7), (f"1g.{unit}gb+me", 1, 1, 1),
            (f"1g.{2 * unit}gb", 1, 2, 4), (f"2g.{2 * unit}gb", 2, 2, 3),
            (f"3g.{4 * unit}gb", 3, 4, 2), (f"4g.{4 * unit}gb", 4, 4, 1),
            (f"7g.{8 * unit}gb", 7, 8, 1)]
    return MigCard(name, gb, {r[0]: MigProfile(*r) for r in rows})


#: The cards whose MIG profiles hetslurm knows (NVIDIA's documented profile tables).
MIG_CARDS = {c.name: c for c in (_card("A100-40GB", 40, 5), _card("A100-80GB", 80, 10),
                                 _card("H100-80GB", 80, 10))}


def mig_card(model: str, memory_mib: int | None) -> MigCard | None:
    """The card a site's GPU model is, for MIG: ``a100*`` is an A100-80GB when its memory
    (or, without one, its name) says 80 GB, else an A100-40GB; ``h100*`` is an H100-80GB."""
    if model.startswith("a100"):
        big = memory_mib > 48 * 1024 if memory_mib is not None else "80" in model[4:]
        return MIG_CARDS["A100-80GB" if big else "A100-40GB"]
    if model.startswith("h100"):
        return MIG_CARDS["H100-80GB"]
    return None


def mig_type(model: str, profile: str) -> str:
    """The Slurm gres type of a MIG slice: ``a100`` + ``3g.20gb`` -> ``a100_3g_20gb``."""
    return f"{model}_{re.sub(r'[.+]', '_', profile)}"


def mig_problem(model: str, profiles: Iterable[str], memory_mib: int | None) -> str | None:
    """Why every GPU of ``model`` cannot be split into ``profiles``, or None if it can."""
    wanted = list(profiles)
    card = mig_card(model, memory_mib)
    if card is None:
        return (f"no MIG profiles are known for '{model}': hetslurm knows "
                f"{', '.join(MIG_CARDS)} (a GPU model named a100... or h100...)")
    if not wanted:
        return "give at least one MIG profile per GPU"
    for p in wanted:
        if p not in card.profiles:
            return (f"'{p}' is not a MIG profile of the {card.name}; it has "
                    f"{', '.join(card.profiles)}")
    for p in dict.fromkeys(wanted):
        n, most = wanted.count(p), card.profiles[p].max_count
        if n > most:
            return f"a {card.name} holds at most {most} {p} slice(s), not {n}"
    compute = sum(card.profiles[p].compute for p in wanted)
    if compute > MIG_COMPUTE_SLICES:
        return (f"{' + '.join(wanted)} need {compute} compute slices; a {card.name} has "
                f"{MIG_COMPUTE_SLICES}")
    memory = sum(card.profiles[p].memory for p in wanted)
    if memory > MIG_MEMORY_SLICES:
        return (f"{' + '.join(wanted)} need {card.gb(memory)} GB; a {card.name} has "
                f"{card.memory_gb} GB")
    for p in wanted:
        problem = model_name_problem(mig_type(model, p))
        if problem:
            return f"the MIG type of '{p}': {problem}"
    return None


def mig_cap_minors(gpu: int, gpu_instance: int, compute_instance: int = 0) -> tuple[int, int]:
    """Minors of ``/dev/nvidia-caps/nvidia-cap<N>`` for a GPU instance's ``access`` file and
    one of its compute instances, as /proc/driver/nvidia-caps/mig-minors numbers them."""
    base = MIG_MINOR_BASE + (gpu * MIG_GIS_PER_GPU + gpu_instance) * MIG_MINORS_PER_GI
    return base, base + 1 + compute_instance


def node_mig(site: Site, node: NodeSpec) -> tuple[str, ...]:
    """The MIG profiles each GPU of ``node`` is split into (empty: GPUs stay whole)."""
    lv = _levers(site)
    if lv is None or not node.gpus:
        return ()
    return lv.mig.get(node.gpus[0].model, ())


def node_mig_gres(site: Site, node: NodeSpec) -> list[tuple[str, int]]:
    """``(type, count)`` of a node's MIG slices over all its GPUs, in the listed order."""
    profiles = node_mig(site, node)
    counts: dict[str, int] = {}
    for p in profiles:
        t = mig_type(node.gpus[0].model, p)
        counts[t] = counts.get(t, 0) + len(node.gpus)
    return list(counts.items())


def mig_types(site: Site) -> tuple[str, ...]:
    """Every MIG gres type of the site, models in the site's order."""
    lv = _levers(site)
    if lv is None:
        return ()
    out = [mig_type(m, p) for m in site.gpu_models() for p in lv.mig.get(m, ())]
    return tuple(dict.fromkeys(out))


def mig_billing(site: Site) -> dict[str, tuple[str, float]]:
    """Per MIG type, its GPU model and the share of that GPU one slice is billed for: its
    compute slices out of 7 (a 3g slice of an H100 bills 3/7 of a whole H100)."""
    lv = _levers(site)
    if lv is None:
        return {}
    out = {}
    for m in site.gpu_models():
        mem = next((c.gpus.memory for c in site.node_classes.values()
                    if c.gpus and c.gpus.model == m), None)
        for p in lv.mig.get(m, ()):
            card = mig_card(m, mem)
            assert card is not None  # load_site checked it
            out[mig_type(m, p)] = (m, card.profiles[p].compute / MIG_COMPUTE_SLICES)
    return out
