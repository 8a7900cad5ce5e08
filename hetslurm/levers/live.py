"""Roll a site's configuration out to a live cluster the way a careful admin would.

``diff``: render the site, read the live files, classify every change
(:mod:`hetslurm.levers.rollout`) and compare the QOS records (:mod:`hetslurm.levers.qos`).

``apply``: check the cluster is healthy, back up the files (and the QOS it will touch),
write the new files atomically, reconfigure or restart as the change needs, check health
again (``scontrol ping``, every node back, none INVAL/DOWN/not responding that was fine
before), sync QOS, and on any failure restore the backup the same way and say so.

``rollback``: restore the newest backup, with the same health check.

Where the files live and how daemons restart is a :class:`Target`: the CLI builds one for
a real cluster (:class:`SystemdDaemons`) or for the testbed (``hetslurm.testbed.target``).
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import hostlist

from hetslurm.errors import CommandError, HetslurmError, RolloutError
from hetslurm.levers import qos as qos_mod
from hetslurm.levers.rollout import HOOK_ACTION, Change, Plan, classify
from hetslurm.process import run_command
from hetslurm.site import Site
from hetslurm.site import levers as site_levers
from hetslurm.site.render import FRAGMENT_FILES, Runtime, render, write_rendered
from hetslurm.slurm import get_backend

HEALTH_TIMEOUT_S = 90.0
MAX_BACKUPS = 20
MANIFEST = "manifest.json"
#: The hook's file beside slurm.conf (hetslurm.hook.install.HOOK_FILE; named here too, as
#: the levers do not import the hook room).
HOOK_FILE = "job_submit.lua"
_BAD_STATES = ("inval", "down", "unk", "fail", "not_responding", "no_respond")


class Daemons(Protocol):
    """How a target applies files: ``scontrol reconfigure`` or a restart."""

    def reconfigure(self) -> None: ...

    def restart(self, nodes: Sequence[str]) -> None: ...


class SystemdDaemons:
    """A real cluster: ``scontrol reconfigure``; restarts run the configured commands
    (default: ``systemctl restart slurmctld`` and ``systemctl restart slurmd`` on this
    host; pass e.g. ``clush -a systemctl restart slurmd`` for the compute nodes)."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 restart_commands: Sequence[str] = ("systemctl restart slurmctld",
                                                    "systemctl restart slurmd")) -> None:
        self.env = env
        self.restart_commands = [shlex.split(c) for c in restart_commands]

    def reconfigure(self) -> None:
        get_backend("cli", self.env).reconfigure()

    def restart(self, nodes: Sequence[str]) -> None:
        for argv in self.restart_commands:
            run_command(argv, timeout=300, env=self.env)


class HookFile(Protocol):
    """The job_submit hook beside the configuration, kept in step with the site: its
    classes, rankings, memory defaults and classification rules live only in the hook's
    rendered rules, so a site change that touches only them changes no Slurm file
    (``hetslurm.hook.install.InstalledHook`` is the one implementation)."""

    def installed(self) -> str | None:
        """The installed hetslurm hook's text (None: none installed, nothing to keep)."""
        ...

    def render(self, site: Site) -> str:
        """The hook for ``site`` as the installed one is set up (mode, Slurm release),
        checked as ``hook install`` checks it; :class:`ConfigError` when it cannot be."""
        ...

    def install(self, text: str) -> None:
        """Install ``text`` (checked, atomic, a newer mtime)."""
        ...

    def describe(self, text: str | None) -> str | None:
        """One line naming a hook text (its rules digest and build)."""
        ...


