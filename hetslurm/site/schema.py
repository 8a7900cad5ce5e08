"""The site file's schema: frozen, typed, strict, unknown keys refused.

These pydantic models describe what may be *written* in a site file. Cross-references
(which nodes a partition names, which GPUs an NVLink island holds) are checked afterwards
by :mod:`hetslurm.site.load`, which also resolves the file into :class:`hetslurm.site.model.Site`.

Limits ("absurd counts") are deliberately generous but finite: a typo such as
``count = 80`` GPUs in a node is caught, a real 8-GPU or 16-socket machine is not.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
)

SCHEMA_VERSION = 1

MAX_DEVICES_PER_NODE = 64
MAX_MEMORY_MIB = 64 * 1024 * 1024  # 64 TiB
MAX_WATTS = 100_000

_MEM_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_MEM_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def _memory_mib(value: Any) -> Any:
    """Accept an integer (MiB, as slurm.conf's RealMemory) or a string such as "16G"."""
    if isinstance(value, bool):
        raise ValueError("memory must be a number of MiB or a string such as '16G'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _MEM_RE.match(value)
        if not m:
            raise ValueError(f"'{value}' is not a memory size; write e.g. 16000 (MiB) or '16G'")
        mib = int(m.group(1)) * _MEM_FACTOR[m.group(2).upper()]
        if mib != int(mib):
            raise ValueError(f"'{value}' is not a whole number of MiB")
        return int(mib)
    raise ValueError("memory must be a number of MiB or a string such as '16G'")


MemoryMiB = Annotated[int, BeforeValidator(_memory_mib), Field(ge=1, le=MAX_MEMORY_MIB)]
Watts = Annotated[StrictFloat, Field(ge=0, le=MAX_WATTS)]


class _Strict(BaseModel):
    # Lax mode so TOML arrays become tuples; scalars use Strict* types so "4" is not a count.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceGroup(_Strict):
    """GPUs or FPGAs of one model in a node class."""

    model: str
    count: Annotated[StrictInt, Field(ge=1, le=MAX_DEVICES_PER_NODE)]
    memory: MemoryMiB | None = None
    #: GPU indices grouped by NVLink island; a GPU in no island is an island of its own.
    nvlink_islands: tuple[tuple[StrictInt, ...], ...] = ()
    #: NUMA domain of each device by index; default: islands map to domains when their
    #: numbers match, otherwise devices are spread evenly in index order.
    numa: tuple[StrictInt, ...] | None = None
    power_idle_watts: Watts | None = None
    power_busy_watts: Watts | None = None
    #: Device files as a hostlist expression (``/dev/nvidia[0-7]``); the default follows the
    #: driver's naming. The testbed replaces it with its own character devices.
    files: str | None = None


class NodeClass(_Strict):
    """One kind of node: cores and NUMA layout, memory, devices, power."""

    sockets: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    cores_per_socket: Annotated[StrictInt, Field(ge=1, le=1024)]
    threads_per_core: Annotated[StrictInt, Field(ge=1, le=8)] = 1
    #: NUMA domains; cores split evenly between them in core order. Default: one per socket.
    numa_nodes: Annotated[StrictInt, Field(ge=1, le=64)] | None = None
    memory: MemoryMiB
    gpus: DeviceGroup | None = None
    fpgas: DeviceGroup | None = None
    #: Extra node features; hetslurm adds gpu/fpga/cpu and the device model names itself.
    features: tuple[str, ...] = ()
    power_idle_watts: Watts = 0.0
    power_busy_watts: Watts = 0.0


class Partition(_Strict):
    """A Slurm partition over a hostlist expression of site nodes (or ``ALL``)."""

    nodes: str
    default: StrictBool = False
    max_time: str = "UNLIMITED"
    default_time: str | None = None
    #: Extra raw ``Key=Value`` partition options hetslurm does not model (e.g. OverSubscribe).
    options: dict[str, str] = Field(default_factory=dict)


class Switch(_Strict):
    """A switch of the tree: a leaf lists nodes, an upper level lists switches."""

    nodes: str | None = None
    switches: tuple[str, ...] = ()
    #: Relative link speed, rendered as topology.conf ``LinkSpeed``.
    link_speed: Annotated[StrictInt, Field(ge=1)] | None = None


class Scheduling(_Strict):
    """Site-wide order of preference between device models.

    Rendered as node ``Weight=`` (Slurm allocates the lowest weight first), so an OR of
    model features (``h100|a100``) falls back in this order. CPU-only nodes get the lowest
    weight of all so CPU work fills them before it touches a device node.
    """

    gpu_model_order: tuple[str, ...] = ()
    fpga_model_order: tuple[str, ...] = ()
    #: Default memory per CPU in MiB (``DefMemPerCPU``) so jobs without ``--mem`` share nodes.
    def_mem_per_cpu: MemoryMiB | None = None
    #: How cores inside a node are picked for a job: ``block`` fills one socket before the
    #: next (``CR_CORE_DEFAULT_DIST_BLOCK``: fewest sockets, what ``locality=numa`` needs),
    #: ``cyclic`` spreads them over sockets (Slurm's default).
    core_distribution: Annotated[str, Field(pattern=r"^(block|cyclic)$")] = "block"
    #: How a job that accepts several GPU models gets them in its own order (a class's
    #: ``devices``, ``gpu-type=a|b``): ``partitions`` renders, for each partition whose nodes
    #: hold two or more GPU models, one overlapping partition per model (``<partition>_<model>``,
    #: identical limits and tier) and the hook submits the job to them in the job's order, so
    #: Slurm takes the first model free now and falls back at once (docs/fallback.md);
    #: ``weights`` leaves only node ``Weight=`` (the site-wide ``gpu_model_order`` for
    #: everyone).
    ranked_fallback: Annotated[str, Field(pattern=r"^(partitions|weights)$")] = "partitions"


class WorkloadClass(_Strict):
    """A workload class users name with ``#HET class=`` (the hook issue extends this)."""

    devices: tuple[str, ...] = ()
    partition: str | None = None
    qos: str | None = None
    description: str = ""
    #: Memory per node (MiB, or "16G") the hook gives a job of this class that asks for
    #: none: no ``mem=`` in its request and no ``--mem``/``--mem-per-cpu``/``--mem-per-gpu``
    #: (``hetslurm advise`` proposes it from measured MaxRSS; docs/learn.md).
    mem_per_node: MemoryMiB | None = None


class SiteFile(_Strict):
    """The whole file as written. Named sections beyond the core live in ``SECTIONS``."""

    schema_version: StrictInt
    name: str
    description: str = ""
    scheduling: Scheduling = Scheduling()
    node_classes: dict[str, NodeClass]
    nodes: dict[str, str]
    partitions: dict[str, Partition] = Field(default_factory=dict)
    switches: dict[str, Switch] = Field(default_factory=dict)


#: Named sections later capabilities add, each with its own schema. A file that lacks a
#: section gets its default; a new capability registers its section here (or through
#: :func:`register_section`) without touching ``SiteFile``, so old files keep loading.
SECTIONS: dict[str, tuple[Any, Any]] = {
    # name: (type validated by pydantic, default when absent)
    "classes": (dict[str, WorkloadClass], {}),
}


def register_section(name: str, type_: Any, default: Any) -> None:
    """Add a named top-level section with its own schema (used by later capabilities)."""
    if name in SiteFile.model_fields or name in SECTIONS:
        raise ValueError(f"site section '{name}' is already defined")
    SECTIONS[name] = (type_, default)


class Usage(_Strict):
    """``[usage]``: what "used", "busy" and "idle" mean for GPU samples (see
    docs/metrics-and-audit.md). Percentages are NVML's utilization (0-100)."""

    #: A sample counts towards busy GPU-hours at or above this utilization.
    busy_threshold_pct: Annotated[StrictFloat | StrictInt, Field(ge=0, le=100)] = 10.0
    #: A job is idle when every sample of every GPU in a window is below this.
    idle_threshold_pct: Annotated[StrictFloat | StrictInt, Field(ge=0, le=100)] = 5.0
    #: Window length for the idle rule; a shorter job is judged over its whole run.
    idle_window_s: Annotated[StrictInt, Field(ge=1, le=30 * 86400)] = 3600
    #: Optional memory rule: an idle window must also stay below this GPU memory used.
    idle_memory_mib: Annotated[StrictInt, Field(ge=0)] | None = None
    #: Share of a window's expected samples that must be present (known) to judge it.
    min_coverage: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1)] = 0.5
    #: Relative speed of each device model (right-size advice); unlisted models are not
    #: suggested.
    speed: dict[str, Annotated[StrictFloat | StrictInt, Field(gt=0)]] = Field(
        default_factory=dict)
    #: Right-size advice: a smaller model "would have served" when the job's mean
    #: utilization scaled to that model stays at or below this.
    right_size_target_pct: Annotated[StrictFloat | StrictInt, Field(gt=0, le=100)] = 80.0


