"""The README's examples, run as written (tests/python/docblocks.py extracts the
marked blocks verbatim), so the README cannot go stale.

They talk to 127.0.0.1:50051, kvpool's default address, as a newcomer's
commands do: so each test runs them inside a network namespace of its own
(`ip netns`), where that port is free and nothing leaves the namespace. The
server is the README's own `kvpool serve` block; the C program is compiled
with the README's own command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import docblocks
import netns

ROOT = Path(__file__).resolve().parents[2]
README = docblocks.blocks("README.md")
CONFIG_MD = docblocks.blocks("docs/CONFIG.md")


pytestmark = pytest.mark.skipif(bool(netns.unavailable()), reason=netns.unavailable() or "ok")


def _env() -> dict[str, str]:
    """The user's environment: the tree's Python package; no make jobserver of
    the outer `make test` (the README's `make` runs on its own)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "KVPOOL_MASTER", "KVPOOL_CONFIG",
                        "MOONCAKE_CONFIG_PATH")}
    env["PYTHONPATH"] = str(ROOT / "python")
    return env


class Netns:
    """A network namespace with only `lo`, up; every process in it is killed
    and the namespace deleted at close()."""

    def __init__(self) -> None:
        self.name = f"kvp-readme-{os.getpid()}-{time.monotonic_ns() % 100000}"
        netns.add(self.name)

    def argv(self, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, cmd: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*cmd), cwd=cwd, env=_env(), text=True,
                              capture_output=True, timeout=timeout)

    def close(self) -> None:
        netns.delete(self.name)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A user's working directory beside the tree: build/ and include/ of it."""
    for d in ("build", "include"):
        (tmp_path / d).symlink_to(ROOT / d)
    return tmp_path


@pytest.fixture(scope="module")
def pool() -> Iterator[Netns]:
    """The README's `kvpool serve` block, run as written inside a namespace."""
    ns = Netns()
    log = open(ROOT / "build" / f"readme-serve-{os.getpid()}.log", "w+")
    try:
        srv = subprocess.Popen(ns.argv("sh", "-c", README["serve"].text), cwd=ROOT, env=_env(),
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:  # ready: the master answers and the node is mounted
            r = ns.run(["./build/kvpool", "stat", "--json"], cwd=ROOT, timeout=30)
            if r.returncode == 0 and json.loads(r.stdout).get("segments"):
                break
            if srv.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"the README's serve block did not become ready: {log.read()[-2000:]}")
            time.sleep(0.2)
        yield ns
    finally:
        ns.close()
        log.close()
        os.unlink(log.name)


def test_every_readme_block_is_run_or_says_why_not() -> None:
    for doc in ("README.md", "docs/CONFIG.md"):
        assert docblocks.undecided(doc) == [], f"{doc}: blocks neither marked to run nor excused"


def test_cli_block(pool: Netns, work: Path) -> None:
    r = pool.run(["sh", "-c", README["cli"].text], cwd=work)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "hello"  # the get of what was put
    assert "greeting: yes" in out and "other: no" in out
    st = json.loads(next(line for line in out if line.startswith("{")))
    assert st["counters"]["objects"] >= 1


def test_python_block(pool: Netns, work: Path) -> None:
    r = pool.run([sys.executable, "-c", README["python"].text], cwd=work)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("[b'1', ObjectNotFoundError(")
    assert lines[1] == "[True, False] 2 1"
    assert "replicas" in lines[2] and int(lines[3]) >= 4  # key, parts, a, b


def test_mooncake_block(pool: Netns, work: Path) -> None:
    r = pool.run([sys.executable, "-c", README["mooncake"].text], cwd=work)
    assert r.returncode == 0, r.stderr


def test_c_client_blocks(pool: Netns, work: Path) -> None:
    b = README["c-client"]
    (work / b.attrs["file"]).write_text(b.text)
    r = pool.run(["sh", "-c", README["c-build"].text], cwd=work, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["value", "abcd efgh"]


def test_config_md_example_is_accepted(work: Path) -> None:
    """docs/CONFIG.md's example starts a master that listens beyond loopback."""
    b = CONFIG_MD["config-example"]
    (work / b.attrs["file"]).write_text(b.text)
    subprocess.run("head -c 32 /dev/urandom | base64 > cluster.token; chmod 600 cluster.token",
                   shell=True, cwd=work, check=True)
    ns = Netns()
    try:
        m = subprocess.Popen(ns.argv("./build/kvpool", "master", "--config", b.attrs["file"]),
                             cwd=work, env=_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 20
        while True:
            r = ns.run(["ss", "-Hltn", "sport = :50051"], cwd=work)
            if "0.0.0.0:50051" in r.stdout:
                break
            if m.poll() is not None:
                pytest.fail(f"the master refused docs/CONFIG.md's example: {m.stdout.read()}")
            assert time.monotonic() < deadline, "the master did not listen on 0.0.0.0:50051"
            time.sleep(0.1)
        # a client with the token is served; without it, refused
        r = ns.run(["sh", "-c", "KVPOOL_CLUSTER_TOKEN=$(cat cluster.token) ./build/kvpool stat"],
                   cwd=work)
        assert r.returncode == 0, r.stderr
        r = ns.run(["./build/kvpool", "stat"], cwd=work)
        assert r.returncode != 0 and "auth" in (r.stdout + r.stderr).lower()
    finally:
        ns.close()


def test_config_md_refused_flag_messages_are_the_real_ones(work: Path) -> None:
    """docs/CONFIG.md quotes what `kvpool put` says to a key it does not read."""
    want = CONFIG_MD["refused-flags"].text.splitlines()
    got = []
    for flag in ("--lease-ttl", "--local-buffer-size"):
        r = subprocess.run(["./build/kvpool", "put", "k", flag, "5s" if flag == "--lease-ttl" else "1"],
                           cwd=work, env=_env(), capture_output=True, text=True, timeout=30)
        assert r.returncode == 2
        got += r.stderr.splitlines()
    assert got == want
