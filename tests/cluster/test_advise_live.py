"""``hetslurm advise`` proposes a site file that ``site apply`` applies and ``site rollback``
undoes (issue 22 item 5, "Done when"), on the session testbed (demo site).

32 jobs of ``class=train gpus=1`` (the request in ``--comment``) run at once: the ranked
fallback puts 16 on the H100s and 16 on the A100s, and the script sleeps 40 s on an H100
node and 20 s on an A100 node, so the A100 measures twice as fast and advise proposes
``train`` devices ``a100, h100`` (the demo lists ``h100, a100``) and a memory default from
the runs' MaxRSS. Those live only in the hook's rules: ``site diff`` shows one ``hook``
change, ``site apply`` re-installs the hook (``hook check`` shows the new rules digest) and a
new ``class=train`` job gets the A100 partition first and the memory default; ``site
rollback`` puts the previous hook back and the same job is decided as before.

(The demo writes ``gpu_model_order``, which the measured speeds would contradict once the
levers weigh them: advise leaves ``[levers.speed]`` out and says so, so no Slurm file
changes and the session testbed needs no restart.)"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from _cluster_helpers import Jobs
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.process import run_command
from hetslurm.site import load_site
from hetslurm.site.hook_rules import hook_rules
from hetslurm.testbed import Testbed

SCRIPT = ('case "$SLURMD_NODENAME" in gpu1|gpu2) sleep 40 ;; gpu3|gpu4) sleep 20 ;; '
          "*) sleep 1 ;; esac")
REQUEST = "het: class=train gpus=1"


def _cli(args: list[str], env: dict[str, str]) -> Any:
    res = CliRunner().invoke(cli, args, env=env)
    assert res.exit_code == 0, res.output
    return res


def _hook_rules(testbed: Testbed, env: dict[str, str]) -> str:
    res = _cli(["hook", "check", "--conf-dir", str(testbed.etc), "--format", "json"], env)
    doc = json.loads(res.stdout)
    return str(doc["installed_rules"])


def _diff(site: Path, testbed: Testbed, env: dict[str, str]) -> list[dict[str, Any]]:
    res = _cli(["site", "diff", str(site), "--testbed", str(testbed.root), "--format", "json"],
               env)
    return list(json.loads(res.stdout)["changes"])


def _decided(jobs: Jobs) -> tuple[str, str]:
    """A new class=train job, held: its partitions and memory per node as slurmctld took
    them ("none": no MinMemoryNode, the site's DefMemPerCPU applies)."""
    job = jobs.sbatch("-H", "--comment", REQUEST, "-J", "advcheck", script="true")
    out = run_command(["scontrol", "show", "job", "-o", job], timeout=30, env=jobs.env).stdout
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    run_command(["scancel", job], timeout=30, env=jobs.env)
    return fields["Partition"], fields.get("MinMemoryNode", "none")


def test_advise_apply_and_rollback_on_the_testbed(jobs: Jobs, testbed: Testbed,
                                                  cli_env: dict[str, str],
                                                  tmp_path: Path) -> None:
    t0 = time.time() - 5
    ids = [jobs.sbatch("--comment", REQUEST, "-J", "advprobe", script=SCRIPT)
           for _ in range(32)]
    for j in ids:
        jobs.wait_state(j, {"COMPLETED"}, timeout=240)
    deadline = time.monotonic() + 60
    while True:  # slurmdbd records each end a moment after it
        out = run_command(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(ids)],
                          timeout=60, env=jobs.env).stdout
        done = [ln for ln in out.splitlines() if ln.endswith("|COMPLETED")]
        if len(done) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(1)
    site_file = Path(testbed.existing_state().site)
    proposed = tmp_path / "proposed.toml"
    res = _cli(["advise", "--site", str(site_file), "--since", str(t0), "--no-scripts",
                "--min-mem-jobs", "4", "--out", str(proposed), "--format", "json"], cli_env)
    doc = json.loads(res.stdout)
    print(json.dumps({k: doc[k] for k in ("changes", "notes", "memory", "rankings")}))
    assert "classes.train.devices: h100, a100 -> a100, h100" in doc["changes"]
    mem = next(m for m in doc["memory"] if m["class"] == "train")
    assert mem["proposed"] is not None and mem["measured"] >= 4, mem
    assert f"classes.train.mem_per_node: none -> {mem['proposed']} MiB" in doc["changes"]
    new_site = load_site(proposed)
    assert new_site.sections["classes"]["train"].devices == ("a100", "h100")

    before_rules = _hook_rules(testbed, cli_env)
    before = _decided(jobs)
    assert before[0] == "gpu_h100,gpu_a100", before

    # What the session testbed already differs in from its own site (QOS records `testbed
    # up` does not create) is the same before and after; advise adds only the hook.
    baseline = _diff(site_file, testbed, cli_env)
    plan = _diff(proposed, testbed, cli_env)
    assert [(c["file"], c["action"]) for c in plan if c not in baseline] == [
        ("job_submit.lua", "hook")]
    assert all(c["action"] == "sacctmgr" for c in baseline), baseline

    res = _cli(["site", "apply", str(proposed), "--testbed", str(testbed.root), "--format",
                "json"], cli_env)
    try:
        assert json.loads(res.stdout)["applied"]
        assert _hook_rules(testbed, cli_env) == hook_rules(new_site)["digest"] != before_rules
        after = _decided(jobs)
        assert after == ("gpu_a100,gpu_h100", f"{mem['proposed']}M"), after
    finally:
        res = _cli(["site", "rollback", "--testbed", str(testbed.root), "--format", "json"],
                   cli_env)
    assert [c["action"] for c in json.loads(res.stdout)["changes"]] == ["hook"]
    assert _hook_rules(testbed, cli_env) == before_rules
    assert _decided(jobs) == before
    assert _diff(site_file, testbed, cli_env) == baseline
