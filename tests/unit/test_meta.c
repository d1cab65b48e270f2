/* test_meta.c -- connector request structures (spec §6.1-§6.4) and the
 * step metadata encoding: round trips, truncation, trailing bytes, hostile
 * counts, canonicity, version mismatch, allocation limits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/mem.h"
#include "connector/meta.h"
#include "harness.h"
#include "kvpool.h"
#include "meta_samples.h"

#define ARENA_CAP (1u << 20)

/* Encodes sample v into b (caller frees). */
static int enc_sample(int v, kvp_buf *b)
{
    kvp_meta_step s;
    REQUIRE(ms_sample(v, &s) == 0);
    kvp_buf_init(b, 1u << 20);
    REQUIRE(kvp_meta_encode(b, &s) == 0);
    return 0;
}

static int dec(const void *p, size_t n)
{
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_meta_step s;
    int rc = kvp_meta_decode(p, n, &a, &s);
    kvp_arena_free(&a);
    return rc;
}

/* ------------------------------------------------------------ tracker */

TEST(meta_tracker_update_append_replace_reset)
{
    kvp_meta_tracker t;
    CHECK_EQ(kvp_meta_tracker_init(&t, "r1", 2, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_meta_tracker_init(&t, "r1", 0, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_meta_tracker_init(&t, "r1", 2, 2), 0);
    uint32_t a[2] = {0, 1}, b[1] = {2}, c[1] = {5};
    kvp_meta_ids g[2] = {{a, 2, 0}, {c, 1, 0}};
    CHECK_EQ(kvp_meta_tracker_update(&t, g, 2), 0);
    kvp_meta_ids g2[2] = {{b, 1, 0}, {NULL, 0, 0}};
    CHECK_EQ(kvp_meta_tracker_update(&t, g2, 2), 0);
    CHECK_EQ(t.block_ids[0].n, 3);
    CHECK_EQ(t.block_ids[0].ids[2], 2);
    CHECK_EQ(t.block_ids[1].n, 1);
    /* group-count mismatch */
    CHECK_EQ(kvp_meta_tracker_update(&t, g2, 1), KVP_EINVALID_PARAMS);
    /* allocation failure leaves the tracker unchanged */
    uint32_t many[64];
    for (int i = 0; i < 64; i++)
        many[i] = (uint32_t)i;
    kvp_meta_ids gm[2] = {{many, 64, 0}, {many, 64, 0}};
    kvp_mem_fail_nth(2, 0);
    CHECK_EQ(kvp_meta_tracker_update(&t, gm, 2), KVP_ENOMEM);
    kvp_mem_fail_nth(0, 0);
    CHECK_EQ(t.block_ids[0].n, 3);
    CHECK_EQ(t.block_ids[1].n, 1);
    /* resumed requests REPLACE the table */
    CHECK_EQ(kvp_meta_tracker_replace(&t, g2, 2), 0);
    CHECK_EQ(t.block_ids[0].n, 1);
    CHECK_EQ(t.block_ids[0].ids[0], 2);
    CHECK_EQ(t.block_ids[1].n, 0);
    CHECK_EQ(kvp_meta_tracker_set_tokens(&t, many, 4), 0);
    CHECK_EQ(t.n_token_ids, 4);
    t.token_len = 40;
    t.num_saved_tokens = 32;
    t.has_pending_offload = true;
    t.prefill_end_tokens = 50;
    kvp_meta_tracker_reset(&t);
    CHECK_EQ(t.ngroups, 0);
    CHECK(t.token_ids == NULL);
    CHECK_EQ(t.token_len + t.num_saved_tokens + t.prefill_end_tokens, 0);
    CHECK(!t.has_pending_offload);
    CHECK(strcmp(t.req_id, "r1") == 0);
    /* after a reset the tracker has 0 groups: an update is a mismatch, an
     * empty update matches, a replace re-establishes the table */
    CHECK_EQ(kvp_meta_tracker_update(&t, g, 2), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_meta_tracker_update(&t, NULL, 0), 0);
    CHECK_EQ(kvp_meta_tracker_replace(&t, g, 2), 0);
    CHECK_EQ(t.ngroups, 2);
    CHECK_EQ(t.block_ids[0].n, 2);
    kvp_meta_tracker_free(&t);
}

/* ReqMeta.from_request_tracker goldens (§6.3). */
TEST(meta_from_tracker_golden)
{
    kvp_meta_tracker t;
    kvp_meta_req r;
    uint8_t h[4 * 32] = {0};
    CHECK_EQ(kvp_meta_tracker_init(&t, "req", 3, 1), 0);
    uint32_t ids[3] = {0, 1, 2};
    kvp_meta_ids g = {ids, 3, 0};
    CHECK_EQ(kvp_meta_tracker_update(&t, &g, 1), 0);
    t.prefill_end_tokens = 60;
    /* watermark 32, token_len 44, L 16: 44 -> 32 < boundary 48: None */
    t.num_saved_tokens = 32;
    t.token_len = 44;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_RUNNING, &r),
             0);
    CHECK_EQ(t.num_saved_tokens, 32);
    /* token_len 48 -> meta with 48, watermark advances */
    t.token_len = 48;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 4, 32, KVP_META_TRUE, -1,
                                   KVP_META_RUNNING, &r),
             1);
    CHECK_EQ(r.token_len_chunk, 48);
    CHECK_EQ(r.can_save, KVP_META_TRUE);
    CHECK(r.load_spec == NULL);
    CHECK_EQ(r.ngroups, 1);
    CHECK_EQ(r.block_ids[0].n, 3);
    CHECK_EQ(r.num_prompt_tokens, 60);
    CHECK(r.has_num_prompt_tokens);
    CHECK_EQ(r.is_last_chunk, KVP_META_TRUE);
    CHECK_EQ(t.num_saved_tokens, 48);
    /* max_save_tokens = 0: None, watermark unchanged */
    t.token_len = 96;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 4, 32, KVP_META_UNSET, 0,
                                   KVP_META_RUNNING, &r),
             0);
    CHECK_EQ(t.num_saved_tokens, 48);
    /* max_save_tokens clamps */
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 4, 32, KVP_META_UNSET, 70,
                                   KVP_META_RUNNING, &r),
             1);
    CHECK_EQ(r.token_len_chunk, 64);
    /* a load overrides the save: can_save false, load spec kept, watermark kept */
    kvp_meta_load_spec ls = {0, 32, 0, true};
    t.num_saved_tokens = 0;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, &ls, false, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_LOAD, &r),
             1);
    CHECK_EQ(r.can_save, KVP_META_FALSE);
    CHECK(r.load_spec == &ls);
    CHECK_EQ(t.num_saved_tokens, 0);
    /* can_load false does not suppress the save and is dropped */
    ls.can_load = false;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, &ls, false, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_NEW, &r),
             1);
    CHECK_EQ(r.can_save, KVP_META_TRUE);
    CHECK(r.load_spec == NULL);
    CHECK_EQ(r.token_len_chunk, 96);
    /* skip_save with a (non-loading) load spec: a meta that neither saves nor loads */
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, &ls, true, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_NEW, &r),
             1);
    CHECK_EQ(r.can_save, KVP_META_FALSE);
    CHECK(r.load_spec == NULL);
    /* skip_save (consumer) without load: None */
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, true, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_NEW, &r),
             0);
    CHECK_EQ(kvp_meta_from_tracker(&t, 0, NULL, false, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_NEW, &r),
             KVP_EINVALID_PARAMS);
    /* saturating watermark */
    t.num_saved_tokens = UINT64_MAX - 3;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 4, 32, KVP_META_UNSET, -1,
                                   KVP_META_NEW, &r),
             0);
    kvp_meta_tracker_free(&t);
}

