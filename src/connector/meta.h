/*
 * meta.h -- the connector's per-request data structures (spec §6.1-§6.4)
 * and the compact, versioned byte string that carries one step's connector
 * metadata from the scheduler process to every worker process.
 *
 * Structures:
 *   kvp_meta_load_spec  LoadSpec (§6.1)
 *   kvp_meta_tracker    RequestTracker (§6.2): scheduler-side, owns its memory
 *   kvp_meta_req        ReqMeta (§6.3): a VIEW; its arrays are borrowed
 *                       (from a tracker when built by kvp_meta_from_tracker,
 *                       from the decode arena / the mirror when decoded)
 *   kvp_meta_step       MooncakeStoreConnectorMetadata (§6.4): the requests of
 *                       one step plus the unfinished and preempted id sets
 *
 * Encoding, version 2 (all integers little-endian, kvp_buf/kvp_rd). A step
 * is sent as a DELTA against what the receiving worker already holds for
 * each request (its kvp_meta_mirror): the block table (per group), the
 * block hashes and the token ids are each "base count + appended items".
 *   step   := magic u32 = KVP_META_MAGIC ("KVCM") | version u8 = 2
 *             | u32 ndrop, str*ndrop
 *             | u32 nreq, req*nreq | u32 nunfin, str*nunfin | u32 npre, str*npre
 *   str    := u32 len | len bytes, no NUL among them   (1 <= len <= KVP_META_MAX_ID)
 *   req    := str req_id | u8 kind | u8 flags | u64 token_len_chunk
 *             | u32 ngroups, (u32 base | u32 n, u32 block_id*n)*ngroups
 *             | u8 hash_len | u32 base | u32 n | n*hash_len bytes
 *             | [flags&LOAD]   u64 vllm_cached | u64 kvpool_cached | u64 token_len | u8 can_load
 *             | [flags&TOKENS] u32 base | u32 n, u32 token_id*n
 *             | [flags&PROMPT] u64 num_prompt_tokens
 *             | [flags&TAILS]  u32 n, (u32 group | u32 cow_block | u64 boundary)*n
 *   flags  := bit0 has can_save, bit1 can_save, bit2 has is_last_chunk,
 *             bit3 is_last_chunk, bit4 LOAD, bit5 TOKENS, bit6 PROMPT, bit7 TAILS
 * Delta semantics (kvp_meta_decode_delta): first every id of the drop list
 * is removed from the mirror (finished / preempted requests; an id the
 * mirror does not hold is ignored), then the requests are applied in
 * order. For each array, the full array = the mirror's array when base > 0
 * (the mirror must hold EXACTLY base items, and for hashes the same
 * hash_len) or nothing when base == 0 (a full send, replacing the mirror's
 * array), followed by the n appended items; the mirror entry (created on
 * first use) then holds the full array. A group the mirror entry does not
 * have counts 0 items. Token ids absent (no TOKENS flag) = an empty array;
 * hash_len 0 = no hashes (then base and n are 0). A request named twice in
 * one step applies both entries in order; the first entry's view keeps
 * showing the arrays as they were after it.
 * Desynchronisation (a base count that differs from what the mirror holds:
 * a missed step or a protocol bug) and every other decode error are
 * KVP_EPROTOCOL for the whole step, and the mirror is then EMPTIED (every
 * entry dropped): nothing is half-assembled, and every later delta entry of
 * a request the scheduler does not resend in full fails the same way.
 * Version 1 (no bases, no drop list) is no longer decoded: a v1 message is
 * KVP_EINVALID_VERSION.
 * kvp_meta_encode / kvp_meta_decode are the stateless forms: every base 0,
 * no drop list; kvp_meta_decode rejects a non-zero base or a non-empty
 * drop list (KVP_EPROTOCOL) because it has no mirror to resolve them.
 * The encoding is canonical: a decoder accepts exactly what the encoder
 * produces (value bits without their "has" bit, hash_len 0 with hashes or
 * a non-zero hash base, hash_len != 0 with no hashes in total, a TOKENS
 * flag with no tokens in total, can_load not 0/1, unknown kind, trailing
 * bytes ... are KVP_EPROTOCOL), so for the stateless forms
 * decode(encode(x)) == x and encode(decode(b)) == b.
 * Semantic invariants checked on both sides: a request never carries both a
 * save (can_save true) and a load spec (§16); tail group ids < ngroups;
 * counts within the limits below.
 *
 * Errors: encode: KVP_EINVALID_PARAMS (invariant or limit violated, a base
 * larger than its array; nothing useful in the buffer), the buffer's
 * sticky error (KVP_ENOMEM/ETOO_LARGE).
 * decode: bad magic or malformed -> KVP_EPROTOCOL; known magic with another
 * version -> KVP_EINVALID_VERSION; arena (or, for the mirror, heap)
 * exhausted -> KVP_ENOMEM (the mirror is emptied as for KVP_EPROTOCOL).
 */
