"""The TP-independent layout (kv_connector_extra_config "tp_independent", or the
in-tree connector's enable_store_tp_lcm / store_tp_size that imply it) through
vLLM 0.33's scheduler and KVPoolConnector (engine.py's engine: vLLM's own
scheduler, fake forwards writing bytes of the GLOBAL KV head, so a rank that
loads another head's bytes is caught): a TP 1 engine stores and a TP 2 engine
hits the same prefix, and the reverse; the bytes the loads move are exactly
the stored KV (each rank its own head); the configuration fingerprint is the
same for every TP size in this layout (and differs from the rank layout's)."""
from __future__ import annotations

import copy
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
from test_kvpool_connector import PROMPT, agg_stats, in_child, kvt, run  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import kvpool.vllm as kvv  # noqa: E402

TPI = {"tp_independent": True}


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("64MiB")
    yield p
    p.stop()


def _fp(tp: int, **extra: Any) -> str:
    kv = {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
          "kv_role": "kv_both", "kv_connector_extra_config": dict({"store_config": "{}"}, **extra)}
    p = E._plan(copy.deepcopy(kv), mode="full", num_blocks=32, block_size=16, max_num_seqs=4,
                max_num_batched_tokens=256, max_model_len=-1, async_scheduling=False, tp_size=tp,
                tp_rank=0)
    st = kvv._setup(p.vllm_config, p.worker_kv_cache_configs[0], KVConnectorRole.SCHEDULER)
    assert st.conn["tp_independent"] == bool(extra)
    return str(st.conn["config_fingerprint"])


def test_fingerprint_names_the_layout_not_the_tp_size() -> None:
    assert _fp(1, **TPI) == _fp(2, **TPI)
    assert _fp(1, enable_store_tp_lcm=True) == _fp(1, **TPI)  # the in-tree key implies it
    assert _fp(2, store_tp_size=1) == _fp(1, **TPI)
    assert _fp(1) != _fp(2)  # the rank layout: one pool namespace per TP size
    assert _fp(1) != _fp(1, **TPI)


TP2 = """
e = T.run(E.make_engine(T.kvt(master, **extra), tp_size=2), reqs)
s = T.agg_stats(e)
print(json.dumps({"hit": [e.external_tokens.get(r[0], [0])[0] for r in reqs],
                  "mismatches": e.mismatches, "verified": e.verified_bytes,
                  "load_keys": s.get("load_keys", 0), "load_bytes": s.get("load_bytes", 0),
                  "store_keys": s.get("store_keys", 0), "store_bytes": s.get("store_bytes", 0)}))
e.shutdown()
"""

# prompts of 6, 4, 8 and 3 full blocks (16 tokens) plus a tail; asked again
# with 2 more tokens, each hits exactly its stored blocks
LENS = (100, 70, 130, 50)


def prompts(base: int) -> list[list[int]]:
    return [list(range(base + 200 * i, base + 200 * i + n)) for i, n in enumerate(LENS)]


def reqs(tag: str, ps: list[list[int]], more: list[int] | None = None) -> list[tuple[str, list[int], int]]:
    return [(f"{tag}{i}", p + (more or []), 3) for i, p in enumerate(ps)]


def test_tp1_stores_tp2_hits_and_reverse(pool: kvpool_procs.Proc) -> None:
    """One tiny model (2 KV heads): TP 1 stores four prompts; a TP 2 engine
    (each rank one head) hits exactly what a TP 1 engine hits on them, moving
    exactly the bytes stored (bytes per hit / the reader's KV = 1.0); then a
    TP 2 engine stores four other prompts and a TP 1 engine hits them the same
    way. Every loaded byte is checked against its global head's values."""
    want = [n // 16 * 16 for n in LENS]  # every full block of each prompt
    ps = prompts(5)
    a = run(E.make_engine(kvt(pool.addr, **TPI)), reqs("a", ps))
    try:
        sa = agg_stats(a)
        assert a.loaded_tokens == 0 and a.mismatches == []
        assert sa["store_keys"] == sum(want) // 16 * 2  # one object per block and KV head
    finally:
        a.shutdown()
    b = in_child(TP2, master=pool.addr, extra=TPI, reqs=reqs("b", ps, [7, 8]))
    a2 = run(E.make_engine(kvt(pool.addr, **TPI)), reqs("t", ps, [7, 8]))
    try:
        tp1_hits = [a2.external_tokens[f"t{i}"][0] for i in range(len(ps))]
    finally:
        a2.shutdown()
    assert tp1_hits == want
    assert b["hit"] == tp1_hits and b["mismatches"] == [] and b["verified"] > 0
    assert b["load_keys"] == sum(want) // 16 * 2
    assert b["load_bytes"] == sa["store_bytes"]  # bytes moved per hit / reader's KV = 1.0
    print(f"\nFIGURE tp1->tp2 hit tokens {sum(b['hit'])}/{sum(LENS) + 2 * len(LENS)} "
          f"(tp1 alone {sum(tp1_hits)}), load bytes {b['load_bytes']} / stored "
          f"{sa['store_bytes']} = {b['load_bytes'] / sa['store_bytes']:.3f}")

    qs = prompts(5 + 100)
    c = in_child(TP2, master=pool.addr, extra=TPI, reqs=reqs("c", qs))
    assert set(c["hit"]) == {0} and c["store_keys"] == sum(want) // 16 * 2
    d = run(E.make_engine(kvt(pool.addr, **TPI)), reqs("d", qs, [7, 8]))
    try:
        sd = agg_stats(d)
        assert [d.external_tokens[f"d{i}"][0] for i in range(len(qs))] == want
        assert d.mismatches == [] and d.verified_bytes > 0
        assert sd["load_keys"] == sum(want) // 16 * 2 and sd["load_bytes"] == c["store_bytes"]
    finally:
        d.shutdown()
    print(f"FIGURE tp2->tp1 load bytes {sd['load_bytes']} / stored {c['store_bytes']} = "
          f"{sd['load_bytes'] / c['store_bytes']:.3f}")


def test_rank_layout_engines_of_other_tp_sizes_share_nothing(pool: kvpool_procs.Proc) -> None:
    """The contrast: without the TP-independent layout a TP 2 engine misses
    what a TP 1 engine stored (keys name the TP rank, values hold its heads)."""
    a = run(E.make_engine(kvt(pool.addr)), [("a0", PROMPT, 3)])
    a.shutdown()
    b = in_child(TP2, master=pool.addr, extra={}, reqs=[("b0", PROMPT + [7, 8], 3)])
    assert b["hit"] == [0]
