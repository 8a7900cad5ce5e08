"""Slurm's own energy accounting (acct_gather_energy) read from sacct's records and reconciled
with the NVML-derived energy. Recorded 22.05/24.11/26.05 documents carry no energy (Debian's
Slurm ships no gpu_nvml, so acct_gather_energy/gpu reports nothing on the testbed): the
figures here are written into those records in the places and forms each version uses."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from hetslurm.audit.energy import NO_SLURM_ENERGY, energy_tables, reconcile
from hetslurm.audit.report import reconciliation_line
from hetslurm.audit.sacct import parse_sacct_json
from hetslurm.audit.tables import audit
from hetslurm.slurm.sacct import parse_sacct_document

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
NO_VAL64 = 0xFFFFFFFFFFFFFFFE


def _doc(version: str) -> dict[str, Any]:
    path = DATA / "sacct.json" if version == "22.05" else DATA / version / "sacct.json"
    return json.loads(path.read_text())


def _consumed(version: str, joules: int) -> Any:
    # 22.05 (openapi/dbv0.0.38): a plain number; data_parser v0.0.42: a number object.
    if version == "22.05":
        return joules
    return {"set": True, "infinite": False, "number": joules}


def _with_energy(version: str, per_job: dict[int, list[int]]) -> bytes:
    """The recorded document with each listed job's steps set to these joules (extra steps
    are copies of the first)."""
    doc = _doc(version)
    for job in doc["jobs"]:
        values = per_job.get(job["job_id"])
        if values is None or not job["steps"]:
            continue
        first = job["steps"][0]
        job["steps"] = []
        for v in values:
            step = copy.deepcopy(first)
            step["statistics"]["energy"]["consumed"] = _consumed(version, v)
            job["steps"].append(step)
    return json.dumps(doc).encode()


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_recorded_documents_without_an_energy_plugin_have_no_figure(version: str) -> None:
    # Every step says 0 J (24.11: a set number 0): Slurm gathered nothing, not "0 J".
    records = parse_sacct_document(json.dumps(_doc(version)).encode())
    assert all(records.decode(r).energy_j is None for r in records.raws)
    jobs = parse_sacct_json(json.dumps(_doc(version)).encode()).jobs
    assert jobs["slurm_energy_j"].isna().all()


@pytest.mark.parametrize("version", ["22.05", "24.11", "26.05"])
def test_consumed_energy_is_read_per_version_and_the_largest_step_is_the_job(
        version: str) -> None:
    # Job 1: batch and extern steps both span the allocation (9 kJ each) and one srun step
    # (8.5 kJ): the job is 9 kJ, as sacct's job line shows, not their 26.5 kJ sum.
    text = _with_energy(version, {1: [9000, 9000, 8500]})
    jobs = parse_sacct_json(text).jobs.set_index("job_id")
    assert jobs.loc[1, "slurm_energy_j"] == pytest.approx(9000.0)
    assert jobs.drop(index=1)["slurm_energy_j"].isna().all()


def test_no_value_sentinels_are_no_figure_not_a_bad_record() -> None:
    doc = _doc("24.11")
    step = doc["jobs"][0]["steps"][0]
    step["statistics"]["energy"]["consumed"] = {"set": False, "infinite": False, "number": 5}
    doc["jobs"][1]["steps"][0]["statistics"]["energy"]["consumed"] = {
        "set": True, "infinite": True, "number": 0}
    res = parse_sacct_json(json.dumps(doc).encode())
    assert res.skipped == 0 and res.jobs["slurm_energy_j"].isna().all()
    old = _doc("22.05")
    old["jobs"][0]["steps"][0]["statistics"]["energy"]["consumed"] = NO_VAL64
    res = parse_sacct_json(json.dumps(old).encode())
    assert res.skipped == 0 and math.isnan(res.jobs["slurm_energy_j"].iloc[0])


def test_the_energy_tres_of_tres_usage_in_tot_stands_in_for_consumed_energy() -> None:
    doc = _doc("22.05")
    step = doc["jobs"][0]["steps"][0]
    step["statistics"]["energy"]["consumed"] = 0
    step["tres"]["requested"]["total"] = [{"type": "energy", "name": None, "id": 3,
                                           "count": 7200}]
    jobs = parse_sacct_json(json.dumps(doc).encode()).jobs
    assert jobs["slurm_energy_j"].iloc[0] == pytest.approx(7200.0)


def _samples(rows: list[tuple[float, str, int, int, float]]) -> pd.DataFrame:
    return pd.DataFrame({
        "time": [r[0] for r in rows], "node": [r[1] for r in rows],
        "minor": [float(r[2]) for r in rows],
        "job_id": pd.array([r[3] for r in rows], dtype="Int64"),
        "energy_j": [r[4] for r in rows], "interval_s": [30.0] * len(rows)})


def _jobs(slurm: list[float]) -> pd.DataFrame:
    return pd.DataFrame({
        "job_id": [5, 6, 7], "user": ["ann", "bob", "ann"], "account": ["phys"] * 3,
        "wclass": ["train"] * 3, "gpu_model": ["h100", "a100", "h100"], "gpus": [1, 1, 1],
        "slurm_energy_j": slurm})


def _rows() -> list[tuple[float, str, int, int, float]]:
    # Job 5 at 400 W and job 6 at 200 W, five samples each: 4 covered intervals of 30 s.
    out = []
    for k in range(5):
        out.append((30.0 * k, "gpu1", 0, 5, 400.0 * 30 * k))
        out.append((30.0 * k, "gpu2", 0, 6, 200.0 * 30 * k))
    return out


def test_reconciliation_per_job_and_in_total_over_the_jobs_with_both() -> None:
    # NVML: job 5 48 kJ, job 6 24 kJ; Slurm: 60 kJ, 20 kJ; job 7 has Slurm's figure only
    # (no samples), so it is not compared.
    jobs, _ = energy_tables(_jobs([60_000.0, 20_000.0, 1000.0]), _samples(_rows()))
    j = jobs.set_index("job_id")
    assert j.loc[5, "slurm_energy_j"] == 60_000.0
    assert j.loc[5, "nvml_minus_slurm_j"] == pytest.approx(-12_000.0)
    assert j.loc[5, "nvml_minus_slurm_pct"] == pytest.approx(-20.0)
    assert j.loc[6, "nvml_minus_slurm_pct"] == pytest.approx(20.0)
    assert math.isnan(j.loc[7, "nvml_minus_slurm_j"])
    rec = reconcile(jobs)
    assert rec["jobs_with_slurm_energy"] == 3 and rec["jobs_with_both"] == 2
    assert rec["nvml_kwh"] == pytest.approx(72_000 / 3.6e6)
    assert rec["slurm_kwh"] == pytest.approx(80_000 / 3.6e6)
    assert rec["nvml_minus_slurm_pct"] == pytest.approx(-10.0)
    assert rec["nvml_coverage_pct"] == pytest.approx(80.0)
    by = {r["gpu_model"]: r for r in rec["by_gpu_model"]}
    assert by["a100"]["nvml_minus_slurm_pct"] == pytest.approx(20.0)
    assert reconciliation_line(rec) == (
        "energy reconciliation over 2 of 3 GPU jobs that both measured: NVML 0.020 kWh, "
        "Slurm 0.022 kWh, NVML - Slurm -0.002 kWh (-10.0%); NVML coverage 80%")


def test_without_slurm_energy_the_audit_says_so_and_shows_no_zeros() -> None:
    jobs, _ = energy_tables(_jobs([math.nan] * 3), _samples(_rows()))
    assert jobs["slurm_energy_j"].isna().all() and jobs["nvml_minus_slurm_j"].isna().all()
    assert reconcile(jobs) == {"gpu_jobs": 3, "jobs_with_slurm_energy": 0,
                               "jobs_with_both": 0, "note": NO_SLURM_ENERGY}
    # Through the audit: the recorded 22.05 jobs (no energy plugin), and the same frame
    # without the column (a jobs frame from elsewhere, e.g. a fake backend).
    from hetslurm.metrics.store import empty_frame

    recorded = parse_sacct_json(json.dumps(_doc("22.05")).encode()).jobs
    for frame in (recorded, recorded.drop(columns="slurm_energy_j")):
        res = audit(frame, empty_frame(), None, since=0, until=2e9, now=2e9)
        rec = res.meta["energy_reconciliation"]
        assert rec["gpu_jobs"] > 0 and rec["note"] == NO_SLURM_ENERGY
        assert res.tables["energy_jobs"]["slurm_energy_j"].isna().all()
