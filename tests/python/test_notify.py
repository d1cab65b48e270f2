"""Readiness notification: `kvpool serve` and `kvpool master` under a
NOTIFY_SOCKET the test binds send READY=1 once serving and STOPPING=1 after
SIGTERM (the sd_notify protocol that systemd's Type=notify waits for)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import kvpool_procs
from kvpool_procs import kvpool_bin, server_env


def _run_until_ready(args: list[str], notify_addr: str, sock: socket.socket) -> list[str]:
    """Starts kvpool with NOTIFY_SOCKET=notify_addr, waits for READY=1,
    sends SIGTERM, and returns every datagram received until it exited."""
    env = server_env()
    env["NOTIFY_SOCKET"] = notify_addr
    with tempfile.TemporaryDirectory(prefix="kvpool-notify-") as d:
        log = Path(d) / "log"
        with open(log, "wb") as lf:
            p = subprocess.Popen([kvpool_bin(), *args], stdout=lf, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        got: list[str] = []
        try:
            sock.settimeout(30)
            while "READY=1" not in "\n".join(got).split("\n"):
                got.append(sock.recv(4096).decode())
            os.killpg(p.pid, signal.SIGTERM)
            rc = p.wait(20)
            sock.settimeout(0.5)
            try:
                while True:
                    got.append(sock.recv(4096).decode())
            except TimeoutError:
                pass
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        assert rc == 0, log.read_text(errors="replace")[-2000:]
        return got


def test_serve_notifies_ready_then_stopping() -> None:
    with tempfile.TemporaryDirectory(prefix="kvpool-notify-") as d:
        path = str(Path(d) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(path)
            got = _run_until_ready(["serve", "--listen", "127.0.0.1:0", "--segment-size",
                                    "64MiB", "--unix-dir", str(Path(d) / "run")], path, s)
    assert got == ["READY=1", "STOPPING=1"], got


def test_master_notifies_on_abstract_socket() -> None:
    name = f"kvpool-notify-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        got = _run_until_ready(["master", "--listen", "127.0.0.1:0"], "@" + name, s)
    assert got == ["READY=1", "STOPPING=1"], got


def test_bad_notify_socket_does_not_stop_serving() -> None:
    """A malformed NOTIFY_SOCKET is no supervisor: the server serves anyway."""
    env = server_env()
    env["NOTIFY_SOCKET"] = "relative/notify"
    with tempfile.TemporaryDirectory(prefix="kvpool-notify-") as d:
        pf = Path(d) / "port"
        p = subprocess.Popen([kvpool_bin(), "master", "--listen", "127.0.0.1:0",
                              "--port-file", str(pf)], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(400):
                if pf.exists() and pf.read_text().strip():
                    break
                assert p.poll() is None
                subprocess.run(["sleep", "0.05"], check=True)
            socket.create_connection(("127.0.0.1", int(pf.read_text())), timeout=5).close()
            os.killpg(p.pid, signal.SIGTERM)
            assert p.wait(20) == 0
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_etcd_standby_is_ready_once_it_campaigns(tmp_path: Path) -> None:
    """With etcd, a master serves its role as soon as it campaigns: the
    leader and a standby both send READY=1 (the standby with its STATUS)."""
    e, curl = kvpool_procs.etcd(tmp_path / "etcd")
    masters: list[subprocess.Popen[bytes]] = []
    try:
        socks = []
        for i in range(2):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            s.bind(str(tmp_path / f"notify{i}"))
            s.settimeout(30)
            socks.append(s)
            env = server_env()
            env["NOTIFY_SOCKET"] = str(tmp_path / f"notify{i}")
            masters.append(subprocess.Popen(
                [kvpool_bin(), "master", "--listen", "127.0.0.1:0", "--etcd", curl,
                 "--cluster", "notify"], env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            first = socks[i].recv(4096).decode().split("\n")
            assert first == ["READY=1", "STATUS=standby: campaigning"], first
        # one of them wins and says so; the other stays a ready standby
        statuses: list[str] = []
        for s in socks:
            s.settimeout(0.3)
        deadline = time.monotonic() + 20
        while "STATUS=leader" not in statuses and time.monotonic() < deadline:
            for s in socks:
                try:
                    statuses.append(s.recv(4096).decode())
                except TimeoutError:
                    pass
        assert statuses.count("STATUS=leader") == 1, statuses
        for m in masters:
            os.killpg(m.pid, signal.SIGTERM)
            assert m.wait(30) == 0
        for s in socks:
            s.settimeout(5)
            rest = []
            try:
                while True:
                    rest.append(s.recv(4096).decode())
            except TimeoutError:
                pass
            assert rest[-1:] == ["STOPPING=1"], rest
            s.close()
    finally:
        for m in masters:
            if m.poll() is None:
                os.killpg(m.pid, signal.SIGKILL)
                m.wait()
        e.kill()
        e.wait()