@dataclass(frozen=True)
class Target:
    """Where a cluster's configuration lives and how it is applied."""

    conf_dir: Path
    daemons: Daemons
    whole: bool = False
    runtime: Runtime | None = None
    env: Mapping[str, str] | None = None
    backup_dir: Path | None = None
    #: Called with the new site before its files are written (the testbed makes device
    #: files and spool folders there).
    prepare: Callable[[Site], None] | None = None
    #: The installed hook, re-rendered when the site's hook rules change (None: not managed).
    hook: HookFile | None = None

    @property
    def backups(self) -> Path:
        return self.backup_dir or self.conf_dir / "hetslurm-backups"

    def managed(self) -> tuple[str, ...]:
        main = ("slurm.conf",) if self.whole else FRAGMENT_FILES
        # cgroup.conf only where hetslurm renders it (an emulated node on 24.11 and later).
        cgroup = ("cgroup.conf",) if self.runtime is not None and self.runtime.cgroup_disabled \
            else ()
        return (*main, "gres.conf", "topology.conf", *cgroup)

    def render(self, site: Site) -> dict[str, str]:
        return render(site, whole=self.whole, runtime=self.runtime)

    def read_live(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for name in self.managed():
            p = self.conf_dir / name
            out[name] = p.read_text(encoding="utf-8") if p.exists() else None
        return out


@dataclass(frozen=True)
class ApplyResult:
    plan: Plan
    applied: bool
    action: str | None
    backup: str | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"applied": self.applied, "action": self.action, "backup": self.backup,
                "seconds": round(self.seconds, 3), "notes": list(self.notes),
                "changes": [c.to_dict() for c in self.plan.changes]}


# ---------------------------------------------------------------- diff
def _accounting(site: Site, target: Target) -> qos_mod.QosAccounting:
    return qos_mod.QosAccounting(target.env, site.name)


@dataclass(frozen=True)
class _LiveQos:
    have: dict[str, qos_mod.QosState]
    assoc: dict[tuple[str, str, str], set[str]]
    plan: Plan


def _qos_live(site: Site, target: Target) -> _LiveQos:
    """slurmdbd's QOS and grants, read only when the site manages QOS."""
    if not site_levers.qos_records(site):
        return _LiveQos({}, {}, Plan())
    live = get_backend("cli", target.env).qos()
    assoc = _accounting(site, target).association_qos()
    return _LiveQos({q.name: qos_mod.live_state(q) for q in live}, assoc,
                    qos_mod.plan(site, live, assoc))


@dataclass(frozen=True)
class _HookStep:
    old: str | None
    new: str | None
    plan: Plan


def _hook_step(site: Site, target: Target) -> _HookStep:
    """The installed hook and the one the site renders, when they differ (checked before
    anything is changed: a hook that would not install stops the apply here)."""
    hook = target.hook
    old = hook.installed() if hook is not None else None
    if hook is None or old is None:
        return _HookStep(None, None, Plan())
    new = hook.render(site)
    if new == old:
        return _HookStep(old, None, Plan())
    change = Change(HOOK_FILE, "hook rules", hook.describe(old), hook.describe(new),
                    HOOK_ACTION, "slurmctld reloads job_submit.lua at the next submission "
                    "(newer mtime); checked in Lua 5.1 with every class first")
    return _HookStep(old, new, Plan((change,)))


def diff(site: Site, target: Target) -> Plan:
    """Every change between the site's rendering and the live files, QOS records and hook."""
    return (classify(target.read_live(), dict(target.render(site)))
            + _qos_live(site, target).plan + _hook_step(site, target).plan)


# ---------------------------------------------------------------- health
def node_states(env: Mapping[str, str] | None) -> dict[str, str]:
    """Each node's state word, lower case (``idle``, ``drained``, ``down*``...)."""
    return get_backend("cli", env).node_states()


def _bad(state: str | None) -> bool:
    if state is None:
        return True
    # sinfo appends '*' to a node that does not respond; "drain" after a change usually
    # means slurmd registered less than slurm.conf says (e.g. "Low RealMemory").
    return state.endswith("*") or any(b in state for b in (*_BAD_STATES, "drain"))


def ping(env: Mapping[str, str] | None) -> str | None:
    """None when slurmctld answers, else why not (one line)."""
    return get_backend("cli", env).ping()


