"""hetslurm as a user installs it: no extras, any working folder (docs/cli.md, "Installing").

The shipped examples come from the package, never from the working folder; the lab's child
processes import the installed package even when started from a checkout's root; lupa is a
runtime dependency; the testbed refuses to boot without its hook.
"""

from __future__ import annotations

import fnmatch
import importlib.resources
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hetslurm.errors import PlacementError, TestbedError
from hetslurm.site import load_site
from hetslurm.site.examples import EXAMPLES_PACKAGE, example

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_lupa_is_a_runtime_dependency_and_no_extra_is_needed_for_the_product() -> None:
    deps = PYPROJECT["project"]["dependencies"]
    assert any(d.startswith("lupa") for d in deps)
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert not any(d.startswith("lupa") for d in extras["dev"])
    # Extras are for optional parts only: pyslurm, and the developer's tools.
    assert set(extras) == {"pyslurm", "dev"}


def test_every_example_is_shipped_and_installed() -> None:
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"][EXAMPLES_PACKAGE]
    assert PYPROJECT["tool"]["setuptools"]["package-dir"][EXAMPLES_PACKAGE] == "site-configs"
    # __init__.py makes the folder a regular package; it ships as a module.
    files = sorted(p.name for p in (ROOT / "site-configs").iterdir()
                   if p.is_file() and p.name != "__init__.py")
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)]
    assert unshipped == []
    installed = importlib.resources.files(EXAMPLES_PACKAGE)
    for name in files:
        assert installed.joinpath(name).read_bytes() == (ROOT / "site-configs" / name).read_bytes()


def test_defaults_do_not_depend_on_the_working_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hetslurm.cli.simulate_cmd import _default_workload
    from hetslurm.testbed import default_site

    monkeypatch.delenv("HETSLURM_SITE", raising=False)
    monkeypatch.chdir(tmp_path)
    for path in (default_site(), example("case-study.toml"), example("simulate-params.toml"),
                 Path(_default_workload())):
        assert path.is_absolute() and path.is_file(), path
        assert not path.is_relative_to(tmp_path)
    assert default_site().read_bytes() == (ROOT / "site-configs" / "demo.toml").read_bytes()


def test_a_missing_example_is_named() -> None:
    from hetslurm.errors import ConfigError

    with pytest.raises(ConfigError, match=r"site-configs/nope\.toml is missing"):
        example("nope.toml")


def test_the_lab_child_imports_the_installed_package_from_a_checkout_root(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench placement` from the checkout's root: its children must not import the source
    tree beside them, which has no compiled core."""
    from hetslurm.lab.bench_placement import bench_placement

    monkeypatch.chdir(ROOT)
    res = bench_placement((1000,), alibaba=False, calls=100, reference_calls=1, batch_jobs=1)
    assert [r["name"] for r in res["results"]] == ["synthetic-1000"]
    assert res["results"][0]["p50_us"] > 0
    if not list((ROOT / "hetslurm").glob("_core*.so")):
        # The control: a plain `python -m` from the same folder takes the uncompiled tree.
        plain = subprocess.run([sys.executable, "-m", "hetslurm.lab.bench_placement",
                                "synthetic-1000", "100", "1", "1"], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
        assert plain.returncode != 0 and "CoreNotBuiltError" in plain.stderr


def test_the_testbed_refuses_to_boot_without_its_hook(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from hetslurm.hook import install
    from hetslurm.testbed import Testbed

    def no_lupa(*_a: object, **_k: object) -> object:
        raise PlacementError("the request grammar needs the Python package lupa")

    site = load_site(ROOT / "site-configs" / "demo.toml")
    tb = Testbed(tmp_path / "tb")
    tb.check_hook(site)  # the real hook renders and passes its checks
    monkeypatch.setattr(install, "validate_text", no_lupa)
    monkeypatch.setattr(install, "install_hook", no_lupa)
    with pytest.raises(TestbedError, match="does not boot without it"):
        tb.check_hook(site)
    with pytest.raises(TestbedError, match="does not boot without it"):
        tb.install_hook(site)
    assert not (tmp_path / "tb" / "etc" / "job_submit.lua").exists()
