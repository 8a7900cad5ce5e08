"""`hetslurm site import` on the running testbed (issue 21, round trip): import → render → the
nodes, gres and partitions equal the testbed's own slurm.conf and gres.conf, up to order and
formatting (hetslurm.site.importer.conf_view normalises both sides).

Left out of the comparison, as runtime parts of the testbed's render: NodeAddr, Port and
State of nodes (every node has its own slurmd port) and the emulated device files
(``<testbed>/dev/<node>/nvidia<i>``, one set per node); see docs/site-config.md.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from _cluster_helpers import release_under_test
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.site import importer, load_site
from hetslurm.site.render import render, write_rendered
from hetslurm.testbed import Testbed

#: What a live import can know of a partition: Slurm's commands print no TRESBillingWeights
#: hetslurm set from [levers] (the imported site has none), and the testbed's other
#: partition keys are all rendered from these.
LIVE_PARTITION_KEYS = ("nodes", "default", "maxtime", "defaulttime")


def _import(args: list[str], cli_env: dict[str, str], out: Path) -> str:
    res = CliRunner().invoke(cli, ["site", "import", *args, "--out", str(out)], env=cli_env)
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert load_site(out).nodes  # what `site check` reads
    return text


def _render_whole(site_file: Path, out: Path) -> Path:
    write_rendered(render(load_site(site_file), whole=True), out)
    return out


#: The backends a live import goes through on this release (REST where slurmrestd serves
#: the API the REST backend speaks: 24.11 and 26.05).
BACKENDS = ["cli", "rest"] if release_under_test().rest_api else ["cli"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_live_import_renders_the_testbeds_nodes_gres_and_partitions(
        testbed: Testbed, cli_env: dict[str, str], tmp_path: Path, backend: str) -> None:
    site_file = tmp_path / "live.toml"
    env = {**cli_env, **testbed.rest_env(lifespan_s=600)} if backend == "rest" else cli_env
    text = _import(["--backend", backend, "--gres-conf", str(testbed.etc / "gres.conf")],
                   env, site_file)
    again = _render_whole(site_file, tmp_path / "again")
    want = importer.conf_view(testbed.etc, files=False, partition_keys=LIVE_PARTITION_KEYS)
    got = importer.conf_view(again, files=False, partition_keys=LIVE_PARTITION_KEYS)
    assert importer.view_differences(want, got) == []
    doc = tomllib.loads(text)
    # The switch tree came through `scontrol show topology`.
    assert set(doc.get("switches", {})) == {"leaf1", "leaf2", "spine"}
    assert doc["name"] == "hetdemo"


def test_offline_import_of_the_testbeds_conf_dir(
        testbed: Testbed, cli_env: dict[str, str], tmp_path: Path) -> None:
    site_file = tmp_path / "offline.toml"
    _import(["--from-conf", str(testbed.etc)], cli_env, site_file)
    again = _render_whole(site_file, tmp_path / "again")
    want = importer.conf_view(testbed.etc, files=False)
    got = importer.conf_view(again, files=False)
    assert importer.view_differences(want, got) == []
    # The topology.conf Slurm runs with comes back switch for switch.
    assert (again / "topology.conf").exists()
    assert [ln for ln in (testbed.etc / "topology.conf").read_text().splitlines()
            if ln.startswith("SwitchName")] == [
        ln for ln in (again / "topology.conf").read_text().splitlines()
        if ln.startswith("SwitchName")]
