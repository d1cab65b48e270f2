"""A kvpool cluster on hosts made of network namespaces (tests/python/
nethosts.py): etcd on one host, masters (`kvpool master --etcd`) on others,
storage nodes (`kvpool store --master etcd://...`) on others, and the
verifying client load (load.py) on a client host. Addresses are 10.77.0.N on
the lab's bridge; nothing is sent anywhere else.

  host   address      what
  etcd   10.77.0.1    etcd 3.4 (client port 2379, data dir kept across restarts)
  m1-m3  10.77.0.11-  kvpool master --listen ADDR:50051 --ha-lease-ttl 2s
  n1-n2  10.77.0.21-  kvpool store --listen ADDR:7000 --segment-size 64MiB
  c1     10.77.0.31   the load (tests/cluster/load.py)

Every participant has the cluster token, masters and nodes the node token
($KVPOOL_CLUSTER_TOKEN, $KVPOOL_NODE_TOKEN): beyond loopback kvpool refuses
to listen without them."""
from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

import kvpool_procs  # noqa: E402
import nethosts  # noqa: E402
from nethosts import now  # noqa: E402

CLUSTER = "c"
LEASE_TTL_S = 2.0
MASTER_PORT = 50051
NODE_PORT = 7000
SEGMENT = "64MiB"
ETCD_PORT = 2379
WAIT_S = 30.0          # bound on every wait for the cluster to get somewhere
MAX_CALL_S = 20.0      # no client call may take longer (a hung call is a failure)
STABLE_S = 1.5         # recovered: this long with every call succeeding


def etcd_bin() -> str:
    b = os.environ.get("KVPOOL_ETCD") or "/usr/bin/etcd"
    return b if os.access(b, os.X_OK) else (shutil.which("etcd") or "")


def etcdctl_bin() -> str:
    b = Path(etcd_bin()).with_name("etcdctl")
    return str(b) if os.access(b, os.X_OK) else (shutil.which("etcdctl") or "")


def python_bin() -> str:
    """The interpreter of this pytest run (the venv of scripts/python-env)."""
    return sys.executable


def unavailable() -> str:
    why = nethosts.unavailable()
    if why:
        return why
    if not etcd_bin():
        return "no etcd binary (/usr/bin/etcd, Debian etcd-server; or $KVPOOL_ETCD)"
    if not etcdctl_bin():
        return "no etcdctl beside etcd (Debian etcd-client)"
    if not os.access(kvpool_procs.kvpool_bin(), os.X_OK):
        return f"no kvpool binary at {kvpool_procs.kvpool_bin()} (make)"
    return ""


def mark(host: nethosts.Host, log: str, what: str) -> None:
    """A line in host's LOG.log between the process's own: what the test did, when."""
    with open(host.dir / f"{log}.log", "a") as f:
        f.write(f"==== {what} at {now():.3f}\n")


class Master:
    def __init__(self, cl: "Cluster", host: nethosts.Host) -> None:
        self.cl, self.host = cl, host
        self.addr = f"{host.addr}:{MASTER_PORT}"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        mark(self.host, "master", f"start {self.starts}")
        self.proc = self.host.spawn(
            "master", kvpool_procs.kvpool_bin(), "master", "--listen", self.addr,
            "--etcd", f"http://{self.cl.etcd.addr}:{ETCD_PORT}", "--cluster", CLUSTER,
            "--ha-lease-ttl", f"{LEASE_TTL_S:g}s", *self.cl.master_args)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self) -> str:
        p = self.host.dir / "master.log"
        return p.read_text(errors="replace") if p.exists() else ""


