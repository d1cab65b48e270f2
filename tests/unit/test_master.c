/*
 * test_master.c -- the master core driven in-process through encoded frames,
 * with an injected clock: put/get lifecycle, index, eviction order, leases,
 * pending-put timeouts, liveness, replicas, fault injection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "master/master.h"
#include "master/obj.h"
#include "master/status.h"
#include "common/prom.h"

#define MiB (1024ull * 1024)

typedef struct sess {
    kvp_msess s;
    uint64_t client_id;
} sess;

typedef struct core {
    kvp_config cfg;
    kvp_master *m;
    uint64_t now;
    kvp_arena a, ra; /* request scratch, response decode scratch */
    kvp_buf out, body;
    uint64_t next_id;
    int32_t status;
    const uint8_t *resp;
    uint32_t resp_len;
    int no_ack;     /* the nodes do not acknowledge SEG_FREED (node_ack) */
    kvp_buf stash;  /* DISK_CMD frames node_ack took from the master's pushes */
    uint64_t soft_ttl; /* PUT_START's soft_ttl_ms (with KVP_PUT_F_SOFT_TTL) */
} core;

static int core_init(core *c, void (*tweak)(kvp_config *))
{
    memset(c, 0, sizeof *c);
    kvp_config_defaults(&c->cfg);
    c->cfg.log_level = KVP_LOG_ERROR;
    if (tweak)
        tweak(&c->cfg);
    c->now = 1000000;
    kvp_arena_init(&c->a, 64 * MiB);
    kvp_arena_init(&c->ra, 64 * MiB);
    kvp_buf_init(&c->out, 128 * MiB);
    kvp_buf_init(&c->body, 128 * MiB);
    kvp_buf_init(&c->stash, 256 * MiB);
    /* pre-grow the test's own buffers so injected allocation failures hit
     * the master, not the test scaffolding */
    kvp_buf_reserve(&c->out, 4 * MiB);
    kvp_buf_reserve(&c->body, 4 * MiB);
    kvp_arena_alloc(&c->a, 4 * MiB);
    kvp_arena_reset(&c->a);
    kvp_arena_alloc(&c->ra, 4 * MiB);
    kvp_arena_reset(&c->ra);
    kvp_log_set_level(KVP_LOG_ERROR);
    return kvp_master_create(&c->cfg, c->now, &c->m);
}

static void core_free(core *c)
{
    kvp_master_destroy(c->m);
    kvp_arena_free(&c->a);
    kvp_arena_free(&c->ra);
    kvp_buf_free(&c->out);
    kvp_buf_free(&c->body);
    kvp_buf_free(&c->stash);
}

/* The master's pushes of one turn, per session they go to. */
typedef struct node_out {
    int n;
    kvp_msess *to[8];
    kvp_buf out[8];
} node_out;

static kvp_buf *node_out_for(kvp_msess *s, void *ctx)
{
    node_out *o = ctx;
    for (int i = 0; i < o->n; i++)
        if (o->to[i] == s)
            return &o->out[i];
    if (o->n == 8)
        return NULL;
    o->to[o->n] = s;
    kvp_buf_init(&o->out[o->n], 64 * MiB);
    return &o->out[o->n++];
}

/* What a node does with SEG_FREED: acknowledges it at once (its transfers
 * stopped); DISK_CMD frames are kept for take_push. */
static void node_ack(core *c)
{
    node_out o = {0};
    kvp_master_push_freed(c->m, node_out_for, &o);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_arena a;
    kvp_arena_init(&a, 1 * MiB);
    for (int i = 0; i < o.n; i++) {
        size_t at = 0;
        kvp_frame_hdr h;
        const uint8_t *b;
        while (at < o.out[i].len &&
               kvp_frame_next(o.out[i].data + at, o.out[i].len - at, 1u << 30, &h, &b) == 1) {
            kvp_msg_seg_freed f;
            kvp_arena_reset(&a);
            if (h.op == KVP_OP_SEG_FREED && kvp_dec_seg_freed(b, h.body_len, &l, &a, &f) == 0) {
                uint64_t v[2] = {f.segment_id, f.seq};
                kvp_msg_ids ids = {2, v};
                kvp_buf body, out;
                kvp_buf_init(&body, 1 * MiB);
                kvp_buf_init(&out, 1 * MiB);
                kvp_enc_ids(&body, &ids);
                kvp_frame_hdr ah = {KVP_PROTO_VERSION, KVP_FLAG_ONEWAY, KVP_OP_SEG_FREED_ACK,
                                    0, (uint32_t)body.len, 0};
                kvp_arena_reset(&a);
                kvp_master_handle(c->m, o.to[i], &ah, body.data, &a, &out, c->now);
                kvp_buf_free(&body);
                kvp_buf_free(&out);
            } else if (h.op == KVP_OP_DISK_CMD) {
                kvp_buf_put(&c->stash, o.out[i].data + at, KVP_FRAME_HDR + h.body_len);
            }
            at += KVP_FRAME_HDR + h.body_len;
        }
        kvp_buf_free(&o.out[i]);
    }
    kvp_arena_free(&a);
}

/* Sends c->body as a request of op on session s; decodes nothing. */
/* kvp_master_jobs's callback: a deferred answer lands in c->out */
static kvp_buf *job_out(kvp_msess *s, void *ctx)
{
    (void)s;
    return &((core *)ctx)->out;
}

static int call(core *c, sess *s, uint16_t op, uint8_t flags)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, flags, op, ++c->next_id, (uint32_t)c->body.len, 0};
    kvp_buf_reset(&c->out);
    kvp_arena_reset(&c->a);
    kvp_arena_reset(&c->ra);
    int rc = kvp_master_handle(c->m, &s->s, &h, c->body.data, &c->a, &c->out, c->now);
    kvp_buf_reset(&c->body);
    if (rc)
        return rc;
    while (s->s.deferred) /* a REMOVE_ALL longer than a turn: the next turns */
        kvp_master_jobs(c->m, c->now, job_out, c);
    if (!c->no_ack)
        node_ack(c);
    if (c->out.len == 0) {
        c->resp = NULL;
        c->resp_len = 0;
        c->status = 0;
        return 0;
    }
    kvp_frame_hdr rh;
    const uint8_t *b;
    REQUIRE(kvp_frame_next(c->out.data, c->out.len, 1u << 30, &rh, &b) == 1);
    REQUIRE(rh.req_id == h.req_id && (rh.flags & KVP_FLAG_RESPONSE) && rh.op == op);
    REQUIRE(KVP_FRAME_HDR + rh.body_len == c->out.len);
    c->status = rh.status;
    c->resp = b;
    c->resp_len = rh.body_len;
    return 0;
}

static int hello(core *c, sess *s, uint64_t id)
{
    kvp_master_sess_open(c->m, &s->s);
    s->client_id = id;
    kvp_msg_hello h = {KVP_PROTO_VERSION, id, {(const uint8_t *)"t", 1}, {{NULL, 0}}};
    kvp_enc_hello(&c->body, &h);
    REQUIRE(call(c, s, KVP_OP_HELLO, 0) == 0);
    return c->status;
}

static int mount(core *c, sess *s, uint64_t id, const char *name, uint64_t cap)
{
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)name, (uint32_t)strlen(name)}};
    kvp_seg_desc d = {id, {(const uint8_t *)name, (uint32_t)strlen(name)}, cap, 1, &ep, 0, 1, 0};
    kvp_msg_mount mm = {1, &d};
    kvp_enc_mount(&c->body, &mm);
    REQUIRE(call(c, s, KVP_OP_MOUNT_SEGMENT, 0) == 0);
    REQUIRE(c->status == 0);
    kvp_msg_results r;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &r) == 0 && r.n == 1);
    return r.codes[0];
}

static kvp_bytes key_of(char *buf, size_t n, int i)
{
    int len = snprintf(buf, n, "key-%06d", i);
    return (kvp_bytes){(const uint8_t *)buf, (uint32_t)len};
}

/* PUT_START of keys [from, from+n) with one size; results into *r. */
static int put_start(core *c, sess *s, int from, int n, uint64_t size, uint32_t replicas,
                     uint32_t flags, const char *pref, kvp_msg_put_start_resp *r)
{
    char (*kb)[32] = malloc((size_t)n * 32);
    kvp_bytes *keys = malloc((size_t)n * sizeof *keys);
    uint64_t *sizes = malloc((size_t)n * sizeof *sizes);
    for (int i = 0; i < n; i++) {
        keys[i] = key_of(kb[i], 32, from + i);
        sizes[i] = size;
    }
    kvp_msg_put_start m = {{NULL, 0}, replicas, flags, c->soft_ttl,
                           {(const uint8_t *)pref, pref ? (uint32_t)strlen(pref) : 0},
                           (uint32_t)n, keys, sizes, NULL};
    kvp_enc_put_start(&c->body, &m);
    int rc = call(c, s, KVP_OP_PUT_START, 0);
    free(kb);
    free(keys);
    free(sizes);
    REQUIRE(rc == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    REQUIRE(kvp_dec_put_start_resp(c->resp, c->resp_len, &l, &c->ra, r) == 0);
    REQUIRE(r->n == (uint32_t)n);
    return 0;
}

/* Sends keys [from, from+n) with a u64 each (PUT_END checksums or RELEASE
 * lease ids) or bare keys (the other ops); returns per-key codes in codes. */
static int keys_op(core *c, sess *s, uint16_t op, int from, int n, const uint64_t *u64s,
                   int32_t *codes)
{
    char (*kb)[32] = malloc((size_t)n * 32);
    kvp_bytes *keys = malloc((size_t)n * sizeof *keys);
    uint64_t *vals = calloc((size_t)n, sizeof *vals);
    for (int i = 0; i < n; i++) {
        keys[i] = key_of(kb[i], 32, from + i);
        if (u64s)
            vals[i] = u64s[i];
    }
    if (op == KVP_OP_PUT_END || op == KVP_OP_RELEASE) {
        kvp_msg_put_end m = {{NULL, 0}, (uint32_t)n, keys, vals};
        kvp_enc_put_end(&c->body, &m);
    } else if (op == KVP_OP_REMOVE) {
        kvp_msg_remove m = {{NULL, 0}, u64s ? 1 : 0, (uint32_t)n, keys};
        kvp_enc_remove(&c->body, &m);
    } else {
        kvp_msg_keys m = {{NULL, 0}, (uint32_t)n, keys};
        kvp_enc_keys(&c->body, &m);
    }
    int rc = call(c, s, op, 0);
    free(kb);
    free(keys);
    free(vals);
    REQUIRE(rc == 0);
    if (c->status)
        return c->status;
    if (op == KVP_OP_PREFIX) {
        kvp_msg_prefix_resp p;
        REQUIRE(kvp_dec_prefix_resp(c->resp, c->resp_len, &p) == 0);
        codes[0] = (int32_t)p.count;
        return 0;
    }
    if (op == KVP_OP_GET)
        return 0; /* caller decodes */
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_results r;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &r) == 0);
    REQUIRE(r.n == (uint32_t)n);
    memcpy(codes, r.codes, (size_t)n * sizeof *codes);
    return 0;
}

static int put(core *c, sess *s, int from, int n, uint64_t size)
{
    if (n <= 0 || n > 100000)
        return -1;
    kvp_msg_put_start_resp r;
    REQUIRE(put_start(c, s, from, n, size, 1, 0, NULL, &r) == 0);
    for (int i = 0; i < n; i++)
        REQUIRE(r.results[i].status == 0);
    uint64_t *cs = calloc((size_t)n, sizeof *cs);
    int32_t *codes = calloc((size_t)n, sizeof *codes);
    for (int i = 0; i < n; i++)
        cs[i] = 0xC0DE0000u + (uint64_t)(from + i);
    int rc = keys_op(c, s, KVP_OP_PUT_END, from, n, cs, codes);
    for (int i = 0; rc == 0 && i < n; i++)
        if (codes[i] != 0)
            rc = codes[i];
    free(cs);
    free(codes);
    return rc;
}

static int exists(core *c, sess *s, int i)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_EXIST, i, 1, NULL, &code) == 0);
    return code;
}

static void stats(core *c, uint64_t *st) { kvp_master_stats(c->m, st); }

/* ------------------------------------------------------------------ tests */

