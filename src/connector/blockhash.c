/*
 * blockhash.c -- vLLM chained block hashes: SHA-256, canonical CBOR, XXH3-128.
 * Contracts are in blockhash.h.
 */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: no allocation */
#include "connector/blockhash.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <xxhash.h>

#include "common/mem.h"
#include "kvpool.h"

/* ================================================================ algos */

size_t kvp_bh_hash_len(enum kvp_bh_algo algo)
{
    switch (algo) {
    case KVP_BH_SHA256_CBOR:
        return 32;
    case KVP_BH_XXHASH_CBOR:
        return 16;
    }
    return 0;
}

const char *kvp_bh_algo_name(enum kvp_bh_algo algo)
{
    switch (algo) {
    case KVP_BH_SHA256_CBOR:
        return "sha256_cbor";
    case KVP_BH_XXHASH_CBOR:
        return "xxhash_cbor";
    }
    return "unknown";
}

int kvp_bh_algo_parse(const char *name, enum kvp_bh_algo *out)
{
    if (!name || !out)
        return KVP_EINVALID_PARAMS;
    if (strcmp(name, "sha256_cbor") == 0) {
        *out = KVP_BH_SHA256_CBOR;
        return 0;
    }
    if (strcmp(name, "xxhash_cbor") == 0) {
        *out = KVP_BH_XXHASH_CBOR;
        return 0;
    }
    /* pickle / msgpack serialisations: Python-specific, see the header */
    if (strcmp(name, "sha256") == 0 || strcmp(name, "xxhash") == 0 ||
        strcmp(name, "sha256_msgpack") == 0)
        return KVP_ENOT_SUPPORTED;
    return KVP_EINVALID_PARAMS;
}

/* ================================================================ SHA-256 */

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror32(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

/* One 64-byte block (FIPS 180-4 §6.2.2). */
static void sha_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++)
        w[t] = (uint32_t)p[4 * t] << 24 | (uint32_t)p[4 * t + 1] << 16 |
               (uint32_t)p[4 * t + 2] << 8 | (uint32_t)p[4 * t + 3];
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = ror32(w[t - 15], 7) ^ ror32(w[t - 15], 18) ^ (w[t - 15] >> 3);
        uint32_t s1 = ror32(w[t - 2], 17) ^ ror32(w[t - 2], 19) ^ (w[t - 2] >> 10);
        w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t S1 = ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = hh + S1 + ch + sha_k[t] + w[t];
        uint32_t S0 = ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        hh = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

void kvp_bh_sha256_init(struct kvp_bh_sha256 *c)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, iv, sizeof iv);
    c->nbytes = 0;
    c->buflen = 0;
}

void kvp_bh_sha256_update(struct kvp_bh_sha256 *c, const void *data, size_t n)
{
    const uint8_t *p = data;
    c->nbytes += n;
    if (c->buflen) {
        size_t take = 64 - c->buflen < n ? 64 - c->buflen : n;
        memcpy(c->buf + c->buflen, p, take);
        c->buflen += take;
        p += take;
        n -= take;
        if (c->buflen < 64)
            return;
        sha_block(c->h, c->buf);
        c->buflen = 0;
    }
    for (; n >= 64; p += 64, n -= 64)
        sha_block(c->h, p);
    if (n) {
        memcpy(c->buf, p, n);
        c->buflen = n;
    }
}

