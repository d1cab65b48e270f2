"""kvpool.mooncake against real kvpool processes: every method of
``MooncakeDistributedStore``, ``ReplicateConfig``, the enums, the replica
descriptors, ``BufferHandle`` and ``MooncakeHostMemAllocator``.

Expected values are Mooncake 0.3.13's, as docs/MOONCAKE_COMPAT.md records
them. Where kvpool deliberately differs (the module docstring of
kvpool/mooncake.py lists it), the test asserts kvpool's behaviour and its
name or comment says "kvpool differs". A behaviour that differs without
being documented is a bug: the test asserts Mooncake's behaviour and is
marked ``xfail(strict=True, reason="BUG: ...")``.

Most tests run on embedded-mode stores (a 64 MiB segment each) mounted at
one storage-less ``kvpool master`` per module; the standalone test uses the
``server`` fixture, and tests that kill their master use conftest's
function-scoped ``master``.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import kvpool_procs
from kvpool import mooncake as mc
from kvpool.mooncake import (BufferHandle, MooncakeDistributedStore, MooncakeHostMemAllocator,
                             ObjectDataType, ReplicaStatus, ReplicateConfig, SoftPinAction,
                             TaskStatus, TaskType)

KiB = 1 << 10
MiB = 1 << 20

# Mooncake ErrorCode numbers (mooncake-store/include/types.h)
OK = 0
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_HAS_LEASE = -706
TRANSFER_FAIL = -800
NOT_SUPPORTED = -1012

SEGMENT = 64 * MiB
LOCAL_BUFFER = 16 * MiB
HOST_PORT = re.compile(r"127\.0\.0\.1:[1-9]\d*")


# ================================================================ helpers

def open_store(master_addr: str, *, segment: int = SEGMENT, **kw: Any) -> MooncakeDistributedStore:
    """An embedded-mode store (positional setup, as vLLM calls it)."""
    s = MooncakeDistributedStore()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", segment, LOCAL_BUFFER, "tcp", "", master_addr, **kw)
    assert rc == OK
    return s


def dict_config(master_addr: str, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                           "global_segment_size": "64MB", "local_buffer_size": "16MB",
                           "protocol": "tcp", "rdma_devices": "", "master_server_addr": master_addr}
    cfg.update(over)
    return cfg


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def endpoints(store: MooncakeDistributedStore, key: str) -> list[str]:
    return [d.get_memory_descriptor().buffer_descriptor.transport_endpoint
            for d in store.get_replica_desc(key)]


def cfg(**fields: Any) -> ReplicateConfig:
    c = ReplicateConfig()
    for k, v in fields.items():
        setattr(c, k, v)
    return c


@dataclass
class Region:
    """A registered numpy buffer: ``buf[off]`` is at address ``base + off``."""
    buf: np.ndarray
    base: int

    def fill(self, off: int, data: bytes) -> None:
        self.buf[off:off + len(data)] = np.frombuffer(data, np.uint8)

    def read(self, off: int, n: int) -> bytes:
        return self.buf[off:off + n].tobytes()


# =============================================================== fixtures

@pytest.fixture(scope="module")
def mc_master() -> Iterator[kvpool_procs.Proc]:
    """One storage-less master for the module's embedded stores."""
    p = kvpool_procs.master("--lease-ttl", "30s", "--client-ttl", "60s")
    yield p
    p.stop()


@pytest.fixture
def store(mc_master: kvpool_procs.Proc) -> Iterator[MooncakeDistributedStore]:
    s = open_store(mc_master.addr)
    yield s
    s.remove_all(force=True)
    s.close()


@pytest.fixture
def store2(mc_master: kvpool_procs.Proc) -> Iterator[MooncakeDistributedStore]:
    """A second embedded store (a second segment) on the same master."""
    s = open_store(mc_master.addr)
    yield s
    s.remove_all(force=True)
    s.close()


@pytest.fixture
def region(store: MooncakeDistributedStore) -> Iterator[Region]:
    """4 MiB registered with ``store``, filled with 0xEE."""
    buf = np.full(4 * MiB, 0xEE, np.uint8)
    assert store.register_buffer(addr(buf), buf.nbytes) == OK
    yield Region(buf, addr(buf))
    store.unregister_buffer(addr(buf))


# ================================================= module surface (no I/O)

def test_replicate_config_defaults() -> None:
    c = ReplicateConfig()
    assert (c.replica_num, c.nof_replica_num, c.dfs_replica_num) == (1, 0, 0)
    assert c.soft_pin_action is SoftPinAction.PRESERVE and c.soft_pin_ttl_ms is None
    assert c.with_hard_pin is False and c.prefer_alloc_in_same_node is False
    assert c.preferred_segments == [] and c.preferred_nof_segments == []
    assert c.preferred_segment == ""
    assert c.data_type is ObjectDataType.UNKNOWN
    assert str(c).startswith("ReplicateConfig: { replica_num: 1, nof_replica_num: 0")


def test_replicate_config_fields_on_class_and_per_instance() -> None:
    for field in ("replica_num", "preferred_segment", "with_hard_pin", "soft_pin_ttl_ms"):
        assert hasattr(ReplicateConfig, field)  # vLLM and SGLang probe the class
    a, b = ReplicateConfig(), ReplicateConfig()
    a.preferred_segments.append("x:1")
    a.replica_num = 2
    assert b.preferred_segments == [] and b.replica_num == 1


def test_replicate_config_refuses_groups_and_sessions_with_a_reason() -> None:
    """kvpool differs: no object groups, no writer sessions on KV events.
    The fields are absent, so the callers' capability probes answer False
    (vLLM and SGLang then put each key on its own), and setting one fails
    loudly instead of being kept and never read; so does any unknown field,
    as on Mooncake's pybind class."""
    for field in ("group_ids", "session_ids"):
        assert not hasattr(ReplicateConfig, field) and not hasattr(ReplicateConfig(), field)
    c = ReplicateConfig()
    with pytest.raises(AttributeError, match="no object groups"):
        c.group_ids = ["g0"]
    with pytest.raises(AttributeError, match="KV events carry no writer session"):
        c.session_ids = ["s0"]
    with pytest.raises(AttributeError, match="no attribute 'replica_nmu'"):
        c.replica_nmu = 2  # type: ignore[attr-defined]


def test_enums_values_and_module_exports() -> None:
    assert int(ObjectDataType.KVCACHE) == 1 and ObjectDataType.GENERAL == 9
    assert [m.name for m in SoftPinAction] == ["PRESERVE", "ENABLE", "DISABLE"]
    assert ReplicaStatus.COMPLETE == 3 and ReplicaStatus.FAILED == 5
    assert dict(TaskStatus.__members__) == {"PENDING": 0, "PROCESSING": 1, "FAILED": 2,
                                            "SUCCESS": 3}
    assert (TaskType.REPLICA_COPY, TaskType.REPLICA_MOVE) == (0, 1)
    assert mc.KVCACHE is ObjectDataType.KVCACHE and mc.COMPLETE is ReplicaStatus.COMPLETE
    # TaskStatus is exported last: module-level PROCESSING / FAILED are TaskStatus's
    assert mc.PROCESSING is TaskStatus.PROCESSING and mc.FAILED is TaskStatus.FAILED
    assert not hasattr(mc, "PRESERVE")  # SoftPinAction members are not module-level


def test_descriptor_repr() -> None:
    d = mc.BufferDescriptor(6, 0, "127.0.0.1:1")
    assert repr(d) == "<Descriptor size=6 buffer_address=0 transport_endpoint=127.0.0.1:1>"
    assert mc.MemoryDescriptor(d).buffer_descriptor is d


def test_host_mem_allocator_alloc() -> None:
    a = MooncakeHostMemAllocator()
    p = a.alloc(64 * KiB)
    assert isinstance(p, int) and p != 0 and p % mmap.PAGESIZE == 0
    ctypes.memset(p, 0x5A, 64 * KiB)  # writable
    assert ctypes.string_at(p + 64 * KiB - 3, 3) == b"ZZZ"
    assert a.alloc(0) == 0 and a.alloc(-1) == 0
    assert a.free(12345) == INVALID_PARAMS


def test_host_mem_allocator_free() -> None:
    a = MooncakeHostMemAllocator()
    assert a.free(a.alloc(4096)) == OK


