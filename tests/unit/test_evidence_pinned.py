"""The small-scale baseline table docs/evidence.md quotes is what the replay prints today.

The page's "Against the baselines" section quotes the first 1,000 pods of the Alibaba trace at
load 4 under the four baselines, hetslurm and its ablation variants (``--without fallback
--without speeds --without fallback,speeds``), five seeds, with the command beside it; this
test runs the same replay and checks that every row :mod:`hetslurm.lab.evidence` renders
from it is on the page, word for word. A change that moves a figure fails here until the
page says the new one.
"""

from __future__ import annotations

from pathlib import Path

from hetslurm.lab.evidence import HEADER, baseline_rows
from hetslurm.simulate.params import BASELINES, POLICIES, load_params
from hetslurm.simulate.run import simulate
from hetslurm.simulate.traces import read_trace
from hetslurm.site.load import load_site
from hetslurm.traces import traces_dir

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("hetslurm-without-fallback", "hetslurm-without-speeds",
            "hetslurm-without-fallback+speeds")


def test_the_quoted_baseline_table_is_what_the_replay_prints() -> None:
    trace = read_trace(traces_dir() / "alibaba-gpu-v2023" / "openb_pod_list_default.csv",
                       "alibaba")
    res = simulate(load_site(ROOT / "site-configs" / "case-study.toml"), trace,
                   load_params(ROOT / "site-configs" / "simulate-params.toml"),
                   policies=(*POLICIES, *VARIANTS), loads=(4.0,), limit=1000,
                   seeds=(0, 1, 2, 3, 4))
    doc = res.to_dict()
    assert doc["meta"]["strongest_baseline"] in BASELINES
    assert doc["meta"]["failed_rows"] == 0 and len(doc["rows"]) == 40
    page = (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8")
    assert HEADER in page
    missing = [row for row in baseline_rows(doc) if row not in page]
    assert not missing, "docs/evidence.md does not quote:\n" + "\n".join(missing)
