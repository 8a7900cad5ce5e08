"""requeue-stalled on a fake cluster with synthetic samples: every rule, exemption, the cap,
the warning grace, acting with re-checks and verification, and one failure not stopping
the others."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from _act_fixtures import HOUR, NOW, append_probe, cluster, ctx, job, samples

from hetslurm.act.log import ActionLog
from hetslurm.act.stall import execute, plan
from hetslurm.errors import BackendError
from hetslurm.lab.fake_slurm import FakeSlurm
from hetslurm.policy.stall import gate
from hetslurm.site.schema import Usage
from hetslurm.slurm.units import GresItem


def rules(decisions: list) -> dict[str, tuple[str, str]]:
    return {d.job: (d.rule, d.planned) for d in decisions}


def test_idle_busy_and_unknown_use_the_audit_rule() -> None:
    fake = cluster(job(1), job(2), job(3), job(4), job(5, started_h=0.2))
    s = samples({1: 0.0, 2: 50.0, 3: None, 5: 0.0})
    got = rules(plan(fake, s, ctx(), now=NOW, output_probe=append_probe))
    assert got["1"] == ("idle", "requeue")
    assert got["2"] == ("not-idle", "none")
    assert got["3"][0] == "unknown-metrics"  # unknown is never idle
    assert got["4"][0] == "unknown-metrics"  # no samples at all
    assert got["5"][0] == "in-grace"


def test_a_busy_spell_inside_the_window_is_not_idle() -> None:
    # Idle for the first of two hours, busy for the last ten minutes: the window judged is
    # the last one, so no action.
    s = samples({1: 0.0})
    s.loc[s["time"] > NOW - 600, "utilization_pct"] = 40.0
    got = rules(plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe))
    assert got["1"] == ("not-idle", "none")


def test_low_coverage_is_not_idle() -> None:
    s = samples({1: 0.0}, start=NOW - 600)  # 10 of 60 minutes sampled
    got = rules(plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe))
    assert got["1"][0] == "unknown-metrics"


@pytest.mark.parametrize(("kw", "stall", "rule", "planned"), [
    ({"user": "bob"}, {"exempt_users": ("bob",)}, "exempt-user", "none"),
    ({"account": "vip"}, {"exempt_accounts": ("vip",)}, "exempt-account", "none"),
    ({"partition": "debug"}, {"exempt_partitions": ("debug",)}, "exempt-partition", "none"),
    ({"qos": "long"}, {"exempt_qos": ("long",)}, "exempt-qos", "none"),
    ({"requeue": False}, {}, "no-requeue", "none"),
    ({"admin_comment": 'JS1:x hetslurm:{"v":1,"req":"gpus=2 no-requeue"}'}, {},
     "no-requeue", "none"),
    ({"admin_comment": 'hetslurm:{"v":1,"on_idle":"notify"}'}, {}, "on-idle-notify",
     "notify"),
    ({"admin_comment": 'hetslurm:{"v":1,"on_idle":"downgrade"}'}, {}, "on-idle-downgrade",
     "notify"),
    ({"batch": False}, {}, "non-batch", "notify"),
    ({"batch": False}, {"non_batch_action": "cancel"}, "non-batch", "cancel"),
    ({"het_job_id": 9, "het_job_offset": 0}, {}, "het-job", "notify"),
    ({"restarts": 2}, {}, "cap-reached", "notify"),
    ({"restarts": 2}, {"over_cap_action": "requeue_hold"}, "cap-reached", "requeue_hold"),
    ({}, {"action": "requeue_hold"}, "idle", "requeue_hold"),
    ({}, {"action": "notify"}, "idle", "notify"),
    # Issue 18, finding 7: an unknown restart count cannot be checked against the cap.
    ({"restarts": None}, {}, "restarts-unknown", "none"),
    ({"restarts": None}, {"over_cap_action": "requeue_hold"}, "restarts-unknown", "none"),
    ({"restarts": None, "batch": False}, {"non_batch_action": "cancel"}, "restarts-unknown",
     "none"),
])
def test_rules_and_exemptions(kw: dict, stall: dict, rule: str, planned: str) -> None:
    fake = cluster(job(1, **kw))
    got = rules(plan(fake, samples({1: 1.0}), ctx(**stall), now=NOW, output_probe=append_probe))
    assert list(got.values()) == [(rule, planned)]


def test_user_edited_comment_is_not_the_record() -> None:
    # The record lives in AdminComment by default; a user's Comment cannot exempt a job.
    fake = cluster(job(1, comment='hetslurm:{"v":1,"on_idle":"notify","req":"no-requeue"}'))
    got = rules(plan(fake, samples({1: 0.0}), ctx(), now=NOW, output_probe=append_probe))
    assert got["1"] == ("idle", "requeue")


@pytest.mark.parametrize(("mode", "rule"), [("append", "idle"), ("discarded", "idle"),
                                            ("truncate", "output-not-append"),
                                            ("unknown", "output-not-append")])
def test_output_not_in_append_mode_is_skipped_and_notified(mode: str, rule: str) -> None:
    got = rules(plan(cluster(job(1)), samples({1: 0.0}), ctx(), now=NOW,
                     output_probe=lambda _: mode))
    assert got["1"][0] == rule
    forced = rules(plan(cluster(job(1)), samples({1: 0.0}), ctx(no_append_action="requeue"),
                        now=NOW, output_probe=lambda _: mode))
    assert forced["1"] == ("idle", "requeue")


def test_gate_needs_a_matured_warning_from_an_earlier_run() -> None:
    c = ctx()
    assert gate("requeue", None, c, NOW) == "warn"
    assert gate("requeue", NOW, c, NOW) == "warn"  # this run's own warning does not count
    assert gate("requeue", NOW - 600, c, NOW) == "wait"
    assert gate("requeue", NOW - 1800, c, NOW) == "requeue"
    assert gate("requeue", NOW - 10 * HOUR, c, NOW) == "warn"  # expired
    assert gate("notify", None, c, NOW) == "notify"


def test_first_run_warns_then_acts_after_the_grace(tmp_path: Path) -> None:
    fake = cluster(job(1), job(2))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    d1 = plan(fake, samples({1: 0.0, 2: 80.0}), c, now=NOW, log=log, output_probe=append_probe)
    assert [d.action for d in d1] == ["warn", "none"]
    execute(fake, d1, c, log, now=NOW, output_probe=append_probe)
    assert fake.job(1).state == "RUNNING"
    t2 = NOW + 600
    d2 = plan(fake, samples({1: 0.0}, end=t2), c, now=t2, log=log, output_probe=append_probe)
    assert d2[0].action == "wait"
    t3 = NOW + 1800
    d3 = plan(fake, samples({1: 0.0}, end=t3), c, now=t3, log=log, output_probe=append_probe)
    assert d3[0].action == "requeue"
    out = execute(fake, d3, c, log, now=t3, output_probe=append_probe)
    # Job 2 has no samples now: unknown, logged, untouched.
    assert [(o.job, o.result) for o in out] == [("1", "done"), ("2", "logged")]
    assert fake.job(2).state == "RUNNING"
    assert fake.job(1).state == "PENDING" and fake.job(1).restarts == 1
    kinds = [e["kind"] for e in log.entries()]
    assert kinds.count("warning") == 1 and "action" in kinds and kinds[-1] == "run"
    action = next(e for e in log.entries("action"))
    assert action["result"] == "done" and action["restarts_before"] == 0
    decision = next(e for e in log.entries("decision") if e["action"] == "requeue")
    assert decision["evidence"]["max_util_pct"] == 0.0 and decision["evidence"]["idle"]


def _warned(fake: FakeSlurm, log: ActionLog, c, ids: list[int]) -> None:
    for jid in ids:
        j = fake.job(jid)
        log.append("warning", {"t": NOW - 1800, "job": j.display_id, "job_id": jid,
                               "restarts": j.restarts, "rule": "idle", "planned": "requeue"})


def test_array_task_is_acted_on_as_array_underscore_task(tmp_path: Path) -> None:
    calls: list[str] = []

    class Recording(FakeSlurm):
        def requeue(self, job_id, *, incomplete=True):  # type: ignore[no-untyped-def]
            calls.append(str(job_id))
            assert incomplete
            super().requeue(job_id, incomplete=incomplete)

    t = job(41, array_job_id=40, array_task_id=3)
    fake = Recording(nodes=cluster().nodes(), jobs=[t])
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [41])
    d = plan(fake, samples({41: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    assert d[0].job == "40_3" and d[0].action == "requeue"
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert calls == ["40_3"] and out[0].result == "done"


def test_job_that_finished_before_the_action_is_not_rerun(tmp_path: Path) -> None:
    fake = cluster(job(1), job(2))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1, 2])
    d = plan(fake, samples({1: 0.0, 2: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    fake._stop(1, "COMPLETED", None)  # finished between decision and action
    out = {o.job: o for o in execute(fake, d, c, log, now=NOW, output_probe=append_probe)}
    assert out["1"].result == "skipped" and "COMPLETED" in out["1"].detail
    assert fake.job(1).state == "COMPLETED" and fake.job(1).restarts == 0
    assert out["2"].result == "done"


def test_finish_in_the_last_instant_is_caught_by_incomplete_and_verification(
        tmp_path: Path) -> None:
    class FinishesFirst(FakeSlurm):
        def requeue(self, job_id, *, incomplete=True):  # type: ignore[no-untyped-def]
            self._stop(self._resolve(job_id), "COMPLETED", None)
            super().requeue(job_id, incomplete=incomplete)

    fake = FinishesFirst(nodes=cluster().nodes(), jobs=[job(1)])
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx(notify_command=("/bin/true",))
    _warned(fake, log, c, [1])
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "not-requeued" and out[0].notified is None
    assert fake.job(1).state == "COMPLETED" and fake.job(1).restarts == 0
    assert not [e for e in log.entries("notify") if e["action"] == "requeue"]


def test_preemption_requeue_meanwhile_is_not_acted_on_again(tmp_path: Path) -> None:
    fake = cluster(job(1))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1])
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    fake.requeue(1)  # Slurm's own PreemptMode=REQUEUE got there first
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "skipped"
    assert fake.job(1).restarts == 1


def test_a_flag_changed_since_the_decision_is_rechecked(tmp_path: Path) -> None:
    fake = cluster(job(1))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1])
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    fake._jobs[1] = replace(fake._jobs[1], requeue=False)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "skipped" and "no-requeue" in out[0].detail
    assert fake.job(1).state == "RUNNING"


def test_one_failure_never_stops_the_others(tmp_path: Path) -> None:
    class Flaky(FakeSlurm):
        def requeue(self, job_id, *, incomplete=True):  # type: ignore[no-untyped-def]
            if str(job_id) == "1":
                raise BackendError("slurmctld said no")
            super().requeue(job_id, incomplete=incomplete)

    fake = Flaky(nodes=cluster().nodes(), jobs=[job(1), job(2), job(3)])
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1, 2, 3])
    d = plan(fake, samples({1: 0.0, 2: 0.0, 3: 0.0}), c, now=NOW, log=log,
             output_probe=append_probe)
    out = {o.job: o.result for o in execute(fake, d, c, log, now=NOW,
                                            output_probe=append_probe)}
    assert out == {"1": "failed", "2": "done", "3": "done"}
    assert any(e["result"] == "failed" for e in log.entries("action"))


def test_controller_restarting_after_the_requeue_is_waited_for(tmp_path: Path) -> None:
    """Issue 18: slurmctld restarts right after accepting the requeue. Verification reads
    again until it answers (its state survives the restart): done, logged once, not failed."""
    class Restarts(FakeSlurm):
        down_reads = 0

        def requeue(self, job_id, *, incomplete=True):  # type: ignore[no-untyped-def]
            super().requeue(job_id, incomplete=incomplete)
            self.down_reads = 3

        def job(self, ref):  # type: ignore[no-untyped-def]
            if self.down_reads:
                self.down_reads -= 1
                raise BackendError("scontrol: error: Unable to contact slurm controller")
            return super().job(ref)

    fake = Restarts(nodes=cluster().nodes(), jobs=[job(1)])
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1])
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe, sleep=lambda s: None)
    assert [o.result for o in out] == ["done"]
    assert fake.job(1).restarts == 1 and fake.down_reads == 0
    assert [e["result"] for e in log.entries("action")] == ["done"]


def test_hold_and_cancel_are_verified(tmp_path: Path) -> None:
    fake = cluster(job(1, restarts=2), job(2, batch=False))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx(over_cap_action="requeue_hold", non_batch_action="cancel")
    _warned(fake, log, c, [1, 2])
    d = plan(fake, samples({1: 0.0, 2: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    assert [x.action for x in d] == ["requeue_hold", "cancel"]
    out = {o.job: o.result for o in execute(fake, d, c, log, now=NOW,
                                            output_probe=append_probe)}
    assert out == {"1": "done", "2": "done"}
    assert fake.job(1).restarts == 3 and "held" in (fake.job(1).reason or "")
    assert fake.job(2).state == "CANCELLED"


def test_notify_only_once_per_job_and_rule(tmp_path: Path) -> None:
    fake = cluster(job(1, requeue=True, admin_comment='hetslurm:{"v":1,"on_idle":"notify"}'))
    log = ActionLog(tmp_path / "a.jsonl")
    out_file = tmp_path / "notes"
    script = tmp_path / "notifier"
    script.write_text(f"#!/bin/sh\ncat >> {out_file}\necho >> {out_file}\n")
    script.chmod(0o755)
    c = ctx(notify_command=(str(script), "{job}", "{action}"))
    for k in range(3):
        t = NOW + k * 600
        d = plan(fake, samples({1: 0.0}, end=t), c, now=t, log=log, output_probe=append_probe)
        execute(fake, d, c, log, now=t, output_probe=append_probe)
    notes = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip()]
    assert len(notes) == 1 and notes[0]["rule"] == "on-idle-notify"
    assert fake.job(1).state == "RUNNING"


def test_24h_of_cron_ticks_give_at_most_cap_plus_one_actions(tmp_path: Path) -> None:
    # A job that idles forever, a tick every 10 minutes, each requeue restarting it at once.
    fake = cluster(job(1))
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx(max_requeues=2, over_cap_action="requeue_hold")
    changing = 0
    for tick in range(24 * 6):
        t = NOW + tick * 600
        if fake.job(1).state == "PENDING" and "held" not in (fake.job(1).reason or ""):
            from datetime import UTC, datetime

            fake._jobs[1] = replace(fake._jobs[1], state="RUNNING", nodes=("n1",),
                                    allocated_gres=job(1).allocated_gres,
                                    start_time=datetime.fromtimestamp(t - 600, tz=UTC))
        s = samples({1: 0.0}, start=t - 2 * HOUR, end=t)
        d = plan(fake, s, c, now=t, log=log, output_probe=append_probe)
        for o in execute(fake, d, c, log, now=t, output_probe=append_probe):
            if o.result == "done":
                changing += 1
    assert changing <= c.stall.max_requeues + 1
    assert fake.job(1).restarts == 3 and "held" in (fake.job(1).reason or "")


def test_a_record_that_reads_differently_is_not_trusted(tmp_path: Path) -> None:
    # A name such as "x JobState=PENDING Restarts=9" can forge fields of scontrol's one-line
    # record: the single read then disagrees with the listing, and the job is left alone.
    class Forged(FakeSlurm):
        def job(self, job_id):  # type: ignore[no-untyped-def]
            real = super().job(job_id)
            return replace(real, name=real.name.split(" ")[0])

    fake = Forged(nodes=cluster().nodes(), jobs=[job(1, name="x JobState=RUNNING Restarts=0")])
    log = ActionLog(tmp_path / "a.jsonl")
    c = ctx()
    _warned(fake, log, c, [1])
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    out = execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert out[0].result == "skipped" and "not trusted" in out[0].detail
    assert fake.job(1).state == "RUNNING"


def test_decision_record_with_two_markers_is_not_trusted() -> None:
    """Issue 18, finding 3 (the reader's side): a field holding two record markers (one
    forged before the hook refused them) gives no record, not the first segment."""
    from hetslurm.policy.stall import decision_record

    honest = 'hetslurm:{"v":1,"outcome":"rewrite","on_idle":"notify"}'
    rec = decision_record(job(1, admin_comment=honest))
    assert rec is not None and rec.on_idle == "notify"
    forged = 'hetslurm:{"v":1,"on_idle":"notify"} ' + honest.replace("notify", "requeue")
    assert decision_record(job(1, admin_comment=forged)) is None
    assert decision_record(job(1, comment=forged), "comment") is None


def test_a_job_with_an_unknown_restart_count_is_never_requeued(tmp_path: Path) -> None:
    # Issue 18, finding 7: even with a matured warning for it, nothing is done.
    fake = cluster(job(1, restarts=None))
    log = ActionLog(tmp_path / "a.jsonl")
    log.append("warning", {"t": NOW - 3600, "job": "1", "job_id": 1, "restarts": None,
                           "rule": "idle", "planned": "requeue"})
    log.append("warning", {"t": NOW - 3600, "job": "1", "job_id": 1, "restarts": 0,
                           "rule": "idle", "planned": "requeue"})
    c = ctx()
    d = plan(fake, samples({1: 0.0}), c, now=NOW, log=log, output_probe=append_probe)
    assert (d[0].rule, d[0].planned, d[0].action) == ("restarts-unknown", "none", "none")
    assert "restart count" in d[0].reason
    execute(fake, d, c, log, now=NOW, output_probe=append_probe)
    assert fake.job(1).state == "RUNNING"


# Issue 18, finding 2: coverage is judged per allocated (node, GPU) against the window's
# wall time; a device with no rows is unknown, and a sample's own interval_s is capped.
def test_a_two_node_job_with_one_node_unreported_is_not_idle() -> None:
    two = {"n1": (GresItem("gpu", "a100", 2, (0, 1)),),
           "n2": (GresItem("gpu", "a100", 2, (0, 1)),)}
    fake = cluster(job(1, nodes=("n1", "n2"), allocated_gres=two))
    d = plan(fake, samples({1: 0.0}), ctx(), now=NOW, output_probe=append_probe)  # n1 only
    assert (d[0].rule, d[0].planned) == ("unknown-metrics", "none")
    assert "2 of 4 allocated GPU(s)" in d[0].reason
    assert d[0].evidence is not None and not d[0].evidence.idle


def test_an_eight_gpu_job_with_four_gpus_reported_is_not_idle() -> None:
    d = plan(cluster(job(1, gpus=8)), samples({1: 0.0}, {1: 4}), ctx(), now=NOW,
             output_probe=append_probe)
    assert (d[0].rule, d[0].planned) == ("unknown-metrics", "none")
    assert "4 of 8 allocated GPU(s)" in d[0].reason
    full = plan(cluster(job(1, gpus=8)), samples({1: 0.0}, {1: 8}), ctx(), now=NOW,
                output_probe=append_probe)
    assert (full[0].rule, full[0].planned) == ("idle", "requeue")  # the honest idle job


def test_samples_of_a_device_the_job_does_not_hold_cover_nothing() -> None:
    # Rows naming job 1 on GPUs 2-3 (stale attribution) do not stand in for its GPUs 0-1.
    s = samples({1: 0.0}, {1: 4})
    s = s[s["slurm_index"] >= 2]
    d = plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe)
    assert d[0].rule == "unknown-metrics"


@pytest.mark.parametrize("claimed", [1e6, 3600.0, float("inf")])
def test_a_sample_claiming_a_huge_interval_cannot_cover_the_window(claimed: float) -> None:
    s = samples({1: 0.0}, start=NOW - 10, end=NOW - 9)  # one sample per GPU
    s["interval_s"] = claimed
    d = plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe)
    assert (d[0].rule, d[0].planned) == ("unknown-metrics", "none")


def test_duplicated_rows_count_once() -> None:
    # Every sample written four times (an interrupted compaction) over a third of the hour:
    # still a third of the window, not four thirds.
    s = samples({1: 0.0}, start=NOW - 1200)
    s = pd.concat([s] * 4, ignore_index=True)
    d = plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe)
    assert d[0].rule == "unknown-metrics"


def test_the_interval_cap_comes_from_the_sites_collector() -> None:
    from hetslurm.act.run import context_for
    from hetslurm.site import load_site

    demo = Path(__file__).resolve().parents[2] / "site-configs" / "demo.toml"
    assert context_for(load_site(demo)).max_interval_s == 30.0
    # Samples every 60 s against a 30 s collector count for half the window: exactly the
    # default min_coverage; with 0.6 the same job is unknown.
    s = samples({1: 0.0})
    s = s[(s["time"] - s["time"].min()) % 60 == 0].copy()
    s["interval_s"] = 60.0
    assert plan(cluster(job(1)), s, ctx(), now=NOW, output_probe=append_probe)[0].rule == "idle"
    strict = replace(ctx(), usage=Usage(min_coverage=0.6))
    assert plan(cluster(job(1)), s, strict, now=NOW,
                output_probe=append_probe)[0].rule == "unknown-metrics"
