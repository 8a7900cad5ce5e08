"""A sweep over both cores: each (seed, policy) replay task in a child process.

The replay is pure Python, so one process uses one core; :func:`run_parallel` starts up to
``workers`` children (``python -m hetslurm.simulate.worker``), each given one task as JSON on
stdin (the site, trace and parameter files by path, the policies, loads and seed). A child
reads the files again, replays, appends each finished row to its own file and at the end
prints one line with what was dropped (and the per-job outcomes for plots, where asked).
Nothing is pickled; each child runs through :func:`hetslurm.process.run_command` (an
argument list, a time limit). A child that dies or runs out of time keeps the rows it
finished and turns the missing ones into error rows: the rest of the sweep stands, as with
an error inside one replay.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetslurm.errors import CommandError, ConfigError
from hetslurm.process import run_command
from hetslurm.simulate.params import Params, load_params
from hetslurm.simulate.traces import Trace
from hetslurm.site.model import Site

#: How long one (seed, policy) task may run, every load together.
TASK_TIMEOUT_S = 6 * 3600.0


def spec_params(params: Params) -> dict[str, Any]:
    """What a child changes in the parameter file it reads: the speeds (``--speed-exponent``)
    and the backfill model (``--backfill``).

    Raises:
        ConfigError: ``params`` differs from its file in anything else (it cannot be
            handed to a child by path).
    """
    speeds = {c: dict(row) for c, row in params.speeds.items()}
    again = replace(load_params(params.path), speeds=speeds, backfill=params.backfill)
    if again != replace(params, speeds=speeds, seed=0):
        raise ConfigError(f"{params.path}: the parameters were changed in memory beyond "
                          "the speeds and the backfill model; --workers needs them as a file")
    return {"speeds": speeds, "backfill": params.backfill}


def run_parallel(site: Site, trace: Trace, params: Params, *, policies: Sequence[str],
                 loads: Sequence[float], first: int, limit: int | None,
                 tasks: Sequence[tuple[int, str]], workers: int, keep_traces_seed: int,
                 progress: Callable[[str, int, int], None] | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
                 timeout_s: float = TASK_TIMEOUT_S) -> list[Any]:
    """Each (seed, policy) of ``tasks`` in a child, at most ``workers`` at once; the
    :class:`hetslurm.simulate.run.TaskResult` of each, in the order of ``tasks``.

    A child writes each finished row to its own file, so the rows it finished survive its
    crash or time limit; they reach ``on_row`` when the child ends. ``progress`` counts
    finished replays (label ``"replays"``). On an interrupt every child is told to stop
    (a file each checks twice a second) and the interrupt goes on."""
    from hetslurm.simulate.run import TaskResult

    overrides = spec_params(params)
    lock = threading.Lock()
    total = len(tasks) * len(loads)
    finished = [0]
    with tempfile.TemporaryDirectory(prefix="hetslurm-sim-") as tmp:
        stop = Path(tmp) / "stop"

        def one(k: int, task: tuple[int, str]) -> TaskResult:
            seed, policy = task
            rows_file = Path(tmp) / f"rows-{k}.jsonl"
            spec = {"site": site.path, "trace": trace.path, "format": trace.format,
                    "params": params.path, "overrides": overrides,
                    "policies": list(policies), "run": [policy], "loads": list(loads),
                    "seed": seed, "first": first, "limit": limit,
                    "keep_traces": seed == keep_traces_seed,
                    "label_seed": len({t[0] for t in tasks}) > 1,
                    "rows_file": str(rows_file), "stop_file": str(stop)}
            out = TaskResult([], {}, 0)
            why = ""
            if stop.exists():
                return out
            try:
                res = run_command([sys.executable, "-m", "hetslurm.simulate.worker"],
                                  input=json.dumps(spec), timeout=timeout_s,
                                  env=child_env(), cwd=tmp)
                _fill(out, json.loads(res.stdout.strip().splitlines()[-1])["result"])
            except CommandError as exc:
                f = exc.failure
                last = f.stderr.strip().splitlines()[-1] if f and f.stderr.strip() else ""
                if f and not f.timed_out and f.returncode == 2:
                    raise ConfigError(last) from None  # the child's refusal, as one line
                why = (f"ran past its {timeout_s:g} s time limit" if f and f.timed_out
                       else f"exited {f.returncode if f else '?'}") + (
                           f": {last}" if last else "")
            if rows_file.exists():
                out.rows = [json.loads(x) for x in rows_file.read_text().splitlines() if x]
            done = {r["load"] for r in out.rows}
            out.rows += [{"policy": policy, "load": x, "seed": seed,
                          "error": f"WorkerError: the replay's child {why or 'wrote no row'}",
                          "seconds": 0.0} for x in loads if x not in done]
            with lock:
                for row in out.rows:
                    if on_row is not None:
                        on_row(row)
                finished[0] += len(out.rows)
                if progress is not None:
                    progress("replays", finished[0], total)
            return out

        pool = ThreadPoolExecutor(max_workers=min(workers, len(tasks)))
        try:
            futures = [pool.submit(one, k, t) for k, t in enumerate(tasks)]
            return [f.result() for f in futures]
        except BaseException:
            stop.touch()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def child_env() -> dict[str, str]:
    """Our environment, with the folder that holds the ``hetslurm`` we run first on
    ``PYTHONPATH``: the child imports the same package (and its compiled core), not a
    source tree without one that happens to be its working folder or on its path."""
    import hetslurm

    home = str(Path(hetslurm.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [home] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != home])
    return env


def _fill(out: Any, result: dict[str, Any]) -> None:
    from hetslurm.simulate.run import RunTrace

    out.dropped = result["dropped"]
    out.jobs_replayed = result["jobs_replayed"]
    out.examples = result["examples"]
    for key, t in result.get("traces", {}).items():
        policy, load = key.rsplit("@", 1)
        out.traces[(policy, float(load))] = RunTrace(
            list(t["waits"]), [(a, b, int(g)) for a, b, g in t["intervals"]])


class Throttle:
    """Calls ``fn`` at most every ``every_s`` seconds (and always for the last count)."""

    def __init__(self, fn: Callable[[str, int, int], None], every_s: float = 0.5) -> None:
        self.fn = fn
        self.every_s = every_s
        self.last = 0.0

    def __call__(self, policy: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done >= total or now - self.last >= self.every_s:
            self.last = now
            self.fn(policy, done, total)
