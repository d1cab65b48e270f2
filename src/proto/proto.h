/*
 * proto.h -- kvpool wire protocol: frames, the opcode table, message codecs.
 *
 * Frame = 24-byte header + body. All integers little-endian.
 *
 *   off size field
 *   0   2    magic      0x4B56 ("VK" on the wire)
 *   2   1    version    KVP_PROTO_VERSION
 *   3   1    flags      KVP_FLAG_*
 *   4   2    opcode     KVP_OP_*
 *   6   2    reserved   must be 0
 *   8   8    req_id     chosen by the requester, echoed in the response
 *   16  4    body_len   bytes after the header; <= the configured max frame
 *   20  4    status     response: 0 or a negative KVP_E* for the whole
 *                       request (then the body is empty or an error text);
 *                       request: must be 0
 *
 * Body fields: u8/u16/u32/u64, i32 (two's complement), bytes = u32 length +
 * raw bytes, str = bytes (UTF-8, not NUL-terminated), arrays = u32 count +
 * elements. Every batch operation answers one result per key, in order.
 *
 * Decoders never trust a count or a length: each is checked against the
 * bytes left and the limits in kvp_proto_limits, and a decoder consumes the
 * whole body (trailing bytes are an error). Decoded messages borrow key and
 * string bytes from the frame body and put their arrays in a kvp_arena: they
 * are valid until the body buffer or the arena is reused.
 */
#ifndef KVP_PROTO_H
#define KVP_PROTO_H

#include <stdint.h>

#include "common/buf.h"
#include "proto/auth.h"

#define KVP_PROTO_MAGIC 0x4B56u
#define KVP_PROTO_VERSION 4 /* 2: DISK_CMD / DISK_REPORT entries carry a record id,
                               PUT_START a soft pin's TTL; 3: the HELLO answer carries
                               the server's release; 4: AUTH_CHALLENGE, and HELLO
                               carries proofs (proto/auth.h), never a token */
#define KVP_FRAME_HDR 24

#define KVP_FLAG_RESPONSE 0x01 /* this frame answers req_id */
#define KVP_FLAG_ONEWAY 0x02   /* request wants no response (RELEASE) */

#define KVP_MAX_REPLICAS 3

/*
 * The one opcode table. XX(NAME, code, summary).
 */
#define KVP_OP_MAP(XX)                                                                 \
    XX(HELLO, 1, "version, client id, proofs of the credentials (after AUTH_CHALLENGE)") \
    XX(MOUNT_SEGMENT, 2, "mount segments (id, name host:port, capacity, endpoints)")   \
    XX(UNMOUNT_SEGMENT, 3, "unmount segments by id; objects on them are dropped")      \
    XX(HEARTBEAT, 4, "keep the client alive; answers the master's view")               \
    XX(PUT_START, 5, "allocate replicas for keys; object invisible until PUT_END")     \
    XX(PUT_END, 6, "publish keys with their checksums")                                \
    XX(PUT_REVOKE, 7, "abandon pending puts and free their space")                     \
    XX(GET, 8, "size, checksum, replicas and a read lease per key")                    \
    XX(RELEASE, 9, "end read leases early")                                            \
    XX(EXIST, 10, "1/0 per key; no side effects")                                      \
    XX(PREFIX, 11, "number of leading keys that exist")                                \
    XX(REMOVE, 12, "remove keys (force: even when leased or pinned)")                  \
    XX(REMOVE_ALL, 13, "remove every object of a tenant")                              \
    XX(STATS, 14, "counters and per-segment usage")                                    \
    XX(SEGMENT_INFO, 15, "name, capacity and endpoints of segments by id")         \
    XX(SEG_WRITE, 16, "storage node: write one replica (kvp_seg_io + bytes)")     \
    XX(SEG_READ, 17, "storage node: read one replica (kvp_seg_io -> bytes)")      \
    XX(SHM_ATTACH, 18, "storage node, unix socket: the segment's memfd (SCM_RIGHTS)") \
    XX(REMOVE_REGEX, 19, "remove a tenant's keys matching a POSIX extended regex") \
    XX(SEG_FREED, 20, "master -> node: freed allocations; their descriptors are revoked") \
    XX(REPLICA_BAD, 21, "a reader found replicas corrupt: the master drops them") \
    XX(SEG_FAILING, 22, "a client could not reach segments: no placement there until they heartbeat") \
    XX(DISK_CMD, 23, "master -> node: spill replicas to the SSD tier, load them back, forget records") \
    XX(DISK_REPORT, 24, "node -> master: spills durable, loads done, records held (after a mount), dropped") \
    XX(TIERS, 25, "per key: where it is (KVP_TIER_DRAM | KVP_TIER_DISK), 0 absent; no side effects") \
    XX(SEG_FREED_ACK, 26, "node -> master: SEG_FREED applied up to a seq, their transfers stopped") \
    XX(REPL_FOLLOW, 27, "standby -> leader: stream me the index (snapshot, then every change)") \
    XX(REPL_DATA, 28, "leader -> standby: index records (ha/repl.h)")                 \
    XX(REPL_ACK, 29, "standby -> leader: REPL_DATA applied up to a seq")             \
    XX(LOOKUP_HASHES, 30, "per chain of engine block hashes: leading blocks in DRAM, on disk, in either") \
    XX(KV_SNAPSHOT, 31, "a tenant's announced blocks (KV events) as of its stream's last seq") \
    XX(UCX_ATTACH, 32, "storage node: its UCX worker address and the segment's rkey (one-sided transfers)") \
    XX(EXIST_LEASE, 33, "per key: present (and then leased, as GET leases) and its size; a lookup that holds what it answered") \
    XX(CONFIGS, 34, "objects and bytes per configuration (the @cfg:<fp> of connector keys), per tenant") \
    XX(AUTH_CHALLENGE, 35, "before HELLO: nonces; the server proves the credentials the client holds")

enum kvp_op {
#define KVP__OP_ENUM(name, code, doc) KVP_OP_##name = (code),
    KVP_OP_MAP(KVP__OP_ENUM)
#undef KVP__OP_ENUM
    KVP_OP__MAX
};

/* "PUT_START" etc; NULL for an unknown opcode. */
const char *kvp_op_name(uint16_t op);

