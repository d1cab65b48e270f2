"""bench/vllm_tier.py -- kvpool as a tier of vLLM's native offloading: store and
load GB/s through vLLM's own TieringOffloadingManager (vLLM 0.33 on CPU,
tests/vllm/tier_driver.py) against `kvpool bench store` of the same sizes on
the same pool, in one run.

One `kvpool serve` (segment 1 GiB) on this host. For each of bench store's
shapes (64 x 512 KiB and 16 x 2 MiB values; a chunk = a value):
  * store: one request of N new chunks, written into engine A's primary region,
    complete_store (vLLM cascades them to the tier: one job), until vLLM's
    manager has processed the finished job. Time from complete_store to then.
  * load: engine B (a fresh primary region) looks the chunks up; once the
    tier said HIT and vLLM queued the promotion, from the step that submits
    the load until every lookup answers HIT (bytes in B's host memory).
  * baseline: `kvpool bench store --master <that pool> --rounds R`, row
    kvpool_shm (the C client's batch put/get over the same shared memory), run
    once after the tier's rounds; and, because this host's load varies from
    one second to the next, the same batch calls made in this process
    (Client.put_from_batch / get_into_ptr_batch of a registered buffer, what
    bench store's kvpool_shm cell calls) in every round right after the
    tier's: "client" columns, ratio_interleaved.
Each cell: the median GB/s over R rounds after a warm-up round, new keys
every round; as bench store does, a round's keys are removed from the pool
after it (untimed), so rounds reuse warm segment pages, and each engine's
primary region holds exactly one round (its slots are reused, warm). The ratio
tier / bench store is the figure (goal >= 0.8). Also reported: the job's own
transfer seconds (JobResult.transfer_time) as GB/s, i.e. what the manager's
polling adds.

  python bench/vllm_tier.py --kvpool build/kvpool [--rounds 5] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [("64x512KiB", 64, 512 << 10), ("16x2MiB", 16, 2 << 20)]


def baseline(kvpool: str, master: str, rounds: int) -> dict[str, dict[str, float]]:
    """kvpool_shm's put/get GB/s per shape from `kvpool bench store`."""
    out = subprocess.run([kvpool, "bench", "store", "--json", "--master", master,
                          "--rounds", str(rounds)], check=True, capture_output=True, text=True)
    res = json.loads(out.stdout)["results"]
    return {r["shape"]: {"put_gbps": float(r["put_gbps"]), "get_gbps": float(r["get_gbps"])}
            for r in res if r["system"] == "kvpool_shm" and r["status"] == "ok"}


def spin(m: Any) -> None:
    """One scheduler step of m (what the engine does between forward passes),
    then a 0.2 ms pause: a busy poll would take a core from the transfer
    threads on a small host (an engine polls once per step)."""
    import tier_driver as T
    m.on_schedule_end(T.STEP)
    time.sleep(0.0002)


def store_round(T: Any, a: Any, keys: list, size: int) -> tuple[float, float]:
    """(wall seconds through the manager, the job's transfer seconds)."""
    from vllm.v1.kv_offload.base import ReqContext
    ctx = ReqContext(req_id=f"bench-store-{keys[0].hex()[:8]}")
    a.on_new_request(ctx)
    out = a.prepare_store(keys, ctx)
    view = T.primary(a)
    for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
        view[int(c)] = T.payload(k, size)
    del view
    tier = a.secondary_tiers[0]
    seen: list[float] = []
    orig = tier.get_finished_jobs

    def record() -> list:
        r = list(orig())
        seen.extend(j.transfer_time or 0.0 for j in r)
        return r

    tier.get_finished_jobs = record
    t0 = time.perf_counter()
    a.complete_store(out.keys_to_store, ctx)
    while a.has_pending_work():
        spin(a)
    wall = time.perf_counter() - t0
    tier.get_finished_jobs = orig
    a.on_request_finished(ctx)
    return wall, sum(seen)


def load_round(T: Any, b: Any, keys: list) -> tuple[float, float]:
    from vllm.v1.kv_offload.base import LookupResult, ReqContext
    ctx = ReqContext(req_id=f"bench-load-{keys[0].hex()[:8]}")
    b.on_new_request(ctx)
    deadline = time.monotonic() + T.BOUND_S
    while not b._pending_load_submissions:  # until the tier said HIT for every key
        [b.lookup(k, ctx) for k in keys]
        if b._pending_load_submissions:
            break
        assert time.monotonic() < deadline
        spin(b)
        time.sleep(0.001)
    tier = b.secondary_tiers[0]
    seen: list[float] = []
    orig = tier.get_finished_jobs

    def record() -> list:
        r = list(orig())
        seen.extend(j.transfer_time or 0.0 for j in r)
        return r

    tier.get_finished_jobs = record
    t0 = time.perf_counter()
    spin(b)  # submits the promotion: one load job
    while not all(b.lookup(k, ctx) is LookupResult.HIT for k in keys):
        assert time.monotonic() < deadline
        spin(b)
    wall = time.perf_counter() - t0
    tier.get_finished_jobs = orig
    spec = b.prepare_load(keys, ctx)
    b.complete_load(keys, ctx)
    view = T.primary(b)
    k0, c0 = keys[0], int(spec.chunk_ids[0])
    assert view[c0].tobytes() == T.payload(k0, view.shape[1]).tobytes(), "bytes differ"
    del view
    b.on_request_finished(ctx)
    return wall, sum(seen)


