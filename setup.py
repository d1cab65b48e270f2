"""Builds what `pip install .` installs besides the Python files:

- kvpool._native: the CPython extension (python/kvpool/_native.c) with the
  whole C core (src/) compiled in;
- kvpool/_bin/kvpool: the `kvpool` program (src/cli, src/bench, src/sim and
  the core), compiled with the Makefile's release flags. The `kvpool` console
  command (kvpool._cli) execs it, as Mooncake's wheel ships mooncake_master;
- kvpool_as_mooncake.pth at the top of site-packages: its line imports
  _kvpool_hook at every interpreter start, which acts only with
  KVPOOL_AS_MOONCAKE=1 (python/_kvpool_hook.py).

Both need nothing at run time but the Debian libraries the C build links
(libjansson, libxxhash, libcrypto, liburing, libmicrohttpd, libzmq, libmsgpackc). Metadata:
pyproject.toml."""
from __future__ import annotations

import glob
import os
import shlex
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = ["common", "proto", "net", "master", "node", "client", "connector", "ha"]
LIBS = ["jansson", "xxhash", "crypto", "uring", "microhttpd", "zmq", "msgpackc", "pthread", "m"]  # the Makefile's LDLIBS

# The program: the Makefile's R_CFLAGS (release) and LDLIBS, without the
# test-support include directory it does not use.
PTH = "kvpool_as_mooncake.pth"  # python/PTH, installed at the top of site-packages
PROGRAM = "kvpool"
PROGRAM_DIRS = ["cli", "bench", "sim"] + CORE
PROGRAM_CFLAGS = ["-D_GNU_SOURCE", "-std=gnu11", "-Wall", "-Wextra", "-Werror",
                  "-Wstrict-prototypes", "-Wshadow", "-Wno-unused-parameter",
                  "-Iinclude", "-Isrc", "-g", "-fPIC", "-pthread", "-O2", "-fvisibility=hidden"]


def rel(pattern: str) -> list[str]:
    return sorted(os.path.relpath(p, HERE) for p in glob.glob(os.path.join(HERE, pattern)))


def stale(target: str, deps: list[str]) -> bool:
    """True when target is missing, or one of deps is missing or newer."""
    try:
        t = os.stat(target).st_mtime_ns
        return any(os.stat(d).st_mtime_ns > t for d in deps)
    except FileNotFoundError:
        return True


def dep_file(path: str) -> list[str]:
    """The prerequisites of the first rule of a gcc -MMD file, compiled in
    HERE ([] when absent)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().replace("\\\n", " ")
    except FileNotFoundError:
        return []
    rule = text.split("\n", 1)[0]
    return [os.path.join(HERE, d) for d in shlex.split(rule.split(":", 1)[1])] if ":" in rule else []


class BuildExt(build_ext):
    """The extension, and the program into the package beside it
    (`_bin/kvpool` next to `_native*.so`: build/lib for a wheel, python/kvpool
    for --inplace). The program's and the extension's files compile on one
    pool of `parallel` threads (default: every core; setuptools alone compiles
    an extension's files one by one). The program's objects live under
    build_temp and are recompiled only when their source or a header they
    include changed (the -MMD files), so `make python` repeats cheaply."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def program_path(self) -> str:
        pkg_dir = os.path.dirname(self.get_ext_fullpath("kvpool._native"))
        return os.path.abspath(os.path.join(pkg_dir, "_bin", PROGRAM))

    def get_outputs(self) -> list[str]:
        return super().get_outputs() + [self.program_path()]

    def run(self) -> None:
        # the compiler customize_compiler would pick for the extension
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
        with ThreadPoolExecutor(max_workers=self.parallel) as pool:
            self.pool = pool
            objs, jobs = self.compile_program(cc, pool)
            super().run()
            failed = [src for src, job in jobs if job.result() != 0]
        if failed:
            raise SystemExit(f"error: compiling {failed[0]} for the {PROGRAM} program failed")
        out = self.program_path()
        if self.force or jobs or stale(out, objs):
            os.makedirs(os.path.dirname(out), exist_ok=True)
            self.announce(f"linking {out}", 2)
            self.spawn(cc + PROGRAM_CFLAGS + ["-o", out] + objs + [f"-l{lib}" for lib in LIBS])

    def build_extension(self, ext: Extension) -> None:
        """setuptools' build_extension with the compiler's compile() running
        each file's _compile() on the pool (the distutils recipe numpy used)."""
        compiler = self.compiler

        def compile_on_pool(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                            extra_preargs=None, extra_postargs=None, depends=None):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

            def one(obj: str) -> None:
                src, ext_ = build[obj]
                compiler._compile(obj, src, ext_, cc_args, extra_postargs, pp_opts)

            for job in [self.pool.submit(one, obj) for obj in objects if obj in build]:
                job.result()  # raises the first CompileError
            return objects

        compiler.compile = compile_on_pool
        try:
            super().build_extension(ext)
        finally:
            del compiler.compile

    def compile_program(self, cc: list[str], pool: ThreadPoolExecutor) -> tuple[list[str], list]:
        """Submits the compilation of every stale object of the program; its
        objects and the (source, future exit status) of the jobs."""
        objdir = os.path.abspath(os.path.join(self.build_temp, "kvpool-program"))
        objs, jobs = [], []
        for src in [f for d in PROGRAM_DIRS for f in rel(f"src/{d}/*.c")]:
            obj = os.path.join(objdir, src[:-2] + ".o")
            dep = obj[:-2] + ".d"
            objs.append(obj)
            if self.force or stale(obj, [os.path.join(HERE, src)] + dep_file(dep)):
                os.makedirs(os.path.dirname(obj), exist_ok=True)
                cmd = cc + PROGRAM_CFLAGS + ["-MMD", "-MF", dep, "-c", src, "-o", obj]
                jobs.append((src, pool.submit(subprocess.call, cmd, cwd=HERE)))
        if jobs:
            self.announce(f"compiling {len(jobs)} files of the {PROGRAM} program", 2)
        return objs, jobs


sources = ["python/kvpool/_native.c", "python/kvpool/_conn.c", "python/kvpool/_xq.c"] + [f for d in CORE for f in rel(f"src/{d}/*.c")]

native = Extension(
    "kvpool._native",
    sources=sources,
    include_dirs=["include", "src"],
    define_macros=[("_GNU_SOURCE", "1"), ("KVP_API", "")],  # nothing exported but PyInit
    libraries=LIBS,
    extra_compile_args=[
        "-std=gnu11", "-O2", "-fvisibility=hidden", "-pthread",
        "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
        "-Wno-missing-field-initializers", "-Wno-cast-function-type",
    ],
    extra_link_args=["-pthread"],
    depends=rel("include/*.h") + ["python/kvpool/_native.h"] + [f for d in CORE for f in rel(f"src/{d}/*.h")],
)

class BuildPy(build_py):
    """The Python files, and python/kvpool_as_mooncake.pth at the top of the
    build (the top of site-packages once installed, where `site` reads .pth
    files; an editable install leaves it out)."""

    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, "python", PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(
    ext_modules=[native],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    # the Makefile owns build/; setuptools keeps to a folder of its own there
    options={"build": {"build_base": "build/setuptools"}},
)