/* ------------------------------------------------------------------ frames */

typedef struct kvp_frame_hdr {
    uint8_t version;
    uint8_t flags;
    uint16_t op;
    uint64_t req_id;
    uint32_t body_len;
    int32_t status;
} kvp_frame_hdr;

/*
 * Decodes a header from at least KVP_FRAME_HDR bytes.
 * Returns 0, KVP_EPROTOCOL (bad magic, reserved != 0, request with a
 * non-zero status), KVP_EINVALID_VERSION (other version: the peer must be
 * told and disconnected) or KVP_ETOO_LARGE (body_len > max_frame).
 * The opcode is NOT checked here (the server answers KVP_EUNKNOWN_OP).
 */
int kvp_frame_hdr_decode(const uint8_t *p, uint32_t max_frame, kvp_frame_hdr *h);
void kvp_frame_hdr_encode(uint8_t *p, const kvp_frame_hdr *h);

/*
 * Starts a frame in `b`: writes a header with body_len 0 and returns the
 * offset of the header. kvp_frame_end patches body_len. The body is what
 * was appended in between.
 */
size_t kvp_frame_begin(kvp_buf *b, uint16_t op, uint8_t flags, uint64_t req_id, int32_t status);
void kvp_frame_end(kvp_buf *b, size_t hdr_off);

/*
 * Incremental frame reader over a stream. Feed bytes; take complete frames.
 * kvp_frame_next returns 1 and fills *h and *body when a whole frame is
 * available at the front of `in` (the body borrows from `in`: consume
 * KVP_FRAME_HDR + h->body_len bytes after use), 0 when more bytes are
 * needed, or a negative error from kvp_frame_hdr_decode.
 */
int kvp_frame_next(const uint8_t *in, size_t len, uint32_t max_frame, kvp_frame_hdr *h,
                   const uint8_t **body);

/* ------------------------------------------------------------------ limits */

typedef struct kvp_proto_limits {
    uint32_t max_key;     /* key bytes (default 4096) */
    uint32_t max_str;     /* tenant, names, endpoints, tokens (default 1024) */
    uint32_t max_batch;   /* elements per batch (default 1<<20) */
} kvp_proto_limits;

void kvp_proto_limits_default(kvp_proto_limits *l);

/* ---------------------------------------------------------------- messages */

#define KVP_SESSION_LEN 16 /* bytes of a session secret */

/*
 * AUTH_CHALLENGE request (proto/auth.h): the first frame on a connection
 * whose client holds a credential. Answered once per connection before
 * each HELLO; a second one before HELLO is refused (KVP_EPROTOCOL, close).
 */
typedef struct kvp_msg_challenge {
    uint32_t version;  /* KVP_PROTO_VERSION */
    kvp_bytes nonce;   /* KVP_AUTH_NONCE random bytes */
    uint8_t has;       /* KVP_AUTH_HAS bits: the credentials the client holds */
    kvp_bytes kid;     /* KVP_AUTH_KID bytes with a tenant credential, else empty */
} kvp_msg_challenge;

/* AUTH_CHALLENGE answer: a proof (KVP_AUTH_PROOF bytes) per credential the
 * client announced and the server holds; empty where it does not (the
 * client then refuses it, naming the credential). */
typedef struct kvp_msg_challenge_resp {
    kvp_bytes nonce;      /* KVP_AUTH_NONCE random bytes */
    uint64_t server_id;   /* the master id / the segment id */
    kvp_bytes proof[3];   /* KVP_AUTH_CLUSTER, KVP_AUTH_NODE, KVP_AUTH_TENANT */
} kvp_msg_challenge_resp;

/* HELLO request. client_id 0 is invalid. No token is ever sent: each
 * credential is shown by a client proof over the connection's challenge
 * (proto/auth.h); a HELLO without a challenge before it proves nothing. */
typedef struct kvp_msg_hello {
    uint32_t version;   /* KVP_PROTO_VERSION */
    uint64_t client_id; /* random per client process, non-zero */
    kvp_bytes name;     /* human-readable client name, e.g. "node host:port" */
    kvp_bytes proof[4]; /* client proofs (KVP_AUTH_PROOF bytes or empty), by
                           enum kvp_auth_cred: cluster token, node credential,
                           tenant credential, session secret (to open another
                           connection as an existing client_id: the secret the
                           master gave that client) */
} kvp_msg_hello;

/* HELLO response. */
#define KVP_SERVER_VERSION_MAX 31
typedef struct kvp_msg_hello_resp {
    uint32_t version;
    uint64_t master_id;       /* random per master start: a change means restart */
    uint32_t max_frame;
    uint32_t lease_ttl_ms;
    uint32_t client_ttl_ms;   /* heartbeat at least every client_ttl_ms / 3 */
    uint64_t now_ms;          /* the master's monotonic clock (descriptor expiry) */
    uint8_t session[KVP_SESSION_LEN]; /* the client's session secret (zeros from a node) */
    char server_version[KVP_SERVER_VERSION_MAX + 1]; /* the server's release ("0.1.0"):
                                 printable ASCII, NUL-terminated once decoded */
} kvp_msg_hello_resp;

/* Body of a HELLO answered KVP_EAUTH_BACKOFF (older peers see only the
 * status): the credential was checked and is wrong, and the address has
 * failed too often, so the answer came late. */
#define KVP_BACKOFF_ADDR_MAX 64
typedef struct kvp_msg_hello_backoff {
    uint32_t retry_ms; /* the address's back-off left when this was answered */
    kvp_bytes addr;    /* the address as the server saw it (text) */
} kvp_msg_hello_backoff;

typedef struct kvp_endpoint {
    kvp_bytes transport; /* "tcp", "shm", ... */
    kvp_bytes addr;      /* transport-specific address */
} kvp_endpoint;

