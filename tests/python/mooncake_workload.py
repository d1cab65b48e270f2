"""One scripted workload for anything with Mooncake's MooncakeDistributedStore surface.

Contract
--------
``run(store, ptr_buf)`` drives ``store`` through a fixed sequence of calls and returns a
JSON-serialisable list of ``[step_name, result]`` records, so the records of the real
Mooncake wheel and of a compatible implementation can be compared step by step.

The caller provides:
  * ``store``: already ``setup()`` (embedded mode: global_segment_size 256 MiB,
    local_buffer_size 64 MiB), connected to a master of its own that holds NO objects
    (``remove_all`` counts are recorded), with a key lease TTL well above the workload's
    duration (Mooncake's default is 10 s; the workload takes ~1 s). Lease-dependent steps
    (remove without ``force`` after a read) assume the lease is still held.
  * ``ptr_buf``: a writable, C-contiguous numpy uint8 array of at least 8 MiB. The
    workload registers it itself (first half: sources, second half: destinations),
    overwrites it, and unregisters it at the end. It does not close the store.
  * ``ReplicateConfig`` importable from the module that defines ``type(store)``.

Results are recorded exactly: ints and lists of ints as they are; bytes-like values as
``{"len": n, "sha256": first 16 hex digits}``; ``None`` as null; a raised exception as
``{"raises": "<ExceptionTypeName>"}``. No step depends on timing except through the lease
TTL above. Every key starts with ``mcw/``.
"""
from __future__ import annotations

import hashlib
import re
from functools import partial
from typing import Any, Callable

import numpy as np

KiB = 1 << 10
MiB = 1 << 20
HALF = 4 * MiB  # ptr_buf[:HALF] holds sources, ptr_buf[HALF:2*HALF] destinations

Record = list[Any]  # [step_name, result]


def pattern(n: int, seed: int) -> bytes:
    """Deterministic pseudo-random bytes (same on every platform and numpy version)."""
    i = np.arange(n, dtype=np.uint64) + np.uint64(seed * 0x9E3779B1)
    return (((i * np.uint64(2654435761)) >> np.uint64(13)) & np.uint64(0xFF)).astype(np.uint8).tobytes()


def digest(b: Any) -> dict[str, Any]:
    data = bytes(b)
    return {"len": len(data), "sha256": hashlib.sha256(data).hexdigest()[:16]}


def norm(x: Any) -> Any:
    """Map a return value to something JSON can hold without losing what matters."""
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if hasattr(x, "size") and hasattr(x, "ptr") and callable(x.size):  # BufferHandle
        return {"handle": digest(memoryview(x))}  # first: a handle may also be bytes-like
    if isinstance(x, (bytes, bytearray, memoryview)):
        return digest(x)
    if isinstance(x, (list, tuple)):
        return [norm(v) for v in x]
    if isinstance(x, dict):
        return {str(k): norm(v) for k, v in x.items()}
    return {"type": type(x).__name__}


