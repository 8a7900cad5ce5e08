"""Relax pending jobs that waited too long, when a relaxed request would start now.

What a job asked is read from the hook's decision record (``hetslurm:{...}``, docs/hook.md):
its canonical request (``req``), the fields the hook wrote (``set``) and those the job's
own options kept (``kept``). What Slurm holds now is read from the job (``Features``,
``Gres``, ``Prefer``, ``Switches``). Three edits are possible, all of them relaxing only
(the job accepts at least what it accepted before; nothing is ever pinned to nodes):

* ``switch-wait``: ``locality=switch`` was *preferred* and Slurm holds the job for one leaf
  switch: the wait is set to 0 (``Switches=N@0``), so Slurm tries one leaf, then spans.
* ``models``: the job's GPU feature list is narrower than its request's ranked list (the
  hook narrowed it for ``energy=low``): widened back to the request's own (``Features=m1|m2``).
  A narrowing to one model that the hook wrote as a typed gres (``gpu:a100:2``) cannot be
  widened: Slurm 22.05 refuses to make a pending job's typed gres untyped (rule
  ``typed-gres``, no edit).
* ``prefer``: ``--prefer`` names models of that list (22.05 waits for a preferred feature
  rather than fall back): it is dropped.
* ``wait-for``: a ``wait-for=first,max=W`` job waited W in its first model's partition: its
  ``Partition=`` becomes its whole ranked list (docs/fallback.md), whether or not it would
  start now, because the user bounded the wait. A ``models`` widening on a site with ranked
  fallback edits ``Partition=`` too, so the widened list keeps the job's order.

The placement core decides, on the live state: the request as Slurm holds it must not fit
now (else the job waits for something a wider request would not fix) and the relaxed one
must. Each relaxation consumes what it would get, so two jobs are not promised the same
GPUs. :func:`plan_relax` changes nothing (its batch path places the jobs in waves on
threads and gives the sequential path's decisions exactly: :class:`_Batch`,
docs/act.md#relax-in-batch); :func:`apply_relax` re-reads each job right before editing,
skips it when anything changed, edits through the access layer, reads it back and logs
every step in the action log.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hetslurm.act.log import ActionLog
from hetslurm.errors import HetslurmError
from hetslurm.policy.stall import decision_record, gres_text
from hetslurm.request.record import DecisionRecord
from hetslurm.slurm.backend import JobInfo, NotFoundError, SlurmBackend, Switches

if TYPE_CHECKING:
    from hetslurm.placement.model import ClusterModel, KernelRequest
    from hetslurm.placement.place import Placement
    from hetslurm.request.language import Request
    from hetslurm.site.model import Site
    from hetslurm.site.schema import Rebalance

#: Rules that only count in the summary (most pending jobs are not hetslurm's to relax).
QUIET_RULES = ("no-record", "nothing-to-relax")
#: What :func:`_ask` answers for a narrowing held in a typed GPU gres.
TYPED = "typed-gres"


@dataclass(frozen=True)
class Edit:
    """One relaxing change: ``field`` as ``scontrol update`` names it, old and new text."""

    kind: str  # switch-wait, models, prefer, wait-for
    field: str  # Switches, Features, Gres, Prefer, Partition
    old: str
    new: str


@dataclass(frozen=True)
class Snapshot:
    """The fields an edit depends on, as read when deciding (compared before acting)."""

    state: str
    reason: str | None
    name: str
    restarts: int | None
    features: str | None
    prefer: str | None
    gres: str
    switches: str | None
    partition: str | None = None

    @classmethod
    def of(cls, job: JobInfo) -> Snapshot:
        return cls(state=job.state, reason=job.reason, name=job.name, restarts=job.restarts,
                   features=job.features, prefer=job.prefer, gres=gres_text(job.tres_per_node),
                   partition=job.partition,
                   switches=_switch_text(job.switches))


@dataclass(frozen=True)
class RelaxDecision:
    """One pending job judged. ``action`` is ``relax`` or ``none``; ``rule`` says why."""

    job: str
    job_id: int
    name: str
    user: str | None
    partition: str | None
    reason: str | None
    waited_s: float | None
    rule: str
    action: str
    detail: str
    request: str | None = None
    edits: tuple[Edit, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    snapshot: Snapshot | None = None

    def row(self) -> dict[str, Any]:
        return {"job": self.job, "user": self.user,
                "waited_s": None if self.waited_s is None else round(self.waited_s),
                "rule": self.rule, "action": self.action,
                "edits": ", ".join(f"{e.field}={e.new}" for e in self.edits),
                "detail": self.detail}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RelaxOutcome:
    job: str
    result: str  # done, skipped, failed, not-changed, started
    detail: str = ""


@dataclass
class RelaxPlan:
    decisions: list[RelaxDecision]
    quiet: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------- reading
def _switch_text(sw: Switches | None) -> str | None:
    if sw is None:
        return None
    return f"{sw.count}@{sw.max_wait_s}" if sw.max_wait_s is not None else str(sw.count)


def waited(job: JobInfo, now: float) -> float | None:
    """Seconds the job has been eligible (else since submission); None when unknown."""
    since = job.eligible_time or job.submit_time
    return None if since is None else max(0.0, now - since.timestamp())


def _or_models(features: str | None, known: Sequence[str]) -> tuple[str, ...] | None:
    """The models of a plain OR of model features (``h100|a100``); None for anything else."""
    if not features:
        return None
    words = features.split("|")
    if any(w not in known for w in words):
        return None
    return tuple(words)


def _gpu_items(job: JobInfo) -> list[int]:
    return [i for i, it in enumerate(job.tres_per_node) if it.name == "gpu"]


def current_models(job: JobInfo, site_models: Sequence[str]) -> tuple[str, ...] | None:
    """GPU models Slurm may give the job now: its feature OR-list, else its typed gres;
    ``()`` for any model; None when the job's constraint is not one hetslurm can read."""
    gpu = _gpu_items(job)
    if len(gpu) != 1:
        return None
    item = job.tres_per_node[gpu[0]]
    if job.features:
        listed = _or_models(job.features, site_models)
        if listed is None or (item.type is not None and item.type not in listed):
            return None
        return (item.type,) if item.type else listed
    return (item.type,) if item.type else ()


