"""Tiny model configurations for the CPU vLLM engine harness (tests/vllm/engine.py).

Nothing here loads weights or a tokenizer: vLLM only needs a HuggingFace
``config.json`` to build a ``ModelConfig``; the KV cache specs of the layers are
written out by hand (what a real worker's attention layers would report from
``get_kv_cache_spec``), per mode:

- ``"full"``:  2 layers, ``FullAttentionSpec`` (2 KV heads, head size 16, float32).
- ``"swa"``:   layer 0 ``FullAttentionSpec``, layer 1 ``SlidingWindowSpec``
  (window 32). With ``VLLM_TARGET_DEVICE=cpu`` (CpuPlatform) the hybrid KV cache
  manager stays on, so there are two KV cache groups over one block pool.
- ``"mla"``:   2 layers, ``MLAAttentionSpec`` (1 latent "head" of 64, replicated
  over TP ranks).
- ``"mamba"``: layer 0 ``FullAttentionSpec``, layer 1 ``MambaSpec`` in
  ``mamba_cache_mode="align"``; its state (one page per block) is written and
  verified too (engine.py).
- ``"mamba2x"``: as ``"mamba"`` with Mamba blocks twice the attention block
  size, so the hash block is the attention block and the prompt's Mamba
  checkpoint can fall inside a Mamba block (a sub-block tail).

KV heads are sharded over TP ranks as a real TP worker does (``num_kv_heads //
tp_size``); MLA and Mamba state are replicated.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 16,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}

MODES = ("full", "swa", "mla", "mamba", "mamba2x")
SLIDING_WINDOW = 32
LAYER_FMT = "model.layers.{}.self_attn.attn"
MAMBA_LAYER_FMT = "model.layers.{}.mixer"

_model_dir: str | None = None


def model_dir() -> str:
    """A directory holding the tiny llama ``config.json``, made once per process.

    Its basename is always ``tiny-llama``: connectors key the pool by the model
    name (the basename of the path), so every process -- engines, TP ranks --
    must name the model alike, as real deployments do."""
    global _model_dir
    if _model_dir is None or not os.path.exists(os.path.join(_model_dir, "config.json")):
        d = os.path.join(tempfile.mkdtemp(prefix="kvpool-tiny-"), "tiny-llama")
        os.mkdir(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(TINY_LLAMA, f)
        _model_dir = d
    return _model_dir


@dataclass(frozen=True)
class ModelShape:
    """What the harness needs to know about the fake model."""

    vocab_size: int
    eos_token_id: int
    num_kv_heads_total: int
    layer_names: tuple[str, ...]


def model_shape(mode: str) -> ModelShape:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    if mode.startswith("mamba"):
        names = (LAYER_FMT.format(0), MAMBA_LAYER_FMT.format(1))
    else:
        names = (LAYER_FMT.format(0), LAYER_FMT.format(1))
    return ModelShape(
        vocab_size=TINY_LLAMA["vocab_size"],
        eos_token_id=TINY_LLAMA["eos_token_id"],
        num_kv_heads_total=TINY_LLAMA["num_key_value_heads"],
        layer_names=names,
    )


def pp_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The layers pipeline stage ``pp_rank`` holds (vLLM's even split, get_pp_indices)."""
    from vllm.distributed.utils import get_pp_indices
    start, end = get_pp_indices(num_layers, pp_rank, pp_size)
    return range(start, end)


def kv_cache_specs(mode: str, block_size: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1,
                   dtype: str = "float32") -> dict[str, Any]:
    """The per-layer KV cache specs one worker reports (layer name -> spec): a TP
    shard of the layers of pipeline stage ``pp_rank``; attention KV of ``dtype``
    (the model's, as with ``cache_dtype="auto"``)."""
    specs = _all_specs(mode, block_size, tp_size, dtype)
    names = model_shape(mode).layer_names
    keep = {names[i] for i in pp_layers(len(names), pp_rank, pp_size)}
    return {n: s for n, s in specs.items() if n in keep}


def _all_specs(mode: str, block_size: int, tp_size: int, dtype: str = "float32") -> dict[str, Any]:
    import torch
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
    )

    shape = model_shape(mode)
    heads = TINY_LLAMA["num_key_value_heads"]
    if heads % tp_size:
        raise ValueError(f"tp_size {tp_size} does not divide {heads} KV heads")
    kvh = heads // tp_size
    hs = TINY_LLAMA["head_dim"]
    kvd = getattr(torch, dtype)  # attention KV: the model dtype (cache_dtype "auto")
    l0, l1 = shape.layer_names
    if mode == "full":
        return {n: FullAttentionSpec(block_size=block_size, num_kv_heads=kvh, head_size=hs, dtype=kvd)
                for n in shape.layer_names}
    if mode == "swa":
        return {
            l0: FullAttentionSpec(block_size=block_size, num_kv_heads=kvh, head_size=hs, dtype=kvd),
            l1: SlidingWindowSpec(block_size=block_size, num_kv_heads=kvh, head_size=hs, dtype=kvd,
                                  sliding_window=SLIDING_WINDOW),
        }
    if mode == "mla":
        return {n: MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=kvd)
                for n in shape.layer_names}
    # mamba
    return {
        l0: FullAttentionSpec(block_size=block_size, num_kv_heads=kvh, head_size=hs, dtype=kvd),
        l1: MambaSpec(block_size=block_size * (2 if mode == "mamba2x" else 1), shapes=((64,), (256,)), dtypes=(torch.float32, torch.float32),
                      mamba_cache_mode="align"),
    }


def build_vllm_config(
    kv_transfer_config: dict | None,
    *,
    mode: str,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    async_scheduling: bool,
    tp_size: int,
    tp_rank: int,
    enable_prefix_caching: bool = True,
    kv_events: bool = False,
    pp_size: int = 1,
    dtype: str = "float32",
    model_path: str | None = None,
) -> Any:
    """A ``VllmConfig`` for the tiny model on the CPU device.

    ``async_scheduling`` is forced after construction: CpuPlatform resolves it to
    False (its executor does not support it), but the scheduler side works.
    ``parallel_config.rank`` is set to ``tp_rank``, the rank in the world of
    ``tp_size * pp_size`` (what a worker process has).
    ``kv_events``: KV cache events on (``KVEventsConfig``, the null publisher).
    ``dtype``: the model's dtype; ``model_path``: another directory holding the
    tiny ``config.json`` (default ``model_dir()``).
    """
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )

    model_shape(mode)  # validates mode
    mc = ModelConfig(model=model_path or model_dir(), skip_tokenizer_init=True, dtype=dtype, seed=0,
                     max_model_len=max_model_len)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=mc.max_model_len, enable_chunked_prefill=True,
                         is_encoder_decoder=False, async_scheduling=False)
    cc = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                     enable_prefix_caching=enable_prefix_caching)
    if mode.startswith("mamba"):
        cc.mamba_cache_mode = "align"
    pc = ParallelConfig(tensor_parallel_size=tp_size, pipeline_parallel_size=pp_size)
    kvt = KVTransferConfig(**copy.deepcopy(kv_transfer_config)) if kv_transfer_config else None
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc, parallel_config=pc,
                    kv_transfer_config=kvt, device_config=DeviceConfig("cpu"),
                    kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null")
                    if kv_events else None)
    vc.scheduler_config.async_scheduling = bool(async_scheduling)
    vc.parallel_config.rank = tp_rank
    return vc
