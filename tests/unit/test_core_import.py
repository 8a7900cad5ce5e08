"""The package imports without the compiled core, and says how to build it when asked for it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hetslurm
from hetslurm.errors import CoreNotBuiltError
from hetslurm.placement import _load


def test_missing_core_raises_one_actionable_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `import hetslurm._core` fail even when it was imported before.
    monkeypatch.setitem(sys.modules, "hetslurm._core", None)
    monkeypatch.delattr(hetslurm, "_core", raising=False)
    from hetslurm.placement import choose_gpus

    with pytest.raises(CoreNotBuiltError) as info:
        choose_gpus([1, 1], [0, 0], [0, 0], 1)
    message = str(info.value)
    assert "\n" not in message
    assert "pip install ." in message
    assert "python setup.py build_ext --inplace" in message
    assert isinstance(info.value.__cause__, ImportError)
    assert info.value.exit_code == 3


def test_load_core_returns_the_extension_when_built() -> None:
    core = pytest.importorskip("hetslurm._core", reason="compiled core not built")
    assert _load.load_core() is core


def test_fresh_interpreter_imports_without_core() -> None:
    # A meta-path finder that refuses hetslurm._core is what a never-built checkout looks like
    # to the import system; nothing else from the session leaks into a new interpreter.
    script = textwrap.dedent(
        """
        import sys

        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "hetslurm._core":
                    raise ModuleNotFoundError("No module named 'hetslurm._core'", name=name)
                return None

        sys.meta_path.insert(0, Refuse())
        import hetslurm
        import hetslurm.placement
        import hetslurm.placement.gpus
        import hetslurm.placement.reference
        assert "hetslurm._core" not in sys.modules
        from hetslurm.placement.reference import choose_gpus_reference
        assert choose_gpus_reference([1, 1], [0, 0], [0, 0], 2) == ((0, 1), (1 << 40) | 1)
        try:
            hetslurm.placement.choose_gpus([1], [0], [0], 1)
        except hetslurm.CoreNotBuiltError as e:
            print(e)
        else:
            raise SystemExit("expected CoreNotBuiltError")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(hetslurm.__file__).resolve().parents[1],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == _load.BUILD_HINT