def prefer_models(job: JobInfo, allowed: Sequence[str]) -> tuple[str, ...] | None:
    """The models ``--prefer`` names when it names only models of ``allowed``; else None."""
    if not job.prefer:
        return None
    words = [w for w in job.prefer.replace("&", "|").split("|") if w]
    if not words or any(w not in allowed for w in words):
        return None
    return tuple(words)


# ----------------------------------------------------------------------------- deciding
@dataclass(frozen=True)
class _Ask:
    """A job's request two ways: as Slurm holds it, and relaxed; the edits between them."""

    held: Request
    relaxed: Request
    edits: tuple[Edit, ...]
    kept: tuple[str, ...]


def _ask(job: JobInfo, req: Request, rec: DecisionRecord, site: Site,
         kinds: Sequence[str]) -> _Ask | str:
    """What could be relaxed, or a one-line reason why nothing can."""
    kept = rec.kept
    edits: list[Edit] = []
    held, relaxed = req, req
    loc = req.locality
    site_models = site.gpu_models()
    blocked: list[str] = []
    typed = False
    # Switch wait: only when the request said "preferred" and Slurm still holds the job.
    if "switch-wait" in kinds and loc.switch == "preferred" and req.nodes > 1:
        sw = job.switches
        if "req_switch" in kept:
            blocked.append("the job's own --switches was kept")
        elif sw is not None and sw.count >= 1 and (sw.max_wait_s is None or sw.max_wait_s > 0):
            held = replace(held, locality=replace(held.locality, switch="required"))
            relaxed = replace(relaxed, locality=replace(relaxed.locality, switch="preferred"))
            edits.append(Edit("switch-wait", "Switches", _switch_text(sw) or "",
                              f"{sw.count}@0"))
    # Model list: the request's own ranked list (before energy=low narrowed it) against what
    # Slurm allows now.
    wanted = req.own_gpu_models or req.gpu_models
    if req.gpus_per_node and len(wanted) > 1:
        now_models = current_models(job, site_models)
        prefer = prefer_models(job, wanted)
        if "models" in kinds:
            if {"features", "tres_per_node"} & set(kept):
                blocked.append("the job's own --constraint/--gres was kept")
            elif now_models and set(now_models) < set(wanted):
                item = job.tres_per_node[_gpu_items(job)[0]]
                if item.type is not None:
                    # Slurm 22.05 refuses to turn a pending job's typed GPU gres untyped
                    # ("Invalid GRES specification (with and without type identification)",
                    # measured on the testbed, also in two steps); a typed one-model
                    # narrowing cannot be widened in place.
                    typed = True
                else:
                    held = replace(held, gpu_models=tuple(m for m in wanted
                                                          if m in now_models))
                    relaxed = replace(relaxed, gpu_models=wanted)
                    edits.append(Edit("models", "Features", job.features or "",
                                      "|".join(wanted)))
                    # Ranked fallback: the widened list in its order, as the hook would
                    # have submitted it.
                    ranked = site.ranked_list(job.partition, wanted)
                    if ranked and "partition" not in kept:
                        held = replace(held, partition=job.partition, partitions=())
                        relaxed = replace(relaxed, partitions=tuple(ranked.split(",")))
                        edits.append(Edit("models", "Partition", job.partition or "", ranked))
        if "prefer" in kinds and prefer is not None:
            base = held.gpu_models or wanted
            narrowed = tuple(m for m in base if m in prefer)
            if narrowed:
                held = replace(held, gpu_models=narrowed)
                edits.append(Edit("prefer", "Prefer", job.prefer or "", ""))
    # A bounded wait-for=first: the job waits in its first model's partition only.
    now_part = job.partition or ""
    if "wait-for" in kinds and req.wait_for_max_s is not None and now_part in site.ranked:
        first = site.ranked[now_part]
        ranked = site.ranked_list(first.base, req.gpu_models)
        if ranked and ranked != now_part:
            held = replace(held, partitions=(now_part,))
            relaxed = replace(relaxed, partitions=tuple(ranked.split(",")))
            edits.append(Edit("wait-for", "Partition", now_part, ranked))
    if not edits:
        if typed:
            return TYPED
        return "; ".join(blocked) if blocked else "nothing to relax"
    return _Ask(held, relaxed, tuple(edits), kept)


