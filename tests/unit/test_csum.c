/* test_csum.c -- kvp_csum (common/csum.h): every implementation this CPU
 * runs gives libxxhash's XXH3_64bits, one-shot and streamed in pieces of
 * any size at any alignment; concurrent first use picks one implementation. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/csum.h"
#include "harness.h"

#define BUF (3u << 20)

static unsigned char *make_buf(void)
{
    unsigned char *b = malloc(BUF + 64);
    if (!b)
        return NULL;
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < BUF + 64; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        b[i] = (unsigned char)s;
    }
    return b;
}

/* Streams p[0..len) in pieces cycling through `cuts`. */
static uint64_t streamed(const unsigned char *p, size_t len, const size_t *cuts, size_t ncuts)
{
    kvp_csum st;
    kvp_csum_reset(&st);
    for (size_t o = 0, k = 0; o < len; k++) {
        size_t c = cuts[k % ncuts];
        if (c > len - o)
            c = len - o;
        kvp_csum_update(&st, p + o, c);
        o += c;
    }
    return kvp_csum_digest(&st);
}

/* Every length 0..2100 (short, mid and first long inputs) at 4 alignments,
 * then long ones across stripe (64 B), block (1 KiB) and chunk sizes, one
 * shot and in pieces of odd sizes (1 B and 0 B pieces included). */
static int check_impl(const unsigned char *b)
{
    int bad = 0;
    for (size_t len = 0; len <= 2100; len++)
        for (size_t a = 0; a < 4; a++)
            bad += kvp_csum64(b + a, len) != XXH3_64bits(b + a, len);
    static const size_t lens[] = {240, 241, 1023, 1024, 1025, 4096 + 63, 65536, 131071,
                                  131072, 131073, 524288 + 7, 2u << 20, BUF};
    static const struct {
        size_t n, c[5];
    } cuts[] = {{5, {1, 0, 7, 64, 1000}},     {5, {63, 65, 1024, 3, 0}},
                {5, {4096, 1, 131072, 17, 0}}, {1, {131072}},
                {2, {200000, 5}},              {1, {BUF}}};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        size_t len = lens[i] <= BUF - 1 ? lens[i] : BUF - 1;
        uint64_t want = XXH3_64bits(b + 1, len);
        bad += kvp_csum64(b + 1, len) != want;
        for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
            if (streamed(b + 1, len, cuts[c].c, cuts[c].n) != want) {
                fprintf(stderr, "    %s: %zu bytes in pieces of set %zu differ\n", kvp_csum_impl(),
                        len, c);
                bad++;
            }
        }
    }
    return bad;
}

static void *first_use(void *arg)
{
    const unsigned char *b = arg;
    int ok = 1;
    for (int i = 0; i < 64; i++)
        ok &= kvp_csum64(b + i, 100000 + (size_t)i) == XXH3_64bits(b + i, 100000 + (size_t)i);
    return ok ? arg : NULL;
}

/* Threads racing on the first use (TSan: no race on the choice). */
TEST(csum_threads)
{
    unsigned char *b = make_buf();
    CHECK(b != NULL);
    CHECK_EQ(kvp_csum_force("auto"), 0); /* the choice is made again, by the threads */
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, first_use, b), 0);
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        CHECK(r != NULL);
    }
    CHECK(kvp_csum64(b, 100000) == XXH3_64bits(b, 100000));
    free(b);
}

TEST(csum_equals_xxh3_every_impl)
{
    unsigned char *b = make_buf();
    CHECK(b != NULL);
    printf("  default implementation: %s\n", kvp_csum_impl());
    int ran = 0;
    static const char *const impls[] = {"avx2", "sse2", "generic"};
    for (size_t i = 0; i < 3; i++) {
        if (kvp_csum_force(impls[i]) != 0)
            continue; /* not on this CPU / architecture */
        ran++;
        CHECK(!strcmp(kvp_csum_impl(), impls[i]));
        CHECK_EQ(check_impl(b), 0);
    }
    CHECK(ran >= 1);
    CHECK_EQ(kvp_csum_force("nonsense"), -1);
    CHECK_EQ(kvp_csum_force("auto"), 0);
    free(b);
}

