"""Fixtures of the real-engine tests: vLLM's CPU engine (scripts/vllm-cpu-env)
started by driver.py in processes of its own, tiny models with seeded random
weights (tiny_weights.py), and `kvpool serve` on 127.0.0.1 (kvpool_procs)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
for p in (HERE, ROOT / "python", ROOT / "tests" / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import kvpool_procs  # noqa: E402
import tiny_weights  # noqa: E402

BLOCK = 32          # the CPU backend's block size must be a multiple of 32
ENGINE_TIMEOUT_S = 600


def prompt(seed: int, n: int, vocab: int = tiny_weights.SMALL.vocab) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def kv_config(master: str, *, connector: str = "kvpool", **extra: Any) -> dict[str, Any]:
    """kv_transfer_config for KVPoolConnector (or, connector="mooncake", vLLM's
    in-tree MooncakeStoreConnector, whose store config is $MOONCAKE_CONFIG_PATH)
    against the pool at master."""
    if connector == "mooncake":
        return {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}
    store = json.dumps({"master": master, "mode": "standalone-store", "global_segment_size": 0,
                        "local_buffer_size": "64MiB", "rpc_timeout": "2s"})
    return {"kv_connector": "KVPoolConnector", "kv_connector_module_path": "kvpool.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": dict({"store_config": store}, **extra)}


@dataclass
class Run:
    """A finished (or running) driver.py process and what it wrote."""
    dir: Path
    proc: "subprocess.Popen[bytes]"
    spec: dict[str, Any]
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> str:
        return (self.dir / "log").read_text(errors="replace")

    def wait(self, timeout: float = ENGINE_TIMEOUT_S) -> "Run":
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"engine timed out; log tail:\n{self.log[-4000:]}")
        out = self.dir / "result.json"
        self.result = json.loads(out.read_text()) if out.exists() else {}
        assert rc == 0 and "error" not in self.result, \
            f"engine exited {rc}: {self.result.get('error')}\n{self.log[-4000:]}"
        return self

    def phase(self, name: str) -> dict[str, Any]:
        for p in self.result["phases"]:
            if p["name"] == name:
                return p
        raise KeyError(name)

    def tokens(self, name: str) -> list[list[int]]:
        return [o["tokens"] for o in self.phase(name)["outputs"]]

    def cached(self, name: str) -> list[int]:
        return [o["cached"] for o in self.phase(name)["outputs"]]

    def done(self, name: str) -> bool:
        return (self.dir / f"{name}.done").exists()


class Engines:
    """Starts driver.py processes; each gets its own directory under tmp."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.n = 0

    def start(self, model: str, phases: list[dict[str, Any]], *,
              env: Optional[dict[str, str]] = None, **spec: Any) -> Run:
        self.n += 1
        d = self.tmp / f"engine{self.n}"
        d.mkdir()
        full = dict(spec, model=model, phases=phases)
        (d / "spec.json").write_text(json.dumps(full))
        e = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        e["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "python"),
                                           e.get("PYTHONPATH", "")])
        # the lookup socket's path must fit a unix address (108 bytes)
        e["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="kvp-rpc-")
        e.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        e.update(env or {})
        with open(d / "log", "wb") as log:
            proc = subprocess.Popen([sys.executable, str(HERE / "driver.py"), str(d / "spec.json"),
                                     str(d / "result.json")], stdout=log,
                                    stderr=subprocess.STDOUT, env=e, cwd=str(d),
                                    start_new_session=True)
        return Run(d, proc, full)

    def run(self, model: str, phases: list[dict[str, Any]], **spec: Any) -> Run:
        return self.start(model, phases, **spec).wait()


@pytest.fixture(scope="session")
def models() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvpool-engine-models-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def llama(models: Path) -> str:
    return tiny_weights.cached(str(models), tiny_weights.SMALL, seed=1, name="tiny-llama")


@pytest.fixture
def engines(tmp_path: Path) -> Engines:
    return Engines(tmp_path)


@pytest.fixture
def pool() -> Iterator[kvpool_procs.Proc]:
    p = kvpool_procs.serve("256MiB")
    yield p
    p.stop()


def pool_stats(addr: str) -> dict[str, Any]:
    """`kvpool stat --json` of the pool at addr."""
    out = subprocess.run([kvpool_procs.kvpool_bin(), "stat", "--master", addr, "--json"],
                         capture_output=True, text=True, timeout=30,
                         env=kvpool_procs.server_env())
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)
