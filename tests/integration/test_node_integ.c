/* test_node_integ.c -- a real `kvpool store` against a real `kvpool master`:
 * mount with endpoints, remount after a master crash and restart on the same
 * port, unmount and clean exit on SIGTERM; --unix-dir checks and stale
 * sockets. */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "harness.h"
#include "kvpool.h"
#include "net/net.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

static int wait_segs(const char *addr, int want, unsigned ms, uint64_t *id)
{
    uint64_t end = tp_now_ms() + ms;
    while (tp_now_ms() < end) {
        if (tp_master_seg_list(addr, id, NULL, 0) == want)
            return 0;
        tp_sleep_ms(50);
    }
    return -1;
}

static int has_ep(const kvp_seg_desc *d, const char *transport, const char *needle)
{
    for (uint32_t i = 0; i < d->n_endpoints; i++) {
        const kvp_endpoint *e = &d->endpoints[i];
        if (e->transport.len == strlen(transport) &&
            !memcmp(e->transport.p, transport, e->transport.len) &&
            memmem(e->addr.p, e->addr.len, needle, strlen(needle)))
            return 1;
    }
    return 0;
}

static int check_info(const char *addr, uint64_t id)
{
    kvp_rpc *r;
    char err[256];
    kvp_rpc_opts o = {.name = "test", .timeout_ms = 2000};
    REQUIRE(kvp_rpc_open(addr, &o, &r, err, sizeof err) == 0);
    uint8_t body[16];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_ids ids = {1, &id};
    kvp_enc_ids(&b, &ids);
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int ok = kvp_rpc_call(r, KVP_OP_SEGMENT_INFO, body, b.len, &st, &resp, &rl) == 0 && st == 0;
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_seg_info_resp si;
    ok = ok && kvp_dec_seg_info_resp(resp, rl, &lim, &a, &si) == 0 && si.n == 1 &&
         si.infos[0].status == 0;
    ok = ok && si.infos[0].desc.capacity == 64ull << 20;
    ok = ok && has_ep(&si.infos[0].desc, "tcp", "127.0.0.1:");
    ok = ok && has_ep(&si.infos[0].desc, "shm", ":/");
    kvp_arena_free(&a);
    kvp_rpc_close(r);
    REQUIRE(ok);
    return 0;
}

