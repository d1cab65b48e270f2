/*
 * test_hostile.c -- a real `kvpool master` and `kvpool store`, driven by a
 * raw protocol client that behaves as a misbehaving or malicious peer
 * would: stale, forged, wrong-operation and expired descriptors at the
 * storage node; puts the pool cannot keep; a corrupt replica that must not
 * leave its key stuck.
 *
 * The raw client speaks the wire protocol through kvp_rpc to the master and
 * to the node's TCP endpoint; the checks are the node's and master's, not
 * a library's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/buf.h"
#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "net/net.h"
#include "node/grants.h"
#include "proc.h"
#include "proto/proto.h"

#define MiB (1024ull * 1024)

/* ---------------------------------------------------------- raw client */

typedef struct raw {
    kvp_rpc *m;           /* master */
    kvp_rpc *n;           /* the node's segment server (TCP) */
    kvp_buf body;
    kvp_arena a;
    kvp_proto_limits lim;
    int32_t st;
    const uint8_t *resp;
    uint32_t rlen;
} raw;

static int call(raw *r, kvp_rpc *to, uint16_t op)
{
    int rc = kvp_rpc_call(to, op, r->body.data, r->body.len, &r->st, &r->resp, &r->rlen);
    kvp_buf_reset(&r->body);
    kvp_arena_reset(&r->a);
    return rc;
}

static kvp_bytes bs(const char *s) { return (kvp_bytes){(const uint8_t *)s, (uint32_t)strlen(s)}; }

/* PUT_START of one key: its first replica's (WRITE) descriptor in *w.
 * Returns the key's status. */
static int put_start(raw *r, const char *key, uint64_t size, kvp_replica *w)
{
    kvp_bytes k = bs(key);
    kvp_msg_put_start ps = {{NULL, 0}, 1, 0, 0, {NULL, 0}, 1, &k, &size, NULL};
    kvp_enc_put_start(&r->body, &ps);
    REQUIRE(call(r, r->m, KVP_OP_PUT_START) == 0 && r->st == 0);
    kvp_msg_put_start_resp d;
    REQUIRE(kvp_dec_put_start_resp(r->resp, r->rlen, &r->lim, &r->a, &d) == 0 && d.n == 1);
    if (d.results[0].status == 0 && w)
        *w = d.results[0].replicas[0];
    return d.results[0].status;
}

static int put_end(raw *r, const char *key, uint64_t csum)
{
    kvp_bytes k = bs(key);
    kvp_msg_put_end pe = {{NULL, 0}, 1, &k, &csum};
    kvp_enc_put_end(&r->body, &pe);
    REQUIRE(call(r, r->m, KVP_OP_PUT_END) == 0 && r->st == 0);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(r->resp, r->rlen, &r->lim, &r->a, &res) == 0 && res.n == 1);
    return res.codes[0];
}

/* GET of one key: its first replica's (READ) descriptor in *rd. */
static int get(raw *r, const char *key, kvp_replica *rd)
{
    kvp_bytes k = bs(key);
    kvp_msg_keys g = {{NULL, 0}, 1, &k};
    kvp_enc_keys(&r->body, &g);
    REQUIRE(call(r, r->m, KVP_OP_GET) == 0 && r->st == 0);
    kvp_msg_get_resp d;
    REQUIRE(kvp_dec_get_resp(r->resp, r->rlen, &r->lim, &r->a, &d) == 0 && d.n == 1);
    if (d.results[0].status == 0)
        *rd = d.results[0].replicas[0];
    return d.results[0].status;
}

static int remove_key(raw *r, const char *key)
{
    kvp_bytes k = bs(key);
    kvp_msg_remove rm = {{NULL, 0}, 1, 1, &k};
    kvp_enc_remove(&r->body, &rm);
    REQUIRE(call(r, r->m, KVP_OP_REMOVE) == 0 && r->st == 0);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(r->resp, r->rlen, &r->lim, &r->a, &res) == 0 && res.n == 1);
    return res.codes[0];
}

static int exists(raw *r, const char *key)
{
    kvp_bytes k = bs(key);
    kvp_msg_keys g = {{NULL, 0}, 1, &k};
    kvp_enc_keys(&r->body, &g);
    REQUIRE(call(r, r->m, KVP_OP_EXIST) == 0 && r->st == 0);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(r->resp, r->rlen, &r->lim, &r->a, &res) == 0 && res.n == 1);
    return res.codes[0];
}

/* SEG_WRITE of len bytes of `fill` with descriptor d: the node's status. */
static int seg_write(raw *r, const kvp_replica *d, uint8_t fill, size_t len)
{
    kvp_enc_seg_io(&r->body, d);
    uint8_t *p = malloc(len);
    memset(p, fill, len);
    kvp_buf_put(&r->body, p, len);
    free(p);
    REQUIRE(call(r, r->n, KVP_OP_SEG_WRITE) == 0);
    return r->st;
}

