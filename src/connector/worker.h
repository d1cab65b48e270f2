/*
 * worker.h -- the engine-side (worker) half of the MooncakeStoreConnector
 * (spec §10, telemetry §11, error policy §12), prefix kvp_worker_.
 *
 * One kvp_worker per engine worker process (one TP/PCP/DCP/PP rank). It
 * owns a store client, the hybrid coordinator, one token database per
 * KV-cache group, ONE send thread (stores) and N receive threads (loads).
 *
 * Lifecycle:
 *   kvp_worker_create(cfg)          §10.1 (capacity-only stops after the client)
 *   kvp_worker_register_kv_caches   §6.7: engine tensors -> layout; starts threads
 *   kvp_worker_handle_preemptions   §14, before the forward pass of a step whose
 *                                   scheduler preempted requests: stops their saves
 *   kvp_worker_get_finished         §10.2, once per engine step: enqueues this
 *                                   step's loads and stores, reports finished ids
 *   kvp_worker_load_errors          block ids whose load failed (take & clear)
 *   kvp_worker_lookup               §10.5 (rank 0's lookup server calls it)
 *   kvp_worker_reset                drain the send queue, then remove_all
 *   kvp_worker_take_stats / _take_events   §11 / KV events
 *   kvp_worker_destroy              drains queued jobs, joins threads, closes
 *
 * Engine memory fence: instead of a CUDA event, the engine supplies a fence
 * callback fence(arg, step). Steps are numbered by get_finished: its n-th
 * call on a registered worker (counting from 1, whatever it returns) is
 * step n, and every store job it enqueues carries that number. The engine records a fence per step (e.g. a CUDA event
 * recorded after that step's forward pass, before it calls get_finished);
 * the send thread calls fence(arg, step of the job) right before it reads
 * engine memory for a put (normal save and partial tail). The callback must
 * return 0 once every write of that step (and earlier ones) is visible, or
 * non-zero to abandon that put (recorded as a save_put error; the range is
 * retried by a later job). It runs on the send thread.
 *
 * Preemption (§14 handle_preemptions): the engine calls
 * kvp_worker_handle_preemptions(ids) BEFORE it overwrites the blocks of the
 * preempted requests. For each id it drops the request's queued (not yet
 * started) store jobs and waits for a store job of it that the send thread
 * is running (bound: that one job, i.e. at most its partial-tail put and
 * its normal-save put, each bounded by its fence wait plus the client's RPC
 * timeout), then resets its saved offset and back-off flag. The fence of a
 * step must therefore be satisfiable without further engine action (the
 * step's event was recorded before its get_finished), or handle_preemptions
 * would wait for it forever. On return no store of these requests reads
 * engine memory any more. Loads are not touched (a request waiting for
 * remote KV is not running, so it cannot be preempted). The preempted ids
 * of the step metadata are still honoured by get_finished (same reset;
 * idempotent).
 *
 * Requests that loaded (contract with the scheduler, whose request_finished
 * returns delay_free = true for every request a step asked to load, so that
 * an aborted request's blocks are never freed under a running load): the
 * rule must give the same answer on every rank, so it depends only on the
 * steps, which every rank sees identically -- never on when this rank's
 * load happened to end. Every id in get_finished's `finished` list that a
 * step's metadata asked to load (load spec with can_load, served or failed)
 * since it was last reported is reported in done_sending exactly once, by
 * the first get_finished (this one or a later one) at which its load job
 * has ended and no store job of it is in flight -- in addition to its
 * done_recving report (never later than the done_sending one). A queued
 * load of such a request is dropped unexecuted (reported in done_recving,
 * no block marked invalid); a running one stops after its current
 * sub-batch. No load job writes engine blocks after its id was reported in
 * done_sending. For a normal request whose load ended long before it
 * finished, this costs one step of delay before its blocks are freed.
 *
 * Deliberate differences from the Python connector (spec defects, §10):
 *   - dedup: no separate exist round trip; the batch put answers 0 bytes for
 *     a key that already exists ("already there"), counted in existing_keys.
 *   - a request is reported finished-sending only once it finished AND no
 *     store job of it is in flight; preemption through the step metadata
 *     resets its saved offset and back-off flag but keeps the in-flight
 *     count (jobs enqueued before the preemption are dropped unexecuted via
 *     a generation number); handle_preemptions (not implemented by the
 *     Python connector) drops them and waits for the running one.
 *   - a request that loaded is reported in done_sending once it finished
 *     and its load ended (rule above), so an aborted request's blocks are
 *     never freed under a running load.
 *   - the fence is per step (a callback with the step number) instead of
 *     one CUDA event object carried by each request.
 *   - a load with zero keys finishes (no division by zero);
 *   - after a failed load sub-batch, the blocks of every later sub-batch are
 *     reported invalid as well (they were never loaded).
 *   - KV events are emitted for chunks whose put actually moved bytes.
 *
 * The pool may be unavailable (poollink.h: unreachable when the worker was
 * created, or gone since): create still succeeds unless the configuration
 * itself is wrong, and until the pool answers again a lookup is a hit of 0,
 * a store job is skipped (a later one stores from the request's saved
 * offset), a load job fails at once with every block reported in
 * load_errors (the engine recomputes them), and reset fails when the pool
 * was never reached. None of them waits for the pool; an operation already
 * running when the pool goes away is bounded by the client's rpc_timeout.
 *
 * Thread-safety: get_finished, handle_preemptions, load_errors, lookup,
 * reset, take_stats and take_events may be called from any thread,
 * concurrently. create, register
 * and destroy must not race with anything else.
 * All memory comes from common/mem.h.
 */