/* ---------------------------------------------------------- round trips */

TEST(meta_roundtrip_every_kind)
{
    for (int v = 0; v < MS_COUNT; v++) {
        kvp_meta_step s, d;
        CHECK_EQ(ms_sample(v, &s), 0);
        kvp_buf b, b2;
        CHECK_EQ(enc_sample(v, &b), 0);
        kvp_arena a;
        kvp_arena_init(&a, ARENA_CAP);
        CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), 0);
        CHECK(kvp_meta_step_equal(&s, &d));
        kvp_buf_init(&b2, 1u << 20);
        CHECK_EQ(kvp_meta_encode(&b2, &d), 0);
        CHECK_EQ(b2.len, b.len);
        CHECK(memcmp(b.data, b2.data, b.len) == 0);
        if (v == 2) {
            /* spot checks on the decoded values */
            CHECK_EQ(d.nreqs, 6);
            for (uint32_t i = 0; i < 6; i++)
                CHECK_EQ(d.reqs[i].kind, i);
            CHECK(d.reqs[2].load_spec && d.reqs[2].load_spec->can_load);
            CHECK_EQ(d.reqs[2].load_spec->kvpool_cached_tokens, 48);
            CHECK_EQ(d.reqs[4].ntails, 2);
            CHECK_EQ(d.reqs[4].tails[1].cow_block_id, 7);
            CHECK(d.reqs[5].tails != NULL && d.reqs[5].ntails == 0);
            CHECK(d.reqs[1].tails == NULL);
            CHECK(d.reqs[1].token_ids == NULL);
            CHECK_EQ(d.reqs[5].can_save, KVP_META_UNSET);
            CHECK(!d.reqs[5].has_num_prompt_tokens);
            CHECK_EQ(d.reqs[0].token_ids[3], 0xFFFFFFFFu);
            CHECK_EQ(d.reqs[0].block_ids[1].ids[1], 0x7FFFFFFF);
            CHECK(memcmp(d.reqs[0].block_hashes + 7 * 32, ms_hash32 + 7 * 32, 32) == 0);
            CHECK_EQ(d.preempted[1].len, 3);
            CHECK(memcmp(d.preempted[1].p, "\xff\x01z", 3) == 0);
            CHECK_EQ(d.preempted[1].p[3], '\0');
        }
        kvp_arena_free(&a);
        kvp_buf_free(&b);
        kvp_buf_free(&b2);
    }
}

/* A step built with the add_* helpers from a tracker round-trips. */
TEST(meta_step_builder)
{
    kvp_meta_tracker t;
    CHECK_EQ(kvp_meta_tracker_init(&t, "abc", 3, 2), 0);
    uint32_t ids[2] = {4, 5};
    kvp_meta_ids g[2] = {{ids, 2, 0}, {ids, 1, 0}};
    CHECK_EQ(kvp_meta_tracker_update(&t, g, 2), 0);
    uint32_t toks[33];
    for (int i = 0; i < 33; i++)
        toks[i] = (uint32_t)i * 3;
    CHECK_EQ(kvp_meta_tracker_set_tokens(&t, toks, 33), 0);
    t.token_len = 33;
    t.prefill_end_tokens = 33;
    uint8_t h[8 * 16];
    memset(h, 0xab, sizeof h);
    kvp_meta_req r;
    CHECK_EQ(kvp_meta_from_tracker(&t, 16, NULL, false, h, 8, 16, KVP_META_TRUE, -1,
                                   KVP_META_NEW, &r),
             1);
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    for (int i = 0; i < 20; i++)
        CHECK_EQ(kvp_meta_step_add_req(&s, &r), 0);
    CHECK_EQ(kvp_meta_step_add_unfinished(&s, "abc", 3), 0);
    CHECK_EQ(kvp_meta_step_add_preempted(&s, "zz", 2), 0);
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    CHECK_EQ(kvp_meta_encode(&b, &s), 0);
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_meta_step d;
    CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), 0);
    CHECK(kvp_meta_step_equal(&s, &d));
    CHECK_EQ(d.reqs[19].n_token_ids, 33);
    CHECK_EQ(d.reqs[19].token_ids[32], 96);
    /* a too small buffer: the sticky error comes back */
    kvp_buf small;
    kvp_buf_init(&small, 16);
    CHECK_EQ(kvp_meta_encode(&small, &s), KVP_ETOO_LARGE);
    kvp_buf_free(&small);
    kvp_arena_free(&a);
    kvp_buf_free(&b);
    kvp_meta_step_free(&s);
    kvp_meta_tracker_free(&t);
}

