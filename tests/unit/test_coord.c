/* test_coord.c -- connector/coord: the hybrid hit / mask oracle (spec §7, §16, §18). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/coord.h"
#include "harness.h"
#include "kvpool.h"

#define HL 16      /* hash length (xxhash: 16 bytes) */
#define MAXH 512   /* hashes per test chain */
#define MAXBITS 4096

static uint8_t chain[MAXH * HL];
static uint8_t bitsbuf[KVP_COORD_MAX_GROUPS][MAXBITS];
static struct kvp_coord_mask M[KVP_COORD_MAX_GROUPS];

/* A chain of n distinct 16-byte "hashes" (hs[i]). */
static struct kvp_coord_hashes hs(size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < HL; b++)
            chain[i * HL + b] = (uint8_t)(i * 131 + b * 17 + seed * 7919 + (i >> 8) * 3);
    for (size_t i = 0; i < n; i++) {
        chain[i * HL + 14] = (uint8_t)i;
        chain[i * HL + 15] = (uint8_t)(i >> 8);
    }
    struct kvp_coord_hashes h = {.data = chain, .n = n, .hash_len = HL, .stride = 0};
    return h;
}

static const uint8_t *H_(size_t i)
{
    return chain + i * HL;
}

static void reset_masks(void)
{
    for (size_t g = 0; g < KVP_COORD_MAX_GROUPS; g++) {
        M[g].bits = bitsbuf[g];
        M[g].cap = MAXBITS;
        M[g].first = M[g].len = 0;
        M[g].all = 0;
        memset(bitsbuf[g], 0xee, MAXBITS);
    }
}

/* "TFT.." against a mask (all == 0); "*" = the None sentinel. */
static int mask_is(const struct kvp_coord_mask *m, const char *want)
{
    if (strcmp(want, "*") == 0)
        return m->all == 1;
    if (m->all || m->len != strlen(want))
        return 0;
    for (size_t i = 0; i < m->len; i++)
        if ((m->bits[i] != 0) != (want[i] == 'T'))
            return 0;
    return 1;
}

/* True chunk indices of a (non-None) mask, relative to first, as a list. */
static int mask_true_at(const struct kvp_coord_mask *m, const size_t *want, size_t nwant)
{
    if (m->all)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < m->len; i++) {
        if (!m->bits[i])
            continue;
        if (k >= nwant || want[k] != m->first + i)
            return 0;
        k++;
    }
    return k == nwant;
}

#define G(kind_, b_, w_) {.kind = (kind_), .block_size = (b_), .window = (w_)}

static struct kvp_coord *mk(const struct kvp_coord_group *g, size_t n, uint32_t H, int eagle,
                            int64_t retention)
{
    struct kvp_coord_cfg cfg = {.groups = g,
                                .ngroups = n,
                                .hash_block_size = H,
                                .use_eagle = eagle,
                                .retention_interval = retention};
    struct kvp_coord *c = NULL;
    if (kvp_coord_create(&c, &cfg) != 0)
        return NULL;
    reset_masks();
    return c;
}

static struct kvp_coord_pool *pool_new(void)
{
    struct kvp_coord_pool *p = NULL;
    if (kvp_coord_pool_create(&p, HL, 4) != 0)
        return NULL;
    return p;
}

/* Adds (g, hs[i]) for each listed i. */
static void add(struct kvp_coord_pool *p, uint32_t g, const size_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvp_coord_pool_add(p, g, H_(idx[i]));
}

static size_t find(const struct kvp_coord *c, const struct kvp_coord_hashes *h, size_t maxlen,
                   const struct kvp_coord_pool *p, int eagle)
{
    size_t hit = (size_t)-1;
    if (kvp_coord_find_longest_cache_hit(c, h, maxlen, p, eagle, M, &hit) != 0)
        return (size_t)-2;
    return hit;
}

/* ---------------------------------------------------------------- pool (§7.1) */

TEST(pool_semantics)
{
    struct kvp_coord_hashes h = hs(8, 1);
    (void)h;
    struct kvp_coord_pool *p = pool_new();
    CHECK(p);
    CHECK_EQ(kvp_coord_pool_hash_len(p), HL);
    CHECK_EQ(kvp_coord_pool_add(p, 0, H_(0)), 0);
    CHECK_EQ(kvp_coord_pool_add(p, 0, H_(0)), 0); /* duplicate */
    CHECK_EQ(kvp_coord_pool_add(p, 1, H_(0)), 0);
    CHECK_EQ(kvp_coord_pool_add(p, 1, H_(1)), 0);
    CHECK_EQ(kvp_coord_pool_count(p), 3);
    CHECK(kvp_coord_pool_contains(p, 0, H_(0)));
    CHECK(!kvp_coord_pool_contains(p, 0, H_(1)));
    CHECK(!kvp_coord_pool_contains(p, 2, H_(0)));
    uint32_t g01[] = {0, 1};
    CHECK(kvp_coord_pool_has_all(p, g01, 2, H_(0)));  /* present in every group */
    CHECK(!kvp_coord_pool_has_all(p, g01, 2, H_(1))); /* one group misses it */
    CHECK(kvp_coord_pool_has_all(NULL, g01, 2, H_(5))); /* tautological */
    kvp_coord_pool_destroy(p);
    CHECK_EQ(kvp_coord_pool_create(&p, 0, 1), KVP_EINVALID_PARAMS);
}

