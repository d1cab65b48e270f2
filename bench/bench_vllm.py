"""bench/bench_vllm.py -- kvpool's vLLM connector against vLLM's in-tree Mooncake connector,
through vLLM 0.33.0's real scheduler on the CPU.

    ~/.cache/kvpool/venv-vllm/bin/python bench/bench_vllm.py [--quick] [--passes N] [--out PATH]
                     [--configs none,kvpool,intree_mooncake,intree_kvpool] [--torch-threads N]

One seeded multi-turn chat workload under four configurations, each in a fresh process:
  none             no KV connector (vLLM's local prefix cache only);
  kvpool           kvpool.vllm.KVPoolConnector on a `build/kvpool serve` (127.0.0.1; the
                   worker is a standalone-store client, 64 MiB local buffer);
  intree_mooncake  vLLM's in-tree MooncakeStoreConnector on the real Mooncake wheel
                   (bench/vllm_mooncake_intree.py: mooncake_master + the worker's embedded
                   segment), inside `unshare -n -p -f --kill-child` (Mooncake's transfer
                   engine listens on every interface);
  intree_kvpool    the same in-tree connector with kvpool's drop-in as its `mooncake` module
                   (KVPOOL_AS_MOONCAKE=1) on a `build/kvpool serve`.
The four run PASSES times (default 3, --quick 1), every other pass in reverse order; the table
shows the median over the passes of each number, the ratios are computed inside each pass
and their median is reported (the JSON keeps every pass).

The engine is tests/vllm/engine.py: vLLM's own Scheduler, the worker half played by the
harness (vLLM's KV cache allocation, the connector's worker calls in the model runner's order,
a fake forward writing deterministic bytes). verify="loads": every range a connector loads is
poisoned first and compared byte for byte after the load (Engine.mismatches, and the harness's
output_mismatches where it has them); a configuration with a mismatch, or with fewer bytes
verified than it loaded, fails the run. The model is larger than the harness's tiny default:
8 layers x 8 KV heads x head_dim 128, fp16, block 16 tokens -> 64 KiB per layer-block,
512 KiB per block (tests/vllm/tiny_models.py is given this shape in the benchmark's own
process, see install_model()). The fake forward runs on torch's default number of threads
(one per core; --torch-threads N to change). On a 2-vCPU VM that matters for the scheduler-side
latencies: with one torch thread the second vCPU idles between steps and every thread
hand-off of a lookup (scheduler -> worker lookup thread -> master -> back) pays a wake-up; in
one measurement kvpool's lookup p50 went from 0.14 ms (2 threads) to 0.23 ms (1 thread) and
the in-tree connector's from 0.72 to 0.86 ms.

Workload (seeded, the same token ids in every configuration): C conversations x T turns.
Turn 0 of a conversation: a 96-160 token user message. Turn t: turn t-1's prompt + the 24-40
tokens turn t-1 generated + a 48-80 token new user message. The requests are queued in a fixed
order (turn 0 of every conversation, shuffled; then turn 1 of every conversation, shuffled;
...), and admitted at most ARRIVALS per engine step, in that order, while fewer than BACKLOG
are unfinished in the engine; a turn is admitted only once the previous turn of its
conversation has finished (its prompt needs those generated tokens). The local KV cache
(NUM_BLOCKS blocks) is smaller than one round of conversations, so by the time a conversation
comes back its earlier blocks have mostly been evicted locally and a connector must serve them
from the pool. Before the measured run each configuration runs a warm-up conversation of two
turns (the second loads from the pool), so first-put costs (Mooncake's first put, kvpool's
segment mapping) are outside the measurement; it also waits for the probe subprocesses vLLM
starts when a config is built (humming kernels), which otherwise hold a core for seconds.

Measured per configuration (measurement window = the step loop of the workload):
  * schedule() and update_from_output() wall time per engine step (Engine.timings), mean and
    p99 (nearest rank), and their per-step sum;
  * lookup latency: every call of the scheduler connector's get_num_new_matched_tokens
    (wrapped on the engine's scheduler.connector instance), p50 / p99 / mean; next to it the
    store's own existence check as the worker records it (kvpool: the "lookup" op of
    KVPoolConnectorStats; in-tree: "lookup_exists");
  * bytes stored and loaded, from the connector's own stats as the harness collects them
    (Engine.stats): kvpool KVPoolConnectorStats data[op]["bytes"] (ops store / load; a store
    counts only the bytes of keys not already in the pool), the in-tree
    MooncakeStoreConnectorStats records' num_bytes (save_put of the keys its exist-check found
    missing / load_get; records with status "error" left out); loads are cross-checked
    against loaded tokens / block size x block bytes (the num_external_tokens vLLM passed to
    update_state_after_alloc);
  * GB/s = (stored + loaded bytes) / wall time of the step loop (10^9 B/s). The harness's fake
    forward (computing and writing the deterministic bytes) and its byte checks take most of
    that wall time on this CPU, so the JSON also gives that harness time (the outermost calls
    of the harness's Worker._write / check_rows / poison / expected_rows / TokenBook.keys),
    GB/s over the wall time without it, and per-op GB/s: bytes / the connector's own op time
    (kvpool: store = one dedup-put, load = get; in-tree: save_exists + save_put, load_get);
  * tokens loaded from the pool / prompt tokens (vLLM's PrefillStats per request:
    num_external_cached_tokens, num_local_cached_tokens, num_prompt_tokens);
  * steps, idle steps (nothing scheduled), requests, mismatches, bytes the harness verified;
    the wall time of each connector method (scheduler side and worker side, wrapped on the
    instances), the CPU time of this process's threads and of the store server processes.
Output: a table on stdout, JSON in bench/results/vllm.json (raw numbers per configuration and
pass, and the ratios: kvpool's schedule() overhead over no connector vs the in-tree
connector's on Mooncake (target <= 1/3), kvpool's lookup p50 (target < 0.3 ms), kvpool's
stored+loaded GB/s vs the in-tree on Mooncake (target >= 3x)). Exit status 1 if a
configuration failed or had a mismatch (a ratio missing its target is reported, not failed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CONFIGS = ("none", "kvpool", "intree_mooncake", "intree_kvpool")
LABELS = {"none": "no connector", "kvpool": "kvpool connector",
          "intree_mooncake": "in-tree on Mooncake", "intree_kvpool": "in-tree on kvpool"}
MiB = 1 << 20

# The workload and engine shape: full run and --quick.
PARAMS = {
    "full": dict(conversations=16, turns=4, layers=8, kv_heads=8, head_dim=128, block_size=16,
                 num_blocks=160, max_num_seqs=4, max_num_batched_tokens=512, arrivals=2,
                 backlog=8, first_tokens=(96, 160), user_tokens=(48, 80), gen_tokens=(24, 40),
                 segment_mib=1024, seed=9),
    "quick": dict(conversations=8, turns=3, layers=4, kv_heads=8, head_dim=128, block_size=16,
                  num_blocks=40, max_num_seqs=2, max_num_batched_tokens=256, arrivals=2,
                  backlog=4, first_tokens=(64, 96), user_tokens=(32, 48), gen_tokens=(8, 16),
                  segment_mib=256, seed=9),
}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def summary_ms(xs: list[float]) -> dict[str, Any]:
    """mean / p50 / p99 / max in ms of a list of seconds."""
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean_ms": round(sum(xs) / len(xs) * 1e3, 4),
            "p50_ms": round(pct(xs, 50) * 1e3, 4), "p99_ms": round(pct(xs, 99) * 1e3, 4),
            "max_ms": round(max(xs) * 1e3, 4), "total_s": round(sum(xs), 4)}


# ---------------------------------------------------------------------------------------
# The workload (pure: the same in every process)
# ---------------------------------------------------------------------------------------

class Workload:
    """Conversations, their turns' new user tokens and generation lengths, and the order in
    which turns are queued. Prompts of turns > 0 are built from the previous turn's output."""

    def __init__(self, p: dict[str, Any]):
        rng = random.Random(p["seed"])
        self.p = p
        self.convs = p["conversations"]
        self.turns = p["turns"]
        tok = lambda n: [rng.randrange(3, 1024) for _ in range(n)]  # noqa: E731
        self.user: dict[tuple[int, int], list[int]] = {}
        self.gen: dict[tuple[int, int], int] = {}
        for c in range(self.convs):
            for t in range(self.turns):
                lo, hi = p["first_tokens"] if t == 0 else p["user_tokens"]
                self.user[c, t] = tok(rng.randint(lo, hi))
                self.gen[c, t] = rng.randint(*p["gen_tokens"])
        self.order: list[tuple[int, int]] = []
        for t in range(self.turns):
            cs = list(range(self.convs))
            rng.shuffle(cs)
            self.order += [(c, t) for c in cs]

    @staticmethod
    def req_id(c: int, t: int) -> str:
        return f"c{c}t{t}"

    def digest(self) -> str:
        h = hashlib.sha256(json.dumps([sorted((f"{c},{t}", v) for (c, t), v in self.user.items()),
                                       sorted((f"{c},{t}", v) for (c, t), v in self.gen.items()),
                                       self.order]).encode())
        return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------