/* ------------------------------------------------------- hostile input */

TEST(meta_truncation_every_offset)
{
    for (int v = 0; v < MS_COUNT; v++) {
        kvp_buf b;
        CHECK_EQ(enc_sample(v, &b), 0);
        for (size_t n = 0; n < b.len; n++)
            CHECK_EQ(dec(b.data, n), KVP_EPROTOCOL);
        CHECK_EQ(dec(b.data, b.len), 0);
        kvp_buf_free(&b);
    }
}

TEST(meta_trailing_bytes)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(2, &b), 0);
    kvp_buf_u8(&b, 0);
    CHECK_EQ(dec(b.data, b.len), KVP_EPROTOCOL);
    kvp_buf_u32(&b, 0);
    CHECK_EQ(dec(b.data, b.len), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}

TEST(meta_version_and_magic)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(1, &b), 0);
    CHECK_EQ(b.data[4], KVP_META_VERSION);
    CHECK_EQ(KVP_META_VERSION, 2);
    b.data[4] = 1; /* version 1 (no delta) is no longer decoded */
    CHECK_EQ(dec(b.data, b.len), KVP_EINVALID_VERSION);
    b.data[4] = 3;
    CHECK_EQ(dec(b.data, b.len), KVP_EINVALID_VERSION);
    b.data[4] = 0;
    CHECK_EQ(dec(b.data, b.len), KVP_EINVALID_VERSION);
    /* only the header is needed to tell the version */
    CHECK_EQ(dec(b.data, 5), KVP_EINVALID_VERSION);
    b.data[4] = KVP_META_VERSION;
    b.data[0] ^= 1;
    CHECK_EQ(dec(b.data, b.len), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}

static void patch32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Every 4-byte window replaced by a huge count: never a crash, never an
 * allocation beyond the frame's justification (bounded arena), only
 * success (the window held a plain value) or a clean error. */
TEST(meta_hostile_counts)
{
    const uint32_t vals[] = {0xFFFFFFFFu, 0x7FFFFFFFu, 0x10000u, 0x41u};
    for (int v = 1; v < MS_COUNT; v++) {
        kvp_buf b;
        CHECK_EQ(enc_sample(v, &b), 0);
        uint8_t *m = kvp_malloc(b.len);
        CHECK(m);
        for (size_t off = 5; off + 4 <= b.len; off++) {
            for (size_t k = 0; k < sizeof vals / sizeof vals[0]; k++) {
                memcpy(m, b.data, b.len);
                patch32(m + off, vals[k]);
                kvp_arena a;
                kvp_arena_init(&a, 64u * 1024);
                kvp_meta_step d;
                int rc = kvp_meta_decode(m, b.len, &a, &d);
                CHECK(rc == 0 || rc == KVP_EPROTOCOL);
                if (rc == 0) {
                    kvp_buf b2;
                    kvp_buf_init(&b2, 1u << 20);
                    CHECK_EQ(kvp_meta_encode(&b2, &d), 0);
                    CHECK(b2.len == b.len && memcmp(b2.data, m, b.len) == 0);
                    kvp_buf_free(&b2);
                }
                kvp_arena_free(&a);
            }
        }
        /* the drop count and the request count themselves */
        memcpy(m, b.data, b.len);
        patch32(m + 5, 0xFFFFFFFFu);
        CHECK_EQ(dec(m, b.len), KVP_EPROTOCOL);
        memcpy(m, b.data, b.len);
        patch32(m + 9, 0xFFFFFFFFu);
        CHECK_EQ(dec(m, b.len), KVP_EPROTOCOL);
        kvp_free(m);
        kvp_buf_free(&b);
    }
}

/* Every single-byte change: a clean answer, and canonical on success. */
TEST(meta_byte_flips_canonical)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(2, &b), 0);
    uint8_t *m = kvp_malloc(b.len);
    CHECK(m);
    const uint8_t xs[] = {0x01, 0x02, 0x80, 0xFF};
    for (size_t off = 0; off < b.len; off++) {
        for (size_t k = 0; k < sizeof xs; k++) {
            memcpy(m, b.data, b.len);
            m[off] ^= xs[k];
            kvp_arena a;
            kvp_arena_init(&a, ARENA_CAP);
            kvp_meta_step d;
            int rc = kvp_meta_decode(m, b.len, &a, &d);
            CHECK(rc == 0 || rc == KVP_EPROTOCOL || (off == 4 && rc == KVP_EINVALID_VERSION));
            if (rc == 0) {
                kvp_buf b2;
                kvp_buf_init(&b2, 1u << 20);
                CHECK_EQ(kvp_meta_encode(&b2, &d), 0);
                CHECK(b2.len == b.len && memcmp(b2.data, m, b.len) == 0);
                kvp_buf_free(&b2);
            }
            kvp_arena_free(&a);
        }
    }
    kvp_free(m);
    kvp_buf_free(&b);
}

