"""KVPoolConnector inside vLLM's real engine: the CPU build of vLLM (real
forward passes, scripts/vllm-cpu-env) serving tiny models whose weights the
tests write (tiny_weights.py), against a real `kvpool serve` on 127.0.0.1.

Every case compares the generated tokens with the same engine without a
connector (greedy decoding, token-id prompts), and the hits with what the
pool and vLLM report. The corruption control shows that these models' tokens
depend on the KV cache, so identical tokens after a pool hit mean the right
bytes were loaded (vLLM's dummy weights would not show that)."""
from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

import kvpool_procs
import tiny_weights
from conftest import BLOCK, Engines, kv_config, pool_stats, prompt

P1 = prompt(1, 300)                  # 9 full blocks + 12 tokens
P2 = prompt(2, 250)                  # 7 full blocks + 26
P3 = prompt(3, 200)                  # a miss for every engine
P2_PARTIAL = P2[:160] + prompt(4, 100)   # shares P2's first 5 blocks
FULL = (len(P1) // BLOCK) * BLOCK
MAX_TOKENS = 8


def blocks_of(n: int) -> int:
    return (n // BLOCK) * BLOCK


@pytest.fixture(scope="module")
def baseline(llama: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Tokens of the engine without a connector, and the corruption control:
    the same engine with its own prefix cache, after scribbling over the KV
    cache, must produce other tokens for a prompt that hits it."""
    e = Engines(tmp_path_factory.mktemp("baseline"))
    prompts = [P1, P2, P3, P2_PARTIAL]
    r = e.run(llama, [{"name": "base", "prompts": prompts, "max_tokens": MAX_TOKENS},
                      {"name": "again", "prompts": [P1], "max_tokens": MAX_TOKENS},
                      {"name": "corrupt", "prompts": [P1], "max_tokens": MAX_TOKENS,
                       "corrupt_kv_before": True}],
              prefix_caching=True)
    toks = {i: t for i, t in enumerate(r.tokens("base"))}
    return {"P1": toks[0], "P2": toks[1], "P3": toks[2], "P2_PARTIAL": toks[3],
            "run": r}


def test_corrupted_kv_changes_the_tokens(baseline: dict[str, Any]) -> None:
    r = baseline["run"]
    assert r.cached("again") == [FULL]               # vLLM's own prefix cache hit ...
    assert r.tokens("again") == [baseline["P1"]]     # ... gives the same tokens
    assert r.phase("corrupt")["corrupted_layers"] >= tiny_weights.SMALL.layers
    assert r.cached("corrupt") == [FULL]
    assert r.tokens("corrupt") != [baseline["P1"]], \
        "scribbled KV gave the same tokens: this model's output ignores its KV cache"


def test_hits_from_a_fresh_process_full_partial_and_mixed(
        pool: kvpool_procs.Proc, llama: str, engines: Engines,
        baseline: dict[str, Any]) -> None:
    """Engine A stores P1 and P2 and exits; engine B, a fresh process, runs one
    batch of a full hit (P1), a partial hit (P2's first 5 blocks) and a miss."""
    kv = kv_config(pool.addr)
    a = engines.run(llama, [{"name": "store", "prompts": [P1, P2], "max_tokens": MAX_TOKENS}], kv=kv)
    assert a.tokens("store") == [baseline["P1"], baseline["P2"]]
    assert a.cached("store") == [0, 0]
    before = pool_stats(pool.addr)["counters"]
    b = engines.run(llama, [{"name": "mixed", "prompts": [P1, P2_PARTIAL, P3],
                             "max_tokens": MAX_TOKENS}], kv=kv)
    after = pool_stats(pool.addr)["counters"]
    assert b.tokens("mixed") == [baseline["P1"], baseline["P2_PARTIAL"], baseline["P3"]]
    assert b.cached("mixed") == [FULL, 160, 0]
    # the pool served exactly the blocks the hits name (one object per block)
    assert after["hits"] - before["hits"] == FULL // BLOCK + 160 // BLOCK


def test_prefix_caching_on_takes_local_hits_first(
        pool: kvpool_procs.Proc, llama: str, engines: Engines,
        baseline: dict[str, Any]) -> None:
    kv = kv_config(pool.addr)
    engines.run(llama, [{"name": "store", "prompts": [P1], "max_tokens": MAX_TOKENS}], kv=kv)
    h0 = pool_stats(pool.addr)["counters"]["hits"]
    r = engines.run(llama, [{"name": "pool", "prompts": [P1], "max_tokens": MAX_TOKENS},
                            {"name": "local", "prompts": [P1], "max_tokens": MAX_TOKENS}],
                    kv=kv, prefix_caching=True)
    assert r.tokens("pool") == r.tokens("local") == [baseline["P1"]]
    assert r.cached("pool") == r.cached("local") == [FULL]
    # the second run hit vLLM's own cache: the pool served only the first
    assert pool_stats(pool.addr)["counters"]["hits"] - h0 == FULL // BLOCK


def test_tp2_workers_in_their_own_processes(
        pool: kvpool_procs.Proc, llama: str, engines: Engines,
        baseline: dict[str, Any]) -> None:
    """TP 2: the scheduler in the EngineCore process, each rank a worker
    process. The second phase hits what the first stored (vLLM's own prefix
    cache is off, so the pool is the only source)."""
    kv = kv_config(pool.addr)
    # TP 2 sums its attention and MLP outputs in another order than TP 1: its
    # own tokens are the reference
    ref = engines.run(llama, [{"name": "p", "prompts": [P1, P3], "max_tokens": MAX_TOKENS}],
                      tp=2, multiproc=True)
    r = engines.run(llama, [{"name": "store", "prompts": [P1], "max_tokens": MAX_TOKENS},
                            {"name": "hit", "prompts": [P1, P3], "max_tokens": MAX_TOKENS}],
                    kv=kv, tp=2, multiproc=True)
    assert r.tokens("store") == ref.tokens("p")[:1]
    assert r.tokens("hit") == ref.tokens("p")
    assert r.cached("hit") == [FULL, 0]


def test_tp_independent_layout_tp1_and_tp2_share_prefixes(
        pool: kvpool_procs.Proc, llama: str, engines: Engines) -> None:
    """The TP-independent layout (one object per KV head): a TP 1 engine stores
    P1, a TP 2 engine hits it whole (each rank reading its own head) with its
    own no-connector tokens, and stores P2, which a TP 1 engine then hits with
    its own tokens. float32: TP 1 and TP 2 sum in other orders, and in
    bfloat16 that rounding alone moves this model's greedy tokens (the KV a
    TP 1 engine computes is not bit-equal to a TP 2 engine's). The pool
    serves one object per block and KV head."""
    kv = kv_config(pool.addr, tp_independent=True)
    heads = tiny_weights.SMALL.kv_heads
    ph = [{"name": "p", "prompts": [P1, P2], "max_tokens": MAX_TOKENS}]
    ref2 = engines.run(llama, ph, tp=2, multiproc=True, dtype="float32")
    ref1 = engines.run(llama, ph, dtype="float32")
    a = engines.run(llama, [{"name": "store", "prompts": [P1], "max_tokens": MAX_TOKENS}], kv=kv,
                    dtype="float32")
    assert a.tokens("store") == ref1.tokens("p")[:1]
    h0 = pool_stats(pool.addr)["counters"]["hits"]
    b = engines.run(llama, [{"name": "hit", "prompts": [P1, P2], "max_tokens": MAX_TOKENS}],
                    kv=kv, tp=2, multiproc=True, dtype="float32")
    assert b.cached("hit") == [FULL, 0]
    assert pool_stats(pool.addr)["counters"]["hits"] - h0 == FULL // BLOCK * heads
    assert b.tokens("hit") == ref2.tokens("p")
    c = engines.run(llama, [{"name": "hit", "prompts": [P2], "max_tokens": MAX_TOKENS}], kv=kv,
                    dtype="float32")
    assert c.cached("hit") == [blocks_of(len(P2))]
    assert c.tokens("hit") == ref1.tokens("p")[1:]


def test_preemption_with_the_scheduler_and_worker_apart(
        pool: kvpool_procs.Proc, llama: str, engines: Engines,
        baseline: dict[str, Any]) -> None:
    """A KV cache too small for the batch (vLLM preempts and resumes
    requests), the worker in a process of its own (executor "mp"), hits and
    misses mixed."""
    kv = kv_config(pool.addr)
    prompts = [P1, P2, P3, P2_PARTIAL]
    # 4 requests need 10 + 8 + 7 + 9 blocks with their 48 new tokens: 24 blocks
    # do not hold them, one request does fit
    r = engines.run(llama, [{"name": "store", "prompts": [P1, P2], "max_tokens": MAX_TOKENS},
                            {"name": "batch", "prompts": prompts, "max_tokens": 48}],
                    kv=kv, executor="mp", multiproc=True, num_blocks=24, max_model_len=512)
    ref = engines.run(llama, [{"name": "batch", "prompts": prompts, "max_tokens": 48}])
    assert r.tokens("batch") == ref.tokens("batch")
    assert r.phase("batch")["metrics"].get("vllm:num_preemptions", 0) > 0, "nothing was preempted"
    assert r.cached("batch")[0] == FULL


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_sliding_window_and_hybrid_models(
        pool: kvpool_procs.Proc, models: Path, engines: Engines, arch: str) -> None:
    """mistral: a sliding window in every layer; gemma3: full and sliding-window
    layers mixed (vLLM's hybrid KV cache manager, two KV-cache groups)."""
    m = tiny_weights.cached(str(models), tiny_weights.Shape(arch=arch), seed=7,
                            name=f"tiny-{arch}")
    ref = engines.run(m, [{"name": "p", "prompts": [P1, P3], "max_tokens": MAX_TOKENS}])
    r = engines.run(m, [{"name": "store", "prompts": [P1], "max_tokens": MAX_TOKENS},
                        {"name": "hit", "prompts": [P1, P3], "max_tokens": MAX_TOKENS}],
                    kv=kv_config(pool.addr))
    assert r.tokens("store") == ref.tokens("p")[:1]
    assert r.tokens("hit") == ref.tokens("p")
    assert r.cached("hit")[0] == FULL


def test_vllm_in_tree_mooncake_connector_on_kvpool(
        pool: kvpool_procs.Proc, llama: str, engines: Engines, tmp_path: Path,
        baseline: dict[str, Any]) -> None:
    """vLLM's own MooncakeStoreConnector, its `mooncake.store` being
    kvpool.mooncake (kvpool.install_as_mooncake), in the same engine."""
    import json
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                               "master_server_address": pool.addr, "protocol": "tcp",
                               "device_name": "", "mode": "standalone-store",
                               "global_segment_size": 0, "local_buffer_size": 64 << 20}))
    env = {"MOONCAKE_CONFIG_PATH": str(cfg), "VLLM_HOST_IP": "127.0.0.1",
           "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "127.0.0.1"}
    r = engines.start(llama, [{"name": "store", "prompts": [P1], "max_tokens": MAX_TOKENS},
                              {"name": "hit", "prompts": [P1], "max_tokens": MAX_TOKENS}],
                      kv=kv_config(pool.addr, connector="mooncake"), as_mooncake=True,
                      env=env).wait()
    assert r.tokens("store") == r.tokens("hit") == [baseline["P1"]]
    assert r.cached("hit") == [FULL]
    assert pool_stats(pool.addr)["counters"]["hits"] >= FULL // BLOCK
