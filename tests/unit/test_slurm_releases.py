"""The hook on each supported Slurm release: the gres form it writes, and the stand-in that
refuses the other release's form as slurmctld does (docs/versions.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetslurm.errors import ConfigError
from hetslurm.hook.render import render_hook, rendered_for
from hetslurm.hook.standin import HookRuntime
from hetslurm.site import Site, load_site
from hetslurm.slurm import versions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


def script(line: str) -> str:
    return f"#!/bin/bash\n{line}\nsrun true\n"


@pytest.mark.parametrize(("release", "prefix"), [
    ("22.05", "gres:"), ("24.11", "gres/"), ("26.05", "gres/")])
def test_each_release_gets_its_gres_form(demo: Site, release: str, prefix: str) -> None:
    rendered = render_hook(demo, slurm=release)
    assert rendered.slurm == release and rendered_for(rendered.text) == release
    rt = HookRuntime(rendered.text)
    cases = {
        "#HET gpus=1 gpu-type=a100": {"tres_per_node": f"{prefix}gpu:a100:1"},
        "#HET gpus=2 gpu-type=a100|h100": {"tres_per_node": f"{prefix}gpu:2",
                                           "features": "a100|h100",
                                           "partition": "batch_a100,batch_h100"},
        "#HET fpga=1": {"tres_per_node": f"{prefix}fpga:1"},
    }
    for line, want in cases.items():
        res = rt.submit({"user_name": "root", "script": script(line)})
        assert res.ok and res.rc == 0 and not res.log, (line, res)
        got = {k: v for k, v in res.fields.items() if k != "admin_comment"}
        assert got == want, line
    # The job's own --gres, as this release hands it to the hook, gets its type.
    res = rt.submit({"user_name": "root", "script": script("#HET gpu-type=h100"),
                     "tres_per_node": f"{prefix}gpu:2"})
    assert res.fields["tres_per_node"] == f"{prefix}gpu:h100:2", res
    res = rt.submit({"user_name": "root", "script": script("#HET gpus=1 gpu-type=v100")})
    assert res.rc != 0  # a model the site lacks is still refused


def test_a_hook_rendered_for_another_release_is_caught(demo: Site) -> None:
    old = render_hook(demo).text  # 22.05, the default
    assert rendered_for(old) == "22.05"
    res = HookRuntime(old, slurm="24.11").submit(
        {"user_name": "root", "script": script("#HET gpus=1 gpu-type=a100")})
    # slurmctld refuses the job after the hook accepted it (seen on a real 24.11.5).
    assert res.rc == 0 and not res.accepted
    assert res.refused == ("Invalid Trackable RESource (TRES) specification: Slurm 24.11 "
                           "refuses tres_per_node=gres:gpu:a100:1 (it writes a gres as "
                           "'gres/gpu:...'; was the hook rendered for another release?)")


@pytest.mark.parametrize(("given", "name"), [
    ("24.11.5", "24.11"), ("slurm 22.05.8", "22.05"), ((26, 5, 5), "26.05"), ("24.11", "24.11")])
def test_release_reads_every_spelling(given: str | tuple[int, ...], name: str) -> None:
    assert versions.release(given).name == name


@pytest.mark.parametrize(("given", "message"), [
    ("21.08", "Slurm 21.08 is not supported; hetslurm supports 22.05, 24.11, 26.05"),
    ("25.05.1", "Slurm 25.05 is not supported; hetslurm supports 22.05, 24.11, 26.05"),
    ("latest", "'latest' is not a Slurm version; supported: 22.05, 24.11, 26.05"),
])
def test_an_unsupported_release_is_named(demo: Site, given: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_hook(demo, slurm=given)


def test_explain_says_slurm_refuses_a_hook_left_from_another_release(demo: Site) -> None:
    from hetslurm.hook.explain import explain

    old = render_hook(demo, slurm="22.05").text
    ex = explain(script("#HET gpus=1 gpu-type=a100"), demo, hook_text=old, slurm="24.11")
    assert ex.outcome == "rejected"
    assert ex.messages[-1].startswith("Invalid Trackable RESource (TRES) specification")
    ex = explain(script("#HET gpus=1 gpu-type=a100"), demo, slurm="24.11")
    assert ex.outcome == "rewritten" and ("tres_per_node", "gres/gpu:a100:1") in ex.writes


def test_explain_hands_the_hook_the_gres_form_of_its_release(demo: Site) -> None:
    from hetslurm.hook.explain import JobOptions, explain

    text = script("#HET gpu-type=h100")
    for release, prefix in (("22.05", "gres:"), ("24.11", "gres/")):
        ex = explain(text, demo, JobOptions(gres="gpu:2"), slurm=release)
        assert ex.job_before["tres_per_node"] == f"{prefix}gpu:2"
        # As on the real 24.11.5: the job's own count gets the type, in the release's form.
        assert ("tres_per_node", f"{prefix}gpu:h100:2") in ex.writes, ex.writes
