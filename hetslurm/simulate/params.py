"""The simulator's assumptions, loaded from ``site-configs/simulate-params.toml``.

Every number the replay uses that is not in the site or the trace comes from this file; the
code holds no defaults for them. Unknown keys are refused with the file, the key and a
"did you mean".
"""

from __future__ import annotations

import difflib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hetslurm.errors import ConfigError
from hetslurm.textfile import read_text_file

SCHEMA = "hetslurm-simulate-params/1"
#: The replay's backfill models (``[scheduler] backfill``): ``slurm``, Slurm 22.05's rules
#: (:mod:`hetslurm.simulate.slurm_backfill`, what ``simulate --validate`` checks against
#: the testbed), and ``easy``, EASY backfill (:mod:`hetslurm.simulate.easy`).
BACKFILLS = ("slurm", "easy")
#: How the ``slurm`` model finds a pending job's start: "exact", the earliest time it fits
#: beside the running jobs' planned ends and the pass's reservations; "batched", as
#: cons_tres's will-run test finds it (:func:`hetslurm.simulate.slurm_backfill._will_run`).
WILL_RUN = ("exact", "batched")
#: The policies a parameter file may define: four Slurm configurations a careful admin
#: could build without hetslurm (:data:`BASELINES`), then hetslurm's.
POLICIES = ("slurm-default", "slurm-cpu-partition", "slurm-speed-weights", "slurm-tuned",
            "hetslurm")
#: The baselines: ``slurm-default`` (Slurm's defaults), ``slurm-cpu-partition`` (CPU jobs in
#: a partition of the CPU-only nodes, so every GPU node's cores stay for GPU jobs),
#: ``slurm-speed-weights`` (typed gres as users ask, node Weight= by measured speed) and
#: ``slurm-tuned`` (both). A policy's ratios are against the strongest baseline in the run.
BASELINES = POLICIES[:-1]
#: ``[policy.*] node_weights``: Slurm's default 1 everywhere, the site's Weight=, or by
#: speed (CPU-only nodes first, then GPU models fastest first by the geometric mean of
#: their ``[speeds]`` over the classes).
NODE_WEIGHTS = ("uniform", "site", "speed")
SCORE_KEYS = ("model", "islands", "numa", "leftover", "load", "energy", "weight")
#: The parts of what a hetslurm site runs that ``simulate --without`` switches off, one at a
#: time or together (docs/simulate.md, "The whole system"): ``fallback``, ranked fallback
#: (off: the model OR in node-weight order, ``ranked_fallback = "weights"``); ``speeds``,
#: the class rankings ``learn speeds --rank`` proposes from measured speeds (off: the site
#: file's own orders).
PARTS = ("fallback", "speeds")
#: Parts of the whole system the replay does not model yet: asking to switch one off is
#: refused with this reason rather than silently changing nothing.
NOT_REPLAYED = {
    "requeue": "requeue and downgrade of stalled jobs are not replayed yet (no trace records "
               "GPU utilization; issue 24)",
    "relax": "relax of pending requests is not replayed yet (no trace job carries a "
             "wait-for= or energy= request it would relax; issue 24)",
    "scoring": "the measured-load weight bands are not replayed yet (issue 24)",
}
#: The name of hetslurm's policy replayed with ``parts`` switched off.
VARIANT_PREFIX = "hetslurm-without-"


def variant_name(parts: frozenset[str] | set[str]) -> str:
    """``hetslurm-without-fallback+speeds`` for ``{"speeds", "fallback"}`` (parts in
    :data:`PARTS` order)."""
    return VARIANT_PREFIX + "+".join(p for p in PARTS if p in parts)


def parse_without(text: str) -> frozenset[str]:
    """One ``--without`` value (``fallback,speeds``) as a set of parts.

    Raises:
        ConfigError: an empty value, or a part that is unknown or not replayed.
    """
    parts = [w.strip() for w in text.split(",")]
    if not any(parts):
        raise ConfigError(f"--without {text!r}: name a part: {', '.join(PARTS)}")
    for w in parts:
        if w in NOT_REPLAYED:
            raise ConfigError(f"--without {w}: {NOT_REPLAYED[w]}; parts: {', '.join(PARTS)}")
        if w not in PARTS:
            close = difflib.get_close_matches(w, PARTS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"--without {w!r}: not a part{hint}; parts: {', '.join(PARTS)}")
    return frozenset(parts)