# Inside one configuration's process
# ---------------------------------------------------------------------------------------

def install_model(p: dict[str, Any]) -> dict[str, Any]:
    """Gives tests/vllm/tiny_models.py (in this process) a model of p's shape: `layers` full
    attention layers of `kv_heads` KV heads x `head_dim`, fp16. engine.py reads the module's
    TINY_LLAMA (-> the config.json vLLM's ModelConfig loads), model_shape() and
    kv_cache_specs() at call time, so replacing them before the first make_engine is enough
    (TP 1, the worker in this process)."""
    import tiny_models as tm
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    L, H, D = p["layers"], p["kv_heads"], p["head_dim"]
    tm.TINY_LLAMA.update(num_hidden_layers=L, num_key_value_heads=H, num_attention_heads=H,
                         head_dim=D, hidden_size=H * D, intermediate_size=2 * H * D)
    names = tuple(tm.LAYER_FMT.format(i) for i in range(L))
    base = tm.model_shape("full")

    def model_shape(mode: str) -> Any:
        if mode != "full":
            raise ValueError("bench_vllm: only mode 'full' is installed")
        return tm.ModelShape(vocab_size=base.vocab_size, eos_token_id=base.eos_token_id,
                             num_kv_heads_total=H, layer_names=names)

    def kv_cache_specs(mode: str, block_size: int, tp_size: int) -> dict[str, Any]:
        model_shape(mode)
        return {n: FullAttentionSpec(block_size=block_size, num_kv_heads=H // tp_size,
                                     head_size=D, dtype=torch.float16) for n in names}

    tm.model_shape = model_shape
    tm.kv_cache_specs = kv_cache_specs
    if getattr(tm, "_model_dir", None):  # a config.json written before: write it again
        tm._model_dir = None
    block_bytes = L * 2 * H * D * 2 * p["block_size"]
    return {"layers": L, "kv_heads": H, "head_dim": D, "dtype": "float16",
            "block_size": p["block_size"], "bytes_per_layer_block": block_bytes // L,
            "bytes_per_block": block_bytes}


