"""kvpool: a KV-cache pool for LLM serving.

``kvpool.Client`` is the Pythonic client of a kvpool cluster (a master and
storage nodes: ``kvpool serve``). It is a thin layer over the C client
(``kvpool._native``, include/kvpool.h): argument lists are parsed in C, every
blocking call releases the GIL, and a client may be shared between threads.

Values are ``bytes`` or any object with the buffer protocol (bytearray,
memoryview, numpy arrays; CPU torch tensors too), or integer addresses of
memory registered with ``register_buffer``. Single-key calls raise
``kvpool.Error`` (a subclass per common code); batch calls answer per key:
the value, or the ``Error`` for that key, returned rather than raised.

The C core's log lines are ``logging`` records on ``kvpool.<module>``
loggers ("kvpool.client", "kvpool.node", ...); ``kvpool.set_log_level``
sets both the ``kvpool`` logger's level and the core's (kvpool/_log.py).

``kvpool.mooncake`` is the drop-in for Mooncake's ``MooncakeDistributedStore``;
``kvpool.install_as_mooncake()`` makes ``import mooncake.store`` load it.
"""
from __future__ import annotations

import array
import builtins
import json
import operator
import os
import struct
from types import TracebackType
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

from . import _log, _native
from ._log import set_log_level

__all__ = [
    "Client", "Error", "ObjectNotFoundError", "ObjectExistsError", "NoSpaceError",
    "TimeoutError", "ChecksumMismatchError", "InvalidParamsError", "InvalidKeyError",
    "BufferTooSmallError", "ObjectHasLeaseError", "TransferError", "ConnectionError",
    "ClosedError", "ConfigError", "AuthError", "NotSupportedError", "codes",
    "install_as_mooncake", "set_log_level", "__version__", "Block", "HashPrefix",
    "KVSnapshot", "engine_hash",
]

__version__: str = _native.version

#: Every error code of the C library by name ("OBJECT_NOT_FOUND": -704, ...).
codes: dict[str, int] = dict(_native.codes)

Config = Union[None, str, "os.PathLike[str]", Mapping[str, Any]]
Buffer = Any  # bytes, bytearray, memoryview, numpy array, CPU torch tensor
Value = Union[Buffer, Sequence[Buffer]]  # one buffer, or the pieces of one value


# ------------------------------------------------------------------ errors

class Error(Exception):
    """A kvpool error: ``.code`` (negative, Mooncake's number where the meaning
    is shared) and ``.name`` ("OBJECT_NOT_FOUND")."""

    code: int = -1

    def __init__(self, code: int, message: Optional[str] = None) -> None:
        self.code = code
        self.name = _native.err_name(code)
        self.message = message or _native.strerror(code)
        super().__init__(f"{self.name} ({code}): {self.message}")

    @staticmethod
    def from_code(code: int, message: Optional[str] = None) -> "Error":
        """The Error subclass instance for a negative code."""
        return _BY_CODE.get(code, Error)(code, message)


class ObjectNotFoundError(Error, KeyError):
    code = codes["OBJECT_NOT_FOUND"]

    def __str__(self) -> str:  # KeyError would print the repr of args
        return Exception.__str__(self)


class ObjectExistsError(Error):
    code = codes["OBJECT_ALREADY_EXISTS"]


class NoSpaceError(Error, MemoryError):
    code = codes["NO_AVAILABLE_HANDLE"]


class TimeoutError(Error, builtins.TimeoutError):
    code = codes["RPC_TIMEOUT"]


class ChecksumMismatchError(Error):
    code = codes["CHECKSUM_MISMATCH"]


class InvalidParamsError(Error, ValueError):
    code = codes["INVALID_PARAMS"]


class InvalidKeyError(Error, ValueError):
    code = codes["INVALID_KEY"]


class BufferTooSmallError(Error, ValueError):
    code = codes["BUFFER_OVERFLOW"]


