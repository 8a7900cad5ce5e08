"""Readers for the public workload traces in ``$HETSLURM_TRACES``.

Each reader returns :class:`TraceJob` records sorted by submit time, with times in seconds
from the trace's first submission. A malformed row raises :class:`TraceError` naming the
file, the line and the field; rows that are well formed but cannot be replayed (an Alibaba
pod that was never scheduled) are skipped and counted in :attr:`Trace.skipped`. A column
the file carries that the replay does not read is named in :attr:`Trace.unused_columns`.

Every format may be compressed: gzip, xz, bzip2 or zip (one member, or the member whose
name ends as the format's files do), told by the file's first bytes, not its name
(:func:`trace_text`).
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import math
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from hetslurm.errors import ConfigError
from hetslurm.textfile import MAX_DATA_BYTES, decode_text, read_file_bytes

FORMATS = ("alibaba", "philly", "gavel", "swf")
#: Bounds a replayable trace stays within (a row beyond them is malformed, not a huge job):
#: times in seconds (about 300 years), GPUs per job (hetslurm.placement.MAX_REQUEST), and
#: cores, MiB and steps far past any real job.
MAX_SECONDS = 1e10
MAX_GPUS = 1 << 16
MAX_COUNT = float(1 << 40)


class TraceError(ConfigError):
    """A trace file is missing or has a malformed row."""


@dataclass(frozen=True)
class TraceJob:
    """One job as the trace gives it.

    Attributes:
        id: the trace's job name or number.
        submit: seconds since the trace's first submission.
        duration: measured runtime in seconds on the trace's own hardware; ``None`` for
            Gavel jobs, whose runtime is ``steps`` divided by the measured throughput.
        gpus: GPUs asked for (0 = CPU-only).
        gpu_milli: share of each GPU asked for, per mille (1000 = whole GPUs).
        cores: CPU cores asked for, ``None`` when the trace does not say.
        mem_mib: memory asked for, ``None`` when the trace does not say.
        job_type: Gavel's job type (``"ResNet-18 (batch size 32)"``), else ``None``.
        steps: Gavel's total steps, else ``None``.
        qos: Alibaba's QOS (LS, BE, ...), else ``None``.
        gpu_models: the GPU models the job may run on, as the trace names them (Alibaba's
            ``gpu_spec``, ``|``-separated alternatives); empty: any model. Mapped to the
            site's models by :func:`hetslurm.simulate.workload.site_gpu_models`.
    """

    id: str
    submit: float
    duration: float | None
    gpus: int
    gpu_milli: int = 1000
    cores: int | None = None
    mem_mib: int | None = None
    job_type: str | None = None
    steps: float | None = None
    qos: str | None = None
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Trace:
    """Jobs of one trace file, sorted by submit time.

    Attributes:
        skipped: rows not replayable, by reason.
        unused_columns: columns (SWF: fields holding a value other than -1) the file carries
            and the replay does not read.
        compression: how the file was compressed (``gzip``, ``xz``, ``bzip2``, ``zip``), or
            ``None``.
    """

    path: str
    format: str
    jobs: tuple[TraceJob, ...]
    skipped: dict[str, int] = field(default_factory=dict)
    unused_columns: tuple[str, ...] = ()
    compression: str | None = None


def read_trace(path: str | Path, fmt: str) -> Trace:
    """Read ``path`` as a trace of format ``fmt`` (one of :data:`FORMATS`).

    Raises:
        TraceError: unknown format, missing file or malformed row.
    """
    readers: dict[str, Callable[[Path], Trace]] = {
        "alibaba": read_alibaba, "philly": read_philly, "gavel": read_gavel, "swf": read_swf,
    }
    if fmt not in readers:
        raise TraceError(f"unknown trace format '{fmt}'; formats: {', '.join(FORMATS)}")
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    return readers[fmt](p)


class _Row:
    """Field access with errors that name the file, line and field."""

    def __init__(self, path: Path, line: int, values: dict[str, str]) -> None:
        self.path, self.line, self.values = path, line, values

    def err(self, name: str, why: str) -> TraceError:
        return TraceError(f"{self.path}:{self.line}: field '{name}' {why}")

    def text(self, name: str) -> str:
        v = self.values.get(name)
        if v is None:
            raise self.err(name, "is missing (short row)")
        return v.strip()

    def num(self, name: str, *, low: float = 0.0, high: float = MAX_COUNT) -> float:
        raw = self.text(name)
        try:
            v = float(raw)
        except ValueError:
            raise self.err(name, f"= {raw!r} is not a number") from None
        if not math.isfinite(v) or not low <= v <= high:
            raise self.err(name, f"= {raw!r} is out of range ({low:g}..{high:g})")
        return v

    def int_(self, name: str, *, low: int = 0, high: float = MAX_COUNT) -> int:
        v = self.num(name, low=low, high=high)
        if not v.is_integer():
            raise self.err(name, f"= {self.text(name)!r} is not a whole number")
        return int(v)


#: Member suffixes a zip's trace may have, per format (a zip of one file needs none).
_SUFFIXES = {"alibaba": (".csv",), "philly": (".csv",), "gavel": (".trace", ".txt"),
             "swf": (".swf",)}


def trace_text(path: Path, fmt: str, *,
               errors: Literal["strict", "surrogateescape"] = "strict") -> tuple[str, str | None]:
    """The trace's text and its compression (``None`` for a plain file).

    gzip, xz and bzip2 are read as one stream, zip as its one member or the first whose name
    ends as ``fmt``'s files do (``.swf``, ``.csv``, ...). The plain file and the inflated
    text are each bounded by MAX_DATA_BYTES: a small file that inflates past it is refused
    without being inflated whole.

    Raises:
        TraceError: the file cannot be read, is corrupt, inflates too far, or is not UTF-8
            (``errors="strict"``).
    """
    try:
        raw = read_file_bytes(path, what="trace file", max_bytes=MAX_DATA_BYTES)
    except ConfigError as exc:
        raise TraceError(exc.message, file=exc.file, line=exc.line) from exc
    kind = _compression(path, raw)
    data = raw if kind is None else _inflate(path, raw, kind, fmt)
    try:
        return decode_text(data, what="trace file", file=str(path), errors=errors), kind
    except ConfigError as exc:
        raise TraceError(exc.message, file=exc.file, line=exc.line) from exc


def _compression(path: Path, raw: bytes) -> str | None:
    if raw.startswith(b"\x1f\x8b"):
        return "gzip"
    if raw.startswith(b"\xfd7zXZ\x00"):
        return "xz"
    if raw.startswith(b"BZh"):
        return "bzip2"
    if raw.startswith(b"PK\x03\x04") or raw.startswith(b"PK\x05\x06"):
        return "zip"
    return None


def _read_stream(kind: str, raw: bytes, size: int) -> bytes:
    """At most ``size`` bytes of the gzip, xz or bzip2 stream ``raw``, inflated."""
    stream = io.BytesIO(raw)
    if kind == "gzip":
        with gzip.GzipFile(fileobj=stream) as fh:
            return fh.read(size)
    if kind == "xz":
        with lzma.LZMAFile(stream) as fx:
            return fx.read(size)
    with bz2.BZ2File(stream) as fb:
        return fb.read(size)


def _inflate(path: Path, raw: bytes, kind: str, fmt: str) -> bytes:
    limit = MAX_DATA_BYTES
    try:
        if kind == "zip":
            with zipfile.ZipFile(io.BytesIO(raw)) as z:
                files = [i for i in z.infolist() if not i.is_dir()]
                wanted = [i for i in files if i.filename.lower().endswith(_SUFFIXES[fmt])]
                member = files[0] if len(files) == 1 else (wanted[0] if wanted else None)
                if member is None:
                    want = " or ".join(_SUFFIXES[fmt])
                    raise TraceError(f"{path}: the zip holds {len(files)} files and none "
                                     f"ends in {want}")
                # The declared size is checked before inflating; zipfile itself refuses a
                # member longer than it declares.
                if member.file_size > limit:
                    raise TraceError(f"{path}: {member.filename} inflates to "
                                     f"{member.file_size} bytes, over {limit}")
                return z.read(member)
        data = _read_stream(kind, raw, limit + 1)
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile, ValueError) as exc:
        raise TraceError(f"{path}: not a readable {kind} file: {exc}") from exc
    if len(data) > limit:
        raise TraceError(f"{path}: inflates to more than {limit} bytes")
    return data


class _Csv:
    """A CSV trace: its header, its compression and its rows (read on :meth:`rows`)."""

    def __init__(self, path: Path, fmt: str, required: tuple[str, ...]) -> None:
        self.path = path
        text, self.compression = trace_text(path, fmt)
        self._reader = csv.reader(io.StringIO(text, newline=""))
        try:
            header = next(self._reader, None)
        except csv.Error as exc:
            raise TraceError(f"{path}:1: not CSV: {exc}") from exc
        if header is None:
            raise TraceError(f"{path}: empty file")
        self.header = [h.strip() for h in header]
        missing = [r for r in required if r not in self.header]
        if missing:
            raise TraceError(f"{path}:1: header lacks column(s) {', '.join(missing)}")
        repeated = sorted({h for h in self.header if self.header.count(h) > 1})
        if repeated:
            raise TraceError(f"{path}:1: header repeats column(s) {', '.join(repeated)}")

    def unused(self, read: Iterable[str]) -> tuple[str, ...]:
        """Header columns not among ``read``, in the file's order."""
        used = set(read)
        return tuple(h for h in self.header if h and h not in used)

    def rows(self) -> Iterator[_Row]:
        reader, header, path = self._reader, self.header, self.path
        try:
            for values in reader:
                if not values or all(not v.strip() for v in values):
                    continue
                if len(values) != len(header):
                    raise TraceError(
                        f"{path}:{reader.line_num}: {len(values)} fields, header has "
                        f"{len(header)}"
                    )
                yield _Row(path, reader.line_num, dict(zip(header, values, strict=True)))
        except csv.Error as exc:
            # e.g. a field past csv's size limit (an unterminated quote swallowing the file).
            raise TraceError(f"{path}:{reader.line_num}: not CSV: {exc}") from exc


