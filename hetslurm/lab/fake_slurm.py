"""An in-memory Slurm for unit tests and the lab's benches, and a loader for recorded
Slurm output. Not a product backend: the proof runs against real Slurm.

:class:`FakeSlurm` keeps nodes with typed GRES and device indices, places jobs first-fit
by node weight (lowest weight first, as Slurm does), hands out the lowest free indices,
frees them on cancel/requeue, and honours drain. It is not a scheduler model: no
priorities, no backfill, one node per job, no feature constraints.

:func:`load_recorded` builds backend objects from the files in ``tests/data/slurm/`` with
the same parsers the CLI backend uses.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Unpack

from hetslurm.errors import BackendError
from hetslurm.slurm import parse, units
from hetslurm.slurm.backend import (
    SUBMIT_BATCH_RPC,
    ControllerStats,
    GresKey,
    JobChanges,
    JobInfo,
    JobRef,
    NodeInfo,
    NodeStateChange,
    NotFoundError,
    OutputFiles,
    PartitionInfo,
    QosInfo,
    SlurmBackend,
    SwitchInfo,
)
from hetslurm.slurm.sacct import SacctRecords, parse_sacct_document
from hetslurm.slurm.units import GresItem

#: Job states squeue lists by default (the unfinished ones).
_ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING",
                            "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT"})
#: squeue's state codes (``-t PD``) and the states they name.
_STATE_CODES = {"PD": "PENDING", "R": "RUNNING", "S": "SUSPENDED", "CG": "COMPLETING",
                "CD": "COMPLETED", "CA": "CANCELLED", "F": "FAILED", "TO": "TIMEOUT",
                "NF": "NODE_FAIL", "PR": "PREEMPTED", "BF": "BOOT_FAIL", "DL": "DEADLINE",
                "OOM": "OUT_OF_MEMORY", "CF": "CONFIGURING", "RQ": "REQUEUED",
                "RS": "RESIZING", "SI": "SIGNALING", "SO": "STAGE_OUT"}


class FakeSlurm(SlurmBackend):
    """A small in-memory cluster behind the :class:`SlurmBackend` interface."""

    name = "fake"

    def __init__(
        self,
        nodes: Iterable[NodeInfo] = (),
        jobs: Iterable[JobInfo] = (),
        partitions: Iterable[PartitionInfo] = (),
        qos: Iterable[QosInfo] = (),
        *,
        first_job_id: int = 1,
        config: Mapping[str, str] | None = None,
        accounting: SacctRecords | None = None,
        topology: Iterable[SwitchInfo] = (),
    ) -> None:
        self._nodes: dict[str, NodeInfo] = {n.name: n for n in nodes}
        self._jobs: dict[int, JobInfo] = {j.job_id: j for j in jobs}
        self._partitions = list(partitions)
        self._qos = list(qos)
        self._held: set[int] = {
            j.job_id for j in self._jobs.values() if (j.reason or "").startswith("JobHeld")
        }
        start = max([first_job_id, *(j + 1 for j in self._jobs)])
        self._ids = itertools.count(start)
        #: Scripts submitted, by job id (for tests that check what was sent).
        self.scripts: dict[int, str] = {}
        #: ``--output``/``--error`` of submitted jobs, by job id.
        self.outputs: dict[int, OutputFiles] = {}
        #: The controller's configuration as ``scontrol show config`` would print it.
        self.config_values: dict[str, str] = dict(config or {})
        #: What sdiag would print: submissions are counted (taking no time) until a reset.
        self.stats = _zero_stats()
        self._accounting = accounting or SacctRecords([])
        self._topology = list(topology)

    # ---------------------------------------------------------------- reading
    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes.values())

    def node(self, name: str) -> NodeInfo:
        try:
            return self._nodes[name]
        except KeyError:
            raise NotFoundError(f"node '{name}' not found") from None

    def jobs(self) -> list[JobInfo]:
        return list(self._jobs.values())

    def job(self, job_id: JobRef) -> JobInfo:
        return self._jobs[self._resolve(job_id)]

    def partitions(self) -> list[PartitionInfo]:
        return list(self._partitions)

    def qos(self) -> list[QosInfo]:
        return list(self._qos)

    def topology(self) -> list[SwitchInfo]:
        return list(self._topology)

    def _resolve(self, job_id: JobRef) -> int:
        for j in self._jobs.values():
            if str(j.job_id) == str(job_id) or j.display_id == str(job_id):
                return j.job_id
        raise NotFoundError(f"job {job_id} not found")

    # ---------------------------------------------------------------- changing
    def submit(self, script: str | Path, args: Sequence[str] = ()) -> int:
        text = script.read_text() if isinstance(script, Path) else script
        opts = _sbatch_options(text, args)
        sub = self.stats.rpc(SUBMIT_BATCH_RPC)
        self.stats = replace(self.stats, jobs_submitted=(self.stats.jobs_submitted or 0) + 1,
                             rpcs={**self.stats.rpcs,
                                   SUBMIT_BATCH_RPC: replace(sub, count=sub.count + 1)})
        job_id = next(self._ids)
        self.scripts[job_id] = text
        self.outputs[job_id] = OutputFiles(opts.get("output"), opts.get("error"))
        held = "hold" in opts
        self._jobs[job_id] = JobInfo(
            job_id=job_id,
            name=opts.get("job-name", "sbatch"),
            user="root",
            partition=opts.get("partition"),
            state="PENDING",
            reason="JobHeldUser" if held else "None",
            tres_per_node=units.parse_gres(opts.get("gres")),
            features=opts.get("constraint"),
            prefer=opts.get("prefer"),
            submit_time=datetime.now(tz=UTC),
        )
        if held:
            self._held.add(job_id)
        self.schedule()
        return job_id

    def schedule(self) -> None:
        """Start every pending, unheld job that fits on one node now."""
        for job in sorted(self._jobs.values(), key=lambda j: j.job_id):
            if job.state != "PENDING" or job.job_id in self._held:
                continue
            for node in sorted(self._nodes.values(), key=lambda n: (n.weight, n.name)):
                alloc = self._fit(job, node)
                if alloc is not None:
                    self._start(job, node, alloc)
                    break
            else:
                self._jobs[job.job_id] = replace(job, reason="Resources")

    def _fit(self, job: JobInfo, node: NodeInfo) -> tuple[GresItem, ...] | None:
        if node.unavailable or node.cpus_alloc >= node.cpus_total:
            return None
        if job.partition and node.partitions and job.partition not in node.partitions:
            return None
        out = []
        for want in job.tres_per_node:
            keys = [
                k
                for k in node.gres_total
                if k[0] == want.name and (want.type is None or k[1] == want.type)
            ]
            for key in keys:
                used = set(node.gres_used_indices.get(key, ()))
                free = [i for i in range(node.gres_total[key]) if i not in used]
                if len(free) >= want.count:
                    out.append(GresItem(key[0], key[1], want.count, tuple(free[: want.count])))
                    break
            else:
                return None
        return tuple(out)

    def _start(self, job: JobInfo, node: NodeInfo, alloc: tuple[GresItem, ...]) -> None:
        self._jobs[job.job_id] = replace(
            job,
            state="RUNNING",
            reason=None,
            nodes=(node.name,),
            allocated_gres={node.name: alloc} if alloc else {},
            start_time=datetime.now(tz=UTC),
        )
        self._account(node.name, alloc, cpus=1, sign=+1)

    def _account(self, name: str, alloc: Iterable[GresItem], *, cpus: int, sign: int) -> None:
        node = self._nodes[name]
        used = dict(node.gres_used)
        idx: dict[GresKey, tuple[int, ...]] = dict(node.gres_used_indices)
        for it in alloc:
            used[it.key] = used.get(it.key, 0) + sign * it.count
            now = set(idx.get(it.key, ()))
            now = now | set(it.indices or ()) if sign > 0 else now - set(it.indices or ())
            idx[it.key] = tuple(sorted(now))
        used = {k: v for k, v in used.items() if v > 0}
        idx = {k: v for k, v in idx.items() if v}
        cpus_alloc = max(0, node.cpus_alloc + sign * cpus)
        base = (
            "IDLE"
            if cpus_alloc == 0
            else ("ALLOCATED" if cpus_alloc >= node.cpus_total else "MIXED")
        )
        flags = node.state - {"IDLE", "MIXED", "ALLOCATED"}
        state = flags | {base} if "DOWN" not in flags else flags
        self._nodes[name] = replace(
            node,
            gres_used=used,
            gres_used_indices=idx,
            cpus_alloc=cpus_alloc,
            state=frozenset(state),
        )

    def _stop(self, job_id: int, state: str, reason: str | None) -> JobInfo:
        job = self._jobs[job_id]
        if job.state == "RUNNING":
            for node in job.nodes:
                self._account(node, job.allocated_gres.get(node, ()), cpus=1, sign=-1)
        stopped = replace(job, state=state, reason=reason, end_time=datetime.now(tz=UTC))
        self._jobs[job_id] = stopped
        return stopped

    def _pending_only(self, job_id: int) -> JobInfo:
        job = self._jobs[job_id]
        if job.state != "PENDING":
            # What scontrol says for a started job in 22.05.
            raise BackendError(f"Job is no longer pending execution for job {job_id}")
        return job

    def update_job(self, job_id: JobRef, **changes: Unpack[JobChanges]) -> None:
        change = self._check_update(changes)
        jid = self._resolve(job_id)
        job = self._jobs[jid]
        if (admin_comment := change.get("admin_comment")) is not None:
            job = replace(job, admin_comment=admin_comment or None)
        if change.keys() - {"admin_comment"}:
            job = replace(self._pending_only(jid), admin_comment=job.admin_comment)
        if (tres_per_node := change.get("tres_per_node")) is not None:
            job = replace(job, tres_per_node=tuple(tres_per_node))
        if (features := change.get("features")) is not None:
            job = replace(job, features=features or None)
        if (prefer := change.get("prefer")) is not None:
            job = replace(job, prefer=prefer or None)
        if (partition := change.get("partition")) is not None:
            job = replace(job, partition=partition)
        if (switches := change.get("switches")) is not None:
            job = replace(job, switches=switches if switches.count else None)
        self._jobs[jid] = job

    def hold(self, job_id: JobRef) -> None:
        jid = self._resolve(job_id)
        self._pending_only(jid)
        self._held.add(jid)
        self._jobs[jid] = replace(self._jobs[jid], reason="JobHeldAdmin")

    def release(self, job_id: JobRef) -> None:
        jid = self._resolve(job_id)
        self._held.discard(jid)
        self._jobs[jid] = replace(self._jobs[jid], reason="None")
        self.schedule()

    def requeue(self, job_id: JobRef, *, incomplete: bool = True) -> None:
        jid = self._resolve(job_id)
        job = self._jobs[jid]
        if incomplete and job.state in ("COMPLETED",):
            return
        if job.state not in ("RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            raise BackendError(f"Job {jid} is not in a requeueable state ({job.state})")
        self._stop(jid, "PENDING", "BeginTime")
        self._jobs[jid] = replace(
            self._jobs[jid],
            restarts=(job.restarts or 0) + 1,
            nodes=(),
            allocated_gres={},
            start_time=None,
            end_time=None,
        )

    def requeue_hold(self, job_id: JobRef, *, incomplete: bool = False) -> None:
        jid = self._resolve(job_id)
        if incomplete and self._jobs[jid].state == "COMPLETED":
            return
        self.requeue(jid, incomplete=False)
        self._held.add(jid)
        self._jobs[jid] = replace(self._jobs[jid], reason="job_requeued_in_held_state")

    def cancel(self, job_id: JobRef) -> None:
        jid = self._resolve(job_id)
        self._stop(jid, "CANCELLED", None)
        self.schedule()

    def update_node(self, name: str, state: NodeStateChange, reason: str | None = None) -> None:
        self._check_state_change(state, reason)
        node = self.node(name)
        flags = set(node.state)
        if state is NodeStateChange.DRAIN:
            flags.add("DRAIN")
        elif state is NodeStateChange.DOWN:
            flags = {"DOWN"}
            for job in list(self._jobs.values()):
                if job.state == "RUNNING" and name in job.nodes:
                    self._stop(job.job_id, "NODE_FAIL", None)
            node = self._nodes[name]
        elif state is NodeStateChange.UNDRAIN:
            # Slurm's UNDRAIN clears the drain flag only: a DOWN node stays DOWN (with its
            # reason), unlike RESUME.
            flags.discard("DRAIN")
            reason = node.reason if "DOWN" in flags else None
        else:
            flags -= {"DRAIN", "DOWN"}
            if not flags & {"IDLE", "MIXED", "ALLOCATED"}:
                flags.add("IDLE")
            reason = None
        self._nodes[name] = replace(node, state=frozenset(flags), reason=reason)
        if state in (NodeStateChange.RESUME, NodeStateChange.UNDRAIN):
            self.schedule()

    def set_node_weight(self, name: str, weight: int) -> None:
        self._nodes[name] = replace(self.node(name), weight=int(weight))

    # ---------------------------------------------------------------- controller
    def config(self) -> dict[str, str]:
        return dict(self.config_values)

    def controller_stats(self) -> ControllerStats:
        return self.stats

    def reset_controller_stats(self) -> None:
        self.stats = _zero_stats()

    def queued_ids(self, jobs: Sequence[JobRef] = (), states: Sequence[str] = ()) -> list[str]:
        refs = {str(j) for j in jobs}
        wanted = {_STATE_CODES.get(s.upper(), s.upper()) for s in states}
        out = []
        for j in self._jobs.values():
            ids = {str(x) for x in (j.job_id, j.array_job_id, j.het_job_id) if x is not None}
            if refs and not refs & ids:
                continue
            if "ALL" not in wanted and j.state not in (wanted or _ACTIVE_STATES):
                continue
            out.append(j.display_id)
        return out

    def cancel_jobs(self, job_ids: Sequence[JobRef]) -> None:
        for ref in job_ids:
            try:
                jid = self._resolve(ref)
            except NotFoundError:
                continue  # scancel too: a job already gone is not an error
            if self._jobs[jid].state in _ACTIVE_STATES:
                self.cancel(jid)

    def batch_script(self, job_id: JobRef) -> str:
        jid = self._resolve(job_id)
        if jid not in self.scripts:
            raise NotFoundError(f"job {job_id}: no batch script (not a batch job)")
        return self.scripts[jid]

    def job_output_files(self, job_id: JobRef) -> OutputFiles:
        return self.outputs.get(self._resolve(job_id), OutputFiles())

    # ---------------------------------------------------------------- accounting
    def accounting_jobs_by_id(self, job_ids: Sequence[JobRef], *, all_users: bool = False,
                              allocations_only: bool = False) -> SacctRecords:
        """The records the fake was given of these jobs (by id or array id)."""
        refs = {str(j) for j in job_ids}
        keep = []
        for raw, rec in zip(self._accounting.raws, self._accounting.plain(), strict=True):
            array = rec.get("array") if isinstance(rec, dict) else None
            ids = {str(rec.get("job_id")) if isinstance(rec, dict) else None,
                   str(array.get("job_id")) if isinstance(array, dict) else None}
            if refs & ids:
                keep.append(raw)
        return SacctRecords(keep)


def _zero_stats() -> ControllerStats:
    return ControllerStats(server_thread_count=1, agent_queue_size=0, dbd_agent_queue_size=0,
                           jobs_submitted=0, rpcs={})


def _sbatch_options(script: str, args: Sequence[str]) -> dict[str, str]:
    # #SBATCH lines first, then the command line, which wins as in sbatch.
    words: list[str] = []
    for line in script.splitlines():
        if line.startswith("#SBATCH"):
            words.extend(shlex.split(line[len("#SBATCH") :]))
    words.extend(args)
    short = {
        "-p": "partition",
        "-J": "job-name",
        "-C": "constraint",
        "-w": "nodelist",
        "-H": "hold",
        "-o": "output",
        "-e": "error",
    }
    out: dict[str, str] = {}
    it = iter(words)
    for w in it:
        if w in short:
            key = short[w]
            out[key] = "1" if key == "hold" else next(it, "")
        elif w.startswith("--"):
            key, sep, value = w[2:].partition("=")
            out[key] = value if sep else "1"
    return out


# ------------------------------------------------------------------- recorded outputs
def load_recorded(directory: str | Path) -> FakeSlurm:
    """A :class:`FakeSlurm` holding a recorded cluster snapshot.

    Reads ``sinfo.json`` (nodes), ``squeue.json`` plus ``scontrol_show_job_d_o.txt``
    (jobs, with per-node device indices from scontrol), ``scontrol_show_partition_o.txt``,
    ``sacctmgr_show_qos_P.txt`` and ``sacct.json`` (accounting); a missing file gives an
    empty list.
    """
    d = Path(directory)

    def text(name: str) -> str | None:
        p = d / name
        return p.read_text() if p.exists() else None

    sinfo = text("sinfo.json")
    nodes = parse.parse_sinfo_json(sinfo) if sinfo else []
    squeue = text("squeue.json")
    jobs = parse.parse_squeue_json(squeue) if squeue else []
    detail_text = text("scontrol_show_job_d_o.txt")
    if detail_text:
        detail = {j.job_id: j.allocated_gres for j in parse.parse_scontrol_jobs(detail_text)}
        jobs = [
            replace(j, allocated_gres=dict(detail[j.job_id])) if detail.get(j.job_id) else j
            for j in jobs
        ]
    part = text("scontrol_show_partition_o.txt")
    qos = text("sacctmgr_show_qos_P.txt")
    sacct = text("sacct.json")
    return FakeSlurm(
        nodes=nodes,
        jobs=jobs,
        partitions=parse.parse_scontrol_partitions(part) if part else [],
        qos=parse.parse_sacctmgr_qos(qos) if qos else [],
        accounting=parse_sacct_document(sacct) if sacct else None,
    )
