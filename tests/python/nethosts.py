"""Hosts made of network namespaces on one switch, for tests that run kvpool
as on several machines and cut the network between them (root only).

A `Lab` is a switch (a namespace holding only a bridge, so the machine's own
namespace gets no interface and no address) and hosts: one namespace each,
joined to the bridge by a veth pair, with the address SUBNET.N/24 on its
`eth0` and no route anywhere else. Every process a test starts on a host
(`Host.spawn`, `Host.run`) runs in the host's directory under the lab's root,
with $XDG_RUNTIME_DIR a short directory of its own (unix socket paths have
at most 107 bytes), and gets a mount namespace of its own in which
/proc/sys/kernel/random/boot_id is the host's, so kvpool treats the hosts as
different machines (TCP between them, never one's unix socket or memfd).

`Lab.partition(a, b)` cuts two hosts apart while both keep talking to every
other host: on each side a /32 route to the other leads into a dead end (a
veth pair inside the host whose far end accepts no frame: a static neighbour
with an address no interface has), so packets are dropped silently in both
directions, as by a broken link; `Lab.heal` removes the routes. Neither
iptables nor tc qdiscs are needed.

`Lab.destroy` stops every process of every host (netns.stop_all) and deletes
the namespaces, and is safe to call twice or after a failed `create`;
`sweep_stale` deletes what a test process killed before its finalizers left."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import netns
import kvpool_procs

DEAD_MAC = "02:00:00:00:de:ad"  # no interface has it: frames sent to it are dropped
PREFIX = "kvl"  # names: kvl<pid of the test process>-<4 hex>-<host>


def sweep_stale() -> list[str]:
    """Deletes the namespaces (and short directories) of Labs whose test
    process is gone (killed before its finalizers ran); the names deleted."""
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    gone = []
    for name in [line.split()[0] for line in p.stdout.splitlines() if line.strip()]:
        pid = name[len(PREFIX):].split("-")[0]
        if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            netns.delete(name)
            gone.append(name)
    tmp = Path(tempfile.gettempdir())
    for d in tmp.glob(f"{PREFIX}*-*"):
        pid = d.name[len(PREFIX):].split("-")[0]
        if d.is_dir() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)
    return gone


def unavailable() -> str:
    """Why a Lab cannot be made here, or "" when it can."""
    why = netns.unavailable()
    if why:
        return why
    if not shutil.which("unshare"):
        return "util-linux's unshare is not installed"
    return ""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


class Host:
    """One namespace on the lab's switch: .addr is its address."""

    def __init__(self, lab: "Lab", name: str, octet: int) -> None:
        self.lab = lab
        self.name = name
        self.ns = f"{lab.prefix}-{name}"
        self.addr = f"{lab.subnet}.{octet}"
        self.port = f"p{octet}"  # its port on the bridge, in the switch namespace
        self.dir = lab.root / name
        self.run_dir = lab.short / name  # $XDG_RUNTIME_DIR: unix socket paths stay short
        self.procs: list[subprocess.Popen[bytes]] = []
        self.dead_end = False
        self.cut: set[str] = set()  # addresses routed into the dead end

    def argv(self, *cmd: str) -> list[str]:
        """cmd on this host: its network namespace, a mount namespace where the
        boot id is the host's, the host's directory. The command is exec'd, so
        the pid of the process started with this argv is the command's."""
        return ["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation",
                "private", "sh", "-c",
                'mount --bind "$1" /proc/sys/kernel/random/boot_id && cd "$2" && shift 2 && '
                'exec "$@"', "host", str(self.dir / "boot_id"), str(self.dir), *cmd]

    def env(self, extra: Optional[dict[str, str]] = None) -> dict[str, str]:
        env = {k: v for k, v in kvpool_procs.server_env().items()
               if not k.startswith(("KVPOOL_", "MOONCAKE_")) and k != "XDG_RUNTIME_DIR"}
        env["XDG_RUNTIME_DIR"] = str(self.run_dir)
        env.update(self.lab.env)
        env.update(extra or {})
        return env

    def spawn(self, log: str, *cmd: str, env: Optional[dict[str, str]] = None,
              stdin: int = subprocess.DEVNULL,
              stdout: Optional[int] = None) -> subprocess.Popen[bytes]:
        """cmd in the background on this host; stderr (and stdout unless
        given) appended to DIR/LOG.log."""
        path = self.dir / f"{log}.log"
        with open(path, "ab") as f:
            p = subprocess.Popen(self.argv(*cmd), env=self.env(env), stdin=stdin,
                                 stdout=stdout if stdout is not None else f,
                                 stderr=f)
        self.procs.append(p)
        return p

    def run(self, *cmd: str, timeout: float = 30,
            env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*cmd), env=self.env(env), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def reaches(self, addr: str, port: int, timeout: float = 1.0) -> bool:
        """A TCP connect from this host to addr:port gets an answer (accepted
        or refused) within timeout s: the network between them works."""
        probe = ("import socket, sys\n"
                 "try:\n"
                 "    socket.create_connection((sys.argv[1], int(sys.argv[2])), "
                 "timeout=float(sys.argv[3])).close()\n"
                 "except ConnectionRefusedError:\n"
                 "    pass\n"
                 "except OSError:\n"
                 "    sys.exit(1)\n")
        p = self.run(sys.executable, "-c", probe, addr, str(port), str(timeout),
                     timeout=timeout + 20)
        return p.returncode == 0

    def _dead_end(self) -> None:
        if not self.dead_end:
            ip("-n", self.ns, "link", "add", "dz0", "type", "veth", "peer", "name", "dz1")
            ip("-n", self.ns, "link", "set", "dz0", "up")
            ip("-n", self.ns, "link", "set", "dz1", "up")
            self.dead_end = True

    def drop_to(self, addr: str) -> None:
        """Packets from this host to addr are dropped silently."""
        self._dead_end()
        ip("-n", self.ns, "neigh", "replace", addr, "lladdr", DEAD_MAC, "dev", "dz0", "nud",
           "permanent")
        ip("-n", self.ns, "route", "replace", f"{addr}/32", "dev", "dz0")
        self.cut.add(addr)

    def undrop_to(self, addr: str) -> None:
        if addr in self.cut:
            ip("-n", self.ns, "route", "del", f"{addr}/32", "dev", "dz0", check=False)
            ip("-n", self.ns, "neigh", "del", addr, "dev", "dz0", check=False)
            self.cut.discard(addr)


