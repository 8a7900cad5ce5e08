"""``explain`` hands the hook every job option it reads, as Slurm 22.05 does.

Finding 10 of issue 18: ``explain`` ignored ``--gpus-per-node``, so it classified a job
differently from the hook in slurmctld. Here each script's ``#SBATCH`` options are written
out by hand as the job_desc fields 22.05 gives job_submit/lua (``--gres=gpu:2`` ->
``tres_per_node="gres:gpu:2"``, ``--gpus-per-node=2`` -> ``tres_per_node="gres:gpu:2"``
appended after any ``--gres``, ``--gpus`` -> ``tres_per_job``, ``--gpus-per-task`` ->
``tres_per_task``, ``--gpus-per-socket`` -> ``tres_per_socket``, ``-c`` -> ``cpus_per_task``
...); the hook run on those fields directly is the oracle, and ``explain`` must reach the
same outcome, writes, user messages and decision record, from the script and from the
command line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.hook.explain import SBATCH_OPTIONS, JobOptions, explain, job_values
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import FIELDS, HookRuntime
from hetslurm.site import load_site
from hetslurm.site.model import Site

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "site-configs" / "demo.toml"

# (#SBATCH options, #HET line, the job_desc fields 22.05 gives the plugin for those options)
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("--gpus-per-node=2", "class=train", {"tres_per_node": "gres:gpu:2"}),
    ("--gpus-per-node=a100:2", "class=train", {"tres_per_node": "gres:gpu:a100:2"}),
    ("--gpus-per-node 4", "gpu-type=h100", {"tres_per_node": "gres:gpu:4"}),
    ("--gpus-per-node=2", "gpus=4", {"tres_per_node": "gres:gpu:2"}),
    ("--gres=gpu:2", "class=train", {"tres_per_node": "gres:gpu:2"}),
    ("--gres=gpu:1 --gpus-per-node=h100:2", "class=train",
     {"tres_per_node": "gres:gpu:1,gres:gpu:h100:2"}),
    ("-G a100:2", "class=train", {"tres_per_job": "gres:gpu:a100:2"}),
    ("--gpus=2", "gpu-type=a100", {"tres_per_job": "gres:gpu:2"}),
    ("--gpus-per-task=1 -n 2", "class=train",
     {"tres_per_task": "gres:gpu:1", "num_tasks": 2}),
    ("--gpus-per-socket=1", "class=train", {"tres_per_socket": "gres:gpu:1"}),
    ("-c 4", "gpus=1 cores=8", {"cpus_per_task": 4}),
    ("--ntasks-per-node=2", "gpus=1 cores=8", {"ntasks_per_node": 2}),
    ("--mincpus=6", "gpus=1 cores=8", {"pn_min_cpus": 6}),
    ("--mem-per-cpu=2G", "gpus=1 mem=64G", {"min_mem_per_cpu": 2048}),
    ("-N 2-4 --switches=1@10:00", "gpus=1 nodes=2 locality=switch",
     {"min_nodes": 2, "max_nodes": 4, "req_switch": 1, "wait4switch": 600}),
    ("--sockets-per-node=2", "cores=4 locality=numa", {"sockets_per_node": 2}),
    ("--gres-flags=disable-binding --gres=gpu:2", "gpus=2 locality=nvlink",
     {"tres_per_node": "gres:gpu:2", "bitflags": 524288}),
    ("-A proj --no-requeue", "gpus=1 no-requeue", {"account": "proj", "requeue": 0}),
]


@pytest.fixture(scope="module")
def demo() -> Site:
    return load_site(DEMO)


@pytest.fixture(scope="module")
def hook_text(demo: Site) -> str:
    return render_hook(demo).text


def _verdict(res_ok: bool, rc: int | None, writes: Any, messages: Any) -> dict[str, Any]:
    outcome = ("hook-error" if not res_ok else "rejected" if rc != 0 else
               "rewritten" if writes else "unchanged")
    return {"outcome": outcome, "writes": list(writes), "messages": list(messages)}


@pytest.mark.parametrize(("sbatch", "het", "fields"), CASES,
                         ids=[f"{s} / {h}" for s, h, _ in CASES])
def test_explain_agrees_with_the_hook(demo: Site, hook_text: str, sbatch: str, het: str,
                                      fields: dict[str, Any]) -> None:
    script = f"#!/bin/bash\n#SBATCH {sbatch}\n#HET {het}\nhostname\n"
    job = {"user_name": "root", "name": "explain", "script": script, **fields}
    res = HookRuntime(hook_text).submit(job)
    expected = _verdict(res.ok, res.rc, res.writes, res.user_messages)

    ex = explain(script, demo)
    assert {k: v for k, v in job.items() if k != "script"} == {
        k: v for k, v in ex.job_before.items() if k != "script"}
    assert {"outcome": ex.outcome, "writes": ex.writes, "messages": ex.messages} == expected


def test_the_option_matters() -> None:
    # The oracle is not vacuous: without its #SBATCH option the first case classifies
    # differently (the hook picks the GPU count and models itself).
    hook = render_hook(load_site(DEMO)).text
    base = {"user_name": "root", "name": "explain",
            "script": "#!/bin/bash\n#HET class=train\nhostname\n"}
    plain = HookRuntime(hook).submit(base)
    given = HookRuntime(hook).submit({**base, "tres_per_node": "gres:gpu:2"})
    assert plain.writes != given.writes


def test_command_line_options_reach_the_hook_the_same_way(demo: Site, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#HET class=train\nhostname\n")
    # 22.05's gres form whatever Slurm is installed here (explain's default is its release).
    res = CliRunner().invoke(cli, ["explain", str(script), "--site", str(DEMO),
                                   "--gpus-per-node", "a100:2", "--format", "json",
                                   "--slurm-version", "22.05"])
    assert res.exit_code == 0, res.output
    import json

    doc = json.loads(res.stdout)
    ex = explain("#!/bin/bash\n#SBATCH --gpus-per-node=a100:2\n#HET class=train\n"
                 "hostname\n", demo)
    assert doc["job_before"]["tres_per_node"] == "gres:gpu:a100:2"
    assert [(w["field"], w["value"]) for w in doc["writes"]] == ex.writes


def test_every_option_fills_a_field_the_plugin_has() -> None:
    # Each table entry, given a plausible value, fills only job_desc fields of 22.05.
    sample = {"nodes": "2", "ntasks": "2", "ntasks_per_node": "1", "cpus_per_task": "2",
              "mincpus": "2", "sockets_per_node": "1", "cores_per_socket": "2", "mem": "1G",
              "mem_per_cpu": "1G", "switches": "1@5", "gres_flags": "enforce-binding"}
    for o in SBATCH_OPTIONS:
        value = sample.get(o.attr, "gpu:1" if o.attr == "gres" else "1")
        fields = job_values(None, JobOptions(**{o.attr: value}))
        extra = set(fields) - {"user_name", "name"}
        assert extra, o.long
        assert extra <= set(FIELDS), (o.long, extra - set(FIELDS))


@pytest.mark.parametrize(("option", "value", "message"), [
    ("cpus_per_task", "four", "--cpus-per-task=four: not a count in 0..65533"),
    ("nodes", "2-x", "--nodes=x: not a count in 0..4294967293"),
    ("mem_per_cpu", "lots", "--mem-per-cpu=lots: write e.g. 16G or 16000 (MiB)"),
    ("switches", "1@soon", "--switches=1@soon: 'soon' is not a Slurm time"),
    ("gres_flags", "bind", "--gres-flags=bind: expected enforce-binding or disable-binding"),
])
def test_values_sbatch_refuses(option: str, value: str, message: str) -> None:
    from hetslurm.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        job_values(None, JobOptions(**{option: value}))
    assert str(info.value) == message
