"""The connector's worker half with CUDA KV caches, without vLLM:
kvpool._native's ConnSched / ConnWorker driven as kvpool.vllm drives them,
over tensors shaped as vLLM allocates them (per layer, bf16):

  flash_attn  (2, num_blocks, block_size, num_kv_heads, head_size): K and V
              planes first (the worker sees one segment per plane)
  flashinfer  (num_blocks, 2, block_size, num_kv_heads, head_size): blocks first

Engine A's "forward" writes its blocks behind a long GPU sleep on torch's
stream and records a CUDA event (fence="cuda", set_fence_event as
kvpool.vllm's wait_for_save does); the worker must wait for it before it
reads KV memory, else it stores the zeros that were there. Engine B, a
second scheduler/worker pair on the same pool, loads the prefix into other
blocks; once it reports the request finished receiving the bytes must be in
device memory. With vLLM importable, kvpool.vllm's own _Worker is driven the
same way (vLLM is usually not installed on the GPU machine: skipped then)."""
from __future__ import annotations

import hashlib
import json
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from conftest import DRY

torch = pytest.importorskip("torch", reason="torch is not installed")
kvpool = pytest.importorskip("kvpool", reason="kvpool._native is not built (make python)")
from kvpool import _native  # noqa: E402

NB, BS, HEADS, HEAD = 64, 16, 8, 128  # 32 KiB per block per plane per layer in bf16
LAYERS = 6
SLEEP_CYCLES = 300_000_000            # ~0.2 s of GPU time before the forward's writes


