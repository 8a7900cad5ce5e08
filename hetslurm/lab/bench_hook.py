"""``hetslurm bench hook``: what the hook costs, in-process and inside slurmctld.

In-process: the rendered job_submit.lua in lupa's Lua 5.1 (the controller's language version),
each call timed from Python around ``slurm_job_submit`` (so the figure includes lupa's call
overhead, a little more than the controller pays). Typical jobs are short scripts with and
without #HET lines; adversarial ones are the corpus's worst: 4 MB headers, 100,000 directive
lines, 64 KiB lines, requests at the 1024-byte bound.

On the testbed (a fresh one in a temporary folder): slurmctld's own time per
``REQUEST_SUBMIT_BATCH_JOB`` from ``sdiag`` for the same job submitted two ways: a ``#HET``
script, and the equivalent sbatch options (``--gres=gpu:2 --constraint=h100|a100
--partition=gpu``) without one. The hook enforces throughout (no reload between rounds); for
the plain job it scans the script header, finds no request and returns. So both sides make
slurmctld validate the same job and the difference is the hook's decision and its record.
Queue depths of 0, 1,000 and 5,000 held jobs (each round's own jobs are cancelled after it).
Within a round the two jobs alternate submission by submission, and each submission's time is
the rise of sdiag's ``total_time`` across it, so a drift of the machine weighs on both sides
alike; each round starts once slurmctld's queue to slurmdbd is empty, after two unmeasured
warm-up rounds. The ratio held to the target is that of the two sides' mean submit times over
all their submissions (2,000 each by default).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hetslurm.errors import CommandError
from hetslurm.hook.install import set_installed_mode
from hetslurm.hook.render import render_hook
from hetslurm.hook.standin import HookRuntime
from hetslurm.lab import hostile, luatimer
from hetslurm.site import load_site
from hetslurm.slurm import SUBMIT_BATCH_RPC, SlurmBackend

TYPICAL = (
    "#!/bin/bash\n#SBATCH -t 10\n#SBATCH -J train\n#HET gpus=2 class=train\nsrun python t.py\n",
    "#!/bin/bash\n#SBATCH -t 10\n#HET gpus=4 gpu-type=h100|a100 locality=nvlink:required\n"
    "srun ./a.out\n",
    "#!/bin/bash\n#SBATCH -t 10\n#HET class=io cores=4 mem=8G no-requeue\n./prep.sh\n",
    "#!/bin/bash\n#SBATCH -t 10\n#HET fpga=u280:1 class=stream\n./kernel\n",
    "#!/bin/bash\n#SBATCH -t 10\n#SBATCH -N 1\n# no directives at all\nsrun hostname\n",
    "#!/bin/bash\n#HET nodes=2 gpus=8 locality=switch switch-wait=5m priority=low\nsrun x\n",
)


#: The job both the cold figure and the testbed benchmark time, with its request (TYPICAL[0])
#: and as the fields the hook writes for it, given directly (the hook scans it and leaves it).
HET_LINE = "#HET gpus=2 class=train\n"
PLAIN_SCRIPT = TYPICAL[0].replace(HET_LINE, "")
PLAIN_FIELDS = {"tres_per_node": "gres:gpu:2", "features": "h100|a100", "partition": "gpu"}
#: The same fields as sbatch options.
PLAIN_OPTIONS = [f"--gres={PLAIN_FIELDS['tres_per_node'].removeprefix('gres:')}",
                 f"--constraint={PLAIN_FIELDS['features']}",
                 f"--partition={PLAIN_FIELDS['partition']}"]


def adversarial_times(rt: HookRuntime, repeats: int = 3) -> dict[str, float]:
    """ms per call of every case of the hostile corpus (hetslurm.lab.hostile), the median of
    ``repeats`` calls each, the slowest first."""
    clock = time.perf_counter_ns
    out: dict[str, float] = {}
    for case in hostile.cases():
        took = []
        for _ in range(repeats):
            job = rt.job(case.job())
            t0 = clock()
            rt.submit_raw(job)
            took.append((clock() - t0) / 1e6)
        out[case.name] = round(statistics.median(took), 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))
    return ordered[k]


#: What the cold figure writes between two calls: more than this machine's last-level cache
#: (32 MB here), so each call starts, like the hook inside slurmctld, with nothing cached.
EVICT_BYTES = 64 << 20
COLD_CALLS = 200


def cold_calls(rt: HookRuntime, values: dict[str, Any], calls: int) -> list[float]:
    """This thread's CPU time (us) of ``calls`` calls, each after writing EVICT_BYTES.

    slurmctld runs the hook on a fresh thread between sbatch processes, with the caches full of
    other work: what a call costs there follows the memory it touches (docs/hook.md, "The
    cold-memory model"), which a warm loop of calls hides.
    """
    src = b"\x01" * EVICT_BYTES
    dst = memoryview(bytearray(EVICT_BYTES))  # assigned through a view: memcpy in place
    times: list[float] = []
    clock = time.thread_time_ns
    gc.collect()
    gc.disable()
    try:
        for _ in range(calls):
            job = rt.job(values)
            dst[:] = src  # one memcpy over every line of 64 MB
            t0 = clock()
            rt.submit_raw(job)
            times.append((clock() - t0) / 1000.0)
    finally:
        gc.enable()
    return times


def bench_in_process(site_path: str | Path, calls: int = 20_000) -> dict[str, Any]:
    """p50/p99 of a typical call and the slowest adversarial call, in-process."""
    site = load_site(site_path)
    rt = HookRuntime(render_hook(site).text)
    # A fresh job description per call (the hook writes into the one it gets), built in small
    # batches outside the timing: many live stand-ins would make Lua's collector traverse a
    # heap the controller does not have (it holds one job description at a time).
    for text in TYPICAL:  # warm up
        rt.submit_raw(rt.job({"script": text, "user_name": "root"}))
    times: list[float] = []
    cpu: list[float] = []
    clock = time.perf_counter_ns
    cpu_clock = time.thread_time_ns
    batch = 20
    # Python's own garbage collector is not the controller's cost: keep it out of the timing.
    gc.collect()
    gc.disable()
    try:
        done = 0
        while done < calls:
            jobs = [rt.job({"script": TYPICAL[(done + i) % len(TYPICAL)], "user_name": "root"})
                    for i in range(min(batch, calls - done))]
            for job in jobs:
                c0 = cpu_clock()
                t0 = clock()
                rt.submit_raw(job)
                t1 = clock()
                c1 = cpu_clock()
                times.append((t1 - t0) / 1000.0)
                # This thread's CPU time around the same call: what the call itself costs,
                # without the time the machine's other work took the CPU away (shown beside
                # the wall-clock figures, which are the ones held against the target).
                cpu.append((c1 - c0) / 1000.0)
            done += len(jobs)
            del jobs
    finally:
        gc.enable()
    adversarial = adversarial_times(rt)
    worst = next(iter(adversarial))
    # Cold: the #HET job of the testbed benchmark and the same job as plain options, each call
    # after the caches were flushed (cold_calls).
    het = {"script": TYPICAL[0], "user_name": "root"}
    plain = {"script": PLAIN_SCRIPT, "user_name": "root", **PLAIN_FIELDS}
    cold_het = statistics.median(cold_calls(rt, het, COLD_CALLS))
    cold_plain = statistics.median(cold_calls(rt, plain, COLD_CALLS))
    return {
        "typical_calls": calls,
        "typical_p50_us": round(_percentile(times, 0.50), 1),
        "typical_p99_us": round(_percentile(times, 0.99), 1),
        "typical_mean_us": round(statistics.fmean(times), 1),
        "typical_cpu_p50_us": round(_percentile(cpu, 0.50), 1),
        "typical_cpu_p99_us": round(_percentile(cpu, 0.99), 1),
        "adversarial_max_ms": adversarial[worst],
        "adversarial_worst_case": worst,
        "adversarial_cases": len(adversarial),
        "cold_het_p50_us": round(cold_het, 1),
        "cold_plain_p50_us": round(cold_plain, 1),
        "cold_extra_us": round(cold_het - cold_plain, 1),
        # the ten slowest cases of the corpus
        "adversarial_ms": dict(list(adversarial.items())[:10]),
        # the slowest that sbatch hands to slurmctld as it is, for the controller figure
        "adversarial_live_worst_case": next(
            name for name in adversarial if name in _live_names()),
    }


def _live_names() -> set[str]:
    return {c.name for c in hostile.live_subset(hostile.cases())}


def _sdiag_submit(slurm: SlurmBackend) -> tuple[int, int]:
    """(count, total_time in microseconds) of REQUEST_SUBMIT_BATCH_JOB since the last reset."""
    got = slurm.controller_stats().rpc(SUBMIT_BATCH_RPC)
    return got.count, got.total_us


def _cpu_seconds(pid: int | None) -> float | None:
    """CPU seconds slurmctld has used so far, user and system, its threads that have ended
    included (slurmctld serves each RPC on a thread of its own that ends with it, so summing
    the live threads' schedstat would miss the submissions' own work), or None.

    Read from the process's CPU-time clock (``clock_getcpuclockid``: nanoseconds; the
    clock id of process PID is ``(~PID << 3) | 2``); /proc/PID/stat's utime + stime (clock
    ticks, 10 ms) where that clock cannot be read."""
    if pid is None:
        return None
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    try:
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    except (IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def _held_total(slurm: SlurmBackend) -> int:
    """Every job slurmctld holds, finished ones not yet purged included."""
    return len(slurm.queued_ids(states=["all"]))


def _max_job_count(slurm: SlurmBackend) -> int:
    value = slurm.config().get("MaxJobCount", "")
    return int(value) if value.isdigit() else 10_000


def _pending(slurm: SlurmBackend) -> int:
    return len(slurm.queued_ids(states=["PD"]))


def _mean(values: list[int]) -> float:
    return round(statistics.fmean(values), 1)


def depth_result(pending: int, with_rounds: list[list[int]], without_rounds: list[list[int]],
                 cpu_with: list[float], cpu_without: list[float],
                 lua_with: list[float] | None = None,
                 lua_without: list[float] | None = None) -> dict[str, Any]:
    """One depth's entry from its rounds: each round a list of per-submission times (us,
    slurmctld's own time for that one REQUEST_SUBMIT_BATCH_JOB, from sdiag's total_time
    read after it), the two sides' submissions alternating within the round.

    ``with_hook_us`` and ``without_hook_us`` are the sides' mean submit times over all their
    submissions (the issue's "average submit time"), and ``ratio``, held to the target, is
    their ratio: the two jobs alternate submission by submission, so whatever drifts (the
    VM's speed, the database's state) weighs on both sides alike. A few submissions in a
    hundred wait milliseconds for a lock another slurmctld thread holds, on either side;
    they carry a few percent of the total and make a single round's ratio scatter
    (``paired_ratios``, each round's mean with / mean without), which is why the target is
    held to the ratio over all submissions. ``ratio_of_medians`` divides the per-submission
    medians (``with_hook_p50_us``, ``without_hook_p50_us``), which those waits do not move;
    the p99s show them.
    """
    if len(with_rounds) != len(without_rounds):
        raise ValueError("the two sides need the same number of rounds")
    if not with_rounds or any(not r for r in with_rounds + without_rounds):
        raise ValueError("every round needs submissions on both sides")
    all_with = [v for r in with_rounds for v in r]
    all_without = [v for r in without_rounds for v in r]
    w, wo = statistics.fmean(all_with), statistics.fmean(all_without)
    w50, wo50 = statistics.median(all_with), statistics.median(all_without)
    with_means = [statistics.fmean(r) for r in with_rounds]
    without_means = [statistics.fmean(r) for r in without_rounds]
    paired = [a / b for a, b in zip(with_means, without_means, strict=True) if b]
    out: dict[str, Any] = {
        "pending": pending,
        "with_hook_us": round(w, 1),
        "without_hook_us": round(wo, 1),
        "ratio": round(w / wo, 3) if wo else None,
        "with_hook_p50_us": w50,
        "without_hook_p50_us": wo50,
        "ratio_of_medians": round(w50 / wo50, 3) if wo50 else None,
        "with_hook_p99_us": _percentile(all_with, 0.99),
        "without_hook_p99_us": _percentile(all_without, 0.99),
        "submissions": [len(all_with), len(all_without)],
        "paired_ratios": [round(x, 3) for x in paired],
        "with_rounds_us": [round(x, 1) for x in with_means],
        "without_rounds_us": [round(x, 1) for x in without_means],
    }
    # slurmctld's CPU per submission, and the hook's own Lua per call inside it
    # (hetslurm.lab.luatimer): each side's figure is the mean over its submissions.
    for name, a, b in (("cpu", cpu_with, cpu_without), ("lua", lua_with, lua_without)):
        if not a or not b:
            continue
        ma, mb = statistics.fmean(a), statistics.fmean(b)
        out[f"with_hook_{name}_us"] = round(ma, 1)
        out[f"without_hook_{name}_us"] = round(mb, 1)
        if name == "cpu":
            out["cpu_ratio"] = round(ma / mb, 3) if mb else None
        else:
            out["lua_extra_us"] = round(ma - mb, 1)  # the part of the difference that is Lua
    return out


def plugin_reference_result(blocks: list[tuple[str, list[float], list[float]]]
                            ) -> dict[str, Any]:
    """The plugin reference from its blocks of rounds: (phase, plain job rounds, #HET job
    rounds), phase "plugin" (job_submit/lua with the hook) or "none" (no job_submit plugin).

    The plugin blocks come before and after the one without, so a drift of the machine over
    the three shows as a difference between them (``plugin_blocks_us``).
    """
    plain_on = [v for phase, plain, _ in blocks if phase == "plugin" for v in plain]
    het_on = [v for phase, _, het in blocks if phase == "plugin" for v in het]
    plain_off = [v for phase, plain, _ in blocks if phase == "none" for v in plain]
    if not plain_on or not het_on or not plain_off:
        raise ValueError("the plugin reference needs rounds with and without the plugin")
    off = round(statistics.median(plain_off), 1)
    on = round(statistics.median(plain_on), 1)
    het = round(statistics.median(het_on), 1)
    return {
        "pending": 0,
        "no_plugin_us": off,
        "plugin_plain_us": on,
        "plugin_het_us": het,
        "plugin_ratio": round(on / off, 3) if off else None,
        "total_ratio": round(het / off, 3) if off else None,
        "plugin_blocks_us": [round(statistics.median(plain), 1) for phase, plain, _ in blocks
                             if phase == "plugin"],
        "rounds_us": [{"phase": phase, "plain": plain, "het": het_r}
                      for phase, plain, het_r in blocks],
    }


def _plugin_reference(tb: Any, measure: Callable[[tuple[str, ...]], dict[str, list[int]]],
                      rounds: int, say: Callable[[str], None]) -> dict[str, Any]:
    """The same plain job with no job_submit plugin configured at all (slurmctld restarted
    without ``JobSubmitPlugins=lua``), between two blocks with the hook; the #HET job in the
    hook's blocks (the two jobs alternating submission by submission there). What
    job_submit/lua itself costs (Slurm 22.05 rebuilds a Lua table of every job it holds
    before each call), beside what the hook's decision adds."""
    conf = tb.conf
    with_plugin = conf.read_text()
    without = re.sub(r"(?m)^JobSubmitPlugins=lua\n", "", with_plugin)
    if without == with_plugin:
        raise RuntimeError(f"{conf} has no JobSubmitPlugins=lua line")
    blocks: list[tuple[str, list[float], list[float]]] = []
    try:
        for phase, text in (("plugin", with_plugin), ("none", without), ("plugin", with_plugin)):
            if conf.read_text() != text:
                say("plugin reference: restarting slurmctld "
                    + ("without a job_submit plugin" if phase == "none" else "with the hook"))
                conf.write_text(text)
                tb.restart_ctld()
                for _ in range(2):  # a restarted controller is slower for a while
                    measure(("without",))
            plain: list[float] = []
            het: list[float] = []
            for r in range(rounds):
                if phase == "none":
                    plain.append(_mean(measure(("without",))["without"]))
                    continue
                got = measure(("with", "without") if r % 2 == 0 else ("without", "with"))
                het.append(_mean(got["with"]))
                plain.append(_mean(got["without"]))
            blocks.append((phase, plain, het))
    finally:
        if conf.read_text() != with_plugin:
            conf.write_text(with_plugin)
            tb.restart_ctld()
    result = plugin_reference_result(blocks)
    say(f"plugin reference: no plugin {result['no_plugin_us']} us, the plain job through the "
        f"hook {result['plugin_plain_us']} us, the #HET job {result['plugin_het_us']} us")
    return result


def bench_testbed(site_path: str | Path, depths: tuple[int, ...] = (0, 1000, 5000),
                  jobs_per_round: int = 100, rounds: int = 20,
                  log: Callable[[str], None] | None = None,
                  plugin_reference: bool = True, worst_case: str | None = None,
                  worst_blocks: int = 3, worst_per_block: int = 10) -> dict[str, Any]:
    """slurmctld's mean submit time with/without the hook at each queue depth, the plugin
    reference (see _plugin_reference) and, for the hostile corpus case ``worst_case``, the
    same script with the hook enforcing and switched off (see worst_case_result):
    {"depths": [...], "plugin_reference": {...} | None, "worst_case": {...} | None}."""
    from hetslurm.testbed.cluster import SLURMCTLD, Testbed

    say = log or (lambda _m: None)
    site_file = Path(site_path)
    root = Path(tempfile.mkdtemp(prefix="hsh-", dir="/tmp"))
    timer = luatimer.build(root)
    ctld_env = ({"LD_PRELOAD": str(timer[0]), luatimer.ENV: str(timer[1])}
                if timer is not None else {})
    tb = Testbed(root, ctld_env=ctld_env)
    results: list[dict[str, Any]] = []
    try:
        tb.up(site_file)
        slurm = tb.slurm()
        script = root / "job.sh"
        script.write_text(TYPICAL[0])
        # The same job without the hook: the options the hook would have written, given to
        # sbatch directly, so both sides make slurmctld validate the same gres, features and
        # partition and the difference is the hook's own cost.
        plain = root / "plain.sh"
        plain.write_text(PLAIN_SCRIPT)
        filler = root / "filler.sh"
        filler.write_text("#!/bin/sh\ntrue\n")

        def submit(path: Path, *args: str) -> int:
            return slurm.submit_batch(path, ["--hold", "-o", "/dev/null", *args]).job_id

        def settle() -> None:
            # Wait until slurmctld has sent everything to slurmdbd (the last round's
            # submissions and cancellations), so a round does not pay for the one before.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                queued = slurm.controller_stats().dbd_agent_queue_size
                if not queued:
                    return
                time.sleep(0.2)

        def ctld_pid() -> int | None:
            # Read each time: the plugin reference restarts slurmctld.
            st = tb.load_state()
            proc = tb.ctld_proc(st) if st is not None else None
            return proc.pid if proc is not None else None

        cpu_per_job: dict[str, list[float]] = {"with": [], "without": []}
        lua_per_call: dict[str, list[float]] = {"with": [], "without": []}

        def _submitted(expected: int) -> int:
            # slurmctld records an RPC's statistics after it has answered it, so sbatch can
            # be gone before its submission shows in sdiag: read again until it does.
            deadline = time.monotonic() + 10
            while True:
                count, total = _sdiag_submit(slurm)
                if count == expected:
                    return total
                if count > expected or time.monotonic() > deadline:
                    raise RuntimeError(f"sdiag counted {count} submissions, expected "
                                       f"{expected}")
                time.sleep(0.001)

        def measure(sides: tuple[str, ...]) -> dict[str, list[int]]:
            """One round: jobs_per_round submissions per side, the sides taking turns
            submission by submission (in the order given, then reversed, and so on), each
            one's slurmctld time from the rise of sdiag's total_time across it."""
            settle()
            slurm.reset_controller_stats()
            pid = ctld_pid()
            times: dict[str, list[int]] = {side: [] for side in sides}
            ids: list[int] = []
            last = 0
            for i in range(jobs_per_round):
                for side in (sides if i % 2 == 0 else sides[::-1]):
                    cpu0 = _cpu_seconds(pid)
                    lua0 = luatimer.read(timer[1]) if timer is not None else None
                    ids.append(submit(script) if side == "with"
                               else submit(plain, *PLAIN_OPTIONS))
                    cpu1 = _cpu_seconds(pid)
                    lua1 = luatimer.read(timer[1]) if timer is not None else None
                    total = _submitted(len(ids))
                    times[side].append(total - last)
                    last = total
                    if cpu0 is not None and cpu1 is not None:
                        cpu_per_job[side].append((cpu1 - cpu0) * 1e6)
                    if lua0 is not None and lua1 is not None and lua1[1] > lua0[1]:
                        lua_per_call[side].append((lua1[0] - lua0[0])
                                                  / (lua1[1] - lua0[1]) / 1000)
            # The round's own jobs go again, so the queue stays at the depth being measured.
            slurm.cancel_jobs(ids)
            return times

        def switch(mode: str) -> None:
            res = set_installed_mode(tb.etc, mode)
            # install sets an mtime up to 2 s ahead (docs/hook.md); until the clock passes it
            # slurmctld reloads the script at every submission.
            while time.time() < res.mtime + 1.05:
                time.sleep(0.1)

        def try_submit(path: Path) -> int | None:
            try:
                return submit(path)
            except CommandError:  # refused by the hook (a rejected case): timed all the same
                return None

        worst: dict[str, Any] | None = None
        if worst_case is not None:
            case = next(c for c in hostile.cases() if c.name == worst_case)
            hostile_path = root / "hostile.sh"
            hostile_path.write_text(case.script or "")
            blocks: list[tuple[str, list[int]]] = []
            for b in range(2 * worst_blocks):
                mode = ("enforce", "off")[b % 2]
                switch(mode)
                tried = [try_submit(hostile_path)]  # the hook reloads: not timed
                settle()
                slurm.reset_controller_stats()
                took: list[int] = []
                last = 0
                for k in range(worst_per_block):
                    tried.append(try_submit(hostile_path))
                    total = _submitted(k + 1)
                    took.append(total - last)
                    last = total
                blocks.append((mode, took))
                slurm.cancel_jobs([i for i in tried if i is not None])
                say(f"worst case {case.name}, hook {mode}: {_mean(took)} us per submission")
            worst = worst_case_result(case.name, len(case.script or ""), blocks)
            say(f"worst case {case.name}: the hook adds {worst['extra_ms']} ms per submission")

        # The hook enforcing throughout: no reload between rounds, so the sides alternate
        # round by round. "without" submits the same job as plain options; the hook still
        # runs for it and finds no request (it scans the script header and returns).
        res = set_installed_mode(tb.etc, "enforce")
        # install sets an mtime up to 2 s ahead (docs/hook.md); until the clock passes it
        # slurmctld reloads the script at every submission. Wait, then let it load once.
        while time.time() < res.mtime + 1.05:
            time.sleep(0.1)
        # A freshly booted controller is slower for its first minute (node registration,
        # accounting catching up; rounds 2x slower than later ones on either side were seen):
        # two unmeasured rounds per side first.
        say("warming up the controller")
        for _ in range(2):
            measure(("with", "without"))
        reference = None
        for depth in depths:
            missing = depth - _pending(slurm)
            # slurmctld keeps a cancelled job for MinJobAge (300 s) and refuses submissions
            # once it holds MaxJobCount jobs (10,000; sbatch then retries until its timeout):
            # the queue still to build and this depth's rounds must fit, so wait for the
            # earlier rounds' jobs to be purged first.
            rounds_jobs = 2 * rounds * jobs_per_round + 100
            limit = _max_job_count(slurm)
            if depth + rounds_jobs > limit:
                raise RuntimeError(f"depth {depth} with {rounds} rounds of {jobs_per_round} "
                                   f"jobs per side does not fit MaxJobCount={limit}")
            deadline = time.monotonic() + 900
            while _held_total(slurm) + max(missing, 0) + rounds_jobs > limit:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"slurmctld did not purge cancelled jobs in 900 s; depth "
                                       f"{depth} with {rounds} rounds does not fit "
                                       f"MaxJobCount={limit}")
                say("waiting for cancelled jobs to leave slurmctld (MinJobAge)")
                time.sleep(10)
            if missing > 0:
                say(f"building a queue of {depth} held jobs")
                with ThreadPoolExecutor(max_workers=4) as pool:
                    list(pool.map(lambda _i: submit(filler), range(missing)))
            pending = _pending(slurm)
            with_rounds: list[list[int]] = []
            without_rounds: list[list[int]] = []
            for key in cpu_per_job:
                cpu_per_job[key].clear()
                lua_per_call[key].clear()
            for r in range(rounds):
                got = measure(("with", "without") if r % 2 == 0 else ("without", "with"))
                with_rounds.append(got["with"])
                without_rounds.append(got["without"])
                say(f"depth {pending}, round {r + 1}/{rounds}: with "
                    f"{_mean(got['with'])} us, without {_mean(got['without'])} us")
            results.append(depth_result(pending, with_rounds, without_rounds,
                                        cpu_per_job["with"], cpu_per_job["without"],
                                        lua_per_call["with"], lua_per_call["without"]))
            w, wo = results[-1]["with_hook_us"], results[-1]["without_hook_us"]
            extra = results[-1].get("lua_extra_us")
            say(f"depth {pending}: with {w} us, without {wo} us (means), ratio "
                f"{results[-1]['ratio']}; medians {results[-1]['with_hook_p50_us']} / "
                f"{results[-1]['without_hook_p50_us']} us"
                + (f", the hook's Lua {extra} us more per call" if extra is not None else ""))
            if plugin_reference and depth == 0 and reference is None:
                # After depth 0's own rounds, not before them: the reference's rounds (and
                # the jobs slurmctld keeps from them for MinJobAge) must not weigh on them.
                reference = _plugin_reference(tb, measure, max(2, rounds // 2), say)
        if plugin_reference and reference is None:
            say("no plugin reference: it is taken at depth 0, which --depths leaves out")
    finally:
        if tb.running().get(SLURMCTLD) or tb.running().get("munged"):
            tb.down()
        shutil.rmtree(root, ignore_errors=True)
    return {"depths": results, "plugin_reference": reference, "worst_case": worst}


def worst_case_result(name: str, size: int, blocks: list[tuple[str, list[int]]]
                      ) -> dict[str, Any]:
    """The hostile corpus's worst script in slurmctld: sdiag's mean REQUEST_SUBMIT_BATCH_JOB
    time per submission with the hook enforcing and with it switched off (mode off: the
    plugin calls it and it returns at once), from blocks that alternate the two."""
    on = [v for mode, took in blocks if mode == "enforce" for v in took]
    off = [v for mode, took in blocks if mode == "off" for v in took]
    if not on or not off:
        raise ValueError("the worst case needs blocks with the hook on and off")
    m_on, m_off = _mean(on), _mean(off)
    return {"case": name, "bytes": size, "submissions": len(on) + len(off),
            "with_hook_us": m_on, "hook_off_us": m_off,
            "extra_ms": round((m_on - m_off) / 1000, 2),
            "blocks_us": [{"mode": mode, "mean": _mean(took)} for mode, took in blocks]}


def bench_hook(site_path: str | Path, *, calls: int = 20_000, testbed: bool = True,
               depths: tuple[int, ...] = (0, 1000, 5000), jobs_per_round: int = 100,
               rounds: int = 20, log: Callable[[str], None] | None = None,
               plugin_reference: bool = True) -> dict[str, Any]:
    """The whole benchmark as one JSON-able document (see docs/hook.md)."""
    out: dict[str, Any] = {"site": str(site_path)}
    out.update(bench_in_process(site_path, calls))
    if testbed:
        out.update(bench_testbed(site_path, depths, jobs_per_round, rounds, log,
                                 plugin_reference, worst_case=out["adversarial_live_worst_case"]))
    else:
        out["depths"] = []
    out["targets"] = {"typical_p99_us": 100, "adversarial_max_ms": 50, "ratio_at_depth_0": 1.1,
                      "worst_case_extra_ms": 50}
    return out