typedef struct kvp_seg_desc {
    uint64_t id;       /* chosen by the node, non-zero, stable across remounts */
    kvp_bytes name;    /* "host:port"; used by preferred_segment */
    uint64_t capacity; /* bytes; rounded down to 4 KiB by the master */
    uint32_t n_endpoints;
    kvp_endpoint *endpoints;
    uint64_t secret;   /* MOUNT_SEGMENT only (never in SEGMENT_INFO): seeds
                          the replica tags the node verifies */
    uint32_t epoch;    /* MOUNT_SEGMENT only: the node's mount count, the
                          high half of generations of a fresh mount (a
                          remount of a segment the master holds keeps its
                          epoch) */
    uint64_t disk_capacity; /* MOUNT_SEGMENT only: bytes of the node's SSD tier,
                               0 = none (victims are dropped, not spilled) */
} kvp_seg_desc;

/* SEG_FAILING (ONEWAY): segment ids a client's transfers failed on (kvp_msg_ids). */

/* MOUNT_SEGMENT request; response = kvp_msg_results (one per segment). */
typedef struct kvp_msg_mount {
    uint32_t n;
    kvp_seg_desc *segs;
} kvp_msg_mount;

/* UNMOUNT_SEGMENT request; SEGMENT_INFO request. Response of UNMOUNT =
 * kvp_msg_results. */
typedef struct kvp_msg_ids {
    uint32_t n;
    uint64_t *ids;
} kvp_msg_ids;

/*
 * HEARTBEAT request: an empty body (a storage node; a client of an older
 * release), or a client's data-plane report (kvp_msg_heartbeat): u8
 * version (KVP_HB_REPORT_V1), u8 npaths (1..KVP_HB_MAX_PATHS), then per
 * path, in the order of client/xfer.h's kvp_xfer_path (shm, tcp, ucx, ...),
 * u64 put_bytes, get_bytes, put_ops, get_ops: what the client moved since
 * it took this client id, cumulative. The master keeps each client's last
 * report and adds a departed client's to its totals (master.c, "Data-path
 * reports"). A master that knows fewer paths ignores the others; one that
 * knows more reads 0 for those not sent. The codec takes only a report: an
 * empty body ("no report") is the handler's to accept. Another version
 * is refused (PROTOCOL), and the client then sends empty heartbeats. Sent
 * ONEWAY (a closing client's last report) it gets no answer.
 */
#define KVP_HB_REPORT_V1 1
#define KVP_HB_MAX_PATHS 16
#define KVP_HB_PATH_SIZE 32 /* bytes of one path's four u64 */
typedef struct kvp_path_tally {
    uint64_t put_bytes, get_bytes, put_ops, get_ops;
} kvp_path_tally;
typedef struct kvp_msg_heartbeat {
    uint8_t version; /* KVP_HB_REPORT_V1 */
    uint8_t npaths;  /* 1..KVP_HB_MAX_PATHS */
    kvp_path_tally paths[KVP_HB_MAX_PATHS];
} kvp_msg_heartbeat;

/* HEARTBEAT response: */
typedef struct kvp_msg_heartbeat_resp {
    uint64_t master_id;
    uint32_t n_segments; /* segments the master holds for this client; a node
                            that mounted more must remount */
    uint64_t now_ms;     /* the master's monotonic clock */
} kvp_msg_heartbeat_resp;

/* Per-key results: 0 / negative code, or 1/0 for EXIST. Also the response
 * of MOUNT, UNMOUNT, PUT_END, PUT_REVOKE, RELEASE, REMOVE, EXIST. */
typedef struct kvp_msg_results {
    uint32_t n;
    int32_t *codes;
} kvp_msg_results;

/* Requests that carry just a tenant and keys: PUT_REVOKE, GET, EXIST, PREFIX,
 * TIERS, EXIST_LEASE. */
typedef struct kvp_msg_keys {
    kvp_bytes tenant; /* empty = "default" */
    uint32_t n;
    kvp_bytes *keys;
} kvp_msg_keys;

/*
 * PUT_START flags. F_REPLACE: an upsert; the key's complete object, if any,
 * stays readable until this put's PUT_END replaces it in one step (a put
 * that fails or times out leaves it); a key being written is
 * REPLICA_IS_NOT_READY. Soft pins (evicted only after the tenant's unpinned
 * objects, until the pin ends): F_SOFT_PIN pins for soft_ttl_ms with
 * F_SOFT_TTL, else for the master's soft_pin_ttl (a TTL of 0 clears a pin);
 * F_SOFT_UNPIN clears it; neither keeps a replaced object's pin (a new key:
 * none). F_SOFT_TTL without F_SOFT_PIN, F_SOFT_PIN with F_SOFT_UNPIN, or a
 * TTL over soft_pin_max_ttl is INVALID_PARAMS for the request.
 */
#define KVP_PUT_PIN 0x1 /* never evicted; removed only with force */
#define KVP_PUT_F_REPLACE 0x2
#define KVP_PUT_F_SOFT_PIN 0x4
#define KVP_PUT_F_SOFT_UNPIN 0x8
#define KVP_PUT_F_SOFT_TTL 0x10
#define KVP_PUT_F_BLOCKS 0x20 /* each key carries a kvp_blkinfo (after its size) */
#define KVP_PUT_F__ALL 0x3f

/*
 * What a put tells about the engine's KV block a key holds one part of
 * (KVP_PUT_F_BLOCKS): the master indexes objects by (tenant, hash, group)
 * for LOOKUP_HASHES and publishes KV events for routers. A block is
 * `parts` objects (an engine's ranks each store their own); it is in a tier
 * when all of them are. Wire: u64 hash, u64 parent, u32 block_size, u16
 * parts, u8 group, u8 flags (KVP_BLK_*; unknown bits are an error).
 */
#define KVP_BLK_F_PARENT 0x1 /* parent is the previous block's hash */
#define KVP_BLK_F_NONE 0x2   /* no block for this key (the other fields are 0) */
#define KVP_BLK_SIZE 24
typedef struct kvp_blkinfo {
    uint64_t hash;        /* the engine's block hash (vLLM's int form) */
    uint64_t parent;      /* with KVP_BLK_F_PARENT */
    uint32_t block_size;  /* tokens per block, >= 1 */
    uint16_t parts;       /* objects that make the block, >= 1 */
    uint8_t group;        /* the engine's KV cache group */
    uint8_t flags;        /* KVP_BLK_F_* */
} kvp_blkinfo;
typedef struct kvp_msg_put_start {
    kvp_bytes tenant;
    uint32_t replicas;    /* 1..KVP_MAX_REPLICAS */
    uint32_t flags;       /* KVP_PUT_* */
    uint64_t soft_ttl_ms; /* with KVP_PUT_F_SOFT_TTL, else 0 */
    kvp_bytes preferred;  /* preferred segment name, empty = none */
    uint32_t n;
    kvp_bytes *keys;
    uint64_t *sizes;      /* bytes, > 0 */
    kvp_blkinfo *blocks;  /* with KVP_PUT_F_BLOCKS, one per key; else NULL */
} kvp_msg_put_start;

