"""The child of :mod:`hetslurm.simulate.parallel`: one replay task, JSON in, JSON lines out.

Reads the task from stdin (see :func:`hetslurm.simulate.parallel.run_parallel`), appends
each finished (policy, load) row to the task's rows file as one JSON line, stops (exit 3)
when the parent's stop file appears (checked twice a second), and prints
``{"result": ...}`` at the end; a configuration error is its message as the last line of
stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetslurm.errors import HetslurmError


def _emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _append(path: Path, row: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")


def _check_stop(stop: Path) -> None:
    if stop.exists():
        raise SystemExit(3)  # the parent was interrupted


def main() -> int:
    from hetslurm.simulate.parallel import Throttle
    from hetslurm.simulate.params import load_params
    from hetslurm.simulate.run import replay_task
    from hetslurm.simulate.traces import read_trace
    from hetslurm.site.load import load_site

    spec = json.loads(sys.stdin.read())
    rows_file, stop = Path(spec["rows_file"]), Path(spec["stop_file"])
    try:
        site = load_site(spec["site"])
        params = replace(load_params(spec["params"]), **spec["overrides"])
        trace = read_trace(spec["trace"], spec["format"])
        first, limit = spec["first"], spec["limit"]
        sample = trace.jobs[first: None if limit is None else first + limit]
        t0 = sample[0].submit
        sample = tuple(replace(j, submit=j.submit - t0) for j in sample)
        res = replay_task(
            site, sample, trace.format, params, policies=spec["policies"], run=spec["run"],
            loads=spec["loads"], seed=spec["seed"], keep_traces=spec["keep_traces"],
            label_seed=spec["label_seed"],
            progress=Throttle(lambda p, d, n: _check_stop(stop)),
            on_row=lambda row: _append(rows_file, row))
    except HetslurmError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    _emit({"result": {
        "dropped": res.dropped, "jobs_replayed": res.jobs_replayed, "examples": res.examples,
        "traces": {f"{p}@{x!r}": {"waits": t.waits, "intervals": t.intervals}
                   for (p, x), t in res.traces.items()},
    }})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
