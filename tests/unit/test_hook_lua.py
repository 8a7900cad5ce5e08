"""The job_submit hook in-process: the rendered job_submit.lua in lupa's Lua 5.1 with the strict
22.05 stand-ins. Every key and every error, each with the exact fields written or the exact
message and code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hetslurm.hook.render import render_hook, set_mode
from hetslurm.hook.standin import FIELDS, CallResult, HookLoadError, HookRuntime
from hetslurm.site import Site, load_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
GRES, FEATURE, NODES, ACCESS, CONFIG, GENERIC = 2072, 2029, 2006, 2002, 2014, -1


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


@pytest.fixture(scope="module")
def rt(demo: Site) -> HookRuntime:
    return HookRuntime(render_hook(demo).text)


def script(*lines: str) -> str:
    return "#!/bin/bash\n" + "".join(line + "\n" for line in lines) + "srun hostname\n"


def submit(rt: HookRuntime, text: str | None = None, **fields: Any) -> CallResult:
    values: dict[str, Any] = {"user_name": "root", **fields}
    if text is not None:
        values["script"] = text
    return rt.submit(values)


def written(res: CallResult) -> dict[str, Any]:
    """Fields written, without the decision record."""
    assert res.ok, res.error
    assert res.rc == 0, res.user_messages
    return {f: v for f, v in res.writes if f != "admin_comment"}


def record(res: CallResult) -> dict[str, Any]:
    value = res.fields["admin_comment"]
    m = re.fullmatch(r"(.*?)hetslurm:(\{[^}]*\})(.*)", value)
    assert m, value
    data: dict[str, Any] = json.loads(m.group(2))
    return data


def rejected(res: CallResult) -> tuple[int, str]:
    assert res.ok, res.error
    assert res.rc != 0, res.writes
    assert res.writes == ()
    assert len(res.user_messages) == 1
    return res.rc or 0, res.user_messages[0]


# No request: nothing happens ----------------------------------------------------------------


def test_job_without_directives_is_untouched(rt: HookRuntime) -> None:
    res = submit(rt, script("#SBATCH -N 2", "# a comment"))
    assert res.accepted and res.writes == () and res.user_messages == () and res.log == ()


def test_directive_after_the_header_is_not_read(rt: HookRuntime) -> None:
    res = submit(rt, "#!/bin/sh\necho hi\n#HET gpus=2\n")
    assert res.accepted and res.writes == ()


def test_blank_and_indented_comment_lines_keep_the_header_open(rt: HookRuntime) -> None:
    res = submit(rt, "#!/bin/sh\n\n   \n  # note\n#HET gpus=1 gpu-type=a100\ntrue\n")
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1"}


def test_hetx_is_not_a_directive(rt: HookRuntime) -> None:
    assert submit(rt, script("#HETEROGENEOUS gpus=2", "#het gpus=2")).writes == ()


# Every key ---------------------------------------------------------------------------------


def test_gpus_one_model_is_typed_gres(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=2 gpu-type=h100"))
    assert written(res) == {"tres_per_node": "gres:gpu:h100:2"}
    assert record(res) == {
        "v": 1, "rules": record(res)["rules"], "mode": "enforce", "src": "script",
        "outcome": "rewrite", "gpu": "h100", "set": "tres_per_node",
        "req": "gpus=2 gpu-type=h100",
    }


def test_gpu_type_list_is_or_of_features(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=2 gpu-type=a100|h100"))
    # ... and the default partition's per-model partitions in the list's order (ranked
    # fallback, docs/fallback.md).
    assert written(res) == {"tres_per_node": "gres:gpu:2", "features": "a100|h100",
                            "partition": "batch_a100,batch_h100"}


def test_gpus_without_model_is_untyped(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET gpus=3"))) == {"tres_per_node": "gres:gpu:3"}


def test_gpu_type_any(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 gpu-type=any class=train"))
    assert written(res) == {"tres_per_node": "gres:gpu:1", "partition": "gpu"}


def test_gpus_per_node_and_nodes(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET nodes=2 gpus-per-node=4 gpu-type=a100"))
    assert written(res) == {"tres_per_node": "gres:gpu:a100:4", "min_nodes": 2, "max_nodes": 2}


def test_gpus_per_job_split_over_nodes(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET nodes=2 gpus=8"))
    assert written(res) == {"tres_per_node": "gres:gpu:4", "min_nodes": 2, "max_nodes": 2}


def test_gpus_zero_is_a_cpu_job(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET gpus=0 class=train"))) == {"partition": "gpu"}


def test_min_gpu_mem_filters_site_models(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 min-gpu-mem=60G"))
    assert written(res) == {"tres_per_node": "gres:gpu:h100:1"}
    res = submit(rt, script("#HET gpus=1 min-gpu-mem=40G"))
    assert written(res) == {"tres_per_node": "gres:gpu:1", "features": "h100|a100",
                            "partition": "batch_h100,batch_a100"}


def test_fpga_keys(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET fpga=u280:2"))) == {"tres_per_node": "gres:fpga:u280:2"}
    assert written(submit(rt, script("#HET fpga=1"))) == {"tres_per_node": "gres:fpga:1"}
    assert written(submit(rt, script("#HET fpga=2 class=stream"))) == {
        "tres_per_node": "gres:fpga:u280:2", "partition": "fpga"}


def test_gpu_and_fpga_in_one_job(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 gpu-type=h100 fpga=u280"))
    assert written(res) == {"tres_per_node": "gres:gpu:h100:1,gres:fpga:u280:1"}


def test_class_train(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=2 class=train"))
    assert written(res) == {"tres_per_node": "gres:gpu:2", "features": "h100|a100",
                            "partition": "gpu_h100,gpu_a100"}
    assert record(res)["class"] == "train"


def test_class_inference_keeps_its_order_in_the_record(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=2 class=inference"))
    assert written(res)["features"] == "a100|h100"
    assert record(res)["gpu"] == "a100|h100"


def test_class_alone_asks_for_no_gpu(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET class=train"))) == {"partition": "gpu"}


def test_explicit_gpu_type_beats_class(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=2 class=train gpu-type=a100"))
    assert written(res) == {"tres_per_node": "gres:gpu:a100:2", "partition": "gpu"}


def test_cpu_class(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET class=io"))) == {"features": "cpu", "partition": "cpu"}


def test_cores_and_mem(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET cores=4 mem=2G"))
    assert written(res) == {"pn_min_cpus": 4, "min_mem_per_node": 2048}


def test_locality_nvlink_required_sets_enforce_binding(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=4 gpu-type=h100 locality=nvlink:required"),
                 bitflags=503316480)
    assert written(res) == {"tres_per_node": "gres:gpu:h100:4", "bitflags": 503316480 + 16}


def test_locality_preferred_writes_nothing_extra(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=4 gpu-type=h100 locality=nvlink,numa"))
    assert written(res) == {"tres_per_node": "gres:gpu:h100:4"}


def test_binding_already_set_is_not_added_twice(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 gpu-type=h100 locality=numa:required"), bitflags=16)
    assert written(res) == {"tres_per_node": "gres:gpu:h100:1"}


def test_numa_required_cpu_job(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET cores=4 locality=numa:required"))
    assert written(res) == {"pn_min_cpus": 4, "sockets_per_node": 1, "cores_per_socket": 4}


def test_switch_locality(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET nodes=2 locality=switch:required switch-wait=10m"))
    assert written(res) == {"min_nodes": 2, "max_nodes": 2, "req_switch": 1, "wait4switch": 600}
    res = submit(rt, script("#HET nodes=3 locality=switch"))
    assert written(res)["wait4switch"] == 300  # the site's default


def test_switch_on_one_node_is_a_note(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET locality=switch"))
    assert written(res) == {}
    assert res.user_messages == (
        "#HET line 2: switch: a one-node job is always under one switch",)


def test_priority_high_qos_for_an_allowed_user(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET priority=high"))) == {"qos": "high"}


def test_priority_low_and_normal(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET priority=low"))) == {"qos": "low"}
    assert written(submit(rt, script("#HET priority=normal"))) == {}


def test_energy_low_narrows_to_site_models(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 class=train energy=low"))
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1", "partition": "gpu"}
    assert record(res)["energy"] == "low"


def test_no_requeue(rt: HookRuntime) -> None:
    assert written(submit(rt, script("#HET no-requeue"))) == {"requeue": 0}


def test_on_idle_is_recorded_only(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET on-idle=notify"))
    assert written(res) == {}
    assert record(res)["on_idle"] == "notify"


def test_directives_over_several_lines(rt: HookRuntime) -> None:
    res = submit(rt, script("#SBATCH -t 10", "#HET gpus=2", "#HET   gpu-type=a100", "#HET"))
    assert written(res) == {"tres_per_node": "gres:gpu:a100:2"}


# srun / salloc: the comment ------------------------------------------------------------------


def test_comment_request(rt: HookRuntime) -> None:
    res = submit(rt, None, comment="het: gpus=1 gpu-type=a100")
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1"}
    assert record(res)["src"] == "comment"


def test_ordinary_comment_is_ignored(rt: HookRuntime) -> None:
    assert submit(rt, None, comment="my run 7").writes == ()


# Explicit options win -------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value"), [
    ("tres_per_node", "gres:gpu:2"), ("tres_per_job", "gres:gpu:2"),
    ("tres_per_task", "gres:gpu:2"), ("tres_per_socket", "gres:gpu:2"),
])
def test_every_gpu_syntax_gets_the_class(rt: HookRuntime, field: str, value: str) -> None:
    res = submit(rt, script("#HET class=train gpu-type=a100"), **{field: value})
    assert written(res) == {field: "gres:gpu:a100:2", "partition": "gpu"}
    res = submit(rt, script("#HET class=train"), **{field: value})
    assert written(res) == {"features": "h100|a100", "partition": "gpu_h100,gpu_a100"}


def test_gres_gpu_zero_is_a_cpu_job(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET class=io"), tres_per_node="gres:gpu:0")
    assert written(res) == {"features": "cpu", "partition": "cpu"}


def test_explicit_gpu_count_wins_and_user_is_told(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=4 gpu-type=h100"), tres_per_job="gres:gpu:2")
    assert written(res) == {"tres_per_job": "gres:gpu:h100:2"}
    assert res.user_messages == (
        "#HET line 2: gpus ignored: the job asks for GPUs with --gpus (gres:gpu:2)",)
    assert record(res)["kept"] == "tres_per_job"


def test_explicit_gpu_type_wins(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpu-type=h100"), tres_per_node="gres:gpu:a100:1")
    assert written(res) == {}
    assert res.user_messages == (
        "#HET line 2: gpu-type ignored: the job names GPU type 'a100' with --gres",)


def test_explicit_partition_wins(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 class=train"), partition="batch")
    assert written(res) == {"tres_per_node": "gres:gpu:1", "features": "h100|a100"}
    assert res.user_messages == (
        "#HET line 2: --partition=batch kept over class=train's partition gpu",)


def test_explicit_qos_wins(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET priority=high"), qos="normal")
    assert written(res) == {}
    assert res.user_messages == ("#HET line 2: --qos=normal kept over high",)


def test_explicit_constraint_and_a_list(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 gpu-type=h100|a100"), features="nvlink")
    # The per-model partitions still hold the job to its models, in its order.
    assert written(res) == {"tres_per_node": "gres:gpu:1",
                            "partition": "batch_h100,batch_a100"}
    assert res.user_messages == (
        "#HET line 2: --constraint=nvlink kept; 'h100|a100' not added: add it to your "
        "--constraint or drop --constraint",)


def test_explicit_and_constraint_is_extended_with_cpu(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET class=io"), features="bigmem")
    assert written(res) == {"features": "bigmem&cpu", "partition": "cpu"}


def test_explicit_nodes_cores_mem_requeue_switch(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET nodes=4 cores=2 mem=1G no-requeue locality=switch"),
                 min_nodes=2, max_nodes=2, num_tasks=4, min_mem_per_node=100, requeue=1,
                 req_switch=1, wait4switch=60)
    assert written(res) == {}
    assert res.user_messages == (
        "#HET line 2: nodes ignored: the job asks for -N 2",
        "#HET line 2: cores ignored: the job sets its own task layout (--ntasks, "
        "--cpus-per-task, --ntasks-per-node or --mincpus)",
        "#HET line 2: mem ignored: the job sets --mem or --mem-per-cpu",
        "#HET line 2: the job's --switches kept",
        "#HET line 2: no-requeue ignored: the job asks for --requeue",
    )


def test_disable_binding_wins(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1 gpu-type=h100 locality=nvlink:required"),
                 bitflags=524288)
    assert written(res) == {"tres_per_node": "gres:gpu:h100:1"}
    assert res.user_messages == (
        "#HET line 2: --gres-flags=disable-binding kept; locality not enforced",)


# Every error: exact message and code ---------------------------------------------------------


@pytest.mark.parametrize(("lines", "code", "message"), [
    (["#HET gpu=2"], GENERIC,
     "#HET line 2: 'gpu=2': unknown key 'gpu' (did you mean 'gpus'?); keys: nodes, gpus, "
     "gpus-per-node, gpu-type, min-gpu-mem, fpga, cores, mem, locality, switch-wait, class, "
     "priority, energy, no-requeue, on-idle, wait-for"),
    (["#HET gpus=1000000"], GRES,
     "#HET line 2: 'gpus=1000000': GPUs per job must be a whole number from 0 to 65536"),
    (["#HET nodes=0"], NODES,
     "#HET line 2: 'nodes=0': nodes must be a whole number from 1 to 65536"),
    (["#HET gpus=1", "#HET mem=1.5G"], CONFIG,
     "#HET line 3: 'mem=1.5G': mem (per node) must be a whole size from 1M to 64T, e.g. 16G, "
     "512M or 16384 (MiB)"),
    (["#HET gpus=2", "#SBATCH -N1", "#HET gpus=3"], GRES,
     "#HET line 4: 'gpus=3': key 'gpus' is given twice (first as 'gpus=2')"),
    (["#HET gpu-type=h100"], GRES,
     "#HET line 2: 'gpu-type=h100' needs GPUs: add gpus=N or gpus-per-node=N"),
    (["#HET locality=nvlnk"], CONFIG,
     "#HET line 2: 'locality=nvlnk': unknown locality level 'nvlnk' (did you mean 'nvlink'?); "
     "levels: nvlink, numa, switch"),
    (["#HET priority=urgent"], 2066,
     "#HET line 2: 'priority=urgent': must be one of high, normal, low"),
    (["#HET class=tran"], FEATURE,
     "#HET line 2: class=tran: site 'hetdemo' has no such class (did you mean 'train'?); "
     "classes: inference, io, stream, train"),
    (["#HET gpus=1 gpu-type=a10"], GRES,
     "#HET line 2: gpu-type: GPU model 'a10' is not in site 'hetdemo' (did you mean 'a100'?); "
     "its GPU models: h100, a100"),
    (["#HET fpga=vu9p:1"], GRES,
     "#HET line 2: fpga: FPGA model 'vu9p' is not in site 'hetdemo'; its FPGA models: u280"),
    (["#HET class=io gpus=1"], CONFIG,
     "#HET line 2: class=io runs on CPU-only nodes, but the job asks for GPUs or FPGAs; drop "
     "them or choose another class (inference, io, stream, train)"),
    (["#HET gpus=1 gpu-type=a100 min-gpu-mem=60G"], GRES,
     "#HET line 2: min-gpu-mem=61440M: gpu-type a100 has 40960 MiB; drop it or lower "
     "min-gpu-mem"),
    (["#HET gpus=1 min-gpu-mem=1T"], GRES,
     "#HET line 2: min-gpu-mem=1048576M: no GPU model of site 'hetdemo' has that much memory"),
    (["#HET gpus=1 gpu-type=h100|a100 fpga=u280"], GENERIC, None),  # accepted: see below
])
def test_errors(rt: HookRuntime, lines: list[str], code: int, message: str | None) -> None:
    res = submit(rt, script(*lines))
    if message is None:
        assert res.accepted
        return
    assert rejected(res) == (code, message)


def test_two_model_lists_cannot_be_combined(demo: Site) -> None:
    # The demo site has one FPGA model; give the site a second one through the rules.
    from dataclasses import replace

    from hetslurm.site.schema import DeviceGroup

    classes = dict(demo.node_classes)
    classes["vu9px1"] = classes["u280x2"].model_copy(
        update={"fpgas": DeviceGroup(model="vu9p", count=1)})
    site = replace(demo, node_classes=classes)
    rt2 = HookRuntime(render_hook(site).text)
    res = submit(rt2, script("#HET gpus=1 gpu-type=h100|a100 fpga=u280|vu9p"))
    assert rejected(res) == (FEATURE, "#HET line 2: a GPU model list and an FPGA model list "
                             "cannot both be enforced in one job on Slurm 22.05; name one model "
                             "for one of them")


def test_priority_high_refused_for_others(rt: HookRuntime) -> None:
    res = rt.submit({"script": script("#HET priority=high"), "user_name": "alice",
                     "account": "physics"})
    assert rejected(res) == (ACCESS, "#HET line 2: priority=high is not allowed for user alice "
                             "(site policy); use priority=normal or ask the site's admins")


def test_script_and_comment_both(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1"), comment="het: gpus=1")
    assert rejected(res) == (GENERIC, "#HET line 2: the job has #HET lines and a --comment "
                             "starting with 'het:'; give the request once")


def test_comment_error_names_the_comment(rt: HookRuntime) -> None:
    res = submit(rt, None, comment="het: gpus=two")
    assert rejected(res) == (GRES, "--comment het:: 'gpus=two': GPUs per job must be a whole "
                             "number from 0 to 65536")


def test_parse_bound(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET " + "x" * 2000))
    assert rejected(res) == (GENERIC, "#HET line 2: the #HET lines hold more than 1024 bytes of "
                             "request (the size of a Slurm comment); shorten them")
    res = submit(rt, script(*(["#HET energy=low"] * 65)))
    assert rejected(res) == (GENERIC, "#HET line 66: more than 64 #HET lines; a request has at "
                             "most 32 words, so put several on one line")
    res = submit(rt, script("#HET " + " ".join(["no-requeue"] * 40)))
    assert rejected(res) == (GENERIC, "#HET line 2: the request has more than 32 words; each key "
                             "may appear once (16 keys exist)")


def test_percent_in_a_directive_does_not_break_logging(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=%s%d%"))
    assert rejected(res)[1].startswith("#HET line 2: 'gpus=%s%d%'")
    assert all(level != "error" for level, _ in res.log)


def test_unicode_is_shown_as_question_marks(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=\u00e9\u00e9"))
    msg = rejected(res)[1]
    assert msg.isascii() and "'gpus=????'" in msg


# Modes ---------------------------------------------------------------------------------------


def test_shadow_mode_changes_nothing(demo: Site) -> None:
    rt = HookRuntime(render_hook(demo, mode="shadow").text)
    res = submit(rt, script("#HET gpus=2 class=train"))
    assert res.accepted and res.writes == () and res.user_messages == ()
    assert res.log[0][0] == "info" and res.log[0][1].startswith("hetslurm shadow: ")
    assert "features=h100|a100" in res.log[0][1]
    res = submit(rt, script("#HET gpu=2"))
    assert res.accepted and res.writes == ()
    assert "reject code=-1" in res.log[0][1]


def test_kill_switch(demo: Site) -> None:
    rt = HookRuntime(set_mode(render_hook(demo).text, "off"))
    for text in (script("#HET gpus=2 class=train"), script("#HET gpu=2")):
        res = submit(rt, text)
        assert res.accepted and res.writes == () and res.log == ()


# Failing open, staging, strictness ------------------------------------------------------------


def test_internal_error_fails_open_and_writes_nothing(demo: Site) -> None:
    # A bug in the decision (here: a nil where the request should be) must not reach the user.
    text = render_hook(demo).text.replace("local request = canonical(req, synthetic_gpus)",
                                          "local request = canonical(nil, synthetic_gpus)")
    rt = HookRuntime(text)
    res = submit(rt, script("#HET gpus=1"))
    assert res.accepted and res.writes == () and res.user_messages == ()
    assert res.log[0][0] == "error"
    assert res.log[0][1].startswith("hetslurm: internal error, job left unchanged: ")


@pytest.mark.parametrize(("directive", "staged"), [
    # the general path
    ("#HET gpus=1 class=train priority=normal",
     'stage(d, "partition", r.partitions, jpart)'),
    # the fast path (class and a GPU count only)
    ("#HET gpus=1 class=train", 'stage(d, "partition", partition, job_partition)'),
])
def test_failed_write_is_rolled_back(demo: Site, directive: str, staged: str) -> None:
    # Make apply() fail half-way: the stand-in refuses the write of a field 22.05 cannot set.
    text = render_hook(demo).text
    assert text.count(staged) == 1
    rt = HookRuntime(text.replace(staged, staged + ' stage(d, "mcs_label", "x")'))
    res = submit(rt, script(directive))
    assert res.accepted
    assert res.log[-1][0] == "error"
    assert "could not write the decision, job left unchanged" in res.log[-1][1]
    # Everything written before the failure was restored ("" unsets a string in 22.05).
    assert res.fields == {"tres_per_node": "", "features": "", "partition": ""}


def test_no_state_between_submissions(demo: Site) -> None:
    jobs = [script("#HET gpus=2 class=train"), script("#HET gpu=1"), script("#HET class=io"),
            script("#HET nodes=2 locality=switch"), script("true")]
    a = HookRuntime(render_hook(demo).text)
    b = HookRuntime(render_hook(demo).text)
    forward = [submit(a, j) for j in jobs * 3]
    backward = [submit(b, j) for j in reversed(jobs * 3)]
    assert forward == list(reversed(backward))


def test_standin_refuses_fields_2205_cannot_set(rt: HookRuntime) -> None:
    settable = {k for k, v in FIELDS.items() if v["set"]}  # the real setter's list
    assert "mcs_label" not in settable and "user_id" not in settable
    assert {"features", "tres_per_node", "admin_comment", "req_switch", "wait4switch",
            "prefer", "bitflags", "min_mem_per_node"} <= settable
    bad = render_hook(load_site(ROOT / "site-configs" / "demo.toml")).text.replace(
        "local MODE =", 'leaked = 1\nlocal MODE =', 1)
    with pytest.raises(HookLoadError, match="wrote the global leaked"):
        HookRuntime(bad)
    with pytest.raises(HookLoadError, match="does not define"):
        HookRuntime("return slurm.SUCCESS")
    with pytest.raises(HookLoadError, match="returned -1"):
        HookRuntime("function slurm_job_submit() end function slurm_job_modify() end "
                    "return slurm.ERROR")
    with pytest.raises(HookLoadError, match="expected"):
        HookRuntime("function slurm_job_submit(")
    job = rt.job({"user_name": "root"})
    res = rt.submit(job)
    assert res.accepted


def test_hook_may_not_read_unknown_globals_or_do_io(demo: Site) -> None:
    text = render_hook(demo).text
    for bad in ("os.time()", "io.write('x')", "require('posix')", "loadstring('x=1')"):
        with pytest.raises(HookLoadError, match="unknown global"):
            HookRuntime(text.replace("local MODE =", f"{bad}\nlocal MODE =", 1))


def test_field_table_matches_the_probe_data() -> None:
    # Every field in the table has a kind; aliases point at a real field.
    for name, spec in FIELDS.items():
        assert spec["kind"] in {"str", "u8", "u16", "u32", "u64", "time", "bool", "mem"}, name
        if "alias" in spec:
            assert spec["alias"] in FIELDS


#: Errno values of 22.05's slurm_errno.h the hook falls back to (not exported to Lua in 22.05).
ERRNO_2205 = {
    "ESLURM_INVALID_GRES": 2072,
    "ESLURM_INVALID_FEATURE": 2029,
    "ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE": 2014,
    "ESLURM_INVALID_QOS": 2066,
}


def test_errno_fallbacks_match_the_installed_header() -> None:
    header = Path("/usr/include/slurm/slurm_errno.h")
    if not header.exists():
        pytest.skip("libslurm-dev not installed")
    values = _enum_values(header.read_text())
    from hetslurm.hook.standin import CONSTANTS

    for name, value in ERRNO_2205.items():
        assert values[name] == value, name
    for name, value in CONSTANTS.items():
        if name.startswith("ESLURM_"):
            assert values[name] == value, name
    lua = (ROOT / "job_submit" / "hethook.lua").read_text()
    for name, value in ERRNO_2205.items():
        assert f"slurm.{name} or {value}" in lua


def _enum_values(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    current = -1
    body = text[text.index("enum {"):]
    for m in re.finditer(r"^\s*(E\w+|SLURM_\w+)\s*(?:=\s*(\d+))?\s*,", body, re.M):
        current = int(m.group(2)) if m.group(2) else current + 1
        values[m.group(1)] = current
    return values


# Modify: a user cannot undo the rewrite ------------------------------------------------------


def _record_of(rt: HookRuntime, lines: str) -> dict[str, Any]:
    res = submit(rt, script(lines))
    return dict(res.writes)


def test_modify_refuses_changing_written_fields(rt: HookRuntime) -> None:
    rec = _record_of(rt, "#HET gpus=2 class=train")
    res = rt.modify({"features": "a100"}, rec, uid=1000)
    assert res.ok and res.rc == ACCESS
    assert res.user_messages == ("hetslurm: features was set from this job's #HET request; "
                                 "resubmit with a new request to change it",)
    res = rt.modify({"tres_per_node": "gres:gpu:8"}, rec, uid=1000)
    assert res.rc == ACCESS
    res = rt.modify({"partition": "batch"}, rec, uid=1000)
    assert res.rc == ACCESS


def test_modify_allows_other_fields_and_same_values(rt: HookRuntime) -> None:
    rec = _record_of(rt, "#HET gpus=2 class=train")
    assert rt.modify({"time_limit": 60}, rec, uid=1000).rc == 0
    assert rt.modify({"features": "h100|a100"}, rec, uid=1000).rc == 0
    assert rt.modify({"bitflags": 503316480}, rec, uid=1000).rc == 0


def test_modify_refuses_a_new_het_comment(rt: HookRuntime) -> None:
    res = rt.modify({"comment": "het: gpus=8"}, {"comment": "x"}, uid=1000)
    assert res.rc == ACCESS


def test_modify_exempt_uid(demo: Site) -> None:
    from hetslurm.site.schema import HookPolicy

    sections = dict(demo.sections)
    sections["hook"] = HookPolicy(modify_exempt_uids=(0,))
    from dataclasses import replace

    rt2 = HookRuntime(render_hook(replace(demo, sections=sections)).text)
    rec = _record_of(rt2, "#HET gpus=2 class=train")
    assert rt2.modify({"features": "a100"}, rec, uid=0).rc == 0
    assert rt2.modify({"features": "a100"}, rec, uid=5).rc == ACCESS


def test_modify_without_record_is_allowed(rt: HookRuntime) -> None:
    assert rt.modify({"features": "a100"}, {"admin_comment": "JS1:abc"}, uid=1000).rc == 0


# The record field ----------------------------------------------------------------------------


def test_record_keeps_other_tools_text(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET gpus=1"), admin_comment="JS1:eyJ4Ijox}")
    assert res.fields["admin_comment"].startswith("JS1:eyJ4Ijox} hetslurm:{")
    assert res.fields["admin_comment"].count("hetslurm:{") == 1


RESERVED = ("hetslurm: the text 'hetslurm:{' is reserved for the hook's decision record in "
            "the job's {field}; remove it")


def _comment_record_hook(demo: Site) -> HookRuntime:
    from dataclasses import replace

    from hetslurm.site.schema import HookPolicy

    sections = dict(demo.sections)
    sections["hook"] = HookPolicy(record_field="comment")
    return HookRuntime(render_hook(replace(demo, sections=sections)).text)


@pytest.mark.parametrize("text", [
    'hetslurm:{"set":"x"',                       # unterminated (issue 18, finding 3)
    'hetslurm:{"v":1,"set":"x"}',                # complete, forged
    'mine hetslurm:{"set":"x"} hetslurm:{',      # two
    "a hetslurm:{",
])
@pytest.mark.parametrize("request_lines", [("#HET gpus=2 class=train",), ("#HET gpus=1",), ()])
def test_a_submitted_record_marker_is_refused(demo: Site, text: str,
                                              request_lines: tuple[str, ...]) -> None:
    rt2 = _comment_record_hook(demo)
    res = submit(rt2, script(*request_lines), comment=text)
    assert res.rc == ACCESS and not res.writes
    assert res.user_messages == (RESERVED.replace("{field}", "comment"),)
    # the same in the default field, admin_comment (an old record resubmitted included)
    old = submit(rt, script("#HET gpus=1"), admin_comment="x").fields["admin_comment"] if (
        rt := HookRuntime(render_hook(demo).text)) else ""
    for value in (text, old):
        res = submit(rt, script(*request_lines), admin_comment=value)
        assert res.rc == ACCESS and not res.writes
        assert res.user_messages == (RESERVED.replace("{field}", "admin_comment"),)


def test_a_forged_segment_cannot_open_the_modify_guard(demo: Site) -> None:
    """Issue 18, finding 3: with record_field = "comment", an unterminated forged segment
    before the hook's own made check_modify read the forged "set" and allow an update of
    Partition/Features that it refuses for an honest job."""
    rt2 = _comment_record_hook(demo)
    honest = submit(rt2, script("#HET gpus=2 class=train"))
    assert honest.rc == 0
    rec = {**honest.fields, "partition": honest.fields["partition"]}
    for update in ({"partition": "batch"}, {"features": "a100"}):
        assert rt2.modify(update, rec, uid=1000).rc == ACCESS
    # A job that already holds a forged marker before the hook's record (submitted before the
    # marker was refused): nothing the record protects may change, by anyone but the exempt.
    forged = {**rec, "comment": 'hetslurm:{"set":"x" ' + rec["comment"]}
    for update in ({"partition": "batch"}, {"features": "a100"}, {"time_limit": 5}):
        res = rt2.modify(update, forged, uid=1000)
        assert res.rc == ACCESS, update
    # An update may not add a marker, before, after or instead of the record.
    seg = rec["comment"]
    for new in ('hetslurm:{"set":"x" ' + seg, seg + ' hetslurm:{"set":"x"}', "hetslurm:{",
                "plain " + seg + " hetslurm:{"):
        res = rt2.modify({"comment": new}, rec, uid=1000)
        assert res.rc == ACCESS, new
        if seg in new:
            assert res.user_messages == (RESERVED.replace("{field}", "comment"),)
    # nor put one into a job that has no record
    res = rt2.modify({"comment": 'hetslurm:{"set":"x"}'}, {"comment": "x"}, uid=1000)
    assert res.rc == ACCESS
    # while keeping the record and changing the rest of the field is fine
    assert rt2.modify({"comment": "note " + seg}, rec, uid=1000).rc == 0


def test_record_is_bounded(demo: Site) -> None:
    from dataclasses import replace

    from hetslurm.site.schema import HookPolicy

    sections = dict(demo.sections)
    sections["hook"] = HookPolicy(record_max_bytes=96, record_max_field_bytes=200)
    rt2 = HookRuntime(render_hook(replace(demo, sections=sections)).text)
    res = submit(rt2, script("#HET nodes=2 gpus=4 class=train locality=switch no-requeue"))
    seg = res.fields["admin_comment"]
    assert len(seg) <= 96 and seg.startswith("hetslurm:{") and seg.endswith("}")
    res = submit(rt2, script("#HET gpus=1"), admin_comment="x" * 190)
    assert "admin_comment" not in res.fields  # would pass the field bound: not written
    assert res.fields["tres_per_node"] == "gres:gpu:1"


def test_record_to_comment_and_none(demo: Site) -> None:
    from dataclasses import replace

    from hetslurm.site.schema import HookPolicy

    for field, expect in (("comment", "comment"), ("none", None)):
        sections = dict(demo.sections)
        sections["hook"] = HookPolicy(record_field=field)
        rt2 = HookRuntime(render_hook(replace(demo, sections=sections)).text)
        res = submit(rt2, script("#HET gpus=1"))
        names = {f for f, _ in res.writes}
        assert names == ({"tres_per_node", expect} if expect else {"tres_per_node"})


# Chaining a site's own job_submit.lua --------------------------------------------------------

SITE_LOGIC = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  if job_desc.account == "blocked" then
    slurm.log_user("account blocked by site policy")
    return slurm.ERROR
  end
  if job_desc.time_limit == slurm.NO_VAL then
    job_desc.time_limit = 60
  end
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
return slurm.SUCCESS
"""


