"""Prediction agrees with enforcement (issue 19, item 3).

For every script of a generated corpus (the hook corpus's request generator, 8,000 requests
through scripts and comments) and every golden placement case, the real hook runs in the
stand-in and ``place`` predicts on the empty demo cluster from the same request, resolved by
the same Lua. The oracle is *Slurm's* view, not a copy of the rules: the fields the hook
staged (partition, typed gres or model features, memory, cores, sockets, node count) are
checked against the site's nodes as slurmctld would check them.

* The hook rewrites -> every node ``place`` predicts satisfies the staged fields, and it
  predicts as many nodes as the job will get; when ``place`` finds no placement on the empty
  cluster, no set of nodes satisfies them either (or the reason is a locality rule hetslurm
  holds stricter than Slurm, counted and bounded below).
* The hook rejects -> ``place`` refuses the request with the same message (less the line
  prefix the hook adds).
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
from test_hook_corpus import random_request, wrap

from hetslurm.errors import PlacementError
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.placement.model import ClusterModel
from hetslurm.placement.place import place
from hetslurm.request.language import parse_request, resolve
from hetslurm.site import Site, load_site
from hetslurm.site.model import NodeSpec
from hetslurm.slurm.units import parse_gres

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261203
CASES = 8000
PREFIX = re.compile(r"^(#HET line \d+|--comment het:): ")


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(ROOT / "site-configs" / "demo.toml")


# Slurm's view of the staged fields ------------------------------------------------------------


def _gres(tres_per_node: str | None) -> list[tuple[str, str | None, int]]:
    """``gres:gpu:a100:2,gres:fpga:1`` -> [(kind, model or None, count)]."""
    return [(it.name, it.type, it.count) for it in parse_gres(tres_per_node)]


def _features_hold(expr: str | None, have: set[str]) -> bool:
    """Slurm's plain feature expressions as the hook writes them: ``a``, ``a|b``, ``a&b``."""
    if not expr:
        return True
    if "|" in expr:
        return any(f in have for f in expr.split("|"))
    return all(f in have for f in expr.split("&"))


def slurm_allows(node: NodeSpec, fields: dict[str, Any], site: Site) -> bool:
    """Whether slurmctld may run one node's share of the job on ``node``."""
    partition = fields.get("partition") or next(
        (name for name, p in site.partitions.items() if p.spec.default), None)
    if partition is not None and not any(
            node.name in (site.partitions[p] if p in site.partitions else site.ranked[p]).nodes
            for p in partition.split(",")):
        return False  # (a site file without partitions: every node, as place assumes)
    for kind, model, count in _gres(fields.get("tres_per_node")):
        devices = node.gpus if kind == "gpu" else node.fpgas
        if sum(1 for d in devices if model is None or d.model == model) < count:
            return False
    if not _features_hold(fields.get("features"), set(node.features)):
        return False
    if fields.get("min_mem_per_node", 0) > node.spec.memory:
        return False
    if fields.get("pn_min_cpus", 1) > node.cpus:
        return False
    one_socket = fields.get("sockets_per_node") == 1
    return not (one_socket and fields.get("cores_per_socket", 1) > node.spec.cores_per_socket)


def job_nodes(fields: dict[str, Any]) -> int:
    return int(fields.get("min_nodes", 1))


# The comparison -------------------------------------------------------------------------------


def compare(rt: HookRuntime, model: ClusterModel, site: Site, job: dict[str, Any],
            text: str, stats: dict[str, int]) -> str | None:
    """None when the hook and place agree on ``job`` (whose request text is ``text``)."""
    res = rt.submit(job)
    if not res.ok:
        return f"hook error {res.error}"
    try:
        request = resolve(parse_request(text), site)
        refused = None
    except PlacementError as e:
        refused = str(e)
    if res.rc != 0:
        stats["rejected"] += 1
        hook_msg = PREFIX.sub("", res.user_messages[0]) if res.user_messages else "?"
        if refused != hook_msg:
            return f"hook rejects {hook_msg!r}; place says {refused!r}"
        return None
    if refused is not None:
        return f"hook accepts ({res.writes}); place refuses {refused!r}"
    fields = {f: v for f, v in res.writes if f not in ("admin_comment", "comment")}
    if not fields:
        return None  # no request
    allowed = [n for n in site.nodes if slurm_allows(n, fields, site)]
    need = job_nodes(fields)
    p = place(model, request)
    if p.placeable:
        stats["placed"] += 1
        names = [n.name for n in p.nodes]
        if len(names) != need:
            return f"place predicts {len(names)} node(s), the job gets {need}: {fields}"
        outside = [n for n in names if n not in {a.name for a in allowed}]
        if outside:
            return f"place predicts {outside}, which Slurm forbids for {fields}"
        return None
    stats["unplaceable"] += 1
    if len(allowed) < need:
        return None
    if not p.impossible:
        return None  # busy now (live state): Slurm holds the job pending too
    if p.blocking in ("nvlink", "numa", "islands", "switch", "locality"):
        stats["stricter-locality"] += 1  # hetslurm holds locality harder than Slurm does
        return None
    return (f"place finds no placement ({p.blocking}: {p.reason}) but Slurm allows "
            f"{[a.name for a in allowed]} for {fields}")


