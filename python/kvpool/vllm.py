"""kvpool.vllm -- vLLM's KV connector on kvpool (``KVPoolConnector``).

Turned on with one option of ``vllm serve``::

    --kv-transfer-config '{"kv_connector": "KVPoolConnector",
                           "kv_connector_module_path": "kvpool.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"store_config": "/etc/kvpool.json"}}'

This module is a translator and nothing more: it turns vLLM's objects (Request,
SchedulerOutput, KV-cache tensors, finished-id sets) into calls on the C
connector (include/kvpool_connector.h, through kvpool._native's ConnSched /
ConnWorker) and the answers back into vLLM's types. Every decision -- what a
lookup hits, what a step stores and loads, when a request's blocks may be
freed, what failed -- is taken in C.

Contracts
  * Runs on any vLLM that has the APIs it calls (REQUIRED_API: 0.32 and
    0.33; tested on 0.32.0's CPU build in its real engine and on 0.33.0 in
    its scheduler); one lacking any is refused at start-up naming what is
    missing (KVPOOL_VLLM_UNTESTED=1 skips the check).
  * The step bytes (KVPoolConnectorMetadata.step) are incremental: every worker
    must receive every step's metadata, in order, once -- what vLLM's executors
    do, with async scheduling and pipeline parallelism too (steps are built and
    executed in the same order). A worker that gets bytes it cannot decode
    raises ConnError: a transport bug, fatal for that engine.
  * A request's token ids and block hashes are kept in C per request
    (ConnRequest); each step passes only what is new.
  * Store configuration: extra-config ``store_config`` (JSON text or a file),
    else $KVPOOL_CONFIG, else $MOONCAKE_CONFIG_PATH (Mooncake's JSON keys are
    understood, docs/MOONCAKE_COMPAT.md). Nothing found: a clear error.
  * The worker half opens at register_kv_caches (num_blocks is known then);
    worker rank 0 serves the lookup channel the scheduler connects to, a unix
    socket under $VLLM_RPC_BASE_PATH named after the engine id.
  * Hybrid models: full-attention, sliding-window and Mamba groups (Mamba
    only with --mamba-cache-mode align). A Mamba state is stored only as the
    exact block vLLM's core hands off at a boundary (SchedulerOutput.
    kv_connector_block_state.boundary_state_offloads: (group, block_id,
    boundary_tokens) per request), passed to the C scheduler as the step's
    "tails" (Mamba groups only); it is keyed by that boundary's hash and
    rank-specific. register_finished_partial_tail queues the finish-time
    hand-off for the next step and answers False, as vLLM 0.33's connector:
    request_finished then delays the free until every rank stored it. Every
    handed-off block holds one reference in vLLM's block pool (align-mode
    tables free superseded states while a request runs) until the request is
    finished sending. A lookup probes every group, so a hit is a point where
    the attention blocks and a Mamba state are both stored; the load writes
    the state into the block vLLM allocated at the hit point.
  * KV memory is host memory or CUDA device memory (the store moves device
    memory by DMA: straight into a same-host node's page-locked segment, or
    through page-locked staging over TCP). With CUDA tensors, wait_for_save
    records a CUDA event per step and the store thread waits on it
    (fence="cuda") before reading KV memory; a load is reported finished
    only once its bytes are in device memory.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Optional

from . import _native
from .fingerprint import config_fingerprint

import vllm
from vllm.distributed.kv_events import BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
    PromMetric,
    PromMetricT,
)
from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVPoolConnector", "KVPoolConnectorMetadata", "KVPoolConnectorStats",
           "KVPoolPromMetrics", "KVPoolKVEvents", "TESTED_VLLM", "check_vllm_api"]

log = logging.getLogger("kvpool.vllm")

# kv_connector_extra_config keys: the seeds' (vllm-connector-spec.md §3.3) and ours
EXTRA_KEYS = {
    "load_async", "lookup_async", "enable_lookup", "lookup_rpc_port", "cache_prefix",
    "preferred_segment", "enable_cross_layers_blocks", "save_decode_cache",
    "store_config", "partial_hash_hits", "recv_threads", "staging_budget",
    "lookup_timeout_ms", "tenant", "lookup_group", "tp_independent",
    # vLLM's MooncakeStoreConnector keys: the first two accepted at their
    # defaults only, the TP ones select the TP-independent layout
    # (_check_mooncake_only_keys)
    "enable_group_semantics", "custom_mem_pool", "store_tp_size", "enable_store_tp_lcm",
    "prefill_tp_sizes",
}


def _check_mooncake_only_keys(extra: dict[str, Any], tp: int) -> bool:
    """Refuses, with the reason, the in-tree MooncakeStoreConnector's
    extra-config keys set to what kvpool cannot do; their defaults are
    accepted. Returns whether the TP-independent layout is on: asked for by
    tp_independent, or implied by the in-tree keys that share blocks across
    TP sizes (enable_store_tp_lcm, a store_tp_size other than the engine's):
    in that layout every TP size stores and reads the same per-head objects,
    so what those keys are for holds for any store_tp_size and any
    prefill_tp_sizes."""
    if _bool(extra, "enable_group_semantics", False):
        raise ValueError("KVPoolConnector: enable_group_semantics=true is not supported (kvpool "
                         "has no object groups: each block is its own cache entry); remove the "
                         "key or set it to false")
    if str(extra.get("custom_mem_pool") or ""):
        raise ValueError(f"KVPoolConnector: custom_mem_pool={extra['custom_mem_pool']!r} is not "
                         "supported (the KV caches stay in vLLM's own allocator); remove the key")
    tpi = _bool(extra, "tp_independent", False)
    if extra.get("enable_store_tp_lcm") not in (None, False) and \
            _bool(extra, "enable_store_tp_lcm", False):
        tpi = True
    st = extra.get("store_tp_size")
    if st is not None:
        if isinstance(st, bool) or not isinstance(st, int) or st < 1:
            raise ValueError(f"KVPoolConnector: store_tp_size={st!r} must be a TP size (>= 1)")
        tpi = tpi or st != tp
    pts = extra.get("prefill_tp_sizes")
    if pts is not None and (not isinstance(pts, (list, tuple)) or
                            not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                    for x in pts)):
        raise ValueError(f"KVPoolConnector: prefill_tp_sizes={pts!r} must be a list of TP sizes")
    return tpi


def _lookup_gid(group: Any) -> int:
    """kv_connector_extra_config's lookup_group (a group name or id) as a gid:
    processes of that group may use the lookup socket too (it is 0660)."""
    if isinstance(group, int) and not isinstance(group, bool):
        return group
    import grp

    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise ValueError(f"lookup_group: no group named {group!r}") from None


# What the connector uses of vLLM beyond its imports above: (module, attribute
# path). A vLLM that lacks one cannot run it; anything that has all of them
# can (0.32 and 0.33 do: tests/engine runs on the CPU build of 0.32.0,
# tests/vllm on 0.33.0).
REQUIRED_API: tuple[tuple[str, str], ...] = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1.build_connector_worker_meta"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1.get_block_ids_with_load_errors"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1.get_kv_connector_kv_cache_events"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1.register_finished_partial_tail"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1.handle_preemptions"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "SupportsHMA.request_finished_all_groups"),
    ("vllm.v1.core.kv_cache_utils", "resolve_kv_cache_block_sizes"),
    ("vllm.v1.core.sched.output", "SchedulerOutput.kv_connector_block_state"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig.prefix_cacheable_group_ids"),
)
# The versions the tests run on (documentation; the check is REQUIRED_API).
TESTED_VLLM = ("0.32.0", "0.33.0")


def _has(mod: str, path: str) -> bool:
    """Whether module mod has the attribute path (dots between names); a
    dataclass field without a class default counts (inherited ones too)."""
    import dataclasses
    import importlib

    try:
        obj: Any = importlib.import_module(mod)
    except ImportError:
        return False
    parts = path.split(".")
    for i, part in enumerate(parts):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        fields = {f.name for f in dataclasses.fields(obj)} \
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) else set()
        return part in fields and i == len(parts) - 1
    return True


def check_vllm_api(version: str = vllm.__version__) -> None:
    """Refuses, naming what is missing, a vLLM that lacks an API the connector
    calls (REQUIRED_API); any vLLM that has them all is accepted, whatever its
    version string (KVPOOL_VLLM_UNTESTED=1 skips the check)."""
    if os.environ.get("KVPOOL_VLLM_UNTESTED") == "1":
        return
    missing = [f"{m}.{a}" for m, a in REQUIRED_API if not _has(m, a)]
    if missing:
        raise RuntimeError(
            f"kvpool.vllm.KVPoolConnector cannot run on vLLM {version}: it lacks "
            f"{', '.join(missing)}. Tested: vLLM {', '.join(TESTED_VLLM)}; set "
            "KVPOOL_VLLM_UNTESTED=1 to try anyway.")
    if version.split("+")[0] not in TESTED_VLLM and not _untested_warned:
        _warn_untested(version)


_untested_warned = False


def check_vllm_version(version: str = vllm.__version__) -> None:
    """The former name of check_vllm_api (kept for callers of earlier releases)."""
    check_vllm_api(version)


def _warn_untested(version: str) -> None:
    global _untested_warned
    _untested_warned = True
    log.warning("kvpool.vllm: vLLM %s has every API the connector uses but is not one of the "
                "versions it is tested with (%s)", version, ", ".join(TESTED_VLLM))


# ------------------------------------------------------------------ configuration

def _truthy(v: Any) -> bool:
    return str(v).strip().lower() in ("1", "true", "yes", "on")


def _bool(extra: dict[str, Any], key: str, default: bool) -> bool:
    v = extra.get(key, default)
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError(f"kv_connector_extra_config[{key!r}] must be a bool, got {v!r}")


def _store_config(extra: dict[str, Any]) -> str:
    """The store's configuration as JSON text, extra-config overrides merged in."""
    src = extra.get("store_config") or os.environ.get("KVPOOL_CONFIG") \
        or os.environ.get("MOONCAKE_CONFIG_PATH")
    if not src:
        raise ValueError(
            "KVPoolConnector needs the store's configuration: set kv_connector_extra_config"
            "['store_config'] (JSON text or a file), $KVPOOL_CONFIG or $MOONCAKE_CONFIG_PATH")
    text = src if src.lstrip().startswith("{") else open(src, encoding="utf-8").read()
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"store configuration {src!r} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"store configuration {src!r} must be a JSON object")
    for key in ("preferred_segment", "tenant"):
        if key in extra:
            v = extra[key]
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"kv_connector_extra_config[{key!r}] must be a non-empty string")
            cfg[key] = v.strip()
    return json.dumps(cfg)