TEST(hello_required_and_refusals)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    kvp_master_sess_open(c.m, &s.s);
    kvp_msg_keys k = {{NULL, 0}, 0, NULL};
    kvp_enc_keys(&c.body, &k);
    CHECK(call(&c, &s, KVP_OP_EXIST, 0) == 0);
    CHECK_EQ(c.status, KVP_ENO_HELLO);
    /* wrong version */
    kvp_msg_hello h = {KVP_PROTO_VERSION + 1, 7, {NULL, 0}, {{NULL, 0}}};
    kvp_enc_hello(&c.body, &h);
    CHECK(call(&c, &s, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, KVP_EINVALID_VERSION);
    CHECK(s.s.close_after);
    /* unknown opcode is answered, not fatal */
    CHECK_EQ(hello(&c, &s, 7), 0);
    CHECK(call(&c, &s, 999, 0) == 0);
    CHECK_EQ(c.status, KVP_EUNKNOWN_OP);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

static void with_token(kvp_config *cfg) { strcpy(cfg->cluster_token, "s3cret"); }

/* AUTH_CHALLENGE proving c on s's session: 0 or the answer's status;
 * *t holds the transcript; *proved: the master's proofs checked out. */
static int challenge(core *c, sess *s, kvp_auth_tx *t, const kvp_auth_creds *cr, int *proved)
{
    hr_challenge(&c->body, t, cr);
    REQUIRE(call(c, s, KVP_OP_AUTH_CHALLENGE, 0) == 0);
    if (c->status)
        return c->status;
    *proved = hr_answer(t, cr, c->resp, c->resp_len);
    return 0;
}

/* AUTH_CHALLENGE then HELLO proving cr: the HELLO's status. */
static int hello_proving(core *c, sess *s, uint64_t id, const kvp_auth_creds *cr)
{
    kvp_auth_tx t;
    int proved = -1;
    REQUIRE(challenge(c, s, &t, cr, &proved) == 0 && proved == 0);
    hr_hello(&c->body, &t, cr, id, "x");
    REQUIRE(call(c, s, KVP_OP_HELLO, 0) == 0);
    return c->status;
}

TEST(cluster_token)
{
    core c;
    CHECK(core_init(&c, with_token) == 0);
    sess s;
    /* no challenge, no proof */
    CHECK_EQ(hello(&c, &s, 1), KVP_EAUTH);
    CHECK(s.s.close_after);
    kvp_master_sess_close(c.m, &s.s, c.now);
    /* the right token, proved */
    kvp_master_sess_open(c.m, &s.s);
    kvp_auth_creds good = hr_creds("s3cret", NULL, NULL, NULL);
    CHECK_EQ(hello_proving(&c, &s, 1, &good), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    /* a wrong token: the master's proof does not check out (the client
     * would stop there), and its HELLO is refused */
    kvp_master_sess_open(c.m, &s.s);
    kvp_auth_creds bad = hr_creds("s3creX", NULL, NULL, NULL);
    kvp_auth_tx t;
    int proved = -1;
    CHECK_EQ(challenge(&c, &s, &t, &bad, &proved), 0);
    CHECK_EQ(proved, 1 + KVP_AUTH_CLUSTER);
    hr_hello(&c.body, &t, &bad, 2, "x");
    CHECK(call(&c, &s, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, KVP_EAUTH);
    CHECK(s.s.close_after);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(hello_proofs_bound_to_the_connection)
{
    core c;
    CHECK(core_init(&c, with_token) == 0);
    kvp_auth_creds good = hr_creds("s3cret", NULL, NULL, NULL);
    /* a proof made for one connection's challenge ... */
    sess a, b;
    kvp_master_sess_open(c.m, &a.s);
    kvp_auth_tx ta;
    int proved = -1;
    CHECK_EQ(challenge(&c, &a, &ta, &good, &proved), 0);
    CHECK_EQ(proved, 0);
    kvp_buf saved;
    kvp_buf_init(&saved, 256);
    hr_hello(&saved, &ta, &good, 5, "x");
    /* ... is refused on another connection, challenged or not */
    kvp_master_sess_open(c.m, &b.s);
    kvp_auth_tx tb;
    CHECK_EQ(challenge(&c, &b, &tb, &good, &proved), 0);
    kvp_buf_put(&c.body, saved.data, saved.len);
    CHECK(call(&c, &b, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, KVP_EAUTH);
    kvp_master_sess_close(c.m, &b.s, c.now);
    kvp_master_sess_open(c.m, &b.s);
    kvp_buf_put(&c.body, saved.data, saved.len);
    CHECK(call(&c, &b, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, KVP_EAUTH);
    kvp_master_sess_close(c.m, &b.s, c.now);
    /* on its own connection it works once; a second challenge before the
     * HELLO is refused, and a challenge serves one HELLO */
    kvp_buf_put(&c.body, saved.data, saved.len);
    CHECK(call(&c, &a, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, 0);
    kvp_buf_put(&c.body, saved.data, saved.len);
    CHECK(call(&c, &a, KVP_OP_HELLO, 0) == 0);
    CHECK_EQ(c.status, KVP_EAUTH);
    kvp_master_sess_close(c.m, &a.s, c.now);
    kvp_master_sess_open(c.m, &a.s);
    CHECK_EQ(challenge(&c, &a, &ta, &good, &proved), 0);
    CHECK_EQ(challenge(&c, &a, &ta, &good, &proved), KVP_EPROTOCOL);
    CHECK(a.s.close_after);
    kvp_master_sess_close(c.m, &a.s, c.now);
    kvp_buf_free(&saved);
    core_free(&c);
}

TEST(hello_session_join_by_proof)
{
    core c;
    CHECK(core_init(&c, with_token) == 0);
    kvp_auth_creds good = hr_creds("s3cret", NULL, NULL, NULL);
    sess a, b;
    kvp_master_sess_open(c.m, &a.s);
    CHECK_EQ(hello_proving(&c, &a, 9, &good), 0);
    kvp_msg_hello_resp r;
    CHECK_EQ(kvp_dec_hello_resp(c.resp, c.resp_len, &r), 0);
    uint8_t session[KVP_SESSION_LEN];
    memcpy(session, r.session, sizeof session);
    /* the same id without the session: refused */
    kvp_master_sess_open(c.m, &b.s);
    CHECK_EQ(hello_proving(&c, &b, 9, &good), KVP_EILLEGAL_CLIENT);
    kvp_master_sess_close(c.m, &b.s, c.now);
    /* with a wrong session secret: refused */
    uint8_t wrong[KVP_SESSION_LEN];
    memcpy(wrong, session, sizeof wrong);
    wrong[0] ^= 1;
    kvp_auth_creds bad = hr_creds("s3cret", NULL, NULL, wrong);
    kvp_master_sess_open(c.m, &b.s);
    CHECK_EQ(hello_proving(&c, &b, 9, &bad), KVP_EILLEGAL_CLIENT);
    kvp_master_sess_close(c.m, &b.s, c.now);
    /* with a proof of it: joined */
    kvp_auth_creds join = hr_creds("s3cret", NULL, NULL, session);
    kvp_master_sess_open(c.m, &b.s);
    CHECK_EQ(hello_proving(&c, &b, 9, &join), 0);
    kvp_master_sess_close(c.m, &b.s, c.now);
    kvp_master_sess_close(c.m, &a.s, c.now);
    core_free(&c);
}

TEST(put_get_lifecycle)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 11, "node-a:1", 64 * MiB), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 0, 3, 100000, 1, 0, NULL, &r), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(r.results[i].status, 0);
        CHECK_EQ(r.results[i].n_replicas, 1);
        CHECK_EQ(r.results[i].replicas[0].segment_id, 11);
        CHECK_EQ(r.results[i].replicas[0].offset % 4096, 0);
        CHECK_EQ(r.results[i].replicas[0].length, 100000);
    }
    /* pending objects are invisible and already exist for other writers */
    CHECK_EQ(exists(&c, &s, 0), 0);
    int32_t codes[4];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PREFIX, 0, 3, NULL, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 1, NULL, codes), 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_get_resp g;
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g) == 0);
    CHECK_EQ(g.results[0].status, KVP_EREPLICA_IS_NOT_READY);
    CHECK_EQ(put_start(&c, &s, 0, 1, 100000, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_ALREADY_EXISTS);
    /* another client cannot publish or revoke my put */
    sess o;
    CHECK_EQ(hello(&c, &o, 2), 0);
    uint64_t cs[3] = {5, 6, 7};
    CHECK_EQ(keys_op(&c, &o, KVP_OP_PUT_END, 0, 1, cs, codes), 0);
    CHECK_EQ(codes[0], KVP_EILLEGAL_CLIENT);
    CHECK_EQ(keys_op(&c, &o, KVP_OP_PUT_REVOKE, 0, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], KVP_EILLEGAL_CLIENT);
    /* publish 0 and 1, revoke 2 */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 0, 2, cs, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(codes[1], 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_REVOKE, 2, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PREFIX, 0, 3, NULL, codes), 0);
    CHECK_EQ(codes[0], 2);
    CHECK_EQ(keys_op(&c, &o, KVP_OP_GET, 0, 3, NULL, codes), 0);
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g) == 0);
    CHECK_EQ(g.n, 3);
    CHECK_EQ(g.lease_ttl_ms, c.cfg.lease_ttl_ms);
    CHECK_EQ(g.results[0].status, 0);
    CHECK_EQ(g.results[0].size, 100000);
    CHECK_EQ(g.results[0].checksum, 5);
    CHECK_EQ(g.results[1].checksum, 6);
    CHECK_EQ(g.results[2].status, KVP_EOBJECT_NOT_FOUND);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 2);
    CHECK_EQ(st[KVP_STAT_HITS], 2);
    CHECK_EQ(st[KVP_STAT_MISSES], 2);
    CHECK_EQ(st[KVP_STAT_LEASES], 2);
    CHECK_EQ(st[KVP_STAT_USED], 2 * 25 * 4096);
    /* leased: REMOVE refused without force */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], KVP_EOBJECT_HAS_LEASE);
    /* release with a wrong lease id is refused, the right one accepted */
    uint64_t bad = g.results[0].lease_id + 12345, good[2] = {g.results[0].lease_id, g.results[1].lease_id};
    CHECK_EQ(keys_op(&c, &o, KVP_OP_RELEASE, 0, 1, &bad, codes), 0);
    CHECK_EQ(codes[0], KVP_ELEASE_EXPIRED);
    CHECK_EQ(keys_op(&c, &o, KVP_OP_RELEASE, 0, 2, good, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(codes[1], 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_LEASES], 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(exists(&c, &s, 0), 0);
    CHECK_EQ(exists(&c, &s, 1), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    kvp_master_sess_close(c.m, &o.s, c.now);
    core_free(&c);
}

TEST(validation)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    kvp_msg_put_start_resp r;
    /* no segment: no space */
    CHECK_EQ(put_start(&c, &s, 0, 1, 10, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 8 * MiB), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 8 * MiB), 0);                        /* idempotent */
    CHECK_EQ(mount(&c, &s, 1, "n:1", 16 * MiB), KVP_EINVALID_PARAMS);     /* other size */
    CHECK_EQ(mount(&c, &s, 2, "n:1", 8 * MiB), KVP_ESEGMENT_ALREADY_EXISTS); /* name taken */
    CHECK_EQ(mount(&c, &s, 0, "n:2", 8 * MiB), KVP_EINVALID_PARAMS);
    CHECK_EQ(mount(&c, &s, 3, "n:3", 100), KVP_EINVALID_PARAMS);
    sess o;
    CHECK_EQ(hello(&c, &o, 2), 0);
    CHECK_EQ(mount(&c, &o, 1, "n:1", 8 * MiB), KVP_ESEGMENT_ALREADY_EXISTS);
    CHECK_EQ(put_start(&c, &s, 0, 1, 0, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EINVALID_PARAMS);
    CHECK_EQ(put_start(&c, &s, 0, 1, 9 * MiB, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_TOO_LARGE); /* more than the pool keeps */
    CHECK_EQ(put_start(&c, &s, 0, 1, 10, 0, 0, NULL, &r), KVP_EINVALID_PARAMS);
    CHECK_EQ(put_start(&c, &s, 0, 1, 10, 4, 0, NULL, &r), KVP_EINVALID_PARAMS);
    CHECK_EQ(put_start(&c, &s, 0, 1, 10, 1, 0x80, NULL, &r), KVP_EINVALID_PARAMS);
    /* key too long */
    char big[5000];
    memset(big, 'k', sizeof big);
    kvp_bytes k = {(const uint8_t *)big, 4097};
    uint64_t sz = 10;
    kvp_msg_put_start m = {{NULL, 0}, 1, 0, 0, {NULL, 0}, 1, &k, &sz, NULL};
    kvp_enc_put_start(&c.body, &m);
    CHECK(call(&c, &s, KVP_OP_PUT_START, 0) == 0);
    CHECK(c.status != 0); /* refused by the decoder's key limit */
    /* a malformed body is answered with PROTOCOL, the session goes on */
    kvp_buf_put(&c.body, "\x01\x02", 2);
    CHECK(call(&c, &s, KVP_OP_GET, 0) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    CHECK_EQ(exists(&c, &s, 0), 0);
    /* unmount by a non-owner is refused */
    kvp_msg_ids ids = {1, (uint64_t[]){1}};
    kvp_enc_ids(&c.body, &ids);
    CHECK(call(&c, &o, KVP_OP_UNMOUNT_SEGMENT, 0) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_results res;
    CHECK(kvp_dec_results(c.resp, c.resp_len, &l, &c.ra, &res) == 0);
    CHECK_EQ(res.codes[0], KVP_EILLEGAL_CLIENT);
    kvp_master_sess_close(c.m, &s.s, c.now);
    kvp_master_sess_close(c.m, &o.s, c.now);
    core_free(&c);
}

TEST(eviction_order_is_lru)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    /* 100 pages: exactly 10 objects of 10 pages */
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 10, 10 * 4096), 0);
    /* touch 0..4 (GET + RELEASE): 5..9 become the least recently used */
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    for (int i = 4; i >= 0; i--) {
        int32_t code;
        CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, i, 1, NULL, &code), 0);
        kvp_msg_get_resp g;
        CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g) == 0);
        uint64_t lid = g.results[0].lease_id;
        CHECK_EQ(keys_op(&c, &s, KVP_OP_RELEASE, i, 1, &lid, &code), 0);
        CHECK_EQ(code, 0);
    }
    /* one pinned object is never evicted */
    kvp_msg_put_start_resp r;
    /* 3 new objects: inline eviction of 5, 6, 7 (oldest first) */
    CHECK_EQ(put(&c, &s, 100, 3, 10 * 4096), 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(exists(&c, &s, i), 1);
    CHECK_EQ(exists(&c, &s, 5), 0);
    CHECK_EQ(exists(&c, &s, 6), 0);
    CHECK_EQ(exists(&c, &s, 7), 0);
    CHECK_EQ(exists(&c, &s, 8), 1);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_EVICTIONS], 3);
    /* a put larger than the pool can keep: refused up front */
    CHECK_EQ(put_start(&c, &s, 200, 1, 101 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_TOO_LARGE);
    /* ... and it evicts nothing (regression: it used to flush every object) */
    CHECK_EQ(exists(&c, &s, 8), 1);
    CHECK_EQ(exists(&c, &s, 102), 1);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_EVICTIONS], 3);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(pending_leased_pinned_never_evicted)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 40 * 4096), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 0, 1, 10 * 4096, 1, 0, NULL, &r), 0); /* 0: pending */
    CHECK_EQ(put_start(&c, &s, 1, 1, 10 * 4096, 1, KVP_PUT_PIN, NULL, &r), 0);
    uint64_t cs = 1;
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 1, 1, &cs, &code), 0); /* 1: pinned */
    CHECK_EQ(put(&c, &s, 2, 1, 10 * 4096), 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 2, 1, NULL, &code), 0);  /* 2: leased */
    CHECK_EQ(put(&c, &s, 3, 1, 10 * 4096), 0);                      /* 3: evictable */
    CHECK_EQ(put_start(&c, &s, 4, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0); /* evicted 3 */
    CHECK_EQ(exists(&c, &s, 3), 0);
    CHECK_EQ(put_start(&c, &s, 5, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(exists(&c, &s, 1), 1);
    CHECK_EQ(exists(&c, &s, 2), 1);
    /* pinned: REMOVE needs force */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 1, 1, NULL, &code), 0);
    CHECK_EQ(code, KVP_EOBJECT_PINNED);
    uint64_t force = 1;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 1, 1, &force, &code), 0);
    CHECK_EQ(code, 0);
    /* lease expiry makes 2 evictable again; its space is reused at once
     * when its READ descriptors are dead at the node too (1 s later) */
    c.now += c.cfg.lease_ttl_ms + 1001;
    kvp_master_tick(c.m, c.now);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_LEASES], 0);
    CHECK_EQ(put_start(&c, &s, 6, 2, 10 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    CHECK_EQ(r.results[1].status, 0);
    CHECK_EQ(exists(&c, &s, 2), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

static void watermarks(kvp_config *cfg)
{
    cfg->evict_high = 0.80;
    cfg->evict_low = 0.50;
}

TEST(background_eviction_watermarks)
{
    core c;
    CHECK(core_init(&c, watermarks) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 8, 10 * 4096), 0); /* 80 %: not above */
    kvp_master_tick(c.m, c.now);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_EVICTIONS], 0);
    CHECK_EQ(put(&c, &s, 8, 1, 10 * 4096), 0); /* 90 % */
    kvp_master_tick(c.m, c.now);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 50 * 4096);
    CHECK_EQ(st[KVP_STAT_EVICTIONS], 4);
    CHECK_EQ(exists(&c, &s, 3), 0);
    CHECK_EQ(exists(&c, &s, 4), 1);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(lease_expiry_and_stale_release)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 8 * MiB), 0);
    CHECK_EQ(put(&c, &s, 0, 1, 4096), 0);
    int32_t code;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 1, NULL, &code), 0);
    kvp_msg_get_resp g;
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g) == 0);
    uint64_t lid = g.results[0].lease_id, gen = g.results[0].replicas[0].generation;
    c.now += c.cfg.lease_ttl_ms - 1;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, NULL, &code), 0);
    CHECK_EQ(code, KVP_EOBJECT_HAS_LEASE);
    c.now += 2;
    kvp_master_tick(c.m, c.now);
    /* the lease expired: releasing it now is reported, and changes nothing */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_RELEASE, 0, 1, &lid, &code), 0);
    CHECK_EQ(code, KVP_ELEASE_EXPIRED);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    /* the same key re-put gets a new generation and lease epoch */
    CHECK_EQ(put(&c, &s, 0, 1, 4096), 0);
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 1, NULL, &code), 0);
    kvp_msg_get_resp g2;
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g2) == 0);
    CHECK(g2.results[0].lease_id != lid);
    CHECK(g2.results[0].replicas[0].generation != gen);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(put_timeout_and_writer_disconnect)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s, w;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 8 * MiB), 0);
    CHECK_EQ(hello(&c, &w, 2), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &w, 0, 5, 4096, 1, 0, NULL, &r), 0);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_PENDING], 5);
    kvp_master_sess_close(c.m, &w.s, c.now); /* writer gone */
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    /* its WRITE descriptors are still good: the space waits for the node
     * to say it stopped their transfers */
    CHECK_EQ(st[KVP_STAT_USED], 5 * 4096);
    node_ack(&c);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    CHECK_EQ(st[KVP_STAT_PUT_REVOKED], 5);
    /* timeout */
    CHECK_EQ(put_start(&c, &s, 10, 2, 4096, 1, 0, NULL, &r), 0);
    for (uint64_t t = 0; t + 1000 < c.cfg.put_timeout_ms; t += 1000) {
        c.now += 1000;
        CHECK_EQ(exists(&c, &s, 10), 0); /* any request keeps the client alive */
        kvp_master_tick(c.m, c.now);
    }
    c.now += 998;
    kvp_master_tick(c.m, c.now);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_PENDING], 2);
    c.now += 2;
    CHECK_EQ(exists(&c, &s, 10), 0); /* also a heartbeat */
    kvp_master_tick(c.m, c.now);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    CHECK_EQ(st[KVP_STAT_PUT_TIMEOUTS], 2);
    uint64_t cs[2] = {1, 2};
    int32_t codes[2];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 10, 2, cs, codes), 0);
    CHECK_EQ(codes[0], KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(liveness_drops_silent_node)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess node, cl;
    CHECK_EQ(hello(&c, &node, 1), 0);
    CHECK_EQ(mount(&c, &node, 1, "n:1", 8 * MiB), 0);
    CHECK_EQ(hello(&c, &cl, 2), 0);
    CHECK_EQ(put(&c, &cl, 0, 4, 4096), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &node, 50, 1, 4096, 1, 0, NULL, &r), 0); /* node's own pending put */
    /* the client keeps talking, the node goes silent */
    for (int t = 0; t < 12; t++) {
        c.now += 1000;
        CHECK_EQ(exists(&c, &cl, 0), t <= 10 ? 1 : 0);
        kvp_master_tick(c.m, c.now);
    }
    CHECK(kvp_master_sess_dead(&node.s));
    CHECK(!kvp_master_sess_dead(&cl.s));
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_SEGMENTS], 0);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    CHECK_EQ(st[KVP_STAT_CLIENTS], 1);
    CHECK_EQ(st[KVP_STAT_CLIENTS_EXPIRED], 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &node.s, c.now);
    /* the node comes back and remounts */
    CHECK_EQ(hello(&c, &node, 1), 0);
    CHECK_EQ(mount(&c, &node, 1, "n:1", 8 * MiB), 0);
    CHECK_EQ(put(&c, &cl, 0, 1, 4096), 0);
    kvp_master_sess_close(c.m, &node.s, c.now);
    kvp_master_sess_close(c.m, &cl.s, c.now);
    core_free(&c);
}

