/*
 * test_kvev_tenants.c -- a master with tenant tokens and KV events: each
 * tenant's events are readable with its own token and no other's, on the
 * PUB (ZeroMQ PLAIN subscribers, whatever they subscribe to) and on the
 * replay socket (master/kvev.h). Real processes: a master, a storage node,
 * clients of two tenants putting blocks.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"
#include "tenant_peer.h"

#define NODE_TOKEN "node-token-kvt-0123456789"
#define TOK_ALICE "tok-alice-0123456789"
#define TOK_BOB "tok-bob-0123456789"

/* The msgpack form of a block hash below 2^32 (uint 32): what marks a
 * batch that announces it. */
static void hash_bytes(uint32_t h, uint8_t out[5])
{
    out[0] = 0xce;
    for (int i = 0; i < 4; i++)
        out[1 + i] = (uint8_t)(h >> (24 - 8 * i));
}

static int has_bytes(const uint8_t *p, size_t n, const uint8_t *w, size_t wn)
{
    for (size_t i = 0; i + wn <= n; i++)
        if (memcmp(p + i, w, wn) == 0)
            return 1;
    return 0;
}

static void *plain_socket(void *ctx, int type, const char *ep, const char *user, const char *pw)
{
    void *s = zmq_socket(ctx, type);
    int linger = 0, sndtimeo = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, user, strlen(user));
    zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, pw, strlen(pw));
    zmq_connect(s, ep);
    return s;
}

/* A subscriber's view: messages read until the one announcing `want`
 * (0: none wanted, read what is there), bytes of topics other than `own`. */
typedef struct view {
    const char *own;
    uint64_t msgs, foreign;
} view;

/* Reads sub for up to ms; 1 when a batch of topic v->own announcing hash
 * want arrived (then stops), 0 else. */
static int read_until(void *sub, view *v, uint32_t want, int ms)
{
    uint8_t w[5];
    hash_bytes(want, w);
    zmq_pollitem_t it = {.socket = sub, .events = ZMQ_POLLIN};
    while (zmq_poll(&it, 1, ms) == 1) {
        zmq_msg_t f[3];
        size_t n = 0;
        int more = 1, found = 0, mine = 0;
        while (more) {
            zmq_msg_t z;
            zmq_msg_init(&z);
            if (zmq_msg_recv(&z, sub, 0) < 0) {
                zmq_msg_close(&z);
                return 0;
            }
            more = zmq_msg_more(&z);
            if (n == 0)
                mine = zmq_msg_size(&z) == strlen(v->own) &&
                       memcmp(zmq_msg_data(&z), v->own, strlen(v->own)) == 0;
            if (!mine)
                v->foreign += zmq_msg_size(&z);
            else if (n == 2 && want && has_bytes(zmq_msg_data(&z), zmq_msg_size(&z), w, 5))
                found = 1;
            if (n < 3)
                f[n] = z;
            else
                zmq_msg_close(&z);
            n++;
        }
        for (size_t i = 0; i < n && i < 3; i++)
            zmq_msg_close(&f[i]);
        v->msgs++;
        if (found)
            return 1;
    }
    return 0;
}

static kvp_client *tenant_client(const char *master, const char *tenant, const char *tok)
{
    char cfg[512], err[256];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"tenant\": \"%s\", "
             "\"tenant_token\": \"%s\"}",
             master, tenant, tok);
    kvp_client *c = NULL;
    if (kvp_client_open(cfg, &c, err, sizeof err) != 0) {
        fprintf(stderr, "kvp_client_open: %s\n", err);
        return NULL;
    }
    return c;
}

