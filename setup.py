"""Build script: the only place Cython compiler directives are set.

``HETSLURM_DEBUG_BUILD=1 pip install .`` turns bounds and wraparound checks on (used by the
test suite to catch out-of-range indexing in the kernels); the default build is the fast one.
"""

from __future__ import annotations

import os

from Cython.Build import cythonize
from setuptools import Extension, setup

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
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        # Generated C goes to a folder per mode: Cython's cache compares timestamps only, so
        # a release build right after a debug one would otherwise keep the debug C.
        build_dir="build/cython-debug" if DEBUG else "build/cython-release",
    ),
)
