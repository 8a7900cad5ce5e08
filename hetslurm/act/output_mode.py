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

import shlex
from collections.abc import Mapping

from hetslurm.errors import HetslurmError
from hetslurm.slurm import SlurmBackend


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
    """Reads the three facts above through the Slurm access layer; a fact Slurm does not
    give (a command failed, the job is gone) counts as not known."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout: float = 30.0, *,
                 backend: SlurmBackend | None = None) -> None:
        if backend is None:
            from hetslurm.slurm.cli_backend import CliBackend

            backend = CliBackend(env, timeout=timeout)
        self._slurm = backend
        self._file_append: bool | None = None

    def job_file_append(self) -> bool:
        if self._file_append is None:
            try:
                config = self._slurm.config()
            except HetslurmError:
                config = {}
            self._file_append = config.get("JobFileAppend") == "1"
        return self._file_append

    def __call__(self, job_ref: str) -> str:
        if self.job_file_append():
            return "append"
        try:
            files = self._slurm.job_output_files(job_ref)
        except HetslurmError:
            files = None
        if files is not None and files.stdout == files.stderr == "/dev/null":
            return "discarded"
        try:
            script: str | None = self._slurm.batch_script(job_ref)
        except HetslurmError:
            script = None
        mode = script_open_mode(script) if script else None
        return mode or "unknown"
