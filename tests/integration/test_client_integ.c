/*
 * test_client_integ.c -- the store client against real processes: a
 * `kvpool master`, `kvpool store` nodes, clients opened with
 * kvp_client_open in standalone-store mode (and one embedded client).
 *
 * Covers: random round trips (1 B .. 16 MiB, shm and forced TCP),
 * scatter-gather, every single-key call, 4 threads x 2 processes, dedup,
 * misses, eviction under pressure, replica failover after kill -9 of a
 * node, kill -9 of a node during put batches (no wrong bytes ever), master
 * restart (client reconnects, nodes remount) and an unreachable or silent
 * master (errors within the deadline).
 *
 * Every test starts its processes in env_up and stops them in env_down
 * whatever the body did (bodies return early on a failed CHECK).
 */
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define MiB (1024ull * 1024)
#define MAX_STORES 2

/* ---------------------------------------------------------------- env */

typedef struct env {
    tp_master m;
    tp_store st[MAX_STORES];
    int nst;
} env;

/* Master (master_extra may be NULL) plus n stores of seg_size each. */
static int env_up(env *e, int n, const char *seg_size, const char *const *master_extra)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, master_extra) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (tp_store_start(&e->st[i], e->m.addr,
                           (const char *const[]){"--segment-size", seg_size, NULL}) != 0)
            return -1;
        e->nst++;
    }
    return 0;
}

