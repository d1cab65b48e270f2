"""The pool's KV events, read by a router built from vLLM 0.33's own decoder
classes (tests/vllm/kv_router.py), against real kvpool processes.

Each test ends with the router's picture equal to the master's snapshot
(hash for hash, tier for tier) and to what the pool holds, asked another way:
``lookup_hashes`` of every block (whose counting reads each object's tiers,
not the event bookkeeping), and gets of the keys behind the blocks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import engine as E  # noqa: E402  (sets VLLM_TARGET_DEVICE=cpu before vLLM loads)
import kvpool  # noqa: E402
import kvpool_procs  # noqa: E402
from kv_router import PoolView, snapshot_set  # noqa: E402

MiB = 1 << 20


def events_args() -> tuple[list[str], str, str]:
    pub, rep = kvpool_procs.free_ports(2)
    pe, re_ = f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"
    return ["--kv-events", pe, "--kv-events-replay", re_], pe, re_


def client(addr: str, **kw: Any) -> kvpool.Client:
    return kvpool.Client(dict({"master": addr, "mode": "standalone-store"}, **kw))


def check_against_pool(view: PoolView, c: kvpool.Client) -> None:
    """The router's picture is the master's snapshot, and each announced
    block is in that tier by lookup_hashes; nothing else is."""
    view.catch_up(c)
    seq, snap = snapshot_set(c)
    assert view.last_seq == seq
    assert view.as_snapshot() == snap
    by_group: dict[int, list[int]] = {}
    for h, g, _ in snap:
        by_group.setdefault(g, []).append(h)
    for g, hs in by_group.items():
        res = c.lookup_hashes([[h] for h in hs], groups=[g] * len(hs))
        for h, r in zip(hs, res):
            want = {t for (hh, gg, t) in snap if hh == h and gg == g}
            assert (r.dram == 1) == ("dram" in want), (h, g, r, want)
            assert (r.disk == 1) == ("disk" in want), (h, g, r, want)


def put_chain(c: kvpool.Client, prefix: str, hashes: list[int], size: int = 4096,
              parts: int = 1) -> list[str]:
    """Puts one chain of blocks; keys refused while the SSD tier makes room
    (NoSpaceError, -200) are put again."""
    keys = [f"{prefix}-{i}" for i in range(len(hashes))]
    blocks = [kvpool.Block(h, hashes[i - 1] if i else None, 16, parts) for i, h in enumerate(hashes)]
    values = [bytes([i % 251]) * size for i in range(len(hashes))]
    left = list(range(len(keys)))
    deadline = time.monotonic() + 30
    while left:
        res = c.put_batch([keys[i] for i in left], [values[i] for i in left],
                          blocks=[blocks[i] for i in left])
        assert all(r is None or isinstance(r, kvpool.NoSpaceError) for r in res), res
        left = [i for i, r in zip(left, res) if r is not None]
        assert time.monotonic() < deadline, "the pool never made room"
        if left:
            time.sleep(0.05)
    return keys


# ------------------------------------------------------------------ vLLM's scheduler

def test_router_follows_vllm_engines_through_the_pool() -> None:
    """Two engines in vLLM's real scheduler store and load through the pool; the
    router's picture ends equal to the master's, and holds the prompt's blocks
    under the very hashes vLLM's own KV events (its GPU block pool's) name them."""
    from vllm.distributed.kv_events import BlockStored

    args, pe, re_ = events_args()
    pool = kvpool_procs.serve("128MiB", *args)
    view = PoolView(pe, re_)
    try:
        with client(pool.addr) as c:
            time.sleep(0.3)  # the SUB's connection (ZeroMQ's slow joiner)
            store = json.dumps({"master": pool.addr, "mode": "standalone-store",
                                "global_segment_size": 0, "local_buffer_size": "16MiB"})
            kvt = {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
                   "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                   "kv_connector_extra_config": {"store_config": store}}
            prompt = list(range(5, 105))  # 6 full blocks of 16
            a = E.make_engine(kvt, kv_events=True)
            try:
                a.add_request("a0", prompt, 3)
                a.run_until_done()
                assert a.mismatches == []
                gpu = [e for e in a.events if isinstance(e, BlockStored) and e.medium != "kvpool"]
            finally:
                a.shutdown()
            b = E.make_engine(kvt)
            try:
                b.add_request("b0", prompt + [7, 8, 9], 3)
                b.run_until_done()
                assert b.mismatches == []
            finally:
                b.shutdown()
            check_against_pool(view, c)
            hashes = [h for e in gpu for h in e.block_hashes][:6]
            assert len(hashes) == 6, gpu
            held = view.blocks("kvpool-dram")
            assert {(h, 0) for h in hashes} <= held, (hashes, held)
            assert c.lookup_hashes([hashes])[0].dram == 6
            ours = [e for e in view.events if isinstance(e, BlockStored)]
            chained = [h for e in ours for h in e.block_hashes]
            assert chained[:6] == hashes  # in order, as one chain from the first block
    finally:
        view.close()
        pool.stop()


# ------------------------------------------------------------------ kvpool sim

def test_router_follows_kvpool_sim_with_tp_parts() -> None:
    """kvpool sim (2 instances x TP 2, so 2 parts per block) churns a small pool
    (eviction); the router's picture ends equal to the master's."""
    args, pe, re_ = events_args()
    pool = kvpool_procs.serve("48MiB", *args)
    view = PoolView(pe, re_)
    try:
        with client(pool.addr) as c:
            view.client = c
            time.sleep(0.3)
            r = subprocess.run([kvpool_procs.kvpool_bin(), "sim", "--master", pool.addr,
                                "--duration", "4", "--users", "6", "--num-blocks", "256"],
                               env=kvpool_procs.server_env(), capture_output=True, timeout=120)
            assert r.returncode == 0, r.stderr[-2000:]
            check_against_pool(view, c)
            st = c.stat()["counters"]
            assert st["block_objects"] > 0 and st["kv_lost"] == 0
            assert st["evictions"] > 0, "the pool was meant to be under pressure"
            assert view.snapshots == 0 and len(view.blocks("kvpool-dram")) > 0
            removed = sum(1 for ev in view.events if type(ev).__name__ == "BlockRemoved")
            assert removed > 0
    finally:
        view.close()
        pool.stop()


# ------------------------------------------------------------------ replay

def test_replay_after_subscriber_restart_and_snapshot_after_a_lost_gap() -> None:
    args, pe, re_ = events_args()
    pool = kvpool_procs.serve("64MiB", *args, "--kv-events-buffer", "8")
    try:
        with client(pool.addr) as c:
            view = PoolView(pe, re_, client=c)
            time.sleep(0.3)
            for i in range(3):
                put_chain(c, f"a{i}", [1000 * i + j for j in range(1, 5)])
                view.drain(quiet_s=0.2)
            last = view.last_seq
            seqs = list(view.seqs)
            picture = {k: set(v) for k, v in view.picture.items()}
            view.close()  # the router goes away ...
            for i in range(3, 6):  # ... batches it does not see (within the buffer)
                put_chain(c, f"a{i}", [1000 * i + j for j in range(1, 5)])
            time.sleep(0.3)
            view = PoolView(pe, re_, client=c, last_seq=last)  # ... and comes back
            view.picture.update(picture)
            view.seqs = seqs
            time.sleep(0.3)
            put_chain(c, "a6", [6001])  # a live batch: its gap is replayed
            view.drain(quiet_s=0.3)
            assert view.replayed >= 3 and view.snapshots == 0
            assert view.seqs == list(range(view.seqs[0], view.seqs[0] + len(view.seqs)))
            check_against_pool(view, c)
            # away for more than the buffer holds: replay starts past the gap
            last = view.last_seq
            picture = {k: set(v) for k, v in view.picture.items()}
            view.close()
            for i in range(20):
                put_chain(c, f"b{i}", [50000 + i])
                time.sleep(0.02)  # one batch each
            view = PoolView(pe, re_, client=c, last_seq=last)
            view.picture.update(picture)
            time.sleep(0.3)
            got = view.replay(last + 1)
            assert got and got[0][0] > last + 1  # the oldest are gone
            put_chain(c, "c", [60000])
            view.drain(quiet_s=0.3)
            assert view.snapshots == 1
            check_against_pool(view, c)
            assert (60000, 0) in view.blocks("kvpool-dram")
            view.close()
    finally:
        pool.stop()


# ------------------------------------------------------------------ tiers and failures

def test_tier_moves_node_loss_remove_all_and_master_restart(tmp_path: Path) -> None:
    """Eviction to the SSD tier and loads back, a storage node killed with
    SIGKILL, REMOVE_ALL, a restarted master: each gives the events a router
    needs, and nothing is announced that a get would not find."""
    args, pe, re_ = events_args()
    m = kvpool_procs.master("--client-ttl", "2s", "--lease-ttl", "1s", *args)
    d = tmp_path / "disk"
    d.mkdir()
    node: Any = None
    try:
        node = kvpool_procs.Store(m.addr, "--segment-size", "8MiB", "--enable-offload", "true",
                                  "--offload-dir", str(d), "--offload-capacity", "256MiB",
                                  "--offload-page-size", "64MiB")
        with client(m.addr) as c:
            view = PoolView(pe, re_, client=c)
            time.sleep(0.3)
            hashes = [70000 + i for i in range(24)]
            keys = put_chain(c, "t", hashes, size=MiB)  # 24 MiB into 8: spills
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                view.drain(quiet_s=0.3)
                if view.blocks("kvpool-disk"):
                    break
            check_against_pool(view, c)
            on_disk = {h for (h, _) in view.blocks("kvpool-disk")}
            only_disk = on_disk - {h for (h, _) in view.blocks("kvpool-dram")}
            assert only_disk, "some blocks moved to the SSD tier"
            # nothing announced that a get would not find
            for h, k in zip(hashes, keys):
                if (h, 0) in view.picture:
                    assert len(c.get(k)) == MiB
            view.drain(quiet_s=0.5)  # the loads the gets caused: DRAM again
            check_against_pool(view, c)
            # the node dies: after client_ttl, every block it held is withdrawn
            node.stop(signal.SIGKILL)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and view.picture:
                view.drain(quiet_s=0.3)
            assert not view.picture
            check_against_pool(view, c)
            node = kvpool_procs.Store(m.addr, "--segment-size", "64MiB")
            put_chain(c, "u", [80001, 80002, 80003])
            view.drain(quiet_s=0.3)
            assert {(80001, 0), (80002, 0), (80003, 0)} <= view.blocks("kvpool-dram")
            cleared = view.cleared
            assert c.remove_all(force=True) >= 3
            view.drain(quiet_s=0.3)
            assert view.cleared == cleared + 1 and not view.picture
            put_chain(c, "v", [90001])
            view.drain(quiet_s=0.3)
            before = view.last_seq
            view.close()
        # a restarted master: its stream starts with AllBlocksCleared at a later seq
        node.stop()
        m.stop()
        m = kvpool_procs.master(*args)
        with client(m.addr) as c:
            view = PoolView(pe, re_, client=c, last_seq=before)
            view.picture[(90001, 0)].add("kvpool-dram")  # what the router knew
            time.sleep(0.3)
            got = view.replay(0)
            assert got and got[0][0] > before
            assert view.decoder.decode(got[0][1]).events[0].__class__.__name__ == \
                "AllBlocksCleared"
            view.catch_up(c)
            assert not view.picture
            view.close()
    finally:
        if node is not None:
            node.stop()
        m.stop()
