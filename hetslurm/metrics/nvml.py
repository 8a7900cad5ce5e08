"""NVML, touched here and nowhere else (the gpustat way).

:class:`NvmlSource` is what the collector reads: a list of :class:`GpuReading` per call.
:class:`RealNvml` talks to the driver through ``pynvml`` (from the ``nvidia-ml-py``
package; the PyPI package named ``pynvml`` is deprecated). A field NVML does not support
becomes ``None``; a lost GPU becomes a reading with status ``lost``, not an exception.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

from hetslurm.errors import MetricsError
from hetslurm.metrics.samples import (
    STATUS_ERROR,
    STATUS_LOST,
    STATUS_MIG,
    STATUS_NOT_SUPPORTED,
    STATUS_OK,
    GpuReading,
    throttle_names,
)

T = TypeVar("T")
_MIB = 1024 * 1024


class NvmlSource(abc.ABC):
    """Something that lists one node's GPUs with their current readings."""

    @abc.abstractmethod
    def read(self, node: str) -> list[GpuReading]:
        """Every device NVML enumerates on ``node``, in NVML's own order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the library (called once when the collector stops)."""


class _Lost(Exception):
    pass


def load_pynvml() -> Any:
    """Import ``pynvml`` or raise one actionable error."""
    try:
        import pynvml
    except ImportError as exc:
        raise MetricsError(
            "the real NVML path needs the 'nvidia-ml-py' package (pip install nvidia-ml-py)"
        ) from exc
    return pynvml


#: nvml.h's ``nvmlEventTypeXidCriticalError``, used where pynvml lacks the name.
_XID_EVENT = 0x0000000000000008
#: nvml.h's ``NVML_MEMORY_ERROR_TYPE_UNCORRECTED`` and ``NVML_VOLATILE_ECC``.
_ECC_UNCORRECTED, _ECC_VOLATILE = 1, 0


class RealNvml(NvmlSource):
    """The driver's NVML on the local machine (``node`` only labels the readings).

    XID critical errors arrive through an NVML event set registered for every device that
    supports it; each :meth:`read` drains it without waiting (0 ms) and reports the last XID
    per device since the previous read.
    """

    def __init__(self) -> None:
        self._nv = load_pynvml()
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            raise MetricsError(
                f"NVML cannot start ({exc}); is the NVIDIA driver installed and loaded? "
                "Use [collector] nvml = \"fake\" on machines without GPUs") from exc
        self._events: Any = None
        self._xid_registered: set[int] = set()

    def close(self) -> None:
        nv = self._nv
        if self._events is not None:
            with contextlib.suppress(nv.NVMLError, AttributeError):
                nv.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()

    def _watch_xid(self, i: int, h: Any) -> None:
        """Register device ``i`` for XID critical-error events (once; best effort: a device
        or a library without events simply reports no XID)."""
        nv = self._nv
        if i in self._xid_registered:
            return
        self._xid_registered.add(i)
        try:
            if self._events is None:
                self._events = nv.nvmlEventSetCreate()
            kind = getattr(nv, "nvmlEventTypeXidCriticalError", _XID_EVENT)
            nv.nvmlDeviceRegisterEvents(h, kind, self._events)
        except (nv.NVMLError, AttributeError):
            return

    def _drain_xids(self) -> dict[int, int]:
        """NVML index -> the last XID the event set holds, waiting for nothing."""
        nv = self._nv
        out: dict[int, int] = {}
        if self._events is None:
            return out
        wait = getattr(nv, "nvmlEventSetWait_v2", None) or getattr(nv, "nvmlEventSetWait", None)
        if wait is None:
            return out
        for _ in range(1024):  # a bound: an event storm must not hold the tick
            try:
                data = wait(self._events, 0)
            except nv.NVMLError:  # NVMLError_Timeout: nothing (more) pending
                break
            try:
                index = int(nv.nvmlDeviceGetIndex(data.device))
            except (nv.NVMLError, AttributeError):
                continue
            out[index] = int(data.eventData)
        return out

    def _throttle(self, h: Any) -> str | None:
        nv = self._nv
        get = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
        if get is None:
            return None
        mask = self._opt(lambda: int(get(h)))
        return None if mask is None else throttle_names(mask)

    def _ecc(self, h: Any) -> int | None:
        nv = self._nv
        get = getattr(nv, "nvmlDeviceGetTotalEccErrors", None)
        if get is None:
            return None
        kind = getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", _ECC_UNCORRECTED)
        counter = getattr(nv, "NVML_VOLATILE_ECC", _ECC_VOLATILE)
        return self._opt(lambda: int(get(h, kind, counter)))

    def _opt(self, fn: Callable[[], T]) -> T | None:
        """Call an NVML getter: not supported -> None, lost -> _Lost, other errors -> None."""
        nv = self._nv
        try:
            return fn()
        except nv.NVMLError_NotSupported:
            return None
        except nv.NVMLError_GpuIsLost as exc:
            raise _Lost(str(exc)) from exc
        except nv.NVMLError:
            return None

    def read(self, node: str) -> list[GpuReading]:
        nv = self._nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            raise MetricsError(f"NVML cannot count devices: {exc}") from exc
        xids = self._drain_xids()
        return [self._read_one(i, xids.get(i)) for i in range(count)]

    def _read_one(self, i: int, xid: int | None = None) -> GpuReading:
        nv = self._nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as exc:
            status = STATUS_LOST if isinstance(exc, nv.NVMLError_GpuIsLost) else STATUS_ERROR
            return GpuReading(nvml_index=i, minor=None, uuid=None, status=status, error=str(exc))
        minor: int | None = None
        uuid: str | None = None
        try:
            minor = self._opt(lambda: int(nv.nvmlDeviceGetMinorNumber(h)))
            uuid = self._opt(lambda: _text(nv.nvmlDeviceGetUUID(h)))
            name = self._opt(lambda: _text(nv.nvmlDeviceGetName(h)))
            mig = self._opt(lambda: int(nv.nvmlDeviceGetMigMode(h)[0]))
            util = self._opt(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
            mem = self._opt(lambda: nv.nvmlDeviceGetMemoryInfo(h))
            # NVML: power in milliwatts, energy in millijoules since the driver loaded.
            power = self._opt(lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
            energy = self._opt(lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0)
            throttle = self._throttle(h)
            ecc = self._ecc(h)
        except _Lost as exc:
            return GpuReading(nvml_index=i, minor=minor, uuid=uuid, status=STATUS_LOST,
                              error=str(exc), xid=xid)
        self._watch_xid(i, h)
        status = STATUS_OK
        if mig == 1:
            status = STATUS_MIG
        elif util is None:
            status = STATUS_NOT_SUPPORTED
        return GpuReading(
            nvml_index=i, minor=minor, uuid=uuid, name=name,
            utilization_pct=util if status == STATUS_OK else None,
            memory_used_mib=None if mem is None else mem.used / _MIB,
            memory_total_mib=None if mem is None else mem.total / _MIB,
            power_w=power, energy_j=energy, mig_mode=mig, status=status,
            throttle_reasons=throttle, ecc_uncorrectable=ecc, xid=xid,
        )


def _text(value: Any) -> str:
    # Older nvidia-ml-py returned bytes for strings.
    return value.decode() if isinstance(value, bytes) else str(value)
