"""Options once (issue 19, item 6): the shared option decorators, the one rule for the site
file and the one rule for the Slurm configuration folder.

The site rule: ``--site``, else ``$HETSLURM_SITE``, else ``site.toml`` in ``$HETSLURM_ETC``
(default ``/etc/hetslurm``), else the running testbed's site; none found is one line naming
the four places, exit 2. Every test here works in tmp folders with a monkeypatched
environment (conftest.py empties the config root and the testbed folder for every unit
test); nothing reads or writes the host's /etc.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.cli.options import SITE_HELP, SharedOption, site_help
from hetslurm.errors import ConfigError, TestbedError
from hetslurm.site.examples import example
from hetslurm.site.find import (
    DEFAULT_ETC,
    FROM_ENV,
    FROM_ETC,
    FROM_OPTION,
    FROM_TESTBED,
    SiteNotFound,
    config_root,
    find_site,
    locate_site,
)
from hetslurm.slurm.conf import DEFAULT_CONF_DIR, slurm_conf_dir
from hetslurm.testbed import Testbed, running_site
from hetslurm.testbed.procs import proc_starttime

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"
PARAMS = ROOT / "site-configs" / "simulate-params.toml"


# ---------------------------------------------------------------- the site rule (library)
def _places(tmp_path: Path) -> tuple[dict[str, str], Path, Path, Path, Path]:
    """Four different site files, one per place, and the environment naming them."""
    files = {}
    for name in ("option", "env", "etc", "testbed"):
        files[name] = tmp_path / name / "site.toml"
        files[name].parent.mkdir()
        files[name].write_text(f"# {name}\n")
    env = {"HETSLURM_SITE": str(files["env"]), "HETSLURM_ETC": str(files["etc"].parent)}
    return env, files["option"], files["env"], files["etc"], files["testbed"]


def test_each_place_wins_in_order(tmp_path: Path) -> None:
    env, opt, from_env, etc, tb = _places(tmp_path)

    def testbed(_env: object) -> tuple[str, Path | None]:
        return "the testbed", tb

    assert find_site(str(opt), env, testbed=testbed) == locate_site(opt, env, testbed=testbed)
    assert find_site(str(opt), env, testbed=testbed).path == opt
    assert find_site(str(opt), env, testbed=testbed).source == FROM_OPTION
    found = find_site(None, env, testbed=testbed)
    assert (found.path, found.source) == (from_env, FROM_ENV)
    del env["HETSLURM_SITE"]
    found = find_site(None, env, testbed=testbed)
    assert (found.path, found.source) == (etc, FROM_ETC)
    etc.unlink()
    found = find_site(None, env, testbed=testbed)
    assert (found.path, found.source) == (tb, FROM_TESTBED)
    assert locate_site(None, env, testbed=lambda _e: ("none", None)) is None


def test_a_named_file_is_taken_even_when_missing(tmp_path: Path) -> None:
    # A mistyped --site or $HETSLURM_SITE is an error when read, never a reason to fall
    # through to another site.
    env, _, _, etc, _ = _places(tmp_path)
    assert find_site(str(tmp_path / "typo.toml"), env).path == tmp_path / "typo.toml"
    env["HETSLURM_SITE"] = str(tmp_path / "typo2.toml")
    assert find_site(None, env).path == tmp_path / "typo2.toml"
    assert etc.exists()


def test_config_root_is_hetslurm_etc_else_etc_hetslurm(tmp_path: Path) -> None:
    assert config_root({"HETSLURM_ETC": str(tmp_path)}) == tmp_path
    assert config_root({}) == DEFAULT_ETC == Path("/etc/hetslurm")
    assert config_root({"HETSLURM_ETC": ""}) == DEFAULT_ETC
    # A folder in the config root named site.toml is not a site file.
    (tmp_path / "site.toml").mkdir()
    assert locate_site(None, {"HETSLURM_ETC": str(tmp_path)}) is None


def test_none_found_names_all_four_places(tmp_path: Path) -> None:
    env = {"HETSLURM_ETC": str(tmp_path / "etc")}
    with pytest.raises(SiteNotFound) as info:
        find_site(None, env, testbed=lambda _e: ("no running testbed in /x/.testbed", None))
    err = info.value
    assert isinstance(err, ConfigError) and err.exit_code == 2
    text = str(err)
    assert "\n" not in text
    for place in ("--site", "$HETSLURM_SITE", str(tmp_path / "etc" / "site.toml"),
                  "no running testbed in /x/.testbed"):
        assert place in text
    assert len(err.looked) == 4


# ------------------------------------------------------- the fourth place: a running testbed
def _fake_testbed(root: Path, site: Path, *, alive: bool = True) -> Testbed:
    """A testbed state whose 'slurmctld' is this test process (alive by pid + start time)."""
    root.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    start = proc_starttime(pid) if alive else 1
    state = {"site": str(site), "cluster": "demo", "ports": {}, "node_ports": {},
             "db_password": "x",
             "procs": {"slurmctld": {"name": "slurmctld", "pid": pid, "starttime": start}}}
    (root / "testbed.json").write_text(json.dumps(state))
    return Testbed(root)


def test_running_testbed_gives_its_site(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    _fake_testbed(root, DEMO)
    where, site = running_site({"HETSLURM_TESTBED_DIR": str(root)})
    assert site == DEMO and str(root) in where
    found = find_site(None, {"HETSLURM_ETC": str(tmp_path / "none"),
                             "HETSLURM_TESTBED_DIR": str(root)}, testbed=running_site)
    assert (found.path, found.source) == (DEMO, FROM_TESTBED)


def test_stopped_testbed_gives_nothing(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    _fake_testbed(root, DEMO, alive=False)
    assert running_site({"HETSLURM_TESTBED_DIR": str(root)})[1] is None
    assert running_site({"HETSLURM_TESTBED_DIR": str(tmp_path / "absent")})[1] is None


@pytest.mark.skipif(os.geteuid() != 0, reason="the check applies to root only")
def test_root_ignores_a_testbed_state_others_can_write(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    _fake_testbed(root, DEMO)
    state = root / "testbed.json"
    state.chmod(state.stat().st_mode | stat.S_IWOTH)
    assert running_site({"HETSLURM_TESTBED_DIR": str(root)})[1] is None


def test_testbed_env_points_hetslurm_etc_at_the_testbed(tmp_path: Path) -> None:
    tb = Testbed(tmp_path / "tb")
    assert tb.env_vars() == {"SLURM_CONF": str(tb.root / "etc" / "slurm.conf"),
                             "HETSLURM_ETC": str(tb.root / "etc"),
                             "HETSLURM_TESTBED_DIR": str(tb.root)}
    assert tb.env()["HETSLURM_ETC"] == str(tb.etc)
    res = CliRunner().invoke(cli, ["testbed", "env", "--dir", str(tmp_path / "tb")])
    assert res.exit_code == 0
    assert f"export HETSLURM_ETC={tb.etc}" in res.stdout.splitlines()
    assert f"export SLURM_CONF={tb.conf}" in res.stdout.splitlines()


# ------------------------------------------------------------- the site rule through the CLI
def _invoke(argv: list[str], env: dict[str, str] | None = None) -> click.testing.Result:
    return CliRunner().invoke(cli, argv, env=env)


#: Every command that needs a site and follows the rule, run without --site, with every other
#: argument valid (test_every_rule_command_is_run keeps this list complete).
RULE_COMMANDS: dict[str, list[str]] = {
    "place": ["place", "--request", "gpus=1", "--state", "empty", "--format", "json"],
    "explain": ["explain", "--comment", "het: gpus=1", "--format", "json"],
    "hook render": ["hook", "render", "--rules"],
    "hook install": ["hook", "install", "--conf-dir", "{tmp}", "--format", "json"],
    "rebalance": ["rebalance", "--backend", "cli", "--format", "json",
                  "--conf-dir", "{tmp}"],
    "rebalance rollback": ["rebalance", "rollback", "--backend", "cli", "--format", "json"],
    "simulate": ["simulate", "--trace", "{trace}", "--trace-format", "philly", "--params",
                 str(PARAMS), "--format", "json"],
    "bench audit": ["bench", "audit", "--real-jobs", "1", "--jobs", "1"],
    "learn classes": ["learn", "classes", "--format", "json"],
    "advise": ["advise", "--format", "json"],
}


def _argv(name: str, tmp_path: Path) -> list[str]:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus\n2017-10-03 00:00:00,60,1\n")
    return [a.replace("{tmp}", str(tmp_path)).replace("{trace}", str(trace))
            for a in RULE_COMMANDS[name]]


def _site_options() -> Iterator[tuple[str, click.Option]]:
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, click.Option]]:
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])
            if not cmd.invoke_without_command:
                return  # a group that runs by itself (rebalance) has options of its own
        for p in cmd.params:
            if isinstance(p, click.Option) and "--site" in p.opts:
                yield " ".join(path), p

    yield from walk(cli, [])


def test_every_rule_command_is_run() -> None:
    errors = {c for c, o in _site_options() if isinstance(o, SharedOption)
              and o.variant == "error"}
    assert errors == set(RULE_COMMANDS)


@pytest.mark.parametrize("name", list(RULE_COMMANDS))
def test_no_site_anywhere_is_one_line_exit_2(name: str, tmp_path: Path) -> None:
    res = _invoke(_argv(name, tmp_path))
    assert res.exit_code == 2, res.output
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetslurm: error: no site file: ")
    etc = os.environ["HETSLURM_ETC"]
    for place in ("no --site given", "$HETSLURM_SITE unset", f"{etc}/site.toml",
                  f"no running testbed in {os.environ['HETSLURM_TESTBED_DIR']}"):
        assert place in lines[0]


@pytest.mark.parametrize("name", ["place", "explain", "hook render", "simulate"])
def test_site_found_in_the_config_root(name: str, tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    # The simulator's parameters name the case study's classes.
    site = ROOT / "site-configs" / ("case-study.toml" if name == "simulate" else "demo.toml")
    (etc / "site.toml").write_bytes(site.read_bytes())
    res = _invoke(_argv(name, tmp_path), env={"HETSLURM_ETC": str(etc)})
    assert res.exit_code == 0, res.output


def test_place_takes_hetslurm_site_over_the_config_root(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "site.toml").write_text("not = [a site\n")
    res = _invoke(_argv("place", tmp_path), env={"HETSLURM_ETC": str(etc),
                                                 "HETSLURM_SITE": str(DEMO)})
    assert res.exit_code == 0, res.output
    # and --site over both
    bad = tmp_path / "bad.toml"
    bad.write_text("schema_version = 99\n")
    res = _invoke([*_argv("place", tmp_path), "--site", str(bad)],
                  env={"HETSLURM_SITE": str(DEMO)})
    assert res.exit_code == 2 and str(bad) in res.stderr


def test_place_finds_the_running_testbeds_site(tmp_path: Path) -> None:
    root = tmp_path / "tb"
    _fake_testbed(root, DEMO)
    res = _invoke(_argv("place", tmp_path), env={"HETSLURM_TESTBED_DIR": str(root)})
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["placeable"] is True


def test_commands_that_run_without_a_site_still_do(tmp_path: Path) -> None:
    # collect, audit and act requeue-stalled use built-in defaults when no site is found.
    res = _invoke(["collect", "--store", str(tmp_path / "store"), "--compact"])
    assert res.exit_code == 0, res.output
    assert "compacted" in res.stderr


def test_simulate_validate_still_refuses_a_given_site(tmp_path: Path) -> None:
    # The option's value stays None unless --site is given, so a site found by the rule does
    # not count as given.
    res = _invoke(["simulate", "--validate", str(tmp_path / "w.toml"), "--site", str(DEMO)])
    assert res.exit_code == 2 and "--site" in res.output


# --------------------------------------------------------------------- the shared decorators
SHARED = ("--site", "--format", "--state", "--backend", "--conf-dir", "--testbed", "--measured",
          "--measured-energy")


def _all_options() -> Iterator[tuple[str, click.Option]]:
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[str, click.Option]]:
        if isinstance(cmd, click.Group):
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])
            if not cmd.invoke_without_command:
                return  # a group that runs by itself (rebalance) has options of its own
        for p in cmd.params:
            if isinstance(p, click.Option):
                yield " ".join(path), p

    yield from walk(cli, [])


def test_every_shared_option_comes_from_the_one_decorator() -> None:
    seen: dict[str, set[str]] = {}
    for path, opt in _all_options():
        names = [o for o in opt.opts if o in SHARED]
        if not names and opt.name != "conf_dir":
            continue
        assert isinstance(opt, SharedOption), f"'hetslurm {path}' declares {opt.opts} itself"
        assert opt.shared in opt.opts
        seen.setdefault(opt.shared, set()).add(path)
    # Each shared option is used by more than one command (else it needs no sharing).
    assert all(len(paths) > 1 for paths in seen.values()), seen
    assert {"place", "explain", "rebalance", "audit"} <= seen["--site"]


def test_site_options_differ_only_by_their_named_variant() -> None:
    shipped = {}
    for path, opt in _site_options():
        assert isinstance(opt, SharedOption)
        assert opt.name == "site_file"
        if opt.variant == "shipped":
            shipped[path] = opt
            continue
        assert opt.help == site_help(opt.variant)  # type: ignore[arg-type]
        assert opt.help is not None and opt.help.startswith(SITE_HELP)
        assert opt.default is None and not opt.required
    # Benchmarks whose figures are documented on one shipped site default to it.
    assert set(shipped) == {"bench testbed", "bench hook", "bench simulate", "bench accounting"}


def test_format_options_share_one_help_and_the_three_formats() -> None:
    helps = set()
    for path, opt in _all_options():
        if "--format" in opt.opts:
            assert isinstance(opt.type, click.Choice)
            assert tuple(opt.type.choices[:3]) == ("table", "json", "csv"), path
            assert opt.default == "table"
            helps.add((opt.help or "").split(";")[0].rstrip("."))
    assert len(helps) == 1


def test_backend_and_state_defaults_are_the_named_ones() -> None:
    defaults = {(p, o.name): o.default for p, o in _all_options()
                if o.name in ("backend", "state_spec")}
    assert defaults == {("status", "backend"): "auto", ("site import", "backend"): "auto",
                        ("act requeue-stalled", "backend"): "cli",
                        ("rebalance", "backend"): "cli", ("collect", "backend"): "cli",
                        ("rebalance rollback", "backend"): "cli",
                        ("place", "state_spec"): "live",
                        ("explain", "state_spec"): "empty"}


def test_hook_keeps_its_documented_dir_spelling() -> None:
    for _, opt in _all_options():
        if opt.name == "conf_dir":
            assert opt.opts[0] == "--conf-dir"
    hook_opts = {p: o.opts for p, o in _all_options() if o.name == "conf_dir"}
    assert hook_opts["hook install"] == ["--conf-dir", "--dir"]


# ----------------------------------------------------------------- shipped files, from anywhere
def test_shipped_sites_do_not_depend_on_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("demo.toml", "case-study.toml", "simulate-params.toml"):
        path = example(name)
        assert path.is_absolute() and path.is_file()
        assert path.read_bytes() == (ROOT / "site-configs" / name).read_bytes()
    with pytest.raises(ConfigError):
        example("nope.toml")
    for path, opt in _site_options():
        if isinstance(opt, SharedOption) and opt.variant == "shipped":
            assert callable(opt.default)
            assert Path(opt.default()).is_file(), path


# ------------------------------------------------------------------ the Slurm conf folder rule
def test_conf_dir_rule(tmp_path: Path) -> None:
    env = {"SLURM_CONF": str(tmp_path / "a" / "slurm.conf")}
    assert slurm_conf_dir(str(tmp_path / "given"), env) == tmp_path / "given"
    assert slurm_conf_dir(None, env) == tmp_path / "a"
    assert slurm_conf_dir("", env) == tmp_path / "a"
    assert slurm_conf_dir(None, {}) == DEFAULT_CONF_DIR == Path("/etc/slurm")


def test_conf_dir_rule_is_the_one_every_reader_uses(tmp_path: Path) -> None:
    from hetslurm.act.drift import live_target
    from hetslurm.metrics.gres import default_gres_conf

    env = {"SLURM_CONF": str(tmp_path / "a" / "slurm.conf")}
    assert default_gres_conf(env) == tmp_path / "a" / "gres.conf"
    assert default_gres_conf({}) == Path("/etc/slurm/gres.conf")
    assert live_target(None, False, env).conf_dir == tmp_path / "a"
    assert live_target(str(tmp_path / "b"), False, env).conf_dir == tmp_path / "b"


def test_choose_target_testbed_or_live(tmp_path: Path) -> None:
    from hetslurm.testbed.target import choose_target

    calls = []

    def live() -> object:
        calls.append(1)
        return "live target"

    assert choose_target(None, testbed_dir=None, live=live) == (None, "live target")  # type: ignore[arg-type]
    assert calls == [1]
    with pytest.raises(TestbedError, match="no testbed in"):
        choose_target(None, testbed_dir=tmp_path / "none", live=live)  # type: ignore[arg-type]
    assert calls == [1]


def test_site_diff_reads_the_folder_of_slurm_conf(tmp_path: Path) -> None:
    from hetslurm.site import load_site
    from hetslurm.site.render import render, write_rendered

    site = ROOT / "site-configs" / "validate-site.toml"  # no [levers.qos]: no sacctmgr
    conf = tmp_path / "conf"
    write_rendered(render(load_site(site)), conf)
    res = _invoke(["site", "diff", str(site), "--format", "json"],
                  env={"SLURM_CONF": str(conf / "slurm.conf")})
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["changes"] == []
    (conf / "gres.conf").write_text("")
    res = _invoke(["site", "diff", str(site), "--format", "json"],
                  env={"SLURM_CONF": str(conf / "slurm.conf")})
    assert res.exit_code == 0 and json.loads(res.stdout)["changes"], res.output
