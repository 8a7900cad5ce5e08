"""Rendering for the ``--format table|json|csv`` option (:mod:`hetslurm.cli.options`).

Data goes to stdout, messages to stderr. A command returns rows (a list of flat dicts) or a
JSON-able document; :func:`emit` renders it in the chosen format.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Sequence
from typing import Any

# The option is declared with the other shared options; it is imported from here too.
from hetslurm.cli.options import FORMATS, format_option

__all__ = ["FORMATS", "emit", "format_option"]


def emit(
    rows: Sequence[dict[str, Any]],
    output_format: str,
    *,
    title: str | None = None,
    document: Any = None,
) -> None:
    """Write ``rows`` to stdout in ``output_format``.

    Args:
        rows: flat records; keys of the first row give the column order.
        output_format: one of :data:`FORMATS`.
        title: table caption (table format only).
        document: what ``json`` prints instead of ``rows`` when a command has a richer
            structure than a flat table (e.g. nested totals).
    """
    if output_format == "json":
        json.dump(rows if document is None else document, sys.stdout, indent=2, sort_keys=False)
        sys.stdout.write("\n")
        return
    columns = list(rows[0].keys()) if rows else []
    if output_format == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
        sys.stdout.write(buf.getvalue())
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        # Cells hold data (job names, comments): never markup ("[/]" would raise), never a
        # control character that reaches the terminal.
        table.add_row(*(escape(_printable(_cell(row.get(c)))) for c in columns))
    Console().print(table)


def _printable(text: str) -> str:
    return text if text.isprintable() else "".join(c if c.isprintable() else "?"
                                                    for c in text)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)
