"""Pure parsers from Slurm 22.05 output to the typed values of :mod:`.backend`.

No subprocess here: the CLI backend feeds these the text it ran, and tests and the lab's
fake Slurm feed them the recordings in ``tests/data/slurm/``. Only the fields hetslurm
uses are read; fields Slurm adds are ignored.

Tested schema: ``squeue --json`` and ``sinfo --json`` with ``meta.plugin.type ==
"openapi/v0.0.38"``, ``sacct --json`` with ``"openapi/dbv0.0.38"``, all from Slurm
22.05.8 (``meta.Slurm.release``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from hetslurm.errors import BackendError
from hetslurm.slurm import units
from hetslurm.slurm.backend import (
    Association,
    ControllerStats,
    JobInfo,
    NodeInfo,
    OutputFiles,
    PartitionInfo,
    QosInfo,
    RpcStats,
    Switches,
    SwitchInfo,
)
from hetslurm.slurm.units import GresItem

#: JSON plugin versions these parsers were checked against.
TESTED_JSON_PLUGINS = frozenset({"openapi/v0.0.38", "openapi/dbv0.0.38",
                                 "data_parser/v0.0.42"})
#: What each schema is, for the message that refuses another one.
_SCHEMAS = "v0.0.38 (Slurm 22.05) or data_parser v0.0.42 (--json=v0.0.42 on 24.11 and 26.05)"

_T = TypeVar("_T")
#: The latest time a Slurm record can hold as a time (epoch seconds): larger values are
#: sentinels (NO_VAL and above) or garbage, and datetime cannot hold most of them.
_MAX_EPOCH = units.NO_VAL - 1

# A key in `scontrol show ... -o` output: a word that follows whitespace and precedes '='.
# Values may hold spaces (Comment=, Reason=, OS=) and '=' (TRES=cpu=1,...), so a value runs
# to the next such key. Free text that itself contains " Word=" cannot be told apart.
_KEY_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z_][A-Za-z0-9_:/.]*)=")
# scontrol appends who set a node's reason and when: "bad fan [root@2026-11-30T02:53:03]".
_REASON_SUFFIX_RE = re.compile(r"\s*\[[^\[\]@]*@[^\[\]]*\]\s*$")


# ------------------------------------------------------------------------ JSON documents
def load_json_document(text: str | bytes, *, what: str) -> dict[str, Any]:
    """Parse a ``--json`` document; refuse one that is not a JSON object, whose ``errors``
    list is not empty, or that declares a schema these parsers were not checked against
    (:data:`TESTED_JSON_PLUGINS`; a document that declares none is read as 22.05's)."""
    if isinstance(text, bytes):
        # Slurm prints a job's name and comments as the user gave them: not always UTF-8.
        text = text.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except RecursionError as exc:
        raise BackendError(f"{what} printed JSON nested too deeply to read") from exc
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise BackendError(f"{what} did not print JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BackendError(f"{what} printed JSON that is not an object")
    errors = doc.get("errors") or []
    if errors:
        raise BackendError(f"{what} reported errors: {str(errors)[:500]}")
    # With a data_parser named, it alone decides the schema: the plugin type is then the
    # server's ("" from the CLIs, "openapi/slurmctld" from slurmrestd).
    parser = json_data_parser(doc)
    for name in (parser,) if parser is not None else (json_plugin(doc),):
        if name is not None and name not in TESTED_JSON_PLUGINS:
            raise BackendError(
                f"{what} printed schema {name[:80]!r}, which hetslurm does not read (it "
                f"reads {_SCHEMAS})")
    return doc


def _meta_plugin(doc: Mapping[str, Any], key: str) -> str | None:
    meta = doc.get("meta")
    plugin = meta.get("plugin") if isinstance(meta, Mapping) else None
    value = plugin.get(key) if isinstance(plugin, Mapping) else None
    return str(value) if value else None


def json_plugin(doc: Mapping[str, Any]) -> str | None:
    """The ``meta.plugin.type`` of a ``--json`` document (``openapi/v0.0.38`` on 22.05)."""
    return _meta_plugin(doc, "type")


def json_data_parser(doc: Mapping[str, Any]) -> str | None:
    """The ``meta.plugin.data_parser`` (Slurm 23.02 and later, ``data_parser/v0.0.39``...);
    22.05 prints none."""
    return _meta_plugin(doc, "data_parser")


class _Record:
    """Typed reads of one JSON record's fields. Missing, ``null`` and Slurm's NO_VAL /
    INFINITE sentinels are None (what the field's reader says they mean); a value of the
    wrong type, out of range or unparseable is a :class:`BackendError` that names the
    record and the field, never a raw ``ValueError``/``TypeError`` from deeper down."""

    def __init__(self, rec: Any, what: str, v42: bool = False) -> None:
        if not isinstance(rec, Mapping):
            raise BackendError(f"{what} is {type(rec).__name__}, not a JSON object")
        self.rec = rec
        self.what = what
        #: The record is data_parser v0.0.42's (24.11, 26.05): numbers may be
        #: ``{"set", "infinite", "number"}`` objects and some strings are lists.
        self.v42 = v42

    def fail(self, key: str, why: str) -> NoReturn:
        raise BackendError(f"{self.what}: field '{key}' {why}")

    def _shown(self, key: str) -> str:
        return repr(self.rec.get(key))[:60]

    def _number(self, key: str) -> Any:
        """The field's value; v0.0.42's ``{"set", "infinite", "number"}`` object becomes its
        number, or None when not set, or Slurm's INFINITE when infinite."""
        v = self.rec.get(key)
        if self.v42 and isinstance(v, Mapping) and "number" in v:
            if v.get("infinite") is True:
                return units.INFINITE
            if v.get("set") is False:
                return None
            v = v.get("number")
        return v

    def uint(self, key: str, bits: int = 32) -> int | None:
        """An unsigned count or id: sentinels and null give None."""
        v = self._number(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"is {self._shown(key)}, not an integer")
        if not 0 <= v < 2**bits:
            self.fail(key, f"is {self._shown(key)}, outside 0..2^{bits}-1")
        return units.int_or_none(v, bits)

    def required_int(self, key: str) -> int:
        v = self.uint(key)
        if v is None:
            self.fail(key, "is missing (or Slurm's 'no value')")
        return v

    def time(self, key: str) -> datetime | None:
        """An epoch time: 0, null and sentinels give None."""
        v = self._number(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(key, f"is {self._shown(key)}, not an epoch time")
        if v < 0 or (v > _MAX_EPOCH and v not in (units.NO_VAL, units.INFINITE,
                                                 units.NO_VAL64, units.INFINITE64)):
            self.fail(key, f"is {self._shown(key)}, not an epoch time")
        return units.from_epoch(v)

    def string(self, key: str) -> str | None:
        v = self.rec.get(key)
        if v is None or isinstance(v, str):
            return v
        self.fail(key, f"is {self._shown(key)}, not a string")

    def words(self, key: str) -> list[str]:
        """A list of words, or one string of them joined by commas (22.05's ``features``,
        v0.0.42's lists)."""
        if self.v42 and isinstance(self.rec.get(key), list):
            return self.strings(key)
        return list(_split_list(self.string(key)))

    def text(self, key: str) -> str | None:
        """A string with Slurm's placeholders (``(null)``, ``N/A``...) as None."""
        return units.text_or_none(self.string(key))

    def flag(self, key: str, default: bool) -> bool:
        v = self.rec.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            self.fail(key, f"is {self._shown(key)}, not true or false")
        return v

    def strings(self, key: str) -> list[str]:
        v = self.rec.get(key)
        if v is None:
            return []
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self.fail(key, f"is {self._shown(key)}, not a list of strings")
        return v

    def records(self, key: str) -> list[Any]:
        v = self.rec.get(key)
        if v is None:
            return []
        if not isinstance(v, list):
            self.fail(key, f"is {self._shown(key)}, not a list")
        return v

    def parsed(self, key: str, fn: Callable[[str | None], _T]) -> _T:
        """``fn`` of the field's string; its ValueError names the field."""
        try:
            return fn(self.string(key))
        except ValueError as exc:
            self.fail(key, f"cannot be read: {str(exc)[:120]}")


def _split_list(text: str | None) -> tuple[str, ...]:
    if text is None or units.is_empty(text):
        return ()
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _node_from_parts(
    *,
    name: str,
    state: frozenset[str],
    reason: str | None,
    features: str | None,
    active_features: str | None,
    weight: int | None,
    cpus_total: int | None,
    cpus_alloc: int | None,
    memory_total: int | None,
    memory_alloc: int | None,
    partitions: Iterable[str],
    gres: str | None,
    gres_used: str | None,
    sockets: int | None = None,
    cores_per_socket: int | None = None,
    threads_per_core: int | None = None,
    cpu_load: float | None = None,
) -> NodeInfo:
    used = units.parse_gres(gres_used)
    return NodeInfo(
        name=name,
        state=state,
        reason=reason,
        features=_split_list(features),
        active_features=_split_list(active_features),
        weight=units.int_or_none(weight) or 1,
        cpus_total=units.int_or_none(cpus_total) or 0,
        cpus_alloc=units.int_or_none(cpus_alloc) or 0,
        memory_total_mib=units.int_or_none(memory_total, 64) or 0,
        memory_alloc_mib=units.int_or_none(memory_alloc, 64) or 0,
        partitions=tuple(partitions),
        gres_total=units.gres_counts(units.parse_gres(gres)),
        gres_used=units.gres_counts(used),
        gres_used_indices=units.gres_indices(used),
        sockets=units.int_or_none(sockets) or None,
        cores_per_socket=units.int_or_none(cores_per_socket) or None,
        threads_per_core=units.int_or_none(threads_per_core) or None,
        cpu_load=cpu_load,
    )


def parse_node_state(text: str) -> frozenset[str]:
    """``MIXED+DRAIN`` (scontrol) or ``IDLE*`` (sinfo) to ``{"MIXED", "DRAIN"}``.

    sinfo's trailing ``*`` means not responding; scontrol spells it as a flag.
    """
    out: set[str] = set()
    for part in text.strip().upper().split("+"):
        if part.endswith("*"):
            out.add("NOT_RESPONDING")
            part = part.rstrip("*")
        if part:
            out.add(part)
    return frozenset(out)


def parse_sinfo_json(text: str | bytes, what: str = "sinfo --json") -> list[NodeInfo]:
    """Nodes from 22.05's ``sinfo --json`` (one entry per node, filters ignored) or from
    ``scontrol show node --json=v0.0.42`` (24.11, 26.05: states and features as lists).

    Raises:
        BackendError: also for 24.11+'s ``sinfo --json``, which groups nodes and has no
            per-node record (never read as "0 nodes").
    """
    doc = load_json_document(text, what=what)
    if "nodes" not in doc and "sinfo" in doc:
        raise BackendError(f"{what} printed grouped records (Slurm 24.11 and later) with no "
                           "per-node data; hetslurm reads nodes there with scontrol show "
                           "node --json")
    v42 = json_data_parser(doc) is not None
    out = []
    for i, raw in enumerate(_document_list(doc, "nodes", what)):
        n = _Record(raw, f"{what} node {i}", v42)
        name = n.text("name")
        if name is None:
            n.fail("name", "is missing")
        n.what = f"{what} node {name[:60]!r}"
        # 22.05: a base state and state_flags; v0.0.42: one list of upper-case words.
        state = {w.upper() for w in n.words("state")} or {"UNKNOWN"}
        state.update(f.upper() for f in n.strings("state_flags"))
        gres, gres_used = n.string("gres"), n.string("gres_used")
        n.parsed("gres", units.parse_gres)
        n.parsed("gres_used", units.parse_gres)
        out.append(
            _node_from_parts(
                name=name,
                state=frozenset(state),
                reason=n.text("reason"),
                features=",".join(n.words("features")),
                active_features=",".join(n.words("active_features")),
                weight=n.uint("weight"),
                cpus_total=n.uint("cpus"),
                cpus_alloc=n.uint("alloc_cpus"),
                memory_total=n.uint("real_memory", 64),
                memory_alloc=n.uint("alloc_memory", 64),
                partitions=n.strings("partitions"),
                gres=gres,
                gres_used=gres_used,
                # "cores" is per socket in both 22.05's sinfo and v0.0.42 (cpus = 8,
                # sockets = 2, cores = 4 in tests/data/slurm/24.11/scontrol-show-node.json).
                sockets=n.uint("sockets"),
                cores_per_socket=n.uint("cores"),
                threads_per_core=n.uint("threads"),
                # A load average times 100 in 22.05's sinfo and in v0.0.42 (211 = 2.11;
                # scontrol's text of the same node prints CPULoad=2.11).
                cpu_load=_hundredths(n.uint("cpu_load")),
            )
        )
    return out


def _hundredths(value: int | None) -> float | None:
    return None if value is None else value / 100.0


def _document_list(doc: Mapping[str, Any], key: str, what: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise BackendError(f"{what}: '{key}' is {type(value).__name__}, not a list")
    return value


def _tres_items(value: str | None) -> tuple[GresItem, ...]:
    # tres_per_* hold GRES requests as "gres:gpu:a100:2"; other TRES (e.g. "license/x")
    # are not devices hetslurm places, so only the gres ones are kept.
    if value is None or units.is_empty(value):
        return ()
    parts = [p for p in units.split_top_level(value) if p.startswith(("gres:", "gres/"))]
    return units.parse_gres(",".join(parts)) if parts else ()


def _json_job(raw: Any, pos: int = 0, v42: bool = False) -> JobInfo:
    j = _Record(raw, f"squeue --json job {pos}", v42)
    job_id = j.required_int("job_id")
    j.what = f"squeue --json job {job_id}"
    array_job_id = j.uint("array_job_id")
    het_job_id = j.uint("het_job_id")
    nodes = j.parsed("nodes", units.expand_hostlist)
    allocated: dict[str, tuple[GresItem, ...]] = {}
    resources = j.rec.get("job_resources")
    if resources is not None and not isinstance(resources, Mapping):
        j.fail("job_resources", f"is {j._shown('job_resources')}, not an object")
    res = _Record(resources or {}, f"{j.what} job_resources", v42)
    # 22.05: allocated_nodes[*].nodename; v0.0.42: nodes.allocation[*].name.
    alloc_nodes = [
        _Record(a, f"{j.what} job_resources.allocated_nodes[{i}]").text("nodename")
        for i, a in enumerate(res.records("allocated_nodes"))
    ] or [
        _Record(a, f"{j.what} job_resources.nodes.allocation[{i}]").text("name")
        for i, a in enumerate(_Record(res.rec.get("nodes") or {}, res.what).records("allocation"))
    ]
    # gres_detail has one entry per allocated node, in the order of job_resources'
    # allocated_nodes; `scontrol show job -d` names the nodes explicitly and is preferred
    # by the CLI backend.
    for i, entry in enumerate(j.strings("gres_detail")):
        node = alloc_nodes[i] if i < len(alloc_nodes) else (nodes[i] if i < len(nodes) else None)
        try:
            items = tuple(it for it in units.parse_gres(entry) if it.count)
        except ValueError as exc:
            j.fail("gres_detail", f"cannot be read: {str(exc)[:120]}")
        if node and items:
            allocated[node] = items
    limit_min = j.uint("time_limit")
    # null is unlimited here (see units.minutes_limit); so is INFINITE, and NO_VAL unknown.
    raw_limit = j._number("time_limit")
    limit = units.minutes_limit(raw_limit if limit_min is None else limit_min)
    return JobInfo(
        job_id=job_id,
        name=j.string("name") or "",
        user=j.text("user_name"),
        account=j.text("account"),
        partition=j.text("partition"),
        qos=j.text("qos"),
        # 22.05: one word; v0.0.42: a list, the base state first, then flags.
        state=(next(iter(j.words("job_state")), None) or "UNKNOWN").upper(),
        reason=j.text("state_reason"),
        array_job_id=array_job_id or None,
        array_task_id=j.uint("array_task_id") if array_job_id else None,
        array_task_spec=j.text("array_task_string"),
        het_job_id=het_job_id or None,
        het_job_offset=j.uint("het_job_offset") if het_job_id else None,
        tres_per_node=j.parsed("tres_per_node", _tres_items),
        tres_per_job=j.parsed("tres_per_job", _tres_items),
        tres_per_task=j.parsed("tres_per_task", _tres_items),
        allocated_gres=allocated,
        nodes=nodes,
        submit_time=j.time("submit_time"),
        eligible_time=j.time("eligible_time"),
        start_time=j.time("start_time"),
        end_time=j.time("end_time"),
        time_limit=limit,
        # Missing or a sentinel is unknown, not 0: a 0 would pass the requeue cap unchecked.
        restarts=j.uint("restart_cnt"),
        batch=j.flag("batch_flag", True),
        requeue=j.flag("requeue", True),
        comment=j.text("comment"),
        admin_comment=j.text("admin_comment"),
        features=j.text("features"),
        prefer=j.text("prefer"),
    )


def parse_squeue_json(text: str | bytes) -> list[JobInfo]:
    """Jobs from ``squeue --json`` (22.05: every job the controller holds, any state)."""
    return parse_squeue_json_checked(text)[0]


#: squeue --json fields a user writes freely; ``scontrol show job -o`` prints them unescaped.
_FREE_TEXT = ("name", "comment", "admin_comment", "command", "current_working_directory",
              "standard_output", "standard_error", "standard_input",
              # 26.05 prints the user's raw command line as SubmitLine=, unescaped.
              "submit_line")


def parse_squeue_json_checked(text: str | bytes) -> tuple[list[JobInfo], set[int]]:
    """Jobs from ``squeue --json``, and the ids of jobs whose free text (name, comments,
    command, paths) holds a line break or ``Key=`` text naming a field the parser reads.

    ``scontrol show job -o`` prints those fields unescaped, so such a job's scontrol line can
    carry forged ``Key=value`` pairs (or a forged line for another job): its scontrol detail
    must not be trusted (see :func:`trusted_details`).
    """
    doc = load_json_document(text, what="squeue --json")
    raw = _document_list(doc, "jobs", "squeue --json")
    v42 = json_data_parser(doc) is not None
    jobs = [_json_job(j, i, v42) for i, j in enumerate(raw)]
    risky = {
        job.job_id for job, j in zip(jobs, raw, strict=True)
        if any(isinstance(j.get(k), str) and _could_forge(j[k]) for k in _FREE_TEXT)
    }
    return jobs, risky


#: The keys of a ``scontrol show job -d -o`` line that :func:`parse_scontrol_jobs` reads.
_JOB_KEYS_READ = frozenset((
    "JobId", "ArrayJobId", "ArrayTaskId", "HetJobId", "HetJobOffset", "JobName", "UserId",
    "Account", "Partition", "QOS", "JobState", "Reason", "TresPerNode", "TresPerJob",
    "TresPerTask", "JOB_GRES", "Nodes", "CPU_IDs", "Mem", "GRES", "NodeList", "SubmitTime",
    "EligibleTime", "StartTime", "EndTime", "TimeLimit", "Restarts", "BatchFlag", "Requeue",
    "Comment", "AdminComment", "Features", "Prefer", "Switches"))


def _could_forge(value: str) -> bool:
    """Whether free text printed unescaped on a scontrol line could pass for a field the
    parser reads (``Restarts=0`` after a blank, or a line break). Other ``word=`` text, such
    as the hook's own ``"req":"gpus=2 class=train"`` record, cannot."""
    if "\n" in value or "\r" in value:
        return True
    return any(m.group(1) in _JOB_KEYS_READ for m in _KEY_RE.finditer(value))


def trusted_details(details: list[JobInfo], risky: set[int]) -> dict[int, JobInfo]:
    """scontrol detail records by job id, without the untrusted ones: jobs whose free text
    could forge fields (``risky``) and ids that appear on more than one line (a line break
    in some job's free text can start a forged line for any id)."""
    seen: dict[int, int] = {}
    for d in details:
        seen[d.job_id] = seen.get(d.job_id, 0) + 1
    return {d.job_id: d for d in details if seen[d.job_id] == 1 and d.job_id not in risky}


#: Keys ``scontrol show job -o`` prints exactly once per job; seeing one twice means some
#: free text on the line holds ``Key=value`` (``-d`` groups Nodes/CPU_IDs/Mem/GRES repeat).
_UNIQUE_JOB_KEYS = ("JobId", "JobName", "UserId", "JobState", "Restarts", "BatchFlag",
                    "Requeue", "NodeList", "SubmitTime", "StartTime", "EndTime", "Partition",
                    "TimeLimit", "Comment", "AdminComment", "TresPerNode")


def ambiguous_scontrol_job(text: str) -> str | None:
    """Why a ``scontrol show job -o`` output cannot be trusted field by field, or None."""
    for rec in scontrol_records(text):
        counts: dict[str, int] = {}
        for k, _v in rec:
            counts[k] = counts.get(k, 0) + 1
        twice = [k for k in _UNIQUE_JOB_KEYS if counts.get(k, 0) > 1]
        if twice:
            return f"a line prints {', '.join(twice)} more than once (free text holds Key=value)"
        if "JobId" not in counts:
            return "a line without JobId (free text holds a line break)"
    return None


# ------------------------------------------------------------------- scontrol -o records
def scontrol_pairs(line: str) -> list[tuple[str, str]]:
    """One ``scontrol show ... -o`` line to ordered ``(key, value)`` pairs.

    Keys can repeat: with ``-d`` a job line holds one ``Nodes= CPU_IDs= Mem= GRES=`` group
    per set of nodes, so this returns a list, not a dict.
    """
    matches = list(_KEY_RE.finditer(line))
    out = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.append((m.group(1), line[m.end() : end].strip()))
    return out


def scontrol_records(text: str) -> list[list[tuple[str, str]]]:
    """Every non-empty line of ``scontrol show ... -o`` output as pairs."""
    return [scontrol_pairs(line) for line in text.splitlines() if line.strip()]


def _first(pairs: list[tuple[str, str]], key: str) -> str | None:
    for k, v in pairs:
        if k == key:
            return v
    return None


def _int(text: str | None) -> int | None:
    if text is None or units.is_empty(text):
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _node_reason(text: str | None) -> str | None:
    if text is None:
        return None
    return units.text_or_none(_REASON_SUFFIX_RE.sub("", text))


def parse_scontrol_nodes(text: str) -> list[NodeInfo]:
    """Nodes from ``scontrol show node -d -o`` (``GresUsed`` carries the IDX lists)."""
    out = []
    for rec in scontrol_records(text):
        name = _first(rec, "NodeName")
        if not name:
            continue
        mem_alloc = _first(rec, "AllocMem")
        out.append(
            _node_from_parts(
                name=name,
                state=parse_node_state(_first(rec, "State") or "UNKNOWN"),
                reason=_node_reason(_first(rec, "Reason")),
                features=_first(rec, "AvailableFeatures"),
                active_features=_first(rec, "ActiveFeatures"),
                weight=_int(_first(rec, "Weight")),
                cpus_total=_int(_first(rec, "CPUTot")),
                cpus_alloc=_int(_first(rec, "CPUAlloc")),
                memory_total=_int(_first(rec, "RealMemory")),
                memory_alloc=_int(mem_alloc),
                partitions=_split_list(_first(rec, "Partitions")),
                gres=_first(rec, "Gres"),
                gres_used=_first(rec, "GresUsed"),
                sockets=_int(_first(rec, "Sockets")),
                cores_per_socket=_int(_first(rec, "CoresPerSocket")),
                threads_per_core=_int(_first(rec, "ThreadsPerCore")),
                cpu_load=_load(_first(rec, "CPULoad")),
            )
        )
    return out


def _load(text: str | None) -> float | None:
    """``CPULoad=2.11`` (``N/A`` before the node registered): None where it is no number."""
    if text is None or units.is_empty(text):
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) and v >= 0 else None


def _user_name(text: str | None) -> str | None:
    # scontrol prints "UserId=root(0)".
    if text is None or units.is_empty(text):
        return None
    return text.split("(", 1)[0] or None


def _node_groups(pairs: list[tuple[str, str]], key: str) -> Iterator[tuple[tuple[str, ...], str]]:
    """The nodes and ``key``'s value of each ``Nodes=... key=...`` group of ``-d``."""
    current: tuple[str, ...] = ()
    for k, value in pairs:
        if k == "Nodes":
            current = units.expand_hostlist(value)
        elif k == key and current:
            yield current, value


def parse_job_gres_detail(pairs: list[tuple[str, str]]) -> dict[str, tuple[GresItem, ...]]:
    """Per-node devices from the ``Nodes=... GRES=gpu:a100:2(IDX:0-1)`` groups of ``-d``."""
    out: dict[str, tuple[GresItem, ...]] = {}
    for nodes, value in _node_groups(pairs, "GRES"):
        items = tuple(it for it in units.parse_gres(value) if it.count)
        if items:
            out.update(dict.fromkeys(nodes, items))
    return out


def parse_job_cpu_ids(pairs: list[tuple[str, str]]) -> dict[str, tuple[int, ...]]:
    """Per-node CPU ids from the ``Nodes=gpu[1-2] CPU_IDs=0-3,6`` groups of ``-d``.

    A group names every node it covers, and each of them holds the same ids.
    """
    out: dict[str, tuple[int, ...]] = {}
    for nodes, value in _node_groups(pairs, "CPU_IDs"):
        try:
            ids = tuple(sorted(set(units.parse_indices(value))))
        except ValueError as e:
            raise BackendError(f"scontrol printed CPU_IDs={value!r}: {e}") from e
        out.update(dict.fromkeys(nodes, ids))
    return out


def parse_scontrol_jobs(text: str) -> list[JobInfo]:
    """Jobs from ``scontrol show job -d -o``.

    A line whose per-node ``GRES=`` or ``CPU_IDs=`` does not parse is left out: scontrol
    prints free text unescaped (26.05's ``SubmitLine=`` repeats a comment's line breaks and
    ``Key=value`` words, then the rest of the command line), so such a line is not Slurm's
    to believe; the access layer then keeps the JSON's record of that job.
    """
    out = []
    for rec in scontrol_records(text):
        job_id = _int(_first(rec, "JobId"))
        if job_id is None:
            continue
        try:
            allocated_gres = parse_job_gres_detail(rec)
            cpu_ids = parse_job_cpu_ids(rec)
        except (ValueError, BackendError):
            continue
        array_job_id = _int(_first(rec, "ArrayJobId"))
        array_task_raw = _first(rec, "ArrayTaskId")
        array_task_id = _int(array_task_raw)
        het_job_id = _int(_first(rec, "HetJobId"))
        out.append(
            JobInfo(
                job_id=job_id,
                name=_first(rec, "JobName") or "",
                user=_user_name(_first(rec, "UserId")),
                account=units.text_or_none(_first(rec, "Account")),
                partition=units.text_or_none(_first(rec, "Partition")),
                qos=units.text_or_none(_first(rec, "QOS")),
                state=(_first(rec, "JobState") or "UNKNOWN").upper(),
                reason=units.text_or_none(_first(rec, "Reason")),
                array_job_id=array_job_id,
                array_task_id=array_task_id,
                array_task_spec=(
                    array_task_raw if array_task_raw is not None and array_task_id is None else None
                ),
                het_job_id=het_job_id,
                het_job_offset=_int(_first(rec, "HetJobOffset")) if het_job_id else None,
                tres_per_node=_tres_items(_first(rec, "TresPerNode")),
                tres_per_job=_tres_items(_first(rec, "TresPerJob")),
                tres_per_task=_tres_items(_first(rec, "TresPerTask")),
                allocated_gres=allocated_gres,
                cpu_ids=cpu_ids,
                nodes=units.expand_hostlist(_first(rec, "NodeList")),
                submit_time=units.parse_datetime(_first(rec, "SubmitTime")),
                eligible_time=units.parse_datetime(_first(rec, "EligibleTime")),
                start_time=units.parse_datetime(_first(rec, "StartTime")),
                end_time=units.parse_datetime(_first(rec, "EndTime")),
                time_limit=units.time_seconds(_first(rec, "TimeLimit")),
                restarts=_int(_first(rec, "Restarts")),
                batch=_first(rec, "BatchFlag") != "0",
                requeue=_first(rec, "Requeue") != "0",
                comment=units.text_or_none(_first(rec, "Comment")),
                admin_comment=units.text_or_none(_first(rec, "AdminComment")),
                features=units.text_or_none(_first(rec, "Features")),
                prefer=units.text_or_none(_first(rec, "Prefer")),
                switches=_switches(_first(rec, "Switches")),
            )
        )
    return out


def _switches(text: str | None) -> Switches | None:
    """``Switches=1@00:05:00`` (count, then the longest wait) to :class:`Switches`."""
    if not text:
        return None
    count, _, wait = text.partition("@")
    n = _int(count)
    if n is None:
        return None
    secs = units.time_seconds(wait) if wait else None
    return Switches(n, secs if isinstance(secs, int) else None)


def parse_scontrol_partitions(text: str) -> list[PartitionInfo]:
    """Partitions from ``scontrol show partition -o``."""
    out = []
    for rec in scontrol_records(text):
        name = _first(rec, "PartitionName")
        if not name:
            continue
        max_time = units.time_seconds(_first(rec, "MaxTime"))
        out.append(
            PartitionInfo(
                name=name,
                nodes=units.expand_hostlist(_first(rec, "Nodes")),
                default=_first(rec, "Default") == "YES",
                state=_first(rec, "State") or "UP",
                # MaxTime=UNLIMITED is the default; None would mean "not printed".
                max_time=units.UNLIMITED if max_time is None else max_time,
                default_time=units.time_seconds(_first(rec, "DefaultTime")),
                qos=units.text_or_none(_first(rec, "QoS")),
                tres=units.parse_tres(_first(rec, "TRES")),
            )
        )
    return out


def parse_partitions_json(text: str | bytes, what: str = "slurmrestd partitions"
                          ) -> list[PartitionInfo]:
    """Partitions from data_parser v0.0.42 (slurmrestd's ``/partitions/``, ``scontrol show
    partition --json``). That schema carries no Default flag (24.11, 26.05): ``default`` is
    False here, and the REST backend fills it in (``RestBackend.partitions``)."""
    doc = load_json_document(text, what=what)
    out = []
    for i, raw in enumerate(_document_list(doc, "partitions", what)):
        p = _Record(raw, f"{what} partition {i}", True)
        name = p.text("name")
        if name is None:
            p.fail("name", "is missing")
        p.what = f"{what} partition {name[:60]!r}"

        nodes, part, qos, limits, defaults, tres = (
            _sub_record(p, k) for k in ("nodes", "partition", "qos", "maximums", "defaults",
                                        "tres"))
        max_min = limits._number("time")
        default_min = defaults._number("time")
        out.append(PartitionInfo(
            name=name,
            nodes=nodes.parsed("configured", units.expand_hostlist),
            default=False,
            state=(next(iter(part.words("state")), None) or "UP").upper(),
            max_time=(units.UNLIMITED if max_min is None or max_min == units.INFINITE
                      else int(max_min) * 60),
            default_time=(None if default_min is None else
                          units.UNLIMITED if default_min == units.INFINITE
                          else int(default_min) * 60),
            qos=qos.text("assigned") or None,
            tres=units.parse_tres(tres.string("configured")),
        ))
    return out


def _sub_record(rec: _Record, key: str) -> _Record:
    v = rec.rec.get(key) or {}
    if not isinstance(v, Mapping):
        rec.fail(key, f"is {rec._shown(key)}, not an object")
    return _Record(v, f"{rec.what} {key}", True)


def with_core_cpu_ids(job: JobInfo, raw: Any, threads: Mapping[str, int]) -> JobInfo:
    """``job`` with its CPU ids per node from data_parser v0.0.42's ``job_resources``
    (``nodes.allocation[*].sockets[*].cores[*].status``), the numbering of ``scontrol -d``'s
    ``CPU_IDs=`` (core-major: CPU = core x threads + thread; every thread of an allocated
    core). Unchanged when the job already has CPU ids or the record has no allocation."""
    if job.cpu_ids or not isinstance(raw, Mapping):
        return job
    res = raw.get("job_resources")
    alloc = (res.get("nodes") or {}).get("allocation") if isinstance(res, Mapping) else None
    if not isinstance(alloc, list):
        return job
    out: dict[str, tuple[int, ...]] = {}
    for a in alloc:
        if not isinstance(a, Mapping) or not isinstance(a.get("name"), str):
            continue
        t = threads.get(a["name"], 1)
        ids: list[int] = []
        base = 0
        for sock in a.get("sockets") or []:
            cores = sock.get("cores") if isinstance(sock, Mapping) else None
            if not isinstance(cores, list):
                continue
            for c in cores:
                if not isinstance(c, Mapping) or not isinstance(c.get("index"), int):
                    continue
                status = c.get("status") or []
                if isinstance(status, list) and "ALLOCATED" in status:
                    core = base + c["index"]
                    ids += range(core * t, core * t + t)
            base += len(cores)
        if ids:
            out[a["name"]] = tuple(sorted(ids))
    return replace(job, cpu_ids=out) if out else job


def parse_sacctmgr_qos(text: str) -> list[QosInfo]:
    """QOS from ``sacctmgr show qos -P`` (header line first, ``|``-separated).

    Columns are found by header name, so a Slurm that adds columns still parses.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0].split("|")
    if "Name" not in header:
        raise BackendError("sacctmgr show qos -P printed no header with 'Name'")
    out = []
    for line in lines[1:]:
        row = dict(zip(header, line.split("|"), strict=False))
        usage = row.get("UsageFactor") or ""
        out.append(
            QosInfo(
                name=row["Name"],
                priority=_int(row.get("Priority")) or 0,
                flags=_split_list(row.get("Flags")),
                usage_factor=float(usage) if usage else 1.0,
                max_wall=units.time_seconds(row.get("MaxWall")),
                max_tres_per_job=units.parse_tres(row.get("MaxTRES")),
                max_tres_per_user=units.parse_tres(row.get("MaxTRESPU")),
                max_jobs_per_user=_int(row.get("MaxJobsPU")),
            )
        )
    return out


def parse_sbatch_parsable(text: str) -> int:
    """The job id from ``sbatch --parsable`` (``"12"`` or ``"12;cluster"``)."""
    first = text.strip().splitlines()[-1] if text.strip() else ""
    job = first.split(";", 1)[0]
    if not job.isdigit():
        raise BackendError(f"sbatch --parsable printed no job id: {text!r}")
    return int(job)


def parse_slurm_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` (``scontrol --version``) to ``(22, 5, 8)``."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise BackendError(f"cannot read a Slurm version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# ------------------------------------------------------------------- small listings
def parse_scontrol_topology(text: str) -> list[SwitchInfo]:
    """Switches from ``scontrol show topology`` (``SwitchName=leaf1 Level=0 LinkSpeed=1
    Nodes=gpu[1-4]``, one per line); lines without ``SwitchName=`` (the message printed
    when no topology plugin is configured) are skipped. A switch above others prints every
    node of its subtree as ``Nodes=`` (22.05, tried): only a leaf (no ``Switches=``) keeps its
    nodes, so each node hangs under exactly one switch, as in topology.conf."""
    out = []
    for rec in scontrol_records(text):
        name = _first(rec, "SwitchName")
        if not name:
            continue
        below = units.expand_hostlist(_first(rec, "Switches"))
        out.append(SwitchInfo(
            name=name,
            nodes=() if below else units.expand_hostlist(_first(rec, "Nodes")),
            switches=below,
            link_speed=_int(_first(rec, "LinkSpeed")),
        ))
    return out


def parse_sacct_batch_script(text: str) -> str | None:
    """The script of ``sacct --batch-script -j ID`` (``Batch Script for ID``, a dashed line,
    then the script as submitted); None when sacct printed none for the job (no stored
    script: ``Batch Script for ID`` and then ``NONE``, or nothing)."""
    lines = text.split("\n")
    if len(lines) < 3 or not lines[0].startswith("Batch Script for ") or \
            not lines[1].startswith("-----"):
        return None
    body = "\n".join(lines[2:])
    return None if body.strip() in ("", "NONE") else body


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = value`` lines) to a dict.

    Values may hold ``=`` (``SchedulerParameters = bf_max_job_test=100``), so a line splits at
    its first ``=``. Later sections (cgroup, MPI plugins) repeat no main key; where a key
    repeats, the first (the main configuration's) wins.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and " " not in key:
            out.setdefault(key, value.strip())
    return out


def parse_sinfo_node_states(text: str) -> dict[str, str]:
    """``sinfo -h -N -o "%N %T"`` to node -> state word (lower case; ``*`` kept).

    ``-N`` prints a node once per partition it is in; the state is the same on each line.
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = parts[1].lower()
    return out


def parse_squeue_ids(text: str) -> list[int]:
    """``squeue -h -o %A`` (one unique job id per line) to ids, in squeue's order."""
    return [int(w) for w in text.split() if w.isdigit()]


def parse_squeue_display_ids(text: str) -> list[str]:
    """``squeue -h -o %i`` (one id per line as squeue prints it: ``7``, ``5_1``,
    ``5_[2-3%2]``, ``11+1``) to those ids, in squeue's order."""
    return text.split()


# sdiag's counters at the top of its report ("DBD Agent queue size: 0"), by their label.
_SDIAG_COUNTERS = {
    "Server thread count": "server_thread_count",
    "Agent queue size": "agent_queue_size",
    "DBD Agent queue size": "dbd_agent_queue_size",
    "Jobs submitted": "jobs_submitted",
}
_SDIAG_COUNTER_RE = re.compile(r"^([A-Za-z][A-Za-z ]*?):\s*(\d+)\s*$")
_SDIAG_BY_TYPE = "Remote Procedure Call statistics by message type"
# "\tREQUEST_SUBMIT_BATCH_JOB                ( 4003) count:3      ave_time:701    total_time:2104"
_SDIAG_RPC_RE = re.compile(r"^\s+(\w+)\s*\(\s*\d+\)\s*count:(\d+)\s+ave_time:(\d+)"
                           r"\s+total_time:(\d+)\s*$")


def parse_sdiag(text: str) -> ControllerStats:
    """sdiag's report (Slurm 22.05) to :class:`ControllerStats`.

    The counters come from the unindented ``Label: number`` lines at the top; the RPC
    statistics from the section "by message type" only (the section "by user" that follows
    has lines of the same shape, keyed by user name).
    """
    counters: dict[str, int] = {}
    rpcs: dict[str, RpcStats] = {}
    in_types = False
    for line in text.splitlines():
        if not line.strip():
            in_types = False
            continue
        if not line[0].isspace():
            in_types = line.strip() == _SDIAG_BY_TYPE
            m = _SDIAG_COUNTER_RE.match(line)
            if m and m.group(1) in _SDIAG_COUNTERS:
                counters[_SDIAG_COUNTERS[m.group(1)]] = int(m.group(2))
            continue
        m = _SDIAG_RPC_RE.match(line) if in_types else None
        if m:
            rpcs[m.group(1)] = RpcStats(count=int(m.group(2)), mean_us=int(m.group(3)),
                                        total_us=int(m.group(4)))
    return ControllerStats(
        server_thread_count=counters.get("server_thread_count"),
        agent_queue_size=counters.get("agent_queue_size"),
        dbd_agent_queue_size=counters.get("dbd_agent_queue_size"),
        jobs_submitted=counters.get("jobs_submitted"),
        rpcs=rpcs,
    )


def parse_job_output_files(text: str) -> OutputFiles:
    """``StdOut=``/``StdErr=`` of the first job line of ``scontrol show job -o``.

    scontrol prints job names and comments unescaped, so free text can hold ``StdOut=``: a
    key printed more than once is ambiguous and read as unknown (None).
    """
    records = scontrol_records(text)
    if not records:
        return OutputFiles()

    def once(key: str) -> str | None:
        values = [v for k, v in records[0] if k == key]
        return values[0] if len(values) == 1 else None

    stdout, stderr = once("StdOut"), once("StdErr")
    if stderr == "":
        # 26.05 prints an empty StdErr= when the job's errors go where its output goes.
        stderr = stdout
    return OutputFiles(stdout=stdout, stderr=stderr)


def parse_sacctmgr_column(text: str) -> list[str]:
    """One column of ``sacctmgr -n -P show ... format=X`` (blank lines dropped)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_sacctmgr_associations(text: str) -> list[Association]:
    """``sacctmgr -n -P show assoc format=account,user,qos`` to associations.

    An account's own association has an empty user column.
    """
    out = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3:
            continue
        out.append(Association(account=parts[0], user=parts[1] or None,
                               qos=frozenset(q for q in parts[2].split(",") if q)))
    return out
