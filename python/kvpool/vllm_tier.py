"""kvpool.vllm_tier -- kvpool as a secondary tier of vLLM's native offloading.

vLLM's ``OffloadingConnector`` with ``TieringOffloadingSpec`` keeps a primary
tier in host memory (one shared-memory region per instance, chunk *c* at
``primary_kv_view[c]``) and hands every chunk it stores there to its secondary
tiers; a chunk missing from host memory is looked up in them and promoted
back. ``KVPoolTier`` is such a tier, loaded by vLLM's ``module_path``::

    "secondary_tiers": [{"type": "KVPoolTier", "module_path": "kvpool.vllm_tier",
                         "config": {"master": "10.0.0.1:50051"}}]

Tier parameters (the rest of the tier's dict; README, "vLLM's native
offloading (tiers)"): ``config`` (the client's configuration: a dict, JSON
text or a file path, docs/CONFIG.md; default $KVPOOL_CONFIG), ``threads``
(the transfer threads, default 4), ``namespace`` (prepended to every key,
default ""), ``enable_kv_events`` (BlockStored events with medium STORAGE for
the chunks this tier stored, when vLLM's KV events are on), ``locality``
("LOCAL" / "REMOTE", carried in those events).

Contracts:
  * Data path: the primary region is registered with the client once; a store
    puts each chunk straight from ``primary_kv_view[c]`` and a load gets it
    straight into its slot (a same-host node's shared memory, or TCP/UCX):
    no staging copy. The transfers run on the C client's transfer queue
    (``kvpool._native.XferQueue``, src/client/xq.h), never on the scheduler's
    thread and never in Python threads; submit_* only queue a job.
  * Keys: ``<namespace>vllm-tier@cfg:<fp>@g<group>@<block hash hex>``; <fp> is
    the configuration fingerprint (``tier_fingerprint``): model and weights
    (kvpool.fingerprint), dtype, hash and chunk geometry, KV-cache groups,
    the chunk's byte size and its parallel layout (none when vLLM's layout is
    parallelism-agnostic, so engines of any TP size share). Engines whose
    chunks differ never read each other's.
  * lookup: HIT when the pool holds the chunk, MISS when not, RETRY while the
    answer is not known yet (vLLM's AsyncLookupManager asks the pool once per
    step for the step's keys, off the scheduler thread) or while this tier is
    storing that chunk.
  * Every submitted job is reported once by get_finished_jobs with its bytes
    and seconds (vLLM's per-tier read/write metrics). A load reports the keys
    that arrived (``successful_keys``) when some did not; those that did not
    are looked up as MISS from then on. A chunk arrived only when the pool's
    value filled its whole slot (a value of another size under its key fails).
    A put of a chunk the pool already holds succeeds without moving bytes.
  * drain_jobs waits for every queued and running transfer; shutdown drains,
    then closes the client.
  * Events: stores only; the pool evicts on its own and announces that in
    its own KV events (docs/ARCHITECTURE.md), not through this tier.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import numpy as np
from vllm.logger import init_logger
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    get_offload_block_hash,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager, LookupPhase
from vllm.v1.kv_offload.tiering.base import JobId, JobResult, SecondaryTierManager, TransferJob

from . import Client, Error, _native, codes
from .fingerprint import FINGERPRINT_VERSION, weights_fingerprint

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

try:  # vLLM 0.33: the source a hit is reported under
    from vllm.v1.metrics.cache_hit_source import CacheHitSource
    _HIT_SOURCE: Any = CacheHitSource.EXTERNAL_UNSPECIFIED
except ImportError:  # vLLM 0.32
    _HIT_SOURCE = None

__all__ = ["KVPoolTier", "tier_fingerprint", "tier_key"]

logger = init_logger(__name__)

KEY_TAG = "vllm-tier"


# ------------------------------------------------------------------ keys

def tier_fingerprint(spec: "OffloadingSpec", chunk_bytes: int) -> tuple[str, dict[str, Any]]:
    """(fingerprint, description) of what a chunk of this engine holds: 16 hex
    digits of BLAKE2b over the canonical JSON of the description. Same on every
    host and process with the same model files and configuration."""
    cfg = spec.config
    model = str(cfg.model.name).rstrip("/") or str(cfg.model.name)
    local = os.path.exists(os.path.expanduser(model))
    par = cfg.parallel
    agnostic = bool(getattr(par, "is_parallelism_agnostic", False)
                    or getattr(cfg, "replicated_layout", False))
    desc: dict[str, Any] = {
        "version": FINGERPRINT_VERSION,
        "tier": KEY_TAG,
        "model": os.path.basename(model) if local else model,
        "weights": weights_fingerprint(model),
        "dtype": str(cfg.model.dtype),
        "tokens_per_hash": int(cfg.cache.tokens_per_hash),
        "blocks_per_chunk": int(cfg.cache.blocks_per_chunk),
        "chunk_bytes": int(chunk_bytes),
        "groups": [{"tokens_per_block": int(g.tokens_per_block),
                    "layer_names": list(g.layer_names),
                    "sliding_window": getattr(g, "sliding_window_size_in_chunks", None)}
                   for g in cfg.groups],
        "canonical_layout": bool(getattr(cfg, "canonical_layout", False)),
        "kv_cache_layout": getattr(cfg, "kv_cache_layout", None),
        "replicated_layout": bool(getattr(cfg, "replicated_layout", False)),
        "layout": "agnostic" if agnostic else {
            "tp": int(par.tp_size), "pp": int(par.pp_size),
            "pcp": int(par.pcp_size), "dcp": int(par.dcp_size)},
    }
    text = json.dumps(desc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode()).hexdigest()[:16], desc


def tier_key(prefix: str, key: OffloadKey) -> str:
    """The pool key of an offload key under prefix (namespace + tag + fp)."""
    return f"{prefix}@g{get_offload_group_idx(key)}@{get_offload_block_hash(key).hex()}"


def _check_params(threads: Any, namespace: Any, enable_kv_events: Any) -> None:
    """The tier's own parameters from vLLM's configuration, refused with the
    reason before anything starts."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise ValueError(f"kvpool tier: threads must be an integer 1..64, not {threads!r}")
    if not isinstance(namespace, str) or "\0" in namespace or len(namespace) > 1024:
        raise ValueError(f"kvpool tier: namespace must be a string of at most 1024 characters "
                         f"without NUL, not {namespace!r:.80}")
    if not isinstance(enable_kv_events, bool):
        raise ValueError(f"kvpool tier: enable_kv_events must be true or false, "
                         f"not {enable_kv_events!r}")


