/*
 * test_index_scan.c -- the index's resumable whole-table scan (the one a
 * REMOVE_ALL / REMOVE_REGEX spreads over loop turns): every entry present
 * from the scan's start to its end is returned at least once, while
 * removals (backward shifts), inserts and growths happen between steps,
 * including removals by the scanner itself.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvpool.h"
#include "master/index.h"

#define N 48000 /* 3/4 of 65536 is 49152: inserts meanwhile make a growth */

static kvp_obj *mkobj(int k)
{
    char key[32];
    int len = snprintf(key, sizeof key, "s%d", k);
    kvp_obj *o = calloc(1, kvp_obj_bytes((uint16_t)len, 1, 0));
    o->keylen = (uint16_t)len;
    o->tenant = 1;
    memcpy((uint8_t *)(o + 1), key, (size_t)len);
    return o;
}

static void add(kvp_index *ix, kvp_obj **model, int k)
{
    model[k] = mkobj(k);
    if (kvp_index_reserve(ix) != 0)
        abort();
    kvp_index_insert(ix, kvp_index_hash(1, kvp_obj_key(model[k]), model[k]->keylen), model[k]);
}

static void del(kvp_index *ix, kvp_obj **model, int k)
{
    kvp_index_remove(ix, model[k]);
    free(model[k]);
    model[k] = NULL;
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* One scan under churn; `self_remove`: the scanner removes what it sees
 * with an even number (as REMOVE_ALL does). */
static int scan_under_churn(int self_remove)
{
    kvp_index ix;
    REQUIRE(kvp_index_init(&ix, 0) == 0);
    kvp_obj **model = calloc(4 * N, sizeof *model);
    uint8_t *seen = calloc(4 * N, 1), *stayed = calloc(4 * N, 1);
    for (int k = 0; k < N; k++)
        add(&ix, model, k);
    for (int k = 0; k < N; k++)
        stayed[k] = 1; /* present at the start; cleared when removed */
    int next = N;
    uint64_t gen0 = ix.gen;
    kvp_index_scan sc;
    kvp_index_scan_start(&ix, &sc);
    unsigned steps = 0;
    while (!sc.done) {
        uint64_t budget = KVP_INDEX_SLOT_COST * (1 + rnd(64));
        kvp_obj *o;
        while ((o = kvp_index_scan_next(&ix, &sc, &budget)) != NULL) {
            int k = atoi((const char *)kvp_obj_key(o) + 1);
            REQUIRE(model[k] == o);
            seen[k] = 1;
            if (self_remove && k % 2 == 0) {
                del(&ix, model, k);
                stayed[k] = 0;
            }
        }
        /* between steps: removals anywhere, inserts (growths now and then) */
        for (int r = 0; r < 2; r++) {
            int k = (int)rnd((unsigned)next);
            if (model[k]) {
                del(&ix, model, k);
                stayed[k] = 0;
            }
        }
        for (int r = 0; r < 6 && next < 4 * N; r++)
                add(&ix, model, next++);
        steps++;
    }
    kvp_index_scan_stop(&ix, &sc);
    int missed = 0;
    for (int k = 0; k < N; k++)
        if (stayed[k] && !seen[k])
            missed++;
    uint64_t grew = ix.gen - gen0;
    printf("    %u steps, %d inserted, %llu growths meanwhile, %d missed\n", steps, next - N,
           (unsigned long long)grew, missed);
    for (int k = 0; k < next; k++)
        if (model[k])
            del(&ix, model, k);
    kvp_index_free(&ix);
    free(model);
    free(seen);
    free(stayed);
    REQUIRE(missed == 0);
    REQUIRE(steps > 100);
    REQUIRE(self_remove || grew >= 1); /* the scanner removing half: no growth */
    return 0;
}

TEST(scan_sees_everything_that_stays)
{
    CHECK(scan_under_churn(0) == 0);
}

TEST(scan_that_removes_what_it_sees)
{
    CHECK(scan_under_churn(1) == 0);
}

/* Several scans at once (a removal job, each follower's snapshot, the
 * snapshot file's rewrite), started at different moments and advanced at
 * different paces under churn and growths: each returns every entry
 * present from its own start to its own end. */
#define NSC 3
TEST(several_scans_at_once)
{
    kvp_index ix;
    if (kvp_index_init(&ix, 0) != 0) {
        CHECK(0);
        return;
    }
    kvp_obj **model = calloc(4 * N, sizeof *model);
    uint8_t *seen[NSC], *stayed[NSC];
    for (int i = 0; i < NSC; i++) {
        seen[i] = calloc(4 * N, 1);
        stayed[i] = calloc(4 * N, 1);
    }
    for (int k = 0; k < N; k++)
        add(&ix, model, k);
    int next = N, started = 0, running = 0;
    kvp_index_scan sc[NSC];
    uint64_t gen0 = ix.gen;
    for (unsigned step = 0; started < NSC || running; step++) {
        if (started < NSC && step % 50 == 0) { /* a new scan: what is there now must be seen */
            for (int k = 0; k < next; k++)
                stayed[started][k] = model[k] != NULL;
            kvp_index_scan_start(&ix, &sc[started++]);
            running++;
        }
        for (int i = 0; i < started; i++) {
            if (sc[i].done)
                continue;
            uint64_t budget = KVP_INDEX_SLOT_COST * (1 + rnd(48 * (unsigned)(i + 1)));
            kvp_obj *o;
            while ((o = kvp_index_scan_next(&ix, &sc[i], &budget)) != NULL)
                seen[i][atoi((const char *)kvp_obj_key(o) + 1)] = 1;
            if (sc[i].done) {
                kvp_index_scan_stop(&ix, &sc[i]);
                running--;
            }
        }
        for (int r = 0; r < 2; r++) {
            int k = (int)rnd((unsigned)next);
            if (model[k]) {
                del(&ix, model, k);
                for (int i = 0; i < NSC; i++)
                    stayed[i][k] = 0;
            }
        }
        for (int r = 0; r < 6 && next < 4 * N; r++)
            add(&ix, model, next++);
    }
    int missed = 0;
    for (int i = 0; i < NSC; i++)
        for (int k = 0; k < next; k++)
            if (stayed[i][k] && !seen[i][k])
                missed++;
    printf("    %d scans, %llu growths meanwhile, %d missed\n", NSC,
           (unsigned long long)(ix.gen - gen0), missed);
    for (int k = 0; k < next; k++)
        if (model[k])
            del(&ix, model, k);
    kvp_index_free(&ix);
    free(model);
    for (int i = 0; i < NSC; i++) {
        free(seen[i]);
        free(stayed[i]);
    }
    CHECK(missed == 0);
    CHECK(ix.gen - gen0 >= 1);
    CHECK(ix.scans == NULL);
}
