"""The Slurm backend over Slurm's command-line tools (tested on Slurm 22.05.8).

Listings come from ``sinfo --json`` and ``squeue --json`` (schema ``openapi/v0.0.38``),
which in 22.05 ignore filter options such as ``-n``/``-j`` and always print everything;
single objects come from ``scontrol show node|job -d -o``, which names the GRES device
indices per node. QOS come from ``sacctmgr show qos -P``. Parsing lives in :mod:`.parse`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from hetslurm.errors import BackendError, CommandError, CommandFailure
from hetslurm.process import CommandResult, run_command
from hetslurm.slurm import parse, units
from hetslurm.slurm.backend import (
    JobInfo,
    JobRef,
    NodeInfo,
    NodeStateChange,
    NotFoundError,
    PartitionInfo,
    QosInfo,
    SlurmBackend,
    Switches,
)
from hetslurm.slurm.units import GresItem

#: Seconds any one Slurm command may take before its process group is killed.
DEFAULT_TIMEOUT_S = 30.0

# What scontrol/squeue print on stderr when the object is gone (exit status 1).
_NOT_FOUND_MARKERS = ("Invalid job id", "Invalid node name", "not found", "Invalid partition")


class CliBackend(SlurmBackend):
    """Talks to Slurm through ``sinfo``/``squeue``/``scontrol``/``sbatch``/``sacctmgr``.

    Args:
        env: extra environment for every command, e.g. ``{"SLURM_CONF": ".../slurm.conf"}``
            to point at a test cluster; merged over this process's environment.
        timeout: seconds per command.
    """

    name = "cli"

    def __init__(
        self, env: Mapping[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self._env = {**os.environ, **dict(env or {})}
        self.timeout = timeout

    @property
    def env(self) -> Mapping[str, str]:
        return dict(self._env)

    def _run(self, *argv: str, input: str | None = None) -> CommandResult:
        return run_command(argv, timeout=self.timeout, env=self._env, input=input)

    def _run_object(self, what: str, *argv: str) -> CommandResult:
        out = run_command(argv, timeout=self.timeout, env=self._env, check=False)
        if out.returncode == 0:
            return out
        # scontrol says "Node x not found" on stdout but "Invalid job id" on stderr.
        said = f"{out.stdout}\n{out.stderr}"
        if any(m in said for m in _NOT_FOUND_MARKERS):
            raise NotFoundError(f"{what} not found: {said.strip()}")
        detail = said.strip().splitlines()[-1] if said.strip() else "no output"
        raise CommandError(
            f"'{' '.join(argv)}' failed with exit status {out.returncode}: {detail}",
            CommandFailure(argv=out.argv, returncode=out.returncode, stderr=out.stderr),
        )

    def version(self) -> tuple[int, int, int]:
        """The Slurm version of the CLIs (``scontrol --version``)."""
        return parse.parse_slurm_version(self._run("scontrol", "--version").stdout)

    # ---------------------------------------------------------------- reading
    def nodes(self) -> list[NodeInfo]:
        return parse.parse_sinfo_json(self._run("sinfo", "--json").stdout)

    def node(self, name: str) -> NodeInfo:
        out = self._run_object(f"node '{name}'", "scontrol", "show", "node", "-d", "-o", name)
        found = [n for n in parse.parse_scontrol_nodes(out.stdout) if n.name == name]
        if not found:
            raise NotFoundError(f"node '{name}' not found")
        return found[0]

    def jobs(self) -> list[JobInfo]:
        jobs, risky = parse.parse_squeue_json_checked(self._run("squeue", "--json").stdout)
        # squeue's gres_detail pairs devices with nodes only by position; scontrol -d names
        # the node of every GRES group, so its allocation wins where both have one. Only
        # scontrol -d prints the CPU ids per node. Every other field comes from the JSON:
        # scontrol -o prints names and comments unescaped, so a job named "x Restarts=0"
        # could forge fields there; such jobs keep the JSON's allocation only.
        detail = parse.trusted_details(
            parse.parse_scontrol_jobs(self._run("scontrol", "show", "job", "-d", "-o").stdout),
            risky)
        out = [_with_allocation(j, detail[j.job_id]) if j.job_id in detail else j for j in jobs]
        if any(j.state == "PENDING" for j in out):
            sw = self._switch_requests()
            out = [replace(j, switches=sw.get(j.job_id)) if j.state == "PENDING" else j
                   for j in out]
        return out

    def _switch_requests(self) -> dict[int, Switches]:
        """``--switches`` of every pending job, from ``squeue -O``: squeue --json has no such
        field and scontrol -o is not trusted for every job; these columns are numbers only."""
        try:
            text = self._run("squeue", "-h", "-t", "PD", "-O",
                             "JobID:24,ReqSwitch:12,Wait4Switch:24").stdout
        except CommandError:
            return {}  # unknown: no job is taken to wait for a switch
        out: dict[int, Switches] = {}
        for line in text.splitlines():
            words = line.split()
            if len(words) != 3 or not words[0].isdigit() or not words[1].isdigit():
                continue
            wait = units.time_seconds(words[2])
            if int(words[1]) > 0:
                out[int(words[0])] = Switches(int(words[1]), wait if isinstance(wait, int)
                                              else None)
        return out

    def job(self, job_id: JobRef) -> JobInfo:
        ref = str(job_id)
        out = self._run_object(f"job {ref}", "scontrol", "show", "job", "-d", "-o", ref)
        found = parse.parse_scontrol_jobs(out.stdout)
        if not found:
            raise NotFoundError(f"job {ref} not found")
        # An array's parent id prints every task; the caller asked for this id.
        pick = next((j for j in found if j.display_id == ref or str(j.job_id) == ref), found[0])
        # The job's fields from squeue --json (22.05 lists every job the controller holds; it
        # ignores -j), the allocation detail from scontrol only when it can be trusted.
        listed, risky = parse.parse_squeue_json_checked(self._run("squeue", "--json").stdout)
        base = next((j for j in listed if j.job_id == pick.job_id), None)
        if base is not None:
            detail = parse.trusted_details(found, risky)
            got = _with_allocation(base, detail[base.job_id]) if base.job_id in detail else base
            if got.state == "PENDING":
                got = replace(got, switches=self._switch_requests().get(got.job_id))
            return got
        why = parse.ambiguous_scontrol_job(out.stdout)
        if why:
            raise BackendError(f"job {ref}: scontrol's output cannot be trusted: {why}")
        return pick

    def partitions(self) -> list[PartitionInfo]:
        return parse.parse_scontrol_partitions(
            self._run("scontrol", "show", "partition", "-o").stdout
        )

    def qos(self) -> list[QosInfo]:
        return parse.parse_sacctmgr_qos(self._run("sacctmgr", "show", "qos", "-P").stdout)

    # ---------------------------------------------------------------- changing
    def submit(self, script: str | Path, args: Sequence[str] = ()) -> int:
        if isinstance(script, Path):
            out = self._run("sbatch", "--parsable", *args, str(script))
        else:
            # sbatch reads the script from stdin when no file is named.
            out = self._run("sbatch", "--parsable", *args, input=script)
        return parse.parse_sbatch_parsable(out.stdout)

    def update_job(
        self,
        job_id: JobRef,
        *,
        tres_per_node: Sequence[GresItem] | None = None,
        features: str | None = None,
        prefer: str | None = None,
        switches: Switches | None = None,
        partition: str | None = None,
        nodelist: Sequence[str] | None = None,
        admin_comment: str | None = None,
    ) -> None:
        self._check_update(
            tres_per_node=tres_per_node,
            features=features,
            prefer=prefer,
            switches=switches,
            partition=partition,
            nodelist=nodelist,
            admin_comment=admin_comment,
        )
        fields: list[str] = []
        if tres_per_node is not None:
            # scontrol's "Gres=" sets tres_per_node; an empty value clears the request.
            fields.append(f"Gres={','.join(it.to_slurm() for it in tres_per_node)}")
        if features is not None:
            fields.append(f"Features={features}")
        if prefer is not None:
            fields.append(f"Prefer={prefer}")
        if switches is not None:
            wait = (
                f"@{units.format_time(switches.max_wait_s)}"
                if switches.max_wait_s is not None
                else ""
            )
            fields.append(f"Switches={switches.count}{wait}")
        if partition is not None:
            fields.append(f"Partition={partition}")
        if nodelist is not None:
            fields.append(f"ReqNodeList={units.compress_hostlist(nodelist) if nodelist else ''}")
        if admin_comment is not None:
            fields.append(f"AdminComment={admin_comment}")
        self._run_object(f"job {job_id}", "scontrol", "update", f"JobId={job_id}", *fields)

    def hold(self, job_id: JobRef) -> None:
        self._run_object(f"job {job_id}", "scontrol", "hold", str(job_id))

    def release(self, job_id: JobRef) -> None:
        self._run_object(f"job {job_id}", "scontrol", "release", str(job_id))

    def requeue(self, job_id: JobRef, *, incomplete: bool = True) -> None:
        opt = ("Incomplete",) if incomplete else ()
        self._run_object(f"job {job_id}", "scontrol", "requeue", *opt, str(job_id))

    def requeue_hold(self, job_id: JobRef, *, incomplete: bool = False) -> None:
        opt = ("Incomplete",) if incomplete else ()
        self._run_object(f"job {job_id}", "scontrol", "requeuehold", *opt, str(job_id))

    def cancel(self, job_id: JobRef) -> None:
        self._run_object(f"job {job_id}", "scancel", str(job_id))

    def update_node(self, name: str, state: NodeStateChange, reason: str | None = None) -> None:
        self._check_state_change(state, reason)
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state.value}"]
        if reason:
            argv.append(f"Reason={reason}")
        self._run_object(f"node '{name}'", *argv)


def _with_allocation(job: JobInfo, detail: JobInfo) -> JobInfo:
    gres = detail.allocated_gres or job.allocated_gres
    # squeue --json has no switch request either; scontrol prints Switches=count@wait.
    return replace(job, allocated_gres=dict(gres), cpu_ids=dict(detail.cpu_ids),
                   switches=detail.switches)
