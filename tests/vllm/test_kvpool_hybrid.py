"""kvpool.vllm.KVPoolConnector in vLLM 0.33's real Scheduler (tests/vllm/engine.py):
Mamba + attention hybrids (align mode), pipeline parallelism, the v2 model
runner's resumed requests. The Mamba states the fake forward writes name every
token before them (engine.TokenBook.state_key), so a loaded state is checked
byte for byte like the attention KV."""
from __future__ import annotations

import time
from typing import Any

import pytest

from test_kvpool_connector import E, HIT, PROMPT, agg_stats, in_child, kvt, pool, run  # noqa: F401

import kvpool_procs


def test_mamba_hybrid_state_and_kv_are_stored_and_loaded(pool: kvpool_procs.Proc) -> None:
    """An attention group plus a Mamba group (align): the second engine gets the
    prefix from the pool -- KV and the Mamba state at the hit point -- and both
    read back exactly what the first engine wrote."""
    a = run(E.make_engine(kvt(pool.addr), mode="mamba"), [("a0", PROMPT, 3)])
    b = run(E.make_engine(kvt(pool.addr), mode="mamba"), [("b0", PROMPT + [7, 8], 3)])
    try:
        assert [g.kv_cache_spec.__class__.__name__ for g in b.kv_cache_config.kv_cache_groups] == \
            ["FullAttentionSpec", "MambaSpec"]
        assert b.external_tokens["b0"] == [HIT]
        sb = agg_stats(b)
        assert sb["load_keys"] >= 7 and sb["load_failed_keys"] == 0  # 6 KV blocks + 1 state
        # the state loaded at 96 tokens was read by the forward (and checked after the load)
        assert b.verified_state_bytes >= 2 * 1280
    finally:
        a.shutdown()
        b.shutdown()


PP = """
e = T.run(E.make_engine(T.kvt(master), tp_size=tp, pp_size=pp), [("a0", T.PROMPT, 3)])
stored = T.agg_stats(e)["store_keys"]
assert e.reset_local_cache()
T.run(e, [("b0", T.PROMPT + [7, 8], 3)])
s = T.agg_stats(e)
print(json.dumps({"hit": e.external_tokens["b0"], "stored": stored, "loaded": s["load_keys"],
                  "failed": s["load_failed_keys"], "verified": e.verified_by_rank,
                  "local": e.verified_bytes - sum(e.verified_by_rank.values())}))
e.shutdown()
"""


@pytest.mark.parametrize("tp,pp", [(1, 2), (2, 2)])
def test_pipeline_parallel(pool: kvpool_procs.Proc, tp: int, pp: int) -> None:
    """PP ranks hold different layers: every rank stores its own blocks (keys
    of its pp_rank) and loads them back; the lookup of rank 0 covers them all."""
    r = in_child(PP, master=pool.addr, tp=tp, pp=pp)
    world = tp * pp
    assert r["hit"] == [HIT]
    assert r["stored"] == 6 * world and r["loaded"] == 6 * world and r["failed"] == 0
    assert r["local"] > 0 and sorted(map(int, r["verified"])) == list(range(1, world))
    assert all(v > 0 for v in r["verified"].values())


