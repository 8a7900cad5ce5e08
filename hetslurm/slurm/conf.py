"""Which folder holds the Slurm configuration a command reads or writes: one rule.

``--conf-dir`` (or a site's own setting, passed as ``given``), else the folder of
``$SLURM_CONF`` (the file Slurm's own commands read), else ``/etc/slurm`` (where Debian's
Slurm packages read it when ``SLURM_CONF`` is unset). The hetslurm testbed is not a special
case: ``eval "$(hetslurm testbed env)"`` sets ``SLURM_CONF`` to its ``etc/slurm.conf``, and
the commands that restart daemons take ``--testbed DIR`` instead
(:func:`hetslurm.testbed.target.choose_target`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CONF_ENV = "SLURM_CONF"
#: Where Slurm looks when ``SLURM_CONF`` is unset (Debian's packages).
DEFAULT_CONF_DIR = Path("/etc/slurm")


def slurm_conf_dir(given: str | Path | None = None,
                   env: Mapping[str, str] | None = None) -> Path:
    """``given``, else the folder of ``$SLURM_CONF``, else ``/etc/slurm``."""
    if given:
        return Path(given)
    env = os.environ if env is None else env
    conf = env.get(CONF_ENV)
    return Path(conf).parent if conf else DEFAULT_CONF_DIR


def slurm_conf_value(conf: Path, key: str) -> str | None:
    """The value of a global ``Key=value`` line of the slurm.conf ``conf`` (keys match
    regardless of case, as Slurm reads them; the last line wins), None when the key is absent
    or the file cannot be read."""
    try:
        text = conf.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    found = None
    want = key.lower()
    for line in text.splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name.strip().lower() == want:
            found = value.split("#", 1)[0].strip()
    return found
