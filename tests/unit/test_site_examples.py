"""Every shipped example in site-configs/ loads and renders, in both modes, so none rots."""

from __future__ import annotations

import re
from pathlib import Path

import hostlist
import pytest

from hetslurm.site import load_site
from hetslurm.site.render import FRAGMENT_FILES, Runtime, device_files, render

# simulate-params*.toml are the simulator's assumptions, not sites; tests/unit/
# test_simulate_policies.py loads them. validate-params.toml and validate-workload*.toml are
# those of `simulate --validate` (tests/unit/test_simulate_validate.py loads them).
EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "site-configs").glob("*.toml")
                  if not p.name.startswith(("simulate-params", "validate-params",
                                            "validate-workload")))


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"demo.toml", "case-study.toml"} <= names


@pytest.fixture(params=EXAMPLES, ids=[p.name for p in EXAMPLES])
def example(request: pytest.FixtureRequest) -> Path:
    return request.param


def _node_names(conf: str) -> set[str]:
    names: set[str] = set()
    for m in re.finditer(r"^NodeName=(\S+)", conf, re.M):
        names.update(hostlist.expand_hostlist(m.group(1)))
    return names


def test_example_loads(example: Path) -> None:
    site = load_site(example)
    assert site.nodes
    assert site.path == str(example)


def test_example_renders_fragments(example: Path) -> None:
    site = load_site(example)
    files = render(site)
    assert set(FRAGMENT_FILES) <= set(files)
    assert ("topology.conf" in files) == bool(site.switches)
    assert _node_names(files["hetslurm-nodes.conf"]) == {n.name for n in site.nodes}
    gres_lines = [ln for ln in files["gres.conf"].splitlines() if ln.startswith("NodeName=")]
    # Fragment gres.conf groups identical nodes: count device lines per node.
    per_node = {n.name: 0 for n in site.nodes}
    for line in gres_lines:
        for name in _node_names(line):
            per_node[name] += 1
    assert per_node == {n.name: len(n.gpus) + len(n.fpgas) for n in site.nodes}
    parts = files["hetslurm-partitions.conf"]
    assert re.findall(r"^PartitionName=(\S+)", parts, re.M) == [*site.partitions, *site.ranked]


def test_example_renders_whole(example: Path, tmp_path: Path) -> None:
    site = load_site(example)
    rt = Runtime(state_dir=str(tmp_path), slurmctld_addr="127.0.0.1",
                 node_ports={n.name: 20000 + i for i, n in enumerate(site.nodes)},
                 node_addr="127.0.0.1", device_dir=str(tmp_path / "dev"),
                 munge_socket=str(tmp_path / "munge.sock"), emulate=True, slurm_user="root")
    files = render(site, whole=True, runtime=rt)
    conf = files["slurm.conf"]
    assert not set(FRAGMENT_FILES) & set(files)
    assert f"ClusterName={site.name}\n" in conf
    assert _node_names(conf) == {n.name for n in site.nodes}
    assert conf.count(" Port=") == len(site.nodes)
    for f in device_files(site, rt):
        assert f"NodeName={f.node} " in files["gres.conf"]
        assert f" File={f.path} " in files["gres.conf"]
    # Fragments and whole agree on everything that is not runtime.
    fragments = render(site)
    assert ("topology.conf" in files) == bool(site.switches)
    if site.switches:
        assert files["topology.conf"] == fragments["topology.conf"]