def _partition_model(model: ClusterModel, backend_parts: Mapping[str, tuple[str, ...]],
                     partition: str | None) -> ClusterModel:
    """``model`` with nodes outside the job's partition(s), as Slurm has them, unavailable."""
    allowed: set[str] = set()
    for p in (partition or "").split(","):
        allowed.update(backend_parts.get(p, ()))
    return model.only(allowed) if allowed else model.only(model.names)


def _taken(model: ClusterModel, placement: Placement, request: Request
           ) -> list[tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]]:
    """What ``placement`` takes, per node: (node index, GPUs, FPGAs, cores, MiB)."""
    mem = request.mem_per_node_mib
    if mem is None:
        mem = request.cores_per_node * (model.def_mem_per_cpu_mib or 0)
    return [(model.node_index(n.name), n.gpus, n.fpgas, n.cores, mem)
            for n in placement.nodes]


def consume(model: ClusterModel, placement: Placement, request: Request) -> ClusterModel:
    """``model`` with what ``placement`` would take marked busy (devices, cores, memory);
    the measured load is kept."""
    import numpy as np

    from hetslurm.placement.model import StateArrays

    st = model.state
    gpu_free = np.array(st.gpu_free)
    fpga_free = np.array(st.fpga_free)
    core_free = np.array(st.core_free)
    mem_free = np.array(st.mem_free_mib)
    _take_arrays(model, _taken(model, placement, request), gpu_free, fpga_free, core_free,
                 mem_free)
    return model.with_arrays(StateArrays(st.available, gpu_free, fpga_free, core_free,
                                         mem_free, st.free_at, time=st.time,
                                         load_milli=st.load_milli))


def _take_arrays(model: ClusterModel, taken: Sequence[tuple[int, tuple[int, ...],
                                                            tuple[int, ...], tuple[int, ...],
                                                            int]],
                 gpu_free: Any, fpga_free: Any, core_free: Any, mem_free: Any) -> None:
    for i, gpus, fpgas, cores, mem in taken:
        for g in gpus:
            gpu_free[int(model.gpu_offsets[i]) + g] = 0
        for f in fpgas:
            fpga_free[int(model.fpga_offsets[i]) + f] = 0
        for c in cores:
            core_free[int(model.core_offsets[i]) + c] = 0
        mem_free[i] = max(0, int(mem_free[i]) - mem)


# ----------------------------------------------------------------------------- placing
#: What a placer answers for one request: the placement, or the PlacementError ``place``
#: raised (a malformed request: no free state changes that); None for a relaxed request
#: not placed because the held one was malformed.
Answer = Any  # Placement | PlacementError | None


class _Sequential:
    """The reference: each job placed on the model as the jobs before it left it, rebuilt
    (model, partition view, core) after every consumption."""

    def __init__(self, model: ClusterModel, parts: Mapping[str, tuple[str, ...]]) -> None:
        self.model = model
        self.parts = parts
        self.models: dict[str, ClusterModel] = {}

    def place(self, k: int, ask: _Ask, scope: str) -> tuple[Answer, Answer]:
        if scope not in self.models:
            self.models[scope] = _partition_model(self.model, self.parts, scope)
        return _place_two(self.models[scope], ask)

    def take(self, placement: Placement, request: Request) -> None:
        self.model = consume(self.model, placement, request)
        self.models = {}

    def stats(self) -> dict[str, Any]:
        return {"threads": 1}


