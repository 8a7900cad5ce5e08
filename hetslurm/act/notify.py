"""Tell the site about a decision: its notifier, as an argv list, with the decision on stdin.

Placeholders are replaced inside single argv elements, so a value can never become a second
argument or shell syntax; job names and comments travel only in the JSON on stdin. A
notifier that fails or hangs is logged and never stops the run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hetslurm.errors import HetslurmError
from hetslurm.slurm.run import run_command

PLACEHOLDERS = ("{job}", "{user}", "{action}", "{rule}")


def notifier_argv(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """``template`` with each ``{name}`` replaced in place (no format mini-language)."""
    out = []
    for element in template:
        for name in ("job", "user", "action", "rule"):
            element = element.replace("{" + name + "}", values.get(name, ""))
        out.append(element)
    return out


def send(template: Sequence[str], payload: Mapping[str, Any], *, timeout: float,
         env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Run the notifier; ``(ok, detail)`` and never an exception."""
    if not template:
        return True, "no notify_command: logged only"
    argv = notifier_argv(template, {k: str(payload.get(k) or "") for k in
                                    ("job", "user", "action", "rule")})
    try:
        res = run_command(argv, timeout=timeout, env=env, check=False,
                          input=json.dumps(dict(payload), sort_keys=True, default=str) + "\n")
    except HetslurmError as exc:
        return False, str(exc)
    if res.returncode != 0:
        return False, f"notifier exited {res.returncode}: {res.stderr.strip()[-200:]}"
    return True, "sent"