def wait_for_probe_children(limit_s: float = 90.0) -> float:
    """vLLM (humming kernels) starts probe subprocesses (`python -c 'import humming...'`) when
    a config is built; they use a core each for seconds. Wait until this process has no such
    child left so they do not run inside the measurement. Returns the seconds waited."""
    t0 = time.perf_counter()
    try:
        me = os.readlink("/proc/self")  # this process's pid in the namespace /proc belongs to
    except OSError:
        return 0.0
    while time.perf_counter() - t0 < limit_s:
        busy = False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    ppid = f.read().rsplit(")", 1)[1].split()[1]
                if ppid != me:
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except (OSError, IndexError):
                continue
            if b"humming" in cmd:
                busy = True
                break
        if not busy:
            break
        time.sleep(0.1)
    return round(time.perf_counter() - t0, 3)


def thread_cpu() -> dict[str, tuple[str, float]]:
    """CPU seconds (user + system) of every thread of this process: tid -> (name, s)."""
    out: dict[str, tuple[str, float]] = {}
    hz = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        fields = st[st.rindex(")") + 2:].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / hz)
    return out


def thread_cpu_delta(a: dict[str, tuple[str, float]], b: dict[str, tuple[str, float]],
                     main_tid: str) -> list[dict[str, Any]]:
    rows = []
    for tid, (name, s) in b.items():
        d = s - a.get(tid, (name, 0.0))[1]
        if d > 0:
            rows.append({"thread": ("main " if tid == main_tid else "") + name, "tid": int(tid),
                         "cpu_s": round(d, 2)})
    rows.sort(key=lambda r: -r["cpu_s"])
    return rows[:12]


def children_cpu() -> dict[str, float]:
    """CPU seconds of this process's child processes (the store servers), by command name."""
    out: dict[str, float] = {}
    try:
        me = os.readlink("/proc/self")
    except OSError:
        return out
    hz = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        if fields[1] != me:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / hz
    return out


class Timed:
    """Wraps methods of an instance (instance attributes) and records each call's wall time.
    ``outer`` sums only the outermost wrapped calls (a connector's get_transfer_results may
    call its own get_finished: both are listed, the time is counted once)."""

    def __init__(self) -> None:
        self.t: dict[str, list[float]] = {}
        self.outer = 0.0
        self._depth = 0

    def wrap(self, obj: Any, names: list[str], prefix: str) -> None:
        for name in names:
            orig = getattr(obj, name, None)
            if orig is None:
                continue
            lst = self.t.setdefault(prefix + name, [])

            def w(*a: Any, __o: Callable = orig, __l: list = lst, **k: Any) -> Any:
                self._depth += 1
                t0 = time.perf_counter()
                try:
                    return __o(*a, **k)
                finally:
                    dt = time.perf_counter() - t0
                    __l.append(dt)
                    self._depth -= 1
                    if self._depth == 0:
                        self.outer += dt
            setattr(obj, name, w)

    def reset(self) -> None:
        for v in self.t.values():
            v.clear()
        self.outer = 0.0

    def report(self) -> dict[str, Any]:
        return {k: {"calls": len(v), "total_ms": round(sum(v) * 1e3, 2),
                    "mean_ms": round(sum(v) / len(v) * 1e3, 4) if v else 0.0}
                for k, v in sorted(self.t.items()) if v}


class HarnessClock:
    """Time spent in the harness's own model/verification work (not vLLM, not a connector):
    the outermost call of Worker._write / check_rows / poison / expected_rows / TokenBook.keys."""

    def __init__(self, worker: Any) -> None:
        self.total = 0.0
        self._depth = 0
        for obj, names in ((worker, ["_write", "check_rows", "poison", "expected_rows"]),
                           (worker.book, ["keys"])):
            for name in names:
                orig = getattr(obj, name)

                def w(*a: Any, __o: Callable = orig, **k: Any) -> Any:
                    self._depth += 1
                    t0 = time.perf_counter()
                    try:
                        return __o(*a, **k)
                    finally:
                        self._depth -= 1
                        if self._depth == 0:
                            self.total += time.perf_counter() - t0
                setattr(obj, name, w)


SCHED_METHODS = ["update_state_after_alloc", "build_connector_meta",
                 "update_connector_output", "request_finished", "request_finished_all_groups",
                 "build_connector_worker_meta", "take_events"]
WORKER_METHODS = ["handle_preemptions", "bind_connector_metadata", "start_load_kv",
                  "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_transfer_results",
                  "get_finished", "get_block_ids_with_load_errors", "get_kv_connector_stats",
                  "build_connector_worker_meta", "clear_connector_metadata"]


