"""Slurm's GPU index -> gres.conf ``File=`` -> device minor: the attribution path's first half.

Slurm numbers a node's GPUs in the order gres.conf lists their ``File=`` devices; NVML
numbers them by PCI bus. The only stable link between the two is the device file's minor
number (``/dev/nvidia<minor>``), which NVML reports as ``nvmlDeviceGetMinorNumber``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hetslurm.slurm.conf import slurm_conf_dir
from hetslurm.slurm.units import expand_hostlist
from hetslurm.textfile import read_text_file


@dataclass(frozen=True)
class GresDevice:
    """One GPU of a node as gres.conf declares it."""

    node: str
    index: int
    model: str | None
    path: str


def default_gres_conf(env: Mapping[str, str] | None = None) -> Path:
    """gres.conf in :func:`~hetslurm.slurm.conf.slurm_conf_dir`: beside ``$SLURM_CONF``,
    else Debian's ``/etc/slurm/gres.conf``."""
    return slurm_conf_dir(None, env) / "gres.conf"


def parse_gres_conf(text: str, *, local_node: str | None = None,
                    kind: str = "gpu") -> dict[str, list[GresDevice]]:
    """GPU devices per node, each node's list in Slurm index order.

    Lines without ``NodeName=`` describe the node reading the file (``local_node``); they
    are ignored when it is None. ``File=`` may be a range (``/dev/nvidia[0-3]``).
    """
    out: dict[str, list[GresDevice]] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields: dict[str, str] = {}
        for tok in line.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields[k.lower()] = v
        if fields.get("name") != kind or "file" not in fields:
            continue
        nodes = expand_hostlist(fields["nodename"]) if "nodename" in fields else (
            (local_node,) if local_node else ())
        paths = expand_hostlist(fields["file"])
        for node in nodes:
            devs = out.setdefault(node, [])
            for path in paths:
                devs.append(GresDevice(node, len(devs), fields.get("type"), path))
    return out


def load_gres_conf(path: str | Path, *, local_node: str | None = None
                   ) -> dict[str, list[GresDevice]]:
    """Parse a gres.conf file (read as text by :func:`hetslurm.textfile.read_text_file`).

    Raises:
        ConfigError: The file cannot be read as UTF-8 text.
    """
    text = read_text_file(path, what="gres.conf")
    return parse_gres_conf(text, local_node=local_node)


def device_minor(path: str) -> int | None:
    """The minor number of a character device; None when it is missing or not one."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        return None
    return os.minor(st.st_rdev)


MinorOf = Callable[[str], "int | None"]


def minors_by_index(devices: list[GresDevice], minor_of: MinorOf = device_minor
                    ) -> dict[int, int]:
    """Slurm index -> device minor, for the devices whose file is a character device."""
    out: dict[int, int] = {}
    for d in devices:
        m = minor_of(d.path)
        if m is not None:
            out[d.index] = m
    return out