class _Scope:
    """One partition scope's model as :class:`_Sequential` would see it after the
    consumptions so far, kept by taking from copies of its arrays and from one core
    (:meth:`PlacementCore.take`) instead of building both anew. Not thread-safe (a core
    holds scratch space): one per thread."""

    def __init__(self, base: ClusterModel) -> None:
        import numpy as np

        self.base = base
        # Built before the first view, so every view shares it and the "cannot place"
        # answers it keeps (they depend on the static arrays and the scope only).
        base.empty()
        self.applied = 0
        st = base.state
        self.gpu_free = np.array(st.gpu_free)
        self.fpga_free = np.array(st.fpga_free)
        self.core_free = np.array(st.core_free)
        self.mem_free = np.array(st.mem_free_mib)
        self.core = base.new_core()
        self.view: ClusterModel | None = base.with_core(st, self.core)

    def take(self, taken: Sequence[tuple[int, tuple[int, ...], tuple[int, ...],
                                         tuple[int, ...], int]]) -> None:
        import numpy as np

        _take_arrays(self.base, taken, self.gpu_free, self.fpga_free, self.core_free,
                     self.mem_free)
        for i, gpus, fpgas, cores, mem in taken:
            self.core.take(i, np.asarray(gpus, dtype=np.int32),
                           np.asarray(fpgas, dtype=np.int32),
                           np.asarray(cores, dtype=np.int32), mem)
        self.applied += 1
        self.view = None

    def sync(self, history: Sequence[Any]) -> _Scope:
        """Take what was taken since the last sync (taking commutes with the partition
        view: it never changes availability)."""
        for taken in history[self.applied:]:
            self.take(taken)
        return self

    def model(self) -> ClusterModel:
        from hetslurm.placement.model import StateArrays, _ro

        if self.view is None:
            st = self.base.state
            self.view = self.base.with_core(StateArrays(
                st.available, _ro(self.gpu_free.copy()), _ro(self.fpga_free.copy()),
                _ro(self.core_free.copy()), _ro(self.mem_free.copy()), st.free_at,
                time=st.time, load_milli=st.load_milli), self.core)
        return self.view


