#!/usr/bin/env python3
"""bench/hostile.py -- the hostile run.

Starts a real `kvpool serve` (master + storage node in one process) on free
loopback ports, plus a rank-0 connector worker serving a lookup socket, and
attacks, one target after the other, the master, the node's segment server
and the lookup socket for --seconds each (default 60) with every attack that
applies, concurrently, from several processes speaking the wire protocol
with raw sockets (struct, little-endian; src/proto/proto.h, proto.c; the
lookup channel: src/connector/lookup.h, big-endian).

While a target is attacked, a victim process keeps working and verifies
every byte: for the master and the node a kvpool.Client put/get loop over TCP
(values of 64 KiB .. 1 MiB of known content, every get compared with what was
put; kvpool also checks its XXH3 checksum), for the lookup socket a ConnSched
whose lookups must find the prefix the worker stored (the expected hit).
Per target: the victim's ops, success rate and p50/p99/max latency in a quiet
baseline (--baseline, default 10 s), during the attack and in a short
recovery window after it; wrong bytes (must be 0); serve's RSS (VmRSS,
RssAnon, RssShmem), open fds and CPU time before / at the end of / after the
attack; whether serve is alive; the attack volume (connections, bytes) and
what each attack saw (refusals, closes, forged descriptors accepted: must be 0).

    bench/hostile.py [--seconds 60] [--baseline 10] [--flood 2000] [--out FILE]
                     [--targets master,node,lookup] [--kvpool build/kvpool]

Targets beyond the default: http-slow (slow headers at the HTTP endpoint;
/healthz and /metrics probed: *_ok / *_failed / *_max_ms) and kvev (64 MiB
subscriptions and replay clients that never read at the KV events' sockets;
serve's RSS against the replay ring's budget, 256 MiB).
Target followers (never-reading standbys of a master holding many
long keys; see FOLLOWERS_SERVE_ARGS).

Run it with the venv's Python (scripts/python-env) after `make all python`.
Exit status 1 if serve died, a wrong byte was seen, a forged / stale
descriptor, a refusable HELLO or a MOUNT/UNMOUNT without the node credential
was accepted, or an attack could not do the genuine operations it builds on
(an attacker failed, no real descriptor: the protocol changed under it).
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import multiprocessing as mp
import os
import random
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

# ------------------------------------------------------------------ protocol

MAGIC, VERSION, HDR = 0x4B56, 4, 24  # KVP_PROTO_VERSION (src/proto/proto.h)
F_RESPONSE, F_ONEWAY = 0x01, 0x02
OP = {n: i for i, n in enumerate(
    "_ HELLO MOUNT_SEGMENT UNMOUNT_SEGMENT HEARTBEAT PUT_START PUT_END PUT_REVOKE GET RELEASE "
    "EXIST PREFIX REMOVE REMOVE_ALL STATS SEGMENT_INFO SEG_WRITE SEG_READ SHM_ATTACH "
    "REMOVE_REGEX SEG_FREED REPLICA_BAD SEG_FAILING".split())}
OP["AUTH_CHALLENGE"] = 35
ACCESS_READ, ACCESS_WRITE = 1, 2
SEG_IO = 56
_rid = [random.getrandbits(32) << 16]


def hdr(op: int, body_len: int, req_id: Optional[int] = None, flags: int = 0, status: int = 0,
        magic: int = MAGIC, version: int = VERSION) -> bytes:
    """The 24-byte frame header: u16 magic, u8 version, u8 flags, u16 op,
    u16 reserved, u64 req_id, u32 body_len, i32 status."""
    if req_id is None:
        _rid[0] += 1
        req_id = _rid[0]
    return struct.pack("<HBBHHQIi", magic, version, flags, op, 0, req_id & (2**64 - 1),
                       body_len & 0xFFFFFFFF, status)


def frame(op: int, body: bytes = b"", **kw: Any) -> bytes:
    return hdr(op, len(body), **kw) + body


def b_(x: bytes) -> bytes:
    """bytes = u32 length + raw bytes."""
    return struct.pack("<I", len(x)) + x


# The HELLO handshake (the repository's proto/auth.h): AUTH_CHALLENGE with a
# client nonce, the credentials held (bits: cluster, node, tenant, session)
# and the tenant token's key id; the answer's server nonce and id make the
# transcript every proof is an HMAC-SHA256 over.
AUTH_NONCE, AUTH_PROOF = 32, 32


class AuthTx:
    """One connection's handshake transcript."""

    def __init__(self, creds: list[bytes]) -> None:
        self.cn = os.urandom(AUTH_NONCE)
        self.sn = b"\0" * AUTH_NONCE
        self.sid = 0
        self.has = sum(1 << i for i, k in enumerate(creds) if k)
        self.kid = hashlib.sha256(b"kvpool-kid" + creds[2]).digest()[:8] if creds[2] else b""

    def msg(self, label: bytes, cred: int) -> bytes:
        return (label + bytes([cred]) + b"kvpool-auth-v1" + self.cn + self.sn
                + struct.pack("<QB", self.sid, self.has) + (self.kid or b"\0" * 8))

    def client_proof(self, cred: int, cid: int, key: bytes) -> bytes:
        return hmac.new(key, self.msg(b"kvpool-client", cred) + struct.pack("<Q", cid),
                        hashlib.sha256).digest()


def challenge_body(t: AuthTx) -> bytes:
    """kvp_enc_challenge: u32 version, nonce, u8 has, kid (bytes)."""
    return struct.pack("<I", VERSION) + b_(t.cn) + bytes([t.has]) + b_(t.kid)


def take_challenge(t: AuthTx, body: bytes) -> None:
    """The answer (nonce, u64 server id, 3 proofs): into the transcript."""
    (n,) = struct.unpack_from("<I", body, 0)
    t.sn = body[4:4 + n]
    (t.sid,) = struct.unpack_from("<Q", body, 4 + n)


def hello_body(token: bytes, client_id: Optional[int] = None, name: bytes = b"hostile",
               node_cred: bytes = b"", tenant_cred: bytes = b"", session: bytes = b"",
               version: int = VERSION, tx: Optional[AuthTx] = None) -> bytes:
    """kvp_enc_hello: u32 version, u64 client_id, name, then one proof
    (bytes: 32 or empty) per credential held: cluster token, node
    credential, tenant credential, session secret. With tx (the challenge
    answered on this connection) the proofs are real; without, made up (a
    HELLO that proves nothing). A session of another length than 16 is sent
    as it is (a malformed proof)."""
    cid = random.getrandbits(63) | 1 if client_id is None else client_id
    out = struct.pack("<IQ", version, cid) + b_(name)
    for i, k in enumerate((token, node_cred, tenant_cred, session)):
        if not k:
            out += b_(b"")
        elif i == 3 and len(k) != 16:
            out += b_(k)
        else:
            out += b_(tx.client_proof(i, cid, k) if tx else hashlib.sha256(k).digest())
    return out


def sock_hello(s: socket.socket, token: bytes, **kw: Any) -> bytes:
    """AUTH_CHALLENGE on a raw socket (blocking): the HELLO frame proving
    token (and kw's credentials) on this connection, to send when the
    caller likes. ConnectionError when the challenge is refused."""
    creds = [token, kw.get("node_cred", b""), kw.get("tenant_cred", b""), kw.get("session", b"")]
    t = AuthTx(creds)
    s.sendall(frame(OP["AUTH_CHALLENGE"], challenge_body(t)))
    h = recv_exact(s, HDR)
    _m, _v, _f, _op, _r, _rid, blen, st = struct.unpack("<HBBHHQIi", h)
    body = recv_exact(s, blen) if blen else b""
    if st != 0:
        raise ConnectionError(f"AUTH_CHALLENGE refused: {st}")
    take_challenge(t, body)
    return frame(OP["HELLO"], hello_body(token, tx=t, **kw))


def keys_body(keys: list[bytes], tenant: bytes = b"") -> bytes:
    """kvp_enc_keys: tenant, u32 n, n x key (GET, EXIST, PREFIX, PUT_REVOKE)."""
    return b_(tenant) + struct.pack("<I", len(keys)) + b"".join(b_(k) for k in keys)


def remove_body(keys: list[bytes], force: bool = True, tenant: bytes = b"") -> bytes:
    return b_(tenant) + bytes([1 if force else 0]) + struct.pack("<I", len(keys)) + \
        b"".join(b_(k) for k in keys)


def put_start_body(keys: list[bytes], sizes: list[int], replicas: int = 1,
                   tenant: bytes = b"") -> bytes:
    """kvp_enc_put_start: tenant, u32 replicas, u32 flags, u64 soft_ttl_ms,
    preferred, u32 n, n x (key, u64 size)."""
    return (b_(tenant) + struct.pack("<IIQ", replicas, 0, 0) + b_(b"") + struct.pack("<I", len(keys))
            + b"".join(b_(k) + struct.pack("<Q", s) for k, s in zip(keys, sizes)))


def mount_body(seg_id: int, name: bytes, capacity: int, endpoint: bytes) -> bytes:
    """kvp_enc_mount: u32 n, per segment: u64 id, name, u64 capacity,
    u32 n_endpoints, (transport, addr)..., u64 secret, u32 epoch,
    u64 disk_capacity."""
    return (struct.pack("<I", 1) + struct.pack("<Q", seg_id) + b_(name)
            + struct.pack("<QI", capacity, 1) + b_(b"tcp") + b_(endpoint)
            + struct.pack("<QIQ", random.getrandbits(64), 1, 0))


