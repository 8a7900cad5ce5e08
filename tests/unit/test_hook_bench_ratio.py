"""The controller figure of ``hetslurm bench hook``: rounds of the two sides run back to
back, and the ratio held to the 1.1x target is the median of the pairs' ratios, so a slow
stretch of the machine that hits both rounds of a pair cancels out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetslurm.lab import luatimer
from hetslurm.lab.bench_hook import _cpu_seconds, depth_result, plugin_reference_result


def test_the_ratio_of_means_cancels_a_slow_stretch() -> None:
    # Rounds 3 and 4 ran while the VM was twice as slow: both sides' submissions alternate,
    # so the stretch weighs on both alike and the ratio of the means stays put.
    with_rounds = [[1050, 1050], [1050, 1050], [2100, 2100], [2100, 2100], [1050, 1050]]
    without_rounds = [[1000, 1000], [1000, 1000], [2000, 2000], [2000, 2000], [1000, 1000]]
    got = depth_result(0, with_rounds, without_rounds, [], [])
    assert got["ratio"] == 1.05
    assert got["with_hook_us"] == 1470.0 and got["without_hook_us"] == 1400.0
    assert got["paired_ratios"] == [1.05] * 5
    assert got["with_rounds_us"] == [1050.0, 1050.0, 2100.0, 2100.0, 1050.0]
    assert got["submissions"] == [10, 10]
    assert "cpu_ratio" not in got


def test_the_ratio_is_of_means_and_the_medians_are_beside_it() -> None:
    # One submission of the hook's side waited for a lock: the mean (the target's figure)
    # carries it, the per-submission median does not; the p99 shows it.
    got = depth_result(0, [[500, 500, 500, 3500]], [[500, 500, 500, 500]], [], [])
    assert got["with_hook_us"] == 1250.0 and got["ratio"] == 2.5
    assert got["with_hook_p50_us"] == 500 and got["ratio_of_medians"] == 1.0
    assert got["with_hook_p99_us"] == 3500 and got["without_hook_p99_us"] == 500
    many = depth_result(0, [[500] * 99 + [3500]], [[500] * 100], [], [])
    assert many["with_hook_p99_us"] == 500 and max(many["paired_ratios"]) == 1.06
    assert depth_result(0, [[500] * 98 + [3500] * 2], [[500] * 100], [], [])[
        "with_hook_p99_us"] == 3500


def test_a_costly_hook_shows_in_the_ratio_and_the_cpu_figures() -> None:
    got = depth_result(1000, [[1500], [1600], [1550]], [[1000], [1000], [1000]],
                       [300.0, 310.0], [150.0, 160.0])
    assert got["ratio"] == 1.55
    assert got["pending"] == 1000
    assert got["with_hook_cpu_us"] == 305.0 and got["without_hook_cpu_us"] == 155.0
    assert got["cpu_ratio"] == pytest.approx(1.968, abs=1e-3)


def test_rounds_must_pair() -> None:
    with pytest.raises(ValueError):
        depth_result(0, [[1000], [1000]], [[1000]], [], [])
    with pytest.raises(ValueError):
        depth_result(0, [[1000], []], [[1000], [1000]], [], [])


def test_the_hooks_own_lua_time_per_call() -> None:
    got = depth_result(0, [[1000], [1000]], [[950], [950]], [], [], [50.0, 54.0], [14.0, 16.0])
    assert got["with_hook_lua_us"] == 52.0 and got["without_hook_lua_us"] == 15.0
    assert got["lua_extra_us"] == 37.0
    assert "with_hook_lua_us" not in depth_result(0, [[1]], [[1]], [], [])


def test_sdiag_total_time_is_read() -> None:
    # The per-submission figure is the rise of total_time; the lines as 22.05's sdiag prints
    # them, read by the access layer.
    from hetslurm.lab import bench_hook as bench
    from hetslurm.lab.fake_slurm import FakeSlurm
    from hetslurm.slurm import parse

    fake = FakeSlurm()
    fake.stats = parse.parse_sdiag(
        "Remote Procedure Call statistics by message type\n"
        "\tREQUEST_STATS_INFO                      ( 2035) count:7      "
        "ave_time:120    total_time:840\n"
        "\tREQUEST_SUBMIT_BATCH_JOB                ( 4003) count:3      "
        "ave_time:701    total_time:2104\n")
    assert bench._sdiag_submit(fake) == (3, 2104)
    fake.reset_controller_stats()  # sdiag -r: no submission since
    assert bench._sdiag_submit(fake) == (0, 0)


def test_queue_depth_and_job_limit_come_from_the_access_layer() -> None:
    from hetslurm.lab import bench_hook as bench
    from hetslurm.lab.fake_slurm import FakeSlurm
    from hetslurm.slurm import JobInfo

    fake = FakeSlurm(jobs=[JobInfo(1, state="PENDING"), JobInfo(2, state="RUNNING"),
                           JobInfo(3, state="COMPLETED")], config={"MaxJobCount": "20000"})
    assert (bench._pending(fake), bench._held_total(fake)) == (1, 3)
    assert bench._max_job_count(fake) == 20_000
    assert bench._max_job_count(FakeSlurm()) == 10_000  # Slurm's default


def test_process_cpu_clock_of_another_process() -> None:
    # slurmctld's CPU time comes from its process CPU-time clock (ns), ended threads included:
    # a child that burns 0.2 s of CPU in a thread that then ends is seen to have used it.
    child = subprocess.Popen([sys.executable, "-c",
                              "import threading, time\n"
                              "def burn():\n"
                              "    t = time.thread_time()\n"
                              "    while time.thread_time() - t < 0.2: pass\n"
                              "th = threading.Thread(target=burn); th.start(); th.join()\n"
                              "print('done', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        used = _cpu_seconds(child.pid)
        assert used is not None and 0.2 <= used < 5.0
        assert _cpu_seconds(None) is None
    finally:
        child.kill()
        child.wait()


def test_lua_timer_wrapper_builds_and_counts(tmp_path: Path) -> None:
    # The LD_PRELOAD wrapper compiles with the system's C compiler (the one that builds the
    # Cython core) and starts with zeroed counters.
    built = luatimer.build(tmp_path)
    assert built is not None
    lib, counters = built
    assert lib.stat().st_size > 0
    assert luatimer.read(counters) == (0, 0)
    counters.write_bytes((1234).to_bytes(8, "little") + (2).to_bytes(8, "little")
                         + bytes(4080))
    assert luatimer.read(counters) == (1234, 2)


def test_plugin_reference_from_blocks_around_the_one_without() -> None:
    got = plugin_reference_result([("plugin", [700, 720], [760, 780]), ("none", [560, 580], []),
                                   ("plugin", [740, 760], [800, 820])])
    assert got["no_plugin_us"] == 570 and got["plugin_plain_us"] == 730
    assert got["plugin_het_us"] == 790
    assert got["plugin_ratio"] == round(730 / 570, 3)
    assert got["total_ratio"] == round(790 / 570, 3)
    assert got["plugin_blocks_us"] == [710, 750]
    with pytest.raises(ValueError):
        plugin_reference_result([("plugin", [700], [760])])


def test_cold_calls_time_each_call_after_flushing_the_caches() -> None:
    from hetslurm.hook.render import render_hook
    from hetslurm.hook.standin import HookRuntime
    from hetslurm.lab.bench_hook import TYPICAL, cold_calls
    from hetslurm.site import load_site

    root = Path(__file__).resolve().parents[2]
    rt = HookRuntime(render_hook(load_site(root / "site-configs" / "demo.toml")).text)
    times = cold_calls(rt, {"script": TYPICAL[0], "user_name": "root"}, 3)
    assert len(times) == 3 and all(t > 0 for t in times)