/* What a replica descriptor allows. PUT_START hands out WRITE descriptors,
 * GET READ ones; the storage node refuses the other operation. */
#define KVP_ACCESS_READ 1u
#define KVP_ACCESS_WRITE 2u

/*
 * Where one replica lives, and a capability to touch it. The client
 * writes/reads [offset, offset+length) of segment `segment_id`.
 * `generation` names this allocation: the master's per-segment counter in
 * the low 32 bits, the node's mount epoch in the high 32 (so generations
 * grow across remounts). `expires_ms` is on the master's monotonic clock
 * (the node learns the offset from HELLO and HEARTBEAT answers): the put
 * deadline for WRITE, the lease's end for READ.
 */
typedef struct kvp_replica {
    uint64_t segment_id;
    uint64_t offset;
    uint64_t length;
    uint64_t generation;
    uint64_t expires_ms;
    uint32_t access;     /* KVP_ACCESS_READ or KVP_ACCESS_WRITE */
    uint64_t tag;        /* kvp_replica_tag(segment secret, this replica):
                            lets the storage node check, without asking the
                            master, that the master issued this descriptor */
} kvp_replica;

/*
 * The tag of a descriptor: XXH3-64 of every other field seeded with the
 * segment's secret, which only the node and the master know (the node
 * chooses it and sends it in MOUNT_SEGMENT; SEGMENT_INFO never returns it).
 * It stops a client from reading or writing anything but allocations the
 * master handed out, with the operation it was handed out for, before it
 * expires. XXH3 is not a cryptographic MAC: this guards against bugs and
 * misbehaving clients inside a cluster, not against an attacker who can
 * observe many tags (see docs/SECURITY.md).
 */
uint64_t kvp_replica_tag(uint64_t secret, const kvp_replica *r);

typedef struct kvp_put_result {
    int32_t status;    /* 0, OBJECT_ALREADY_EXISTS, NO_AVAILABLE_HANDLE, ... */
    uint32_t n_replicas;
    kvp_replica replicas[KVP_MAX_REPLICAS];
} kvp_put_result;

typedef struct kvp_msg_put_start_resp {
    uint32_t n;
    kvp_put_result *results;
} kvp_msg_put_start_resp;

typedef struct kvp_msg_put_end {
    kvp_bytes tenant;
    uint32_t n;
    kvp_bytes *keys;
    uint64_t *checksums; /* XXH3-64 of the value */
} kvp_msg_put_end;

typedef struct kvp_get_result {
    int32_t status;     /* 0, OBJECT_NOT_FOUND, REPLICA_IS_NOT_READY, ...;
                           OBJECT_LOADING (only on the SSD tier: being staged
                           into DRAM, ask again) carries size and checksum */
    uint64_t size;
    uint64_t checksum;
    uint64_t lease_id;  /* give back with RELEASE */
    uint32_t n_replicas;
    kvp_replica replicas[KVP_MAX_REPLICAS];
} kvp_get_result;

typedef struct kvp_msg_get_resp {
    uint32_t lease_ttl_ms;
    uint32_t n;
    kvp_get_result *results;
} kvp_msg_get_resp;

/* RELEASE request: lease ids (kvp_msg_ids). */

typedef struct kvp_msg_prefix_resp {
    uint32_t count;
} kvp_msg_prefix_resp;

typedef struct kvp_msg_remove {
    kvp_bytes tenant;
    uint8_t force;
    uint32_t n;
    kvp_bytes *keys;
} kvp_msg_remove;

typedef struct kvp_msg_remove_all {
    kvp_bytes tenant;
    uint8_t force;
} kvp_msg_remove_all;

/* REMOVE_REGEX: the tenant's published keys matching `pattern` (POSIX
 * extended syntax, searched anywhere in the key). Answer: remove_all_resp. */
typedef struct kvp_msg_remove_regex {
    kvp_bytes tenant;
    uint8_t force;
    kvp_bytes pattern; /* 1 .. KVP_REGEX_MAX bytes, no NUL */
} kvp_msg_remove_regex;
#define KVP_REGEX_MAX 1024

typedef struct kvp_msg_remove_all_resp {
    uint64_t removed;
} kvp_msg_remove_all_resp;

/* STATS response. Counters are a count-prefixed u64 array so new counters
 * can be appended without breaking older readers (they ignore the tail). */
