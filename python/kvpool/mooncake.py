"""kvpool.mooncake: Mooncake 0.3.13's ``mooncake.store`` surface on kvpool.

Code written for ``MooncakeDistributedStore`` runs unchanged: the same method
names, argument orders, defaults and return values (0 / bytes read on
success, Mooncake's negative ErrorCode numbers on failure, ``b""`` for a
missing key's bytes, ``None`` for a missing buffer). ``install()`` (or
``kvpool.install_as_mooncake()``) makes ``import mooncake.store`` load this
module; with ``KVPOOL_AS_MOONCAKE=1`` the package's .pth hook (any process) and
the vLLM plugin do it.

Deliberate differences (docs/MOONCAKE_COMPAT.md §6 gives the reasons):
  * ``protocol: "rdma"`` means one-sided transfers through UCX (RDMA NICs where UCX
    finds them) to nodes on other hosts; shared memory stays the path on this host.
  * No client staging buffer: ``local_buffer_size`` is accepted (any value)
    and values larger than it are stored (Mooncake: -600).
  * Reads hold their lease only while bytes move; ``is_exist`` / ``get_size``
    take none: a ``remove`` right after them succeeds (Mooncake: -706 until
    its lease expires), and ``remove_all`` without force removes such keys.
  * A hard pin holds against ``remove_all`` without force (Mooncake removes
    pinned objects there).
  * Puts into a full pool evict the least recently used objects inline and
    succeed while anything is evictable (Mooncake: -200 until its
    background eviction runs).
  * Raw addresses must lie in ranges given to ``register_buffer`` (-600 per
    key otherwise; Mooncake over TCP reads any pointer); negative sizes are
    -600 (Mooncake raises TypeError).
  * A key given twice in one batch keeps its first value (Mooncake: the last).
  * Scatter lists adding up to more than the value: -600 (Mooncake: -800).
  * ``BufferHandle`` is a ``bytearray`` (buffer format 'B'; Mooncake's 'b').
  * ``prefer_alloc_in_same_node`` is honoured (Mooncake's put refuses it).
  * ``local_hostname``'s port, if any, is dropped. Without one,
    ``get_hostname()`` is ``host:PORT`` with PORT in Mooncake's range
    (``MC_STORE_CLIENT_MIN_PORT``..``MAX_PORT``, 12300..14300): the embedded
    segment server's port, or one a segment-less client holds bound until
    ``close()``.
  * Before ``setup`` / after ``close`` every call answers -600 or the empty
    value of its type (Mooncake crashes in several).
  * ``setup_dummy(mem_pool_size, local_buffer_size, server_address)``:
    Mooncake attaches to a separate "real client" process that owns the
    segment; kvpool's counterpart is a storage node, so this sets up a
    client without a segment (``mode: standalone-store``) whose master is
    ``server_address`` (the ``kvpool serve`` / master address).
  * ``remove_by_regex``: the master matches POSIX extended syntax; the
    ECMAScript pattern is translated (class, control and bracket escapes,
    '.', the empty pattern); look-arounds, lazy quantifiers, back-references,
    \\b, counted repetition {m,n} and non-ASCII inside brackets answer -600.
  * ``register_buffer`` takes host memory mapped read-write in this process
    and CUDA device memory (the driver is asked); any other range is -600.
  * ``upsert*`` replaces at the master in one step: readers get the old
    value until the new one is complete, and an upsert that fails leaves
    it; an upsert of a key another put is writing answers -703.
  * Soft pins are Mooncake's: ``soft_pin_action`` ENABLE pins for
    ``soft_pin_ttl_ms`` (None: the master's ``soft_pin_ttl``, 30 min; 0
    clears), DISABLE unpins, PRESERVE keeps an upserted value's pin; a TTL
    without ENABLE or over ``soft_pin_max_ttl`` (24 h) is -600. A pinned
    object is evicted only after its tenant's unpinned ones, and never by
    background eviction, until the pin ends.
  * kvpool has no NVMe-oF / DFS replicas, object groups, writer sessions
    on KV events or replica tasks: ``ReplicateConfig`` has no ``group_ids``
    and no ``session_ids`` (``hasattr`` is False, so vLLM and SGLang take
    their path without; setting one raises AttributeError saying why), the
    replica counts are accepted (ordinary cache entries), and the task and
    segment-management calls answer NOT_SUPPORTED (-1012) in Mooncake's
    return shapes.
  * ``get_into_ranges`` and the put / get session calls copy through
    Python-side staging (correct, not zero-copy).
"""
from __future__ import annotations

import ctypes
import enum
import json
import logging
import mmap
import os
import random
import re
import socket
import sys
import threading
import types
from typing import Any, Optional, Sequence, Union

from . import Error, _log, _native, _torch_view, _with_buffers, config_text

log = logging.getLogger("kvpool.mooncake")

# Mooncake's ErrorCode numbers used here (mooncake-store/include/types.h).
OK = 0
INTERNAL_ERROR = -1
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
NOT_SUPPORTED = -1012

_C = _native.codes

# kvpool-only codes (the -2000 range) mean nothing to Mooncake callers: each
# is answered as the Mooncake code nearest in meaning.
_TO_MOONCAKE = {
    _C["BUFFER_OVERFLOW"]: INVALID_PARAMS,  # Mooncake: a too-small buffer is -600
    _C["INVALID_KEY"]: INVALID_PARAMS,      # Mooncake: an empty key is -600
    _C["NOMEM"]: INTERNAL_ERROR,
    _C["PROTOCOL"]: _C["RPC_FAIL"],
    _C["AUTH"]: _C["ILLEGAL_CLIENT"],
    _C["TOO_LARGE"]: INVALID_PARAMS,
    _C["CONFIG"]: INVALID_PARAMS,
    _C["AGAIN"]: _C["NO_AVAILABLE_HANDLE"],
    _C["IO"]: _C["TRANSFER_FAIL"],
    _C["CLOSED"]: _C["RPC_FAIL"],
    _C["UNKNOWN_OP"]: NOT_SUPPORTED,
    _C["NO_HELLO"]: _C["RPC_FAIL"],
    _C["LIMIT"]: _C["NO_AVAILABLE_HANDLE"],
    _C["OBJECT_PINNED"]: _C["OBJECT_HAS_LEASE"],
    _C["OBJECT_TOO_LARGE"]: INVALID_PARAMS,
    _C["DEVICE"]: _C["TRANSFER_FAIL"],
}


def _mc(r: int) -> int:
    """A kvpool result as Mooncake reports it: >= 0 unchanged, codes mapped."""
    return r if r >= 0 else _TO_MOONCAKE.get(r, r)


def _mc_list(res: list[int]) -> list[int]:
    """_mc over a batch; the common all-success batch is returned as is."""
    if min(res, default=0) >= 0:
        return res
    return [_mc(r) for r in res]


def _status(r: int) -> int:
    """A put/remove result (bytes moved or a code) as Mooncake's status."""
    return 0 if r >= 0 else _TO_MOONCAKE.get(r, r)


# ------------------------------------------------------------- ReplicateConfig