@dataclass(frozen=True)
class PolicyParams:
    """How one policy renders the cluster and rewrites jobs."""

    name: str
    node_weights: str  # one of NODE_WEIGHTS
    gpu_partition: str  # a partition name, "*" (all nodes) or "class"
    cpu_partition: str
    use_classes: bool
    use_priority: bool
    score: Mapping[str, int]
    #: Parts of the whole system switched off (:data:`PARTS`); only a variant of
    #: ``hetslurm`` (:func:`variant_name`) has any.
    without: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Params:
    """All assumptions (see the TOML file for each one's source)."""

    path: str
    cpu_class: str
    io_gpu_milli_below: int
    cpu_slowdown_of_io_jobs: float
    untyped_shares: Mapping[str, float]
    gavel_family: Mapping[str, str]
    speeds: Mapping[str, Mapping[str, float]]
    reference_model: Mapping[str, str]
    time_limit_factor: float
    max_runtime_s: float
    cores_per_gpu: int
    cores_per_cpu_job: int
    fractional_gpu: str
    oversize: str
    priority_by_qos: Mapping[str, str]
    #: A trace's GPU model names (Alibaba ``gpu_spec``) to the site's, where they differ;
    #: a name not here matches the site model of the same name, case aside.
    trace_gpu_models: Mapping[str, str]
    backfill_depth: int
    backfill: str
    backfill_window_s: float
    policies: Mapping[str, PolicyParams]
    bounded_mean_wait_s: float
    #: The seed of the replay's random choices (the class drawn for a job the trace leaves
    #: untyped); not in the file: ``simulate --seed``. 0 is the draw of earlier releases.
    seed: int = 0
    #: How the ``slurm`` model finds a pending job's start (``[scheduler] will_run``,
    #: :data:`WILL_RUN`): "exact" (default) or "batched",
    #: cons_tres's will-run test.
    will_run: str = "exact"

    def with_speed_exponent(self, exponent: float) -> Params:
        """The same assumptions with every ``[speeds]`` value raised to ``exponent``.

        Every ratio between two models' speeds is raised to the same power: 0 makes all
        models equally fast, 1 keeps the file's speeds, 2 squares each ratio. The
        sensitivity sweep of docs/evidence.md varies it. Gavel traces are unaffected (their
        runtimes come from Gavel's table, not from ``[speeds]``).

        Raises:
            ConfigError: ``exponent`` is negative or not finite.
        """
        if not math.isfinite(exponent) or exponent < 0:
            raise ConfigError(f"speed exponent {exponent!r} must be a finite number >= 0")
        speeds = {cls: {m: v ** exponent for m, v in row.items()}
                  for cls, row in self.speeds.items()}
        return replace(self, speeds=speeds)

    def policy(self, name: str) -> PolicyParams:
        """The policy ``name``: a ``[policy.*]`` table, or a variant of ``hetslurm`` with
        parts switched off (``hetslurm-without-fallback+speeds``).

        Raises:
            ConfigError: no such policy (or a variant's part is unknown).
        """
        hit = self.policies.get(name)
        if hit is not None:
            return hit
        base = self.policies.get("hetslurm")
        if name.startswith(VARIANT_PREFIX) and base is not None:
            parts = frozenset(name[len(VARIANT_PREFIX):].split("+"))
            if parts <= set(PARTS) and variant_name(parts) == name:
                return replace(base, name=name, without=parts)
        raise ConfigError(f"{self.path}: no policy '{name}'; policies: "
                          f"{', '.join(self.policies)} (or {VARIANT_PREFIX}PART[+PART])")

    def speed(self, cls: str, model: str) -> float:
        """Relative speed of ``model`` for class ``cls``.

        Raises:
            ConfigError: the file gives no speed for that class and model.
        """
        try:
            return self.speeds[cls][model]
        except KeyError:
            raise ConfigError(
                f"{self.path}: [speeds] has no speed for class '{cls}' on model '{model}'; "
                "add it with its source"
            ) from None


