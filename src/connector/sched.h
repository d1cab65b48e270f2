/*
 * sched.h -- the scheduler half of the connector (spec §8): per-request
 * load specs and trackers, the external-hit query, the per-step metadata
 * (a kvp_meta_step and its encoded byte string, meta.h) and the
 * delay-free decision for finished requests.
 *
 * Engine-agnostic: the engine describes a request (kvp_sched_request) and a
 * scheduling step (kvp_sched_step) with plain structs. Everything the engine
 * passes is BORROWED for the duration of the call only; the scheduler copies
 * what it keeps (ids, block ids, block hashes). Single-threaded: one engine
 * scheduler thread calls every function (the lookup client behind `ops` has
 * its own thread).
 *
 * Spec order of calls per engine step: get_num_new_matched_tokens (per
 * waiting request, may answer "pending" for async lookups), then
 * update_state_after_alloc (per request that got blocks), then build_meta
 * once; request_finished whenever the engine finishes a request.
 *
 * Deviations from the spec (defects fixed / things left out):
 *  - Lookups have a deadline (lookup.h): a dead rank 0 costs a hit of 0.
 *  - A cached request with no new blocks (new_block_ids NULL) is still
 *    processed (B1 semantics: token_len advances); seed 004 skipped it,
 *    which left the tracker behind the scheduled tokens.
 *  - A pending load whose load spec ended with can_load false (the engine
 *    allocated no external tokens) is dropped in phase 5 instead of being
 *    turned into a save of tokens that were never computed.
 *  - Eagle prefix-cache hashing (§8.1 helpers, `_pending_finished_saves`,
 *    max_save_tokens) is left out: it needs the engine's
 *    num_publishable_block_hashes, which is eagle drafter state this API
 *    does not model; lookups are always sent with apply_eagle = 1 (the
 *    spec's value when that mode is off), saves are never capped.
 *  - The per-step byte string is a DELTA (meta.h, version 2): per request
 *    only the block ids, hashes and token ids appended since the last
 *    message that carried the request, plus a drop list (finished and
 *    preempted requests the workers' mirrors must forget). The workers
 *    decode it with kvp_meta_decode_delta into a mirror; the decoded step
 *    equals the full view *meta field by field. CONTRACT: every message
 *    build_meta returns must reach every worker mirror, in order (a lost
 *    message makes the next delta of the affected requests fail to decode
 *    with KVP_EPROTOCOL). After a build error nothing was sent, and every
 *    later meta is a full send.
 *  - A request that loaded keeps its blocks when it finishes (delay_free,
 *    also for a consumer) until the workers report it in finished_sending,
 *    so an aborted request's blocks are never freed under a running load;
 *    the spec frees them at once.
 *  - reset_cache (kvp_sched_reset_cache) has no KV-event buffer to clear
 *    (KV events are not produced).
 */
/*
 * Decode-phase saves (save_decode_cache, vLLM's in-tree B2 semantics). Off
 * (the default), a running request stops producing save metas once its
 * computed tokens reach its prefill end, and a consumer never saves. On:
 *  - producer / both: a running request in decode keeps its tracker's block
 *    table and token_len current, and every step that completes a block
 *    emits a save meta from the save watermark, exactly as a prefill chunk
 *    (the blocks are addressed by the request's chained block hashes, which
 *    the engine extends over generated tokens, so a later prompt equal to
 *    prompt + generated text hits them);
 *  - consumer: new and resumed requests are still never saved (their load,
 *    if any, goes alone), chunked-prefill steps only advance the tracker,
 *    and the first decode step that has a whole block saves from token 0:
 *    the prompt's blocks it lacks in the pool (those it loaded are found
 *    present and skipped by the worker's dedup) and then the decode blocks.
 *    request_finished then delays the free like a producer's (rule a).
 * The worker must be allowed to put (kvp_worker_cfg.save_decode_cache).
 * Every tracked running step (prefill chunk or decode) extends the tracker's
 * token ids to token_len from all_token_ids, so each save meta carries the
 * tokens of the blocks it stores (the worker's KV events name them).
 */
