/* test_proto.c -- frames, opcode table and every message codec of proto.h. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "harness.h"
#include "kvpool.h"
#include "proto/proto.h"
#include "proto_samples.h"

#define ARENA_CAP (16u << 20)

static kvp_proto_limits lim(void)
{
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    return l;
}

/* Encodes sample (kind, v) into *b; 0 or the buffer error. */
static int enc_sample(int kind, int v, kvp_buf *b)
{
    pc_msg m;
    kvp_buf_init(b, 1u << 24);
    if (pc_sample(kind, v, &m))
        return -1;
    pc_codecs[kind].enc(b, &m);
    return b->err;
}

/* Decodes len bytes of p from an exact-size heap copy (so ASan sees any
 * over-read) with an arena of `cap` bytes; returns the decoder's code. */
static int dec_copy(int kind, const uint8_t *p, size_t len, const kvp_proto_limits *l, size_t cap)
{
    uint8_t *c = malloc(len ? len : 1);
    if (len)
        memcpy(c, p, len);
    kvp_arena a;
    kvp_arena_init(&a, cap);
    pc_msg m;
    int rc = pc_codecs[kind].dec(c, (uint32_t)len, l, &a, &m);
    kvp_arena_free(&a);
    free(c);
    return rc;
}

/* UCX_ATTACH answers: blobs bounded, never empty; size 0 and a range past
 * the address space refused. */
TEST(ucx_attach_bounds)
{
    static uint8_t big[KVP_UCX_BLOB_MAX + 1];
    kvp_msg_ucx_attach ok = {1 << 20, 4096, {big, KVP_UCX_BLOB_MAX}, {big, 1}};
    kvp_msg_ucx_attach bad[] = {
        {1 << 20, 4096, {big, KVP_UCX_BLOB_MAX + 1}, {big, 1}},
        {1 << 20, 4096, {big, 1}, {big, KVP_UCX_BLOB_MAX + 1}},
        {1 << 20, 4096, {big, 0}, {big, 1}},
        {1 << 20, 4096, {big, 1}, {big, 0}},
        {1 << 20, 0, {big, 1}, {big, 1}},
        {UINT64_MAX - 10, 4096, {big, 1}, {big, 1}},
    };
    kvp_proto_limits l = lim();
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_enc_ucx_attach(&b, &ok);
    CHECK_EQ(dec_copy(PC_ucx_attach, b.data, b.len, &l, 0), 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_buf_reset(&b);
        kvp_enc_ucx_attach(&b, &bad[i]);
        if (dec_copy(PC_ucx_attach, b.data, b.len, &l, 0) != KVP_EPROTOCOL)
            th_fail(__FILE__, __LINE__, "bad UCX_ATTACH answer %zu accepted", i);
    }
    kvp_buf_free(&b);
}

/* ------------------------------------------------------------ opcodes */

TEST(op_names)
{
    CHECK(strcmp(kvp_op_name(KVP_OP_HELLO), "HELLO") == 0);
    CHECK(strcmp(kvp_op_name(KVP_OP_PUT_START), "PUT_START") == 0);
    CHECK(strcmp(kvp_op_name(KVP_OP_SEGMENT_INFO), "SEGMENT_INFO") == 0);
    for (int op = 1; op < KVP_OP__MAX; op++)
        CHECK(kvp_op_name((uint16_t)op) != NULL);
    CHECK(kvp_op_name(0) == NULL);
    CHECK(kvp_op_name(KVP_OP__MAX) == NULL);
    CHECK(kvp_op_name(0xFFFF) == NULL);
}

TEST(limits_default)
{
    kvp_proto_limits l = lim();
    CHECK_EQ(l.max_key, 4096);
    CHECK_EQ(l.max_str, 1024);
    CHECK_EQ(l.max_batch, 1u << 20);
}

/* ------------------------------------------------------------- frames */

TEST(frame_hdr_layout)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, KVP_FLAG_RESPONSE, 0x0102, 0x1122334455667788ull,
                       0xAABBCCDD, -2};
    static const uint8_t want[KVP_FRAME_HDR] = {
        0x56, 0x4B, KVP_PROTO_VERSION, 0x01, 0x02, 0x01, 0x00, 0x00, 0x88, 0x77, 0x66, 0x55,
        0x44, 0x33, 0x22, 0x11, 0xDD, 0xCC, 0xBB, 0xAA, 0xFE, 0xFF, 0xFF, 0xFF};
    uint8_t raw[KVP_FRAME_HDR];
    kvp_frame_hdr_encode(raw, &h);
    CHECK(memcmp(raw, want, sizeof raw) == 0);
    kvp_frame_hdr d;
    CHECK_EQ(kvp_frame_hdr_decode(raw, UINT32_MAX, &d), 0);
    CHECK_EQ(d.version, h.version);
    CHECK_EQ(d.flags, h.flags);
    CHECK_EQ(d.op, h.op);
    CHECK(d.req_id == h.req_id);
    CHECK_EQ(d.body_len, h.body_len);
    CHECK_EQ(d.status, h.status);
}

TEST(frame_hdr_errors)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, KVP_OP_GET, 99, 100, 0}, d;
    uint8_t ok[KVP_FRAME_HDR], raw[KVP_FRAME_HDR];
    kvp_frame_hdr_encode(ok, &h);
    CHECK_EQ(kvp_frame_hdr_decode(ok, 100, &d), 0); /* body_len == max is fine */
    CHECK_EQ(kvp_frame_hdr_decode(ok, 99, &d), KVP_ETOO_LARGE);
    CHECK(d.req_id == 99); /* fields are filled even on error */

    for (int i = 0; i < 2; i++) { /* bad magic, either byte */
        memcpy(raw, ok, sizeof raw);
        raw[i] ^= 0x20;
        CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), KVP_EPROTOCOL);
    }
    static const uint8_t versions[] = {0, KVP_PROTO_VERSION - 1, KVP_PROTO_VERSION + 1, 0xFF};
    for (size_t i = 0; i < sizeof versions; i++) {
        memcpy(raw, ok, sizeof raw);
        raw[2] = versions[i];
        CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), KVP_EINVALID_VERSION);
    }
    for (int i = 6; i < 8; i++) { /* reserved bits */
        for (int bit = 0; bit < 8; bit++) {
            memcpy(raw, ok, sizeof raw);
            raw[i] = (uint8_t)(1u << bit);
            CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), KVP_EPROTOCOL);
        }
    }
    /* a request may not carry a status; a response may */
    h.status = KVP_EOBJECT_NOT_FOUND;
    kvp_frame_hdr_encode(raw, &h);
    CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), KVP_EPROTOCOL);
    h.flags = KVP_FLAG_ONEWAY;
    kvp_frame_hdr_encode(raw, &h);
    CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), KVP_EPROTOCOL);
    h.flags = KVP_FLAG_RESPONSE;
    kvp_frame_hdr_encode(raw, &h);
    CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), 0);
    CHECK_EQ(d.status, KVP_EOBJECT_NOT_FOUND);
    /* an unknown opcode is not the header's business */
    h.op = 0xBEEF;
    kvp_frame_hdr_encode(raw, &h);
    CHECK_EQ(kvp_frame_hdr_decode(raw, 1000, &d), 0);
    /* body_len at the u32 limit */
    h.body_len = UINT32_MAX;
    kvp_frame_hdr_encode(raw, &h);
    CHECK_EQ(kvp_frame_hdr_decode(raw, UINT32_MAX - 1, &d), KVP_ETOO_LARGE);
    CHECK_EQ(kvp_frame_hdr_decode(raw, UINT32_MAX, &d), 0);
    /* magic is checked before version, version before everything else */
    memset(raw, 0xFF, sizeof raw);
    CHECK_EQ(kvp_frame_hdr_decode(raw, 0, &d), KVP_EPROTOCOL);
    raw[0] = 0x56;
    raw[1] = 0x4B;
    CHECK_EQ(kvp_frame_hdr_decode(raw, 0, &d), KVP_EINVALID_VERSION);
}