void kvp_bh_sha256_final(struct kvp_bh_sha256 *c, uint8_t out[32])
{
    uint64_t bits = c->nbytes * 8;
    c->buf[c->buflen++] = 0x80;
    if (c->buflen > 56) {
        memset(c->buf + c->buflen, 0, 64 - c->buflen);
        sha_block(c->h, c->buf);
        c->buflen = 0;
    }
    memset(c->buf + c->buflen, 0, 56 - c->buflen);
    for (int i = 0; i < 8; i++)
        c->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_block(c->h, c->buf);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void kvp_bh_sha256(const void *data, size_t n, uint8_t out[32])
{
    struct kvp_bh_sha256 c;
    kvp_bh_sha256_init(&c);
    kvp_bh_sha256_update(&c, data, n);
    kvp_bh_sha256_final(&c, out);
}

/* ================================================================ CBOR */

void kvp_bh_cbor_init_buf(struct kvp_bh_cbor *c, uint8_t *buf, size_t cap)
{
    c->buf = buf;
    c->cap = buf ? cap : 0;
    c->len = 0;
    c->sink = NULL;
    c->sink_arg = NULL;
    c->staged = 0;
}

void kvp_bh_cbor_init_sink(struct kvp_bh_cbor *c, kvp_bh_sink_fn sink, void *arg)
{
    kvp_bh_cbor_init_buf(c, NULL, 0);
    c->sink = sink;
    c->sink_arg = arg;
}

static void cbor_flush(struct kvp_bh_cbor *c)
{
    if (c->staged) {
        c->sink(c->sink_arg, c->stage, c->staged);
        c->staged = 0;
    }
}

static void cbor_put(struct kvp_bh_cbor *c, const void *p, size_t n)
{
    if (c->sink) {
        if (n > sizeof c->stage - c->staged) {
            cbor_flush(c);
            if (n > sizeof c->stage) { /* large payload: straight through */
                c->sink(c->sink_arg, p, n);
                c->len += n;
                return;
            }
        }
        memcpy(c->stage + c->staged, p, n);
        c->staged += n;
    } else if (c->len < c->cap) {
        size_t room = c->cap - c->len;
        memcpy(c->buf + c->len, p, n < room ? n : room);
    }
    c->len += n;
}

/* Initial byte + argument in the shortest form (RFC 8949 §4.2.1). */
static void cbor_head(struct kvp_bh_cbor *c, unsigned major, uint64_t v)
{
    uint8_t h[9];
    size_t n;
    uint8_t mt = (uint8_t)(major << 5);
    if (v < 24) {
        h[0] = mt | (uint8_t)v;
        n = 1;
    } else if (v <= 0xff) {
        h[0] = mt | 24;
        h[1] = (uint8_t)v;
        n = 2;
    } else if (v <= 0xffff) {
        h[0] = mt | 25;
        h[1] = (uint8_t)(v >> 8);
        h[2] = (uint8_t)v;
        n = 3;
    } else if (v <= 0xffffffffu) {
        h[0] = mt | 26;
        for (int i = 0; i < 4; i++)
            h[1 + i] = (uint8_t)(v >> (24 - 8 * i));
        n = 5;
    } else {
        h[0] = mt | 27;
        for (int i = 0; i < 8; i++)
            h[1 + i] = (uint8_t)(v >> (56 - 8 * i));
        n = 9;
    }
    cbor_put(c, h, n);
}

void kvp_bh_cbor_uint(struct kvp_bh_cbor *c, uint64_t v)
{
    cbor_head(c, 0, v);
}

void kvp_bh_cbor_int(struct kvp_bh_cbor *c, int64_t v)
{
    if (v >= 0)
        cbor_head(c, 0, (uint64_t)v);
    else /* -1 - v, computed without overflow for INT64_MIN */
        cbor_head(c, 1, ~(uint64_t)v);
}

void kvp_bh_cbor_bytes(struct kvp_bh_cbor *c, const void *p, size_t n)
{
    cbor_head(c, 2, n);
    if (n)
        cbor_put(c, p, n);
}

void kvp_bh_cbor_text(struct kvp_bh_cbor *c, const char *s, size_t n)
{
    cbor_head(c, 3, n);
    if (n)
        cbor_put(c, s, n);
}

void kvp_bh_cbor_array(struct kvp_bh_cbor *c, uint64_t n)
{
    cbor_head(c, 4, n);
}

void kvp_bh_cbor_null(struct kvp_bh_cbor *c)
{
    static const uint8_t nul = 0xf6;
    cbor_put(c, &nul, 1);
}

int kvp_bh_cbor_finish(struct kvp_bh_cbor *c)
{
    if (c->sink) {
        cbor_flush(c);
        return 0;
    }
    return c->len <= c->cap ? 0 : KVP_EBUFFER_OVERFLOW;
}

size_t kvp_bh_cbor_len(const struct kvp_bh_cbor *c)
{
    return c->len;
}

/* ================================================================ hashing */

/* The hash function state: CBOR is streamed into it, never buffered whole. */
struct hasher {
    enum kvp_bh_algo algo;
    struct kvp_bh_sha256 sha;
    XXH3_state_t xxh;
};

static void hasher_sink(void *arg, const void *p, size_t n)
{
    struct hasher *h = arg;
    if (h->algo == KVP_BH_SHA256_CBOR)
        kvp_bh_sha256_update(&h->sha, p, n);
    else
        (void)XXH3_128bits_update(&h->xxh, p, n);
}

static void hasher_start(struct hasher *h, enum kvp_bh_algo algo, struct kvp_bh_cbor *enc)
{
    h->algo = algo;
    if (algo == KVP_BH_SHA256_CBOR)
        kvp_bh_sha256_init(&h->sha);
    else
        (void)XXH3_128bits_reset(&h->xxh);
    kvp_bh_cbor_init_sink(enc, hasher_sink, h);
}

static void hasher_end(struct hasher *h, struct kvp_bh_cbor *enc, struct kvp_bh_hash *out)
{
    (void)kvp_bh_cbor_finish(enc);
    memset(out, 0, sizeof *out);
    if (h->algo == KVP_BH_SHA256_CBOR) {
        kvp_bh_sha256_final(&h->sha, out->b);
        out->len = 32;
    } else {
        XXH128_canonical_t canon; /* big-endian: high64 then low64, like Python's digest() */
        XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&h->xxh));
        memcpy(out->b, canon.digest, 16);
        out->len = 16;
    }
}

