"""The rooms of hetslurm and the directions between them (docs/architecture.md).

The package-level import graph is built with ``ast`` from every module of the installed
``hetslurm`` package: every ``import`` and ``from ... import``, at module level, under
``if TYPE_CHECKING:`` and inside functions alike. Lazy imports (inside a function) count as
dependencies: an import deferred to call time is still a room the code needs, and a cycle
through one still ties two rooms together. The one exception, by rule, is ``cli`` reaching
``lab``: the thin ``bench`` and ``simulate --validate`` commands import the lab inside the
command function, and only there (a module-level import would put the lab in every run).

:data:`ALLOWED` is the table docs/architecture.md shows (a test below keeps the two equal).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import hetslurm

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(hetslurm.__file__).resolve().parent

#: Modules directly under ``hetslurm/`` and the room each belongs to; a subpackage is its own
#: room. ``common``: the exception tree, the process runner, safe text and file reading, the
#: traces folder, the package's ``__init__``; every room may use it.
TOP_LEVEL = {
    "__init__": "common", "errors": "common", "process": "common", "textfile": "common",
    "fsguard": "common", "traces": "common",
    "_core": "placement",  # the Cython kernels (no .py: found only as an import target)
    "status": "status", "__main__": "cli",
}

#: What each room may import (besides itself). The one place these directions are written;
#: docs/architecture.md shows the same table. ``request`` is listed for the request room of
#: issue 19 item 1 (``hetslurm/request/``).
ALLOWED: dict[str, frozenset[str]] = {
    "common": frozenset(),
    "site": frozenset({"common"}),
    "slurm": frozenset({"common"}),
    "request": frozenset({"site", "common"}),
    "placement": frozenset({"site", "request", "common"}),
    "policy": frozenset({"site", "request", "placement", "metrics", "slurm", "common"}),
    "hook": frozenset({"site", "request", "placement", "slurm", "common"}),
    "levers": frozenset({"site", "slurm", "common"}),
    "metrics": frozenset({"site", "slurm", "common"}),
    "status": frozenset({"slurm", "common"}),
    "audit": frozenset({"policy", "request", "metrics", "site", "slurm", "common"}),
    "act": frozenset({"policy", "request", "placement", "metrics", "levers", "site", "slurm",
                      "common"}),
    "simulate": frozenset({"policy", "request", "placement", "site", "slurm", "common"}),
    "testbed": frozenset({"hook", "levers", "site", "slurm", "common"}),
    "lab": frozenset({"act", "audit", "hook", "levers", "metrics", "placement", "policy",
                      "request", "simulate", "site", "slurm", "status", "testbed", "common"}),
    "cli": frozenset({"act", "audit", "hook", "lab", "levers", "metrics", "placement",
                      "policy", "request", "simulate", "site", "slurm", "status", "testbed",
                      "common"}),
}
#: Edges allowed only as imports inside a function (never at module level).
LAZY_ONLY = frozenset({("cli", "lab")})
PRODUCT = frozenset(ALLOWED) - {"lab", "cli"}


@dataclass(frozen=True)
class Edge:
    src: str  # room
    dst: str  # room
    module: str  # the importing module
    line: int
    target: str  # the imported module
    lazy: bool  # inside a function


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP_LEVEL["__init__"]
    if (PACKAGE / parts[1]).is_dir():
        return parts[1]
    if parts[1] not in TOP_LEVEL:
        raise AssertionError(f"hetslurm/{parts[1]}.py belongs to no room: add it to TOP_LEVEL "
                             "in this test and to docs/architecture.md")
    return TOP_LEVEL[parts[1]]


def _known(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).is_dir() or (PACKAGE / rel).with_suffix(".py").is_file() or any(
        (PACKAGE / rel.parent).glob(rel.name + ".*.so")) or (PACKAGE / rel).with_suffix(
        ".pyx").is_file()


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool) -> list[str]:
    """The hetslurm modules one import statement names (the longest known module prefix)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        # ``from hetslurm import errors`` names a module; ``from hetslurm import X`` an object.
        names = [f"{base}.{a.name}" for a in node.names] or [base]
    out = []
    for name in names:
        parts = name.split(".")
        if parts[0] != "hetslurm":
            continue
        while len(parts) > 1 and not _known(".".join(parts)):
            parts.pop()
        out.append(".".join(parts))
    return out


