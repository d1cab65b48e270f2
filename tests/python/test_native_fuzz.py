"""Randomised hostile arguments for every kvpool._native method (a seeded
fuzz loop over the C argument parser): each call returns or raises a Python
exception; the process never crashes, and stored data stays intact."""
from __future__ import annotations

import random
from typing import Any, Callable

import numpy as np

import kvpool
import kvpool_procs

_native = kvpool._native


def junk(rng: random.Random, depth: int = 0) -> Any:
    """A random Python value: ints of every size and sign, strings with NULs,
    buffers, None, floats, and nested lists / tuples / dicts."""
    pick = rng.randrange(14 if depth < 2 else 10)
    if pick == 0:
        return rng.choice([0, 1, -1, 2**31, 2**63 - 1, 2**63, 2**64, -2**70, 4096])
    if pick == 1:
        return rng.randrange(-10, 1 << 20)
    if pick == 2:
        return "".join(rng.choice("ab/\0é") for _ in range(rng.randrange(0, 8)))
    if pick == 3:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 16)))
    if pick == 4:
        return bytearray(rng.randrange(0, 64))
    if pick == 5:
        return memoryview(b"x" * rng.randrange(0, 32))
    if pick == 6:
        return np.zeros(rng.randrange(0, 40), dtype=rng.choice([np.uint8, np.float32]))
    if pick == 7:
        return None
    if pick == 8:
        return rng.choice([1.5, float("nan"), True, object()])
    if pick == 9:
        return np.zeros((4, 4), dtype=np.uint8)[:, ::2]  # not contiguous
    n = rng.randrange(0, 5)
    if pick == 10:
        return [junk(rng, depth + 1) for _ in range(n)]
    if pick == 11:
        return tuple(junk(rng, depth + 1) for _ in range(n))
    if pick == 12:
        return {rng.choice(["k", 1, b"b"]): junk(rng, 2)}
    return [[junk(rng, depth + 2) for _ in range(rng.randrange(0, 3))] for _ in range(n)]


def test_native_methods_survive_hostile_arguments(server: kvpool_procs.Proc) -> None:
    c = _native.Client(f'{{"master": "{server.addr}", "mode": "standalone-store"}}')
    # the canary lives in another tenant: nothing the fuzzed client does may touch it
    keeper = _native.Client(f'{{"master": "{server.addr}", "mode": "standalone-store", '
                            f'"tenant": "fuzz-canary"}}')
    canary = b"canary" * 1000
    assert keeper.put_buffers(["fz/canary"], [canary]) == [len(canary)]
    reg = np.zeros(1 << 16, dtype=np.uint8)
    assert c.register_buffer(reg.ctypes.data, reg.nbytes) == 0
    rng = random.Random(20261201)
    methods: list[Callable[..., Any]] = [
        c.put_buffers, c.put_ptrs, c.get_buffers, c.get_ptrs, c.get_bytes, c.exist, c.sizes,
        c.prefix, c.remove, c.remove_all, c.describe, c.register_buffer, c.unregister_buffer,
        c.check_registered, c.remove_regex,
    ]
    outcomes = {"returned": 0, "raised": 0}
    for i in range(3000):
        fn = methods[i % len(methods)]
        args = [junk(rng) for _ in range(rng.randrange(0, 4))]
        if fn in (c.put_ptrs, c.get_ptrs) and rng.random() < 0.5:
            base = reg.ctypes.data  # addresses near the registered range
            args = [["fz/p"], [[base + rng.randrange(-8, 1 << 16)]], [[rng.randrange(-1, 64)]]]
        try:
            fn(*args)
            outcomes["returned"] += 1
        except (TypeError, ValueError, OverflowError, SystemError, BufferError, MemoryError):
            outcomes["raised"] += 1
    assert outcomes["returned"] > 100 and outcomes["raised"] > 100
    assert keeper.get_bytes(["fz/canary"]) == [canary]
    assert c.get_bytes(["fz/p"])[0] in (-704,) or isinstance(c.get_bytes(["fz/p"])[0], bytes)
    c.unregister_buffer(reg.ctypes.data)  # may already be gone: the fuzz loop calls it too
    c.remove_all(True)
    keeper.remove_all(True)
    c.close()
    keeper.close()


def test_xfer_queue_survives_hostile_arguments(server: kvpool_procs.Proc) -> None:
    """XferQueue (kvpool.vllm_tier's transfer queue): hostile submits are refused
    (an exception, or a negative code for a range outside registered memory) and
    never write outside it; every job it took is polled once; close is final."""
    c = _native.Client(f'{{"master": "{server.addr}", "mode": "standalone-store"}}')
    reg = np.zeros(1 << 16, dtype=np.uint8)
    guard = np.zeros(1 << 12, dtype=np.uint8)  # unregistered: must stay zero
    assert c.register_buffer(reg.ctypes.data, reg.nbytes) == 0
    for bad in ((), (c, 0), (c, 65), (object(),), (c, "4")):
        try:
            _native.XferQueue(*bad)
            raise AssertionError(f"XferQueue{bad!r} accepted")
        except (TypeError, ValueError):
            pass
    q = _native.XferQueue(c, 2)
    rng = random.Random(20261207)
    base = reg.ctypes.data
    taken = set()
    for i in range(2000):
        if rng.random() < 0.5:
            n = rng.randrange(0, 4)
            args = [i, rng.choice(["put", "get", "del", ""]), [f"fz/x{rng.randrange(8)}"] * n,
                    [base + rng.randrange(-64, 1 << 16) for _ in range(n)],
                    rng.choice([1, 64, 4096, 1 << 16, 0, -1])]
            if rng.random() < 0.1:
                args[3] = [guard.ctypes.data] * n
        else:
            args = [junk(rng) for _ in range(rng.randrange(0, 6))]
        try:
            if q.submit(*args) == 0:
                taken.add(args[0])
        except (TypeError, ValueError, OverflowError, SystemError, BufferError, MemoryError):
            pass
        if i % 100 == 0:
            for job in q.poll():
                taken.discard(job[0])
    q.drain()
    for job in q.poll():
        taken.discard(job[0])
    assert not taken and q.pending() == 0
    assert not guard.any()
    q.close()
    q.close()
    for fn in (q.poll, q.pending, q.drain):
        try:
            fn()
            raise AssertionError("a closed XferQueue answered")
        except ValueError:
            pass
    # the client closed under a queue: jobs fail with CLOSED, nothing crashes
    q2 = _native.XferQueue(c, 1)
    assert q2.submit(1, "put", ["fz/late"], [base], 64) == 0
    c.remove_all(True)
    c.close()
    rc = q2.submit(2, "put", ["fz/later"], [base], 64)
    assert rc == kvpool.codes["CLOSED"]
    q2.drain()
    assert all(r in (64, 0, kvpool.codes["CLOSED"]) for job in q2.poll() for r in job[2])
    del q2
