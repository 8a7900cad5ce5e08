"""What a change needs (reconfigure or restart), and the QOS plan, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.levers import qos
from hetslurm.levers.rollout import classify
from hetslurm.site import load_site
from hetslurm.site.load import parse_site
from hetslurm.site.render import render
from hetslurm.slurm import QosInfo

ROOT = Path(__file__).resolve().parents[2]
SMALL = ROOT / "tests" / "data" / "levers" / "small.toml"
BASE = SMALL.read_text()


def files(text: str = BASE, whole: bool = False) -> dict[str, str | None]:
    return dict(render(parse_site(text), whole=whole))


def test_same_site_is_no_change_even_with_another_digest() -> None:
    old = files()
    new = {k: (v or "").replace("# hetslurm-site-digest:", "# hetslurm-site-digest: x")
           for k, v in old.items()}
    assert classify(old, new).changes == ()


@pytest.mark.parametrize(("old", "new", "action", "item"), [
    ('[partitions.gpu]\nnodes = "gpu[1-2]"',
     '[partitions.gpu]\nnodes = "gpu[1-2]"\nmax_time = "02:00:00"', "reconfigure",
     "PartitionName=gpu"),
    ("priority_weight_fairshare = 10000", "priority_weight_fairshare = 500", "reconfigure",
     "PriorityWeightFairshare"),
    ('[node_classes.cpu4]\ncores_per_socket = 4\nmemory = "4G"',
     '[node_classes.cpu4]\ncores_per_socket = 4\nmemory = "3G"', "restart", "NodeName=cpu1"),
    ('[node_classes.cpu4]\ncores_per_socket = 4',
     '[node_classes.cpu4]\nfeatures = ["ssd"]\ncores_per_socket = 4', "reconfigure",
     "NodeName=cpu1"),
    ('cpu1 = "cpu4"', '"cpu[1-2]" = "cpu4"', "restart", "NodeName=cpu[1-2]"),
    ("[levers]\n", "[levers]\n", None, None),
])
def test_each_change_is_classified(old: str, new: str, action: str | None,
                                   item: str | None) -> None:
    assert BASE.count(old) == 1
    plan = classify(files(), files(BASE.replace(old, new)))
    assert plan.action == action
    if item:
        assert item in {c.item for c in plan.changes}


def test_shards_need_a_restart_for_gres_types_and_gres_conf() -> None:
    plan = classify(files(), files(BASE + "\n[levers.shards]\nh100 = 4\n"))
    assert plan.needs_restart
    restart = {(c.file, c.item) for c in plan.changes if c.action == "restart"}
    assert ("hetslurm-globals.conf", "GresTypes") in restart
    assert ("gres.conf", "NodeName=gpu1") in restart
    assert ("hetslurm-nodes.conf", "NodeName=gpu1") in restart


def test_weight_flip_is_reconfigure_even_though_tres_lists_reorder() -> None:
    text = BASE.replace("energy_cost_balance = 0.5", "energy_cost_balance = 0.0").replace(
        "h100 = 3.0\na100 = 2.0", "h100 = 30.0\na100 = 2.0")
    plan = classify(files(whole=True), files(text, whole=True))
    assert plan.action == "reconfigure"
    assert "AccountingStorageTRES" not in {c.item for c in plan.changes}


def test_topology_change_is_reconfigure_and_a_missing_file_counts() -> None:
    demo = render(load_site(ROOT / "site-configs" / "demo.toml"))
    old = dict(demo)
    new = dict(demo)
    new["topology.conf"] = (demo["topology.conf"] or "").replace("LinkSpeed", "X") + \
        "SwitchName=extra Nodes=cpu1\n"
    assert classify(old, new).action == "reconfigure"
    assert classify({**old, "gres.conf": None}, new).needs_restart


def _info(name: str, **kw: object) -> QosInfo:
    return QosInfo(name=name, **kw)  # type: ignore[arg-type]


def test_qos_plan_adds_modifies_and_grants_per_association() -> None:
    site = parse_site(BASE)
    assoc = {("user", "root", "root"): {"normal"}, ("user", "root", "lvfast"): {"lvtrain"}}
    plan = qos.plan(site, [], assoc)
    items = [c.item for c in plan.changes]
    assert items == ["qos lvtrain", "qos lvtrain for user root in account root"]
    assert {c.action for c in plan.changes} == {"sacctmgr"}
    live = [_info("lvtrain", max_tres_per_user={"gres/gpu:h100": 4, "gres/gpu:a100": 2})]
    plan = qos.plan(site, live, {("user", "root", "root"): {"lvtrain"}})
    (change,) = plan.changes
    assert change.new == "MaxTRESPerUser=gres/gpu:h100=1"
    # The modification clears the limit the site no longer names.
    want = qos.wanted(site)["lvtrain"]
    have = qos.live_state(live[0])
    assert qos.settings(want, have) == {"MaxTRESPerUser": "gres/gpu:h100=1,gres/gpu:a100=-1"}


def test_qos_in_sync_is_no_change() -> None:
    site = parse_site(BASE)
    live = [_info("lvtrain", max_tres_per_user={"gres/gpu:h100": 1})]
    assert qos.plan(site, live, {("user", "root", "root"): {"lvtrain", "normal"}}).changes == ()


def test_new_qos_arguments() -> None:
    site = parse_site(BASE.replace("max_tres_per_user = { h100 = 1 }",
                                   'max_tres_per_user = { h100 = 1 }\nmax_wall = "1-00:00:00"'
                                   "\npriority = 10"))
    args = qos.settings(qos.wanted(site)["lvtrain"], None)
    assert list(args.items()) == [("Priority", "10"), ("UsageFactor", "1.0"),
                                  ("MaxTRESPerUser", "gres/gpu:h100=1"),
                                  ("MaxWall", "1-00:00:00")]