@pytest.mark.parametrize("v2", [False, True], ids=["v1-runner", "v2-runner"])
def test_resumed_request_saves_its_generated_tokens(pool: kvpool_procs.Proc, monkeypatch: pytest.MonkeyPatch,
                                                    v2: bool) -> None:
    """A request preempted after 40 generated tokens resumes by re-prefilling
    prompt + generated tokens (the v1 runner gets it as a resumed cached request,
    the v2 runner as a new request with prefill_token_ids). Its prefill ends
    there, as in vLLM 0.33's connector, so the chunked re-prefill past the
    original prompt is saved: a later request whose prompt is those 140 tokens
    hits 128 from the pool (not 96, the original prompt's blocks)."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    e = E.make_engine(kvt(pool.addr), max_num_batched_tokens=16)
    try:
        assert e.scheduler.use_v2_model_runner is v2
        e.add_request("p0", PROMPT, 50)
        while len(e.outputs["p0"]) < 40:
            assert e.step_count < 200, e.describe()
            e.step()
        # the prompt's blocks are saved in the background: the resume can only
        # load them from the pool once they are there (a loaded machine once
        # preempted before they were)
        _wait_pool_objects(pool.addr, HIT // 16)
        e.preempt("p0", own_step=True)
        assert e.reset_local_cache()  # the resume must come from the pool, chunk by chunk
        new_resumes: list[Any] = []
        deadline = time.monotonic() + 60  # idle steps sleep: time, not steps, bounds the wait
        while e.has_work():
            assert time.monotonic() < deadline, e.describe()
            res = e.step()
            so = res.scheduler_output
            if res.num_scheduled_tokens == 0:
                time.sleep(0.0005)
            if so is not None:
                new_resumes += [r for r in so.scheduled_new_reqs if r.prefill_token_ids is not None
                                and len(r.prefill_token_ids) > len(PROMPT)]
        assert e.mismatches == [], e.mismatches[:5]
        assert bool(new_resumes) is v2
        assert e.external_tokens["p0"] == [HIT]  # the resume loaded the prompt's blocks
        seen = PROMPT + e.outputs["p0"][:40]
        assert e.reset_local_cache()
        run(e, [("q0", seen, 2)])
        assert e.external_tokens["q0"] == [128]
    finally:
        e.shutdown()


def _wait_pool_objects(master: str, n: int, timeout: float = 30.0) -> None:
    """Waits until the pool at master holds at least n objects."""
    import kvpool
    c = kvpool.Client({"master": master, "mode": "standalone-store"})
    try:
        deadline = time.monotonic() + timeout
        while (got := int(c.stat()["counters"]["objects"])) < n:
            assert time.monotonic() < deadline, f"the pool holds {got} objects, not {n}"
            time.sleep(0.02)
    finally:
        c.close()


def _abort_at_checkpoint(e: E.Engine, rid: str, prompt: list[int], at: int) -> list[Any]:
    """Runs rid until its prefill stops at the Mamba checkpoint ``at`` (the
    scheduler ends a chunk there in align mode), aborts it then, drains the
    engine; the finish-time hand-offs the core gave the connector."""
    handed: list[Any] = []
    conn = e.scheduler.connector
    orig = conn.register_finished_partial_tail

    def spy(request: Any, block_ids: Any, offloads: Any) -> bool:
        handed.append((request.request_id, list(offloads)))
        return orig(request, block_ids, offloads)

    conn.register_finished_partial_tail = spy
    e.add_request(rid, prompt, 3)
    while e.scheduler.requests[rid].num_computed_tokens < at:
        assert e.step_count < 50, e.describe()
        e.step()
    assert e.scheduler.requests[rid].num_computed_tokens == at
    e.abort(rid)
    # the aborted request's blocks stay held until its saves end: bounded by
    # time, idle steps sleeping (a step count alone ran out in a few ms while
    # a loaded pool still stored)
    e.run_until_done(max_steps=100_000, max_seconds=60)
    assert e.mismatches == [], e.mismatches[:5]
    return handed


@pytest.mark.parametrize("finish_tail", [True, False], ids=["finish-tail", "without"])
def test_finish_time_partial_tail_is_stored_and_hit(pool: kvpool_procs.Proc, monkeypatch: pytest.MonkeyPatch,
                                                    finish_tail: bool) -> None:
    """Mamba blocks of 32 tokens, hash blocks of 16: a 90-token prompt's Mamba
    checkpoint is at 80, inside a Mamba block. The request ends (aborted) right
    after the chunk that stopped there, so the state at 80 is handed off only
    at finish (register_finished_partial_tail) -- stored with the attention KV
    up to 80, a later request on those 80 tokens hits all of them and reads
    the same bytes. Without the finish-time store the pool holds the KV of the
    4 whole blocks of the first chunk and no Mamba state: no hit at all."""
    import kvpool.vllm as kvv
    if not finish_tail:
        monkeypatch.setattr(kvv.KVPoolConnector, "register_finished_partial_tail",
                            lambda self, request, block_ids, offloads: False)
    prompt = list(range(5, 95))
    a = E.make_engine(kvt(pool.addr), mode="mamba2x")
    b = None
    try:
        assert (a.hash_block_size, [g.kv_cache_spec.block_size for g in a.kv_cache_config.kv_cache_groups]) \
            == (16, [16, 32])
        handed = _abort_at_checkpoint(a, "a0", prompt, 80)
        assert handed == [("a0", [(1, handed[0][1][0][1], 80)])]  # group 1 (Mamba), its CoW block, 80
        b = run(E.make_engine(kvt(pool.addr), mode="mamba2x"), [("b0", prompt[:80] + [7, 8, 9], 3)])
        sb = agg_stats(b)
        assert sb.get("load_failed_keys", 0) == 0
        if finish_tail:
            assert b.external_tokens["b0"] == [80]
            assert sb["load_keys"] == 6  # 5 KV blocks + the state at 80
            assert b.verified_state_bytes > 0
        else:  # the attention KV of 64 tokens is there, no Mamba state to resume from
            assert "b0" not in b.external_tokens and sb["store_existing_keys"] == 4
    finally:
        a.shutdown()
        if b is not None:
            b.shutdown()
