"""The audit on small known data: GPU-hours, idle jobs, wait, fragmentation, right-size,
placement; and bad input (sacct garbage, truncated output, refused segments, empty range)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hetslurm.audit.run import AuditRequest, run_audit
from hetslurm.audit.sacct import parse_sacct_json
from hetslurm.errors import MetricsError
from hetslurm.metrics.samples import COLUMNS
from hetslurm.metrics.store import SegmentStore
from hetslurm.site import Site, load_site

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_796_000_000


@pytest.fixture(scope="module")
def site() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


def job(jid: int, node: str, gpus: int, start: int, end: int, *, typed: str | None = "h100",
        eligible: int | None = None, constraints: str = "", comment: str | None = None,
        partition: str = "gpu", user: str = "alice") -> dict[str, Any]:
    tres: list[dict[str, Any]] = [{"type": "cpu", "name": None, "id": 1, "count": 1}]
    if gpus:
        tres.append({"type": "gres", "name": "gpu", "id": 1001, "count": gpus})
        if typed:
            tres.append({"type": "gres", "name": f"gpu:{typed}", "id": 1002, "count": gpus})
    return {"job_id": jid, "name": f"j{jid}", "user": user, "account": "hetslurm",
            "partition": partition, "state": {"current": "COMPLETED", "reason": "None"},
            "time": {"submission": eligible or start, "eligible": eligible or start,
                     "start": start, "end": end, "elapsed": end - start},
            "nodes": node, "constraints": constraints,
            "comment": {"administrator": comment, "job": None, "system": None},
            "tres": {"allocated": tres}}


def sacct_doc(*jobs: dict[str, Any]) -> str:
    return json.dumps({"meta": {"plugin": {"type": "openapi/dbv0.0.38"}}, "errors": [],
                       "jobs": list(jobs)})


def sample_rows(node: str, indices: dict[int, tuple[int | None, str | None, float | None]],
                t_from: int, t_to: int, *, status: dict[int, str] | None = None
                ) -> list[dict[str, Any]]:
    """index -> (job_id, job_gpus, utilization) every second in [t_from, t_to)."""
    out = []
    for t in range(t_from, t_to):
        for i, (jid, jg, util) in indices.items():
            r = dict.fromkeys(COLUMNS)
            st = (status or {}).get(i, "ok")
            r.update(time=float(t), node=node, minor=135 - i, slurm_index=i, nvml_index=i,
                     gpu_model="h100" if node in ("gpu1", "gpu2") else "a100", job_id=jid,
                     job_gpus=jg, utilization_pct=util if st == "ok" else None, status=st,
                     memory_used_mib=1000.0, interval_s=1.0, attributed=True,
                     clock_jump=False)
            out.append(r)
    return out


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, Path]:
    """gpu1: job 1 busy on 0-1, job 2 idle on 4-5 (100 s each); gpu3: job 3 on a100 0-3
    split 2+2 across islands (indices 2-5); job 4 asked h100|a100 untyped, got gpu2."""
    jobs = [
        job(1, "gpu1", 2, T0, T0 + 100, eligible=T0 - 30,
            comment='hetslurm:{"v":1,"mode":"enforce","outcome":"rewrite","class":"train",'
                    '"req":"gpus=2 class=train"}'),
        job(2, "gpu1", 2, T0, T0 + 100),
        job(3, "gpu3", 4, T0, T0 + 100, typed="a100",
            comment='JS1:x hetslurm:{"v":1,"outcome":"rewrite","class":"train",'
                    '"req":"gpus=4 locality=nvlink class=train"}'),
        job(4, "gpu2", 1, T0 + 50, T0 + 100, typed=None, constraints="h100|a100",
            eligible=T0 - 10),
        job(5, "cpu1", 0, T0, T0 + 100, typed=None, partition="cpu"),
    ]
    sacct = tmp_path / "sacct.json"
    sacct.write_text(sacct_doc(*jobs))
    st = SegmentStore(tmp_path / "store")
    idx1: dict[int, tuple[int | None, str | None, float | None]] = {
        i: (None, None, 0.0) for i in range(8)}
    idx1.update({0: (1, "0-1", 90.0), 1: (1, "0-1", 60.0), 4: (2, "4-5", 1.0),
                 5: (2, "4-5", 0.0)})
    st.write("gpu1", sample_rows("gpu1", idx1, T0, T0 + 100))
    st.write("gpu3", sample_rows("gpu3", {i: (3, "2-5", 2.0) for i in range(2, 6)},
                                 T0, T0 + 100))
    st.write("gpu2", sample_rows("gpu2", {0: (4, "0", 50.0)}, T0 + 50, T0 + 100))
    return sacct, tmp_path / "store"


def _run(site: Site, sacct: Path | None, store: Path | None, since: float = T0 - 100,
         until: float = T0 + 200) -> Any:
    return run_audit(AuditRequest(since=since, until=until, store=str(store) if store else None,
                                  sacct_file=str(sacct) if sacct else None), site,
                     now=T0 + 1000)


def test_gpu_hours_by_model(site: Site, data: tuple[Path, Path]) -> None:
    res = _run(site, *data)
    assert not res.partial, res.meta["problems"]
    m = res.tables["by_gpu_model"].set_index("gpu_model")
    # h100: jobs 1 and 2 (2 GPUs x 100 s) and job 4 (1 GPU x 50 s, model from its node).
    assert m.loc["h100", "allocated_gpu_hours"] == pytest.approx((400 + 50) / 3600)
    assert m.loc["a100", "allocated_gpu_hours"] == pytest.approx(400 / 3600)
    used_h100 = (100 * (0.9 + 0.6) + 100 * 0.01 + 50 * 0.5) / 3600
    assert m.loc["h100", "used_gpu_hours"] == pytest.approx(used_h100)
    assert m.loc["h100", "busy_gpu_hours"] == pytest.approx(250 / 3600)
    assert m.loc["h100", "idle_gpu_hours"] == pytest.approx(200 / 3600)
    assert m.loc["a100", "idle_gpu_hours"] == pytest.approx(400 / 3600)
    # gpu1's 4 free GPUs for 100 s were capacity no job held.
    assert m.loc["h100", "unallocated_gpu_hours"] == pytest.approx(400 / 3600)


def test_idle_jobs_named_busy_ones_not(site: Site, data: tuple[Path, Path]) -> None:
    idle = set(_run(site, *data).tables["idle_jobs"]["job_id"])
    assert idle == {2, 3}


def test_unknown_is_never_idle(site: Site, tmp_path: Path) -> None:
    sacct = tmp_path / "sacct.json"
    sacct.write_text(sacct_doc(job(1, "gpu1", 2, T0, T0 + 100)))
    st = SegmentStore(tmp_path / "store")
    # One GPU idle, the other unknown (MIG) for the whole run.
    st.write("gpu1", sample_rows("gpu1", {0: (1, "0-1", 0.0), 1: (1, "0-1", None)},
                                 T0, T0 + 100, status={1: "mig"}))
    res = _run(site, sacct, tmp_path / "store")
    assert res.tables["idle_jobs"].empty
    m = res.tables["by_gpu_model"].set_index("gpu_model")
    assert m.loc["h100", "unknown_gpu_hours"] == pytest.approx(100 / 3600)


def test_too_few_samples_are_not_judged_idle(site: Site, tmp_path: Path) -> None:
    sacct = tmp_path / "sacct.json"
    sacct.write_text(sacct_doc(job(1, "gpu1", 1, T0, T0 + 100)))
    SegmentStore(tmp_path / "store").write(
        "gpu1", sample_rows("gpu1", {0: (1, "0", 0.0)}, T0, T0 + 10))
    assert _run(site, sacct, tmp_path / "store").tables["idle_jobs"].empty


def test_wait_class_fragmentation_placement_hook(site: Site, data: tuple[Path, Path]) -> None:
    res = _run(site, *data)
    w = res.tables["wait"].set_index(["class", "gpu_model"])
    assert w.loc[("train", "h100"), "max_wait_s"] == 30
    # Jobs 2 and 4 wrote no class and partition gpu belongs to two classes: no class.
    assert w.loc[("", "h100"), "mean_wait_s"] == pytest.approx(30.0)  # 0 s and 60 s
    assert set(res.tables["by_class"]["class"]) == {"train", ""}
    frag = res.tables["fragmentation"].set_index("gpu_model")
    assert frag.loc["h100", "stranded_gpu_hours"] == pytest.approx(400 / 3600)
    p = res.tables["placement"].set_index("job_id")
    assert bool(p.loc[3, "split_across_islands"]) and not bool(
        p.loc[1, "split_across_islands"])
    h = res.tables["hook_decisions"].set_index("job_id")
    assert h.loc[4, "asked_models"] == "h100|a100" and bool(h.loc[4, "model_met"])
    assert h.loc[3, "asked_locality"] == "nvlink" and h.loc[3, "locality_met"] is False


def test_right_size_suggests_the_slower_model(site: Site, data: tuple[Path, Path]) -> None:
    rs = _run(site, *data).tables["right_size"].set_index("job_id")
    # Job 2 used ~0.5 % of an H100: an A100 (a third the speed) would have served.
    assert rs.loc[2, "suggested_model"] == "a100"
    assert 1 not in rs.index  # 75 % x 3 would overload an A100


def test_filters(site: Site, data: tuple[Path, Path]) -> None:
    sacct, store = data
    res = run_audit(AuditRequest(since=T0 - 100, until=T0 + 200, store=str(store),
                                 sacct_file=str(sacct), models=("a100",)), site, now=T0 + 1000)
    assert list(res.tables["by_gpu_model"].query("jobs > 0")["gpu_model"]) == ["a100"]


def test_recorded_sacct_output_of_slurm_22_05_parses(site: Site) -> None:
    res = parse_sacct_json((ROOT / "tests/data/slurm/sacct.json").read_text(), site)
    assert res.records == 12 and res.skipped == 0
    gpu = res.jobs[res.jobs["gpus"] > 0]
    assert set(gpu["gpu_model"]) <= {"a100", "h100"}


@pytest.mark.parametrize("text", ["", "garbage", "{\"jobs\": [", "[1, 2]",
                                  "{\"meta\": {}, \"jobs\": [{\"job_id\": 1}, ",
                                  "{\"meta\": {}}"])
def test_sacct_garbage_is_one_clear_error(text: str) -> None:
    with pytest.raises(MetricsError, match="sacct output"):
        parse_sacct_json(text)


def test_sacct_garbage_gives_a_partial_audit_not_a_crash(site: Site, data: tuple[Path, Path]
                                                         ) -> None:
    sacct, store = data
    sacct.write_text(sacct.read_text()[:300])  # truncated
    res = _run(site, sacct, store)
    assert res.partial and "accounting unavailable" in res.meta["problems"][0]
    assert res.tables["by_gpu_model"]["allocated_gpu_hours"].sum() == 0
    # Samples are still counted: capacity nobody held is still reported.
    assert res.tables["by_gpu_model"]["unallocated_gpu_hours"].sum() > 0


def test_a_record_that_is_not_a_job_is_skipped_and_counted(site: Site, tmp_path: Path) -> None:
    sacct = tmp_path / "s.json"
    sacct.write_text(sacct_doc(job(1, "gpu1", 1, T0, T0 + 10), {"job_id": "x"}))
    res = _run(site, sacct, None)
    assert res.partial and res.meta["sacct_skipped"] == 1 and res.meta["jobs"] == 1


def test_refused_segments_make_the_result_partial(site: Site, data: tuple[Path, Path]) -> None:
    sacct, store = data
    seg = next(iter((store / "gpu3").rglob("seg-*")))
    seg.write_bytes(seg.read_bytes()[:100])
    res = _run(site, sacct, store)
    assert res.partial and res.meta["store"]["refused"]["corrupt"] == 1
    m = res.tables["by_gpu_model"].set_index("gpu_model")
    assert m.loc["a100", "unsampled_gpu_hours"] == pytest.approx(400 / 3600)


def test_empty_range_gives_empty_tables(site: Site, data: tuple[Path, Path]) -> None:
    res = _run(site, *data, since=T0 + 10_000, until=T0 + 20_000)
    assert all(len(t) == 0 for t in res.tables.values())
    assert "no jobs and no samples in the range" in res.meta["problems"]


def test_recorded_testbed_sacct_gives_each_job_its_model(site: Site) -> None:
    # Recorded from the testbed after the demo's jobs: 5 busy h100, 6 idle h100, 7 a100.
    text = (ROOT / "tests/data/metrics/sacct_testbed_demo.json").read_text()
    jobs = parse_sacct_json(text, site).jobs.set_index("job_id")
    assert jobs.loc[5, "gpu_model"] == "h100" and jobs.loc[5, "gpus"] == 2
    assert jobs.loc[7, "gpu_model"] == "a100" and jobs.loc[7, "gpus"] == 4
    assert (jobs.loc[[5, 6, 7], "end"] > jobs.loc[[5, 6, 7], "start"]).all()


def test_usage_and_collector_sections_are_strict() -> None:
    from hetslurm.errors import ConfigError
    from hetslurm.site.load import parse_site

    base = (ROOT / "site-configs" / "demo.toml").read_text()
    ok = parse_site(base + "\n[usage]\nspeed = {h100 = 3.0, a100 = 1.0}\nidle_window_s = 600\n"
                    "[collector]\nnvml = \"fake\"\ninterval_s = 5\n")
    assert ok.sections["usage"].idle_window_s == 600
    assert ok.sections["collector"].nvml == "fake"
    with pytest.raises(ConfigError, match="did you mean 'h100'"):
        parse_site(base + "\n[usage]\nspeed = {h10 = 3.0}\n", "s.toml")
    with pytest.raises(ConfigError, match="did you mean 'idle_window_s'"):
        parse_site(base + "\n[usage]\nidle_windows_s = 3\n", "s.toml")
    with pytest.raises(ConfigError, match=r"collector\.nvml"):
        parse_site(base + "\n[collector]\nnvml = \"maybe\"\n", "s.toml")


# Issue 18, finding 2: each allocated GPU must be reported for min_coverage of the window;
# one with no rows is unknown, and unknown is never idle.
def _idle_ids(site: Site, tmp_path: Path, sacct_job: dict[str, Any],
              writes: dict[str, dict[int, tuple[int | None, str | None, float | None]]],
              **rows_kw: Any) -> set[int]:
    tmp_path.mkdir()
    sacct = tmp_path / "sacct.json"
    sacct.write_text(sacct_doc(sacct_job))
    st = SegmentStore(tmp_path / "store")
    for node, idx in writes.items():
        rows = sample_rows(node, idx, T0, T0 + 100)
        for r in rows:
            r.update(rows_kw)
        st.write(node, rows[:1] if "interval_s" in rows_kw else rows)
    return set(_run(site, sacct, tmp_path / "store").tables["idle_jobs"]["job_id"])


def test_a_two_node_job_with_one_collector_down_is_not_idle(site: Site, tmp_path: Path) -> None:
    both = {"gpu1": {0: (1, "0", 0.0)}, "gpu2": {0: (1, "0", 0.0)}}
    assert _idle_ids(site, tmp_path / "a", job(1, "gpu[1-2]", 2, T0, T0 + 100), both) == {1}
    assert _idle_ids(site, tmp_path / "b", job(1, "gpu[1-2]", 2, T0, T0 + 100),
                     {"gpu1": both["gpu1"]}) == set()


def test_an_eight_gpu_job_with_four_reported_is_not_idle(site: Site, tmp_path: Path) -> None:
    def gpus(n: int) -> dict[int, tuple[int | None, str | None, float | None]]:
        return {i: (1, "0-7", 0.0) for i in range(n)}

    assert _idle_ids(site, tmp_path / "a", job(1, "gpu1", 8, T0, T0 + 100),
                     {"gpu1": gpus(8)}) == {1}
    assert _idle_ids(site, tmp_path / "b", job(1, "gpu1", 8, T0, T0 + 100),
                     {"gpu1": gpus(4)}) == set()


def test_one_sample_claiming_a_huge_interval_covers_one_interval(site: Site,
                                                                  tmp_path: Path) -> None:
    # One sample per GPU claiming 10^6 s: the site's collector takes one every 30 s, so it
    # stands for 30 s of a 100 s run at most.
    assert _idle_ids(site, tmp_path / "a", job(1, "gpu1", 2, T0, T0 + 100),
                     {"gpu1": {0: (1, "0-1", 0.0), 1: (1, "0-1", 0.0)}},
                     interval_s=1e6) == set()
