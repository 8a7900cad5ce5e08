"""Render an :class:`~hetslurm.audit.tables.AuditResult`: table, CSV, JSON, Parquet, HTML,
and PNG charts (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from hetslurm.audit.tables import AuditResult, records

#: What each table answers and what to do about it (also in docs/metrics-and-audit.md).
ABOUT = {
    "by_gpu_model": "Allocated, used, busy and idle GPU-hours per device model.",
    "by_partition": "The same per partition.",
    "by_account": "The same per account.",
    "by_user": "The same per user.",
    "by_class": "The same per workload class (#HET class=, else the partition's class).",
    "idle_jobs": "Jobs that held GPUs and left them idle for a whole window.",
    "wait": "Start minus eligible time by workload class and device model.",
    "fragmentation": "Free GPUs stranded on partly used nodes.",
    "right_size": "Jobs a slower model would have served (site speed table).",
    "placement": "Multi-GPU jobs split across NVLink islands or leaf switches.",
    "hook_decisions": "What jobs asked for (models, locality) against what they got.",
    "class_agreement": "Jobs that declared a class: how often the class inferred from what "
                       "they did (GPU used or not) agreed.",
    "energy_jobs": "Energy per GPU job from NVML's energy counter, with the share of its "
                   "sampled GPU-time the counter covers (the rest is unknown, not guessed).",
    "energy": "The same summed by user, account, class and GPU model.",
    "energy_per_work": "Watt-hours per reference GPU-hour of work by GPU model (and class), "
                       "from the covered energy and the site's speeds; no speed, no figure.",
}


def write_json(result: AuditResult, out: TextIO) -> None:
    """One object: ``meta`` then every table as a list of row objects (NaN -> null)."""
    # pandas' C writer per table: a million-row table in a second, not a minute of
    # json.dump's per-token writes.
    parts = ['{"meta": ' + json.dumps(result.meta, allow_nan=False, default=str)]
    for name, frame in result.tables.items():
        body = frame.to_json(orient="records", double_precision=10) if len(frame) else "[]"
        parts.append(f"{json.dumps(name)}: {body}")
    out.write(",\n".join(parts) + "}\n")


def write_csv(result: AuditResult, out: TextIO, tables: list[str] | None = None) -> None:
    """One CSV per table; with several, each is preceded by a ``# <name>`` line."""
    names = tables or list(result.tables)
    for name in names:
        if len(names) > 1:
            out.write(f"# {name}\n")
        result.tables[name].to_csv(out, index=False, lineterminator="\n")
        if len(names) > 1:
            out.write("\n")


def write_parquet(result: AuditResult, folder: str | Path) -> list[Path]:
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for name, frame in result.tables.items():
        p = d / f"{name}.parquet"
        frame.to_parquet(p, index=False)
        out.append(p)
    (d / "meta.json").write_text(json.dumps(result.meta, indent=1, default=str))
    return out


def print_tables(result: AuditResult, tables: list[str] | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    for name in tables or list(result.tables):
        frame = result.tables[name]
        t = Table(title=f"{name} — {ABOUT.get(name, '')}", title_justify="left")
        for c in frame.columns:
            t.add_column(str(c))
        for rec in records(frame)[:50]:
            t.add_row(*(_cell(v) for v in rec.values()))
        if len(frame) > 50:
            t.caption = f"first 50 of {len(frame)} rows"
        con.print(t)
    line = reconciliation_line(result.meta.get("energy_reconciliation"))
    if line:
        con.print(line, markup=False)
    if result.partial:
        Console(stderr=True).print("[yellow]partial result:[/] "
                                   + "; ".join(result.meta.get("problems", [])))


def reconciliation_line(rec: dict[str, Any] | None) -> str:
    """One sentence on NVML's energy against Slurm's (``meta.energy_reconciliation``)."""
    if not rec:
        return ""
    if not rec.get("jobs_with_both"):
        return f"energy reconciliation: {rec.get('note', '')}"
    pct = rec.get("nvml_minus_slurm_pct")
    return (f"energy reconciliation over {rec['jobs_with_both']} of {rec['gpu_jobs']} GPU jobs "
            f"that both measured: NVML {rec['nvml_kwh']:.3f} kWh, Slurm {rec['slurm_kwh']:.3f} "
            f"kWh, NVML - Slurm {rec['nvml_minus_slurm_kwh']:+.3f} kWh"
            + (f" ({pct:+.1f}%)" if pct is not None else "")
            + (f"; NVML coverage {rec['nvml_coverage_pct']:.0f}%"
               if rec.get("nvml_coverage_pct") is not None else ""))


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.3f}"
    return str(v)


