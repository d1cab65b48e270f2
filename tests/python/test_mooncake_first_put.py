"""The first put after a MooncakeDistributedStore's setup succeeds: repeated
fresh setups, and a pool where an earlier process exited without closing
its store (Mooncake's own suites never close their class stores), whose
segment the master still lists until client_ttl drops it. Real `kvpool
master` and store processes on 127.0.0.1; nothing mocked."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

import kvpool
import kvpool_procs

kvpool.install_as_mooncake()
from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: E402

MiB = 1 << 20
ROUNDS = 20


@pytest.fixture
def master() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.master("--client-ttl", "60s", "--lease-ttl", "1s")
    yield p
    p.stop()


def setup(addr: str, segment: int) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "P2PHANDSHAKE", segment, 16 * MiB, "tcp", "", addr) == 0
    return s


def test_first_put_after_setup_repeated(master: kvpool_procs.Proc) -> None:
    for i in range(ROUNDS):
        s = setup(master.addr, 64 * MiB)
        try:
            value = bytes([i]) * 4096
            assert s.put(f"first/{i}", value) == 0, f"round {i}"
            assert s.get(f"first/{i}") == value
        finally:
            s.close()


def exit_without_close(addr: str, segment: int) -> None:
    """A process that sets up an embedded store, puts, and exits without
    close(): its segment stays mounted at the master."""
    code = textwrap.dedent(f"""
        import os, kvpool
        kvpool.install_as_mooncake()
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        assert s.setup("localhost", "P2PHANDSHAKE", {segment}, {16 * MiB}, "tcp", "", "{addr}") == 0
        assert s.put("gone/" + str(os.getpid()), b"v" * 1000) == 0
        os._exit(0)
    """)
    env = dict(kvpool_procs.server_env())
    env["PYTHONPATH"] = str(kvpool_procs.ROOT / "python")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)


def test_first_puts_avoid_the_segment_of_a_process_gone_without_close(
        master: kvpool_procs.Proc) -> None:
    live = setup(master.addr, 64 * MiB)
    try:
        for _ in range(2):  # the largest segments: placement's first choice
            exit_without_close(master.addr, 512 * MiB)
        two = ReplicateConfig()
        two.replica_num = 2
        for i in range(ROUNDS):
            c = setup(master.addr, 0)  # a client without a segment of its own
            try:
                assert c.put(f"after/{i}", b"x" * 8192) == 0, f"round {i}"
                assert c.put(f"after2/{i}", b"y" * 8192, two) == 0, f"round {i}"
                assert c.get(f"after/{i}") == b"x" * 8192
                assert c.get(f"after2/{i}") == b"y" * 8192
            finally:
                c.close()
    finally:
        live.close()