@pytest.mark.parametrize("where", ["before", "after"])
def test_chained_site_logic(demo: Site, where: str) -> None:
    kw = {f"chain_{where}": SITE_LOGIC}
    rt2 = HookRuntime(render_hook(demo, **kw).text)
    res = submit(rt2, script("#HET gpus=1 gpu-type=a100"))
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1", "time_limit": 60}
    order = [f for f, _ in res.writes]
    assert order.index("time_limit") == (0 if where == "before" else len(order) - 1)
    res = submit(rt2, script("#HET gpus=1"), account="blocked")
    if where == "before":
        assert res.rc == -1 and res.writes == ()
    else:
        assert res.rc == -1 and res.user_messages == ("account blocked by site policy",)


def test_het_job_components(rt: HookRuntime) -> None:
    text = script("#HET class=io", "#SBATCH hetjob", "#SBATCH --comment=\"het: gpus=1\"")
    # Component 0 carries the script: its #HET lines apply to it alone.
    assert written(submit(rt, text, het_job_offset=0)) == {"features": "cpu", "partition": "cpu"}
    # Later components carry no script; their request is their own comment.
    res = submit(rt, None, comment="het: gpus=1 gpu-type=a100", het_job_offset=1)
    assert written(res) == {"tres_per_node": "gres:gpu:a100:1"}
    res = submit(rt, script("#SBATCH hetjob", "#HET gpus=1"))
    assert rejected(res) == (GENERIC, "#HET line 3: #HET lines after '#SBATCH hetjob' (line 2) "
                             "would apply to the first component; give a later component its "
                             "request with #SBATCH --comment=\"het: ...\"")


def test_array_is_one_decision(rt: HookRuntime) -> None:
    res = submit(rt, script("#HET class=io"), array_inx="0-99")
    assert written(res) == {"features": "cpu", "partition": "cpu"}