/*
 * Offsets in sample 3 (one request "L"): header 0..12 (magic, version,
 * ndrop, nreqs); req: id len 13..16, 'L' 17, kind 18, flags 19,
 * token_len_chunk 20..27, ngroups 28..31, group0 base 32..35, n 36..39,
 * id 40..43, hash_len 44, hash base 45..48, n 49..52, hashes 53..116,
 * load spec 117..141 (can_load at 141), num_prompt 142..149, nunfinished
 * 150..153, npreempted 154..157, ...
 */
TEST(meta_non_canonical_rejected)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(3, &b), 0);
    uint8_t *m = kvp_malloc(b.len + 64);
    CHECK(m);
    CHECK_EQ(b.data[17], 'L');
    CHECK_EQ(b.data[44], 16);
    CHECK_EQ(b.data[141], 1);
#define MUT(stmt, want)                                                        \
    do {                                                                       \
        memcpy(m, b.data, b.len);                                              \
        stmt;                                                                  \
        CHECK_EQ(dec(m, b.len), want);                                         \
    } while (0)
    MUT((void)0, 0);
    MUT(m[18] = KVP_META_KIND_COUNT, KVP_EPROTOCOL);  /* unknown kind */
    MUT(m[19] = (uint8_t)(m[19] & ~1u) | 2u, KVP_EPROTOCOL); /* value bit w/o has bit */
    MUT(m[19] |= 2u, KVP_EPROTOCOL);                  /* save together with load */
    MUT(m[44] = 0, KVP_EPROTOCOL);                    /* hashes with hash_len 0 */
    MUT(m[44] = 65, KVP_EPROTOCOL);                   /* hash_len over the limit */
    MUT(m[141] = 2, KVP_EPROTOCOL);                   /* can_load not 0/1 */
    MUT(m[141] = 0, 0);                               /* can_load false is a value */
    MUT(patch32(m + 13, 0), KVP_EPROTOCOL);           /* empty request id */
    MUT(patch32(m + 28, KVP_META_MAX_GROUPS + 1), KVP_EPROTOCOL);
    MUT(patch32(m + 32, 1), KVP_EPROTOCOL);           /* a base without a mirror */
    MUT(patch32(m + 45, 1), KVP_EPROTOCOL);           /* a hash base without a mirror */
    kvp_free(m);
    kvp_buf_free(&b);

    /* a tail naming a group the request does not have */
    kvp_meta_step s;
    CHECK_EQ(ms_sample(2, &s), 0);
    kvp_meta_tail bad_tail = {2, 1, 8};
    s.reqs[4].tails = &bad_tail;
    s.reqs[4].ntails = 1;
    kvp_buf e;
    kvp_buf_init(&e, 1u << 20);
    CHECK_EQ(kvp_meta_encode(&e, &s), KVP_EINVALID_PARAMS);
    bad_tail.group_id = 1;
    CHECK_EQ(kvp_meta_encode(&e, &s), 0);
    /* find the encoded tail (group 1, cow 1, boundary 8) and corrupt it */
    const uint8_t pat[16] = {1, 0, 0, 0, 1, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0};
    uint8_t *hit = memmem(e.data, e.len, pat, sizeof pat);
    CHECK(hit != NULL);
    size_t at = (size_t)(hit - e.data);
    e.data[at] = 2;
    CHECK_EQ(dec(e.data, e.len), KVP_EPROTOCOL);
    e.data[at] = 1;
    /* token id list present but empty is not canonical */
    kvp_buf_free(&e);
    kvp_buf_init(&e, 1u << 20);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].token_ids = NULL;
    s.reqs[0].n_token_ids = 0;
    CHECK_EQ(kvp_meta_encode(&e, &s), 0);
    CHECK_EQ(dec(e.data, e.len), 0);
    /* set the TOKENS flag and splice in base 0, count 0 before num_prompt */
    kvp_buf f;
    kvp_buf_init(&f, 1u << 20);
    size_t fl = 13 + 4 + 13 + 1;
    CHECK_EQ(e.data[fl] & 0x20, 0);
    kvp_buf_put(&f, e.data, e.len - 8 - 8);
    kvp_buf_u32(&f, 0);
    kvp_buf_u32(&f, 0);
    kvp_buf_put(&f, e.data + e.len - 16, 16);
    f.data[fl] |= 0x20;
    CHECK_EQ(dec(f.data, f.len), KVP_EPROTOCOL);
    kvp_buf_free(&f);
    kvp_buf_free(&e);
#undef MUT
}

TEST(meta_encoder_refuses_invalid)
{
    kvp_meta_step s;
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].load_spec = &ms_load; /* save and load together */
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].hash_len = 0;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].req_id.len = 0;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].kind = KVP_META_KIND_COUNT;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].can_save = 3;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(1, &s), 0);
    s.reqs[0].ngroups = KVP_META_MAX_GROUPS + 1;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    CHECK_EQ(ms_sample(2, &s), 0);
    s.unfinished[0].len = KVP_META_MAX_ID + 1;
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    s.unfinished[0].len = 5;
    CHECK_EQ(b.len, 0); /* nothing written by refused encodes */
    kvp_buf_free(&b);
}

TEST(meta_arena_limit)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(2, &b), 0);
    kvp_arena a;
    kvp_arena_init(&a, 256);
    kvp_meta_step d;
    CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), KVP_ENOMEM);
    kvp_arena_free(&a);
    kvp_buf_free(&b);
}

/* ------------------------------------------------------- delta (v2) */