class Collector(_Strict):
    """``[collector]``: the node collector and its metrics store."""

    #: ``real`` reads NVML (nvidia-ml-py); ``fake`` reads a scripted scenario (tests, demo).
    nvml: Annotated[str, Field(pattern=r"^(real|fake)$")] = "real"
    #: The fake NVML's scenario file (JSON), required when ``nvml = "fake"``.
    fake_scenario: str | None = None
    interval_s: Annotated[StrictFloat | StrictInt, Field(ge=0.1, le=3600)] = 30
    #: Seconds a tick waits for a node's NVML read; a node that has not answered is
    #: ``unknown`` for the tick (and while that read hangs), not a stalled collector.
    source_timeout_s: Annotated[StrictFloat | StrictInt, Field(gt=0, le=600)] = 5
    #: Samples are written as one segment per node at least this often.
    flush_s: Annotated[StrictFloat | StrictInt, Field(ge=0.1, le=86400)] = 300
    store: str = "/var/lib/hetslurm/metrics"
    #: gres.conf to follow index -> File=; default: beside $SLURM_CONF, else /etc/slurm.
    gres_conf: str | None = None
    #: Kept for existing site files: the collector no longer drains. ``true`` makes
    #: ``[health]`` default to ``mode = "drain"`` with ``rules = ["lost"]`` (what it did), now
    #: done by ``hetslurm rebalance`` (docs/act.md#device-health).
    drain_lost_gpu: StrictBool = False
    #: No longer used (the health step writes ``hetslurm: <node> GPU <i> (minor <m>) ...``).
    drain_reason: str = "hetslurm: GPU lost (NVML)"
    #: Owners whose segments readers accept, besides root and the reader itself.
    trusted_uids: tuple[StrictInt, ...] = ()
    #: Merge segments older than this into one per node and day.
    compact_after_s: Annotated[StrictInt, Field(ge=60)] = 3600
    retention_days: Annotated[StrictInt, Field(ge=1)] = 90


