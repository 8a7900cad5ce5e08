"""The site file's schema and cross-checks: every error path, and what a valid file resolves to.

Every error test edits one valid site (``BASE``) in one place and asserts the one-line
message names the file, the dotted key and the line. Expected lines are computed from the
edited text (the line holding ``needle``), never written down by hand.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pydantic
import pytest

from hetslurm.errors import ConfigError
from hetslurm.site import load_site, names, parse_site
from hetslurm.site.schema import SECTIONS, register_section

BASE = """\
schema_version = 1
name = "mini"

[scheduling]
gpu_model_order = ["h100", "a100"]

[node_classes.h100x8]
sockets = 2
cores_per_socket = 4
memory = "16G"
features = ["nvlink"]

[node_classes.h100x8.gpus]
model = "h100"
count = 8
nvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]

[node_classes.a100x4]
sockets = 2
cores_per_socket = 4
memory = "16G"

[node_classes.a100x4.gpus]
model = "a100"
count = 4

[node_classes.u280x2]
cores_per_socket = 8
memory = "16G"

[node_classes.u280x2.fpgas]
model = "u280"
count = 2

[node_classes.cpu8]
sockets = 2
cores_per_socket = 4
memory = 16384

[nodes]
"gpu[1-2]" = "h100x8"
"gpu3" = "a100x4"
"fpga1" = "u280x2"
"cpu[1-4]" = "cpu8"

[partitions.batch]
nodes = "ALL"
default = true
max_time = "1-00:00:00"

[partitions.gpu]
nodes = "gpu[1-3]"

[switches.leaf1]
nodes = "gpu[1-3],fpga1"

[switches.leaf2]
nodes = "cpu[1-4]"

[switches.spine]
switches = ["leaf1", "leaf2"]