int kvp_bh_none_hash(enum kvp_bh_algo algo, const char *seed, struct kvp_bh_hash *out)
{
    if (!out || kvp_bh_hash_len(algo) == 0)
        return KVP_EINVALID_PARAMS;
    if (!seed) {
        memset(out, 0, sizeof *out);
        size_t got = 0;
        while (got < 32) {
            ssize_t r = getrandom(out->b + got, 32 - got, 0);
            if (r < 0) {
                if (errno == EINTR)
                    continue;
                return KVP_EIO;
            }
            got += (size_t)r;
        }
        out->len = 32;
        return 0;
    }
    struct hasher h;
    struct kvp_bh_cbor enc;
    hasher_start(&h, algo, &enc);
    kvp_bh_cbor_text(&enc, seed, strlen(seed));
    hasher_end(&h, &enc, out);
    return 0;
}

static int keys_valid(const struct kvp_bh_key *keys, size_t nkeys)
{
    if (nkeys && !keys)
        return 0;
    for (size_t i = 0; i < nkeys; i++) {
        switch (keys[i].kind) {
        case KVP_BH_KEY_TEXT:
        case KVP_BH_KEY_BYTES:
        case KVP_BH_KEY_MM:
            if (keys[i].len && !keys[i].data)
                return 0;
            break;
        case KVP_BH_KEY_INT:
            break;
        default:
            return 0;
        }
    }
    return 1;
}

static void encode_key(struct kvp_bh_cbor *enc, const struct kvp_bh_key *k)
{
    switch (k->kind) {
    case KVP_BH_KEY_TEXT:
        kvp_bh_cbor_text(enc, k->data, k->len);
        break;
    case KVP_BH_KEY_INT:
        kvp_bh_cbor_int(enc, k->num);
        break;
    case KVP_BH_KEY_BYTES:
        kvp_bh_cbor_bytes(enc, k->data, k->len);
        break;
    case KVP_BH_KEY_MM:
        kvp_bh_cbor_array(enc, 2);
        kvp_bh_cbor_text(enc, k->data, k->len);
        kvp_bh_cbor_int(enc, k->num);
        break;
    }
}

/*
 * Hashes one block whose tokens are a[0..na) followed by b[0..nb) (the
 * incremental hasher's block may straddle its pending buffer and the new
 * tokens); arguments already validated.
 */
static void hash_block(enum kvp_bh_algo algo, const struct kvp_bh_hash *parent,
                       const int64_t *a, size_t na, const int64_t *b, size_t nb,
                       const struct kvp_bh_key *keys, size_t nkeys, struct kvp_bh_hash *out)
{
    struct hasher h;
    struct kvp_bh_cbor enc;
    hasher_start(&h, algo, &enc);
    kvp_bh_cbor_array(&enc, 3);
    kvp_bh_cbor_bytes(&enc, parent->b, parent->len);
    kvp_bh_cbor_array(&enc, (uint64_t)na + nb);
    for (size_t i = 0; i < na; i++)
        kvp_bh_cbor_int(&enc, a[i]);
    for (size_t i = 0; i < nb; i++)
        kvp_bh_cbor_int(&enc, b[i]);
    if (nkeys == 0) {
        kvp_bh_cbor_null(&enc);
    } else {
        kvp_bh_cbor_array(&enc, nkeys);
        for (size_t i = 0; i < nkeys; i++)
            encode_key(&enc, &keys[i]);
    }
    hasher_end(&h, &enc, out);
}

static int parent_valid(const struct kvp_bh_hash *p)
{
    return p && p->len > 0 && p->len <= KVP_BH_MAX_LEN;
}

int kvp_bh_hash_block(enum kvp_bh_algo algo, const struct kvp_bh_hash *parent,
                      const int64_t *tokens, size_t ntokens, const struct kvp_bh_key *keys,
                      size_t nkeys, struct kvp_bh_hash *out)
{
    if (!out || kvp_bh_hash_len(algo) == 0 || !parent_valid(parent) ||
        (ntokens && !tokens) || !keys_valid(keys, nkeys))
        return KVP_EINVALID_PARAMS;
    hash_block(algo, parent, tokens, ntokens, NULL, 0, keys, nkeys, out);
    return 0;
}

