/*
 * test_xq.c -- the asynchronous transfer queue (src/client/xq.h) against
 * real processes (`kvpool master`, `kvpool store`): jobs of puts from and
 * gets into registered memory run on the queue's threads while the caller
 * goes on; every job is polled exactly once with a result per key; a get
 * of a missing key fails that key alone; bad arguments are refused at
 * submit; a hook refusing entry fails a job's every key and moves nothing;
 * destroy with jobs queued and results unpolled leaks nothing (ASan).
 */
#include <stdlib.h>
#include <string.h>

#include "client/xq.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define CHUNK 65536
#define NKEYS 24

typedef struct env {
    tp_master m;
    tp_store st;
    kvp_client *c;
    uint8_t *src, *dst; /* NKEYS chunks each, registered */
} env;

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    REQUIRE(tp_master_start(&e->m, NULL) == 0);
    REQUIRE(tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "32MiB",
                                                                    NULL}) == 0);
    REQUIRE((e->c = tp_client_open(e->m.addr, NULL)) != NULL);
    REQUIRE((e->src = malloc((size_t)NKEYS * CHUNK)) != NULL);
    REQUIRE((e->dst = calloc(NKEYS, CHUNK)) != NULL);
    for (int i = 0; i < NKEYS; i++)
        tp_fill(e->src + (size_t)i * CHUNK, CHUNK, (uint64_t)i + 7);
    REQUIRE(kvp_client_register_buffer(e->c, e->src, (size_t)NKEYS * CHUNK) == 0);
    REQUIRE(kvp_client_register_buffer(e->c, e->dst, (size_t)NKEYS * CHUNK) == 0);
    return 0;
}

static void env_down(env *e)
{
    if (e->c)
        kvp_client_close(e->c);
    free(e->src);
    free(e->dst);
    tp_store_kill(&e->st);
    if (e->m.pid > 0)
        tp_master_kill(&e->m);
}

/* Keys "xq-<prefix>-<first+i>" and ranges base + (first+i)*CHUNK, n of them. */
static void job_args(const char *prefix, uint8_t *base, int first, int n, char names[][32],
                     const char **keys, kvp_iov *iovs)
{
    for (int i = 0; i < n; i++) {
        snprintf(names[i], 32, "xq-%s-%d", prefix, first + i);
        keys[i] = names[i];
        iovs[i] = (kvp_iov){base + (size_t)(first + i) * CHUNK, CHUNK};
    }
}

/* Polls (draining first) until `want` jobs came back; their results into
 * done[] in finishing order. The number polled. */
static size_t poll_all(kvp_xq *q, kvp_xq_done *done, size_t want)
{
    kvp_xq_drain(q);
    size_t got = 0;
    while (got < want) {
        size_t m = kvp_xq_poll(q, done + got, want - got);
        if (m == 0)
            break;
        got += m;
    }
    return got;
}

static void free_done(kvp_xq_done *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        kvp_xq_done_free(&d[i]);
}

static void body_roundtrip(env *e)
{
    kvp_xq *q = NULL;
    CHECK_EQ(kvp_xq_create(e->c, 3, NULL, &q), 0);
    char names[NKEYS][32];
    const char *keys[NKEYS];
    kvp_iov iovs[NKEYS];
    /* three put jobs of 8 keys, submitted without waiting */
    for (int j = 0; j < 3; j++) {
        job_args("rt", e->src, j * 8, 8, names + j * 8, keys + j * 8, iovs + j * 8);
        CHECK_EQ(kvp_xq_submit(q, 100 + (uint64_t)j, KVP_XQ_PUT, keys + j * 8,
                               iovs + j * 8, 8), 0);
    }
    kvp_xq_done d[4];
    size_t got = poll_all(q, d, 3);
    CHECK_EQ(got, 3);
    CHECK_EQ(kvp_xq_pending(q), 0);
    CHECK_EQ(kvp_xq_poll(q, d + 3, 1), 0); /* each job once */
    uint64_t seen = 0;
    for (size_t i = 0; i < got; i++) {
        CHECK(d[i].id >= 100 && d[i].id < 103);
        seen |= 1u << (d[i].id - 100);
        CHECK_EQ(d[i].op, KVP_XQ_PUT);
        CHECK_EQ(d[i].n, 8);
        for (size_t k = 0; k < 8; k++)
            CHECK_EQ(d[i].results[k], CHUNK);
        CHECK_EQ(d[i].bytes, 8 * CHUNK);
        CHECK(d[i].seconds >= 0);
    }
    CHECK_EQ(seen, 7);
    free_done(d, got);
    /* one get job of every key, plus a missing one */
    job_args("rt", e->dst, 0, NKEYS, names, keys, iovs);
    CHECK_EQ(kvp_xq_submit(q, 7, KVP_XQ_GET, keys, iovs, NKEYS), 0);
    CHECK_EQ(poll_all(q, d, 1), 1);
    CHECK_EQ(d[0].id, 7);
    for (size_t k = 0; k < NKEYS; k++)
        CHECK_EQ(d[0].results[k], CHUNK);
    CHECK(memcmp(e->src, e->dst, (size_t)NKEYS * CHUNK) == 0);
    free_done(d, 1);
    /* a put of keys that exist moves nothing and succeeds */
    job_args("rt", e->src, 0, 2, names, keys, iovs);
    CHECK_EQ(kvp_xq_submit(q, 8, KVP_XQ_PUT, keys, iovs, 2), 0);
    CHECK_EQ(poll_all(q, d, 1), 1);
    CHECK_EQ(d[0].results[0], 0);
    CHECK_EQ(d[0].bytes, 0);
    free_done(d, 1);
    kvp_xq_destroy(q);
}

