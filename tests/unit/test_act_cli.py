"""``hetslurm act requeue-stalled`` end to end through the CLI: the site's [stall] section,
samples read from a real metrics store folder, dry run, warn, then act."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _act_fixtures import INTERVAL, append_probe, cluster, job
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.metrics.store import SegmentStore

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


def test_dry_run_warn_then_requeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.time()
    fake = cluster(job(1, now=now), job(2, now=now))
    store = SegmentStore(tmp_path / "store")
    for jid, util in ((1, 0.0), (2, 60.0)):
        rows = []
        t = now - 2 * 3600
        while t < now:
            for g in range(2):
                rows.append({"time": round(t, 3), "node": f"n{jid}", "minor": g, "slurm_index": g,
                             "job_id": jid, "utilization_pct": util,
                             "memory_used_mib": 10.0, "status": "ok", "interval_s": INTERVAL})
            t += INTERVAL
        store.write(f"n{jid}", rows)
    site = tmp_path / "site.toml"
    log = tmp_path / "actions.jsonl"
    site.write_text(DEMO.read_text() + f"""
[stall]
window_s = 3600
warning_grace_s = 0
action_log = "{log}"
lock_file = "{tmp_path / 'lock'}"
verify_timeout_s = 1
""")
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: fake)
    monkeypatch.setattr("hetslurm.act.output_mode.SlurmOutputProbe",
                        lambda *a, **k: append_probe)

    def run(*extra: str) -> dict:
        res = CliRunner().invoke(cli, ["act", "requeue-stalled", "--site", str(site),
                                       "--store", str(tmp_path / "store"), "--format", "json",
                                       *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    dry = run()
    assert {d["job"]: (d["rule"], d["action"]) for d in dry["decisions"]} == {
        "1": ("idle", "warn"), "2": ("not-idle", "none")}
    assert dry["decisions"][0]["evidence"]["max_util_pct"] == 0.0
    assert not log.exists()
    first = run("--apply")
    assert [o["result"] for o in first["outcomes"]] == ["warned"]
    assert fake.job(1).state == "RUNNING"
    time.sleep(0.01)
    second = run("--apply")
    assert [(o["job"], o["result"]) for o in second["outcomes"]] == [("1", "done")]
    assert fake.job(1).state == "PENDING" and fake.job(1).restarts == 1
    assert fake.job(2).state == "RUNNING"
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds.count("warning") == 1 and kinds.count("run") == 2
    table = CliRunner().invoke(cli, ["act", "requeue-stalled", "--site", str(site),
                                     "--store", str(tmp_path / "store")])
    assert table.exit_code == 0 and "rule" in table.stdout


def test_dry_run_shows_the_downgrade(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from hetslurm.slurm.units import GresItem

    now = time.time()
    fake = cluster(job(1, now=now, nodes=("n1",), tres_per_node=(GresItem("gpu", "h100", 2),),
                       allocated_gres={"n1": (GresItem("gpu", "h100", 2, (0, 1)),)},
                       admin_comment='hetslurm:{"v":1,"on_idle":"downgrade"}'))
    store = SegmentStore(tmp_path / "store")
    rows = []
    t = now - 2 * 3600
    while t < now:
        for g in range(2):
            rows.append({"time": round(t, 3), "node": "n1", "minor": g, "slurm_index": g,
                         "job_id": 1,
                         "utilization_pct": 0.0, "memory_used_mib": 10.0, "status": "ok",
                         "interval_s": INTERVAL})
        t += INTERVAL
    store.write("n1", rows)
    site = tmp_path / "site.toml"
    site.write_text(DEMO.read_text() + f"""
[stall]
window_s = 3600
action_log = "{tmp_path / 'actions.jsonl'}"
lock_file = "{tmp_path / 'lock'}"
""")
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: fake)
    monkeypatch.setattr("hetslurm.act.output_mode.SlurmOutputProbe",
                        lambda *a, **k: append_probe)
    args = ["act", "requeue-stalled", "--site", str(site), "--store", str(tmp_path / "store")]
    res = CliRunner().invoke(cli, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)["decisions"][0]
    assert (d["rule"], d["planned"], d["action"]) == ("on-idle-downgrade", "downgrade", "warn")
    assert d["downgrade"]["to_model"] == "a100" and d["downgrade"]["gres"] == "gpu:a100:2"
    table = CliRunner().invoke(cli, [*args, "--format", "csv"])
    assert table.exit_code == 0 and "downgrade h100 -> a100 (Gres=gpu:a100:2)" in table.stdout
    assert fake.job(1).state == "RUNNING" and not (tmp_path / "actions.jsonl").exists()