#ifndef KVP_META_H
#define KVP_META_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"
#include "kvpool.h"

#define KVP_META_MAGIC 0x4D43564Bu /* "KVCM" as little-endian bytes */
#define KVP_META_VERSION 2
#define KVP_META_MAX_ID 4096u       /* bytes of a request id */
#define KVP_META_MAX_GROUPS 64u     /* KV-cache groups */
#define KVP_META_MAX_HASH_LEN 64u   /* bytes of one block hash (sha256: 32) */

/* Tri-state for the spec's `bool | None` fields. */
enum { KVP_META_UNSET = -1, KVP_META_FALSE = 0, KVP_META_TRUE = 1 };

/* Why the scheduler emitted the request (diagnostic; the worker acts on
 * can_save / load_spec / partial tails, never on the kind). */
enum kvp_meta_kind {
    KVP_META_NEW = 0,       /* scheduled_new_reqs (§8.4 step 3) */
    KVP_META_RUNNING = 1,   /* cached, running: chunked prefill (step 4) */
    KVP_META_RESUMED = 2,   /* cached, resumed after preemption (step 4) */
    KVP_META_LOAD = 3,      /* pending async load only (step 5) */
    KVP_META_TAIL = 4,      /* partial-tail offload only (step 6) */
    KVP_META_FINISHED = 5,  /* deferred final save of a finished request (step 1) */
    KVP_META_KIND_COUNT
};

typedef struct kvp_meta_load_spec {
    uint64_t vllm_cached_tokens;   /* local prefix-cache hit at lookup */
    uint64_t kvpool_cached_tokens; /* external hit */
    uint64_t token_len;            /* set by the worker to kvpool_cached_tokens */
    bool can_load;
} kvp_meta_load_spec;

/* Block ids of one KV-cache group. */
typedef struct kvp_meta_ids {
    uint32_t *ids;
    uint32_t n;
    uint32_t cap; /* tracker-owned arrays only; 0 in views */
} kvp_meta_ids;

/* One partial-tail offload entry (§6.3, §10.4). */
typedef struct kvp_meta_tail {
    uint32_t group_id;
    uint32_t cow_block_id;
    uint64_t boundary_tokens;
} kvp_meta_tail;

typedef struct kvp_meta_str {
    const char *p; /* NUL-terminated copy when decoded; len excludes the NUL */
    uint32_t len;
} kvp_meta_str;

/*
 * ReqMeta view. Optional fields: load_spec NULL = None; token_ids NULL =
 * None (n_token_ids then 0); has_num_prompt_tokens; tails NULL = None
 * (an empty non-NULL list is distinct: `partial_tail_offloads == []`).
 * block_hashes: nhashes * hash_len bytes, hash i at block_hashes + i*hash_len.
 */
