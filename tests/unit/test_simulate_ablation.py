"""``simulate --without``: hetslurm replayed with parts of the whole system switched off.

On the toy site (tests/unit/test_simulate_engine.py): class ``rl`` lists ``k80, v100``
("cheapest first") although the parameter file's speeds make the V100 2.09x faster for it;
the site's ``gpu_model_order`` (node weights) puts the V100 first. So for one rl job on the
empty cluster:

* ``hetslurm`` (learned ranking, ranked fallback): ``gpu_v100, gpu_k80``: a V100;
* ``hetslurm-without-speeds`` (the file's order, ranked fallback): a K80;
* ``hetslurm-without-fallback+speeds`` (the file's order, feature OR by node weight): a V100.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_simulate_engine import TOY

from hetslurm.cli import cli
from hetslurm.errors import ConfigError
from hetslurm.placement.model import ClusterModel
from hetslurm.policy.ranking import proposed_order
from hetslurm.simulate.params import (
    PARTS,
    Params,
    load_params,
    parse_without,
    variant_name,
)
from hetslurm.simulate.run import run_replay
from hetslurm.simulate.traces import TraceJob
from hetslurm.simulate.workload import (
    build_jobs,
    learned_site,
    node_weights,
    partition_names,
    partition_nodes,
)
from hetslurm.site.load import load_site
from hetslurm.site.model import Site

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "site-configs" / "simulate-params.toml"
RL_ONLY = "untyped_shares = { rl = 1.0 }"
SHARES = ("untyped_shares = { vision = 0.396, language = 0.379, recommendation = 0.191, "
          "rl = 0.035 }")
VARIANTS = ("hetslurm-without-fallback", "hetslurm-without-speeds",
            "hetslurm-without-fallback+speeds")


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory) -> Site:
    path = tmp_path_factory.mktemp("toy") / "toy.toml"
    path.write_text(TOY)
    return load_site(path)


@pytest.fixture
def params_file(tmp_path: Path) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(SHIPPED.read_text().replace(SHARES, RL_ONLY))
    return p


def test_parts_parse_and_name_their_variant() -> None:
    assert PARTS == ("fallback", "speeds")
    assert parse_without(" speeds,fallback") == frozenset(PARTS)
    assert variant_name(frozenset({"speeds", "fallback"})) == "hetslurm-without-fallback+speeds"
    with pytest.raises(ConfigError, match=r"'fallbak': not a part \(did you mean 'fallback'"):
        parse_without("fallbak")
    # A part of the whole system the replay does not model yet is refused, saying so.
    for part in ("requeue", "relax", "scoring"):
        with pytest.raises(ConfigError, match=f"--without {part}: .*not replayed yet"):
            parse_without(f"fallback,{part}")
    with pytest.raises(ConfigError, match="name a part"):
        parse_without(" , ")


def test_a_variant_is_hetslurm_with_its_parts_off() -> None:
    params = load_params(SHIPPED)
    v = params.policy("hetslurm-without-speeds")
    het = params.policy("hetslurm")
    assert v.without == frozenset({"speeds"}) and het.without == frozenset()
    assert (v.node_weights, v.gpu_partition, v.use_classes, v.use_priority) == (
        het.node_weights, het.gpu_partition, het.use_classes, het.use_priority)
    for bad in ("hetslurm-without-requeue", "hetslurm-without-speeds+fallback",
                "hetslurm-without-", "slurm-magic"):
        with pytest.raises(ConfigError, match=re.escape(f"no policy '{bad}'")):
            params.policy(bad)


def test_ranking_rule_moves_a_device_only_when_clearly_faster() -> None:
    order = ("k80", "p100", "v100")
    assert proposed_order(order, {"k80": (1, 1), "p100": (1.6, 1.7), "v100": (2, 2.2)}) == (
        "v100", "p100", "k80")
    # Overlapping intervals keep the site's order; an unmeasured device keeps its place.
    assert proposed_order(order, {"k80": (0.9, 1.7), "p100": (1.6, 1.8)}) == order
    assert proposed_order(order, {"k80": (1, 1), "v100": (2, 2)}) == ("p100", "v100", "k80")
    assert proposed_order(order, {"k80": (1, None), "v100": (None, 2)}) == order


def test_learned_site_reranks_only_what_the_speeds_say(toy: Site, params_file: Path) -> None:
    params = load_params(params_file)
    learned = learned_site(toy, params)
    classes = learned.sections["classes"]
    assert classes["rl"].devices == ("v100", "k80")
    assert classes["vision"].devices == ("v100", "k80")  # already fastest first
    assert toy.sections["classes"]["rl"].devices == ("k80", "v100")  # the site is unchanged
    # Equal speeds (exponent 0) separate nothing: the site itself.
    assert learned_site(toy, params.with_speed_exponent(0)) is toy


def _replay(toy: Site, params: Params, policies: tuple[str, ...],
            jobs: list[TraceJob]) -> dict[str, list[str]]:
    built, dropped = build_jobs(jobs, "philly", toy, params, policies)
    assert not any(dropped.values())
    base = ClusterModel.from_site(toy)
    out = {}
    for p in policies:
        model = node_weights(base, params.policy(p), params)
        parts = {n: partition_nodes(toy, model, n) for n in partition_names(built[p])}
        res = run_replay(params, model, built[p], parts, load=1.0)
        out[p] = [model.gpu_models[r.model] for r in sorted(res.records,
                                                             key=lambda r: r.job.index)]
    return out


def test_each_part_changes_where_an_rl_job_runs(toy: Site, params_file: Path) -> None:
    params = load_params(params_file)
    policies = ("hetslurm", *VARIANTS)
    built, _ = build_jobs([TraceJob("r", 0, 100, 1)], "philly", toy, params, policies)
    ranked = {p: built[p][0].ranked for p in policies}
    assert ranked == {"hetslurm": ("gpu_v100", "gpu_k80"),
                      "hetslurm-without-fallback": (),
                      "hetslurm-without-speeds": ("gpu_k80", "gpu_v100"),
                      "hetslurm-without-fallback+speeds": ()}
    assert {p: built[p][0].cls for p in policies} == dict.fromkeys(policies, "rl")
    where = _replay(toy, params, policies, [TraceJob("r", 0, 100, 1)])
    assert where == {"hetslurm": ["v100"], "hetslurm-without-fallback": ["v100"],
                     "hetslurm-without-speeds": ["k80"],
                     "hetslurm-without-fallback+speeds": ["v100"]}
    # Three rl jobs at once on two V100 and two K80: with the file's order and ranked
    # fallback, K80 first then V100; the learned order, V100 first then K80.
    three = [TraceJob(f"r{i}", 0, 100, 1, cores=1) for i in range(3)]
    where = _replay(toy, params, ("hetslurm", "hetslurm-without-speeds"), three)
    assert where == {"hetslurm": ["v100", "v100", "k80"],
                     "hetslurm-without-speeds": ["k80", "k80", "v100"]}


def _trace(tmp_path: Path) -> Path:
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-09 07:{2 * i:02d}:00,{600 + 37 * i},1,0,a\n" for i in range(12)))
    return trace


def test_cli_without_replays_the_variants_beside_the_policies(
        toy: Site, params_file: Path, tmp_path: Path) -> None:
    args = ["simulate", "--site", toy.path, "--trace", str(_trace(tmp_path)),
            "--trace-format", "philly", "--params", str(params_file), "--load", "4",
            "--without", "fallback", "--without", "speeds", "--without", "speeds,fallback",
            "--without", "fallback", "--format", "json"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [row["policy"] for row in doc["rows"]] == ["slurm-default", "hetslurm", *VARIANTS]
    assert doc["meta"]["without"] == {"hetslurm-without-fallback": ["fallback"],
                                      "hetslurm-without-speeds": ["speeds"],
                                      "hetslurm-without-fallback+speeds": ["fallback",
                                                                           "speeds"]}
    # A variant is never the baseline; each is compared with the strongest one.
    assert doc["meta"]["strongest_baseline"] == "slurm-default"
    assert all(e["baseline"] == "slurm-default" for e in doc["summary"][1:])
    # Both cores: the children replay the variants by name, the same rows.
    two = CliRunner().invoke(cli, [*args, "--workers", "2"])
    assert two.exit_code == 0, two.output

    def strip(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]

    assert strip(json.loads(two.stdout)["rows"]) == strip(doc["rows"])
    bad = CliRunner().invoke(cli, [*args[:-2], "--without", "requeue"])
    assert bad.exit_code == 2 and "--without requeue: requeue and downgrade" in bad.output
    val = CliRunner().invoke(cli, ["simulate", "--validate", "--sim-only", "--without",
                                   "speeds"])
    assert val.exit_code == 2 and "--without: not with --validate" in val.output
