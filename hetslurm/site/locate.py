"""Map TOML key paths to source lines, so every configuration error can name its line.

``tomllib`` returns plain dicts with no positions. The site files hetslurm reads use a
small subset of TOML (tables, dotted and quoted keys, inline tables and arrays that may span
lines), so a line scanner that tracks the current table header and bracket depth is enough
to find where a key was written. An unknown path falls back to its longest known prefix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

KeyPath = tuple[str | int, ...]

_BARE = r"[A-Za-z0-9_-]+"
_PART = rf'(?:{_BARE}|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_DOTTED = rf"{_PART}(?:\s*\.\s*{_PART})*"
_HEADER = re.compile(rf"^\s*(\[\[?)\s*({_DOTTED})\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(rf"^\s*({_DOTTED})\s*=")
_SPLIT = re.compile(_PART)


def _parts(dotted: str) -> tuple[str, ...]:
    out = []
    for m in _SPLIT.finditer(dotted):
        tok = m.group(0)
        if tok[0] in "\"'":
            tok = tok[1:-1]
        out.append(tok)
    return tuple(out)


def _depth_change(line: str) -> int:
    """Net change of [ and { nesting on a line, ignoring strings and comments."""
    depth = 0
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        i += 1
    return depth


class LineIndex:
    """Where each table and key of a TOML document was written (1-based lines)."""

    def __init__(self, text: str) -> None:
        self._lines: dict[KeyPath, int] = {}
        table: KeyPath = ()
        array_counts: dict[KeyPath, int] = {}
        depth = 0
        for lineno, line in enumerate(text.splitlines(), start=1):
            if depth > 0:
                depth += _depth_change(line)
                continue
            header = _HEADER.match(line)
            if header:
                path: KeyPath = _parts(header.group(2))
                if header.group(1) == "[[":
                    idx = array_counts.get(path, 0)
                    array_counts[path] = idx + 1
                    path = (*path, idx)
                table = path
                self._record(table, lineno)
                continue
            key = _KEY.match(line)
            if key:
                full = (*table, *_parts(key.group(1)))
                self._record(full, lineno)
                depth = max(0, _depth_change(line[key.end() :]))

    def _record(self, path: KeyPath, lineno: int) -> None:
        # A table written only through its children (``[switches.leaf1]`` and no
        # ``[switches]``) is located where its first child was written, so an error about
        # the whole table still names a line.
        for end in range(1, len(path) + 1):
            self._lines.setdefault(path[:end], lineno)

    def line_of(self, path: Sequence[str | int]) -> int | None:
        """The line of ``path`` or of its longest recorded prefix; None if nothing matches."""
        p = tuple(path)
        while p:
            if p in self._lines:
                return self._lines[p]
            p = p[:-1]
        return None