class ObjectHasLeaseError(Error):
    code = codes["OBJECT_HAS_LEASE"]


class TransferError(Error):
    code = codes["TRANSFER_FAIL"]


class ConnectionError(Error, builtins.ConnectionError):
    code = codes["RPC_FAIL"]


class ClosedError(Error):
    code = codes["CLOSED"]


class ConfigError(Error, ValueError):
    code = codes["CONFIG"]


class AuthError(Error, PermissionError):
    code = codes["AUTH"]


class NotSupportedError(Error, NotImplementedError):
    code = codes["NOT_SUPPORTED"]


_BY_CODE: dict[int, type[Error]] = {
    cls.code: cls
    for cls in (ObjectNotFoundError, ObjectExistsError, NoSpaceError, TimeoutError,
                ChecksumMismatchError, InvalidParamsError, InvalidKeyError, BufferTooSmallError,
                ObjectHasLeaseError, TransferError, ConnectionError, ClosedError, ConfigError,
                AuthError, NotSupportedError)
}


def _check(r: int) -> int:
    if r < 0:
        raise Error.from_code(r)
    return r


def _per_key(results: Sequence[Any]) -> list[Any]:
    """Negative ints become Error instances; everything else stays."""
    return [Error.from_code(r) if isinstance(r, int) and r < 0 else r for r in results]


# ------------------------------------------------------------ conversions

def config_text(config: Config) -> str:
    """What kvp_client_open takes: JSON text, a file path, or "" (the file
    named by $KVPOOL_CONFIG / $MOONCAKE_CONFIG_PATH, else defaults)."""
    if config is None:
        return ""
    if isinstance(config, Mapping):
        return json.dumps({k: v for k, v in config.items()})
    if isinstance(config, (str, os.PathLike)):
        return os.fspath(config)
    raise builtins.TypeError(
        f"config must be a dict, JSON text, a file path or None, not {type(config).__name__}")


def _torch_view(v: Any) -> Any:
    """A CPU torch tensor as a writable byte view of its memory (no copy)."""
    mod = type(v).__module__ or ""
    if not mod.startswith("torch") or not hasattr(v, "data_ptr"):
        return v
    if v.device.type != "cpu":
        raise InvalidParamsError(codes["INVALID_PARAMS"],
                                 f"a {v.device.type} tensor among host values: device tensors go "
                                 "by address (register_buffer(tensor) once; then a call whose "
                                 "values are all device tensors, or put_from / get_into_ptr)")
    if not v.is_contiguous():
        raise InvalidParamsError(codes["INVALID_PARAMS"], "tensor must be contiguous")
    import torch  # only reached with a tensor in hand
    return v.detach().reshape(-1).view(torch.uint8).numpy()


def _torch_fix(values: Sequence[Any]) -> list[Any]:
    """values with every torch tensor (or tensor piece) made a buffer."""
    out: list[Any] = []
    for v in values:
        if isinstance(v, (list, tuple)):
            out.append([_torch_view(p) for p in v])
        else:
            out.append(_torch_view(v))
    return out


def _is_device(v: Any) -> bool:
    return bool(getattr(v, "is_cuda", False))


def _device_addresses(values: Sequence[Any]) -> Optional[tuple[list[Any], list[Any]]]:
    """(ptrs, sizes) when every value (or piece) is a device tensor, else None."""
    ptrs: list[Any] = []
    sizes: list[Any] = []
    for v in values:
        pieces = v if isinstance(v, (list, tuple)) else [v]
        if not pieces or not all(_is_device(p) for p in pieces):
            return None
        if not all(p.is_contiguous() for p in pieces):
            raise InvalidParamsError(codes["INVALID_PARAMS"], "tensor must be contiguous")
        a = [_address_of(p) for p in pieces]
        ptrs.append([x for x, _ in a] if isinstance(v, (list, tuple)) else a[0][0])
        sizes.append([n for _, n in a] if isinstance(v, (list, tuple)) else a[0][1])
    return ptrs, sizes


