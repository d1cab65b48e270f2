/*
 * test_master_integ.c -- `kvpool master` as a real process, driven over TCP
 * with kvp_rpc: every operation, 10k-key batches, eviction, leases, writer
 * disconnect, liveness, hostile frames, pipelining, restart, CLI.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "net/net.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

#define MiB (1024ull * 1024)
#define PAGE 4096ull

/* ------------------------------------------------------------ client side */

typedef struct cl {
    kvp_rpc *r;
    kvp_buf body;
    kvp_arena a;
    kvp_proto_limits lim;
    int32_t status;
    const uint8_t *resp;
    uint32_t resp_len;
    struct {
        uint64_t seg, seq, acked; /* SEG_FREED seen, acknowledged (as a node) */
    } ack[4];
} cl;

/* As a storage node does: SEG_FREED notices are acknowledged (cl_call),
 * else the master never reuses the space they quarantine. */
static void cl_push(void *ctx, const kvp_frame_hdr *h, const uint8_t *body)
{
    cl *c = ctx;
    kvp_msg_seg_freed f;
    kvp_arena a;
    kvp_arena_init(&a, (size_t)h->body_len + 4096);
    if (h->op == KVP_OP_SEG_FREED && kvp_dec_seg_freed(body, h->body_len, &c->lim, &a, &f) == 0)
        for (int i = 0; i < 4; i++)
            if (c->ack[i].seg == f.segment_id || c->ack[i].seg == 0) {
                c->ack[i].seg = f.segment_id;
                if (f.seq > c->ack[i].seq)
                    c->ack[i].seq = f.seq;
                break;
            }
    kvp_arena_free(&a);
}

static int cl_open_opts(cl *c, const char *addr, const kvp_rpc_opts *o)
{
    memset(c, 0, sizeof *c);
    kvp_buf_init(&c->body, 256 * MiB);
    kvp_arena_init(&c->a, 256 * MiB);
    kvp_proto_limits_default(&c->lim);
    char err[256];
    kvp_rpc_opts oo = o ? *o : (kvp_rpc_opts){0};
    if (!oo.on_push) {
        oo.on_push = cl_push;
        oo.push_ctx = c;
    }
    int rc = kvp_rpc_open(addr, &oo, &c->r, err, sizeof err);
    if (rc && rc != KVP_EAUTH) /* refusals are expected by some tests */
        fprintf(stderr, "    kvp_rpc_open(%s): %s\n", addr, err);
    return rc;
}

static int cl_open(cl *c, const char *addr) { return cl_open_opts(c, addr, NULL); }

static void cl_close(cl *c)
{
    kvp_rpc_close(c->r);
    c->r = NULL;
    kvp_buf_free(&c->body);
    kvp_arena_free(&c->a);
}

/* Sends c->body as op; the answer is in c->status / c->resp. 0 or an rpc error. */
static int cl_call(cl *c, uint16_t op)
{
    kvp_arena_reset(&c->a);
    if (c->body.err) {
        kvp_buf_reset(&c->body);
        return KVP_EINTERNAL_ERROR;
    }
    /* the notices earlier answers brought: acknowledged before this request */
    if (kvp_rpc_poll(c->r, 0) == 0)
        for (int i = 0; i < 4; i++)
            if (c->ack[i].seq > c->ack[i].acked) {
                uint8_t b[32];
                kvp_buf ab = {b, 0, sizeof b, sizeof b, 0};
                uint64_t v[2] = {c->ack[i].seg, c->ack[i].seq};
                kvp_msg_ids ids = {2, v};
                kvp_enc_ids(&ab, &ids);
                kvp_rpc_queue(c->r, KVP_OP_SEG_FREED_ACK, KVP_FLAG_ONEWAY, b, ab.len);
                c->ack[i].acked = c->ack[i].seq;
            }
    int rc = kvp_rpc_call(c->r, op, c->body.data, c->body.len, &c->status, &c->resp, &c->resp_len);
    kvp_buf_reset(&c->body);
    return rc;
}

static kvp_bytes bstr(const char *s) { return (kvp_bytes){(const uint8_t *)s, s ? (uint32_t)strlen(s) : 0}; }

static int mount(cl *c, uint64_t id, const char *name, uint64_t cap)
{
    kvp_endpoint ep = {bstr("tcp"), bstr(name)};
    kvp_seg_desc d = {id, bstr(name), cap, 1, &ep, 0, 1, 0};
    kvp_msg_mount mm = {1, &d};
    kvp_enc_mount(&c->body, &mm);
    REQUIRE(cl_call(c, KVP_OP_MOUNT_SEGMENT) == 0);
    REQUIRE(c->status == 0);
    kvp_msg_results r;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &c->lim, &c->a, &r) == 0 && r.n == 1);
    return r.codes[0];
}

typedef struct keyset {
    char (*kb)[32];
    kvp_bytes *keys;
} keyset;

static void keys_make(keyset *k, int from, int n)
{
    k->kb = malloc((size_t)(n ? n : 1) * 32);
    k->keys = malloc((size_t)(n ? n : 1) * sizeof *k->keys);
    for (int i = 0; i < n; i++) {
        int len = snprintf(k->kb[i], 32, "key-%06d", from + i);
        k->keys[i] = (kvp_bytes){(const uint8_t *)k->kb[i], (uint32_t)len};
    }
}

static void keys_free(keyset *k)
{
    free(k->kb);
    free(k->keys);
}

/* PUT_START of keys [from, from+n), one size each. Returns the frame status;
 * results in *r (valid until the next call). */
static int put_start(cl *c, int from, int n, uint64_t size, uint32_t flags, const char *pref,
                     kvp_msg_put_start_resp *r)
{
    keyset k;
    keys_make(&k, from, n);
    uint64_t *sizes = malloc((size_t)(n ? n : 1) * sizeof *sizes);
    for (int i = 0; i < n; i++)
        sizes[i] = size;
    kvp_msg_put_start m = {{NULL, 0}, 1, flags, 0, bstr(pref), (uint32_t)n, k.keys, sizes, NULL};
    kvp_enc_put_start(&c->body, &m);
    int rc = cl_call(c, KVP_OP_PUT_START);
    keys_free(&k);
    free(sizes);
    REQUIRE(rc == 0);
    if (c->status)
        return c->status;
    REQUIRE(kvp_dec_put_start_resp(c->resp, c->resp_len, &c->lim, &c->a, r) == 0);
    REQUIRE(r->n == (uint32_t)n);
    return 0;
}

/* Encodes the request of op for keys [from, from+n) into c->body.
 * u64s: PUT_END checksums / RELEASE lease ids; REMOVE: non-NULL = force. */