def test_get_session_methods_exist() -> None:
    for name in ("batch_get_session_start", "batch_get_into_multi_buffer_ranges",
                 "batch_get_session_end"):
        assert callable(getattr(MooncakeDistributedStore, name, None)), name


# ================================================================ lifecycle

def test_setup_positional_engine_and_keywords(mc_master: kvpool_procs.Proc) -> None:
    s = MooncakeDistributedStore()
    try:
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "",
                     mc_master.addr, None, enable_ssd_offload=False, ssd_offload_path="",
                     tenant_id="pos", enable_client_http_server=False, client_http_port=9300)
        assert rc == OK
        assert HOST_PORT.fullmatch(s.get_hostname())
        assert s.health_check() == 0
        assert s.put("k", b"v") == OK and s.get("k") == b"v"
    finally:
        s.remove_all(force=True)
        s.close()


def test_setup_positional_argument_errors(mc_master: kvpool_procs.Proc) -> None:
    s = MooncakeDistributedStore()
    with pytest.raises(TypeError):  # the first 7 arguments are required
        s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT)
    # SGLang drops the keyword named in the message and retries
    with pytest.raises(TypeError, match="no_such_kw"):
        s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "",
                mc_master.addr, None, no_such_kw=1)
    assert s.health_check() == 1


def test_setup_dict_form(mc_master: kvpool_procs.Proc) -> None:
    s = MooncakeDistributedStore()
    try:  # values are str()ed: ints and booleans work too
        assert s.setup(dict_config(mc_master.addr, local_buffer_size="1.5 GB",
                                   enable_ssd_offload=False, tenant_id="dict")) == OK
        assert HOST_PORT.fullmatch(s.get_hostname())
        assert s.put("k", b"dict") == OK and s.get("k") == b"dict"
        assert s.setup(dict_config(mc_master.addr, global_segment_size=SEGMENT,
                                   enable_client_http_server=True)) == OK
    finally:
        s.remove_all(force=True)
        s.close()


@pytest.mark.parametrize("drop", ["local_hostname", "metadata_server"])
def test_setup_dict_missing_required_key(mc_master: kvpool_procs.Proc, drop: str) -> None:
    c = dict_config(mc_master.addr)
    del c[drop]
    s = MooncakeDistributedStore()
    assert s.setup(c) == INVALID_PARAMS
    assert s.health_check() == 1


@pytest.mark.parametrize("size", ["12XB", "100"])
def test_setup_dict_bad_segment_size(mc_master: kvpool_procs.Proc, size: str) -> None:
    assert MooncakeDistributedStore().setup(
        dict_config(mc_master.addr, global_segment_size=size)) == INVALID_PARAMS


def test_setup_unreachable_master_fails_fast() -> None:
    s = MooncakeDistributedStore()
    t0 = time.monotonic()
    rc = s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", "127.0.0.1:1")
    assert rc < 0 and time.monotonic() - t0 < 5
    assert s.health_check() == 1 and s.put("k", b"v") == INVALID_PARAMS


def test_setup_unreachable_master_code_is_minus_1() -> None:
    assert MooncakeDistributedStore().setup(
        "127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "", "127.0.0.1:1") == -1


def test_setup_silent_master_honours_rpc_timeout() -> None:
    """A master that accepts but never answers. "rpc_timeout" is not a
    Mooncake setup key (Mooncake ignores it and waits ~90 s); kvpool differs:
    it passes the key through, so setup gives up after 0.5 s."""
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen(8)
        silent = f"127.0.0.1:{ls.getsockname()[1]}"
        s = MooncakeDistributedStore()
        t0 = time.monotonic()
        rc = s.setup(dict_config(silent, rpc_timeout="500"))
        assert rc < 0 and time.monotonic() - t0 < 3
        assert s.health_check() == 1


def test_setup_local_hostname_port_is_not_kept(mc_master: kvpool_procs.Proc) -> None:
    """kvpool differs: an explicit port in local_hostname is dropped (the
    segment server picks its own port; Mooncake would serve on 13555). The
    module docstring does not list this difference."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1:13555", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "",
                   mc_master.addr) == OK
    try:
        assert HOST_PORT.fullmatch(s.get_hostname())
        assert s.put("k", b"v") == OK and endpoints(s, "k") == [s.get_hostname()]
    finally:
        s.remove_all(force=True)
        s.close()


def test_second_setup_replaces_client(mc_master: kvpool_procs.Proc) -> None:
    s = open_store(mc_master.addr)
    try:
        first = s.get_hostname()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", SEGMENT, LOCAL_BUFFER, "tcp", "",
                       mc_master.addr) == OK
        assert s.get_hostname() != first and s.health_check() == 0
        assert s.put("k2", b"new") == OK and endpoints(s, "k2") == [s.get_hostname()]
    finally:
        s.remove_all(force=True)
        s.close()


def test_rdma_protocol_and_an_unknown_one(mc_master: kvpool_procs.Proc,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """rdma is kvpool's ucx transport (to other hosts; shared memory on this
    one): no warning. A protocol kvpool does not have warns and uses shm / TCP."""
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        assert s.setup(dict_config(mc_master.addr, protocol="rdma", rdma_devices="mlx5_0")) == OK
    try:
        assert not any("protocol" in r.getMessage() for r in caplog.records)
        assert s.put("k", b"v") == OK and s.get("k") == b"v"
    finally:
        s.remove_all(force=True)
        s.close()
    s = MooncakeDistributedStore()
    with caplog.at_level(logging.WARNING, logger="kvpool.mooncake"):
        assert s.setup(dict_config(mc_master.addr, protocol="nvlink")) == OK
    try:
        assert any(r.levelno == logging.WARNING and "nvlink" in r.getMessage()
                   for r in caplog.records)
        assert s.put("k2", b"v") == OK and s.get("k2") == b"v"
    finally:
        s.remove_all(force=True)
        s.close()


def test_tenant_id_isolates_keys(mc_master: kvpool_procs.Proc) -> None:
    a = open_store(mc_master.addr, tenant_id="tenant-a")
    b = open_store(mc_master.addr, tenant_id="tenant-b")
    try:
        assert a.put("k", b"from-a") == OK
        assert b.is_exist("k") == 0 and b.get("k") == b""
        assert b.put("k", b"from-b") == OK
        assert (a.get("k"), b.get("k")) == (b"from-a", b"from-b")
        assert b.remove_by_regex("k") == 1 and a.is_exist("k") == 1
        assert b.remove_all() == 0 and a.remove_all() == 1
    finally:
        a.close()
        b.close()


def test_standalone_mode(server: kvpool_procs.Proc) -> None:
    """global_segment_size 0: the store only talks to `kvpool serve`'s segment.
    With no segment of its own, get_hostname() is the host and a port of
    Mooncake's client range that the store holds (test_mooncake_suite.py)."""
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, LOCAL_BUFFER, "tcp", "", server.addr) == OK
    try:
        assert HOST_PORT.fullmatch(s.get_hostname()) and s.health_check() == 0
        assert s.put("sa", b"standalone") == OK and s.get("sa") == b"standalone"
        (ep,) = endpoints(s, "sa")
        assert HOST_PORT.fullmatch(ep) and ep != s.get_hostname()
    finally:
        s.remove_all(force=True)
        s.close()


def test_health_check_codes(master: kvpool_procs.Proc) -> None:
    s = MooncakeDistributedStore()
    assert s.health_check() == 1  # not set up
    assert s.setup(dict_config(master.addr)) == OK
    assert s.health_check() == 0
    master.stop()
    assert s.health_check() == 2  # the master does not answer
    assert s.close() == OK
    assert s.health_check() == 1


def test_get_hostname_is_the_embedded_segment(store: MooncakeDistributedStore) -> None:
    h = store.get_hostname()
    assert HOST_PORT.fullmatch(h)
    assert store.put("k", b"v") == OK and endpoints(store, "k") == [h]


def test_close_is_idempotent(mc_master: kvpool_procs.Proc) -> None:
    assert MooncakeDistributedStore().close() == OK  # never set up
    s = open_store(mc_master.addr)
    assert s.close() == OK and s.close() == OK
    assert s.health_check() == 1


