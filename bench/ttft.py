"""Time to first token in vLLM's real engine (the CPU build, real forward
passes), with and without kvpool.

    $(scripts/vllm-cpu-env) bench/ttft.py [--kvpool build/kvpool] [--lengths 128,512,...]
                                          [--reps 3] [--json bench/results/ttft.json]

Model: tests/engine/tiny_weights.py BENCH (~107 M parameters: 8 layers, 16
heads, 4 KV heads of 64, hidden 1024; random seeded weights, bfloat16) --
the largest that runs a few-thousand-token prompt on this 2-core machine in
reasonable time. Block size 32 (the CPU backend's rule), eager mode.

Per prompt length, the median over --reps prompts (each new to the engine
that measures it; one request at a time; TTFT = the wall time of a
generate() of one token, which is prefill plus one decode step):
  none     no connector, vLLM's prefix cache on, the prompt's first run
  prefix   the same engine, the same prompt again: vLLM's own prefix cache
  miss     KVPoolConnector, a prompt the pool does not hold (it is stored)
  hit      KVPoolConnector in a fresh engine process: the prompts "miss" stored
Each condition is one engine process (driver.py); `kvpool serve` runs
beside them. Ratios: hit/none, hit/prefix, miss/none."""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tests" / "engine"
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ENGINE))  # first: its conftest, not tests/python's
import tiny_weights  # noqa: E402
from conftest import Engines, kv_config, prompt  # noqa: E402

import kvpool_procs  # noqa: E402


def run_condition(engines: Engines, model: str, prompts: list[list[int]], *, twice: bool,
                  **spec: Any) -> tuple[list[float], list[float], dict[str, Any]]:
    """One engine process: a warm-up prompt, then each prompt alone (twice in a
    row with twice=True). Returns the first and second TTFTs in seconds."""
    phases: list[dict[str, Any]] = [{"name": "warmup", "prompts": [prompt(999, 64, 8192)],
                                     "max_tokens": 1}]
    for i, p in enumerate(prompts):
        phases.append({"name": f"p{i}", "prompts": [p], "max_tokens": 1})
        if twice:
            phases.append({"name": f"p{i}b", "prompts": [p], "max_tokens": 1})
    r = engines.run(model, phases, max_model_len=8192, max_num_batched_tokens=8192,
                    kv_space_gib=2, **spec)
    first = [r.phase(f"p{i}")["elapsed_s"] for i in range(len(prompts))]
    second = [r.phase(f"p{i}b")["elapsed_s"] for i in range(len(prompts))] if twice else []
    cached = [r.cached(f"p{i}")[0] for i in range(len(prompts))]
    return first, second, {"startup_s": r.result.get("startup_s"), "cached": cached}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpool", default=str(ROOT / "build" / "kvpool"))
    ap.add_argument("--lengths", default="64,256,1024,2048,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ["KVPOOL_BIN"] = a.kvpool
    lengths = [int(x) for x in a.lengths.split(",")]
    shape = tiny_weights.BENCH
    vocab = shape.vocab
    out: dict[str, Any] = {"bench": "ttft", "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                           "model": {"params_m": round(shape.params() / 1e6, 1),
                                     "layers": shape.layers, "heads": shape.heads,
                                     "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
                                     "dtype": shape.dtype},
                           "reps": a.reps, "rows": []}
    with tempfile.TemporaryDirectory(prefix="kvpool-ttft-") as tmp:
        model = tiny_weights.cached(tmp, shape, seed=3, name="bench-llama")
        engines = Engines(Path(tmp))
        seeds = {L: [L * 100 + i for i in range(a.reps)] for L in lengths}
        none_p = [prompt(s, L, vocab) for L in lengths for s in seeds[L]]
        pool_p = [prompt(s + 50, L, vocab) for L in lengths for s in seeds[L]]
        pool = kvpool_procs.serve("4GiB")
        try:
            kv = kv_config(pool.addr)
            n1, n2, _ = run_condition(engines, model, none_p, twice=True, prefix_caching=True)
            miss, _, _ = run_condition(engines, model, pool_p, twice=False, kv=kv)
            hit, _, hinfo = run_condition(engines, model, pool_p, twice=False, kv=kv)
        finally:
            pool.stop()
    k = 0
    for L in lengths:
        sl = slice(k, k + a.reps)
        k += a.reps
        row = {"tokens": L,
               "none_ms": round(statistics.median(n1[sl]) * 1e3, 2),
               "prefix_ms": round(statistics.median(n2[sl]) * 1e3, 2),
               "miss_ms": round(statistics.median(miss[sl]) * 1e3, 2),
               "hit_ms": round(statistics.median(hit[sl]) * 1e3, 2),
               "hit_tokens": hinfo["cached"][sl.start]}
        row["hit_over_none"] = round(row["hit_ms"] / row["none_ms"], 3)
        row["hit_over_prefix"] = round(row["hit_ms"] / row["prefix_ms"], 3)
        row["miss_over_none"] = round(row["miss_ms"] / row["none_ms"], 3)
        out["rows"].append(row)
    print(f"{'tokens':>7} {'none ms':>9} {'prefix ms':>9} {'miss ms':>9} {'hit ms':>9} "
          f"{'hit/none':>8} {'hit/prefix':>10} {'miss/none':>9}")
    for r in out["rows"]:
        print(f"{r['tokens']:>7} {r['none_ms']:>9} {r['prefix_ms']:>9} {r['miss_ms']:>9} "
              f"{r['hit_ms']:>9} {r['hit_over_none']:>8} {r['hit_over_prefix']:>10} "
              f"{r['miss_over_none']:>9}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
