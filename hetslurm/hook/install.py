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
* a hook that loads can still decide wrongly: a broken rules table makes every ``class=`` job
  fail open (pass unchanged) while plain jobs work. So, given the site, every class of the
  site (``class=NAME``, and ``gpus=1``/``fpga=1`` with it where the class has such devices),
  every GPU model (``gpu-type=``) and every FPGA model (``fpga=``) is submitted through the
  rendered text, in ``enforce`` mode whatever mode it is installed in, and each must come
  back rewritten as the *site* (not the rendered table) says: the class's partition, QOS and
  device models, the model's typed gres.

The installed file runs inside slurmctld, so its permissions are checked
(:mod:`hetslurm.fsguard`). ``install`` never calls a file "unchanged" that someone else could
have written: an identical file that is group- or world-writable is replaced by a fresh
0644 file (a new inode, so a writer that kept the old one open is cut off) and the result
says what was replaced; a file owned by another user, a symlink, or a configuration folder
that others can write is refused with :class:`~hetslurm.errors.PermissionsError`. ``check``
reports the file's mode and owner, and ``disable`` refuses to rewrite an unsafe file (its
text may not be ours).
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetslurm import fsguard
from hetslurm.errors import ConfigError, PermissionsError
from hetslurm.hook import render as render_mod
from hetslurm.hook.standin import CallResult, HookLoadError, HookRuntime
from hetslurm.site.hook_rules import CPU_FEATURE, FPGA_GRES, GPU_GRES, hook_rules
from hetslurm.site.model import Site
from hetslurm.slurm import versions
from hetslurm.slurm.conf import slurm_conf_value

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


@dataclass(frozen=True)
class SiteSmokeJob:
    """One ``#HET`` line and what the site says the hook must write for it."""

    directive: str
    #: Fields that must be written with exactly these values (None: must not be written).
    fields: dict[str, str | None]
    #: The device models the job may land on, in order, and their gres name (features
    #: text or typed gres); None: not checked.
    models: tuple[str, tuple[str, ...]] | None = None


def site_smoke_jobs(site: Site, gres_prefix: str = "gres:") -> list[SiteSmokeJob]:
    """A smoke job for every class, GPU model and FPGA model of ``site``, with the rewrite
    the site (not a rendered table) asks for, in the gres form of the hook's release
    (``gres_prefix``: ``gres:`` on 22.05, ``gres/`` on 24.11 and later)."""
    gpus, fpgas = list(site.gpu_models()), list(site.fpga_models())
    out: list[SiteSmokeJob] = []
    classes = site.sections.get("classes") or {}
    for name in sorted(classes):
        wc = classes[name]
        common: dict[str, str | None] = {"partition": wc.partition, "qos": wc.qos}
        if CPU_FEATURE in wc.devices:
            # A class with CPU nodes runs CPU work only (the hook refuses devices for it).
            out.append(SiteSmokeJob(f"class={name}", {**common, "features": CPU_FEATURE}))
            continue
        out.append(SiteSmokeJob(f"class={name}", common))
        class_gpus = tuple(d for d in wc.devices if d in gpus)
        class_fpgas = tuple(d for d in wc.devices if d in fpgas)
        if class_gpus:
            # Ranked fallback: several models go to their per-model partitions, in order.
            ranked = site.ranked_list(wc.partition or site.default_partition(), class_gpus)
            gpu_fields = {**common, "partition": ranked} if ranked else common
            out.append(SiteSmokeJob(f"gpus=1 class={name}", gpu_fields, (GPU_GRES, class_gpus)))
        if class_fpgas:
            out.append(SiteSmokeJob(f"fpga=1 class={name}", common, (FPGA_GRES, class_fpgas)))
    out += [SiteSmokeJob(f"gpus=1 gpu-type={m}",
                         {"tres_per_node": f"{gres_prefix}{GPU_GRES}:{m}:1"}) for m in gpus]
    out += [SiteSmokeJob(f"fpga={m}", {"tres_per_node": f"{gres_prefix}{FPGA_GRES}:{m}:1"})
            for m in fpgas]
    return out


