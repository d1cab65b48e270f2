"""SGLang 0.5.23's own Mooncake backend on kvpool: `MooncakeStore`, built by
SGLang's `StorageBackendFactory` over its real host pools
(`MHATokenToKVPoolHost` / `MLATokenToKVPoolHost` on device="cpu", made from
its device pools `MHATokenToKVPool` / `MLATokenToKVPool`), against a real
`kvpool serve`: pages written from one range of the host pool and read back
into another are the same bytes. Also SGLang's standalone_storage mode
(setup_dummy), its check_server=True (the master's /get_all_segments), and
SGLang's shipped test_mooncake_store.py, unchanged, in a fresh interpreter
that only sets KVPOOL_AS_MOONCAKE=1 (the package's .pth hook)."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import ROOT, Pool
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from sglang.srt.mem_cache.storage.mooncake_store import mooncake_store as sgl_mc

PAGE = 16
LAYERS = 2
PAGES = 6  # written per test


def host_pool(mla: bool, layout: str) -> Any:
    """SGLang's host pool over a small device pool on the CPU, filled with
    random bytes. Its memory comes from MooncakeHostMemAllocator, as SGLang
    allocates it whenever the storage backend is mooncake
    (pool_host.common.get_allocator_type)."""
    allocator = "mooncake"
    if mla:
        dev = MLATokenToKVPool(512, PAGE, torch.bfloat16, kv_lora_rank=32, qk_rope_head_dim=16,
                               layer_num=LAYERS, device="cpu", enable_memory_saver=False,
                               start_layer=0, end_layer=LAYERS)
        host = MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout, pin_memory=False,
            allocator_type=allocator, device_capacity_tokens=dev.size,
            start_layer=dev.start_layer, end_layer=dev.end_layer, target_layer_num=LAYERS,
            override_kv_cache_dim=dev.kv_cache_dim)
    else:
        dev = MHATokenToKVPool(512, PAGE, torch.bfloat16, 2, 16, LAYERS, "cpu", False,
                               start_layer=0, end_layer=LAYERS)
        host = MHATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info, 2, 0, PAGE, layout, pin_memory=False,
            allocator_type=allocator, device_capacity_tokens=dev.size,
            start_layer=dev.start_layer, end_layer=dev.end_layer)
    raw = host.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return host


def storage_config(mla: bool, extra: dict[str, Any], tp_rank: int = 0,
                   tp_size: int = 1) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
        model_name="tiny/model", extra_config=extra)


def page_bytes(host: Any, first_page: int) -> list[bytes]:
    """The bytes of PAGES pages from first_page, as SGLang's zero-copy
    metadata for them names them (any layout)."""
    idx = torch.arange(first_page * PAGE, (first_page + PAGES) * PAGE, dtype=torch.int64)
    ptrs, sizes = host.get_page_buffer_meta(idx)
    flat = [(p, s) for pp, ss in zip(ptrs, sizes)
            for p, s in (zip(pp, ss) if isinstance(pp, (list, tuple)) else [(pp, ss)])]
    return [ctypes.string_at(p, s) for p, s in flat]


def round_trip(store: Any, host: Any) -> None:
    """v1 calls: PAGES pages stored from pages 0.., read into pages 16..; equal bytes."""
    store.register_mem_pool_host(host)
    keys = [f"sgl-{uuid.uuid4().hex}" for _ in range(PAGES)]
    src = torch.arange(0, PAGES * PAGE, dtype=torch.int64)
    dst = torch.arange(16 * PAGE, (16 + PAGES) * PAGE, dtype=torch.int64)
    assert store.batch_exists(keys) == 0
    assert store.batch_set_v1(keys, src) == [True] * PAGES
    assert store.batch_exists(keys) == PAGES
    before = page_bytes(host, 16)
    assert store.batch_get_v1(keys, dst) == [True] * PAGES
    got, want = page_bytes(host, 16), page_bytes(host, 0)
    assert got == want and got != before
    # a prefix that stops at the first miss
    assert store.batch_exists(keys[:2] + [f"sgl-miss-{uuid.uuid4().hex}"] + keys[2:]) == 2


# (SGLang's Mooncake backend refuses MHA's layer_first itself)
@pytest.mark.parametrize("mla,layout", [(False, "page_first"), (False, "page_first_direct"),
                                        (False, "page_head"), (True, "page_first"),
                                        (True, "layer_first")])
def test_factory_built_backend_moves_host_pool_pages(pool: Pool, mla: bool, layout: str) -> None:
    host = host_pool(mla, layout)
    extra = {"master_server_address": pool.addr, "protocol": "tcp",
             "global_segment_size": 0}  # a client of the pool's storage node
    store = StorageBackendFactory.create_backend("mooncake", storage_config(mla, extra), host)
    assert isinstance(store, sgl_mc.MooncakeStore)
    assert type(store.store).__module__ == "kvpool.mooncake"
    round_trip(store, host)


def test_check_server_polls_get_all_segments(pool: Pool) -> None:
    """check_server=True: SGLang polls the master's /get_all_segments on
    master_metrics_port until the body is not empty; kvpool serves
    Mooncake's route with the node's segment name."""
    host = host_pool(False, "page_first")
    extra = {"master_server_address": pool.addr, "protocol": "tcp", "global_segment_size": 0,
             "check_server": True, "master_metrics_port": pool.http_port}
    store = StorageBackendFactory.create_backend("mooncake", storage_config(False, extra), host)
    names = pool.segments().splitlines()  # what check_server saw: the node's segment
    assert len(names) == 1 and names[0].startswith("127.0.0.1:")
    round_trip(store, host)


@pytest.mark.parametrize("mla", [False, True])
def test_standalone_storage_mode(pool: Pool, mla: bool) -> None:
    """standalone_storage=True: SGLang allocates the host pool with
    MooncakeHostMemAllocator and calls setup_dummy(size, buffer,
    client_server_address): kvpool's client without a segment, whose
    master is that address."""
    host = host_pool(mla, "page_first")
    assert isinstance(host.allocator, sgl_mc.MooncakeHostTensorAllocator)
    extra = {"client_server_address": pool.addr, "standalone_storage": True, "protocol": "tcp"}
    store = StorageBackendFactory.create_backend("mooncake", storage_config(mla, extra), host)
    name = store.store.get_hostname()  # a client's name, no segment: it contributes nothing
    assert name.startswith("localhost:") and name not in pool.segments().split()
    round_trip(store, host)


def test_tp_ranks_keep_their_own_keys(pool: Pool) -> None:
    """Two TP ranks of one MHA model: each rank's pages under its own key
    suffix, read back by the same rank; rank 1 misses rank 0's pages."""
    extra = {"master_server_address": pool.addr, "protocol": "tcp", "global_segment_size": 0}
    hosts = [host_pool(False, "page_first") for _ in range(2)]
    stores = [StorageBackendFactory.create_backend(
        "mooncake", storage_config(False, extra, tp_rank=r, tp_size=2), hosts[r]) for r in (0, 1)]
    for s, h in zip(stores, hosts):
        s.register_mem_pool_host(h)
    keys = [f"tp-{uuid.uuid4().hex}" for _ in range(PAGES)]
    src = torch.arange(0, PAGES * PAGE, dtype=torch.int64)
    assert stores[0].batch_set_v1(keys, src) == [True] * PAGES
    assert stores[0].batch_exists(keys) == PAGES and stores[1].batch_exists(keys) == 0
    dst = torch.arange(16 * PAGE, (16 + PAGES) * PAGE, dtype=torch.int64)
    assert stores[0].batch_get_v1(keys, dst) == [True] * PAGES
    assert page_bytes(hosts[0], 16) == page_bytes(hosts[0], 0)


