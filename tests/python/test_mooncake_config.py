"""Mooncake's configuration paths: MooncakeConfig (file and environment),
its setup() arguments against a real master, and the Mooncake config-file
keys accepted by kvpool.Client through $MOONCAKE_CONFIG_PATH."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvpool
import kvpool_procs
from kvpool.mooncake import MooncakeConfig, MooncakeDistributedStore


def test_from_file_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "mc.json"
    f.write_text(json.dumps({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                             "master_server_address": "127.0.0.1:1",
                             "global_segment_size": "64MB", "local_buffer_size": "1.5 GB",
                             "protocol": "RDMA", "enable_ssd_offload": "true"}))
    c = MooncakeConfig.from_file(str(f))
    assert (c.global_segment_size, c.local_buffer_size) == (64 << 20, 3 << 29)
    assert c.protocol == "rdma" and c.enable_ssd_offload is True and c.tenant_id == "default"
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(f))
    assert MooncakeConfig.load_from_env().master_server_address == "127.0.0.1:1"
    monkeypatch.delenv("MOONCAKE_CONFIG_PATH")
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb")
    monkeypatch.setenv("MOONCAKE_TENANT_ID", "t1")
    e = MooncakeConfig.load_from_env()
    assert e.master_server_address == "10.0.0.1:50051" and e.global_segment_size == 4 << 30
    assert e.tenant_id == "t1" and e.local_hostname == "localhost"
    monkeypatch.delenv("MOONCAKE_MASTER")
    with pytest.raises(ValueError):
        MooncakeConfig.load_from_env()
    f.write_text(json.dumps({"local_hostname": "h"}))
    with pytest.raises(ValueError, match="metadata_server"):
        MooncakeConfig.from_file(str(f))
    f.write_text(json.dumps({"local_hostname": "h", "metadata_server": "x",
                             "master_server_address": "y", "global_segment_size": "12XB"}))
    with pytest.raises(ValueError, match="12XB"):
        MooncakeConfig.from_file(str(f))


def test_setup_args_reach_a_real_master(master: kvpool_procs.Proc) -> None:
    c = MooncakeConfig("127.0.0.1", "P2PHANDSHAKE", master.addr, 32 << 20, 16 << 20, "rdma")
    s = MooncakeDistributedStore()
    assert s.setup(*c.setup_args()) == 0  # rdma: UCX to other hosts, shm on this one
    assert s.put("cfg", b"x") == 0 and s.get("cfg") == b"x"
    assert s.get_hostname().startswith("127.0.0.1:")
    assert s.close() == 0


def test_vllm_style_config_file_opens_a_kvpool_client(tmp_path: Path, server: kvpool_procs.Proc,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The MOONCAKE_CONFIG_PATH file vLLM's Mooncake connector reads is also a
    kvpool client configuration (Mooncake's keys accepted, others ignored)."""
    f = tmp_path / "mooncake.json"
    f.write_text(json.dumps({"metadata_server": "P2PHANDSHAKE",
                             "master_server_address": server.addr, "protocol": "tcp",
                             "device_name": "", "mode": "standalone-store",
                             "global_segment_size": 0, "local_buffer_size": "1GB",
                             "enable_offload": False, "tenant_id": "vllm"}))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(f))
    with kvpool.Client() as c:
        assert c.tenant == "vllm"
        c.put("from-file", b"ok")
        assert c.get("from-file") == b"ok"
        c.remove_all()
