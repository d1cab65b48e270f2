/*
 * test_index.c -- the master's key index against a reference model,
 * including removals and lookups while a growth is being drained.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kvpool.h"
#include "master/index.h"

#define N 60000

static kvp_obj *mkobj(int k, uint16_t tenant)
{
    char key[32];
    int len = snprintf(key, sizeof key, "k%d", k);
    kvp_obj *o = calloc(1, kvp_obj_bytes((uint16_t)len, 1, 0));
    o->keylen = (uint16_t)len;
    o->tenant = tenant;
    memcpy((uint8_t *)(o + 1), key, (size_t)len);
    return o;
}

static kvp_obj *lookup(kvp_index *ix, int k, uint16_t tenant)
{
    char key[32];
    int len = snprintf(key, sizeof key, "k%d", k);
    return kvp_index_find(ix, kvp_index_hash(tenant, (const uint8_t *)key, (uint32_t)len), tenant,
                          (const uint8_t *)key, (uint32_t)len);
}

static int verify(kvp_index *ix, kvp_obj **model)
{
    uint64_t n = 0;
    for (int k = 0; k < N; k++) {
        REQUIRE(lookup(ix, k, 1) == model[k]);
        n += model[k] != NULL;
    }
    REQUIRE(ix->count == n);
    REQUIRE(lookup(ix, 5, 2) == NULL); /* other tenant */
    return 0;
}

TEST(index_model_with_incremental_growth)
{
    kvp_index ix;
    CHECK(kvp_index_init(&ix, 0) == 0);
    kvp_obj **model = calloc(N, sizeof *model);
    unsigned seed = 12345;
    int saw_drain = 0;
    for (int round = 0; round < 400000; round++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % N);
        int op = (int)((seed >> 4) & 7);
        if (ix.old)
            saw_drain = 1;
        if (op < 5 && !model[k]) { /* insert, biased so the table grows */
            kvp_obj *o = mkobj(k, 1);
            CHECK(kvp_index_reserve(&ix) == 0);
            kvp_index_insert(&ix, kvp_index_hash(1, kvp_obj_key(o), o->keylen), o);
            model[k] = o;
        } else if (op >= 5 && model[k]) {
            kvp_index_remove(&ix, model[k]);
            free(model[k]);
            model[k] = NULL;
        }
        if ((round & 1023) == 0 && ix.old)
            kvp_index_step(&ix, seed % 50);
        if ((round % 20000) == 0)
            CHECK(verify(&ix, model) == 0);
    }
    CHECK(saw_drain);
    CHECK(verify(&ix, model) == 0);
    kvp_index_settle(&ix);
    CHECK(ix.old == NULL);
    CHECK(verify(&ix, model) == 0);
    /* remove everything while a fresh growth is draining */
    for (int k = 0; k < N; k++)
        if (model[k]) {
            kvp_index_remove(&ix, model[k]);
            free(model[k]);
            model[k] = NULL;
            if (k % 97 == 0)
                CHECK(verify(&ix, model) == 0);
        }
    CHECK_EQ(ix.count, 0);
    kvp_index_free(&ix);
    free(model);
}
