"""vLLM 0.33.0's in-tree MooncakeStoreConnector on a CPU-only machine, for the benchmark.

``intree_mooncake(store)`` starts what the connector needs, applies the CPU-only patches
and yields the ``kv_transfer_config`` dict to hand to vLLM::

    with intree_mooncake("mooncake") as kvt:        # or "kvpool"
        vc = VllmConfig(..., kv_transfer_config=KVTransferConfig(**kvt))
        sched = Scheduler(vllm_config=vc, ...)     # the connector's scheduler side
        worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kv_cfg)
        worker.register_kv_caches(kv)              # starts its send / receive threads
        ...
        worker.shutdown()                          # before leaving the block

store="mooncake": the real ``mooncake_master`` from the wheel
(mooncake-transfer-engine-non-cuda 0.3.13.post1) on 127.0.0.1 at free ports, and a
``$MOONCAKE_CONFIG_PATH`` JSON: tcp, P2PHANDSHAKE, mode embedded (the worker's store
contributes a ``segment_mib`` segment in its own process; a 64 MiB local buffer).

store="kvpool": the same connector, but the ``mooncake`` module it imports is kvpool's drop-in
(python/kvpool/mooncake.py), installed the way a vLLM deployment gets it: ``KVPOOL_AS_MOONCAKE=1``
and vLLM's ``vllm.general_plugins`` entry point (``kvpool_as_mooncake`` ->
``kvpool._plugin:register``). The store is a ``build/kvpool serve`` on 127.0.0.1 (master + one
storage node of ``segment_mib``, reached through shared memory); the JSON is README's: tcp,
P2PHANDSHAKE, mode standalone-store, global_segment_size 0 (the worker contributes nothing).

CPU-only patches, in this process and only while the block runs (vLLM 0.33.0,
vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py):
  * ``torch.cuda.Event``: ``MooncakeStoreWorker.wait_for_save`` creates one and records it
    (line 1968) and the send thread calls ``.synchronize()`` on it before reading the blocks
    (lines 671, 916). Without a GPU ``record()`` raises (no NVIDIA driver). It is replaced by
    ``NoopEvent`` while CUDA is unavailable: on CPU the "forward" has written the blocks
    before ``wait_for_save`` runs, so there is nothing to wait for.
  * A tensor-parallel group: ``MooncakeStoreWorker.__init__`` calls
    ``get_tensor_model_parallel_rank()``, ``get_pcp_group()``, ``get_dcp_group()``. A
    one-process gloo world (``init_distributed_environment(world_size=1, rank=0,
    "tcp://127.0.0.1:<free port>", backend="gloo")`` + ``ensure_model_parallel_initialized(1,
    1)``) is set up unless one exists, and torn down at the end.
  * Host names: ``VLLM_HOST_IP=127.0.0.1`` and ``MOONCAKE_REQUESTER_LOCAL_HOSTNAME=127.0.0.1``
    (the ``local_hostname`` given to ``store.setup``). Not needed for it to work: without
    them ``get_ip()`` finds no route in the namespace, warns and answers 0.0.0.0, and
    Mooncake's transfer engine then registers and listens on 0.0.0.0.
  * ``VLLM_RPC_BASE_PATH`` = a private temp dir: the scheduler-to-worker lookup channel is a
    ZMQ REQ/REP socket at ipc://$VLLM_RPC_BASE_PATH/lookup_rpc_port_<lookup_rpc_port, 0>_host_
    <hostname>_dp_rank<dp>; with the default /tmp two runs on one host (namespaces do not
    separate file paths) would share it, and the worker side unlinks and rebinds it.
Works with VLLM_TARGET_DEVICE=cpu (CpuPlatform; preferred) and without it (UnspecifiedPlatform).

Mooncake's transfer engine listens on every interface, so the real store must run in private
network + pid namespaces: store="mooncake" is refused outside one unless
``require_netns=False``; ``run_in_netns`` / ``netns_command`` run a script inside
``unshare -n -p -f --kill-child`` (tests/python/mooncake_real.py's recipe). store="kvpool"
binds 127.0.0.1 only and runs anywhere.

What the connector does, in the order a driver sees it (vLLM 0.33.0):
  * The worker side serves the lookups: ``MooncakeStoreWorker.__init__`` does ``store.setup``
    and binds the lookup socket (ZMQ REP, worker rank 0, a server thread); the scheduler
    side's ``LookupKeyClient`` (ZMQ REQ) connects to it. The smoke creates the worker first. ``register_kv_caches`` registers the KV buffer (one ``register_buffer``
    per backing storage) and starts one send thread and VLLM_MOONCAKE_LOAD_RECV_THREADS (1)
    receive threads.
  * Lookup: ``get_num_new_matched_tokens`` sends the request's block hashes over that ZMQ
    socket and, with ``lookup_async`` False (the default), blocks until the worker's
    server thread answers (one ``batch_is_exist`` of one key per block). A full-prompt hit is
    cut back so the last token is recomputed.
  * Loads are asynchronous (``load_async`` True; False is not supported: ``start_load_kv``
    asserts it): the request waits in WAITING_FOR_REMOTE_KVS, ``start_load_kv`` queues it to
    the receive thread (one ``batch_get_into_multi_buffers``), ``get_finished`` reports it in
    ``finished_recving``, and only a later ``schedule()`` runs the request, so a hit costs at
    least one scheduler step without a forward.
  * Saves are asynchronous: ``wait_for_save`` queues every block completed this step to the
    send thread (``batch_is_exist`` then ``batch_put_from_multi_buffers`` of the missing
    keys, one key per block holding all layers). The scheduler pins the blocks until the
    worker reports the job in ``build_connector_worker_meta()`` (carried in
    ``KVConnectorOutput.kv_connector_worker_meta``); ``Scheduler.has_requests()`` stays True
    (``has_pending_push_work``) until then, so a driver keeps stepping after the last request
    finishes. A driver that leaves out ``kv_connector_worker_meta`` never gets the pinned blocks
    back (from the code: only ``update_connector_output`` frees them).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
PYTHON_DIR = ROOT / "python"
sys.path.insert(0, str(ROOT / "tests" / "python"))
from kvpool_procs import free_ports, wait_listening  # noqa: E402  (shared with the tests)
CONNECTOR = "MooncakeStoreConnector"
CONNECTOR_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector"
WORKER_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.worker"
NETNS_MARK = "KVPOOL_INTREE_NETNS"
LEASE_TTL_MS = 30000  # mooncake_master's default_kv_lease_ttl, as tests/python/mooncake_real.py


# ------------------------------------------------------------------ namespaces

def in_private_netns() -> bool:
    """True when the only network interface here is the loopback (an ``unshare -n``)."""
    try:  # (not /sys/class/net: unshare -n keeps the host's sysfs mounted)
        return [name for _, name in socket.if_nameindex()] == ["lo"]
    except OSError:
        return False


def unshare_prefix() -> Optional[list[str]]:
    """The first ``unshare`` form that gives a private network namespace here, or None."""
    for opts in (["-n"], ["-rn"]):
        cmd = ["unshare", *opts, "-p", "-f", "--kill-child"]
        try:
            r = subprocess.run([*cmd, "ip", "link", "set", "lo", "up"],
                               capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return cmd
    return None


def netns_command(argv: list[str]) -> list[str]:
    """``argv`` wrapped to run in fresh network + pid namespaces with the loopback up
    (everything in it dies with it). Raises RuntimeError when unshare cannot do it."""
    prefix = unshare_prefix()
    if prefix is None:
        raise RuntimeError("no private network namespace here (unshare -n / -rn failed)")
    return [*prefix, "env", f"{NETNS_MARK}=1", "sh", "-c",
            'ip link set lo up && exec "$@"', "sh", *argv]


def run_in_netns(argv: list[str], timeout_s: float = 300.0, **kw: Any) -> subprocess.CompletedProcess:
    """Runs ``argv`` in fresh network + pid namespaces; ``subprocess.run``'s result."""
    return subprocess.run(netns_command(argv), timeout=timeout_s, **kw)


