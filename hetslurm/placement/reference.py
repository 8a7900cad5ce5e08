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
from itertools import combinations

from hetslurm.errors import PlacementError

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
