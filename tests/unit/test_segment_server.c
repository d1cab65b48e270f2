/* test_segment_server.c -- segment + segment server + client data plane,
 * in process: round trips over tcp and shm, refusals, hostile input; the
 * shm trust rules (sealed memfd, checked fd, private socket, SO_PEERCRED,
 * stale sockets, path length). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/xfer.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "harness.h"
#include "hello_raw.h"
#include <xxhash.h>
#include "kvpool.h"
#include "net/net.h"
#include "node/grants.h"
#include "node/node.h"
#include "node/segment.h"
#include "node/server.h"
#include "node/unixsock.h"
#include "proto/proto.h"

#define MiB (1ull << 20)
#define SEG_ID 0x1234567890abcdefull
#define SECRET 0x5eed5eed5eedull

typedef struct fx {
    kvp_segment *seg;
    kvp_segserver *srv;
    char addr[64];
    char unix_path[108];
    char shm_ep[256];
    kvp_endpoint eps[2];
    kvp_seg_desc desc;
    kvp_grants *grants;
} fx;

/* lim: NULL = the default limits. */
static int fx_start_lim(fx *f, uint64_t size, const char *token, const kvp_segserver_limits *lim)
{
    memset(f, 0, sizeof *f);
    kvp_log_set_level(KVP_LOG_ERROR);
    char err[256];
    REQUIRE(kvp_segment_create(size, "test", &f->seg, err, sizeof err) == 0);
    snprintf(f->unix_path, sizeof f->unix_path, "/tmp/kvp-test-%d.sock", (int)getpid());
    REQUIRE(kvp_grants_create(kvp_segment_size(f->seg), SECRET, &f->grants) == 0);
    kvp_segserver_opts o = {"127.0.0.1:0", f->unix_path, 2, token, SEG_ID, f->grants, {0, 0},
                            NULL, 0};
    REQUIRE(kvp_segserver_start_lim(f->seg, &o, lim, &f->srv, err, sizeof err) == 0);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%u", kvp_segserver_port(f->srv));
    snprintf(f->shm_ep, sizeof f->shm_ep, "%s:%s", kvp_node_host_id(), f->unix_path);
    f->eps[0] = (kvp_endpoint){{(const uint8_t *)"tcp", 3},
                               {(const uint8_t *)f->addr, (uint32_t)strlen(f->addr)}};
    f->eps[1] = (kvp_endpoint){{(const uint8_t *)"shm", 3},
                               {(const uint8_t *)f->shm_ep, (uint32_t)strlen(f->shm_ep)}};
    f->desc = (kvp_seg_desc){SEG_ID, {(const uint8_t *)f->addr, (uint32_t)strlen(f->addr)},
                             kvp_segment_size(f->seg), 2, f->eps, 0, 0, 0};
    return 0;
}

static int fx_start(fx *f, uint64_t size, const char *token)
{
    return fx_start_lim(f, size, token, NULL);
}

static void fx_stop(fx *f)
{
    kvp_segserver_stop(f->srv);
    kvp_grants_destroy(f->grants);
    kvp_segment_destroy(f->seg);
}

/* A descriptor as the master would issue it (WRITE; run_as and
 * seg_io_frame re-issue it for the operation they perform). */
static kvp_replica rep_seg(uint64_t seg, uint64_t off, uint64_t len, uint64_t gen)
{
    kvp_replica r = {seg, off, len, gen, kvp_now_ms() + 60000, KVP_ACCESS_WRITE, 0};
    r.tag = kvp_replica_tag(SECRET, &r);
    return r;
}
static kvp_replica rep(uint64_t off, uint64_t len, uint64_t gen)
{
    return rep_seg(SEG_ID, off, len, gen);
}

/* r re-issued for `access`, keeping a deliberately wrong tag wrong. */
static void reissue(kvp_replica *r, uint32_t access)
{
    uint64_t bad = r->tag ^ kvp_replica_tag(SECRET, r);
    r->access = access;
    r->tag = kvp_replica_tag(SECRET, r) ^ bad;
}

/* kvp_xfer_run with every descriptor issued for the operation. */
static int run_as(kvp_xfer *x, int is_write, kvp_xfer_op *ops, size_t n, uint64_t deadline)
{
    for (size_t i = 0; i < n; i++)
        reissue(&ops[i].rep, is_write ? KVP_ACCESS_WRITE : KVP_ACCESS_READ);
    return kvp_xfer_run(x, is_write, ops, n, deadline);
}

static __thread uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (uint8_t)s;
    }
}

/* Writes then reads back `n` values of the given sizes, each split into
 * `pieces` iovecs; compares. 0 on success. */
static int roundtrip(kvp_xfer *x, const uint64_t *sizes, size_t n, int pieces, uint64_t base_off)
{
    kvp_xfer_op *w = calloc(n, sizeof *w), *r = calloc(n, sizeof *r);
    struct iovec *wi = calloc(n * (size_t)pieces, sizeof *wi);
    struct iovec *ri = calloc(n * (size_t)pieces, sizeof *ri);
    uint8_t **src = calloc(n, sizeof *src), **dst = calloc(n, sizeof *dst);
    REQUIRE(w && r && wi && ri && src && dst);
    uint64_t off = base_off;
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i]);
        fill(src[i], sizes[i], rnd());
        memset(dst[i], 0xEE, sizes[i]);
        int np = sizes[i] < (uint64_t)pieces ? 1 : pieces;
        uint64_t per = sizes[i] / (uint64_t)np, at = 0;
        for (int k = 0; k < np; k++) {
            uint64_t l = k == np - 1 ? sizes[i] - at : per;
            wi[i * (size_t)pieces + (size_t)k] = (struct iovec){src[i] + at, l};
            ri[i * (size_t)pieces + (size_t)k] = (struct iovec){dst[i] + at, l};
            at += l;
        }
        w[i] = (kvp_xfer_op){.rep = rep(off, sizes[i], i + 1), .iov = wi + i * (size_t)pieces, .iovcnt = np, .status = 99, .want_csum = 1, .csum = 0};
        r[i] = (kvp_xfer_op){.rep = rep(off, sizes[i], i + 1), .iov = ri + i * (size_t)pieces, .iovcnt = np, .status = 99, .want_csum = 1, .csum = 0};
        off += (sizes[i] + 4095) & ~4095ull;
    }
    if (run_as(x, 1, w, n, kvp_now_ms() + 20000) != 0)
        rc = -1;
    for (size_t i = 0; i < n && !rc; i++)
        if (w[i].status != 0) {
            fprintf(stderr, "write %zu: %d\n", i, w[i].status);
            rc = -1;
        }
    if (!rc && run_as(x, 0, r, n, kvp_now_ms() + 20000) != 0)
        rc = -1;
    for (size_t i = 0; i < n && !rc; i++) {
        if (r[i].status != 0) {
            fprintf(stderr, "read %zu: %d\n", i, r[i].status);
            rc = -1;
        } else if (memcmp(src[i], dst[i], sizes[i]) != 0) {
            fprintf(stderr, "read %zu: bytes differ\n", i);
            rc = -1;
        } else if (w[i].csum != XXH3_64bits(src[i], sizes[i]) || r[i].csum != w[i].csum) {
            fprintf(stderr, "op %zu: checksum computed in flight is wrong\n", i);
            rc = -1;
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(src[i]);
        free(dst[i]);
    }
    free(src);
    free(dst);
    free(w);
    free(r);
    free(wi);
    free(ri);
    return rc;
}

static void run_roundtrips(int force_tcp)
{
    fx f;
    if (fx_start(&f, 64 * MiB, NULL))
        return;
    kvp_xfer *x;
    kvp_xfer_opts o = {.client_id = 7, .conns_per_node = 3, .force_tcp = force_tcp, .timeout_ms = 5000};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    CHECK(kvp_xfer_has_segment(x, SEG_ID));
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), force_tcp ? "tcp" : "shm"));
    uint64_t sizes[] = {1, 2, 100, 4095, 4096, 65537, 512 * 1024, 1 * MiB + 3, 16 * MiB, 7};
    CHECK_EQ(roundtrip(x, sizes, sizeof sizes / sizeof sizes[0], 5, 0), 0);
    uint64_t many[64];
    for (int i = 0; i < 64; i++)
        many[i] = 1 + rnd() % 200000;
    CHECK_EQ(roundtrip(x, many, 64, 3, 32 * MiB), 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), force_tcp ? "tcp" : "shm"));
    kvp_xfer_shm_stats st; /* tcp never attaches */
    kvp_xfer_shm_stats_get(x, &st);
    CHECK_EQ(st.attaches, force_tcp ? 0 : 1);
    CHECK(force_tcp ? st.populates == 0 && st.populate_ns == 0 : st.attach_ns > 0);
    /* unknown segment */
    uint8_t b[8];
    struct iovec iv = {b, 8};
    kvp_xfer_op op = {rep(0, 8, 1), &iv, 1, 0, 0, 0, NULL, NULL, 0, 0};
    op.rep.segment_id = 99;
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 1000), 0);
    CHECK_EQ(op.status, KVP_ESEGMENT_NOT_FOUND);
    /* iovecs not matching the length */
    op = (kvp_xfer_op){.rep = rep(0, 9, 1), .iov = &iv, .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 1000), 0);
    CHECK_EQ(op.status, KVP_EINVALID_PARAMS);
    kvp_xfer_drop_segment(x, SEG_ID);
    CHECK(!kvp_xfer_has_segment(x, SEG_ID));
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

TEST(roundtrip_tcp) { run_roundtrips(1); }
TEST(roundtrip_shm) { run_roundtrips(0); }

/* Cuts len bytes at p into pieces of random odd sizes (0 .. max bytes,
 * some empty) into v (room for cap); returns how many. */
static int odd_cut(uint8_t *p, uint64_t len, uint64_t max, struct iovec *v, int cap)
{
    int n = 0;
    for (uint64_t at = 0; at < len || n == 0;) {
        uint64_t l = rnd() % 16 == 0 ? 0 : 1 + rnd() % max;
        if (l > len - at || n == cap - 1)
            l = len - at;
        v[n++] = (struct iovec){p + at, (size_t)l};
        at += l;
        if (at == len)
            break;
    }
    return n;
}

/*
 * The checksum computed while the bytes move, chunk by chunk (xfer.c's
 * XFER_CHUNK on tcp, SHM_CHUNK on shm), is XXH3_64bits of the whole value,
 * and the bytes arrive exact: values of 1 B .. 2 MiB + 1, each put from a
 * few hundred pieces of odd sizes (more than one sendmsg's 64 iovecs, empty
 * pieces among them, boundaries falling anywhere relative to the chunks)
 * and got back into pieces cut differently; ops without want_csum
 * (replicas after the first) interleaved in the same jobs.
 */
