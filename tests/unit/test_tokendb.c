/* test_tokendb.c -- kvp_tdb: chunking (spec §6.6) and address preparation
 * for blocks-first, K/V-first and cross-layer layouts (spec §6.7), checked
 * against a brute-force walk over every element of the tensors. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/tokendb.h"
#include "harness.h"
#include "kvpool.h"

#define NOMASK NULL, 0

/* ------------------------------------------------------------ chunking */

static int chunks(const kvp_tdb *db, uint64_t T, size_t nh, uint64_t mask_num,
                  const uint8_t *mask, size_t mlen, uint32_t step, uint32_t rank,
                  kvp_tdb_chunk *out, size_t *n)
{
    return kvp_tdb_process_tokens(db, T, nh, mask_num, mask, mlen, step, rank, out, 64, n);
}

static kvp_tdb_layout dummy_layout;

TEST(tdb_init_rules)
{
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_layout_init(&dummy_layout, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_layout_init(&dummy_layout, 4), 0);
    CHECK_EQ(kvp_tdb_init(&db, 16, 0, &dummy_layout), 0);
    CHECK_EQ(db.hash_block_size, 16);
    CHECK_EQ(kvp_tdb_init(&db, 16, 4, &dummy_layout), 0);
    CHECK_EQ(kvp_tdb_init(&db, 16, 6, &dummy_layout), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_init(&db, 0, 0, &dummy_layout), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_init(&db, 8, 16, &dummy_layout), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_init(&db, 16, 4, NULL), KVP_EINVALID_PARAMS);
    kvp_tdb_layout_free(&dummy_layout);
}

#define CH(i, s, e, h)                                                         \
    do {                                                                       \
        CHECK_EQ(out[i].start, s);                                             \
        CHECK_EQ(out[i].end, e);                                               \
        CHECK_EQ(out[i].hash_idx, h);                                          \
        CHECK_EQ(out[i].index, (uint64_t)(s) / db.block_size);                 \
    } while (0)