enum kvp_stat {
    KVP_STAT_OBJECTS = 0,    /* published objects */
    KVP_STAT_BYTES,          /* bytes of published objects (one copy) */
    KVP_STAT_CAPACITY,       /* sum of mounted segment capacities */
    KVP_STAT_USED,           /* allocated bytes (all replicas, pending too) */
    KVP_STAT_HITS,           /* GET keys found */
    KVP_STAT_MISSES,         /* GET keys not found */
    KVP_STAT_EVICTIONS,      /* objects evicted */
    KVP_STAT_EVICTED_BYTES,
    KVP_STAT_LEASES,         /* active read leases */
    KVP_STAT_PENDING,        /* pending puts */
    KVP_STAT_CLIENTS,        /* live clients */
    KVP_STAT_SEGMENTS,       /* mounted segments */
    KVP_STAT_PUT_TIMEOUTS,   /* pending puts reclaimed by put_timeout */
    KVP_STAT_PUT_REVOKED,    /* pending puts revoked (explicit, disconnect, unmount) */
    KVP_STAT_CLIENTS_EXPIRED,/* clients dropped by the liveness TTL */
    KVP_STAT_REQUESTS,       /* frames served */
    KVP_STAT_BAD_FRAMES,     /* frames refused as malformed */
    KVP_STAT_BAD_REPLICAS,   /* replicas dropped after a reader's checksum mismatch */
    /* the SSD tier */
    KVP_STAT_DISK_CAPACITY,  /* sum of mounted nodes' SSD tier bytes */
    KVP_STAT_DISK_OBJECTS,   /* objects with a durable disk record */
    KVP_STAT_DISK_BYTES,     /* their bytes */
    KVP_STAT_SPILLING,       /* objects being written to disk now */
    KVP_STAT_SPILLS,         /* DRAM victims made durable on disk */
    KVP_STAT_SPILL_FAILS,    /* spills the node could not do (the victim was dropped) */
    KVP_STAT_DISK_HITS,      /* GETs of objects only on disk (a load started) */
    KVP_STAT_LOADS,          /* loads back into DRAM done (promotions) */
    KVP_STAT_LOAD_FAILS,     /* loads that failed (record gone or corrupt: object dropped) */
    KVP_STAT_DISK_DROPPED,   /* records the disk tier dropped (room, corruption) */
    KVP_STAT_DISK_REGISTERED,/* records a node reported after mounting (warm restart) */
    KVP_STAT_SPILL_PRESSURE, /* put replicas refused (-200) while spills free the room */
    KVP_STAT_DISK_USED,      /* bytes of the nodes' page files (their last USAGE) */
    KVP_STAT_DISK_COMPACTED, /* bytes compaction moved (nodes' totals) */
    KVP_STAT_DISK_COMPACTED_PAGES, /* pages compaction reclaimed */
    KVP_STAT_DISK_DROPPED_PAGES,   /* pages dropped for room */
    KVP_STAT_SOFT_PINNED,    /* soft-pinned objects waiting on the soft lists (unleased) */
    /* a cluster of masters (ha/repl.h) */
    KVP_STAT_REPL_FOLLOWERS, /* standbys following the index now */
    KVP_STAT_REPL_IN_SYNC,   /* of them, those a PUT_END waits for (not lagging) */
    KVP_STAT_REPL_SEQ,       /* index records journaled to standbys so far */
    KVP_STAT_REPL_LAG,       /* records the furthest-behind standby has not acknowledged */
    KVP_STAT_REPL_BYTES,     /* bytes sent to standbys (snapshots and changes) */
    KVP_STAT_ADOPTED,        /* objects a takeover kept from the leader before */
    KVP_STAT_PARKED,         /* such objects still waiting for their node to mount */
    KVP_STAT_ADOPT_DROPPED,  /* such objects dropped (node never came back, space taken) */
    KVP_STAT_PUTS,           /* objects published (PUT_END done) */
    KVP_STAT_PUT_BYTES,      /* their bytes */
    KVP_STAT_HIT_BYTES,      /* bytes of the objects GET found (leases granted) */
    /* engine KV blocks (LOOKUP_HASHES, KV events) */
    KVP_STAT_BLOCK_OBJECTS,  /* objects put with a block (indexed by block hash) */
    KVP_STAT_BLOCK_CONFLICTS,/* puts whose block disagreed with their tenant's (stored without) */
    KVP_STAT_KV_EVENTS,      /* KV events recorded */
    KVP_STAT_KV_BATCHES,     /* KV event batches closed */
    KVP_STAT_KV_LOST,        /* KV events lost (no memory): gaps in their stream */
    /* what clients moved per data path (shm, tcp, ucx: kvp_xfer_path's
     * order), as their HEARTBEAT reports say: every client's last report,
     * live or departed, summed; KVP_STAT_PATH(path, field) */
    KVP_STAT_SHM_PUT_BYTES,  /* bytes clients wrote to segments over shared memory */
    KVP_STAT_SHM_GET_BYTES,  /* ... read */
    KVP_STAT_SHM_PUT_OPS,    /* replica writes */
    KVP_STAT_SHM_GET_OPS,    /* replica reads */
    KVP_STAT_TCP_PUT_BYTES,  /* the same over a node's TCP port */
    KVP_STAT_TCP_GET_BYTES,
    KVP_STAT_TCP_PUT_OPS,
    KVP_STAT_TCP_GET_OPS,
    KVP_STAT_UCX_PUT_BYTES,  /* the same over UCX */
    KVP_STAT_UCX_GET_BYTES,
    KVP_STAT_UCX_PUT_OPS,
    KVP_STAT_UCX_GET_OPS,
    KVP_STAT__COUNT
};
#define KVP_STAT_NPATHS 3 /* data paths with counters */
#define KVP_STAT_PATH_FIELDS 4 /* put_bytes, get_bytes, put_ops, get_ops */
#define KVP_STAT_PATH(path, field) (KVP_STAT_SHM_PUT_BYTES + KVP_STAT_PATH_FIELDS * (path) + (field))
/* Name of a counter ("objects", "hits", ...), as `kvpool stat --json` prints it. */
const char *kvp_stat_name(unsigned i);

typedef struct kvp_seg_stat {
    uint64_t id;
    kvp_bytes name;
    uint64_t capacity;
    uint64_t used;
    uint64_t objects;   /* replicas stored on it */
    uint64_t largest_free;
} kvp_seg_stat;

/* One tenant's standing in the pool (0 = no such limit). */
typedef struct kvp_tenant_stat {
    kvp_bytes name;
    uint64_t objects;     /* objects, pending ones too */
    uint64_t bytes;       /* value bytes of its objects, every tier */
    uint64_t pool_bytes;  /* DRAM its replicas hold (4 KiB pages) */
    uint64_t max_bytes;   /* quota on pool_bytes */
    uint64_t max_objects; /* quota on objects */
    uint64_t evictions;   /* victims taken from it */
    uint64_t refused;     /* put keys its quota refused */
    uint32_t share;       /* fair-share weight */
} kvp_tenant_stat;

/* STATS response: counters, segments, tenants (the tenants a session may
 * see, see the master). */
typedef struct kvp_msg_stats_resp {
    uint32_t n_counters;
    uint64_t *counters;  /* index by enum kvp_stat when < n_counters */
    uint32_t n_segs;
    kvp_seg_stat *segs;
    uint32_t n_tenants;
    kvp_tenant_stat *tenants;
} kvp_msg_stats_resp;

