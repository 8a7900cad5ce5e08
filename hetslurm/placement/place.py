"""Where a request should run: the validated Python API over the placement kernels.

:func:`place` answers one request against a :class:`~hetslurm.placement.model.ClusterModel`
(nodes, per-node GPU/FPGA/core indices, the score and why it won, or why it cannot run and
whether it ever could); :func:`place_batch` places a queue in priority order, each placement
consuming what it gets. Requests are checked here once; the kernels trust them.

The score (docs/placement.md, "The score") is a weighted sum of named integer terms; the
weights are a :class:`ScoreWeights`: its defaults here, a site's ``[placement.weights]``
through :meth:`ScoreWeights.from_site`.
"""

from __future__ import annotations

import difflib
import functools
import operator
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

import hostlist
import numpy as np
import numpy.typing as npt

from hetslurm.errors import PlacementError
from hetslurm.placement.model import (
    I_BEST_LEAF,
    I_FITTING,
    I_LEVELS,
    I_NEXT_NODE,
    I_NEXT_SCORE,
    I_SWITCH,
    I_TOTAL,
    I_TOUCHED,
    MAX_NODE_CORES,
    MAX_NODE_DEVICES,
    N_INFO,
    N_T,
    N_W,
    PL_PLACED,
    PL_SWITCH,
    ST_FITS,
    STATUSES,
    TERMS,
    ClusterModel,
    KernelRequest,
)
from hetslurm.placement.slurm_pick import slurm_gpu_pick, spans_sockets
from hetslurm.request.language import Request

if TYPE_CHECKING:
    from hetslurm._core import PlacementCore
    from hetslurm.placement.state import LiveState
    from hetslurm.site.model import Site

#: Largest weight accepted. Terms are bounded (model rank < 2**16, islands/numa/leftover
#: < 2**8, load <= 1000, energy < 2**24 W, node weight < 2**32), so with every weight
#: <= 2**24 the total over 7 terms and the switch term stays below 2**63 per node and the sum
#: over nodes is checked in Python before the kernel runs (see _check_overflow). The site
#: schema bounds ``[placement.weights]`` by the same value (a test holds the two equal; the
#: schema is not imported here, so placement loads without pydantic).
MAX_SCORE_WEIGHT = 1 << 24
#: Counts at or above this are refused as malformed rather than "cannot place": they are
#: Slurm's NO_VAL/INFINITE sentinels (2**32 - 2, 2**64 - 1) leaking through, not requests.
SENTINEL_FLOOR = 1 << 31


@dataclass(frozen=True)
class ScoreWeights:
    """Weights of the score terms (all integers >= 0; lower total wins).

    The defaults make the terms act almost lexicographically in this order: model rank,
    islands, NUMA domains, best-fit leftover, node weight. ``load`` (spread over less-loaded
    nodes) and ``energy`` are off unless set; ``energy_low`` replaces ``energy`` for requests
    with ``energy=low`` and outweighs one step of model rank per ~100 W, so such a request
    goes to the model that draws less. ``switch`` weighs the switch levels spanned; fewest
    levels always wins first, so it only shifts the reported total.
    """

    model: int = 1_000_000
    islands: int = 100_000
    numa: int = 10_000
    leftover: int = 100
    load: int = 0
    energy: int = 0
    weight: int = 1
    energy_low: int = 10_000
    switch: int = 10_000_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise PlacementError(f"score weight {f.name} must be an integer, got {value!r}")
            if not 0 <= value <= MAX_SCORE_WEIGHT:
                raise PlacementError(
                    f"score weight {f.name} must be in 0..{MAX_SCORE_WEIGHT}, got {value}"
                )

    @classmethod
    def from_site(cls, site: Site) -> ScoreWeights:
        """The site's ``[placement.weights]``; keys it leaves unset keep the defaults."""
        section = site.sections.get("placement")
        if section is None:
            return _DEFAULT_WEIGHTS
        given = {k: v for k, v in section.weights.model_dump().items() if v is not None}
        return replace(_DEFAULT_WEIGHTS, **given) if given else _DEFAULT_WEIGHTS

    def to_dict(self) -> dict[str, int]:
        """Every weight by name (the ``weights`` object of ``place``/``explain`` JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def vector(self, *, energy_low: bool = False) -> tuple[int, ...]:
        """The kernel's weight vector: the seven term weights in TERMS order, then switch."""
        energy = self.energy_low if energy_low else self.energy
        out = (self.model, self.islands, self.numa, self.leftover, self.load, energy,
               self.weight, self.switch)
        assert len(out) == N_W
        return out