static void run_odd_iovecs(int force_tcp)
{
    fx f;
    if (fx_start(&f, 64 * MiB, NULL))
        return;
    kvp_xfer *x;
    kvp_xfer_opts o = {.client_id = 7, .conns_per_node = 2, .force_tcp = force_tcp,
                       .timeout_ms = 5000};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), force_tcp ? "tcp" : "shm"));
    static const uint64_t sizes[] = {1, 3 * 128 * 1024 + 12345, 2 * MiB + 1, 131072, 300001,
                                     255 * 1024 + 1023, 7, 1 * MiB + 777, 65536 * 3 - 1,
                                     2 * MiB, 129 * 1024, 1000};
    enum { N = sizeof sizes / sizeof sizes[0], CAP = 600 };
    static struct iovec wi[N][CAP], ri[N][CAP];
    uint8_t *src[N], *dst[N];
    kvp_xfer_op w[N], r[N];
    uint64_t off = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        src[i] = malloc(sizes[i]);
        dst[i] = malloc(sizes[i]);
        CHECK(src[i] && dst[i]);
        fill(src[i], sizes[i], 1000 + (uint64_t)i);
        memset(dst[i], 0xEE, sizes[i]);
        /* pieces up to ~20 KiB (hundreds per MiB) on the way in, up to
         * ~50 KiB on the way out */
        int nw = odd_cut(src[i], sizes[i], 20011, wi[i], CAP);
        int nr = odd_cut(dst[i], sizes[i], 49999, ri[i], CAP);
        int want = i % 3 != 1; /* every third op: no checksum asked */
        w[i] = (kvp_xfer_op){.rep = rep(off, sizes[i], 1), .iov = wi[i], .iovcnt = nw,
                             .status = 99, .want_csum = want, .csum = 0};
        r[i] = (kvp_xfer_op){.rep = rep(off, sizes[i], 1), .iov = ri[i], .iovcnt = nr,
                             .status = 99, .want_csum = want, .csum = 0};
        off += (sizes[i] + 4095) & ~4095ull;
    }
    CHECK_EQ(run_as(x, 1, w, N, kvp_now_ms() + 20000), 0);
    CHECK_EQ(run_as(x, 0, r, N, kvp_now_ms() + 20000), 0);
    for (int i = 0; i < N; i++) {
        uint64_t h = XXH3_64bits(src[i], sizes[i]);
        if (w[i].status != 0 || r[i].status != 0) {
            fprintf(stderr, "    op %d (%llu B): write %d read %d\n", i,
                    (unsigned long long)sizes[i], w[i].status, r[i].status);
            bad++;
        } else if (memcmp(src[i], dst[i], sizes[i]) != 0) {
            fprintf(stderr, "    op %d (%llu B): bytes differ\n", i, (unsigned long long)sizes[i]);
            bad++;
        } else if (w[i].want_csum && (w[i].csum != h || r[i].csum != h)) {
            fprintf(stderr, "    op %d (%llu B, %d / %d pieces): checksums %016llx / %016llx, "
                            "XXH3 %016llx\n", i, (unsigned long long)sizes[i], w[i].iovcnt,
                    r[i].iovcnt, (unsigned long long)w[i].csum, (unsigned long long)r[i].csum,
                    (unsigned long long)h);
            bad++;
        }
        free(src[i]);
        free(dst[i]);
    }
    CHECK_EQ(bad, 0);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

TEST(odd_iovecs_checksum_tcp) { run_odd_iovecs(1); }
TEST(odd_iovecs_checksum_shm) { run_odd_iovecs(0); }

TEST(refusals_over_tcp)
{
    fx f;
    if (fx_start(&f, 8 * MiB, NULL))
        return;
    kvp_xfer *x;
    kvp_xfer_opts o = {.client_id = 7, .conns_per_node = 1, .force_tcp = 1, .timeout_ms = 3000};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint8_t buf[8192];
    memset(buf, 0xAB, sizeof buf);
    struct iovec iv = {buf, 4096};
    kvp_xfer_op ops[5];
    ops[0] = (kvp_xfer_op){.rep = rep(0, 4096, 1), .iov = &iv, .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0};
    ops[0].rep.tag ^= 1; /* wrong tag */
    kvp_replica oob = rep(8 * MiB - 100, 4096, 1);
    ops[1] = (kvp_xfer_op){.rep = oob, .iov = &iv, .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0};
    kvp_replica ovf = rep(UINT64_MAX - 100, 4096, 1);
    ops[2] = (kvp_xfer_op){.rep = ovf, .iov = &iv, .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0};
    ops[3] = (kvp_xfer_op){.rep = rep(4096, 4096, 3), .iov = &iv, .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0}; /* good, after refusals */
    ops[4] = ops[3];
    ops[4].rep.segment_id = SEG_ID; /* same, also fine */
    CHECK_EQ(run_as(x, 1, ops, 5, kvp_now_ms() + 3000), 0);
    CHECK_EQ(ops[0].status, KVP_EINVALID_WRITE);
    CHECK_EQ(ops[1].status, KVP_EINVALID_WRITE);
    CHECK_EQ(ops[2].status, KVP_EINVALID_WRITE);
    CHECK_EQ(ops[3].status, 0);
    CHECK_EQ(ops[4].status, 0);
    CHECK_EQ(run_as(x, 0, ops, 4, kvp_now_ms() + 3000), 0);
    CHECK_EQ(ops[0].status, KVP_EINVALID_READ);
    CHECK_EQ(ops[1].status, KVP_EINVALID_READ);
    CHECK_EQ(ops[2].status, KVP_EINVALID_READ);
    CHECK_EQ(ops[3].status, 0);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

/* One batch over two nodes (two servers, two segments): both served. */
TEST(two_segments_one_batch)
{
    fx a, b;
    if (fx_start(&a, 4 * MiB, NULL))
        return;
    char err[256];
    memset(&b, 0, sizeof b);
    CHECK_EQ(kvp_segment_create(4 * MiB, "b", &b.seg, err, sizeof err), 0);
    CHECK_EQ(kvp_grants_create(4 * MiB, SECRET, &b.grants), 0);
    kvp_segserver_opts o = {"127.0.0.1:0", NULL, 1, NULL, SEG_ID + 1, b.grants, {0, 0}, NULL, 0};
    CHECK_EQ(kvp_segserver_start(b.seg, &o, &b.srv, err, sizeof err), 0);
    snprintf(b.addr, sizeof b.addr, "127.0.0.1:%u", kvp_segserver_port(b.srv));
    b.eps[0] = (kvp_endpoint){{(const uint8_t *)"tcp", 3},
                              {(const uint8_t *)b.addr, (uint32_t)strlen(b.addr)}};
    b.desc = (kvp_seg_desc){SEG_ID + 1, {(const uint8_t *)b.addr, (uint32_t)strlen(b.addr)},
                            4 * MiB, 1, b.eps, 0, 0, 0};
    kvp_xfer *x;
    kvp_xfer_opts xo = {NULL, 7, 2, 0, 3000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&xo, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &a.desc), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &b.desc), 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), "shm"));
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID + 1), "tcp"));
    static uint8_t src[8][20000], dst[8][20000];
    kvp_xfer_op w[8], r[8];
    struct iovec wi[8], ri[8];
    for (int i = 0; i < 8; i++) {
        fill(src[i], sizeof src[i], (uint64_t)i);
        wi[i] = (struct iovec){src[i], sizeof src[i]};
        ri[i] = (struct iovec){dst[i], sizeof dst[i]};
        kvp_replica rp = rep_seg(SEG_ID + (uint64_t)(i & 1), (uint64_t)i * 32768, sizeof src[i], 1);
        w[i] = (kvp_xfer_op){.rep = rp, .iov = &wi[i], .iovcnt = 1, .status = 9, .want_csum = 0, .csum = 0};
        r[i] = (kvp_xfer_op){.rep = rp, .iov = &ri[i], .iovcnt = 1, .status = 9, .want_csum = 0, .csum = 0};
    }
    CHECK_EQ(run_as(x, 1, w, 8, kvp_now_ms() + 3000), 0);
    CHECK_EQ(run_as(x, 0, r, 8, kvp_now_ms() + 3000), 0);
    for (int i = 0; i < 8; i++) {
        CHECK_EQ(w[i].status, 0);
        CHECK_EQ(r[i].status, 0);
        CHECK(!memcmp(src[i], dst[i], sizeof src[i]));
    }
    /* a node that went away: its ops fail, the other node's succeed */
    kvp_segserver_stop(b.srv);
    b.srv = NULL;
    CHECK_EQ(run_as(x, 0, r, 8, kvp_now_ms() + 3000), 0);
    for (int i = 0; i < 8; i++)
        CHECK_EQ(r[i].status, (i & 1) ? KVP_ETRANSFER_FAIL : 0);
    kvp_xfer_destroy(x);
    kvp_grants_destroy(b.grants);
    kvp_segment_destroy(b.seg);
    fx_stop(&a);
}

/* ---------------------------------------------------- raw hostile client */

static int raw_connect(const char *addr)
{
    char err[256];
    return kvp_net_connect(addr, 2000, err, sizeof err);
}

static void put_hdr(uint8_t *p, uint16_t op, uint64_t id, uint32_t blen)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, id, blen, 0};
    kvp_frame_hdr_encode(p, &h);
}

static int raw_send(int fd, const void *p, size_t n)
{
    return send(fd, p, n, MSG_NOSIGNAL) == (ssize_t)n ? 0 : -1;
}

/* Reads one answer header (and skips its body). Returns the status, or
 * 1 when the connection closed / timed out. */
static int raw_answer(int fd, uint64_t *req_id, uint32_t *blen)
{
    uint8_t h[KVP_FRAME_HDR];
    size_t got = 0;
    while (got < sizeof h) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 3000) <= 0)
            return 1;
        ssize_t r = recv(fd, h + got, sizeof h - got, 0);
        if (r <= 0)
            return 1;
        got += (size_t)r;
    }
    kvp_frame_hdr fh;
    if (kvp_frame_hdr_decode(h, UINT32_MAX, &fh) != 0)
        return 1;
    if (req_id)
        *req_id = fh.req_id;
    if (blen)
        *blen = fh.body_len;
    return fh.status;
}

/* One raw request and its answer (body up to sizeof resp). The status,
 * or 1 when the transport fails. */
static int raw_req(int fd, uint16_t op, uint64_t req_id, const uint8_t *body, size_t len,
                   uint8_t resp[256], uint32_t *rl)
{
    uint8_t h[KVP_FRAME_HDR];
    put_hdr(h, op, req_id, (uint32_t)len);
    if (raw_send(fd, h, sizeof h) || (len && raw_send(fd, body, len)))
        return 1;
    uint32_t bl = 0;
    int st = raw_answer(fd, NULL, &bl);
    if (bl && (bl > 256 || recv(fd, resp, bl, MSG_WAITALL) != (ssize_t)bl))
        return 1;
    *rl = bl;
    return st;
}

