"""Real kvpool processes for the Python tests: `kvpool serve` / `kvpool master`
on 127.0.0.1 at a free port (port 0 + --port-file), killed at the end.

The binary is $KVPOOL_BIN (make test sets it to the ASan build), else
build/kvpool. The Python package is imported from python/ (make python)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


def kvpool_bin() -> str:
    b = os.environ.get("KVPOOL_BIN") or str(ROOT / "build" / "kvpool")
    return b if os.path.isabs(b) else str(ROOT / b)


def free_ports(n: int) -> list[int]:
    """n ports free on 127.0.0.1 now (for programs without a --port-file)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_listening(port: int, proc: "subprocess.Popen[bytes]", deadline: float, what: str) -> None:
    """Returns once something accepts on 127.0.0.1:port; raises if proc exits
    first or time.monotonic() passes deadline."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"{what} did not start listening on 127.0.0.1:{port}")


def server_env() -> dict[str, str]:
    """The environment for a kvpool process: ours, without LD_PRELOAD (vLLM's CPU
    platform preloads allocators into its own environment; the ASan build must
    come first in the library list)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1")
    return env


class Proc:
    """A kvpool subcommand listening on 127.0.0.1; .addr is host:port."""

    def __init__(self, sub: str, *args: str, timeout_s: float = 20.0,
                 listen: str = "127.0.0.1:0") -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kvpool-py-")
        pf = Path(self._dir.name) / "port"
        self.log_path = Path(self._dir.name) / "log"
        self._log = open(self.log_path, "wb")
        env = server_env()
        self.proc = subprocess.Popen(
            [kvpool_bin(), sub, "--listen", listen, "--port-file", str(pf), *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kvpool {sub} exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            if pf.exists() and pf.read_text().strip():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"kvpool {sub} did not start")
            time.sleep(0.02)
        self.port = int(pf.read_text().strip())
        self.addr = f"127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        """Stops the process (SIGTERM, then SIGKILL after 10 s); its exit code."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        rc = self.proc.returncode
        self._dir.cleanup()
        return rc


class Store(Proc):
    """A `kvpool store` (a storage node) of the master at master_addr, returned
    once its segment is mounted there (it has no --port-file: its log says)."""

    def __init__(self, master_addr: str, *args: str, timeout_s: float = 20.0) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kvpool-py-")
        self.log_path = Path(self._dir.name) / "log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [kvpool_bin(), "store", "--listen", "127.0.0.1:0", "--master", master_addr, *args],
            stdout=self._log, stderr=subprocess.STDOUT, env=server_env(), start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while b"mounted at master" not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log_path.read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"kvpool store did not mount: {log}")
            time.sleep(0.05)
        self.addr = ""


def serve(segment_size: str = "256MiB", *extra: str, listen: str = "127.0.0.1:0") -> Proc:
    """`kvpool serve` (a master and a storage node); listen: a fixed address
    (a pool restarted where its clients know it), else a free port."""
    return Proc("serve", "--segment-size", segment_size, *extra, listen=listen)


def master(*extra: str) -> Proc:
    return Proc("master", *extra)


def etcd(data_dir: Path) -> tuple["subprocess.Popen[bytes]", str]:
    """A one-member etcd on loopback at free ports, data in data_dir (Debian's
    etcd-server, installed by scripts/install-deps); returns it once it
    listens, with its client URL. Stop it with .terminate() and .wait()."""
    import shutil
    exe = shutil.which("etcd")
    if exe is None:
        raise RuntimeError("etcd is not installed (scripts/install-deps installs etcd-server)")
    cport, pport = free_ports(2)
    curl, purl = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    e = subprocess.Popen([exe, "--name", "kvp", "--data-dir", str(data_dir),
                          "--listen-client-urls", curl, "--advertise-client-urls", curl,
                          "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                          "--initial-cluster", f"kvp={purl}", "--log-level", "error"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(cport, e, time.monotonic() + 20, "etcd")
    except Exception:
        e.kill()
        e.wait()
        raise
    return e, curl
