"""``hetslurm advise`` from measured energy (issue 23 item 4): ``[hook] energy_low_models``
from the audit's energy per unit of work, the lever's GPU watts from the placement score's
measured watts, each figure labelled measured or site file; nothing proposed from a
partial measurement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from hetslurm.audit.advise import AdviseRequest, propose
from hetslurm.audit.energy_advice import energy_notes
from hetslurm.metrics.store import empty_frame
from hetslurm.site.levers import device_scores
from hetslurm.site.load import parse_site

ROOT = Path(__file__).resolve().parents[2]
# H100 and A100 nodes; site watts H100 700 W, A100 400 W (+400 W host / 2 GPUs); speeds
# train: H100 3.0, A100 1.0. Few samples suffice for measured watts here.
SITE_TEXT = ((ROOT / "tests" / "data" / "levers" / "small.toml").read_text()
             + "\n[placement]\nenergy_min_samples = 5\n")
REQ = AdviseRequest(since=0, until=100_000, use_scripts=False)
NODE_MODEL = {"gpu1": "h100", "gpu2": "a100"}


def _history(busy_w: dict[str, float], jobs_per_model: int = 3, idle_w: float = 60.0,
             same_name: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per node, ``jobs_per_model`` one-GPU jobs of 10 samples each (30 s apart, 90 %
    utilization, ``busy_w`` watts), each followed by 10 idle samples (0 %, ``idle_w``).
    Each model's jobs have their own name, so no recurring job links the models and advise
    learns no speeds (the site's stay) unless ``same_name``: then both run 300 s, and the
    learned ratio is 1.0."""
    jobs, rows = [], []
    jid = 0
    for node, model in NODE_MODEL.items():
        if model not in busy_w:
            continue
        t, energy = 1000.0, 1e6
        for _ in range(jobs_per_model):
            jid += 1
            jobs.append({"job_id": jid, "run": 0, "name": "j" if same_name else f"j-{model}",
                         "user": "ann", "account": "a",
                         "partition": "gpu", "state": "COMPLETED", "submit": t - 10,
                         "eligible": t - 10, "start": t, "end": t + 300.0, "elapsed": 300.0,
                         "nodes": node, "gpus": 1, "gpu_model": model, "typed": True,
                         "constraints": "", "comment": "", "admin_comment": "",
                         "wclass": "train", "slurm_energy_j": float("nan")})
            for k in range(20):
                busy = k < 10
                watts = busy_w[model] if busy else idle_w
                energy += watts * 30.0
                rows.append({"time": t + 30.0 * k, "node": node, "minor": 0, "slurm_index": 0,
                             "gpu_model": model, "job_id": jid if busy else None,
                             "utilization_pct": 90.0 if busy else 0.0,
                             "memory_used_mib": 1000.0, "power_w": watts, "energy_j": energy,
                             "status": "ok", "interval_s": 30.0, "attributed": True,
                             "clock_jump": False})
            t += 600.0
    frame = pd.DataFrame(rows)
    base = empty_frame()
    for c in base.columns:
        if c not in frame:
            frame[c] = pd.Series([None] * len(frame), dtype=base[c].dtype)
        elif isinstance(base[c].dtype, pd.CategoricalDtype):
            frame[c] = frame[c].astype("category")
        else:
            frame[c] = frame[c].astype(base[c].dtype)
    return pd.DataFrame(jobs), frame[list(base.columns)]


def _propose(busy_w: dict[str, float], **kw: Any) -> Any:
    jobs, samples = _history(busy_w, **kw)
    return propose(jobs, {}, samples, parse_site(SITE_TEXT), SITE_TEXT, "small.toml", REQ)


