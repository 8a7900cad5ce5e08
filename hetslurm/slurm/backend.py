"""The Slurm access interface and the typed values it speaks.

Every backend (Slurm CLIs, pyslurm; the lab's in-memory fake) implements :class:`SlurmBackend`
and returns these frozen dataclasses; no raw Slurm string, sentinel or unit crosses this
boundary (see :mod:`hetslurm.slurm.units`).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, TypedDict, Unpack, cast

from hetslurm.errors import BackendError
from hetslurm.slurm.units import UNLIMITED, GresItem, Limit, gres_indices

if TYPE_CHECKING:
    from hetslurm.slurm.sacct import SacctRecords

#: A GRES kind: ``("gpu", "a100")``; the type is None for untyped GRES (``gpu:2``).
GresKey = tuple[str, str | None]


class NotFoundError(BackendError):
    """The named node, job, partition or QOS does not exist (or no longer does)."""


class NotSupportedError(BackendError):
    """The chosen backend cannot do this (the CLI backend can do everything)."""


# Base node states in Slurm 22.05 (one per node) and the flags that may be added to them.
BASE_NODE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
#: Flags that take a node's free devices out of service (counted "unavailable").
UNAVAILABLE_NODE_FLAGS = frozenset(
    {
        "DRAIN",
        "DOWN",
        "RESERVED",
        "MAINTENANCE",
        "FAIL",
        "NOT_RESPONDING",
        "POWERED_DOWN",
        "POWER_DOWN",
        "POWERING_DOWN",
        "INVALID_REG",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "ERROR",
        "FUTURE",
        "UNKNOWN",
    }
)


@dataclass(frozen=True)
class NodeInfo:
    """One node as Slurm sees it now.

    ``state`` holds the base state and every flag, upper-case, as scontrol spells them
    (``{"MIXED", "DRAIN"}``). Memory is MiB. ``gres_used_indices`` gives the device
    indices in use per kind (from ``GresUsed=...(IDX:0-1)``).
    """

    name: str
    state: frozenset[str]
    reason: str | None = None
    features: tuple[str, ...] = ()
    active_features: tuple[str, ...] = ()
    weight: int = 1
    cpus_total: int = 0
    cpus_alloc: int = 0
    memory_total_mib: int = 0
    memory_alloc_mib: int = 0
    partitions: tuple[str, ...] = ()
    gres_total: Mapping[GresKey, int] = field(default_factory=dict)
    gres_used: Mapping[GresKey, int] = field(default_factory=dict)
    gres_used_indices: Mapping[GresKey, tuple[int, ...]] = field(default_factory=dict)
    #: The node's configured layout (``Sockets``/``CoresPerSocket``/``ThreadsPerCore``);
    #: None where the source does not say (the fake, pyslurm). Read by ``site import``.
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    #: The node's load average as slurmd last reported it (``CPULoad``: 2.11; the JSON
    #: forms give it times 100); None where Slurm has none (a node that never registered).
    cpu_load: float | None = None

    @property
    def base_state(self) -> str:
        base = self.state & BASE_NODE_STATES
        return min(base) if base else "UNKNOWN"

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state

    @property
    def unavailable(self) -> bool:
        """True when Slurm will start no new work here (drain, down, reserved, ...)."""
        return bool(self.state & UNAVAILABLE_NODE_FLAGS)

    @property
    def state_label(self) -> str:
        """One word per node, the way sinfo groups them (``drained``, ``draining``, ...)."""
        if "DOWN" in self.state:
            return "down"
        if "DRAIN" in self.state:
            return "drained" if self.base_state == "IDLE" else "draining"
        if self.state & {"RESERVED", "MAINTENANCE"}:
            return "reserved"
        return self.base_state.lower()


@dataclass(frozen=True)
class JobInfo:
    """One job (or array task, or heterogeneous component).

    ``job_id`` is Slurm's unique id; ``array_job_id``/``array_task_id`` and
    ``het_job_id``/``het_job_offset`` say which array or het job it belongs to. A pending
    array's not-yet-split remainder has ``array_task_spec`` (``"2-3%2"``) and no task id.
    Requests keep Slurm's three places for GRES: ``tres_per_node`` (``--gres``),
    ``tres_per_job`` (``--gpus``), ``tres_per_task`` (``--gpus-per-task``).
    ``allocated_gres`` maps each node to its devices with indices; ``cpu_ids`` maps each node
    to the CPU ids the job holds there (``scontrol show job -d``'s ``CPU_IDs=``, Slurm's
    core-major numbering: CPU = core x threads per core + thread), empty when the source does
    not say (``squeue --json`` alone, pyslurm, the fake).
    ``time_limit`` is seconds or UNLIMITED. ``restarts`` is None when Slurm's output did
    not give it (a job built in code, such as the fake's, starts at 0).
    """

    job_id: int
    name: str = ""
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    state: str = "UNKNOWN"
    reason: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_task_spec: str | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    tres_per_node: tuple[GresItem, ...] = ()
    tres_per_job: tuple[GresItem, ...] = ()
    tres_per_task: tuple[GresItem, ...] = ()
    allocated_gres: Mapping[str, tuple[GresItem, ...]] = field(default_factory=dict)
    cpu_ids: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit: Limit = None
    #: Slurm's restart count (``Restarts=``/``restart_cnt``); None when the source did not
    #: say. Unknown is never read as 0: the requeue cap cannot be checked against it.
    restarts: int | None = 0
    batch: bool = True
    requeue: bool = True
    comment: str | None = None
    admin_comment: str | None = None
    features: str | None = None
    prefer: str | None = None
    #: ``--switches`` (``scontrol show job``'s ``Switches=count@wait``); None when not asked
    #: for or when the source does not say (``squeue --json`` in 22.05 does not).
    switches: Switches | None = None

    @property
    def display_id(self) -> str:
        """The id as squeue prints it: ``5_1``, ``5_[2-3%2]``, ``11+1`` or ``7``."""
        if self.het_job_id and self.het_job_offset is not None:
            return f"{self.het_job_id}+{self.het_job_offset}"
        if self.array_job_id:
            if self.array_task_id is not None:
                return f"{self.array_job_id}_{self.array_task_id}"
            if self.array_task_spec:
                return f"{self.array_job_id}_[{self.array_task_spec}]"
        return str(self.job_id)

    def gres_on(self, node: str) -> dict[GresKey, tuple[int, ...]]:
        """Device indices this job holds on ``node`` by kind."""
        return gres_indices(self.allocated_gres.get(node, ()))


@dataclass(frozen=True)
class PartitionInfo:
    """A partition: its nodes, limits (seconds or UNLIMITED) and configured TRES."""

    name: str
    nodes: tuple[str, ...] = ()
    default: bool = False
    state: str = "UP"
    max_time: Limit = UNLIMITED
    default_time: Limit = None
    qos: str | None = None
    tres: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SwitchInfo:
    """A switch of ``topology/tree`` as ``scontrol show topology`` prints it: a leaf lists
    nodes, an upper switch lists switches."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()
    link_speed: int | None = None


@dataclass(frozen=True)
class QosInfo:
    """A QOS from the accounting database (TRES keys as Slurm names them)."""

    name: str
    priority: int = 0
    flags: tuple[str, ...] = ()
    usage_factor: float = 1.0
    max_wall: Limit = None
    max_tres_per_job: Mapping[str, int] = field(default_factory=dict)
    max_tres_per_user: Mapping[str, int] = field(default_factory=dict)
    max_jobs_per_user: int | None = None


@dataclass(frozen=True)
class Switches:
    """``--switches=count@max_wait``: at most ``count`` leaf switches, waiting that long."""

    count: int
    max_wait_s: int | None = None


@dataclass(frozen=True)
class OutputFiles:
    """Where a job's stdout and stderr go (``scontrol show job``'s ``StdOut=``/``StdErr=``);
    None where Slurm did not say, or said it ambiguously."""

    stdout: str | None = None
    stderr: str | None = None


@dataclass(frozen=True)
class Association:
    """One accounting association: an account's (``user`` None) or a user's in an account,
    with the QOS it may use."""

    account: str
    user: str | None = None
    qos: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Submission:
    """A batch job sbatch accepted: its id, and what sbatch said on stderr (the job_submit
    plugin's ``slurm.log_user`` messages, warnings), empty when it said nothing."""

    job_id: int
    stderr: str = ""


#: The message type sdiag counts a batch submission (sbatch) under.
SUBMIT_BATCH_RPC = "REQUEST_SUBMIT_BATCH_JOB"


@dataclass(frozen=True)
class RpcStats:
    """One message type of sdiag's "Remote Procedure Call statistics by message type": how
    many slurmctld served since its statistics were last reset, and the time it spent in
    them (microseconds; ``mean_us`` is sdiag's ``ave_time``, ``total_us`` its
    ``total_time``)."""

    count: int = 0
    mean_us: int = 0
    total_us: int = 0


@dataclass(frozen=True)
class ControllerStats:
    """slurmctld's own statistics (``sdiag``) since they were last reset.

    The counters are None when sdiag did not print them. ``rpcs`` maps a message type
    (``REQUEST_SUBMIT_BATCH_JOB``) to its statistics; sdiag lists only types served since
    the reset, so a missing type served none (:meth:`rpc`).
    """

    server_thread_count: int | None = None
    agent_queue_size: int | None = None
    dbd_agent_queue_size: int | None = None
    jobs_submitted: int | None = None
    rpcs: Mapping[str, RpcStats] = field(default_factory=dict)

    def rpc(self, message_type: str) -> RpcStats:
        """The statistics of one message type; zero when slurmctld served none."""
        return self.rpcs.get(message_type, RpcStats())


class NodeStateChange(enum.Enum):
    """The node state changes hetslurm makes (``scontrol update nodename=... state=``)."""

    DRAIN = "DRAIN"
    RESUME = "RESUME"
    UNDRAIN = "UNDRAIN"
    DOWN = "DOWN"


#: A job is named by its unique id, or by squeue's spelling (``"5_1"``, ``"11+1"``).
JobRef = int | str


class JobChanges(TypedDict, total=False):
    """The fields :meth:`SlurmBackend.update_job` may change; one not given (or None) stays."""

    tres_per_node: Sequence[GresItem] | None
    features: str | None
    prefer: str | None
    switches: Switches | None
    partition: str | None
    nodelist: Sequence[str] | None
    admin_comment: str | None


class SlurmBackend(abc.ABC):
    """How hetslurm reads and changes a Slurm cluster.

    An abstract class rather than a Protocol so every backend shares the argument checks
    below and ``get_backend`` can tell backends apart at run time.
    """

    #: Short name used by ``get_backend`` and ``--backend``.
    name: ClassVar[str] = "abstract"

    # ---------------------------------------------------------------- reading
    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node, in Slurm's order."""

    @abc.abstractmethod
    def node(self, name: str) -> NodeInfo:
        """One node; :class:`NotFoundError` if Slurm does not know it."""

    @abc.abstractmethod
    def jobs(self) -> list[JobInfo]:
        """Every job the controller still holds (including recently finished ones)."""

    @abc.abstractmethod
    def job(self, job_id: JobRef) -> JobInfo:
        """One job; :class:`NotFoundError` if the controller no longer has it."""

    @abc.abstractmethod
    def partitions(self) -> list[PartitionInfo]:
        """Every partition."""

    @abc.abstractmethod
    def qos(self) -> list[QosInfo]:
        """Every QOS (needs accounting; a cluster without it has none)."""

    # ---------------------------------------------------------------- changing
    @abc.abstractmethod
    def submit(self, script: str | Path, args: Sequence[str] = ()) -> int:
        """Submit a batch job; ``script`` is the script text, or a ``Path`` to it.

        ``args`` are extra sbatch options (``["-p", "gpu", "--gres=gpu:a100:2"]``).
        Returns the new job id.
        """

    @abc.abstractmethod
    def update_job(self, job_id: JobRef, **changes: Unpack[JobChanges]) -> None:
        """Change fields of a (normally pending) job; only the given ones change.

        ``tres_per_node`` replaces the job's ``--gres`` request. An empty string for
        ``features``/``prefer`` clears it; an empty ``nodelist`` clears the node request.
        """

    @abc.abstractmethod
    def hold(self, job_id: JobRef) -> None:
        """Hold a pending job (admin hold when run as an operator)."""

    @abc.abstractmethod
    def release(self, job_id: JobRef) -> None:
        """Release a held job."""

    @abc.abstractmethod
    def requeue(self, job_id: JobRef, *, incomplete: bool = True) -> None:
        """Requeue a running job; with ``incomplete`` only tasks that have not finished."""

    @abc.abstractmethod
    def requeue_hold(self, job_id: JobRef, *, incomplete: bool = False) -> None:
        """Requeue a job and hold it; with ``incomplete`` only if it has not finished."""

    @abc.abstractmethod
    def cancel(self, job_id: JobRef) -> None:
        """Cancel a job."""

    @abc.abstractmethod
    def update_node(self, name: str, state: NodeStateChange, reason: str | None = None) -> None:
        """Drain, resume or down a node; Slurm requires ``reason`` for DRAIN and DOWN."""

    # ---------------------------------------------------------------- optional
    # Reached only by some rooms (levers, act, audit, the testbed); a backend that cannot do
    # one says so with NotSupportedError instead of guessing.
    def _unsupported(self, what: str) -> NotSupportedError:
        return NotSupportedError(f"{what} is not supported by the '{self.name}' backend; "
                                 "use --backend cli")

    def config(self) -> dict[str, str]:
        """The controller's running configuration, key -> value as Slurm prints it."""
        raise self._unsupported("reading the controller's configuration")

    def set_node_weight(self, name: str, weight: int) -> None:
        """``scontrol update NodeName=<name> Weight=<weight>``: lost on ``scontrol
        reconfigure`` and controller restarts (slurm.conf's weight comes back)."""
        raise self._unsupported("setting a node's weight")

    def topology(self) -> list[SwitchInfo]:
        """The switch tree of ``topology/tree``; empty when the cluster has none."""
        raise self._unsupported("reading the switch topology")

    def ping(self) -> str | None:
        """None when slurmctld answers, else why not (one line)."""
        raise self._unsupported("pinging the controller")

    def reconfigure(self) -> None:
        """Make slurmctld and every slurmd re-read their configuration files."""
        raise self._unsupported("reconfigure")

    def controller_stats(self) -> ControllerStats:
        """slurmctld's statistics since they were last reset (RPC counts and times, queues)."""
        raise self._unsupported("reading the controller's statistics")

    def reset_controller_stats(self) -> None:
        """Set slurmctld's statistics back to zero (needs the operator's or SlurmUser's
        rights)."""
        raise self._unsupported("resetting the controller's statistics")

    def node_states(self) -> dict[str, str]:
        """Each node's state word as sinfo prints it: lower case, ``+`` between flags
        (``mixed+drain``... spelled by sinfo as ``draining``), ``*`` when not responding."""
        raise self._unsupported("reading node states")

    def active_job_ids(self) -> list[int]:
        """Ids of the jobs not yet finished (pending, running, suspended, completing)."""
        raise self._unsupported("listing active jobs")

    def queued_ids(self, jobs: Sequence[JobRef] = (), states: Sequence[str] = ()) -> list[str]:
        """squeue's id (``7``, ``5_1``, ``5_[2-3]``, ``11+1``) of every job the controller
        lists, in squeue's order.

        ``jobs`` narrows the listing to these jobs (an array's id takes in its tasks); a job
        the controller no longer knows is simply not listed. ``states`` are squeue's state
        names or codes (``PD``, ``RUNNING``, ``all`` for every state, finished jobs the
        controller still holds included); none: the unfinished ones (squeue's default).
        """
        raise self._unsupported("listing the queue")

    def submit_batch(self, script: str | Path | None = None, args: Sequence[str] = (), *,
                     wrap: str | None = None) -> Submission:
        """Submit a batch job and keep what sbatch said: like :meth:`submit`, and ``wrap``
        (a command line) instead of a script makes sbatch write the script around it.

        Raises:
            ValueError: both or neither of ``script`` and ``wrap``.
            CommandError: sbatch refused the job (the plugin's message is in it).
        """
        raise self._unsupported("submitting with sbatch's messages")

    def cancel_jobs(self, job_ids: Sequence[JobRef]) -> None:
        """Cancel several jobs in one call (jobs already gone are not an error)."""
        raise self._unsupported("cancelling jobs")

    def batch_script(self, job_id: JobRef) -> str:
        """The batch script a job was submitted with; :class:`NotFoundError` if gone."""
        raise self._unsupported("reading a job's batch script")

    def stored_batch_script(self, job_id: JobRef) -> str:
        """The batch script slurmdbd kept for a job (``AccountingStoreFlags=job_script``),
        also after it ended; :class:`NotFoundError` when none is stored."""
        raise self._unsupported("reading a stored batch script")

    def stored_batch_scripts(self, job_ids: Sequence[int]) -> dict[int, str | None]:
        """The stored batch script of each job (:meth:`stored_batch_script`), None where
        slurmdbd kept none; a backend that can read many in one call overrides this."""
        out: dict[int, str | None] = {}
        for jid in job_ids:
            try:
                out[int(jid)] = self.stored_batch_script(jid)
            except NotFoundError:
                out[int(jid)] = None
        return out

    def job_output_files(self, job_id: JobRef) -> OutputFiles:
        """Where a job's stdout and stderr go; :class:`NotFoundError` if gone."""
        raise self._unsupported("reading a job's output files")

    def accounting_jobs(self, since: float, until: float) -> SacctRecords:
        """Every user's job records (one per run: requeues repeat a job) in the accounting
        database between two epoch times, each decoded on demand."""
        raise self._unsupported("reading accounting")

    def accounting_jobs_by_id(self, job_ids: Sequence[JobRef], *, all_users: bool = False,
                              allocations_only: bool = False) -> SacctRecords:
        """The accounting database's records of these jobs (an array's id takes in its
        tasks), whenever they ran; ``all_users``: other users' too (sacct's ``--allusers``),
        ``allocations_only``: without step records (``-X``)."""
        raise self._unsupported("reading accounting")

    def clusters(self) -> list[str]:
        """Clusters registered in the accounting database (slurmdbd must answer)."""
        raise self._unsupported("reading accounting clusters")

    def accounts(self) -> list[str]:
        """Accounts in the accounting database."""
        raise self._unsupported("reading accounts")

    def associations(self, cluster: str) -> list[Association]:
        """Every association of ``cluster`` with the QOS it may use."""
        raise self._unsupported("reading associations")

    def add_cluster(self, name: str, *, exist_ok: bool = False) -> None:
        """Register a cluster in the accounting database."""
        raise self._unsupported("adding a cluster")

    def add_account(self, name: str, cluster: str, *, description: str = "",
                    organization: str = "", exist_ok: bool = False) -> None:
        """Add an account on ``cluster``."""
        raise self._unsupported("adding an account")

    def add_user(self, name: str, account: str, cluster: str, *,
                 exist_ok: bool = False) -> None:
        """Add a user's association with ``account`` on ``cluster``."""
        raise self._unsupported("adding a user")

    def set_user_qos(self, name: str, qos: Sequence[str], default_qos: str) -> None:
        """Set the QOS a user may use (every association of it) and its default QOS."""
        raise self._unsupported("setting a user's QOS")

    def add_qos(self, name: str, settings: Mapping[str, str], *, description: str = "",
                exist_ok: bool = False) -> None:
        """Add a QOS; ``settings`` are sacctmgr keywords (``{"Priority": "10"}``)."""
        raise self._unsupported("adding a QOS")

    def modify_qos(self, name: str, settings: Mapping[str, str]) -> None:
        """Change fields of a QOS (a value of ``-1`` clears a limit)."""
        raise self._unsupported("modifying a QOS")

    def delete_qos(self, name: str) -> None:
        """Remove a QOS from the accounting database."""
        raise self._unsupported("deleting a QOS")

    def grant_qos(self, qos: str, kind: str, name: str, cluster: str, *, account: str = "",
                  revoke: bool = False) -> None:
        """Let an association use ``qos`` (``qos+=``), or stop it (``revoke``: ``qos-=``).

        ``kind`` is ``user`` or ``account``; ``account`` narrows a user's grant to one of its
        associations."""
        raise self._unsupported("granting a QOS")

    # ---------------------------------------------------------------- shared checks
    @staticmethod
    def _check_state_change(state: NodeStateChange, reason: str | None) -> None:
        if state in (NodeStateChange.DRAIN, NodeStateChange.DOWN) and not reason:
            raise ValueError(f"Slurm requires a reason to set a node {state.value}")

    @staticmethod
    def _check_update(changes: JobChanges) -> JobChanges:
        """The changes that are given (not None); at least one must be."""
        chosen = cast(JobChanges, {k: v for k, v in changes.items() if v is not None})
        if not chosen:
            raise ValueError("update_job needs at least one field to change")
        return chosen
