"""Device health: is each GPU healthy, unhealthy or unknown, judged from its recent samples.

Pure: rows in, verdicts out (no store, no Slurm, no clock of its own). The act room turns
verdicts into drains and undrains (:mod:`hetslurm.act.health`); docs/act.md#device-health.

Rules, each switchable (``[health] rules``), judged on the samples of one device (one node's
Slurm GPU index) in the window the caller read:

* ``lost``: the latest sample says ``lost`` or ``missing`` (NVML lost it, or gres.conf names
  a device NVML no longer lists);
* ``ecc``: the latest sample's volatile uncorrected ECC count is at or above
  ``ecc_uncorrectable_max``;
* ``xid``: a sample of the window carries an XID in ``xids``;
* ``throttle``: every sample over at least ``throttle_persist_s`` (and at least two) shows
  one of ``throttle_reasons``.

Unknown comes first and is never unhealthy: no sample newer than ``stale_s``, or a latest
sample whose status is ``unknown`` (a hung read) or ``error``. Unknown never drains and
never undrains anything. A column the samples do not have (an older store) reads as None:
that rule has nothing to judge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
UNKNOWN = "unknown"

RULES = ("lost", "ecc", "xid", "throttle")
#: Statuses that say the device is gone.
GONE_STATUSES = frozenset({"lost", "missing"})
#: Statuses that say nothing about the device (a hung or failed read).
UNKNOWN_STATUSES = frozenset({"unknown", "error"})
#: The columns the rules read (``throttle_reasons``, ``ecc_uncorrectable`` and ``xid`` may
#: be absent from an older store).
COLUMNS = ("time", "node", "slurm_index", "minor", "gpu_model", "status", "throttle_reasons",
           "ecc_uncorrectable", "xid")
#: Most severe first: the order a capped pass drains in.
SEVERITY = {"lost": 0, "xid": 1, "ecc": 2, "throttle": 3}


@dataclass(frozen=True)
class HealthRules:
    """The resolved ``[health]`` rules (``stale_s`` already a number)."""

    rules: tuple[str, ...] = RULES
    ecc_uncorrectable_max: int = 1
    xids: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95, 119, 120})
    throttle_reasons: frozenset[str] = frozenset(
        {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake", "sw_thermal_slowdown"})
    throttle_persist_s: float = 300.0
    stale_s: float = 90.0

    @property
    def window_s(self) -> float:
        """How far back the caller should read: a persistent spell still ending a stale
        period ago is seen whole."""
        return self.throttle_persist_s + self.stale_s


@dataclass(frozen=True)
class DeviceVerdict:
    """One GPU's verdict. ``rules`` names the rules that fired (empty unless unhealthy);
    ``evidence`` is one line naming the device and what was seen."""

    node: str
    slurm_index: int
    minor: int | None
    model: str | None
    verdict: str
    rules: tuple[str, ...] = ()
    evidence: str = ""
    last_sample: float | None = None

    @property
    def device(self) -> str:
        """``GPU 2 (minor 131)``: Slurm's index first, the device file's minor after."""
        minor = f" (minor {self.minor})" if self.minor is not None else ""
        return f"GPU {self.slurm_index}{minor}"

    @property
    def severity(self) -> int:
        return min((SEVERITY[r] for r in self.rules), default=len(SEVERITY))

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "slurm_index": self.slurm_index, "minor": self.minor,
                "model": self.model, "verdict": self.verdict, "rules": list(self.rules),
                "evidence": self.evidence, "last_sample": self.last_sample}


@dataclass(frozen=True)
class NodeHealth:
    """Every judged device of one node."""

    node: str
    devices: tuple[DeviceVerdict, ...] = field(default_factory=tuple)

    @property
    def unhealthy(self) -> tuple[DeviceVerdict, ...]:
        return tuple(d for d in self.devices if d.verdict == UNHEALTHY)

    def all_healthy(self, expected: int | None = None) -> bool:
        """Every device healthy, and (when the site says how many GPUs the node has) every
        one of them judged: a device without samples is unknown, never healthy."""
        if not self.devices or any(d.verdict != HEALTHY for d in self.devices):
            return False
        return expected is None or len(self.devices) >= expected


def _value(row: Mapping[str, Any], key: str) -> Any:
    """A cell, None for a missing column, a pandas NA or a NaN."""
    v = row.get(key)
    if v is None:
        return None
    try:
        if v != v:  # NaN, and pandas' NA raises below
            return None
    except TypeError:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def judge_device(node: str, slurm_index: int, rows: list[Mapping[str, Any]],
                 rules: HealthRules, now: float) -> DeviceVerdict:
    """One device's verdict from its rows (any order) at ``now``."""
    rows = sorted(rows, key=lambda r: float(r["time"]))
    minor = next((_int(_value(r, "minor")) for r in reversed(rows)
                  if _value(r, "minor") is not None), None)
    model = next((str(_value(r, "gpu_model")) for r in reversed(rows)
                  if _value(r, "gpu_model") is not None), None)
    base = DeviceVerdict(node, slurm_index, minor, model, UNKNOWN)
    if not rows:
        return _with(base, UNKNOWN, (), "no sample")
    last = rows[-1]
    t_last = float(last["time"])
    base = _with(base, UNKNOWN, (), "", t_last)
    if now - t_last > rules.stale_s:
        return _with(base, UNKNOWN, (), f"no sample for {now - t_last:.0f}s", t_last)
    status = str(_value(last, "status") or "")
    if status in UNKNOWN_STATUSES:
        return _with(base, UNKNOWN, (), f"latest read {status}", t_last)

    fired: list[str] = []
    said: list[str] = []
    if "lost" in rules.rules and status in GONE_STATUSES:
        fired.append("lost")
        said.append(status)
    if "xid" in rules.rules:
        seen = [x for x in (_int(_value(r, "xid")) for r in rows) if x is not None]
        bad = sorted({x for x in seen if x in rules.xids})
        if bad:
            fired.append("xid")
            said.append("xid=" + ",".join(map(str, bad)))
    if "ecc" in rules.rules:
        ecc = _int(_value(last, "ecc_uncorrectable"))
        if ecc is not None and ecc >= rules.ecc_uncorrectable_max:
            fired.append("ecc")
            said.append(f"ecc_uncorrectable={ecc}")
    if "throttle" in rules.rules:
        spell = _throttle_spell(rows, rules)
        if spell is not None:
            reasons, seconds = spell
            fired.append("throttle")
            said.append(f"throttled {','.join(reasons)} {seconds:.0f}s")
    if fired:
        return _with(base, UNHEALTHY, tuple(fired), " ".join(said), t_last)
    return _with(base, HEALTHY, (), "", t_last)


