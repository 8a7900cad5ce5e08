"""Build script: the only place Cython compiler directives are set.

``HETSLURM_DEBUG_BUILD=1 pip install .`` turns bounds and wraparound checks on (used by the
test suite to catch out-of-range indexing in the kernels); the default build is the fast one.
"""

from __future__ import annotations

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPyNoStale(build_py):
    """build_py that drops modules left in ``build/lib`` by an earlier build of a tree where
    they still existed: pip builds a checkout in place, and setuptools only ever adds to
    ``build/lib``, so a moved or deleted module would otherwise ship in the next wheel."""

    def run(self) -> None:
        super().run()
        wanted = {os.path.abspath(f) for f in self.get_outputs(include_bytecode=False)}
        for package in self.packages or ():
            folder = Path(self.build_lib, *package.split("."))
            for stale in folder.glob("*.py"):
                if os.path.abspath(stale) not in wanted:
                    stale.unlink()

DEBUG = os.environ.get("HETSLURM_DEBUG_BUILD", "") not in ("", "0")

DIRECTIVES = {
    "language_level": "3",
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "nonecheck": DEBUG,
    "embedsignature": True,
}

extensions = [
    Extension(
        "hetslurm._core",
        sources=["hetslurm/_core.pyx"],
        extra_compile_args=["-O0", "-g"] if DEBUG else ["-O3"],
    )
]

setup(
    cmdclass={"build_py": BuildPyNoStale},
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        # Generated C goes to a folder per mode: Cython's cache compares timestamps only, so
        # a release build right after a debug one would otherwise keep the debug C.
        build_dir="build/cython-debug" if DEBUG else "build/cython-release",
    ),
)
