"""apply / rollback bookkeeping with fake daemons: backups, atomic writes, automatic
rollback on a failed health check (the real cluster path is tests/cluster/)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from hetslurm.errors import RolloutError
from hetslurm.levers import backups, rollback
from hetslurm.levers import live as apply_mod
from hetslurm.site.load import parse_site
from hetslurm.site.render import render, write_rendered

ROOT = Path(__file__).resolve().parents[2]
BASE = (ROOT / "tests" / "data" / "levers" / "small.toml").read_text()
BASE = BASE[:BASE.index("[levers.qos.lvtrain]")]  # no QOS: no sacctmgr here
SHARDS = BASE + "\n[levers.shards]\nh100 = 4\n"


class FakeDaemons:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail_next_restart = False

    def reconfigure(self) -> None:
        self.calls.append("reconfigure")

    def restart(self, nodes: Sequence[str]) -> None:
        self.calls.append("restart")
        if self.fail_next_restart:
            self.fail_next_restart = False
            raise RolloutError("slurmctld exited at start")


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> apply_mod.Target:
    monkeypatch.setattr(apply_mod, "ping", lambda env: None)
    monkeypatch.setattr(apply_mod, "node_states", lambda env: {})
    monkeypatch.setattr(apply_mod, "check_health", lambda *a, **k: None)
    write_rendered(render(parse_site(BASE)), tmp_path / "etc")
    return apply_mod.Target(conf_dir=tmp_path / "etc", daemons=FakeDaemons())


def test_unchanged_site_changes_nothing(target: apply_mod.Target) -> None:
    res = apply_mod.apply(parse_site(BASE), target)
    assert not res.applied and res.plan.changes == ()
    assert backups(target) == []


def test_dry_run_writes_nothing(target: apply_mod.Target) -> None:
    before = (target.conf_dir / "gres.conf").read_text()
    res = apply_mod.apply(parse_site(SHARDS), target, dry_run=True)
    assert res.plan.needs_restart and not res.applied
    assert (target.conf_dir / "gres.conf").read_text() == before


def test_apply_backs_up_writes_restarts_and_rollback_restores(
        target: apply_mod.Target) -> None:
    before = (target.conf_dir / "gres.conf").read_text()
    res = apply_mod.apply(parse_site(SHARDS), target)
    assert res.applied and res.action == "restart"
    assert "Name=shard" in (target.conf_dir / "gres.conf").read_text()
    assert target.daemons.calls == ["restart"]  # type: ignore[attr-defined]
    (b,) = backups(target)
    assert (b / "gres.conf").read_text() == before
    back = rollback(target)
    assert back.action == "restart"
    assert (target.conf_dir / "gres.conf").read_text() == before
    assert backups(target) == []  # used: a second rollback goes further back
    with pytest.raises(RolloutError, match="no backup"):
        rollback(target)


def test_failed_restart_rolls_back_automatically(target: apply_mod.Target) -> None:
    before = {p.name: p.read_text() for p in target.conf_dir.glob("*.conf")}
    target.daemons.fail_next_restart = True  # type: ignore[attr-defined]
    with pytest.raises(RolloutError) as err:
        apply_mod.apply(parse_site(SHARDS), target)
    assert err.value.rolled_back and "rolled back" in str(err.value)
    assert {p.name: p.read_text() for p in target.conf_dir.glob("*.conf")} == before
    assert target.daemons.calls == ["restart", "restart"]  # type: ignore[attr-defined]
    assert backups(target) == []
    assert [p.name.endswith(".failed") for p in target.backups.iterdir()] == [True]


def test_unhealthy_cluster_is_not_touched(target: apply_mod.Target,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(apply_mod, "ping", lambda env: "Slurmctld(primary) is DOWN")
    with pytest.raises(RolloutError, match="nothing was changed"):
        apply_mod.apply(parse_site(SHARDS), target)
    assert "shard" not in (target.conf_dir / "gres.conf").read_text()


def test_health_states() -> None:
    assert apply_mod._bad("idle*") and apply_mod._bad("inval") and apply_mod._bad("drained")
    assert not apply_mod._bad("mixed") and not apply_mod._bad("allocated")


# The hook: a site change that touches only the hook's rules (a class's order or memory
# default) changes no Slurm file; apply re-installs the hook, rollback puts the old one back.
CLASS = '\n[classes.train]\ndevices = ["h100", "a100"]\npartition = "gpu"\n'
REORDERED = CLASS.replace('["h100", "a100"]', '["a100", "h100"]') + 'mem_per_node = "2G"\n'


@pytest.fixture
def hooked(target: apply_mod.Target) -> apply_mod.Target:
    pytest.importorskip("lupa")
    from dataclasses import replace

    from hetslurm.hook.install import InstalledHook, install_hook

    install_hook(parse_site(BASE + CLASS), target.conf_dir, mode="enforce")
    return replace(target, hook=InstalledHook(target.conf_dir))


def _rules(t: apply_mod.Target) -> str:
    from hetslurm.hook.render import header

    head = header((t.conf_dir / "job_submit.lua").read_text())
    assert head is not None
    return f"{head['rules']} {head['mode']}"


def test_hook_rules_change_is_applied_and_rolled_back(hooked: apply_mod.Target) -> None:
    from hetslurm.site.hook_rules import hook_rules

    before = _rules(hooked)
    assert apply_mod.diff(parse_site(BASE + CLASS), hooked).changes == ()
    new = parse_site(BASE + REORDERED)
    plan = apply_mod.diff(new, hooked)
    assert [(c.file, c.action) for c in plan.changes] == [("job_submit.lua", "hook")]
    assert plan.files == () and plan.action == "hook"
    res = apply_mod.apply(new, hooked)
    assert res.applied
    assert _rules(hooked) == f"{hook_rules(new)['digest']} enforce"  # the mode is kept
    assert hooked.daemons.calls == []  # type: ignore[attr-defined]
    assert apply_mod.diff(new, hooked).changes == ()
    back = rollback(hooked)
    assert [c.action for c in back.plan.changes] == ["hook"]
    assert _rules(hooked) == before
    assert hooked.daemons.calls == []  # type: ignore[attr-defined]


def test_hook_that_would_not_install_stops_apply_before_any_change(
        hooked: apply_mod.Target, monkeypatch: pytest.MonkeyPatch) -> None:
    from hetslurm.errors import ConfigError
    from hetslurm.hook import install

    before = (hooked.conf_dir / "job_submit.lua").read_text()
    gres = (hooked.conf_dir / "gres.conf").read_text()
    monkeypatch.setattr(install, "validate_text", lambda *a, **k: install.ValidationResult(
        False, "gave a wrong answer to '#HET class=train'", None))
    with pytest.raises(ConfigError, match="nothing was changed"):
        apply_mod.apply(parse_site(SHARDS + REORDERED), hooked)
    assert (hooked.conf_dir / "job_submit.lua").read_text() == before
    assert (hooked.conf_dir / "gres.conf").read_text() == gres
    assert backups(hooked) == []