/* SEG_READ with descriptor d into out (d->length bytes). */
static int seg_read(raw *r, const kvp_replica *d, uint8_t *out)
{
    kvp_enc_seg_io(&r->body, d);
    REQUIRE(call(r, r->n, KVP_OP_SEG_READ) == 0);
    if (r->st == 0) {
        REQUIRE(r->rlen == d->length);
        memcpy(out, r->resp, r->rlen);
    }
    return r->st;
}

static int all(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return 0;
    return 1;
}

/* Connects r to the node owning segment seg (its TCP endpoint from
 * SEGMENT_INFO). */
static int raw_node(raw *r, uint64_t seg)
{
    char err[256];
    kvp_rpc_opts o = {.name = "hostile", .timeout_ms = 5000};
    kvp_msg_ids ids = {1, &seg};
    kvp_enc_ids(&r->body, &ids);
    REQUIRE(call(r, r->m, KVP_OP_SEGMENT_INFO) == 0 && r->st == 0);
    kvp_msg_seg_info_resp si;
    REQUIRE(kvp_dec_seg_info_resp(r->resp, r->rlen, &r->lim, &r->a, &si) == 0 && si.n == 1);
    char addr[300] = "";
    for (uint32_t i = 0; i < si.infos[0].desc.n_endpoints; i++) {
        const kvp_endpoint *e = &si.infos[0].desc.endpoints[i];
        if (e->transport.len == 3 && !memcmp(e->transport.p, "tcp", 3))
            snprintf(addr, sizeof addr, "%.*s", (int)e->addr.len, (const char *)e->addr.p);
    }
    REQUIRE(addr[0]);
    REQUIRE(kvp_rpc_open(addr, &o, &r->n, err, sizeof err) == 0);
    return 0;
}

/* Opens the raw client on the master, then (seg != 0) on seg's node. */
static int raw_open(raw *r, const char *master, uint64_t seg)
{
    memset(r, 0, sizeof *r);
    kvp_buf_init(&r->body, 64 * MiB);
    kvp_arena_init(&r->a, 64 * MiB);
    kvp_proto_limits_default(&r->lim);
    char err[256];
    kvp_rpc_opts o = {.name = "hostile", .timeout_ms = 5000};
    REQUIRE(kvp_rpc_open(master, &o, &r->m, err, sizeof err) == 0);
    return seg ? raw_node(r, seg) : 0;
}

static void raw_close(raw *r)
{
    kvp_rpc_close(r->m);
    kvp_rpc_close(r->n);
    kvp_buf_free(&r->body);
    kvp_arena_free(&r->a);
}

/* Segment id of the one mounted segment: a PUT_START / PUT_REVOKE probe. */
static uint64_t probe_segment(raw *r)
{
    kvp_replica w;
    REQUIRE(put_start(r, "probe", 4096, &w) == 0);
    kvp_bytes k = bs("probe");
    kvp_msg_keys rv = {{NULL, 0}, 1, &k};
    kvp_enc_keys(&r->body, &rv);
    REQUIRE(call(r, r->m, KVP_OP_PUT_REVOKE) == 0 && r->st == 0);
    return w.segment_id;
}

typedef struct env {
    tp_master m;
    tp_store s;
} env;

static int env_up(env *e, const char *seg_size)
{
    memset(e, 0, sizeof *e);
    static const char *const mopts[] = {"--lease-ttl", "600ms", "--client-ttl", "3s", NULL};
    if (tp_master_start(&e->m, mopts) != 0)
        return -1;
    return tp_store_start(&e->s, e->m.addr, (const char *const[]){"--segment-size", seg_size, NULL});
}

