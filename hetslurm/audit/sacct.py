"""Jobs from ``sacct --json`` as one DataFrame.

sacct keeps a job's GPU *count* (``gres/gpu``, and ``gres/gpu:<model>`` only when the job
asked for a model by name) but never which GPU indices it had: those come from the
collector's samples. A job that asked for "any of" several models is recorded untyped, so
its model is taken from its node list and the site.

Running sacct and decoding its records (Slurm 22.05's ``openapi/dbv0.0.38`` shape) is the
access layer's (:mod:`hetslurm.slurm.sacct`): a document is split into raw records in one
pass in C, and each record decoded on its own into typed structs. Here each typed record
becomes a row, a record of the wrong shape is skipped and counted, never fatal, and a
million-job document never becomes a million nested dicts.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetslurm.errors import BackendError, HetslurmError, MetricsError
from hetslurm.request.record import DecisionRecord, find_record
from hetslurm.site.hook_rules import hook_policy
from hetslurm.site.model import Site
from hetslurm.site.schema import HookPolicy
from hetslurm.slurm import get_backend
from hetslurm.slurm.sacct import SacctDocumentError, SacctRecords, parse_sacct_document
from hetslurm.slurm.units import NO_VAL, expand_hostlist

JOB_COLUMNS = ("job_id", "run", "name", "user", "account", "partition", "state", "submit",
               "eligible", "start", "end", "elapsed", "nodes", "gpus", "gpu_model",
               "typed", "constraints", "comment", "admin_comment", "wclass", "slurm_energy_j")
#: Problems listed one by one; past this many only the count grows.
MAX_LISTED_PROBLEMS = 20


@dataclass
class SacctResult:
    """Jobs (one row per run: ``--duplicates`` gives requeued jobs one row per start)."""

    jobs: Any  # pandas.DataFrame with JOB_COLUMNS
    records: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.skipped > 0


def read_accounting(env: Mapping[str, str] | None, since: float, until: float) -> SacctRecords:
    """Every user's job records in the range, from the accounting database (``env`` points
    Slurm's commands at a cluster); :class:`MetricsError` when it cannot be read."""
    try:
        return get_backend("cli", env).accounting_jobs(since, until)
    except SacctDocumentError as exc:
        raise MetricsError(str(exc)) from exc
    except HetslurmError as exc:
        raise MetricsError(f"sacct failed: {exc}") from exc


class ModelResolver:
    """A job's GPU model: its typed gres, else the models of its nodes in the site."""

    def __init__(self, site: Site | None) -> None:
        self.node_model: dict[str, str] = {}
        if site is not None:
            for n in site.nodes:
                if n.gpus:
                    self.node_model[n.name] = n.gpus[0].model
        self._cache: dict[str, str | None] = {}

    def from_nodes(self, nodes: str | None) -> str | None:
        if not nodes:
            return None
        if nodes not in self._cache:
            models = {self.node_model.get(n) for n in expand_hostlist(nodes)}
            models.discard(None)
            self._cache[nodes] = (models.pop() if len(models) == 1 else
                                  ("mixed" if models else None))
        return self._cache[nodes]


def job_class(site: Site | None, partition: str | None,
              record: DecisionRecord | None) -> str:
    """The workload class: the hook's decision record's ``class``, else the partition's."""
    if record is not None and record.workload_class:
        return record.workload_class
    if site is not None and partition:
        classes = site.sections.get("classes", {})
        names = [c for c, wc in classes.items() if wc.partition == partition]
        if len(names) == 1:
            return str(names[0])
    return ""


def parse_sacct_json(text: str | bytes, site: Site | None = None) -> SacctResult:
    """Parse sacct's JSON into :class:`SacctResult` (bad records skipped and counted).

    Raises :class:`MetricsError` with one clear sentence when the document is not a JSON
    object with a ``jobs`` array: empty, garbage, truncated, or not JSON at all.
    """
    try:
        records = parse_sacct_document(text)
    except SacctDocumentError as exc:
        raise MetricsError(str(exc)) from exc
    return sacct_result(records, site)


def sacct_result(records: SacctRecords, site: Site | None = None) -> SacctResult:
    """Typed sacct records into :class:`SacctResult` (bad records skipped and counted)."""
    # A million small objects would set off the cyclic collector every 700 allocations,
    # each time scanning everything built so far; none of them can be part of a cycle.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        res = SacctResult(jobs=None)
        res.jobs = _decode_jobs(records, site, res)
        return res
    finally:
        if was_enabled:
            gc.enable()


#: Columns of labels (few distinct values each): kept as codes into one table per column
#: while decoding, then categoricals (``_CATEGORIES``) or strings.
_CATEGORIES = ("user", "account", "partition", "state", "gpu_model", "wclass")
_TEXTS = ("name", "nodes", "constraints", "comment", "admin_comment")
_TIMES = ("submit", "eligible", "start", "end", "elapsed")
#: The other columns' dtypes (float64 where not named).
_DTYPES = {"job_id": "int64", "gpus": "int64", "typed": "bool"}
_CHUNK = 65536