/* One put of a key holding (a part of) block hash h. */
static int put_block(kvp_client *c, uint32_t h)
{
    char key[32];
    snprintf(key, sizeof key, "blk-%u", h);
    static uint8_t v[4096];
    kvp_iov iov = {v, sizeof v};
    const kvp_iov *iovs[] = {&iov};
    size_t niov = 1;
    kvp_block b = {.hash = h, .block_size = 16, .parts = 1};
    kvp_put_opts o;
    kvp_put_opts_init(&o);
    o.blocks = &b;
    const char *keys[] = {key};
    int64_t res = 0;
    int rc = kvp_client_batch_put_opts(c, keys, iovs, &niov, 1, &o, &res);
    if (rc != 0 || res < 0)
        fprintf(stderr, "    put of block %u: %s / %s\n", h, kvp_strerror(rc),
                kvp_strerror((int)res));
    return rc == 0 && res >= 0 ? 0 : -1;
}

/* Puts blocks of c's tenant (hashes from *h on) until sub has the batch of
 * one of them: its subscription is in place. */
static int join(kvp_client *c, void *sub, view *v, uint32_t *h)
{
    for (int i = 0; i < 200; i++) {
        ++*h;
        if (put_block(c, *h) != 0)
            return -1;
        if (read_until(sub, v, *h, 50))
            return 0;
    }
    return -1;
}

static int ep_of(char *out, size_t len)
{
    char a[64];
    if (tp_free_addr(a, sizeof a) != 0)
        return -1;
    snprintf(out, len, "tcp://%s", a);
    return 0;
}

/* Alice's and bob's subscribers, each with its own token, read their own
 * tenant's batches; bob's connection subscribing to alice's topic reads
 * nothing of hers; alice's replay returns only her batches. */