/*
 * CONFIGS response (the request body is empty): the configurations the
 * pool holds objects of, from the master's count (master/cfgtab.h). A row
 * with an fp is one configuration: tenant, name (the key text before
 * "@cfg:", "[cache_prefix@]<model>"), fp (12..32 lower-case hex digits),
 * its published objects and their value bytes. A row with an empty fp and
 * name is a tenant's "other": objects of configurations the master tracks
 * no row for (past its row limit). A tenant-bound session gets its
 * tenant's rows only. Rows with 0 objects are not sent.
 */
typedef struct kvp_config_stat {
    kvp_bytes tenant;
    kvp_bytes name;
    kvp_bytes fp;
    uint64_t objects;
    uint64_t bytes;
} kvp_config_stat;

typedef struct kvp_msg_configs_resp {
    uint32_t n;
    kvp_config_stat *rows;
} kvp_msg_configs_resp;

/* SEGMENT_INFO response. */
typedef struct kvp_seg_info {
    int32_t status;      /* 0 or SEGMENT_NOT_FOUND */
    kvp_seg_desc desc;
} kvp_seg_info;

typedef struct kvp_msg_seg_info_resp {
    uint32_t n;
    kvp_seg_info *infos;
} kvp_msg_seg_info_resp;

/*
 * REPLICA_BAD (ONEWAY): replicas whose bytes did not match the object's
 * checksum. The master drops each named replica if it is still the one
 * described (segment and generation); an object left without replicas is
 * removed, so a re-put can store it again.
 */
typedef struct kvp_bad_replica {
    kvp_bytes key;
    uint64_t segment_id;
    uint64_t generation;
} kvp_bad_replica;
typedef struct kvp_msg_replica_bad {
    kvp_bytes tenant;
    uint32_t n;
    kvp_bad_replica *bad;
} kvp_msg_replica_bad;
void kvp_enc_replica_bad(kvp_buf *b, const kvp_msg_replica_bad *m);
int kvp_dec_replica_bad(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                        kvp_msg_replica_bad *m);

/*
 * SEG_FREED (master -> node, ONEWAY, unsolicited on the node's master
 * connection): allocations of one segment whose descriptors the node must
 * revoke at once instead of at expiry -- freed ones (every descriptor), or
 * published ones (KVP_FREED_PUBLISHED: WRITE descriptors only; the object's
 * bytes are final). Body: u64 segment_id, u64 seq, u32 n, then n x (u32
 * page, u32 pages, u64 generation, u32 flags). `seq` numbers the last entry
 * (entries of a segment are numbered 1, 2, ... in the order they were
 * queued); the node answers SEG_FREED_ACK once it applied them and stopped
 * every transfer they revoke.
 *
 * SEG_FREED_ACK (node -> master, ONEWAY): kvp_msg_ids {segment_id, seq}.
 */
#define KVP_FREED_PUBLISHED 0x1u
typedef struct kvp_freed {
    uint32_t page, pages;
    uint64_t generation;
    uint32_t flags; /* KVP_FREED_* */
} kvp_freed;
typedef struct kvp_msg_seg_freed {
    uint64_t segment_id;
    uint64_t seq;
    uint32_t n;
    kvp_freed *freed;
} kvp_msg_seg_freed;
#define KVP_FREED_SIZE 20
void kvp_enc_seg_freed(kvp_buf *b, const kvp_msg_seg_freed *m);
int kvp_dec_seg_freed(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                      kvp_msg_seg_freed *m);

/*
 * The SSD tier's traffic between the master and a node (node/disk.h), both
 * ONEWAY: DISK_CMD unsolicited on the node's master connection, DISK_REPORT
 * from the node as a request. Body: u64 segment_id (the node's), u32 n, then
 * n x (u8 what, i32 status, bytes tenant, bytes key, u64 size, u64 checksum,
 * u32 page, u64 generation, u32 rec).
 *
 * `rec` names one disk record of the key: the low 32 bits of the sequence
 * number the node's disk store gave it (disk.h; unique per record and
 * increasing, kept in the record's header, so the same across a restart
 * and a compaction). A node keeps at most one record per key, the newest;
 * rec tells a record from an older or newer one of the same key.
 *   SPILL   copy the replica at page (generation) to disk; report SPILLED
 *           once durable (status 0) or failed
 *   LOAD    read the disk record into the allocation at page (generation):
 *           the master's staging copy; report LOADED
 *   FORGET  remove disk record rec of the key, and only it: a FORGET that
 *           names another record than the key's current one (size and
 *           checksum included) is ignored; no report
 *   SPILLED, LOADED  the outcome, page/generation as commanded; a durable
 *           SPILLED carries the new record's rec
 *   HAVE    a durable record the node holds (sent after every mount: a
 *           restarted node or master learns what the disk tier keeps)
 *   GONE    a record left the tier (dropped for room, or found corrupt)
 *   USAGE   the tier's own figures (key "usage"): size = bytes of page
 *           files, checksum = bytes compaction moved, generation = pages it
 *           reclaimed, page = pages dropped for room (totals since start)
 * rec is 0 in SPILL, LOAD, LOADED, USAGE and a failed SPILLED (decoders
 * refuse anything else there).
 */
enum {
    KVP_DISK_SPILL = 1,
    KVP_DISK_LOAD,
    KVP_DISK_FORGET,
    KVP_DISK_SPILLED,
    KVP_DISK_LOADED,
    KVP_DISK_HAVE,
    KVP_DISK_GONE,
    KVP_DISK_USAGE,
};
typedef struct kvp_disk_ent {
    uint8_t what;
    int32_t status;
    kvp_bytes tenant, key;
    uint64_t size, checksum;
    uint32_t page;
    uint64_t generation;
    uint32_t rec; /* FORGET, durable SPILLED, HAVE, GONE: the record; else 0 */
} kvp_disk_ent;
typedef struct kvp_msg_disk {
    uint64_t segment_id;
    uint32_t n;
    kvp_disk_ent *e;
} kvp_msg_disk;
/* bytes of one entry besides its tenant and key */
#define KVP_DISK_ENT_FIXED (1 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 4)
void kvp_enc_disk_ent(kvp_buf *b, const kvp_disk_ent *e);
void kvp_enc_disk(kvp_buf *b, const kvp_msg_disk *m);
int kvp_dec_disk(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                 kvp_msg_disk *m);