#ifndef KVP_SCHED_H
#define KVP_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "connector/lookup.h"
#include "connector/meta.h"
#include "kvpool.h"

enum kvp_sched_role {
    KVP_SCHED_PRODUCER = 0, /* kv_producer: saves, loads */
    KVP_SCHED_CONSUMER = 1, /* kv_consumer: loads only; saves decode-phase KV only
                               with save_decode_cache */
    KVP_SCHED_BOTH = 2,     /* kv_both */
};

/*
 * The lookup/admin channel as seen by the scheduler (kvp_sched_ops_client
 * binds a kvp_lookup_client; tests bind fakes).
 * lookup: 0 and *hit; KVP_LOOKUP_PENDING when non_block and not ready;
 *         a negative code is treated as a hit of 0.
 * discard: forget any pending lookup of req_id.
 * reset: 0 and *ok when answered, negative otherwise.
 */
typedef struct kvp_sched_lookup_ops {
    int (*lookup)(void *arg, const char *req_id, uint32_t id_len, uint32_t num_tokens,
                  const uint8_t *hashes, size_t nhashes, size_t hash_len, bool non_block,
                  bool apply_eagle, uint32_t *hit);
    void (*discard)(void *arg, const char *req_id, uint32_t id_len);
    int (*reset)(void *arg, bool *ok);
    void *arg;
} kvp_sched_lookup_ops;

/* Binds ops to a lookup client (the client must outlive the scheduler). */
void kvp_sched_ops_client(kvp_lookup_client *c, kvp_sched_lookup_ops *ops);

typedef struct kvp_sched_config {
    int kv_role;                   /* enum kvp_sched_role */
    bool load_async;               /* spec default true */
    bool lookup_async;             /* spec default false */
    bool enable_lookup;            /* spec default true */
    uint32_t block_size;           /* L: scheduler (lcm) block size, > 0 */
    uint32_t hash_block_size;      /* H: divides L */
    bool enable_partial_hash_hits; /* coord: partial_hash_hits_enabled */
    bool save_decode_cache;        /* default false; see "Decode-phase saves" above */
    kvp_sched_lookup_ops ops;      /* ops.lookup required when enable_lookup */
} kvp_sched_config;

/* The spec's defaults: role both, load_async, lookup enabled and blocking. */
void kvp_sched_config_default(kvp_sched_config *c);

/*
 * One request as the engine sees it now. All borrowed for the call.
 *   all_token_ids / num_tokens: prompt + generated tokens (never unverified
 *       speculative drafts); num_tokens = the engine's request.num_tokens.
 *   prompt_token_ids / num_prompt_tokens: the prefill tokens
 *       (prefill_token_ids, else the prompt).
 *   num_computed_tokens: tokens whose KV is computed before this step.
 *   block_hashes: nhashes * hash_len bytes, one hash per H tokens (§5);
 *       append-only across calls for one request.
 */
typedef struct kvp_sched_request {
    const char *req_id;
    uint32_t req_id_len;
    const uint32_t *all_token_ids;
    uint32_t num_tokens;
    const uint32_t *prompt_token_ids;
    uint32_t num_prompt_tokens;
    uint64_t num_computed_tokens;
    const uint8_t *block_hashes;
    uint32_t nhashes;
    uint8_t hash_len;
} kvp_sched_request;

/* scheduled_new_reqs entry: the full block table (ngroups lists). */
typedef struct kvp_sched_new_req {
    const kvp_sched_request *req;
    uint64_t num_scheduled_tokens;
    const kvp_meta_ids *block_ids;
    uint32_t ngroups;
} kvp_sched_new_req;

/*
 * scheduled_cached_reqs entry. resumed: new_block_ids is the FULL table
 * (replaces the tracker's); running: new blocks of this step (appended).
 * new_block_ids NULL (ngroups 0) = no new blocks.
 */
