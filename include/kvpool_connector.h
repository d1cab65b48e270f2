/*
 * kvpool_connector.h -- the engine-side KV connector, for any inference
 * engine (vLLM's MooncakeStoreConnector semantics, in C).
 *
 * An engine has one SCHEDULER process and one WORKER per device rank
 * (tensor / pipeline / context parallel). The connector has a half for
 * each:
 *
 *   scheduler (kvp_conn_sched)           worker (kvp_conn_worker), per rank
 *   --------------------------           ----------------------------------
 *   get_num_new_matched_tokens  --lookup (unix socket)-->  rank 0 answers
 *   update_state_after_alloc
 *   build_meta  ==== step bytes (carried by the engine) ===>  get_finished
 *   request_finished  <== finished ids (all ranks agree) ==  (per rank)
 *                                        load_errors, take_stats/events
 *
 * Per engine step: the scheduler calls get_num_new_matched_tokens for each
 * waiting request (an asynchronous lookup may answer KVP_CONN_PENDING: ask
 * again next step), update_state_after_alloc for each request that got
 * blocks, then build_meta ONCE; the engine ships the returned bytes to
 * every worker. Each worker calls handle_preemptions (if the step preempted
 * requests) before the forward pass overwrites their blocks, runs the
 * forward pass, then get_finished with the step's bytes: that is where the
 * step's loads and stores are queued (the connector moves bytes on its own
 * threads) and where finished ids come back. The engine aggregates the
 * ranks' answers: a request is finished sending / receiving when EVERY rank
 * reported it. The ranks' answers depend only on the step bytes and the
 * finished lists, so every rank reports exactly the ids the scheduler's
 * request_finished delayed.
 *
 * The step bytes are a compact, versioned string (magic "KVCM" + version)
 * and are INCREMENTAL: each step only carries what is new for a request
 * since the last step that mentioned it. Every worker must therefore see
 * every step's bytes, in order, exactly once. A worker given bytes of
 * another version, or out of order, gets KVP_EINVALID_VERSION /
 * KVP_EPROTOCOL for that step: nothing of it is queued (no byte is ever
 * taken from a step it cannot decode) and its record of live requests is
 * dropped, so it cannot serve them any more -- a protocol bug in the
 * engine's transport of the bytes, to be treated as fatal for that engine.
 *
 * Blocks: the engine's KV cache is a set of tensors (kvp_conn_tensor) whose
 * blocks are indexed by block id; block tables are given per KV-cache group.
 * Block hashes (one per hash_block_size tokens, chained, vLLM's
 * hash_block_tokens) come from the engine as bytes; an engine without its
 * own can compute vLLM-compatible ones with kvp_conn_hasher.
 *
 * Conventions: int returns, 0 or a negative KVP_E* code (kvpool.h); every
 * pointer an engine passes is borrowed for the call only (the connector
 * copies what it keeps); handles are opaque. A scheduler handle is used by
 * one thread. A worker handle: get_finished, handle_preemptions,
 * load_errors, take_stats and take_events may be called from different
 * threads; open/register/close must not race with anything.
 *
 * Failure model (nothing is lost silently): a block whose load failed is
 * reported by kvp_conn_worker_load_errors (the engine recomputes it) no
 * later than the step its request is reported finished receiving; a failed
 * store is retried by a later step or simply absent from the pool (a later
 * lookup misses it); a lookup that cannot be answered in time is a hit of 0.
 * The pool being down, at open or later, is one of these failures, never an
 * engine's error (kvp_conn_pool_status_get).
 */
#ifndef KVPOOL_CONNECTOR_H
#define KVPOOL_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_CONN_API_VERSION 1

/* get_num_new_matched_tokens: the asynchronous lookup is not answered yet. */
#define KVP_CONN_PENDING 1

enum kvp_conn_role {
    KVP_CONN_PRODUCER = 0, /* stores KV, also loads (vLLM kv_producer) */
    KVP_CONN_CONSUMER = 1, /* loads only (kv_consumer); stores decode-phase KV
                              only with save_decode_cache */
    KVP_CONN_BOTH = 2,     /* kv_both */
};

enum kvp_conn_group_kind {
    KVP_CONN_FULL_ATTENTION = 0,
    KVP_CONN_SLIDING_WINDOW = 1,
    KVP_CONN_MAMBA = 2, /* Mamba "align" mode: the state at block boundaries */
};

/* One KV-cache group, in the engine's group order (the same on every
 * instance sharing the pool: group indices are part of the keys). */
