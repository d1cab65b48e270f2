"""Fixtures of the Python tests: real `kvpool serve` / `kvpool master`
processes (tests/python/kvpool_procs.py) and clients of them."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))  # kvpool from the tree (make python)
sys.path.insert(0, str(HERE))

import kvpool  # noqa: E402
import kvpool_procs  # noqa: E402


@pytest.fixture(scope="module")
def server() -> Iterator[kvpool_procs.Proc]:
    """One `kvpool serve` (master + a 256 MiB segment) per test module."""
    p = kvpool_procs.serve("256MiB")
    yield p
    p.stop()


@pytest.fixture
def client(server: kvpool_procs.Proc) -> Iterator[kvpool.Client]:
    """A standalone client of `server`; its tenant is emptied afterwards."""
    c = kvpool.Client({"master": server.addr, "mode": "standalone-store"})
    yield c
    if not c.closed:
        c.remove_all(force=True)
        c.close()


@pytest.fixture
def master() -> Iterator[kvpool_procs.Proc]:
    """A `kvpool master` without storage: clients bring embedded segments."""
    p = kvpool_procs.master("--lease-ttl", "30s", "--client-ttl", "60s")
    yield p
    p.stop()
