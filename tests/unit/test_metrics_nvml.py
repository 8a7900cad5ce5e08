"""The real NVML path: field mapping against a stand-in module, and on a real GPU."""

from __future__ import annotations

import types
from typing import Any

import pytest

from hetslurm.errors import MetricsError
from hetslurm.metrics import nvml as nvml_mod
from hetslurm.metrics.nvml import RealNvml
from hetslurm.metrics.samples import THROTTLE_REASONS


def _stub(lost_at: int | None = None, util_unsupported: bool = False) -> Any:
    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    def util(h: int) -> Any:
        if util_unsupported:
            raise NVMLError_NotSupported()
        return types.SimpleNamespace(gpu=10 * h)

    def minor(h: int) -> int:
        if h == lost_at:
            raise NVMLError_GpuIsLost()
        return 200 + h

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NVMLError_NotSupported,
        NVMLError_GpuIsLost=NVMLError_GpuIsLost,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMinorNumber=minor,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(), nvmlDeviceGetName=lambda h: "X",
        nvmlDeviceGetMigMode=lambda h: (0, 0), nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 * 2**20,
                                                                total=8 * 2**20),
        nvmlDeviceGetPowerUsage=lambda h: 150_000,
        nvmlDeviceGetTotalEnergyConsumption=lambda h: 5_000_000,
    )


def test_fields_units_and_lost_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: _stub(lost_at=1))
    r0, r1 = RealNvml().read("n")
    assert (r0.minor, r0.uuid, r0.utilization_pct) == (200, "GPU-0", 0.0)
    assert (r0.memory_used_mib, r0.memory_total_mib, r0.power_w, r0.energy_j) == (
        2.0, 8.0, 150.0, 5000.0)
    assert r1.status == "lost" and r1.utilization_pct is None


def test_not_supported_utilization_becomes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: _stub(util_unsupported=True))
    r0, _ = RealNvml().read("n")
    assert r0.status == "not_supported" and r0.utilization_pct is None
    assert r0.memory_used_mib == 2.0


def _with_health(stub: Any, *, old_names: bool = False, ecc_supported: bool = True,
                 xids: list[tuple[int, int]] | None = None) -> Any:
    """``stub`` with the health calls: clock-event reasons (or, ``old_names``, the older
    throttle-reason call), ECC counts and an event set that yields ``xids`` (index, code)."""
    pending = list(xids or [])
    registered: list[int] = []

    class NVMLError_Timeout(stub.NVMLError):  # type: ignore[name-defined,misc]
        pass

    def reasons(h: int) -> int:
        # device 0: HW slowdown + power cap + GPU idle (0x1, ignored); device 1: idle only
        return 0x08 | 0x04 | 0x01 if h == 0 else 0x01

    def ecc(h: int, kind: int, counter: int) -> int:
        if not ecc_supported:
            raise stub.NVMLError_NotSupported()
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        return 3 if h == 0 else 0

    def wait(event_set: object, timeout_ms: int) -> Any:
        assert timeout_ms == 0
        if not pending:
            raise NVMLError_Timeout()
        index, code = pending.pop(0)
        return types.SimpleNamespace(device=index, eventData=code)

    stub.NVMLError_Timeout = NVMLError_Timeout
    setattr(stub, "nvmlDeviceGetCurrentClocksThrottleReasons" if old_names
            else "nvmlDeviceGetCurrentClocksEventReasons", reasons)
    stub.nvmlDeviceGetTotalEccErrors = ecc
    stub.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, stub.NVML_VOLATILE_ECC = 1, 0
    stub.nvmlEventTypeXidCriticalError = 8
    stub.nvmlEventSetCreate = lambda: "set"
    stub.nvmlEventSetFree = lambda s: None
    stub.nvmlDeviceRegisterEvents = lambda h, kind, s: registered.append(h)
    stub.nvmlEventSetWait_v2 = wait
    stub.nvmlDeviceGetIndex = lambda h: h
    stub.pending, stub.registered = pending, registered
    return stub


def test_health_fields_throttle_ecc_and_xid(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = _with_health(_stub())
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: stub)
    src = RealNvml()
    r0, r1 = src.read("n")
    assert (r0.throttle_reasons, r1.throttle_reasons) == ("sw_power_cap,hw_slowdown", "")
    assert (r0.ecc_uncorrectable, r1.ecc_uncorrectable) == (3, 0)
    assert (r0.xid, r1.xid) == (None, None) and stub.registered == [0, 1]
    stub.pending.extend([(1, 13), (1, 79), (0, 48)])
    r0, r1 = src.read("n")
    assert (r0.xid, r1.xid) == (48, 79)  # the last XID of each device since the last read
    r0, r1 = src.read("n")
    assert (r0.xid, r1.xid) == (None, None)
    assert stub.registered == [0, 1]  # registered once
    src.close()


def test_health_fields_degrade_to_none(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = _with_health(_stub(), old_names=True, ecc_supported=False)
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: stub)
    r0, _ = RealNvml().read("n")
    assert r0.throttle_reasons == "sw_power_cap,hw_slowdown"  # the older call still works
    assert r0.ecc_uncorrectable is None
    bare = _stub(lost_at=1)  # a library with none of the health calls
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: bare)
    r0, r1 = RealNvml().read("n")
    assert (r0.throttle_reasons, r0.ecc_uncorrectable, r0.xid) == (None, None, None)
    assert r0.status == "ok" and r1.status == "lost"


@pytest.mark.gpu
def test_real_nvml_on_a_real_gpu() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pytest.skip("no NVIDIA driver here (NVMLError_LibraryNotFound): the only test "
                    "allowed to skip; it runs the real NVML path where a GPU is present")
    pynvml.nvmlShutdown()
    src = RealNvml()
    readings = src.read("local")
    src.close()
    assert readings, "NVML initialised but listed no device"
    for r in readings:
        assert r.minor is not None and r.uuid and r.uuid.startswith(("GPU-", "MIG-"))
        # Health fields are read or None, never an exception (gpustat's rule).
        assert r.throttle_reasons is None or set(r.throttle_reasons.split(",")) - {""} <= set(
            THROTTLE_REASONS)
        assert r.ecc_uncorrectable is None or r.ecc_uncorrectable >= 0
        assert r.memory_total_mib and r.memory_total_mib > 0
        if r.status == "ok":
            assert r.utilization_pct is not None and 0 <= r.utilization_pct <= 100


def test_library_missing_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = _stub()

    def boom() -> None:
        raise stub.NVMLError("NVML Shared Library Not Found")

    stub.nvmlInit = boom
    monkeypatch.setattr(nvml_mod, "load_pynvml", lambda: stub)
    with pytest.raises(MetricsError, match="nvml = \"fake\""):
        RealNvml()
