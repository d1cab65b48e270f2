"""kvpool.vllm.KVPoolConnector inside vLLM 0.33's real Scheduler (tests/vllm/engine.py).

vLLM's KVConnectorFactory creates the connector from the module path, the KV caches
are allocated as vLLM allocates them for the CPU, and the engine loop is the model
runner's. Blocks about to be loaded are poisoned first and every byte the attention
would read is compared with what the forward wrote (engine.mismatches). Every test
ends with the scheduler empty and every block free (Engine.assert_empty).

The pool is a real `kvpool serve` (or `kvpool master` + `kvpool store`) on
127.0.0.1; the workers are standalone clients, so what one engine stores outlives it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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
import kvpool_procs  # noqa: E402
import kvpool.vllm as kvv  # noqa: E402

PROMPT = list(range(5, 105))  # 100 tokens: 6 full blocks of 16
HIT = 96                      # a later request of PROMPT + more: 6 blocks from the pool


def kvt(master: str, **extra: Any) -> dict[str, Any]:
    store = json.dumps({"master": master, "mode": "standalone-store",
                        "global_segment_size": 0, "local_buffer_size": "16MiB"})
    return {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
            "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": dict({"store_config": store}, **extra)}


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("128MiB")
    yield p
    p.stop()


def run(e: E.Engine, reqs: list[tuple[str, list[int], int]]) -> E.Engine:
    for rid, prompt, n in reqs:
        e.add_request(rid, prompt, n)
    e.run_until_done()
    assert e.mismatches == [], e.mismatches[:5]
    e.assert_empty()
    return e


def store_then_load(master: str, mode: str = "full", **kw: Any) -> tuple[E.Engine, E.Engine]:
    extra = kw.pop("extra", {})
    a = run(E.make_engine(kvt(master, **extra), mode=mode, **kw), [("a0", PROMPT, 3)])
    b = run(E.make_engine(kvt(master, **extra), mode=mode, **kw), [("b0", PROMPT + [7, 8], 3)])
    return a, b


def agg_stats(e: E.Engine) -> dict[str, int | float]:
    s = kvv.KVPoolConnectorStats()
    for x in e.stats:
        s.aggregate(x)
    return s.reduce()


@pytest.mark.parametrize("mode", ["full", "swa", "mla"])
def test_prefix_stored_by_one_engine_is_loaded_by_another(pool: kvpool_procs.Proc, mode: str) -> None:
    a, b = store_then_load(pool.addr, mode)
    try:
        assert a.loaded_tokens == 0
        assert b.external_tokens["b0"] == [HIT]
        assert b.verified_bytes > 0
        sa, sb = agg_stats(a), agg_stats(b)
        assert sa["store_keys"] >= 6 and sa["store_bytes"] > 0
        assert sb["load_keys"] >= 6 and sb["load_bytes"] > 0 and sb.get("load_failed_keys") == 0
    finally:
        a.shutdown()
        b.shutdown()


def test_async_scheduling_and_async_lookups(pool: kvpool_procs.Proc) -> None:
    a, b = store_then_load(pool.addr, async_scheduling=True, extra={"lookup_async": True})
    try:
        assert b.external_tokens["b0"] == [HIT]
    finally:
        a.shutdown()
        b.shutdown()


def in_child(body: str, **kw: Any) -> dict[str, Any]:
    """Runs `body` (using E, T = this module, and kw as globals) in a fresh Python
    process -- another engine process, or another torch.distributed world (one
    process holds one) -- and returns the dict it prints as its last line."""
    paths = [str(HERE), str(ROOT / "python"), str(ROOT / "tests" / "python")]
    code = (f"import json, sys\nsys.path[:0] = {paths!r}\n"
            "import engine as E, test_kvpool_connector as T\n"
            + "".join(f"{k} = {v!r}\n" for k, v in kw.items()) + body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


TP2 = """
a = T.run(E.make_engine(T.kvt(master), tp_size=2), [("a0", T.PROMPT, 3)])
stored = T.agg_stats(a)["store_keys"]
a.shutdown()  # one TP world per process at a time (engine.py)
b = T.run(E.make_engine(T.kvt(master), tp_size=2), [("b0", T.PROMPT + [7, 8], 3)])
print(json.dumps({"hit": b.external_tokens["b0"], "loaded_keys": T.agg_stats(b)["load_keys"],
                  "stored_keys": stored}))
