/*
 * test_sys_faults.c -- network fault injection (common/sys.h): a scenario
 * is run once to count its system calls N, then again for every n in 1..N
 * with the nth call failing (EINTR, EAGAIN, ECONNRESET, a 1-byte short
 * transfer; and every call short from n on), as test_master.c loops over
 * allocation failures.
 *
 * Each run must: not crash or leak (ASan/LSan), answer every call with
 * success or a known error code, never return wrong bytes or a wrong
 * answer (every get is compared, exist/remove answers checked against what
 * succeeded), and, injection off, serve again.
 *
 *  - client_*: the client library in this process (injected) against a real
 *    `kvpool master` and `kvpool store` (not injected): put/get/exist/
 *    remove over shm and over TCP, on one long-lived client and on fresh
 *    ones (open, shm attach, data-plane connect).
 *  - master_server: the master service in this process (kvp_mserver in a
 *    thread, injected) serving a forked embedded-mode client (its own
 *    process, so not injected) that puts, gets, tests and removes keys.
 *  - node_server: a storage node in this process (segment server and
 *    master link, injected) against a real `kvpool master`, serving a
 *    forked client over TCP (strided: ~12 points per fault kind).
 *  - lookup_*: the connector's lookup channel, the client injected against
 *    a server in a child, and the server injected serving a child client.
 *
 * The injection counter is per process, so the side not under test lives
 * in another one.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/config.h"
#include "common/mem.h"
#include "common/sys.h"
#include "connector/lookup.h"
#include "harness.h"
#include "kvpool.h"
#include "master/service.h"
#include "node/node.h"
#include "proc.h"

static const int kinds[] = {EINTR, EAGAIN, ECONNRESET, KVP_SYS_SHORT};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static const char *kind_name(int k)
{
    return k == EINTR ? "EINTR" : k == EAGAIN ? "EAGAIN" : k == ECONNRESET ? "ECONNRESET" : "short";
}

/* A negative code from the error table (not a stray errno or garbage). */
static int known_err(int64_t rc)
{
    return rc < 0 && rc >= INT32_MIN && strcmp(kvp_err_name((int)rc), "UNKNOWN") != 0;
}

/* Deterministic bytes for (seed, len). */
static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

#define NKEYS 3
static const size_t key_len[NKEYS] = {1, 4096, 200000};
#define MAXV 200000

/*
 * The scenario: put NKEYS keys (tag makes them fresh), get each, exist
 * them with one missing key, remove the first and get it again. Every
 * answer is success or a known error, and consistent with what succeeded.
 * ok_put[i] says which puts succeeded. 0, or -1 with a message on a wrong
 * answer.
 */
static int scenario(kvp_client *c, unsigned tag, int ok_put[NKEYS])
{
    static uint8_t v[MAXV], got[MAXV];
    char keys[NKEYS + 1][48];
    for (int i = 0; i <= NKEYS; i++)
        snprintf(keys[i], sizeof keys[i], "sf-%u-%d", tag, i);
    for (int i = 0; i < NKEYS; i++) {
        fill(v, key_len[i], tag * 16u + (unsigned)i);
        int rc = kvp_client_put(c, keys[i], v, key_len[i]);
        if (rc != 0 && !known_err(rc)) {
            fprintf(stderr, "    put %s: %d\n", keys[i], rc);
            return -1;
        }
        ok_put[i] = rc == 0;
    }
    for (int i = 0; i < NKEYS; i++) {
        int64_t n = kvp_client_get(c, keys[i], got, sizeof got);
        if (n < 0) {
            if (!known_err(n)) {
                fprintf(stderr, "    get %s: %lld\n", keys[i], (long long)n);
                return -1;
            }
            continue;
        }
        fill(v, key_len[i], tag * 16u + (unsigned)i);
        if ((size_t)n != key_len[i] || memcmp(v, got, key_len[i]) != 0) {
            fprintf(stderr, "    get %s: %lld bytes, wrong (want %zu)\n", keys[i], (long long)n,
                    key_len[i]);
            return -1;
        }
    }
    const char *ks[NKEYS + 1];
    int res[NKEYS + 1];
    for (int i = 0; i <= NKEYS; i++)
        ks[i] = keys[i];
    int rc = kvp_client_exist(c, ks, NKEYS + 1, res);
    if (rc == 0) {
        for (int i = 0; i <= NKEYS; i++) {
            int r = res[i];
            if (r != 0 && r != 1 && !known_err(r)) {
                fprintf(stderr, "    exist %s: %d\n", keys[i], r);
                return -1;
            }
            if ((i == NKEYS && r == 1) || (i < NKEYS && ok_put[i] && r == 0)) {
                fprintf(stderr, "    exist %s: %d, wrong (put ok %d)\n", keys[i], r,
                        i < NKEYS ? ok_put[i] : 0);
                return -1;
            }
        }
    } else if (!known_err(rc)) {
        fprintf(stderr, "    exist: %d\n", rc);
        return -1;
    }
    rc = kvp_client_remove(c, keys[0], 0);
    if (rc != 0 && !known_err(rc)) {
        fprintf(stderr, "    remove: %d\n", rc);
        return -1;
    }
    int64_t n = kvp_client_get(c, keys[0], got, sizeof got);
    if (rc == 0 && n >= 0) {
        fprintf(stderr, "    get after remove: %lld bytes\n", (long long)n);
        return -1;
    }
    if (n >= 0 && (n != 1 || got[0] != (fill(v, 1, tag * 16u), v[0]))) {
        fprintf(stderr, "    get %s: wrong bytes\n", keys[0]);
        return -1;
    }
    if (n < 0 && !known_err(n)) {
        fprintf(stderr, "    get %s: %lld\n", keys[0], (long long)n);
        return -1;
    }
    return 0;
}

