"""``hetslurm collect``: the node collector (NVML -> job attribution -> segment store)."""

from __future__ import annotations

import logging
import os
import sys

import click

from hetslurm.cli.options import backend_option, site_option, site_path_or_none
from hetslurm.site.model import Site

NVML_KINDS = ("real", "fake")


def _site(path: str | None) -> Site | None:
    from hetslurm.site import load_site

    found = site_path_or_none(path)
    return load_site(found) if found else None


@click.command("collect")
@site_option(when_missing="defaults")
@click.option("--node", "nodes", multiple=True,
              help="Node to collect for (repeatable) [default: this host's short name].")
@click.option("--all-nodes", is_flag=True,
              help="Every node gres.conf lists GPUs for (an emulated cluster on one host).")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=None,
              help="Seconds between samples [default: [collector] interval_s].")
@click.option("--flush", type=click.FloatRange(0.1, 86400), default=None,
              help="Write a segment at least this often, seconds [default: [collector] "
                   "flush_s].")
@click.option("--store", type=click.Path(file_okay=False), default=None,
              help="Metrics store folder [default: [collector] store].")
@click.option("--nvml", type=click.Choice(NVML_KINDS), default=None,
              help="NVML source [default: [collector] nvml].")
@click.option("--fake-scenario", type=click.Path(dir_okay=False), default=None,
              help="Scenario JSON for the fake NVML [default: [collector] fake_scenario].")
@click.option("--gres-conf", type=click.Path(dir_okay=False), default=None,
              help="gres.conf to follow [default: beside $SLURM_CONF, else /etc/slurm].")
@click.option("--ticks", type=click.IntRange(1), default=None,
              help="Stop after this many samples per GPU (default: run until stopped).")
@click.option("--duration", type=click.FloatRange(0), default=None,
              help="Stop after this many seconds.")
@click.option("--compact", "compact_only", is_flag=True,
              help="Do not sample: compact old segments and prune past retention, then exit.")
@backend_option(default="cli")
def collect(site_file: str | None, nodes: tuple[str, ...], all_nodes: bool,
            interval: float | None, flush: float | None, store: str | None, nvml: str | None,
            fake_scenario: str | None, gres_conf: str | None, ticks: int | None,
            duration: float | None, compact_only: bool, backend: str) -> None:
    """Sample every GPU through NVML and attribute it to the Slurm job holding it.

    Each sample is matched to its job by Slurm's GPU index -> gres.conf File= -> the
    device's minor number -> the NVML device with that minor (never by position), and
    records the job's GPU indices. Samples are written as immutable per-node segments.
    SIGTERM/SIGINT flush what is buffered and exit 0.
    """
    from hetslurm.metrics.collector import Collector, build_source, local_node_name, resolve_gres
    from hetslurm.metrics.store import SegmentStore
    from hetslurm.site.schema import Collector as CollectorConf
    from hetslurm.slurm import get_backend

    logging.basicConfig(level=logging.INFO, format="hetslurm collect: %(message)s",
                        stream=sys.stderr)
    site = _site(site_file)
    conf = site.sections["collector"] if site is not None else CollectorConf()
    st = SegmentStore(store or conf.store, conf.trusted_uids)
    if compact_only:
        res = st.compact(conf.compact_after_s)
        pruned = st.prune(conf.retention_days)
        click.echo(f"compacted: {res}; day folders pruned: {pruned}", err=True)
        return
    local = local_node_name()
    gres = resolve_gres(gres_conf or conf.gres_conf, os.environ, local_node=local)
    wanted = sorted(gres) if all_nodes else (list(nodes) or [local])
    unknown = [n for n in wanted if n not in gres]
    if unknown:
        click.echo(f"hetslurm collect: gres.conf lists no GPU for {', '.join(unknown)}; "
                   "their GPUs are recorded as unmatched", err=True)
    source = build_source(nvml or conf.nvml, fake_scenario or conf.fake_scenario)
    coll = Collector(wanted, source, get_backend(backend, env=dict(os.environ)), gres, st,
                     interval_s=interval or conf.interval_s, flush_s=flush or conf.flush_s,
                     source_timeout_s=conf.source_timeout_s)
    done = coll.run(ticks=ticks, duration_s=duration, handle_signals=True)
    click.echo(f"hetslurm collect: {done} ticks, {len(coll.written)} segments written to "
               f"{st.root}", err=True)