typedef struct kvp_conn_group {
    int kind;                /* enum kvp_conn_group_kind */
    uint32_t block_size;     /* tokens per block of this group (already scaled
                                by the engine for PCP / DCP) */
    uint32_t sliding_window; /* SLIDING_WINDOW only: window in tokens */
    bool mla;                /* attention group stores one MLA latent (identical
                                on every TP rank: written once, read by all) */
    uint32_t num_kv_heads;   /* attention groups: total KV heads (GQA); when
                                tp_size > num_kv_heads, ranks holding the same
                                head share keys. 0 = tp_size */
    bool is_eagle;           /* the EAGLE drafter's group */
    uint64_t reserved[2];    /* zero: room for fields to come (checked at open) */
} kvp_conn_group;

/*
 * Engine memory fence, called by the store thread right before it reads
 * engine memory for blocks the engine computed in `step` (the value of
 * kvp_conn_worker_step() when that step's get_finished ran). Return 0 once
 * every write the engine issued for that step is visible (e.g. after
 * synchronising a CUDA event recorded after the step's forward pass),
 * non-zero to abandon the store (the blocks are retried by a later step).
 */
typedef int (*kvp_conn_fence_fn)(void *arg, uint64_t step);

typedef struct kvp_conn_config {
    size_t struct_size;       /* sizeof(kvp_conn_config), set by kvp_conn_config_default;
                                 fields are only ever appended (kvpool.h, ABI rules) */
    /* ---- both halves */
    const char *model;        /* model name or path; keys use its basename */
    int role;                 /* enum kvp_conn_role, default BOTH */
    const kvp_conn_group *groups;
    size_t ngroups;           /* 1..64 */
    uint32_t hash_block_size; /* tokens per block hash (vLLM's
                                 hash_block_size); several groups: 0 = gcd of
                                 their block sizes, else it must divide every
                                 one; one group: its block size (vLLM's rule) */
    uint32_t block_size;      /* scheduler block size; 0 = lcm of the groups */
    bool enable_lookup;       /* default true; false with CONSUMER = capacity-only */
    bool load_async;          /* must stay true (the default): loads run in the
                                 background and the request waits for
                                 finished_recving; false is refused */
    bool lookup_async;        /* default false: a lookup may answer PENDING */
    bool partial_hash_hits;   /* hits at hash_block_size granularity below a
                                 block boundary (default false) */
    const char *cache_prefix; /* key namespace prefix; NULL/"" = none */
    const char *lookup_socket; /* unix socket of the lookup channel (served by
                                  worker rank 0; the scheduler connects) */
    uint32_t lookup_timeout_ms; /* 0 = 2000: a late answer is a hit of 0 */
    /* ---- worker half */
    const char *store_config; /* kvp_client_open config: JSON text or file;
                                 required by the worker half; the scheduler
                                 half reads only its "log_level" (optional) */
    int tp_size, tp_rank;     /* sizes >= 1, 0 <= rank < size */
    int pp_size, pp_rank;
    int pcp_size, pcp_rank;
    int dcp_size, dcp_rank;
    bool use_eagle;           /* speculative decoding with an EAGLE drafter */
    size_t num_blocks;        /* blocks per registered KV tensor */
    unsigned recv_threads;    /* load threads; 0 = 2 */
    uint64_t staging_budget;  /* bytes one load batch may stage; 0 = no split */
    bool kv_events;           /* record BlockStored events */
    kvp_conn_fence_fn fence;  /* NULL: engine memory is always coherent */
    void *fence_arg;
    /* ---- both halves */
    int64_t lookup_gid;       /* -1 (default): the lookup channel talks to our own uid only;
                                 a gid: also to processes whose (primary) gid it is, and
                                 the socket file is 0660 of that group (rank 0 must be a
                                 member). Both halves need the same value. */
    /* ---- worker half */
    bool pool_blocks;         /* default true: each put tells the pool which engine block
                                 the key is a part of (kvp_block: the pool's
                                 kvp_client_lookup_hashes and KV events) */
    const int *engine_group_ids; /* per group: the engine's index of it, as its own KV
                                 events name it (group_idx); NULL = the position in
                                 groups; a group over 31 is stored without its block */
    /* ---- both halves (appended after the first layout: a struct_size that
     *      ends before them reads as NULL) */
    const char *config_fingerprint; /* NULL/"" = none; else 12..32 lower-case hex digits
                                 naming everything that shapes the KV bytes (model
                                 weights, dtypes, block sizes, parallel layout): every
                                 key gets "@cfg:<fp>" after the model name, so engines
                                 of different configurations never load each other's
                                 blocks. kvpool.vllm computes it (README, "Use with
                                 vLLM"); another engine chooses its own */
    const char *config_description; /* worker half, with config_fingerprint: text (JSON)
                                 worker rank 0 of a storing role puts (at its first store
                                 once the pool is reachable, then every 10 min), soft-pinned,
                                 under "[cache_prefix@]<model>@cfg:<fp>@kvpool-config"
                                 for people reading the pool; NULL/"" = none; at most
                                 KVP_CONN_DESCRIPTION_MAX bytes */
    /* ---- both halves (appended after the second layout: a struct_size that
     *      ends before it reads as false) */
    bool save_decode_cache;   /* default false: KV of the decode phase is not stored.
                                 true: full blocks produced during decode are stored
                                 too, under the request's chained block hashes (so a
                                 prompt equal to prompt + generated text hits them),
                                 by every role: a CONSUMER then stores the prompt
                                 blocks the pool lacks and its decode blocks, from
                                 its first decode step (vLLM's in-tree connector's
                                 save_decode_cache). Both halves need the same value */
    /* ---- worker half (the third layout too) */
    bool tp_independent;      /* default false. true: the TP-independent layout -- one
                                 object per KV head (an MLA latent: one) and block, keyed
                                 "@kvh:<head>" instead of "@tp_rank:<rank>", so engines
                                 of any TP size share blocks (every rank reads and writes
                                 only its own heads; ranks holding the same head store
                                 each block once). Needs dcp_size 1, no Mamba group,
                                 num_kv_heads a multiple or a divisor of tp_size, and KV
                                 tensors with one heads dimension (docs/ARCHITECTURE.md,
                                 "TP-independent layout") */
} kvp_conn_config;