def _smoke_problem(job: SiteSmokeJob, res: CallResult) -> str | None:
    """What is wrong with the hook's answer to ``job`` (None: it is what the site says)."""
    if not res.ok:
        return f"raised: {res.error}"
    errors = [m for level, m in res.log if level == "error"]
    if errors:
        return f"logged an internal error: {errors[0]}"
    if res.rc != 0:
        return f"rejected it (rc {res.rc}): {'; '.join(res.user_messages)}"
    got = res.fields
    expects_a_write = job.models is not None or any(v is not None for v in job.fields.values())
    if expects_a_write and not got:
        return "passed it unchanged (fail-open)"
    for key, want in job.fields.items():
        if got.get(key) != want:
            return f"wrote {key}={got.get(key)!r}, the site says {want!r}"
    if job.models is not None:
        gres, want_models = job.models
        offered = _offered_models(got, gres)
        if gres == GPU_GRES and offered != want_models:
            return f"offers {gres} models {list(offered)}, the site says {list(want_models)}"
        if gres == FPGA_GRES and (not offered or not set(offered) <= set(want_models)):
            return f"offers {gres} models {list(offered)}, the site allows {list(want_models)}"
    return None


def _offered_models(fields: dict[str, Any], gres: str) -> tuple[str, ...]:
    """The models a rewritten job may land on: a typed gres's model, else its features."""
    typed = re.findall(rf"gres[:/]{gres}:([^:,]+):\d+", str(fields.get("tres_per_node") or ""))
    if typed:
        return tuple(typed)
    features = fields.get("features")
    return tuple(str(features).split("|")) if features else ()


def validate_text(text: str, site: Site | None = None, *,
                  decisions_text: str | None = None) -> ValidationResult:
    """Load ``text`` as slurmctld would (Lua 5.1) and run the smoke jobs through it; with
    ``site``, also :func:`site_smoke_jobs`, through ``decisions_text`` when given (the same
    hook without the site's chained scripts, which may rewrite the same fields) or ``text``,
    switched to ``enforce``."""
    head = render_mod.header(text)
    try:
        rt = HookRuntime(text)
    except HookLoadError as e:
        return ValidationResult(False, f"does not load in Lua 5.1: {e}", head)
    for job in SMOKE_JOBS:
        res = rt.submit(job)
        if not res.ok:
            return ValidationResult(False, f"raised on a smoke job {job}: {res.error}", head)
        errors = [m for level, m in res.log if level == "error"]
        if errors:
            return ValidationResult(False, f"logged an internal error on a smoke job: "
                                    f"{errors[0]}", head)
    if site is None:
        return ValidationResult(True, None, head)
    try:
        enforcing = HookRuntime(render_mod.set_mode(decisions_text or text, "enforce"))
    except (HookLoadError, ConfigError) as e:
        return ValidationResult(False, f"cannot be checked in enforce mode: {e}", head)
    for sj in site_smoke_jobs(site, enforcing.release.gres_prefix):
        res = enforcing.submit({"script": f"#!/bin/sh\n#HET {sj.directive}\ntrue\n",
                                "user_name": "root"})
        problem = _smoke_problem(sj, res)
        if problem:
            return ValidationResult(False, f"gave a wrong answer to '#HET {sj.directive}': "
                                    f"{problem}", head)
    return ValidationResult(True, None, head)


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
    #: Why the file this install replaced was unsafe (e.g. ``writable by others (mode
    #: 0666)``); None when it was safe or absent.
    replaced_unsafe: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def install_text(text: str, conf_dir: str | Path, *, now: float | None = None,
                 site: Site | None = None, decisions_text: str | None = None
                 ) -> InstallResult:
    """Validate ``text`` (with ``site``, its classes and models too: :func:`validate_text`)
    and write it as ``conf_dir/job_submit.lua`` (atomic, newer mtime).

    Raises:
        ConfigError: the text does not load or fails a smoke job (nothing is written), or
            the folder is missing.
    """
    folder = Path(conf_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder (give the folder that holds slurm.conf)")
    # Whoever can write the folder can swap the hook after it is written.
    fsguard.check_dir(folder, "Slurm configuration folder", follow=True)
    check = validate_text(text, site, decisions_text=decisions_text)
    if not check.ok:
        raise ConfigError(f"the rendered job_submit.lua {check.error}; nothing was installed, "
                          "the controller keeps the current one")
    head = check.header or {}
    target = folder / HOOK_FILE
    previous_build = previous_mtime = None
    unsafe = None
    installed = _installed(target)
    if installed is not None:
        st, unsafe = installed
        if unsafe is not None and not unsafe.startswith("writable"):
            # Not ours (another owner) or not a plain file: replacing it silently would
            # hide whatever put it there.
            raise PermissionsError(f"refusing installed hook {target}: {unsafe}; "
                                   f"{_remedy(target, unsafe)}")
        old = _read_installed(target)
        previous_mtime = int(st.st_mtime)
        prev_head = render_mod.header(old)
        previous_build = prev_head["build"] if prev_head else None
        if old == text and unsafe is None:
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
                         head.get("mode", "?"), mtime, previous_build, previous_mtime,
                         unsafe)


