/*
 * test_ucx.c -- the "ucx" transport against real processes: a `kvpool
 * master` and `kvpool store --protocol ucx` nodes, clients opened with
 * protocol "ucx" and KVPOOL_FORCE_UCX=1 (the node is on this host, where
 * shared memory would otherwise win), over UCX's own TCP and shared-memory
 * transports (UCX_TLS=tcp, UCX_TLS=sm): no RDMA NIC here, the same code
 * uses one where UCX finds it.
 *
 * Covers: every size class and scattered multi-piece values in batches,
 * byte-exact, and that the bytes went through UCX (the client's per-path
 * counters); a node killed with SIGKILL in the middle of put batches (every
 * result an error or a value read back byte-exact, then a new node used
 * through a new attach); a one-sided write through a stale descriptor,
 * which lands (an rkey covers the whole segment: docs/SECURITY.md) and is
 * caught by the reader's checksum -- an error, never the bytes -- while
 * the same write over tcp is refused by the node; a node without the
 * transport (tcp used instead); ucx refused while tenants are protected
 * (tenant_tokens_file), at the master's and the node's start, unless the
 * master's ucx_insecure accepts it; with no credential, every socket a ucx
 * node listens on (its own and UCX's) is bound to loopback.
 *
 * Skips, with the reason, where UCX cannot be loaded.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "client/xfer.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/ucx.h"
#include "harness.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"
#include "tenant_peer.h"

#define MiB (1024ull * 1024)

typedef struct env {
    tp_master m;
    tp_store st[2];
} env;

/* Skips unless UCX loads here. */
static int ucx_or_skip(void)
{
    char why[256];
    if (kvp_ucx_load(why, sizeof why) != 0) {
        th_skip(why);
        return -1;
    }
    return 0;
}

/* A master and a `--protocol ucx` store (256 MiB), UCX_TLS=tls for both
 * and for this process's clients. */
static int env_up(env *e, const char *tls, const char *store_protocol)
{
    memset(e, 0, sizeof *e);
    setenv("UCX_TLS", tls, 1);
    setenv("KVPOOL_FORCE_UCX", "1", 1);
    unsetenv("KVPOOL_FORCE_TCP");
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    return tp_store_start(&e->st[0], e->m.addr,
                          (const char *const[]){"--segment-size", "256MiB", "--protocol",
                                                store_protocol, NULL});
}

static void env_down(env *e);

/* ucx_or_skip, then env_up: 0, or -1 with the test skipped or failed (and
 * whatever started stopped). */
static int ucx_env(env *e, const char *tls, const char *store_protocol)
{
    if (ucx_or_skip())
        return -1;
    if (env_up(e, tls, store_protocol) != 0) {
        env_down(e);
        th_fail(__FILE__, __LINE__, "env_up (UCX_TLS=%s, store --protocol %s)", tls,
                store_protocol);
        return -1;
    }
    return 0;
}

static void env_down(env *e)
{
    for (int i = 0; i < 2; i++)
        tp_store_kill(&e->st[i]);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
    unsetenv("KVPOOL_FORCE_UCX");
}

static kvp_client *client_open(const char *addr)
{
    return tp_client_open(addr, ", \"protocol\": \"ucx\", \"tenant\": \"t1\", "
                                "\"rpc_timeout\": 5000");
}

/* ------------------------------------------------------- round trips */

