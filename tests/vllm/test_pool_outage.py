"""The engine outlives the pool: kvpool.vllm.KVPoolConnector inside vLLM 0.33's real
Scheduler (tests/vllm/engine.py) with the pool down when the engine starts, killed
in the middle of a load, killed between steps, and restarted on the same address.

A KV cache is an accelerator: whatever the pool does, every request finishes with
the bytes the model computed (engine.mismatches == []), no step waits for the
pool, loads that were in flight are recomputed, and hits come back once the pool
is back and stores land again. Each outage is one warning in the log."""
from __future__ import annotations

import logging
import signal
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
import test_kvpool_connector as T  # noqa: E402  (kvt, run, agg_stats, PROMPT, HIT)
from kvpool import _log  # noqa: E402

PROMPT2 = list(range(300, 400))  # another 100-token prompt (6 full blocks)
STEP_S = 2.5                     # the most one engine step may take (lookup timeout 2 s)


@pytest.fixture
def addr() -> str:
    """A loopback address nothing listens on (yet)."""
    return f"127.0.0.1:{kvpool_procs.free_ports(1)[0]}"


def serve(addr: str) -> kvpool_procs.Proc:
    """`kvpool serve` (master + node in one process) on addr."""
    return kvpool_procs.serve("128MiB", "--listen", addr)


@pytest.fixture
def pools() -> Iterator[list[kvpool_procs.Proc]]:
    """The pools a test started: stopped at the end."""
    ps: list[kvpool_procs.Proc] = []
    yield ps
    for p in ps:
        p.stop(signal.SIGKILL)


def pool_status(e: E.Engine) -> dict[str, Any]:
    """Rank 0's ConnWorker.pool_status()."""
    return e.worker.connector._worker._w.pool_status()


def wait_available(e: E.Engine, want: bool = True, timeout: float = 20.0) -> dict[str, Any]:
    """Polls until the pool is (un)available to rank 0 (the link's back-off is at most 10 s)."""
    end = time.monotonic() + timeout
    while (st := pool_status(e))["available"] != want:
        assert time.monotonic() < end, st
        time.sleep(0.05)
    return st


def finish(e: E.Engine, reqs: list[tuple[str, list[int], int]]) -> E.Engine:
    """Runs the requests to completion: every output token and every KV byte right,
    and no step slow."""
    n0 = len(e.timings["schedule"])
    T.run(e, reqs)
    for what in ("schedule", "execute", "update_from_output"):
        slowest = max(e.timings[what][n0:], default=0.0)
        assert slowest < STEP_S, (what, slowest)
    assert e.output_mismatches == [], e.output_mismatches[:5]
    for rid, _, n in reqs:
        assert len(e.outputs[rid]) == n, (rid, e.outputs.get(rid))
    return e


def pool_stats(e: E.Engine, since: int = 0) -> dict[str, int | float]:
    s = T.kvv.KVPoolConnectorStats()
    for x in e.stats[since:]:
        s.aggregate(x)
    return s.reduce()


def prom(e: E.Engine, stats: list[Any]) -> Any:
    """Our Prometheus metrics (KVPoolPromMetrics) fed with stats, in a registry of
    their own (vLLM's global one takes each name once per process)."""
    import functools

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    reg = CollectorRegistry()
    types = {c: functools.partial(c, registry=reg) for c in (Counter, Gauge, Histogram)}
    m = T.kvv.KVPoolPromMetrics(e.vllm_config, types, ["engine"], {0: ["7"]})
    for st in stats:
        m.observe(st.data, 0)
    return reg


def worker_warnings(caplog: pytest.LogCaptureFixture, text: str) -> int:
    _log.flush()
    return sum(1 for r in caplog.records
               if r.name == "kvpool.worker" and r.levelno == logging.WARNING and text in r.getMessage())


def test_engine_starts_without_the_pool_and_attaches_when_it_comes(
        addr: str, pools: list[kvpool_procs.Proc], caplog: pytest.LogCaptureFixture) -> None:
    """Pool unreachable at start: vLLM starts anyway, serves every request (no hit,
    stores skipped), says so once; the pool starts: the worker attaches, stores land,
    a later request hits."""
    caplog.set_level(logging.INFO, logger="kvpool")
    e = E.make_engine(T.kvt(addr))
    try:
        assert pool_status(e)["available"] is False and pool_status(e)["attached"] is False
        finish(e, [("a0", T.PROMPT, 3), ("a1", PROMPT2, 3)])
        assert e.loaded_tokens == 0  # no hit: external_tokens records hits only
        st = pool_stats(e)
        assert st["pool_unavailable"] == 1 and st["pool_outages"] == 1, st
        assert st["pool_skipped_stores"] >= 2 and st["pool_skipped_lookups"] >= 2, st
        assert "store_count" not in st  # nothing went to the pool
        reg = prom(e, e.stats)
        assert reg.get_sample_value("vllm:kvpool_pool_unavailable", {"engine": "7"}) == 1
        assert reg.get_sample_value("vllm:kvpool_pool_outages_total", {"engine": "7"}) == 1
        assert reg.get_sample_value("vllm:kvpool_pool_skipped_stores_total", {"engine": "7"}) >= 2
        assert worker_warnings(caplog, "pool unreachable at start") == 1
        assert worker_warnings(caplog, addr) == 1  # the one warning names the master

        pools.append(serve(addr))
        st = wait_available(e)
        assert st["attached"] is True and st["outages"] == 1
        n = len(e.stats)
        finish(e, [("a2", T.PROMPT, 3)])   # stored now
        e.reset_local_cache()              # so that the next hit can only come from the pool
        finish(e, [("b0", T.PROMPT + [7, 8], 3)])
        assert e.external_tokens["b0"] == [T.HIT]
        st = pool_stats(e, n)
        assert st["pool_unavailable"] == 0 and st["store_keys"] >= 6 and st["load_keys"] >= 6, st
        assert st["load_failed_keys"] == 0
        reg = prom(e, e.stats)  # every report, in order: the gauge ends at 0
        assert reg.get_sample_value("vllm:kvpool_pool_unavailable", {"engine": "7"}) == 0
        assert reg.get_sample_value("vllm:kvpool_pool_outages_total", {"engine": "7"}) == 1
        assert worker_warnings(caplog, "") == 1  # nothing else was worth a warning
        _log.flush()
        assert any("pool reachable again" in r.getMessage() for r in caplog.records
                   if r.name == "kvpool.worker" and r.levelno == logging.INFO)
    finally:
        e.shutdown()