/* Injection off: a fresh key round-trips (the first call may reconnect)
 * and the earlier keys that were put read back right or not at all. */
static int works_again(kvp_client *c, unsigned tag, const int ok_put[NKEYS])
{
    static uint8_t v[MAXV], got[MAXV];
    char key[48];
    snprintf(key, sizeof key, "sf-ok-%u", tag);
    fill(v, 4096, tag + 7);
    /* A transfer failure marks the segment failing (the master places
     * nothing there until its node heartbeats again): wait for that. */
    uint64_t end = tp_now_ms() + 5000;
    int rc;
    while ((rc = kvp_client_put(c, key, v, 4096)) == KVP_ENO_AVAILABLE_HANDLE && tp_now_ms() < end)
        tp_sleep_ms(20);
    if (rc != 0) {
        fprintf(stderr, "    put after the fault: %s\n", kvp_err_name(rc));
        return -1;
    }
    int64_t n = kvp_client_get(c, key, got, sizeof got);
    if (n != 4096 || memcmp(v, got, 4096) != 0) {
        fprintf(stderr, "    get after the fault: %lld\n", (long long)n);
        return -1;
    }
    kvp_client_remove(c, key, 1);
    for (int i = 1; i < NKEYS; i++) {
        char k[48];
        snprintf(k, sizeof k, "sf-%u-%d", tag, i);
        n = kvp_client_get(c, k, got, sizeof got);
        fill(v, key_len[i], tag * 16u + (unsigned)i);
        if (n >= 0 && ((size_t)n != key_len[i] || memcmp(v, got, key_len[i]) != 0)) {
            fprintf(stderr, "    %s after the fault: wrong bytes\n", k);
            return -1;
        }
        if (ok_put[i] && n < 0 && n != KVP_EOBJECT_NOT_FOUND) {
            fprintf(stderr, "    %s after the fault: %s\n", k, kvp_err_name((int)n));
            return -1;
        }
        kvp_client_remove(c, k, 1);
    }
    return 0;
}

/* --------------------------------------------------------------- client */

typedef struct cenv {
    tp_master m;
    tp_store st;
} cenv;

static int cenv_up(cenv *e)
{
    memset(e, 0, sizeof *e);
    /* node heartbeats every client_ttl / 3: a segment marked failing by a
     * transfer fault is usable again within ~0.7 s */
    if (tp_master_start(&e->m, (const char *const[]){"--client-ttl", "2s", "--lease-ttl", "1s", NULL}) != 0)
        return -1;
    return tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "64MiB", NULL});
}

static void cenv_down(cenv *e)
{
    tp_store_kill(&e->st);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

static kvp_client *open_client(const char *addr, char *err, size_t errlen, int *rc)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"3s\"}", addr);
    kvp_client *c = NULL;
    *rc = kvp_client_open(cfg, &c, err, errlen);
    return *rc ? NULL : c;
}

/* The sweep: every n in 1..N for every kind, then every call short from n
 * on for every 7th n. The same client lives through all of it. */
