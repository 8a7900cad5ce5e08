"""Fake hardware that misbehaves: the scenario's health keys over time, and
`hetslurm testbed fake` (Slurm index -> gres.conf File= -> minor, never by position)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.metrics import fake_script
from hetslurm.metrics.fake_nvml import FakeNvml, Scenario, scenario_for_devices
from hetslurm.metrics.gres import device_minor

T0 = 1_796_000_000.0

# Character devices every Linux has, so the real device_minor() maps index -> minor:
# /dev/urandom is 1:9, /dev/null 1:3, /dev/zero 1:5. Index 0 is minor 9: never position.
GRES = """\
NodeName=gpu1 Name=gpu Type=h100 File=/dev/urandom
NodeName=gpu1 Name=gpu Type=h100 File=/dev/null
NodeName=gpu1 Name=gpu Type=h100 File=/dev/zero
NodeName=gpu2 Name=gpu Type=a100 File=/dev/full
"""
MINORS = {"gpu1": {0: 9, 1: 3, 2: 5}, "gpu2": {0: 7}}


def _clock(t: list[float]) -> Any:
    return lambda: t[0]


def test_health_keys_and_energy_over_time() -> None:
    sc = scenario_for_devices({"n": [(4, "h100"), (5, "h100")]}, start=T0)
    sc.set_gpu("n", 4, power_w=[[0, 100], [10, 300]], throttle="hw_power_brake",
               ecc_uncorrectable=2, xid=[[5, 79]])
    t = [T0]
    nv = FakeNvml(sc, clock=_clock(t))
    by_minor = {r.minor: r for r in nv.read("n")}
    r4, r5 = by_minor[4], by_minor[5]
    assert (r4.throttle_reasons, r4.ecc_uncorrectable, r4.xid) == ("hw_power_brake", 2, None)
    assert (r5.throttle_reasons, r5.ecc_uncorrectable, r5.xid) == ("", 0, None)
    assert r4.energy_j == 0.0 and r5.energy_j is None  # unscripted power: no counter
    t[0] = T0 + 20
    r4 = {r.minor: r for r in nv.read("n")}[4]
    assert r4.power_w == 300 and r4.energy_j == pytest.approx(100 * 10 + 300 * 10)
    assert r4.xid == 79  # the event at 5 s, seen by the first read after it
    t[0] = T0 + 30
    r4 = {r.minor: r for r in nv.read("n")}[4]
    assert r4.xid is None and r4.energy_j == pytest.approx(1000 + 300 * 20)


def test_lost_key_and_not_supported_health() -> None:
    sc = scenario_for_devices({"n": [(4, "h100"), (5, "h100")]}, start=T0)
    sc.set_gpu("n", 4, lost=1, xid=[[0, 48], [1, 79]])  # 48: before the reader started
    sc.set_gpu("n", 5, fault="not_supported", throttle="hw_slowdown")
    rows = {r.minor: r for r in FakeNvml(sc, clock=lambda: T0 + 1).read("n")}
    assert rows[4].status == "lost" and rows[4].xid == 79 and rows[4].utilization_pct is None
    assert rows[5].status == "not_supported" and rows[5].throttle_reasons is None


def test_hang_blocks_until_cleared_or_closed() -> None:
    sc = scenario_for_devices({"n": [(4, "h100")], "m": [(1, "h100")]}, start=T0)
    sc.set_gpu("n", 4, hang=1)
    nv = FakeNvml(sc, clock=lambda: T0)
    assert len(nv.read("m")) == 1  # another node still answers
    done: list[int] = []
    th = threading.Thread(target=lambda: done.append(len(nv.read("n"))), daemon=True)
    th.start()
    th.join(0.3)
    assert th.is_alive() and not done
    sc.gpus["n/4"].pop("hang")
    th.join(2)
    assert done == [1]


def _setup(tmp_path: Path, *, with_scenario: bool = True) -> Path:
    tb = tmp_path / "tb"
    (tb / "etc").mkdir(parents=True)
    (tb / "etc" / "gres.conf").write_text(GRES)
    if with_scenario:
        fake_script.new_scenario(tb / "etc" / "gres.conf", tb / "fake-nvml.json", now=T0)
    return tb


def _run(tb: Path, *args: str) -> Any:
    return CliRunner().invoke(cli, ["testbed", "fake", "--dir", str(tb), *args])


def test_the_gres_conf_stand_ins_are_character_devices() -> None:
    assert {i: device_minor(p) for i, p in enumerate(
        ["/dev/urandom", "/dev/null", "/dev/zero"])} == MINORS["gpu1"]


def test_cli_sets_by_slurm_index_and_lists(tmp_path: Path) -> None:
    tb = _setup(tmp_path)
    res = _run(tb, "gpu1/0", "util=95", "power_w=600", "throttle=hw_slowdown", "xid=79",
               "ecc_uncorrectable=2")
    assert res.exit_code == 0, res.output
    sc = Scenario.load(tb / "fake-nvml.json")
    assert set(sc.gpus) == {"gpu1/9"}  # index 0 is minor 9 (gres.conf), not the first minor
    g = sc.gpus["gpu1/9"]
    assert g["utilization"] == 95 and g["throttle"] == "hw_slowdown"
    assert g["power_w"][-1][1] == 600 and g["xid"][-1][1] == 79
    res = _run(tb, "--list", "--format", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [(r["node"], r["slurm_index"], r["minor"]) for r in rows] == [
        ("gpu1", 0, 9), ("gpu1", 1, 3), ("gpu1", 2, 5), ("gpu2", 0, 7)]
    assert list(rows[0]) == list(fake_script.LIST_COLUMNS)
    first = rows[0]
    assert (first["util"], first["power_w"], first["throttle"], first["xid"],
            first["ecc_uncorrectable"]) == (95.0, 600.0, "hw_slowdown", 79, 2)
    assert rows[1]["util"] == 0.0 and rows[1]["throttle"] == ""
    assert _run(tb, "--list").exit_code == 0


def test_cli_node_wide_and_clear(tmp_path: Path) -> None:
    tb = _setup(tmp_path)
    assert _run(tb, "gpu1", "hang=1", "lost=1").exit_code == 0
    sc = Scenario.load(tb / "fake-nvml.json")
    assert {k for k, g in sc.gpus.items() if g.get("hang")} == {"gpu1/9", "gpu1/3", "gpu1/5"}
    assert sc.hangs("gpu1") and not sc.hangs("gpu2")
    assert _run(tb, "gpu1/1", "clear").exit_code == 0
    assert set(Scenario.load(tb / "fake-nvml.json").gpus) == {"gpu1/9", "gpu1/5"}
    assert _run(tb, "gpu1", "clear", "util=10").exit_code == 0
    after = Scenario.load(tb / "fake-nvml.json").gpus
    assert after == {f"gpu1/{m}": {"utilization": 10.0} for m in (9, 3, 5)}
    assert _run(tb, "gpu1", "clear").exit_code == 0
    assert Scenario.load(tb / "fake-nvml.json").gpus == {}


def test_power_steps_keep_energy_growing(tmp_path: Path) -> None:
    tb = _setup(tmp_path)
    scen, gres = tb / "fake-nvml.json", tb / "etc" / "gres.conf"
    fake_script.set_fake(scen, gres, "gpu2/0", ["power_w=100"], clock=lambda: T0 + 10)
    fake_script.set_fake(scen, gres, "gpu2/0", ["power_w=400"], clock=lambda: T0 + 20)
    (row,) = [r for r in fake_script.list_fake(scen, gres, clock=lambda: T0 + 30)
              if r["node"] == "gpu2"]
    assert row["power_w"] == 400 and row["energy_j"] == pytest.approx(100 * 10 + 400 * 10)


@pytest.mark.parametrize(("args", "message"), [
    (["gpu9/0", "util=5"], "unknown node 'gpu9'"),
    (["gpu1/3", "util=5"], "index out of range"),
    (["gpu1/x", "util=5"], "must be a number"),
    (["gpu1/0", "temp=5"], "unknown key 'temp'"),
    (["gpu1/0", "util=lots"], "util=lots: not a number"),
    (["gpu1/0", "util=101"], "at most 100"),
    (["gpu1/0", "throttle=gpu_idle"], "not a throttle reason"),
    (["gpu1/0", "ecc_uncorrectable=-1"], "must not be negative"),
    (["gpu1/0", "ecc_uncorrectable=1.5"], "not a whole number"),
    (["gpu1/0", "lost=2"], "0 or 1"),
    (["gpu1/0", "xid=0"], "XID codes start at 1"),
    (["gpu1/0", "util"], "not key=value"),
    (["gpu1/0"], "nothing to set"),
    (["gpu1/0", "util=nan"], "finite"),
])
def test_cli_bad_input_is_one_line_and_changes_nothing(tmp_path: Path, args: list[str],
                                                       message: str) -> None:
    tb = _setup(tmp_path)
    _run(tb, "gpu1/0", "util=50")
    before = (tb / "fake-nvml.json").read_bytes()
    res = _run(tb, *args, "power_w=1") if args[1:] else _run(tb, *args)
    assert res.exit_code != 0
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert (tb / "fake-nvml.json").read_bytes() == before


def test_cli_without_a_scenario_or_testbed_says_so(tmp_path: Path) -> None:
    tb = _setup(tmp_path, with_scenario=False)
    res = _run(tb, "gpu1/0", "util=5")
    assert res.exit_code != 0 and "is not running" in res.stderr
    assert "no fake NVML scenario" in res.stderr
    res = _run(tmp_path / "nothing", "--list")
    assert res.exit_code != 0 and "no testbed in" in res.stderr


def test_a_collector_reading_the_file_follows_the_cli(tmp_path: Path) -> None:
    from hetslurm.metrics.collector import Collector
    from hetslurm.metrics.gres import parse_gres_conf

    tb = _setup(tmp_path)
    scen = tb / "fake-nvml.json"
    sc = Scenario.load(scen)
    sc.start = time.time() - 5
    sc.save(scen)
    coll = Collector(["gpu1"], FakeNvml(scen), None, parse_gres_conf(GRES), interval_s=1.0)
    assert {r["throttle_reasons"] for r in coll.tick().rows} == {""}
    assert _run(tb, "gpu1/2", "throttle=sw_thermal_slowdown", "xid=43").exit_code == 0
    rows = {r["slurm_index"]: r for r in coll.tick().rows}
    assert rows[2]["minor"] == 5 and rows[2]["throttle_reasons"] == "sw_thermal_slowdown"
    assert rows[2]["xid"] == 43 and rows[0]["xid"] is None
    assert {r["slurm_index"]: r for r in coll.tick().rows}[2]["xid"] is None  # once


def test_a_hung_read_costs_one_timeout_and_leaves_the_node_unknown() -> None:
    """Issue 23 item 5: a hung NVML call makes that node's GPUs unknown for the tick; the
    next ticks are not delayed again and start no second call while it hangs."""
    from hetslurm.metrics.collector import Collector
    from hetslurm.metrics.gres import parse_gres_conf

    sc = scenario_for_devices({"gpu1": [(9, "h100"), (3, "h100"), (5, "h100")],
                               "gpu2": [(7, "a100")]}, start=time.time())
    sc.set_gpu("gpu1", 3, hang=1)
    nv = FakeNvml(sc)
    calls: list[str] = []
    real_read = nv.read

    def counted(node: str) -> list[Any]:
        calls.append(node)
        return real_read(node)

    nv.read = counted  # type: ignore[method-assign]
    coll = Collector(["gpu1", "gpu2"], nv, None, parse_gres_conf(GRES), interval_s=1.0,
                     source_timeout_s=0.3)
    t = time.monotonic()
    rows = coll.tick().rows
    first = time.monotonic() - t
    assert 0.3 <= first < 1.0
    by_node = {(r["node"], r["slurm_index"]): r for r in rows}
    assert {by_node[("gpu1", i)]["status"] for i in range(3)} == {"unknown"}
    assert [by_node[("gpu1", i)]["minor"] for i in range(3)] == [9, 3, 5]
    values = ("utilization_pct", "memory_used_mib", "power_w", "energy_j", "throttle_reasons",
              "ecc_uncorrectable", "xid", "uuid", "nvml_index")
    assert all(by_node[("gpu1", 0)][v] is None for v in values)
    assert by_node[("gpu2", 0)]["status"] == "ok"  # the other node answered
    t = time.monotonic()
    for _ in range(3):
        rows = coll.tick().rows
        assert {r["status"] for r in rows if r["node"] == "gpu1"} == {"unknown"}
    assert time.monotonic() - t < 0.3  # no second timeout while the first call hangs
    assert calls.count("gpu1") == 1 and calls.count("gpu2") == 4  # one outstanding call
    sc.gpus["gpu1/3"].pop("hang")
    coll._pending["gpu1"].done.wait(2)  # the hung call returns; its answer is stale
    assert {r["status"] for r in coll.tick().rows} == {"ok"}
    assert calls.count("gpu1") == 2
    nv.close()


def test_source_timeout_is_a_typed_site_key() -> None:
    from pydantic import ValidationError

    from hetslurm.site.schema import Collector as CollectorConf

    assert CollectorConf().source_timeout_s == 5
    assert CollectorConf(source_timeout_s=0.5).source_timeout_s == 0.5
    with pytest.raises(ValidationError):
        CollectorConf(source_timeout_s=0)
