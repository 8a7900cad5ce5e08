"""Render ``job_submit.lua``: the template, the grammar, the decision and the site's rules.

Pure: the same site, mode and chained texts give the same bytes. Slurm reloads only
``job_submit.lua`` (and ``require`` inside slurmctld resolves through the controller's
``package.path``), so everything the hook needs is embedded in that one file.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from hetslurm.errors import ConfigError
from hetslurm.request import _lua
from hetslurm.site.hook_rules import hook_policy, hook_rules, lua_literal
from hetslurm.site.model import Site
from hetslurm.slurm import versions

#: Bumped when the rendered file's structure changes; the file's header carries it.
HOOK_VERSION = 1
TEMPLATE = "job_submit.lua.in"
HETHOOK = "hethook.lua"
MODES = ("enforce", "shadow", "off")

MODE_LINE = re.compile(r'^local MODE = "(enforce|shadow|off)"$', re.M)
SLURM_LINE = re.compile(r'^local SLURM = "([0-9.]+)"$', re.M)
HEADER = re.compile(
    r"^-- hetslurm-hook: version=(?P<version>\d+) build=(?P<build>[0-9a-f]+) "
    r"rules=(?P<rules>[0-9a-f]+) site=(?P<site>\S+)$",
    re.M,
)
#: What slurmctld logs when it loads a hetslurm hook (the file's last statement).
LOADED_LINE = re.compile(
    r"hetslurm hook loaded: version=(?P<version>\d+) build=(?P<build>[0-9a-f]+) "
    r"rules=(?P<rules>[0-9a-f]+) mode=(?P<mode>\w+)"
)


@dataclass(frozen=True)
class RenderedHook:
    """A rendered ``job_submit.lua`` and what identifies it."""

    text: str
    build: str
    rules_digest: str
    mode: str
    site: str
    slurm: str = versions.DEFAULT


def chain_block(which: str, text: str) -> str:
    """Embed a site's job_submit.lua so its entry points can run before/after hetslurm's.

    The file runs once, at load, in a function whose globals are a private table that reads
    through to the controller's: its ``slurm_job_submit``/``slurm_job_modify`` land in that
    table instead of replacing hetslurm's.
    """
    if which not in ("before", "after"):
        raise ValueError(which)
    if "@@" in text:
        raise ConfigError(f"chained {which} script contains '@@', which the renderer reserves")
    # Lua 5.2+ takes the globals from the local _ENV; 5.1 ignores it and uses setfenv,
    # which 5.2+ no longer has (rawget: the stand-in's strict globals refuse a missing name).
    return (
        f"CHAIN.{which} = (function()\n"
        "  local env = setmetatable({}, { __index = _G })\n"
        "  local chunk = function(...)\n"
        "    local _ENV = env\n"
        f"{text.rstrip()}\n"
        "\n  end\n"
        "  local setfenv = rawget(_G, 'setfenv')\n"
        "  if setfenv then setfenv(chunk, env) end\n"
        "  chunk()\n"
        "  return env\n"
        "end)()\n"
    )


def render_hook(
    site: Site,
    *,
    mode: str | None = None,
    chain_before: str | None = None,
    chain_after: str | None = None,
    slurm: str = versions.DEFAULT,
) -> RenderedHook:
    """Render the hook for ``site``.

    Args:
        site: A loaded site; its ``[hook]`` section (or the defaults) and classes.
        mode: Overrides the site's ``[hook] mode``.
        chain_before: A site's existing job_submit.lua text, run before hetslurm's logic.
        chain_after: Likewise, run after it.
        slurm: The Slurm release the controller runs (``"24.11"``, ``"24.11.5"``): the gres
            form the hook writes depends on it.

    Raises:
        ConfigError: An unknown mode, an unsupported Slurm release, or a chained script the
            renderer cannot embed.
    """
    chosen = mode or hook_policy(site).mode
    if chosen not in MODES:
        raise ConfigError(f"unknown hook mode '{chosen}'; modes: {', '.join(MODES)}")
    release = versions.release(slurm)
    rules = hook_rules(site)
    sources = {name: _lua.lua_source(name).decode("utf-8")
               for name in (TEMPLATE, _lua.HETREQ, HETHOOK)}
    chain = ""
    if chain_before is not None:
        chain += chain_block("before", chain_before)
    if chain_after is not None:
        chain += chain_block("after", chain_after)
    h = hashlib.sha256()
    for part in (sources[TEMPLATE], sources[_lua.HETREQ], sources[HETHOOK], rules["digest"],
                 chain, release.name):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    build = h.hexdigest()[:16]
    text = sources[TEMPLATE]
    # Small placeholders first, the embedded sources last, so their text is never scanned.
    for key, value in (
        ("@@VERSION@@", str(HOOK_VERSION)),
        ("@@BUILD@@", build),
        ("@@DIGEST@@", rules["digest"]),
        ("@@SITE@@", site.name),
        ("@@MODE@@", chosen),
        ("@@SLURM@@", release.name),
        ("@@GRES@@", release.gres_prefix),
        ("@@RULES@@", lua_literal(rules)),
        ("@@CHAIN@@", chain),
        ("@@HETHOOK@@", sources[HETHOOK]),
        ("@@HETREQ@@", sources[_lua.HETREQ]),
    ):
        text = text.replace(key, value)
    return RenderedHook(text=text, build=build, rules_digest=rules["digest"], mode=chosen,
                        site=site.name, slurm=release.name)


def set_mode(text: str, mode: str) -> str:
    """The same hook with another mode (the kill switch rewrites this one line).

    Raises:
        ConfigError: ``text`` is not a hetslurm hook, or the mode is unknown.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown hook mode '{mode}'; modes: {', '.join(MODES)}")
    new, n = MODE_LINE.subn(f'local MODE = "{mode}"', text, count=1)
    if n != 1:
        raise ConfigError("this job_submit.lua has no hetslurm MODE line; was it rendered by "
                          "`hetslurm hook install`?")
    return new


def header(text: str) -> dict[str, str] | None:
    """``version``, ``build``, ``rules``, ``site``, ``mode`` and ``slurm`` (the release it
    was rendered for) of a rendered hook, or None."""
    m = HEADER.search(text)
    if not m:
        return None
    out = m.groupdict()
    mode = MODE_LINE.search(text)
    out["mode"] = mode.group(1) if mode else "?"
    out["slurm"] = rendered_for(text)
    return out


def rendered_for(text: str) -> str:
    """The Slurm release a rendered hook was written for (its ``SLURM`` line); hooks rendered
    before releases were told apart were written for 22.05."""
    m = SLURM_LINE.search(text)
    return m.group(1) if m else versions.DEFAULT
