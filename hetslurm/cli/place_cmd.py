"""``hetslurm place`` and ``hetslurm state dump``: where a request would run, and the live
state that answer reads (docs/placement.md)."""

from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hetslurm.cli.options import (
    EMPTY,
    LIVE,
    format_option,
    measured_options,
    site_option,
    site_path,
    state_option,
)
from hetslurm.cli.output import emit

if TYPE_CHECKING:
    from hetslurm.placement import ClusterModel, Placement, ScoreWeights
    from hetslurm.placement.state import LiveState
    from hetslurm.request.language import Request
    from hetslurm.site.model import Site

def _read_live() -> LiveState:
    from hetslurm.placement.state import LiveState
    from hetslurm.slurm import get_backend

    # SLURM_CONF in the environment points Slurm's commands at the cluster.
    return LiveState.from_backend(get_backend("auto", env=dict(os.environ)))


def _load_state(spec: str) -> LiveState | None:
    """``live`` (Slurm now), ``empty`` (nothing running) or a ``hetslurm state dump`` file."""
    from hetslurm.errors import PlacementError
    from hetslurm.placement.state import LiveState
    from hetslurm.textfile import MAX_DATA_BYTES, read_text_file

    if spec == LIVE:
        return _read_live()
    if spec == EMPTY:
        return None
    text = read_text_file(spec, what="state file", max_bytes=MAX_DATA_BYTES)
    try:
        return LiveState.from_json(text)
    except PlacementError as e:
        raise PlacementError(f"{spec}: {e}") from e


def apply_measured(site: Site, model: ClusterModel, weights: ScoreWeights, *,
                   state_spec: str, live: LiveState | None, measured: bool | None,
                   measured_energy: bool | None) -> tuple[ClusterModel, dict[str, Any]]:
    """``model`` with the measured load and GPU watts the options ask for, and a summary.

    Defaults (``None``): the load is measured when the load weight is nonzero, the state is
    not ``empty`` and the site's metrics store exists; the watts when the site's
    ``[placement] measured_energy`` is on and the store exists. Measured at the state's time.
    """
    from hetslurm.metrics.measured import read_measured, watts_pairs
    from hetslurm.site.schema import Collector, PlacementSection

    conf: PlacementSection = site.sections.get("placement") or PlacementSection()
    collector: Collector = site.sections.get("collector") or Collector()
    store_exists = Path(collector.store).is_dir()
    load = (weights.load > 0 and state_spec != EMPTY and store_exists) if measured is None \
        else measured
    energy = (conf.measured_energy and store_exists) if measured_energy is None \
        else measured_energy
    summary: dict[str, Any] = {"load": load, "energy": energy}
    if not (load or energy):
        return model, summary
    found = read_measured(site, model.names, now=None if live is None else live.time,
                          load=load, energy=energy)
    summary.update(found.summary)
    if load and found.load_milli is not None:
        model = model.with_measured_load(found.load_milli)
    if energy and found.watts:
        model = model.with_gpu_watts(watts_pairs(found.watts))
    return model, summary


def _model_models(model: ClusterModel, name: str) -> tuple[str | None, str | None]:
    i = model.node_index(name)
    g, f = int(model.gpu_model[i]), int(model.fpga_model[i])
    return (model.gpu_models[g] if g >= 0 else None, model.fpga_models[f] if f >= 0 else None)


def _document(model: ClusterModel, request: Request, request_text: str, p: Placement,
              live: LiveState | None, weights: ScoreWeights,
              measured: dict[str, Any]) -> dict[str, Any]:
    from hetslurm.placement.enact import slurm_args
    from hetslurm.request.language import format_request

    doc = p.to_dict()
    for node in doc["nodes"]:
        gm, fm = _model_models(model, node)
        doc["nodes"][node]["gpu_model"] = gm
        doc["nodes"][node]["fpga_model"] = fm
    doc["status"] = "placeable" if p.placeable else ("impossible" if p.impossible else "busy")
    doc["earliest_start_iso"] = (None if p.earliest_start is None else
                                 datetime.fromtimestamp(p.earliest_start).astimezone()
                                 .isoformat(timespec="seconds"))
    doc["request"] = {"text": request_text, "canonical": format_request(request)}
    doc["state"] = {"source": "empty" if live is None else (live.source or "file"),
                    "time": None if live is None else live.time}
    doc["sbatch_args"] = slurm_args(model, request, p) if p.placeable else None
    doc["weights"] = weights.to_dict()
    doc["measured"] = measured
    return doc


def weights_line(weights: dict[str, int]) -> str:
    """The weights as one line (``model 1000000, islands 100000, ...``)."""
    return ", ".join(f"{k} {v}" for k, v in weights.items())


