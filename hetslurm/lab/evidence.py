"""docs/evidence.md's baseline tables, from a ``hetslurm simulate --format json`` document.

``python -m hetslurm.lab.evidence RESULT.json`` prints, per load, one Markdown row per
policy: mean wait and mean JCT as the median over the seeds with their min-max, and the
ratios to the strongest baseline of the run (medians over the seeds, min-max beside), as
docs/evidence.md quotes them; ``tests/unit/test_evidence_pinned.py`` checks that the
small-scale table the page quotes is what the replay prints today.
"""

from __future__ import annotations

import json
import sys
from typing import Any

HEADER = ("| load | policy | mean wait s: median (min-max) | mean JCT s: median (min-max) | "
          "mean wait / strongest | mean JCT / strongest |\n|---|---|---|---|---|---|")


def _num(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _stat(s: dict[str, Any]) -> str:
    return f"{_num(s['median'])} ({_num(s['min'])}-{_num(s['max'])})"


def _ratio(entry: dict[str, Any], key: str) -> str:
    if key not in entry:
        return "(strongest)"
    m = entry[key]
    if m is None:
        return "n/a"
    spread = entry.get("spread", {}).get(key)
    return f"{m:.2f}" + (f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else "")


def baseline_rows(doc: dict[str, Any]) -> list[str]:
    """The table's rows (without the header), loads in the document's order."""
    by_policy = {e["policy"]: e for e in doc["summary"]}
    if "spread" in doc:
        cells = {(e["policy"], e["load"]): (_stat(e["mean_wait_s"]), _stat(e["mean_jct_s"]))
                 for e in doc["spread"]}
    else:
        cells = {(r["policy"], r["load"]): (_num(r.get("mean_wait_s")),
                                            _num(r.get("mean_jct_s"))) for r in doc["rows"]}
    loads = list(dict.fromkeys(r["load"] for r in doc["rows"]))
    strongest = doc["meta"].get("strongest_baseline")
    out = []
    for x in loads:
        for p, entry in by_policy.items():
            wait, jct = cells[(p, x)]
            name = f"**{p}**" if p == strongest else p
            out.append(f"| {x:g} | {name} | {wait} | {jct} | "
                       f"{_ratio(entry, f'mean_wait_ratio@{x:g}')} | "
                       f"{_ratio(entry, f'jct_ratio@{x:g}')} |")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m hetslurm.lab.evidence RESULT.json\n")
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        doc = json.load(fh)
    print(HEADER)
    print("\n".join(baseline_rows(doc)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
