"""``sacct --json`` documents as typed job records: Slurm 22.05's ``openapi/dbv0.0.38`` and
24.11/26.05's ``data_parser/v0.0.42`` (``--json=v0.0.42``), whose job records carry the fields
read here under the same names (the state as a list, :class:`SacctState`).

Decoding is msgspec's: the document is first split into the raw bytes of each element of
its ``jobs`` array (one pass in C, which also proves the whole document is JSON), then each
record is decoded on its own into small typed structs that declare only the fields hetslurm
reads (the rest of sacct's large records, steps included, is skipped in C). So a record of
the wrong shape is one :class:`SacctRecordError` for the caller to skip and count, and a
million-job document never becomes a million nested dicts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

import msgspec

from hetslurm.errors import BackendError
from hetslurm.slurm.parse import TESTED_JSON_PLUGINS, json_data_parser, json_plugin


class SacctDocumentError(BackendError):
    """sacct printed no usable document (empty, garbage, truncated, another schema)."""


class SacctRecordError(BackendError):
    """One job record of a sacct document does not have the 22.05 shape."""


# The fields of a 22.05 job record hetslurm reads (openapi/dbv0.0.38 names); every other
# field is skipped unread. gc=False: these hold only strings, numbers and each other, so
# they can form no cycle and the collector need not track a million of them.
# Integers that fit an int64 column: one out of range is a bad record, not a crash.
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class SacctTres(msgspec.Struct, gc=False):
    """One TRES of a job (``{"type": "gres", "name": "gpu:a100", "count": 2}``)."""

    type: str | None = None
    name: str | None = None
    count: Int64 | float | None = None


class SacctTresGroup(msgspec.Struct, gc=False):
    allocated: list[SacctTres] | None = None


class SacctTime(msgspec.Struct, gc=False):
    """Epoch seconds; 0 is "not yet", NO_VAL and above are Slurm's "no value"."""

    submission: int | float | None = None
    eligible: int | float | None = None
    start: int | float | None = None
    end: int | float | None = None
    elapsed: int | float | None = None


class SacctState(msgspec.Struct, gc=False):
    """22.05: one word; data_parser v0.0.42 (24.11 on): a list, the base state first."""

    current: str | list[str] | None = None

    @property
    def name(self) -> str:
        """The base state (``COMPLETED``), "" when none is recorded."""
        cur = self.current
        if isinstance(cur, list):
            return str(cur[0]) if cur else ""
        return cur or ""


class SacctComment(msgspec.Struct, gc=False):
    administrator: str | None = None
    job: str | None = None


class SacctNumber(msgspec.Struct, gc=False):
    """data_parser v0.0.42's number: ``{"set": true, "infinite": false, "number": 0}``."""

    set: bool | None = None
    infinite: bool | None = None
    number: int | float | None = None


class SacctEnergy(msgspec.Struct, gc=False):
    #: Joules; 22.05 a plain number, 24.11 on a :class:`SacctNumber`. Not range-checked as
    #: Int64: Slurm's NO_VAL64 does not fit one, and means "no value", not a bad record.
    consumed: int | float | SacctNumber | None = None


class SacctStepStatistics(msgspec.Struct, gc=False):
    energy: SacctEnergy | None = None


class SacctEnergyTotals(msgspec.Struct, gc=False):
    #: TRESUsageInTot (sacct's ``energy=`` in it is the step's joules).
    total: list[SacctTres] | None = None


class SacctEnergyTres(msgspec.Struct, gc=False):
    requested: SacctEnergyTotals | None = None


class SacctEnergyStep(msgspec.Struct, gc=False):
    """What a step's record says of its energy (``acct_gather_energy``): ConsumedEnergyRaw
    (``statistics.energy.consumed``) and the ``energy`` TRES of TRESUsageInTot."""

    statistics: SacctStepStatistics | None = None
    tres: SacctEnergyTres | None = None


#: At and above this a 64-bit Slurm number is NO_VAL64/INFINITE64 ("no value").
_NO_VAL64 = 0xFFFFFFFFFFFFFFFE


def _energy_value(v: Any) -> float | None:
    """Joules of one reading; None for Slurm's "no value": unset, infinite, NO_VAL64, a
    negative count (24.11 prints NO_VAL64 as -2 in TRES), and 0, which Slurm writes for every
    step when no ``AcctGatherEnergyType`` gathers energy (a GPU job never uses 0 J)."""
    if isinstance(v, SacctNumber):
        if not v.set or v.infinite:
            return None
        v = v.number
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if not 0 < v < _NO_VAL64:
        return None
    return float(v)