TEST(pool_grow_and_nomem)
{
    hs(MAXH, 2);
    struct kvp_coord_pool *p = pool_new();
    CHECK(p);
    for (uint32_t g = 0; g < 4; g++)
        for (size_t i = 0; i < MAXH; i++)
            CHECK_EQ(kvp_coord_pool_add(p, g, H_(i)), 0);
    CHECK_EQ(kvp_coord_pool_count(p), 4 * MAXH);
    for (uint32_t g = 0; g < 5; g++)
        for (size_t i = 0; i < MAXH; i++)
            CHECK_EQ(kvp_coord_pool_contains(p, g, H_(i)), g < 4);
    kvp_coord_pool_destroy(p);

    /* the growth allocation fails: KVP_ENOMEM, pool unchanged and usable */
    p = pool_new();
    CHECK(p);
    size_t i = 0;
    for (; i < 8; i++)
        CHECK_EQ(kvp_coord_pool_add(p, 0, H_(i)), 0);
    kvp_mem_fail_nth(1, 1);
    int rc = kvp_coord_pool_add(p, 0, H_(i));
    kvp_mem_fail_nth(0, 0);
    CHECK_EQ(rc, KVP_ENOMEM);
    CHECK_EQ(kvp_coord_pool_count(p), 8);
    CHECK(!kvp_coord_pool_contains(p, 0, H_(8)));
    CHECK(kvp_coord_pool_contains(p, 0, H_(7)));
    CHECK_EQ(kvp_coord_pool_add(p, 0, H_(8)), 0);
    CHECK(kvp_coord_pool_contains(p, 0, H_(8)));
    kvp_coord_pool_destroy(p);
}

/* ---------------------------------------------------------------- construction (§5, §7.2) */

TEST(block_sizes_lcm_gcd_and_errors)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 48, 0), G(KVP_COORD_SWA, 32, 64)};
    uint32_t L = 0, H = 0;
    CHECK_EQ(kvp_coord_resolve_block_sizes(g, 2, 0, &L, &H), 0);
    CHECK_EQ(L, 96);
    CHECK_EQ(H, 16);
    CHECK_EQ(kvp_coord_resolve_block_sizes(g, 2, 8, &L, &H), 0);
    CHECK_EQ(H, 8);
    CHECK_EQ(kvp_coord_resolve_block_sizes(g, 2, 32, &L, &H), KVP_EINVALID_PARAMS); /* 48 % 32 */
    CHECK_EQ(kvp_coord_resolve_block_sizes(g, 1, 0, &L, &H), 0);
    CHECK_EQ(L, 48);
    CHECK_EQ(H, 48);

    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_lcm_block_size(c), 96);
    CHECK_EQ(kvp_coord_alignment(c), 96);
    CHECK(!kvp_coord_partial_hits(c));
    kvp_coord_destroy(c);

    /* H must divide every group size */
    struct kvp_coord_cfg cfg = {
        .groups = g, .ngroups = 2, .hash_block_size = 32, .retention_interval = -1};
    CHECK_EQ(kvp_coord_create(&c, &cfg), KVP_EINVALID_PARAMS);
    CHECK(c == NULL);
    cfg.hash_block_size = 0;
    CHECK_EQ(kvp_coord_create(&c, &cfg), KVP_EINVALID_PARAMS);
    /* an explicit scheduler size must be a multiple of every group size */
    cfg.hash_block_size = 16;
    cfg.scheduler_block_size = 48;
    CHECK_EQ(kvp_coord_create(&c, &cfg), KVP_EINVALID_PARAMS);
    cfg.scheduler_block_size = 192;
    CHECK_EQ(kvp_coord_create(&c, &cfg), 0);
    CHECK_EQ(kvp_coord_lcm_block_size(c), 192);
    kvp_coord_destroy(c);
    /* SWA without a window */
    struct kvp_coord_group bad = G(KVP_COORD_SWA, 16, 0);
    cfg.groups = &bad;
    cfg.ngroups = 1;
    cfg.scheduler_block_size = 0;
    CHECK_EQ(kvp_coord_create(&c, &cfg), KVP_EINVALID_PARAMS);
}

TEST(partial_hits_enabled_rule)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_MAMBA, 32, 0)};
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    CHECK(kvp_coord_partial_hits(c)); /* Mamba B 32 > H 16 */
    CHECK_EQ(kvp_coord_alignment(c), 16);
    CHECK_EQ(kvp_coord_align_lookup_length(c, 47), 32);
    kvp_coord_destroy(c);
    c = mk(g, 2, 32, 0, -1);
    CHECK(!kvp_coord_partial_hits(c)); /* B == H, dcp 1 */
    CHECK_EQ(kvp_coord_align_lookup_length(c, 63), 32);
    kvp_coord_destroy(c);
    struct kvp_coord_cfg cfg = {.groups = g, .ngroups = 2, .hash_block_size = 32,
                                .retention_interval = -1, .dcp_world_size = 2};
    CHECK_EQ(kvp_coord_create(&c, &cfg), 0);
    CHECK(kvp_coord_partial_hits(c)); /* dcp > 1: B >= H */
    kvp_coord_destroy(c);
    struct kvp_coord_group fa[] = {G(KVP_COORD_FULL, 32, 0)};
    c = mk(fa, 1, 16, 0, -1);
    CHECK(!kvp_coord_partial_hits(c)); /* no Mamba */
    kvp_coord_destroy(c);
}

