"""Whether a job's output survives a requeue (Slurm truncates it unless opened in append mode).

Slurm 22.05 does not print a job's open mode: ``scontrol show job`` has ``StdOut=``/
``StdErr=`` but no ``OpenMode``, ``squeue --json`` has no such field either, and the
``--open-mode`` a user gave on the command line is not kept anywhere a tool can read. What can
be read is (docs/act.md#output-mode):

* ``JobFileAppend=1`` in the controller's configuration (``scontrol show config``): every
  job appends;
* ``#SBATCH --open-mode=append`` in the batch script (``scontrol write batch_script ID -``);
* ``StdOut``/``StdErr`` both ``/dev/null``: nothing to lose.

Anything else is ``unknown``, which the policy treats as "not append" (skip and notify).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping

from hetslurm.errors import HetslurmError
from hetslurm.process import run_command
from hetslurm.slurm.parse import scontrol_pairs

#: ``append``, ``truncate`` (the script says so), ``discarded`` (/dev/null) or ``unknown``.
OutputProbe = Callable[[str], str]



def script_open_mode(script: str) -> str | None:
    """``append``/``truncate`` from the script's ``#SBATCH`` lines (the last one wins)."""
    mode = None
    for line in script.splitlines():
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.startswith("#"):
                break  # sbatch stops reading #SBATCH at the first command
            continue
        try:
            words = shlex.split(line[len("#SBATCH"):], comments=True)
        except ValueError:
            continue
        for i, w in enumerate(words):
            if w.startswith("--open-mode="):
                mode = w.split("=", 1)[1]
            elif w == "--open-mode" and i + 1 < len(words):
                mode = words[i + 1]
    return mode if mode in ("append", "truncate") else None


class SlurmOutputProbe:
    """Reads the three facts above through Slurm's CLIs (argv lists, timeouts)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
        self._env = dict(env) if env is not None else None
        self._timeout = timeout
        self._file_append: bool | None = None

    def _run(self, *argv: str) -> str | None:
        try:
            out = run_command(argv, timeout=self._timeout, env=self._env, check=False)
        except HetslurmError:
            return None
        return out.stdout if out.returncode == 0 else None

    def job_file_append(self) -> bool:
        if self._file_append is None:
            text = self._run("scontrol", "show", "config") or ""
            m = re.search(r"^JobFileAppend\s*=\s*(\d+)", text, re.M)
            self._file_append = bool(m and m.group(1) == "1")
        return self._file_append

    def __call__(self, job_ref: str) -> str:
        if self.job_file_append():
            return "append"
        shown = self._run("scontrol", "show", "job", "-o", job_ref)
        if shown:
            pairs = dict(scontrol_pairs(shown.splitlines()[0]))
            if pairs.get("StdOut") == "/dev/null" and pairs.get("StdErr") == "/dev/null":
                return "discarded"
        script = self._run("scontrol", "write", "batch_script", job_ref, "-")
        mode = script_open_mode(script) if script else None
        return mode or "unknown"