def job_energy_j(steps: list[SacctEnergyStep] | None) -> float | None:
    """The job's energy as Slurm accounted it (joules), None when no step has one.

    A step's figure is its ConsumedEnergyRaw, else the ``energy`` TRES of its
    TRESUsageInTot. The job's is the **largest** step's, not the sum: the batch and extern
    steps each span the allocation and each report the node's energy over it, so a sum would
    count it two or three times (sacct shows the job line equal to its batch and extern
    steps, e.g. ARCHER2's documented ``2658300 4.58M, .batch 4.58M, .extern 4.58M, .0
    4.57M``)."""
    best: float | None = None
    for step in steps or ():
        value = None
        if step.statistics is not None and step.statistics.energy is not None:
            value = _energy_value(step.statistics.energy.consumed)
        if value is None and step.tres is not None and step.tres.requested is not None:
            for t in step.tres.requested.total or ():
                if t.type == "energy":
                    value = _energy_value(t.count)
                    break
        if value is not None and (best is None or value > best):
            best = value
    return best


class SacctJob(msgspec.Struct, gc=False):
    """One run of one job as the accounting database recorded it."""

    job_id: Int64
    time: SacctTime
    name: str | None = None
    user: str | None = None
    account: str | None = None
    partition: str | None = None
    state: SacctState | None = None
    nodes: str | None = None
    constraints: str | None = None
    comment: SacctComment | None = None
    tres: SacctTresGroup | None = None
    steps: list[SacctEnergyStep] | None = None

    @property
    def energy_j(self) -> float | None:
        """:func:`job_energy_j` of the steps."""
        return job_energy_j(self.steps)


# --- what a job used (jobacct_gather/linux, docs/site-config.md "[accounting]") -------------
# Decoded only when asked for (SacctRecords.usage): the audit's million-record pass skips
# steps in C, as before.


class SacctSeconds(msgspec.Struct, gc=False):
    seconds: Int64 | None = None
    microseconds: Int64 | None = None

    @property
    def value(self) -> float:
        return (self.seconds or 0) + (self.microseconds or 0) / 1e6


class SacctStepTime(msgspec.Struct, gc=False):
    #: User + system CPU time of the step (rusage: present whatever the gather plugin).
    total: SacctSeconds | None = None


class SacctTresUsage(msgspec.Struct, gc=False):
    max: list[SacctTres] | None = None
    total: list[SacctTres] | None = None


class SacctStepTres(msgspec.Struct, gc=False):
    #: Slurm's TRESUsageIn* (memory, bytes read) ...
    requested: SacctTresUsage | None = None
    #: ... and TRESUsageOut* (bytes written).
    consumed: SacctTresUsage | None = None


class SacctStep(msgspec.Struct, gc=False):
    time: SacctStepTime | None = None
    tres: SacctStepTres | None = None


class SacctUsageRecord(msgspec.Struct, gc=False):
    job_id: Int64
    steps: list[SacctStep] | None = None


class JobUsage(msgspec.Struct, gc=False, frozen=True):
    """What one job used over all its steps: CPU seconds (user + system), the largest
    resident memory of a task (MiB) and bytes read and written; None where the gather
    plugin recorded nothing (``jobacct_gather/none``, or a step shorter than one sample)."""

    job_id: int
    cpu_s: float
    max_rss_mib: float | None
    disk_read_bytes: int | None
    disk_write_bytes: int | None


def _tres(items: list[SacctTres] | None, type_: str, name: str | None = None) -> int | None:
    for t in items or ():
        if t.type == type_ and (name is None or t.name == name) and isinstance(t.count, int):
            return t.count
    return None


def _usage(rec: SacctUsageRecord) -> JobUsage:
    cpu = 0.0
    rss: list[int] = []
    read: list[int] = []
    written: list[int] = []
    for step in rec.steps or ():
        if step.time is not None and step.time.total is not None:
            cpu += step.time.total.value
        req = step.tres.requested if step.tres else None
        out = step.tres.consumed if step.tres else None
        if req is not None:
            if (m := _tres(req.max, "mem")) is not None:
                rss.append(m)
            if (r := _tres(req.total, "fs", "disk")) is not None:
                read.append(r)
        if out is not None and (w := _tres(out.total, "fs", "disk")) is not None:
            written.append(w)
    return JobUsage(job_id=rec.job_id, cpu_s=round(cpu, 6),
                    max_rss_mib=max(rss) / 2**20 if rss else None,
                    disk_read_bytes=sum(read) if read else None,
                    disk_write_bytes=sum(written) if written else None)


