"""Hashes of stored batch scripts, for ``hetslurm learn speeds``' recurring-job key (issue 22).

A recurring job is (user, job name, script): two different programs that share a name
(``run.sh``, ``train``) are not one job. The hook never hashes scripts (it runs under the
controller's locks and may record at most a cheap fingerprint); the hash is computed here,
off the controller, from the script slurmdbd kept (``AccountingStoreFlags=job_script``),
read through the access layer (:meth:`~hetslurm.slurm.backend.SlurmBackend.stored_batch_scripts`:
one ``sacct --json -B`` per 100 jobs on 24.11 and later, one ``sacct -B`` per job on 22.05).

Reading a million scripts is not affordable, so only the jobs whose script can change a
ratio are read (:func:`~hetslurm.audit.speeds.jobs_for_scripts`: runs of recurring jobs that
ran on two or more models of their class), at most ``limit`` per run, and each hash is kept
in a small cache file (job id and submit time -> 16 hex digits of SHA-256, or null where no
script was stored), so the next run reads only new jobs. The script text is hashed and
dropped, never stored, printed or run.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hetslurm.errors import ConfigError, HetslurmError

#: Cache file format; another version is ignored (and rewritten), never misread.
CACHE_VERSION = 1
#: A cache larger than this is not read (a million jobs is about 40 MB).
MAX_CACHE_BYTES = 256 << 20
#: Hex digits of SHA-256 kept: 64 bits, so two scripts of one user and name collide with
#: probability about 2**-64.
HASH_HEX = 16


class ScriptReader(Protocol):
    def stored_batch_scripts(self, job_ids: Any) -> dict[int, str | None]: ...


def script_hash(script: str) -> str:
    """The first :data:`HASH_HEX` hex digits of the SHA-256 of the script's UTF-8 bytes."""
    return hashlib.sha256(script.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_HEX]


def default_cache_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/hetslurm/script-hashes.json`` (default ``~/.cache``)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "hetslurm" / "script-hashes.json"


def cache_key(job_id: int, submit: float) -> str:
    """Job id and submit time: a job id alone repeats across clusters and after a reset."""
    return f"{int(job_id)}@{int(submit) if submit == submit else 0}"


@dataclass
class ScriptHashes:
    """Hashes by cache key ("" where no script was stored) and what reading them did."""

    hashes: dict[str, str] = field(default_factory=dict)
    read: int = 0
    cached: int = 0
    not_stored: int = 0
    left_unread: int = 0
    notes: list[str] = field(default_factory=list)


def load_cache(path: Path) -> tuple[dict[str, str | None], str | None]:
    """The cache's entries, and why it was not used (None when it was, or is absent)."""
    try:
        if not path.exists():
            return {}, None
        if path.stat().st_size > MAX_CACHE_BYTES:
            return {}, f"script-hash cache {path} is over {MAX_CACHE_BYTES >> 20} MiB; ignored"
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        return {}, f"script-hash cache {path} could not be read ({type(exc).__name__}); ignored"
    entries = doc.get("hashes") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION or \
            not isinstance(entries, dict):
        return {}, f"script-hash cache {path} is not version {CACHE_VERSION}; ignored"
    ok = {k: v for k, v in entries.items() if isinstance(k, str) and
          (v is None or (isinstance(v, str) and len(v) == HASH_HEX))}
    return ok, None


def save_cache(path: Path, entries: Mapping[str, str | None]) -> None:
    """Write the cache atomically (temp file and rename), readable by its owner only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"version": CACHE_VERSION, "hashes": entries}, fh,
                          separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"script-hash cache {path} could not be written: {exc}") from exc


def read_script_hashes(wanted: Any, reader: ScriptReader | None, cache: Path | None, *,
                       limit: int) -> ScriptHashes:
    """Hashes of the stored scripts of ``wanted`` (DataFrame: ``job_id``, ``submit``, in the
    order to read them), from the cache and then, up to ``limit`` jobs, from ``reader``
    (None: the cache only, e.g. for a ``--sacct-file``). The cache is updated with what was
    read. A reader that fails (sacct missing, slurmdbd down) leaves the rest unread and says
    so in ``notes``; it never fails the caller."""
    out = ScriptHashes()
    entries: dict[str, str | None] = {}
    if cache is not None:
        entries, why = load_cache(cache)
        if why:
            out.notes.append(why)
    keys = [cache_key(j, s) for j, s in zip(wanted["job_id"].tolist(),
                                            wanted["submit"].tolist(), strict=True)]
    ids = wanted["job_id"].tolist()
    missing: list[tuple[str, int]] = []
    for key, jid in zip(keys, ids, strict=True):
        if key in entries:
            out.cached += 1
            h = entries[key]
            out.hashes[key] = h or ""
            out.not_stored += h is None
        else:
            missing.append((key, int(jid)))
    to_read = missing[:limit] if reader is not None else []
    out.left_unread = len(missing) - len(to_read)
    new: dict[str, str | None] = {}
    if to_read:
        try:
            scripts = reader.stored_batch_scripts([jid for _, jid in to_read])  # type: ignore[union-attr]
        except HetslurmError as exc:
            out.notes.append(f"stored scripts could not be read: {str(exc)[:200]}")
            out.left_unread += len(to_read)
            scripts = {}
        for key, jid in to_read:
            if jid not in scripts:
                continue
            text = scripts[jid]
            h = script_hash(text) if text is not None else None
            new[key] = h
            out.hashes[key] = h or ""
            out.read += 1
            out.not_stored += h is None
    if new and cache is not None:
        save_cache(cache, {**entries, **new})
    if out.not_stored:
        out.notes.append(f"{out.not_stored} job(s) have no stored script "
                         "(AccountingStoreFlags=job_script off when they ran, or not batch "
                         "jobs): their recurring jobs are matched by user and job name")
    if out.left_unread:
        out.notes.append(f"{out.left_unread} job(s) whose script could matter were not read "
                         + ("(--max-scripts; the next run reads more)" if reader is not None
                            else "(no cluster to read them from)")
                         + ": their recurring jobs are matched by user and job name")
    return out


def attach_hashes(jobs: Any, hashes: ScriptHashes) -> Any:
    """``jobs`` with a ``script`` column: each run's hash, "" where not known."""
    import numpy as np

    col = np.full(len(jobs), "", dtype=object)
    if hashes.hashes:
        ids = {int(k.partition("@")[0]) for k in hashes.hashes}
        rows = np.flatnonzero(jobs["job_id"].isin(ids).to_numpy())
        sub = jobs.iloc[rows]
        get = hashes.hashes.get
        col[rows] = [get(cache_key(j, s), "") for j, s in zip(
            sub["job_id"].tolist(), sub["submit"].fillna(0).tolist(), strict=True)]
    return jobs.assign(script=col)
