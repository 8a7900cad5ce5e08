"""requeue-stalled's ``on-idle=downgrade`` and heterogeneous jobs on the fake backend.

Downgrade: the next cheaper GPU model the site allows (cost, class, partition, memory), the
request rewritten (typed gres, model constraint), the hook's ``scontrol update`` rule, and
the requeuehold -> update -> release sequence with each step checked and logged. Het jobs:
requeued through the leader only when every component is idle and qualifies.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _act_fixtures import NOW, append_probe, cluster, ctx, job, samples

from hetslurm.act.log import ActionLog
from hetslurm.act.run import context_for
from hetslurm.act.stall import execute, plan
from hetslurm.errors import BackendError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.policy.stall import Context, SiteModels
from hetslurm.site import load_site
from hetslurm.slurm.backend import JobInfo, JobRef
from hetslurm.slurm.units import GresItem

DEMO = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
H100 = {"n1": (GresItem("gpu", "h100", 2, (0, 1)),)}


def demo_ctx(uid: int = 0, exempt: tuple[int, ...] = (0,), **stall: Any) -> Context:
    base = ctx(**stall)
    site = context_for(load_site(DEMO))
    assert site.models is not None
    return replace(base, models=site.models, uid=uid, modify_exempt_uids=exempt)


def rec(**fields: str) -> str:
    return "JS1:x hetslurm:" + json.dumps({"v": 1, "on_idle": "downgrade", **fields},
                                          separators=(",", ":"))


def h100_job(job_id: int = 1, **kw: Any) -> JobInfo:
    base = {"allocated_gres": H100, "nodes": ("n1",),
            "tres_per_node": (GresItem("gpu", "h100", 2),),
            "admin_comment": rec(set="admin_comment")}
    base.update(kw)
    return job(job_id, **base)


def warned(log: ActionLog, fake: FakeSlurm, ids: list[int], planned: str) -> None:
    for jid in ids:
        j = fake.job(jid)
        log.append("warning", {"t": NOW - 1800, "job": j.display_id, "job_id": jid,
                               "restarts": j.restarts, "rule": "x", "planned": planned})


def test_site_models_order_by_cost_then_site_order() -> None:
    m = SiteModels.from_site(load_site(DEMO))
    assert m.order == ("h100", "a100")
    assert m.cheaper("h100") == ["a100"] and m.cheaper("a100") == []
    assert m.memory_mib == {"h100": 80 * 1024, "a100": 40 * 1024}
    assert m.partitions["gpu"] == {"h100", "a100"} and m.partitions["cpu"] == set()
    # Without costs for every model, the site's order decides (preferred first).
    no_cost = SiteModels(order=("h100", "a100", "v100"))
    assert no_cost.cheaper("a100") == ["v100"]
    # With costs, a model after this one that costs as much is not cheaper.
    priced = SiteModels(order=("h100", "a100", "l4"),
                        cost={"h100": 4.0, "a100": 2.0, "l4": 2.0})
    assert priced.cheaper("h100") == ["a100", "l4"] and priced.cheaper("a100") == []


def test_typed_gres_is_retyped_and_the_dry_run_shows_it() -> None:
    fake = cluster(h100_job())
    d = plan(fake, samples({1: 0.0}), demo_ctx(), now=NOW, output_probe=append_probe)
    assert (d[0].rule, d[0].planned, d[0].action) == ("on-idle-downgrade", "downgrade", "warn")
    assert d[0].downgrade is not None
    assert (d[0].downgrade.gres, d[0].downgrade.features) == ("gpu:a100:2", None)
    assert d[0].row()["change"] == "downgrade h100 -> a100 (Gres=gpu:a100:2)"
    assert "h100 -> a100" in d[0].reason
    assert fake.job(1).state == "RUNNING"  # planning changes nothing


@pytest.mark.parametrize(("features", "want"), [
    ("h100|a100", "a100"),
    ("h100", "a100"),
    ("nvlink&h100", "nvlink&a100"),
    (None, "a100"),            # any model accepted: ask for the cheaper one
    ("nvlink", "nvlink&a100"),
])
def test_model_constraint_is_replaced(features: str | None, want: str) -> None:
    fake = cluster(h100_job(tres_per_node=(GresItem("gpu", None, 2),), features=features))
    d = plan(fake, samples({1: 0.0}), demo_ctx(), now=NOW, output_probe=append_probe)
    assert d[0].planned == "downgrade" and d[0].downgrade is not None
    assert (d[0].downgrade.gres, d[0].downgrade.features) == (None, want)


@pytest.mark.parametrize(("kw", "why"), [
    ({"allocated_gres": {"n1": (GresItem("gpu", "a100", 2, (0, 1)),)}},
     "no GPU model cheaper than a100"),
    ({"admin_comment": rec(set="admin_comment", req="gpus=2 min-gpu-mem=61440M")},
     "under 61440 MiB"),
    ({"features": "[h100|a100]"}, "not a plain OR or AND"),
    ({"features": "h100|nvlink"}, "mixes GPU models"),
    ({"tres_per_job": (GresItem("gpu", "h100", 2),)}, "--gpus"),
    ({"partition": "cpu"}, "no GPU model cheaper than h100 that the job may use"),
])
def test_no_cheaper_model_the_job_may_use_notifies(kw: dict, why: str) -> None:
    fake = cluster(h100_job(**kw))
    d = plan(fake, samples({1: 0.0}), demo_ctx(), now=NOW, output_probe=append_probe)
    assert (d[0].rule, d[0].planned) == ("on-idle-downgrade", "notify"), d[0].reason
    assert why in d[0].reason and d[0].downgrade is None


def test_memory_the_job_used_is_a_floor() -> None:
    s = samples({1: 0.0})
    s["memory_used_mib"] = 50_000.0  # more than an A100's 40 GiB
    d = plan(cluster(h100_job()), s, demo_ctx(), now=NOW, output_probe=append_probe)
    assert d[0].planned == "notify" and "under 50000 MiB" in d[0].reason


def test_class_limits_the_models() -> None:
    models = SiteModels(order=("h100", "a100", "v100"),
                        memory_mib={"h100": 81920, "a100": 40960, "v100": 16384},
                        classes={"train": ("h100", "a100")},
                        partitions={"gpu": frozenset({"h100", "a100", "v100"})})
    c = replace(ctx(), models=models)
    on_a100 = {"n1": (GresItem("gpu", "a100", 2, (0, 1)),)}
    trained = h100_job(allocated_gres=on_a100, tres_per_node=(GresItem("gpu", "a100", 2),),
                       admin_comment=rec(set="admin_comment", **{"class": "train"}))
    # Job 2's samples come from n2 (the fixture's node for it): its allocation says so too.
    free = replace(trained, job_id=2, admin_comment=rec(set="admin_comment"), nodes=("n2",),
                   allocated_gres={"n2": on_a100["n1"]})
    d = {x.job: x for x in plan(cluster(trained, free), samples({1: 0.0, 2: 0.0}), c,
                                now=NOW, output_probe=append_probe)}
    assert d["1"].planned == "notify" and "v100" in d["1"].reason
    assert d["2"].downgrade is not None and d["2"].downgrade.to_model == "v100"


def test_the_hooks_update_rule_is_respected() -> None:
    # The hook wrote features; uid 1000 is not exempt: it would refuse the update.
    owned = h100_job(tres_per_node=(GresItem("gpu", None, 2),), features="h100|a100",
                     admin_comment=rec(set="tres_per_node,features,partition,admin_comment"))
    d = plan(cluster(owned), samples({1: 0.0}), demo_ctx(uid=1000, exempt=(0,)), now=NOW,
             output_probe=append_probe)
    assert d[0].planned == "notify" and "modify_exempt_uids" in d[0].reason
    d = plan(cluster(owned), samples({1: 0.0}), demo_ctx(uid=0, exempt=(0,)), now=NOW,
             output_probe=append_probe)
    assert d[0].planned == "downgrade"


@pytest.mark.parametrize(("kw", "stall", "rule", "planned"), [
    ({"requeue": False}, {}, "no-requeue", "none"),
    ({"batch": False}, {}, "non-batch", "notify"),
    ({"restarts": 2}, {}, "cap-reached", "notify"),
    ({}, {"action": "notify"}, "on-idle-downgrade", "notify"),
    ({"user": "bob"}, {"exempt_users": ("bob",)}, "exempt-user", "none"),
])
def test_the_usual_guards_come_first(kw: dict, stall: dict, rule: str, planned: str) -> None:
    d = plan(cluster(h100_job(**kw)), samples({1: 0.0}), demo_ctx(**stall), now=NOW,
             output_probe=append_probe)
    assert (d[0].rule, d[0].planned) == (rule, planned)


def test_output_not_in_append_mode_is_not_downgraded() -> None:
    d = plan(cluster(h100_job()), samples({1: 0.0}), demo_ctx(), now=NOW,
             output_probe=lambda _: "unknown")
    assert (d[0].rule, d[0].planned) == ("output-not-append", "notify")


def test_downgrade_requeues_held_updates_and_releases(tmp_path: Path) -> None:
    calls: list[str] = []

    class Recording(FakeSlurm):
        def requeue_hold(self, job_id: JobRef, *, incomplete: bool = False) -> None:
            calls.append(f"requeue_hold {job_id} {incomplete}")
            super().requeue_hold(job_id, incomplete=incomplete)

        def update_job(self, job_id: JobRef, **kw: Any) -> None:
            calls.append(f"update {job_id} {sorted(k for k, v in kw.items() if v is not None)}")
            assert kw.get("nodelist") is None  # never pinned to nodes
            super().update_job(job_id, **kw)

        def release(self, job_id: JobRef) -> None:
            calls.append(f"release {job_id}")
            super().release(job_id)

    fake = Recording(nodes=cluster().nodes(), jobs=[h100_job(), job(2)])
    log = ActionLog(tmp_path / "a.jsonl")
    notes = tmp_path / "notes"
    script = tmp_path / "notifier"
    script.write_text(f"#!/bin/sh\ncat >> {notes}\n")
    script.chmod(0o755)
    c = demo_ctx(notify_command=(str(script), "{action}"))
    warned(log, fake, [1], "downgrade")
    d = plan(fake, samples({1: 0.0, 2: 80.0}), c, now=NOW, log=log, output_probe=append_probe)
    assert d[0].action == "downgrade"
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "done", out[0]
    assert calls == ["requeue_hold 1 True", "update 1 ['tres_per_node']", "release 1"]
    j = fake.job(1)
    assert j.state == "PENDING" and j.restarts == 1 and "held" not in (j.reason or "")
    assert j.tres_per_node == (GresItem("gpu", "a100", 2),)
    steps = [(e["step"], e["result"]) for e in log.entries("action")]
    assert steps == [("requeue_hold", "done"), ("update", "done"), ("release", "done")]
    assert all(e["downgrade"]["to_model"] == "a100" for e in log.entries("action"))
    sent = [json.loads(x) for x in notes.read_text().splitlines()]
    assert [x["action"] for x in sent] == ["downgrade"]
    assert sent[0]["downgrade"]["gres"] == "gpu:a100:2"
    assert fake.job(2).state == "RUNNING"


def test_a_refused_update_releases_the_job_with_its_own_request(tmp_path: Path) -> None:
    class Refuses(FakeSlurm):
        def update_job(self, job_id: JobRef, **kw: Any) -> None:
            raise BackendError("Access/permission denied")

    fake = Refuses(nodes=cluster().nodes(), jobs=[h100_job()])
    log = ActionLog(tmp_path / "a.jsonl")
    c = demo_ctx()
    warned(log, fake, [1], "downgrade")
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "not-downgraded" and "permission denied" in out[0].detail
    j = fake.job(1)
    assert j.state == "PENDING" and j.restarts == 1 and "held" not in (j.reason or "")
    assert j.tres_per_node == (GresItem("gpu", "h100", 2),)
    steps = [(e["step"], e["result"]) for e in log.entries("action")]
    assert steps == [("requeue_hold", "done"), ("update", "failed"),
                     ("release", "not-downgraded")]


def test_a_downgrade_that_changed_since_the_decision_is_skipped(tmp_path: Path) -> None:
    fake = cluster(h100_job())
    log = ActionLog(tmp_path / "a.jsonl")
    c = demo_ctx()
    warned(log, fake, [1], "downgrade")
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    fake._jobs[1] = replace(fake._jobs[1], features="nvlink")  # request changed meanwhile
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "skipped" and "downgrade is now" in out[0].detail
    assert fake.job(1).state == "RUNNING" and fake.job(1).restarts == 0


def test_finished_before_the_hold_is_not_rerun(tmp_path: Path) -> None:
    class FinishesFirst(FakeSlurm):
        def requeue_hold(self, job_id: JobRef, *, incomplete: bool = False) -> None:
            self._stop(self._resolve(job_id), "COMPLETED", None)
            super().requeue_hold(job_id, incomplete=incomplete)

    fake = FinishesFirst(nodes=cluster().nodes(), jobs=[h100_job()])
    log = ActionLog(tmp_path / "a.jsonl")
    c = demo_ctx()
    warned(log, fake, [1], "downgrade")
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "not-requeued"
    assert fake.job(1).state == "COMPLETED" and fake.job(1).restarts == 0


# ----------------------------------------------------------------------------- het jobs
class HetFake(FakeSlurm):
    """Slurm requeues every component when told the leader's id."""

    calls: list[str]

    def requeue(self, job_id: JobRef, *, incomplete: bool = True) -> None:
        self.calls = [*getattr(self, "calls", []), str(job_id)]
        jid = self._resolve(job_id)
        het = self._jobs[jid].het_job_id
        if het and str(job_id) == str(het):
            for j in list(self._jobs.values()):
                if j.het_job_id == het:
                    super().requeue(j.job_id, incomplete=incomplete)
        else:
            super().requeue(job_id, incomplete=incomplete)

    def cancel(self, job_id: JobRef) -> None:
        # scancel of the leader's id ends every component (on 24.11 and later, so does a
        # cancel of component 0, which is why a component is never cancelled on its own).
        self.calls = [*getattr(self, "calls", []), f"cancel {job_id}"]
        jid = self._resolve(job_id)
        het = self._jobs[jid].het_job_id
        if het and str(job_id) == str(het):
            for j in list(self._jobs.values()):
                if j.het_job_id == het:
                    super().cancel(j.job_id)
        else:
            super().cancel(job_id)


