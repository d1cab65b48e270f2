"""vLLM's real CPU engine against a pool that is down, dies, comes back, is
shared with engines of other configurations, or churns at capacity: the
engine always finishes its requests with the tokens of an engine without a
connector, and never loads the wrong KV."""
from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import kvpool_procs
import tiny_weights
from conftest import BLOCK, Engines, kv_config, pool_stats, prompt

P1 = prompt(11, 300)
P2 = prompt(12, 260)
P3 = prompt(13, 230)
FULL1 = (len(P1) // BLOCK) * BLOCK
FULL2 = (len(P2) // BLOCK) * BLOCK
MT = 8


def _touch(run_dir: Path, name: str) -> None:
    (run_dir / name).touch()


def _wait_marker(r: Any, name: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not (r.dir / name).exists():
        assert r.proc.poll() is None, f"engine exited early:\n{r.log[-4000:]}"
        assert time.monotonic() < deadline, f"no {name}:\n{r.log[-3000:]}"
        time.sleep(0.05)


def _wait_attached(addr: str, timeout: float = 30) -> float:
    """Waits until a client (the engine's worker) is connected to the pool at
    addr; returns how long that took. (The worker uses the pool a moment
    after its HELLO, once it has registered its buffers: the phase that
    follows waits 3 s more.)"""
    t0 = time.monotonic()
    # clients: serve's own storage node and this `kvpool stat` are two of them
    while pool_stats(addr)["counters"]["clients"] < 3:
        assert time.monotonic() - t0 < timeout, "the engine did not reconnect to the pool"
        time.sleep(0.2)
    return time.monotonic() - t0


def _wait_objects(addr: str, n: int, timeout: float = 30) -> None:
    """Waits until the pool at addr holds at least n objects (a request's
    blocks are put in one batch: they appear together)."""
    t0 = time.monotonic()
    while (have := pool_stats(addr)["counters"]["objects"]) < n:
        assert time.monotonic() - t0 < timeout, f"the pool holds {have} objects, not {n}"
        time.sleep(0.1)


def test_engine_starts_without_the_pool_and_outlives_it(
        llama: str, engines: Engines) -> None:
    """Pool unreachable at start, started later, killed during a batch,
    restarted: every request finishes with the no-connector tokens; hits
    resume after each return of the pool."""
    ref = engines.run(llama, [{"name": "p", "prompts": [P1, P2, P3], "max_tokens": MT}])
    want = dict(zip(("P1", "P2", "P3"), ref.tokens("p")))
    port = kvpool_procs.free_ports(1)[0]
    addr = f"127.0.0.1:{port}"
    d = engines.tmp / "markers"
    d.mkdir()
    ph = [
        {"name": "down", "prompts": [P1], "max_tokens": MT},
        {"name": "up_store", "prompts": [P1], "max_tokens": MT,
         "wait_for": str(d / "pool_up"), "sleep_s": 3},
        {"name": "up_hit", "prompts": [P1], "max_tokens": MT, "wait_for": str(d / "stored1")},
        {"name": "killed", "prompts": [P1, P2, P3] * 3, "max_tokens": MT,
         "wait_for": str(d / "go_kill")},
        {"name": "after_kill", "prompts": [P1, P2], "max_tokens": MT,
         "wait_for": str(d / "killed_now")},
        {"name": "back_store", "prompts": [P2], "max_tokens": MT,
         "wait_for": str(d / "pool_back"), "sleep_s": 3},
        {"name": "back_hit", "prompts": [P2], "max_tokens": MT, "wait_for": str(d / "stored2")},
    ]
    r = engines.start(llama, ph, kv=dict(kv_config(addr), kv_load_failure_policy="recompute"))
    pool = None
    try:
        _wait_marker(r, "down.done")
        pool = kvpool_procs.serve("256MiB", listen=addr)
        attach_s = _wait_attached(addr)
        _touch(d, "pool_up")
        _wait_marker(r, "up_store.done")
        _wait_objects(addr, FULL1 // BLOCK)    # a store lands after its request returned
        _touch(d, "stored1")
        _wait_marker(r, "up_hit.done")
        _touch(d, "go_kill")
        _wait_marker(r, "killed.start")
        time.sleep(0.2)
        pool.stop(signal.SIGKILL)
        pool = None
        _touch(d, "killed_now")
        _wait_marker(r, "after_kill.done")
        pool = kvpool_procs.serve("256MiB", listen=addr)
        back_s = _wait_attached(addr)
        _touch(d, "pool_back")
        _wait_marker(r, "back_store.done")
        _wait_objects(addr, FULL2 // BLOCK)
        _touch(d, "stored2")
        r.wait()
    finally:
        if r.proc.poll() is None:
            r.proc.kill()
        if pool is not None:
            pool.stop()
    assert r.tokens("down") == [want["P1"]] and r.cached("down") == [0]
    assert r.tokens("up_store") == [want["P1"]]
    assert r.tokens("up_hit") == [want["P1"]] and r.cached("up_hit") == [FULL1], \
        "no hit once the pool was up"
    assert r.tokens("killed") == ref.tokens("p") * 3
    assert r.tokens("after_kill") == [want["P1"], want["P2"]]
    assert r.cached("after_kill") == [0, 0]
    assert r.tokens("back_hit") == [want["P2"]] and r.cached("back_hit") == [FULL2], \
        "no hit after the pool came back"
    # one warning at start, one per outage (not one per request)
    assert r.log.count("pool unreachable") == 2, r.log.count("pool unreachable")
    print(f"attached {attach_s:.1f} s after the pool started, {back_s:.1f} s after its restart")


def test_engines_of_other_configurations_share_nothing(
        pool: kvpool_procs.Proc, models: Path, llama: str, engines: Engines) -> None:
    """bfloat16 and float16 engines of one model, and two weight sets under
    one directory name, on one pool: none loads another's KV; each hits its
    own prefixes."""
    kv = kv_config(pool.addr)
    other = models / "other" / Path(llama).name      # same base name, other weights
    tiny_weights.write(str(other), tiny_weights.SMALL, seed=99)
    variants = [(llama, "bfloat16"), (llama, "float16"), (str(other), "bfloat16")]
    firsts = []
    for m, dt in variants:
        h0 = pool_stats(pool.addr)["counters"]["hits"]
        r = engines.run(m, [{"name": "first", "prompts": [P1], "max_tokens": MT},
                            {"name": "again", "prompts": [P1], "max_tokens": MT}],
                        kv=kv, dtype=dt)
        # the first run computed everything (a miss): the tokens of this engine
        # without a connector; the second loaded them from the pool
        assert r.cached("first") == [0], f"{m} {dt} loaded another configuration's KV"
        assert r.tokens("again") == r.tokens("first"), f"{m} {dt}: a hit changed the tokens"
        assert r.cached("again") == [FULL1], f"{m} {dt} did not hit its own prefix"
        assert pool_stats(pool.addr)["counters"]["hits"] - h0 == FULL1 // BLOCK
        firsts.append(r.tokens("first"))
    # other weights under the same name compute other tokens: sharing KV would be wrong
    assert firsts[0] != firsts[2]
    shutil.rmtree(other.parent)


def test_no_load_failures_with_the_pool_at_capacity(
        llama: str, engines: Engines) -> None:
    """A pool that holds ~30 blocks, an engine cycling 12 prompts of 9 blocks
    through it: lookups that hit must load (a lookup's lease holds what it
    counted), so vLLM's default kv_load_failure_policy ("fail") never fails a
    request."""
    pool = kvpool_procs.serve("1MiB")
    try:
        kv = kv_config(pool.addr)
        prompts = [prompt(100 + i, 300) for i in range(12)]
        ref = engines.run(llama, [{"name": "p", "prompts": prompts, "max_tokens": 4}])
        phases = [{"name": f"r{k}", "prompts": prompts[k % 4 * 3:k % 4 * 3 + 3] + prompts[:2],
                   "max_tokens": 4} for k in range(8)]
        r = engines.run(llama, phases, kv=kv)
        sels = [prompts[k % 4 * 3:k % 4 * 3 + 3] + prompts[:2] for k in range(8)]
        hits = sum(1 for k in range(8) for c in r.cached(f"r{k}") if c)
        c = pool_stats(pool.addr)["counters"]
        m = r.phase("r7")["metrics"]
        print(f"capacity churn: {hits} requests hit, {int(m.get('vllm:kvpool_keys:load', 0))} "
              f"blocks loaded, {int(m.get('vllm:kvpool_failed_keys:load', 0))} failed, "
              f"{c['evictions']} evictions")
        for k in range(8):
            assert r.tokens(f"r{k}") == [ref.tokens("p")[prompts.index(p)] for p in sels[k]]
        assert c["evictions"] > 0, "the pool never churned"
        assert hits > 0, "no hits at all"
        assert m.get("vllm:kvpool_keys:load", 0) > 0, m       # loads were made ...
        assert m.get("vllm:kvpool_failed_keys:load", 0) == 0, m  # ... and none failed
    finally:
        pool.stop()