/*
 * A model of the scheduler's requests for the delta property test: full
 * arrays in fixed-capacity buffers (appends never move them, so a view
 * taken earlier in a step stays valid), and what the sender has sent.
 */
#define PM_REQS 12
#define PM_MAXB 1024
#define PM_MAXT 4096
#define PM_MAXG 3

typedef struct pm_req {
    char id[16];
    bool live;        /* exists (new or running) */
    bool preempted;   /* waits for a resume (a replacing send) */
    uint32_t ngroups;
    uint32_t ids[PM_MAXG][PM_MAXB];
    kvp_meta_ids g[PM_MAXG];
    uint8_t hash_len;
    uint8_t hs[PM_MAXB * 32];
    uint32_t nh;
    uint32_t toks[PM_MAXT];
    uint32_t nt;
    /* sender state */
    bool sent;
    uint32_t sent_g[PM_MAXG], sent_ng, sent_h, sent_t;
    uint8_t sent_hl;
} pm_req;

static uint64_t pm_rng;
static uint32_t pm_rand(uint32_t n)
{
    pm_rng ^= pm_rng << 13;
    pm_rng ^= pm_rng >> 7;
    pm_rng ^= pm_rng << 17;
    return (uint32_t)(pm_rng % n);
}

/* Replaces the request's arrays (new / resumed): the next send is full. */
static void pm_fill(pm_req *q)
{
    q->ngroups = 1 + pm_rand(PM_MAXG);
    for (uint32_t g = 0; g < q->ngroups; g++) {
        uint32_t n = pm_rand(40);
        for (uint32_t i = 0; i < n; i++)
            q->ids[g][i] = pm_rand(100000);
        q->g[g] = (kvp_meta_ids){q->ids[g], n, 0};
    }
    q->hash_len = pm_rand(4) == 0 ? 0 : (pm_rand(2) ? 32 : 16);
    q->nh = q->hash_len ? pm_rand(40) : 0;
    for (uint32_t i = 0; i < q->nh * q->hash_len; i++)
        q->hs[i] = (uint8_t)pm_rand(256);
    q->nt = pm_rand(3) == 0 ? 0 : pm_rand(600);
    for (uint32_t i = 0; i < q->nt; i++)
        q->toks[i] = pm_rand(0xFFFFFFFFu);
    q->sent_ng = q->sent_h = q->sent_t = 0;
}

/* Appends blocks / hashes / tokens (a running request). */
static void pm_append(pm_req *q)
{
    for (uint32_t g = 0; g < q->ngroups; g++) {
        uint32_t n = pm_rand(3);
        for (uint32_t i = 0; i < n && q->g[g].n < PM_MAXB; i++)
            q->ids[g][q->g[g].n++] = pm_rand(100000);
    }
    if (q->hash_len) {
        uint32_t n = pm_rand(3);
        for (uint32_t i = 0; i < n && q->nh < PM_MAXB; i++, q->nh++)
            for (uint32_t k = 0; k < q->hash_len; k++)
                q->hs[q->nh * q->hash_len + k] = (uint8_t)pm_rand(256);
    }
    if (q->nt) {
        uint32_t n = pm_rand(20);
        for (uint32_t i = 0; i < n && q->nt < PM_MAXT; i++)
            q->toks[q->nt++] = pm_rand(0xFFFFFFFFu);
    }
}

/* A meta of q (random scalars) with the sender's delta base. */
static void pm_meta(pm_req *q, kvp_meta_req *r, kvp_meta_base *b, uint32_t *gb,
                    kvp_meta_ids *gd, kvp_meta_load_spec *ls, kvp_meta_tail *tl)
{
    memset(r, 0, sizeof *r);
    memcpy(gd, q->g, sizeof q->g); /* this meta's counts (q->g grows later) */
    r->req_id = (kvp_meta_str){q->id, (uint32_t)strlen(q->id)};
    r->kind = (uint8_t)pm_rand(KVP_META_KIND_COUNT);
    r->token_len_chunk = pm_rand(5000);
    r->block_ids = gd;
    r->ngroups = q->ngroups;
    r->block_hashes = q->nh ? q->hs : NULL;
    r->nhashes = q->nh;
    r->hash_len = q->nh ? q->hash_len : 0;
    r->can_save = (int8_t)pm_rand(3) - 1;
    r->is_last_chunk = (int8_t)pm_rand(3) - 1;
    if (r->can_save != KVP_META_TRUE && pm_rand(3) == 0) {
        *ls = (kvp_meta_load_spec){pm_rand(100), pm_rand(1000), pm_rand(1000), true};
        r->load_spec = ls;
    }
    r->token_ids = q->nt ? q->toks : NULL;
    r->n_token_ids = q->nt;
    r->has_num_prompt_tokens = pm_rand(2);
    r->num_prompt_tokens = r->has_num_prompt_tokens ? pm_rand(9000) : 0;
    if (pm_rand(4) == 0) {
        r->ntails = pm_rand(3);
        for (uint32_t i = 0; i < r->ntails; i++)
            tl[i] = (kvp_meta_tail){pm_rand(q->ngroups), pm_rand(500), 48};
        r->tails = tl;
    }
    /* the sender: what the mirrors hold, when still a prefix */
    *b = (kvp_meta_base){NULL, 0, 0};
    if (q->sent) {
        if (q->sent_ng == r->ngroups) {
            for (uint32_t g = 0; g < r->ngroups; g++)
                gb[g] = q->sent_g[g];
            b->groups = gb;
        }
        if (q->sent_hl == r->hash_len)
            b->hashes = q->sent_h;
        b->tokens = q->sent_t;
    }
    q->sent = true;
    q->sent_ng = r->ngroups;
    for (uint32_t g = 0; g < r->ngroups; g++)
        q->sent_g[g] = r->block_ids[g].n;
    q->sent_h = r->nhashes;
    q->sent_hl = r->hash_len;
    q->sent_t = r->n_token_ids;
}