static void enc_keys_op(cl *c, uint16_t op, const keyset *k, int n, const uint64_t *u64s)
{
    if (op == KVP_OP_PUT_END || op == KVP_OP_RELEASE) {
        uint64_t *vals = calloc((size_t)(n ? n : 1), sizeof *vals);
        if (u64s)
            memcpy(vals, u64s, (size_t)n * sizeof *vals);
        kvp_msg_put_end m = {{NULL, 0}, (uint32_t)n, k->keys, vals};
        kvp_enc_put_end(&c->body, &m);
        free(vals);
    } else if (op == KVP_OP_REMOVE) {
        kvp_msg_remove m = {{NULL, 0}, u64s ? 1 : 0, (uint32_t)n, k->keys};
        kvp_enc_remove(&c->body, &m);
    } else {
        kvp_msg_keys m = {{NULL, 0}, (uint32_t)n, k->keys};
        kvp_enc_keys(&c->body, &m);
    }
}

/* Runs op on keys [from, from+n); per-key codes into codes (PREFIX: codes[0]
 * = count; GET: caller decodes c->resp). Returns the frame status. */
static int keys_op(cl *c, uint16_t op, int from, int n, const uint64_t *u64s, int32_t *codes)
{
    keyset k;
    keys_make(&k, from, n);
    enc_keys_op(c, op, &k, n, u64s);
    int rc = cl_call(c, op);
    keys_free(&k);
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
        return 0;
    kvp_msg_results r;
    REQUIRE(kvp_dec_results(c->resp, c->resp_len, &c->lim, &c->a, &r) == 0);
    REQUIRE(r.n == (uint32_t)n);
    memcpy(codes, r.codes, (size_t)n * sizeof *codes);
    return 0;
}

static uint64_t csum_of(int i) { return 0xC0DE000000ull + (uint64_t)i; }

/* PUT_START + PUT_END of keys [from, from+n); 0 when every key succeeded. */
static int put(cl *c, int from, int n, uint64_t size, const char *pref)
{
    kvp_msg_put_start_resp r;
    REQUIRE(put_start(c, from, n, size, 0, pref, &r) == 0);
    for (int i = 0; i < n; i++)
        if (r.results[i].status != 0)
            return r.results[i].status;
    uint64_t *cs = malloc((size_t)n * sizeof *cs);
    int32_t *codes = malloc((size_t)n * sizeof *codes);
    for (int i = 0; i < n; i++)
        cs[i] = csum_of(from + i);
    int rc = keys_op(c, KVP_OP_PUT_END, from, n, cs, codes);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = codes[i];
    free(cs);
    free(codes);
    return rc;
}

static int exists(cl *c, int i)
{
    int32_t code;
    REQUIRE(keys_op(c, KVP_OP_EXIST, i, 1, NULL, &code) == 0);
    return code;
}

/* GET of one key: its result in *g (status 0 or per-key code). */
static int get1(cl *c, int i, kvp_get_result *g)
{
    int32_t dummy;
    REQUIRE(keys_op(c, KVP_OP_GET, i, 1, NULL, &dummy) == 0);
    kvp_msg_get_resp gr;
    REQUIRE(kvp_dec_get_resp(c->resp, c->resp_len, &c->lim, &c->a, &gr) == 0 && gr.n == 1);
    *g = gr.results[0];
    return 0;
}

static int stats(cl *c, uint64_t st[KVP_STAT__COUNT], kvp_msg_stats_resp *full)
{
    REQUIRE(cl_call(c, KVP_OP_STATS) == 0);
    REQUIRE(c->status == 0);
    kvp_msg_stats_resp sr;
    REQUIRE(kvp_dec_stats_resp(c->resp, c->resp_len, &c->lim, &c->a, &sr) == 0);
    REQUIRE(sr.n_counters >= KVP_STAT__COUNT);
    memcpy(st, sr.counters, KVP_STAT__COUNT * sizeof *st);
    if (full)
        *full = sr;
    return 0;
}

static int heartbeat(cl *c, kvp_msg_heartbeat_resp *hb)
{
    REQUIRE(cl_call(c, KVP_OP_HEARTBEAT) == 0);
    if (c->status)
        return c->status;
    REQUIRE(kvp_dec_heartbeat_resp(c->resp, c->resp_len, hb) == 0);
    return 0;
}

/* ------------------------------------------------------------------ tests */