typedef struct kvp_sched_cached_req {
    const kvp_sched_request *req;
    bool resumed;
    uint64_t num_scheduled_tokens; /* may include speculative drafts */
    const kvp_meta_ids *new_block_ids;
    uint32_t ngroups;
} kvp_sched_cached_req;

/*
 * Boundary-state hand-offs of one request this step (vLLM 0.33's
 * SchedulerOutput.kv_connector_block_state.boundary_state_offloads): each
 * (group, block, boundary_tokens) is the engine's exact block holding a Mamba
 * "align" state at that boundary. Several boundaries may come in one step.
 * The caller passes Mamba groups only (connector.c filters the others).
 */
typedef struct kvp_sched_tail_req {
    const char *req_id;
    uint32_t req_id_len;
    const kvp_meta_tail *tails;
    uint32_t ntails;
} kvp_sched_tail_req;

/* One scheduler step (SchedulerOutput). Every array borrowed for the call. */
typedef struct kvp_sched_step {
    const kvp_sched_new_req *new_reqs;
    uint32_t n_new;
    const kvp_sched_cached_req *cached;
    uint32_t n_cached;
    const kvp_meta_str *preempted;
    uint32_t n_preempted;
    const kvp_meta_str *finished;
    uint32_t n_finished;
    const kvp_sched_tail_req *tails; /* NULL / 0: none this step */
    uint32_t n_tails;
} kvp_sched_step;

typedef struct kvp_sched kvp_sched;

/* KVP_EINVALID_PARAMS (L == 0, H == 0, L % H, bad role, lookup enabled
 * without ops.lookup), KVP_ENOMEM. */
int kvp_sched_new(const kvp_sched_config *cfg, kvp_sched **out);
void kvp_sched_free(kvp_sched *s);

/*
 * get_num_new_matched_tokens (§8.2). num_computed_tokens: the local
 * prefix-cache hit. Returns 0 with *num_new (external tokens to allocate)
 * and *load_async set, or KVP_LOOKUP_PENDING (the spec's None: an async
 * lookup is in flight, ask again on a later step). Records a load spec
 * when *num_new > 0. KVP_EINVALID_PARAMS, KVP_ENOMEM.
 */
int kvp_sched_get_num_new_matched_tokens(kvp_sched *s, const kvp_sched_request *req,
                                         uint64_t num_computed_tokens, uint64_t *num_new,
                                         bool *load_async);

/*
 * update_state_after_alloc (§8.3): blocks (ngroups >= 1 lists) are recorded
 * (copied) only when num_external_tokens > 0; they are the table of a
 * pending async load (phase 5). With a load spec, num_external_tokens must
 * be 0 (load cancelled) or kvpool_cached - vllm_cached (else
 * KVP_EINVALID_PARAMS, the spec's assertion). KVP_ENOMEM.
 */
int kvp_sched_update_state_after_alloc(kvp_sched *s, const kvp_sched_request *req,
                                       const kvp_meta_ids *blocks, uint32_t ngroups,
                                       uint64_t num_external_tokens);

/*
 * build_connector_meta (§8.4), all phases. On success *meta (the FULL view,
 * for introspection) and *bytes / *len (the message to send: the delta
 * encoding of *meta, kvp_meta_encode_delta, against what the workers'
 * mirrors hold, with the drop list) stay valid until the next call on s. Errors: KVP_EINVALID_PARAMS (a cached request unknown to the
 * scheduler, a tracker group-count mismatch, partial tails with two
 * boundaries, ids over the limits), KVP_ENOMEM; after an error the state
 * may be partly advanced (these are engine bugs or OOM, as the spec's
 * exceptions).
 */
int kvp_sched_build_meta(kvp_sched *s, const kvp_sched_step *st, const kvp_meta_step **meta,
                         const uint8_t **bytes, size_t *len);