class _Batch:
    """Optimistic concurrency, with the answers of :class:`_Sequential` exactly.

    Jobs are placed in waves, each against one snapshot (the state when the wave starts),
    by ``threads`` threads; the placement kernel runs with the GIL released. The ordered
    walk then keeps a snapshot answer unless a node it may depend on was taken since the
    snapshot, and places that request again, on the state the jobs before it left.

    Why a kept answer equals the sequential one (docs/act.md, "Relax in batch"): ``place``
    on a partition view reads the free state (GPUs, FPGAs, cores, memory) of the nodes
    available in the view whose GPU model the request allows (all of them when it asks no
    GPU) and of no other node: the index search visits only the buckets of allowed models
    and holds available nodes only; the per-row bounds come from static arrays; an
    unplaced answer counts and names only nodes that could hold the request on the empty
    cluster (allowed models), its empty-cluster part reads no free state, and a view built
    for a job's partitions carries no live state (no start estimate). Taking resources
    changes nothing but the taken nodes' free state, so an answer whose read set holds no
    node taken since its snapshot is the answer on the current state. A malformed request
    raises whatever the state. The current state is kept per scope by :class:`_Scope`,
    whose arrays and core are, entry for entry, those a model built by :func:`consume`
    and :func:`_partition_model` would hold (the core's bounds are static; its index is a
    set per bucket).
    """

    def __init__(self, model: ClusterModel, parts: Mapping[str, tuple[str, ...]],
                 threads: int) -> None:
        import numpy as np

        self.model = model
        self.parts = parts
        self.threads = threads
        # The walk's scopes; each snapshot thread keeps its own in `local`.
        self.scopes: dict[str, _Scope] = {}
        self.local = threading.local()
        # Nodes taken since the first snapshot, with the count of takes so far when each
        # was last taken: an answer from a snapshot made after `n` takes is stale when a
        # node it reads was taken at a count > n.
        self.taken_at = np.zeros(model.n_nodes, dtype=np.int64)
        self.takes = 0
        self.history: list[Any] = []
        self.answers: dict[int, tuple[Answer, Answer, Any, Any, int]] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.read_sets: dict[Any, Any] = {}
        self.prepared = 0
        self.prepare_s = 0.0
        self.replaced = 0

    def stats(self) -> dict[str, Any]:
        return {"threads": self.threads, "snapshot_answers": self.prepared,
                "snapshot_s": round(self.prepare_s, 3), "placed_again": self.replaced}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()

    def _scope(self, scopes: dict[str, _Scope], scope: str) -> _Scope:
        if scope not in scopes:
            scopes[scope] = _Scope(_partition_model(self.model, self.parts, scope))
        return scopes[scope].sync(self.history)

    def prepare(self, wave: Sequence[tuple[int, _Ask, str]]) -> None:
        """Snapshot answers for ``wave`` (index, ask, scope), placed concurrently."""
        if not wave:
            return
        t0 = time.perf_counter()
        try:
            self._prepare(wave)
        finally:
            self.prepare_s += time.perf_counter() - t0

    def _prepare(self, wave: Sequence[tuple[int, _Ask, str]]) -> None:
        self.prepared += len(wave)
        n = self.threads
        chunks = [wave[c::n] for c in range(n) if wave[c::n]]
        if len(chunks) == 1:
            results = [self._answer_all(chunks[0])]
        else:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(max_workers=n,
                                               thread_name_prefix="hetslurm-relax")
            results = list(self.pool.map(self._answer_all, chunks))
        for res in results:
            for k, held, relaxed, rh, rr in res:
                self.answers[k] = (held, relaxed, rh, rr, self.takes)

    def _answer_all(self, chunk: Sequence[tuple[int, _Ask, str]]) -> list[tuple[Any, ...]]:
        # On this thread's own scopes, brought to the snapshot (the walk waits meanwhile,
        # so the history does not move).
        mine: dict[str, _Scope] | None = getattr(self.local, "scopes", None)
        if mine is None:
            mine = self.local.scopes = {}
        out = []
        for k, ask, scope in chunk:
            m = self._scope(mine, scope).model()
            held, relaxed = _place_two(m, ask)
            out.append((k, held, relaxed, _reads(m, ask.held, scope, self.read_sets),
                        _reads(m, ask.relaxed, scope, self.read_sets)))
        return out

    def place(self, k: int, ask: _Ask, scope: str) -> tuple[Answer, Answer]:
        from hetslurm.errors import PlacementError
        from hetslurm.placement.place import place

        held, relaxed, rh, rr, at = self.answers.pop(k)

        def stale(reads: Any) -> bool:
            return reads is not None and bool((self.taken_at[reads] > at).any())

        if isinstance(held, PlacementError):
            return held, None
        if stale(rh):
            held = place(self._scope(self.scopes, scope).model(), ask.held)
            self.replaced += 1
        if not isinstance(relaxed, PlacementError) and stale(rr):
            relaxed = place(self._scope(self.scopes, scope).model(), ask.relaxed)
            self.replaced += 1
        return held, relaxed

    def take(self, placement: Placement, request: Request) -> None:
        taken = _taken(self.model, placement, request)
        self.history.append(taken)
        self.takes += 1
        for i, *_ in taken:
            self.taken_at[i] = self.takes


def _place_two(m: ClusterModel, ask: _Ask) -> tuple[Answer, Answer]:
    from hetslurm.errors import PlacementError
    from hetslurm.placement.place import place

    try:
        held = place(m, ask.held)
    except PlacementError as exc:
        return exc, None
    try:
        return held, place(m, ask.relaxed)
    except PlacementError as exc:
        return held, exc


def _reads(m: ClusterModel, request: Request, scope: str, cache: dict[Any, Any]) -> Any:
    """Indices of the nodes whose free state ``place(m, request)`` may read (see
    :class:`_Batch`); None for a malformed request. ``cache``: per scope and compiled
    request (a queue asks few shapes; a scope's availability and the static arrays are all
    the set depends on)."""
    from hetslurm.errors import PlacementError
    from hetslurm.placement.place import compile_request

    try:
        kr = compile_request(m, request)
    except PlacementError:
        return None
    hit = cache.get((scope, kr))
    if hit is None:
        hit = cache[scope, kr] = _read_set(m, kr)
    return hit


def _read_set(m: ClusterModel, kr: KernelRequest) -> Any:
    import numpy as np

    mask = m.state.available.astype(bool)
    if kr.gpus > 0:
        allowed = np.asarray(kr.gpu_rank, dtype=np.int64) >= 0
        has = m.gpu_model >= 0
        ok = np.zeros(m.n_nodes, dtype=bool)
        ok[has] = allowed[m.gpu_model[has]]
        mask &= ok
    return np.flatnonzero(mask)