static void env_down(env *e)
{
    for (int i = 0; i < MAX_STORES; i++)
        tp_store_kill(&e->st[i]);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

/* A client of e's master; extra_json is spliced into the object (", ..."). */
static kvp_client *client_open(const char *addr, const char *extra_json)
{
    return tp_client_open(addr, extra_json);
}

/* ------------------------------------------------------------- values */


static int check_bytes(const uint8_t *p, size_t len, uint64_t seed)
{
    uint8_t *want = malloc(len ? len : 1);
    if (!want)
        return 0;
    tp_fill(want, len, seed);
    int ok = memcmp(p, want, len) == 0;
    free(want);
    return ok;
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* -------------------------------------------------- random round trips */

#define RT_KEYS 1000
#define RT_BATCH 50
#define RT_BUDGET (280 * MiB)

/* Sizes 1 B .. 16 MiB, log-uniform, total under RT_BUDGET (later keys
 * shrink to <= 4 KiB once it is reached); the first two are the extremes. */
static void rt_sizes(size_t *sz, uint64_t seed)
{
    uint64_t s = seed | 1, total = 0;
    for (int i = 0; i < RT_KEYS; i++) {
        size_t v;
        if (i == 0)
            v = 1;
        else if (i == 1)
            v = 16 * MiB;
        else {
            /* mostly up to 1 MiB; every 50th key 2 .. 16 MiB */
            unsigned k = i % 50 == 25 ? 21 + (unsigned)(rng_next(&s) % 4) : (unsigned)(rng_next(&s) % 21);
            v = (size_t)1 << k;
            v += rng_next(&s) % v;
            if (v > 16 * MiB)
                v = 16 * MiB;
        }
        if (total + v > RT_BUDGET)
            v = 1 + rng_next(&s) % 4096;
        sz[i] = v;
        total += v;
    }
}

static void rt_body(const char *addr, const char *tag)
{
    kvp_client *c = client_open(addr, NULL);
    CHECK(c != NULL);
    static size_t sz[RT_KEYS];
    rt_sizes(sz, 42);
    char names[RT_BATCH][64];
    const char *keys[RT_BATCH];
    uint8_t *bufs[RT_BATCH];
    kvp_iov iov[RT_BATCH];
    const kvp_iov *iovp[RT_BATCH];
    size_t niov[RT_BATCH];
    int64_t res[RT_BATCH];
    int failed = 0;
    for (int b = 0; b < RT_KEYS && !failed; b += RT_BATCH) {
        for (int i = 0; i < RT_BATCH; i++) {
            snprintf(names[i], sizeof names[i], "rt-%s-%d", tag, b + i);
            keys[i] = names[i];
            bufs[i] = malloc(sz[b + i]);
            tp_fill(bufs[i], sz[b + i], (uint64_t)(b + i));
            iov[i] = (kvp_iov){bufs[i], sz[b + i]};
            iovp[i] = &iov[i];
            niov[i] = 1;
        }
        int rc = kvp_client_batch_put_from_multi_buffers(c, keys, iovp, niov, RT_BATCH, res);
        for (int i = 0; i < RT_BATCH; i++) {
            if (rc != 0 || res[i] != (int64_t)sz[b + i]) {
                fprintf(stderr, "    put %s (%zu B): rc %d result %lld\n", keys[i], sz[b + i], rc,
                        (long long)res[i]);
                failed = 1;
            }
            memset(bufs[i], 0xEE, sz[b + i]);
        }
        if (!failed) {
            rc = kvp_client_batch_get_into_multi_buffers(c, keys, iovp, niov, RT_BATCH, res);
            for (int i = 0; i < RT_BATCH; i++) {
                if (rc != 0 || res[i] != (int64_t)sz[b + i] ||
                    !check_bytes(bufs[i], sz[b + i], (uint64_t)(b + i))) {
                    fprintf(stderr, "    get %s (%zu B): rc %d result %lld\n", keys[i],
                            sz[b + i], rc, (long long)res[i]);
                    failed = 1;
                }
            }
        }
        for (int i = 0; i < RT_BATCH; i++)
            free(bufs[i]);
    }
    kvp_client_close(c);
    CHECK(!failed);
}

TEST(round_trip_random_shm)
{
    env e;
    unsetenv("KVPOOL_FORCE_TCP");
    if (env_up(&e, 1, "512MiB", NULL) == 0)
        rt_body(e.m.addr, "shm");
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

TEST(round_trip_random_tcp)
{
    env e;
    setenv("KVPOOL_FORCE_TCP", "1", 1);
    if (env_up(&e, 1, "512MiB", NULL) == 0)
        rt_body(e.m.addr, "tcp");
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* ------------------------------------------- scatter-gather, single calls */

static void sg_body(const char *addr)
{
    kvp_client *c = client_open(addr, NULL);
    CHECK(c != NULL);
    /* put from 5 pieces (one empty), get into 3 differently cut pieces */
    enum { A = 1000, B = 0, C = 70000, D = 1, E = 4096 };
    size_t total = A + B + C + D + E;
    uint8_t *src = malloc(total), *dst = malloc(total + 100);
    tp_fill(src, total, 7);
    kvp_iov in[5] = {{src, A}, {src + A, B}, {src + A, C}, {src + A + C, D}, {src + A + C + D, E}};
    const kvp_iov *inp = in;
    size_t nin = 5;
    const char *key = "sg-key";
    int64_t r = 0;
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, &key, &inp, &nin, 1, &r), 0);
    CHECK_EQ(r, (int64_t)total);
    memset(dst, 0, total + 100);
    kvp_iov out[3] = {{dst, 3}, {dst + 3, 50000}, {dst + 50003, total - 50003}};
    const kvp_iov *outp = out;
    size_t nout = 3;
    CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, &key, &outp, &nout, 1, &r), 0);
    CHECK_EQ(r, (int64_t)total);
    CHECK(memcmp(src, dst, total) == 0);
    /* pieces smaller / larger than the value */
    kvp_iov small = {dst, total - 1}, large = {dst, total + 1};
    const kvp_iov *sp = &small, *lp = &large;
    size_t one = 1;
    CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, &key, &sp, &one, 1, &r), 0);
    CHECK_EQ(r, KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, &key, &lp, &one, 1, &r), 0);
    CHECK_EQ(r, KVP_EINVALID_PARAMS);
    /* single calls */
    CHECK_EQ(kvp_client_get(c, key, dst, total - 1), KVP_EBUFFER_OVERFLOW);
    memset(dst, 0, total + 100);
    CHECK_EQ(kvp_client_get(c, key, dst, total + 100), (int64_t)total);
    CHECK(memcmp(src, dst, total) == 0);
    CHECK_EQ(kvp_client_size(c, key), (int64_t)total);
    char desc[512];
    int dl = kvp_client_describe(c, key, desc, sizeof desc);
    CHECK(dl > 0);
    CHECK(strncmp(desc, "size ", 5) == 0);
    CHECK(strstr(desc, "replica 1/1: segment ") != NULL);
    CHECK(strstr(desc, "tier dram via ") != NULL);
    CHECK_EQ(kvp_client_put(c, "sg-2", src, 10), 0);
    const char *ks[4] = {"sg-key", "sg-2", "sg-none", "sg-key"};
    int ex[4];
    CHECK_EQ(kvp_client_exist(c, ks, 4, ex), 0);
    CHECK(ex[0] == 1 && ex[1] == 1 && ex[2] == 0 && ex[3] == 1);
    CHECK_EQ(kvp_client_prefix(c, ks, 4), 2);
    CHECK_EQ(kvp_client_remove(c, "sg-2", 0), 0);
    CHECK_EQ(kvp_client_remove(c, "sg-2", 0), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_client_remove_all(c, 0), 1);
    CHECK_EQ(kvp_client_size(c, key), KVP_EOBJECT_NOT_FOUND);
    /* invalid keys and values */
    CHECK_EQ(kvp_client_put(c, "", src, 1), KVP_EINVALID_KEY);
    CHECK_EQ(kvp_client_put(c, "zero", src, 0), KVP_EINVALID_PARAMS);
    /* registered ranges */
    CHECK_EQ(kvp_client_register_buffer(c, dst, 100), 0);
    CHECK_EQ(kvp_client_register_buffer(c, dst + 50, 100), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_register_buffer(c, dst + 100, 100), 0);
    CHECK_EQ(kvp_client_unregister_buffer(c, dst + 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_unregister_buffer(c, dst), 0);
    CHECK_EQ(kvp_client_unregister_buffer(c, dst + 100), 0);
    free(src);
    free(dst);
    kvp_client_close(c);
}

