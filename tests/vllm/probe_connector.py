"""A small in-process KV connector used to self-check the harness (tests/vllm/engine.py).

Load it with ``{"kv_connector": "ProbeConnector", "kv_connector_module_path":
"probe_connector", "kv_role": "kv_both", ...}`` (tests/vllm on sys.path).

It keeps full blocks in ``ProbeConnector.STORE``, a per-process dict keyed by the
request's block hash (one entry per hash: {layer name: copy of that block's
slice of the layer tensor}). The scheduler side counts consecutive stored hashes
(its own record of what it told workers to save) and reports them as external
tokens, leaving at least one prompt token to compute. The worker side saves in
``save_kv_layer`` every block that becomes full in the step (block ids from the
scheduler's ``kv_connector_block_state``) and loads block copies.

``kv_connector_extra_config`` knobs:
- ``load_async`` (default True): async loads are copied during the *next*
  step's ``start_load_kv`` and reported in that step's ``finished_recving``;
  False = sync loads, copied in ``start_load_kv`` before the forward.
- ``corrupt`` (default False): flip one byte of the first loaded block.
- ``corrupt_rank`` (default None): like ``corrupt``, on that TP rank only (read
  from vLLM's ``get_tensor_model_parallel_rank()``).
- ``skip_load`` (default False): report loads as finished without copying.
- ``fail_load`` (default 0): the first N loaded blocks are not copied and are
  reported in ``get_block_ids_with_load_errors`` (vLLM then recomputes them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

BlockRef = tuple[bytes, tuple[int, ...]]  # (block hash, block id per KV cache group)


@dataclass
class ProbeMeta(KVConnectorMetadata):
    loads: list[tuple[str, list[BlockRef]]] = field(default_factory=list)
    saves: list[BlockRef] = field(default_factory=list)


class ProbeConnector(KVConnectorBase_V1, SupportsHMA):
    STORE: dict[bytes, dict[str, torch.Tensor]] = {}

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.load_async = bool(extra.get("load_async", True))
        self.corrupt = bool(extra.get("corrupt", False))
        if role == KVConnectorRole.WORKER and extra.get("corrupt_rank") is not None:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self.corrupt = get_tensor_model_parallel_rank() == int(extra["corrupt_rank"])
        self.skip_load = bool(extra.get("skip_load", False))
        self.fail_load = int(extra.get("fail_load", 0))
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        # scheduler side
        self._saved_hashes: set[bytes] = set()
        self._lookups: dict[str, int] = {}
        self._loads: list[tuple[str, list[BlockRef]]] = []
        self._save_upto: dict[str, int] = {}
        self._reqs: dict[str, Any] = {}
        # worker side
        self.kv: dict[str, torch.Tensor] = {}
        self.group_of: dict[str, int] = {}
        for gid, g in enumerate(kv_cache_config.kv_cache_groups):
            for name in g.layer_names:
                self.group_of[name] = gid
        self._queued: list[tuple[str, list[BlockRef]]] = []
        self._recved: set[str] = set()
        self._errors: set[int] = set()

    # ---------------- scheduler side ----------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        bs = self.block_size
        n = 0
        for h in request.block_hashes:
            if bytes(h) not in self._saved_hashes:
                break
            n += 1
        n = min(n, (request.num_tokens - 1) // bs)
        ext = n * bs - num_computed_tokens
        if ext <= 0:
            return 0, False
        self._lookups[request.request_id] = num_computed_tokens
        return ext, self.load_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._reqs[request.request_id] = request
        if num_external_tokens <= 0:
            return
        bs = self.block_size
        first = self._lookups.pop(request.request_id) // bs
        last = first + num_external_tokens // bs
        ids = blocks.get_block_ids()
        refs = [(bytes(request.block_hashes[i]), tuple(g[i] for g in ids)) for i in range(first, last)]
        self._loads.append((request.request_id, refs))

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = ProbeMeta(loads=self._loads)
        self._loads = []
        state = scheduler_output.kv_connector_block_state
        bs = self.block_size
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self._reqs.get(rid)
            if req is None or state is None:
                continue
            ids = state.get_block_ids(rid)
            full = min((req.num_computed_tokens + n) // bs, len(req.block_hashes))
            for i in range(self._save_upto.get(rid, 0), full):
                h = bytes(req.block_hashes[i])
                if h in self._saved_hashes:
                    continue
                refs = tuple(g[i] if i < len(g) else 0 for g in ids)
                if 0 in refs:  # an out-of-window (null) block: nothing to save
                    continue
                self._saved_hashes.add(h)
                meta.saves.append((h, refs))
            self._save_upto[rid] = max(self._save_upto.get(rid, 0), full)
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        self._forget(request.request_id)
        return False, None

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        self._forget(request.request_id)
        return False, None

    def _forget(self, rid: str) -> None:
        self._reqs.pop(rid, None)
        self._save_upto.pop(rid, None)
        self._lookups.pop(rid, None)

    def reset_cache(self) -> bool:
        self._saved_hashes.clear()
        ProbeConnector.STORE.clear()
        return True

    # ---------------- worker side ----------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.kv = dict(kv_caches)

    def _copy_in(self, rid: str, refs: list[BlockRef]) -> None:
        first = True
        for h, ids in refs:
            if self.fail_load > 0:
                self.fail_load -= 1
                self._errors.update(ids)
                continue
            if self.skip_load:
                continue
            entry = ProbeConnector.STORE[h]
            for name, t in self.kv.items():
                data = entry[name]
                dst = t[ids[self.group_of[name]]]
                dst.copy_(data)
                if self.corrupt and first:
                    dst.view(torch.uint8).view(-1)[7] ^= 0x01
                    first = False

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, ProbeMeta)
        if self.load_async:
            for rid, refs in self._queued:  # loads announced in the previous step
                self._copy_in(rid, refs)
                self._recved.add(rid)
            self._queued = list(meta.loads)
        else:
            for rid, refs in meta.loads:
                self._copy_in(rid, refs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, ProbeMeta)
        gid = self.group_of[layer_name]
        for h, ids in meta.saves:
            ProbeConnector.STORE.setdefault(h, {})[layer_name] = kv_layer[ids[gid]].clone()

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._recved = self._recved, set()
        return None, (done or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errs, self._errors = self._errors, set()
        return errs