def _finish(path: Path, fmt: str, jobs: Iterable[TraceJob], skipped: dict[str, int], *,
            unused: tuple[str, ...] = (), compression: str | None = None) -> Trace:
    ordered = sorted(jobs, key=lambda j: (j.submit, j.id))
    if not ordered:
        raise TraceError(f"{path}: no replayable job in the trace")
    t0 = ordered[0].submit
    shifted = tuple(replace(j, submit=j.submit - t0) for j in ordered)
    return Trace(str(path), fmt, shifted, {k: v for k, v in skipped.items() if v},
                 unused_columns=unused, compression=compression)


# --- Alibaba cluster-trace-gpu-v2023 -------------------------------------------------------

ALIBABA_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos",
                       "pod_phase", "creation_time", "deletion_time", "scheduled_time")
#: Columns the replay reads (``pod_phase`` is required by the format but not read: a pod's
#: times say whether it ran); ``gpu_spec`` is optional.
_ALIBABA_READ = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "qos",
                 "creation_time", "deletion_time", "scheduled_time", "gpu_spec")


def read_alibaba(path: Path) -> Trace:
    """``openb_pod_list_*.csv``: submit = creation_time, runtime = deletion - scheduled.

    A pod never scheduled (``scheduled_time`` empty, phase Pending) has no runtime and is
    skipped (``never_scheduled``). ``gpu_milli`` is the share of each GPU (per mille).
    ``gpu_spec`` (optional) is the GPU models a pod may run on, ``|``-separated (``T4``,
    ``V100M16|V100M32``); empty: any model.
    """
    jobs: list[TraceJob] = []
    skipped = {"never_scheduled": 0}
    table = _Csv(path, "alibaba", ALIBABA_POD_COLUMNS)
    has_spec = "gpu_spec" in table.header
    for row in table.rows():
        if not row.text("scheduled_time") or not row.text("deletion_time"):
            skipped["never_scheduled"] += 1
            continue
        created = row.num("creation_time", high=MAX_SECONDS)
        start = row.num("scheduled_time", high=MAX_SECONDS)
        end = row.num("deletion_time", high=MAX_SECONDS)
        if end < start:
            raise row.err("deletion_time", f"= {end:g} is before scheduled_time {start:g}")
        gpus = row.int_("num_gpu", high=MAX_GPUS)
        milli = row.int_("gpu_milli") if gpus else 1000
        if gpus and not 0 < milli <= 1000:
            raise row.err("gpu_milli", f"= {milli} is not in 1..1000")
        spec = _gpu_spec(row) if has_spec and gpus else ()
        jobs.append(TraceJob(
            id=row.text("name"), submit=created, duration=end - start, gpus=gpus,
            gpu_milli=milli, cores=max(1, math.ceil(row.num("cpu_milli") / 1000)),
            mem_mib=row.int_("memory_mib"), qos=row.text("qos") or None, gpu_models=spec,
        ))
    return _finish(path, "alibaba", jobs, skipped, unused=table.unused(_ALIBABA_READ),
                   compression=table.compression)


