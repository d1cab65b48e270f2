/*
 * blockhash.h -- vLLM's chained prefix-cache block hashes, for engines that
 * do not hand us their own (spec §5, vllm/v1/core/kv_cache_utils.py and
 * vllm/utils/hashing.py).
 *
 *   H_i = hash_fn( [ H_{i-1} (or NONE_HASH for i == 0),
 *                    [tok_{i*B} .. tok_{(i+1)*B-1}],
 *                    extra_keys_i | null ] )
 *
 * where the Python tuple is serialised with cbor2.dumps(obj, canonical=True)
 * and hash_fn is SHA-256 (sha256_cbor, 32-byte digests) or XXH3-128
 * (xxhash_cbor, 16-byte digests, big-endian canonical form as Python's
 * xxhash.xxh3_128(...).digest()). Only FULL blocks of block_size tokens are
 * hashed; a partial trailing block has no hash.
 *
 * Not implemented, on purpose: vLLM's default `sha256` and `xxhash`
 * algorithms hash pickle.dumps(obj, HIGHEST_PROTOCOL). Pickle output is a
 * CPython implementation detail (opcode choice, memoisation, framing, and
 * it has changed between protocol versions), so a C engine cannot reproduce
 * it reliably and would not interoperate with a Python vLLM sharing the
 * store. kvp_bh_algo_parse reports them as KVP_ENOT_SUPPORTED; deployments
 * that share a store with vLLM must run it with
 * --prefix-caching-hash-algo sha256_cbor (or xxhash_cbor).
 *
 * NONE_HASH (the parent of block 0): with PYTHONHASHSEED set, vLLM uses
 * hash_fn(PYTHONHASHSEED) -- the seed hashed as a CBOR *text string* -- so
 * every process agrees. With it unset, vLLM uses os.urandom(32): 32 random
 * bytes (also for xxhash, whose own digests are 16 bytes), different in
 * every process, so no two instances ever share a prefix. All instances
 * sharing a store must agree on algo AND seed; kvp_bh_none_hash(algo, NULL)
 * reproduces the random case for completeness.
 *
 * Thread-safety: all functions are reentrant; a kvp_bh_chain belongs to one
 * thread at a time. No function here allocates except kvp_bh_chain_init.
 */
#ifndef KVP_CONNECTOR_BLOCKHASH_H
#define KVP_CONNECTOR_BLOCKHASH_H

#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ algorithms */

enum kvp_bh_algo {
    KVP_BH_SHA256_CBOR = 1, /* sha256(cbor2.dumps(obj, canonical=True)), 32 B */
    KVP_BH_XXHASH_CBOR = 2, /* xxh3_128(cbor2.dumps(...)).digest(), 16 B */
};

#define KVP_BH_MAX_LEN 32 /* longest digest / NONE_HASH, bytes */

/* A block hash (or NONE_HASH): len bytes of b. len is 16 or 32. */
struct kvp_bh_hash {
    uint8_t len;
    uint8_t b[KVP_BH_MAX_LEN];
};

/* Digest length of algo in bytes (32 or 16); 0 for an unknown algo. */
size_t kvp_bh_hash_len(enum kvp_bh_algo algo);
/* vLLM's --prefix-caching-hash-algo spelling: "sha256_cbor" / "xxhash_cbor". */
const char *kvp_bh_algo_name(enum kvp_bh_algo algo);
/*
 * Parses a vLLM algo name. Returns 0, KVP_ENOT_SUPPORTED for the pickle
 * variants "sha256"/"xxhash" (and "sha256_msgpack"), KVP_EINVALID_PARAMS for
 * anything else.
 */
int kvp_bh_algo_parse(const char *name, enum kvp_bh_algo *out);

/* ------------------------------------------------------------ SHA-256 */

/* FIPS 180-4 SHA-256, streaming. */
struct kvp_bh_sha256 {
    uint32_t h[8];
    uint64_t nbytes;  /* total bytes absorbed */
    uint8_t buf[64];  /* partial block */
    size_t buflen;
};
void kvp_bh_sha256_init(struct kvp_bh_sha256 *c);
void kvp_bh_sha256_update(struct kvp_bh_sha256 *c, const void *data, size_t n);
/* Writes the 32-byte digest; c must be re-initialised before reuse. */
void kvp_bh_sha256_final(struct kvp_bh_sha256 *c, uint8_t out[32]);
void kvp_bh_sha256(const void *data, size_t n, uint8_t out[32]);

