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
