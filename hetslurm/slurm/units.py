"""Slurm's sentinels and units, converted in one place.

Everything that crosses from Slurm text/JSON into hetslurm's typed values goes through
here: the ``NO_VAL``/``INFINITE`` sentinels, memory sizes, time limits, timestamps,
hostlists and GRES strings. Callers never see a raw sentinel or suffix.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import hostlist

# slurm/slurm.h: "no value set" and "unlimited" for each unsigned width.
NO_VAL16 = 0xFFFE
INFINITE16 = 0xFFFF
NO_VAL = 0xFFFFFFFE
INFINITE = 0xFFFFFFFF
NO_VAL64 = 0xFFFFFFFFFFFFFFFE
INFINITE64 = 0xFFFFFFFFFFFFFFFF

_SENTINELS = {
    16: (NO_VAL16, INFINITE16),
    32: (NO_VAL, INFINITE),
    64: (NO_VAL64, INFINITE64),
}


class Unlimited(enum.Enum):
    """Slurm's ``INFINITE``/``UNLIMITED``: a limit that is not set to a number."""

    UNLIMITED = "UNLIMITED"

    def __repr__(self) -> str:
        return "UNLIMITED"


UNLIMITED = Unlimited.UNLIMITED

#: Seconds, or unlimited, or unknown.
Limit = int | Unlimited | None

# Text Slurm prints for "nothing here" in scontrol/sinfo/sacctmgr output.
_EMPTY_TEXT = frozenset({"", "(null)", "N/A", "n/a", "NONE", "None", "none", "Unknown", "n/s"})
_UNLIMITED_TEXT = frozenset({"UNLIMITED", "INFINITE", "Infinite", "unlimited", "infinite"})


def is_empty(text: str | None) -> bool:
    """True for the strings Slurm prints instead of a value (``(null)``, ``N/A``, ...)."""
    return text is None or text.strip() in _EMPTY_TEXT


def text_or_none(text: str | None) -> str | None:
    """``text`` stripped, or None where Slurm printed a placeholder."""
    if text is None or is_empty(text):
        return None
    return text.strip()


def from_uint(value: int | None, bits: int = 32) -> int | Unlimited | None:
    """Map an unsigned Slurm number: NO_VAL -> None, INFINITE -> UNLIMITED.

    Slurm's JSON (openapi v0.0.38) already turns some of these into ``null`` and leaves
    others as raw numbers (e.g. ``priority``), so both forms arrive here.
    """
    if value is None:
        return None
    no_val, infinite = _SENTINELS[bits]
    if value == no_val:
        return None
    if value == infinite:
        return UNLIMITED
    return int(value)


def int_or_none(value: int | None, bits: int = 32) -> int | None:
    """Like :func:`from_uint` for counts where "unlimited" cannot occur: both become None."""
    v = from_uint(value, bits)
    return v if isinstance(v, int) else None


# ----------------------------------------------------------------------------- memory
# Slurm memory sizes are binary multiples and a bare number means MiB ("mem=16000M").
_MEM_FACTOR_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}
_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(?:i?B)?\s*$", re.IGNORECASE)


def memory_mib(text: str | int | None) -> int | Unlimited | None:
    """Convert ``"16000M"``, ``"2G"``, ``"512K"``, ``"4000"`` (MiB) to whole MiB.

    Fractions round up, so a requested size is never under-counted.
    """
    if text is None:
        return None
    if isinstance(text, int):
        return from_uint(text, 64)
    if is_empty(text):
        return None
    if text.strip() in _UNLIMITED_TEXT:
        return UNLIMITED
    m = _MEM_RE.match(text)
    if not m:
        raise ValueError(f"not a Slurm memory size: {text!r}")
    number, suffix = float(m.group(1)), (m.group(2) or "M").upper()
    return math.ceil(number * _MEM_FACTOR_MIB[suffix])


