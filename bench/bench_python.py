"""bench/bench_python.py -- kvpool.mooncake next to the C client and the real Mooncake wheel.

What is measured, in one run on this host (32 MiB per batch, shapes 64 x 512 KiB and 16 x 2 MiB):
  * batch_put_from / batch_get_into (one registered buffer per key, "single") and
    batch_put_from_multi_buffers / batch_get_into_multi_buffers ("multi": each key gathered
    from / scattered into 32 KiB pieces, 16 per 512 KiB key and 64 per 2 MiB key, laid out
    layer-major as in a paged KV cache: piece j of key i at offset (j * keys + i) * 32 KiB);
  * for kvpool.mooncake.MooncakeDistributedStore, a pure client (global_segment_size 0) of a
    `kvpool serve` started here (1 GiB segment): once as is (shared memory) and once with
    KVPOOL_FORCE_TCP=1 in the client process's environment (read at client open: TCP path);
  * the C client on the same server: `kvpool bench store --master ADDR --json --rounds N`
    (kvp_client_batch_{put_from,get_into}_multi_buffers, one piece per value; it opens its
    shm and its TCP client itself); its kvpool_shm / kvpool_tcp cells are the C figures, and
    its memcpy / raw_tcp cells are kept as the host's ceilings;
  * the real Mooncake wheel, embedded (1 GiB global segment, 512 MiB local buffer, tcp,
    P2PHANDSHAKE, mooncake_master on 127.0.0.1), in its own process inside a private network
    and pid namespace: with its defaults (TCP-only engine: MC_STORE_MEMCPY auto-on, so the
    same-process memcpy path) and with MC_STORE_MEMCPY=0 (the transfer engine over TCP);
  * 1024-key batch_is_exist (keys present) and sequential 4 KiB put / get (bytes API) for
    kvpool.mooncake and Mooncake.
How: each cell runs WARMUP untimed rounds (the first one's bytes are read back and compared)
and then ROUNDS timed rounds of (put the batch, get it back) with fresh keys; the round's keys
are removed (batch_remove force=True) untimed in between. Buffers are page-aligned numpy
arrays, registered (a plain np.empty starts 16 bytes into a page, and copies into such a
destination run ~1/3 slower here). This host's speed drifts by up to 2x within a minute, so
the whole set runs PASSES times (every other pass in reverse order); a cell reports its
median pass: GB/s = batch bytes / p50 round time (10^9 B/s), p50 of that pass, p99 (nearest
rank) over the rounds of all passes. Every ratio is computed inside each pass (both sides a
few seconds apart) and the median over the passes is reported. The C cells are converted the
same way from their p50 (the C tool prints no p99, and uses its own kvp_malloc buffers). The
path each cell took is checked: loopback bytes during the cell per byte moved (~0 shared
memory or memcpy, ~1 TCP), and for kvpool the transport the client names for a stored key.
Output: a table on stderr, JSON in bench/results/python.json. Exit status 1 only if the
kvpool server or a kvpool cell (Python or C) could not run; a Mooncake cell that cannot run
is reported as skipped (no wheel, no unshare) or failed, with the reason.

  VENV/bin/python bench/bench_python.py [--rounds 20] [--warmup 3] [--passes 5] [--out PATH]
                                        [--kvpool build/kvpool]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
PIECE = 32 << 10
SHAPES = [("64x512KiB", 64, 512 << 10), ("16x2MiB", 16, 2 << 20)]
BATCH = 32 * MiB
METHODS = {"single": "batch_put_from/batch_get_into",
           "multi": "batch_put_from_multi_buffers/batch_get_into_multi_buffers"}
EXIST_KEYS, SMALL = 1024, 4096
Result = dict[str, Any]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def aligned(np: Any, n: int) -> Any:
    """n bytes of a numpy array starting on a page boundary. A plain np.empty of this size
    starts 16 bytes into its page, and glibc's memcpy into such a destination from the
    page-aligned segment runs at ~2/3 speed here (AMD EPYC, AVX-512): KV caches (torch, pinned
    or mmap'd pools) are at least 64-byte aligned, so the benchmark buffers are too."""
    raw = np.empty(n + 4096, dtype=np.uint8)
    off = (-raw.ctypes.data) % 4096
    return raw[off:off + n]


def lo_bytes() -> int:
    """Bytes received on the loopback interface of this network namespace so far."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[0])
    return 0


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# ------------------------------------------------------------------ worker (one store)

class Keys:
    """Fresh keys for every round (vLLM-like names), unique per worker."""

    def __init__(self, label: str) -> None:
        self.label, self.seq = label, 0

    def __call__(self, n: int) -> list[str]:
        self.seq += 1
        return [f"bench-python/{self.label}/{self.seq}@tp0@pcp0@dcp0@pp0@{i}" for i in range(n)]


def transfer_cell(store: Any, src: Any, dst: Any, keys: Keys, shape: str, n: int, size: int,
                  method: str, rounds: int, warmup: int) -> Result:
    """WARMUP + ROUNDS rounds of batch put + batch get of n values of size bytes."""
    import numpy as np
    m = size // PIECE
    if method == "single":  # value i at i * size
        def at(base: int) -> list[Any]:
            return [base + i * size for i in range(n)]
        sizes: list[Any] = [size] * n
        put, get = store.batch_put_from, store.batch_get_into
    else:  # piece j of value i at (j * n + i) * PIECE: one "layer" of every value after another
        def at(base: int) -> list[Any]:
            return [[base + (j * n + i) * PIECE for j in range(m)] for i in range(n)]
        sizes = [[PIECE] * m for _ in range(n)]
        put, get = store.batch_put_from_multi_buffers, store.batch_get_into_multi_buffers
    sp, dp = at(src.ctypes.data), at(dst.ctypes.data)
    cell: Result = {"shape": shape, "method": METHODS[method],
                    "pieces_per_key": 1 if method == "single" else m}
    pt: list[float] = []
    gt: list[float] = []
    lo0 = 0
    try:
        for r in range(warmup + rounds):
            if r == warmup:
                lo0 = lo_bytes()
            ks = keys(n)
            if r == 0:
                dst[:] = 0
            t0 = time.perf_counter()
            pr = put(ks, sp, sizes)
            t1 = time.perf_counter()
            gr = get(ks, dp, sizes)
            t2 = time.perf_counter()
            if any(x != 0 for x in pr) or any(x != size for x in gr):
                raise RuntimeError(f"put {sorted(set(pr))} get {sorted(set(gr))}")
            if r == 0 and not np.array_equal(src, dst):
                raise RuntimeError("bytes read back differ from what was put")
            if r >= warmup:
                pt.append(t1 - t0)
                gt.append(t2 - t1)
            store.batch_remove(ks, True)
        lo = lo_bytes() - lo0
        cell.update(status="ok", rounds=rounds, **summary(pt, gt),
                    lo_bytes_per_byte=round(lo / (2 * BATCH * rounds), 3),
                    _samples={"put": us(pt), "get": us(gt)})
    except Exception as e:  # one cell failing must not hide the others
        cell.update(status="failed", reason=f"{type(e).__name__}: {e}")
        store.remove_all(True)
    return cell


def exist_cell(store: Any, src: Any, keys: Keys) -> Result:
    """batch_is_exist of EXIST_KEYS present keys (4 KiB values): 5 untimed calls, 50 timed."""
    ks = keys(EXIST_KEYS)
    put = store.batch_put_from(ks, [src.ctypes.data + i * SMALL for i in range(EXIST_KEYS)],
                               [SMALL] * EXIST_KEYS)
    lat: list[float] = []
    for r in range(5 + 50):
        t0 = time.perf_counter()
        ex = store.batch_is_exist(ks)
        if r >= 5:
            lat.append(time.perf_counter() - t0)
    store.batch_remove(ks, True)
    cell: Result = {"shape": f"{EXIST_KEYS}x4KiB", "method": "batch_is_exist", "rounds": len(lat),
                    "p50_us": round(pct(lat, 50) * 1e6, 1), "p99_us": round(pct(lat, 99) * 1e6, 1),
                    "_samples": {"": us(lat)}, "status": "ok"}
    if any(x != 0 for x in put) or any(x != 1 for x in ex):
        cell.update(status="failed", reason=f"put {sorted(set(put))} exist {sorted(set(ex))}")
    return cell


def small_ops_cell(store: Any, src: Any, keys: Keys, limit_s: float = 1.5) -> Result:
    """Sequential single-key 4 KiB put(key, bytes) then get(key): up to 2000 each or limit_s."""
    value = src[:SMALL].tobytes()
    ks = keys(2000)
    pl: list[float] = []
    gl: list[float] = []
    bad = 0
    start = time.perf_counter()
    for k in ks:
        t0 = time.perf_counter()
        bad += store.put(k, value) != 0
        pl.append(time.perf_counter() - t0)
        if t0 - start > limit_s:
            break
    start = time.perf_counter()
    for k in ks[:len(pl)]:
        t0 = time.perf_counter()
        bad += store.get(k) != value
        gl.append(time.perf_counter() - t0)
        if t0 - start > limit_s:
            break
    store.batch_remove(ks[:len(pl)], True)
    cell: Result = {"shape": "1x4KiB", "method": "put/get", "status": "ok", "ops": len(pl),
                    "put_ops_s": round(len(pl) / sum(pl)), "get_ops_s": round(len(gl) / sum(gl)),
                    "put_p50_us": round(pct(pl, 50) * 1e6, 1),
                    "put_p99_us": round(pct(pl, 99) * 1e6, 1),
                    "get_p50_us": round(pct(gl, 50) * 1e6, 1),
                    "get_p99_us": round(pct(gl, 99) * 1e6, 1),
                    "_samples": {"put": us(pl), "get": us(gl)}}
    if bad:
        cell.update(status="failed", reason=f"{bad} puts/gets failed")
    return cell


def run_cells(store: Any, label: str, rounds: int, warmup: int) -> list[Result]:
    """Every cell on one store object (kvpool.mooncake or the real Mooncake: the same calls)."""
    import numpy as np
    src, dst = aligned(np, BATCH), aligned(np, BATCH)
    src[:] = np.random.default_rng(7).integers(0, 256, BATCH, dtype=np.uint8)
    dst[:] = 1  # written: a first touch must not be timed
    for a in (src, dst):
        if store.register_buffer(a.ctypes.data, a.nbytes) != 0:
            raise RuntimeError("register_buffer failed")
    keys = Keys(label)
    out = [transfer_cell(store, src, dst, keys, shape, n, size, method, rounds, warmup)
           for shape, n, size in SHAPES for method in METHODS]
    return out + [exist_cell(store, src, keys), small_ops_cell(store, src, keys)]


def us(xs: list[float]) -> list[float]:
    return [round(x * 1e6, 1) for x in xs]


def summary(pt: list[float], gt: list[float]) -> Result:
    return {"put_gbps": round(BATCH / pct(pt, 50) / 1e9, 3),
            "get_gbps": round(BATCH / pct(gt, 50) / 1e9, 3),
            "put_p50_us": round(pct(pt, 50) * 1e6, 1), "put_p99_us": round(pct(pt, 99) * 1e6, 1),
            "get_p50_us": round(pct(gt, 50) * 1e6, 1), "get_p99_us": round(pct(gt, 99) * 1e6, 1)}


def worker_kvpool(master: str, label: str, rounds: int, warmup: int) -> Result:
    sys.path.insert(0, str(ROOT / "python"))
    from kvpool.mooncake import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 0, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"setup returned {rc}")
    probe = f"bench-python/{label}/probe"
    store.put(probe, b"x" * SMALL)
    desc = store._c.describe(probe)  # "... via shm" / "... via tcp"
    via = str(desc).split(" via ", 1)[1].split()[0].rstrip(";,") if " via " in str(desc) else "?"
    store.remove(probe, True)
    cells = run_cells(store, label, rounds, warmup)
    store.close()
    return {"path": via, "cells": cells}


def worker_mooncake(label: str, rounds: int, warmup: int) -> Result:
    """Inside the namespace: mooncake_master on 127.0.0.1, an embedded store, the cells."""
    import mooncake
    from mooncake.store import MooncakeDistributedStore
    rpc, metrics = free_ports(2)
    master_log = tempfile.NamedTemporaryFile(prefix="mooncake_master.", suffix=".log")
    master = subprocess.Popen(
        [str(Path(mooncake.__file__).parent / "mooncake_master"), "--rpc_address=127.0.0.1",
         f"--rpc_port={rpc}", "--metrics_host=127.0.0.1", f"--metrics_port={metrics}",
         "--enable_metric_reporting=false", "--logtostderr"],
        stdout=master_log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", rpc), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or master.poll() is not None:
                    raise RuntimeError("mooncake_master did not start")
                time.sleep(0.05)
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 30, 512 * MiB, "tcp", "",
                         f"127.0.0.1:{rpc}")
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}")
        cells = run_cells(store, label, rounds, warmup)
        store.close()
        return {"path": "", "cells": cells}
    finally:
        master.terminate()
        master.wait(10)


# ------------------------------------------------------------------ orchestration

class Serve:
    """`kvpool serve` on a free loopback port (1 GiB segment), stopped at the end."""

    def __init__(self, binary: str) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="bench-python.")
        pf = Path(self.dir.name) / "port"
        self.log = open(Path(self.dir.name) / "log", "wb")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--port-file", str(pf),
             "--segment-size", "1GiB", "--log-level", "warn"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not (pf.exists() and pf.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (Path(self.dir.name) / "log").read_text(errors="replace")[-500:]
                self.stop()
                raise RuntimeError(f"kvpool serve did not start: {log}")
            time.sleep(0.02)
        self.addr = f"127.0.0.1:{pf.read_text().strip()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()
        self.dir.cleanup()


def spawn_worker(prefix: list[str], args: list[str], env: dict[str, str],
                 timeout: float) -> tuple[Optional[Result], str]:
    """Runs this file as a worker: (its result with its stderr as "log", "") or (None, why)."""
    with tempfile.TemporaryDirectory(prefix="bench-python.") as tmp:
        res = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--result", str(res), *args]
        if prefix:  # a fresh network namespace: bring lo up first
            cmd = [*prefix, "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return None, f"took over {timeout:.0f} s"
        if p.returncode != 0 or not res.exists():
            tail = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()][-3:]
            return None, f"rc {p.returncode}: " + " | ".join(tail)
        r: Result = json.loads(res.read_text())
        r["log"] = p.stderr
        return r, ""


def unshare_prefix() -> tuple[Optional[list[str]], str]:
    if not shutil.which("unshare"):
        return None, "unshare not found"
    for opts in (["-n"], ["-rn"]):
        cmd = ["unshare", *opts, "-p", "-f", "--kill-child"]
        try:
            if subprocess.run([*cmd, "ip", "link", "set", "lo", "up"], capture_output=True,
                              timeout=10).returncode == 0:
                return cmd, ""
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None, "no private network namespace (unshare -n / -rn failed)"


def rows(system: str, r: Optional[Result], why: str, status: str = "failed") -> list[Result]:
    if r is None:
        return [{"system": system, "status": status, "reason": why}]
    return [{"system": system, "path": r["path"], **c} for c in r["cells"]]


def run_python_kvpool(addr: str, system: str, env: dict[str, str], wargs: list[str]) -> list[Result]:
    r, why = spawn_worker([], ["--worker", "kvpool", "--master", addr, "--label", system, *wargs],
                          env, 150)
    return rows(system, r, why)


def run_c(binary: str, addr: str, rounds: int) -> list[Result]:
    """`kvpool bench store` on the same server; its kvpool cells (and ceilings) as rows."""
    try:
        p = subprocess.run([binary, "bench", "store", "--master", addr, "--json",
                            "--rounds", str(rounds)], capture_output=True, text=True, timeout=180)
        doc = json.loads(p.stdout)
    except subprocess.TimeoutExpired:
        return rows("kvpool_c", None, "kvpool bench store took over 180 s")
    except json.JSONDecodeError:
        return rows("kvpool_c", None, f"kvpool bench store rc {p.returncode}: "
                    f"{p.stderr.strip()[-300:]}")
    names = {"memcpy": "memcpy", "raw_tcp": "raw_tcp", "kvpool_shm": "kvpool_c_shm",
             "kvpool_tcp": "kvpool_c_tcp"}
    out: list[Result] = []
    for c in doc["results"]:
        name = names.get(c["system"])
        if name is None:
            continue
        row: Result = {"system": name, "path": doc["transports"].get(c["system"], c["system"]),
                       "shape": c["shape"], "status": c["status"],
                       "method": ("kvp_client_batch_{put_from,get_into}_multi_buffers, 1 piece"
                                  if name.startswith("kvpool") else c["system"])}
        if c["status"] == "ok":
            row.update(rounds=c["rounds"], put_gbps=round(BATCH / c["put_p50_us"] / 1e3, 3),
                       get_gbps=round(BATCH / c["get_p50_us"] / 1e3, 3),
                       put_p50_us=c["put_p50_us"], put_p99_us=None,
                       get_p50_us=c["get_p50_us"], get_p99_us=None,
                       c_mean_put_gbps=c["put_gbps"], c_mean_get_gbps=c["get_gbps"])
        else:
            row["reason"] = c.get("reason", "")
        out.append(row)
    return out


def run_mooncake(system: str, env: dict[str, str], path: str, wargs: list[str],
                 prefix: Optional[list[str]], why: str) -> list[Result]:
    if prefix is None:
        return rows(system, None, why, "skipped")
    r, w = spawn_worker(prefix, ["--worker", "mooncake", "--label", system, *wargs], env, 150)
    if r is not None:  # what Mooncake itself logged about its path
        said = [ln.split("] ", 1)[-1] for ln in r["log"].splitlines() if "MC_STORE_MEMCPY" in ln]
        r["path"] = path + (f" [log: {said[0]}]" if said else "")
    return rows(system, r, w)


def score(r: Result) -> float:
    """A cell's round time (lower is faster); failed cells sort last."""
    if r.get("status") != "ok":
        return math.inf
    if "p50_us" in r:
        return float(r["p50_us"])
    return float(r["put_p50_us"]) + float(r["get_p50_us"])


def merge(passes: list[list[Result]]) -> list[Result]:
    """One row per (system, shape, method): its median pass by round time (this host's speed
    drifts by up to 2x within a minute), with every pass's figures."""
    groups: dict[tuple[Any, ...], list[Result]] = {}
    for i, rs in enumerate(passes):
        for r in rs:
            groups.setdefault((r["system"], r.get("shape"), r.get("method")), []).append(
                {**r, "pass": i + 1})
    out: list[Result] = []
    for g in groups.values():
        ok = sorted((r for r in g if r["status"] == "ok"), key=score)
        best = dict(ok[(len(ok) - 1) // 2] if ok else g[-1])
        pooled: dict[str, list[float]] = {}
        for r in g:  # p99 over the rounds of every pass
            for op, xs in r.pop("_samples", {}).items():
                pooled.setdefault(op, []).extend(xs)
        best.pop("_samples", None)
        for op, xs in pooled.items():
            if xs and best["status"] == "ok":
                best[f"{op}_p99_us" if op else "p99_us"] = pct(xs, 99)
                best["p99_samples"] = len(xs)
        if len(g) > 1 and ok:
            keys = [k for k in ("put_gbps", "get_gbps", "p50_us", "put_ops_s", "get_ops_s")
                    if k in best]
            best["passes"] = [{k: r.get(k) for k in keys} if r["status"] == "ok"
                              else {"status": r["status"]} for r in g]
        out.append(best)
    return out


def median_ratios(passes: list[list[Result]]) -> list[Result]:
    """Each ratio computed within every pass (both sides measured a few seconds apart),
    then the median over the passes."""
    per = [compute_ratios(rs) for rs in passes]
    out: list[Result] = []
    for i, r in enumerate(per[0]):
        vals = [p[i]["value"] for p in per if p[i]["value"] is not None]
        v = round(sorted(vals)[len(vals) // 2] if len(vals) % 2 else
                  sum(sorted(vals)[len(vals) // 2 - 1:len(vals) // 2 + 1]) / 2, 3) if vals else None
        m: Result = {**r, "value": v, "passes": [p[i]["value"] for p in per]}
        if "target" in r:
            m["met"] = None if v is None else v >= float(r["target"].split()[-1])
        out.append(m)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=20, help="timed rounds per cell and pass")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds per cell")
    ap.add_argument("--passes", type=int, default=5, help="passes over every system")
    ap.add_argument("--out", default=str(ROOT / "bench/results/python.json"))
    ap.add_argument("--kvpool", default=os.environ.get("KVPOOL_BIN", str(ROOT / "build/kvpool")))
    ap.add_argument("--result", help=argparse.SUPPRESS)  # worker: where to write its result
    ap.add_argument("--worker", choices=["kvpool", "mooncake"], help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="x", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        r = (worker_kvpool(a.master, a.label, a.rounds, a.warmup) if a.worker == "kvpool"
             else worker_mooncake(a.label, a.rounds, a.warmup))
        Path(a.result).write_text(json.dumps(r))
        return 0

    t_start, load0 = time.monotonic(), os.getloadavg()
    wargs = ["--rounds", str(a.rounds), "--warmup", str(a.warmup)]
    env = {k: v for k, v in os.environ.items() if k not in ("KVPOOL_FORCE_TCP", "MC_STORE_MEMCPY")}
    prefix, why = unshare_prefix()
    if subprocess.run([sys.executable, "-c", "import numpy, mooncake.store"],
                      capture_output=True).returncode != 0:
        prefix, why = None, f"numpy or mooncake.store does not import in {sys.executable}"
    try:
        serve = Serve(a.kvpool)
    except (OSError, RuntimeError) as e:
        print(f"bench_python: {e}", file=sys.stderr)
        return 1
    jobs: list[tuple[str, Callable[[], list[Result]]]] = [
        ("kvpool.mooncake_shm", lambda: run_python_kvpool(serve.addr, "kvpool.mooncake_shm",
                                                          env, wargs)),
        ("kvpool.mooncake_tcp", lambda: run_python_kvpool(
            serve.addr, "kvpool.mooncake_tcp", {**env, "KVPOOL_FORCE_TCP": "1"}, wargs)),
        ("kvpool bench store (C)", lambda: run_c(a.kvpool, serve.addr, a.rounds)),
        ("mooncake_default", lambda: run_mooncake(
            "mooncake_default", env, "memcpy (same process; MC_STORE_MEMCPY unset)", wargs,
            prefix, why)),
        ("mooncake_memcpy0", lambda: run_mooncake(
            "mooncake_memcpy0", {**env, "MC_STORE_MEMCPY": "0"},
            "transfer engine TCP (MC_STORE_MEMCPY=0)", wargs, prefix, why)),
    ]
    passes: list[list[Result]] = []
    try:
        for p in range(a.passes):  # every other pass in reverse order: drift hits all alike
            rs: list[Result] = []
            for name, job in (jobs if p % 2 == 0 else jobs[::-1]):
                print(f"== pass {p + 1}/{a.passes}: {name}", file=sys.stderr)
                rs += job()
            passes.append(rs)
    finally:
        serve.stop()
    results = merge(passes)
    failed = any(r["status"] != "ok" for r in results if r["system"].startswith("kvpool"))
    doc = {"bench": "python", "rounds": a.rounds, "warmup": a.warmup, "passes": a.passes,
           "gbps": "batch bytes / p50 round time, 10^9 B/s; per cell its median pass "
                   "(all passes listed); ratios: median over passes of the in-pass ratio",
           "kvpool_server": "kvpool serve, segment 1GiB; Python clients global_segment_size 0",
           "mooncake_setup": "embedded: global_segment_size 1GiB, local_buffer_size 512MiB, "
                             "tcp, P2PHANDSHAKE; mooncake_master on 127.0.0.1 in a private netns",
           "buffers": "numpy, page-aligned, registered; C client: its own (kvp_malloc)",
           "python": sys.version.split()[0], "cpus": os.cpu_count(),
           "loadavg_1m": {"before": round(load0[0], 2), "after": round(os.getloadavg()[0], 2)},
           "shapes": [{"shape": s, "values": n, "value_bytes": z, "batch_bytes": n * z,
                       "multi_pieces_per_key": z // PIECE, "piece_bytes": PIECE}
                      for s, n, z in SHAPES],
           "results": results, "ratios": median_ratios(passes),
           "elapsed_s": round(time.monotonic() - t_start, 1)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(dump(doc))
    print_table(doc)
    print(f"  JSON: {a.out}", file=sys.stderr)
    return 1 if failed else 0


def dump(doc: Result) -> str:
    """JSON as bench/results/store.json has it: a key a line, a result or ratio a line."""
    lines = []
    for k, v in doc.items():
        if k in ("results", "ratios"):
            body = ",\n".join("    " + json.dumps(x) for x in v)
            lines.append(f"  {json.dumps(k)}: [\n{body}\n  ]")
        else:
            lines.append(f"  {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def cell(results: list[Result], system: str, shape: str, method: str) -> Optional[Result]:
    for r in results:
        if (r["system"] == system and r.get("shape") == shape and r.get("status") == "ok"
                and (method == "*" or r.get("method") == method)):
            return r
    return None


def compute_ratios(results: list[Result]) -> list[Result]:
    out: list[Result] = []

    def ratio(name: str, num: Optional[Result], den: Optional[Result], key: str,
              shape: str, method: str, op: str, target: Optional[float], lower: bool = False) -> None:
        v = None
        if num is not None and den is not None and num.get(key) and den.get(key):
            v = round(den[key] / num[key] if lower else num[key] / den[key], 3)
        r: Result = {"ratio": name, "shape": shape, "method": method, "op": op, "value": v}
        if target is not None:
            r.update(target=f">= {target}", met=None if v is None else v >= target)
        out.append(r)

    for path, moon in (("shm", "mooncake_default"), ("tcp", "mooncake_memcpy0")):
        for shape, _, _ in SHAPES:
            c = cell(results, f"kvpool_c_{path}", shape, "*")
            for m in METHODS.values():
                p = cell(results, f"kvpool.mooncake_{path}", shape, m)
                for op in ("put", "get"):
                    ratio(f"kvpool.mooncake_{path}/kvpool_c_{path}", p, c, f"{op}_gbps", shape, m,
                          op, 0.9)
                    ratio(f"kvpool.mooncake_{path}/{moon}", p, cell(results, moon, shape, m),
                          f"{op}_gbps", shape, m, op, None)
        p = cell(results, f"kvpool.mooncake_{path}", f"{EXIST_KEYS}x4KiB", "batch_is_exist")
        ratio(f"kvpool.mooncake_{path}/{moon} (speed: inverse p50)", p,
              cell(results, moon, f"{EXIST_KEYS}x4KiB", "batch_is_exist"), "p50_us",
              f"{EXIST_KEYS}x4KiB", "batch_is_exist", "exist", None, lower=True)
        for op in ("put", "get"):
            ratio(f"kvpool.mooncake_{path}/{moon}", cell(results, f"kvpool.mooncake_{path}", "1x4KiB",
                                                         "put/get"),
                  cell(results, moon, "1x4KiB", "put/get"), f"{op}_ops_s", "1x4KiB", "put/get",
                  op, None)
    return out


def print_table(doc: Result) -> None:
    def f(v: Any, w: int, d: int = 2) -> str:
        return f"{v:{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"

    o = sys.stderr
    print(f"\nbench_python: {doc['passes']} passes x {doc['rounds']} rounds (+{doc['warmup']} "
          f"warm-up); GB/s = 32 MiB / p50 of the median pass; p99 over all passes; times in ms; "
          f"lo = loopback bytes per byte moved", file=o)
    print(f"  {'system':<20} {'shape':<10} {'method':<7} {'put GB/s':>8} {'p50':>6} {'p99':>6} "
          f"{'get GB/s':>8} {'p50':>6} {'p99':>6} {'lo':>5}  path", file=o)
    short = {v: k for k, v in METHODS.items()}
    for r in doc["results"]:
        m = short.get(r.get("method", ""), r.get("method", ""))
        if r["status"] != "ok":
            print(f"  {r['system']:<20} {r.get('shape', ''):<10} {r['status']}: {r.get('reason')}",
                  file=o)
        elif "put_gbps" in r:
            us = {k: (r[k] / 1e3 if r.get(k) is not None else None) for k in
                  ("put_p50_us", "put_p99_us", "get_p50_us", "get_p99_us")}
            print(f"  {r['system']:<20} {r['shape']:<10} {m[:7]:<7} {f(r['put_gbps'], 8)} "
                  f"{f(us['put_p50_us'], 6)} {f(us['put_p99_us'], 6)} {f(r['get_gbps'], 8)} "
                  f"{f(us['get_p50_us'], 6)} {f(us['get_p99_us'], 6)} "
                  f"{f(r.get('lo_bytes_per_byte'), 5)}  {r.get('path', '')}", file=o)
    print("  small ops:", file=o)
    for r in doc["results"]:
        if r["status"] == "ok" and r.get("method") == "batch_is_exist":
            print(f"  {r['system']:<20} batch_is_exist x{EXIST_KEYS}: p50 {r['p50_us']:.0f} us, "
                  f"p99 {r['p99_us']:.0f} us", file=o)
        elif r["status"] == "ok" and r.get("method") == "put/get":
            print(f"  {r['system']:<20} 4 KiB put {r['put_ops_s']:>6} ops/s (p50 {r['put_p50_us']:.0f}"
                  f" us, p99 {r['put_p99_us']:.0f})  get {r['get_ops_s']:>6} ops/s (p50 "
                  f"{r['get_p50_us']:.0f} us, p99 {r['get_p99_us']:.0f})", file=o)
    print("  ratios:", file=o)
    for r in doc["ratios"]:
        v = "-" if r["value"] is None else f"{r['value']:.2f}"
        got = [x for x in r.get("passes", []) if x is not None]
        if len(got) > 1:
            v += f" [{min(got):.2f}..{max(got):.2f}]"
        t = ("" if "target" not in r else
             f"  (target {r['target']}: {'n/a' if r['met'] is None else 'met' if r['met'] else 'MISS'})")
        print(f"  {r['ratio']:<58} {r['shape']:<10} {short.get(r['method'], r['method'])[:14]:<14} "
              f"{r['op']:<5} {v:>18}{t}", file=o)
    print(f"  elapsed {doc['elapsed_s']} s", file=o)


if __name__ == "__main__":
    sys.exit(main())
