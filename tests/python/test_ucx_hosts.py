"""The "ucx" transport between two hosts made of network namespaces
(nethosts.Lab): a master, two `kvpool store --protocol ucx` nodes and a
Python client opened with protocol "ucx", each on a host of its own, all
with UCX_TLS=tcp (UCX's own TCP transport over the veths: there is no RDMA
NIC here). The client's host is another machine to kvpool (its own boot
id), so it picks the segments' ucx endpoints by itself, no
KVPOOL_FORCE_UCX.

Checks: every size class and a batch round-trip byte-exact, the bytes went
through UCX (the client's per-path counters); node 1 killed with SIGKILL
while the client puts (every put an error or a value that reads back
exact, and node 2's keys read back), then node 1 restarted and used through
a new attach. Needs root."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

import kvpool_procs
import nethosts

SCRIPT = r'''
import json, sys, time
import kvpool

master, phase = sys.argv[1], sys.argv[2]
c = kvpool.Client({"master": master, "protocol": "ucx", "rpc_timeout": 3000})


def val(key: str, n: int) -> bytes:
    seed = sum(key.encode()) & 0xFF
    return bytes((seed + i * 7) & 0xFF for i in range(min(n, 4096))) * (n // 4096) + \
        bytes((seed + i * 7) & 0xFF for i in range(n % 4096))


out = {"ok": 0, "errors": 0, "wrong": 0}
if phase == "sizes":
    sizes = [1, 7, 4096, 65537, 1 << 20, (2 << 20) + 3, 16 << 20]
    keys = [f"{sys.argv[3]}-size-{n}" for n in sizes]
    bkeys = [f"{sys.argv[3]}-batch-{i}" for i in range(64)]
    for ks, ns in ((keys, sizes), (bkeys, [70000] * 64)):
        left = list(zip(ks, ns))
        for attempt in range(20):  # a put that failed (a dead node's segment not yet dropped) again
            res = c.put_batch([k for k, _ in left], [val(k, n) for k, n in left])
            out["errors"] += sum(r is not None for r in res)
            left = [kn for kn, r in zip(left, res) if r is not None]
            if not left:
                break
            time.sleep(0.5)
        for k, n, got in zip(ks, ns, c.get_batch(ks)):
            out["ok" if got == val(k, n) else "wrong"] += 1
elif phase == "load":  # puts until told to stop (a file), then reads back what succeeded
    done = []
    r = 0
    while not __import__("os").path.exists(sys.argv[3]) and r < 2000:
        keys = [f"load-{r}-{i}" for i in range(8)]
        try:
            c.put_batch(keys, [val(k, 1 << 20) for k in keys])
            done += keys
        except kvpool.Error as e:
            out["errors"] += 1
            out.setdefault("first_error", str(e))
        r += 1
    for k in done:
        try:
            out["ok" if c.get(k) == val(k, 1 << 20) else "wrong"] += 1
        except kvpool.Error:
            out["errors"] += 1
if hasattr(c, "stats"):
    out["stats"] = c.stats()
c.close()
print(json.dumps(out))
'''


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[nethosts.Lab]:
    why = nethosts.unavailable()
    if why:
        pytest.skip(why)
    if not os.path.exists("/usr/lib/x86_64-linux-gnu/libucp.so.0") and \
            not any(Path(d).glob("libucp.so.0") for d in ("/usr/lib", "/usr/lib64")):
        pytest.skip("UCX is not installed (Debian: libucx0)")
    lb = nethosts.Lab(tmp_path, subnet="10.78.0",
                      env={"UCX_TLS": "tcp", "KVPOOL_LOG_LEVEL": "info",
                           "KVPOOL_CLUSTER_TOKEN": secrets.token_hex(16),
                           "KVPOOL_NODE_TOKEN": secrets.token_hex(16)})
    try:
        yield lb
    finally:
        lb.destroy()


def wait_log(h: nethosts.Host, p: "subprocess.Popen[bytes]", log: str, text: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None:
        if text in (h.dir / f"{log}.log").read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {text!r} in {log}.log:\n" +
                         (h.dir / f"{log}.log").read_text(errors="replace"))


def master(m: nethosts.Host) -> str:
    p = m.spawn("master", kvpool_procs.kvpool_bin(), "master", "--listen", f"{m.addr}:50051")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and p.poll() is None and not m.reaches(m.addr, 50051):
        time.sleep(0.2)
    assert p.poll() is None, (m.dir / "master.log").read_text()
    return f"{m.addr}:50051"


def store(n: nethosts.Host, master_addr: str) -> "subprocess.Popen[bytes]":
    """`kvpool store --protocol ucx` on n, once mounted."""
    p = n.spawn("store", kvpool_procs.kvpool_bin(), "store", "--master", master_addr,
                "--listen", f"{n.addr}:7000", "--segment-size", "256MiB", "--protocol", "ucx")
    wait_log(n, p, "store", "segment registered with UCX")
    wait_log(n, p, "store", "mounted at master")
    return p


def pypath() -> str:
    """Where this process imports kvpool from, for the clients on host B."""
    import kvpool
    return str(Path(kvpool.__file__).resolve().parent.parent)


def client(b: nethosts.Host, master: str, *args: str, timeout: float = 120) -> dict:
    script = b.dir / "client.py"
    script.write_text(SCRIPT)
    env = {"PYTHONPATH": pypath()}
    p = b.run(sys.executable, str(script), master, *args, timeout=timeout, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def ucx_bytes(out: dict) -> int:
    s = out.get("stats")
    if s is None:
        return -1
    u = s["ucx"]
    return int(u["put_bytes"]) + int(u["get_bytes"])


def test_ucx_between_hosts(lab: nethosts.Lab) -> None:
    m = lab.add_host("m", 1)
    n1, n2 = lab.add_host("n1", 11), lab.add_host("n2", 12)
    c = lab.add_host("c", 21)
    addr = master(m)
    s1 = store(n1, addr)
    store(n2, addr)

    out = client(c, addr, "sizes", "first")
    assert out["wrong"] == 0 and out["ok"] == 7 + 64, out
    assert ucx_bytes(out) > 0, out  # the bytes went through UCX, none through tcp or shm
    assert all(v == 0 for p in ("shm", "tcp") for v in out["stats"][p].values()), out

    # node 1 killed while the client puts: errors, never wrong bytes, and
    # what went to node 2 reads back
    stop = c.dir / "stop"
    with open(c.dir / "load.out", "wb") as lo:
        p = c.spawn("load", sys.executable, str(c.dir / "client.py"), addr, "load",
                    str(stop), env={"PYTHONPATH": pypath()}, stdout=lo.fileno())
    time.sleep(1.5)
    nethosts.kill(s1, signal.SIGKILL)
    time.sleep(1.5)
    stop.write_text("")
    assert nethosts.wait_exit(p, 120) == 0, (c.dir / "load.log").read_text()
    res = json.loads((c.dir / "load.out").read_text().strip().splitlines()[-1])
    print(f"load across the kill: {res}")
    assert res["wrong"] == 0 and res["ok"] > 0, res

    # node 1 back: a new segment, a new attach
    store(n1, addr)
    out = client(c, addr, "sizes", "again")
    assert out["wrong"] == 0 and out["ok"] == 7 + 64, out
