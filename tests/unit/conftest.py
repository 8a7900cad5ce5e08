"""Fixtures shared by unit test modules."""

from __future__ import annotations

import pytest
from replay_cases import case_study as _case_study

from hetslurm.placement.model import ClusterModel


@pytest.fixture(scope="module")
def case_study() -> tuple[ClusterModel, dict[str, tuple[int, ...]]]:
    """The case-study model and its partitions' nodes (replay_cases.case_study)."""
    return _case_study()