/* The golden values of spec §6.6. */
TEST(tdb_process_tokens_golden)
{
    kvp_tdb_layout l;
    kvp_tdb db;
    kvp_tdb_chunk out[64];
    size_t n;
    CHECK_EQ(kvp_tdb_layout_init(&l, 4), 0);
    CHECK_EQ(kvp_tdb_init(&db, 32, 8, &l), 0);
    CHECK_EQ(chunks(&db, 96, 16, 64, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 64, 96, 11);
    const uint8_t m[2] = {0, 1};
    CHECK_EQ(chunks(&db, 128, 16, 64, m, 2, 1, 0, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 96, 128, 15);
    CHECK_EQ(chunks(&db, 128, 16, 64, NOMASK, 2, 1, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 96, 128, 15);

    CHECK_EQ(kvp_tdb_init(&db, 16, 4, &l), 0);
    CHECK_EQ(chunks(&db, 32, 8, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 0, 16, 3);
    CH(1, 16, 32, 7);
    CHECK_EQ(chunks(&db, 12, 8, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 0, 12, 2);
    CHECK_EQ(chunks(&db, 28, 8, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 0, 16, 3);
    CH(1, 16, 28, 6);
}

TEST(tdb_process_tokens_edges)
{
    kvp_tdb_layout l;
    kvp_tdb db;
    kvp_tdb_chunk out[64];
    size_t n;
    CHECK_EQ(kvp_tdb_layout_init(&l, 4), 0);
    CHECK_EQ(kvp_tdb_init(&db, 16, 4, &l), 0);
    /* no hashes: nothing, before any check (even an unaligned T) */
    CHECK_EQ(chunks(&db, 13, 0, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 0);
    /* T not hash-aligned, too few hashes, put_step 0 */
    CHECK_EQ(chunks(&db, 13, 8, 0, NOMASK, 1, 0, out, &n), KVP_EINVALID_PARAMS);
    CHECK_EQ(chunks(&db, 36, 8, 0, NOMASK, 1, 0, out, &n), KVP_EINVALID_PARAMS);
    CHECK_EQ(chunks(&db, 32, 8, 0, NOMASK, 0, 0, out, &n), KVP_EINVALID_PARAMS);
    /* exactly enough hashes */
    CHECK_EQ(chunks(&db, 32, 8, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    /* T = 0 with hashes: nothing */
    CHECK_EQ(chunks(&db, 0, 8, 0, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 0);
    /* start offset inside a block rounds UP to the next block */
    CHECK_EQ(chunks(&db, 48, 12, 5, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 16, 32, 7);
    CH(1, 32, 48, 11);
    /* start offset exactly on a boundary */
    CHECK_EQ(chunks(&db, 48, 12, 16, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 16, 32, 7);
    /* start offset past the end: nothing */
    CHECK_EQ(chunks(&db, 48, 12, 100, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 0);
    /* partial last chunk after a start offset */
    CHECK_EQ(chunks(&db, 44, 12, 16, NOMASK, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(1, 32, 44, 10);
    /* mask shorter than the range limits it; empty mask selects nothing */
    const uint8_t m1[1] = {1};
    CHECK_EQ(chunks(&db, 48, 12, 0, m1, 1, 1, 0, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 0, 16, 3);
    CHECK_EQ(chunks(&db, 48, 12, 0, m1, 0, 1, 0, out, &n), 0);
    CHECK_EQ(n, 0);
    /* mask longer than needed is fine */
    const uint8_t m5[5] = {1, 0, 1, 1, 1};
    CHECK_EQ(chunks(&db, 48, 12, 0, m5, 5, 1, 0, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 0, 16, 3);
    CH(1, 32, 48, 11);
    /* striding uses the ABSOLUTE chunk index */
    CHECK_EQ(chunks(&db, 64, 16, 16, NOMASK, 2, 0, out, &n), 0);
    CHECK_EQ(n, 1);
    CH(0, 32, 48, 11);
    CHECK_EQ(chunks(&db, 64, 16, 16, NOMASK, 2, 1, out, &n), 0);
    CHECK_EQ(n, 2);
    CH(0, 16, 32, 7);
    CH(1, 48, 64, 15);
    /* rank >= step selects nothing */
    CHECK_EQ(chunks(&db, 64, 16, 0, NOMASK, 2, 2, out, &n), 0);
    CHECK_EQ(n, 0);
    /* capacity: overflow reports the needed count, writes only cap */
    kvp_tdb_chunk small[2];
    CHECK_EQ(kvp_tdb_process_tokens(&db, 64, 16, 0, NULL, 0, 1, 0, small, 2, &n),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 4);
    CHECK_EQ(small[1].end, 32);
    CHECK_EQ(kvp_tdb_process_tokens(&db, 64, 16, 0, NULL, 0, 1, 0, NULL, 0, &n),
             KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(n, 4);
    /* huge T cannot wrap */
    CHECK_EQ(kvp_tdb_process_tokens(&db, UINT64_MAX - 3, SIZE_MAX, 0, NULL, 0, 1, 0, out, 64,
                                     &n),
             KVP_EINVALID_PARAMS);
}

/* Exhaustive property check against the definition, B > H and B == H. */
TEST(tdb_process_tokens_property)
{
    kvp_tdb_layout l;
    kvp_tdb db;
    kvp_tdb_chunk out[64];
    size_t n;
    CHECK_EQ(kvp_tdb_layout_init(&l, 4), 0);
    const uint32_t bs[][2] = {{16, 4}, {16, 16}, {32, 8}, {12, 3}, {8, 1}};
    uint8_t mask[16];
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++) {
        uint32_t B = bs[k][0], H = bs[k][1];
        CHECK_EQ(kvp_tdb_init(&db, B, H, &l), 0);
        for (uint64_t T = 0; T <= 4 * B; T += H) {
            for (uint64_t mn = 0; mn <= T + 1; mn++) {
                for (uint32_t step = 1; step <= 3; step++) {
                    for (uint32_t mbits = 0; mbits < 8; mbits++) {
                        for (int i = 0; i < 3; i++)
                            mask[i] = (uint8_t)(mbits >> i & 1);
                        int use_mask = mbits != 0;
                        uint32_t rank = (uint32_t)(mn % step);
                        CHECK_EQ(chunks(&db, T, 64, mn, use_mask ? mask : NULL, 3, step, rank,
                                        out, &n),
                                 0);
                        size_t j = 0;
                        uint64_t sc = (mn + B - 1) / B;
                        for (uint64_t c = sc; c * B < T; c++) {
                            if (use_mask && (c - sc >= 3 || !mask[c - sc]))
                                continue;
                            if (c % step != rank)
                                continue;
                            CHECK(j < n);
                            uint64_t e = (c + 1) * B < T ? (c + 1) * B : T;
                            CHECK_EQ(out[j].start, c * B);
                            CHECK_EQ(out[j].end, e);
                            CHECK_EQ(out[j].hash_idx, e / H - 1);
                            CHECK(out[j].end > out[j].start);
                            CHECK_EQ((out[j].end - out[j].start) % H, 0);
                            j++;
                        }
                        CHECK_EQ(j, n);
                    }
                }
            }
        }
    }
}

/* ---------------------------------------------------- layout / addresses */

/* A tensor over a real buffer, shape given, strides either contiguous or
 * from a permutation of a contiguous physical layout. */
static void mk_tensor(kvp_tdb_tensor *t, void *base, size_t storage, size_t el, int nd,
                      const size_t *shape, const int *phys_order)
{
    memset(t, 0, sizeof *t);
    t->base = base;
    t->storage_len = storage;
    t->elem_size = el;
    t->ndim = nd;
    for (int d = 0; d < nd; d++)
        t->shape[d] = shape[d];
    /* phys_order lists logical dims from outermost to innermost in memory */
    size_t s = 1;
    for (int i = nd - 1; i >= 0; i--) {
        int d = phys_order ? phys_order[i] : i;
        t->stride[d] = s;
        s *= shape[d];
    }
}

/*
 * Brute force: the bytes of block `b` in plane `p` (plane dim pd, or -1) of
 * tensor t are the elements with index[bd] == b (and index[pd] == p). They
 * must form one contiguous run equal to `piece`.
 */
static int brute_check(const kvp_tdb_tensor *t, int bd, int pd, size_t b, size_t p,
                       const kvp_iov *piece)
{
    size_t idx[KVP_TDB_MAX_DIMS] = {0};
    size_t lo = SIZE_MAX, hi = 0, count = 0;
    for (;;) {
        if (idx[bd] == b && (pd < 0 || idx[pd] == p)) {
            size_t off = 0;
            for (int d = 0; d < t->ndim; d++)
                off += idx[d] * t->stride[d];
            off *= t->elem_size;
            if (off < lo)
                lo = off;
            if (off + t->elem_size > hi)
                hi = off + t->elem_size;
            count++;
        }
        int d = t->ndim - 1;
        while (d >= 0 && ++idx[d] == t->shape[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
    REQUIRE(count * t->elem_size == hi - lo); /* contiguous */
    REQUIRE((uint8_t *)piece->base == (uint8_t *)t->base + lo);
    REQUIRE(piece->len == hi - lo);
    return 0;
}

enum { NB = 6, BS = 4, NH = 2, HD = 3, NL = 3 };

TEST(tdb_layout_kv_first)
{
    /* FlashAttention: per layer (2, NB, BS, NH, HD), fp16 -> 2 segments/layer */
    size_t sh[5] = {2, NB, BS, NH, HD};
    size_t per = 2 * NB * BS * NH * HD * 2;
    uint8_t *mem = kvp_malloc(per * NL);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t[NL];
    CHECK_EQ(kvp_tdb_layout_init(&l, NB), 0);
    for (int i = 0; i < NL; i++) {
        mk_tensor(&t[i], mem + i * per, per, 2, 5, sh, NULL);
        int kind = -1;
        CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t[i], &kind), 0);
        CHECK_EQ(kind, KVP_TDB_KV_FIRST);
    }
    CHECK_EQ(l.nsegs, 2 * NL);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, BS, 2, &l), 0);
    kvp_iov iov[2 * NL];
    for (uint32_t b = 0; b < NB; b++) {
        CHECK_EQ(kvp_tdb_prepare_block(&db, b, iov, 2 * NL), 0);
        for (int i = 0; i < NL; i++)
            for (int p = 0; p < 2; p++)
                CHECK_EQ(brute_check(&t[i], 1, 0, b, (size_t)p, &iov[i * 2 + p]), 0);
    }
    /* chunk addressing picks block_ids[start/B]; partial chunk = whole block */
    const uint32_t ids[3] = {5, 0, 3};
    uint32_t bid = 99;
    CHECK_EQ(kvp_tdb_prepare_value(&db, 8, 10, ids, 3, iov, 2 * NL, &bid), 0);
    CHECK_EQ(bid, 3);
    for (int i = 0; i < NL; i++)
        for (int p = 0; p < 2; p++)
            CHECK_EQ(brute_check(&t[i], 1, 0, 3, (size_t)p, &iov[i * 2 + p]), 0);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

TEST(tdb_layout_blocks_first)
{
    /* FlashInfer: per layer (NB, 2, BS, NH, HD) -> one segment per layer */
    size_t sh[5] = {NB, 2, BS, NH, HD};
    size_t per = 2 * NB * BS * NH * HD * 2;
    uint8_t *mem = kvp_malloc(per * NL);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t[NL];
    CHECK_EQ(kvp_tdb_layout_init(&l, NB), 0);
    for (int i = 0; i < NL; i++) {
        mk_tensor(&t[i], mem + i * per, per, 2, 5, sh, NULL);
        int kind = -1;
        CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t[i], &kind), 0);
        CHECK_EQ(kind, KVP_TDB_BLOCKS_FIRST);
    }
    /* the same storage again (e.g. a Mamba layer's list) is deduplicated */
    int kind = -1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t[1], &kind), 0);
    CHECK_EQ(kind, KVP_TDB_DUPLICATE);
    CHECK_EQ(l.nsegs, NL);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, BS, 0, &l), 0);
    kvp_tdb_chunk ch[NB];
    size_t n;
    CHECK_EQ(kvp_tdb_process_tokens(&db, NB * BS, NB, 0, NULL, 0, 1, 0, ch, NB, &n), 0);
    CHECK_EQ(n, NB);
    uint32_t ids[NB] = {4, 2, 0, 5, 1, 3};
    uint32_t cb[NB];
    kvp_iov iov[NB * NL];
    CHECK_EQ(kvp_tdb_prepare_values(&db, ch, n, ids, NB, iov, NB * NL, cb), 0);
    for (size_t k = 0; k < n; k++) {
        CHECK_EQ(cb[k], ids[k]);
        for (int i = 0; i < NL; i++)
            CHECK_EQ(brute_check(&t[i], 0, -1, ids[k], 0, &iov[k * NL + (size_t)i]), 0);
    }
    /* capacity too small for all chunks */
    CHECK_EQ(kvp_tdb_prepare_values(&db, ch, n, ids, NB, iov, NB * NL - 1, cb),
             KVP_EBUFFER_OVERFLOW);
    /* empty input is fine */
    CHECK_EQ(kvp_tdb_prepare_values(&db, ch, 0, ids, NB, iov, 0, cb), 0);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

TEST(tdb_layout_cross_layer)
{
    /* cross-layer: (NB, NL, 2, BS, NH, HD) in one tensor -> one segment */
    size_t sh[6] = {NB, NL, 2, BS, NH, HD};
    size_t total = (size_t)NB * NL * 2 * BS * NH * HD * 2;
    uint8_t *mem = kvp_malloc(total);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t;
    CHECK_EQ(kvp_tdb_layout_init(&l, NB), 0);
    mk_tensor(&t, mem, total, 2, 6, sh, NULL);
    int kind = -1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, &kind), 0);
    CHECK_EQ(kind, KVP_TDB_BLOCKS_FIRST);
    CHECK_EQ(l.nsegs, 1);
    CHECK_EQ(l.segs[0].block_len, total / NB);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, BS, 0, &l), 0);
    kvp_iov iov[1];
    for (uint32_t b = 0; b < NB; b++) {
        CHECK_EQ(kvp_tdb_prepare_block(&db, b, iov, 1), 0);
        CHECK_EQ(brute_check(&t, 0, -1, b, 0, iov), 0);
    }
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

TEST(tdb_layout_permuted_view)
{
    /* logical (NB, 2, BS, NH, HD) viewed over physical (2, NB, BS, NH, HD):
     * the K/V dim's stride exceeds the page, so it is split by plane even
     * though it is not the first logical dimension. */
    size_t sh[5] = {NB, 2, BS, NH, HD};
    int order[5] = {1, 0, 2, 3, 4};
    size_t total = 2 * NB * BS * NH * HD * 4;
    uint8_t *mem = kvp_malloc(total);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t;
    CHECK_EQ(kvp_tdb_layout_init(&l, NB), 0);
    mk_tensor(&t, mem, total, 4, 5, sh, order);
    int kind = -1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, &kind), 0);
    CHECK_EQ(kind, KVP_TDB_KV_FIRST);
    CHECK_EQ(l.nsegs, 2);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, BS, 0, &l), 0);
    kvp_iov iov[2];
    for (uint32_t b = 0; b < NB; b++) {
        CHECK_EQ(kvp_tdb_prepare_block(&db, b, iov, 2), 0);
        for (int p = 0; p < 2; p++)
            CHECK_EQ(brute_check(&t, 0, 1, b, (size_t)p, &iov[p]), 0);
    }
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

TEST(tdb_out_of_region_refused)
{
    size_t sh[5] = {2, NB, BS, NH, HD};
    size_t per = 2 * NB * BS * NH * HD;
    uint8_t *mem = kvp_malloc(per);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t;
    CHECK_EQ(kvp_tdb_layout_init(&l, NB), 0);
    /* storage shorter than the planes it claims */
    mk_tensor(&t, mem, per, 1, 5, sh, NULL);
    t.storage_len = per - 1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_EINVALID_PARAMS);
    /* storage shorter than one byte per block; bad geometry */
    t.storage_len = NB - 1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_EINVALID_PARAMS);
    t.storage_len = per;
    t.ndim = 0;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_EINVALID_PARAMS);
    t.ndim = KVP_TDB_MAX_DIMS + 1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_EINVALID_PARAMS);
    t.ndim = 5;
    t.elem_size = 0;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_EINVALID_PARAMS);
    t.elem_size = 1;
    CHECK_EQ(l.nsegs, 0);
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), 0);
    CHECK_EQ(l.nsegs, 2);

    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, BS, 2, &l), 0);
    kvp_iov iov[2];
    /* block id past the region */
    CHECK_EQ(kvp_tdb_prepare_block(&db, NB, iov, 2), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_block(&db, UINT32_MAX, iov, 2), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_block(&db, NB - 1, iov, 2), 0);
    CHECK((uint8_t *)iov[1].base + iov[1].len == mem + per);
    CHECK_EQ(kvp_tdb_prepare_block(&db, 0, iov, 1), KVP_EBUFFER_OVERFLOW);
    const uint32_t ids[2] = {NB - 1, NB};
    /* a multi-block span running past the last block */
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 2 * BS, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, BS, ids, 2, iov, 2, NULL), 0);
    CHECK_EQ(kvp_tdb_prepare_value(&db, BS, 2 * BS, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    /* block table too short, unaligned chunk, empty chunk, misaligned start */
    CHECK_EQ(kvp_tdb_prepare_value(&db, 2 * BS, 3 * BS, ids, 2, iov, 2, NULL),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 3, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 0, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 2, 4, ids, 2, iov, 2, NULL), KVP_EINVALID_PARAMS);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

/* spec §18: 129 tokens with B = H = 128 is an unaligned chunk. */
TEST(tdb_unaligned_chunk_refused)
{
    uint8_t *mem = kvp_malloc(4 * 64);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t;
    size_t sh[2] = {4, 64};
    CHECK_EQ(kvp_tdb_layout_init(&l, 4), 0);
    mk_tensor(&t, mem, 4 * 64, 1, 2, sh, NULL);
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), 0);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, 128, 128, &l), 0);
    const uint32_t ids[2] = {0, 1};
    kvp_iov iov[1];
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 129, ids, 2, iov, 1, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_tdb_prepare_value(&db, 0, 128, ids, 2, iov, 1, NULL), 0);
    CHECK_EQ(iov[0].len, 64);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

