"""Network namespaces for tests that run kvpool as on other hosts, or at the
default address 127.0.0.1:50051 without touching the machine's own: made
with `ip netns add`, emptied and deleted at the end (root only)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time


def unavailable() -> str:
    """Why namespaces cannot be made here, or "" when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2's ip is not installed"
    return ""


def add(name: str) -> None:
    """A namespace with only `lo`, up."""
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=30)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True,
                   capture_output=True, timeout=30)


def pids(name: str) -> list[int]:
    p = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def stop_all(name: str, wait_s: float = 5.0) -> None:
    """SIGTERM to every process in the namespace, then SIGKILL to what is
    left, each followed by a bounded wait for them to be gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids(name):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while pids(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not pids(name):
            return


def delete(name: str) -> None:
    """Stops everything in the namespace and deletes it."""
    stop_all(name)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