#define KVP_CONN_DESCRIPTION_MAX 65536

/* Fills the defaults above (role BOTH, lookup on, async loads, every size 1). */
KVP_API void kvp_conn_config_default(kvp_conn_config *c);

/* ================================================================ scheduler */

typedef struct kvp_conn_sched kvp_conn_sched;

/* A string that need not be NUL-terminated. */
typedef struct kvp_conn_str {
    const char *p;
    uint32_t len;
} kvp_conn_str;

/* The block ids of one group (0 = vLLM's null block: not stored / loaded). */
typedef struct kvp_conn_blocks {
    const uint32_t *ids;
    uint32_t n;
} kvp_conn_blocks;

/*
 * A request as the engine sees it now.
 *   tokens / num_tokens: prompt + generated tokens (no unverified drafts).
 *   prompt_tokens / num_prompt_tokens: the prefill tokens.
 *   num_computed_tokens: tokens whose KV is computed before this step.
 *   block_hashes: nhashes * hash_len bytes, one per hash_block_size tokens,
 *       append-only across calls for one request.
 */
typedef struct kvp_conn_request {
    kvp_conn_str id;
    const uint32_t *tokens;
    uint32_t num_tokens;
    const uint32_t *prompt_tokens;
    uint32_t num_prompt_tokens;
    uint64_t num_computed_tokens;
    const uint8_t *block_hashes;
    uint32_t nhashes;
    uint8_t hash_len;
    uint64_t reserved[2]; /* zero: room for fields to come */
} kvp_conn_request;

/* A request scheduled for the first time (its whole block table). */
typedef struct kvp_conn_new_req {
    const kvp_conn_request *req;
    uint64_t num_scheduled_tokens;
    const kvp_conn_blocks *blocks; /* ngroups tables */
    uint32_t ngroups;
} kvp_conn_new_req;

/* A request scheduled again. resumed (after preemption): blocks is the FULL
 * table; running: the blocks added this step (NULL / 0 = none). */
typedef struct kvp_conn_cached_req {
    const kvp_conn_request *req;
    bool resumed;
    uint64_t num_scheduled_tokens; /* may include speculative drafts */
    const kvp_conn_blocks *blocks;
    uint32_t ngroups;
} kvp_conn_cached_req;

/*
 * A boundary state the engine hands off (vLLM 0.33's
 * kv_connector_block_state.boundary_state_offloads entry): block
 * cow_block_id of Mamba group `group` holds the state after exactly
 * boundary_tokens tokens (a multiple of hash_block_size). It is stored under
 * that boundary's hash for the group -- the block itself, never one found by
 * position -- so a later request can resume there. Entries of other groups,
 * of the null block (0), or past the request's prefill end are ignored.
 * The engine must keep the block's bytes unchanged until the request is
 * reported finished sending (kvp_conn_request_finished delays its free) or,
 * when it frees such a block earlier, until then by its own reference.
 */
