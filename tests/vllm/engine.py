"""A CPU driver for vLLM 0.33's real v1 Scheduler and a KV connector, with a fake forward.

The harness runs vLLM's own ``Scheduler`` (``AsyncScheduler`` with async scheduling)
on the CPU and plays the model runner the way ``GPUModelRunner`` +
``KVConnectorModelRunnerMixin`` drive a KV connector, but the "forward" writes
deterministic bytes into the KV cache instead of running a model. Every byte a
connector loads can therefore be checked against what the forward would have
written. Connector-agnostic: any ``kv_transfer_config`` vLLM accepts works.

Construction (what ``EngineCore`` + a worker do; see vllm/v1/engine/core.py
``_initialize_kv_caches``): hand-written per-layer specs (tiny_models.py) ->
``resolve_kv_cache_layout`` -> ``get_global_kv_cache_groups`` ->
``get_kv_cache_configs`` (``num_gpu_blocks_override`` = ``num_blocks``) ->
``generate_scheduler_kv_cache_config`` -> ``resolve_kv_cache_block_sizes``. Each
worker: ``init_distributed_environment`` (gloo, one process per TP rank) +
``ensure_model_parallel_initialized``, the engine id synced over the TP group as
``ensure_kv_transfer_initialized`` does, the connector made by
``KVConnectorFactory.create_connector(vllm_config, WORKER, kv_cache_config)``,
the caches by ``vllm.v1.worker.utils.allocate_kv_cache`` and handed to
``register_kv_caches`` (then ``set_host_xfer_buffer_ops``). The layers are also
put in ``compilation_config.static_forward_context`` (objects with ``.kv_cache``)
so connectors that read ``forward_context.no_compile_layers`` work. During
every worker call the connector is installed as vLLM's global KV transfer agent
(``get_kv_transfer_group()``).

One worker step (``Worker.execute``), in the model runner's order:
``handle_preemptions(meta)``; drop finished requests, zero
``new_block_ids_to_zero``, apply ``kv_cache_block_copies``, update the block
tables; POISON (0xA5) every slot a connector is about to load (from the
scheduler: the ``num_external_tokens`` it passed to ``update_state_after_alloc``,
sync and async loads alike); then inside ``set_forward_context(None, cfg)``:
``bind_connector_metadata``; ``start_load_kv`` if ``has_sync_kv_loads``; the
forward, per layer in order: write this step's tokens into their slots (vLLM's
CPU and FlashAttention backends write the new KV *before* the attention op, so
the write comes before ``wait_for_layer_load``), ``wait_for_layer_load(name)``,
check every slot the attention would read (positions ``[0, start)``, or the
sliding window), ``save_kv_layer(name, kv_cache, attn_metadata=None)``; then
``start_load_kv`` if it was not called before; ``wait_for_save``;
``get_transfer_results(finished_req_ids)``; ``get_block_ids_with_load_errors``;
``get_kv_connector_stats``; ``get_kv_connector_kv_cache_events``;
``build_connector_worker_meta``; ``clear_connector_metadata``. Steps with no
tokens do the connector part without a forward (``kv_connector_no_forward``);
without a connector they return ``EMPTY_MODEL_RUNNER_OUTPUT``. Worker outputs go
through vLLM's ``KVOutputAggregator`` (as the multiproc executor does; on
CpuPlatform even TP 1 uses it), then ``update_from_output``.

By default the ``SchedulerOutput`` and the ``ModelRunnerOutput`` are pickled on
their way (``pickle_io=True``), as vLLM's multiproc executor does; so connector
metadata must pickle, and a worker never shares objects with the scheduler.

Bytes: slot (layer l, head h, position p) of a request holds
``f(l, global head, p, token[p], digest(tokens[: block_start(p)]))``, with the
digest chained per ``hash_block_size`` tokens; float elements are kept finite
and normal. Generated tokens are ``sample_token(req_id, pos)`` (no EOS; ignore_eos).

Checks (failures collected in ``Engine.mismatches``, never raised mid-step):
1. in the forward, after ``wait_for_layer_load``: what the attention reads;
   a request later reported in ``get_block_ids_with_load_errors`` is excused;
2. after ``update_from_output``: for every RUNNING request and every request
   whose async load just finished, all slots of positions < ``num_computed_tokens``
   in every (non-null) block of every group. Slots of blocks reported invalid
   stay excused until the forward rewrites them (``kv_load_failure_policy=
   "recompute"``). Poison left = failure; a block of another prefix = failure.

Async scheduling follows ``EngineCore.step_with_batch_queue`` (batch queue of
``max_concurrent_batches`` = 2): schedule(N+1) and its worker execution happen
before ``update_from_output(N)``. The worker runs each step as soon as it is
scheduled (the real GPU only overlaps compute; connector calls keep this order).

TP > 1: rank 0 (``make_engine(..., tp_size=2)``) owns the scheduler and a local
worker; ranks 1.. are child processes (``python -c 'engine._child_main(fd)'``,
``serve_worker`` over a socket pair wrapped in
``multiprocessing.connection.Connection``) built by ``make_worker`` and fed the
same pickled ``SchedulerOutput`` (plus the poison plan) each step; their
``ModelRunnerOutput`` comes back pickled and is aggregated; their mismatches
come back too (prefixed ``rank1``). All ranks join one gloo world through a
``file://`` rendezvous; KV heads are sharded (``num_kv_heads // tp_size``; the
expected bytes use the global head index, so rank 1 loading rank 0's bytes is
caught). ``worker=False`` keeps no worker in the engine process: every rank,
rank 0 included, is then a child process (vLLM's real split: the EngineCore
process runs no connector worker; the after-step check then does not run, the
in-forward check runs in the children). ``serve_worker(conn, kwargs)`` can also
be run by a test in a process of its own. Limits: one process holds one
``torch.distributed`` world, so engines alive at the same time in one process
must agree on (tp_size, tp_rank) (TP-1 engines share a world kept for the
process's life; a TP>1 world is torn down with its engine). The
scheduler-side connector runs in a process whose distributed groups are
initialised whenever it also holds a worker (in real vLLM the EngineCore
process has none).

API: ``make_engine(...) -> Engine``; ``Engine.add_request / step / run_until_done
/ assert_empty / preempt / abort / reset_cache / shutdown``;
``make_worker(...) -> Worker`` (``Worker.execute(so, poison_plan)``);
``serve_worker(conn, kwargs)``; ``sample_token(req_id, pos)``.

Mamba (mode "mamba", align): as preprocess_mamba, a request's running state
lives in the block of its last scheduled token; a new or resumed request
starts from block ``(start - 1) // block_size`` (a prefix-cache or connector
hit), copied forward when the step crosses a block boundary. The forward
checks that state (it must be the state after exactly ``start`` tokens:
``TokenBook.state_key``, which names every token before it) and writes the
state after the step. Loaded states are poisoned first and checked after the
load like the attention KV.

PP > 1 (``pp_size``): ranks ``pp_rank * tp_size + tp_rank``, each stage holding
its layers (vLLM's get_pp_indices), all ranks in one gloo world; every rank
runs every step (a fake forward needs no activations from the stage before).

Not modelled: attention metadata (``attn_metadata`` is None in
``save_kv_layer``; vLLM's own decorator would skip the connector calls in that
case, the harness makes them anyway), speculative decoding.
"""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # CpuPlatform: keeps HMA on for "swa"

import contextlib
import copy
import hashlib
import pickle
import sys
import tempfile
import time
import traceback
import zlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

import tiny_models  # noqa: E402  (tests/vllm is on sys.path when this module is)

if os.environ.get("VLLM_TARGET_DEVICE") != "cpu":  # pragma: no cover
    raise RuntimeError("tests/vllm/engine.py needs VLLM_TARGET_DEVICE=cpu before vllm is imported")

from vllm.platforms import current_platform  # noqa: E402

if not current_platform.is_cpu():  # pragma: no cover - vllm was imported before this module
    raise RuntimeError("vLLM resolved a non-CPU platform; import tests/vllm/engine.py before vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.config import VllmConfig, set_current_vllm_config  # noqa: E402
from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import get_forward_context, set_forward_context  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
    resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes,
    update_kv_cache_capacity,
)
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import AttentionSpec, KVCacheConfig, MambaSpec, MLAAttentionSpec  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402
from vllm.v1.worker.utils import allocate_kv_cache, copy_kv_cache_blocks_inplace  # noqa: E402

__all__ = [
    "Engine", "StepResult", "Worker", "make_engine", "make_worker", "serve_worker",
    "shutdown_worker", "sample_token", "POISON_BYTE", "TokenBook",
]

POISON_BYTE = 0xA5
_MAX_REPORTS_PER_CHECK = 8
_HERE = os.path.dirname(os.path.abspath(__file__))

_none_hash_ready = False


def _init_none_hash() -> None:
    global _none_hash_ready
    if not _none_hash_ready:
        init_none_hash(sha256)
        _none_hash_ready = True


def sample_token(req_id: str, pos: int, vocab_size: int = tiny_models.TINY_LLAMA["vocab_size"]) -> int:
    """The token the fake model samples for position ``pos`` of ``req_id`` (never 0..2)."""
    return 3 + zlib.crc32(f"{req_id}\0{pos}".encode()) % (vocab_size - 3)