TEST(block_hashes_for_spec_compact_view)
{
    struct kvp_coord_hashes h = hs(12, 3), v;
    CHECK_EQ(kvp_coord_block_hashes_for_spec(&h, 8, 32, &v), 0);
    CHECK_EQ(v.n, 3);
    for (size_t c = 0; c < 3; c++)
        /* hs[3], hs[7], hs[11] */
        CHECK(memcmp(v.data + c * v.stride, H_((c + 1) * 4 - 1), HL) == 0);
    CHECK_EQ(kvp_coord_block_hashes_for_spec(&h, 8, 8, &v), 0); /* identity */
    CHECK_EQ(v.n, 12);
    CHECK(memcmp(v.data + 5 * v.stride, H_(5), HL) == 0);
    h.n = 7; /* partial trailing chunk has no compact hash */
    CHECK_EQ(kvp_coord_block_hashes_for_spec(&h, 8, 32, &v), 0);
    CHECK_EQ(v.n, 1);
    CHECK_EQ(kvp_coord_block_hashes_for_spec(&h, 8, 12, &v), KVP_EINVALID_PARAMS);
}

/* ---------------------------------------------------------------- find (§7.3, §7.4) */

TEST(full_attention_single_group)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0)};
    struct kvp_coord *c = mk(g, 1, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 4);
    struct kvp_coord_pool *p = pool_new();
    size_t all[] = {0, 1, 2, 3};
    add(p, 0, all, 4);
    CHECK_EQ(find(c, &h, 64, p, 1), 64);
    CHECK(mask_is(&M[0], "TTTT"));
    kvp_coord_pool_destroy(p);

    p = pool_new();
    add(p, 0, all, 2);
    CHECK_EQ(find(c, &h, 64, p, 1), 32);
    CHECK(mask_is(&M[0], "TT"));
    kvp_coord_pool_destroy(p);

    p = pool_new(); /* empty pool */
    CHECK_EQ(find(c, &h, 64, p, 1), 0);
    CHECK(mask_is(&M[0], ""));
    /* worker §10.5 golden: exists [1,1,0] for 48 tokens -> 32 */
    size_t two[] = {0, 1};
    add(p, 0, two, 2);
    CHECK_EQ(find(c, &h, 48, p, 1), 32);
    kvp_coord_pool_destroy(p);

    /* max_length cut (not block aligned) and a chain shorter than max_length */
    p = pool_new();
    add(p, 0, all, 4);
    CHECK_EQ(find(c, &h, 40, p, 1), 32);
    CHECK(mask_is(&M[0], "TT"));
    CHECK_EQ(find(c, &h, 1000, p, 1), 64);
    /* a hole: the chain makes later chunks unreachable */
    kvp_coord_pool_destroy(p);
    p = pool_new();
    size_t holey[] = {0, 2, 3};
    add(p, 0, holey, 3);
    CHECK_EQ(find(c, &h, 64, p, 1), 16);
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(sliding_window_single_group)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_SWA, 16, 32)};
    struct kvp_coord *c = mk(g, 1, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 5);
    CHECK_EQ(find(c, &h, 64, NULL, 1), 64); /* tautological pool */
    CHECK(mask_is(&M[0], "FFTT"));
    /* §10.5: exists [0,0,1,1]: 64 found at max 64, nothing below the end */
    struct kvp_coord_pool *p = pool_new();
    size_t tail[] = {2, 3};
    add(p, 0, tail, 2);
    CHECK_EQ(find(c, &h, 64, p, 1), 64);
    CHECK(mask_is(&M[0], "FFTT"));
    CHECK_EQ(find(c, &h, kvp_coord_align_lookup_length(c, 63), p, 1), 0);
    CHECK(mask_is(&M[0], ""));
    /* partial window at the start of the sequence is a valid hit */
    kvp_coord_pool_destroy(p);
    p = pool_new();
    size_t first[] = {0};
    add(p, 0, first, 1);
    CHECK_EQ(find(c, &h, 64, p, 1), 16);
    CHECK(mask_is(&M[0], "T"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(hybrid_full_plus_swa)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 16, 32)};
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 6);
    struct kvp_coord_pool *p = pool_new();
    size_t all[] = {0, 1, 2, 3};
    add(p, 0, all, 4);
    add(p, 1, all, 4);
    CHECK_EQ(find(c, &h, 64, p, 1), 64);
    CHECK(mask_is(&M[0], "TTTT"));
    CHECK(mask_is(&M[1], "FFTT"));
    kvp_coord_pool_destroy(p);

    p = pool_new(); /* FA hole at chunk 1 */
    size_t fa[] = {0, 2, 3};
    add(p, 0, fa, 3);
    add(p, 1, all, 4);
    CHECK_EQ(find(c, &h, 64, p, 1), 16);
    CHECK(mask_is(&M[0], "T"));
    CHECK(mask_is(&M[1], "T"));
    kvp_coord_pool_destroy(p);

    p = pool_new(); /* SWA misses chunk 2: hit drops to 32, FA truncated */
    size_t sw[] = {0, 1, 3};
    add(p, 0, all, 4);
    add(p, 1, sw, 3);
    CHECK_EQ(find(c, &h, 64, p, 1), 32);
    CHECK(mask_is(&M[0], "TT"));
    CHECK(mask_is(&M[1], "TT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(hybrid_fa32_swa8_lookup_candidates)
{
    /* §10.5 golden: FA32 + SWA8/W8, H 8, retention 0, 96 tokens: lookup
     * probes FA chunks (hs 3, 7, 11) and SWA chunks 3, 7, 11 only; exists
     * [1,0,0 | 1,0,0] -> 32. */
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 8)};
    struct kvp_coord *c = mk(g, 2, 8, 0, 0);
    CHECK(c);
    CHECK_EQ(kvp_coord_lcm_block_size(c), 32);
    CHECK_EQ(kvp_coord_lookup_mask(c, 96, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    size_t want[] = {3, 7, 11};
    CHECK(mask_true_at(&M[1], want, 3));
    struct kvp_coord_hashes h = hs(12, 7);
    struct kvp_coord_pool *p = pool_new();
    size_t e[] = {3};
    add(p, 0, e, 1);
    add(p, 1, e, 1);
    CHECK_EQ(find(c, &h, 96, p, 1), 32);
    CHECK(mask_is(&M[0], "T"));
    CHECK(mask_is(&M[1], "FFFT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(mismatched_block_sizes_double_size_hash_group)
{
    /* FA 32 with H 16 keys chunk c by hs[2c+1]; SWA 16/W16 uses every hash */
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 16, 16)};
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_lcm_block_size(c), 32);
    struct kvp_coord_hashes h = hs(8, 8);
    struct kvp_coord_pool *p = pool_new();
    size_t fa[] = {1, 3, 5}; /* compact keys of FA chunks 0..2 */
    size_t sw[] = {5};       /* W16 -> need 1 chunk before the hit */
    add(p, 0, fa, 3);
    add(p, 1, sw, 1);
    CHECK_EQ(find(c, &h, 128, p, 1), 96);
    CHECK(mask_is(&M[0], "TTT"));
    CHECK(mask_is(&M[1], "FFFFFT"));
    /* FA keyed by the concatenation-free last sub-hash: the even hashes
     * alone do not make FA chunks present */
    kvp_coord_pool_destroy(p);
    p = pool_new();
    size_t even[] = {0, 2, 4};
    add(p, 0, even, 3);
    add(p, 1, sw, 1);
    CHECK_EQ(find(c, &h, 128, p, 1), 0);
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(mamba_full_fine_grained_partial_hits)
{
    /* FA(32) + Mamba(32, align), H 16: both have hs[1], hs[2] -> 48 */
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_MAMBA, 32, 0)};
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 9);
    struct kvp_coord_pool *p = pool_new();
    size_t both[] = {1, 2};
    add(p, 0, both, 2);
    add(p, 1, both, 2);
    CHECK_EQ(find(c, &h, 64, p, 1), 48);
    CHECK(mask_is(&M[0], "TT"));
    CHECK(mask_is(&M[1], "FT"));
    kvp_coord_pool_destroy(p);
    /* only FA has hs[2]: clipped to 32 */
    p = pool_new();
    size_t one[] = {1};
    add(p, 0, both, 2);
    add(p, 1, one, 1);
    CHECK_EQ(find(c, &h, 64, p, 1), 32);
    CHECK(mask_is(&M[0], "T"));
    CHECK(mask_is(&M[1], "T"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);

    /* §10.5 golden: H 4, FA16 + Mamba16, exists [0,0,1 | 0,0,1], 13 tokens -> 12 */
    struct kvp_coord_group g2[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    c = mk(g2, 2, 4, 0, -1);
    CHECK(c);
    h = hs(3, 10);
    p = pool_new();
    size_t u2[] = {2};
    add(p, 0, u2, 1);
    add(p, 1, u2, 1);
    size_t T = kvp_coord_align_lookup_length(c, 13);
    CHECK_EQ(T, 12);
    CHECK_EQ(find(c, &h, T, p, 1), 12);
    CHECK(mask_is(&M[0], "T"));
    CHECK(mask_is(&M[1], "T"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(mamba_coarse_state_block)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK(c);
    CHECK(!kvp_coord_partial_hits(c));
    struct kvp_coord_hashes h = hs(4, 11);
    struct kvp_coord_pool *p = pool_new();
    size_t all[] = {0, 1, 2, 3}, st[] = {1};
    add(p, 0, all, 4);
    add(p, 1, st, 1); /* Mamba state only at chunk 1 */
    CHECK_EQ(find(c, &h, 64, p, 1), 32);
    CHECK(mask_is(&M[0], "TT"));
    CHECK(mask_is(&M[1], "FT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

TEST(eagle_drop_last_block)
{
    struct kvp_coord_group fa[] = {G(KVP_COORD_FULL, 16, 0)};
    struct kvp_coord *c = mk(fa, 1, 16, 1, -1);
    CHECK(c);
    CHECK(kvp_coord_is_eagle_group(c, 0)); /* use_eagle, nothing flagged -> all */
    struct kvp_coord_hashes h = hs(4, 12);
    struct kvp_coord_pool *p = pool_new();
    size_t all[] = {0, 1, 2, 3};
    add(p, 0, all, 4);
    CHECK_EQ(find(c, &h, 64, p, 1), 48);
    CHECK(mask_is(&M[0], "TTT"));
    CHECK_EQ(find(c, &h, 64, p, 0), 64); /* apply_eagle = 0 */
    /* load_mask is not pruned a second time (§16.6) */
    size_t hit = 0;
    CHECK_EQ(kvp_coord_load_mask(c, &h, 48, M, &hit), 0);
    CHECK_EQ(hit, 48);
    CHECK(mask_is(&M[0], "TTT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);

    /* FA16 + Mamba16 + eagle -> 48, no Mamba overrun */
    struct kvp_coord_group fm[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    c = mk(fm, 2, 16, 1, -1);
    CHECK(c);
    p = pool_new();
    add(p, 0, all, 4);
    add(p, 1, all, 4);
    CHECK_EQ(find(c, &h, 64, p, 1), 48);
    CHECK(mask_is(&M[0], "TTT"));
    CHECK(mask_is(&M[1], "FFT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);

    /* SWA eagle: one more block of window, then pop */
    struct kvp_coord_group sw[] = {G(KVP_COORD_SWA, 16, 32)};
    c = mk(sw, 1, 16, 1, -1);
    CHECK(c);
    CHECK_EQ(find(c, &h, 64, NULL, 1), 48);
    CHECK(mask_is(&M[0], "FTT"));
    kvp_coord_destroy(c);
}

TEST(eagle_propagates_to_merged_swa_groups)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 8),
                                  G(KVP_COORD_SWA, 8, 8)};
    g[2].is_eagle = 1;
    struct kvp_coord *c = mk(g, 3, 8, 1, -1);
    CHECK(c);
    CHECK(!kvp_coord_is_eagle_group(c, 0)); /* one group flagged: not all */
    CHECK(kvp_coord_is_eagle_group(c, 1));  /* equal spec merged with group 2 */
    CHECK(kvp_coord_is_eagle_group(c, 2));
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0);
    /* need = ceil(7/8) + 1 = 2, shift 1, per 4: i >= 1, (i-1) % 4 >= 2 */
    CHECK(mask_is(&M[1], "FFFTTFFT"));
    CHECK(mask_is(&M[2], "FFFTTFFT"));
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 0, M), 0); /* apply_eagle off */
    CHECK(mask_is(&M[1], "FFFTFFFT"));
    kvp_coord_destroy(c);
}

/* DSv4 five groups with eagle: store 768 tokens through the store masks,
 * then look them up -> 512 (§7.4 golden). */
TEST(dsv4_eagle_round_trip_512)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 256, 0), G(KVP_COORD_SWA, 64, 128),
                                  G(KVP_COORD_SWA, 64, 128), G(KVP_COORD_SWA, 4, 8),
                                  G(KVP_COORD_SWA, 8, 128)};
    g[1].is_eagle = 1;
    struct kvp_coord *c = mk(g, 5, 4, 1, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_lcm_block_size(c), 256);
    struct kvp_coord_hashes h = hs(192, 13);
    CHECK_EQ(kvp_coord_store_mask(c, 768, 0, -1, 1, M), 0);
    struct kvp_coord_pool *p = pool_new();
    for (uint32_t gi = 0; gi < 5; gi++) {
        size_t B = g[gi].block_size, r = B / 4;
        for (size_t k = 0; k < M[gi].len; k++)
            if (M[gi].all || M[gi].bits[k])
                CHECK_EQ(kvp_coord_pool_add(p, gi, H_((M[gi].first + k + 1) * r - 1)), 0);
    }
    reset_masks();
    CHECK_EQ(find(c, &h, 768, p, 1), 512);
    CHECK(mask_is(&M[0], "TT"));
    CHECK(mask_is(&M[1], "FFFFFFTT"));
    CHECK(mask_is(&M[2], "FFFFFFTT"));
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

/* ---------------------------------------------------------------- load mask (§7.5) */

TEST(load_mask_shapes)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 16, 48),
                                  G(KVP_COORD_MAMBA, 16, 0)};
    struct kvp_coord *c = mk(g, 3, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(6, 14);
    size_t hit = 0;
    CHECK_EQ(kvp_coord_load_mask(c, &h, 96, M, &hit), 0);
    CHECK_EQ(hit, 96);
    CHECK(mask_is(&M[0], "TTTTTT"));
    CHECK(mask_is(&M[1], "FFFFTTT") == 0); /* need = ceil(47/16) = 3 */
    CHECK(mask_is(&M[1], "FFFTTT"));
    CHECK(mask_is(&M[2], "FFFFFT"));
    kvp_coord_destroy(c);

    /* fine-grained: a partial FA chunk is loaded (48 with B 32, H 16) */
    struct kvp_coord_group fm[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_MAMBA, 32, 0)};
    c = mk(fm, 2, 16, 0, -1);
    CHECK(c);
    h = hs(3, 15);
    CHECK_EQ(kvp_coord_load_mask(c, &h, 48, M, &hit), 0);
    CHECK_EQ(hit, 48);
    CHECK(mask_is(&M[0], "TT"));
    CHECK(mask_is(&M[1], "FT"));
    kvp_coord_destroy(c);
}

TEST(mask_buffer_too_small)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0)};
    struct kvp_coord *c = mk(g, 1, 16, 0, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 16);
    CHECK_EQ(kvp_coord_mask_cap(c, 0, 65), 5);
    M[0].cap = 3;
    size_t hit;
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 64, NULL, 0, M, &hit), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0); /* FA: None, no bits needed */
    M[0].cap = 4;
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 64, NULL, 0, M, &hit), 0);
    struct kvp_coord_pool *p = NULL;
    CHECK_EQ(kvp_coord_pool_create(&p, 32, 1), 0); /* hash length mismatch */
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 64, p, 0, M, &hit), KVP_EINVALID_PARAMS);
    kvp_coord_pool_destroy(p);
    kvp_coord_destroy(c);
}

