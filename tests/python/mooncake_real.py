"""Runs mooncake_workload.run against the REAL Mooncake wheel (mooncake-transfer-engine-non-cuda).

Mooncake's transfer engine listens on every interface, so everything runs inside private
network + pid namespaces (the pid namespace makes every process in it die with it):

    unshare -n -p -f --kill-child sh -c 'ip link set lo up && exec VENV/bin/python \
        tests/python/mooncake_real.py OUT.json'

``run_real_mooncake_workload(timeout_s)`` does that launch and returns ``(records, "")``,
or ``(None, reason)`` when the wheel's venv or ``unshare`` is unusable. Run as a script
(inside the namespace) it starts ``mooncake_master`` on 127.0.0.1 at free ports, sets up
an embedded store (256 MiB segment, 64 MiB local buffer, tcp, P2PHANDSHAKE), runs the
workload, writes the records to OUT.json and stops the master.

Venv: $KVPOOL_MOONCAKE_VENV or ~/.cache/kvpool/venv; Debian needs libibverbs1
(pulls ibverbs-providers, libnl-3-200, libnl-route-3-200), libnuma1 and libcurl4.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from kvpool_procs import free_ports, wait_listening  # noqa: E402

VENV = Path(os.environ.get("KVPOOL_MOONCAKE_VENV", Path.home() / ".cache/kvpool/venv"))
LEASE_TTL_MS = 30000  # well above the workload's ~1 s; see mooncake_workload's contract


def _alarm(signum: int, frame: Any) -> None:
    raise TimeoutError("workload deadline passed")


def main(out_path: str, timeout_s: float = 50.0) -> int:
    """Inside the namespace: master + embedded store + workload -> OUT.json."""
    import numpy as np
    import mooncake
    from mooncake.store import MooncakeDistributedStore

    import mooncake_workload

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(int(timeout_s))
    rpc_port, metrics_port = free_ports(2)
    master_bin = Path(mooncake.__file__).parent / "mooncake_master"
    log = tempfile.NamedTemporaryFile(prefix="mooncake_master.", suffix=".log", delete=False)
    master = subprocess.Popen(
        [str(master_bin), "--rpc_address=127.0.0.1", f"--rpc_port={rpc_port}",
         "--metrics_host=127.0.0.1", f"--metrics_port={metrics_port}",
         f"--default_kv_lease_ttl={LEASE_TTL_MS}", "--enable_metric_reporting=false",
         "--logtostderr"],
        stdout=log, stderr=subprocess.STDOUT)
    ok = False
    try:
        wait_listening(rpc_port, master, time.monotonic() + 10, "mooncake_master")
        store = MooncakeDistributedStore()
        rc = store.setup("127.0.0.1", "P2PHANDSHAKE", 256 << 20, 64 << 20, "tcp", "",
                         f"127.0.0.1:{rpc_port}")
        if rc != 0:
            raise RuntimeError(f"setup returned {rc}; master log: {log.name}")
        ptr_buf = np.zeros(8 << 20, dtype=np.uint8)
        records = mooncake_workload.run(store, ptr_buf)
        store.close()
        Path(out_path).write_text(json.dumps(records, indent=1) + "\n")
        ok = True
        return 0
    finally:
        signal.alarm(0)
        master.terminate()
        try:
            master.wait(5)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()
        log.close()
        if ok:
            os.unlink(log.name)
        else:
            print(f"mooncake_master log kept at {log.name}", file=sys.stderr)


def _unshare_prefix() -> Optional[list[str]]:
    """The first unshare form that gives a private network namespace here, or None."""
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


def run_real_mooncake_workload(timeout_s: float = 60.0) -> tuple[Optional[list[Any]], str]:
    """(records, "") from the real Mooncake, or (None, why it could not run)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return None, f"no Mooncake venv at {VENV}"
    probe = subprocess.run([str(python), "-c", "import numpy, mooncake.store"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"mooncake.store does not import in {VENV}: {last}"
    prefix = _unshare_prefix()
    if prefix is None:
        return None, "no private network namespace (unshare -n / -rn failed)"
    with tempfile.TemporaryDirectory(prefix="mooncake_real.") as tmp:
        out = Path(tmp) / "records.json"
        script = 'ip link set lo up && exec "$0" "$1" "$2" "$3"'
        cmd = [*prefix, "sh", "-c", script, str(python), str(Path(__file__).resolve()),
               str(out), str(max(5, int(timeout_s) - 5))]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"real Mooncake workload took over {timeout_s} s"
        if r.returncode != 0 or not out.exists():
            tail = (r.stdout + r.stderr).strip().splitlines()[-5:]
            return None, f"real Mooncake run failed (rc {r.returncode}): " + " | ".join(tail)
        return json.loads(out.read_text()), ""


if __name__ == "__main__":
    if len(sys.argv) == 1:  # outside the namespace: launch ourselves, print the records
        recs, why = run_real_mooncake_workload()
        print(json.dumps(recs, indent=1) if recs is not None else f"SKIP: {why}")
        sys.exit(0 if recs is not None else 1)
    sys.exit(main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 50.0))
