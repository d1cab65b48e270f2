/*
 * test_attack_xfer.c -- transfers that outlive their allocation (hardening
 * issue, item 1), against a real `kvpool master` and `kvpool store` with a
 * 64 MiB segment, driven by raw protocol clients.
 *
 * The node checks a descriptor when a SEG_READ / SEG_WRITE frame starts;
 * the bytes then move as the socket drains. The attacks stretch a transfer
 * across the free of its allocation and its reuse by another tenant:
 *   - a slow reader keeps reading after its object was removed and another
 *     tenant's value landed in the same space;
 *   - a slow writer keeps writing after it revoked its put and another
 *     tenant's value landed there;
 *   - a writer writes again after PUT_END.
 * Each must fail: no byte of the other tenant's value reaches the reader,
 * the victim's bytes stay intact, the cut write is never answered OK, and a
 * WRITE descriptor is refused once its object is published.
 *
 * The stalled transfers use raw sockets (a 4 KiB receive buffer for the
 * reader) so that the test controls when bytes move; the rest goes through
 * kvp_rpc. To make the reuse certain, a pinned filler takes the other half
 * of the segment: the victim's put can only land where the attacker's
 * object was.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/buf.h"
#include "harness.h"
#include "kvpool.h"
#include "net/net.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

#define MiB (1024ull * 1024)
#define HALF (30 * MiB) /* two of them fit under the 95 % watermark of 64 MiB */

/* ---------------------------------------------------------- raw client */

typedef struct raw {
    kvp_rpc *m;    /* master */
    kvp_rpc *n;    /* the node's segment server (TCP) */
    char node[300];
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

/* PUT_START of one key of tenant t: its first (WRITE) descriptor in *w. */
static int put_start(raw *r, const char *t, const char *key, uint64_t size, uint32_t flags,
                     kvp_replica *w)
{
    kvp_bytes k = bs(key);
    kvp_msg_put_start ps = {bs(t), 1, flags, 0, {NULL, 0}, 1, &k, &size, NULL};
    kvp_enc_put_start(&r->body, &ps);
    REQUIRE(call(r, r->m, KVP_OP_PUT_START) == 0 && r->st == 0);
    kvp_msg_put_start_resp d;
    REQUIRE(kvp_dec_put_start_resp(r->resp, r->rlen, &r->lim, &r->a, &d) == 0 && d.n == 1);
    if (d.results[0].status == 0 && w)
        *w = d.results[0].replicas[0];
    return d.results[0].status;
}

static int keyed(raw *r, uint16_t op, const char *t, const char *key, uint64_t arg)
{
    kvp_bytes k = bs(key);
    if (op == KVP_OP_PUT_END || op == KVP_OP_RELEASE) {
        kvp_msg_put_end pe = {bs(t), 1, &k, &arg};
        kvp_enc_put_end(&r->body, &pe);
    } else if (op == KVP_OP_REMOVE) {
        kvp_msg_remove rm = {bs(t), (uint8_t)arg, 1, &k};
        kvp_enc_remove(&r->body, &rm);
    } else {
        kvp_msg_keys g = {bs(t), 1, &k};
        kvp_enc_keys(&r->body, &g);
    }
    REQUIRE(call(r, r->m, op) == 0 && r->st == 0);
    kvp_msg_results res;
    REQUIRE(kvp_dec_results(r->resp, r->rlen, &r->lim, &r->a, &res) == 0 && res.n == 1);
    return res.codes[0];
}

/* GET of one key: its first (READ) descriptor and lease id. */
static int get(raw *r, const char *t, const char *key, kvp_replica *rd, uint64_t *lease)
{
    kvp_bytes k = bs(key);
    kvp_msg_keys g = {bs(t), 1, &k};
    kvp_enc_keys(&r->body, &g);
    REQUIRE(call(r, r->m, KVP_OP_GET) == 0 && r->st == 0);
    kvp_msg_get_resp d;
    REQUIRE(kvp_dec_get_resp(r->resp, r->rlen, &r->lim, &r->a, &d) == 0 && d.n == 1);
    if (d.results[0].status == 0) {
        *rd = d.results[0].replicas[0];
        if (lease)
            *lease = d.results[0].lease_id;
    }
    return d.results[0].status;
}

/* SEG_WRITE of len bytes of `fill` through kvp_rpc: the node's status. */
static int seg_write(raw *r, const kvp_replica *d, uint8_t fill, size_t len)
{
    kvp_enc_seg_io(&r->body, d);
    uint8_t *p = malloc(len);
    REQUIRE(p);
    memset(p, fill, len);
    kvp_buf_put(&r->body, p, len);
    free(p);
    REQUIRE(call(r, r->n, KVP_OP_SEG_WRITE) == 0);
    return r->st;
}

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

static int overlap(const kvp_replica *x, const kvp_replica *y)
{
    return x->offset < y->offset + y->length && y->offset < x->offset + x->length;
}

static size_t count_of(const uint8_t *p, size_t n, uint8_t v)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == v;
    return k;
}

