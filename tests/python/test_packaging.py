"""What a new user installs: the wheel (`pip install .`: the library, the
Python API and the `kvpool` command with its servers) and `make install`
(the program, libkvpool.so / .a, the public headers and kvpool.pc), each
used the way the README says, against real `kvpool serve` processes.

Everything is built from a copy of the tracked tree or installed under
tmp_path; nothing is left in the clone but the Makefile's own build/."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

import kvpool_procs

ROOT = Path(__file__).resolve().parents[2]
VERSION = next(line.split('"')[1] for line in (ROOT / "include" / "kvpool.h").read_text().splitlines()
               if line.startswith("#define KVPOOL_VERSION_STRING"))


def copy_tree(dst: Path) -> Path:
    """A clean copy of the tracked (and not ignored) files: nothing prebuilt."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst / f)
    return dst


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 120)
    return subprocess.run(cmd, capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without what would make an installed program or
    interpreter use the tree instead (PYTHONPATH) or a sub-make join ours."""
    drop = {"PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "LD_PRELOAD"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


@pytest.fixture
def installed_command(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """kvpool_procs starts servers with whatever $KVPOOL_BIN is: the test
    sets it to an installed command; the tree's package stays out of reach."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("KVPOOL_BIN", raising=False)
    yield


# ------------------------------------------------------------------ the wheel

def test_wheel_ships_the_kvpool_command_and_its_servers(tmp_path: Path, installed_command: None,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    src = copy_tree(tmp_path / "src")
    wheels = tmp_path / "wheels"
    r = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q",
             "-w", str(wheels), str(src)], timeout=900, env=clean_env())
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = wheels.glob("kvpool-*.whl")
    names = run([sys.executable, "-m", "zipfile", "-l", str(wheel)]).stdout
    assert "kvpool/_bin/kvpool" in names, names
    # the KVPOOL_AS_MOONCAKE hook, at the top of site-packages once installed
    assert "kvpool_as_mooncake.pth" in names.split() and "_kvpool_hook.py" in names.split(), names

    venv = tmp_path / "venv"
    r = run([sys.executable, "-m", "venv", str(venv)], env=clean_env())
    assert r.returncode == 0, r.stderr
    r = run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
             str(wheel)], env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cmd = venv / "bin" / "kvpool"
    assert cmd.is_file(), "pip install gave no `kvpool` command"
    # any program of the venv: the variable alone makes `import mooncake.store` kvpool's
    probe = "import mooncake.store as m, sys; print(m.__name__, 'kvpool' in sys.modules)"
    r = run([str(venv / "bin" / "python"), "-c", probe],
            env=clean_env(KVPOOL_AS_MOONCAKE="1"), cwd=tmp_path)
    assert r.stdout.strip() == "kvpool.mooncake True", r.stdout + r.stderr
    r = run([str(venv / "bin" / "python"), "-c", "import sys; print('kvpool' in sys.modules)"],
            env=clean_env(), cwd=tmp_path)
    assert r.stdout.strip() == "False", r.stdout + r.stderr  # without it: nothing imported

    r = run([str(cmd), "version"], env=clean_env(), cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, f"kvpool {VERSION}\n"), r.stderr
    r = run([str(cmd), "no-such-command"], env=clean_env(), cwd=tmp_path)
    assert r.returncode == 2 and "unknown command" in r.stderr  # the program's own status

    monkeypatch.setenv("KVPOOL_BIN", str(cmd))
    srv = kvpool_procs.serve("64MiB")
    try:
        # the command became the program (execv): same process, packaged binary
        exe = os.readlink(f"/proc/{srv.proc.pid}/exe")
        assert exe.startswith(str(venv)) and exe.endswith("/kvpool/_bin/kvpool"), exe
        value = os.urandom(300_000)
        (tmp_path / "in").write_bytes(value)
        master = ["--master", srv.addr]
        r = run([str(cmd), "put", *master, "greeting", str(tmp_path / "in")], env=clean_env())
        assert r.returncode == 0, r.stderr
        r = run([str(cmd), "get", *master, "greeting", str(tmp_path / "out")], env=clean_env())
        assert r.returncode == 0 and (tmp_path / "out").read_bytes() == value, r.stderr
        r = run([str(cmd), "exist", *master, "greeting", "other"], env=clean_env())
        assert r.returncode == 1 and "other: no" in r.stdout, r.stdout + r.stderr

        # the Python API of the same install, in a fresh interpreter
        code = textwrap.dedent('''
            import sys, kvpool
            with kvpool.Client({"master": sys.argv[1], "mode": "standalone-store"}) as c:
                assert c.get("greeting") == open(sys.argv[2], "rb").read()
                c.put("from-python", b"py" * 1000)
            print(kvpool.__file__, kvpool.__version__)
        ''')
        r = run([str(venv / "bin" / "python"), "-c", code, srv.addr, str(tmp_path / "in")],
                env=clean_env(), cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        where, version = r.stdout.split()
        assert where.startswith(str(venv)) and version == VERSION, r.stdout
        r = subprocess.run([str(cmd), "get", *master, "from-python"], capture_output=True,
                           env=clean_env(), timeout=60)
        assert r.returncode == 0 and r.stdout == b"py" * 1000, r.stderr
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log_path  # SIGTERM reached the server itself: a clean stop

    # a benchmark that spawns its own master (/proc/self/exe) from the command
    r = run([str(cmd), "bench", "master", "--objects", "2000", "--objects-big", "0",
             "--ops", "200", "--json"], env=clean_env(), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["bench"] == "master"


# --------------------------------------------------------------- make install

PROGRAM = r'''
#include <kvpool.h>
#include <kvpool_connector.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argv: master address, key. Puts 1 MiB of a pattern, reads it back. */
int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    char cfg[256], err[256];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", argv[1]);
    kvp_conn_config conn;
    kvp_conn_config_default(&conn); /* the connector's header and symbols too */
    kvp_client *c;
    if (kvp_client_open(cfg, &c, err, sizeof err) != 0) {
        fprintf(stderr, "open: %s\n", err);
        return 1;
    }
    size_t n = 1 << 20;
    unsigned char *in = malloc(n), *out = malloc(n);
    for (size_t i = 0; i < n; i++)
        in[i] = (unsigned char)(i * 31 + 7);
    int rc = kvp_client_put(c, argv[2], in, n);
    int64_t got = kvp_client_get(c, argv[2], out, n);
    int same = got == (int64_t)n && memcmp(in, out, n) == 0;
    printf("kvpool %s put %d get %lld %s\n", kvp_version(), rc, (long long)got,
           same ? "same" : "different");
    kvp_client_close(c);
    free(in);
    free(out);
    return rc == 0 && same ? 0 : 1;
}
'''


def needed(path: Path) -> list[str]:
    """The DT_NEEDED libraries of an ELF file ([] for a static one)."""
    r = run(["readelf", "-d", str(path)])
    assert r.returncode == 0, r.stderr
    return [line.split("[")[1].rstrip("]") for line in r.stdout.splitlines() if "(NEEDED)" in line]


def test_make_install_gives_a_library_programs_link_with_pkg_config(
        tmp_path: Path, installed_command: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for tool in ("pkg-config", "readelf"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (scripts/install-deps)")
    dest = tmp_path / "dest"
    r = run(["make", "-C", str(ROOT), f"-j{os.cpu_count() or 1}", "install", f"DESTDIR={dest}",
             "PREFIX=/usr"], env=clean_env(), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    usr = dest / "usr"
    lib = usr / "lib"
    major = VERSION.split(".")[0]
    assert os.access(usr / "bin" / "kvpool", os.X_OK)
    assert (lib / f"libkvpool.so.{VERSION}").is_file() and (lib / "libkvpool.a").is_file()
    assert os.readlink(lib / f"libkvpool.so.{major}") == f"libkvpool.so.{VERSION}"
    assert os.readlink(lib / "libkvpool.so") == f"libkvpool.so.{major}"
    soname = run(["readelf", "-d", str(lib / f"libkvpool.so.{VERSION}")]).stdout
    assert f"[libkvpool.so.{major}]" in soname
    headers = sorted(h.name for h in (ROOT / "include").glob("*.h"))
    assert sorted(h.name for h in (usr / "include").iterdir()) == headers
    assert (lib / "pkgconfig" / "kvpool.pc").is_file()
    assert (usr / "share" / "bash-completion" / "completions" / "kvpool").read_text() == \
        (ROOT / "deploy" / "completion" / "kvpool.bash").read_text()
    for unit in ("kvpool-master.service", "kvpool-store.service"):
        text = (lib / "systemd" / "system" / unit).read_text()
        assert "ExecStart=/usr/bin/kvpool " in text and "/usr/local/" not in text, unit

    pc_env = clean_env(PKG_CONFIG_PATH=str(lib / "pkgconfig"), PKG_CONFIG_SYSROOT_DIR=str(dest),
                       PKG_CONFIG_ALLOW_SYSTEM_CFLAGS="1", PKG_CONFIG_ALLOW_SYSTEM_LIBS="1")

    def pkg_config(*args: str) -> list[str]:
        r = run(["pkg-config", *args, "kvpool"], env=pc_env)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert pkg_config("--modversion") == [VERSION]
    (tmp_path / "prog.c").write_text(PROGRAM)
    cc = os.environ.get("CC", "cc").split()
    compile_ = [*cc, "-std=c11", "-Wall", "-Wextra", "-Werror", str(tmp_path / "prog.c")]
    private = [f for f in pkg_config("--static", "--libs-only-l") if f != "-lkvpool"]
    builds = {
        # the shared library: what the README's first line gives
        "shared": compile_ + ["-o", str(tmp_path / "shared")] + pkg_config("--cflags", "--libs"),
        # everything static: pkg-config --static adds the libraries libkvpool.a needs
        "static": compile_ + ["-static", "-o", str(tmp_path / "static")]
        + pkg_config("--static", "--cflags", "--libs"),
        # libkvpool.a alone, the rest shared
        "archive": compile_ + ["-o", str(tmp_path / "archive")] + pkg_config("--cflags")
        + pkg_config("--libs-only-L") + ["-Wl,-Bstatic", "-lkvpool", "-Wl,-Bdynamic"] + private,
    }
    for name, argv in builds.items():
        r = run(argv, env=clean_env(), timeout=300)
        assert r.returncode == 0, f"{name}: {' '.join(argv)}\n{r.stderr}"
    assert f"libkvpool.so.{major}" in needed(tmp_path / "shared")
    assert needed(tmp_path / "static") == []
    assert not any(n.startswith("libkvpool") for n in needed(tmp_path / "archive"))

    monkeypatch.setenv("KVPOOL_BIN", str(usr / "bin" / "kvpool"))
    srv = kvpool_procs.serve("64MiB")
    try:
        for name in builds:
            env = clean_env(LD_LIBRARY_PATH=str(lib)) if name == "shared" else clean_env()
            r = run([str(tmp_path / name), srv.addr, f"key-{name}"], env=env)
            assert r.returncode == 0, f"{name}: {r.stdout}{r.stderr}"
            assert r.stdout == f"kvpool {VERSION} put 0 get 1048576 same\n"
        r = run([str(usr / "bin" / "kvpool"), "exist", "--master", srv.addr, *(f"key-{n}" for n in builds)])
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        assert srv.stop() == 0

    r = run(["make", "-C", str(ROOT), "uninstall", f"DESTDIR={dest}", "PREFIX=/usr"],
            env=clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    left = [p for p in dest.rglob("*") if not p.is_dir()]
    assert left == [], left