class Desc:
    """A replica descriptor (kvp_seg_io, 56 bytes): u64 segment_id, offset,
    length, generation, expires_ms, u32 access, u32 reserved (0), u64 tag."""
    FMT = "<QQQQQIIQ"

    def __init__(self, seg: int, off: int, length: int, gen: int, exp: int, access: int,
                 tag: int) -> None:
        self.seg, self.off, self.length, self.gen, self.exp = seg, off, length, gen, exp
        self.access, self.tag = access, tag

    @classmethod
    def parse(cls, b: bytes, at: int) -> "Desc":
        f = struct.unpack_from(cls.FMT, b, at)
        return cls(f[0], f[1], f[2], f[3], f[4], f[5], f[7])

    def enc(self) -> bytes:
        return struct.pack(self.FMT, self.seg, self.off, self.length, self.gen, self.exp,
                           self.access, 0, self.tag)

    def but(self, **kw: int) -> "Desc":
        d = Desc(self.seg, self.off, self.length, self.gen, self.exp, self.access, self.tag)
        for k, v in kw.items():
            setattr(d, k, v & (2**64 - 1))
        return d


def parse_replicas(b: bytes, at: int) -> tuple[list[Desc], int]:
    (n,) = struct.unpack_from("<I", b, at)
    at += 4
    out = []
    for _ in range(n):
        out.append(Desc.parse(b, at))
        at += SEG_IO
    return out, at


def parse_get_resp(b: bytes) -> list[tuple[int, int, list[Desc]]]:
    """kvp_dec_get_resp: u32 lease_ttl, u32 n, per key i32 status and, when
    0, u64 size, u64 checksum, u64 lease_id, replicas. (status, size, reps)."""
    _, n = struct.unpack_from("<II", b, 0)
    at, out = 8, []
    for _ in range(n):
        (st,) = struct.unpack_from("<i", b, at)
        at += 4
        if st != 0:
            out.append((st, 0, []))
            continue
        size, _ck, _lease = struct.unpack_from("<QQQ", b, at)
        at += 24
        reps, at = parse_replicas(b, at)
        out.append((st, size, reps))
    return out


def parse_put_start_resp(b: bytes) -> list[tuple[int, list[Desc]]]:
    (n,) = struct.unpack_from("<I", b, 0)
    at, out = 4, []
    for _ in range(n):
        (st,) = struct.unpack_from("<i", b, at)
        at += 4
        reps: list[Desc] = []
        if st == 0:
            reps, at = parse_replicas(b, at)
        out.append((st, reps))
    return out


def parse_results(b: bytes) -> list[int]:
    (n,) = struct.unpack_from("<I", b, 0)
    return list(struct.unpack_from(f"<{n}i", b, 4))


def parse_stats_segs(b: bytes) -> list[tuple[int, bytes]]:
    """kvp_dec_stats_resp: u32 n_counters, counters, u32 n_segs, per segment
    u64 id, name, u64 capacity, used, objects, largest_free."""
    (nc,) = struct.unpack_from("<I", b, 0)
    at = 4 + 8 * nc
    (ns,) = struct.unpack_from("<I", b, at)
    at += 4
    out = []
    for _ in range(ns):
        (sid,) = struct.unpack_from("<Q", b, at)
        (ln,) = struct.unpack_from("<I", b, at + 8)
        name = b[at + 12:at + 12 + ln]
        at += 12 + ln + 32
        out.append((sid, name))
    return out


def recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        d = s.recv(n - len(buf))
        if not d:
            raise ConnectionError("closed by peer")
        buf += d
    return bytes(buf)


class Raw:
    """One raw protocol connection (TCP), blocking with a timeout."""

    def __init__(self, addr: tuple[str, int], timeout: float = 5.0, src: str = "") -> None:
        self.s = socket.create_connection(addr, timeout=timeout,
                                          source_address=(src, 0) if src else None)
        self.sent = 0

    def send(self, data: bytes) -> None:
        self.s.sendall(data)
        self.sent += len(data)

    def recv_frame(self) -> tuple[int, int, bytes]:
        """(op, status, body) of the next frame."""
        h = recv_exact(self.s, HDR)
        magic, _v, _f, op, _r, _rid, blen, st = struct.unpack("<HBBHHQIi", h)
        if magic != MAGIC:
            raise ConnectionError("bad magic in answer")
        return op, st, recv_exact(self.s, blen) if blen else b""

    def call(self, op: int, body: bytes = b"") -> tuple[int, bytes]:
        self.send(frame(op, body))
        while True:
            rop, st, b = self.recv_frame()
            if rop == op:
                return st, b
            # unsolicited frames (none expected on a client connection): skip

    def challenge(self, token: bytes, **kw: Any) -> tuple[int, Optional[AuthTx]]:
        """AUTH_CHALLENGE announcing token and kw's credentials: (status,
        the transcript to prove over)."""
        t = AuthTx([token, kw.get("node_cred", b""), kw.get("tenant_cred", b""),
                    kw.get("session", b"")])
        st, b = self.call(OP["AUTH_CHALLENGE"], challenge_body(t))
        if st != 0:
            return st, None
        take_challenge(t, b)
        return 0, t

    def hello(self, token: bytes, **kw: Any) -> int:
        """The whole handshake, proving token (and kw's credentials)."""
        st, t = self.challenge(token, **kw)
        if st != 0:
            return st
        st, _ = self.call(OP["HELLO"], hello_body(token, tx=t, **kw))
        return st

    def close(self) -> None:
        try:
            self.s.close()
        except OSError:
            pass


# --------------------------------------------------------------- attackers