TEST(every_operation_over_the_wire)
{
    tp_master m;
    CHECK(tp_master_start(&m, (const char *[]){"--lease-ttl", "10s", NULL}) == 0);
    cl c;
    kvp_rpc_opts o = {.name = "integ-client", .client_id = 0x1234};
    CHECK(cl_open_opts(&c, m.addr, &o) == 0);
    /* HELLO */
    const kvp_msg_hello_resp *h = kvp_rpc_hello_resp(c.r);
    CHECK_EQ(h->version, KVP_PROTO_VERSION);
    CHECK(h->master_id != 0);
    CHECK_EQ(h->lease_ttl_ms, 10000);
    CHECK_EQ(h->client_ttl_ms, 10000);
    CHECK_EQ(h->max_frame, 64 * MiB);
    uint64_t master_id = h->master_id;
    /* HEARTBEAT before and after MOUNT_SEGMENT */
    kvp_msg_heartbeat_resp hb;
    CHECK_EQ(heartbeat(&c, &hb), 0);
    CHECK_EQ(hb.master_id, master_id);
    CHECK_EQ(hb.n_segments, 0);
    CHECK_EQ(mount(&c, 1, "node-a:1", 64 * MiB), 0);
    CHECK_EQ(mount(&c, 2, "node-b:1", 64 * MiB), 0);
    CHECK_EQ(mount(&c, 3, "node-a:1", 64 * MiB), KVP_ESEGMENT_ALREADY_EXISTS);
    CHECK_EQ(heartbeat(&c, &hb), 0);
    CHECK_EQ(hb.n_segments, 2);
    /* a heartbeat whose body is no report (version 1, 0 paths) is refused,
     * the connection goes on */
    kvp_buf_u32(&c.body, 1);
    CHECK(cl_call(&c, KVP_OP_HEARTBEAT) == 0);
    CHECK_EQ(c.status, KVP_EPROTOCOL);
    /* SEGMENT_INFO */
    kvp_msg_ids q = {3, (uint64_t[]){2, 1, 99}};
    kvp_enc_ids(&c.body, &q);
    CHECK(cl_call(&c, KVP_OP_SEGMENT_INFO) == 0);
    CHECK_EQ(c.status, 0);
    kvp_msg_seg_info_resp si;
    CHECK(kvp_dec_seg_info_resp(c.resp, c.resp_len, &c.lim, &c.a, &si) == 0);
    CHECK_EQ(si.n, 3);
    CHECK_EQ(si.infos[0].status, 0);
    CHECK_EQ(si.infos[0].desc.id, 2);
    CHECK_EQ(si.infos[0].desc.capacity, 64 * MiB);
    CHECK(si.infos[0].desc.name.len == 8 && !memcmp(si.infos[0].desc.name.p, "node-b:1", 8));
    CHECK_EQ(si.infos[0].desc.n_endpoints, 1);
    CHECK(si.infos[0].desc.endpoints[0].transport.len == 3 &&
          !memcmp(si.infos[0].desc.endpoints[0].transport.p, "tcp", 3));
    CHECK_EQ(si.infos[1].status, 0);
    CHECK_EQ(si.infos[1].desc.id, 1);
    CHECK_EQ(si.infos[2].status, KVP_ESEGMENT_NOT_FOUND);
    /* PUT_START: pending objects are invisible */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, 0, 3, 100000, 0, "node-b:1", &r), 0);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(r.results[i].status, 0);
        CHECK_EQ(r.results[i].n_replicas, 1);
        CHECK_EQ(r.results[i].replicas[0].segment_id, 2);
        CHECK_EQ(r.results[i].replicas[0].length, 100000);
        CHECK_EQ(r.results[i].replicas[0].offset % PAGE, 0);
    }
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_PENDING], 3);
    CHECK_EQ(st[KVP_STAT_SEGMENTS], 2);
    CHECK_EQ(st[KVP_STAT_CAPACITY], 128 * MiB);
    CHECK_EQ(exists(&c, 0), 0);
    CHECK_EQ(put_start(&c, 0, 1, 100, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_ALREADY_EXISTS);
    /* PUT_END 0, 1; PUT_REVOKE 2 */
    int32_t codes[8];
    uint64_t cs[3] = {csum_of(0), csum_of(1), csum_of(2)};
    CHECK_EQ(keys_op(&c, KVP_OP_PUT_END, 0, 2, cs, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(codes[1], 0);
    CHECK_EQ(keys_op(&c, KVP_OP_PUT_REVOKE, 2, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(keys_op(&c, KVP_OP_PUT_REVOKE, 2, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], KVP_EOBJECT_NOT_FOUND);
    /* EXIST / PREFIX */
    CHECK_EQ(keys_op(&c, KVP_OP_EXIST, 0, 4, NULL, codes), 0);
    CHECK_EQ(codes[0], 1);
    CHECK_EQ(codes[1], 1);
    CHECK_EQ(codes[2], 0);
    CHECK_EQ(codes[3], 0);
    CHECK_EQ(keys_op(&c, KVP_OP_PREFIX, 0, 4, NULL, codes), 0);
    CHECK_EQ(codes[0], 2);
    /* GET from another client */
    cl d;
    CHECK(cl_open(&d, m.addr) == 0);
    CHECK(kvp_rpc_hello_resp(d.r)->master_id == master_id);
    CHECK_EQ(keys_op(&d, KVP_OP_GET, 0, 3, NULL, codes), 0);
    kvp_msg_get_resp g;
    CHECK(kvp_dec_get_resp(d.resp, d.resp_len, &d.lim, &d.a, &g) == 0);
    CHECK_EQ(g.n, 3);
    CHECK_EQ(g.lease_ttl_ms, 10000);
    CHECK_EQ(g.results[0].status, 0);
    CHECK_EQ(g.results[0].size, 100000);
    CHECK_EQ(g.results[0].checksum, csum_of(0));
    CHECK_EQ(g.results[0].n_replicas, 1);
    CHECK_EQ(g.results[0].replicas[0].segment_id, 2);
    CHECK_EQ(g.results[1].checksum, csum_of(1));
    CHECK_EQ(g.results[2].status, KVP_EOBJECT_NOT_FOUND);
    uint64_t lease0 = g.results[0].lease_id, lease1 = g.results[1].lease_id;
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 2);
    CHECK_EQ(st[KVP_STAT_LEASES], 2);
    CHECK_EQ(st[KVP_STAT_HITS], 2);
    CHECK_EQ(st[KVP_STAT_MISSES], 1);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    CHECK_EQ(st[KVP_STAT_CLIENTS], 2);
    /* REMOVE without force: leased */
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 0, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], KVP_EOBJECT_HAS_LEASE);
    /* RELEASE: a wrong lease id is reported */
    uint64_t bad = lease0 + 777;
    CHECK_EQ(keys_op(&d, KVP_OP_RELEASE, 0, 1, &bad, codes), 0);
    CHECK_EQ(codes[0], KVP_ELEASE_EXPIRED);
    /* RELEASE ONEWAY: no answer; the next answer on the connection is the
     * one to the following request */
    {
        keyset k;
        keys_make(&k, 0, 1);
        enc_keys_op(&d, KVP_OP_RELEASE, &k, 1, &lease0);
        keys_free(&k);
        uint64_t rid1 = kvp_rpc_queue(d.r, KVP_OP_RELEASE, KVP_FLAG_ONEWAY, d.body.data, d.body.len);
        kvp_buf_reset(&d.body);
        uint64_t rid2 = kvp_rpc_queue(d.r, KVP_OP_STATS, 0, NULL, 0);
        CHECK(rid1 != rid2);
        CHECK_EQ(kvp_rpc_flush(d.r), 0);
        kvp_frame_hdr rh;
        const uint8_t *b;
        CHECK_EQ(kvp_rpc_recv(d.r, &rh, &b), 0);
        CHECK_EQ(rh.req_id, rid2);
        CHECK_EQ(rh.op, KVP_OP_STATS);
        CHECK_EQ(rh.status, 0);
        kvp_msg_stats_resp sr;
        CHECK(kvp_dec_stats_resp(b, rh.body_len, &d.lim, &d.a, &sr) == 0);
        CHECK_EQ(sr.counters[KVP_STAT_LEASES], 1);
    }
    /* a ONEWAY RELEASE with a malformed body is still answered (an error) */
    {
        uint64_t rid = kvp_rpc_queue(d.r, KVP_OP_RELEASE, KVP_FLAG_ONEWAY, "\x01", 1);
        CHECK_EQ(kvp_rpc_flush(d.r), 0);
        kvp_frame_hdr rh;
        const uint8_t *b;
        CHECK_EQ(kvp_rpc_recv(d.r, &rh, &b), 0);
        CHECK_EQ(rh.req_id, rid);
        CHECK_EQ(rh.status, KVP_EPROTOCOL);
    }
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 0, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], 0); /* released: removable */
    /* REMOVE with force removes the still-leased key 1 */
    uint64_t force = 1;
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 1, 1, NULL, codes), 0);
    CHECK_EQ(codes[0], KVP_EOBJECT_HAS_LEASE);
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 1, 2, &force, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(codes[1], KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(keys_op(&d, KVP_OP_RELEASE, 1, 1, &lease1, codes), 0);
    CHECK(codes[0] == KVP_EOBJECT_NOT_FOUND || codes[0] == KVP_ELEASE_EXPIRED);
    /* key 1 was removed while leased: its space is back once the node
     * acknowledged the free (its fake node answers on another thread) */
    uint64_t until = tp_now_ms() + 5000;
    do {
        CHECK_EQ(stats(&c, st, NULL), 0);
        if (st[KVP_STAT_USED] == 0)
            break;
        tp_sleep_ms(10);
    } while (tp_now_ms() < until);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_LEASES], 0);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    /* REMOVE_ALL, not forced then forced */
    CHECK_EQ(put(&c, 100, 20, 4096, NULL), 0);
    CHECK_EQ(keys_op(&d, KVP_OP_GET, 105, 1, NULL, codes), 0); /* leased */
    kvp_msg_remove_all ra = {{NULL, 0}, 0};
    kvp_enc_remove_all(&c.body, &ra);
    CHECK(cl_call(&c, KVP_OP_REMOVE_ALL) == 0);
    CHECK_EQ(c.status, 0);
    kvp_msg_remove_all_resp rr;
    CHECK(kvp_dec_remove_all_resp(c.resp, c.resp_len, &rr) == 0);
    CHECK_EQ(rr.removed, 19);
    ra.force = 1;
    kvp_enc_remove_all(&c.body, &ra);
    CHECK(cl_call(&c, KVP_OP_REMOVE_ALL) == 0);
    CHECK(kvp_dec_remove_all_resp(c.resp, c.resp_len, &rr) == 0);
    CHECK_EQ(rr.removed, 1);
    /* the leased key's space comes back with the node's acknowledgement */
    until = tp_now_ms() + 5000;
    do {
        CHECK_EQ(stats(&c, st, NULL), 0);
        if (st[KVP_STAT_USED] == 0)
            break;
        tp_sleep_ms(10);
    } while (tp_now_ms() < until);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    /* STATS with per-segment usage */
    CHECK_EQ(put(&c, 200, 4, 3 * PAGE, "node-a:1"), 0);
    kvp_msg_stats_resp full;
    CHECK_EQ(stats(&c, st, &full), 0);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 4);
    CHECK_EQ(st[KVP_STAT_BYTES], 12 * PAGE);
    CHECK_EQ(st[KVP_STAT_USED], 12 * PAGE);
    CHECK_EQ(full.n_segs, 2);
    uint64_t seg_a_used = 0, seg_a_objs = 0;
    for (uint32_t i = 0; i < full.n_segs; i++)
        if (full.segs[i].id == 1) {
            seg_a_used = full.segs[i].used;
            seg_a_objs = full.segs[i].objects;
            CHECK_EQ(full.segs[i].capacity, 64 * MiB);
        }
    CHECK_EQ(seg_a_used, 12 * PAGE);
    CHECK_EQ(seg_a_objs, 4);
    /* UNMOUNT_SEGMENT: by a non-owner refused; the owner's drops its objects */
    kvp_msg_ids u = {1, (uint64_t[]){1}};
    kvp_enc_ids(&d.body, &u);
    CHECK(cl_call(&d, KVP_OP_UNMOUNT_SEGMENT) == 0);
    kvp_msg_results res;
    CHECK(kvp_dec_results(d.resp, d.resp_len, &d.lim, &d.a, &res) == 0);
    CHECK_EQ(res.codes[0], KVP_EILLEGAL_CLIENT);
    kvp_msg_ids u2 = {2, (uint64_t[]){1, 99}};
    kvp_enc_ids(&c.body, &u2);
    CHECK(cl_call(&c, KVP_OP_UNMOUNT_SEGMENT) == 0);
    CHECK_EQ(c.status, 0);
    CHECK(kvp_dec_results(c.resp, c.resp_len, &c.lim, &c.a, &res) == 0);
    CHECK_EQ(res.n, 2);
    CHECK_EQ(res.codes[0], 0);
    CHECK_EQ(res.codes[1], KVP_ESEGMENT_NOT_FOUND);
    CHECK_EQ(exists(&c, 200), 0);
    CHECK_EQ(heartbeat(&c, &hb), 0);
    CHECK_EQ(hb.n_segments, 1);
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_SEGMENTS], 1);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    cl_close(&d);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(batches_of_10000_keys)
{
    enum { N = 10000 };
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    cl c;
    CHECK(cl_open(&c, m.addr) == 0);
    CHECK_EQ(mount(&c, 1, "big:1", 1ull << 30), 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, 0, N, 1000, 0, NULL, &r), 0);
    uint64_t *offs = malloc(N * sizeof *offs);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(r.results[i].status, 0);
        CHECK_EQ(r.results[i].n_replicas, 1);
        CHECK_EQ(r.results[i].replicas[0].segment_id, 1);
        CHECK_EQ(r.results[i].replicas[0].length, 1000);
        offs[i] = r.results[i].replicas[0].offset;
    }
    /* allocations are disjoint pages */
    for (int i = 1; i < N; i++)
        for (int j = i - 1; j >= 0 && j >= i - 4; j--)
            CHECK(offs[i] != offs[j]);
    int32_t *codes = malloc((N + 10) * sizeof *codes);
    uint64_t *cs = malloc(N * sizeof *cs);
    for (int i = 0; i < N; i++)
        cs[i] = csum_of(i);
    CHECK_EQ(keys_op(&c, KVP_OP_PUT_END, 0, N, cs, codes), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(codes[i], 0);
    /* EXIST over 5000 present and 5000 absent keys */
    CHECK_EQ(keys_op(&c, KVP_OP_EXIST, N / 2, N, NULL, codes), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(codes[i], i < N / 2 ? 1 : 0);
    CHECK_EQ(keys_op(&c, KVP_OP_PREFIX, 0, N, NULL, codes), 0);
    CHECK_EQ(codes[0], N);
    /* GET all: sizes, checksums, replicas match what PUT_START allocated */
    CHECK_EQ(keys_op(&c, KVP_OP_GET, 0, N, NULL, codes), 0);
    kvp_msg_get_resp g;
    CHECK(kvp_dec_get_resp(c.resp, c.resp_len, &c.lim, &c.a, &g) == 0);
    CHECK_EQ(g.n, N);
    uint64_t *leases = malloc(N * sizeof *leases);
    for (int i = 0; i < N; i++) {
        CHECK_EQ(g.results[i].status, 0);
        CHECK_EQ(g.results[i].size, 1000);
        CHECK_EQ(g.results[i].checksum, csum_of(i));
        CHECK_EQ(g.results[i].n_replicas, 1);
        CHECK_EQ(g.results[i].replicas[0].offset, offs[i]);
        leases[i] = g.results[i].lease_id;
    }
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_OBJECTS], N);
    CHECK_EQ(st[KVP_STAT_LEASES], N);
    CHECK_EQ(st[KVP_STAT_HITS], N);
    /* remove one key in the middle: PREFIX stops there */
    uint64_t force = 1;
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 7777, 1, &force, codes), 0);
    CHECK_EQ(codes[0], 0);
    CHECK_EQ(keys_op(&c, KVP_OP_PREFIX, 0, N, NULL, codes), 0);
    CHECK_EQ(codes[0], 7777);
    /* RELEASE all 10000 leases */
    CHECK_EQ(keys_op(&c, KVP_OP_RELEASE, 0, N, leases, codes), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(codes[i], i == 7777 ? KVP_EOBJECT_NOT_FOUND : 0);
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_LEASES], 0);
    CHECK_EQ(st[KVP_STAT_OBJECTS], N - 1);
    /* a second PUT_START of the same 10000 keys: all exist (except 7777) */
    CHECK_EQ(put_start(&c, 0, N, 1000, 0, NULL, &r), 0);
    for (int i = 0; i < N; i++)
        CHECK_EQ(r.results[i].status, i == 7777 ? 0 : KVP_EOBJECT_ALREADY_EXISTS);
    free(offs);
    free(codes);
    free(cs);
    free(leases);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(eviction_on_a_full_segment)
{
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    cl c;
    CHECK(cl_open(&c, m.addr) == 0);
    CHECK_EQ(mount(&c, 1, "small:1", 100 * PAGE), 0); /* room for 10 objects */
    for (int i = 0; i < 40; i++)
        CHECK_EQ(put(&c, i, 1, 10 * PAGE, NULL), 0);
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK(st[KVP_STAT_EVICTIONS] >= 30);
    CHECK_EQ(st[KVP_STAT_EVICTIONS] + st[KVP_STAT_OBJECTS], 40);
    CHECK_EQ(st[KVP_STAT_EVICTED_BYTES], st[KVP_STAT_EVICTIONS] * 10 * PAGE);
    CHECK(st[KVP_STAT_USED] <= 100 * PAGE);
    for (int i = 0; i < 30; i++)
        CHECK_EQ(exists(&c, i), 0);
    CHECK_EQ(exists(&c, 39), 1);
    CHECK_EQ(exists(&c, 38), 1);
    /* bigger than the segment: refused, nothing else disturbed */
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&c, 1000, 1, 101 * PAGE, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_TOO_LARGE);
    CHECK_EQ(exists(&c, 39), 1);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(lease_protects_from_eviction)
{
    tp_master m;
    CHECK(tp_master_start(&m, (const char *[]){"--lease-ttl", "10s", NULL}) == 0);
    cl c, rd;
    CHECK(cl_open(&c, m.addr) == 0);
    CHECK(cl_open(&rd, m.addr) == 0);
    CHECK_EQ(mount(&c, 1, "small:1", 100 * PAGE), 0);
    CHECK_EQ(put(&c, 0, 1, 10 * PAGE, NULL), 0);
    kvp_get_result g;
    CHECK_EQ(get1(&rd, 0, &g), 0);
    CHECK_EQ(g.status, 0);
    uint64_t lease = g.lease_id;
    for (int i = 1; i <= 30; i++)
        CHECK_EQ(put(&c, i, 1, 10 * PAGE, NULL), 0);
    CHECK_EQ(exists(&c, 0), 1);
    CHECK_EQ(exists(&c, 1), 0);
    int32_t code;
    CHECK_EQ(keys_op(&c, KVP_OP_REMOVE, 0, 1, NULL, &code), 0);
    CHECK_EQ(code, -706);
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_LEASES], 1);
    CHECK(st[KVP_STAT_EVICTIONS] >= 21);
    /* released: the object becomes evictable again */
    CHECK_EQ(keys_op(&rd, KVP_OP_RELEASE, 0, 1, &lease, &code), 0);
    CHECK_EQ(code, 0);
    for (int i = 31; i <= 50; i++)
        CHECK_EQ(put(&c, i, 1, 10 * PAGE, NULL), 0);
    CHECK_EQ(exists(&c, 0), 0);
    CHECK_EQ(exists(&c, 50), 1);
    cl_close(&rd);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(writer_disconnect_revokes_pending_puts)
{
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    cl a, b;
    CHECK(cl_open(&b, m.addr) == 0);
    CHECK_EQ(mount(&b, 1, "n:1", 64 * MiB), 0);
    CHECK(cl_open(&a, m.addr) == 0);
    kvp_msg_put_start_resp r;
    CHECK_EQ(put_start(&a, 0, 5, 8192, 0, NULL, &r), 0);
    for (int i = 0; i < 5; i++)
        CHECK_EQ(r.results[i].status, 0);
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&b, st, NULL), 0);
    CHECK_EQ(st[KVP_STAT_PENDING], 5);
    CHECK_EQ(put_start(&b, 0, 1, 8192, 0, NULL, &r), 0);
    CHECK_EQ(r.results[0].status, KVP_EOBJECT_ALREADY_EXISTS);
    cl_close(&a);
    uint64_t end = tp_now_ms() + 5000;
    do {
        CHECK_EQ(stats(&b, st, NULL), 0);
        if (st[KVP_STAT_PENDING] == 0 && st[KVP_STAT_USED] == 0)
            break; /* the space is back once the node acknowledged */
        tp_sleep_ms(10);
    } while (tp_now_ms() < end);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    CHECK_EQ(st[KVP_STAT_USED], 0);
    CHECK_EQ(st[KVP_STAT_PUT_REVOKED], 5);
    CHECK_EQ(put(&b, 0, 5, 8192, NULL), 0);
    CHECK_EQ(exists(&b, 4), 1);
    cl_close(&b);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* Waits up to ms for fd to be closed by the peer: 1 closed, 0 not. */
