"""``hetslurm site``: check a site file and render Slurm's configuration from it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hetslurm.cli.output import emit, format_option
from hetslurm.site import load_site
from hetslurm.site.render import FRAGMENT_FILES, render, write_rendered

SITE_ARG = click.argument("site_file", metavar="SITE", type=click.Path(dir_okay=False))


@click.group()
def site() -> None:
    """Validate a site file and render slurm.conf, gres.conf and topology.conf from it.

    A site file (TOML, documented in docs/site-config.md) describes node classes (cores,
    NUMA, memory, GPUs with NVLink islands, FPGAs, power), the nodes as hostlists,
    partitions, the switch tree and workload classes.
    """


@site.command("check")
@SITE_ARG
@format_option
def check(site_file: str, output_format: str) -> None:
    """Validate SITE without writing anything; print a summary of its node classes.

    Exits 2 with one line naming the file, key and line when the site is invalid.
    """
    s = load_site(site_file)
    rows = []
    for cname, spec in s.node_classes.items():
        nodes = [n.name for n in s.nodes if n.class_name == cname]
        if not nodes:
            continue
        rows.append({
            "class": cname,
            "nodes": len(nodes),
            "cores": spec.sockets * spec.cores_per_socket,
            "memory_mib": spec.memory,
            "gpus": f"{spec.gpus.count}x{spec.gpus.model}" if spec.gpus else "",
            "fpgas": f"{spec.fpgas.count}x{spec.fpgas.model}" if spec.fpgas else "",
            "weight": next(n.weight for n in s.nodes if n.class_name == cname),
        })
    emit(rows, output_format, title=f"site '{s.name}': {len(s.nodes)} nodes, valid")


@site.command("render")
@SITE_ARG
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Folder to write the files into (created if missing).")
@click.option("--whole", is_flag=True,
              help="Write a complete slurm.conf for a standalone cluster instead of "
                   "Include-able fragments.")
def render_cmd(site_file: str, out_dir: str, whole: bool) -> None:
    """Render Slurm configuration for SITE into --out.

    \b
    Default: fragments to Include from an existing slurm.conf:
      hetslurm-globals.conf     GresTypes, AccountingStorageTRES, TopologyPlugin, ...
      hetslurm-nodes.conf       NodeName lines with Gres=, Feature= and Weight=
      hetslurm-partitions.conf  PartitionName lines
    plus gres.conf (Cores= per NUMA domain, Links= per NVLink island) and topology.conf.
    With --whole, one complete slurm.conf replaces the three fragments.

    Rendering is deterministic; nothing is written when the site is invalid.
    """
    s = load_site(site_file)
    files = render(s, whole=whole)
    for path in write_rendered(files, out_dir):
        click.echo(str(path))
    if not whole:
        incl = " ".join(str(Path(out_dir) / f) for f in FRAGMENT_FILES)
        click.echo(f"add to slurm.conf: Include lines for {incl}; copy gres.conf and "
                   "topology.conf beside it", err=True)
    sys.stdout.flush()