def test_pool_killed_with_a_load_in_flight_is_recomputed(
        addr: str, pools: list[kvpool_procs.Proc], caplog: pytest.LogCaptureFixture) -> None:
    """The pool dies after the scheduler granted a load and before the worker ran it:
    the load fails, its blocks are reported, vLLM recomputes them
    (kv_load_failure_policy="recompute"); later requests miss at once while the pool
    is down; the pool restarts empty on the same address and hits resume."""
    caplog.set_level(logging.INFO, logger="kvpool")
    pools.append(serve(addr))
    a = finish(E.make_engine(T.kvt(addr)), [("a0", T.PROMPT, 3)])
    a.shutdown()
    b = E.make_engine(T.kvt(addr))
    try:
        assert pool_status(b)["available"] is True
        conn = b.scheduler.connector
        build = conn.build_connector_meta
        killed: list[str] = []

        def build_then_kill(so: Any) -> Any:
            meta = build(so)
            r = b.request("b0")
            if not killed and r is not None and r.status == E.RequestStatus.WAITING_FOR_REMOTE_KVS:
                pools[-1].stop(signal.SIGKILL)  # between the scheduler's grant and the worker's load
                killed.append("b0")
            return meta

        conn.build_connector_meta = build_then_kill  # instance attribute: wraps, forwards
        finish(b, [("b0", T.PROMPT + [7, 8], 3)])
        assert killed == ["b0"]
        assert b.external_tokens["b0"] == [T.HIT]  # granted, then recomputed
        st = pool_stats(b)
        assert st["load_failed_keys"] >= 6, st
        wait_available(b, False, 5.0)

        # while the pool is down: misses at once, stores skipped, nothing slow
        n = len(b.stats)
        finish(b, [("c0", PROMPT2, 3), ("c1", PROMPT2 + [9], 2)])
        assert "c0" not in b.external_tokens and "c1" not in b.external_tokens
        st = pool_stats(b, n)
        assert st["pool_unavailable"] == 1 and st["pool_skipped_stores"] >= 1, st
        end = time.monotonic() + 5
        while pool_status(b)["outages"] < 1 and time.monotonic() < end:
            time.sleep(0.05)
        assert pool_status(b)["outages"] == 1
        assert worker_warnings(caplog, "pool unreachable (master") == 1

        # the pool comes back (empty, a new segment): stores land, hits resume
        pools.append(serve(addr))
        wait_available(b)
        n = len(b.stats)
        b.reset_local_cache()
        finish(b, [("d0", PROMPT2, 3)])
        assert "d0" not in b.external_tokens  # the new pool is empty
        b.reset_local_cache()
        finish(b, [("d1", PROMPT2 + [7, 8], 3)])
        assert b.external_tokens["d1"] == [T.HIT]
        assert pool_stats(b, n)["pool_unavailable"] == 0
        assert worker_warnings(caplog, "") == 1
    finally:
        b.shutdown()


def test_pool_killed_between_steps_default_fail_policy(
        addr: str, pools: list[kvpool_procs.Proc]) -> None:
    """kv_load_failure_policy "fail" (vLLM's default): once the pool is gone no hit is
    reported, so no load is ever started and no request fails: each one is computed."""
    pools.append(serve(addr))
    kvt = T.kvt(addr)
    del kvt["kv_load_failure_policy"]
    a = finish(E.make_engine(kvt), [("a0", T.PROMPT, 3)])
    a.shutdown()
    b = E.make_engine(kvt)
    try:
        assert pool_status(b)["available"] is True
        pools[-1].stop(signal.SIGKILL)
        finish(b, [("b0", T.PROMPT + [7, 8], 3), ("b1", T.PROMPT + [9], 2)])
        assert b.loaded_tokens == 0  # no hit, no load
        assert pool_stats(b).get("load_count", 0) == 0  # no load was tried
        st = wait_available(b, False, 5.0)
        assert st["attached"] is True
    finally:
        b.shutdown()