TEST(replicas_preferred_and_unmount)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "a:1", 8 * MiB), 0);
    CHECK_EQ(mount(&c, &s, 2, "b:1", 8 * MiB), 0);
    CHECK_EQ(mount(&c, &s, 3, "c:1", 8 * MiB), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 0, 20, 4096, 3, 0, NULL, &r), 0);
    for (int i = 0; i < 20; i++) {
        CHECK_EQ(r.results[i].n_replicas, 3);
        uint64_t a = r.results[i].replicas[0].segment_id, b = r.results[i].replicas[1].segment_id,
                 d = r.results[i].replicas[2].segment_id;
        CHECK(a != b && b != d && a != d);
    }
    CHECK_EQ(put_start(&c, &s, 100, 10, 4096, 1, 0, "b:1", &r), 0);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(r.results[i].replicas[0].segment_id, 2);
    uint64_t cs[30] = {0};
    int32_t codes[30];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 0, 20, cs, codes), 0);
    /* unmount b: 3-replica objects keep 2 replicas; 100.. were pending on b: revoked */
    kvp_msg_ids ids = {1, (uint64_t[]){2}};
    kvp_enc_ids(&c.body, &ids);
    CHECK(call(&c, &s, KVP_OP_UNMOUNT_SEGMENT, 0) == 0);
    CHECK_EQ(c.status, 0);
    CHECK_EQ(exists(&c, &s, 100), 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 1, NULL, &code), 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_get_resp g;
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &l, &c.ra, &g) == 0);
    CHECK_EQ(g.results[0].n_replicas, 2);
    CHECK(g.results[0].replicas[0].segment_id != 2 && g.results[0].replicas[1].segment_id != 2);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 20);
    CHECK_EQ(st[KVP_STAT_USED], 40 * 4096);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* SEGMENT_INFO and STATS */
    kvp_msg_ids q = {2, (uint64_t[]){1, 2}};
    kvp_enc_ids(&c.body, &q);
    CHECK(call(&c, &s, KVP_OP_SEGMENT_INFO, 0) == 0);
    kvp_msg_seg_info_resp si;
    CHECK(kvp_dec_seg_info_resp(c.resp, c.resp_len, &l, &c.ra, &si) == 0);
    CHECK_EQ(si.n, 2);
    CHECK_EQ(si.infos[0].status, 0);
    CHECK_EQ(si.infos[0].desc.n_endpoints, 1);
    CHECK(si.infos[0].desc.endpoints[0].addr.len == 3 &&
          !memcmp(si.infos[0].desc.endpoints[0].addr.p, "a:1", 3));
    CHECK_EQ(si.infos[1].status, KVP_ESEGMENT_NOT_FOUND);
    CHECK(call(&c, &s, KVP_OP_STATS, 0) == 0);
    kvp_msg_stats_resp sr;
    CHECK(kvp_dec_stats_resp(c.resp, c.resp_len, &l, &c.ra, &sr) == 0);
    CHECK_EQ(sr.n_counters, KVP_STAT__COUNT);
    CHECK_EQ(sr.counters[KVP_STAT_OBJECTS], 20);
    CHECK_EQ(sr.n_segs, 2);
    CHECK_EQ(sr.segs[0].objects + sr.segs[1].objects, 40);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(remove_all_and_tenants)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "a:1", 64 * MiB), 0);
    CHECK_EQ(put(&c, &s, 0, 100, 4096), 0);
    /* the same key in another tenant is another object */
    kvp_bytes k = {(const uint8_t *)"key-000000", 10};
    uint64_t sz = 4096;
    kvp_msg_put_start m = {{(const uint8_t *)"t2", 2}, 1, 0, 0, {NULL, 0}, 1, &k, &sz, NULL};
    kvp_enc_put_start(&c.body, &m);
    CHECK(call(&c, &s, KVP_OP_PUT_START, 0) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_put_start_resp r;
    CHECK(kvp_dec_put_start_resp(c.resp, c.resp_len, &l, &c.ra, &r) == 0);
    CHECK_EQ(r.results[0].status, 0);
    uint64_t cs = 9;
    kvp_msg_put_end pe = {{(const uint8_t *)"t2", 2}, 1, &k, &cs};
    kvp_enc_put_end(&c.body, &pe);
    CHECK(call(&c, &s, KVP_OP_PUT_END, 0) == 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 5, 1, NULL, &code), 0); /* leased */
    kvp_msg_remove_all ra = {{NULL, 0}, 0};
    kvp_enc_remove_all(&c.body, &ra);
    CHECK(call(&c, &s, KVP_OP_REMOVE_ALL, 0) == 0);
    kvp_msg_remove_all_resp rr;
    CHECK(kvp_dec_remove_all_resp(c.resp, c.resp_len, &rr) == 0);
    CHECK_EQ(rr.removed, 99);
    ra.force = 1;
    kvp_enc_remove_all(&c.body, &ra);
    CHECK(call(&c, &s, KVP_OP_REMOVE_ALL, 0) == 0);
    CHECK(kvp_dec_remove_all_resp(c.resp, c.resp_len, &rr) == 0);
    CHECK_EQ(rr.removed, 1);
    kvp_msg_keys ek = {{(const uint8_t *)"t2", 2}, 1, &k};
    kvp_enc_keys(&c.body, &ek);
    CHECK(call(&c, &s, KVP_OP_EXIST, 0) == 0);
    kvp_msg_results res;
    CHECK(kvp_dec_results(c.resp, c.resp_len, &l, &c.ra, &res) == 0);
    CHECK_EQ(res.codes[0], 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(many_keys_index_growth)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "a:1", 1ull << 30), 0);
    for (int b = 0; b < 20; b++)
        CHECK_EQ(put(&c, &s, b * 1000, 1000, 100), 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PREFIX, 0, 20000, NULL, &code), 0);
    CHECK_EQ(code, 20000);
    /* remove every other key, then check the rest are all still found */
    uint64_t force = 1;
    for (int i = 0; i < 20000; i += 2)
        CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, i, 1, &force, &code), 0);
    for (int i = 0; i < 20000; i++)
        CHECK_EQ(exists(&c, &s, i), i % 2);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/*
 * Fault injection: a put / get / evict scenario with the Nth allocation
 * failing, for every N until the scenario runs clean. Nothing may crash or
 * leak, every failure must be reported as an error code, and the core must
 * stay consistent.
 */
static int scenario(core *c, sess *s)
{
    int32_t codes[64];
    kvp_msg_put_start_resp r;
    int rc = put_start(c, s, 0, 40, 8192, 2, 0, NULL, &r);
    if (rc)
        return rc;
    uint64_t cs[40] = {0};
    REQUIRE(keys_op(c, s, KVP_OP_PUT_END, 0, 40, cs, codes) == 0);
    REQUIRE(keys_op(c, s, KVP_OP_GET, 0, 40, NULL, codes) == 0);
    rc = put_start(c, s, 40, 20, 8192, 1, 0, NULL, &r); /* forces evictions */
    if (rc)
        return rc;
    for (uint32_t i = 0; i < r.n; i++)
        REQUIRE(r.results[i].status == 0 || r.results[i].status == KVP_ENOMEM ||
                r.results[i].status == KVP_ENO_AVAILABLE_HANDLE);
    return 0;
}

TEST(fault_injection_every_allocation)
{
    int clean = 0;
    for (uint64_t n = 1; n < 400 && !clean; n++) {
        core c;
        if (core_init(&c, NULL) != 0) {
            core_free(&c);
            continue;
        }
        sess s, t;
        CHECK_EQ(hello(&c, &s, 1), 0);
        CHECK_EQ(hello(&c, &t, 2), 0);
        CHECK_EQ(mount(&c, &s, 1, "a:1", 100 * 8192), 0);
        CHECK_EQ(mount(&c, &s, 2, "b:1", 100 * 8192), 0);
        kvp_mem_fail_nth(n, 0);
        int rc = scenario(&c, &s);
        clean = kvp_mem_failed() == 0;
        kvp_mem_fail_nth(0, 0);
        if (rc != 0 && rc != KVP_ENOMEM && rc != KVP_ETOO_LARGE) {
            th_fail(__FILE__, __LINE__, "fault %llu: scenario returned %d", (unsigned long long)n,
                    rc);
            return;
        }
        if (th_failed())
            return;
        CHECK_EQ(kvp_master_check(c.m), 0);
        kvp_master_sess_close(c.m, &s.s, c.now);
        kvp_master_sess_close(c.m, &t.s, c.now);
        CHECK_EQ(kvp_master_check(c.m), 0);
        core_free(&c);
    }
    CHECK(clean);
}

TEST(no_flush_when_eviction_cannot_make_room)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 8, 10 * 4096), 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 7, NULL, &code), 0); /* 0..6 leased */
    /* 20 free + 10 evictable pages: a 31-page put cannot fit, a 30-page one can */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 100, 1, 31 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(exists(&c, &s, 7), 1); /* nothing was evicted in vain */
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(put_start(&c, &s, 101, 1, 30 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    CHECK_EQ(exists(&c, &s, 7), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------------------------ SSD tier */

static int mount_disk(core *c, sess *s, uint64_t id, const char *name, uint64_t cap,
                      uint64_t disk)
{
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)name, (uint32_t)strlen(name)}};
    kvp_seg_desc d = {id, {(const uint8_t *)name, (uint32_t)strlen(name)}, cap, 1, &ep, 0, 1,
                      disk};
    kvp_msg_mount mm = {1, &d};
    kvp_enc_mount(&c->body, &mm);
    REQUIRE(call(c, s, KVP_OP_MOUNT_SEGMENT, 0) == 0);
    REQUIRE(c->status == 0);
    return 0;
}

/* What the master pushed to the node: DISK_CMD entries, copied out. */
typedef struct pushed {
    kvp_buf out;
    int n, total, frames; /* entries kept (at most 256), entries and frames seen */
    struct {
        uint8_t what;
        char key[32];
        uint64_t size, csum, gen;
        uint32_t page, rec;
    } e[256];
} pushed;

static kvp_buf *push_out(kvp_msess *s, void *ctx)
{
    (void)s;
    return &((pushed *)ctx)->out;
}

static int take_push(core *c, pushed *p)
{
    p->n = p->total = p->frames = 0;
    kvp_buf_init(&p->out, 64 * MiB);
    kvp_buf_put(&p->out, c->stash.data, c->stash.len);
    kvp_buf_reset(&c->stash);
    kvp_master_push_freed(c->m, push_out, p);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    size_t at = 0;
    kvp_frame_hdr h;
    const uint8_t *b;
    while (at < p->out.len && kvp_frame_next(p->out.data + at, p->out.len - at, 1u << 30, &h, &b) == 1) {
        if (h.op == KVP_OP_DISK_CMD) {
            kvp_msg_disk d;
            kvp_arena_reset(&c->ra);
            REQUIRE(kvp_dec_disk(b, h.body_len, &l, &c->ra, &d) == 0);
            REQUIRE(h.body_len <= 2u << 20); /* frames stay small */
            p->total += (int)d.n;
            p->frames++;
            for (uint32_t i = 0; i < d.n && p->n < 256; i++, p->n++) {
                p->e[p->n].what = d.e[i].what;
                snprintf(p->e[p->n].key, sizeof p->e[p->n].key, "%.*s", (int)d.e[i].key.len,
                         (const char *)d.e[i].key.p);
                p->e[p->n].size = d.e[i].size;
                p->e[p->n].csum = d.e[i].checksum;
                p->e[p->n].gen = d.e[i].generation;
                p->e[p->n].page = d.e[i].page;
                p->e[p->n].rec = d.e[i].rec;
            }
        }
        at += KVP_FRAME_HDR + h.body_len;
    }
    kvp_buf_free(&p->out);
    return 0;
}

/* Index of the last pushed entry of kind what, -1 if none. */
static int find_cmd(const pushed *p, uint8_t what)
{
    int at = -1;
    for (int i = 0; i < p->n; i++)
        if (p->e[i].what == what)
            at = i;
    return at;
}

/* One DISK_REPORT entry from the node of segment seg, naming record rec. */
static int report_rec(core *c, sess *s, uint64_t seg, uint8_t what, int32_t status,
                      const char *key, uint64_t size, uint64_t csum, uint32_t page, uint64_t gen,
                      uint32_t rec)
{
    kvp_disk_ent e = {what, status, {NULL, 0}, {(const uint8_t *)key, (uint32_t)strlen(key)},
                      size, csum, page, gen, rec};
    kvp_msg_disk d = {seg, 1, &e};
    kvp_enc_disk(&c->body, &d);
    REQUIRE(call(c, s, KVP_OP_DISK_REPORT, KVP_FLAG_ONEWAY) == 0);
    REQUIRE(c->out.len == 0); /* a ONEWAY report gets no answer */
    return 0;
}

static int report(core *c, sess *s, uint64_t seg, uint8_t what, int32_t status, const char *key,
                  uint64_t size, uint64_t csum, uint32_t page, uint64_t gen)
{
    return report_rec(c, s, seg, what, status, key, size, csum, page, gen, 0);
}

static int32_t get_status(core *c, sess *s, int i, kvp_get_result *out)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_GET, i, 1, NULL, &code) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_get_resp g;
    REQUIRE(kvp_dec_get_resp(c->resp, c->resp_len, &l, &c->ra, &g) == 0 && g.n == 1);
    if (out)
        *out = g.results[0];
    return g.results[0].status;
}