def het(leader: int, n: int, **kw: Any) -> list[JobInfo]:
    return [job(leader + k, het_job_id=leader, het_job_offset=k, **kw) for k in range(n)]


def test_het_job_is_requeued_through_its_leader_when_every_component_qualifies(
        tmp_path: Path) -> None:
    fake = HetFake(nodes=cluster().nodes(), jobs=het(10, 2))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    dry = {d.job: d for d in plan(fake, samples({10: 0.0, 11: 0.0}), c, now=NOW, log=log,
                                  output_probe=append_probe)}
    assert (dry["10+0"].rule, dry["10+0"].planned, dry["10+0"].action) == (
        "het-job", "requeue", "warn")
    assert dry["10+0"].target == "10" and [x.job for x in dry["10+0"].components] == [
        "10+0", "10+1"]
    assert "through its leader" in (dry["10+0"].row()["change"] or "")
    assert (dry["10+1"].rule, dry["10+1"].planned) == ("het-job", "none")
    warned(log, fake, [10], "requeue")
    d = plan(fake, samples({10: 0.0, 11: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = {o.job: o for o in execute(fake, d, c, log, now=NOW, output_probe=append_probe)}
    assert out["10+0"].result == "done" and out["10+1"].result == "logged"
    assert fake.calls == ["10"]
    for jid in (10, 11):
        assert fake.job(jid).state == "PENDING" and fake.job(jid).restarts == 1
    action = next(log.entries("action"))
    assert action["target"] == "10" and "10+1" in action["detail"]


@pytest.mark.parametrize(("util", "extra", "blocker"), [
    ({10: 0.0, 11: 80.0}, [], "10+1 is not-idle"),
    ({10: 0.0, 11: None}, [], "10+1 is unknown-metrics"),
    ({10: 0.0, 11: 0.0}, [JobInfo(12, name="cpu", state="RUNNING", het_job_id=10,
                                  het_job_offset=2)], "10+2 holds no GPU"),
    ({10: 0.0, 11: 0.0}, [JobInfo(12, name="cpu", state="PENDING", het_job_id=10,
                                  het_job_offset=2)], "10+2 is PENDING"),
])
def test_het_job_with_one_component_not_qualifying_is_only_notified(
        util: dict, extra: list[JobInfo], blocker: str) -> None:
    fake = HetFake(nodes=cluster().nodes(), jobs=[*het(10, 2), *extra])
    d = {x.job: x for x in plan(fake, samples(util), ctx(), now=NOW,
                                output_probe=append_probe)}
    assert (d["10+0"].rule, d["10+0"].planned) == ("het-job", "notify")
    assert blocker in d["10+0"].reason and d["10+0"].target is None
    assert d["10+1"].rule != "het-job" or d["10+1"].planned == "notify"


def test_het_component_changed_before_the_action_is_skipped(tmp_path: Path) -> None:
    fake = HetFake(nodes=cluster().nodes(), jobs=het(10, 2))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    warned(log, fake, [10], "requeue")
    d = plan(fake, samples({10: 0.0, 11: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    fake._jobs[11] = replace(fake._jobs[11], requeue=False)
    out = {o.job: o for o in execute(fake, d, c, log, now=NOW, output_probe=append_probe)}
    assert out["10+0"].result == "skipped" and "component 10+1" in out["10+0"].detail
    assert getattr(fake, "calls", []) == []
    assert fake.job(10).state == "RUNNING" and fake.job(11).state == "RUNNING"


def test_het_requeue_not_seen_on_every_component_is_not_done(tmp_path: Path) -> None:
    class LeaderOnly(FakeSlurm):
        pass  # requeues only the leader: component 10+1 keeps running

    fake = LeaderOnly(nodes=cluster().nodes(), jobs=het(10, 2))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    warned(log, fake, [10], "requeue")
    d = plan(fake, samples({10: 0.0, 11: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = {o.job: o for o in execute(fake, d, c, log, now=NOW, output_probe=append_probe)}
    assert out["10+0"].result == "not-requeued" and "10+1: state RUNNING" in out["10+0"].detail


def test_a_job_still_held_after_the_release_is_not_done(tmp_path: Path) -> None:
    class ReleaseIgnored(FakeSlurm):
        def release(self, job_id: JobRef) -> None:
            pass  # Slurm accepted the command, the job stays held

    fake = ReleaseIgnored(nodes=cluster().nodes(), jobs=[h100_job()])
    log = ActionLog(tmp_path / "a.jsonl")
    c = demo_ctx(notify_command=("/bin/false",))
    warned(log, fake, [1], "downgrade")
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "not-requeued" and "held" in out[0].detail
    assert [(e["step"], e["result"]) for e in log.entries("action")][-1] == (
        "release", "not-requeued")
    assert not [e for e in log.entries("notify") if e["action"] == "downgrade"]


# Issue 18, finding 4: an interactive (salloc) het job, or any changing action on a het
# component, follows the every-component rule; a component is never acted on alone.
@pytest.mark.parametrize(("kw", "stall", "planned"), [
    ({"batch": False}, {"non_batch_action": "cancel"}, "cancel"),
    ({"restarts": 2}, {"over_cap_action": "requeue_hold"}, "requeue_hold"),
])
def test_a_het_component_is_not_acted_on_while_another_is_busy(
        tmp_path: Path, kw: dict, stall: dict, planned: str) -> None:
    fake = HetFake(nodes=cluster().nodes(), jobs=het(10, 2, **kw))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx(**stall)
    warned(log, fake, [10, 11], planned)
    d = {x.job: x for x in plan(fake, samples({10: 0.0, 11: 80.0}), c, now=NOW, log=log,
                                output_probe=append_probe)}
    assert (d["10+0"].rule, d["10+0"].planned, d["10+0"].action) == (
        "het-job", "notify", "notify")
    assert "10+1 is not-idle" in d["10+0"].reason
    assert d["10+1"].planned == "none"
    execute(fake, list(d.values()), c, log, now=NOW, output_probe=append_probe)
    assert getattr(fake, "calls", []) == []
    assert fake.job(10).state == "RUNNING" and fake.job(11).state == "RUNNING"


def test_an_idle_interactive_het_job_is_cancelled_whole_through_its_leader(
        tmp_path: Path) -> None:
    fake = HetFake(nodes=cluster().nodes(), jobs=het(10, 2, batch=False))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx(non_batch_action="cancel")
    warned(log, fake, [10], "cancel")
    d = {x.job: x for x in plan(fake, samples({10: 0.0, 11: 0.0}), c, now=NOW, log=log,
                                output_probe=append_probe)}
    assert (d["10+0"].rule, d["10+0"].planned, d["10+0"].action) == (
        "het-job", "cancel", "cancel")
    assert d["10+0"].target == "10" and [x.job for x in d["10+0"].components] == [
        "10+0", "10+1"]
    assert (d["10+1"].rule, d["10+1"].planned) == ("het-job", "none")
    out = {o.job: o for o in execute(fake, list(d.values()), c, log, now=NOW,
                                     output_probe=append_probe)}
    assert out["10+0"].result == "done" and fake.calls == ["cancel 10"]
    assert fake.job(10).state == "CANCELLED" and fake.job(11).state == "CANCELLED"
