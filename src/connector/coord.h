/*
 * coord.h -- hybrid KV-cache hit / mask oracle (spec §7, "MooncakeStoreCoordinator").
 *
 * Given the KV-cache groups of a model (full attention, sliding window,
 * Mamba in "align" mode), the request's block-hash chain (one hash per
 * hash_block_size = H tokens) and the set of (group, hash) objects the store
 * holds, the coordinator answers:
 *   - how many leading tokens vLLM's hybrid prefix cache would accept as a
 *     hit (find_longest_cache_hit, §7.3/§7.4), and which chunks of each group
 *     that hit needs (per-group masks);
 *   - which chunks a receiver must load for a given hit (load_mask, §7.5);
 *   - which chunks must be stored / probed for a given length (store_mask,
 *     lookup_mask, §7.6).
 *
 * Vocabulary: B_g = block size of group g, H = hash block size, L = lcm of
 * the B_g (= scheduler block size). Chunk c of group g covers tokens
 * [c*B_g, (c+1)*B_g) and is keyed by the LAST sub-hash of the chunk:
 * hashes[(c+1)*(B_g/H) - 1] (compact view, §5/§7.7). A fine unit u (partial
 * hash hits) is keyed by hashes[u].
 *
 * Invariants (checked by kvp_coord_create): H > 0, every B_g % H == 0,
 * L % H == 0, L % B_g == 0, 1..KVP_COORD_MAX_GROUPS groups.
 *
 * Memory: kvp_coord_create and the pool allocate through common/mem.h; the
 * queries (find/load/store/lookup masks) never allocate: they write into the
 * caller's kvp_coord_mask arrays (size them with kvp_coord_mask_cap).
 * A kvp_coord is immutable after creation, so queries may run concurrently.
 * Everything is deterministic (no randomness, no address-dependent order).
 */
#ifndef KVP_CONNECTOR_COORD_H
#define KVP_CONNECTOR_COORD_H

#include <stddef.h>
#include <stdint.h>

#define KVP_COORD_MAX_GROUPS 64

enum kvp_coord_kind {
    KVP_COORD_FULL = 0,  /* full attention (incl. MLA) */
    KVP_COORD_SWA = 1,   /* sliding window attention, `window` tokens */
    KVP_COORD_MAMBA = 2, /* Mamba / linear attention, "align" cache mode */
};

/* One KV-cache group (vLLM KVCacheGroupSpec, unwrapped). */
struct kvp_coord_group {
    enum kvp_coord_kind kind;
    uint32_t block_size; /* B_g tokens per block, > 0 */
    uint32_t window;     /* SWA only: sliding window in tokens (>= 1) */
    /* Opaque: two groups share one attention manager ("merged", §7.2) only
     * when kind, block_size, window and spec_tag are all equal. Stands for
     * the parts of vLLM's spec this module does not model (dtype, heads). */
    uint32_t spec_tag;
    int is_eagle; /* KVCacheGroupSpec.is_eagle_group */
};

struct kvp_coord_cfg {
    const struct kvp_coord_group *groups;
    size_t ngroups;
    /* L. 0 = lcm of the group block sizes; otherwise it must be a common
     * multiple of every B_g and of H. */
    uint32_t scheduler_block_size;
    uint32_t hash_block_size; /* H, > 0, must divide every B_g */
    int use_eagle;            /* speculative_config.use_eagle() */
    /* VLLM_PREFIX_CACHE_RETENTION_INTERVAL; < 0 = None (unset). */
    int64_t retention_interval;
    uint32_t dcp_world_size; /* 0 is read as 1 */
};

/*
 * A read-only view of a hash chain: element i is hash_len bytes at
 * data + i*stride (stride 0 = hash_len, i.e. packed). The caller keeps the
 * bytes alive while the view is used.
 */
struct kvp_coord_hashes {
    const uint8_t *data;
    size_t n;
    size_t hash_len;
    size_t stride;
};