#ifndef KVP_CONNECTOR_WORKER_H
#define KVP_CONNECTOR_WORKER_H

#include <stddef.h>
#include <stdint.h>

#include "connector/coord.h"
#include "connector/keys.h"
#include "connector/meta.h"
#include "connector/poollink.h"
#include "connector/tokendb.h"
#include "kvpool.h"

/* The load staging budget with an SSD tier (Mooncake's FileStorageConfig
 * local_buffer_size; the seeds' DEFAULT_MOONCAKE_DISK_STAGING_BUFFER_BYTES). */
#define KVP_WORKER_DISK_STAGING_DEFAULT (1280ull << 20)

enum kvp_worker_role {
    KVP_WORKER_PRODUCER = 1, /* kv_producer: stores only */
    KVP_WORKER_CONSUMER = 2, /* kv_consumer: loads only; saves only with
                                save_decode_cache */
    KVP_WORKER_BOTH = 3,     /* kv_both */
};

/* Returns 0 when the engine writes of `step` (and earlier) are visible to
 * the send thread (see above). */
typedef int (*kvp_worker_fence_fn)(void *arg, uint64_t step);

/* One KV-cache group: the coordinator spec plus what the TP factor needs. */
typedef struct kvp_worker_group {
    struct kvp_coord_group spec;
    enum kvp_key_spec key_spec; /* ATTENTION / MLA / SWA_MLA / MAMBA (§4.3) */
    int num_kv_heads;           /* GQA heads (ATTENTION only) */
} kvp_worker_group;

typedef struct kvp_worker_cfg {
    const char *store_config; /* kvp_client_open config (JSON text or path) */
    const char *model_path;   /* key model name = its basename (§4.1) */
    const char *cache_prefix; /* NULL / "" = none */
    int tp_rank, tp_size, pcp_rank, pcp_size, dcp_rank, dcp_size, pp_rank, pp_size;
    enum kvp_worker_role role;
    int enable_lookup; /* 0 with KVP_WORKER_CONSUMER (and no save_decode_cache) =
                          capacity-only */
    int save_decode_cache; /* a CONSUMER may put too: the scheduler's decode-phase
                              saves (sched.h); a storing worker in every respect
                              (send thread, config descriptor, not capacity-only) */
    const kvp_worker_group *groups;
    size_t ngroups;
    uint32_t hash_block_size; /* H; 0 = resolved from the groups (§5) */
    int use_eagle;            /* speculative_config.use_eagle() */
    int eagle_prefix_hashing; /* hashes already eagle-pruned: store masks use apply_eagle = 0 */
    int64_t retention_interval; /* < 0 = None */
    size_t num_gpu_blocks;      /* blocks per registered KV tensor, > 0 */
    unsigned num_recv_threads;  /* 0 is read as 1 */
    uint64_t staging_budget;    /* §10.7 raw staging budget in bytes; 0 = no split, or
                                   KVP_WORKER_DISK_STAGING_DEFAULT when the store
                                   config sets enable_offload */
    int enable_kv_events;
    int pool_blocks;             /* puts carry each key's block (kvp_block) */
    const int *engine_group_ids; /* per group: its engine index; NULL = position */
    kvp_worker_fence_fn fence; /* may be NULL: engine memory is always coherent */
    void *fence_arg;
    const char *config_fingerprint; /* NULL / "" = none; else kvp_key_fingerprint_valid:
                                       every key gets "@cfg:<fp>" (keys.h) */
    int tp_independent; /* the TP-independent layout (keys.h "@kvh:"): one object per
                           global KV head (MLA: one latent, head 0) and block, which
                           engines of any TP size write and read; ranks holding the
                           same head (num_kv_heads < tp_size, MLA) stride its chunks
                           so each is stored once. Needs dcp_size 1, no Mamba group,
                           the same heads per rank in every group, num_kv_heads a
                           multiple or divisor of tp_size, and tensors showing the
                           heads as one dimension (tokendb.h kvp_tdb_head_slice) */
    const char *config_description; /* NULL / "" = none; with a fingerprint, rank 0 (all
                                       four ranks 0) of a storing worker (PRODUCER / BOTH,
                                       or save_decode_cache) puts it
                                       at its first store once the pool is reachable
                                       (again after each outage, and every 10 min),
                                       soft-pinned, under
                                       kvp_key_build_config_key's key; a failed put is
                                       logged, never fatal */
} kvp_worker_cfg;