def hashes(tokens: list[int]) -> list[bytes]:
    out, parent = [], b""
    for i in range(len(tokens) // BS):
        parent = hashlib.sha256(parent + bytes(str(tokens[i * BS:(i + 1) * BS]), "ascii")).digest()
        out.append(parent)
    return out


def tensor_tuple(t: Any) -> tuple[int, int, int, tuple[int, ...], tuple[int, ...]]:
    """kvpool.vllm._tensor_tuple (that module imports vLLM)."""
    es = t.element_size()
    base = t.data_ptr()
    extent = max(n * s for n, s in zip(t.shape, t.stride())) * es
    st = t.untyped_storage()
    avail = st.data_ptr() + st.nbytes() - base
    return base, min(extent, avail), es, tuple(t.shape), tuple(t.stride())


def shape_of(layout: str) -> tuple[int, ...]:
    return (2, NB, BS, HEADS, HEAD) if layout == "flash_attn" else (NB, 2, BS, HEADS, HEAD)


def blocks(t: Any, layout: str, ids: list[int]) -> Any:
    """The int16 view of blocks ids of one layer tensor (K and V)."""
    v = t.view(torch.int16)
    return v[:, ids] if layout == "flash_attn" else v[ids]


def set_blocks(t: Any, layout: str, ids: list[int], val: Any) -> None:
    v = t.view(torch.int16)
    if layout == "flash_attn":
        v[:, ids] = val
    else:
        v[ids] = val


class Engine:
    """One scheduler half and one rank-0 worker half over per-layer KV tensors."""

    def __init__(self, master: str, sock: Path, dev: Any, layout: str, use_vllm: bool,
                 model: str) -> None:
        self.dev, self.layout = dev, layout
        self.cuda = dev.type == "cuda"
        self.kv = [torch.zeros(shape_of(layout), dtype=torch.bfloat16, device=dev)
                   for _ in range(LAYERS)]
        groups = [{"kind": "full_attention", "block_size": BS, "num_kv_heads": HEADS}]
        common: dict[str, Any] = {"model": model, "groups": groups, "hash_block_size": BS,
                                  "block_size": BS, "lookup_socket": str(sock)}
        store = json.dumps({"master": master, "mode": "standalone-store"})
        self.events: list[Any] = []
        self.vw: Any = None
        if use_vllm:
            from kvpool import vllm as kv_vllm

            names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
            kcc = SimpleNamespace(num_blocks=NB,
                                  kv_cache_groups=[SimpleNamespace(layer_names=names)])
            setup = kv_vllm._Setup(conn=dict(common, store_config=store), store_group_ids=(0,),
                                   factors=(1,), num_workers=1, kv_events=False)
            self.vw = kv_vllm._Worker(setup, kcc)
            self.vw.register(dict(zip(names, self.kv)))
            self.worker = self.vw._w
            self.meta = kv_vllm.KVPoolConnectorMetadata
        else:
            cfg = dict(common, store_config=store, num_blocks=NB,
                       fence="cuda" if self.cuda else None)
            self.worker = _native.ConnWorker(cfg)
            self.worker.register_kv_caches([tensor_tuple(t) for t in self.kv])
        self.sched = _native.ConnSched(common)

    def fence(self) -> None:
        """wait_for_save: the event of this step's forward."""
        if self.vw is not None:
            self.vw.fence()
        elif self.cuda:
            ev = torch.cuda.Event()
            ev.record()
            self.events.append(ev)
            self.worker.set_fence_event(self.worker.step, ev.cuda_event)

    def step(self, new: list[Any], cached: list[Any], finished: tuple[str, ...] = ()
             ) -> tuple[list[str], list[str]]:
        meta = self.sched.build_meta(new, cached, (), finished, ())
        self.fence()
        if self.vw is not None:
            snd, rcv = self.vw.finished(self.meta(step=meta), set(finished))
            return list(snd or ()), list(rcv or ())
        return self.worker.get_finished(meta, finished)

    def wait(self, what: int, rid: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if rid in self.step([], [])[what]:
                return
            time.sleep(0.01)
        raise TimeoutError(f"{rid} not reported {'finished sending' if what == 0 else 'loaded'}")

    def close(self) -> None:
        self.sched.close()
        if self.vw is not None:
            self.vw.close()
        else:
            self.worker.close()


def _vllm_or_skip() -> None:
    try:
        import vllm  # noqa: F401
        from kvpool import vllm as _  # noqa: F401
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"vLLM is not importable here ({type(e).__name__}: {e}); the same steps "
                    "run through ConnWorker in the other tests")


@pytest.fixture
def engines(request: Any, server: Any, dev: Any) -> Iterator[tuple[Engine, Engine]]:
    layout, use_vllm = request.param
    if use_vllm:
        _vllm_or_skip()
    model = f"tiny-gpu-{uuid.uuid4().hex[:12]}"  # the pool outlives the test: keys of its own
    with tempfile.TemporaryDirectory(prefix="kvpool-gpu-conn-") as d:
        a = Engine(server.addr, Path(d) / "a.sock", dev, layout, use_vllm, model)
        b = Engine(server.addr, Path(d) / "b.sock", dev, layout, use_vllm, model)
        yield a, b
        a.close()
        b.close()


@pytest.mark.parametrize("engines", [("flash_attn", False), ("flashinfer", False),
                                     ("flash_attn", True)],
                         ids=["flash_attn", "flashinfer", "vllm_worker"], indirect=True)
def test_prefix_stored_from_gpu_is_loaded_into_gpu(engines: tuple[Engine, Engine]) -> None:
    a, b = engines
    layout, dev = a.layout, a.dev
    toks = list(range(300, 364))  # 4 blocks
    hs = hashes(toks)
    g = torch.Generator(device=dev)
    g.manual_seed(11)
    src_ids, dst_ids = [1, 2, 3, 4], [9, 10, 11, 12]
    bshape = blocks(a.kv[0], layout, src_ids).shape
    want = [torch.randint(-32768, 32767, bshape, dtype=torch.int16, device=dev, generator=g)
            for _ in range(LAYERS)]
    if a.cuda:
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)  # the forward is still running when stores queue
    for t, w in zip(a.kv, want):
        set_blocks(t, layout, src_ids, w)  # the "forward", after the sleep on torch's stream

    r = _native.ConnRequest("a0", 64)
    r.sync(toks, hs, 0)
    assert a.sched.lookup(r, 0) == (0, False)
    a.sched.update_state_after_alloc(r, None, 0)
    a.step([(r, 64, (src_ids,))], [])  # fence + get_finished: the stores are queued here
    r.sync(toks + [7], hs, 64)
    assert a.sched.request_finished("a0", (src_ids,)) is True
    if "a0" not in a.step([], [], ("a0",))[0]:
        a.wait(0, "a0")
    stats = a.worker.take_stats()
    block_bytes = LAYERS * 2 * BS * HEADS * HEAD * 2
    assert stats and stats["store"]["keys"] == 4 and stats["store"]["bytes"] == 4 * block_bytes

    for t in b.kv:
        set_blocks(t, layout, dst_ids, -23131)  # 0xA5A5: poison
    if b.cuda:
        torch.cuda.synchronize()
    q = _native.ConnRequest("b0", 64)
    q.sync(toks, hs, 0)
    assert b.sched.lookup(q, 0) == (48, True)  # one token is always left to compute
    b.sched.update_state_after_alloc(q, (dst_ids,), 48)
    b.step([], [])
    b.wait(1, "b0")
    assert b.worker.load_errors() == []
    for i, (t, w) in enumerate(zip(b.kv, want)):  # right after the report: no sync
        got = blocks(t, layout, dst_ids[:3])
        exp = w[:, :3] if layout == "flash_attn" else w[:3]
        if not torch.equal(got, exp):
            stale = torch.equal(got, torch.zeros_like(got))
            raise AssertionError(f"layer {i}: loaded blocks differ from the stored forward"
                                 + (" (zeros: the store read KV memory before the fence's "
                                    "event)" if stale else ""))
        last = blocks(t, layout, dst_ids[3:])
        assert bool((last == -23131).all()), f"layer {i}: the block left to compute was written"