def connector_bytes(config: str, stats: list[Any]) -> dict[str, Any]:
    """Stored / loaded bytes and op times from the per-step connector stats."""
    out: dict[str, Any] = {"source": "connector stats (Engine.stats)"}
    if config == "kvpool":
        agg: dict[str, dict[str, int]] = {}
        for s in stats:
            for op, rec in (getattr(s, "data", None) or {}).items():
                a = agg.setdefault(op, {})
                for f, v in rec.items():
                    a[f] = max(a.get(f, 0), int(v)) if f == "max_ns" else a.get(f, 0) + int(v)
        out["ops"] = agg
        st, ld = agg.get("store", {}), agg.get("load", {})
        out["stored_bytes"] = int(st.get("bytes", 0))
        out["loaded_bytes"] = int(ld.get("bytes", 0))
        out["stored_keys"] = int(st.get("keys", 0))
        out["store_existing_keys"] = int(st.get("existing_keys", 0))
        out["loaded_keys"] = int(ld.get("keys", 0))
        out["failed_keys"] = int(st.get("failed_keys", 0)) + int(ld.get("failed_keys", 0))
        out["store_op_s"] = st.get("total_ns", 0) / 1e9
        out["load_op_s"] = ld.get("total_ns", 0) / 1e9
        lk = agg.get("lookup", {})
        out["lookup_op_mean_ms"] = round(lk["total_ns"] / lk["count"] / 1e6, 4) if lk.get("count") else None
    else:
        recs: dict[str, list[dict[str, Any]]] = {}
        for s in stats:
            for op, rs in (getattr(s, "data", None) or {}).items():
                recs.setdefault(op, []).extend(rs)
        ops = {}
        for op, rs in recs.items():
            ok = [r for r in rs if r.get("status") != "error"]
            ops[op] = {"count": len(rs), "errors": len(rs) - len(ok),
                       "keys": sum(int(r["num_keys"]) for r in ok),
                       "bytes": sum(int(r["num_bytes"]) for r in ok),
                       "failed_keys": sum(int(r["num_failed_keys"]) for r in rs),
                       "total_s": round(sum(float(r["duration_seconds"]) for r in rs), 6)}
        out["ops"] = ops
        put, get = ops.get("save_put", {}), ops.get("load_get", {})
        out["stored_bytes"] = int(put.get("bytes", 0))
        out["loaded_bytes"] = int(get.get("bytes", 0))
        out["stored_keys"] = int(put.get("keys", 0))
        out["loaded_keys"] = int(get.get("keys", 0))
        out["failed_keys"] = int(put.get("failed_keys", 0)) + int(get.get("failed_keys", 0))
        # kvpool's store op is one dedup-put (existing keys answered by the put); the in-tree
        # connector checks first (save_exists) and puts the missing keys (save_put): both count.
        out["store_op_s"] = put.get("total_s", 0.0) + ops.get("save_exists", {}).get("total_s", 0.0)
        out["load_op_s"] = get.get("total_s", 0.0)
        lk = ops.get("lookup_exists", {})
        out["lookup_op_mean_ms"] = round(lk["total_s"] / lk["count"] * 1e3, 4) if lk.get("count") else None
    return out


