"""Helpers for cluster tests (a module of its own: tests/ is not a package, so that the
installed hetslurm is what the tests import)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hetslurm.process import run_command
from hetslurm.site import Site
from hetslurm.slurm import versions
from hetslurm.testbed import Testbed
from hetslurm.testbed.procs import marked_pids

_ROOT = Path(__file__).resolve().parents[2]


def session_testbed() -> Testbed:
    """The session's testbed (not brought up): its folder is ``.testbed-tests`` in the
    checkout or ``$HETSLURM_TEST_TESTBED_DIR``; its release the host's or
    ``$HETSLURM_TEST_SLURM`` (24.11|26.05, from its cached root)."""
    return Testbed(os.environ.get("HETSLURM_TEST_TESTBED_DIR", _ROOT / ".testbed-tests"),
                   slurm=os.environ.get("HETSLURM_TEST_SLURM") or None)


def release_under_test() -> versions.Release:
    """The release the session's testbed runs (what conftest's fixture brings up), known at
    collection time, so a test module can generate just the tests that apply to it."""
    return versions.release(session_testbed().slurm_release)


class Jobs:
    """Submits jobs for one test and cancels them afterwards."""

    def __init__(self, env: dict[str, str], gres: str = "gres:") -> None:
        self.env = env
        self.ids: list[str] = []
        #: How the testbed's release names a gres in TresPerNode ("gres:" on 22.05,
        #: "gres/" from 24.11).
        self.gres = gres

    def sbatch(self, *args: str, script: str = "sleep 30") -> str:
        res = run_command(["sbatch", "--parsable", "-o", "/dev/null", *args, "--wrap", script],
                          timeout=60, env=self.env)
        job_id = res.stdout.strip().split(";")[0]
        self.ids.append(job_id)
        return job_id

    def field(self, job_id: str, key: str) -> str:
        out = run_command(["scontrol", "show", "job", "-o", job_id], timeout=30,
                          env=self.env).stdout
        for tok in out.split():
            if tok.startswith(f"{key}="):
                return tok.split("=", 1)[1]
        raise KeyError(key)

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        state = "?"
        while time.monotonic() < deadline:
            state = self.field(job_id, "JobState")
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} still {state} after {timeout}s, wanted {states}")

    def sacct(self, job_id: str, fields: str, timeout: float = 60) -> dict[str, str]:
        """One allocation's accounting record, waiting for slurmdbd to have it."""
        names = fields.split(",")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = run_command(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields],
                              timeout=30, env=self.env).stdout.strip()
            if out:
                row = dict(zip(names, out.splitlines()[0].split("|"), strict=True))
                if all(row.values()):
                    return row
            time.sleep(0.5)
        raise AssertionError(f"sacct has no complete record of job {job_id}")

    def cancel_all(self) -> None:
        if self.ids:
            run_command(["scancel", *self.ids], timeout=60, env=self.env)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                out = run_command(["squeue", "-h", "-o", "%i"], timeout=30,
                                  env=self.env).stdout.split()
                if not set(out) & set(self.ids):
                    return
                time.sleep(0.5)
            raise AssertionError(f"jobs {self.ids} did not end after scancel")


def nodes_with(site: Site, pred: Callable[..., bool]) -> set[str]:
    return {n.name for n in site.nodes if pred(n)}


@contextmanager
def own_testbed(prefix: str, site_file: Path) -> Iterator[Testbed]:
    """A testbed of a test module's own (short /tmp path for the unix sockets), for tests
    that restart or break the cluster; brought down at the end, with nothing left running."""
    if os.geteuid() != 0:
        raise AssertionError("cluster tests need root (the testbed starts Slurm daemons)")
    root = Path(f"/tmp/{prefix}{os.getpid()}")
    shutil.rmtree(root, ignore_errors=True)
    bed = Testbed(root)
    try:
        bed.up(site_file)
        yield bed
    finally:
        bed.down()
        left = marked_pids(str(root))
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"testbed processes left running: {left}"


def device_samples(env: dict[str, str], util: dict[int, float | None], now: float,
                   window_s: float = 60.0, interval_s: float = 5.0):  # -> pandas.DataFrame
    """Samples every ``interval_s`` over the window on each GPU the job holds (node and
    Slurm index from the live allocation, as the collector attributes them); ``None``: the
    GPU is in MIG mode (unknown). The idle rule needs every allocated GPU covered."""
    import pandas as pd

    from hetslurm.errors import HetslurmError
    from hetslurm.policy.stall import allocated_devices
    from hetslurm.slurm.cli_backend import CliBackend

    backend = CliBackend(env)
    held: dict[int, list[tuple[str, int]]] = {}
    for jid in util:
        try:
            held[jid] = allocated_devices(backend.job(jid)) or []
        except HetslurmError:  # ended and gone: no GPU, no samples
            held[jid] = []
    rows = []
    t = now - window_s
    while t < now:
        for jid, u in util.items():
            for node, idx in held.get(jid, []):
                rows.append({"time": t, "node": node, "minor": idx, "slurm_index": idx,
                             "job_id": jid, "utilization_pct": 0.0 if u is None else u,
                             "memory_used_mib": 10.0, "status": "mig" if u is None else "ok",
                             "interval_s": interval_s})
        t += interval_s
    columns = ["time", "node", "minor", "slurm_index", "job_id", "utilization_pct",
               "memory_used_mib", "status", "interval_s"]
    return pd.DataFrame(rows, columns=columns).astype({"job_id": "Int64"})