register_section("usage", Usage, Usage())


class Accounting(_Strict):
    """``[accounting]``: what Slurm measures per job, so ``sacct``/``sstat`` carry CPU, memory
    and IO (``TRESUsageInTot``) and the batch script after the fact (docs/site-config.md).

    ``gather = "linux"`` renders ``JobAcctGatherType=jobacct_gather/linux`` (reads /proc per
    task; works with ``proctrack/linuxproc`` and with cgroups); ``"none"`` measures nothing.
    """

    gather: Annotated[str, Field(pattern=r"^(linux|none)$")] = "linux"
    #: ``JobAcctGatherFrequency=task=N``: seconds between samples of a running task.
    gather_frequency_s: Annotated[StrictInt, Field(ge=1, le=3600)] = 30
    #: ``AccountingStoreFlags=job_script``: slurmdbd keeps each batch script
    #: (``sacct --batch-script``), read by ``learn`` off the controller.
    store_job_script: StrictBool = True


register_section("accounting", Accounting, Accounting())
register_section("collector", Collector, Collector())


StallAction = Annotated[str, Field(pattern=r"^(notify|requeue|requeue_hold)$")]


class Stall(_Strict):
    """``[stall]``: when ``hetslurm act requeue-stalled`` gives idle GPUs back (docs/act.md).

    "Idle" is ``[usage]``'s rule (thresholds, memory rule, coverage) over the last
    ``window_s``; unknown samples are never idle.
    """

    #: The idle window judged at each run; default: ``[usage] idle_window_s``.
    window_s: Annotated[StrictInt, Field(ge=60, le=30 * 86400)] | None = None
    #: A run younger than this (or than the window) is never judged.
    grace_after_start_s: Annotated[StrictInt, Field(ge=0, le=30 * 86400)] = 1800
    #: A warning (logged, notified) must precede any requeue, hold or cancel by this long.
    warning_grace_s: Annotated[StrictInt, Field(ge=0, le=30 * 86400)] = 1800
    #: Requeues per job, counted from Slurm's ``Restarts`` (a requeue resets the submit time).
    max_requeues: Annotated[StrictInt, Field(ge=0, le=100)] = 2
    #: What an idle, requeueable batch job gets.
    action: StallAction = "requeue"
    #: What a job at the cap gets instead (``requeue_hold`` holds it; ``notify`` only tells).
    over_cap_action: Annotated[str, Field(pattern=r"^(notify|requeue_hold)$")] = "notify"
    #: Jobs that cannot be requeued (interactive ``salloc``/``srun``): tell, or cancel them
    #: after the warning grace.
    non_batch_action: Annotated[str, Field(pattern=r"^(notify|cancel)$")] = "notify"
    #: A job whose output is not known to be in append mode (a requeue would truncate it):
    #: ``notify`` skips it and tells; ``requeue`` acts anyway.
    no_append_action: Annotated[str, Field(pattern=r"^(notify|requeue)$")] = "notify"
    exempt_users: tuple[str, ...] = ()
    exempt_accounts: tuple[str, ...] = ()
    exempt_partitions: tuple[str, ...] = ()
    exempt_qos: tuple[str, ...] = ()
    #: The site's notifier as an argv list (never a shell); ``{job}``, ``{user}``,
    #: ``{action}``, ``{rule}`` in an element are replaced; the decision arrives as JSON on
    #: stdin. Empty: notifications go to the action log only.
    notify_command: tuple[str, ...] = ()
    notify_timeout_s: Annotated[StrictInt, Field(ge=1, le=600)] = 30
    #: Append-only JSON-lines action log and the lock that keeps runs from overlapping.
    action_log: str = "/var/log/hetslurm/actions.jsonl"
    lock_file: str = "/run/hetslurm/act.lock"
    #: Seconds to wait for Slurm to show a requeued job pending with its restarts raised.
    verify_timeout_s: Annotated[StrictFloat | StrictInt, Field(gt=0, le=600)] = 20