typedef struct kvp_worker kvp_worker;

/* A set of request ids (NUL-terminated, owned). Zero-initialise; free with
 * kvp_worker_ids_free. */
typedef struct kvp_worker_ids {
    char **ids;
    size_t n, cap;
} kvp_worker_ids;
void kvp_worker_ids_free(kvp_worker_ids *s);
/* 1 if id is in s. */
int kvp_worker_ids_has(const kvp_worker_ids *s, const char *id);

/*
 * §10.1. Ranks must satisfy 0 <= rank < size (sizes >= 1); groups are
 * validated by the coordinator, with block sizes already scaled by the
 * engine (PCP/DCP); L and H are resolved as in §5. Errors: KVP_EINVALID_PARAMS /
 * KVP_ECONFIG (message in err), the client's open error, KVP_ENOMEM.
 */
int kvp_worker_create(const kvp_worker_cfg *cfg, kvp_worker **out, char *err, size_t errlen);
/* The step number get_finished's next call gives its store jobs (the
 * fence's `step`): the calls so far + 1. */
uint64_t kvp_worker_next_step(kvp_worker *w);

/* Drains the queued jobs, joins the threads, closes the client. NULL ok. */
void kvp_worker_destroy(kvp_worker *w);
/* 1 for a capacity-only worker (no transfers, lookup 0). */
int kvp_worker_capacity_only(const kvp_worker *w);

/*
 * §6.7: registers the engine's KV tensors (layout detection by tokendb),
 * records each new region with the client (failure logged only), then
 * starts the send thread (producer / both) and the receive threads. Called
 * once; a second call is KVP_EINVALID_PARAMS. Capacity-only: returns 0 at
 * once. n == 0 or an inconsistent tensor: KVP_EINVALID_PARAMS.
 */
int kvp_worker_register_kv_caches(kvp_worker *w, const kvp_tdb_tensor *tensors, size_t n);

/*
 * §10.2 for one engine step: enqueues every request of meta with a
 * can_load load spec on the receive queue, every can_save request on the
 * send queue (deep copies: meta may be freed on return), then appends the
 * ids finished sending / receiving to the caller's sets. finished: ids the
 * engine finished this step (NUL-terminated). meta may be NULL (no step).
 * A request that cannot be served (group count differing from the
 * worker's, hashes without or with too long a length, out of memory) fails
 * alone and is logged: its load is reported finished with every block id in
 * kvp_worker_load_errors (the engine recomputes them); its save is dropped
 * but the request stays tracked, so finishing it is still reported. The
 * other requests of the step are served. Capacity-only: nothing.
 * Errors: KVP_EINVALID_PARAMS (not registered), KVP_ENOMEM (bookkeeping;
 * then, rarely, none of the step's jobs is queued).
 */
int kvp_worker_get_finished(kvp_worker *w, const char *const *finished, size_t nfinished,
                            const kvp_meta_step *meta, kvp_worker_ids *done_sending,
                            kvp_worker_ids *done_recving);

/*
 * §14 handle_preemptions (see the header comment): ids[0..n) are request
 * ids (NUL-terminated; NULL entries skipped). Returns once no store job of
 * them is queued or running. May block for the running store job of one of
 * them. 0 (also capacity-only / n == 0) or KVP_EINVALID_PARAMS (ids NULL
 * with n > 0).
 */
int kvp_worker_handle_preemptions(kvp_worker *w, const char *const *ids, size_t n);

/* Takes (and clears) the block ids whose load failed; *ids is kvp_free'd
 * by the caller (NULL when *n == 0). 0 or KVP_ENOMEM. */
/* Moves the ids of requests whose load failed (any block) since the last
 * call into out (deduplicated); KVP_ENOMEM leaves the rest for next time. */
