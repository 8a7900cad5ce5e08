"""Install, check and switch off the hook in a Slurm configuration folder, safely.

Facts this rests on (Slurm 22.05, measured on the testbed; docs/hook.md):

* slurmctld reads ``job_submit.lua`` beside ``slurm.conf`` and reloads it when the file's
  modification time, in **whole seconds**, is later than the time it last loaded it; a file
  rewritten within the same second as that load would be skipped. :func:`install_hook`
  therefore sets the new file's mtime to ``max(now + 1, old mtime + 1)`` (whole seconds).
* a script that fails to load is fatal when slurmctld starts; on a reload the controller logs
  the error and keeps the previous one. So nothing is written until the rendered text has
  loaded in Lua 5.1 (lupa's ``lua51``, the version the plugin links) and passed a smoke
  submission through the strict stand-in; the write is atomic (temporary file, fsync, rename).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetslurm.errors import ConfigError
from hetslurm.hook import render as render_mod
from hetslurm.hook.standin import HookLoadError, HookRuntime
from hetslurm.site.model import Site
from hetslurm.textfile import read_text_file

HOOK_FILE = "job_submit.lua"

#: Jobs every rendered hook must handle without raising before it is installed.
SMOKE_JOBS: tuple[dict[str, Any], ...] = (
    {"script": "#!/bin/sh\ntrue\n", "user_name": "root"},
    {"script": "#!/bin/sh\n#HET gpus=1\ntrue\n", "user_name": "root"},
    {"script": "#!/bin/sh\n#HET nodes=2 locality=switch no-requeue\ntrue\n", "user_name": "root"},
    {"script": "#!/bin/sh\n#HET gpu=1\ntrue\n", "user_name": "root"},
    {"comment": "het: cores=2 mem=1G", "user_name": "root"},
)


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    error: str | None
    header: dict[str, str] | None


def validate_text(text: str) -> ValidationResult:
    """Load ``text`` as slurmctld would (Lua 5.1) and run the smoke jobs through it."""
    try:
        rt = HookRuntime(text)
    except HookLoadError as e:
        return ValidationResult(False, f"does not load in Lua 5.1: {e}", render_mod.header(text))
    for job in SMOKE_JOBS:
        res = rt.submit(job)
        if not res.ok:
            return ValidationResult(False, f"raised on a smoke job {job}: {res.error}",
                                    render_mod.header(text))
        errors = [m for level, m in res.log if level == "error"]
        if errors:
            return ValidationResult(False, f"logged an internal error on a smoke job: "
                                    f"{errors[0]}", render_mod.header(text))
    return ValidationResult(True, None, render_mod.header(text))


@dataclass(frozen=True)
class InstallResult:
    path: str
    changed: bool
    build: str
    rules: str
    mode: str
    mtime: int
    previous_build: str | None
    previous_mtime: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def install_text(text: str, conf_dir: str | Path, *, now: float | None = None) -> InstallResult:
    """Validate ``text`` and write it as ``conf_dir/job_submit.lua`` (atomic, newer mtime).

    Raises:
        ConfigError: the text does not load or fails a smoke job (nothing is written), or
            the folder is missing.
    """
    folder = Path(conf_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder (give the folder that holds slurm.conf)")
    check = validate_text(text)
    if not check.ok:
        raise ConfigError(f"the rendered job_submit.lua {check.error}; nothing was installed, "
                          "the controller keeps the current one")
    head = check.header or {}
    target = folder / HOOK_FILE
    previous_build = previous_mtime = None
    if target.exists():
        old = target.read_text(errors="replace")
        previous_mtime = int(target.stat().st_mtime)
        prev_head = render_mod.header(old)
        previous_build = prev_head["build"] if prev_head else None
        if old == text:
            return InstallResult(str(target), False, head.get("build", "?"),
                                 head.get("rules", "?"), head.get("mode", "?"),
                                 previous_mtime, previous_build, previous_mtime)
    t = int(now if now is not None else time.time())
    mtime = t + 1 if previous_mtime is None else max(t + 1, previous_mtime + 1)
    fd, tmp = tempfile.mkstemp(prefix=".job_submit.", suffix=".lua.tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.utime(tmp, (mtime, mtime))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return InstallResult(str(target), True, head.get("build", "?"), head.get("rules", "?"),
                         head.get("mode", "?"), mtime, previous_build, previous_mtime)


def install_hook(
    site: Site,
    conf_dir: str | Path,
    *,
    mode: str | None = None,
    chain_before: str | None = None,
    chain_after: str | None = None,
    now: float | None = None,
) -> InstallResult:
    """Render the hook for ``site`` and install it (see :func:`install_text`)."""
    rendered = render_mod.render_hook(site, mode=mode, chain_before=chain_before,
                                      chain_after=chain_after)
    return install_text(rendered.text, conf_dir, now=now)


def set_installed_mode(conf_dir: str | Path, mode: str) -> InstallResult:
    """The kill switch: rewrite the installed hook's mode (``off`` stops every rewrite)."""
    target = Path(conf_dir) / HOOK_FILE
    if not target.exists():
        raise ConfigError(f"{target} does not exist; nothing to switch")
    text = read_text_file(target, what="installed hook")
    return install_text(render_mod.set_mode(text, mode), conf_dir)


_LOAD_FAILED = re.compile(r"job_submit/lua.*(error|using previous script)|"
                          r"job_submit\.lua.*(error|failed)", re.I)


def check_hook(conf_dir: str | Path, log_file: str | Path | None = None) -> dict[str, Any]:
    """Which hook is installed, whether it loads, and which one the controller last loaded.

    The controller's answer comes from ``slurmctld.log``: the hook logs
    ``hetslurm hook loaded: ... build=...`` every time slurmctld (re)loads it. slurmctld
    reloads lazily, at the next submission after the file changed.
    """
    target = Path(conf_dir) / HOOK_FILE
    out: dict[str, Any] = {"path": str(target), "installed": target.exists()}
    if not target.exists():
        out.update(installed_build=None, loads=None, running_build=None, in_sync=False)
        return out
    text = target.read_text(errors="replace")
    head = render_mod.header(text) or {}
    check = validate_text(text)
    out.update(
        installed_build=head.get("build"),
        installed_rules=head.get("rules"),
        installed_mode=head.get("mode"),
        site=head.get("site"),
        mtime=int(target.stat().st_mtime),
        loads=check.ok,
        load_error=check.error,
    )
    running = running_mode = when = None
    errors_after: list[str] = []
    if log_file is not None and Path(log_file).exists():
        for line in _tail_lines(Path(log_file)):
            m = render_mod.LOADED_LINE.search(line)
            if m:
                running, running_mode = m.group("build"), m.group("mode")
                when = line.split("]", 1)[0].lstrip("[") if line.startswith("[") else None
                errors_after = []
            elif _LOAD_FAILED.search(line):
                errors_after.append(line.strip())
    out.update(running_build=running, running_mode=running_mode, loaded_at=when,
               load_errors_since=errors_after[-3:],
               in_sync=running is not None and running == head.get("build")
               and running_mode == head.get("mode"))
    return out


def _tail_lines(path: Path, max_bytes: int = 8 << 20) -> list[str]:
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size > max_bytes:
            fh.seek(size - max_bytes)
        return fh.read().decode("utf-8", "replace").splitlines()