TEST(store_mounts_remounts_and_unmounts)
{
    static const char *const mopts[] = {"--client-ttl", "3s", "--lease-ttl", "1s", NULL};
    tp_master m, s;
    CHECK_EQ(tp_master_start(&m, mopts), 0);
    const char *sargs[] = {"--master", m.addr, "--segment-size", "64MiB", "--listen",
                           "127.0.0.1:0", NULL};
    CHECK_EQ(tp_store_spawn(&s, sargs), 0);
    uint64_t id = 0;
    if (wait_segs(m.addr, 1, 10000, &id) != 0) {
        tp_master_kill(&s);
        tp_master_kill(&m);
        CHECK(!"store did not mount");
    }
    CHECK(id != 0);
    CHECK_EQ(check_info(m.addr, id), 0);

    /* crash the master, restart it on the same port: the node remounts */
    char listen[64];
    snprintf(listen, sizeof listen, "127.0.0.1:%u", m.port);
    tp_master_kill(&m);
    const char *ropts[] = {"--client-ttl", "3s", "--lease-ttl", "1s", "--listen", listen, NULL};
    CHECK_EQ(tp_master_start(&m, ropts), 0);
    CHECK_EQ(m.port, (long long)strtoul(strchr(listen, ':') + 1, NULL, 10));
    uint64_t t0 = tp_now_ms();
    uint64_t id2 = 0;
    int rc = wait_segs(m.addr, 1, 8000, &id2);
    printf("  remounted after %llu ms\n", (unsigned long long)(tp_now_ms() - t0));
    if (rc != 0) {
        tp_master_kill(&s);
        tp_master_kill(&m);
        CHECK(!"store did not remount");
    }
    CHECK(id2 == id);
    CHECK_EQ(check_info(m.addr, id), 0);
    CHECK(tp_master_alive(&s, NULL));

    /* SIGTERM: unmounted, clean exit */
    CHECK_EQ(tp_master_stop(&s), 0);
    CHECK_EQ(tp_master_seg_list(m.addr, NULL, NULL, 0), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}

TEST(store_help_and_bad_flags)
{
    char out[8192];
    const char *h[] = {tp_kvpool_bin(), "store", "--help", NULL};
    CHECK_EQ(tp_run_capture(h, 1, out, sizeof out, 5000), 0);
    CHECK(strstr(out, "--segment-size") != NULL);
    const char *b[] = {tp_kvpool_bin(), "store", "--segment-size", "lots", NULL};
    CHECK_EQ(tp_run_capture(b, 2, out, sizeof out, 5000), 2);
    CHECK(strstr(out, "segment") != NULL);
    /* no master reachable and not optional: fails fast */
    const char *n[] = {tp_kvpool_bin(), "store", "--master", "127.0.0.1:1", "--segment-size",
                       "4MiB", "--rpc-timeout", "500ms", NULL};
    CHECK_EQ(tp_run_capture(n, 2, out, sizeof out, 10000), 1);
}

/* --unix-dir: a path too long for a unix socket and a shared directory
 * (/tmp) are refused with the reason; the socket of a node killed with -9
 * is removed by the next node starting in the same directory. */
TEST(store_unix_dir)
{
    char out[8192];
    char dir[200];
    int n = snprintf(dir, sizeof dir, "/tmp/kvp-integ-long-%d-", (int)getpid());
    while (n < 100)
        dir[n++] = 'd';
    dir[n] = 0;
    const char *l[] = {tp_kvpool_bin(), "store", "--master-optional", "--master", "127.0.0.1:1",
                       "--segment-size", "4MiB", "--unix-dir", dir, NULL};
    CHECK_EQ(tp_run_capture(l, 2, out, sizeof out, 10000), 1);
    CHECK(strstr(out, "107 bytes") && strstr(out, "sun_path"));
    CHECK(access(dir, F_OK) != 0); /* refused before anything was created */
    const char *t[] = {tp_kvpool_bin(), "store", "--master-optional", "--master", "127.0.0.1:1",
                       "--segment-size", "4MiB", "--unix-dir", "/tmp", NULL};
    CHECK_EQ(tp_run_capture(t, 2, out, sizeof out, 10000), 1);
    CHECK(strstr(out, "writable by other users") != NULL);

    char sd[] = "/tmp/kvp-integ-sd-XXXXXX";
    CHECK(mkdtemp(sd) != NULL);
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    tp_store a, b;
    const char *extra[] = {"--unix-dir", sd, NULL};
    CHECK_EQ(tp_store_start(&a, m.addr, extra), 0);
    CHECK_EQ(tp_node_socks(sd), 1);
    tp_store_kill(&a);
    CHECK_EQ(tp_node_socks(sd), 1); /* left behind by kill -9 */
    CHECK_EQ(tp_store_start(&b, m.addr, extra), 0);
    CHECK_EQ(tp_node_socks(sd), 1); /* the dead one's removed, b's own */
    CHECK_EQ(tp_store_stop(&b), 0);
    CHECK_EQ(tp_node_socks(sd), 0); /* removed on a clean stop */
    CHECK_EQ(tp_master_stop(&m), 0);
    rmdir(sd);
}

/* Is fd closed by the peer within ms? (a read of 0 bytes, or an error) */
static int closed_within(int fd, unsigned ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, (int)ms) <= 0)
        return 0;
    char b[256];
    ssize_t n;
    while ((n = recv(fd, b, sizeof b, MSG_DONTWAIT)) > 0)
        ;
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* The storage node's connection limits come from the configuration:
 * --hello-timeout and --idle-timeout close silent and idle connections. */
TEST(store_connection_timeouts_from_config)
{
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    if (m.pid <= 0)
        return;
    char listen[64];
    CHECK_EQ(tp_free_addr(listen, sizeof listen), 0);
    tp_store s;
    CHECK_EQ(tp_store_start(&s, m.addr, (const char *const[]){"--segment-size", "8MiB", "--listen",
                                                               listen, "--hello-timeout", "300ms",
                                                               "--idle-timeout", "400ms", NULL}),
             0);
    char eh[256];
    int silent = kvp_net_connect(listen, 2000, eh, sizeof eh);
    CHECK(silent >= 0);
    uint64_t t0 = tp_now_ms();
    CHECK(closed_within(silent, 3000));
    uint64_t t_silent = tp_now_ms() - t0;
    close(silent);
    kvp_rpc *r;
    char err[256];
    kvp_rpc_opts o = {.name = "idle", .timeout_ms = 2000};
    CHECK_EQ(kvp_rpc_open(listen, &o, &r, err, sizeof err), 0); /* HELLO: now only idle */
    t0 = tp_now_ms();
    CHECK(closed_within(kvp_rpc_fd(r), 3000));
    uint64_t t_idle = tp_now_ms() - t0;
    kvp_rpc_close(r);
    printf("  silent closed after %llu ms, idle after %llu ms\n", (unsigned long long)t_silent,
           (unsigned long long)t_idle);
    CHECK(t_silent >= 250 && t_silent < 1500);
    CHECK(t_idle >= 350 && t_idle < 1500);
    tp_store_kill(&s);
    CHECK_EQ(tp_master_stop(&m), 0);
}