static int wait_closed(int fd, int ms)
{
    uint64_t end = tp_now_ms() + (uint64_t)ms;
    for (;;) {
        uint64_t now = tp_now_ms();
        if (now >= end)
            return 0;
        struct pollfd p = {fd, POLLIN, 0};
        int n = poll(&p, 1, (int)(end - now));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        char buf[4096];
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
}

TEST(heartbeat_timeout_unmounts_silent_node)
{
    tp_master m;
    CHECK(tp_master_start(&m, (const char *[]){"--client-ttl", "2s", "--lease-ttl", "1s", NULL}) == 0);
    cl silent, alive, c;
    CHECK(cl_open(&silent, m.addr) == 0);
    CHECK(cl_open(&alive, m.addr) == 0);
    CHECK(cl_open(&c, m.addr) == 0);
    CHECK_EQ(kvp_rpc_hello_resp(c.r)->client_ttl_ms, 2000);
    CHECK_EQ(mount(&silent, 1, "silent:1", 8 * MiB), 0);
    CHECK_EQ(mount(&alive, 2, "alive:1", 8 * MiB), 0);
    CHECK_EQ(put(&c, 0, 10, 4096, "silent:1"), 0);
    CHECK_EQ(put(&c, 100, 10, 4096, "alive:1"), 0);
    uint64_t t0 = tp_now_ms(), last_hb = 0, gone_at = 0;
    uint64_t st[KVP_STAT__COUNT];
    kvp_msg_heartbeat_resp hb;
    while (tp_now_ms() - t0 < 3500) {
        uint64_t now = tp_now_ms();
        if (now - last_hb >= 500) {
            CHECK_EQ(heartbeat(&alive, &hb), 0);
            CHECK_EQ(hb.n_segments, 1);
            last_hb = now;
        }
        CHECK_EQ(stats(&c, st, NULL), 0);
        if (!gone_at && st[KVP_STAT_SEGMENTS] == 1)
            gone_at = now - t0;
        tp_sleep_ms(100);
    }
    CHECK(gone_at >= 1500); /* not before the TTL */
    CHECK_EQ(st[KVP_STAT_SEGMENTS], 1);
    CHECK_EQ(st[KVP_STAT_CLIENTS_EXPIRED], 1);
    CHECK_EQ(st[KVP_STAT_CLIENTS], 2);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 10);
    CHECK_EQ(st[KVP_STAT_CAPACITY], 8 * MiB);
    for (int i = 0; i < 10; i++)
        CHECK_EQ(exists(&c, i), 0);
    for (int i = 100; i < 110; i++)
        CHECK_EQ(exists(&c, i), 1);
    /* the master closed the silent node's connection */
    CHECK(wait_closed(kvp_rpc_fd(silent.r), 2000));
    CHECK(cl_call(&silent, KVP_OP_HEARTBEAT) != 0);
    /* the heartbeating node is still mounted and serves puts */
    CHECK_EQ(heartbeat(&alive, &hb), 0);
    CHECK_EQ(hb.n_segments, 1);
    CHECK_EQ(put(&c, 200, 1, 4096, NULL), 0);
    /* the silent node comes back and remounts */
    cl again;
    kvp_rpc_opts o = {.client_id = kvp_rpc_client_id(silent.r)};
    cl_close(&silent);
    CHECK(cl_open_opts(&again, m.addr, &o) == 0);
    CHECK_EQ(mount(&again, 1, "silent:1", 8 * MiB), 0);
    CHECK_EQ(put(&c, 300, 1, 4096, "silent:1"), 0);
    cl_close(&again);
    cl_close(&alive);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* --------------------------------------------------------- hostile frames */

#define TOKEN "s3cret"

static void hdr(uint8_t *p, uint16_t magic, uint8_t ver, uint8_t flags, uint16_t op, uint64_t req_id,
                uint32_t body_len, int32_t status)
{
    kvp_frame_hdr h = {ver, flags, op, req_id, body_len, status};
    kvp_frame_hdr_encode(p, &h);
    p[0] = (uint8_t)(magic & 0xff);
    p[1] = (uint8_t)(magic >> 8);
}

static int raw_connect(const char *addr)
{
    char err[256];
    int fd = kvp_net_connect(addr, 5000, err, sizeof err);
    if (fd < 0)
        fprintf(stderr, "    connect %s: %s\n", addr, err);
    return fd;
}

static int raw_send(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads the first answer frame (within 5 s) and checks its status; with
 * want_close, then also requires the master to close the connection.
 * want_status 1 = any error status. 0 when as expected. */
static int expect_answer(int fd, uint16_t op, uint64_t req_id, int32_t want_status, int want_close)
{
    uint8_t buf[65536];
    size_t len = 0;
    uint64_t end = tp_now_ms() + 5000;
    kvp_frame_hdr h;
    const uint8_t *body;
    for (;;) {
        int rc = kvp_frame_next(buf, len, sizeof buf, &h, &body);
        REQUIRE(rc >= 0);
        if (rc == 1)
            break;
        uint64_t now = tp_now_ms();
        REQUIRE(now < end);
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(end - now)) <= 0)
            continue;
        ssize_t r = recv(fd, buf + len, sizeof buf - len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "    closed without an answer (op %u)\n", op);
            return -1;
        }
        len += (size_t)r;
    }
    REQUIRE(h.flags & KVP_FLAG_RESPONSE);
    if (want_status == 1)
        REQUIRE(h.status < 0);
    else if (h.status != want_status) {
        fprintf(stderr, "    op %u: status %d, wanted %d\n", op, h.status, want_status);
        return -1;
    }
    if (req_id)
        REQUIRE(h.req_id == req_id);
    if (want_close)
        REQUIRE(wait_closed(fd, 5000));
    return 0;
}