/* HELLO on a raw connection; with a token, after AUTH_CHALLENGE and
 * proving it (whatever the node proved: a guesser goes on). */
static int raw_hello(int fd, const char *token)
{
    uint8_t body[512], resp[256];
    uint32_t rl = 0;
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_auth_creds cr = hr_creds(token, NULL, NULL, NULL);
    kvp_auth_tx t;
    memset(&t, 0, sizeof t);
    if (*token) {
        hr_challenge(&b, &t, &cr);
        int st = raw_req(fd, KVP_OP_AUTH_CHALLENGE, 1, body, b.len, resp, &rl);
        if (st)
            return st;
        if (hr_answer(&t, &cr, resp, rl) < 0)
            return 1;
        b = (kvp_buf){body, 0, sizeof body, sizeof body, 0};
    }
    hr_hello(&b, &t, &cr, 42, "raw");
    return raw_req(fd, KVP_OP_HELLO, 2, body, b.len, resp, &rl);
}

static int closed(int fd)
{
    uint8_t b[64];
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 3000) <= 0)
            return 0;
        ssize_t r = recv(fd, b, sizeof b, 0);
        if (r <= 0)
            return 1;
    }
}

/* A SEG_READ / SEG_WRITE frame with r issued for that operation. */
static void seg_io_frame(uint8_t *p, uint16_t op, uint64_t id, uint32_t blen, const kvp_replica *r)
{
    kvp_replica c = *r;
    reissue(&c, op == KVP_OP_SEG_WRITE ? KVP_ACCESS_WRITE : KVP_ACCESS_READ);
    put_hdr(p, op, id, blen);
    kvp_buf b = {p + KVP_FRAME_HDR, 0, KVP_SEG_IO_SIZE, KVP_SEG_IO_SIZE, 0};
    kvp_enc_seg_io(&b, &c);
}

/* A node that cannot prove the cluster token the client holds (here: it
 * has none) gets no value from it: the write fails at the handshake; the
 * node that holds it is served. */
TEST(node_without_the_token_is_refused_by_the_client)
{
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    uint8_t *base = kvp_segment_base(f.seg);
    memset(base, 0, 4096);
    kvp_xfer *x;
    kvp_xfer_opts o = {.client_id = 7, .conns_per_node = 1, .force_tcp = 1, .timeout_ms = 2000,
                       .cluster_token = "tok"};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint8_t b[64];
    memset(b, 0xAB, sizeof b);
    struct iovec iv = {b, sizeof b};
    kvp_xfer_op op = {.rep = rep(0, sizeof b, 1), .iov = &iv, .iovcnt = 1};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK(op.status != 0);
    CHECK(base[0] == 0); /* nothing written */
    kvp_xfer_destroy(x);
    fx_stop(&f);
    /* with the token on both sides: written */
    if (fx_start(&f, 4 * MiB, "tok"))
        return;
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    op = (kvp_xfer_op){.rep = rep(0, sizeof b, 1), .iov = &iv, .iovcnt = 1};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, 0);
    CHECK(kvp_segment_base(f.seg)[0] == 0xAB);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

TEST(hostile_raw_socket)
{
    fx f;
    if (fx_start(&f, 4 * MiB, "tok"))
        return;
    uint8_t *base = kvp_segment_base(f.seg);
    uint64_t size = kvp_segment_size(f.seg);
    memset(base, 0xC5, size); /* canary everywhere */
    /* wrong token: EAUTH, then closed */
    int fd = raw_connect(f.addr);
    CHECK(fd >= 0);
    CHECK_EQ(raw_hello(fd, "bad"), KVP_EAUTH);
    CHECK(closed(fd));
    close(fd);
    /* no HELLO */
    fd = raw_connect(f.addr);
    uint8_t fr[KVP_FRAME_HDR + KVP_SEG_IO_SIZE + 4096];
    kvp_replica good = rep(8192, 4096, 5);
    seg_io_frame(fr, KVP_OP_SEG_READ, 3, KVP_SEG_IO_SIZE, &good);
    CHECK_EQ(raw_send(fd, fr, KVP_FRAME_HDR + KVP_SEG_IO_SIZE), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_ENO_HELLO);
    close(fd);

    fd = raw_connect(f.addr);
    CHECK_EQ(raw_hello(fd, "tok"), 0);
    /* refused write with a consistent body: skipped, connection lives on */
    kvp_replica bad = good;
    bad.tag ^= 0x100;
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 4, KVP_SEG_IO_SIZE + 4096, &bad);
    memset(fr + KVP_FRAME_HDR + KVP_SEG_IO_SIZE, 0x11, 4096);
    CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
    uint64_t id = 0;
    CHECK_EQ(raw_answer(fd, &id, NULL), KVP_EINVALID_WRITE);
    CHECK_EQ(id, 4);
    kvp_replica wrongseg = rep_seg(SEG_ID + 1, 8192, 4096, 5);
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 5, KVP_SEG_IO_SIZE + 4096, &wrongseg);
    CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_EINVALID_WRITE);
    /* the good write still works on the same connection */
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 6, KVP_SEG_IO_SIZE + 4096, &good);
    CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), 0);
    CHECK(base[8192] == 0x11 && base[8192 + 4095] == 0x11);
    CHECK(base[8191] == 0xC5 && base[8192 + 4096] == 0xC5);
    /* SHM_ATTACH over TCP is refused, connection continues */
    put_hdr(fr, KVP_OP_SHM_ATTACH, 7, 8);
    memcpy(fr + KVP_FRAME_HDR, &(uint64_t){SEG_ID}, 8);
    CHECK_EQ(raw_send(fd, fr, KVP_FRAME_HDR + 8), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_ENOT_SUPPORTED);
    /* body_len inconsistent with length: refused and closed */
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 8, KVP_SEG_IO_SIZE + 100, &good);
    CHECK_EQ(raw_send(fd, fr, KVP_FRAME_HDR + KVP_SEG_IO_SIZE + 100), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_EINVALID_WRITE);
    CHECK(closed(fd));
    close(fd);
    /* oversize frame, garbage */
    fd = raw_connect(f.addr);
    CHECK_EQ(raw_hello(fd, "tok"), 0);
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 9, UINT32_MAX, &good);
    CHECK_EQ(raw_send(fd, fr, KVP_FRAME_HDR + KVP_SEG_IO_SIZE), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_ETOO_LARGE);
    CHECK(closed(fd));
    close(fd);
    fd = raw_connect(f.addr);
    for (size_t i = 0; i < sizeof fr; i++)
        fr[i] = (uint8_t)rnd();
    CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
    CHECK(closed(fd));
    close(fd);
    /* out-of-bounds reads and writes never touch memory outside */
    fd = raw_connect(f.addr);
    CHECK_EQ(raw_hello(fd, "tok"), 0);
    uint64_t offs[] = {size, size - 1, size - 4095, UINT64_MAX - 4095, UINT64_MAX};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        kvp_replica r = rep(offs[i], 4096, 1);
        seg_io_frame(fr, KVP_OP_SEG_READ, 20 + i, KVP_SEG_IO_SIZE, &r);
        CHECK_EQ(raw_send(fd, fr, KVP_FRAME_HDR + KVP_SEG_IO_SIZE), 0);
        CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_EINVALID_READ);
        seg_io_frame(fr, KVP_OP_SEG_WRITE, 30 + i, KVP_SEG_IO_SIZE + 4096, &r);
        memset(fr + KVP_FRAME_HDR + KVP_SEG_IO_SIZE, 0x22, 4096);
        CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
        CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_EINVALID_WRITE);
    }
    close(fd);
    /* a good client is served meanwhile */
    kvp_xfer *x;
    kvp_xfer_opts o = {"tok", 7, 2, 1, 3000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint64_t sz[] = {4096, 100};
    CHECK_EQ(roundtrip(x, sz, 2, 2, 65536), 0);
    kvp_xfer_destroy(x);
    /* canary intact outside [8192, 12288) and the roundtrip's range */
    for (uint64_t i = 0; i < size; i++) {
        if ((i >= 8192 && i < 12288) || (i >= 65536 && i < 65536 + 8192))
            continue;
        if (base[i] != 0xC5) {
            th_fail(__FILE__, __LINE__, "segment byte %llu changed", (unsigned long long)i);
            break;
        }
    }
    /* wrong token through xfer: transfer fails, nothing hangs */
    kvp_xfer_opts bo = {"nope", 7, 1, 1, 2000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&bo, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint8_t b[16];
    struct iovec iv = {b, 16};
    kvp_xfer_op op = {rep(0, 16, 1), &iv, 1, 0, 0, 0, NULL, NULL, 0, 0};
    CHECK_EQ(run_as(x, 0, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, KVP_ETRANSFER_FAIL);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

/* Sends UCX_ATTACH for seg_id; the answer's status (its body skipped,
 * its length in *blen), 1 when the connection failed. */
static int raw_ucx_attach(int fd, uint64_t seg_id, uint32_t *blen)
{
    uint8_t f[KVP_FRAME_HDR + 8];
    put_hdr(f, KVP_OP_UCX_ATTACH, 7, 8);
    for (int i = 0; i < 8; i++)
        f[KVP_FRAME_HDR + i] = (uint8_t)(seg_id >> (8 * i));
    if (raw_send(fd, f, sizeof f))
        return 1;
    *blen = 0;
    int st = raw_answer(fd, NULL, blen);
    uint8_t sink[256];
    if (st == 0 && *blen && (*blen > sizeof sink || recv(fd, sink, *blen, MSG_WAITALL) != (ssize_t)*blen))
        return 1;
    return st;
}

/* The UCX_ATTACH answer (the segment's rkey) goes out only while the node
 * has opened it -- once a master accepted its mount offering ucx (a master
 * protecting tenants refuses that) -- and not after it closed it. */
TEST(ucx_attach_only_once_opened)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    kvp_segment *seg = NULL;
    kvp_grants *g = NULL;
    kvp_segserver *srv = NULL;
    char err[256], addr[64];
    static const uint8_t body[40] = {1, 2, 3}; /* stands for the encoded answer */
    CHECK(kvp_segment_create(MiB, "ucx", &seg, err, sizeof err) == 0);
    CHECK(kvp_grants_create(kvp_segment_size(seg), SECRET, &g) == 0);
    char upath[108];
    snprintf(upath, sizeof upath, "/tmp/kvp-test-ucx-%d.sock", (int)getpid());
    kvp_segserver_opts o = {"127.0.0.1:0", upath, 1, "tok", SEG_ID, g, {0, 0}, body, sizeof body};
    CHECK(kvp_segserver_start(seg, &o, &srv, err, sizeof err) == 0);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", kvp_segserver_port(srv));
    int fd = raw_connect(addr);
    uint32_t bl = 0;
    CHECK(fd >= 0);
    CHECK_EQ(raw_hello(fd, "tok"), 0);
    CHECK_EQ(raw_ucx_attach(fd, SEG_ID, &bl), KVP_ENOT_SUPPORTED);
    kvp_segserver_ucx_open(srv, 1);
    CHECK_EQ(raw_ucx_attach(fd, SEG_ID, &bl), 0);
    CHECK_EQ(bl, sizeof body);
    kvp_segserver_ucx_open(srv, 0);
    CHECK_EQ(raw_ucx_attach(fd, SEG_ID, &bl), KVP_ENOT_SUPPORTED);
    close(fd);
    kvp_segserver_stop(srv);
    kvp_grants_destroy(g);
    kvp_segment_destroy(seg);
}

TEST(shm_attach_unix)
{
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    /* wrong segment id on the unix socket */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", f.unix_path);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    CHECK_EQ(raw_hello(fd, ""), 0);
    uint8_t fr[KVP_FRAME_HDR + 8];
    put_hdr(fr, KVP_OP_SHM_ATTACH, 2, 8);
    memcpy(fr + KVP_FRAME_HDR, &(uint64_t){SEG_ID + 1}, 8);
    CHECK_EQ(raw_send(fd, fr, sizeof fr), 0);
    CHECK_EQ(raw_answer(fd, NULL, NULL), KVP_ESEGMENT_NOT_FOUND);
    close(fd);
    /* the shm writes are visible in the server's segment */
    kvp_xfer *x;
    kvp_xfer_opts o = {NULL, 7, 1, 0, 3000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    kvp_xfer_shm_stats st;
    kvp_xfer_shm_stats_get(x, &st);
    CHECK(st.attaches == 0 && st.attach_ns == 0 && st.populates == 0 && st.populate_ns == 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint8_t v[100];
    memset(v, 0x77, sizeof v);
    struct iovec iv = {v, sizeof v};
    kvp_xfer_op op = {rep(4096, 100, 1), &iv, 1, 0, 0, 0, NULL, NULL, 0, 0};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), "shm"));
    CHECK(kvp_segment_base(f.seg)[4096] == 0x77 && kvp_segment_base(f.seg)[4195] == 0x77);
    /* one attach, timed; the first transfer populated its 2 MiB chunk (Linux
     * 5.14 and later: MADV_POPULATE_WRITE), a second one in it does not */
    kvp_xfer_shm_stats_get(x, &st);
    CHECK_EQ(st.attaches, 1);
    CHECK(st.attach_ns > 0);
    CHECK(st.populates <= 1 && (st.populates == 0) == (st.populate_ns == 0));
    uint64_t pops = st.populates;
    op = (kvp_xfer_op){.rep = rep(8192, 100, 1), .iov = &iv, .iovcnt = 1};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, 0);
    kvp_xfer_shm_stats_get(x, &st);
    CHECK(st.attaches == 1 && st.populates == pops);
    /* one spanning chunks 0 and 1 populates only chunk 1 */
    op = (kvp_xfer_op){.rep = rep(2 * MiB - 50, 100, 1), .iov = &iv, .iovcnt = 1};
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, 0);
    kvp_xfer_shm_stats_get(x, &st);
    CHECK(st.attaches == 1 && st.populates == 2 * pops);
    /* out of bounds through shm */
    op.rep = rep(4 * MiB - 50, 100, 1);
    CHECK_EQ(run_as(x, 1, &op, 1, kvp_now_ms() + 2000), 0);
    CHECK_EQ(op.status, KVP_EINVALID_WRITE);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