register_section("stall", Stall, Stall())


RelaxKind = Annotated[str, Field(pattern=r"^(switch-wait|models|prefer|wait-for)$")]


class Rebalance(_Strict):
    """``[rebalance]``: the cron entry point ``hetslurm rebalance`` (docs/act.md#rebalance).

    It runs requeue-stalled (``[stall]``), relaxes pending jobs that waited too long, and
    reports drift between the site file and the live cluster.
    """

    #: Stop starting new work after this many seconds; what was skipped is reported.
    time_budget_s: Annotated[StrictInt, Field(ge=1, le=86400)] = 240
    #: The run lock (a second run exits at once); must differ from ``[stall] lock_file``.
    lock_file: str = "/run/hetslurm/rebalance.lock"
    #: The read cache of the pass's store read (docs/act.md#read-cache): segments the last
    #: pass read are taken from it instead of being opened again. Default: the file
    #: ``rebalance-window.arrow`` in ``lock_file``'s folder; "" turns it off.
    read_cache: str | None = None
    #: Action log for relaxations; default: ``[stall] action_log`` (one log for all acts).
    action_log: str | None = None
    #: The parts, in the order they run; each can be switched off (``health``: ``[health]``,
    #: ``weights``: ``[weights]``, docs/act.md).
    health: StrictBool = True
    requeue_stalled: StrictBool = True
    weights: StrictBool = True
    relax: StrictBool = True
    drift: StrictBool = True
    #: A pending job is relaxed only after waiting this long (since it became eligible).
    pending_limit_s: Annotated[StrictInt, Field(ge=0, le=30 * 86400)] = 3600
    #: Which relaxing edits are allowed: drop a switch wait (``locality=switch`` preferred),
    #: widen a GPU model list narrowed by the hook (``energy=low``) back to the job's own
    #: ranked list, drop a ``--prefer`` that names models of that list.
    relax_kinds: tuple[RelaxKind, ...] = ("switch-wait", "models", "prefer", "wait-for")
    #: Slurm pending reasons under which a job is considered (held, dependent or
    #: limit-bound jobs would not start sooner with a wider request).
    pending_reasons: tuple[str, ...] = ("Resources", "Priority", "None")
    #: At most this many jobs relaxed per run.
    max_relax_per_run: Annotated[StrictInt, Field(ge=0, le=10_000)] = 20
    #: Place the relax phase's jobs in batch (docs/act.md#relax-in-batch): waves against one
    #: snapshot, placed again only where an earlier job took a node the answer reads, the
    #: state kept by taking from one core; the same decisions as one after another (false:
    #: that, the reference path, rebuilding the model after every take).
    relax_batch: StrictBool = True
    #: Threads that place a batch wave, the GIL released in the kernel (the rest of an answer
    #: is Python). 1 by default: a second thread gains at most about 15 % with a core to
    #: spare and lost up to 2.5x on a busy 2-CPU box (docs/act.md#relax-in-batch).
    relax_threads: Annotated[StrictInt, Field(ge=1, le=256)] = 1
    #: Seconds to wait for Slurm to show an edited job with its new request.
    verify_timeout_s: Annotated[StrictFloat | StrictInt, Field(gt=0, le=600)] = 10
    #: The live Slurm configuration folder for the drift report (default: the folder of
    #: ``$SLURM_CONF``, else ``/etc/slurm``) and whether its slurm.conf is one whole file.
    conf_dir: str | None = None
    whole_conf: StrictBool = False