typedef struct kvp_conn_tail {
    uint32_t group;
    uint32_t cow_block_id;
    uint64_t boundary_tokens;
} kvp_conn_tail;

typedef struct kvp_conn_tail_req {
    kvp_conn_str id;
    const kvp_conn_tail *tails;
    uint32_t ntails;
} kvp_conn_tail_req;

/* One scheduler step (vLLM's SchedulerOutput, the parts the connector uses). */
typedef struct kvp_conn_step {
    const kvp_conn_new_req *new_reqs;
    uint32_t n_new;
    const kvp_conn_cached_req *cached;
    uint32_t n_cached;
    const kvp_conn_str *preempted; /* preempted this step */
    uint32_t n_preempted;
    const kvp_conn_str *finished;  /* finished since the last step */
    uint32_t n_finished;
    const kvp_conn_tail_req *tails;
    uint32_t n_tails;
    uint64_t reserved[4]; /* zero: room for fields to come */
} kvp_conn_step;

/*
 * Opens the scheduler half (connects the lookup channel lazily). Errors:
 * KVP_EINVALID_PARAMS with a message in err (bad sizes or groups, lookup on
 * without lookup_socket), KVP_ENOMEM, KVP_EIO.
 */
KVP_API int kvp_conn_sched_open(const kvp_conn_config *c, kvp_conn_sched **out, char *err,
                        size_t errlen);
KVP_API void kvp_conn_sched_close(kvp_conn_sched *s);

/*
 * External tokens the pool can provide beyond the engine's local hit of
 * num_computed_tokens: 0 with *num_new (0 when nothing to load) and
 * *load_async; KVP_CONN_PENDING when an asynchronous lookup is in flight.
 */
KVP_API int kvp_conn_get_num_new_matched_tokens(kvp_conn_sched *s, const kvp_conn_request *r,
                                        uint64_t num_computed_tokens, uint64_t *num_new,
                                        bool *load_async);

/* After the engine allocated blocks for r: num_external_tokens is what it
 * accepted (0 cancels the load). */
KVP_API int kvp_conn_update_state_after_alloc(kvp_conn_sched *s, const kvp_conn_request *r,
                                      const kvp_conn_blocks *blocks, uint32_t ngroups,
                                      uint64_t num_external_tokens);

/* The step's bytes for the workers; valid until the next call on s. */
KVP_API int kvp_conn_build_meta(kvp_conn_sched *s, const kvp_conn_step *st, const uint8_t **bytes,
                        size_t *len);

/*
 * The engine finished (or aborted) a request. *delay_free true: keep its
 * blocks until its id is in finished_sending: it has stores to finish, or
 * it loaded (a load may still be writing into its blocks; every rank
 * reports it once its load ended, usually at the next step).
 */
KVP_API int kvp_conn_request_finished(kvp_conn_sched *s, kvp_conn_str id, const kvp_conn_blocks *blocks,
                              uint32_t ngroups, bool *delay_free);

/*
 * Finish-time hand-off (vLLM 0.33's register_finished_partial_tail), called
 * when the engine finishes request id, BEFORE kvp_conn_request_finished:
 * tails are its last boundary states (Mamba groups, one boundary for all),
 * blocks its block table. When usable (a producer, a scheduled request with
 * some block, the boundary within its prefill, no null block, Mamba groups
 * only) the store is queued for the next kvp_conn_build_meta (with the other
 * groups' sub-block tail blocks, as at step time), *queued is true and the
 * request_finished that follows answers delay_free (its blocks are kept until
 * every rank reports it finished sending). Tails of two boundaries:
 * KVP_EINVALID_PARAMS.
 */
KVP_API int kvp_conn_register_finished_tail(kvp_conn_sched *s, kvp_conn_str id,
                                            const kvp_conn_blocks *blocks, uint32_t ngroups,
                                            const kvp_conn_tail *tails, uint32_t ntails,
                                            bool *queued);

/*
 * The engine learnt (from the workers' load_errors / load_failed, aggregated)
 * that loads failed: the requests named in ids (n of them), and those whose
 * allocated load blocks include one of blocks, miss on every later lookup
 * until they finish, so the engine recomputes them rather than retrying a
 * hit that just failed. Unknown ids and blocks are ignored.
 */
