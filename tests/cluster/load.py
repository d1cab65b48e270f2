"""The verifying client load of the cluster tests, run as a process on a
client host (python load.py CONFIG_JSON PREFIX [OPTIONS_JSON]), driven over
stdin/stdout: one command per line in, one JSON line out per command.

Two threads share one kvpool.Client, as an engine's threads do: a putter
(new keys PREFIX-0, PREFIX-1, ...) and a getter (keys whose put succeeded:
mostly the latest ones, some picked among all). A value's size and bytes
derive from its key (value_of), so every byte a get returns is checked.
Every call is recorded as [t_start, t_end, op, key, result], times on
CLOCK_MONOTONIC (one clock for every namespace of the machine), result one
of "ok", "wrong" (the call succeeded with bytes other than the key's),
"E:NAME" (a kvpool.Error: the failure reported to the caller) or
"X:TYPE: message" (any other exception: a failure reported wrongly).

With OPTIONS {"big": {"size": BYTES, "segment": NAME}} a third thread cycles
through big values (keys PREFIX-big-J, placed on segment NAME when it can):
put, where it went (result: the segments' names), get (every byte
compared), remove -- ops "bigput", "bigwhere", "bigget", "bigrm" --
so that a test can kill a node while a transfer to or from it runs.

Commands:
  inflight    {"inflight": [[op, t_start], ...]}
  events N    the records from index N on: {"n": total, "events": [...],
              "inflight": [[op, t_start], ...] (calls not returned yet)}
  pause       stop issuing calls; answers once both threads are idle
  resume      issue calls again
  verify      (paused) get every key whose put succeeded and every key whose
              put failed, in batches: {"acked": [[key, t_ack, result], ...],
              "failed": [[key, t_fail, result], ...]}; a call that fails other
              than OBJECT_NOT_FOUND is retried for up to 5 s
  quit        close the client and exit
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))
import kvpool  # noqa: E402

MIN_SIZE, MAX_SIZE = 512, 16384
PUT_RATE = 120.0  # calls per second per thread, at most
GET_RATE = 150.0
RECENT = 48       # the getter picks among the latest RECENT keys 3 times in 4


def value_of(key: str, size: int = 0) -> bytes:
    """The value of key: size bytes (default: 512..16384, from the key's hash)."""
    if not size:
        h = hashlib.blake2b(key.encode(), digest_size=8).digest()
        size = MIN_SIZE + int.from_bytes(h, "little") % (MAX_SIZE - MIN_SIZE + 1)
    return hashlib.shake_128(key.encode()).digest(size)


def result_of(exc: BaseException) -> str:
    if isinstance(exc, kvpool.Error):
        return f"E:{exc.name}"
    return f"X:{type(exc).__name__}: {exc}"


class Load:
    def __init__(self, client: kvpool.Client, prefix: str, options: dict) -> None:
        self.c = client
        self.prefix = prefix
        self.mu = threading.Lock()
        self.events: list[list] = []
        self.acked: list[tuple[str, float]] = []
        self.failed: list[tuple[str, float]] = []
        self.inflight: dict[str, tuple[str, float]] = {}
        self.running = threading.Event()
        self.idle = {"put": threading.Event(), "get": threading.Event()}
        self.big = options.get("big")
        self.stop = False
        self.rng = random.Random(prefix)
        self.threads = [threading.Thread(target=self.putter, daemon=True),
                        threading.Thread(target=self.getter, daemon=True)]
        if self.big:
            self.idle["big"] = threading.Event()
            self.threads.append(threading.Thread(target=self.bigger, daemon=True))

    def record(self, t0: float, op: str, key: str, res: str) -> float:
        t1 = time.monotonic()
        with self.mu:
            self.events.append([round(t0, 4), round(t1, 4), op, key, res])
            self.inflight.pop(op, None)
        return t1

    def call(self, op: str, key: str, fn) -> str:
        """fn() as the call op on key, recorded; its result."""
        t0 = time.monotonic()
        with self.mu:
            self.inflight[op] = (key, t0)
        try:
            res = fn()
        except BaseException as e:  # noqa: BLE001 -- every kind is recorded
            res = result_of(e)
        self.record(t0, op, key, res)
        return res

    def pace(self, op: str, t0: float, rate: float) -> bool:
        """Waits out the rest of this call's slot, or while paused; False to stop."""
        left = 1.0 / rate - (time.monotonic() - t0)
        if left > 0:
            time.sleep(left)
        while not self.running.is_set():
            self.idle[op].set()
            if self.stop:
                return False
            self.running.wait(0.05)
        self.idle[op].clear()
        return not self.stop

    def putter(self) -> None:
        i = 0
        while self.pace("put", 0.0, PUT_RATE):
            key = f"{self.prefix}-{i}"
            i += 1
            v = value_of(key)
            t0 = time.monotonic()
            res = self.call("put", key, lambda: self.c.put(key, v) or "ok")
            t1 = time.monotonic()
            with self.mu:
                (self.acked if res == "ok" else self.failed).append((key, t1))
            self.pace("put", t0, PUT_RATE)

    def pick(self) -> str | None:
        with self.mu:
            n = len(self.acked)
            if n == 0:
                return None
            if self.rng.random() < 0.75:
                return self.acked[n - 1 - self.rng.randrange(min(n, RECENT))][0]
            return self.acked[self.rng.randrange(n)][0]

    def getter(self) -> None:
        while self.pace("get", 0.0, GET_RATE):
            key = self.pick()
            if key is None:
                time.sleep(0.01)
                continue
            t0 = time.monotonic()
            self.call("get", key, lambda: "ok" if self.c.get(key) == value_of(key) else "wrong")
            self.pace("get", t0, GET_RATE)

    def bigger(self) -> None:
        size, seg = int(self.big["size"]), self.big.get("segment")
        j = 0
        while self.pace("big", 0.0, 1000.0):
            key = f"{self.prefix}-big-{j}"
            j += 1
            v = value_of(key, size)
            if self.call("bigput", key,
                         lambda: self.c.put(key, v, preferred_segment=seg) or "ok") != "ok":
                time.sleep(0.05)
                continue
            self.call("bigwhere", key, lambda: ",".join(
                r["name"] for r in self.c.describe(key)["replicas"]))
            self.call("bigget", key, lambda: "ok" if self.c.get(key) == v else "wrong")
            self.call("bigrm", key, lambda: self.c.remove(key, force=True) or "ok")

    def check_batch(self, keys: list[str]) -> list[str]:
        """Each key's verification result (see verify)."""
        out: dict[str, str] = {}
        unread = list(keys)
        deadline = time.monotonic() + 5.0
        while unread:
            try:
                got = self.c.get_batch(unread)
            except BaseException as e:  # noqa: BLE001
                got = [e] * len(unread)
            again = []
            for k, g in zip(unread, got):
                if isinstance(g, (bytes, bytearray)):
                    out[k] = "ok" if bytes(g) == value_of(k) else "wrong"
                elif isinstance(g, kvpool.ObjectNotFoundError):
                    out[k] = result_of(g)
                else:
                    out[k] = result_of(g)
                    again.append(k)
            if not again or time.monotonic() > deadline:
                break
            unread = again
            time.sleep(0.2)
        return [out[k] for k in keys]

    def verify(self) -> dict:
        with self.mu:
            acked, failed = list(self.acked), list(self.failed)
        res: dict[str, list] = {"acked": [], "failed": []}
        for name, lst in (("acked", acked), ("failed", failed)):
            for i in range(0, len(lst), 64):
                part = lst[i:i + 64]
                for (k, t), r in zip(part, self.check_batch([k for k, _ in part])):
                    res[name].append([k, round(t, 4), r])
        return res

    def command(self, line: str) -> dict:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "inflight":
            with self.mu:
                return {"inflight": [[op, t0] for op, (_, t0) in self.inflight.items()]}
        if cmd == "events":
            with self.mu:
                n = int(arg or 0)
                return {"n": len(self.events), "events": self.events[n:],
                        "inflight": [[op, t0] for op, (_, t0) in self.inflight.items()]}
        if cmd == "pause":
            self.running.clear()
            deadline = time.monotonic() + 60
            for e in self.idle.values():
                if not e.wait(max(0.0, deadline - time.monotonic())):
                    return {"error": "a call did not return within 60 s"}
            return {"ok": True}
        if cmd == "resume":
            self.running.set()
            return {"ok": True}
        if cmd == "verify":
            return self.verify()
        return {"error": f"unknown command {cmd!r}"}


def main() -> int:
    config, prefix = json.loads(sys.argv[1]), sys.argv[2]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    deadline = time.monotonic() + 30
    while True:
        try:
            client = kvpool.Client(config)
            break
        except kvpool.Error as e:
            if time.monotonic() > deadline:
                print(json.dumps({"error": f"cannot open a client: {e}"}), flush=True)
                return 1
            time.sleep(0.2)
    load = Load(client, prefix, options)
    for t in load.threads:
        t.start()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        print(json.dumps(load.command(line)), flush=True)
    load.stop = True
    load.running.set()
    for t in load.threads:
        t.join(timeout=30)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
