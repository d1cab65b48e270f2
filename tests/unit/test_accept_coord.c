/*
 * test_accept_coord.c -- spec §18 acceptance items that are pure
 * coordinator + token database behaviour (test_mooncake_store_hma_e2e.py
 * with a dict-backed store): a save computes its keys from the store masks
 * (§7.6) and process_tokens (§6.6); a lookup probes the keys the lookup
 * mask allows (§10.5), builds the exists set and asks
 * find_longest_cache_hit (§7.4), re-deriving a whole-prompt hit one
 * boundary lower from the SAME exists set; a load selects the chunks of
 * load_mask (§7.5, §10.6). The store here is a set of (group, hash) pairs.
 * The golden values asserted are the spec's (lookup(65) = 64,
 * lookup(64) = 48, after evicting SWA chunks 0-1: 64 and 0; 13 -> 12).
 * The mapping of every §18 item to a test is docs/ACCEPTANCE.md.
 */
#include <stdint.h>
#include <string.h>

#include "connector/coord.h"
#include "connector/tokendb.h"
#include "harness.h"
#include "kvpool.h"

#define HL 16
#define MAXH 64
#define MAXG 4
#define MAXBITS 256

static uint8_t chain[MAXH * HL];
static uint8_t bits[MAXG][MAXBITS];
static struct kvp_coord_mask M[MAXG];
static kvp_tdb_layout layout;

/* hs[i]: distinct 16-byte hashes. */
static struct kvp_coord_hashes hs(size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < HL; b++)
            chain[i * HL + b] = (uint8_t)(0x40 + i * 29 + b * 3);
    struct kvp_coord_hashes h = {.data = chain, .n = n, .hash_len = HL, .stride = 0};
    return h;
}
static const uint8_t *H_(size_t i)
{
    return chain + i * HL;
}

static void reset_masks(void)
{
    for (size_t g = 0; g < MAXG; g++) {
        memset(&M[g], 0, sizeof M[g]);
        M[g].bits = bits[g];
        M[g].cap = MAXBITS;
    }
}

#define G(kind_, b_, w_) {.kind = (kind_), .block_size = (b_), .window = (w_)}

static struct kvp_coord *mk(const struct kvp_coord_group *g, size_t n, uint32_t H)
{
    struct kvp_coord_cfg cfg = {
        .groups = g, .ngroups = n, .hash_block_size = H, .retention_interval = -1};
    struct kvp_coord *c = NULL;
    if (kvp_coord_create(&c, &cfg) != 0)
        return NULL;
    if (kvp_tdb_layout_init(&layout, 1) != 0)
        return NULL;
    reset_masks();
    return c;
}

static struct kvp_coord_pool *pool(void)
{
    struct kvp_coord_pool *p = NULL;
    return kvp_coord_pool_create(&p, HL, 8) == 0 ? p : NULL;
}

/*
 * Normal save (§10.3) of the aligned length T from start_token: per group
 * the store mask, then process_tokens with it as chunk_mask (relative to
 * start, put_step 1); every yielded (g, hash) is put into `store`.
 * Returns the number of keys put, or -1.
 */
static int save(const struct kvp_coord *c, struct kvp_coord_pool *store, size_t n_hashes,
                uint64_t T, uint64_t start)
{
    reset_masks();
    REQUIRE(kvp_coord_store_mask(c, T, start, -1, 1, M) == 0);
    int put = 0;
    for (size_t g = 0; g < kvp_coord_ngroups(c); g++) {
        const struct kvp_coord_group *sp = kvp_coord_group_spec(c, g);
        kvp_tdb db;
        REQUIRE(kvp_tdb_init(&db, sp->block_size, kvp_coord_hash_block_size(c), &layout) == 0);
        kvp_tdb_chunk ch[64];
        size_t n = 0;
        REQUIRE(kvp_tdb_process_tokens(&db, T, n_hashes, start, M[g].all ? NULL : M[g].bits,
                                       M[g].all ? 0 : M[g].len, 1, 0, ch, 64, &n) == 0);
        for (size_t k = 0; k < n; k++) {
            REQUIRE(kvp_coord_pool_add(store, (uint32_t)g, H_(ch[k].hash_idx)) == 0);
            put++;
        }
    }
    return put;
}

