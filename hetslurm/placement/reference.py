"""Plain-Python specification of the in-node GPU choice, and a brute-force oracle.

This module is the executable definition of the policy the compiled kernel
(``hetslurm._core.choose_gpus``) implements. A selection of ``n`` free GPUs is scored by three
terms, compared in this order (lower is better):

* ``islands``: NVLink islands the selection spans;
* ``leftover``: free GPUs of those islands left unchosen (sum of their free counts minus
  ``n``): best fit, so a request does not break a whole free island when a partly used
  one fits;
* ``numa``: NUMA domains the selection spans.

They pack into one integer, ``islands << 40 | leftover << 20 | numa``, that orders like the
tuple. Among selections with the lowest score the one whose sorted index tuple is
lexicographically smallest wins. ``NO_FIT`` (-1) means fewer than ``n`` GPUs are free.

:func:`choose_gpus_reference` follows the kernel's algorithm step by step, so a disagreement
points at a line; :func:`choose_gpus_bruteforce` scores every subset and shares nothing with
either but :func:`score_selection`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import TYPE_CHECKING

from hetslurm.errors import PlacementError

if TYPE_CHECKING:
    # Type-only: model.py imports numpy, and this module must stay importable without the
    # compiled core (tests/unit/test_core_import.py).
    from hetslurm.placement.model import ClusterModel, KernelRequest

#: Score of a node that cannot hold the request.
NO_FIT = -1
ISLAND_SHIFT = 40
LEFTOVER_SHIFT = 20
#: Width of the leftover and numa fields; each term must stay below ``1 << TERM_BITS``.
TERM_BITS = 20
_TERM_MASK = (1 << TERM_BITS) - 1

#: The brute force enumerates C(free, n) subsets; beyond this many GPUs it is too slow to use.
BRUTEFORCE_MAX_GPUS = 16

Selection = tuple[tuple[int, ...], int]
"""Chosen node-local indices (ascending; empty on no fit) and the packed score."""


def pack_score(islands: int, leftover: int, numa: int) -> int:
    """Pack the three score terms into the integer the kernel returns.

    Raises:
        PlacementError: A term is negative or too wide for its field.
    """
    if not (0 <= islands < 1 << (63 - ISLAND_SHIFT)):
        raise PlacementError(f"islands term {islands} out of range")
    for name, value in (("leftover", leftover), ("numa", numa)):
        if not 0 <= value <= _TERM_MASK:
            raise PlacementError(f"{name} term {value} out of range [0, {_TERM_MASK}]")
    return islands << ISLAND_SHIFT | leftover << LEFTOVER_SHIFT | numa


def unpack_score(score: int) -> dict[str, int]:
    """Split a packed score into ``{"islands", "leftover", "numa"}``; ``{}`` for ``NO_FIT``."""
    if score < 0:
        return {}
    return {
        "islands": score >> ISLAND_SHIFT,
        "leftover": (score >> LEFTOVER_SHIFT) & _TERM_MASK,
        "numa": score & _TERM_MASK,
    }


def score_selection(
    free: Sequence[int], island: Sequence[int], numa: Sequence[int], chosen: Sequence[int]
) -> int:
    """The packed score of choosing exactly the GPUs ``chosen`` (all must be free)."""
    spanned = {island[j] for j in chosen}
    island_free = sum(1 for j in range(len(free)) if free[j] and island[j] in spanned)
    return pack_score(len(spanned), island_free - len(chosen), len({numa[j] for j in chosen}))


def choose_gpus_bruteforce(
    free: Sequence[int], island: Sequence[int], numa: Sequence[int], n: int
) -> Selection:
    """Score every n-subset of the free GPUs and keep the best (small nodes only).

    Raises:
        PlacementError: The node has more than ``BRUTEFORCE_MAX_GPUS`` GPUs.
    """
    if len(free) > BRUTEFORCE_MAX_GPUS:
        raise PlacementError(
            f"brute force is for nodes of <= {BRUTEFORCE_MAX_GPUS} GPUs, got {len(free)}"
        )
    candidates = [j for j in range(len(free)) if free[j]]
    if n <= 0 or len(candidates) < n:
        return (), NO_FIT
    best: Selection = ((), NO_FIT)
    # combinations() yields in lexicographic order, so keeping only strict improvements keeps
    # the lowest-index selection among equal scores.
    for subset in combinations(candidates, n):
        score = score_selection(free, island, numa, subset)
        if best[1] == NO_FIT or score < best[1]:
            best = (subset, score)
    return best


def _min_cover(counts: Sequence[int], n: int) -> int:
    """Fewest of ``counts`` whose sum reaches ``n`` (largest first)."""
    covered = 0
    for used, count in enumerate(sorted(counts, reverse=True), start=1):
        covered += count
        if covered >= n:
            return used
    return len(counts)


def _knapsack(
    islands: Sequence[tuple[int, int, bool]], k: int, cap: int
) -> dict[tuple[int, int], int]:
    """Best weight of island sets by (size, free total), over sets containing every forced one.

    Args:
        islands: (free count, weight, forced) per island.
        k: Largest set size kept.
        cap: Largest free total kept.

    Returns:
        ``{(size, total): largest weight}`` for every reachable size <= k and total <= cap.
    """
    table = {(0, 0): 0}
    for free_count, weight, forced in islands:
        grown: dict[tuple[int, int], int] = {} if forced else dict(table)
        for (size, total), value in table.items():
            key = (size + 1, total + free_count)
            if size < k and key[1] <= cap and grown.get(key, -1) < value + weight:
                grown[key] = value + weight
        table = grown
    return table


def _feasible(
    gpus: Sequence[tuple[int, int, int]],
    taken: set[int],
    skipped: set[int],
    island_free: dict[int, int],
    n: int,
    k: int,
    total: int,
    m: int,
) -> bool:
    """Whether some selection scoring (k, total - n, m) contains ``taken`` and avoids ``skipped``.

    Args:
        gpus: (index, island, numa) of every free GPU.
        taken: Indices the selection must contain.
        skipped: Indices it must avoid.
        island_free: Free GPUs per island id.
        n: GPUs wanted.
        k: Islands the selection must span.
        total: Free count of those islands together.
        m: NUMA domains it must span.
    """
    usable = [(j, isl, dom) for j, isl, dom in gpus if j not in skipped]
    forced_islands = {isl for j, isl, _ in usable if j in taken}
    forced_numa = {dom for j, _, dom in usable if j in taken}
    if len(forced_islands) > k or len(forced_numa) > m:
        return False
    # A NUMA domain with no usable GPU cannot be spanned, so it is never worth choosing.
    others = sorted({dom for _, _, dom in usable} - forced_numa)
    for extra in combinations(others, m - len(forced_numa)):
        domains = forced_numa | set(extra)
        inside = Counter(isl for _, isl, dom in usable if dom in domains)
        if sum(inside.values()) < n:
            continue
        table = _knapsack(
            [(count, inside[isl], isl in forced_islands) for isl, count in island_free.items()],
            k,
            total,
        )
        if table.get((k, total), -1) >= n:
            return True
    return False


def choose_gpus_reference(
    free: Sequence[int], island: Sequence[int], numa: Sequence[int], n: int
) -> Selection:
    """Choose ``n`` GPUs by the module's policy with the kernel's algorithm, in plain Python.

    Args:
        free: Per GPU, nonzero when free.
        island: Per GPU, its NVLink island id.
        numa: Per GPU, its NUMA domain id.
        n: GPUs wanted.

    Returns:
        The chosen indices (ascending) and the packed score, or ``((), NO_FIT)``.
    """
    gpus = [(j, island[j], numa[j]) for j in range(len(free)) if free[j]]
    if n <= 0 or len(gpus) < n:
        return (), NO_FIT
    island_free = dict(Counter(isl for _, isl, _ in gpus))
    k = _min_cover(list(island_free.values()), n)
    # Any n GPUs drawn from k islands span all k of them (fewer could not hold n), so the
    # best fit is the smallest free total of exactly k islands that reaches n.
    reachable = _knapsack([(c, 0, False) for c in island_free.values()], k, len(gpus))
    total = min(t for size, t in reachable if size == k and t >= n)
    m = _min_cover(list(Counter(dom for _, _, dom in gpus).values()), n)
    while not _feasible(gpus, set(), set(), island_free, n, k, total, m):
        m += 1
    taken: set[int] = set()
    skipped: set[int] = set()
    for j, _, _ in gpus:
        if len(taken) == n:
            break
        if _feasible(gpus, taken | {j}, skipped, island_free, n, k, total, m):
            taken.add(j)
        else:
            skipped.add(j)
    return tuple(sorted(taken)), pack_score(k, total - n, m)


# ==============================================================================================
# Node-level placement: the plain-Python specification of PlacementCore, and a brute force
# ==============================================================================================
#
# ``place_reference`` follows hetslurm._core.PlacementCore step by step, over Python lists (no
# numpy vectorisation), and is what the kernel is compared with on random clusters.
# ``place_bruteforce`` shares only the per-node rules (feasibility, core and FPGA choice, the
# terms) with it: it chooses GPUs by scoring every subset (``choose_gpus_bruteforce``) and
# nodes by scoring every k-subset of fitting nodes by (switch levels, score sum, sorted
# node tuple). Both read a ClusterModel and a KernelRequest (see hetslurm.placement.place).

# Status codes and placement results, as in hetslurm.placement.model; written out again here
# so the specification reads on its own (a unit test checks the two agree).
_ST = {name: code for code, name in enumerate((
    "fits", "unavailable", "cpu_only", "gpu_model", "gpu_count", "gpu_mem", "gpu_free", "nvlink",
    "fpga_model", "fpga_count", "fpga_free", "cores", "numa", "memory",
))}
PLACED, FEW_NODES, SWITCH_BLOCKED = 0, 1, 2
BRUTEFORCE_MAX_NODES = 12


@dataclass
class PlainCluster:
    """A ClusterModel's arrays as Python lists, with mutable live state."""

    n: int
    cores_total: list[int]
    mem_free: list[int]
    available: list[int]
    gpu_model: list[int]
    gpu_off: list[int]
    gpu_island: list[int]
    gpu_numa: list[int]
    gpu_mem: list[int]
    gpu_free: list[int]
    fpga_model: list[int]
    fpga_off: list[int]
    fpga_free: list[int]
    numa_off: list[int]
    core_off: list[int]
    core_numa: list[int]
    core_free: list[int]
    leaf: list[int]
    parent: list[int]
    level: list[int]
    weight: list[int]
    gpu_dyn: list[int]
    fpga_dyn: list[int]
    #: Measured load per node, per mille (0 = idle or unknown).
    load: list[int]

    @classmethod
    def from_model(cls, model: ClusterModel) -> PlainCluster:
        s = model.state
        return cls(
            n=model.n_nodes,
            cores_total=model.cores_total.tolist(),
            mem_free=s.mem_free_mib.tolist(),
            available=s.available.tolist(),
            gpu_model=model.gpu_model.tolist(),
            gpu_off=model.gpu_offsets.tolist(),
            gpu_island=model.gpu_island.tolist(),
            gpu_numa=model.gpu_numa.tolist(),
            gpu_mem=model.gpu_mem_mib.tolist(),
            gpu_free=s.gpu_free.tolist(),
            fpga_model=model.fpga_model.tolist(),
            fpga_off=model.fpga_offsets.tolist(),
            fpga_free=s.fpga_free.tolist(),
            numa_off=model.numa_offsets.tolist(),
            core_off=model.core_offsets.tolist(),
            core_numa=model.core_numa.tolist(),
            core_free=s.core_free.tolist(),
            leaf=model.leaf.tolist(),
            parent=model.switch_parent.tolist(),
            level=model.switch_level.tolist(),
            weight=model.weight.tolist(),
            gpu_dyn=[max(b - i, 0) for b, i in zip(model.gpu_busy_w.tolist(),
                                                   model.gpu_idle_w.tolist(), strict=True)],
            fpga_dyn=[max(b - i, 0) for b, i in zip(model.fpga_busy_w.tolist(),
                                                    model.fpga_idle_w.tolist(), strict=True)],
            load=([0] * model.n_nodes if s.load_milli is None else s.load_milli.tolist()),
        )


