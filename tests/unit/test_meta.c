/* test_meta.c -- connector request structures (spec §6.1-§6.4) and the
 * step metadata encoding: round trips, truncation, trailing bytes, hostile
 * counts, canonicity, version mismatch, allocation limits. */
#include <stdint.h>
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
            CHECK(memcmp(d.preempted[1].p, "\xff\x00z", 3) == 0);
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
    b.data[4] = 2;
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
        /* the request count itself */
        memcpy(m, b.data, b.len);
        patch32(m + 5, 0xFFFFFFFFu);
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
 * Offsets in sample 3 (one request "L"): header 0..8 (magic, version,
 * nreqs); req: id len 9..12, 'L' 13, kind 14, flags 15, token_len_chunk
 * 16..23, ngroups 24..27, group0 n 28..31, id 32..35, hash_len 36,
 * nhashes 37..40, hashes 41..104, load spec 105..129 (can_load at 129),
 * num_prompt 130..137, nunfinished 138..141, npreempted 142..145, ...
 */
TEST(meta_non_canonical_rejected)
{
    kvp_buf b;
    CHECK_EQ(enc_sample(3, &b), 0);
    uint8_t *m = kvp_malloc(b.len + 64);
    CHECK(m);
    CHECK_EQ(b.data[13], 'L');
    CHECK_EQ(b.data[36], 16);
    CHECK_EQ(b.data[129], 1);
#define MUT(stmt, want)                                                        \
    do {                                                                       \
        memcpy(m, b.data, b.len);                                              \
        stmt;                                                                  \
        CHECK_EQ(dec(m, b.len), want);                                         \
    } while (0)
    MUT((void)0, 0);
    MUT(m[14] = KVP_META_KIND_COUNT, KVP_EPROTOCOL);  /* unknown kind */
    MUT(m[15] = (uint8_t)(m[15] & ~1u) | 2u, KVP_EPROTOCOL); /* value bit w/o has bit */
    MUT(m[15] |= 2u, KVP_EPROTOCOL);                  /* save together with load */
    MUT(m[36] = 0, KVP_EPROTOCOL);                    /* hashes with hash_len 0 */
    MUT(m[36] = 65, KVP_EPROTOCOL);                   /* hash_len over the limit */
    MUT(m[129] = 2, KVP_EPROTOCOL);                   /* can_load not 0/1 */
    MUT(m[129] = 0, 0);                               /* can_load false is a value */
    MUT(patch32(m + 9, 0), KVP_EPROTOCOL);            /* empty request id */
    MUT(patch32(m + 24, KVP_META_MAX_GROUPS + 1), KVP_EPROTOCOL);
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
    /* set the TOKENS flag and splice in a zero count before num_prompt */
    kvp_buf f;
    kvp_buf_init(&f, 1u << 20);
    size_t fl = 9 + 4 + 13 + 1;
    CHECK_EQ(e.data[fl] & 0x20, 0);
    kvp_buf_put(&f, e.data, e.len - 8 - 8);
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