# ------------------------------------------------------------------ helpers

def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class NoopEvent:
    """Stands in for ``torch.cuda.Event`` without a GPU: CPU work is already done."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self._t: Optional[float] = None

    def record(self, stream: Any = None) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        return None

    def elapsed_time(self, end: "NoopEvent") -> float:
        return ((end._t or 0.0) - (self._t or 0.0)) * 1000.0


@contextmanager
def _env(values: dict[str, Optional[str]]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _noop_cuda_event(info: dict[str, Any]) -> Iterator[None]:
    import torch
    if torch.cuda.is_available():
        info["cuda_event"] = "real (CUDA available)"
        yield
        return
    orig = torch.cuda.Event
    torch.cuda.Event = NoopEvent  # type: ignore[misc,assignment]
    info["cuda_event"] = "patched: torch.cuda.Event -> NoopEvent"
    try:
        yield
    finally:
        torch.cuda.Event = orig  # type: ignore[misc]


@contextmanager
def _tp_group(info: dict[str, Any]) -> Iterator[None]:
    import torch.distributed as dist
    from vllm.distributed import parallel_state as ps
    if ps.model_parallel_is_initialized():
        info["tp_group"] = "existing"
        yield
        return
    owned_world = not dist.is_initialized()
    if owned_world:
        port = free_ports(1)[0]
        ps.init_distributed_environment(world_size=1, rank=0,
                                        distributed_init_method=f"tcp://127.0.0.1:{port}",
                                        local_rank=0, backend="gloo")
    # initialize_model_parallel reads the current config's parallel_config (DP size,
    # elastic EP); a default VllmConfig says DP=1, which is what this world is.
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig("cpu"))):
        ps.ensure_model_parallel_initialized(1, 1)
    info["tp_group"] = "one-process gloo world, TP=PP=1 (torn down at exit)"
    try:
        yield
    finally:
        ps.destroy_model_parallel()
        if owned_world:
            ps.destroy_distributed_environment()


def _install_kvpool_as_mooncake(tmp: Path, info: dict[str, Any]) -> None:
    """Makes ``import mooncake.store`` load kvpool.mooncake the way vLLM does it: the
    ``vllm.general_plugins`` entry point with KVPOOL_AS_MOONCAKE=1 (set by the caller)."""
    import importlib
    from importlib import metadata
    pre = sys.modules.get("mooncake")
    if pre is not None and not getattr(pre, "__kvpool__", False):
        raise RuntimeError("store='kvpool': the real mooncake is already imported in this "
                           f"process ({getattr(pre, '__file__', pre)}); use a fresh process")
    if str(PYTHON_DIR) not in sys.path:
        sys.path.insert(0, str(PYTHON_DIR))
    import kvpool  # noqa: F401  (fails here, clearly, when python/ is not built)
    eps = [e for e in metadata.entry_points(group="vllm.general_plugins")
           if e.value == "kvpool._plugin:register"]
    if not eps:
        # kvpool is not pip-installed into vLLM's venv: publish pyproject.toml's entry
        # point from a throwaway dist-info so vLLM's own plugin loader finds it.
        d = tmp / "site" / "kvpool_intree_entrypoint-0.0.dist-info"
        d.mkdir(parents=True)
        (d / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpool-intree-entrypoint\n"
                                    "Version: 0.0\n")
        (d / "entry_points.txt").write_text(
            "[vllm.general_plugins]\nkvpool_as_mooncake = kvpool._plugin:register\n")
        sys.path.insert(0, str(tmp / "site"))
        importlib.invalidate_caches()
        info["_added_sys_path"] = str(tmp / "site")
        info["plugin_entry_point"] = f"temporary dist-info at {d}"
    else:
        info["plugin_entry_point"] = f"installed ({eps[0].dist.name if eps[0].dist else '?'})"
    import vllm.plugins as vp
    if not vp.plugins_loaded:
        vp.load_general_plugins()
        info["plugin_loaded_by"] = "vllm.plugins.load_general_plugins()"
    else:
        # vLLM already ran its plugins in this process (before KVPOOL_AS_MOONCAKE was
        # set): run the same register() it would have run.
        from kvpool import _plugin
        _plugin.register()
        info["plugin_loaded_by"] = "kvpool._plugin.register() (vLLM plugins were loaded earlier)"
    import mooncake.store as ms
    if not ms.__name__.startswith("kvpool"):
        raise RuntimeError(f"store='kvpool': mooncake.store is {ms.__file__}, not kvpool's")
    info["mooncake_module"] = ms.__name__


# ------------------------------------------------------------------ the context manager

@contextmanager
def intree_mooncake(store: str = "mooncake", segment_mib: int = 256, *,
                    local_buffer_mib: int = 64, extra_config: Optional[dict[str, Any]] = None,
                    require_netns: bool = True, info: Optional[dict[str, Any]] = None
                    ) -> Iterator[dict]:
    """Starts what the in-tree connector needs, applies the CPU-only patches, yields the
    kv_transfer_config dict to hand to vLLM (kv_connector="MooncakeStoreConnector",
    kv_role kv_both, ...).

    store="mooncake": a real mooncake_master (from the wheel) on 127.0.0.1 at free ports and a
    MOONCAKE_CONFIG_PATH JSON (tcp, P2PHANDSHAKE, embedded). store="kvpool": the same
    connector, but the ``mooncake`` module it imports is served by kvpool's drop-in
    (KVPOOL_AS_MOONCAKE=1 + the vllm.general_plugins entry point) against a ``kvpool serve``
    on 127.0.0.1 (standalone-store: the segment is the server's).

    ``extra_config`` is merged over the default kv_connector_extra_config. ``info``, if given,
    is filled with what was started and patched. Shut the worker connector down
    (``connector.shutdown()``) before the block ends: the store goes away at exit.
    Call in a fresh process per store kind (the two ``mooncake`` modules cannot mix).
    """
    if store not in ("mooncake", "kvpool"):
        raise ValueError(f"store must be 'mooncake' or 'kvpool', not {store!r}")
    info = {} if info is None else info
    info["store"] = store
    if store == "mooncake" and require_netns and not in_private_netns():
        raise RuntimeError(
            "store='mooncake': Mooncake's transfer engine listens on every interface; run "
            "inside a private network namespace (bench.vllm_mooncake_intree.run_in_netns / "
            "unshare -n -p -f --kill-child) or pass require_netns=False")
    with ExitStack() as st:
        tmp = Path(st.enter_context(tempfile.TemporaryDirectory(prefix="vllm-intree-mc.")))
        rpc_dir = tmp / "rpc"
        rpc_dir.mkdir()
        log_path = tmp / f"{store}-server.log"
        log = st.enter_context(open(log_path, "wb"))
        t0 = time.perf_counter()
        if store == "mooncake":
            import importlib.util
            spec = importlib.util.find_spec("mooncake")
            if spec is None or spec.origin is None:
                raise RuntimeError("the mooncake wheel is not importable in this python")
            if getattr(sys.modules.get("mooncake"), "__kvpool__", False):
                raise RuntimeError("store='mooncake': kvpool's drop-in is installed as mooncake "
                                   "in this process; use a fresh process")
            master_bin = Path(spec.origin).parent / "mooncake_master"
            rpc_port, metrics_port = free_ports(2)
            proc = subprocess.Popen(
                [str(master_bin), "--rpc_address=127.0.0.1", f"--rpc_port={rpc_port}",
                 "--metrics_host=127.0.0.1", f"--metrics_port={metrics_port}",
                 f"--default_kv_lease_ttl={LEASE_TTL_MS}", "--enable_metric_reporting=false",
                 "--logtostderr"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            st.callback(_stop, proc)
            wait_listening(rpc_port, proc, time.monotonic() + 15, "mooncake_master")
            master = f"127.0.0.1:{rpc_port}"
            cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                   "master_server_address": master, "protocol": "tcp", "device_name": "",
                   "mode": "embedded", "global_segment_size": segment_mib << 20,
                   "local_buffer_size": local_buffer_mib << 20}
            info["server"] = f"mooncake_master {master_bin} at {master}"
        else:
            kvpool_bin = os.environ.get("KVPOOL_BIN") or str(ROOT / "build" / "kvpool")
            if not os.access(kvpool_bin, os.X_OK):
                raise RuntimeError(f"no kvpool binary at {kvpool_bin} (make)")
            pf = tmp / "port"
            proc = subprocess.Popen(
                [kvpool_bin, "serve", "--listen", "127.0.0.1:0", "--port-file", str(pf),
                 "--segment-size", f"{segment_mib}MiB"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            st.callback(_stop, proc)
            deadline = time.monotonic() + 20
            while not (pf.exists() and pf.read_text().strip()):
                if proc.poll() is not None:
                    raise RuntimeError(f"kvpool serve exited with {proc.returncode}: "
                                       f"{log_path.read_text(errors='replace')[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError("kvpool serve did not start")
                time.sleep(0.02)
            master = f"127.0.0.1:{int(pf.read_text().strip())}"
            cfg = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                   "master_server_address": master, "protocol": "tcp", "device_name": "",
                   "mode": "standalone-store", "global_segment_size": 0,
                   "local_buffer_size": local_buffer_mib << 20}
            info["server"] = f"{kvpool_bin} serve --segment-size {segment_mib}MiB at {master}"
        info["server_log"] = str(log_path)
        info["server_start_s"] = round(time.perf_counter() - t0, 3)
        cfg_path = tmp / "mooncake.json"
        cfg_path.write_text(json.dumps(cfg, indent=1) + "\n")
        info["mooncake_config"] = cfg

        env: dict[str, Optional[str]] = {
            "MOONCAKE_CONFIG_PATH": str(cfg_path),
            "MOONCAKE_REQUESTER_LOCAL_HOSTNAME": "127.0.0.1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_RPC_BASE_PATH": str(rpc_dir),
            "KVPOOL_AS_MOONCAKE": "1" if store == "kvpool" else None,
        }
        if store == "kvpool":
            pp = os.environ.get("PYTHONPATH")
            env["PYTHONPATH"] = str(PYTHON_DIR) + (os.pathsep + pp if pp else "")
        st.enter_context(_env(env))
        if store == "kvpool":
            _install_kvpool_as_mooncake(tmp, info)
            added = info.pop("_added_sys_path", None)
            if added:
                st.callback(lambda: added in sys.path and sys.path.remove(added))
        st.enter_context(_noop_cuda_event(info))
        st.enter_context(_tp_group(info))

        extra = {
            # The connector's defaults, spelled out so the benchmark reports them:
            "load_async": True,       # loads run on the receive thread; the scheduler
                                      # parks the request in WAITING_FOR_REMOTE_KVS
            "lookup_async": False,    # get_num_new_matched_tokens blocks on the ZMQ lookup
            "enable_lookup": True,
            "save_decode_cache": False,
        }
        extra.update(extra_config or {})
        info["rpc_base_path"] = str(rpc_dir)
        try:
            yield {"kv_connector": CONNECTOR, "kv_role": "kv_both",
                   "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}
        except BaseException:
            # The log lives in the temp dir that is about to go: show its tail.
            log.flush()
            tail = log_path.read_text(errors="replace")[-3000:]
            print(f"--- {store} server log (tail) ---\n{tail}", file=sys.stderr)
            raise