class SoftPinAction(enum.IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ReplicateConfig:
    """Mooncake's ReplicateConfig (replica.h). kvpool honours replica_num
    (1..3, best effort when fewer segments exist), with_hard_pin,
    soft_pin_action / soft_pin_ttl_ms, preferred_segments /
    preferred_segment (the first one named) and prefer_alloc_in_same_node
    (this client's own segment)."""

    # Class attributes too: callers probe hasattr(ReplicateConfig, FIELD) to
    # learn what this build supports (vLLM and SGLang do for group_ids).
    replica_num: int = 1
    nof_replica_num: int = 0
    dfs_replica_num: int = 0
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    _soft_pin_ttl_ms: Optional[int] = None
    with_hard_pin: bool = False
    preferred_segments: list[str] = []
    preferred_segment: str = ""
    preferred_nof_segments: list[str] = []
    prefer_alloc_in_same_node: bool = False
    data_type: ObjectDataType = ObjectDataType.UNKNOWN

    def __init__(self) -> None:
        self.preferred_segments = []
        self.preferred_nof_segments = []

    def __setattr__(self, name: str, value: Any) -> None:
        # Mooncake's pybind class has a fixed set of fields: setting another
        # raises AttributeError. So does this one, instead of keeping a field
        # that nothing reads (a silent drop); the two Mooncake fields kvpool
        # has no meaning for say why.
        if name not in _RC_FIELDS:
            why = _RC_REFUSED.get(name, "")
            raise AttributeError(f"'ReplicateConfig' object has no attribute {name!r}"
                                 + (f": {why}" if why else ""))
        object.__setattr__(self, name, value)

    @property
    def soft_pin_ttl_ms(self) -> Optional[int]:
        """Milliseconds, or None (the master's default TTL for ENABLE)."""
        return self._soft_pin_ttl_ms

    @soft_pin_ttl_ms.setter
    def soft_pin_ttl_ms(self, v: Optional[int]) -> None:
        # Mooncake's binding is std::optional<uint64_t>: anything else is a TypeError
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)
                              or not 0 <= v < 1 << 64):
            raise TypeError("soft_pin_ttl_ms must be None or an int in [0, 2**64)")
        self._soft_pin_ttl_ms = v

    def __str__(self) -> str:
        return ("ReplicateConfig: { "
                f"replica_num: {self.replica_num}, nof_replica_num: {self.nof_replica_num}, "
                f"with_hard_pin: {self.with_hard_pin}, "
                f"soft_pin_action: {int(self.soft_pin_action)}, "
                f"soft_pin_ttl_ms: {self.soft_pin_ttl_ms}, "
                f"preferred_segments: {self.preferred_segments}, "
                f"preferred_segment: {self.preferred_segment} }}")

    __repr__ = __str__


_RC_FIELDS = frozenset(
    ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "_soft_pin_ttl_ms",
     "soft_pin_ttl_ms", "with_hard_pin", "preferred_segments", "preferred_segment",
     "preferred_nof_segments", "prefer_alloc_in_same_node", "data_type"))

# Mooncake fields this build leaves out on purpose. Callers probe for them
# with hasattr() and take their own path without (vLLM and SGLang put each
# key on its own; SGLang logs that group semantics are off).
_RC_REFUSED = {
    "group_ids": "kvpool has no object groups (Mooncake evicts and removes a group's keys "
                 "as one unit); each key is its own cache entry",
    "session_ids": "kvpool's KV events carry no writer session; the put would publish none",
}


# ------------------------------------------------------- replica descriptors

class BufferDescriptor:
    def __init__(self, size: int, buffer_address: int, transport_endpoint: str) -> None:
        self.size = size
        self.buffer_address = buffer_address
        self.transport_endpoint = transport_endpoint

    def __repr__(self) -> str:
        return (f"<Descriptor size={self.size} buffer_address={self.buffer_address} "
                f"transport_endpoint={self.transport_endpoint}>")


class MemoryDescriptor:
    def __init__(self, buffer_descriptor: BufferDescriptor) -> None:
        self.buffer_descriptor = buffer_descriptor


