"""Levers: Slurm's own settings derived from the site, rolled out to a live cluster.

The settings themselves are computed and rendered by the site (``hetslurm.site.levers``,
pure); this package talks to the live cluster: :mod:`.rollout` classifies a change
(reconfigure or restart), :mod:`.qos` syncs QOS through sacctmgr, :mod:`.live` runs
diff / apply / rollback with backups, health checks and automatic rollback.
"""

from __future__ import annotations

from hetslurm.levers.live import (
    ApplyResult,
    Daemons,
    SystemdDaemons,
    Target,
    apply,
    backups,
    check_health,
    diff,
    rollback,
)
from hetslurm.levers.rollout import Change, Plan, classify

__all__ = [
    "ApplyResult",
    "Change",
    "Daemons",
    "Plan",
    "SystemdDaemons",
    "Target",
    "apply",
    "backups",
    "check_health",
    "classify",
    "diff",
    "rollback",
]
