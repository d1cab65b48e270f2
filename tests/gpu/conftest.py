"""Fixtures of the GPU tests (make test-gpu): torch CUDA tensors against a
real `kvpool serve` (tests/python/kvpool_procs.py starts it on a free port).

Every test skips, with the reason, when torch, a CUDA device or
kvpool._native (make python) is missing. KVPOOL_GPU_TEST_DEVICE=cpu runs the
same tests on CPU tensors instead (no fence, no pinned memory): a dry run of
the tests' own logic on a machine without a GPU (scripts/gpu-check --fake)."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))          # kvpool from the tree (make python)
sys.path.insert(0, str(ROOT / "tests" / "python"))  # kvpool_procs
sys.path.insert(0, str(HERE))

import kvpool_procs  # noqa: E402

DRY = os.environ.get("KVPOOL_GPU_TEST_DEVICE", "") == "cpu"


def _torch() -> Any:
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip
        pytest.skip(f"torch is not importable by {sys.executable}: {e}")
    return torch


def _kvpool() -> Any:
    try:
        import kvpool
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"kvpool._native is not built for {sys.executable} (make python): {e}")
    return kvpool


@pytest.fixture(scope="session")
def dev() -> Any:
    """The device the "device" tensors live on: cuda:0 (or cpu in a dry run)."""
    torch = _torch()
    _kvpool()
    if DRY:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) "
                    "sees none")
    torch.cuda.init()
    return torch.device("cuda", 0)


@pytest.fixture(scope="session")
def server(dev: Any) -> Iterator[kvpool_procs.Proc]:
    """One `kvpool serve` (master + a 1 GiB segment) for the session."""
    p = kvpool_procs.serve("1GiB")
    yield p
    p.stop()


def open_client(addr: str, transport: str) -> Any:
    """A standalone client of addr; transport "tcp": KVPOOL_FORCE_TCP=1 at open."""
    kvpool = _kvpool()
    old = os.environ.pop("KVPOOL_FORCE_TCP", None)
    if transport == "tcp":
        os.environ["KVPOOL_FORCE_TCP"] = "1"
    try:
        return kvpool.Client({"master": addr, "mode": "standalone-store"})
    finally:
        os.environ.pop("KVPOOL_FORCE_TCP", None)
        if old is not None:
            os.environ["KVPOOL_FORCE_TCP"] = old


@pytest.fixture(params=["shm", "tcp"])
def client(request: Any, server: kvpool_procs.Proc) -> Iterator[Any]:
    """A client over shared memory or over loopback TCP; emptied afterwards."""
    c = open_client(server.addr, request.param)
    c.transport = request.param
    yield c
    if not c.closed:
        c.remove_all(force=True)
        c.close()
