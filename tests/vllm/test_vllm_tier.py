"""kvpool as a secondary tier of vLLM's native offloading (kvpool.vllm_tier),
driven by vLLM's own TieringOffloadingManager on CPU (tier_driver.py) against
a real `kvpool serve` started here: chunks one engine stores are promoted into
another engine's host memory byte for byte; the transfers go straight between
the primary region and the pool's shared memory; configurations that differ
never meet; RETRY while a chunk is being stored; a load that loses a chunk
reports the others and looks the lost one up as a miss from then on; STORAGE
events; vLLM's per-tier read/write metrics; a pool that cannot be reached
stops the start with the reason."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parents[1] / "python", HERE.parents[1] / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import docblocks  # noqa: E402
import kvpool  # noqa: E402
import kvpool_procs  # noqa: E402
import tier_driver as T  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from kvpool.vllm_tier import KVPoolTier, tier_key  # noqa: E402

HIT, MISS, RETRY = LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("128MiB")
    yield p
    p.stop()


def tier_of(m: Any) -> KVPoolTier:
    t = m.secondary_tiers[0]
    assert isinstance(t, KVPoolTier)
    return t


def test_chunks_stored_by_one_engine_are_promoted_into_another(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    b = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("promote", 12)
        T.store(a, keys)
        ta = tier_of(a)
        with kvpool.Client({"master": pool.addr}) as c:  # in the pool under the tier's keys
            assert c.exist_batch([tier_key(ta.key_prefix, k) for k in keys]) == [True] * 12
        res, got = T.load(b, keys)
        assert res == [HIT] * 12
        size = ta.block_size_bytes
        for k in keys:
            assert got[k] == T.payload(k, size).tobytes()
        # straight between the registered primary regions and the node's shared memory
        assert ta._client.stats()["shm"]["put_bytes"] == 12 * size
        assert tier_of(b)._client.stats()["shm"]["get_bytes"] == 12 * size
        assert ta._client.stats()["tcp"]["put_bytes"] == 0
    finally:
        a.shutdown()
        b.shutdown()


def test_readme_configuration_as_written(pool: kvpool_procs.Proc) -> None:
    """The README's block, with the test pool's address and a small host region."""
    import json
    text = docblocks.blocks("README.md")["vllm-tier-config"].text
    conf = json.loads(text.replace("127.0.0.1:50051", pool.addr))
    assert conf["kv_connector"] in KVConnectorFactory._registry
    extra = conf["kv_connector_extra_config"]
    assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
    extra = dict(extra, cpu_bytes_to_use=32 * 16384)
    a = T.make_manager(pool.addr, extra=extra)
    b = T.make_manager(pool.addr, extra=extra)
    try:
        keys = T.keys_of("readme", 3)
        T.store(a, keys)
        res, got = T.load(b, keys)
        assert res == [HIT] * 3
        assert got[keys[1]] == T.payload(keys[1], 16384).tobytes()
    finally:
        a.shutdown()
        b.shutdown()


def test_configurations_that_differ_never_meet(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr, tp=1)
    others = [T.make_manager(pool.addr, dtype="bfloat16"),
              T.make_manager(pool.addr, model="another-model"),
              T.make_manager(pool.addr, tp=2, agnostic=False),
              T.make_manager(pool.addr, tier=T.tier_conf(pool.addr, namespace="tenant-b/"))]
    same_layout = T.make_manager(pool.addr, tp=2, agnostic=True)  # vLLM's TP-free chunks share
    try:
        keys = T.keys_of("apart", 4)
        T.store(a, keys)
        for m in others:
            res, _ = T.load(m, keys)
            assert res == [MISS] * 4, tier_of(m).key_prefix
        res, got = T.load(same_layout, keys)
        assert res == [HIT] * 4
        assert got[keys[0]] == T.payload(keys[0], tier_of(a).block_size_bytes).tobytes()
        prefixes = {tier_of(m).key_prefix for m in [a, same_layout] + others}
        assert len(prefixes) == 5
    finally:
        for m in [a, same_layout] + others:
            m.shutdown()


def test_retry_while_storing_then_hit(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("retry", 3)
        T.store(a, keys, wait=False)  # jobs queued or running, not yet reported
        t = tier_of(a)
        ctx = ReqContext(req_id="probe")
        assert [t.lookup(k, ctx) for k in keys] == [RETRY] * 3
        assert t.has_pending_work()
        t.drain_jobs()
        T.settle(a)  # get_finished_jobs reports the stores
        assert not t.has_pending_work()
        res = [t.lookup(k, ctx) for k in keys]  # not asked yet: the async lookup starts
        assert res == [RETRY] * 3
        t.on_schedule_end(T.STEP)
        deadline = T.time.monotonic() + T.BOUND_S
        while res != [HIT] * 3 and T.time.monotonic() < deadline:
            T.time.sleep(0.005)
            res = [t.lookup(k, ctx) for k in keys]
            t.on_schedule_end(T.STEP)  # a step: answers that came in are taken at the next
        assert res == [HIT] * 3
        t.on_request_finished(ctx)
    finally:
        a.shutdown()


def test_a_miss_seen_before_a_store_turns_into_a_hit(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("late", 2)
        t = tier_of(a)
        ctx = ReqContext(req_id="early")  # a request that asked before the chunks existed
        assert [t.lookup(k, ctx) for k in keys] == [RETRY] * 2
        t.on_schedule_end(T.STEP)
        deadline = T.time.monotonic() + T.BOUND_S
        res = [RETRY]
        while RETRY in res and T.time.monotonic() < deadline:
            T.time.sleep(0.005)
            res = [t.lookup(k, ctx) for k in keys]
            t.on_schedule_end(T.STEP)
        assert res == [MISS] * 2
        T.store(a, keys)
        assert [t.lookup(k, ctx) for k in keys] == [HIT] * 2
        t.on_request_finished(ctx)
    finally:
        a.shutdown()


def test_load_that_loses_a_chunk_keeps_the_others(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    b = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("lose", 4)
        T.store(a, keys)
        lost = tier_key(tier_of(a).key_prefix, keys[2])
        removed: list[bool] = []

        def remove_once(step: int) -> None:  # after the tier said HIT, before the load runs
            if not removed and tier_of(b)._jobs == {} and b._pending_load_submissions:
                with kvpool.Client({"master": pool.addr}) as c:
                    c.remove(lost, force=True)
                removed.append(True)

        res, got = T.load(b, keys, between=remove_once)
        assert removed == [True]
        assert res[:2] == [HIT, HIT] and res[2] == MISS
        size = tier_of(a).block_size_bytes
        assert got[keys[0]] == T.payload(keys[0], size).tobytes()
        assert got[keys[1]] == T.payload(keys[1], size).tobytes()
        res2, _ = T.load(b, keys[2:3])  # looked up as a miss now, not promoted again
        assert res2 == [MISS]
    finally:
        a.shutdown()
        b.shutdown()


def test_a_value_of_another_size_under_a_key_is_never_loaded(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr)
    b = T.make_manager(pool.addr)
    try:
        keys = T.keys_of("short", 3)
        T.store(a, keys[:2])
        size = tier_of(a).block_size_bytes
        with kvpool.Client({"master": pool.addr}) as c:  # a short value under the third key
            c.put(tier_key(tier_of(a).key_prefix, keys[2]), b"\x01" * (size // 2))
        res, got = T.load(b, keys)
        assert res == [HIT, HIT, MISS]
        assert got[keys[0]] == T.payload(keys[0], size).tobytes()
        assert keys[2] not in got
        assert T.load(b, keys[2:])[0] == [MISS]  # and it stays a miss
    finally:
        a.shutdown()
        b.shutdown()


def test_storage_events_and_tier_metrics(pool: kvpool_procs.Proc) -> None:
    a = T.make_manager(pool.addr, events=True,
                       tier=T.tier_conf(pool.addr, enable_kv_events=True, locality="REMOTE"))
    try:
        keys = T.keys_of("events", 5)
        T.store(a, keys)
        ev = [e for e in a.take_events() if e.medium is Medium.STORAGE]
        assert len(ev) == 1 and set(ev[0].keys) == set(keys) and not ev[0].removed
        assert ev[0].locality is not None and ev[0].locality.value == "REMOTE"
        stats = a.get_stats()
        assert stats is not None
        data = stats.data["data"] if "data" in stats.data else stats.data
        written = {name: v for name, v in data.items() if "write_bytes" in name}
        assert written, stats.data
        assert sum(sum(s.values()) if isinstance(s, dict) else s for s in written.values()) \
            == 5 * tier_of(a).block_size_bytes
    finally:
        a.shutdown()


def test_unreachable_pool_stops_the_start_with_the_reason() -> None:
    port = kvpool_procs.free_ports(1)[0]
    with pytest.raises(kvpool.Error):
        T.make_manager("127.0.0.1:1", tier=T.tier_conf(f"127.0.0.1:{port}",
                                                        config={"master": f"127.0.0.1:{port}",
                                                                "rpc_timeout": 1000}))


@pytest.mark.parametrize("param,value,why", [
    ("threads", 0, "threads must be an integer 1..64"),
    ("threads", "4", "threads must be an integer 1..64"),
    ("namespace", 7, "namespace must be a string"),
    ("enable_kv_events", "yes", "enable_kv_events must be true or false"),
])
def test_bad_tier_parameters_are_refused_with_the_reason(pool: kvpool_procs.Proc, param: str,
                                                         value: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        T.make_manager(pool.addr, tier=T.tier_conf(pool.addr, **{param: value}))