def _throttle_spell(rows: list[Mapping[str, Any]], rules: HealthRules
                    ) -> tuple[list[str], float] | None:
    """The trailing run of samples that each show a counted reason, when it lasts at least
    ``throttle_persist_s`` over two samples or more; a sample with no reading ends it (an
    unknown is never read as throttled)."""
    run: list[set[str]] = []
    first_t: float | None = None
    for r in reversed(rows):
        text = _value(r, "throttle_reasons")
        if text is None:
            break
        active = {w.strip() for w in str(text).split(",") if w.strip()}
        counted = active & rules.throttle_reasons
        if not counted:
            break
        run.append(counted)
        first_t = float(r["time"])
    if len(run) < 2 or first_t is None:
        return None
    seconds = float(rows[-1]["time"]) - first_t
    if seconds < rules.throttle_persist_s:
        return None
    return sorted(set().union(*run)), seconds


def _with(base: DeviceVerdict, verdict: str, fired: tuple[str, ...], evidence: str,
          t_last: float | None = None) -> DeviceVerdict:
    return DeviceVerdict(base.node, base.slurm_index, base.minor, base.model, verdict, fired,
                         evidence, t_last if t_last is not None else base.last_sample)


def judge(rows: Iterable[Mapping[str, Any]], rules: HealthRules, now: float
          ) -> dict[str, NodeHealth]:
    """Node -> its devices' verdicts, from sample rows of the window.

    Rows without a Slurm index (a device gres.conf does not name) and rows after ``now``
    (a clock that jumped back) are left out.
    """
    by_dev: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        idx = _int(_value(r, "slurm_index"))
        node = _value(r, "node")
        t = _value(r, "time")
        if idx is None or node is None or t is None or float(t) > now:
            continue
        by_dev.setdefault((str(node), idx), []).append(r)
    out: dict[str, NodeHealth] = {}
    for (node, idx), dev_rows in sorted(by_dev.items()):
        v = judge_device(node, idx, dev_rows, rules, now)
        prev = out.get(node)
        out[node] = NodeHealth(node, (*(prev.devices if prev else ()), v))
    return out


