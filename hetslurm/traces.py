"""Where the public workload traces are: the one place ``$HETSLURM_TRACES`` is resolved.

The traces are data shared beside the project (never copied into it). Without
``$HETSLURM_TRACES``, hetslurm looks for ``../shared/traces`` beside the working directory
(a command run from the checkout's root) and beside the source checkout (an editable
install); an installed copy of hetslurm knows no checkout, so there the working directory
decides.
"""

from __future__ import annotations

import os
from pathlib import Path

TRACES_ENV = "HETSLURM_TRACES"


def traces_dir() -> Path:
    """The traces folder; it may not exist (callers say so and skip or fail clearly)."""
    env = os.environ.get(TRACES_ENV)
    if env:
        return Path(env)
    candidates = [
        Path.cwd().resolve().parent / "shared" / "traces",
        Path(__file__).resolve().parents[2] / "shared" / "traces",
    ]
    for cand in candidates:
        if cand.is_dir():
            return cand
    return candidates[0]