# --------------------------------------------------------------- lookups

class _PoolLookups(AsyncLookupManager):
    """vLLM's async lookup machinery over the pool's batched EXIST."""

    def __init__(self, tier: "KVPoolTier", tier_type: str) -> None:
        super().__init__(tier_type=tier_type)
        self._tier = tier

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        found = self._tier._client.exist_batch([self._tier._key(k) for k in keys])
        return [r is True for r in found]  # an Error (pool unreachable) is a miss

    def mark_stored(self, keys: Iterable[OffloadKey]) -> None:
        """Chunks this tier just stored: a verdict "absent" cached for them
        (asked before the store, kept while a request refers to it) becomes
        "present", as mark_miss does the other way. Only resolved verdicts
        change; one still being asked keeps its own answer."""
        states = getattr(self, "_lookup_state", None)
        if states is None:  # another vLLM's internals: the verdicts age out instead
            return
        for k in keys:
            st = states.get(k)
            if st is not None and st.phase is LookupPhase.RESOLVED:
                st.result = True


# ------------------------------------------------------------------ tier

class KVPoolTier(SecondaryTierManager):
    """kvpool as a secondary tier of vLLM's TieringOffloadingManager."""

    medium: ClassVar[Medium] = Medium.STORAGE
    if _HIT_SOURCE is not None:
        cache_hit_source: ClassVar[Any] = _HIT_SOURCE

    def __init__(self, offloading_spec: "OffloadingSpec", primary_kv_view: memoryview,
                 tier_type: str, config: Any = None, threads: int = 4, namespace: str = "",
                 enable_kv_events: bool = False, locality: Optional[str] = None,
                 backpressure_detector: "Optional[BackpressureDetector]" = None) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        _check_params(threads, namespace, enable_kv_events)
        self.locality = Locality(locality) if locality is not None else None
        self._chunk = int(self.block_size_bytes)
        self._fp, self._desc = tier_fingerprint(offloading_spec, self._chunk)
        self._prefix = f"{namespace}{KEY_TAG}@cfg:{self._fp}"
        self.events: Optional[list[OffloadingEvent]] = None
        if enable_kv_events:
            if offloading_spec.kv_events_config.enable_kv_cache_events:
                self.events = []
            else:
                logger.warning("kvpool tier %s: enable_kv_events is set but vLLM's KV cache "
                               "events are off; the tier emits none", tier_type)
        self._jobs: dict[JobId, tuple[str, list[OffloadKey]]] = {}
        self._storing: dict[OffloadKey, int] = {}  # chunk -> store jobs of it in flight
        self._refused: list[tuple[JobId, int]] = []  # jobs the queue refused, to report
        self._client = Client(config)
        try:
            self._base, self._size = self._register(primary_kv_view)
            self._xq = _native.XferQueue(self._client._c, int(threads))
            self._lookups = _PoolLookups(self, tier_type)
        except BaseException:
            self._client.close()
            raise
        logger.info("kvpool tier %s: chunks of %d bytes under %s (%s)", tier_type, self._chunk,
                    self._prefix, json.dumps(self._desc, default=str))

    def _register(self, view: memoryview) -> tuple[int, int]:
        """Registers the primary region with the client: (address, bytes). The
        numpy view taken for its address is dropped at once, so vLLM can still
        release primary_kv_view at shutdown."""
        arr = np.asarray(view)
        base, size = int(arr.ctypes.data), int(arr.nbytes)
        del arr
        self._client.register_buffer(base, size)
        return base, size

    def _key(self, key: OffloadKey) -> str:
        return tier_key(self._prefix, key)

    @property
    def key_prefix(self) -> str:
        """What every key of this tier starts with ("<namespace>vllm-tier@cfg:<fp>")."""
        return self._prefix

    # -------------------------------------------------------------- requests

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if key in self._storing:
            return LookupResult.RETRY
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    # ------------------------------------------------------------- transfers

    def _submit(self, job: TransferJob, op: str) -> None:
        """Queues job on the transfer queue; a job refused there (a slot
        outside the registered region, a closed client) is reported failed by
        the next get_finished_jobs."""
        keys = list(job.keys)
        if len(keys) != len(job.chunk_ids):
            raise ValueError(f"kvpool tier: {len(keys)} keys for {len(job.chunk_ids)} chunks")
        addrs = [self._base + int(c) * self._chunk for c in job.chunk_ids]
        self._jobs[job.job_id] = (op, keys)
        rc = self._xq.submit(job.job_id, op, [self._key(k) for k in keys], addrs, self._chunk) \
            if keys else codes["INVALID_PARAMS"]
        if rc != 0:
            logger.warning("kvpool tier: %s job %d of %d chunks refused: %s", op, job.job_id,
                           len(keys), Error.from_code(rc) if keys else "no chunks")
            self._refused.append((job.job_id, rc))
            return
        if op == "put":
            for k in keys:
                self._storing[k] = self._storing.get(k, 0) + 1

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, "put")

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, "get")

    def _store_done(self, keys: list[OffloadKey], results: list[int]) -> list[OffloadKey]:
        """Ends the in-flight marks of a store job; the chunks it stored."""
        for k in keys:
            left = self._storing.get(k, 0) - 1
            if left > 0:
                self._storing[k] = left
            else:
                self._storing.pop(k, None)
        return [k for k, r in zip(keys, results) if r >= 0]

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out: list[JobResult] = []
        refused, self._refused = self._refused, []
        for job_id, _rc in refused:
            self._jobs.pop(job_id, None)
            out.append(JobResult(job_id=job_id, success=False))
        for job_id, op, results, nbytes, seconds in self._xq.poll():
            _, keys = self._jobs.pop(job_id, (op, []))
            # a get must fill the whole slot: a value of another size under the
            # key (never written by this tier) is a failed chunk, not stale bytes
            good = [r >= 0 if op == "put" else r == self._chunk for r in results]
            ok = [k for k, g in zip(keys, good) if g]
            success = len(ok) == len(keys)
            if op == "put":
                stored = self._store_done(keys, results)
                self._lookups.mark_stored(stored)
                if self.events is not None and stored:
                    self.events.append(OffloadingEvent(keys=stored, medium=self.medium,
                                                       removed=False, locality=self.locality))
                out.append(JobResult(job_id=job_id, success=success, transfer_time=seconds,
                                     transfer_bytes=nbytes))
                continue
            partial: Optional[tuple[OffloadKey, ...]] = None
            if not success:
                self._lookups.mark_miss([k for k, g in zip(keys, good) if not g])
                partial = tuple(ok) if ok else None
            out.append(JobResult(job_id=job_id, success=success, successful_keys=partial,
                                 transfer_time=seconds, transfer_bytes=nbytes))
        return out

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            events, self.events = self.events, []
            return events
        return ()

    def drain_jobs(self) -> None:
        self._xq.drain()

    def shutdown(self) -> None:
        """Drains the transfers, then closes the client (idempotent)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        self._lookups.shutdown()
        self._xq.close()
        try:
            self._client.unregister_buffer(self._base)
        except Error:
            pass
        self._client.close()