# ------------------------------------------------------------------------------- time
def time_seconds(text: str | None) -> Limit:
    """Convert a Slurm duration to seconds.

    Accepts every form ``sbatch --time`` takes and scontrol prints: ``MM``, ``MM:SS``,
    ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``; ``UNLIMITED``/``INFINITE`` give
    :data:`UNLIMITED`; ``N/A``/``NONE``/empty give None. A bare number is minutes, as in
    Slurm.
    """
    if text is None or is_empty(text):
        return None
    s = text.strip()
    if s in _UNLIMITED_TEXT:
        return UNLIMITED
    days: int | None = None
    if "-" in s:
        d, _, s = s.partition("-")
        if not d.isdigit():
            raise ValueError(f"not a Slurm time: {text!r}")
        days = int(d)
    parts = s.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        raise ValueError(f"not a Slurm time: {text!r}")
    nums = [int(p) for p in parts]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        h, m, sec = nums + [0] * (3 - len(nums))
        return days * 86400 + h * 3600 + m * 60 + sec
    if len(nums) == 3:  # HH:MM:SS
        return nums[0] * 3600 + nums[1] * 60 + nums[2]
    return nums[0] * 60 + (nums[1] if len(nums) == 2 else 0)  # MM, MM:SS


def minutes_limit(value: int | None) -> Limit:
    """A JSON time limit in minutes (``time_limit``) to seconds.

    Slurm 22.05's JSON (v0.0.38) prints INFINITE time limits as ``null`` (seen for a job
    in a partition with ``MaxTime=INFINITE`` that scontrol shows as ``UNLIMITED``), so
    ``null`` here means unlimited, not unknown.
    """
    if value is None:
        return UNLIMITED
    v = from_uint(value)
    if v is None or isinstance(v, Unlimited):
        return UNLIMITED if v is UNLIMITED else None
    return v * 60


def format_time(seconds: Limit) -> str:
    """Seconds to Slurm's ``D-HH:MM:SS`` (or ``UNLIMITED``), for update commands."""
    if seconds is None or seconds is UNLIMITED:
        return "UNLIMITED"
    assert isinstance(seconds, int)
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


def from_epoch(value: int | None) -> datetime | None:
    """A Unix time from Slurm's JSON to an aware UTC datetime; 0 and sentinels give None."""
    if not value or value in (NO_VAL, INFINITE, NO_VAL64, INFINITE64):
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def parse_datetime(text: str | None) -> datetime | None:
    """scontrol's ``2026-11-30T02:52:33`` (local time of the command) to an aware datetime.

    ``Unknown``, ``None`` and ``N/A`` give None.
    """
    if text is None or is_empty(text):
        return None
    try:
        naive = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(f"not a Slurm timestamp: {text!r}") from exc
    # scontrol prints local wall time without an offset.
    return naive.astimezone(UTC) if naive.tzinfo is None else naive


# -------------------------------------------------------------------------- hostlists
def expand_hostlist(text: str | None) -> tuple[str, ...]:
    """``gpu[1-2],cpu1`` to ``("gpu1", "gpu2", "cpu1")``; placeholders give ``()``."""
    if text is None or is_empty(text):
        return ()
    try:
        return tuple(hostlist.expand_hostlist(text.strip()))
    except hostlist.BadHostlist as exc:
        raise ValueError(f"not a Slurm hostlist: {text!r}: {exc}") from exc


def compress_hostlist(names: Iterable[str]) -> str:
    """``["gpu1", "gpu2"]`` to ``gpu[1-2]`` (sorted, as Slurm prints them)."""
    return str(hostlist.collect_hostlist(list(names)))


# ------------------------------------------------------------------------------- GRES
@dataclass(frozen=True)
class GresItem:
    """One GRES entry: ``gpu:a100:2(IDX:0-1)`` is ``GresItem("gpu", "a100", 2, (0, 1))``.

    ``indices`` is None when Slurm did not say which devices (a request, a configured
    total); an empty tuple when it said none.
    """

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] | None = None

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.name, self.type)

    def to_slurm(self) -> str:
        """The ``name[:type]:count`` form sbatch/scontrol accept."""
        return ":".join(p for p in (self.name, self.type, str(self.count)) if p)


