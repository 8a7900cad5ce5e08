"""Class rankings and a whole proposed site from learned speeds (``hetslurm learn speeds
--rank``, issue 22).

A class's ``devices`` order is its fallback order. From the measured ratios of one class (all
against that class's reference model), model A goes before model B only when A's 95 %
interval lies wholly above B's: the intervals separate. Otherwise the site's order stands.
The proposed order is the linear extension of that "clearly faster" order closest to the
site's: at each step, the first remaining device (in the site's order) that no remaining
device is clearly faster than. A device the class lists but that was not measured in it is
compared with nothing and keeps its place among the others. (Comparing two non-reference
models by their separate intervals ignores their covariance; it is conservative when they
are positively correlated, as ratios against one reference are.)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from typing import Any

from hetslurm.audit.speeds import SpeedResult, SpeedRow
from hetslurm.errors import ConfigError
from hetslurm.policy.ranking import proposed_order
from hetslurm.site import names
from hetslurm.site.importer import toml_key, toml_value
from hetslurm.site.model import Site


@dataclass
class ClassRanking:
    wclass: str
    site_order: tuple[str, ...]
    proposed: tuple[str, ...]
    #: One line per device: its ratio, interval and run count, or why it has none.
    evidence: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.proposed != self.site_order

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.wclass, "site_order": list(self.site_order),
                "proposed": list(self.proposed), "changed": self.changed,
                "evidence": self.evidence}


def site_gpu_models(site: Site) -> set[str]:
    return {n.gpus[0].model for n in site.nodes if n.gpus}


def check_models(result: SpeedResult, site: Site) -> None:
    """Refuse a learned table that measured a GPU model the site does not have."""
    models = site_gpu_models(site)
    for r in result.measured():
        if r.model not in models:
            shown = r.model if names.ident_problem(r.model, "model") is None else \
                repr(r.model[:40])
            raise ConfigError(f"learned speeds measured GPU model {shown}, which site "
                              f"'{site.name}' lacks (its GPU models: "
                              f"{', '.join(sorted(models)) or 'none'}); narrow --since or "
                              "fix the site")


def _evidence(dev: str, row: SpeedRow | None) -> str:
    if row is None:
        return f"{dev}: not measured in this class"
    if row.ratio is None:
        return f"{dev}: not measured: {row.note}"
    if row.note == "reference":
        return f"{dev}: 1.0 (reference, n={row.n})"
    if row.ci_low is None:
        return f"{dev}: {row.ratio} (no interval, n={row.n})"
    return f"{dev}: {row.ratio} (95% {row.ci_low}-{row.ci_high}, n={row.n})"


def rank_classes(result: SpeedResult, site: Site) -> list[ClassRanking]:
    """Per site class with two or more GPU models and a measurement: the proposed order."""
    check_models(result, site)
    classes = site.sections.get("classes", {})
    by_class: dict[str, dict[str, SpeedRow]] = {}
    for r in result.rows:
        by_class.setdefault(r.wclass, {})[r.model] = r
    gpus = site_gpu_models(site)
    out = []
    for cname, wc in classes.items():
        order = tuple(wc.devices)
        rows = by_class.get(cname)
        if rows is None or sum(d in gpus for d in order) < 2:
            continue
        proposed = proposed_order(order, {d: (rows[d].ci_low, rows[d].ci_high)
                                          for d in order
                                          if d in rows and rows[d].ratio is not None})
        out.append(ClassRanking(cname, order, tuple(proposed),
                                [_evidence(d, rows.get(d)) for d in order]))
    return out


def ranking_section(rankings: list[ClassRanking]) -> str:
    """The proposed ``[classes.NAME] devices`` fragment (TOML), changed classes only; the
    others as comments saying why they stay."""
    lines = ["", "# Class rankings: a device moves ahead only where its 95% interval lies "
             "wholly above another's."]
    for rk in rankings:
        lines.append("")
        lines += [f"# {rk.wclass}: {e}" for e in rk.evidence]
        if not rk.changed:
            lines.append(f"# {rk.wclass}: devices stay {', '.join(rk.site_order)} (no interval "
                         "separates a faster device from one listed before it)")
            continue
        lines.append(f"# {rk.wclass}: site order {', '.join(rk.site_order)}")
        lines.append(f"[classes.{toml_key(rk.wclass)}]")
        lines.append(f"devices = {toml_value(list(rk.proposed))}")
    return "\n".join(lines) + "\n"


def complete_speed_table(result: SpeedResult, site: Site) -> tuple[dict[str, dict[str, float]],
                                                                  str | None]:
    """``{model: {class: ratio}}`` over the classes with a ratio for every GPU model of the
    site (what ``[levers.speed]`` must hold to load), and why it is empty if it is."""
    models = site_gpu_models(site)
    per_class: dict[str, dict[str, float]] = {}
    for r in result.measured():
        if r.ratio is not None and names.ident_problem(r.wclass, "class") is None:
            per_class.setdefault(r.wclass, {})[r.model] = r.ratio
    full = {c: row for c, row in per_class.items() if models <= set(row)}
    if not full:
        return {}, ("no class has a measured ratio for every GPU model of the site "
                    f"({', '.join(sorted(models))})")
    table: dict[str, dict[str, float]] = {m: {} for m in sorted(models)}
    for c, row in sorted(full.items()):
        for m in models:
            table[m][c] = row[m]
    return table, None


def _toml_tables(data: dict[str, Any], path: tuple[str, ...], lines: list[str],
                 comments: dict[tuple[str, ...], list[str]] | None = None) -> None:
    """``data`` as TOML tables; ``comments``: lines (each already a ``#`` comment) written
    just above the header of the table at that path."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    subs = {k: v for k, v in data.items() if isinstance(v, dict)}
    if path and (scalars or not subs):
        lines.append("")
        lines += (comments or {}).get(path, [])
        lines.append("[" + ".".join(toml_key(p) for p in path) + "]")
    for k, v in scalars.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            # An array of inline tables (the [classify] rules): one per line, for review.
            lines.append(f"{toml_key(k)} = [")
            lines += [f"  {toml_value(x)}," for x in v]
            lines.append("]")
        else:
            lines.append(f"{toml_key(k)} = {toml_value(v)}")
    for k, v in subs.items():
        _toml_tables(v, (*path, k), lines, comments)


def merged_site(site_text: str, site_label: str, result: SpeedResult, site: Site,
                rankings: list[ClassRanking]) -> tuple[str, list[str]]:
    """The whole site file with the proposed class orders and (when complete) the learned
    ``[levers.speed]`` merged in, checked by the site loader; and notes on what was left
    out. The original's comments are not kept. Raises :class:`ConfigError` (the loader's
    message) when the merged site does not load: nothing is to be written then."""
    from hetslurm.site.load import parse_site

    data = tomllib.loads(site_text)
    notes: list[str] = []
    for rk in rankings:
        if rk.changed:
            data["classes"][rk.wclass]["devices"] = list(rk.proposed)
    table, why = complete_speed_table(result, site)
    levers = data.get("levers") if isinstance(data.get("levers"), dict) else None
    if why:
        notes.append(f"[levers.speed] not proposed: {why}")
    elif levers is not None and levers.get("speed_table"):
        notes.append("[levers.speed] not proposed: the site reads levers.speed_table; "
                     "the learned table is in the --out fragment")
    else:
        data.setdefault("levers", {})["speed"] = table
    head = [f"# {site_label} with the class rankings and [levers.speed] measured by "
            "`hetslurm learn speeds` merged in.",
            "# Written from the parsed file: its comments are not kept. Review with "
            "`hetslurm site diff` before `site apply`."]
    for k in ("schema_version", "name", "description"):
        if k in data:
            head.append(f"{k} = {toml_value(data.pop(k))}")
    lines: list[str] = []
    try:
        _toml_tables(data, (), lines)
    except TypeError as exc:  # a TOML date or time: no site key holds one
        raise ConfigError(f"{site_label}: cannot write the merged site: {exc}") from exc
    text = "\n".join(head + lines) + "\n"
    parse_site(text, "<merged site>")
    return text, notes