@dataclass
class NodeChoice:
    """One node's evaluation: status (0 = fits), terms, and the chosen indices."""

    status: int
    terms: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    fpgas: tuple[int, ...] = ()
    cores: tuple[int, ...] = ()

    def score(self, weights: Sequence[int]) -> int:
        return sum(t * w for t, w in zip(self.terms, weights, strict=False))


@dataclass
class RefPlacement:
    """A placement as the reference computes it (mirrors the kernel's outputs)."""

    status: int
    nodes: tuple[int, ...] = ()
    choices: tuple[NodeChoice, ...] = ()
    total: int = -1
    levels: int = -1
    fitting: int = 0
    best_leaf: int = 0
    statuses: tuple[int, ...] = field(default_factory=tuple)


def static_fit_reference(pc: PlainCluster, i: int, kr: KernelRequest) -> int:
    """Node ``i``'s static status for ``kr`` exactly as ``PlacementCore.static_fit`` gives
    it: the tests of :func:`evaluate_node_reference` that read no free state."""
    ga, gb = pc.gpu_off[i], pc.gpu_off[i + 1]
    fa, fb = pc.fpga_off[i], pc.fpga_off[i + 1]
    if not pc.available[i]:
        return _ST["unavailable"]
    if kr.cpu_only and (gb > ga or fb > fa):
        return _ST["cpu_only"]
    gm, fm = pc.gpu_model[i], pc.fpga_model[i]
    if kr.gpus > 0:
        if gm < 0 or kr.gpu_rank[gm] < 0:
            return _ST["gpu_model"]
        if gb - ga < kr.gpus:
            return _ST["gpu_count"]
        if sum(pc.gpu_mem[j] >= kr.min_gpu_mem_mib for j in range(ga, gb)) < kr.gpus:
            return _ST["gpu_mem"]
    if kr.fpgas > 0:
        if fm < 0 or kr.fpga_rank[fm] < 0:
            return _ST["fpga_model"]
        if fb - fa < kr.fpgas:
            return _ST["fpga_count"]
    return _ST["fits"]