register_section("rebalance", Rebalance, Rebalance())


class Weights(_Strict):
    """``[weights]``: measured GPU load moves node ``Weight=`` within its model's band (the
    rebalance ``weights`` phase, docs/act.md#measured-load-and-node-weights)."""

    #: Weights a node may move above its site weight; the site's model weights are 10
    #: apart, so at most 9 keeps every model's band apart (0 switches the phase off).
    band: Annotated[StrictInt, Field(ge=0, le=9)] = 5
    #: The utilization window, seconds back from the run.
    window_s: Annotated[StrictInt, Field(ge=30, le=7 * 86400)] = 600
    #: Known samples (status ok) a node needs in the window; fewer: unknown, nothing moves.
    min_samples: Annotated[StrictInt, Field(ge=1, le=100_000)] = 3
    #: No known sample newer than this: unknown (default: 3 collector intervals).
    stale_s: Annotated[StrictInt, Field(ge=1, le=86400)] | None = None
    #: A node moves only when its level changes by at least this many steps.
    hysteresis: Annotated[StrictInt, Field(ge=1, le=9)] = 2
    #: Below this mean utilization a node returns to its site weight whatever hysteresis says.
    release_util_pct: Annotated[StrictFloat | StrictInt, Field(ge=0, le=100)] = 20
    #: A node that moved less than this ago stays where it is.
    hold_s: Annotated[StrictInt, Field(ge=0, le=7 * 86400)] = 600
    #: CPU-only nodes (no GPU, no FPGA) move too, by Slurm's CPULoad (the load average slurmd
    #: reports) over their CPUs. Off by default: where several slurmd share one host (a
    #: test cluster) every node reads the same load.
    cpu_load: StrictBool = False


register_section("weights", Weights, Weights())
HealthRule = Annotated[str, Field(pattern=r"^(lost|ecc|xid|throttle)$")]
ThrottleReason = Annotated[
    str, Field(pattern=r"^(hw_slowdown|hw_thermal_slowdown|hw_power_brake|sw_thermal_slowdown|"
                       r"sw_power_cap)$")]
#: NVIDIA's XID catalog (docs.nvidia.com/deploy/xid-errors/): codes whose documented action
#: is a GPU reset, a node reboot or a hardware check, never "the application's fault"
#: (docs/act.md#device-health gives each one's meaning).
DEFAULT_HEALTH_XIDS = (48, 63, 64, 74, 79, 92, 94, 95, 119, 120)


