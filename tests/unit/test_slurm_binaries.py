"""Only the access layer (``hetslurm/slurm/``) names Slurm's programs.

Every other room asks a :class:`hetslurm.slurm.SlurmBackend` method, which knows each
command, its options and each supported Slurm version's output (docs/slurm-access.md).
This test reads every module under ``hetslurm/`` as a syntax tree and fails on any string
constant that is a Slurm program's name, wherever it stands: an argv's first word, a
``shutil.which`` argument, a constant bound to a name and used later, a path ending in the
program (``/usr/bin/sacct``), or a command line split into words (``"sinfo -h".split()``).
Messages and labels that merely mention a program inside longer text are not names.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import hetslurm

PACKAGE = Path(hetslurm.__file__).resolve().parent
ACCESS_LAYER = "hetslurm/slurm/"

#: Slurm's client commands and daemons (Slurm 22.05's man pages, section 1 and 8).
SLURM_PROGRAMS = frozenset({
    "sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol",
    "scrontab", "sdiag", "sh5util", "sinfo", "sprio", "squeue", "sreport", "srun", "sshare",
    "sstat", "strigger", "sview",
    "slurmctld", "slurmd", "slurmdbd", "slurmrestd", "slurmscriptd", "slurmstepd",
})

DAEMONS = frozenset({"slurmctld", "slurmd", "slurmdbd", "slurmscriptd", "slurmrestd",
                     "slurmstepd"})

#: Where a module outside the access layer may still name a program: (module, scope) ->
#: the names allowed there. A scope is ``<module>`` (module-level statements only, not
#: the functions and classes below them) or a function's or class's qualified name.
ALLOWED: dict[tuple[str, str], frozenset[str]] = {
    # The testbed's daemon start-up: the daemon names, bound once to constants that its
    # start/stop/bookkeeping code uses (Testbed._start_*, spawn_*, _stop_slurm, down).
    # Everything it asks a running Slurm (ping, sinfo, squeue, scancel, sacctmgr) goes
    # through hetslurm.slurm.cli_backend.
    ("hetslurm/testbed/cluster.py", "<module>"): DAEMONS,
    # Debian package names (they are the daemons' names) and the daemon binaries checked
    # after install; the client commands are checked by slurm.cli_backend.missing_commands.
    ("hetslurm/testbed/packages.py", "<module>"): frozenset({"slurmctld", "slurmd",
                                                             "slurmdbd", "slurmrestd"}),
    # ... and the same package names installed into the Debian roots of other releases.
    ("hetslurm/testbed/roots.py", "<module>"): frozenset({"slurmctld", "slurmd", "slurmdbd",
                                                          "slurmrestd"}),
    # Labels a user reads, not commands run: a QOS change's action in a rollout plan
    # (docs/cli.md: `action` is reconfigure, restart or sacctmgr) ...
    ("hetslurm/levers/rollout.py", "<module>"): frozenset({"sacctmgr"}),
    # ... and the "sbatch:" line of `hetslurm place` (the options to give sbatch) ...
    ("hetslurm/cli/place_cmd.py", "_print_table"): frozenset({"sbatch"}),
    # ... and a case label of the hook's hostile corpus (a flood of "#SBATCH" lines), part
    # of the case names `bench hook` prints (docs/hook.md); the lab runs Slurm only through
    # the access layer like every other room.
    ("hetslurm/lab/hostile.py", "<module>"): frozenset({"sbatch"}),
    # The lab's in-memory Slurm names a job without --job-name as sbatch does: "sbatch".
    ("hetslurm/lab/fake_slurm.py", "FakeSlurm.submit"): frozenset({"sbatch"}),
}

@dataclass(frozen=True)
class Finding:
    module: str
    scope: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} ({self.scope}) names Slurm's '{self.name}'"


def _program(text: str) -> str | None:
    """The Slurm program a string constant names (the whole string, or a path into a
    ``bin``/``sbin`` folder), or None. Longer text that starts with a program's name is a
    message, unless the code splits it into an argv (:class:`_Scanner`)."""
    if text in SLURM_PROGRAMS:
        return text
    # A program by path: /usr/bin/sacct, /opt/slurm/sbin/slurmctld (not /var/spool/slurmd).
    parent, _, base = text.rpartition("/")
    return base if base in SLURM_PROGRAMS and parent.endswith("bin") else None


def _first_word(text: str) -> str | None:
    words = text.split()
    return _program(words[0]) if words else None


class _Scanner(ast.NodeVisitor):
    def __init__(self, module: str) -> None:
        self.module = module
        self.scope: list[str] = []
        self.found: list[Finding] = []

    def _add(self, node: ast.AST, name: str) -> None:
        scope = ".".join(self.scope) or "<module>"
        self.found.append(Finding(self.module, scope, getattr(node, "lineno", 0), name))

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped
    visit_ClassDef = _scoped

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            name = _program(node.value)
            if name:
                self._add(node, name)

    def visit_Call(self, node: ast.Call) -> None:
        # A command line split into an argv: "sinfo -h -N".split(), shlex.split("sinfo -h").
        func = node.func
        split_of: ast.expr | None = None
        if isinstance(func, ast.Attribute) and func.attr == "split":
            if isinstance(func.value, ast.Constant):
                split_of = func.value
            elif node.args and isinstance(func.value, ast.Name) and func.value.id == "shlex":
                split_of = node.args[0]
        if isinstance(split_of, ast.Constant) and isinstance(split_of.value, str):
            name = _first_word(split_of.value)
            if name and _program(split_of.value) is None:
                self._add(split_of, name)
        self.generic_visit(node)


def scan(source: str, module: str) -> list[Finding]:
    scanner = _Scanner(module)
    scanner.visit(ast.parse(source, filename=module))
    return scanner.found


def allowed(f: Finding) -> bool:
    if f.module.startswith(ACCESS_LAYER):
        return True
    # Module-level code only for "<module>"; a function's own scope covers what it nests.
    scopes = [f.scope]
    parts = f.scope.split(".")
    scopes += [".".join(parts[:i]) for i in range(1, len(parts))]
    return any(f.name in ALLOWED.get((f.module, s), frozenset()) for s in scopes)


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield f"hetslurm/{path.relative_to(PACKAGE).as_posix()}", path


def findings() -> list[Finding]:
    out: list[Finding] = []
    for module, path in modules():
        out += scan(path.read_text(encoding="utf-8"), module)
    return out


def test_only_the_access_layer_names_slurm_programs() -> None:
    bad = [str(f) for f in findings() if not allowed(f)]
    assert not bad, ("Slurm programs named outside hetslurm/slurm/ (add a typed method to "
                     "SlurmBackend and its CLI backend instead):\n" + "\n".join(bad))


def test_the_scan_sees_the_whole_package() -> None:
    found = dict(modules())
    assert "hetslurm/slurm/cli_backend.py" in found and len(found) > 50
    # The access layer itself names them, so the scanner is not blind.
    names = {f.name for f in findings() if f.module == "hetslurm/slurm/cli_backend.py"}
    assert {"sacct", "sacctmgr", "scontrol", "sinfo", "squeue", "scancel", "sbatch"} <= names


def test_every_allow_list_entry_is_still_needed() -> None:
    """An entry that no longer matches anything is removed, not left to hide a new call."""
    found = findings()
    for (module, scope), names in ALLOWED.items():
        for name in names:
            assert any(f.module == module and f.name == name and
                       (f.scope == scope or f.scope.startswith(scope + "."))
                       for f in found), f"{module} {scope} no longer names {name}"


VIOLATIONS = {
    "argv literal": 'run_command(["sacct", "--json"], timeout=1)\n',
    "tuple argv": 'ARGV = ("squeue", "-h")\n',
    "which": 'import shutil\nshutil.which("scontrol")\n',
    "absolute path": 'run_command(["/usr/bin/sinfo", "-h"], timeout=1)\n',
    "bound constant": 'TOOL = "sacctmgr"\ndef f():\n    return [TOOL, "show", "qos"]\n',
    "split command line": 'def f():\n    return "scancel 12 13".split()\n',
    "shlex split": 'import shlex\nargv = shlex.split("sbatch --parsable job.sh")\n',
    "daemon outside its scope": 'def boot():\n    return ["slurmctld", "-D"]\n',
    "inside a method": 'class A:\n    def m(self):\n        return ["sdiag"]\n',
}


@pytest.mark.parametrize("source", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_a_synthetic_violation_fails(source: str) -> None:
    for module in ("hetslurm/act/synthetic.py", "hetslurm/testbed/cluster.py"):
        found = scan(source, module)
        assert found and not all(allowed(f) for f in found), (module, source)


def test_allowed_names_stay_in_their_scope() -> None:
    ok = 'SLURMCTLD = "slurmctld"\n'
    assert all(allowed(f) for f in scan(ok, "hetslurm/testbed/cluster.py"))
    # The same constant in a product module, or a client command in the testbed, fails.
    assert not all(allowed(f) for f in scan(ok, "hetslurm/act/rebalance.py"))
    assert not all(allowed(f) for f in scan('PING = "scontrol"\n',
                                            "hetslurm/testbed/cluster.py"))


@pytest.mark.parametrize("source", [
    'raise RolloutError(f"scontrol reconfigure failed: {exc}")\n',
    'REASON = "sacctmgr modify qos"\n',
    'log("starting slurmctld")\n',
    'path = root / "log" / "slurmctld.log"\n',
    'RESTART = ("systemctl restart slurmctld",)\n',
    'STATE = "StateSaveLocation=/var/spool/slurmctld"\n',
    'TITLE = f"hook on {script or \'srun/salloc\'}"\n',
])
def test_text_that_mentions_a_program_is_not_a_name(source: str) -> None:
    assert scan(source, "hetslurm/act/synthetic.py") == []