@dataclass(frozen=True)
class _Item:
    """A job that reaches the run limit: its ask, its wait, and where it would be placed."""

    req: Request
    ask: _Ask
    waited: float
    bounded: bool
    scope: str
    decide: Callable[..., RelaxDecision]


def default_relax_threads() -> int:
    """The CPUs this process may use (the threads ``bench rebalance`` tries)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def plan_relax(jobs: Sequence[JobInfo], site: Site, policy: Rebalance, model: ClusterModel, *,
               partitions: Mapping[str, tuple[str, ...]] | None = None,
               now: float | None = None, record_field: str = "admin_comment",
               record_key: str = "hetslurm",
               deadline: float | None = None,
               clock: Callable[[], float] = time.monotonic,
               threads: int | None = None, batch: bool | None = None,
               stats: dict[str, Any] | None = None) -> tuple[RelaxPlan, list[str]]:
    """Judge every pending job; changes nothing. Returns the plan and the ids of jobs left
    unjudged because ``deadline`` (on ``clock``) passed.

    ``batch``: place the jobs in waves (:class:`_Batch`) rather than one after another (the
    reference, :class:`_Sequential`), with the same decisions; None: the policy's
    ``relax_batch``. ``threads``: the threads that place a wave; None: the policy's
    ``relax_threads``. ``stats``, when given, receives
    how the placing went (threads, snapshot answers and seconds, requests placed again).
    """
    now = time.time() if now is None else now
    parts = partitions or {}
    n_threads = threads or policy.relax_threads
    pending = [j for j in jobs if j.state == "PENDING"]
    # Longest waiting first: they get the free devices first, as Slurm's age factor would.
    pending.sort(key=lambda j: (-(waited(j, now) or 0.0), j.job_id))
    out: list[RelaxDecision] = []
    quiet: dict[str, int] = {}
    skipped: list[str] = []
    parsed: dict[str, Request | str] = {}
    relaxed_n = 0
    judged: list[str | RelaxDecision | _Item] = []

    def judge(k: int) -> str | RelaxDecision | _Item:
        # Judged once, in order, on demand (a wave judges ahead of the walk).
        while len(judged) <= k:
            judged.append(_prejudge(pending[len(judged)], site, policy, parsed, now,
                                    record_field, record_key))
        return judged[k]

    placer: _Sequential | _Batch
    use_batch = policy.relax_batch if batch is None else batch
    placer = _Batch(model, parts, n_threads) if use_batch else _Sequential(model, parts)
    ahead = 0

    def wave(k: int) -> None:
        # Snapshot answers for the placements from job k on: as many as may still relax
        # (jobs that fit as held or would not start do not count), at least two a thread.
        nonlocal ahead
        assert isinstance(placer, _Batch)
        size = max(policy.max_relax_per_run - relaxed_n, 2 * n_threads)
        todo: list[tuple[int, _Ask, str]] = []
        x = max(k, ahead)
        while x < len(pending) and len(todo) < size:
            it = judge(x)
            if isinstance(it, _Item) and not it.bounded:
                todo.append((x, it.ask, it.scope))
            x += 1
        ahead = x
        placer.prepare(todo)

    try:
        for k, j in enumerate(pending):
            if deadline is not None and clock() >= deadline:
                skipped.append(j.display_id)
                continue
            it = judge(k)
            if isinstance(it, str):
                quiet[it] = quiet.get(it, 0) + 1
                continue
            if isinstance(it, RelaxDecision):
                out.append(it)
                continue
            ask, decide = it.ask, it.decide
            if relaxed_n >= policy.max_relax_per_run:
                out.append(decide("run-limit", "none", f"max_relax_per_run "
                                  f"({policy.max_relax_per_run}) reached", edits=ask.edits))
                continue
            if it.bounded:
                # The user bounded the wait: widened now, whether or not it would start now.
                out.append(decide("wait-for-max", "relax", f"waited {round(it.waited)}s >= "
                                  f"its wait-for max {it.req.wait_for_max_s}s: submitted to "
                                  f"{ask.edits[-1].new}", edits=ask.edits))
                relaxed_n += 1
                continue
            if isinstance(placer, _Batch) and k not in placer.answers:
                wave(k)
            held_p, relaxed_p = placer.place(k, ask, it.scope)
            if isinstance(held_p, Exception) or isinstance(relaxed_p, Exception):
                exc = held_p if isinstance(held_p, Exception) else relaxed_p
                out.append(decide("bad-record", "none", f"placement refused the request: "
                                  f"{exc}", edits=ask.edits))
                continue
            ev = {"held": _brief(held_p), "relaxed": _brief(relaxed_p)}
            if held_p.placeable:
                out.append(decide("fits-as-is", "none", "the request as held fits now: it "
                                  "waits for something a wider request would not change",
                                  edits=ask.edits, evidence=ev))
                # Slurm is about to start it there: not free for the next job either.
                placer.take(held_p, ask.held)
                continue
            if not relaxed_p.placeable:
                out.append(decide("would-not-start", "none", "the relaxed request would not "
                                  f"start now either ({relaxed_p.blocking})", edits=ask.edits,
                                  evidence=ev))
                continue
            out.append(decide("relax", "relax", f"would start now on {relaxed_p.nodelist}",
                              edits=ask.edits, evidence=ev))
            relaxed_n += 1
            # What it would get is no longer free for the next job, in every partition's view.
            placer.take(relaxed_p, ask.relaxed)
    finally:
        if isinstance(placer, _Batch):
            placer.close()
        if stats is not None:
            stats.update(placer.stats())
    return RelaxPlan(out, quiet), skipped


def _prejudge(j: JobInfo, site: Site, policy: Rebalance, parsed: dict[str, Request | str],
              now: float, record_field: str, record_key: str) -> str | RelaxDecision | _Item:
    """Job ``j`` judged as far as no other job matters: a quiet rule's name, a decision, or
    the item the run limit and the placement decide."""
    from hetslurm.errors import PlacementError
    from hetslurm.request.language import parse_request, resolve

    rec = decision_record(j, record_field, record_key)
    if rec is None or rec.request is None or not rec.enforced:
        return "no-record"
    text = rec.request

    def decide(rule: str, action: str, detail: str, *, edits: tuple[Edit, ...] = (),
               evidence: Mapping[str, Any] | None = None) -> RelaxDecision:
        return RelaxDecision(
            job=j.display_id, job_id=j.job_id, name=j.name, user=j.user,
            partition=j.partition, reason=j.reason, waited_s=waited(j, now), rule=rule,
            action=action, detail=detail, request=text, edits=edits,
            evidence=evidence or {}, snapshot=Snapshot.of(j))

    if text not in parsed:
        try:
            parsed[text] = resolve(parse_request(text), site)
        except (PlacementError, ValueError) as exc:
            parsed[text] = str(exc)
    req = parsed[text]
    if isinstance(req, str):
        return decide("bad-record", "none", f"the record's request does not resolve: {req}")
    ask = _ask(j, req, rec, site, policy.relax_kinds)
    w = waited(j, now)
    if ask == TYPED and w is not None and w >= policy.pending_limit_s:
        return decide(TYPED, "none", "the GPU list was narrowed to one model in a typed gres, "
                      "which Slurm 22.05 cannot make untyped on a pending job; not widened")
    if isinstance(ask, str):
        return "nothing-to-relax"
    bounded = all(e.kind == "wait-for" for e in ask.edits)
    limit = req.wait_for_max_s if bounded and req.wait_for_max_s is not None else \
        policy.pending_limit_s
    if w is None or w < limit:
        return decide("not-long-enough", "none", f"waited {0 if w is None else round(w)}s < "
                      f"{limit}s" + (" (its wait-for max)" if bounded else ""),
                      edits=ask.edits)
    reason = j.reason or "None"
    if reason not in policy.pending_reasons:
        return decide("pending-reason", "none", f"pending for {reason}, not one of "
                      f"{', '.join(policy.pending_reasons)}", edits=ask.edits)
    if j.array_task_spec is not None or j.het_job_id:
        return decide("array-or-het", "none", "an array's pending remainder or a "
                      "heterogeneous component is not edited", edits=ask.edits)
    scope = ",".join(dict.fromkeys([*(j.partition or "").split(","),
                                    *ask.relaxed.partitions]))
    return _Item(req, ask, w, bounded, scope, decide)


def _brief(p: Placement) -> dict[str, Any]:
    return {"placeable": p.placeable, "nodelist": p.nodelist, "blocking": p.blocking,
            "gpus": {n.name: list(n.gpus) for n in p.nodes}, "reason": p.reason}


# ----------------------------------------------------------------------------- acting
def _changed(d: RelaxDecision, fresh: JobInfo) -> str | None:
    snap = d.snapshot
    assert snap is not None
    now = Snapshot.of(fresh)
    if now.name != snap.name:
        # The listing (JSON) and the single read (scontrol -o) disagree: a name holding
        # Key=value text or a newline can forge fields of the one-line record.
        return "the job's record reads differently now (name); not trusted"
    if now.state != "PENDING":
        return f"now {now.state}"
    if (now.reason or "").startswith("JobHeld"):
        return f"now held ({now.reason})"
    for f in ("restarts", "features", "prefer", "gres", "switches", "partition"):
        if getattr(now, f) != getattr(snap, f):
            # Either the job was edited, or a newline in its comment cut the one-line
            # record short: both mean "do not touch it".
            return (f"{f} changed meanwhile or reads differently ({getattr(snap, f)!r} -> "
                    f"{getattr(now, f)!r})")
    return None


def _update_args(edits: Sequence[Edit], job: JobInfo) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for e in edits:
        if e.field == "Switches":
            count = job.switches.count if job.switches is not None else 1
            args["switches"] = Switches(count, 0)
        elif e.field == "Features":
            args["features"] = e.new
        elif e.field == "Prefer":
            args["prefer"] = e.new
        elif e.field == "Partition":
            args["partition"] = e.new
    return args


def _shows(edits: Sequence[Edit], job: JobInfo) -> bool:
    snap = Snapshot.of(job)
    for e in edits:
        if e.field == "Switches" and (job.switches is not None
                                      and job.switches.max_wait_s not in (0, None)):
            return False
        if e.field == "Features" and snap.features != e.new:
            return False
        if e.field == "Prefer" and (snap.prefer or "") != e.new:
            return False
        if e.field == "Partition" and snap.partition != e.new:
            return False
    return True


def apply_relax(backend: SlurmBackend, decisions: Sequence[RelaxDecision], log: ActionLog, *,
                now: float, verify_timeout_s: float = 10.0, deadline: float | None = None,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep
                ) -> tuple[list[RelaxOutcome], list[str]]:
    """Log every decision; edit the ``relax`` ones. One job's failure never stops the
    others. Returns the outcomes and the jobs not started because ``deadline`` passed."""
    outcomes: list[RelaxOutcome] = []
    skipped: list[str] = []
    for d in decisions:
        if d.action == "relax" and deadline is not None and clock() >= deadline:
            skipped.append(d.job)
            continue
        try:
            log.append("decision", {"t": now, "source": "rebalance", "phase": "relax",
                                    **d.to_dict()})
            if d.action != "relax":
                continue
            outcomes.append(_relax_one(backend, d, log, now, verify_timeout_s, sleep))
        except Exception as exc:  # one job's failure never stops the others
            detail = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(HetslurmError):
                log.append("action", {"t": now, "source": "rebalance", "job": d.job,
                                      "job_id": d.job_id, "action": "relax",
                                      "result": "failed", "detail": detail})
            outcomes.append(RelaxOutcome(d.job, "failed", detail))
    return outcomes, skipped


def _relax_one(backend: SlurmBackend, d: RelaxDecision, log: ActionLog, now: float,
               verify_timeout_s: float, sleep: Callable[[float], None]) -> RelaxOutcome:
    def record(result: str, detail: str) -> RelaxOutcome:
        log.append("action", {"t": now, "source": "rebalance", "job": d.job,
                              "job_id": d.job_id, "action": "relax", "result": result,
                              "detail": detail,
                              "edits": [asdict(e) for e in d.edits]})
        return RelaxOutcome(d.job, result, detail)

    # Re-read right before editing: the job may have started, been held or edited since.
    try:
        fresh = backend.job(d.job)
    except NotFoundError:
        return record("skipped", "the job is gone")
    why = _changed(d, fresh)
    if why is not None:
        return record("skipped", why)
    backend.update_job(d.job, **_update_args(d.edits, fresh))
    deadline = time.monotonic() + verify_timeout_s
    seen = "?"
    while True:
        try:
            j = backend.job(d.job)
        except NotFoundError:
            return record("not-changed", "the job vanished after the edit")
        seen = (f"state {j.state}, partition {j.partition!r}, features {j.features!r}, gres "
                f"{gres_text(j.tres_per_node)!r}, prefer {j.prefer!r}, switches "
                f"{_switch_text(j.switches)!r}")
        if j.state in ("RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED"):
            return record("done", f"started: {seen}")
        if j.state != "PENDING":
            return record("not-changed", seen)
        if _shows(d.edits, j):
            return record("done", seen)
        if time.monotonic() >= deadline:
            return record("not-changed", seen)
        sleep(0.5)
