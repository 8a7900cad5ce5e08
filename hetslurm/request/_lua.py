"""The one place that imports lupa: a Lua runtime for the request grammar and the hook.

The grammar lives in ``job_submit/hetreq.lua`` so the job_submit hook (inside slurmctld) and
Python run the same code. Debian's ``job_submit_lua.so`` links Lua 5.1, so lupa's ``lua51``
is the default; RPM builds elsewhere link 5.3 or 5.4, and ``$HETSLURM_LUA`` (``lua51`` ..
``lua54``) runs everything under that version instead. The tests run the hook under each.

Sandboxing: a module is loaded (``loadstring`` + ``setfenv`` in 5.1, ``load`` with an
environment from 5.2) into an environment that holds only the pure standard functions it
needs, whose reads of unknown globals and writes of any global raise (a bug in the module,
caught by the tests). Lua never receives a Python object: only byte strings cross into Lua,
and the runtime has no ``python.eval``, ``python.builtins`` or ``python`` table at all.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetslurm.errors import PlacementError

LUPA_HINT = (
    "the request grammar needs the Python package lupa, a dependency of hetslurm that is "
    "missing here: reinstall hetslurm or `pip install lupa`"
)
#: The Lua versions the hook is written for (lupa module names); the first is the default.
FLAVOURS = ("lua51", "lua52", "lua53", "lua54")
LUA_ENV = "HETSLURM_LUA"

#: Installed name of the ``job_submit/`` folder (see pyproject.toml ``[tool.setuptools]``).
LUA_PACKAGE = "hetslurm_job_submit"
HETREQ = "hetreq.lua"
HETHOOK = "hethook.lua"

# Runs in the runtime's own globals; loads one module's text into a closed environment.
_LOADER = b"""
local source, chunkname = ...
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
local chunk, err
if setfenv then
  chunk, err = loadstring(source, chunkname)
  if chunk then
    setfenv(chunk, env)
  end
else
  chunk, err = load(source, chunkname, "t", env)
end
if not chunk then
  error(err, 0)
end
return chunk()
"""


def _deny_attributes(obj: object, name: object, is_setting: bool) -> str:
    raise AttributeError("Lua code may not touch Python attributes")


def flavour() -> str:
    """The Lua version to run: ``$HETSLURM_LUA``, else Lua 5.1 (what Debian's plugin links).

    Raises:
        PlacementError: ``$HETSLURM_LUA`` names a version the hook is not written for.
    """
    chosen = os.environ.get(LUA_ENV) or FLAVOURS[0]
    if chosen not in FLAVOURS:
        raise PlacementError(
            f"{LUA_ENV}={chosen}: the hook runs under {', '.join(FLAVOURS)} (Lua 5.1 to 5.4)")
    return chosen


def _lupa(name: str) -> Any:
    try:
        package = importlib.import_module("lupa")
        return importlib.import_module(f"{package.__name__}.{name}")
    except ImportError as e:
        raise PlacementError(LUPA_HINT) from e


def new_runtime() -> Any:
    """A fresh runtime of :func:`flavour`'s Lua with no way into Python.

    Strings cross as bytes (``encoding=None``) so no Lua string can fail to decode; callers
    decode with :func:`to_python`.

    Raises:
        PlacementError: lupa is not installed, or ``$HETSLURM_LUA`` is not a known version.
    """
    lua = _lupa(flavour()).LuaRuntime(
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


def hetreq() -> Any:
    """The ``hetreq`` module table, loaded once per process and Lua version (lupa serialises
    calls)."""
    return _hetreq(flavour())


@functools.cache
def _hetreq(version: str) -> Any:
    return load_module(new_runtime(), lua_source(HETREQ), HETREQ)


# Runs in the runtime's own globals: what a request means on one site, through the hook's own
# resolve step (hethook.lua), with no job options of its own but its --partition (or nil).
# Returns r, notes or nil, family, message.
_MEANING = b"""
local hook, hetreq, rules = ...
local function here() return "" end
return function(text, jpart)
  local req, msg = hetreq.parse(text)
  if not req then
    return nil, "parse", msg
  end
  local d = { nw = 0 }
  local r, family, message = hook.resolve(req, req.tokens, rules, nil, nil, d, here, jpart)
  if not r then
    return nil, family, message
  end
  return r, d.notes
end
"""


@functools.cache
def _meaning_for(rules_literal: str, version: str) -> Any:
    lua = new_runtime()
    hook = load_module(lua, lua_source(HETHOOK), HETHOOK)
    req = load_module(lua, lua_source(HETREQ), HETREQ)
    rules = load_module(lua, b"return " + rules_literal.encode("utf-8"), "rules")
    return lua.execute(_MEANING, hook, req, rules)


def meaning(rules_literal: str) -> Any:
    """The Lua function ``text -> r, notes | nil, family, message`` for one site's rendered
    hook rules (a Lua table constructor), cached per rules text: the hook's own ``resolve``."""
    return _meaning_for(rules_literal, flavour())


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
    return _to_python(obj, _lua_type(flavour()))


def _to_python(obj: Any, lua_type: Callable[[Any], str | None]) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return obj
    if lua_type(obj) != "table":
        raise TypeError(f"cannot convert Lua {lua_type(obj)} to Python")
    items = {_to_python(k, lua_type): _to_python(v, lua_type) for k, v in obj.items()}
    if (
        items
        and all(isinstance(k, int) for k in items)
        and set(items) == set(range(1, len(items) + 1))
    ):
        return [items[i] for i in range(1, len(items) + 1)]
    return items


@functools.cache
def _lua_type(version: str) -> Callable[[Any], str | None]:
    return _lupa(version).lua_type  # type: ignore[no-any-return]