typedef struct kvp_meta_req {
    kvp_meta_str req_id;
    uint8_t kind;                  /* enum kvp_meta_kind */
    uint64_t token_len_chunk;      /* block-aligned tokens to save */
    const kvp_meta_ids *block_ids; /* ngroups entries */
    uint32_t ngroups;
    const uint8_t *block_hashes;
    uint32_t nhashes;
    uint8_t hash_len;
    int8_t can_save;               /* KVP_META_UNSET / FALSE / TRUE */
    int8_t is_last_chunk;
    const kvp_meta_load_spec *load_spec;
    const uint32_t *token_ids;
    uint32_t n_token_ids;
    bool has_num_prompt_tokens;
    uint64_t num_prompt_tokens;
    const kvp_meta_tail *tails;
    uint32_t ntails;
} kvp_meta_req;

/*
 * One step's metadata. Built with kvp_meta_step_add_* (the step owns the
 * arrays of views, not what they point to) or filled by kvp_meta_decode
 * (everything in the arena) / kvp_meta_decode_delta (arena and mirror); do
 * not call kvp_meta_step_free on a decoded step.
 */
typedef struct kvp_meta_step {
    kvp_meta_req *reqs;
    uint32_t nreqs;
    kvp_meta_str *unfinished;
    uint32_t nunfinished;
    kvp_meta_str *preempted;
    uint32_t npreempted;
    uint32_t cap_reqs, cap_unfinished, cap_preempted; /* 0 when decoded */
} kvp_meta_step;

void kvp_meta_step_init(kvp_meta_step *s);
void kvp_meta_step_free(kvp_meta_step *s);
/* Appends a shallow copy of *r (its pointers stay borrowed). KVP_ENOMEM. */
int kvp_meta_step_add_req(kvp_meta_step *s, const kvp_meta_req *r);
/* Borrowed ids (must outlive the encode). KVP_ENOMEM. */
int kvp_meta_step_add_unfinished(kvp_meta_step *s, const char *id, uint32_t len);
int kvp_meta_step_add_preempted(kvp_meta_step *s, const char *id, uint32_t len);

/* -------------------------------------------------- RequestTracker (§6.2) */
typedef struct kvp_meta_tracker {
    char *req_id;                  /* owned, NUL-terminated */
    uint32_t req_id_len;
    uint64_t token_len;            /* tokens scheduled through so far */
    kvp_meta_ids *block_ids;       /* ngroups growable lists (owned) */
    uint32_t ngroups;              /* 0 after reset (spec: allocated_block_ids = ()) */
    uint64_t num_saved_tokens;     /* block-aligned save watermark already emitted */
    uint32_t *token_ids;           /* owned; NULL = None */
    uint32_t n_token_ids;
    uint32_t token_cap;            /* slots of token_ids (>= n_token_ids) */
    bool has_pending_offload;
    uint64_t prefill_end_tokens;   /* len(prompt), or len(all tokens) when resumed */
} kvp_meta_tracker;

/* ngroups in 1..KVP_META_MAX_GROUPS, id length 1..KVP_META_MAX_ID. */
int kvp_meta_tracker_init(kvp_meta_tracker *t, const char *req_id, uint32_t req_id_len,
                          uint32_t ngroups);
/* Copies token ids (NULL, 0 = None). KVP_ENOMEM. */
int kvp_meta_tracker_set_tokens(kvp_meta_tracker *t, const uint32_t *ids, uint32_t n);
/* Extends the token ids to all[0, n) when n is longer: all must continue
 * what the tracker holds (the request's all_token_ids; the tracker's are a
 * prefix of them). Appends only the new tail (amortised growth), so a
 * decoding request costs O(1) per step. KVP_ENOMEM changes nothing. */
int kvp_meta_tracker_extend_tokens(kvp_meta_tracker *t, const uint32_t *all, uint32_t n);
/* Zeroes everything but the request id (tracker object kept, §8.4 step 2). */
void kvp_meta_tracker_reset(kvp_meta_tracker *t);
/*
 * update(new_block_ids) (§6.2): APPENDS each group's new ids. A group
 * count different from the tracker's is KVP_EINVALID_PARAMS ("Group count
 * mismatch"), also after a reset (0 groups; the scheduler builds a new
 * table with kvp_meta_tracker_replace then); KVP_ENOMEM leaves the tracker
 * unchanged.
 */
