"""kvpool.fingerprint -- the configuration fingerprint of a vLLM engine.

Every pool key of kvpool.vllm carries ``@cfg:<fp>`` (src/connector/keys.h), so
engines whose KV bytes differ never load each other's blocks: another model
or other weights under the same directory name, another model or KV dtype,
quantization, KV layout, block or hash block size, KV-cache group specs or
parallel layout.

Contract of ``config_fingerprint``:
  * The fingerprint is the first 16 hex digits of BLAKE2b over the canonical
    JSON (sorted keys, no spaces) of the description it returns: the same
    configuration gives the same fingerprint in every process, on every rank
    (TP, PP, PCP, DCP) of an engine and on every host where the model path
    names the same files. Nothing rank-specific (layer names, per-stage layer
    counts, block counts) and nothing process-specific (Python's hash(),
    object ids) enters it.
  * Weights: a local directory (or single file) is fingerprinted by the names
    and sizes of its weight files (top level: ``*.safetensors``, ``*.bin``,
    ``*.pt``, ``*.pth``, ``*.gguf``, ``*.index.json``) and BLAKE2b of the first
    and last MiB of each -- cheap for any model size, different for two weight
    sets of the same shapes unless they differ only in the middle of every
    file they share. Cached per path for the life of the process. A hub id
    that is not a local path is resolved to its snapshot in the local Hugging
    Face cache without network access (huggingface_hub, when installed); if
    that fails the id and revision stand for the weights.
  * Model identity: a local model by its directory's basename (what the key
    names anyway) and its weights, not its full path -- so every host and
    process with the same files shares the cache, wherever they lie; a hub id
    by the id itself, its revision and code revision.
  * The description returned is what is hashed plus ``path`` (the model as
    vLLM was given it, for people reading it), which is not hashed.
  * Not covered: anything that changes the KV bytes without changing what is
    listed above -- e.g. weights rewritten in place while a process runs (the
    cache), a change in the middle of a weight file only, a custom attention
    kernel choosing another numerical path, or two vLLM versions computing
    different KV for the same configuration. The fingerprint is a guard
    against mixing configurations, not a content hash of the model.
"""
from __future__ import annotations

import dataclasses
import enum
import fractions
import hashlib
import json
import os
import re
import threading
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["config_fingerprint", "weights_fingerprint", "FINGERPRINT_VERSION"]

FINGERPRINT_VERSION = 1  # bump when the inputs change: every key changes with it
_EDGE = 1 << 20          # bytes hashed at each end of a weight file
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")

_weights_cache: dict[str, dict[str, Any]] = {}
_weights_lock = threading.Lock()


def _plain(x: Any) -> Any:
    """x as JSON-able data that is the same in every process (no ids, no hash())."""
    if isinstance(x, enum.Enum):  # before int / str: IntEnum, str enums
        return f"{type(x).__name__}.{x.name}"
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return repr(x)
    if isinstance(x, fractions.Fraction):
        return str(x)
    if type(x).__module__ == "torch" and type(x).__name__ == "dtype":
        return str(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        out: dict[str, Any] = {"type": type(x).__name__}
        for f in dataclasses.fields(x):
            out[f.name] = _plain(getattr(x, f.name))
        return out
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return sorted((_plain(v) for v in x), key=_canon)
    return f"{type(x).__qualname__}:{_ADDR.sub('', str(x))}"


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _spec(spec: Any) -> Any:
    """A KV-cache group's spec, rank-invariant: a UniformTypeKVCacheSpecs is its
    distinct per-layer specs (sorted), without layer names or counts (they
    differ between pipeline stages)."""
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, Mapping):
        out = {k: v for k, v in _plain(spec).items() if k != "kv_cache_specs"}
        uniq = {_canon(_plain(s)): _plain(s) for s in inner.values()}
        out["kv_cache_specs"] = [uniq[k] for k in sorted(uniq)]
        return out
    return _plain(spec)