def _gpu_spec(row: _Row) -> tuple[str, ...]:
    """``gpu_spec``'s alternatives in the trace's order, each once."""
    raw = row.text("gpu_spec")
    names = tuple(dict.fromkeys(x.strip() for x in raw.split("|") if x.strip()))
    bad = [x for x in names if not all(c.isalnum() or c in "-_." for c in x)]
    if bad:
        raise row.err("gpu_spec", f"= {raw!r}: {bad[0]!r} is not a GPU model name")
    return names


@dataclass(frozen=True)
class AlibabaNode:
    """One row of ``openb_node_list_all_node.csv``."""

    name: str
    cores: int
    memory_mib: int
    gpus: int
    model: str | None


def read_alibaba_nodes(path: str | Path) -> tuple[AlibabaNode, ...]:
    """The Alibaba cluster's nodes (``sn,cpu_milli,memory_mib,gpu,model``).

    Raises:
        TraceError: missing file or malformed row.
    """
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such node list")
    out = []
    for row in _Csv(p, "alibaba", ("sn", "cpu_milli", "memory_mib", "gpu", "model")).rows():
        gpus = row.int_("gpu")
        model = row.text("model") or None
        if gpus and model is None:
            raise row.err("model", "is empty on a node with GPUs")
        out.append(AlibabaNode(row.text("sn"), row.int_("cpu_milli") // 1000,
                               row.int_("memory_mib"), gpus, model))
    return tuple(out)


