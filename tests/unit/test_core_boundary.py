"""Every Python entry point of the compiled core refuses short and mismatched buffers.

Finding 9 of issue 18: ``hetslurm._core.choose_gpus`` with a short output buffer corrupted the
heap and aborted the process; a short island array was read out of bounds. Each kernel's
cases (``_core_boundary_cases.py``) run in a child interpreter, so a regression that aborts
fails this test with the child's signal instead of killing pytest; the child must exit 0
with every case's exact error, and a valid call after the refusals must still work.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _core_boundary_cases import KERNELS

pytest.importorskip("hetslurm._core", reason="compiled core not built")

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_refuses_short_and_mismatched_buffers(kernel: str) -> None:
    result = subprocess.run(
        [sys.executable, str(HERE / "_core_boundary_cases.py"), kernel],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=HERE.parents[1],
    )
    assert result.returncode == 0, (
        f"the child exited {result.returncode} (a negative code is the signal that killed "
        f"it)\n{result.stdout}\n{result.stderr}"
    )
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) >= 5
    assert rows[-1]["case"].startswith("valid ")
    wrong = [r for r in rows if r["got"] != r["expected"]]
    assert not wrong, json.dumps(wrong, indent=1)


def test_every_python_entry_point_is_covered() -> None:
    import hetslurm._core as core

    # The module's callables and the PlacementCore methods Python can reach.
    public = {n for n in dir(core) if not n.startswith("_") and callable(getattr(core, n))}
    methods = {n for n in vars(core.PlacementCore) if not n.startswith("_")}
    assert public == {"GpuChooser", "NodeSpans", "PlacementCore", "Releases", "choose_gpus",
                      "choose_gpus_batch"}
    assert {"place", "place_batch", "evaluate", "static_fit", "take", "refresh"} <= methods
    # GpuChooser has no Python-level method; state()/index_buckets() only read the core's
    # own arrays (their "never built" refusal is a PlacementCore case).
    assert not {n for n in vars(core.GpuChooser) if not n.startswith("_")} - {"capacity"}
    assert methods - {"place", "place_batch", "evaluate", "static_fit", "take",
                      "refresh"} <= {
        "state", "index_buckets", "fpga_index_buckets", "n_nodes", "n_gpu_models",
        "n_fpga_models", "n_switches", "max_gpus", "max_numa", "max_fpgas",
    }