/*
 * The pure part of the worker's lookup (§10.5) over a set-backed store:
 * T = align(num_tokens); probe units (every hash boundary with partial
 * hits, else the chunks of lookup_mask); the exists set holds the probed
 * (g, hash) that the store has; find; a hit reaching num_tokens is
 * re-derived below it from the same exists set (no second probe).
 * *probes counts the probed keys. Returns the hit, or (size_t)-1.
 */
static size_t lookup(const struct kvp_coord *c, const struct kvp_coord_hashes *h,
                     const struct kvp_coord_pool *store, size_t num_tokens, size_t *probes)
{
    size_t T = kvp_coord_align_lookup_length(c, num_tokens);
    *probes = 0;
    if (h->n == 0 || T == 0)
        return 0;
    uint32_t H = kvp_coord_hash_block_size(c);
    int fine = kvp_coord_partial_hits(c);
    reset_masks();
    if (!fine && kvp_coord_lookup_mask(c, T, 1, M) != 0)
        return (size_t)-1;
    struct kvp_coord_pool *ex = pool();
    if (!ex)
        return (size_t)-1;
    for (size_t g = 0; g < kvp_coord_ngroups(c); g++) {
        uint32_t B = kvp_coord_group_spec(c, g)->block_size;
        size_t r = fine ? 1 : B / H;
        size_t n = fine ? (h->n < T / H ? h->n : T / H) : (T + B - 1) / B;
        if (!fine && n > h->n / r)
            n = h->n / r;
        for (size_t u = 0; u < n; u++) {
            if (!fine && !M[g].all && (u >= M[g].len || !M[g].bits[u]))
                continue;
            const uint8_t *key = H_((u + 1) * r - 1);
            (*probes)++;
            if (kvp_coord_pool_contains(store, (uint32_t)g, key))
                kvp_coord_pool_add(ex, (uint32_t)g, key);
        }
    }
    reset_masks();
    size_t hit = 0;
    int rc = kvp_coord_find_longest_cache_hit(c, h, T, ex, 1, M, &hit);
    if (rc == 0 && hit >= num_tokens) {
        size_t usable = kvp_coord_align_lookup_length(c, num_tokens - 1);
        hit = 0;
        if (usable > 0) {
            reset_masks();
            rc = kvp_coord_find_longest_cache_hit(c, h, usable, ex, 1, M, &hit);
        }
    }
    kvp_coord_pool_destroy(ex);
    return rc == 0 ? hit : (size_t)-1;
}

/* hma_e2e: FA16 + SWA16/W32, save 64 tokens, lookup(65) = 64 and
 * lookup(64) = 48; after evicting SWA chunks 0 and 1: 64 and 0. */
