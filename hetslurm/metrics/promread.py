"""Read samples back from a Prometheus server that scraped ``hetslurm exporter``.

Raw samples come from an instant query of a range selector (``metric[<range>s]``), which
returns every stored point with its own timestamp (``query_range`` would resample).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from hetslurm.errors import MetricsError
from hetslurm.metrics.exporter import METRICS
from hetslurm.metrics.samples import COLUMNS
from hetslurm.metrics.store import empty_frame, normalise_frame

TIMEOUT_S = 60.0


def _query(url: str, query: str, at: float) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    full = f"{url.rstrip('/')}/api/v1/query?{qs}"
    if not full.startswith(("http://", "https://")):
        raise MetricsError(f"Prometheus URL must be http(s): {url}")
    try:
        with urllib.request.urlopen(full, timeout=TIMEOUT_S) as resp:  # noqa: S310 - checked
            doc = json.loads(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise MetricsError(f"Prometheus at {url} did not answer '{query}': {exc}") from exc
    if doc.get("status") != "success":
        raise MetricsError(f"Prometheus refused '{query}': {doc.get('error')}")
    result = doc.get("data", {}).get("result", [])
    return result if isinstance(result, list) else []


def _int_or_none(text: str) -> int | None:
    return int(text) if text not in ("", None) else None


def read_prometheus(url: str, since: float, until: float) -> Any:
    """Samples with ``since <= time < until`` as the store's DataFrame."""
    import pandas as pd

    span = max(1, math.ceil(until - since) + 1)
    rows: dict[tuple[str, str, int], dict[str, Any]] = {}
    for name, (col, factor, _) in METRICS.items():
        for series in _query(url, f"{name}[{span}s]", until):
            lab = series.get("metric", {})
            for ts, value in series.get("values", []):
                ms = round(float(ts) * 1000)
                t = ms / 1000.0
                if not since <= t < until:
                    continue
                key = (lab.get("node", ""), lab.get("minor", ""), ms)
                row = rows.get(key)
                if row is None:
                    row = dict.fromkeys(COLUMNS)
                    row.update(time=t, node=lab.get("node"), uuid=lab.get("uuid") or None,
                               gpu_model=lab.get("gpu_model") or None,
                               job_gpus=lab.get("job_gpus") or None,
                               status=lab.get("status") or None,
                               minor=_int_or_none(lab.get("minor", "")),
                               slurm_index=_int_or_none(lab.get("slurm_index", "")),
                               nvml_index=_int_or_none(lab.get("nvml_index", "")),
                               job_id=_int_or_none(lab.get("job_id", "")),
                               attributed=lab.get("attributed") == "true",
                               clock_jump=lab.get("clock_jump") == "true")
                    rows[key] = row
                v = float(value)
                row[col] = None if math.isnan(v) else v / factor
    if not rows:
        return empty_frame()
    frame = pd.DataFrame(list(rows.values()), columns=list(COLUMNS))
    frame = frame.sort_values(["time", "node", "minor"]).reset_index(drop=True)
    return normalise_frame(frame)