def test_init_all_legacy(mc_master: kvpool_procs.Proc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOONCAKE_MASTER", mc_master.addr)
    monkeypatch.setenv("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1")
    s = MooncakeDistributedStore()
    assert s.init_all("tcp", "", SEGMENT) == OK
    try:
        assert HOST_PORT.fullmatch(s.get_hostname())
        assert s.put("k", b"legacy") == OK and s.get("k") == b"legacy"
    finally:
        s.remove_all(force=True)
        s.close()


def test_setup_dummy_is_a_client_without_a_segment(mc_master: kvpool_procs.Proc,
                                                   store: MooncakeDistributedStore) -> None:
    """SGLang's standalone_storage mode: setup_dummy(size, local_buffer,
    server_address) names the kvpool master; the client contributes no
    memory, its registered pool's bytes go to the segments others serve
    (here ``store``'s) and come back equal."""
    d = MooncakeDistributedStore()
    assert d.setup_dummy(64 * MiB, LOCAL_BUFFER, mc_master.addr) == OK
    try:
        assert d.health_check() == 0
        src = np.arange(3 * MiB, dtype=np.uint8) * 7
        dst = np.zeros_like(src)
        assert d.register_buffer(addr(src), src.nbytes) == OK
        assert d.register_buffer(addr(dst), dst.nbytes) == OK
        assert d.batch_put_from(["dm0", "dm1"], [addr(src), addr(src) + MiB], [MiB, 2 * MiB]) \
            == [OK, OK]
        assert store.batch_is_exist(["dm0", "dm1"]) == [1, 1]  # in the embedded segment
        assert d.batch_get_into(["dm1", "dm0"], [addr(dst), addr(dst) + 2 * MiB],
                                [2 * MiB, MiB]) == [2 * MiB, MiB]
        assert np.array_equal(dst[:2 * MiB], src[MiB:]) and np.array_equal(dst[2 * MiB:],
                                                                            src[:MiB])
        assert store.get("dm0") == src[:MiB].tobytes()
        assert endpoints(store, "dm0") == [store.get_hostname()]
    finally:
        d.close()


@pytest.mark.parametrize("args", [(-1, LOCAL_BUFFER, "127.0.0.1:1"), (MiB, -1, "127.0.0.1:1"),
                                  (MiB, LOCAL_BUFFER, ""), (MiB, LOCAL_BUFFER, None),
                                  (True, LOCAL_BUFFER, "127.0.0.1:1")])
def test_setup_dummy_bad_arguments(args: tuple[Any, Any, Any]) -> None:
    s = MooncakeDistributedStore()
    assert s.setup_dummy(*args) == INVALID_PARAMS
    assert s.health_check() == 1


# ------------------------------------------- calls before setup / after close

def _unready_calls(p: int) -> list[tuple[str, Callable[[MooncakeDistributedStore], Any], Any]]:
    """(name, call, expected) for a store that is not set up; p is a real address.
    batch_put_from_multi_buffers: Mooncake answers [], kvpool differs with -600
    per key (callers index the results by key)."""
    E = INVALID_PARAMS
    return [
        ("put", lambda s: s.put("k", b"v"), E),
        ("put_parts", lambda s: s.put_parts("k", b"a", b"b"), E),
        ("put_batch", lambda s: s.put_batch(["k"], [b"v"]), E),
        ("upsert", lambda s: s.upsert("k", b"v"), E),
        ("upsert_parts", lambda s: s.upsert_parts("k", b"v"), E),
        ("upsert_batch", lambda s: s.upsert_batch(["k"], [b"v"]), E),
        ("get", lambda s: s.get("k"), b""),
        ("get_batch", lambda s: s.get_batch(["k"]), [b""]),
        ("get_buffer", lambda s: s.get_buffer("k"), None),
        ("batch_get_buffer", lambda s: s.batch_get_buffer(["k", "j"]), [None, None]),
        ("register_buffer", lambda s: s.register_buffer(p, 64), E),
        ("unregister_buffer", lambda s: s.unregister_buffer(p), E),
        ("put_from", lambda s: s.put_from("k", p, 8), E),
        ("put_from_with_metadata", lambda s: s.put_from_with_metadata("k", p, p, 8, 8), E),
        ("batch_put_from", lambda s: s.batch_put_from(["k", "j"], [p, p], [8, 8]), [E, E]),
        ("batch_put_from_multi_buffers",
         lambda s: s.batch_put_from_multi_buffers(["k"], [[p]], [[8]]), [E]),
        ("upsert_from", lambda s: s.upsert_from("k", p, 8), E),
        ("batch_upsert_from", lambda s: s.batch_upsert_from(["k"], [p], [8]), [E]),
        ("get_into", lambda s: s.get_into("k", p, 8), E),
        ("batch_get_into", lambda s: s.batch_get_into(["k"], [p], [8]), [E]),
        ("batch_get_into_multi_buffers",
         lambda s: s.batch_get_into_multi_buffers(["k"], [[p]], [[8]]), [E]),
        ("get_into_ranges", lambda s: s.get_into_ranges([p], [["k"]], [[[0]]], [[[0]]], [[[8]]]),
         [[[E]]]),
        ("batch_put_from_multi_buffer_ranges",
         lambda s: s.batch_put_from_multi_buffer_ranges(["k"], [[p]], [[8]], [[0]]), [E]),
        ("is_exist", lambda s: s.is_exist("k"), E),
        ("batch_is_exist", lambda s: s.batch_is_exist(["k", "j"]), [E, E]),
        ("get_size", lambda s: s.get_size("k"), E),
        ("remove", lambda s: s.remove("k"), E),
        ("batch_remove", lambda s: s.batch_remove(["k"], force=True), [E]),
        ("remove_by_regex", lambda s: s.remove_by_regex("k"), E),
        ("remove_all", lambda s: s.remove_all(force=True), E),
        ("get_replica_desc", lambda s: s.get_replica_desc("k"), []),
        ("batch_get_replica_desc", lambda s: s.batch_get_replica_desc(["k"]), {}),
        ("alloc_from_mem_pool", lambda s: s.alloc_from_mem_pool(4096), 0),
        ("health_check", lambda s: s.health_check(), 1),
        ("get_offload_rpc_read_count", lambda s: s.get_offload_rpc_read_count(), 0),
        ("close", lambda s: s.close(), OK),
    ]


@pytest.mark.parametrize("state", ["fresh", "closed"])
def test_calls_without_client_never_crash(mc_master: kvpool_procs.Proc, state: str) -> None:
    s = MooncakeDistributedStore()
    if state == "closed":
        s = open_store(mc_master.addr)
        s.close()
    mem = np.zeros(4096, np.uint8)
    got = {name: call(s) for name, call, _ in _unready_calls(addr(mem))}
    assert got == {name: want for name, _, want in _unready_calls(addr(mem))}
    assert isinstance(s.get_hostname(), str)
    assert bytes(mem) == bytes(4096)  # nothing was written


def test_put_session_calls_without_client() -> None:
    s = MooncakeDistributedStore()
    assert s.batch_put_session_start(["k"], [8]) == [INVALID_PARAMS]
    assert s.batch_put_session_end(["k"]) == [INVALID_PARAMS]
    assert s.batch_put_session_revoke(["k"]) == [INVALID_PARAMS]


# ================================================================ bytes API

BUFFER_KINDS: dict[str, Callable[[bytes], Any]] = {
    "bytes": lambda b: b,
    "bytearray": bytearray,
    "memoryview": memoryview,
    "numpy_u8": lambda b: np.frombuffer(b, np.uint8).copy(),
    "numpy_f32_2d": lambda b: np.frombuffer(b, np.float32).reshape(4, -1).copy(),
}


@pytest.mark.parametrize("kind", list(BUFFER_KINDS))
def test_put_get_buffer_types(store: MooncakeDistributedStore, kind: str) -> None:
    data = pattern(4096, 1)
    assert store.put(f"bt/{kind}", BUFFER_KINDS[kind](data)) == OK
    got = store.get(f"bt/{kind}")
    assert type(got) is bytes and got == data
    assert store.get_size(f"bt/{kind}") == 4096


@pytest.mark.parametrize("call", [
    lambda s: s.put("k", "text"),
    lambda s: s.put("k", 12345),
    lambda s: s.put_batch(["k"], ["text"]),
    lambda s: s.upsert("k", "text"),
    lambda s: s.upsert_batch(["k"], [None]),
    lambda s: s.put_parts("k", b"ok", "text"),  # Mooncake raises RuntimeError here
    lambda s: s.put("k", np.arange(16, dtype=np.uint8)[::2]),  # not C-contiguous
])
def test_wrong_value_types_raise_type_error(store: MooncakeDistributedStore,
                                            call: Callable[[Any], Any]) -> None:
    with pytest.raises(TypeError):
        call(store)
    assert store.is_exist("k") == 0


def test_empty_value_or_key(store: MooncakeDistributedStore) -> None:
    assert store.put("k", b"") == INVALID_PARAMS and store.is_exist("k") == 0
    assert store.put("", b"x") == INVALID_PARAMS
    assert store.put_parts("k") == INVALID_PARAMS
    assert store.upsert("", b"x") == INVALID_PARAMS
    assert store.get("") == b"" and store.get_buffer("") is None


def test_existing_key_keeps_old_value(store: MooncakeDistributedStore) -> None:
    assert store.put("k", b"first") == OK
    assert store.put("k", b"second, longer") == OK
    assert store.put_batch(["k", "n"], [b"third", b"new"]) == OK
    assert store.put_parts("k", b"x", b"y") == OK
    assert store.get_batch(["k", "n"]) == [b"first", b"new"]


def test_put_parts_joins_in_order(store: MooncakeDistributedStore) -> None:
    parts = [b"ab", bytearray(b"cd"), memoryview(b"ef"), np.frombuffer(b"gh", np.uint8)]
    assert store.put_parts("p", *parts, config=ReplicateConfig()) == OK
    assert store.get("p") == b"abcdefgh"


def test_put_batch(store: MooncakeDistributedStore) -> None:
    vals = [pattern(100 * (i + 1), i) for i in range(3)]
    assert store.put_batch(["b0", "b1", "b2"], vals) == OK
    assert store.get_batch(["b0", "b1", "b2"]) == vals
    assert store.put_batch(["x"], []) == INVALID_PARAMS and store.is_exist("x") == 0
    assert store.put_batch([], []) == OK


def test_get_and_get_batch_misses(store: MooncakeDistributedStore) -> None:
    assert store.put("hello", b"hello") == OK
    assert store.get("nope") == b""
    assert store.get_batch(["hello", "nope"]) == [b"hello", b""]
    assert store.get_batch([]) == [b""]  # Mooncake's quirk: one empty value


def test_get_buffer_handle(store: MooncakeDistributedStore) -> None:
    data = pattern(10000, 2)
    assert store.put("h", data) == OK
    h = store.get_buffer("h")
    assert isinstance(h, BufferHandle)
    assert h.size() == len(h) == len(data)
    assert isinstance(h.ptr(), int) and ctypes.string_at(h.ptr(), h.size()) == data
    mv = memoryview(h)
    assert (mv.ndim, mv.itemsize, mv.nbytes) == (1, 1, len(data))
    assert bytes(mv) == data and bytes(h) == data
    assert np.frombuffer(h, np.uint8).tobytes() == data
    assert store.get_buffer("nope") is None


def test_batch_get_buffer(store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["a", "b"], [b"AAA", b"BBBB"]) == OK
    ha, miss, hb = store.batch_get_buffer(["a", "nope", "b"])
    assert miss is None and bytes(memoryview(ha)) == b"AAA" and bytes(hb) == b"BBBB"
    assert store.batch_get_buffer([]) == []


def test_buffer_handle_format(store: MooncakeDistributedStore) -> None:
    """kvpool differs: BufferHandle is a bytearray, format 'B' (Mooncake's: 'b');
    bytes, memoryview and torch.frombuffer work the same."""
    assert store.put("h", b"xyz") == OK
    assert memoryview(store.get_buffer("h")).format == "B"


def test_upsert_forms_replace(store: MooncakeDistributedStore) -> None:
    assert store.upsert("u", b"one") == OK and store.get("u") == b"one"
    assert store.upsert("u", b"two, longer") == OK and store.get("u") == b"two, longer"
    assert store.upsert_parts("u", b"3", bytearray(b"!")) == OK and store.get("u") == b"3!"
    assert store.upsert_batch(["u", "v"], [b"four", b"v"]) == OK
    assert store.get_batch(["u", "v"]) == [b"four", b"v"]
    assert store.upsert_batch(["u"], []) == INVALID_PARAMS and store.get("u") == b"four"


def test_upsert_refused_for_space_keeps_old_value(mc_master: kvpool_procs.Proc) -> None:
    """The master replaces atomically: an upsert whose new value cannot be
    placed (here: larger than the pool keeps) leaves the old value readable."""
    s = open_store(mc_master.addr, segment=8 * MiB)
    try:
        assert s.put("big", b"o" * MiB) == OK
        assert s.upsert("big", b"n" * (16 * MiB)) != OK
        assert s.get("big") == b"o" * MiB
        assert s.upsert("big", b"n" * (2 * MiB)) == OK and s.get("big") == b"n" * (2 * MiB)
    finally:
        s.remove_all(force=True)
        s.close()


def test_soft_pin_ttl_field_is_an_optional_u64() -> None:
    c = ReplicateConfig()
    c.soft_pin_ttl_ms = 1000
    assert c.soft_pin_ttl_ms == 1000
    c.soft_pin_ttl_ms = None
    assert c.soft_pin_ttl_ms is None
    for bad in (-1, 1 << 64, 1.5, "10", True):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad
    c.soft_pin_ttl_ms = (1 << 64) - 1
    assert "soft_pin_ttl_ms: 18446744073709551615" in str(c)


def test_soft_pin_requests_checked_at_the_master(store: MooncakeDistributedStore) -> None:
    E = SoftPinAction.ENABLE
    assert store.put("sp", b"v", cfg(soft_pin_action=E, soft_pin_ttl_ms=1000)) == OK
    assert store.upsert("sp", b"v", cfg(soft_pin_ttl_ms=1000)) == INVALID_PARAMS
    assert store.upsert("sp", b"v", cfg(soft_pin_action=SoftPinAction.DISABLE,
                                        soft_pin_ttl_ms=1000)) == INVALID_PARAMS
    assert store.upsert("sp", b"w", cfg(soft_pin_action=E, soft_pin_ttl_ms=25 * 3600 * 1000)) \
        == INVALID_PARAMS  # over soft_pin_max_ttl (24 h)
    assert store.upsert("sp", b"w", cfg(soft_pin_action=E, soft_pin_ttl_ms=(1 << 64) - 1)) \
        == INVALID_PARAMS
    assert store.get("sp") == b"v"
    assert store.upsert("sp", b"x") == OK
    assert store.upsert("sp", b"y", cfg(soft_pin_action=SoftPinAction.DISABLE)) == OK
    assert store.put("sp2", b"v", cfg(soft_pin_action=E)) == OK  # the master's default TTL
    assert store.get_batch(["sp", "sp2"]) == [b"y", b"v"]


def test_soft_pinned_objects_outlive_unpinned_ones(mc_master: kvpool_procs.Proc) -> None:
    """A soft-pinned object is evicted only after the unpinned ones, while
    its pin lasts; a pin that ended makes it an ordinary victim."""
    s = open_store(mc_master.addr, segment=8 * MiB)
    E = SoftPinAction.ENABLE
    try:
        assert s.put("pin/long", b"L" * MiB, cfg(soft_pin_action=E)) == OK
        assert s.put("pin/short", b"S" * MiB, cfg(soft_pin_action=E, soft_pin_ttl_ms=300)) == OK
        time.sleep(1.0)  # the master's sweep ends the short pin
        for i in range(12):  # 12 MiB through an 8 MiB pool
            assert s.put(f"fill/{i}", bytes([i]) * MiB) == OK
        assert s.get("pin/long") == b"L" * MiB
        assert s.is_exist("pin/short") == 0
        assert s.is_exist("fill/0") == 0 and s.get("fill/11") == bytes([11]) * MiB
    finally:
        s.remove_all(force=True)
        s.close()


def test_failed_upsert_keeps_old_value(store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["a", "b", "c"], [b"old-a", b"old-b", b"old-c"]) == OK
    assert store.upsert("a", b"") == INVALID_PARAMS
    with pytest.raises(TypeError):
        store.upsert("b", "text")
    assert store.upsert_from("c", 4096, 8) == INVALID_PARAMS
    assert store.get_batch(["a", "b", "c"]) == [b"old-a", b"old-b", b"old-c"]


def test_value_larger_than_local_buffer(store: MooncakeDistributedStore) -> None:
    """kvpool differs: no staging buffer, so a value above local_buffer_size is
    stored (Mooncake answers -600)."""
    big = pattern(LOCAL_BUFFER + 4 * MiB, 3)
    assert store.put("big", big) == OK and store.get("big") == big


def test_pool_full_is_no_available_handle(store: MooncakeDistributedStore) -> None:
    """Hard-pinned objects cannot be evicted: a full pool answers -200."""
    big, pin = bytes(12 * MiB), cfg(with_hard_pin=True)
    assert [store.put(f"full/{i}", big, pin) for i in range(5)] == [OK] * 5  # 60 of 64 MiB
    assert store.put("full/5", big, pin) == NO_AVAILABLE_HANDLE
    assert store.put_batch(["full/6"], [big]) == NO_AVAILABLE_HANDLE
    mem = np.zeros(12 * MiB, np.uint8)
    assert store.register_buffer(addr(mem), mem.nbytes) == OK
    assert store.put_from("full/7", addr(mem), mem.nbytes) == NO_AVAILABLE_HANDLE
    assert store.batch_put_from_multi_buffers(["full/8"], [[addr(mem)]], [[mem.nbytes]]) \
        == [NO_AVAILABLE_HANDLE]
    assert store.unregister_buffer(addr(mem)) == OK


def test_full_pool_evicts_for_plain_puts(store: MooncakeDistributedStore) -> None:
    """kvpool differs: a put into a pool full of evictable objects evicts the
    oldest and succeeds (Mooncake evicts in the background and answers -200
    meanwhile). The module docstring does not list this difference."""
    keys = [f"ev/{i}" for i in range(8)]
    assert [store.put(k, bytes(12 * MiB)) for k in keys] == [OK] * 8  # 96 MiB into 64
    exist = store.batch_is_exist(keys)
    assert exist[-1] == 1 and exist[0] == 0 and sum(exist) <= 5


def test_prefer_alloc_in_same_node(store: MooncakeDistributedStore,
                                   store2: MooncakeDistributedStore) -> None:
    """kvpool differs: Mooncake's put paths refuse prefer_alloc_in_same_node
    (-600); kvpool honours it as "this client's own segment"."""
    assert store2.put("same", b"v", cfg(prefer_alloc_in_same_node=True)) == OK
    assert endpoints(store2, "same") == [store2.get_hostname()]


# ================================================================ zero-copy

def test_register_unregister(store: MooncakeDistributedStore) -> None:
    buf = np.zeros(64 * KiB, np.uint8)
    p = addr(buf)
    assert store.register_buffer(p, buf.nbytes) == OK
    assert store.register_buffer(p, buf.nbytes) == INVALID_PARAMS  # twice
    assert store.register_buffer(p + 100, 10) == INVALID_PARAMS  # overlaps
    assert store.register_buffer(p + buf.nbytes, -1) == INVALID_PARAMS
    assert store.unregister_buffer(p + 1) == INVALID_PARAMS  # not a registered base
    assert store.unregister_buffer(p) == OK
    assert store.unregister_buffer(p) == INVALID_PARAMS  # unknown now


def test_put_from_get_into_odd_offsets(store: MooncakeDistributedStore, region: Region) -> None:
    data = pattern(1001, 4)
    region.fill(7, data)
    assert store.put_from("z", region.base + 7, len(data)) == OK
    assert store.get_size("z") == 1001 and store.get("z") == data
    assert store.get_into("z", region.base + 300001, 8192) == 1001  # larger dst is fine
    assert region.read(300001, 1001) == data
    assert region.buf[300001 + 1001] == 0xEE  # nothing written past the value


def test_get_into_errors(store: MooncakeDistributedStore, region: Region) -> None:
    assert store.put_from("z", region.base, 4096) == OK
    assert store.get_into("z", region.base + MiB, 4095) == INVALID_PARAMS  # dst too small
    assert store.get_into("nope", region.base + MiB, 4096) == OBJECT_NOT_FOUND
    assert store.get_into("z", region.base + MiB, -5) == INVALID_PARAMS
    assert region.read(MiB, 4096) == b"\xee" * 4096


def test_put_from_zero_size_stores_nothing(store: MooncakeDistributedStore,
                                           region: Region) -> None:
    assert store.put_from("zero", region.base, 0) == OK
    assert store.is_exist("zero") == 0


def test_zero_copy_existing_key_keeps_old_value(store: MooncakeDistributedStore,
                                                region: Region) -> None:
    region.fill(0, b"old!" + b"new, longer")
    assert store.put_from("k", region.base, 4) == OK
    assert store.put_from("k", region.base + 4, 11) == OK
    assert store.batch_put_from(["k"], [region.base + 4], [11]) == [OK]
    assert store.batch_put_from_multi_buffers(["k"], [[region.base + 4]], [[11]]) == [OK]
    assert store.get("k") == b"old!"


def test_put_from_negative_size(store: MooncakeDistributedStore, region: Region) -> None:
    """Mooncake's size_t argument would raise TypeError; kvpool answers -600."""
    assert store.put_from("neg", region.base, -1) == INVALID_PARAMS
    assert store.batch_put_from(["a", "b"], [region.base] * 2, [5, -1]) == [INVALID_PARAMS] * 2
    assert store.batch_is_exist(["neg", "a", "b"]) == [0, 0, 0]


def test_unregistered_addresses_refused(store: MooncakeDistributedStore) -> None:
    """kvpool differs: raw addresses must lie in a registered range (Mooncake
    over TCP reads any pointer); the rest get -600 before a byte is touched.
    The module docstring does not list this difference."""
    mem = np.full(8192, 7, np.uint8)
    p = addr(mem)
    assert store.put_from("u", p, 4096) == INVALID_PARAMS and store.is_exist("u") == 0
    assert store.put("v", b"v" * 100) == OK
    assert store.get_into("v", p, 4096) == INVALID_PARAMS
    for bad in (0, 1, 2**64 - 1, 2**64 + 5, -4096):
        assert store.put_from("u", bad, 16) == INVALID_PARAMS
        assert store.get_into("v", bad, 4096) == INVALID_PARAMS
    assert bytes(mem) == b"\x07" * 8192


def test_ranges_crossing_the_registered_edge(store: MooncakeDistributedStore) -> None:
    outer = np.full(3 * 4096, 0xAB, np.uint8)
    inner = addr(outer) + 4096  # only the middle page is registered
    assert store.register_buffer(inner, 4096) == OK
    assert store.put("v", b"x" * 64) == OK
    for start in (inner - 16, inner + 4096 - 16):  # overlaps an edge
        assert store.put_from("e", start, 64) == INVALID_PARAMS
        assert store.get_into("v", start, 64) == INVALID_PARAMS
    assert store.get_into("v", inner + 4096 - 64, 64) == 64  # flush with the edge
    assert store.is_exist("e") == 0
    assert bytes(outer[:4096]) == b"\xab" * 4096 and bytes(outer[8192:]) == b"\xab" * 4096
    assert store.unregister_buffer(inner) == OK


def test_overlapping_source_ranges(store: MooncakeDistributedStore, region: Region) -> None:
    data = pattern(3000, 5)
    region.fill(0, data)
    keys = ["o1", "o2", "o3"]
    assert store.batch_put_from(keys, [region.base, region.base + 1000, region.base + 1],
                                [2000, 2000, 2999]) == [OK] * 3
    assert store.get_batch(keys) == [data[:2000], data[1000:], data[1:]]


def test_batch_put_from_and_batch_get_into(store: MooncakeDistributedStore,
                                           region: Region) -> None:
    vals = [pattern(n, n) for n in (4096, 333, 77777)]
    offs = [3, 8191, 100003]
    for o, v in zip(offs, vals):
        region.fill(o, v)
    keys = ["bk0", "bk1", "bk2"]
    assert store.batch_put_from(keys, [region.base + o for o in offs],
                                [len(v) for v in vals]) == [OK] * 3
    dst = [MiB + 1, 2 * MiB + 5, 3 * MiB + 7]
    res = store.batch_get_into(["bk0", "nope", "bk2"], [region.base + d for d in dst],
                               [8192, 100, 77776])
    assert res == [4096, OBJECT_NOT_FOUND, INVALID_PARAMS]  # as Mooncake: [n, -704, -600]
    assert region.read(dst[0], 4096) == vals[0]
    assert store.batch_get_into(keys, [region.base + d for d in dst],
                                [len(v) for v in vals]) == [len(v) for v in vals]
    assert [region.read(d, len(v)) for d, v in zip(dst, vals)] == vals


def test_batch_zero_copy_length_mismatch(store: MooncakeDistributedStore,
                                         region: Region) -> None:
    b = region.base
    three = ["m0", "m1", "m2"]
    assert store.batch_put_from(three, [b, b], [8, 8, 8]) == [INVALID_PARAMS] * 3
    assert store.batch_upsert_from(three, [b] * 3, [8]) == [INVALID_PARAMS] * 3
    assert store.batch_get_into(three, [b] * 3, [8, 8]) == [INVALID_PARAMS] * 3
    assert store.batch_put_from_multi_buffers(three, [[b]] * 2, [[8]] * 3) == [INVALID_PARAMS] * 3
    assert store.batch_get_into_multi_buffers(three, [[b]] * 3, [[8]]) == [INVALID_PARAMS] * 3
    # one key's pieces and sizes differ in length: every key fails
    assert store.batch_put_from_multi_buffers(
        ["m0", "m1"], [[b], [b, b + 8]], [[8], [8]]) == [INVALID_PARAMS] * 2
    assert store.batch_is_exist(three) == [0, 0, 0]
    assert store.batch_put_from([], [], []) == [] and store.batch_get_into([], [], []) == []


def test_batch_per_key_unregistered(store: MooncakeDistributedStore, region: Region) -> None:
    stray = np.zeros(4096, np.uint8)
    region.fill(0, b"good" * 16)
    r = store.batch_put_from(["g0", "bad", "g1"], [region.base, addr(stray), region.base],
                             [64, 64, 32])
    assert r == [OK, INVALID_PARAMS, OK]
    r = store.batch_get_into(["g0", "g1", "g0"], [region.base + MiB, addr(stray), region.base],
                             [64, 64, 64])
    assert r == [64, INVALID_PARAMS, 64]
    assert store.batch_is_exist(["g0", "bad", "g1"]) == [1, 0, 1]
    assert bytes(stray) == bytes(4096)


def test_batch_put_from_duplicate_key_keeps_first(store: MooncakeDistributedStore,
                                                 region: Region) -> None:
    """kvpool differs: a key given twice keeps the first entry (put-if-absent;
    Mooncake stores the last one)."""
    assert store.batch_put_from(["d", "d"], [region.base, region.base + 100], [10, 20]) == [OK, OK]
    assert store.get_size("d") == 10


def test_multi_buffers_gather_and_scatter(store: MooncakeDistributedStore,
                                          region: Region) -> None:
    b = region.base
    value = pattern(150, 6)
    region.fill(1, value[:100])
    region.fill(5003, value[100:149])
    region.fill(9999, value[149:])
    assert store.batch_put_from_multi_buffers(
        ["mb", "mb2"], [[b + 1, b + 5003, b + 9999], [b + 1]], [[100, 49, 1], [10]],
        cfg(replica_num=1)) == [OK, OK]
    assert store.get("mb") == value
    d = b + MiB
    res = store.batch_get_into_multi_buffers(
        ["mb", "nope", "mb2"], [[d + 3, d + 1001, d + 2001], [d + 3001], [d + 4001]],
        [[1, 120, 29], [10], [10]], prefer_alloc_in_same_node=False)
    assert res == [150, OBJECT_NOT_FOUND, 10]  # as Mooncake: [150, -704, 10]
    got = region.read(MiB + 3, 1) + region.read(MiB + 1001, 120) + region.read(MiB + 2001, 29)
    assert got == value and region.read(MiB + 4001, 10) == value[:10]


def test_multi_buffer_scatter_total_must_match(store: MooncakeDistributedStore,
                                               region: Region) -> None:
    b = region.base
    assert store.put("s", pattern(150, 7)) == OK
    short, exact, long_ = [[100, 49]], [[100, 50]], [[100, 51]]
    assert store.batch_get_into_multi_buffers(["s"], [[b, b + 200]], short) == [INVALID_PARAMS]
    assert store.batch_get_into_multi_buffers(["s"], [[b, b + 200]], exact) == [150]
    assert store.batch_get_into_multi_buffers(["s"], [[b, b + 200]], long_)[0] < 0


def test_multi_buffer_scatter_too_large(store: MooncakeDistributedStore,
                                        region: Region) -> None:
    """kvpool differs: pieces adding up to more than the object are refused
    before any transfer, -600 (Mooncake over TCP: TRANSFER_FAIL -800)."""
    assert store.put("s", pattern(150, 7)) == OK
    assert store.batch_get_into_multi_buffers(["s"], [[region.base]], [[151]]) == [INVALID_PARAMS]


def test_put_from_with_metadata(store: MooncakeDistributedStore, region: Region) -> None:
    meta, data = b"M" * 28, pattern(5000, 8)
    region.fill(11, data)
    region.fill(7001, meta)
    assert store.put_from_with_metadata("md", region.base + 11, region.base + 7001,
                                        len(data), len(meta)) == OK
    assert store.get("md") == meta + data


def test_upsert_from_and_batch_upsert_from(store: MooncakeDistributedStore,
                                           region: Region) -> None:
    region.fill(0, b"A" * 10 + b"B" * 30)
    assert store.upsert_from("up", region.base, 10) == OK and store.get("up") == b"A" * 10
    assert store.upsert_from("up", region.base + 10, 30) == OK and store.get("up") == b"B" * 30
    assert store.batch_upsert_from(["up", "up2"], [region.base, region.base + 5],
                                   [10, 10]) == [OK, OK]
    assert store.get_batch(["up", "up2"]) == [b"A" * 10, b"A" * 5 + b"B" * 5]


def test_get_into_ranges(store: MooncakeDistributedStore, region: Region) -> None:
    v1, v2 = pattern(1000, 9), pattern(500, 10)
    assert store.put_batch(["r1", "r2"], [v1, v2]) == OK
    b0, b1 = region.base + 1, region.base + MiB + 3
    res = store.get_into_ranges(
        [b0, b1],
        [["r1", "r2"], ["r2", "nope"]],
        [[[0, 100], [300]], [[0], [0]]],       # dst offsets
        [[[10, 991], [499]], [[5], [0]]],      # src offsets: 991 + 10 > 1000
        [[[100, 10], [1]], [[200], [4]]])      # sizes
    assert res == [[[100, INVALID_PARAMS], [1]], [[200], [OBJECT_NOT_FOUND]]]
    assert region.read(1, 100) == v1[10:110] and region.read(301, 1) == v2[499:]
    assert region.read(MiB + 3, 200) == v2[5:205]
    assert region.read(101, 10) == b"\xee" * 10  # the refused range wrote nothing
    assert store.get_into_ranges([b0], [["r1"], ["r2"]], [[[0]]], [[[0]]], [[[1]]]) \
        == [[[INVALID_PARAMS]]]  # outer lengths differ


def test_get_into_ranges_unregistered_destination(store: MooncakeDistributedStore) -> None:
    stray = np.zeros(4096, np.uint8)
    assert store.put("r", b"r" * 64) == OK
    assert store.get_into_ranges([addr(stray)], [["r"]], [[[0]]], [[[0]]], [[[64]]]) \
        == [[[INVALID_PARAMS]]]
    assert bytes(stray) == bytes(4096)


def test_get_into_ranges_inner_mismatch(store: MooncakeDistributedStore, region: Region) -> None:
    assert store.put_batch(["r1", "r2"], [b"1", b"2"]) == OK
    res = store.get_into_ranges([region.base], [["r1", "r2"]], [[[0]]], [[[0]]], [[[1]]])
    assert res[0][1] == [INVALID_PARAMS]


def test_put_session_commit_and_revoke(store: MooncakeDistributedStore, region: Region) -> None:
    data = pattern(300, 11)
    region.fill(13, data)
    b = region.base
    started = store.batch_put_session_start(["s1", "s2", "s3"], [300, 64, 0])
    assert started == [OK, OK, INVALID_PARAMS]  # s3: size 0
    assert store.batch_put_session_start(["s1"], [300])[0] < 0  # already open
    assert store.batch_put_from_multi_buffer_ranges(
        ["s1", "s2", "nope"], [[b + 13, b + 213], [b], [b]], [[200, 100], [65], [1]],
        [[0, 200], [0], [0]]) == [OK, INVALID_PARAMS, OBJECT_NOT_FOUND]  # s2: past its size
    assert store.is_exist("s1") == 0  # not published before session_end
    assert store.batch_put_session_end(["s1", "nope"]) == [OK, OBJECT_NOT_FOUND]
    assert store.get("s1") == data
    assert store.batch_put_session_revoke(["s2", "s2"]) == [OK, OBJECT_NOT_FOUND]
    assert store.batch_put_session_end(["s2"]) == [OBJECT_NOT_FOUND] and store.is_exist("s2") == 0


def test_put_session_ranges_refuse_unregistered(store: MooncakeDistributedStore) -> None:
    stray = np.zeros(64, np.uint8)
    assert store.batch_put_session_start(["s"], [64]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges(["s"], [[addr(stray)]], [[64]], [[0]]) \
        == [INVALID_PARAMS]
    assert store.batch_put_session_revoke(["s"]) == [OK]


def test_alloc_from_mem_pool(mc_master: kvpool_procs.Proc) -> None:
    s = open_store(mc_master.addr)
    try:
        p = s.alloc_from_mem_pool(MiB)
        assert p != 0 and p % mmap.PAGESIZE == 0
        assert s.register_buffer(p, MiB) == INVALID_PARAMS  # already registered by the store
        ctypes.memmove(p + 17, b"pooled!", 7)
        assert s.put_from("pool", p + 17, 7) == OK
        assert s.get_into("pool", p + 4096, 7) == 7 and ctypes.string_at(p + 4096, 7) == b"pooled!"
        assert s.alloc_from_mem_pool(0) == 0 and s.alloc_from_mem_pool(-1) == 0
    finally:
        s.remove_all(force=True)
        with contextlib.suppress(BufferError):  # see test_close_after_alloc_from_mem_pool
            s.close()


def test_close_after_alloc_from_mem_pool(mc_master: kvpool_procs.Proc) -> None:
    s = open_store(mc_master.addr)
    assert s.alloc_from_mem_pool(MiB) != 0
    assert s.close() == OK


# ============================================================ query / delete

def test_is_exist_and_batch_is_exist_1024(store: MooncakeDistributedStore) -> None:
    keys = [f"e/{i}" for i in range(1024)]
    present = keys[::2]
    assert store.put_batch(present, [i.to_bytes(2, "little") for i in range(len(present))]) == OK
    assert store.is_exist("e/0") == 1 and store.is_exist("e/1") == 0
    assert store.batch_is_exist(keys) == [1, 0] * 512
    assert store.batch_is_exist([]) == []


def test_get_size(store: MooncakeDistributedStore) -> None:
    assert store.put("sz", b"x" * 12345) == OK
    assert store.get_size("sz") == 12345
    assert store.get_size("nope") == OBJECT_NOT_FOUND


def test_remove_and_batch_remove(store: MooncakeDistributedStore) -> None:
    """kvpool differs: reads take no lease, so remove right after get /
    is_exist succeeds (Mooncake: -706 until the lease expires)."""
    assert store.put_batch(["r0", "r1", "r2"], [b"0", b"1", b"2"]) == OK
    assert store.get("r0") == b"0" and store.is_exist("r0") == 1
    assert store.remove("r0") == OK
    assert store.remove("r0") == OBJECT_NOT_FOUND
    assert store.remove("r1", force=True) == OK
    assert store.batch_remove(["r2", "nope"]) == [OK, OBJECT_NOT_FOUND]
    assert store.batch_remove(["r2"], force=True) == [OBJECT_NOT_FOUND]
    assert store.batch_is_exist(["r0", "r1", "r2"]) == [0, 0, 0]


def test_hard_pin_refuses_remove_without_force(store: MooncakeDistributedStore) -> None:
    assert store.put("pin", b"pinned", cfg(with_hard_pin=True)) == OK
    assert store.remove("pin") == OBJECT_HAS_LEASE
    assert store.batch_remove(["pin"]) == [OBJECT_HAS_LEASE]
    assert store.remove_by_regex("^pin$") == 0 and store.is_exist("pin") == 1
    assert store.remove("pin", force=True) == OK and store.is_exist("pin") == 0


def test_remove_all_keeps_hard_pinned_without_force(store: MooncakeDistributedStore) -> None:
    """kvpool differs: a hard pin holds against remove_all() without force
    (Mooncake removes pinned objects too); force removes it."""
    assert store.put("pin", b"pinned", cfg(with_hard_pin=True)) == OK
    assert store.put("plain", b"plain") == OK
    assert store.remove_all() == 1 and store.is_exist("pin") == 1
    assert store.remove_all(True) == 1 and store.is_exist("pin") == 0


def test_remove_by_regex(store: MooncakeDistributedStore) -> None:
    keys = ["a/1", "a/22", "a/x", "b/3", "ab_9"]
    assert store.put_batch(keys, [b"v"] * len(keys)) == OK
    assert store.remove_by_regex(r"^a/\d+$") == 2  # ECMAScript \d
    assert store.remove_by_regex("zzz") == 0
    assert store.remove_by_regex(r"\w_\d") == 1  # searched anywhere in the key
    assert store.remove_by_regex(r"/\D$", force=True) == 1
    assert store.batch_is_exist(keys) == [0, 0, 0, 1, 0]


@pytest.mark.parametrize("bad", ["([", "a+?", "a*?b", r"(?=a)", r"[\D]"])
def test_remove_by_regex_refuses(store: MooncakeDistributedStore, bad: str) -> None:
    assert store.put("a", b"v") == OK
    assert store.remove_by_regex(bad) == INVALID_PARAMS
    assert store.is_exist("a") == 1


def test_remove_all_counts(store: MooncakeDistributedStore) -> None:
    assert store.put_batch([f"ra/{i}" for i in range(12)], [b"v"] * 12) == OK
    assert store.remove_all() == 12
    assert store.remove_all(force=True) == 0


def test_get_replica_desc(store: MooncakeDistributedStore) -> None:
    assert store.put("rd", b"abcdef") == OK
    (d,) = store.get_replica_desc("rd")
    assert d.status is ReplicaStatus.COMPLETE
    assert d.is_memory_replica() and not d.is_disk_replica() and not d.is_local_disk_replica()
    bd = d.get_memory_descriptor().buffer_descriptor
    assert bd.size == 6 and isinstance(bd.buffer_address, int)
    assert bd.transport_endpoint == store.get_hostname()
    assert repr(bd).startswith("<Descriptor size=6 ")
    assert store.get_replica_desc("nope") == []


def test_batch_get_replica_desc_leaves_out_missing(store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["k1", "k2"], [b"1", b"22"]) == OK
    got = store.batch_get_replica_desc(["k1", "nope", "k2"])
    assert sorted(got) == ["k1", "k2"]
    assert [len(v) for v in got.values()] == [1, 1]
    assert got["k2"][0].get_memory_descriptor().buffer_descriptor.size == 2
    assert store.batch_get_replica_desc([]) == {}


def test_replica_num_2_uses_two_segments(store: MooncakeDistributedStore,
                                         store2: MooncakeDistributedStore) -> None:
    assert store.put("rep2", b"twice", cfg(replica_num=2)) == OK
    assert sorted(endpoints(store, "rep2")) == sorted([store.get_hostname(),
                                                       store2.get_hostname()])
    assert store2.get("rep2") == b"twice"


def test_replica_num_above_segments_is_best_effort(store: MooncakeDistributedStore) -> None:
    assert store.put("rep3", b"v", cfg(replica_num=3)) == OK
    assert endpoints(store, "rep3") == [store.get_hostname()]


def test_preferred_segment_honoured(store: MooncakeDistributedStore,
                                    store2: MooncakeDistributedStore) -> None:
    other = store2.get_hostname()
    assert store.put("pref1", b"v", cfg(preferred_segment=other)) == OK
    assert store.put("pref2", b"v", cfg(preferred_segments=[other])) == OK
    assert endpoints(store, "pref1") == [other] and endpoints(store, "pref2") == [other]


def test_preferred_segment_unknown_and_data_type(store: MooncakeDistributedStore) -> None:
    assert store.put("pu", b"v", cfg(preferred_segment="127.0.0.1:1")) == OK
    c = cfg(soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=10,
            data_type=ObjectDataType.KVCACHE)
    assert store.put_batch(["g0", "g1"], [b"0", b"1"], c) == OK
    assert store.batch_is_exist(["pu", "g0", "g1"]) == [1, 1, 1]


def test_not_supported_admin_calls(store: MooncakeDistributedStore) -> None:
    assert store.get_offload_rpc_read_count() == 0
    assert store.batch_replica_clear(["k"]) == []
    assert store.query_task((1, 2)) == (None, NOT_SUPPORTED)
    assert store.mount_segment("/dev/null", MiB) == {"ret": NOT_SUPPORTED, "segment_ids": []}
    assert store.allocate_and_mount_segment(MiB) == {"ret": NOT_SUPPORTED, "segment_ids": [],
                                                     "allocated_size": 0}
    assert store.unmount_segment([1]) == NOT_SUPPORTED
    assert store.unmount_and_free_segment([1], grace_period_seconds=0) == NOT_SUPPORTED
    assert store.unmount_local_disk_segment() == NOT_SUPPORTED


def test_task_creation_error_shape(store: MooncakeDistributedStore) -> None:
    assert store.create_copy_task("k", ["127.0.0.1:1"]) == ((0, 0), NOT_SUPPORTED)
    assert store.create_move_task("k", "127.0.0.1:1", "127.0.0.1:2") == ((0, 0), NOT_SUPPORTED)


# ================================================================== threads

THREADS, KEYS, PIECES, PIECE = 8, 4, 4, 64 * KiB
OBJ = PIECES * PIECE  # one object: 256 KiB
PER = KEYS * OBJ      # one batch: 1 MiB; a thread owns [src: PER][dst: PER]
FREEZE_S = 0.3


@dataclass
class Workload:
    store: MooncakeDistributedStore
    reg: Region
    done: threading.Event
    rounds: list[int]       # per thread
    longest: list[float]    # per thread: the longest batch call, seconds
    errors: list[str]


def _worker(w: Workload, t: int) -> None:
    """Until w.done: gather KEYS objects of PIECES pieces each, scatter them
    back (split differently: 1000 bytes, then the rest), compare, remove."""
    src, dst, b = 2 * t * PER, (2 * t + 1) * PER, w.reg.base
    while not w.done.is_set():
        keys = [f"t{t}/r{w.rounds[t]}/k{k}" for k in range(KEYS)]
        t0 = time.monotonic()
        res = w.store.batch_put_from_multi_buffers(
            keys, [[b + src + k * OBJ + j * PIECE for j in range(PIECES)] for k in range(KEYS)],
            [[PIECE] * PIECES] * KEYS)
        t1 = time.monotonic()
        got = w.store.batch_get_into_multi_buffers(
            keys, [[b + dst + k * OBJ, b + dst + k * OBJ + 1000] for k in range(KEYS)],
            [[1000, OBJ - 1000]] * KEYS)
        w.longest[t] = max(w.longest[t], t1 - t0, time.monotonic() - t1)
        if res != [OK] * KEYS or got != [OBJ] * KEYS or not np.array_equal(
                w.reg.buf[dst:dst + PER], w.reg.buf[src:src + PER]):
            w.errors.append(f"thread {t} round {w.rounds[t]}: put {res} get {got}")
            return
        w.reg.buf[dst:dst + PER] = 0
        w.store.batch_remove(keys, force=True)
        w.rounds[t] += 1


def _count_while(alive: Callable[[], bool], limit_s: float = 30.0) -> tuple[int, float]:
    """Counts in pure Python (it runs only while this thread holds the GIL)
    until alive() is false: (count, seconds). Gives up after limit_s."""
    count, t0 = 0, time.monotonic()
    while alive() and time.monotonic() - t0 < limit_s:
        for _ in range(1000):
            count += 1
    return count, time.monotonic() - t0


def test_threads_share_store_and_release_gil() -> None:
    """8 threads run batches on one store while this thread counts. To make
    "the GIL is released" a clear-cut measurement on a loaded 2-core machine,
    the master is frozen (SIGSTOP) for FREEZE_S by an outside process: every
    worker then sits inside a native call waiting for the master, and the
    counter must keep most of its solo rate. A binding that held the GIL
    through its calls would leave the counter (nearly) still."""
    m = kvpool_procs.master("--lease-ttl", "30s", "--client-ttl", "60s")
    s = open_store(m.addr, segment=128 * MiB)
    buf = np.zeros(2 * THREADS * PER, np.uint8)
    for t in range(THREADS):
        buf[2 * t * PER:(2 * t + 1) * PER] = np.frombuffer(pattern(PER, 100 + t), np.uint8)
    assert s.register_buffer(addr(buf), buf.nbytes) == OK
    w = Workload(s, Region(buf, addr(buf)), threading.Event(), [0] * THREADS,
                 [0.0] * THREADS, [])
    threads = [threading.Thread(target=_worker, args=(w, t)) for t in range(THREADS)]
    try:
        for th in threads:
            th.start()
        warm, _ = _count_while(lambda: min(w.rounds) < 2 and not w.errors)  # all running
        freezer = subprocess.Popen(["sh", "-c", f"kill -STOP {m.proc.pid}; sleep {FREEZE_S}; "
                                                f"kill -CONT {m.proc.pid}"])
        frozen, frozen_s = _count_while(lambda: freezer.poll() is None)
        resume = max(w.rounds) + 2
        _count_while(lambda: min(w.rounds) < resume and not w.errors)  # all resumed
    finally:
        w.done.set()
        for th in threads:
            th.join()
        s.unregister_buffer(addr(buf))
        s.remove_all(force=True)
        s.close()
        m.stop()
    assert w.errors == [] and warm > 0 and min(w.rounds) >= resume
    assert max(w.longest) >= FREEZE_S * 0.8  # the calls really waited out the freeze
    solo_end = time.monotonic() + 0.2
    solo, solo_s = _count_while(lambda: time.monotonic() < solo_end)
    # Held GIL: this thread could not even run until the freeze was over.
    assert frozen_s > 0.8 * FREEZE_S
    assert frozen > 0.3 * solo / solo_s * frozen_s, (frozen, frozen_s, solo, solo_s)


# ================================================ review follow-ups

def test_numpy_integer_addresses(store: MooncakeDistributedStore, region: Region) -> None:
    """As with Mooncake (pybind converts them): numpy integers as addresses and sizes."""
    region.fill(0, b"np-addr!")
    assert store.batch_put_from(["npi"], [np.uint64(region.base)], [np.int64(8)]) == [OK]
    assert store.get_into("npi", np.uint64(region.base + 4096), np.uint32(8)) == 8
    assert region.read(4096, 8) == b"np-addr!"


def test_register_unmapped_memory_refused(store: MooncakeDistributedStore) -> None:
    """kvpool differs: Mooncake registers any range; kvpool refuses one that
    is not mapped read-write in this process (a later read would fault)."""
    assert store.register_buffer(4096, 1 << 20) == INVALID_PARAMS


def test_local_buffer_size_any_value(mc_master: kvpool_procs.Proc) -> None:
    s = MooncakeDistributedStore()
    assert s.setup(dict_config(mc_master.addr, local_buffer_size="infinite")) == OK
    assert s.close() == OK


def test_empty_regex_finds_every_key(store: MooncakeDistributedStore) -> None:
    assert store.put_batch(["e1", "e2"], [b"1", b"2"]) == OK
    assert store.remove_by_regex("", True) == 2


def test_regex_counted_repetition_refused(store: MooncakeDistributedStore) -> None:
    """kvpool differs: {m,n} is refused (-600): it can make matching cost
    seconds per key on the master; Mooncake runs it."""
    assert store.put("r1", b"x") == OK
    assert store.remove_by_regex("r{1}") == INVALID_PARAMS
    assert store.remove_by_regex("(a{1,255}|b){1,255}c") == INVALID_PARAMS
    assert store.is_exist("r1") == 1


def test_alloc_from_mem_pool_too_large(store: MooncakeDistributedStore) -> None:
    assert store.alloc_from_mem_pool(1 << 60) == 0