def evaluate_node_reference(
    pc: PlainCluster, i: int, kr: KernelRequest, *, bruteforce: bool = False
) -> NodeChoice:
    """Evaluate node ``i`` for ``kr`` exactly as ``PlacementCore._eval`` does."""
    ng, nf, nc = kr.gpus, kr.fpgas, kr.cores
    ga, gb = pc.gpu_off[i], pc.gpu_off[i + 1]
    fa, fb = pc.fpga_off[i], pc.fpga_off[i + 1]
    da, db = pc.numa_off[i], pc.numa_off[i + 1]
    if not pc.available[i]:
        return NodeChoice(_ST["unavailable"])
    if kr.cpu_only and (gb > ga or fb > fa):
        return NodeChoice(_ST["cpu_only"])
    gm, fm = pc.gpu_model[i], pc.fpga_model[i]
    gpus: tuple[int, ...] = ()
    islands = 0
    if ng > 0:
        if gm < 0 or kr.gpu_rank[gm] < 0:
            return NodeChoice(_ST["gpu_model"])
        if gb - ga < ng:
            return NodeChoice(_ST["gpu_count"])
        qualified = [int(pc.gpu_mem[j] >= kr.min_gpu_mem_mib) for j in range(ga, gb)]
        mask = [q and pc.gpu_free[ga + j] for j, q in enumerate(qualified)]
        if sum(qualified) < ng:
            return NodeChoice(_ST["gpu_mem"])
        if sum(mask) < ng:
            return NodeChoice(_ST["gpu_free"])
        rule = choose_gpus_bruteforce if bruteforce else choose_gpus_reference
        gpus, packed = rule(mask, pc.gpu_island[ga:gb], pc.gpu_numa[ga:gb], ng)
        islands = packed >> ISLAND_SHIFT
        if kr.nvlink and islands > 1:
            return NodeChoice(_ST["nvlink"])
    fpga_free = [j - fa for j in range(fa, fb) if pc.fpga_free[j]]
    if nf > 0:
        if fm < 0 or kr.fpga_rank[fm] < 0:
            return NodeChoice(_ST["fpga_model"])
        if fb - fa < nf:
            return NodeChoice(_ST["fpga_count"])
        if len(fpga_free) < nf:
            return NodeChoice(_ST["fpga_free"])
    free = [0] * (db - da)
    for c in range(pc.core_off[i], pc.core_off[i + 1]):
        free[pc.core_numa[c]] += pc.core_free[c]
    free_cores = sum(free)
    if free_cores < nc:
        return NodeChoice(_ST["cores"])
    take, used = _take_cores(free, {pc.gpu_numa[ga + g] for g in gpus}, nc)
    span = len(used)
    if kr.numa and span > 1:
        return NodeChoice(_ST["numa"])
    if pc.mem_free[i] < kr.mem_mib:
        return NodeChoice(_ST["memory"])
    gpu_free_count = sum(pc.gpu_free[ga:gb])
    terms = (
        (kr.gpu_rank[gm] if ng > 0 else 0) + (kr.fpga_rank[fm] if nf > 0 else 0),
        islands - 1 if islands > 0 else 0,
        span - 1 if span > 0 else 0,
        gpu_free_count - ng + len(fpga_free) - nf,
        max((pc.cores_total[i] - free_cores + nc) * 1000 // pc.cores_total[i], pc.load[i]),
        ng * pc.gpu_dyn[i] + nf * pc.fpga_dyn[i],
        pc.weight[i],
    )
    seen = [0] * (db - da)
    cores = []
    for c in range(pc.core_off[i], pc.core_off[i + 1]):
        d = pc.core_numa[c]
        if pc.core_free[c] and seen[d] < take[d]:
            cores.append(c - pc.core_off[i])
            seen[d] += 1
    return NodeChoice(0, terms, tuple(gpus), tuple(fpga_free[:nf]), tuple(cores))


def _take_cores(free: list[int], gpu_domains: set[int], nc: int) -> tuple[list[int], set[int]]:
    """Cores to take per NUMA domain, and the domains spanned (GPU domains included).

    The chosen GPUs' domains give first, in domain order; then, while cores are missing, the
    domain with the fewest free cores that holds the rest alone (best fit), else the one
    with the most free cores (fewest domains); ties go to the lower domain.
    """
    take = [0] * len(free)
    used = set(gpu_domains)
    rem = nc
    for d in sorted(gpu_domains):
        t = min(free[d], rem)
        take[d] = t
        rem -= t
    while rem > 0:
        others = [d for d in range(len(free)) if d not in used and free[d] > 0]
        fits = [d for d in others if free[d] >= rem]
        if fits:
            d = min(fits, key=lambda d: (free[d], d))
            take[d], rem = rem, 0
        else:
            d = min(others, key=lambda d: (-free[d], d))
            take[d] = free[d]
            rem -= free[d]
        used.add(d)
    return take, used


def _path(pc: PlainCluster, i: int) -> list[int]:
    out, s = [], pc.leaf[i]
    while s >= 0:
        out.append(s)
        s = pc.parent[s]
    return out


def place_reference(
    model: ClusterModel, kr: KernelRequest, pc: PlainCluster | None = None,
    *, commit: bool = False,
) -> RefPlacement:
    """The kernel's algorithm in plain Python (see the ``_core.pyx`` section comment).

    Every node is evaluated (the kernel's free-capacity index only skips nodes that cannot
    fit, so the answer is the same).
    """
    pc = pc or PlainCluster.from_model(model)
    k = kr.nodes
    evals = [evaluate_node_reference(pc, i, kr) for i in range(pc.n)]
    statuses = tuple(e.status for e in evals)
    cands = sorted((e.score(kr.weights), i) for i, e in enumerate(evals) if e.status == 0)
    count: dict[int, int] = {}
    for _, i in cands:
        for s in _path(pc, i):
            count[s] = count.get(s, 0) + 1
    best_leaf = max([c for s, c in count.items() if pc.level[s] == 0], default=0)
    levels = [pc.level[s] for s, c in count.items() if c >= k]
    result = RefPlacement(FEW_NODES, fitting=len(cands), best_leaf=best_leaf,
                          statuses=statuses)
    if len(cands) < k or not levels:
        return result
    level = min(levels)
    if kr.switch and level > 0:
        result.status = SWITCH_BLOCKED
        return result
    members: dict[int, list[tuple[int, int]]] = {}
    for score, i in cands:
        anc = [s for s in _path(pc, i) if pc.level[s] == level]
        if anc and len(members.setdefault(anc[0], [])) < k:
            members[anc[0]].append((score, i))
    best = min(
        (sum(sc for sc, _ in m), sorted(i for _, i in m), s)
        for s, m in members.items() if len(m) == k
    )
    nodes = tuple(best[1])
    choices = tuple(evaluate_node_reference(pc, i, kr) for i in nodes)
    total = sum(c.score(kr.weights) for c in choices) + kr.weights[-1] * level
    if commit:
        for i, c in zip(nodes, choices, strict=True):
            _commit(pc, i, kr, c)
    return RefPlacement(PLACED, nodes, choices, total, level, len(cands), best_leaf, statuses)


def _commit(pc: PlainCluster, i: int, kr: KernelRequest, c: NodeChoice) -> None:
    for g in c.gpus:
        pc.gpu_free[pc.gpu_off[i] + g] = 0
    for f in c.fpgas:
        pc.fpga_free[pc.fpga_off[i] + f] = 0
    for core in c.cores:
        pc.core_free[pc.core_off[i] + core] = 0
    pc.mem_free[i] -= kr.mem_mib


def place_batch_reference(model: ClusterModel, krs: Sequence[KernelRequest]) -> list[RefPlacement]:
    """Place requests in order against one evolving plain-Python state."""
    pc = PlainCluster.from_model(model)
    return [place_reference(model, kr, pc, commit=True) for kr in krs]


def place_bruteforce(model: ClusterModel, kr: KernelRequest) -> RefPlacement:
    """The optimum by the documented score, by enumeration (clusters of <= 12 nodes).

    GPUs per node: every subset (``choose_gpus_bruteforce``); nodes: every k-subset of the
    nodes that fit, ranked by (switch levels of their lowest common switch, score sum, sorted
    node tuple).

    Raises:
        PlacementError: The cluster has more than ``BRUTEFORCE_MAX_NODES`` nodes.
    """
    pc = PlainCluster.from_model(model)
    if pc.n > BRUTEFORCE_MAX_NODES:
        raise PlacementError(f"brute force is for <= {BRUTEFORCE_MAX_NODES} nodes, got {pc.n}")
    evals = [evaluate_node_reference(pc, i, kr, bruteforce=True) for i in range(pc.n)]
    fit = [i for i, e in enumerate(evals) if e.status == 0]
    statuses = tuple(e.status for e in evals)
    if len(fit) < kr.nodes:
        return RefPlacement(FEW_NODES, fitting=len(fit), statuses=statuses)
    best: tuple[int, int, tuple[int, ...]] | None = None
    for subset in combinations(fit, kr.nodes):
        common = set(_path(pc, subset[0]))
        for i in subset[1:]:
            common &= set(_path(pc, i))
        # The lowest common switch is the one of lowest level among the shared ones.
        level = min(pc.level[s] for s in common)
        key = (level, sum(evals[i].score(kr.weights) for i in subset), subset)
        if best is None or key < best:
            best = key
    assert best is not None
    level, total, nodes = best
    if kr.switch and level > 0:
        return RefPlacement(SWITCH_BLOCKED, fitting=len(fit), statuses=statuses)
    return RefPlacement(PLACED, nodes, tuple(evals[i] for i in nodes),
                        total + kr.weights[-1] * level, level, len(fit), statuses=statuses)
