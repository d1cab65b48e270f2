"""Self-checks of the vLLM engine harness (tests/vllm/engine.py).

Run with the vLLM venv:
    ~/.cache/kvpool/venv-vllm/bin/python -m pytest -q tests/vllm/test_engine_selfcheck.py

They prove the harness itself: vLLM's real scheduler runs to completion with
no connector (prefix sharing, preemption), the checks see a tampered slot, and
with the small probe connector (probe_connector.py, loaded by module path) a correct load
passes while a corrupted or missing load is reported (on rank 1 of TP 2 too).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed (use ~/.cache/kvpool/venv-vllm)", allow_module_level=True)

import engine as E  # noqa: E402
import probe_connector as P  # noqa: E402

PROMPT = list(range(3, 3 + 70))  # 4 full blocks + 6 tokens


def probe(**extra: Any) -> dict:
    return {"kv_connector": "ProbeConnector", "kv_connector_module_path": "probe_connector",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


@pytest.fixture(autouse=True)
def _clean_store() -> Iterator[None]:
    P.ProbeConnector.STORE.clear()
    yield
    P.ProbeConnector.STORE.clear()


def expected_tokens(req_id: str, prompt_len: int, n: int) -> list[int]:
    return [E.sample_token(req_id, prompt_len + i) for i in range(n)]


def save_then_load(eng: E.Engine, max_tokens: int = 4) -> None:
    """r0 computes PROMPT (the connector saves it); the local prefix cache is dropped
    (vLLM's reset_prefix_cache, connector kept); r1 = PROMPT + 3 tokens must load."""
    eng.add_request("r0", PROMPT, max_tokens)
    eng.run_until_done()
    assert eng.scheduler.reset_prefix_cache()  # local cache only: the pool keeps the blocks
    eng.add_request("r1", PROMPT + [7, 8, 9], max_tokens)
    eng.run_until_done()


def test_token_keys_depend_on_prefix_and_position() -> None:
    import torch
    book = E.TokenBook(digest_block=4)
    book.set_prompt("a", [1, 2, 3, 4, 9, 9, 9, 9])
    book.set_prompt("b", [1, 2, 3, 5, 9, 9, 9, 9])  # same second block, other first block
    pos = torch.arange(8)
    ka, kb = book.keys("a", pos), book.keys("b", pos)
    assert ka[:3].tolist() == kb[:3].tolist()  # same prefix, same token, same position
    assert all(x != y for x, y in zip(ka[3:].tolist(), kb[3:].tolist()))
    assert len(set(ka.tolist())) == 8
    assert book.token("a", 8) == E.sample_token("a", 8)


def test_no_connector_shared_prefix() -> None:
    eng = E.make_engine(None)
    try:
        eng.add_request("r0", PROMPT[:40], 4)
        eng.step()  # r0's prompt is computed (and cached) first
        eng.add_request("r1", PROMPT[:40], 4)
        eng.run_until_done()
        assert eng.mismatches == [] and eng.output_mismatches == []
        assert eng.verified_bytes > 0
        assert eng.prefill_stats["r1"].num_local_cached_tokens == 32
        assert eng.loaded_tokens == 0
        for rid in ("r0", "r1"):
            assert eng.outputs[rid] == expected_tokens(rid, 40, 4)
        assert eng.finished_req_ids_seen == {"r0", "r1"}
        assert len(eng.timings["schedule"]) == len(eng.timings["update_from_output"]) > 0
        eng.assert_empty()
    finally:
        eng.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_no_connector_preemption(async_scheduling: bool) -> None:
    eng = E.make_engine(None, num_blocks=14, async_scheduling=async_scheduling)
    try:
        for i in range(3):  # 3 x 5 blocks > 13 usable: vLLM preempts under block pressure
            eng.add_request(f"r{i}", [5 + i] * 16 + PROMPT[:40], 30)
        eng.run_until_done()
        assert eng.preempted_req_ids_seen and eng.resumed_req_ids_seen
        assert eng.mismatches == [] and eng.output_mismatches == []
        for i in range(3):
            assert eng.outputs[f"r{i}"] == expected_tokens(f"r{i}", 56, 30)
        eng.assert_empty()
    finally:
        eng.shutdown()


def test_tampered_slot_is_reported() -> None:
    eng = E.make_engine(None)
    try:
        eng.add_request("r0", PROMPT, 6)
        eng.step()
        eng.step()
        assert eng.mismatches == []
        block = eng.scheduler.kv_cache_manager.get_block_ids("r0")[0][1]
        eng.worker.kv_caches["model.layers.1.self_attn.attn"][block, 1, 3].view(-1)[5] += 1.0
        eng.step()
        assert any("layers.1" in m and "pos 19" in m and "wrong bytes" in m for m in eng.mismatches), eng.mismatches
    finally:
        eng.shutdown()


@pytest.mark.parametrize("mode,async_scheduling,load_async", [
    ("full", False, True),
    ("full", False, False),
    ("full", True, True),
    ("swa", False, True),
    ("swa", True, False),
    ("mla", False, True),
])
def test_probe_connector_load_verified(mode: str, async_scheduling: bool, load_async: bool) -> None:
    eng = E.make_engine(probe(load_async=load_async), mode=mode, async_scheduling=async_scheduling)
    try:
        save_then_load(eng)
        assert eng.mismatches == [] and eng.output_mismatches == []
        assert eng.external_tokens == {"r1": [64]}
        assert eng.loaded_tokens == 64
        assert eng.prefill_stats["r1"].num_external_cached_tokens == 64
        assert eng.outputs["r1"] == expected_tokens("r1", 73, 4)
        assert eng.verified_bytes > 0
        eng.assert_empty()
        assert eng.reset_cache()
    finally:
        eng.shutdown()


@pytest.mark.parametrize("extra,expect", [
    ({"corrupt": True}, "wrong bytes"),
    ({"corrupt": True, "load_async": False}, "wrong bytes"),
    ({"skip_load": True}, "poison"),
])
def test_probe_connector_bad_load_detected(extra: dict, expect: str) -> None:
    eng = E.make_engine(probe(**extra))
    try:
        save_then_load(eng)
        assert eng.loaded_tokens == 64
        assert any("req r1" in m and expect in m for m in eng.mismatches), eng.mismatches
        assert not any("req r0" in m for m in eng.mismatches)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("extra,loads", [
    ({"fail_load": 2}, [64, 64]),  # async: failed request retries, second load succeeds
    ({"fail_load": 1, "load_async": False}, [64]),  # sync: the failed block is recomputed
])
def test_probe_connector_load_failure_recomputed(extra: dict, loads: list[int]) -> None:
    eng = E.make_engine(probe(**extra))
    try:
        save_then_load(eng)
        assert eng.mismatches == []
        assert eng.external_tokens["r1"] == loads
        assert eng.outputs["r1"] == expected_tokens("r1", 73, 4)
        eng.assert_empty()
    finally:
        eng.shutdown()


def test_tp2_worker_process() -> None:
    """Rank 1 runs in a subprocess fed pickled SchedulerOutputs; its checks report back."""
    eng = E.make_engine(probe(corrupt_rank=1), tp_size=2)
    try:
        assert eng.worker.layers[0].tensor.shape[1] == 1  # 2 KV heads over 2 ranks
        save_then_load(eng)
        assert eng.outputs["r1"] == expected_tokens("r1", 73, 4)
        assert eng.mismatches and all("rank1" in m and "req r1" in m for m in eng.mismatches), eng.mismatches
        eng.assert_empty()
    finally:
        eng.shutdown()