class ReplicaStatus(enum.IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskStatus(enum.IntEnum):
    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class TaskType(enum.IntEnum):
    REPLICA_COPY = 0
    REPLICA_MOVE = 1


# Mooncake exports these enums' members at module level too; TaskStatus is
# exported last, so PROCESSING and FAILED are TaskStatus values there.
for _e in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    globals().update(_e.__members__)
del _e


class DiskDescriptor:
    """A disk replica: the record on a storage node's SSD tier (kvpool keeps
    records in page files, so there is no per-object file path)."""

    def __init__(self, object_size: int) -> None:
        self.file_path = ""
        self.object_size = object_size


class ReplicaDescriptor:
    """One replica of an object. kvpool lists published replicas only:
    status COMPLETE; a DRAM replica (is_memory_replica()) or the durable
    record on a storage node's SSD tier (is_disk_replica())."""

    def __init__(self, d: dict[str, Any]) -> None:
        self._status = ReplicaStatus.COMPLETE
        self.tier = str(d.get("tier", "dram"))
        self.segment_id = str(d.get("segment", ""))
        self._mem = MemoryDescriptor(BufferDescriptor(
            int(d.get("length", 0)), int(d.get("offset", 0)), str(d.get("name", ""))))

    @property
    def status(self) -> ReplicaStatus:
        return self._status

    def is_memory_replica(self) -> bool:
        return self.tier == "dram"

    def is_disk_replica(self) -> bool:
        return self.tier == "disk"

    def is_local_disk_replica(self) -> bool:
        return False

    def get_memory_descriptor(self) -> MemoryDescriptor:
        return self._mem

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self.tier != "disk":
            raise RuntimeError("not a disk replica")
        return DiskDescriptor(self._mem.buffer_descriptor.size)

    def __repr__(self) -> str:
        b = self._mem.buffer_descriptor
        if self.tier == "disk":
            return f"ReplicaDescriptor(disk, size={b.size})"
        return f"ReplicaDescriptor(memory, {b.transport_endpoint}, size={b.size})"


class BufferHandle(bytearray):
    """A value read by get_buffer: the bytes, with Mooncake's ptr() / size()."""

    def ptr(self) -> int:
        if not self:
            return 0
        return ctypes.addressof((ctypes.c_char * len(self)).from_buffer(self))

    def size(self) -> int:
        return len(self)


# ------------------------------------------------------------------- setup

_SETUP_ARGS = ("local_hostname", "metadata_server", "global_segment_size",
               "local_buffer_size", "protocol", "rdma_devices", "master_server_addr",
               "engine", "enable_ssd_offload", "ssd_offload_path", "tenant_id",
               "enable_client_http_server", "client_http_port")

# Mooncake setup-dict keys (and config-file keys) -> what kvpool does with them.
_PASS = {"global_segment_size", "protocol", "replica_num",
         "preferred_segment", "rpc_timeout", "cluster_token", "log_level"}
_IGNORED = {"local_buffer_size",  # no staging buffer (0: the bytes API puts answer -600)
            "metadata_server", "rdma_devices", "device_name", "engine", "ipc_socket_path",
            "enable_client_http_server", "client_http_port",
            "master_metrics_port", "transfer_timeout", "use_ascend_direct", "te_meta_data_server"}


def _host_only(h: str) -> str:
    """Mooncake's local_hostname may carry a port ("ip:port"); kvpool's
    segment server picks its own port, so only the host is kept."""
    h = h.strip()
    if h.startswith("["):  # [v6]:port
        return h[1:h.index("]")] if "]" in h else h
    if h.count(":") == 1:
        return h.split(":", 1)[0]
    return h


def _has_port(h: str) -> bool:
    """Whether Mooncake's local_hostname names a port ("ip:port", "[v6]:port")."""
    h = h.strip()
    if h.startswith("["):
        return "]:" in h
    return h.count(":") == 1


# Mooncake's client port range when local_hostname has no port
# (MC_STORE_CLIENT_MIN_PORT / MC_STORE_CLIENT_MAX_PORT).
_PORT_RANGE = (12300, 14300)


def _port_range() -> tuple[int, int]:
    """Mooncake's client port range: its environment variables when both
    are valid ports forming a range, else 12300..14300."""
    try:
        lo = int(os.environ.get("MC_STORE_CLIENT_MIN_PORT", _PORT_RANGE[0]))
        hi = int(os.environ.get("MC_STORE_CLIENT_MAX_PORT", _PORT_RANGE[1]))
    except ValueError:
        return _PORT_RANGE
    return (lo, hi) if 1 <= lo <= hi <= 65535 else _PORT_RANGE


def _reserve_port(host: str, lo: int, hi: int) -> Optional[socket.socket]:
    """A TCP socket bound to a free port of lo..hi on host (tried in order
    from a random one, wrapping), else on every address: it holds the port
    that a standalone client's name carries, as Mooncake's transfer engine
    holds its own. None when no port of the range is free."""
    try:
        infos = socket.getaddrinfo(host or None, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    binds = [(ai[0], ai[4][0]) for ai in infos[:1]] + [(socket.AF_INET, "")]
    span = hi - lo + 1
    first = random.randrange(span)
    for i in range(span):
        port = lo + (first + i) % span
        for fam, addr in binds:
            sk = socket.socket(fam, socket.SOCK_STREAM)
            try:
                sk.bind((addr, port))
                return sk
            except OSError:
                sk.close()
    return None


def _join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _store_config(opts: dict[str, Any]) -> dict[str, Any]:
    """A kvpool client config from Mooncake's setup() options."""
    cfg: dict[str, Any] = {}
    for k, v in opts.items():
        if v is None:
            continue
        if k == "local_hostname":
            if str(v).strip():
                cfg["local_hostname"] = _host_only(str(v))
        elif k in ("master_server_addr", "master_server_address"):
            cfg["master"] = str(v)
        elif k in ("tenant_id", "tenant"):
            if str(v):
                cfg["tenant"] = str(v)
        elif k in ("enable_ssd_offload", "enable_offload"):
            cfg["enable_offload"] = _parse_bool(v)
        elif k in ("ssd_offload_path", "offload_dir"):
            if str(v):
                cfg["offload_dir"] = str(v)
        elif k in _PASS:
            cfg[k] = v if not isinstance(v, bool) else v
        elif k in _IGNORED:
            continue
        else:
            log.debug("setup: key %r is not used by kvpool", k)
    # Mooncake's client-side SSD offload directory: an embedded segment's tier
    if cfg.get("enable_offload") and "offload_dir" not in cfg:
        env_dir = os.environ.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "")
        if env_dir:
            cfg["offload_dir"] = env_dir
    proto = str(cfg.get("protocol", "tcp")).lower()
    if proto not in ("tcp", "rdma", "ucx"):
        log.warning("protocol %r: kvpool has no %s transport; using shared memory on this "
                    "host and TCP to other hosts", proto, proto)
        proto = "tcp"
    # rdma: one-sided transfers through UCX to nodes on other hosts that offer it
    # (shared memory stays the path on this host); without UCX, TCP with a warning
    cfg["protocol"] = proto
    seg = cfg.get("global_segment_size", 16 << 20)
    cfg["global_segment_size"] = seg
    if _size_is_zero(seg):
        cfg["mode"] = "standalone-store"
        cfg.pop("global_segment_size")
    else:
        cfg["mode"] = "embedded"
        if not _has_port(str(opts.get("local_hostname") or "")):
            # Mooncake serves on a port of its client range: the segment server does
            cfg["segment_port_min"], cfg["segment_port_max"] = _port_range()
    return cfg


def _size_is_zero(v: Any) -> bool:
    if isinstance(v, (int, float)):
        return v == 0
    s = str(v).strip().lower().rstrip("ib").rstrip("kmgt")
    try:
        return float(s or "0") == 0
    except ValueError:
        return False


def _env_config() -> dict[str, Any]:
    """Mooncake's environment variables (as SGLang and Mooncake's own service read them)."""
    env = os.environ
    m = {"MOONCAKE_MASTER": "master_server_addr", "MOONCAKE_LOCAL_HOSTNAME": "local_hostname",
         "MOONCAKE_GLOBAL_SEGMENT_SIZE": "global_segment_size",
         "MOONCAKE_LOCAL_BUFFER_SIZE": "local_buffer_size", "MOONCAKE_PROTOCOL": "protocol",
         "MOONCAKE_TE_META_DATA_SERVER": "metadata_server", "MOONCAKE_DEVICE": "rdma_devices",
         "MOONCAKE_TENANT_ID": "tenant_id"}
    return {k: env[e] for e, k in m.items() if env.get(e)}


class MooncakeConfig:
    """Mooncake's client configuration helper (mooncake.mooncake_config):
    from a JSON file (``from_file``, ``load_from_env`` with
    $MOONCAKE_CONFIG_PATH) or from Mooncake's environment variables."""

    def __init__(self, local_hostname: str, metadata_server: str, master_server_address: str,
                 global_segment_size: int = 3355443200, local_buffer_size: int = 1073741824,
                 protocol: str = "tcp", device_name: str = "", enable_ssd_offload: bool = False,
                 ssd_offload_path: str = "", tenant_id: str = "default",
                 enable_client_http_server: bool = False, client_http_port: int = 9300) -> None:
        self.local_hostname = local_hostname
        self.metadata_server = metadata_server
        self.master_server_address = master_server_address
        self.global_segment_size = global_segment_size
        self.local_buffer_size = local_buffer_size
        self.protocol = protocol
        self.device_name = device_name
        self.enable_ssd_offload = enable_ssd_offload
        self.ssd_offload_path = ssd_offload_path
        self.tenant_id = tenant_id
        self.enable_client_http_server = enable_client_http_server
        self.client_http_port = client_http_port

    @staticmethod
    def from_file(path: str) -> "MooncakeConfig":
        with open(path) as f:
            d = json.load(f)
        for k in ("local_hostname", "metadata_server", "master_server_address"):
            if k not in d:
                raise ValueError(f"{path}: missing required key {k!r}")
        return MooncakeConfig(
            d["local_hostname"], d["metadata_server"], d["master_server_address"],
            _parse_size(d.get("global_segment_size", 3355443200)),
            _parse_size(d.get("local_buffer_size", 1073741824)),
            str(d.get("protocol", "tcp")).lower(), str(d.get("device_name", "")),
            _parse_bool(d.get("enable_ssd_offload", False)), str(d.get("ssd_offload_path", "")),
            str(d.get("tenant_id", "default")), _parse_bool(d.get("enable_client_http_server",
                                                                   False)),
            int(d.get("client_http_port", 9300)))

    @staticmethod
    def load_from_env() -> "MooncakeConfig":
        path = os.environ.get("MOONCAKE_CONFIG_PATH")
        if path:
            return MooncakeConfig.from_file(path)
        env = os.environ
        if not env.get("MOONCAKE_MASTER"):
            raise ValueError("neither MOONCAKE_CONFIG_PATH nor MOONCAKE_MASTER is set")
        return MooncakeConfig(
            env.get("MOONCAKE_LOCAL_HOSTNAME", "localhost"),
            env.get("MOONCAKE_TE_META_DATA_SERVER", "P2PHANDSHAKE"), env["MOONCAKE_MASTER"],
            _parse_size(env.get("MOONCAKE_GLOBAL_SEGMENT_SIZE", 3355443200)),
            _parse_size(env.get("MOONCAKE_LOCAL_BUFFER_SIZE", 1073741824)),
            env.get("MOONCAKE_PROTOCOL", "tcp").lower(), env.get("MOONCAKE_DEVICE", ""),
            _parse_bool(env.get("MOONCAKE_OFFLOAD_ENABLED", False)),
            env.get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", ""),
            env.get("MOONCAKE_TENANT_ID", "default"),
            _parse_bool(env.get("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", False)),
            int(env.get("MOONCAKE_CLIENT_HTTP_PORT", 9300)))

    def setup_args(self) -> tuple[Any, ...]:
        """The positional arguments of MooncakeDistributedStore.setup."""
        return (self.local_hostname, self.metadata_server, self.global_segment_size,
                self.local_buffer_size, self.protocol, self.device_name,
                self.master_server_address)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def _parse_size(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(v))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"invalid size {v!r} (use e.g. 4GB, 512MB, 1024)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _parse_bool(v: Any) -> bool:
    """Mooncake's boolean strings: 1/true/yes/on/enable (any case) are true."""
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes", "on", "enable")


# ------------------------------------------------------------------- store

Ptrs = Sequence[Any]


class MooncakeDistributedStore:
    """Mooncake's store client, on kvpool. Thread-safe like the original."""

    def __init__(self) -> None:
        self._c: Optional[Any] = None
        self._host = ""
        self._port_hold: Optional[socket.socket] = None  # a standalone client's port
        self._no_staging = False  # local_buffer_size 0: the bytes API's puts answer -600
        self._lock = threading.Lock()
        self._pools: dict[int, tuple[mmap.mmap, Any]] = {}
        self._sessions: dict[str, Any] = {}
        self._get_sessions: dict[str, bytes] = {}

    # ------------------------------------------------------------ lifecycle

    def setup(self, *args: Any, **kwargs: Any) -> int:
        """setup(config: dict) or setup(local_hostname, metadata_server,
        global_segment_size, local_buffer_size, protocol, rdma_devices,
        master_server_addr, engine=None, enable_ssd_offload=False,
        ssd_offload_path="", tenant_id="default", enable_client_http_server=False,
        client_http_port=9300). 0, or a negative code."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            opts = {str(k): str(v) for k, v in args[0].items()}  # Mooncake str()s them
            if not opts.get("local_hostname") or "metadata_server" not in opts:
                log.error("setup: local_hostname and metadata_server are required")
                return INVALID_PARAMS
        else:
            if len(args) > len(_SETUP_ARGS):
                raise TypeError(f"setup() takes at most {len(_SETUP_ARGS)} arguments")
            opts = dict(zip(_SETUP_ARGS, args))
            for k, v in kwargs.items():
                if k not in _SETUP_ARGS:
                    raise TypeError(f"setup() got an unexpected keyword argument {k!r}")
                if k in opts:
                    raise TypeError(f"setup() got multiple values for argument {k!r}")
                opts[k] = v
            missing = [a for a in _SETUP_ARGS[:7] if a not in opts]
            if missing:
                raise TypeError(f"setup() missing required arguments: {', '.join(missing)}")
        try:
            c = _native.Client(config_text(_store_config(opts)))
        except _native.OpenError as e:
            _log.flush()
            code, msg = e.args
            log.error("setup failed: %s", msg)
            if code in (_C["RPC_FAIL"], _C["RPC_TIMEOUT"]):
                return INTERNAL_ERROR  # Mooncake's answer when it cannot reach the master
            return _mc(int(code))
        host, hold = self._standalone_name(opts, c)
        with self._lock:  # a second setup replaces the client, as in Mooncake
            old, self._c = self._c, c
            old_hold, self._port_hold = self._port_hold, hold
            self._no_staging = _size_is_zero(opts.get("local_buffer_size", 16 << 20))
            self._host = host
        if old is not None:
            old.close()
        if old_hold is not None:
            old_hold.close()
        _log.flush()
        return OK

    @staticmethod
    def _standalone_name(opts: dict[str, Any], c: Any) -> tuple[str, Optional[socket.socket]]:
        """get_hostname()'s answer for a client without a segment, and the
        socket holding its port: local_hostname as given when it has a
        port, else host:PORT with PORT held in Mooncake's client range.
        ("", None) for an embedded client (its segment's name is the answer)."""
        if str(c.segment_name or ""):
            return "", None
        given = str(opts.get("local_hostname", "") or "").strip()
        if _has_port(given):
            return given, None
        host = given or "localhost"
        hold = _reserve_port(host, *_port_range())
        if hold is None:
            log.warning("setup: no free port in %d..%d to name this client; get_hostname() "
                        "is the bare host", *_port_range())
            return host, None
        return _join_host_port(host, hold.getsockname()[1]), hold

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int) -> int:
        """Mooncake's legacy initialisation: the master and host come from
        $MOONCAKE_MASTER / $MOONCAKE_LOCAL_HOSTNAME (defaults 127.0.0.1:50051, localhost)."""
        env = _env_config()
        return self.setup({"local_hostname": env.get("local_hostname", "localhost"),
                           "metadata_server": "P2PHANDSHAKE",
                           "global_segment_size": mount_segment_size,
                           "local_buffer_size": 16 << 20, "protocol": protocol,
                           "rdma_devices": device_name,
                           "master_server_addr": env.get("master_server_addr", "127.0.0.1:50051")})

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Mooncake's "dummy" client: the process contributes no memory, a
        separate "real client" (``mooncake_client``, at server_address)
        owns the segment. kvpool's storage nodes play that part and every
        client reaches them through the master, so this is setup() of a
        client without a segment (``mode: standalone-store``) whose master
        is server_address. mem_pool_size (the memory Mooncake's real client
        maps for this process) and local_buffer_size need no counterpart:
        registered buffers move straight to the nodes. The name and tenant
        come from $MOONCAKE_LOCAL_HOSTNAME / $MOONCAKE_TENANT_ID as in
        Mooncake. 0, -600 for bad arguments, or setup()'s codes."""
        if (not isinstance(server_address, str) or not server_address.strip()
                or isinstance(mem_pool_size, bool) or not isinstance(mem_pool_size, int)
                or mem_pool_size < 0 or isinstance(local_buffer_size, bool)
                or not isinstance(local_buffer_size, int) or local_buffer_size < 0):
            log.error("setup_dummy: want (mem_pool_size >= 0, local_buffer_size >= 0, "
                      "server_address \"host:port\"), got (%r, %r, %r)",
                      mem_pool_size, local_buffer_size, server_address)
            return INVALID_PARAMS
        env = _env_config()
        opts = {"local_hostname": env.get("local_hostname", "localhost"),
                "metadata_server": "P2PHANDSHAKE", "global_segment_size": 0,
                "local_buffer_size": local_buffer_size, "protocol": "tcp",
                "master_server_addr": server_address.strip()}
        if env.get("tenant_id"):
            opts["tenant_id"] = env["tenant_id"]
        return self.setup(opts)

    def close(self) -> int:
        with self._lock:
            c, self._c = self._c, None
            pools, self._pools = self._pools, {}
            hold, self._port_hold = self._port_hold, None
        if c is not None:
            c.close()
            _log.flush()
        if hold is not None:
            hold.close()
        while _unmap_pop(pools):
            pass
        return OK

    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 master unreachable."""
        c = self._c
        if c is None or c.closed:
            return 1
        return 0 if isinstance(c.stat(), str) else 2

    def get_hostname(self) -> str:
        """This client's name, "host:port": its embedded segment's name
        (the segment server's port, in Mooncake's client range 12300..14300
        unless local_hostname gave one), or for a client without a segment
        local_hostname with a port of that range that it holds; "" before
        setup."""
        c = self._c
        name = str(c.segment_name) if c is not None else ""
        return name or self._host

    def _client(self) -> Any:
        c = self._c
        if c is None:
            raise _NotReady()
        return c

    # ---------------------------------------------------------------- bytes

    def put(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self.put_batch([key], [value], config)

    def put_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._parts(key, parts, config, False)

    def put_batch(self, keys: Sequence[str], values: Sequence[Any],
                  config: Optional[ReplicateConfig] = None) -> int:
        """One status for the batch: 0, or the first key's error."""
        return self._batch_status(keys, values, config, False)

    def upsert(self, key: str, value: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self.upsert_batch([key], [value], config)

    def upsert_parts(self, key: str, *parts: Any, config: Optional[ReplicateConfig] = None) -> int:
        return self._parts(key, parts, config, True)

    def upsert_batch(self, keys: Sequence[str], values: Sequence[Any],
                     config: Optional[ReplicateConfig] = None) -> int:
        return self._batch_status(keys, values, config, True)

    def _parts(self, key: str, parts: Sequence[Any], config: Optional[ReplicateConfig],
               upsert: bool) -> int:
        if not parts or self._no_staging:
            return INVALID_PARAMS
        return self._put_values([key], [list(parts)], config, upsert)[0]

    def _batch_status(self, keys: Sequence[str], values: Sequence[Any],
                      config: Optional[ReplicateConfig], upsert: bool) -> int:
        if len(keys) != len(values) or self._no_staging:
            return INVALID_PARAMS  # Mooncake's bytes API copies through local_buffer_size
        return next((r for r in self._put_values(keys, values, config, upsert) if r != 0), OK)

    def _put_values(self, keys: Sequence[str], values: Sequence[Any],
                    config: Optional[ReplicateConfig], upsert: bool) -> list[int]:
        try:
            c = self._client()
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)
        try:  # a value without the buffer protocol raises TypeError, as in Mooncake
            kw = _opts(c, config, upsert)
            res = _with_buffers(c.put_buffers, keys, values, **kw)
        except ValueError as e:
            log.error("put: %s", e)
            return [INVALID_PARAMS] * len(keys)
        return [_status(r) for r in res]

    def get(self, key: str) -> bytes:
        """The value, or b"" when missing or on error."""
        r = self.get_batch([key])
        return r[0]

    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        if len(keys) == 0:
            return [b""]  # Mooncake answers an empty batch with one empty value
        try:
            res = self._client().get_bytes(keys)
        except _NotReady:
            return [b""] * len(keys)
        return [b"" if isinstance(r, int) else r for r in res]

    def get_buffer(self, key: str) -> Optional[BufferHandle]:
        r = self.batch_get_buffer([key])
        return r[0]

    def batch_get_buffer(self, keys: Sequence[str]) -> list[Optional[BufferHandle]]:
        try:
            res = self._client().get_bytes(keys)
        except _NotReady:
            return [None] * len(keys)
        return [None if isinstance(r, int) else BufferHandle(r) for r in res]

    # ------------------------------------------------------------ zero copy

    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        try:
            return _mc(self._client().register_buffer(buffer_ptr, size))
        except _NotReady:
            return INVALID_PARAMS
        except (TypeError, ValueError, OverflowError):
            return INVALID_PARAMS

    def unregister_buffer(self, buffer_ptr: int) -> int:
        try:
            return _mc(self._client().unregister_buffer(buffer_ptr))
        except _NotReady:
            return INVALID_PARAMS
        except (TypeError, ValueError, OverflowError):
            return INVALID_PARAMS

    def put_from(self, key: str, buffer_ptr: int, size: int,
                 config: Optional[ReplicateConfig] = None) -> int:
        return self._put_ptrs([key], [buffer_ptr], [size], config, False)[0]

    def put_from_with_metadata(self, key: str, buffer_ptr: int, metadata_buffer_ptr: int,
                               size: int, metadata_size: int,
                               config: Optional[ReplicateConfig] = None) -> int:
        """The object is the metadata bytes followed by the data bytes."""
        return self._put_ptrs([key], [[metadata_buffer_ptr, buffer_ptr]],
                              [[metadata_size, size]], config, False)[0]

    def batch_put_from(self, keys: Sequence[str], buffer_ptrs: Ptrs, sizes: Sequence[int],
                       config: Optional[ReplicateConfig] = None) -> list[int]:
        return self._put_ptrs(keys, buffer_ptrs, sizes, config, False)

    def batch_put_from_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Ptrs,
                                     all_sizes: Ptrs,
                                     config: Optional[ReplicateConfig] = None) -> list[int]:
        return self._put_ptrs(keys, all_buffer_ptrs, all_sizes, config, False)

    def upsert_from(self, key: str, buffer_ptr: int, size: int,
                    config: Optional[ReplicateConfig] = None) -> int:
        return self._put_ptrs([key], [buffer_ptr], [size], config, True)[0]

    def batch_upsert_from(self, keys: Sequence[str], buffer_ptrs: Ptrs, sizes: Sequence[int],
                          config: Optional[ReplicateConfig] = None) -> list[int]:
        return self._put_ptrs(keys, buffer_ptrs, sizes, config, True)

    def _put_ptrs(self, keys: Sequence[str], ptrs: Ptrs, sizes: Ptrs,
                  config: Optional[ReplicateConfig], upsert: bool) -> list[int]:
        try:
            c = self._client()
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)
        if len(keys) != len(ptrs) or len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        # Mooncake: a zero-size single-buffer put succeeds and stores nothing
        zero = [i for i, n in enumerate(sizes) if n == 0 and isinstance(n, int)] \
            if 0 in sizes else []
        if zero:
            keep = [i for i in range(len(keys)) if i not in set(zero)]
            sub = self._put_ptrs([keys[i] for i in keep], [ptrs[i] for i in keep],
                                 [sizes[i] for i in keep], config, upsert)
            out = [OK] * len(keys)
            for i, r in zip(keep, sub):
                out[i] = r
            return out
        try:
            res = c.put_ptrs(keys, ptrs, sizes, **_opts(c, config, upsert))
        except (TypeError, ValueError, OverflowError) as e:
            log.error("put: %s", e)
            return [INVALID_PARAMS] * len(keys)
        return [_status(r) for r in res]

    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        return self._get_ptrs([key], [buffer_ptr], [size])[0]

    def batch_get_into(self, keys: Sequence[str], buffer_ptrs: Ptrs,
                       sizes: Sequence[int]) -> list[int]:
        return self._get_ptrs(keys, buffer_ptrs, sizes)

    def batch_get_into_multi_buffers(self, keys: Sequence[str], all_buffer_ptrs: Ptrs,
                                     all_sizes: Ptrs,
                                     prefer_alloc_in_same_node: bool = False) -> list[int]:
        """The pieces of each key must add up to exactly its size."""
        return self._get_ptrs(keys, all_buffer_ptrs, all_sizes, exact=True)

    def _get_ptrs(self, keys: Sequence[str], ptrs: Ptrs, sizes: Ptrs,
                  exact: bool = False) -> list[int]:
        if len(keys) != len(ptrs) or len(keys) != len(sizes):
            return [INVALID_PARAMS] * len(keys)
        try:
            res = self._client().get_ptrs(keys, ptrs, sizes, exact=exact)
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)
        except (TypeError, ValueError, OverflowError) as e:
            log.error("get: %s", e)
            return [INVALID_PARAMS] * len(keys)
        return _mc_list(res)

    def get_into_ranges(self, buffer_ptrs: Sequence[int], all_keys: Sequence[Sequence[str]],
                        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
                        all_src_offsets: Sequence[Sequence[Sequence[int]]],
                        all_sizes: Sequence[Sequence[Sequence[int]]]) -> list[list[list[int]]]:
        """Buffer-major gather of byte ranges: for buffer i, key j, range k,
        copies all_sizes[i][j][k] bytes at all_src_offsets[i][j][k] of the
        value into buffer_ptrs[i] + all_dst_offsets[i][j][k]. Per range: bytes
        copied or a negative code. Each value is read whole once."""
        try:
            c = self._client()
        except _NotReady:
            return [[[INVALID_PARAMS] * len(r) for r in ks] for ks in all_sizes]
        if not (len(buffer_ptrs) == len(all_keys) == len(all_dst_offsets) ==
                len(all_src_offsets) == len(all_sizes)):
            return [[[INVALID_PARAMS]] for _ in buffer_ptrs]
        wanted = sorted({k for ks in all_keys for k in ks})
        values = dict(zip(wanted, c.get_bytes(wanted)))
        out: list[list[list[int]]] = []
        for i, base in enumerate(buffer_ptrs):
            per_key: list[list[int]] = []
            ks, dsts, srcs, ns = all_keys[i], all_dst_offsets[i], all_src_offsets[i], all_sizes[i]
            for j, key in enumerate(ks):
                if j >= len(dsts) or j >= len(srcs) or j >= len(ns) or \
                        not len(dsts[j]) == len(srcs[j]) == len(ns[j]):
                    per_key.append([INVALID_PARAMS] * max(1, len(ns[j]) if j < len(ns) else 1))
                    continue
                v = values.get(key)
                per_key.append([_copy_range(c, v, base, d, s, n)
                                for d, s, n in zip(dsts[j], srcs[j], ns[j])])
            out.append(per_key)
        return out

    # Get sessions: the values are read once at session start (one batch
    # read into staging) and ranged reads copy out of that staging.
    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Reads keys for later ranged reads. Per key: its size, or < 0."""
        try:
            c = self._client()
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)
        got = c.get_bytes(keys)
        out = []
        with self._lock:
            for k, v in zip(keys, got):
                if isinstance(v, int):
                    out.append(_mc(v))
                else:
                    self._get_sessions[k] = v
                    out.append(OK)
        return out

    def batch_get_into_multi_buffer_ranges(self, keys: Sequence[str], all_buffer_ptrs: Ptrs,
                                           all_sizes: Ptrs, all_src_offsets: Ptrs) -> list[int]:
        """For each key of an open get session, copies all_sizes[i][k] bytes
        at all_src_offsets[i][k] of the value into all_buffer_ptrs[i][k]
        (registered memory). Per key: bytes copied, or < 0."""
        c = self._c
        if c is None:
            return [INVALID_PARAMS] * len(keys)
        if not len(keys) == len(all_buffer_ptrs) == len(all_sizes) == len(all_src_offsets):
            return [INVALID_PARAMS] * len(keys)
        out = []
        for i, k in enumerate(keys):
            v = self._get_sessions.get(k)
            if v is None:
                out.append(OBJECT_NOT_FOUND)
                continue
            ps, ns, ss = all_buffer_ptrs[i], all_sizes[i], all_src_offsets[i]
            if not len(ps) == len(ns) == len(ss):
                out.append(INVALID_PARAMS)
                continue
            total = 0
            for p, n, s in zip(ps, ns, ss):
                r = _copy_range(c, v, p, 0, s, n)
                if r < 0:
                    total = r
                    break
                total += r
            out.append(total)
        return out

    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """Closes the get sessions of keys; 0."""
        with self._lock:
            for k in keys:
                self._get_sessions.pop(k, None)
        return OK

    # ------------------------------------------------------------- sessions

    def batch_put_session_start(self, keys: Sequence[str], sizes: Sequence[int],
                                config: Optional[ReplicateConfig] = None) -> list[int]:
        """Reserves staging for keys of the given sizes; ranges written by
        batch_put_from_multi_buffer_ranges are published by session_end."""
        if len(keys) != len(sizes) or self._c is None:
            return [INVALID_PARAMS] * len(keys)
        out = []
        with self._lock:
            for k, n in zip(keys, sizes):
                if not isinstance(n, int) or n <= 0 or not k:
                    out.append(INVALID_PARAMS)
                elif k in self._sessions:
                    out.append(_C["REPLICA_IS_NOT_READY"])
                else:
                    self._sessions[k] = (bytearray(n), config)
                    out.append(OK)
        return out

    def batch_put_from_multi_buffer_ranges(self, keys: Sequence[str], all_buffer_ptrs: Ptrs,
                                           all_sizes: Ptrs, all_dst_offsets: Ptrs) -> list[int]:
        c = self._c
        out = []
        for i, k in enumerate(keys):
            s = self._sessions.get(k)
            if s is None or c is None:
                out.append(OBJECT_NOT_FOUND if c is not None else INVALID_PARAMS)
                continue
            buf = s[0]
            r = OK
            try:
                for p, n, d in zip(all_buffer_ptrs[i], all_sizes[i], all_dst_offsets[i]):
                    if n < 0 or d < 0 or d + n > len(buf) or c.check_registered(p, n) != 0:
                        r = INVALID_PARAMS
                        break
                    ctypes.memmove((ctypes.c_char * n).from_buffer(buf, d), p, n)
            except (TypeError, ValueError, IndexError):
                r = INVALID_PARAMS
            out.append(r)
        return out

    def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        if self._c is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            taken = [self._sessions.pop(k, None) for k in keys]
        out = []
        for k, s in zip(keys, taken):
            out.append(OBJECT_NOT_FOUND if s is None else self._put_values([k], [s[0]], s[1], False)[0])
        return out

    def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]:
        if self._c is None:
            return [INVALID_PARAMS] * len(keys)
        with self._lock:
            return [OK if self._sessions.pop(k, None) is not None else OBJECT_NOT_FOUND
                    for k in keys]

    # ------------------------------------------------ query / delete / admin

    def is_exist(self, key: str) -> int:
        return self.batch_is_exist([key])[0]

    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        try:
            return _mc_list(self._client().exist(keys))
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)

    def get_size(self, key: str) -> int:
        try:
            return _mc(self._client().sizes([key])[0])
        except _NotReady:
            return INVALID_PARAMS

    def remove(self, key: str, force: bool = False) -> int:
        return self.batch_remove([key], force)[0]

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        try:
            return [_status(r) for r in self._client().remove(keys, force=force)]
        except _NotReady:
            return [INVALID_PARAMS] * len(keys)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Removes the keys the pattern finds (searched anywhere in the key,
        as Mooncake's std::regex_search). The master matches POSIX extended
        syntax; ECMAScript's class escapes (\\d \\w \\s and their negations) are
        translated, constructs POSIX lacks (lazy quantifiers, look-arounds)
        answer -600. Count removed, or < 0."""
        try:
            c = self._client()
        except _NotReady:
            return INVALID_PARAMS
        if not isinstance(regex_pattern, str):
            raise TypeError("regex_pattern must be str")
        posix = _ecma_to_posix(regex_pattern)
        if posix is None:
            return INVALID_PARAMS
        return _mc(c.remove_regex(posix, force=force))

    def remove_all(self, force: bool = False) -> int:
        try:
            return _mc(self._client().remove_all(force=force))
        except _NotReady:
            return INVALID_PARAMS

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        try:
            r = self._client().describe(key, json=True)
        except _NotReady:
            return []
        if isinstance(r, int):
            return []
        return [ReplicaDescriptor(d) for d in json.loads(r).get("replicas", [])]

    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        out: dict[str, list[ReplicaDescriptor]] = {}
        for k in keys:
            d = self.get_replica_desc(k)
            if d:
                out[k] = d
        return out

    def alloc_from_mem_pool(self, size: int) -> int:
        """Page-aligned memory owned by the store and registered with it;
        freed at close(). Its address, or 0."""
        c = self._c
        if c is None or not isinstance(size, int) or size <= 0:
            return 0
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError, ValueError):
            return 0
        view = (ctypes.c_char * size).from_buffer(m)
        addr = ctypes.addressof(view)
        if c.register_buffer(addr, size) != 0:
            del view
            m.close()
            return 0
        with self._lock:
            self._pools[addr] = (m, view)
        return addr

    def get_offload_rpc_read_count(self) -> int:
        """Values this store read that were only on a node's SSD tier (the
        node staged them back into DRAM); 0 before setup."""
        c = self._c
        return int(c.disk_reads) if c is not None else 0

    # Replica tasks and runtime segment management are Mooncake features
    # kvpool does not have; each answers Mooncake's NOT_SUPPORTED.
    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        log.error("batch_replica_clear is not supported by kvpool")
        return []

    def create_copy_task(self, key: str, targets: Sequence[str]) -> tuple[Any, int]:
        return ((0, 0), NOT_SUPPORTED)

    def create_move_task(self, key: str, source: str, target: str) -> tuple[Any, int]:
        return ((0, 0), NOT_SUPPORTED)

    def query_task(self, task_id: Any) -> tuple[Any, int]:
        return (None, NOT_SUPPORTED)

    def mount_segment(self, path: str, size: int, offset: int = 0, protocol: str = "tcp",
                      location: str = "") -> dict[str, Any]:
        return {"ret": NOT_SUPPORTED, "segment_ids": []}

    def unmount_segment(self, segment_ids: Sequence[Any], grace_period_seconds: int = 0) -> int:
        return NOT_SUPPORTED

    def allocate_and_mount_segment(self, size: int, protocol: str = "tcp",
                                   location: str = "") -> dict[str, Any]:
        return {"ret": NOT_SUPPORTED, "segment_ids": [], "allocated_size": 0}

    def unmount_and_free_segment(self, segment_ids: Sequence[Any],
                                 grace_period_seconds: int = 0) -> int:
        return NOT_SUPPORTED

    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        return NOT_SUPPORTED