def run_engine(e: Any, wl: Workload, prefix: str, order: list[tuple[int, int]],
               arrivals: int, backlog: int, max_s: float,
               state: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Drive the engine through `order`; returns prompts, step counts and the loop's wall.
    ``state`` (prompts, finished turns) carries over between calls on one workload."""
    state = {"prompts": {}, "done": set()} if state is None else state
    prompts: dict[str, list[int]] = state["prompts"]
    done: set[tuple[int, int]] = state["done"]
    queue = list(order)
    mine: set[str] = set()
    admitted = finished = steps = idle = 0
    t0 = time.perf_counter()
    while queue or e.has_work():
        if time.perf_counter() - t0 > max_s:
            raise RuntimeError(f"{prefix}: not done after {max_s}s: {e.describe()}")
        n = 0
        while queue and n < arrivals and admitted - finished < backlog:
            c, t = queue[0]
            if t > 0 and (c, t - 1) not in done:
                break  # the conversation's previous turn is still running: keep the order
            queue.pop(0)
            if t == 0:
                prompt = list(wl.user[c, 0])
            else:
                prev = prefix + wl.req_id(c, t - 1)
                prompt = prompts[prev] + list(e.outputs[prev]) + list(wl.user[c, t])
            rid = prefix + wl.req_id(c, t)
            prompts[rid] = prompt
            mine.add(rid)
            e.add_request(rid, prompt, wl.gen[c, t])
            admitted += 1
            n += 1
        if not e.has_work():
            if queue:
                raise RuntimeError(f"{prefix}: {queue[0]} waits for a turn that never ran")
            break
        res = e.step()
        steps += 1
        for rid in res.finished_requests:
            if rid in mine:
                mine.discard(rid)
                c, t = (int(x) for x in rid[len(prefix) + 1:].split("t"))
                done.add((c, t))
                finished += 1
        if res.num_scheduled_tokens == 0:
            idle += 1
            time.sleep(0.0005)  # nothing to compute (transfers running): back off
    wall = time.perf_counter() - t0
    return {"prompts": {r: prompts[r] for r in prompts if r.startswith(prefix)}, "steps": steps,
            "idle_steps": idle, "wall_s": wall, "requests": admitted}


def inner(config: str, p: dict[str, Any], kvpool_bin: str) -> dict[str, Any]:
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    for d in (ROOT / "tests" / "vllm", ROOT / "python", ROOT / "tests" / "python", HERE):
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    import contextlib
    import engine as E  # sets VLLM_TARGET_DEVICE=cpu before vLLM loads
    model = install_model(p)
    res: dict[str, Any] = {"config": config, "label": LABELS[config], "model": model}
    wl = Workload(p)
    res["workload_digest"] = wl.digest()
    with contextlib.ExitStack() as st:
        if config == "none":
            kvt = None
        elif config == "kvpool":
            os.environ["KVPOOL_BIN"] = kvpool_bin
            import kvpool_procs
            srv = kvpool_procs.serve(f"{p['segment_mib']}MiB")
            st.callback(srv.stop)
            store = json.dumps({"master": srv.addr, "mode": "standalone-store",
                                "global_segment_size": 0, "local_buffer_size": "64MiB"})
            kvt = {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
                   "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                   "kv_connector_extra_config": {"store_config": store}}
            res["server"] = f"{kvpool_bin} serve --segment-size {p['segment_mib']}MiB at {srv.addr}"
        else:
            os.environ["KVPOOL_BIN"] = kvpool_bin
            import vllm_mooncake_intree as vmi
            info: dict[str, Any] = {}
            store = "mooncake" if config == "intree_mooncake" else "kvpool"
            kvt = st.enter_context(vmi.intree_mooncake(store, p["segment_mib"], info=info))
            res["setup"] = info
        res["kv_transfer_config"] = kvt
        t0 = time.perf_counter()
        e = E.make_engine(kvt, num_blocks=p["num_blocks"], block_size=p["block_size"],
                          max_num_seqs=p["max_num_seqs"],
                          max_num_batched_tokens=p["max_num_batched_tokens"], verify="loads")
        st.callback(e.shutdown)
        res["engine_init_s"] = round(time.perf_counter() - t0, 3)
        res["waited_for_vllm_probe_children_s"] = wait_for_probe_children()
        import torch
        nthreads = int(os.environ.get("BENCH_VLLM_TORCH_THREADS", "0"))
        if nthreads > 0:
            torch.set_num_threads(nthreads)
        res["torch_threads"] = torch.get_num_threads()
        res["cpu_affinity"] = sorted(os.sched_getaffinity(0))
        res["num_blocks"] = e.kv_cache_config.num_blocks
        page = sum(g.kv_cache_spec.page_size_bytes * len(g.layer_names)
                   for g in e.kv_cache_config.kv_cache_groups)
        assert page == model["bytes_per_block"], (page, model)
        sched_conn = e.scheduler.connector
        wconn = e.worker.connector
        timed = Timed()
        lookups: list[tuple[float, str, int, Optional[int]]] = []
        if sched_conn is not None:
            timed.wrap(sched_conn, SCHED_METHODS, "scheduler.")
            orig = sched_conn.get_num_new_matched_tokens

            def gnnmt(request: Any, num_computed_tokens: int) -> Any:
                t = time.perf_counter()
                r = orig(request, num_computed_tokens)
                lookups.append((time.perf_counter() - t, request.request_id,
                                num_computed_tokens, r[0]))
                return r
            sched_conn.get_num_new_matched_tokens = gnnmt
        if wconn is not None:
            timed.wrap(wconn, WORKER_METHODS, "worker.")
        harness = HarnessClock(e.worker)

        # Warm-up: one two-turn conversation of its own tokens; the second turn's prefix is
        # dropped from the local cache first, so it loads from the pool (when there is one).
        wp = dict(p, conversations=1, turns=2, seed=p["seed"] + 1000)
        wwl = Workload(wp)
        t0 = time.perf_counter()
        wstate: dict[str, Any] = {"prompts": {}, "done": set()}
        w0 = run_engine(e, wwl, "warm-", [(0, 0)], 1, 1, 120, wstate)
        e.scheduler.reset_prefix_cache(reset_running_requests=False, reset_connector=False)
        w1 = run_engine(e, wwl, "warm-", [(0, 1)], 1, 1, 120, wstate)
        ext_w = e.external_tokens.get("warm-c0t1", [0])
        res["warmup"] = {"s": round(time.perf_counter() - t0, 3),
                         "steps": w0["steps"] + w1["steps"],
                         "turn1_external_tokens": ext_w}
        if e.mismatches:
            res["mismatches"] = e.mismatches[:10]
            res["ok"] = False
            res["error"] = "mismatches in the warm-up"
            print("RESULT " + json.dumps(res, default=str), flush=True)
            return res

        # The measurement window starts here.
        marks = {k: len(v) for k, v in e.timings.items()}
        n_stats = len(e.stats)
        loaded0 = e.loaded_tokens
        verified0 = e.verified_bytes
        lookups.clear()
        timed.reset()
        h0 = harness.total
        try:  # the main thread's id as /proc names it (host ids inside a pid namespace)
            main_tid = os.readlink("/proc/self")
        except OSError:
            main_tid = str(__import__("threading").get_native_id())
        cpu0, pcpu0, ccpu0 = thread_cpu(), os.times(), children_cpu()
        run = run_engine(e, wl, "", wl.order, p["arrivals"], p["backlog"], 900)
        harness_s = harness.total - h0
        cpu1, pcpu1, ccpu1 = thread_cpu(), os.times(), children_cpu()
        res["server_cpu_s"] = {k: round(v - ccpu0.get(k, 0.0), 2) for k, v in ccpu1.items()
                               if k not in ("python", "python3")}
        res["process_cpu_s"] = round(pcpu1.user + pcpu1.system - pcpu0.user - pcpu0.system, 2)
        res["thread_cpu_s"] = thread_cpu_delta(cpu0, cpu1, main_tid)
        main_cpu = cpu1.get(main_tid, ("", 0.0))[1] - cpu0.get(main_tid, ("", 0.0))[1]
        res["background_threads_cpu_s"] = round(res["process_cpu_s"] - main_cpu, 2)
        tim = {k: v[marks[k]:] for k, v in e.timings.items()}
        stats = e.stats[n_stats:]
        res["mismatches"] = list(e.mismatches[:10])
        res["mismatch_count"] = len(e.mismatches)
        out_mm = list(getattr(e, "output_mismatches", []))  # newer harness: outputs checked too
        res["output_mismatches"] = out_mm[:10]
        e.assert_empty()

        prompts = run["prompts"]
        # The model's outputs are fixed by the harness: the same in every configuration.
        for rid, pr in prompts.items():
            c, t = (int(x) for x in rid[1:].split("t"))
            if len(e.outputs[rid]) != wl.gen[c, t]:
                raise AssertionError(f"{rid}: {len(e.outputs[rid])} tokens, wanted {wl.gen[c, t]}")
        res["prompts_digest"] = hashlib.sha256(json.dumps(sorted(prompts.items())).encode()
                                               ).hexdigest()[:16]
        ps = {rid: e.prefill_stats.get(rid) for rid in prompts}
        prompt_tokens = sum(len(v) for v in prompts.values())
        ext = sum(s.num_external_cached_tokens for s in ps.values() if s is not None)
        loc = sum(s.num_local_cached_tokens for s in ps.values() if s is not None)
        comp = sum(s.num_computed_tokens for s in ps.values() if s is not None)
        sched_t, upd_t = tim["schedule"], tim["update_from_output"]
        both = [a + b for a, b in zip(sched_t, upd_t)] if len(sched_t) == len(upd_t) else []
        wall = run["wall_s"]
        by = connector_bytes(config, stats) if kvt is not None else {
            "source": "-", "stored_bytes": 0, "loaded_bytes": 0}
        moved = by["stored_bytes"] + by["loaded_bytes"]
        loaded_tokens = e.loaded_tokens - loaded0
        by["loaded_bytes_from_tokens"] = loaded_tokens // p["block_size"] * model["bytes_per_block"]
        lk = [x[0] for x in lookups]
        res.update({
            "ok": not e.mismatches and not out_mm
                  and e.verified_bytes - verified0 >= by["loaded_bytes_from_tokens"],
            "all_loaded_bytes_verified": e.verified_bytes - verified0 >= by["loaded_bytes_from_tokens"],
            "requests": run["requests"], "steps": run["steps"], "idle_steps": run["idle_steps"],
            "wall_s": round(wall, 4), "harness_model_s": round(harness_s, 4),
            "schedule": summary_ms(sched_t), "update_from_output": summary_ms(upd_t),
            "schedule_plus_update": summary_ms(both), "execute": summary_ms(tim["execute"]),
            "lookup": summary_ms(lk),
            "lookup_calls_per_request": round(len(lk) / max(1, run["requests"]), 3),
            # every lookup: [ms, request, local tokens, external tokens answered]
            "lookups": [[round(a * 1e3, 4), b, c, d] for a, b, c, d in lookups],
            "prompt_tokens": prompt_tokens, "external_cached_tokens": ext,
            "local_cached_tokens": loc, "computed_prefill_tokens": comp,
            "loaded_tokens": loaded_tokens,
            "verified_bytes": e.verified_bytes - verified0,
            "pool_hit_rate": round(ext / prompt_tokens, 4) if prompt_tokens else 0.0,
            "local_hit_rate": round(loc / prompt_tokens, 4) if prompt_tokens else 0.0,
            "bytes": by, "moved_bytes": moved,
            "gbps": round(moved / wall / 1e9, 4) if wall else 0.0,
            "gbps_without_harness": round(moved / max(1e-9, wall - harness_s) / 1e9, 4),
            "connector_calls": timed.report(),
            # wall time inside connector methods called by the scheduler / the harness's
            # worker (outermost calls, lookups included): the connector's share of the loop
            "connector_critical_path_s": round(timed.outer + sum(lk), 4),
        })
        if kvt is not None:
            so = by.get("store_op_s", 0) or 0
            lo = by.get("load_op_s", 0) or 0
            res["op_gbps"] = {"store": round(by["stored_bytes"] / so / 1e9, 3) if so else None,
                              "load": round(by["loaded_bytes"] / lo / 1e9, 3) if lo else None}
        # Print before the shutdown (the stores' threads may take a while to stop).
        res["run_s"] = round(time.perf_counter() - t_start, 2)
        print("RESULT " + json.dumps(res, default=str), flush=True)
        t0 = time.perf_counter()
    print(f"SHUTDOWN {time.perf_counter() - t0:.3f}s", flush=True)
    return res


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------

def run_config(config: str, mode: str, kvpool_bin: str, timeout_s: float,
               verbose: bool) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", config, "--params", mode,
           "--kvpool", kvpool_bin]
    if config == "intree_mooncake":
        sys.path.insert(0, str(HERE))
        import vllm_mooncake_intree as vmi
        try:
            cmd = vmi.netns_command(cmd)
        except RuntimeError as e:
            return {"config": config, "label": LABELS[config], "ok": False, "error": str(e)}
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        out, err, rc = r.stdout, r.stderr, r.returncode
    except subprocess.TimeoutExpired as e:
        def s(x: Any) -> str:
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
        out, err, rc = s(e.stdout), s(e.stderr), -1
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if lines:
        res = json.loads(lines[-1][7:])
    else:
        res = {"config": config, "label": LABELS[config], "ok": False,
               "error": f"rc {rc}, no RESULT line", "log_tail": (out + err)[-4000:]}
    if verbose or not res.get("ok"):
        res["log_tail"] = err[-4000:]
    res["process_wall_s"] = round(time.perf_counter() - t0, 2)
    res["loadavg_1min_before_after"] = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
    return res


def fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and (x == 0 or abs(x) >= 10) else f"{x:.{nd}f}"
    return str(x)


# (row label, getter) of the table; numeric rows are the median over the passes.
ROWS: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
    ("schedule() mean ms", lambda r: r["schedule"]["mean_ms"]),
    ("schedule() p99 ms", lambda r: r["schedule"]["p99_ms"]),
    ("update_from_output() mean ms", lambda r: r["update_from_output"]["mean_ms"]),
    ("update_from_output() p99 ms", lambda r: r["update_from_output"]["p99_ms"]),
    ("sched+update per step mean ms", lambda r: r["schedule_plus_update"].get("mean_ms")),
    ("sched+update per step p99 ms", lambda r: r["schedule_plus_update"].get("p99_ms")),
    ("lookup p50 ms", lambda r: r["lookup"].get("p50_ms")),
    ("lookup p99 ms", lambda r: r["lookup"].get("p99_ms")),
    ("lookup mean ms", lambda r: r["lookup"].get("mean_ms")),
    ("lookup calls", lambda r: r["lookup"].get("n")),
    ("  store exist-check op mean ms", lambda r: r["bytes"].get("lookup_op_mean_ms")),
    ("stored MB", lambda r: r["bytes"]["stored_bytes"] / 1e6),
    ("loaded MB", lambda r: r["bytes"]["loaded_bytes"] / 1e6),
    ("step-loop wall s", lambda r: r["wall_s"]),
    ("  of it harness fwd+verify s", lambda r: r["harness_model_s"]),
    ("  of it connector calls s", lambda r: r["connector_critical_path_s"]),
    ("GB/s (stored+loaded)/wall", lambda r: r["gbps"]),
    ("GB/s over wall - harness", lambda r: r["gbps_without_harness"]),
    ("store op GB/s (bytes/op time)", lambda r: r["op_gbps"]["store"]),
    ("load op GB/s (bytes/op time)", lambda r: r["op_gbps"]["load"]),
    ("pool hit (ext / prompt tok)", lambda r: r["pool_hit_rate"]),
    ("local hit (local / prompt tok)", lambda r: r["local_hit_rate"]),
    ("steps", lambda r: r["steps"]),
    ("idle steps", lambda r: r["idle_steps"]),
    ("requests", lambda r: r["requests"]),
    ("harness-verified MB", lambda r: r["verified_bytes"] / 1e6),
    ("background threads CPU s", lambda r: r["background_threads_cpu_s"]),
    ("mismatches", lambda r: r["mismatch_count"]),
]


def metric(r: dict[str, Any], f: Callable[[dict[str, Any]], Any]) -> Any:
    if not r or "schedule" not in r:
        return None
    try:
        return f(r)
    except (KeyError, TypeError):
        return None


def median(xs: list[Any]) -> Any:
    xs = [x for x in xs if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x))]
    if not xs:
        return None
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def table(passes: list[dict[str, dict[str, Any]]], configs: list[str]) -> str:
    w0 = max(len(n) for n, _ in ROWS) + 2
    ws = [max(len(LABELS[c]), 10) + 2 for c in configs]
    lines = ["".ljust(w0) + "".join(LABELS[c].rjust(w) for c, w in zip(configs, ws))]
    for name, f in ROWS:
        cells = [fmt(median([metric(p.get(c, {}), f) for p in passes])).rjust(w)
                 for c, w in zip(configs, ws)]
        lines.append(name.ljust(w0) + "".join(cells))
    return "\n".join(lines)


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, Optional[float]]:
    """The issue's ratios within one pass (numbers a few seconds apart)."""
    def get(c: str, *path: str) -> Optional[float]:
        x: Any = results.get(c)
        if not x or "schedule" not in x:
            return None
        for k in path:
            x = x.get(k) if isinstance(x, dict) else None
        return x

    def div(a: Optional[float], b: Optional[float]) -> Optional[float]:
        return round(a / b, 4) if a is not None and b else None

    out: dict[str, Optional[float]] = {}
    base = get("none", "schedule", "mean_ms")
    for c in ("kvpool", "intree_mooncake", "intree_kvpool"):
        v = get(c, "schedule", "mean_ms")
        out[f"schedule_overhead_ms.{c}"] = round(v - base, 4) if None not in (v, base) else None
    out["kvpool_vs_intree_mooncake_schedule_overhead"] = div(
        out["schedule_overhead_ms.kvpool"], out["schedule_overhead_ms.intree_mooncake"])
    bu = get("none", "schedule_plus_update", "mean_ms")
    ov = {c: (None if None in (get(c, "schedule_plus_update", "mean_ms"), bu)
              else get(c, "schedule_plus_update", "mean_ms") - bu)
          for c in ("kvpool", "intree_mooncake")}
    out["kvpool_vs_intree_mooncake_sched_plus_update_overhead"] = div(ov["kvpool"],
                                                                      ov["intree_mooncake"])
    out["kvpool_lookup_p50_ms"] = get("kvpool", "lookup", "p50_ms")
    out["intree_mooncake_lookup_p50_ms"] = get("intree_mooncake", "lookup", "p50_ms")
    out["intree_mooncake_vs_kvpool_lookup_p50"] = div(out["intree_mooncake_lookup_p50_ms"],
                                                      out["kvpool_lookup_p50_ms"])
    out["intree_mooncake_vs_kvpool_lookup_mean"] = div(get("intree_mooncake", "lookup", "mean_ms"),
                                                       get("kvpool", "lookup", "mean_ms"))
    out["kvpool_vs_intree_mooncake_gbps"] = div(get("kvpool", "gbps"), get("intree_mooncake", "gbps"))
    out["kvpool_vs_intree_mooncake_gbps_without_harness"] = div(
        get("kvpool", "gbps_without_harness"), get("intree_mooncake", "gbps_without_harness"))
    out["kvpool_vs_intree_mooncake_store_op_gbps"] = div(get("kvpool", "op_gbps", "store"),
                                                         get("intree_mooncake", "op_gbps", "store"))
    out["kvpool_vs_intree_mooncake_load_op_gbps"] = div(get("kvpool", "op_gbps", "load"),
                                                        get("intree_mooncake", "op_gbps", "load"))
    out["intree_mooncake_vs_kvpool_connector_call_s"] = div(
        get("intree_mooncake", "connector_critical_path_s"), get("kvpool", "connector_critical_path_s"))
    return out


TARGETS = {"kvpool_vs_intree_mooncake_schedule_overhead": ("<=", 1 / 3),
           "kvpool_lookup_p50_ms": ("<", 0.3),
           "kvpool_vs_intree_mooncake_gbps": (">=", 3.0)}


def main() -> int:
    ap = argparse.ArgumentParser(description="kvpool's vLLM connector against vLLM's in-tree "
                                 "Mooncake connector, through vLLM's real scheduler (CPU)")
    ap.add_argument("--quick", action="store_true", help="a smaller run (a smoke test)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--passes", type=int, default=None,
                    help="passes over the configurations (default 3; --quick 1), every other "
                         "pass in reverse order; the table shows the median pass value")
    ap.add_argument("--out", default=None, help="JSON output (default bench/results/vllm.json; "
                    "--quick: none unless given)")
    ap.add_argument("--kvpool", default=os.environ.get("KVPOOL_BIN", str(ROOT / "build/kvpool")))
    ap.add_argument("--timeout", type=float, default=240.0, help="per configuration, seconds")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch intra-op threads of the harness's fake forward (default 0: "
                         "torch's own default, one per core). The scheduler-side latencies "
                         "depend on it on a 2-vCPU VM (see the module docstring)")
    ap.add_argument("--verbose", action="store_true", help="keep each process's stderr tail")
    ap.add_argument("--inner", choices=CONFIGS, help=argparse.SUPPRESS)
    ap.add_argument("--params", choices=list(PARAMS), default="full", help=argparse.SUPPRESS)
    a = ap.parse_args()
    kvpool_bin = str(Path(a.kvpool).resolve())
    if a.inner:
        try:
            res = inner(a.inner, PARAMS[a.params], kvpool_bin)
        except Exception as e:
            import traceback
            res = {"config": a.inner, "label": LABELS[a.inner], "ok": False,
                   "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
            print("RESULT " + json.dumps(res, default=str), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if res.get("ok") else 1)  # skip the interpreter teardown (store threads)

    mode = "quick" if a.quick else "full"
    npass = a.passes if a.passes is not None else (1 if a.quick else 3)
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    bad = [c for c in configs if c not in CONFIGS]
    if bad or npass < 1:
        ap.error(f"unknown configuration(s) {bad}" if bad else "--passes must be >= 1")
    if not os.access(kvpool_bin, os.X_OK):
        print(f"bench_vllm: no kvpool binary at {kvpool_bin} (make)", file=sys.stderr)
        return 1
    p = PARAMS[mode]
    os.environ["BENCH_VLLM_TORCH_THREADS"] = str(a.torch_threads)
    print(f"bench_vllm ({mode}): {p['conversations']} conversations x {p['turns']} turns, "
          f"{p['layers']} layers x {p['kv_heads']} KV heads x {p['head_dim']} fp16, "
          f"{p['num_blocks']} local blocks, {npass} pass(es) over: {', '.join(configs)}",
          flush=True)
    t0 = time.perf_counter()
    passes: list[dict[str, dict[str, Any]]] = []
    ok = True
    for i in range(npass):
        this: dict[str, dict[str, Any]] = {}
        for c in (configs if i % 2 == 0 else configs[::-1]):
            r = run_config(c, mode, kvpool_bin, a.timeout, a.verbose)
            this[c] = r
            ok &= bool(r.get("ok"))
            status = "ok" if r.get("ok") else \
                f"FAILED: {r.get('error') or r.get('mismatches') or r.get('output_mismatches')}"
            print(f"  pass {i + 1}: {LABELS[c]}: {status} ({r.get('process_wall_s')} s)", flush=True)
            if not r.get("ok") and r.get("traceback"):
                print(r["traceback"], file=sys.stderr)
            if not r.get("ok") and r.get("log_tail"):
                print(r["log_tail"][-2000:], file=sys.stderr)
        passes.append(this)
    digests = {r.get("prompts_digest") for ps in passes for r in ps.values() if r.get("prompts_digest")}
    same = len(digests) <= 1
    print()
    print(table(passes, configs))
    per_pass = [ratios(ps) for ps in passes]
    rat: dict[str, Any] = {}
    for k in per_pass[0]:
        vals = [pp[k] for pp in per_pass]
        rat[k] = {"median": median(vals), "passes": vals}
        if k in TARGETS:
            op, lim = TARGETS[k]
            m = rat[k]["median"]
            rat[k]["target"] = f"{op} {round(lim, 3)}"
            rat[k]["met"] = None if m is None else bool(
                m <= lim if op == "<=" else m < lim if op == "<" else m >= lim)
    print()
    for k, v in rat.items():
        extra = f"  (target {v['target']}: {'met' if v['met'] else 'NOT met'})" if "target" in v else ""
        print(f"  {k}: median {fmt(v['median'], 4)}; passes {[fmt(x, 4) for x in v['passes']]}{extra}")
    if not same:
        print("  ERROR: the configurations saw different prompts", file=sys.stderr)
    from importlib.metadata import version
    doc = {
        "benchmark": "bench/bench_vllm.py",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "vllm": version("vllm"),
        "mode": mode, "params": p, "passes": npass, "configs": configs,
        "torch_threads": a.torch_threads or "torch default",
        "same_workload": same, "workload_digests": sorted(d for d in digests if d),
        "total_wall_s": round(time.perf_counter() - t0, 1),
        "table_median": {c: {name: median([metric(ps.get(c, {}), f) for ps in passes])
                             for name, f in ROWS} for c in configs},
        "ratios": rat,
        "results": passes,
    }
    out = a.out or (None if a.quick else str(ROOT / "bench/results/vllm.json"))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(out + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        tmp.replace(out)
        print(f"\nresults: {out} ({doc['total_wall_s']} s)")
    return 0 if ok and same else 1


if __name__ == "__main__":
    sys.exit(main())