TEST(disk_tier_spill_load_forget)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    CHECK_EQ(put(&c, &s, 0, 10, 10 * 4096), 0); /* full */
    kvp_msg_put_start_resp r;
    /* the next put needs room: the LRU victim (key 0) is spilled, not
     * dropped, and the put is told to back off until it is durable */
    CHECK_EQ(put_start(&c, &s, 100, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(exists(&c, &s, 0), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    CHECK_EQ(p->n, 1);
    CHECK_EQ(p->e[0].what, KVP_DISK_SPILL);
    CHECK(!strcmp(p->e[0].key, "key-000000"));
    CHECK_EQ(p->e[0].csum, 0xC0DE0000u);
    /* still readable from DRAM while the spill is in flight */
    kvp_get_result g;
    CHECK_EQ(get_status(&c, &s, 0, &g), 0);
    CHECK_EQ(g.n_replicas, 1);
    uint64_t lid = g.lease_id;
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_RELEASE, 0, 1, &lid, &code), 0);
    /* durable: the DRAM copy goes, the object stays (on disk) */
    report(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000000", 10 * 4096, 0xC0DE0000u, p->e[0].page,
           p->e[0].gen);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_SPILLS], 1);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], 1);
    CHECK_EQ(st[KVP_STAT_EVICTIONS], 0);
    CHECK_EQ(st[KVP_STAT_USED], 90 * 4096);
    CHECK_EQ(exists(&c, &s, 0), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* the put now fits */
    CHECK_EQ(put(&c, &s, 100, 1, 10 * 4096), 0);
    /* a GET of the disk object: LOADING, and a LOAD command (a victim is
     * spilled for its staging room: key 1) */
    CHECK_EQ(get_status(&c, &s, 0, NULL), KVP_EOBJECT_LOADING);
    take_push(&c, p);
    int load = -1, spill = -1;
    for (int i = 0; i < p->n; i++) {
        if (p->e[i].what == KVP_DISK_LOAD)
            load = i;
        if (p->e[i].what == KVP_DISK_SPILL)
            spill = i;
    }
    CHECK(spill >= 0 && !strcmp(p->e[spill].key, "key-000001"));
    CHECK_EQ(get_status(&c, &s, 0, NULL), KVP_EOBJECT_LOADING);
    CHECK_EQ(kvp_master_check(c.m), 0);
    report(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000001", 10 * 4096, 0xC0DE0001u,
           p->e[spill].page, p->e[spill].gen);
    CHECK_EQ(get_status(&c, &s, 0, NULL), KVP_EOBJECT_LOADING);
    take_push(&c, p);
    for (int i = 0; i < p->n; i++)
        if (p->e[i].what == KVP_DISK_LOAD)
            load = i;
    CHECK(load >= 0 && !strcmp(p->e[load].key, "key-000000"));
    report(&c, &s, 7, KVP_DISK_LOADED, 0, "key-000000", 10 * 4096, 0xC0DE0000u, p->e[load].page,
           p->e[load].gen);
    CHECK_EQ(get_status(&c, &s, 0, &g), 0);
    CHECK_EQ(g.replicas[0].offset, (uint64_t)p->e[load].page << 12);
    CHECK_EQ(g.checksum, 0xC0DE0000u);
    lid = g.lease_id;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_RELEASE, 0, 1, &lid, &code), 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_LOADS], 1);
    CHECK_EQ(st[KVP_STAT_DISK_HITS], 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* remove: the disk record is forgotten */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 1, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    take_push(&c, p);
    CHECK(p->n >= 1 && p->e[p->n - 1].what == KVP_DISK_FORGET &&
          !strcmp(p->e[p->n - 1].key, "key-000001"));
    /* a spill that fails: the victim is dropped as without a tier */
    CHECK_EQ(put_start(&c, &s, 101, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    take_push(&c, p);
    CHECK(p->n == 0 || p->e[0].what == KVP_DISK_SPILL);
    if (p->n) {
        const char *k = p->e[0].key;
        int idx = atoi(k + 4);
        report(&c, &s, 7, KVP_DISK_SPILLED, KVP_ENO_AVAILABLE_HANDLE, k, 10 * 4096,
               0xC0DE0000u + (uint64_t)idx, p->e[0].page, p->e[0].gen);
        CHECK_EQ(exists(&c, &s, idx), 0);
        stats(&c, st);
        CHECK_EQ(st[KVP_STAT_SPILL_FAILS], 1);
    }
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* a stale report (unknown key) is answered with FORGET, changes nothing */
    report(&c, &s, 7, KVP_DISK_SPILLED, 0, "nope", 4096, 1, 0, 0);
    take_push(&c, p);
    CHECK(p->n == 1 && p->e[0].what == KVP_DISK_FORGET);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* FORGET names the record (rec) it removes: the one the node reported in a
 * stale report, or the object's own when it is removed -- never the key
 * alone, so a late FORGET cannot take a newer record of the key. */
TEST(disk_tier_forget_names_the_record)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    CHECK_EQ(put(&c, &s, 0, 10, 10 * 4096), 0); /* full */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 100, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    pushed *p = calloc(1, sizeof *p), *q = calloc(1, sizeof *q);
    take_push(&c, p);
    CHECK(p->n == 1 && p->e[0].what == KVP_DISK_SPILL && !strcmp(p->e[0].key, "key-000000"));
    CHECK_EQ(p->e[0].rec, 0);
    /* the object is removed while its spill is in flight, put again (the
     * same value) and spilled again: two records of the key on the way */
    int32_t codes[10];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 10, NULL, codes), 0);
    CHECK_EQ(put(&c, &s, 0, 1, 10 * 4096), 0);
    CHECK_EQ(put(&c, &s, 11, 9, 10 * 4096), 0);
    CHECK_EQ(put_start(&c, &s, 100, 1, 10 * 4096, 1, 0, NULL, &r), 0);
    take_push(&c, q);
    int sp = -1;
    for (int i = 0; i < q->n; i++)
        if (q->e[i].what == KVP_DISK_SPILL && !strcmp(q->e[i].key, "key-000000"))
            sp = i;
    CHECK(sp >= 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* the first spill's report (record 0x100) is stale: forgotten by its id */
    report_rec(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000000", 10 * 4096, 0xC0DE0000u,
               p->e[0].page, p->e[0].gen, 0x100);
    take_push(&c, p);
    CHECK(p->n == 1 && p->e[0].what == KVP_DISK_FORGET && !strcmp(p->e[0].key, "key-000000"));
    CHECK_EQ(p->e[0].rec, 0x100);
    CHECK_EQ(p->e[0].csum, 0xC0DE0000u);
    /* the second one is the object's record (0x101) */
    report_rec(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000000", 10 * 4096, 0xC0DE0000u,
               q->e[sp].page, q->e[sp].gen, 0x101);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], 1);
    CHECK_EQ(exists(&c, &s, 0), 1);
    /* an older record of the key dropped by the tier is not the object's */
    report_rec(&c, &s, 7, KVP_DISK_GONE, 0, "key-000000", 10 * 4096, 0xC0DE0000u, 0, 0, 0x100);
    CHECK_EQ(exists(&c, &s, 0), 1);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* removed: FORGET names the object's record */
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    take_push(&c, p);
    int fg = find_cmd(p, KVP_DISK_FORGET);
    CHECK(fg >= 0 && !strcmp(p->e[fg].key, "key-000000"));
    CHECK_EQ(p->e[fg].rec, 0x101);
    /* HAVE of another value under a key: that record is forgotten */
    report_rec(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000011", 10 * 4096, 0xBAD, 0, 0, 0x77);
    take_push(&c, p);
    CHECK(p->n == 1 && p->e[0].what == KVP_DISK_FORGET && p->e[0].rec == 0x77);
    /* a record only on disk; reported again under a newer id (the node's
     * record of the key now): its removal names that one */
    report_rec(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000050", 8192, 0xAB, 0, 0, 0x200);
    report_rec(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000050", 8192, 0xAB, 0, 0, 0x201);
    CHECK_EQ(exists(&c, &s, 50), 1);
    report_rec(&c, &s, 7, KVP_DISK_GONE, 0, "key-000050", 8192, 0xAB, 0, 0, 0x200);
    CHECK_EQ(exists(&c, &s, 50), 1); /* an older record's GONE */
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 50, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    take_push(&c, p);
    fg = find_cmd(p, KVP_DISK_FORGET);
    CHECK(fg >= 0 && p->e[fg].rec == 0x201 && !strcmp(p->e[fg].key, "key-000050"));
    /* GONE of the object's own record takes it */
    report_rec(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000051", 8192, 0xAC, 0, 0, 0x300);
    report_rec(&c, &s, 7, KVP_DISK_GONE, 0, "key-000051", 8192, 0xAC, 0, 0, 0x300);
    CHECK_EQ(exists(&c, &s, 51), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    free(q);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(disk_tier_have_gone_unmount_and_quarantine)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s, o;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(hello(&c, &o, 2), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    /* a restarted node reports what its disk holds: the objects appear */
    report(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000005", 8192, 0xAB, 0, 0);
    report(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000006", 8192, 0xAC, 0, 0);
    CHECK_EQ(exists(&c, &s, 5), 1);
    CHECK_EQ(exists(&c, &s, 6), 1);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_DISK_REGISTERED], 2);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 2);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    /* reported again (a remount): nothing doubles */
    report(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000005", 8192, 0xAB, 0, 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 2);
    /* a report for a segment the session does not own is ignored */
    report(&c, &o, 7, KVP_DISK_GONE, 0, "key-000005", 8192, 0xAB, 0, 0);
    CHECK_EQ(exists(&c, &s, 5), 1);
    /* dropped by the tier: gone */
    report(&c, &s, 7, KVP_DISK_GONE, 0, "key-000005", 8192, 0xAB, 0, 0);
    CHECK_EQ(exists(&c, &s, 5), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* a load whose object is removed meanwhile: its staging pages wait for
     * the node's report (it may be writing them), then are freed */
    CHECK_EQ(get_status(&c, &s, 6, NULL), KVP_EOBJECT_LOADING);
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    CHECK(p->n == 1 && p->e[0].what == KVP_DISK_LOAD);
    int32_t code;
    uint64_t force = 1;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 6, 1, &force, &code), 0);
    CHECK_EQ(code, 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 8192); /* held */
    CHECK_EQ(kvp_master_check(c.m), 0);
    report(&c, &s, 7, KVP_DISK_LOADED, 0, "key-000006", 8192, 0xAC, p->e[0].page, p->e[0].gen);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* a failed load of a corrupt record: reported missing */
    report(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000008", 8192, 0xAD, 0, 0);
    CHECK_EQ(get_status(&c, &s, 8, NULL), KVP_EOBJECT_LOADING);
    take_push(&c, p);
    int ld = find_cmd(p, KVP_DISK_LOAD);
    CHECK(ld >= 0 && !strcmp(p->e[ld].key, "key-000008"));
    CHECK_EQ(find_cmd(p, KVP_DISK_FORGET), 0); /* key 6's record, removed above */
    report(&c, &s, 7, KVP_DISK_LOADED, KVP_ECHECKSUM_MISMATCH, "key-000008", 8192, 0xAD,
           p->e[ld].page, p->e[ld].gen);
    CHECK_EQ(get_status(&c, &s, 8, NULL), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* the node leaves: objects only on its disk go with it */
    report(&c, &s, 7, KVP_DISK_HAVE, 0, "key-000009", 8192, 0xAE, 0, 0);
    CHECK_EQ(put(&c, &s, 20, 1, 8192), 0);
    uint64_t id = 7;
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&c.body, &ids);
    CHECK_EQ(call(&c, &s, KVP_OP_UNMOUNT_SEGMENT, 0), 0);
    CHECK_EQ(exists(&c, &s, 9), 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    kvp_master_sess_close(c.m, &o.s, c.now);
    core_free(&c);
}

/* A large remove forgets every disk record: the FORGETs are never dropped,
 * and go in frames of about 1 MiB. */
TEST(disk_tier_large_remove_forgets_everything)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 40), 0);
    enum { N = 20000 };
    kvp_disk_ent *e = calloc(1000, sizeof *e);
    for (int b = 0; b < N / 1000; b++) {
        for (int i = 0; i < 1000; i++) {
            char *kk = malloc(260);
            memset(kk, 'k', 250);
            snprintf(kk + 250, 10, "%06d", b * 1000 + i);
            e[i] = (kvp_disk_ent){KVP_DISK_HAVE, 0, {NULL, 0}, {(const uint8_t *)kk, 256}, 4096,
                                  (uint64_t)(b * 1000 + i), 0, 0, (uint32_t)i};
        }
        kvp_msg_disk d = {7, 1000, e};
        kvp_enc_disk(&c.body, &d);
        CHECK_EQ(call(&c, &s, KVP_OP_DISK_REPORT, KVP_FLAG_ONEWAY), 0);
        for (int i = 0; i < 1000; i++)
            free((void *)e[i].key.p);
    }
    free(e);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], N);
    kvp_msg_remove_all ra = {{NULL, 0}, 1};
    kvp_enc_remove_all(&c.body, &ra);
    CHECK_EQ(call(&c, &s, KVP_OP_REMOVE_ALL, 0), 0);
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    CHECK_EQ(p->total, N);
    CHECK(p->frames >= 5);
    CHECK_EQ(find_cmd(p, KVP_DISK_FORGET), 255);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_DISK_OBJECTS], 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------ tenants: fair eviction, names */

/* PUT_START + PUT_END of one key in a tenant: 0 or the first failure. */
static int tput(core *c, sess *s, const char *tenant, const char *key, uint64_t size)
{
    kvp_bytes t = {(const uint8_t *)tenant, (uint32_t)strlen(tenant)};
    kvp_bytes k = {(const uint8_t *)key, (uint32_t)strlen(key)};
    kvp_msg_put_start ps = {t, 1, 0, 0, {NULL, 0}, 1, &k, &size, NULL};
    kvp_enc_put_start(&c->body, &ps);
    REQUIRE(call(c, s, KVP_OP_PUT_START, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_put_start_resp r;
    REQUIRE(kvp_dec_put_start_resp(c->resp, c->resp_len, &l, &c->ra, &r) == 0 && r.n == 1);
    if (r.results[0].status)
        return r.results[0].status;
    uint64_t cs = 0xC0DE;
    kvp_msg_put_end pe = {t, 1, &k, &cs};
    kvp_enc_put_end(&c->body, &pe);
    REQUIRE(call(c, s, KVP_OP_PUT_END, 0) == 0);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &res) == 0 && res.n == 1);
    return res.codes[0];
}

/* EXIST (which = 0) or TIERS (which = 2) of one key in a tenant. */
static int texist(core *c, sess *s, const char *tenant, const char *key, int tiers)
{
    kvp_bytes k = {(const uint8_t *)key, (uint32_t)strlen(key)};
    kvp_msg_keys g = {{(const uint8_t *)tenant, (uint32_t)strlen(tenant)}, 1, &k};
    kvp_enc_keys(&c->body, &g);
    REQUIRE(call(c, s, tiers ? KVP_OP_TIERS : KVP_OP_EXIST, 0) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &res) == 0 && res.n == 1);
    return res.codes[0];
}

/* With an SSD tier, fair eviction spills the flooding tenant's objects:
 * every SPILL the master sends names one of bob's keys, alice's objects
 * stay in DRAM; the per-tenant accounts agree throughout. */
TEST(fair_eviction_spills_the_flooder)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 64 * 4096, 1ull << 30), 0);
    char key[32];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "a-%d", i);
        CHECK_EQ(tput(&c, &s, "alice", key, 4096), 0);
    }
    pushed *p = calloc(1, sizeof *p);
    int spills = 0, others = 0;
    for (int i = 0; i < 120; i++) {
        snprintf(key, sizeof key, "b-%d", i);
        int rc = tput(&c, &s, "bob", key, 4096);
        CHECK(rc == 0 || rc == KVP_ENO_AVAILABLE_HANDLE); /* -200: spills in flight */
        take_push(&c, p);
        for (int k = 0; k < p->n; k++) {
            if (p->e[k].what != KVP_DISK_SPILL)
                continue;
            spills++;
            others += strncmp(p->e[k].key, "b-", 2) != 0;
            /* the node makes it durable: bob's DRAM copy goes */
            report(&c, &s, 7, KVP_DISK_SPILLED, 0, p->e[k].key, p->e[k].size, p->e[k].csum,
                   p->e[k].page, p->e[k].gen);
        }
        CHECK_EQ(kvp_master_check(c.m), 0);
    }
    printf("  %d spills, all of bob's objects\n", spills - others);
    CHECK(spills >= 30); /* 120 puts into the 56 pages alice leaves */
    CHECK_EQ(others, 0);
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "a-%d", i);
        CHECK_EQ(texist(&c, &s, "alice", key, 1), KVP_TIER_DRAM);
    }
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* A segment name held by a connected node is not taken by another
 * mounter; once that node's connections are gone (a restart), it is. */
TEST(segment_name_taken_only_from_a_gone_node)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess node, other;
    CHECK_EQ(hello(&c, &node, 1), 0);
    CHECK_EQ(hello(&c, &other, 2), 0);
    CHECK_EQ(mount(&c, &node, 7, "10.0.0.1:7000", 64 * 4096), 0);
    CHECK_EQ(put(&c, &node, 0, 4, 4096), 0);
    CHECK_EQ(mount(&c, &other, 8, "10.0.0.1:7000", 1ull << 40), KVP_ESEGMENT_ALREADY_EXISTS);
    CHECK_EQ(exists(&c, &other, 0), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &node.s, c.now); /* the node's process died */
    CHECK_EQ(mount(&c, &other, 8, "10.0.0.1:7000", 64 * 4096), 0);
    CHECK_EQ(exists(&c, &other, 0), 0); /* the old segment's objects went with it */
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &other.s, c.now);
    core_free(&c);
}

/* A record (HAVE) from a second node for an object a live node holds on
 * its disk does not take it over: the first node's record stays the
 * object's (its GONE removes the object). */
TEST(have_does_not_shadow_a_live_nodes_record)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess a, b;
    CHECK_EQ(hello(&c, &a, 1), 0);
    CHECK_EQ(hello(&c, &b, 2), 0);
    CHECK_EQ(mount_disk(&c, &a, 7, "n:1", 16 * 4096, 1ull << 30), 0);
    CHECK_EQ(mount_disk(&c, &b, 8, "n:2", 16 * 4096, 1ull << 30), 0);
    report(&c, &a, 7, KVP_DISK_HAVE, 0, "key-000003", 8192, 0xAB, 0, 0);
    CHECK_EQ(exists(&c, &a, 3), 1);
    report(&c, &b, 8, KVP_DISK_HAVE, 0, "key-000003", 8192, 0xAB, 0, 0);
    report(&c, &a, 7, KVP_DISK_GONE, 0, "key-000003", 8192, 0xAB, 0, 0);
    CHECK_EQ(exists(&c, &a, 3), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &a.s, c.now);
    kvp_master_sess_close(c.m, &b.s, c.now);
    core_free(&c);
}

/* fuzz_master_seq: REMOVE_REGEX over an object a node's HAVE registered,
 * whose 4-byte key is followed by its (unset) replica slot and the end of
 * its allocation: regexec got the key itself, and the sanitizers' regexec
 * interceptor read it as a C string, past the object (ASan abort). */
