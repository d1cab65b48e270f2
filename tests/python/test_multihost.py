"""README.md's "Several hosts" recipe, run verbatim on two hosts made of
network namespaces.

Host A (10.0.0.1/24) and host B (10.0.0.2/24) are two network namespaces
joined by a veth pair, nothing else: no route leads out of them. Each host
also gets its own mount namespace with its own kernel boot id bind-mounted
over /proc/sys/kernel/random/boot_id (kvpool's same-host test), its own
working directory and $XDG_RUNTIME_DIR, so a client on B reaches A's
segment over TCP across the veth, as on two machines, never through A's
unix socket on the shared file system.

The README blocks marked `<!-- test: multihost-... host=a|b -->` are run with
`sh -e`, each in its host's directory, in the recipe's order, with the
tested `kvpool` ($KVPOOL_BIN) first on PATH. Between blocks the test does
what the prose tells the reader to do by hand: copy the token files from A
to B, and wait (bounded) for the master to answer and for B's segment to be
mounted. Every process in both namespaces is killed and the namespaces
deleted at the end, also on failure. Needs root and `ip netns`."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

import docblocks
import netns
import kvpool_procs

README = "README.md"
BLOCKS = ("multihost-tokens", "multihost-a", "multihost-b", "multihost-client")
MASTER = "10.0.0.1:50051"
ADDR = {"a": "10.0.0.1", "b": "10.0.0.2"}
WAIT_S = 30.0
BLOCK_TIMEOUT_S = 60.0


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


class Hosts:
    """Two network namespaces on one veth link; see the module docstring."""

    def __init__(self, root: Path) -> None:
        tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.ns = {h: f"kvp-{h}-{tag}" for h in ADDR}
        self.dev = {h: f"kv{h}{tag[-9:].replace('-', '')}"[:15] for h in ADDR}
        self.dir = {h: root / h for h in ADDR}
        self.bin = root / "bin"
        self.logs: list[Path] = []
        self.made: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def create(self) -> None:
        for h in ADDR:
            _run("ip", "netns", "add", self.ns[h])
            self.made.append(self.ns[h])
        _run("ip", "link", "add", self.dev["a"], "netns", self.ns["a"], "type", "veth", "peer",
             "name", self.dev["b"], "netns", self.ns["b"])
        for h in ADDR:
            _run("ip", "-n", self.ns[h], "link", "set", "lo", "up")
            _run("ip", "-n", self.ns[h], "addr", "add", f"{ADDR[h]}/24", "dev", self.dev[h])
            _run("ip", "-n", self.ns[h], "link", "set", self.dev[h], "up")
            d = self.dir[h]
            (d / "run").mkdir(parents=True, mode=0o700)
            (d / "boot_id").write_text(f"{uuid.uuid4()}\n")  # this host's identity
        self.bin.mkdir()
        (self.bin / "kvpool").symlink_to(kvpool_procs.kvpool_bin())

    def env(self, h: str) -> dict[str, str]:
        env = {k: v for k, v in kvpool_procs.server_env().items()
               if not k.startswith(("KVPOOL_", "MOONCAKE_")) and k != "XDG_RUNTIME_DIR"}
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env["XDG_RUNTIME_DIR"] = str(self.dir[h] / "run")
        return env

    def argv(self, h: str, *cmd: str) -> list[str]:
        """cmd on host h: in its network namespace, in a mount namespace of its
        own where the boot id is the host's, in the host's directory."""
        return ["ip", "netns", "exec", self.ns[h], "unshare", "--mount", "--propagation",
                "private", "sh", "-c",
                'mount --bind "$1" /proc/sys/kernel/random/boot_id && cd "$2" && shift 2 && '
                'exec "$@"', "host", str(self.dir[h] / "boot_id"), str(self.dir[h]), *cmd]

    def block(self, b: docblocks.Block) -> str:
        """Runs a README block verbatim with sh -e on its host; its output
        (background servers keep writing to the same file)."""
        h = b.attrs["host"]
        script = self.dir[h] / f"{b.name}.sh"
        script.write_text(b.text)
        log = self.dir[h] / f"{b.name}.log"
        self.logs.append(log)
        with open(log, "wb") as f:
            p = subprocess.run(self.argv(h, "sh", "-e", str(script)), stdin=subprocess.DEVNULL,
                               stdout=f, stderr=subprocess.STDOUT, env=self.env(h),
                               timeout=BLOCK_TIMEOUT_S)
        out = log.read_text(errors="replace")
        assert p.returncode == 0, f"README block {b.name} (line {b.line}) failed:\n{out}"
        return out

    def kvpool(self, h: str, *args: str, master: str = MASTER,
               token: bool = True) -> subprocess.CompletedProcess[str]:
        """The test's own kvpool command on host h (with the cluster token
        unless token is False: a client holding a token refuses a master
        that cannot prove it)."""
        env = self.env(h)
        if token:
            env["KVPOOL_CLUSTER_TOKEN"] = (self.dir[h] / "cluster.token").read_text().strip()
        return subprocess.run(self.argv(h, "kvpool", *args, "--master", master), env=env,
                              capture_output=True, text=True, timeout=30)

    def run(self, h: str, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """cmd on host h, to its end (bounded)."""
        return subprocess.run(self.argv(h, *cmd), env=self.env(h), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def spawn(self, h: str, name: str, *cmd: str) -> None:
        """cmd on host h in the background, output to NAME.log."""
        log = self.dir[h] / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as f:
            self.procs.append(subprocess.Popen(self.argv(h, *cmd), env=self.env(h),
                                               stdin=subprocess.DEVNULL, stdout=f,
                                               stderr=subprocess.STDOUT))

    def stat(self, h: str, master: str = MASTER, token: bool = True) -> dict | None:
        p = self.kvpool(h, "stat", "--json", master=master, token=token)
        return json.loads(p.stdout) if p.returncode == 0 else None

    def wait_stat(self, h: str, what: str, ok, master: str = MASTER,
                  token: bool = True) -> dict:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            s = self.stat(h, master, token)
            if s is not None and ok(s):
                return s
            time.sleep(0.3)
        last = self.stat(h, master, token)
        raise AssertionError(f"no {what} within {WAIT_S:.0f} s; last stat {last}\n"
                             + self.log_text())

    def kill(self, pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def stop_all(self, h: str) -> None:
        netns.stop_all(self.ns[h])

    def destroy(self) -> None:
        for ns in self.made:
            netns.stop_all(ns)
        for p in self.procs:
            p.wait(timeout=10)
        for ns in self.made:
            netns.delete(ns)

    def log_text(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in self.logs
                       if p.exists())


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates network namespaces")
    if not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs `ip` (iproute2) and `unshare` (util-linux)")
    h = Hosts(tmp_path)
    try:
        h.create()
    except (subprocess.CalledProcessError, OSError) as e:
        h.destroy()
        err = getattr(e, "stderr", "") or e
        pytest.skip(f"cannot make two hosts of network namespaces here: {err}")
    try:
        probe = subprocess.run(h.argv("a", "cat", "/proc/sys/kernel/random/boot_id"),
                               capture_output=True, text=True, timeout=30)
        if probe.stdout != (h.dir["a"] / "boot_id").read_text():
            h.destroy()
            pytest.skip(f"cannot give a namespace its own boot id: {probe.stderr.strip()}")
        yield h
    finally:
        h.destroy()


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:  # gone meanwhile
        return []


def _segment(stat: dict, host: str) -> dict:
    segs = [g for g in stat["segments"] if g["name"].startswith(ADDR[host] + ":")]
    assert len(segs) == 1, f"one segment named {ADDR[host]}:PORT expected: {stat['segments']}"
    return segs[0]


def test_readme_recipe_on_two_hosts(hosts: Hosts) -> None:
    blocks = docblocks.blocks(README)
    mine = [n for n in blocks if n.startswith("multihost-")]
    assert tuple(mine) == BLOCKS, f"README's multihost blocks, in order: {mine}"
    assert {n: blocks[n].attrs.get("host") for n in BLOCKS} == \
        {"multihost-tokens": "a", "multihost-a": "a", "multihost-b": "b",
         "multihost-client": "b"}
    text = (docblocks.ROOT / README).read_text()
    assert re.search(r"Copy `cluster\.token` and `node\.token` to every host", text), \
        "the recipe must tell the reader to copy the token files (the test does it)"

    hosts.block(blocks["multihost-tokens"])
    for f in ("cluster.token", "node.token"):  # "Copy ... to every host"
        shutil.copy2(hosts.dir["a"] / f, hosts.dir["b"] / f)
    hosts.block(blocks["multihost-a"])
    # the master answers host B across the veth, with A's segment mounted
    hosts.wait_stat("b", "master with host A's segment", lambda s: len(s["segments"]) >= 1)
    hosts.block(blocks["multihost-b"])
    hosts.wait_stat("b", "second segment", lambda s: len(s["segments"]) >= 2)

    out = hosts.block(blocks["multihost-client"])
    assert "hello\n" in out, out
    assert re.search(r"segments 2\b", out), out
    for h in ADDR:
        assert re.search(rf"^[0-9a-f]{{16}}\s+{re.escape(ADDR[h])}:\d+\s", out, re.M), out

    stat = hosts.stat("b")
    assert stat is not None and len(stat["segments"]) == 2, stat
    seg_a, seg_b = _segment(stat, "a"), _segment(stat, "b")
    # the client on B wrote one replica into A's segment (over TCP: the hosts'
    # boot ids differ, and the veth is the only way from B to 10.0.0.1)
    assert seg_a["objects"] == 1 and seg_a["used"] >= len("hello\n"), seg_a
    assert seg_b["objects"] == 1, seg_b

    # B's store gone (SIGTERM: it unmounts), the value comes from A across the veth
    stores = [p for p in netns.pids(hosts.ns["b"]) if "store" in _argv(p)]
    assert len(stores) == 1, stores
    hosts.kill(stores[0], signal.SIGTERM)
    hosts.wait_stat("b", "unmount of B's segment", lambda s: len(s["segments"]) == 1)
    got = hosts.kvpool("b", "get", "greeting")
    assert got.returncode == 0 and got.stdout == "hello\n", (got.stdout, got.stderr)


def test_recipe_mistakes_are_refused_with_a_message(hosts: Hosts) -> None:
    """What a reader gets wrong ends in a message naming the fix, within a
    bounded time, never in a store that waits or registers a useless address."""
    hosts.block(docblocks.blocks(README)["multihost-tokens"])
    for f in ("cluster.token", "node.token"):
        shutil.copy2(hosts.dir["a"] / f, hosts.dir["b"] / f)
    creds = ("--cluster-token-file", "cluster.token", "--node-token-file", "node.token")
    store = ("kvpool", "store", "--master", MASTER, "--segment-size", "64MiB")

    # the master left on its default, 127.0.0.1: B's store cannot reach it
    hosts.spawn("a", "master-loopback", "kvpool", "master")
    hosts.wait_stat("a", "master on A's loopback", lambda s: True, master="127.0.0.1:50051",
                    token=False)  # a tokenless master: a client with a token would refuse it
    p = hosts.run("b", *store, *creds)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f"cannot connect to {MASTER}" in p.stderr, p.stderr
    assert f"is the master running at {MASTER}?" in p.stderr, p.stderr
    hosts.stop_all("a")

    # beyond loopback without the cluster token: the master refuses to start
    p = hosts.run("a", "kvpool", "master", "--listen", MASTER)
    assert p.returncode == 1 and "cluster_token" in p.stderr, p.stderr

    hosts.spawn("a", "master", "kvpool", "master", "--listen", MASTER, *creds)
    hosts.wait_stat("b", "master", lambda s: True)
    # a store with no --listen and no node token would open its segment to
    # the network with less than the pool's credentials: refused, naming it
    p = hosts.run("b", *store, "--cluster-token-file", "cluster.token")
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert "node_token" in p.stderr and "10.0.0.2" in p.stderr, p.stderr
    p = hosts.run("b", *store)
    assert p.returncode == 1 and "cluster_token" in p.stderr, p.stderr
    # with an explicit --listen and no node token: the master's refusal, explained
    p = hosts.run("b", *store, "--listen", "10.0.0.2:0", "--cluster-token-file", "cluster.token")
    assert p.returncode == 1 and "MOUNT_SEGMENT refused" in p.stderr, p.stderr
    assert "node_token" in p.stderr, p.stderr
    # a client without the cluster token
    p = hosts.run("b", "kvpool", "stat", "--master", MASTER)
    assert p.returncode == 1 and "requires a cluster token" in p.stderr, p.stderr
    stat = hosts.stat("b")
    assert stat is not None and stat["segments"] == [], stat
    hosts.stop_all("a")

    # `kvpool serve` on a wildcard: its segment is registered as local_hostname
    # (without it: 127.0.0.1, which remote clients cannot dial, and a warning)
    hosts.spawn("a", "serve-wild", "kvpool", "serve", "--listen", "0.0.0.0:50051",
                "--segment-size", "64MiB", "--local-hostname", ADDR["a"], *creds)
    stat = hosts.wait_stat("b", "serve's segment", lambda s: len(s["segments"]) == 1)
    assert _segment(stat, "a")["capacity"] == 64 << 20, stat
    hosts.stop_all("a")
    hosts.spawn("a", "serve-wild-unnamed", "kvpool", "serve", "--listen", "0.0.0.0:50051",
                "--segment-size", "64MiB", *creds)
    stat = hosts.wait_stat("b", "serve's segment", lambda s: len(s["segments"]) == 1)
    assert stat["segments"][0]["name"].startswith("127.0.0.1:"), stat
    log = (hosts.dir["a"] / "serve-wild-unnamed.log").read_text()
    assert "clients on other hosts cannot reach it; set local_hostname" in log, log
