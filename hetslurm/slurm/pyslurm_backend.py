"""Optional pyslurm backend: used only when pyslurm imports and matches the running Slurm.

pyslurm is built against one Slurm release's headers (PyPI serves only 25.11.x), so a
pyslurm that imports may still not speak to the local Slurm. The import happens once, in
:func:`load_pyslurm`; its failure is kept with its error and raised only when this
backend is explicitly chosen.

UNTESTED: the project's testbed runs Slurm 22.05.8, for which no pyslurm can be built
from PyPI. This backend therefore checks the binding and the version and then serves
every call through the CLI backend; reading through pyslurm's objects is left until a
matching Slurm is available to test against.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType

from hetslurm.errors import BackendError
from hetslurm.slurm.cli_backend import DEFAULT_TIMEOUT_S, CliBackend

_loaded: ModuleType | None = None
_load_error: BaseException | None = None
_tried = False


def load_pyslurm() -> ModuleType | None:
    """Import pyslurm once; remember the error instead of raising it."""
    global _loaded, _load_error, _tried
    if not _tried:
        _tried = True
        try:
            _loaded = importlib.import_module("pyslurm")
        except Exception as exc:
            _load_error = exc
    return _loaded


def pyslurm_slurm_version(mod: ModuleType) -> tuple[int, int] | None:
    """The Slurm major.minor pyslurm was built for (pyslurm's own version follows it)."""
    for attr in ("slurm_version", "version", "__version__"):
        value = getattr(mod, attr, None)
        text = value() if callable(value) else value
        if isinstance(text, str):
            parts = text.split(".")
            if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                return int(parts[0]), int(parts[1])
    return None


def usable(slurm_version: tuple[int, int, int]) -> tuple[bool, str]:
    """Whether pyslurm imports and was built for ``slurm_version``'s release; and why not."""
    mod = load_pyslurm()
    if mod is None:
        return False, f"pyslurm does not import: {_load_error!r}"
    built = pyslurm_slurm_version(mod)
    if built is None:
        return False, "pyslurm does not say which Slurm it was built for"
    if built != slurm_version[:2]:
        return False, (
            f"pyslurm was built for Slurm {built[0]}.{built[1]:02d}, the cluster runs "
            f"{slurm_version[0]}.{slurm_version[1]:02d}.{slurm_version[2]}"
        )
    return True, "ok"


class PyslurmBackend(CliBackend):
    """The pyslurm-gated backend (see the module note: untested, serves via the CLIs)."""

    name = "pyslurm"

    def __init__(
        self, env: Mapping[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT_S
    ) -> None:
        super().__init__(env, timeout=timeout)
        ok, why = usable(self.version())
        if not ok:
            raise BackendError(
                f"the pyslurm backend cannot be used: {why}. Install a pyslurm built for "
                "this Slurm (`pip install hetslurm[pyslurm]` needs matching Slurm headers) "
                "or choose --backend cli."
            ) from _load_error
