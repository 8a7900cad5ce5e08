"""The pure levers: weights from power and cost, billing by speed, reserves, shards, QOS
names; and the loader's cross-checks for ``[levers]``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.errors import ConfigError
from hetslurm.site import levers as lv
from hetslurm.site import load_site
from hetslurm.site.load import parse_site
from hetslurm.site.render import render
from hetslurm.traces import traces_dir

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "data" / "levers" / "small.toml"
BASE = SMALL.read_text()
ORDER = 'def_mem_per_cpu = 256\ngpu_model_order = ["a100", "h100"]'
GAVEL = traces_dir() / "gavel" / \
    "simulation_throughputs.json"


def edit(old: str, new: str, text: str = BASE) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_power_and_cost_rank_models_and_cpu_nodes_stay_lowest() -> None:
    site = parse_site(BASE)
    w = {n.name: n.weight for n in site.nodes}
    assert w["cpu1"] < w["gpu1"] < w["gpu2"]
    # The derived order becomes the site's order, so the hook's rules and weights agree.
    assert site.gpu_models() == ("h100", "a100")
    assert site.scheduling.gpu_model_order == ("h100", "a100")


def test_cost_alone_can_flip_the_order() -> None:
    text = edit("energy_cost_balance = 0.5", "energy_cost_balance = 0.0")
    site = parse_site(edit("h100 = 3.0\na100 = 2.0", "h100 = 30.0\na100 = 2.0", text))
    assert site.node("gpu2").weight < site.node("gpu1").weight
    assert site.gpu_models() == ("a100", "h100")


def test_scores_are_energy_and_cost_per_unit_of_work() -> None:
    site = parse_site(BASE)
    s = lv.device_scores(site.node_classes, site.sections["levers"], "gpu")
    # Energy per work: H100 (700 + 400/2) W / speed 3 = 300, A100 (400 + 400/2) W / speed 1
    # = 600; cost per work: H100 3.0 / 3 = 1, A100 2.0 / 1 = 2. Each term relative to the
    # lowest, blended half and half.
    assert s["a100"] == pytest.approx(0.5 * 2 + 0.5 * 2)
    assert s["h100"] == pytest.approx(1.0)


def test_without_power_or_cost_weights_follow_the_written_order() -> None:
    text = BASE.replace("power_busy_watts = 700\n", "").replace("power_busy_watts = 400\n", "")
    text = edit("[levers.cost_per_device_hour]\nh100 = 3.0\na100 = 2.0\n", "", text)
    text = edit("def_mem_per_cpu = 256", ORDER, text)
    site = parse_site(text)
    assert site.node("gpu2").weight < site.node("gpu1").weight


def test_weight_from_order_ignores_power_and_cost() -> None:
    text = edit("[levers]\n", '[levers]\nweight_from = "order"\n')
    text = edit("def_mem_per_cpu = 256", ORDER, text)
    assert parse_site(text).gpu_models() == ("a100", "h100")


def test_a_written_order_that_disagrees_is_refused_with_both_orders() -> None:
    text = edit("def_mem_per_cpu = 256", ORDER)
    with pytest.raises(ConfigError) as err:
        parse_site(text, "s.toml")
    assert err.value.key == "scheduling.gpu_model_order"
    assert "rank h100, a100" in str(err.value) and "weight_from" in str(err.value)


def test_billing_weights_scale_with_speed_and_need_accounting() -> None:
    site = parse_site(BASE)
    files = render(site)
    parts = files["hetslurm-partitions.conf"]
    assert "TRESBillingWeights=CPU=1,GRES/gpu:h100=30,GRES/gpu:a100=10 " in parts
    glob = files["hetslurm-globals.conf"]
    assert "PriorityFlags=MAX_TRES" in glob and "PriorityCalcPeriod=1" in glob
    whole = render(site, whole=True)["slurm.conf"]  # no slurmdbd: no typed GPU TRES
    assert "TRESBillingWeights" not in whole and "MAX_TRES" not in whole
    assert "PriorityCalcPeriod=1" in whole


def test_relative_speed_is_a_geometric_mean_of_ratios() -> None:
    table = {"a": {"x": 2.0, "y": 100.0}, "b": {"x": 1.0, "y": 25.0}}
    assert lv.relative_speed(table, ["a", "b"]) == pytest.approx({"a": 8 ** 0.5, "b": 1.0})
    assert lv.relative_speed(table, ["a", "b"], "y") == pytest.approx({"a": 4.0, "b": 1.0})


def test_reserve_renders_partition_limits() -> None:
    parts = render(parse_site(BASE))["hetslurm-partitions.conf"]
    line = next(ln for ln in parts.splitlines() if ln.startswith("PartitionName=spill"))
    assert "MaxCPUsPerNode=2 MaxMemPerNode=2048" in line
    gpu_line = next(ln for ln in parts.splitlines() if ln.startswith("PartitionName=gpu"))
    assert "MaxCPUsPerNode" not in gpu_line


def test_reserve_that_would_cap_cpu_nodes_is_refused() -> None:
    text = edit('[partitions.spill]\nnodes = "gpu[1-2]"', '[partitions.spill]\nnodes = "ALL"')
    with pytest.raises(ConfigError, match="CPU-only node"):
        parse_site(text)


@pytest.mark.parametrize(("old", "new", "key"), [
    ("cores = 2", "cores = 4", "levers.gpu_reserve.spill.cores"),
    ("[levers.gpu_reserve.spill]", "[levers.gpu_reserve.spil]", "levers.gpu_reserve.spil"),
    ("h100 = 3.0\na100 = 2.0", "h100 = 3.0\nh200 = 2.0", 'levers.cost_per_device_hour.h200'),
    ('a100 = { train = 1.0 }', 'a100 = { infer = 1.0 }', "levers.speed"),
    ("max_tres_per_user = { h100 = 1 }", "max_tres_per_user = { h10 = 1 }",
     "levers.qos.lvtrain.max_tres_per_user.h10"),
])
def test_levers_errors_name_the_key(old: str, new: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_site(edit(old, new), "s.toml")
    assert err.value.key == key, str(err.value)


def test_option_set_by_a_lever_is_refused() -> None:
    text = edit('[partitions.spill]\nnodes = "gpu[1-2]"',
                '[partitions.spill]\nnodes = "gpu[1-2]"\noptions = { MaxCPUsPerNode = "3" }')
    with pytest.raises(ConfigError, match="set by \\[levers\\]"):
        parse_site(text)


def test_shards_render_in_slurm_and_gres_conf() -> None:
    site = parse_site(BASE + "\n[levers.shards]\nh100 = 4\n")
    files = render(site)
    assert "GresTypes=gpu,fpga,shard" in files["hetslurm-globals.conf"]
    assert "gres/shard" in files["hetslurm-globals.conf"]
    assert "Gres=gpu:h100:2,shard:8 " in files["hetslurm-nodes.conf"]
    assert "NodeName=gpu1 Name=shard Count=8" in files["gres.conf"]
    assert "NodeName=gpu2 Name=shard" not in files["gres.conf"]


def test_qos_limits_use_slurm_tres_names() -> None:
    site = parse_site(edit("max_tres_per_user = { h100 = 1 }",
                           "max_tres_per_user = { h100 = 1, gpu = 3, cpu = 8 }"))
    rec = lv.qos_records(site)["lvtrain"]
    assert lv.qos_tres(site, rec.max_tres_per_user) == {
        "cpu": 8, "gres/gpu": 3, "gres/gpu:h100": 1}


def test_site_without_levers_renders_as_before() -> None:
    text = BASE[:BASE.index("[levers]")]
    files = render(parse_site(text))
    assert "TRESBillingWeights" not in files["hetslurm-partitions.conf"]
    assert "PriorityFlags" not in files["hetslurm-globals.conf"]


@pytest.mark.skipif(not GAVEL.exists(), reason=f"Gavel traces not found at {GAVEL}")
def test_case_study_speeds_are_the_ratios_of_gavels_file() -> None:
    table = lv.read_gavel(GAVEL)
    site = load_site(ROOT / "site-configs" / "case-study.toml")
    written = site.sections["levers"].speed
    for model in ("v100", "p100", "k80"):
        for family, value in written[model].items():
            assert value == pytest.approx(table[model][family] / table["k80"][family],
                                          abs=6e-4), (model, family)


@pytest.mark.skipif(not GAVEL.exists(), reason=f"Gavel traces not found at {GAVEL}")
def test_speed_table_reference_is_read_at_load_time() -> None:
    text = (ROOT / "site-configs" / "case-study.toml").read_text()
    start = text.index("[levers.speed]")
    end = text.index("[levers.qos.vision]")
    text = text[:start] + text[end:]
    text = text.replace("[levers]\n", '[levers]\nspeed_table = "gavel:$HETSLURM_TRACES/gavel/'
                        'simulation_throughputs.json"\n', 1)
    site = parse_site(text, "cs.toml")
    assert lv.gpu_speeds(site) == pytest.approx({"v100": 3.619, "p100": 3.109, "k80": 1.0},
                                                abs=1e-3)


def test_missing_speed_table_is_a_config_error(tmp_path: Path) -> None:
    text = edit('[levers.speed]\nh100 = { train = 3.0 }\na100 = { train = 1.0 }\n',
                '')
    text = edit("[levers]\n", f'[levers]\nspeed_table = "gavel:{tmp_path}/none.json"\n', text)
    with pytest.raises(ConfigError) as err:
        parse_site(text, "s.toml")
    assert err.value.key == "levers.speed_table"


def test_demo_weights_and_billing() -> None:
    site = load_site(ROOT / "site-configs" / "demo.toml")
    assert site.node("gpu1").weight < site.node("gpu3").weight
    assert lv.gpu_speeds(site) == pytest.approx({"h100": 6 ** 0.5, "a100": 1.0})