TEST(scatter_gather_and_single_calls)
{
    env e;
    if (env_up(&e, 1, "64MiB", NULL) == 0)
        sg_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* ---------------------------------------- dedup, misses, embedded mode */

static void dedup_body(const char *addr)
{
    kvp_client *c = client_open(addr, NULL);
    CHECK(c != NULL);
    uint8_t a[5000], b[5000], got[5000];
    tp_fill(a, sizeof a, 1);
    tp_fill(b, sizeof b, 2);
    const char *key = "dup";
    kvp_iov va = {a, sizeof a}, vb = {b, sizeof b};
    const kvp_iov *pa = &va, *pb = &vb;
    size_t one = 1;
    int64_t r = -1;
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, &key, &pa, &one, 1, &r), 0);
    CHECK_EQ(r, (int64_t)sizeof a);
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, &key, &pb, &one, 1, &r), 0);
    CHECK_EQ(r, 0); /* exists: nothing moved */
    CHECK_EQ(kvp_client_put(c, key, b, sizeof b), 0);
    CHECK_EQ(kvp_client_get(c, key, got, sizeof got), (int64_t)sizeof got);
    CHECK(memcmp(got, a, sizeof a) == 0); /* first writer wins */
    /* misses */
    CHECK_EQ(kvp_client_get(c, "missing", got, sizeof got), KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_client_size(c, "missing"), KVP_EOBJECT_NOT_FOUND);
    const char *mk = "missing";
    kvp_iov vg = {got, sizeof got};
    const kvp_iov *pg = &vg;
    CHECK_EQ(kvp_client_batch_get_into_multi_buffers(c, &mk, &pg, &one, 1, &r), 0);
    CHECK_EQ(r, KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_client_remove(c, "missing", 0), KVP_EOBJECT_NOT_FOUND);
    kvp_client_close(c);
}

TEST(dedup_and_missing)
{
    env e;
    if (env_up(&e, 1, "64MiB", NULL) == 0)
        dedup_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

static void embedded_body(const char *addr)
{
    char cfg[512], err[512];
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"64MiB\", "
             "\"local_hostname\": \"127.0.0.1\"}",
             addr);
    kvp_client *c = NULL;
    int rc = kvp_client_open(cfg, &c, err, sizeof err);
    if (rc)
        fprintf(stderr, "    kvp_client_open: %s\n", err);
    CHECK_EQ(rc, 0);
    CHECK_EQ(tp_master_segments(addr), 1);
    static uint8_t v[1 << 20], got[1 << 20];
    tp_fill(v, sizeof v, 9);
    CHECK_EQ(kvp_client_put(c, "emb", v, sizeof v), 0);
    CHECK_EQ(kvp_client_get(c, "emb", got, sizeof got), (int64_t)sizeof got);
    CHECK(memcmp(v, got, sizeof v) == 0);
    kvp_client_close(c);
    /* close unmounts the embedded segment */
    uint64_t end = tp_now_ms() + 5000;
    while (tp_master_segments(addr) != 0 && tp_now_ms() < end)
        tp_sleep_ms(20);
    CHECK_EQ(tp_master_segments(addr), 0);
}

TEST(embedded_mode_segment)
{
    env e;
    if (env_up(&e, 0, "64MiB", NULL) == 0)
        embedded_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* ------------------------------------------- threads x processes */

#define TP_THREADS 4
#define TP_PROCS 2
#define TP_KEYS 150

typedef struct tp_arg {
    kvp_client *c;
    int proc, thread;
    int failures;
} tp_arg;

static void *tp_thread(void *p)
{
    tp_arg *a = p;
    uint64_t s = (uint64_t)(a->proc * 100 + a->thread + 1) * 7919;
    uint8_t *buf = malloc(64 * 1024), *got = malloc(64 * 1024);
    for (int i = 0; i < TP_KEYS; i++) {
        char key[64];
        snprintf(key, sizeof key, "tp-%d-%d-%d", a->proc, a->thread, i);
        size_t len = 1 + rng_next(&s) % (64 * 1024);
        uint64_t seed = (uint64_t)(a->proc * 1000000 + a->thread * 10000 + i);
        tp_fill(buf, len, seed);
        if (kvp_client_put(a->c, key, buf, len) != 0) {
            a->failures++;
            continue;
        }
        /* read back this key and an earlier one of this thread */
        if (kvp_client_get(a->c, key, got, 64 * 1024) != (int64_t)len ||
            !check_bytes(got, len, seed))
            a->failures++;
        const char *ks[2] = {key, key};
        int ex[2];
        if (kvp_client_exist(a->c, ks, 2, ex) != 0 || ex[0] != 1 || ex[1] != 1)
            a->failures++;
    }
    free(buf);
    free(got);
    return NULL;
}

/* One process: TP_THREADS threads on one client; returns failures. */
static int tp_process(const char *addr, int proc)
{
    kvp_client *c = client_open(addr, NULL);
    if (!c)
        return 1;
    pthread_t th[TP_THREADS];
    tp_arg args[TP_THREADS];
    for (int t = 0; t < TP_THREADS; t++) {
        args[t] = (tp_arg){c, proc, t, 0};
        pthread_create(&th[t], NULL, tp_thread, &args[t]);
    }
    int f = 0;
    for (int t = 0; t < TP_THREADS; t++) {
        pthread_join(th[t], NULL);
        f += args[t].failures;
    }
    kvp_client_close(c);
    return f;
}

static void tp_body(const char *addr)
{
    pid_t pids[TP_PROCS];
    fflush(stdout);
    fflush(stderr);
    for (int p = 0; p < TP_PROCS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            int f = tp_process(addr, p);
            if (f)
                fprintf(stderr, "    process %d: %d failures\n", p, f);
            _exit(f ? 1 : 0);
        }
    }
    int bad = 0;
    for (int p = 0; p < TP_PROCS; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            bad++;
    }
    CHECK_EQ(bad, 0);
    /* every key of every thread is visible from a third client */
    kvp_client *c = client_open(addr, NULL);
    CHECK(c != NULL);
    char names[TP_KEYS][64];
    const char *ks[TP_KEYS];
    int ex[TP_KEYS];
    for (int i = 0; i < TP_KEYS; i++) {
        snprintf(names[i], sizeof names[i], "tp-1-3-%d", i);
        ks[i] = names[i];
    }
    CHECK_EQ(kvp_client_exist(c, ks, TP_KEYS, ex), 0);
    for (int i = 0; i < TP_KEYS; i++)
        CHECK_EQ(ex[i], 1);
    CHECK_EQ(kvp_client_prefix(c, ks, TP_KEYS), TP_KEYS);
    kvp_client_close(c);
}

