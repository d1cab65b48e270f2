/*
 * kvev.h -- KV-cache events in vLLM's wire format, and their publisher.
 *
 * The master tells engines' routers which blocks the pool holds the way vLLM
 * 0.33's ZmqEventPublisher (vllm/distributed/kv_events.py) tells them what
 * an engine's GPU cache holds, so that a consumer of vLLM's events reads
 * ours unchanged: a PUB socket sends each batch as the three frames
 * (topic, seq as 8 bytes big-endian, payload), the payload a msgpack
 * KVEventBatch; a ROUTER socket replays the batches still buffered.
 *
 * One extension: the topic is a tenant name, and sequence numbers are per
 * topic (assigned by the caller). A subscriber subscribes to a prefix (ZMQ
 * matches prefixes: "a" also receives "ab"), so it must compare the topic
 * frame itself; a gap in one topic's seqs means batches it will never see
 * (dropped here, at the PUB's high-water mark, or too old to replay): it
 * must take a snapshot.
 *
 * Encoding (kvp_kvev_encode): a KVEventBatch is msgspec array_like,
 * [ts (float64), [event...], data_parallel_rank] with the rank nil (None:
 * the pool is no data-parallel rank; vLLM's own batches always carry the
 * third element, so decoders of a fixed tuple find it).
 * Each event is a msgpack map, its tag "type" first:
 *   {"type":"BlockStored", "block_hashes":[uint...], "parent_block_hash":
 *    uint|nil, "token_ids":[], "block_size":int, "lora_id":nil, "medium":
 *    "kvpool-dram"|"kvpool-disk", "lora_name":nil, "group_idx":int,
 *    "locality":"REMOTE"}
 *   {"type":"BlockRemoved", "block_hashes":[...], "medium":..., "group_idx":
 *    int, "locality":"REMOTE"}
 *   {"type":"AllBlocksCleared"}
 * Consecutive input events merge into one vLLM event as vLLM's own do:
 *   - STORED events with the same medium, group and block_size, each one
 *     after the first having has_parent && parent == the previous one's hash
 *     (a chain): one BlockStored listing their hashes in order, whose
 *     parent_block_hash is the first one's (nil when it has none);
 *   - REMOVED events with the same medium and group: one BlockRemoved;
 *   - CLEARED: always alone.
 * Hashes are msgpack unsigned integers of the smallest width (uint64 above
 * INT64_MAX), what vLLM's int form of a block hash decodes from.
 */
#ifndef KVP_KVEV_H
#define KVP_KVEV_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

enum { KVP_KVEV_STORED = 1, KVP_KVEV_REMOVED = 2, KVP_KVEV_CLEARED = 3 };
enum { KVP_KVEV_DRAM = 0, KVP_KVEV_DISK = 1 }; /* medium "kvpool-dram" / "kvpool-disk" */

typedef struct kvp_kvev {
    uint64_t hash;       /* the engine's block hash (vLLM's int form, 0..2^64-1) */
    uint64_t parent;     /* STORED with has_parent: the parent block's hash */
    uint32_t block_size; /* STORED: tokens per block */
    uint8_t type;        /* KVP_KVEV_* */
    uint8_t medium;      /* KVP_KVEV_DRAM / DISK (not used by CLEARED) */
    uint8_t group;       /* vLLM's group_idx */
    uint8_t has_parent;
} kvp_kvev;
_Static_assert(sizeof(kvp_kvev) == 24, "kvp_kvev is 24 bytes");

/* Appends one KVEventBatch (msgpack) for events ev[0..n) to out (n may be
 * 0: an empty list). 0; KVP_EINVALID_PARAMS (an unknown type, or a medium
 * other than DRAM/DISK on a STORED or REMOVED event) with out untouched;
 * or out's error (KVP_ETOO_LARGE / KVP_ENOMEM, sticky in out->err) with
 * out->len back where it was. */
int kvp_kvev_encode(kvp_buf *out, double ts, const kvp_kvev *ev, size_t n);

/* ---------------------------------------------------------- publisher */