/* One round of correct traffic; 0 when every answer is right. */
static int good_round(cl *c, int base)
{
    REQUIRE(put(c, base, 3, 4096, NULL) == 0);
    int32_t codes[4];
    REQUIRE(keys_op(c, KVP_OP_EXIST, base, 4, NULL, codes) == 0);
    REQUIRE(codes[0] == 1 && codes[1] == 1 && codes[2] == 1 && codes[3] == 0);
    kvp_get_result g;
    REQUIRE(get1(c, base + 1, &g) == 0);
    REQUIRE(g.status == 0 && g.checksum == csum_of(base + 1));
    REQUIRE(keys_op(c, KVP_OP_RELEASE, base + 1, 1, &g.lease_id, codes) == 0 && codes[0] == 0);
    uint64_t force = 1;
    REQUIRE(keys_op(c, KVP_OP_REMOVE, base, 3, &force, codes) == 0);
    REQUIRE(codes[0] == 0 && codes[1] == 0 && codes[2] == 0);
    return 0;
}

TEST(hostile_frames_do_not_disturb_others)
{
    tp_master m;
    setenv("KVPOOL_CLUSTER_TOKEN", TOKEN, 1); /* secrets never come from flags */
    int started = tp_master_start(&m, (const char *[]){"--max-frame-size", "1MiB", NULL});
    unsetenv("KVPOOL_CLUSTER_TOKEN");
    CHECK(started == 0);
    kvp_rpc_opts o = {.token = TOKEN, .name = "good"};
    cl good;
    CHECK(cl_open_opts(&good, m.addr, &o) == 0);
    CHECK_EQ(kvp_rpc_hello_resp(good.r)->max_frame, MiB);
    CHECK_EQ(mount(&good, 1, "n:1", 256 * MiB), 0);
    /* a forked well-behaved client runs rounds until told to stop */
    int stop_pipe[2], res_pipe[2];
    CHECK(pipe(stop_pipe) == 0 && pipe(res_pipe) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        close(stop_pipe[1]);
        close(res_pipe[0]);
        cl k;
        int rounds = 0, bad = 0;
        if (cl_open_opts(&k, m.addr, &o) != 0) {
            bad = 1;
        } else {
            for (int i = 0; !bad; i++) {
                struct pollfd p = {stop_pipe[0], POLLIN, 0};
                if (poll(&p, 1, 0) > 0)
                    break;
                if (good_round(&k, 1000000 + (i % 1000) * 10) != 0)
                    bad = 1;
                else
                    rounds++;
            }
            cl_close(&k);
        }
        int msg[2] = {rounds, bad};
        ssize_t w = write(res_pipe[1], msg, sizeof msg);
        (void)w;
        _exit(0);
    }
    close(stop_pipe[0]);
    close(res_pipe[1]);

    uint8_t f[KVP_FRAME_HDR + 64];
    int round = 0;
    /* an idle connection holding half a header the whole time */
    int idle = raw_connect(m.addr);
    CHECK(idle >= 0);
    CHECK_EQ(raw_send(idle, "\x56\x4b\x01\x00\x0a", 5), 0);

    /* 1. garbage bytes */
    {
        int fd = raw_connect(m.addr);
        CHECK(fd >= 0);
        uint8_t g[64];
        for (int i = 0; i < 64; i++)
            g[i] = (uint8_t)(0xA5 ^ (i * 37));
        CHECK_EQ(raw_send(fd, g, sizeof g), 0);
        CHECK_EQ(expect_answer(fd, 0, 0, KVP_EPROTOCOL, 1), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 2. bad magic */
    {
        int fd = raw_connect(m.addr);
        hdr(f, 0x1234, KVP_PROTO_VERSION, 0, KVP_OP_HELLO, 5, 0, 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, 0, 0, KVP_EPROTOCOL, 1), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 3. wrong frame version */
    {
        int fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION + 1, 0, KVP_OP_HELLO, 6, 0, 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_HELLO, 6, KVP_EINVALID_VERSION, 1), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 4. body_len above the max frame (1 MiB) */
    {
        int fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_EXIST, 7, (uint32_t)(2 * MiB), 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_EXIST, 7, KVP_ETOO_LARGE, 1), 0);
        close(fd);
        fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_EXIST, 8, 0xFFFFFFFFu, 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_EXIST, 8, KVP_ETOO_LARGE, 1), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 5. a truncated frame, then close */
    {
        int fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_HELLO, 9, 100, 0);
        memset(f + KVP_FRAME_HDR, 0x11, 10);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR + 10), 0);
        close(fd);
        fd = raw_connect(m.addr); /* and a truncated header */
        CHECK_EQ(raw_send(fd, f, 7), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 6. non-zero reserved field; a request with a non-zero status */
    {
        int fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_STATS, 10, 0, 0);
        f[6] = 1;
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, 0, 0, KVP_EPROTOCOL, 1), 0);
        close(fd);
        fd = raw_connect(m.addr);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_STATS, 11, 0, -5);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, 0, 0, KVP_EPROTOCOL, 1), 0);
        close(fd);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 7-9. after a good HELLO: a frame with the RESPONSE flag, an unknown
     * opcode, a malformed body, a hostile count -- each answered, and the
     * connection keeps working */
    {
        cl h;
        CHECK(cl_open_opts(&h, m.addr, &o) == 0);
        int fd = kvp_rpc_fd(h.r);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, KVP_FLAG_RESPONSE, KVP_OP_EXIST, 12, 0, 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_EXIST, 12, KVP_EPROTOCOL, 0), 0);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, 999, 13, 0, 0);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR), 0);
        CHECK_EQ(expect_answer(fd, 999, 13, KVP_EUNKNOWN_OP, 0), 0);
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_GET, 14, 2, 0);
        f[KVP_FRAME_HDR] = 1;
        f[KVP_FRAME_HDR + 1] = 2;
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR + 2), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_GET, 14, KVP_EPROTOCOL, 0), 0);
        /* EXIST: tenant "", then 0xFFFFFFFF keys */
        hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_EXIST, 15, 8, 0);
        memset(f + KVP_FRAME_HDR, 0, 4);
        memset(f + KVP_FRAME_HDR + 4, 0xff, 4);
        CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR + 8), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_EXIST, 15, KVP_EPROTOCOL, 0), 0);
        /* every other op with a malformed body */
        for (uint16_t op = KVP_OP_MOUNT_SEGMENT; op < KVP_OP__MAX; op++) {
            if (op == KVP_OP_HEARTBEAT || op == KVP_OP_STATS)
                continue; /* empty bodies: extra bytes tested below */
            hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, op, 100u + op, 3, 0);
            memset(f + KVP_FRAME_HDR, 0xEE, 3);
            CHECK_EQ(raw_send(fd, f, KVP_FRAME_HDR + 3), 0);
            CHECK_EQ(expect_answer(fd, op, 100u + op, 1, 0), 0);
        }
        CHECK_EQ(good_round(&h, 500), 0);
        cl_close(&h);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 10. an operation before HELLO */
    {
        cl h;
        kvp_rpc_opts nh = {.no_hello = 1};
        CHECK(cl_open_opts(&h, m.addr, &nh) == 0);
        CHECK(cl_call(&h, KVP_OP_STATS) == 0);
        CHECK_EQ(h.status, KVP_ENO_HELLO);
        int32_t code;
        CHECK_EQ(keys_op(&h, KVP_OP_EXIST, 0, 1, NULL, &code), KVP_ENO_HELLO);
        cl_close(&h);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* 11. HELLO with a wrong or missing cluster token */
    {
        cl h;
        kvp_rpc_opts bad = {.token = "wrong"};
        CHECK_EQ(cl_open_opts(&h, m.addr, &bad), KVP_EAUTH);
        CHECK_EQ(cl_open_opts(&h, m.addr, NULL), KVP_EAUTH);
        int fd = raw_connect(m.addr);
        kvp_buf b;
        kvp_buf_init(&b, 4096);
        size_t off = kvp_frame_begin(&b, KVP_OP_HELLO, 0, 21, 0);
        /* a HELLO with a proof but no challenge before it proves nothing */
        kvp_msg_hello hm = {KVP_PROTO_VERSION, 99, bstr("x"),
                            {bstr("0123456789abcdef0123456789abcdef"), bstr(""), bstr(""), bstr("")}};
        kvp_enc_hello(&b, &hm);
        kvp_frame_end(&b, off);
        CHECK_EQ(raw_send(fd, b.data, b.len), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_HELLO, 21, KVP_EAUTH, 1), 0);
        close(fd);
        /* 12. HELLO with a wrong protocol version in the body */
        fd = raw_connect(m.addr);
        kvp_buf_reset(&b);
        off = kvp_frame_begin(&b, KVP_OP_HELLO, 0, 22, 0);
        kvp_msg_hello hv = {KVP_PROTO_VERSION + 7, 99, bstr("x"), {bstr(""), bstr(""), bstr(""), bstr("")}};
        kvp_enc_hello(&b, &hv);
        kvp_frame_end(&b, off);
        CHECK_EQ(raw_send(fd, b.data, b.len), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_HELLO, 22, KVP_EINVALID_VERSION, 1), 0);
        close(fd);
        /* HELLO with client id 0; a second HELLO with another identity */
        fd = raw_connect(m.addr);
        kvp_buf_reset(&b);
        off = kvp_frame_begin(&b, KVP_OP_HELLO, 0, 23, 0);
        kvp_msg_hello hz = {KVP_PROTO_VERSION, 0, bstr("x"), {bstr(""), bstr(""), bstr(""), bstr("")}};
        kvp_enc_hello(&b, &hz);
        kvp_frame_end(&b, off);
        CHECK_EQ(raw_send(fd, b.data, b.len), 0);
        CHECK_EQ(expect_answer(fd, KVP_OP_HELLO, 23, KVP_EPROTOCOL, 1), 0);
        close(fd);
        CHECK(cl_open_opts(&h, m.addr, &o) == 0);
        kvp_buf_reset(&b);
        kvp_auth_creds cr = hr_creds(TOKEN, NULL, NULL, NULL);
        kvp_auth_tx t;
        hr_challenge(&h.body, &t, &cr);
        CHECK(cl_call(&h, KVP_OP_AUTH_CHALLENGE) == 0);
        CHECK_EQ(h.status, 0);
        CHECK_EQ(hr_answer(&t, &cr, h.resp, h.resp_len), 0);
        hr_hello(&h.body, &t, &cr, kvp_rpc_client_id(h.r) + 1, "x");
        CHECK(cl_call(&h, KVP_OP_HELLO) == 0);
        CHECK_EQ(h.status, KVP_EPROTOCOL);
        CHECK(wait_closed(kvp_rpc_fd(h.r), 5000));
        cl_close(&h);
        kvp_buf_free(&b);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    /* many hostile connections at once, half of them abandoned mid-frame */
    {
        int fds[64];
        for (int i = 0; i < 64; i++) {
            fds[i] = raw_connect(m.addr);
            CHECK(fds[i] >= 0);
            hdr(f, KVP_PROTO_MAGIC, KVP_PROTO_VERSION, 0, KVP_OP_PUT_START, 1, 40, 0);
            memset(f + KVP_FRAME_HDR, 0xff, 40);
            CHECK_EQ(raw_send(fds[i], f, KVP_FRAME_HDR + (i % 2 ? 40 : 20)), 0);
        }
        CHECK_EQ(good_round(&good, 10 * round++), 0);
        for (int i = 0; i < 64; i++)
            close(fds[i]);
    }
    CHECK_EQ(good_round(&good, 10 * round++), 0);
    close(idle);

    /* the forked client ran correct rounds throughout */
    close(stop_pipe[1]);
    int msg[2] = {0, 1};
    CHECK(read(res_pipe[0], msg, sizeof msg) == (ssize_t)sizeof msg);
    int kst = 0;
    CHECK(waitpid(kid, &kst, 0) == kid);
    CHECK(WIFEXITED(kst) && WEXITSTATUS(kst) == 0);
    CHECK_EQ(msg[1], 0);
    CHECK(msg[0] > 0);
    close(res_pipe[0]);
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&good, st, NULL), 0);
    CHECK(st[KVP_STAT_BAD_FRAMES] >= 8);
    CHECK_EQ(st[KVP_STAT_OBJECTS], 0);
    CHECK_EQ(st[KVP_STAT_PENDING], 0);
    CHECK(tp_master_alive(&m, NULL));
    cl_close(&good);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(pipelining_1000_requests)
{
    enum { N = 1000 };
    tp_master m;
    CHECK(tp_master_start(&m, NULL) == 0);
    cl c;
    CHECK(cl_open(&c, m.addr) == 0);
    CHECK_EQ(mount(&c, 1, "n:1", 64 * MiB), 0);
    CHECK_EQ(put(&c, 0, N / 2, 100, NULL), 0); /* keys 0..499 exist */
    uint64_t *ids = malloc(N * sizeof *ids);
    int *seen = calloc(N, sizeof *seen);
    for (int i = 0; i < N; i++) {
        /* request i asks for key (i * 7919) % N */
        keyset k;
        keys_make(&k, (i * 7919) % N, 1);
        enc_keys_op(&c, KVP_OP_EXIST, &k, 1, NULL);
        keys_free(&k);
        ids[i] = kvp_rpc_queue(c.r, KVP_OP_EXIST, 0, c.body.data, c.body.len);
        kvp_buf_reset(&c.body);
        if (i)
            CHECK(ids[i] != ids[i - 1]);
    }
    CHECK_EQ(kvp_rpc_flush(c.r), 0);
    for (int n = 0; n < N; n++) {
        kvp_frame_hdr h;
        const uint8_t *b;
        CHECK_EQ(kvp_rpc_recv(c.r, &h, &b), 0);
        CHECK_EQ(h.status, 0);
        CHECK_EQ(h.op, KVP_OP_EXIST);
        int i = -1;
        for (int j = 0; j < N; j++)
            if (ids[j] == h.req_id) {
                i = j;
                break;
            }
        CHECK(i >= 0);
        CHECK(!seen[i]);
        seen[i] = 1;
        kvp_msg_results r;
        kvp_arena_reset(&c.a);
        CHECK(kvp_dec_results(b, h.body_len, &c.lim, &c.a, &r) == 0);
        CHECK_EQ(r.n, 1);
        CHECK_EQ(r.codes[0], (i * 7919) % N < N / 2 ? 1 : 0);
    }
    /* nothing left over: the next call gets its own answer */
    uint64_t st[KVP_STAT__COUNT];
    CHECK_EQ(stats(&c, st, NULL), 0);
    CHECK(st[KVP_STAT_REQUESTS] >= N + 4);
    free(ids);
    free(seen);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(master_restart_and_reconnect)
{
    tp_master a, b;
    CHECK(tp_master_start(&a, NULL) == 0);
    cl c;
    CHECK(cl_open(&c, a.addr) == 0);
    uint64_t id1 = kvp_rpc_hello_resp(c.r)->master_id;
    uint64_t cid = kvp_rpc_client_id(c.r);
    CHECK_EQ(mount(&c, 1, "n:1", 64 * MiB), 0);
    CHECK_EQ(put(&c, 0, 10, 4096, NULL), 0);
    tp_master_kill(&a);
    CHECK(cl_call(&c, KVP_OP_STATS) != 0); /* the connection broke */
    cl_close(&c);
    CHECK(tp_master_start(&b, NULL) == 0);
    kvp_rpc_opts o = {.client_id = cid};
    CHECK(cl_open_opts(&c, b.addr, &o) == 0);
    uint64_t id2 = kvp_rpc_hello_resp(c.r)->master_id;
    CHECK(id2 != 0 && id2 != id1);
    kvp_msg_heartbeat_resp hb;
    CHECK_EQ(heartbeat(&c, &hb), 0);
    CHECK_EQ(hb.master_id, id2);
    CHECK_EQ(hb.n_segments, 0); /* the node must remount */
    CHECK_EQ(exists(&c, 0), 0);
    CHECK_EQ(mount(&c, 1, "n:1", 64 * MiB), 0);
    CHECK_EQ(put(&c, 0, 10, 4096, NULL), 0);
    CHECK_EQ(exists(&c, 9), 1);
    cl_close(&c);
    CHECK_EQ(tp_master_stop(&b), 0);
}

TEST(cli_help_and_bad_flags)
{
    char out[65536];
    const char *bin = tp_kvpool_bin();
    int rc = tp_run_capture((const char *[]){bin, "master", "--help", NULL}, 3, out, sizeof out, 20000);
    CHECK_EQ(rc, 0);
    CHECK(strstr(out, "usage: kvpool master") != NULL);
    CHECK(strstr(out, "lease") != NULL);
    rc = tp_run_capture((const char *[]){bin, "master", "--listen", "127.0.0.1:0", "--lease-ttl", "5x",
                                          NULL},
                        2, out, sizeof out, 20000);
    CHECK(rc > 0 && rc < 128);
    CHECK(strstr(out, "lease") != NULL);
    CHECK(strstr(out, "5x") != NULL);
    rc = tp_run_capture((const char *[]){bin, "master", "--listen", "127.0.0.1:0", "--max-frame-size",
                                          "12 parsecs", NULL},
                        2, out, sizeof out, 20000);
    CHECK(rc > 0 && rc < 128);
    CHECK(strstr(out, "max") != NULL && strstr(out, "frame") != NULL);
    rc = tp_run_capture((const char *[]){bin, "master", "--listen", "127.0.0.1:0", "--no-such-key", "1",
                                          NULL},
                        2, out, sizeof out, 20000);
    CHECK(rc > 0 && rc < 128);
    CHECK(strstr(out, "no-such-key") != NULL || strstr(out, "no_such_key") != NULL);
    /* a flag without its value */
    rc = tp_run_capture((const char *[]){bin, "master", "--lease-ttl", NULL}, 2, out, sizeof out, 20000);
    CHECK(rc > 0 && rc < 128);
    CHECK(strstr(out, "lease") != NULL);
}