/*
 * Storage-node data operations. SEG_WRITE's body is the 56-byte kvp_seg_io
 * followed by exactly `length` value bytes (body_len == 56 + length);
 * SEG_READ's body is the kvp_seg_io alone and its answer's body the
 * `length` bytes. The replica fields are a descriptor from PUT_START/GET,
 * checked by the node against its bounds and the tag.
 * SHM_ATTACH (unix socket only): body u64 segment_id; answer body u64 size,
 * with the segment's memfd attached (SCM_RIGHTS) to the answer's bytes.
 */
/*
 * UCX_ATTACH (tcp and unix, after HELLO): body u64 segment_id. Answer: what
 * a client needs for one-sided transfers into the segment through UCX:
 * the node's UCP worker address and the packed remote key of the segment's
 * registration, which covers [base, base + size) of the node's address
 * space (client/cucx.h). A node without the transport answers
 * KVP_ENOT_SUPPORTED. The blobs are opaque to us, bounded by
 * KVP_UCX_BLOB_MAX each.
 */
#define KVP_UCX_BLOB_MAX 16384
typedef struct kvp_msg_ucx_attach {
    uint64_t base;  /* the segment's first byte in the node's address space */
    uint64_t size;  /* bytes the rkey covers */
    kvp_bytes addr; /* ucp_worker_get_address */
    kvp_bytes rkey; /* ucp_rkey_pack */
} kvp_msg_ucx_attach;
void kvp_enc_ucx_attach(kvp_buf *b, const kvp_msg_ucx_attach *m);
/* 0, or KVP_EPROTOCOL: truncated, trailing bytes, an empty or oversized
 * blob, size 0 or base + size wrapping. */
int kvp_dec_ucx_attach(const uint8_t *p, uint32_t len, kvp_msg_ucx_attach *m);

#define KVP_SEG_IO_SIZE 56
void kvp_enc_seg_io(kvp_buf *b, const kvp_replica *r);
/* Decodes the first 56 bytes of a body (len >= 56). 0 or KVP_EPROTOCOL. */
int kvp_dec_seg_io(const uint8_t *p, uint32_t len, kvp_replica *r);

/*
 * LOOKUP_HASHES: chains of engine block hashes (each a prefix in order, of
 * one group), answered per chain with how many leading blocks have every
 * part in DRAM, on disk, and in either (a part in DRAM or on disk: what a
 * load can read). Hashes of all chains together <= max_batch.
 */
typedef struct kvp_hchain {
    uint8_t group;
    uint32_t n;
    uint64_t *hashes;
} kvp_hchain;
typedef struct kvp_msg_lookup_hashes {
    kvp_bytes tenant;
    uint32_t n;
    kvp_hchain *chains;
} kvp_msg_lookup_hashes;
typedef struct kvp_hprefix {
    uint32_t dram, disk, any;
} kvp_hprefix;
typedef struct kvp_msg_lookup_hashes_resp {
    uint32_t n;
    kvp_hprefix *prefix;
} kvp_msg_lookup_hashes_resp;
void kvp_enc_lookup_hashes(kvp_buf *b, const kvp_msg_lookup_hashes *m);
int kvp_dec_lookup_hashes(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                          kvp_arena *a, kvp_msg_lookup_hashes *m);
void kvp_enc_lookup_hashes_resp(kvp_buf *b, const kvp_msg_lookup_hashes_resp *m);
int kvp_dec_lookup_hashes_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                               kvp_arena *a, kvp_msg_lookup_hashes_resp *m);

/*
 * KV_SNAPSHOT request: the tenant (kvp_msg_keys with no keys). Answer: u64
 * seq (the last batch of the tenant's event stream this reflects; 0 when
 * the master publishes no events, then the blocks are as they are), u32 n,
 * n x (u64 hash, u8 group, u8 tier: KVP_TIER_DRAM or KVP_TIER_DISK), one
 * entry per block and tier announced.
 */
typedef struct kvp_snap_blk {
    uint64_t hash;
    uint8_t group, tier;
} kvp_snap_blk;
typedef struct kvp_msg_kv_snapshot_resp {
    uint64_t seq;
    uint32_t n;
    kvp_snap_blk *blocks;
} kvp_msg_kv_snapshot_resp;
#define KVP_SNAP_BLK_SIZE 10
void kvp_enc_kv_snapshot_resp(kvp_buf *b, const kvp_msg_kv_snapshot_resp *m);
int kvp_dec_kv_snapshot_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                             kvp_arena *a, kvp_msg_kv_snapshot_resp *m);

/*
 * EXIST_LEASE: "a hit stays a hit until it is loaded". Request: kvp_msg_keys
 * (as EXIST). Answer: u32 lease_ttl_ms, u32 n, then n x (u8 state, u64 size,
 * u64 lease_id), one per key, in order:
 *   KVP_XL_ABSENT  no complete object (being written, or none): size and
 *                  lease_id 0
 *   KVP_XL_LEASED  complete with a readable DRAM replica: a read lease was
 *                  granted on it, a "hold" (master.c "leases"), so eviction
 *                  and a REMOVE without force skip the object until the next
 *                  GET of it takes the hold over as its own lease (it then
 *                  ends with that GET's RELEASE), or until the object's
 *                  leases expire, lease_ttl_ms after the latest one granted.
 *                  A key named k times in the request gets k holds (one per
 *                  reader that will GET it). lease_id: the object's lease
 *                  epoch, as GET answers it (a RELEASE of it ends one lease
 *                  of the object, a GET's while any is left). size > 0.
 *   KVP_XL_DISK    complete, only on a node's SSD tier (or being staged back):
 *                  no lease (a GET stages it; the tier may still drop the
 *                  record); size > 0, lease_id 0
 * A key answered absent or on disk gets no lease; nothing else changes (no
 * LRU touch, no hit counted, no descriptor handed out). An F_REPLACE put
 * still replaces a leased object (as it does one GET leased). The decoder
 * refuses another state, a present key of size 0 and an absent key with a
 * size or lease id.
 */
