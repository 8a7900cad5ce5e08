"""The ranking rule: a class's device order from measured speeds.

Shared by ``hetslurm learn speeds --rank`` (:func:`hetslurm.audit.ranking.rank_classes`,
from the site's accounting) and the simulator's ``speeds`` part
(:func:`hetslurm.simulate.workload.learned_site`, from the parameter file's speeds), so a
replay re-ranks a class exactly as the command would propose it.

Model A goes before model B only when A's 95 % interval lies wholly above B's (the intervals
separate). The proposed order is the linear extension of that "clearly faster" order closest
to the site's: at each step, the first remaining device (in the site's order) that no
remaining device is clearly faster than. A device without an interval is compared with
nothing and keeps its place among the others.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: A device's 95 % interval of its speed ratio: (low, high); either may be unknown.
Interval = tuple[float | None, float | None]


def clearly_faster(a: Interval | None, b: Interval | None) -> bool:
    """Whether interval ``a`` lies wholly above ``b``."""
    return (a is not None and b is not None and a[0] is not None and b[1] is not None
            and a[0] > b[1])


def proposed_order(order: Sequence[str], intervals: Mapping[str, Interval]) -> tuple[str, ...]:
    """``order`` with a device moved ahead of one listed before it only where it is clearly
    faster (the closest linear extension; ties and overlaps keep the site's order)."""
    left, out = list(order), []
    while left:
        # "Clearly faster" is a strict order (no cycles), so some device has none above it.
        pick = next(d for d in left
                    if not any(clearly_faster(intervals.get(o), intervals.get(d))
                               for o in left if o != d))
        out.append(pick)
        left.remove(pick)
    return tuple(out)