# --- Philly as packaged by Sia -------------------------------------------------------------


def read_philly(path: Path) -> Trace:
    """Sia's ``philly.csv``: ``timestamp,duration,num_gpus,gpu_time,cluster``."""
    jobs: list[TraceJob] = []
    read = ("timestamp", "duration", "num_gpus")
    table = _Csv(path, "philly", read)
    for row in table.rows():
        raw = row.text("timestamp")
        try:
            when = datetime.fromisoformat(raw)
            submit = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
        except ValueError:
            raise row.err("timestamp", f"= {raw!r} is not a date and time") from None
        jobs.append(TraceJob(
            id=f"philly-{row.line}", submit=submit,
            duration=row.num("duration", high=MAX_SECONDS),
            gpus=row.int_("num_gpus", low=1, high=MAX_GPUS),
        ))
    return _finish(path, "philly", jobs, {}, unused=table.unused(read),
                   compression=table.compression)


# --- Gavel's msr traces --------------------------------------------------------------------


def read_gavel(path: Path) -> Trace:
    """Gavel's tab-separated ``.trace``: ``job_type, command, num_steps_arg, needs_data_dir,
    total_steps, arrival_time, scale_factor``; runtime comes from the throughput table."""
    jobs: list[TraceJob] = []
    names = ("job_type", "command", "num_steps_arg", "needs_data_dir", "total_steps",
             "arrival_time", "scale_factor")
    text, compression = trace_text(path, "gavel")
    # Lines split on "\n" only, as Gavel writes them: a stray CR stays in the last field.
    for line_no, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        values = line.split("\t")
        if len(values) != len(names):
            raise TraceError(f"{path}:{line_no}: {len(values)} tab-separated fields, "
                             f"expected {len(names)}")
        row = _Row(path, line_no, dict(zip(names, values, strict=True)))
        if not row.text("job_type"):
            raise row.err("job_type", "is empty")
        jobs.append(TraceJob(
            id=f"gavel-{line_no}", submit=row.num("arrival_time", high=MAX_SECONDS),
            duration=None, gpus=row.int_("scale_factor", low=1, high=MAX_GPUS),
            job_type=row.text("job_type"), steps=row.num("total_steps", low=1),
        ))
    # command, num_steps_arg and needs_data_dir say how Gavel launches a job, not what it
    # asks: the replay does not read them.
    return _finish(path, "gavel", jobs, {}, unused=("command", "num_steps_arg",
                                                    "needs_data_dir"),
                   compression=compression)


# --- Standard Workload Format (Parallel Workloads Archive) ---------------------------------

