"""Session-wide test plumbing: a per-tier summary, so a run shows the cluster tests ran."""

from __future__ import annotations

from collections import Counter

import pytest

TIERS = ("unit", "slurmctld", "cluster")


def _tier(nodeid: str) -> str:
    for tier in TIERS:
        if nodeid.startswith(f"tests/{tier}/") or f"/{tier}/" in nodeid:
            return tier
    return "other"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts: dict[str, Counter[str]] = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for rep in terminalreporter.stats.get(outcome, []):
            if getattr(rep, "when", "call") not in ("call", "setup") or not hasattr(rep, "nodeid"):
                continue
            if outcome == "passed" and rep.when != "call":
                continue
            counts.setdefault(_tier(rep.nodeid), Counter())[outcome] += 1
    if not counts:
        return
    terminalreporter.section("tests by tier")
    for tier in (*TIERS, "other"):
        if tier in counts:
            c = counts[tier]
            terminalreporter.line(
                f"{tier:10s} passed {c['passed']:4d}  failed {c['failed'] + c['error']:3d}  "
                f"skipped {c['skipped']:3d}")