TEST(remove_regex_key_is_not_a_c_string)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    kvp_disk_ent e = {KVP_DISK_HAVE, 0, {NULL, 0}, {(const uint8_t *)"abcd", 4}, 4096, 5, 0, 0, 1};
    kvp_msg_disk d = {7, 1, &e};
    kvp_enc_disk(&c.body, &d);
    CHECK_EQ(call(&c, &s, KVP_OP_DISK_REPORT, KVP_FLAG_ONEWAY), 0);
    kvp_msg_remove_regex rr = {{NULL, 0}, 0, {(const uint8_t *)"^abcd$", 6}};
    kvp_enc_remove_regex(&c.body, &rr);
    CHECK_EQ(call(&c, &s, KVP_OP_REMOVE_REGEX, 0), 0);
    CHECK_EQ(c.status, 0);
    kvp_msg_remove_all_resp r;
    CHECK(kvp_dec_remove_all_resp(c.resp, c.resp_len, &r) == 0);
    CHECK_EQ(r.removed, 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* fuzz_master_seq: a load that times out after the node reported its
 * record GONE leaves an object with no copy anywhere: it is removed (it
 * was put on the disk list without a disk record: assertion). */
TEST(disk_tier_load_timeout_after_record_gone)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    char kb[32];
    key_of(kb, sizeof kb, 3);
    CHECK_EQ(report(&c, &s, 7, KVP_DISK_HAVE, 0, kb, 4096, 9, 0, 0), 0);
    CHECK_EQ(exists(&c, &s, 3), 1);
    CHECK_EQ(get_status(&c, &s, 3, NULL), KVP_EOBJECT_LOADING); /* LOAD sent */
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    CHECK(find_cmd(p, KVP_DISK_LOAD) >= 0);
    CHECK_EQ(report(&c, &s, 7, KVP_DISK_GONE, 0, kb, 4096, 9, 0, 0), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    c.now += c.cfg.put_timeout_ms + 1; /* the node never answers the load */
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(exists(&c, &s, 3), 0);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_LOAD_FAILS], 1);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* fuzz_master_seq: the staging allocation of a load whose object is removed
 * is quarantined; with the allocation that remembered it failing, its pages
 * were lost (counted used, on no object and no list: check -5, and the
 * segment's unmount asserted). The room is now reserved when the load
 * starts. */
TEST(disk_tier_quarantine_survives_allocation_failure)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    char kb[32];
    key_of(kb, sizeof kb, 4);
    CHECK_EQ(report(&c, &s, 7, KVP_DISK_HAVE, 0, kb, 8192, 9, 0, 0), 0);
    CHECK_EQ(get_status(&c, &s, 4, NULL), KVP_EOBJECT_LOADING);
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    int ld = find_cmd(p, KVP_DISK_LOAD);
    CHECK(ld >= 0);
    for (uint64_t nth = 1; nth <= 4; nth++) { /* whichever allocation the remove makes */
        kvp_mem_fail_nth(nth, 0);
        kvp_msg_remove rm = {{NULL, 0}, 1, 1, &(kvp_bytes){(const uint8_t *)kb, 10}};
        kvp_enc_remove(&c.body, &rm);
        CHECK_EQ(call(&c, &s, KVP_OP_REMOVE, 0), 0);
        kvp_mem_fail_nth(0, 0);
        CHECK_EQ(kvp_master_check(c.m), 0);
    }
    CHECK_EQ(exists(&c, &s, 4), 0);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 2 * 4096); /* the staging pages, quarantined */
    /* the node finishes the load: the quarantined pages are freed */
    CHECK_EQ(report(&c, &s, 7, KVP_DISK_LOADED, 0, kb, 8192, 9, p->e[ld].page, p->e[ld].gen), 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* fuzz_master_seq: an object freed while a TCP reader may still be on it is
 * held (xquar) until the node acknowledges; with the allocation that
 * remembers it failing, its pages were counted used but held by nothing
 * (check -5, and the segment's unmount asserted). Now they are held by the
 * segment until it goes. */
TEST(transfer_quarantine_survives_allocation_failure)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 11, "node-a:1", 64 * MiB), 0);
    CHECK_EQ(put(&c, &s, 0, 1, 8192), 0);
    int32_t codes[1];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 0, 1, NULL, codes), 0); /* a READ descriptor */
    char kb[32];
    kvp_bytes k = key_of(kb, sizeof kb, 0);
    for (uint64_t nth = 1; nth <= 4 && exists(&c, &s, 0); nth++) {
        kvp_mem_fail_nth(nth, 0); /* whichever allocation the remove makes */
        kvp_msg_remove rm = {{NULL, 0}, 1, 1, &k};
        kvp_enc_remove(&c.body, &rm);
        CHECK_EQ(call(&c, &s, KVP_OP_REMOVE, 0), 0);
        kvp_mem_fail_nth(0, 0);
        CHECK_EQ(kvp_master_check(c.m), 0);
    }
    CHECK_EQ(exists(&c, &s, 0), 0);
    uint64_t st[KVP_STAT__COUNT];
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 2 * 4096); /* held: a reader may still be on it */
    /* the segment goes: so do its transfers, and the held pages with it */
    uint64_t id = 11;
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&c.body, &ids);
    CHECK_EQ(call(&c, &s, KVP_OP_UNMOUNT_SEGMENT, 0), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    stats(&c, st);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------------------------ soft pins */

/* One key's PUT_START status (flags, c->soft_ttl) and, when 0, its PUT_END
 * with checksum cs. */
static int put_one(core *c, sess *s, int i, uint64_t size, uint32_t flags, uint64_t cs)
{
    kvp_msg_put_start_resp r;
    int rc = put_start(c, s, i, 1, size, 1, flags, NULL, &r);
    if (rc)
        return rc;
    if (r.results[0].status)
        return r.results[0].status;
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_PUT_END, i, 1, &cs, &code) == 0);
    return code;
}

/* GET of key i: its checksum, or the negative status; the lease released. */
static int64_t get_csum(core *c, sess *s, int i)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_GET, i, 1, NULL, &code) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_get_resp g;
    REQUIRE(kvp_dec_get_resp(c->resp, c->resp_len, &l, &c->ra, &g) == 0 && g.n == 1);
    if (g.results[0].status)
        return g.results[0].status;
    int64_t cs = (int64_t)g.results[0].checksum;
    uint64_t lid = g.results[0].lease_id;
    REQUIRE(keys_op(c, s, KVP_OP_RELEASE, i, 1, &lid, &code) == 0 && code == 0);
    return cs;
}

static uint64_t stat_of(core *c, int which)
{
    uint64_t st[KVP_STAT__COUNT];
    stats(c, st);
    return st[which];
}

TEST(soft_pin_requests_are_checked_as_mooncake_does)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    /* a TTL without ENABLE (PRESERVE or DISABLE) */
    c.soft_ttl = 1000;
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_TTL, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_TTL | KVP_PUT_F_SOFT_UNPIN, 1),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_UNPIN, 1),
             KVP_EINVALID_PARAMS);
    /* a TTL over soft_pin_max_ttl; a stray TTL field without the flag */
    c.soft_ttl = c.cfg.soft_pin_max_ttl_ms + 1;
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1),
             KVP_EINVALID_PARAMS);
    CHECK_EQ(put_one(&c, &s, 0, 4096, 0, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(exists(&c, &s, 0), 0);
    /* the maximum itself, the default TTL, and a TTL of 0 (no pin) */
    c.soft_ttl = c.cfg.soft_pin_max_ttl_ms;
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1), 0);
    c.soft_ttl = 0;
    CHECK_EQ(put_one(&c, &s, 1, 4096, KVP_PUT_F_SOFT_PIN, 1), 0);
    CHECK_EQ(put_one(&c, &s, 2, 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1), 0);
    CHECK_EQ(put_one(&c, &s, 3, 4096, KVP_PUT_F_SOFT_UNPIN, 1), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 2); /* 0 and 1 */
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(soft_pinned_objects_are_evicted_after_unpinned_ones)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0); /* 10 objects of 10 pages */
    /* 0..4 soft-pinned first (the least recently used), 5..9 unpinned */
    for (int i = 0; i < 5; i++)
        CHECK_EQ(put_one(&c, &s, i, 10 * 4096, KVP_PUT_F_SOFT_PIN, 1), 0);
    CHECK_EQ(put(&c, &s, 5, 5, 10 * 4096), 0);
    /* 7 new objects: the 5 unpinned go first, then the 2 least recent pins */
    for (int i = 0; i < 5; i++) {
        CHECK_EQ(put(&c, &s, 100 + i, 1, 10 * 4096), 0);
        CHECK_EQ(exists(&c, &s, 5 + i), 0);
        for (int k = 0; k < 5; k++)
            CHECK_EQ(exists(&c, &s, k), 1);
    }
    CHECK_EQ(stat_of(&c, KVP_STAT_EVICTIONS), 5);
    /* only pinned ones are left besides 100..104, which are unpinned */
    CHECK_EQ(put(&c, &s, 105, 1, 10 * 4096), 0);
    CHECK_EQ(exists(&c, &s, 100), 0);
    CHECK_EQ(exists(&c, &s, 0), 1);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 5);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(soft_pins_give_way_only_when_nothing_unpinned_is_left)
{
    core c;
    CHECK(core_init(&c, watermarks) == 0); /* background eviction 80 % -> 50 % */
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    for (int i = 0; i < 9; i++)
        CHECK_EQ(put_one(&c, &s, i, 10 * 4096, KVP_PUT_F_SOFT_PIN, 1), 0);
    /* 90 %: background eviction takes no soft-pinned object */
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_EVICTIONS), 0);
    /* a put that needs room: the least recently used pins, in order */
    CHECK_EQ(put(&c, &s, 9, 2, 10 * 4096), 0);
    CHECK_EQ(exists(&c, &s, 0), 0);
    CHECK_EQ(exists(&c, &s, 1), 1);
    CHECK_EQ(stat_of(&c, KVP_STAT_EVICTIONS), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(soft_pin_ends_after_its_ttl)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    c.soft_ttl = 1000;
    CHECK_EQ(put_one(&c, &s, 0, 10 * 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1), 0);
    c.soft_ttl = 60000;
    CHECK_EQ(put_one(&c, &s, 1, 10 * 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1), 0);
    c.soft_ttl = 0;
    CHECK_EQ(put(&c, &s, 2, 8, 10 * 4096), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 2);
    /* still pinned at its TTL exactly (a pin never ends early): an unpinned
     * object goes */
    c.now += 1000;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(put(&c, &s, 10, 1, 10 * 4096), 0);
    CHECK_EQ(exists(&c, &s, 2), 0);
    CHECK_EQ(exists(&c, &s, 0), 1);
    /* 0's pin is over: the sweep makes it the next victim; 1 stays pinned */
    c.now += 2 * KVP_PIN_TICK_MS; /* ... and ends within two ticks after it */
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(put(&c, &s, 11, 1, 10 * 4096), 0);
    CHECK_EQ(exists(&c, &s, 0), 0);
    CHECK_EQ(exists(&c, &s, 3), 1);
    /* a pin that ends while the object is leased ends when the lease does */
    c.soft_ttl = 1000;
    CHECK_EQ(put_one(&c, &s, 12, 4096, KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, 1), 0);
    c.soft_ttl = 0;
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_GET, 12, 1, NULL, &code), 0);
    c.now += c.cfg.lease_ttl_ms + 1;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 1); /* 1 only */
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(soft_pin_sweep_covers_a_long_list_in_steps)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 64 * MiB), 0);
    /* 5000 pins (more than one tick's sweep), every other one short */
    for (int i = 0; i < 5000; i += 500) {
        kvp_msg_put_start_resp r;
        for (int k = 0; k < 2; k++) {
            c.soft_ttl = k ? 1000 : 100000;
            /* keys i+k, i+k+2, ...: put one at a time (alternating TTLs) */
            for (int j = i + k; j < i + 500; j += 2) {
                CHECK_EQ(put_start(&c, &s, j, 1, 4096, 1,
                                   KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL, NULL, &r), 0);
                CHECK_EQ(r.results[0].status, 0);
            }
        }
        uint64_t cs[500];
        int32_t codes[500];
        for (int j = 0; j < 500; j++)
            cs[j] = 7;
        CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, i, 500, cs, codes), 0);
        for (int j = 0; j < 500; j++)
            CHECK_EQ(codes[j], 0);
    }
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 5000);
    c.now += 1000 + 2 * KVP_PIN_TICK_MS;
    kvp_master_tick(c.m, c.now); /* one tick looks at TICK_BUDGET / 2 */
    uint64_t left = stat_of(&c, KVP_STAT_SOFT_PINNED);
    CHECK(left > 2500 && left < 5000);
    CHECK_EQ(kvp_master_check(c.m), 0);
    for (int t = 0; t < 4; t++)
        kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 2500);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------------------------- upserts */

TEST(replace_keeps_the_old_value_readable_until_put_end)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s, w;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(hello(&c, &w, 2), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, 0, 11), 0);
    /* a plain put of an existing key: first writer wins */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &w, 0, 1, 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_ALREADY_EXISTS);
    /* REPLACE: the old value stays readable while the new one is written */
    CHECK_EQ(put_start(&c, &w, 0, 1, 8192, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    CHECK_EQ(exists(&c, &s, 0), 1);
    /* while it is pending: another REPLACE waits, a plain put dedups */
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EREPLICA_IS_NOT_READY);
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_ALREADY_EXISTS);
    /* only its writer completes it */
    uint64_t cs = 22;
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 0, 1, &cs, &code), 0);
    CHECK(code != 0);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(keys_op(&c, &w, KVP_OP_PUT_END, 0, 1, &cs, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(get_csum(&c, &s, 0), 22);
    /* a retried PUT_END is idempotent; the old space is free again */
    CHECK_EQ(keys_op(&c, &w, KVP_OP_PUT_END, 0, 1, &cs, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_OBJECTS), 1);
    CHECK_EQ(stat_of(&c, KVP_STAT_USED), 2 * 4096);
    /* REPLACE of an absent key is a put */
    CHECK_EQ(put_one(&c, &w, 1, 4096, KVP_PUT_F_REPLACE, 33), 0);
    CHECK_EQ(get_csum(&c, &s, 1), 33);
    /* REPLACE of a key being written (a plain pending put) */
    CHECK_EQ(put_start(&c, &s, 2, 1, 4096, 1, 0, NULL, &r), 0);
    CHECK_EQ(put_start(&c, &w, 2, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EREPLICA_IS_NOT_READY);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &w.s, c.now);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

static void short_put_timeout(kvp_config *cfg) { cfg->put_timeout_ms = 1000; } /* < client_ttl */

TEST(failed_replace_leaves_the_old_value)
{
    core c;
    CHECK(core_init(&c, short_put_timeout) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, 0, 11), 0);
    kvp_msg_put_start_resp r;
    /* revoked (the writer's transfer failed) */
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_REVOKE, 0, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* timed out */
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    c.now += c.cfg.put_timeout_ms + 1;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    CHECK_EQ(stat_of(&c, KVP_STAT_PENDING), 0);
    /* no room for the new value: refused, the old one stays */
    CHECK_EQ(put_start(&c, &s, 0, 1, 200 * 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_TOO_LARGE);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    /* the old object removed meanwhile: the replacement still lands */
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    uint64_t force = 1;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 0, 1, &force, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(exists(&c, &s, 0), 0);
    uint64_t cs = 44;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 0, 1, &cs, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(get_csum(&c, &s, 0), 44);
    /* the writer goes away mid-replace: revoked, the value stays */
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, NULL, &r), 0);
    sess t;
    CHECK_EQ(hello(&c, &t, 2), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    c.now += c.cfg.client_ttl_ms + 200;
    kvp_master_tick(c.m, c.now);
    c.now += 200;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_PENDING), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &t.s, c.now);
    core_free(&c);
}

TEST(replace_keeps_or_changes_the_soft_pin)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_SOFT_PIN, 1), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 1);
    /* PRESERVE (no soft flag) keeps it; DISABLE clears it; ENABLE sets it */
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_REPLACE, 2), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 1);
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_REPLACE | KVP_PUT_F_SOFT_UNPIN, 3), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_REPLACE, 4), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 0);
    c.soft_ttl = 500;
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_REPLACE | KVP_PUT_F_SOFT_PIN | KVP_PUT_F_SOFT_TTL,
                     5), 0);
    c.soft_ttl = 0;
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 1);
    /* a pin that is over is not kept */
    c.now += 500 + 2 * KVP_PIN_TICK_MS;
    CHECK_EQ(put_one(&c, &s, 0, 4096, KVP_PUT_F_REPLACE, 6), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_SOFT_PINNED), 0);
    CHECK_EQ(get_csum(&c, &s, 0), 6);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

TEST(replace_pending_on_an_unmounted_segment_is_revoked)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, 0, 11), 0);
    CHECK_EQ(mount(&c, &s, 2, "n:2", 100 * 4096), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 0, 1, 4096, 1, KVP_PUT_F_REPLACE, "n:2", &r), 0);
    CHECK_EQ(r.results[0].status, 0);
    uint64_t id = 2;
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&c.body, &ids);
    CHECK_EQ(call(&c, &s, KVP_OP_UNMOUNT_SEGMENT, 0), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_PENDING), 0);
    CHECK_EQ(get_csum(&c, &s, 0), 11);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------------- engine KV blocks */

static void with_events(kvp_config *cfg) { strcpy(cfg->kv_events, "tcp://127.0.0.1:1"); }

/* PUT_START + PUT_END of keys [from, from+n), key i a part of block
 * hashes[i] (its parent hashes[i-1] when i > 0 and chain), group g. */