/* ---------------------------------------------------------------- store / lookup masks (§7.6) */

TEST(store_mask_full_only_and_empty)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0)};
    struct kvp_coord *c = mk(g, 1, 16, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK_EQ(M[0].len, 4);
    CHECK_EQ(kvp_coord_store_mask(c, 63, 0, -1, 1, M), KVP_EINVALID_PARAMS); /* not aligned */
    kvp_coord_destroy(c);
    struct kvp_coord_group g2[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 8)};
    c = mk(g2, 2, 8, 0, -1);
    CHECK_EQ(kvp_coord_store_mask(c, 0, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK(mask_is(&M[1], "*"));
    kvp_coord_destroy(c);
}

TEST(store_mask_swa_patterns_and_retention)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 8)};
    struct kvp_coord *c = mk(g, 2, 8, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK(mask_is(&M[1], "FFFTFFFT"));
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, -1, 1, M), 0);
    size_t dense[] = {3, 7, 11, 15};
    CHECK(mask_true_at(&M[1], dense, 4));
    /* suffix masks equal the full mask sliced at start_token */
    uint8_t full[16];
    memcpy(full, M[1].bits, 16);
    for (size_t st = 0; st <= 128; st += 8) {
        CHECK_EQ(kvp_coord_store_mask(c, 128, st, -1, 1, M), 0);
        CHECK_EQ(M[1].first, (st + 7) / 8);
        CHECK_EQ(M[1].len, 16 - M[1].first);
        CHECK(memcmp(M[1].bits, full + M[1].first, M[1].len) == 0);
    }
    /* start_token not block aligned rounds up */
    CHECK_EQ(kvp_coord_store_mask(c, 128, 33, -1, 1, M), 0);
    CHECK_EQ(M[1].first, 5);
    CHECK_EQ(M[0].first, 2);
    CHECK_EQ(M[0].len, 2);
    /* prefix-stable as the length grows */
    for (size_t T = 32; T <= 128; T += 32) {
        CHECK_EQ(kvp_coord_store_mask(c, T, 0, -1, 1, M), 0);
        CHECK(memcmp(M[1].bits, full, T / 8) == 0);
    }
    kvp_coord_destroy(c);

    struct kvp_coord_group w16[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 16)};
    c = mk(w16, 2, 8, 0, -1);
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[1], "FFTTFFTT"));
    kvp_coord_destroy(c);

    c = mk(g, 2, 8, 0, 64); /* retention 64 */
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, -1, 1, M), 0);
    size_t r64[] = {7, 15};
    CHECK(mask_true_at(&M[1], r64, 2));
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, 100, 1, M), 0); /* + replay boundary 99 */
    size_t r64p[] = {7, 11, 15};
    CHECK(mask_true_at(&M[1], r64p, 3));
    kvp_coord_destroy(c);

    c = mk(g, 2, 8, 0, 0); /* retention 0: only boundaries */
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, -1, 1, M), 0);
    CHECK(mask_true_at(&M[1], NULL, 0));
    CHECK_EQ(M[1].len, 16);
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, 100, 1, M), 0);
    size_t r0p[] = {11};
    CHECK(mask_true_at(&M[1], r0p, 1));
    /* lookup ignores retention: the dense L-periodic pattern */
    CHECK_EQ(kvp_coord_lookup_mask(c, 128, 1, M), 0);
    CHECK(mask_true_at(&M[1], dense, 4));
    kvp_coord_destroy(c);
}