def _print_table(doc: dict[str, Any]) -> None:
    def line(label: str, value: object) -> None:
        click.echo(f"{label + ':':<12}{value}")

    if doc["placeable"]:
        line("placeable", f"yes, on {doc['nodelist']}")
        for name, n in doc["nodes"].items():
            parts = []
            if n["gpus"]:
                parts.append(f"gpus {','.join(map(str, n['gpus']))} ({n['gpu_model']})")
            if n["fpgas"]:
                parts.append(f"fpgas {','.join(map(str, n['fpgas']))} ({n['fpga_model']})")
            parts.append(f"cores {','.join(map(str, n['cores']))}")
            parts.append(f"score {n['score']}")
            line(f"  {name}", "  ".join(parts))
        # Only the terms that add to the score; weight = weighted / raw term.
        terms = " + ".join(f"{k} {doc['terms'][k]}x{v // doc['terms'][k]}"
                           for k, v in doc["weighted"].items() if v)
        line("score", f"{doc['score']}" + (f" = {terms}" if terms else ""))
        line("why", doc["reason"])
        line("sbatch", " ".join(doc["sbatch_args"]))
    else:
        line("placeable", f"no ({doc['status']})")
        line("blocking", doc["blocking"])
        line("why", doc["reason"])
        if doc["earliest_start_iso"]:
            line("earliest", doc["earliest_start_iso"])
    line("state", f"{doc['state']['source']}")
    line("weights", weights_line(doc["weights"]))
    m = doc["measured"]
    if m.get("load") or m.get("energy"):
        parts = []
        if "load" in m and isinstance(m["load"], dict):
            parts.append(f"load on {m['load']['nodes_measured']} node(s) over "
                         f"{m['load']['window_s']} s")
        if "energy" in m and isinstance(m["energy"], dict):
            parts.append("watts of " + (", ".join(m["energy"]["models"]) or "no model"))
        line("measured", "; ".join(parts) or "nothing read")


@click.command("place")
@site_option()
@click.option("--request", "request_text", required=True, metavar="TEXT",
              help="The request, in the #HET grammar (docs/requests.md), e.g. "
                   "\"gpus=4 gpu-type=h100|a100 locality=nvlink\".")
@state_option(default="live")
@measured_options
@format_option
def place_cmd(site_file: str | None, request_text: str, state_spec: str,
              measured: bool | None, measured_energy: bool | None,
              output_format: str) -> None:
    """Say where a request would run now, on which devices and cores, and why.

    Prints the node list (hostlist form), per node the predicted GPU/FPGA indices and
    cores, the score with its terms, why it won and the sbatch options that enact it; or,
    when it cannot run, whether it is impossible on this cluster or only busy now, the
    blocking constraint and the earliest start as running jobs end. GPU indices are a
    prediction of what Slurm does with the rendered gres.conf (docs/placement.md). Scores
    use the site's [placement.weights] and, with --measured, the measured load.
    Exit status 0 for any answer (read 'placeable'); a malformed request exits 5.
    """
    from hetslurm.placement import ClusterModel, ScoreWeights, place
    from hetslurm.request.language import parse_request, resolve
    from hetslurm.site import load_site

    site = load_site(site_path(site_file))
    request = resolve(parse_request(request_text), site)
    live = _load_state(state_spec)
    model = ClusterModel.from_site(site)
    if live is not None:
        model = model.with_state(live)
    weights = ScoreWeights.from_site(site)
    model, measured_doc = apply_measured(site, model, weights, state_spec=state_spec, live=live,
                                         measured=measured, measured_energy=measured_energy)
    p = place(model, request, weights=weights, live=live)
    doc = _document(model, request, request_text, p, live, weights, measured_doc)
    if output_format == "table":
        _print_table(doc)
        return
    rows = [{"node": name, "gpus": n["gpus"], "fpgas": n["fpgas"], "cores": n["cores"],
             "score": n["score"]} for name, n in doc["nodes"].items()]
    emit(rows, output_format, document=doc)


@click.group("state")
def state() -> None:
    """Live cluster state as placement reads it (hetslurm-state/1 JSON)."""


@state.command("dump")
@click.option("--out", "out_file", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write here instead of stdout.")
def state_dump(out_file: str | None) -> None:
    """Write the live state (per node: devices in use with indices, CPUs and memory
    allocated, availability, running jobs with end times, CPU ids) as hetslurm-state/1
    JSON, for 'hetslurm place --state FILE'. Reads Slurm through SLURM_CONF.
    """
    text = _read_live().to_json() + "\n"
    if out_file is None:
        sys.stdout.write(text)
        return
    Path(out_file).write_text(text, encoding="utf-8")
    click.echo(f"state dump: wrote {out_file}", err=True)