/* Each thread, mode and round uses its own region: the server threads touch
 * segment memory ordered only by socket round trips, which ThreadSanitizer
 * cannot see, so reusing a region would be reported as a race. */
typedef struct targ {
    kvp_xfer *x;
    int idx;
    int mode;
    int rc;
} targ;

static void *thr(void *p)
{
    targ *t = p;
    uint64_t sizes[8];
    for (int i = 0; i < 8; i++)
        sizes[i] = 1000 + (uint64_t)(t->idx * 8 + i) * 3000;
    t->rc = 0;
    for (int k = 0; k < 2 && !t->rc; k++)
        t->rc = roundtrip(t->x, sizes, 8, 2,
                          (uint64_t)t->mode * 8 * MiB + (uint64_t)t->idx * 2 * MiB +
                              (uint64_t)k * 768 * 1024);
    return NULL;
}

TEST(concurrent_threads)
{
    fx f;
    if (fx_start(&f, 16 * MiB, NULL))
        return;
    for (int mode = 0; mode < 2; mode++) {
        kvp_xfer *x;
        kvp_xfer_opts o = {NULL, 7, 2, mode == 0, 5000, 0, 0, 0};
        CHECK_EQ(kvp_xfer_create(&o, &x), 0);
        CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
        pthread_t th[4];
        targ a[4];
        for (int i = 0; i < 4; i++) {
            a[i] = (targ){x, i, mode, -1};
            pthread_create(&th[i], NULL, thr, &a[i]);
        }
        for (int i = 0; i < 4; i++) {
            pthread_join(th[i], NULL);
            CHECK_EQ(a[i].rc, 0);
        }
        kvp_xfer_destroy(x);
    }
    fx_stop(&f);
}

/* 64 x 512 KiB, reported (not asserted): same-host shm vs loopback tcp
 * (each mode in its own half of the segment, see targ). */
TEST(throughput_64x512k)
{
    fx f;
    if (fx_start(&f, 64 * MiB, NULL))
        return;
    static uint8_t buf[64][512 * 1024];
    for (int mode = 0; mode < 2; mode++) {
        kvp_xfer *x;
        kvp_xfer_opts o = {NULL, 7, 4, mode == 0, 5000, 0, 0, 0};
        CHECK_EQ(kvp_xfer_create(&o, &x), 0);
        CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
        kvp_xfer_op ops[64];
        struct iovec iv[64];
        for (int i = 0; i < 64; i++) {
            iv[i] = (struct iovec){buf[i], sizeof buf[i]};
            ops[i] = (kvp_xfer_op){.rep = rep((uint64_t)mode * 32 * MiB + (uint64_t)i * sizeof buf[i],
                                      sizeof buf[i], 1), .iov = &iv[i], .iovcnt = 1, .status = 0, .want_csum = 0, .csum = 0};
        }
        CHECK_EQ(run_as(x, 1, ops, 64, kvp_now_ms() + 10000), 0); /* warm up */
        for (int w = 1; w >= 0; w--) {
            uint64_t t0 = kvp_now_ns();
            int reps = 5;
            for (int k = 0; k < reps; k++)
                CHECK_EQ(run_as(x, w, ops, 64, kvp_now_ms() + 10000), 0);
            uint64_t dt = kvp_now_ns() - t0;
            for (int i = 0; i < 64; i++)
                CHECK_EQ(ops[i].status, 0);
            printf("  %s %s 64 x 512 KiB: %.2f GB/s\n", mode ? "shm" : "tcp", w ? "put" : "get",
                   (double)reps * 64 * sizeof buf[0] / (double)dt);
        }
        kvp_xfer_destroy(x);
    }
    fx_stop(&f);
}

/* ------------------------------------------- shm trust: seals, sockets */

static int unix_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* SHM_ATTACH on a connection that said HELLO: the passed fd (or -1) and
 * the announced size. Returns the answer's status, 1 on a broken stream. */
static int raw_attach(int fd, uint64_t seg_id, int *mfd, uint64_t *size)
{
    uint8_t fr[KVP_FRAME_HDR + 8];
    put_hdr(fr, KVP_OP_SHM_ATTACH, 2, 8);
    memcpy(fr + KVP_FRAME_HDR, &seg_id, 8);
    if (raw_send(fd, fr, sizeof fr))
        return 1;
    uint8_t h[KVP_FRAME_HDR + 8];
    struct iovec iov = {h, sizeof h};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof cm.buf};
    *mfd = -1;
    ssize_t n = recvmsg(fd, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
    if (ch && ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS)
        memcpy(mfd, CMSG_DATA(ch), sizeof(int));
    kvp_frame_hdr fh;
    if (n < (ssize_t)KVP_FRAME_HDR || kvp_frame_hdr_decode(h, UINT32_MAX, &fh) != 0)
        return 1;
    if (fh.status == 0 && (n != (ssize_t)sizeof h || fh.body_len != 8))
        return 1;
    if (fh.status == 0)
        memcpy(size, h + KVP_FRAME_HDR, 8);
    return fh.status;
}

/* The memfd a same-host client receives cannot change size: no
 * ftruncate(0) SIGBUS for everyone else, no growth. */
