"""Per-job usage from sacct (jobacct_gather/linux) and the stored batch script's text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetslurm.slurm.parse import parse_sacct_batch_script
from hetslurm.slurm.sacct import SacctRecordError, parse_sacct_document

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"


def test_usage_of_a_recorded_job() -> None:
    # 22.05 testbed, jobacct_gather/linux: 32 MiB written and read back, then a 36 s sleep.
    recs = parse_sacct_document((DATA / "sacct_usage.json").read_text())
    (u,) = [recs.usage(r) for r in recs.raws]
    assert u.job_id == 2 and u.cpu_s == pytest.approx(0.328004)
    assert u.max_rss_mib == pytest.approx(3132 / 1024)
    assert u.disk_write_bytes == 67108865 and u.disk_read_bytes == 67148199


def test_usage_without_gathering_is_none_not_zero() -> None:
    # The older recording: jobacct_gather/none, empty TRES usage lists.
    recs = parse_sacct_document((DATA / "sacct.json").read_text())
    u = recs.usage(recs.raws[0])
    assert u.max_rss_mib is None and u.disk_read_bytes is None and u.disk_write_bytes is None


def test_usage_of_a_record_of_the_wrong_shape() -> None:
    doc = json.dumps({"jobs": [{"job_id": 1, "steps": [{"time": {"total": "soon"}}]}]})
    recs = parse_sacct_document(doc)
    with pytest.raises(SacctRecordError):
        recs.usage(recs.raws[0])


def test_stored_batch_script_text() -> None:
    out = "Batch Script for 7\n" + "-" * 80 + "\n#!/bin/sh\nsleep 1\n"
    assert parse_sacct_batch_script(out) == "#!/bin/sh\nsleep 1\n"
    assert parse_sacct_batch_script("Batch Script for 7\n" + "-" * 80 + "\nNONE\n") is None
    assert parse_sacct_batch_script("") is None
