"""The hook's decision record, decoded once into a typed object.

``job_submit/hethook.lua`` (``record_segment``) writes one namespaced segment into the job's
record field (AdminComment by default): ``hetslurm:{"v":1,"rules":"...","mode":"enforce",
"src":"script","outcome":"rewrite","class":"train","gpu":"h100|a100","set":"...",
"kept":"...","on_idle":"...","energy":"low","req":"gpus=2 class=train"}`` — a flat JSON object
whose values hold no quote or brace, optional fields dropped from the end when it would exceed
the site's ``record_max_bytes`` (docs/hook.md). This module is the only reader: ``act``
(requeue-stalled, relax, downgrade), ``explain`` and the audit all take a
:class:`DecisionRecord` from :func:`find_record`.

Versions: ``v`` 1 is the format above (every record the hook has written). A record of a later
version is decoded for the fields this reader knows (a newer hook only adds fields), and
:attr:`DecisionRecord.version` says which it was.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetslurm.request.language import Request

#: The record version this reader was written for.
RECORD_VERSION = 1

#: One segment: ``<key>:{...}`` at the start of the field or after white space.
_SEGMENT = re.compile(r"(?:^|\s)([a-z][a-z0-9_-]{0,31}):(\{[^{}]*\})")

# JSON name -> attribute, for the string fields (every value of the record is a string but v).
_TEXT = {"rules": "rules", "mode": "mode", "src": "source", "outcome": "outcome",
         "class": "workload_class", "gpu": "gpu", "fpga": "fpga", "on_idle": "on_idle",
         "energy": "energy", "req": "request", "infer": "inferred_class",
         "how": "classified"}
_LISTS = {"set": "set_fields", "kept": "kept"}


@dataclass(frozen=True)
class DecisionRecord:
    """What the hook decided for one job (absent fields are ``None`` or empty).

    Attributes:
        version: the record's ``v``.
        rules: digest of the site rules the hook ran with.
        mode: ``enforce`` or ``shadow`` (shadow decided and logged, wrote nothing else).
        source: where the request came from: ``script`` (#HET lines) or ``comment``.
        outcome: ``rewrite`` (the only outcome written today).
        workload_class: the request's ``class=``.
        gpu: the GPU models decided as the hook wrote them (``h100|a100``, ``a100``, ``any``).
        fpga: likewise for FPGAs.
        set_fields: the job fields the hook wrote, in order.
        kept: the fields the job's own options kept over the request.
        on_idle: the request's ``on-idle=``.
        energy: the request's ``energy=`` when not ``normal``.
        request: the request in canonical form (``format_request``'s text).
        inferred_class: the class the site's ``[classify]`` rules gave a job that named none.
        classified: how that class was used: ``suggest`` (the user was told) or ``apply``
            (the job was decided with it; ``workload_class`` is then that class).
    """

    version: int
    rules: str | None = None
    mode: str = "enforce"
    source: str | None = None
    outcome: str | None = None
    workload_class: str | None = None
    gpu: str | None = None
    fpga: str | None = None
    set_fields: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    on_idle: str | None = None
    energy: str | None = None
    request: str | None = None
    inferred_class: str | None = None
    classified: str | None = None

    @property
    def declared_class(self) -> str | None:
        """The class the job itself named (``None`` when none, or when the hook applied
        one from the site's classification rules)."""
        return None if self.classified == "apply" else self.workload_class

    @property
    def enforced(self) -> bool:
        """The hook rewrote the job in enforce mode: Slurm holds what the record says."""
        return self.outcome == "rewrite" and self.mode == "enforce"

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """The decided GPU models in order (empty for ``any`` or none)."""
        return () if self.gpu in (None, "any") else tuple(self.gpu.split("|"))

    def parsed(self) -> Request | None:
        """The recorded request parsed by the grammar (``None``: absent, or not a request)."""
        return _parse(self.request) if self.request else None


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> Request | None:
    from hetslurm.errors import PlacementError
    from hetslurm.request.language import parse_request

    try:
        return parse_request(text)
    except PlacementError:
        return None


def find_record(text: str | None, key: str = "hetslurm") -> DecisionRecord | None:
    """The hook's ``<key>:{...}`` segment of a record field's ``text``, decoded.

    ``None`` when there is none, when the field holds the marker more than once (the hook
    refuses a second one since issue 18; which segment is the hook's cannot be told, so
    neither is trusted), or when the segment is not a record (not a flat JSON object, ``v``
    missing or not a positive integer, a field of the wrong type). Never raises.
    """
    if not text or key + ":{" not in text:
        return None
    if text.count(key + ":{") > 1:
        return None
    for m in _SEGMENT.finditer(text):
        if m.group(1) == key:
            return _decode(m.group(2))
    return None


def _decode(segment: str) -> DecisionRecord | None:
    try:
        raw = json.loads(segment)
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    v = raw.get("v")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        return None
    out: dict[str, Any] = {"version": v}
    for name, attr in _TEXT.items():
        value = raw.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return None
        out[attr] = value
    for name, attr in _LISTS.items():
        value = raw.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            return None
        out[attr] = tuple(f for f in value.split(",") if f)
    return DecisionRecord(**out)
