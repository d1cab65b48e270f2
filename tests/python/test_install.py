"""install_as_mooncake(), the vLLM plugin entry point, and `pip install .`.

Programs run in fresh interpreters (subprocesses), as users run them."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvpool_procs

ROOT = Path(__file__).resolve().parents[2]
PYDIR = ROOT / "python"

# A Mooncake user's program, unmodified (mooncake.md §8.2's recipe plus the
# zero-copy calls vLLM makes). It reads the master address from argv.
MOONCAKE_PROGRAM = textwrap.dedent('''
    import sys
    import numpy as np
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig

    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 64 << 20, 16 << 20, "tcp", "", sys.argv[1])
    assert rc == 0, rc
    assert s.put("k", b"v" * 4096) == 0
    assert s.get("k") == b"v" * 4096 and s.is_exist("k") == 1
    buf = np.arange(1 << 20, dtype=np.uint8)
    base = buf.ctypes.data
    assert s.register_buffer(base, buf.nbytes) == 0
    cfg = ReplicateConfig()
    cfg.replica_num = 1
    keys = ["blk/0", "blk/1"]
    ptrs = [[base, base + 4096], [base + 8192, base + 12288]]
    sizes = [[4096, 4096], [4096, 4096]]
    assert s.batch_is_exist(keys) == [0, 0]
    assert s.batch_put_from_multi_buffers(keys, ptrs, sizes, cfg) == [0, 0]
    out = [[base + (512 << 10), base + (512 << 10) + 4096], [base + (600 << 10), base + (600 << 10) + 4096]]
    assert s.batch_get_into_multi_buffers(keys, out, sizes) == [8192, 8192]
    assert bytes(buf[512 << 10:(512 << 10) + 8192]) == bytes(buf[0:8192])
    assert s.unregister_buffer(base) == 0
    print("MOONCAKE-PROGRAM-OK", type(s).__module__)
    s.close()
''')


def run_py(code: str, *args: str, env: dict[str, str] | None = None,
           path: Path = PYDIR) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(path)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=120, env=e)


def test_unmodified_mooncake_program_runs_on_kvpool(tmp_path: Path,
                                                    master: kvpool_procs.Proc) -> None:
    prog = tmp_path / "mooncake_user.py"
    prog.write_text(MOONCAKE_PROGRAM)
    launcher = ("import sys, runpy, kvpool\n"
                "kvpool.install_as_mooncake()\n"
                "sys.argv = sys.argv[1:]\n"
                "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = run_py(launcher, str(prog), master.addr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MOONCAKE-PROGRAM-OK kvpool.mooncake" in r.stdout


def test_plugin_installs_only_when_asked(master: kvpool_procs.Proc, tmp_path: Path) -> None:
    check = ("import sys, kvpool._plugin as p\n"
             "p.register()\n"
             "print('mooncake.store' in sys.modules)\n")
    assert run_py(check).stdout.strip() == "False"
    assert run_py(check, env={"KVPOOL_AS_MOONCAKE": "1"}).stdout.strip() == "True"
    prog = tmp_path / "mooncake_user.py"
    prog.write_text(MOONCAKE_PROGRAM)
    launcher = ("import sys, runpy, kvpool._plugin as p\n"
                "p.register()\n"
                "sys.argv = sys.argv[1:]\n"
                "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    r = run_py(launcher, str(prog), master.addr, env={"KVPOOL_AS_MOONCAKE": "1"})
    assert r.returncode == 0, r.stdout + r.stderr


def fresh_venv(tmp_path: Path, with_hook: bool) -> Path:
    """A new venv whose site-packages holds what `pip install` puts there
    for kvpool (as path entries to this tree and to the test venv's
    packages, then kvpool_as_mooncake.pth when with_hook): its python
    starts as a user's does, `site` reading the .pth files at startup."""
    v = tmp_path / ("venv-hook" if with_hook else "venv-plain")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(v)], check=True,
                   timeout=120)
    (site,) = (v / "lib").glob("python3*/site-packages")
    deps = [p for p in sys.path if p.endswith("site-packages")]
    # "kvpool-src" sorts before "kvpool_as_mooncake": paths first, as in a real install
    (site / "kvpool-src.pth").write_text("\n".join([str(PYDIR), *deps]) + "\n")
    if with_hook:
        (site / "kvpool_as_mooncake.pth").write_bytes((PYDIR / "kvpool_as_mooncake.pth").read_bytes())
    return v / "bin" / "python"