/* Allocation failure while growing the segment list is KVP_ENOMEM and
 * leaves the layout as it was. */
TEST(tdb_layout_enomem)
{
    uint8_t *mem = kvp_malloc(64);
    CHECK(mem);
    kvp_tdb_layout l;
    kvp_tdb_tensor t;
    size_t sh[2] = {4, 16};
    CHECK_EQ(kvp_tdb_layout_init(&l, 4), 0);
    mk_tensor(&t, mem, 64, 1, 2, sh, NULL);
    kvp_mem_fail_nth(1, 0);
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), KVP_ENOMEM);
    kvp_mem_fail_nth(0, 0);
    CHECK_EQ(l.nsegs, 0);
    CHECK_EQ(kvp_tdb_layout_add_tensor(&l, &t, NULL), 0);
    CHECK_EQ(l.nsegs, 1);
    kvp_tdb_layout_free(&l);
    kvp_free(mem);
}

/* ------------------------------------------------------- head slicing */

enum { HNB = 4, HBS = 3, HNH = 2, HHD = 5 }; /* blocks, tokens, heads, bytes per head */

static uint8_t hval(int b, int p, int t, int h, int d)
{
    return (uint8_t)(1 + b * 61 + p * 29 + t * 13 + h * 7 + d);
}

/* Gathers head j of block b through kvp_tdb_head_slice. */
static size_t gather_head(const kvp_tdb_layout *l, const kvp_tdb *db, uint32_t b, uint32_t j,
                          uint8_t *out)
{
    kvp_iov blk[4], pc[64];
    if (kvp_tdb_prepare_block(db, b, blk, 4) != 0 || kvp_tdb_head_slice(l, blk, j, pc, 64) != 0)
        return 0;
    size_t n = 0;
    for (size_t i = 0; i < kvp_tdb_head_npieces(l); i++) {
        memcpy(out + n, pc[i].base, pc[i].len);
        n += pc[i].len;
    }
    return n;
}

