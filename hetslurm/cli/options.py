"""The options several commands share, each declared once: ``--site``, ``--format``,
``--state``, ``--backend``, ``--conf-dir`` (with ``--testbed``).

Each decorator builds a :class:`SharedOption`, so a test can walk the command tree and check
that every command taking one of these options took it from here (tests/unit/test_options.py).
Where commands differ on purpose, the difference is a named argument of the decorator, not a
second declaration: a command that runs without a site (``audit``) says so with
``site_option(when_missing="defaults")``.

The rules behind the defaults live in the library: which site file
(:mod:`hetslurm.site.find`) and which Slurm configuration folder
(:mod:`hetslurm.slurm.conf`). docs/cli.md documents both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, overload

import click

from hetslurm.errors import BackendError
from hetslurm.site.find import TestbedLookup, find_site, locate_site
from hetslurm.slurm import BACKENDS, versions

F = TypeVar("F", bound=Callable[..., Any])

FORMATS = ("table", "json", "csv")

#: ``--state`` values that are not file names.
LIVE, EMPTY = "live", "empty"

#: What a command does when the site rule finds no site file.
WhenMissing = Literal["error", "defaults", "demo"]

SITE_HELP = ("Site file [default: $HETSLURM_SITE, else site.toml in $HETSLURM_ETC "
             "(default /etc/hetslurm), else the running testbed's site].")
_WHEN_MISSING_HELP = {
    "error": "",
    "defaults": " When none is found: built-in defaults.",
    "demo": " When none is found: the shipped demo site.",
}


class SharedOption(click.Option):
    """An option built by a decorator of this module.

    ``shared`` names the decorator's option (``--site``); ``variant`` is the named difference
    a command asked for (``error``/``defaults``/``demo``/``shipped`` for ``--site``).
    """

    def __init__(self, *args: Any, shared: str, variant: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shared = shared
        self.variant = variant


def _shared(*decls: str, shared: str, variant: str = "", **kwargs: Any) -> Callable[[F], F]:
    return click.option(*decls, cls=SharedOption, shared=shared, variant=variant, **kwargs)


# --------------------------------------------------------------------------------- --site
def site_help(when_missing: WhenMissing) -> str:
    """The ``--site`` help of a command that follows the site rule."""
    return SITE_HELP + _WHEN_MISSING_HELP[when_missing]


def site_option(*, when_missing: WhenMissing = "error") -> Callable[[F], F]:
    """``--site FILE`` (the value arrives as ``site_file``, None when not given).

    The command resolves it with :func:`site_path` (``when_missing="error"``) or
    :func:`site_path_or_none`; the value stays None here so a command can tell "not given"
    from "found" (``simulate --validate`` refuses a given one).
    """
    return _shared("--site", "site_file", shared="--site", variant=when_missing, default=None,
                   type=click.Path(dir_okay=False), help=site_help(when_missing))


def shipped_site_option(name: str, what: str) -> Callable[[F], F]:
    """``--site FILE`` of an experiment whose figures are documented on one shipped site
    (``bench``): the default is that file, installed as package data, not the site rule."""
    # Found when the command runs (a callable default), so a broken installation fails
    # that command only, with its one-line error, not `hetslurm --help`.
    return _shared("--site", "site_file", shared="--site", variant="shipped",
                   default=shipped_default(name), type=click.Path(dir_okay=False),
                   help=f"Site file [default: the shipped {what}, {name}].")


def shipped_default(name: str) -> Callable[[], str]:
    """A callable option default: the shipped ``site-configs/`` file ``name``, as installed
    (package data), looked up when the command runs."""
    from hetslurm.site.examples import example

    return lambda: str(example(name))


def _running_testbed(env: Any) -> tuple[str, Path | None]:
    from hetslurm.testbed import running_site

    return running_site(env)


def site_path(site_file: str | None) -> Path:
    """The site file by the one rule (:func:`hetslurm.site.find.find_site`).

    Raises:
        SiteNotFound: none found; the one-line error names the four places (exit 2).
    """
    return find_site(site_file, testbed=_running_testbed).path


def site_path_or_none(site_file: str | None, *,
                      testbed: TestbedLookup | None = _running_testbed) -> Path | None:
    """The site file by the one rule, or None where a command runs without one.

    ``testbed=None`` leaves out the fourth place (``testbed up``, which asks its own
    testbed).
    """
    found = locate_site(site_file, testbed=testbed)
    return found.path if found is not None else None


# ------------------------------------------------------------------------------- --format
@overload
def format_option(func: F) -> F: ...


@overload
def format_option(*, extra: Sequence[str] = (), more_help: str = "") -> Callable[[F], F]: ...


def format_option(func: F | None = None, *, extra: Sequence[str] = (),
                  more_help: str = "") -> F | Callable[[F], F]:
    """``--format table|json|csv`` (the value arrives as ``output_format``).

    ``@format_option`` for the three formats; ``@format_option(extra=("html",),
    more_help="...")`` for a command that writes more.
    """
    help_text = "Output as a human table, JSON (stable keys, for scripts) or CSV."
    if more_help:
        help_text = f"{help_text[:-1]}; {more_help}"
    deco: Callable[[F], F] = _shared(
        "--format", "output_format", shared="--format", variant=",".join(extra),
        type=click.Choice((*FORMATS, *extra)), default="table", show_default=True,
        help=help_text)
    return deco(func) if func is not None else deco


# -------------------------------------------------------------------------------- --state
def state_option(*, default: Literal["live", "empty"]) -> Callable[[F], F]:
    """``--state live|empty|FILE`` (the value arrives as ``state_spec``).

    ``place`` answers "where would it run now" (default ``live``); ``explain`` says what the
    hook does and works without a cluster (default ``empty``).
    """
    return _shared("--state", "state_spec", shared="--state", variant=default, default=default,
                   show_default=True, metavar="live|empty|FILE",
                   help="Cluster usage: 'live' reads Slurm now (SLURM_CONF), 'empty' assumes "
                        "nothing runs, else a file written by 'hetslurm state dump'.")


# ----------------------------------------------------------- --measured, --measured-energy
def measured_options(func: F) -> F:
    """``--measured/--no-measured`` and ``--measured-energy/--no-measured-energy`` (the values
    arrive as ``measured`` and ``measured_energy``; ``None`` when not given: the default
    rule in ``hetslurm.cli.place_cmd.apply_measured``)."""
    func = _shared("--measured-energy/--no-measured-energy", "measured_energy",
                   shared="--measured-energy", default=None,
                   help="Energy term from per-model GPU watts measured in the metrics store "
                        "(busy minus idle samples; models with too few samples keep the "
                        "site's power_* figures) [default: the site's [placement] "
                        "measured_energy].")(func)
    return _shared("--measured/--no-measured", "measured", shared="--measured", default=None,
                   help="Load term from the measured load (mean GPU utilization over "
                        "[placement] load_window_s, from the metrics store) [default: on when "
                        "the load weight is nonzero, the state is not 'empty' and the store "
                        "exists].")(func)


# ------------------------------------------------------------------------------ --backend
def backend_option(*, default: Literal["auto", "cli"]) -> Callable[[F], F]:
    """``--backend auto|cli|rest|pyslurm`` (the value arrives as ``backend``).

    Commands that only read (``status``) default to ``auto``; commands that act on what they
    read (``act``, ``rebalance``) default to ``cli``, the backend the testbed tests cover
    (pyslurm is untested on 22.05, pyproject.toml).
    """
    return _shared("--backend", "backend", shared="--backend", variant=default,
                   type=click.Choice(BACKENDS), default=default, show_default=True,
                   help="How to reach Slurm (auto: pyslurm when it matches the running Slurm, "
                        "else the CLIs; rest: slurmrestd at $HETSLURM_REST_URL with the token "
                        "in $SLURM_JWT, see docs/slurm-access.md).")


# ----------------------------------------------------------------- --conf-dir, --testbed
CONF_DIR_HELP = ("Folder of slurm.conf [default: the folder of $SLURM_CONF, else "
                 "/etc/slurm].")


def conf_dir_option(*, alias: str | None = None, site_key: str | None = None
                    ) -> Callable[[F], F]:
    """``--conf-dir DIR`` (the value arrives as ``conf_dir``), resolved by
    :func:`hetslurm.slurm.conf.slurm_conf_dir`.

    ``alias``: an older spelling the docs use (``hook --dir``). ``site_key``: a site setting
    that comes before ``$SLURM_CONF`` (``[rebalance] conf_dir``).
    """
    decls = ("--conf-dir", *((alias,) if alias else ()), "conf_dir")
    help_text = CONF_DIR_HELP
    if site_key:
        help_text = help_text.replace("the folder of", f"{site_key} of the site, else the "
                                                     "folder of", 1)
    return _shared(*decls, shared="--conf-dir", variant=site_key or "", default=None,
                   type=click.Path(file_okay=False), help=help_text)


def testbed_target_option(func: F) -> F:
    """``--testbed DIR``: act on the hetslurm testbed there instead of the live files
    (:func:`hetslurm.testbed.target.choose_target`)."""
    return _shared("--testbed", "testbed_dir", shared="--testbed",
                   type=click.Path(file_okay=False), default=None,
                   help="Target the hetslurm testbed in this folder (its whole slurm.conf, "
                        "its daemons) instead of --conf-dir.")(func)


# ------------------------------------------------------------------------- --slurm-version
def slurm_version_option(func: F) -> F:
    """``--slurm-version 22.05|24.11|26.05`` (the value arrives as ``slurm_version``; resolve
    it with :func:`slurm_release`)."""
    return _shared("--slurm-version", "slurm_version", shared="--slurm-version",
                   default=None, metavar="|".join(versions.RELEASES),
                   help="The Slurm release the controller runs; the gres form the hook writes "
                        "depends on it [default: the installed Slurm's (scontrol --version); "
                        "explain and hook render take 22.05 when no Slurm answers].")(func)


def slurm_release(slurm_version: str | None, *, conf_dir: str | Path | None = None,
                  fallback: bool = False) -> str:
    """``--slurm-version`` as a supported release name, else the installed Slurm's (asked
    with ``conf_dir``'s slurm.conf when given). ``fallback``: when no Slurm answers, the
    default release (22.05) rather than an error; for commands that only predict."""
    if slurm_version is not None:
        return versions.release(slurm_version).name
    conf = Path(conf_dir) / "slurm.conf" if conf_dir is not None else None
    try:
        return versions.installed(conf)[0].name
    except BackendError:
        if fallback:
            return versions.DEFAULT
        raise
