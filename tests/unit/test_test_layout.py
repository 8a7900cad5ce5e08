"""tests/ is not a package (so the installed hetslurm is what tests import); pytest then
needs every test module basename to be unique across tests/unit, tests/slurmctld and
tests/cluster, or collection fails with an import-file mismatch."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    assert [n for n, c in names.items() if c > 1] == []
