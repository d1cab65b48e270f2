"""kvpool.fingerprint.config_fingerprint on real vLLM 0.33 configurations (the
tiny model of tests/vllm/tiny_models.py, KV-cache configs planned as
EngineCore plans them, engine.py's _plan).

Same configuration -> same fingerprint, in another process too (another
PYTHONHASHSEED, another temporary model directory of the same name and
files) and on every TP / PP rank; each input that shapes the KV bytes changes
it; weights are told apart by their files."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import engine as E  # noqa: E402  (sets VLLM_TARGET_DEVICE=cpu before vLLM loads)
import tiny_models  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import kvpool.fingerprint as F  # noqa: E402
import kvpool.vllm as kvv  # noqa: E402

KVT = {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
       "kv_role": "kv_both", "kv_connector_extra_config": {"store_config": "{}"}}


def plan(**kw: Any) -> Any:
    args = dict(mode="full", num_blocks=32, block_size=16, max_num_seqs=4, max_num_batched_tokens=256,
                max_model_len=-1, async_scheduling=False, tp_size=1, tp_rank=0)
    args.update(kw)
    return E._plan(copy.deepcopy(KVT), **args)


def fingerprint(p: Any, rank: int = 0) -> tuple[str, dict[str, Any]]:
    """What kvpool.vllm._setup computes (the scheduler half: no ranks needed),
    and config_fingerprint called on rank `rank`'s KV-cache config."""
    st = kvv._setup(p.vllm_config, p.worker_kv_cache_configs[rank], KVConnectorRole.SCHEDULER)
    fp, desc = F.config_fingerprint(p.vllm_config, p.worker_kv_cache_configs[rank], st.conn["groups"],
                                    block_size=p.scheduler_block_size, hash_block_size=p.hash_block_size,
                                    group_ids=st.store_group_ids)
    if rank == 0:
        assert st.conn["config_fingerprint"] == fp
    return fp, desc


def weights_dir(tmp: Path, name: str, files: dict[str, bytes]) -> str:
    d = tmp / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(tiny_models.TINY_LLAMA))
    for n, b in files.items():
        (d / n).write_bytes(b)
    return str(d)


def test_format_and_description() -> None:
    fp, desc = fingerprint(plan())
    assert re.fullmatch(r"[0-9a-f]{16}", fp)
    json.dumps(desc)  # JSON-able as is
    assert desc["model"] == "tiny-llama" and desc["path"] == tiny_models.model_dir()
    assert desc["dtype"] == "torch.float32" and desc["kv_cache_dtype"] == "auto"
    assert desc["block_size"] == 16 and desc["hash_block_size"] == 16
    assert desc["layout"] == {"tp": 1, "pp": 1, "pcp": 1, "dcp": 1, "num_kv_heads": 2}
    g = desc["groups"][0]
    assert g["connector"]["kind"] == "full_attention" and g["spec"]["type"] == "FullAttentionSpec"
    assert g["spec"]["dtype"] == "torch.float32" and g["spec"]["head_size"] == 16
    # the description without "path" is what is hashed
    body = {k: v for k, v in desc.items() if k != "path"}
    import hashlib
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    assert hashlib.blake2b(canon.encode()).hexdigest()[:16] == fp


CHILD = """
import json, os, sys
sys.path[:0] = {paths!r}
import test_fingerprint as T
fp, _ = T.fingerprint(T.plan(mode={mode!r}))
print(json.dumps({{"fp": fp}}))
"""