int kvp_worker_load_failed(kvp_worker *w, kvp_worker_ids *out);
int kvp_worker_load_errors(kvp_worker *w, uint32_t **ids, size_t *n);

/*
 * §10.5: hit tokens for a prompt of num_tokens tokens with block hashes
 * hashes[0..nhashes) (hash_len bytes each, packed, at the H granularity),
 * probing every rank namespace and group with ONE exist batch; a hit
 * covering the whole prompt is re-derived one boundary lower. A hit's keys
 * are then asked again with EXIST_LEASE (kvp_client_exist_lease), once per
 * rank that will read each, so the master holds them until the loads' GETs
 * (or lease_ttl); there a key of another size than this rank's load reads
 * (its own pipeline stage's keys; with a KV cache registered) is a miss,
 * counted in the lookup's existing_keys, and the hit is that of this second
 * answer (never more). A master without EXIST_LEASE, or
 * $KVPOOL_LOOKUP_LEASE=0: the first answer alone. A store error (the exist
 * call failed, or every key answered < 0, or the lease call failed) is a 0
 * hit, recorded as a lookup_exists error. Returns 0 with *hit set,
 * or KVP_EINVALID_PARAMS / KVP_ENOMEM.
 */
int kvp_worker_lookup(kvp_worker *w, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                      size_t hash_len, int apply_eagle, uint32_t *hit);

/* Waits until every enqueued store job has run, then removes every object
 * of the store (remove_all with force, §9.2: leased and pinned objects
 * too). Objects removed (>= 0) or < 0. Without a send thread (consumer,
 * capacity-only, not registered) it does not wait. */
int64_t kvp_worker_reset(kvp_worker *w);

/* Waits until every enqueued store and load job has run (tests, shutdown). */
void kvp_worker_drain(kvp_worker *w);

/* --------------------------------------------------------- telemetry §11 */
enum kvp_worker_op {
    KVP_WORKER_OP_SAVE_PUT = 0,      /* dedup-put batches (normal save, tail) */
    KVP_WORKER_OP_LOAD_GET = 1,      /* load sub-batches */
    KVP_WORKER_OP_LOOKUP_EXISTS = 2, /* lookup exist batches */
    KVP_WORKER_OP_COUNT
};
typedef struct kvp_worker_op_stats {
    uint64_t count;         /* operations */
    uint64_t total_ns;      /* summed wall time */
    uint64_t max_ns;
    uint64_t keys;          /* keys in the operations */
    uint64_t bytes;         /* bytes moved (put: > 0 results; get: sizes of loaded keys) */
    uint64_t failed_keys;   /* per-key negative results (all keys of an errored call) */
    uint64_t existing_keys; /* save_put: keys answered "already there" (0 bytes);
                               lookup: keys of a hit holding a value of another
                               size than a load reads (counted as misses) */
    uint64_t partial;       /* operations with some failed keys */
    uint64_t errors;        /* operations that failed as a whole */
} kvp_worker_op_stats;
typedef struct kvp_worker_stats {
    kvp_worker_op_stats op[KVP_WORKER_OP_COUNT];
} kvp_worker_stats;
/* Copies and resets the counters (the spec's swap-in of a fresh object).
 * Returns 1 if anything was recorded since the last take, else 0. */
int kvp_worker_take_stats(kvp_worker *w, kvp_worker_stats *out);
/* The pool's availability and what was done without it (since create;
 * poollink.h). Any thread. */
void kvp_worker_pool_status(kvp_worker *w, kvp_plink_status *out);

/* ---------------------------------------------------------- KV events */
/* BlockStored (medium "cpu"): one stored chunk of one group. parent is the
 * previously stored chunk of the same group in the same put batch. */
typedef struct kvp_worker_event {
    uint32_t group;
    uint32_t block_size;   /* B_g */
    uint8_t hash_len;
    uint8_t hash[KVP_META_MAX_HASH_LEN];
    int has_parent;
    uint8_t parent[KVP_META_MAX_HASH_LEN];
    uint64_t start, end;   /* token range of the chunk */
    uint32_t *token_ids;   /* req.token_ids[start:end] (owned) or NULL */
    uint32_t n_token_ids;
} kvp_worker_event;
/* Takes (and clears) the pending events (only with enable_kv_events).
 * Free with kvp_worker_events_free. 0 or KVP_ENOMEM. */
int kvp_worker_take_events(kvp_worker *w, kvp_worker_event **ev, size_t *n);
void kvp_worker_events_free(kvp_worker_event *ev, size_t n);

#endif