/* Block idx (tokens a ++ b, bs in all): ask extra for its keys, hash it. */
static int chain_step(enum kvp_bh_algo algo, const struct kvp_bh_hash *parent,
                      const int64_t *a, size_t na, const int64_t *b, size_t bs, size_t idx,
                      kvp_bh_extra_fn extra, void *arg, struct kvp_bh_hash *out)
{
    const struct kvp_bh_key *keys = NULL;
    size_t nkeys = 0;
    if (extra) {
        int rc = extra(arg, idx, idx * bs, (idx + 1) * bs, &keys, &nkeys);
        if (rc != 0)
            return rc;
        if (!keys_valid(keys, nkeys))
            return KVP_EINVALID_PARAMS;
    }
    hash_block(algo, parent, a, na, b, bs - na, keys, nkeys, out);
    return 0;
}

int kvp_bh_block_hashes(enum kvp_bh_algo algo, const struct kvp_bh_hash *none_hash,
                        const int64_t *tokens, size_t ntokens, size_t block_size,
                        kvp_bh_extra_fn extra, void *extra_arg, struct kvp_bh_hash *out,
                        size_t out_cap, size_t *nout)
{
    if (!nout || kvp_bh_hash_len(algo) == 0 || !parent_valid(none_hash) || block_size == 0 ||
        (ntokens && !tokens) || (out_cap && !out))
        return KVP_EINVALID_PARAMS;
    size_t nb = ntokens / block_size;
    *nout = nb;
    if (nb > out_cap)
        return KVP_EBUFFER_OVERFLOW;
    for (size_t i = 0; i < nb; i++) {
        int rc = chain_step(algo, i ? &out[i - 1] : none_hash, NULL, 0,
                            tokens + i * block_size, block_size, i, extra, extra_arg, &out[i]);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int kvp_bh_chain_init(struct kvp_bh_chain *ch, enum kvp_bh_algo algo,
                      const struct kvp_bh_hash *none_hash, size_t block_size,
                      kvp_bh_extra_fn extra, void *extra_arg)
{
    if (!ch)
        return KVP_EINVALID_PARAMS;
    memset(ch, 0, sizeof *ch);
    if (kvp_bh_hash_len(algo) == 0 || !parent_valid(none_hash) || block_size == 0 ||
        block_size > SIZE_MAX / sizeof(int64_t))
        return KVP_EINVALID_PARAMS;
    ch->pending = kvp_malloc(block_size * sizeof(int64_t));
    if (!ch->pending)
        return KVP_ENOMEM;
    ch->algo = algo;
    ch->block_size = block_size;
    ch->none_hash = *none_hash;
    ch->extra = extra;
    ch->extra_arg = extra_arg;
    return 0;
}

int kvp_bh_chain_append(struct kvp_bh_chain *ch, const int64_t *tokens, size_t n,
                        struct kvp_bh_hash *out, size_t out_cap, size_t *nout)
{
    if (!ch || !ch->pending || !nout || (n && !tokens) || (out_cap && !out))
        return KVP_EINVALID_PARAMS;
    size_t bs = ch->block_size;
    if (n > SIZE_MAX - bs)
        return KVP_EINVALID_PARAMS;
    size_t newb = (ch->npending + n) / bs;
    *nout = newb;
    if (newb > out_cap)
        return KVP_EBUFFER_OVERFLOW;
    /*
     * Hash every completed block into out[] first and commit the chain state
     * only when all succeeded, so an extra_fn failure leaves it unchanged.
     * The first new block takes the pending tokens plus the head of `tokens`.
     */
    const struct kvp_bh_hash *parent = ch->nblocks ? &ch->last : &ch->none_hash;
    size_t used = 0; /* tokens of `tokens` consumed by completed blocks */
    for (size_t i = 0; i < newb; i++) {
        size_t na = i == 0 ? ch->npending : 0;
        int rc = chain_step(ch->algo, parent, ch->pending, na, tokens + used, bs,
                            ch->nblocks + i, ch->extra, ch->extra_arg, &out[i]);
        if (rc != 0)
            return rc;
        used += bs - na;
        parent = &out[i];
    }
    if (newb) {
        ch->last = out[newb - 1];
        ch->nblocks += newb;
        ch->npending = 0;
    }
    if (n > used)
        memcpy(ch->pending + ch->npending, tokens + used, (n - used) * sizeof *tokens);
    ch->npending += n - used;
    return 0;
}

size_t kvp_bh_chain_ntokens(const struct kvp_bh_chain *ch)
{
    return ch->nblocks * ch->block_size + ch->npending;
}

void kvp_bh_chain_destroy(struct kvp_bh_chain *ch)
{
    if (!ch)
        return;
    kvp_free(ch->pending);
    ch->pending = NULL;
    ch->npending = 0;
}

char *kvp_bh_hex(const struct kvp_bh_hash *h, char *out, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    if (!out || cap == 0)
        return out;
    size_t n = 0;
    for (size_t i = 0; h && i < h->len && n + 2 < cap; i++) {
        out[n++] = digits[h->b[i] >> 4];
        out[n++] = digits[h->b[i] & 15];
    }
    out[n] = '\0';
    return out;
}