TEST(hma_fa_swa_save_then_lookup_65_64_and_evict_swa)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 16, 32)};
    struct kvp_coord *c = mk(g, 2, 16);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4);
    struct kvp_coord_pool *store = pool();
    CHECK(store);
    /* L = B = 16: one SWA block per L period < need 2 -> every chunk stored */
    CHECK_EQ(save(c, store, h.n, 64, 0), 8);
    for (size_t i = 0; i < 4; i++)
        CHECK(kvp_coord_pool_contains(store, 0, H_(i)) && kvp_coord_pool_contains(store, 1, H_(i)));
    size_t probes = 0;
    CHECK_EQ(lookup(c, &h, store, 65, &probes), 64);
    CHECK_EQ(probes, 8);
    CHECK_EQ(lookup(c, &h, store, 64, &probes), 48); /* full hit re-derived one block lower */
    CHECK_EQ(probes, 8);                              /* from the same probe */
    CHECK(!M[1].all && M[1].len == 3 && !M[1].bits[0] && M[1].bits[1] && M[1].bits[2]);

    /* evict SWA chunks 0 and 1: the window at 64 is intact, below it nothing */
    struct kvp_coord_pool *ev = pool();
    CHECK(ev);
    for (size_t i = 0; i < 4; i++) {
        CHECK_EQ(kvp_coord_pool_add(ev, 0, H_(i)), 0);
        if (i >= 2)
            CHECK_EQ(kvp_coord_pool_add(ev, 1, H_(i)), 0);
    }
    CHECK_EQ(lookup(c, &h, ev, 65, &probes), 64);
    CHECK_EQ(lookup(c, &h, ev, 64, &probes), 0);
    kvp_coord_pool_destroy(ev);
    kvp_coord_pool_destroy(store);
    kvp_coord_destroy(c);
    kvp_tdb_layout_free(&layout);
}

/* hma_e2e with a sparse SWA store: FA32 + SWA8/W8 (L 32), save 96 tokens:
 * SWA is stored only at the chunk ending each L period (3, 7, 11), the
 * lookup probes exactly those, and lookup(97) = 96, lookup(96) = 64. */
TEST(hma_fa32_swa8_sparse_store_then_lookup)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 8, 8)};
    struct kvp_coord *c = mk(g, 2, 8);
    CHECK(c);
    struct kvp_coord_hashes h = hs(12);
    struct kvp_coord_pool *store = pool();
    CHECK(store);
    CHECK_EQ(save(c, store, h.n, 96, 0), 6);
    for (size_t i = 0; i < 12; i++) {
        int end_of_period = i % 4 == 3;
        CHECK_EQ(kvp_coord_pool_contains(store, 0, H_(i)), end_of_period); /* FA chunk keys */
        CHECK_EQ(kvp_coord_pool_contains(store, 1, H_(i)), end_of_period);
    }
    /* a resumed save from 32 puts only the later chunks (delta) */
    struct kvp_coord_pool *delta = pool();
    CHECK(delta);
    CHECK_EQ(save(c, delta, h.n, 96, 32), 4);
    CHECK(!kvp_coord_pool_contains(delta, 0, H_(3)) && !kvp_coord_pool_contains(delta, 1, H_(3)));
    kvp_coord_pool_destroy(delta);
    size_t probes = 0;
    CHECK_EQ(lookup(c, &h, store, 97, &probes), 96);
    CHECK_EQ(probes, 6); /* 3 FA chunks + SWA chunks 3, 7, 11 */
    CHECK_EQ(lookup(c, &h, store, 96, &probes), 64);
    CHECK_EQ(lookup(c, &h, store, 31, &probes), 0); /* below L: nothing to probe */
    CHECK_EQ(probes, 0);
    kvp_coord_pool_destroy(store);
    kvp_coord_destroy(c);
    kvp_tdb_layout_free(&layout);
}

/* hma_e2e, H = 4, B = 16 (partial hash hits through Mamba16): the sub-block
 * tail of a 12-token prefix is one partial chunk (0, 12, h2) per group;
 * put as the partial-tail hand-off (§10.4 keys: hashes[boundary/H - 1]),
 * lookup(13) = 12. A later normal save of 16 tokens stores the FA chunk
 * but no Mamba state (store masks exclude Mamba), so lookup(17) stays 12. */