TEST(frame_begin_end)
{
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_buf_put(&b, "junk", 4); /* frames need not start at offset 0 */
    size_t off = kvp_frame_begin(&b, KVP_OP_PREFIX, KVP_FLAG_RESPONSE, 7, 0);
    CHECK_EQ(off, 4);
    kvp_enc_prefix_resp(&b, &(kvp_msg_prefix_resp){12});
    kvp_frame_end(&b, off);
    size_t off2 = kvp_frame_begin(&b, KVP_OP_HEARTBEAT, 0, 8, 0);
    kvp_frame_end(&b, off2);
    CHECK_EQ(b.err, 0);
    CHECK_EQ(b.len, 4 + KVP_FRAME_HDR + 4 + KVP_FRAME_HDR);

    kvp_frame_hdr h;
    const uint8_t *body = NULL;
    CHECK_EQ(kvp_frame_next(b.data + 4, b.len - 4, 1024, &h, &body), 1);
    CHECK_EQ(h.op, KVP_OP_PREFIX);
    CHECK_EQ(h.flags, KVP_FLAG_RESPONSE);
    CHECK(h.req_id == 7);
    CHECK_EQ(h.body_len, 4);
    CHECK(body == b.data + 4 + KVP_FRAME_HDR);
    kvp_msg_prefix_resp pr;
    CHECK_EQ(kvp_dec_prefix_resp(body, h.body_len, &pr), 0);
    CHECK_EQ(pr.count, 12);
    CHECK_EQ(kvp_frame_next(b.data + off2, b.len - off2, 1024, &h, &body), 1);
    CHECK_EQ(h.op, KVP_OP_HEARTBEAT);
    CHECK_EQ(h.body_len, 0);
    kvp_buf_free(&b);

    /* a buffer too small: the error sticks, end is a no-op */
    kvp_buf_init(&b, 30);
    off = kvp_frame_begin(&b, KVP_OP_PREFIX, 0, 1, 0);
    kvp_enc_ids(&b, &(kvp_msg_ids){1, (uint64_t[]){5}});
    kvp_frame_end(&b, off);
    CHECK_EQ(b.err, KVP_ETOO_LARGE);
    kvp_buf_free(&b);
}

/* The test stream: four frames of different shapes. */
static kvp_buf stream_build(void)
{
    kvp_buf b;
    pc_msg m;
    kvp_buf_init(&b, 1 << 20);
    size_t o = kvp_frame_begin(&b, KVP_OP_HELLO, 0, 1, 0);
    pc_sample(PC_hello, 1, &m);
    kvp_enc_hello(&b, &m.hello);
    kvp_frame_end(&b, o);
    o = kvp_frame_begin(&b, KVP_OP_RELEASE, KVP_FLAG_ONEWAY, 2, 0);
    pc_sample(PC_ids, 1, &m);
    kvp_enc_ids(&b, &m.ids);
    kvp_frame_end(&b, o);
    o = kvp_frame_begin(&b, KVP_OP_HEARTBEAT, 0, 3, 0);
    kvp_frame_end(&b, o);
    o = kvp_frame_begin(&b, KVP_OP_GET, KVP_FLAG_RESPONSE, 4, KVP_EOBJECT_NOT_FOUND);
    kvp_buf_put(&b, "no such key", 11);
    kvp_frame_end(&b, o);
    return b;
}

/* Parses every whole frame at the front of *acc, checking each against the
 * stream (frame number *seen). Returns 0, or -1 after reporting. */
static int drain(kvp_buf *acc, const kvp_buf *stream, size_t *pos, int *seen)
{
    kvp_frame_hdr h;
    const uint8_t *body;
    int rc;
    while ((rc = kvp_frame_next(acc->data, acc->len, 1 << 20, &h, &body)) == 1) {
        kvp_frame_hdr want;
        REQUIRE(kvp_frame_hdr_decode(stream->data + *pos, 1 << 20, &want) == 0);
        REQUIRE(h.op == want.op && h.req_id == want.req_id && h.flags == want.flags);
        REQUIRE(h.req_id == (uint64_t)*seen + 1 && h.status == want.status);
        REQUIRE(h.body_len == want.body_len);
        REQUIRE(memcmp(body, stream->data + *pos + KVP_FRAME_HDR, h.body_len) == 0);
        *pos += KVP_FRAME_HDR + h.body_len;
        kvp_buf_consume(acc, KVP_FRAME_HDR + h.body_len);
        (*seen)++;
    }
    REQUIRE(rc == 0);
    return 0;
}

TEST(frame_next_split_everywhere)
{
    kvp_buf s = stream_build();
    CHECK_EQ(s.err, 0);
    for (size_t k = 0; k <= s.len; k++) {
        kvp_buf acc;
        kvp_buf_init(&acc, 1 << 20);
        size_t pos = 0;
        int seen = 0;
        kvp_buf_put(&acc, s.data, k);
        CHECK_EQ(drain(&acc, &s, &pos, &seen), 0);
        kvp_buf_put(&acc, s.data + k, s.len - k);
        CHECK_EQ(drain(&acc, &s, &pos, &seen), 0);
        CHECK_EQ(seen, 4);
        CHECK_EQ(acc.len, 0);
        kvp_buf_free(&acc);
    }
    /* one byte at a time */
    kvp_buf acc;
    kvp_buf_init(&acc, 1 << 20);
    size_t pos = 0;
    int seen = 0;
    for (size_t i = 0; i < s.len; i++) {
        kvp_buf_put(&acc, s.data + i, 1);
        CHECK_EQ(drain(&acc, &s, &pos, &seen), 0);
    }
    CHECK_EQ(seen, 4);
    kvp_buf_free(&acc);
    kvp_buf_free(&s);
}

