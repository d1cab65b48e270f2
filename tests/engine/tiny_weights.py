"""Tiny decoder models with random, seeded weights, written to safetensors for
vLLM's real CPU engine (tests/engine, bench/ttft.py).

vLLM's ``load_format="dummy"`` weights make a model's output ignore its KV
cache, so they prove nothing about a KV connector. These weights are random
but sharp: the query and key projections are scaled so that attention
concentrates on a few positions, and the embedding and head are scaled so
that greedy decoding is decided by the context. The tests prove it with a
corruption control (scribbling the KV cache changes the tokens).

Architectures (``arch``):
  llama    LlamaForCausalLM, full attention in every layer
  mistral  MistralForCausalLM, a sliding window in every layer
  gemma3   Gemma3ForCausalLM (text) with ``layer_types`` mixing full and
           sliding-window layers: vLLM's hybrid KV cache (two groups).
           (vLLM refuses Qwen2's mixed layers: "Sliding window for some but
           all layers is not supported".)

Nothing is downloaded: no tokenizer either (the engine runs with
``skip_tokenizer_init`` and token-id prompts)."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Shape:
    arch: str = "llama"
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 512
    vocab: int = 2048
    window: int = 64           # mistral / qwen2 sliding window, tokens
    max_len: int = 8192
    dtype: str = "bfloat16"    # the checkpoint's torch_dtype
    extra: tuple[tuple[str, Any], ...] = field(default=())

    def params(self) -> int:
        h, i, v = self.hidden, self.intermediate, self.vocab
        attn = h * self.heads * self.head_dim * 2 + h * self.kv_heads * self.head_dim * 2
        return 2 * v * h + self.layers * (attn + 3 * h * i + 2 * h) + h


SMALL = Shape()
# the time-to-first-token benchmark's model: ~94 M parameters, 8 layers,
# 16 heads, 4 KV heads (the shape of a real GQA model, scaled down)
BENCH = Shape(layers=8, hidden=1024, heads=16, kv_heads=4, head_dim=64, intermediate=2816,
              vocab=8192)


def config(s: Shape) -> dict[str, Any]:
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "gemma3": "Gemma3ForCausalLM"}[s.arch]
    cfg: dict[str, Any] = {
        "architectures": [arch], "model_type": s.arch, "hidden_size": s.hidden,
        "intermediate_size": s.intermediate, "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads, "num_hidden_layers": s.layers,
        "head_dim": s.head_dim, "vocab_size": s.vocab, "max_position_embeddings": s.max_len,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": s.dtype,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    if s.arch == "mistral":
        cfg["sliding_window"] = s.window
    if s.arch == "gemma3":
        # even layers full attention, odd layers a sliding window
        cfg.update(model_type="gemma3_text", sliding_window=s.window,
                   layer_types=["full_attention" if i % 2 == 0 else "sliding_attention"
                                for i in range(s.layers)],
                   query_pre_attn_scalar=s.head_dim, rope_local_base_freq=10000.0,
                   hidden_activation="gelu_pytorch_tanh",
                   final_logit_softcapping=None, attn_logit_softcapping=None)
        del cfg["hidden_act"]
    cfg.update(dict(s.extra))
    return cfg


def write(path: str, s: Shape = SMALL, seed: int = 0) -> str:
    """Writes config.json and model.safetensors for shape s into path (made if
    missing); the same (s, seed) always gives the same bytes. Returns path."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    dt = getattr(torch, s.dtype)
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, std: float) -> "torch.Tensor":
        return (torch.randn(*shape, generator=g) * std).to(dt)

    gemma = s.arch == "gemma3"

    def ones(n: int) -> "torch.Tensor":  # a norm's unit scale (Gemma's norms scale by 1 + w)
        return torch.zeros(n, dtype=dt) if gemma else torch.ones(n, dtype=dt)

    h, i, v, hd = s.hidden, s.intermediate, s.vocab, s.head_dim
    # sharp attention: q.k has a standard deviation of a few units per head
    qk = 2.0 / (h ** 0.5) ** 0.5 / hd ** 0.25
    w = {"model.embed_tokens.weight": rnd(v, h, std=1.0 / h ** 0.5 if gemma else 1.0),
         "model.norm.weight": ones(h)}
    w["lm_head.weight"] = rnd(v, h, std=3.0 / h ** 0.5)
    for layer in range(s.layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = ones(h)
        # Gemma normalises each sublayer's output (post_*_layernorm): scaled
        # up 4x, so that the context outweighs the last token's embedding in
        # the residual stream (else greedy decoding repeats one token)
        w[p + "post_attention_layernorm.weight"] = ones(h) + 3.0 if gemma else ones(h)
        w[p + "self_attn.q_proj.weight"] = rnd(s.heads * hd, h, std=qk * 4)
        w[p + "self_attn.k_proj.weight"] = rnd(s.kv_heads * hd, h, std=qk * 4)
        w[p + "self_attn.v_proj.weight"] = rnd(s.kv_heads * hd, h, std=1.0 / h ** 0.5)
        w[p + "self_attn.o_proj.weight"] = rnd(h, s.heads * hd, std=1.0 / (s.heads * hd) ** 0.5)
        if gemma:
            w[p + "pre_feedforward_layernorm.weight"] = ones(h)
            w[p + "post_feedforward_layernorm.weight"] = ones(h) + 3.0
            w[p + "self_attn.q_norm.weight"] = ones(hd)
            w[p + "self_attn.k_norm.weight"] = ones(hd)
        w[p + "mlp.gate_proj.weight"] = rnd(i, h, std=1.0 / h ** 0.5)
        w[p + "mlp.up_proj.weight"] = rnd(i, h, std=1.0 / h ** 0.5)
        w[p + "mlp.down_proj.weight"] = rnd(h, i, std=0.5 / i ** 0.5)
    save_file(w, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config(s), f, indent=1)
    return path


def cached(root: str, s: Shape = SMALL, seed: int = 0, name: str | None = None) -> str:
    """A model directory under root for (s, seed), written once and reused
    (the name is a digest of both unless given)."""
    key = hashlib.blake2b(repr((s, seed)).encode(), digest_size=6).hexdigest()
    path = os.path.join(root, name or f"tiny-{s.arch}-{key}")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        write(path, s, seed)
    return path
