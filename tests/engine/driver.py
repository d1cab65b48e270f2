"""One vLLM engine process for the real-engine tests and the TTFT benchmark.

    python driver.py SPEC.json RESULT.json

SPEC (JSON):
  model             model directory (tiny_weights.py)
  dtype             "bfloat16" (default), "float16", "float32"
  tp                tensor-parallel size (default 1; > 1 runs workers as processes)
  executor          null, or "mp": workers in their own processes even at TP 1
  multiproc         true: the EngineCore in its own process (vLLM's default);
                    false (default): in this process, which the corruption
                    control needs (it reaches the KV cache tensors)
  prefix_caching    vLLM's own prefix cache (default false: hits come from the pool)
  kv                kv_transfer_config dict, or null (no connector)
  as_mooncake       true: kvpool.install_as_mooncake() first (vLLM's in-tree
                    MooncakeStoreConnector then runs on kvpool)
  num_blocks        num_gpu_blocks_override (small: forces preemption)
  max_num_seqs, max_num_batched_tokens, block_size (default 32),
  mamba_cache_mode ("align": what KVPoolConnector needs for Mamba state)
  kv_space_gib      VLLM_CPU_KVCACHE_SPACE (default 1)
  phases            list of {name, prompts: [[token ids]...], max_tokens,
                    corrupt_kv_before: bool, reset_prefix_cache: bool,
                    wait_for: path (block until it exists, then sleep_s),
                    continue_from: {phase, suffix}: instead of prompts, each
                    prompt of that earlier phase + its generated tokens +
                    suffix (token ids)}

RESULT: {"startup_s", "phases": [{"name", "elapsed_s", "outputs": [{"tokens",
"cached"}]}], "error"?}. After each phase the file PHASE.done appears beside
RESULT.json, and PHASE.start when it begins (the tests kill or start the pool
between phases and during them)."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _corrupt_kv(llm: Any) -> int:
    """Scribbles every KV cache tensor of this process's engine (in-process
    engine core only); returns how many layers it touched."""
    import torch

    ctx = llm.llm_engine.vllm_config.compilation_config.static_forward_context
    n = 0
    g = torch.Generator().manual_seed(1234)
    for layer in ctx.values():
        kv = getattr(layer, "kv_cache", None)
        if kv is None:
            continue
        for t in kv if isinstance(kv, (list, tuple)) else [kv]:
            if isinstance(t, torch.Tensor) and t.numel():
                t.copy_(torch.randn(t.shape, generator=g).to(t.dtype) * 4)
                n += 1
    return n


def _metrics(llm: Any) -> dict[str, float]:
    """vLLM's own counters and gauges (LLM.get_metrics), summed over labels,
    and per operation as NAME:OPERATION for the connector's counters
    (vllm:kvpool_failed_keys:load): vllm:num_preemptions, the prefix-cache
    and connector counters."""
    out: dict[str, float] = {}
    try:
        ms = llm.get_metrics()
    except Exception:
        return out
    for m in ms:
        v = getattr(m, "value", None)
        if not isinstance(v, (int, float)):
            continue
        op = (getattr(m, "labels", None) or {}).get("operation")
        for name in (m.name, f"{m.name}:{op}") if op else (m.name,):
            out[name] = out.get(name, 0.0) + float(v)
    return out


def _noop_cuda_event() -> None:
    """vLLM's in-tree MooncakeStoreConnector records torch.cuda.Event in
    wait_for_save; on the CPU engine there is no CUDA: an event that is
    always complete (the CPU forward is synchronous)."""
    import torch

    if torch.cuda.is_available():
        return

    class NoopEvent:
        def __init__(self, *a: Any, **k: Any) -> None: ...
        def record(self, *a: Any, **k: Any) -> None: ...
        def synchronize(self) -> None: ...
        def query(self) -> bool: return True
        def wait(self, *a: Any, **k: Any) -> None: ...

    torch.cuda.Event = NoopEvent  # type: ignore[misc,assignment]


def _prompts_of(ph: dict[str, Any],
                ran: dict[str, tuple[list[list[int]], list[list[int]]]]) -> list[list[int]]:
    """A phase's prompts: its own, or (continue_from) an earlier phase's
    prompts followed by what they generated and the suffix."""
    cont = ph.get("continue_from")
    if not cont:
        return [list(p) for p in ph["prompts"]]
    prompts, tokens = ran[cont["phase"]]
    return [p + t + list(cont.get("suffix", [])) for p, t in zip(prompts, tokens)]


def main(spec_path: str, out_path: str) -> int:
    spec = json.load(open(spec_path))
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.get("kv_space_gib", 1)))
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if spec.get("multiproc") else "0"
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    t0 = time.perf_counter()
    result: dict[str, Any] = {"phases": []}

    def flush() -> None:
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, out_path)

    if spec.get("as_mooncake"):
        import kvpool
        kvpool.install_as_mooncake()
        _noop_cuda_event()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    args: dict[str, Any] = dict(
        model=spec["model"], skip_tokenizer_init=True, enforce_eager=True,
        block_size=spec.get("block_size", 32), dtype=spec.get("dtype", "bfloat16"),
        max_model_len=spec.get("max_model_len", 4096), seed=0,
        enable_prefix_caching=bool(spec.get("prefix_caching", False)),
        tensor_parallel_size=spec.get("tp", 1),
        max_num_seqs=spec.get("max_num_seqs", 16),
        max_num_batched_tokens=spec.get("max_num_batched_tokens", 4096),
        disable_log_stats=False)
    if spec.get("mamba_cache_mode"):
        args["mamba_cache_mode"] = spec["mamba_cache_mode"]
    if spec.get("executor"):
        args["distributed_executor_backend"] = spec["executor"]
    if spec.get("num_blocks"):
        args["num_gpu_blocks_override"] = spec["num_blocks"]
    if spec.get("kv"):
        from vllm.config import KVTransferConfig
        args["kv_transfer_config"] = KVTransferConfig(**spec["kv"])
    try:
        llm = LLM(**args)
    except Exception as e:  # the test reads why
        result["error"] = f"{type(e).__name__}: {e}"
        flush()
        return 2
    result["startup_s"] = round(time.perf_counter() - t0, 3)
    flush()
    ran: dict[str, tuple[list[list[int]], list[list[int]]]] = {}  # name: prompts, tokens
    for ph in spec.get("phases", []):
        w = ph.get("wait_for")
        if w:
            deadline = time.monotonic() + 120
            while not os.path.exists(w) and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(float(ph.get("sleep_s", 0)))
        open(os.path.join(os.path.dirname(out_path), ph["name"] + ".start"), "w").close()
        rec: dict[str, Any] = {"name": ph["name"]}
        if ph.get("reset_prefix_cache"):
            llm.reset_prefix_cache()
        if ph.get("corrupt_kv_before"):
            rec["corrupted_layers"] = _corrupt_kv(llm)
        sp = SamplingParams(temperature=0.0, max_tokens=ph.get("max_tokens", 8),
                            ignore_eos=True, detokenize=False)
        token_lists = _prompts_of(ph, ran)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in token_lists]
        t = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        ran[ph["name"]] = (token_lists, [list(o.outputs[0].token_ids) for o in outs])
        rec["elapsed_s"] = round(time.perf_counter() - t, 6)
        rec["outputs"] = [{"tokens": list(o.outputs[0].token_ids),
                           "cached": int(o.num_cached_tokens or 0)} for o in outs]
        rec["metrics"] = _metrics(llm)
        result["phases"].append(rec)
        flush()
        open(os.path.join(os.path.dirname(out_path), ph["name"] + ".done"), "w").close()
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