def plot(result: AuditResult, folder: str | Path) -> list[Path]:
    """PNG charts of the main tables; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []

    @contextmanager
    def chart(name: str, title: str, ylabel: str) -> Iterator[Any]:
        """Axes to draw on; titled, labelled and written to ``name`` afterwards."""
        fig, ax = plt.subplots(figsize=(7, 4))
        yield ax
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        fig.tight_layout()
        fig.savefig(d / name, dpi=100)
        plt.close(fig)
        out.append(d / name)

    m = result.tables["by_gpu_model"]
    with chart("gpu_hours_by_model.png", "GPU-hours by model", "GPU-hours") as ax:
        if len(m):
            cols = ["allocated_gpu_hours", "used_gpu_hours", "busy_gpu_hours", "idle_gpu_hours"]
            m.set_index("gpu_model")[cols].astype(float).plot.bar(ax=ax)
    w = result.tables["wait"]
    with chart("wait_by_class.png", "Mean wait by class / device model", "seconds") as ax:
        if len(w):
            lab = w["class"].astype(str).replace("", "-") + "/" + w["gpu_model"].astype(str)
            ax.bar(lab, w["mean_wait_s"].astype(float))
            ax.tick_params(axis="x", rotation=45)
    f = result.tables["fragmentation"]
    with chart("fragmentation.png", "Free GPU-hours: stranded on partly used nodes vs whole "
               "free nodes", "GPU-hours") as ax:
        if len(f):
            f.set_index("gpu_model")[["stranded_gpu_hours", "free_on_idle_nodes_gpu_hours"]
                                     ].astype(float).plot.bar(ax=ax, stacked=True)
    return out


def write_html(result: AuditResult, out: TextIO, images: list[Path] | None = None) -> None:
    """One self-contained page (tables, and charts inlined as data: URLs)."""
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             "<title>hetslurm GPU audit</title><style>",
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
             "margin-bottom:2em}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}"
             "th{background:#eee}.partial{color:#a50}</style></head><body>",
             "<h1>hetslurm GPU audit</h1>"]
    meta = result.meta
    parts.append(f"<p>Range {html.escape(str(meta.get('since')))} to "
                 f"{html.escape(str(meta.get('until')))}: {meta.get('jobs')} job runs, "
                 f"{meta.get('samples')} samples.</p>")
    if result.partial or meta.get("problems"):
        items = "".join(f"<li>{html.escape(p)}</li>" for p in meta.get("problems", []))
        label = "Partial result" if result.partial else "Notes"
        parts.append(f"<div class='partial'><b>{label}</b><ul>{items}</ul></div>")
    line = reconciliation_line(meta.get("energy_reconciliation"))
    if line:
        parts.append(f"<p>{html.escape(line)}</p>")
    for img in images or []:
        data = base64.b64encode(Path(img).read_bytes()).decode()
        parts.append(f"<img alt='{html.escape(img.name)}' src='data:image/png;base64,{data}'>")
    for name, frame in result.tables.items():
        parts.append(f"<h2 id='{name}'>{name}</h2><p>{html.escape(ABOUT.get(name, ''))}</p>")
        parts.append(frame.to_html(index=False, na_rep="", float_format=lambda v: f"{v:.3f}",
                                   border=0))
    parts.append("</body></html>")
    out.write("\n".join(parts))
