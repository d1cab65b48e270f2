/*
 * kvpool.h -- public API of libkvpool.
 *
 * Conventions (apply to every function declared here):
 *  - Functions return int: 0 on success, a negative KVP_E* code on failure.
 *    The numbers match Mooncake Store's ErrorCode where the meaning is the
 *    same, so code written against Mooncake keeps working.
 *  - Handles are opaque; their lifetimes are stated next to the function
 *    that creates them.
 *  - Error text, where offered, goes into a caller buffer of fixed size.
 */
#ifndef KVPOOL_H
#define KVPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * KVP_API marks what libkvpool.so exports. The library is built with hidden
 * visibility by default, so nothing but the functions declared with it in
 * the public headers is visible to the dynamic linker.
 */
#ifndef KVP_API /* a build that embeds the core (the Python module) defines it empty */
#if defined(__GNUC__) || defined(__clang__)
#define KVP_API __attribute__((visibility("default")))
#else
#define KVP_API
#endif
#endif

/*
 * ABI rules (so callers built against an older header keep working):
 *  - A struct the caller fills and passes by pointer starts with
 *    `struct_size`, set by its kvp_*_init() to sizeof the struct the caller
 *    was compiled with; new fields are only ever appended, a later library
 *    reads a field only when struct_size covers it (else its default), and
 *    a struct_size no version of the library defined is refused.
 *  - kvp_iov is the exception: an element of arrays of thousands of pieces,
 *    it has the layout of struct iovec and is frozen.
 */

#define KVPOOL_VERSION_MAJOR 0
#define KVPOOL_VERSION_MINOR 1
#define KVPOOL_VERSION_PATCH 0
#define KVPOOL_VERSION_STRING "0.1.0"

/*
 * The one error table. XX(NAME, number, message).
 * Mooncake's numbers for shared meanings; kvpool's own codes live in the
 * -2000 range, outside both errno and Mooncake's ranges.
 */
#define KVP_ERRNO_MAP(XX)                                                      \
    XX(OK, 0, "success")                                                       \
    XX(INTERNAL_ERROR, -1, "internal error")                                   \
    XX(BUFFER_OVERFLOW, -10, "buffer too small")                               \
    XX(SEGMENT_NOT_FOUND, -101, "segment not found")                           \
    XX(SEGMENT_ALREADY_EXISTS, -102, "segment already exists")                 \
    XX(CLIENT_NOT_FOUND, -103, "client not found")                             \
    XX(NO_AVAILABLE_HANDLE, -200, "no space: nothing evictable would make room") \
    XX(INVALID_VERSION, -300, "protocol version not supported")                \
    XX(INVALID_KEY, -400, "invalid key")                                       \
    XX(WRITE_FAIL, -500, "write failed")                                       \
    XX(INVALID_PARAMS, -600, "invalid parameters")                             \
    XX(ILLEGAL_CLIENT, -601, "operation not allowed for this client")          \
    XX(INVALID_WRITE, -700, "invalid write")                                   \
    XX(INVALID_READ, -701, "invalid read")                                     \
    XX(INVALID_REPLICA, -702, "invalid replica")                               \
    XX(REPLICA_IS_NOT_READY, -703, "object is being written")                  \
    XX(OBJECT_NOT_FOUND, -704, "object not found")                             \
    XX(OBJECT_ALREADY_EXISTS, -705, "object already exists")                   \
    XX(OBJECT_HAS_LEASE, -706, "object has an active lease")                   \
    XX(LEASE_EXPIRED, -707, "lease expired")                                   \
    XX(TRANSFER_FAIL, -800, "transfer failed")                                 \
    XX(CHECKSUM_MISMATCH, -801, "checksum mismatch")                           \
    XX(RPC_FAIL, -900, "rpc failed")                                           \
    XX(RPC_TIMEOUT, -901, "rpc timed out")                                     \
    XX(NOT_SUPPORTED, -1012, "not supported")                                  \
    XX(FILE_NOT_FOUND, -1100, "file not found")                                \
    XX(FILE_OPEN_FAIL, -1101, "cannot open file")                              \
    XX(FILE_READ_FAIL, -1102, "cannot read file")                              \
    XX(FILE_WRITE_FAIL, -1103, "cannot write file")                            \
    XX(NOMEM, -2001, "out of memory")                                          \
    XX(PROTOCOL, -2002, "malformed message")                                   \
    XX(AUTH, -2003, "authentication failed: wrong cluster token")              \
    XX(TOO_LARGE, -2004, "message exceeds the maximum frame size")             \
    XX(CONFIG, -2005, "invalid configuration")                                 \
    XX(AGAIN, -2006, "try again")                                              \
    XX(IO, -2007, "i/o error")                                                 \
    XX(CLOSED, -2008, "connection closed")                                     \
    XX(UNKNOWN_OP, -2009, "unknown operation")                                 \
    XX(NO_HELLO, -2010, "HELLO required before any other operation")           \
    XX(LIMIT, -2011, "a configured limit was reached")                         \
    XX(OBJECT_PINNED, -2012, "object is pinned: remove it with force")         \
    XX(OBJECT_TOO_LARGE, -2013, "object larger than the pool can keep (max_object_size, low watermark)") \
    XX(DEVICE, -2014, "device memory error: the CUDA driver is missing or failed (see the log)") \
    XX(OBJECT_LOADING, -2015, "object is being read back from the SSD tier: ask again shortly") \
    XX(AUTH_BACKOFF, -2016, "authentication failed, and too many failed attempts from this address: answers are delayed (back-off)")

