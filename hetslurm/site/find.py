"""Which site file a command uses when none is named: one rule, for every command.

The rule, in order (docs/cli.md, "Which site file"):

1. ``--site FILE`` on the command line;
2. ``$HETSLURM_SITE``;
3. ``site.toml`` in the config root, ``$HETSLURM_ETC`` (default ``/etc/hetslurm``);
4. the site the running testbed was brought up with.

A file named by 1 or 2 is taken as it is, present or not (a mistyped path is an error, never
a reason to look elsewhere); 3 and 4 count only when they exist. When none applies, the error
names all four places (exit 2).

The testbed uses the site package, so this module cannot import it: the fourth place is asked
through ``testbed``, a function the caller passes (the CLI passes
:func:`hetslurm.testbed.running_site`). Site files shipped with hetslurm (the demo and the case
study, for the testbed and the benchmarks) are package data, found the same from any
working directory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hetslurm.errors import ConfigError

SITE_ENV = "HETSLURM_SITE"
ETC_ENV = "HETSLURM_ETC"
DEFAULT_ETC = Path("/etc/hetslurm")
#: The site file's name in the config root.
SITE_FILE = "site.toml"

#: Where a command found its site (:attr:`FoundSite.source`).
FROM_OPTION, FROM_ENV, FROM_ETC, FROM_TESTBED = "--site", "$HETSLURM_SITE", "config root", "testbed"

#: The fourth place: given the environment, ``(where it looked, the site file or None)``.
TestbedLookup = Callable[[Mapping[str, str]], tuple[str, Path | None]]


@dataclass(frozen=True)
class FoundSite:
    """A site file and which of the four places gave it."""

    path: Path
    source: str


class SiteNotFound(ConfigError):
    """No site file was named and none was found; ``looked`` lists the four places."""

    def __init__(self, looked: tuple[str, ...]) -> None:
        self.looked = looked
        super().__init__("no site file: " + "; ".join(looked))


def config_root(env: Mapping[str, str] | None = None) -> Path:
    """``$HETSLURM_ETC``, else ``/etc/hetslurm``: where hetslurm's own configuration lives."""
    env = os.environ if env is None else env
    return Path(env[ETC_ENV]) if env.get(ETC_ENV) else DEFAULT_ETC


def locate_site(given: str | Path | None, env: Mapping[str, str] | None = None, *,
                testbed: TestbedLookup | None = None) -> FoundSite | None:
    """The site file by the rule above, or None when none of the four places has one."""
    found, _ = _search(given, os.environ if env is None else env, testbed)
    return found


def find_site(given: str | Path | None, env: Mapping[str, str] | None = None, *,
              testbed: TestbedLookup | None = None) -> FoundSite:
    """The site file by the rule above.

    Raises:
        SiteNotFound: none of the four places has one (a :class:`ConfigError`, exit 2).
    """
    found, looked = _search(given, os.environ if env is None else env, testbed)
    if found is None:
        raise SiteNotFound(looked)
    return found


def _search(given: str | Path | None, env: Mapping[str, str],
            testbed: TestbedLookup | None) -> tuple[FoundSite | None, tuple[str, ...]]:
    if given:
        return FoundSite(Path(given), FROM_OPTION), ()
    if env.get(SITE_ENV):
        return FoundSite(Path(env[SITE_ENV]), FROM_ENV), ()
    root = config_root(env)
    in_root = root / SITE_FILE
    if in_root.is_file():
        return FoundSite(in_root, FROM_ETC), ()
    where, tb_site = (testbed(env) if testbed is not None
                      else ("the running testbed not asked", None))
    if tb_site is not None:
        return FoundSite(tb_site, FROM_TESTBED), ()
    root_note = f"${ETC_ENV}" if env.get(ETC_ENV) else f"${ETC_ENV} unset"
    return None, ("no --site given", f"${SITE_ENV} unset",
                  f"no {in_root} ({root_note})", where)