TEST(store_mask_dense_cases)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 64, 0), G(KVP_COORD_SWA, 64, 128)};
    struct kvp_coord *c = mk(g, 2, 64, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_store_mask(c, 256, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK(mask_is(&M[1], "*"));
    kvp_coord_destroy(c);
    struct kvp_coord_group s2[] = {G(KVP_COORD_SWA, 16, 32), G(KVP_COORD_SWA, 16, 32)};
    c = mk(s2, 2, 16, 0, -1);
    CHECK_EQ(kvp_coord_store_mask(c, 64, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK(mask_is(&M[1], "*"));
    kvp_coord_destroy(c);
}

TEST(store_mask_dsv4)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 256, 0), G(KVP_COORD_SWA, 64, 128),
                                  G(KVP_COORD_SWA, 64, 512), G(KVP_COORD_SWA, 4, 16),
                                  G(KVP_COORD_SWA, 8, 64)};
    struct kvp_coord *c = mk(g, 5, 4, 0, -1);
    CHECK(c);
    CHECK_EQ(kvp_coord_store_mask(c, 512, 0, -1, 1, M), 0);
    CHECK(mask_is(&M[0], "*"));
    CHECK(mask_is(&M[1], "FFTTFFTT"));
    CHECK(mask_is(&M[2], "*"));
    CHECK_EQ(M[3].len, 128);
    CHECK_EQ(M[4].len, 64);
    for (size_t i = 0; i < 128; i++)
        CHECK_EQ(M[3].bits[i], (i % 64) >= 60);
    for (size_t i = 0; i < 64; i++)
        CHECK_EQ(M[4].bits[i], (i % 32) >= 24);
    kvp_coord_destroy(c);
}

