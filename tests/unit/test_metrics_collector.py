"""The collector: attribution by device minor (never by position), faults, clock jumps."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.errors import BackendError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml, Scenario, scenario_for_devices
from hetslurm.metrics.gres import parse_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.slurm.backend import JobInfo, NodeInfo
from hetslurm.slurm.units import GresItem

GRES = "\n".join([
    "AutoDetect=off",
    "NodeName=gpu1 Name=gpu Type=h100 File=/dev/emu/gpu1/nvidia[0-7] Cores=0-3",
    "NodeName=gpu2 Name=gpu Type=a100 File=/dev/emu/gpu2/nvidia0",
    "NodeName=gpu2 Name=gpu Type=a100 File=/dev/emu/gpu2/nvidia1",
    "NodeName=fpga1 Name=fpga Type=u280 File=/dev/emu/fpga1/fpga0",
])


def minor_of(path: str) -> int | None:
    # Like the testbed: GPU i of n has minor 128 + n-1-i (reversed, never equal to i).
    node, name = path.split("/")[-2:]
    n = 8 if node == "gpu1" else 2
    return 128 + n - 1 - int(name.removeprefix("nvidia"))


def _job(job_id: int, node: str, idx: tuple[int, ...], state: str = "RUNNING") -> JobInfo:
    return JobInfo(job_id=job_id, state=state, nodes=(node,),
                   allocated_gres={node: (GresItem("gpu", "h100", len(idx), idx),)})


def _scenario() -> Scenario:
    return scenario_for_devices({"gpu1": [(128 + 7 - i, "h100") for i in range(8)],
                                 "gpu2": [(129, "a100"), (128, "a100")]}, seed=3)


def _collector(sc: Scenario, backend: FakeSlurm | None, **kw: object) -> Collector:
    gres = parse_gres_conf(GRES)
    return Collector(["gpu1", "gpu2"], FakeNvml(sc), backend, gres, None,
                     minor_of=minor_of, interval_s=1.0, **kw)  # type: ignore[arg-type]


def test_gres_conf_indices_follow_file_order_and_skip_other_kinds() -> None:
    gres = parse_gres_conf(GRES)
    assert [d.path for d in gres["gpu1"]][:2] == ["/dev/emu/gpu1/nvidia0",
                                                  "/dev/emu/gpu1/nvidia1"]
    assert [d.index for d in gres["gpu2"]] == [0, 1]
    assert "fpga1" not in gres


def test_two_jobs_on_one_node_are_told_apart_under_shuffled_minors() -> None:
    sc = _scenario()
    # Job 7 holds indices 4-5; its device files have minors 131 and 130.
    sc.set_gpu("gpu1", 131, utilization=90)
    sc.set_gpu("gpu1", 130, utilization=70)
    backend = FakeSlurm(jobs=[_job(7, "gpu1", (4, 5)), _job(8, "gpu1", (0,))])
    rows = _collector(sc, backend).tick().rows
    by_index = {r["slurm_index"]: r for r in rows if r["node"] == "gpu1"}
    assert by_index[4]["job_id"] == 7 and by_index[4]["utilization_pct"] == 90
    assert by_index[5]["job_id"] == 7 and by_index[5]["utilization_pct"] == 70
    assert by_index[4]["job_gpus"] == "4-5"
    assert by_index[0]["job_id"] == 8 and by_index[0]["job_gpus"] == "0"
    assert by_index[1]["job_id"] is None and by_index[1]["attributed"] is True
    # NVML's order is not Slurm's: position-based mapping would have been wrong.
    assert any(r["nvml_index"] != r["slurm_index"] for r in by_index.values())
    assert len({r["uuid"] for r in rows}) == len(rows)


def test_uuids_and_order_change_with_the_seed_not_the_attribution() -> None:
    a, b = _scenario(), _scenario()
    b.seed = 99
    for sc in (a, b):
        sc.set_gpu("gpu1", 131, utilization=90)
    backend = FakeSlurm(jobs=[_job(7, "gpu1", (4,))])
    ra = {r["slurm_index"]: r for r in _collector(a, backend).tick().rows if r["node"] == "gpu1"}
    rb = {r["slurm_index"]: r for r in _collector(b, backend).tick().rows if r["node"] == "gpu1"}
    assert ra[4]["uuid"] != rb[4]["uuid"]
    assert ra[4]["job_id"] == rb[4]["job_id"] == 7
    assert ra[4]["utilization_pct"] == rb[4]["utilization_pct"] == 90


@pytest.mark.parametrize("fault", ["not_supported", "mig", "lost"])
def test_faults_make_samples_unknown(fault: str) -> None:
    sc = _scenario()
    sc.set_gpu("gpu1", 135, utilization=50, fault=fault)  # index 0
    rows = _collector(sc, FakeSlurm()).tick().rows
    r = next(r for r in rows if r["node"] == "gpu1" and r["minor"] == 135)
    assert r["status"] == fault
    assert r["utilization_pct"] is None


def test_lost_and_missing_gpus_are_reported_and_the_collector_never_drains() -> None:
    # Draining is the health phase of rebalance (hetslurm.act.health), the one path.
    sc = _scenario()
    sc.set_gpu("gpu1", 135, fault="lost")
    sc.set_gpu("gpu2", 128, fault="missing")  # vanished from NVML
    backend = FakeSlurm(nodes=[NodeInfo(name="gpu1", state=frozenset({"IDLE"})),
                               NodeInfo(name="gpu2", state=frozenset({"IDLE"}))])
    res = _collector(sc, backend).tick()
    assert res.lost == {"gpu1": [135], "gpu2": [128]}
    missing = [r for r in res.rows if r["status"] == "missing"]
    assert [(r["node"], r["slurm_index"]) for r in missing] == [("gpu2", 1)]
    assert not backend.node("gpu1").drained and not backend.node("gpu2").drained
    with pytest.raises(TypeError):
        _collector(sc, backend, drain_lost=True)


class _Down(FakeSlurm):
    def jobs(self) -> list[JobInfo]:
        raise BackendError("squeue: slurmctld not responding")


def test_slurm_down_still_records_samples_marked_unattributed() -> None:
    res = _collector(_scenario(), _Down()).tick()
    assert len(res.rows) == 10
    assert all(r["attributed"] is False and r["job_id"] is None for r in res.rows)


def test_a_clock_jump_is_flagged_and_nothing_is_lost(tmp_path: Path) -> None:
    wall = iter([1000.0, 1001.0, 900.0, 901.0])
    mono = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0, 5.0])
    gres = parse_gres_conf(GRES)
    store = SegmentStore(tmp_path)
    coll = Collector(["gpu2"], FakeNvml(_scenario(), clock=lambda: 0.0), FakeSlurm(), gres,
                     store, minor_of=minor_of, interval_s=1.0, flush_s=0.5,
                     clock=lambda: next(wall), monotonic=lambda: next(mono))
    jumps = [coll.tick().rows[0]["clock_jump"] for _ in range(4)]
    coll.flush()
    assert jumps == [False, False, True, False]
    frame, report = store.read()
    assert len(frame) == 8 and not report.partial
    assert frame["clock_jump"].sum() == 2


def test_run_flushes_segments_and_stops_after_ticks(tmp_path: Path) -> None:
    gres = parse_gres_conf(GRES)
    store = SegmentStore(tmp_path)
    coll = Collector(["gpu1"], FakeNvml(_scenario()), FakeSlurm(), gres, store,
                     minor_of=minor_of, interval_s=0.05, flush_s=0.1)
    assert coll.run(ticks=5) == 5
    frame, _ = store.read()
    assert len(frame) == 40 and len(coll.written) >= 1


def test_scenario_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    sc = _scenario()
    path = tmp_path / "sc.json"
    sc.save(path)
    nv = FakeNvml(path)
    assert {r.utilization_pct for r in nv.read("gpu2")} == {0.0}
    sc.set_gpu("gpu2", 129, utilization=[[0, 40], [1e12, 99]])
    sc.save(path)
    import os

    os.utime(path, ns=(1, 1))  # a different mtime even within one clock tick
    assert sorted(r.utilization_pct or 0 for r in nv.read("gpu2")) == [0.0, 40.0]


def test_a_store_that_cannot_be_written_keeps_the_samples(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18: the store's disk full. A failed segment keeps its samples for the next flush
    (nothing lost), and the run's last flush says what could not be written."""
    import errno

    from hetslurm.errors import MetricsError
    from hetslurm.metrics import store as store_mod

    gres = parse_gres_conf(GRES)
    store = SegmentStore(tmp_path)
    coll = Collector(["gpu1"], FakeNvml(_scenario()), FakeSlurm(), gres, store,
                     minor_of=minor_of, interval_s=1.0, flush_s=1.0)
    real = store_mod._write_atomic
    full = {"on": True}

    def write(table: object, target: Path) -> None:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(table, target)

    monkeypatch.setattr(store_mod, "_write_atomic", write)
    coll.tick()
    assert coll.flush() == []
    assert len(coll.buffer["gpu1"]) == 8  # kept
    coll.tick()
    coll.flush()
    assert len(coll.buffer["gpu1"]) == 16
    full["on"] = False  # space again: everything buffered is written
    coll.tick()
    assert len(coll.flush()) == 1
    frame, _ = store.read()
    assert len(frame) == 24 and not coll.buffer["gpu1"]
    # Full at the end of a run: an error that names the node and the count.
    full["on"] = True
    coll.tick()
    with pytest.raises(MetricsError, match=r"gpu1: 8 sample\(s\): No space left on device"):
        coll.flush(final=True)
    assert not list(tmp_path.rglob(".tmp-*"))