TEST(hma_partial_chunks_h4_b16_and_sub_block_tail_lookup)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    struct kvp_coord *c = mk(g, 2, 4);
    CHECK(c);
    CHECK(kvp_coord_partial_hits(c));
    CHECK_EQ(kvp_coord_lcm_block_size(c), 16);
    struct kvp_coord_hashes h = hs(5);
    kvp_tdb db;
    CHECK_EQ(kvp_tdb_init(&db, 16, 4, &layout), 0);
    kvp_tdb_chunk ch[8];
    size_t n = 0;
    /* process_tokens at H 4, B 16: T = 12 -> (0,12,h2); T = 20 -> (0,16,h3), (16,20,h4) */
    CHECK_EQ(kvp_tdb_process_tokens(&db, 12, h.n, 0, NULL, 0, 1, 0, ch, 8, &n), 0);
    CHECK_EQ(n, 1);
    CHECK(ch[0].start == 0 && ch[0].end == 12 && ch[0].hash_idx == 2);
    CHECK_EQ(kvp_tdb_process_tokens(&db, 20, h.n, 0, NULL, 0, 1, 0, ch, 8, &n), 0);
    CHECK_EQ(n, 2);
    CHECK(ch[0].end == 16 && ch[0].hash_idx == 3 && ch[1].start == 16 && ch[1].end == 20 &&
          ch[1].hash_idx == 4);

    struct kvp_coord_pool *store = pool();
    CHECK(store);
    /* the hand-off at boundary 12: one key per group, hashes[12/4 - 1] */
    CHECK_EQ(kvp_tdb_process_tokens(&db, 12, h.n, 0, NULL, 0, 1, 0, ch, 8, &n), 0);
    CHECK_EQ(kvp_coord_pool_add(store, 0, H_(ch[0].hash_idx)), 0);
    CHECK_EQ(kvp_coord_pool_add(store, 1, H_(ch[0].hash_idx)), 0);
    size_t probes = 0;
    CHECK_EQ(lookup(c, &h, store, 13, &probes), 12);
    CHECK_EQ(probes, 6); /* every hash boundary below 12, both groups */
    CHECK(M[0].len == 1 && M[0].bits[0] && M[1].len == 1 && M[1].bits[0]);
    CHECK_EQ(lookup(c, &h, store, 12, &probes), 0); /* full hit re-derived at 8: nothing there */

    /* normal save of 16 tokens: Mamba is masked out of stores */
    CHECK_EQ(save(c, store, h.n, 16, 0), 1);
    CHECK(kvp_coord_pool_contains(store, 0, H_(3)));
    CHECK(!kvp_coord_pool_contains(store, 1, H_(3)));
    CHECK_EQ(lookup(c, &h, store, 17, &probes), 12);
    kvp_coord_pool_destroy(store);
    kvp_coord_destroy(c);
    kvp_tdb_layout_free(&layout);
}

/*
 * §10.6 / hma_e2e "recv skips SWA blocks before the window": FA16 +
 * SWA16/W32, load of T = 64 after a local prefix of vllm_cached tokens:
 * process_tokens from floor(vllm_cached / L) * L, kept where load_mask is
 * set. FA loads every chunk past the local prefix, SWA only chunks 2, 3
 * (hs2, hs3).
 */
TEST(load_selects_only_swa_window_chunks)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_SWA, 16, 32)};
    struct kvp_coord *c = mk(g, 2, 16);
    CHECK(c);
    struct kvp_coord_hashes h = hs(4);
    static const uint64_t cached[] = {0, 16, 20};
    for (size_t k = 0; k < 3; k++) {
        reset_masks();
        size_t hit = 0;
        CHECK_EQ(kvp_coord_load_mask(c, &h, 64, M, &hit), 0);
        CHECK_EQ(hit, 64);
        uint64_t mask_num = cached[k] / 16 * 16;
        size_t want_fa = 4 - mask_num / 16;
        for (size_t gi = 0; gi < 2; gi++) {
            kvp_tdb db;
            CHECK_EQ(kvp_tdb_init(&db, 16, 16, &layout), 0);
            kvp_tdb_chunk ch[8];
            size_t n = 0;
            CHECK_EQ(kvp_tdb_process_tokens(&db, 64, h.n, mask_num, NULL, 0, 1, 0, ch, 8, &n), 0);
            size_t kept = 0, keys[8];
            for (size_t j = 0; j < n; j++)
                if (ch[j].index < M[gi].len && M[gi].bits[ch[j].index])
                    keys[kept++] = ch[j].hash_idx;
            if (gi == 0) {
                CHECK_EQ(kept, want_fa);
                for (size_t j = 0; j < kept; j++)
                    CHECK_EQ(keys[j], mask_num / 16 + j);
            } else {
                CHECK_EQ(kept, 2);
                CHECK_EQ(keys[0], 2);
                CHECK_EQ(keys[1], 3);
            }
        }
    }
    kvp_coord_destroy(c);
    kvp_tdb_layout_free(&layout);
}