static void env_down(env *e)
{
    tp_store_kill(&e->s);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

/* ---------------------------------------------------------------- tests */

/* Finding 1: a descriptor names its operation, allocation and expiry. A
 * read descriptor cannot write; a descriptor of a removed object reads and
 * writes nothing, even once its space holds another object; an expired one
 * is refused. The object stored in the reused space stays intact. */
static void descriptors_body(env *e)
{
    raw pr, r;
    if (raw_open(&pr, e->m.addr, 0))
        return;
    uint64_t seg = probe_segment(&pr);
    raw_close(&pr);
    tp_sleep_ms(100); /* the probe's space is back once the node says so */
    if (raw_open(&r, e->m.addr, seg))
        return;
    const size_t len = 64 * 1024;
    uint8_t *buf = malloc(len);
    kvp_replica wa, ra, wb, rb;
    CHECK_EQ(put_start(&r, "victim-a", len, &wa), 0);
    CHECK_EQ(seg_write(&r, &wa, 0xAA, len), 0);
    memset(buf, 0xAA, len);
    CHECK_EQ(put_end(&r, "victim-a", XXH3_64bits(buf, len)), 0);
    CHECK_EQ(get(&r, "victim-a", &ra), 0);
    /* the GET's descriptor is for reading only */
    CHECK_EQ(seg_write(&r, &ra, 0x66, len), KVP_EINVALID_WRITE);
    /* the PUT_START's descriptor is for writing only */
    CHECK_EQ(seg_read(&r, &wa, buf), KVP_EINVALID_READ);
    CHECK_EQ(seg_read(&r, &ra, buf), 0);
    CHECK(all(buf, len, 0xAA));

    /* removed: the master tells the node, both descriptors die at once */
    CHECK_EQ(remove_key(&r, "victim-a"), 0);
    tp_sleep_ms(100);
    CHECK_EQ(seg_read(&r, &ra, buf), KVP_EINVALID_READ);
    CHECK_EQ(seg_write(&r, &wa, 0x66, len), KVP_EINVALID_WRITE);

    /* the same space now holds b: the stale descriptors still touch nothing */
    CHECK_EQ(put_start(&r, "victim-b", len, &wb), 0);
    CHECK_EQ(wb.offset, wa.offset);
    CHECK(wb.generation > wa.generation);
    CHECK_EQ(seg_write(&r, &wb, 0xBB, len), 0);
    memset(buf, 0xBB, len);
    CHECK_EQ(put_end(&r, "victim-b", XXH3_64bits(buf, len)), 0);
    CHECK_EQ(seg_read(&r, &ra, buf), KVP_EINVALID_READ);
    CHECK_EQ(seg_write(&r, &wa, 0x66, len), KVP_EINVALID_WRITE);
    /* a forged descriptor: right fields, tag from a guess */
    kvp_replica forged = wb;
    forged.access = KVP_ACCESS_WRITE;
    forged.expires_ms += 3600 * 1000;
    CHECK_EQ(seg_write(&r, &forged, 0x66, len), KVP_EINVALID_WRITE);
    CHECK_EQ(get(&r, "victim-b", &rb), 0);
    memset(buf, 0, len);
    CHECK_EQ(seg_read(&r, &rb, buf), 0);
    CHECK(all(buf, len, 0xBB));

    /* expired: lease_ttl is 600 ms, the node allows 500 ms of clock slack */
    tp_sleep_ms(600 + KVP_GRANT_SLACK_MS + 300);
    CHECK_EQ(seg_read(&r, &rb, buf), KVP_EINVALID_READ);
    CHECK_EQ(get(&r, "victim-b", &rb), 0); /* a fresh lease reads again */
    CHECK_EQ(seg_read(&r, &rb, buf), 0);
    CHECK(all(buf, len, 0xBB));
    free(buf);
    raw_close(&r);
}

TEST(descriptors_bound_to_operation_allocation_and_time)
{
    env e;
    if (env_up(&e, "32MiB") == 0)
        descriptors_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}

/* Finding 2: a put the pool cannot keep is refused before anything is
 * allocated or evicted: the whole segment, 95 % of it, more than 4 GiB. */
static void limits_body(env *e)
{
    raw r;
    if (raw_open(&r, e->m.addr, 0))
        return;
    char key[32];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "resident-%d", i);
        kvp_replica w;
        CHECK_EQ(put_start(&r, key, MiB, &w), 0);
        CHECK_EQ(put_end(&r, key, 0), 0);
    }
    static const uint64_t sizes[] = {32 * MiB, 32 * MiB * 95 / 100, 5ull << 30, UINT64_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        snprintf(key, sizeof key, "huge-%zu", i);
        CHECK_EQ(put_start(&r, key, sizes[i], NULL), KVP_EOBJECT_TOO_LARGE);
        CHECK_EQ(exists(&r, key), 0);
    }
    for (int i = 0; i < 8; i++) { /* nothing was evicted to make room */
        snprintf(key, sizeof key, "resident-%d", i);
        CHECK_EQ(exists(&r, key), 1);
    }
    /* what the pool can keep still goes in */
    kvp_replica w;
    CHECK_EQ(put_start(&r, "big-but-fine", 16 * MiB, &w), 0);
    raw_close(&r);
}

TEST(put_start_refuses_what_cannot_be_kept)
{
    env e;
    if (env_up(&e, "32MiB") == 0)
        limits_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}

/* Finding 3: a replica whose bytes do not match the checksum is reported by
 * the reader and dropped by the master, so the key is not stuck: the next
 * put stores it again and reads are right. */