@dataclass(frozen=True)
class NodePlacement:
    """One node of a placement: node-local device and core indices, its score and terms."""

    name: str
    gpus: tuple[int, ...]
    fpgas: tuple[int, ...]
    cores: tuple[int, ...]
    score: int
    terms: Mapping[str, int]


@dataclass(frozen=True)
class Placement:
    """The answer to one request.

    Attributes:
        placeable: Whether it can start now.
        nodes: The chosen nodes, in cluster order (empty when not placeable).
        score: Total score (lower is better); None when not placeable.
        terms: Raw terms summed over the nodes, plus ``switch`` (levels spanned).
        weighted: Each term's contribution to ``score`` (weight x term).
        reason: One line: why these nodes won, or what blocks the request.
        impossible: Not placeable even on the empty cluster (every node up and idle).
        blocking: The constraint that blocks it (a name from ``STATUSES``, ``"nodes"`` when
            too few nodes fit, or ``"switch"``); None when placeable.
        fits_when_empty: Nodes that would each hold the per-node request on the empty
            cluster; None when placeable.
        earliest_start: Epoch seconds when running jobs will have freed enough (if nothing
            else starts first); None when placeable, impossible or unknown.
    """

    placeable: bool
    nodes: tuple[NodePlacement, ...] = ()
    score: int | None = None
    terms: Mapping[str, int] = field(default_factory=dict)
    weighted: Mapping[str, int] = field(default_factory=dict)
    reason: str = ""
    impossible: bool = False
    blocking: str | None = None
    fits_when_empty: int | None = None
    earliest_start: float | None = None

    @property
    def nodelist(self) -> str:
        """The chosen nodes in Slurm hostlist form (``gpu[1-2]``); empty when none."""
        return str(hostlist.collect_hostlist([n.name for n in self.nodes])) if self.nodes else ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form the CLI prints (``placeable``, ``nodelist``, ``nodes``, ``score``,
        ``reason``, ...)."""
        return {
            "placeable": self.placeable,
            "nodelist": self.nodelist,
            "nodes": {
                n.name: {"gpus": list(n.gpus), "fpgas": list(n.fpgas), "cores": list(n.cores),
                         "score": n.score, "terms": dict(n.terms)}
                for n in self.nodes
            },
            "score": self.score,
            "terms": dict(self.terms),
            "weighted": dict(self.weighted),
            "reason": self.reason,
            "impossible": self.impossible,
            "blocking": self.blocking,
            "fits_when_empty": self.fits_when_empty,
            "earliest_start": self.earliest_start,
        }


@dataclass(frozen=True, eq=False)
class NodeEvaluation:
    """Every node evaluated for one request (index bypassed), for explanations.

    Attributes:
        status: shape (N,), int8; 0 = fits, else the index in ``STATUSES`` of the first
            constraint that fails.
        terms: shape (N, N_T), int64; valid where status is 0.
        scores: shape (N,), int64; node score where it fits, -1 elsewhere.
    """

    status: npt.NDArray[np.int8]
    terms: npt.NDArray[np.int64]
    scores: npt.NDArray[np.int64]

    def blocking(self, among: npt.NDArray[np.bool_] | None = None) -> str:
        """The furthest constraint nodes got to before failing (name from STATUSES)."""
        st = self.status if among is None else self.status[among]
        st = st[st != ST_FITS]
        return STATUSES[int(st.max())] if st.size else "nodes"


#: Built once: constructing ScoreWeights validates every field (a few microseconds).
_DEFAULT_WEIGHTS = ScoreWeights()


@functools.lru_cache(maxsize=64)
def _weight_vector(w: ScoreWeights, energy_low: bool) -> tuple[int, ...]:
    return w.vector(energy_low=energy_low)


# --- validation -------------------------------------------------------------------------------


def _count(name: str, value: object, *, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise PlacementError(f"{name} must be an integer, got {value!r}")
    v = operator.index(value)
    if v < low:
        raise PlacementError(f"{name} must be >= {low}, got {v}")
    if v >= SENTINEL_FLOOR:
        raise PlacementError(
            f"{name}={v} is not a count (Slurm's NO_VAL/INFINITE sentinels are 2**32-2, "
            f"2**32-1 and 2**64-1); give a number below {SENTINEL_FLOOR}"
        )
    return v


def _ranks(
    kind: str, wanted: Sequence[str], known: tuple[str, ...], needed: bool
) -> tuple[int, ...]:
    if not wanted or not needed:
        # No list: any model, ranked in the site's preference order, as Slurm's weights do.
        return tuple(range(len(known)))
    rank = [-1] * len(known)
    for r, m in enumerate(wanted):
        if m not in known:
            close = difflib.get_close_matches(m, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            have = ", ".join(known) or "none"
            raise PlacementError(f"unknown {kind} model '{m}' (this cluster has {have}){hint}")
        i = known.index(m)
        if rank[i] < 0:
            rank[i] = r
    return tuple(rank)


def compile_request(
    model: ClusterModel, request: Request, weights: ScoreWeights | None = None
) -> KernelRequest:
    """Check ``request`` against ``model`` and translate it to the kernel's integers.

    Raises:
        PlacementError: A count is not an integer, is negative or a Slurm sentinel; a model
            is unknown; ``gpus_per_job`` does not split evenly; nothing is asked for.
    """
    # The answer depends on the request, the weights and three fields of the model only, so
    # a repeated request (the common case: a scheduler sees the same shapes over and over) is
    # answered from a bounded cache. The field types are part of the key, so ``True`` or
    # ``1.0`` never hit an entry made for ``1`` (they must raise). Errors are not cached.
    try:
        key = (request, tuple(map(type, vars(request).values())), weights, model.gpu_models,
               model.fpga_models, model.def_mem_per_cpu_mib)
        kr = _COMPILED.get(key)
    except TypeError:  # an unhashable field (a list where a tuple was expected)
        return _compile(model, request, weights)
    if kr is None:
        kr = _compile(model, request, weights)
        if len(_COMPILED) >= _COMPILED_MAX:
            _COMPILED.clear()
        _COMPILED[key] = kr
    return kr


#: compile_request's cache (see there); cleared whole when full.
_COMPILED: dict[tuple[Any, ...], KernelRequest] = {}
_COMPILED_MAX = 4096


def _compile(
    model: ClusterModel, request: Request, weights: ScoreWeights | None
) -> KernelRequest:
    w = weights or _DEFAULT_WEIGHTS
    nodes = _count("nodes", request.nodes, low=1)
    if request.gpus_per_job is not None:
        per_job = _count("gpus_per_job", request.gpus_per_job)
        if per_job % nodes:
            raise PlacementError(f"gpus_per_job={per_job} does not split evenly over {nodes} nodes")
        gpus = per_job // nodes
    else:
        gpus = _count("gpus_per_node", request.gpus_per_node)
    fpgas = _count("fpgas_per_node", request.fpgas_per_node)
    cores = _count("cores_per_node", request.cores_per_node, low=1)
    if request.mem_per_node_mib is not None:
        mem = _count("mem_per_node_mib", request.mem_per_node_mib)
    elif model.def_mem_per_cpu_mib:
        # Slurm's DefMemPerCPU applies when a job names no memory.
        mem = min(cores * model.def_mem_per_cpu_mib, SENTINEL_FLOOR - 1)
    else:
        mem = 0
    min_mem = _count("min_gpu_mem_mib", request.min_gpu_mem_mib or 0)
    loc = request.locality
    return KernelRequest(
        nodes=nodes,
        gpus=gpus,
        fpgas=fpgas,
        cores=cores,
        mem_mib=mem,
        min_gpu_mem_mib=min_mem,
        nvlink=loc.nvlink == "required",
        numa=loc.numa == "required",
        switch=loc.switch == "required",
        cpu_only=bool(request.cpu_only),
        gpu_rank=_ranks("GPU", request.gpu_models, model.gpu_models, gpus > 0),
        fpga_rank=_ranks("FPGA", request.fpga_models, model.fpga_models, fpgas > 0),
        weights=_weight_vector(w, request.energy == "low"),
    )


def _kernel_sized(model: ClusterModel, kr: KernelRequest) -> bool:
    """Whether the request is small enough for the kernel's output buffers.

    A request for more nodes than exist, or more devices or cores than any node has, cannot
    fit anywhere; it is answered without allocating k x per-node outputs.
    """
    n = model.n_nodes
    gpus, fpgas, cores = model.largest()
    return (
        n > 0
        and kr.nodes <= n
        and kr.gpus <= min(MAX_NODE_DEVICES, gpus)
        and kr.fpgas <= min(MAX_NODE_DEVICES, fpgas)
        and kr.cores <= min(MAX_NODE_CORES, cores)
    )


# --- kernels ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _arrays(kr: KernelRequest) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int64]
]:
    """The kernel's input vectors of ``kr`` (read-only: they are cached per request)."""
    out = (
        kr.vector(),
        np.asarray(kr.gpu_rank, dtype=np.int32).reshape(-1),
        np.asarray(kr.fpga_rank, dtype=np.int32).reshape(-1),
        np.asarray(kr.weights, dtype=np.int64),
    )
    for a in out:
        a.flags.writeable = False
    return out


