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
    ("enable_store_tp_lcm", True, "tensor-parallel layout"),
    ("store_tp_size", 2, "tensor-parallel layout, size 1"),
])
def test_mooncake_only_keys_refused_when_set(pool: kvpool_procs.Proc, key: str, value: Any,
                                             why: str) -> None:
    with pytest.raises(ValueError, match=f"{key}.*{why}"):
        E.make_engine(kvt(pool.addr, **{key: value}))