def check_health(env: Mapping[str, str] | None, nodes: Sequence[str],
                 baseline: Mapping[str, str], timeout: float = HEALTH_TIMEOUT_S) -> None:
    """Wait until slurmctld answers and every node is back in a state no worse than before.

    Raises:
        RolloutError: the cluster is not healthy within ``timeout`` (the message says why).
    """
    deadline = time.monotonic() + timeout
    problem = "not checked"
    delay = 0.3
    while True:
        try:
            problem = ping(env) or ""
            if not problem:
                states = node_states(env)
                missing = [n for n in nodes if n not in states]
                bad = {n: states[n] for n in nodes
                       if n in states and _bad(states[n]) and not _bad(baseline.get(n, "idle"))}
                if not missing and not bad:
                    return
                problem = (f"node(s) {hostlist.collect_hostlist(missing)} missing"
                           if missing else "nodes not healthy: " +
                           ", ".join(f"{n}={s}" for n, s in sorted(bad.items())))
        except HetslurmError as exc:
            problem = str(exc)
        if time.monotonic() >= deadline:
            raise RolloutError(f"cluster not healthy after {timeout:.0f}s: {problem}")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def conf_nodes(files: Mapping[str, str | None]) -> list[str]:
    """Node names a slurm.conf (or nodes fragment) defines."""
    out: list[str] = []
    for name in ("slurm.conf", "hetslurm-nodes.conf"):
        for line in (files.get(name) or "").splitlines():
            if line.startswith("NodeName=") and not line.startswith("NodeName=DEFAULT"):
                out += hostlist.expand_hostlist(line.split()[0].split("=", 1)[1])
    return out