/* ------------------------------------------------------------ canonical CBOR */

/*
 * An encoder for exactly the shapes block hashing needs (RFC 8949 §4.2.1
 * core deterministic encoding == cbor2 canonical=True for these types):
 * unsigned and negative integers in their shortest form, byte strings,
 * UTF-8 text strings, definite-length arrays, null. No maps, floats, tags or
 * indefinite lengths. Text is written as given (the caller supplies UTF-8).
 *
 * Two modes:
 *  - buffer: bytes go to buf[0..cap); writing past cap is not an error at
 *    the call, but kvp_bh_cbor_finish then returns KVP_EBUFFER_OVERFLOW and
 *    kvp_bh_cbor_len() is the size that would have been needed. buf NULL
 *    measures only (cap is then taken as 0).
 *  - sink: bytes are staged and handed to sink(arg, p, n) in order; nothing
 *    is allocated, any size can be encoded. kvp_bh_cbor_finish flushes.
 */
typedef void (*kvp_bh_sink_fn)(void *arg, const void *p, size_t n);
struct kvp_bh_cbor {
    uint8_t *buf;
    size_t cap;
    size_t len; /* bytes produced so far (buffer mode: incl. the overflow) */
    kvp_bh_sink_fn sink;
    void *sink_arg;
    size_t staged;
    uint8_t stage[256];
};
void kvp_bh_cbor_init_buf(struct kvp_bh_cbor *c, uint8_t *buf, size_t cap);
void kvp_bh_cbor_init_sink(struct kvp_bh_cbor *c, kvp_bh_sink_fn sink, void *arg);
void kvp_bh_cbor_uint(struct kvp_bh_cbor *c, uint64_t v);          /* major 0 */
void kvp_bh_cbor_int(struct kvp_bh_cbor *c, int64_t v);            /* major 0/1 */
void kvp_bh_cbor_bytes(struct kvp_bh_cbor *c, const void *p, size_t n); /* major 2 */
void kvp_bh_cbor_text(struct kvp_bh_cbor *c, const char *s, size_t n);  /* major 3 */
void kvp_bh_cbor_array(struct kvp_bh_cbor *c, uint64_t n); /* major 4 header; n items follow */
void kvp_bh_cbor_null(struct kvp_bh_cbor *c);              /* 0xf6 */
/* Flushes a sink; 0, or KVP_EBUFFER_OVERFLOW when a buffer was too small. */
int kvp_bh_cbor_finish(struct kvp_bh_cbor *c);
size_t kvp_bh_cbor_len(const struct kvp_bh_cbor *c);

/* ------------------------------------------------------------ extra keys */

/*
 * One element of a block's extra_keys tuple (vLLM: lora_keys + mm_keys +
 * cache_salt_keys + prompt_embeds_keys):
 *   TEXT  -- a str: LoRA name, cache salt          -> CBOR text (data, len)
 *   INT   -- an int                                 -> CBOR int (num)
 *   BYTES -- a bytes: prompt-embeds sha256 digest   -> CBOR bytes (data, len)
 *   MM    -- a multimodal key tuple (identifier, offset of the item relative
 *            to the block start)                    -> CBOR [text(data, len), int(num)]
 */
enum kvp_bh_key_kind {
    KVP_BH_KEY_TEXT = 1,
    KVP_BH_KEY_INT = 2,
    KVP_BH_KEY_BYTES = 3,
    KVP_BH_KEY_MM = 4,
};
struct kvp_bh_key {
    enum kvp_bh_key_kind kind;
    const void *data;
    size_t len;
    int64_t num;
};

/*
 * Supplies the extra keys of block `block_idx`, which covers tokens
 * [start, end) of the request. Sets *keys / *nkeys (nkeys == 0: the block has
 * no extra keys, hashed as null -- vLLM's None); the array must stay valid
 * until the next call or the return of the hashing function. Returns 0 or a
 * negative KVP_E* code, which aborts hashing and is passed through.
 */