KVP_API int kvp_conn_loads_failed(kvp_conn_sched *s, const kvp_conn_str *ids, uint32_t n,
                                  const uint32_t *blocks, size_t nblocks);

/* Forgets pending loads, drains the workers' stores, then empties the pool
 * (every object of every model). true when the pool was emptied. The engine
 * must have paused generation. */
KVP_API bool kvp_conn_reset_cache(kvp_conn_sched *s);

/* ================================================================== worker */

typedef struct kvp_conn_worker kvp_conn_worker;

/* A KV-cache tensor as the engine describes it (torch conventions). */
#define KVP_CONN_MAX_DIMS 8
typedef struct kvp_conn_tensor {
    void *base;         /* untyped storage pointer */
    size_t storage_len; /* bytes of the storage */
    size_t elem_size;
    int ndim;
    size_t shape[KVP_CONN_MAX_DIMS];
    size_t stride[KVP_CONN_MAX_DIMS]; /* in elements */
    uint64_t reserved[2];             /* zero: room for fields to come (checked) */
} kvp_conn_tensor;

/* A growable set of NUL-terminated ids owned by the caller's struct.
 * Zero-initialise; free with kvp_conn_ids_free. */
typedef struct kvp_conn_ids {
    char **ids;
    size_t n, cap;
} kvp_conn_ids;
KVP_API void kvp_conn_ids_free(kvp_conn_ids *s);

/*
 * Opens the worker half of one rank: connects to the store (store_config),
 * and on rank 0 of every dimension serves the lookup channel on
 * lookup_socket. A store that cannot be reached (KVP_ERPC_FAIL /
 * KVP_ERPC_TIMEOUT) is no error: the worker opens detached (one warning; see
 * kvp_conn_pool_status_get). Errors with a message in err: KVP_EINVALID_PARAMS,
 * KVP_ECONFIG, the store's other open errors (a refused credential,
 * KVP_EAUTH; a host name that does not resolve), KVP_EIO, KVP_ENOMEM.
 */
KVP_API int kvp_conn_worker_open(const kvp_conn_config *c, kvp_conn_worker **out, char *err,
                         size_t errlen);
/* Finishes queued transfers, stops the threads, closes the store. NULL ok. */
KVP_API void kvp_conn_worker_close(kvp_conn_worker *w);

/* Once, after the KV cache is allocated: layout detection (blocks-first,
 * K/V-first, cross-layer), registration with the store, threads started. */
KVP_API int kvp_conn_register_kv_caches(kvp_conn_worker *w, const kvp_conn_tensor *t, size_t n);

/* Before the forward pass of a step that preempted requests: returns once
 * no store of theirs reads their blocks any more. */
KVP_API int kvp_conn_handle_preemptions(kvp_conn_worker *w, const char *const *ids, size_t n);

/*
 * After the forward pass: decodes the step's bytes (bytes NULL = no step),
 * queues its loads and stores, and appends to done_sending / done_recving
 * the ids finished storing / loading. finished: ids the engine finished
 * since the last call. Bytes that cannot be decoded: KVP_EPROTOCOL /
 * KVP_EINVALID_VERSION (nothing of that step is queued).
 */
KVP_API int kvp_conn_get_finished(kvp_conn_worker *w, const uint8_t *bytes, size_t len,
                          const char *const *finished, size_t nfinished,
                          kvp_conn_ids *done_sending, kvp_conn_ids *done_recving);

/* The step number the next get_finished gives its stores (the fence's
 * `step`; 1 for the first call): record the step's fence under it. */
KVP_API uint64_t kvp_conn_worker_step(kvp_conn_worker *w);

/* Takes the block ids whose load failed (*ids freed with kvp_conn_free). */
KVP_API int kvp_conn_load_errors(kvp_conn_worker *w, uint32_t **ids, size_t *n);

/* Appends to out the ids of requests with a failed load since the last call
 * (the same failures as load_errors, per request: for engines whose block ids
 * are not unique across groups, e.g. vLLM with several KV-cache groups). An
 * id is taken no later than the get_finished that reports it done_recving. */
KVP_API int kvp_conn_load_failed(kvp_conn_worker *w, kvp_conn_ids *out);
KVP_API void kvp_conn_free(void *p);

/* Waits until every queued load and store has run (shutdown, tests). */
KVP_API void kvp_conn_worker_drain(kvp_conn_worker *w);

/* Per-operation counters since the last take (then reset). existing_keys:
 * STORE, keys already in the pool (nothing moved); LOOKUP, keys of a hit
 * whose value has another size than a load of this rank reads (misses). */