TEST(xq_roundtrip)
{
    env e;
    if (env_up(&e) == 0)
        body_roundtrip(&e);
    env_down(&e);
}

static void body_missing(env *e)
{
    kvp_xq *q = NULL;
    CHECK_EQ(kvp_xq_create(e->c, 2, NULL, &q), 0);
    char names[2][32];
    const char *keys[2];
    kvp_iov iovs[2];
    job_args("mi", e->src, 0, 1, names, keys, iovs);
    CHECK_EQ(kvp_xq_submit(q, 1, KVP_XQ_PUT, keys, iovs, 1), 0);
    kvp_xq_done d[1];
    CHECK_EQ(poll_all(q, d, 1), 1);
    free_done(d, 1);
    job_args("mi", e->dst, 0, 2, names, keys, iovs); /* mi-0 stored, mi-1 not */
    CHECK_EQ(kvp_xq_submit(q, 2, KVP_XQ_GET, keys, iovs, 2), 0);
    CHECK_EQ(poll_all(q, d, 1), 1);
    CHECK_EQ(d[0].results[0], CHUNK);
    CHECK_EQ(d[0].results[1], KVP_EOBJECT_NOT_FOUND);
    CHECK_EQ(d[0].bytes, CHUNK);
    CHECK(memcmp(e->src, e->dst, CHUNK) == 0);
    free_done(d, 1);
    kvp_xq_destroy(q);
}

TEST(xq_missing_key_fails_alone)
{
    env e;
    if (env_up(&e) == 0)
        body_missing(&e);
    env_down(&e);
}

static int refuse(void *arg)
{
    (void)arg;
    return KVP_ECLOSED;
}

static void body_refused(env *e)
{
    kvp_xq *q = NULL;
    CHECK_EQ(kvp_xq_create(e->c, 0, NULL, &q), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_xq_create(e->c, 65, NULL, &q), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_xq_create(e->c, 1, NULL, &q), 0);
    char names[2][32];
    const char *keys[2];
    kvp_iov iovs[2];
    job_args("bad", e->src, 0, 2, names, keys, iovs);
    CHECK_EQ(kvp_xq_submit(q, 1, 3, keys, iovs, 2), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_xq_submit(q, 1, KVP_XQ_PUT, keys, iovs, 0), KVP_EINVALID_PARAMS);
    const char *nullkey[2] = {keys[0], NULL};
    CHECK_EQ(kvp_xq_submit(q, 1, KVP_XQ_PUT, nullkey, iovs, 2), KVP_EINVALID_PARAMS);
    kvp_iov nulliov[1] = {{NULL, 5}};
    CHECK_EQ(kvp_xq_submit(q, 1, KVP_XQ_PUT, keys, nulliov, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_xq_pending(q), 0);
    kvp_xq_destroy(q);
    /* a hook that refuses: every key gets its code, nothing stored */
    kvp_xq_hooks h = {refuse, NULL, NULL};
    CHECK_EQ(kvp_xq_create(e->c, 1, &h, &q), 0);
    CHECK_EQ(kvp_xq_submit(q, 9, KVP_XQ_PUT, keys, iovs, 2), 0);
    kvp_xq_done d[1];
    CHECK_EQ(poll_all(q, d, 1), 1);
    CHECK_EQ(d[0].results[0], KVP_ECLOSED);
    CHECK_EQ(d[0].results[1], KVP_ECLOSED);
    free_done(d, 1);
    kvp_xq_destroy(q);
    int ex[1] = {1};
    CHECK_EQ(kvp_client_exist(e->c, keys, 1, ex), 0);
    CHECK_EQ(ex[0], 0);
}

TEST(xq_bad_arguments_and_refusing_hook)
{
    env e;
    if (env_up(&e) == 0)
        body_refused(&e);
    env_down(&e);
}

static void body_destroy(env *e)
{
    kvp_xq *q = NULL;
    CHECK_EQ(kvp_xq_create(e->c, 2, NULL, &q), 0);
    char names[NKEYS][32];
    const char *keys[NKEYS];
    kvp_iov iovs[NKEYS];
    job_args("ds", e->src, 0, NKEYS, names, keys, iovs);
    for (int j = 0; j < NKEYS; j++)
        CHECK_EQ(kvp_xq_submit(q, (uint64_t)j, KVP_XQ_PUT, keys + j, iovs + j, 1), 0);
    kvp_xq_destroy(q); /* runs what is queued, frees the unpolled results */
    int ex[NKEYS];
    CHECK_EQ(kvp_client_exist(e->c, keys, NKEYS, ex), 0);
    for (int j = 0; j < NKEYS; j++)
        CHECK_EQ(ex[j], 1);
}

TEST(xq_destroy_runs_queued_and_frees_unpolled)
{
    env e;
    if (env_up(&e) == 0)
        body_destroy(&e);
    env_down(&e);
}