def _edge_digest(path: str, size: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= 2 * _EDGE:
            h.update(f.read())
        else:
            h.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


def _weight_files(path: str) -> list[str]:
    """The weight files under path (in subdirectories too, as some checkpoints
    lay them out), sorted by their path relative to it."""
    if os.path.isfile(path):
        return [path]
    out = []
    for d, dirs, names in os.walk(path, followlinks=True):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        out += [os.path.join(d, n) for n in names if n.endswith(_WEIGHT_SUFFIXES)]
    return sorted((f for f in out if os.path.isfile(f)), key=lambda f: os.path.relpath(f, path))


def _hub_snapshot(model: str, revision: str | None) -> str | None:
    """The local snapshot directory of a hub id, without network; None if unknown."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return str(snapshot_download(repo_id=model, revision=revision, local_files_only=True))
    except Exception:  # not cached, offline, malformed id: the id stands for itself
        return None


def weights_fingerprint(model: str, revision: str | None = None) -> dict[str, Any]:
    """{"source", "files", "bytes", "digest"} of the weights `model` names (see
    the module's contract); cached per (model, revision) in this process."""
    key = f"{model}\0{revision or ''}"
    with _weights_lock:
        hit = _weights_cache.get(key)
    if hit is not None:
        return dict(hit)
    path = os.path.expanduser(model)
    source = "local"
    if not os.path.exists(path):
        snap = _hub_snapshot(model, revision)
        if snap is None:
            out = {"source": "hub-id", "files": 0, "bytes": 0, "digest": ""}
            with _weights_lock:
                _weights_cache[key] = out
            return dict(out)
        path, source = snap, "hf-cache:" + os.path.basename(snap.rstrip("/"))
    h = hashlib.blake2b(digest_size=16)
    total = 0
    files = _weight_files(path)
    for f in files:
        st = os.stat(f)  # a symlink (the HF cache's blobs) is followed
        total += st.st_size
        name = os.path.relpath(f, path) if os.path.isdir(path) else os.path.basename(f)
        h.update(_canon([name, st.st_size, _edge_digest(f, st.st_size)]).encode())
    out = {"source": source, "files": len(files), "bytes": total, "digest": h.hexdigest()}
    with _weights_lock:
        _weights_cache[key] = out
    return dict(out)


# A spec's fields that hold one rank's share of the KV (they follow the TP size)
_PER_RANK_FIELDS = ("num_kv_heads", "page_size_bytes", "page_size_padded", "real_page_size_bytes")


def _strip_per_rank(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip_per_rank(v) for k, v in x.items() if k not in _PER_RANK_FIELDS}
    if isinstance(x, list):
        return [_strip_per_rank(v) for v in x]
    return x


def _spec_for(spec: Any, tp_independent: bool) -> Any:
    """_spec, without its per-rank fields in the TP-independent layout."""
    s = _spec(spec)
    return _strip_per_rank(s) if tp_independent else s


def _hf_config_digest(model_config: Any) -> str:
    """BLAKE2b of the model's HF config (overrides applied), minus the fields
    that name the path or the transformers release."""
    cfg = getattr(model_config, "hf_config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return ""
    d = {k: v for k, v in cfg.to_dict().items()
         if k not in ("_name_or_path", "transformers_version", "_commit_hash")}
    return hashlib.blake2b(_canon(_plain(d)).encode(), digest_size=16).hexdigest()


def _kv_layout(cache_config: Any) -> str | None:
    get = getattr(cache_config, "get_resolved_kv_cache_layout", None)
    if get is None:
        return None
    try:
        return _plain(get())
    except Exception:  # not resolvable in this process (no backend chosen): not an input
        return None


def config_fingerprint(vllm_config: Any, kv_cache_config: Any, groups: Sequence[Mapping[str, Any]],
                       *, block_size: int, hash_block_size: int,
                       group_ids: Iterable[int] | None = None,
                       tp_independent: bool = False) -> tuple[str, dict[str, Any]]:
    """(fingerprint, description) of an engine's configuration.

    vllm_config: vLLM's VllmConfig; kv_cache_config: its KVCacheConfig (this
    rank's); groups: the connector's group dicts (kvpool.vllm._group_of plus
    num_kv_heads), in the order of group_ids (default: kv_cache_config.
    prefix_cacheable_group_ids), the vLLM groups the pool stores;
    block_size / hash_block_size: the scheduler's and the hash's block sizes
    (resolve_kv_cache_block_sizes); tp_independent: the connector stores one
    object per KV head (the TP-independent layout), so the fingerprint names
    that layout and the total KV heads instead of the TP size, and the
    specs' per-rank fields (num_kv_heads, page sizes: a rank's share) are
    left out -- engines of any TP size get the same fingerprint. The
    description is JSON-able; the fingerprint is 16 lower-case hex digits.
    """
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    par = vllm_config.parallel_config
    ids = list(group_ids if group_ids is not None else kv_cache_config.prefix_cacheable_group_ids)
    if len(ids) != len(groups):
        raise ValueError(f"config_fingerprint: {len(groups)} groups for {len(ids)} group ids")
    model = str(mc.model).rstrip("/") or str(mc.model)
    revision = getattr(mc, "revision", None)
    local = os.path.exists(os.path.expanduser(model))
    desc: dict[str, Any] = {
        "version": FINGERPRINT_VERSION,
        "model": os.path.basename(model) if local else model,
        "revision": revision,
        "code_revision": getattr(mc, "code_revision", None),
        "weights": weights_fingerprint(model, revision),
        "hf_config": _hf_config_digest(mc),
        "dtype": _plain(getattr(mc, "dtype", None)),
        "kv_cache_dtype": _plain(getattr(cc, "cache_dtype", None)),
        "quantization": _plain(getattr(mc, "quantization", None)),
        "kv_cache_layout": _kv_layout(cc),
        "block_size": int(block_size),
        "hash_block_size": int(hash_block_size),
        "groups": [{"connector": _plain(dict(g)),
                    "spec": _spec_for(kv_cache_config.kv_cache_groups[i].kv_cache_spec,
                                      tp_independent)}
                   for g, i in zip(groups, ids)],
        "layout": {
            "tp": "any (per KV head)" if tp_independent else int(par.tensor_parallel_size),
            "pp": int(par.pipeline_parallel_size),
            "pcp": int(getattr(par, "prefill_context_parallel_size", 1) or 1),
            "dcp": int(getattr(par, "decode_context_parallel_size", 1) or 1),
            "num_kv_heads": int(mc.get_total_num_kv_heads()),
        },
    }
    fp = hashlib.blake2b(_canon(desc).encode()).hexdigest()[:16]
    desc["path"] = str(mc.model)  # not hashed (see the module's contract)
    return fp, desc