static int bput(core *c, sess *s, int from, int n, const uint64_t *hashes, int chain,
                uint16_t parts, uint8_t g, int32_t *status)
{
    char kb[64][32];
    kvp_bytes keys[64];
    uint64_t sizes[64], cs[64];
    kvp_blkinfo bi[64];
    REQUIRE(n <= 64);
    for (int i = 0; i < n; i++) {
        keys[i] = key_of(kb[i], 32, from + i);
        sizes[i] = 4096;
        cs[i] = 0xB10C0000u + (uint64_t)(from + i);
        bi[i] = (kvp_blkinfo){hashes[i], chain && i ? hashes[i - 1] : 0, 16, parts, g,
                              chain && i ? KVP_BLK_F_PARENT : 0};
    }
    kvp_msg_put_start m = {{NULL, 0}, 1, KVP_PUT_F_BLOCKS, 0, {NULL, 0}, (uint32_t)n, keys, sizes,
                           bi};
    kvp_enc_put_start(&c->body, &m);
    REQUIRE(call(c, s, KVP_OP_PUT_START, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_put_start_resp r;
    REQUIRE(kvp_dec_put_start_resp(c->resp, c->resp_len, &l, &c->ra, &r) == 0 && r.n == (uint32_t)n);
    int32_t codes[64];
    for (int i = 0; i < n; i++)
        status[i] = r.results[i].status;
    REQUIRE(keys_op(c, s, KVP_OP_PUT_END, from, n, cs, codes) == 0);
    for (int i = 0; i < n; i++)
        if (status[i] == 0)
            status[i] = codes[i];
    return 0;
}

/* The events of one take, flattened: (topic, seq) of each event's batch. */
typedef struct evlog {
    int n, batches;
    kvp_kvev ev[512];
    uint64_t seq[512];
    char topic[512][16];
} evlog;

static void evlog_sink(void *ctx, const char *topic, size_t len, uint64_t seq, const kvp_kvev *ev,
                       uint32_t n)
{
    evlog *g = ctx;
    g->batches++;
    for (uint32_t i = 0; i < n && g->n < 512; i++, g->n++) {
        g->ev[g->n] = ev[i];
        g->seq[g->n] = seq;
        snprintf(g->topic[g->n], sizeof g->topic[g->n], "%.*s", (int)len, topic);
    }
}

static void take_events(core *c, evlog *g)
{
    memset(g, 0, sizeof *g);
    kvp_master_take_events(c->m, evlog_sink, g);
}

static int lookup(core *c, sess *s, uint8_t g, const uint64_t *h, uint32_t n, kvp_hprefix *out)
{
    kvp_hchain ch = {g, n, (uint64_t *)h};
    kvp_msg_lookup_hashes m = {{NULL, 0}, 1, &ch};
    kvp_enc_lookup_hashes(&c->body, &m);
    REQUIRE(call(c, s, KVP_OP_LOOKUP_HASHES, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_lookup_hashes_resp r;
    REQUIRE(kvp_dec_lookup_hashes_resp(c->resp, c->resp_len, &l, &c->ra, &r) == 0 && r.n == 1);
    *out = r.prefix[0];
    return 0;
}

static int snapshot(core *c, sess *s, kvp_msg_kv_snapshot_resp *r)
{
    kvp_msg_keys m = {{NULL, 0}, 0, NULL};
    kvp_enc_keys(&c->body, &m);
    REQUIRE(call(c, s, KVP_OP_KV_SNAPSHOT, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    REQUIRE(kvp_dec_kv_snapshot_resp(c->resp, c->resp_len, &l, &c->ra, r) == 0);
    return 0;
}

#define HP(p, d, k, a) ((p).dram == (d) && (p).disk == (k) && (p).any == (a))

/* A block is two parts: announced when both are readable, withdrawn when
 * the first goes; lookups and the snapshot agree; remove_all ends with
 * AllBlocksCleared; seqs go up by one per batch. */
TEST(blocks_parts_events_lookup_snapshot)
{
    core c;
    CHECK(core_init(&c, with_events) == 0);
    evlog *g = calloc(1, sizeof *g);
    take_events(&c, g); /* a start with an empty index */
    CHECK(g->n == 1 && g->ev[0].type == KVP_KVEV_CLEARED && !strcmp(g->topic[0], "default"));
    uint64_t seq0 = g->seq[0];
    CHECK(seq0 > 1700000000000000ull); /* starts at the wall clock in us */
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    uint64_t h[2] = {0xA0A0A0A0A0A0A0A0ull, 0xB0B0B0B0B0B0B0B0ull};
    int32_t st[4];
    /* part 0 of both blocks (rank 0), then part 1 (rank 1) */
    CHECK_EQ(bput(&c, &s, 0, 2, h, 1, 2, 3, st), 0);
    CHECK(st[0] == 0 && st[1] == 0);
    take_events(&c, g);
    CHECK_EQ(g->n, 0);
    kvp_hprefix p;
    CHECK_EQ(lookup(&c, &s, 3, h, 2, &p), 0);
    CHECK(HP(p, 0, 0, 0));
    CHECK_EQ(bput(&c, &s, 10, 2, h, 1, 2, 3, st), 0);
    CHECK(st[0] == 0 && st[1] == 0);
    take_events(&c, g);
    CHECK_EQ(g->n, 2);
    CHECK(g->ev[0].type == KVP_KVEV_STORED && g->ev[0].hash == h[0] && !g->ev[0].has_parent &&
          g->ev[0].medium == KVP_KVEV_DRAM && g->ev[0].group == 3 && g->ev[0].block_size == 16);
    CHECK(g->ev[1].type == KVP_KVEV_STORED && g->ev[1].hash == h[1] && g->ev[1].has_parent &&
          g->ev[1].parent == h[0]);
    CHECK_EQ(g->seq[0], seq0 + 1);
    CHECK_EQ(lookup(&c, &s, 3, h, 2, &p), 0);
    CHECK(HP(p, 2, 0, 2));
    CHECK_EQ(lookup(&c, &s, 0, h, 2, &p), 0); /* another group */
    CHECK(HP(p, 0, 0, 0));
    kvp_msg_kv_snapshot_resp r;
    CHECK_EQ(snapshot(&c, &s, &r), 0);
    CHECK_EQ(r.seq, seq0 + 1);
    CHECK_EQ(r.n, 2);
    CHECK(r.blocks[0].tier == KVP_TIER_DRAM && r.blocks[0].group == 3);
    CHECK((r.blocks[0].hash == h[0] && r.blocks[1].hash == h[1]) ||
          (r.blocks[0].hash == h[1] && r.blocks[1].hash == h[0]));
    /* one part of block B goes: B is withdrawn, A stays */
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 11, 1, NULL, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(snapshot(&c, &s, &r), 0); /* closes the batch: seq covers it */
    CHECK_EQ(r.seq, seq0 + 2);
    CHECK(r.n == 1 && r.blocks[0].hash == h[0]);
    take_events(&c, g);
    CHECK(g->n == 1 && g->ev[0].type == KVP_KVEV_REMOVED && g->ev[0].hash == h[1] &&
          g->seq[0] == seq0 + 2);
    CHECK_EQ(lookup(&c, &s, 3, h, 2, &p), 0);
    CHECK(HP(p, 1, 0, 1));
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* REMOVE_ALL: A withdrawn, then AllBlocksCleared */
    kvp_msg_remove_all ra = {{NULL, 0}, 0};
    kvp_enc_remove_all(&c.body, &ra);
    CHECK_EQ(call(&c, &s, KVP_OP_REMOVE_ALL, 0), 0);
    take_events(&c, g);
    CHECK(g->n == 2 && g->ev[0].type == KVP_KVEV_REMOVED && g->ev[0].hash == h[0] &&
          g->ev[1].type == KVP_KVEV_CLEARED && g->seq[1] == seq0 + 3);
    CHECK_EQ(snapshot(&c, &s, &r), 0);
    CHECK_EQ(r.n, 0);
    uint64_t sv[KVP_STAT__COUNT];
    stats(&c, sv);
    CHECK_EQ(sv[KVP_STAT_BLOCK_OBJECTS], 0);
    CHECK(sv[KVP_STAT_KV_EVENTS] >= 6 && sv[KVP_STAT_KV_LOST] == 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(g);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* A tenant's parts and block size are the first put's: a put that disagrees
 * keeps its value, not its block; a bad block is refused per key. */
TEST(blocks_conflict_and_bad_info)
{
    core c;
    CHECK(core_init(&c, with_events) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    uint64_t h[2] = {1, 2};
    int32_t st[2];
    CHECK_EQ(bput(&c, &s, 0, 1, h, 0, 1, 0, st), 0);
    CHECK_EQ(st[0], 0);
    CHECK_EQ(bput(&c, &s, 1, 1, h + 1, 0, 4, 0, st), 0); /* 4 parts: disagrees */
    CHECK_EQ(st[0], 0);
    CHECK_EQ(exists(&c, &s, 1), 1);
    uint64_t sv[KVP_STAT__COUNT];
    stats(&c, sv);
    CHECK(sv[KVP_STAT_BLOCK_OBJECTS] == 1 && sv[KVP_STAT_BLOCK_CONFLICTS] == 1);
    CHECK_EQ(bput(&c, &s, 2, 1, h, 0, 1, KVP_OBJ_MAX_GROUP + 1, st), 0);
    CHECK_EQ(st[0], KVP_EINVALID_PARAMS);
    CHECK_EQ(bput(&c, &s, 3, 1, h, 0, 0, 1, st), 0); /* 0 parts */
    CHECK_EQ(st[0], KVP_EINVALID_PARAMS);
    CHECK_EQ(exists(&c, &s, 2), 0);
    kvp_hprefix p;
    CHECK_EQ(lookup(&c, &s, 0, h, 2, &p), 0);
    CHECK(HP(p, 1, 0, 1));
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Tier moves: a spill announces the disk copy, then withdraws the DRAM one;
 * a load announces DRAM again; eviction and the node's loss withdraw. */
TEST(blocks_spill_load_evict_unmount)
{
    core c;
    CHECK(core_init(&c, with_events) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 10 * 4096, 1ull << 30), 0);
    uint64_t h[10];
    for (int i = 0; i < 10; i++)
        h[i] = 0x1000u + (uint64_t)i;
    int32_t st[10];
    CHECK_EQ(bput(&c, &s, 0, 10, h, 1, 1, 0, st), 0); /* full */
    evlog *g = calloc(1, sizeof *g);
    take_events(&c, g);
    CHECK(g->n == 11 && g->ev[0].type == KVP_KVEV_CLEARED && g->ev[10].hash == h[9]);
    /* room for one more: key 0 is spilled */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, &s, 100, 1, 4096, 1, 0, NULL, &r), 0);
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    int sp = find_cmd(p, KVP_DISK_SPILL);
    CHECK(sp >= 0 && !strcmp(p->e[sp].key, "key-000000"));
    take_events(&c, g);
    CHECK_EQ(g->n, 0); /* still in DRAM, not yet on disk */
    report(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000000", 4096, 0xB10C0000u, p->e[sp].page,
           p->e[sp].gen);
    take_events(&c, g);
    CHECK(g->n == 2 && g->ev[0].type == KVP_KVEV_STORED && g->ev[0].medium == KVP_KVEV_DISK &&
          g->ev[0].hash == h[0] && !g->ev[0].has_parent && g->ev[1].type == KVP_KVEV_REMOVED &&
          g->ev[1].medium == KVP_KVEV_DRAM && g->ev[1].hash == h[0]);
    kvp_hprefix hp;
    CHECK_EQ(lookup(&c, &s, 0, h, 10, &hp), 0);
    CHECK(HP(hp, 0, 1, 10));
    /* a load back: DRAM again (the disk record stays) */
    CHECK_EQ(get_status(&c, &s, 0, NULL), KVP_EOBJECT_LOADING);
    for (int round = 0; round < 4; round++) { /* spills for room, then the load */
        take_push(&c, p);
        for (int i = 0; i < p->n; i++) {
            int k = atoi(p->e[i].key + 4);
            if (p->e[i].what == KVP_DISK_SPILL)
                report(&c, &s, 7, KVP_DISK_SPILLED, 0, p->e[i].key, 4096,
                       0xB10C0000u + (uint64_t)k, p->e[i].page, p->e[i].gen);
            else if (p->e[i].what == KVP_DISK_LOAD)
                report(&c, &s, 7, KVP_DISK_LOADED, 0, p->e[i].key, 4096,
                       0xB10C0000u + (uint64_t)k, p->e[i].page, p->e[i].gen);
        }
    }
    CHECK_EQ(get_status(&c, &s, 0, NULL), 0);
    take_events(&c, g);
    int dram0 = 0;
    for (int i = 0; i < g->n; i++)
        dram0 += g->ev[i].hash == h[0] && g->ev[i].type == KVP_KVEV_STORED &&
                 g->ev[i].medium == KVP_KVEV_DRAM;
    CHECK_EQ(dram0, 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* the node goes: every block it held is withdrawn, tier by tier */
    kvp_msg_kv_snapshot_resp sr;
    CHECK_EQ(snapshot(&c, &s, &sr), 0);
    uint32_t announced = sr.n;
    CHECK(announced >= 10);
    take_events(&c, g);
    uint64_t id = 7;
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&c.body, &ids);
    CHECK_EQ(call(&c, &s, KVP_OP_UNMOUNT_SEGMENT, 0), 0);
    take_events(&c, g);
    int removed = 0;
    for (int i = 0; i < g->n; i++)
        removed += g->ev[i].type == KVP_KVEV_REMOVED;
    CHECK_EQ((uint32_t)removed, announced);
    CHECK_EQ(snapshot(&c, &s, &sr), 0);
    CHECK_EQ(sr.n, 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    free(g);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Without kv_events the index still answers lookups; no events recorded. */
TEST(blocks_lookup_without_events_and_eviction)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 4 * 4096), 0);
    uint64_t h[6] = {11, 12, 13, 14, 15, 16};
    int32_t st[6];
    CHECK_EQ(bput(&c, &s, 0, 4, h, 1, 1, 0, st), 0);
    kvp_hprefix p;
    CHECK_EQ(lookup(&c, &s, 0, h, 6, &p), 0);
    CHECK(HP(p, 4, 0, 4));
    CHECK_EQ(bput(&c, &s, 4, 2, h + 4, 0, 1, 0, st), 0); /* evicts keys 0, 1 */
    CHECK_EQ(lookup(&c, &s, 0, h, 6, &p), 0);
    CHECK(HP(p, 0, 0, 0));
    CHECK_EQ(lookup(&c, &s, 0, h + 2, 4, &p), 0);
    CHECK(HP(p, 4, 0, 4));
    evlog *g = calloc(1, sizeof *g);
    take_events(&c, g);
    CHECK_EQ(g->n, 0);
    kvp_msg_kv_snapshot_resp r;
    CHECK_EQ(snapshot(&c, &s, &r), 0);
    CHECK(r.seq == 0 && r.n == 4);
    uint64_t sv[KVP_STAT__COUNT];
    stats(&c, sv);
    CHECK(sv[KVP_STAT_BLOCK_OBJECTS] == 4 && sv[KVP_STAT_KV_EVENTS] == 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(g);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* A standby learns the blocks from the leader's index stream: once it
 * leads and the node mounts again, the adopted objects are found by hash
 * and announced (after the new stream's AllBlocksCleared). */
TEST(blocks_survive_a_takeover)
{
    core a, b;
    CHECK(core_init(&a, with_events) == 0);
    CHECK(core_init(&b, with_events) == 0);
    sess s, n;
    CHECK_EQ(hello(&a, &s, 1), 0);
    CHECK_EQ(mount(&a, &s, 42, "n:1", 100 * 4096), 0);
    uint64_t h[3] = {0xAAA1, 0xAAA2, 0xAAA3};
    int32_t st[3];
    CHECK_EQ(bput(&a, &s, 0, 3, h, 1, 1, 2, st), 0);
    CHECK(st[0] == 0 && st[1] == 0 && st[2] == 0);
    kvp_buf snap;
    kvp_buf_init(&snap, 64 * MiB);
    CHECK_EQ(kvp_master_snapshot(a.m, &snap), 3);
    size_t at = 0;
    kvp_frame_hdr fh;
    const uint8_t *body;
    uint64_t seq;
    while (at < snap.len && kvp_frame_next(snap.data + at, snap.len - at, 1u << 30, &fh, &body) == 1) {
        CHECK_EQ(kvp_master_repl_apply(b.m, body, fh.body_len, &seq), 0);
        at += KVP_FRAME_HDR + fh.body_len;
    }
    kvp_buf_free(&snap);
    CHECK_EQ(kvp_master_check(b.m), 0);
    kvp_master_takeover(b.m, b.now);
    CHECK_EQ(hello(&b, &n, 7), 0);
    CHECK_EQ(mount(&b, &n, 42, "n:1", 100 * 4096), 0); /* its objects come back */
    kvp_hprefix p;
    CHECK_EQ(lookup(&b, &n, 2, h, 3, &p), 0);
    CHECK(HP(p, 3, 0, 3));
    evlog *g = calloc(1, sizeof *g);
    take_events(&b, g);
    CHECK(g->n == 4 && g->ev[0].type == KVP_KVEV_CLEARED); /* the new stream's start */
    for (int i = 1; i < g->n; i++) /* every adopted block, in DRAM, group 2 */
        CHECK(g->ev[i].type == KVP_KVEV_STORED && g->ev[i].medium == KVP_KVEV_DRAM &&
              g->ev[i].group == 2 && g->ev[i].block_size == 16 &&
              (g->ev[i].hash == h[0] || g->ev[i].hash == h[1] || g->ev[i].hash == h[2]));
    kvp_msg_kv_snapshot_resp r;
    CHECK_EQ(snapshot(&b, &n, &r), 0);
    CHECK_EQ(r.n, 3);
    CHECK_EQ(kvp_master_check(b.m), 0);
    free(g);
    kvp_master_sess_close(a.m, &s.s, a.now);
    kvp_master_sess_close(b.m, &n.s, b.now);
    core_free(&a);
    core_free(&b);
}

/* ------------------------------------------------- data-path reports */

/* A HEARTBEAT carrying a report of npaths paths (tallies t), flags as given. */
static int hb_report(core *c, sess *s, uint8_t npaths, const kvp_path_tally *t, uint8_t flags)
{
    kvp_msg_heartbeat h = {KVP_HB_REPORT_V1, npaths, {{0}}};
    for (unsigned i = 0; i < npaths && t; i++)
        h.paths[i] = t[i];
    kvp_enc_heartbeat(&c->body, &h);
    REQUIRE(c->body.err == 0);
    REQUIRE(call(c, s, KVP_OP_HEARTBEAT, flags) == 0);
    return c->status;
}

/* The pool's counters of one path equal {put_bytes, get_bytes, put_ops, get_ops}. */
static int path_is(core *c, int path, uint64_t pb, uint64_t gb, uint64_t po, uint64_t go)
{
    return stat_of(c, KVP_STAT_PATH(path, 0)) == pb && stat_of(c, KVP_STAT_PATH(path, 1)) == gb &&
           stat_of(c, KVP_STAT_PATH(path, 2)) == po && stat_of(c, KVP_STAT_PATH(path, 3)) == go;
}

/* Each client's last report counts once; a departed client's stays counted. */
TEST(heartbeat_reports_sum_and_outlive_their_client)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess a, b, b2;
    CHECK_EQ(hello(&c, &a, 1), 0);
    CHECK_EQ(hello(&c, &b, 2), 0);
    /* an empty heartbeat (a node, an older client) is a heartbeat */
    CHECK(call(&c, &a, KVP_OP_HEARTBEAT, 0) == 0);
    CHECK_EQ(c.status, 0);
    for (int p = 0; p < KVP_STAT_NPATHS; p++)
        CHECK(path_is(&c, p, 0, 0, 0, 0));
    /* a over shm, b over tcp: summed per path */
    kvp_path_tally ra[1] = {{4096, 8192, 1, 2}};
    kvp_path_tally rb[2] = {{0, 0, 0, 0}, {1000, 3000, 10, 30}};
    CHECK_EQ(hb_report(&c, &a, 1, ra, 0), 0);
    CHECK_EQ(hb_report(&c, &b, 2, rb, 0), 0);
    CHECK(path_is(&c, 0, 4096, 8192, 1, 2));
    CHECK(path_is(&c, 1, 1000, 3000, 10, 30));
    CHECK(path_is(&c, 2, 0, 0, 0, 0));
    /* reports are cumulative: the next one replaces the last */
    ra[0] = (kvp_path_tally){4096 + 512, 8192, 2, 2};
    CHECK_EQ(hb_report(&c, &a, 1, ra, 0), 0);
    CHECK(path_is(&c, 0, 4608, 8192, 2, 2));
    kvp_path_tally rb2[2] = {{100, 0, 1, 0}, {1000, 3000, 10, 30}};
    CHECK_EQ(hb_report(&c, &b, 2, rb2, 0), 0);
    CHECK(path_is(&c, 0, 4708, 8192, 3, 2));
    /* b leaves: its last report stays in the pool's figures */
    kvp_master_sess_close(c.m, &b.s, c.now);
    CHECK(path_is(&c, 0, 4708, 8192, 3, 2));
    CHECK(path_is(&c, 1, 1000, 3000, 10, 30));
    /* it comes back as a new client id reporting from its new base */
    CHECK_EQ(hello(&c, &b2, 3), 0);
    kvp_path_tally rb3[2] = {{0, 0, 0, 0}, {50, 60, 1, 1}};
    CHECK_EQ(hb_report(&c, &b2, 2, rb3, 0), 0);
    CHECK(path_is(&c, 1, 1050, 3060, 11, 31));
    /* a ONEWAY report (a closing client's last) is applied, unanswered */
    rb3[1] = (kvp_path_tally){70, 60, 2, 1};
    CHECK_EQ(hb_report(&c, &b2, 2, rb3, KVP_FLAG_ONEWAY), 0);
    CHECK_EQ(c.out.len, 0);
    CHECK(path_is(&c, 1, 1070, 3060, 12, 31));
    /* more paths than the master knows: the rest ignored */
    kvp_path_tally many[KVP_HB_MAX_PATHS];
    for (int i = 0; i < KVP_HB_MAX_PATHS; i++)
        many[i] = (kvp_path_tally){(uint64_t)i + 1, 0, 1, 0};
    CHECK_EQ(hb_report(&c, &b2, KVP_HB_MAX_PATHS, many, 0), 0);
    CHECK(path_is(&c, 0, 4608 + 100 + 1, 8192, 2 + 1 + 1, 2));
    CHECK(path_is(&c, 1, 1000 + 2, 3000, 10 + 1, 30));
    CHECK(path_is(&c, 2, 3, 0, 1, 0));
    /* a client dropped by its TTL keeps its report counted too */
    for (uint64_t t = 0; t <= c.cfg.client_ttl_ms + 1000; t += 500) {
        c.now += 500;
        CHECK(call(&c, &a, KVP_OP_HEARTBEAT, 0) == 0); /* a stays, b2 goes silent */
        kvp_master_tick(c.m, c.now);
    }
    CHECK(kvp_master_sess_dead(&b2.s));
    CHECK_EQ(stat_of(&c, KVP_STAT_CLIENTS), 1);
    CHECK(path_is(&c, 2, 3, 0, 1, 0));
    kvp_master_sess_close(c.m, &b2.s, c.now);
    CHECK(path_is(&c, 1, 1002, 3000, 11, 30));
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &a.s, c.now);
    core_free(&c);
}

/* Malformed reports are refused with PROTOCOL, change nothing, and the
 * session goes on. */
TEST(heartbeat_report_malformed_refused)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    kvp_path_tally r[1] = {{7, 8, 1, 1}};
    CHECK_EQ(hb_report(&c, &s, 1, r, 0), 0);
    uint8_t good[2 + KVP_HB_PATH_SIZE];
    kvp_buf gb = {good, 0, sizeof good, sizeof good, 0};
    kvp_enc_heartbeat(&gb, &(kvp_msg_heartbeat){KVP_HB_REPORT_V1, 1, {{99, 99, 9, 9}}});
    CHECK_EQ(gb.len, sizeof good);
    static const struct {
        int at, val;   /* byte to change (-1: none) and its value */
        int len_delta; /* bytes cut (< 0) or added (> 0) */
    } cases[] = {
        {0, 0, 0}, {0, 2, 0}, {0, 0xFF, 0}, {1, 0, 0}, {1, 2, 0}, {1, KVP_HB_MAX_PATHS + 1, 0},
        {1, 0xFF, 0}, {-1, 0, -1}, {-1, 0, 1}, {-1, 0, -(int)sizeof good + 1},
        {-1, 0, -(int)sizeof good + 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t body[sizeof good + 1] = {0};
        memcpy(body, good, sizeof good);
        if (cases[i].at >= 0)
            body[cases[i].at] = (uint8_t)cases[i].val;
        kvp_buf_put(&c.body, body, (size_t)((int)sizeof good + cases[i].len_delta));
        CHECK(call(&c, &s, KVP_OP_HEARTBEAT, 0) == 0);
        CHECK_EQ(c.status, KVP_EPROTOCOL);
        CHECK(!s.s.close_after);
        CHECK(path_is(&c, 0, 7, 8, 1, 1));
    }
    /* the session still works, the good body is taken */
    kvp_buf_put(&c.body, good, sizeof good);
    CHECK(call(&c, &s, KVP_OP_HEARTBEAT, 0) == 0);
    CHECK_EQ(c.status, 0);
    CHECK(path_is(&c, 0, 99, 99, 9, 9));
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* The figures are not replicated: a standby that takes over starts from 0
 * and learns each client's figures from its next report. */
TEST(heartbeat_reports_not_replicated)
{
    core a, b;
    CHECK(core_init(&a, NULL) == 0);
    CHECK(core_init(&b, NULL) == 0);
    sess s, t;
    CHECK_EQ(hello(&a, &s, 1), 0);
    kvp_path_tally r[1] = {{4096, 4096, 1, 1}};
    CHECK_EQ(hb_report(&a, &s, 1, r, 0), 0);
    kvp_buf snap;
    kvp_buf_init(&snap, 64 * MiB);
    kvp_master_snapshot(a.m, &snap);
    size_t at = 0;
    kvp_frame_hdr fh;
    const uint8_t *body;
    uint64_t seq;
    while (at < snap.len && kvp_frame_next(snap.data + at, snap.len - at, 1u << 30, &fh, &body) == 1) {
        CHECK_EQ(kvp_master_repl_apply(b.m, body, fh.body_len, &seq), 0);
        at += KVP_FRAME_HDR + fh.body_len;
    }
    kvp_buf_free(&snap);
    kvp_master_takeover(b.m, b.now);
    CHECK(path_is(&b, 0, 0, 0, 0, 0));
    CHECK_EQ(hello(&b, &t, 2), 0);
    CHECK_EQ(hb_report(&b, &t, 1, r, 0), 0); /* the client's whole life, to a new master */
    CHECK(path_is(&b, 0, 4096, 4096, 1, 1));
    kvp_master_sess_close(a.m, &s.s, a.now);
    kvp_master_sess_close(b.m, &t.s, b.now);
    core_free(&a);
    core_free(&b);
}

/* ------------------------------------------------------------ EXIST_LEASE */

/* EXIST_LEASE of the keys idx[0..n) (key_of): the whole-request status;
 * the answer in *r. */
static int xlease(core *c, sess *s, const int *idx, int n, kvp_msg_exist_lease_resp *r)
{
    char kb[16][32];
    kvp_bytes keys[16];
    REQUIRE(n <= 16);
    for (int i = 0; i < n; i++)
        keys[i] = key_of(kb[i], 32, idx[i]);
    kvp_msg_keys m = {{NULL, 0}, (uint32_t)n, keys};
    kvp_enc_keys(&c->body, &m);
    REQUIRE(call(c, s, KVP_OP_EXIST_LEASE, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    REQUIRE(kvp_dec_exist_lease_resp(c->resp, c->resp_len, &l, &c->ra, r) == 0);
    REQUIRE(r->n == (uint32_t)n);
    return 0;
}

/* GET of key i: its lease id (the answer must be a hit). */
static uint64_t get_lease(core *c, sess *s, int i)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_GET, i, 1, NULL, &code) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_get_resp g;
    REQUIRE(kvp_dec_get_resp(c->resp, c->resp_len, &l, &c->ra, &g) == 0 && g.n == 1);
    REQUIRE(g.results[0].status == 0);
    return g.results[0].lease_id;
}

static int32_t release(core *c, sess *s, int i, uint64_t lid)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_RELEASE, i, 1, &lid, &code) == 0);
    return code;
}

static int32_t remove_one(core *c, sess *s, int i)
{
    int32_t code;
    REQUIRE(keys_op(c, s, KVP_OP_REMOVE, i, 1, NULL, &code) == 0);
    return code;
}

/* What a lookup answered present stays through eviction pressure until a
 * GET takes its hold over and releases it, or until lease_ttl. */
TEST(exist_lease_holds_against_eviction)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    /* 100 pages: exactly 10 objects of 10 pages, keys 0..9 */
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 10, 10 * 4096), 0);
    kvp_msg_exist_lease_resp r;
    CHECK_EQ(xlease(&c, &s, (const int[]){0, 1, 2, 50}, 4, &r), 0);
    CHECK_EQ(r.lease_ttl_ms, (uint32_t)c.cfg.lease_ttl_ms);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(r.ents[i].state, KVP_XL_LEASED);
        CHECK_EQ(r.ents[i].size, 10 * 4096);
    }
    CHECK_EQ(r.ents[3].state, KVP_XL_ABSENT);
    CHECK_EQ(r.ents[3].size, 0);
    CHECK_EQ(r.ents[3].lease_id, 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 3);
    CHECK_EQ(stat_of(&c, KVP_STAT_HITS), 0); /* a lookup is not a hit */
    /* eviction pressure: 0..2 are the least recently used, yet stay */
    CHECK_EQ(put(&c, &s, 100, 7, 10 * 4096), 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(exists(&c, &s, i), 1);
    for (int i = 3; i < 10; i++)
        CHECK_EQ(exists(&c, &s, i), 0);
    kvp_msg_put_start_resp pr;
    CHECK_EQ(put_start(&c, &s, 200, 8, 10 * 4096, 1, 0, NULL, &pr), 0);
    for (int i = 0; i < 7; i++) /* the 7 evictable ones make room for 7 ... */
        CHECK_EQ(pr.results[i].status, 0);
    /* ... and nothing more is evictable: the held ones are not */
    CHECK_EQ(pr.results[7].status, KVP_ENO_AVAILABLE_HANDLE);
    uint64_t cs[7] = {1, 2, 3, 4, 5, 6, 7};
    int32_t codes[7];
    CHECK_EQ(keys_op(&c, &s, KVP_OP_PUT_END, 200, 7, cs, codes), 0);
    CHECK_EQ(remove_one(&c, &s, 0), KVP_EOBJECT_HAS_LEASE);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* the load's GET takes key 1's hold over (no lease more), and its
     * RELEASE leaves nothing: evictable, removable at once */
    uint64_t lid = get_lease(&c, &s, 1);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 3);
    CHECK_EQ(stat_of(&c, KVP_STAT_HITS), 1);
    CHECK_EQ(release(&c, &s, 1, lid), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 2);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(remove_one(&c, &s, 1), 0);
    /* lease_ttl after the last lease granted, the holds nobody took end */
    c.now += c.cfg.lease_ttl_ms - 1;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(remove_one(&c, &s, 2), KVP_EOBJECT_HAS_LEASE);
    c.now += 2;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* evictable again: a put of a pool's worth takes them too */
    CHECK_EQ(put(&c, &s, 300, 10, 10 * 4096), 0);
    CHECK_EQ(exists(&c, &s, 0), 0);
    CHECK_EQ(exists(&c, &s, 2), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Holds count per lookup and per time a key is named; GETs take them over
 * one each, further GETs add leases of their own; expiry ends them all. */
TEST(exist_lease_holds_are_counted_and_taken_over)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s, t;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(hello(&c, &t, 2), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 2, 4096), 0);
    kvp_msg_exist_lease_resp r;
    /* two readers of key 0 (named twice), one lookup more from another client */
    CHECK_EQ(xlease(&c, &s, (const int[]){0, 0}, 2, &r), 0);
    CHECK_EQ(r.ents[0].state, KVP_XL_LEASED);
    CHECK_EQ(r.ents[1].lease_id, r.ents[0].lease_id); /* one epoch */
    uint64_t ep0 = r.ents[0].lease_id;
    CHECK_EQ(xlease(&c, &t, (const int[]){0}, 1, &r), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 3);
    /* three GETs take the three holds over; a fourth adds a lease */
    uint64_t lid[4];
    for (int i = 0; i < 4; i++)
        lid[i] = get_lease(&c, i % 2 ? &t : &s, 0);
    CHECK_EQ(lid[3], ep0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 4);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(remove_one(&c, &s, 0), KVP_EOBJECT_HAS_LEASE);
        CHECK_EQ(release(&c, i % 2 ? &t : &s, 0, lid[i]), 0);
        CHECK_EQ(kvp_master_check(c.m), 0);
    }
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    CHECK_EQ(release(&c, &s, 0, lid[0]), KVP_ELEASE_EXPIRED); /* one too many */
    /* a lookup's client may release its hold by the lease id it was given */
    CHECK_EQ(xlease(&c, &s, (const int[]){1}, 1, &r), 0);
    uint64_t ep1 = r.ents[0].lease_id;
    CHECK_EQ(remove_one(&c, &s, 1), KVP_EOBJECT_HAS_LEASE);
    CHECK_EQ(release(&c, &s, 1, ep1), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* a hold and a GET's lease on key 0; a RELEASE ends the GET's (the
     * hold is still there for its reader's GET to take over) */
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    uint64_t g = get_lease(&c, &t, 0); /* took it over */
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 2);
    CHECK_EQ(release(&c, &t, 0, g), 0);
    CHECK_EQ(remove_one(&c, &s, 0), KVP_EOBJECT_HAS_LEASE);
    CHECK_EQ(release(&c, &s, 0, get_lease(&c, &s, 0)), 0);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    /* holds renew the deadline like any lease, and end with the epoch */
    CHECK_EQ(xlease(&c, &s, (const int[]){0, 1}, 2, &r), 0);
    uint64_t epoch = r.ents[0].lease_id;
    c.now += c.cfg.lease_ttl_ms / 2;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    c.now += c.cfg.lease_ttl_ms / 2 + 1;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(remove_one(&c, &s, 1), 0);                     /* its lease ended */
    CHECK_EQ(remove_one(&c, &s, 0), KVP_EOBJECT_HAS_LEASE); /* renewed */
    c.now += c.cfg.lease_ttl_ms;
    kvp_master_tick(c.m, c.now);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    CHECK_EQ(release(&c, &s, 0, epoch), KVP_ELEASE_EXPIRED);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &t.s, c.now);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Not held back: a REPLACE put, a forced REMOVE. Disk-only objects are
 * answered with their size and no lease. Bad requests are refused whole. */
TEST(exist_lease_replace_remove_and_bad_requests)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    kvp_master_sess_open(c.m, &s.s);
    kvp_msg_keys none = {{NULL, 0}, 0, NULL};
    kvp_enc_keys(&c.body, &none);
    CHECK(call(&c, &s, KVP_OP_EXIST_LEASE, 0) == 0);
    CHECK_EQ(c.status, KVP_ENO_HELLO);
    kvp_master_sess_close(c.m, &s.s, c.now);
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put_one(&c, &s, 0, 4096, 0, 11), 0);
    CHECK_EQ(put(&c, &s, 1, 1, 4096), 0);
    kvp_msg_exist_lease_resp r;
    CHECK_EQ(xlease(&c, &s, (const int[]){0, 1}, 2, &r), 0);
    CHECK_EQ(put_one(&c, &s, 0, 8192, KVP_PUT_F_REPLACE, 22), 0);
    CHECK_EQ(get_csum(&c, &s, 0), 22);
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    CHECK_EQ(r.ents[0].size, 8192); /* the new value's size */
    uint64_t force = 1;
    int32_t code;
    CHECK_EQ(keys_op(&c, &s, KVP_OP_REMOVE, 1, 1, &force, &code), 0);
    CHECK_EQ(code, 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    /* a pending key is absent */
    kvp_msg_put_start_resp pr;
    CHECK_EQ(put_start(&c, &s, 5, 1, 4096, 1, 0, NULL, &pr), 0);
    CHECK_EQ(xlease(&c, &s, (const int[]){5}, 1, &r), 0);
    CHECK_EQ(r.ents[0].state, KVP_XL_ABSENT);
    /* truncated body, an absurd count, trailing bytes: PROTOCOL, nothing leased */
    uint64_t before = stat_of(&c, KVP_STAT_LEASES);
    kvp_bytes k = {(const uint8_t *)"key-000000", 10};
    kvp_msg_keys one = {{NULL, 0}, 1, &k};
    kvp_enc_keys(&c.body, &one);
    c.body.len -= 3;
    CHECK(call(&c, &s, KVP_OP_EXIST_LEASE, 0) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    kvp_buf_u32(&c.body, 0);
    kvp_buf_u32(&c.body, 0xFFFFFFFFu);
    kvp_buf_u32(&c.body, 10);
    kvp_buf_put(&c.body, "key-000000", 10);
    CHECK(call(&c, &s, KVP_OP_EXIST_LEASE, 0) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    kvp_enc_keys(&c.body, &one);
    kvp_buf_u8(&c.body, 0);
    CHECK(call(&c, &s, KVP_OP_EXIST_LEASE, 0) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), before);
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

static void small_frame(kvp_config *cfg) { cfg->max_frame = 64 * 1024; }

/* An answer that would not fit max_frame: TOO_LARGE, nothing leased. */
TEST(exist_lease_answer_too_large)
{
    core c;
    CHECK(core_init(&c, small_frame) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "n:1", 100 * 4096), 0);
    CHECK_EQ(put(&c, &s, 0, 1, 4096), 0);
    enum { N = 5000 }; /* 5000 x 17 > 64 KiB, a request of 5000 x 5 bytes fits */
    kvp_bytes *keys = calloc(N, sizeof *keys);
    char kb[16];
    int len = snprintf(kb, sizeof kb, "key-000000");
    for (int i = 0; i < N; i++)
        keys[i] = (kvp_bytes){(const uint8_t *)kb, (uint32_t)(i ? 1 : len)};
    kvp_msg_keys m = {{NULL, 0}, N, keys};
    kvp_enc_keys(&c.body, &m);
    CHECK(c.body.len < c.cfg.max_frame);
    CHECK(call(&c, &s, KVP_OP_EXIST_LEASE, 0) == 0);
    CHECK_EQ(c.status, KVP_ETOO_LARGE);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 0);
    free(keys);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* An object only on the SSD tier (and one being staged back) is present
 * with its size, and not leased: a GET stages it. */
TEST(exist_lease_disk_only_is_present_unleased)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount_disk(&c, &s, 7, "n:1", 100 * 4096, 1ull << 30), 0);
    CHECK_EQ(put(&c, &s, 0, 10, 10 * 4096), 0);
    kvp_msg_put_start_resp pr;
    CHECK_EQ(put_start(&c, &s, 100, 1, 10 * 4096, 1, 0, NULL, &pr), 0); /* spills key 0 */
    pushed *p = calloc(1, sizeof *p);
    take_push(&c, p);
    CHECK_EQ(p->n, 1);
    CHECK_EQ(p->e[0].what, KVP_DISK_SPILL);
    /* while the spill is in flight the DRAM copy is readable: leased */
    kvp_msg_exist_lease_resp r;
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    CHECK_EQ(r.ents[0].state, KVP_XL_LEASED);
    CHECK_EQ(release(&c, &s, 0, r.ents[0].lease_id), 0);
    report(&c, &s, 7, KVP_DISK_SPILLED, 0, "key-000000", 10 * 4096, 0xC0DE0000u, p->e[0].page,
           p->e[0].gen);
    CHECK_EQ(xlease(&c, &s, (const int[]){0, 1}, 2, &r), 0);
    CHECK_EQ(r.ents[0].state, KVP_XL_DISK);
    CHECK_EQ(r.ents[0].size, 10 * 4096);
    CHECK_EQ(r.ents[0].lease_id, 0);
    CHECK_EQ(r.ents[1].state, KVP_XL_LEASED);
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 1);
    CHECK_EQ(get_status(&c, &s, 0, NULL), KVP_EOBJECT_LOADING);
    CHECK_EQ(xlease(&c, &s, (const int[]){0}, 1, &r), 0);
    CHECK_EQ(r.ents[0].state, KVP_XL_DISK); /* being staged: not readable yet */
    CHECK_EQ(stat_of(&c, KVP_STAT_LEASES), 1);
    CHECK_EQ(kvp_master_check(c.m), 0);
    free(p);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* ------------------------------------------------- configurations (CONFIGS) */