/* Longest topic (tenant name) submitted or asked for in a replay. */
#define KVP_KVPUB_MAX_TOPIC 1024
/* The topic of a replay request in vLLM's form (no topic frame). */
#define KVP_KVPUB_DEFAULT_TOPIC "default"

typedef struct kvp_kvpub kvp_kvpub;

/* A tenant whose events only its own credential reads (kvp_kvpub_cfg.tenants). */
typedef struct kvp_kvpub_tenant {
    const char *name;  /* the tenant: its topic, and the PLAIN username (1..255 bytes) */
    const char *token; /* its tenant token: the PLAIN password (1..255 bytes) */
} kvp_kvpub_tenant;

typedef struct kvp_kvpub_cfg {
    const char *pub;         /* "tcp://HOST:PORT" the PUB socket binds (required) */
    const char *replay;      /* "tcp://HOST:PORT" of the ROUTER replay socket, or NULL/"" = none */
    uint32_t buffer_batches; /* replay ring: most batches kept (0 = 10000, vLLM's buffer_steps;
                                at most 1 << 24) */
    uint64_t buffer_bytes;   /* and most bytes kept, topics and payloads (0 = 256 MiB) */
    uint32_t hwm;            /* ZMQ_SNDHWM of PUB (0 = 100000; at most INT32_MAX) */
    uint64_t queue_bytes;    /* submitted but not yet sent: above this, kvp_kvpub_submit
                                drops (0 = 256 MiB) */
    uint32_t max_subscribers;    /* connections to PUB at once; one more is refused in its
                                    handshake (0 = 256) */
    uint32_t max_replay_clients; /* the same for the replay socket (0 = 64) */
    const kvp_kvpub_tenant *tenants; /* ntenants > 0: tenants are protected (below) */
    size_t ntenants;
} kvp_kvpub_cfg;

/* Tenants (ntenants > 0): both sockets ask ZeroMQ's PLAIN mechanism
 * (ZMQ_PLAIN_SERVER) and the ZAP handler admits username = a tenant's name
 * with password = that tenant's token (compared in constant time), setting
 * the connection's User-Id to the tenant; anything else (a wrong password,
 * an unknown tenant, another mechanism) is refused in the handshake. The
 * PUB is then an XPUB with ZMQ_XPUB_MANUAL: the publisher thread reads
 * every (un)subscription with its User-Id and applies, for that connection
 * alone, only one: its tenant's topic. A subscription to a prefix of it
 * ("" included: vLLM's subscribe-to-everything) means the tenant's topic;
 * any other is refused, not applied (stats.subs_refused). So a connection
 * holds at most one subscription, and receives its own tenant's batches
 * and no other's; a cancel of any subscription that was admitted removes
 * that one (a connection subscribed to "" and to its topic that cancels
 * "" receives nothing more). The replay socket answers only the requester's tenant:
 * vLLM's form (no topic) replays the tenant's topic; a request naming
 * another topic gets the end marker alone (stats.replays_refused). Since
 * ZeroMQ matches topics by prefix, no tenant's name may be a prefix of
 * another's, nor of "default" or the other way round (create refuses it:
 * that tenant's subscriber would receive the other's batches).
 *
 * Limits against peers (with or without tenants): a subscription or a replay
 * request frame longer than a topic closes its connection unread
 * (ZMQ_MAXMSGSIZE); a ZMTP handshake completes within 5 s; past
 * max_subscribers / max_replay_clients connections at once one more is
 * refused in its handshake (the context's ZAP handler, fed by socket
 * monitors: one kvp_kvpub per process's ZeroMQ context, which is its own);
 * replay answers share the ring's batches by reference (stats.pinned_bytes).
 *
 * Binds both sockets (so a bad endpoint or a port in use is an error here,
 * named in err) and starts the publisher thread, which takes no
 * asynchronous signal. HOST is an IP address, an interface name or "*"
 * (ZMQ binds no host name: "localhost" is refused); PORT a number, 0 or "*"
 * (any free one). 0; KVP_EINVALID_PARAMS (no pub endpoint, one that is not
 * such text, a limit out of range, a tenant's name or token empty or over
 * 255 bytes, a name that is a prefix of another's); KVP_ENOMEM; KVP_EIO (the bind failed:
 * port in use, an address not of this host; or the thread could not
 * start). err (errlen bytes, may be NULL) says why. */