_decode_usage = msgspec.json.Decoder(SacctUsageRecord).decode


class _Document(msgspec.Struct):
    jobs: list[msgspec.Raw] | None = None
    meta: Any = None


_decode_job = msgspec.json.Decoder(SacctJob).decode


class SacctRecords:
    """The job records of one sacct document, each decoded when asked for."""

    def __init__(self, raws: list[msgspec.Raw]) -> None:
        self.raws = raws

    def __len__(self) -> int:
        return len(self.raws)

    @staticmethod
    def decode(raw: msgspec.Raw) -> SacctJob:
        """One record; :class:`SacctRecordError` when it is not a 22.05 job record."""
        try:
            return _decode_job(raw)
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise SacctRecordError(str(exc)) from None

    @staticmethod
    def usage(raw: msgspec.Raw) -> JobUsage:
        """What one record's job used (its steps' CPU time, memory, IO); a
        :class:`SacctRecordError` when the record does not have that shape."""
        try:
            return _usage(_decode_usage(raw))
        except (msgspec.MsgspecError, RecursionError) as exc:
            raise SacctRecordError(str(exc)) from None

    def plain(self) -> Iterator[Any]:
        """Each record as plain Python objects (dicts and lists), undecoded by type."""
        for raw in self.raws:
            yield msgspec.json.decode(raw)


def parse_sacct_document(text: str | bytes) -> SacctRecords:
    """Split a ``sacct --json`` document into its job records.

    Raises :class:`SacctDocumentError` with one clear sentence when the document is not a
    JSON object with a ``jobs`` array (empty, garbage, truncated, not JSON), or declares a
    schema other than 22.05's.
    """
    head = text[:4096].lstrip()
    if head[:1] not in ("{", b"{"):
        raise SacctDocumentError("sacct output is not a JSON object (does this sacct speak "
                                 "--json? it needs Slurm 21.08 or later)")
    try:
        doc = msgspec.json.decode(text, type=_Document)
    except msgspec.ValidationError as exc:
        raise SacctDocumentError(f"sacct output has no 'jobs' array ({exc})") from exc
    except RecursionError as exc:
        raise SacctDocumentError("sacct output is nested too deeply to read") from exc
    except msgspec.DecodeError as exc:
        if "truncated" in str(exc):
            raise SacctDocumentError("sacct output ends in the middle of the document") from exc
        raise SacctDocumentError(f"sacct output is not valid JSON: {exc}") from exc
    if doc.jobs is None:
        raise SacctDocumentError("sacct output has no 'jobs' array")
    meta = {"meta": doc.meta}
    for name in (json_plugin(meta), json_data_parser(meta)):
        # A newer Slurm's records differ in shape and meaning (states as lists, times as
        # objects): refused whole rather than misread record by record.
        if name is not None and name not in TESTED_JSON_PLUGINS:
            raise SacctDocumentError(
                f"sacct output is schema {name[:80]!r}, which hetslurm does not read (it "
                f"reads {', '.join(sorted(TESTED_JSON_PLUGINS))}: Slurm 22.05, and "
                "--json=v0.0.42 of 24.11 and 26.05)")
    return SacctRecords(doc.jobs)


class _ScriptJob(msgspec.Struct, gc=False):
    job_id: Int64
    script: str | None = None


class _ScriptDocument(msgspec.Struct, gc=False):
    jobs: list[_ScriptJob] | None = None


def parse_sacct_scripts(text: str | bytes) -> dict[int, str | None]:
    """``sacct --json --batch-script -j ID,...`` (data_parser v0.0.42): job id -> the stored
    script, None where the record's ``script`` is missing or empty (none stored).

    Raises :class:`SacctDocumentError` when the output is not such a document.
    """
    try:
        doc = msgspec.json.decode(text, type=_ScriptDocument)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        raise SacctDocumentError(f"sacct --batch-script output is not a job list: "
                                 f"{str(exc)[:160]}") from exc
    if doc.jobs is None:
        raise SacctDocumentError("sacct --batch-script output has no 'jobs' array")
    return {j.job_id: (j.script or None) for j in doc.jobs}
