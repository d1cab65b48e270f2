/*
 * test_attack_regex.c -- one REMOVE_REGEX must not stall the master.
 *
 * The attack (against 0a85b26): the attacker's own 1000 keys of 4096
 * characters and the pattern "(a|b|ab|ba|aa|bb)*" x 50 + "c" (901 bytes,
 * no counted repetition, no back-reference). glibc's regexec took ~20 ms a
 * key, all inside the master's one thread: a concurrent `stat` timed out,
 * and the master then dropped the storage node as silent and unmounted it,
 * taking every tenant's objects there. Now the matcher is linear
 * (src/master/ere.c) and the removal is split across loop turns, so other
 * clients are served meanwhile, and a stalled loop (here: SIGSTOP) does not
 * count as its peers' silence.
 *
 * Real processes: `kvpool master` (client TTL 3 s), one `kvpool store`
 * (64 MiB), clients of two tenants.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define NKEYS 1000
#define KEYLEN 4096
#define NVICTIM 32
#define VSIZE 16384
#define LATENCY_BOUND_MS 1000 /* generous: sanitizers, a shared machine */

static kvp_client *client_open(const char *addr, const char *tenant)
{
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"tenant\": \"%s\", "
             "\"rpc_timeout\": \"120s\"}",
             addr, tenant);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    if (rc) {
        fprintf(stderr, "    kvp_client_open: %s (%s)\n", err, kvp_err_name(rc));
        return NULL;
    }
    return c;
}

/* The victim's keys would match the pattern too: only the tenant keeps them. */
static void victim_key(char *k, size_t n, int i) { snprintf(k, n, "abababc/victim/%d", i); }

static int put_victims(kvp_client *v)
{
    uint8_t *buf = malloc(VSIZE);
    for (int i = 0; i < NVICTIM; i++) {
        char k[64];
        victim_key(k, sizeof k, i);
        tp_fill(buf, VSIZE, (uint64_t)i + 1);
        REQUIRE(kvp_client_put(v, k, buf, VSIZE) == 0);
    }
    free(buf);
    return 0;
}

/* Every victim object is there with its bytes; returns how many. */
static int victims_intact(kvp_client *v)
{
    uint8_t *buf = malloc(VSIZE), *want = malloc(VSIZE);
    int ok = 0;
    for (int i = 0; i < NVICTIM; i++) {
        char k[64];
        victim_key(k, sizeof k, i);
        tp_fill(want, VSIZE, (uint64_t)i + 1);
        if (kvp_client_get(v, k, buf, VSIZE) == VSIZE && memcmp(buf, want, VSIZE) == 0)
            ok++;
    }
    free(buf);
    free(want);
    return ok;
}

/* The attack's pattern: (a|b|ab|ba|aa|bb)* 50 times, then 'c' (901 bytes). */
static void attack_pattern(char *p)
{
    size_t n = 0;
    for (int i = 0; i < 50; i++)
        n += (size_t)sprintf(p + n, "%s", "(a|b|ab|ba|aa|bb)*");
    p[n++] = 'c';
    p[n] = 0;
}

/* The attacker's keys: 4096 characters of a and b; the even ones end in
 * 'c' (they match), the odd ones do not. */
static void attacker_key(char *k, int i)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
    for (int j = 0; j < KEYLEN; j++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        k[j] = (x & 1) ? 'a' : 'b';
    }
    snprintf(k + KEYLEN - 6, 7, "%05d", i);
    k[KEYLEN - 1] = (i % 2 == 0) ? 'c' : 'a';
    k[KEYLEN] = 0;
}

typedef struct attack {
    kvp_client *c;
    const char *pattern;
    int64_t removed;
    uint64_t ms;
    volatile int done;
} attack;