/*
 * Property: a random sequence of steps (new, running with appended
 * blocks / hashes / tokens, resumed replacing everything, preempted,
 * finished, requests without a meta, a request twice in one step, loads,
 * tails), delta-encoded and decoded through ONE mirror, equals the full
 * steps field by field at every step; the delta is never larger than the
 * full encoding; the mirror is empty once every request finished.
 */
TEST(meta_delta_property_random)
{
    pm_req *q = kvp_calloc(PM_REQS, sizeof *q);
    CHECK(q);
    kvp_meta_mirror *mir = kvp_meta_mirror_new();
    CHECK(mir);
    kvp_arena a;
    kvp_arena_init(&a, 64u << 20);
    kvp_buf b, full;
    kvp_buf_init(&b, 64u << 20);
    kvp_buf_init(&full, 64u << 20);
    enum { MAXM = 2 * PM_REQS };
    kvp_meta_req reqs[MAXM];
    kvp_meta_base bases[MAXM];
    uint32_t gb[MAXM][PM_MAXG];
    kvp_meta_ids gd[MAXM][PM_MAXG];
    kvp_meta_load_spec ls[MAXM];
    kvp_meta_tail tl[MAXM][3];
    kvp_meta_str unfin[PM_REQS], pre[PM_REQS], drops[PM_REQS];
    size_t delta_bytes = 0, full_bytes = 0;
    int failures = 0;
    for (uint64_t seed = 1; seed <= 4; seed++) {
        pm_rng = 0x9E3779B97F4A7C15ull * seed;
        for (int i = 0; i < PM_REQS; i++)
            snprintf(q[i].id, sizeof q[i].id, "s%llu-r%d", (unsigned long long)seed, i);
        for (int step = 0; step < 250; step++) {
            bool last = step == 249;
            uint32_t nm = 0, np = 0, nd = 0, nu = 0;
            for (int i = 0; i < PM_REQS; i++) {
                pm_req *x = &q[i];
                uint32_t act = last ? 0 : pm_rand(20);
                if (last || (x->live && act == 0)) { /* finished */
                    if (x->sent)
                        drops[nd++] = (kvp_meta_str){x->id, (uint32_t)strlen(x->id)};
                    x->sent = false;
                    x->live = x->preempted = false;
                    continue;
                }
                if (!x->live) {
                    if (act < 6) { /* a new request */
                        pm_fill(x);
                        x->live = true;
                        pm_meta(x, &reqs[nm], &bases[nm], gb[nm], gd[nm], &ls[nm], tl[nm]);
                        nm++;
                    }
                    continue;
                }
                if (x->preempted) {
                    if (act < 8) { /* resumed: the table is REPLACED */
                        pm_fill(x);
                        x->preempted = false;
                        pm_meta(x, &reqs[nm], &bases[nm], gb[nm], gd[nm], &ls[nm], tl[nm]);
                        nm++;
                    }
                    continue;
                }
                if (act == 1) { /* preempted: dropped from the mirrors */
                    pre[np++] = (kvp_meta_str){x->id, (uint32_t)strlen(x->id)};
                    if (x->sent)
                        drops[nd++] = (kvp_meta_str){x->id, (uint32_t)strlen(x->id)};
                    x->sent = false;
                    x->preempted = true;
                    continue;
                }
                pm_append(x); /* running: always grows, with or without a meta */
                if (act < 12) {
                    pm_meta(x, &reqs[nm], &bases[nm], gb[nm], gd[nm], &ls[nm], tl[nm]);
                    nm++;
                    if (act == 2) { /* the same request again in this step */
                        pm_append(x);
                        pm_meta(x, &reqs[nm], &bases[nm], gb[nm], gd[nm], &ls[nm], tl[nm]);
                        nm++;
                    }
                }
            }
            for (int i = 0; i < PM_REQS; i++)
                if (q[i].live)
                    unfin[nu++] = (kvp_meta_str){q[i].id, (uint32_t)strlen(q[i].id)};
            kvp_meta_step s = {.reqs = reqs, .nreqs = nm, .unfinished = unfin,
                               .nunfinished = nu, .preempted = pre, .npreempted = np};
            kvp_buf_reset(&b);
            kvp_buf_reset(&full);
            CHECK_EQ(kvp_meta_encode_delta(&b, &s, bases, drops, nd), 0);
            CHECK_EQ(kvp_meta_encode(&full, &s), 0);
            delta_bytes += b.len;
            full_bytes += full.len;
            kvp_arena_reset(&a);
            kvp_meta_step d;
            int rc = kvp_meta_decode_delta(mir, b.data, b.len, &a, &d);
            if (rc != 0 || !kvp_meta_step_equal(&s, &d)) {
                if (failures++ < 3)
                    fprintf(stderr, "seed %llu step %d: rc %d, not equal\n",
                            (unsigned long long)seed, step, rc);
            }
        }
        CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    }
    CHECK_EQ(failures, 0);
    CHECK(delta_bytes * 3 < full_bytes); /* deltas are much smaller */
    kvp_buf_free(&b);
    kvp_buf_free(&full);
    kvp_arena_free(&a);
    kvp_meta_mirror_free(mir);
    kvp_free(q);
}