/* A whole put of tenant t through kvp_rpc: `size` bytes of `fill`. Retries
 * a put refused for room (-200) for up to 5 s: freed space may wait for the
 * node to stop the transfers on it. */
static int put_value(raw *r, const char *t, const char *key, uint64_t size, uint8_t fill,
                     uint32_t flags, kvp_replica *w)
{
    int st;
    uint64_t end = tp_now_ms() + 5000;
    while ((st = put_start(r, t, key, size, flags, w)) == KVP_ENO_AVAILABLE_HANDLE &&
           tp_now_ms() < end)
        tp_sleep_ms(20);
    if (st)
        return st;
    REQUIRE(seg_write(r, w, fill, size) == 0);
    uint8_t *p = malloc(size);
    REQUIRE(p);
    memset(p, fill, size);
    uint64_t cs = XXH3_64bits(p, size);
    free(p);
    return keyed(r, KVP_OP_PUT_END, t, key, cs);
}

static int raw_open(raw *r, const char *master)
{
    memset(r, 0, sizeof *r);
    kvp_buf_init(&r->body, 64 * MiB);
    kvp_arena_init(&r->a, 64 * MiB);
    kvp_proto_limits_default(&r->lim);
    char err[256];
    kvp_rpc_opts o = {.name = "attacker", .timeout_ms = 10000};
    REQUIRE(kvp_rpc_open(master, &o, &r->m, err, sizeof err) == 0);
    /* the segment's TCP endpoint: a probe put names the segment */
    kvp_replica w;
    REQUIRE(put_start(r, "probe", "probe", 4096, 0, &w) == 0);
    REQUIRE(keyed(r, KVP_OP_PUT_REVOKE, "probe", "probe", 0) == 0);
    kvp_msg_ids ids = {1, &w.segment_id};
    kvp_enc_ids(&r->body, &ids);
    REQUIRE(call(r, r->m, KVP_OP_SEGMENT_INFO) == 0 && r->st == 0);
    kvp_msg_seg_info_resp si;
    REQUIRE(kvp_dec_seg_info_resp(r->resp, r->rlen, &r->lim, &r->a, &si) == 0 && si.n == 1);
    for (uint32_t i = 0; i < si.infos[0].desc.n_endpoints; i++) {
        const kvp_endpoint *e = &si.infos[0].desc.endpoints[i];
        if (e->transport.len == 3 && !memcmp(e->transport.p, "tcp", 3))
            snprintf(r->node, sizeof r->node, "%.*s", (int)e->addr.len,
                     (const char *)e->addr.p);
    }
    REQUIRE(r->node[0]);
    REQUIRE(kvp_rpc_open(r->node, &o, &r->n, err, sizeof err) == 0);
    return 0;
}

static void raw_close(raw *r)
{
    kvp_rpc_close(r->m);
    kvp_rpc_close(r->n);
    kvp_buf_free(&r->body);
    kvp_arena_free(&r->a);
}

/* ------------------------------------------- a socket the test drives */

/* Sends all of p; 0, or -1 once the peer is gone. */
static int send_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Receives exactly n bytes within ms: n, or fewer when the peer closed or
 * the time ran out. */