class Health(_Strict):
    """``[health]``: when a GPU is unhealthy and its node is drained (docs/act.md#device-health).

    ``None`` values are resolved from other sections (:func:`hetslurm.act.health.rules_for`):
    ``mode`` and ``rules`` from ``[collector] drain_lost_gpu``, ``stale_s`` from ``[collector]
    interval_s``.
    """

    #: ``drain``: rebalance drains and undrains; ``report``: it only lists what it would do;
    #: ``off``: the step does not run. Default: ``drain`` when ``[collector] drain_lost_gpu``
    #: is true, else ``report`` (a site that never drained does not start to by upgrading).
    mode: Annotated[str, Field(pattern=r"^(drain|report|off)$")] | None = None
    #: Which rules make a device unhealthy. Default: all four, or only ``lost`` when the
    #: ``drain`` mode comes from ``[collector] drain_lost_gpu`` (what that setting did).
    rules: tuple[HealthRule, ...] | None = None
    #: A device whose volatile uncorrected ECC count is at or above this is unhealthy.
    ecc_uncorrectable_max: Annotated[StrictInt, Field(ge=1)] = 1
    #: XID codes that make a device unhealthy.
    xids: tuple[Annotated[StrictInt, Field(ge=1, le=1_000_000)], ...] = DEFAULT_HEALTH_XIDS
    #: Throttle reasons that count when persistent (``sw_power_cap`` is the normal power
    #: limit at work, not a fault, so it is left out by default).
    throttle_reasons: tuple[ThrottleReason, ...] = (
        "hw_slowdown", "hw_thermal_slowdown", "hw_power_brake", "sw_thermal_slowdown")
    #: Throttling is persistent when every sample over at least this long (and at least two
    #: samples) shows one of ``throttle_reasons``.
    throttle_persist_s: Annotated[StrictInt, Field(ge=1, le=86400)] = 300
    #: A device with no sample newer than this is unknown; default 3 x ``[collector]
    #: interval_s``.
    stale_s: Annotated[StrictFloat | StrictInt, Field(gt=0, le=86400)] | None = None
    #: Never drain more than this share of one model's GPUs in one pass (the rest: deferred).
    max_drain_share: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1)] = 0.25
    #: Seconds to wait for Slurm to show a drained or undrained node.
    verify_timeout_s: Annotated[StrictFloat | StrictInt, Field(gt=0, le=600)] = 10


register_section("health", Health, Health())


class HookPolicy(_Strict):
    """``[hook]``: the job_submit hook's policy (docs/site-config.md, docs/hook.md).

    Rendered into the hook's rules by :mod:`hetslurm.site.hook_rules`.
    """

    #: ``enforce`` rewrites and rejects; ``shadow`` decides and logs only; ``off`` does nothing.
    mode: Annotated[str, Field(pattern=r"^(enforce|shadow|off)$")] = "enforce"
    #: Where the decision record goes: ``admin_comment`` (users cannot edit it), ``comment``
    #: or ``none`` (then ``scontrol update`` cannot be checked against the decision).
    record_field: Annotated[str, Field(pattern=r"^(admin_comment|comment|none)$")] = (
        "admin_comment")
    #: The record's namespace: the hook owns only the ``<record_key>:{...}`` segment.
    record_key: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = "hetslurm"
    #: Bound on the segment; optional parts are dropped to fit.
    record_max_bytes: Annotated[StrictInt, Field(ge=96, le=1024)] = 384
    #: Bound on the whole field; past it the record is not written (other tools' text stays).
    record_max_field_bytes: Annotated[StrictInt, Field(ge=96, le=65536)] = 4096
    #: ``wait4switch`` for ``locality=switch`` without ``switch-wait=``, in seconds.
    switch_wait_default_s: Annotated[StrictInt, Field(ge=0, le=86400)] = 300
    #: QOS per ``priority=`` level; a level without one leaves the job's QOS alone.
    priority_qos: dict[str, str] = Field(default_factory=dict)
    #: Who may ask for ``priority=high``: user names, accounts; ``"*"`` in users means anyone.
    high_priority_users: tuple[str, ...] = ()
    high_priority_accounts: tuple[str, ...] = ()
    #: uids whose ``scontrol update`` may change fields the hook wrote (root by default).
    modify_exempt_uids: tuple[Annotated[StrictInt, Field(ge=0)], ...] = (0,)
    #: GPU models ``energy=low`` narrows to, in the site's order (empty: no narrowing).
    energy_low_models: tuple[str, ...] = ()


register_section("hook", HookPolicy, HookPolicy())