_GRES_ITEM_RE = re.compile(r"^(?P<body>[^()]+?)(?:\((?P<extra>[^()]*)\))?$")
_COUNT_RE = re.compile(r"^(\d+)([KMGTP]?)$", re.IGNORECASE)
_COUNT_FACTOR = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def split_top_level(text: str) -> list[str]:
    # Commas also separate indices inside "(IDX:0,2-3)", so split only outside brackets.
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


def _parse_count(text: str) -> int | None:
    m = _COUNT_RE.match(text)
    if not m:
        return None
    return int(m.group(1)) * _COUNT_FACTOR[m.group(2).upper()]


def parse_indices(text: str | None) -> tuple[int, ...]:
    """``0-1,3`` to ``(0, 1, 3)``; ``N/A`` or empty to ``()``."""
    if text is None or is_empty(text):
        return ()
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def format_indices(indices: Iterable[int]) -> str:
    """``(0, 1, 2, 4)`` to ``0-2,4`` (Slurm's IDX form); empty to ``""``."""
    vals = sorted(set(indices))
    parts: list[str] = []
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        parts.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ",".join(parts)


def parse_gres(text: str | None) -> tuple[GresItem, ...]:
    """Parse a GRES list as Slurm prints it in node, job and request fields.

    Handles ``gpu:a100:4(S:0-1)`` (configured, with socket affinity), ``gpu:a100:2(IDX:0-1)``
    (in use, with device indices), ``fpga:0`` (a GresType the node lacks), untyped
    ``gpu:2``, a bare ``gpu`` (count 1) and the ``gres:``/``gres/`` prefixes of TRES
    requests (``gres:gpu:a100:2``).
    """
    if text is None or is_empty(text):
        return ()
    items: list[GresItem] = []
    for raw in split_top_level(text.strip()):
        m = _GRES_ITEM_RE.match(raw)
        if not m:
            raise ValueError(f"not a Slurm GRES entry: {raw!r} in {text!r}")
        body, extra = m.group("body"), m.group("extra")
        if body.startswith(("gres:", "gres/")):
            body = body[5:]
        parts = body.split(":")
        count: int | None = 1
        gtype: str | None = None
        if len(parts) >= 2:
            last = _parse_count(parts[-1])
            if last is not None:
                count = last
                parts = parts[:-1]
        if len(parts) > 2:
            raise ValueError(f"not a Slurm GRES entry: {raw!r} in {text!r}")
        name = parts[0]
        if len(parts) == 2:
            gtype = parts[1] or None
        indices: tuple[int, ...] | None = None
        if extra is not None and extra.startswith("IDX:"):
            indices = parse_indices(extra[4:])
        items.append(GresItem(name=name, type=gtype, count=count or 0, indices=indices))
    return tuple(items)


def gres_counts(items: Iterable[GresItem]) -> dict[tuple[str, str | None], int]:
    """Sum counts by ``(name, type)``, dropping zero entries (``fpga:0``)."""
    out: dict[tuple[str, str | None], int] = {}
    for it in items:
        if it.count:
            out[it.key] = out.get(it.key, 0) + it.count
    return out


def gres_indices(items: Iterable[GresItem]) -> dict[tuple[str, str | None], tuple[int, ...]]:
    """Device indices by ``(name, type)``, for entries that carry ``IDX``."""
    out: dict[tuple[str, str | None], tuple[int, ...]] = {}
    for it in items:
        if it.indices:
            out[it.key] = tuple(sorted(set(out.get(it.key, ())) | set(it.indices)))
    return out


# ------------------------------------------------------------------------------- TRES
def parse_tres(text: str | None) -> dict[str, int]:
    """``cpu=8,mem=16000M,gres/gpu:a100=4`` to a dict; memory values become MiB.

    Keys are kept as Slurm names them (``gres/gpu:a100``); a value Slurm could not
    express as a number is skipped.
    """
    if text is None or is_empty(text):
        return {}
    out: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key:
            continue
        if key in ("mem", "fs/disk", "bb") or key.startswith(("mem", "bb/")):
            mem = memory_mib(value)
            if isinstance(mem, int):
                out[key] = mem
            continue
        count = _parse_count(value.strip())
        if count is not None:
            out[key] = count
    return out