def evaluate_nodes(
    model: ClusterModel, request: Request | KernelRequest, weights: ScoreWeights | None = None
) -> NodeEvaluation:
    """Evaluate every node for ``request`` (whether it fits, its terms and score).

    Raises:
        PlacementError: The request is malformed (see :func:`compile_request`).
    """
    kr = request if isinstance(request, KernelRequest) else compile_request(model, request,
                                                                            weights)
    return _evaluate(model.core(), model.n_nodes, kr)


def static_fit(
    model: ClusterModel, request: Request | KernelRequest, weights: ScoreWeights | None = None,
    *, core: PlacementCore | None = None,
) -> npt.NDArray[np.int8]:
    """Which nodes could ever hold one share of ``request``, whatever is free: per node
    ``ST_FITS`` (0), or the first constraint no free state changes (codes as
    :data:`~hetslurm.placement.model.STATUSES`: unavailable, cpu_only, gpu_model, gpu_count,
    gpu_mem, fpga_model, fpga_count). A node that fails it fails :func:`evaluate_nodes` on
    every state.

    Args:
        core: a core of ``model``'s arrays to ask instead of ``model.core()`` (its
            availability counts, e.g. a partition's mask; its free state does not).

    Raises:
        PlacementError: The request is malformed (see :func:`compile_request`).
    """
    kr = request if isinstance(request, KernelRequest) else compile_request(model, request,
                                                                            weights)
    req, mrank, frank, _ = _arrays(kr)
    status = np.zeros(model.n_nodes, dtype=np.int8)
    (model.core() if core is None else core).static_fit(req, mrank, frank, status)
    return status


