"""The hook's fast path (hethook.lua fast_decide) decides exactly as the general path does.

The fast path takes "class=NAME" alone or with "gpus=N" for a job that sets none of the fields
the general path weighs against a request; everything else, every mistake included, goes to
the general path. Here the same rendered hook runs twice: as rendered, and with the fast path
switched off; every job of the fast path's domain and of its edges must get the same call
result (fields written, record, messages, log) from both. A third copy raises when the fast
path answers, to show which jobs it really takes.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.site import Site, load_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
FAST_CALL = "local fast = fast_decide(job, rules, hetreq, source, text)"

# A site with every shape of class the fast path meets: two GPU models and a QOS, one GPU model
# and no partition, GPU and FPGA models together, FPGA only, CPU only.
EXTRA_CLASSES = '''
[classes.solo]
description = "one GPU model, a QOS, no partition"
devices = ["a100"]
qos = "low"
mem_per_node = "6G"

[classes.mixed]
description = "GPU and FPGA models"
devices = ["u280", "h100"]
partition = "gpu"
'''


def _site(tmp: Path, record_field: str) -> Site:
    text = (ROOT / "site-configs" / "demo.toml").read_text()
    text = text.replace('partition = "gpu"\n', 'partition = "gpu"\nqos = "normal"\n', 1)
    text = text.replace("[classes.inference]", EXTRA_CLASSES + "\n[classes.inference]", 1)
    text = text.replace('record_field = "admin_comment"', f'record_field = "{record_field}"')
    path = tmp / f"site-{record_field}.toml"
    path.write_text(text)
    return load_site(path)


def _runtimes(site: Site) -> tuple[HookRuntime, HookRuntime, HookRuntime]:
    text = render_hook(site, mode="enforce").text
    assert text.count(FAST_CALL) == 1
    general = text.replace(FAST_CALL, "local fast = nil")
    marked = text.replace(FAST_CALL, FAST_CALL + ' if fast then error("FAST PATH") end')
    return HookRuntime(text), HookRuntime(general), HookRuntime(marked)


CLASSES = ["train", "inference", "solo", "mixed", "stream", "io", "nosuch", "Train", "tr-ain"]
COUNTS = [None, "0", "1", "2", "07", "8", "16", "63", "64", "65", "99", "100", "1x", "-1", ""]
SEPARATORS = [" ", "  ", "\t", " \r"]
JOB_OPTIONS: list[dict[str, Any]] = [
    {}, {"tres_per_node": "gres:gpu:2"}, {"tres_per_job": "gres:gpu:a100:1"},
    {"tres_per_task": "gres:gpu:1"}, {"tres_per_socket": "gres:gpu:1"},
    {"tres_per_node": "gres:fpga:1"}, {"features": "h100"}, {"features": ""},
    {"partition": "cpu"}, {"partition": ""}, {"qos": "high"}, {"qos": ""},
    {"admin_comment": "jobstats:{x}"}, {"comment": "keep me"}, {"min_nodes": 2},
    {"min_mem_per_node": 2048}, {"min_mem_per_cpu": 512}, {"mem_per_tres": "gres/gpu:1024"},
]


def _requests() -> list[str]:
    out = []
    for cls, count, sep in itertools.product(CLASSES, COUNTS, SEPARATORS):
        if count is None:
            out.append(f"class={cls}{sep}")
        else:
            out.append(f"class={cls}{sep}gpus={count}")
            out.append(f"{sep}gpus={count}{sep}class={cls}")
    # just outside the domain: other keys, repeats, other spellings
    out += ["gpus=2 class=train priority=normal", "class=train class=train", "gpus=2",
            "class=train gpus=2 gpus=2", "class= train", "class=train,gpus=2",
            "gpus=2 gpu-type=a100 class=train", "class=train energy=low gpus=2"]
    return out


@pytest.mark.parametrize("record_field", ["admin_comment", "comment", "none"])
def test_fast_path_decides_as_the_general_path(tmp_path: Path, record_field: str) -> None:
    fast, general, marked = _runtimes(_site(tmp_path, record_field))
    taken = 0
    calls = 0
    for request, options in itertools.product(_requests(), JOB_OPTIONS):
        for source in ("script", "comment"):
            values: dict[str, Any] = {"user_name": "root", **options}
            if source == "script":
                values["script"] = f"#!/bin/sh\n#HET {request}\ntrue\n"
            elif "comment" in options:
                continue  # the job's own comment is the option being tried
            else:
                values["comment"] = "het: " + request
            want = general.submit(values)
            got = fast.submit(values)
            assert got == want, (request, options, source)
            if any("FAST PATH" in line for _, line in marked.submit(values).log):
                taken += 1
            calls += 1
    # The fast path answers for a real share of these jobs, not for none or all of them.
    assert 0.1 * calls < taken < 0.6 * calls, (taken, calls)


def test_fast_path_takes_the_common_request(tmp_path: Path) -> None:
    fast, general, marked = _runtimes(_site(tmp_path, "admin_comment"))
    job = {"user_name": "root", "script": "#!/bin/sh\n#HET gpus=2 class=train\ntrue\n"}
    assert any("FAST PATH" in line for _, line in marked.submit(job).log)
    res = fast.submit(job)
    assert res == general.submit(job)
    assert dict(res.writes[:4]) == {"tres_per_node": "gres:gpu:2", "features": "h100|a100",
                                    "partition": "gpu_h100,gpu_a100", "qos": "normal"}
    # A mistake is never the fast path's: the general path's message comes back.
    bad = {"user_name": "root", "script": "#!/bin/sh\n#HET gpus=2 class=nosuch\ntrue\n"}
    assert not any("FAST PATH" in line for _, line in marked.submit(bad).log)
    assert not fast.submit(bad).accepted


def test_class_memory_only_when_the_job_asks_for_none(tmp_path: Path) -> None:
    """[classes.solo] mem_per_node = "6G": both paths give a job of the class that names no
    memory min_mem_per_node = 6144 MiB; mem= in the request, --mem, --mem-per-cpu and
    --mem-per-gpu each win, and a class without the field writes no memory."""
    fast, general, _ = _runtimes(_site(tmp_path, "admin_comment"))

    def mem(directive: str, **options: Any) -> Any:
        job = {"user_name": "root", "script": f"#!/bin/sh\n#HET {directive}\ntrue\n", **options}
        res = fast.submit(job)
        assert res == general.submit(job)
        assert res.accepted, res
        return dict(res.writes).get("min_mem_per_node")

    assert mem("class=solo") == 6144
    assert mem("gpus=1 class=solo") == 6144
    assert mem("class=solo priority=normal") == 6144  # the general path
    assert mem("class=solo mem=2G") == 2048
    assert mem("class=solo", min_mem_per_node=1000) is None
    assert mem("class=solo", min_mem_per_cpu=512) is None
    assert mem("gpus=1 class=solo", mem_per_tres="gres/gpu:1024") is None
    assert mem("class=train") is None