_SWF_FIELDS = ("job", "submit", "wait", "run_time", "alloc_procs", "avg_cpu", "used_mem",
               "req_procs", "req_time", "req_mem", "status", "user", "group", "app", "queue",
               "partition", "preceding", "think")


#: The SWF fields the replay reads.
_SWF_READ = ("job", "submit", "run_time", "alloc_procs", "req_procs")


def read_swf(path: Path) -> Trace:
    """An SWF log, plain or compressed; CPU-only jobs.

    Cores = allocated processors (field 5), else requested (field 8). A job with run time -1
    (unknown) or 0 processors is skipped (``no_runtime``, ``no_processors``). The fields
    not read that hold a value other than -1 in some row are the trace's unused columns.
    """
    # SWF logs are ASCII with free-text header comments; a stray byte there is kept.
    text, compression = trace_text(path, "swf", errors="surrogateescape")
    jobs: list[TraceJob] = []
    skipped = {"no_runtime": 0, "no_processors": 0}
    unread = [i for i, f in enumerate(_SWF_FIELDS) if f not in _SWF_READ]
    carried: set[int] = set()
    for line_no, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith(";"):
            continue
        values = s.split()
        if len(values) != len(_SWF_FIELDS):
            raise TraceError(f"{path}:{line_no}: {len(values)} fields, SWF has 18")
        if len(carried) < len(unread):
            carried.update(i for i in unread if values[i] != "-1")
        row = _Row(path, line_no, dict(zip(_SWF_FIELDS, values, strict=True)))
        run = row.num("run_time", low=-1, high=MAX_SECONDS)
        procs = row.int_("alloc_procs", low=-1)
        if procs <= 0:
            procs = row.int_("req_procs", low=-1)
        if run < 0:
            skipped["no_runtime"] += 1
            continue
        if procs <= 0:
            skipped["no_processors"] += 1
            continue
        jobs.append(TraceJob(id=f"swf-{row.text('job')}", submit=row.num("submit",
                                                                          high=MAX_SECONDS),
                             duration=run, gpus=0, cores=procs))
    return _finish(path, "swf", jobs, skipped,
                   unused=tuple(_SWF_FIELDS[i] for i in sorted(carried)),
                   compression=compression)


# --- The Alibaba openb cluster as a site file ----------------------------------------------

#: Site model names of the trace's GPU codes (lowercase: Slurm gres types, docs/site-config.md).
ALIBABA_MODELS = {"V100M32": "v100m32", "V100M16": "v100m16", "G3": "g3", "G2": "g2",
                  "P100": "p100", "A10": "a10", "T4": "t4"}
#: GPU memory per model where NVIDIA's datasheets give it; G2 and G3 are undisclosed.
_ALIBABA_GPU_MEM = {"v100m32": "32G", "v100m16": "16G", "p100": "16G", "a10": "24G",
                    "t4": "16G"}