def _evaluate(core: PlacementCore, n: int, kr: KernelRequest) -> NodeEvaluation:
    status = np.zeros(n, dtype=np.int8)
    terms = np.zeros(max(n * N_T, 1), dtype=np.int64)
    scores = np.zeros(n, dtype=np.int64)
    core.evaluate(*_arrays(kr), status, terms, scores)
    return NodeEvaluation(status, terms[: n * N_T].reshape(n, N_T), scores)


@dataclass(frozen=True)
class _Raw:
    status: int
    info: tuple[int, ...]
    nodes: tuple[int, ...] = ()
    gpus: tuple[tuple[int, ...], ...] = ()
    fpgas: tuple[tuple[int, ...], ...] = ()
    cores: tuple[tuple[int, ...], ...] = ()
    terms: tuple[tuple[int, ...], ...] = ()


#: Output buffers of _run, per thread, reused while a request fits in them (the kernel writes
#: every entry _unpack reads when it places, and _unpack copies them out).
_SCRATCH = threading.local()
#: Requests needing more int32 entries than this get buffers of their own, not kept.
_SCRATCH_MAX = 1 << 16


def _buffers(k: int, kr: KernelRequest) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32],
                                                 npt.NDArray[np.int32], npt.NDArray[np.int32],
                                                 npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    size = max(k * max(kr.gpus, kr.fpgas, kr.cores, N_T), 1)
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is not None and size <= len(bufs[0]):
        return bufs  # type: ignore[no-any-return]
    fresh = size if size > _SCRATCH_MAX else max(size, 256)
    new = (
        np.full(fresh, -1, dtype=np.int32), np.full(fresh, -1, dtype=np.int32),
        np.full(fresh, -1, dtype=np.int32), np.full(fresh, -1, dtype=np.int32),
        np.zeros(fresh, dtype=np.int64), np.zeros(N_INFO, dtype=np.int64),
    )
    if size <= _SCRATCH_MAX:
        _SCRATCH.bufs = new
    return new


def _run(core: PlacementCore, kr: KernelRequest, commit: bool = False) -> _Raw:
    nodes, gpus, fpgas, cores, terms, info = _buffers(kr.nodes, kr)
    status = int(core.place(*_arrays(kr), commit, nodes, gpus, fpgas, cores, terms, info))
    if status != PL_PLACED:
        return _Raw(status, tuple(info.tolist()))
    return _unpack(status, info, nodes, gpus, fpgas, cores, terms, kr)