def _installed(target: Path) -> tuple[os.stat_result, str | None] | None:
    """The installed file's ``lstat`` and why it cannot be trusted (None: it can), or None
    when there is no file."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return st, "it is a symlink"
    if not stat.S_ISREG(st.st_mode):
        return st, "it is not a regular file"
    return st, fsguard.problem(st)


def _remedy(target: Path, why: str) -> str:
    if why.startswith("owned"):
        return f"check who wrote it, then remove it or chown root {target}"
    if why.startswith("writable"):
        return "its text may not be ours: run hetslurm hook install to replace it"
    return "check what it is, then remove it"


def _read_installed(target: Path) -> str:
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as fh:
        return fh.read()


def install_hook(
    site: Site,
    conf_dir: str | Path,
    *,
    mode: str | None = None,
    chain_before: str | None = None,
    chain_after: str | None = None,
    now: float | None = None,
    slurm: str = versions.DEFAULT,
) -> InstallResult:
    """Render the hook for ``site`` and the controller's Slurm release ``slurm`` and install
    it (see :func:`install_text`)."""
    rendered = render_mod.render_hook(site, mode=mode, chain_before=chain_before,
                                      chain_after=chain_after, slurm=slurm)
    plain = None
    if chain_before is not None or chain_after is not None:
        plain = render_mod.render_hook(site, mode=mode, slurm=slurm).text
    return install_text(rendered.text, conf_dir, now=now, site=site, decisions_text=plain)


def set_installed_mode(conf_dir: str | Path, mode: str) -> InstallResult:
    """The kill switch: rewrite the installed hook's mode (``off`` stops every rewrite)."""
    target = Path(conf_dir) / HOOK_FILE
    installed = _installed(target)
    if installed is None:
        raise ConfigError(f"{target} does not exist; nothing to switch")
    unsafe = installed[1]
    if unsafe is not None:
        raise PermissionsError(f"refusing installed hook {target}: {unsafe}; "
                               f"{_remedy(target, unsafe)}")
    return install_text(render_mod.set_mode(_read_installed(target), mode), conf_dir)


_LOAD_FAILED = re.compile(r"job_submit/lua.*(error|using previous script)|"
                          r"job_submit\.lua.*(error|failed)", re.I)


def job_submit_plugins(slurm_conf: Path) -> list[str] | None:
    """The ``JobSubmitPlugins`` of ``slurm_conf`` (``[]`` when the line is absent), None when
    the file cannot be read. Slurm runs ``job_submit.lua`` only when the list holds ``lua``."""
    if not slurm_conf.is_file():
        return None
    value = slurm_conf_value(slurm_conf, "JobSubmitPlugins") or ""
    return [p.strip().lower() for p in value.split(",") if p.strip()]


