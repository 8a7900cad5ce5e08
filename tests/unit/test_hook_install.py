"""Rendering the hook's rules, installing it safely, checking it, the kill switch, explain and the
CLI commands."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.hook import install as install_mod
from hetslurm.hook.explain import JobOptions, explain, sbatch_options
from hetslurm.hook.render import header, render_hook, set_mode
from hetslurm.site import Site, load_site
from hetslurm.site.hook_rules import hook_rules, lua_literal
from hetslurm.site.load import parse_site

pytest.importorskip("lupa")

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(DEMO)


# Rules ------------------------------------------------------------------------------------------


def test_rules_come_from_the_site(demo: Site) -> None:
    r = hook_rules(demo)
    assert r["gpu_models"] == ["h100", "a100"] and r["fpga_models"] == ["u280"]
    assert r["gpu_mem"] == {"a100": 40960, "h100": 81920}
    assert r["classes"]["train"] == {"devices": ["h100", "a100"], "cpu_only": False,
                                     "gpu_models": ["h100", "a100"], "fpga_models": [],
                                     "gpu_text": "h100|a100",
                                     "partition": "gpu", "rank": "gpu_h100,gpu_a100"}
    assert r["classes"]["io"]["cpu_only"] is True
    assert r["classes"]["stream"]["fpga_models"] == ["u280"]
    assert r["classes"]["io"]["gpu_models"] == [] and r["classes"]["io"]["fpga_models"] == []
    assert r["priority_qos"] == {"high": "high", "low": "low"}
    assert r["high_priority"] == {"anyone": False, "users": {"root": True}, "accounts": {}}
    assert r["modify_exempt"] == {}
    assert r["energy_low_models"] == ["a100"]
    assert r["record"] == {"field": "admin_comment", "key": "hetslurm", "max_bytes": 384,
                           "max_field_bytes": 4096}


def test_rules_are_deterministic_and_digest_tracks_content(demo: Site) -> None:
    assert hook_rules(demo) == hook_rules(load_site(DEMO))
    assert render_hook(demo).text == render_hook(load_site(DEMO)).text
    other = replace(demo, sections={**demo.sections, "classes": {}})
    assert hook_rules(other)["digest"] != hook_rules(demo)["digest"]


def test_lua_literal() -> None:
    assert lua_literal({"b": [1, "x\"y\\"], "a": True, 3: None, "end": {}}) == (
        '{\n  [3] = nil,\n  a = true,\n  b = { 1, "x\\"y\\\\" },\n  ["end"] = {},\n}')
    assert lua_literal("é\n") == '"\\195\\169\\010"'
    with pytest.raises(TypeError):
        lua_literal(2.0)


def test_hook_section_is_checked(tmp_path: Path) -> None:
    text = DEMO.read_text()
    bad = text.replace('energy_low_models = ["a100"]', 'energy_low_models = ["a10"]')
    with pytest.raises(ConfigError, match=r"hook.energy_low_models.0.*'a10' is not a GPU model.*"
                                          r"did you mean 'a100'"):
        parse_site(bad, "demo.toml")
    bad = text.replace('priority_qos = { high = "high", low = "low" }',
                       'priority_qos = { hihg = "high" }')
    with pytest.raises(ConfigError, match=r"unknown priority 'hihg'.*did you mean 'high'"):
        parse_site(bad, "demo.toml")
    bad = text.replace('mode = "enforce"', 'mode = "loud"')
    with pytest.raises(ConfigError, match=r"hook\.mode"):
        parse_site(bad, "demo.toml")
    bad = text.replace('record_field = "admin_comment"', 'record_field = "extra"')
    with pytest.raises(ConfigError, match=r"hook\.record_field"):
        parse_site(bad, "demo.toml")


def test_site_without_hook_section_gets_defaults() -> None:
    site = load_site(ROOT / "site-configs" / "case-study.toml")
    r = hook_rules(site)
    assert r["record"]["field"] == "admin_comment" and r["modify_exempt"] == {0: True}
    assert "local MODE = \"enforce\"" in render_hook(site).text


# Install ------------------------------------------------------------------------------------


def test_install_writes_atomically_with_a_newer_mtime(demo: Site, tmp_path: Path) -> None:
    now = time.time()
    res = install_mod.install_hook(demo, tmp_path, now=now)
    target = tmp_path / "job_submit.lua"
    assert res.changed and target.read_text() == render_hook(demo).text
    assert res.mtime == int(now) + 1 == int(target.stat().st_mtime)
    assert [p.name for p in tmp_path.iterdir()] == ["job_submit.lua"]  # no temporary left
    # The same text again: nothing written.
    again = install_mod.install_hook(demo, tmp_path, now=now)
    assert not again.changed and again.mtime == res.mtime
    # A change within the same second still gets a strictly later mtime.
    third = install_mod.install_hook(demo, tmp_path, mode="shadow", now=now)
    assert third.changed and third.mtime == res.mtime + 1
    assert third.previous_build == res.build


def test_install_refuses_a_broken_hook_and_keeps_the_old(demo: Site, tmp_path: Path) -> None:
    install_mod.install_hook(demo, tmp_path)
    before = (tmp_path / "job_submit.lua").read_text()
    broken = render_hook(demo).text.replace("local MODE =", "local MODE = = ", 1)
    with pytest.raises(ConfigError, match=r"does not load in Lua 5.1.*nothing was installed"):
        install_mod.install_text(broken, tmp_path)
    raising = render_hook(demo).text.replace("function slurm_job_submit(job_desc, part_list, "
                                             "submit_uid)\n", "function slurm_job_submit(job_desc"
                                             ", part_list, submit_uid)\n  error('boom')\n", 1)
    with pytest.raises(ConfigError, match=r"raised on a smoke job.*boom"):
        install_mod.install_text(raising, tmp_path)
    assert (tmp_path / "job_submit.lua").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job_submit.lua"]


def test_kill_switch_rewrites_only_the_mode(demo: Site, tmp_path: Path) -> None:
    install_mod.install_hook(demo, tmp_path)
    text = (tmp_path / "job_submit.lua").read_text()
    res = install_mod.set_installed_mode(tmp_path, "off")
    new = (tmp_path / "job_submit.lua").read_text()
    assert res.mode == "off" and new == set_mode(text, "off")
    assert [a for a, b in zip(text.splitlines(), new.splitlines(), strict=True) if a != b] == [
        'local MODE = "enforce"']
    with pytest.raises(ConfigError, match=r"no hetslurm MODE line"):
        set_mode("return 1", "off")


def test_check_reports_installed_and_running(demo: Site, tmp_path: Path) -> None:
    res = install_mod.install_hook(demo, tmp_path)
    log = tmp_path / "slurmctld.log"
    log.write_text(
        "[2026-01-01T00:00:00.000] lua: hetslurm hook loaded: version=1 build=0000000000000000 "
        "rules=1111111111111111 mode=enforce\n"
        f"[2026-01-01T00:00:05.000] lua: hetslurm hook loaded: version=1 build={res.build} "
        f"rules={res.rules} mode=enforce\n")
    out = install_mod.check_hook(tmp_path, log)
    assert out["installed_build"] == res.build and out["loads"] is True
    assert out["running_build"] == res.build and out["in_sync"] is True
    assert out["loaded_at"] == "2026-01-01T00:00:05.000"
    (tmp_path / "job_submit.lua").write_text("broken (")
    out = install_mod.check_hook(tmp_path, log)
    assert out["loads"] is False and out["in_sync"] is False


def test_header(demo: Site) -> None:
    r = render_hook(demo)
    h = header(r.text)
    assert h == {"version": "1", "build": r.build, "rules": r.rules_digest, "site": "hetdemo",
                 "mode": "enforce", "slurm": "22.05"}
    assert header(render_hook(demo, slurm="26.05.5").text)["slurm"] == "26.05"  # type: ignore[index]


# Explain --------------------------------------------------------------------------------------


def test_sbatch_options_from_the_header() -> None:
    opts = sbatch_options("#!/bin/sh\n#SBATCH -p gpu --gres=gpu:2\n#SBATCH -N 2 --mem 4G\n"
                          "#SBATCH --no-requeue -C 'a|b'\necho\n#SBATCH -q late\n")
    assert opts == JobOptions(partition="gpu", gres="gpu:2", nodes="2", mem="4G", requeue=False,
                              constraint="a|b")


def test_explain_rewrite_and_placement(demo: Site) -> None:
    ex = explain("#!/bin/sh\n#HET gpus=2 gpu-type=a100\ntrue\n", demo)
    assert ex.outcome == "rewritten"
    assert ex.writes[0] == ("tres_per_node", "gres:gpu:a100:2")
    assert ex.record and ex.record.startswith("hetslurm:{")
    if ex.placement is not None:  # the placement core may be missing in a bare checkout
        assert ex.placement["placeable"] and ex.placement["nodelist"] in ("gpu3", "gpu4")
    else:
        assert ex.placement_note and ex.placement_note.startswith("placement unavailable")


def test_explain_rejection_and_options(demo: Site) -> None:
    ex = explain("#!/bin/sh\n#HET gpu=2\n", demo)
    assert ex.outcome == "rejected" and ex.messages[0].startswith("#HET line 2: 'gpu=2'")
    ex = explain("#!/bin/sh\n#SBATCH --gres=gpu:2\n#HET class=train gpu-type=h100\n", demo)
    assert ex.writes[0] == ("tres_per_node", "gres:gpu:h100:2")
    ex = explain(None, demo, JobOptions(comment="het: class=io"))
    assert ex.outcome == "rewritten" and ("features", "cpu") in ex.writes
    ex = explain("#!/bin/sh\ntrue\n", demo)
    assert ex.outcome == "unchanged" and ex.writes == []


# CLI --------------------------------------------------------------------------------------------


def test_cli_render_install_check_disable(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["hook", "render", "--site", str(DEMO), "--rules"])
    assert res.exit_code == 0 and json.loads(res.output)["site"] == "hetdemo"
    res = runner.invoke(cli, ["hook", "render", "--site", str(DEMO), "--mode", "shadow"])
    assert res.exit_code == 0 and 'local MODE = "shadow"' in res.output
    res = runner.invoke(cli, ["hook", "install", "--slurm-version", "22.05",
                              "--site", str(DEMO), "--dir", str(tmp_path),
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["changed"] is True
    (tmp_path / "slurm.conf").write_text(f"SlurmctldLogFile={tmp_path}/ctld.log\n"
                                         "JobSubmitPlugins=lua\n")
    res = runner.invoke(cli, ["hook", "check", "--dir", str(tmp_path), "--format", "json",
                              "--slurm-version", "22.05"])
    assert res.exit_code == 0 and json.loads(res.output)["loads"] is True
    res = runner.invoke(cli, ["hook", "disable", "--dir", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.output)["mode"] == "off"
    (tmp_path / "job_submit.lua").write_text("nope (")
    res = runner.invoke(cli, ["hook", "check", "--dir", str(tmp_path), "--format", "json",
                              "--slurm-version", "22.05"])
    assert res.exit_code == 1


def test_cli_install_follows_the_conf_dir_rule(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    # No --dir/--conf-dir: the folder of $SLURM_CONF (hetslurm.slurm.conf; without it
    # /etc/slurm, which a unit test never writes).
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SLURM_CONF", str(conf / "slurm.conf"))
    res = CliRunner().invoke(cli, ["hook", "install", "--slurm-version", "22.05",
                                   "--site", str(DEMO), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["path"] == str(conf / "job_submit.lua")
    # --conf-dir is the shared spelling; --dir stays (the docs use it).
    other = tmp_path / "other"
    other.mkdir()
    res = CliRunner().invoke(cli, ["hook", "check", "--conf-dir", str(other), "--format",
                                   "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["installed"] is False


def test_cli_explain(tmp_path: Path) -> None:
    job = tmp_path / "job.sh"
    job.write_text("#!/bin/sh\n#HET gpus=1 class=train\ntrue\n")
    res = CliRunner().invoke(cli, ["explain", str(job), "--site", str(DEMO), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["outcome"] == "rewritten"
    assert {"field": "partition", "value": "gpu_h100,gpu_a100"} in doc["writes"]
    res = CliRunner().invoke(cli, ["explain", "--comment", "het: class=io", "--site", str(DEMO)])
    assert res.exit_code == 0 and "rewritten" in res.output


def test_no_temporary_files_on_failure(demo: Site, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a: object, **_k: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match=r"disk full"):
        install_mod.install_hook(demo, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_check_names_a_job_submit_plugin_that_is_not_lua(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["hook", "install", "--slurm-version", "22.05", "--site", str(DEMO),
                              "--dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nJobSubmitPlugins=pbs\n")
    res = runner.invoke(cli, ["hook", "check", "--dir", str(tmp_path), "--format", "json",
                              "--slurm-version", "22.05"])
    assert res.exit_code == 10, res.output
    assert "JobSubmitPlugins is pbs, not lua" in res.stderr
    assert json.loads(res.stdout)["lua_plugin"] is False
    (tmp_path / "slurm.conf").write_text("ClusterName=x\njobsubmitplugins=job_submit/lua\n")
    res = runner.invoke(cli, ["hook", "check", "--dir", str(tmp_path), "--format", "json",
                              "--slurm-version", "22.05"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["job_submit_plugins"] == ["job_submit/lua"]