static int tremove(core *c, sess *s, const char *tenant, const char *key)
{
    kvp_bytes k = {(const uint8_t *)key, (uint32_t)strlen(key)};
    kvp_msg_remove m = {{(const uint8_t *)tenant, (uint32_t)strlen(tenant)}, 1, 1, &k};
    kvp_enc_remove(&c->body, &m);
    REQUIRE(call(c, s, KVP_OP_REMOVE, 0) == 0);
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &res) == 0 && res.n == 1);
    return res.codes[0];
}

static int configs(core *c, sess *s, kvp_msg_configs_resp *r)
{
    REQUIRE(call(c, s, KVP_OP_CONFIGS, 0) == 0);
    if (c->status)
        return c->status;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    REQUIRE(kvp_dec_configs_resp(c->resp, c->resp_len, &l, &c->ra, r) == 0);
    return 0;
}

/* The row of (tenant, name, fp) in r ("" fp: the tenant's other), or NULL. */
static const kvp_config_stat *config_row(const kvp_msg_configs_resp *r, const char *tenant,
                                         const char *name, const char *fp)
{
    for (uint32_t i = 0; i < r->n; i++) {
        const kvp_config_stat *x = &r->rows[i];
        if (x->tenant.len == strlen(tenant) && !memcmp(x->tenant.p, tenant, x->tenant.len) &&
            x->name.len == strlen(name) && !memcmp(x->name.p, name, x->name.len) &&
            x->fp.len == strlen(fp) && !memcmp(x->fp.p, fp, x->fp.len))
            return x;
    }
    return NULL;
}