def _with_buffers(fn: Any, keys: Sequence[Any], values: Sequence[Any], ptr_fn: Any = None,
                  **kw: Any) -> Any:
    """fn(keys, values): the C parser first; on a TypeError, once more with
    torch tensors converted (the only common values without the buffer
    protocol), so plain buffers never pay for a Python loop. Values that are
    all device (CUDA) tensors go by address through ptr_fn: their memory
    must be registered (register_buffer), where its kind is found once."""
    try:
        return fn(keys, values, **kw)
    except builtins.TypeError:
        dev = _device_addresses(values) if ptr_fn is not None else None
        if dev is not None:
            return ptr_fn(keys, dev[0], dev[1], **kw)
        fixed = _torch_fix(values)
        return fn(keys, fixed, **kw)


# ------------------------------------------------------------------ blocks

class Block(NamedTuple):
    """The engine KV block a key holds one part of (put_batch's ``blocks``):
    the master indexes it for ``lookup_hashes`` and announces it in its KV
    events. ``hash``/``parent``: the engine's block hashes in vLLM's int
    form (``engine_hash``); ``parts``: the objects that make the block (each
    rank stores its own); ``group``: the KV cache group (0..31)."""
    hash: int
    parent: Optional[int]
    block_size: int
    parts: int = 1
    group: int = 0


class HashPrefix(NamedTuple):
    """Leading blocks of a chain with every part in DRAM, on disk, in either."""
    dram: int
    disk: int
    any: int


class KVSnapshot(NamedTuple):
    """A tenant's blocks as the KV events announced them as of batch ``seq``
    of its stream (0: the master publishes no events); ``blocks``:
    (hash, group, "dram" | "disk"), one per block and tier."""
    seq: int
    blocks: list[tuple[int, int, str]]


_BLOCK = struct.Struct("<QQIHBB")  # kvp_block (include/kvpool.h)
_U64 = (1 << 64) - 1


def engine_hash(block_hash: Union[bytes, int]) -> int:
    """vLLM's int form of a block hash (its KV events with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): the last 8 bytes, big-endian."""
    if isinstance(block_hash, int):
        return block_hash & _U64
    return int.from_bytes(block_hash, "big") & _U64


def _pack_blocks(blocks: Sequence[Optional[Block]]) -> bytes:
    out = bytearray(_BLOCK.size * len(blocks))
    for i, b in enumerate(blocks):
        if b is None:
            _BLOCK.pack_into(out, i * _BLOCK.size, 0, 0, 0, 0, 0, _native.BLOCK_NONE)
            continue
        has_parent = b.parent is not None
        _BLOCK.pack_into(out, i * _BLOCK.size, b.hash & _U64,
                         (b.parent & _U64) if has_parent else 0, b.block_size, b.parts, b.group,
                         _native.BLOCK_PARENT if has_parent else 0)
    return bytes(out)


# ------------------------------------------------------------------ client