def run(store: Any, ptr_buf: np.ndarray) -> list[Record]:
    assert ptr_buf.dtype == np.uint8 and ptr_buf.flags["C_CONTIGUOUS"] and ptr_buf.flags["WRITEABLE"]
    assert ptr_buf.nbytes >= 2 * HALF
    records: list[Record] = []
    base: int = ptr_buf.ctypes.data
    src, dst = base, base + HALF

    def step(name: str, fn: Callable[[], Any]) -> Any:
        try:
            value = fn()
            records.append([name, norm(value)])
            return value
        except Exception as e:  # recorded, never fatal: the next step still runs
            records.append([name, {"raises": type(e).__name__}])
            return None

    def dst_region(off: int, n: int) -> dict[str, Any]:
        return digest(ptr_buf[HALF + off:HALF + off + n].tobytes())

    def dst_untouched(off: int, n: int) -> bool:
        return bool((ptr_buf[HALF + off:HALF + off + n] == 0xEE).all())

    def clear_dst() -> None:
        ptr_buf[HALF:2 * HALF] = 0xEE

    ptr_buf[:HALF] = np.frombuffer(pattern(HALF, 7), dtype=np.uint8)
    clear_dst()

    # -- lifecycle / config ----------------------------------------------------------
    step("health_check", lambda: store.health_check())
    step("get_hostname_is_host_port", lambda: bool(re.fullmatch(r"[^:]+:\d+", store.get_hostname())))
    step("register_buffer", lambda: store.register_buffer(base, 2 * HALF))

    # -- bytes API -----------------------------------------------------------------------
    sizes = {"1B": 1, "4KiB": 4 * KiB, "1MiB": MiB}
    for tag, n in sizes.items():
        step(f"put_{tag}", partial(store.put, f"mcw/b/{tag}", pattern(n, n)))
    for tag in sizes:
        step(f"get_{tag}", partial(store.get, f"mcw/b/{tag}"))
        step(f"get_size_{tag}", partial(store.get_size, f"mcw/b/{tag}"))
    step("get_missing", lambda: store.get("mcw/missing"))
    step("get_size_missing", lambda: store.get_size("mcw/missing"))
    step("is_exist_present", lambda: store.is_exist("mcw/b/1B"))
    step("is_exist_missing", lambda: store.is_exist("mcw/missing"))
    step("batch_is_exist_present", lambda: store.batch_is_exist(["mcw/b/1B", "mcw/b/4KiB"]))
    step("batch_is_exist_missing", lambda: store.batch_is_exist(["mcw/missing", "mcw/missing2"]))
    step("batch_is_exist_mixed", lambda: store.batch_is_exist(["mcw/b/1B", "mcw/missing", "mcw/b/1MiB"]))
    step("batch_is_exist_empty", lambda: store.batch_is_exist([]))

    step("put_dup_same", lambda: store.put("mcw/b/4KiB", pattern(4 * KiB, 4 * KiB)))
    step("get_after_dup_same", lambda: store.get("mcw/b/4KiB"))
    step("put_dup_different", lambda: store.put("mcw/b/4KiB", pattern(100, 1)))
    step("get_after_dup_different", lambda: store.get("mcw/b/4KiB"))
    step("get_size_after_dup_different", lambda: store.get_size("mcw/b/4KiB"))

    step("put_empty_value", lambda: store.put("mcw/b/empty", b""))
    step("is_exist_empty_value", lambda: store.is_exist("mcw/b/empty"))
    step("put_empty_key", lambda: store.put("", b"x"))
    step("put_too_big_for_local_buffer", lambda: store.put("mcw/b/huge", bytes(64 * MiB + 1)))
    step("is_exist_too_big", lambda: store.is_exist("mcw/b/huge"))

    bkeys = [f"mcw/pb/{i}" for i in range(3)]
    step("put_batch", lambda: store.put_batch(bkeys, [pattern(100 * (i + 1), 30 + i) for i in range(3)]))
    step("get_batch", lambda: store.get_batch(bkeys + ["mcw/missing"]))
    step("put_batch_with_existing", lambda: store.put_batch(
        ["mcw/pb/0", "mcw/pb/3"], [pattern(7, 40), pattern(8, 41)]))
    step("get_batch_after_existing", lambda: store.get_batch(["mcw/pb/0", "mcw/pb/3"]))
    step("put_batch_length_mismatch", lambda: store.put_batch(["mcw/pb/x"], []))

    step("put_parts", lambda: store.put_parts("mcw/parts", b"ab", pattern(1000, 50), bytearray(b"cd")))
    step("get_parts", lambda: store.get("mcw/parts"))

    def cfg(replicas: int) -> Any:
        from_module = __import__(type(store).__module__, fromlist=["ReplicateConfig"])
        c = from_module.ReplicateConfig()
        c.replica_num = replicas
        return c

    step("put_replica_num_1", lambda: store.put("mcw/rc/1", pattern(500, 60), cfg(1)))
    step("get_replica_num_1", lambda: store.get("mcw/rc/1"))
    step("put_replica_num_2_one_segment", lambda: store.put("mcw/rc/2", pattern(500, 61), cfg(2)))
    step("get_replica_num_2", lambda: store.get("mcw/rc/2"))
    step("replica_desc_count", lambda: len(store.get_replica_desc("mcw/rc/1")))

    step("upsert_existing_new_size", lambda: store.upsert("mcw/b/1B", pattern(33, 70)))
    step("get_after_upsert", lambda: store.get("mcw/b/1B"))
    step("upsert_new", lambda: store.upsert("mcw/up/new", pattern(10, 71)))
    step("upsert_batch", lambda: store.upsert_batch(["mcw/up/new", "mcw/up/b"], [b"1", b"22"]))
    step("get_batch_after_upsert", lambda: store.get_batch(["mcw/up/new", "mcw/up/b"]))

    step("get_buffer_present", lambda: store.get_buffer("mcw/b/1MiB"))
    step("get_buffer_missing", lambda: store.get_buffer("mcw/missing"))

    # -- zero-copy API (registered buffer) ---------------------------------------------
    step("put_from_64KiB", lambda: store.put_from("mcw/z/a", src + 1000, 64 * KiB))
    step("get_into_exact", lambda: store.get_into("mcw/z/a", dst, 64 * KiB))
    step("get_into_exact_data", lambda: dst_region(0, 64 * KiB))
    step("src_region_data", lambda: digest(ptr_buf[1000:1000 + 64 * KiB].tobytes()))
    clear_dst()
    step("get_into_larger", lambda: store.get_into("mcw/z/a", dst, 128 * KiB))
    step("get_into_larger_tail_untouched", lambda: dst_untouched(64 * KiB, 64 * KiB))
    clear_dst()
    step("get_into_too_small", lambda: store.get_into("mcw/z/a", dst, 32 * KiB))
    step("get_into_too_small_untouched", lambda: dst_untouched(0, 32 * KiB))
    step("get_into_missing", lambda: store.get_into("mcw/missing", dst, 64 * KiB))
    step("get_of_put_from", lambda: store.get("mcw/z/a"))
    step("put_from_dup", lambda: store.put_from("mcw/z/a", src, 10))
    step("get_size_after_put_from_dup", lambda: store.get_size("mcw/z/a"))
    step("get_into_of_bytes_put", lambda: store.get_into("mcw/b/1MiB", dst, MiB))
    step("get_into_of_bytes_put_data", lambda: dst_region(0, MiB))
    step("put_from_with_metadata", lambda: store.put_from_with_metadata(
        "mcw/z/meta", src + 5000, src + 100, 3000, 40))
    step("get_put_from_with_metadata", lambda: store.get("mcw/z/meta"))
    step("upsert_from", lambda: store.upsert_from("mcw/z/a", src + 77, 1234))
    step("get_after_upsert_from", lambda: store.get("mcw/z/a"))

    zkeys = ["mcw/z/b0", "mcw/z/b1", "mcw/z/b2"]
    zsizes = [1, 4 * KiB, 300 * KiB]
    zsrc = [src + 2 * MiB, src + 2 * MiB + 10, src + 2 * MiB + 8 * KiB]
    zdst = [dst, dst + 4096, dst + 16 * KiB]
    clear_dst()
    step("batch_put_from", lambda: store.batch_put_from(zkeys, zsrc, zsizes))
    step("batch_get_into", lambda: store.batch_get_into(zkeys, zdst, zsizes))
    step("batch_get_into_data", lambda: [dst_region(d - dst, n) for d, n in zip(zdst, zsizes)])
    step("batch_put_from_with_existing", lambda: store.batch_put_from(
        ["mcw/z/b0", "mcw/z/b3"], [src, src + 64], [16, 16]))
    step("batch_get_into_mixed", lambda: store.batch_get_into(
        ["mcw/z/b3", "mcw/missing", "mcw/z/b2"], [dst, dst + 1024, dst + 2048], [16, 16, 16]))
    step("batch_put_from_empty", lambda: store.batch_put_from([], [], []))
    step("batch_upsert_from", lambda: store.batch_upsert_from(
        ["mcw/z/b0", "mcw/z/b4"], [src + 9, src + 99], [20, 30]))
    step("get_batch_after_batch_upsert_from", lambda: store.get_batch(["mcw/z/b0", "mcw/z/b4"]))

    # gather: each key from 4 non-contiguous pieces of unequal size
    mkeys = ["mcw/m/0", "mcw/m/1"]
    msizes = [[1000, 4 * KiB, 1, 20 * KiB], [64 * KiB] * 4]
    mptrs = [[src + 3 * MiB + 7, src + 3 * MiB + 10 * KiB, src + 3 * MiB + 20 * KiB, src + 3 * MiB + 40 * KiB],
             [src + 3 * MiB + 100 * KiB + j * 70 * KiB for j in range(4)]]
    totals = [sum(s) for s in msizes]
    clear_dst()
    step("batch_put_from_multi_buffers", lambda: store.batch_put_from_multi_buffers(mkeys, mptrs, msizes))
    step("multi_gathered_source_data", lambda: [
        digest(b"".join(ptr_buf[p - base:p - base + n].tobytes() for p, n in zip(ps, ns)))
        for ps, ns in zip(mptrs, msizes)])
    step("get_of_multi", lambda: store.get_batch(mkeys))
    step("get_size_of_multi", lambda: [store.get_size(k) for k in mkeys])
    # scatter with the same piece sizes into a different layout
    sptrs = [[dst + j * 32 * KiB for j in range(4)], [dst + 512 * KiB + j * 64 * KiB for j in range(4)]]
    step("batch_get_into_multi_buffers", lambda: store.batch_get_into_multi_buffers(mkeys, sptrs, msizes))
    step("batch_get_into_multi_buffers_data", lambda: [
        digest(b"".join(ptr_buf[p - base:p - base + n].tobytes() for p, n in zip(ps, ns)))
        for ps, ns in zip(sptrs, msizes)])
    clear_dst()
    # scatter with a different split of the same total (one contiguous piece / two halves)
    step("batch_get_into_multi_buffers_resplit", lambda: store.batch_get_into_multi_buffers(
        mkeys, [[dst], [dst + MiB, dst + MiB + totals[1] // 2]], [[totals[0]], [totals[1] // 2] * 2]))
    step("batch_get_into_multi_buffers_resplit_data", lambda: [
        dst_region(0, totals[0]), dst_region(MiB, totals[1])])
    step("batch_get_into_multi_buffers_missing", lambda: store.batch_get_into_multi_buffers(
        ["mcw/m/0", "mcw/missing"], [[dst], [dst + MiB]], [[totals[0]], [100]]))
    step("batch_get_into_multi_buffers_too_small", lambda: store.batch_get_into_multi_buffers(
        ["mcw/m/1"], [[dst, dst + MiB]], [[1000, 1000]]))
    step("batch_put_from_multi_buffers_existing", lambda: store.batch_put_from_multi_buffers(
        ["mcw/m/0", "mcw/m/2"], [[src], [src, src + 100]], [[10], [10, 20]]))
    step("get_size_multi_after_existing", lambda: [store.get_size(k) for k in ["mcw/m/0", "mcw/m/2"]])

    # -- remove ------------------------------------------------------------------------
    # every key above has been read or checked, so (per Mooncake) it holds a lease now
    step("remove_leased", lambda: store.remove("mcw/b/1MiB"))
    step("remove_leased_force", lambda: store.remove("mcw/b/1MiB", True))
    step("is_exist_after_remove", lambda: store.is_exist("mcw/b/1MiB"))
    step("remove_missing", lambda: store.remove("mcw/missing"))
    step("put_then_remove_unread", lambda: [store.put("mcw/r/fresh", b"fresh"), store.remove("mcw/r/fresh")])
    step("batch_remove_mixed", lambda: store.batch_remove(["mcw/pb/0", "mcw/missing"]))
    step("batch_remove_mixed_force", lambda: store.batch_remove(["mcw/pb/0", "mcw/missing"], True))
    step("put_for_regex", lambda: [store.put(f"mcw/rx/{i}", b"r") for i in range(3)])
    step("remove_by_regex", lambda: store.remove_by_regex("^mcw/rx/[01]$"))
    step("remove_by_regex_force", lambda: store.remove_by_regex("^mcw/rx/"))
    # ECMAScript escapes: each pattern must remove exactly the key Mooncake's std::regex finds
    rkeys = ["mcw/re/k.", "mcw/re/k\\", "mcw/re/a]", "mcw/re/a\\]", "mcw/re/t\t", "mcw/re/tt",
             "mcw/re/d7", "mcw/re/dx"]
    step("put_for_regex_escapes", lambda: store.put_batch(rkeys, [b"e"] * len(rkeys)))
    for name, pat in (("dot_in_class", r"^mcw/re/k[\.]$"), ("bracket_in_class", r"^mcw/re/a[\]]$"),
                      ("tab_escape", r"^mcw/re/t\t$"), ("digit_class", r"^mcw/re/d\d$")):
        step(f"remove_by_regex_{name}", partial(store.remove_by_regex, pat, True))
    step("batch_is_exist_after_regex_escapes", lambda: store.batch_is_exist(rkeys))
    step("remove_all", lambda: store.remove_all())
    step("remove_all_force", lambda: store.remove_all(True))
    step("remove_all_again", lambda: store.remove_all(True))
    step("batch_is_exist_after_remove_all", lambda: store.batch_is_exist(
        ["mcw/b/4KiB", "mcw/z/a", "mcw/m/0", "mcw/parts"]))
    step("get_after_remove_all", lambda: store.get("mcw/b/4KiB"))
    step("remove_all_unleased", lambda: [store.put("mcw/r/unread", b"u"), store.remove_all()])
    step("put_after_remove_all", lambda: store.put("mcw/b/4KiB", b"again"))
    step("get_reput", lambda: store.get("mcw/b/4KiB"))
    step("remove_all_end", lambda: store.remove_all(True))
    step("unregister_buffer", lambda: store.unregister_buffer(base))
    step("health_check_end", lambda: store.health_check())
    return records
