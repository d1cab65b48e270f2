"""Builds kvpool._native: the CPython extension (python/kvpool/_native.c) with
the whole C core (src/) compiled in, so the wheel needs nothing but the Debian
libraries the C build links (libjansson, libxxhash, liburing). Metadata: pyproject.toml."""
from __future__ import annotations

import glob
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = ["common", "proto", "net", "master", "node", "client", "connector"]


def rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


class ParallelBuildExt(build_ext):
    """Compiles the ~40 C files on every core (setuptools compiles serially)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1


sources = ["python/kvpool/_native.c", "python/kvpool/_conn.c"] + [f for d in CORE for f in rel(f"src/{d}/*.c")]

native = Extension(
    "kvpool._native",
    sources=sources,
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", "1"), ("KVP_API", "")],  # nothing exported but PyInit
    libraries=["jansson", "xxhash", "uring", "pthread", "m"],
    extra_compile_args=[
        "-std=gnu11", "-O2", "-fvisibility=hidden", "-pthread",
        "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
        "-Wno-missing-field-initializers", "-Wno-cast-function-type",
    ],
    extra_link_args=["-pthread"],
    depends=rel("include/*.h") + ["python/kvpool/_native.h"] + [f for d in CORE for f in rel(f"src/{d}/*.h")],
)

setup(
    ext_modules=[native],
    cmdclass={"build_ext": ParallelBuildExt},
    # the Makefile owns build/; setuptools keeps to a folder of its own there
    options={"build": {"build_base": "build/setuptools"}},
)