#define FPA "0123456789abcdef"
#define FPB "fedcba9876543210"
#define TAIL "@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"

/* Published objects are counted per (tenant, "[prefix@]model", fingerprint)
 * of their keys; keys without a well-formed @cfg: are not; removal and
 * replacement keep the counts exact (kvp_master_check recounts them). */
TEST(configs_count_objects_per_fingerprint)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "a:1", 64 * MiB), 0);
    kvp_msg_configs_resp r;
    CHECK_EQ(configs(&c, &s, &r), 0);
    CHECK_EQ(r.n, 0);
    CHECK_EQ(tput(&c, &s, "", "Model@cfg:" FPA TAIL "aa", 4096), 0);
    CHECK_EQ(tput(&c, &s, "", "Model@cfg:" FPA TAIL "bb", 1000), 0);
    CHECK_EQ(tput(&c, &s, "", "Model@cfg:" FPA "@kvpool-config", 10), 0); /* its descriptor */
    CHECK_EQ(tput(&c, &s, "", "pre@Model@cfg:" FPA TAIL "aa", 100), 0);  /* another prefix */
    CHECK_EQ(tput(&c, &s, "", "Model@cfg:" FPB TAIL "aa", 4096), 0);
    CHECK_EQ(tput(&c, &s, "t2", "Model@cfg:" FPA TAIL "aa", 7), 0);      /* another tenant */
    /* none of these name a configuration */
    static const char *const plain[] = {
        "Model" TAIL "aa", "Model@cfg:0123456789a" TAIL "aa", "Model@cfg:0123456789ABCDEF" TAIL,
        "Model@cfg:" FPA "x@tp_rank:0", "Model@cfg:" FPA FPA "0", "@cfg:", "x@cfg:" FPA "@cfg:zz",
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        CHECK_EQ(tput(&c, &s, "", plain[i], 64), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(configs(&c, &s, &r), 0);
    CHECK_EQ(r.n, 4);
    const kvp_config_stat *a = config_row(&r, "default", "Model", FPA);
    CHECK(a && a->objects == 3 && a->bytes == 4096 + 1000 + 10);
    a = config_row(&r, "default", "pre@Model", FPA);
    CHECK(a && a->objects == 1 && a->bytes == 100);
    a = config_row(&r, "default", "Model", FPB);
    CHECK(a && a->objects == 1 && a->bytes == 4096);
    a = config_row(&r, "t2", "Model", FPA);
    CHECK(a && a->objects == 1 && a->bytes == 7);
    /* a replacement is counted once, with its new size */
    uint64_t sz = 2000;
    kvp_bytes k = {(const uint8_t *)"Model@cfg:" FPA TAIL "bb", (uint32_t)strlen("Model@cfg:" FPA TAIL "bb")};
    kvp_msg_put_start ps = {{NULL, 0}, 1, KVP_PUT_F_REPLACE, 0, {NULL, 0}, 1, &k, &sz, NULL};
    kvp_enc_put_start(&c.body, &ps);
    CHECK(call(&c, &s, KVP_OP_PUT_START, 0) == 0 && c.status == 0);
    uint64_t cs = 5;
    kvp_msg_put_end pe = {{NULL, 0}, 1, &k, &cs};
    kvp_enc_put_end(&c.body, &pe);
    CHECK(call(&c, &s, KVP_OP_PUT_END, 0) == 0 && c.status == 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(configs(&c, &s, &r), 0);
    a = config_row(&r, "default", "Model", FPA);
    CHECK(a && a->objects == 3 && a->bytes == 4096 + 2000 + 10);
    /* removed: gone from the count; a configuration at 0 objects is not listed */
    CHECK_EQ(tremove(&c, &s, "", "Model@cfg:" FPB TAIL "aa"), 0);
    CHECK_EQ(tremove(&c, &s, "t2", "Model@cfg:" FPA TAIL "aa"), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(configs(&c, &s, &r), 0);
    CHECK_EQ(r.n, 2);
    CHECK(config_row(&r, "default", "Model", FPB) == NULL);
    CHECK(config_row(&r, "t2", "Model", FPA) == NULL);
    /* CONFIGS takes no body */
    kvp_buf_u32(&c.body, 0);
    CHECK(call(&c, &s, KVP_OP_CONFIGS, 0) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Past KVP_CFGTAB_MAX (256) configurations, the rest is counted in the
 * tenant's "other" row; a configuration gets a row again only once its
 * tenant's other is empty, reusing a row at 0 objects. */
TEST(configs_past_the_row_limit_are_other)
{
    core c;
    CHECK(core_init(&c, NULL) == 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 1), 0);
    CHECK_EQ(mount(&c, &s, 1, "a:1", 64 * MiB), 0);
    char key[128];
    enum { ROWS = 256, MORE = 5 };
    for (int i = 0; i < ROWS + MORE; i++) {
        snprintf(key, sizeof key, "m@cfg:%016x" TAIL "aa", i);
        CHECK_EQ(tput(&c, &s, "", key, 100), 0);
    }
    CHECK_EQ(kvp_master_check(c.m), 0);
    kvp_msg_configs_resp r;
    CHECK_EQ(configs(&c, &s, &r), 0);
    CHECK_EQ(r.n, ROWS + 1);
    const kvp_config_stat *o = config_row(&r, "default", "", "");
    CHECK(o && o->objects == MORE && o->bytes == MORE * 100);
    /* a row emptied: a new configuration still goes to other while it is not empty */
    CHECK_EQ(tremove(&c, &s, "", "m@cfg:0000000000000000" TAIL "aa"), 0);
    CHECK_EQ(tput(&c, &s, "", "m@cfg:" FPB TAIL "aa", 100), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(configs(&c, &s, &r), 0);
    o = config_row(&r, "default", "", "");
    CHECK(o && o->objects == MORE + 1);
    CHECK(config_row(&r, "default", "m", FPB) == NULL);
    /* other emptied: the next new configuration takes the idle row */
    for (int i = ROWS; i < ROWS + MORE; i++) {
        snprintf(key, sizeof key, "m@cfg:%016x" TAIL "aa", i);
        CHECK_EQ(tremove(&c, &s, "", key), 0);
    }
    CHECK_EQ(tremove(&c, &s, "", "m@cfg:" FPB TAIL "aa"), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(tput(&c, &s, "", "m@cfg:" FPA TAIL "aa", 100), 0);
    CHECK_EQ(tput(&c, &s, "", "m@cfg:" FPA TAIL "bb", 100), 0);
    CHECK_EQ(kvp_master_check(c.m), 0);
    CHECK_EQ(configs(&c, &s, &r), 0);
    CHECK_EQ(r.n, ROWS);
    CHECK(config_row(&r, "default", "", "") == NULL);
    const kvp_config_stat *a = config_row(&r, "default", "m", FPA);
    CHECK(a && a->objects == 2 && a->bytes == 200);
    kvp_master_sess_close(c.m, &s.s, c.now);
    core_free(&c);
}

/* Two segments whose 255-byte names differ in the last byte: /metrics
 * gives each its own series, every one with its tier label, values
 * bounded (a prefix and a hash). */
TEST(long_segment_names_keep_distinct_metric_series)
{
    core c;
    CHECK_EQ(core_init(&c, NULL), 0);
    sess s;
    CHECK_EQ(hello(&c, &s, 7), 0);
    char a[256], b[256];
    memset(a, 'n', 252); /* HOST:PORT, the node's tcp endpoint too */
    memcpy(a + 252, ":11", 4);
    memcpy(b, a, sizeof a);
    b[254] = '2';
    CHECK_EQ(mount(&c, &s, 1, a, 8 * MiB), 0);
    CHECK_EQ(mount(&c, &s, 2, b, 16 * MiB), 0);
    kvp_mstatus *st = kvp_mstatus_new("127.0.0.1:1");
    CHECK(st != NULL);
    kvp_msvc svc;
    memset(&svc, 0, sizeof svc);
    kvp_mstatus_publish(st, c.m, &svc, c.now);
    kvp_buf out;
    kvp_buf_init(&out, 16 * MiB);
    const char *ctype = NULL;
    CHECK_EQ(kvp_mstatus_metrics(st, &out, &ctype), 200);
    kvp_buf_u8(&out, 0);
    const char *t = (const char *)out.data;
    /* kvpool_segment_capacity_bytes: 4 samples, 4 distinct label sets, each
     * with tier, the values 8 MiB and 16 MiB in DRAM */
    const char *fam = "\nkvpool_segment_capacity_bytes{";
    char seen[4][256];
    int n = 0, dram8 = 0, dram16 = 0;
    for (const char *p = strstr(t, fam); p && n < 4; p = strstr(p + 1, fam)) {
        const char *lb = p + strlen(fam), *end = strchr(lb, '}');
        CHECK(end && (size_t)(end - lb) < sizeof seen[0]);
        memcpy(seen[n], lb, (size_t)(end - lb));
        seen[n][end - lb] = '\0';
        CHECK(strstr(seen[n], ",tier=\"dram\"") || strstr(seen[n], ",tier=\"disk\""));
        CHECK(strlen(seen[n]) <= strlen("segment=\"\",tier=\"dram\"") + KVP_PROM_VALUE_MAX);
        for (int j = 0; j < n; j++)
            CHECK(strcmp(seen[j], seen[n]) != 0);
        if (strstr(seen[n], "dram")) {
            dram8 += atoll(end + 2) == (long long)(8 * MiB);
            dram16 += atoll(end + 2) == (long long)(16 * MiB);
        }
        n++;
    }
    CHECK_EQ(n, 4);
    CHECK(dram8 == 1 && dram16 == 1);
    kvp_buf_free(&out);
    kvp_mstatus_free(st);
    core_free(&c);
}