/* Two messages for one request: a full send, then a delta. */
static void two_msgs(kvp_buf *m1, kvp_buf *m2, uint32_t *ids, uint32_t *toks)
{
    kvp_meta_step s;
    ms_sample(1, &s); /* "cmpl-0001-new": 2 groups (3, 2 ids), 8 hashes, 5 tokens */
    kvp_meta_req r = s.reqs[0];
    kvp_meta_ids g[2] = {{ids, 3, 0}, {ids + 8, 2, 0}};
    for (uint32_t i = 0; i < 16; i++)
        ids[i] = 100 + i;
    for (uint32_t i = 0; i < 8; i++)
        toks[i] = 7 * i;
    r.block_ids = g;
    r.token_ids = toks;
    r.nhashes = 6;
    s.reqs = &r;
    kvp_buf_init(m1, 1u << 20);
    kvp_buf_init(m2, 1u << 20);
    kvp_meta_encode_delta(m1, &s, NULL, NULL, 0);
    uint32_t gb[2] = {3, 2};
    kvp_meta_base base = {gb, 6, 5};
    g[0].n = 5;
    r.nhashes = 8;
    r.n_token_ids = 8;
    kvp_meta_encode_delta(m2, &s, &base, NULL, 0);
}

/* A base that differs from what the mirror holds (a missed step) fails the
 * step with KVP_EPROTOCOL and empties the mirror; nothing crashes. */
TEST(meta_delta_out_of_step_fails_and_empties)
{
    uint32_t ids[16], toks[8];
    kvp_buf m1, m2;
    two_msgs(&m1, &m2, ids, toks);
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_meta_step d;
    kvp_meta_mirror *mir = kvp_meta_mirror_new();
    CHECK(mir);
    /* in order: the delta rebuilds the full arrays */
    CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
    CHECK_EQ(kvp_meta_mirror_count(mir), 1);
    CHECK_EQ(d.reqs[0].block_ids[0].n, 3);
    CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d), 0);
    CHECK_EQ(d.reqs[0].block_ids[0].n, 5);
    CHECK_EQ(d.reqs[0].block_ids[0].ids[4], 104);
    CHECK_EQ(d.reqs[0].block_ids[1].n, 2);
    CHECK_EQ(d.reqs[0].nhashes, 8);
    CHECK(memcmp(d.reqs[0].block_hashes, ms_hash32, 8 * 32) == 0);
    CHECK_EQ(d.reqs[0].n_token_ids, 8);
    CHECK_EQ(d.reqs[0].token_ids[7], 49);
    /* the same delta again: the mirror holds 5 ids, the base says 3 */
    CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d), KVP_EPROTOCOL);
    CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    /* a delta without the full send before it (a fresh / emptied mirror) */
    CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d), KVP_EPROTOCOL);
    CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    /* the stateless decoder has no mirror for a base */
    CHECK_EQ(kvp_meta_decode(m2.data, m2.len, &a, &d), KVP_EPROTOCOL);
    CHECK_EQ(kvp_meta_decode(m1.data, m1.len, &a, &d), 0);
    /* a full resend resynchronises */
    CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
    CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d), 0);
    CHECK_EQ(d.reqs[0].block_ids[0].n, 5);
    /* every truncation of the delta fails cleanly */
    for (size_t n = 0; n < m2.len; n++) {
        CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
        CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, n, &a, &d), KVP_EPROTOCOL);
        CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    }
    /* a hash base with another hash_len than the mirror's (32) */
    CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
    kvp_meta_step s3;
    ms_sample(1, &s3);
    s3.reqs[0].hash_len = 16;
    kvp_meta_base b3 = {NULL, 6, 0};
    kvp_buf m3;
    kvp_buf_init(&m3, 1u << 20);
    CHECK_EQ(kvp_meta_encode_delta(&m3, &s3, &b3, NULL, 0), 0);
    CHECK_EQ(kvp_meta_decode_delta(mir, m3.data, m3.len, &a, &d), KVP_EPROTOCOL);
    CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    b3.hashes = 0; /* a full hash send with the new length is fine */
    kvp_buf_reset(&m3);
    CHECK_EQ(kvp_meta_encode_delta(&m3, &s3, &b3, NULL, 0), 0);
    CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
    CHECK_EQ(kvp_meta_decode_delta(mir, m3.data, m3.len, &a, &d), 0);
    CHECK(kvp_meta_step_equal(&s3, &d));
    kvp_buf_free(&m3);
    kvp_arena_free(&a);
    kvp_meta_mirror_free(mir);
    kvp_buf_free(&m1);
    kvp_buf_free(&m2);
}

/* The drop list empties mirror entries; the stateless decoder refuses it;
 * a request named twice in one step keeps both views intact (the second
 * replaces the arrays the first views). */
