"""``hetslurm simulate --validate``: one committed workload, replayed on the testbed and in
the simulator, compared (docs/simulate.md, "Fidelity").

The workload file (``site-configs/validate-workload.toml``) names the site, the simulator's
parameter file, the testbed's scheduler settings, the simulator's latency terms and the
target, and lists every job: submit offset, class, GPUs, cores, runtime on the reference
GPU model and time limit. All of it is fixed before a run; nothing is fitted to a result.

On the testbed each policy gets a fresh boot of the same folder:

* ``slurm-default``: no job_submit hook, every node ``Weight=1``; jobs submit plain Slurm
  options (``-p gpu --gres=gpu:N -c C``, CPU jobs ``-p <all-nodes partition> -c C``);
* ``hetslurm``: the hook installed and the site's weights; jobs submit ``#HET gpus=N
  class=...`` (the hook writes the partition and the model list).

A job sleeps its runtime on the GPU model of the node it landed on (the script looks up its
node), as the simulator's runtime per model says. Waits and makespan are read from sacct.
"""

from __future__ import annotations

import math
import re
import shutil
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetslurm.errors import ConfigError, TestbedError
from hetslurm.placement.model import ClusterModel
from hetslurm.simulate.easy import replay
from hetslurm.simulate.params import BACKFILLS, Params, load_params
from hetslurm.simulate.traces import TraceJob
from hetslurm.simulate.workload import (
    SimJob,
    build_jobs,
    node_weights,
    partition_names,
    partition_nodes,
)
from hetslurm.site.model import Site
from hetslurm.slurm import SlurmBackend, units
from hetslurm.slurm.parse import parse_slurm_version
from hetslurm.slurm.sacct import SacctRecordError
from hetslurm.textfile import read_text_file

if TYPE_CHECKING:
    from hetslurm.testbed.cluster import Testbed

SCHEMA = "hetslurm-validate-workload/1"
FORMAT = "validate"  # the key of [runtime] reference_model in the parameter file
POLICIES = ("slurm-default", "hetslurm")
#: Job fields of the workload file, and the top-level tables.
_JOB_KEYS = ("id", "submit", "class", "gpus", "cores", "runtime", "limit_min", "nodes",
             "priority")
#: ``priority`` values of a job: the QOS it submits with (``--qos``, or ``#HET priority=``).
PRIORITIES = ("high", "normal")
_TOP_KEYS = ("schema", "site", "params", "testbed", "model", "target", "workload")

Progress = Callable[[str, int, int], None]
Log = Callable[[str], None]


@dataclass(frozen=True)
class WorkloadJob:
    """One job of the workload.

    Attributes:
        id: the job name (``sbatch -J``).
        submit: seconds after the first submission.
        cls: the site class of a GPU job; ``None`` for a CPU job (the CPU class).
        gpus: GPUs of the job, split evenly over its nodes (0 = CPU job).
        cores: cores on each node (``-c``).
        runtime: seconds on the parameter file's reference model (any node for CPU jobs).
        limit_min: time limit in whole minutes (Slurm keeps limits in minutes).
        nodes: nodes of the job (``-N``); the simulator derives the same from ``gpus`` and
            the site's GPUs per node, which :func:`plan` checks.
        priority: ``high`` (QOS ``high``) or ``normal``.
    """

    id: str
    submit: float
    cls: str | None
    gpus: int
    cores: int
    runtime: float
    limit_min: int
    nodes: int = 1
    priority: str = "normal"


@dataclass(frozen=True)
class Target:
    """Pass when |sim - testbed| <= max(relative x testbed, the absolute margin)."""

    relative: float
    wait_abs_s: float
    makespan_abs_s: float


@dataclass(frozen=True)
class Workload:
    """The committed workload and everything the comparison fixes in advance."""

    path: str
    site_file: Path
    params_file: Path
    scheduler_parameters: str
    backfill: str
    start_latency_s: float
    hold_extra_s: float
    target: Target
    jobs: tuple[WorkloadJob, ...]

    def head(self, n: int | None) -> Workload:
        """The first ``n`` jobs (all when ``None``)."""
        return self if n is None else replace(self, jobs=self.jobs[:n])