class _Columns:
    """Rows gathered a chunk at a time into numpy arrays and label codes (a Python tuple
    and a str object per cell would cost several times the finished frame)."""

    def __init__(self) -> None:
        self.names = [c for c in JOB_COLUMNS if c != "run"]
        self.chunks: dict[str, list[Any]] = {c: [] for c in self.names}
        self.labels: dict[str, dict[str, int]] = {c: {} for c in (*_CATEGORIES, *_TEXTS)}

    def add(self, rows: list[tuple[Any, ...]]) -> None:
        import numpy as np
        import pandas as pd

        for c, values in zip(self.names, zip(*rows, strict=True), strict=True):
            table = self.labels.get(c)
            if table is None:
                self.chunks[c].append(np.array(values, dtype=_DTYPES.get(c, "float64")))
                continue
            codes, uniques = pd.factorize(np.array(values, dtype=object))
            remap = np.array([table.setdefault(u, len(table)) for u in uniques], dtype="int32")
            self.chunks[c].append(remap[codes])

    def frame(self) -> Any:
        import numpy as np
        import pandas as pd
        import pyarrow as pa

        data: dict[str, Any] = {}
        for c in self.names:
            parts = self.chunks.pop(c)
            arr = (np.concatenate(parts) if parts else np.array(
                [], dtype="int32" if c in self.labels else _DTYPES.get(c, "float64")))
            del parts
            if c in _TIMES:
                # sacct --json: 0 is "not yet" (an elapsed time may be 0); NO_VAL and
                # above are Slurm's "no value"/"unlimited", never a time.
                ok = (arr > 0) if c != "elapsed" else (arr >= 0)
                arr = np.where(ok & (arr < NO_VAL), arr, np.nan)
            if c in _CATEGORIES:
                cats = list(self.labels[c])
                # Sorted categories, as astype("category") makes them.
                data[c] = pd.Categorical.from_codes(arr, cats).reorder_categories(sorted(cats))
            elif c in _TEXTS:
                dictionary = pa.array(list(self.labels[c]), type=pa.string())
                data[c] = pd.array(pa.DictionaryArray.from_arrays(
                    pa.array(arr, type=pa.int32()), dictionary).dictionary_decode(),
                    dtype="str")
            else:
                data[c] = arr
        frame = pd.DataFrame(data)
        # --duplicates: a requeued job has a record per start; number them in order.
        frame.insert(1, "run", frame.groupby("job_id", sort=False).cumcount().astype("int64"))
        return frame


def _nan_if_none(v: float | None) -> float:
    return float("nan") if v is None else v


def _decode_jobs(records: SacctRecords, site: Site | None, res: SacctResult) -> Any:
    """Each record decoded and cut into the jobs DataFrame."""
    decode = records.decode
    resolver = ModelResolver(site)
    policy = hook_policy(site) if site is not None else HookPolicy()
    class_of: dict[tuple[str, str], str] = {}
    cols = _Columns()
    rows: list[tuple[Any, ...]] = []
    n = 0
    for raw in records.raws:
        n += 1
        try:
            rec = decode(raw)
            t = rec.time
            gpus = 0
            typed: str | None = None
            if rec.tres is not None and rec.tres.allocated:
                for tres in rec.tres.allocated:
                    if tres.type != "gres":
                        continue
                    tname = tres.name or ""
                    if tname == "gpu":
                        gpus = int(tres.count or 0)
                        if abs(gpus) >= 2**31:
                            raise ValueError(f"GPU count out of range: {tres.count}")
                    elif tname.startswith("gpu:"):
                        typed = tname.split(":", 1)[1]
            nodes = rec.nodes or ""
            if nodes in ("None assigned", "(null)"):
                nodes = ""
            model = (typed or resolver.from_nodes(nodes)) if gpus else None
            partition = rec.partition or ""
            comment = rec.comment
            admin = (comment.administrator or "") if comment is not None else ""
            jcomment = (comment.job or "") if comment is not None else ""
            rec_text = {"admin_comment": admin, "comment": jcomment}.get(policy.record_field,
                                                                          "")
            ckey = (partition, rec_text)
            wc = class_of.get(ckey)
            if wc is None:
                wc = class_of[ckey] = job_class(site, partition,
                                                find_record(rec_text, policy.record_key))
        except (BackendError, ArithmeticError, AttributeError, KeyError, TypeError,
                ValueError, RecursionError) as exc:
            res.skipped += 1
            if len(res.problems) < MAX_LISTED_PROBLEMS:
                res.problems.append(f"sacct record {n} skipped: {exc}")
            continue
        # In JOB_COLUMNS order (less run); times stay raw (0 = "not yet", NaN in bulk).
        rows.append((rec.job_id, rec.name or "", rec.user or "", rec.account or "",
                     partition, rec.state.name if rec.state is not None else "",
                     t.submission or 0, t.eligible or 0, t.start or 0, t.end or 0,
                     t.elapsed or 0, nodes, gpus, model or "", typed is not None,
                     rec.constraints or "", jcomment, admin, wc, _nan_if_none(rec.energy_j)))
        if len(rows) >= _CHUNK:
            cols.add(rows)
            rows.clear()
    if rows:
        cols.add(rows)
    del rows
    res.records = n
    if res.skipped > MAX_LISTED_PROBLEMS:
        res.problems.append(f"... and {res.skipped - MAX_LISTED_PROBLEMS} more sacct "
                            "records skipped")
    return cols.frame()