typedef int (*kvp_bh_extra_fn)(void *arg, size_t block_idx, size_t start, size_t end,
                               const struct kvp_bh_key **keys, size_t *nkeys);

/* ------------------------------------------------------------ hashing */

/*
 * NONE_HASH. seed != NULL: hash_fn(seed) with seed encoded as a CBOR text
 * string (vLLM init_none_hash with PYTHONHASHSEED=seed). seed == NULL: 32
 * random bytes from getrandom(2) (vLLM without PYTHONHASHSEED; such a value
 * is private to this process). Returns 0, KVP_EINVALID_PARAMS, or KVP_EIO.
 */
int kvp_bh_none_hash(enum kvp_bh_algo algo, const char *seed, struct kvp_bh_hash *out);

/*
 * One block: hash_fn([parent, [tokens...], extra_keys | null]).
 * parent NULL or parent->len == 0 means "no parent" and is an error here:
 * the caller passes NONE_HASH for block 0 (as vLLM's `parent or NONE_HASH`).
 * nkeys == 0 encodes null. Returns 0 or KVP_EINVALID_PARAMS.
 */
int kvp_bh_hash_block(enum kvp_bh_algo algo, const struct kvp_bh_hash *parent,
                      const int64_t *tokens, size_t ntokens,
                      const struct kvp_bh_key *keys, size_t nkeys,
                      struct kvp_bh_hash *out);

/*
 * All full-block hashes of a token sequence: out[i] covers tokens
 * [i*block_size, (i+1)*block_size), parent of block 0 is none_hash.
 * Writes *nout = ntokens / block_size hashes; if that exceeds out_cap
 * nothing is written beyond out_cap and KVP_EBUFFER_OVERFLOW is returned
 * (with *nout the number needed). extra may be NULL (no extra keys).
 */
int kvp_bh_block_hashes(enum kvp_bh_algo algo, const struct kvp_bh_hash *none_hash,
                        const int64_t *tokens, size_t ntokens, size_t block_size,
                        kvp_bh_extra_fn extra, void *extra_arg,
                        struct kvp_bh_hash *out, size_t out_cap, size_t *nout);

/*
 * Incremental hasher over a growing request (vLLM's request block hasher):
 * tokens are appended as they are known (prompt, then generated tokens);
 * each completed block yields one new hash, chained on the previous one.
 */
struct kvp_bh_chain {
    enum kvp_bh_algo algo;
    size_t block_size;
    struct kvp_bh_hash none_hash;
    struct kvp_bh_hash last;  /* hash of block nblocks-1 (unset if nblocks == 0) */
    size_t nblocks;           /* full blocks hashed so far */
    int64_t *pending;         /* block_size slots; the partial trailing block */
    size_t npending;
    kvp_bh_extra_fn extra;
    void *extra_arg;
};
/* Allocates the pending buffer (block_size tokens). 0, KVP_EINVALID_PARAMS or KVP_ENOMEM. */
int kvp_bh_chain_init(struct kvp_bh_chain *ch, enum kvp_bh_algo algo,
                      const struct kvp_bh_hash *none_hash, size_t block_size,
                      kvp_bh_extra_fn extra, void *extra_arg);
/*
 * Appends n tokens; the hashes of the blocks they complete go to out[0..),
 * *nout = their number. If more than out_cap blocks would complete, returns
 * KVP_EBUFFER_OVERFLOW with *nout the number needed and the chain
 * unchanged. An extra_fn error is returned as is; the chain is then
 * unchanged too (hashes written to out before the failure are not kept).
 */
int kvp_bh_chain_append(struct kvp_bh_chain *ch, const int64_t *tokens, size_t n,
                        struct kvp_bh_hash *out, size_t out_cap, size_t *nout);
/* Tokens appended so far (full blocks + pending). */
size_t kvp_bh_chain_ntokens(const struct kvp_bh_chain *ch);
void kvp_bh_chain_destroy(struct kvp_bh_chain *ch);

/* Lower-case hex of h into out (2*len+1 bytes incl. NUL); returns out. */
char *kvp_bh_hex(const struct kvp_bh_hash *h, char *out, size_t cap);

#endif