def test_measured_energy_per_work_proposes_energy_low_and_the_levers_watts() -> None:
    # Measured: H100 600 W for 3 units of work per hour (200 Wh per A100-hour), A100 150 W
    # for one (150 Wh): the A100 is cheaper per unit of work, though the site's watts say
    # otherwise (H100 (700 + 200) / 3 = 300, A100 (400 + 200) / 1 = 600).
    adv = _propose({"h100": 600.0, "a100": 150.0})
    e = adv.energy
    assert e.figures["a100"] == pytest.approx((150.0, 3))
    assert e.figures["h100"] == pytest.approx((200.0, 3))
    assert e.proposed_low == ("a100",) and e.low_changed
    assert adv.site_text is not None
    proposed = parse_site(adv.site_text, "<advised>")
    assert proposed.sections["hook"].energy_low_models == ("a100",)
    gpus = {c: s.gpus for c, s in proposed.node_classes.items() if s.gpus}
    assert (gpus["h100x2"].power_busy_watts, gpus["h100x2"].power_idle_watts) == (600.0, 60.0)
    assert (gpus["a100x2"].power_busy_watts, gpus["a100x2"].power_idle_watts) == (150.0, 60.0)
    # The lever now ranks by the measured watts: A100 (150 + 200) / 1 = 350 against H100
    # (600 + 200) / 3 = 267 on energy; cost (3.0/3 against 2.0/1) still favours the H100.
    scores = device_scores(proposed.node_classes, proposed.sections["levers"], "gpu")
    assert scores["a100"] == pytest.approx(0.5 * 350 / (800 / 3) + 0.5 * 2.0)
    assert "hook.energy_low_models: none -> a100 (measured energy per unit of work)" in \
        adv.changes
    assert "# advise: watts of h100 measured: busy 600 W over 30 samples" in adv.site_text
    doc = adv.to_dict()["energy"]
    assert {w["model"]: w["source"] for w in doc["watts"]} == {"h100": "measured",
                                                               "a100": "measured"}
    notes = energy_notes(e)
    assert "energy: a100: 150.0 Wh per reference GPU-hour (measured, 3 jobs)" in notes
    assert ("energy: h100 watts busy 600 W, idle 60 W (measured; site file: 700 W, none)"
            in notes)


def test_models_within_ten_percent_of_the_lowest_are_all_low_energy() -> None:
    # H100 630 W / 3 = 210 Wh, A100 200 Wh: within 10 %, both, in the site's order.
    adv = _propose({"h100": 630.0, "a100": 200.0})
    assert adv.energy.proposed_low == ("h100", "a100")


def test_an_unmeasured_model_proposes_no_energy_low_and_keeps_the_site_watts() -> None:
    adv = _propose({"h100": 600.0})
    e = adv.energy
    assert e.proposed_low is None and "for a100" in e.low_note
    by = {w.model: w for w in e.watts}
    assert by["a100"].source == "site file" and by["a100"].busy_w == 400.0
    assert by["h100"].source == "measured"
    assert adv.site_text is not None  # the H100's measured watts are still proposed
    assert "# advise: watts of a100 from the site file (not measured" in adv.site_text
    assert "energy_low_models" not in adv.site_text
    # Too few jobs with covered energy for a model: the same.
    assert _propose({"h100": 600.0, "a100": 150.0}, jobs_per_model=2).energy.proposed_low \
        is None


def test_without_samples_nothing_is_measured_and_the_site_file_is_named() -> None:
    jobs, _ = _history({"h100": 600.0, "a100": 150.0})
    adv = propose(jobs, {}, empty_frame(), parse_site(SITE_TEXT), SITE_TEXT, "small.toml",
                  REQ)
    assert adv.energy.proposed_low is None and not adv.energy.figures
    assert {w.source for w in adv.energy.watts} == {"site file"}
    assert not any("watts" in c or "energy_low" in c for c in adv.changes)


def test_speeds_advise_proposes_are_the_ones_energy_per_work_uses() -> None:
    # The same jobs on both models take the same time: advise proposes train ratios 1.0,
    # and with them the A100 (150 Wh) is far cheaper than the H100 (600 Wh) per unit.
    adv = _propose({"h100": 600.0, "a100": 150.0}, same_name=True)
    assert adv.speed_table == {"h100": {"train": 1.0}, "a100": {"train": 1.0}}
    assert adv.energy.figures["h100"] == pytest.approx((600.0, 3))
    assert adv.energy.proposed_low == ("a100",)