class Ctx:
    """What the attackers know: addresses, the cluster token, the node's
    segment id, loopback source addresses for the floods."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def tcp_connect(addr: Any, src: str = "", timeout: float = 3.0) -> socket.socket:
    return socket.create_connection(addr, timeout=timeout,
                                    source_address=(src, 0) if src else None)


def unix_connect(path: str, timeout: float = 3.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


class Pool:
    """Connections an attacker holds; closed-by-peer ones are noticed with
    poll (without reading) and dropped, counted."""

    def __init__(self, st: dict[str, int]) -> None:
        self.conns: dict[int, tuple[socket.socket, Any]] = {}
        self.st = st
        self.poll = select.poll()

    def add(self, s: socket.socket, state: Any = None) -> None:
        s.setblocking(False)
        self.conns[s.fileno()] = (s, state)
        self.poll.register(s.fileno(), select.POLLRDHUP | select.POLLHUP | select.POLLERR)

    def reap(self, timeout_ms: int = 0) -> int:
        """Drops connections the peer closed (or reset); how many."""
        n = 0
        for fd, ev in self.poll.poll(timeout_ms):
            s, _ = self.conns.pop(fd, (None, None))
            if s is None:
                continue
            self.poll.unregister(fd)
            s.close()
            n += 1
        self.st["closed_by_peer"] = self.st.get("closed_by_peer", 0) + n
        return n

    def drop(self, s: socket.socket) -> None:
        fd = s.fileno()
        if fd in self.conns:
            self.poll.unregister(fd)
            del self.conns[fd]
        s.close()

    def send_nb(self, s: socket.socket, data: bytes) -> int:
        """Non-blocking send of what fits; bytes sent (0: full or closed)."""
        try:
            n = s.send(data)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            self.drop(s)
            return 0
        self.st["bytes_sent"] += n
        return n

    def close_all(self) -> None:
        for s, _ in list(self.conns.values()):
            s.close()
        self.conns.clear()


def bump(st: dict[str, int], k: str, n: int = 1) -> None:
    st[k] = st.get(k, 0) + n


def outcome(st: dict[str, int], prefix: str, r: Raw, data: bytes, timeout: float = 1.0) -> None:
    """Sends data on r and records what came back: an error status (by
    code), an answer, a close, or silence."""
    try:
        r.send(data)
        st["bytes_sent"] += len(data)
        r.s.settimeout(timeout)
        _op, code, _ = r.recv_frame()
        bump(st, f"{prefix}_status_{code}")
    except socket.timeout:
        bump(st, f"{prefix}_no_answer")
    except OSError:
        bump(st, f"{prefix}_closed")
    except ConnectionError:
        bump(st, f"{prefix}_closed")


# Each attack: fn(ctx, target, deadline, st) for target "master" / "node" /
# "lookup"; st counts connections ("conns"), "bytes_sent" and outcomes.

def atk_garbage(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """Random bytes on fresh connections: pure noise, noise after a valid
    magic, a valid header of an unknown opcode, a bad version, a request with
    a status; for the lookup socket random frames and unknown tags."""
    rnd = random.Random(os.getpid())
    i = 0
    while time.monotonic() < deadline:
        i += 1
        try:
            if target == "lookup":
                s = unix_connect(ctx.lookup_sock, 1.0)
                k = i % 4
                if k == 0:
                    data = rnd.randbytes(rnd.randint(1, 8192))
                elif k == 1:  # unknown tag, well framed: answered 'E'
                    body = bytes([rnd.choice(b"ZQXA\x00\xff")]) + rnd.randbytes(rnd.randint(0, 64))
                    data = struct.pack(">I", len(body)) + body
                elif k == 2:  # a lookup with a bad hash_len / trailing bytes
                    body = b"L" + struct.pack(">IH", 64, 999) + rnd.randbytes(100) + b"\x07"
                    data = struct.pack(">I", len(body)) + body
                else:  # apply_eagle not 0/1
                    body = b"L" + struct.pack(">IH", 64, 32) + rnd.randbytes(32) + b"\x05"
                    data = struct.pack(">I", len(body)) + body
            else:
                s = tcp_connect(ctx.addr[target], rnd.choice(ctx.srcs), 1.0)
                k = i % 5
                n = rnd.randint(1, 65536)
                if k == 0:
                    data = rnd.randbytes(n)
                elif k == 1:
                    data = struct.pack("<H", MAGIC) + rnd.randbytes(n)
                elif k == 2:
                    data = frame(rnd.randint(23, 65535), rnd.randbytes(rnd.randint(0, 512)))
                elif k == 3:
                    data = frame(OP["HELLO"], hello_body(ctx.token), version=rnd.randint(2, 255))
                else:
                    data = frame(OP["HELLO"], hello_body(ctx.token), status=-1)
            st["conns"] += 1
            s.settimeout(0.5)
            try:
                s.sendall(data)
                st["bytes_sent"] += len(data)
                if s.recv(65536) == b"":
                    bump(st, "closed_by_peer")
                else:
                    bump(st, "answered")
            except socket.timeout:
                bump(st, "no_answer")
            except OSError:
                bump(st, "reset_by_peer")
            s.close()
        except OSError:
            bump(st, "connect_failed")
        time.sleep(0.004)


def atk_lying(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """Frames whose length lies: a huge body_len then a stall; body_len
    larger than what is sent (stall); smaller than the body (the rest read
    as the next frame); for the node SEG_WRITE whose body_len disagrees with
    the descriptor's length; after a valid HELLO a large frame begun and
    never finished. Up to 40 such connections held at a time."""
    rnd = random.Random(os.getpid() + 1)
    pool = Pool(st)
    i = 0
    hold = 40
    while time.monotonic() < deadline:
        pool.reap(0)
        while len(pool.conns) < hold and time.monotonic() < deadline:
            i += 1
            k = i % 6
            try:
                if target == "lookup":
                    s = unix_connect(ctx.lookup_sock, 1.0)
                    if k in (0, 1):
                        data = struct.pack(">I", 0xFFFFFFFF) + b"L"  # over the max: closed
                    elif k == 2:
                        data = struct.pack(">I", 16 << 20) + b"L" + rnd.randbytes(1000)  # stall
                    elif k == 3:
                        data = struct.pack(">I", 0)  # length 0
                    elif k == 4:  # body_len smaller than the lookup that follows
                        body = b"L" + struct.pack(">IH", 64, 32) + rnd.randbytes(64) + b"\x00"
                        data = struct.pack(">I", 5) + body
                    else:  # larger than sent, stall
                        body = b"L" + struct.pack(">IH", 64, 32) + rnd.randbytes(32) + b"\x00"
                        data = struct.pack(">I", len(body) + 100) + body
                else:
                    s = tcp_connect(ctx.addr[target], rnd.choice(ctx.srcs), 1.0)
                    hb = hello_body(ctx.token)
                    if k == 0:
                        data = hdr(OP["HELLO"], 0xFFFFFFFF) + hb
                    elif k == 1:
                        data = hdr(OP["HELLO"], 60000) + hb  # larger than sent: stall
                    elif k == 2:
                        data = hdr(OP["HELLO"], 10) + hb  # smaller: the rest is garbage
                    elif k == 3:  # authenticated, then a 60 MiB frame begun, 256 KiB sent
                        big = OP["GET"] if target == "master" else OP["SEG_WRITE"]
                        data = sock_hello(s, ctx.token) + hdr(big, 60 << 20) + \
                            rnd.randbytes(256 << 10)
                    elif k == 4 and target == "node":  # SEG_WRITE body_len != 56 + length
                        d = Desc(ctx.seg_id, 0, 4096, 1, 2**40, ACCESS_WRITE, rnd.getrandbits(64))
                        data = sock_hello(s, ctx.token) + hdr(OP["SEG_WRITE"], SEG_IO + 100) + \
                            d.enc() + rnd.randbytes(100)
                    else:  # authenticated, a request with body_len 1 GiB + header only
                        data = sock_hello(s, ctx.token) + hdr(OP["EXIST"], 1 << 30)
                st["conns"] += 1
                s.sendall(data)
                st["bytes_sent"] += len(data)
                pool.add(s)
            except OSError:
                bump(st, "connect_failed")
                break
        time.sleep(0.05)
    st["held_at_end"] = len(pool.conns)
    pool.close_all()


def atk_slowloris(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """50 connections each sending a frame one byte a second: a HELLO
    (header whole, body trickling), and on the TCP targets 10 more that say
    HELLO properly, then trickle a request. For the lookup socket: a lookup
    frame, one byte a second."""
    rnd = random.Random(os.getpid() + 2)
    pool = Pool(st)
    n_slow, n_auth = 50, 10

    def payload(auth: bool, s: socket.socket) -> tuple[bytes, bytes]:
        if target == "lookup":
            body = b"L" + struct.pack(">IH", 64, 32) + rnd.randbytes(64) + b"\x00"
            return b"", struct.pack(">I", len(body)) + body
        hb = hello_body(ctx.token)
        if auth:
            req = frame(OP["EXIST"], keys_body([b"slow-%d" % i for i in range(64)]))
            return sock_hello(s, ctx.token), req
        f = frame(OP["HELLO"], hb)
        return f[:HDR], f[HDR:]

    next_t = 0.0
    while time.monotonic() < deadline:
        pool.reap(0)
        want = n_slow + (0 if target == "lookup" else n_auth)
        while len(pool.conns) < want:
            auth = target != "lookup" and \
                sum(1 for _, v in pool.conns.values() if v[1]) < n_auth
            try:
                s = unix_connect(ctx.lookup_sock, 1.0) if target == "lookup" else \
                    tcp_connect(ctx.addr[target], rnd.choice(ctx.srcs), 1.0)
                first, rest = payload(auth, s)
                if first:
                    s.sendall(first)
                    st["bytes_sent"] += len(first)
                st["conns"] += 1
                pool.add(s, [bytearray(rest), auth])
            except OSError:
                bump(st, "connect_failed")
                break
        now = time.monotonic()
        if now >= next_t:
            next_t = now + 1.0
            for s, v in list(pool.conns.values()):
                rest = v[0]
                if not rest:
                    continue
                if pool.send_nb(s, bytes(rest[:1])):
                    del rest[:1]
                    if not rest:
                        bump(st, "frames_completed")
        time.sleep(0.05)
    st["held_at_end"] = len(pool.conns)
    pool.close_all()


def atk_flood(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """ctx.flood idle connections held open, spread over loopback source
    addresses (the per-address cap counts one address); on the TCP targets
    half of them say a valid HELLO first (authenticated idlers). Closed ones
    are reopened, at most 500 a second."""
    rnd = random.Random(os.getpid() + 3)
    pool = Pool(st)
    want = ctx.flood
    peak = 0
    while time.monotonic() < deadline:
        pool.reap(0)
        opened = 0
        while len(pool.conns) < want and opened < 50 and time.monotonic() < deadline:
            try:
                if target == "lookup":
                    s = unix_connect(ctx.lookup_sock, 1.0)
                else:
                    s = tcp_connect(ctx.addr[target], ctx.srcs[st["conns"] % len(ctx.srcs)], 1.0)
                    if st["conns"] % 2 == 0:
                        f = sock_hello(s, ctx.token)
                        s.sendall(f)
                        st["bytes_sent"] += len(f)
                st["conns"] += 1
                opened += 1
                pool.add(s)
            except OSError as e:
                bump(st, f"connect_failed_{getattr(e, 'errno', 0)}")
                break
        peak = max(peak, len(pool.conns))
        st["peak_held"] = peak
        # drain what the server answered (HELLO answers) without blocking
        for s, _ in list(pool.conns.values()):
            try:
                s.recv(4096)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                pool.drop(s)
                bump(st, "closed_by_peer")
        time.sleep(0.1)
    st["held_at_end"] = len(pool.conns)
    pool.close_all()


def atk_neverread(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """8 connections that say a valid HELLO, then pipeline valid requests as
    fast as the socket takes them and never read an answer: EXIST of 1,000
    keys and STATS at the master; SEG_READ of a real 1 MiB replica at the node
    (its descriptor refreshed by a GET every 2 s); lookups at the lookup
    socket."""
    rnd = random.Random(os.getpid() + 4)
    pool = Pool(st)
    nconn = 8
    reqs: list[bytes] = []
    desc_t = 0.0
    mc = None
    key = b"hostile-neverread-%d" % os.getpid()
    if target == "node":
        import kvpool
        cl = kvpool.Client(ctx.client_cfg)
        cl.put(key.decode(), rnd.randbytes(1 << 20))
    while time.monotonic() < deadline:
        if target == "node" and time.monotonic() >= desc_t:
            try:
                if mc is None:
                    mc = Raw(ctx.addr["master"])
                    mc.hello(ctx.token)
                stt, b = mc.call(OP["GET"], keys_body([key]))
                res = parse_get_resp(b) if stt == 0 else []
                if res and res[0][0] == 0:
                    reqs = [frame(OP["SEG_READ"], res[0][2][0].enc())] * 16
                    desc_t = time.monotonic() + 2.0
                    bump(st, "descriptors_fetched")
            except (OSError, ConnectionError, struct.error):
                mc = None
                bump(st, "master_get_failed")
                time.sleep(0.5)
                continue
        elif target == "master":
            reqs = [frame(OP["EXIST"], keys_body([b"nr-%d" % i for i in range(1000)])),
                    frame(OP["STATS"])]
        elif target == "lookup":
            body = b"L" + struct.pack(">IH", 64, 32) + rnd.randbytes(128) + b"\x00"
            reqs = [struct.pack(">I", len(body)) + body] * 8
        pool.reap(0)
        while len(pool.conns) < nconn:
            try:
                if target == "lookup":
                    s = unix_connect(ctx.lookup_sock, 1.0)
                else:
                    s = tcp_connect(ctx.addr[target], rnd.choice(ctx.srcs), 1.0)
                    f = sock_hello(s, ctx.token)
                    s.sendall(f)
                    st["bytes_sent"] += len(f)
                st["conns"] += 1
                pool.add(s, [b""])
            except OSError:
                bump(st, "connect_failed")
                break
        for s, v in list(pool.conns.values()):
            for _ in range(64):  # until the socket is full
                if not v[0]:
                    v[0] = b"".join(reqs)
                n = pool.send_nb(s, v[0])
                if n == 0:
                    break
                v[0] = v[0][n:]
                if not v[0]:
                    bump(st, "requests_sent", len(reqs))
        time.sleep(0.1)
    st["held_at_end"] = len(pool.conns)
    pool.close_all()


def atk_tokens(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """HELLOs that must be refused, one per connection: wrong cluster token,
    empty token, client id 0, a session of the wrong length, a forged session
    for a random client id; counts the answers by status (0 = accepted: a
    finding, except with no cluster token configured)."""
    rnd = random.Random(os.getpid() + 5)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        k = i % 5
        kw: dict[str, Any] = {}
        if k == 0:
            tok, what = rnd.randbytes(16).hex().encode(), "wrong_token"
        elif k == 1:
            tok, what = b"", "no_token"
        elif k == 2:
            tok, what, kw = ctx.token, "client_id_0", {"client_id": 0}
        elif k == 3:
            tok, what, kw = ctx.token, "bad_session_len", {"session": b"short"}
        else:
            tok, what, kw = ctx.token, "unknown_client_session", {"session": rnd.randbytes(16)}
        try:
            r = Raw(ctx.addr[target], 1.0, rnd.choice(ctx.srcs))
            st["conns"] += 1
            # the challenge first (the proofs cover its nonces), then the
            # HELLO whatever the server proved
            cst, t = r.challenge(tok, **{a: v for a, v in kw.items() if a == "session"})
            if cst != 0:
                bump(st, f"{what}_challenge_status_{cst}")
                r.close()
                continue
            outcome(st, what, r, frame(OP["HELLO"], hello_body(tok, tx=t, **kw)), 1.0)
            r.close()
        except (OSError, struct.error):
            bump(st, "connect_failed")
        time.sleep(0.01)
    # the accepted ones that must not be: wrong/no token, client id 0, bad session
    st["refusable_accepted"] = sum(v for k, v in st.items()
                                   if k.endswith("_status_0") and not k.startswith("unknown_client_session"))


def atk_mount(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """With the cluster token but without (or with a wrong) node credential:
    MOUNT_SEGMENT of a new segment pointing at us, MOUNT_SEGMENT reusing the
    real segment's id (a hijack), UNMOUNT_SEGMENT of the real segment.
    A per-key result of 0 is counted as accepted (must be 0)."""
    rnd = random.Random(os.getpid() + 6)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        try:
            r = Raw(ctx.addr["master"], 1.0, rnd.choice(ctx.srcs))
            st["conns"] += 1
            cred = b"" if i % 2 else rnd.randbytes(16).hex().encode()
            if r.hello(ctx.token, node_cred=cred) != 0:
                bump(st, "hello_refused")
                r.close()
                continue
            for what, op, body in (
                    ("mount_new", OP["MOUNT_SEGMENT"],
                     mount_body(rnd.getrandbits(63) | 1, b"127.0.0.1:%d" % rnd.randint(1, 65535),
                                1 << 30, b"127.0.0.1:9")),
                    ("mount_hijack", OP["MOUNT_SEGMENT"],
                     mount_body(ctx.seg_id, ctx.seg_name, 1 << 30, b"127.0.0.1:9")),
                    ("unmount_real", OP["UNMOUNT_SEGMENT"],
                     struct.pack("<IQ", 1, ctx.seg_id))):
                r.send(frame(op, body))
                st["bytes_sent"] += len(body) + HDR
                _op, code, b = r.recv_frame()
                if code == 0 and b:
                    codes = parse_results(b)
                    bump(st, f"{what}_result_{codes[0] if codes else 'none'}")
                    if codes and codes[0] == 0:
                        bump(st, "accepted")
                else:
                    bump(st, f"{what}_status_{code}")
            r.close()
        except (OSError, ConnectionError, struct.error):
            bump(st, "closed_or_failed")
        time.sleep(0.02)
    st.setdefault("accepted", 0)


def atk_descriptors(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """Stale and forged descriptors at the node. Per round: put an object
    (kvpool.Client), GET it over a raw master connection for a real READ
    descriptor, read it once (must work and match), then present it forged
    (tag bit flipped, offset / length / generation / expiry / segment
    changed, access changed to WRITE) for SEG_READ and SEG_WRITE, and the
    real READ descriptor for SEG_WRITE; REMOVE the object and read with the
    stale descriptor; PUT_START another key for a WRITE descriptor, write it
    once (must work), PUT_REVOKE it and write with the stale one, read with
    it. Any of these accepted (status 0) is counted in `accepted` (must be
    0); `valid_ok` counts the genuine reads / writes that worked."""
    import kvpool
    rnd = random.Random(os.getpid() + 7)
    cl = kvpool.Client(ctx.client_cfg)
    mc: Optional[Raw] = None
    nc: Optional[Raw] = None
    rounds = 0
    size = 64 << 10

    def node() -> Raw:
        nonlocal nc
        if nc is None:
            nc = Raw(ctx.addr["node"], 2.0)
            st["conns"] += 1
            if nc.hello(ctx.token) != 0:
                bump(st, "node_hello_refused")
        return nc

    def try_op(what: str, op: int, d: Desc, data: bytes = b"", must_fail: bool = True,
               want: Optional[bytes] = None) -> None:
        nonlocal nc
        try:
            r = node()
            body = d.enc() + data
            r.send(frame(op, body))
            st["bytes_sent"] += HDR + len(body)
            _op, code, b = r.recv_frame()
        except (OSError, ConnectionError):
            nc = None
            bump(st, f"{what}_closed")
            return
        if code == 0:
            if must_fail:
                bump(st, "accepted")
                bump(st, f"{what}_ACCEPTED")
            elif want is not None and b != want:
                bump(st, "valid_read_mismatch")
            else:
                bump(st, "valid_ok")
        else:
            bump(st, f"{what}_status_{code}" if must_fail else f"valid_{what}_failed_{code}")

    while time.monotonic() < deadline:
        rounds += 1
        key = f"hostile-desc-{os.getpid()}-{rounds}"
        val = rnd.randbytes(size)
        try:
            if mc is None:
                mc = Raw(ctx.addr["master"], 3.0)
                st["conns"] += 1
                mc.hello(ctx.token)
            cl.put(key, val)
            code, b = mc.call(OP["GET"], keys_body([key.encode()]))
            res = parse_get_resp(b) if code == 0 else []
            if not res or res[0][0] != 0:
                bump(st, "get_failed")
                continue
            d = res[0][2][0]
            try_op("read", OP["SEG_READ"], d, must_fail=False, want=val)
            for what, f in (("tag_bit", d.but(tag=d.tag ^ (1 << rnd.randrange(64)))),
                            ("offset", d.but(off=d.off + 4096)),
                            ("offset_unaligned", d.but(off=d.off + 1)),
                            ("length_larger", d.but(length=d.length + 4096)),
                            ("length_huge", d.but(length=2**62)),
                            ("generation", d.but(gen=d.gen + 1)),
                            ("generation_old", d.but(gen=d.gen - 1)),
                            ("expiry_later", d.but(exp=d.exp + 3_600_000)),
                            ("segment", d.but(seg=d.seg ^ 1)),
                            ("access_write", d.but(access=ACCESS_WRITE))):
                try_op(f"forged_{what}_read", OP["SEG_READ"], f)
                try_op(f"forged_{what}_write", OP["SEG_WRITE"], f, b"\xee" * f.length
                       if f.length <= size + 4096 else b"\xee" * 16)
            try_op("read_desc_for_write", OP["SEG_WRITE"], d, b"\xee" * d.length)
            code, b = mc.call(OP["REMOVE"], remove_body([key.encode()], force=True))
            time.sleep(0.05)  # SEG_FREED reaches the node
            try_op("stale_after_remove_read", OP["SEG_READ"], d)
            try_op("stale_after_remove_write", OP["SEG_WRITE"], d.but(access=ACCESS_WRITE),
                   b"\xee" * d.length)
            # a WRITE descriptor: used once, then after PUT_REVOKE
            wkey = f"hostile-wdesc-{os.getpid()}-{rounds}".encode()
            code, b = mc.call(OP["PUT_START"], put_start_body([wkey], [size]))
            pres = parse_put_start_resp(b) if code == 0 else []
            if pres and pres[0][0] == 0:
                w = pres[0][1][0]
                try_op("write", OP["SEG_WRITE"], w, b"\x11" * w.length, must_fail=False)
                try_op("write_desc_for_read", OP["SEG_READ"], w)
                try_op("write_forged_offset", OP["SEG_WRITE"], w.but(off=w.off + 4096),
                       b"\xee" * w.length)
                mc.call(OP["PUT_REVOKE"], keys_body([wkey]))
                time.sleep(0.05)
                try_op("stale_after_revoke_write", OP["SEG_WRITE"], w, b"\xee" * w.length)
            else:
                bump(st, "put_start_failed")
        except (OSError, ConnectionError, struct.error, kvpool.Error) as e:
            bump(st, f"round_failed_{type(e).__name__}")
            mc = None
            time.sleep(0.2)
        time.sleep(0.02)
    st["rounds"] = rounds
    st.setdefault("accepted", 0)


def atk_lookup_reset(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """RESET-shaped frames at the lookup socket: 'R' with trailing bytes,
    'R' with a length that covers more than is sent (stall), pipelines of
    them, each malformed so the server must close without running it. A
    well-formed RESET ('R' alone) is an authorised operation that wipes the
    store (the socket admits only our uid); it is sent only with
    --lookup-real-reset, which then makes the victim's expected hits fail."""
    rnd = random.Random(os.getpid() + 8)
    i = 0
    while time.monotonic() < deadline:
        i += 1
        k = i % 4
        if ctx.real_reset and k == 0:
            data, what = struct.pack(">I", 1) + b"R", "reset_wellformed"
        elif k in (0, 1):
            body = b"R" + rnd.randbytes(rnd.randint(1, 64))
            data, what = struct.pack(">I", len(body)) + body, "reset_trailing"
        elif k == 2:
            data, what = struct.pack(">I", 50) + b"R", "reset_half"
        else:
            body = b"R\x01"
            data, what = (struct.pack(">I", len(body)) + body) * 32, "reset_pipeline"
        try:
            s = unix_connect(ctx.lookup_sock, 1.0)
            st["conns"] += 1
            s.sendall(data)
            st["bytes_sent"] += len(data)
            s.settimeout(2.5 if what == "reset_half" else 0.5)
            try:
                d = s.recv(64)
                bump(st, f"{what}_{'closed' if not d else 'answered_' + chr(d[4]) if len(d) > 4 else 'answered'}")
            except socket.timeout:
                bump(st, f"{what}_no_answer")
            except OSError:
                bump(st, f"{what}_reset")
            s.close()
        except OSError:
            bump(st, "connect_failed")
        time.sleep(0.01)


