"""``hetslurm bench hook``'s controller part on a testbed of its own, in miniature: each
submission timed from the rise of sdiag's total_time on the real slurmctld 22.05, the two jobs
alternating, the hook's Lua timer read, and the plugin reference's restarts without and with
job_submit/lua, and the hostile corpus's worst case with the hook on and off."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetslurm.lab.bench_hook import bench_testbed

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"


def test_each_submission_is_timed_on_the_real_controller() -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root")
    log: list[str] = []
    got = bench_testbed(DEMO, depths=(0,), jobs_per_round=3, rounds=2, log=log.append,
                        worst_case="het_first_then_flood", worst_blocks=1, worst_per_block=2)
    (depth,) = got["depths"]
    assert depth["pending"] == 0
    assert depth["submissions"] == [6, 6]
    assert len(depth["with_rounds_us"]) == len(depth["without_rounds_us"]) == 2
    # Every submission took slurmctld some time, and the figures are sdiag's own.
    assert all(x > 0 for x in depth["with_rounds_us"] + depth["without_rounds_us"])
    assert depth["with_hook_us"] > 0 and depth["ratio"] > 0
    assert depth["with_hook_p50_us"] <= depth["with_hook_p99_us"]
    # The LD_PRELOAD timer saw the hook run for both jobs.
    assert depth["with_hook_lua_us"] > 0 and depth["without_hook_lua_us"] > 0
    ref = got["plugin_reference"]
    assert ref is not None and ref["no_plugin_us"] > 0
    assert [b["phase"] for b in ref["rounds_us"]] == ["plugin", "none", "plugin"]
    assert any("restarting slurmctld without a job_submit plugin" in m for m in log)
    # The hostile corpus's case with the hook enforcing and switched off, in blocks.
    worst = got["worst_case"]
    assert worst["case"] == "het_first_then_flood" and worst["bytes"] > 4_000_000
    assert [b["mode"] for b in worst["blocks_us"]] == ["enforce", "off"]
    assert worst["with_hook_us"] > 0 and worst["hook_off_us"] > 0 and worst["submissions"] == 4
