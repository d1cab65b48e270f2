/* test_sim.c -- `kvpool sim` against a real master + storage node: every
 * loaded block is verified by the simulator; the JSON summary must show
 * hits and no mismatch. Also: the self-check (--corrupt) is caught, and
 * bad flags are named. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "proc.h"

typedef struct pool {
    tp_master m;
    tp_store st;
} pool;

static int pool_up2(pool *p, const char *segment)
{
    memset(p, 0, sizeof *p);
    if (tp_master_start(&p->m, NULL) != 0)
        return -1;
    return tp_store_start(&p->st, p->m.addr,
                          (const char *const[]){"--segment-size", segment, NULL});
}

static int pool_up(pool *p) { return pool_up2(p, "256MiB"); }

static void pool_down(pool *p)
{
    CHECK_EQ(tp_store_stop(&p->st), 0);
    CHECK_EQ(tp_master_stop(&p->m), 0);
}

/* Runs the simulator with the workload below; out gets stdout. */
static int sim(const pool *p, const char *tp, const char *duration, const char *extra,
               char *out, size_t outlen)
{
    const char *argv[] = {tp_kvpool_bin(), "sim", "--master", p->m.addr, "--instances", "2",
                          "--tp", tp, "--duration", duration, "--users", "6", "--turns", "3",
                          "--system-prompt-tokens", "256", "--turn-tokens", "64",
                          "--reply-tokens", "32", "--json", extra,
                          extra && !strcmp(extra, "--corrupt") ? "1" : NULL, NULL};
    return tp_run_capture(argv, 1, out, outlen, 60000);
}

static uint64_t jnum(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    return json_is_integer(v) ? (uint64_t)json_integer_value(v) : (uint64_t)-1;
}

static void run_ok3(const char *tp, const char *duration, const char *segment, const char *flag)
{
    pool p;
    if (pool_up2(&p, segment) != 0) {
        CHECK(!"pool up");
        return;
    }
    static char out[8192];
    int rc = sim(&p, tp, duration, flag, out, sizeof out);
    CHECK_EQ(rc, 0);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    CHECK(j != NULL);
    if (j) {
        uint64_t req = jnum(j, "requests"), hits = jnum(j, "hits"),
                 ver = jnum(j, "blocks_verified"), mm = jnum(j, "mismatches"),
                 st = jnum(j, "bytes_stored"), ld = jnum(j, "bytes_loaded");
        int ok = json_is_true(json_object_get(j, "ok"));
        json_decref(j);
        CHECK(req > 0 && req != (uint64_t)-1);
        CHECK(hits > 0 && hits != (uint64_t)-1);
        CHECK(ver > 0 && ver != (uint64_t)-1);
        CHECK_EQ(mm, 0);
        CHECK(st > 0 && ld > 0);
        CHECK(ok);
    } else {
        fprintf(stderr, "    sim output: %s\n", out);
    }
    pool_down(&p);
}

static void run_ok2(const char *tp, const char *duration, const char *segment)
{
    run_ok3(tp, duration, segment, NULL);
}

static void run_ok(const char *tp, const char *duration) { run_ok2(tp, duration, "256MiB"); }

TEST(sim_two_instances_tp2_hits_and_no_mismatch) { run_ok("2", "4"); }

TEST(sim_two_instances_tp1_hits_and_no_mismatch) { run_ok("1", "3"); }

TEST(sim_single_pass_finishes) { run_ok("2", "0"); }

/* MLA: one latent plane, identical on both ranks (TP factor 2). */
TEST(sim_mla_tp2_hits_and_no_mismatch) { run_ok3("2", "3", "256MiB", "--mla"); }

/* A pool far smaller than the working set: evictions between lookup and
 * load turn into load errors, which must be recomputed, never mismatch. */
TEST(sim_under_eviction_pressure_no_mismatch) { run_ok2("2", "3", "8MiB"); }

TEST(sim_corruption_is_caught)
{
    pool p;
    if (pool_up(&p) != 0) {
        CHECK(!"pool up");
        return;
    }
    static char out[8192];
    int rc = sim(&p, "1", "2", "--corrupt", out, sizeof out);
    CHECK_EQ(rc, 1);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    CHECK(j != NULL);
    if (j) {
        uint64_t mm = jnum(j, "mismatches");
        int bad = json_is_false(json_object_get(j, "ok"));
        json_decref(j);
        CHECK(mm > 0 && mm != (uint64_t)-1);
        CHECK(bad);
    }
    pool_down(&p);
}

TEST(sim_bad_flags_are_named)
{
    static char err[4096];
    const char *a1[] = {tp_kvpool_bin(), "sim", "--users", "x", NULL};
    CHECK_EQ(tp_run_capture(a1, 2, err, sizeof err, 10000), 2);
    CHECK(strstr(err, "--users") != NULL);
    const char *a2[] = {tp_kvpool_bin(), "sim", "--bogus", "1", NULL};
    CHECK_EQ(tp_run_capture(a2, 2, err, sizeof err, 10000), 2);
    CHECK(strstr(err, "--bogus") != NULL);
    const char *a3[] = {tp_kvpool_bin(), "sim", "--duration", "-1", NULL};
    CHECK_EQ(tp_run_capture(a3, 2, err, sizeof err, 10000), 2);
    CHECK(strstr(err, "--duration") != NULL);
    const char *a4[] = {tp_kvpool_bin(), "sim", "--num-blocks", "4", NULL};
    CHECK_EQ(tp_run_capture(a4, 2, err, sizeof err, 10000), 2);
    CHECK(strstr(err, "--num-blocks") != NULL);
    const char *a5[] = {tp_kvpool_bin(), "sim", "--help", NULL};
    CHECK_EQ(tp_run_capture(a5, 1, err, sizeof err, 10000), 0);
    CHECK(strstr(err, "usage: kvpool sim") != NULL);
}
