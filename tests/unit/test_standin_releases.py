"""explain's stand-in plays each release's job_submit/lua plugin: its job_desc fields, its
``slurm`` constants and what a Lua error does to the job (job_submit_lua.c of 22.05.8,
24.11.5 and 26.05.3)."""

from __future__ import annotations

import pytest

from hetslurm.hook import standin
from hetslurm.hook.standin import HookRuntime

SCRIPT = """
function slurm_job_submit(job, parts, uid)
  job.{field} = {value}
  return slurm.SUCCESS
end
function slurm_job_modify(job, rec, parts, uid) return slurm.SUCCESS end
return slurm.SUCCESS
"""


def test_fields_follow_each_release() -> None:
    f22, f24, f26 = (standin.fields_for(r) for r in ("22.05", "24.11", "26.05"))
    assert "power_flags" in f22 and "power_flags" not in f24
    assert not f22["mcs_label"]["set"] and f24["mcs_label"]["set"]
    assert "assoc_qos" in f24 and not f24["assoc_qos"]["set"]
    assert "segment_size" not in f24 and f26["segment_size"]["set"]
    # What the hook writes is settable everywhere.
    for fields in (f22, f24, f26):
        for name in ("tres_per_node", "features", "partition", "qos", "admin_comment",
                     "comment", "prefer", "req_switch", "wait4switch", "shared"):
            assert fields[name]["set"], name


@pytest.mark.parametrize(("release", "ok"), [("22.05", True), ("24.11", False)])
def test_power_flags_is_gone_from_24_11(release: str, ok: bool) -> None:
    rt = HookRuntime(SCRIPT.format(field="power_flags", value="1"), slurm=release)
    res = rt.submit({"user_name": "root"})
    assert res.ok is ok


def test_every_error_code_from_24_11() -> None:
    assert "ESLURM_INVALID_GRES" not in standin.constants_for("22.05")
    assert standin.constants_for("24.11")["ESLURM_INVALID_GRES"] == 2072
    assert standin.constants_for("26.05")["ESLURM_INVALID_QOS"] == 2066
