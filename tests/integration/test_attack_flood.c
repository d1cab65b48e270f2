/*
 * test_attack_flood.c -- connection floods before HELLO and wrong-token
 * guessing against a real `kvpool master` (hardening issue, items 3 and 4).
 *
 * The attacks, as they were run against 0a85b26:
 *  - thousands of idle connections that never say HELLO, held, from one
 *    address or from ~80 addresses in 127.10.x.y (the whole of 127/8 is
 *    loopback on Linux: the flood binds its sockets there);
 *  - a few hundred connections reopened as soon as the master closes them;
 *  - a wrong-token HELLO from 127.0.0.1 every 0.2 s.
 * There, every new client from the flooded address (or, over the global
 * pre-HELLO cap, from any address) was refused while the flood lasted or
 * until the idle ones reached hello_timeout, and a correct token from the
 * guessing address was refused ("wrong cluster token") all along.
 *
 * What must hold: during each attack, a fresh client that says HELLO at once
 * -- kvp_rpc_open + STATS from 127.0.0.1 and from 127.200.0.1, and the
 * `kvpool stat` command -- is served within its timeout, every check. The
 * master runs with hello_timeout 20 s, so on 0a85b26 the held floods lock
 * new clients out for the whole check window, not only for the default 5 s.
 *
 * Checks from another source address go through the product's client: the
 * test's kvp_sys.connect binds the socket to a per-thread address first.
 * The last tests: the client's HELLO retry on its own, and the same floods at
 * a storage node's TCP port (which already evicted on 0a85b26: a guard).
 */
#include <errno.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/sys.h"
#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

#define CHECK_MS 3000      /* each check's whole timeout (connect, HELLO, STATS) */
#define ROUND_MS 400       /* pause between rounds of checks */
#define MASTER_NOFILE 16384

/* ------------------------------------------------- source address binding */

static __thread const char *tls_src; /* bind kvp_sys.connect's sockets here, NULL = no */
static int (*real_connect)(int, const struct sockaddr *, socklen_t);

static int bind_src(int fd, const char *src)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, src, &a.sin_addr) != 1)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    return bind(fd, (struct sockaddr *)&a, sizeof a);
}

static int bound_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    if (tls_src && bind_src(fd, tls_src) != 0)
        return -1;
    return real_connect(fd, sa, len);
}

static void use_bound_connect(void)
{
    if (!real_connect) {
        real_connect = kvp_sys.connect;
        kvp_sys.connect = bound_connect;
    }
}

static int raise_nofile(rlim_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -1;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want)
        return -1;
    rl.rlim_cur = want;
    return setrlimit(RLIMIT_NOFILE, &rl);
}

/* ---------------------------------------------------------------- flood */

typedef struct flood {
    uint16_t port;
    int n;             /* connections */
    int naddr;         /* 0: from 127.0.0.1; else round-robin over 127.10.x.y */
    int reopen;        /* reopen each one the master closes */
    int rate;          /* most connects per second */
    int stop, opened_all; /* atomic */
    uint64_t connects, closed_by_master;
    int *fds;
    pthread_t th;
} flood;

static void flood_addr(int i, char *out, size_t outlen)
{
    snprintf(out, outlen, "127.10.%d.%d", i / 200, i % 200 + 1);
}

/* Paces connects: at most f->rate per second, in 10 ms slices. */
static void pace(flood *f, uint64_t *slice_start, int *in_slice)
{
    int per = f->rate / 100 > 0 ? f->rate / 100 : 1;
    if (++*in_slice < per)
        return;
    uint64_t now = tp_now_ms();
    if (now - *slice_start < 10)
        tp_sleep_ms((unsigned)(10 - (now - *slice_start)));
    *slice_start = tp_now_ms();
    *in_slice = 0;
}

