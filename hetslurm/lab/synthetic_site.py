"""A synthetic GPU site of any size, for the benchmarks that need more nodes than a real site
file holds (``hetslurm bench audit`` and ``hetslurm bench rebalance``)."""

from __future__ import annotations

import math


def gpu_site_toml(nodes: int, name: str, *, per_leaf: int | None = None,
                  extra: str = "") -> str:
    """Site-file text: ``nodes`` GPU nodes ``g00001...``, the first half with 8 H100 (80 GB)
    and the rest with 8 A100 (40 GB), each 2 sockets x 32 cores, 512 GB and two NVLink
    islands of four GPUs, all in the default partition ``gpu``.

    With ``per_leaf``, one leaf switch per ``per_leaf`` nodes under a spine. ``extra`` (more
    sections) is appended as it is.
    """
    half = max(1, nodes // 2)
    text = f'schema_version = 1\nname = "{name}"\n'
    for cls, model, memory in (("h", "h100", "80G"), ("a", "a100", "40G")):
        text += (f'[node_classes.{cls}]\nsockets = 2\ncores_per_socket = 32\nmemory = "512G"\n'
                 f'[node_classes.{cls}.gpus]\nmodel = "{model}"\ncount = 8\n'
                 f'memory = "{memory}"\nnvlink_islands = [[0, 1, 2, 3], [4, 5, 6, 7]]\n')
    text += f"""[nodes]
"g[00001-{half:05d}]" = "h"
"g[{half + 1:05d}-{max(nodes, half + 1):05d}]" = "a"
[partitions.gpu]
nodes = "ALL"
default = true
"""
    if per_leaf:
        text += "".join(
            f'[switches.leaf{i}]\nnodes = "g[{a + 1:05d}-{min(a + per_leaf, nodes):05d}]"\n'
            for i, a in enumerate(range(0, nodes, per_leaf)))
        spine = ", ".join(f'"leaf{i}"' for i in range(math.ceil(nodes / per_leaf)))
        text += f"[switches.spine]\nswitches = [{spine}]\n"
    return text + extra