def _group_of(spec: KVCacheSpec, cache_mode: str) -> dict[str, Any]:
    """One KV-cache group as the C connector describes it; unsupported kinds refused."""
    inner = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) \
        else [spec]
    kinds = {type(s) for s in inner}
    if len(kinds) != 1:
        raise ValueError(f"KVPoolConnector: mixed specs in one group are not supported: {kinds}")
    s = inner[0]
    g: dict[str, Any] = {"block_size": int(spec.block_size)}
    if isinstance(s, MambaSpec):
        if cache_mode != "align":
            raise ValueError("KVPoolConnector stores Mamba state only with "
                             "--mamba-cache-mode align (the state at block boundaries)")
        g["kind"] = "mamba"
    elif isinstance(s, SlidingWindowSpec):
        g["kind"] = "sliding_window"
        g["sliding_window"] = int(s.sliding_window)
        g["mla"] = "MLA" in type(s).__name__
    elif type(s) in (FullAttentionSpec, MLAAttentionSpec):
        g["kind"] = "full_attention"
        g["mla"] = isinstance(s, MLAAttentionSpec)
    else:
        raise ValueError(f"KVPoolConnector does not support {type(s).__name__} KV-cache groups")
    return g


def _tp_factor(g: dict[str, Any], tp: int, heads: int, dcp: int) -> int:
    """TP ranks holding byte-identical data for a group (spec §4.3; mirrors C keys.c)."""
    if dcp > 1 or g["kind"] == "mamba":
        return 1
    if g.get("mla"):
        return tp
    return max(1, tp // max(1, heads))


def _rank(group_getter: str, size: int) -> int:
    if size <= 1:
        return 0
    from vllm.distributed import parallel_state as ps
    return int(getattr(ps, group_getter)().rank_in_group)


@dataclass
class _Setup:
    """What both halves derive from vLLM's configuration."""
    conn: dict[str, Any]          # kvpool._native config (both halves' keys)
    store_group_ids: tuple[int, ...]  # vLLM group ids the pool stores, in our order
    factors: tuple[int, ...]      # per stored group, TP replication factor
    num_workers: int
    kv_events: bool


def _setup(vllm_config: "VllmConfig", kv_cache_config: KVCacheConfig,
           role: KVConnectorRole) -> _Setup:
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    kvt = vllm_config.kv_transfer_config
    extra: dict[str, Any] = dict(kvt.kv_connector_extra_config or {})
    unknown = set(extra) - EXTRA_KEYS
    if unknown:
        raise ValueError(f"KVPoolConnector: unknown kv_connector_extra_config keys "
                         f"{sorted(unknown)}; known: {sorted(EXTRA_KEYS)}")
    tp_independent = _check_mooncake_only_keys(
        extra, int(vllm_config.parallel_config.tensor_parallel_size))
    if not _bool(extra, "load_async", True):
        raise ValueError("KVPoolConnector loads in the background only: load_async must be true")
    par = vllm_config.parallel_config
    tp = int(par.tensor_parallel_size)
    pp = int(par.pipeline_parallel_size)
    pcp = int(getattr(par, "prefill_context_parallel_size", 1) or 1)
    dcp = int(getattr(par, "decode_context_parallel_size", 1) or 1)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    cache_mode = str(getattr(vllm_config.cache_config, "mamba_cache_mode", "none"))
    ids = tuple(kv_cache_config.prefix_cacheable_group_ids)
    if not ids:
        raise ValueError("KVPoolConnector: the model has no prefix-cacheable KV-cache group")
    groups = [_group_of(kv_cache_config.kv_cache_groups[i].kv_cache_spec, cache_mode) for i in ids]
    if len(groups) == 1 and groups[0]["block_size"] != block_size:
        groups[0]["block_size"] = int(block_size)  # PCP / DCP scaling (spec §3, seeds)
    heads = int(vllm_config.model_config.get_total_num_kv_heads())
    for g in groups:
        g["num_kv_heads"] = heads
    spec_cfg = vllm_config.speculative_config
    use_eagle = bool(spec_cfg is not None and spec_cfg.use_eagle())
    ev_cfg = getattr(vllm_config, "kv_events_config", None)
    kv_events = bool(ev_cfg is not None and ev_cfg.enable_kv_cache_events)
    base = os.environ.get("VLLM_RPC_BASE_PATH") or tempfile.gettempdir()
    port = extra.get("lookup_rpc_port", 0)
    dp = int(getattr(par, "data_parallel_index", 0) or 0)
    sock = os.path.join(base, f"kvpool-lookup-{kvt.engine_id}-{port}-dp{dp}.sock")
    conn: dict[str, Any] = {
        "model": str(vllm_config.model_config.model),
        "role": str(kvt.kv_role),
        "groups": groups,
        "hash_block_size": int(hash_block_size),
        "block_size": int(block_size),
        "enable_lookup": _bool(extra, "enable_lookup", True),
        "load_async": True,
        "lookup_async": _bool(extra, "lookup_async", False),
        "partial_hash_hits": _bool(extra, "partial_hash_hits", False),
        # decode-phase blocks stored too, by every role (both halves)
        "save_decode_cache": _bool(extra, "save_decode_cache", False),
        "cache_prefix": str(extra.get("cache_prefix", "")),
        "lookup_socket": sock,
        "tp_size": tp, "pp_size": pp, "pcp_size": pcp, "dcp_size": dcp,
        "use_eagle": use_eagle,
        "kv_events": kv_events,
        "engine_group_ids": list(ids),  # the pool's blocks name groups as vLLM does
        "tp_independent": tp_independent,
    }
    if "lookup_timeout_ms" in extra:
        conn["lookup_timeout_ms"] = int(extra["lookup_timeout_ms"])
    if "lookup_group" in extra:
        conn["lookup_gid"] = _lookup_gid(extra["lookup_group"])
    # every key carries the configuration's fingerprint (kvpool.fingerprint)
    fp, desc = config_fingerprint(vllm_config, kv_cache_config, groups, block_size=block_size,
                                  hash_block_size=hash_block_size, group_ids=ids,
                                  tp_independent=tp_independent)
    conn["config_fingerprint"] = fp
    if role == KVConnectorRole.WORKER:
        desc.update(fingerprint=fp, vllm=vllm.__version__, created=int(time.time()))
        conn["config_description"] = json.dumps(desc, sort_keys=True)
        conn["store_config"] = _store_config(extra)
        threads = extra.get("recv_threads", os.environ.get("VLLM_MOONCAKE_LOAD_RECV_THREADS"))
        if threads is not None:
            conn["recv_threads"] = max(1, int(threads))
        if "staging_budget" in extra:
            conn["staging_budget"] = int(extra["staging_budget"])
        conn["tp_rank"] = _rank("get_tp_group", tp)
        conn["pp_rank"] = (int(par.rank) // tp) % pp if pp > 1 else 0
        conn["pcp_rank"] = _rank("get_pcp_group", pcp)
        conn["dcp_rank"] = _rank("get_dcp_group", dcp)
    factors = tuple(_tp_factor(g, tp, heads, dcp) for g in groups)
    return _Setup(conn, ids, factors, tp * pp * pcp, kv_events)


# ------------------------------------------------------------------ vLLM data types

@dataclass
class KVPoolConnectorMetadata(KVConnectorMetadata):
    """One step for the workers: the C scheduler's step bytes (incremental,
    versioned "KVCM") and the ids preempted in it (for handle_preemptions)."""
    step: bytes = b""
    preempted: tuple[str, ...] = ()


_OPS = ("store", "load", "lookup")
_FIELDS = ("count", "total_ns", "max_ns", "keys", "bytes", "failed_keys", "existing_keys",
           "partial", "errors")
# data["pool"]: the pool's availability (ConnWorker.pool_status): "unavailable"
# 0 / 1 now (aggregated: max, i.e. some rank is without the pool), and what was
# done without it since the last report (summed)
_POOL_COUNTERS = ("outages", "skipped_stores", "skipped_lookups", "failed_loads")


@dataclass
class KVPoolConnectorStats(KVConnectorStats):
    """Counters per operation (store, load, lookup) as the C worker keeps them:
    data = {op: {count, total_ns, max_ns, keys, bytes, failed_keys,
    existing_keys, partial, errors}}. Summed over ranks and steps. With the
    pool's availability when it changed or anything else is reported:
    data["pool"] = {unavailable (0/1, max over ranks), outages, skipped_stores,
    skipped_lookups, failed_loads (summed)}."""

    def __post_init__(self) -> None:
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {}

    def is_empty(self) -> bool:
        return not any(v.get("count", 0) or v.get("errors", 0) for k, v in self.data.items()
                       if k != "pool") and not any(self.data.get("pool", {}).values())

    def aggregate(self, other: KVConnectorStats) -> "KVPoolConnectorStats":
        for op, rec in (other.data or {}).items():
            if op == "pool":
                p = self.data.setdefault("pool",
                                         dict.fromkeys(("unavailable",) + _POOL_COUNTERS, 0))
                p["unavailable"] = max(p["unavailable"], int(rec.get("unavailable", 0)))
                for f in _POOL_COUNTERS:
                    p[f] += int(rec.get(f, 0))
                continue
            mine = self.data.setdefault(op, {f: 0 for f in _FIELDS})
            for f in _FIELDS:
                v = int(rec.get(f, 0))
                mine[f] = max(mine[f], v) if f == "max_ns" else mine[f] + v
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {}
        for op in _OPS:
            r = self.data.get(op)
            if not r or not r.get("count"):
                continue
            out[f"{op}_count"] = int(r["count"])
            out[f"{op}_avg_ms"] = round(r["total_ns"] / r["count"] / 1e6, 3)
            out[f"{op}_max_ms"] = round(r["max_ns"] / 1e6, 3)
            out[f"{op}_keys"] = int(r["keys"])
            out[f"{op}_bytes"] = int(r["bytes"])
            out[f"{op}_failed_keys"] = int(r["failed_keys"])
            out[f"{op}_errors"] = int(r["errors"])
            if op == "store":
                out["store_existing_keys"] = int(r["existing_keys"])
            if op == "lookup":
                out["lookup_hit_keys"] = int(r["keys"]) - int(r["failed_keys"])
        pool = self.data.get("pool")
        if pool:
            out["pool_unavailable"] = int(pool.get("unavailable", 0))
            for f in _POOL_COUNTERS:
                out[f"pool_{f}"] = int(pool.get(f, 0))
        return out


class KVPoolPromMetrics(KVConnectorPromMetrics):
    """Prometheus counters vllm:kvpool_{operations,keys,bytes,failed_keys,
    errors}_total and vllm:kvpool_seconds_total, labelled by operation; the
    gauge vllm:kvpool_pool_unavailable (1 while a rank is without the pool) and
    the counters vllm:kvpool_pool_{outages,skipped_stores,skipped_lookups,
    failed_loads}_total."""

    def __init__(self, vllm_config: "VllmConfig",
                 metric_types: dict[type[PromMetric], type[PromMetricT]],
                 labelnames: list[str], per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        names = labelnames + ["operation"]
        doc = {"operations": "connector operations", "keys": "pool keys touched",
               "bytes": "bytes moved", "failed_keys": "keys that failed",
               "errors": "operations that failed", "seconds": "time spent in operations"}
        self._counters = {k: self._counter_cls(name=f"vllm:kvpool_{k}_total",
                                               documentation=f"kvpool: {d}", labelnames=names)
                          for k, d in doc.items()}
        pdoc = {"outages": "times the pool became unavailable (unreachable at start counts)",
                "skipped_stores": "store jobs skipped while the pool was unavailable",
                "skipped_lookups": "lookups answered 0 while the pool was unavailable",
                "failed_loads": "loads failed at once (recomputed) while the pool was unavailable"}
        self._pool = {k: self._counter_cls(name=f"vllm:kvpool_pool_{k}_total",
                                           documentation=f"kvpool: {d}", labelnames=labelnames)
                      for k, d in pdoc.items()}
        self._unavailable = self._gauge_cls(
            name="vllm:kvpool_pool_unavailable", multiprocess_mode="mostrecent",
            documentation="kvpool: 1 while the engine runs without the pool (unreachable), else 0",
            labelnames=labelnames)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for op, r in (transfer_stats_data or {}).items():
            if op == "pool":
                lv = self.per_engine_labelvalues[engine_idx]
                self._unavailable.labels(*lv).set(int(r.get("unavailable", 0)))
                for f in _POOL_COUNTERS:
                    if r.get(f):
                        self._pool[f].labels(*lv).inc(int(r[f]))
                continue
            lv = self.per_engine_labelvalues[engine_idx] + [op]
            for k, f in (("operations", "count"), ("keys", "keys"), ("bytes", "bytes"),
                         ("failed_keys", "failed_keys"), ("errors", "errors")):
                if r.get(f):
                    self._counters[k].labels(*lv).inc(int(r[f]))
            if r.get("total_ns"):
                self._counters["seconds"].labels(*lv).inc(r["total_ns"] / 1e9)


class KVPoolKVEvents(KVConnectorKVEvents):
    """BlockStored events of the workers, counted so that a block is announced
    once every rank that must store its part did (TP replication aside)."""

    def __init__(self, num_workers: int, factors: tuple[int, ...] = (1,)) -> None:
        self._events: Counter[KVCacheEvent] = Counter()
        self._num_workers = num_workers
        self._factors = factors

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self._events.update(events)

    def _common(self, ev: KVCacheEvent, n: int) -> bool:
        g = getattr(ev, "group_idx", None)
        f = self._factors[g] if isinstance(g, int) and 0 <= g < len(self._factors) else 1
        return n * f >= self._num_workers

    def pop_common_events(self) -> list[KVCacheEvent]:
        out = [e for e, n in self._events.items() if self._common(e, n)]
        for e in out:
            del self._events[e]
        return out

    def aggregate(self) -> "KVPoolKVEvents":
        common = self.pop_common_events()
        self._events.clear()
        self._events.update(common)
        self._num_workers = 1
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._num_workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self._events.elements())

    def get_number_of_workers(self) -> int:
        return self._num_workers

    def clear_events(self) -> None:
        self._events.clear()
        self._num_workers = 1

    def has_events(self) -> bool:
        return bool(self._events)


# ------------------------------------------------------------------ the two halves

def _project(block_ids: Optional[tuple[list[int], ...]], ids: tuple[int, ...]) \
        -> Optional[tuple[list[int], ...]]:
    if not block_ids:
        return None
    return tuple(block_ids[i] for i in ids)


class _Scheduler:
    """The scheduler half: vLLM's Request / SchedulerOutput -> ConnSched."""

    def __init__(self, s: _Setup) -> None:
        self._s = s
        self._c = _native.ConnSched(s.conn)
        self._reqs: dict[str, tuple["Request", _native.ConnRequest]] = {}
        self._gmap = {g: i for i, g in enumerate(s.store_group_ids)}
        # vLLM group ids of the Mamba ("align") groups: their boundary states
        self._mamba = {g for g, i in self._gmap.items()
                       if s.conn["groups"][i]["kind"] == "mamba"}
        self._pool: Any = None  # vLLM's GPU BlockPool (bind_gpu_block_pool)
        # Boundary-state blocks referenced until the request is finished
        # sending: align-mode Mamba tables free superseded states while the
        # request runs, and a store may still be reading one.
        self._pins: dict[str, list[Any]] = {}

    def _req(self, request: "Request") -> _native.ConnRequest:
        e = self._reqs.get(request.request_id)
        if e is None or e[0] is not request:
            e = (request, _native.ConnRequest(request.request_id, request.num_prompt_tokens))
            self._reqs[request.request_id] = e
        toks = getattr(request, "_all_token_ids", None)
        e[1].sync(toks if isinstance(toks, list) else request.all_token_ids,
                  request.block_hashes, request.num_computed_tokens)
        return e[1]

    def _known(self, req_id: str) -> _native.ConnRequest:
        e = self._reqs.get(req_id)
        if e is None:
            raise RuntimeError(f"KVPoolConnector: request {req_id} scheduled without a lookup")
        return self._req(e[0])

    def lookup(self, request: "Request", num_computed_tokens: int) -> tuple[Optional[int], bool]:
        n, load_async = self._c.lookup(self._req(request), num_computed_tokens)
        return (None, False) if n is None else (int(n), bool(load_async))

    def after_alloc(self, request: "Request", blocks: "KVCacheBlocks", n_ext: int) -> None:
        ids = _project(blocks.get_block_ids(), self._s.store_group_ids) if n_ext else None
        self._c.update_state_after_alloc(self._req(request), ids, n_ext)

    def build_meta(self, so: "SchedulerOutput") -> KVPoolConnectorMetadata:
        ids = self._s.store_group_ids
        nst = so.num_scheduled_tokens
        # vLLM's v2 model runner sends a request resumed after preemption as a
        # new one whose prefill_token_ids are prompt + generated tokens: its
        # prefill (what is saved) ends there, as in vLLM 0.33's connector.
        new = [(self._known(r.req_id), nst[r.req_id], _project(r.block_ids, ids),
                len(r.prefill_token_ids) if r.prefill_token_ids is not None else None)
               for r in so.scheduled_new_reqs]
        cd = so.scheduled_cached_reqs
        resumed = cd.resumed_req_ids
        cached = [(self._known(rid), rid in resumed, nst.get(rid, 0),
                   _project(cd.new_block_ids[i], ids)) for i, rid in enumerate(cd.req_ids)]
        preempted = tuple(so.preempted_req_ids or ())
        tails = []
        bs = getattr(so, "kv_connector_block_state", None)
        for rid, offs in ((bs.boundary_state_offloads or {}).items() if bs else ()):
            t = [(self._gmap[g], b, n) for g, b, n in offs if g in self._mamba]
            if t and rid in self._reqs:
                tails.append((rid, t))
                self._pin(rid, [b for _, b, _ in t])
        step = self._c.build_meta(new, cached, preempted, tuple(so.finished_req_ids), tails)
        return KVPoolConnectorMetadata(step=step, preempted=preempted)

    def bind_pool(self, pool: Any) -> None:
        self._pool = pool

    def _pin(self, req_id: str, block_ids: list[int]) -> None:
        """One reference per handed-off block, so an align-mode Mamba state
        freed by the request cannot be reallocated under a running store."""
        if self._pool is None or not block_ids:
            return
        blocks = [self._pool.blocks[b] for b in block_ids if b]
        self._pool.touch(blocks)
        self._pins.setdefault(req_id, []).extend(blocks)

    def unpin(self, req_ids: Iterable[str]) -> None:
        """Drops the references of requests every rank finished sending."""
        for rid in req_ids:
            blocks = self._pins.pop(rid, None)
            if blocks and self._pool is not None:
                self._pool.free_blocks(reversed(blocks))

    def finished_tail(self, request: "Request", block_ids: tuple[list[int], ...],
                      offloads: list[tuple[int, int, int]]) -> None:
        """register_finished_partial_tail: the finish-time boundary states,
        stored by the next step (the request_finished that follows delays the
        free until the store is done)."""
        if not offloads or any(g not in self._mamba for g, _, _ in offloads) \
                or request.request_id not in self._reqs:
            return
        t = [(self._gmap[g], b, n) for g, b, n in offloads]
        if self._c.register_finished_tail(request.request_id,
                                          _project(block_ids, self._s.store_group_ids), t):
            self._pin(request.request_id, [b for _, b, _ in t])

    def finished(self, request: "Request", block_ids: tuple[list[int], ...]) -> bool:
        delay = self._c.request_finished(request.request_id,
                                         _project(block_ids, self._s.store_group_ids))
        self._reqs.pop(request.request_id, None)
        if not delay:  # never reported finished sending: nothing reads its blocks
            self.unpin((request.request_id,))
        return bool(delay)

    def loads_failed(self, req_ids: Iterable[str], block_ids: Iterable[int]) -> None:
        self._c.loads_failed(tuple(req_ids), list(block_ids))

    def reset(self) -> bool:
        return bool(self._c.reset_cache())

    def close(self) -> None:
        self._c.close()
        self._reqs.clear()


def _tensor_tuple(t: "torch.Tensor") -> tuple[int, int, int, tuple[int, ...], tuple[int, ...]]:
    """(base, bytes, elem_size, shape, stride) of one KV tensor: bytes covers the
    view's blocks (its largest shape*stride), clipped to its storage."""
    es = t.element_size()
    base = t.data_ptr()
    extent = max(n * s for n, s in zip(t.shape, t.stride())) * es
    st = t.untyped_storage()
    avail = st.data_ptr() + st.nbytes() - base
    return base, min(extent, avail), es, tuple(t.shape), tuple(t.stride())


class _Worker:
    """One rank's worker half: vLLM's tensors and per-step calls -> ConnWorker."""

    def __init__(self, s: _Setup, kv_cache_config: KVCacheConfig) -> None:
        self._s = s
        self._kcc = kv_cache_config
        self._w: Optional[_native.ConnWorker] = None
        self._events: deque[Any] = deque(maxlen=128)  # CUDA events the fence may wait on
        self._cuda = False
        self._pool_seen = dict.fromkeys(_POOL_COUNTERS, 0)  # counters already reported
        self._pool_unavailable = 0                         # the state last reported

    def register(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        if self._w is not None:
            raise RuntimeError("KVPoolConnector: register_kv_caches called twice")
        order: list[str] = []
        for gid in self._s.store_group_ids:
            order += [n for n in self._kcc.kv_cache_groups[gid].layer_names if n in kv_caches]
        if not order:
            raise ValueError("KVPoolConnector: no KV tensor of a stored group was registered")
        # a Mamba layer's value is a list of views (conv, ssm state) of one storage
        tensors = [v[0] if isinstance(v, (list, tuple)) else v
                   for v in (kv_caches[n] for n in order)]
        self._cuda = any(t.is_cuda for t in tensors)
        cfg = dict(self._s.conn, num_blocks=int(self._kcc.num_blocks),
                   fence="cuda" if self._cuda else None)
        self._w = _native.ConnWorker(cfg)
        self._w.register_kv_caches([_tensor_tuple(t) for t in tensors])

    def fence(self) -> None:
        """After the step's forward was issued: the event the store thread waits on."""
        if self._w is None or not self._cuda:
            return
        import torch
        ev = torch.cuda.Event()
        ev.record()
        self._events.append(ev)
        self._w.set_fence_event(self._w.step, ev.cuda_event)

    def finished(self, meta: Optional[KVPoolConnectorMetadata],
                 finished_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        if self._w is None:
            return None, None
        snd, rcv = self._w.get_finished(meta.step if meta is not None else None,
                                        tuple(finished_ids))
        return (set(snd) or None), (set(rcv) or None)

    def preempt(self, ids: Iterable[str]) -> None:
        ids = tuple(ids)
        if self._w is not None and ids:
            self._w.handle_preemptions(ids)

    def load_errors(self) -> tuple[set[int], set[str]]:
        """(blocks, requests) whose load failed since the last call."""
        if self._w is None:
            return set(), set()
        return set(self._w.load_errors()), set(self._w.load_failed())

    def stats(self) -> Optional[KVPoolConnectorStats]:
        if self._w is None:
            return None
        d = self._w.take_stats()
        # the pool's availability: reported on every call while this rank is without
        # the pool (so the max over ranks never reads 0 while one is down), when it
        # changed, when something was done without it, or alongside the other counters
        st = self._w.pool_status()
        pool = {f: int(st[f]) - self._pool_seen[f] for f in _POOL_COUNTERS}
        unavailable = 0 if st["available"] else 1
        if d or any(pool.values()) or unavailable or unavailable != self._pool_unavailable:
            self._pool_seen = {f: int(st[f]) for f in _POOL_COUNTERS}
            self._pool_unavailable = unavailable
            d = dict(d or {}, pool=dict(pool, unavailable=unavailable))
        return KVPoolConnectorStats(data=d) if d else None

    def kv_events(self) -> Optional[KVPoolKVEvents]:
        if self._w is None or not self._s.kv_events:
            return None
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as ext

        evs = KVPoolKVEvents(num_workers=1, factors=self._s.factors)
        gids = self._s.store_group_ids
        evs.add_events([BlockStored(block_hashes=[ext(h)],
                                    parent_block_hash=ext(parent) if parent is not None else None,
                                    token_ids=list(toks or ()), block_size=bs, lora_id=None,
                                    medium="kvpool", lora_name=None, group_idx=gids[g])
                        for g, bs, h, parent, _s, _e, toks in self._w.take_events()])
        return evs

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


# ------------------------------------------------------------------ the connector

class KVPoolConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM's KV connector on kvpool: prompt-prefix KV stored in and loaded
    from a kvpool pool shared by every engine instance (see module docs)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        check_vllm_api()
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._setup = _setup(vllm_config, kv_cache_config, role)
        self._sched: Optional[_Scheduler] = None
        self._worker: Optional[_Worker] = None
        self._events: Optional[KVPoolKVEvents] = None
        self._load_error_blocks: set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _Scheduler(self._setup)
        else:
            self._worker = _Worker(self._setup, kv_cache_config)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        return False

    # ---- scheduler side
    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[Optional[int], bool]:
        assert self._sched is not None
        return self._sched.lookup(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int) -> None:
        assert self._sched is not None
        self._sched.after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self._sched is not None
        return self._sched.build_meta(scheduler_output)

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, Optional[dict[str, Any]]]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, Optional[dict[str, Any]]]:
        assert self._sched is not None
        return self._sched.finished(request, block_ids), None

    def register_finished_partial_tail(self, request: "Request",
                                       block_ids: tuple[list[int], ...],
                                       partial_tail_offloads: list[tuple[int, int, int]]) -> bool:
        assert self._sched is not None
        self._sched.finished_tail(request, block_ids, partial_tail_offloads)
        # vLLM 0.33's answer: the store holds its own block references (here:
        # request_finished's delay_free and the pins), so cleanup need not wait.
        return False

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        super().bind_gpu_block_pool(gpu_block_pool)
        if self._sched is not None:
            self._sched.bind_pool(gpu_block_pool)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        assert self._sched is not None
        if connector_output.finished_sending:
            self._sched.unpin(connector_output.finished_sending)
        failed, bad = connector_output.failed_recving, connector_output.invalid_block_ids
        if failed or bad:
            self._sched.loads_failed(failed or (), bad or ())
        evs = connector_output.kv_cache_events
        if not isinstance(evs, KVPoolKVEvents) or not evs.has_events():
            return
        if self._events is None:
            self._events = KVPoolKVEvents(num_workers=self._setup.num_workers,
                                          factors=self._setup.factors)
        self._events.add_events(evs.get_all_events())

    def take_events(self) -> Iterable[KVCacheEvent]:
        if self._events is not None:
            yield from self._events.pop_common_events()

    def reset_cache(self) -> Optional[bool]:
        assert self._sched is not None
        self._events = None
        return self._sched.reset()

    # ---- worker side
    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        assert self._worker is not None
        self._worker.register(kv_caches)

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        assert self._worker is not None
        if isinstance(kv_connector_metadata, KVPoolConnectorMetadata):
            self._worker.preempt(kv_connector_metadata.preempted)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        return  # loads are queued with the step's stores in get_finished

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: a loading request is not in the batch

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # stores read whole blocks after the forward (get_finished)

    def wait_for_save(self) -> None:
        assert self._worker is not None
        self._worker.fence()

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[Optional[set[str]], Optional[set[str]]]:
        assert self._worker is not None
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if meta is not None and not isinstance(meta, KVPoolConnectorMetadata):
            raise TypeError(f"KVPoolConnector got {type(meta).__name__} metadata")
        return self._worker.finished(meta, finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """get_finished, plus the failed loads: per block with one KV-cache group
        (vLLM recomputes just those blocks), per request with several (block ids
        are not unique across groups; vLLM recomputes the request's prefix)."""
        snd, rcv = self.get_finished(finished_req_ids)
        blocks, reqs = self._worker.load_errors() if self._worker else (set(), set())
        multi = len(self._kv_cache_config.kv_cache_groups) > 1
        self._load_error_blocks = set() if multi else blocks
        return KVConnectorTransferResults(finished_sending=set(snd or ()),
                                          finished_recving=set(rcv or ()),
                                          failed_recving=reqs if multi else set())

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks, self._load_error_blocks = self._load_error_blocks, set()
        if self._worker is not None and len(self._kv_cache_config.kv_cache_groups) == 1:
            blocks |= self._worker.load_errors()[0]  # a caller of get_finished alone
        return blocks

    def get_kv_connector_stats(self) -> Optional[KVConnectorStats]:
        return self._worker.stats() if self._worker is not None else None

    def get_kv_connector_kv_cache_events(self) -> Optional[KVPoolKVEvents]:
        return self._worker.kv_events() if self._worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict[str, Any]] = None
                                 ) -> Optional[KVConnectorStats]:
        return KVPoolConnectorStats(data=data) if data is not None else KVPoolConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: "VllmConfig",
                           metric_types: dict[type[PromMetric], type[PromMetricT]],
                           labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]
                           ) -> Optional[KVConnectorPromMetrics]:
        return KVPoolPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.close()
        if self._sched is not None:
            self._sched.close()