def _unpack(status: int, info: npt.NDArray[np.int64], nodes: npt.NDArray[np.int32],
            gpus: npt.NDArray[np.int32], fpgas: npt.NDArray[np.int32],
            cores: npt.NDArray[np.int32], terms: npt.NDArray[np.int64],
            kr: KernelRequest) -> _Raw:
    k = kr.nodes

    def rows(flat: npt.NDArray[Any], width: int) -> tuple[tuple[int, ...], ...]:
        if width == 0:
            return ((),) * k
        values = flat[: k * width].tolist()
        if k == 1:
            return (tuple(values),)
        return tuple(tuple(values[r * width:(r + 1) * width]) for r in range(k))

    return _Raw(
        status,
        tuple(info.tolist()),
        tuple(nodes[:k].tolist()),
        rows(gpus, kr.gpus),
        rows(fpgas, kr.fpgas),
        rows(cores, kr.cores),
        rows(terms, N_T),
    )


# --- results ----------------------------------------------------------------------------------


def _placed(model: ClusterModel, kr: KernelRequest, raw: _Raw) -> Placement:
    w = kr.weights
    names = model.names
    nodes = tuple(
        NodePlacement(
            name=names[i], gpus=raw.gpus[r], fpgas=raw.fpgas[r], cores=raw.cores[r],
            score=sum(map(operator.mul, t, w)), terms=dict(zip(TERMS, t, strict=True)),
        )
        for r, (i, t) in enumerate(zip(raw.nodes, raw.terms, strict=True))
    )
    levels = raw.info[I_LEVELS]
    sums = dict(zip(TERMS, map(sum, zip(*raw.terms, strict=True)), strict=True))
    sums["switch"] = levels
    weighted = {name: sums[name] * w[j] for j, name in enumerate(TERMS)}
    weighted["switch"] = levels * w[N_T]
    score = raw.info[I_TOTAL]
    return Placement(
        placeable=True, nodes=nodes, score=score, terms=sums, weighted=weighted,
        reason=_why(model, kr, raw, nodes, score),
    )


def _models(kr: KernelRequest, known: tuple[str, ...], rank: tuple[int, ...]) -> str:
    allowed = sorted((r, m) for m, r in zip(known, rank, strict=True) if r >= 0)
    return "|".join(m for _, m in allowed) if len(allowed) < len(known) else ""


def _why(model: ClusterModel, kr: KernelRequest, raw: _Raw, placed: tuple[NodePlacement, ...],
         score: int) -> str:
    parts = []
    for node, i in zip(placed, raw.nodes, strict=True):
        bits = []
        if node.gpus:
            gm = model.gpu_models[int(model.gpu_model[i])]
            isl = node.terms["islands"] + 1
            bits.append(f"{len(node.gpus)} {gm} GPU(s) {list(node.gpus)} in {isl} NVLink "
                        f"island{'s' if isl > 1 else ''}")
        if node.fpgas:
            bits.append(f"FPGA(s) {list(node.fpgas)}")
        dom = node.terms["numa"] + 1
        bits.append(f"{len(node.cores)} core(s) on {dom} NUMA domain{'s' if dom > 1 else ''}")
        bits.append(f"{node.terms['leftover']} device(s) left free")
        parts.append(f"{node.name}: " + ", ".join(bits))
    levels = raw.info[I_LEVELS]
    where = ("one leaf switch" if levels == 0 else f"{levels} switch level(s) up") \
        if kr.nodes > 1 else ""
    # Single-node searches stop once nothing left can win, so "examined" is not "all".
    head = (f"lowest score {score}; {raw.info[I_TOUCHED]} candidate node(s) examined, "
            f"{raw.info[I_FITTING]} fit")
    if where:
        sw = model.switch_names[raw.info[I_SWITCH]]
        head += f"; {kr.nodes} nodes under {where}" + (f" ({sw})" if sw else "")
    if raw.info[I_NEXT_NODE] >= 0:
        head += (f"; next best {model.names[raw.info[I_NEXT_NODE]]} scored "
                 f"{raw.info[I_NEXT_SCORE]}")
    return head + "; " + "; ".join(parts)


def _constraint(code: str, kr: KernelRequest, model: ClusterModel, free: bool) -> str:
    gm = _models(kr, model.gpu_models, kr.gpu_rank)
    fm = _models(kr, model.fpga_models, kr.fpga_rank)
    g = f"{kr.gpus} {'free ' if free else ''}{gm + ' ' if gm else ''}GPUs"
    f = f"{kr.fpgas} {'free ' if free else ''}{fm + ' ' if fm else ''}FPGAs"
    text = {
        "unavailable": "every node that could hold it is drained, down or reserved",
        "cpu_only": "it may run only on CPU-only nodes",
        "gpu_model": f"no node has {gm or 'any'} GPUs",
        "gpu_count": f"no node has {kr.gpus} {gm + ' ' if gm else ''}GPUs",
        "gpu_mem": f"no node has {kr.gpus} {gm + ' ' if gm else ''}GPUs with >= "
                   f"{kr.min_gpu_mem_mib} MiB each",
        "gpu_free": f"no node has {g}",
        "nvlink": f"no node has {g} in one NVLink island (nvlink=required)",
        "fpga_model": f"no node has {fm or 'any'} FPGAs",
        "fpga_count": f"no node has {kr.fpgas} {fm + ' ' if fm else ''}FPGAs",
        "fpga_free": f"no node has {f}",
        "cores": f"no node has {kr.cores} {'free ' if free else ''}cores next to them",
        "numa": f"no node has its devices and {kr.cores} cores in one NUMA domain "
                "(numa=required)",
        "memory": f"no node has {kr.mem_mib} MiB {'free ' if free else ''}memory next to them",
    }
    return text.get(code, "no node fits")