enum kvp_errno {
#define KVP__ERR_ENUM(name, num, msg) KVP_E##name = (num),
    KVP_ERRNO_MAP(KVP__ERR_ENUM)
#undef KVP__ERR_ENUM
};
#define KVP_OK KVP_EOK

/* Message for an error code; never NULL ("unknown error" for unknown codes). */
KVP_API const char *kvp_strerror(int err);
/* Symbolic name ("OBJECT_NOT_FOUND") for an error code; never NULL. */
KVP_API const char *kvp_err_name(int err);

/* Library version string, e.g. "0.1.0". */
KVP_API const char *kvp_version(void);


/* ======================================================== store client */
/*
 * kvp_client: a connection to a kvpool cluster (one master, any number of
 * storage nodes). Thread-safe: every call may be made from any number of
 * threads at once. Every call is bounded by the configured deadline
 * (`rpc_timeout`): a master or node that does not answer gives
 * KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT / KVP_ETRANSFER_FAIL, never a hang.
 *
 * Batch calls answer per key in `results`: bytes moved (>= 0) or a
 * negative KVP_E* code; the call itself returns 0 when it ran (check each
 * result) or a negative code when nothing was attempted.
 *
 * Values are checksummed (XXH3-64) on put and verified on get: a mismatch
 * is KVP_ECHECKSUM_MISMATCH for that key, never data; a get tries the next
 * replica when one fails. A put of an existing key succeeds without moving
 * bytes (keys are immutable; first writer wins).
 */
typedef struct kvp_client kvp_client;

/* A piece of caller memory. */
typedef struct kvp_iov {
    void *base;
    size_t len;
} kvp_iov;

/*
 * Creates a client. `config` is a JSON object text ("{...}"), or the path
 * of a JSON file, or NULL / "" for the file named by $KVPOOL_CONFIG /
 * $MOONCAKE_CONFIG_PATH (else defaults). Keys:
 * see docs/CONFIG.md (`master`, `mode` embedded | standalone-store,
 * `global_segment_size` contributed in embedded mode, `local_hostname`,
 * `rpc_timeout`, `cluster_token`, Mooncake's names accepted).
 * In embedded mode the client also hosts a segment and its server threads.
 * A `log_level` given in the configuration sets the process's log level
 * (one per process; the last client opened with the key wins; a client
 * without it leaves the level alone); $KVPOOL_LOG_LEVEL, when set, beats it.
 * 0 or a negative code, with a message in err (may be NULL).
 */
KVP_API int kvp_client_open(const char *config, kvp_client **out, char *err, size_t errlen);
/* Closes connections, unmounts an embedded segment, frees everything.
 * No call may be running. */
KVP_API void kvp_client_close(kvp_client *c);

