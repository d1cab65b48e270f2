/*
 * keys.h -- store keys of the vLLM MooncakeStoreConnector (spec §4, baseline
 * B1): key metadata, PoolKey strings, per-group TP replication factors,
 * lookup prefixes and put striding.
 *
 *   key = [<cache_prefix>@]<model_name>[@cfg:<fp>]@tp_rank:<t>@pcp<p>@dcp<d>
 *         @pp_rank:<r>@group:<g>@<lower-case hex of the block hash>
 *
 * TP-independent layout (kvp_key_meta.by_head): "@kvh:<h>" (a global KV
 * head, or 0 for an MLA latent) takes the place of "@tp_rank:<t>": one
 * object per head and block, whatever the writer's TP size.
 *
 * <fp> is the engine's configuration fingerprint (lower-case hex, see
 * kvp_key_meta_set_fingerprint): engines whose KV bytes differ (model
 * weights, dtypes, layout) never share keys. It sits where vLLM's in-tree
 * connector puts its store namespace (after the model name); no fingerprint
 * = no "@cfg:" segment, the keys of vLLM's in-tree connector.
 *
 * Strings are built into caller buffers: every builder takes (out, cap) and
 * reports the length through *len (excluding the NUL). When cap is too small
 * it returns KVP_EBUFFER_OVERFLOW, sets *len to the length needed, and leaves
 * out as a (possibly truncated) NUL-terminated string if cap > 0. Nothing
 * here allocates. Integers print in decimal with no padding, as Python str().
 * All functions are pure and thread-safe.
 */
#ifndef KVP_CONNECTOR_KEYS_H
#define KVP_CONNECTOR_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_KEY_NAME_MAX 256 /* model name / cache prefix, bytes incl. NUL */
#define KVP_KEY_FP_MIN 12    /* configuration fingerprint: hex digits, at least */
#define KVP_KEY_FP_MAX 32    /* ... and at most */

/* KeyMetadata (§4.1). Ranks and group ids are >= 0. */
struct kvp_key_meta {
    char model_name[KVP_KEY_NAME_MAX];
    char cache_prefix[KVP_KEY_NAME_MAX]; /* "" = none */
    char fingerprint[KVP_KEY_FP_MAX + 1]; /* "" = none (no "@cfg:" segment) */
    int tp_rank;                         /* the KEY tp rank: tp_rank // factor(g);
                                            with by_head: the global KV head */
    bool by_head;                        /* "@kvh:<tp_rank>" instead of "@tp_rank:" */
    int pcp_rank;
    int dcp_rank;
    int pp_rank;
    int group_id;
};

/*
 * model_name = model_path.rstrip("/").split("/")[-1], as vLLM derives it
 * ("meta-llama/Llama-3.1-8B-Instruct" -> "Llama-3.1-8B-Instruct",
 * "/tmp/m/" -> "m", "/" or "" -> ""; Python accepts the empty name and so
 * do we). 0, KVP_EINVALID_PARAMS (NULL), or KVP_EBUFFER_OVERFLOW.
 */
int kvp_key_model_name(const char *model_path, char *out, size_t cap, size_t *len);

/*
 * Fills md from a model path (model_name derived as above), an optional
 * cache_prefix (NULL or "" = none) and the key ranks. Returns 0, or
 * KVP_EINVALID_PARAMS for a negative rank/group, a name or prefix that does
 * not fit KVP_KEY_NAME_MAX, or a '@' in the cache prefix (it would make
 * keys of different deployments ambiguous).
 */
int kvp_key_meta_init(struct kvp_key_meta *md, const char *model_path, const char *cache_prefix,
                      int tp_rank, int pcp_rank, int dcp_rank, int pp_rank, int group_id);

/*
 * 1 if fp is a valid configuration fingerprint: KVP_KEY_FP_MIN..KVP_KEY_FP_MAX
 * characters, each of [0-9a-f]; 0 otherwise (NULL, "", upper case, ...).
 */
int kvp_key_fingerprint_valid(const char *fp);

/*
 * Sets md's configuration fingerprint (kvp_key_meta_init leaves none):
 * fp NULL or "" = none, else it must pass kvp_key_fingerprint_valid.
 * 0, or KVP_EINVALID_PARAMS (md NULL, fp invalid; md unchanged then).
 */
int kvp_key_meta_set_fingerprint(struct kvp_key_meta *md, const char *fp);

/* Passed for a rank to build_prefix: use md's own value (Python's None). */
#define KVP_KEY_RANK_SELF (-1)

/*
 * build_prefix (§4.2): "[prefix@]model[@cfg:FP]@tp_rank:T@pcpP@dcpD@pp_rank:R@group:G"
 * ("@cfg:FP" only when md has a fingerprint).
 * Each rank argument overrides md's unless KVP_KEY_RANK_SELF.
 */
int kvp_key_build_prefix(const struct kvp_key_meta *md, int tp_rank, int pcp_rank, int dcp_rank,
                         int pp_rank, char *out, size_t cap, size_t *len);