class QosLever(_Strict):
    """``[levers.qos.<name>]``: a QOS hetslurm creates or updates in slurmdbd (sacctmgr).

    Limit keys name a device model (``h100`` becomes ``gres/gpu:h100``), or ``gpu``,
    ``fpga``, ``shard``, ``cpu``, ``node`` or ``mem`` (MiB).
    """

    description: str = ""
    priority: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] = 0
    usage_factor: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1000)] | None = None
    max_tres_per_user: dict[str, Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=dict)
    max_tres_per_job: dict[str, Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=dict)
    max_jobs_per_user: Annotated[StrictInt, Field(ge=0)] | None = None
    max_wall: str | None = None
    #: Associations that may use the QOS (``sacctmgr modify ... set qos+=<name>``).
    accounts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()


class GpuReserve(_Strict):
    """``[levers.gpu_reserve.<partition>]``: cores and memory of every device node in the
    partition that jobs of that partition may not take (``MaxCPUsPerNode``/``MaxMemPerNode``)."""

    cores: Annotated[StrictInt, Field(ge=0, le=4096)] = 0
    memory: MemoryMiB | None = None


class Levers(_Strict):
    """``[levers]``: Slurm settings hetslurm derives from the site (docs/levers.md)."""

    #: ``power_cost``: node Weight from energy and cost per unit of work (falls back to
    #: ``order`` when no model has power or cost); ``order``: the site's model order only.
    weight_from: Annotated[str, Field(pattern=r"^(power_cost|order)$")] = "power_cost"
    #: 1 ranks by energy per unit of work only, 0 by cost only.
    energy_cost_balance: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1)] = 0.5
    #: Cost of one device-hour per model (any currency; only ratios matter).
    cost_per_device_hour: dict[str, Annotated[StrictFloat | StrictInt, Field(ge=0)]] = Field(
        default_factory=dict)
    #: Relative throughput per GPU model and workload type: ``{model: {type: speed}}``.
    speed: dict[str, dict[str, Annotated[StrictFloat | StrictInt, Field(gt=0)]]] = Field(
        default_factory=dict)
    #: Read the speed table from a file instead: ``gavel:<path>`` (Gavel's
    #: simulation_throughputs.json; ``$HETSLURM_TRACES`` is expanded).
    speed_table: str | None = None
    #: Workload type whose speed sets billing; default: geometric mean over the types.
    billing_workload: str | None = None
    #: Billing units (one CPU = ``billing_cpu``) of an hour on the slowest GPU model.
    billing_gpu: Annotated[StrictFloat | StrictInt, Field(gt=0, le=1_000_000)] = 4.0
    billing_cpu: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1_000_000)] = 1.0
    #: Billing units per GiB of memory (0: memory is not billed).
    billing_mem_gib: Annotated[StrictFloat | StrictInt, Field(ge=0, le=1_000_000)] = 0.0
    #: ``PriorityFlags=MAX_TRES``: a job is billed for its dominant resource, not the sum.
    billing_max_tres: StrictBool = True
    #: ``PriorityWeightTRES`` for the fastest GPU model (slower ones scaled by speed).
    priority_weight_gpu: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] | None = None
    priority_weight_fairshare: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] | None = None
    #: ``PriorityWeightQOS``, rendered when some ``[levers.qos]`` has a ``priority``: without
    #: it Slurm's multifactor priority ignores QOS priority, and ``priority=high`` would only
    #: rename the QOS. A QOS adds ``weight x its priority / the highest QOS priority``.
    priority_weight_qos: Annotated[StrictInt, Field(ge=0, le=2**31 - 1)] = 100_000
    #: ``PriorityCalcPeriod`` in minutes (how often fair-share usage is charged).
    priority_calc_period_min: Annotated[StrictInt, Field(ge=1, le=1440)] | None = None
    #: ``PriorityDecayHalfLife`` as a Slurm time (``7-0``); ``0`` disables decay.
    priority_decay_half_life: str | None = None
    gpu_reserve: dict[str, GpuReserve] = Field(default_factory=dict)
    #: ``gres/shard`` per GPU by model: jobs asking ``--gres=shard:N`` share a GPU.
    shards: dict[str, Annotated[StrictInt, Field(ge=1, le=128)]] = Field(default_factory=dict)
    #: MIG profiles every GPU of a model is split into (``a100 = ["3g.20gb", "1g.5gb"]``);
    #: each slice becomes a gpu gres of its own type (``a100_3g_20gb``), docs/levers.md.
    #: (Kept out of repr so the digest of sites without MIG stays as it was; render.py
    #: hashes it on its own.)
    mig: dict[str, tuple[str, ...]] = Field(default_factory=dict, repr=False)
    qos: dict[str, QosLever] = Field(default_factory=dict)