class _Table:
    """One TOML table whose keys are consumed; what is left over is refused."""

    def __init__(self, data: Any, where: str, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: [{where}] must be a table")
        self.data = dict(data)
        self.where = where
        self.path = path
        self.used: set[str] = set()

    def _get(self, key: str) -> Any:
        if key not in self.data:
            raise ConfigError(f"{self.path}: [{self.where}] lacks '{key}'")
        self.used.add(key)
        return self.data[key]

    def str_(self, key: str, choices: tuple[str, ...] | None = None) -> str:
        v = self._get(key)
        if not isinstance(v, str) or (choices is not None and v not in choices):
            want = f"one of {choices}" if choices else "a string"
            raise ConfigError(f"{self.path}: [{self.where}] {key} = {v!r} is not {want}")
        return v

    def int_(self, key: str, low: int = 0) -> int:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ConfigError(
                f"{self.path}: [{self.where}] {key} = {v!r} is not an integer >= {low}")
        return v

    def num(self, key: str, low: float = 0.0) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int | float) or v < low:
            raise ConfigError(
                f"{self.path}: [{self.where}] {key} = {v!r} is not a number >= {low}")
        return float(v)

    def bool_(self, key: str) -> bool:
        v = self._get(key)
        if not isinstance(v, bool):
            raise ConfigError(f"{self.path}: [{self.where}] {key} = {v!r} is not true/false")
        return v

    def table(self, key: str) -> _Table:
        return _Table(self._get(key), f"{self.where}.{key}" if self.where else key, self.path)

    def mapping(self, key: str, kind: type) -> dict[str, Any]:
        t = self.table(key)
        out: dict[str, Any] = {}
        for k, v in t.data.items():
            ok = isinstance(v, kind) and not isinstance(v, bool)
            if kind is float:
                ok = isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            if not ok:
                raise ConfigError(
                    f"{self.path}: [{t.where}] {k} = {v!r} is not a {kind.__name__}")
            out[k] = float(v) if kind is float else v
        return out

    def done(self) -> None:
        extra = sorted(set(self.data) - self.used)
        if extra:
            close = difflib.get_close_matches(extra[0], sorted(set(self.data) | self.used), n=2)
            close = [c for c in close if c != extra[0]]
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(
                f"{self.path}: [{self.where or 'top level'}] unknown key '{extra[0]}'{hint}")


def load_params(path: str | Path) -> Params:
    """Read and check a parameter file.

    Raises:
        ConfigError: the file is missing, is not TOML, or a key is unknown, missing or of
            the wrong type (the message names the file and the key).
    """
    p = str(path)
    try:
        raw = tomllib.loads(read_text_file(path, what="parameter file"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from e
    top = _Table(raw, "", p)
    if top.str_("schema") != SCHEMA:
        raise ConfigError(f"{p}: schema must be '{SCHEMA}'")
    c = top.table("classify")
    speeds_t = top.table("speeds")
    speeds = {cls: speeds_t.mapping(cls, float) for cls in list(speeds_t.data)}
    r = top.table("runtime")
    j = top.table("jobs")
    s = top.table("scheduler")
    m = top.table("measures")
    pol_t = top.table("policy")
    policies: dict[str, PolicyParams] = {}
    for name in list(pol_t.data):
        if name not in POLICIES:
            raise ConfigError(
                f"{p}: [policy.{name}] is not a policy; policies: {', '.join(POLICIES)}")
        t = pol_t.table(name)
        score_t = t.table("score")
        score = {k: score_t.int_(k) for k in SCORE_KEYS}
        score_t.done()
        policies[name] = PolicyParams(
            name=name,
            node_weights=t.str_("node_weights", NODE_WEIGHTS),
            gpu_partition=t.str_("gpu_partition"),
            cpu_partition=t.str_("cpu_partition"),
            use_classes=t.bool_("use_classes"),
            use_priority=t.bool_("use_priority"),
            score=score,
        )
        t.done()
    pol_t.done()
    shares = c.mapping("untyped_shares", float)
    params = Params(
        path=p,
        cpu_class=c.str_("cpu_class"),
        io_gpu_milli_below=c.int_("io_gpu_milli_below"),
        cpu_slowdown_of_io_jobs=c.num("cpu_slowdown_of_io_jobs", 1e-9),
        untyped_shares=shares,
        gavel_family=c.mapping("gavel_family", str),
        speeds=speeds,
        reference_model=r.mapping("reference_model", str),
        time_limit_factor=r.num("time_limit_factor", 1.0),
        max_runtime_s=r.num("max_runtime_s"),
        cores_per_gpu=j.int_("cores_per_gpu", 1),
        cores_per_cpu_job=j.int_("cores_per_cpu_job", 1),
        fractional_gpu=j.str_("fractional_gpu", ("round-up", "drop")),
        oversize=j.str_("oversize", ("drop",)),
        priority_by_qos=j.mapping("priority_by_qos", str),
        trace_gpu_models=(j.mapping("trace_gpu_models", str)
                          if "trace_gpu_models" in j.data else {}),
        backfill_depth=s.int_("backfill_depth", 0),
        backfill=s.str_("backfill", BACKFILLS),
        backfill_window_s=s.num("backfill_window_s", 1.0),
        will_run=s.str_("will_run", WILL_RUN) if "will_run" in s.data else "exact",
        policies=policies,
        bounded_mean_wait_s=m.num("bounded_mean_wait_s", 1e-9),
    )
    for t in (c, speeds_t, r, j, s, m, top):
        t.done()
    bad = [v for v in params.priority_by_qos.values() if v not in ("high", "normal", "low")]
    if bad:
        raise ConfigError(f"{p}: [jobs] priority_by_qos value {bad[0]!r} is not high/normal/low")
    for cls in shares:
        if cls not in speeds:
            raise ConfigError(
                f"{p}: [classify] untyped_shares names class '{cls}' without [speeds]")
    return params
