"""Run a program's entry point and report this process's own peak memory on stderr.

``python -m hetslurm.lab.peakrss hetslurm.cli:main audit ...`` behaves as ``hetslurm
audit ...`` and, at exit, writes ``hetslurm-peak-rss-kb N`` to stderr. The benchmark reads
that line rather than ``getrusage(RUSAGE_CHILDREN).ru_maxrss``: on Linux a child's
``ru_maxrss`` starts from the RSS of the process that spawned it (the kernel keeps the
pre-exec high-water mark), so a benchmark that has just generated a 4 GB data set would read
4 GB whatever the audit used.
``VmHWM`` in ``/proc/self/status`` is the high-water mark of the memory of this program
alone, counted from its exec.

The entry point is named as text, as ``[project.scripts]`` names it, and resolved only in
the child: the lab runs the command line as a program, as a user runs it, and never imports
it (nothing but ``hetslurm.cli`` imports ``hetslurm.cli``; docs/architecture.md).
"""

from __future__ import annotations

import atexit
import importlib
import sys

MARKER = "hetslurm-peak-rss-kb"
#: The ``hetslurm`` command, as pyproject.toml's ``[project.scripts]`` names it.
CLI_ENTRY = "hetslurm.cli:main"


def peak_rss_kb() -> int | None:
    """This process's peak resident set size in KiB since exec (None off Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def parse_marker(stderr: str) -> int | None:
    """The KiB reported by :func:`main` in a child's stderr, if it is there."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(MARKER + " "):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def _report() -> None:
    kb = peak_rss_kb()
    if kb is not None:
        sys.stderr.write(f"{MARKER} {kb}\n")
        sys.stderr.flush()


def main() -> None:
    """``python -m hetslurm.lab.peakrss MODULE:FUNCTION ARGS...``: FUNCTION() with ARGS."""
    if len(sys.argv) < 2 or ":" not in sys.argv[1]:
        sys.exit("usage: python -m hetslurm.lab.peakrss MODULE:FUNCTION [ARGS...]")
    module, _, function = sys.argv[1].partition(":")
    entry = getattr(importlib.import_module(module), function)
    atexit.register(_report)
    sys.argv = ["hetslurm", *sys.argv[2:]]
    entry()


if __name__ == "__main__":
    main()
