/* test_bench_segment.c -- `kvpool bench segment` runs end to end on a small
 * segment (a real `kvpool serve`, a fresh client process) and its JSON has
 * the figures the README's table is made of; a size the machine cannot
 * back is reported as refused, with the node's own message (the benchmark
 * does not bypass the size check). The figures themselves are machine
 * dependent: only their presence and sanity are checked. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"
#include "proc.h"

static char out[1 << 16];

/* The JSON `kvpool bench segment <args> --json` prints (NULL on failure,
 * reported). */
static json_t *run_json(const char *const *args)
{
    const char *argv[16] = {tp_kvpool_bin(), "bench", "segment"};
    int n = 3;
    for (int i = 0; args[i] && n < 14; i++)
        argv[n++] = args[i];
    argv[n++] = "--json";
    argv[n] = NULL;
    int rc = tp_run_capture(argv, 1, out, sizeof out, 240000);
    if (rc != 0) {
        th_fail(__FILE__, __LINE__, "kvpool bench segment exited %d:\n%s", rc, out);
        return NULL;
    }
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (!j)
        th_fail(__FILE__, __LINE__, "not JSON (%s):\n%s", e.text, out);
    return j;
}

/* A {"median", "min", "max"} object with min <= median <= max, all >= 0. */
static int stat_ok(json_t *cfg, const char *name)
{
    json_t *s = json_object_get(cfg, name);
    double md = json_number_value(json_object_get(s, "median"));
    double lo = json_number_value(json_object_get(s, "min"));
    double hi = json_number_value(json_object_get(s, "max"));
    if (!json_is_object(s) || lo < 0 || lo > md || md > hi) {
        th_fail(__FILE__, __LINE__, "field %s: %s", name, s ? "not a sane range" : "missing");
        return 0;
    }
    return 1;
}

TEST(small_segment_one_round)
{
    json_t *j = run_json((const char *const[]){"--size", "256MiB", "--rounds", "1", "--puts",
                                               "20", NULL});
    if (!j)
        return;
    CHECK(!strcmp(json_string_value(json_object_get(j, "bench")), "segment"));
    CHECK_EQ(json_integer_value(json_object_get(j, "rounds")), 1);
    json_t *cfgs = json_object_get(j, "configs");
    CHECK(json_array_size(cfgs) == 1);
    json_t *c = json_array_get(cfgs, 0);
    CHECK_EQ(json_integer_value(json_object_get(c, "size_bytes")), 256ll << 20);
    CHECK(!strcmp(json_string_value(json_object_get(c, "pages")), "regular"));
    CHECK(!strcmp(json_string_value(json_object_get(c, "status")), "ok"));
    static const char *const always[] = {
        "port_file_ms", "ready_ms",     "first_put_ms",        "client_open_ms",
        "attach_ms",    "first_put_4k_us", "steady_put_4k_us", "rss_after_attach_kb",
        "peak_rss_kb",  "prefault_s",   "prefault_gbps",       "after_puts",
        "after_p50_us", "after_p99_us", "after_populate_share", NULL};
    for (int i = 0; always[i]; i++)
        CHECK(stat_ok(c, always[i]));
    /* in order: the port file, then /readyz, then a put */
    double port = json_number_value(json_object_get(json_object_get(c, "port_file_ms"), "median"));
    double ready = json_number_value(json_object_get(json_object_get(c, "ready_ms"), "median"));
    double put = json_number_value(json_object_get(json_object_get(c, "first_put_ms"), "median"));
    CHECK(port > 0 && port <= ready && ready <= put);
    CHECK_EQ(json_number_value(json_object_get(json_object_get(c, "after_puts"), "median")), 20);
    /* the prefault may finish before the client's first timed put: then
     * the during-phase fields are null, never garbage */
    json_t *d = json_object_get(c, "during_p50_us");
    CHECK(json_is_null(d) || stat_ok(c, "during_p50_us"));
    json_t *g = json_object_get(c, "goals_met");
    CHECK(json_is_boolean(json_object_get(g, "ready")) &&
          json_is_boolean(json_object_get(g, "attach")));
    json_t *r = json_array_get(json_object_get(c, "per_round"), 0);
    CHECK(json_is_true(json_object_get(r, "ok")));
    CHECK(!strcmp(json_string_value(json_object_get(r, "transport")), "shm"));
    CHECK_EQ(json_integer_value(json_object_get(r, "attaches")), 1);
    /* a fresh client did not map the segment up front: its RSS after the
     * attach is far below the 256 MiB it mapped */
    CHECK(json_number_value(json_object_get(r, "rss_after_attach_kb")) < 128 * 1024);
    json_decref(j);
}

TEST(size_beyond_the_machine_is_refused)
{
    json_t *j = run_json((const char *const[]){"--size", "32TiB", "--rounds", "2", NULL});
    if (!j)
        return;
    json_t *c = json_array_get(json_object_get(j, "configs"), 0);
    CHECK(!strcmp(json_string_value(json_object_get(c, "status")), "skipped"));
    const char *why = json_string_value(json_object_get(c, "reason"));
    CHECK(why && strstr(why, "refused: kvpool serve: segment size 32.0 TiB exceeds the memory"));
    json_decref(j);
}

TEST(usage_errors)
{
    const char *const bad[][3] = {{"--rounds", "0", NULL},
                                  {"--size", "1KiB", NULL},
                                  {"--size", "4GiB,", NULL},
                                  {"--puts", "x", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *argv[] = {tp_kvpool_bin(), "bench", "segment", bad[i][0], bad[i][1], NULL};
        CHECK_EQ(tp_run_capture(argv, 2, out, sizeof out, 20000), 2);
        CHECK(strstr(out, "kvpool bench segment: flag --") != NULL);
    }
    const char *help[] = {tp_kvpool_bin(), "bench", "segment", "--help", NULL};
    CHECK_EQ(tp_run_capture(help, 1, out, sizeof out, 20000), 0);
    CHECK(strstr(out, "usage: kvpool bench segment") && strstr(out, "--hugetlb"));
}
