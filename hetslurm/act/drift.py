"""Drift: what differs between the site file and the live cluster, read only.

The comparison is ``hetslurm site diff``'s own (:func:`hetslurm.levers.diff`): the site
rendered and the live slurm.conf, gres.conf and topology.conf classified change by change,
and the QOS records in slurmdbd when the site manages QOS. Nothing is written or applied;
rebalance only reports, ``hetslurm site apply`` is how drift is removed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetslurm.levers.live import Target
    from hetslurm.site.model import Site


@dataclass(frozen=True)
class DriftReport:
    """Changes between the site and the live cluster; ``error`` when it could not be read."""

    conf_dir: str
    action: str | None = None
    changes: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"conf_dir": self.conf_dir, "action": self.action,
                "changes": list(self.changes), "error": self.error}


class _ReadOnly:
    """Daemons of a target that is only diffed: any call is a bug."""

    def reconfigure(self) -> None:
        raise AssertionError("drift is read only")

    def restart(self, nodes: Any) -> None:
        raise AssertionError("drift is read only")


def live_target(conf_dir: str | None, whole: bool,
                env: Mapping[str, str] | None = None) -> Target:
    """A read-only target on :func:`~hetslurm.slurm.conf.slurm_conf_dir` of ``conf_dir``."""
    from hetslurm.levers.live import Target
    from hetslurm.slurm.conf import slurm_conf_dir

    env = dict(os.environ if env is None else env)
    return Target(conf_dir=slurm_conf_dir(conf_dir, env), daemons=_ReadOnly(), whole=whole,
                  env=env)


def drift(site: Site, target: Target) -> DriftReport:
    """The site diff of ``site`` against ``target``; a failure to read becomes ``error``."""
    from hetslurm.errors import HetslurmError
    from hetslurm.levers.live import diff

    try:
        plan = diff(site, target)
    except (HetslurmError, OSError) as exc:
        return DriftReport(str(target.conf_dir), error=f"{type(exc).__name__}: {exc}")
    return DriftReport(str(target.conf_dir), plan.action,
                       tuple(c.to_dict() for c in plan.changes))