def load_workload(path: str | Path) -> Workload:
    """Read and check a workload file; paths in it are relative to the file.

    Raises:
        ConfigError: a missing or unknown key, a wrong type, a duplicate id, a time limit
            shorter than the job's slowest runtime, jobs not in submit order.
    """
    p = Path(path)
    try:
        data = tomllib.loads(read_text_file(p, what="workload file"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
    _only(data, _TOP_KEYS, f"{p}")
    if data.get("schema") != SCHEMA:
        raise ConfigError(f"{p}: schema = {data.get('schema')!r}, expected {SCHEMA!r}")
    tb = _table(data, "testbed", p, ("scheduler_parameters",))
    mdl = _table(data, "model", p, ("backfill", "start_latency_s", "hold_extra_s"))
    tgt = _table(data, "target", p, ("relative", "wait_abs_s", "makespan_abs_s"))
    raw_jobs = _table(data, "workload", p, ("jobs",)).get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ConfigError(f"{p}: [workload] jobs must be a non-empty array of tables")
    jobs: list[WorkloadJob] = []
    seen: set[str] = set()
    for i, rj in enumerate(raw_jobs):
        where = f"{p}: [workload] jobs[{i}]"
        if not isinstance(rj, dict):
            raise ConfigError(f"{where} is not a table")
        _only(rj, _JOB_KEYS, where)
        cls = rj.get("class")
        job = WorkloadJob(
            id=_str(rj, "id", where), submit=_num(rj, "submit", where),
            cls=None if cls is None else _str(rj, "class", where),
            gpus=_int(rj, "gpus", where, 0), cores=_int(rj, "cores", where, 1),
            runtime=_num(rj, "runtime", where, 1e-9),
            limit_min=_int(rj, "limit_min", where, 1),
            nodes=_int(rj, "nodes", where, 1) if "nodes" in rj else 1,
            priority=(_choice(rj, "priority", where, PRIORITIES) if "priority" in rj
                      else "normal"),
        )
        if job.id in seen:
            raise ConfigError(f"{where}: id '{job.id}' appears twice")
        if (job.gpus > 0) != (job.cls is not None):
            raise ConfigError(f"{where}: a GPU job names its class, a CPU job none")
        if job.gpus % job.nodes or (job.nodes > 1 and not job.gpus):
            raise ConfigError(f"{where}: {job.gpus} GPUs do not split evenly over "
                              f"{job.nodes} nodes (a CPU job runs on one node)")
        if jobs and job.submit < jobs[-1].submit:
            raise ConfigError(f"{where}: jobs must be in submit order")
        seen.add(job.id)
        jobs.append(job)
    target = Target(_num(tgt, "relative", f"{p}: [target]", 1e-9),
                    _num(tgt, "wait_abs_s", f"{p}: [target]"),
                    _num(tgt, "makespan_abs_s", f"{p}: [target]"))
    return Workload(
        path=str(p), site_file=(p.parent / _str(data, "site", str(p))).resolve(),
        params_file=(p.parent / _str(data, "params", str(p))).resolve(),
        scheduler_parameters=_str(tb, "scheduler_parameters", f"{p}: [testbed]"),
        backfill=_choice(mdl, "backfill", f"{p}: [model]", BACKFILLS),
        start_latency_s=_num(mdl, "start_latency_s", f"{p}: [model]"),
        hold_extra_s=_num(mdl, "hold_extra_s", f"{p}: [model]"),
        target=target, jobs=tuple(jobs),
    )


def _only(d: Mapping[str, Any], keys: Sequence[str], where: str) -> None:
    extra = sorted(set(d) - set(keys))
    if extra:
        raise ConfigError(f"{where}: unknown key '{extra[0]}'; keys: {', '.join(keys)}")


def _table(d: Mapping[str, Any], key: str, p: Path, keys: Sequence[str]) -> dict[str, Any]:
    t = d.get(key)
    if not isinstance(t, dict):
        raise ConfigError(f"{p}: [{key}] is missing")
    _only(t, keys, f"{p}: [{key}]")
    return t


def _str(d: Mapping[str, Any], key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise ConfigError(f"{where}: {key} = {v!r} is not a non-empty string")
    return v


def _choice(d: Mapping[str, Any], key: str, where: str, choices: Sequence[str]) -> str:
    v = d.get(key)
    if v not in choices:
        raise ConfigError(f"{where}: {key} = {v!r} is not one of {', '.join(choices)}")
    return str(v)


def _num(d: Mapping[str, Any], key: str, where: str, low: float = 0.0) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not v >= low:
        raise ConfigError(f"{where}: {key} = {v!r} is not a number >= {low:g}")
    return float(v)


def _int(d: Mapping[str, Any], key: str, where: str, low: int) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ConfigError(f"{where}: {key} = {v!r} is not an integer >= {low}")
    return v


# --- the simulator's side -------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What each policy submits: the simulator's jobs (index = workload order), and the
    runtime of each job per GPU model index (-1: CPU-only node), before latency terms."""

    site: Site
    params: Params
    jobs: dict[str, list[SimJob]]
    runtimes: list[dict[int, float]]


def plan(w: Workload, site: Site, params: Params, policies: Sequence[str]) -> Plan:
    """The simulator's jobs for ``policies``; every workload job must be replayable.

    Raises:
        ConfigError: a job the site cannot run, a limit below a job's slowest runtime.
    """
    # ``cores`` is per node in the workload, for the whole job in a trace.
    tjobs = [TraceJob(j.id, j.submit, j.runtime, j.gpus, cores=j.cores * j.nodes,
                      job_type=j.cls, qos=j.priority) for j in w.jobs]
    # The testbed runs the site file's class orders as written: no learned ranking was
    # applied to it, so the simulator's hetslurm replays it without the ``speeds`` part.
    params = replace(params, policies={
        name: replace(pol, without=pol.without | {"speeds"}) if pol.use_classes else pol
        for name, pol in params.policies.items()})
    # A priority the testbed submits (--qos / #HET priority=) must be one the simulator
    # replays: every policy orders by it, and the parameter file maps it to itself.
    off = [p for p in policies if not params.policy(p).use_priority]
    for wj in w.jobs:
        if wj.priority != "normal" and (
                off or params.priority_by_qos.get(wj.priority) != wj.priority):
            raise ConfigError(
                f"{w.path}: job {wj.id} has priority {wj.priority}, which {params.path} "
                f"does not replay (needs [jobs] priority_by_qos = {{ {wj.priority} = "
                f'"{wj.priority}" }} and use_priority = true in every policy'
                + (f"; off in {', '.join(off)})" if off else ")"))
    jobs, dropped = build_jobs(tjobs, FORMAT, site, params, policies)
    if any(dropped.values()) or any(len(v) != len(w.jobs) for v in jobs.values()):
        raise ConfigError(f"{w.path}: jobs the site cannot run: {dropped}")
    runtimes = [dict(j.runtime) for j in jobs[policies[0]]]
    for p in policies:
        for wj, sj in zip(w.jobs, jobs[p], strict=True):
            if sj.kr.nodes != wj.nodes:
                raise ConfigError(f"{w.path}: job {wj.id} names {wj.nodes} nodes; the site "
                                  f"holds its {wj.gpus} GPUs on {sj.kr.nodes}")
    for wj, sj in zip(w.jobs, jobs[policies[0]], strict=True):
        slowest = max(v for k, v in sj.runtime.items() if math.isfinite(v))
        if slowest + w.hold_extra_s > wj.limit_min * 60:
            raise ConfigError(f"{w.path}: job {wj.id} runs up to {slowest:g} s, over its "
                              f"limit of {wj.limit_min} min")
    return Plan(site, params, jobs, runtimes)


@dataclass(frozen=True)
class Outcome:
    """One policy's jobs as they ran: per job (id, submit, start, end, node or model)."""

    submit: list[float]
    start: list[float]
    end: list[float]
    where: list[str]
    #: The wall clock (epoch seconds) at time 0, the first submission: set for a testbed
    #: run (the simulator replays the same clock phase, :func:`clock_phase`).
    clock0: float | None = None

    @property
    def waits(self) -> list[float]:
        return [s - q for q, s in zip(self.submit, self.start, strict=True)]

    def figures(self) -> dict[str, float]:
        waits = sorted(self.waits)
        n = len(waits)
        return {
            "jobs": n,
            "mean_wait_s": round(sum(waits) / n, 2),
            "median_wait_s": round(waits[n // 2] if n % 2 else
                                   (waits[n // 2 - 1] + waits[n // 2]) / 2, 2),
            "max_wait_s": round(waits[-1], 2),
            "makespan_s": round(max(self.end) - min(self.submit), 2),
        }


def clock_phase(clock0: float) -> float:
    """Seconds past a multiple of the will-run test's 30 s at wall-clock time ``clock0``
    (cons_tres aligns its batches of running jobs to the epoch: ``end_time % 30``)."""
    from hetslurm.simulate.slurm_backfill import WILL_RUN_WINDOW_S

    return round(math.fmod(clock0, WILL_RUN_WINDOW_S), 3)


#: The clock phases ``--validate`` also replays, for the spread the wall clock alone
#: causes under the "batched" will-run test (every 3 s of the 30 s cycle).
PHASES = tuple(3.0 * i for i in range(10))


def simulate_plan(w: Workload, pl: Plan, policy: str, *, latency: bool = True,
                  backfill: str | None = None, clock_phase_s: float = 0.0,
                  slurm_version: tuple[int, ...] | None = None) -> Outcome:
    """Replay ``policy``'s jobs with ``backfill`` (default: the workload's); with
    ``latency`` a job reaches the scheduler ``start_latency_s`` after its submission and
    holds its allocation ``hold_extra_s`` longer than it sleeps (the workload's
    ``[model]``); waits count from the submission. ``clock_phase_s``: the wall clock's
    seconds past a multiple of 30 s at time 0 (:func:`clock_phase`); ``slurm_version``:
    the Slurm whose will-run test the "batched" model follows (None: the newest)."""
    from hetslurm.simulate.slurm_backfill import replay_slurm

    model = node_weights(ClusterModel.from_site(pl.site), pl.params.policy(policy),
                         pl.params)
    lat = w.start_latency_s if latency else 0.0
    extra = w.hold_extra_s if latency else 0.0
    jobs = [replace(j, submit=j.submit + lat, time_limit=wj.limit_min * 60.0,
                    runtime={k: v + extra for k, v in j.runtime.items()})
            for j, wj in zip(pl.jobs[policy], w.jobs, strict=True)]
    parts = {name: partition_nodes(pl.site, model, name) for name in partition_names(jobs)}
    if (backfill or w.backfill) == "slurm":
        res = replay_slurm(model, jobs, parts, backfill_depth=pl.params.backfill_depth,
                           window_s=pl.params.backfill_window_s,
                           will_run=pl.params.will_run, clock_phase_s=clock_phase_s,
                           slurm_version=slurm_version)
    else:
        res = replay(model, jobs, parts, backfill_depth=pl.params.backfill_depth)
    if res.unfinished:
        raise ConfigError(f"{w.path}: {res.unfinished} jobs never started in the simulator")
    by_index = {r.job.index: r for r in res.records}
    recs = [by_index[i] for i in range(len(w.jobs))]
    return Outcome(
        submit=[wj.submit for wj in w.jobs], start=[r.start for r in recs],
        end=[r.end for r in recs],
        where=[model.gpu_models[r.model] if r.model >= 0 else "cpu" for r in recs],
    )


# --- the testbed's side ---------------------------------------------------------------------


def all_nodes_partition(site: Site) -> str:
    """The partition holding every node: where a job without hetslurm's rewrite that asks
    for no GPU goes (the simulator's ``*``).

    Raises:
        ConfigError: the site has none.
    """
    every = {n.name for n in site.nodes}
    for name, part in site.partitions.items():
        if set(part.nodes) == every:
            return name
    raise ConfigError(f"site '{site.name}' has no partition of every node, which "
                      "slurm-default's CPU jobs need")


def job_script(policy: str, wj: WorkloadJob, sj: SimJob, runtimes: Mapping[int, float],
               site: Site, model: ClusterModel) -> str:
    """The batch script ``policy`` submits for one job: the options (plain, or ``#HET``),
    then a sleep of the job's runtime on the node's GPU model."""
    lines = ["#!/bin/bash", f"#SBATCH -t {wj.limit_min}", f"#SBATCH -c {wj.cores}"]
    if policy == "hetslurm":
        words = [f"gpus={wj.gpus}", f"class={wj.cls}"] if wj.gpus else [f"class={sj.cls}"]
        if wj.nodes > 1:
            words.insert(0, f"nodes={wj.nodes}")
        if wj.priority != "normal":
            words.append(f"priority={wj.priority}")
        lines.append("#HET " + " ".join(words))
    else:
        if wj.gpus:
            lines += [f"#SBATCH -p {sj.partition}",
                      f"#SBATCH --gres=gpu:{wj.gpus // wj.nodes}"]
        else:
            part = all_nodes_partition(site) if sj.partition == "*" else sj.partition
            lines.append(f"#SBATCH -p {part}")
        if wj.nodes > 1:
            lines.append(f"#SBATCH -N {wj.nodes}")
        if wj.priority != "normal":
            lines.append(f"#SBATCH --qos={wj.priority}")
    lines.append('case "$SLURMD_NODENAME" in')
    by_secs: dict[str, list[str]] = {}
    for i, node in enumerate(site.nodes):
        m = int(model.gpu_model[i])
        secs = runtimes.get(m)
        if secs is not None and math.isfinite(secs):
            by_secs.setdefault(f"{secs:.3f}", []).append(node.name)
    for sleep, names in by_secs.items():
        lines.append(f"{'|'.join(names)}) sleep {sleep} ;;")
    lines += ["*) exit 3 ;;", "esac", ""]
    return "\n".join(lines)


def _policy_testbed(root: Path, policy: str, scheduler_parameters: str,
                    log: Log, slurm: str | None = None) -> Testbed:
    """A :class:`~hetslurm.testbed.Testbed` rendering the site as ``policy`` sees it.

    It edits the rendered slurm.conf after ``Testbed._write_config`` (the one place ``up``
    renders a fresh boot); a running testbed is refused by :func:`run_testbed`, so ``up``'s
    reconfigure path, which renders without these edits, is never taken.
    """
    from hetslurm.testbed.cluster import State
    from hetslurm.testbed.cluster import Testbed as Base

    class PolicyTestbed(Base):
        """``slurm-default``: no hook, every node ``Weight=1``. Both: the workload's
        ``SchedulerParameters`` (Slurm's intervals scaled to the compressed time)."""

        def install_hook(self, site: Site) -> None:
            if policy == "hetslurm":
                from hetslurm.hook.install import install_hook

                # No fallback: the hetslurm replay without its hook would be meaningless.
                install_hook(site, self.etc, slurm=self.slurm_release)
            else:
                (self.etc / "job_submit.lua").unlink(missing_ok=True)

        def _write_config(self, site: Site, st: State) -> dict[str, str]:
            files = super()._write_config(site, st)
            text = self.conf.read_text()
            if policy == "slurm-default":
                text = re.sub(r"(?m)(^NodeName=.*) Weight=\d+", r"\1 Weight=1", text)
            text = text.replace("SchedulerType=sched/backfill\n",
                                "SchedulerType=sched/backfill\n"
                                f"SchedulerParameters={scheduler_parameters}\n", 1)
            self.conf.write_text(text)
            return files

    return PolicyTestbed(root, log=log, slurm=slurm)


@dataclass
class _Submitted:
    ids: dict[int, int] = field(default_factory=dict)  # Slurm job id -> workload index


def run_testbed(w: Workload, pl: Plan, policy: str, root: Path, *,
                progress: Progress | None = None, log: Log | None = None,
                release: str | None = None) -> Outcome:
    """Boot the testbed in ``root`` for ``policy`` (Slurm release ``release``, default the
    host's), submit the workload at its offsets, wait for every job, read sacct, bring the
    testbed down.

    Raises:
        TestbedError: the folder's testbed already runs, a job did not complete, sacct
            lacks a record in time.
    """
    from hetslurm.testbed.cluster import SLURMCTLD
    from hetslurm.testbed.procs import marked_pids

    say = log or (lambda _m: None)
    bed = _policy_testbed(root, policy, w.scheduler_parameters, say, release)
    if bed.running().get(SLURMCTLD):
        raise TestbedError(f"a testbed runs in {root}; bring it down or use another --dir")
    model = ClusterModel.from_site(pl.site)
    scripts = root / "validate" / policy
    shutil.rmtree(scripts, ignore_errors=True)
    scripts.mkdir(parents=True)
    paths = []
    for i, (wj, sj) in enumerate(zip(w.jobs, pl.jobs[policy], strict=True)):
        path = scripts / f"{i:04d}-{wj.id}.sh"
        path.write_text(job_script(policy, wj, sj, pl.runtimes[i], pl.site, model))
        paths.append(path)
    sub = _Submitted()
    try:
        say(f"{policy}: booting the testbed in {root}")
        bed.up(w.site_file)
        slurm = bed.slurm()
        t0 = time.monotonic()
        clock0 = time.time()
        for i, (wj, path) in enumerate(zip(w.jobs, paths, strict=True)):
            delay = t0 + wj.submit - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            job_id = slurm.submit_batch(path, ["-J", wj.id, "-o", "/dev/null"]).job_id
            sub.ids[job_id] = i
            if progress is not None:
                progress(f"{policy}: submitted", i + 1, len(w.jobs))
        budget = 3 * sum(wj.limit_min * 60 for wj in w.jobs) / 4 + 300
        _wait_done(slurm, sub, policy, budget, progress)
        out = replace(_sacct(slurm, sub, len(w.jobs)), clock0=clock0)
    finally:
        say(f"{policy}: bringing the testbed down")
        bed.down()
    left = marked_pids(str(root))
    if left:
        raise TestbedError(f"testbed processes left running in {root}: {left}")
    return out


def _wait_done(slurm: SlurmBackend, sub: _Submitted, policy: str, budget: float,
               progress: Progress | None) -> None:
    deadline = time.monotonic() + budget
    ours = {str(k) for k in sub.ids}
    while True:
        left = ours & set(slurm.queued_ids())
        if progress is not None:
            progress(f"{policy}: finished", len(ours) - len(left), len(ours))
        if not left:
            return
        if time.monotonic() > deadline:
            raise TestbedError(f"{len(left)} jobs still queued or running after {budget:.0f} s")
        time.sleep(1.0)


def _epoch(value: float | None) -> float | None:
    """A sacct time as epoch seconds; None for "not yet" (0) and Slurm's no-value."""
    when = units.from_epoch(int(value) if value is not None else None)
    return when.timestamp() if when is not None else None


def _sacct(slurm: SlurmBackend, sub: _Submitted, n: int, timeout: float = 120) -> Outcome:
    deadline = time.monotonic() + timeout
    # job id -> (submit, start, end, state, nodes), each run's one record (sacct -X)
    rows: dict[int, tuple[float | None, float | None, float | None, str, str]] = {}
    while True:
        records = slurm.accounting_jobs_by_id(list(sub.ids), allocations_only=True)
        rows = {}
        for raw in records.raws:
            try:
                rec = records.decode(raw)
            except SacctRecordError:
                continue
            rows[rec.job_id] = (_epoch(rec.time.submission), _epoch(rec.time.start),
                                _epoch(rec.time.end),
                                rec.state.name if rec.state else "",
                                rec.nodes or "")
        done = [r for r in rows.values() if r[2] is not None]
        if len(done) == len(sub.ids):
            break
        if time.monotonic() > deadline:
            raise TestbedError(f"sacct has {len(done)} of {len(sub.ids)} finished records "
                               f"after {timeout:.0f} s")
        time.sleep(1.0)
    bad = {k: r[3] for k, r in rows.items() if r[3] != "COMPLETED"}
    if bad:
        raise TestbedError(f"jobs that did not complete: {bad}")
    out: list[tuple[float, float, float, str]] = [(0.0, 0.0, 0.0, "")] * n
    for job_id, (submit, start, end, _state, nodes) in rows.items():
        out[sub.ids[job_id]] = (submit or 0.0, start or 0.0, end or 0.0, nodes)
    t0 = min(o[0] for o in out)
    return Outcome(submit=[o[0] - t0 for o in out], start=[o[1] - t0 for o in out],
                   end=[o[2] - t0 for o in out], where=[o[3] for o in out])


# --- the comparison -------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationResult:
    """Rows (one per policy and measure) and the document ``--format json`` prints."""

    rows: list[dict[str, Any]]
    meta: dict[str, Any]
    policies: dict[str, dict[str, Any]]

    @property
    def passed(self) -> bool:
        return all(r["pass"] for r in self.rows if r["pass"] is not None)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "rows": self.rows, "policies": self.policies,
                "passed": self.passed}


def compare(sim: Mapping[str, float], bed: Mapping[str, float] | None,
            target: Target) -> list[dict[str, Any]]:
    """Per measure: both figures, the difference (sim - testbed), relative to the testbed,
    the allowed margin and the verdict (``None`` without a testbed figure)."""
    rows = []
    for key, abs_m in (("mean_wait_s", target.wait_abs_s),
                       ("makespan_s", target.makespan_abs_s)):
        s = sim[key]
        b = None if bed is None else bed[key]
        diff = None if b is None else round(s - b, 2)
        rel = None if b is None or b == 0 else round((s - b) / b, 4)
        margin = None if b is None else round(max(target.relative * abs(b), abs_m), 2)
        rows.append({"measure": key, "sim": s, "testbed": b, "diff": diff, "rel_diff": rel,
                     "margin": margin,
                     "pass": None if diff is None or margin is None else abs(diff) <= margin})
    return rows


def validate(
    workload_file: str | Path, *, policies: Sequence[str] = POLICIES, jobs: int | None = None,
    testbed_dir: str | Path | None = None, sim_only: bool = False,
    progress: Progress | None = None, log: Log | None = None, slurm: str | None = None,
) -> ValidationResult:
    """Replay the workload in the simulator and (unless ``sim_only``) on the testbed, per
    policy, and compare mean wait and makespan against the workload's target.

    Args:
        workload_file: the committed workload (``site-configs/validate-workload.toml``).
        policies: which policies to replay.
        jobs: replay only the first ``jobs`` jobs.
        testbed_dir: the testbed's state folder (a short path: unix sockets); default a new
            folder ``hsv*`` in the temporary directory, removed at the end.
        sim_only: the simulator only (no root or Slurm needed).
        slurm: the Slurm release the testbed runs (``24.11``; default the host's), from its
            cached Debian root when the host has another (docs/testbed.md).

    Raises:
        ConfigError: a bad workload, site or parameter file.
        TestbedError: the testbed failed (see :func:`run_testbed`).
    """
    from hetslurm.site.load import load_site

    w = load_workload(workload_file).head(jobs)
    for p in policies:
        if p not in POLICIES:
            raise ConfigError(f"unknown policy '{p}'; policies: {', '.join(POLICIES)}")
    site = load_site(w.site_file)
    params = load_params(w.params_file)
    pl = plan(w, site, params, policies)
    own_dir = testbed_dir is None and not sim_only
    root = Path(testbed_dir or (tempfile.mkdtemp(prefix="hsv") if own_dir else ".")).absolute()
    rows: list[dict[str, Any]] = []
    per: dict[str, dict[str, Any]] = {}
    release: dict[str, str | None] = {}
    tb = None
    if not sim_only:
        from hetslurm.testbed.cluster import Testbed

        tb = Testbed(root, slurm=slurm)
        release = {"slurm_release": tb.slurm_release, "slurm_version": tb.slurm_version()}
    began = time.monotonic()
    try:
        for p in policies:
            bed: Outcome | None = None
            entry: dict[str, Any] = {}
            if not sim_only:
                t = time.monotonic()
                bed = run_testbed(w, pl, p, root, progress=progress, log=log,
                                  release=slurm)
                entry["testbed"] = bed.figures()
                entry["testbed_models"] = _count(_models(bed.where, site))
                entry["testbed_seconds"] = round(time.monotonic() - t, 1)
                entry["testbed_hold_extra_s"] = _hold_extra(bed, pl.runtimes, site)
            # The testbed's clock phase and Slurm version, replayed (without a testbed run:
            # phase 0, the newest Slurm's rules). A root built by the run has its version
            # only now.
            phase = clock_phase(bed.clock0) if bed is not None and bed.clock0 else 0.0
            if tb is not None and not release.get("slurm_version"):
                release["slurm_version"] = tb.slurm_version()
            known = release.get("slurm_version")
            version = parse_slurm_version(known) if known else None
            sim = simulate_plan(w, pl, p, clock_phase_s=phase, slurm_version=version)
            raw = simulate_plan(w, pl, p, latency=False, clock_phase_s=phase,
                                slurm_version=version)
            other = next(b for b in BACKFILLS if b != w.backfill)
            alt = simulate_plan(w, pl, p, backfill=other, clock_phase_s=phase,
                                slurm_version=version)
            entry = {"sim": sim.figures(), "sim_clock_phase_s": phase,
                     "sim_slurm_version": release.get("slurm_version") or "newest",
                     "sim_without_latency": raw.figures(),
                     f"sim_{other}_backfill": alt.figures(),
                     "sim_models": _count(sim.where), **entry}
            if w.backfill == "slurm" and pl.params.will_run == "batched":
                entry["sim_clock_phases"] = _phase_spread(w, pl, p, version)
            entry["per_job"] = _per_job(w, sim, bed)
            for r in compare(sim.figures(), None if bed is None else bed.figures(), w.target):
                rows.append({"policy": p, **r})
            per[p] = entry
    finally:
        if own_dir:
            shutil.rmtree(root, ignore_errors=True)
    meta = {
        "workload": w.path, "site": str(w.site_file), "params": str(w.params_file),
        "jobs": len(w.jobs), "gpu_jobs": sum(1 for j in w.jobs if j.gpus),
        "multi_node_jobs": sum(1 for j in w.jobs if j.nodes > 1),
        "high_priority_jobs": sum(1 for j in w.jobs if j.priority == "high"),
        "scheduler_parameters": w.scheduler_parameters, "backfill": w.backfill,
        "start_latency_s": w.start_latency_s, "hold_extra_s": w.hold_extra_s,
        "target": {"relative": w.target.relative, "wait_abs_s": w.target.wait_abs_s,
                   "makespan_abs_s": w.target.makespan_abs_s},
        "testbed": not sim_only, **release,
        "seconds": round(time.monotonic() - began, 1),
    }
    return ValidationResult(rows, meta, per)


def _phase_spread(w: Workload, pl: Plan, policy: str,
                  version: tuple[int, ...] | None) -> dict[str, Any]:
    """The simulator's figures at every clock phase of :data:`PHASES`: per measure the
    median, min and max (what the wall clock alone moves under the "batched" will-run
    test), and each phase's figures."""
    rows = {ph: simulate_plan(w, pl, policy, clock_phase_s=ph, slurm_version=version).figures()
            for ph in PHASES}
    out: dict[str, Any] = {"phases_s": list(PHASES)}
    for key in ("mean_wait_s", "makespan_s"):
        vals = [float(rows[ph][key]) for ph in PHASES]
        out[key] = {"median": round(statistics.median(vals), 2), "min": min(vals),
                    "max": max(vals), "per_phase": vals}
    return out


def _per_job(w: Workload, sim: Outcome, bed: Outcome | None) -> list[dict[str, Any]]:
    """Each job's submit, start and where, in the simulator and on the testbed (seconds
    from the first submission; where: the model in the simulator, the node on the
    testbed)."""
    out = []
    for i, wj in enumerate(w.jobs):
        row: dict[str, Any] = {"id": wj.id, "sim_submit": sim.submit[i],
                               "sim_start": round(sim.start[i], 2),
                               "sim_end": round(sim.end[i], 2), "sim_where": sim.where[i]}
        if bed is not None:
            row.update(bed_submit=bed.submit[i], bed_start=bed.start[i],
                       bed_end=bed.end[i], bed_where=bed.where[i])
        out.append(row)
    return out


def _hold_extra(bed: Outcome, runtimes: Sequence[Mapping[int, float]],
                site: Site) -> float | None:
    """How much longer than it slept a job held its allocation on the testbed, the mean
    over jobs of sacct's End - Start minus its runtime on the node's model: what the
    workload's ``hold_extra_s`` stands for, as this run saw it (whole seconds each, so
    about -0.5 to +0.5 s of rounding per job)."""
    model = ClusterModel.from_site(site)
    index = {n.name: i for i, n in enumerate(site.nodes)}
    extra = []
    for i, nodes in enumerate(bed.where):
        node = index.get(_first_node(nodes) or "")
        secs = runtimes[i].get(int(model.gpu_model[node])) if node is not None else None
        if secs is not None and math.isfinite(secs):
            extra.append(bed.end[i] - bed.start[i] - secs)
    return round(sum(extra) / len(extra), 3) if extra else None


def _count(names: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return dict(sorted(out.items()))


def _models(nodes: Sequence[str], site: Site) -> list[str]:
    """GPU model (or "cpu") of the first node of each job's node list."""
    model_of = {n.name: (n.gpus[0].model if n.gpus else "cpu") for n in site.nodes}
    return [model_of.get(_first_node(n) or n, n) for n in nodes]


def _first_node(nodes: str) -> str | None:
    """The first node of a Slurm node list (``gpu[3,5]`` -> ``gpu3``): the batch host,
    whose model the job's script sleeps by."""
    try:
        names = units.expand_hostlist(nodes)
    except ValueError:
        return None
    return names[0] if names else None