enum { KVP_XL_ABSENT = 0, KVP_XL_LEASED = 1, KVP_XL_DISK = 2 };
#define KVP_XL_ENT_SIZE 17 /* bytes of one answer entry */
typedef struct kvp_xl_ent {
    uint8_t state;     /* KVP_XL_* */
    uint64_t size;     /* the object's value bytes */
    uint64_t lease_id; /* LEASED: give back with RELEASE (optional: it expires) */
} kvp_xl_ent;
typedef struct kvp_msg_exist_lease_resp {
    uint32_t lease_ttl_ms;
    uint32_t n;
    kvp_xl_ent *ents;
} kvp_msg_exist_lease_resp;
void kvp_enc_exist_lease_resp(kvp_buf *b, const kvp_msg_exist_lease_resp *m);
int kvp_dec_exist_lease_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                             kvp_arena *a, kvp_msg_exist_lease_resp *m);

/* ----------------------------------------------------------------- codecs */
/*
 * enc: append the body (no frame header) to b; check b->err afterwards.
 * dec: parse a whole body; 0 or KVP_EPROTOCOL / KVP_ENOMEM (arena full).
 */
void kvp_enc_challenge(kvp_buf *b, const kvp_msg_challenge *m);
int kvp_dec_challenge(const uint8_t *p, uint32_t len, kvp_msg_challenge *m);
void kvp_enc_challenge_resp(kvp_buf *b, const kvp_msg_challenge_resp *m);
int kvp_dec_challenge_resp(const uint8_t *p, uint32_t len, kvp_msg_challenge_resp *m);
void kvp_enc_hello(kvp_buf *b, const kvp_msg_hello *m);
int kvp_dec_hello(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_msg_hello *m);
void kvp_enc_hello_resp(kvp_buf *b, const kvp_msg_hello_resp *m);
int kvp_dec_hello_resp(const uint8_t *p, uint32_t len, kvp_msg_hello_resp *m);
void kvp_enc_hello_backoff(kvp_buf *b, const kvp_msg_hello_backoff *m);
/* addr: at most KVP_BACKOFF_ADDR_MAX printable ASCII bytes, else KVP_EPROTOCOL. */
int kvp_dec_hello_backoff(const uint8_t *p, uint32_t len, kvp_msg_hello_backoff *m);

void kvp_enc_mount(kvp_buf *b, const kvp_msg_mount *m);
int kvp_dec_mount(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                  kvp_msg_mount *m);

void kvp_enc_ids(kvp_buf *b, const kvp_msg_ids *m);
int kvp_dec_ids(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                kvp_msg_ids *m);

/* enc: a version or npaths out of range sets b->err = KVP_EINVALID_PARAMS. */
void kvp_enc_heartbeat(kvp_buf *b, const kvp_msg_heartbeat *m);
int kvp_dec_heartbeat(const uint8_t *p, uint32_t len, kvp_msg_heartbeat *m);
void kvp_enc_heartbeat_resp(kvp_buf *b, const kvp_msg_heartbeat_resp *m);
int kvp_dec_heartbeat_resp(const uint8_t *p, uint32_t len, kvp_msg_heartbeat_resp *m);

void kvp_enc_results(kvp_buf *b, const kvp_msg_results *m);
int kvp_dec_results(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                    kvp_msg_results *m);

void kvp_enc_keys(kvp_buf *b, const kvp_msg_keys *m);
int kvp_dec_keys(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                 kvp_msg_keys *m);

void kvp_enc_put_start(kvp_buf *b, const kvp_msg_put_start *m);
int kvp_dec_put_start(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                      kvp_msg_put_start *m);
/* Server side writes results one by one: count first, then each result. */
void kvp_enc_put_result(kvp_buf *b, const kvp_put_result *r);
void kvp_enc_put_start_resp(kvp_buf *b, const kvp_msg_put_start_resp *m);
int kvp_dec_put_start_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                           kvp_arena *a, kvp_msg_put_start_resp *m);

void kvp_enc_put_end(kvp_buf *b, const kvp_msg_put_end *m);
int kvp_dec_put_end(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                    kvp_msg_put_end *m);

void kvp_enc_get_result(kvp_buf *b, const kvp_get_result *r);
void kvp_enc_get_resp(kvp_buf *b, const kvp_msg_get_resp *m);
int kvp_dec_get_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                     kvp_msg_get_resp *m);

void kvp_enc_prefix_resp(kvp_buf *b, const kvp_msg_prefix_resp *m);
int kvp_dec_prefix_resp(const uint8_t *p, uint32_t len, kvp_msg_prefix_resp *m);

void kvp_enc_remove(kvp_buf *b, const kvp_msg_remove *m);
int kvp_dec_remove(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                   kvp_msg_remove *m);

void kvp_enc_remove_all(kvp_buf *b, const kvp_msg_remove_all *m);
int kvp_dec_remove_all(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                       kvp_msg_remove_all *m);
void kvp_enc_remove_regex(kvp_buf *b, const kvp_msg_remove_regex *m);
int kvp_dec_remove_regex(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                         kvp_msg_remove_regex *m);
void kvp_enc_remove_all_resp(kvp_buf *b, const kvp_msg_remove_all_resp *m);
int kvp_dec_remove_all_resp(const uint8_t *p, uint32_t len, kvp_msg_remove_all_resp *m);

void kvp_enc_stats_resp(kvp_buf *b, const kvp_msg_stats_resp *m);
int kvp_dec_stats_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                       kvp_msg_stats_resp *m);

/* dec: an fp that is neither empty nor 12..32 of [0-9a-f], or a name with an
 * empty fp, is KVP_EPROTOCOL. */
void kvp_enc_configs_resp(kvp_buf *b, const kvp_msg_configs_resp *m);
int kvp_dec_configs_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l, kvp_arena *a,
                         kvp_msg_configs_resp *m);

void kvp_enc_seg_info_resp(kvp_buf *b, const kvp_msg_seg_info_resp *m);
int kvp_dec_seg_info_resp(const uint8_t *p, uint32_t len, const kvp_proto_limits *l,
                          kvp_arena *a, kvp_msg_seg_info_resp *m);

#endif