/*
 * A per-group chunk mask. The caller owns `bits` (cap entries); a query sets
 * first/len/all and bits[0..len):
 *   - chunk `first + i` is selected iff all || bits[i] (bits hold 0/1);
 *   - all == 1 is Python's `None` sentinel (every chunk of the range);
 *     bits are then untouched;
 *   - find_longest_cache_hit / load_mask: first == 0, all == 0, len = the
 *     group's block-list length, bits[i] = block i is not the null block.
 */
struct kvp_coord_mask {
    uint8_t *bits;
    size_t cap;
    size_t first;
    size_t len;
    int all;
};

struct kvp_coord;
struct kvp_coord_pool;

/* ---------------------------------------------------------------- sizes */

/*
 * resolve_kv_cache_block_sizes (§5), for already-scaled group block sizes:
 * one group -> L = H = B_0; several -> L = lcm(B_g), H = hash_block_size if
 * non-zero else gcd(B_g). Every B_g % H != 0 -> KVP_EINVALID_PARAMS, as is
 * ngroups == 0, a zero block size or an lcm above UINT32_MAX.
 */
int kvp_coord_resolve_block_sizes(const struct kvp_coord_group *groups, size_t ngroups,
                                  uint32_t hash_block_size, uint32_t *sched_out,
                                  uint32_t *hash_out);

/* ---------------------------------------------------------------- pool */

/*
 * ExternalCachedBlockPool (§7.1): the set of (group_id, hash bytes) the
 * store holds, built by the caller from EXIST/PREFIX answers. Open
 * addressing with linear probing, power-of-two table kept at most half
 * full; grows (one kvp_calloc) on insert. Not thread-safe for writers.
 * The "tautological" pool of §7.1 (exists = None) is a NULL pool pointer.
 */
int kvp_coord_pool_create(struct kvp_coord_pool **out, size_t hash_len, size_t expected);
void kvp_coord_pool_destroy(struct kvp_coord_pool *p);
/* Adds (group, hash[0..hash_len)); a duplicate is a no-op. 0 / KVP_ENOMEM. */
int kvp_coord_pool_add(struct kvp_coord_pool *p, uint32_t group, const uint8_t *hash);
/* 1 if present, 0 if not. */
int kvp_coord_pool_contains(const struct kvp_coord_pool *p, uint32_t group, const uint8_t *hash);
size_t kvp_coord_pool_count(const struct kvp_coord_pool *p);
size_t kvp_coord_pool_hash_len(const struct kvp_coord_pool *p);
/*
 * get_cached_block: present only if (g, hash) is in the pool for EVERY g in
 * gids; a NULL pool is tautological (always present).
 */
int kvp_coord_pool_has_all(const struct kvp_coord_pool *p, const uint32_t *gids, size_t ngids,
                           const uint8_t *hash);

/* ---------------------------------------------------------------- coordinator */

/* 0, KVP_EINVALID_PARAMS (see the invariants above), KVP_ENOMEM. */
int kvp_coord_create(struct kvp_coord **out, const struct kvp_coord_cfg *cfg);
void kvp_coord_destroy(struct kvp_coord *c);

size_t kvp_coord_ngroups(const struct kvp_coord *c);
const struct kvp_coord_group *kvp_coord_group_spec(const struct kvp_coord *c, size_t g);
uint32_t kvp_coord_lcm_block_size(const struct kvp_coord *c);  /* L */
uint32_t kvp_coord_hash_block_size(const struct kvp_coord *c); /* H */
/* partial_hash_hits_enabled (§7.2): some Mamba group with B > H (dcp == 1)
 * or B >= H (dcp > 1). */
int kvp_coord_partial_hits(const struct kvp_coord *c);
/* A = H with partial hash hits, else L. */
uint32_t kvp_coord_alignment(const struct kvp_coord *c);
/* align_lookup_length(n) = n / A * A. */
size_t kvp_coord_align_lookup_length(const struct kvp_coord *c, size_t n);
/* 1 if group g is in eagle_group_ids (§7.2). */
int kvp_coord_is_eagle_group(const struct kvp_coord *c, size_t g);
/* Bits a kvp_coord_mask of group g needs for any query over `tokens`
 * tokens: ceil(tokens / B_g). */
