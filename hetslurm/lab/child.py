"""How the lab starts a Python child: on the installed hetslurm, whatever the working folder."""

from __future__ import annotations

import sys


def python_module(module: str, *args: str) -> list[str]:
    """argv for ``python -m MODULE ARGS...`` with this interpreter.

    ``-P`` (Python 3.11+) keeps the working folder off the front of ``sys.path``: without it
    a benchmark started from a checkout's root imports the source tree beside it, which has
    no compiled core (``CoreNotBuiltError``), instead of the installed package the parent
    runs. ``PYTHONPATH`` still applies, so a developer's own path setting is kept.
    """
    return [sys.executable, "-P", "-m", module, *args]
