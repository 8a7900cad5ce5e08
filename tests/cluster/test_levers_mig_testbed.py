"""The MIG lever on a real Slurm 22.05: a job asking for one MIG slice type runs on the
MIG node and gets exactly one slice (docs/levers.md, "GPU sharing: MIG").

Own 2-node testbed (tests/data/levers/mig.toml: mig1 with two A100-40GB each split into
3g.20gb + 2g.10gb + 2 x 1g.5gb, gpu1 with a whole H100) in a short /tmp folder, brought
down at the end; the test asserts nothing of it is left running.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster_helpers import Jobs, own_testbed

from hetslurm.levers import diff
from hetslurm.process import run_command
from hetslurm.site import levers, load_site
from hetslurm.testbed import Testbed
from hetslurm.testbed.target import rollout_target

ROOT = Path(__file__).resolve().parents[2]
MIG_FILE = ROOT / "tests" / "data" / "levers" / "mig.toml"


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    with own_testbed("hmg", MIG_FILE) as bed:
        yield bed


@pytest.fixture
def jobs(tb: Testbed) -> Iterator[Jobs]:
    j = Jobs(tb.env())
    yield j
    j.cancel_all()


def _job_gres(env: dict[str, str], job: str) -> list[tuple[str, int, str]]:
    """``(type, count, IDX)`` of every gres of a running job (``scontrol show job -d``)."""
    out = run_command(["scontrol", "show", "job", "-d", job], timeout=30, env=env).stdout
    return [(m.group(1), int(m.group(2)), m.group(3))
            for m in re.finditer(r"\bGRES=gpu:([a-z0-9_]+):(\d+)\(IDX:([^)]*)\)", out)]


def test_the_mig_node_offers_its_slices_as_typed_gpus(tb: Testbed) -> None:
    site = load_site(MIG_FILE)
    out = run_command(["scontrol", "show", "node", "-o", "mig1"], timeout=30,
                      env=tb.env()).stdout
    gres = {m.group(1): int(m.group(2)) for m in re.finditer(r"gpu:([a-z0-9_]+):(\d+)", out)}
    assert gres == dict(levers.node_mig_gres(site, site.node("mig1")))
    # The emulated MIG capability files exist as character devices, as slurmd needs.
    caps = sorted((tb.root).rglob("nvidia-cap*"))
    assert len(caps) == 16 and all(p.is_char_device() for p in caps)
    conf = (tb.etc / "slurm.conf").read_text()
    assert "gres/gpu:a100_1g_5gb" in conf  # AccountingStorageTRES
    # The rollout reads the MultipleFiles records back: the unchanged site diffs empty.
    assert diff(site, rollout_target(tb, site)).changes == ()


def test_a_job_asking_for_one_slice_gets_exactly_one(tb: Testbed, jobs: Jobs) -> None:
    env = tb.env()
    a = jobs.sbatch("--gres=gpu:a100_1g_5gb:1", script="sleep 60")
    jobs.wait_state(a, {"RUNNING"}, timeout=60)
    assert jobs.field(a, "NodeList") == "mig1"
    got = _job_gres(env, a)
    assert len(got) == 1, got
    typ, count, idx = got[0]
    assert (typ, count) == ("a100_1g_5gb", 1) and re.fullmatch(r"\d+", idx), got
    # A second one gets another slice of the same type; four fit, a fifth waits.
    more = [jobs.sbatch("--gres=gpu:a100_1g_5gb:1", script="sleep 60") for _ in range(4)]
    for j in more[:3]:
        jobs.wait_state(j, {"RUNNING"}, timeout=60)
    idxs = {idx, *(_job_gres(env, j)[0][2] for j in more[:3])}
    assert len(idxs) == 4, idxs
    jobs.wait_state(more[3], {"PENDING"}, timeout=10)
    assert jobs.field(more[3], "Reason") in {"Resources", "Priority"}


def test_a_whole_a100_no_longer_exists(tb: Testbed) -> None:
    # Every A100 of the site is split: a job for a whole one cannot be placed anywhere.
    res = run_command(["sbatch", "-o", "/dev/null", "--gres=gpu:a100:1", "--wrap", "true"],
                      timeout=30, env=tb.env(), check=False)
    assert res.returncode != 0, res.stdout
    assert "Requested node configuration is not available" in res.stderr