static void corrupt_body(env *e)
{
    raw r;
    if (raw_open(&r, e->m.addr, 0))
        return;
    const size_t len = 100 * 1024;
    kvp_replica w;
    CHECK_EQ(put_start(&r, "corrupt", len, &w), 0);
    if (raw_node(&r, w.segment_id)) /* same master connection: the put stays pending */
        return;
    CHECK_EQ(seg_write(&r, &w, 0x5A, len), 0);
    CHECK_EQ(put_end(&r, "corrupt", 12345), 0); /* not the checksum of those bytes */

    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", e->m.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(cfg, &c, err, sizeof err), 0);
    if (!c) {
        raw_close(&r);
        return;
    }
    uint8_t *buf = malloc(len), *want = malloc(len);
    CHECK_EQ(kvp_client_get(c, "corrupt", buf, len), KVP_ECHECKSUM_MISMATCH);
    uint64_t end = tp_now_ms() + 2000;
    while (exists(&r, "corrupt") == 1 && tp_now_ms() < end)
        tp_sleep_ms(20);
    CHECK_EQ(exists(&r, "corrupt"), 0);
    for (size_t i = 0; i < len; i++)
        want[i] = (uint8_t)(i * 7);
    CHECK_EQ(kvp_client_put(c, "corrupt", want, len), 0);
    CHECK_EQ(kvp_client_get(c, "corrupt", buf, len), (int64_t)len);
    CHECK(memcmp(buf, want, len) == 0);
    free(buf);
    free(want);
    kvp_client_close(c);
    raw_close(&r);
}

TEST(corrupt_replica_is_dropped_and_key_recovers)
{
    env e;
    if (env_up(&e, "32MiB") == 0)
        corrupt_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}


/* ------------------------------------------- credentials and identity */

/* A HELLO with these credentials (NULL = none), as a hostile client says
 * it (AUTH_CHALLENGE, then HELLO whatever the master proved); the rpc or
 * NULL, *rc. session (may be NULL): presented when not all zero, and the
 * master's answer copied back. */
static kvp_rpc *hello_as(const char *addr, const char *token, const char *node,
                         const char *tenant, uint64_t id, uint8_t *session, int *rc)
{
    char err[256];
    static const uint8_t zero[KVP_SESSION_LEN];
    kvp_rpc_opts o = {.name = "hostile", .client_id = id, .timeout_ms = 3000, .no_hello = 1};
    kvp_rpc *r = NULL;
    *rc = kvp_rpc_open(addr, &o, &r, err, sizeof err);
    if (*rc)
        return NULL;
    kvp_auth_creds c = hr_creds(token, node, tenant,
                                session && memcmp(session, zero, KVP_SESSION_LEN) ? session : NULL);
    const uint8_t *resp;
    uint32_t rl;
    *rc = hr_rpc_hello(r, &c, "hostile", NULL, &resp, &rl);
    kvp_msg_hello_resp h;
    if (*rc == 0 && kvp_dec_hello_resp(resp, rl, &h) != 0)
        *rc = KVP_EPROTOCOL;
    if (*rc) {
        kvp_rpc_close(r);
        return NULL;
    }
    if (session)
        memcpy(session, h.session, KVP_SESSION_LEN);
    return r;
}