class Client:
    """A connection to a kvpool cluster.

    ``config``: a dict of configuration keys (docs/CONFIG.md; Mooncake's names
    accepted), JSON text, the path of a JSON file, or None for the file named
    by $KVPOOL_CONFIG / $MOONCAKE_CONFIG_PATH. Use as a context manager, or
    call ``close()``. Safe to share between threads.
    """

    def __init__(self, config: Config = None) -> None:
        self._owners: dict[int, Any] = {}  # buffer objects registered by reference
        try:
            self._c = _native.Client(config_text(config))
        except _native.OpenError as e:
            code, msg = e.args
            raise Error.from_code(code, msg) from None
        finally:
            _log.flush()  # what the open logged, before the caller goes on

    # lifecycle
    def close(self) -> None:
        """Waits for calls in flight, then closes; later calls raise ClosedError.
        The core's log lines written until then are emitted (``logging``)."""
        self._c.close()
        _log.flush()

    @property
    def closed(self) -> bool:
        return bool(self._c.closed)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, t: Optional[type[BaseException]], v: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    @property
    def segment_name(self) -> str:
        """This client's embedded segment ("host:port"), "" when it has none."""
        return str(self._c.segment_name)

    @property
    def tenant(self) -> str:
        return str(self._c.tenant)

    @property
    def disk_reads(self) -> int:
        """How many values this client read that were only on a node's SSD
        tier when asked for (staged back into DRAM by the node)."""
        return int(self._c.disk_reads)

    # put
    def put(self, key: str, value: Value, *, replica_num: Optional[int] = None,
            pin: bool = False, preferred_segment: Optional[str] = None) -> None:
        """Stores value (a buffer, or a list of pieces gathered into one value).
        Keys are immutable: putting an existing key succeeds and keeps the
        stored value."""
        r = self.put_batch([key], [value], replica_num=replica_num, pin=pin,
                           preferred_segment=preferred_segment)[0]
        if r is not None:
            raise r

    def put_batch(self, keys: Sequence[str], values: Sequence[Value], *,
                  replica_num: Optional[int] = None, pin: bool = False,
                  preferred_segment: Optional[str] = None,
                  blocks: Optional[Sequence[Optional[Block]]] = None) -> list[Optional[Error]]:
        """Per key: None (stored) or its Error. ``blocks``: per key, the
        engine block it is a part of (or None)."""
        if blocks is not None and len(blocks) != len(keys):
            raise InvalidParamsError(codes["INVALID_PARAMS"], "one block (or None) per key")
        res = _with_buffers(self._c.put_buffers, keys, values, self._c.put_ptrs,
                            replica_num=replica_num,
                            flags=_native.PUT_HARD_PIN if pin else 0,
                            preferred=preferred_segment,
                            blocks=_pack_blocks(blocks) if blocks is not None else None)
        return [None if r >= 0 else Error.from_code(r) for r in res]

    def put_from(self, key: str, ptr: Union[int, Sequence[int]], size: Union[int, Sequence[int]],
                 *, replica_num: Optional[int] = None, pin: bool = False,
                 preferred_segment: Optional[str] = None) -> None:
        """Stores size bytes at a registered address (or lists: pieces)."""
        r = self.put_from_batch([key], [ptr], [size], replica_num=replica_num, pin=pin,
                                preferred_segment=preferred_segment)[0]
        if r is not None:
            raise r

    def put_from_batch(self, keys: Sequence[str], ptrs: Sequence[Any], sizes: Sequence[Any], *,
                       replica_num: Optional[int] = None, pin: bool = False,
                       preferred_segment: Optional[str] = None) -> list[Optional[Error]]:
        res = self._c.put_ptrs(keys, ptrs, sizes, replica_num=replica_num,
                               flags=_native.PUT_HARD_PIN if pin else 0,
                               preferred=preferred_segment)
        return [None if r >= 0 else Error.from_code(r) for r in res]

    # get
    def get(self, key: str) -> bytes:
        r = self._c.get_bytes([key])[0]
        if isinstance(r, int):
            raise Error.from_code(r)
        return bytes(r)

    def get_batch(self, keys: Sequence[str]) -> list[Union[bytes, Error]]:
        return _per_key(self._c.get_bytes(keys))

    def get_into(self, key: str, buffer: Value) -> int:
        """Reads the value into a writable buffer at least as large (or a list
        of pieces, filled in order). Returns the value's size."""
        return _check(_with_buffers(self._c.get_buffers, [key], [buffer], self._c.get_ptrs)[0])

    def get_into_batch(self, keys: Sequence[str], buffers: Sequence[Value]) -> list[Union[int, Error]]:
        return _per_key(_with_buffers(self._c.get_buffers, keys, buffers, self._c.get_ptrs))

    def get_into_ptr(self, key: str, ptr: Union[int, Sequence[int]],
                     size: Union[int, Sequence[int]]) -> int:
        """Reads into registered memory (one range, or lists of pieces)."""
        return _check(self._c.get_ptrs([key], [ptr], [size])[0])

    def get_into_ptr_batch(self, keys: Sequence[str], ptrs: Sequence[Any],
                           sizes: Sequence[Any]) -> list[Union[int, Error]]:
        return _per_key(self._c.get_ptrs(keys, ptrs, sizes))

    # metadata
    def exist(self, key: str) -> bool:
        return _check(self._c.exist([key])[0]) == 1

    def exist_batch(self, keys: Sequence[str]) -> list[Union[bool, Error]]:
        return [r == 1 if r >= 0 else Error.from_code(r) for r in self._c.exist(keys)]

    def tiers_batch(self, keys: Sequence[str]) -> list[Union[tuple[str, ...], Error]]:
        """Where each value is, without side effects: ("dram",), ("disk",)
        (only on a node's SSD tier: a get stages it back), ("dram", "disk"),
        or () when absent."""
        out: list[Union[tuple[str, ...], Error]] = []
        for r in self._c.tiers(keys):
            if r < 0:
                out.append(Error.from_code(r))
            else:
                out.append(tuple(n for n, b in (("dram", _native.TIER_DRAM),
                                                ("disk", _native.TIER_DISK)) if r & b))
        return out

    def exist_lease_batch(self, keys: Sequence[str]
                          ) -> list[Union[tuple[str, int], None, Error]]:
        """A lookup that holds what it answered: ("dram", size) for a value
        in DRAM, now held by the master until a get of it takes the hold
        over (and ends it) or for its lease_ttl; ("disk", size) for one only
        on a node's SSD tier (not held: a get stages it); None when absent.
        Name a key once per get that will follow (each is a hold). Raises
        Error (NOT_SUPPORTED) against a master without the operation."""
        out: list[Union[tuple[str, int], None, Error]] = []
        for code, size in self._c.exist_lease(keys):
            if code == codes["NOT_SUPPORTED"]:
                raise Error.from_code(code)
            if code < 0:
                out.append(Error.from_code(code))
            elif code == 0:
                out.append(None)
            else:
                out.append(("dram" if code == _native.TIER_DRAM else "disk", size))
        return out

    def size(self, key: str) -> int:
        return _check(self._c.sizes([key])[0])

    def size_batch(self, keys: Sequence[str]) -> list[Union[int, Error]]:
        return _per_key(self._c.sizes(keys))

    def prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys exist (one request)."""
        return _check(self._c.prefix(keys))

    def lookup_hashes(self, chains: Sequence[Sequence[int]],
                      groups: Optional[Sequence[int]] = None) -> list[HashPrefix]:
        """A router's prefix query in one request: for each chain of engine
        block hashes (a prompt's blocks in order; of groups[i], default 0),
        how many leading blocks the pool holds in DRAM, on disk, in either."""
        lens = [len(c) for c in chains]
        flat = array.array("Q", [h & _U64 for c in chains for h in c])
        g = bytes(groups) if groups is not None else None
        r = self._c.lookup_hashes(flat, lens, g)
        if isinstance(r, int):
            raise Error.from_code(r)
        return [HashPrefix(*t) for t in r]

    def kv_snapshot(self) -> KVSnapshot:
        """This tenant's blocks as the master's KV events announced them, and
        the stream's seq they reflect: a router that lost events rebuilds
        from this, then applies the batches after ``seq``."""
        r = self._c.kv_snapshot()
        if isinstance(r, int):
            raise Error.from_code(r)
        seq, blocks = r
        names = {_native.TIER_DRAM: "dram", _native.TIER_DISK: "disk"}
        return KVSnapshot(int(seq), [(h, g, names.get(t, str(t))) for h, g, t in blocks])

    def remove(self, key: str, force: bool = False) -> None:
        """force: even while leased by a reader or pinned."""
        _check(self._c.remove([key], force=force)[0])

    def remove_batch(self, keys: Sequence[str], force: bool = False) -> list[Optional[Error]]:
        return [None if r >= 0 else Error.from_code(r) for r in self._c.remove(keys, force=force)]

    def remove_regex(self, pattern: str, force: bool = False) -> int:
        """Removes this tenant's keys matching a POSIX extended regular
        expression (searched anywhere in the key); returns how many."""
        return _check(self._c.remove_regex(pattern, force=force))

    def remove_all(self, force: bool = False) -> int:
        """Removes every object of this client's tenant; returns how many."""
        return _check(self._c.remove_all(force=force))

    def describe(self, key: str) -> dict[str, Any]:
        """{"key", "size", "replicas": [{"segment", "name", "offset", "length",
        "tier", "transport"}]}."""
        r = self._c.describe(key, json=True)
        if isinstance(r, int):
            raise Error.from_code(r)
        return dict(json.loads(r))

    def stat(self) -> dict[str, Any]:
        """The master's counters and per-segment usage (`kvpool stat --json`)."""
        r = self._c.stat()
        if isinstance(r, int):
            raise Error.from_code(r)
        return dict(json.loads(r))

    def stats(self) -> dict[str, dict[str, int]]:
        """What this client moved since it opened, per data path ("shm": a
        same-host node's shared memory, "tcp", "ucx"): {"shm": {"put_bytes",
        "get_bytes", "put_ops", "get_ops"}, "tcp": {...}, "ucx": {...}}. Every
        replica transfer that succeeded counts once (kvp_client_stats). No
        request is made; the pool's totals over all clients are the master's
        ``client_<path>_*`` counters in stat()."""
        r = self._c.transfer_stats()
        if isinstance(r, int):
            raise Error.from_code(r)
        return {str(name): {"put_bytes": int(pb), "get_bytes": int(gb), "put_ops": int(po),
                            "get_ops": int(go)}
                for name, pb, gb, po, go in r}

    # registered memory
    def register_buffer(self, ptr: Union[int, Buffer], size: Optional[int] = None) -> None:
        """Registers [ptr, ptr+size) for the address forms (host memory mapped
        readable and writable in this process, or CUDA device memory:
        InvalidParamsError otherwise), or the memory of a numpy array / torch
        tensor (CPU or CUDA), which the client then keeps alive until
        unregister_buffer. Whether it is device memory is found here, once."""
        owner = None
        if size is not None:
            ptr = operator.index(ptr)  # numpy integers too
        elif _is_integer(ptr):
            raise builtins.TypeError("register_buffer(ptr, size): size is required with an address")
        else:
            owner = ptr
            ptr, size = _address_of(ptr)
        _check(self._c.register_buffer(ptr, size))
        if owner is not None:
            self._owners[ptr] = owner

    def unregister_buffer(self, ptr: Union[int, Buffer]) -> None:
        try:
            addr = operator.index(ptr)  # an int or a numpy integer
        except builtins.TypeError:
            addr, _ = _address_of(ptr)
        _check(self._c.unregister_buffer(addr))
        self._owners.pop(addr, None)


def _is_integer(x: Any) -> bool:
    """An int or anything with __index__ that works (numpy integers)."""
    try:
        operator.index(x)
        return True
    except builtins.TypeError:
        return False


def _address_of(buf: Any) -> tuple[int, int]:
    """(address, size) of a numpy array or torch tensor's memory."""
    if hasattr(buf, "data_ptr"):
        return int(buf.data_ptr()), int(buf.numel() * buf.element_size())
    iface = getattr(buf, "__array_interface__", None)
    if iface is not None:
        return int(iface["data"][0]), int(buf.nbytes)
    raise builtins.TypeError(f"cannot take the address of a {type(buf).__name__}: pass (ptr, size)")


def install_as_mooncake() -> None:
    """Makes ``import mooncake.store`` resolve to kvpool.mooncake in this process."""
    from .mooncake import install
    install()