def test_shipped_test_mooncake_store_passes_unchanged(pool: Pool, tmp_path: Path) -> None:
    """SGLang's own test file, run as SGLang runs it (`python
    test_mooncake_store.py`), configured by Mooncake's variables, in a fresh
    interpreter whose only change is KVPOOL_AS_MOONCAKE=1: the .pth hook
    the kvpool package installs makes its `import mooncake.store` ours.
    (site.addsitedir reads python/kvpool_as_mooncake.pth as Python's site
    reads site-packages at start.)"""
    shipped = Path(sgl_mc.__file__).with_name("test_mooncake_store.py")
    assert shipped.is_file()
    boot = ("import runpy, site, sys\n"
            f"site.addsitedir({str(ROOT / 'python')!r})\n"
            "assert 'mooncake' not in sys.modules and 'kvpool' not in sys.modules\n"
            f"runpy.run_path({str(shipped)!r}, run_name='__main__')\n"
            "import mooncake.store\n"
            "print('STORE-MODULE', mooncake.store.__name__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(KVPOOL_AS_MOONCAKE="1", MOONCAKE_MASTER=pool.addr, MOONCAKE_PROTOCOL="tcp",
               MOONCAKE_GLOBAL_SEGMENT_SIZE="0", MOONCAKE_LOCAL_HOSTNAME="127.0.0.1")
    r = subprocess.run([sys.executable, "-c", boot], capture_output=True, text=True,
                       timeout=300, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "All tests passed" in out and "STORE-MODULE kvpool.mooncake" in out, out[-4000:]