TEST(shm_fd_sealed)
{
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    int fd = unix_connect(f.unix_path);
    CHECK(fd >= 0);
    CHECK_EQ(raw_hello(fd, ""), 0);
    int mfd = -1;
    uint64_t size = 0;
    CHECK_EQ(raw_attach(fd, SEG_ID, &mfd, &size), 0);
    close(fd);
    CHECK(mfd >= 0);
    CHECK_EQ(size, kvp_segment_size(f.seg));
    int seals = fcntl(mfd, F_GET_SEALS);
    CHECK((seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
          (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
    errno = 0;
    CHECK(ftruncate(mfd, 0) == -1 && errno == EPERM);
    errno = 0;
    CHECK(ftruncate(mfd, (off_t)size * 2) == -1 && errno == EPERM);
    errno = 0;
    CHECK(fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE) == -1 && errno == EPERM);
    struct stat st;
    CHECK(fstat(mfd, &st) == 0 && (uint64_t)st.st_size == size);
    close(mfd);
    /* the segment still works for everyone */
    kvp_xfer *x;
    kvp_xfer_opts o = {NULL, 7, 1, 0, 3000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    uint64_t sz[] = {4 * MiB - 4096};
    CHECK_EQ(roundtrip(x, sz, 1, 1, 0), 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), "shm"));
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

static int sealed_memfd(off_t size, int seals)
{
    int fd = memfd_create("t", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, size) != 0 || (seals && fcntl(fd, F_ADD_SEALS, seals) != 0)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* What a client accepts before mapping a received fd. */
TEST(shm_check_refuses_bad_fds)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    char err[256];
    int good = sealed_memfd(8192, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    int small = sealed_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
    int loose = sealed_memfd(8192, 0);
    int grow_only = sealed_memfd(8192, F_SEAL_GROW);
    int pfd[2];
    CHECK(good >= 0 && small >= 0 && loose >= 0 && grow_only >= 0 && pipe(pfd) == 0);
    CHECK_EQ(kvp_xfer_shm_check(good, 8192, err, sizeof err), 0);
    CHECK_EQ(kvp_xfer_shm_check(good, 4096, err, sizeof err), 0); /* larger: mapped partly */
    err[0] = 0;
    CHECK_EQ(kvp_xfer_shm_check(small, 8192, err, sizeof err), KVP_ETRANSFER_FAIL);
    CHECK(strstr(err, "4096") && strstr(err, "8192"));
    CHECK_EQ(kvp_xfer_shm_check(good, 0, err, sizeof err), KVP_ETRANSFER_FAIL);
    CHECK_EQ(kvp_xfer_shm_check(good, UINT64_MAX, err, sizeof err), KVP_ETRANSFER_FAIL);
    err[0] = 0;
    CHECK_EQ(kvp_xfer_shm_check(loose, 8192, err, sizeof err), KVP_ETRANSFER_FAIL);
    CHECK(strstr(err, "sealed") != NULL);
    CHECK_EQ(kvp_xfer_shm_check(grow_only, 8192, err, sizeof err), KVP_ETRANSFER_FAIL);
    err[0] = 0;
    CHECK_EQ(kvp_xfer_shm_check(pfd[0], 8192, err, sizeof err), KVP_ETRANSFER_FAIL);
    CHECK(strstr(err, "not a memfd") != NULL);
    close(good);
    close(small);
    close(loose);
    close(grow_only);
    close(pfd[0]);
    close(pfd[1]);
}

/* A rogue "node": answers AUTH_CHALLENGE and HELLO, then SHM_ATTACH with an announced size
 * of `announce` bytes and a memfd of only 4096. */
typedef struct rogue {
    char path[108];
    int lfd;
    uint64_t announce;
    pthread_t th;
} rogue;

static void *rogue_main(void *p)
{
    rogue *r = p;
    int fd = accept(r->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    uint8_t h[KVP_FRAME_HDR], body[512];
    for (int k = 0; k < 3; k++) {
        kvp_frame_hdr fh;
        if (recv(fd, h, sizeof h, MSG_WAITALL) != (ssize_t)sizeof h ||
            kvp_frame_hdr_decode(h, UINT32_MAX, &fh) != 0 || fh.body_len > sizeof body ||
            (fh.body_len && recv(fd, body, fh.body_len, MSG_WAITALL) != (ssize_t)fh.body_len))
            break;
        uint8_t out[KVP_FRAME_HDR + 64];
        kvp_buf b = {out + KVP_FRAME_HDR, 0, 64, 64, 0};
        int mfd = -1;
        if (fh.op == KVP_OP_AUTH_CHALLENGE) {
            static const uint8_t nonce[KVP_AUTH_NONCE];
            kvp_msg_challenge_resp m = {{nonce, KVP_AUTH_NONCE}, 1, {{NULL, 0}}};
            kvp_enc_challenge_resp(&b, &m);
        } else if (fh.op == KVP_OP_HELLO) {
            kvp_msg_hello_resp m = {KVP_PROTO_VERSION, 1, 1 << 20, 1000, 1000, 0, {0}, "t"};
            kvp_enc_hello_resp(&b, &m);
        } else {
            memcpy(out + KVP_FRAME_HDR, &r->announce, 8);
            b.len = 8;
            mfd = sealed_memfd(4096, F_SEAL_SHRINK | F_SEAL_GROW);
        }
        kvp_frame_hdr a = {KVP_PROTO_VERSION, KVP_FLAG_RESPONSE, fh.op, fh.req_id,
                           (uint32_t)b.len, 0};
        kvp_frame_hdr_encode(out, &a);
        struct iovec iov = {out, KVP_FRAME_HDR + b.len};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (mfd >= 0) {
            mh.msg_control = cm.buf;
            mh.msg_controllen = sizeof cm.buf;
            struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
            ch->cmsg_level = SOL_SOCKET;
            ch->cmsg_type = SCM_RIGHTS;
            ch->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(ch), &mfd, sizeof(int));
        }
        ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
        (void)w;
        if (mfd >= 0)
            close(mfd);
    }
    close(fd);
    return NULL;
}

/* A node announcing more than its memfd holds: the client refuses the fd
 * (it used to map it and die of SIGBUS on the put) and uses tcp. */
TEST(shm_undersized_memfd_falls_back_to_tcp)
{
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    rogue r = {.announce = 4 * MiB};
    snprintf(r.path, sizeof r.path, "/tmp/kvp-rogue-%d.sock", (int)getpid());
    unlink(r.path);
    r.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r.path);
    CHECK(bind(r.lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(r.lfd, 4) == 0);
    CHECK(pthread_create(&r.th, NULL, rogue_main, &r) == 0);
    char shm[256];
    snprintf(shm, sizeof shm, "%s:%s", kvp_node_host_id(), r.path);
    f.eps[1].addr = (kvp_bytes){(const uint8_t *)shm, (uint32_t)strlen(shm)};
    kvp_xfer *x;
    kvp_xfer_opts o = {NULL, 7, 1, 0, 3000, 0, 0, 0};
    CHECK_EQ(kvp_xfer_create(&o, &x), 0);
    CHECK_EQ(kvp_xfer_add_segment(x, &f.desc), 0);
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), "shm"));
    uint64_t sz[] = {64 * 1024};
    CHECK_EQ(roundtrip(x, sz, 1, 1, 2 * MiB), 0); /* past the rogue memfd's 4096 bytes */
    CHECK(!strcmp(kvp_xfer_transport(x, SEG_ID), "tcp"));
    kvp_xfer_destroy(x);
    pthread_join(r.th, NULL);
    close(r.lfd);
    unlink(r.path);
    fx_stop(&f);
}

/* The socket file's mode does not come from the umask. */
TEST(unix_socket_mode_umask0)
{
    umask(0);
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    struct stat st;
    CHECK(lstat(f.unix_path, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK_EQ(st.st_mode & 07777, 0600);
    /* with a group: 0660, owned by that group */
    char err[256], path[108];
    snprintf(path, sizeof path, "/tmp/kvp-test-g-%d.sock", (int)getpid());
    kvp_segserver *s2;
    kvp_segserver_opts o = {"127.0.0.1:0", path, 1, NULL, SEG_ID, f.grants, {1, getegid()},
                            NULL, 0};
    CHECK_EQ(kvp_segserver_start(f.seg, &o, &s2, err, sizeof err), 0);
    CHECK(lstat(path, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK_EQ(st.st_mode & 07777, 0660);
    CHECK_EQ(st.st_gid, getegid());
    kvp_segserver_stop(s2);
    CHECK(lstat(path, &st) != 0 && errno == ENOENT); /* removed on a clean stop */
    fx_stop(&f);
    CHECK(lstat(f.unix_path, &st) != 0 && errno == ENOENT);
}

static int start_at(const char *path, kvp_segment *seg, kvp_segserver **out, char *err,
                    size_t errlen)
{
    static kvp_grants *g; /* one for the process: freed at exit by the OS */
    if (!g && kvp_grants_create(kvp_segment_size(seg), SECRET, &g) != 0)
        return -1;
    kvp_segserver_opts o = {"127.0.0.1:0", path, 1, NULL, SEG_ID, g, {0, 0}, NULL, 0};
    return kvp_segserver_start(seg, &o, out, err, errlen);
}

/* Whatever sits at the socket path is left alone unless it is a socket
 * nobody listens on. */
TEST(unix_path_only_stale_sockets_replaced)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    char err[256], path[108];
    kvp_segment *seg;
    CHECK_EQ(kvp_segment_create(4 * MiB, "t", &seg, err, sizeof err), 0);
    snprintf(path, sizeof path, "/tmp/kvp-test-p-%d.sock", (int)getpid());
    /* a regular file: start fails, the file stays */
    FILE *fp = fopen(path, "w");
    CHECK(fp && fputs("precious\n", fp) >= 0 && fclose(fp) == 0);
    kvp_segserver *s = NULL;
    err[0] = 0;
    CHECK(start_at(path, seg, &s, err, sizeof err) < 0);
    CHECK(strstr(err, path) && strstr(err, "not a socket"));
    char line[32] = {0};
    fp = fopen(path, "r");
    CHECK(fp && fgets(line, sizeof line, fp) && !strcmp(line, "precious\n"));
    fclose(fp);
    unlink(path);
    /* a live socket (another node): start fails, it keeps listening */
    int live = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    CHECK(bind(live, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(live, 4) == 0);
    err[0] = 0;
    CHECK(start_at(path, seg, &s, err, sizeof err) < 0);
    CHECK(strstr(err, "listens") != NULL);
    int c = unix_connect(path);
    CHECK(c >= 0);
    close(c);
    /* the same socket once its owner is gone (kill -9): replaced */
    close(live);
    CHECK_EQ(start_at(path, seg, &s, err, sizeof err), 0);
    c = unix_connect(path);
    CHECK(c >= 0);
    CHECK_EQ(raw_hello(c, ""), 0);
    close(c);
    kvp_segserver_stop(s);
    kvp_segment_destroy(seg);
}

TEST(peer_cred_decision)
{
    kvp_unixsock_access none = {0, 0}, grp = {1, 500};
    gid_t sup[] = {7, 500, 9}, other[] = {7, 9};
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &none, 1000, 1000, NULL, 0), 1);
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &none, 1001, 1000, NULL, 0), 0);
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &none, 0, 0, NULL, 0), 0); /* root: not ours */
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &none, 1001, 500, sup, 3), 0);
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, NULL, 1001, 500, sup, 3), 0);
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &grp, 1001, 500, NULL, 0), 1); /* primary */
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &grp, 1001, 1001, sup, 3), 1); /* supplementary */
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &grp, 1001, 1001, other, 2), 0);
    CHECK_EQ(kvp_unixsock_peer_allowed(1000, &grp, 65534, 65534, NULL, 0), 0);
    CHECK_EQ(kvp_unixsock_peer_allowed(0, &none, 0, 0, NULL, 0), 1);
    kvp_unixsock_access a;
    char err[256];
    CHECK_EQ(kvp_unixsock_group_parse("", &a, err, sizeof err), 0);
    CHECK_EQ(a.has_group, 0);
    CHECK_EQ(kvp_unixsock_group_parse("1234", &a, err, sizeof err), 0);
    CHECK(a.has_group == 1 && a.gid == 1234);
    CHECK_EQ(kvp_unixsock_group_parse("root", &a, err, sizeof err), 0);
    CHECK(a.has_group == 1 && a.gid == 0);
    CHECK_EQ(kvp_unixsock_group_parse("no-such-group-kvp", &a, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "no-such-group-kvp") != NULL);
    CHECK_EQ(kvp_unixsock_group_parse("99999999999", &a, err, sizeof err), KVP_ECONFIG);
}

