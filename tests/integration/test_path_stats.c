/*
 * test_path_stats.c -- bytes counted per data path, against real processes
 * (`kvpool master`, `kvpool store`): a client's own counters
 * (kvp_client_stats) for puts and gets over shared memory and over TCP
 * (KVPOOL_FORCE_TCP), byte-exact; the pool's figures (the master's
 * client_<path>_* counters from the clients' HEARTBEAT reports) summing two
 * clients, keeping a departed client's, counting a client that closes
 * before its first heartbeat, and coming back after a master restart;
 * `kvpool stat` printing them.
 *
 * Every test starts its processes in env_up and stops them in env_down
 * whatever the body did (bodies return early on a failed CHECK).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define MAX_STORES 2

typedef struct env {
    tp_master m;
    tp_store st[MAX_STORES];
} env;

/* A master whose clients heartbeat every second (client_ttl 3 s), and n
 * stores of 32 MiB. */
static int env_up(env *e, int n)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, (const char *const[]){"--client-ttl", "3s", "--lease-ttl", "1s",
                                                     NULL}) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (tp_store_start(&e->st[i], e->m.addr,
                           (const char *const[]){"--segment-size", "32MiB", NULL}) != 0)
            return -1;
    return 0;
}

static void env_down(env *e)
{
    for (int i = 0; i < MAX_STORES; i++)
        tp_store_kill(&e->st[i]);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

/* A standalone client of addr; force_tcp sets KVPOOL_FORCE_TCP for its open
 * (read once, there). extra_json is spliced into the object (", ..."). */
static kvp_client *client_open(const char *addr, int force_tcp, const char *extra_json)
{
    if (force_tcp)
        setenv("KVPOOL_FORCE_TCP", "1", 1);
    else
        unsetenv("KVPOOL_FORCE_TCP");
    kvp_client *c = tp_client_open(addr, extra_json);
    unsetenv("KVPOOL_FORCE_TCP");
    return c;
}

/* Puts n keys "<prefix>-i" of sizes[i] bytes; 0 when every one was stored
 * (a key that exists already counts as stored: nothing moves). */
static int put_keys(kvp_client *c, const char *prefix, int n, const size_t *sizes,
                    uint32_t replicas)
{
    for (int i = 0; i < n; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s-%d", prefix, i);
        uint8_t *v = malloc(sizes[i]);
        REQUIRE(v != NULL);
        tp_fill(v, sizes[i], (uint64_t)i + 1);
        kvp_iov iov = {v, sizes[i]};
        const kvp_iov *iovs[1] = {&iov};
        const char *keys[1] = {k};
        kvp_put_opts o;
        kvp_put_opts_init(&o);
        o.replica_num = replicas;
        int64_t res = -1;
        const size_t one = 1; /* piece per key */
        int rc = kvp_client_batch_put_opts(c, keys, iovs, &one, 1, &o, &res);
        free(v);
        if (rc || res < 0)
            fprintf(stderr, "    put %s: %d / %lld\n", k, rc, (long long)res);
        REQUIRE(rc == 0 && res >= 0);
    }
    return 0;
}

/* Gets them back (checked byte by byte); 0 when all came back right. */
static int get_keys(kvp_client *c, const char *prefix, int n, const size_t *sizes)
{
    for (int i = 0; i < n; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s-%d", prefix, i);
        uint8_t *v = malloc(sizes[i]), *want = malloc(sizes[i]);
        REQUIRE(v && want);
        tp_fill(want, sizes[i], (uint64_t)i + 1);
        int64_t got = kvp_client_get(c, k, v, sizes[i]);
        int same = got == (int64_t)sizes[i] && memcmp(v, want, sizes[i]) == 0;
        free(v);
        free(want);
        REQUIRE(same);
    }
    return 0;
}

static int stats_of(kvp_client *c, kvp_transfer_stats *s)
{
    kvp_transfer_stats_init(s);
    return kvp_client_stats(c, s);
}

/* {put_bytes, get_bytes, put_ops, get_ops} of one path */
static int path_is(const kvp_transfer_stats *s, int p, uint64_t pb, uint64_t gb, uint64_t po,
                   uint64_t go)
{
    const kvp_path_stats *x = &s->path[p];
    if (x->put_bytes == pb && x->get_bytes == gb && x->put_ops == po && x->get_ops == go)
        return 1;
    fprintf(stderr, "    path %s: put %llu B / %llu ops, get %llu B / %llu ops\n", kvp_path_name(p),
            (unsigned long long)x->put_bytes, (unsigned long long)x->put_ops,
            (unsigned long long)x->get_bytes, (unsigned long long)x->get_ops);
    return 0;
}

/* The master's counter `name` ("client_tcp_put_bytes"), from kvp_client_stat. */
static long long pool_counter(kvp_client *c, const char *name)
{
    static char json[1 << 16];
    if (kvp_client_stat(c, json, sizeof json) < 0)
        return -1;
    char pat[96];
    snprintf(pat, sizeof pat, "\"%s\": ", name);
    const char *p = strstr(json, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

/* Waits (10 s at most) until the master's counter `name` is want. */
static int pool_waits_for(kvp_client *c, const char *name, long long want)
{
    long long v = -1;
    for (uint64_t end = tp_now_ms() + 10000; tp_now_ms() < end; tp_sleep_ms(100))
        if ((v = pool_counter(c, name)) == want)
            return 1;
    fprintf(stderr, "    %s: %lld, want %lld\n", name, v, want);
    return 0;
}

static const size_t sizes[4] = {1, 4096, 100000, 1u << 20};
#define SUM (1ull + 4096 + 100000 + (1u << 20))

/* Same host: every transfer goes through shared memory, each replica
 * counted; a put of an existing key moves and counts nothing. */
TEST(shm_counts_under_shm)
{
    env e;
    if (env_up(&e, 2) == 0) {
        kvp_client *c = client_open(e.m.addr, 0, NULL);
        CHECK(c != NULL);
        kvp_transfer_stats s;
        CHECK_EQ(stats_of(c, &s), 0);
        for (int p = 0; p < KVP_NPATHS; p++)
            CHECK(path_is(&s, p, 0, 0, 0, 0));
        CHECK_EQ(put_keys(c, "one", 4, sizes, 1), 0);
        CHECK_EQ(put_keys(c, "two", 4, sizes, 2), 0); /* a replica on each store */
        CHECK_EQ(put_keys(c, "one", 4, sizes, 1), 0); /* exist already: nothing moves */
        CHECK_EQ(get_keys(c, "one", 4, sizes), 0);
        CHECK_EQ(get_keys(c, "two", 4, sizes), 0); /* one replica read per key */
        CHECK_EQ(kvp_client_get(c, "missing", (char[8]){0}, 8), KVP_EOBJECT_NOT_FOUND);
        CHECK_EQ(stats_of(c, &s), 0);
        CHECK(path_is(&s, KVP_PATH_SHM, 3 * SUM, 2 * SUM, 12, 8));
        CHECK(path_is(&s, KVP_PATH_TCP, 0, 0, 0, 0));
        CHECK(path_is(&s, KVP_PATH_UCX, 0, 0, 0, 0));
        kvp_client_close(c);
    } else {
        th_fail(__FILE__, __LINE__, "env_up");
    }
    env_down(&e);
}

/* KVPOOL_FORCE_TCP: the same transfers, counted under tcp only. */
TEST(tcp_counts_under_tcp)
{
    env e;
    if (env_up(&e, 1) == 0) {
        kvp_client *c = client_open(e.m.addr, 1, NULL);
        CHECK(c != NULL);
        CHECK_EQ(put_keys(c, "k", 4, sizes, 1), 0);
        CHECK_EQ(get_keys(c, "k", 4, sizes), 0);
        CHECK_EQ(get_keys(c, "k", 4, sizes), 0);
        kvp_transfer_stats s;
        CHECK_EQ(stats_of(c, &s), 0);
        CHECK(path_is(&s, KVP_PATH_TCP, SUM, 2 * SUM, 4, 8));
        CHECK(path_is(&s, KVP_PATH_SHM, 0, 0, 0, 0));
        CHECK(path_is(&s, KVP_PATH_UCX, 0, 0, 0, 0));
        kvp_client_close(c);
    } else {
        th_fail(__FILE__, __LINE__, "env_up");
    }
    env_down(&e);
}

/* The public call's contract: names, struct sizes. */
TEST(stats_api_contract)
{
    CHECK(!strcmp(kvp_path_name(KVP_PATH_SHM), "shm"));
    CHECK(!strcmp(kvp_path_name(KVP_PATH_TCP), "tcp"));
    CHECK(!strcmp(kvp_path_name(KVP_PATH_UCX), "ucx"));
    CHECK(kvp_path_name(KVP_NPATHS) == NULL && kvp_path_name(-1) == NULL);
    env e;
    if (env_up(&e, 1) == 0) {
        kvp_client *c = client_open(e.m.addr, 0, NULL);
        CHECK(c != NULL);
        kvp_transfer_stats s;
        CHECK_EQ(kvp_client_stats(c, NULL), KVP_EINVALID_PARAMS);
        CHECK_EQ(kvp_client_stats(NULL, &s), KVP_EINVALID_PARAMS);
        kvp_transfer_stats_init(&s);
        static const size_t bad[] = {0, sizeof(size_t), sizeof s - 1, sizeof s + 1,
                                     sizeof s + sizeof(kvp_path_stats)};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            s.struct_size = bad[i];
            CHECK_EQ(kvp_client_stats(c, &s), KVP_EINVALID_PARAMS);
        }
        kvp_transfer_stats_init(&s);
        CHECK_EQ(s.struct_size, sizeof s);
        CHECK_EQ(kvp_client_stats(c, &s), 0);
        kvp_client_close(c);
    } else {
        th_fail(__FILE__, __LINE__, "env_up");
    }
    env_down(&e);
}

/* The pool's figures: two clients' reports summed (one over shm, one over
 * tcp), a departed client's kept, a client that closes before its first
 * heartbeat counted (its last report goes out at close), and `kvpool stat`
 * showing them. */
TEST(pool_sums_clients_and_keeps_departed)
{
    env e;
    if (env_up(&e, 1) != 0) {
        th_fail(__FILE__, __LINE__, "env_up");
        env_down(&e);
        return;
    }
    kvp_client *a = client_open(e.m.addr, 0, NULL), *b = client_open(e.m.addr, 1, NULL);
    CHECK(a && b);
    CHECK_EQ(put_keys(a, "a", 4, sizes, 1), 0);
    CHECK_EQ(get_keys(a, "a", 4, sizes), 0);
    CHECK_EQ(put_keys(b, "b", 3, sizes, 1), 0);
    CHECK_EQ(get_keys(b, "a", 4, sizes), 0); /* b reads a's keys over tcp */
    const long long b_put = 1 + 4096 + 100000;
    /* both live: each one's last report, summed per path */
    CHECK(pool_waits_for(a, "client_shm_put_bytes", SUM));
    CHECK(pool_waits_for(a, "client_shm_get_bytes", SUM));
    CHECK(pool_waits_for(a, "client_tcp_put_bytes", b_put));
    CHECK(pool_waits_for(a, "client_tcp_get_bytes", SUM));
    CHECK(pool_waits_for(a, "client_tcp_put_ops", 3));
    CHECK(pool_waits_for(a, "client_tcp_get_ops", 4));
    CHECK_EQ(pool_counter(a, "client_ucx_put_bytes"), 0);
    /* b goes: its figures stay */
    kvp_client_close(b);
    CHECK(pool_waits_for(a, "clients", 2)); /* a and the store's link to the master */
    CHECK_EQ(pool_counter(a, "client_tcp_put_bytes"), b_put);
    CHECK_EQ(pool_counter(a, "client_tcp_get_bytes"), SUM);
    /* a client that lives for less than a heartbeat counts too */
    kvp_client *q = client_open(e.m.addr, 1, NULL);
    CHECK(q != NULL);
    CHECK_EQ(put_keys(q, "q", 2, sizes, 1), 0);
    kvp_client_close(q);
    CHECK(pool_waits_for(a, "client_tcp_put_bytes", b_put + 1 + 4096));
    CHECK(pool_waits_for(a, "client_tcp_put_ops", 5));
    /* a goes on moving: its report grows, nothing counted twice */
    CHECK_EQ(get_keys(a, "b", 3, sizes), 0);
    CHECK(pool_waits_for(a, "client_shm_get_bytes", SUM + b_put));
    CHECK_EQ(pool_counter(a, "client_shm_put_bytes"), SUM);
    /* kvpool stat: a line per path */
    static char out[1 << 16];
    CHECK_EQ(tp_run_capture((const char *const[]){tp_kvpool_bin(), "stat", "--master", e.m.addr,
                                                  NULL},
                            1, out, sizeof out, 20000),
             0);
    char line[3][160], x[32], y[32];
    snprintf(line[0], sizeof line[0], "path shm: put %s (4 transfers), get %s (7 transfers)\n",
             kvp_size_format(SUM, x, sizeof x), kvp_size_format(SUM + b_put, y, sizeof y));
    snprintf(line[1], sizeof line[1], "path tcp: put %s (5 transfers), get %s (4 transfers)\n",
             kvp_size_format(b_put + 4097, x, sizeof x), kvp_size_format(SUM, y, sizeof y));
    snprintf(line[2], sizeof line[2], "path ucx: put 0 B (0 transfers), get 0 B (0 transfers)\n");
    for (int i = 0; i < 3; i++)
        if (!strstr(out, line[i]))
            th_fail(__FILE__, __LINE__, "no \"%s\" in:\n%s", line[i], out);
    CHECK_EQ(tp_run_capture((const char *const[]){tp_kvpool_bin(), "stat", "--json", "--master",
                                                  e.m.addr, NULL},
                            1, out, sizeof out, 20000),
             0);
    CHECK(strstr(out, "\"client_tcp_put_ops\": 5") != NULL);
    kvp_client_close(a);
    env_down(&e);
}

/* A restarted master knows nothing of the old figures: each client reports
 * its whole life to it at its next heartbeat. */
TEST(pool_figures_after_a_master_restart)
{
    env e;
    if (env_up(&e, 1) != 0) {
        th_fail(__FILE__, __LINE__, "env_up");
        env_down(&e);
        return;
    }
    kvp_client *a = client_open(e.m.addr, 0, ", \"rpc_timeout\": \"2s\"");
    CHECK(a != NULL);
    CHECK_EQ(put_keys(a, "a", 4, sizes, 1), 0);
    CHECK(pool_waits_for(a, "client_shm_put_bytes", SUM));
    char addr[64];
    snprintf(addr, sizeof addr, "%s", e.m.addr);
    tp_master_kill(&e.m);
    CHECK_EQ(tp_master_start(&e.m, (const char *const[]){"--listen", addr, "--client-ttl", "3s",
                                                         "--lease-ttl", "1s", NULL}),
             0);
    uint64_t end = tp_now_ms() + 15000;
    while (tp_master_segments(addr) < 1 && tp_now_ms() < end)
        tp_sleep_ms(50);
    CHECK_EQ(tp_master_segments(addr), 1);
    CHECK(pool_waits_for(a, "client_shm_put_bytes", SUM));
    CHECK(pool_waits_for(a, "client_shm_put_ops", 4));
    /* and it goes on from there */
    CHECK_EQ(put_keys(a, "b", 1, sizes + 2, 1), 0);
    CHECK(pool_waits_for(a, "client_shm_put_bytes", SUM + 100000));
    kvp_client_close(a);
    env_down(&e);
}
