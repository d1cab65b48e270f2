/* test_repl.c -- the leader -> standby index stream's records (ha/repl.c)
 * and a standby's parked index (kvp_master_repl_apply). */
#include <string.h>

#include "common/config.h"
#include "ha/repl.h"
#include "harness.h"
#include "kvpool.h"
#include "master/master.h"

#define B(s) ((kvp_bytes){(const uint8_t *)(s), (uint32_t)strlen(s)})

static kvp_repl_rec pub(const char *tenant, const char *key, uint64_t size, uint64_t seg)
{
    kvp_repl_rec r = {.type = KVP_REPL_PUB, .tenant = B(tenant), .key = B(key), .size = size,
                      .checksum = size * 7, .nrep = 1};
    r.rep[0] = (kvp_repl_rep){seg, 3, 9};
    return r;
}

/* The body of the first frame in b (after its header). */
static const uint8_t *body_of(const kvp_buf *b, size_t *len)
{
    kvp_frame_hdr h;
    const uint8_t *body;
    if (kvp_frame_next(b->data, b->len, 1u << 30, &h, &body) != 1 || h.op != KVP_OP_REPL_DATA)
        return NULL;
    *len = h.body_len;
    return body;
}

TEST(repl_records_roundtrip)
{
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    kvp_repl_wr w = {.out = &b};
    kvp_repl_rec r = {.type = KVP_REPL_RESET};
    kvp_repl_wr_add(&w, &r, 5);
    r = pub("", "k1", 4096, 0xabc);
    r.nrep = 3;
    r.flags = KVP_REPL_F_PINNED | KVP_REPL_F_BLOCK;
    r.blk_hash = UINT64_MAX - 5;
    r.group = 31;
    r.parts = 8;
    r.block_size = 528;
    r.rep[1] = (kvp_repl_rep){0xdef, 100, 1};
    r.rep[2] = (kvp_repl_rep){0x123, 0, UINT32_MAX};
    kvp_repl_wr_add(&w, &r, 6);
    r = (kvp_repl_rec){.type = KVP_REPL_DEL, .tenant = B("t"), .key = B("gone")};
    kvp_repl_wr_add(&w, &r, 7);
    kvp_repl_wr_close(&w);
    CHECK_EQ(b.err, 0);
    size_t len = 0;
    const uint8_t *body = body_of(&b, &len);
    CHECK(body != NULL);
    CHECK_EQ(kvp_repl_check(body, len), 0);
    kvp_repl_rd it;
    uint64_t seq;
    CHECK_EQ(kvp_repl_open(&it, body, len, &seq), 0);
    CHECK_EQ(seq, 7);
    CHECK_EQ(kvp_repl_next(&it, &r), 1);
    CHECK_EQ(r.type, KVP_REPL_RESET);
    CHECK_EQ(kvp_repl_next(&it, &r), 1);
    CHECK(r.type == KVP_REPL_PUB && r.key.len == 2 && memcmp(r.key.p, "k1", 2) == 0);
    CHECK(r.size == 4096 && r.checksum == 4096 * 7 &&
          r.flags == (KVP_REPL_F_PINNED | KVP_REPL_F_BLOCK));
    CHECK(r.blk_hash == UINT64_MAX - 5 && r.group == 31 && r.parts == 8 && r.block_size == 528);
    CHECK(r.nrep == 3 && r.rep[1].seg_id == 0xdef && r.rep[1].page == 100);
    CHECK_EQ(r.rep[2].gen, UINT32_MAX);
    CHECK_EQ(kvp_repl_next(&it, &r), 1);
    CHECK(r.type == KVP_REPL_DEL && r.tenant.len == 1 && r.key.len == 4);
    CHECK_EQ(kvp_repl_next(&it, &r), 0);
    kvp_buf_free(&b);
}

/* A frame is closed past KVP_REPL_FRAME bytes: large snapshots go as many
 * frames, each with the seq of its last record. */
TEST(repl_writer_cuts_frames)
{
    kvp_buf b;
    kvp_buf_init(&b, 64u << 20);
    kvp_repl_wr w = {.out = &b};
    char key[600];
    memset(key, 'k', sizeof key - 1);
    key[sizeof key - 1] = '\0';
    for (int i = 0; i < 2000; i++) {
        kvp_repl_rec r = pub("", key, 1 + (uint64_t)i, 1);
        kvp_repl_wr_add(&w, &r, 10 + (uint64_t)i);
    }
    kvp_repl_wr_close(&w);
    size_t off = 0;
    int frames = 0;
    uint64_t last = 0, records = 0;
    while (off < b.len) {
        kvp_frame_hdr h;
        const uint8_t *body;
        CHECK(kvp_frame_next(b.data + off, b.len - off, 1u << 30, &h, &body) == 1);
        CHECK(h.body_len <= KVP_REPL_FRAME + 1024);
        kvp_repl_rd it;
        CHECK_EQ(kvp_repl_open(&it, body, h.body_len, &last), 0);
        records += it.left;
        frames++;
        off += KVP_FRAME_HDR + h.body_len;
    }
    CHECK(frames > 1);
    CHECK_EQ(records, 2000);
    CHECK_EQ(last, 2009);
    kvp_buf_free(&b);
}