size_t kvp_coord_mask_cap(const struct kvp_coord *c, size_t g, size_t tokens);

/*
 * block_hashes_for_spec (§7.7): the compact last-sub-hash view of `in` at
 * block size B: element c = in[(c+1)*(B/H) - 1], n = in.n / (B/H). Zero
 * copy (a strided view into in's bytes). B % H != 0 or H == 0 ->
 * KVP_EINVALID_PARAMS.
 */
int kvp_coord_block_hashes_for_spec(const struct kvp_coord_hashes *in, uint32_t hash_block_size,
                                    uint32_t block_size, struct kvp_coord_hashes *out);

/*
 * find_longest_cache_hit (§7.4). masks[0..ngroups) get each group's block
 * list (bits[i] = block i present, non-null); *hit_out the hit in tokens
 * (<= max_length, a multiple of kvp_coord_alignment except that the
 * fine-grained rules of §7.3 yield multiples of H). pool NULL = tautological.
 * apply_eagle: drop the EAGLE block for eagle groups (once, §16.6).
 * Errors: KVP_EINVALID_PARAMS (hash_len mismatch with the pool, NULL args),
 * KVP_EBUFFER_OVERFLOW (a mask cap < kvp_coord_mask_cap(g, max_length)).
 */
int kvp_coord_find_longest_cache_hit(const struct kvp_coord *c,
                                     const struct kvp_coord_hashes *hashes, size_t max_length,
                                     const struct kvp_coord_pool *pool, int apply_eagle,
                                     struct kvp_coord_mask *masks, size_t *hit_out);

/*
 * load_mask (§7.5): find_longest_cache_hit over the tautological pool with
 * apply_eagle = 0 (token_len is already the eagle-pruned hit). hit_out
 * (may be NULL) receives the reconstructed hit, which a caller may compare
 * with token_len.
 */
int kvp_coord_load_mask(const struct kvp_coord *c, const struct kvp_coord_hashes *hashes,
                        size_t token_len, struct kvp_coord_mask *masks, size_t *hit_out);

/*
 * store_mask (§7.6): per group g, end = aligned/B_g, first = min(end,
 * ceil(start_token/B_g)), len = end - first; Mamba groups all-0; others
 * follow reachable_block_mask with retention = cfg.retention_interval and
 * the replay boundary num_prompt_tokens - 1 (num_prompt_tokens < 0 = None).
 * use_eagle for g = apply_eagle && kvp_coord_is_eagle_group(g).
 * aligned % alignment != 0 -> KVP_EINVALID_PARAMS; a cap below len for a
 * group whose answer is not dense -> KVP_EBUFFER_OVERFLOW.
 */
int kvp_coord_store_mask(const struct kvp_coord *c, size_t aligned_token_len, size_t start_token,
                         int64_t num_prompt_tokens, int apply_eagle, struct kvp_coord_mask *masks);

/* lookup_mask (§7.6): as store_mask with start 0, retention None, no
 * boundaries, and Mamba groups following reachable_block_mask (all). */
int kvp_coord_lookup_mask(const struct kvp_coord *c, size_t aligned_token_len, int apply_eagle,
                          struct kvp_coord_mask *masks);

/*
 * reachable_block_mask (§7.6) of group g over absolute chunks [start, end)
 * with alignment L: retention < 0 = None; boundaries are token positions
 * (e.g. the replay boundary num_prompt_tokens - 1). Full attention -> all.
 * Writes out->first = start, out->len = end - start. start > end ->
 * KVP_EINVALID_PARAMS; cap < end - start -> KVP_EBUFFER_OVERFLOW, but only
 * when the answer is not dense (a dense answer never touches bits).
 * An empty range (start == end) is reported dense.
 */
int kvp_coord_reachable_block_mask(const struct kvp_coord *c, size_t g, size_t start, size_t end,
                                   int use_eagle, int64_t retention, const int64_t *boundaries,
                                   size_t nboundaries, struct kvp_coord_mask *out);

#endif