/* As uid 65534 in a child: connects (the test opens the file mode), is
 * dropped by the SO_PEERCRED check. Exit 0 when the connection was closed
 * without an answer, 1 when HELLO was answered, 2 on setup errors. */
static int connect_as_nobody(const char *path)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
            _exit(2);
        int fd = unix_connect(path);
        if (fd < 0)
            _exit(2);
        int st = raw_hello(fd, "");
        _exit(st == 0 ? 1 : 0);
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

TEST(peer_cred_other_uid_refused)
{
    if (geteuid() != 0)
        SKIP("needs root to connect as another uid (peer_cred_decision covers the rule)");
    fx f;
    if (fx_start(&f, 4 * MiB, NULL))
        return;
    CHECK(chmod(f.unix_path, 0666) == 0); /* only the credential check is left */
    CHECK_EQ(connect_as_nobody(f.unix_path), 0);
    CHECK_EQ(kvp_segserver_peer_refused(f.srv), 1);
    int fd = unix_connect(f.unix_path); /* our own uid still gets in */
    CHECK(fd >= 0);
    CHECK_EQ(raw_hello(fd, ""), 0);
    close(fd);
    /* a server allowing group 65534 lets the same child in */
    char err[256], path[108];
    snprintf(path, sizeof path, "/tmp/kvp-test-n-%d.sock", (int)getpid());
    kvp_segserver *s2;
    kvp_segserver_opts o = {"127.0.0.1:0", path, 1, NULL, SEG_ID, f.grants, {1, 65534}, NULL, 0};
    CHECK_EQ(kvp_segserver_start(f.seg, &o, &s2, err, sizeof err), 0);
    CHECK(chmod(path, 0666) == 0);
    CHECK_EQ(connect_as_nobody(path), 1);
    CHECK_EQ(kvp_segserver_peer_refused(s2), 0);
    kvp_segserver_stop(s2);
    fx_stop(&f);
}

/* ------------------------------------------- node: runtime directory */

static int node_start_in(const char *unix_dir, const char *group, kvp_node **n, char *err,
                         size_t errlen)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    cfg.master_addr[0] = 0;
    cfg.global_segment_size = 4 * MiB;
    snprintf(cfg.shm_group, sizeof cfg.shm_group, "%s", group ? group : "");
    kvp_node_opts o = {.cfg = &cfg, .listen = "127.0.0.1:0", .unix_dir = unix_dir,
                       .io_threads = 1, .master_optional = 1};
    return kvp_node_start(&o, n, err, errlen);
}

/* Sockets named like a node's in dir (count; the first name into out). */
static int node_socks(const char *dir, char *out, size_t outlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int k = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, "kvpool-seg-", 11) != 0)
            continue;
        if (k++ == 0)
            snprintf(out, outlen, "%s/%s", dir, de->d_name);
    }
    closedir(d);
    return k;
}

/* Default: $XDG_RUNTIME_DIR/kvpool, created 0700 whatever the umask; the
 * socket inside is 0600 and goes away on a clean stop. */
TEST(node_runtime_dir_private)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    umask(0);
    char xdg[] = "/tmp/kvp-xdg-XXXXXX";
    CHECK(mkdtemp(xdg) != NULL);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    kvp_node *n;
    char err[512], dir[256], sock[512];
    CHECK_EQ(node_start_in(NULL, NULL, &n, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/kvpool", xdg);
    struct stat st;
    CHECK(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ(st.st_mode & 07777, 0700);
    CHECK_EQ(st.st_uid, geteuid());
    CHECK_EQ(node_socks(dir, sock, sizeof sock), 1);
    CHECK(lstat(sock, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK_EQ(st.st_mode & 07777, 0600);
    kvp_node_stop(n);
    CHECK_EQ(node_socks(dir, sock, sizeof sock), 0);
    /* an explicit --unix-dir that does not exist yet: created 0700 */
    char mine[300];
    snprintf(mine, sizeof mine, "%s/mine", xdg);
    CHECK_EQ(node_start_in(mine, NULL, &n, err, sizeof err), 0);
    CHECK(lstat(mine, &st) == 0 && S_ISDIR(st.st_mode));
    CHECK_EQ(st.st_mode & 07777, 0700);
    CHECK_EQ(node_socks(mine, sock, sizeof sock), 1);
    kvp_node_stop(n);
    /* with a group: directory 0710 and socket 0660, both of that group */
    char gdir[300], gid[16];
    snprintf(gdir, sizeof gdir, "%s/grp", xdg);
    snprintf(gid, sizeof gid, "%u", (unsigned)getegid());
    CHECK_EQ(node_start_in(gdir, gid, &n, err, sizeof err), 0);
    CHECK(lstat(gdir, &st) == 0 && (st.st_mode & 07777) == 0710 && st.st_gid == getegid());
    CHECK_EQ(node_socks(gdir, sock, sizeof sock), 1);
    CHECK(lstat(sock, &st) == 0 && (st.st_mode & 07777) == 0660 && st.st_gid == getegid());
    kvp_node_stop(n);
    /* no XDG_RUNTIME_DIR: /tmp/kvpool-UID */
    unsetenv("XDG_RUNTIME_DIR");
    CHECK_EQ(node_start_in(NULL, NULL, &n, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "/tmp/kvpool-%u", (unsigned)geteuid());
    CHECK(lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid());
    CHECK_EQ(st.st_mode & 022, 0);
    kvp_node_stop(n);
    rmdir(mine);
    rmdir(gdir);
    snprintf(dir, sizeof dir, "%s/kvpool", xdg);
    rmdir(dir);
    rmdir(xdg);
}

/* Directories a socket must not go in are refused with the reason. */
TEST(node_runtime_dir_refused)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    char base[] = "/tmp/kvp-rd-XXXXXX";
    CHECK(mkdtemp(base) != NULL);
    char p[300], err[512];
    kvp_node *n;
    /* /tmp itself: writable by everyone */
    err[0] = 0;
    CHECK(node_start_in("/tmp", NULL, &n, err, sizeof err) < 0);
    CHECK(strstr(err, "/tmp") && strstr(err, "writable by other users"));
    /* a group-writable directory, no group configured */
    snprintf(p, sizeof p, "%s/gw", base);
    CHECK(mkdir(p, 0700) == 0 && chmod(p, 0770) == 0);
    err[0] = 0;
    CHECK(node_start_in(p, NULL, &n, err, sizeof err) < 0);
    CHECK(strstr(err, "writable by other users") != NULL);
    /* a symlink to a good directory */
    char good[300];
    snprintf(good, sizeof good, "%s/good", base);
    snprintf(p, sizeof p, "%s/link", base);
    CHECK(mkdir(good, 0700) == 0 && symlink(good, p) == 0);
    err[0] = 0;
    CHECK(node_start_in(p, NULL, &n, err, sizeof err) < 0);
    CHECK(strstr(err, "symbolic link") != NULL);
    /* a regular file */
    snprintf(p, sizeof p, "%s/file", base);
    FILE *f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);
    err[0] = 0;
    CHECK(node_start_in(p, NULL, &n, err, sizeof err) < 0);
    CHECK(strstr(err, "not a directory") != NULL);
    /* a group that does not exist */
    err[0] = 0;
    CHECK(node_start_in(good, "no-such-group-kvp", &n, err, sizeof err) < 0);
    CHECK(strstr(err, "no-such-group-kvp") != NULL);
    unlink(p);
    snprintf(p, sizeof p, "%s/link", base);
    unlink(p);
    snprintf(p, sizeof p, "%s/gw", base);
    rmdir(p);
    rmdir(good);
    rmdir(base);
}

/* A --unix-dir whose socket path would not fit sun_path is refused, and
 * nothing at the would-be cut path is touched (it used to be unlinked). */
TEST(node_unix_dir_too_long)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    char dir[200];
    int n0 = snprintf(dir, sizeof dir, "/tmp/kvp-long-%d-", (int)getpid());
    /* dir + "/kvpool-seg-" + 16 hex + ".sock" = dir + 33 bytes: make it 110 */
    while (n0 < 110 - 33)
        dir[n0++] = 'd';
    dir[n0] = 0;
    CHECK(mkdir(dir, 0700) == 0);
    char cut[256];
    snprintf(cut, sizeof cut, "%s/kvpool-seg-", dir); /* 107 bytes of the would-be path */
    size_t cl = strlen(cut);
    memset(cut + cl, '0', 107 - cl);
    cut[107] = 0;
    FILE *f = fopen(cut, "w");
    CHECK(f && fclose(f) == 0);
    kvp_node *n;
    char err[512] = {0};
    CHECK(node_start_in(dir, NULL, &n, err, sizeof err) < 0);
    CHECK(strstr(err, "107") && strstr(err, dir) && strstr(err, "110 bytes"));
    struct stat st;
    CHECK(lstat(cut, &st) == 0 && S_ISREG(st.st_mode));
    unlink(cut);
    rmdir(dir);
}

/* At start a node removes the sockets of nodes that died in its runtime
 * directory, and nothing else. */
TEST(node_sweeps_stale_sockets)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    char dir[] = "/tmp/kvp-sw-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char stale[300], live[300], file[300], other[300];
    snprintf(stale, sizeof stale, "%s/kvpool-seg-00000000000000aa.sock", dir);
    snprintf(live, sizeof live, "%s/kvpool-seg-00000000000000bb.sock", dir);
    snprintf(file, sizeof file, "%s/kvpool-seg-00000000000000cc.sock", dir);
    snprintf(other, sizeof other, "%s/other.sock", dir);
    const char *socks[] = {stale, live, other};
    int fds[3];
    for (int i = 0; i < 3; i++) {
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", socks[i]);
        CHECK(bind(fds[i], (struct sockaddr *)&sa, sizeof sa) == 0);
    }
    CHECK(listen(fds[1], 4) == 0);
    close(fds[0]); /* stale: its node died */
    close(fds[2]); /* stale, but not named like ours */
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    kvp_node *n;
    char err[512];
    CHECK_EQ(node_start_in(dir, NULL, &n, err, sizeof err), 0);
    struct stat st;
    CHECK(lstat(stale, &st) != 0 && errno == ENOENT);
    CHECK(lstat(live, &st) == 0 && S_ISSOCK(st.st_mode));
    CHECK(lstat(file, &st) == 0 && S_ISREG(st.st_mode));
    CHECK(lstat(other, &st) == 0 && S_ISSOCK(st.st_mode));
    kvp_node_stop(n);
    close(fds[1]);
    unlink(live);
    unlink(file);
    unlink(other);
    rmdir(dir);
}

/* ------------------------------------------------ limits and deadlines */

/* Milliseconds until the peer closes fd (EOF or reset; what arrives before
 * is discarded), -1 if it has not within max_ms. */
static long ms_until_closed(int fd, long max_ms)
{
    uint64_t t0 = kvp_now_ms();
    for (;;) {
        long el = (long)(kvp_now_ms() - t0);
        if (el >= max_ms)
            return -1;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, (int)(max_ms - el)) <= 0)
            continue;
        uint8_t b[256];
        ssize_t r = recv(fd, b, sizeof b, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            return (long)(kvp_now_ms() - t0);
    }
}

