"""``hetslurm explain job.sh``: what the hook would do to a job, and where it would run now.

The hook itself is not re-implemented: the rendered ``job_submit.lua`` (for the site, or an
installed file) runs in lupa's Lua 5.1 with the strict 22.05 stand-ins
(:mod:`hetslurm.hook.standin`). The job description is built from the script and a few
sbatch options (given on the command line or as ``#SBATCH`` lines), converted the way
Slurm 22.05 hands them to the plugin (measured: ``--gres=gpu:2`` arrives as
``tres_per_node="gres:gpu:2"``, ``--gpus=a100:2`` as ``tres_per_job="gres:gpu:a100:2"``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hetslurm.errors import ConfigError
from hetslurm.hook import render as render_mod
from hetslurm.hook.standin import NO_VAL, NO_VAL16, HookRuntime
from hetslurm.request.record import find_record
from hetslurm.site.hook_rules import hook_policy
from hetslurm.site.model import Site
from hetslurm.slurm import versions
from hetslurm.slurm.units import time_seconds
from hetslurm.textfile import MAX_DATA_BYTES, read_text_file

if TYPE_CHECKING:
    from hetslurm.placement.model import ClusterModel
    from hetslurm.placement.place import ScoreWeights
    from hetslurm.placement.state import LiveState

    #: (model, live state or None, weights) -> (model with measured inputs, summary).
    Measure = Callable[[ClusterModel, LiveState | None, ScoreWeights],
                       tuple[ClusterModel, dict[str, Any]]]

_MEM = re.compile(r"^(\d+)([KMGT]?)$", re.I)
_MEM_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1 << 20}


@dataclass(frozen=True)
class SbatchOption:
    """One sbatch option explain passes to the hook: its names and the JobOptions field."""

    long: str
    short: str | None
    attr: str
    help: str


#: Every sbatch option whose job_desc field the hook reads (job_submit/hethook.lua), one
#: table for the ``#SBATCH`` parser and the ``explain`` command line (``job_values`` says
#: which field each fills, as Slurm 22.05 fills it). ``--requeue/--no-requeue`` is a flag
#: of its own.
SBATCH_OPTIONS: tuple[SbatchOption, ...] = (
    SbatchOption("partition", "p", "partition", "As sbatch --partition."),
    SbatchOption("qos", "q", "qos", "As sbatch --qos."),
    SbatchOption("account", "A", "account", "As sbatch --account."),
    SbatchOption("constraint", "C", "constraint", "As sbatch --constraint."),
    SbatchOption("gres", None, "gres", "As sbatch --gres (e.g. gpu:2)."),
    SbatchOption("gres-flags", None, "gres_flags",
                 "As sbatch --gres-flags (enforce-binding or disable-binding)."),
    SbatchOption("gpus", "G", "gpus", "As sbatch --gpus (e.g. a100:2)."),
    SbatchOption("gpus-per-node", None, "gpus_per_node", "As sbatch --gpus-per-node."),
    SbatchOption("gpus-per-task", None, "gpus_per_task", "As sbatch --gpus-per-task."),
    SbatchOption("gpus-per-socket", None, "gpus_per_socket", "As sbatch --gpus-per-socket."),
    SbatchOption("nodes", "N", "nodes", "As sbatch --nodes (N or MIN-MAX)."),
    SbatchOption("ntasks", "n", "ntasks", "As sbatch --ntasks."),
    SbatchOption("ntasks-per-node", None, "ntasks_per_node", "As sbatch --ntasks-per-node."),
    SbatchOption("cpus-per-task", "c", "cpus_per_task", "As sbatch --cpus-per-task."),
    SbatchOption("mincpus", None, "mincpus", "As sbatch --mincpus."),
    SbatchOption("sockets-per-node", None, "sockets_per_node",
                 "As sbatch --sockets-per-node."),
    SbatchOption("cores-per-socket", None, "cores_per_socket",
                 "As sbatch --cores-per-socket."),
    SbatchOption("mem", None, "mem", "As sbatch --mem (e.g. 16G)."),
    SbatchOption("mem-per-cpu", None, "mem_per_cpu", "As sbatch --mem-per-cpu (e.g. 4G)."),
    SbatchOption("switches", None, "switches", "As sbatch --switches (COUNT[@MAX-TIME])."),
    SbatchOption("comment", None, "comment", "Job comment, e.g. 'het: gpus=2' (srun/salloc)."),
    SbatchOption("array", "a", "array", "As sbatch --array."),
)


@dataclass(frozen=True)
class JobOptions:
    """The sbatch options explain understands (:data:`SBATCH_OPTIONS`); ``None`` = not
    given."""

    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    constraint: str | None = None
    gres: str | None = None
    gres_flags: str | None = None
    gpus: str | None = None
    gpus_per_node: str | None = None
    gpus_per_task: str | None = None
    gpus_per_socket: str | None = None
    nodes: str | None = None
    ntasks: str | None = None
    ntasks_per_node: str | None = None
    cpus_per_task: str | None = None
    mincpus: str | None = None
    sockets_per_node: str | None = None
    cores_per_socket: str | None = None
    mem: str | None = None
    mem_per_cpu: str | None = None
    switches: str | None = None
    comment: str | None = None
    array: str | None = None
    user: str = "root"
    requeue: bool | None = None

    def merged(self, other: JobOptions) -> JobOptions:
        """``other``'s given values over this one's (command line over ``#SBATCH``)."""
        values = {k: v for k, v in asdict(other).items()
                  if v is not None and not (k == "user" and v == "root")}
        return replace(self, **values)


_LONG = {o.long: o.attr for o in SBATCH_OPTIONS}
_SHORT = {o.short: o.attr for o in SBATCH_OPTIONS if o.short}


def sbatch_options(script: str) -> JobOptions:
    """The options of ``#SBATCH`` lines in the script's header that explain understands.

    Others are ignored (explain says which fields it set). The header ends, as for sbatch, at
    the first line that is neither blank nor a comment.
    """
    values: dict[str, Any] = {}
    for line in script.splitlines()[:10000]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if not line.startswith("#SBATCH"):
            continue
        try:
            words = shlex.split(line[len("#SBATCH"):], comments=True)
        except ValueError:
            continue
        i = 0
        while i < len(words):
            w = words[i]
            key = value = None
            if w.startswith("--"):
                name, eq, value = w[2:].partition("=")
                if name in ("requeue", "no-requeue"):
                    values["requeue"] = name == "requeue"
                    i += 1
                    continue
                key = _LONG.get(name)
                if key and not eq and i + 1 < len(words):
                    value = words[i + 1]
                    i += 1
            elif w.startswith("-") and len(w) >= 2:
                key = _SHORT.get(w[1])
                value = w[2:] or (words[i + 1] if i + 1 < len(words) else "")
                if key and not w[2:]:
                    i += 1
            if key and value:
                values[key] = value
            i += 1
    return JobOptions(**values)


def _mem_mib(option: str, text: str) -> int:
    m = _MEM.match(text.strip())
    if not m:
        raise ConfigError(f"--{option}={text}: write e.g. 16G or 16000 (MiB)")
    return int(int(m.group(1)) * _MEM_FACTOR[m.group(2).upper()])


def _count(option: str, text: str, high: int) -> int:
    """A whole number as sbatch takes it; sbatch refuses the submission otherwise."""
    t = text.strip()
    if not t.isdigit() or not 0 <= int(t) <= high:
        raise ConfigError(f"--{option}={text}: not a count in 0..{high}")
    return int(t)


def _gres_tres(spec: str, prefix: str) -> str:
    # Slurm prepends "gres:" (22.05) or "gres/" (24.11 on) to each --gres entry.
    return ",".join(p if p.startswith(prefix) else prefix + p for p in spec.split(",") if p)


def _gpus_tres(spec: str, prefix: str) -> str:
    # xfmt_tres(..., "gres:gpu", spec) in 22.05: "gres:gpu:" before each entry.
    return ",".join(prefix + "gpu:" + p for p in spec.split(",") if p)


def _join(*parts: str | None) -> str | None:
    joined = ",".join(p for p in parts if p)
    return joined or None


def job_values(script: str | None, opts: JobOptions, gres_prefix: str = "gres:"
               ) -> dict[str, Any]:
    """The job description fields a submission with these options carries, in the form
    Slurm 22.05's sbatch and slurmctld hand them to job_submit/lua (``gres_prefix``: the
    release's gres form, ``"gres/"`` from 24.11).

    Raises:
        ConfigError: A value sbatch would refuse (a count that is not a number, a memory
            size or time it cannot read, an unknown --gres-flags).
    """
    values: dict[str, Any] = {"user_name": opts.user, "name": "explain"}
    if script is not None:
        values["script"] = script
    for attr, fld in (("partition", "partition"), ("qos", "qos"), ("account", "account"),
                      ("constraint", "features"), ("array", "array_inx")):
        if getattr(opts, attr):
            values[fld] = getattr(opts, attr)
    if opts.comment is not None:
        values["comment"] = opts.comment
    # --gres and --gpus-per-node share tres_per_node: sbatch appends the GPUs to the gres.
    tpn = _join(_gres_tres(opts.gres, gres_prefix) if opts.gres else None,
                _gpus_tres(opts.gpus_per_node, gres_prefix) if opts.gpus_per_node else None)
    for fld, value in (("tres_per_node", tpn),
                       ("tres_per_job", opts.gpus and _gpus_tres(opts.gpus, gres_prefix)),
                       ("tres_per_task",
                        opts.gpus_per_task and _gpus_tres(opts.gpus_per_task, gres_prefix)),
                       ("tres_per_socket",
                        opts.gpus_per_socket and _gpus_tres(opts.gpus_per_socket, gres_prefix))):
        if value:
            values[fld] = value
    if opts.gres_flags:
        flags = {"enforce-binding": 16, "disable-binding": 524288}  # GRES_*_BIND in 22.05
        if opts.gres_flags not in flags:
            raise ConfigError(f"--gres-flags={opts.gres_flags}: expected enforce-binding or "
                              "disable-binding")
        values["bitflags"] = flags[opts.gres_flags]
    if opts.nodes is not None:
        low, _, most = opts.nodes.partition("-")
        values["min_nodes"] = _count("nodes", low, NO_VAL - 1)
        values["max_nodes"] = _count("nodes", most, NO_VAL - 1) if most else values["min_nodes"]
    for attr, fld, high in (("ntasks", "num_tasks", NO_VAL - 1),
                            ("ntasks_per_node", "ntasks_per_node", NO_VAL16 - 1),
                            ("cpus_per_task", "cpus_per_task", NO_VAL16 - 1),
                            ("mincpus", "pn_min_cpus", NO_VAL16 - 1),
                            ("sockets_per_node", "sockets_per_node", NO_VAL16 - 1),
                            ("cores_per_socket", "cores_per_socket", NO_VAL16 - 1)):
        text = getattr(opts, attr)
        if text is not None:
            values[fld] = _count(attr.replace("_", "-"), text, high)
    if opts.mem:
        values["min_mem_per_node"] = _mem_mib("mem", opts.mem)
    if opts.mem_per_cpu:
        values["min_mem_per_cpu"] = _mem_mib("mem-per-cpu", opts.mem_per_cpu)
    if opts.switches:
        count, _, wait = opts.switches.partition("@")
        values["req_switch"] = _count("switches", count, NO_VAL - 1)
        if wait:
            try:
                seconds = time_seconds(wait)
            except ValueError:
                seconds = None
            if not isinstance(seconds, int):
                raise ConfigError(f"--switches={opts.switches}: {wait!r} is not a Slurm time")
            values["wait4switch"] = seconds
    if opts.requeue is not None:
        values["requeue"] = 1 if opts.requeue else 0
    return values


@dataclass
class Explanation:
    outcome: str  # unchanged | rewritten | rejected | hook-error
    rc: int | None
    messages: list[str]
    writes: list[tuple[str, Any]]
    job_before: dict[str, Any]
    record: str | None
    hook: dict[str, str]
    placement: dict[str, Any] | None = None
    placement_note: str | None = None
    log: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["writes"] = [{"field": f, "value": v} for f, v in self.writes]
        d["job_before"] = {k: v for k, v in self.job_before.items() if k != "script"}
        return d


def explain(
    script: str | None,
    site: Site,
    opts: JobOptions | None = None,
    *,
    hook_text: str | None = None,
    state: str | None = None,
    slurm: str | None = None,
    measure: Measure | None = None,
) -> Explanation:
    """Run the hook on one job in-process and say what it did and where the job would go.

    Args:
        script: The batch script text, or None for srun/salloc (then ``opts.comment``).
        site: The site (renders the hook unless ``hook_text`` is given; placement).
        opts: sbatch options; the script's ``#SBATCH`` lines are read first.
        hook_text: An installed ``job_submit.lua`` to run instead of rendering one.
        state: ``None`` (an empty cluster), ``"live"`` or a ``hetslurm state dump`` file.
        slurm: The Slurm release to stand in for (``"24.11"``); ``None``: the one the hook
            text was rendered for (22.05 when rendering here).
        measure: Given the model (with its state), the live state (None when empty) and the
            site's score weights, returns the model with measured inputs applied and a
            summary (the CLI passes ``hetslurm.cli.place_cmd.apply_measured``; the hook
            room does not read the metrics store itself).

    Raises:
        ConfigError: The state file cannot be read as text (what it says is judged later,
            and a placement that fails is a note, never fatal).
    """
    state_text = None
    if state is not None and state != "live":
        state_text = read_text_file(state, what="state file", max_bytes=MAX_DATA_BYTES)
    base = sbatch_options(script) if script is not None else JobOptions()
    opts = base.merged(opts) if opts is not None else base
    if hook_text is None:
        hook_text = render_mod.render_hook(site, slurm=slurm or versions.DEFAULT).text
    rt = HookRuntime(hook_text, slurm=slurm)
    values = job_values(script, opts, rt.release.gres_prefix)
    res = rt.submit(values)
    if not res.ok:
        outcome = "hook-error"
    elif res.rc != 0 or res.refused:
        outcome = "rejected"
    elif res.writes:
        outcome = "rewritten"
    else:
        outcome = "unchanged"
    head = render_mod.header(hook_text) or {}
    record = None
    for f, v in res.writes:
        if isinstance(v, str) and "{" in v and f in ("admin_comment", "comment"):
            record = v
    messages = list(res.user_messages) + ([res.refused] if res.refused else [])
    if not res.ok:
        # What slurmctld does with a Lua error the script did not catch depends on the release.
        messages.append(
            f"Slurm {rt.release.name} rejects the job on this Lua error" if
            rt.release.lua_error_rejects else
            f"Slurm {rt.release.name} logs this Lua error and accepts the job as it stands")
    ex = Explanation(
        outcome=outcome, rc=res.rc, writes=list(res.writes),
        messages=messages,
        job_before=values, record=record, hook=head,
        log=[f"{lvl}: {msg}" for lvl, msg in res.log] + ([res.error] if res.error else []),
    )
    if outcome == "rewritten":
        _add_placement(ex, site, state, state_text, measure)
    elif outcome == "unchanged":
        ex.placement_note = "no #HET request: the hook leaves the job to Slurm"
    return ex


def _request_text(record: str | None, key: str) -> str | None:
    rec = find_record(record, key)
    return rec.request if rec is not None else None


def _add_placement(ex: Explanation, site: Site, state: str | None,
                   state_text: str | None, measure: Measure | None = None) -> None:
    """Where ``hetslurm place`` would put the request now (read-only; never fatal)."""
    text = _request_text(ex.record, hook_policy(site).record_key)
    if text is None:
        ex.placement_note = ("placement skipped: the decision record (its request) is not "
                             "written with this site's [hook] record_field")
        return
    try:
        from hetslurm.placement.model import ClusterModel
        from hetslurm.placement.place import ScoreWeights, place
        from hetslurm.request.language import parse_request, resolve

        own = ex.job_before.get("partition")
        request = resolve(parse_request(text), site,
                          job_partition=own if isinstance(own, str) else None)
        model = ClusterModel.from_site(site)
        weights = ScoreWeights.from_site(site)
        live = None
        if state is not None:
            from hetslurm.placement.state import LiveState

            if state_text is None:
                from hetslurm.slurm import get_backend

                live = LiveState.from_backend(get_backend())
            else:
                live = LiveState.from_json(state_text)
            model = model.with_state(live)
        measured: dict[str, Any] = {}
        if measure is not None:
            model, measured = measure(model, live, weights)
        ex.placement = place(model, request, weights=weights).to_dict()
        ex.placement["weights"] = weights.to_dict()
        ex.placement["measured"] = measured
        ex.placement_note = f"placed the request '{text}' on " + (
            "the empty cluster" if state is None else f"state {state}")
    except Exception as e:
        ex.placement_note = f"placement unavailable: {type(e).__name__}: {e}"