/* Per key: 1 present, 0 absent, < 0 error. No side effects. */
KVP_API int kvp_client_exist(kvp_client *c, const char *const *keys, size_t n, int *results);
/* 1 when the configuration sets enable_offload (the pool has an SSD tier:
 * the connector then stages each load batch within 1280 MiB), else 0. */
KVP_API int kvp_client_offload(const kvp_client *c);
/* Per key: where the value is, 0 absent (or a bit set of KVP_TIER_DRAM, a
 * DRAM replica, and KVP_TIER_DISK, a durable record on a node's SSD tier),
 * or < 0. No side effects (a GET of a key only on disk stages it in DRAM;
 * this does not). */
#define KVP_TIER_DRAM 1
#define KVP_TIER_DISK 2
KVP_API int kvp_client_tiers(kvp_client *c, const char *const *keys, size_t n, int *results);
/*
 * A lookup that holds what it answered ("a hit stays a hit until it is
 * loaded"): per key, present_out[i] is
 *   KVP_TIER_DRAM (1)  present in DRAM, and now held: the master will not
 *                      evict it, nor remove it without force, until a get
 *                      of it takes the hold over as its read lease (and
 *                      ends it when done), or the master's lease_ttl
 *                      (default 5 s) after the latest lease on it -- so a
 *                      get within that time finds it (unless a put with
 *                      KVP_PUT_REPLACE replaced it). A key named k times
 *                      gets k holds: name it once per get that will follow
 *   KVP_TIER_DISK (2)  present only on the SSD tier: no lease (a get stages
 *                      it back)
 *   0                  absent (or still being written)
 *   < 0                an error for this key (a failed request: each of its keys)
 * and sizes_out[i] the value's size in bytes when present (else 0), so a
 * caller that knows what it will read can tell a stale or foreign value
 * from a hit. A hold no get takes over keeps the value from eviction for
 * lease_ttl: ask only for what will be read. A get without a lookup before
 * it may take over another caller's hold.
 * Returns 0 when it ran (check each key), KVP_ENOT_SUPPORTED when the master
 * is of a release without the operation (the results are not to be used:
 * ask kvp_client_exist instead), or another negative code when nothing was
 * attempted.
 */
KVP_API int kvp_client_exist_lease(kvp_client *c, const char *const *keys, size_t n,
                                   int *present_out, uint64_t *sizes_out);
/* How many values this client has read (successfully) that were only on a
 * node's SSD tier when asked for (the node staged them back into DRAM):
 * Mooncake's get_offload_rpc_read_count. Monotonic; thread-safe. */
KVP_API uint64_t kvp_client_disk_reads(const kvp_client *c);

/*
 * The data paths a transfer can take, so a user can see which one moved
 * the bytes: KVP_PATH_SHM (a same-host node's segment mapped into this
 * process: one memcpy, or a DMA for device memory), KVP_PATH_TCP (the
 * node's TCP port), KVP_PATH_UCX (one-sided UCX transfers: protocol "ucx"
 * or "rdma"). Paths are only ever appended: KVP_NPATHS may grow,
 * and kvp_transfer_stats with it (struct_size says how many the caller has).
 */
enum kvp_path { KVP_PATH_SHM = 0, KVP_PATH_TCP = 1, KVP_PATH_UCX = 2, KVP_NPATHS = 3 };
/* "shm", "tcp", "ucx"; NULL for a path this library does not know. */
KVP_API const char *kvp_path_name(int path);
typedef struct kvp_path_stats {
    uint64_t put_bytes; /* bytes written to segments (each replica counts) */
    uint64_t get_bytes; /* bytes read from segments */
    uint64_t put_ops;   /* replica writes that succeeded */
    uint64_t get_ops;   /* replica reads that succeeded */
} kvp_path_stats;
typedef struct kvp_transfer_stats {
    size_t struct_size;                /* sizeof(kvp_transfer_stats), from _init */
    kvp_path_stats path[KVP_NPATHS];   /* by enum kvp_path */
} kvp_transfer_stats;
KVP_API void kvp_transfer_stats_init(kvp_transfer_stats *s);
/*
 * What this client's data plane moved since kvp_client_open, per path:
 * every replica transfer that succeeded counts, once, under the path it
 * took (a put of 2 replicas counts twice; a put of an existing key moves
 * nothing and counts nothing; a read whose bytes then failed their checksum
 * counts, since the bytes moved). Monotonic; thread-safe; no request is
 * made. The pool's totals over every client are the master's
 * `client_<path>_<op>_<bytes|ops>` counters (kvp_client_stat), reported
 * with each heartbeat. 0, or KVP_EINVALID_PARAMS (out NULL, or a
 * struct_size no version of the library defined).
 */