static int run_kvpool(const char *const *args, char *out, size_t outlen)
{
    const char *argv[24];
    int n = 0;
    argv[n++] = tp_kvpool_bin();
    for (int i = 0; args[i] && n < 23; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return tp_run_capture(argv, 3, out, outlen, 10000);
}

/* Finding 6: secrets never from a flag; files other users can read are
 * refused; a non-loopback listener needs a credential or --insecure. */
TEST(secrets_from_files_or_env_and_listen_rules)
{
    char out[4096];
    CHECK_EQ(run_kvpool((const char *[]){"master", "--cluster-token", "hunter2", NULL}, out,
                        sizeof out), 2);
    CHECK(strstr(out, "visible to every user") && strstr(out, "KVPOOL_CLUSTER_TOKEN"));
    char path[] = "/tmp/kvp-token-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "tok-from-file\n", 14) == 14);
    close(fd);
    CHECK(chmod(path, 0644) == 0);
    CHECK_EQ(run_kvpool((const char *[]){"master", "--cluster-token-file", path, "--listen",
                                         "127.0.0.1:0", NULL}, out, sizeof out), 2);
    CHECK(strstr(out, "other users"));
    CHECK(chmod(path, 0600) == 0);
    /* the wildcard address without any credential: refused, says what to do */
    CHECK_EQ(run_kvpool((const char *[]){"master", "--listen", "0.0.0.0:0", NULL}, out,
                        sizeof out), 1);
    CHECK(strstr(out, "without a credential") && strstr(out, "--insecure"));
    CHECK_EQ(run_kvpool((const char *[]){"store", "--master", "127.0.0.1:1", "--listen",
                                         "0.0.0.0:0", "--segment-size", "4MiB", NULL}, out,
                        sizeof out), 1);
    CHECK(strstr(out, "without a credential"));
    /* with the token from the file, on the wildcard address: starts; the
     * token is checked */
    tp_master m;
    CHECK_EQ(tp_master_start(&m, (const char *[]){"--cluster-token-file", path, "--listen",
                                                  "0.0.0.0:0", NULL}), 0);
    if (m.pid > 0) {
        snprintf(m.addr, sizeof m.addr, "127.0.0.1:%u", m.port);
        int rc;
        kvp_rpc *r = hello_as(m.addr, "wrong", NULL, NULL, 0, NULL, &rc);
        CHECK(r == NULL && rc == KVP_EAUTH);
        r = hello_as(m.addr, "tok-from-file", NULL, NULL, 0, NULL, &rc);
        CHECK(r != NULL);
        kvp_rpc_close(r);
        CHECK_EQ(tp_master_stop(&m), 0);
    }
    /* --insecure: the operator said so */
    CHECK_EQ(tp_master_start(&m, (const char *[]){"--listen", "0.0.0.0:0", "--insecure", NULL}), 0);
    if (m.pid > 0)
        CHECK_EQ(tp_master_stop(&m), 0);
    unlink(path);
}

/* Finding 6: guessing is slow: past 3 failures a peer's failed HELLOs are
 * answered late (KVP_EAUTH_BACKOFF), while the right token, always checked,
 * is still accepted from the same address (test_attack_flood). */
TEST(failed_hellos_back_off)
{
    setenv("KVPOOL_CLUSTER_TOKEN", "right-token", 1);
    tp_master m;
    int started = tp_master_start(&m, NULL);
    unsetenv("KVPOOL_CLUSTER_TOKEN");
    CHECK_EQ(started, 0);
    if (started)
        return;
    int rc;
    for (int i = 0; i < 3; i++) /* the free failures: answered at once */
        CHECK(hello_as(m.addr, "guess", NULL, NULL, 0, NULL, &rc) == NULL && rc == KVP_EAUTH);
    for (int i = 0; i < 2; i++) { /* then backing off: each answer is held */
        uint64_t t0 = tp_now_ms();
        CHECK(hello_as(m.addr, "guess", NULL, NULL, 0, NULL, &rc) == NULL && rc == KVP_EAUTH_BACKOFF);
        CHECK(tp_now_ms() - t0 >= 500);
    }
    /* credentials are always checked: the right token is accepted from the
     * guessing address at once, and does not reset the guesser's back-off */
    kvp_rpc *r = hello_as(m.addr, "right-token", NULL, NULL, 0, NULL, &rc);
    CHECK(r != NULL);
    kvp_rpc_close(r);
    CHECK(hello_as(m.addr, "guess", NULL, NULL, 0, NULL, &rc) == NULL && rc == KVP_EAUTH_BACKOFF);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* One call whose answer is kvp_msg_results with one code: that code, or
 * the transport / whole-request error. */
static int one_result(kvp_rpc *r, uint16_t op, const void *body, size_t len)
{
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, op, body, len, &st, &resp, &rl);
    if (rc || st)
        return rc ? rc : st;
    kvp_arena a;
    kvp_arena_init(&a, 4096);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_results res;
    rc = kvp_dec_results(resp, rl, &lim, &a, &res) == 0 && res.n == 1 ? res.codes[0]
                                                                       : KVP_EPROTOCOL;
    kvp_arena_free(&a);
    return rc;
}

static int mount_raw(kvp_rpc *r, uint64_t id, const char *tcp_addr)
{
    kvp_endpoint ep = {bs("tcp"), bs(tcp_addr)};
    kvp_seg_desc d = {id, bs(tcp_addr), 1ull << 40, 1, &ep, 7, 1, 0};
    kvp_msg_mount mm = {1, &d};
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_enc_mount(&b, &mm);
    int rc = one_result(r, KVP_OP_MOUNT_SEGMENT, b.data, b.len);
    kvp_buf_free(&b);
    return rc;
}

static int unmount_raw(kvp_rpc *r, uint64_t id)
{
    uint8_t body[16];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&b, &ids);
    return one_result(r, KVP_OP_UNMOUNT_SEGMENT, body, b.len);
}

/* Finding 4: only holders of the node credential mount (a fake 1 TiB
 * segment from a client is refused); knowing a node's client id is not
 * enough to act as it (the session secret is); endpoints are checked. */
