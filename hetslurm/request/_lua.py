"""The one place that imports lupa: a Lua 5.1 runtime for the request grammar.

The grammar lives in ``job_submit/hetreq.lua`` so the job_submit hook (inside slurmctld,
whose ``job_submit_lua.so`` links Lua 5.1) and Python run the same code. lupa's ``lua51``
flavour is used for that reason: Lua 5.3+ would differ (integers, ``tostring(2.0)``).

Sandboxing: the module is loaded with ``loadstring`` + ``setfenv`` into an environment that
holds only the pure standard functions it needs, whose reads of unknown globals and writes of
any global raise (a bug in the module, caught by the tests). Lua never receives a Python
object: only byte strings cross into Lua, and the runtime has no ``python.eval``,
``python.builtins`` or ``python`` table at all.
"""

from __future__ import annotations

import functools
import importlib.resources
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetslurm.errors import PlacementError

LUPA_HINT = (
    "the request grammar needs the Python package lupa (Lua 5.1 flavour), a dependency of "
    "hetslurm that is missing here: reinstall hetslurm or `pip install lupa`"
)

#: Installed name of the ``job_submit/`` folder (see pyproject.toml ``[tool.setuptools]``).
LUA_PACKAGE = "hetslurm_job_submit"
HETREQ = "hetreq.lua"
HETHOOK = "hethook.lua"

# Runs in the runtime's own globals; loads one module's text into a closed environment.
_LOADER = b"""
local source, chunkname = ...
local chunk, err = loadstring(source, chunkname)
if not chunk then
  error(err, 0)
end
local function copy(t)
  local c = {}
  for k, v in pairs(t) do
    c[k] = v
  end
  return c
end
local env = {
  string = copy(string), table = copy(table), math = copy(math),
  tonumber = tonumber, tostring = tostring, type = type, pairs = pairs, ipairs = ipairs,
  next = next, select = select, pcall = pcall, setmetatable = setmetatable,
}
setmetatable(env, {
  __index = function(_, k) error(chunkname .. ": read of unknown global " .. tostring(k), 2) end,
  __newindex = function(_, k) error(chunkname .. ": write of global " .. tostring(k), 2) end,
})
setfenv(chunk, env)
return chunk()
"""


def _deny_attributes(obj: object, name: object, is_setting: bool) -> str:
    raise AttributeError("Lua code may not touch Python attributes")


def new_runtime() -> Any:
    """A fresh Lua 5.1 runtime with no way into Python.

    Strings cross as bytes (``encoding=None``) so no Lua string can fail to decode; callers
    decode with :func:`to_python`.

    Raises:
        PlacementError: lupa is not installed.
    """
    try:
        from lupa import lua51
    except ImportError as e:
        raise PlacementError(LUPA_HINT) from e
    lua = lua51.LuaRuntime(
        unpack_returned_tuples=True,
        register_eval=False,
        register_builtins=False,
        attribute_filter=_deny_attributes,
        encoding=None,
    )
    lua.execute(b"python = nil; package.loaded.python = nil")
    return lua


def lua_source(name: str = HETREQ) -> bytes:
    """The text of one of hetslurm's Lua files.

    A source checkout uses ``job_submit/`` beside the ``hetslurm`` package, so the Lua always
    comes from the same tree as the Python that runs it; an installed copy reads the package
    data of ``hetslurm_job_submit``.
    """
    root = Path(__file__).resolve().parents[2]
    sibling = root / "job_submit" / name
    # pyproject.toml marks a checkout, so a stray site-packages/job_submit is never taken.
    if (root / "pyproject.toml").is_file() and sibling.is_file():
        return sibling.read_bytes()
    try:
        return importlib.resources.files(LUA_PACKAGE).joinpath(name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise PlacementError(
            f"{name} is missing: neither {sibling} nor the installed package {LUA_PACKAGE} "
            "has it; reinstall hetslurm"
        ) from e


def load_module(lua: Any, source: bytes, chunkname: str) -> Any:
    """Run a module's text in a closed environment of ``lua`` and return its table."""
    return lua.execute(_LOADER, source, ("@" + chunkname).encode())


@functools.cache
def hetreq() -> Any:
    """The ``hetreq`` module table, loaded once per process (lupa serialises calls)."""
    return load_module(new_runtime(), lua_source(HETREQ), HETREQ)


# Runs in the runtime's own globals: what a request means on one site, through the hook's own
# resolve step (hethook.lua), with no job options of its own. Returns r, notes or nil,
# family, message.
_MEANING = b"""
local hook, hetreq, rules = ...
local function here() return "" end
return function(text)
  local req, msg = hetreq.parse(text)
  if not req then
    return nil, "parse", msg
  end
  local d = { nw = 0 }
  local r, family, message = hook.resolve(req, req.tokens, rules, nil, nil, d, here)
  if not r then
    return nil, family, message
  end
  return r, d.notes
end
"""


@functools.cache
def _meaning_for(rules_literal: str) -> Any:
    lua = new_runtime()
    hook = load_module(lua, lua_source(HETHOOK), HETHOOK)
    req = load_module(lua, lua_source(HETREQ), HETREQ)
    rules = load_module(lua, b"return " + rules_literal.encode("utf-8"), "rules")
    return lua.execute(_MEANING, hook, req, rules)


def meaning(rules_literal: str) -> Any:
    """The Lua function ``text -> r, notes | nil, family, message`` for one site's rendered
    hook rules (a Lua table constructor), cached per rules text: the hook's own ``resolve``."""
    return _meaning_for(rules_literal)


def parse_table(text: str) -> dict[str, Any]:
    """Run ``hetreq.parse`` and return its table as plain Python.

    Raises:
        PlacementError: the text is not a valid request; the message is hetreq's.
    """
    # surrogatepass: a lone surrogate must reach the grammar (and be refused there), not
    # crash the encoder here.
    result = hetreq().parse(text.encode("utf-8", "surrogatepass"))
    table, message = result if isinstance(result, tuple) else (result, None)
    if table is None:
        raise PlacementError(to_python(message) if message is not None else "invalid request")
    converted = to_python(table)
    if not isinstance(converted, dict):
        raise TypeError(f"hetreq.parse returned {converted!r}, not a table")
    return converted


def to_python(obj: Any) -> Any:
    """Lua values to Python: bytes to str, sequences to lists, other tables to dicts.

    An empty table becomes ``{}``; callers that expect a list accept an empty dict.
    """
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    lua_type: Callable[[Any], str | None] = _lua_type()
    if lua_type(obj) != "table":
        raise TypeError(f"cannot convert Lua {lua_type(obj)} to Python")
    items = {to_python(k): to_python(v) for k, v in obj.items()}
    if (
        items
        and all(isinstance(k, int) for k in items)
        and set(items) == set(range(1, len(items) + 1))
    ):
        return [items[i] for i in range(1, len(items) + 1)]
    return items


@functools.cache
def _lua_type() -> Callable[[Any], str | None]:
    from lupa import lua51

    return lua51.lua_type  # type: ignore[no-any-return]