/* What a leader could send wrong: each is refused whole. */
TEST(repl_malformed_refused)
{
    static const struct {
        const char *why;
        kvp_repl_rec r;
    } bad[] = {
        {"no replica", {.type = KVP_REPL_PUB, .key = {(const uint8_t *)"k", 1}, .size = 1}},
        {"size 0",
         {.type = KVP_REPL_PUB, .key = {(const uint8_t *)"k", 1}, .nrep = 1, .rep = {{1, 0, 0}}}},
        {"segment id 0",
         {.type = KVP_REPL_PUB, .key = {(const uint8_t *)"k", 1}, .size = 1, .nrep = 1}},
        {"unknown flag",
         {.type = KVP_REPL_PUB, .key = {(const uint8_t *)"k", 1}, .size = 1, .flags = 0x80,
          .nrep = 1, .rep = {{1, 0, 0}}}},
        {"empty key", {.type = KVP_REPL_DEL}},
        {"NUL in the tenant",
         {.type = KVP_REPL_DEL, .tenant = {(const uint8_t *)"a\0b", 3},
          .key = {(const uint8_t *)"k", 1}}},
        {"unknown type", {.type = 9}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_buf b;
        kvp_buf_init(&b, 1u << 20);
        kvp_repl_wr w = {.out = &b};
        kvp_repl_rec ok = pub("", "fine", 10, 2);
        kvp_repl_wr_add(&w, &ok, 1);
        kvp_repl_wr_add(&w, &bad[i].r, 2);
        kvp_repl_wr_close(&w);
        size_t len = 0;
        const uint8_t *body = body_of(&b, &len);
        CHECK(body != NULL);
        if (kvp_repl_check(body, len) != KVP_EPROTOCOL)
            th_fail(__FILE__, __LINE__, "accepted: %s", bad[i].why);
        kvp_buf_free(&b);
    }
    /* truncated, and trailing bytes */
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    kvp_repl_wr w = {.out = &b};
    kvp_repl_rec ok = pub("", "fine", 10, 2);
    kvp_repl_wr_add(&w, &ok, 1);
    kvp_repl_wr_close(&w);
    size_t len = 0;
    const uint8_t *body = body_of(&b, &len);
    CHECK(body != NULL);
    for (size_t n = 0; n < len; n++)
        CHECK_EQ(kvp_repl_check(body, n), KVP_EPROTOCOL);
    uint8_t longer[256];
    CHECK(len + 1 <= sizeof longer);
    memcpy(longer, body, len);
    longer[len] = 0;
    CHECK_EQ(kvp_repl_check(longer, len + 1), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}

static uint64_t parked(kvp_master *m)
{
    uint64_t st[KVP_STAT__COUNT];
    kvp_master_stats(m, st);
    return st[KVP_STAT_PARKED];
}

/* A standby's picture: PUB upserts, DEL removes, RESET starts over, a bad
 * frame changes nothing; after a takeover what no segment claims goes at
 * client_ttl. */
TEST(repl_standby_parks_and_drops)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    kvp_master *m;
    CHECK(kvp_master_create(&cfg, 1000, &m) == 0);
    kvp_buf b;
    kvp_buf_init(&b, 1u << 20);
    kvp_repl_wr w = {.out = &b};
    const char *keys[] = {"a", "b", "c", "a"};
    for (int i = 0; i < 4; i++) {
        kvp_repl_rec r = pub(i == 2 ? "tenant-x" : "", keys[i], 100 + (uint64_t)i, 0x77);
        kvp_repl_wr_add(&w, &r, (uint64_t)i + 1);
    }
    kvp_repl_rec d = {.type = KVP_REPL_DEL, .key = B("b")};
    kvp_repl_wr_add(&w, &d, 5);
    kvp_repl_wr_close(&w);
    size_t len = 0;
    const uint8_t *body = body_of(&b, &len);
    CHECK(body != NULL);
    uint64_t seq = 0;
    CHECK_EQ(kvp_master_repl_apply(m, body, len, &seq), 0);
    CHECK_EQ(seq, 5);
    CHECK_EQ(parked(m), 2); /* a (replaced once) and c */
    CHECK_EQ(kvp_master_repl_apply(m, body, len, &seq), 0);
    CHECK_EQ(parked(m), 2); /* idempotent */
    CHECK_EQ(kvp_master_repl_apply(m, body, len - 1, &seq), KVP_EPROTOCOL);
    CHECK_EQ(parked(m), 2);
    CHECK_EQ(kvp_master_check(m), 0);
    kvp_master_takeover(m, 2000);
    kvp_master_tick(m, 2000 + cfg.client_ttl_ms - 1);
    CHECK_EQ(parked(m), 2);
    kvp_master_tick(m, 2000 + cfg.client_ttl_ms);
    CHECK_EQ(parked(m), 0);
    uint64_t st[KVP_STAT__COUNT];
    kvp_master_stats(m, st);
    CHECK_EQ(st[KVP_STAT_ADOPT_DROPPED], 2);
    CHECK_EQ(kvp_master_check(m), 0);
    /* a RESET empties what was parked */
    CHECK_EQ(kvp_master_repl_apply(m, body, len, &seq), 0);
    CHECK_EQ(parked(m), 2);
    kvp_buf_reset(&b);
    w = (kvp_repl_wr){.out = &b};
    kvp_repl_rec reset = {.type = KVP_REPL_RESET};
    kvp_repl_wr_add(&w, &reset, 9);
    kvp_repl_wr_close(&w);
    body = body_of(&b, &len);
    CHECK(body != NULL);
    CHECK_EQ(kvp_master_repl_apply(m, body, len, &seq), 0);
    CHECK_EQ(parked(m), 0);
    kvp_buf_free(&b);
    kvp_master_destroy(m);
}