def _unmap_pop(maps: dict[int, tuple[mmap.mmap, Any]], ptr: Optional[int] = None) -> bool:
    """Pops one mapping (ptr's, or any) and closes it after dropping the
    ctypes view that exports it (an mmap with a live export cannot close).
    False when there was none."""
    if ptr is None:
        if not maps:
            return False
        entry = maps.popitem()[1]
    else:
        got = maps.pop(ptr, None)
        if got is None:
            return False
        entry = got
        del got
    m, view = entry
    del entry, view  # the last references to the view: its export ends here
    m.close()
    return True


class MooncakeHostMemAllocator:
    """Page-aligned host memory for callers that register it themselves
    (SGLang's standalone host pool): alloc(size) -> address (0 on failure),
    free(address) -> 0 or -600."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[mmap.mmap, Any]] = {}
        self._lock = threading.Lock()

    def alloc(self, size: int) -> int:
        if not isinstance(size, int) or size <= 0:
            return 0
        try:
            m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError, ValueError):
            return 0
        view = (ctypes.c_char * size).from_buffer(m)
        addr = ctypes.addressof(view)
        with self._lock:
            self._maps[addr] = (m, view)
        return addr

    def free(self, ptr: int) -> int:
        with self._lock:
            return OK if _unmap_pop(self._maps, ptr) else INVALID_PARAMS


class _NotReady(Exception):
    """The store is not set up, or closed."""


def _opts(c: Any, config: Optional[ReplicateConfig], upsert: bool = False) -> dict[str, Any]:
    """put_buffers / put_ptrs keyword arguments of a ReplicateConfig (and of
    an upsert: the master replaces the old value atomically). A soft-pin
    request the master refuses (a TTL without ENABLE, one too long) is -600
    there; an action that is not a SoftPinAction raises ValueError here."""
    flags = _native.PUT_REPLACE if upsert else 0
    if config is None:
        return {"flags": flags} if flags else {}
    if not isinstance(config, ReplicateConfig) and not hasattr(config, "replica_num"):
        raise TypeError("config must be a ReplicateConfig")
    kw: dict[str, Any] = {}
    n = int(getattr(config, "replica_num", 1) or 1)
    kw["replica_num"] = max(1, min(n, 3))  # Mooncake: best effort; kvpool keeps at most 3
    if getattr(config, "with_hard_pin", False):
        flags |= _native.PUT_HARD_PIN
    action = SoftPinAction(int(getattr(config, "soft_pin_action", SoftPinAction.PRESERVE)))
    if action == SoftPinAction.ENABLE:
        flags |= _native.PUT_SOFT_PIN
    elif action == SoftPinAction.DISABLE:
        flags |= _native.PUT_SOFT_UNPIN
    ttl = getattr(config, "soft_pin_ttl_ms", None)
    if ttl is not None:
        kw["soft_pin_ttl_ms"] = int(ttl)
    if flags:
        kw["flags"] = flags
    prefs = list(getattr(config, "preferred_segments", None) or [])
    one = getattr(config, "preferred_segment", "") or ""
    if prefs:
        kw["preferred"] = str(prefs[0])
    elif one:
        kw["preferred"] = str(one)
    elif getattr(config, "prefer_alloc_in_same_node", False):
        kw["preferred"] = str(c.segment_name)
    return kw


# ECMAScript escapes -> POSIX ERE (outside brackets) and bracket items (inside)
_CLASS_OUT = {"d": "[0-9]", "D": "[^0-9]", "w": "[[:alnum:]_]", "W": "[^[:alnum:]_]",
              "s": "[[:space:]]", "S": "[^[:space:]]"}
_CLASS_IN = {"d": "0-9", "w": "[:alnum:]_", "s": "[:space:]"}
_CTRL = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")


def _escaped_char(p: str, i: int) -> tuple[Optional[str], int]:
    """The literal character of the escape at p[i] (a backslash) and the
    index after it; None for escapes that are not a single literal."""
    if i + 1 >= len(p):
        return None, i + 1
    c = p[i + 1]
    if c in _CTRL:
        return _CTRL[c], i + 2
    if c in "xu":
        n = 2 if c == "x" else 4
        h = p[i + 2:i + 2 + n]
        if len(h) == n and all(x in "0123456789abcdefABCDEF" for x in h) and int(h, 16):
            return chr(int(h, 16)), i + 2 + n
        return None, i + 2
    if c.isalnum() or ord(c) > 127:
        return None, i + 2  # \b \B \cX \k \p back-references ...: no POSIX counterpart
    return c, i + 2  # an escaped punctuation character: itself


def _bracket(p: str, i: int) -> tuple[Optional[str], int]:
    """An ECMAScript class p[i] == '[' ... ']' as a POSIX bracket
    expression, and the index after it; None when POSIX cannot say it."""
    i += 1
    neg = p.startswith("^", i)
    if neg:
        i += 1
    items: list[str] = []
    lits: set[str] = set()
    while i < len(p) and p[i] != "]":
        if p[i] == "\\" and i + 1 < len(p) and p[i + 1] in _CLASS_IN:
            items.append(_CLASS_IN[p[i + 1]])
            i += 2
            continue
        if p[i] == "\\":
            ch, i = _escaped_char(p, i)
        else:
            ch, i = p[i], i + 1
        if ch is None or ord(ch) > 127 or ch == "\0":
            return None, i
        if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":  # a range ch-hi
            hi_ch: Optional[str]
            if p[i + 1] == "\\":
                hi_ch, i = _escaped_char(p, i + 1)
            else:
                hi_ch, i = p[i + 1], i + 2
            if hi_ch is None or ord(hi_ch) > 127 or hi_ch < ch or "]" in (ch, hi_ch) or \
                    "-" in (ch, hi_ch) or "^" in (ch, hi_ch) or "[" in (ch, hi_ch):
                return None, i
            items.append(f"{ch}-{hi_ch}")
        else:
            lits.add(ch)
    if i >= len(p):
        return None, i
    # POSIX: ']' only first, '-' only last, '^' anything but first; '[' alone is fine
    body = "".join(sorted(c for c in lits if c not in "]-^")) + "".join(items)
    if "^" in lits:
        body += "^"
    out = "[" + ("^" if neg else "") + ("]" if "]" in lits else "") + body + \
        ("-" if "-" in lits else "")
    if out in ("[", "[^"):  # ECMAScript's [] and [^]: no POSIX spelling
        return None, i + 1
    return out + "]", i + 1


def _ecma_to_posix(p: str) -> Optional[str]:
    """An ECMAScript pattern in POSIX extended syntax, or None when it uses
    what POSIX (or kvpool's master) cannot say: look-arounds, lazy
    quantifiers, back-references, \\b, counted repetition {m,n}, non-ASCII
    inside brackets. '.' keeps ECMAScript's meaning (not a line break)."""
    if p == "":
        return "^"  # the empty pattern finds every key
    out: list[str] = []
    i = 0
    while i < len(p):
        ch = p[i]
        if ch == "\\":
            if i + 1 < len(p) and p[i + 1] in _CLASS_OUT:
                out.append(_CLASS_OUT[p[i + 1]])
                i += 2
                continue
            lit, i = _escaped_char(p, i)
            if lit is None or lit == "\0":
                return None
            out.append("\\" + lit if lit in _ERE_SPECIAL else lit)
            continue
        if ch == "[":
            br, i = _bracket(p, i)
            if br is None:
                return None
            out.append(br)
            continue
        if ch == "(" and p.startswith("(?", i):
            return None  # (?: (?= (?! (?<
        if ch in "*+?" and p.startswith("?", i + 1):
            return None  # lazy quantifier
        if ch in "{}":
            return None  # counted repetition: refused by the master (its cost)
        if ch == ".":
            out.append("[^\n\r]")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _copy_range(c: Any, value: Any, base: int, dst: int, src: int, n: int) -> int:
    """One range of get_into_ranges into registered memory; bytes or a code."""
    if isinstance(value, int):
        return _mc(value)
    if value is None:
        return OBJECT_NOT_FOUND
    if not all(isinstance(x, int) for x in (base, dst, src, n)):
        return INVALID_PARAMS
    if n < 0 or src < 0 or dst < 0 or src + n > len(value):
        return INVALID_PARAMS
    if c.check_registered(base + dst, n) != 0:
        return INVALID_PARAMS
    ctypes.memmove(base + dst, value[src:src + n], n)
    return n


# ----------------------------------------------------------------- install

def install() -> None:
    """Makes ``import mooncake.store`` (and ``import mooncake``) resolve to
    this module in the current process. Refuses (RuntimeError) when the real
    Mooncake is already imported: objects of both would be mixed."""
    me = sys.modules[__name__]
    pkg = sys.modules.get("mooncake")
    store = sys.modules.get("mooncake.store")
    if store is me and pkg is not None and getattr(pkg, "__kvpool__", False):
        return
    if store is not None or (pkg is not None and not getattr(pkg, "__kvpool__", False)):
        raise RuntimeError(
            "kvpool.install_as_mooncake(): the real Mooncake is already imported in this "
            "process (sys.modules['mooncake'] is "
            f"{getattr(pkg or store, '__file__', pkg or store)!r}); call it before anything "
            "imports mooncake, or set KVPOOL_AS_MOONCAKE=1 (the package's .pth hook and vLLM's "
            "plugin then do it first)")
    shim = types.ModuleType("mooncake", "kvpool's stand-in for the mooncake package")
    shim.__path__ = []  # a package: submodules come from sys.modules only
    shim.__kvpool__ = True  # type: ignore[attr-defined]
    shim.store = me  # type: ignore[attr-defined]
    cfgmod = types.ModuleType("mooncake.mooncake_config", "kvpool's MooncakeConfig")
    cfgmod.MooncakeConfig = MooncakeConfig  # type: ignore[attr-defined]
    shim.mooncake_config = cfgmod  # type: ignore[attr-defined]
    sys.modules["mooncake"] = shim
    sys.modules["mooncake.store"] = me
    sys.modules["mooncake.mooncake_config"] = cfgmod
