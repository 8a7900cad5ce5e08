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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from hetslurm.errors import HetslurmError
from hetslurm.hook import render as render_mod
from hetslurm.hook.standin import HookRuntime
from hetslurm.site.model import Site
from hetslurm.textfile import MAX_DATA_BYTES, read_text_file

_MEM = re.compile(r"^(\d+)([KMGT]?)$", re.I)
_MEM_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1 << 20}


@dataclass(frozen=True)
class JobOptions:
    """The sbatch options explain understands; ``None`` means "not given"."""

    partition: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gres: str | None = None
    gpus: str | None = None
    gpus_per_task: str | None = None
    gpus_per_socket: str | None = None
    nodes: int | None = None
    mem: str | None = None
    comment: str | None = None
    account: str | None = None
    user: str = "root"
    requeue: bool | None = None
    array: str | None = None

    def merged(self, other: JobOptions) -> JobOptions:
        """``other``'s given values over this one's (command line over ``#SBATCH``)."""
        values = {k: v for k, v in asdict(other).items()
                  if v is not None and not (k == "user" and v == "root")}
        return replace(self, **values)


# option name -> (field, takes a value)
_LONG = {
    "partition": "partition", "qos": "qos", "constraint": "constraint", "gres": "gres",
    "gpus": "gpus", "gpus-per-task": "gpus_per_task", "gpus-per-socket": "gpus_per_socket",
    "nodes": "nodes", "mem": "mem", "comment": "comment", "account": "account",
    "array": "array",
}
_SHORT = {"p": "partition", "q": "qos", "C": "constraint", "G": "gpus", "N": "nodes",
          "A": "account", "a": "array"}


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
            name = value = None
            if w.startswith("--"):
                name, _, value = w[2:].partition("=")
                if name in ("requeue", "no-requeue"):
                    values["requeue"] = name == "requeue"
                    i += 1
                    continue
                key = _LONG.get(name)
                if key and not value and i + 1 < len(words):
                    value = words[i + 1]
                    i += 1
            elif w.startswith("-") and len(w) >= 2:
                key = _SHORT.get(w[1])
                value = w[2:] or (words[i + 1] if i + 1 < len(words) else "")
                if not w[2:]:
                    i += 1
            else:
                key = None
            if name is not None:
                key = _LONG.get(name)
            if key and value:
                values[key] = value
            i += 1
    if "nodes" in values:
        try:
            values["nodes"] = int(str(values["nodes"]).split("-")[0])
        except ValueError:
            values.pop("nodes")
    return JobOptions(**values)


def _mem_mib(text: str) -> int:
    m = _MEM.match(text.strip())
    if not m:
        raise HetslurmError(f"--mem={text}: write e.g. 16G or 16000 (MiB)")
    return int(int(m.group(1)) * _MEM_FACTOR[m.group(2).upper()])


def _gres_tres(spec: str) -> str:
    return ",".join(p if p.startswith("gres:") else "gres:" + p for p in spec.split(",") if p)


def _gpus_tres(spec: str) -> str:
    return ",".join("gres:gpu:" + p for p in spec.split(",") if p)


def job_values(script: str | None, opts: JobOptions) -> dict[str, Any]:
    """The job description fields a submission with these options carries (22.05)."""
    values: dict[str, Any] = {"user_name": opts.user, "name": "explain"}
    if script is not None:
        values["script"] = script
    if opts.partition:
        values["partition"] = opts.partition
    if opts.qos:
        values["qos"] = opts.qos
    if opts.constraint:
        values["features"] = opts.constraint
    if opts.gres:
        values["tres_per_node"] = _gres_tres(opts.gres)
    if opts.gpus:
        values["tres_per_job"] = _gpus_tres(opts.gpus)
    if opts.gpus_per_task:
        values["tres_per_task"] = _gpus_tres(opts.gpus_per_task)
    if opts.gpus_per_socket:
        values["tres_per_socket"] = _gpus_tres(opts.gpus_per_socket)
    if opts.nodes is not None:
        values["min_nodes"] = values["max_nodes"] = opts.nodes
    if opts.mem:
        values["min_mem_per_node"] = _mem_mib(opts.mem)
    if opts.comment is not None:
        values["comment"] = opts.comment
    if opts.account:
        values["account"] = opts.account
    if opts.requeue is not None:
        values["requeue"] = 1 if opts.requeue else 0
    if opts.array:
        values["array_inx"] = opts.array
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
) -> Explanation:
    """Run the hook on one job in-process and say what it did and where the job would go.

    Args:
        script: The batch script text, or None for srun/salloc (then ``opts.comment``).
        site: The site (renders the hook unless ``hook_text`` is given; placement).
        opts: sbatch options; the script's ``#SBATCH`` lines are read first.
        hook_text: An installed ``job_submit.lua`` to run instead of rendering one.
        state: ``None`` (an empty cluster), ``"live"`` or a ``hetslurm state dump`` file.

    Raises:
        ConfigError: The state file cannot be read as text (what it says is judged later,
            and a placement that fails is a note, never fatal).
    """
    state_text = None
    if state is not None and state != "live":
        state_text = read_text_file(state, what="state file", max_bytes=MAX_DATA_BYTES)
    base = sbatch_options(script) if script is not None else JobOptions()
    opts = base.merged(opts) if opts is not None else base
    text = hook_text if hook_text is not None else render_mod.render_hook(site).text
    rt = HookRuntime(text)
    values = job_values(script, opts)
    res = rt.submit(values)
    if not res.ok:
        outcome = "hook-error"
    elif res.rc != 0:
        outcome = "rejected"
    elif res.writes:
        outcome = "rewritten"
    else:
        outcome = "unchanged"
    head = render_mod.header(text) or {}
    record = None
    for f, v in res.writes:
        if isinstance(v, str) and "{" in v and f in ("admin_comment", "comment"):
            record = v
    ex = Explanation(
        outcome=outcome, rc=res.rc, messages=list(res.user_messages), writes=list(res.writes),
        job_before=values, record=record, hook=head,
        log=[f"{lvl}: {msg}" for lvl, msg in res.log] + ([res.error] if res.error else []),
    )
    if outcome == "rewritten":
        _add_placement(ex, site, state, state_text)
    elif outcome == "unchanged":
        ex.placement_note = "no #HET request: the hook leaves the job to Slurm"
    return ex


def _request_text(record: str | None) -> str | None:
    if not record:
        return None
    m = re.search(r'"req":"([^"]*)"', record)
    return m.group(1) if m else None


def _add_placement(ex: Explanation, site: Site, state: str | None,
                   state_text: str | None) -> None:
    """Where ``hetslurm place`` would put the request now (read-only; never fatal)."""
    text = _request_text(ex.record)
    if text is None:
        ex.placement_note = ("placement skipped: the decision record (its request) is not "
                             "written with this site's [hook] record_field")
        return
    try:
        from hetslurm.placement.model import ClusterModel
        from hetslurm.placement.place import place
        from hetslurm.placement.request import parse_request, resolve

        request = resolve(parse_request(text), site)
        model = ClusterModel.from_site(site)
        if state is not None:
            from hetslurm.placement.state import LiveState

            if state_text is None:
                from hetslurm.slurm import get_backend

                live = LiveState.from_backend(get_backend())
            else:
                live = LiveState.from_json(state_text)
            model = model.with_state(live)
        ex.placement = place(model, request).to_dict()
        ex.placement_note = f"placed the request '{text}' on " + (
            "the empty cluster" if state is None else f"state {state}")
    except Exception as e:
        ex.placement_note = f"placement unavailable: {type(e).__name__}: {e}"