TEST(tenants_events_through_a_master)
{
    char tpath[] = "/tmp/kvp-kvt-tenants-XXXXXX";
    CHECK_EQ(tq_write_secret(tpath, "alice " TOK_ALICE "\nbob " TOK_BOB "\n"), 0);
    char pub[80], rep[80];
    CHECK(ep_of(pub, sizeof pub) == 0 && ep_of(rep, sizeof rep) == 0);
    setenv("KVPOOL_NODE_TOKEN", NODE_TOKEN, 1);
    tp_master m;
    tp_store st = {0};
    int up = tp_master_start(&m, (const char *const[]){"--tenant-tokens-file", tpath,
                                                       "--kv-events", pub,
                                                       "--kv-events-replay", rep, NULL});
    if (up == 0)
        up = tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "16MiB", NULL});
    unsetenv("KVPOOL_NODE_TOKEN");
    unlink(tpath);
    CHECK_EQ(up, 0);
    if (up)
        return;
    void *ctx = zmq_ctx_new();
    void *sa = plain_socket(ctx, ZMQ_SUB, pub, "alice", TOK_ALICE);
    void *sb = plain_socket(ctx, ZMQ_SUB, pub, "bob", TOK_BOB);
    void *sx = plain_socket(ctx, ZMQ_SUB, pub, "bob", TOK_BOB);
    zmq_setsockopt(sa, ZMQ_SUBSCRIBE, "", 0);
    zmq_setsockopt(sb, ZMQ_SUBSCRIBE, "bob", 3);
    zmq_setsockopt(sx, ZMQ_SUBSCRIBE, "alice", 5); /* refused: not bob's */
    zmq_setsockopt(sx, ZMQ_SUBSCRIBE, "bob", 3);
    kvp_client *ca = tenant_client(m.addr, "alice", TOK_ALICE);
    kvp_client *cb = tenant_client(m.addr, "bob", TOK_BOB);
    CHECK(ca && cb);
    view va = {"alice", 0, 0}, vb = {"bob", 0, 0}, vx = {"bob", 0, 0};
    uint32_t ha = 0x10000, hb = 0x20000;
    if (ca && cb) {
        CHECK_EQ(join(ca, sa, &va, &ha), 0);
        CHECK_EQ(join(cb, sb, &vb, &hb), 0);
        CHECK_EQ(join(cb, sx, &vx, &hb), 0);
        /* alice's blocks, then bob's marker: sx's subscriptions were taken
         * in order, so had "alice" been applied her batches would reach it
         * before bob's marker */
        for (int i = 0; i < 10; i++)
            CHECK_EQ(put_block(ca, ++ha), 0);
        CHECK_EQ(put_block(cb, ++hb), 0);
        CHECK_EQ(read_until(sa, &va, ha, 5000), 1);
        CHECK_EQ(read_until(sb, &vb, hb, 5000), 1);
        CHECK_EQ(read_until(sx, &vx, hb, 5000), 1);
    }
    uint64_t foreign = va.foreign + vb.foreign + vx.foreign;
    fprintf(stderr, "    bytes of other tenants' events received: %llu (of %llu messages)\n",
            (unsigned long long)foreign, (unsigned long long)(va.msgs + vb.msgs + vx.msgs));
    CHECK_EQ(foreign, 0);
    /* replay: alice's own batches (vLLM's form), never bob's */
    void *d = plain_socket(ctx, ZMQ_DEALER, rep, "alice", TOK_ALICE);
    uint8_t zero[8] = {0};
    zmq_send(d, "", 0, ZMQ_SNDMORE);
    zmq_send(d, zero, 8, 0);
    uint64_t mine = 0, other = 0;
    int ended = 0;
    zmq_pollitem_t it = {.socket = d, .events = ZMQ_POLLIN};
    while (!ended && zmq_poll(&it, 1, 5000) == 1) {
        char f[4][64];
        size_t len[4] = {0};
        int more = 1;
        for (size_t n = 0; more; n++) {
            zmq_msg_t z;
            zmq_msg_init(&z);
            if (zmq_msg_recv(&z, d, 0) < 0)
                more = 0;
            else
                more = zmq_msg_more(&z);
            if (n < 4) {
                len[n] = zmq_msg_size(&z);
                memcpy(f[n], zmq_msg_data(&z), len[n] < 64 ? len[n] : 64);
            }
            zmq_msg_close(&z);
        }
        if (len[1] == 0 && len[2] == 8 && memcmp(f[2], "\xff\xff\xff\xff\xff\xff\xff\xff", 8) == 0)
            ended = 1;
        else if (len[1] == 5 && memcmp(f[1], "alice", 5) == 0)
            mine++;
        else
            other++;
    }
    CHECK(ended);
    CHECK(mine >= 2);
    CHECK_EQ(other, 0);
    void *socks[] = {sa, sb, sx, d};
    for (size_t i = 0; i < 4; i++)
        zmq_close(socks[i]);
    zmq_ctx_term(ctx);
    kvp_client_close(ca);
    kvp_client_close(cb);
    tp_store_stop(&st);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* ZeroMQ matches topics by prefix: tenants "al" and "alice" with KV events
 * would let al's subscriber read alice's batches, so the master refuses to
 * start, and says why. */
TEST(tenants_sharing_a_prefix_refuse_kv_events)
{
    char tpath[] = "/tmp/kvp-kvt-tenants-XXXXXX";
    CHECK_EQ(tq_write_secret(tpath, "al tok-al-0123456789\nalice " TOK_ALICE "\n"), 0);
    char pub[80];
    CHECK_EQ(ep_of(pub, sizeof pub), 0);
    char log[] = "/tmp/kvp-kvt-log-XXXXXX";
    int lfd = mkstemp(log);
    CHECK(lfd >= 0);
    close(lfd);
    tp_master m;
    tp_master_opts mo = {0, log};
    setenv("KVPOOL_NODE_TOKEN", NODE_TOKEN, 1);
    int up = tp_master_start_opts(&m, (const char *const[]){"--tenant-tokens-file", tpath,
                                                            "--kv-events", pub, NULL},
                                  &mo);
    unsetenv("KVPOOL_NODE_TOKEN");
    if (up == 0)
        tp_master_kill(&m);
    CHECK(up != 0);
    char text[8192] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = 0;
        fclose(f);
    }
    if (!strstr(text, "prefix"))
        th_fail(__FILE__, __LINE__, "the master said: %.600s", text);
    unlink(tpath);
    unlink(log);
}
