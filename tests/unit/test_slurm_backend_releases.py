"""The CLI backend asks each release for what it can read: 22.05's own --json, and on 24.11
and 26.05 ``--json=v0.0.42``, ``squeue -t all`` and ``scontrol show node --json`` (stand-in
commands serving the recordings of real 24.11.5 and 26.05.5 controllers)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _slurm_stubs import stub_backend

from hetslurm.errors import ConfigError
from hetslurm.slurm import versions
from hetslurm.slurm.cli_backend import CliBackend

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$HB_LOG"
case "$(basename "$0") $*" in
  "scontrol --version") cat "$HB_DATA/version.txt" ;;
  "scontrol show node --json=v0.0.42") cat "$HB_DATA/scontrol-show-node.json" ;;
  "squeue -t all --json=v0.0.42") cat "$HB_DATA/$HB_SQUEUE" ;;
  "scontrol show job -d -o") cat "$HB_DATA/scontrol-show-job-d-o.txt" ;;
  "squeue -h -t PD -O "*) ;;
  "sacct --allusers --duplicates -S "*"--json=v0.0.42") cat "$HB_DATA/sacct.json" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def backend(tmp_path: Path, release: str, squeue: str = "squeue-all.json") -> CliBackend:
    return stub_backend(tmp_path, STUB, ("scontrol", "squeue", "sacct", "sinfo"),
                        HB_DATA=str(DATA / release), HB_LOG=str(tmp_path / "log"),
                        HB_SQUEUE=squeue)


def calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().splitlines()


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_nodes_come_from_scontrol_show_node_in_v0042(tmp_path: Path, release: str) -> None:
    b = backend(tmp_path, release)
    nodes = {n.name: n for n in b.nodes()}
    assert {"gpu1", "gpu3", "fpga1", "cpu1"} <= set(nodes)
    assert b.slurm_release.name == release
    assert "scontrol show node --json=v0.0.42" in calls(tmp_path)
    assert not any(c.startswith("sinfo") for c in calls(tmp_path))


def test_jobs_ask_for_every_state_so_finished_jobs_stay_listed(tmp_path: Path) -> None:
    # 24.11's squeue --json hides finished jobs unless -t all; 22.05 listed them always.
    jobs = backend(tmp_path, "24.11").jobs()
    assert [j.state for j in jobs] == ["COMPLETED"] * 7
    assert "squeue -t all --json=v0.0.42" in calls(tmp_path)


def test_the_release_is_asked_once_per_backend(tmp_path: Path) -> None:
    b = backend(tmp_path, "24.11")
    b.nodes()
    b.nodes()
    assert calls(tmp_path).count("scontrol --version") == 1


def test_accounting_records_of_24_11_decode(tmp_path: Path) -> None:
    recs = backend(tmp_path, "24.11").accounting_jobs(0, 2e9)
    got = [recs.decode(r) for r in recs.raws]
    assert [(r.job_id, r.state.name if r.state else None, r.nodes) for r in got][:3] == [
        (1, "COMPLETED", "gpu3"), (2, "COMPLETED", "gpu1"), (3, "COMPLETED", "fpga1")]
    gres = {t.name: t.count for t in got[0].tres.allocated or [] if t.type == "gres"}
    assert gres == {"gpu": 1, "gpu:a100": 1}


def test_an_unsupported_release_is_named(tmp_path: Path) -> None:
    d = tmp_path / "data"
    d.mkdir()
    (d / "version.txt").write_text("slurm 23.02.7\n")
    b = stub_backend(tmp_path, STUB, ("scontrol",), HB_DATA=str(d),
                     HB_LOG=str(tmp_path / "log"), HB_SQUEUE="x")
    with pytest.raises(ConfigError, match=r"Slurm 23\.02 is not supported.*22\.05, 24\.11"):
        b.nodes()


@pytest.mark.parametrize("release", list(versions.RELEASES))
def test_every_release_says_how_to_list(release: str) -> None:
    r = versions.RELEASES[release]
    assert r.json_option.startswith("--json")
    # 22.05's squeue ignores filters; the others need -t all to keep finished jobs.
    assert (r.all_jobs == ()) == (release == "22.05")
    assert r.node_listing[0] in ("sinfo", "scontrol")
