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
from hetslurm.process import run_command

#: What ``{name}`` a notify_command element may hold.
PLACEHOLDERS = ("job", "user", "action", "rule")
#: Longest placeholder value put into an argument, and longest notifier stderr kept in the
#: action log (characters).
MAX_VALUE = 256
MAX_DETAIL = 200


def clean(text: str, limit: int) -> str:
    """``text`` safe to print and to pass as one argument: every character that is not
    printable (controls such as NUL, newline, ESC of terminal escape sequences, DEL, C1,
    bidi overrides, lone surrogates) becomes ``?``, and past ``limit`` characters it is cut
    to ``limit - 3`` and ``...`` is added."""
    out = "".join(c if c.isprintable() else "?" for c in text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def notifier_argv(template: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """``template`` with each ``{name}`` replaced in place (no format mini-language) by its
    :func:`clean` value: a NUL would make the argument list unusable, a newline or escape
    sequence would reach whatever the notifier prints."""
    out = []
    for element in template:
        for name in PLACEHOLDERS:
            element = element.replace("{" + name + "}", clean(values.get(name, ""), MAX_VALUE))
        out.append(element)
    return out


def send(template: Sequence[str], payload: Mapping[str, Any], *, timeout: float,
         env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Run the notifier; ``(ok, detail)`` and never an exception."""
    if not template:
        return True, "no notify_command: logged only"
    argv = notifier_argv(template, {k: str(payload.get(k) or "") for k in PLACEHOLDERS})
    try:
        # JSON escapes every control character (ensure_ascii), so names and comments reach
        # the notifier's stdin as data, whatever bytes they hold.
        res = run_command(argv, timeout=timeout, env=env, check=False,
                          input=json.dumps(dict(payload), sort_keys=True, default=str) + "\n")
    except (HetslurmError, OSError, ValueError) as exc:
        # OSError: E2BIG for a template past the kernel's argument limit; ValueError: a NUL
        # written into the template itself.
        return False, clean(str(exc), MAX_DETAIL)
    if res.returncode != 0:
        tail = res.stderr.strip()[-MAX_DETAIL:]
        return False, f"notifier exited {res.returncode}: {clean(tail, MAX_DETAIL)}"
    return True, "sent"