# ---------------------------------------------------------------- backups
def _save_backup(target: Target, old: Mapping[str, str | None], site: Site,
                 qos_before: Mapping[str, qos_mod.QosState | None],
                 grants: Sequence[qos_mod.Grant], action: str | None,
                 hook_text: str | None = None) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    d = target.backups / stamp
    d.mkdir(parents=True, exist_ok=False)
    for name, text in old.items():
        if text is not None:
            (d / name).write_text(text, encoding="utf-8")
    manifest: dict[str, Any] = {
        "id": stamp,
        "site": site.path,
        "action": action,
        "files": {name: text is not None for name, text in old.items()},
        "qos": {n: (s.to_dict() if s else None) for n, s in qos_before.items()},
        "grants": [[g.qos, g.kind, g.name, g.account] for g in grants],
        "cluster": site.name,
    }
    if hook_text is not None:
        (d / HOOK_FILE).write_text(hook_text, encoding="utf-8")
        manifest["hook"] = True
    (d / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    _prune(target)
    return d


def _prune(target: Target) -> None:
    dirs = sorted(p for p in target.backups.iterdir() if p.is_dir())
    for p in dirs[:-MAX_BACKUPS]:
        shutil.rmtree(p)


def backups(target: Target) -> list[Path]:
    """Backups still available to ``rollback``, newest last."""
    if not target.backups.exists():
        return []
    return sorted(p for p in target.backups.iterdir()
                  if p.is_dir() and not p.name.endswith((".failed", ".rolled-back"))
                  and (p / MANIFEST).exists())


def _restore_files(target: Target, backup: Path) -> dict[str, str | None]:
    manifest = json.loads((backup / MANIFEST).read_text())
    files = {name: ((backup / name).read_text(encoding="utf-8") if present else None)
             for name, present in manifest["files"].items()}
    write_rendered({n: t for n, t in files.items() if t is not None}, target.conf_dir)
    for name, text in files.items():
        if text is None:
            (target.conf_dir / name).unlink(missing_ok=True)
    return files


def _restore_qos(target: Target, backup: Path, cluster: str) -> None:
    manifest = json.loads((backup / MANIFEST).read_text())
    mgr = qos_mod.QosAccounting(target.env, cluster)
    for q, kind, name, account in manifest.get("grants", []):
        mgr.grant(qos_mod.Grant(q, kind, name, account), revoke=True)
    if not manifest.get("qos"):
        return
    have = {q.name: qos_mod.live_state(q) for q in get_backend("cli", target.env).qos()}
    for name, before in manifest["qos"].items():
        if before is None:
            if name in have:
                mgr.delete(name)
        elif name in have:
            mgr.add_or_modify(name, qos_mod.QosState.from_dict(before), have[name])


def _backup_hook(backup: Path) -> str | None:
    """The hook a backup holds (None: the apply did not change the hook)."""
    manifest = json.loads((backup / MANIFEST).read_text())
    if not manifest.get("hook"):
        return None
    return (backup / HOOK_FILE).read_text(encoding="utf-8")


def _restore_hook(target: Target, backup: Path) -> None:
    text = _backup_hook(backup)
    if text is not None and target.hook is not None:
        target.hook.install(text)


def _mark(backup: Path, suffix: str) -> None:
    backup.rename(backup.with_name(f"{backup.name}.{suffix}"))


# ---------------------------------------------------------------- apply / rollback
def _bring_to(target: Target, plan: Plan, nodes: Sequence[str],
              baseline: Mapping[str, str], timeout: float) -> None:
    if plan.needs_restart:
        target.daemons.restart(nodes)
    elif plan.files:
        try:
            target.daemons.reconfigure()
        except CommandError as exc:
            raise RolloutError(f"scontrol reconfigure failed: {exc}") from exc
    check_health(target.env, nodes, baseline, timeout)


def apply(site: Site, target: Target, *, dry_run: bool = False,
          health_timeout: float = HEALTH_TIMEOUT_S) -> ApplyResult:
    """Apply ``site`` to ``target``; on failure restore the previous files and QOS.

    Raises:
        RolloutError: the cluster was unhealthy before, or the change failed (then
            ``rolled_back`` says whether the previous configuration is back and healthy).
    """
    t0 = time.monotonic()
    new = target.render(site)
    old = target.read_live()
    files_plan = classify(old, dict(new))
    live_qos = _qos_live(site, target)
    have_qos, assoc = live_qos.have, live_qos.assoc
    hook_step = _hook_step(site, target)
    plan = files_plan + live_qos.plan + hook_step.plan
    notes = _weight_notes(site, target, files_plan.action)
    if dry_run or not plan.changes:
        return ApplyResult(plan, False, plan.action, seconds=time.monotonic() - t0,
                           notes=notes)
    why = ping(target.env)
    if why:
        raise RolloutError(f"the cluster is not healthy before the change ({why}); "
                           "nothing was changed")
    baseline = node_states(target.env)
    wanted = qos_mod.wanted(site)
    grants = qos_mod.missing_grants(site, assoc)
    touched = {n: have_qos.get(n) for n, w in wanted.items()
               if n not in have_qos or qos_mod.differing(w, have_qos[n])}
    backup = _save_backup(target, old, site, touched, grants, files_plan.action,
                          hook_step.old if hook_step.new is not None else None)
    nodes = [n.name for n in site.nodes]
    try:
        if files_plan.changes:
            if target.prepare is not None:
                target.prepare(site)
            write_rendered({n: t for n, t in new.items()}, target.conf_dir)
            for name in target.managed():
                if name not in new and old.get(name) is not None:
                    (target.conf_dir / name).unlink(missing_ok=True)
            _bring_to(target, files_plan, nodes, baseline, health_timeout)
        if hook_step.new is not None and target.hook is not None:
            # After the files: the new rules may name a partition the new files add.
            target.hook.install(hook_step.new)
        mgr = _accounting(site, target)
        descriptions = site_levers.qos_records(site)
        for name, want in wanted.items():
            mgr.add_or_modify(name, want, have_qos.get(name), descriptions[name].description)
        for g in grants:
            mgr.grant(g)
    except HetslurmError as exc:
        restored = _roll_back_failed(target, backup, files_plan, old, baseline, site.name,
                                     health_timeout)
        _mark(backup, "failed")
        if restored is not None:
            raise RolloutError(f"apply failed ({exc}); restoring the previous configuration "
                               f"failed too ({restored}): the cluster needs attention",
                               rolled_back=False) from exc
        raise RolloutError(f"apply failed ({exc}); rolled back to the previous configuration, "
                           "cluster healthy", rolled_back=True) from exc
    return ApplyResult(plan, True, plan.action, str(backup), time.monotonic() - t0,
                       notes=notes)


def _weight_notes(site: Site, target: Target, action: str | None) -> tuple[str, ...]:
    """What a reconfigure or restart does to node weights set with ``scontrol`` (the
    rebalance weights phase moves them): they go back to slurm.conf's, and the phase's next
    run writes them again. Names the nodes whose live weight is not the site's."""
    if action not in ("reconfigure", "restart"):
        return ()
    try:
        live = {n.name: n.weight for n in get_backend("cli", target.env).nodes()}
    except HetslurmError:
        return ()
    moved = [f"{n.name} {live[n.name]} -> {n.weight}" for n in site.nodes
             if n.name in live and live[n.name] != n.weight]
    if not moved:
        return ()
    return (f"scontrol {action} resets the node weights set with scontrol ({', '.join(moved)});"
            " the next `hetslurm rebalance` (weights phase) writes the ones it set again",)


def _roll_back_failed(target: Target, backup: Path, files_plan: Plan,
                      old: Mapping[str, str | None], baseline: Mapping[str, str], cluster: str,
                      timeout: float) -> str | None:
    """Undo a failed apply; None when the cluster is healthy again, else why not."""
    try:
        # Files first: sacctmgr parses slurm.conf too, and fails on the broken one.
        if files_plan.changes:
            _restore_files(target, backup)
            nodes = conf_nodes(old) or list(baseline)
            # A restart-class change may have stopped daemons; a failed reconfigure may have
            # left slurmctld on a half-read file: restart unless reconfigure brings it back.
            if files_plan.needs_restart or ping(target.env):
                target.daemons.restart(nodes)
                check_health(target.env, nodes, baseline, timeout)
            else:
                try:
                    _bring_to(target, files_plan, nodes, baseline, timeout)
                except HetslurmError:
                    target.daemons.restart(nodes)
                    check_health(target.env, nodes, baseline, timeout)
        _restore_hook(target, backup)
        _restore_qos(target, backup, cluster)
    except HetslurmError as exc:
        return str(exc)
    return None


def rollback(target: Target, *, health_timeout: float = HEALTH_TIMEOUT_S) -> ApplyResult:
    """Restore the newest backup (files and QOS) and check the cluster is healthy."""
    t0 = time.monotonic()
    avail = backups(target)
    if not avail:
        raise RolloutError(f"no backup to roll back to in {target.backups}")
    backup = avail[-1]
    manifest = json.loads((backup / MANIFEST).read_text())
    current = target.read_live()
    wanted = {name: ((backup / name).read_text(encoding="utf-8") if present else None)
              for name, present in manifest["files"].items()}
    plan = classify(current, wanted)
    hook_text = _backup_hook(backup)
    if hook_text is not None and target.hook is not None:
        now = target.hook.installed()
        if now != hook_text:
            plan = plan + Plan((Change(HOOK_FILE, "hook rules", target.hook.describe(now),
                                       target.hook.describe(hook_text), HOOK_ACTION,
                                       "the hook from before the apply"),))
    baseline = node_states(target.env) if ping(target.env) is None else {}
    _restore_files(target, backup)
    nodes = conf_nodes(wanted)
    try:
        if plan.files:
            _bring_to(target, plan, nodes, baseline, health_timeout)
        _restore_hook(target, backup)
        _restore_qos(target, backup, manifest["cluster"])
    except HetslurmError as exc:
        raise RolloutError(f"rollback to {backup.name} failed: {exc}") from exc
    _mark(backup, "rolled-back")
    return ApplyResult(plan, True, plan.action, str(backup), time.monotonic() - t0)
