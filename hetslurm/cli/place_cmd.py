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
    site_option,
    site_path,
    state_option,
)
from hetslurm.cli.output import emit

if TYPE_CHECKING:
    from hetslurm.placement import ClusterModel, Placement
    from hetslurm.placement.state import LiveState
    from hetslurm.request.language import Request

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


def _model_models(model: ClusterModel, name: str) -> tuple[str | None, str | None]:
    i = model.node_index(name)
    g, f = int(model.gpu_model[i]), int(model.fpga_model[i])
    return (model.gpu_models[g] if g >= 0 else None, model.fpga_models[f] if f >= 0 else None)


def _document(model: ClusterModel, request: Request, request_text: str, p: Placement,
              live: LiveState | None) -> dict[str, Any]:
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
    return doc


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


@click.command("place")
@site_option()
@click.option("--request", "request_text", required=True, metavar="TEXT",
              help="The request, in the #HET grammar (docs/requests.md), e.g. "
                   "\"gpus=4 gpu-type=h100|a100 locality=nvlink\".")
@state_option(default="live")
@format_option
def place_cmd(site_file: str | None, request_text: str, state_spec: str,
              output_format: str) -> None:
    """Say where a request would run now, on which devices and cores, and why.

    Prints the node list (hostlist form), per node the predicted GPU/FPGA indices and
    cores, the score with its terms, why it won and the sbatch options that enact it; or,
    when it cannot run, whether it is impossible on this cluster or only busy now, the
    blocking constraint and the earliest start as running jobs end. GPU indices are a
    prediction of what Slurm does with the rendered gres.conf (docs/placement.md).
    Exit status 0 for any answer (read 'placeable'); a malformed request exits 5.
    """
    from hetslurm.placement import ClusterModel, place
    from hetslurm.request.language import parse_request, resolve
    from hetslurm.site import load_site

    site = load_site(site_path(site_file))
    request = resolve(parse_request(request_text), site)
    live = _load_state(state_spec)
    model = ClusterModel.from_site(site)
    if live is not None:
        model = model.with_state(live)
    p = place(model, request, live=live)
    doc = _document(model, request, request_text, p, live)
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
