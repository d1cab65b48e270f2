"""kvpool.Client (the Pythonic API) against a real `kvpool serve`.

Every method, every buffer type, registered addresses, per-key batch
results, exceptions with .code / .name, bad input (never a crash), threads
sharing one client with the GIL released, close with calls in flight."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import threading
import time
from typing import Any

import numpy as np
import pytest

import kvpool
import kvpool_procs

KiB = 1 << 10
MiB = 1 << 20


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# ------------------------------------------------------------------ errors

def test_error_table_and_subclasses() -> None:
    assert kvpool.codes["OBJECT_NOT_FOUND"] == -704
    assert kvpool.codes["NO_AVAILABLE_HANDLE"] == -200
    e = kvpool.Error.from_code(-704)
    assert isinstance(e, kvpool.ObjectNotFoundError) and isinstance(e, KeyError)
    assert (e.code, e.name) == (-704, "OBJECT_NOT_FOUND")
    assert "object not found" in str(e)
    assert isinstance(kvpool.Error.from_code(-901), TimeoutError)
    assert isinstance(kvpool.Error.from_code(-600), ValueError)
    assert isinstance(kvpool.Error.from_code(-200), kvpool.NoSpaceError)
    assert isinstance(kvpool.Error.from_code(-801), kvpool.ChecksumMismatchError)
    odd = kvpool.Error.from_code(-12345)
    assert type(odd) is kvpool.Error and odd.code == -12345


def test_open_errors_name_the_problem() -> None:
    with pytest.raises(kvpool.ConfigError) as ei:
        kvpool.Client({"mode": "standalone-store", "no_such_key": 1})
    assert "no_such_key" in str(ei.value)
    with pytest.raises(kvpool.ConnectionError):
        kvpool.Client({"master": "127.0.0.1:1", "mode": "standalone-store",
                       "rpc_timeout": "300ms"})
    with pytest.raises(TypeError):
        kvpool.Client(42)  # type: ignore[arg-type]


def test_config_forms(server: kvpool_procs.Proc, tmp_path: Any,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"master": server.addr, "mode": "standalone-store"}
    with kvpool.Client(json.dumps(cfg)) as c:
        c.put("cfg/json", b"1")
    path = tmp_path / "kvpool.json"
    path.write_text(json.dumps(cfg))
    with kvpool.Client(str(path)) as c:
        assert c.get("cfg/json") == b"1"
    with kvpool.Client(path) as c:
        assert c.exist("cfg/json")
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    with kvpool.Client() as c:  # from the environment
        assert c.get("cfg/json") == b"1"
        c.remove_all(force=True)


# ---------------------------------------------------------- single values

def test_put_get_every_buffer_type(client: kvpool.Client) -> None:
    raw = pattern(10_000, 1)
    values: dict[str, Any] = {
        "bytes": raw, "bytearray": bytearray(raw), "memoryview": memoryview(raw)[100:5100],
        "numpy": np.frombuffer(raw, dtype=np.uint8).reshape(100, 100),
        "numpy_f32": np.arange(1000, dtype=np.float32),
    }
    for name, v in values.items():
        client.put(f"t/{name}", v)
        assert client.get(f"t/{name}") == bytes(memoryview(v).cast("B"))
        assert client.size(f"t/{name}") == memoryview(v).nbytes


def test_keys_are_immutable_first_writer_wins(client: kvpool.Client) -> None:
    client.put("imm", b"first")
    client.put("imm", b"second value")
    assert client.get("imm") == b"first"


def test_get_into_buffers(client: kvpool.Client) -> None:
    v = pattern(4096, 2)
    client.put("gi", v)
    out = bytearray(8192)
    assert client.get_into("gi", out) == 4096
    assert bytes(out[:4096]) == v and out[4096:] == bytes(4096)
    arr = np.zeros(4096, dtype=np.uint8)
    assert client.get_into("gi", arr) == 4096 and arr.tobytes() == v
    with pytest.raises(kvpool.BufferTooSmallError):
        client.get_into("gi", bytearray(100))
    with pytest.raises(TypeError):
        client.get_into("gi", b"read-only bytes")  # not writable
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.get_into("gi/none", out)
    # pieces: filled in order
    a, b = bytearray(1000), bytearray(3096)
    assert client.get_into("gi", [a, b]) == 4096
    assert bytes(a) + bytes(b) == v


def test_missing_and_invalid_keys(client: kvpool.Client) -> None:
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.get("nope")
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.size("nope")
    with pytest.raises(kvpool.ObjectNotFoundError):
        client.remove("nope")
    assert client.exist("nope") is False
    with pytest.raises(kvpool.InvalidKeyError):
        client.put("", b"x")
    with pytest.raises(kvpool.InvalidKeyError):
        client.put("nul\0inside", b"x")
    with pytest.raises(kvpool.InvalidParamsError):
        client.put("empty", b"")
    with pytest.raises(TypeError):
        client.put(123, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.put("str-value", "text")
    client.put(b"bytes-key", b"ok")  # bytes keys are accepted
    assert client.get("bytes-key") == b"ok"


def test_multi_buffer_put(client: kvpool.Client) -> None:
    parts = [pattern(100, 3), bytearray(pattern(5000, 4)), np.arange(10, dtype=np.int64)]
    client.put("mb", parts)
    assert client.get("mb") == b"".join(bytes(memoryview(p).cast("B")) for p in parts)


# ------------------------------------------------------------------ batches

def test_batches_answer_per_key(client: kvpool.Client) -> None:
    keys = [f"b/{i}" for i in range(100)]
    vals = [pattern(1 + i * 37, i) for i in range(100)]
    assert client.put_batch(keys, vals) == [None] * 100
    got = client.get_batch(keys + ["b/missing"])
    assert got[:100] == vals
    assert isinstance(got[100], kvpool.ObjectNotFoundError)
    assert client.exist_batch(["b/0", "b/x", "b/99"]) == [True, False, True]
    sizes = client.size_batch(["b/1", "b/x"])
    assert sizes[0] == 38 and isinstance(sizes[1], kvpool.ObjectNotFoundError)
    assert client.prefix(["b/0", "b/1", "b/x", "b/2"]) == 2
    bufs = [bytearray(len(v)) for v in vals[:3]] + [bytearray(10)]
    res = client.get_into_batch(keys[:3] + ["b/none"], bufs)
    assert res[:3] == [len(v) for v in vals[:3]]
    assert isinstance(res[3], kvpool.ObjectNotFoundError)
    assert [bytes(b) for b in bufs[:3]] == vals[:3]
    mixed = client.put_batch(["b/new", "", "b/empty"], [b"n", b"x", b""])
    assert mixed[0] is None
    assert isinstance(mixed[1], kvpool.InvalidKeyError)
    assert isinstance(mixed[2], kvpool.InvalidParamsError)
    rm = client.remove_batch(["b/0", "b/x"])
    assert rm[0] is None and isinstance(rm[1], kvpool.ObjectNotFoundError)


def test_large_batch_parsed_in_c(client: kvpool.Client) -> None:
    n = 5000
    keys = [f"big/{i}" for i in range(n)]
    assert client.put_batch(keys, [b"v"] * n) == [None] * n
    t0 = time.perf_counter()
    res = client.exist_batch(keys)
    elapsed = time.perf_counter() - t0
    assert res == [True] * n
    assert elapsed < 5.0  # a sanity bound only; the figure lives in make bench
    with pytest.raises(ValueError):
        client.put_batch(keys, [b"v"])  # mismatched lengths
    with pytest.raises(TypeError):
        client.exist_batch("big/0")  # one string is not a list of keys


# ------------------------------------------------------ registered memory

def test_registered_addresses(client: kvpool.Client) -> None:
    buf = np.zeros(1 * MiB, dtype=np.uint8)
    base = buf.ctypes.data
    src = pattern(64 * KiB, 5)
    buf[:len(src)] = np.frombuffer(src, dtype=np.uint8)
    with pytest.raises(kvpool.InvalidParamsError):  # not registered yet
        client.put_from("addr/a", base, 100)
    client.register_buffer(buf)  # a numpy array: its address and size
    with pytest.raises(kvpool.InvalidParamsError):  # overlapping registration
        client.register_buffer(base + 10, 100)
    client.put_from("addr/a", base + 7, 1000)
    assert client.get("addr/a") == src[7:1007]
    res = client.put_from_batch(["addr/b", "addr/c", "addr/out"],
                                [[base, base + 5000], base + 100, base + MiB - 10],
                                [[10, 20], 50, 100])
    assert res[0] is None and res[1] is None
    assert isinstance(res[2], kvpool.InvalidParamsError)  # runs past the registered range
    assert client.get("addr/b") == src[:10] + src[5000:5020]
    off = 512 * KiB
    assert client.get_into_ptr("addr/a", base + off, 2000) == 1000
    assert buf[off:off + 1000].tobytes() == src[7:1007]
    got = client.get_into_ptr_batch(["addr/c", "addr/a"], [[base + off, base + off + 10], 0],
                                    [[10, 40], 1000])
    assert got[0] == 50 and isinstance(got[1], kvpool.InvalidParamsError)
    with pytest.raises(ValueError):
        client.put_from("addr/neg", base, -1)
    with pytest.raises(ValueError):
        client.put_from_batch(["x"], [[base, base]], [[1]])  # shapes differ
    client.unregister_buffer(buf)
    with pytest.raises(kvpool.InvalidParamsError):
        client.unregister_buffer(base)
    with pytest.raises(kvpool.InvalidParamsError):
        client.get_into_ptr("addr/a", base, 1000)


def test_ctypes_memory(client: kvpool.Client) -> None:
    raw = ctypes.create_string_buffer(4096)
    addr = ctypes.addressof(raw)
    client.register_buffer(addr, 4096)
    raw[0:5] = b"hello"
    client.put_from("ct", addr, 5)
    assert client.get("ct") == b"hello"
    client.unregister_buffer(addr)


TORCH_PROGRAM = """
import sys, torch, kvpool
c = kvpool.Client({"master": sys.argv[1], "mode": "standalone-store"})
t = torch.arange(1000, dtype=torch.bfloat16)
c.put("torch/t", t)
out = torch.zeros(1000, dtype=torch.bfloat16)
assert c.get_into("torch/t", out) == 2000 and torch.equal(t, out)
c.put("torch/parts", [torch.ones(3, dtype=torch.int64), torch.zeros(2)])
assert c.get("torch/parts") == torch.ones(3, dtype=torch.int64).numpy().tobytes() + bytes(8)
try:
    c.put("torch/nc", torch.ones(4, 4)[:, :2])
    raise SystemExit("a non-contiguous tensor was accepted")