static size_t recv_upto(int fd, void *p, size_t n, int ms)
{
    uint8_t *c = p;
    size_t got = 0;
    uint64_t end = tp_now_ms() + (uint64_t)ms;
    while (got < n) {
        uint64_t now = tp_now_ms();
        if (now >= end)
            break;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, (int)(end - now)) <= 0)
            continue;
        ssize_t r = recv(fd, c + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* A TCP connection to the node that said HELLO; rcvbuf > 0 sets a small
 * receive buffer before connecting (the window stays small). */
static int node_conn(const char *addr, int rcvbuf)
{
    char host[256];
    uint16_t port;
    REQUIRE(kvp_net_split(addr, host, sizeof host, &port) == 0);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(0x7f000001)};
    REQUIRE(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    kvp_buf b;
    kvp_buf_init(&b, 1 * MiB);
    size_t off = kvp_frame_begin(&b, KVP_OP_HELLO, 0, 1, 0);
    kvp_msg_hello h = {KVP_PROTO_VERSION, 0x5107, bs("slow"), {{NULL, 0}}};
    kvp_enc_hello(&b, &h);
    kvp_frame_end(&b, off);
    REQUIRE(send_all(fd, b.data, b.len) == 0);
    kvp_buf_free(&b);
    uint8_t hdr[KVP_FRAME_HDR];
    REQUIRE(recv_upto(fd, hdr, sizeof hdr, 5000) == sizeof hdr);
    kvp_frame_hdr rh;
    REQUIRE(kvp_frame_hdr_decode(hdr, 1u << 20, &rh) == 0 && rh.status == 0);
    uint8_t body[256];
    REQUIRE(rh.body_len <= sizeof body && recv_upto(fd, body, rh.body_len, 5000) == rh.body_len);
    return fd;
}

/* The frame header and seg_io of a SEG_READ / SEG_WRITE of d. */
static void seg_frame(kvp_buf *b, uint16_t op, const kvp_replica *d)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, 7,
                       (uint32_t)(KVP_SEG_IO_SIZE + (op == KVP_OP_SEG_WRITE ? d->length : 0)), 0};
    uint8_t hdr[KVP_FRAME_HDR];
    kvp_frame_hdr_encode(hdr, &h);
    kvp_buf_put(b, hdr, sizeof hdr);
    kvp_enc_seg_io(b, d);
}

typedef struct env {
    tp_master m;
    tp_store s;
} env;

static int env_up_ttl(env *e, const char *ttl)
{
    memset(e, 0, sizeof *e);
    const char *const opts[] = {"--client-ttl", ttl, "--lease-ttl", ttl, NULL};
    if (tp_master_start(&e->m, ttl ? opts : NULL) != 0)
        return -1;
    return tp_store_start(&e->s, e->m.addr,
                          (const char *const[]){"--segment-size", "64MiB", NULL});
}

static int env_up(env *e) { return env_up_ttl(e, NULL); }

