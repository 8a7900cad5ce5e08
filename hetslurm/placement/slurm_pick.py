"""Which GPUs Slurm takes once it has a one-node job's cores (per-job ``--gpus``, enforce-binding).

No Slurm option takes GPU indices: ``slurm_args`` pins the node, the count and the cores, and
cons_tres picks the GPUs itself. Its rule, read in Slurm's ``gres_select_filter.c``
(``_set_job_bits1``; the same in 22.05, 24.11 and 26.05), given the cores it allocated:

1. take every free GPU bound to a socket where the job has cores, sockets in index order,
   GPUs in index order (when more than one GPU is asked for and every GPU has ``Links=``;
   else just the first ``n`` of them);
2. find the first pair (lowest index first) with the most links between them and keep its
   lower GPU;
3. while too many remain, drop the one with the fewest links to the kept GPU, lowest index
   first on ties.

When the job's cores lie on one socket, that socket's GPUs are the candidates, and the
kernel's choice inside its island is what :func:`predict` leaves alone. When the cores span
sockets (too few free cores next to the GPUs), step 1 offers the GPUs of every socket and
step 2 anchors on the lowest linked pair, which can be in another island than the kernel
chose: measured on 26.05, cores 2,6,7 of gpu1 with GPUs 2,3,5,6,7 free gave GPUs 2,3,7
where the kernel had said 5,6,7. :func:`predict` answers what Slurm will do there, so a
prediction never claims an island it cannot deliver.

Sockets are the site's NUMA domains here (the rendered gres.conf gives each GPU the cores of
its domain as ``Cores=``); links are 1 inside an NVLink island, 0 across (``Links=``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hetslurm.placement.model import ClusterModel


def slurm_gpu_pick(model: ClusterModel, i: int, cores: Sequence[int], n: int,
                   free: Sequence[bool] | None = None) -> tuple[int, ...]:
    """The GPUs (node-local, ascending) Slurm picks on node ``i`` for ``n`` GPUs and ``cores``.

    ``free`` overrides the model's free flags for the node's GPUs (node-local order).
    Fewer than ``n`` are returned when the sockets of ``cores`` hold fewer free GPUs.
    """
    ga, gb = int(model.gpu_offsets[i]), int(model.gpu_offsets[i + 1])
    ca = int(model.core_offsets[i])
    if free is None:
        free = [bool(model.state.gpu_free[g]) for g in range(ga, gb)]
    domains = sorted({int(model.core_numa[ca + c]) for c in cores})
    island = [int(model.gpu_island[g]) for g in range(ga, gb)]
    numa = [int(model.gpu_numa[g]) for g in range(ga, gb)]
    linked = n > 1 and gb - ga > 1
    cands = [g for d in domains for g in range(gb - ga) if numa[g] == d and free[g]]
    if not linked:
        return tuple(sorted(cands[:n]))
    if len(cands) <= n:
        return tuple(sorted(cands))
    ordered = sorted(cands)
    best = next((s for s in ordered for g in ordered if g > s and island[g] == island[s]),
                ordered[0])
    keep = set(ordered)
    while len(keep) > n:
        # Fewest links to the kept GPU, lowest index first.
        worst = min((g for g in keep if g != best), key=lambda g: (island[g] == island[best], g))
        keep.discard(worst)
    return tuple(sorted(keep))


def spans_sockets(model: ClusterModel, i: int, cores: Sequence[int]) -> bool:
    """Whether ``cores`` (node-local) of node ``i`` lie in more than one NUMA domain."""
    ca = int(model.core_offsets[i])
    return len({int(model.core_numa[ca + c]) for c in cores}) > 1
