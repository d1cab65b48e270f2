"""A KV-aware router's view of a kvpool pool, built from vLLM 0.33's own
event classes: what llm-d's or Dynamo's indexer does with a vLLM engine's KV
events, pointed at the pool's master instead.

``PoolView`` subscribes to one tenant's topic on the master's PUB socket,
decodes every batch with ``msgspec.msgpack.Decoder(KVEventBatch)``, checks
that the topic's sequence numbers follow each other, fills a gap by vLLM's
replay protocol (a DEALER to the master's ROUTER: ``(topic, start_seq)``,
batches until END_SEQ), and when replay cannot fill it any more, rebuilds
from the master's snapshot (``kvpool.Client.kv_snapshot``) and goes on from
its seq. ``picture`` maps (block hash, group) to the set of mediums the pool
announced ("kvpool-dram", "kvpool-disk")."""
from __future__ import annotations

import time
from collections import defaultdict
from typing import Any, Optional

import msgspec
import zmq
from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                        KVEventBatch)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
MEDIUM = {"dram": "kvpool-dram", "disk": "kvpool-disk"}


class PoolView:
    def __init__(self, pub: str, replay: str, topic: str = "default",
                 client: Any = None, last_seq: Optional[int] = None) -> None:
        self.topic = topic.encode()
        self.client = client  # a kvpool.Client of the tenant: for snapshots
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        self.sub.connect(pub)
        self.replay_ep = replay
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.picture: dict[tuple[int, int], set[str]] = defaultdict(set)
        self.last_seq = last_seq
        self.seqs: list[int] = []        # every batch applied, in order
        self.replayed = 0                # batches taken from replay
        self.snapshots = 0               # rebuilds from the snapshot
        self.cleared = 0                 # AllBlocksCleared seen
        self.events: list[Any] = []      # every event applied

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()

    # ------------------------------------------------------------ applying

    def _apply(self, seq: int, payload: bytes) -> None:
        batch = self.decoder.decode(payload)
        for ev in batch.events:
            self.events.append(ev)
            if isinstance(ev, AllBlocksCleared):
                self.picture.clear()
                self.cleared += 1
            elif isinstance(ev, BlockStored):
                assert ev.locality == "REMOTE" and ev.token_ids == []
                for h in ev.block_hashes:
                    self.picture[(h, ev.group_idx)].add(ev.medium)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    k = (h, ev.group_idx)
                    self.picture[k].discard(ev.medium)
                    if not self.picture[k]:
                        del self.picture[k]
        self.seqs.append(seq)
        self.last_seq = seq

    def _take(self, seq: int, payload: bytes) -> None:
        """A batch in stream order: applied, a duplicate skipped, a gap mended."""
        if self.last_seq is not None and seq <= self.last_seq:
            return  # seen (a replay overlapping the live stream)
        if self.last_seq is not None and seq != self.last_seq + 1:
            self._mend(seq)
            if seq <= self.last_seq:
                return
        self._apply(seq, payload)

    def _mend(self, upto: int) -> None:
        """Batches last_seq+1 .. upto-1 were missed: replay them, else resync."""
        assert self.last_seq is not None
        got = self.replay(self.last_seq + 1)
        want = self.last_seq + 1
        if got and got[0][0] == want:
            for seq, payload in got:
                if seq > self.last_seq:
                    assert seq == self.last_seq + 1, (seq, self.last_seq)
                    self._apply(seq, payload)
                    self.replayed += 1
            return
        self.resync()

    # ------------------------------------------------------------ the master

    def replay(self, start: int, timeout_s: float = 5.0) -> list[tuple[int, bytes]]:
        """vLLM's replay request for this topic from start: the batches the
        master still buffers, in order."""
        d = self.ctx.socket(zmq.DEALER)
        d.connect(self.replay_ep)
        try:
            d.send_multipart([b"", self.topic, start.to_bytes(8, "big")])
            out = []
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if not d.poll(100):
                    continue
                fr = d.recv_multipart()
                assert fr[0] == b"", fr
                if fr[2] == END_SEQ:
                    return out
                assert fr[1] == self.topic
                out.append((int.from_bytes(fr[2], "big"), fr[3]))
            raise TimeoutError("no END_SEQ from the replay socket")
        finally:
            d.close(linger=0)

    def resync(self) -> None:
        """The master's snapshot replaces the picture; the stream goes on after its seq."""
        assert self.client is not None, "a gap replay cannot fill needs a snapshot"
        snap = self.client.kv_snapshot()
        self.picture.clear()
        for h, g, tier in snap.blocks:
            self.picture[(h, g)].add(MEDIUM[tier])
        self.last_seq = snap.seq
        self.snapshots += 1

    def drain(self, quiet_s: float = 0.5, timeout_s: float = 30.0) -> None:
        """Takes batches until none came for quiet_s."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.sub.poll(int(quiet_s * 1000)):
                return
            topic, seq, payload = self.sub.recv_multipart()
            if topic != self.topic:
                continue  # a prefix match ("default2" for "default")
            self._take(int.from_bytes(seq, "big"), payload)
        raise TimeoutError("the event stream never went quiet")

    def catch_up(self, client: Any) -> None:
        """Drains, then asks the master for a snapshot's seq and mends up to it:
        afterwards the picture is as of the master's last batch."""
        self.drain()
        seq = client.kv_snapshot().seq
        if self.last_seq is None or seq > self.last_seq:
            self._mend(seq + 1)

    def blocks(self, medium: str) -> set[tuple[int, int]]:
        return {k for k, m in self.picture.items() if medium in m}

    def as_snapshot(self) -> set[tuple[int, int, str]]:
        inv = {v: k for k, v in MEDIUM.items()}
        return {(h, g, inv[m]) for (h, g), ms in self.picture.items() for m in ms}


def snapshot_set(client: Any) -> tuple[int, set[tuple[int, int, str]]]:
    s = client.kv_snapshot()
    return s.seq, set(s.blocks)