/*
 * request_finished (§8.5): *delay_free = true when the engine must keep the
 * request's blocks until the worker reports it in finished_sending:
 *   (a) the spec's save rule (not a consumer unless save_decode_cache, a
 *       tracker with saved tokens or a pending partial-tail offload, and
 *       some blocks), or
 *   (b) the request LOADED: a meta with a load spec (can_load true) for
 *       it was returned by build_meta since it was scheduled (so every
 *       worker got it). Any role; regardless of block counts.
 * Worker side of (b) (worker.h, "Requests that loaded"): every worker
 * reports in done_sending each finished request that a step asked to load,
 * once its load job has ended. The rule depends only on the step messages,
 * which every worker sees identically, so every rank reports exactly the
 * ids the scheduler delayed (an aggregated finished_sending completes; an
 * engine that asserts on unexpected finished_sending ids never sees one).
 * A rule on "finished_recving not seen yet" would not: ranks finish their
 * loads at different steps, and one that reported done_recving before the
 * finish would never report done_sending. The cost: a request that loaded
 * gets its blocks back one step after it finished.
 */
int kvp_sched_request_finished(kvp_sched *s, const char *req_id, uint32_t id_len,
                               const kvp_meta_ids *block_ids, uint32_t ngroups,
                               bool *delay_free);

/*
 * register_finished_partial_tail (vLLM 0.33): the engine is finishing
 * req_id and hands off its last boundary states (tails: Mamba groups only,
 * one boundary for all; block_ids: the request's table, ngroups lists). When
 * the hand-off is usable (a producer; the request has a tracker and some
 * block; boundary <= its prefill end; no null block) it is queued for the
 * NEXT build_meta as a store-only meta (kind KVP_META_TAIL, token_len_chunk
 * 0), the tracker gets has_pending_offload (so the request_finished that
 * follows delays the free until every worker reports the store done) and
 * *queued is true; otherwise nothing changes and *queued is false. Tails with
 * two boundaries, or a second registration for an id whose first is still
 * queued: KVP_EINVALID_PARAMS (the reference asserts). KVP_ENOMEM.
 */
int kvp_sched_register_finished_tail(kvp_sched *s, const char *req_id, uint32_t id_len,
                                     const kvp_meta_ids *block_ids, uint32_t ngroups,
                                     const kvp_meta_tail *tails, uint32_t ntails, bool *queued);

/* reset_store (§8.6): true only on the worker's ok. The caller must have
 * paused generation. */
bool kvp_sched_reset_store(kvp_sched *s);

/* reset_cache (§13, the facade's scheduler role): drops every load spec and
 * the block table recorded for a pending async load (no load is emitted for
 * them any more), then returns kvp_sched_reset_store(s). Loads already sent
 * to the workers keep their delay-free rule. */
/*
 * The engine saw loads fail: requests named in ids, and requests whose
 * allocated load blocks include one of blocks (the workers' load_errors),
 * miss on every later lookup until they finish, so the engine recomputes
 * them instead of retrying a hit that failed (the master may list the
 * objects of a dead node for a while). Unknown ids are ignored.
 */
int kvp_sched_loads_failed(kvp_sched *s, const kvp_meta_str *ids, uint32_t nids,
                           const uint32_t *blocks, size_t nblocks);

bool kvp_sched_reset_cache(kvp_sched *s);

/* Introspection (tests, diagnostics); pointers valid until the next call. */
bool kvp_sched_load_spec(kvp_sched *s, const char *req_id, uint32_t id_len,
                         kvp_meta_load_spec *out);
const kvp_meta_tracker *kvp_sched_tracker(kvp_sched *s, const char *req_id, uint32_t id_len);
/* Whether req_id is in _unfinished_requests / _unfinished_request_ids. */
bool kvp_sched_is_unfinished(kvp_sched *s, const char *req_id, uint32_t id_len, bool *in_id_set);

#endif