[classes.train]
devices = ["h100", "a100"]
partition = "gpu"
"""


def edit(text: str, old: str, new: str) -> str:
    """Replace the one occurrence of ``old`` (so a test cannot silently edit the wrong spot)."""
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
    return text.replace(old, new)


def line_of(text: str, needle: str) -> int:
    """1-based line of the one line that contains ``needle``."""
    hits = [i for i, line in enumerate(text.splitlines(), start=1) if needle in line]
    assert len(hits) == 1, f"{needle!r} is on lines {hits}"
    return hits[0]


def load_error(tmp_path: Path, text: str) -> tuple[ConfigError, Path]:
    path = tmp_path / "site.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_site(path)
    return info.value, path


def check_error(tmp_path: Path, text: str, key: str | None, needle: str, match: str) -> str:
    """Assert the error names file, key and the line of ``needle``; return the message."""
    err, path = load_error(tmp_path, text)
    msg = str(err)
    line = line_of(text, needle)
    assert "\n" not in msg
    assert err.file == str(path)
    assert err.key == key
    assert err.line == line
    where = f"{path}:{line}: key '{key}': " if key else f"{path}:{line}: "
    assert msg.startswith(where), msg
    assert re.search(match, msg), msg
    assert err.exit_code == 2
    return msg


def test_base_is_valid() -> None:
    site = parse_site(BASE, "base.toml")
    assert [n.name for n in site.nodes] == [
        "gpu1", "gpu2", "gpu3", "fpga1", "cpu1", "cpu2", "cpu3", "cpu4",
    ]


# --- the file as a whole ---------------------------------------------------------------


def test_missing_schema_version(tmp_path: Path) -> None:
    text = edit(BASE, "schema_version = 1\n", "")
    # The key is absent, so the error points at the file's first line.
    err, path = load_error(tmp_path, text)
    assert str(err).startswith(f"{path}:1: key 'schema_version': missing 'schema_version'")


@pytest.mark.parametrize("value", ["2", "0", '"1"'])
def test_unsupported_schema_version(tmp_path: Path, value: str) -> None:
    text = edit(BASE, "schema_version = 1", f"schema_version = {value}")
    check_error(tmp_path, text, "schema_version", "schema_version =",
                r"is not supported; this hetslurm reads 1")


def test_not_toml(tmp_path: Path) -> None:
    text = edit(BASE, "count = 4\n", "count = = 4\n")
    check_error(tmp_path, text, None, "count = = 4", r"not valid TOML")


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        load_site(path)
    assert str(info.value).startswith(f"{path}: cannot read site file")


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    text = edit(BASE, 'name = "mini"\n', 'name = "mini"\nschedulng = 3\n')
    check_error(tmp_path, text, "schedulng", "schedulng",
                r"unknown key 'schedulng'; did you mean 'scheduling'\?$")


def test_unknown_key_without_close_match_has_no_hint(tmp_path: Path) -> None:
    text = edit(BASE, 'name = "mini"\n', 'name = "mini"\nzzzzzz = 3\n')
    msg = check_error(tmp_path, text, "zzzzzz", "zzzzzz", r"unknown key 'zzzzzz'$")
    assert "did you mean" not in msg


@pytest.mark.parametrize(
    ("old", "new", "key", "needle", "hint"),
    [
        ('model = "a100"\n', 'model = "a100"\ncuont = 3\n',
         "node_classes.a100x4.gpus.cuont", "cuont", "count"),
        ("memory = 16384\n", "memory = 16384\nsocket = 2\n",
         "node_classes.cpu8.socket", "socket = 2", "sockets"),
        ('gpu_model_order = ["h100", "a100"]\n',
         'gpu_model_order = ["h100", "a100"]\ngpu_model_ordr = []\n',
         "scheduling.gpu_model_ordr", "gpu_model_ordr", "gpu_model_order"),
        ('nodes = "gpu[1-3]"\n\n', 'nodes = "gpu[1-3]"\nmax_tme = "1"\n\n',
         "partitions.gpu.max_tme", "max_tme", "max_time"),
        ('nodes = "cpu[1-4]"\n', 'nodes = "cpu[1-4]"\nlink_sped = 1\n',
         "switches.leaf2.link_sped", "link_sped", "link_speed"),
        ('partition = "gpu"\n', 'partition = "gpu"\ndevice = []\n',
         "classes.train.device", "device = []", "devices"),
    ],
    ids=["device-group", "node-class", "scheduling", "partition", "switch", "workload-class"],
)
def test_unknown_nested_key_suggests(tmp_path: Path, old: str, new: str, key: str,
                                     needle: str, hint: str) -> None:
    text = edit(BASE, old, new)
    bad = key.rsplit(".", 1)[1]
    check_error(tmp_path, text, key, needle,
                rf"unknown key '{bad}'; did you mean '{hint}'\?$")


def test_missing_required_key(tmp_path: Path) -> None:
    text = edit(BASE, "memory = 16384\n", "")
    check_error(tmp_path, text, "node_classes.cpu8.memory", "[node_classes.cpu8]",
                r"required key 'memory' is missing")


# --- types, counts and sizes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ('"8"', r"valid integer \(got '8'\)"),
        ("true", r"valid integer \(got True\)"),
        ("8.0", r"valid integer"),
        ("65", r"less than or equal to 64"),
        ("0", r"greater than or equal to 1"),
        ("-2", r"greater than or equal to 1"),
    ],
    ids=["string", "bool", "float", "65-gpus", "zero", "negative"],
)
def test_bad_device_count(tmp_path: Path, value: str, match: str) -> None:
    text = edit(BASE, "count = 8\n", f"count = {value}\n")
    check_error(tmp_path, text, "node_classes.h100x8.gpus.count", f"count = {value}", match)


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("cores_per_socket", '"4"', r"valid integer \(got '4'\)"),
        ("cores_per_socket", "0", r"greater than or equal to 1"),
        ("cores_per_socket", "100000", r"less than or equal to 1024"),
        ("sockets", "true", r"valid integer \(got True\)"),
        ("sockets", "17", r"less than or equal to 16"),
        ("threads_per_core", "9", r"less than or equal to 8"),
        ("numa_nodes", "0", r"greater than or equal to 1"),
    ],
)
def test_bad_core_counts(tmp_path: Path, key: str, value: str, match: str) -> None:
    text = edit(BASE, "[node_classes.cpu8]\nsockets = 2\ncores_per_socket = 4\n",
                "[node_classes.cpu8]\n" + "\n".join(
                    f"{k} = {value if k == key else v}"
                    for k, v in (("sockets", 2), ("cores_per_socket", 4), (key, None))
                    if v is not None or k not in ("sockets", "cores_per_socket")) + "\n")
    check_error(tmp_path, text, f"node_classes.cpu8.{key}", f"{key} = {value}", match)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (str(10**12), r"less than or equal to 67108864"),
        ("0", r"greater than or equal to 1"),
        ('"16X"', r"'16X' is not a memory size; write e\.g\. 16000 \(MiB\) or '16G'"),
        ('"1.5G"', r"'1\.5G' is not a memory size"),
        ('"-4G"', r"'-4G' is not a memory size"),
        ('"G"', r"'G' is not a memory size"),
        ('"16K"', r"'16K' is not a whole number of MiB"),
        ('"100T"', r"less than or equal to 67108864"),
        ("true", r"memory must be a number of MiB or a string such as '16G'"),
        ("16.0", r"memory must be a number of MiB"),
    ],
)
def test_bad_memory(tmp_path: Path, value: str, match: str) -> None:
    text = edit(BASE, "memory = 16384\n", f"memory = {value}\n")
    check_error(tmp_path, text, "node_classes.cpu8.memory", f"memory = {value}", match)


@pytest.mark.parametrize(("value", "mib"), [("16384", 16384), ('"16G"', 16384),
                                            ('"16GiB"', 16384), ('"512 MB"', 512),
                                            ('"2048K"', 2), ('"1T"', 1024 * 1024)])
def test_memory_sizes(value: str, mib: int) -> None:
    site = parse_site(edit(BASE, "memory = 16384\n", f"memory = {value}\n"))
    assert site.node("cpu1").spec.memory == mib


def test_device_memory_is_checked_too(tmp_path: Path) -> None:
    text = edit(BASE, 'model = "a100"\n', 'model = "a100"\nmemory = "40Q"\n')
    check_error(tmp_path, text, "node_classes.a100x4.gpus.memory", 'memory = "40Q"',
                r"'40Q' is not a memory size")


def test_power_must_be_a_number(tmp_path: Path) -> None:
    text = edit(BASE, "memory = 16384\n", 'memory = 16384\npower_idle_watts = "100"\n')
    check_error(tmp_path, text, "node_classes.cpu8.power_idle_watts", "power_idle_watts",
                r"valid number")


# --- nodes ---------------------------------------------------------------------------


def test_duplicate_node_across_two_hostlists(tmp_path: Path) -> None:
    text = edit(BASE, '"gpu3" = "a100x4"', '"gpu[2-3]" = "a100x4"')
    check_error(tmp_path, text, 'nodes."gpu[2-3]"', '"gpu[2-3]" = "a100x4"',
                r"node 'gpu2' is defined twice")


@pytest.mark.parametrize("expr", ["gpu[3-", "gpu[3-1]", "gpu[a-b]"])
def test_bad_hostlist(tmp_path: Path, expr: str) -> None:
    text = edit(BASE, '"gpu3" = "a100x4"', f'"{expr}" = "a100x4"')
    check_error(tmp_path, text, f'nodes."{expr}"', f'"{expr}" = "a100x4"',
                rf"'{re.escape(expr)}' is not a valid hostlist expression")


def test_bad_node_name(tmp_path: Path) -> None:
    text = edit(BASE, '"gpu3" = "a100x4"', '"3gpu" = "a100x4"')
    check_error(tmp_path, text, "nodes.3gpu", '"3gpu"', r"'3gpu' is not a valid Slurm node name")


def test_unknown_node_class_suggests(tmp_path: Path) -> None:
    text = edit(BASE, '"gpu3" = "a100x4"', '"gpu3" = "a100x8"')
    check_error(tmp_path, text, "nodes.gpu3", '"gpu3" = "a100x8"',
                r"unknown node class 'a100x8'; did you mean '(a100x4|h100x8)'\?$")


# --- devices: islands, NUMA, power ----------------------------------------------------


def test_island_names_gpu_past_the_end(tmp_path: Path) -> None:
    text = edit(BASE, "[4, 5, 6, 7]]", "[4, 5, 6, 8]]")
    check_error(tmp_path, text, "node_classes.h100x8.gpus.nvlink_islands", "nvlink_islands",
                r"island 1 names GPU 8, but the node has GPUs 0-7$")


def test_gpu_in_two_islands(tmp_path: Path) -> None:
    text = edit(BASE, "[4, 5, 6, 7]]", "[3, 5, 6, 7]]")
    check_error(tmp_path, text, "node_classes.h100x8.gpus.nvlink_islands", "nvlink_islands",
                r"GPU 3 is in islands 0 and 1$")


def test_island_error_line_after_multiline_array(tmp_path: Path) -> None:
    # The line scanner must skip a multi-line array and still place the next key.
    text = edit(BASE, "nvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]\n",
                "nvlink_islands = [\n  [0, 1, 2, 3],\n  [4, 5, 6, 7],\n]\nnuma = [0, 1]\n")
    check_error(tmp_path, text, "node_classes.h100x8.gpus.numa", "numa = [0, 1]",
                r"lists 2 NUMA domains for 8 devices")


def test_numa_list_of_wrong_length(tmp_path: Path) -> None:
    text = edit(BASE, "count = 4\n", "count = 4\nnuma = [0, 1]\n")
    check_error(tmp_path, text, "node_classes.a100x4.gpus.numa", "numa = [0, 1]",
                r"lists 2 NUMA domains for 4 devices$")


@pytest.mark.parametrize("bad", ["2", "-1"])
def test_numa_domain_out_of_range(tmp_path: Path, bad: str) -> None:
    text = edit(BASE, "count = 4\n", f"count = 4\nnuma = [0, 0, 1, {bad}]\n")
    check_error(tmp_path, text, "node_classes.a100x4.gpus.numa", "numa = [0, 0, 1",
                rf"NUMA domain {bad} does not exist \(0-1\)$")


def test_cores_not_divisible_by_numa_nodes(tmp_path: Path) -> None:
    text = edit(BASE, "cores_per_socket = 4\nmemory = 16384\n",
                "cores_per_socket = 3\nnuma_nodes = 4\nmemory = 16384\n")
    check_error(tmp_path, text, "node_classes.cpu8.numa_nodes", "numa_nodes = 4",
                r"6 cores do not split evenly into 4 domains$")


def test_node_busy_power_below_idle(tmp_path: Path) -> None:
    text = edit(BASE, "memory = 16384\n",
                "memory = 16384\npower_idle_watts = 100\npower_busy_watts = 50.5\n")
    check_error(tmp_path, text, "node_classes.cpu8.power_busy_watts", "power_busy_watts",
                r"busy power is below idle power$")


def test_device_busy_power_below_idle(tmp_path: Path) -> None:
    text = edit(BASE, "count = 4\n", "count = 4\npower_idle_watts = 60\npower_busy_watts = 40\n")
    check_error(tmp_path, text, "node_classes.a100x4.gpus.power_busy_watts",
                "power_busy_watts = 40", r"busy power is below idle power$")


def test_device_files_count_must_match(tmp_path: Path) -> None:
    text = edit(BASE, "count = 4\n", 'count = 4\nfiles = "/dev/nvidia[0-2]"\n')
    check_error(tmp_path, text, "node_classes.a100x4.gpus.files", "files =",
                r"names 3 device files for 4 devices$")


def test_fpgas_have_no_nvlink(tmp_path: Path) -> None:
    text = edit(BASE, "count = 2\n", "count = 2\nnvlink_islands = [[0, 1]]\n")
    check_error(tmp_path, text, "node_classes.u280x2.fpgas.nvlink_islands", "[[0, 1]]",
                r"FPGAs have no NVLink islands$")


# --- names ----------------------------------------------------------------------------

MODEL_RULE = (r"cannot be a Slurm gres type and feature: use a lowercase letter, then "
              r"lowercase letters, digits or '_' \(at most 31 characters\), e\.g\. ")


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("A100", MODEL_RULE + "'a100'$"),
        ("a100-80gb", MODEL_RULE + "'a100_80gb'$"),
        ("1x", MODEL_RULE + "'m1x'$"),
        ("h100:sxm", MODEL_RULE + "'h100_sxm'$"),
        ("a" * 32, MODEL_RULE),
        ("", MODEL_RULE),
        ("gpu", r"'gpu' is reserved: hetslurm adds it as a feature itself$"),
        ("fpga", r"'fpga' is reserved"),
        ("cpu", r"'cpu' is reserved"),
    ],
)
def test_bad_device_model_name(tmp_path: Path, bad: str, match: str) -> None:
    text = edit(BASE, 'model = "a100"', f'model = "{bad}"')
    check_error(tmp_path, text, "node_classes.a100x4.gpus.model", f'model = "{bad}"', match)


@pytest.mark.parametrize("good", ["a100", "h100_sxm", "mi250x", "u280", "a" * 31])
def test_model_name_rule_accepts(good: str) -> None:
    assert names.model_name_problem(good) is None
    assert names.MODEL_RE.pattern == r"^[a-z][a-z0-9_]{0,30}$"


def test_bad_fpga_model_name(tmp_path: Path) -> None:
    text = edit(BASE, 'model = "u280"', 'model = "U280"')
    check_error(tmp_path, text, "node_classes.u280x2.fpgas.model", 'model = "U280"',
                MODEL_RULE + "'u280'$")


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("Fast-Net", r"'Fast-Net' cannot be a Slurm feature: use a lowercase letter"),
        ("ib&opa", r"'ib&opa' cannot be a Slurm feature"),
        ("gpu", r"'gpu' is reserved"),
    ],
)
def test_bad_feature_name(tmp_path: Path, bad: str, match: str) -> None:
    text = edit(BASE, "memory = 16384\n", f'memory = 16384\nfeatures = ["ib", "{bad}"]\n')
    check_error(tmp_path, text, "node_classes.cpu8.features", "features = [\"ib\"", match)


def test_cluster_name_with_capitals(tmp_path: Path) -> None:
    text = edit(BASE, 'name = "mini"', 'name = "Mini"')
    check_error(tmp_path, text, "name", 'name = "Mini"',
                r"cluster name must be lowercase.*Slurm lowercases ClusterName")


def test_bad_node_class_name(tmp_path: Path) -> None:
    text = edit(BASE, "[node_classes.cpu8]", "[node_classes.8cpu]")
    text = edit(text, '"cpu[1-4]" = "cpu8"', '"cpu[1-4]" = "8cpu"')
    check_error(tmp_path, text, "node_classes.8cpu", "[node_classes.8cpu]",
                r"node class name '8cpu' must start with a letter")


# --- partitions -----------------------------------------------------------------------


def test_partition_names_unknown_node(tmp_path: Path) -> None:
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n', 'nodes = "gpu[1-4]"\n\n')
    check_error(tmp_path, text, "partitions.gpu.nodes", 'nodes = "gpu[1-4]"',
                r"node 'gpu4' is not defined in \[nodes\]$")


def test_two_default_partitions(tmp_path: Path) -> None:
    # The error points at the second default, the one to remove.
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n', 'nodes = "gpu[1-3]"\ndefault = true  # 2nd\n\n')
    check_error(tmp_path, text, "partitions.gpu.default", "# 2nd",
                r"partitions 'batch' and 'gpu' are both default$")


@pytest.mark.parametrize("key", ["max_time", "default_time"])
@pytest.mark.parametrize("value", ["2h", "1:2:3:4", "1-", "forever", ""])
def test_bad_partition_time(tmp_path: Path, key: str, value: str) -> None:
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n', f'nodes = "gpu[1-3]"\n{key} = "{value}"\n\n')
    check_error(tmp_path, text, f"partitions.gpu.{key}", f'{key} = "{value}"',
                rf"'{re.escape(value)}' is not a Slurm time")


@pytest.mark.parametrize("value", ["UNLIMITED", "INFINITE", "30", "12:00:00", "2-00:00:00"])
def test_good_partition_time(value: str) -> None:
    site = parse_site(edit(BASE, 'max_time = "1-00:00:00"', f'max_time = "{value}"'))
    assert site.partitions["batch"].spec.max_time == value


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ("MaxTime", r"'MaxTime' has its own key here$"),
        ("nodes", r"'nodes' has its own key here$"),
        ("Default", r"'Default' has its own key here$"),
        ("PartitionName", r"'PartitionName' has its own key here$"),
        ("State", r"'State' is always rendered as UP$"),
        ("Max_Nodes", r"'Max_Nodes' is not a Slurm option name$"),
    ],
)
def test_partition_option_collisions(tmp_path: Path, option: str, match: str) -> None:
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n',
                f'nodes = "gpu[1-3]"\n\n[partitions.gpu.options]\n{option} = "2"\n\n')
    check_error(tmp_path, text, f"partitions.gpu.options.{option}", f'{option} = "2"', match)


@pytest.mark.parametrize("value", ["NO State=DOWN", "NO\\nNodeName=x", "NO#", ""])
def test_partition_option_value_cannot_escape_its_line(tmp_path: Path, value: str) -> None:
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n',
                f'nodes = "gpu[1-3]"\noptions = {{ OverSubscribe = "{value}" }}\n\n')
    check_error(tmp_path, text, "partitions.gpu.options.OverSubscribe", "OverSubscribe",
                r"must not be empty or hold blanks, newlines or '#'$")


def test_partition_option_must_be_a_string(tmp_path: Path) -> None:
    text = edit(BASE, 'nodes = "gpu[1-3]"\n\n',
                'nodes = "gpu[1-3]"\noptions = { MaxNodes = 2 }\n\n')
    check_error(tmp_path, text, "partitions.gpu.options.MaxNodes", "MaxNodes",
                r"valid string \(got 2\)")


# --- switches -------------------------------------------------------------------------


def test_switch_with_nodes_and_switches(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]\n',
                'switches = ["leaf1", "leaf2"]\nnodes = "cpu1"\n')
    check_error(tmp_path, text, "switches.spine", "[switches.spine]",
                r"either 'nodes' \(a leaf\) or 'switches', exactly one of them$")


def test_switch_with_neither(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]\n', "link_speed = 3\n")
    check_error(tmp_path, text, "switches.spine", "[switches.spine]",
                r"either 'nodes' \(a leaf\) or 'switches', exactly one of them$")


def test_unknown_child_switch_suggests(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]', 'switches = ["leaf1", "leaf3"]')
    check_error(tmp_path, text, "switches.spine.switches", 'switches = ["leaf1", "leaf3"]',
                r"unknown switch 'leaf3'; did you mean 'leaf[12]'\?$")


def test_switch_cycle_names_a_switch_on_it(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]\n',
                'switches = ["leaf1", "leaf2", "top"]\n\n[switches.top]\nswitches = ["spine"]\n')
    # leaf1 (first in the file) hangs under the cycle but is not on it.
    check_error(tmp_path, text, "switches.spine", "[switches.spine]",
                r"the switch tree has a cycle through 'spine'$")


def test_switch_containing_itself(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]', 'switches = ["leaf1", "leaf2", "spine"]')
    check_error(tmp_path, text, "switches.spine.switches", 'switches = ["leaf1"',
                r"a switch cannot contain itself$")


def test_switch_under_two_parents(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]\n',
                'switches = ["leaf1", "leaf2"]\n\n[switches.top]\nswitches = ["spine", "leaf2"]\n')
    check_error(tmp_path, text, "switches.top.switches", 'switches = ["spine", "leaf2"]',
                r"switch 'leaf2' already hangs under 'spine'$")


def test_node_under_two_leaves(tmp_path: Path) -> None:
    text = edit(BASE, 'nodes = "cpu[1-4]"\n', 'nodes = "cpu[1-4],gpu3"\n')
    check_error(tmp_path, text, "switches.leaf2.nodes", 'nodes = "cpu[1-4],gpu3"',
                r"node 'gpu3' is already under switch 'leaf1'$")


def test_node_under_no_leaf(tmp_path: Path) -> None:
    text = edit(BASE, 'nodes = "cpu[1-4]"\n', 'nodes = "cpu[1-3]"\n')
    # There is no [switches] header; the error points at the first switch table.
    check_error(tmp_path, text, "switches", "[switches.leaf1]",
                r"node\(s\) cpu4 are under no leaf switch")


def test_leaf_names_unknown_node(tmp_path: Path) -> None:
    text = edit(BASE, 'nodes = "cpu[1-4]"\n', 'nodes = "cpu[1-5]"\n')
    check_error(tmp_path, text, "switches.leaf2.nodes", 'nodes = "cpu[1-5]"',
                r"node 'cpu5' is not defined in \[nodes\]$")


def test_two_roots(tmp_path: Path) -> None:
    text = edit(BASE, 'switches = ["leaf1", "leaf2"]\n',
                'switches = ["leaf1"]\n\n[switches.spine2]\nswitches = ["leaf2"]\n')
    check_error(tmp_path, text, "switches", "[switches.leaf1]",
                r"the tree has 2 roots \(spine, spine2\); add a top switch")


def test_no_switches_is_fine() -> None:
    text = BASE.split("[switches.leaf1]")[0] + "[classes" + BASE.split("[classes", 1)[1]
    site = parse_site(text)
    assert site.switches == {}
    assert all(n.leaf_switch is None for n in site.nodes)


# --- scheduling and workload classes --------------------------------------------------


def test_order_names_unknown_model(tmp_path: Path) -> None:
    text = edit(BASE, 'gpu_model_order = ["h100", "a100"]', 'gpu_model_order = ["h100", "a10"]')
    check_error(tmp_path, text, "scheduling.gpu_model_order", "gpu_model_order",
                r"model 'a10' is not in any node class; did you mean 'a100'\?$")


def test_order_names_a_model_twice(tmp_path: Path) -> None:
    text = edit(BASE, 'gpu_model_order = ["h100", "a100"]',
                'gpu_model_order = ["h100", "a100", "h100"]')
    check_error(tmp_path, text, "scheduling.gpu_model_order", "gpu_model_order",
                r"model 'h100' is listed twice$")


def test_fpga_order_names_a_gpu(tmp_path: Path) -> None:
    text = edit(BASE, 'gpu_model_order = ["h100", "a100"]\n',
                'gpu_model_order = ["h100", "a100"]\nfpga_model_order = ["h100"]\n')
    check_error(tmp_path, text, "scheduling.fpga_model_order", "fpga_model_order",
                r"model 'h100' is not in any node class")


def test_workload_class_names_unknown_device(tmp_path: Path) -> None:
    text = edit(BASE, 'devices = ["h100", "a100"]', 'devices = ["h100", "a10"]')
    check_error(tmp_path, text, "classes.train.devices", "devices =",
                r"device type 'a10' is not a model of this site; did you mean 'a100'\?$")


def test_workload_class_mixes_cpu_and_devices(tmp_path: Path) -> None:
    text = edit(BASE, 'devices = ["h100", "a100"]', 'devices = ["cpu", "a100"]')
    check_error(tmp_path, text, "classes.train.devices", "devices =",
                r"'cpu' \(CPU-only nodes\) cannot be mixed with device models in one class$")


def test_workload_class_names_unknown_partition(tmp_path: Path) -> None:
    text = edit(BASE, 'partition = "gpu"', 'partition = "gpus"')
    check_error(tmp_path, text, "classes.train.partition", 'partition = "gpus"',
                r"unknown partition 'gpus'; did you mean 'gpu'\?$")


def test_workload_class_devices_wrong_type(tmp_path: Path) -> None:
    text = edit(BASE, 'devices = ["h100", "a100"]', 'devices = "h100"')
    check_error(tmp_path, text, "classes.train.devices", 'devices = "h100"', r"valid tuple")


# --- what a valid file resolves to ----------------------------------------------------


def test_islands_map_to_numa_domains_and_cores() -> None:
    node = parse_site(BASE).node("gpu1")
    assert [d.island for d in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.numa for d in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {d.cores for d in node.gpus[:4]} == {(0, 1, 2, 3)}
    assert {d.cores for d in node.gpus[4:]} == {(4, 5, 6, 7)}
    assert [d.index for d in node.gpus] == list(range(8))
    assert {d.memory_mib for d in node.gpus} == {None}  # BASE gives no GPU memory


def test_non_contiguous_islands_follow_numa() -> None:
    text = edit(BASE, "[[0, 1, 2, 3], [4, 5, 6, 7]]", "[[0, 2, 4, 6], [1, 3, 5, 7]]")
    node = parse_site(text).node("gpu1")
    assert [d.numa for d in node.gpus] == [0, 1, 0, 1, 0, 1, 0, 1]
    assert node.gpus[2].cores == (0, 1, 2, 3)
    assert node.gpus[3].cores == (4, 5, 6, 7)


def test_default_numa_spreading_without_islands() -> None:
    node = parse_site(BASE).node("gpu3")
    # No islands: every GPU is its own island; devices spread evenly over the sockets.
    assert [d.island for d in node.gpus] == [0, 1, 2, 3]
    assert [d.numa for d in node.gpus] == [0, 0, 1, 1]
    assert [d.cores for d in node.gpus] == [(0, 1, 2, 3)] * 2 + [(4, 5, 6, 7)] * 2


def test_one_island_spanning_sockets_spreads_evenly() -> None:
    text = edit(BASE, "[[0, 1, 2, 3], [4, 5, 6, 7]]", "[[0, 1, 2, 3, 4, 5, 6, 7]]")
    node = parse_site(text).node("gpu1")
    assert {d.island for d in node.gpus} == {0}
    assert [d.numa for d in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_explicit_numa_wins_over_islands() -> None:
    text = edit(BASE, "nvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]\n",
                "nvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]\nnuma = [1, 1, 1, 1, 0, 0, 0, 0]\n")
    node = parse_site(text).node("gpu1")
    assert [d.numa for d in node.gpus] == [1, 1, 1, 1, 0, 0, 0, 0]
    assert node.gpus[0].cores == (4, 5, 6, 7)


def test_sub_numa_clustering_splits_cores() -> None:
    text = edit(BASE, "[node_classes.a100x4]\nsockets = 2\n",
                "[node_classes.a100x4]\nsockets = 2\nnuma_nodes = 4\n")
    node = parse_site(text).node("gpu3")
    assert node.numa_nodes == 4
    assert [d.numa for d in node.gpus] == [0, 1, 2, 3]
    assert [d.cores for d in node.gpus] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_weights_follow_gpu_model_order() -> None:
    site = parse_site(BASE)
    w = {n.name: n.weight for n in site.nodes}
    assert w["cpu1"] < w["fpga1"] < w["gpu1"] < w["gpu3"]
    swapped = parse_site(edit(BASE, 'order = ["h100", "a100"]', 'order = ["a100", "h100"]'))
    w2 = {n.name: n.weight for n in swapped.nodes}
    assert w2["gpu3"] < w2["gpu1"]
    assert w2["gpu3"] == w["gpu1"]  # the band's first step goes to the first model
    assert swapped.gpu_models() == ("a100", "h100")


def test_unlisted_models_weigh_after_listed_ones_by_name() -> None:
    site = parse_site(edit(BASE, 'gpu_model_order = ["h100", "a100"]\n', ""))
    assert site.gpu_models() == ("a100", "h100")
    assert site.node("gpu3").weight < site.node("gpu1").weight
    partial = parse_site(edit(BASE, 'order = ["h100", "a100"]', 'order = ["h100"]'))
    assert partial.gpu_models() == ("h100", "a100")


def test_features_are_added() -> None:
    site = parse_site(BASE)
    assert site.node("gpu1").features == ("gpu", "h100", "nvlink")
    assert site.node("gpu3").features == ("gpu", "a100")
    assert site.node("fpga1").features == ("fpga", "u280")
    assert site.node("cpu1").features == ("cpu",)


def test_own_feature_repeating_a_model_is_not_duplicated() -> None:
    site = parse_site(edit(BASE, 'features = ["nvlink"]', 'features = ["h100", "nvlink"]'))
    assert site.node("gpu1").features == ("gpu", "h100", "nvlink")


def test_partitions_and_leaves_resolve() -> None:
    site = parse_site(BASE)
    assert site.partitions["batch"].nodes == tuple(n.name for n in site.nodes)
    assert site.partitions["gpu"].nodes == ("gpu1", "gpu2", "gpu3")
    assert site.node("fpga1").leaf_switch == "leaf1"
    assert site.node("cpu4").leaf_switch == "leaf2"
    assert site.sections["classes"]["train"].devices == ("h100", "a100")


def test_frozen_objects_cannot_be_mutated() -> None:
    site = parse_site(BASE)
    node = site.node("gpu1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        site.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.weight = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.gpus[0].numa = 1  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        node.spec.memory = 1  # type: ignore[misc]
    assert node.spec.gpus is not None
    with pytest.raises(pydantic.ValidationError):
        node.spec.gpus.count = 2  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        site.scheduling.gpu_model_order = ()  # type: ignore[misc]
    assert isinstance(site.nodes, tuple)
    assert isinstance(node.gpus, tuple)


# --- named sections -------------------------------------------------------------------


class PowerCap(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)
    watts: pydantic.StrictInt
    partition: str = "batch"


@pytest.fixture
def power_section():
    """Register a ``power_caps`` section for one test and remove it afterwards."""
    before = dict(SECTIONS)
    register_section("power_caps", dict[str, PowerCap], {})
    yield
    SECTIONS.clear()
    SECTIONS.update(before)


@pytest.mark.usefixtures("power_section")
def test_registered_section_keeps_old_files_loading() -> None:
    site = parse_site(BASE)
    assert site.sections["power_caps"] == {}
    assert "train" in site.sections["classes"]


@pytest.mark.usefixtures("power_section")
def test_registered_section_is_validated(tmp_path: Path) -> None:
    site = parse_site(BASE + "\n[power_caps.night]\nwatts = 20000\n")
    assert site.sections["power_caps"]["night"] == PowerCap(watts=20000)
    text = BASE + '\n[power_caps.night]\nwatts = "lots"\n'
    check_error(tmp_path, text, "power_caps.night.watts", 'watts = "lots"', r"valid integer")
    text = BASE + "\n[power_caps.night]\nwats = 3\n"
    check_error(tmp_path, text, "power_caps.night.wats", "wats = 3",
                r"unknown key 'wats'; did you mean 'watts'\?$")


@pytest.mark.usefixtures("power_section")
def test_registered_section_appears_in_top_level_hints(tmp_path: Path) -> None:
    text = BASE + "\n[power_cap.night]\nwatts = 3\n"
    check_error(tmp_path, text, "power_cap", "[power_cap.night]",
                r"unknown key 'power_cap'; did you mean 'power_caps'\?$")


@pytest.mark.parametrize("name", ["classes", "nodes", "schema_version", "partitions"])
def test_register_section_refuses_duplicates(name: str) -> None:
    before = dict(SECTIONS)
    with pytest.raises(ValueError, match=f"site section '{name}' is already defined"):
        register_section(name, dict[str, PowerCap], {})
    assert before == SECTIONS


def test_without_section_registered_it_is_an_unknown_key(tmp_path: Path) -> None:
    text = BASE + "\n[power_caps.night]\nwatts = 3\n"
    check_error(tmp_path, text, "power_caps", "[power_caps.night]", r"unknown key 'power_caps'")


def test_list_positions_are_part_of_the_key(tmp_path: Path) -> None:
    text = edit(BASE, "[4, 5, 6, 7]]", '[4, 5, 6, "7"]]')
    check_error(tmp_path, text, "node_classes.h100x8.gpus.nvlink_islands[1][3]",
                "nvlink_islands", r"valid integer \(got '7'\)")


def test_user_keys_that_look_like_type_names_are_kept(tmp_path: Path) -> None:
    # pydantic puts union member names (int, str, DeviceGroup) into error locations; keys a
    # user wrote with capitals or such names must survive into the reported key.
    text = edit(BASE, "[partitions.gpu]", "[partitions.GPU]")
    text = edit(text, 'nodes = "gpu[1-3]"\n\n', 'nodes = "gpu[1-3]"\nmax_time = 5\n\n')
    text = edit(text, 'partition = "gpu"', 'partition = "GPU"')
    check_error(tmp_path, text, "partitions.GPU.max_time", "max_time = 5",
                r"valid string \(got 5\)")
    text = edit(BASE, "[node_classes.cpu8]", "[node_classes.int]")
    text = edit(text, '"cpu[1-4]" = "cpu8"', '"cpu[1-4]" = "int"')
    text = edit(text, "memory = 16384\n", 'memory = 16384\nthreads_per_core = "2"\n')
    check_error(tmp_path, text, "node_classes.int.threads_per_core", "threads_per_core",
                r"valid integer")