/*
 * §7.3/§7.4 eagle rules with alignment (supports the coordinator item
 * "eagle pop once"), tautological pool:
 *  - FA32 + SWA16/W32, H 16, L 32, eagle, max 128: FA pops to 96; SWA
 *    peeks to 112, needs ceil(31/16) + 1 = 3 blocks, a run may only start
 *    at a block i with i*16 % 32 == 0, keeps [4..6], pops one -> 96 with
 *    the window [4, 5]. Without eagle: 128, window [6, 7].
 *  - FA16 + Mamba16, H 4 (partial hits), eagle, max 60: FA finds 3 full
 *    blocks plus the fine boundary 60, pops that partial block (hit -= B)
 *    -> 44; Mamba never pops and lands on 44 (state block 2).
 */
TEST(eagle_pop_with_alignment_and_partial_fa_block)
{
    struct kvp_coord_group g[] = {G(KVP_COORD_FULL, 32, 0), G(KVP_COORD_SWA, 16, 32)};
    struct kvp_coord_cfg cfg = {.groups = g, .ngroups = 2, .hash_block_size = 16,
                                .use_eagle = 1, .retention_interval = -1};
    struct kvp_coord *c = NULL;
    CHECK_EQ(kvp_coord_create(&c, &cfg), 0);
    struct kvp_coord_hashes h = hs(16);
    reset_masks();
    size_t hit = 0;
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 128, NULL, 1, M, &hit), 0);
    CHECK_EQ(hit, 96);
    CHECK(M[0].len == 3 && M[0].bits[0] && M[0].bits[1] && M[0].bits[2]);
    CHECK_EQ(M[1].len, 6);
    for (size_t i = 0; i < 6; i++)
        CHECK_EQ(M[1].bits[i], i >= 4);
    reset_masks();
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 128, NULL, 0, M, &hit), 0);
    CHECK_EQ(hit, 128);
    CHECK_EQ(M[1].len, 8);
    for (size_t i = 0; i < 8; i++)
        CHECK_EQ(M[1].bits[i], i >= 6);
    kvp_coord_destroy(c);

    struct kvp_coord_group fm[] = {G(KVP_COORD_FULL, 16, 0), G(KVP_COORD_MAMBA, 16, 0)};
    cfg.groups = fm;
    cfg.hash_block_size = 4;
    CHECK_EQ(kvp_coord_create(&c, &cfg), 0);
    reset_masks();
    CHECK_EQ(kvp_coord_find_longest_cache_hit(c, &h, 60, NULL, 1, M, &hit), 0);
    CHECK_EQ(hit, 44);
    CHECK(M[0].len == 3 && M[0].bits[0] && M[0].bits[1] && M[0].bits[2]);
    CHECK(M[1].len == 3 && !M[1].bits[0] && !M[1].bits[1] && M[1].bits[2]);
    /* the receiver re-derives the same masks from 44 without a second pop */
    reset_masks();
    CHECK_EQ(kvp_coord_load_mask(c, &h, 44, M, &hit), 0);
    CHECK_EQ(hit, 44);
    CHECK(M[0].len == 3 && M[1].len == 3 && M[1].bits[2] && !M[1].bits[1]);
    kvp_coord_destroy(c);
}
