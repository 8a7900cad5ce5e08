"""The sbatch options that enact a placement, as far as Slurm 22.05 can be told.

No Slurm option takes GPU indices, so what :func:`~hetslurm.placement.place.place` prints
inside a node is a *prediction* of what Slurm 22.05 does with the gres.conf hetslurm renders
(``Cores=`` per NVLink island; SLURM-TESTBED.md, "How Slurm 22.05 picks GPU indices").
:func:`slurm_args` pins what Slurm can be told (nodes, device counts and model, cores,
memory, binding); whether Slurm kept the rest is measured by the lab
(``hetslurm.lab.validate_placement``).
"""

from __future__ import annotations

from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import Placement
from hetslurm.request.language import Request


def slurm_args(model: ClusterModel, request: Request, placement: Placement,
               *, enforce_binding: bool = True) -> list[str]:
    """sbatch options that enact ``placement`` as far as Slurm 22.05 can be told.

    Nodes are pinned with ``-w`` (and ``-N``), one task per node with the request's cores
    (``-c``), memory when the request names it (else the site's DefMemPerCPU applies, as in
    the model). GPUs are typed when every chosen node has the same model (``-w`` already
    fixes the model otherwise). With ``enforce_binding`` the job may use only cores next to
    its GPUs (``--gres-flags=enforce-binding``).

    A one-node job asks for its GPUs per job (``--gpus=h100:2``), not per node (``--gres``):
    measured on Slurm 22.05 with the rendered ``Cores=`` and enforce-binding, ``--gres``
    picks the lowest free cores first and then GPUs near them, adding a core on the other
    socket when the first has too few GPUs free (a 2-GPU job split over two islands), while
    ``--gpus`` picks a socket that holds all the GPUs first (docs/placement.md, "On the
    testbed"). Multi-node jobs keep ``--gres`` so every node gets the same count. The GPU
    indices stay Slurm's choice either way.

    Raises:
        ValueError: ``placement`` is not placeable.
    """
    if not placement.placeable:
        raise ValueError("only a placeable placement can be enacted")
    k = len(placement.nodes)
    args = ["-w", placement.nodelist, "-N", str(k), "--ntasks-per-node=1"]
    cores = len(placement.nodes[0].cores)
    if cores:
        args.append(f"--cpus-per-task={cores}")
    gres = []
    gpus = len(placement.nodes[0].gpus)
    if gpus:
        models = {model.gpu_models[int(model.gpu_model[model.node_index(n.name)])]
                  for n in placement.nodes}
        spec = f"{models.pop()}:{gpus}" if len(models) == 1 else f"{gpus}"
        if k == 1:
            args.append(f"--gpus={spec}")
        else:
            gres.append(f"gpu:{spec}")
    fpgas = len(placement.nodes[0].fpgas)
    if fpgas:
        models = {model.fpga_models[int(model.fpga_model[model.node_index(n.name)])]
                  for n in placement.nodes}
        gres.append(f"fpga:{models.pop()}:{fpgas}" if len(models) == 1 else f"fpga:{fpgas}")
    if gres:
        args.append("--gres=" + ",".join(gres))
    if enforce_binding and gpus:
        args.append("--gres-flags=enforce-binding")
    if request.mem_per_node_mib is not None:
        args.append(f"--mem={request.mem_per_node_mib}M")
    if request.partition:
        args += ["-p", request.partition]
    return args
