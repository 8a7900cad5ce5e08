"""The sample record: one GPU at one instant, attributed to a job, and its column schema.

A sample is one row of the store. Values NVML did not give are null; ``status`` says why a
sample is *unknown* (never idle): ``ok`` is the only status whose utilization counts.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

#: Reading statuses. Every status but ``ok`` makes the sample unknown.
STATUS_OK = "ok"
STATUS_NOT_SUPPORTED = "not_supported"  # NVML gave no utilization for this device
STATUS_LOST = "lost"  # NVML says the GPU is lost (fell off the bus, XID 79, ...)
STATUS_MISSING = "missing"  # gres.conf names the device, NVML does not list it
STATUS_MIG = "mig"  # MIG mode on: whole-GPU utilization means nothing
STATUS_UNMATCHED = "unmatched"  # NVML lists it, no gres.conf File= has its minor
STATUS_ERROR = "error"  # any other NVML error
#: The node's NVML read did not answer within ``[collector] source_timeout_s`` (or an earlier
#: read of the node still hangs): nothing is known of its devices this tick.
STATUS_UNKNOWN = "unknown"
STATUSES = (STATUS_OK, STATUS_NOT_SUPPORTED, STATUS_LOST, STATUS_MISSING, STATUS_MIG,
            STATUS_UNMATCHED, STATUS_ERROR, STATUS_UNKNOWN)

#: NVML clock-event (throttle) reasons that need attention, by the names samples carry, and
#: their bits in ``nvmlDeviceGetCurrentClocksEventReasons`` (nvml.h; the same bits as the
#: older ``...ThrottleReasons``). GPU idle, application clocks, sync boost and the display
#: clock setting are normal operation and are not reported.
THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x04,
    "hw_slowdown": 0x08,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake": 0x80,
}


def throttle_names(mask: int) -> str:
    """The comma-separated reasons of ``THROTTLE_REASONS`` set in an NVML reason bit mask
    ("" when none is: read, nothing that needs attention)."""
    return ",".join(name for name, bit in THROTTLE_REASONS.items() if mask & bit)


#: Column name -> Arrow type name; the order is the store's column order.
COLUMNS: dict[str, str] = {
    "time": "float64",  # epoch seconds (UTC), rounded to ms
    "node": "string",
    "nvml_index": "int16",  # NVML's enumeration order (PCI bus order), not Slurm's
    "minor": "int32",  # /dev/nvidia<minor>
    "uuid": "string",
    "gpu_model": "string",  # gres.conf Type= of the Slurm device
    "slurm_index": "int16",  # Slurm's GRES index on the node (null: unmatched)
    "job_id": "int64",  # null: no job holds the GPU (or Slurm did not answer)
    "job_gpus": "string",  # the job's GPU indices on this node, Slurm's form "0-1,4"
    "utilization_pct": "float32",
    "memory_used_mib": "float32",
    "memory_total_mib": "float32",
    "power_w": "float32",
    "energy_j": "float64",  # NVML's total energy counter since driver load
    "mig_mode": "int8",  # 1 on, 0 off, null not supported
    "status": "string",
    "interval_s": "float32",  # the collector's interval: the time this sample stands for
    "attributed": "bool",  # Slurm answered this tick (job_id null then means "free")
    "clock_jump": "bool",  # wall clock moved differently from the monotonic clock
    # Device health (issue 23). Segments written before these columns lack them and read
    # with them null (store.py); keep new columns at the end so old ones stay a prefix.
    "throttle_reasons": "string",  # THROTTLE_REASONS names, "," joined; "" none; null unread
    "ecc_uncorrectable": "int64",  # volatile uncorrected ECC count; null: no ECC
    "xid": "int32",  # the last XID critical error since the previous tick; null: none
}
#: Columns a segment may lack (written before they existed); they read as null.
HEALTH_COLUMNS = ("throttle_reasons", "ecc_uncorrectable", "xid")
#: String columns read as categoricals (few distinct values, many rows).
CATEGORICAL = ("node", "uuid", "gpu_model", "job_gpus", "status")


def value_bounds() -> dict[str, tuple[float, float]]:
    """The closed range of every numeric reading a collector can write (null aside: NVML
    gave none). NaN and infinities fall outside every range. ``interval_s`` is positive
    and at most ``[collector] interval_s``'s maximum, read from the schema so the two
    cannot drift (the class itself may run faster than the schema's minimum: tests do)."""
    from hetslurm.site.schema import Collector

    meta = Collector.model_fields["interval_s"].metadata
    lo = 1e-3  # a millisecond: times are stored to the millisecond
    hi = float(next(m.le for m in meta if hasattr(m, "le")))
    # Sizes, power and energy have no natural ceiling, but a finite one: inf is no reading.
    big = float(2**63)
    return {"utilization_pct": (0.0, 100.0), "memory_used_mib": (0.0, big),
            "memory_total_mib": (0.0, big), "power_w": (0.0, big), "energy_j": (0.0, big),
            "interval_s": (lo, hi), "ecc_uncorrectable": (0.0, big), "xid": (0.0, big)}


@dataclass(frozen=True)
class GpuReading:
    """What NVML says about one device at one instant (None: not supported / unknown)."""

    nvml_index: int
    minor: int | None
    uuid: str | None
    name: str | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    power_w: float | None = None
    energy_j: float | None = None
    mig_mode: int | None = None
    #: Active THROTTLE_REASONS names, "," joined ("": none; None: not read / unsupported).
    throttle_reasons: str | None = None
    #: Volatile uncorrected ECC error count (None: ECC unsupported or disabled).
    ecc_uncorrectable: int | None = None
    #: The most recent XID critical error seen since the previous read (None: none seen).
    xid: int | None = None
    status: str = STATUS_OK
    error: str | None = None


@functools.cache
def arrow_schema() -> Any:
    """The store's ``pyarrow.Schema`` (pyarrow imported here, not at module import; built
    once: a schema is immutable)."""
    import pyarrow as pa

    types = {"float64": pa.float64(), "float32": pa.float32(), "string": pa.string(),
             "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "int8": pa.int8(),
             "bool": pa.bool_()}
    return pa.schema([(name, types[t]) for name, t in COLUMNS.items()])