/* NHD (2, NB, BS, NH, HD) and HND (2, NB, NH, BS, HD) tensors holding the
 * same values give byte-identical head objects ([plane][token][head bytes]),
 * each exactly one head's bytes; a padded block (room after the heads) is
 * fine and its padding never moved; MLA-like heads = 1 is the whole block;
 * a tensor where two dimensions could be the heads is refused. */
TEST(tdb_head_slice_nhd_hnd_agree)
{
    static uint8_t nhd[2 * HNB * HBS * HNH * HHD], hnd[sizeof nhd];
    for (int p = 0; p < 2; p++)
        for (int b = 0; b < HNB; b++)
            for (int t = 0; t < HBS; t++)
                for (int h = 0; h < HNH; h++)
                    for (int d = 0; d < HHD; d++) {
                        nhd[(((p * HNB + b) * HBS + t) * HNH + h) * HHD + d] = hval(b, p, t, h, d);
                        hnd[(((p * HNB + b) * HNH + h) * HBS + t) * HHD + d] = hval(b, p, t, h, d);
                    }
    kvp_tdb_tensor tn = {.base = nhd, .storage_len = sizeof nhd, .elem_size = 1, .ndim = 5,
                         .shape = {2, HNB, HBS, HNH, HHD},
                         .stride = {HNB * HBS * HNH * HHD, HBS * HNH * HHD, HNH * HHD, HHD, 1}};
    kvp_tdb_tensor th = {.base = hnd, .storage_len = sizeof hnd, .elem_size = 1, .ndim = 5,
                         .shape = {2, HNB, HNH, HBS, HHD},
                         .stride = {HNB * HBS * HNH * HHD, HBS * HNH * HHD, HBS * HHD, HHD, 1}};
    kvp_tdb_layout ln, lh;
    kvp_tdb dn, dh;
    CHECK_EQ(kvp_tdb_layout_init(&ln, HNB), 0);
    CHECK_EQ(kvp_tdb_layout_init(&lh, HNB), 0);
    ln.heads = lh.heads = HNH;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&ln, &tn, NULL), 0);
    CHECK_EQ(kvp_tdb_layout_add_tensor(&lh, &th, NULL), 0);
    CHECK_EQ(kvp_tdb_init(&dn, HBS, 0, &ln), 0);
    CHECK_EQ(kvp_tdb_init(&dh, HBS, 0, &lh), 0);
    CHECK_EQ(kvp_tdb_head_bytes(&ln), 2 * HBS * HHD);
    CHECK_EQ(kvp_tdb_head_npieces(&ln), 2 * HBS); /* NHD: a piece per plane and token */
    CHECK_EQ(kvp_tdb_head_npieces(&lh), 2);       /* HND: one per plane */
    for (uint32_t b = 0; b < HNB; b++)
        for (uint32_t j = 0; j < HNH; j++) {
            uint8_t on[64], oh[64], want[64];
            CHECK_EQ(gather_head(&ln, &dn, b, j, on), 2 * HBS * HHD);
            CHECK_EQ(gather_head(&lh, &dh, b, j, oh), 2 * HBS * HHD);
            size_t k = 0;
            for (int p = 0; p < 2; p++)
                for (int t = 0; t < HBS; t++)
                    for (int d = 0; d < HHD; d++)
                        want[k++] = hval((int)b, p, t, (int)j, d);
            CHECK(memcmp(on, want, k) == 0);
            CHECK(memcmp(oh, want, k) == 0);
        }
    kvp_iov blk[2], pc[64];
    CHECK_EQ(kvp_tdb_prepare_block(&dn, 0, blk, 2), 0);
    CHECK_EQ(kvp_tdb_head_slice(&ln, blk, HNH, pc, 64), KVP_EINVALID_PARAMS); /* no such head */
    CHECK_EQ(kvp_tdb_head_slice(&ln, blk, 0, pc, 2), KVP_EINVALID_PARAMS);    /* no room */
    kvp_tdb_layout_free(&ln);
    kvp_tdb_layout_free(&lh);

    /* a block padded after its heads (page 40 bytes for 30 of KV) */
    static uint8_t pad[HNB * 45];
    kvp_tdb_tensor tp = {.base = pad, .storage_len = HNB * 40, .elem_size = 1, .ndim = 3,
                         .shape = {HNB, HBS * HNH, HHD}, .stride = {40, HHD, 1}};
    CHECK_EQ(kvp_tdb_layout_init(&ln, HNB), 0);
    ln.heads = HBS * HNH; /* 6 "heads" of 5 bytes */
    CHECK_EQ(kvp_tdb_layout_add_tensor(&ln, &tp, NULL), 0);
    CHECK_EQ(kvp_tdb_head_bytes(&ln), HHD);
    kvp_tdb_layout_free(&ln);
    /* heads = 1: the whole block */
    CHECK_EQ(kvp_tdb_layout_init(&ln, HNB), 0);
    ln.heads = 1;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&ln, &tp, NULL), 0);
    CHECK_EQ(kvp_tdb_head_bytes(&ln), 40);
    CHECK_EQ(kvp_tdb_head_npieces(&ln), 1);
    kvp_tdb_layout_free(&ln);
    /* 3 tokens and 3 heads: either dimension could be the heads */
    kvp_tdb_tensor ta = {.base = pad, .storage_len = 4 * 45, .elem_size = 1, .ndim = 4,
                         .shape = {4, 3, 3, 5}, .stride = {45, 15, 5, 1}};
    CHECK_EQ(kvp_tdb_layout_init(&ln, HNB), 0);
    ln.heads = 3;
    CHECK_EQ(kvp_tdb_layout_add_tensor(&ln, &ta, NULL), KVP_EINVALID_PARAMS);
    CHECK_EQ(ln.nsegs, 0);
    kvp_tdb_layout_free(&ln);
}
