"""The real NVML path: field mapping against a stand-in module, and on a real GPU."""

from __future__ import annotations

import types
from typing import Any

import pytest

from hetslurm.errors import MetricsError
from hetslurm.metrics import nvml as nvml_mod
from hetslurm.metrics.nvml import RealNvml


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
