"""Device health drains a whole node through Slurm, and only hetslurm's drains are undone
(issue 23, "Done when", second item), on the session testbed.

gpu3 is an A100 node (the demo has two: 16 A100 GPUs, so one node is half of the model,
hence ``max_drain_share = 0.5``). The fake NVML gives its GPU 2 three uncorrected ECC errors;
`rebalance --apply --only health` drains gpu3 with a reason that starts ``hetslurm:`` and
names the GPU and the evidence. An admin drains gpu4 for maintenance: hetslurm leaves it
alone. After `testbed fake gpu3 clear` the next run undrains gpu3. Then the fault again, a
drain, and `rebalance rollback --apply` undoes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.metrics.collector import Collector
from hetslurm.metrics.fake_nvml import FakeNvml
from hetslurm.metrics.gres import load_gres_conf
from hetslurm.metrics.store import SegmentStore
from hetslurm.process import run_command
from hetslurm.slurm import get_backend
from hetslurm.testbed import Testbed

ADMIN_REASON = "admin: maintenance window"


def _cli(args: list[str], env: dict[str, str]) -> Any:
    res = CliRunner().invoke(cli, args, env=env)
    assert res.exit_code == 0, res.output
    return res


def _node(env: dict[str, str], node: str) -> tuple[str, str]:
    """(State, Reason) as `scontrol show node` prints them."""
    out = run_command(["scontrol", "show", "node", node], timeout=30, env=env).stdout
    state = next(w.split("=", 1)[1] for w in out.split() if w.startswith("State="))
    reason = ""
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Reason="):
            reason = line[len("Reason="):]
    return state, reason


def _collect(testbed: Testbed, env: dict[str, str], store: Path, ticks: int = 3) -> None:
    gres = load_gres_conf(testbed.etc / "gres.conf")
    Collector(sorted(gres), FakeNvml(testbed.fake_scenario), get_backend("cli", env=env),
              gres, SegmentStore(store), interval_s=1.0, flush_s=1.0).run(ticks=ticks)


def _rebalance(site: Path, store: Path, log: Path, lock: Path,
               env: dict[str, str]) -> dict[str, Any]:
    res = _cli(["rebalance", "--site", str(site), "--apply", "--only", "health", "--store",
                str(store), "--log", str(log), "--lock", str(lock), "--format", "json"], env)
    return dict(json.loads(res.stdout))


def test_ecc_drains_the_node_clear_undrains_admin_drain_left_alone_rollback(
        jobs: Jobs, testbed: Testbed, cli_env: dict[str, str], slurm_env: dict[str, str],
        tmp_path: Path) -> None:
    site = tmp_path / "site.toml"
    site.write_text(Path(testbed.existing_state().site).read_text()
                    + '\n[health]\nmode = "drain"\nmax_drain_share = 0.5\nstale_s = 30\n')
    store, log, lock = tmp_path / "store", tmp_path / "actions.jsonl", tmp_path / "rb.lock"
    env = {**cli_env, "HETSLURM_TESTBED_DIR": str(testbed.root)}
    fake = ["testbed", "fake", "--dir", str(testbed.root)]
    try:
        run_command(["scontrol", "update", "NodeName=gpu4", "State=DRAIN",
                     f"Reason={ADMIN_REASON}"], timeout=30, env=slurm_env)
        _cli([*fake, "gpu3/2", "ecc_uncorrectable=3"], env)
        _collect(testbed, slurm_env, store)
        _rebalance(site, store, log, lock, env)
        state, reason = _node(slurm_env, "gpu3")
        assert "DRAIN" in state, (state, reason)
        assert reason.startswith("hetslurm:") and "GPU 2" in reason, reason
        assert "ecc_uncorrectable 3" in reason, reason
        state4, reason4 = _node(slurm_env, "gpu4")
        assert "DRAIN" in state4 and reason4.startswith(ADMIN_REASON), (state4, reason4)

        # The fault is gone: hetslurm undrains its own drain, never the admin's.
        _cli([*fake, "gpu3", "clear"], env)
        _collect(testbed, slurm_env, store)
        _rebalance(site, store, log, lock, env)
        assert "DRAIN" not in _node(slurm_env, "gpu3")[0], _node(slurm_env, "gpu3")
        state4, reason4 = _node(slurm_env, "gpu4")
        assert "DRAIN" in state4 and reason4.startswith(ADMIN_REASON), (state4, reason4)

        # Drained again, then `rebalance rollback` undoes that drain.
        _cli([*fake, "gpu3/2", "ecc_uncorrectable=3"], env)
        _collect(testbed, slurm_env, store)
        _rebalance(site, store, log, lock, env)
        assert "DRAIN" in _node(slurm_env, "gpu3")[0]
        res = _cli(["rebalance", "rollback", "--site", str(site), "--apply", "--log", str(log),
                    "--lock", str(lock), "--format", "json"], env)
        doc = json.loads(res.stdout)
        assert [(s["node"], s["action"]) for s in doc["steps"]] == [("gpu3", "undrain")], doc
        assert "DRAIN" not in _node(slurm_env, "gpu3")[0], _node(slurm_env, "gpu3")
        assert "DRAIN" in _node(slurm_env, "gpu4")[0]
    finally:
        _cli([*fake, "gpu3", "clear"], env)
        for node in ("gpu3", "gpu4"):
            if "DRAIN" in _node(slurm_env, node)[0]:
                run_command(["scontrol", "update", f"NodeName={node}", "State=UNDRAIN"],
                            timeout=30, env=slurm_env)


def test_a_hung_nvml_read_costs_one_timeout_and_leaves_the_node_unknown(
        testbed: Testbed, cli_env: dict[str, str], slurm_env: dict[str, str]) -> None:
    import time

    env = {**cli_env, "HETSLURM_TESTBED_DIR": str(testbed.root)}
    fake = ["testbed", "fake", "--dir", str(testbed.root)]
    gres = load_gres_conf(testbed.etc / "gres.conf")
    coll = Collector(sorted(gres), FakeNvml(testbed.fake_scenario),
                     get_backend("cli", env=slurm_env), gres, None, interval_s=1.0,
                     source_timeout_s=1.5)
    try:
        _cli([*fake, "gpu2", "hang=1"], env)
        t0 = time.monotonic()
        first = coll.tick()
        took = time.monotonic() - t0
        second_t0 = time.monotonic()
        second = coll.tick()
        second_took = time.monotonic() - second_t0
    finally:
        _cli([*fake, "gpu2", "clear"], env)
    for res in (first, second):
        gpu2 = [r for r in res.rows if r["node"] == "gpu2"]
        assert gpu2 and {r["status"] for r in gpu2} == {"unknown"}, gpu2
        assert all(r["utilization_pct"] is None for r in gpu2)
        others = {r["status"] for r in res.rows if r["node"] == "gpu1"}
        assert others == {"ok"}, others
    # One timeout for the first tick; the second does not wait for the hung read again.
    assert 1.4 <= took < 5.0, took
    assert second_took < 1.4, second_took