KVP_API int kvp_client_stats(kvp_client *c, kvp_transfer_stats *out);
/* Number of leading keys present (>= 0), or < 0. */
KVP_API int64_t kvp_client_prefix(kvp_client *c, const char *const *keys, size_t n);

/*
 * Prefix lookup by engine block hashes (a router's question): nchains
 * chains, chain i the lens[i] hashes starting at hashes + sum(lens[0..i)),
 * of group groups[i] (groups NULL = all 0), each a prefix in order. out[i]:
 * how many leading blocks of chain i have every part in DRAM, on disk, and
 * in either (what a load can read). Blocks are those puts named with
 * kvp_put_opts.blocks, in the client's tenant. 0 or < 0.
 */
typedef struct kvp_hash_prefix {
    uint32_t dram, disk, any;
} kvp_hash_prefix;
KVP_API int kvp_client_lookup_hashes(kvp_client *c, const uint64_t *hashes, const size_t *lens,
                                     const uint8_t *groups, size_t nchains,
                                     kvp_hash_prefix *out);
/*
 * The client's tenant's blocks as the master's KV events announced them,
 * as of the batch numbered *seq of the tenant's event stream (0 when the
 * master publishes no events: then the blocks as they are): fn(arg, hash,
 * group, tier) once per block and tier (KVP_TIER_DRAM or KVP_TIER_DISK).
 * A router that missed events rebuilds from this, then applies the batches
 * after *seq. The count of calls, or < 0 (KVP_ETOO_LARGE: more blocks than
 * one answer can carry, see max_frame_size).
 */
typedef void (*kvp_snapshot_fn)(void *arg, uint64_t hash, unsigned group, unsigned tier);
KVP_API int64_t kvp_client_kv_snapshot(kvp_client *c, uint64_t *seq, kvp_snapshot_fn fn,
                                       void *arg);

/* Single values. put: 0 or < 0. get: bytes copied (<= cap), or < 0;
 * KVP_EBUFFER_OVERFLOW when cap is smaller than the value. */
KVP_API int kvp_client_put(kvp_client *c, const char *key, const void *buf, size_t len);
KVP_API int64_t kvp_client_get(kvp_client *c, const char *key, void *buf, size_t cap);
/* Size of a stored value, or < 0 (KVP_EOBJECT_NOT_FOUND). */
KVP_API int64_t kvp_client_size(kvp_client *c, const char *key);
/* Per key: the value's size (> 0) or < 0 (OBJECT_NOT_FOUND, ...); one
 * request for the batch. The call returns 0 when it ran. */
KVP_API int kvp_client_batch_size(kvp_client *c, const char *const *keys, size_t n,
                                  int64_t *results);

/* Each key's value is gathered from / scattered into its list of pieces
 * (iovs[i][0..niov[i])). A get needs the pieces' total to equal the value
 * size (else KVP_EBUFFER_OVERFLOW / KVP_EINVALID_PARAMS for that key). */
KVP_API int kvp_client_batch_put_from_multi_buffers(kvp_client *c, const char *const *keys,
                                            const kvp_iov *const *iovs, const size_t *niov,
                                            size_t n, int64_t *results);
KVP_API int kvp_client_batch_get_into_multi_buffers(kvp_client *c, const char *const *keys,
                                            const kvp_iov *const *iovs, const size_t *niov,
                                            size_t n, int64_t *results);
/* The same, but each key's pieces may hold more than its value: the value
 * fills them in order and its result is the value's size (a get into a
 * buffer "at least as large", as Mooncake's get_into). */
KVP_API int kvp_client_batch_get_into(kvp_client *c, const char *const *keys,
                                      const kvp_iov *const *iovs, const size_t *niov, size_t n,
                                      int64_t *results);