def build_graph(package: Path = PACKAGE) -> list[Edge]:
    """Every import between two rooms of the package at ``package``."""
    edges = []
    for path in sorted(package.rglob("*.py")):
        module = module_name(path)
        src = room_of(module)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        lazy_ids = {id(n) for f in ast.walk(tree)
                    if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
                    for n in ast.walk(f) if isinstance(n, ast.Import | ast.ImportFrom)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for target in _targets(node, module, path.name == "__init__.py"):
                dst = room_of(target)
                if dst != src:
                    edges.append(Edge(src, dst, module, node.lineno, target,
                                      id(node) in lazy_ids))
    return edges


def find_cycle(pairs: Iterable[tuple[str, str]]) -> list[str] | None:
    """One cycle of rooms (first room repeated at the end), or None."""
    graph: dict[str, set[str]] = {}
    for a, b in pairs:
        graph.setdefault(a, set()).add(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*path[path.index(m):], m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def violations(edges: Iterable[Edge], allowed: Mapping[str, frozenset[str]] = ALLOWED,
               lazy_only: frozenset[tuple[str, str]] = LAZY_ONLY) -> list[str]:
    """Every broken rule, one line each (empty: the graph keeps the directions)."""
    edges = list(edges)
    out = []
    for e in edges:
        where = f"{e.module}:{e.line} imports {e.target}"
        if e.src not in allowed:
            out.append(f"{where}: room {e.src!r} is not in the table")
        elif e.dst == "cli":
            out.append(f"{where}: nothing but cli imports hetslurm.cli")
        elif e.dst == "lab" and e.src != "cli":
            out.append(f"{where}: product code never imports the lab")
        elif e.src == "placement" and e.dst == "slurm":
            out.append(f"{where}: placement never knows where its arrays came from (slurm)")
        elif e.src == "site" and e.dst == "slurm":
            out.append(f"{where}: site rendering never talks to Slurm")
        elif (e.src, e.dst) in lazy_only and not e.lazy:
            out.append(f"{where}: {e.src} may reach {e.dst} only inside a function")
        elif e.dst not in allowed[e.src]:
            out.append(f"{where}: {e.src} may not use {e.dst} (table: "
                       f"{', '.join(sorted(allowed[e.src])) or 'nothing'})")
    cycle = find_cycle((e.src, e.dst) for e in edges)
    if cycle:
        out.append("import cycle between rooms: " + " -> ".join(cycle))
    return out


# ----------------------------------------------------------------------- the real package
def test_the_package_keeps_the_directions() -> None:
    edges = build_graph()
    assert len(edges) > 100  # the walk saw the package, not an empty folder
    assert violations(edges) == []


def test_the_lazy_imports_are_seen() -> None:
    """The bench commands reach the lab from inside their functions: if the walk missed
    lazy imports, the rules above would be checked on half the graph."""
    lab = [e for e in build_graph() if e.dst == "lab"]
    assert lab and all(e.src == "cli" and e.lazy for e in lab)
    assert {e.module for e in lab} >= {"hetslurm.cli.bench_cmd", "hetslurm.cli.simulate_cmd"}


def test_every_room_is_in_the_table_and_the_table_has_no_cycle() -> None:
    rooms = {room_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert rooms <= set(ALLOWED), rooms - set(ALLOWED)
    assert all(allowed <= set(ALLOWED) for allowed in ALLOWED.values())
    assert find_cycle((a, b) for a, bs in ALLOWED.items() for b in bs) is None
    assert all(room not in bs for room, bs in ALLOWED.items())


def test_the_document_shows_the_same_table() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The directions", 1)[1].split("\n## ", 1)[0]
    shown: dict[str, frozenset[str]] = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`(\w+)`\s*\|([^|]*)\|", line)
        if m:
            shown[m.group(1)] = frozenset(re.findall(r"`(\w+)`", m.group(2)))
    assert shown == ALLOWED


# ------------------------------------------------------------- the checker on made-up graphs
def _edge(src: str, dst: str, *, lazy: bool = False) -> Edge:
    return Edge(src, dst, f"hetslurm.{src}.x", 1, f"hetslurm.{dst}.y", lazy)


@pytest.mark.parametrize(("edges", "why"), [
    ([_edge("placement", "slurm")], "placement never knows"),
    ([_edge("site", "slurm")], "site rendering never talks to Slurm"),
    ([_edge("audit", "cli", lazy=True)], "nothing but cli imports hetslurm.cli"),
    ([_edge("lab", "cli", lazy=True)], "nothing but cli imports hetslurm.cli"),
    ([_edge("act", "lab", lazy=True)], "product code never imports the lab"),
    ([_edge("testbed", "lab")], "product code never imports the lab"),
    ([_edge("cli", "lab")], "cli may reach lab only inside a function"),
    ([_edge("act", "audit")], "act may not use audit"),
    ([_edge("hook", "testbed", lazy=True)], "hook may not use testbed"),
    ([_edge("simulate", "hook")], "simulate may not use hook"),
    ([_edge("garage", "site")], "room 'garage' is not in the table"),
])
def test_a_deliberate_violation_is_caught(edges: list[Edge], why: str) -> None:
    found = violations(edges)
    assert any(why in v for v in found), found


def test_a_cycle_is_caught_even_when_the_table_would_allow_each_edge() -> None:
    everything = frozenset(ALLOWED)
    loose = {room: everything - {room} for room in ALLOWED}
    cycle = [_edge("hook", "testbed", lazy=True), _edge("testbed", "hook")]
    assert violations(cycle, loose) == ["import cycle between rooms: hook -> testbed -> hook"]
    assert violations([_edge("hook", "testbed"), _edge("testbed", "site")], loose) == []


def test_the_allowed_graph_passes() -> None:
    assert violations([_edge("cli", "lab", lazy=True), _edge("act", "policy"),
                       _edge("audit", "policy"), _edge("lab", "simulate")]) == []


def test_the_walk_reads_lazy_and_relative_imports() -> None:
    src = ("from __future__ import annotations\nimport hetslurm.site\n"
           "def f() -> None:\n    from hetslurm.placement import place\n")
    tree = ast.parse(src)
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    named = [t for n in imports for t in _targets(n, "hetslurm.act.x", False)]
    # ``place`` is a module of placement as well as a function: the module is the target.
    assert named == ["hetslurm.site", "hetslurm.placement.place"]
    rel = [n for n in ast.parse("from ..site import Site\nfrom . import stall\n").body
           if isinstance(n, ast.ImportFrom)]
    assert _targets(rel[0], "hetslurm.act.x", False) == ["hetslurm.site"]
    assert _targets(rel[1], "hetslurm.act.x", False) == ["hetslurm.act.stall"]
    assert [room_of(t) for t in named] == ["site", "placement"]
