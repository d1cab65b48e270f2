"""The SSD tier from Python: `kvpool serve --enable-offload` with a DRAM
segment smaller than what is put; values come back byte-exact, tiers_batch
and Mooncake's replica descriptors show where they are."""
from __future__ import annotations

import os
import tempfile
import time
from typing import Iterator

import pytest

import kvpool
import kvpool_procs

MiB = 1 << 20


@pytest.fixture
def tiered() -> Iterator[kvpool_procs.Proc]:
    with tempfile.TemporaryDirectory(prefix="kvpool-py-tier-") as d:
        p = kvpool_procs.serve("8MiB", "--enable-offload", "--offload-dir", d,
                               "--offload-capacity", "256MiB", "--offload-page-size", "64MiB")
        yield p
        p.stop()


def _value(i: int) -> bytes:
    return bytes([(i * 7 + j) & 0xFF for j in range(256)]) * (MiB // 256)


def _put_retrying(c: kvpool.Client, key: str, value: bytes) -> None:
    end = time.monotonic() + 20
    while True:
        try:
            c.put(key, value)
            return
        except kvpool.NoSpaceError:  # -200 while the tier writes the room out
            if time.monotonic() > end:
                raise
            time.sleep(0.005)


def test_values_spill_to_disk_and_come_back(tiered: kvpool_procs.Proc) -> None:
    c = kvpool.Client({"master": tiered.addr, "mode": "standalone-store"})
    try:
        n = 24  # 24 MiB into an 8 MiB segment
        for i in range(n):
            _put_retrying(c, f"py-tier-{i}", _value(i))
        tiers = c.tiers_batch([f"py-tier-{i}" for i in range(n)] + ["absent"])
        assert tiers[-1] == ()
        on_disk = sum(1 for t in tiers[:-1] if t == ("disk",))
        assert on_disk >= n - 8
        st = c.stat()["counters"]
        assert st["spills"] >= n - 8 and st["evictions"] == 0
        assert c.disk_reads == 0
        for i in range(n):
            assert c.get(f"py-tier-{i}") == _value(i)
        # each value that was only on disk was staged back for this client
        assert c.disk_reads >= on_disk
        st = c.stat()["counters"]
        assert st["loads"] > 0 and st["load_fails"] == 0
        # a loaded value is in DRAM and still on disk (evicting it costs no write)
        t = c.tiers_batch(["py-tier-0"])[0]
        assert isinstance(t, tuple) and "disk" in t
        kinds = [r["tier"] for r in c.describe("py-tier-0")["replicas"]]
        assert "disk" in kinds
    finally:
        c.remove_all(force=True)
        c.close()


def test_mooncake_replica_descriptors_show_the_disk(tiered: kvpool_procs.Proc) -> None:
    from kvpool import mooncake
    store = mooncake.MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "", 0, 16 * MiB, "tcp", "", tiered.addr) == 0
    try:
        for i in range(16):
            v = _value(i)
            end = time.monotonic() + 20
            while store.put(f"mc-tier-{i}", v) != 0:
                assert time.monotonic() < end
                time.sleep(0.005)
        descs = store.get_replica_desc("mc-tier-0")
        assert any(d.is_disk_replica() for d in descs)
        disk = next(d for d in descs if d.is_disk_replica())
        assert disk.get_disk_descriptor().object_size == MiB
        only_disk = not any(not d.is_disk_replica() for d in descs)
        before = store.get_offload_rpc_read_count()
        assert store.get("mc-tier-0") == _value(0)
        # Mooncake's counter of reads served from the SSD tier
        assert store.get_offload_rpc_read_count() == before + (1 if only_disk else 0)
    finally:
        store.remove_all()
        store.close()


def test_mooncake_embedded_ssd_offload(tmp_path: "os.PathLike[str]") -> None:
    """Mooncake's client-side SSD offload: setup(..., enable_ssd_offload=True,
    ssd_offload_path=DIR) gives the embedded segment an SSD tier."""
    from kvpool import mooncake
    m = kvpool_procs.master("--lease-ttl", "5s", "--client-ttl", "10s")
    store = mooncake.MooncakeDistributedStore()
    try:
        assert store.setup("127.0.0.1", "P2PHANDSHAKE", 8 * MiB, 16 * MiB, "tcp", "", m.addr,
                           enable_ssd_offload=True, ssd_offload_path=str(tmp_path)) == 0
        for i in range(20):
            v = _value(i)
            end = time.monotonic() + 20
            while store.put(f"emb-tier-{i}", v) != 0:
                assert time.monotonic() < end
                time.sleep(0.005)
        assert any(d.is_disk_replica() for d in store.get_replica_desc("emb-tier-0"))
        for i in range(20):
            assert store.get(f"emb-tier-{i}") == _value(i)
        assert any(p.name.endswith(".log") for p in os.scandir(tmp_path))
    finally:
        store.close()
        m.stop()