static void *attack_main(void *arg)
{
    attack *a = arg;
    uint64_t t0 = tp_now_ms();
    a->removed = kvp_client_remove_regex(a->c, a->pattern, 0);
    a->ms = tp_now_ms() - t0;
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

TEST(remove_regex_attack_leaves_master_responsive)
{
    tp_master m;
    tp_store st;
    CHECK(tp_master_start(&m, (const char *[]){"--client-ttl", "3s", "--lease-ttl", "1s", NULL}) == 0);
    if (tp_store_start(&st, m.addr, (const char *[]){"--segment-size", "64MiB", NULL}) != 0) {
        tp_master_kill(&m);
        CHECK(!"store start");
    }
    kvp_client *v = client_open(m.addr, "victim");
    kvp_client *att = client_open(m.addr, "attacker");
    kvp_client *obs = client_open(m.addr, "victim");
    CHECK(v && att && obs);
    CHECK(put_victims(v) == 0);
    char *key = malloc(KEYLEN + 1);
    uint8_t val[64];
    memset(val, 7, sizeof val);
    for (int i = 0; i < NKEYS; i++) {
        attacker_key(key, i);
        CHECK_EQ(kvp_client_put(att, key, val, sizeof val), 0);
    }
    free(key);

    char pattern[1024];
    attack_pattern(pattern);
    CHECK_EQ(strlen(pattern), 901);
    attack a = {att, pattern, -1, 0, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, attack_main, &a) == 0);
    /* while it runs: stat and GET from another client answer quickly */
    uint64_t worst_stat = 0, worst_get = 0, rounds = 0;
    int bad = 0;
    char *sbuf = malloc(1 << 16);
    uint8_t *gbuf = malloc(VSIZE);
    uint64_t start = tp_now_ms();
    while (!__atomic_load_n(&a.done, __ATOMIC_ACQUIRE) && tp_now_ms() - start < 120000) {
        uint64_t t0 = tp_now_ms();
        int rc = kvp_client_stat(obs, sbuf, 1 << 16);
        uint64_t t1 = tp_now_ms();
        char k[64];
        victim_key(k, sizeof k, (int)(rounds % NVICTIM));
        int64_t got = kvp_client_get(obs, k, gbuf, VSIZE);
        uint64_t t2 = tp_now_ms();
        if (rc < 0 || got != VSIZE)
            bad++;
        if (t1 - t0 > worst_stat)
            worst_stat = t1 - t0;
        if (t2 - t1 > worst_get)
            worst_get = t2 - t1;
        rounds++;
        tp_sleep_ms(10);
    }
    pthread_join(th, NULL);
    free(sbuf);
    free(gbuf);
    printf("    REMOVE_REGEX of %d keys of %d bytes: %lld removed in %llu ms; during it %llu "
           "stat+GET rounds, slowest stat %llu ms, slowest GET %llu ms\n",
           NKEYS, KEYLEN, (long long)a.removed, (unsigned long long)a.ms,
           (unsigned long long)rounds, (unsigned long long)worst_stat,
           (unsigned long long)worst_get);
    CHECK_EQ(bad, 0);
    CHECK(worst_stat < LATENCY_BOUND_MS);
    CHECK(worst_get < LATENCY_BOUND_MS);
    CHECK_EQ(a.removed, NKEYS / 2); /* the keys ending in 'c' */
    /* the node was not dropped, the victim lost nothing */
    tp_sleep_ms(500);
    CHECK_EQ(tp_master_segments(m.addr), 1);
    CHECK_EQ(victims_intact(v), NVICTIM);
    /* the non-matching half is still there: a second pass removes none */
    CHECK_EQ(kvp_client_remove_regex(att, pattern, 0), 0);
    CHECK_EQ(kvp_client_remove_all(att, 0), NKEYS / 2);
    kvp_client_close(v);
    kvp_client_close(att);
    kvp_client_close(obs);
    tp_store_kill(&st);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* A later frame of the asker waits for the answer; requests of two
 * tenants queued behind each other are each answered with their count. */
static void *remove_all_main(void *arg)
{
    attack *a = arg;
    a->removed = kvp_client_remove_all(a->c, 0);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

TEST(concurrent_removes_of_two_tenants)
{
    tp_master m;
    tp_store st;
    CHECK(tp_master_start(&m, NULL) == 0);
    if (tp_store_start(&st, m.addr, (const char *[]){"--segment-size", "64MiB", NULL}) != 0) {
        tp_master_kill(&m);
        CHECK(!"store start");
    }
    kvp_client *x = client_open(m.addr, "tx"), *y = client_open(m.addr, "ty");
    CHECK(x && y);
    char *key = malloc(KEYLEN + 1);
    uint8_t val[8] = {1};
    for (int i = 0; i < 600; i++) {
        attacker_key(key, i);
        CHECK_EQ(kvp_client_put(x, key, val, sizeof val), 0);
        CHECK_EQ(kvp_client_put(y, key, val, sizeof val), 0);
    }
    free(key);
    char pattern[1024];
    attack_pattern(pattern);
    attack ax = {x, pattern, -1, 0, 0}, ay = {y, NULL, -1, 0, 0};
    pthread_t tx, ty;
    CHECK(pthread_create(&tx, NULL, attack_main, &ax) == 0);
    CHECK(pthread_create(&ty, NULL, remove_all_main, &ay) == 0);
    pthread_join(tx, NULL);
    pthread_join(ty, NULL);
    CHECK_EQ(ax.removed, 300);
    CHECK_EQ(ay.removed, 600);
    CHECK_EQ(kvp_client_remove_all(x, 0), 300);
    CHECK_EQ(kvp_client_remove_all(y, 0), 0);
    kvp_client_close(x);
    kvp_client_close(y);
    tp_store_kill(&st);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* A master stopped for longer than the TTL (SIGSTOP, SIGCONT) unmounts
 * nothing: the silence was its own. */
TEST(stopped_master_drops_nobody)
{
    tp_master m;
    tp_store st;
    CHECK(tp_master_start(&m, (const char *[]){"--client-ttl", "2s", "--lease-ttl", "1s", NULL}) == 0);
    if (tp_store_start(&st, m.addr, (const char *[]){"--segment-size", "64MiB", NULL}) != 0) {
        tp_master_kill(&m);
        CHECK(!"store start");
    }
    kvp_client *v = client_open(m.addr, "victim");
    CHECK(v != NULL);
    CHECK(put_victims(v) == 0);
    CHECK_EQ(kill(m.pid, SIGSTOP), 0);
    tp_sleep_ms(6000); /* 3 TTLs */
    CHECK_EQ(kill(m.pid, SIGCONT), 0);
    tp_sleep_ms(1500);
    CHECK_EQ(tp_master_segments(m.addr), 1);
    CHECK_EQ(victims_intact(v), NVICTIM);
    char sbuf[8192];
    CHECK(kvp_client_stat(v, sbuf, sizeof sbuf) > 0);
    CHECK(strstr(sbuf, "\"clients_expired\": 0") != NULL || strstr(sbuf, "clients_expired") == NULL);
    kvp_client_close(v);
    tp_store_kill(&st);
    CHECK_EQ(tp_master_stop(&m), 0);
}
