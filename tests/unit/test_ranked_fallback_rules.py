"""Ranked fallback (issue 22 item 1, docs/fallback.md) without Slurm: the per-model
partitions the site renders, what the hook writes and refuses, `wait-for=`, and what `place`
predicts from the partition list. The testbed run is tests/cluster/test_ranked_fallback.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hetslurm.errors import ConfigError, PlacementError
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import CallResult, HookRuntime
from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import place
from hetslurm.request.language import format_request, parse_request, resolve
from hetslurm.site import Site, load_site
from hetslurm.site.load import parse_site
from hetslurm.site.render import render

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
DEMO_TEXT = (ROOT / "site-configs" / "demo.toml").read_text()
ACCESS, GENERIC = 2002, -1


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


@pytest.fixture(scope="module")
def rt(demo: Site) -> HookRuntime:
    return HookRuntime(render_hook(demo).text)


def submit(rt: HookRuntime, line: str, **fields: Any) -> CallResult:
    return rt.submit({"user_name": "root", "script": f"#!/bin/bash\n{line}\nsrun true\n",
                      **fields})


def written(res: CallResult) -> dict[str, Any]:
    assert res.ok and res.rc == 0, (res.error, res.user_messages)
    return {f: v for f, v in res.writes if f != "admin_comment"}


# -- the site ---------------------------------------------------------------------------------


def test_one_partition_per_model_where_a_partition_holds_two(demo: Site) -> None:
    assert {n: (r.base, r.model, r.nodes) for n, r in demo.ranked.items()} == {
        "batch_h100": ("batch", "h100", ("gpu1", "gpu2")),
        "batch_a100": ("batch", "a100", ("gpu3", "gpu4")),
        "gpu_h100": ("gpu", "h100", ("gpu1", "gpu2")),
        "gpu_a100": ("gpu", "a100", ("gpu3", "gpu4")),
    }
    assert demo.ranked_list("gpu", ["a100", "h100"]) == "gpu_a100,gpu_h100"
    assert demo.ranked_list("gpu", ["a100"]) is None  # one model needs no fallback
    assert demo.ranked_list("fpga", ["a100", "h100"]) is None  # no GPU model there


def test_rendered_lines_copy_the_base_partition_word_for_word(tmp_path: Path) -> None:
    text = DEMO_TEXT.replace('[partitions.gpu]\nnodes = "gpu[1-4]"',
                             '[partitions.gpu]\nnodes = "gpu[1-4]"\n'
                             'options = { PriorityTier = "3", QOS = "normal", '
                             'PreemptMode = "REQUEUE" }')
    site = parse_site(text, "site.toml")
    conf = render(site, whole=True)["slurm.conf"]
    lines = {ln.split()[0]: ln for ln in conf.splitlines() if ln.startswith("PartitionName=")}

    def rest(line: str) -> list[str]:
        return [w for w in line.split()[1:] if not w.startswith(("Nodes=", "Default="))]

    assert rest(lines["PartitionName=gpu_a100"]) == rest(lines["PartitionName=gpu"])
    assert rest(lines["PartitionName=gpu_h100"]) == rest(lines["PartitionName=gpu"])
    assert "PriorityTier=3" in lines["PartitionName=gpu_a100"]
    assert "Nodes=gpu[3-4]" in lines["PartitionName=gpu_a100"]
    assert "Default=NO" in lines["PartitionName=batch_h100"]
    assert "Hidden" not in conf


def test_weights_mode_renders_none_and_the_hook_ranks_nothing() -> None:
    site = parse_site(DEMO_TEXT.replace("[scheduling]\n",
                                        '[scheduling]\nranked_fallback = "weights"\n'),
                      "site.toml")
    assert site.ranked == {}
    rt = HookRuntime(render_hook(site).text)
    assert written(submit(rt, "#HET gpus=1 class=inference")) == {
        "tres_per_node": "gres:gpu:1", "features": "a100|h100", "partition": "gpu"}


def test_a_site_partition_with_a_per_model_name_is_refused() -> None:
    text = DEMO_TEXT.replace('[partitions.fpga]', '[partitions.gpu_a100]\nnodes = "gpu3"\n\n'
                             '[partitions.fpga]')
    with pytest.raises(ConfigError, match=r"gpu_a100.*ranked fallback.*ranked_fallback"):
        parse_site(text, "site.toml")


# -- the hook ---------------------------------------------------------------------------------


def test_each_class_in_its_own_order(rt: HookRuntime) -> None:
    assert written(submit(rt, "#HET class=inference gpus=1"))["partition"] == \
        "gpu_a100,gpu_h100"
    assert written(submit(rt, "#HET class=train gpus=1"))["partition"] == "gpu_h100,gpu_a100"
    # No class: the default partition's per-model partitions, in gpu-type='s order.
    assert written(submit(rt, "#HET gpus=1 gpu-type=a100|h100"))["partition"] == \
        "batch_a100,batch_h100"
    # energy=low narrowed to one model: a typed gres, no ranking.
    assert written(submit(rt, "#HET class=train gpus=1 energy=low")) == {
        "tres_per_node": "gres:gpu:a100:1", "partition": "gpu"}


def test_the_jobs_own_partition(rt: HookRuntime) -> None:
    # The class's own partition named again: ranked inside it.
    assert written(submit(rt, "#HET class=inference gpus=1", partition="gpu"))["partition"] \
        == "gpu_a100,gpu_h100"
    # Another partition: the job's own wins, no ranking (the features OR stays).
    res = submit(rt, "#HET class=inference gpus=1", partition="batch")
    assert "partition" not in written(res)
    assert res.user_messages == (
        "#HET line 2: --partition=batch kept over class=inference's partition gpu",)
    # No class: ranked inside the job's own partition; several partitions: left alone.
    assert written(submit(rt, "#HET gpus=1 gpu-type=h100|a100", partition="gpu"))[
        "partition"] == "gpu_h100,gpu_a100"
    assert "partition" not in written(submit(rt, "#HET gpus=1 gpu-type=h100|a100",
                                             partition="gpu,batch"))


def test_a_job_wider_than_each_models_nodes_keeps_the_feature_or(rt: HookRuntime) -> None:
    # 4 nodes: each model has 2, and a job runs in one partition, so ranking would make it
    # impossible; it keeps the OR (which lets it span models).
    assert written(submit(rt, "#HET class=inference nodes=4 gpus-per-node=1")) == {
        "tres_per_node": "gres:gpu:1", "features": "a100|h100", "partition": "gpu",
        "min_nodes": 4, "max_nodes": 4}
    # The job's own -N counts too, on the fast path's request as well.
    res = written(submit(rt, "#HET class=inference gpus=1", min_nodes=3))
    assert res["partition"] == "gpu"
    assert written(submit(rt, "#HET class=inference nodes=2 gpus-per-node=1"))["partition"] \
        == "gpu_a100,gpu_h100"


@pytest.mark.parametrize("partition", ["gpu_a100", "gpu,batch_h100"])
def test_naming_a_per_model_partition_is_refused(rt: HookRuntime, partition: str) -> None:
    for line in ("#SBATCH -t 5", "#HET class=inference gpus=1"):
        res = submit(rt, line, partition=partition)
        assert res.ok and res.rc == ACCESS and res.writes == ()
        assert "ranked fallback" in res.user_messages[0]
        assert "is not submitted to directly; use -p " in res.user_messages[0]


def test_a_user_may_not_move_a_job_into_one(rt: HookRuntime) -> None:
    res = rt.modify({"partition": "gpu_h100"}, {"partition": "gpu"}, uid=1000)
    assert res.rc == ACCESS and "ranked fallback" in res.user_messages[0]
    # The demo exempts nobody; a site that exempts root (relax runs as root) lets it.
    exempt = parse_site(DEMO_TEXT.replace("modify_exempt_uids = []", "modify_exempt_uids = [0]"),
                        "site.toml")
    assert HookRuntime(render_hook(exempt).text).modify({"partition": "gpu_h100"},
                                                        {"partition": "gpu"}, uid=0).rc == 0
    assert rt.modify({"partition": "cpu"}, {"partition": "gpu"}, uid=1000).rc == 0


# -- wait-for= --------------------------------------------------------------------------------


def test_wait_for_first_submits_to_the_first_models_partition(rt: HookRuntime) -> None:
    res = submit(rt, "#HET class=inference gpus=1 wait-for=first,max=30m")
    assert written(res)["partition"] == "gpu_a100"
    assert written(res)["features"] == "a100|h100"
    assert "wait-for=first,max=1800" in res.fields["admin_comment"]
    assert written(submit(rt, "#HET class=train gpus=1 wait-for=first"))["partition"] == \
        "gpu_h100"


def test_wait_for_without_a_list_is_accepted_with_a_note(rt: HookRuntime) -> None:
    res = submit(rt, "#HET gpus=1 gpu-type=a100 wait-for=first")
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1"}
    assert res.user_messages == ("#HET line 2: wait-for=first has no effect: the job has no "
                                 "ranked GPU list to fall back along here (one model, any "
                                 "model, or its own partition)",)


@pytest.mark.parametrize(("text", "message"), [
    ("gpus=1 wait-for=last", "'wait-for=last': must be 'first' or 'first,max=WAIT'"),
    ("gpus=1 wait-for=first,max=8d", "'wait-for=first,max=8d': max must be a wait of at most "
                                     "one week"),
    ("gpus=1 wait-for=first,max=", "must be 'first' or 'first,max=WAIT'"),
    ("class=inference wait-for=first", "'wait-for=first' needs GPUs"),
])
def test_wait_for_mistakes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("|", r"\|")):
        parse_request(text)


def test_wait_for_round_trips() -> None:
    for text in ("gpus=1 wait-for=first", "gpus=1 class=train wait-for=first,max=600"):
        assert format_request(parse_request(text)) == text
    assert parse_request("gpus=1 wait-for=first,max=2h").wait_for_max_s == 7200


# -- place and explain ------------------------------------------------------------------------


def _gpus_held(model: ClusterModel, nodes: tuple[str, ...]) -> ClusterModel:
    """``model`` with every GPU of ``nodes`` held (by running jobs of unknown end)."""
    from dataclasses import replace

    import numpy as np

    free = np.array(model.state.gpu_free)
    for n in nodes:
        i = model.node_index(n)
        free[int(model.gpu_offsets[i]):int(model.gpu_offsets[i + 1])] = 0
    return model.with_arrays(replace(model.state, gpu_free=free))


def test_place_takes_the_first_partition_that_fits_now(demo: Site) -> None:
    model = ClusterModel.from_site(demo)
    req = resolve(parse_request("gpus=1 class=inference"), demo)
    assert req.partitions == ("gpu_a100", "gpu_h100")
    got = place(model, req)
    assert got.placeable and got.nodes[0].name in ("gpu3", "gpu4")
    assert "partition gpu_a100: the first of gpu_a100,gpu_h100" in got.reason
    # Every A100 busy: Slurm falls back at once, and place says so.
    got = place(_gpus_held(model, ("gpu3", "gpu4")), req)
    assert got.placeable and got.nodes[0].name in ("gpu1", "gpu2"), got.reason
    assert "gpu_a100 cannot start it now, so Slurm falls back at once" in got.reason
    # Every GPU busy: it waits in both partitions.
    got = place(_gpus_held(model, ("gpu1", "gpu2", "gpu3", "gpu4")), req)
    assert not got.placeable and not got.impossible
    assert "waits in gpu_a100,gpu_h100 and takes whichever frees first" in got.reason


def test_place_with_wait_for_first_stays_on_the_first_model(demo: Site) -> None:
    req = resolve(parse_request("gpus=1 class=inference wait-for=first"), demo)
    assert req.partitions == ("gpu_a100",) and req.rank_all == ("gpu_a100", "gpu_h100")
    model = ClusterModel.from_site(demo)
    got = place(model, req)
    assert got.placeable and got.nodes[0].name in ("gpu3", "gpu4")
    assert not place(_gpus_held(model, ("gpu3", "gpu4")), req).placeable