/* A non-blocking connect that never says anything. -1 when no socket. */
static int flood_connect(flood *f, int i)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (f->naddr) {
        char a[32];
        flood_addr(i % f->naddr, a, sizeof a);
        if (bind_src(fd, a) != 0) {
            close(fd);
            return -1;
        }
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(f->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    __atomic_add_fetch(&f->connects, 1, __ATOMIC_RELAXED);
    return fd;
}

static void *flood_main(void *arg)
{
    flood *f = arg;
    uint64_t slice = tp_now_ms();
    int in_slice = 0;
    for (int i = 0; i < f->n && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE); i++) {
        f->fds[i] = flood_connect(f, i);
        pace(f, &slice, &in_slice);
    }
    __atomic_store_n(&f->opened_all, 1, __ATOMIC_RELEASE);
    struct pollfd *p = calloc((size_t)f->n, sizeof *p);
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        if (!f->reopen || !p) {
            tp_sleep_ms(20);
            continue;
        }
        for (int i = 0; i < f->n; i++)
            p[i] = (struct pollfd){f->fds[i], POLLIN, 0};
        if (poll(p, (nfds_t)f->n, 20) <= 0)
            continue;
        for (int i = 0; i < f->n && !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE); i++) {
            if (f->fds[i] >= 0 && !p[i].revents)
                continue;
            if (f->fds[i] >= 0) {
                char b;
                ssize_t r = recv(f->fds[i], &b, 1, MSG_DONTWAIT);
                if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    continue;
                close(f->fds[i]); /* closed (or answered and closed) by the master */
                __atomic_add_fetch(&f->closed_by_master, 1, __ATOMIC_RELAXED);
            }
            f->fds[i] = flood_connect(f, i); /* at once */
            pace(f, &slice, &in_slice);
        }
    }
    free(p);
    return NULL;
}

static int flood_start(flood *f, uint16_t port, int n, int naddr, int reopen)
{
    *f = (flood){.port = port, .n = n, .naddr = naddr, .reopen = reopen, .rate = 20000};
    if (reopen)
        f->rate = 4000; /* bounded churn: ephemeral ports and the 2-core test machine */
    f->fds = malloc((size_t)n * sizeof *f->fds);
    if (!f->fds)
        return -1;
    for (int i = 0; i < n; i++)
        f->fds[i] = -1;
    if (pthread_create(&f->th, NULL, flood_main, f) != 0) {
        free(f->fds);
        return -1;
    }
    uint64_t t0 = tp_now_ms();
    int all = 0;
    while (!(all = __atomic_load_n(&f->opened_all, __ATOMIC_ACQUIRE)) && tp_now_ms() - t0 < 20000)
        tp_sleep_ms(10);
    tp_sleep_ms(300); /* the master's accept queue drains */
    return all ? 0 : -1;
}

static void flood_stop(flood *f)
{
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->th, NULL);
    for (int i = 0; i < f->n; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    free(f->fds);
}

/* --------------------------------------------------------------- checks */

/* A fresh client from src (NULL: the default, 127.0.0.1): kvp_rpc_open
 * (connect + HELLO, retried as the client does) and one STATS, all within
 * CHECK_MS. 0 or the error, with a message in why. */
static int check_stats(const char *addr, const char *src, const char *token, char *why, size_t wl)
{
    kvp_rpc_opts o = {.token = token, .name = "flood-check", .timeout_ms = CHECK_MS};
    kvp_rpc *r = NULL;
    tls_src = src;
    int rc = kvp_rpc_open(addr, &o, &r, why, wl);
    tls_src = NULL;
    if (rc)
        return rc;
    int32_t st = 0;
    rc = kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, NULL, NULL);
    kvp_rpc_close(r);
    if (rc == 0)
        rc = st;
    if (rc)
        snprintf(why, wl, "STATS: %s", kvp_strerror(rc));
    return rc;
}

/* `kvpool stat --master addr` with rpc_timeout CHECK_MS: its exit status
 * (0 = answered), output in out. */
static int check_cli(const char *addr, char *out, size_t outlen)
{
    const char *argv[] = {tp_kvpool_bin(), "stat", "--master", addr, "--rpc-timeout", "3s", NULL};
    return tp_run_capture(argv, 3, out, outlen, CHECK_MS + 5000);
}

typedef struct tally {
    int checks, failed;
    uint64_t slowest_ms; /* the slowest check through the client library */
    char first[512];
} tally;