b.shutdown()
"""


def test_tensor_parallel_2(pool: kvpool_procs.Proc) -> None:
    """Two TP ranks (rank 1 in its own process): each stores and loads its half."""
    r = in_child(TP2, master=pool.addr)
    assert r["hit"] == [HIT]
    assert r["stored_keys"] >= 12 and r["loaded_keys"] >= 12  # 6 blocks x 2 ranks


ENGINE_A = """
e = T.run(E.make_engine(T.kvt(master)), [("p0", T.PROMPT, 3)])
print(json.dumps({"loaded": e.loaded_tokens, "stored": T.agg_stats(e).get("store_keys", 0)}))
e.shutdown()
"""


def test_two_engine_processes_share_one_pool(pool: kvpool_procs.Proc) -> None:
    first = in_child(ENGINE_A, master=pool.addr)
    assert first == {"loaded": 0, "stored": 6}
    b = run(E.make_engine(kvt(pool.addr)), [("q0", PROMPT + [9], 3)])
    try:
        assert b.external_tokens["q0"] == [HIT]
    finally:
        b.shutdown()


def _own_prefixes_only(master: str, a_kw: dict[str, Any], b_kw: dict[str, Any]) -> None:
    """Engines A and B (configurations a_kw, b_kw) on one pool: B finds none of
    A's blocks; each, run again, finds its own."""
    engines = []
    try:
        a = run(E.make_engine(kvt(master), **a_kw), [("a0", PROMPT, 3)])
        engines.append(a)
        b = run(E.make_engine(kvt(master), **b_kw), [("b0", PROMPT + [7, 8], 3)])
        engines.append(b)
        assert a.loaded_tokens == 0 and b.loaded_tokens == 0  # no cross load
        assert agg_stats(b)["store_keys"] >= 6  # B stored its own blocks beside A's
        a2 = run(E.make_engine(kvt(master), **a_kw), [("a1", PROMPT + [9], 3)])
        engines.append(a2)
        b2 = run(E.make_engine(kvt(master), **b_kw), [("b1", PROMPT + [9], 3)])
        engines.append(b2)
        assert a2.external_tokens["a1"] == [HIT] and b2.external_tokens["b1"] == [HIT]
        assert a2.verified_bytes > 0 and b2.verified_bytes > 0
    finally:
        for e in engines:
            e.shutdown()


@pytest.mark.parametrize("dtypes", [("bfloat16", "float16"), ("float32", "bfloat16")])
def test_engines_of_other_dtypes_never_load_each_others_blocks(pool: kvpool_procs.Proc,
                                                                 dtypes: tuple[str, str]) -> None:
    """The model (and KV) dtype is in the configuration fingerprint of every
    key: bfloat16 and float16 blocks have the same size, and would otherwise
    load into each other."""
    _own_prefixes_only(pool.addr, {"dtype": dtypes[0]}, {"dtype": dtypes[1]})


def test_two_weight_sets_under_one_directory_name(pool: kvpool_procs.Proc, tmp_path: Path) -> None:
    """Two models in directories named alike (keys name the basename) with
    other weight files: the weights' fingerprint keeps them apart."""
    dirs = []
    for name in ("a", "b"):
        d = tmp_path / name / "tiny-llama"
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps(E.tiny_models.TINY_LLAMA))
        (d / "model.safetensors").write_bytes(os.urandom(1 << 16))
        dirs.append(str(d))
    _own_prefixes_only(pool.addr, {"model_path": dirs[0]}, {"model_path": dirs[1]})


def test_preemption_and_resume(pool: kvpool_procs.Proc) -> None:
    """Few blocks: vLLM preempts under pressure, the preempted request resumes
    (re-prefilling from the pool or recomputing) and every byte stays right."""
    a = run(E.make_engine(kvt(pool.addr)), [("w0", PROMPT, 2)])
    e = E.make_engine(kvt(pool.addr), num_blocks=24, max_num_seqs=4)
    try:
        prompts = [(f"p{i}", PROMPT + list(range(200 + 40 * i, 240 + 40 * i)), 40) for i in range(3)]
        for rid, p, n in prompts:
            e.add_request(rid, p, n)
        preempted = 0
        while e.has_work():
            res = e.step()
            so = res.scheduler_output
            preempted += len(so.preempted_req_ids or ()) if so else 0
            if res.num_scheduled_tokens == 0:
                time.sleep(0.0005)
        assert preempted > 0
        assert e.mismatches == [], e.mismatches[:5]
        e.assert_empty()
        assert all(len(e.outputs[rid]) == n for rid, _, n in prompts)
        assert sum(sum(v) for v in e.external_tokens.values()) >= HIT  # loads from the pool
    finally:
        e.shutdown()
        a.shutdown()


def test_reset_cache_empties_the_pool(pool: kvpool_procs.Proc) -> None:
    a = run(E.make_engine(kvt(pool.addr)), [("a0", PROMPT, 3)])
    try:
        assert a.reset_cache() is True
        b = run(E.make_engine(kvt(pool.addr)), [("b0", PROMPT + [7], 3)])
        assert b.loaded_tokens == 0
        b.shutdown()
    finally:
        a.shutdown()


def _node(master: str, tmp: Path) -> subprocess.Popen[bytes]:
    log = open(tmp / "store.log", "wb")
    p = subprocess.Popen([kvpool_procs.kvpool_bin(), "store", "--master", master, "--listen",
                          "127.0.0.1:0", "--segment-size", "64MiB"], stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True,
                         env=kvpool_procs.server_env())
    deadline = time.monotonic() + 20
    while b"mounted" not in (tmp / "store.log").read_bytes():
        assert p.poll() is None and time.monotonic() < deadline, (tmp / "store.log").read_text()
        time.sleep(0.02)
    return p


