/* test_sim_mamba.c -- `kvpool sim --mamba` against a real master + storage
 * node: a hybrid model (full attention + a Mamba group in vLLM's align
 * mode) whose engine hands off the Mamba state block at each boundary
 * (boundary_state_offloads). Hits need both the attention blocks and the
 * Mamba state at the hit point; every loaded byte (the state included) is
 * checked against what computing it would give. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "proc.h"

/* Runs the simulator on a fresh 256 MiB pool with the workload below plus
 * extra flags; the parsed --json summary (NULL after a failed check). */
static json_t *run_mamba(const char *duration, const char *const *extra)
{
    tp_master m;
    tp_store st;
    memset(&m, 0, sizeof m);
    memset(&st, 0, sizeof st);
    if (tp_master_start(&m, NULL) != 0 ||
        tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "256MiB", NULL}) != 0) {
        th_fail(__FILE__, __LINE__, "pool up");
        tp_store_stop(&st);
        tp_master_stop(&m);
        return NULL;
    }
    const char *flags[16] = {"--mamba"};
    for (size_t i = 0; extra && extra[i] && i + 2 < sizeof flags / sizeof flags[0]; i++)
        flags[i + 1] = extra[i];
    static char out[16384];
    int rc = tp_sim_run(m.addr, "2", duration, flags, out, sizeof out);
    int down = tp_store_stop(&st) | tp_master_stop(&m);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    if (rc != 0 || !j || down != 0) {
        th_fail(__FILE__, __LINE__, "sim exit %d, output: %s", rc, out);
        json_decref(j);
        return NULL;
    }
    return j;
}

static uint64_t jnum(json_t *j, const char *k)
{
    json_t *v = json_object_get(j, k);
    return json_is_integer(v) ? (uint64_t)json_integer_value(v) : (uint64_t)-1;
}

/* hits > 0, Mamba states verified, nothing corrupt */
static void check_hybrid(json_t *j)
{
    uint64_t hits = jnum(j, "hits"), mm = jnum(j, "mismatches"),
             ms = jnum(j, "mamba_states_verified"), ver = jnum(j, "blocks_verified"),
             ho = jnum(j, "mamba_states_handed_off");
    CHECK(json_is_true(json_object_get(j, "mamba")));
    CHECK(hits > 0 && hits != (uint64_t)-1);
    CHECK_EQ(mm, 0);
    CHECK(ms > 0 && ms != (uint64_t)-1);
    CHECK(ho > 0 && ho != (uint64_t)-1);
    /* per loaded request: every hit chunk of group 0, ONE state of group 1 */
    CHECK(ms < ver - ms);
    CHECK(json_is_true(json_object_get(j, "ok")));
}

TEST(sim_mamba_tp2_hits_and_no_mismatch)
{
    json_t *j = run_mamba("3", NULL);
    CHECK(j != NULL);
    if (j)
        check_hybrid(j);
    json_decref(j);
}

/* Chunked prefill and decode: several boundaries a request (each chunk end
 * and the prompt checkpoint); decode-time states, past the prefill end,
 * are handed off but never stored. */
TEST(sim_mamba_chunked_decode_no_mismatch)
{
    json_t *j = run_mamba("0", (const char *const[]){"--chunk", "40", "--decode", NULL});
    CHECK(j != NULL);
    if (j) {
        check_hybrid(j);
        CHECK_EQ(jnum(j, "decode_tokens"), 18 * 32);
    }
    json_decref(j);
}

/* Preemption (blocks reused at once) with pipeline stages. */
TEST(sim_mamba_preemption_pp2_no_mismatch)
{
    json_t *j = run_mamba("2", (const char *const[]){"--chunk", "32", "--decode",
                                                     "--preempt-every", "5", "--pp", "2",
                                                     "--layers", "2", NULL});
    CHECK(j != NULL);
    if (j) {
        check_hybrid(j);
        uint64_t pre = jnum(j, "preemptions");
        CHECK(pre > 0 && pre != (uint64_t)-1);
    }
    json_decref(j);
}

/* The check sees a damaged state: --corrupt flips a byte of every Nth
 * verified block (attention or Mamba). */
TEST(sim_mamba_corruption_is_caught)
{
    json_t *j = NULL;
    tp_master m;
    tp_store st;
    memset(&m, 0, sizeof m);
    memset(&st, 0, sizeof st);
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    CHECK_EQ(tp_store_start(&st, m.addr, (const char *const[]){"--segment-size", "256MiB", NULL}),
             0);
    const char *argv[] = {tp_kvpool_bin(), "sim", "--master", m.addr, "--instances", "2",
                          "--tp", "1", "--duration", "0", "--users", "4", "--turns", "3",
                          "--system-prompt-tokens", "256", "--turn-tokens", "64", "--json",
                          "--mamba", "--corrupt", "1", NULL};
    static char out[16384];
    int rc = tp_run_capture(argv, 1, out, sizeof out, 60000);
    CHECK_EQ(tp_store_stop(&st), 0);
    CHECK_EQ(tp_master_stop(&m), 0);
    CHECK(rc != 0);
    json_error_t e;
    j = json_loads(out, 0, &e);
    CHECK(j != NULL);
    if (j) {
        uint64_t mm = jnum(j, "mismatches"), ver = jnum(j, "blocks_verified");
        CHECK(mm > 0 && mm == ver);
        CHECK(json_is_false(json_object_get(j, "ok")));
    }
    json_decref(j);
}

TEST(sim_mamba_with_swa_refused)
{
    const char *argv[] = {tp_kvpool_bin(), "sim", "--mamba", "--swa", "40", NULL};
    static char out[2048];
    int rc = tp_run_capture(argv, 2, out, sizeof out, 10000);
    CHECK_EQ(rc, 2);
    CHECK(strstr(out, "--mamba") != NULL);
}