int kvp_kvpub_create(const kvp_kvpub_cfg *cfg, kvp_kvpub **out, char *err, size_t errlen);

/* From the master's loop thread (any thread may; batches go out in the
 * order their submits took the lock): one batch of topic (the tenant name,
 * topic_len bytes, 0..KVP_KVPUB_MAX_TOPIC, any bytes), seq (the caller's,
 * strictly increasing per topic: not checked), ts (unix seconds) and the
 * events ev[0..n), n >= 1. Copies what it needs and never waits for the
 * network: it takes a mutex held only for list and counter updates.
 * 0; KVP_EINVALID_PARAMS (n == 0, a topic too long, an event
 * kvp_kvev_encode refuses); KVP_ELIMIT when the batches submitted and not
 * yet sent would pass queue_bytes, or KVP_ENOMEM: the batch is then dropped
 * and counted (stats.dropped), which subscribers see as a gap in the
 * topic's seqs that replay cannot fill. */
int kvp_kvpub_submit(kvp_kvpub *p, const char *topic, size_t topic_len, uint64_t seq, double ts,
                     const kvp_kvev *ev, size_t n);

typedef struct kvp_kvpub_stats {
    uint64_t batches;          /* batches sent on PUB */
    uint64_t events;           /* kvp_kvev events in them (before merging) */
    uint64_t bytes;            /* their payload bytes */
    uint64_t dropped;          /* batches submitted and never sent: queue full, out of
                                  memory, an encoding above 1 GiB */
    uint64_t replays;          /* well-formed replay requests taken */
    uint64_t replayed_batches; /* batches sent in replay answers */
    uint64_t queued_bytes;     /* submitted, not yet sent (counted against queue_bytes) */
    uint64_t pinned_bytes;     /* batches gone from the replay ring but still held in the
                                  pipes of replay clients (bounded by buffer_bytes: past it
                                  a replay waits for them) */
    uint64_t subs_admitted;    /* tenants: subscriptions (and cancels) applied */
    uint64_t subs_refused;     /* tenants: subscriptions to another tenant's topic, or
                                  sent without a tenant: not applied */
    uint64_t replays_refused;  /* tenants: replay requests for another tenant's topic */
    uint64_t auth_refused;     /* tenants: handshakes refused for their credentials */
} kvp_kvpub_stats;
/* Thread-safe. */
void kvp_kvpub_stats_get(kvp_kvpub *p, kvp_kvpub_stats *st);

/* The endpoints actually bound (ZMQ_LAST_ENDPOINT: a port of 0 or "*" is the
 * real one), for logs and tests; "" for no replay socket. Valid until
 * kvp_kvpub_destroy. */
const char *kvp_kvpub_pub_endpoint(const kvp_kvpub *p);
const char *kvp_kvpub_replay_endpoint(const kvp_kvpub *p);

/* Sends what was submitted (for at most ~1 s; the rest is dropped, with a
 * warning), abandons a replay in progress, closes the sockets (unsent
 * messages kept at most 500 ms for their subscribers), joins the thread,
 * frees. No submit may run or follow. NULL is a no-op. */
void kvp_kvpub_destroy(kvp_kvpub *p);

/* A replay request as the ROUTER receives it, frames[0..nframes): either
 * vLLM's (client_id, "", start_seq) -- topic KVP_KVPUB_DEFAULT_TOPIC -- or
 * (client_id, "", topic, start_seq), start_seq 8 bytes big-endian,
 * client_id 1..255 bytes (a ZMQ routing id), topic at most
 * KVP_KVPUB_MAX_TOPIC bytes. 0 with *topic (borrowing frames[2], or the
 * static default) and *start_seq; KVP_EPROTOCOL for anything else. Pure
 * (no allocation, no I/O): the fuzzer's target. */
int kvp_kvpub_parse_replay(const kvp_bytes *frames, size_t nframes, kvp_bytes *topic,
                           uint64_t *start_seq);

#endif