static const size_t sizes[] = {1, 7, 4096, 65537, 1 << 20, (2 << 20) + 3, 16 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define NSCAT 64 /* scattered values: 3 pieces each */

/* Puts then gets every size class (one batch) and NSCAT scattered values
 * (another), each value a pattern of its own; 1 when all came back exact. */
static int round_trips(kvp_client *c, const char *tag)
{
    int ok = 1;
    char names[NSIZES][64];
    const char *keys[NSIZES];
    uint8_t *bufs[NSIZES];
    kvp_iov iov[NSIZES];
    const kvp_iov *iovp[NSIZES];
    size_t niov[NSIZES];
    int64_t res[NSCAT];
    for (size_t i = 0; i < NSIZES; i++) {
        snprintf(names[i], sizeof names[i], "%s-size-%zu", tag, sizes[i]);
        keys[i] = names[i];
        bufs[i] = malloc(sizes[i]);
        tp_fill(bufs[i], sizes[i], 100 + i);
        iov[i] = (kvp_iov){bufs[i], sizes[i]};
        iovp[i] = &iov[i];
        niov[i] = 1;
    }
    int rc = kvp_client_batch_put_from_multi_buffers(c, keys, iovp, niov, NSIZES, res);
    for (size_t i = 0; i < NSIZES; i++) {
        if (rc || res[i] != (int64_t)sizes[i]) {
            fprintf(stderr, "    put %s: rc %d result %lld\n", keys[i], rc, (long long)res[i]);
            ok = 0;
        }
        memset(bufs[i], 0xEE, sizes[i]);
    }
    rc = kvp_client_batch_get_into_multi_buffers(c, keys, iovp, niov, NSIZES, res);
    for (size_t i = 0; i < NSIZES; i++) {
        uint8_t *want = malloc(sizes[i]);
        tp_fill(want, sizes[i], 100 + i);
        if (rc || res[i] != (int64_t)sizes[i] || memcmp(want, bufs[i], sizes[i]) != 0) {
            fprintf(stderr, "    get %s: rc %d result %lld\n", keys[i], rc, (long long)res[i]);
            ok = 0;
        }
        free(want);
        free(bufs[i]);
    }

    /* scattered: 3 pieces of odd sizes out of one buffer per value */
    static char sn[NSCAT][64];
    const char *sk[NSCAT];
    kvp_iov piece[NSCAT][3];
    const kvp_iov *sp[NSCAT];
    size_t sc[NSCAT];
    uint8_t *all = malloc(NSCAT * 70000);
    for (int i = 0; i < NSCAT; i++) {
        snprintf(sn[i], sizeof sn[i], "%s-scat-%d", tag, i);
        sk[i] = sn[i];
        uint8_t *b = all + (size_t)i * 70000;
        tp_fill(b, 70000, 1000 + (uint64_t)i);
        piece[i][0] = (kvp_iov){b, 13};
        piece[i][1] = (kvp_iov){b + 13, 40000};
        piece[i][2] = (kvp_iov){b + 40013, 29987};
        sp[i] = piece[i];
        sc[i] = 3;
    }
    rc = kvp_client_batch_put_from_multi_buffers(c, sk, sp, sc, NSCAT, res);
    for (int i = 0; i < NSCAT; i++)
        if (rc || res[i] != 70000)
            ok = 0;
    memset(all, 0, NSCAT * 70000);
    rc = kvp_client_batch_get_into_multi_buffers(c, sk, sp, sc, NSCAT, res);
    uint8_t *want = malloc(70000);
    for (int i = 0; i < NSCAT; i++) {
        tp_fill(want, 70000, 1000 + (uint64_t)i);
        if (rc || res[i] != 70000 || memcmp(want, all + (size_t)i * 70000, 70000) != 0) {
            fprintf(stderr, "    scattered %s: rc %d result %lld\n", sk[i], rc, (long long)res[i]);
            ok = 0;
        }
    }
    free(want);
    free(all);
    return ok;
}

/* Bytes this client moved over each path (puts + gets). */
static void path_bytes(kvp_client *c, uint64_t out[KVP_NPATHS])
{
    kvp_transfer_stats st;
    kvp_transfer_stats_init(&st);
    int rc = kvp_client_stats(c, &st);
    for (int p = 0; p < KVP_NPATHS; p++)
        out[p] = rc ? UINT64_MAX : st.path[p].put_bytes + st.path[p].get_bytes;
}

/* What round_trips moves: every size class and NSCAT x 70000, twice. */
static uint64_t round_trip_bytes(void)
{
    uint64_t b = 0;
    for (size_t i = 0; i < NSIZES; i++)
        b += sizes[i];
    return 2 * (b + NSCAT * 70000ull);
}

static void round_trip_test(const char *tls)
{
    env e;
    if (ucx_env(&e, tls, "ucx") != 0)
        return;
    kvp_client *c = client_open(e.m.addr);
    uint64_t moved[KVP_NPATHS] = {0};
    int ok = 0;
    if (c) {
        ok = round_trips(c, tls);
        path_bytes(c, moved);
        kvp_client_close(c);
    }
    env_down(&e);
    CHECK(c != NULL);
    CHECK(ok);
    /* every byte went through UCX */
    CHECK_EQ(moved[KVP_PATH_UCX], round_trip_bytes());
    CHECK_EQ(moved[KVP_PATH_SHM] + moved[KVP_PATH_TCP], 0);
}

TEST(every_size_class_over_ucx_tcp) { round_trip_test("tcp"); }

TEST(every_size_class_over_ucx_sm) { round_trip_test("sm"); }

/* -------------------------------------------------- a node killed */

#define KB_KEYS 8
#define KB_SIZE (1 << 20)

typedef struct killer_run {
    kvp_client *c;
    int rounds;       /* put batches made */
    int ok_keys;      /* keys whose put succeeded */
    int bad;          /* a result that is neither success nor an error code */
    int stop;         /* atomic */
    char ok_names[4096][32];
} killer_run;

static void *put_loop(void *arg)
{
    killer_run *k = arg;
    uint8_t *buf = malloc(KB_KEYS * (size_t)KB_SIZE);
    for (int r = 0; !__atomic_load_n(&k->stop, __ATOMIC_ACQUIRE) && r < 500; r++) {
        char names[KB_KEYS][32];
        const char *keys[KB_KEYS];
        kvp_iov iov[KB_KEYS];
        const kvp_iov *iovp[KB_KEYS];
        size_t niov[KB_KEYS];
        int64_t res[KB_KEYS];
        for (int i = 0; i < KB_KEYS; i++) {
            snprintf(names[i], sizeof names[i], "kill-%d-%d", r, i);
            keys[i] = names[i];
            iov[i] = (kvp_iov){buf + (size_t)i * KB_SIZE, KB_SIZE};
            tp_fill(iov[i].base, KB_SIZE, (uint64_t)(r * KB_KEYS + i));
            iovp[i] = &iov[i];
            niov[i] = 1;
        }
        int rc = kvp_client_batch_put_from_multi_buffers(k->c, keys, iovp, niov, KB_KEYS, res);
        for (int i = 0; i < KB_KEYS; i++) {
            if (!rc && res[i] == KB_SIZE && k->ok_keys < 4096)
                snprintf(k->ok_names[k->ok_keys++], 32, "%s", keys[i]);
            else if (!rc && res[i] >= 0)
                k->bad++;
        }
        __atomic_add_fetch(&k->rounds, 1, __ATOMIC_RELEASE);
    }
    free(buf);
    return NULL;
}

/* Every key put OK: an error now (its node died) or its exact bytes. */
static int no_wrong_bytes(kvp_client *c, killer_run *k)
{
    uint8_t *buf = malloc(KB_SIZE), *want = malloc(KB_SIZE);
    int wrong = 0, gone = 0, read = 0;
    for (int i = 0; i < k->ok_keys; i++) {
        int r, n;
        if (sscanf(k->ok_names[i], "kill-%d-%d", &r, &n) != 2)
            continue;
        int64_t got = kvp_client_get(c, k->ok_names[i], buf, KB_SIZE);
        if (got < 0) {
            gone++;
            continue;
        }
        tp_fill(want, KB_SIZE, (uint64_t)(r * KB_KEYS + n));
        read++;
        if (got != KB_SIZE || memcmp(buf, want, KB_SIZE) != 0)
            wrong++;
    }
    printf("  %d keys put before and after the kill: %d read back exact, %d gone, %d wrong\n",
           k->ok_keys, read, gone, wrong);
    free(buf);
    free(want);
    return wrong == 0;
}

static void node_kill_test(const char *tls)
{
    env e;
    if (ucx_env(&e, tls, "ucx") != 0)
        return;
    static killer_run k;
    memset(&k, 0, sizeof k);
    k.c = client_open(e.m.addr);
    if (!k.c) {
        env_down(&e);
        CHECK(!"client");
    }
    pthread_t th;
    pthread_create(&th, NULL, put_loop, &k);
    while (__atomic_load_n(&k.rounds, __ATOMIC_ACQUIRE) < 3)
        tp_sleep_ms(5);
    tp_store_kill(&e.st[0]); /* in the middle of a batch, most likely */
    tp_sleep_ms(300);
    __atomic_store_n(&k.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    CHECK_EQ(k.bad, 0);
    int exact = no_wrong_bytes(k.c, &k);

    /* a new node: a new attach, and transfers work again */
    int up = tp_store_start(&e.st[1], e.m.addr,
                            (const char *const[]){"--segment-size", "256MiB", "--protocol", "ucx",
                                                  NULL}) == 0;
    int again = up && round_trips(k.c, "after-kill");
    kvp_client_close(k.c);
    env_down(&e);
    CHECK(exact);
    CHECK(up);
    CHECK(again);
}

TEST(node_killed_mid_transfer_over_ucx_tcp) { node_kill_test("tcp"); }

TEST(node_killed_mid_transfer_over_ucx_sm) { node_kill_test("sm"); }

/* ---------------------------------------- a write through a stale grant */

typedef struct rawc {
    kvp_rpc *m;
    kvp_buf body;
    kvp_arena a;
    kvp_proto_limits lim;
    int32_t st;
    const uint8_t *resp;
    uint32_t rlen;
} rawc;

static int rawc_call(rawc *r, uint16_t op)
{
    int rc = kvp_rpc_call(r->m, op, r->body.data, r->body.len, &r->st, &r->resp, &r->rlen);
    kvp_buf_reset(&r->body);
    return rc || r->st ? -1 : 0;
}

/* The READ descriptor of tenant t1's key and its segment's description
 * (arena memory of r). */
static int victim_desc(rawc *r, const char *key, kvp_replica *rd, kvp_seg_desc *sd)
{
    kvp_bytes k = {(const uint8_t *)key, (uint32_t)strlen(key)};
    kvp_msg_keys g = {{(const uint8_t *)"t1", 2}, 1, &k};
    kvp_enc_keys(&r->body, &g);
    kvp_msg_get_resp d;
    if (rawc_call(r, KVP_OP_GET) || kvp_dec_get_resp(r->resp, r->rlen, &r->lim, &r->a, &d) ||
        d.n != 1 || d.results[0].status != 0)
        return -1;
    *rd = d.results[0].replicas[0];
    kvp_msg_ids ids = {1, &rd->segment_id};
    kvp_enc_ids(&r->body, &ids);
    kvp_msg_seg_info_resp si;
    if (rawc_call(r, KVP_OP_SEGMENT_INFO) ||
        kvp_dec_seg_info_resp(r->resp, r->rlen, &r->lim, &r->a, &si) || si.n != 1 ||
        si.infos[0].status != 0)
        return -1;
    *sd = si.infos[0].desc;
    return 0;
}

/* Writes `len` bytes of 0xA5 at the descriptor through a transfer client
 * of its own (force_ucx or force_tcp): the op's status. */
static int stale_write(const kvp_seg_desc *sd, const kvp_replica *rd, int ucx)
{
    kvp_xfer_opts o = {0};
    o.use_ucx = o.force_ucx = ucx;
    o.force_tcp = !ucx;
    kvp_xfer *x;
    REQUIRE(kvp_xfer_create(&o, &x) == 0);
    REQUIRE(kvp_xfer_add_segment(x, sd) == 0);
    if (strcmp(kvp_xfer_transport(x, sd->id), ucx ? "ucx" : "tcp") != 0) {
        kvp_xfer_destroy(x);
        return 1;
    }
    uint8_t *p = malloc(rd->length);
    memset(p, 0xA5, rd->length);
    struct iovec v = {p, rd->length};
    kvp_xfer_op op = {0};
    op.rep = *rd;
    op.iov = &v;
    op.iovcnt = 1;
    int rc = kvp_xfer_run(x, 1, &op, 1, kvp_now_ms() + 5000);
    kvp_xfer_destroy(x);
    free(p);
    return rc ? rc : op.status;
}

TEST(stale_descriptor_write_is_an_error_for_readers)
{
    env e;
    if (ucx_env(&e, "tcp", "ucx") != 0)
        return;
    kvp_client *c = client_open(e.m.addr);
    rawc r = {0};
    kvp_buf_init(&r.body, 1 << 20);
    kvp_arena_init(&r.a, 1 << 20);
    kvp_proto_limits_default(&r.lim);
    char err[256];
    kvp_rpc_opts ro = {.name = "stale", .timeout_ms = 5000};
    int opened = c && kvp_rpc_open(e.m.addr, &ro, &r.m, err, sizeof err) == 0;
    uint8_t *v = malloc(MiB), *got = malloc(MiB);
    tp_fill(v, MiB, 7);
    kvp_replica rd;
    kvp_seg_desc sd;
    int put = opened && kvp_client_put(c, "victim", v, MiB) == 0;
    int found = put && victim_desc(&r, "victim", &rd, &sd) == 0;
    /* over tcp the node checks the descriptor: a READ grant cannot write */
    int tcp_st = found ? stale_write(&sd, &rd, 0) : 0;
    /* one-sided: the rkey covers the segment, the write lands */
    int ucx_st = found ? stale_write(&sd, &rd, 1) : -1;
    /* ... and the reader's checksum refuses the bytes */
    memset(got, 0, MiB);
    int64_t n = found ? kvp_client_get(c, "victim", got, MiB) : 0;
    int leaked = memchr(got, 0xA5, MiB) != NULL && n == (int64_t)MiB;
    printf("  tcp write: %s; ucx write: %s; the reader's get: %lld (%s)\n", kvp_err_name(tcp_st),
           ucx_st ? kvp_err_name(ucx_st) : "landed", (long long)n,
           n < 0 ? kvp_err_name((int)n) : "bytes");
    if (r.m)
        kvp_rpc_close(r.m);
    kvp_buf_free(&r.body);
    kvp_arena_free(&r.a);
    free(v);
    free(got);
    if (c)
        kvp_client_close(c);
    env_down(&e);
    CHECK(opened);
    CHECK(put);
    CHECK(found);
    CHECK_EQ(tcp_st, KVP_EINVALID_WRITE);
    CHECK_EQ(ucx_st, 0);
    CHECK_EQ(n, KVP_ECHECKSUM_MISMATCH);
    CHECK(!leaked);
}

/* A client asking for ucx from a node that does not offer it: its other paths. */
TEST(node_without_ucx_still_serves)
{
    env e;
    if (ucx_env(&e, "tcp", "tcp") != 0)
        return;
    kvp_client *c = client_open(e.m.addr);
    int ok = c && round_trips(c, "no-ucx");
    uint64_t moved[KVP_NPATHS] = {0};
    if (c) {
        path_bytes(c, moved);
        kvp_client_close(c);
    }
    env_down(&e);
    CHECK(ok);
    CHECK_EQ(moved[KVP_PATH_UCX], 0);
    CHECK_EQ(moved[KVP_PATH_SHM], round_trip_bytes()); /* this host's node */
}

/* ------------------------------------------- tenants protected: no ucx */

/*
 * A ucx node's remote key reads every byte of its segment, every tenant's:
 * where 8c1f0e2 let a cluster-token holder attach over UCX and read other
 * tenants' values, a master with tenant_tokens_file now refuses the ucx
 * transport (kvpool serve: at start; a separate `kvpool store --protocol
 * ucx`: its mount, so the node does not start and never hands out the
 * rkey), each naming the key that would accept it; with ucx_insecure on
 * the master the node mounts.
 */
TEST(ucx_refused_while_tenants_are_protected)
{
    if (ucx_or_skip())
        return;
    char tpath[] = "/tmp/kvp-ucx-tenants-XXXXXX";
    CHECK_EQ(tq_write_secret(tpath, "alice tok-alice-0123456789\nbob tok-bob-0123456789\n"), 0);
    setenv("KVPOOL_NODE_TOKEN", "node-secret-0123456789", 1);
    setenv("UCX_TLS", "tcp", 1);
    static char out[16384];
    /* kvpool serve: its own node would offer ucx */
    const char *const serve[] = {tp_kvpool_bin(), "serve", "--listen", "127.0.0.1:0",
                                 "--segment-size", "64MiB", "--tenant-tokens-file", tpath,
                                 "--protocol", "ucx", NULL};
    int st = tp_run_capture(serve, 2, out, sizeof out, 15000);
    CHECK(st > 0 && st < 128);
    CHECK(strstr(out, "ucx_insecure") != NULL);
    /* a master protecting tenants and a separate ucx node */
    tp_master m;
    CHECK_EQ(tp_master_start(&m, (const char *const[]){"--tenant-tokens-file", tpath, NULL}), 0);
    const char *const store[] = {tp_kvpool_bin(), "store", "--master", m.addr,
                                 "--segment-size", "64MiB", "--listen", "127.0.0.1:0",
                                 "--protocol", "ucx", NULL};
    st = tp_run_capture(store, 2, out, sizeof out, 15000);
    CHECK(st > 0 && st < 128);
    CHECK(strstr(out, "ucx_insecure") != NULL);
    CHECK_EQ(tp_master_segments(m.addr), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
    /* the explicit opt-in */
    CHECK_EQ(tp_master_start(&m, (const char *const[]){"--tenant-tokens-file", tpath,
                                                       "--ucx-insecure", NULL}),
             0);
    tp_store s = {0};
    CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--protocol", "ucx", NULL}), 0);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
    unsetenv("KVPOOL_NODE_TOKEN");
    unlink(tpath);
}

/* ------------------------------------------- no credential: loopback */

/* Is socket inode `ino` one of pid's descriptors? */
static int pid_has_socket(pid_t pid, unsigned long ino)
{
    char dir[64], path[320], link[64], want[64];
    snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
    snprintf(want, sizeof want, "socket:[%lu]", ino);
    DIR *d = opendir(dir);
    int hit = 0;
    for (struct dirent *e; d && !hit && (e = readdir(d));) {
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n > 0) {
            link[n] = 0;
            hit = !strcmp(link, want);
        }
    }
    if (d)
        closedir(d);
    return hit;
}

/* pid's listening TCP sockets from /proc/PID/net/tcp and tcp6: *nloop
 * bound to loopback (127.0.0.0/8, ::1), *nother to anything else (the
 * first of them into other). */
static void listen_sockets(pid_t pid, int *nloop, int *nother, char *other, size_t olen)
{
    *nloop = *nother = 0;
    other[0] = 0;
    for (int v6 = 0; v6 < 2; v6++) {
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%d/net/tcp%s", (int)pid, v6 ? "6" : "");
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f)) {
            char local[64];
            unsigned st;
            unsigned long ino;
            if (sscanf(line, " %*d: %63s %*s %x %*s %*s %*s %*s %*s %lu", local, &st, &ino) != 3 ||
                st != 0x0A || !pid_has_socket(pid, ino))
                continue;
            int loop = v6 ? !strncmp(local, "00000000000000000000000001000000:", 33)
                          : !strncmp(local + 6, "7F:", 3); /* little-endian 127.x.x.x */
            if (loop) {
                (*nloop)++;
            } else if (!(*nother)++) {
                snprintf(other, olen, "%s", local);
            }
        }
        fclose(f);
    }
}

/*
 * The loopback-only rule (docs/SECURITY.md) covers UCX's own listeners: a
 * `--protocol ucx` node with no credential listened, through UCX's TCP
 * transport, on every interface's address (eth0's included), where any
 * host could reach the segment's rkey users. Now UCX is limited to the
 * listen address's device (lo), and transfers over it still work.
 */
TEST(ucx_listens_on_loopback_only_without_a_credential)
{
    env e;
    if (ucx_env(&e, "tcp", "ucx") != 0)
        return;
    int nloop = 0, nother = 0;
    char other[64];
    listen_sockets(e.st[0].pid, &nloop, &nother, other, sizeof other);
    printf("  node %d: %d loopback listeners, %d others (%s)\n", (int)e.st[0].pid, nloop, nother,
           other);
    kvp_client *c = client_open(e.m.addr);
    int ok = c && round_trips(c, "lo");
    uint64_t moved[KVP_NPATHS] = {0};
    if (c) {
        path_bytes(c, moved);
        kvp_client_close(c);
    }
    env_down(&e);
    CHECK(nloop >= 2); /* the segment server and UCX's tcp transport */
    CHECK_EQ(nother, 0);
    CHECK(ok);
    CHECK(moved[KVP_PATH_UCX] > 0);
}