TEST(node_credential_and_session_identity)
{
    setenv("KVPOOL_NODE_TOKEN", "node-secret", 1);
    tp_master m;
    int started = tp_master_start(&m, NULL);
    CHECK_EQ(started, 0);
    tp_store s = {0};
    if (started == 0) /* the store takes the node token from the environment too */
        CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "8MiB", NULL}), 0);
    unsetenv("KVPOOL_NODE_TOKEN");
    if (started) {
        tp_store_kill(&s);
        return;
    }
    int rc;
    kvp_rpc *client = hello_as(m.addr, NULL, NULL, NULL, 0, NULL, &rc);
    CHECK(client != NULL);
    CHECK_EQ(mount_raw(client, 0xFA4E, "127.0.0.1:9"), KVP_EILLEGAL_CLIENT);
    CHECK(hello_as(m.addr, NULL, "guessed", NULL, 0, NULL, &rc) == NULL && rc == KVP_EAUTH);
    /* a node: mounts; endpoints must be usable addresses */
    uint8_t sess[KVP_SESSION_LEN] = {0};
    kvp_rpc *node = hello_as(m.addr, NULL, "node-secret", NULL, 0, sess, &rc);
    CHECK(node != NULL);
    CHECK_EQ(mount_raw(node, 0xBAD1, "no-port"), KVP_EINVALID_PARAMS);
    CHECK_EQ(mount_raw(node, 0xBAD2, "127.0.0.1:0"), KVP_EINVALID_PARAMS);
    CHECK_EQ(mount_raw(node, 0x600D, "127.0.0.1:9"), 0);
    uint64_t id = kvp_rpc_client_id(node);
    /* a stranger presenting the node's client id: refused, with the node
     * credential even, unless it has the session secret */
    uint8_t wrong[KVP_SESSION_LEN];
    memset(wrong, 0x5A, sizeof wrong);
    CHECK(hello_as(m.addr, NULL, NULL, NULL, id, NULL, &rc) == NULL && rc == KVP_EILLEGAL_CLIENT);
    CHECK(hello_as(m.addr, NULL, "node-secret", NULL, id, wrong, &rc) == NULL &&
          rc == KVP_EILLEGAL_CLIENT);
    CHECK_EQ(unmount_raw(client, 0x600D), KVP_EILLEGAL_CLIENT);
    /* the node itself, on a second connection with its secret: fine */
    kvp_rpc *node2 = hello_as(m.addr, NULL, "node-secret", NULL, id, sess, &rc);
    CHECK(node2 != NULL);
    if (node2)
        CHECK_EQ(unmount_raw(node2, 0x600D), 0);
    /* the real store mounted with the token: 1 segment left */
    CHECK_EQ(tp_master_segments(m.addr), 1);
    kvp_rpc_close(node2);
    kvp_rpc_close(node);
    kvp_rpc_close(client);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
}

static int put_start_t(kvp_rpc *r, const char *tenant, const char *key, uint64_t size)
{
    kvp_bytes k = bs(key);
    kvp_msg_put_start ps = {bs(tenant), 1, 0, 0, {NULL, 0}, 1, &k, &size, NULL};
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    kvp_enc_put_start(&b, &ps);
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_PUT_START, b.data, b.len, &st, &resp, &rl);
    kvp_buf_free(&b);
    if (rc || st)
        return rc ? rc : st;
    kvp_arena a;
    kvp_arena_init(&a, 1 << 16);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_put_start_resp d;
    rc = kvp_dec_put_start_resp(resp, rl, &lim, &a, &d) == 0 && d.n == 1 ? d.results[0].status
                                                                          : KVP_EPROTOCOL;
    kvp_arena_free(&a);
    return rc;
}

/* The whole-request status of a keyed request naming `tenant`. */
static int keyed_status(kvp_rpc *r, uint16_t op, const char *tenant, const char *key)
{
    kvp_bytes k = bs(key);
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    if (op == KVP_OP_REMOVE) {
        kvp_msg_remove rm = {bs(tenant), 1, 1, &k};
        kvp_enc_remove(&b, &rm);
    } else if (op == KVP_OP_REMOVE_ALL) {
        kvp_msg_remove_all ra = {bs(tenant), 1};
        kvp_enc_remove_all(&b, &ra);
    } else {
        kvp_msg_keys g = {bs(tenant), 1, &k};
        kvp_enc_keys(&b, &g);
    }
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, op, b.data, b.len, &st, &resp, &rl);
    kvp_buf_free(&b);
    return rc ? rc : st;
}

/* Finding 5: tenants isolate. A listed tenant is reached only with its
 * token, a session with a tenant's token reaches only that tenant; empty
 * PUT_STARTs create no tenant. */
