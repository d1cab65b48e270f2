"""kvpool._native's connector types (ConnRequest, ConnSched, ConnWorker) without
vLLM: the layer kvpool.vllm translates vLLM's objects into.

A prefix stored through one scheduler/worker pair is found and loaded byte-exact
by a second pair (another "engine") over a real `kvpool serve`; request state
grows only by what is new; every malformed argument is refused with a clear
Python exception and never reaches C."""
from __future__ import annotations

import ctypes
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from kvpool import _native
import kvpool_procs

NB, PAGE, BS = 32, 4096, 16


def hashes(tokens: list[int]) -> list[bytes]:
    """Chained per-block hashes (the shape of vLLM's; the values are ours)."""
    out, parent = [], b""
    for i in range(len(tokens) // BS):
        parent = hashlib.sha256(parent + bytes(str(tokens[i * BS:(i + 1) * BS]), "ascii")).digest()
        out.append(parent)
    return out


class Engine:
    """One scheduler half plus one rank-0 worker half over a host KV buffer."""

    def __init__(self, master: str, sock: Path) -> None:
        self.kv = np.zeros((NB, PAGE), dtype=np.uint8)
        base = self.kv.ctypes.data
        groups = [{"kind": "full_attention", "block_size": BS, "num_kv_heads": 2}]
        common: dict[str, Any] = {"model": "tiny", "groups": groups, "hash_block_size": BS,
                                  "block_size": BS, "lookup_socket": str(sock)}
        store = json.dumps({"master": master, "global_segment_size": "32MiB"})
        self.worker = _native.ConnWorker(dict(common, store_config=store, num_blocks=NB))
        self.worker.register_kv_caches([(base, NB * PAGE, 1, (NB, PAGE), (PAGE, 1))])
        self.sched = _native.ConnSched(common)

    def step(self, new: list[Any], cached: list[Any], finished: tuple[str, ...] = ()
             ) -> tuple[list[str], list[str]]:
        meta = self.sched.build_meta(new, cached, (), finished, ())
        return self.worker.get_finished(meta, finished)

    def wait(self, what: int, rid: str, cached: list[Any]) -> None:
        """Steps until rid is reported in done_sending (0) / done_recving (1)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if rid in self.step([], cached)[what]:
                return
            time.sleep(0.01)
        raise TimeoutError(f"{rid} not reported")

    def close(self) -> None:
        self.sched.close()
        self.worker.close()


@pytest.fixture
def engines(server: kvpool_procs.Proc) -> Iterator[tuple[Engine, Engine]]:
    with tempfile.TemporaryDirectory(prefix="kvpool-conn-") as d:
        a = Engine(server.addr, Path(d) / "a.sock")
        b = Engine(server.addr, Path(d) / "b.sock")
        yield a, b
        a.close()
        b.close()


def test_prefix_stored_by_one_engine_is_loaded_by_another(engines: tuple[Engine, Engine]) -> None:
    a, b = engines
    toks = list(range(100, 164))  # 4 blocks
    hs = hashes(toks)
    rng = np.random.default_rng(1)
    a.kv[1:5] = rng.integers(0, 256, (4, PAGE), dtype=np.uint8)  # the "forward"
    want = a.kv[1:5].copy()

    r = _native.ConnRequest("a0", 64)
    r.sync(toks, hs, 0)
    assert a.sched.lookup(r, 0) == (0, False)
    a.sched.update_state_after_alloc(r, None, 0)
    a.step([(r, 64, ([1, 2, 3, 4],))], [])
    r.sync(toks + [7], hs, 64)
    assert a.sched.request_finished("a0", ([1, 2, 3, 4],)) is True  # stores pending
    done = a.step([], [], ("a0",))[0]  # the next step carries the finished id
    if "a0" not in done:
        a.wait(0, "a0", [])
    stats = a.worker.take_stats()
    assert stats and stats["store"]["keys"] == 4 and stats["store"]["bytes"] == 4 * PAGE

    # engine b: same tokens, its own blocks 9..12 poisoned
    b.kv[9:13] = 0xA5
    q = _native.ConnRequest("b0", 64)
    q.sync(toks, hs, 0)
    n, load_async = b.sched.lookup(q, 0)
    # one token is always left to compute: the hit floors to the block below 64
    assert (n, load_async) == (48, True)
    b.sched.update_state_after_alloc(q, ([9, 10, 11, 12],), 48)
    b.step([], [])  # the load is queued in the step after the allocation
    b.wait(1, "b0", [])
    assert b.worker.load_errors() == []
    assert np.array_equal(b.kv[9:12], want[:3])  # the 3 blocks of the hit
    assert (b.kv[12] == 0xA5).all()              # the last block: computed by the engine


def test_request_state_grows_by_what_is_new() -> None:
    r = _native.ConnRequest("r", 3)
    r.sync([1, 2, 3], [b"x" * 32], 0)
    r.sync([1, 2, 3, 4, 5], [b"x" * 32, b"y" * 32], 4)
    assert (r.req_id, r.num_tokens, r.num_hashes) == ("r", 5, 2)
    r.sync((1, 2, 3, 4), [b"x" * 32], 4)  # a shorter list truncates
    assert (r.num_tokens, r.num_hashes) == (4, 1)
    with pytest.raises(ValueError, match="one length"):
        r.sync([1, 2, 3, 4], [b"x" * 32, b"z" * 16], 4)
    with pytest.raises(ValueError, match="prompt"):
        _native.ConnRequest("s", 10).sync([1, 2], [], 0)
    with pytest.raises(ValueError, match="token id"):
        _native.ConnRequest("s", 1).sync([-1], [], 0)
    with pytest.raises(TypeError):
        _native.ConnRequest("s", 1).sync(["a"], [], 0)
    with pytest.raises(ValueError):
        _native.ConnRequest("", 0)
    with pytest.raises(ValueError):
        _native.ConnRequest("a\0b", 0)


GROUP = [{"kind": "full_attention", "block_size": BS}]


@pytest.mark.parametrize("cfg, exc, msg", [
    ({"groups": GROUP, "bogus": 1}, ValueError, "unknown connector config key"),
    ({"groups": [{"kind": "chunked"}]}, ValueError, "group kind"),
    ({"groups": [{"kind": "full_attention", "size": 1}]}, ValueError, "unknown group key"),
    ({"groups": GROUP, "role": "leader"}, ValueError, "role"),
    ({"groups": GROUP, "tp_size": -1}, ValueError, "tp_size"),
    ({"groups": GROUP, "enable_lookup": 1}, TypeError, "bool"),
    ({"groups": [], "enable_lookup": False}, ValueError, "1..64"),
    ({"groups": GROUP, "fence": "opencl"}, ValueError, "fence"),
    ("groups", TypeError, "dict"),
])
def test_bad_configs_are_refused(cfg: Any, exc: type, msg: str) -> None:
    with pytest.raises(exc, match=msg):
        _native.ConnSched(cfg)


def test_open_errors_come_from_c() -> None:
    with pytest.raises(_native.OpenError):
        _native.ConnSched({"groups": GROUP, "tp_size": 2, "tp_rank": 2})
    with pytest.raises(_native.OpenError):  # lookup on without a socket
        _native.ConnSched({"groups": GROUP})


def test_bad_steps_are_refused_and_the_handle_stays_usable() -> None:
    s = _native.ConnSched({"groups": GROUP, "enable_lookup": False})
    r = _native.ConnRequest("r", 16)
    r.sync(list(range(16)), [b"h" * 32], 0)
    bad: list[tuple[Any, ...]] = [
        ([("r", 16, ([1],))], [], (), (), ()),        # not a ConnRequest
        ([(r, -1, ([1],))], [], (), (), ()),          # negative count
        ([(r, 16, ([1 << 33],))], [], (), (), ()),    # block id out of range
        ([(r, 16, [[1]] * 65)], [], (), (), ()),      # too many groups
        ([], [(r, "yes", 1, None)], (), (), ()),      # resumed must be a bool-ish, count an int
        ([], [], (1,), (), ()),                       # ids are str
        ([], [], (), (), [("r", [(0, 1)])]),          # tails are triples
    ]
    for args in bad:
        with pytest.raises((TypeError, ValueError, _native.ConnError)):
            s.build_meta(*args)
    with pytest.raises(_native.ConnError):  # not allocated: the C scheduler refuses it
        s.build_meta([(r, 16, ([1],))], [], (), (), ())
    s.update_state_after_alloc(r, None, 0)
    assert len(s.build_meta([(r, 16, ([1],))], [], (), (), ())) > 0
    assert s.request_finished("r", ([1],)) is True  # its full block is being stored
    s.close()
    with pytest.raises(_native.ConnError):
        s.lookup(r, 0)


def test_worker_refuses_unmapped_kv_memory(server: kvpool_procs.Proc) -> None:
    with tempfile.TemporaryDirectory() as d:
        w = _native.ConnWorker({
            "model": "m", "groups": GROUP, "hash_block_size": BS, "lookup_socket": f"{d}/s", "num_blocks": 4,
            "store_config": json.dumps({"master": server.addr, "global_segment_size": "16MiB"})})
        with pytest.raises(_native.ConnError):
            w.register_kv_caches([(4096, 4 * PAGE, 1, (4, PAGE), (PAGE, 1))])
        with pytest.raises(ValueError):
            w.register_kv_caches([(4096, 4 * PAGE, 0, (4, PAGE), (PAGE, 1))])
        with pytest.raises(TypeError):
            w.register_kv_caches([(4096,)])
        with pytest.raises(RuntimeError, match="fence"):
            w.set_fence_event(1, 1)
        w.close()
        with pytest.raises(_native.ConnError):
            w.get_finished(None, ())


def _junk(rng: np.random.Generator, depth: int = 0) -> Any:
    k = int(rng.integers(0, 9 if depth < 3 else 6))
    if k == 0:
        return int(rng.integers(-2**40, 2**40)) * int(rng.choice([1, 2**30]))
    if k == 1:
        return "r" if rng.random() < 0.5 else "x\0y"
    if k == 2:
        return bytes(rng.integers(0, 256, int(rng.integers(0, 70)), dtype=np.uint8))
    if k == 3:
        return None
    if k == 4:
        return bool(rng.random() < 0.5)
    if k == 5:
        return 1.5
    n = int(rng.integers(0, 5))
    items = [_junk(rng, depth + 1) for _ in range(n)]
    return tuple(items) if k == 6 else items if k == 7 else {"kind": items[0] if items else 1}


def test_random_arguments_never_crash() -> None:
    """Seeded random values in every argument position of the connector types:
    only TypeError / ValueError / OverflowError / ConnError, and the handles keep working."""
    rng = np.random.default_rng(7)
    s = _native.ConnSched({"model": "m", "groups": GROUP, "enable_lookup": False})
    r = _native.ConnRequest("r", 16)
    r.sync(list(range(16)), [b"h" * 32], 0)
    s.update_state_after_alloc(r, None, 0)
    ok = (TypeError, ValueError, OverflowError, _native.ConnError)
    calls = [
        lambda a: s.build_meta(a[0], a[1], a[2], a[3], a[4]),
        lambda a: s.build_meta([(r, a[0], a[1])], [], (), (), ()),
        lambda a: s.build_meta([], [(r, a[0], a[1], a[2])], (), (), ()),
        lambda a: s.build_meta([], [], (), (), [("r", a[0])]),
        lambda a: s.update_state_after_alloc(r, a[0], a[1]),
        lambda a: s.request_finished(a[0], a[1]),
        lambda a: s.loads_failed(a[0], a[1]),
        lambda a: _native.ConnRequest(a[0], a[1]).sync(a[2], a[3], a[4]),
        lambda a: _native.ConnSched(a[0]),
    ]
    for i in range(3000):
        args = [_junk(rng) for _ in range(5)]
        try:
            calls[i % len(calls)](args)
        except ok:
            pass
    assert len(s.build_meta([], [], (), (), ())) > 0
    s.close()


def test_cuda_fence_needs_the_driver(server: kvpool_procs.Proc) -> None:
    """fence='cuda' loads libcuda.so.1 at run time; without a driver the worker
    refuses to open with a message (a GPU machine runs make test-gpu instead)."""
    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is present: the refusal cannot be observed here")
    except OSError:
        pass
    with tempfile.TemporaryDirectory() as d, pytest.raises(RuntimeError, match="CUDA driver"):
        _native.ConnWorker({
            "model": "m", "groups": GROUP, "lookup_socket": f"{d}/s", "num_blocks": 4,
            "fence": "cuda",
            "store_config": json.dumps({"master": server.addr, "global_segment_size": "16MiB"})})


def test_lookup_gid_sets_the_socket_group(server: kvpool_procs.Proc) -> None:
    """lookup_gid: the lookup socket is 0660 of that group; without it 0600;
    a negative or out-of-range gid is refused."""
    import os
    import stat

    def worker(d: str, **extra: Any) -> Any:
        return _native.ConnWorker({
            "model": "m", "groups": GROUP, "hash_block_size": BS, "lookup_socket": f"{d}/s",
            "num_blocks": 4, **extra,
            "store_config": json.dumps({"master": server.addr, "global_segment_size": "16MiB"})})

    with tempfile.TemporaryDirectory() as d:
        w = worker(d, lookup_gid=os.getgid())
        st = os.lstat(f"{d}/s")
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
        w.close()
        w = worker(d)
        assert stat.S_IMODE(os.lstat(f"{d}/s").st_mode) == 0o600
        w.close()
        for bad in (-1, 1 << 32):
            with pytest.raises(ValueError):
                worker(d, lookup_gid=bad)
