"""``hetslurm audit`` / ``collect`` / ``exporter`` on the command line: every format, plots,
bad options, and a collector run with the fake NVML selected by configuration."""

from __future__ import annotations

import html.parser
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_audit_tables import T0, job, sacct_doc, sample_rows

from hetslurm.cli import cli
from hetslurm.metrics.fake_nvml import scenario_for_devices
from hetslurm.metrics.store import SegmentStore

ROOT = Path(__file__).resolve().parents[2]
SITE = str(ROOT / "site-configs" / "demo.toml")


@pytest.fixture
def inputs(tmp_path: Path) -> list[str]:
    sacct = tmp_path / "sacct.json"
    sacct.write_text(sacct_doc(job(1, "gpu1", 2, T0, T0 + 100), job(2, "gpu1", 2, T0, T0 + 100)))
    SegmentStore(tmp_path / "store").write("gpu1", sample_rows(
        "gpu1", {0: (1, "0-1", 80.0), 1: (1, "0-1", 80.0), 4: (2, "4-5", 0.0),
                 5: (2, "4-5", 0.0)}, T0, T0 + 100))
    return ["audit", "--site", SITE, "--sacct-file", str(sacct), "--store",
            str(tmp_path / "store"), "--since", str(T0 - 10), "--until", str(T0 + 200)]


def test_json_is_one_object_of_named_tables(inputs: list[str]) -> None:
    res = CliRunner().invoke(cli, [*inputs, "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["meta"]["partial"] is False
    row = doc["by_gpu_model"][0]
    assert row["gpu_model"] == "h100"
    assert row["allocated_gpu_hours"] == pytest.approx(400 / 3600)
    assert {r["job_id"] for r in doc["idle_jobs"]} == {2}


def test_csv_table_html_parquet_and_plots(inputs: list[str], tmp_path: Path) -> None:
    run = CliRunner().invoke
    res = run(cli, [*inputs, "--format", "csv", "--table", "idle_jobs"])
    assert res.exit_code == 0 and res.stdout.splitlines()[0].startswith("job_id,")
    res = run(cli, [*inputs, "--format", "table"])
    assert res.exit_code == 0 and "by_gpu_model" in res.stdout
    page = tmp_path / "a.html"
    res = run(cli, [*inputs, "--format", "html", "--out", str(page), "--plot",
                    str(tmp_path / "png")])
    assert res.exit_code == 0, res.output

    class P(html.parser.HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []

        def handle_starttag(self, tag: str, attrs: object) -> None:
            self.tags.append(tag)

    p = P()
    p.feed(page.read_text())
    assert p.tags.count("table") == 15 and p.tags.count("img") == 3
    for png in (tmp_path / "png").iterdir():
        assert png.read_bytes()[:4] == b"\x89PNG"
    res = run(cli, [*inputs, "--format", "parquet", "--out", str(tmp_path / "pq")])
    assert res.exit_code == 0, res.output
    import pandas as pd

    assert len(pd.read_parquet(tmp_path / "pq" / "idle_jobs.parquet")) == 1


def test_bad_options_are_usage_errors(inputs: list[str]) -> None:
    run = CliRunner().invoke
    assert run(cli, [*inputs, "--format", "parquet"]).exit_code == 2
    assert run(cli, [*inputs, "--table", "nope"]).exit_code == 2
    assert run(cli, ["audit", "--since", "yesterday-ish"]).exit_code == 2


def test_partial_result_is_said_on_stderr(inputs: list[str], tmp_path: Path) -> None:
    (tmp_path / "sacct.json").write_text("Slurm accounting storage is disabled")
    res = CliRunner().invoke(cli, [*inputs, "--format", "json"])
    assert res.exit_code == 9  # PARTIAL_EXIT: the report stands, not all of it could be made
    assert json.loads(res.stdout)["meta"]["partial"] is True
    assert "partial result" in res.stderr


def test_collect_with_the_fake_nvml_from_the_site_file(tmp_path: Path) -> None:
    gres = tmp_path / "gres.conf"
    gres.write_text("NodeName=gpu9 Name=gpu Type=h100 File=/nonexistent/nvidia[0-1]\n")
    scen = tmp_path / "scenario.json"
    scenario_for_devices({"gpu9": [(1, "h100"), (0, "h100")]}).save(scen)
    site = tmp_path / "site.toml"
    site.write_text(Path(SITE).read_text() + f"""
[collector]
nvml = "fake"
fake_scenario = "{scen}"
store = "{tmp_path / 'store'}"
interval_s = 0.1
""")
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "PATH": "/nonexistent"}
    res = CliRunner().invoke(cli, ["collect", "--site", str(site), "--gres-conf", str(gres),
                                   "--node", "gpu9", "--ticks", "3"], env=env)
    assert res.exit_code == 0, res.output
    frame, _ = SegmentStore(tmp_path / "store").read()
    # No character devices and no Slurm: samples are kept, marked unmatched/unattributed.
    assert len(frame) == 6 and set(frame["status"].astype(str)) == {"unmatched"}
    assert not frame["attributed"].any()
