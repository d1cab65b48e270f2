"""kvpool.vllm_tier in vLLM 0.32 (this venv: vLLM's CPU build), through 0.32's own
TieringOffloadingManager (tests/vllm/tier_driver.py): one engine's chunks
promoted into another's host memory byte for byte. Not in the real engine: 0.32's
offloading worker moves KV with CUDA streams and asserts CUDA/XPU tensors, so
the OffloadingConnector cannot run on the CPU backend (README, "vLLM's native
offloading (tiers)"); tests/vllm covers the tier in depth on 0.33."""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE.parent / "vllm"))  # after this suite's own modules

import kvpool_procs  # noqa: E402
import tier_driver as T  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult  # noqa: E402


def test_chunks_promoted_through_vllm_032_tiering_manager(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    b = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("v032", 6)
        T.store(a, keys)
        res, got = T.load(b, keys)
        assert res == [LookupResult.HIT] * 6
        size = a.secondary_tiers[0].block_size_bytes
        assert all(got[k] == T.payload(k, size).tobytes() for k in keys)
    finally:
        a.shutdown()
        b.shutdown()