TEST(meta_delta_drops_and_repeats)
{
    uint32_t a1[4] = {1, 2, 3, 4}, a2[2] = {9, 8};
    kvp_meta_ids g1 = {a1, 4, 0}, g2 = {a2, 2, 0};
    kvp_meta_req r[2];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 2; i++) {
        r[i].req_id = (kvp_meta_str){"x", 1};
        r[i].ngroups = 1;
        r[i].can_save = r[i].is_last_chunk = KVP_META_UNSET;
        r[i].token_ids = a1;
        r[i].n_token_ids = 4;
    }
    r[0].block_ids = &g1;
    r[1].block_ids = &g2;     /* replaced table: base 0 */
    r[1].token_ids = a1;      /* tokens: appended to what r[0] sent */
    r[1].n_token_ids = 4;
    uint32_t gbase0 = 0;
    kvp_meta_base bases[2] = {{NULL, 0, 0}, {&gbase0, 0, 2}};
    r[0].n_token_ids = 2;
    kvp_meta_step s = {.reqs = r, .nreqs = 2};
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    CHECK_EQ(kvp_meta_encode_delta(&b, &s, bases, NULL, 0), 0);
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_meta_step d;
    kvp_meta_mirror *mir = kvp_meta_mirror_new();
    CHECK(mir);
    CHECK_EQ(kvp_meta_decode_delta(mir, b.data, b.len, &a, &d), 0);
    CHECK(kvp_meta_step_equal(&s, &d));
    CHECK_EQ(d.reqs[0].block_ids[0].n, 4);
    CHECK_EQ(d.reqs[0].block_ids[0].ids[3], 4); /* not overwritten by the second */
    CHECK_EQ(d.reqs[1].block_ids[0].ids[0], 9);
    CHECK_EQ(d.reqs[0].n_token_ids, 2);
    CHECK_EQ(d.reqs[1].n_token_ids, 4);
    CHECK_EQ(kvp_meta_mirror_count(mir), 1);
    /* a base over the array is refused by the encoder */
    bases[1].tokens = 5;
    kvp_buf_reset(&b);
    CHECK_EQ(kvp_meta_encode_delta(&b, &s, bases, NULL, 0), KVP_EINVALID_PARAMS);
    /* drop "x" (and an unknown id): the mirror is empty */
    kvp_meta_str drops[2] = {{"x", 1}, {"never-sent", 10}};
    kvp_meta_step empty = {0};
    kvp_buf_reset(&b);
    CHECK_EQ(kvp_meta_encode_delta(&b, &empty, NULL, drops, 2), 0);
    CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), KVP_EPROTOCOL);
    CHECK_EQ(kvp_meta_decode_delta(mir, b.data, b.len, &a, &d), 0);
    CHECK_EQ(d.nreqs, 0);
    CHECK_EQ(kvp_meta_mirror_count(mir), 0);
    /* an empty id in the drop list is malformed */
    drops[0].len = 0;
    kvp_buf_reset(&b);
    CHECK_EQ(kvp_meta_encode_delta(&b, &empty, NULL, drops, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_meta_decode_delta(NULL, b.data, b.len, &a, &d), KVP_EINVALID_PARAMS);
    kvp_arena_free(&a);
    kvp_meta_mirror_free(mir);
    kvp_buf_free(&b);
}

/* Out of memory anywhere in a delta decode: KVP_ENOMEM, the mirror emptied
 * (never half-assembled), and the full resend that follows decodes. */
TEST(meta_delta_oom_empties_mirror)
{
    uint32_t ids[16], toks[8];
    kvp_buf m1, m2;
    two_msgs(&m1, &m2, ids, toks);
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_meta_step d, want;
    kvp_arena a0;
    kvp_arena_init(&a0, ARENA_CAP);
    kvp_meta_mirror *mir0 = kvp_meta_mirror_new(), *mir = kvp_meta_mirror_new();
    CHECK(mir0 && mir);
    CHECK_EQ(kvp_meta_decode_delta(mir0, m1.data, m1.len, &a0, &d), 0);
    CHECK_EQ(kvp_meta_decode_delta(mir0, m2.data, m2.len, &a0, &want), 0);
    int failed = 0;
    for (uint64_t n = 1; n < 40; n++) {
        kvp_meta_mirror_free(mir);
        mir = kvp_meta_mirror_new();
        CHECK(mir);
        kvp_arena_reset(&a);
        kvp_mem_fail_nth(n, 0);
        int r1 = kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d);
        int r2 = r1 == 0 ? kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d) : r1;
        kvp_mem_fail_nth(0, 0);
        CHECK(r2 == 0 || r2 == KVP_ENOMEM);
        if (r2 != 0) {
            failed++;
            CHECK_EQ(kvp_meta_mirror_count(mir), 0);
            /* a full resend, then the delta: fine again */
            CHECK_EQ(kvp_meta_decode_delta(mir, m1.data, m1.len, &a, &d), 0);
            CHECK_EQ(kvp_meta_decode_delta(mir, m2.data, m2.len, &a, &d), 0);
        }
        CHECK(kvp_meta_step_equal(&want, &d));
    }
    CHECK(failed > 0);
    kvp_arena_free(&a);
    kvp_arena_free(&a0);
    kvp_meta_mirror_free(mir);
    kvp_meta_mirror_free(mir0);
    kvp_buf_free(&m1);
    kvp_buf_free(&m2);
}

/* Request ids are C strings for the engine and the workers: an id holding
 * a NUL byte is refused by the encoder and by the decoder (two ids that
 * differ after a NUL would collide in the workers' finished sets). */
TEST(meta_ids_with_nul_refused)
{
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    CHECK_EQ(kvp_meta_step_add_preempted(&s, "a\0b", 3), 0);
    kvp_buf b;
    kvp_buf_init(&b, 256);
    CHECK_EQ(kvp_meta_encode(&b, &s), KVP_EINVALID_PARAMS);
    kvp_meta_step_free(&s);
    kvp_buf_free(&b);

    /* a valid message whose one preempted id is then given a NUL byte */
    kvp_meta_step_init(&s);
    CHECK_EQ(kvp_meta_step_add_preempted(&s, "aXb", 3), 0);
    kvp_buf_init(&b, 256);
    CHECK_EQ(kvp_meta_encode(&b, &s), 0);
    uint8_t *p = memchr(b.data, 'X', b.len);
    CHECK(p != NULL);
    kvp_arena a;
    kvp_arena_init(&a, 1 << 16);
    kvp_meta_step d;
    CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), 0);
    *p = 0;
    kvp_arena_reset(&a);
    CHECK_EQ(kvp_meta_decode(b.data, b.len, &a, &d), KVP_EPROTOCOL);
    kvp_arena_free(&a);
    kvp_meta_step_free(&s);
    kvp_buf_free(&b);

    kvp_meta_tracker t;
    CHECK_EQ(kvp_meta_tracker_init(&t, "r\0s", 3, 1), KVP_EINVALID_PARAMS);
}