int kvp_meta_tracker_update(kvp_meta_tracker *t, const kvp_meta_ids *groups, uint32_t ngroups);
/* Replaces the whole block table (resumed requests REPLACE, §8.4). */
int kvp_meta_tracker_replace(kvp_meta_tracker *t, const kvp_meta_ids *groups, uint32_t ngroups);
void kvp_meta_tracker_free(kvp_meta_tracker *t);

/*
 * ReqMeta.from_request_tracker (§6.3), with L = lcm block size (> 0):
 * returns 1 and fills *out (a view into the tracker, the hashes and
 * *load_spec: valid until any of them changes) when a meta is emitted,
 * 0 when the spec returns None, KVP_EINVALID_PARAMS for L == 0.
 * max_save_tokens < 0 means None. Advances tracker->num_saved_tokens when
 * the meta saves. load_spec is attached only when load_spec->can_load.
 */
int kvp_meta_from_tracker(kvp_meta_tracker *t, uint64_t L, const kvp_meta_load_spec *load_spec,
                          bool skip_save, const uint8_t *hashes, uint32_t nhashes,
                          uint8_t hash_len, int8_t is_last_chunk, int64_t max_save_tokens,
                          uint8_t kind, kvp_meta_req *out);

/* ---------------------------------------------------------- wire format */

/*
 * Per-request delta for kvp_meta_encode_delta: how many leading items of
 * each array the receiving mirror already holds for this request (0 =
 * send the whole array; it replaces the mirror's). groups: ngroups counts
 * (NULL = all 0). The caller (the scheduler) keeps track of what it sent;
 * a base must not exceed its array (KVP_EINVALID_PARAMS).
 */
typedef struct kvp_meta_base {
    const uint32_t *groups;
    uint32_t hashes;
    uint32_t tokens;
} kvp_meta_base;

/* Stateless: every base 0, no drop list. */
int kvp_meta_encode(kvp_buf *b, const kvp_meta_step *s);
/* bases: s->nreqs entries (NULL = all full sends); drops: ids whose mirror
 * entries the workers drop before applying the requests. */
int kvp_meta_encode_delta(kvp_buf *b, const kvp_meta_step *s, const kvp_meta_base *bases,
                          const kvp_meta_str *drops, uint32_t ndrops);
/* Stateless: a message with a non-zero base or a drop is KVP_EPROTOCOL.
 * Everything lands in the arena. */
int kvp_meta_decode(const void *p, size_t len, kvp_arena *a, kvp_meta_step *out);

/*
 * The worker side's per-request mirror of what it has received: one
 * mirror per decoding thread (every TP rank decodes the same bytes into its
 * own mirror), fed every step's message in order. Not thread-safe.
 * Memory is bounded by the requests the scheduler has not dropped yet.
 */
typedef struct kvp_meta_mirror kvp_meta_mirror;
kvp_meta_mirror *kvp_meta_mirror_new(void); /* NULL on KVP_ENOMEM */
void kvp_meta_mirror_free(kvp_meta_mirror *m);
/* Number of requests the mirror holds. */
uint32_t kvp_meta_mirror_count(const kvp_meta_mirror *m);

/*
 * Decodes one step through the mirror (delta semantics above). On success
 * *out is the FULL step, exactly as the scheduler's non-delta view: block
 * tables, hashes and token ids point into the mirror's arrays, everything
 * else into the arena; valid until the next decode on this mirror (or its
 * free) and until the arena is reset. On an error the mirror is emptied.
 * m NULL: KVP_EINVALID_PARAMS.
 */
int kvp_meta_decode_delta(kvp_meta_mirror *m, const void *p, size_t len, kvp_arena *a,
                          kvp_meta_step *out);

/* Field-by-field equality of two steps (tests, fuzzing). */
bool kvp_meta_step_equal(const kvp_meta_step *x, const kvp_meta_step *y);

#endif