/*
 * Gets of values whose sizes the caller does not know, in one GET: once the
 * master answered, alloc(arg, m, idx, sizes, out) is called (on the calling
 * thread, once per request chunk) with the sizes of m keys (idx[j]: the
 * caller's index of key j; sizes[j]: its size, 0 when it was not found) and
 * sets out[idx[j]] to memory of sizes[j] bytes for each key it wants (base
 * NULL to skip one; a non-zero return skips all m). Results: bytes read, or
 * < 0 (KVP_ENOMEM for a key given no memory). Memory the callback gave for
 * a key whose read then failed is the callback's to free.
 */
typedef int (*kvp_get_alloc_fn)(void *arg, size_t m, const size_t *idx, const uint64_t *sizes,
                                kvp_iov *out);
KVP_API int kvp_client_batch_get_alloc(kvp_client *c, const char *const *keys, size_t n,
                                       kvp_get_alloc_fn alloc, void *arg, int64_t *results);

/*
 * Options of a put call (Mooncake's ReplicateConfig). kvp_put_opts_init()
 * sets the defaults and struct_size; set fields after it.
 */
#define KVP_PUT_HARD_PIN 0x1u /* never evicted; removed only with force */
/* Upsert: an existing value is replaced in one step when the new one is
 * complete; until then readers get the old one, and a put that fails leaves
 * it. A key that another put is writing: KVP_EREPLICA_IS_NOT_READY. */
#define KVP_PUT_REPLACE 0x2u
/* Soft pins: a soft-pinned object is evicted only after every unpinned
 * object of its tenant, and never by background eviction, until the pin
 * ends (soft_pin_ttl_ms from the put; -1 = the master's soft_pin_ttl, 30 min
 * by default; 0 clears a pin). SOFT_UNPIN clears it. With neither flag an
 * upsert keeps the replaced value's pin (a new key has none). A TTL without
 * SOFT_PIN, both flags, or a TTL over the master's soft_pin_max_ttl (24 h)
 * is KVP_EINVALID_PARAMS for every key. */
#define KVP_PUT_SOFT_PIN 0x4u
#define KVP_PUT_SOFT_UNPIN 0x8u
/*
 * The engine KV block a key holds one part of, for KV-aware routers: the
 * master indexes such objects by (tenant, hash, group) for
 * kvp_client_lookup_hashes and publishes KV events (kv_events). A block is
 * `parts` objects (an engine's ranks each store their own part); it counts
 * as held in a tier when all of them are. Every put of a group in a tenant
 * must agree on parts and block_size (one model per tenant): a put that
 * does not keeps its value but not its block.
 */
#define KVP_BLOCK_PARENT 0x1u /* parent is the previous block's hash */
#define KVP_BLOCK_NONE 0x2u   /* no block for this key */
typedef struct kvp_block {
    uint64_t hash;       /* the engine's block hash (vLLM's int form: the hash's last 8
                            bytes, big-endian) */
    uint64_t parent;     /* with KVP_BLOCK_PARENT */
    uint32_t block_size; /* tokens per block, >= 1 */
    uint16_t parts;      /* objects that make the block, >= 1 */
    uint8_t group;       /* the engine's KV cache group, 0..31 */
    uint8_t flags;       /* KVP_BLOCK_* */
} kvp_block;

typedef struct kvp_put_opts {
    size_t struct_size;            /* sizeof(kvp_put_opts), from kvp_put_opts_init */
    uint32_t replica_num;          /* copies on distinct segments, 1..3 (best effort when
                                      fewer segments exist); 0 = the client's replica_num */
    uint32_t flags;                /* KVP_PUT_* */
    const char *preferred_segment; /* host:port for the first copy; NULL = the client's
                                      default (config, env, own segment); "" = none */
    int64_t soft_pin_ttl_ms;       /* with KVP_PUT_SOFT_PIN: ms >= 0, or -1 (init) = none
                                      given; any other negative is KVP_EINVALID_PARAMS */
    const kvp_block *blocks;       /* NULL, or one per key: the block it is a part of (a
                                      bad one, e.g. group > 31, is KVP_EINVALID_PARAMS for
                                      its key) */
} kvp_put_opts;
KVP_API void kvp_put_opts_init(kvp_put_opts *o);