TEST(tenants_isolate_and_do_not_fill_the_table)
{
    char path[] = "/tmp/kvp-tenants-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    const char *txt = "# tenant token\nteam-a tok-a-0123456789\nteam-b tok-b-0123456789\n";
    CHECK(write(fd, txt, strlen(txt)) == (ssize_t)strlen(txt));
    close(fd);
    CHECK(chmod(path, 0600) == 0);
    tp_master m;
    tp_store s = {0};
    setenv("KVPOOL_NODE_TOKEN", "node-secret", 1); /* tenants need the node credential */
    int started = tp_master_start(&m, (const char *[]){"--tenant-tokens-file", path,
                                                       "--max-tenants", "4", NULL});
    CHECK_EQ(started, 0);
    if (started) {
        unsetenv("KVPOOL_NODE_TOKEN");
        return;
    }
    CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "8MiB", NULL}), 0);
    unsetenv("KVPOOL_NODE_TOKEN");
    int rc;
    kvp_rpc *a = hello_as(m.addr, NULL, NULL, "tok-a-0123456789", 0, NULL, &rc);
    kvp_rpc *b = hello_as(m.addr, NULL, NULL, "tok-b-0123456789", 0, NULL, &rc);
    kvp_rpc *anon = hello_as(m.addr, NULL, NULL, NULL, 0, NULL, &rc);
    CHECK(a && b && anon);
    CHECK(hello_as(m.addr, NULL, NULL, "tok-c", 0, NULL, &rc) == NULL && rc == KVP_EAUTH);
    if (!a || !b || !anon)
        goto out;
    CHECK_EQ(put_start_t(a, "team-a", "secret-plan", 4096), 0);
    /* b and the anonymous session cannot read, remove or list it */
    static const uint16_t ops[] = {KVP_OP_GET, KVP_OP_EXIST, KVP_OP_PREFIX, KVP_OP_REMOVE,
                                   KVP_OP_REMOVE_ALL, KVP_OP_PUT_REVOKE};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        CHECK_EQ(keyed_status(b, ops[i], "team-a", "secret-plan"), KVP_EILLEGAL_CLIENT);
        CHECK_EQ(keyed_status(anon, ops[i], "team-a", "secret-plan"), KVP_EILLEGAL_CLIENT);
    }
    CHECK_EQ(put_start_t(b, "team-a", "x", 4096), KVP_EILLEGAL_CLIENT);
    /* a bound session stays in its tenant; "default" is unlisted, so open
     * to unbound sessions only */
    CHECK_EQ(put_start_t(a, "team-b", "x", 4096), KVP_EILLEGAL_CLIENT);
    CHECK_EQ(put_start_t(a, "", "x", 4096), KVP_EILLEGAL_CLIENT);
    CHECK_EQ(put_start_t(anon, "", "open-key", 4096), 0);
    /* 200 PUT_STARTs naming new tenants that store nothing (size 0) leave
     * no tenant behind: the table (4) still has room */
    char t[32];
    for (int i = 0; i < 200; i++) {
        snprintf(t, sizeof t, "junk-%d", i);
        CHECK_EQ(put_start_t(anon, t, "k", 0), KVP_EINVALID_PARAMS);
    }
    CHECK_EQ(put_start_t(anon, "real-tenant", "k", 4096), 0);
    CHECK_EQ(put_start_t(b, "team-b", "k", 4096), 0); /* 4 tenants now: default, a, real, b */
    CHECK_EQ(put_start_t(anon, "one-too-many", "k", 4096), KVP_ELIMIT);
out:
    kvp_rpc_close(a);
    kvp_rpc_close(b);
    kvp_rpc_close(anon);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
    unlink(path);
}

/* Finding 5: master memory is capped: past max_master_memory the oldest
 * objects are evicted as for space, and puts keep succeeding. 4000-byte
 * keys make each record ~4 KiB, so memory, not the 64 MiB segment, binds. */
TEST(master_memory_is_capped)
{
    tp_master m;
    tp_store s = {0};
    int started = tp_master_start(&m, (const char *[]){"--max-master-memory", "12MiB", NULL});
    CHECK_EQ(started, 0);
    if (started)
        return;
    CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "64MiB", NULL}), 0);
    raw r;
    if (raw_open(&r, m.addr, 0) == 0) {
        char key[4001];
        int fails = 0;
        for (int i = 0; i < 8000; i++) {
            snprintf(key, sizeof key, "%05d", i);
            memset(key + 5, 'k', sizeof key - 6);
            key[sizeof key - 1] = 0;
            kvp_replica w;
            if (put_start(&r, key, 4096, &w) != 0 || put_end(&r, key, 0) != 0)
                fails++;
        }
        CHECK_EQ(fails, 0);
        kvp_msg_stats_resp st;
        CHECK(call(&r, r.m, KVP_OP_STATS) == 0 && r.st == 0);
        CHECK_EQ(kvp_dec_stats_resp(r.resp, r.rlen, &r.lim, &r.a, &st), 0);
        printf("  objects %llu, evictions %llu\n", (unsigned long long)st.counters[KVP_STAT_OBJECTS],
               (unsigned long long)st.counters[KVP_STAT_EVICTIONS]);
        CHECK(st.counters[KVP_STAT_EVICTIONS] > 0);
        CHECK(st.counters[KVP_STAT_OBJECTS] < 4000); /* 64 MiB would hold 16 k */
        raw_close(&r);
    }
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* ------------------------------------------------------- dead nodes */

/* The name ("host:port") and id of the newest segment per STATS. */
static int newest_segment(const char *master, char *name, size_t len, uint64_t *id, int *nsegs)
{
    raw r;
    if (raw_open(&r, master, 0))
        return -1;
    kvp_msg_stats_resp st;
    int rc = call(&r, r.m, KVP_OP_STATS) == 0 && r.st == 0 &&
                     kvp_dec_stats_resp(r.resp, r.rlen, &r.lim, &r.a, &st) == 0
                 ? 0
                 : -1;
    if (rc == 0) {
        *nsegs = (int)st.n_segs;
        if (st.n_segs > 0) {
            const kvp_seg_stat *g = &st.segs[st.n_segs - 1];
            snprintf(name, len, "%.*s", (int)g->name.len, (const char *)g->name.p);
            *id = g->id;
        }
    }
    raw_close(&r);
    return rc;
}