static void env_down(env *e)
{
    tp_store_kill(&e->s);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

/* The other half of the segment, pinned: the victim can only go where the
 * attacker's object was. */
static int fill_other_half(raw *r)
{
    kvp_replica w;
    REQUIRE(put_value(r, "filler", "filler", HALF, 0x33, KVP_PUT_PIN, &w) == 0);
    return 0;
}

/* ---------------------------------------------------------------- tests */

/* A reader with a valid READ descriptor of its own 32 MiB object reads
 * 1 MiB and pauses; it releases its lease and removes the object; another
 * tenant puts 32 MiB in the same space; the reader reads on. On 0a85b26 it
 * received about 29 MiB of the other tenant's value. Now its connection is
 * cut when the object is removed, before the space can be reused: not one
 * byte of the victim's value reaches it, and the victim's value is whole. */
static void slow_reader_body(env *e)
{
    raw a, v;
    if (raw_open(&a, e->m.addr) || raw_open(&v, e->m.addr))
        return;
    kvp_replica wa, ra, wv, rv;
    uint64_t lease;
    CHECK_EQ(put_value(&a, "tenant-a", "mine", HALF, 0xAA, 0, &wa), 0);
    CHECK(fill_other_half(&v) == 0);
    CHECK_EQ(get(&a, "tenant-a", "mine", &ra, &lease), 0);

    int fd = node_conn(a.node, 4096);
    kvp_buf b;
    kvp_buf_init(&b, 1 * MiB);
    seg_frame(&b, KVP_OP_SEG_READ, &ra);
    CHECK(send_all(fd, b.data, b.len) == 0);
    kvp_buf_free(&b);
    uint8_t *got = malloc(KVP_FRAME_HDR + HALF);
    CHECK(got);
    size_t n = recv_upto(fd, got, KVP_FRAME_HDR + MiB, 10000);
    CHECK_EQ(n, KVP_FRAME_HDR + MiB);
    kvp_frame_hdr rh;
    CHECK(kvp_frame_hdr_decode(got, 1u << 30, &rh) == 0 && rh.status == 0 &&
          rh.body_len == HALF);
    CHECK_EQ(count_of(got + KVP_FRAME_HDR, MiB, 0xAA), MiB);

    /* pause: the object goes, another tenant's value takes its space */
    CHECK_EQ(keyed(&a, KVP_OP_RELEASE, "tenant-a", "mine", lease), 0);
    CHECK_EQ(keyed(&a, KVP_OP_REMOVE, "tenant-a", "mine", 0), 0);
    CHECK_EQ(put_value(&v, "tenant-v", "victim", HALF, 0x5A, 0, &wv), 0);
    CHECK(overlap(&wv, &ra)); /* the attack's premise: the same space */

    /* the reader reads on */
    n += recv_upto(fd, got + n, KVP_FRAME_HDR + HALF - n, 10000);
    size_t leaked = count_of(got + KVP_FRAME_HDR, n - KVP_FRAME_HDR, 0x5A);
    printf("  reader received %zu KiB of %llu KiB, %zu KiB of them the victim's\n",
           (n - KVP_FRAME_HDR) >> 10, HALF >> 10, leaked >> 10);
    CHECK_EQ(leaked, 0);
    CHECK(n < KVP_FRAME_HDR + HALF); /* cut: the answer never completes */
    close(fd);

    /* the victim's value is whole */
    CHECK_EQ(get(&v, "tenant-v", "victim", &rv, NULL), 0);
    uint8_t *back = malloc(HALF);
    CHECK(back);
    CHECK_EQ(seg_read(&v, &rv, back), 0);
    CHECK_EQ(count_of(back, HALF, 0x5A), HALF);
    free(back);
    free(got);
    raw_close(&a);
    raw_close(&v);
}

TEST(slow_reader_gets_no_byte_of_the_next_allocation)
{
    env e;
    if (env_up(&e) == 0)
        slow_reader_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}

/* A writer sends a SEG_WRITE header and 1 MiB of the body, pauses and
 * revokes its put; another tenant's 32 MiB put lands in that space; the
 * writer sends the rest. On 0a85b26 the node answered OK and the victim's
 * object was destroyed (checksum mismatch). Now the write is cut when the
 * put is revoked: it is never answered OK and the victim's bytes stay. */
static void slow_writer_body(env *e)
{
    raw a, v;
    if (raw_open(&a, e->m.addr) || raw_open(&v, e->m.addr))
        return;
    CHECK(fill_other_half(&v) == 0);
    kvp_replica wa, wv, rv;
    CHECK_EQ(put_start(&a, "tenant-a", "mine", HALF, 0, &wa), 0);

    int fd = node_conn(a.node, 0);
    uint8_t *body = malloc(HALF);
    CHECK(body);
    memset(body, 0xEE, HALF);
    kvp_buf b;
    kvp_buf_init(&b, 1 * MiB);
    seg_frame(&b, KVP_OP_SEG_WRITE, &wa);
    CHECK(send_all(fd, b.data, b.len) == 0);
    kvp_buf_free(&b);
    CHECK(send_all(fd, body, MiB) == 0);
    tp_sleep_ms(200); /* the node took the first MiB */

    CHECK_EQ(keyed(&a, KVP_OP_PUT_REVOKE, "tenant-a", "mine", 0), 0);
    CHECK_EQ(put_value(&v, "tenant-v", "victim", HALF, 0x5A, 0, &wv), 0);
    CHECK(overlap(&wv, &wa)); /* the attack's premise: the same space */

    /* the rest of the body, then the answer */
    int sent = send_all(fd, body + MiB, HALF - MiB) == 0;
    uint8_t hdr[KVP_FRAME_HDR];
    size_t n = recv_upto(fd, hdr, sizeof hdr, 5000);
    kvp_frame_hdr rh;
    int answered_ok = n == sizeof hdr && kvp_frame_hdr_decode(hdr, 1u << 20, &rh) == 0 &&
                      rh.status == 0;
    printf("  writer: rest of the body %s, %s\n", sent ? "sent" : "refused (connection cut)",
           answered_ok ? "answered OK" : "not answered OK");
    CHECK(!answered_ok);
    close(fd);

    /* the victim's value is whole */
    CHECK_EQ(get(&v, "tenant-v", "victim", &rv, NULL), 0);
    uint8_t *back = malloc(HALF);
    CHECK(back);
    CHECK_EQ(seg_read(&v, &rv, back), 0);
    size_t intact = count_of(back, HALF, 0x5A);
    printf("  victim: %zu KiB of %llu KiB intact\n", intact >> 10, HALF >> 10);
    CHECK_EQ(intact, HALF);
    free(back);
    free(body);
    raw_close(&a);
    raw_close(&v);
}

TEST(slow_writer_writes_nothing_into_the_next_allocation)
{
    env e;
    if (env_up(&e) == 0)
        slow_writer_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}

/* Once PUT_END published an object its WRITE descriptor is refused (on
 * 0a85b26 it worked until the put deadline, corrupting the object), and a
 * write still in flight at PUT_END is cut, never answered OK. */
static void write_after_put_end_body(env *e)
{
    raw a;
    if (raw_open(&a, e->m.addr))
        return;
    kvp_replica w, rd;
    CHECK_EQ(put_value(&a, "tenant-a", "done", MiB, 0x11, 0, &w), 0);
    tp_sleep_ms(100);
    CHECK_EQ(seg_write(&a, &w, 0x66, MiB), KVP_EINVALID_WRITE);
    uint8_t *back = malloc(MiB);
    CHECK(back);
    CHECK_EQ(get(&a, "tenant-a", "done", &rd, NULL), 0);
    CHECK_EQ(seg_read(&a, &rd, back), 0);
    CHECK_EQ(count_of(back, MiB, 0x11), MiB);

    /* in flight at PUT_END: half the body, PUT_END, the other half */
    kvp_replica w2;
    CHECK_EQ(put_start(&a, "tenant-a", "late", 4 * MiB, 0, &w2), 0);
    CHECK_EQ(seg_write(&a, &w2, 0x22, 4 * MiB), 0);
    uint8_t *p = malloc(4 * MiB);
    CHECK(p);
    memset(p, 0x22, 4 * MiB);
    uint64_t cs = XXH3_64bits(p, 4 * MiB);
    int fd = node_conn(a.node, 0);
    kvp_buf b;
    kvp_buf_init(&b, 1 * MiB);
    seg_frame(&b, KVP_OP_SEG_WRITE, &w2);
    CHECK(send_all(fd, b.data, b.len) == 0);
    kvp_buf_free(&b);
    memset(p, 0x77, 4 * MiB);
    CHECK(send_all(fd, p, MiB) == 0);
    tp_sleep_ms(200);
    CHECK_EQ(keyed(&a, KVP_OP_PUT_END, "tenant-a", "late", cs), 0);
    tp_sleep_ms(200);
    send_all(fd, p + MiB, 3 * MiB);
    uint8_t hdr[KVP_FRAME_HDR];
    size_t n = recv_upto(fd, hdr, sizeof hdr, 5000);
    kvp_frame_hdr rh;
    CHECK(!(n == sizeof hdr && kvp_frame_hdr_decode(hdr, 1u << 20, &rh) == 0 && rh.status == 0));
    close(fd);
    /* what landed before PUT_END landed (the writer's own doing); nothing after it */
    uint8_t *p4 = malloc(4 * MiB);
    CHECK(p4);
    CHECK_EQ(get(&a, "tenant-a", "late", &rd, NULL), 0);
    CHECK_EQ(seg_read(&a, &rd, p4), 0);
    CHECK_EQ(count_of(p4 + MiB, 3 * MiB, 0x22), 3 * MiB);
    free(p4);
    free(p);
    free(back);
    raw_close(&a);
}

TEST(write_descriptor_dies_at_put_end)
{
    env e;
    if (env_up(&e) == 0)
        write_after_put_end_body(&e);
    else
        CHECK(!"master or store did not start");
    env_down(&e);
}



/* The master forgets a node that went silent (client TTL) -- and with it
 * every allocation and quarantine there -- while a slow writer's transfer
 * is in flight (its WRITE descriptor lives until the put deadline, longer
 * than any lease); the node comes back and remounts, and another tenant's
 * value lands in the space; the writer sends the rest. On 0a85b26 the node
 * kept its secret and the write went on into the victim's value. Now
 * every remount re-keys and cuts the transfers begun before it. */
static void remount_body(env *e)
{
    raw a, v;
    if (raw_open(&a, e->m.addr) || raw_open(&v, e->m.addr))
        return;
    kvp_replica wa, wv, rv;
    CHECK_EQ(put_start(&a, "tenant-a", "mine", HALF, 0, &wa), 0);
    int fd = node_conn(a.node, 0);
    uint8_t *body = malloc(HALF);
    CHECK(body);
    memset(body, 0xEE, HALF);
    kvp_buf b;
    kvp_buf_init(&b, 1 * MiB);
    seg_frame(&b, KVP_OP_SEG_WRITE, &wa);
    CHECK(send_all(fd, b.data, b.len) == 0);
    kvp_buf_free(&b);
    CHECK(send_all(fd, body, MiB) == 0);
    tp_sleep_ms(200);

    /* the node freezes past the client TTL: the master drops its segment */
    CHECK(kill(e->s.pid, SIGSTOP) == 0);
    uint64_t end = tp_now_ms() + 10000;
    while (tp_master_segments(e->m.addr) != 0 && tp_now_ms() < end) {
        keyed(&a, KVP_OP_EXIST, "tenant-a", "mine", 0); /* the clients stay alive */
        keyed(&v, KVP_OP_EXIST, "tenant-v", "victim", 0);
        tp_sleep_ms(100);
    }
    CHECK_EQ(tp_master_segments(e->m.addr), 0);
    CHECK(kill(e->s.pid, SIGCONT) == 0);
    end = tp_now_ms() + 10000;
    while (tp_master_segments(e->m.addr) != 1 && tp_now_ms() < end)
        tp_sleep_ms(50);
    CHECK_EQ(tp_master_segments(e->m.addr), 1);
    CHECK_EQ(put_value(&v, "tenant-v", "victim", HALF, 0x5A, 0, &wv), 0);
    CHECK(overlap(&wv, &wa)); /* the attack's premise: the same space */

    int sent = send_all(fd, body + MiB, HALF - MiB) == 0;
    uint8_t hdr[KVP_FRAME_HDR];
    size_t n = recv_upto(fd, hdr, sizeof hdr, 5000);
    kvp_frame_hdr rh;
    int answered_ok = n == sizeof hdr && kvp_frame_hdr_decode(hdr, 1u << 20, &rh) == 0 &&
                      rh.status == 0;
    printf("  writer: rest of the body %s, %s\n", sent ? "sent" : "refused (connection cut)",
           answered_ok ? "answered OK" : "not answered OK");
    CHECK(!answered_ok);
    close(fd);
    CHECK_EQ(get(&v, "tenant-v", "victim", &rv, NULL), 0);
    uint8_t *back = malloc(HALF);
    CHECK(back);
    CHECK_EQ(seg_read(&v, &rv, back), 0);
    size_t intact = count_of(back, HALF, 0x5A);
    printf("  victim: %zu KiB of %llu KiB intact\n", intact >> 10, HALF >> 10);
    CHECK_EQ(intact, HALF);
    free(back);
    free(body);
    raw_close(&a);
    raw_close(&v);
}

TEST(remount_cuts_transfers_begun_before)
{
    env e;
    if (env_up_ttl(&e, "2s") == 0)
        remount_body(&e);
    else
        CHECK(!"master or store did not start");
    if (e.s.pid > 0)
        kill(e.s.pid, SIGCONT);
    env_down(&e);
}