static void note(tally *t, const char *who, int rc, const char *why)
{
    t->checks++;
    if (rc == 0)
        return;
    if (!t->failed++)
        snprintf(t->first, sizeof t->first, "%s: %d %.400s", who, rc, why);
}

/* Rounds of checks for ms: from 127.0.0.1 and 127.200.0.1 through the
 * client, and every other round `kvpool stat`. */
static void check_rounds(const char *addr, const char *token, unsigned ms, tally *t)
{
    uint64_t t0 = tp_now_ms();
    for (int round = 0; tp_now_ms() - t0 < ms; round++) {
        char why[512] = "";
        uint64_t c0 = tp_now_ms();
        int rc = check_stats(addr, NULL, token, why, sizeof why);
        note(t, "127.0.0.1", rc, why);
        uint64_t c1 = tp_now_ms();
        why[0] = 0;
        rc = check_stats(addr, "127.200.0.1", token, why, sizeof why);
        note(t, "127.200.0.1", rc, why);
        uint64_t c2 = tp_now_ms();
        if (c1 - c0 > t->slowest_ms)
            t->slowest_ms = c1 - c0;
        if (c2 - c1 > t->slowest_ms)
            t->slowest_ms = c2 - c1;
        if (round % 2 == 0) {
            char out[2048] = "";
            rc = check_cli(addr, out, sizeof out);
            note(t, "kvpool stat", rc, out);
        }
        tp_sleep_ms(ROUND_MS);
    }
}

static int start_master(tp_master *m)
{
    tp_master_opts mo = {.nofile = MASTER_NOFILE, .stderr_path = NULL};
    return tp_master_start_opts(m, (const char *[]){"--hello-timeout", "20s", NULL}, &mo);
}

/* One flood scenario: n connections from naddr addresses (0: 127.0.0.1),
 * held or reopened, while checks run for ms. */