def _impossible(model: ClusterModel, kr: KernelRequest) -> tuple[Placement | None, int]:
    """The "impossible" answer when the request fits nowhere even empty, and the number of
    nodes that would each hold the per-node request on the empty cluster."""
    verdict, fit_empty, _ = _when_empty(model, kr)
    return verdict, fit_empty


#: Requests whose empty-cluster answer one empty model keeps (cleared whole when full).
_EMPTY_CACHE_MAX = 1024


def _when_empty(
    model: ClusterModel, kr: KernelRequest
) -> tuple[Placement | None, int, npt.NDArray[np.bool_] | None]:
    """_impossible's answer, plus which nodes would each fit on the empty cluster.

    The empty cluster depends on the model's static arrays only, so the answer is kept per
    request in the (cached) empty model: a busy queue asks the same shapes over and over.
    """
    if model.n_nodes == 0:
        return _impossible_uncached(model, kr)
    cache = model.empty()._cache.setdefault("when_empty", {})
    hit: tuple[Placement | None, int, npt.NDArray[np.bool_] | None] | None = cache.get(kr)
    if hit is None:
        hit = _impossible_uncached(model, kr)
        if len(cache) >= _EMPTY_CACHE_MAX:
            cache.clear()
        cache[kr] = hit
    return hit


def _impossible_uncached(
    model: ClusterModel, kr: KernelRequest
) -> tuple[Placement | None, int, npt.NDArray[np.bool_] | None]:
    k = kr.nodes
    if model.n_nodes == 0:
        return Placement(False, reason="impossible: the cluster has no nodes", impossible=True,
                         blocking="nodes", fits_when_empty=0), 0, None
    empty = model.empty()
    when_empty = _evaluate(empty.core(), model.n_nodes, kr)
    could = when_empty.status == ST_FITS
    could.flags.writeable = False
    fit_empty = int((when_empty.status == ST_FITS).sum())
    if k > model.n_nodes:
        return Placement(False, reason=f"impossible: {k} nodes requested, the cluster has "
                         f"{model.n_nodes}", impossible=True, blocking="nodes",
                         fits_when_empty=fit_empty), fit_empty, could
    if fit_empty < k:
        code = when_empty.blocking() if fit_empty == 0 else "nodes"
        why = (_constraint(when_empty.blocking(), kr, model, free=False) if fit_empty == 0
               else f"only {fit_empty} node(s) can hold the per-node request, {k} needed; the "
               f"others: {_constraint(when_empty.blocking(), kr, model, free=False)}")
        return Placement(False, reason=f"impossible on this cluster: {why}", impossible=True,
                         blocking=code, fits_when_empty=fit_empty), fit_empty, could
    empty_raw = _run(empty.core(), kr)
    if empty_raw.status == PL_SWITCH:
        return Placement(
            False, impossible=True, blocking="switch", fits_when_empty=fit_empty,
            reason=f"impossible on this cluster: no leaf switch holds {k} nodes that fit "
            f"(best leaf holds {empty_raw.info[I_BEST_LEAF]}; switch=required)",
        ), fit_empty, could
    return None, fit_empty, could


def _unplaced(
    model: ClusterModel, kr: KernelRequest, raw: _Raw | None, live: LiveState | None
) -> Placement:
    verdict, fit_empty, could = _when_empty(model, kr)
    if verdict is not None:
        return verdict
    assert could is not None
    k = kr.nodes
    now = _evaluate(model.core(), model.n_nodes, kr)
    fit_now = now.status == ST_FITS
    if raw is not None and raw.status == PL_SWITCH:
        code = "switch"
        why = (f"no leaf switch has {k} nodes that fit now (best leaf has "
               f"{raw.info[I_BEST_LEAF]}; switch=required)")
    elif int(fit_now.sum()) > 0:
        code = "nodes"
        why = (f"only {int(fit_now.sum())} node(s) fit now, {k} needed; the others: "
               f"{_constraint(now.blocking(could & ~fit_now), kr, model, free=True)}")
    else:
        code = now.blocking(could)
        why = _constraint(code, kr, model, free=True)
    start = _earliest_start(model, kr, live)
    tail = f"; {fit_empty} node(s) would fit when empty"
    if start is not None:
        tail += f"; earliest start {start:.0f} (epoch s) as running jobs end"
    return Placement(False, reason=f"busy now: {why}{tail}", blocking=code,
                     fits_when_empty=fit_empty, earliest_start=start)


