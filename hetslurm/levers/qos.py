"""QOS records the site asks for, compared with slurmdbd's and synced through the access
layer (sacctmgr: :meth:`hetslurm.slurm.SlurmBackend.add_qos` and friends).

Only the QOS named in ``[levers.qos]`` are touched, and only the fields hetslurm manages
(priority, usage factor, per-user and per-job TRES limits, jobs per user, wall time); other
QOS and other fields stay as the admin left them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetslurm.levers.rollout import QOS_ACTION, Change, Plan
from hetslurm.site import Site
from hetslurm.site import levers as site_levers
from hetslurm.slurm import QosInfo, SlurmBackend, units

#: Managed fields: name in hetslurm -> sacctmgr keyword.
FIELDS = {
    "priority": "Priority",
    "usage_factor": "UsageFactor",
    "max_tres_per_user": "MaxTRESPerUser",
    "max_tres_per_job": "MaxTRESPerJob",
    "max_jobs_per_user": "MaxJobsPerUser",
    "max_wall": "MaxWall",
}


@dataclass(frozen=True)
class QosState:
    """The managed fields of one QOS in comparable form (JSON-safe for backups)."""

    priority: int = 0
    usage_factor: float = 1.0
    max_tres_per_user: Mapping[str, int] | None = None
    max_tres_per_job: Mapping[str, int] | None = None
    max_jobs_per_user: int | None = None
    max_wall: int | None = None  # seconds

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> QosState:
        return cls(**{k: d[k] for k in FIELDS if k in d})


def wanted(site: Site) -> dict[str, QosState]:
    out = {}
    for name, q in site_levers.qos_records(site).items():
        wall = units.time_seconds(q.max_wall) if q.max_wall else None
        out[name] = QosState(
            priority=q.priority,
            usage_factor=float(q.usage_factor) if q.usage_factor is not None else 1.0,
            max_tres_per_user=site_levers.qos_tres(site, q.max_tres_per_user),
            max_tres_per_job=site_levers.qos_tres(site, q.max_tres_per_job),
            max_jobs_per_user=q.max_jobs_per_user,
            max_wall=wall if isinstance(wall, int) else None,
        )
    return out


def live_state(info: QosInfo) -> QosState:
    wall = info.max_wall
    return QosState(
        priority=info.priority,
        usage_factor=info.usage_factor,
        max_tres_per_user=dict(sorted(info.max_tres_per_user.items())),
        max_tres_per_job=dict(sorted(info.max_tres_per_job.items())),
        max_jobs_per_user=info.max_jobs_per_user,
        max_wall=wall if isinstance(wall, int) else None,
    )


def _show(field: str, value: Any) -> str:
    if isinstance(value, Mapping):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "none"
    if field == "max_wall" and isinstance(value, int):
        return units.format_time(value)
    return "none" if value is None else str(value)


def _describe(state: QosState) -> str:
    return " ".join(f"{FIELDS[f]}={_show(f, getattr(state, f))}" for f in FIELDS)


def differing(want: QosState, have: QosState) -> list[str]:
    return [f for f in FIELDS if _norm(getattr(want, f)) != _norm(getattr(have, f))]


def _norm(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((k, v) for k, v in value.items()))
    if isinstance(value, float):
        return round(value, 6)
    return value


@dataclass(frozen=True)
class Grant:
    """A QOS one association may use: an account's, or a user's in ``account``."""

    qos: str
    kind: str  # "user" | "account"
    name: str
    account: str = ""


def wanted_grants(site: Site) -> list[Grant]:
    out = []
    for name, q in site_levers.qos_records(site).items():
        out += [Grant(name, "account", a) for a in q.accounts]
        out += [Grant(name, "user", u) for u in q.users]
    return out


Assoc = Mapping[tuple[str, str, str], set[str]]


def missing_grants(site: Site, assoc_qos: Assoc) -> list[Grant]:
    """Grants to add, one per association that lacks the QOS (a user named in ``users``
    gets it in each of its accounts; a user without an association gets nothing)."""
    out = []
    for g in wanted_grants(site):
        for (kind, name, account), have in sorted(assoc_qos.items()):
            if kind == g.kind and name == g.name and g.qos not in have:
                out.append(Grant(g.qos, kind, name, account if kind == "user" else ""))
    return out


def plan(site: Site, live: Sequence[QosInfo], assoc_qos: Assoc) -> Plan:
    """QOS changes: records to add or modify, grants to add.

    Args:
        assoc_qos: ``(kind, name, account) -> QOS the association may use`` from
            :meth:`QosAccounting.association_qos` (kind ``user`` or ``account``).
    """
    have = {q.name: live_state(q) for q in live}
    changes = []
    for name, want in wanted(site).items():
        if name not in have:
            changes.append(Change("qos", f"qos {name}", None, _describe(want), QOS_ACTION,
                                  "sacctmgr add qos"))
            continue
        fields = differing(want, have[name])
        if fields:
            changes.append(Change(
                "qos", f"qos {name}",
                " ".join(f"{FIELDS[f]}={_show(f, getattr(have[name], f))}" for f in fields),
                " ".join(f"{FIELDS[f]}={_show(f, getattr(want, f))}" for f in fields),
                QOS_ACTION, "sacctmgr modify qos"))
    for g in missing_grants(site, assoc_qos):
        where = f" in account {g.account}" if g.account else ""
        changes.append(Change("qos", f"qos {g.qos} for {g.kind} {g.name}{where}", None,
                              f"qos+={g.qos}", QOS_ACTION, f"sacctmgr modify {g.kind}"))
    return Plan(tuple(changes))


# ---------------------------------------------------------------- sacctmgr
def _tres_arg(want: Mapping[str, int] | None, have: Mapping[str, int] | None) -> str:
    """A TRES limit list that also clears limits no longer wanted (``=-1``)."""
    want = want or {}
    parts = [f"{k}={v}" for k, v in want.items()]
    parts += [f"{k}=-1" for k in (have or {}) if k not in want]
    return ",".join(parts)


def settings(want: QosState, have: QosState | None) -> dict[str, str]:
    """sacctmgr keyword -> value that turn ``have`` (None: a new QOS) into ``want``."""
    args: dict[str, str] = {}
    for f in FIELDS if have is None else differing(want, have):
        value = getattr(want, f)
        if f in ("max_tres_per_user", "max_tres_per_job"):
            arg = _tres_arg(value, getattr(have, f) if have else None)
            if arg:
                args[FIELDS[f]] = arg
        elif value is None:
            if have is not None:
                args[FIELDS[f]] = "-1"
        elif f == "max_wall":
            args[FIELDS[f]] = units.format_time(value)
        else:
            args[FIELDS[f]] = str(value)
    return args


class QosAccounting:
    """One cluster's QOS records and grants in slurmdbd, through the access layer (``env``
    carries ``SLURM_CONF``; ``backend`` replaces the CLI backend, e.g. with a fake)."""

    def __init__(self, env: Mapping[str, str] | None, cluster: str,
                 backend: SlurmBackend | None = None) -> None:
        if backend is None:
            from hetslurm.slurm.cli_backend import SACCTMGR_TIMEOUT_S, CliBackend

            backend = CliBackend(env, timeout=SACCTMGR_TIMEOUT_S)
        self.slurm = backend
        self.cluster = cluster

    def association_qos(self) -> dict[tuple[str, str, str], set[str]]:
        """QOS each association of the cluster may use, keyed ``(kind, name, account)``."""
        out: dict[tuple[str, str, str], set[str]] = {}
        for a in self.slurm.associations(self.cluster):
            if a.user:
                out[("user", a.user, a.account)] = set(a.qos)
            else:
                out[("account", a.account, "")] = set(a.qos)
        return out

    def add_or_modify(self, name: str, want: QosState, have: QosState | None,
                      description: str = "") -> None:
        if have is None:
            self.slurm.add_qos(name, settings(want, None), description=description)
        else:
            self.slurm.modify_qos(name, settings(want, have))

    def delete(self, name: str) -> None:
        self.slurm.delete_qos(name)

    def grant(self, g: Grant, revoke: bool = False) -> None:
        self.slurm.grant_qos(g.qos, g.kind, g.name, self.cluster, account=g.account,
                             revoke=revoke)