def test_the_pth_hook_serves_any_process_that_sets_the_variable(
        master: kvpool_procs.Proc, tmp_path: Path) -> None:
    """KVPOOL_AS_MOONCAKE=1 and nothing else: an unmodified Mooncake program,
    started as `python prog.py`, runs on kvpool (SGLang has no plugin hook
    of its own). Without the variable the hook imports nothing."""
    prog = tmp_path / "mooncake_user.py"
    prog.write_text(MOONCAKE_PROGRAM)
    py = fresh_venv(tmp_path, with_hook=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KVPOOL_AS_MOONCAKE")}
    r = subprocess.run([str(py), str(prog), master.addr], capture_output=True, text=True,
                       timeout=120, env={**env, "KVPOOL_AS_MOONCAKE": "1"}, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MOONCAKE-PROGRAM-OK kvpool.mooncake" in r.stdout
    idle = ("import sys\n"
            "print('_kvpool_hook' in sys.modules, 'kvpool' in sys.modules,\n"
            "      any(type(f).__module__ == '_kvpool_hook' for f in sys.meta_path))\n")
    r = subprocess.run([str(py), "-c", idle], capture_output=True, text=True, timeout=60,
                       env=env, cwd=tmp_path)
    assert r.stdout.split() == ["True", "False", "False"], r.stdout + r.stderr
    # the same program in the same venv without the hook's file: the variable alone does nothing
    plain = fresh_venv(tmp_path, with_hook=False)
    r = subprocess.run([str(plain), "-c", "import sys; print('_kvpool_hook' in sys.modules)"],
                       capture_output=True, text=True, timeout=60,
                       env={**env, "KVPOOL_AS_MOONCAKE": "1"}, cwd=tmp_path)
    assert r.stdout.strip() == "False", r.stdout + r.stderr


def test_the_pth_hook_fails_loudly_when_kvpool_cannot_load(tmp_path: Path) -> None:
    """The variable asks for kvpool: a kvpool that cannot be imported is an
    ImportError that names the variable, not a silent real Mooncake."""
    py = fresh_venv(tmp_path, with_hook=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = ("import sys\n"
            "sys.modules['kvpool'] = None  # an import of it raises\n"
            "try:\n    import mooncake.store\n"
            "except ImportError as e:\n    print('REFUSED', e)\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60,
                       env={**env, "KVPOOL_AS_MOONCAKE": "1"}, cwd=tmp_path)
    assert r.stdout.startswith("REFUSED KVPOOL_AS_MOONCAKE is set"), r.stdout + r.stderr


def test_install_is_idempotent_and_refuses_the_real_mooncake() -> None:
    r = run_py("import kvpool\nkvpool.install_as_mooncake()\nkvpool.install_as_mooncake()\n"
               "import mooncake.store as m\nprint(m.__name__)")
    assert r.returncode == 0 and r.stdout.strip() == "kvpool.mooncake", r.stderr
    real = subprocess.run([sys.executable, "-c", "import mooncake.store"], capture_output=True)
    if real.returncode != 0:
        pytest.skip("the real Mooncake wheel is not importable here")
    r = run_py("import mooncake.store, kvpool\n"
               "try:\n    kvpool.install_as_mooncake()\n"
               "except RuntimeError as e:\n    print('REFUSED', e)\n")
    assert r.stdout.startswith("REFUSED"), r.stdout + r.stderr
    assert "already imported" in r.stdout


def test_pip_install_builds_the_extension_and_the_entry_point(tmp_path: Path) -> None:
    """`pip install .` from the repository root: the C extension with the core
    compiled in, the package files, and the vllm.general_plugins entry point."""
    src = tmp_path / "src"  # a clean copy of the tracked tree: nothing prebuilt
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((ROOT / f).read_bytes())
    target = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir",
                        "-q", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((target / "kvpool").glob("_native*.so"))
    code = ("import importlib.metadata as md, kvpool, kvpool.mooncake\n"
            "eps = md.entry_points(group='vllm.general_plugins')\n"
            "print(kvpool.__file__)\n"
            "print(sorted(f'{e.name}={e.value}' for e in eps))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(target)}, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(str(target))
    assert "kvpool_as_mooncake=kvpool._plugin:register" in lines[1]
    # the .pth hook: at the top of site-packages, read as Python's site reads it
    assert (target / "kvpool_as_mooncake.pth").read_text() == "import _kvpool_hook\n"
    assert (target / "_kvpool_hook.py").is_file()
    probe = ("import site, sys\n"
             f"site.addsitedir({str(target)!r})\n"
             "import mooncake.store as m\n"
             "print(m.__name__)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       cwd=tmp_path, env={**os.environ, "KVPOOL_AS_MOONCAKE": "1"}, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "kvpool.mooncake", r.stdout + r.stderr