def _earliest_start(model: ClusterModel, kr: KernelRequest, live: LiveState | None) -> float | None:
    """First job end time after which the request fits, by binary search over end times.

    Fitting is monotone in time when nothing new starts (jobs only release resources), so
    log2(jobs) placements answer it.
    """
    if live is None:
        return None
    times = live.end_times()
    lo, hi, found = 0, len(times) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        later = model.with_state(live.at(times[mid]))
        if _run(later.core(), kr).status == PL_PLACED:
            found, hi = times[mid], mid - 1
        else:
            lo = mid + 1
    return found


# --- public API -------------------------------------------------------------------------------


def place(
    model: ClusterModel,
    request: Request,
    weights: ScoreWeights | None = None,
    *,
    live: LiveState | None = None,
) -> Placement:
    """Place one request on the cluster as ``model``'s state has it.

    Args:
        model: The cluster, with live state applied (:meth:`ClusterModel.with_state`) or
            empty.
        request: What the job needs.
        weights: Score weights; default :class:`ScoreWeights()`.
        live: The live state ``model`` was built from, to estimate when a busy request could
            start; default: the one ``with_state`` recorded, if any.

    Returns:
        The placement, or why there is none (impossible vs busy, the blocking constraint,
        the earliest start when known).

    Raises:
        PlacementError: The request is malformed (counts, sentinels, unknown models).
        CoreNotBuiltError: The compiled core is missing.
    """
    if len(request.partitions) > 1 and model.partitions:
        return _place_ranked(model, request, weights, live)
    scope = request.partitions[0] if request.partitions else request.partition
    return _place_in(model.in_partition(scope), request, weights, live)


def _place_in(model: ClusterModel, request: Request, weights: ScoreWeights | None,
              live: LiveState | None) -> Placement:
    kr = compile_request(model, request, weights)
    if live is None:
        live = model._cache.get("live")
    if not _kernel_sized(model, kr):
        return _unplaced(model, kr, None, live)
    raw = _run(model.core(), kr)
    if raw.status == PL_PLACED:
        return _as_slurm_picks(model, _placed(model, kr, raw))
    return _unplaced(model, kr, raw, live)


def _place_ranked(model: ClusterModel, request: Request, weights: ScoreWeights | None,
                  live: LiveState | None) -> Placement:
    """Ranked fallback (docs/fallback.md): Slurm tries a job's partitions in its ``-p`` order
    (equal ``PriorityTier``) and starts it in the first one where it fits now; when none
    fits, the job waits in all of them and takes whichever frees first."""
    answers = []
    for i, part in enumerate(request.partitions):
        got = _place_in(model.in_partition(part), request, weights, live)
        answers.append(got)
        if got.placeable:
            if i == 0:
                return replace(got, reason=f"{got.reason}; partition {part}: the first of "
                               f"{','.join(request.partitions)}")
            skipped = ", ".join(request.partitions[:i])
            return replace(got, reason=f"{got.reason}; partition {part}: {skipped} "
                           "cannot start it now, so Slurm falls back at once")
    possible = [a for a in answers if not a.impossible]
    if not possible:
        return answers[0]
    # The one whose running jobs free it first (unknown end times last).
    best = min(possible, key=lambda a: (a.earliest_start is None, a.earliest_start or 0.0))
    return replace(best, reason=f"{best.reason}; waits in {','.join(request.partitions)} and "
                   "takes whichever frees first")


def _as_slurm_picks(model: ClusterModel, placed: Placement) -> Placement:
    """A one-node GPU placement whose cores span sockets, with the GPUs Slurm will take
    there instead of the kernel's (:mod:`hetslurm.placement.slurm_pick`)."""
    if len(placed.nodes) != 1 or not placed.nodes[0].gpus:
        return placed
    node = placed.nodes[0]
    i = model.node_index(node.name)
    if not spans_sockets(model, i, node.cores):
        return placed
    gpus = slurm_gpu_pick(model, i, node.cores, len(node.gpus))
    if len(gpus) != len(node.gpus) or gpus == node.gpus:
        return placed
    ga = int(model.gpu_offsets[i])
    isl = len({int(model.gpu_island[ga + g]) for g in gpus})
    why = (f"; Slurm will take GPU(s) {list(gpus)} ({isl} NVLink island"
           f"{'s' if isl > 1 else ''}) instead of {list(node.gpus)}: the cores span sockets")
    return replace(placed, nodes=(replace(node, gpus=gpus),), reason=placed.reason + why)


