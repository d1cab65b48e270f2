"""Smoke test: vLLM 0.33.0's in-tree MooncakeStoreConnector inside vLLM's real v1 Scheduler,
on this CPU-only machine, against the real Mooncake store and against kvpool's drop-in.

    ~/.cache/kvpool/venv-vllm/bin/python bench/vllm_mooncake_intree_smoke.py [--store S]

S is mooncake, kvpool or both (the default). Each store runs in its own process inside fresh
network + pid namespaces (``unshare -n -p -f --kill-child``; the script re-runs itself there).
In each: the real Scheduler (tiny llama config, no weights) and a worker connector from
``KVConnectorFactory.create_connector(vc, WORKER, kv_cache_config)`` with KV tensors from
``allocate_kv_cache``. Request r0 (a 64-token shared prefix + 16 own tokens) runs to completion;
its "forward" writes deterministic bytes into each block it completes, and the connector saves
them. Then the local prefix cache is reset and the KV cache zeroed (a cold instance), and r1
(the same 64-token prefix + 16 other tokens) runs: the scheduler's lookup must report 64
external hit tokens, the worker loads them, and r1's first four blocks must hold exactly the
bytes r0 wrote. Prints one JSON line (the outer run: {"ok": ..., "<store>": {...}}) and exits
0 when every store passed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vllm_mooncake_intree as vmi  # noqa: E402

BS = 16           # block size (tokens)
PREFIX = 64       # shared prefix (4 blocks)
TAIL = 16         # each request's own tokens (1 block)
MAX_TOKENS = 2
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 2, "head_dim": 16, "vocab_size": 1024,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False,
}


def inner(store: str, segment_mib: int) -> dict:
    """One store kind, in this process (inside the namespace). Returns the result dict."""
    t_start = time.perf_counter()
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import torch
    from vllm import SamplingParams
    from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.forward_context import get_forward_context, set_forward_context
    from vllm.platforms import current_platform
    from vllm.utils.hashing import sha256
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config,
                                             get_request_block_hasher, init_none_hash,
                                             resolve_kv_cache_block_sizes)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager
    from vllm.v1.worker.utils import allocate_kv_cache
    t_import = time.perf_counter() - t_start

    res: dict = {"store": store, "platform": type(current_platform).__name__,
                 "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE"),
                 "import_s": round(t_import, 2)}
    info: dict = {}
    model_tmp = tempfile.TemporaryDirectory(prefix="tiny-llama.")
    model_dir = model_tmp.name  # a config.json only: no tokenizer, no weights
    Path(model_dir, "config.json").write_text(json.dumps(TINY_LLAMA))

    with model_tmp, vmi.intree_mooncake(store, segment_mib, info=info) as kvt_dict:
        t_ctx = time.perf_counter()
        res["setup"] = info
        res["kv_transfer_config"] = kvt_dict
        mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", seed=0,
                         max_model_len=1024)
        sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024,
                             enable_chunked_prefill=True, is_encoder_decoder=False,
                             async_scheduling=False)
        cc = CacheConfig(block_size=BS, gpu_memory_utilization=0.9, cache_dtype="auto",
                         enable_prefix_caching=True)
        vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                        kv_transfer_config=KVTransferConfig(**kvt_dict),
                        device_config=DeviceConfig("cpu"))
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(2)]
        specs = {n: FullAttentionSpec(block_size=BS, num_kv_heads=2, head_size=16,
                                      dtype=torch.float32) for n in layers}
        layout = resolve_kv_cache_layout(vc, [["LBHNC"]], list(specs.values()))
        groups = get_global_kv_cache_groups(vc, [specs])
        page = sum(s.page_size_bytes for s in specs.values())
        cfgs = get_kv_cache_configs(vc, [specs], [page * 128], groups)
        for c in cfgs:
            c.kv_cache_layout = vc.cache_config.kv_cache_layout
        scfg = generate_scheduler_kv_cache_config(cfgs)
        vc.cache_config.num_gpu_blocks = scfg.num_blocks
        sbs, hbs = resolve_kv_cache_block_sizes(scfg, vc)
        for c in (*cfgs, scfg):
            c.hash_block_size = hbs

        t0 = time.perf_counter()
        # The worker first: its MooncakeStoreWorker binds the lookup socket (ZMQ REP,
        # worker rank 0) that the scheduler side's LookupKeyClient connects to.
        worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, cfgs[0])
        res["worker_init_s"] = round(time.perf_counter() - t0, 3)
        kv = allocate_kv_cache(cfgs[0], torch.device("cpu"), layout,
                               [g.kv_cache_spec.block_size for g in cfgs[0].kv_cache_groups])
        t0 = time.perf_counter()
        worker.register_kv_caches(kv)
        res["register_kv_caches_s"] = round(time.perf_counter() - t0, 3)
        sched = Scheduler(vllm_config=vc, kv_cache_config=scfg, log_stats=True,
                          structured_output_manager=StructuredOutputManager(vc),
                          block_size=sbs, hash_block_size=hbs)
        conn = sched.connector
        res["connector_classes"] = [type(conn).__module__ + "." + type(conn).__name__,
                                    type(worker).__name__]
        import mooncake.store as ms
        res["mooncake_store_module"] = getattr(ms, "__file__", ms.__name__)
        t0_layer = next(iter(kv.values()))
        res["kv_layer"] = {"shape": list(t0_layer.shape), "stride": list(t0_layer.stride()),
                           "dtype": str(t0_layer.dtype), "layout": str(layout),
                           "num_blocks": scfg.num_blocks}

        # Record the scheduler side's answers (external hit tokens) and their latency.
        lookups: list = []
        orig_gnnmt = conn.get_num_new_matched_tokens

        def gnnmt(request, num_computed_tokens):
            t = time.perf_counter()
            r = orig_gnnmt(request, num_computed_tokens)
            lookups.append({"req": request.request_id, "num_tokens": request.num_tokens,
                            "local_computed": num_computed_tokens, "external": r[0],
                            "load_async": r[1],
                            "ms": round((time.perf_counter() - t) * 1e3, 3)})
            return r
        conn.get_num_new_matched_tokens = gnnmt  # type: ignore[method-assign]

        def pattern(layer_idx: int, tokens: list[int], j: int) -> torch.Tensor:
            """Block j's deterministic KV for these tokens (depends on the whole prefix)."""
            seed = zlib.crc32(json.dumps([layer_idx, tokens[:(j + 1) * BS]]).encode())
            g = torch.Generator().manual_seed(seed)
            shape = kv[layers[layer_idx]][0].shape
            return torch.randn(shape, generator=g, dtype=torch.float32)

        init_none_hash(sha256)
        sp = SamplingParams(max_tokens=MAX_TOKENS)
        sp.update_from_generation_config({}, 2)
        prefix = [3 + (i * 7) % 1000 for i in range(PREFIX)]
        prompts = {"r0": prefix + [500 + i for i in range(TAIL)],
                   "r1": prefix + [700 + i for i in range(TAIL)]}
        tables: dict[str, list[int]] = {}
        stats_total = None
        trace: list = []
        verified: dict = {}
        empty_steps = 0

        def run_until_idle(label: str, limit_s: float = 60.0) -> int:
            nonlocal stats_total, empty_steps
            steps = 0
            deadline = time.monotonic() + limit_s
            while sched.has_requests():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{label}: not idle after {limit_s} s ({trace[-3:]})")
                steps += 1
                so = sched.schedule()
                for r in so.scheduled_new_reqs:
                    tables[r.req_id] = list(r.block_ids[0])
                cr = so.scheduled_cached_reqs
                for i, rid in enumerate(cr.req_ids):
                    if cr.new_block_ids[i]:
                        tables[rid] += list(cr.new_block_ids[i][0])
                worker.handle_preemptions(so.kv_connector_metadata)
                with set_forward_context(None, vc):
                    worker.bind_connector_metadata(so.kv_connector_metadata)
                    if so.has_sync_kv_loads:
                        worker.start_load_kv(get_forward_context())
                    # r1's loaded blocks, checked before its first forward touches anything.
                    for r in so.scheduled_new_reqs:
                        if r.req_id == "r1" and r.num_computed_tokens > 0:
                            nblk = r.num_computed_tokens // BS
                            ok, nbytes = True, 0
                            for li, ln in enumerate(layers):
                                for j in range(nblk):
                                    got = kv[ln][tables["r1"][j]]
                                    ok &= bool(torch.equal(got, pattern(li, prompts["r1"], j)))
                                    nbytes += got.numel() * got.element_size()
                            verified.update({"loaded_blocks": nblk, "bytes_compared": nbytes,
                                             "equal": ok,
                                             "num_computed_tokens": r.num_computed_tokens})
                    # The "forward": every block completed by this step's tokens.
                    for rid, n in so.num_scheduled_tokens.items():
                        req = sched.requests[rid]
                        done_before = req.num_computed_tokens - n  # schedule() advanced it
                        toks = req.all_token_ids
                        for j in range(done_before // BS, (done_before + n) // BS):
                            for li, ln in enumerate(layers):
                                kv[ln][tables[rid][j]].copy_(pattern(li, toks, j))
                    if not so.has_sync_kv_loads:
                        worker.start_load_kv(get_forward_context())
                    worker.wait_for_save()
                    tr = worker.get_transfer_results(so.finished_req_ids)
                    out = KVConnectorOutput(
                        finished_sending=tr.finished_sending,
                        finished_recving=tr.finished_recving,
                        failed_recving=tr.failed_recving,
                        invalid_block_ids=worker.get_block_ids_with_load_errors(),
                        kv_connector_stats=worker.get_kv_connector_stats(),
                        kv_cache_events=worker.get_kv_connector_kv_cache_events(),
                        kv_connector_worker_meta=worker.build_connector_worker_meta())
                    worker.clear_connector_metadata()
                if out.kv_connector_stats is not None:
                    stats_total = (out.kv_connector_stats if stats_total is None
                                   else stats_total.aggregate(out.kv_connector_stats))
                ids = list(so.num_scheduled_tokens)
                if ids:
                    mro = ModelRunnerOutput(req_ids=ids,
                                            req_id_to_index={r: k for k, r in enumerate(ids)},
                                            sampled_token_ids=[[5] for _ in ids], logprobs=None,
                                            prompt_logprobs_dict={}, pooler_output=None,
                                            kv_connector_output=out)
                else:
                    mro = ModelRunnerOutput.with_kv_conn_output_only(out)
                    empty_steps += 1
                ev = {"label": label, "sched": dict(so.num_scheduled_tokens)}
                if out.finished_recving:
                    ev["finished_recving"] = sorted(out.finished_recving)
                if out.kv_connector_worker_meta is not None:
                    ev["completed_saves"] = dict(out.kv_connector_worker_meta.completed_saves)
                if ids or len(ev) > 2:
                    trace.append(ev)
                sched.update_from_output(so, mro)
                if not ids:
                    time.sleep(0.0005)  # no forward this step: let the I/O threads run
            return steps

        def mkreq(rid: str) -> Request:
            return Request(request_id=rid, prompt_token_ids=prompts[rid], sampling_params=sp,
                           pooling_params=None,
                           block_hasher=get_request_block_hasher(hbs, sha256))

        t0 = time.perf_counter()
        sched.add_request(mkreq("r0"))
        steps0 = run_until_idle("r0")
        res["r0_s"] = round(time.perf_counter() - t0, 3)
        res["r0_blocks"] = tables["r0"]
        # A cold instance for r1: no local prefix-cache hit, and no stale bytes to find.
        res["reset_prefix_cache"] = sched.reset_prefix_cache()
        for t in kv.values():
            t.zero_()
        t0 = time.perf_counter()
        sched.add_request(mkreq("r1"))
        steps1 = run_until_idle("r1")
        res["r1_s"] = round(time.perf_counter() - t0, 3)
        res["r1_blocks"] = tables["r1"]
        res["steps"] = {"r0": steps0, "r1": steps1, "without_forward": empty_steps}
        res["lookups"] = lookups
        res["trace"] = trace
        res["verified"] = verified
        res["stats"] = stats_total.reduce() if stats_total is not None else {}
        bp = sched.kv_cache_manager.block_pool
        res["free_blocks_at_end"] = [bp.free_block_queue.num_free_blocks, bp.num_gpu_blocks]
        t0 = time.perf_counter()
        worker.shutdown()
        conn.connector_scheduler.client.close()
        res["shutdown_s"] = round(time.perf_counter() - t0, 3)
        res["run_s"] = round(time.perf_counter() - t_ctx, 3)

    r1_lookup = [x for x in lookups if x["req"] == "r1"]
    res["r1_external_hit_tokens"] = r1_lookup[0]["external"] if r1_lookup else None
    res["ok"] = bool(res["r1_external_hit_tokens"] == PREFIX and verified.get("equal")
                     and verified.get("loaded_blocks") == PREFIX // BS
                     and res["free_blocks_at_end"][0] == res["free_blocks_at_end"][1] - 1
                     and res["stats"].get("load_get_total_bytes") == verified.get("bytes_compared"))
    res["total_s"] = round(time.perf_counter() - t_start, 2)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="both", choices=["mooncake", "kvpool", "both"])
    ap.add_argument("--segment-mib", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=240.0, help="per store, seconds")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--verbose", action="store_true", help="keep vLLM's and the store's logs")
    a = ap.parse_args()
    if a.inner:
        try:
            res = inner(a.store, a.segment_mib)
        except Exception as e:  # report, as one JSON line, why
            import traceback
            res = {"store": a.store, "ok": False, "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-3000:]}
        print("RESULT " + json.dumps(res, default=str), flush=True)
        os._exit(0 if res.get("ok") else 1)  # skip interpreter teardown (store threads)
    stores = ["mooncake", "kvpool"] if a.store == "both" else [a.store]
    out: dict = {}
    for s in stores:
        t0 = time.perf_counter()
        cmd = [sys.executable, str(Path(__file__).resolve()), "--inner", "--store", s,
               "--segment-mib", str(a.segment_mib)]
        try:
            r = vmi.run_in_netns(cmd, timeout_s=a.timeout, capture_output=True, text=True)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            res = json.loads(lines[-1][7:]) if lines else {
                "ok": False, "error": f"rc {r.returncode}, no RESULT line",
                "tail": (r.stdout + r.stderr)[-3000:]}
            if a.verbose or not res.get("ok"):
                res["log_tail"] = r.stderr[-4000:]
        except Exception as e:
            res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        res["wall_s"] = round(time.perf_counter() - t0, 2)
        out[s] = res
    ok = all(v.get("ok") for v in out.values())
    print(json.dumps({"ok": ok, **out}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