enum kvp_conn_op { KVP_CONN_OP_STORE = 0, KVP_CONN_OP_LOAD = 1, KVP_CONN_OP_LOOKUP = 2,
                   KVP_CONN_OP_COUNT };
typedef struct kvp_conn_op_stats {
    uint64_t count, total_ns, max_ns, keys, bytes, failed_keys, existing_keys, partial, errors;
} kvp_conn_op_stats;
typedef struct kvp_conn_stats {
    kvp_conn_op_stats op[KVP_CONN_OP_COUNT];
} kvp_conn_stats;
/* 1 if anything was recorded since the last take, else 0. */
KVP_API int kvp_conn_take_stats(kvp_conn_worker *w, kvp_conn_stats *out);

/*
 * The pool's availability as this worker sees it. The engine outlives the
 * pool: a worker whose pool cannot be reached when it opens (nothing
 * listens, no answer within rpc_timeout) opens anyway, "detached", and
 * attaches in the background once the master answers; one that loses the
 * pool later carries on without it and reconnects the same way (retried
 * every 0.5 s, backing off to 10 s). While the pool is unavailable a lookup
 * is a hit of 0, a store is skipped, a load fails at once (its blocks are
 * reported by kvp_conn_load_errors: the engine recomputes them); nothing
 * waits for the pool. The log says it once per outage, and once when it
 * ends. Counters count since open (they are not reset by a call).
 */
typedef struct kvp_conn_pool_status {
    size_t struct_size;       /* sizeof(kvp_conn_pool_status), from _init */
    bool available;           /* the pool answers: lookups, stores and loads use it */
    bool attached;            /* the store client is open (false: detached since open) */
    uint64_t unavailable_ms;  /* how long it has been unavailable (0 when available) */
    uint64_t outages;         /* times it became unavailable (a detached open counts) */
    uint64_t skipped_stores;  /* store jobs skipped while unavailable */
    uint64_t skipped_lookups; /* lookups answered 0 without asking the pool */
    uint64_t failed_loads;    /* load jobs failed at once while unavailable */
} kvp_conn_pool_status;
KVP_API void kvp_conn_pool_status_init(kvp_conn_pool_status *s);
/* 0, or KVP_EINVALID_PARAMS (NULL, or a struct_size this library does not know). */
KVP_API int kvp_conn_pool_status_get(kvp_conn_worker *w, kvp_conn_pool_status *out);

/* KV event BlockStored: one stored block of one group. */
typedef struct kvp_conn_event {
    uint32_t group;
    uint32_t block_size;
    uint8_t hash_len;
    uint8_t hash[64];
    bool has_parent;
    uint8_t parent[64];
    uint64_t start, end;   /* token range */
    uint32_t *token_ids;   /* tokens[start:end] or NULL */
    uint32_t n_token_ids;
} kvp_conn_event;
KVP_API int kvp_conn_take_events(kvp_conn_worker *w, kvp_conn_event **ev, size_t *n);
KVP_API void kvp_conn_events_free(kvp_conn_event *ev, size_t n);

/* ============================================================= block hashes */

/*
 * vLLM-compatible chained block hashes (hash_block_tokens) for engines
 * without their own: algo "sha256_cbor" (32 bytes) or "xxhash_cbor" (16);
 * seed = PYTHONHASHSEED of the vLLM instances to interoperate with
 * (NONE_HASH = hash(seed)); NULL = a random NONE_HASH private to the process.
 * Tokens are appended as they become known; each completed block yields one
 * hash. No extra keys (LoRA, multimodal, cache salt).
 */
typedef struct kvp_conn_hasher kvp_conn_hasher;
KVP_API int kvp_conn_hasher_new(const char *algo, const char *seed, uint32_t block_size,
                        kvp_conn_hasher **out);
/* Appends n tokens; writes the hashes of the blocks they complete to out
 * (hash_len bytes each), *nout of them; out_cap in hashes
 * (KVP_EBUFFER_OVERFLOW with *nout the number needed: nothing appended). */
KVP_API int kvp_conn_hasher_append(kvp_conn_hasher *h, const uint32_t *tokens, size_t n, uint8_t *out,
                           size_t out_cap, size_t *nout);
KVP_API size_t kvp_conn_hasher_hash_len(const kvp_conn_hasher *h);
KVP_API void kvp_conn_hasher_free(kvp_conn_hasher *h);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_CONNECTOR_H */