except kvpool.InvalidParamsError:
    pass
c.register_buffer(out)  # a tensor's own address and size
c.put_from("torch/addr", out.data_ptr(), 64)
assert c.get("torch/addr") == out.view(torch.uint8).numpy().tobytes()[:64]
c.unregister_buffer(out)
c.remove_all(force=True)
c.close()
print("TORCH-OK")
"""


def test_torch_cpu_tensors(server: kvpool_procs.Proc) -> None:
    """CPU torch tensors as values, destinations and registered memory. Runs
    in this interpreter when torch is installed, else in the vLLM venv's
    (scripts/vllm-env's cache, ~/.cache/kvpool/venv-vllm) when that exists."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    try:
        import torch  # noqa: F401
        python = sys.executable
    except ImportError:
        venv = Path(os.environ.get("KVPOOL_VLLM_VENV", Path.home() / ".cache/kvpool/venv-vllm"))
        python = str(venv / "bin" / "python")
        if not Path(python).exists():
            pytest.skip("torch is not installed here (it comes with the vLLM venv of scripts/vllm-env)")
    env = dict(os.environ, PYTHONPATH=str(kvpool_procs.ROOT / "python"))
    r = subprocess.run([python, "-c", TORCH_PROGRAM, server.addr], capture_output=True,
                       text=True, timeout=180, env=env)
    if r.returncode != 0 and "No module named 'torch'" in r.stderr:
        pytest.skip(f"torch is not importable by {python}")
    assert r.returncode == 0 and "TORCH-OK" in r.stdout, r.stdout + r.stderr[-3000:]


# ------------------------------------------------------------- metadata

def test_remove_regex_all_describe_stat(client: kvpool.Client) -> None:
    for i in range(5):
        client.put(f"rx/{i}", b"r")
    client.put("keep", b"k")
    assert client.remove_regex("^rx/[0-2]$") == 3
    assert client.remove_regex("rx/") == 2
    with pytest.raises(kvpool.InvalidParamsError):
        client.remove_regex("(")
    d = client.describe("keep")
    assert d["key"] == "keep" and d["size"] == 1
    assert len(d["replicas"]) == 1
    r = d["replicas"][0]
    assert r["tier"] == "dram" and r["transport"] in ("shm", "tcp") and ":" in r["name"]
    st = client.stat()
    assert st["counters"]["objects"] >= 1 and st["segments"][0]["capacity"] == 256 * MiB
    assert client.remove_all() >= 1
    assert client.exist("keep") is False
    assert client.tenant == "default" and client.segment_name == ""


def test_stats_count_bytes_per_path(server: kvpool_procs.Proc,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Client.stats(): this client's bytes per data path, exact; the pool's
    figures (stat()'s client_<path>_* counters) take them once it closes."""
    zero = {"put_bytes": 0, "get_bytes": 0, "put_ops": 0, "get_ops": 0}
    values = [pattern(1, 1), pattern(4 * KiB, 2), pattern(MiB + 3, 3)]
    total = sum(len(v) for v in values)
    cfg = {"master": server.addr, "mode": "standalone-store"}
    with kvpool.Client(cfg) as probe:
        before = probe.stat()["counters"]
    for path, force in (("shm", "0"), ("tcp", "1")):
        monkeypatch.setenv("KVPOOL_FORCE_TCP", force)  # read when a client opens
        with kvpool.Client(cfg) as c:
            assert c.stats() == {"shm": zero, "tcp": zero, "ucx": zero}
            keys = [f"path-{path}-{i}" for i in range(len(values))]
            assert c.put_batch(keys, values) == [None] * len(values)
            assert c.put_batch(keys, values) == [None] * len(values)  # exist: nothing moves
            assert c.get_batch(keys) == values
            assert c.get(keys[2]) == values[2]
            st = c.stats()
            assert st[path] == {"put_bytes": total, "get_bytes": total + len(values[2]),
                                "put_ops": 3, "get_ops": 4}
            assert all(st[p] == zero for p in ("shm", "tcp", "ucx") if p != path)
            assert all(isinstance(v, int) for d in st.values() for v in d.values())
            c.remove_all()
    monkeypatch.delenv("KVPOOL_FORCE_TCP")
    # closed clients' last reports are in the pool's figures
    want = {f"client_{p}_{f}": before[f"client_{p}_{f}"] + n
            for p in ("shm", "tcp")
            for f, n in (("put_bytes", total), ("get_bytes", total + len(values[2])),
                         ("put_ops", 3), ("get_ops", 4))}
    with kvpool.Client(cfg) as probe:
        deadline = time.monotonic() + 10
        while True:
            got = {k: probe.stat()["counters"][k] for k in want}
            if got == want or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert got == want
        assert probe.stat()["counters"]["client_ucx_put_bytes"] == before["client_ucx_put_bytes"]


def test_put_options_pin_and_replicas(client: kvpool.Client) -> None:
    client.put("pin", b"p", pin=True)
    with pytest.raises(kvpool.Error) as ei:
        client.remove("pin")
    assert ei.value.name == "OBJECT_PINNED"
    client.remove("pin", force=True)
    client.put("rep", b"r", replica_num=3)  # best effort: one segment here
    assert len(client.describe("rep")["replicas"]) == 1
    with pytest.raises(ValueError):
        client.put("rep4", b"r", replica_num=4)


def test_tenants_are_isolated(server: kvpool_procs.Proc) -> None:
    a = kvpool.Client({"master": server.addr, "mode": "standalone-store", "tenant_id": "a"})
    b = kvpool.Client({"master": server.addr, "mode": "standalone-store", "tenant": "b"})
    with a, b:
        a.put("shared-name", b"A")
        assert b.exist("shared-name") is False
        b.put("shared-name", b"B")
        assert a.get("shared-name") == b"A" and b.get("shared-name") == b"B"
        assert a.tenant == "a" and b.remove_all() == 1 and a.get("shared-name") == b"A"
        a.remove_all()


def test_exist_lease_batch_holds_and_sizes(client: kvpool.Client) -> None:
    client.put_batch(["xl/a", "xl/b"], [b"x" * 10, b"y" * 4097])
    got = client.exist_lease_batch(["xl/a", "xl/b", "xl/none", ""])
    assert got[:3] == [("dram", 10), ("dram", 4097), None]
    assert isinstance(got[3], kvpool.Error)  # an invalid key: its own error
    # held: a remove without force is refused until a get takes the hold over
    with pytest.raises(kvpool.Error) as e:
        client.remove("xl/a")
    assert e.value.name == "OBJECT_HAS_LEASE"
    assert client.get("xl/a") == b"x" * 10
    client.remove("xl/a")
    assert client.exist_lease_batch([]) == []
    with pytest.raises(TypeError):
        client.exist_lease_batch("xl/a")  # one string is not a list of keys


def test_embedded_mode_hosts_a_segment(master: kvpool_procs.Proc) -> None:
    with kvpool.Client({"master": master.addr, "global_segment_size": "32MiB",
                        "local_hostname": "127.0.0.1"}) as c:
        assert c.segment_name.startswith("127.0.0.1:")
        c.put("emb", pattern(MiB, 9))
        assert c.get("emb") == pattern(MiB, 9)
        assert c.describe("emb")["replicas"][0]["name"] == c.segment_name


# ------------------------------------------------------------ lifecycle

def test_closed_client(server: kvpool_procs.Proc) -> None:
    c = kvpool.Client({"master": server.addr, "mode": "standalone-store"})
    with c:
        c.put("cl", b"x")
    assert c.closed
    for call in (lambda: c.get("cl"), lambda: c.put("cl2", b"y"), lambda: c.exist("cl"),
                 lambda: c.remove_all(), lambda: c.stat(), lambda: c.describe("cl"),
                 lambda: c.stats()):
        with pytest.raises(kvpool.ClosedError):
            call()
    assert isinstance(c.get_batch(["cl"])[0], kvpool.ClosedError)
    c.close()  # idempotent
    with kvpool.Client({"master": server.addr, "mode": "standalone-store"}) as d:
        d.remove_all(force=True)


def _count_while(cond: Any, limit_s: float = 30.0) -> tuple[int, float]:
    """Pure-Python counting (it runs only while this thread holds the GIL)
    while cond() holds, 1000 per check: (count, seconds)."""
    n, t0 = 0, time.monotonic()
    while cond() and time.monotonic() - t0 < limit_s:
        for _ in range(1000):
            n += 1
    return n, time.monotonic() - t0


def test_threads_share_a_client_and_release_the_gil(server: kvpool_procs.Proc,
                                                    client: kvpool.Client) -> None:
    """8 threads of buffer-based batches (put_batch / get_into_batch) on one
    client, bytes compared. While they run, the server is frozen (SIGSTOP)
    for FREEZE_S by an outside process: every worker then waits inside a
    native call, and this thread's pure-Python counter must keep most of its
    solo rate. A binding holding the GIL through its calls leaves it still."""
    freeze_s, n_threads, per = 0.3, 8, 8
    errors: list[str] = []
    rounds = [0] * n_threads
    done = threading.Event()

    def worker(t: int) -> None:
        try:
            r = 0
            while not done.is_set():
                keys = [f"th/{t}/{r}/{i}" for i in range(per)]
                vals = [pattern(64 * KiB, t * 1000 + r * 10 + i) for i in range(per)]
                if any(x is not None for x in client.put_batch(keys, vals)):
                    errors.append("put")
                bufs = [bytearray(64 * KiB) for _ in keys]
                if client.get_into_batch(keys, bufs) != [64 * KiB] * per:
                    errors.append("get")
                if [bytes(b) for b in bufs] != vals:
                    errors.append(f"bytes differ in thread {t} round {r}")
                client.remove_batch(keys)
                r += 1
                rounds[t] = r
        except Exception as e:  # noqa: BLE001 -- reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    try:
        for th in threads:
            th.start()
        _count_while(lambda: min(rounds) < 2 and not errors)  # every thread running
        pid = server.proc.pid
        freezer = subprocess.Popen(["sh", "-c", f"kill -STOP {pid}; sleep {freeze_s}; "
                                                f"kill -CONT {pid}"])
        frozen, frozen_s = _count_while(lambda: freezer.poll() is None)
        resume = max(rounds) + 2
        _count_while(lambda: min(rounds) < resume and not errors)  # every thread resumed
    finally:
        done.set()
        for th in threads:
            th.join()
        os.kill(server.proc.pid, signal.SIGCONT)
    assert errors == []
    solo_end = time.monotonic() + 0.2
    solo, solo_s = _count_while(lambda: time.monotonic() < solo_end)
    assert frozen_s > 0.8 * freeze_s
    assert frozen > 0.3 * solo / solo_s * frozen_s, (frozen, frozen_s, solo, solo_s)


def test_close_waits_for_calls_in_flight(server: kvpool_procs.Proc) -> None:
    c = kvpool.Client({"master": server.addr, "mode": "standalone-store"})
    results: list[Any] = []

    def work() -> None:
        keys = [f"cw/{i}" for i in range(64)]
        results.append(c.put_batch(keys, [pattern(256 * KiB, i) for i in range(64)]))
        results.append(c.get_batch(keys))

    th = threading.Thread(target=work)
    th.start()
    time.sleep(0.05)
    c.close()
    th.join()
    # whatever ran before the close finished whole; what came after is ClosedError
    for res in results:
        for r in res:
            assert r is None or isinstance(r, (bytes, kvpool.ClosedError))
    with kvpool.Client({"master": server.addr, "mode": "standalone-store"}) as d:
        d.remove_all(force=True)


# ------------------------------------------------- hostile callers (review)

def test_addresses_accept_numpy_integers(client: kvpool.Client) -> None:
    buf = np.zeros(1 << 16, dtype=np.uint8)
    base = np.uint64(buf.ctypes.data)
    client.register_buffer(base, np.int64(buf.nbytes))
    buf[:4] = [1, 2, 3, 4]
    client.put_from_batch(["np/i"], [[base]], [[np.uint32(4)]])
    assert client.get("np/i") == b"\x01\x02\x03\x04"
    with pytest.raises(TypeError):
        client.register_buffer(base)  # an address needs its size
    client.unregister_buffer(base)


def test_register_refuses_memory_that_is_not_mapped_read_write(client: kvpool.Client) -> None:
    import mmap
    with pytest.raises(kvpool.InvalidParamsError):
        client.register_buffer(4096, 1 << 20)  # unmapped: would fault later
    ro = mmap.mmap(-1, 8192, prot=mmap.PROT_READ)
    addr = np.frombuffer(ro, dtype=np.uint8).ctypes.data
    with pytest.raises(kvpool.InvalidParamsError):
        client.register_buffer(addr, 8192)  # PROT_READ only: a get would fault
    ok = np.zeros(8192, dtype=np.uint8)
    client.register_buffer(ok.ctypes.data, 8192)
    client.unregister_buffer(ok.ctypes.data)


def test_register_by_object_keeps_it_alive(client: kvpool.Client) -> None:
    import gc
    a = np.full(1 << 16, 7, dtype=np.uint8)
    addr = a.ctypes.data
    client.register_buffer(a)
    del a
    gc.collect()
    client.put_from("alive", addr, 16)  # the client holds the array: the memory is still there
    assert client.get("alive") == bytes([7] * 16)
    client.unregister_buffer(addr)


def test_argument_lists_mutated_while_parsed(client: kvpool.Client) -> None:
    """__index__ (and on 3.12 __buffer__) runs Python code in the middle of
    parsing: clearing the caller's lists then must not free what C reads."""
    buf = np.zeros(4096, dtype=np.uint8)
    client.register_buffer(buf)
    ptrs: list[Any] = []

    class Evil:
        def __index__(self) -> int:
            ptrs.clear()
            sizes.clear()
            return 8

    ptrs.extend([[buf.ctypes.data, buf.ctypes.data + 100]])
    sizes: list[Any] = [[Evil(), 8]]
    assert client.put_from_batch(["mut"], ptrs, sizes) == [None]
    assert client.size("mut") == 16
    client.unregister_buffer(buf)


def test_flags_and_reinit_refused(server: kvpool_procs.Proc) -> None:
    raw = kvpool._native.Client(f'{{"master": "{server.addr}", "mode": "standalone-store"}}')
    with pytest.raises(ValueError):
        raw.put_buffers(["f"], [b"x"], flags=2**32 + 1)
    with pytest.raises(RuntimeError):
        raw.__init__(f'{{"master": "{server.addr}", "mode": "standalone-store"}}')
    raw.close()
    with pytest.raises(RuntimeError):  # not reopened after close either
        raw.__init__(f'{{"master": "{server.addr}", "mode": "standalone-store"}}')


def test_describe_non_ascii_key(client: kvpool.Client) -> None:
    client.put("clé/é", b"v")
    assert client.describe("clé/é")["key"] == "clé/é"


def test_unregister_waits_for_transfers_in_flight(server: kvpool_procs.Proc,
                                                  client: kvpool.Client) -> None:
    """A get into registered memory is stuck (the server frozen); an
    unregister of that memory returns only after the get finished, so the
    caller may free the memory once unregister_buffer returned."""
    buf = np.zeros(1 << 20, dtype=np.uint8)
    client.register_buffer(buf)
    client.put("uw", pattern(1 << 20, 3))
    order: list[Any] = []
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        getter = threading.Thread(target=lambda: order.append(
            ("get", client.get_into_ptr("uw", buf.ctypes.data, buf.nbytes))))
        getter.start()
        time.sleep(0.5)  # the get is inside its call, waiting for the master
        unreg = threading.Thread(target=lambda: order.append(
            ("unregister", client.unregister_buffer(buf))))
        unreg.start()
        unreg.join(0.5)
        # The server is still frozen, so the get cannot have finished: the
        # unregister must still be waiting for it (no timer races a slow run).
        blocked = unreg.is_alive()
    finally:
        os.kill(pid, signal.SIGCONT)
        getter.join()
    unreg.join()
    assert blocked, order
    assert [o[0] for o in order] == ["get", "unregister"], order
    assert order[0][1] == 1 << 20
    assert buf.tobytes() == pattern(1 << 20, 3)
