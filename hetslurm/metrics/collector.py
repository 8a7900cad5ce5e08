"""The node collector: read NVML, attribute every GPU to the job holding it, store samples.

Attribution never goes by position: for each node, Slurm's GPU index -> gres.conf ``File=``
-> the device file's minor number -> the NVML device reporting that minor. Each sample also
records the job's GPU indices on the node, which sacct does not keep.

The collector never changes Slurm: a lost or missing GPU is a sample (and ``TickResult.lost``);
draining its node is the health phase of ``hetslurm rebalance`` (:mod:`hetslurm.act.health`),
the one path from device health to a drain.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetslurm.errors import HetslurmError, MetricsError
from hetslurm.metrics import samples as S
from hetslurm.metrics.gres import (
    GresDevice,
    MinorOf,
    default_gres_conf,
    device_minor,
    load_gres_conf,
    minors_by_index,
)
from hetslurm.metrics.nvml import NvmlSource
from hetslurm.metrics.store import SegmentStore
from hetslurm.slurm.backend import JobInfo, SlurmBackend
from hetslurm.slurm.units import format_indices

log = logging.getLogger(__name__)

#: Job states in which a job holds its GPUs.
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED"})
#: Wall and monotonic clocks may drift apart this much per tick before a jump is flagged.
CLOCK_SLACK_S = 2.0
#: Samples a node's buffer keeps while its segments cannot be written (a day of a 8-GPU node
#: at 30 s is 23,040): past that the oldest go, counted.
MAX_BUFFERED_ROWS = 100_000


class _Call:
    """One source read running in its own thread; ``done`` is set when it returns."""

    def __init__(self, source: NvmlSource, node: str) -> None:
        self.done = threading.Event()
        self.result: list[S.GpuReading] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(source, node), daemon=True,
                                       name=f"nvml-read-{node}")
        self.thread.start()

    def _run(self, source: NvmlSource, node: str) -> None:
        try:
            self.result = source.read(node)
        except BaseException as exc:  # handed to the collector's thread, which decides
            self.error = exc
        finally:
            self.done.set()


@dataclass
class TickResult:
    time: float
    rows: list[dict[str, Any]]
    lost: dict[str, list[int]] = field(default_factory=dict)  # node -> minors


def job_gpus_by_node(jobs: Iterable[JobInfo]) -> dict[str, dict[int, tuple[int, tuple[int, ...]]]]:
    """node -> Slurm GPU index -> (job id, that job's GPU indices on the node)."""
    out: dict[str, dict[int, tuple[int, tuple[int, ...]]]] = {}
    for job in jobs:
        if job.state not in HOLDING_STATES:
            continue
        for node in job.allocated_gres:
            idx: set[int] = set()
            for key, indices in job.gres_on(node).items():
                if key[0] == "gpu":
                    idx |= set(indices)
            mine = tuple(sorted(idx))
            for i in mine:
                out.setdefault(node, {})[i] = (job.job_id, mine)
    return out


class Collector:
    """Samples the GPUs of ``nodes`` every ``interval_s`` seconds.

    Args:
        nodes: node names this collector reads (one on a real node; the testbed's GPU nodes
            when the fake NVML emulates them all).
        source: the NVML source (real or fake).
        backend: the Slurm access layer, for which job holds which GPU index.
        gres: gres.conf's GPU devices per node, in Slurm index order.
        store: where segments go (None: keep samples in memory only, for tests).
        minor_of: device path -> minor (the real one stats the character device).
        source_timeout_s: how long one tick waits for the source's reads (all nodes' reads
            run at once, each in its own thread). A node whose read has not answered by then
            is ``unknown`` this tick, and stays so, without a second call, while that read
            hangs: at most one outstanding call per node, and a hung driver costs one
            timeout, not one per tick.
    """

    def __init__(self, nodes: Sequence[str], source: NvmlSource, backend: SlurmBackend | None,
                 gres: Mapping[str, list[GresDevice]], store: SegmentStore | None = None, *,
                 interval_s: float = 30.0, flush_s: float = 300.0,
                 minor_of: MinorOf = device_minor,
                 source_timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.nodes = list(nodes)
        self.source = source
        self.backend = backend
        self.gres = gres
        self.store = store
        self.interval_s = float(interval_s)
        self.flush_s = float(flush_s)
        self.minor_of = minor_of
        self.source_timeout_s = float(source_timeout_s)
        self._pending: dict[str, _Call] = {}  # node -> its read still hung
        self.clock = clock
        self.monotonic = monotonic
        self.buffer: dict[str, list[dict[str, Any]]] = {}
        self.written: list[Path] = []
        self.dropped = 0  # samples dropped from a buffer past MAX_BUFFERED_ROWS
        self.ticks = 0
        self._last: tuple[float, float] | None = None
        self._last_flush = monotonic()
        self._stop = False

    # ------------------------------------------------------------------ one tick
    def tick(self) -> TickResult:
        # Slurm is asked first and the clock read right before the NVML reads: the sample
        # time is the reads' (an energy counter's increment is divided by the time between
        # two samples; a Slurm call of varying length between the stamp and the read would
        # put its jitter into every job's mean power).
        holders: dict[str, dict[int, tuple[int, tuple[int, ...]]]] = {}
        attributed = True
        if self.backend is not None:
            try:
                holders = job_gpus_by_node(self.backend.jobs())
            except HetslurmError as exc:
                # Samples are still written, marked unattributed: never guessed.
                attributed = False
                log.warning("Slurm did not answer; samples of this tick carry no job: %s", exc)
        else:
            attributed = False
        now_wall, now_mono = self.clock(), self.monotonic()
        jump = False
        if self._last is not None:
            wall_d, mono_d = now_wall - self._last[0], now_mono - self._last[1]
            if abs(wall_d - mono_d) > max(CLOCK_SLACK_S, 0.5 * self.interval_s):
                jump = True
                log.warning("wall clock moved %.1fs in %.1fs of monotonic time; samples of "
                            "this tick are flagged clock_jump", wall_d, mono_d)
        self._last = (now_wall, now_mono)
        t = round(now_wall, 3)
        res = TickResult(time=t, rows=[])
        readings = self._read_nodes()
        for node in self.nodes:
            res.rows.extend(self._node_rows(node, t, holders.get(node, {}), attributed,
                                            jump, res, readings[node]))
        self.ticks += 1
        for row in res.rows:
            self.buffer.setdefault(row["node"], []).append(row)
        return res

    def _read_nodes(self) -> dict[str, list[S.GpuReading] | None]:
        """Every node's readings, None for a node whose read did not answer in time."""
        out: dict[str, list[S.GpuReading] | None] = {}
        calls: dict[str, _Call] = {}
        for node in self.nodes:
            hung = self._pending.get(node)
            if hung is not None:
                if not hung.done.is_set():
                    out[node] = None  # still hung: no second call piles up behind it
                    continue
                # It answered after its tick: that answer is stale and dropped.
                del self._pending[node]
                log.warning("NVML read of %s answered again", node)
            calls[node] = _Call(self.source, node)
        # The real monotonic clock: the deadline is about threads, not the injected clock.
        deadline = time.monotonic() + self.source_timeout_s
        for node, call in calls.items():
            call.done.wait(max(0.0, deadline - time.monotonic()))
            if not call.done.is_set():
                self._pending[node] = call
                out[node] = None
                log.warning("NVML read of %s did not answer within %gs; its GPUs are %s "
                            "until it does", node, self.source_timeout_s, S.STATUS_UNKNOWN)
            elif isinstance(call.error, HetslurmError):
                log.warning("NVML read failed on %s: %s", node, call.error)
                out[node] = []
            elif call.error is not None:
                raise call.error
            else:
                out[node] = call.result
        return out

    def _node_rows(self, node: str, t: float, holders: dict[int, tuple[int, tuple[int, ...]]],
                   attributed: bool, jump: bool, res: TickResult,
                   readings: list[S.GpuReading] | None) -> list[dict[str, Any]]:
        devices = self.gres.get(node, [])
        index_of_minor = {m: i for i, m in minors_by_index(devices, self.minor_of).items()}
        model_of = {d.index: d.model for d in devices}
        if readings is None:
            # The source did not answer: nothing is known, nothing is lost.
            return [self._row(node, t, None, minor, None, index, model_of.get(index), holders,
                              attributed, jump, S.STATUS_UNKNOWN, None)
                    for minor, index in sorted(index_of_minor.items(), key=lambda kv: kv[1])]
        rows: list[dict[str, Any]] = []
        seen: set[int] = set()
        for r in readings:
            index = index_of_minor.get(r.minor) if r.minor is not None else None
            status = r.status
            if index is None and status == S.STATUS_OK:
                status = S.STATUS_UNMATCHED
            if r.minor is not None:
                seen.add(r.minor)
            rows.append(self._row(node, t, r.nvml_index, r.minor, r.uuid, index,
                                  model_of.get(index) if index is not None else None,
                                  holders, attributed, jump, status, r))
            if status == S.STATUS_LOST and r.minor is not None:
                res.lost.setdefault(node, []).append(r.minor)
        for minor, index in sorted(index_of_minor.items(), key=lambda kv: kv[1]):
            if minor not in seen:
                # gres.conf names it, NVML does not list it: the device is gone.
                rows.append(self._row(node, t, None, minor, None, index, model_of.get(index),
                                      holders, attributed, jump, S.STATUS_MISSING, None))
                res.lost.setdefault(node, []).append(minor)
        return rows

    def _row(self, node: str, t: float, nvml_index: int | None, minor: int | None,
             uuid: str | None, index: int | None, model: str | None,
             holders: dict[int, tuple[int, tuple[int, ...]]], attributed: bool, jump: bool,
             status: str, r: S.GpuReading | None) -> dict[str, Any]:
        job = holders.get(index) if index is not None else None
        return {
            "time": t, "node": node, "nvml_index": nvml_index, "minor": minor, "uuid": uuid,
            "gpu_model": model, "slurm_index": index,
            "job_id": job[0] if job else None,
            "job_gpus": format_indices(job[1]) if job else None,
            "utilization_pct": r.utilization_pct if r and status == S.STATUS_OK else None,
            "memory_used_mib": r.memory_used_mib if r else None,
            "memory_total_mib": r.memory_total_mib if r else None,
            "power_w": r.power_w if r else None,
            "energy_j": r.energy_j if r else None,
            "mig_mode": r.mig_mode if r else None,
            "status": status, "interval_s": self.interval_s,
            "attributed": attributed, "clock_jump": jump,
            "throttle_reasons": r.throttle_reasons if r else None,
            "ecc_uncorrectable": r.ecc_uncorrectable if r else None,
            "xid": r.xid if r else None,
        }

    # ------------------------------------------------------------------ loop
    def flush(self, *, final: bool = False) -> list[Path]:
        """Write buffered samples, one segment per node.

        A segment that cannot be written (the store's disk full, an I/O error) keeps its
        samples in the buffer for the next flush, up to ``MAX_BUFFERED_ROWS`` per node (the
        oldest are dropped past that, counted in ``self.dropped``), with one warning per
        failure. ``final``: the last flush of a run, which raises MetricsError naming what
        could not be written instead of keeping it.
        """
        out: list[Path] = []
        if self.store is None:
            return out
        failed: list[str] = []
        for node, rows in list(self.buffer.items()):
            if rows:
                try:
                    p = self.store.write(node, rows)
                except OSError as exc:
                    failed.append(f"{node}: {len(rows)} sample(s): {exc.strerror or exc}")
                    over = len(rows) - MAX_BUFFERED_ROWS
                    if over > 0:
                        del rows[:over]
                        self.dropped += over
                    log.warning("metrics store %s: cannot write %s's segment (%s); %d "
                                "sample(s) kept in memory for the next flush", self.store.root,
                                node, exc.strerror or exc, len(rows))
                    continue
                if p:
                    out.append(p)
            self.buffer[node] = []
        self._last_flush = self.monotonic()
        self.written.extend(out)
        if final and (failed or self.dropped):
            raise MetricsError(
                f"metrics store {self.store.root}: samples not written: {'; '.join(failed)}"
                + (f"; {self.dropped} older sample(s) dropped while it failed"
                   if self.dropped else ""))
        return out

    def stop(self, *_: Any) -> None:
        """Stop after the tick under way (also the SIGTERM/SIGINT handler)."""
        self._stop = True

    def run(self, *, ticks: int | None = None, duration_s: float | None = None,
            until: Callable[[], bool] | None = None, handle_signals: bool = False) -> int:
        """Tick on a fixed cadence until ``ticks``/``duration_s``/``until`` says stop or a
        signal arrives; flushes every ``flush_s`` and at the end. Returns ticks done."""
        if handle_signals:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        start = self.monotonic()
        self._last_flush = start - self.flush_s  # the first tick is written at once
        done = 0
        try:
            while not self._stop:
                next_at = start + (done + 1) * self.interval_s
                self.tick()
                done += 1
                # Half a tick of slack: with flush_s == interval_s every tick is written
                # even when a tick comes a little early (the exporter relies on that).
                if self.monotonic() - self._last_flush >= self.flush_s - 0.5 * self.interval_s:
                    self.flush()
                if ticks is not None and done >= ticks:
                    break
                if duration_s is not None and self.monotonic() - start >= duration_s:
                    break
                if until is not None and until():
                    break
                delay = next_at - self.monotonic()
                if delay > 0:
                    time.sleep(delay)
        finally:
            try:
                self.flush(final=True)
            finally:
                self.source.close()
        return done


# ---------------------------------------------------------------------- building one
def build_source(kind: str, scenario: str | None) -> NvmlSource:
    """The NVML source a configuration names: ``real`` or ``fake`` (needs a scenario)."""
    if kind == "fake":
        if not scenario:
            raise MetricsError("the fake NVML needs a scenario file "
                               "([collector] fake_scenario or --fake-scenario)")
        from hetslurm.metrics.fake_nvml import FakeNvml

        return FakeNvml(scenario)
    if kind == "real":
        from hetslurm.metrics.nvml import RealNvml

        return RealNvml()
    raise MetricsError(f"unknown NVML source '{kind}' (real or fake)")


def local_node_name() -> str:
    """Slurm's default NodeName for this host: the short host name."""
    return socket.gethostname().split(".", 1)[0]


def resolve_gres(path: str | None, env: Mapping[str, str] | None = None,
                 local_node: str | None = None) -> dict[str, list[GresDevice]]:
    return load_gres_conf(path or default_gres_conf(env if env is not None else os.environ),
                          local_node=local_node)