def place_batch(
    model: ClusterModel, requests: Sequence[Request], weights: ScoreWeights | None = None
) -> list[Placement]:
    """Place requests in the given (priority) order, each consuming what it gets.

    ``model`` itself is not changed. An unplaced request is marked impossible (never fits on
    the empty cluster) or busy (resources held by running jobs or earlier requests).

    Raises:
        PlacementError: A request is malformed; the message names its position.
    """
    parts = {req.partition or model.default_partition for req in requests}
    if len(parts) > 1:
        raise PlacementError("place_batch: the requests go to different partitions ("
                             + ", ".join(sorted(str(p) for p in parts))
                             + "); place each partition's queue on its own")
    if parts:
        model = model.in_partition(parts.pop())
    compiled: list[KernelRequest] = []
    for r, req in enumerate(requests):
        try:
            compiled.append(compile_request(model, req, weights))
        except PlacementError as e:
            raise PlacementError(f"request {r}: {e}") from e
    run = [r for r, kr in enumerate(compiled) if _kernel_sized(model, kr)]
    results: list[Placement | None] = [None] * len(compiled)
    if run:
        _batch_kernel(model, [compiled[r] for r in run], run, results)
    verdicts: dict[KernelRequest, Placement] = {}
    for r, kr in enumerate(compiled):
        if results[r] is None:
            if kr not in verdicts:
                verdicts[kr] = _batch_verdict(model, kr)
            results[r] = verdicts[kr]
    return [p for p in results if p is not None]


def _batch_kernel(model: ClusterModel, krs: list[KernelRequest], where: list[int],
                  results: list[Placement | None]) -> None:
    n_req = len(krs)
    m, mf = len(model.gpu_models), len(model.fpga_models)
    reqs = np.stack([kr.vector() for kr in krs])
    mranks = np.asarray([kr.gpu_rank for kr in krs], dtype=np.int32).reshape(n_req, m)
    franks = np.asarray([kr.fpga_rank for kr in krs], dtype=np.int32).reshape(n_req, mf)
    ws = np.asarray([kr.weights for kr in krs], dtype=np.int64).reshape(n_req, N_W)
    k = reqs[:, 5]

    def offsets(per: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        out = np.zeros(n_req + 1, dtype=np.int64)
        np.cumsum(per, out=out[1:])
        return out

    node_off = offsets(k)
    gpu_off, fpga_off = offsets(k * reqs[:, 0]), offsets(k * reqs[:, 1])
    core_off = offsets(k * reqs[:, 2])

    def buf(size: int) -> npt.NDArray[np.int32]:
        return np.full(max(size, 1), -1, dtype=np.int32)

    nodes, gpus = buf(int(node_off[-1])), buf(int(gpu_off[-1]))
    fpgas, cores = buf(int(fpga_off[-1])), buf(int(core_off[-1]))
    terms = np.zeros(max(int(node_off[-1]) * N_T, 1), dtype=np.int64)
    status = np.zeros(n_req, dtype=np.int8)
    info = np.zeros((n_req, N_INFO), dtype=np.int64)
    model.new_core().place_batch(reqs, mranks, franks, ws, node_off, gpu_off, fpga_off,
                                 core_off, nodes, gpus, fpgas, cores, terms, status, info)
    for j, kr in enumerate(krs):
        if status[j] != PL_PLACED:
            continue
        raw = _unpack(
            PL_PLACED, info[j], nodes[node_off[j]:], gpus[gpu_off[j]:], fpgas[fpga_off[j]:],
            cores[core_off[j]:], terms[node_off[j] * N_T:], kr,
        )
        results[where[j]] = _placed(model, kr, raw)


def _batch_verdict(model: ClusterModel, kr: KernelRequest) -> Placement:
    """Why a batch request was not placed: impossible (empty cluster) or busy at its turn."""
    verdict, fit_empty = _impossible(model, kr)
    if verdict is not None:
        return verdict
    return Placement(False, blocking="busy", fits_when_empty=fit_empty,
                     reason="busy at its turn: running jobs and earlier requests hold what "
                     f"it needs; {fit_empty} node(s) would fit when empty")