class Lab:
    """A switch and hosts; see the module docstring. env: variables every
    process on every host gets (tokens, log levels)."""

    def __init__(self, root: Path, subnet: str = "10.77.0",
                 env: Optional[dict[str, str]] = None) -> None:
        self.root = Path(root)
        self.subnet = subnet
        self.prefix = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.switch = f"{self.prefix}-sw"
        self.hosts: dict[str, Host] = {}
        self.env = dict(env or {})
        self.made: list[str] = []
        self.short = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))

    def create_switch(self) -> None:
        ip("netns", "add", self.switch)
        self.made.append(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, name: str, octet: int) -> Host:
        if not self.made:
            self.create_switch()
        h = Host(self, name, octet)
        netns.add(h.ns)
        self.made.append(h.ns)
        ip("link", "add", "eth0", "netns", h.ns, "type", "veth", "peer", "name", h.port,
           "netns", self.switch)
        ip("-n", self.switch, "link", "set", h.port, "master", "br0")
        ip("-n", self.switch, "link", "set", h.port, "up")
        ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
        ip("-n", h.ns, "link", "set", "eth0", "up")
        h.dir.mkdir(parents=True, exist_ok=True)
        h.run_dir.mkdir(mode=0o700)
        (h.dir / "boot_id").write_text(f"{uuid.uuid4()}\n")  # this host's identity
        self.hosts[name] = h
        return h

    def partition(self, a: Host, b: Host) -> None:
        """a and b no longer reach each other (silent drops both ways)."""
        a.drop_to(b.addr)
        b.drop_to(a.addr)

    def heal(self, a: Host, b: Host) -> None:
        a.undrop_to(b.addr)
        b.undrop_to(a.addr)

    def destroy(self) -> None:
        for name in reversed(self.made):
            netns.stop_all(name)
        for h in self.hosts.values():
            for p in h.procs:
                if p.poll() is None:
                    try:
                        p.kill()
                    except ProcessLookupError:
                        pass
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        for name in reversed(self.made):
            netns.delete(name)
        self.made.clear()
        shutil.rmtree(self.short, ignore_errors=True)


def kill(p: "subprocess.Popen[bytes]", sig: int = signal.SIGKILL) -> None:
    """sig to p unless it is gone already."""
    if p.poll() is None:
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass


def wait_exit(p: "subprocess.Popen[bytes]", timeout: float) -> Optional[int]:
    """p's exit status once it ends within timeout s, else None."""
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def now() -> float:
    """CLOCK_MONOTONIC: the same clock in every namespace of the machine."""
    return time.monotonic()
