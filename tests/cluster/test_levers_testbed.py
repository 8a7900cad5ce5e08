"""Each lever changes Slurm's behaviour the way docs/levers.md claims, and the rollout
(diff / apply / automatic rollback / rollback) works, on a real Slurm 22.05.

These tests restart and deliberately break a cluster, so they run on a testbed of their own
(3 nodes, tests/data/levers/small.toml) in a short /tmp folder, never on the session one;
it is brought down at the end and the test asserts nothing of it is left running. Tests run
in file order and each leaves the cluster on the base site.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster_helpers import Jobs, own_testbed
from click.testing import CliRunner

from hetslurm.cli import cli
from hetslurm.errors import RolloutError
from hetslurm.levers import apply, diff, rollback
from hetslurm.process import run_command
from hetslurm.site import Site, load_site
from hetslurm.site.load import parse_site
from hetslurm.testbed import Testbed
from hetslurm.testbed.target import rollout_target

ROOT = Path(__file__).resolve().parents[2]
BASE_FILE = ROOT / "tests" / "data" / "levers" / "small.toml"
BASE = BASE_FILE.read_text()
SHARDS = BASE + "\n[levers.shards]\nh100 = 4\n"


def _site(text: str) -> Site:
    return parse_site(text, str(BASE_FILE))


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    with own_testbed("hlv", BASE_FILE) as bed:
        yield bed


@pytest.fixture
def jobs(tb: Testbed) -> Iterator[Jobs]:
    j = Jobs(tb.env())
    yield j
    j.cancel_all()


def _apply(tb: Testbed, text: str) -> object:
    site = _site(text)
    return apply(site, rollout_target(tb, site), health_timeout=60)


def _gres_idx(env: dict[str, str], job: str) -> str:
    out = run_command(["scontrol", "show", "job", "-d", job], timeout=30, env=env).stdout
    return next(tok for tok in out.split() if tok.startswith("GRES=")).split("(")[1]


def _node_of(jobs: Jobs, job: str) -> str:
    jobs.wait_state(job, {"RUNNING"}, timeout=30)
    return jobs.field(job, "NodeList")


def test_apply_creates_qos_then_diff_of_the_unchanged_site_is_empty(tb: Testbed) -> None:
    site = load_site(BASE_FILE)
    target = rollout_target(tb, site)
    before = diff(site, target)
    # `up` wrote the same files; only the QOS is new to slurmdbd.
    assert {c.action for c in before.changes} == {"sacctmgr"}
    res = apply(site, target)
    assert res.applied and res.action == "sacctmgr"
    assert diff(site, target).changes == ()
    out = CliRunner().invoke(cli, ["site", "diff", str(BASE_FILE), "--testbed", str(tb.root),
                                   "--format", "json", "--exit-code"])
    assert out.exit_code == 0, out.output
    assert '"changes": []' in out.output


def test_identical_jobs_fill_the_lower_weight_model_first(tb: Testbed, jobs: Jobs) -> None:
    # Base: the H100 does 3x the work for 1.5x the price and 1.5x the power -> lower weight.
    a = jobs.sbatch("-p", "gpu", "--gres=gpu:1", script="sleep 60")
    b = jobs.sbatch("-p", "gpu", "--gres=gpu:1", script="sleep 60")
    assert {_node_of(jobs, a), _node_of(jobs, b)} == {"gpu1"}
    jobs.cancel_all()
    jobs.ids.clear()
    # Cost alone, and an H100 hour now 15x an A100 hour: the A100 becomes cheaper per unit of
    # work, the weights flip, and scontrol reconfigure is enough to apply that.
    flipped = BASE.replace("energy_cost_balance = 0.5", "energy_cost_balance = 0.0").replace(
        "h100 = 3.0\na100 = 2.0", "h100 = 30.0\na100 = 2.0")
    res = _apply(tb, flipped)
    assert res.action == "reconfigure"  # type: ignore[attr-defined]
    try:
        c = jobs.sbatch("-p", "gpu", "--gres=gpu:1", script="sleep 60")
        d = jobs.sbatch("-p", "gpu", "--gres=gpu:1", script="sleep 60")
        assert {_node_of(jobs, c), _node_of(jobs, d)} == {"gpu2"}
    finally:
        jobs.cancel_all()
        assert _apply(tb, BASE).action == "reconfigure"  # type: ignore[attr-defined]


def test_fair_share_charges_the_faster_model_by_its_speed(tb: Testbed, jobs: Jobs) -> None:
    """RawUsage (sshare) is billing x seconds. Both jobs run the same script for the same
    time, so their usages stand as the billings the lever set: 30 for an H100, 10 for an
    A100, the speed ratio 3. (An hour of each would take an hour; the ratio is the same
    because usage is linear in time.) The usages are compared with each other, not each with
    sacct's ElapsedRaw: Slurm accrues usage by the real run time, while ElapsedRaw counts
    whole seconds between the start's and the end's second, so a 4 s job showed 5 (a CI run
    of 2026-12-05: usage 119 and 39, ratio 3.05, elapsed 5 and 4, per-second ratio 2.44)."""
    env = tb.env()
    for acct in ("lvfast", "lvslow"):
        tb.slurm().add_account(acct, "hlev", exist_ok=True)
        tb.slurm().add_user("root", acct, "hlev", exist_ok=True)
    fast = jobs.sbatch("-A", "lvfast", "-p", "gpu", "--gres=gpu:h100:1", script="sleep 8")
    slow = jobs.sbatch("-A", "lvslow", "-p", "gpu", "--gres=gpu:a100:1", script="sleep 8")
    for j in (fast, slow):
        jobs.wait_state(j, {"COMPLETED"}, timeout=30)
    # scontrol prints TRES= on 22.05, AllocTRES= from 24.11.
    def alloc_tres(j: str) -> str:
        try:
            return jobs.field(j, "TRES")
        except KeyError:
            return jobs.field(j, "AllocTRES")

    tres = {j: alloc_tres(j) for j in (fast, slow)}
    assert "billing=30" in tres[fast] and "billing=10" in tres[slow], tres
    elapsed = {j: int(jobs.sacct(j, "ElapsedRaw,State", timeout=60)["ElapsedRaw"])
               for j in (fast, slow)}
    # 22.05.8 charged finished jobs at once here; PriorityCalcPeriod (1 minute, Slurm's
    # minimum) bounds the wait otherwise.
    deadline = time.monotonic() + 90
    usage: dict[str, float] = {}
    while time.monotonic() < deadline:
        out = run_command(["sshare", "-n", "-P", "-A", "lvfast,lvslow", "-o",
                           "Account,User,RawUsage"], timeout=30, env=env).stdout
        usage = {ln.split("|")[0].strip(): float(ln.split("|")[2])
                 for ln in out.splitlines() if ln.split("|")[1] == ""}
        if usage.get("lvfast", 0) > 0 and usage.get("lvslow", 0) > 0:
            break
        time.sleep(2)
    assert usage.get("lvfast", 0) > 0 and usage.get("lvslow", 0) > 0, usage
    # The same script: real run times differ by launch jitter only (a few 0.1 s of 8 s).
    ratio = usage["lvfast"] / usage["lvslow"]
    assert ratio == pytest.approx(3.0, rel=0.1), (usage, elapsed)


def test_cpu_jobs_cannot_take_the_cores_a_gpu_node_keeps(tb: Testbed, jobs: Jobs) -> None:
    env = tb.env()
    # Partition spill may use 4 - 2 = 2 of gpu1's cores and 2 GiB of its 4.
    big = run_command(["sbatch", "-o", "/dev/null", "-p", "spill", "-c", "3", "--wrap", "true"],
                      timeout=30, env=env, check=False)
    assert big.returncode != 0 and "node configuration is not available" in big.stderr
    a = jobs.sbatch("-p", "spill", "-w", "gpu1", "-c", "2", script="sleep 60")
    b = jobs.sbatch("-p", "spill", "-w", "gpu1", "-c", "1", script="sleep 60")
    jobs.wait_state(a, {"RUNNING"})
    # gpu1 has 2 idle cores, but they are kept for GPU work: the CPU job waits ...
    time.sleep(2)
    assert jobs.field(b, "JobState") == "PENDING"
    # ... and a GPU job gets them.
    g = jobs.sbatch("-p", "gpu", "-w", "gpu1", "-c", "2", "--gres=gpu:h100:1", script="sleep 60")
    jobs.wait_state(g, {"RUNNING"})


def test_per_model_qos_limit_holds(tb: Testbed, jobs: Jobs) -> None:
    a = jobs.sbatch("--qos=lvtrain", "-p", "gpu", "--gres=gpu:h100:1", script="sleep 60")
    b = jobs.sbatch("--qos=lvtrain", "-p", "gpu", "--gres=gpu:h100:1", script="sleep 60")
    c = jobs.sbatch("--qos=lvtrain", "-p", "gpu", "--gres=gpu:a100:1", script="sleep 60")
    for j in (a, c):
        jobs.wait_state(j, {"RUNNING"})
    time.sleep(2)
    assert jobs.field(b, "JobState") == "PENDING"
    assert jobs.field(b, "Reason") == "QOSMaxGRESPerUser"


def test_restart_change_is_detected_and_applied_then_shards_share_a_gpu(
        tb: Testbed, jobs: Jobs) -> None:
    site = _site(SHARDS)
    target = rollout_target(tb, site)
    plan = diff(site, target)
    assert plan.needs_restart
    assert any(c.item == "GresTypes" and c.action == "restart" for c in plan.changes)
    res = apply(site, target, health_timeout=60)
    assert res.applied and res.action == "restart"
    assert diff(site, target).changes == ()
    env = tb.env()
    # GPU 0 taken whole; two jobs of 2 shards each must then share GPU 1 (4 shards per GPU).
    whole = jobs.sbatch("-p", "gpu", "--gres=gpu:h100:1", script="sleep 60")
    jobs.wait_state(whole, {"RUNNING"})
    s1 = jobs.sbatch("-p", "gpu", "--gres=shard:2", script="sleep 60")
    s2 = jobs.sbatch("-p", "gpu", "--gres=shard:2", script="sleep 60")
    for j in (s1, s2):
        jobs.wait_state(j, {"RUNNING"})
    assert _gres_idx(env, s1) == _gres_idx(env, s2) != _gres_idx(env, whole)


def test_broken_config_is_rolled_back_and_jobs_keep_running(tb: Testbed, jobs: Jobs) -> None:
    env = tb.env()
    long = jobs.sbatch("-p", "cpu", script="sleep 300")
    jobs.wait_state(long, {"RUNNING"})
    # Removing the shards needs a restart; the partition option hetslurm passes through is
    # one slurmctld refuses ("Parsing error at unrecognized key"), so it will not start.
    broken = BASE + '\n[partitions.gpu.options]\nBogusKey = "1"\n'
    site = _site(broken)
    target = rollout_target(tb, site)
    with pytest.raises(RolloutError) as err:
        apply(site, target, health_timeout=30)
    assert err.value.rolled_back, str(err.value)
    # The shard configuration is back, healthy, and the job never stopped.
    assert diff(_site(SHARDS), target).changes == ()
    assert jobs.field(long, "JobState") == "RUNNING"
    done = run_command(["sbatch", "--wait", "-o", "/dev/null", "-p", "gpu", "--gres=shard:1",
                        "--wrap", "true"], timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr


def test_rollback_restores_the_previous_version(tb: Testbed) -> None:
    site = _site(SHARDS)
    target = rollout_target(tb, site)
    res = rollback(target, health_timeout=60)
    assert res.action == "restart"  # shards off again: gres change
    after = diff(load_site(BASE_FILE), target)
    assert after.files == ()
    assert "shard" not in (tb.etc / "gres.conf").read_text()
    # The shards apply had also granted lvtrain to root's associations made since (lvfast,
    # lvslow); the rollback took back exactly those grants, nothing else.
    assert {c.item for c in after.changes} == {
        "qos lvtrain for user root in account lvfast",
        "qos lvtrain for user root in account lvslow"}
