/*
 * fuzz_blockhash.c -- libFuzzer target for connector/blockhash.
 *
 * Input layout (every field optional; missing bytes read as 0):
 *   byte 0      bit 0: algo (sha256_cbor / xxhash_cbor); bits 1-5: block_size-1
 *   byte 1      number of extra-key items per block (0..7)
 *   byte 2      append step for the incremental chain (1..256)
 *   then        extra-key items: kind byte, length byte, that many data bytes,
 *               8 bytes of integer; then tokens: 8 bytes each (any int64)
 * Invariants checked (abort on violation): the whole-sequence hashes equal
 * the incremental chain's and kvp_bh_hash_block's, block by block; the CBOR
 * encoder gives the same bytes in buffer and sink mode and reports the
 * needed size on overflow; nothing leaks (counted allocator back to its
 * starting level).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/blockhash.h"
#include "kvpool.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct rd {
    const uint8_t *p;
    size_t n;
};

static uint8_t rd_u8(struct rd *r)
{
    if (!r->n)
        return 0;
    r->n--;
    return *r->p++;
}

static int64_t rd_i64(struct rd *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | rd_u8(r);
    return (int64_t)v;
}

struct xk {
    struct kvp_bh_key k[8];
    uint8_t d[8][255];
    size_t n;
};

static int fz_extra(void *arg, size_t idx, size_t start, size_t end,
                    const struct kvp_bh_key **keys, size_t *nkeys)
{
    struct xk *x = arg;
    (void)start;
    (void)end;
    *keys = x->k;
    *nkeys = (idx % 3 == 2) ? 0 : x->n; /* some blocks with null extra keys */
    return 0;
}

struct cat {
    uint8_t *b;
    size_t n, cap;
};
static void cat_sink(void *arg, const void *p, size_t n)
{
    struct cat *c = arg;
    if (c->n + n <= c->cap)
        memcpy(c->b + c->n, p, n);
    c->n += n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct rd r = {data, size};
    uint8_t b0 = rd_u8(&r);
    enum kvp_bh_algo algo = (b0 & 1) ? KVP_BH_XXHASH_CBOR : KVP_BH_SHA256_CBOR;
    size_t bs = (size_t)((b0 >> 1) & 31) + 1;
    size_t nx = rd_u8(&r) & 7;
    size_t step = (size_t)rd_u8(&r) + 1;
    uint64_t before = kvp_mem_used();

    static struct xk x;
    x.n = nx;
    for (size_t i = 0; i < nx; i++) {
        uint8_t kind = rd_u8(&r);
        size_t len = rd_u8(&r);
        if (len > r.n)
            len = r.n;
        memcpy(x.d[i], r.p, len);
        r.p += len;
        r.n -= len;
        x.k[i] = (struct kvp_bh_key){.kind = (enum kvp_bh_key_kind)(kind % 4 + 1),
                                     .data = x.d[i],
                                     .len = len,
                                     .num = rd_i64(&r)};
    }
    size_t ntok = r.n / 8;
    int64_t *tok = malloc((ntok ? ntok : 1) * sizeof *tok);
    size_t nb = ntok / bs;
    struct kvp_bh_hash *h1 = malloc((nb + 1) * sizeof *h1);
    struct kvp_bh_hash *h2 = malloc((nb + 1) * sizeof *h2);
    if (!tok || !h1 || !h2)
        abort();
    for (size_t i = 0; i < ntok; i++)
        tok[i] = rd_i64(&r);

    struct kvp_bh_hash none, one;
    if (kvp_bh_none_hash(algo, (b0 & 0x40) ? "0" : "12345", &none) != 0)
        abort();
    size_t n = 0;
    if (kvp_bh_block_hashes(algo, &none, tok, ntok, bs, fz_extra, &x, h1, nb, &n) != 0 || n != nb)
        abort();
    for (size_t i = 0; i < nb; i++) {
        size_t nk = (i % 3 == 2) ? 0 : x.n;
        if (kvp_bh_hash_block(algo, i ? &h1[i - 1] : &none, tok + i * bs, bs, x.k, nk, &one) != 0)
            abort();
        if (one.len != kvp_bh_hash_len(algo) || memcmp(one.b, h1[i].b, one.len) != 0)
            abort();
    }
    struct kvp_bh_chain ch;
    if (kvp_bh_chain_init(&ch, algo, &none, bs, fz_extra, &x) != 0)
        abort();
    size_t have = 0;
    for (size_t pos = 0; pos < ntok;) {
        size_t k = step < ntok - pos ? step : ntok - pos;
        size_t got;
        if (kvp_bh_chain_append(&ch, tok + pos, k, h2 + have, nb + 1 - have, &got) != 0)
            abort();
        have += got;
        pos += k;
    }
    if (have != nb || kvp_bh_chain_ntokens(&ch) != ntok)
        abort();
    kvp_bh_chain_destroy(&ch);
    for (size_t i = 0; i < nb; i++)
        if (memcmp(h1[i].b, h2[i].b, h1[i].len) != 0 || h1[i].len != h2[i].len)
            abort();

    /* CBOR: buffer mode (deliberately too small half the time) == sink mode */
    static uint8_t buf[1 << 17], sbuf[1 << 17];
    size_t cap = (b0 & 0x80) ? ntok * 3 : sizeof buf;
    struct kvp_bh_cbor cb, cs;
    struct cat ct = {sbuf, 0, sizeof sbuf};
    kvp_bh_cbor_init_buf(&cb, buf, cap);
    kvp_bh_cbor_init_sink(&cs, cat_sink, &ct);
    for (int pass = 0; pass < 2; pass++) {
        struct kvp_bh_cbor *c = pass ? &cs : &cb;
        kvp_bh_cbor_array(c, ntok + x.n);
        for (size_t i = 0; i < ntok; i++)
            kvp_bh_cbor_int(c, tok[i]);
        for (size_t i = 0; i < x.n; i++) {
            kvp_bh_cbor_text(c, x.k[i].data, x.k[i].len);
            kvp_bh_cbor_bytes(c, x.k[i].data, x.k[i].len);
            kvp_bh_cbor_uint(c, (uint64_t)x.k[i].num);
        }
        kvp_bh_cbor_null(c);
    }
    int rb = kvp_bh_cbor_finish(&cb);
    if (kvp_bh_cbor_finish(&cs) != 0 || kvp_bh_cbor_len(&cs) != ct.n ||
        kvp_bh_cbor_len(&cb) != ct.n)
        abort();
    if ((rb == 0) != (ct.n <= cap))
        abort();
    size_t cmp = ct.n < cap ? ct.n : cap;
    if (cmp > sizeof sbuf)
        cmp = sizeof sbuf;
    if (memcmp(buf, sbuf, cmp) != 0)
        abort();

    free(tok);
    free(h1);
    free(h2);
    if (kvp_mem_used() != before)
        abort();
    return 0;
}