static void flood_scenario(int n, int naddr, int reopen, unsigned ms)
{
    use_bound_connect();
    if (raise_nofile((rlim_t)n + 1024) != 0)
        SKIP("cannot raise RLIMIT_NOFILE");
    tp_master m;
    CHECK_EQ(start_master(&m), 0);
    char why[512] = "";
    CHECK_EQ(check_stats(m.addr, NULL, NULL, why, sizeof why), 0); /* before: served */
    /* a client that completed HELLO before the flood: never evicted by it */
    kvp_rpc_opts ko = {.name = "kept", .timeout_ms = CHECK_MS};
    kvp_rpc *kept = NULL;
    CHECK_EQ(kvp_rpc_open(m.addr, &ko, &kept, why, sizeof why), 0);
    flood f;
    CHECK_EQ(flood_start(&f, m.port, n, naddr, reopen), 0);
    tally t = {0};
    check_rounds(m.addr, NULL, ms, &t);
    uint64_t connects = __atomic_load_n(&f.connects, __ATOMIC_RELAXED);
    uint64_t closed = __atomic_load_n(&f.closed_by_master, __ATOMIC_RELAXED);
    flood_stop(&f);
    printf("  %d connections from %d address(es)%s: %llu connects, %llu closed by the master; "
           "%d of %d checks failed (slowest %llu ms)%s%s\n",
           n, naddr ? naddr : 1, reopen ? ", reopened" : ", held", (unsigned long long)connects,
           (unsigned long long)closed, t.failed, t.checks, (unsigned long long)t.slowest_ms,
           t.failed ? "; first: " : "", t.first);
    CHECK_EQ(t.failed, 0);
    CHECK(connects >= (uint64_t)n);
    CHECK(t.checks >= 6);
    int32_t st = 1;
    int krc = kvp_rpc_call(kept, KVP_OP_STATS, NULL, 0, &st, NULL, NULL);
    kvp_rpc_close(kept);
    CHECK(krc == 0 && st == 0);
    why[0] = 0;
    CHECK_EQ(check_stats(m.addr, NULL, NULL, why, sizeof why), 0); /* after: still served */
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* 5000 idle connections from 127.0.0.1, held (on 0a85b26: every new client
 * from 127.0.0.1 refused until they reach hello_timeout). */
TEST(flood_held_from_one_address)
{
    flood_scenario(5000, 0, 0, 5000);
}

/* 200 connections from 127.0.0.1, each reopened as soon as the master
 * closes it (on 0a85b26: refused for the whole flood). */
TEST(flood_reopened_from_one_address)
{
    flood_scenario(200, 0, 1, 6000);
}

/* 5000 idle connections from 79 addresses, held: over the global pre-HELLO
 * cap (on 0a85b26: every address refused, 127.0.0.1 and 127.200.0.1 too). */
TEST(flood_held_from_many_addresses)
{
    flood_scenario(5000, 79, 0, 5000);
}

/* The same, every connection reopened as soon as the master closes it. */
TEST(flood_reopened_from_many_addresses)
{
    flood_scenario(5000, 79, 1, 6000);
}

/* ------------------------------------------------------------ guessing */

typedef struct guesser {
    const char *addr;
    int stop; /* atomic; the rest is read after the join */
    int n, eauth, backoff, other;
    uint64_t slowest_backoff_ms;
    char backoff_msg[512], other_msg[600];
    pthread_t th;
} guesser;

/* A wrong-token HELLO from 127.0.0.1 every 0.2 s (after each answer): a
 * hostile client's, which says HELLO although the master did not prove the
 * token (hello_raw.h), so the master's refusal is what it gets. */
static void *guess_main(void *arg)
{
    guesser *g = arg;
    while (!__atomic_load_n(&g->stop, __ATOMIC_ACQUIRE)) {
        char err[512] = "";
        kvp_rpc_opts o = {.name = "guesser", .timeout_ms = 5000, .no_hello = 1};
        kvp_rpc *r = NULL;
        uint64_t t0 = tp_now_ms();
        int rc = kvp_rpc_open(g->addr, &o, &r, err, sizeof err);
        kvp_auth_creds c = hr_creds("wrong-token", NULL, NULL, NULL);
        const uint8_t *resp = NULL;
        uint32_t rl = 0;
        if (rc == 0)
            rc = hr_rpc_hello(r, &c, "guesser", NULL, &resp, &rl);
        kvp_msg_hello_backoff bo;
        if (rc == KVP_EAUTH_BACKOFF && kvp_dec_hello_backoff(resp, rl, &bo) == 0)
            snprintf(err, sizeof err, "wrong credential, and too many failed attempts from "
                     "%.*s; retry in %u ms", (int)bo.addr.len, (const char *)bo.addr.p,
                     bo.retry_ms);
        uint64_t took = tp_now_ms() - t0;
        g->n++;
        if (rc == KVP_EAUTH) {
            g->eauth++;
        } else if (rc == KVP_EAUTH_BACKOFF) {
            g->backoff++;
            if (took > g->slowest_backoff_ms)
                g->slowest_backoff_ms = took;
            snprintf(g->backoff_msg, sizeof g->backoff_msg, "%s", err);
        } else {
            g->other++;
            snprintf(g->other_msg, sizeof g->other_msg, "%d %s", rc, err);
        }
        kvp_rpc_close(r);
        tp_sleep_ms(200);
    }
    return NULL;
}

/* With a cluster token, a wrong-token HELLO from 127.0.0.1 every 0.2 s
 * must not make the right token fail from the same address (on 0a85b26:
 * "authentication failed: wrong cluster token" for all of it); the
 * guesser's failures past the first few are answered late and say why. */
TEST(wrong_tokens_do_not_lock_out_the_right_token)
{
    use_bound_connect();
    const char *right = "right-token-for-the-flood-test";
    setenv("KVPOOL_CLUSTER_TOKEN", right, 1); /* the master's, and `kvpool stat`'s */
    tp_master m;
    CHECK_EQ(start_master(&m), 0);
    guesser g = {.addr = m.addr};
    CHECK_EQ(pthread_create(&g.th, NULL, guess_main, &g), 0);
    tp_sleep_ms(1500); /* past the free failures: backing off */
    tally t = {0};
    check_rounds(m.addr, right, 6000, &t);
    __atomic_store_n(&g.stop, 1, __ATOMIC_RELEASE);
    pthread_join(g.th, NULL);
    printf("  %d wrong guesses: %d wrong-token answers, %d back-off answers (slowest %llu ms), "
           "%d other; %d of %d right-token checks failed%s%s\n",
           g.n, g.eauth, g.backoff, (unsigned long long)g.slowest_backoff_ms, g.other, t.failed,
           t.checks, t.failed ? "; first: " : "", t.first);
    if (g.backoff)
        printf("  last back-off answer: %s\n", g.backoff_msg);
    CHECK_EQ(t.failed, 0);
    CHECK(t.checks >= 6);
    CHECK_EQ(g.other, 0);
    CHECK(g.eauth >= 1 && g.eauth <= 3);  /* the free failures: answered at once */
    CHECK(g.backoff >= 2);               /* then: answered late, and saying why */
    CHECK(strstr(g.backoff_msg, "too many failed attempts from 127.0.0.1; retry in ") != NULL);
    CHECK(strstr(g.backoff_msg, " ms") != NULL);
    CHECK(g.slowest_backoff_ms >= 500);  /* the answer was held */
    /* a wrong token from another address is still answered at once */
    char why[512] = "";
    tls_src = "127.200.0.1";
    kvp_rpc_opts o = {.token = "wrong-token", .name = "other", .timeout_ms = CHECK_MS};
    kvp_rpc *r = NULL;
    CHECK_EQ(kvp_rpc_open(m.addr, &o, &r, why, sizeof why), KVP_EAUTH);
    tls_src = NULL;
    CHECK(strstr(why, "did not prove it holds our cluster token") != NULL);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* A HELLO the master closes before answering (over its limits) is retried
 * by the client within its timeout; one the master answers with a wrong
 * credential is not. */
TEST(client_does_not_retry_a_wrong_credential)
{
    setenv("KVPOOL_CLUSTER_TOKEN", "right", 1);
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    char why[512];
    kvp_rpc_opts o = {.token = "wrong", .name = "once", .timeout_ms = 5000};
    kvp_rpc *r = NULL;
    uint64_t t0 = tp_now_ms();
    CHECK_EQ(kvp_rpc_open(m.addr, &o, &r, why, sizeof why), KVP_EAUTH);
    CHECK(tp_now_ms() - t0 < 4000); /* answered, not retried until the deadline */
    CHECK(strstr(why, "did not prove it holds our cluster token") != NULL);
    CHECK_EQ(tp_master_stop(&m), 0);
}

typedef struct later_close {
    kvp_rpc *r;
    unsigned after_ms;
    pthread_t th;
} later_close;

static void *later_close_main(void *arg)
{
    later_close *l = arg;
    tp_sleep_ms(l->after_ms);
    kvp_rpc_close(l->r);
    return NULL;
}

/* A master full of connections that completed HELLO closes a new one at
 * once (nothing to evict); the client tries again, with back-off, and gets
 * in when a slot frees, within its timeout. */
TEST(client_retries_a_hello_the_master_closed)
{
    tp_master m;
    CHECK_EQ(tp_master_start(&m, (const char *[]){"--max-connections", "4", NULL}), 0);
    kvp_rpc *full[4] = {0};
    char why[512] = "";
    kvp_rpc_opts o = {.name = "full", .timeout_ms = CHECK_MS};
    for (int i = 0; i < 4; i++)
        CHECK_EQ(kvp_rpc_open(m.addr, &o, &full[i], why, sizeof why), 0);
    later_close l = {full[0], 700, 0};
    CHECK_EQ(pthread_create(&l.th, NULL, later_close_main, &l), 0);
    kvp_rpc *r = NULL;
    kvp_rpc_opts o2 = {.name = "patient", .timeout_ms = 5000};
    uint64_t t0 = tp_now_ms();
    int rc = kvp_rpc_open(m.addr, &o2, &r, why, sizeof why);
    uint64_t took = tp_now_ms() - t0;
    pthread_join(l.th, NULL);
    printf("  in after %llu ms (a slot freed after 700 ms): %s\n", (unsigned long long)took,
           rc ? why : "ok");
    CHECK_EQ(rc, 0);
    CHECK(took >= 600); /* it was kept out, then retried */
    int32_t st = 1;
    CHECK(kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, NULL, NULL) == 0 && st == 0);
    kvp_rpc_close(r);
    for (int i = 1; i < 4; i++)
        kvp_rpc_close(full[i]);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* ---------------------------------------------------------- storage node */

static int port_of(const char *addr)
{
    const char *p = strrchr(addr, ':');
    return p ? atoi(p + 1) : 0;
}

/* A fresh client (its own master connection, HELLO at the node over TCP)
 * reads `key` and gets `want`. 0 or the error. */
static int fresh_get(const char *maddr, const char *key, const uint8_t *want, size_t len,
                     char *why, size_t wl)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"3s\"}", maddr);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, why, wl);
    if (rc)
        return rc;
    uint8_t *got = malloc(len);
    int64_t n = got ? kvp_client_get(c, key, got, len) : KVP_ENOMEM;
    rc = n >= 0 && (size_t)n == len && memcmp(got, want, (size_t)n) == 0 ? 0 : n < 0 ? (int)n : -1;
    if (rc)
        snprintf(why, wl, "get: %lld", (long long)n);
    free(got);
    kvp_client_close(c);
    return rc;
}

