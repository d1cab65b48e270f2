"""save_decode_cache in vLLM 0.33's real Scheduler (tests/vllm/engine.py, fake forward).

With ``save_decode_cache`` the blocks a request fills while it decodes are stored
too, under the chained block hashes vLLM extends over generated tokens: a later
request whose prompt is the first one's prompt + generated tokens hits blocks past
the first prompt. A kv_consumer with it stores as well, from its first decode step
(the prompt blocks the pool lacks, then its decode blocks). Every byte loaded is
checked against what the fake forward wrote (engine.mismatches) and every test ends
with the scheduler empty and every block free (run())."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import engine as E  # noqa: E402  (sets VLLM_TARGET_DEVICE=cpu before vLLM loads)
import kvpool_procs  # noqa: E402
from test_kvpool_connector import PROMPT, agg_stats, kvt, run  # noqa: E402

GEN = 40  # 100 prompt + 40 generated: 139 tokens computed, 8 whole blocks of 16
DECODE_HIT = 128


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("128MiB")
    yield p
    p.stop()


def with_role(cfg: dict[str, Any], role: str) -> dict[str, Any]:
    cfg["kv_role"] = role
    return cfg


def hit_after(master: str, prompt: list[int]) -> int:
    """A fresh kv_both engine's external hit for prompt; what it loaded is
    verified byte for byte (run())."""
    b = run(E.make_engine(kvt(master)), [("b0", prompt, 2)])
    try:
        hit = b.external_tokens.get("b0", [0])[0]  # absent: no hit
        assert hit == 0 or b.verified_bytes > 0
        return hit
    finally:
        b.shutdown()


@pytest.mark.parametrize("role", ["kv_both", "kv_producer", "kv_consumer"])
def test_decode_blocks_are_stored_and_hit(pool: kvpool_procs.Proc, role: str) -> None:
    a = run(E.make_engine(with_role(kvt(pool.addr, save_decode_cache=True), role)),
            [("a0", PROMPT, GEN)])
    try:
        assert len(a.outputs["a0"]) == GEN
        st = agg_stats(a)
        assert st["store_keys"] == DECODE_HIT // 16 and st["store_failed_keys"] == 0
        # past the 96 tokens of the prompt's blocks
        assert hit_after(pool.addr, PROMPT + a.outputs["a0"] + [7]) == DECODE_HIT
    finally:
        a.shutdown()


def test_async_scheduling(pool: kvpool_procs.Proc) -> None:
    """With async scheduling a decode step is scheduled before its token is
    known: a block is saved one step later, still whole and right."""
    a = run(E.make_engine(kvt(pool.addr, save_decode_cache=True), async_scheduling=True),
            [("a0", PROMPT, GEN)])
    a.shutdown()
    assert hit_after(pool.addr, PROMPT + a.outputs["a0"] + [7]) == DECODE_HIT


@pytest.mark.parametrize("role,want", [("kv_both", 96), ("kv_consumer", 0)])
def test_without_it_decode_blocks_are_not_stored(pool: kvpool_procs.Proc, role: str,
                                                 want: int) -> None:
    a = run(E.make_engine(with_role(kvt(pool.addr), role)), [("a0", PROMPT, GEN)])
    a.shutdown()
    assert hit_after(pool.addr, PROMPT + a.outputs["a0"] + [7]) == want


def test_consumer_that_loaded_stores_only_what_the_pool_lacks(pool: kvpool_procs.Proc) -> None:
    """A producer stores the prompt; a consumer loads it, decodes with
    save_decode_cache: its saves find the 6 loaded blocks present and put the
    2 decode blocks; a third engine hits all 8."""
    p = run(E.make_engine(kvt(pool.addr)), [("p0", PROMPT, 2)])
    p.shutdown()
    c = run(E.make_engine(with_role(kvt(pool.addr, save_decode_cache=True), "kv_consumer")),
            [("c0", PROMPT + [7, 8], GEN)])
    try:
        assert c.external_tokens["c0"] == [96]
        st = agg_stats(c)
        assert st["store_keys"] == 8 and st["store_existing_keys"] == 6
        assert hit_after(pool.addr, PROMPT + [7, 8] + c.outputs["c0"] + [9]) == DECODE_HIT
    finally:
        c.shutdown()


def test_preempted_while_decoding(pool: kvpool_procs.Proc) -> None:
    """Preempted in decode and resumed (the re-prefill of prompt + generated
    tokens): still every byte right, every block freed, and the decode blocks
    stored."""
    a = E.make_engine(kvt(pool.addr, save_decode_cache=True))
    try:
        a.add_request("a0", PROMPT, GEN)
        for _ in range(200):
            a.step()
            if len(a.outputs.get("a0", [])) >= 20:
                break
        a.preempt("a0", own_step=True)
        a.run_until_done()
        assert a.mismatches == [], a.mismatches[:5]
        a.assert_empty()
        assert "a0" in a.preempted_req_ids_seen
        assert hit_after(pool.addr, PROMPT + a.outputs["a0"] + [7]) == DECODE_HIT
    finally:
        a.shutdown()


def test_kv_events_name_the_decode_blocks_tokens(pool: kvpool_procs.Proc) -> None:
    """The connector's BlockStored events (medium "kvpool") cover the decode
    blocks too, each with the 16 tokens it holds (prompt + generated)."""
    from vllm.distributed.kv_events import BlockStored

    a = E.make_engine(kvt(pool.addr, save_decode_cache=True), kv_events=True)
    try:
        a.add_request("a0", PROMPT, GEN)
        a.run_until_done()
        assert a.mismatches == [], a.mismatches[:5]
        ours = [e for e in a.events if isinstance(e, BlockStored) and e.medium == "kvpool"]
        toks = PROMPT + a.outputs["a0"]
        assert [e.token_ids for e in ours] == [toks[i:i + 16] for i in range(0, DECODE_HIT, 16)]
    finally:
        a.shutdown()
