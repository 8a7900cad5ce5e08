"""The example files that ship with hetslurm (``site-configs/``), found wherever it runs.

A source checkout uses its own ``site-configs/``, so an edited example is the one used; an
installed copy reads the package data of ``hetslurm_site_configs`` (pyproject.toml installs
the folder under that name). Never the working folder: a command means the same file from
``/tmp`` as from the checkout's root.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from hetslurm.errors import ConfigError

EXAMPLES_PACKAGE = "hetslurm_site_configs"
FOLDER = "site-configs"


def example(name: str) -> Path:
    """The path of the shipped example ``name`` (e.g. ``demo.toml``).

    Raises:
        ConfigError: neither the checkout nor the installed package has it.
    """
    root = Path(__file__).resolve().parents[2]
    # pyproject.toml marks a checkout, so a stray site-packages/site-configs is never taken.
    sibling = root / FOLDER / name
    if (root / "pyproject.toml").is_file() and sibling.is_file():
        return sibling
    try:
        shipped = Path(str(importlib.resources.files(EXAMPLES_PACKAGE).joinpath(name)))
    except ModuleNotFoundError:
        shipped = None
    if shipped is None or not shipped.is_file():
        raise ConfigError(f"{FOLDER}/{name} is missing: neither {sibling} nor the installed "
                          f"package {EXAMPLES_PACKAGE} has it; reinstall hetslurm")
    return shipped