static void client_sweep(const char *addr)
{
    char err[512];
    int rc;
    kvp_client *c = open_client(addr, err, sizeof err, &rc);
    if (!c)
        fprintf(stderr, "    open: %s\n", err);
    CHECK(c != NULL);
    unsigned tag = 1;
    int ok_put[NKEYS];
    uint64_t before = kvp_sys_calls();
    CHECK_EQ(scenario(c, tag, ok_put), 0);
    uint64_t ncalls = kvp_sys_calls() - before;
    CHECK(ok_put[0] && ok_put[1] && ok_put[2]);
    CHECK_EQ(works_again(c, tag++, ok_put), 0);
    fprintf(stderr, "    scenario: %llu system calls\n", (unsigned long long)ncalls);
    CHECK(ncalls > 10);
    uint64_t points = 0, failed = 0;
    for (size_t k = 0; k <= NKINDS; k++) {
        int sticky = k == NKINDS; /* the last pass: short from n on */
        int kind = sticky ? KVP_SYS_SHORT : kinds[k];
        for (uint64_t n = 1; n <= ncalls + 2; n += sticky ? 7 : 1) {
            kvp_sys_fail_nth(n, sticky, kind);
            int r = scenario(c, tag, ok_put);
            uint64_t f = kvp_sys_failed();
            kvp_sys_fail_nth(0, 0, 0);
            if (r != 0 || works_again(c, tag, ok_put) != 0) {
                th_fail(__FILE__, __LINE__, "%s%s at call %llu", kind_name(kind),
                        sticky ? " (sticky)" : "", (unsigned long long)n);
                kvp_client_close(c);
                return;
            }
            points++;
            failed += f != 0;
            tag++;
        }
    }
    fprintf(stderr, "    %llu injection points, %llu hit a call\n", (unsigned long long)points,
            (unsigned long long)failed);
    CHECK(failed > ncalls);
    kvp_client_close(c);
}

/* Runs a sweep against a fresh master + store; tcp: KVPOOL_FORCE_TCP for
 * this and every later test of the process (the data plane under test). */
static void in_cenv(void (*sweep)(const char *addr), int tcp)
{
    if (tcp)
        setenv("KVPOOL_FORCE_TCP", "1", 1);
    cenv e;
    if (cenv_up(&e) == 0)
        sweep(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    cenv_down(&e);
}

TEST(client_shm_sweep) { in_cenv(client_sweep, 0); }

TEST(client_tcp_sweep) { in_cenv(client_sweep, 1); }

/* A fresh client: kvp_client_open (connect, HELLO) and its first
 * transfers (shm attach and descriptor passing, or the data-plane TCP
 * connection and its HELLO) with each call failing in turn: open fails
 * with a known error or the scenario's answers are right; afterwards a
 * client (reopened if need be) works. */
static void fresh_sweep(const char *addr)
{
    char err[512];
    int rc, ok_put[NKEYS];
    uint64_t before = kvp_sys_calls();
    kvp_client *c = open_client(addr, err, sizeof err, &rc);
    if (!c)
        fprintf(stderr, "    open: %s\n", err);
    CHECK(c != NULL);
    CHECK_EQ(scenario(c, 0, ok_put), 0);
    uint64_t ncalls = kvp_sys_calls() - before;
    kvp_client_close(c);
    fprintf(stderr, "    open + scenario: %llu system calls\n", (unsigned long long)ncalls);
    unsigned tag = 1;
    uint64_t points = 0;
    for (size_t k = 0; k < NKINDS; k++) {
        for (uint64_t n = 1; n <= ncalls + 1; n++, tag++, points++) {
            kvp_sys_fail_nth(n, 0, kinds[k]);
            c = open_client(addr, err, sizeof err, &rc);
            int r = c ? scenario(c, tag, ok_put) : 0;
            kvp_sys_fail_nth(0, 0, 0);
            if (!c && !known_err(rc)) {
                th_fail(__FILE__, __LINE__, "open with %s at %llu: %d", kind_name(kinds[k]),
                        (unsigned long long)n, rc);
                return;
            }
            if (!c) {
                memset(ok_put, 0, sizeof ok_put);
                c = open_client(addr, err, sizeof err, &rc);
            }
            if (r != 0 || !c || works_again(c, tag, ok_put) != 0) {
                th_fail(__FILE__, __LINE__, "fresh client with %s at %llu", kind_name(kinds[k]),
                        (unsigned long long)n);
                kvp_client_close(c);
                return;
            }
            kvp_client_close(c);
        }
    }
    fprintf(stderr, "    %llu injection points\n", (unsigned long long)points);
}

TEST(client_fresh_shm_sweep) { in_cenv(fresh_sweep, 0); }

TEST(client_fresh_tcp_sweep) { in_cenv(fresh_sweep, 1); }

/* --------------------------------------------------------------- master */

typedef struct msrv {
    kvp_mserver *s;
    int rc;
} msrv;

static void *msrv_main(void *p)
{
    msrv *m = p;
    m->rc = kvp_mserver_run(m->s);
    return NULL;
}

static kvp_mserver *mserver_new(char *addr, size_t addrlen)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:0");
    kvp_mserver *s = NULL;
    char err[512];
    if (kvp_mserver_create(&cfg, 0, &s, err, sizeof err) != 0) {
        fprintf(stderr, "    kvp_mserver_create: %s\n", err);
        return NULL;
    }
    snprintf(addr, addrlen, "127.0.0.1:%u", kvp_mserver_port(s));
    return s;
}

