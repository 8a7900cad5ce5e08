"""``hetslurm learn speeds`` on synthetic accounting: factors recovered, intervals that hold
the truth, and pairs it cannot measure said as such."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from hetslurm.audit.speeds import learn_speeds, speed_section
from hetslurm.cli import cli


def _jobs(rows: list[tuple[str, str, str, str, float]]) -> Any:
    return pd.DataFrame([{"user": u, "name": n, "wclass": c, "state": "COMPLETED", "gpus": 1,
                          "gpu_model": m, "elapsed": e} for u, n, c, m, e in rows])


def _synthetic(seed: int = 1, n: int = 60) -> Any:
    rng = random.Random(seed)
    factor = {"h100": 1.0, "a100": 2.0, "v100": 3.5}
    rows = []
    for i in range(n):
        job = f"job{i % 6}"
        base = 100.0 * (1 + i % 6)  # recurring jobs of very different lengths
        model = rng.choice(list(factor))
        rows.append(("ann", job, "train", model, base * factor[model] * rng.uniform(0.95, 1.05)))
    return _jobs(rows)


def test_factors_are_recovered_with_intervals_that_hold_them() -> None:
    res = learn_speeds(_synthetic(), model_order=("h100", "a100", "v100"))
    got = {r.model: r for r in res.rows}
    assert got["h100"].ratio == 1.0 and got["h100"].note == "reference"
    for model, truth in (("a100", 0.5), ("v100", 1 / 3.5)):
        r = got[model]
        assert r.ratio == pytest.approx(truth, rel=0.05)
        assert r.ci_low is not None and r.ci_high is not None and r.ci_low < r.ratio < r.ci_high
        assert r.n > 3
    # The 95 % intervals hold the truth about 95 % of the time (40 independent data sets).
    held = 0
    for seed in range(40):
        r = {x.model: x for x in learn_speeds(_synthetic(seed), model_order=("h100",)).rows}
        held += r["a100"].ci_low <= 0.5 <= r["a100"].ci_high  # type: ignore[operator]
    assert held >= 34, held


def test_too_few_and_not_comparable_are_said_not_guessed() -> None:
    rows = [("ann", "a", "train", "h100", 10.0)] * 4 + [("ann", "a", "train", "a100", 20.0)] * 2
    # bob's job ran only on v100: nothing links v100 to h100.
    rows += [("bob", "b", "train", "v100", 30.0)] * 4
    res = learn_speeds(_jobs(rows), model_order=("h100", "a100", "v100"))
    got = {r.model: r for r in res.rows}
    assert got["a100"].ratio is None and "too few jobs (2 < 3)" in got["a100"].note
    assert got["v100"].ratio is None and "not comparable" in got["v100"].note
    text = speed_section(res)
    assert "# train/a100: not measured: too few jobs" in text
    doc = tomllib.loads(text)
    assert doc == {"levers": {"speed": {"h100": {"train": 1.0}}}}


def test_classes_are_fitted_apart_and_bad_runs_left_out() -> None:
    rows = [("ann", "a", "train", "h100", 10.0)] * 3 + [("ann", "a", "train", "a100", 20.0)] * 3
    rows += [("ann", "i", "", "h100", 10.0)] * 3 + [("ann", "i", "", "a100", 11.0)] * 3
    df = _jobs(rows)
    df.loc[len(df)] = {"user": "x", "name": "y", "wclass": "", "state": "FAILED", "gpus": 1,
                       "gpu_model": "h100", "elapsed": 5}
    df.loc[len(df)] = {"user": "x", "name": "y", "wclass": "", "state": "COMPLETED",
                       "gpus": 1, "gpu_model": "h100|a100", "elapsed": 5}
    res = learn_speeds(df, model_order=("h100", "a100"))
    ratio = {(r.wclass, r.model): r.ratio for r in res.rows}
    assert ratio[("train", "a100")] == pytest.approx(0.5)
    assert ratio[("-", "a100")] == pytest.approx(10 / 11, rel=1e-3)
    assert res.left_out["not completed"] == 1 and res.left_out["model unknown or mixed"] == 1
    doc = tomllib.loads(speed_section(res))
    assert doc["levers"]["speed"]["a100"]["-"] == pytest.approx(0.9091, rel=1e-3)


def test_cli_on_a_sacct_file(tmp_path: Path) -> None:
    bad = tmp_path / "sacct.json"
    bad.write_text("not json")
    res = CliRunner().invoke(cli, ["learn", "speeds", "--sacct-file", str(bad)])
    assert res.exit_code == 2 and "accounting could not be read" in res.output
    good = Path(__file__).resolve().parents[1] / "data" / "slurm" / "sacct.json"
    out = tmp_path / "speeds.toml"
    res = CliRunner().invoke(cli, ["learn", "speeds", "--sacct-file", str(good), "--since",
                                   "0", "--format", "json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert isinstance(rows, (list, dict))
    tomllib.loads(out.read_text())


# ------------------------------------------------------------------ issue 22 item 3, rest
def _random_jobs(seed: int) -> Any:
    """Random recurring jobs on four models, some run once, a v100 group linked to nothing."""
    rng = random.Random(seed)
    factor = {"h100": 1.0, "a100": 2.0, "v100": 3.5, "t4": 6.0}
    rows = []
    for _ in range(300):
        g = rng.randrange(40)
        model = rng.choice(["h100", "a100", "t4"])
        rows.append((f"u{g % 5}", f"j{g}", "train" if g % 2 else "", model,
                     round(50.0 * (1 + g) * factor[model] * rng.uniform(0.9, 1.1))))
    rows += [("solo", "v", "train", "v100", 30.0 + i) for i in range(4)]
    return _jobs(rows)


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_fit_equals_the_dense_reference(seed: int) -> None:
    df = _random_jobs(seed)
    fast = learn_speeds(df, model_order=("h100",))
    ref = learn_speeds(df, model_order=("h100",), reference=True)
    assert [(r.wclass, r.model, r.n, r.note) for r in fast.rows] == \
        [(r.wclass, r.model, r.n, r.note) for r in ref.rows]
    for a, b in zip(fast.rows, ref.rows, strict=True):
        for f in ("ratio", "ci_low", "ci_high"):
            x, y = getattr(a, f), getattr(b, f)
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, abs=2e-4))
    assert any("not comparable" in r.note for r in fast.rows)


def _two_scripts(hashes: bool) -> Any:
    """One user and job name, two programs: script A is short and ran mostly on H100,
    script B ten times as long and ran mostly on A100; an A100 takes twice as long."""
    run = ("ann", "run", "train")
    rows = ([(*run, "h100", 10.0)] * 4 + [(*run, "a100", 20.0)]
            + [(*run, "h100", 100.0)] + [(*run, "a100", 200.0)] * 4)
    df = _jobs(rows)
    if hashes:
        df["script"] = ["aaaa"] * 5 + ["bbbb"] * 5
    return df


def test_script_hash_separates_two_scripts_with_one_name() -> None:
    by_name = {r.model: r for r in learn_speeds(_two_scripts(False), model_order=("h100",)).rows}
    res = learn_speeds(_two_scripts(True), model_order=("h100",))
    by_script = {r.model: r for r in res.rows}
    assert by_name["a100"].ratio is not None and by_name["a100"].ratio < 0.2  # biased
    assert by_script["a100"].ratio == pytest.approx(0.5)
    assert "1 of them ran different scripts under one name" in res.notes[0]
    # One run whose script is not known: the whole recurring job falls back to its name.
    df = _two_scripts(True)
    df.loc[0, "script"] = ""
    res = learn_speeds(df, model_order=("h100",))
    assert {r.model: r.ratio for r in res.rows}["a100"] == by_name["a100"].ratio
    assert any("matched by user and job name only" in n for n in res.notes)


def test_script_hashes_read_only_what_is_missing_and_cached(tmp_path: Path) -> None:
    from hetslurm.audit.scripts import attach_hashes, read_script_hashes, script_hash
    from hetslurm.audit.speeds import jobs_for_scripts
    from hetslurm.errors import BackendError

    df = _two_scripts(False)
    df["job_id"] = range(1, len(df) + 1)
    df["submit"] = 1_000.0
    df.loc[len(df)] = {"user": "bob", "name": "once", "wclass": "train", "state": "COMPLETED",
                       "gpus": 1, "gpu_model": "h100", "elapsed": 5.0, "job_id": 99,
                       "submit": 1_000.0}
    wanted = jobs_for_scripts(df)
    assert sorted(wanted["job_id"]) == list(range(1, 11))  # bob's job ran on one model

    class Reader:
        def __init__(self) -> None:
            self.asked: list[int] = []

        def stored_batch_scripts(self, ids: Any) -> dict[int, str | None]:
            self.asked += list(ids)
            return {i: (None if i == 3 else f"#!/bin/sh\n# {'a' if i <= 5 else 'b'}\n")
                    for i in ids}

    cache = tmp_path / "c" / "hashes.json"
    r1 = Reader()
    got = read_script_hashes(wanted, r1, cache, limit=4)
    assert r1.asked == [1, 2, 3, 4] and got.read == 4 and got.left_unread == 6
    assert got.hashes["1@1000"] == script_hash("#!/bin/sh\n# a\n") and got.hashes["3@1000"] == ""
    assert any("no stored script" in n for n in got.notes)
    r2 = Reader()
    got = read_script_hashes(wanted, r2, cache, limit=100)
    assert r2.asked == [5, 6, 7, 8, 9, 10] and got.cached == 4
    assert "#!/bin/sh" not in cache.read_text()  # hashes only, never the script
    res = learn_speeds(attach_hashes(df, got), model_order=("h100",))
    assert any("matched by user and job name only" in n for n in res.notes)  # job 3

    class Broken:
        def stored_batch_scripts(self, ids: Any) -> dict[int, str | None]:
            raise BackendError("sacct: command not found")

    cache.write_text("{not json")
    got = read_script_hashes(wanted, Broken(), cache, limit=100)
    assert got.read == 0 and got.left_unread == 10
    assert any("could not be read" in n for n in got.notes)


def test_stored_batch_scripts_document() -> None:
    from hetslurm.slurm.sacct import SacctDocumentError, parse_sacct_scripts

    doc = json.dumps({"jobs": [{"job_id": 1, "script": "#!/bin/sh\nBatch Script for 2\n"},
                               {"job_id": 2, "script": ""}, {"job_id": 3}]})
    assert parse_sacct_scripts(doc) == {1: "#!/bin/sh\nBatch Script for 2\n", 2: None, 3: None}
    with pytest.raises(SacctDocumentError):
        parse_sacct_scripts("Batch Script for 1\n---\n")


DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"


def _ranked(rows: list[tuple[str, str, str, str, float]]) -> Any:
    from hetslurm.audit.ranking import rank_classes
    from hetslurm.site import load_site

    site = load_site(DEMO)
    res = learn_speeds(_jobs(rows), model_order=site.scheduling.gpu_model_order)
    return res, site, {rk.wclass: rk for rk in rank_classes(res, site)}


def test_ranking_moves_a_device_only_where_the_intervals_separate() -> None:
    rng = random.Random(3)
    clear = [("ann", f"j{i % 4}", "inference", m, (1 + i % 4) * 10.0 * f * rng.uniform(0.97, 1.03))
             for i in range(40) for m, f in (("h100", 1.0), ("a100", 2.0))]
    res, _, ranked = _ranked(clear)
    inf = ranked["inference"]
    assert inf.site_order == ("a100", "h100") and inf.proposed == ("h100", "a100")
    assert any("a100: 0.5" in e for e in inf.evidence)
    # The same speed within noise: the intervals overlap, the site's order stays.
    noisy = [("ann", f"j{i % 4}", "inference", m, (1 + i % 4) * 10.0 * rng.uniform(0.5, 1.5))
             for i in range(12) for m in ("h100", "a100")]
    res, _, ranked = _ranked(noisy)
    row = {r.model: r for r in res.rows}["a100"]
    assert row.ci_low is not None and row.ci_low < 1.0 < row.ci_high  # type: ignore[operator]
    assert not ranked["inference"].changed


def test_too_few_jobs_and_a_model_the_site_lacks(tmp_path: Path) -> None:
    from hetslurm.audit.ranking import merged_site
    from hetslurm.errors import ConfigError

    rows = [("ann", "a", "train", "h100", 10.0)] * 4 + [("ann", "a", "train", "a100", 20.0)] * 2
    res, site, ranked = _ranked(rows)
    assert not ranked["train"].changed
    assert any("too few jobs (2 < 3)" in e for e in ranked["train"].evidence)
    text, notes = merged_site(DEMO.read_text(), str(DEMO), res, site, list(ranked.values()))
    assert "[levers.speed] not proposed: no class has a measured ratio for every GPU model" \
        in notes[0]
    # The site's own [levers.speed] stands, unchanged.
    assert tomllib.loads(text)["levers"].get("speed") == \
        tomllib.loads(DEMO.read_text())["levers"].get("speed")
    rows = [("ann", "a", "train", m, e) for m, e in (("h100", 10.0), ("v100", 30.0))] * 4
    with pytest.raises(ConfigError, match="measured GPU model v100, which site 'hetdemo' "
                                          "lacks"):
        _ranked(rows)


def _bench_files(tmp_path: Path, jobs: int = 3000) -> tuple[Path, list[str]]:
    from hetslurm.lab.bench_learn import generate

    made = generate(tmp_path, jobs, nodes=20, groups=200)
    return tmp_path, ["learn", "speeds", "--site", str(tmp_path / "site.toml"), "--sacct-file",
                      str(tmp_path / "sacct.json"), "--since", str(made["since"]), "--until",
                      str(made["until"]), "--script-cache", str(tmp_path / "script-hashes.json")]


def test_site_out_round_trips_through_the_site_loader(tmp_path: Path) -> None:
    from hetslurm.site.load import parse_site

    root, argv = _bench_files(tmp_path)
    out, merged = root / "out.toml", root / "merged.toml"
    res = CliRunner().invoke(cli, [*argv, "--format", "json", "--out", str(out),
                                   "--site-out", str(merged)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["rankings"][0]["proposed"] == ["h100", "a100"]
    assert {(r["model"], r["ratio"]) for r in doc["rows"]} >= {("a100", 1.0)}
    site = parse_site(merged.read_text(), str(merged))
    assert site.sections["classes"]["train"].devices == ("h100", "a100")
    speed = site.sections["levers"].speed
    assert speed["a100"]["train"] == 1.0 and speed["h100"]["train"] == pytest.approx(2.0, rel=0.02)
    frag = tomllib.loads(out.read_text())
    assert frag["classes"]["train"]["devices"] == ["h100", "a100"]
    assert any("different scripts under one name" in n for n in doc["notes"])
    res = CliRunner().invoke(cli, [*argv, "--format", "json", "--no-scripts"])
    assert "user and job name only (no script hashes)" in res.stdout


def test_model_the_site_lacks_is_one_line_and_nothing_written(tmp_path: Path) -> None:
    root, argv = _bench_files(tmp_path, 600)
    site = root / "site.toml"
    site.write_text(site.read_text().replace('"a100"', '"l40s"'))
    out = root / "merged.toml"
    res = CliRunner().invoke(cli, [*argv, "--site-out", str(out)])
    assert res.exit_code == 2
    assert "measured GPU model a100, which site 'synth' lacks" in res.output
    assert not out.exists()


def test_hostile_job_and_class_names(tmp_path: Path) -> None:
    from hetslurm.audit.speeds import shown

    evil_class = 'x"\n[levers]\nbilling_gpu = 1e6\n#'
    evil_name = "[/]\x1b[31m\x00" + "n" * 100_000
    rows = [("ann", evil_name, evil_class, m, e) for m, e in (("h100", 10.0), ("a100", 20.0))] * 3
    rows += [("ann", evil_name, "train", m, e) for m, e in (("h100", 10.0), ("a100", 20.0))] * 3
    res = learn_speeds(_jobs(rows), model_order=("h100",))
    text = speed_section(res)
    doc = tomllib.loads(text)  # still TOML, and nothing injected
    assert doc == {"levers": {"speed": {"a100": {"train": 0.5}, "h100": {"train": 1.0}}}}
    assert shown(evil_class) in text and "\n[levers]\n" not in text
    assert shown("\x1b[31m") == repr("\x1b[31m")
    # The table renders a hostile class without markup errors or raw escapes.
    from hetslurm.cli.output import emit

    emit([r.to_dict() for r in res.rows], "table")