@pytest.mark.parametrize("engines", [("flash_attn", False)], ids=["flash_attn"], indirect=True)
def test_many_requests_many_steps(engines: tuple[Engine, Engine]) -> None:
    """12 requests of 2 blocks stored over several steps, all loaded by B."""
    a, b = engines
    layout, dev = a.layout, a.dev
    g = torch.Generator(device=dev)
    g.manual_seed(12)
    nreq = 12
    reqs, want = [], []
    for k in range(nreq):
        toks = list(range(1000 * (k + 1), 1000 * (k + 1) + 2 * BS))
        ids = [1 + 2 * k, 2 + 2 * k]
        w = [torch.randint(-32768, 32767, blocks(a.kv[0], layout, ids).shape, dtype=torch.int16,
                           device=dev, generator=g) for _ in range(LAYERS)]
        for t, x in zip(a.kv, w):
            set_blocks(t, layout, ids, x)
        r = _native.ConnRequest(f"a{k}", 2 * BS)
        r.sync(toks, hashes(toks), 0)
        assert a.sched.lookup(r, 0) == (0, False)
        a.sched.update_state_after_alloc(r, None, 0)
        a.step([(r, 2 * BS, (ids,))], [])
        r.sync(toks + [1], hashes(toks), 2 * BS)
        assert a.sched.request_finished(f"a{k}", (ids,)) is True
        reqs.append(toks)
        want.append(w)
    pending = {f"a{k}" for k in range(nreq)}
    done = set(a.step([], [], tuple(sorted(pending)))[0])
    deadline = time.monotonic() + 30
    while not pending <= done and time.monotonic() < deadline:
        done |= set(a.step([], [])[0])
        time.sleep(0.01)
    assert pending <= done, f"not stored: {sorted(pending - done)}"

    for k, toks in enumerate(reqs):
        dst = [NB - 2 - 2 * k, NB - 1 - 2 * k]
        q = _native.ConnRequest(f"b{k}", 2 * BS + 1)
        q.sync(toks + [1], hashes(toks), 0)
        assert b.sched.lookup(q, 0) == (2 * BS, True)
        b.sched.update_state_after_alloc(q, (dst,), 2 * BS)
        b.step([], [])
        b.wait(1, f"b{k}")
        for i, (t, w) in enumerate(zip(b.kv, want[k])):
            assert torch.equal(blocks(t, layout, dst), w), f"request {k} layer {i}"
    assert b.worker.load_errors() == []


def test_cuda_fence_needs_the_driver_here(server: Any, dev: Any) -> None:
    """fence='cuda' opens (torch loaded libcuda) and accepts device KV caches."""
    if DRY:
        pytest.skip("dry run on CPU tensors: no CUDA driver, no fence")
    with tempfile.TemporaryDirectory() as d:
        w = _native.ConnWorker({
            "model": "m", "groups": [{"kind": "full_attention", "block_size": BS}],
            "hash_block_size": BS, "lookup_socket": f"{d}/s", "num_blocks": 4, "fence": "cuda",
            "store_config": json.dumps({"master": server.addr, "mode": "standalone-store"})})
        t = torch.zeros((2, 4, BS, 1, 64), dtype=torch.float16, device=dev)
        w.register_kv_caches([tensor_tuple(t)])
        ev = torch.cuda.Event()
        ev.record()
        w.set_fence_event(w.step, ev.cuda_event)
        assert w.get_finished(None, ()) == ([], [])
        w.close()
