"""Figures of a simulation: wait CDF, mean wait versus load, GPUs busy over time.

matplotlib is imported here only, with the Agg backend (no display needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hetslurm.simulate.run import SimulationResult


def write_plots(result: SimulationResult, out_dir: str | Path) -> list[Path]:
    """Write ``wait_cdf.png``, ``wait_vs_load.png`` and ``gpus_busy.png`` to ``out_dir``.

    Returns:
        The files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(r["policy"] for r in result.rows))
    loads = sorted({r["load"] for r in result.rows})
    top = loads[-1]
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        waits = np.sort(np.asarray(result.traces[(p, top)].waits)) / 3600
        if waits.size:
            ax.step(waits, np.arange(1, waits.size + 1) / waits.size, where="post", label=p)
    ax.set_xlabel("wait (h)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"Wait CDF at load {top:g}")
    ax.legend()
    written.append(_save(fig, out / "wait_cdf.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        rows = sorted((r for r in result.rows if r["policy"] == p), key=lambda r: r["load"])
        ax.plot([r["load"] for r in rows], [r["mean_wait_s"] / 3600 for r in rows], "o-",
                label=p)
    ax.set_xlabel("arrival-rate multiplier (load)")
    ax.set_ylabel("mean wait (h)")
    ax.legend()
    written.append(_save(fig, out / "wait_vs_load.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        t, busy = _busy_curve(result.traces[(p, top)].intervals)
        ax.step(np.asarray(t) / 3600, busy, where="post", label=p)
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPUs busy")
    ax.set_title(f"GPUs busy over time at load {top:g}")
    ax.legend()
    written.append(_save(fig, out / "gpus_busy.png", plt))
    return written


def _busy_curve(intervals: Sequence[tuple[float, float, int]]) -> tuple[list[float], list[int]]:
    deltas: dict[float, int] = {}
    for start, end, gpus in intervals:
        deltas[start] = deltas.get(start, 0) + gpus
        deltas[end] = deltas.get(end, 0) - gpus
    times = sorted(deltas)
    level, values = 0, []
    for t in times:
        level += deltas[t]
        values.append(level)
    return times, values


def _save(fig: object, path: Path, plt: object) -> Path:
    fig.savefig(path, dpi=100, bbox_inches="tight")  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path