def alibaba_site_toml(nodes: Sequence[AlibabaNode], source: str) -> str:
    """``site-configs/alibaba-openb.toml``: one node class per distinct (GPU model, GPUs,
    vCPUs, memory) of the node list, every node under its trace name, a ``gpu`` and a
    ``cpu`` partition and the workload classes of the case study.

    Raises:
        TraceError: a GPU model this function does not know.
    """
    from hetslurm.slurm.units import compress_hostlist

    classes: dict[tuple[str, int, int, int], list[str]] = {}
    for n in nodes:
        if n.model is not None and n.model not in ALIBABA_MODELS:
            raise TraceError(f"{source}: GPU model '{n.model}' has no site name; known: "
                             f"{', '.join(ALIBABA_MODELS)}")
        model = ALIBABA_MODELS[n.model] if n.model and n.gpus else ""
        classes.setdefault((model, n.gpus if model else 0, n.cores, n.memory_mib),
                           []).append(n.name)
    present = {k[0] for k in classes if k[0]}
    order = [m for m in ALIBABA_MODELS.values() if m in present]
    ranked = sorted(classes, key=lambda k: (k[0] == "", order.index(k[0]) if k[0] else 0,
                                            -k[1], -k[2], -k[3]))
    fastest = list(ALIBABA_MODELS.values())
    gpu_nodes = [x for k in ranked if k[0] for x in classes[k]]
    cpu_nodes = [x for k in ranked if not k[0] for x in classes[k]]
    out = [
        "# GENERATED by `python scripts/gen-alibaba-site.py > site-configs/alibaba-openb.toml`",
        f"# from {source} (Alibaba cluster-trace-gpu-v2023, Weng et al., ATC'23, CC BY 4.0).",
        "# Do not edit: change the generator (hetslurm/simulate/traces.py alibaba_site_toml).",
        "#",
        f"# The layout as the trace gives it: {len(nodes)} nodes, "
        f"{sum(n.gpus for n in nodes if n.model)} GPUs on {len(gpu_nodes)} GPU nodes, "
        f"{len(cpu_nodes)} CPU-only nodes;",
        "# one node class per distinct (GPU model, GPU count, vCPUs, memory).",
        "# Assumptions (the node list gives only vCPUs, memory, GPU count and model):",
        "#   * a vCPU is a core (ThreadsPerCore=1), on 2 sockets from 16 vCPUs up, else 1;",
        "#   * GPU memory from NVIDIA's datasheets; G2 and G3 are undisclosed (the trace's",
        "#     README: 'internal GPU codes'), so no GPU memory is given for them;",
        "#   * no NVLink islands, no switch tree, no power figures (the trace has none);",
        "#   * gpu_model_order and the classes' device lists follow the speeds assumed in",
        "#     site-configs/simulate-params.toml [speeds] (G2, G3 as fast as a V100).",
        "schema_version = 1",
        'name = "alibabaopenb"',
        f'description = "Alibaba openb GPU cluster layout: {len(nodes)} nodes, '
        f'{sum(n.gpus for n in nodes if n.model)} GPUs (cluster-trace-gpu-v2023)"',
        "",
        "[scheduling]",
        "gpu_model_order = [" + ", ".join(f'"{m}"' for m in order) + "]",
        "",
    ]
    names: dict[tuple[str, int, int, int], str] = {}
    for k in ranked:
        model, gpus, cores, mem = k
        name = (f"{model}x{gpus}" if model else "cpu") + f"_c{cores}_m{mem // 1024}g"
        names[k] = name
        sockets = 2 if cores >= 16 and cores % 2 == 0 else 1
        out += [f"[node_classes.{name}]", f"sockets = {sockets}",
                f"cores_per_socket = {cores // sockets}", f"memory = {mem}", ""]
        if model:
            out += [f"[node_classes.{name}.gpus]", f'model = "{model}"', f"count = {gpus}"]
            if model in _ALIBABA_GPU_MEM:
                out.append(f'memory = "{_ALIBABA_GPU_MEM[model]}"')
            out.append("")
    # In the trace's order (by name), as slurm.conf would list them: with equal weights,
    # Slurm takes nodes in this order.
    out.append("[nodes]")
    key_of = {x: k for k, xs in classes.items() for x in xs}
    run: list[str] = []
    for name in [*(n.name for n in nodes), ""]:
        if run and (not name or key_of[name] != key_of[run[0]]):
            out.append(f'"{compress_hostlist(run)}" = "{names[key_of[run[0]]]}"')
            run = []
        if name:
            run.append(name)
    out += ["", "[partitions.cpu]", f'nodes = "{compress_hostlist(cpu_nodes)}"',
            "default = true", "", "[partitions.gpu]", f'nodes = "{compress_hostlist(gpu_nodes)}"',
            ""]
    by_speed = {  # fastest first under the assumed speeds; rl cheapest first
        "vision": [m for m in fastest if m != "t4"],
        "language": fastest,
        "recommendation": ["p100", "a10", "v100m32", "v100m16", "g3", "g2", "t4"],
        "rl": ["t4", "a10", "p100", "v100m16", "v100m32", "g2", "g3"],
    }
    descriptions = {
        "vision": "Image models: fastest GPUs first; not T4 (about 3x slower, as K80 in the "
                  "case study)",
        "language": "Language models: fastest GPUs first",
        "recommendation": "Recommendation: P100 first (faster than V100 in Gavel's table)",
        "rl": "Reinforcement learning: cheapest GPUs first",
    }
    for cls, wanted in by_speed.items():
        devices = [m for m in wanted if m in present]
        out += [f"[classes.{cls}]", f'description = "{descriptions[cls]}"',
                "devices = [" + ", ".join(f'"{d}"' for d in devices) + "]",
                'partition = "gpu"', ""]
    out += ["[classes.preprocess]", 'description = "Data preparation and other CPU-only work"',
            'devices = ["cpu"]', 'partition = "cpu"']
    return "\n".join(out) + "\n"