TEST(threads_and_processes)
{
    env e;
    if (env_up(&e, 1, "256MiB", NULL) == 0)
        tp_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* ---------------------------------------------------------- eviction */

static void evict_body(const char *addr)
{
    kvp_client *c = client_open(addr, NULL);
    CHECK(c != NULL);
    size_t len = 1 * MiB;
    uint8_t *v = malloc(len), *got = malloc(len);
    int n = 100; /* 100 MiB into a 32 MiB segment */
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "ev-%d", i);
        tp_fill(v, len, (uint64_t)i);
        int rc = kvp_client_put(c, key, v, len);
        if (rc)
            fprintf(stderr, "    put %s: %s\n", key, kvp_err_name(rc));
        CHECK_EQ(rc, 0);
    }
    int found = 0;
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "ev-%d", i);
        int64_t r = kvp_client_get(c, key, got, len);
        CHECK(r == (int64_t)len || r == KVP_EOBJECT_NOT_FOUND);
        if (r == (int64_t)len) {
            CHECK(check_bytes(got, len, (uint64_t)i));
            found++;
        }
    }
    CHECK(found > 0 && found <= 32);
    free(v);
    free(got);
    kvp_client_close(c);
}

TEST(eviction_keeps_puts_succeeding)
{
    env e;
    if (env_up(&e, 1, "32MiB", NULL) == 0)
        evict_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* ------------------------------------------------- node failures */

#define FO_KEYS 40
#define FO_LEN (300 * 1024)

/* replica_num 2 over 2 nodes, forced TCP (an shm mapping outlives its
 * node, so only TCP sees a dead node); kill -9 one node; every get is still
 * served, from the surviving replica. */
static void failover_body(env *e)
{
    kvp_client *c = client_open(e->m.addr, ", \"replica_num\": 2");
    CHECK(c != NULL);
    uint8_t *v = malloc(FO_LEN), *got = malloc(FO_LEN);
    for (int i = 0; i < FO_KEYS; i++) {
        char key[32];
        snprintf(key, sizeof key, "fo-%d", i);
        tp_fill(v, FO_LEN, (uint64_t)i);
        CHECK_EQ(kvp_client_put(c, key, v, FO_LEN), 0);
    }
    char desc[512];
    CHECK(kvp_client_describe(c, "fo-0", desc, sizeof desc) > 0);
    CHECK(strstr(desc, "replica 2/2") != NULL);
    tp_store_kill(&e->st[0]);
    for (int i = 0; i < FO_KEYS; i++) {
        char key[32];
        snprintf(key, sizeof key, "fo-%d", i);
        memset(got, 0, FO_LEN);
        int64_t r = kvp_client_get(c, key, got, FO_LEN);
        if (r != FO_LEN)
            fprintf(stderr, "    get %s: %lld\n", key, (long long)r);
        CHECK_EQ(r, FO_LEN);
        CHECK(check_bytes(got, FO_LEN, (uint64_t)i));
    }
    free(v);
    free(got);
    kvp_client_close(c);
}

TEST(replica_failover_after_node_kill)
{
    env e;
    setenv("KVPOOL_FORCE_TCP", "1", 1);
    if (env_up(&e, 2, "64MiB", NULL) == 0)
        failover_body(&e);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

typedef struct killer {
    tp_store *st;
    unsigned after_ms;
} killer;

static void *killer_main(void *p)
{
    killer *k = p;
    tp_sleep_ms(k->after_ms);
    tp_store_kill(k->st);
    return NULL;
}

#define KP_BATCHES 60
#define KP_BATCH 8
#define KP_LEN (256 * 1024)

/* kill -9 of a node while put batches run: every key reports bytes or an
 * error, and no get returns wrong bytes (only the right value or an error). */
static void kill_put_body(env *e)
{
    kvp_client *c = client_open(e->m.addr, ", \"rpc_timeout\": \"3s\"");
    CHECK(c != NULL);
    static int64_t res[KP_BATCHES][KP_BATCH];
    uint8_t *bufs[KP_BATCH];
    for (int i = 0; i < KP_BATCH; i++)
        bufs[i] = malloc(KP_LEN);
    killer k = {&e->st[0], 150};
    pthread_t kt;
    pthread_create(&kt, NULL, killer_main, &k);
    int ok = 0, err = 0;
    for (int b = 0; b < KP_BATCHES; b++) {
        char names[KP_BATCH][32];
        const char *keys[KP_BATCH];
        kvp_iov iov[KP_BATCH];
        const kvp_iov *iovp[KP_BATCH];
        size_t niov[KP_BATCH];
        for (int i = 0; i < KP_BATCH; i++) {
            snprintf(names[i], sizeof names[i], "kp-%d-%d", b, i);
            keys[i] = names[i];
            tp_fill(bufs[i], KP_LEN, (uint64_t)(b * KP_BATCH + i));
            iov[i] = (kvp_iov){bufs[i], KP_LEN};
            iovp[i] = &iov[i];
            niov[i] = 1;
        }
        CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, keys, iovp, niov, KP_BATCH, res[b]), 0);
        for (int i = 0; i < KP_BATCH; i++) {
            CHECK(res[b][i] == KP_LEN || res[b][i] < 0);
            if (res[b][i] == KP_LEN)
                ok++;
            else
                err++;
        }
    }
    pthread_join(kt, NULL);
    fprintf(stderr, "    puts: %d succeeded, %d failed\n", ok, err);
    CHECK(ok > 0);
    uint8_t *got = malloc(KP_LEN);
    int served = 0;
    for (int b = 0; b < KP_BATCHES; b++)
        for (int i = 0; i < KP_BATCH; i++) {
            char key[32];
            snprintf(key, sizeof key, "kp-%d-%d", b, i);
            int64_t r = kvp_client_get(c, key, got, KP_LEN);
            CHECK(r == KP_LEN || r < 0);
            if (r == KP_LEN) {
                CHECK(check_bytes(got, KP_LEN, (uint64_t)(b * KP_BATCH + i)));
                served++;
            }
        }
    fprintf(stderr, "    gets: %d served with the right bytes\n", served);
    free(got);
    for (int i = 0; i < KP_BATCH; i++)
        free(bufs[i]);
    kvp_client_close(c);
}