def client_round(c: Any, src: Any, dst: Any, keys: list[str], size: int) -> tuple[float, float]:
    """bench store's kvpool_shm batch, in this process: (put s, get s)."""
    n = len(keys)
    sa, da = int(src.ctypes.data), int(dst.ctypes.data)
    t0 = time.perf_counter()
    r = c.put_from_batch(keys, [sa + i * size for i in range(n)], [size] * n)
    t1 = time.perf_counter()
    g = c.get_into_ptr_batch(keys, [da + i * size for i in range(n)], [size] * n)
    t2 = time.perf_counter()
    assert all(x is None for x in r) and all(x == size for x in g), (r, g)
    c.remove_batch(keys, force=True)
    return t1 - t0, t2 - t1


def tier_cells(master: str, rounds: int) -> dict[str, dict[str, float]]:
    import kvpool
    import tier_driver as T
    from kvpool.vllm_tier import tier_key
    cells: dict[str, dict[str, float]] = {}
    for shape, n, size in SHAPES:
        a = T.make_manager(master, chunks=n, chunk_bytes=size)
        b = T.make_manager(master, chunks=n, chunk_bytes=size)
        cleaner = kvpool.Client({"master": master})
        import numpy as np
        src = np.full(n * size, 0x5A, dtype=np.uint8)  # written before timing, as bench store
        dst = np.zeros(n * size, dtype=np.uint8)
        cleaner.register_buffer(src)
        cleaner.register_buffer(dst)
        try:
            put, get, put_job, get_job, cput, cget = [], [], [], [], [], []
            for r in range(rounds + 1):  # round 0 warms up
                keys = T.keys_of(f"bench-{shape}-{r}-{os.getpid()}", n)
                w, j = store_round(T, a, keys, size)
                lw, lj = load_round(T, b, keys)
                prefix = a.secondary_tiers[0].key_prefix
                cleaner.remove_batch([tier_key(prefix, k) for k in keys], force=True)
                cp, cg = client_round(cleaner, src, dst, [f"bench-client-{shape}-{r}-{i}"
                                                          for i in range(n)], size)
                if r:
                    gb = n * size / 1e9
                    put.append(gb / w)
                    get.append(gb / lw)
                    put_job.append(gb / j if j else 0.0)
                    get_job.append(gb / lj if lj else 0.0)
                    cput.append(gb / cp)
                    cget.append(gb / cg)
            cells[shape] = {"put_gbps": statistics.median(put), "get_gbps": statistics.median(get),
                            "put_job_gbps": statistics.median(put_job),
                            "get_job_gbps": statistics.median(get_job),
                            "client_put_gbps": statistics.median(cput),
                            "client_get_gbps": statistics.median(cget)}
        finally:
            cleaner.unregister_buffer(src)
            cleaner.unregister_buffer(dst)
            cleaner.close()
            a.shutdown()
            b.shutdown()
    return cells


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpool", default=str(ROOT / "build" / "kvpool"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    os.environ["KVPOOL_BIN"] = os.path.abspath(args.kvpool)
    for p in (ROOT / "python", ROOT / "tests" / "python", ROOT / "tests" / "vllm"):
        sys.path.insert(0, str(p))
    import kvpool_procs
    pool = kvpool_procs.serve("1GiB")
    try:
        tier = tier_cells(pool.addr, args.rounds)
        base = baseline(args.kvpool, pool.addr, args.rounds)
    finally:
        pool.stop()
    rows = []
    for shape, n, size in SHAPES:
        t, b = tier[shape], base.get(shape, {})
        row = {"shape": shape, "values": n, "value_bytes": size, **{f"tier_{k}": round(v, 3)
                                                                    for k, v in t.items()}}
        for op in ("put", "get"):
            bv = b.get(f"{op}_gbps")
            row[f"bench_store_{op}_gbps"] = bv
            row[f"{op}_ratio"] = round(t[f"{op}_gbps"] / bv, 3) if bv else None
            row[f"{op}_ratio_interleaved"] = round(t[f"{op}_gbps"] / t[f"client_{op}_gbps"], 3)
        rows.append(row)
    doc = {"bench": "vllm_tier", "rounds": args.rounds, "goal_ratio": 0.8, "results": rows}
    print(f"{'shape':<11} {'op':<5} {'tier GB/s':>9} {'job GB/s':>9} {'store GB/s':>10} "
          f"{'ratio':>6}      {'client GB/s':>11} {'ratio':>6}", file=sys.stderr)
    for r in rows:
        for op, name in (("put", "store"), ("get", "load")):
            ratio = r[f"{op}_ratio"]
            print(f"{r['shape']:<11} {name:<5} {r[f'tier_{op}_gbps']:>9.2f} "
                  f"{r[f'tier_{op}_job_gbps']:>9.2f} {r[f'bench_store_{op}_gbps'] or 0:>10.2f} "
                  f"{ratio if ratio is not None else float('nan'):>6.2f}"
                  f"{'     ' if ratio is None else ('  met' if ratio >= 0.8 else ' MISS')}"
                  f" {r[f'tier_client_{op}_gbps']:>11.2f} {r[f'{op}_ratio_interleaved']:>6.2f}",
                  file=sys.stderr)
    text = json.dumps(doc, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