# ------------------------------------ the HTTP endpoint and the KV events' sockets

def surf_serve_args(targets: list[str], wd: Path) -> list[str]:
    """`kvpool serve` flags for the http-slow and kvev targets (none for the
    others); their endpoints reach the attackers through $HOSTILE_SURF."""
    if not {"http-slow", "kvev"} & set(targets):
        return []
    socks = [socket.socket() for _ in range(3)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    http, pub, rep = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    tok = os.urandom(16).hex()
    (wd / "http.tok").write_text(tok + "\n")
    (wd / "http.tok").chmod(0o600)
    os.environ["HOSTILE_SURF"] = json.dumps({"http": http, "pub": pub, "replay": rep,
                                             "http_token": tok})
    return ["--http", f"127.0.0.1:{http}", "--http-token-file", str(wd / "http.tok"),
            "--kv-events", f"tcp://127.0.0.1:{pub}", "--kv-events-replay",
            f"tcp://127.0.0.1:{rep}"]


def surf_ep() -> dict[str, Any]:
    return json.loads(os.environ["HOSTILE_SURF"])


def http_probe(port: int, path: str, token: str = "") -> tuple[int, float]:
    """One GET on its own connection: (status or -1, ms)."""
    t0 = time.perf_counter()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=2)
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n".encode())
        got = b""
        while b"\r\n" not in got:
            d = s.recv(4096)
            if not d:
                break
            got += d
        s.close()
        st = int(got.split(b" ")[1]) if got.startswith(b"HTTP/1.1 ") else -1
    except (OSError, ValueError, IndexError):
        st = -1
    return st, (time.perf_counter() - t0) * 1000