TEST(frame_next_truncated_and_bad)
{
    kvp_buf s = stream_build();
    kvp_frame_hdr h;
    const uint8_t *body = NULL;
    uint32_t first = KVP_FRAME_HDR + (uint32_t)(s.data[16] | s.data[17] << 8);
    /* truncated header, truncated body: need more (checked on exact-size copies) */
    for (size_t k = 0; k < first; k++) {
        uint8_t *c = malloc(k ? k : 1);
        memcpy(c, s.data, k);
        CHECK_EQ(kvp_frame_next(c, k, 1 << 20, &h, &body), 0);
        free(c);
    }
    CHECK_EQ(kvp_frame_next(s.data, first, 1 << 20, &h, &body), 1);
    /* a bad header is reported as soon as the header is complete */
    s.data[6] = 1;
    CHECK_EQ(kvp_frame_next(s.data, KVP_FRAME_HDR - 1, 1 << 20, &h, &body), 0);
    CHECK_EQ(kvp_frame_next(s.data, KVP_FRAME_HDR, 1 << 20, &h, &body), KVP_EPROTOCOL);
    s.data[6] = 0;
    s.data[2] = 9;
    CHECK_EQ(kvp_frame_next(s.data, s.len, 1 << 20, &h, &body), KVP_EINVALID_VERSION);
    s.data[2] = KVP_PROTO_VERSION;
    s.data[0] = 0;
    CHECK_EQ(kvp_frame_next(s.data, s.len, 1 << 20, &h, &body), KVP_EPROTOCOL);
    s.data[0] = 0x56;
    /* oversized body_len: refused before the body arrives */
    CHECK_EQ(kvp_frame_next(s.data, KVP_FRAME_HDR, first - KVP_FRAME_HDR - 1, &h, &body),
             KVP_ETOO_LARGE);
    s.data[20] = 1; /* request with a status */
    CHECK_EQ(kvp_frame_next(s.data, s.len, 1 << 20, &h, &body), KVP_EPROTOCOL);
    kvp_buf_free(&s);
}

/* ------------------------------------------------------------- bodies */

TEST(roundtrip_every_message)
{
    kvp_proto_limits l = lim();
    int n = 0;
    for (int k = 0; k < PC__COUNT; k++) {
        for (int v = 0; v < 3; v++) {
            pc_msg m, d;
            if (pc_sample(k, v, &m))
                continue;
            kvp_buf b, b2;
            CHECK_EQ(enc_sample(k, v, &b), 0);
            kvp_arena a;
            kvp_arena_init(&a, ARENA_CAP);
            int rc = pc_codecs[k].dec(b.data, (uint32_t)b.len, &l, &a, &d);
            if (rc || !pc_equal(k, &m, &d))
                th_fail(__FILE__, __LINE__, "%s sample %d: rc %d", pc_codecs[k].name, v, rc);
            CHECK_EQ(rc, 0);
            CHECK(pc_equal(k, &m, &d));
            /* canonical: re-encoding gives the same bytes */
            kvp_buf_init(&b2, 1u << 24);
            pc_codecs[k].enc(&b2, &d);
            CHECK_EQ(b2.err, 0);
            CHECK_EQ(b2.len, b.len);
            CHECK(memcmp(b.data, b2.data, b.len) == 0);
            kvp_buf_free(&b2);
            kvp_arena_free(&a);
            kvp_buf_free(&b);
            n++;
        }
    }
    CHECK_EQ(n, 76); /* every kind, SEG_FREED, REPLICA_BAD, the SSD tier's, blocks', the
                        heartbeat's report, UCX_ATTACH, EXIST_LEASE, CONFIGS and the
                        HELLO handshake's AUTH_CHALLENGE included */
}

TEST(decoded_bytes_borrow_from_body)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    CHECK_EQ(enc_sample(PC_keys, 2, &b), 0);
    kvp_arena a;
    kvp_arena_init(&a, ARENA_CAP);
    kvp_msg_keys m;
    CHECK_EQ(kvp_dec_keys(b.data, (uint32_t)b.len, &l, &a, &m), 0);
    CHECK(m.tenant.p == b.data + 4);
    CHECK_EQ(m.tenant.len, 1024);
    CHECK(m.keys[0].p == b.data + 4 + 1024 + 4 + 4);
    CHECK_EQ(m.keys[0].len, 4096);
    CHECK(m.keys[1].p == b.data + b.len - 1);
    kvp_arena_free(&a);
    kvp_buf_free(&b);
}