@pytest.mark.parametrize("mode", ["full", "swa", "mamba"])
def test_same_configuration_same_fingerprint_in_another_process(mode: str) -> None:
    mine, _ = fingerprint(plan(mode=mode))
    assert fingerprint(plan(mode=mode))[0] == mine  # stable in this process
    paths = [str(HERE), str(ROOT / "python"), str(ROOT / "tests" / "python")]
    env = dict(os.environ, PYTHONHASHSEED="12345")
    # the child makes its own temporary tiny-llama directory: another path, same files
    out = subprocess.run([sys.executable, "-c", CHILD.format(paths=paths, mode=mode)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["fp"] == mine


def test_every_rank_of_an_engine_agrees() -> None:
    """Keys of all ranks must carry one fingerprint: rank 0 looks up the others' prefixes."""
    for kw in (dict(tp_size=2), dict(pp_size=2), dict(tp_size=2, pp_size=2), dict(mode="swa", pp_size=2),
               dict(mode="mamba", tp_size=2)):
        p = plan(**kw)
        fps = {fingerprint(p, r)[0] for r in range(len(p.worker_kv_cache_configs))}
        assert len(fps) == 1, (kw, fps)


def test_each_input_changes_it() -> None:
    base = plan()
    fp0, _ = fingerprint(base)
    seen = {fp0}

    def mutated(fn: Any) -> str:
        """The fingerprint _setup computes after fn changed the configuration."""
        p = copy.deepcopy(base)
        fn(p.vllm_config)
        st = kvv._setup(p.vllm_config, p.worker_kv_cache_configs[0], KVConnectorRole.SCHEDULER)
        return st.conn["config_fingerprint"]

    changes = {
        "model dtype": lambda vc: setattr(vc.model_config, "dtype", torch.bfloat16),
        "kv cache dtype": lambda vc: setattr(vc.cache_config, "cache_dtype", "fp8"),
        "quantization": lambda vc: setattr(vc.model_config, "quantization", "fp8"),
        "revision": lambda vc: setattr(vc.model_config, "revision", "v2"),
        "code revision": lambda vc: setattr(vc.model_config, "code_revision", "abc"),
        "pp size": lambda vc: setattr(vc.parallel_config, "pipeline_parallel_size", 2),
        "dcp size": lambda vc: setattr(vc.parallel_config, "decode_context_parallel_size", 2),
        "hf config": lambda vc: setattr(vc.model_config.hf_config, "rope_theta", 500000.0),
    }
    for name, fn in changes.items():
        fp = mutated(fn)
        assert fp not in seen, name
        seen.add(fp)
    # planned differently: spec dtype (with the model dtype), block size, mode, TP layout
    for kw in (dict(dtype="bfloat16"), dict(dtype="float16"), dict(block_size=32), dict(mode="swa"),
               dict(mode="mla"), dict(mode="mamba"), dict(tp_size=2)):
        fp, _ = fingerprint(plan(**kw))
        assert fp not in seen, kw
        seen.add(fp)
    # hash block size alone (the scheduler's block size kept)
    st = kvv._setup(base.vllm_config, base.worker_kv_cache_configs[0], KVConnectorRole.SCHEDULER)
    fp, _ = F.config_fingerprint(base.vllm_config, base.worker_kv_cache_configs[0], st.conn["groups"],
                                 block_size=16, hash_block_size=8)
    assert fp not in seen


def test_weights_tell_models_of_one_name_apart(tmp_path: Path) -> None:
    """Two directories named alike with different weight files: different
    fingerprints; the same files in another directory: the same one."""
    rnd = os.urandom
    big_a, big_b = rnd(3 << 20), rnd(3 << 20)
    a = weights_dir(tmp_path / "a", "tiny-llama", {"model.safetensors": big_a})
    b = weights_dir(tmp_path / "b", "tiny-llama", {"model.safetensors": big_b})
    a2 = weights_dir(tmp_path / "a2", "tiny-llama", {"model.safetensors": big_a})
    fa, da = fingerprint(plan(model_path=a))
    fb, _ = fingerprint(plan(model_path=b))
    fa2, _ = fingerprint(plan(model_path=a2))
    assert fa != fb and fa == fa2
    assert da["weights"]["files"] == 1 and da["weights"]["bytes"] == 3 << 20
    # names, sizes, head and tail count; ignored files do not
    variants = {
        "renamed": {"model-00001.safetensors": big_a},
        "longer": {"model.safetensors": big_a + b"x"},
        "head": {"model.safetensors": b"y" + big_a[1:]},
        "tail": {"model.safetensors": big_a[:-1] + b"y"},
        "index": {"model.safetensors": big_a, "model.safetensors.index.json": b"{}"},
        "gguf": {"model.safetensors": big_a, "x.gguf": b"g"},
        "bin": {"model.safetensors": big_a, "pytorch_model.bin": b"b"},
        "pt": {"model.safetensors": big_a, "w.pt": b"p"},
    }
    seen = {fa, fb}
    for name, files in variants.items():
        fp, _ = fingerprint(plan(model_path=weights_dir(tmp_path / name, "tiny-llama", files)))
        assert fp not in seen, name
        seen.add(fp)
    same = {"model.safetensors": big_a, "README.md": b"docs", "tokenizer.json": b"{}"}
    assert fingerprint(plan(model_path=weights_dir(tmp_path / "docs", "tiny-llama", same)))[0] == fa
    # the documented limit: a change only in the middle of a large file is not seen
    mid = bytearray(big_a)
    mid[len(mid) // 2] ^= 1
    fm, _ = fingerprint(plan(model_path=weights_dir(tmp_path / "mid", "tiny-llama",
                                                    {"model.safetensors": bytes(mid)})))
    assert fm == fa


def test_weights_are_cached_per_path(tmp_path: Path) -> None:
    d = weights_dir(tmp_path, "tiny-llama", {"model.safetensors": b"a" * 100})
    w1 = F.weights_fingerprint(d)
    Path(d, "model.safetensors").write_bytes(b"b" * 100)
    assert F.weights_fingerprint(d) == w1  # read once per process


def test_hub_id_without_a_local_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A hub id not in the local HF cache: the id and revision stand for the
    weights (no network is tried)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    w = F.weights_fingerprint("kvpool-test/no-such-model", "main")
    assert w == {"source": "hub-id", "files": 0, "bytes": 0, "digest": ""}


def test_hub_id_resolved_to_its_cached_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A hub id in the local HF cache: its snapshot's files are fingerprinted."""
    hub = tmp_path / "hub"
    repo = hub / "models--kvpool-test--tiny"
    snap = repo / "snapshots" / ("c0ffee" * 6 + "abcd")
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snap.name)
    (snap / "model.safetensors").write_bytes(b"w" * 1000)
    (snap / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(hub))
    w = F.weights_fingerprint("kvpool-test/tiny", None)
    assert w["source"] == "hf-cache:" + snap.name and w["files"] == 1 and w["bytes"] == 1000
