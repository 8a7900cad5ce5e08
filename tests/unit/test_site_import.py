"""`hetslurm site import` (issue 21): the readers of Slurm's files and of `slurmd -G` and
`nvidia-smi topo -m` output, the site it drafts, the round trip render → import → render, the
live import through the fake backend, and the command's exit codes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import CommandError, CommandFailure, SiteImportError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.levers.site_import import from_backend
from hetslurm.site import Site, importer, load_site
from hetslurm.site.render import Runtime, render, write_rendered
from hetslurm.slurm import parse
from hetslurm.slurm.backend import NodeInfo, PartitionInfo, SwitchInfo

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
CASE_STUDY = ROOT / "site-configs" / "case-study.toml"
DATA = ROOT / "tests" / "data" / "slurm"

# What `slurmd -G` prints on a 4-GPU node (Slurm 22.05-24.11 format: one line per device,
# with the prefixes seen in the wild: "slurmd: ", a timestamp, "slurmd-<host>: ").
SLURMD_G = (ROOT / "tests" / "data" / "site_import" / "slurmd_G_h100x4.txt").read_text()

# `nvidia-smi topo -m` of a 4-GPU node: two NVLink pairs, one per NUMA domain (tabs as
# nvidia-smi writes them, a colour escape around the header).
TOPO = (
    "\x1b[4m\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\tSYS\tNODE\t0-3\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\tSYS\tNODE\t0-3\t0\t\tN/A\n"
    "GPU2\tSYS\tSYS\t X \tNV18\tSYS\t4-7\t1\t\tN/A\n"
    "GPU3\tSYS\tSYS\tNV18\t X \tSYS\t4-7\t1\t\tN/A\n"
    "NIC0\tNODE\tNODE\tSYS\tSYS\t X \n"
    "\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def run(*args: str):  # -> click.testing.Result
    return CliRunner().invoke(cli, list(args))


def rendered(tmp_path: Path, site: Path | Site, *, whole: bool = False,
             runtime: Runtime | None = None, name: str = "conf") -> Path:
    """A conf folder as `site render` writes it; fragments get a slurm.conf that Includes
    them (so Include is exercised too)."""
    s = site if isinstance(site, Site) else load_site(site)
    out = tmp_path / name
    write_rendered(render(s, whole=whole, runtime=runtime), out)
    if not whole:
        (out / "slurm.conf").write_text(
            f"ClusterName={s.name}\n" + "".join(f"Include {f}\n" for f in importer.FRAGMENTS))
    return out


def round_trip(tmp_path: Path, conf: Path, *, whole: bool = False) -> tuple[Path, Path]:
    """Import ``conf`` offline and render the result; (site file, rendered folder)."""
    text = importer.to_toml(importer.draft_site(importer.from_conf(conf)))
    importer.validate(text, "imported")
    site_file = tmp_path / "imported.toml"
    site_file.write_text(text)
    again = rendered(tmp_path, site_file, whole=whole, name="again")
    return site_file, again


# --- slurm.conf ----------------------------------------------------------------------
def test_slurm_conf_defaults_continuations_comments_and_include(tmp_path: Path) -> None:
    (tmp_path / "nodes.conf").write_text(
        "NodeName=DEFAULT Sockets=2 CoresPerSocket=8 ThreadsPerCore=2 RealMemory=64G\n"
        "NodeName=g[01-02] Gres=gpu:a100:4(S:0-1) \\\n"
        "    Feature=gpu,a100,ib Weight=100   # two GPU nodes\n"
        "NodeName=c[1-3] CPUs=32 Weight=1\n")
    (tmp_path / "slurm.conf").write_text(
        "# a site\nClusterName=Mini\nDefMemPerCPU=2000\n"
        "SelectTypeParameters=CR_Core_Memory\n"
        "Include nodes.conf\n"
        "PartitionName=DEFAULT MaxTime=60\n"
        "PartitionName=all Nodes=ALL Default=YES OverSubscribe=NO\n"
        "PartitionName=gpu Nodes=g[01-02] MaxTime=2-00:00:00 DefaultTime=1:00:00\n")
    conf = importer.parse_slurm_conf(tmp_path / "slurm.conf")
    assert [n.name for n in conf.nodes] == ["g01", "g02", "c1", "c2", "c3"]
    g = conf.nodes[0]
    assert (g.sockets, g.cores_per_socket, g.threads_per_core, g.memory_mib) == (2, 8, 2, 65536)
    assert g.gres == {("gpu", "a100"): 4} and g.features == ("gpu", "a100", "ib")
    assert g.weight == 100 and conf.nodes[2].cpus == 32
    assert conf.globals["clustername"] == "Mini" and conf.globals["defmempercpu"] == "2000"
    parts = {p.name: p for p in conf.partitions}
    assert parts["all"].nodes is None and parts["all"].default
    assert parts["all"].max_time == "60" and parts["all"].options == {"OverSubscribe": "NO"}
    assert parts["gpu"].nodes == ("g01", "g02") and parts["gpu"].default_time == "1:00:00"


def test_slurm_conf_bad_line_names_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nNodeName=n[1-2 RealMemory=10\n")
    with pytest.raises(SiteImportError, match=rf"^{conf}:2: NodeName=n\[1-2 is not a valid"):
        importer.parse_slurm_conf(conf)
    conf.write_text("ClusterName=x\n\nNodeName=n1 CPUs=many\n")
    with pytest.raises(SiteImportError, match=rf"^{conf}:3: CPUs=many is not a whole number"):
        importer.parse_slurm_conf(conf)


# --- gres.conf -----------------------------------------------------------------------
def test_gres_conf_ranges_nodenames_and_autodetect(tmp_path: Path) -> None:
    f = tmp_path / "gres.conf"
    f.write_text("AutoDetect=off\n"
                 "NodeName=g[1-2] Name=gpu Type=a100 File=/dev/nvidia[0-1] Cores=0-7\n"
                 "NodeName=g[1-2] Name=gpu Type=a100 File=/dev/nvidia[2-3] Cores=8-15 "
                 "Links=0,0,-1,1\n"
                 "Name=fpga Type=u280 File=/dev/xclmgmt0\n")
    devs = importer.parse_gres_conf(f, ["g1", "g2", "f1"])
    assert [d.file for d in devs["g1"] if d.name == "gpu"] == [
        "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    assert devs["g2"][2].cores == tuple(range(8, 16)) and devs["g2"][2].links == (0, 0, -1, 1)
    # A line without NodeName= applies to every node.
    assert [d.name for d in devs["f1"]] == ["fpga"] and devs["g1"][-1].name == "fpga"


@pytest.mark.parametrize(("line", "why"), [
    ("Name=gpu Typo=a100 File=/dev/nvidia0", "unknown gres.conf key 'Typo'"),
    ("Name=gpu File=/dev/nvidia0 Cores=0-x", "Cores=0-x is not a list of numbers"),
    ("Name=gpu File=/dev/nvidia0 Links=1,a", "Links=1,a is not a list of numbers"),
    ("Type=a100 File=/dev/nvidia0", "needs Name="),
    ("Name=gpu MultipleFiles=/dev/nvidia0,/dev/nvidia-caps/x", "MultipleFiles="),
    ('Name=gpu File="/dev/nvidia0', "cannot split"),
])
def test_bad_gres_conf_names_file_and_line(tmp_path: Path, line: str, why: str) -> None:
    f = tmp_path / "gres.conf"
    f.write_text(f"# comment\nAutoDetect=off\n{line}\n")
    with pytest.raises(SiteImportError) as exc:
        importer.parse_gres_conf(f, ["n1"])
    assert str(exc.value).startswith(f"{f}:3: ") and why in str(exc.value)


# --- slurmd -G ------------------------------------------------------------------------
def test_slurmd_g_output_by_index_with_any_prefix(tmp_path: Path) -> None:
    f = tmp_path / "slurmd-G.txt"
    f.write_text(SLURMD_G)
    devs = importer.parse_gres_output(f)
    assert [d.file for d in devs] == [f"/dev/nvidia{i}" for i in range(4)]
    assert devs[2].cores == (4, 5, 6, 7) and devs[2].links == (0, 0, -1, 18)
    assert {d.type for d in devs} == {"h100"}


def test_slurmd_g_null_fields_and_bad_input(tmp_path: Path) -> None:
    f = tmp_path / "g.txt"
    f.write_text("Gres Name=gpu Type=(null) Count=1 Index=0 File=/dev/nvidia0 Links=(null) "
                 "Flags=HAS_FILE,ENV_NVML\n")
    (d,) = importer.parse_gres_output(f)
    assert d.type is None and d.links is None and d.cores is None
    f.write_text("slurmd: started\n")
    with pytest.raises(SiteImportError, match=r"no 'Gres Name=\.\.\.' line"):
        importer.parse_gres_output(f)
    f.write_text("slurmd: x\nslurmd: Gres Name=gpu Type=a Index=0 Cores=0-? File=/dev/n0\n")
    with pytest.raises(SiteImportError, match=rf"^{f}:2: Cores=0-\? is not"):
        importer.parse_gres_output(f)


# --- nvidia-smi topo -m ----------------------------------------------------------------
def test_topo_matrix_islands_and_numa(tmp_path: Path) -> None:
    f = tmp_path / "topo.txt"
    f.write_text(TOPO)
    m = importer.parse_topo_matrix(f)
    assert m.gpus == 4 and m.islands == ((0, 1), (2, 3)) and m.numa == (0, 0, 1, 1)


def test_topo_matrix_blank_separated_and_one_big_island(tmp_path: Path) -> None:
    rows = ["       GPU0    GPU1    GPU2    CPU Affinity    NUMA Affinity"]
    cells = [["X", "NV12", "SYS"], ["NV12", "X", "NV12"], ["SYS", "NV12", "X"]]
    rows += [f"GPU{i}    " + "    ".join(c) + "    0-7    N/A" for i, c in enumerate(cells)]
    f = tmp_path / "topo.txt"
    f.write_text("\n".join(rows) + "\n")
    m = importer.parse_topo_matrix(f)
    # NV links chain 0-1-2 into one island; NUMA unknown.
    assert m.islands == ((0, 1, 2),) and m.numa == (None, None, None)


@pytest.mark.parametrize(("change", "why"), [
    (("GPU1\tNV18\t X \tSYS", "GPU1\tNV18\t Q \tSYS"), ":3: 'Q' (GPU1 to GPU1)"),
    (("\t1\t\tN/A\nGPU3", "\tzero\t\tN/A\nGPU3"), ":4: NUMA Affinity 'zero'"),
    (("GPU3\tSYS", "GPU7\tSYS"), ":5: expected the row of GPU3"),
])
def test_bad_topo_names_file_and_line(tmp_path: Path, change: tuple[str, str],
                                      why: str) -> None:
    f = tmp_path / "topo.txt"
    assert change[0] in TOPO
    f.write_text(TOPO.replace(change[0], change[1], 1))
    with pytest.raises(SiteImportError) as exc:
        importer.parse_topo_matrix(f)
    assert str(exc.value).startswith(str(f)) and why in str(exc.value)
    f.write_text("nothing here\n")
    with pytest.raises(SiteImportError, match="no header row naming GPU0"):
        importer.parse_topo_matrix(f)


# --- topology.conf ----------------------------------------------------------------------
def test_topology_conf(tmp_path: Path) -> None:
    f = tmp_path / "topology.conf"
    f.write_text("SwitchName=l1 Nodes=g[1-2]\nSwitchName=top Switches=l[1-2] LinkSpeed=5\n")
    sw = importer.parse_topology_conf(f)
    assert sw[0].nodes == ("g1", "g2") and sw[1].switches == ("l1", "l2")
    assert sw[1].link_speed == 5
    f.write_text("SwitchName=l1 Nodes=g1\nSwitchName=l2 Node=g2\n")
    with pytest.raises(SiteImportError, match=rf"^{f}:2: unknown topology.conf key 'Node'"):
        importer.parse_topology_conf(f)


# --- round trips -------------------------------------------------------------------------
@pytest.mark.parametrize("whole", [False, True], ids=["fragments", "whole"])
@pytest.mark.parametrize("site", [DEMO, CASE_STUDY], ids=["demo", "case-study"])
def test_round_trip_render_import_render(tmp_path: Path, site: Path, whole: bool) -> None:
    """render(import(render(site))) configures the same nodes, gres and partitions."""
    conf = rendered(tmp_path, site, whole=whole)
    site_file, again = round_trip(tmp_path, conf, whole=whole)
    before, after = importer.conf_view(conf), importer.conf_view(again)
    assert before["nodes"] and before["gres"] and before["partitions"]
    assert importer.view_differences(before, after) == []
    # The import keeps what Slurm's files say about the classes.
    imported = load_site(site_file)
    original = load_site(site)
    assert {n.name: n.weight for n in imported.nodes} == {
        n.name: n.weight for n in original.nodes}
    assert imported.switches.keys() == original.switches.keys()


def test_round_trip_of_the_testbeds_own_files(tmp_path: Path) -> None:
    """The testbed renders ports, addresses and per-node emulated device files; those are
    runtime parts. Nodes differing only in device files stay one class, with a guess."""
    site = load_site(DEMO)
    rt = Runtime(state_dir=str(tmp_path), node_addr="127.0.0.1", emulate=True,
                 node_ports={n.name: 7000 + i for i, n in enumerate(site.nodes)},
                 device_dir=str(tmp_path / "dev"), slurmdbd_host="127.0.0.1")
    conf = rendered(tmp_path, site, whole=True, runtime=rt)
    site_file, again = round_trip(tmp_path, conf, whole=True)
    assert importer.view_differences(importer.conf_view(conf, files=False),
                                     importer.conf_view(again, files=False)) == []
    # With files compared, only the emulated paths of the multi-node classes differ.
    diff = importer.view_differences(importer.conf_view(conf), importer.conf_view(again))
    assert diff and all(d.startswith("gres gpu") for d in diff)
    text = site_file.read_text()
    assert "# guessed: device files differ between the nodes of this class" in text
    assert set(tomllib.loads(text)["node_classes"]) == {"h100x8", "a100x8", "u280x2", "cpu8"}


def test_guesses_are_commented_where_they_were_made(tmp_path: Path) -> None:
    conf = rendered(tmp_path, DEMO)
    # Without Links= the islands are unknown; without Cores= the NUMA domains too.
    gres = (conf / "gres.conf").read_text()
    (conf / "gres.conf").write_text("\n".join(
        " ".join(w for w in ln.split() if not w.startswith(("Links=", "Cores=")))
        for ln in gres.splitlines()) + "\n")
    text = importer.to_toml(importer.draft_site(importer.from_conf(conf)))
    importer.validate(text, "x")
    doc = tomllib.loads(text)
    assert "nvlink_islands" not in doc["node_classes"]["h100x8"]["gpus"]
    assert "# guessed: NVLink islands unknown" in text
    assert "# guessed: NUMA placement unknown" in text
    assert "# guessed: power figures are not in Slurm's configuration" in text


def test_topo_gives_islands_and_numa(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=t\nNodeName=g[1-2] Sockets=2 CoresPerSocket=4 RealMemory=1000 "
        "Gres=gpu:h100:4 Weight=100\nPartitionName=p Nodes=ALL Default=YES\n")
    (tmp_path / "topo.txt").write_text(TOPO)
    cluster = importer.from_conf(tmp_path)
    topo = [("h100", importer.parse_topo_matrix(tmp_path / "topo.txt"))]
    data = importer.site_data(importer.draft_site(cluster, topo))
    gpus = data["node_classes"]["h100x4"]["gpus"]
    # Two islands on two sockets: island k on domain k is the default, so no numa key.
    assert gpus["nvlink_islands"] == [[0, 1], [2, 3]] and "numa" not in gpus
    bad = [("h100", importer.TopoMatrix(8, (), (None,) * 8, "t8.txt"))]
    with pytest.raises(SiteImportError, match=r"t8\.txt: the matrix has 8 GPUs, node g1 has 4"):
        importer.draft_site(cluster, bad)


def test_slurmd_g_output_selects_nodes_by_devices(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(
        "ClusterName=t\nNodeName=g1 Sockets=2 CoresPerSocket=4 RealMemory=1000 "
        "Gres=gpu:h100:4\nNodeName=c1 CPUs=8 RealMemory=1000\n")
    (tmp_path / "g.txt").write_text(SLURMD_G)
    cluster = importer.from_conf(tmp_path, gres_outputs=[(None, tmp_path / "g.txt")])
    assert set(cluster.devices) == {"g1"}
    data = importer.site_data(importer.draft_site(cluster))
    assert data["node_classes"]["h100x4"]["gpus"]["nvlink_islands"] == [[0, 1], [2, 3]]
    # A CPU-only node given by CPUs= alone: its layout is a guess.
    assert data["node_classes"]["cpu8"]["sockets"] == 1
    with pytest.raises(SiteImportError, match="node 'x9' is not a node of the cluster"):
        importer.from_conf(tmp_path, gres_outputs=[("x9", tmp_path / "g.txt")])


def test_a_node_with_two_gpu_models_cannot_be_a_site(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text(
        "NodeName=g1 CPUs=8 RealMemory=1000 Gres=gpu:a100:2,gpu:h100:2\n")
    with pytest.raises(SiteImportError, match=r"slurm.conf:1: node g1 has two gpu types"):
        importer.draft_site(importer.from_conf(tmp_path))


# --- live, through the access layer -----------------------------------------------------
def fake_from_site(site: Site) -> FakeSlurm:
    nodes = [NodeInfo(
        n.name, frozenset({"IDLE"}), features=n.features, weight=n.weight,
        cpus_total=n.cpus, memory_total_mib=n.spec.memory,
        gres_total={**({("gpu", n.gpus[0].model): len(n.gpus)} if n.gpus else {}),
                    **({("fpga", n.fpgas[0].model): len(n.fpgas)} if n.fpgas else {})},
        sockets=n.spec.sockets, cores_per_socket=n.spec.cores_per_socket,
        threads_per_core=n.spec.threads_per_core) for n in site.nodes]
    # scontrol prints Nodes=ALL as slurm.conf says it.
    parts = [PartitionInfo(p.name, ("ALL",) if p.spec.nodes == "ALL" else p.nodes,
                           default=p.spec.default, max_time=86400)
             for p in site.partitions.values()]
    switches = [SwitchInfo(name, tuple(n.name for n in site.nodes if n.leaf_switch == name),
                           sw.switches) for name, sw in site.switches.items()]
    return FakeSlurm(nodes=nodes, partitions=parts, topology=switches,
                     config={"ClusterName": site.name, "DefMemPerCPU": "1024"})


LIVE_PARTITION_KEYS = ("nodes", "default", "maxtime", "defaulttime")


def test_live_import_through_the_fake_backend(tmp_path: Path) -> None:
    site = load_site(DEMO)
    conf = rendered(tmp_path, site)
    cluster = from_backend(fake_from_site(site), gres_conf=conf / "gres.conf")
    text = importer.to_toml(importer.draft_site(cluster))
    importer.validate(text, "live")
    (tmp_path / "live.toml").write_text(text)
    again = rendered(tmp_path, tmp_path / "live.toml", name="again")
    # Live partitions carry no options (TRESBillingWeights comes from [levers]).
    a = importer.conf_view(conf, partition_keys=LIVE_PARTITION_KEYS)
    b = importer.conf_view(again, partition_keys=LIVE_PARTITION_KEYS)
    assert importer.view_differences(a, b) == []
    imported = load_site(tmp_path / "live.toml")
    assert imported.partitions["batch"].spec.nodes == "ALL"
    assert imported.switches.keys() == {"leaf1", "leaf2", "spine"}


def test_live_import_without_a_switch_tree(tmp_path: Path) -> None:
    site = load_site(DEMO)

    class NoTopology(FakeSlurm):
        def topology(self) -> list[SwitchInfo]:
            raise CommandError("scontrol show topology failed",
                               CommandFailure(("scontrol",), 1, "no topology"))

    fake = fake_from_site(site)
    bare = NoTopology(nodes=fake.nodes(), partitions=fake.partitions())
    draft = importer.draft_site(from_backend(bare))
    text = importer.to_toml(draft)
    importer.validate(text, "live")
    assert "\n[switches." not in text and "# guessed: the switch tree could not be read" in text
    # No configuration either: the name is a guess, every GPU node keeps its weight band.
    assert tomllib.loads(text)["name"] == "imported"


def test_node_layout_is_read_from_slurms_output() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo_json((DATA / "sinfo.json").read_text())}
    assert (nodes["cpu1"].sockets, nodes["cpu1"].cores_per_socket,
            nodes["cpu1"].threads_per_core) == (1, 4, 1)
    text = (DATA / "scontrol_show_node_d_o.txt").read_text()
    first = parse.parse_scontrol_nodes(text)[0]
    assert (first.sockets, first.cores_per_socket, first.threads_per_core) == (1, 4, 1)
    v42 = parse.parse_sinfo_json((DATA / "24.11" / "scontrol-show-node.json").read_text())
    assert any(n.sockets == 2 and n.cores_per_socket == 4 for n in v42)


def test_scontrol_show_topology() -> None:
    # As 22.05 prints it (tried on the testbed): the spine repeats its subtree's nodes.
    text = ("SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[1-4]\n"
            "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=cpu[1-4],fpga1\n"
            "SwitchName=spine Level=1 LinkSpeed=1 Nodes=cpu[1-4],fpga1,gpu[1-4] "
            "Switches=leaf1,leaf2\n")
    sw = parse.parse_scontrol_topology(text)
    assert sw[0] == SwitchInfo("leaf1", ("gpu1", "gpu2", "gpu3", "gpu4"), (), 1)
    assert sw[2] == SwitchInfo("spine", (), ("leaf1", "leaf2"), 1)
    assert parse.parse_scontrol_topology("No topology information available\n") == []


# --- the command --------------------------------------------------------------------------
def test_cli_from_conf_to_stdout_and_to_a_file(tmp_path: Path) -> None:
    conf = rendered(tmp_path, DEMO, whole=True)
    res = run("site", "import", "--from-conf", str(conf))
    assert res.exit_code == 0, res.output
    assert tomllib.loads(res.stdout)["name"] == "hetdemo"
    assert "guessed" in res.stderr
    out = tmp_path / "sub" / "site.toml"
    res = run("site", "import", "--from-conf", str(conf), "--out", str(out), "--name", "copy")
    assert res.exit_code == 0, res.output
    assert res.stdout == "" and load_site(out).name == "copy"
    assert run("site", "check", str(out)).exit_code == 0
    res = run("site", "import", "--from-conf", str(conf), "--site-format", "json")
    doc = json.loads(res.stdout)
    assert doc["site"]["nodes"]["gpu[1-2]"] == "h100x8"
    assert any(g["key"].startswith("node_classes.") for g in doc["guessed"])


def test_cli_bad_gres_conf_is_one_line_exit_2_and_nothing_written(tmp_path: Path) -> None:
    conf = rendered(tmp_path, DEMO, whole=True)
    bad = tmp_path / "bad-gres.conf"
    bad.write_text("AutoDetect=off\nNodeName=gpu1 Name=gpu Type=h100 File=/dev/nvidia0 "
                   "Cores=zero\n")
    out = tmp_path / "site.toml"
    res = run("site", "import", "--from-conf", str(conf), "--gres-conf", str(bad),
              "--out", str(out))
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"hetslurm: error: {bad}:2: Cores=zero is not a list of numbers and ranges"]
    assert not out.exists() and "Traceback" not in res.output


def test_cli_invalid_site_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "slurm.conf").write_text("NodeName=n1 CPUs=4\n")
    res = run("site", "import", "--from-conf", str(tmp_path), "--out", str(tmp_path / "s.toml"))
    assert res.exit_code == 2 and "has no RealMemory" in res.stderr
    assert not (tmp_path / "s.toml").exists()
    # Count mismatch between gres.conf and Gres=.
    (tmp_path / "slurm.conf").write_text("NodeName=n1 CPUs=4 RealMemory=100 Gres=gpu:a100:2\n")
    (tmp_path / "gres.conf").write_text("Name=gpu Type=a100 File=/dev/nvidia0\n")
    res = run("site", "import", "--from-conf", str(tmp_path))
    assert res.exit_code == 2
    assert "gres.conf:1: names 1 gpu devices for n1, whose Gres= has 2" in res.stderr
    res = run("site", "import", "--from-conf", str(tmp_path / "missing"))
    assert res.exit_code == 2 and "not a folder" in res.stderr


def test_cli_live_uses_the_backend_and_topo(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    site = load_site(DEMO)
    monkeypatch.setattr("hetslurm.slurm.get_backend", lambda *a, **k: fake_from_site(site))
    topo = tmp_path / "topo8.txt"
    head = "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = []
    for i in range(8):
        cells = ["X" if j == i else ("NV4" if j // 2 == i // 2 else "SYS") for j in range(8)]
        rows.append(f"GPU{i}\t" + "\t".join(cells) + f"\t0-7\t{(i // 2) % 2}\n")
    topo.write_text(head + "".join(rows))
    res = run("site", "import", "--topo", f"h100={topo}")
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(res.stdout)
    assert doc["node_classes"]["h100x8"]["gpus"]["nvlink_islands"] == [
        [0, 1], [2, 3], [4, 5], [6, 7]]
    # Islands no longer coincide with NUMA domains, so the domains are written.
    assert doc["node_classes"]["h100x8"]["gpus"]["numa"] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert "# guessed: NVLink islands unknown" in res.stdout  # the A100s had no --topo
    res = run("site", "import", "--topo", str(tmp_path / "none.txt"))
    assert res.exit_code == 2 and "none.txt" in res.stderr