/* Finding 8: after kill -9 of a node, same-host (shm) puts never
 * "succeed" into orphaned memory: the master skips the dead node's segment
 * once its connection is gone, and a put that still reached it fails there,
 * is reported (SEG_FAILING) and is put again on the live node; every put
 * answered 0 reads back. */
TEST(dead_node_puts_move_to_live_nodes)
{
    tp_master m;
    tp_store a = {0}, b = {0};
    static const char *const mopts[] = {"--client-ttl", "10s", NULL};
    CHECK_EQ(tp_master_start(&m, mopts), 0);
    CHECK_EQ(tp_store_start(&a, m.addr, (const char *const[]){"--segment-size", "32MiB", NULL}), 0);
    char aname[256] = "";
    uint64_t aid = 0;
    int n = 0;
    CHECK_EQ(newest_segment(m.addr, aname, sizeof aname, &aid, &n), 0);
    CHECK_EQ(tp_store_start(&b, m.addr, (const char *const[]){"--segment-size", "32MiB", NULL}), 0);
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"preferred_segment\": \"%s\"}",
             m.addr, aname);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(cfg, &c, err, sizeof err), 0);
    if (!c)
        goto out;
    static uint8_t val[64 * 1024], back[64 * 1024];
    char key[64];
    for (int i = 0; i < 5; i++) { /* on a, through shared memory */
        snprintf(key, sizeof key, "before-%d", i);
        memset(val, i, sizeof val);
        CHECK_EQ(kvp_client_put(c, key, val, sizeof val), 0);
    }
    tp_store_kill(&a);
    int failed = 0, first_ok = -1;
    for (int i = 0; i < 60; i++) {
        snprintf(key, sizeof key, "after-%d", i);
        memset(val, 100 + i, sizeof val);
        int rc = kvp_client_put(c, key, val, sizeof val);
        if (rc) {
            failed++;
            CHECK(rc == KVP_ETRANSFER_FAIL || rc == KVP_ERPC_TIMEOUT);
        } else if (first_ok < 0) {
            first_ok = i;
        }
    }
    printf("  after the kill: %d of 60 puts failed, first success at put %d\n", failed, first_ok);
    CHECK_EQ(failed, 0); /* none fails: moved to the live node */
    for (int i = 0; i < 60; i++) { /* every put that succeeded reads back */
        snprintf(key, sizeof key, "after-%d", i);
        int64_t got = kvp_client_get(c, key, back, sizeof back);
        if (got < 0)
            continue;
        CHECK_EQ(got, (int64_t)sizeof back);
        memset(val, 100 + i, sizeof val);
        CHECK(memcmp(back, val, sizeof val) == 0);
    }
    kvp_client_close(c);
out:
    tp_store_kill(&a);
    tp_store_kill(&b);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* Finding 8: a node restarted on the same address within the client TTL
 * takes its name back (the old segment is replaced) instead of exiting. */
TEST(restarted_node_takes_its_name_back)
{
    tp_master m;
    tp_store s = {0};
    static const char *const mopts[] = {"--client-ttl", "30s", NULL};
    CHECK_EQ(tp_master_start(&m, mopts), 0);
    char listen[64];
    CHECK_EQ(tp_free_addr(listen, sizeof listen), 0);
    const char *const sargs[] = {"--segment-size", "8MiB", "--listen", listen, NULL};
    CHECK_EQ(tp_store_start(&s, m.addr, sargs), 0);
    char name[256];
    uint64_t id1 = 0, id2 = 0;
    int n = 0;
    CHECK_EQ(newest_segment(m.addr, name, sizeof name, &id1, &n), 0);
    tp_store_kill(&s);
    /* the count stays 1 (replaced), so spawn and watch the id instead */
    tp_master p;
    const char *const rargs[] = {"--master", m.addr, "--segment-size", "8MiB", "--listen", listen,
                                 NULL};
    CHECK_EQ(tp_store_spawn(&p, rargs), 0);
    uint64_t end = tp_now_ms() + 5000;
    do {
        tp_sleep_ms(50);
        CHECK_EQ(newest_segment(m.addr, name, sizeof name, &id2, &n), 0);
    } while ((id2 == id1 || n != 1) && tp_now_ms() < end);
    CHECK(id2 != id1);
    CHECK_EQ(n, 1);
    CHECK(tp_master_alive(&p, NULL)); /* it did not exit with "segment already exists" */
    CHECK_EQ(tp_master_stop(&p), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}