/* kvp_client_batch_put_from_multi_buffers with options; opts NULL = defaults.
 * A struct_size smaller than the first version's or larger than this
 * library's is KVP_EINVALID_PARAMS for the call. */
KVP_API int kvp_client_batch_put_opts(kvp_client *c, const char *const *keys,
                                      const kvp_iov *const *iovs, const size_t *niov, size_t n,
                                      const kvp_put_opts *opts, int64_t *results);

/* Records a caller memory range and what it is: host memory mapped
 * read-write in this process, or CUDA device memory (found once, here,
 * through the driver loaded at run time). Pieces of every put and get may
 * be device memory, registered or not (registered ranges skip the per-call
 * driver query); a device copy that fails is KVP_EDEVICE for its key.
 * Overlapping ranges, or memory that is neither: KVP_EINVALID_PARAMS.
 * Ordering: the library's copies run on its own CUDA streams, so a put
 * reads device memory as it is when the call is made: the caller first
 * makes sure kernels writing it are done (a stream synchronize, or an event
 * as the connector's fence waits on). A get returns once the bytes are in
 * device memory, visible to any work launched after it. */
KVP_API int kvp_client_register_buffer(kvp_client *c, void *base, size_t len);
KVP_API int kvp_client_unregister_buffer(kvp_client *c, void *base);
/* 0 when every piece v[0..n) lies inside one registered range (pieces of
 * length 0 included), else KVP_EINVALID_PARAMS. For callers that hand over
 * raw addresses (the Python package): a range never registered is refused
 * before any byte is touched. */
KVP_API int kvp_client_check_registered(kvp_client *c, const kvp_iov *v, size_t n);

/* remove: 0 or < 0 (OBJECT_NOT_FOUND, OBJECT_HAS_LEASE unless force).
 * remove_all: objects removed (>= 0) or < 0. */
KVP_API int kvp_client_remove(kvp_client *c, const char *key, int force);
KVP_API int64_t kvp_client_remove_all(kvp_client *c, int force);
/* Removes this tenant's keys matching a POSIX extended regular expression
 * (searched anywhere in the key; at most 1024 bytes); leased or pinned
 * objects only with force. Objects removed (>= 0), or < 0
 * (KVP_EINVALID_PARAMS for a pattern that does not compile). */
KVP_API int64_t kvp_client_remove_regex(kvp_client *c, const char *pattern, int force);
/* Per key: 0 removed, or < 0 (OBJECT_NOT_FOUND, OBJECT_HAS_LEASE, ...).
 * The call returns 0 when it ran, < 0 when nothing was attempted. */
KVP_API int kvp_client_batch_remove(kvp_client *c, const char *const *keys, size_t n,
                                    int force, int *results);

/* A human-readable description of a key's replicas and tier, e.g.
 * "size 4096; replica 1/1: segment 5f2a.. (node-a:7000) offset 8192 tier dram via shm".
 * Bytes written (excluding NUL) or < 0. */
KVP_API int kvp_client_describe(kvp_client *c, const char *key, char *buf, size_t len);

/* The same as JSON: {"key": K, "size": N, "replicas": [{"segment": "5f2a..",
 * "name": "node-a:7000", "offset": O, "length": L, "tier": "dram",
 * "transport": "shm"|"tcp"|"none"}, ...]}. Bytes written or < 0. */
KVP_API int kvp_client_describe_json(kvp_client *c, const char *key, char *buf, size_t len);

/* The master's counters and per-segment usage as JSON (the text of
 * `kvpool stat --json`). Bytes written (excluding NUL) or < 0;
 * KVP_EBUFFER_OVERFLOW when len is too small. */
KVP_API int kvp_client_stat(kvp_client *c, char *buf, size_t len);

/* This client's embedded segment name ("host:port", usable as a preferred
 * segment), or "" in standalone-store mode. Never NULL; lives as long as c. */
KVP_API const char *kvp_client_segment_name(const kvp_client *c);
/* The tenant this client's keys live in ("default" unless configured). */
KVP_API const char *kvp_client_tenant(const kvp_client *c);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_H */