TEST(node_kill_during_puts)
{
    env e;
    setenv("KVPOOL_FORCE_TCP", "1", 1);
    if (env_up(&e, 2, "128MiB", NULL) == 0)
        kill_put_body(&e);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* -------------------------------------------------- master failures */

/* kill -9 of the master, a new one on the same address: the node remounts,
 * the client reconnects on its next call, puts and gets work again. */
static void restart_body(env *e)
{
    kvp_client *c = client_open(e->m.addr, ", \"rpc_timeout\": \"2s\"");
    CHECK(c != NULL);
    uint8_t v[10000], got[10000];
    tp_fill(v, sizeof v, 5);
    CHECK_EQ(kvp_client_put(c, "before", v, sizeof v), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "%s", e->m.addr);
    tp_master_kill(&e->m);
    CHECK_EQ(tp_master_start(&e->m, (const char *const[]){"--listen", addr, NULL}), 0);
    CHECK(strcmp(e->m.addr, addr) == 0);
    uint64_t end = tp_now_ms() + 15000;
    while (tp_master_segments(addr) < 1 && tp_now_ms() < end)
        tp_sleep_ms(50);
    CHECK_EQ(tp_master_segments(addr), 1);
    /* the old object's metadata died with the master */
    CHECK_EQ(kvp_client_get(c, "before", got, sizeof got), KVP_EOBJECT_NOT_FOUND);
    tp_fill(v, sizeof v, 6);
    CHECK_EQ(kvp_client_put(c, "after", v, sizeof v), 0);
    CHECK_EQ(kvp_client_get(c, "after", got, sizeof got), (int64_t)sizeof got);
    CHECK(memcmp(v, got, sizeof v) == 0);
    kvp_client_close(c);
}

TEST(master_restart_reconnects)
{
    env e;
    if (env_up(&e, 1, "64MiB", NULL) == 0)
        restart_body(&e);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}

/* A master that is gone (connection refused) or silent (SIGSTOP): open and
 * put fail with RPC_FAIL / RPC_TIMEOUT within the deadline. A call may wait
 * for the connection mutex behind one other timed-out request (the
 * heartbeat), hence the bound of two deadlines plus a margin. */
static void unreachable_body(env *e)
{
    const uint64_t T = 1000, MARGIN = 1000;
    char cfg[256], err[512];
    /* silent master */
    kvp_client *c = client_open(e->m.addr, ", \"rpc_timeout\": \"1s\"");
    CHECK(c != NULL);
    uint8_t v[4096] = {1};
    CHECK_EQ(kvp_client_put(c, "u-1", v, sizeof v), 0);
    kill(e->m.pid, SIGSTOP);
    uint64_t t0 = tp_now_ms();
    int rc = kvp_client_put(c, "u-2", v, sizeof v);
    uint64_t dt = tp_now_ms() - t0;
    fprintf(stderr, "    put to a stopped master: %s after %llu ms\n", kvp_err_name(rc),
            (unsigned long long)dt);
    CHECK(rc == KVP_ERPC_TIMEOUT || rc == KVP_ERPC_FAIL);
    CHECK(dt < 2 * T + MARGIN);
    snprintf(cfg, sizeof cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"1s\"}",
             e->m.addr);
    kvp_client *c2 = NULL;
    t0 = tp_now_ms();
    rc = kvp_client_open(cfg, &c2, err, sizeof err);
    dt = tp_now_ms() - t0;
    CHECK(rc == KVP_ERPC_TIMEOUT || rc == KVP_ERPC_FAIL);
    CHECK(dt < T + MARGIN);
    kill(e->m.pid, SIGCONT);
    /* gone master */
    tp_master_kill(&e->m);
    t0 = tp_now_ms();
    rc = kvp_client_put(c, "u-3", v, sizeof v);
    dt = tp_now_ms() - t0;
    CHECK_EQ(rc, KVP_ERPC_FAIL);
    CHECK(dt < 2 * T + MARGIN);
    kvp_client_close(c);
    t0 = tp_now_ms();
    rc = kvp_client_open(cfg, &c2, err, sizeof err);
    dt = tp_now_ms() - t0;
    CHECK_EQ(rc, KVP_ERPC_FAIL);
    CHECK(dt < T + MARGIN);
}

TEST(master_unreachable_fails_within_deadline)
{
    env e;
    if (env_up(&e, 1, "64MiB", NULL) == 0)
        unreachable_body(&e);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    if (e.m.pid > 0)
        kill(e.m.pid, SIGCONT);
    env_down(&e);
}

/* The segment name of key's first replica from kvp_client_describe's
 * "... (host:port) ..." into out; 0 or -1. */
static int first_segment(kvp_client *c, const char *key, char *out, size_t cap)
{
    char d[512];
    if (kvp_client_describe(c, key, d, sizeof d) < 0)
        return -1;
    const char *a = strchr(d, '('), *b = a ? strchr(a, ')') : NULL;
    if (!a || !b || (size_t)(b - a - 1) >= cap)
        return -1;
    memcpy(out, a + 1, (size_t)(b - a - 1));
    out[b - a - 1] = 0;
    return 0;
}

/* Puts 8 keys named tag-i and returns how many landed on segment `want`. */
static int count_on(kvp_client *c, const char *tag, const char *want)
{
    static uint8_t v[4096];
    int on = 0;
    for (int i = 0; i < 8; i++) {
        char key[64], seg[300];
        snprintf(key, sizeof key, "%s-%d", tag, i);
        if (kvp_client_put(c, key, v, sizeof v) != 0)
            return -1;
        if (first_segment(c, key, seg, sizeof seg) == 0 && strcmp(seg, want) == 0)
            on++;
    }
    return on;
}

/* preferred_segment (config) and $MOONCAKE_PREFERRED_SEGMENT: puts place
 * their copy on the named segment; the config wins over the environment;
 * a blank override is a configuration error. */
TEST(preferred_segment_config_and_env)
{
    env e;
    if (env_up(&e, 2, "64MiB", NULL) != 0) {
        th_fail(__FILE__, __LINE__, "env_up");
        env_down(&e);
        return;
    }
    /* learn the two segment names from where unpreferred puts land */
    kvp_client *c = client_open(e.m.addr, "");
    CHECK(c != NULL);
    char names[2][300] = {"", ""};
    static uint8_t v[4096];
    for (int i = 0; i < 64 && !names[1][0]; i++) {
        char key[32], seg[300];
        snprintf(key, sizeof key, "probe-%d", i);
        CHECK(kvp_client_put(c, key, v, sizeof v) == 0);
        CHECK(first_segment(c, key, seg, sizeof seg) == 0);
        if (!names[0][0])
            snprintf(names[0], sizeof names[0], "%s", seg);
        else if (strcmp(seg, names[0]) != 0)
            snprintf(names[1], sizeof names[1], "%s", seg);
    }
    kvp_client_close(c);
    CHECK(names[1][0] != 0);

    for (int w = 0; w < 2; w++) {
        char extra[800];
        snprintf(extra, sizeof extra, ", \"preferred_segment\": \" %s \"", names[w]);
        c = client_open(e.m.addr, extra);
        CHECK(c != NULL);
        char tag[16];
        snprintf(tag, sizeof tag, "cfg%d", w);
        CHECK_EQ(count_on(c, tag, names[w]), 8);
        kvp_client_close(c);
    }
    setenv("MOONCAKE_PREFERRED_SEGMENT", names[1], 1);
    c = client_open(e.m.addr, "");
    CHECK(c != NULL);
    CHECK_EQ(count_on(c, "env", names[1]), 8);
    kvp_client_close(c);
    char extra[800];
    snprintf(extra, sizeof extra, ", \"preferred_segment\": \"%s\"", names[0]);
    c = client_open(e.m.addr, extra); /* the explicit override wins */
    CHECK(c != NULL);
    CHECK_EQ(count_on(c, "both", names[0]), 8);
    kvp_client_close(c);
    unsetenv("MOONCAKE_PREFERRED_SEGMENT");

    char cfg[800], err[256] = "";
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\", "
             "\"preferred_segment\": \"  \"}", e.m.addr);
    kvp_client *bad = NULL;
    CHECK_EQ(kvp_client_open(cfg, &bad, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "preferred_segment") != NULL);
    CHECK(bad == NULL);
    env_down(&e);
}