# ---------------------------------------------------------------------------
# Deterministic KV bytes
# ---------------------------------------------------------------------------

def _s64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


_C1, _C2, _C3, _C4 = (_s64(c) for c in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB,
                                         0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93))


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64-style finaliser on int64 (wrapping multiply, arithmetic shifts)."""
    z = z ^ (z >> 31)
    z = z * _C1
    z = z ^ (z >> 29)
    z = z * _C2
    return z ^ (z >> 32)


_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


_ROOT_DIGEST = _s64(int.from_bytes(hashlib.blake2b(b"kvpool-root", digest_size=8).digest(), "little"))


def _poison_value(elem_size: int) -> int:
    return int.from_bytes(bytes([POISON_BYTE]) * elem_size, "little", signed=True)


class TokenBook:
    """Token ids and prefix digests of requests (both halves use the same rule).

    Position ``p`` of a request holds ``prompt[p]`` or ``sample_token(req_id, p)``.
    ``digests[k]`` is the chained digest of tokens ``[0, k * digest_block)``.
    """

    def __init__(self, digest_block: int):
        self.digest_block = digest_block
        self._prompts: dict[str, tuple[int, ...]] = {}
        self._digests: dict[str, list[int]] = {}
        self._tokens: dict[str, torch.Tensor] = {}  # int64 token ids of positions [0, len)

    def set_prompt(self, req_id: str, prompt: list[int] | tuple[int, ...]) -> None:
        prompt = tuple(prompt)
        if self._prompts.get(req_id) != prompt:
            self._prompts[req_id] = prompt
            self._digests[req_id] = [_ROOT_DIGEST]
            self._tokens[req_id] = torch.tensor(prompt, dtype=torch.int64)

    def has(self, req_id: str) -> bool:
        return req_id in self._prompts

    def drop(self, req_id: str) -> None:
        self._prompts.pop(req_id, None)
        self._digests.pop(req_id, None)
        self._tokens.pop(req_id, None)

    def _token_tensor(self, req_id: str, end: int) -> torch.Tensor:
        t = self._tokens[req_id]
        if t.numel() < end:
            n = max(end, 2 * t.numel(), 64)
            t = torch.cat([t, torch.tensor([sample_token(req_id, p) for p in range(t.numel(), n)], dtype=torch.int64)])
            self._tokens[req_id] = t
        return t

    def token(self, req_id: str, pos: int) -> int:
        prompt = self._prompts[req_id]
        return prompt[pos] if pos < len(prompt) else sample_token(req_id, pos)

    def tokens(self, req_id: str, start: int, end: int) -> list[int]:
        prompt = self._prompts[req_id]
        return [prompt[p] if p < len(prompt) else sample_token(req_id, p) for p in range(start, end)]

    def _digest_upto(self, req_id: str, k: int) -> list[int]:
        d = self._digests[req_id]
        bs = self.digest_block
        while len(d) <= k:
            j = len(d) - 1
            toks = self._token_tensor(req_id, (j + 1) * bs)[j * bs:(j + 1) * bs]
            h = hashlib.blake2b(d[j].to_bytes(8, "little", signed=True) + toks.numpy().tobytes(), digest_size=8)
            d.append(_s64(int.from_bytes(h.digest(), "little")))
        return d

    def state_key(self, req_id: str, n: int) -> int:
        """int64 naming the Mamba state after tokens [0, n): every token counts."""
        bs = self.digest_block
        d = self._digest_upto(req_id, n // bs)[n // bs]
        toks = self._token_tensor(req_id, max(n, 1))[n // bs * bs:n]
        h = hashlib.blake2b(d.to_bytes(8, "little", signed=True) + n.to_bytes(8, "little")
                            + toks.numpy().tobytes(), digest_size=8)
        return _s64(int.from_bytes(h.digest(), "little"))

    def keys(self, req_id: str, positions: torch.Tensor) -> torch.Tensor:
        """int64 key per position: f(position, token, digest of the tokens before its block)."""
        if positions.numel() == 0:
            return torch.empty(0, dtype=torch.int64)
        pmax = int(positions.max())
        d = torch.tensor(self._digest_upto(req_id, pmax // self.digest_block), dtype=torch.int64)
        toks = self._token_tensor(req_id, pmax + 1)[positions]
        z = _mix(d[positions // self.digest_block] ^ (positions * _C3))
        return _mix(z + toks * _C4)


# ---------------------------------------------------------------------------
# The worker half
# ---------------------------------------------------------------------------

@dataclass
class _Layer:
    name: str
    index: int
    group_id: int
    spec: Any
    tensor: torch.Tensor
    ints: torch.Tensor | None  # the same memory as signed ints of the element size (attention only)
    ratio: int  # kernel blocks per scheduler block
    kernel_block_size: int
    head_offset: int
    sliding_window: int | None
    state: torch.Tensor | None = None  # Mamba: (num_blocks, words) int64 view of each block's state

    @property
    def attention(self) -> bool:
        return self.ints is not None

    def state_values(self, key: int) -> torch.Tensor:
        """Expected Mamba state words of one block holding the state ``key`` (TokenBook.state_key)."""
        assert self.state is not None
        w = torch.arange(self.state.shape[1], dtype=torch.int64)
        return _mix(torch.full_like(w, key) ^ ((w * 0x3B9ACA07 + (self.index + 1) * 0x51ED27) * _C3))

    def values(self, keys: torch.Tensor) -> torch.Tensor:
        """Expected slot contents (n, H, C) for the given keys, as ``self.ints`` dtype."""
        assert self.ints is not None
        _, nh, _, nc = self.ints.shape
        heads = torch.arange(self.head_offset, self.head_offset + nh, dtype=torch.int64)
        elems = torch.arange(nc, dtype=torch.int64)
        salt = (heads[:, None] * 0x1000193 + elems[None, :] * 0x3B9ACA07 + (self.index + 1) * 0x51ED27) * _C3
        z = _mix(keys[:, None, None] ^ salt[None])
        size = self.ints.element_size()
        if size >= 2 and self.tensor.dtype.is_floating_point:
            bits = 8 * size
            z = (z & ((1 << (bits - 3)) - 1)) | (1 << (bits - 3))  # positive, normal, finite
        elif size < 8:
            z = z & ((1 << (8 * size)) - 1)
            z = torch.where(z >= 1 << (8 * size - 1), z - (1 << (8 * size)), z)
        return z.to(self.ints.dtype)

    def slot_index(self, block_ids: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kbs = self.kernel_block_size
        return block_ids * self.ratio + offsets // kbs, offsets % kbs


@dataclass
class _ReqState:
    """What the model runner caches per request (from the SchedulerOutput)."""

    block_ids: list[list[int]]
    num_prompt_tokens: int
    num_tokens: int  # tokens the worker knows: prompt + sampled


@dataclass
class _Rows:
    """Slots of one layer group to write or check, with their owners."""

    req_ids: list[str] = field(default_factory=list)
    positions: list[torch.Tensor] = field(default_factory=list)
    blocks: list[torch.Tensor] = field(default_factory=list)
    offsets: list[torch.Tensor] = field(default_factory=list)

    def add(self, req_id: str, pos: torch.Tensor, blk: torch.Tensor, off: torch.Tensor) -> None:
        if pos.numel():
            self.req_ids.append(req_id)
            self.positions.append(pos)
            self.blocks.append(blk)
            self.offsets.append(off)

    def expected(self, worker: "Worker", layer: _Layer) -> torch.Tensor:
        return torch.cat([worker.expected(layer, rid, pos) for rid, pos in zip(self.req_ids, self.positions)])


PoisonPlan = list[tuple[str, int, int, tuple[list[int], ...]]]
"""(req_id, first position, end position, block ids per group) of each pending load."""


class Worker:
    """One TP rank's model-runner half: KV caches, the worker connector, fake forward, checks.

    Contract: ``execute(so, poison_plan)`` is called once per scheduled step, in
    schedule order, with every ``SchedulerOutput`` the scheduler produced (empty
    steps included); it returns this rank's ``ModelRunnerOutput``.
    """

    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, layout: Any, *,
                 mode: str, tp_rank: int, null_block_id: int = 0, verify: str = "all", tp_size: int = 1):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.mode = mode
        self.tp_rank = tp_rank  # the rank in the world (pp_rank * tp_size + TP rank)
        self.tp_size = tp_size
        self.null_block_id = null_block_id
        self.verify = verify
        self.book = TokenBook(kv_cache_config.hash_block_size or vllm_config.cache_config.block_size)
        self.requests: dict[str, _ReqState] = {}
        self.mismatches: list[str] = []
        self.verified_bytes = 0
        self.verified_state_bytes = 0  # Mamba state bytes checked (part of verified_bytes)
        self.steps = 0
        self._mamba_idx: dict[str, int] = {}  # req_id -> block index holding its running state
        self._suspect: dict[int, set[int]] = {}  # block id -> offsets excused (reported invalid)
        # (req_id, layer index) -> (the book's digest list it was made from, values of positions [0, n))
        self._vcache: dict[tuple[str, int], tuple[list[int], torch.Tensor]] = {}
        self.connector: Any = None

        kernel_block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        self.kv_caches: dict[str, torch.Tensor] = allocate_kv_cache(
            kv_cache_config, torch.device("cpu"), layout, kernel_block_sizes)
        names = tiny_models.model_shape(mode).layer_names
        self.layers: list[_Layer] = []
        for gid, group in enumerate(kv_cache_config.kv_cache_groups):
            for name in group.layer_names:
                spec = group.kv_cache_spec
                spec = getattr(spec, "kv_cache_specs", {}).get(name, spec)  # UniformTypeKVCacheSpecs
                t = self.kv_caches[name]
                ints = None
                ratio, kbs, hoff, window = 1, spec.block_size, 0, None
                state = None
                if isinstance(spec, MambaSpec):
                    state = t.reshape(t.shape[0], -1).view(torch.int64)  # the page, as int64 words
                    assert state.data_ptr() == t.data_ptr() and state.stride(0) * 8 == t.stride(0) * t.element_size()
                if isinstance(spec, AttentionSpec):
                    ints = t.view(_INT_OF_SIZE[t.element_size()])
                    ratio = t.shape[0] // kv_cache_config.num_blocks
                    kbs = spec.block_size // ratio
                    assert t.shape[2] == kbs, (name, tuple(t.shape), kbs)
                    if not isinstance(spec, MLAAttentionSpec):
                        hoff = (tp_rank % tp_size) * t.shape[1]
                    window = getattr(spec, "sliding_window", None)
                self.layers.append(_Layer(name, names.index(name), gid, spec, t, ints, ratio, kbs, hoff, window,
                                          state))
        self.layers.sort(key=lambda lay: lay.index)
        self.group_block_size = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        # What a model's attention layers expose through the forward context.
        sfc = vllm_config.compilation_config.static_forward_context
        for name, t in self.kv_caches.items():
            sfc[name] = _FakeLayer(name, t)

        if vllm_config.kv_transfer_config is not None:
            with set_current_vllm_config(vllm_config):
                self.connector = KVConnectorFactory.create_connector(
                    vllm_config, KVConnectorRole.WORKER, kv_cache_config)
                with self._as_global_agent():
                    self.connector.register_kv_caches(self.kv_caches)
                    from vllm.distributed.kv_transfer.kv_connector.utils import copy_kv_blocks
                    self.connector.set_host_xfer_buffer_ops(copy_kv_blocks)

    # -- helpers ------------------------------------------------------------

    @contextlib.contextmanager
    def _as_global_agent(self) -> Iterator[None]:
        """Install this worker's connector as vLLM's global KV transfer agent."""
        prev = kv_transfer_state._KV_CONNECTOR_AGENT
        kv_transfer_state._KV_CONNECTOR_AGENT = self.connector
        try:
            yield
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = prev

    def _layers_of_group(self, gid: int) -> list[_Layer]:
        return [lay for lay in self.layers if lay.group_id == gid and lay.attention]

    def _state_layers(self, gid: int | None = None) -> list[_Layer]:
        return [lay for lay in self.layers if lay.state is not None and (gid is None or lay.group_id == gid)]

    def check_state(self, layer: _Layer, req_id: str, block_ids: list[int], n: int, what: str,
                    sink: list[tuple[str, str]] | None = None) -> None:
        """The Mamba state after ``n`` tokens must be in block ``(n - 1) // block_size`` of the table."""
        idx = (n - 1) // self.group_block_size[layer.group_id]
        if n <= 0 or idx >= len(block_ids) or block_ids[idx] == self.null_block_id:
            text = f"rank{self.tp_rank} {what}: req {req_id} layer {layer.name}: no block holds the state after {n}"
            (self.mismatches.append(text) if sink is None else sink.append((req_id, text)))
            return
        blk = block_ids[idx]
        if blk in self._suspect:
            return
        got = layer.state[blk]
        self.verified_bytes += got.numel() * 8
        self.verified_state_bytes += got.numel() * 8
        if torch.equal(got, layer.state_values(self.book.state_key(req_id, n))):
            return
        kind = "poison (never loaded)" if bool((got == _poison_value(8)).all()) else (
            "zeros" if bool((got == 0).all()) else "wrong bytes (another prefix/length/layer)")
        text = (f"rank{self.tp_rank} {what}: req {req_id} layer {layer.name} Mamba state after {n} tokens "
                f"block {blk}: {kind}")
        (self.mismatches.append(text) if sink is None else sink.append((req_id, text)))

    def _mamba_plan(self, batch: list[tuple[str, int, int]]) -> list[tuple[str, int, int, int, int]]:
        """preprocess_mamba (align mode): (req_id, start, end, prev block index, current block index).

        The running state lives in the block of the last scheduled token; a new
        (or resumed) request starts from block ``(start - 1) // block_size`` (-1:
        no state), which holds a prefix-cache or connector hit's state."""
        layers = self._state_layers()
        if not layers:
            return []
        bs = self.group_block_size[layers[0].group_id]
        plan = []
        for rid, start, count in batch:
            prev = self._mamba_idx.get(rid, (start - 1) // bs)
            curr = -(-(start + count) // bs) - 1
            self._mamba_idx[rid] = curr
            plan.append((rid, start, start + count, prev, curr))
        return plan

    def _mamba_forward(self, layer: _Layer, plan: list[tuple[str, int, int, int, int]],
                       reads: list[tuple[str, str]]) -> None:
        """Copy the state forward across a block boundary, check it, write the state after the step."""
        for rid, start, end, prev, curr in plan:
            table = self.requests[rid].block_ids[layer.group_id]
            if curr >= len(table) or table[curr] == self.null_block_id:
                self.mismatches.append(f"rank{self.tp_rank}: Mamba state of {rid} at block index {curr}: "
                                       f"no block ({len(table)} in the table)")
                continue
            if 0 <= prev < len(table) and prev != curr and table[prev] != self.null_block_id:
                layer.state[table[curr]] = layer.state[table[prev]]
            if start > 0 and self.verify == "all":
                tmp = list(table)
                tmp[(start - 1) // self.group_block_size[layer.group_id]] = table[curr]
                self.check_state(layer, rid, tmp, start, "Mamba state read", sink=reads)
            layer.state[table[curr]] = layer.state_values(self.book.state_key(rid, end))
            self._suspect.pop(table[curr], None)

    def _slots(self, gid: int, block_ids: list[int], positions: torch.Tensor,
               skip_null: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions, block ids, offsets) of ``positions`` through one group's block table."""
        bs = self.group_block_size[gid]
        idx = positions // bs
        ok = idx < len(block_ids)
        if not bool(ok.all()):
            self.mismatches.append(f"rank{self.tp_rank}: block table of group {gid} too short "
                                   f"({len(block_ids)} blocks) for position {int(positions[~ok][0])}")
            positions, idx = positions[ok], idx[ok]
        table = torch.tensor(block_ids, dtype=torch.int64) if block_ids else torch.empty(0, dtype=torch.int64)
        blk = table[idx]
        if skip_null:
            keep = blk != self.null_block_id
            positions, blk = positions[keep], blk[keep]
        return positions, blk, positions % bs

    def _write(self, layer: _Layer, rows: _Rows) -> None:
        if not rows.req_ids:
            return
        blk, off = torch.cat(rows.blocks), torch.cat(rows.offsets)
        kb, ko = layer.slot_index(blk, off)
        layer.ints[kb, :, ko, :] = rows.expected(self, layer)
        if self._suspect:
            for b, o in zip(blk.tolist(), off.tolist()):
                s = self._suspect.get(b)
                if s is not None:
                    s.discard(o)
                    if not s:
                        del self._suspect[b]

    def check_rows(self, layer: _Layer, rows: _Rows, what: str, sink: list[tuple[str, str]] | None = None) -> None:
        """Compare slots with the expected bytes; failures go to ``sink`` (req_id, text) or mismatches."""
        if not rows.req_ids:
            return
        pos, blk, off = (torch.cat(x) for x in (rows.positions, rows.blocks, rows.offsets))
        owner = torch.cat([torch.full((p.numel(),), i, dtype=torch.int64) for i, p in enumerate(rows.positions)])
        want = rows.expected(self, layer)
        if self._suspect:
            keep = torch.tensor([o not in self._suspect.get(b, ()) for b, o in zip(blk.tolist(), off.tolist())],
                                dtype=torch.bool)
            pos, blk, off, want, owner = pos[keep], blk[keep], off[keep], want[keep], owner[keep]
            if pos.numel() == 0:
                return
        kb, ko = layer.slot_index(blk, off)
        got = layer.ints[kb, :, ko, :]
        self.verified_bytes += got.numel() * got.element_size()
        bad = (got != want).flatten(1).any(dim=1)
        if not bool(bad.any()):
            return
        poison = _poison_value(got.element_size())
        nbad = int(bad.sum())
        for n, i in enumerate(torch.nonzero(bad).flatten().tolist()):
            if n >= _MAX_REPORTS_PER_CHECK:
                break
            rid = rows.req_ids[int(owner[i])]
            kind = "poison (never loaded)" if bool((got[i] == poison).all()) else (
                "zeros" if bool((got[i] == 0).all()) else "wrong bytes (other prefix/position/layer)")
            text = (f"rank{self.tp_rank} {what}: req {rid} layer {layer.name} pos {int(pos[i])} "
                    f"block {int(blk[i])} off {int(off[i])}: {kind}; {nbad} bad slots in this check")
            if sink is None:
                self.mismatches.append(text)
            else:
                sink.append((rid, text))

    def poison(self, plan: PoisonPlan) -> None:
        """Fill the slots of positions [start, end) of each planned load with POISON_BYTE."""
        for req_id, start, end, block_ids in plan:
            positions = torch.arange(start, end, dtype=torch.int64)
            for gid, table in enumerate(block_ids):
                for layer in self._state_layers(gid):
                    _, blk, _ = self._slots(gid, table, positions, skip_null=True)
                    for b in set(blk.tolist()):
                        layer.state[b] = _poison_value(8)
                layers = self._layers_of_group(gid)
                if not layers:
                    continue
                pos, blk, off = self._slots(gid, table, positions, skip_null=True)
                for b in set(blk.tolist()):
                    self._suspect.pop(b, None)
                for layer in layers:
                    kb, ko = layer.slot_index(blk, off)
                    layer.ints[kb, :, ko, :] = _poison_value(layer.ints.element_size())

    def expected(self, layer: _Layer, req_id: str, positions: torch.Tensor) -> torch.Tensor:
        """Expected contents (n, H, C) of ``positions`` of ``req_id`` in ``layer`` (cached, grown by doubling)."""
        owner = self.book._digests[req_id]
        key = (req_id, layer.index)
        entry = self._vcache.get(key)
        have = entry[1] if entry is not None and entry[0] is owner else None
        need = int(positions.max()) + 1 if positions.numel() else 0
        if have is None or have.shape[0] < need:
            n0 = 0 if have is None else have.shape[0]
            n1 = max(need, 2 * n0, 64)
            more = layer.values(self.book.keys(req_id, torch.arange(n0, n1, dtype=torch.int64)))
            have = more if have is None else torch.cat([have, more])
            self._vcache[key] = (owner, have)
        return have[positions]

    def expected_rows(self, gid: int, req_id: str, block_ids: list[int], lo: int, hi: int,
                      into: _Rows | None = None) -> _Rows:
        """Slots (with expected keys) of positions [lo, hi) of a request through one group's table."""
        rows = _Rows() if into is None else into
        if hi > lo:
            pos, blk, off = self._slots(gid, block_ids, torch.arange(lo, hi, dtype=torch.int64), skip_null=True)
            rows.add(req_id, pos, blk, off)
        return rows

    # -- the step -----------------------------------------------------------

    def _update_states(self, so: SchedulerOutput) -> None:
        for rid in (*so.finished_req_ids, *(so.preempted_req_ids or ()),
                    *so.scheduled_cached_reqs.resumed_req_ids, *(r.req_id for r in so.scheduled_new_reqs)):
            self._mamba_idx.pop(rid, None)  # cleanup_mamba_state_idx (a v2 resume arrives as new)
        for rid in so.finished_req_ids:
            self.requests.pop(rid, None)
            self.book.drop(rid)
            for layer in self.layers:
                self._vcache.pop((rid, layer.index), None)
        if so.new_block_ids_to_zero:
            ids = torch.tensor(so.new_block_ids_to_zero, dtype=torch.int64)
            for layer in self.layers:
                if layer.attention:
                    kb = (ids[:, None] * layer.ratio + torch.arange(layer.ratio)).flatten()
                    layer.ints[kb] = 0
                else:
                    layer.tensor[ids] = 0
        if so.kv_cache_block_copies:
            copy_kv_cache_blocks_inplace(self.kv_caches.values(), self.kv_cache_config.num_blocks,
                                         so.kv_cache_block_copies)
        for nr in so.scheduled_new_reqs:
            self.book.set_prompt(nr.req_id, nr.prompt_token_ids or [])
            n = len(nr.prompt_token_ids or [])
            # the v2 model runner resumes a preempted request as a new one: prompt + generated
            known = len(nr.prefill_token_ids) if nr.prefill_token_ids is not None else n
            self.requests[nr.req_id] = _ReqState([list(b) for b in nr.block_ids], n, known)
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            st = self.requests[rid]
            new = cr.new_block_ids[i]
            num_tokens = st.num_prompt_tokens + cr.num_output_tokens[i]
            if rid in cr.resumed_req_ids:
                st.block_ids = [list(b) for b in new] if new is not None else [[] for _ in st.block_ids]
                st.num_tokens = num_tokens
            else:
                # outputs discarded by a sync-KV-load failure: align (GPUModelRunner._update_states)
                st.num_tokens = min(st.num_tokens, num_tokens)
                if new is not None:
                    for g, b in enumerate(new):
                        st.block_ids[g].extend(b)
            if rid in cr.all_token_ids:
                toks = cr.all_token_ids[rid]
                for p in range(len(toks)):
                    if toks[p] != self.book.token(rid, p):
                        self.mismatches.append(f"rank{self.tp_rank}: scheduler token {toks[p]} at {rid}:{p} "
                                               f"!= harness token {self.book.token(rid, p)}")
                        break

    def _scheduled(self, so: SchedulerOutput) -> list[tuple[str, int, int]]:
        """(req_id, start, count) per scheduled request, in batch order."""
        starts = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        cr = so.scheduled_cached_reqs
        starts.update(zip(cr.req_ids, cr.num_computed_tokens))
        return [(rid, starts[rid], n) for rid, n in so.num_scheduled_tokens.items()]

    def _forward(self, batch: list[tuple[str, int, int]]) -> list[tuple[str, str]]:
        conn = self.connector
        reads: list[tuple[str, str]] = []
        per_req = []
        for rid, start, count in batch:
            per_req.append((rid, start, torch.arange(start, start + count, dtype=torch.int64)))
        mplan = self._mamba_plan(batch)
        for layer in self.layers:
            if not layer.attention:
                if conn is not None:
                    conn.wait_for_layer_load(layer.name)
                if layer.state is not None:
                    self._mamba_forward(layer, mplan, reads)
                if conn is not None:
                    conn.save_kv_layer(layer.name, layer.tensor, None)
                continue
            rows = _Rows()
            for rid, start, new_pos in per_req:
                pos, blk, off = self._slots(layer.group_id, self.requests[rid].block_ids[layer.group_id],
                                            new_pos, skip_null=False)
                nul = blk == self.null_block_id
                if bool(nul.any()):
                    self.mismatches.append(f"rank{self.tp_rank}: forward of {rid} pos {int(pos[nul][0])} "
                                           f"maps to the null block in {layer.name}")
                keep = ~nul
                rows.add(rid, pos[keep], blk[keep], off[keep])
            self._write(layer, rows)  # CPU_ATTN / FlashAttention: KV update before the attention op
            if conn is not None:
                conn.wait_for_layer_load(layer.name)
            if self.verify == "all":
                rows = _Rows()
                for rid, start, _ in per_req:
                    lo = 0 if layer.sliding_window is None else max(0, start - layer.sliding_window + 1)
                    self.expected_rows(layer.group_id, rid, self.requests[rid].block_ids[layer.group_id],
                                       lo, start, into=rows)
                self.check_rows(layer, rows, "attention read", sink=reads)
            if conn is not None:
                conn.save_kv_layer(layer.name, layer.tensor, None)
        return reads

    def execute(self, so: SchedulerOutput, poison_plan: PoisonPlan | None = None) -> ModelRunnerOutput:
        """Run one step as GPUModelRunner.execute_model + sample_tokens would."""
        self.steps += 1
        conn = self.connector
        with set_current_vllm_config(self.vllm_config), self._as_global_agent():
            if conn is not None:
                assert so.kv_connector_metadata is not None
                conn.handle_preemptions(so.kv_connector_metadata)
            self._update_states(so)
            if poison_plan:
                self.poison(poison_plan)
            batch = self._scheduled(so)
            if so.total_num_scheduled_tokens == 0 and conn is None:
                return EMPTY_MODEL_RUNNER_OUTPUT
            kv_out: KVConnectorOutput | None = None
            reads: list[tuple[str, str]] = []
            with set_forward_context(None, self.vllm_config):
                if conn is not None:
                    kv_out = KVConnectorOutput()
                    conn.bind_connector_metadata(so.kv_connector_metadata)
                    if so.has_sync_kv_loads:
                        conn.start_load_kv(get_forward_context())
                try:
                    if so.total_num_scheduled_tokens > 0:
                        reads = self._forward(batch)
                finally:
                    if conn is not None:
                        assert kv_out is not None
                        if not so.has_sync_kv_loads:
                            conn.start_load_kv(get_forward_context())
                        conn.wait_for_save()
                        res = conn.get_transfer_results(so.finished_req_ids)
                        kv_out.finished_sending = res.finished_sending
                        kv_out.finished_recving = res.finished_recving
                        kv_out.failed_recving = res.failed_recving
                        kv_out.invalid_block_ids = conn.get_block_ids_with_load_errors()
                        kv_out.kv_connector_stats = conn.get_kv_connector_stats()
                        kv_out.kv_cache_events = conn.get_kv_connector_kv_cache_events()
                        kv_out.kv_connector_worker_meta = conn.build_connector_worker_meta()
                        conn.clear_connector_metadata()
            invalid = set(kv_out.invalid_block_ids) if kv_out is not None else set()
            if invalid:
                for b in invalid:
                    self._suspect[b] = set(range(max(self.group_block_size)))
                excused = {rid for rid, st in self.requests.items()
                           if any(b in invalid for table in st.block_ids for b in table)}
            else:
                excused = set()
            self.mismatches.extend(text for rid, text in reads if rid not in excused)
            if so.total_num_scheduled_tokens == 0:
                return ModelRunnerOutput.with_kv_conn_output_only(kv_out)
            req_ids = [rid for rid, _, _ in batch]
            sampled: list[list[int]] = []
            for rid, start, count in batch:
                st = self.requests[rid]
                end = start + count
                if end >= st.num_tokens:
                    sampled.append([self.book.token(rid, end)])
                    st.num_tokens = end + 1
                else:
                    sampled.append([])  # a prefill chunk: the sampled token is discarded
            return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                     sampled_token_ids=sampled, kv_connector_output=kv_out)

    def take_mismatches(self) -> list[str]:
        out, self.mismatches = self.mismatches, []
        return out

    def shutdown(self) -> None:
        if self.connector is not None:
            with self._as_global_agent():
                self.connector.shutdown()
            self.connector = None


class _FakeLayer:
    """Stands in for an Attention module in ``static_forward_context``."""

    def __init__(self, name: str, kv_cache: torch.Tensor):
        self.layer_name = name
        self.kv_cache = kv_cache


# ---------------------------------------------------------------------------
# Configuration shared by both halves
# ---------------------------------------------------------------------------

@dataclass
class _Plan:
    vllm_config: VllmConfig
    worker_kv_cache_configs: list[KVCacheConfig]
    scheduler_kv_cache_config: KVCacheConfig
    layout: Any
    scheduler_block_size: int
    hash_block_size: int


def _plan(kv_transfer_config: dict | None, *, mode: str, num_blocks: int, block_size: int, max_num_seqs: int,
          max_num_batched_tokens: int, max_model_len: int, async_scheduling: bool, tp_size: int,
          tp_rank: int, kv_events: bool = False, pp_size: int = 1, dtype: str = "float32",
          model_path: str | None = None) -> _Plan:
    """VllmConfig + KV cache configs, computed as EngineCore._initialize_kv_caches does."""
    vc = tiny_models.build_vllm_config(
        kv_transfer_config, mode=mode, block_size=block_size, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
        async_scheduling=async_scheduling, tp_size=tp_size, tp_rank=tp_rank, kv_events=kv_events, pp_size=pp_size,
        dtype=dtype, model_path=model_path)
    vc.cache_config.num_gpu_blocks_override = num_blocks
    register_all_kvcache_specs(vc)
    world = tp_size * pp_size
    all_specs = [tiny_models.kv_cache_specs(mode, block_size, tp_size, pp_rank=r // tp_size, pp_size=pp_size,
                                            dtype=dtype)
                 for r in range(world)]
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    supported = [[lay.name for lay in CPUAttentionBackend.supported_kv_cache_layouts()]] * world
    layout = resolve_kv_cache_layout(vc, supported, [s for w in all_specs for s in w.values()])
    groups = get_global_kv_cache_groups(vc, all_specs)
    page = max(sum(s.page_size_bytes for s in w.values()) for w in all_specs)
    need = -(-max_model_len // block_size) + 1
    mem = page * max(num_blocks, need) * 2
    cfgs = get_kv_cache_configs(vc, all_specs, [mem] * world, groups)
    for c in cfgs:
        c.kv_cache_layout = vc.cache_config.kv_cache_layout
    scfg = generate_scheduler_kv_cache_config(cfgs)
    vc.cache_config.num_gpu_blocks = scfg.num_blocks
    participating = [g.kv_cache_spec.block_size for g in scfg.kv_cache_groups if g.kv_cache_spec.prefix_cacheable]
    vc.cache_config.block_size = min(participating or [g.kv_cache_spec.block_size for g in scfg.kv_cache_groups])
    update_kv_cache_capacity(vc, scfg)
    vc.validate_block_size()
    sbs, hbs = resolve_kv_cache_block_sizes(scfg, vc)
    align = resolve_cache_hit_alignment_tokens(scfg, vc, sbs, hbs)
    for c in (*cfgs, scfg):
        c.hash_block_size = hbs
        c.cache_hit_alignment_tokens = align
    return _Plan(vc, cfgs, scfg, layout, sbs, hbs)


_dist_state: dict[str, Any] = {"key": None, "refs": 0}
_DIST_TIMEOUT_S = 120


def _dist_acquire(vc: VllmConfig, tp_size: int, tp_rank: int, init_method: str | None, pp_size: int = 1) -> None:
    """init_distributed_environment (gloo) + model parallel groups, once per process.

    ``tp_rank`` is the rank in the world of ``tp_size * pp_size`` ranks."""
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment
    key = (tp_size, tp_rank, pp_size)
    if _dist_state["refs"] > 0:
        if _dist_state["key"] != key:
            raise RuntimeError(f"this process already holds a torch.distributed world {_dist_state['key']}; "
                               f"cannot also be (tp_size, tp_rank)={key}")
        _dist_state["refs"] += 1
        return
    if init_method is None:
        if tp_size * pp_size != 1:
            raise ValueError("tp_size * pp_size > 1 needs a shared dist_init_method")
        init_method = "file://" + tempfile.mktemp(prefix="kvpool-dist-")
    if _dist_state["key"] is not None:
        if _dist_state["key"] == key:  # a TP-1 world kept from an earlier engine
            _dist_state["refs"] = 1
            return
        _dist_destroy()
    hook = sys.excepthook  # torch chains a "[rankN]:" excepthook on every init; keep ours
    try:
        with set_current_vllm_config(vc):
            init_distributed_environment(tp_size * pp_size, tp_rank, init_method, tp_rank, "gloo",
                                         timedelta(seconds=_DIST_TIMEOUT_S))
            ensure_model_parallel_initialized(tp_size, pp_size)
    finally:
        sys.excepthook = hook
    _dist_state.update(key=key, refs=1)


def _dist_destroy() -> None:
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel
    destroy_model_parallel()
    destroy_distributed_environment()
    _dist_state["key"] = None


def _dist_release() -> None:
    """Drop one reference; a TP>1 world is destroyed with its last user, a TP-1 world is kept."""
    if _dist_state["refs"] <= 0:
        return
    _dist_state["refs"] -= 1
    if _dist_state["refs"] == 0 and _dist_state["key"] != (1, 0, 1):
        _dist_destroy()


def _build_worker(plan: _Plan, *, mode: str, tp_size: int, tp_rank: int, init_method: str | None,
                  engine_id: str | None, verify: str, pp_size: int = 1) -> Worker:
    vc = copy.deepcopy(plan.vllm_config)  # a worker process has its own copy
    vc.parallel_config.rank = tp_rank
    if vc.kv_transfer_config is not None and engine_id is not None:
        vc.kv_transfer_config.engine_id = engine_id
    _dist_acquire(vc, tp_size, tp_rank, init_method, pp_size)
    try:
        if vc.kv_transfer_config is not None and vc.kv_transfer_config.is_kv_transfer_instance:
            from vllm.distributed.parallel_state import get_tp_group
            vc.kv_transfer_config.engine_id = get_tp_group().broadcast_object(vc.kv_transfer_config.engine_id, src=0)
        return Worker(vc, plan.worker_kv_cache_configs[tp_rank], plan.layout, mode=mode, tp_rank=tp_rank,
                      verify=verify, tp_size=tp_size)
    except BaseException:
        _dist_release()
        raise


def make_worker(kv_transfer_config: dict | None, *, mode: str = "full", num_blocks: int = 128,
                block_size: int = 16, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                max_model_len: int = -1, async_scheduling: bool = False, tp_size: int = 1, tp_rank: int = 0,
                dist_init_method: str | None = None, engine_id: str | None = None,
                verify: str = "all", kv_events: bool = False, pp_size: int = 1, dtype: str = "float32",
                model_path: str | None = None) -> Worker:
    """A worker-only half (one TP rank), for a process fed pickled SchedulerOutputs.

    Pass the same configuration as the scheduler's ``make_engine`` call; the KV
    cache plan is recomputed here and is identical (vLLM's planning is
    deterministic). ``dist_init_method`` (e.g. ``file:///tmp/x``) is shared by all
    ranks; ``engine_id`` is the scheduler's ``kv_transfer_config.engine_id``.
    The caller must ``shutdown_worker(w)`` (or ``w.shutdown()`` + leave the
    process) when done.
    """
    _init_none_hash()
    plan = _plan(kv_transfer_config, mode=mode, num_blocks=num_blocks, block_size=block_size,
                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                 max_model_len=max_model_len, async_scheduling=async_scheduling, tp_size=tp_size, tp_rank=tp_rank,
                 kv_events=kv_events, pp_size=pp_size, dtype=dtype, model_path=model_path)
    return _build_worker(plan, mode=mode, tp_size=tp_size, tp_rank=tp_rank, init_method=dist_init_method,
                         engine_id=engine_id, verify=verify, pp_size=pp_size)


def shutdown_worker(w: Worker) -> None:
    """Connector shutdown plus release of this process's distributed world."""
    try:
        w.shutdown()
    finally:
        _dist_release()


def serve_worker(conn: Any, worker_kwargs: dict) -> None:
    """Serve one worker rank over ``conn`` (a ``multiprocessing.connection.Connection``).

    Builds ``make_worker(**worker_kwargs)``, answers ``("ready", num_blocks)``, then
    (everything pickled with ``send_bytes``): ``("step", so_bytes, poison_plan)`` ->
    ``("ok", mro_bytes, new_mismatches, verified_bytes)``; ``("shutdown",)`` ->
    ``("ok",)`` and return. Any exception -> ``("error", traceback_text)`` and return.
    A test may run this in any process it starts itself; ``Engine`` uses ``_child_main``.
    """
    w: Worker | None = None
    try:
        w = make_worker(**worker_kwargs)
        conn.send_bytes(pickle.dumps(("ready", w.kv_cache_config.num_blocks)))
        while True:
            msg = pickle.loads(conn.recv_bytes())
            if msg[0] == "step":
                mro = w.execute(pickle.loads(msg[1]), msg[2])
                conn.send_bytes(pickle.dumps(("ok", pickle.dumps(mro), w.take_mismatches(), w.verified_bytes)))
            elif msg[0] == "shutdown":
                shutdown_worker(w)
                w = None
                conn.send_bytes(pickle.dumps(("ok",)))
                return
            else:
                raise ValueError(f"unknown message {msg[0]!r}")
    except BaseException:
        with contextlib.suppress(Exception):
            conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        if w is not None:
            with contextlib.suppress(Exception):
                shutdown_worker(w)


def _child_main(fd: int) -> None:
    """Entry of a worker process started by ``_RemoteWorker``: ``(sys.path, kwargs)`` arrive first."""
    from multiprocessing.connection import Connection
    conn = Connection(fd)
    try:
        path, kwargs = pickle.loads(conn.recv_bytes())
        for p in reversed(path):
            if p not in sys.path:
                sys.path.insert(0, p)
        serve_worker(conn, kwargs)
    finally:
        conn.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)  # the connector is shut down; skip the slow interpreter teardown of torch/vLLM


class _RemoteWorker:
    """A worker rank in a child process (``python -c 'engine._child_main(fd)'``) over a socket pair.

    A plain subprocess rather than multiprocessing's spawn, so the parent's
    ``__main__`` is never re-imported in the child.
    """

    def __init__(self, worker_kwargs: dict):
        import socket
        import subprocess
        from multiprocessing.connection import Connection
        parent_sock, child_sock = socket.socketpair()
        self.rank = worker_kwargs.get("tp_rank", 0)
        code = f"import sys; sys.path.insert(0, {_HERE!r}); import engine; engine._child_main({child_sock.fileno()})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child_sock.fileno(),))
        child_sock.close()
        self.conn = Connection(parent_sock.detach())
        self.conn.send_bytes(pickle.dumps((list(sys.path), worker_kwargs)))

    def _recv(self, timeout: float = 300.0) -> tuple:
        deadline = time.monotonic() + timeout
        while not self.conn.poll(0.05):
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker rank {self.rank} exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker rank {self.rank} did not answer in {timeout}s")
        reply = pickle.loads(self.conn.recv_bytes())
        if reply[0] == "error":
            raise RuntimeError(f"worker rank {self.rank} failed:\n{reply[1]}")
        return reply

    def wait_ready(self) -> int:
        return self._recv()[1]

    def send_step(self, so_bytes: bytes, plan: PoisonPlan) -> None:
        self.conn.send_bytes(pickle.dumps(("step", so_bytes, plan)))

    def recv_step(self) -> tuple[ModelRunnerOutput, list[str], int]:
        _, mro_bytes, mism, vbytes = self._recv()
        return pickle.loads(mro_bytes), mism, vbytes

    def shutdown(self) -> None:
        try:
            if self.proc.poll() is None:
                self.conn.send_bytes(pickle.dumps(("shutdown",)))
                self._recv(timeout=60)
        finally:
            try:
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.conn.close()


# ---------------------------------------------------------------------------
# The engine: scheduler + workers
# ---------------------------------------------------------------------------

@dataclass
class StepResult:
    """What one ``Engine.step()`` did.

    ``scheduler_output``: the batch scheduled by this call (None if none).
    ``updated_output``: the SchedulerOutput whose model output was applied by
    ``update_from_output`` in this call (in async mode the one of an earlier call).
    ``model_runner_output``: the aggregated output applied in this call.
    """

    step: int
    scheduler_output: SchedulerOutput | None = None
    updated_output: SchedulerOutput | None = None
    model_runner_output: ModelRunnerOutput | None = None
    engine_core_outputs: dict | None = None
    num_scheduled_tokens: int = 0
    finished_recving: set[str] = field(default_factory=set)
    finished_sending: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)
    finished_requests: set[str] = field(default_factory=set)
    new_mismatches: int = 0

    @property
    def idle(self) -> bool:
        return self.scheduler_output is None and self.updated_output is None


class Engine:
    """vLLM's scheduler plus the workers of all TP ranks (local and/or spawned).

    Public state (read it, don't write it):
    ``scheduler``, ``vllm_config``, ``kv_cache_config`` (scheduler's),
    ``worker`` (the local rank-0 Worker or None), ``mismatches`` (list[str]),
    ``verified_bytes``, ``loaded_tokens`` (sum of ``num_external_tokens`` the
    scheduler passed to ``update_state_after_alloc``), ``external_tokens``
    (req_id -> those numbers, one per admission), ``prefill_stats`` (req_id ->
    vLLM PrefillStats of its first output), ``outputs`` (req_id -> generated
    tokens), ``output_mismatches`` (outputs vLLM delivered that are not the token
    the fake model sampled for that position: a scheduler-side inconsistency,
    kept apart from the KV ``mismatches``), ``finished_req_ids_seen`` (every id in a ``SchedulerOutput.finished_req_ids``
    or with a finish reason in an output), ``preempted_req_ids_seen`` /
    ``resumed_req_ids_seen`` (requests vLLM preempted / resumed), ``stats`` (KVConnectorStats per step from
    the workers, aggregated), ``worker_events`` (KVConnectorKVEvents from the
    workers), ``events`` (every KV cache event the scheduler published: its
    connector's ``take_events()`` and the block pool's), ``scheduler_stats``
    (vLLM SchedulerStats per update; ``kv_connector_stats`` and
    ``connector_prefix_cache_stats`` are in there), ``timings``
    (``{"schedule": [...], "update_from_output": [...], "execute": [...],
    "verify": [...]}`` seconds per call).
    """

    def __init__(self, plan: _Plan, *, mode: str, tp_size: int, tp_rank: int, worker: bool,
                 pickle_io: bool, verify: str, make_kwargs: dict, pp_size: int = 1):
        if tp_rank != 0:
            raise ValueError("the scheduler lives on rank 0; use make_worker for other ranks")
        _init_none_hash()
        self.vllm_config = plan.vllm_config
        self.kv_cache_config = plan.scheduler_kv_cache_config
        self.mode = mode
        self.tp_size = tp_size
        self.pp_size = pp_size
        world = tp_size * pp_size
        self.pickle_io = pickle_io
        self.verify = verify
        self.hash_block_size = plan.hash_block_size
        self.block_size = plan.scheduler_block_size
        self.async_scheduling = bool(self.vllm_config.scheduler_config.async_scheduling)
        self.mismatches: list[str] = []
        self.loaded_tokens = 0
        self.external_tokens: dict[str, list[int]] = {}
        self.prefill_stats: dict[str, Any] = {}
        self.outputs: dict[str, list[int]] = {}
        self.output_mismatches: list[str] = []
        self._prompt_len: dict[str, int] = {}
        self.finished_req_ids_seen: set[str] = set()
        self.preempted_req_ids_seen: set[str] = set()
        self.resumed_req_ids_seen: set[str] = set()
        self.stats: list[Any] = []
        self.worker_events: list[Any] = []
        self.scheduler_stats: list[Any] = []
        self.events: list[Any] = []
        self.timings: dict[str, list[float]] = {"schedule": [], "update_from_output": [], "execute": [], "verify": []}
        self.step_count = 0
        self._batch_queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
        self._pending_loads: list[tuple[str, int]] = []
        self._sync_loads: dict[str, tuple[int, int]] = {}  # req_id -> loaded range, scheduled in a step
        self._verified_remote = 0
        self.verified_by_rank: dict[int, int] = {}  # rank -> bytes its worker checked (spawned ranks)
        self._closed = False
        self.book = TokenBook(plan.hash_block_size)

        kvt = self.vllm_config.kv_transfer_config
        engine_id = kvt.engine_id if kvt is not None else None
        init_method = None
        self._dist_file: str | None = None
        if world > 1 or not worker:
            self._dist_file = tempfile.mktemp(prefix="kvpool-dist-")
            init_method = "file://" + self._dist_file
        self.remote: list[_RemoteWorker] = []
        self.worker: Worker | None = None
        try:
            first_remote = 1 if worker else 0
            for r in range(first_remote, world):
                kw = dict(make_kwargs, tp_rank=r, dist_init_method=init_method, engine_id=engine_id, verify=verify)
                self.remote.append(_RemoteWorker(kw))
            if worker:  # the local rank-0 worker joins the world the others are waiting in
                self.worker = _build_worker(plan, mode=mode, tp_size=tp_size, tp_rank=0,
                                            init_method=init_method, engine_id=engine_id, verify=verify,
                                            pp_size=pp_size)
                self.book = self.worker.book
            for rw in self.remote:
                nb = rw.wait_ready()
                if nb != self.kv_cache_config.num_blocks:
                    raise RuntimeError(f"rank {rw.rank} planned {nb} blocks, scheduler {self.kv_cache_config.num_blocks}")

            with set_current_vllm_config(self.vllm_config):
                sched_cls = self.vllm_config.scheduler_config.get_scheduler_cls()
                self.scheduler = sched_cls(
                    vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
                    structured_output_manager=StructuredOutputManager(self.vllm_config),
                    include_finished_set=False, log_stats=True,
                    block_size=plan.scheduler_block_size, hash_block_size=plan.hash_block_size)
            self.connector = self.scheduler.connector
            self.aggregator = KVOutputAggregator.from_connector(self.connector, world) if self.connector else None
            self._observe_scheduler()
        except BaseException:
            self._teardown_workers()
            raise

    # -- observation hooks (read-only wrappers) -------------------------------

    def _observe_scheduler(self) -> None:
        conn = self.connector
        if conn is not None:
            orig = conn.update_state_after_alloc

            def update_state_after_alloc(request: Request, blocks: Any, num_external_tokens: int) -> Any:
                if num_external_tokens > 0:
                    self._pending_loads.append((request.request_id, num_external_tokens))
                    self.loaded_tokens += num_external_tokens
                    self.external_tokens.setdefault(request.request_id, []).append(num_external_tokens)
                return orig(request, blocks, num_external_tokens)

            conn.update_state_after_alloc = update_state_after_alloc  # instance attribute: observes, forwards
        pub = self.scheduler.kv_event_publisher
        orig_pub = pub.publish

        def publish(batch: Any) -> None:
            self.events.extend(getattr(batch, "events", ()) or ())
            return orig_pub(batch)

        pub.publish = publish

    # -- requests -------------------------------------------------------------

    def add_request(self, req_id: str, prompt_token_ids: list[int], max_tokens: int, *,
                    kv_transfer_params: dict | None = None, cache_salt: str | None = None) -> None:
        """Queue a request generating exactly ``max_tokens`` tokens (ignore_eos)."""
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra)
        sp.update_from_generation_config({}, tiny_models.TINY_LLAMA["eos_token_id"])
        req = Request(request_id=req_id, prompt_token_ids=list(prompt_token_ids), sampling_params=sp,
                      pooling_params=None, cache_salt=cache_salt,
                      block_hasher=get_request_block_hasher(self.hash_block_size, sha256))
        self.book.set_prompt(req_id, prompt_token_ids)
        self.outputs[req_id] = []
        self._prompt_len[req_id] = len(prompt_token_ids)
        self.scheduler.add_request(req)

    def abort(self, req_id: str) -> None:
        """Finish a request as aborted (vLLM's ``finish_requests``)."""
        self.scheduler.finish_requests({req_id}, RequestStatus.FINISHED_ABORTED)

    # -- one step -------------------------------------------------------------

    def _take_poison_plan(self, so: SchedulerOutput) -> PoisonPlan:
        plan: PoisonPlan = []
        pending, self._pending_loads = self._pending_loads, []
        for rid, ext in pending:
            req = self.scheduler.requests.get(rid)
            if req is None:
                continue
            end = req.num_computed_tokens - so.num_scheduled_tokens.get(rid, 0)
            start = max(0, end - ext)
            plan.append((rid, start, end, self.scheduler.kv_cache_manager.get_block_ids(rid)))
            if rid in so.num_scheduled_tokens:  # a sync load, consumed by this very step
                self._sync_loads[rid] = (start, end)
        return plan

    def _execute(self, so: SchedulerOutput, plan: PoisonPlan) -> ModelRunnerOutput:
        t0 = time.perf_counter()
        so_bytes = pickle.dumps(so) if (self.pickle_io or self.remote) else None
        for rw in self.remote:
            rw.send_step(so_bytes, plan)
        outs: list[ModelRunnerOutput] = []
        if self.worker is not None:
            wso = pickle.loads(so_bytes) if self.pickle_io else so
            mro = self.worker.execute(wso, plan)
            if self.pickle_io:
                mro = pickle.loads(pickle.dumps(mro))
            else:
                mro = copy.copy(mro)
            outs.append(mro)
            self.mismatches.extend(f"step {self.step_count}: {m}" for m in self.worker.take_mismatches())
        for rw in self.remote:
            mro, mism, vbytes = rw.recv_step()
            outs.append(mro)
            self.mismatches.extend(f"step {self.step_count}: {m}" for m in mism)
            self._verified_remote += vbytes - getattr(rw, "_vb", 0)
            rw._vb = vbytes
            self.verified_by_rank[rw.rank] = vbytes
        outs = [copy.copy(o) for o in outs]  # the aggregator writes into outputs[0]
        mro = self.aggregator.aggregate(outs, 0) if self.aggregator is not None else outs[0]
        self.timings["execute"].append(time.perf_counter() - t0)
        return mro

    def schedule_and_execute(self) -> tuple[SchedulerOutput, ModelRunnerOutput]:
        t0 = time.perf_counter()
        so = self.scheduler.schedule()
        self.timings["schedule"].append(time.perf_counter() - t0)
        self.resumed_req_ids_seen |= so.scheduled_cached_reqs.resumed_req_ids
        self.finished_req_ids_seen |= so.finished_req_ids
        self.preempted_req_ids_seen.update(
            rid for rid, r in self.scheduler.requests.items() if r.num_preemptions > 0)
        plan = self._take_poison_plan(so)
        return so, self._execute(so, plan)

    def _update(self, so: SchedulerOutput, mro: ModelRunnerOutput, res: StepResult) -> None:
        t0 = time.perf_counter()
        outs = self.scheduler.update_from_output(so, mro)
        self.timings["update_from_output"].append(time.perf_counter() - t0)
        res.updated_output, res.model_runner_output, res.engine_core_outputs = so, mro, outs
        kvo = mro.kv_connector_output
        if kvo is not None:
            res.finished_recving = set(kvo.finished_recving or ())
            res.finished_sending = set(kvo.finished_sending or ())
            res.invalid_block_ids = set(kvo.invalid_block_ids or ())
            if kvo.kv_connector_stats is not None:
                self.stats.append(kvo.kv_connector_stats)
            if kvo.kv_cache_events is not None:
                self.worker_events.append(kvo.kv_cache_events)
        for eco in outs.values():
            for o in eco.outputs:
                got = self.outputs.setdefault(o.request_id, [])
                base = self._prompt_len.get(o.request_id, 0) + len(got)
                for i, tok in enumerate(o.new_token_ids):
                    want = sample_token(o.request_id, base + i)
                    if tok != want and len(self.output_mismatches) < 100:
                        self.output_mismatches.append(f"step {self.step_count}: req {o.request_id} output token "
                                                      f"{len(got) + i} (pos {base + i}) is {tok}, sampled {want}")
                got.extend(o.new_token_ids)
                if o.prefill_stats is not None and o.request_id not in self.prefill_stats:
                    self.prefill_stats[o.request_id] = o.prefill_stats
                if o.finish_reason is not None:
                    res.finished_requests.add(o.request_id)
            res.finished_requests |= set(eco.finished_requests or ())
            if eco.scheduler_stats is not None:
                self.scheduler_stats.append(eco.scheduler_stats)
        self.finished_req_ids_seen |= res.finished_requests
        t0 = time.perf_counter()
        if self.verify != "none":
            self._post_check(res)
        for rid in so.num_scheduled_tokens:
            self._sync_loads.pop(rid, None)
        self.timings["verify"].append(time.perf_counter() - t0)

    def _post_check(self, res: StepResult) -> None:
        """After update_from_output, through the scheduler's block tables (null blocks skipped).

        verify="all": every RUNNING request, positions [0, num_computed_tokens);
        every request whose async load just finished, the same range.
        verify="loads": just-finished async loads, and sync loads consumed by the
        step just applied, over the loaded range only.
        """
        w = self.worker
        if w is None:
            return
        sched = self.scheduler
        just_loaded = res.finished_recving & set(getattr(sched, "finished_recving_kv_req_ids", set()))
        failed = set(getattr(sched, "failed_recving_kv_req_ids", set()))
        checks: dict[str, list[tuple[str, int, int, tuple[list[int], ...]]]] = {}
        for rid, req in sched.requests.items():
            lo, hi = 0, req.num_computed_tokens
            if rid in just_loaded and req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in failed:
                what = "after load finished"
            elif req.status == RequestStatus.RUNNING and self.verify == "all":
                what = "after step (running)"
            elif req.status == RequestStatus.RUNNING and rid in self._sync_loads:
                what = "after sync load"
                lo, hi = self._sync_loads[rid]
                hi = min(hi, req.num_computed_tokens)  # a failed load truncates num_computed_tokens
            else:
                continue
            if not w.book.has(rid):
                w.book.set_prompt(rid, req.prompt_token_ids or [])
            checks.setdefault(what, []).append((rid, lo, hi, sched.kv_cache_manager.get_block_ids(rid)))
        for what, reqs in checks.items():
            for layer in w._state_layers():
                for rid, lo, hi, tables in reqs:
                    if what != "after step (running)" and hi > lo and not self.async_scheduling:
                        w.check_state(layer, rid, tables[layer.group_id], hi, what + " (Mamba)")
            for layer in w.layers:
                if not layer.attention:
                    continue
                rows = _Rows()
                for rid, lo, hi, tables in reqs:
                    w.expected_rows(layer.group_id, rid, tables[layer.group_id], lo, hi, into=rows)
                w.check_rows(layer, rows, what)
        self.mismatches.extend(f"step {self.step_count}: {m}" for m in w.take_mismatches())

    def step(self) -> StepResult:
        """One EngineCore.step (sync) or step_with_batch_queue (async scheduling)."""
        self.step_count += 1
        res = StepResult(step=self.step_count)
        n0 = len(self.mismatches)
        if not self.async_scheduling:
            if self.scheduler.has_requests():
                so, mro = self.schedule_and_execute()
                res.scheduler_output, res.num_scheduled_tokens = so, so.total_num_scheduled_tokens
                self._update(so, mro, res)
        else:
            depth = self.vllm_config.max_concurrent_batches
            if self.scheduler.has_requests():
                so, mro = self.schedule_and_execute()
                res.scheduler_output, res.num_scheduled_tokens = so, so.total_num_scheduled_tokens
                self._batch_queue.appendleft((so, mro))
                executed = so.total_num_scheduled_tokens > 0
                if len(self._batch_queue) < depth and (executed or self.scheduler.has_requests()):
                    res.new_mismatches = len(self.mismatches) - n0
                    return res
            if self._batch_queue:
                so, mro = self._batch_queue.pop()
                self._update(so, mro, res)
        res.new_mismatches = len(self.mismatches) - n0
        return res

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self._batch_queue)

    def run_until_done(self, max_steps: int = 1000, *, idle_sleep_s: float = 0.0005,
                       max_seconds: float = 120.0) -> int:
        """Step until the scheduler has nothing left (finished-but-unfreed requests included).

        When a step schedules no tokens (e.g. waiting for a connector's background
        transfer) it sleeps ``idle_sleep_s`` so a background thread can progress;
        that is back-off, not synchronisation. Raises after ``max_steps`` steps or
        ``max_seconds``. Returns the number of steps taken.
        """
        t0 = time.monotonic()
        n = 0
        while self.has_work():
            if n >= max_steps or time.monotonic() - t0 > max_seconds:
                raise RuntimeError(f"not done after {n} steps / {time.monotonic() - t0:.1f}s: "
                                   f"{self.describe()}")
            res = self.step()
            n += 1
            if res.num_scheduled_tokens == 0 and idle_sleep_s > 0:
                time.sleep(idle_sleep_s)
        return n

    # -- inspection / control --------------------------------------------------

    @property
    def verified_bytes(self) -> int:
        return (self.worker.verified_bytes if self.worker is not None else 0) + self._verified_remote

    @property
    def verified_state_bytes(self) -> int:
        """Mamba state bytes the local worker checked."""
        return self.worker.verified_state_bytes if self.worker is not None else 0

    @property
    def num_free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def describe(self) -> str:
        s = self.scheduler
        reqs = {rid: (r.status.name, r.num_computed_tokens, r.num_tokens) for rid, r in s.requests.items()}
        return (f"requests={reqs} waiting={len(s.waiting)} running={len(s.running)} "
                f"free_blocks={self.num_free_blocks}/{self.kv_cache_config.num_blocks} "
                f"batch_queue={len(self._batch_queue)}")

    def request(self, req_id: str) -> Request | None:
        return self.scheduler.requests.get(req_id)

    def assert_empty(self) -> None:
        """No request left, every block back in the free pool, connector idle."""
        s = self.scheduler
        assert not self._batch_queue, f"batch queue not drained: {len(self._batch_queue)}"
        assert not s.requests, f"requests left: {self.describe()}"
        assert not s.running and len(s.waiting) == 0, self.describe()
        assert not s.has_requests(), self.describe()
        bp = s.kv_cache_manager.block_pool
        assert bp.get_num_free_blocks() == bp.num_gpu_blocks - 1, \
            f"free blocks {bp.get_num_free_blocks()} != {bp.num_gpu_blocks - 1}"
        if self.connector is not None:
            assert not self.connector.has_pending_push_work(), "connector reports pending push work"
            assert not self.connector.has_pending_block_frees(), "connector reports pending block frees"
        if getattr(s, "deferred_frees", None):
            raise AssertionError(f"deferred frees left: {len(s.deferred_frees)}")
        for attr in ("finished_recving_kv_req_ids", "failed_recving_kv_req_ids", "deferred_loads"):
            left = getattr(s, attr, None)
            assert not left, f"scheduler.{attr} not empty: {left}"

    def reset_local_cache(self) -> bool:
        """vLLM's prefix cache only (``reset_connector=False``): the pool keeps its blocks."""
        return self.scheduler.reset_prefix_cache(reset_running_requests=False, reset_connector=False)

    def reset_cache(self, reset_running_requests: bool = False) -> bool:
        """vLLM's ``Scheduler.reset_prefix_cache(reset_running_requests, reset_connector=True)``."""
        return self.scheduler.reset_prefix_cache(reset_running_requests=reset_running_requests,
                                                 reset_connector=True)

    def preempt(self, req_id: str, *, own_step: bool = False) -> None:
        """Preempt a RUNNING request the way the scheduler does under block pressure.

        ``own_step``: then take one step that schedules nothing (vLLM's
        PAUSED_ALL), so the preemption reaches the connector before the request
        is re-admitted -- as in vLLM, whose schedule() admits no waiting request
        in a step that preempted. Without it the next step both reports the
        preemption and may re-admit the request (the path of
        ``reset_prefix_cache(reset_running_requests=True)``).
        """
        s = self.scheduler
        req = s.requests[req_id]
        assert req.status == RequestStatus.RUNNING, req.status
        s.running.remove(req)
        s._preempt_request(req, time.monotonic())
        if own_step:
            from vllm.v1.core.sched.interface import PauseState
            s.set_pause_state(PauseState.PAUSED_ALL)
            try:
                self.step()
            finally:
                s.set_pause_state(PauseState.UNPAUSED)

    def _teardown_workers(self) -> None:
        errors = []
        if self.worker is not None:
            try:
                shutdown_worker(self.worker)
            except Exception as e:  # pragma: no cover
                errors.append(e)
            self.worker = None
        for rw in self.remote:
            try:
                rw.shutdown()
            except Exception as e:  # pragma: no cover
                errors.append(e)
        self.remote = []
        if self._dist_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._dist_file)
        if errors:
            raise errors[0]

    def shutdown(self) -> None:
        """Scheduler (and its connector) shutdown, then every worker's connector shutdown."""
        if self._closed:
            return
        self._closed = True
        try:
            self.scheduler.shutdown()
        finally:
            self._teardown_workers()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def make_engine(kv_transfer_config: dict | None, *, mode: str = "full", num_blocks: int = 128,
                block_size: int = 16, max_num_seqs: int = 8, max_num_batched_tokens: int = 256,
                async_scheduling: bool = False, tp_size: int = 1, tp_rank: int = 0,
                worker: bool = True, max_model_len: int = -1, pickle_io: bool = True,
                verify: str = "all", kv_events: bool = False, pp_size: int = 1, dtype: str = "float32",
                model_path: str | None = None) -> Engine:
    """Build vLLM's scheduler + the workers of every TP rank for the tiny model.

    ``kv_transfer_config``: kwargs of vLLM's ``KVTransferConfig`` or None (no connector).
    ``mode``: "full" | "swa" | "mla" | "mamba" (tiny_models.py).
    ``num_blocks``: KV cache blocks (block 0 is vLLM's null block).
    ``worker``: keep rank 0's worker in this process (default); False = scheduler
    only here, every rank in a spawned process. Ranks 1..tp_size-1 are always
    spawned processes. ``tp_rank`` must be 0 (use ``make_worker`` for others).
    ``pickle_io``: pickle SchedulerOutput/ModelRunnerOutput between the halves.
    ``verify``: "all" (default: what each attention reads, in the forward, and
    every running request after each step), "loads" (only the loaded ranges:
    after an async load finishes / after the step that consumed a sync load),
    "none" (a benchmark).
    ``dtype``: the model's (and the attention KV's) dtype; ``model_path``: a
    directory of its own holding the tiny ``config.json`` (tiny_models).
    """
    if verify not in ("all", "loads", "none"):
        raise ValueError(f"verify must be all|loads|none, not {verify!r}")
    kwargs = dict(kv_transfer_config=copy.deepcopy(kv_transfer_config), mode=mode, num_blocks=num_blocks,
                  block_size=block_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  max_model_len=max_model_len, async_scheduling=async_scheduling, tp_size=tp_size,
                  kv_events=kv_events, pp_size=pp_size, dtype=dtype, model_path=model_path)
    plan = _plan(kv_transfer_config, mode=mode, num_blocks=num_blocks, block_size=block_size,
                 max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                 max_model_len=max_model_len, async_scheduling=async_scheduling, tp_size=tp_size, tp_rank=tp_rank,
                 kv_events=kv_events, pp_size=pp_size, dtype=dtype, model_path=model_path)
    return Engine(plan, mode=mode, tp_size=tp_size, tp_rank=tp_rank, worker=worker, pickle_io=pickle_io,
                  verify=verify, make_kwargs=kwargs, pp_size=pp_size)