static kvp_xfer *tcp_client(fx *f, uint64_t client_id, int conns)
{
    kvp_xfer *x = NULL;
    kvp_xfer_opts o = {NULL, client_id, conns, 1, 5000, 0, 0, 0};
    if (kvp_xfer_create(&o, &x) != 0)
        return NULL;
    if (kvp_xfer_add_segment(x, &f->desc) != 0) {
        kvp_xfer_destroy(x);
        return NULL;
    }
    return x;
}

/* Silent connections beyond the pre-HELLO cap close the oldest of them, so
 * they lock out neither pooled nor new clients; past max_conns a new
 * connection is closed at once, and the authenticated ones stay. */
TEST(conn_cap_silent_flood)
{
    fx f;
    kvp_segserver_limits lim = {.max_conns = 12, .max_pre_hello = 4};
    if (fx_start_lim(&f, 4 * MiB, NULL, &lim))
        return;
    uint64_t sz[3] = {4096, 8192, 65536};
    kvp_xfer *x1 = tcp_client(&f, 7, 3);
    CHECK(x1);
    CHECK_EQ(roundtrip(x1, sz, 3, 1, 0), 0); /* 3 pooled connections */
    enum { FLOOD = 20 };
    int fl[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        fl[i] = raw_connect(f.addr);
        CHECK(fl[i] >= 0);
    }
    usleep(300000);
    int open = 0;
    for (int i = 0; i < FLOOD; i++)
        open += ms_until_closed(fl[i], 20) < 0;
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    fprintf(stderr, "  flood: %d of %d silent connections open, %llu evicted, %llu refused\n",
            open, FLOOD, (unsigned long long)st.evicted, (unsigned long long)st.refused_full);
    CHECK(open <= 4);
    CHECK(st.evicted + st.refused_full >= FLOOD - 4);
    CHECK_EQ(roundtrip(x1, sz, 3, 1, 1 * MiB), 0); /* pooled: untouched */
    kvp_xfer *x2 = tcp_client(&f, 8, 2);
    CHECK(x2);
    CHECK_EQ(roundtrip(x2, sz, 2, 1, 2 * MiB), 0); /* new: served */
    /* fill up with authenticated connections until one is refused */
    int au[16], na = 0, refused = 0;
    while (na < 16 && !refused) {
        au[na] = raw_connect(f.addr);
        CHECK(au[na] >= 0);
        if (raw_hello(au[na], "") != 0)
            refused = 1;
        na++;
    }
    kvp_segserver_stats_get(f.srv, &st);
    fprintf(stderr, "  full: %d accepted before a refusal, %llu open, %llu refused at accept\n",
            na - 1, (unsigned long long)st.conns, (unsigned long long)st.refused_full);
    CHECK(refused);
    CHECK(st.refused_full >= 1);
    CHECK(st.conns <= 12);
    CHECK_EQ(roundtrip(x1, sz, 3, 1, 3 * MiB), 0);
    CHECK_EQ(roundtrip(x2, sz, 2, 1, 3 * MiB + 256 * 1024), 0);
    for (int i = 0; i < na; i++)
        close(au[i]);
    for (int i = 0; i < FLOOD; i++)
        close(fl[i]);
    kvp_xfer_destroy(x1);
    kvp_xfer_destroy(x2);
    fx_stop(&f);
}

/* HELLO deadline, idle timeout, stalled frames (mid-header, mid-body); a
 * connection with a frame every 250 ms outlives them all. */
TEST(conn_deadlines)
{
    fx f;
    kvp_segserver_limits lim = {
        .hello_timeout_ms = 300, .idle_timeout_ms = 1500, .stall_timeout_ms = 300};
    if (fx_start_lim(&f, 4 * MiB, NULL, &lim))
        return;
    const char *name[4] = {"no HELLO", "idle", "stalled body", "stalled header"};
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = raw_connect(f.addr);
        CHECK(fds[i] >= 0);
        if (i > 0)
            CHECK_EQ(raw_hello(fds[i], ""), 0);
    }
    uint8_t fr[KVP_FRAME_HDR + KVP_SEG_IO_SIZE + 100];
    kvp_replica w = rep(65536, 4096, 1);
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 5, KVP_SEG_IO_SIZE + 4096, &w);
    memset(fr + KVP_FRAME_HDR + KVP_SEG_IO_SIZE, 0xAB, 100);
    CHECK_EQ(raw_send(fds[2], fr, sizeof fr), 0); /* 100 of 4096 body bytes */
    CHECK_EQ(raw_send(fds[3], fr, 10), 0);        /* 10 of 24 header bytes */
    int busy = raw_connect(f.addr);
    CHECK(busy >= 0);
    CHECK_EQ(raw_hello(busy, ""), 0);
    kvp_replica r = rep(0, 4096, 1);
    uint8_t rf[KVP_FRAME_HDR + KVP_SEG_IO_SIZE], body[4096];
    long at[4] = {-1, -1, -1, -1};
    uint64_t t0 = kvp_now_ms(), next = t0;
    int pings = 0;
    while (kvp_now_ms() - t0 < 3500) {
        if (kvp_now_ms() >= next) {
            seg_io_frame(rf, KVP_OP_SEG_READ, 100 + (uint64_t)pings, KVP_SEG_IO_SIZE, &r);
            CHECK_EQ(raw_send(busy, rf, sizeof rf), 0);
            uint32_t bl = 0;
            CHECK_EQ(raw_answer(busy, NULL, &bl), 0);
            CHECK(bl == sizeof body && recv(busy, body, bl, MSG_WAITALL) == (ssize_t)bl);
            pings++;
            next += 250;
        }
        struct pollfd p[4];
        for (int i = 0; i < 4; i++)
            p[i] = (struct pollfd){at[i] < 0 ? fds[i] : -1, POLLIN, 0};
        if (poll(p, 4, 50) <= 0)
            continue;
        for (int i = 0; i < 4; i++) {
            if (!p[i].revents)
                continue;
            uint8_t b[256];
            ssize_t n = recv(fds[i], b, sizeof b, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN))
                at[i] = (long)(kvp_now_ms() - t0);
        }
    }
    for (int i = 0; i < 4; i++)
        fprintf(stderr, "  %s: closed after %ld ms\n", name[i], at[i]);
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    fprintf(stderr, "  busy: %d frames, open; timeouts: hello %llu, idle %llu, stall %llu\n",
            pings, (unsigned long long)st.hello_timeouts, (unsigned long long)st.idle_timeouts,
            (unsigned long long)st.stall_timeouts);
    CHECK(at[0] >= 0 && at[0] < 1200);
    CHECK(at[2] >= 0 && at[2] < 1200);
    CHECK(at[3] >= 0 && at[3] < 1200);
    CHECK(at[1] >= 1200 && at[1] < 3300);
    CHECK_EQ(ms_until_closed(busy, 10), -1);
    CHECK_EQ(st.hello_timeouts, 1);
    CHECK_EQ(st.idle_timeouts, 1);
    CHECK_EQ(st.stall_timeouts, 2);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    close(busy);
    fx_stop(&f);
}

/* The node closes a client's pooled connections for idleness; the next
 * batch replaces them instead of failing its ops. */
TEST(pooled_conn_idle_closed_is_replaced)
{
    fx f;
    kvp_segserver_limits lim = {.idle_timeout_ms = 300};
    if (fx_start_lim(&f, 4 * MiB, NULL, &lim))
        return;
    uint64_t sz[3] = {4096, 100000, 65536};
    kvp_xfer *x = tcp_client(&f, 7, 3);
    CHECK(x);
    CHECK_EQ(roundtrip(x, sz, 3, 2, 0), 0);
    usleep(1000000);
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    fprintf(stderr, "  %llu pooled connections closed idle, %llu open\n",
            (unsigned long long)st.idle_timeouts, (unsigned long long)st.conns);
    CHECK_EQ(st.idle_timeouts, 3);
    CHECK_EQ(st.conns, 0);
    CHECK_EQ(roundtrip(x, sz, 3, 2, 1 * MiB), 0);
    kvp_xfer_destroy(x);
    fx_stop(&f);
}

/* The server of conn_emfile_backoff, in its own process: RLIMIT_NOFILE 64,
 * log to logpath. Writes its port, then on 'm' its CPU and wall time (ms)
 * over 2 s; stops on 'q'. */
static void emfile_server(int out, int in, const char *logpath)
{
    int lf = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (lf < 0 || dup2(lf, 2) < 0)
        _exit(2);
    close(lf);
    kvp_log_set_level(KVP_LOG_WARN);
    struct rlimit rl = {64, 64};
    char err[256];
    kvp_segment *seg;
    kvp_grants *g;
    kvp_segserver *srv;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 ||
        kvp_segment_create(1 * MiB, "emfile", &seg, err, sizeof err) != 0 ||
        kvp_grants_create(kvp_segment_size(seg), SECRET, &g) != 0)
        _exit(3);
    kvp_segserver_opts o = {"127.0.0.1:0", NULL, 1, NULL, SEG_ID, g, {0, 0}, NULL, 0};
    if (kvp_segserver_start(seg, &o, &srv, err, sizeof err) != 0)
        _exit(4);
    uint16_t port = kvp_segserver_port(srv);
    if (write(out, &port, sizeof port) != sizeof port)
        _exit(5);
    char cmd;
    while (read(in, &cmd, 1) == 1 && cmd == 'm') {
        struct rusage r0, r1;
        getrusage(RUSAGE_SELF, &r0);
        uint64_t t0 = kvp_now_us();
        usleep(2000000);
        getrusage(RUSAGE_SELF, &r1);
        uint64_t res[2] = {
            (uint64_t)((r1.ru_utime.tv_sec - r0.ru_utime.tv_sec + r1.ru_stime.tv_sec -
                        r0.ru_stime.tv_sec) * 1000000L +
                       (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                       (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec)) / 1000,
            (kvp_now_us() - t0) / 1000};
        if (write(out, res, sizeof res) != sizeof res)
            _exit(6);
    }
    kvp_segserver_stop(srv);
    kvp_grants_destroy(g);
    kvp_segment_destroy(seg);
    _exit(0);
}

static long count_lines(const char *path)
{
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    long n = 0;
    int ch;
    while ((ch = fgetc(fp)) != EOF)
        n += ch == '\n';
    fclose(fp);
    return n;
}

