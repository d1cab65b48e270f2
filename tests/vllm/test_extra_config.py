"""kv_connector_extra_config keys of vLLM's in-tree MooncakeStoreConnector that
kvpool.vllm.KVPoolConnector cannot honour: their defaults are accepted (a
mooncake.json-era configuration starts unchanged), anything else is refused at
start with the reason (README, "kv_connector_extra_config keys")."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parents[1] / "python", HERE.parents[1] / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import engine as E  # noqa: E402  (sets VLLM_TARGET_DEVICE=cpu before vLLM loads)
import kvpool_procs  # noqa: E402
from test_kvpool_connector import kvt  # noqa: E402

DEFAULTS: dict[str, Any] = {"enable_group_semantics": "false", "custom_mem_pool": "",
                            "store_tp_size": None, "enable_store_tp_lcm": False,
                            "prefill_tp_sizes": None}


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("64MiB")
    yield p
    p.stop()


def test_mooncake_only_keys_at_their_defaults_start(pool: kvpool_procs.Proc) -> None:
    e = E.make_engine(kvt(pool.addr, **dict(DEFAULTS, store_tp_size=1)))  # the engine's TP
    try:
        e.add_request("r0", list(range(5, 40)), 2)
        e.run_until_done()
        assert e.mismatches == []
    finally:
        e.shutdown()


@pytest.mark.parametrize("key,value,why", [
    ("enable_group_semantics", "true", "no object groups"),
    ("custom_mem_pool", "NVLINK", "vLLM's own allocator"),
    ("store_tp_size", 0, "must be a TP size"),
    ("prefill_tp_sizes", "2,4", "must be a list of TP sizes"),
])
def test_mooncake_only_keys_refused_when_set(pool: kvpool_procs.Proc, key: str, value: Any,
                                             why: str) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{why}"):
        E.make_engine(kvt(pool.addr, **{key: value}))


@pytest.mark.parametrize("extra,tpi", [
    ({}, False),
    ({"store_tp_size": 1}, False),            # the engine's own: the rank layout
    ({"store_tp_size": 2}, True),             # another TP size: the TP-independent layout
    ({"enable_store_tp_lcm": True, "prefill_tp_sizes": [1, 2, 4]}, True),
    ({"tp_independent": True}, True),
])
def test_in_tree_tp_keys_select_the_tp_independent_layout(extra: dict[str, Any], tpi: bool) -> None:
    """store_tp_size / enable_store_tp_lcm / prefill_tp_sizes ask for blocks
    that engines of other TP sizes can read: the TP-independent layout gives
    that for every size at once (tests/vllm/test_tp_independent.py)."""
    import kvpool.vllm as kvv
    assert kvv._check_mooncake_only_keys(dict(extra), 1) is tpi