/* The forked client: an embedded-mode client (its own segment) runs the
 * scenario. Exit 0 (right answers, whatever failed), 2 a wrong answer,
 * 3 the open failed (an answer too: the fault may have hit HELLO). */
static void child_client(const char *addr)
{
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"16MiB\", "
             "\"local_hostname\": \"127.0.0.1\", \"rpc_timeout\": \"3s\"}",
             addr);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    if (rc)
        _exit(known_err(rc) ? 3 : 2);
    int ok_put[NKEYS];
    rc = scenario(c, 1, ok_put);
    kvp_client_close(c);
    _exit(rc ? 2 : 0);
}

/* One run: a fresh master (its thread starts after the fork, so the child
 * is forked from a single-threaded process), injection armed for the
 * master only. Returns the child's exit status (-1 on a crash or hang)
 * and, through *calls, the master's system calls during the run. After
 * the child is done, injection off, the master must still answer. */
static int master_run(uint64_t n, int sticky, int kind, uint64_t *calls)
{
    char addr[64];
    msrv m = {0};
    m.s = mserver_new(addr, sizeof addr);
    if (!m.s)
        return -1;
    pid_t pid = fork();
    if (pid == 0)
        child_client(addr);
    uint64_t before = kvp_sys_calls();
    kvp_sys_fail_nth(n, sticky, kind);
    pthread_t th;
    pthread_create(&th, NULL, msrv_main, &m);
    int st = 0, status = -1;
    uint64_t end = tp_now_ms() + 30000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tp_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        tp_sleep_ms(2);
    }
    if (WIFEXITED(st))
        status = WEXITSTATUS(st);
    kvp_sys_fail_nth(0, 0, 0);
    *calls = kvp_sys_calls() - before;
    /* the master still serves: a client in this process (not injected now) */
    char err[512];
    int rc;
    kvp_client *c = open_client(addr, err, sizeof err, &rc);
    int serves = 0;
    if (c) {
        const char *k = "sf-missing";
        int res = -1;
        char stat[4096];
        serves = kvp_client_exist(c, &k, 1, &res) == 0 && res == 0 &&
                 kvp_client_stat(c, stat, sizeof stat) >= 0;
        kvp_client_close(c);
    } else {
        fprintf(stderr, "    reopen: %s\n", err);
    }
    kvp_mserver_stop(m.s);
    pthread_join(th, NULL);
    kvp_mserver_destroy(m.s);
    if (m.rc != 0 || !serves)
        return -1;
    return status;
}

TEST(master_server_sweep)
{
    uint64_t ncalls = 0;
    int st = master_run(0, 0, 0, &ncalls);
    CHECK_EQ(st, 0);
    fprintf(stderr, "    master: %llu system calls\n", (unsigned long long)ncalls);
    CHECK(ncalls > 10);
    uint64_t step = ncalls > 400 ? ncalls / 400 : 1, points = 0;
    for (size_t k = 0; k <= NKINDS; k++) {
        int sticky = k == NKINDS;
        int kind = sticky ? KVP_SYS_SHORT : kinds[k];
        for (uint64_t n = 1; n <= ncalls; n += sticky ? 5 * step : step) {
            uint64_t dummy;
            st = master_run(n, sticky, kind, &dummy);
            if (st != 0 && st != 3) {
                th_fail(__FILE__, __LINE__, "master with %s%s at call %llu: %d",
                        kind_name(kind), sticky ? " (sticky)" : "", (unsigned long long)n, st);
                return;
            }
            points++;
        }
    }
    fprintf(stderr, "    %llu injection points\n", (unsigned long long)points);
}