TEST(mamba_store_excluded_lookup_dense)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    int64_t rets[] = {-1, 0, 32, 64};
    for (size_t k = 0; k < 4; k++) {
        struct kvp_coord *c = mk(g, 2, 16, 0, rets[k]);
        CHECK(c);
        CHECK_EQ(kvp_coord_store_mask(c, 64, 0, 100, 1, M), 0);
        CHECK(mask_is(&M[0], "*"));
        CHECK(mask_is(&M[1], "FFFF"));
        CHECK_EQ(kvp_coord_lookup_mask(c, 64, 1, M), 0);
        CHECK(mask_is(&M[1], "*"));
        kvp_coord_destroy(c);
    }
    /* the core Mamba reachable rule with a retention interval */
    struct kvp_coord *c = mk(g, 2, 16, 0, -1);
    CHECK_EQ(kvp_coord_reachable_block_mask(c, 1, 0, 8, 0, 64, NULL, 0, &M[1]), 0);
    CHECK(mask_is(&M[1], "FFFTFFFT"));
    int64_t b = 100; /* aligned 96 -> block 5 */
    CHECK_EQ(kvp_coord_reachable_block_mask(c, 1, 0, 8, 0, 0, &b, 1, &M[1]), 0);
    CHECK(mask_is(&M[1], "FFFFFTFF"));
    CHECK_EQ(kvp_coord_reachable_block_mask(c, 1, 0, 8, 0, 16, NULL, 0, &M[1]), 0);
    CHECK(mask_is(&M[1], "*")); /* per <= 1 */
    kvp_coord_destroy(c);
}