/* Out of descriptors, the acceptor backs off instead of spinning: a flood
 * of 300 connections against a server with RLIMIT_NOFILE 64 costs it under
 * 20 % of a core and under 100 log lines over 2 s, and a client is served
 * once the flood ends. */
TEST(conn_emfile_backoff)
{
    char logpath[64];
    snprintf(logpath, sizeof logpath, "/tmp/kvp-emfile-%d.log", (int)getpid());
    int s2p[2], p2s[2], f2p[2], p2f[2];
    CHECK(pipe(s2p) == 0 && pipe(p2s) == 0);
    pid_t srv = fork();
    CHECK(srv >= 0);
    if (srv == 0) {
        close(s2p[0]);
        close(p2s[1]);
        emfile_server(s2p[1], p2s[0], logpath);
    }
    close(s2p[1]);
    close(p2s[0]);
    uint16_t port = 0;
    CHECK(read(s2p[0], &port, sizeof port) == sizeof port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    CHECK(pipe(f2p) == 0 && pipe(p2f) == 0); /* after the server's fork: it holds no end */
    pid_t fl = fork();
    CHECK(fl >= 0);
    if (fl == 0) { /* the flood: holds its connections until told */
        close(f2p[0]);
        close(p2f[1]);
        int n = 0;
        for (int i = 0; i < 300; i++)
            n += raw_connect(addr) >= 0;
        if (write(f2p[1], &n, sizeof n) != sizeof n)
            _exit(1);
        char c;
        ssize_t r = read(p2f[0], &c, 1);
        (void)r;
        _exit(0);
    }
    close(f2p[1]);
    close(p2f[0]);
    int flooded = 0;
    CHECK(read(f2p[0], &flooded, sizeof flooded) == sizeof flooded);
    usleep(200000);
    CHECK(write(p2s[1], "m", 1) == 1);
    uint64_t res[2];
    CHECK(read(s2p[0], res, sizeof res) == sizeof res);
    long lines = count_lines(logpath);
    fprintf(stderr, "  %d connections flooded; server: %llu ms CPU in %llu ms, %ld log lines\n",
            flooded, (unsigned long long)res[0], (unsigned long long)res[1], lines);
    close(p2f[1]); /* the flood ends */
    int wst;
    CHECK(waitpid(fl, &wst, 0) == fl);
    int served = 1;
    uint64_t t0 = kvp_now_ms();
    while (served != 0 && kvp_now_ms() - t0 < 5000) {
        int fd = raw_connect(addr);
        served = fd >= 0 ? raw_hello(fd, "") : 1;
        if (fd >= 0)
            close(fd);
    }
    fprintf(stderr, "  after the flood: a client served in %llu ms\n",
            (unsigned long long)(kvp_now_ms() - t0));
    CHECK(write(p2s[1], "q", 1) == 1);
    CHECK(waitpid(srv, &wst, 0) == srv);
    unlink(logpath);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    CHECK(flooded >= 200);
    CHECK(lines >= 0 && lines < 100);
    CHECK(res[0] * 5 < res[1]);
    CHECK_EQ(served, 0);
}

/* ------------------------- transfers in flight (hardening issue, item 1) */

static size_t count_of_byte(const uint8_t *p, size_t n, uint8_t v)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += p[i] == v;
    return k;
}

/* Reads from fd until it closes or ms pass; the bytes read. */
static size_t drain(int fd, long ms)
{
    size_t n = 0;
    uint64_t t0 = kvp_now_ms();
    uint8_t *b = malloc(1 << 20);
    while ((long)(kvp_now_ms() - t0) < ms) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t r = recv(fd, b, 1 << 20, 0);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    free(b);
    return n;
}

/* A raw connection that said HELLO, with a small receive buffer unless
 * `big`. */
static int slow_conn_sz(fx *f, int big)
{
    int fd = raw_connect(f->addr);
    REQUIRE(fd >= 0);
    int small = 4096;
    if (!big)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    REQUIRE(raw_hello(fd, "") == 0);
    return fd;
}

static int slow_conn(fx *f) { return slow_conn_sz(f, 0); }

/* Sends the frame of a SEG_READ of r (issued for reading). */
static int send_read(int fd, const kvp_replica *r)
{
    uint8_t fr[KVP_FRAME_HDR + KVP_SEG_IO_SIZE];
    seg_io_frame(fr, KVP_OP_SEG_READ, 9, KVP_SEG_IO_SIZE, r);
    return raw_send(fd, fr, sizeof fr);
}

/* A SEG_READ answer still going out and a SEG_WRITE body still coming in
 * are cut by a revocation barrier that finds their grant dead -- the write
 * never answered, nothing of it landing after the barrier -- while a
 * transfer on another allocation goes on. */
TEST(transfers_cut_at_revocation_barrier)
{
    fx f;
    CHECK(fx_start(&f, 64 * MiB, "") == 0);
    uint8_t *base = kvp_segment_base(f.seg);
    memset(base, 0x5A, 64 * MiB);
    kvp_replica ra = rep(0, 16 * MiB, 5), rb = rep(16 * MiB, 16 * MiB, 6);
    kvp_replica rw = rep(32 * MiB, 8 * MiB, 7);
    int a = slow_conn(&f), b = slow_conn_sz(&f, 1), w = slow_conn(&f);
    CHECK(a >= 0 && b >= 0 && w >= 0);
    CHECK_EQ(send_read(a, &ra), 0);
    CHECK_EQ(send_read(b, &rb), 0);
    uint8_t fr[KVP_FRAME_HDR + KVP_SEG_IO_SIZE];
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 3, (uint32_t)(KVP_SEG_IO_SIZE + rw.length), &rw);
    CHECK_EQ(raw_send(w, fr, sizeof fr), 0);
    uint8_t *chunk = malloc(MiB);
    memset(chunk, 0xEE, MiB);
    CHECK_EQ(raw_send(w, chunk, MiB), 0);
    usleep(200000);
    /* the allocations of a and w are freed, b's is not */
    kvp_grants_freed(f.grants, 0, 4096, 5, 0);
    kvp_grants_freed(f.grants, (32 * MiB) >> 12, 2048, 7, 0);
    CHECK_EQ(kvp_segserver_revoke(f.srv, 0, 2000), 0);
    CHECK(base[32 * MiB] == 0xEE); /* the first MiB went in (read after the barrier) */
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    CHECK_EQ(st.cut_revoked, 2);
    CHECK_EQ(drain(b, 5000), KVP_FRAME_HDR + 16 * MiB); /* untouched, complete */
    CHECK(drain(a, 3000) < KVP_FRAME_HDR + 16 * MiB); /* cut, not finished */
    memset(chunk, 0x77, MiB);
    for (int i = 1; i < 8; i++)
        if (raw_send(w, chunk, MiB) != 0)
            break;
    CHECK(closed(w));
    CHECK_EQ(count_of_byte(base + 32 * MiB + MiB, 7 * MiB, 0x77), 0);
    /* revoking every transfer: even a live grant's answer is cut */
    int c = slow_conn(&f);
    kvp_replica rc = rep(48 * MiB, 16 * MiB, 8);
    CHECK_EQ(send_read(c, &rc), 0);
    usleep(100000);
    CHECK_EQ(kvp_segserver_revoke(f.srv, 1, 2000), 0);
    CHECK(drain(c, 3000) < KVP_FRAME_HDR + 16 * MiB);
    free(chunk);
    close(a);
    close(b);
    close(c);
    close(w);
    fx_stop(&f);
}

/* A transfer is cut at its descriptor's expiry (+ the clock slack), not
 * only when it stalls for stall_timeout. */
TEST(transfer_cut_at_descriptor_expiry)
{
    fx f;
    CHECK(fx_start(&f, 64 * MiB, "") == 0);
    kvp_replica r = rep(0, 32 * MiB, 1);
    r.expires_ms = kvp_now_ms() + 200;
    r.tag = kvp_replica_tag(SECRET, &r);
    int a = slow_conn(&f);
    CHECK(a >= 0);
    CHECK_EQ(send_read(a, &r), 0);
    uint8_t head[64 * 1024];
    CHECK(recv(a, head, sizeof head, MSG_WAITALL) == (ssize_t)sizeof head);
    usleep((200 + KVP_GRANT_SLACK_MS + 400) * 1000);
    CHECK(drain(a, 5000) < KVP_FRAME_HDR + 32 * MiB - sizeof head);
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    CHECK_EQ(st.cut_expired, 1);
    close(a);
    fx_stop(&f);
}

/* A connection in the middle of a frame that trickles bytes (under the
 * stall timeout) is cut once it moves less than min_rate over a window;
 * one that moves its bytes is not. */
TEST(slow_transfer_cut_below_min_rate)
{
    fx f;
    kvp_segserver_limits lim = {.min_rate = 256 * 1024, .rate_window_ms = 500};
    CHECK(fx_start_lim(&f, 16 * MiB, "", &lim) == 0);
    kvp_replica rw = rep(0, 4 * MiB, 1);
    int w = slow_conn(&f);
    CHECK(w >= 0);
    uint8_t fr[KVP_FRAME_HDR + KVP_SEG_IO_SIZE];
    seg_io_frame(fr, KVP_OP_SEG_WRITE, 3, (uint32_t)(KVP_SEG_IO_SIZE + rw.length), &rw);
    CHECK_EQ(raw_send(w, fr, sizeof fr), 0);
    uint8_t kib[1024] = {0};
    uint64_t t0 = kvp_now_ms();
    int cut = 0;
    while (!cut && kvp_now_ms() - t0 < 5000) {
        if (raw_send(w, kib, sizeof kib) != 0)
            cut = 1;
        struct pollfd p = {w, POLLIN, 0};
        if (poll(&p, 1, 50) > 0 && recv(w, kib, sizeof kib, MSG_DONTWAIT) <= 0)
            cut = 1;
    }
    CHECK(cut);
    long el = (long)(kvp_now_ms() - t0);
    fprintf(stderr, "  trickling writer cut after %ld ms\n", el);
    CHECK(el < 3000);
    kvp_segserver_stats st;
    kvp_segserver_stats_get(f.srv, &st);
    CHECK_EQ(st.cut_slow, 1);
    CHECK_EQ(st.stall_timeouts, 0);
    /* a normal client moves its bytes and is not cut */
    kvp_xfer *x = tcp_client(&f, 77, 1);
    CHECK(x != NULL);
    uint64_t sz = 4 * MiB;
    CHECK_EQ(roundtrip(x, &sz, 1, 1, 8 * MiB), 0);
    kvp_xfer_destroy(x);
    kvp_segserver_stats_get(f.srv, &st);
    CHECK_EQ(st.cut_slow, 1);
    close(w);
    fx_stop(&f);
}