class Node:
    def __init__(self, cl: "Cluster", host: nethosts.Host) -> None:
        self.cl, self.host = cl, host
        self.addr = f"{host.addr}:{NODE_PORT}"
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        mark(self.host, "store", f"start {self.starts}")
        self.proc = self.host.spawn(
            "store", kvpool_procs.kvpool_bin(), "store", "--master", self.cl.url,
            "--listen", self.addr, "--segment-size", SEGMENT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LoadProc:
    """load.py on the client host, driven over its stdin/stdout."""

    def __init__(self, cl: "Cluster", host: nethosts.Host, prefix: str,
                 config: Optional[dict] = None, options: Optional[dict] = None) -> None:
        cfg = {"master": cl.url, "mode": "standalone-store", "rpc_timeout": "2s"}
        cfg.update(config or {})
        self.proc = host.spawn(f"load-{prefix}", python_bin(), str(HERE / "load.py"),
                               json.dumps(cfg), prefix, json.dumps(options or {}),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.events: list[list] = []
        self.buf = b""
        hello = self._read(WAIT_S + 10)
        if not hello.get("ready"):
            raise RuntimeError(f"the load did not start: {hello}")

    def _read(self, timeout: float) -> dict:
        deadline = now() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - now()
            if left <= 0:
                raise TimeoutError(f"the load did not answer within {timeout:.0f} s")
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise RuntimeError(f"the load exited ({self.proc.poll()})")
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def cmd(self, line: str, timeout: float = 70.0) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        r = self._read(timeout)
        if "error" in r:
            raise AssertionError(f"load: {line}: {r['error']}")
        return r

    def poll(self) -> dict:
        """New records appended to .events; returns the answer (inflight...)."""
        r = self.cmd(f"events {len(self.events)}")
        self.events.extend(r["events"])
        return r

    def resume(self) -> None:
        self.cmd("resume")

    def pause(self) -> None:
        self.cmd("pause")
        self.poll()

    def verify(self) -> dict:
        return self.cmd("verify", timeout=240.0)

    def quit(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=40)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)


@dataclass
class Recovery:
    """What a fault did to the load, from the records after it."""
    fault_t: float
    put_s: Optional[float] = None  # fault to puts succeeding again (None: never)
    get_s: Optional[float] = None
    failed: dict[str, int] = field(default_factory=dict)  # "put E:RPC_FAIL" -> count
    wrong: int = 0
    misreported: list = field(default_factory=list)      # X: results
    max_call_s: float = 0.0
    calls: int = 0

    def line(self) -> str:
        f = lambda x: "never" if x is None else f"{x:.2f} s"  # noqa: E731
        fails = ", ".join(f"{k} x{v}" for k, v in sorted(self.failed.items())) or "none"
        return (f"puts again after {f(self.put_s)}, gets again after {f(self.get_s)}; "
                f"{self.calls} calls, failed: {fails}; wrong {self.wrong}; "
                f"slowest call {self.max_call_s:.2f} s")


def is_failure(op: str, res: str) -> bool:
    """A call that did not do its job. A get answered OBJECT_NOT_FOUND is a
    lost object (counted by verify), not the cluster being unavailable."""
    return res != "ok" and not (op == "get" and res == "E:OBJECT_NOT_FOUND")


def analyse(events: list[list], fault_t: float, until: Optional[float] = None) -> Recovery:
    """Recovery from fault_t: for puts and gets, the end of the first
    successful call started after the last failed one (of calls started
    after the fault, up to until), minus fault_t."""
    r = Recovery(fault_t)
    evs = [e for e in events if e[1] > fault_t and (until is None or e[0] < until)]
    r.calls = len(evs)
    for e in events:
        if e[4] == "wrong":
            r.wrong += 1
        if e[4].startswith("X:"):
            r.misreported.append(e)
    for op in ("put", "get"):
        mine = [e for e in evs if e[2] == op]
        fails = [e for e in mine if is_failure(op, e[4])]
        for e in fails:
            k = f"{op} {e[4]}"
            r.failed[k] = r.failed.get(k, 0) + 1
        last = max((e[1] for e in fails), default=fault_t)
        ok = [e[1] for e in mine if e[4] == "ok" and e[0] >= last]
        val = (min(ok) - fault_t) if ok else None
        if not fails and ok:
            val = 0.0
        setattr(r, f"{op}_s", val)
    r.max_call_s = max((e[1] - e[0] for e in evs), default=0.0)
    return r


class Cluster:
    """See the module docstring. masters/nodes: how many; a test adds
    faults with the Lab's partition/heal and the processes' signals."""

    def __init__(self, root: Path, masters: int = 2, nodes: int = 2,
                 master_args: tuple[str, ...] = ()) -> None:
        self.root = root
        env = {"KVPOOL_CLUSTER_TOKEN": secrets.token_hex(16),
               "KVPOOL_NODE_TOKEN": secrets.token_hex(16),
               "KVPOOL_LOG_LEVEL": "info"}
        self.lab = nethosts.Lab(root, env=env)
        self.master_args = master_args
        self.n_masters, self.n_nodes = masters, nodes
        self.etcd: nethosts.Host
        self.etcd_proc: Optional[subprocess.Popen[bytes]] = None
        self.masters: list[Master] = []
        self.nodes: list[Node] = []
        self.loads: list[LoadProc] = []
        self.url = ""
        self.supervisor: Optional[threading.Thread] = None
        self.supervising = False
        self.restarts: list[tuple[str, float]] = []  # (master, when) the supervisor restarted

    # -------------------------------------------------------------- bring-up
    def create(self) -> None:
        self.etcd = self.lab.add_host("etcd", 1)
        self.url = f"etcd://{self.etcd.addr}:{ETCD_PORT}/{CLUSTER}"
        for i in range(self.n_masters):
            self.masters.append(Master(self, self.lab.add_host(f"m{i + 1}", 11 + i)))
        for i in range(self.n_nodes):
            self.nodes.append(Node(self, self.lab.add_host(f"n{i + 1}", 21 + i)))
        self.client = self.lab.add_host("c1", 31)

    def start_etcd(self) -> None:
        a = self.etcd.addr
        mark(self.etcd, "etcd", "start")
        self.etcd_proc = self.etcd.spawn(
            "etcd", etcd_bin(), "--name", "kvp", "--data-dir", str(self.etcd.dir / "data"),
            "--listen-client-urls", f"http://{a}:{ETCD_PORT}",
            "--advertise-client-urls", f"http://{a}:{ETCD_PORT}",
            "--listen-peer-urls", f"http://{a}:2380",
            "--initial-advertise-peer-urls", f"http://{a}:2380",
            "--initial-cluster", f"kvp=http://{a}:2380", "--log-level", "warn",
            "--logger", "zap")
        self.wait(lambda: self.etcdctl("endpoint", "health").returncode == 0, "etcd healthy")

    def etcdctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.etcd.run(etcdctl_bin(), "--endpoints", f"http://{self.etcd.addr}:{ETCD_PORT}",
                             "--command-timeout", "1s", *args, timeout=10,
                             env={"ETCDCTL_API": "3"})

    def leader(self) -> Optional[str]:
        """The address etcd names leader, or None."""
        p = self.etcdctl("get", f"/kvpool/{CLUSTER}/leader", "--print-value-only")
        if p.returncode != 0 or not p.stdout.strip():
            return None
        try:
            return json.loads(p.stdout.strip().splitlines()[0])["addr"]
        except (ValueError, KeyError, IndexError):
            return None

    def members(self) -> list[str]:
        p = self.etcdctl("get", f"/kvpool/{CLUSTER}/members/", "--prefix", "--print-value-only")
        out = []
        for line in p.stdout.splitlines() if p.returncode == 0 else []:
            try:
                out.append(json.loads(line)["addr"])
            except (ValueError, KeyError):
                pass
        return out

    def leader_master(self) -> Master:
        addr = self.leader()
        for m in self.masters:
            if m.addr == addr:
                return m
        raise AssertionError(f"etcd names {addr} leader, none of ours")

    def wait_leader(self, m: Master, timeout: float = WAIT_S) -> float:
        """Seconds until etcd names m leader."""
        return self.wait(lambda: self.leader() == m.addr, f"{m.host.name} leader", timeout)

    def stat(self) -> Optional[dict]:
        p = self.client.run(kvpool_procs.kvpool_bin(), "stat", "--json", "--master", self.url,
                            timeout=15)
        if p.returncode != 0:
            return None
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    def stat_value(self, name: str) -> Optional[int]:
        """The master's counter name (kvpool stat --json), or None."""
        s = self.stat()
        v = s.get("counters", {}).get(name) if s else None
        return v if isinstance(v, int) else None

    def segments(self) -> int:
        s = self.stat()
        return len(s["segments"]) if s else -1

    def wait_segments(self, n: int, timeout: float = WAIT_S) -> float:
        return self.wait(lambda: self.segments() == n, f"{n} segments mounted", timeout)

    def wait(self, ok: Callable[[], bool], what: str, timeout: float = WAIT_S) -> float:
        t0 = now()
        while now() - t0 < timeout:
            if ok():
                return now() - t0
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout:.0f} s\n{self.logs_tail()}")

    def start(self, load: bool = True, options: Optional[dict] = None) -> Optional[LoadProc]:
        """etcd, the masters (the first one leader), the nodes mounted, and
        the load running."""
        self.start_etcd()
        self.masters[0].start()
        self.wait_leader(self.masters[0])
        for m in self.masters[1:]:
            m.start()
        self.wait(lambda: len(self.members()) == len(self.masters), "every master a member")
        for n in self.nodes:
            n.start()
        self.wait_segments(len(self.nodes))
        if not load:
            return None
        return self.start_load("k", options=options)

    def start_load(self, prefix: str, config: Optional[dict] = None,
                   options: Optional[dict] = None) -> LoadProc:
        ld = LoadProc(self, self.client, prefix, config, options)
        self.loads.append(ld)
        ld.resume()
        return ld

    # --------------------------------------------------------------- phases
    def run_load(self, ld: LoadProc, seconds: float) -> None:
        """Lets the load run, checking no call hangs."""
        end = now() + seconds
        while now() < end:
            time.sleep(min(0.25, max(0.0, end - now())))
            self.check_inflight(ld)

    def check_inflight(self, ld: LoadProc) -> None:
        r = ld.poll()
        for op, t0 in r["inflight"]:
            assert now() - t0 < MAX_CALL_S, \
                f"a {op} call has not returned for {now() - t0:.1f} s\n{self.logs_tail()}"

    def wait_recovered(self, ld: LoadProc, fault_t: float, timeout: float = WAIT_S,
                       settle_s: float = STABLE_S) -> Recovery:
        """Waits until puts and gets have all succeeded for STABLE_S (with
        some of each), at least settle_s after fault_t (a fault whose effect
        comes later, as a lease running out, must not pass for recovered),
        then returns the recovery measured from fault_t."""
        t0 = now()
        while now() - t0 < timeout:
            time.sleep(0.25)
            self.check_inflight(ld)
            t = now()
            recent = [e for e in ld.events if e[0] > max(fault_t, t - STABLE_S)
                      and e[2] in ("put", "get")]
            if t - fault_t < max(STABLE_S, settle_s):
                continue
            ops = {e[2] for e in recent if e[4] == "ok"}
            if {"put", "get"} <= ops and not any(is_failure(e[2], e[4]) for e in recent):
                return analyse(ld.events, fault_t)
        r = analyse(ld.events, fault_t)
        raise AssertionError(f"the load did not recover within {timeout:.0f} s of the fault: "
                             f"{r.line()}\n{self.logs_tail()}")

    def supervise(self, delay_s: float = 0.5) -> None:
        """From now on a master that exits 3 (it gave its term up) is started
        again after delay_s, as systemd's Restart=on-failure would."""
        def loop() -> None:
            while self.supervising:
                for m in self.masters:
                    if m.proc is not None and m.proc.poll() == 3:
                        self.restarts.append((m.host.name, now()))
                        mark(m.host, "master", "exited 3: the supervisor starts it again")
                        time.sleep(delay_s)
                        if self.supervising:
                            m.start()
                time.sleep(0.05)
        self.supervising = True
        self.supervisor = threading.Thread(target=loop, daemon=True)
        self.supervisor.start()

    # -------------------------------------------------------------- teardown
    def destroy(self) -> None:
        self.supervising = False
        if self.supervisor is not None:
            self.supervisor.join(timeout=5)
        for ld in self.loads:
            try:
                ld.quit()
            except Exception:  # noqa: BLE001 -- the namespaces go anyway
                pass
        self.lab.destroy()

    def logs_tail(self, lines: int = 25) -> str:
        out = []
        for h in self.lab.hosts.values():
            for p in sorted(h.dir.glob("*.log")):
                text = p.read_text(errors="replace").splitlines()
                out.append(f"--- {h.name}/{p.name} (last {lines} lines)\n" +
                           "\n".join(text[-lines:]))
        return "\n".join(out)


def kill(p: Optional[subprocess.Popen[bytes]], sig: int = signal.SIGKILL) -> None:
    if p is not None:
        nethosts.kill(p, sig)
