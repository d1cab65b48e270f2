"""save_decode_cache in vLLM's real CPU engine (driver.py, tiny_weights.py).

One request generates GEN tokens with save_decode_cache on; a second request
whose prompt is the first prompt + those tokens + a few more then hits blocks
past the first prompt (vLLM's own prefix cache is off: the pool is the only
source), and both outputs equal a run of the same engine without a connector.
Through KVPoolConnector and through vLLM's in-tree MooncakeStoreConnector on
kvpool.mooncake (which implements save_decode_cache itself)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import kvpool_procs
from conftest import BLOCK, Engines, Run, kv_config, pool_stats, prompt

P = prompt(11, 300)                       # 9 full blocks + 12 tokens
GEN = 70                                  # 369 tokens computed: 11 full blocks
SUFFIX = prompt(12, 5)
PROMPT_BLOCKS = len(P) // BLOCK * BLOCK   # 288: what a prompt-only store gives
DECODE_HIT = (len(P) + GEN - 1) // BLOCK * BLOCK  # 352

PHASES = [{"name": "gen", "prompts": [P], "max_tokens": GEN},
          {"name": "follow", "continue_from": {"phase": "gen", "suffix": SUFFIX},
           "max_tokens": 8}]


def _mooncake_env(tmp_path: Path, master: str) -> dict[str, str]:
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(json.dumps({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                               "master_server_address": master, "protocol": "tcp",
                               "device_name": "", "mode": "standalone-store",
                               "global_segment_size": 0, "local_buffer_size": 64 << 20}))
    return {"MOONCAKE_CONFIG_PATH": str(cfg), "VLLM_HOST_IP": "127.0.0.1",
            "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "127.0.0.1"}


@pytest.fixture(scope="module")
def reference(llama: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same phases without a connector (one engine for both cases)."""
    return Engines(tmp_path_factory.mktemp("decode-ref")).run(llama, PHASES)


@pytest.mark.parametrize("connector", ["kvpool", "mooncake"])
def test_decode_blocks_hit_by_a_prompt_that_continues_the_output(
        pool: kvpool_procs.Proc, llama: str, engines: Engines, tmp_path: Path,
        reference: Run, connector: str) -> None:
    ref = reference
    kw: dict[str, Any] = {}
    if connector == "mooncake":
        kw = {"as_mooncake": True, "env": _mooncake_env(tmp_path, pool.addr)}
    r = engines.start(llama, PHASES, kv=kv_config(pool.addr, connector=connector,
                                                 save_decode_cache=True), **kw).wait()
    assert r.tokens("gen") == ref.tokens("gen")
    assert len(r.tokens("gen")[0]) == GEN
    assert r.cached("gen") == [0]
    assert r.tokens("follow") == ref.tokens("follow")
    # past the prompt's 9 blocks: the 2 blocks filled while decoding
    assert r.cached("follow") == [DECODE_HIT] and DECODE_HIT > PROMPT_BLOCKS
    assert pool_stats(pool.addr)["counters"]["hits"] >= DECODE_HIT // BLOCK