/* ----------------------------------------------------------------- node */

/* The forked client of node_run: waits for "go" on fd, then runs the
 * scenario over TCP (through the injected segment server). Exit codes as
 * child_client. */
static void node_child(const char *master, int go)
{
    char c1;
    if (read(go, &c1, 1) != 1)
        _exit(2);
    setenv("KVPOOL_FORCE_TCP", "1", 1);
    char err[512];
    int rc;
    kvp_client *c = open_client(master, err, sizeof err, &rc);
    if (!c)
        _exit(known_err(rc) ? 3 : 2);
    int ok_put[NKEYS];
    rc = scenario(c, 2, ok_put);
    kvp_client_close(c);
    _exit(rc ? 2 : 0);
}

/* One run: the child is forked first (this process has no threads yet),
 * then the node starts and mounts, then injection is armed and the child
 * told to go. Afterwards, injection off, the node must serve a new client
 * (its master link reconnected and remounted if a fault broke it).
 * Returns the child's status (-1 crash/hang or a node that no longer
 * serves); *calls = this process's system calls while armed. */
static int node_run(const char *master, uint64_t n, int sticky, int kind, uint64_t *calls)
{
    int go[2];
    if (pipe(go) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(go[1]);
        node_child(master, go[0]);
    }
    close(go[0]);
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s", master);
    cfg.global_segment_size = 16 << 20;
    cfg.client_ttl_ms = 2000;
    kvp_node_opts o = {.cfg = &cfg, .listen = "127.0.0.1:0", .io_threads = 1};
    kvp_node *node = NULL;
    char err[512];
    int rc = kvp_node_start(&o, &node, err, sizeof err);
    uint64_t before = kvp_sys_calls();
    if (rc == 0)
        kvp_sys_fail_nth(n, sticky, kind);
    if (write(go[1], "g", 1) != 1)
        rc = -1;
    close(go[1]);
    int st = 0, status = -1;
    uint64_t end = tp_now_ms() + 30000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (tp_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        tp_sleep_ms(2);
    }
    if (WIFEXITED(st))
        status = WEXITSTATUS(st);
    kvp_sys_fail_nth(0, 0, 0);
    *calls = kvp_sys_calls() - before;
    if (rc != 0) {
        fprintf(stderr, "    node start: %s\n", err);
        return -1;
    }
    /* the node serves again: a put and a get over TCP from this process */
    int serves = 0;
    for (uint64_t t_end = tp_now_ms() + 5000; !serves && tp_now_ms() < t_end; tp_sleep_ms(50)) {
        setenv("KVPOOL_FORCE_TCP", "1", 1);
        int orc;
        kvp_client *c = open_client(master, err, sizeof err, &orc);
        unsetenv("KVPOOL_FORCE_TCP");
        if (!c)
            continue;
        uint8_t v[5000], b[5000];
        fill(v, sizeof v, n * 8 + (uint64_t)kind);
        char key[48];
        snprintf(key, sizeof key, "node-ok-%llu-%d-%d", (unsigned long long)n, kind, sticky);
        serves = kvp_client_put(c, key, v, sizeof v) == 0 &&
                 kvp_client_get(c, key, b, sizeof b) == (int64_t)sizeof b &&
                 memcmp(v, b, sizeof v) == 0;
        kvp_client_close(c);
    }
    kvp_node_stop(node);
    /* wait until the master dropped this node's segment (unmounted on stop) */
    for (uint64_t t_end = tp_now_ms() + 3000; tp_master_segments(master) > 0 && tp_now_ms() < t_end;)
        tp_sleep_ms(20);
    return serves ? status : -1;
}

