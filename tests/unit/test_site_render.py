"""Rendering a site into Slurm's files: golden files, determinism and the device details.

Golden files live in ``tests/data/golden/demo/{fragments,whole}/``, one per rendered file.
After an intended change to the renderer (or to ``site-configs/demo.toml``), regenerate
them and review the diff before committing::

    HETSLURM_REGEN_GOLDEN=1 python -m pytest tests/unit/test_site_render.py
    git diff tests/data/golden/
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.site import Site, load_site, parse_site
from hetslurm.site.render import (
    FRAGMENT_FILES,
    NVIDIA_MAJOR,
    Runtime,
    accounting_tres,
    device_files,
    render,
    write_rendered,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
CASE_STUDY = ROOT / "site-configs" / "case-study.toml"
GOLDEN = ROOT / "tests" / "data" / "golden" / "demo"
REGEN = os.environ.get("HETSLURM_REGEN_GOLDEN") == "1"


def whole_runtime(site: Site, *, node_ports: dict[str, int] | None = None) -> Runtime:
    """The fixed runtime the whole-mode golden files are rendered with."""
    ports = node_ports or {n.name: 17001 + i for i, n in enumerate(site.nodes)}
    return Runtime(state_dir="/st", node_ports=ports, node_addr="127.0.0.1",
                   device_dir="/dev-emu", munge_socket="/st/munge.sock",
                   slurmdbd_host="127.0.0.1", emulate=True, slurm_user="root")


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(DEMO)


def _rendered(site: Site, mode: str) -> dict[str, str]:
    if mode == "whole":
        return render(site, whole=True, runtime=whole_runtime(site))
    return render(site)


def _gres_lines(text: str, node: str) -> list[dict[str, str]]:
    """gres.conf lines of ``node`` (written per node, as whole mode does) as key → value."""
    out = []
    for line in text.splitlines():
        if line.startswith(f"NodeName={node} "):
            out.append(dict(kv.split("=", 1) for kv in line.split()))
    return out


# --- golden files ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fragments", "whole"])
def test_demo_matches_golden_files(demo: Site, mode: str) -> None:
    files = _rendered(demo, mode)
    folder = GOLDEN / mode
    if REGEN:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():
            if stale.name not in files:
                stale.unlink()
        for name, content in files.items():
            (folder / name).write_text(content, encoding="utf-8")
    assert folder.is_dir(), f"no golden files in {folder}; run with HETSLURM_REGEN_GOLDEN=1"
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name, content in files.items():
        expected = (folder / name).read_text(encoding="utf-8")
        assert content == expected, (
            f"{mode}/{name} differs from its golden file; if the change is intended, "
            "regenerate with HETSLURM_REGEN_GOLDEN=1 and review the diff")


def test_fragment_and_whole_file_sets(demo: Site) -> None:
    assert set(render(demo)) == {*FRAGMENT_FILES, "gres.conf", "topology.conf"}
    assert set(_rendered(demo, "whole")) == {"slurm.conf", "gres.conf", "topology.conf"}
    no_switches = parse_site(DEMO.read_text().split("# Two leaves")[0]
                             + "[classes" + DEMO.read_text().split("[classes", 1)[1])
    assert "topology.conf" not in render(no_switches)
    assert "TopologyPlugin" not in render(no_switches)["hetslurm-globals.conf"]


# --- determinism ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fragments", "whole"])
def test_rendering_twice_gives_the_same_bytes(demo: Site, mode: str) -> None:
    assert _rendered(demo, mode) == _rendered(load_site(DEMO), mode)


def _reorder_demo(text: str) -> str:
    """The demo with keys inside tables and node class tables in another order."""
    # Keys inside every node class table.
    text = text.replace('sockets = 2\ncores_per_socket = 4\nmemory = "16G"\n',
                        'memory = "16G"\ncores_per_socket = 4\nsockets = 2\n')
    text = text.replace('model = "h100"\ncount = 8\n', 'count = 8\nmodel = "h100"\n')
    text = text.replace('[partitions.batch]\nnodes = "ALL"\ndefault = true\n',
                        '[partitions.batch]\ndefault = true\nnodes = "ALL"\n')
    text = text.replace('gpu_model_order = ["h100", "a100"]\nfpga_model_order = ["u280"]\n',
                        'fpga_model_order = ["u280"]\ngpu_model_order = ["h100", "a100"]\n')
    # Move the CPU class's tables in front of the H100 class's.
    cpu = text[text.index("[node_classes.cpu8]"):text.index("[nodes]")]
    text = text.replace(cpu, "")
    return text.replace("[node_classes.h100x8]\n", cpu + "[node_classes.h100x8]\n", 1)


@pytest.mark.parametrize("mode", ["fragments", "whole"])
def test_key_and_table_order_do_not_matter(demo: Site, mode: str) -> None:
    text = DEMO.read_text()
    shuffled = _reorder_demo(text)
    assert shuffled != text
    assert next(iter(parse_site(shuffled).node_classes)) == "cpu8"
    other = parse_site(shuffled, str(DEMO))
    if mode == "whole":
        ports = {n.name: 17001 + i for i, n in enumerate(demo.nodes)}
        reversed_ports = dict(reversed(list(ports.items())))
        assert (render(demo, whole=True, runtime=whole_runtime(demo, node_ports=ports))
                == render(other, whole=True,
                          runtime=whole_runtime(other, node_ports=reversed_ports)))
    else:
        assert render(demo) == render(other)


def test_partition_option_order_does_not_matter() -> None:
    text = CASE_STUDY.read_text()
    swapped = text.replace('PriorityTier = "10"\nMaxNodes = "2"\n',
                           'MaxNodes = "2"\nPriorityTier = "10"\n')
    assert swapped != text
    assert render(parse_site(text)) == render(parse_site(swapped))


# --- gres.conf ------------------------------------------------------------------------


def test_gres_cores_and_links_follow_islands(demo: Site) -> None:
    gres = _rendered(demo, "whole")["gres.conf"]
    lines = _gres_lines(gres, "gpu1")
    assert [entry["Type"] for entry in lines] == ["h100"] * 8
    assert [entry["Cores"] for entry in lines] == ["0-3"] * 4 + ["4-7"] * 4
    assert lines[0]["Links"] == "-1,1,1,1,0,0,0,0"
    assert lines[5]["Links"] == "0,0,0,0,1,-1,1,1"
    fpga = _gres_lines(gres, "fpga1")
    assert [e["Cores"] for e in fpga] == ["0-3", "4-7"]
    assert all("Links" not in e for e in fpga)  # FPGAs have no NVLink


def test_gres_non_contiguous_islands() -> None:
    text = DEMO.read_text().replace("nvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]",
                                    "nvlink_islands = [[0, 2, 4, 6], [1, 3, 5, 7]]", 1)
    site = parse_site(text)
    lines = _gres_lines(render(site, whole=True, runtime=whole_runtime(site))["gres.conf"],
                        "gpu1")
    assert [e["Cores"] for e in lines] == ["0-3", "4-7"] * 4
    assert lines[0]["Links"] == "-1,0,1,0,1,0,1,0"
    assert lines[1]["Links"] == "0,-1,0,1,0,1,0,1"
    # The A100 class keeps its contiguous islands.
    assert _gres_lines(render(site, whole=True, runtime=whole_runtime(site))["gres.conf"],
                       "gpu3")[1]["Links"] == "1,-1,1,1,0,0,0,0"


def test_gres_pcie_gpus_have_no_links_to_each_other() -> None:
    site = load_site(CASE_STUDY)
    gres = render(site)["gres.conf"]
    k80 = [line for line in gres.splitlines() if "Type=k80" in line]
    assert len(k80) == 4
    for i, line in enumerate(k80):
        links = re.search(r"Links=(\S+)", line)
        assert links is not None
        assert links.group(1).split(",") == ["-1" if j == i else "0" for j in range(4)]


def test_fragment_gres_groups_identical_nodes(demo: Site) -> None:
    gres = render(demo)["gres.conf"]
    assert gres.count("NodeName=gpu[1-2] Name=gpu Type=h100") == 8
    assert "File=/dev/nvidia7" in gres
    assert "NodeName=fpga1 Name=fpga Type=u280 File=/dev/xclmgmt1 Cores=4-7" in gres


# --- device files ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [DEMO, CASE_STUDY], ids=["demo", "case-study"])
def test_emulated_device_minors(path: Path) -> None:
    site = load_site(path)
    rt = whole_runtime(site)
    files = device_files(site, rt)
    assert len(files) == sum(len(n.gpus) + len(n.fpgas) for n in site.nodes)
    by_node: dict[tuple[str, str], list[int]] = {}
    for f in files:
        assert f.minor is not None and f.major is not None
        assert f.minor != f.index, f
        assert f.path.startswith(f"/dev-emu/{f.node}/")
        if f.kind == "gpu":
            assert f.major == NVIDIA_MAJOR
        by_node.setdefault((f.node, f.kind), []).append(f.minor)
    for minors in by_node.values():
        assert len(set(minors)) == len(minors)
    # gres.conf names the same files in Slurm index order.
    gres = render(site, whole=True, runtime=rt)["gres.conf"]
    for node in {f.node for f in files}:
        rendered = [e["File"] for e in _gres_lines(gres, node)]
        assert rendered == [f.path for f in files if f.node == node]


def test_real_device_files(demo: Site) -> None:
    files = device_files(demo)
    gpu1 = [f for f in files if f.node == "gpu1"]
    assert [f.path for f in gpu1] == [f"/dev/nvidia{i}" for i in range(8)]
    assert all(f.minor is None for f in files)


def test_explicit_device_files() -> None:
    text = DEMO.read_text().replace('model = "u280"\n',
                                    'model = "u280"\nfiles = "/dev/xclmgmt[16,32]"\n')
    site = parse_site(text)
    assert [f.path for f in device_files(site) if f.node == "fpga1"] == [
        "/dev/xclmgmt16", "/dev/xclmgmt32"]
    assert "File=/dev/xclmgmt32 Cores=4-7" in render(site)["gres.conf"]


# --- global keys ----------------------------------------------------------------------


@pytest.mark.parametrize("path", [DEMO, CASE_STUDY], ids=["demo", "case-study"])
def test_accounting_tres_lists_every_typed_model(path: Path) -> None:
    site = load_site(path)
    globals_conf = render(site)["hetslurm-globals.conf"]
    m = re.search(r"^AccountingStorageTRES=(\S+)$", globals_conf, re.M)
    assert m is not None
    tres = m.group(1).split(",")
    models = {n.gpus[0].model for n in site.nodes if n.gpus}
    fpgas = {n.fpgas[0].model for n in site.nodes if n.fpgas}
    assert set(tres) == ({"gres/gpu", "gres/fpga"} | {f"gres/gpu:{x}" for x in models}
                         | {f"gres/fpga:{x}" for x in fpgas})
    assert len(tres) == len(set(tres))
    assert m.group(1) == accounting_tres(site)
    whole = render(site, whole=True, runtime=whole_runtime(site))["slurm.conf"]
    assert f"AccountingStorageTRES={m.group(1)}\n" in whole


def test_whole_without_slurmdbd_omits_gres_tres(demo: Site) -> None:
    # slurmctld 22.05 exits at start ("slurmdbd is required to run with TRES gres/gpu").
    rt = Runtime(state_dir="/st", emulate=True)
    conf = render(demo, whole=True, runtime=rt)["slurm.conf"]
    assert "AccountingStorageTRES" not in conf
    assert "AccountingStorageType" not in conf
    assert "GresTypes=gpu,fpga" in conf


def test_node_lines_carry_gres_features_weight(demo: Site) -> None:
    nodes = render(demo)["hetslurm-nodes.conf"]
    assert ("NodeName=gpu[1-2] CPUs=8 Boards=1 SocketsPerBoard=2 CoresPerSocket=4 "
            "ThreadsPerCore=1 RealMemory=16384 Gres=gpu:h100:8 Feature=gpu,h100,nvlink "
            "Weight=100 State=UNKNOWN") in nodes
    assert "NodeName=cpu[1-4] " in nodes and "Feature=cpu Weight=1 " in nodes


# --- writing --------------------------------------------------------------------------


def test_write_rendered_is_complete_and_readable(tmp_path: Path, demo: Site) -> None:
    files = render(demo)
    written = write_rendered(files, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(files)
    assert [p.name for p in written] == sorted(files)
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644
        assert p.read_text() == files[p.name]


@pytest.mark.parametrize("whole", [False, True])
def test_nothing_is_written_when_validation_fails(tmp_path: Path, whole: bool) -> None:
    site = tmp_path / "bad.toml"
    site.write_text(DEMO.read_text().replace('name = "hetdemo"', 'name = "HetDemo"'))
    out = tmp_path / "out"
    args = ["site", "render", str(site), "--out", str(out)] + (["--whole"] if whole else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "key 'name'" in result.stderr
    assert not out.exists()
    out.mkdir()
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert list(out.iterdir()) == []


def test_cli_render_writes_what_render_returns(tmp_path: Path, demo: Site) -> None:
    out = tmp_path / "conf"
    result = CliRunner().invoke(cli, ["site", "render", str(DEMO), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(out / n) for n in sorted(render(demo))]
    assert "Include" in result.stderr
    for name, content in render(demo).items():
        assert (out / name).read_text() == content


def test_accounting_section_sets_what_slurm_measures() -> None:
    base = DEMO.read_text()
    default = render(load_site(DEMO), whole=True, runtime=whole_runtime(load_site(DEMO)))
    conf = default["slurm.conf"]
    assert "JobAcctGatherType=jobacct_gather/linux" in conf
    assert "JobAcctGatherFrequency=task=30" in conf and "AccountingStoreFlags=job_script" in conf
    off = parse_site(base + '\n[accounting]\ngather = "none"\nstore_job_script = false\n')
    conf = render(off, whole=True, runtime=whole_runtime(off))["slurm.conf"]
    assert "JobAcctGatherType=jobacct_gather/none" in conf
    assert "JobAcctGatherFrequency" not in conf and "AccountingStoreFlags" not in conf
    # No slurmdbd, no stored scripts: the flag is slurmdbd's.
    no_dbd = render(load_site(DEMO), whole=True, runtime=Runtime(state_dir="/st"))["slurm.conf"]
    assert "AccountingStoreFlags" not in no_dbd and "jobacct_gather/linux" in no_dbd
    with pytest.raises(Exception, match="gather"):
        parse_site(base + '\n[accounting]\ngather = "cgroup"\n')