/* ---------------------------------------------------------------- randomized cross-check */

static uint64_t rng_state;
static uint32_t rnd(uint32_t n)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

/* Reference acceptance of hit length h (a multiple of H) by group g. */
static int ref_accepts(const struct kvp_coord_group *s, uint32_t g, size_t h, uint32_t H, size_t n,
                       const struct kvp_coord_pool *p)
{
    size_t B = s->block_size, r = B / H;
    if (h == 0)
        return 1;
    switch (s->kind) {
    case KVP_COORD_FULL:
        for (size_t c = 0; c < h / B; c++)
            if ((c + 1) * r - 1 >= n || !kvp_coord_pool_contains(p, g, H_((c + 1) * r - 1)))
                return 0;
        return h % B == 0 || (h / H <= n && kvp_coord_pool_contains(p, g, H_(h / H - 1)));
    case KVP_COORD_SWA: {
        if (h % B)
            return 0;
        size_t need = (s->window - 1 + B - 1) / B, e = h / B;
        for (size_t c = e > need ? e - need : 0; c < e; c++)
            if ((c + 1) * r - 1 >= n || !kvp_coord_pool_contains(p, g, H_((c + 1) * r - 1)))
                return 0;
        return 1;
    }
    default:
        return h / H <= n && kvp_coord_pool_contains(p, g, H_(h / H - 1));
    }
}

