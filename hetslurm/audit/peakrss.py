"""Run the hetslurm CLI and report this process's own peak memory on stderr.

``python -m hetslurm.audit.peakrss audit ...`` behaves as ``hetslurm audit ...`` and, at
exit, writes ``hetslurm-peak-rss-kb N`` to stderr. The benchmark reads that line rather than
``getrusage(RUSAGE_CHILDREN).ru_maxrss``: on Linux a child's ``ru_maxrss`` starts from the
RSS of the process that spawned it (the kernel keeps the pre-exec high-water mark), so a
benchmark that has just generated a 4 GB data set would read 4 GB whatever the audit used.
``VmHWM`` in ``/proc/self/status`` is the high-water mark of the memory of this program
alone, counted from its exec.
"""

from __future__ import annotations

import atexit
import sys

MARKER = "hetslurm-peak-rss-kb"


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
    from hetslurm.cli import main as cli_main

    atexit.register(_report)
    sys.argv = ["hetslurm", *sys.argv[1:]]
    cli_main()


if __name__ == "__main__":
    main()