def check_hook(conf_dir: str | Path, log_file: str | Path | None = None,
               slurm: str | None = None) -> dict[str, Any]:
    """Which hook is installed, whether it loads, and which one the controller last loaded.

    The controller's answer comes from ``slurmctld.log``: the hook logs
    ``hetslurm hook loaded: ... build=...`` every time slurmctld (re)loads it. slurmctld
    reloads lazily, at the next submission after the file changed. ``slurm``: the release
    the controller runs, when known; a hook rendered for another one (left from before a
    Slurm upgrade) has every GPU and FPGA job refused, and ``slurm_matches`` says so.
    """
    target = Path(conf_dir) / HOOK_FILE
    installed = _installed(target)
    plugins = job_submit_plugins(Path(conf_dir) / "slurm.conf")
    out: dict[str, Any] = {"path": str(target), "installed": installed is not None,
                           "job_submit_plugins": plugins,
                           "lua_plugin": None if plugins is None else
                           any(p in ("lua", "job_submit/lua") for p in plugins)}
    if installed is None:
        out.update(installed_build=None, loads=None, running_build=None, in_sync=False,
                   file_mode=None, owner_uid=None, permissions=None)
        return out
    st, unsafe = installed
    # A symlink is reported, not followed: what it points at is not what was installed.
    text = _read_installed(target) if stat.S_ISREG(st.st_mode) else ""
    head = render_mod.header(text) or {}
    check = validate_text(text)
    out.update(
        installed_build=head.get("build"),
        installed_rules=head.get("rules"),
        installed_mode=head.get("mode"),
        site=head.get("site"),
        mtime=int(st.st_mtime),
        file_mode=fsguard.mode_text(st),
        owner_uid=st.st_uid,
        permissions="ok" if unsafe is None else f"unsafe: {unsafe}",
        loads=check.ok,
        load_error=check.error,
        slurm_rendered_for=head.get("slurm"),
        slurm_running=slurm,
        slurm_matches=None if slurm is None else slurm == head.get("slurm"),
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


_CHAINED = re.compile(r"^CHAIN\.(before|after) = \(function\(\)$", re.M)


class InstalledHook:
    """The hook installed in ``conf_dir``, as ``site apply`` keeps it in step with the site
    (:class:`hetslurm.levers.live.HookFile`): re-rendered with the installed file's mode and
    Slurm release, checked and installed as ``hook install`` does."""

    def __init__(self, conf_dir: str | Path) -> None:
        self.conf_dir = Path(conf_dir)

    def installed(self) -> str | None:
        target = self.conf_dir / HOOK_FILE
        found = _installed(target)
        if found is None or not stat.S_ISREG(found[0].st_mode):
            return None
        text = _read_installed(target)
        return text if render_mod.header(text) is not None else None

    def render(self, site: Site) -> str:
        old = self.installed()
        head = render_mod.header(old or "") or {}
        if old is not None and _CHAINED.search(old):
            if head.get("rules") == hook_rules(site)["digest"]:
                return old  # the same rules: nothing to re-render
            raise ConfigError(f"{self.conf_dir / HOOK_FILE} chains a site script, which "
                              "`site apply` cannot re-render; run `hetslurm hook install` "
                              "with the site and its --chain-before/--chain-after instead; "
                              "nothing was changed")
        mode = head.get("mode")
        text = render_mod.render_hook(site, mode=mode if mode in render_mod.MODES else None,
                                      slurm=head.get("slurm") or versions.DEFAULT).text
        check = validate_text(text, site)
        if not check.ok:
            raise ConfigError(f"the hook rendered for the site {check.error}; nothing was "
                              "changed")
        return text

    def install(self, text: str) -> None:
        install_text(text, self.conf_dir)

    def describe(self, text: str | None) -> str | None:
        head = render_mod.header(text or "")
        if head is None:
            return None
        return f"rules={head['rules']} build={head['build']} mode={head['mode']}"