/* ------------------------------------------- the API the Python layer uses */

/* kvp_get_alloc_fn for the test: malloc'd pieces, or a refusal. */
typedef struct {
    int refuse;
    int calls;
    void *mem[4];
} alloc_ctx;

static int test_alloc(void *arg, size_t m, const size_t *idx, const uint64_t *sizes, kvp_iov *out)
{
    alloc_ctx *a = arg;
    a->calls++;
    if (a->refuse)
        return -1;
    for (size_t j = 0; j < m; j++) {
        if (!sizes[j] || idx[j] >= 4)
            continue;
        a->mem[idx[j]] = malloc(sizes[j]);
        out[idx[j]] = (kvp_iov){a->mem[idx[j]], sizes[j]};
    }
    return 0;
}

/* Per-call put options, batch size / remove / get_into, registered-range
 * checks, regex removal, stat, tenants: what kvpool._native calls. */
static void extended_body(const char *addr)
{
    kvp_client *c = client_open(addr, "");
    kvp_client *t = client_open(addr, ", \"tenant_id\": \"other\"");
    CHECK(c != NULL && t != NULL);
    CHECK(strcmp(kvp_client_tenant(c), "default") == 0);
    CHECK(strcmp(kvp_client_tenant(t), "other") == 0);
    CHECK(strcmp(kvp_client_segment_name(c), "") == 0); /* standalone-store: none */
    static uint8_t src[8192], dst[16384];
    tp_fill(src, sizeof src, 7);

    /* options: 2 replicas on 2 segments, hard pin, a bad struct_size */
    kvp_put_opts o;
    kvp_put_opts_init(&o);
    o.replica_num = 2;
    o.flags = KVP_PUT_HARD_PIN;
    kvp_iov v = {src, sizeof src};
    const kvp_iov *vp = &v;
    size_t one = 1;
    const char *k = "opt/pinned";
    int64_t r = 0;
    CHECK_EQ(kvp_client_batch_put_opts(c, &k, &vp, &one, 1, &o, &r), 0);
    CHECK_EQ(r, (int64_t)sizeof src);
    char js[2048];
    CHECK(kvp_client_describe_json(c, k, js, sizeof js) > 0);
    CHECK(strstr(js, "\"size\": 8192") != NULL);
    const char *second = strstr(js, "\"segment\"");
    CHECK(second && strstr(second + 1, "\"segment\"") != NULL); /* two replicas */
    CHECK_EQ(kvp_client_describe_json(c, k, js, 10), KVP_EBUFFER_OVERFLOW);
    CHECK_EQ(kvp_client_remove(c, k, 0), KVP_EOBJECT_PINNED);
    CHECK_EQ(kvp_client_remove(c, k, 1), 0);
    o.struct_size = 3;
    CHECK_EQ(kvp_client_batch_put_opts(c, &k, &vp, &one, 1, &o, &r), KVP_EINVALID_PARAMS);
    kvp_put_opts_init(&o);
    o.replica_num = 4;
    CHECK_EQ(kvp_client_batch_put_opts(c, &k, &vp, &one, 1, &o, &r), KVP_EINVALID_PARAMS);

    /* upsert: the new value replaces the old one; a soft pin's TTL is
     * checked by the master (-600 without SOFT_PIN); a caller built against
     * the first layout (no soft_pin_ttl_ms) gets its defaults */
    const char *uk = "opt/upsert";
    CHECK_EQ(kvp_client_put(c, uk, src, 100), 0);
    kvp_put_opts_init(&o);
    o.flags = KVP_PUT_REPLACE | KVP_PUT_SOFT_PIN;
    o.soft_pin_ttl_ms = 60000;
    kvp_iov uv = {src + 1, 200};
    const kvp_iov *uvp = &uv;
    CHECK_EQ(kvp_client_batch_put_opts(c, &uk, &uvp, &one, 1, &o, &r), 0);
    CHECK_EQ(r, 200);
    CHECK_EQ(kvp_client_get(c, uk, dst, sizeof dst), 200);
    CHECK(memcmp(dst, src + 1, 200) == 0);
    o.flags = KVP_PUT_REPLACE;
    CHECK_EQ(kvp_client_batch_put_opts(c, &uk, &uvp, &one, 1, &o, &r), 0);
    CHECK_EQ(r, KVP_EINVALID_PARAMS); /* a TTL without SOFT_PIN */
    o.soft_pin_ttl_ms = -2;
    CHECK_EQ(kvp_client_batch_put_opts(c, &uk, &uvp, &one, 1, &o, &r), KVP_EINVALID_PARAMS);
    o.soft_pin_ttl_ms = 12345; /* beyond a first-layout struct: never read */
    o.struct_size = offsetof(kvp_put_opts, preferred_segment) + sizeof(const char *);
    o.flags = KVP_PUT_REPLACE | KVP_PUT_SOFT_UNPIN;
    CHECK_EQ(kvp_client_batch_put_opts(c, &uk, &vp, &one, 1, &o, &r), 0);
    CHECK_EQ(r, (int64_t)sizeof src);
    CHECK_EQ(kvp_client_get(c, uk, dst, sizeof dst), (int)sizeof src);
    CHECK_EQ(kvp_client_remove(c, uk, 0), 0);

    /* batch size, batch get into larger buffers, batch remove */
    const char *ks[3] = {"x/a", "x/b", "x/missing"};
    kvp_iov pv[2] = {{src, 100}, {src + 100, 5000}};
    const kvp_iov *pp[2] = {&pv[0], &pv[1]};
    size_t pn[2] = {1, 1};
    int64_t res[4];
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, ks, pp, pn, 2, res), 0);
    CHECK(res[0] == 100 && res[1] == 5000);
    CHECK_EQ(kvp_client_batch_size(c, ks, 3, res), 0);
    CHECK(res[0] == 100 && res[1] == 5000 && res[2] == KVP_EOBJECT_NOT_FOUND);
    kvp_iov gv[3] = {{dst, 200}, {dst + 200, 5000}, {dst + 5200, 10}};
    const kvp_iov *gp[3] = {&gv[0], &gv[1], &gv[2]};
    size_t gn[3] = {1, 1, 1};
    CHECK_EQ(kvp_client_batch_get_into(c, ks, gp, gn, 3, res), 0);
    CHECK(res[0] == 100 && res[1] == 5000 && res[2] == KVP_EOBJECT_NOT_FOUND);
    CHECK(memcmp(dst, src, 100) == 0 && memcmp(dst + 200, src + 100, 5000) == 0);
    /* gets of unknown size: one GET, memory from the callback */
    alloc_ctx ac = {0};
    CHECK_EQ(kvp_client_batch_get_alloc(c, ks, 3, test_alloc, &ac, res), 0);
    CHECK(ac.calls == 1 && res[0] == 100 && res[1] == 5000 && res[2] == KVP_EOBJECT_NOT_FOUND);
    CHECK(ac.mem[0] && memcmp(ac.mem[0], src, 100) == 0);
    CHECK(ac.mem[1] && memcmp(ac.mem[1], src + 100, 5000) == 0 && !ac.mem[2]);
    for (int i = 0; i < 4; i++)
        free(ac.mem[i]);
    alloc_ctx no = {.refuse = 1};
    CHECK_EQ(kvp_client_batch_get_alloc(c, ks, 3, test_alloc, &no, res), 0);
    CHECK(res[0] == KVP_ENOMEM && res[1] == KVP_ENOMEM && res[2] == KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(kvp_client_batch_get_alloc(c, ks, 3, NULL, NULL, res), KVP_EINVALID_PARAMS);
    int codes[4];
    CHECK_EQ(kvp_client_exist(t, ks, 3, codes), 0); /* the other tenant sees nothing */
    CHECK(codes[0] == 0 && codes[1] == 0 && codes[2] == 0);
    CHECK_EQ(kvp_client_batch_remove(c, ks, 3, 0, codes), 0);
    CHECK(codes[0] == 0 && codes[1] == 0 && codes[2] == KVP_EOBJECT_NOT_FOUND);

    /* registered ranges */
    CHECK_EQ(kvp_client_register_buffer(c, dst, 1000), 0);
    kvp_iov in[2] = {{dst, 10}, {dst + 990, 10}}, out[2] = {{dst + 995, 10}, {dst - 1, 2}};
    CHECK_EQ(kvp_client_check_registered(c, in, 2), 0);
    CHECK_EQ(kvp_client_check_registered(c, out, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_check_registered(c, out + 1, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_unregister_buffer(c, dst), 0);
    CHECK_EQ(kvp_client_check_registered(c, in, 1), KVP_EINVALID_PARAMS);

    /* regex removal, per tenant */
    const char *rk[4] = {"rx/1", "rx/2", "rx/22", "keep/1"};
    kvp_iov rv = {src, 16};
    const kvp_iov *rp[4] = {&rv, &rv, &rv, &rv};
    size_t rn[4] = {1, 1, 1, 1};
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(c, rk, rp, rn, 4, res), 0);
    CHECK_EQ(kvp_client_batch_put_from_multi_buffers(t, rk, rp, rn, 4, res), 0);
    CHECK_EQ(kvp_client_remove_regex(c, "^rx/[0-9]$", 0), 2);
    CHECK_EQ(kvp_client_remove_regex(c, "rx/", 0), 1);
    CHECK_EQ(kvp_client_remove_regex(c, "(", 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_remove_regex(c, "", 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_remove_regex(c, "(a)\\1", 0), KVP_EINVALID_PARAMS); /* back-reference */
    /* counted repetition: a few bytes that cost 160 ms per key, or gigabytes to compile */
    CHECK_EQ(kvp_client_remove_regex(c, "(a{1,255}|b){1,255}c", 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_remove_regex(c, "((a{0,100}){0,100}){0,100}", 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_remove_regex(c, "keep\\{", 0), 0); /* an escaped brace is a literal */
    CHECK_EQ(kvp_client_remove_regex(c, "keep\\/9", 0), 0);  /* an escaped char is not one */
    CHECK_EQ(kvp_client_exist(c, rk, 4, codes), 0);
    CHECK(codes[0] == 0 && codes[1] == 0 && codes[2] == 0 && codes[3] == 1);
    CHECK_EQ(kvp_client_exist(t, rk, 4, codes), 0);
    CHECK(codes[0] == 1 && codes[1] == 1 && codes[2] == 1 && codes[3] == 1);
    CHECK_EQ(kvp_client_remove_all(t, 0), 4);

    /* stat */
    char st[8192];
    int sl = kvp_client_stat(c, st, sizeof st);
    CHECK(sl > 0);
    CHECK(strstr(st, "\"counters\": {\"objects\": 1,") != NULL);
    CHECK(strstr(st, "\"segments\": [{\"id\": ") != NULL);
    CHECK_EQ(kvp_client_stat(c, st, 8), KVP_EBUFFER_OVERFLOW);
    kvp_client_close(t);
    kvp_client_close(c);
}

TEST(extended_api_options_batches_tenants_regex)
{
    env e;
    if (env_up(&e, 2, "64MiB", NULL) == 0)
        extended_body(e.m.addr);
    else
        th_fail(__FILE__, __LINE__, "env_up");
    env_down(&e);
}