TEST(node_server_sweep)
{
    tp_master m;
    if (tp_master_start(&m, (const char *const[]){"--client-ttl", "2s", "--lease-ttl", "1s", NULL}) != 0) {
        th_fail(__FILE__, __LINE__, "master start");
        return;
    }
    uint64_t ncalls = 0;
    int st = node_run(m.addr, 0, 0, 0, &ncalls);
    CHECK_EQ(st, 0);
    fprintf(stderr, "    node: %llu system calls\n", (unsigned long long)ncalls);
    CHECK(ncalls > 10);
    uint64_t step = ncalls > 12 ? ncalls / 12 : 1, points = 0;
    for (size_t k = 0; k <= NKINDS && st == 0; k++) {
        int sticky = k == NKINDS;
        int kind = sticky ? KVP_SYS_SHORT : kinds[k];
        for (uint64_t n = 1; n <= ncalls; n += step) {
            uint64_t dummy;
            int r = node_run(m.addr, n, sticky, kind, &dummy);
            if (r != 0 && r != 3) {
                th_fail(__FILE__, __LINE__, "node with %s%s at call %llu: %d", kind_name(kind),
                        sticky ? " (sticky)" : "", (unsigned long long)n, r);
                st = -1;
                break;
            }
            points++;
        }
    }
    fprintf(stderr, "    %llu injection points\n", (unsigned long long)points);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* --------------------------------------------------------------- lookup */

/* The answer the lookup server gives: 16 tokens per leading non-zero hash,
 * floored below num_tokens (as test_lookup.c's fake). */
static int lk_lookup(void *arg, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                     size_t hash_len, int apply_eagle, uint32_t *hit)
{
    (void)arg, (void)apply_eagle;
    uint32_t n = 0;
    while (n < nhashes && hashes[n * hash_len] != 0)
        n++;
    *hit = n * 16 < num_tokens ? n * 16 : (num_tokens - 1) / 16 * 16;
    return 0;
}

static int lk_reset(void *arg)
{
    (void)arg;
    return 0;
}

static char lk_path[108];

static kvp_lookup_server *lk_start(void)
{
    kvp_lookup_handler h = {.lookup = lk_lookup, .reset = lk_reset, .arg = NULL};
    kvp_lookup_server *s = NULL;
    return kvp_lookup_server_start(lk_path, &h, &s) == 0 ? s : NULL;
}

/* Three lookups and a reset. A lookup answers the right hit or 0 (a miss:
 * what a channel error or timeout is reported as); a reset answers ok, or
 * RPC_FAIL / RPC_TIMEOUT. 0, or -1 on a wrong answer. */
static int lk_scenario(kvp_lookup_client *c, unsigned tag)
{
    uint8_t hs[8 * 32];
    for (size_t i = 0; i < sizeof hs; i++)
        hs[i] = (uint8_t)(i / 32 < 5 ? 1 + i % 200 : (i % 32 ? 9 : 0)); /* 5 leading non-zero */
    for (int k = 0; k < 3; k++) {
        char id[32];
        snprintf(id, sizeof id, "r%u-%d", tag, k);
        uint32_t hit = 12345;
        int rc = kvp_lookup_client_lookup(c, id, (uint32_t)strlen(id), 1000, hs, 8, 32, false,
                                          false, &hit);
        if (rc != 0 || (hit != 80 && hit != 0)) {
            fprintf(stderr, "    lookup %s: rc %d hit %u\n", id, rc, hit);
            return -1;
        }
    }
    bool ok = false;
    int rc = kvp_lookup_client_reset(c, &ok);
    if ((rc == 0 && !ok) || (rc != 0 && rc != KVP_ERPC_FAIL && rc != KVP_ERPC_TIMEOUT)) {
        fprintf(stderr, "    reset: rc %d ok %d\n", rc, ok);
        return -1;
    }
    return 0;
}

/* Injection off: a lookup gets the right answer (the first may reconnect). */
static int lk_works(kvp_lookup_client *c, unsigned tag)
{
    uint8_t hs[2 * 32];
    memset(hs, 7, sizeof hs);
    char id[32];
    snprintf(id, sizeof id, "ok%u", tag);
    uint32_t hit = 0;
    int rc = kvp_lookup_client_lookup(c, id, (uint32_t)strlen(id), 1000, hs, 2, 32, false,
                                      false, &hit);
    if (rc != 0 || hit != 32) {
        fprintf(stderr, "    lookup after the fault: rc %d hit %u\n", rc, hit);
        return -1;
    }
    return 0;
}

/* Waits (bounded) for the socket file. */
static int lk_wait_path(void)
{
    for (int i = 0; i < 2000; i++) {
        if (access(lk_path, F_OK) == 0)
            return 0;
        tp_sleep_ms(1);
    }
    return -1;
}

/* The client (injected) against a server in a forked child. */
TEST(lookup_client_sweep)
{
    snprintf(lk_path, sizeof lk_path, "/tmp/kvp-sysf-%d-c.sock", (int)getpid());
    pid_t pid = fork();
    if (pid == 0) {
        kvp_lookup_server *s = lk_start();
        if (!s)
            _exit(1);
        for (;;)
            pause();
    }
    int ok = lk_wait_path() == 0;
    kvp_lookup_client *c = NULL;
    if (ok)
        ok = kvp_lookup_client_open(lk_path, 1000, &c) == 0;
    uint64_t before = kvp_sys_calls(), ncalls = 0, points = 0;
    if (ok)
        ok = lk_scenario(c, 0) == 0 && lk_works(c, 0) == 0;
    ncalls = kvp_sys_calls() - before;
    fprintf(stderr, "    lookup client: %llu system calls\n", (unsigned long long)ncalls);
    unsigned tag = 1;
    for (size_t k = 0; ok && k <= NKINDS; k++) {
        int sticky = k == NKINDS;
        int kind = sticky ? KVP_SYS_SHORT : kinds[k];
        for (uint64_t n = 1; ok && n <= ncalls + 1; n++, tag++) {
            kvp_sys_fail_nth(n, sticky, kind);
            int r = lk_scenario(c, tag);
            kvp_sys_fail_nth(0, 0, 0);
            if (r != 0 || lk_works(c, tag) != 0) {
                th_fail(__FILE__, __LINE__, "lookup client with %s%s at call %llu",
                        kind_name(kind), sticky ? " (sticky)" : "", (unsigned long long)n);
                ok = 0;
            }
            points++;
        }
    }
    fprintf(stderr, "    %llu injection points\n", (unsigned long long)points);
    kvp_lookup_client_close(c);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    unlink(lk_path);
    CHECK(ok);
}

/* One run of the server (in this process, injected) serving a forked
 * client; then, injection off, a client here gets right answers. The child
 * is forked before the server thread starts. Child exit: 0 right answers,
 * 2 a wrong one. */
static int lk_server_run(uint64_t n, int sticky, int kind, uint64_t *calls)
{
    unlink(lk_path);
    pid_t pid = fork();
    if (pid == 0) {
        kvp_lookup_client *c = NULL;
        if (lk_wait_path() != 0 || kvp_lookup_client_open(lk_path, 1000, &c) != 0)
            _exit(3);
        int r = lk_scenario(c, 1);
        kvp_lookup_client_close(c);
        _exit(r ? 2 : 0);
    }
    uint64_t before = kvp_sys_calls();
    kvp_sys_fail_nth(n, sticky, kind);
    kvp_lookup_server *s = lk_start();
    int st = 0;
    waitpid(pid, &st, 0);
    kvp_sys_fail_nth(0, 0, 0);
    *calls = kvp_sys_calls() - before;
    if (!s) /* the fault hit the server's own socket(): refused, cleanly */
        return WIFEXITED(st) && WEXITSTATUS(st) == 3 ? 0 : -1;
    kvp_lookup_client *c = NULL;
    int good = kvp_lookup_client_open(lk_path, 1000, &c) == 0 && lk_works(c, 0) == 0;
    kvp_lookup_client_close(c);
    kvp_lookup_server_stop(s);
    if (!good)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(lookup_server_sweep)
{
    snprintf(lk_path, sizeof lk_path, "/tmp/kvp-sysf-%d-s.sock", (int)getpid());
    uint64_t ncalls = 0, dummy, points = 0;
    CHECK_EQ(lk_server_run(0, 0, 0, &ncalls), 0);
    fprintf(stderr, "    lookup server: %llu system calls\n", (unsigned long long)ncalls);
    for (size_t k = 0; k <= NKINDS; k++) {
        int sticky = k == NKINDS;
        int kind = sticky ? KVP_SYS_SHORT : kinds[k];
        for (uint64_t n = 1; n <= ncalls + 1; n++) {
            int st = lk_server_run(n, sticky, kind, &dummy);
            if (st != 0) {
                th_fail(__FILE__, __LINE__, "lookup server with %s%s at call %llu: %d",
                        kind_name(kind), sticky ? " (sticky)" : "", (unsigned long long)n, st);
                unlink(lk_path);
                return;
            }
            points++;
        }
    }
    fprintf(stderr, "    %llu injection points\n", (unsigned long long)points);
    unlink(lk_path);
}