/* The storage node's segment server already closes its oldest connection
 * without HELLO for a new one (a quarter of node_max_connections per
 * worker) and has no per-address cap: the same floods at its TCP port must
 * not keep a fresh client's reads out either. */
TEST(flood_at_a_storage_node)
{
    use_bound_connect();
    if (raise_nofile(8192) != 0)
        SKIP("cannot raise RLIMIT_NOFILE");
    setenv("KVPOOL_FORCE_TCP", "1", 1); /* the data plane over the node's TCP port */
    tp_master m;
    CHECK_EQ(start_master(&m), 0);
    char naddr[64];
    CHECK_EQ(tp_free_addr(naddr, sizeof naddr), 0);
    tp_store st;
    CHECK_EQ(tp_store_start(&st, m.addr, (const char *[]){"--listen", naddr, NULL}), 0);
    enum { LEN = 256 << 10 };
    static uint8_t val[LEN];
    tp_fill(val, LEN, 77);
    char why[512] = "";
    {
        char cfg[512];
        snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}", m.addr);
        kvp_client *w = NULL;
        CHECK_EQ(kvp_client_open(cfg, &w, why, sizeof why), 0);
        CHECK_EQ(kvp_client_put(w, "flooded-node-key", val, LEN), 0);
        kvp_client_close(w);
    }
    CHECK_EQ(fresh_get(m.addr, "flooded-node-key", val, LEN, why, sizeof why), 0);
    const struct { int n, naddr, reopen; } sc[] = {{5000, 79, 0}, {2000, 0, 1}};
    for (size_t k = 0; k < sizeof sc / sizeof sc[0]; k++) {
        flood f;
        CHECK_EQ(flood_start(&f, (uint16_t)port_of(naddr), sc[k].n, sc[k].naddr, sc[k].reopen), 0);
        int checks = 0, failed = 0;
        char first[512] = "";
        uint64_t t0 = tp_now_ms();
        while (tp_now_ms() - t0 < 3000) {
            why[0] = 0;
            int rc = fresh_get(m.addr, "flooded-node-key", val, LEN, why, sizeof why);
            checks++;
            if (rc && !failed++)
                snprintf(first, sizeof first, "%d %.400s", rc, why);
            tp_sleep_ms(ROUND_MS);
        }
        uint64_t connects = __atomic_load_n(&f.connects, __ATOMIC_RELAXED);
        flood_stop(&f);
        printf("  node: %d connections from %d address(es)%s: %llu connects; %d of %d reads "
               "failed%s%s\n", sc[k].n, sc[k].naddr ? sc[k].naddr : 1,
               sc[k].reopen ? ", reopened" : ", held", (unsigned long long)connects, failed, checks,
               failed ? "; first: " : "", first);
        CHECK_EQ(failed, 0);
        CHECK(checks >= 4);
    }
    CHECK_EQ(tp_store_stop(&st), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
}