def judge_frame(frame: Any, rules: HealthRules, now: float) -> dict[str, NodeHealth]:
    """:func:`judge` of a sample DataFrame, the same verdicts, vectorised.

    A device whose samples *cannot* make it anything but healthy is judged on columns:
    its latest sample is fresh, its status neither unknown, error, lost nor missing, no
    sample of the window carries an XID, its latest ECC count is below the limit or
    unread, and its latest throttle reasons name no counted reason (so no throttle spell
    can end at it). Every other device (at most the few that are unknown or unhealthy)
    goes through :func:`judge_device` row by row. Both sort a device's samples by time,
    stably, so the "latest" sample is the same one."""
    import numpy as np
    import pandas as pd

    if frame is None or len(frame) == 0:
        return {}
    have = [c for c in COLUMNS if c in frame.columns]
    f = frame[have]
    idx = pd.to_numeric(f["slurm_index"], errors="coerce") if "slurm_index" in have else None
    time = pd.to_numeric(f["time"], errors="coerce")
    if idx is None or "node" not in have:
        return {}
    keep = idx.notna() & f["node"].notna() & time.notna() & (time <= now)
    if not keep.all():
        f, idx, time = f[keep], idx[keep], time[keep]
    if not len(f):
        return {}
    order = np.argsort(time.to_numpy(dtype="float64"), kind="stable")
    f = f.iloc[order].reset_index(drop=True)
    time = time.iloc[order].reset_index(drop=True)
    idx = idx.iloc[order].reset_index(drop=True).astype("int64")
    node = f["node"].astype(str)
    key = pd.MultiIndex.from_arrays([node, idx], names=["node", "slurm_index"])
    last_pos = pd.Series(np.arange(len(f)), index=key).groupby(level=[0, 1], sort=True).last()
    last = f.iloc[last_pos.to_numpy()].reset_index(drop=True)
    t_last = time.iloc[last_pos.to_numpy()].to_numpy(dtype="float64")

    def text_flags(col: Any, test: Any) -> Any:
        """``test`` of each distinct text once (few distinct values), per row."""
        codes, uniques = pd.factorize(col.astype(object), use_na_sentinel=True)
        flags = np.array([bool(test(v)) for v in uniques] + [False], dtype=bool)
        return flags[codes]  # a missing value (code -1) takes the last flag: False

    clear = now - t_last <= rules.stale_s
    if "status" in have:
        clear &= ~text_flags(last["status"], lambda v: _value({"v": v}, "v") is not None
                             and str(v) in (UNKNOWN_STATUSES | GONE_STATUSES))
    if "ecc_uncorrectable" in have:
        ecc = pd.to_numeric(last["ecc_uncorrectable"], errors="coerce").to_numpy("float64")
        clear &= np.isnan(ecc) | (ecc < rules.ecc_uncorrectable_max)
    if "throttle_reasons" in have:
        def counted(v: Any) -> bool:
            text = _value({"v": v}, "v")
            return text is not None and bool(
                {w.strip() for w in str(text).split(",")} & rules.throttle_reasons)
        clear &= ~text_flags(last["throttle_reasons"], counted)
    if "xid" in have:
        with_xid = pd.to_numeric(f["xid"], errors="coerce").notna().to_numpy()
        dev_xid = (pd.Series(with_xid, index=key).groupby(level=[0, 1], sort=True).any()
                   .to_numpy(dtype=bool))
        clear &= ~dev_xid
    # minor and model: the latest value that is there (groupby's last skips missing ones).
    extra = [c for c in ("minor", "gpu_model") if c in have]
    lasts = (f[extra].set_axis(key).groupby(level=[0, 1], sort=True).last()
             if extra else None)
    out: dict[str, NodeHealth] = {}
    devices: dict[str, list[DeviceVerdict]] = {}
    keys = last_pos.index
    slow = np.flatnonzero(~clear)
    slow_rows: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    if len(slow):
        pick = key.isin(keys[slow])
        for r in f[pick].astype(object).to_dict("records"):
            slow_rows.setdefault((str(r["node"]), int(r["slurm_index"])), []).append(r)
    minors = lasts["minor"].tolist() if lasts is not None and "minor" in extra else None
    models = lasts["gpu_model"].tolist() if lasts is not None and "gpu_model" in extra \
        else None
    for k, (n, i) in enumerate(keys):
        if clear[k]:
            minor = _int(_value({"v": minors[k]}, "v")) if minors is not None else None
            model = _value({"v": models[k]}, "v") if models is not None else None
            v = DeviceVerdict(n, int(i), minor, None if model is None else str(model),
                              HEALTHY, (), "", float(t_last[k]))
        else:
            v = judge_device(n, int(i), slow_rows[(n, int(i))], rules, now)
        devices.setdefault(n, []).append(v)
    for n, devs in devices.items():
        out[n] = NodeHealth(n, tuple(devs))
    return out


def frame_rows(frame: Any) -> list[dict[str, Any]]:
    """A sample DataFrame's rows as dicts with the rule columns (absent ones None)."""
    if frame is None or len(frame) == 0:
        return []
    have = [c for c in COLUMNS if c in frame.columns]
    rows: list[dict[str, Any]] = frame[have].astype(object).to_dict("records")
    return rows


def reason_text(node: str, devices: Iterable[DeviceVerdict], limit: int = 240) -> str:
    """The node's drain reason: ``hetslurm: gpu1 GPU 2 (minor 131) ecc_uncorrectable 3``,
    devices joined by ``; ``, cut at ``limit`` characters.

    No ``=`` in it: ``scontrol show node -o`` prints the reason unquoted among its
    ``Key=Value`` fields, so ``ecc_uncorrectable=3`` would read back as a field of its own
    and the reason as cut before it (seen on 22.05); the evidence's ``=`` becomes a space."""
    parts = [f"{d.device} {d.evidence.replace('=', ' ')}"
             for d in sorted(devices, key=lambda d: d.slurm_index)]
    text = f"hetslurm: {node} " + "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."
