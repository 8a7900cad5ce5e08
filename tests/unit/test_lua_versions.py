"""The request grammar and the hook under every Lua the job_submit/lua plugin may link.

Debian's plugin links Lua 5.1; RPM builds link 5.3 or 5.4, where ``/`` makes floats, the plugin
hands numbers over as floats (``lua_pushnumber``), ``tostring(4.0)`` is ``"4.0"`` (which Slurm
refuses) and ``setfenv``/``unpack`` are gone. CI also runs the hook's whole unit tests and
corpus once per version with ``HETSLURM_LUA`` (scripts/test.sh); these tests pin the cases
that broke.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.request import _lua
from hetslurm.site import load_site

ROOT = Path(__file__).resolve().parents[2]

CHAIN = """
function slurm_job_submit(job_desc, part_list, submit_uid)
  job_desc.comment = "site saw uid " .. submit_uid
  return slurm.SUCCESS
end
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end
return slurm.SUCCESS
"""


@pytest.fixture(params=_lua.FLAVOURS)
def version(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(_lua.LUA_ENV, request.param)
    return str(request.param)


def test_the_runtime_is_that_version(version: str) -> None:
    assert _lua.new_runtime().eval("_VERSION") == f"Lua 5.{version[-1]}".encode()


@pytest.mark.parametrize(("text", "key", "value"), [
    ("nodes=2 gpus=8", "gpus_per_node", 4),
    ("gpus=2", "gpus_per_node", 2),
    ("mem=2048K", "mem_per_node_mib", 2),
    ("mem=300000M", "mem_per_node_mib", 300000),
])
def test_counts_are_integers(version: str, text: str, key: str, value: int) -> None:
    got = _lua.parse_table(text)[key]
    assert got == value and type(got) is int, (version, got)


def _record(value: str) -> dict[str, Any]:
    m = re.search(r"hetslurm:(\{[^}]*\})", value)
    assert m, value
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def test_the_hook_writes_no_float_text(version: str) -> None:
    site = load_site(ROOT / "site-configs" / "demo.toml")
    rt = HookRuntime(render_hook(site, chain_after=CHAIN).text)
    script = "#!/bin/bash\n#HET nodes=2 gpus=8 mem=300000M cores=260\nsrun true\n"
    res = rt.submit({"user_name": "root", "script": script, "user_id": 1000}, uid=1000)
    assert res.ok and res.rc == 0, (res.error, res.user_messages, res.log)
    fields = res.fields
    assert fields["tres_per_node"] == "gres:gpu:4"
    assert fields["min_mem_per_node"] == 300000 and fields["pn_min_cpus"] == 260
    # The site's own script sees what the plugin pushes: a float from 5.3 on.
    uid = "1000" if version in ("lua51", "lua52") else "1000.0"
    assert fields["comment"] == f"site saw uid {uid}"
    rec = _record(fields["admin_comment"])
    assert ".0" not in json.dumps(rec), rec
    assert not any(".0" in text for _, text in res.log), res.log
    # In shadow mode the hook logs its decision with the submitter's uid.
    shadow = HookRuntime(render_hook(site, mode="shadow").text)
    res = shadow.submit({"script": script, "user_id": 1000}, uid=1000)
    assert any("1000" in text for _, text in res.log), res.log
    assert not any("1000.0" in text for _, text in res.log), res.log
