"""Energy per job from NVML's energy counter: increments between two samples of one GPU that
the job held both of; everything else unknown, with its share reported."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from hetslurm.audit.energy import (
    ALL_CLASSES,
    GROUP_COLUMNS,
    JOB_COLUMNS,
    WORK_COLUMNS,
    energy_per_job,
    energy_per_work,
    energy_tables,
    site_speeds,
)
from hetslurm.audit.tables import TABLES, audit
from hetslurm.site.load import parse_site

LEVERS_SITE = Path(__file__).resolve().parents[1] / "data" / "levers" / "small.toml"


def _samples(rows: list[tuple[float, str, int, int | None, float | None]],
             interval: float = 30.0) -> pd.DataFrame:
    """(time, node, minor, job_id, energy_j) rows."""
    return pd.DataFrame({
        "time": [r[0] for r in rows], "node": [r[1] for r in rows],
        "minor": [float(r[2]) for r in rows],
        "job_id": pd.array([r[3] for r in rows], dtype="Int64"),
        "energy_j": [math.nan if r[4] is None else r[4] for r in rows],
        "interval_s": [interval] * len(rows),
    })


def test_increments_between_samples_of_one_job_on_one_gpu() -> None:
    # GPU 0 of gpu1: idle, then job 7 for three samples at 300 W, then idle again.
    s = _samples([(0, "gpu1", 0, None, 1000.0), (30, "gpu1", 0, 7, 4000.0),
                  (60, "gpu1", 0, 7, 13000.0), (90, "gpu1", 0, 7, 22000.0),
                  (120, "gpu1", 0, None, 23500.0)])
    per = energy_per_job(s)
    assert per.loc[7, "energy_j"] == pytest.approx(18000.0)  # 2 x 30 s x 300 W
    assert per.loc[7, "covered_s"] == pytest.approx(60.0)
    # The first held sample's interval may hold idle time before the job: unknown.
    assert per.loc[7, "unknown_s"] == pytest.approx(30.0)


def test_two_gpus_and_interleaved_rows_are_kept_apart() -> None:
    rows = []
    for k in range(4):
        rows.append((30.0 * k, "gpu1", 1, 5, 100.0 * 30 * k))        # 100 W
        rows.append((30.0 * k, "gpu1", 0, 5, 10_000 + 400.0 * 30 * k))  # 400 W
        rows.append((30.0 * k, "gpu2", 1, 6, 50_000 + 200.0 * 30 * k))  # 200 W
    per = energy_per_job(_samples(rows[::-1]))  # order of rows does not matter
    assert per.loc[5, "energy_j"] == pytest.approx((100 + 400) * 90.0)
    assert per.loc[6, "energy_j"] == pytest.approx(200 * 90.0)
    assert per.loc[5, "covered_s"] == pytest.approx(2 * 90.0)


def test_gaps_resets_and_missing_counters_are_unknown_not_guessed() -> None:
    s = _samples([(0, "gpu1", 0, 9, 0.0), (30, "gpu1", 0, 9, 3000.0),
                  # the collector was away for 3 intervals: not bridged
                  (150, "gpu1", 0, 9, 15000.0),
                  # the driver reloaded: the counter went back
                  (180, "gpu1", 0, 9, 100.0),
                  # the device gave no counter
                  (210, "gpu1", 0, 9, None), (240, "gpu1", 0, 9, None)])
    per = energy_per_job(s)
    assert per.loc[9, "energy_j"] == pytest.approx(3000.0)
    assert per.loc[9, "covered_s"] == pytest.approx(30.0)
    assert per.loc[9, "unknown_s"] == pytest.approx(5 * 30.0)


def test_a_gpu_passed_to_another_job_starts_unknown_for_it() -> None:
    s = _samples([(0, "gpu1", 0, 1, 0.0), (30, "gpu1", 0, 1, 3000.0),
                  (60, "gpu1", 0, 2, 6000.0), (90, "gpu1", 0, 2, 9000.0)])
    per = energy_per_job(s)
    assert per.loc[1, "energy_j"] == pytest.approx(3000.0)
    assert per.loc[2, "energy_j"] == pytest.approx(3000.0)  # not job 1's last interval


def _jobs() -> pd.DataFrame:
    return pd.DataFrame({
        "job_id": [5, 6, 8], "user": ["ann", "bob", "ann"], "account": ["phys"] * 3,
        "wclass": ["train", "inference", "train"], "gpu_model": ["h100", "a100", "h100"],
        "gpus": [2, 1, 1],
    })


def test_tables_per_job_and_per_group_with_coverage() -> None:
    rows = []
    for k in range(5):
        rows.append((30.0 * k, "gpu1", 0, 5, 400.0 * 30 * k))
        rows.append((30.0 * k, "gpu1", 1, 5, 400.0 * 30 * k))
        rows.append((30.0 * k, "gpu2", 0, 6, 200.0 * 30 * k))
    jobs, groups = energy_tables(_jobs(), _samples(rows))
    assert list(jobs.columns) == list(JOB_COLUMNS)
    assert list(groups.columns) == list(GROUP_COLUMNS)
    j = jobs.set_index("job_id")
    assert j.loc[5, "energy_kwh"] == pytest.approx(2 * 400 * 120 / 3.6e6)
    assert j.loc[5, "mean_power_w"] == pytest.approx(400.0)
    assert j.loc[5, "coverage_pct"] == pytest.approx(100 * 4 / 5)
    # Job 8 ran in the range but no sample of it exists: zero covered, coverage unknown.
    assert j.loc[8, "energy_j"] == 0.0 and math.isnan(j.loc[8, "coverage_pct"])
    g = groups.set_index(["by", "key"])
    assert g.loc[("user", "ann"), "jobs"] == 2
    assert g.loc[("gpu_model", "h100"), "energy_kwh"] == pytest.approx(j.loc[5, "energy_kwh"])
    assert g.loc[("class", "inference"), "mean_power_w"] == pytest.approx(200.0)
    assert set(g.index.get_level_values("by")) == {"user", "account", "class", "gpu_model"}


def test_empty_inputs_give_empty_tables_with_their_columns() -> None:
    jobs, groups = energy_tables(_jobs().iloc[:0], _samples([]))
    assert list(jobs.columns) == list(JOB_COLUMNS) and jobs.empty
    assert list(groups.columns) == list(GROUP_COLUMNS) and groups.empty


def test_audit_lists_the_energy_tables() -> None:
    assert TABLES[-3:] == ("energy_jobs", "energy", "energy_per_work")
    assert callable(audit)


def _work_rows() -> list[tuple[float, str, int, int | None, float | None]]:
    # Job 5: two H100s at 400 W each; job 6: one A100 at 200 W; five samples each (4 covered
    # intervals of 30 s per GPU, the first interval unknown).
    rows = []
    for k in range(5):
        rows.append((30.0 * k, "gpu1", 0, 5, 400.0 * 30 * k))
        rows.append((30.0 * k, "gpu1", 1, 5, 400.0 * 30 * k))
        rows.append((30.0 * k, "gpu2", 0, 6, 200.0 * 30 * k))
    return rows


def test_energy_per_work_divides_measured_power_by_the_site_speed() -> None:
    site = parse_site(LEVERS_SITE.read_text())
    speeds = site_speeds(site)
    # [levers.speed]: h100 train 3.0, a100 train 1.0; the slowest is the reference.
    assert speeds[ALL_CLASSES] == {"h100": 3.0, "a100": 1.0}
    assert speeds["train"] == {"h100": 3.0, "a100": 1.0}
    jobs, _ = energy_tables(_jobs(), _samples(_work_rows()))
    work = energy_per_work(jobs, speeds)
    assert list(work.columns) == list(WORK_COLUMNS)
    w = work.set_index(["class", "gpu_model"])
    # H100: 400 W per covered GPU-hour, 3 reference GPU-hours of work per hour: 133.3 Wh.
    assert w.loc[(ALL_CLASSES, "h100"), "wh_per_ref_gpu_hour"] == pytest.approx(400 / 3)
    assert w.loc[(ALL_CLASSES, "a100"), "wh_per_ref_gpu_hour"] == pytest.approx(200.0)
    assert w.loc[(ALL_CLASSES, "h100"), "reference"] == "a100"
    assert w.loc[(ALL_CLASSES, "h100"), "coverage_pct"] == pytest.approx(80.0)
    # Job 8 (H100, no samples) counts as a job but adds no covered time.
    assert w.loc[(ALL_CLASSES, "h100"), "jobs"] == 2
    # Per class where the class is a workload type of the speed table: train only.
    assert w.loc[("train", "h100"), "wh_per_ref_gpu_hour"] == pytest.approx(400 / 3)
    assert ("inference", "a100") not in w.index


def test_a_model_without_a_speed_gets_a_note_not_a_figure() -> None:
    jobs, _ = energy_tables(_jobs(), _samples(_work_rows()))
    work = energy_per_work(jobs, {ALL_CLASSES: {"a100": 1.0}}).set_index("gpu_model")
    assert math.isnan(work.loc["h100", "wh_per_ref_gpu_hour"])
    assert "no speed for 'h100'" in work.loc["h100", "note"]
    assert work.loc["a100", "wh_per_ref_gpu_hour"] == pytest.approx(200.0)
    none = energy_per_work(jobs, {})
    assert none["wh_per_ref_gpu_hour"].isna().all()
    assert none["note"].str.contains("no speeds in the site file").all()
    assert energy_per_work(jobs.iloc[:0], {}).empty