def test_prediction_agrees_with_enforcement_over_the_corpus(demo: Site) -> None:
    rt = HookRuntime(render_hook(demo).text)
    model = ClusterModel.from_site(demo)
    rnd = random.Random(SEED)
    stats = {"rejected": 0, "placed": 0, "unplaceable": 0, "stricter-locality": 0}
    failures = []
    for i in range(CASES):
        words = random_request(rnd)
        text = " ".join(words)
        job: dict[str, Any] = ({"comment": "het: " + text} if i % 5 == 0
                               else {"script": wrap(rnd, words)[0]})
        job["user_name"] = "root"  # the demo site's high-priority user
        why = compare(rt, model, demo, job, text, stats)
        if why is not None:
            failures.append(f"{i} {text!r}: {why}")
    assert not failures, f"{len(failures)} of {CASES} disagree:\n" + "\n".join(failures[:20])
    # The corpus exercises every branch, and the locality exception stays an exception.
    assert stats["rejected"] > 300 and stats["placed"] > 1500 and stats["unplaceable"] > 50, stats
    assert stats["stricter-locality"] <= stats["placed"] // 50, stats


ENERGY_LOW = "#!/bin/sh\n#HET gpus=1 energy=low\ntrue\n"


def test_energy_low_one_answer(demo: Site) -> None:
    """The issue's case: explain's hook writes an A100 gres and place predicts an A100 node,
    never an H100 one (both read the hook's own resolve)."""
    rt = HookRuntime(render_hook(demo).text)
    res = rt.submit({"script": ENERGY_LOW})
    assert res.fields["tres_per_node"] == "gres:gpu:a100:1"
    request = resolve(parse_request("gpus=1 energy=low"), demo)
    assert request.gpu_models == ("a100",) and request.own_gpu_models == ()
    p = place(ClusterModel.from_site(demo), request)
    assert p.placeable and [n.name for n in p.nodes] in (["gpu3"], ["gpu4"])
    # With a class the request's own list is kept for relax to widen back to.
    r = resolve(parse_request("gpus=2 class=train energy=low"), demo)
    assert (r.gpu_models, r.own_gpu_models) == (("a100",), ("h100", "a100"))


GOLDEN = sorted((ROOT / "tests/data/placement/golden").glob("*.toml"))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_prediction_agrees_with_enforcement_on_the_golden_cases(path: Path) -> None:
    """Each golden placement case's request, as a user would write it (``format_request``),
    through that case's site's hook and through ``place`` on the case's live state: the
    predicted nodes satisfy what the hook staged, and a rejection is place's refusal."""
    import tomllib

    from test_place_golden import load_case

    from hetslurm.request.language import format_request
    from hetslurm.site.load import parse_site

    case = tomllib.loads(path.read_text(encoding="utf-8"))
    site = (parse_site(case["site_toml"], str(path)) if "site_toml" in case
            else load_site(ROOT / "site-configs" / f"{case['site']}.toml"))
    model, request, _weights, _expect = load_case(path)
    text = format_request(request)  # "" for the all-defaults request: an empty "het: "
    rt = HookRuntime(render_hook(site).text)
    stats = {"rejected": 0, "placed": 0, "unplaceable": 0, "stricter-locality": 0}
    why = compare(rt, model, site, {"comment": "het: " + text, "user_name": "root"}, text,
                  stats)
    assert why is None, f"{path.stem} {text!r}: {why}"
