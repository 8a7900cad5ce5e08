"""The Slurm backend over Slurm's command-line tools (tested on Slurm 22.05.8, 24.11.5 and
26.05.5; what differs per release is :class:`hetslurm.slurm.versions.Release`).

Listings come from ``squeue --json`` and, per node, ``sinfo --json`` on 22.05 (schema
``openapi/v0.0.38``, filters such as ``-n``/``-j`` ignored: everything is printed) or
``scontrol show node --json=v0.0.42`` on 24.11 and later (``squeue --json=v0.0.42 -t all``:
those honour filters and hide finished jobs unless asked);
single objects come from ``scontrol show node|job -d -o``, which names the GRES device
indices per node. QOS and associations come from ``sacctmgr``, accounting records from
``sacct --json``. Parsing lives in :mod:`.parse` and :mod:`.sacct`. This module and those
are the only places in hetslurm that name Slurm's programs (docs/slurm-access.md lists
which method runs which).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Unpack

from hetslurm.errors import BackendError, CommandError, CommandFailure
from hetslurm.process import CommandResult, run_command
from hetslurm.slurm import parse, units, versions
from hetslurm.slurm.backend import (
    Association,
    ControllerStats,
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
    Submission,
    Switches,
    SwitchInfo,
)
from hetslurm.slurm.sacct import SacctRecords, parse_sacct_document, parse_sacct_scripts

#: Seconds any one Slurm command may take before its process group is killed.
DEFAULT_TIMEOUT_S = 30.0
#: Commands that may take longer than one read: a reconfigure re-reads every node's
#: configuration, sacct may page through months of records, slurmdbd may be busy writing.
RECONFIGURE_TIMEOUT_S = 120.0
#: Jobs per ``sacct --json -B`` call (a stored script may be up to 4 MB).
SCRIPTS_PER_CALL = 100
ACCOUNTING_TIMEOUT_S = 600.0
SACCTMGR_TIMEOUT_S = 60.0
#: sbatch waits and retries while slurmctld is busy (a queue thousands of jobs deep); a
#: listing of every job the controller holds may be as slow.
SUBMIT_TIMEOUT_S = 60.0
QUEUE_TIMEOUT_S = 60.0
#: What sacctmgr says (exit status 1) when what it was asked to add exists already.
_EXISTS_MARKERS = ("Nothing new added", "already exists")
#: Every program this backend runs (``missing_commands`` checks them).
COMMANDS = ("sinfo", "squeue", "scontrol", "scancel", "sbatch", "sacct", "sacctmgr", "sdiag")


def missing_commands(env: Mapping[str, str] | None = None) -> list[str]:
    """The Slurm client programs of :data:`COMMANDS` not on ``PATH`` (``env``'s, if given)."""
    path = (env or os.environ).get("PATH")
    return [c for c in COMMANDS if shutil.which(c, path=path) is None]

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

    def _run(self, *argv: str, input: str | None = None, timeout: float | None = None,
             check: bool = True) -> CommandResult:
        return run_command(argv, timeout=max(self.timeout, timeout or 0.0), env=self._env,
                           input=input, check=check)

    def _run_object(self, what: str, *argv: str, timeout: float | None = None) -> CommandResult:
        out = self._run(*argv, timeout=timeout, check=False)
        if out.returncode == 0:
            return out
        # scontrol says "Node x not found" on stdout but "Invalid job id" on stderr.
        said = f"{out.stdout}\n{out.stderr}"
        if any(m in said for m in _NOT_FOUND_MARKERS):
            raise NotFoundError(f"{what} not found: {said.strip()}")
        raise _failed(out, said)

    def version(self) -> tuple[int, int, int]:
        """The Slurm version of the CLIs (``scontrol --version``)."""
        return parse.parse_slurm_version(self._run("scontrol", "--version").stdout)

    @functools.cached_property
    def slurm_release(self) -> versions.Release:
        """The supported release of these CLIs, asked once; it decides the ``--json`` schema,
        the filters and the node listing (:class:`hetslurm.slurm.versions.Release`).

        Raises:
            ConfigError: a Slurm release hetslurm does not support (named).
        """
        return versions.release(self.version())

    def _json(self, *argv: str, timeout: float | None = None) -> CommandResult:
        """``argv`` with the ``--json`` option of this release."""
        return self._run(*argv, self.slurm_release.json_option, timeout=timeout)

    def _all_jobs_json(self) -> str:
        """Every job the controller holds, finished ones included, as ``squeue --json``."""
        return self._json("squeue", *self.slurm_release.all_jobs, timeout=QUEUE_TIMEOUT_S).stdout

    # ---------------------------------------------------------------- reading
    def nodes(self) -> list[NodeInfo]:
        listing = self.slurm_release.node_listing
        return parse.parse_sinfo_json(self._json(*listing).stdout,
                                      what=f"{' '.join(listing)} --json")

    def node(self, name: str) -> NodeInfo:
        out = self._run_object(f"node '{name}'", "scontrol", "show", "node", "-d", "-o", name)
        found = [n for n in parse.parse_scontrol_nodes(out.stdout) if n.name == name]
        if not found:
            raise NotFoundError(f"node '{name}' not found")
        return found[0]

    def jobs(self) -> list[JobInfo]:
        jobs, risky = parse.parse_squeue_json_checked(self._all_jobs_json())
        details = parse.parse_scontrol_jobs(
            self._run("scontrol", "show", "job", "-d", "-o").stdout)
        return self._completed(jobs, details, risky)

    def _completed(self, jobs: list[JobInfo], details: list[JobInfo],
                   risky: set[int]) -> list[JobInfo]:
        """squeue's jobs with what only scontrol -d and squeue -O say.

        squeue's gres_detail pairs devices with nodes only by position; scontrol -d names
        the node of every GRES group, so its allocation wins where both have one. Only
        scontrol -d prints the CPU ids per node. Every other field comes from the JSON:
        scontrol -o prints names and comments unescaped, so a job named "x Restarts=0"
        could forge fields there; such jobs keep the JSON's allocation only.
        """
        detail = parse.trusted_details(details, risky)
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
        # The job's fields from squeue --json (22.05 lists every job the controller holds; it
        # ignores -j), the allocation detail from scontrol only when it can be trusted.
        listed, risky = parse.parse_squeue_json_checked(self._all_jobs_json())
        if not found:
            # scontrol answered, but no line of it could be read (free text broke it): the
            # JSON's record, without the per-node detail only scontrol gives.
            only = [j for j in listed if j.display_id == ref or str(j.job_id) == ref]
            if only:
                return only[0]
            raise NotFoundError(f"job {ref} not found")
        # An array's parent id prints every task; the caller asked for this id.
        pick = next((j for j in found if j.display_id == ref or str(j.job_id) == ref), found[0])
        base = next((j for j in listed if j.job_id == pick.job_id), None)
        if base is not None:
            return self._completed([base], found, risky)[0]
        why = parse.ambiguous_scontrol_job(out.stdout)
        if why:
            raise BackendError(f"job {ref}: scontrol's output cannot be trusted: {why}")
        return pick

    def partitions(self) -> list[PartitionInfo]:
        return parse.parse_scontrol_partitions(
            self._run("scontrol", "show", "partition", "-o").stdout
        )

    def topology(self) -> list[SwitchInfo]:
        return parse.parse_scontrol_topology(self._run("scontrol", "show", "topology").stdout)

    def qos(self) -> list[QosInfo]:
        return parse.parse_sacctmgr_qos(self._run("sacctmgr", "show", "qos", "-P").stdout)

    # ---------------------------------------------------------------- changing
    def submit(self, script: str | Path, args: Sequence[str] = ()) -> int:
        return self._sbatch(script, args, None, self.timeout).job_id

    def submit_batch(self, script: str | Path | None = None, args: Sequence[str] = (), *,
                     wrap: str | None = None) -> Submission:
        if (script is None) == (wrap is None):
            raise ValueError("submit_batch needs a script or a command to wrap, not both")
        return self._sbatch(script, args, wrap, SUBMIT_TIMEOUT_S)

    def _sbatch(self, script: str | Path | None, args: Sequence[str], wrap: str | None,
                timeout: float) -> Submission:
        if wrap is not None:
            out = self._run("sbatch", "--parsable", *args, "--wrap", wrap, timeout=timeout)
        elif isinstance(script, Path):
            out = self._run("sbatch", "--parsable", *args, str(script), timeout=timeout)
        else:
            # sbatch reads the script from stdin when no file is named.
            out = self._run("sbatch", "--parsable", *args, input=script, timeout=timeout)
        return Submission(parse.parse_sbatch_parsable(out.stdout), out.stderr)

    def update_job(self, job_id: JobRef, **changes: Unpack[JobChanges]) -> None:
        change = self._check_update(changes)
        fields: list[str] = []
        if (tres_per_node := change.get("tres_per_node")) is not None:
            # scontrol's "Gres=" sets tres_per_node; an empty value clears the request.
            fields.append(f"Gres={','.join(it.to_slurm() for it in tres_per_node)}")
        if (features := change.get("features")) is not None:
            fields.append(f"Features={features}")
        if (prefer := change.get("prefer")) is not None:
            fields.append(f"Prefer={prefer}")
        if (switches := change.get("switches")) is not None:
            wait = switches.max_wait_s
            fields.append(f"Switches={switches.count}"
                          + ("" if wait is None else f"@{units.format_time(wait)}"))
        if (partition := change.get("partition")) is not None:
            fields.append(f"Partition={partition}")
        if (nodelist := change.get("nodelist")) is not None:
            fields.append(f"ReqNodeList={units.compress_hostlist(nodelist) if nodelist else ''}")
        if (admin_comment := change.get("admin_comment")) is not None:
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
        # 24.11 and later exit 0 for an unknown job and say so only with -v (tried).
        out = self._run_object(f"job {job_id}", "scancel", "-v", str(job_id))
        said = f"{out.stdout}\n{out.stderr}"
        if "Invalid job id" in said:
            raise NotFoundError(f"job {job_id} not found: {said.strip()}")

    def update_node(self, name: str, state: NodeStateChange, reason: str | None = None) -> None:
        self._check_state_change(state, reason)
        argv = ["scontrol", "update", f"NodeName={name}", f"State={state.value}"]
        if reason:
            argv.append(f"Reason={reason}")
        self._run_object(f"node '{name}'", *argv)

    def set_node_weight(self, name: str, weight: int) -> None:
        if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight < 2**32 - 2:
            raise ValueError(f"node weight must be an integer 0..{2**32 - 3}, got {weight!r}")
        self._run_object(f"node '{name}'", "scontrol", "update", f"NodeName={name}",
                         f"Weight={weight}")


    # ---------------------------------------------------------------- controller
    def config(self) -> dict[str, str]:
        return parse.parse_scontrol_config(self._run("scontrol", "show", "config").stdout)

    def ping(self) -> str | None:
        res = run_command(("scontrol", "ping"), timeout=min(self.timeout, 20.0),
                          env=self._env, check=False)
        if res.returncode == 0 and "is UP" in res.stdout:
            return None
        text = (res.stderr or res.stdout).strip().splitlines()
        return text[-1] if text else f"scontrol ping exited {res.returncode}"

    def reconfigure(self) -> None:
        self._run("scontrol", "reconfigure", timeout=RECONFIGURE_TIMEOUT_S)

    def token(self, *, lifespan_s: int = 1800, username: str | None = None) -> str:
        """A JWT for slurmrestd (``scontrol token``; the controller needs auth/jwt).

        Raises:
            CommandError: scontrol failed (no ``AuthAltTypes=auth/jwt``, not allowed).
            BackendError: scontrol printed no ``SLURM_JWT=`` line.
        """
        argv = ["scontrol", "token", f"lifespan={int(lifespan_s)}"]
        if username:
            argv.append(f"username={username}")
        out = self._run(*argv).stdout
        for line in out.splitlines():
            if line.startswith("SLURM_JWT="):
                return line.split("=", 1)[1].strip()
        raise BackendError(f"scontrol token printed no SLURM_JWT= line: {out.strip()[:200]!r}")

    def controller_stats(self) -> ControllerStats:
        return parse.parse_sdiag(self._run("sdiag").stdout)

    def reset_controller_stats(self) -> None:
        self._run("sdiag", "-r")

    def node_states(self) -> dict[str, str]:
        return parse.parse_sinfo_node_states(self._run("sinfo", "-h", "-N", "-o", "%N %T").stdout)

    def active_job_ids(self) -> list[int]:
        # squeue's default states are the unfinished ones; %A is the unique id (array tasks
        # and het components each have their own).
        return parse.parse_squeue_ids(self._run("squeue", "-h", "-o", "%A").stdout)

    def queued_ids(self, jobs: Sequence[JobRef] = (), states: Sequence[str] = ()) -> list[str]:
        argv = ["squeue", "-h"]
        if jobs:
            argv += ["-j", ",".join(map(str, jobs))]
        if states:
            argv += ["-t", ",".join(states)]
        argv += ["-o", "%i"]
        try:
            out = self._run_object("jobs", *argv, timeout=QUEUE_TIMEOUT_S)
        except NotFoundError:
            # squeue -j with one id asks for that job alone and fails once it is gone.
            if jobs:
                return []
            raise
        return parse.parse_squeue_display_ids(out.stdout)

    def cancel_jobs(self, job_ids: Sequence[JobRef]) -> None:
        if job_ids:
            # scancel exits non-zero when a job already ended; the others are still cancelled.
            self._run("scancel", *map(str, job_ids), timeout=60.0, check=False)

    def batch_script(self, job_id: JobRef) -> str:
        # "-" writes the script to stdout instead of a file in the working directory.
        return self._run_object(f"job {job_id}", "scontrol", "write", "batch_script",
                                str(job_id), "-").stdout

    def stored_batch_script(self, job_id: JobRef) -> str:
        out = self._run("sacct", "--batch-script", "-j", str(job_id),
                        timeout=ACCOUNTING_TIMEOUT_S).stdout
        script = parse.parse_sacct_batch_script(out)
        if script is None:
            raise NotFoundError(f"job {job_id}: no stored batch script (AccountingStoreFlags="
                                f"job_script, and a batch job?): {out.strip()[:160]!r}")
        return script

    def stored_batch_scripts(self, job_ids: Sequence[int]) -> dict[int, str | None]:
        if not self.slurm_release.json_batch_scripts:
            return super().stored_batch_scripts(job_ids)
        # One sacct per chunk: the text form (-B without --json) puts the scripts one after
        # the other, and a script may itself hold a "Batch Script for N" line.
        out: dict[int, str | None] = dict.fromkeys((int(j) for j in job_ids), None)
        ids = list(out)
        for i in range(0, len(ids), SCRIPTS_PER_CALL):
            chunk = ids[i:i + SCRIPTS_PER_CALL]
            doc = self._json("sacct", "--allusers", "--batch-script", "-j",
                             ",".join(map(str, chunk)), timeout=ACCOUNTING_TIMEOUT_S).stdout
            for jid, script in parse_sacct_scripts(doc).items():
                if jid in out and script is not None:
                    out[jid] = script
        return out

    def job_output_files(self, job_id: JobRef) -> OutputFiles:
        out = self._run_object(f"job {job_id}", "scontrol", "show", "job", "-o", str(job_id))
        return parse.parse_job_output_files(out.stdout)

    # ---------------------------------------------------------------- accounting
    def accounting_jobs(self, since: float, until: float) -> SacctRecords:
        def iso(t: float) -> str:
            return datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")  # sacct: local time

        # --duplicates: a requeued job keeps one record per start, not only its last.
        out = self._json("sacct", "--allusers", "--duplicates", "-S", iso(since),
                         "-E", iso(until), timeout=ACCOUNTING_TIMEOUT_S)
        return parse_sacct_document(out.stdout)

    def accounting_jobs_by_id(self, job_ids: Sequence[JobRef], *, all_users: bool = False,
                              allocations_only: bool = False) -> SacctRecords:
        if not job_ids:
            return SacctRecords([])
        # With -j and no -S, sacct looks back to the epoch: every run of these jobs.
        argv = ["sacct", *(["--allusers"] if all_users else []),
                *(["-X"] if allocations_only else []), "-j", ",".join(map(str, job_ids))]
        return parse_sacct_document(self._json(*argv, timeout=ACCOUNTING_TIMEOUT_S).stdout)

    def _sacctmgr_show(self, *args: str) -> str:
        return self._run("sacctmgr", "-n", "-P", "show", *args).stdout

    def _sacctmgr_change(self, *args: str, exist_ok: bool = False) -> None:
        # -i: commit without asking (sacctmgr otherwise waits for "y" on stdin).
        argv = ("sacctmgr", "-i", "-n", "-P", *args)
        res = self._run(*argv, timeout=SACCTMGR_TIMEOUT_S, check=False)
        said = f"{res.stdout}\n{res.stderr}"
        if res.returncode == 0 or (exist_ok and any(m in said for m in _EXISTS_MARKERS)):
            return
        raise _failed(res, said)

    def clusters(self) -> list[str]:
        return parse.parse_sacctmgr_column(self._sacctmgr_show("cluster", "format=cluster"))

    def accounts(self) -> list[str]:
        return parse.parse_sacctmgr_column(self._sacctmgr_show("account", "format=account"))

    def associations(self, cluster: str) -> list[Association]:
        return parse.parse_sacctmgr_associations(
            self._sacctmgr_show("assoc", f"cluster={cluster}", "format=account,user,qos"))

    def add_cluster(self, name: str, *, exist_ok: bool = False) -> None:
        self._sacctmgr_change("add", "cluster", name, exist_ok=exist_ok)

    def add_account(self, name: str, cluster: str, *, description: str = "",
                    organization: str = "", exist_ok: bool = False) -> None:
        extra = [f"Description={description}"] if description else []
        extra += [f"Organization={organization}"] if organization else []
        self._sacctmgr_change("add", "account", name, f"Cluster={cluster}", *extra,
                              exist_ok=exist_ok)

    def add_user(self, name: str, account: str, cluster: str, *,
                 exist_ok: bool = False) -> None:
        self._sacctmgr_change("add", "user", name, f"Account={account}", f"Cluster={cluster}",
                              exist_ok=exist_ok)

    def set_user_qos(self, name: str, qos: Sequence[str], default_qos: str) -> None:
        self._sacctmgr_change("modify", "user", name, "set", f"QOS={','.join(qos)}",
                              f"DefaultQOS={default_qos}")

    def add_qos(self, name: str, settings: Mapping[str, str], *, description: str = "",
                exist_ok: bool = False) -> None:
        desc = [f"Description={description}"] if description else []
        self._sacctmgr_change("add", "qos", name, *_settings(settings), *desc,
                              exist_ok=exist_ok)

    def modify_qos(self, name: str, settings: Mapping[str, str]) -> None:
        if settings:
            self._sacctmgr_change("modify", "qos", "where", f"name={name}", "set",
                                  *_settings(settings))

    def delete_qos(self, name: str) -> None:
        self._sacctmgr_change("delete", "qos", "where", f"name={name}")

    def grant_qos(self, qos: str, kind: str, name: str, cluster: str, *, account: str = "",
                  revoke: bool = False) -> None:
        if kind not in ("user", "account"):
            raise ValueError(f"a QOS is granted to a 'user' or an 'account', not {kind!r}")
        where = [f"name={name}", f"cluster={cluster}"]
        if account:
            where.append(f"account={account}")
        self._sacctmgr_change("modify", kind, "where", *where, "set",
                              f"qos{'-=' if revoke else '+='}{qos}")


def _failed(res: CommandResult, said: str) -> CommandError:
    """The error for a command that failed; ``said`` is its stdout and stderr together."""
    detail = said.strip().splitlines()[-1] if said.strip() else "no output"
    return CommandError(
        f"'{' '.join(res.argv)}' failed with exit status {res.returncode}: {detail}",
        CommandFailure(argv=res.argv, returncode=res.returncode, stderr=res.stderr),
    )


def _settings(settings: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in settings.items()]


def _with_allocation(job: JobInfo, detail: JobInfo) -> JobInfo:
    gres = detail.allocated_gres or job.allocated_gres
    # squeue --json has no switch request either; scontrol prints Switches=count@wait.
    return replace(job, allocated_gres=dict(gres), cpu_ids=dict(detail.cpu_ids),
                   switches=detail.switches)
