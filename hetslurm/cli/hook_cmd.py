"""``hetslurm hook``: render, install, check and switch off the job_submit hook."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hetslurm.cli.options import (
    conf_dir_option,
    format_option,
    site_option,
    site_path,
    slurm_release,
    slurm_version_option,
)
from hetslurm.cli.output import emit
from hetslurm.slurm.conf import slurm_conf_dir, slurm_conf_value

SITE_OPT = site_option()
# `--dir` is the spelling docs/cli.md and docs/hook.md use; `--conf-dir` that of the others.
DIR_OPT = conf_dir_option(alias="--dir")
MODE_OPT = click.option("--mode", type=click.Choice(["enforce", "shadow", "off"]), default=None,
                        help="Override the site's [hook] mode.")


def _read(path: str | None, option: str) -> str | None:
    from hetslurm.textfile import read_text_file

    return read_text_file(path, what=f"{option} file") if path else None


@click.group()
def hook() -> None:
    """The job_submit hook: #HET directives rewritten into Slurm-native fields.

    The hook is one job_submit.lua rendered from the site file (docs/hook.md); it is
    validated in Lua 5.1 before it is written, and slurmctld reloads it by itself.
    """


@hook.command("render")
@SITE_OPT
@MODE_OPT
@click.option("--rules", "rules_only", is_flag=True, help="Print the rules table as JSON.")
@click.option("--chain-before", type=click.Path(dir_okay=False), default=None,
              help="A site's existing job_submit.lua to run before hetslurm's logic.")
@click.option("--chain-after", type=click.Path(dir_okay=False), default=None,
              help="A site's existing job_submit.lua to run after hetslurm's logic.")
@slurm_version_option
def render_cmd(site_file: str | None, mode: str | None, rules_only: bool, chain_before: str | None,
               chain_after: str | None, slurm_version: str | None) -> None:
    """Print the rendered job_submit.lua (or, with --rules, its rules) to stdout."""
    from hetslurm.hook.render import render_hook
    from hetslurm.site import load_site
    from hetslurm.site.hook_rules import hook_rules

    site = load_site(site_path(site_file))
    if rules_only:
        sys.stdout.write(json.dumps(hook_rules(site), indent=2, default=str) + "\n")
        return
    sys.stdout.write(render_hook(site, mode=mode,
                                 chain_before=_read(chain_before, "--chain-before"),
                                 chain_after=_read(chain_after, "--chain-after"),
                                 slurm=slurm_release(slurm_version, fallback=True)).text)


@hook.command("install")
@SITE_OPT
@DIR_OPT
@MODE_OPT
@click.option("--chain-before", type=click.Path(dir_okay=False), default=None,
              help="A site's existing job_submit.lua to run before hetslurm's logic.")
@click.option("--chain-after", type=click.Path(dir_okay=False), default=None,
              help="A site's existing job_submit.lua to run after hetslurm's logic.")
@slurm_version_option
@format_option
def install_cmd(site_file: str | None, conf_dir: str | None, mode: str | None,
                chain_before: str | None, chain_after: str | None, slurm_version: str | None,
                output_format: str) -> None:
    """Render, validate in Lua 5.1 and atomically install job_submit.lua into --conf-dir.

    Nothing is written when the rendered file does not load or fails a smoke job; the new
    file gets a modification time later than any load the controller may have done, so
    slurmctld reloads it at the next submission. slurm.conf needs JobSubmitPlugins=lua.
    """
    from hetslurm.hook.install import install_hook
    from hetslurm.site import load_site

    conf = slurm_conf_dir(conf_dir)
    res = install_hook(load_site(site_path(site_file)), conf, mode=mode,
                       chain_before=_read(chain_before, "--chain-before"),
                       chain_after=_read(chain_after, "--chain-after"),
                       slurm=slurm_release(slurm_version, conf_dir=conf))
    d = res.to_dict()
    title = "hook installed" if res.changed else "hook unchanged"
    if res.replaced_unsafe:
        title += f" (replaced an unsafe file: {res.replaced_unsafe})"
        click.echo(f"hetslurm hook install: replaced {res.path}, which was "
                   f"{res.replaced_unsafe}", err=True)
    emit([d], output_format, title=title, document=d)


@hook.command("check")
@DIR_OPT
@click.option("--log", "log_file", type=click.Path(dir_okay=False), default=None,
              help="slurmctld.log [default: SlurmctldLogFile from slurm.conf in --conf-dir].")
@format_option
@slurm_version_option
def check_cmd(conf_dir: str | None, log_file: str | None, output_format: str,
              slurm_version: str | None) -> None:
    """Report the installed hook (build, rules, mode, whether it loads, the Slurm release it
    was rendered for) and the one the controller last loaded, from slurmctld.log.

    Exits 1 when the installed file does not load in Lua 5.1, 8 (after the report) when its
    permissions are unsafe: a symlink, writable by group or others, or owned by another
    user, 10 when slurm.conf's JobSubmitPlugins does not name lua (slurmctld would never run
    the hook), and 9 when it was rendered for another Slurm release than the one installed
    here (run hetslurm hook install again after a Slurm upgrade).
    """
    from hetslurm.errors import BackendError, PermissionsError
    from hetslurm.hook.install import check_hook

    folder = slurm_conf_dir(conf_dir)
    log = log_file or _ctld_log(folder)
    try:
        slurm: str | None = slurm_release(slurm_version, conf_dir=folder)
    except BackendError:
        slurm = None  # no Slurm answers here: the report says slurm_running null
    res = check_hook(folder, log, slurm)
    emit([{k: v for k, v in res.items() if k != "load_errors_since"}], output_format,
         title="hook", document=res)
    if str(res.get("permissions") or "ok") != "ok":
        raise PermissionsError(f"installed hook {res['path']} is {res['permissions']} "
                               "(run hetslurm hook install to replace it)")
    if res.get("installed") and not res.get("loads"):
        sys.exit(1)
    if res.get("installed") and res.get("lua_plugin") is False:
        plugins = ",".join(res["job_submit_plugins"]) or "none"
        click.echo(f"hetslurm hook check: slurm.conf's JobSubmitPlugins is {plugins}, not lua: "
                   "slurmctld never runs job_submit.lua (add JobSubmitPlugins=lua)", err=True)
        sys.exit(10)
    if res.get("installed") and res.get("slurm_matches") is False:
        click.echo(f"hetslurm hook check: the installed hook was rendered for Slurm "
                   f"{res['slurm_rendered_for']}, this controller runs {res['slurm_running']}; "
                   "run hetslurm hook install again", err=True)
        sys.exit(9)


def _ctld_log(folder: Path) -> str | None:
    return slurm_conf_value(folder / "slurm.conf", "SlurmctldLogFile")


@hook.command("disable")
@DIR_OPT
@click.option("--mode", type=click.Choice(["off", "shadow", "enforce"]), default="off",
              show_default=True, help="The mode to switch the installed hook to.")
@format_option
def disable_cmd(conf_dir: str | None, mode: str, output_format: str) -> None:
    """The kill switch: switch the installed hook to --mode (off: jobs pass unchanged).

    Rewrites only the MODE line of the installed file (validated and installed like
    `hook install`); slurmctld picks it up at the next submission.
    """
    from hetslurm.hook.install import set_installed_mode

    d = set_installed_mode(slurm_conf_dir(conf_dir), mode).to_dict()
    emit([d], output_format, title=f"hook mode {mode}", document=d)