/*
 * The key of the configuration's descriptor object (kvp_worker_cfg's
 * config_description): "[prefix@]model@cfg:FP@kvpool-config". No block key
 * equals it (they go on with "@tp_rank:" or "@kvh:" after the fingerprint), and it
 * shares the blocks' "[prefix@]model@cfg:FP" namespace (a regex removing
 * them matches it too). KVP_EINVALID_PARAMS when md has no fingerprint.
 */
#define KVP_KEY_CONFIG_SUFFIX "@kvpool-config"
int kvp_key_build_config_key(const struct kvp_key_meta *md, char *out, size_t cap, size_t *len);

/* build_key_string: prefix[0..prefix_len) + "@" + hex(hash[0..hash_len)). */
int kvp_key_build_key_string(const char *prefix, size_t prefix_len, const uint8_t *hash,
                             size_t hash_len, char *out, size_t cap, size_t *len);

/* PoolKey(md, hash).to_string() = build_key_string(build_prefix(md), hash). */
int kvp_key_build(const struct kvp_key_meta *md, const uint8_t *hash, size_t hash_len, char *out,
                  size_t cap, size_t *len);

/* --------------------------------------------------------- TP replication */

/* The KV-cache spec classes that matter for the replication factor. */
enum kvp_key_spec {
    KVP_KEY_SPEC_ATTENTION = 1, /* FullAttention / SlidingWindow / ChunkedLocal: GQA heads */
    KVP_KEY_SPEC_MLA = 2,       /* MLAAttentionSpec */
    KVP_KEY_SPEC_SWA_MLA = 3,   /* SlidingWindowMLASpec */
    KVP_KEY_SPEC_MAMBA = 4,     /* MambaSpec (rank-specific state) */
};

/*
 * factor(g) (§4.3): how many TP ranks hold byte-identical data for a group
 * whose layer specs are inner[0..ninner) (one entry for a plain group; the
 * per-layer specs of a UniformTypeKVCacheSpecs):
 *   dcp_size > 1            -> 1
 *   any inner is Mamba      -> 1
 *   all inner are (SW)MLA   -> tp_size
 *   otherwise               -> max(1, tp_size / num_kv_heads)
 * Returns 0 with *factor set, or KVP_EINVALID_PARAMS (ninner == 0, unknown
 * spec, tp_size/dcp_size < 1, num_kv_heads < 1 when it is needed).
 */
int kvp_key_tp_factor(const enum kvp_key_spec *inner, size_t ninner, int tp_size,
                      int num_kv_heads, int dcp_size, int *factor);

/* Key tp rank of a worker for a group with that factor: tp_rank / factor. */
int kvp_key_tp_rank_for_group(int tp_rank, int factor);

/* --------------------------------------------------------- lookup prefixes */

/* One rank namespace (tp, pcp, dcp, pp) as it appears in a key. */
struct kvp_key_ns {
    int tp, pcp, dcp, pp;
};

/*
 * Namespaces that must all hold a hash of group g for it to count (§4.4),
 * in vLLM's order:
 *   dcp_size > 1: for pcp, for tp < tp_size, for pp: (tp, pcp, tp % dcp_size, pp)
 *   else:         for pcp, for shard < tp_size / factor, for pp: (shard, pcp, 0, pp)
 * *n = the count; KVP_EBUFFER_OVERFLOW (with *n the count needed) if it
 * exceeds cap. KVP_EINVALID_PARAMS for sizes < 1 or factor < 1.
 */
int kvp_key_lookup_namespaces(int tp_size, int pcp_size, int dcp_size, int pp_size, int factor,
                              struct kvp_key_ns *out, size_t cap, size_t *n);

/*
 * The lookup prefixes of md's group: build_prefix(md, ns) for each namespace
 * above, written back to back into buf as NUL-terminated strings; off[i] is
 * the offset of prefix i. *n = count, *used = bytes of buf used. Overflow of
 * either buf or off returns KVP_EBUFFER_OVERFLOW with *n and *used set to
 * what is needed. ns_scratch (nscratch entries) holds the namespaces while
 * building; it must have room for all of them.
 */
int kvp_key_lookup_prefixes(const struct kvp_key_meta *md, int tp_size, int pcp_size,
                            int dcp_size, int pp_size, int factor, struct kvp_key_ns *ns_scratch,
                            size_t nscratch, char *buf, size_t buf_cap, size_t *off,
                            size_t off_cap, size_t *n, size_t *used);

/* --------------------------------------------------------- put striding */

/*
 * §4.5: rank tp_rank stores chunk `chunk` of group `group_id` iff
 *   chunk % put_step == (tp_rank + group_id) % put_step,
 * with put_step = factor(g) and chunk the ABSOLUTE chunk index (never
 * relative to a resume offset), so the ranks sharing a namespace
 * (same tp_rank / factor) together store every chunk exactly once.
 * put_step <= 1 stores everything; negative arguments store nothing.
 */
bool kvp_key_put_mine(int64_t chunk, int tp_rank, int group_id, int put_step);

#endif
