"""kvpool.Client with CUDA device memory: values put from and got
into CUDA tensors through the raw-address API (register_buffer(ptr, size),
put_from*, get_into_ptr*) and the tensor forms, over shared memory and over
loopback TCP (every test runs on both: the `client` fixture), byte-exact.

Device bytes are compared on the device right after the call returned (a
get is complete when it reports), and through a host get of the same key
(what was stored is what the device held). Sources and destinations are
written by torch kernels on torch's stream, so each test synchronizes once
they are written and before the client reads or writes them (the raw calls
order nothing against other streams: the connector has its fence for that)."""
from __future__ import annotations

import threading
from typing import Any, Optional

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
kvpool = pytest.importorskip("kvpool", reason="kvpool._native is not built (make python)")

KiB, MiB = 1 << 10, 1 << 20

# size classes: tiny, sub-page, page, a vLLM piece and one byte more, 1 and
# 2 MiB, across a 4 MiB staging slot (the ring's default), several slots, large
SIZES = [1, 100, 4095, 4096, 32 * KiB, 32 * KiB + 1, MiB, 2 * MiB, 4 * MiB + 1,
         12 * MiB + 7, 64 * MiB]


def rand(n: int, seed: int, device: Any) -> Any:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device=device, generator=g)


def sync() -> None:
    """torch's device work done (what a caller does before handing memory over)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def same(a: Any, b: Any, what: str = "") -> None:
    """a == b byte for byte; else the first differing offset."""
    assert a.numel() == b.numel(), f"{what}: {a.numel()} vs {b.numel()} bytes"
    if not torch.equal(a.to(b.device), b):
        i = int((a.to(b.device) != b).nonzero()[0])
        raise AssertionError(f"{what}: bytes differ from offset {i} of {a.numel()}")


class Arena:
    """One allocation (device, pinned host or pageable host memory),
    registered with the client once, handing out byte ranges."""

    def __init__(self, client: Any, nbytes: int, device: Any, pin: bool = False) -> None:
        pin = pin and device.type == "cpu" and torch.cuda.is_available()
        self.t = torch.zeros(nbytes, dtype=torch.uint8, device=device, pin_memory=pin)
        self.base = int(self.t.data_ptr())
        self.client = client
        self.used = 0
        client.register_buffer(self.base, nbytes)

    def take(self, n: int, align: int = 256, skew: int = 0) -> tuple[int, Any]:
        """(address, byte view) of n fresh bytes at an align-ed offset + skew."""
        off = -(-self.used // align) * align + skew
        assert off + n <= self.t.numel(), "arena too small"
        self.used = off + n
        return self.base + off, self.t[off:off + n]

    def close(self) -> None:
        self.client.unregister_buffer(self.base)


@pytest.fixture
def arenas(client: Any, dev: Any) -> Any:
    made: list[Arena] = []

    def make(nbytes: int, device: Optional[Any] = None, pin: bool = False) -> Arena:
        a = Arena(client, nbytes, dev if device is None else device, pin)
        made.append(a)
        return a

    yield make
    sync()
    for a in made:
        if not client.closed:
            a.close()


def test_transport_is_the_one_asked_for(client: Any, arenas: Any, dev: Any) -> None:
    a = arenas(64 * KiB)
    p, v = a.take(4096)
    v.copy_(rand(4096, 1, dev))
    sync()
    client.put_from("gpu/transport", p, 4096)
    reps = client.describe("gpu/transport")["replicas"]
    assert reps and reps[0]["transport"] == client.transport, reps


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_of_every_size_class(client: Any, arenas: Any, dev: Any, size: int) -> None:
    a = arenas(2 * size + 4096)
    ps, src = a.take(size)
    pd, dst = a.take(size)
    src.copy_(rand(size, size, dev))
    sync()
    key = f"gpu/size/{size}"
    client.put_from(key, ps, size)
    assert client.get_into_ptr(key, pd, size) == size
    same(src, dst, f"device -> pool -> device, {size} bytes")
    assert client.get(key) == src.cpu().numpy().tobytes(), "the stored bytes are not the device's"


def test_every_size_in_one_batch(client: Any, arenas: Any, dev: Any) -> None:
    sizes = SIZES[:-1]  # 64 MiB alone is the large case above
    a = arenas(2 * sum(sizes) + 2 * len(sizes) * 256)
    srcs = [a.take(n) for n in sizes]
    dsts = [a.take(n) for n in sizes]
    for i, (_, v) in enumerate(srcs):
        v.copy_(rand(v.numel(), 100 + i, dev))
    sync()
    keys = [f"gpu/batch/{n}" for n in sizes]
    assert client.put_from_batch(keys, [p for p, _ in srcs], sizes) == [None] * len(sizes)
    got = client.get_into_ptr_batch(keys, [p for p, _ in dsts], sizes)
    assert got == sizes
    for (_, s), (_, d), n in zip(srcs, dsts, sizes):
        same(s, d, f"{n} bytes in a batch")


def test_vllm_shaped_scattered_pieces(client: Any, arenas: Any, dev: Any) -> None:
    """16 keys of 64 pieces of 32 KiB at random block offsets (one layer's K or
    V of one block each), got back into other random blocks."""
    piece, nkeys, npieces, nblocks = 32 * KiB, 16, 64, 2 * 16 * 64 + 64
    a = arenas(nblocks * piece)
    kv = a.t.view(nblocks, piece)
    g = torch.Generator()
    g.manual_seed(7)
    perm = torch.randperm(nblocks, generator=g).tolist()
    put_ids = [perm[k * npieces:(k + 1) * npieces] for k in range(nkeys)]
    get_ids = [perm[(nkeys + k) * npieces:(nkeys + k + 1) * npieces] for k in range(nkeys)]
    kv.copy_(rand(nblocks * piece, 8, dev).view(nblocks, piece))
    sync()
    keys = [f"gpu/vllm/{k}" for k in range(nkeys)]
    sizes = [[piece] * npieces for _ in range(nkeys)]
    res = client.put_from_batch(keys, [[a.base + b * piece for b in ids] for ids in put_ids], sizes)
    assert res == [None] * nkeys
    got = client.get_into_ptr_batch(keys, [[a.base + b * piece for b in ids] for ids in get_ids],
                                    sizes)
    assert got == [piece * npieces] * nkeys
    for k in range(nkeys):
        same(kv[put_ids[k]].reshape(-1), kv[get_ids[k]].reshape(-1), f"key {k}")
    assert client.get(keys[3]) == kv[put_ids[3]].reshape(-1).cpu().numpy().tobytes()


def test_mixed_host_and_device_batch(client: Any, arenas: Any, dev: Any) -> None:
    """One put and one get call mixing device, pinned host and pageable host
    memory; every key got back into another kind than it came from."""
    cpu = torch.device("cpu")
    kinds = {"device": arenas(8 * MiB), "pinned": arenas(8 * MiB, cpu, pin=True),
             "pageable": arenas(8 * MiB, cpu)}
    order = ["device", "pinned", "pageable"]
    sizes = [4096, 32 * KiB, MiB + 3, 5 * MiB // 4, 3, 2 * MiB]
    puts, gets, keys = [], [], []
    for i, n in enumerate(sizes):
        src_kind, dst_kind = order[i % 3], order[(i + 1) % 3]
        p, v = kinds[src_kind].take(n)
        v.copy_(rand(n, 200 + i, v.device))
        puts.append((p, v))
        gets.append(kinds[dst_kind].take(n))
        keys.append(f"gpu/mixed/{i}/{src_kind}-to-{dst_kind}")
    sync()
    assert client.put_from_batch(keys, [p for p, _ in puts], sizes) == [None] * len(sizes)
    assert client.get_into_ptr_batch(keys, [p for p, _ in gets], sizes) == sizes
    for k, (_, s), (_, d) in zip(keys, puts, gets):
        same(s, d, k)


def test_one_key_of_host_and_device_pieces(client: Any, arenas: Any, dev: Any) -> None:
    """A value gathered from device, host, device pieces and scattered into
    host, device, host pieces of other lengths."""
    cpu = torch.device("cpu")
    d, h = arenas(4 * MiB), arenas(4 * MiB, cpu, pin=True)
    lens = [100 * KiB + 1, 3 * KiB, MiB + 5]
    total = sum(lens)
    srcs = [d.take(lens[0]), h.take(lens[1]), d.take(lens[2])]
    want = rand(total, 300, dev)
    off = 0
    for (_, v), n in zip(srcs, lens):
        v.copy_(want[off:off + n])
        off += n
    sync()
    client.put_from("gpu/pieces", [p for p, _ in srcs], lens)
    out_lens = [7, total - 7 - 512 * KiB, 512 * KiB]
    dsts = [h.take(out_lens[0]), d.take(out_lens[1]), h.take(out_lens[2])]
    assert client.get_into_ptr("gpu/pieces", [p for p, _ in dsts], out_lens) == total
    same(torch.cat([v.to(dev) for _, v in dsts]), want, "host/device pieces")
    assert client.get("gpu/pieces") == want.cpu().numpy().tobytes()


def test_odd_offsets_and_lengths(client: Any, arenas: Any, dev: Any) -> None:
    a = arenas(16 * MiB)
    cases = [(1, 1), (3, 7), (4097, 4093), (5, 32 * KiB + 1), (255, 3 * MiB + 17)]
    keys, ps, pd, srcs, dsts = [], [], [], [], []
    for i, (skew, n) in enumerate(cases):
        p, s = a.take(n, align=4096, skew=skew)
        q, t = a.take(n, align=4096, skew=(skew * 3) % 4096 or 1)
        s.copy_(rand(n, 400 + i, dev))
        keys.append(f"gpu/odd/{skew}/{n}")
        ps.append(p), pd.append(q), srcs.append(s), dsts.append(t)
    sync()
    sizes = [n for _, n in cases]
    assert client.put_from_batch(keys, ps, sizes) == [None] * len(cases)
    assert client.get_into_ptr_batch(keys, pd, sizes) == sizes
    for k, s, t in zip(keys, srcs, dsts):
        same(s, t, k)


def test_tensor_forms(client: Any, dev: Any) -> None:
    """The package's tensor forms with CUDA tensors: register_buffer(tensor)
    by object (kept alive until unregistered), then put / put_batch of
    tensors (pieces too) and get_into / get_into_batch of tensors."""
    src = rand(MiB + 11, 500, dev)
    two = [rand(4096, 501, dev), rand(32 * KiB, 502, dev)]
    dst = torch.zeros(MiB + 11, dtype=torch.uint8, device=dev)
    whole = torch.zeros(4096 + 32 * KiB, dtype=torch.uint8, device=dev)
    halves = [torch.zeros(2048, dtype=torch.uint8, device=dev),
              torch.zeros(2048 + 32 * KiB, dtype=torch.uint8, device=dev)]
    mine = [src, *two, dst, whole, *halves]
    for t in mine:
        client.register_buffer(t)
    sync()
    client.put("gpu/tensor/one", src)
    assert client.put_batch(["gpu/tensor/pieces"], [two]) == [None]
    assert client.get_into("gpu/tensor/one", dst) == MiB + 11
    same(src, dst, "put(tensor) / get_into(tensor)")
    assert client.get_into_batch(["gpu/tensor/pieces"], [whole]) == [whole.numel()]
    same(torch.cat(two), whole, "put_batch of tensor pieces / get_into_batch")
    assert client.get_into("gpu/tensor/pieces", halves) == whole.numel()
    same(torch.cat(two), torch.cat(halves), "get_into of tensor pieces")
    assert client.get("gpu/tensor/one") == src.cpu().numpy().tobytes()
    client.put_from("gpu/tensor/registered", src.data_ptr() + 10, 1000)
    assert client.get("gpu/tensor/registered") == src[10:1010].cpu().numpy().tobytes()
    for t in mine:
        client.unregister_buffer(t)


def test_unregistered_device_memory_is_refused(client: Any, dev: Any) -> None:
    t = rand(8192, 600, dev)
    sync()
    with pytest.raises(kvpool.InvalidParamsError):
        client.put_from("gpu/unregistered", t.data_ptr(), 8192)
    assert client.exist("gpu/unregistered") is False
    client.put("gpu/host", b"x" * 8192)
    with pytest.raises(kvpool.InvalidParamsError):
        client.get_into_ptr("gpu/host", t.data_ptr(), 8192)


def test_size_mismatch_is_an_error_not_a_write(client: Any, arenas: Any, dev: Any) -> None:
    a = arenas(MiB)
    p, v = a.take(64 * KiB)
    v.copy_(rand(64 * KiB, 700, dev))
    sync()
    client.put_from("gpu/size-mismatch", p, 64 * KiB)
    q, _ = a.take(32 * KiB)
    with pytest.raises(kvpool.BufferTooSmallError):
        client.get_into_ptr("gpu/size-mismatch", q, 32 * KiB)
    r, w = a.take(64 * KiB)
    assert client.get_into_ptr("gpu/size-mismatch", r, 64 * KiB) == 64 * KiB
    same(v, w, "the get after the refused one")


def test_threads_share_a_client(client: Any, arenas: Any, dev: Any) -> None:
    """8 threads put and get their own device ranges through one client."""
    nthreads, iters, span = 8, 12, 2 * MiB
    a = arenas(nthreads * 2 * span)
    errors: list[str] = []

    def work(t: int) -> None:
        try:
            base = a.base + t * 2 * span
            src, dst = a.t[t * 2 * span:t * 2 * span + span], a.t[(t * 2 + 1) * span:(t * 2 + 2) * span]
            for i in range(iters):
                n = [1, 4096, 32 * KiB + 3, MiB, span][i % 5]
                src[:n].copy_(rand(n, 1000 * t + i, dev))
                dst[:n].zero_()
                sync()
                key = f"gpu/threads/{t}/{i}"
                client.put_from(key, base, n)
                assert client.get_into_ptr(key, base + span, n) == n
                same(src[:n], dst[:n], key)
                client.remove(key, force=True)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {t}: {e!r}")

    th = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for x in th:
        x.start()
    for x in th:
        x.join(120)
    assert not errors, errors