def atk_http_slow(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """The slow-header attack: 64 connections from 8 loopback addresses, each
    sending one header line every 4 s (never finishing its request), a
    closed one replaced at once; meanwhile /healthz (open) and /metrics (with
    the token) are probed 4 times a second from another address."""
    ep = surf_ep()
    port = ep["http"]
    held: dict[int, socket.socket] = {}
    n_line, next_line = 0, 0.0
    while time.monotonic() < deadline:
        for i in range(64):
            if i in held:
                continue
            try:
                s = tcp_connect(("127.0.0.1", port), src=f"127.0.0.{2 + i % 8}")
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                held[i] = s
                bump(st, "conns")
            except OSError:
                bump(st, "connect_failed")
        if time.monotonic() >= next_line:
            next_line = time.monotonic() + 4.0
            n_line += 1
            for i, s in list(held.items()):
                try:
                    s.setblocking(False)
                    try:
                        gone = s.recv(1) == b""
                    except BlockingIOError:
                        gone = False
                    s.setblocking(True)
                    if not gone:
                        s.sendall(f"X-Slow-{n_line}: 1\r\n".encode())
                        bump(st, "bytes_sent", 16)
                except OSError:
                    gone = True
                if gone:
                    s.close()
                    del held[i]
                    bump(st, "closed_by_peer")
        for path, tok, key in (("/healthz", "", "healthz"), ("/metrics", ep["http_token"], "metrics")):
            code, ms = http_probe(port, path, tok)
            bump(st, f"{key}_ok" if code == 200 else f"{key}_failed")
            st[f"{key}_max_ms"] = max(st.get(f"{key}_max_ms", 0), int(ms + 0.999))
        time.sleep(0.25)
    st["held_at_end"] = len(held)
    for s in held.values():
        s.close()


def zmtp_peer(port: int, stype: bytes) -> socket.socket:
    """A raw ZMTP 3.0 peer (NULL mechanism) with its greeting and READY sent."""
    s = socket.create_connection(("127.0.0.1", port), timeout=3)
    s.sendall(b"\xff" + b"\0" * 8 + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + b"\0" * 32)
    time.sleep(0.02)  # libzmq 4.3 drops a peer whose greeting and frames share a segment
    ready = b"\x05READY\x0bSocket-Type" + struct.pack(">I", len(stype)) + stype
    s.sendall(bytes([0x04, len(ready)]) + ready)
    return s


def zmtp_closed(s: socket.socket) -> bool:
    """Whether the server closed s (what it sent before is read and dropped)."""
    s.settimeout(0)
    try:
        while True:
            if not s.recv(1 << 20):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def atk_kvev_subs(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """Subscriptions as the memory attack: cycles of 8 subscribers, each
    sending a 64 MiB subscription, held 2 s, then dropped; plus 300 idle
    subscribers held (the connection cap)."""
    pub = surf_ep()["pub"]
    idle: list[socket.socket] = []
    for _ in range(300):
        try:
            idle.append(zmtp_peer(pub, b"SUB"))
            bump(st, "conns")
        except OSError:
            bump(st, "connect_failed")
    chunk = b"A" * (1 << 20)
    while time.monotonic() < deadline:
        subs = []
        for _ in range(8):
            try:
                s = zmtp_peer(pub, b"SUB")
                bump(st, "conns")
                s.sendall(b"\x02" + struct.pack(">Q", 1 + (64 << 20)) + b"\x01")
                for _ in range(64):
                    s.sendall(chunk)
                    bump(st, "bytes_sent", len(chunk))
                bump(st, "taken_whole")
                subs.append(s)
            except OSError:
                bump(st, "closed_by_peer")
        time.sleep(2)
        for s in subs:
            s.close()
    st["idle_refused"] = sum(zmtp_closed(s) for s in idle)
    for s in idle:
        s.close()


def atk_kvev_replay(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """Replay clients that never read: 100 held (past the cap), each asking
    for every batch of topic "" from seq 0, while a Client stores KV blocks
    (one event each) so the ring keeps filling."""
    import kvpool
    rep = surf_ep()["replay"]
    held: list[socket.socket] = []
    c = kvpool.Client(ctx.client_cfg)
    base = random.getrandbits(40) << 20
    n = 0
    req = b"\x01\x00" + b"\x01\x07default" + b"\x00\x08" + b"\0" * 8
    while time.monotonic() < deadline:
        hs = [base + n * 64 + i for i in range(64)]
        blocks = [kvpool.Block(h, hs[i - 1] if i else None, 16, 1, 0) for i, h in enumerate(hs)]
        try:
            c.put_batch([f"kvev-{n}-{i}" for i in range(64)], [b"x" * 512] * 64, blocks=blocks)
        except kvpool.Error:
            bump(st, "put_failed")
        n += 1
        if len(held) < 100:
            try:
                s = zmtp_peer(rep, b"DEALER")
                s.sendall(req)
                held.append(s)
                bump(st, "conns")
            except OSError:
                bump(st, "connect_failed")
        time.sleep(0.05)
    c.close()
    closed = sum(zmtp_closed(s) for s in held)
    for s in held:
        s.close()
    st["closed_by_peer"] = closed
    st["held_at_end"] = len(held) - closed
    st["kv_batches_put"] = n


# ----------------------------------------------- the "followers" target
# Standbys that follow the index (REPL_FOLLOW, node credential) and never
# read, against a master holding many objects with long keys: the master's
# snapshot work per loop turn and its memory for their unsent stream must
# stay bounded (max_followers, repl_buffer_budget). REPL_FOLLOW needs a
# master "in a cluster": FOLLOWERS_SERVE_ARGS give serve an etcd address,
# which `kvpool serve` never dials (no election there).
FOLLOWERS_SERVE_ARGS = ["--etcd", "http://127.0.0.1:1"]
FOLLOWERS_N, FOLLOWERS_OBJECTS, FOLLOWERS_KEY = 40, 30000, 3000
OP_REPL_FOLLOW = 27


def followers_preload(ctx: Ctx, st: dict[str, int], n: int, tag: bytes) -> list[bytes]:
    """n objects with FOLLOWERS_KEY-byte keys published through the raw
    protocol (PUT_START + PUT_END: the index is what matters here)."""
    c = Raw(ctx.addr["master"], timeout=30)
    if c.hello(ctx.token) != 0:
        raise RuntimeError("followers: HELLO refused")
    keys: list[bytes] = []
    for at in range(0, n, 50):
        batch = [(b"%s-%08d-" % (tag, i)).ljust(FOLLOWERS_KEY, b"k") for i in range(at, min(n, at + 50))]
        stt, b = c.call(OP["PUT_START"], put_start_body(batch, [4096] * len(batch)))
        if stt != 0:
            bump(st, "preload_refused")
            continue
        ok = [k for k, (rs, _) in zip(batch, parse_put_start_resp(b)) if rs == 0]
        body = b_(b"") + struct.pack("<I", len(ok)) + b"".join(b_(k) + struct.pack("<Q", 7) for k in ok)
        stt, _ = c.call(OP["PUT_END"], body)
        if stt == 0:
            keys += ok
    st["bytes_sent"] += c.sent
    c.close()
    return keys


def atk_followers(ctx: Ctx, target: str, deadline: float, st: dict[str, int]) -> None:
    """FOLLOWERS_OBJECTS objects with 3 KB keys, then FOLLOWERS_N connections
    that HELLO with the node credential, send REPL_FOLLOW and never read;
    one the master closes (cut off past its share, or refused past
    max_followers) is opened again. Meanwhile a churn of long-key puts and
    removes keeps the index stream flowing."""
    node_cred = os.environ.get("KVPOOL_NODE_TOKEN", "").encode()
    rnd = random.Random(os.getpid() + 27)
    keys = followers_preload(ctx, st, FOLLOWERS_OBJECTS, b"fol")
    st["objects"] = len(keys)
    pool = Pool(st)
    churn = Raw(ctx.addr["master"], timeout=10)
    churn.hello(ctx.token)
    gen = 0
    while time.monotonic() < deadline:
        pool.reap(0)
        while len(pool.conns) < FOLLOWERS_N:
            try:
                s = tcp_connect(ctx.addr["master"], rnd.choice(ctx.srcs), 1.0)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                f = frame(OP["HELLO"], hello_body(ctx.token, node_cred=node_cred)) + \
                    frame(OP_REPL_FOLLOW)
                s.sendall(f)
                st["bytes_sent"] += len(f)
                st["conns"] += 1
                pool.add(s)
            except OSError:
                bump(st, "connect_failed")
                break
        # the stream keeps flowing: 100 long-key objects put and removed
        gen += 1
        batch = [(b"churn-%d-%d-" % (gen, i)).ljust(FOLLOWERS_KEY, b"c") for i in range(100)]
        try:
            stt, b = churn.call(OP["PUT_START"], put_start_body(batch, [4096] * len(batch)))
            ok = [k for k, (rs, _) in zip(batch, parse_put_start_resp(b)) if rs == 0] if stt == 0 else []
            body = b_(b"") + struct.pack("<I", len(ok)) + b"".join(b_(k) + struct.pack("<Q", 9) for k in ok)
            churn.call(OP["PUT_END"], body)
            churn.call(OP["REMOVE"], remove_body(ok))
            bump(st, "churn_objects", len(ok))
        except (OSError, ConnectionError, struct.error):
            bump(st, "churn_failed")
            churn = Raw(ctx.addr["master"], timeout=10)
            churn.hello(ctx.token)
        time.sleep(0.05)
    st["held_at_end"] = len(pool.conns)
    st["bytes_sent"] += churn.sent
    pool.close_all()
    churn.close()


ATTACKS: dict[str, list[tuple[str, Callable[..., None]]]] = {
    "master": [("garbage", atk_garbage), ("lying_lengths", atk_lying), ("slowloris", atk_slowloris),
               ("idle_flood", atk_flood), ("never_reading", atk_neverread),
               ("wrong_hello", atk_tokens), ("mount", atk_mount)],
    "node": [("garbage", atk_garbage), ("lying_lengths", atk_lying), ("slowloris", atk_slowloris),
             ("idle_flood", atk_flood), ("never_reading", atk_neverread),
             ("wrong_hello", atk_tokens), ("descriptors", atk_descriptors)],
    "lookup": [("garbage", atk_garbage), ("half_frames", atk_lying), ("slowloris", atk_slowloris),
               ("idle_flood", atk_flood), ("never_reading", atk_neverread),
               ("reset_frames", atk_lookup_reset)],
    "http-slow": [("slow_headers", atk_http_slow)],
    "kvev": [("big_subscriptions", atk_kvev_subs), ("non_reading_replay", atk_kvev_replay)],
    "followers": [("followers", atk_followers)],
}


def attacker_main(name: str, target: str, ctx: Ctx, seconds: float, q: Any) -> None:
    raise_nofile()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fn = dict(ATTACKS[target])[name]
    st: dict[str, int] = {"conns": 0, "bytes_sent": 0}
    deadline = time.monotonic() + seconds
    err = ""
    try:
        fn(ctx, target, deadline, st)
    except Exception as e:  # an attacker's own failure is reported, not fatal
        err = f"{type(e).__name__}: {e}"
    q.put((name, st, err))


# ------------------------------------------------------------------ victims

def pctl(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summarize(lat: list[float], fails: dict[str, int], fail_max: float = 0.0) -> dict[str, Any]:
    """Latencies are those of the successful ops; failed_max_ms is the
    slowest failed one (a timeout shows there)."""
    nf = sum(fails.values())
    n = len(lat) + nf
    return {"ops": n, "ok": len(lat), "success_rate": round(len(lat) / n, 5) if n else None,
            "p50_ms": round(pctl(lat, 50), 3), "p99_ms": round(pctl(lat, 99), 3),
            "max_ms": round(max(lat), 3) if lat else 0.0, "failures": fails,
            "failed_max_ms": round(fail_max, 3)}


def victim_kv(cfg: dict[str, Any], phase: Any, q: Any, seed: int) -> None:
    """put/get loop, values 64 KiB .. 1 MiB of known content; every get is
    compared with what was put. Latency per op in ms, per phase."""
    import kvpool
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rnd = random.Random(seed)
    pool = rnd.randbytes(2 << 20)
    c = kvpool.Client(cfg)
    lat: dict[int, list[float]] = {0: [], 1: [], 2: []}
    lat_op: dict[tuple[int, str], list[float]] = {}
    fails: dict[int, dict[str, int]] = {0: {}, 1: {}, 2: {}}
    fmax = {0: 0.0, 1: 0.0, 2: 0.0}
    wrong_bytes = 0
    wrong_values = 0
    keys: list[tuple[str, int, int]] = []
    i = 0

    def rec(ph: int, op: str, t0: float, ok: bool, why: str = "") -> None:
        if ph not in lat:
            return
        ms = (time.perf_counter() - t0) * 1000
        if ok:
            lat[ph].append(ms)
            lat_op.setdefault((ph, op), []).append(ms)
        else:
            fails[ph][f"{op}:{why}"] = fails[ph].get(f"{op}:{why}", 0) + 1
            fmax[ph] = max(fmax[ph], ms)

    while phase.value < 3:
        i += 1
        size = rnd.randint(64 << 10, 1 << 20)
        off = rnd.randint(0, len(pool) - size)
        key = f"victim-{seed}-{i}"
        val = memoryview(pool)[off:off + size]
        ph = phase.value
        t0 = time.perf_counter()
        try:
            c.put(key, val)
            rec(ph, "put", t0, True)
            keys.append((key, off, size))
        except kvpool.Error as e:
            rec(ph, "put", t0, False, e.name)
        # read back the newest and one older key
        for key2, off2, size2 in ([keys[-1]] if keys else []) + \
                ([keys[rnd.randrange(len(keys))]] if len(keys) > 1 else []):
            ph = phase.value
            t0 = time.perf_counter()
            try:
                got = c.get(key2)
                want = pool[off2:off2 + size2]
                if got != want:
                    wrong_values += 1
                    n = min(len(got), len(want))
                    wrong_bytes += sum(1 for a, b in zip(got[:n], want[:n]) if a != b) + \
                        abs(len(got) - len(want))
                    rec(ph, "get", t0, False, "WRONG_BYTES")
                else:
                    rec(ph, "get", t0, True)
            except kvpool.Error as e:
                rec(ph, "get", t0, False, e.name)
        while len(keys) > 32:
            k, _, _ = keys.pop(0)
            try:
                c.remove(k, force=True)
            except kvpool.Error:
                pass
    names = {0: "baseline", 1: "attack", 2: "after"}
    out = {names[p]: dict(summarize(lat[p], fails[p], fmax[p]),
                          **{f"{op}_p50_ms": round(pctl(lat_op.get((p, op), []), 50), 3)
                             for op in ("put", "get")},
                          **{f"{op}_p99_ms": round(pctl(lat_op.get((p, op), []), 99), 3)
                             for op in ("put", "get")})
           for p in names}
    out["wrong_bytes"] = wrong_bytes
    out["wrong_values"] = wrong_values
    c.close()
    q.put(out)


BS, NB, PAGE = 16, 32, 4096
TOKS = list(range(100, 164))  # 4 blocks
EXPECTED_HIT = 48              # one token is always left to compute: floors to 3 blocks


def lookup_hashes(tokens: list[int]) -> list[bytes]:
    out, parent = [], b""
    for i in range(len(tokens) // BS):
        parent = hashlib.sha256(parent + bytes(str(tokens[i * BS:(i + 1) * BS]), "ascii")).digest()
        out.append(parent)
    return out


def lookup_common(sock: str) -> dict[str, Any]:
    return {"model": "hostile", "hash_block_size": BS, "block_size": BS, "lookup_socket": sock,
            "groups": [{"kind": "full_attention", "block_size": BS, "num_kv_heads": 2}]}


def engine_main(master: str, sock: str, ready: Any, stop: Any, q: Any) -> None:
    """The rank-0 worker that serves the lookup socket (as in
    tests/python/test_conn_native.py): stores a 4-block prefix through its
    own scheduler half, then serves lookups until told to stop."""
    import numpy as np
    from kvpool import _native
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kv = np.zeros((NB, PAGE), dtype=np.uint8)
    store = json.dumps({"master": master, "mode": "standalone-store", "global_segment_size": 0})
    common = lookup_common(sock)
    worker = _native.ConnWorker(dict(common, store_config=store, num_blocks=NB))
    worker.register_kv_caches([(kv.ctypes.data, NB * PAGE, 1, (NB, PAGE), (PAGE, 1))])
    sched = _native.ConnSched(common)

    def step(new: list[Any], finished: tuple[str, ...] = ()) -> Any:
        return worker.get_finished(sched.build_meta(new, [], (), finished, ()), finished)

    hs = lookup_hashes(TOKS)
    kv[1:5] = np.random.default_rng(1).integers(0, 256, (4, PAGE), dtype=np.uint8)
    r = _native.ConnRequest("a0", 64)
    r.sync(TOKS, hs, 0)
    sched.lookup(r, 0)
    sched.update_state_after_alloc(r, None, 0)
    step([(r, 64, ([1, 2, 3, 4],))])
    r.sync(TOKS + [7], hs, 64)
    sched.request_finished("a0", ([1, 2, 3, 4],))
    done = "a0" in step([], ("a0",))[0]
    t_end = time.monotonic() + 10
    while not done and time.monotonic() < t_end:
        done = "a0" in step([])[0]
        time.sleep(0.01)
    q.put({"stored": done})
    ready.set()
    while not stop.is_set():
        stop.wait(0.5)
    sched.close()
    worker.close()


def victim_lookup(sock: str, phase: Any, q: Any) -> None:
    """Lookups through a ConnSched (blocking, 2 s deadline) for the prefix
    the engine stored; a success is a hit of exactly EXPECTED_HIT tokens."""
    from kvpool import _native
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sched = _native.ConnSched(dict(lookup_common(sock), lookup_async=False,
                                   lookup_timeout_ms=2000))
    hs = lookup_hashes(TOKS)
    req = _native.ConnRequest("victim", 64)
    req.sync(TOKS, hs, 0)
    lat: dict[int, list[float]] = {0: [], 1: [], 2: []}
    fails: dict[int, dict[str, int]] = {0: {}, 1: {}, 2: {}}
    fmax = {0: 0.0, 1: 0.0, 2: 0.0}
    while phase.value < 3:
        ph = phase.value
        t0 = time.perf_counter()
        try:
            n, _ = sched.lookup(req, 0)
            ok, why = n == EXPECTED_HIT, f"hit_{n}"
        except Exception as e:
            ok, why = False, type(e).__name__
        if ph in lat:
            ms = (time.perf_counter() - t0) * 1000
            if ok:
                lat[ph].append(ms)
            else:
                fails[ph][why] = fails[ph].get(why, 0) + 1
                fmax[ph] = max(fmax[ph], ms)
        time.sleep(0.0005)
    names = {0: "baseline", 1: "attack", 2: "after"}
    out: dict[str, Any] = {names[p]: summarize(lat[p], fails[p], fmax[p]) for p in names}
    out["wrong_bytes"] = 0  # a lookup moves no value bytes; a wrong hit is a failure
    sched.close()
    q.put(out)


# ------------------------------------------------------------ orchestration

def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def proc_info(pid: int) -> dict[str, Any]:
    """VmRSS / RssAnon / RssShmem (KiB), open fds, CPU seconds of pid."""
    out: dict[str, Any] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssShmem", "VmHWM", "Threads"):
                out[k] = int(v.split()[0])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = round((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except OSError:
        out["gone"] = True
    return out


def kvpool_bin(arg: Optional[str]) -> str:
    b = arg or os.environ.get("KVPOOL_BIN") or str(ROOT / "build" / "kvpool")
    return b if os.path.isabs(b) else str(ROOT / b)


def start_serve(binary: str, segment: str, workdir: Path, extra: list[str]) -> tuple[Any, int]:
    pf = workdir / "port"
    log = open(workdir / "serve.log", "wb")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.Popen([binary, "serve", "--listen", "127.0.0.1:0", "--port-file", str(pf),
                          "--segment-size", segment, *extra],
                         stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + 30
    while not (pf.exists() and pf.read_text().strip()):
        if p.poll() is not None:
            raise RuntimeError(f"kvpool serve exited with {p.returncode}: "
                               f"{(workdir / 'serve.log').read_text(errors='replace')[-2000:]}")
        if time.monotonic() > deadline:
            p.kill()
            raise TimeoutError("kvpool serve did not start")
        time.sleep(0.05)
    return p, int(pf.read_text().strip())


def node_addr(master: tuple[str, int], token: bytes) -> tuple[int, bytes, tuple[str, int]]:
    """The node's segment id, name and TCP endpoint: STATS, then SEGMENT_INFO
    (kvp_enc_ids request; answer u32 n, per segment i32 status and the
    descriptor: u64 id, name, u64 capacity, u32 n_endpoints, endpoints)."""
    r = Raw(master)
    if r.hello(token) != 0:
        raise RuntimeError("HELLO with the cluster token refused")
    deadline = time.monotonic() + 10
    segs: list[tuple[int, bytes]] = []
    while not segs and time.monotonic() < deadline:
        _, b = r.call(OP["STATS"])
        segs = parse_stats_segs(b)
        if not segs:
            time.sleep(0.1)
    if not segs:
        raise RuntimeError("no segment mounted")
    sid, name = segs[0]
    _, b = r.call(OP["SEGMENT_INFO"], struct.pack("<IQ", 1, sid))
    at = 4
    (st,) = struct.unpack_from("<i", b, at)
    at += 4 + 8
    (ln,) = struct.unpack_from("<I", b, at)
    at += 4 + ln + 8
    (ne,) = struct.unpack_from("<I", b, at)
    at += 4
    tcp = None
    for _ in range(ne):
        (tl,) = struct.unpack_from("<I", b, at)
        tr = b[at + 4:at + 4 + tl]
        at += 4 + tl
        (al,) = struct.unpack_from("<I", b, at)
        ad = b[at + 4:at + 4 + al]
        at += 4 + al
        if tr == b"tcp":
            host, _, port = ad.decode().rpartition(":")
            tcp = (host, int(port))
    r.close()
    if st != 0 or tcp is None:
        raise RuntimeError("no tcp endpoint for the segment")
    return sid, name, tcp


def run_target(target: str, a: argparse.Namespace, ctx: Ctx, serve: Any,
               engine_pid: Optional[int], spawn: Any) -> dict[str, Any]:
    print(f"== {target}: baseline {a.baseline:g} s, attack {a.seconds:g} s, "
          f"after {a.after:g} s", flush=True)
    phase = spawn.Value("i", 0)
    vq = spawn.Queue()
    if target == "lookup":
        victim = spawn.Process(target=victim_lookup, args=(ctx.lookup_sock, phase, vq))
    else:
        victim = spawn.Process(target=victim_kv, args=(ctx.client_cfg, phase, vq,
                                                       random.getrandbits(31)))
    victim.start()
    res: dict[str, Any] = {"serve_before": proc_info(serve.pid)}
    if engine_pid:
        res["engine_before"] = proc_info(engine_pid)
    time.sleep(a.baseline)
    aq = spawn.Queue()
    atk = [spawn.Process(target=attacker_main, args=(n, target, ctx, a.seconds, aq))
           for n, _ in ATTACKS[target]]
    t0 = time.monotonic()
    cpu0 = proc_info(serve.pid).get("cpu_s", 0.0)
    phase.value = 1
    for p in atk:
        p.start()
    peak: dict[str, Any] = {}
    while time.monotonic() - t0 < a.seconds:
        time.sleep(min(1.0, max(0.0, a.seconds - (time.monotonic() - t0))))
        inf = proc_info(serve.pid)
        if inf.get("VmRSS", 0) > peak.get("VmRSS", 0):
            peak["VmRSS"] = inf["VmRSS"]
            peak["RssAnon"] = inf.get("RssAnon")
        peak["fds"] = max(peak.get("fds", 0), inf.get("fds", 0))
        if serve.poll() is not None:
            break
    res["serve_end_of_attack"] = proc_info(serve.pid)
    res["serve_peak"] = peak
    if engine_pid:
        res["engine_end_of_attack"] = proc_info(engine_pid)
    attacks: dict[str, Any] = {}
    for _ in atk:
        try:
            n, st, err = aq.get(timeout=30)
            attacks[n] = dict(st, **({"error": err} if err else {}))
        except Exception:
            break
    for p in atk:
        p.join(5)
        if p.is_alive():
            p.kill()
    phase.value = 2
    res["serve_cpu_s_during_attack"] = round(res["serve_end_of_attack"].get("cpu_s", cpu0) - cpu0, 2)
    time.sleep(a.after)
    phase.value = 3
    try:
        v = vq.get(timeout=60)
    except Exception:
        v = {"error": "victim gave no result"}
    victim.join(10)
    res["serve_after"] = proc_info(serve.pid)
    if engine_pid:
        res["engine_after"] = proc_info(engine_pid)
    res["serve_alive"] = serve.poll() is None
    res["victim"] = v
    res["attacks"] = attacks
    res["attack_volume"] = {"connections": sum(s.get("conns", 0) for s in attacks.values()),
                            "bytes_sent": sum(s.get("bytes_sent", 0) for s in attacks.values())}
    # attacks that must manage their genuine operations, or they prove nothing
    # (e.g. the protocol changed under this script)
    insane = [f"{n}: {e}" for n, e in ((n, s.get("error")) for n, s in attacks.items()) if e]
    d = attacks.get("descriptors")
    if d is not None and not d.get("valid_ok"):
        insane.append("descriptors: no genuine SEG_READ / SEG_WRITE worked")
    nr = attacks.get("never_reading")
    if target == "node" and nr is not None and not nr.get("descriptors_fetched"):
        insane.append("never_reading: no descriptor from a raw GET")
    if len(attacks) != len(ATTACKS[target]):
        insane.append(f"{len(ATTACKS[target]) - len(attacks)} attacker(s) reported nothing")
    res["attack_problems"] = insane
    res["forged_accepted"] = sum(s.get("accepted", 0) + s.get("refusable_accepted", 0)
                                 for s in attacks.values())
    return res


def mib(kib: Optional[int]) -> str:
    return f"{kib / 1024:.1f}" if kib is not None else "-"


def print_table(out: dict[str, Any]) -> None:
    rows = [("target", "phase", "ops", "success", "p50 ms", "p99 ms", "max ms")]
    for t, r in out["targets"].items():
        v = r["victim"]
        for ph in ("baseline", "attack", "after"):
            s = v.get(ph) or {}
            sr = s.get("success_rate")
            rows.append((t, ph, str(s.get("ops", "-")),
                         f"{sr * 100:.2f} %" if sr is not None else "-",
                         f"{s.get('p50_ms', 0):.2f}", f"{s.get('p99_ms', 0):.2f}",
                         f"{s.get('max_ms', 0):.1f}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w[i]) if i > 1 else c.ljust(w[i]) for i, c in enumerate(r)))
    print()
    rows = [("target", "wrong B", "forged ok", "alive", "RSS MiB before/end/after",
             "anon MiB before/end/after", "fds b/e/a", "CPU s", "conns", "MB sent")]
    for t, r in out["targets"].items():
        b, e, f = r["serve_before"], r["serve_end_of_attack"], r["serve_after"]
        rows.append((t, str(r["victim"].get("wrong_bytes", "?")), str(r["forged_accepted"]),
                     "yes" if r["serve_alive"] else "NO",
                     f"{mib(b.get('VmRSS'))}/{mib(e.get('VmRSS'))}/{mib(f.get('VmRSS'))}",
                     f"{mib(b.get('RssAnon'))}/{mib(e.get('RssAnon'))}/{mib(f.get('RssAnon'))}",
                     f"{b.get('fds', '-')}/{e.get('fds', '-')}/{f.get('fds', '-')}",
                     str(r["serve_cpu_s_during_attack"]),
                     str(r["attack_volume"]["connections"]),
                     f"{r['attack_volume']['bytes_sent'] / 1e6:.1f}"))
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w[i]) for i, c in enumerate(r)))
    print()
    for t, r in out["targets"].items():
        print(f"{t} attacks (connections opened / MB sent / closed by the server / "
              "still held at the end):")
        for n, a in r["attacks"].items():
            extra = ""
            if "accepted" in a or "refusable_accepted" in a:
                extra = f", accepted that must not be: {a.get('accepted', 0) + a.get('refusable_accepted', 0)}"
            if a.get("error"):
                extra += f", attacker error: {a['error']}"
            print(f"  {n:14} {a.get('conns', 0):7} / {a.get('bytes_sent', 0) / 1e6:8.1f} / "
                  f"{a.get('closed_by_peer', '-')!s:>6} / {a.get('held_at_end', '-')!s:>5}{extra}")
    for t, r in out["targets"].items():
        if "engine_before" in r:
            b, f = r["engine_before"], r["engine_after"]
            print(f"lookup server (engine process) RSS MiB before/after: "
                  f"{mib(b.get('VmRSS'))}/{mib(f.get('VmRSS'))}, fds {b.get('fds')}/{f.get('fds')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60, help="attack per target (60)")
    ap.add_argument("--baseline", type=float, default=10, help="quiet baseline per target (10)")
    ap.add_argument("--after", type=float, default=3, help="recovery window per target (3)")
    ap.add_argument("--flood", type=int, default=2000, help="idle connections held per target")
    ap.add_argument("--segment-size", default="256MiB")
    ap.add_argument("--targets", default="master,node,lookup")
    ap.add_argument("--kvpool", help="the kvpool binary (default $KVPOOL_BIN, build/kvpool)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "hostile.json"))
    ap.add_argument("--lookup-real-reset", action="store_true",
                    help="also send well-formed RESETs (they wipe the store: lookups then miss)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra `kvpool serve` flag (repeatable), e.g. --serve-arg=--hello-timeout=2s")
    a = ap.parse_args()
    targets = [t for t in a.targets.split(",") if t]
    for t in targets:
        if t not in ATTACKS:
            ap.error(f"unknown target {t!r} ({', '.join(ATTACKS)})")
    nofile = raise_nofile()
    a.flood = max(1, min(a.flood, nofile - 500))
    binary = kvpool_bin(a.kvpool)
    if not os.access(binary, os.X_OK):
        print(f"hostile: no kvpool binary at {binary} (make, or set KVPOOL_BIN)", file=sys.stderr)
        return 2
    token = os.urandom(16).hex()
    os.environ["KVPOOL_CLUSTER_TOKEN"] = token           # serve, victims and engine
    os.environ["KVPOOL_NODE_TOKEN"] = os.urandom(16).hex()  # serve's own node mounts with it
    os.environ["KVPOOL_FORCE_TCP"] = "1"                  # victims move bytes through the node's TCP server
    os.environ.pop("KVPOOL_CONFIG", None)
    os.environ.pop("MOONCAKE_CONFIG_PATH", None)
    spawn = mp.get_context("spawn")
    wd = Path(tempfile.mkdtemp(prefix="kvpool-hostile-"))
    extra = ["--hello-timeout", "2s", *surf_serve_args(targets, wd), *a.serve_arg,
             *(FOLLOWERS_SERVE_ARGS if "followers" in targets else [])]
    serve, port = start_serve(binary, a.segment_size, wd, extra)
    engine = None
    stop = spawn.Event()
    rc = 0
    out: dict[str, Any] = {}
    try:
        master = ("127.0.0.1", port)
        sid, sname, naddr = node_addr(master, token.encode())
        srcs = [f"127.0.0.{i}" for i in range(2, 2 + max(2, a.flood // 48 + 2))]
        ctx = Ctx(addr={"master": master, "node": naddr}, token=token.encode(), seg_id=sid,
                  seg_name=sname, srcs=srcs, flood=a.flood, lookup_sock=str(wd / "lookup.sock"),
                  real_reset=a.lookup_real_reset,
                  client_cfg={"master": f"127.0.0.1:{port}", "mode": "standalone-store",
                              "global_segment_size": 0})
        out = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "kvpool": binary,
               "seconds": a.seconds, "baseline_s": a.baseline, "after_s": a.after,
               "flood": a.flood, "segment_size": a.segment_size, "serve_args": extra,
               "nofile": nofile, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(),
               "master": f"127.0.0.1:{port}", "node": f"{naddr[0]}:{naddr[1]}",
               "victim_transport": "tcp", "targets": {}}
        print(f"kvpool serve pid {serve.pid}: master 127.0.0.1:{port}, node {naddr[0]}:{naddr[1]}, "
              f"segment {a.segment_size}; RLIMIT_NOFILE {nofile}; flood {a.flood}", flush=True)
        for t in targets:
            engine_pid = None
            if t == "lookup":
                ready, eq = spawn.Event(), spawn.Queue()
                engine = spawn.Process(target=engine_main,
                                       args=(f"127.0.0.1:{port}", ctx.lookup_sock, ready, stop, eq))
                engine.start()
                if not ready.wait(60):
                    raise RuntimeError("the lookup engine did not start")
                if not eq.get(timeout=5).get("stored"):
                    raise RuntimeError("the lookup engine could not store its prefix")
                engine_pid = engine.pid
            out["targets"][t] = run_target(t, a, ctx, serve, engine_pid, spawn)
            if not out["targets"][t]["serve_alive"]:
                print(f"kvpool serve DIED during the {t} attack (rc {serve.returncode})",
                      flush=True)
                break
    finally:
        stop.set()
        if engine is not None:
            engine.join(10)
            if engine.is_alive():
                engine.kill()
        alive = serve.poll() is None
        if alive:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        out["serve_exit"] = serve.returncode
        out["serve_alive_at_end"] = alive
        out["serve_log_tail"] = (wd / "serve.log").read_text(errors="replace")[-4000:]
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = a.out + ".tmp"
        Path(tmp).write_text(json.dumps(out, indent=1) + "\n")
        os.replace(tmp, a.out)
        shutil.rmtree(wd, ignore_errors=True)
    if out.get("targets"):
        print_table(out)
    print(f"results: {a.out}")
    for t, r in out.get("targets", {}).items():
        if not r["serve_alive"] or r["victim"].get("wrong_bytes", 1) != 0 or r["forged_accepted"]:
            rc = 1
        if r["attack_problems"] and r["serve_alive"]:
            print(f"{t}: attacks that did not work as meant (protocol changed?): "
                  + "; ".join(r["attack_problems"]))
            rc = 1
    if not out.get("serve_alive_at_end", False) or len(out.get("targets", {})) != len(targets):
        rc = 1
    print("FAIL" if rc else "OK: serve alive, 0 wrong bytes, nothing forged accepted")
    return rc


if __name__ == "__main__":
    sys.exit(main())