TEST(randomized_cross_check_against_brute_force)
{
    rng_state = 0x9e3779b97f4a7c15ull;
    static const uint32_t Hs[] = {4, 8};
    for (int iter = 0; iter < 3000; iter++) {
        uint32_t H = Hs[rnd(2)];
        size_t ng = 1 + rnd(4);
        struct kvp_coord_group g[4];
        for (size_t i = 0; i < ng; i++) {
            memset(&g[i], 0, sizeof(g[i]));
            g[i].kind = (enum kvp_coord_kind)rnd(3);
            g[i].block_size = H << rnd(3);
            g[i].window = 2 + rnd(4 * g[i].block_size);
            g[i].spec_tag = rnd(2);
        }
        struct kvp_coord *c = mk(g, ng, H, 0, -1);
        CHECK(c);
        int partial = kvp_coord_partial_hits(c);
        size_t A = kvp_coord_alignment(c);
        size_t n = rnd(48);
        struct kvp_coord_hashes hh = hs(n, (uint32_t)iter);
        struct kvp_coord_pool *p = pool_new();
        CHECK(p);
        uint32_t dens = 50 + rnd(50);
        for (uint32_t gi = 0; gi < ng; gi++) {
            /* with partial hits, FA sets are prefix-closed at H (a chain
             * stored in order), which makes FA acceptance prefix-closed */
            size_t k = rnd((uint32_t)n + 1);
            for (size_t u = 0; u < n; u++) {
                int in = (partial && g[gi].kind == KVP_COORD_FULL) ? u < k : rnd(100) < dens;
                if (in)
                    CHECK_EQ(kvp_coord_pool_add(p, gi, H_(u)), 0);
            }
        }
        size_t maxlen = rnd((uint32_t)(n * H + 2 * kvp_coord_lcm_block_size(c) + 1));
        size_t want = 0;
        for (size_t h = 0; h <= maxlen; h += A) {
            int ok = 1;
            for (uint32_t gi = 0; gi < ng && ok; gi++)
                ok = ref_accepts(&g[gi], gi, h, H, n, p);
            if (ok)
                want = h;
        }
        size_t hit = find(c, &hh, maxlen, p, rnd(2));
        if (hit != want)
            th_fail(__FILE__, __LINE__, "iter %d: hit %zu want %zu (ng %zu H %u A %zu max %zu)",
                    iter, hit, want, ng, H, A, maxlen);
        CHECK_EQ(hit, want);
        for (uint32_t gi = 0; gi < ng; gi++) {
            size_t B = g[gi].block_size, nb = (want + B - 1) / B;
            if (g[gi].kind == KVP_COORD_SWA)
                nb = want / B;
            CHECK_EQ(M[gi].len, nb);
            CHECK_EQ(M[gi].all, 0);
            size_t need = (g[gi].window - 1 + B - 1) / B;
            for (size_t i = 0; i < nb; i++) {
                int exp = g[gi].kind == KVP_COORD_FULL    ? 1
                          : g[gi].kind == KVP_COORD_MAMBA ? i + 1 == nb
                                                          : i + need >= nb;
                CHECK_EQ(M[gi].bits[i], exp);
            }
        }
        kvp_coord_pool_destroy(p);
        kvp_coord_destroy(c);
    }
}

TEST(eagle_peek_lands_on_cur)
{
    /* FA16 + SWA16/W16, both eagle (use_eagle, none flagged): FA pops to
     * 48; SWA peeks one block past 48 (maxlen 64) so its own pop lands on
     * 48 instead of 32. */
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 16, 16)};
    struct kvp_coord *c = mk(g, 2, 16, 1, -1);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4, 17);
    CHECK_EQ(find(c, &h, 64, NULL, 1), 48);
    CHECK(mask_is(&M[0], "TTT"));
    CHECK(mask_is(&M[1], "FFT"));
    CHECK_EQ(find(c, &h, 64, NULL, 0), 64);
    CHECK(mask_is(&M[1], "FFFT"));
    kvp_coord_destroy(c);

    /* partial hits: FA32 + Mamba32, H 16, eagle: FA drops a whole block
     * (B tokens, spec §7.3), Mamba never drops but is capped by FA */
    struct kvp_coord_group fm[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_MAMBA, 32, 0)};
    c = mk(fm, 2, 16, 1, -1);
    CHECK(c);
    CHECK(kvp_coord_partial_hits(c));
    CHECK_EQ(find(c, &h, 64, NULL, 1), 32);
    CHECK(mask_is(&M[0], "T"));
    CHECK(mask_is(&M[1], "T"));
    kvp_coord_destroy(c);
}

TEST(create_nomem_and_accessors)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 32, 64)};
    struct kvp_coord_cfg cfg = {.groups = g, .ngroups = 2, .hash_block_size = 16,
                                .retention_interval = -1};
    struct kvp_coord *c = (struct kvp_coord *)1;
    kvp_mem_fail_nth(1, 0);
    CHECK_EQ(kvp_coord_create(&c, &cfg), KVP_ENOMEM);
    CHECK(c == NULL);
    struct kvp_coord_pool *p = (struct kvp_coord_pool *)1;
    kvp_mem_fail_nth(1, 0);
    CHECK_EQ(kvp_coord_pool_create(&p, HL, 1), KVP_ENOMEM);
    CHECK(p == NULL);
    kvp_mem_fail_nth(2, 0); /* the table allocation */
    CHECK_EQ(kvp_coord_pool_create(&p, HL, 1), KVP_ENOMEM);
    kvp_mem_fail_nth(0, 0);
    uint64_t before = kvp_mem_used();
    CHECK_EQ(kvp_coord_create(&c, &cfg), 0);
    CHECK_EQ(kvp_coord_ngroups(c), 2);
    CHECK_EQ(kvp_coord_group_spec(c, 1)->window, 64);
    CHECK(kvp_coord_group_spec(c, 2) == NULL);
    CHECK_EQ(kvp_coord_hash_block_size(c), 16);
    CHECK_EQ(kvp_coord_mask_cap(c, 1, 100), 4);
    /* queries do not allocate */
    reset_masks();
    struct kvp_coord_hashes h = hs(8, 18);
    uint64_t allocs = kvp_mem_allocs();
    size_t hit;
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 128, NULL, 1, M, &hit), 0);
    CHECK_EQ(kvp_coord_store_mask(c, 128, 0, 100, 1, M), 0);
    CHECK_EQ(kvp_coord_lookup_mask(c, 128, 1, M), 0);
    CHECK_EQ(kvp_coord_load_mask(c, &h, 128, M, NULL), 0);
    CHECK_EQ(kvp_mem_allocs(), allocs);
    kvp_coord_destroy(c);
    CHECK_EQ(kvp_mem_used(), before);
}
