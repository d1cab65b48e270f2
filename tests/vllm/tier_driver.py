"""Drives vLLM's own TieringOffloadingManager on CPU, the way vLLM's tests drive
its fs tier: TieringOffloadingSpec builds the manager (a primary tier in a
shared-memory region of host memory, secondary tiers from
``secondary_tiers``, kvpool's by ``module_path``); stores write chunk bytes
into the primary region where a GPU->CPU transfer would, and loads read them
back from it. Used by tests/vllm/test_vllm_tier.py and bench/vllm_tier.py."""
from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Optional, Sequence

import numpy as np
from vllm.v1.kv_offload.base import (LookupResult, OffloadKey, ReqContext, ScheduleEndContext,
                                     make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
BOUND_S = 60.0  # a bound on waiting for the pool, not a timed assertion


def tier_conf(master: str, **kw: Any) -> dict[str, Any]:
    """kvpool's secondary tier as vLLM's kv_connector_extra_config names it."""
    return {"type": "KVPoolTier", "module_path": "kvpool.vllm_tier", "config": {"master": master},
            **kw}


def make_manager(master: str, *, chunks: int = 32, chunk_bytes: int = 16384,
                 dtype: str = "float16", model: str = "tiny-tier-model", tp: int = 1,
                 agnostic: bool = True, events: bool = False,
                 tier: Optional[dict[str, Any]] = None,
                 extra: Optional[dict[str, Any]] = None) -> TieringOffloadingManager:
    """A fresh engine's manager: its own primary region of `chunks` chunks of
    chunk_bytes (one block per chunk, one KV-cache group) over kvpool; extra:
    the whole kv_connector_extra_config instead (tier and chunks unused)."""
    cfg = OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=32, layer_names=("l0", "l1"), group_id=0),),
        worker_kv_bytes_per_block=chunk_bytes // tp, enable_kv_cache_events=events,
        extra_config=extra if extra is not None else {
            "cpu_bytes_to_use": chunks * chunk_bytes,
            "secondary_tiers": [tier if tier is not None else tier_conf(master)]},
        engine_id=f"kvpool-tier-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=32, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=tp, tp_size=tp, pp_size=1,
                                          pcp_size=1, dcp_size=1, data_parallel_index=0,
                                          data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=agnostic))
    m = TieringOffloadingSpec(cfg).get_manager()
    assert isinstance(m, TieringOffloadingManager)
    return m


def keys_of(name: str, n: int) -> list[OffloadKey]:
    return [make_offload_key(f"{name}-{i}".encode().ljust(32, b"."), 0) for i in range(n)]


def payload(key: OffloadKey, size: int) -> np.ndarray:
    """The bytes a chunk holds: deterministic per key."""
    seed = int.from_bytes(key[:8], "little") ^ len(key)
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def primary(m: TieringOffloadingManager) -> np.ndarray:
    return np.asarray(m.primary_tier.get_kv_memoryview())


def settle(m: TieringOffloadingManager) -> None:
    """Steps the manager until no transfer is in flight."""
    deadline = time.monotonic() + BOUND_S
    while m.has_pending_work():
        assert time.monotonic() < deadline, "tier jobs did not finish"
        m.on_schedule_end(STEP)
        time.sleep(0.002)


def store(m: TieringOffloadingManager, keys: Sequence[OffloadKey],
          fill: Optional[Callable[[OffloadKey, int], np.ndarray]] = payload,
          wait: bool = True) -> None:
    """One request stores keys: GPU->primary (bytes written into the primary
    region), then complete_store cascades them to the secondary tiers."""
    ctx = ReqContext(req_id=f"store-{uuid.uuid4().hex[:8]}")
    m.on_new_request(ctx)
    out = m.prepare_store(list(keys), ctx)
    assert out is not None, "primary tier full"
    view = primary(m)
    if fill is not None:
        for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
            view[int(c)] = fill(k, view.shape[1])
    del view
    m.complete_store(out.keys_to_store, ctx)
    m.on_request_finished(ctx)
    if wait:
        settle(m)


def lookup_until_final(m: TieringOffloadingManager, keys: Sequence[OffloadKey],
                       ctx: ReqContext, between: Optional[Callable[[int], None]] = None
                       ) -> list[LookupResult]:
    """Looks keys up step after step until each is HIT or MISS (promotions
    from the tiers finish in between). between(step) runs before each step
    ends (the test's hook)."""
    deadline = time.monotonic() + BOUND_S
    step = 0
    while True:
        res = [m.lookup(k, ctx) for k in keys]
        if all(r in (LookupResult.HIT, LookupResult.MISS) for r in res):
            return res
        assert time.monotonic() < deadline, f"lookups did not settle: {res}"
        if between is not None:
            between(step)
        m.on_schedule_end(STEP)
        step += 1
        time.sleep(0.002)


def load(m: TieringOffloadingManager, keys: Sequence[OffloadKey],
         between: Optional[Callable[[int], None]] = None
         ) -> tuple[list[LookupResult], dict[OffloadKey, bytes]]:
    """One request looks keys up (promoting hits from the tiers into the
    primary region) and reads the bytes of the leading hits, as the GPU load
    would: (lookup results, bytes per loaded key)."""
    ctx = ReqContext(req_id=f"load-{uuid.uuid4().hex[:8]}")
    m.on_new_request(ctx)
    res = lookup_until_final(m, keys, ctx, between)
    hits = []
    for k, r in zip(keys, res):
        if r is not LookupResult.HIT:
            break
        hits.append(k)
    got: dict[OffloadKey, bytes] = {}
    if hits:
        spec = m.prepare_load(hits, ctx)
        view = primary(m)
        for k, c in zip(hits, spec.chunk_ids):
            got[k] = view[int(c)].tobytes()
        del view
        m.complete_load(hits, ctx)
    m.on_request_finished(ctx)
    settle(m)
    return res, got