@pytest.mark.parametrize("mode", ["full", "swa"])
def test_storage_node_killed_mid_run(tmp_path: Path, mode: str) -> None:
    """The node holding the prefix dies: the next load fails, vLLM recomputes
    (one group: the blocks reported invalid; several groups: the request, reported
    in failed_recving), nothing wrong is ever loaded."""
    m = kvpool_procs.master("--lease-ttl", "30s", "--client-ttl", "60s")
    node = _node(m.addr, tmp_path)
    try:
        a = run(E.make_engine(kvt(m.addr), mode=mode), [("a0", PROMPT, 3)])
        b = E.make_engine(kvt(m.addr), mode=mode)
        b.add_request("b0", PROMPT + [7, 8], 3)
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()
        b.run_until_done()
        assert b.mismatches == [], b.mismatches[:5]
        b.assert_empty()
        assert len(b.outputs["b0"]) == 3
        # the master still lists the prefix (the node's death is not known yet):
        # one load, which fails; vLLM recomputes and the next lookup misses
        assert b.external_tokens["b0"][0] == HIT
        s = agg_stats(b)
        assert s["load_failed_keys"] > 0 and s["load_count"] == 1
        a.shutdown()
        b.shutdown()
    finally:
        if node.poll() is None:
            os.killpg(node.pid, signal.SIGKILL)
        m.stop()


def test_bad_configuration_is_refused_at_start(pool: kvpool_procs.Proc) -> None:
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config"):
        E.make_engine(kvt(pool.addr, no_such_key=1))
    with pytest.raises(ValueError, match="load_async"):
        E.make_engine(kvt(pool.addr, load_async=False))
    kvv.check_vllm_api("0.32.1")          # the API is what counts, not the version string
    kvv.check_vllm_api("0.33.0+cpu")


def test_a_vllm_without_an_api_the_connector_calls_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvv, "REQUIRED_API", kvv.REQUIRED_API + (
        ("vllm.v1.core.sched.output", "SchedulerOutput.no_such_field"),))
    monkeypatch.delenv("KVPOOL_VLLM_UNTESTED", raising=False)
    with pytest.raises(RuntimeError, match="lacks vllm.v1.core.sched.output.SchedulerOutput"
                                           ".no_such_field"):
        kvv.check_vllm_api("0.99.0")
    monkeypatch.setenv("KVPOOL_VLLM_UNTESTED", "1")
    kvv.check_vllm_api("0.99.0")


def test_stats_reach_vllms_logger_and_prometheus(pool: kvpool_procs.Proc) -> None:
    """The workers' KVPoolConnectorStats go through vLLM's own KVConnectorLogging
    (the periodic log line) and KVConnectorProm (our Prometheus counters)."""
    from prometheus_client import REGISTRY
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
        KVConnectorLogging, KVConnectorProm)

    a, b = store_then_load(pool.addr)
    try:
        logging_ = KVConnectorLogging(b.vllm_config.kv_transfer_config)
        prom = KVConnectorProm(b.vllm_config, ["engine"], {0: ["7"]})
        for st in a.stats + b.stats:
            logging_.observe(st.data)
            prom.observe(st.data, 0)
        lines: list[str] = []
        logging_.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
        assert len(lines) == 1 and "store_keys=" in lines[0] and "load_bytes=" in lines[0], lines
        val = REGISTRY.get_sample_value
        assert val("vllm:kvpool_bytes_total", {"engine": "7", "operation": "load"}) > 0
        assert val("vllm:kvpool_keys_total", {"engine": "7", "operation": "store"}) >= 6
        assert val("vllm:kvpool_operations_total", {"engine": "7", "operation": "lookup"}) >= 2
    finally:
        a.shutdown()
        b.shutdown()


def test_kv_events_announce_the_stored_blocks(pool: kvpool_procs.Proc) -> None:
    """With KV cache events on, the blocks the connector stored are published
    by vLLM's scheduler as BlockStored (medium "kvpool"), chained by parent hash."""
    from vllm.distributed.kv_events import BlockStored

    a = run(E.make_engine(kvt(pool.addr), kv_events=True), [("a0", PROMPT, 3)])
    try:
        ours = [e for e in a.events if isinstance(e, BlockStored) and e.medium == "kvpool"]
        assert len(ours) == 6, a.events
        by_tokens = {tuple(e.token_ids): e for e in ours}
        chunks = [tuple(PROMPT[i * 16:(i + 1) * 16]) for i in range(6)]
        assert set(by_tokens) == set(chunks)
        for i, c in enumerate(chunks):
            e = by_tokens[c]
            assert e.block_size == 16 and len(e.block_hashes) == 1
            if i:
                assert e.parent_block_hash == by_tokens[chunks[i - 1]].block_hashes[0]
        # vLLM's own block pool announces the same hashes for its GPU blocks
        gpu = {h for e in a.events if isinstance(e, BlockStored) and e.medium != "kvpool"
               for h in e.block_hashes}
        assert {e.block_hashes[0] for e in ours} <= gpu
    finally:
        a.shutdown()