register_section("levers", Levers | None, None)


#: The longest job name a classification rule may key on (Slurm keeps names far shorter in
#: practice; the bound keeps the rendered hook small and every message readable).
MAX_CLASSIFY_NAME = 200
#: At most this many rules: each is one row of the table rendered into the hook.
MAX_CLASSIFY_RULES = 20000


def _no_control(value: str) -> str:
    if re.search(r"[\x00-\x1f\x7f]", value):
        raise ValueError("holds a control character (newline, tab, NUL, ...); rules key on "
                         "printable names only")
    return value


_Printable = AfterValidator(_no_control)


class ClassifyRule(_Strict):
    """One learned rule: jobs of ``user`` named ``name`` submitted without ``class=`` belong
    to ``class`` (``hetslurm learn classes`` writes them; docs/learn.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    user: Annotated[str, Field(min_length=1, max_length=64), _Printable]
    #: The job name exactly as Slurm holds it (sbatch's default: the script's file name).
    name: Annotated[str, Field(min_length=1, max_length=MAX_CLASSIFY_NAME), _Printable]
    wclass: str = Field(alias="class")
    #: Why, in one line (shown to the user and kept in the rule file for the admin).
    evidence: Annotated[str, Field(max_length=200), _Printable] = ""


class Classify(_Strict):
    """``[classify]``: classification from evidence (issue 22; docs/site-config.md).

    ``off``: the rules are kept but not rendered into the hook; ``suggest``: the hook tells
    the user which class it would use and records it; ``apply``: the hook applies it.
    """

    mode: Annotated[str, Field(pattern=r"^(off|suggest|apply)$")] = "off"
    rules: Annotated[tuple[ClassifyRule, ...], Field(max_length=MAX_CLASSIFY_RULES)] = ()


register_section("classify", Classify, Classify())


#: Largest score weight (docs/placement.md, "The score"): with every weight at most this, a
#: node's weighted terms cannot overflow int64. ``hetslurm.placement.place.MAX_SCORE_WEIGHT``
#: is the same bound (placement must not import pydantic; a unit test holds them equal).
MAX_SCORE_WEIGHT = 1 << 24
_ScoreWeight = Annotated[StrictInt, Field(ge=0, le=MAX_SCORE_WEIGHT)]


class PlacementWeights(_Strict):
    """``[placement.weights]``: the score's term weights (docs/placement.md, "The score").

    Every key is optional; an unset key keeps ``ScoreWeights``'s default, which
    ``hetslurm.placement.place.ScoreWeights.from_site`` applies (the defaults live there).
    """

    model: _ScoreWeight | None = None
    islands: _ScoreWeight | None = None
    numa: _ScoreWeight | None = None
    leftover: _ScoreWeight | None = None
    load: _ScoreWeight | None = None
    energy: _ScoreWeight | None = None
    weight: _ScoreWeight | None = None
    energy_low: _ScoreWeight | None = None
    switch: _ScoreWeight | None = None


class PlacementSection(_Strict):
    """``[placement]``: how ``hetslurm place`` and ``explain`` score nodes, and which measured
    values they may read from the metrics store (docs/placement.md, docs/site-config.md)."""

    weights: PlacementWeights = PlacementWeights()
    #: The measured load of a node is the mean GPU utilization of its GPUs over this many
    #: seconds before the state's time; a node with no usable sample in it counts as 0.
    load_window_s: Annotated[StrictInt, Field(ge=1, le=86400)] = 600
    #: Read per-model GPU watts from the store for the energy term (``--measured-energy``
    #: overrides); off: the site's ``power_*_watts``.
    measured_energy: StrictBool = False
    #: Window of samples for the measured watts.
    energy_window_s: Annotated[StrictInt, Field(ge=60, le=90 * 86400)] = 7 * 86400
    #: A model's measured watts are used only with at least this many busy and this many idle
    #: samples; else the site's figures stay.
    energy_min_samples: Annotated[StrictInt, Field(ge=1, le=10_000_000)] = 100


register_section("placement", PlacementSection, PlacementSection())
