"""Fixtures of the SGLang tests: SGLang 0.5.23's real modules
(scripts/sglang-env), kvpool standing in for Mooncake, and `kvpool serve`
on 127.0.0.1 with its HTTP endpoint (kvpool_procs)."""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import kvpool  # noqa: E402
import kvpool_procs  # noqa: E402

# SGLang's backend imports mooncake.store when it is built: ours, in this process
kvpool.install_as_mooncake()


class Pool:
    """`kvpool serve`: .addr the master, .http_port its endpoint."""

    def __init__(self, proc: kvpool_procs.Proc, http_port: int) -> None:
        self.proc, self.addr, self.http_port = proc, proc.addr, http_port

    def segments(self) -> str:
        url = f"http://127.0.0.1:{self.http_port}/get_all_segments"
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()


@pytest.fixture(scope="session")
def pool() -> Iterator[Pool]:
    (http,) = kvpool_procs.free_ports(1)
    p = kvpool_procs.serve("256MiB", "--http", f"127.0.0.1:{http}")
    yield Pool(p, http)
    p.stop()
