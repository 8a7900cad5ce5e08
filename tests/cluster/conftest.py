"""Cluster tests: the real local Slurm testbed, booted once per session.

The session fixture brings the testbed up in its own state folder (``.testbed-tests`` in the
checkout, or ``$HETSLURM_TEST_TESTBED_DIR``) on the host's Slurm or ``$HETSLURM_TEST_SLURM``
(a release run from its Debian root) and brings it down at the end, so nothing is left
running. Each test submits through :class:`Jobs`, which cancels what the test submitted
and fails the test when that cleanup fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster_helpers import Jobs, session_testbed

from hetslurm.site import Site, load_site
from hetslurm.slurm import versions
from hetslurm.testbed import Testbed

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def demo_site() -> Site:
    return load_site(DEMO)


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    if os.geteuid() != 0:
        pytest.fail("cluster tests need root (the testbed starts Slurm daemons)")
    tb = session_testbed()
    tb.up(DEMO)
    yield tb
    tb.down()


@pytest.fixture(scope="session")
def slurm_env(testbed: Testbed) -> dict[str, str]:
    return testbed.env()


@pytest.fixture(scope="session")
def cli_env(testbed: Testbed) -> dict[str, str]:
    """What an in-process ``hetslurm`` command (CliRunner) needs to reach the testbed: its
    SLURM_CONF, and on a root the PATH with the root's client tools."""
    return {k: v for k, v in testbed.env_vars().items() if k in ("SLURM_CONF", "PATH")}


@pytest.fixture
def jobs(slurm_env: dict[str, str], testbed: Testbed) -> Iterator[Jobs]:
    j = Jobs(slurm_env, versions.release(testbed.slurm_release).gres_prefix)
    yield j
    # A failing cleanup is reported as an error of the test, never swallowed.
    j.cancel_all()