/* Field order and widths, spelled out byte by byte. */
TEST(body_layouts)
{
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_enc_hello(&b, &(kvp_msg_hello){1, 0x0102030405060708ull, PC_B("ab"),
                                       {PC_B(""), PC_B(""), PC_B(""), PC_B("")}});
    static const uint8_t hello[] = {1, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 2, 0, 0, 0, 'a', 'b', 0, 0, 0, 0,
                                    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ(b.len, sizeof hello);
    CHECK(memcmp(b.data, hello, sizeof hello) == 0);

    kvp_buf_reset(&b);
    kvp_put_result pr[2] = {{0, 1, {{1, 2, 3, 4, 6, KVP_ACCESS_WRITE, 5}}},
                            {KVP_EOBJECT_ALREADY_EXISTS, 3, {{0, 0, 0, 0, 0, 0, 0}}}};
    kvp_enc_put_start_resp(&b, &(kvp_msg_put_start_resp){2, pr});
    uint8_t want[128];
    size_t n = 0;
#define U32(v) do { uint32_t x_ = (uint32_t)(v); for (int i_ = 0; i_ < 4; i_++) want[n++] = (uint8_t)(x_ >> 8 * i_); } while (0)
#define U64(v) do { uint64_t x_ = (v); for (int i_ = 0; i_ < 8; i_++) want[n++] = (uint8_t)(x_ >> 8 * i_); } while (0)
    U32(2);
    U32(0); U32(1); U64(1); U64(2); U64(3); U64(4); U64(6); U32(KVP_ACCESS_WRITE); U32(0); U64(5);
    U32(KVP_EOBJECT_ALREADY_EXISTS); /* nothing else after a failed status */
    CHECK_EQ(b.len, n);
    CHECK(memcmp(b.data, want, n) == 0);

    kvp_buf_reset(&b);
    n = 0;
    kvp_get_result gr = {0, 9, 10, 11, 1, {{1, 2, 3, 4, 6, KVP_ACCESS_READ, 5}}};
    kvp_enc_get_resp(&b, &(kvp_msg_get_resp){5, 1, &gr});
    U32(5); U32(1); U32(0); U64(9); U64(10); U64(11); U32(1); U64(1); U64(2); U64(3); U64(4);
    U64(6); U32(KVP_ACCESS_READ); U32(0); U64(5);
    CHECK_EQ(b.len, n);
    CHECK(memcmp(b.data, want, n) == 0);

    kvp_buf_reset(&b);
    n = 0;
    kvp_enc_remove(&b, &(kvp_msg_remove){PC_B("t"), 1, 1, &PC_B("k")});
    U32(1); want[n++] = 't'; want[n++] = 1; U32(1); U32(1); want[n++] = 'k';
    CHECK_EQ(b.len, n);
    CHECK(memcmp(b.data, want, n) == 0);

    kvp_buf_reset(&b);
    n = 0;
    kvp_enc_put_start(&b, &(kvp_msg_put_start){PC_B(""), 2, 1, 5, PC_B("p"), 1, &PC_B("k"), (uint64_t[]){77}, NULL});
    U32(0); U32(2); U32(1); U64(5); U32(1); want[n++] = 'p'; U32(1); U32(1); want[n++] = 'k'; U64(77);
    CHECK_EQ(b.len, n);
    CHECK(memcmp(b.data, want, n) == 0);
#undef U32
#undef U64
    kvp_buf_free(&b);
}

/* EXIST_LEASE's answer: 17 bytes a key, and only consistent entries. */
TEST(exist_lease_resp_layout_and_checks)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_xl_ent e[2] = {{KVP_XL_LEASED, 0x0102, 0x0304}, {KVP_XL_ABSENT, 0, 0}};
    kvp_enc_exist_lease_resp(&b, &(kvp_msg_exist_lease_resp){5000, 2, e});
    static const uint8_t want[] = {0x88, 0x13, 0, 0, 2, 0, 0, 0,
                                   1, 2, 1, 0, 0, 0, 0, 0, 0, 4, 3, 0, 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ(b.len, sizeof want);
    CHECK_EQ(b.len, 8 + 2 * KVP_XL_ENT_SIZE);
    CHECK(memcmp(b.data, want, sizeof want) == 0);
    CHECK_EQ(dec_copy(PC_exist_lease_resp, b.data, b.len, &l, ARENA_CAP), 0);
    /* a state past DISK, a present key of size 0, an absent one with a size
     * or a lease id, a key on disk with a lease id */
    static const kvp_xl_ent bad[] = {{3, 1, 0}, {KVP_XL_LEASED, 0, 1}, {KVP_XL_DISK, 0, 0},
                                     {KVP_XL_ABSENT, 1, 0}, {KVP_XL_ABSENT, 0, 1},
                                     {KVP_XL_DISK, 1, 1}, {0xFF, 0, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp_buf_reset(&b);
        kvp_xl_ent two[2] = {e[0], bad[i]};
        kvp_enc_exist_lease_resp(&b, &(kvp_msg_exist_lease_resp){5000, 2, two});
        CHECK_EQ(dec_copy(PC_exist_lease_resp, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    }
    /* a count the body cannot hold */
    kvp_buf_reset(&b);
    kvp_buf_u32(&b, 5000);
    kvp_buf_u32(&b, 0xFFFFFFFFu);
    kvp_buf_u8(&b, KVP_XL_LEASED);
    CHECK_EQ(dec_copy(PC_exist_lease_resp, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}

TEST(truncated_at_every_offset)
{
    kvp_proto_limits l = lim();
    for (int k = 0; k < PC__COUNT; k++) {
        for (int v = 0; v < 3; v++) {
            kvp_buf b;
            if (enc_sample(k, v, &b)) {
                kvp_buf_free(&b);
                continue;
            }
            for (size_t cut = 0; cut < b.len; cut++) {
                int rc = dec_copy(k, b.data, cut, &l, ARENA_CAP);
                if (rc != KVP_EPROTOCOL)
                    th_fail(__FILE__, __LINE__, "%s sample %d cut at %zu: rc %d",
                            pc_codecs[k].name, v, cut, rc);
                CHECK_EQ(rc, KVP_EPROTOCOL);
            }
            CHECK_EQ(dec_copy(k, b.data, b.len, &l, ARENA_CAP), 0);
            kvp_buf_free(&b);
        }
    }
}

TEST(trailing_bytes)
{
    kvp_proto_limits l = lim();
    for (int k = 0; k < PC__COUNT; k++) {
        for (int v = 0; v < 3; v++) {
            kvp_buf b;
            if (enc_sample(k, v, &b)) {
                kvp_buf_free(&b);
                continue;
            }
            kvp_buf_u8(&b, 0);
            CHECK_EQ(dec_copy(k, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
            kvp_buf_u32(&b, 0);
            CHECK_EQ(dec_copy(k, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
            kvp_buf_free(&b);
        }
    }
}

static void put_u32_at(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A count the body cannot hold is refused before anything is allocated,
 * even when max_batch would allow it. */
TEST(hostile_counts)
{
    static const struct { int kind; size_t off; } at[] = {
        {PC_mount, 0}, {PC_ids, 0}, {PC_results, 0}, {PC_keys, 12}, {PC_put_start, 36},
        {PC_put_start_resp, 0}, {PC_put_end, 5}, {PC_get_resp, 4}, {PC_remove, 13},
        {PC_stats_resp, 0}, {PC_seg_info_resp, 0}, {PC_configs_resp, 0},
    };
    kvp_proto_limits l = lim();
    l.max_batch = UINT32_MAX;
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        kvp_buf b;
        CHECK_EQ(enc_sample(at[i].kind, 1, &b), 0);
        uint32_t n = (uint32_t)(b.data[at[i].off] | b.data[at[i].off + 1] << 8);
        CHECK(n >= 2 && n <= KVP_STAT__COUNT); /* the offset really is the count */
        static const uint32_t bad[] = {UINT32_MAX, 0x80000000u, 1u << 20, 1000};
        for (size_t j = 0; j < sizeof bad / sizeof bad[0] + 1; j++) {
            put_u32_at(b.data + at[i].off, j < 4 ? bad[j] : n + 1);
            kvp_arena a;
            kvp_arena_init(&a, ARENA_CAP);
            pc_msg m;
            int rc = pc_codecs[at[i].kind].dec(b.data, (uint32_t)b.len, &l, &a, &m);
            if (rc != KVP_EPROTOCOL)
                th_fail(__FILE__, __LINE__, "%s count %zu: rc %d", pc_codecs[at[i].kind].name, j, rc);
            CHECK_EQ(rc, KVP_EPROTOCOL);
            if (j < 4)
                CHECK(a.used == 0 && a.big == NULL);
            kvp_arena_free(&a);
        }
        kvp_buf_free(&b);
    }
    /* stats: n_segs after the counters; mount: n_endpoints of the first segment */
    kvp_buf b;
    CHECK_EQ(enc_sample(PC_stats_resp, 1, &b), 0);
    put_u32_at(b.data + 4 + 8 * KVP_STAT__COUNT, UINT32_MAX);
    CHECK_EQ(dec_copy(PC_stats_resp, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    CHECK_EQ(enc_sample(PC_mount, 1, &b), 0);
    put_u32_at(b.data + 4 + 8 + 4 + 11 + 8, 17);
    CHECK_EQ(dec_copy(PC_mount, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
}

/* CONFIGS rows: a fingerprint is empty (a tenant's "other", then with no
 * name) or 12..32 lower-case hex digits; anything else is refused. */
TEST(configs_resp_fingerprints)
{
    kvp_proto_limits l = lim();
    static const struct {
        const char *name, *fp;
        int ok;
    } cases[] = {
        {"m", "0123456789ab", 1},
        {"m", "0123456789abcdef0123456789abcdef", 1},
        {"", "", 1},
        {"m", "0123456789a", 0},
        {"m", "0123456789abcdef0123456789abcdef0", 0},
        {"m", "0123456789ABCDEF", 0},
        {"m", "0123456789abcdeg", 0},
        {"m", "", 0}, /* a name needs a fingerprint */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_config_stat c = {PC_B("t"), {(const uint8_t *)cases[i].name, (uint32_t)strlen(cases[i].name)},
                             {(const uint8_t *)cases[i].fp, (uint32_t)strlen(cases[i].fp)}, 1, 2};
        kvp_buf b;
        kvp_buf_init(&b, 1 << 20);
        kvp_enc_configs_resp(&b, &(kvp_msg_configs_resp){1, &c});
        CHECK_EQ(dec_copy(PC_configs_resp, b.data, b.len, &l, ARENA_CAP),
                 cases[i].ok ? 0 : KVP_EPROTOCOL);
        kvp_buf_free(&b);
    }
}

/* Encodes a keys body with one key of `klen` bytes into b. */
static void keys_body(kvp_buf *b, uint32_t klen)
{
    static uint8_t key[8192];
    kvp_bytes k = {key, klen};
    kvp_buf_init(b, 1 << 20);
    kvp_enc_keys(b, &(kvp_msg_keys){PC_B("t"), 1, &k});
}

TEST(key_limits)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    keys_body(&b, 4096);
    CHECK_EQ(dec_copy(PC_keys, b.data, b.len, &l, ARENA_CAP), 0);
    kvp_buf_free(&b);
    keys_body(&b, 4097);
    CHECK_EQ(dec_copy(PC_keys, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    keys_body(&b, 0);
    CHECK_EQ(dec_copy(PC_keys, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    l.max_key = 8;
    keys_body(&b, 8);
    CHECK_EQ(dec_copy(PC_keys, b.data, b.len, &l, ARENA_CAP), 0);
    kvp_buf_free(&b);
    keys_body(&b, 9);
    CHECK_EQ(dec_copy(PC_keys, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);

    /* an empty key is refused by every decoder that takes keys */
    l = lim();
    kvp_bytes keys[2] = {PC_B("a"), PC_B("")};
    uint64_t u[2] = {1, 2};
    pc_msg m[4];
    m[0].keys = (kvp_msg_keys){PC_B("t"), 2, keys};
    m[1].put_start = (kvp_msg_put_start){PC_B("t"), 1, 0, 0, PC_B(""), 2, keys, u, NULL};
    m[2].put_end = (kvp_msg_put_end){PC_B("t"), 2, keys, u};
    m[3].remove = (kvp_msg_remove){PC_B("t"), 0, 2, keys};
    static const int kinds[4] = {PC_keys, PC_put_start, PC_put_end, PC_remove};
    for (int i = 0; i < 4; i++) {
        kvp_buf_init(&b, 1 << 20);
        pc_codecs[kinds[i]].enc(&b, &m[i]);
        CHECK_EQ(dec_copy(kinds[i], b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        kvp_buf_free(&b);
        /* ... and the same message with a long key instead */
        keys[1] = (kvp_bytes){pc_big(), 4096};
        kvp_buf_init(&b, 1 << 20);
        pc_codecs[kinds[i]].enc(&b, &m[i]);
        CHECK_EQ(dec_copy(kinds[i], b.data, b.len, &l, ARENA_CAP), 0);
        l.max_key = 4095;
        CHECK_EQ(dec_copy(kinds[i], b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        l = lim();
        kvp_buf_free(&b);
        keys[1] = PC_B("");
    }
}

/* Strings over max_str, too many endpoints / counters, batches over max_batch. */
TEST(other_limits)
{
    kvp_proto_limits l = lim();
    for (int k = 0; k < PC__COUNT; k++) {
        kvp_buf b;
        if (enc_sample(k, 2, &b)) {
            kvp_buf_free(&b);
            continue;
        }
        CHECK_EQ(dec_copy(k, b.data, b.len, &l, ARENA_CAP), 0);
        kvp_proto_limits t = l;
        t.max_str = 1023; /* every v2 sample has a 1024-byte string */
        int rc = dec_copy(k, b.data, b.len, &t, ARENA_CAP);
        /* no strings; UCX_ATTACH's blobs are bounded by KVP_UCX_BLOB_MAX */
        if (k != PC_stats_resp && k != PC_kv_snapshot_resp && k != PC_heartbeat &&
            k != PC_ucx_attach && k != PC_exist_lease_resp)
            CHECK_EQ(rc, KVP_EPROTOCOL);
        kvp_buf_free(&b);
    }
    /* 16 endpoints fine, 17 not */
    kvp_endpoint ep[17];
    for (int i = 0; i < 17; i++)
        ep[i] = (kvp_endpoint){PC_B("tcp"), PC_B("h:1")};
    kvp_seg_desc sd = {1, PC_B("n"), 4096, 17, ep, 0, 1, 0};
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_enc_mount(&b, &(kvp_msg_mount){1, &sd});
    CHECK_EQ(dec_copy(PC_mount, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    kvp_buf_init(&b, 1 << 20);
    kvp_enc_seg_info_resp(&b, &(kvp_msg_seg_info_resp){1, &(kvp_seg_info){0, sd}});
    CHECK_EQ(dec_copy(PC_seg_info_resp, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    /* 1024 counters fine (sample 2), 1025 not */
    static uint64_t ctr[1025];
    kvp_buf_init(&b, 1 << 20);
    kvp_enc_stats_resp(&b, &(kvp_msg_stats_resp){1025, ctr, 0, NULL, 0, NULL});
    CHECK_EQ(dec_copy(PC_stats_resp, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
    kvp_buf_free(&b);
    /* max_batch, every batch kind: the v1 samples have 3 or more elements,
     * except mount and the segments of stats (2) */
    static const int batch[] = {PC_mount, PC_ids, PC_results, PC_keys, PC_put_start,
                                PC_put_start_resp, PC_put_end, PC_get_resp, PC_remove,
                                PC_stats_resp, PC_seg_info_resp};
    for (size_t i = 0; i < sizeof batch / sizeof batch[0]; i++) {
        CHECK_EQ(enc_sample(batch[i], 1, &b), 0);
        l.max_batch = 2;
        int rc = dec_copy(batch[i], b.data, b.len, &l, ARENA_CAP);
        if (batch[i] == PC_mount || batch[i] == PC_stats_resp)
            CHECK_EQ(rc, 0); /* their v1 samples have 2 elements */
        else
            CHECK_EQ(rc, KVP_EPROTOCOL);
        l.max_batch = 1;
        CHECK_EQ(dec_copy(batch[i], b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        kvp_buf_free(&b);
    }
}

TEST(n_replicas_bounds)
{
    kvp_proto_limits l = lim();
    /* n_replicas of the first result of sample 1: after n and status, and
     * for GET also after lease_ttl_ms, size, checksum and lease_id */
    static const struct { int kind; size_t off; } at[2] = {{PC_put_start_resp, 8},
                                                           {PC_get_resp, 4 + 8 + 24}};
    for (int t = 0; t < 2; t++) {
        int kind = at[t].kind;
        size_t off = at[t].off;
        kvp_buf b;
        CHECK_EQ(enc_sample(kind, 1, &b), 0);
        uint32_t was = (uint32_t)b.data[off];
        CHECK(was >= 1 && was <= 3);
        static const uint32_t bad[] = {0, 4, 5, UINT32_MAX};
        for (size_t i = 0; i < 4; i++) {
            put_u32_at(b.data + off, bad[i]);
            CHECK_EQ(dec_copy(kind, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        }
        kvp_buf_free(&b);
    }
    /* the encoders refuse what the decoders would */
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_put_result pr = {0, 4, {{0}}};
    kvp_enc_put_result(&b, &pr);
    CHECK_EQ(b.err, KVP_EINVALID_PARAMS);
    kvp_buf_reset(&b);
    kvp_get_result gr = {0, 1, 2, 3, 0, {{0}}};
    kvp_enc_get_result(&b, &gr);
    CHECK_EQ(b.err, KVP_EINVALID_PARAMS);
    kvp_buf_reset(&b);
    gr.status = KVP_EOBJECT_NOT_FOUND; /* replicas are not sent: any count is fine */
    kvp_enc_get_result(&b, &gr);
    CHECK_EQ(b.err, 0);
    CHECK_EQ(b.len, 4);
    kvp_buf_free(&b);
}

TEST(force_values)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    for (int kind = PC_remove; kind <= PC_remove_all; kind++) {
        CHECK_EQ(enc_sample(kind, 1, &b), 0);
        size_t off = 4 + 8; /* after the tenant "tenant-1" */
        CHECK_EQ(b.data[off], 1);
        b.data[off] = 0;
        CHECK_EQ(dec_copy(kind, b.data, b.len, &l, ARENA_CAP), 0);
        b.data[off] = 2;
        CHECK_EQ(dec_copy(kind, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        b.data[off] = 0xFF;
        CHECK_EQ(dec_copy(kind, b.data, b.len, &l, ARENA_CAP), KVP_EPROTOCOL);
        kvp_buf_free(&b);
    }
    /* encoders send a boolean */
    kvp_buf_init(&b, 64);
    kvp_enc_remove_all(&b, &(kvp_msg_remove_all){PC_B(""), 5});
    CHECK_EQ(b.len, 5);
    CHECK_EQ(b.data[4], 1);
    kvp_buf_free(&b);
}

/* Growing the arena 16 bytes at a time: KVP_ENOMEM until it fits, then 0. */
TEST(arena_too_small)
{
    kvp_proto_limits l = lim();
    for (int k = 0; k < PC__COUNT; k++) {
        for (int v = 0; v < 3; v++) {
            kvp_buf b;
            if (enc_sample(k, v, &b)) {
                kvp_buf_free(&b);
                continue;
            }
            size_t cap = 0;
            int rc;
            while ((rc = dec_copy(k, b.data, b.len, &l, cap)) == KVP_ENOMEM)
                cap += 16;
            CHECK_EQ(rc, 0);
            /* a sample with any array needs some arena */
            int arrays = v > 0 && k != PC_hello && k != PC_hello_resp && k != PC_heartbeat_resp &&
                         k != PC_challenge && k != PC_challenge_resp &&
                         k != PC_heartbeat && /* its paths are a fixed array */
                         k != PC_prefix_resp && k != PC_remove_all && k != PC_remove_all_resp &&
                         k != PC_remove_regex && k != PC_ucx_attach;
            if (arrays != (cap > 0))
                th_fail(__FILE__, __LINE__, "%s sample %d needs %zu arena bytes",
                        pc_codecs[k].name, v, cap);
            CHECK(arrays == (cap > 0));
            kvp_buf_free(&b);
        }
    }
}

TEST(allocation_failure)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    CHECK_EQ(enc_sample(PC_seg_info_resp, 1, &b), 0);
    for (uint64_t nth = 1; nth < 8; nth++) {
        kvp_arena a;
        kvp_arena_init(&a, ARENA_CAP);
        pc_msg m;
        kvp_mem_fail_nth(nth, 1);
        int rc = kvp_dec_seg_info_resp(b.data, (uint32_t)b.len, &l, &a, &m.seg_info_resp);
        uint64_t failed = kvp_mem_failed();
        kvp_mem_fail_nth(0, 0);
        CHECK_EQ(rc, failed ? KVP_ENOMEM : 0);
        kvp_arena_free(&a);
    }
    kvp_buf_free(&b);
}

TEST(encoder_buffer_limit)
{
    for (int k = 0; k < PC__COUNT; k++) {
        kvp_buf full;
        CHECK_EQ(enc_sample(k, 1, &full), 0);
        if (full.len == 0)
            continue;
        pc_msg m;
        pc_sample(k, 1, &m);
        kvp_buf b;
        kvp_buf_init(&b, full.len - 1);
        pc_codecs[k].enc(&b, &m);
        CHECK_EQ(b.err, KVP_ETOO_LARGE);
        kvp_buf_free(&b);
        kvp_buf_free(&full);
    }
}

TEST(arena_huge_request)
{
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    CHECK(kvp_arena_alloc(&a, SIZE_MAX) == NULL);
    CHECK(kvp_arena_alloc(&a, SIZE_MAX - 7) == NULL);
    CHECK(kvp_arena_alloc(&a, (1 << 20) + 1) == NULL);
    CHECK(kvp_arena_alloc(&a, 1 << 20) != NULL);
    CHECK(kvp_arena_alloc(&a, 1) == NULL);
    kvp_arena_free(&a);
}

/* ------------------------------------------------------ fuzz corpus */

/* A DISK_CMD / DISK_REPORT entry: its layout (rec last), and rec only
 * where an entry names a record (FORGET, durable SPILLED, HAVE, GONE). */
TEST(disk_entry_record_id)
{
    kvp_proto_limits l = lim();
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_disk_ent e = {KVP_DISK_FORGET, 0, PC_B("t"), PC_B("k"), 4096, 0xC0DE, 0, 0, 0xA1B2C3D4u};
    kvp_enc_disk(&b, &(kvp_msg_disk){9, 1, &e});
    CHECK_EQ(b.len, 12 + KVP_DISK_ENT_FIXED + 2);
    static const uint8_t tail[4] = {0xD4, 0xC3, 0xB2, 0xA1};
    CHECK(memcmp(b.data + b.len - 4, tail, 4) == 0);
    kvp_arena a;
    kvp_arena_init(&a, 1 << 16);
    kvp_msg_disk d;
    CHECK_EQ(kvp_dec_disk(b.data, (uint32_t)b.len, &l, &a, &d), 0);
    CHECK(d.n == 1 && d.e[0].rec == 0xA1B2C3D4u && d.e[0].what == KVP_DISK_FORGET);
    static const struct {
        uint8_t what;
        int32_t status;
        int ok;
    } cases[] = {
        {KVP_DISK_SPILL, 0, 0},   {KVP_DISK_LOAD, 0, 0},      {KVP_DISK_FORGET, 0, 1},
        {KVP_DISK_SPILLED, 0, 1}, {KVP_DISK_SPILLED, KVP_EIO, 0}, {KVP_DISK_LOADED, 0, 0},
        {KVP_DISK_HAVE, 0, 1},    {KVP_DISK_GONE, 0, 1},      {KVP_DISK_USAGE, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (uint32_t rec = 0; rec < 2; rec++) {
            kvp_buf_reset(&b);
            kvp_arena_reset(&a);
            e.what = cases[i].what;
            e.status = cases[i].status;
            e.rec = rec;
            kvp_enc_disk(&b, &(kvp_msg_disk){9, 1, &e});
            int want = rec == 0 || cases[i].ok ? 0 : KVP_EPROTOCOL;
            CHECK_EQ(kvp_dec_disk(b.data, (uint32_t)b.len, &l, &a, &d), want);
        }
    }
    kvp_arena_free(&a);
    kvp_buf_free(&b);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    uint8_t *p = malloc(1 << 20);
    *len = fread(p, 1, 1 << 20, f);
    fclose(f);
    return p;
}

/* The committed seed corpus stays valid: every decode seed decodes, every
 * frame seed is a whole number of frames whose bodies decode. */
TEST(fuzz_corpus_valid)
{
    kvp_proto_limits l = lim();
    int files = 0;
    static const char *dirs[2] = {"tests/fuzz/corpus/fuzz_decode", "tests/fuzz/corpus/fuzz_frame"};
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (!dir)
            SKIP("run from the repository root to check the fuzz corpus");
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.')
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            size_t len;
            uint8_t *p = slurp(path, &len);
            CHECK(p != NULL);
            files++;
            if (d == 0) {
                CHECK(len >= 1 && p[0] < PC__COUNT);
                CHECK_EQ(dec_copy(p[0], p + 1, len - 1, &l, ARENA_CAP), 0);
            } else {
                size_t off = 0;
                kvp_frame_hdr h;
                const uint8_t *body;
                while (off < len) {
                    CHECK_EQ(kvp_frame_next(p + off, len - off, 1 << 20, &h, &body), 1);
                    CHECK(h.op >= 1 && h.op < KVP_OP__MAX);
                    int kind = h.flags & KVP_FLAG_RESPONSE ? pc_op_kinds[h.op].resp
                                                           : pc_op_kinds[h.op].req;
                    if (kind == PC_NONE || h.status != 0)
                        CHECK(h.body_len == 0 || h.status != 0);
                    else
                        CHECK_EQ(dec_copy(kind, body, h.body_len, &l, ARENA_CAP), 0);
                    off += KVP_FRAME_HDR + h.body_len;
                }
            }
            free(p);
        }
        closedir(dir);
    }
    CHECK(files > 10);
}

/* The STATS answer's tenants section: round trip; an answer without it
 * or cut inside it is refused. */
TEST(stats_tenants_section)
{
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    static uint64_t ctr[3] = {1, 2, 3};
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    kvp_enc_stats_resp(&b, &(kvp_msg_stats_resp){3, ctr, 0, NULL, 0, NULL});
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_msg_stats_resp s;
    CHECK_EQ(kvp_dec_stats_resp(b.data, (uint32_t)b.len, &l, &a, &s), 0);
    CHECK_EQ(s.n_tenants, 0);
    CHECK_EQ(kvp_dec_stats_resp(b.data, (uint32_t)b.len - 4, &l, &a, &s), KVP_EPROTOCOL);
    kvp_tenant_stat t = {{(const uint8_t *)"bob", 3}, 80, 80u << 20, 64u << 20, 0, 0, 72, 0, 1};
    b.len = 0;
    kvp_enc_stats_resp(&b, &(kvp_msg_stats_resp){3, ctr, 0, NULL, 1, &t});
    CHECK_EQ(kvp_dec_stats_resp(b.data, (uint32_t)b.len, &l, &a, &s), 0);
    CHECK(s.n_tenants == 1 && s.tenants[0].name.len == 3 && s.tenants[0].evictions == 72 &&
          s.tenants[0].pool_bytes == 64u << 20 && s.tenants[0].share == 1);
    CHECK_EQ(kvp_dec_stats_resp(b.data, (uint32_t)b.len - 1, &l, &a, &s), KVP_EPROTOCOL);
    kvp_arena_free(&a);
    kvp_buf_free(&b);
}

/* The HEARTBEAT report: its layout byte by byte; what a master knows
 * fewer paths of reads; every malformed shape refused. */
TEST(heartbeat_report)
{
    kvp_msg_heartbeat in = {KVP_HB_REPORT_V1, 2, {{1, 2, 3, 4}, {5, 6, 7, UINT64_MAX}}}, out;
    uint8_t raw[2 + 17 * KVP_HB_PATH_SIZE + 8];
    kvp_buf b = {raw, 0, sizeof raw, sizeof raw, 0};
    kvp_enc_heartbeat(&b, &in);
    CHECK_EQ(b.err, 0);
    CHECK_EQ(b.len, 2 + 2 * KVP_HB_PATH_SIZE);
    static const uint8_t head[2 + 8] = {1, 2, 1, 0, 0, 0, 0, 0, 0, 0};
    CHECK(memcmp(raw, head, sizeof head) == 0);
    CHECK(raw[2 + 32 + 24] == 0xFF && raw[b.len - 1] == 0xFF); /* the last u64, little-endian */
    memset(&out, 0xAB, sizeof out);
    CHECK_EQ(kvp_dec_heartbeat(raw, (uint32_t)b.len, &out), 0);
    CHECK(out.version == 1 && out.npaths == 2 && out.paths[0].get_bytes == 2 &&
          out.paths[1].get_ops == UINT64_MAX);
    for (int i = 2; i < KVP_HB_MAX_PATHS; i++) /* paths not sent read 0 */
        CHECK(out.paths[i].put_bytes == 0 && out.paths[i].get_ops == 0);
    /* refused: empty (no report: the handler's case), a version or a path
     * count out of range, a length that is not the count's */
    uint8_t bad[sizeof raw];
    memcpy(bad, raw, b.len);
    CHECK_EQ(kvp_dec_heartbeat(bad, 0, &out), KVP_EPROTOCOL);
    CHECK_EQ(kvp_dec_heartbeat(bad, 1, &out), KVP_EPROTOCOL);
    CHECK_EQ(kvp_dec_heartbeat(bad, 2, &out), KVP_EPROTOCOL);
    static const uint8_t versions[] = {0, 2, 0xFF};
    for (size_t i = 0; i < sizeof versions; i++) {
        bad[0] = versions[i];
        CHECK_EQ(kvp_dec_heartbeat(bad, (uint32_t)b.len, &out), KVP_EPROTOCOL);
    }
    bad[0] = KVP_HB_REPORT_V1;
    static const uint8_t counts[] = {0, 1, 3, KVP_HB_MAX_PATHS + 1, 0xFF};
    for (size_t i = 0; i < sizeof counts; i++) {
        bad[1] = counts[i];
        CHECK_EQ(kvp_dec_heartbeat(bad, (uint32_t)b.len, &out), KVP_EPROTOCOL);
    }
    bad[1] = 2;
    CHECK_EQ(kvp_dec_heartbeat(bad, (uint32_t)b.len - 1, &out), KVP_EPROTOCOL);
    bad[b.len] = 0;
    CHECK_EQ(kvp_dec_heartbeat(bad, (uint32_t)b.len + 1, &out), KVP_EPROTOCOL);
    CHECK_EQ(kvp_dec_heartbeat(bad, (uint32_t)b.len, &out), 0);
    /* the encoder refuses what the decoder would */
    static const struct { uint8_t version, npaths; } enc_bad[] = {
        {0, 1}, {2, 1}, {KVP_HB_REPORT_V1, 0}, {KVP_HB_REPORT_V1, KVP_HB_MAX_PATHS + 1}};
    for (size_t i = 0; i < sizeof enc_bad / sizeof enc_bad[0]; i++) {
        kvp_msg_heartbeat h = {enc_bad[i].version, enc_bad[i].npaths, {{0}}};
        b.len = 0;
        b.err = 0;
        kvp_enc_heartbeat(&b, &h);
        CHECK_EQ(b.err, KVP_EINVALID_PARAMS);
        CHECK_EQ(b.len, 0);
    }
}

/* The HELLO answer's server release: round trip; longer than
 * KVP_SERVER_VERSION_MAX or not printable ASCII is refused. */
TEST(hello_resp_server_version)
{
    kvp_msg_hello_resp in = {KVP_PROTO_VERSION, 7, 1 << 20, 5000, 10000, 1, {0}, "0.1.0"}, out;
    uint8_t raw[256];
    kvp_buf b = {raw, 0, sizeof raw, sizeof raw, 0};
    kvp_enc_hello_resp(&b, &in);
    CHECK_EQ(kvp_dec_hello_resp(raw, (uint32_t)b.len, &out), 0);
    CHECK(!strcmp(out.server_version, "0.1.0") && out.master_id == 7);
    /* the last field: u32 length, then the bytes */
    size_t at = b.len - 5 - 4;
    raw[at + 4 + 2] = 0x07; /* a control byte */
    CHECK_EQ(kvp_dec_hello_resp(raw, (uint32_t)b.len, &out), KVP_EPROTOCOL);
    raw[at + 4 + 2] = 0xc3; /* not ASCII */
    CHECK_EQ(kvp_dec_hello_resp(raw, (uint32_t)b.len, &out), KVP_EPROTOCOL);
    raw[at + 4 + 2] = '1';
    raw[at] = KVP_SERVER_VERSION_MAX + 1; /* longer than allowed (and than the body) */
    CHECK_EQ(kvp_dec_hello_resp(raw, (uint32_t)b.len, &out), KVP_EPROTOCOL);
    /* an empty release is allowed (a server that does not say) */
    kvp_msg_hello_resp none = {KVP_PROTO_VERSION, 7, 1 << 20, 5000, 10000, 1, {0}, ""};
    b.len = 0;
    kvp_enc_hello_resp(&b, &none);
    CHECK_EQ(kvp_dec_hello_resp(raw, (uint32_t)b.len, &out), 0);
    CHECK_EQ(out.server_version[0], '\0');
}
