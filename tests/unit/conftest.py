"""Fixtures shared by unit test modules."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_cases import case_study as _case_study

from hetslurm.placement.model import ClusterModel


@pytest.fixture(autouse=True)
def _no_host_site(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
                  ) -> Path:
    """No unit test finds a site the host has: the site rule's config root and testbed are
    empty folders of this session, and ``$HETSLURM_SITE`` is unset (hetslurm.site.find), so
    nothing reads the host's /etc/hetslurm or a testbed running in the checkout."""
    root = tmp_path_factory.getbasetemp() / "no-host-site"
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "tb").mkdir(exist_ok=True)
    monkeypatch.delenv("HETSLURM_SITE", raising=False)
    monkeypatch.setenv("HETSLURM_ETC", str(root / "etc"))
    monkeypatch.setenv("HETSLURM_TESTBED_DIR", str(root / "tb"))
    return root


@pytest.fixture(scope="module")
def case_study() -> tuple[ClusterModel, dict[str, tuple[int, ...]]]:
    """The case-study model and its partitions' nodes (replay_cases.case_study)."""
    return _case_study()
