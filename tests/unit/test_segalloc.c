/* test_segalloc.c -- the per-segment page allocator (src/master/segalloc.c). */
#include "harness.h"
#include "master/segalloc.h"

#include "common/mem.h"
#include "kvpool.h"

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ helpers */

static uint64_t rng_state;

static void rng_seed(uint64_t s)
{
    rng_state = s ? s : 1;
}

static uint64_t rng_next(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t lo, uint64_t hi)
{
    return lo + rng_next() % (hi - lo + 1);
}

/*
 * n rounded up to its size-class boundary (32 linear classes per power of
 * two, exact below 32): a free block at least this big must be found.
 */
static uint64_t round_up_class(uint32_t n)
{
    if (n < 32)
        return n;
    unsigned f = 31u - (unsigned)__builtin_clz(n);
    uint64_t step = 1ull << (f - 5);
    return ((uint64_t)n + step - 1) / step * step;
}

typedef struct {
    uint32_t off, n;
    uint64_t bytes; /* requested value size (usable-fraction test) */
} range;

/* ------------------------------------------------------------- basic cases */

TEST(create_invalid)
{
    kvp_segalloc *a = NULL;
    CHECK_EQ(kvp_segalloc_create(0, &a), KVP_EINVALID_PARAMS);
    CHECK(a == NULL);
    CHECK_EQ(kvp_segalloc_create(1, &a), 0);
    CHECK_EQ(kvp_segalloc_pages(a), 1);
    CHECK_EQ(kvp_segalloc_free_pages(a), 1);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_largest_free(a), 1);
    uint32_t off = 99;
    CHECK_EQ(kvp_segalloc_alloc(a, 0, &off), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_segalloc_alloc(a, 2, &off), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_alloc(a, 1, &off), 0);
    CHECK_EQ(off, 0);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 0);
    CHECK_EQ(kvp_segalloc_largest_free(a), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 1, &off), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_free(a, 0, 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 1);
    kvp_segalloc_destroy(a);
    kvp_segalloc_destroy(NULL);
}

TEST(alloc_free_coalesce)
{
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(100, &a), 0);
    uint32_t x, y, z;
    CHECK_EQ(kvp_segalloc_alloc(a, 10, &x), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 20, &y), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 30, &z), 0);
    CHECK_EQ(x, 0);
    CHECK_EQ(y, 10);
    CHECK_EQ(z, 30);
    CHECK_EQ(kvp_segalloc_free_pages(a), 40);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);

    /* middle alone: new block between two allocated ones */
    kvp_segalloc_free(a, y, 20);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 2);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* first: merges with the right neighbour [10, 30) */
    kvp_segalloc_free(a, x, 10);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 2);
    CHECK_EQ(kvp_segalloc_largest_free(a), 40);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* last: merges with both neighbours */
    kvp_segalloc_free(a, z, 30);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_largest_free(a), 100);
    CHECK_EQ(kvp_segalloc_free_pages(a), 100);
    CHECK_EQ(kvp_segalloc_check(a), 0);

    /* left-only merge: free [0,10) then [10,30) with [30,..) still allocated */
    CHECK_EQ(kvp_segalloc_alloc(a, 10, &x), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 20, &y), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 70, &z), 0);
    CHECK_EQ(z, 30);
    kvp_segalloc_free(a, x, 10);
    kvp_segalloc_free(a, y, 20);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_largest_free(a), 30);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_free(a, z, 70);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}

TEST(exact_block_found)
{
    /* 101 is not a class boundary: its rounded-up class (102..) is empty,
     * so only the own-class scan finds the lone 101-page block. */
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(1000, &a), 0);
    uint32_t x, y, z;
    CHECK_EQ(kvp_segalloc_alloc(a, 101, &x), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 899, &y), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 0);
    kvp_segalloc_free(a, x, 101);
    CHECK_EQ(kvp_segalloc_alloc(a, 102, &z), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_alloc(a, 101, &z), 0);
    CHECK_EQ(z, 0);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* a smaller request splits the lone block (also via the scan) */
    kvp_segalloc_free(a, z, 101);
    CHECK_EQ(kvp_segalloc_alloc(a, 100, &z), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_free(a, z, 100);
    kvp_segalloc_free(a, y, 899);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}

TEST(full_segment_single_pages)
{
    const uint32_t np = 1u << 18;
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(np, &a), 0);
    for (uint32_t i = 0; i < np; i++) {
        uint32_t off;
        CHECK_EQ(kvp_segalloc_alloc(a, 1, &off), 0);
        CHECK_EQ(off, i);
    }
    uint32_t off;
    CHECK_EQ(kvp_segalloc_alloc(a, 1, &off), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 0);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* every other page: the maximum number of free blocks, all 1 page */
    for (uint32_t i = 0; i < np; i += 2)
        kvp_segalloc_free(a, i, 1);
    CHECK_EQ(kvp_segalloc_free_blocks(a), np / 2);
    CHECK_EQ(kvp_segalloc_largest_free(a), 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 2, &off), KVP_ENO_AVAILABLE_HANDLE);
    for (uint32_t i = 1; i < np; i += 2)
        kvp_segalloc_free(a, i, 1);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_free_pages(a), np);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}

TEST(max_segment_edges)
{
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(UINT32_MAX, &a), 0);
    uint32_t x, y;
    CHECK_EQ(kvp_segalloc_alloc(a, UINT32_MAX, &x), 0);
    CHECK_EQ(x, 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 0);
    kvp_segalloc_free(a, x, UINT32_MAX);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* rounding n up overflows 32 bits: only the own-class scan can find it */
    CHECK_EQ(kvp_segalloc_alloc(a, UINT32_MAX - 1, &x), 0);
    CHECK_EQ(kvp_segalloc_alloc(a, 1, &y), 0);
    CHECK_EQ(y, UINT32_MAX - 1);
    CHECK_EQ(kvp_segalloc_alloc(a, 1, &y), KVP_ENO_AVAILABLE_HANDLE);
    kvp_segalloc_free(a, UINT32_MAX - 1, 1);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_free(a, x, UINT32_MAX - 1);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_largest_free(a), UINT32_MAX);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}

TEST(out_of_space)
{
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(4096, &a), 0);
    uint32_t off;
    CHECK_EQ(kvp_segalloc_alloc(a, 4097, &off), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_alloc(a, UINT32_MAX, &off), KVP_ENO_AVAILABLE_HANDLE);
    /* 64 blocks of 32 free pages each, separated by allocated pages */
    uint32_t offs[128];
    for (int i = 0; i < 128; i++)
        CHECK_EQ(kvp_segalloc_alloc(a, 32, &offs[i]), 0);
    for (int i = 0; i < 128; i += 2)
        kvp_segalloc_free(a, offs[i], 32);
    CHECK_EQ(kvp_segalloc_free_pages(a), 2048);
    CHECK_EQ(kvp_segalloc_alloc(a, 33, &off), KVP_ENO_AVAILABLE_HANDLE);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 2048);
    CHECK_EQ(kvp_segalloc_alloc(a, 32, &off), 0);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}

/* ------------------------------------------------------ randomized model */

/* Largest free run and number of free runs in the page map. */
static void model_runs(const uint8_t *used, uint32_t np, uint32_t *largest, uint32_t *runs)
{
    uint32_t best = 0, cur = 0, nr = 0;
    for (uint32_t i = 0; i < np; i++) {
        if (used[i]) {
            cur = 0;
            continue;
        }
        if (cur++ == 0)
            nr++;
        if (cur > best)
            best = cur;
    }
    *largest = best;
    *runs = nr;
}

static uint32_t model_size(uint32_t np)
{
    uint64_t r = rng_next() % 100;
    uint64_t hi = r < 40 ? 16 : r < 75 ? 128 : r < 95 ? 1024 : np;
    if (hi > np)
        hi = np;
    return (uint32_t)rng_range(1, hi);
}

/*
 * 200k random operations against a page-map model. Returns -1 on the first
 * mismatch (reported by REQUIRE).
 */
static int run_model(uint64_t seed, uint32_t np, int ops, int check_every)
{
    rng_seed(seed);
    kvp_segalloc *a;
    REQUIRE(kvp_segalloc_create(np, &a) == 0);
    uint8_t *used = calloc(np, 1);
    range *live = calloc(np, sizeof *live);
    REQUIRE(used && live);
    uint32_t nlive = 0;
    uint64_t model_free = np;
    uint64_t fails = 0, fails_with_fit = 0, allocs = 0;

    for (int op = 0; op < ops; op++) {
        /* bias toward allocation so the segment runs full and fragments */
        int do_alloc = nlive == 0 || rng_next() % 100 < 55;
        if (do_alloc) {
            uint32_t n = model_size(np), off = 0;
            int rc = kvp_segalloc_alloc(a, n, &off);
            if (rc == 0) {
                allocs++;
                REQUIRE((uint64_t)off + n <= np);
                for (uint32_t i = off; i < off + n; i++) {
                    REQUIRE(!used[i]); /* never hands out overlapping ranges */
                    used[i] = 1;
                }
                live[nlive++] = (range){off, n, 0};
                model_free -= n;
            } else {
                REQUIRE(rc == KVP_ENO_AVAILABLE_HANDLE);
                uint32_t largest, runs;
                model_runs(used, np, &largest, &runs);
                fails++;
                /* a block of at least the rounded-up class must be found */
                REQUIRE(largest < round_up_class(n));
                if (largest >= n)
                    fails_with_fit++;
                REQUIRE(kvp_segalloc_largest_free(a) == largest);
            }
        } else {
            uint32_t k = (uint32_t)(rng_next() % nlive);
            range r = live[k];
            live[k] = live[--nlive];
            kvp_segalloc_free(a, r.off, r.n);
            for (uint32_t i = r.off; i < r.off + r.n; i++)
                used[i] = 0;
            model_free += r.n;
        }
        REQUIRE(kvp_segalloc_free_pages(a) == model_free);
        if (op % check_every == 0)
            REQUIRE(kvp_segalloc_check(a) == 0);
        if (op % 64 == 0) {
            uint32_t largest, runs;
            model_runs(used, np, &largest, &runs);
            REQUIRE(kvp_segalloc_free_blocks(a) == runs); /* fully coalesced */
            REQUIRE(kvp_segalloc_largest_free(a) == largest);
        }
    }
    /* drain */
    while (nlive) {
        range r = live[--nlive];
        kvp_segalloc_free(a, r.off, r.n);
    }
    REQUIRE(kvp_segalloc_check(a) == 0);
    REQUIRE(kvp_segalloc_free_blocks(a) == 1);
    REQUIRE(kvp_segalloc_free_pages(a) == np);
    printf("    seed %llu np %u: %llu allocs, %llu no-space (%llu with a block >= n "
           "below the rounded class)\n",
           (unsigned long long)seed, np, (unsigned long long)allocs,
           (unsigned long long)fails, (unsigned long long)fails_with_fit);
    free(used);
    free(live);
    kvp_segalloc_destroy(a);
    return 0;
}

TEST(random_model)
{
    static const uint64_t seeds[] = {1, 42, 0xdeadbeef, 20261129};
    for (unsigned i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
        CHECK(run_model(seeds[i], 8192, 200000, i == 0 ? 1 : 4) == 0);
    /* a small segment (lots of no-space answers, exact fits) */
    CHECK(run_model(7, 300, 200000, 1) == 0);
}

/* ------------------------------------------------------- usable fraction */

#define GIB (1ull << 30)
#define MIB (1ull << 20)
#define KIB (1ull << 10)

typedef struct {
    range *v;
    uint32_t n, cap;
    uint64_t bytes; /* requested bytes stored */
} store;

static int store_push(store *s, range r)
{
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 1024;
        range *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv)
            return -1;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = r;
    s->bytes += r.bytes;
    return 0;
}

static uint64_t value_size(int mix)
{
    return mix == 0 ? 2 * MIB + 17 : rng_range(512 * KIB, 4 * MIB);
}

/*
 * Stores values until the allocator refuses. Fixed sizes: the first refusal
 * ends it. Random sizes: a refusal only says that this size does not fit, so
 * it continues with fresh sizes and stops after 64 refusals in a row.
 */
static int fill(kvp_segalloc *a, store *s, int mix)
{
    int misses = 0, limit = mix == 0 ? 1 : 64;
    while (misses < limit) {
        uint64_t bytes = value_size(mix);
        uint32_t n = (uint32_t)((bytes + KVP_PAGE_SIZE - 1) / KVP_PAGE_SIZE), off;
        int rc = kvp_segalloc_alloc(a, n, &off);
        if (rc != 0) {
            REQUIRE(rc == KVP_ENO_AVAILABLE_HANDLE);
            misses++;
            continue;
        }
        misses = 0;
        REQUIRE(store_push(s, (range){off, n, bytes}) == 0);
    }
    return 0;
}

static int usable_fraction(int mix, double *worst)
{
    const uint64_t capacity = 64 * GIB;
    const uint32_t np = (uint32_t)(capacity / KVP_PAGE_SIZE);
    rng_seed(0x5eed + (uint64_t)mix);
    kvp_segalloc *a;
    REQUIRE(kvp_segalloc_create(np, &a) == 0);
    store s = {0};
    REQUIRE(fill(a, &s, mix) == 0);
    REQUIRE(kvp_segalloc_check(a) == 0);
    double f = (double)s.bytes / (double)capacity;
    *worst = f;
    printf("    mix %s: fill %.4f (%u values, %u free blocks, %llu free pages)\n",
           mix == 0 ? "2MiB+17" : "512KiB..4MiB", f, s.n, kvp_segalloc_free_blocks(a),
           (unsigned long long)kvp_segalloc_free_pages(a));
    for (int round = 1; round <= 5; round++) {
        /* free a random 30% */
        uint32_t drop = s.n * 3 / 10;
        for (uint32_t i = 0; i < drop; i++) {
            uint32_t k = (uint32_t)(rng_next() % s.n);
            kvp_segalloc_free(a, s.v[k].off, s.v[k].n);
            s.bytes -= s.v[k].bytes;
            s.v[k] = s.v[--s.n];
        }
        REQUIRE(fill(a, &s, mix) == 0);
        REQUIRE(kvp_segalloc_check(a) == 0);
        f = (double)s.bytes / (double)capacity;
        if (f < *worst)
            *worst = f;
        printf("    mix %s: churn round %d %.4f (%u values, %u free blocks, %llu free "
               "pages)\n",
               mix == 0 ? "2MiB+17" : "512KiB..4MiB", round, f, s.n,
               kvp_segalloc_free_blocks(a), (unsigned long long)kvp_segalloc_free_pages(a));
    }
    free(s.v);
    kvp_segalloc_destroy(a);
    return 0;
}

TEST(usable_fraction_fixed)
{
    double worst = 0;
    CHECK(usable_fraction(0, &worst) == 0);
    CHECK(worst >= 0.99);
}

TEST(usable_fraction_mixed)
{
    double worst = 0;
    CHECK(usable_fraction(1, &worst) == 0);
    CHECK(worst >= 0.99);
}

/* -------------------------------------------------------- fault injection */

/*
 * One deterministic sequence of creates/allocs/frees with allocation number
 * `nth` failing (and every later one if `sticky`). ENOMEM from alloc must
 * leave the allocator unchanged; frees cannot fail; the structure stays
 * consistent. Sets *injected to whether the failure point was reached.
 */
static int fault_run(uint64_t nth, int sticky, int *injected)
{
    uint64_t base = kvp_mem_used();
    rng_seed(99);
    kvp_mem_fail_nth(nth, sticky);
    kvp_segalloc *a = NULL;
    int rc = kvp_segalloc_create(4096, &a);
    if (rc != 0) {
        REQUIRE(rc == KVP_ENOMEM);
        REQUIRE(a == NULL);
        *injected = kvp_mem_failed() > 0;
        kvp_mem_fail_nth(0, 0);
        REQUIRE(kvp_mem_used() == base);
        return 0;
    }
    range live[4096];
    uint32_t nlive = 0;
    for (int op = 0; op < 1500; op++) {
        /* grow to many small blocks first (forces reservations), then churn */
        int do_alloc = nlive == 0 || (op < 600 ? rng_next() % 100 < 85 : rng_next() % 2);
        if (do_alloc) {
            uint32_t n = (uint32_t)rng_range(1, op < 600 ? 4 : 64), off;
            uint64_t fp = kvp_segalloc_free_pages(a);
            uint32_t fb = kvp_segalloc_free_blocks(a);
            rc = kvp_segalloc_alloc(a, n, &off);
            if (rc == 0) {
                live[nlive++] = (range){off, n, 0};
            } else {
                REQUIRE(rc == KVP_ENOMEM || rc == KVP_ENO_AVAILABLE_HANDLE);
                REQUIRE(kvp_segalloc_free_pages(a) == fp);
                REQUIRE(kvp_segalloc_free_blocks(a) == fb);
            }
        } else {
            uint32_t k = (uint32_t)(rng_next() % nlive);
            kvp_segalloc_free(a, live[k].off, live[k].n);
            live[k] = live[--nlive];
        }
        if (op % 16 == 0)
            REQUIRE(kvp_segalloc_check(a) == 0);
    }
    /* every range frees without allocating */
    uint64_t allocs_before = kvp_mem_allocs();
    while (nlive) {
        nlive--;
        kvp_segalloc_free(a, live[nlive].off, live[nlive].n);
    }
    REQUIRE(kvp_mem_allocs() == allocs_before);
    REQUIRE(kvp_segalloc_check(a) == 0);
    REQUIRE(kvp_segalloc_free_blocks(a) == 1);
    REQUIRE(kvp_segalloc_free_pages(a) == 4096);
    *injected = kvp_mem_failed() > 0;
    kvp_mem_fail_nth(0, 0);
    kvp_segalloc_destroy(a);
    REQUIRE(kvp_mem_used() == base);
    return 0;
}

TEST(fault_injection)
{
    for (int sticky = 0; sticky <= 1; sticky++) {
        uint64_t nth;
        for (nth = 1; nth < 100000; nth++) {
            int injected = 0;
            CHECK(fault_run(nth, sticky, &injected) == 0);
            if (!injected)
                break; /* nth is past the last allocation of the sequence */
        }
        printf("    sticky=%d: %llu failure points\n", sticky, (unsigned long long)(nth - 1));
        CHECK(nth > 5);
    }
}

/* A takeover's claims: exact ranges, ascending or not; overlaps refused;
 * claimed ranges free and coalesce like allocations; alloc avoids them. */
TEST(claim_exact_ranges)
{
    kvp_segalloc *a;
    CHECK_EQ(kvp_segalloc_create(1000, &a), 0);
    CHECK_EQ(kvp_segalloc_claim(a, 10, 5), 0);   /* [10,15) */
    CHECK_EQ(kvp_segalloc_claim(a, 15, 5), 0);   /* [15,20), adjacent */
    CHECK_EQ(kvp_segalloc_claim(a, 100, 50), 0); /* a gap before it */
    CHECK_EQ(kvp_segalloc_claim(a, 0, 3), 0);    /* out of order: the walk */
    CHECK_EQ(kvp_segalloc_claim(a, 990, 10), 0); /* up to the end */
    CHECK_EQ(kvp_segalloc_check(a), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 1000 - 73);
    CHECK_EQ(kvp_segalloc_claim(a, 12, 1), KVP_ENO_AVAILABLE_HANDLE);   /* inside a claim */
    CHECK_EQ(kvp_segalloc_claim(a, 140, 20), KVP_ENO_AVAILABLE_HANDLE); /* straddles one */
    CHECK_EQ(kvp_segalloc_claim(a, 995, 10), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_segalloc_claim(a, 1000, 1), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_segalloc_claim(a, 5, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    /* 8 pages fit only in [3,10), [20,100), [150,990) */
    uint32_t off;
    for (int i = 0; i < 100; i++) {
        if (kvp_segalloc_alloc(a, 8, &off) != 0)
            break;
        CHECK(off + 8 <= 10 || (off >= 20 && off + 8 <= 100) || (off >= 150 && off + 8 <= 990));
    }
    kvp_segalloc_destroy(a);

    /* every page claimed one by one, descending, then freed: one block */
    CHECK_EQ(kvp_segalloc_create(64, &a), 0);
    for (int p = 63; p >= 0; p--)
        CHECK_EQ(kvp_segalloc_claim(a, (uint32_t)p, 1), 0);
    CHECK_EQ(kvp_segalloc_free_pages(a), 0);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    for (uint32_t p = 0; p < 64; p += 2)
        kvp_segalloc_free(a, p, 1);
    for (uint32_t p = 1; p < 64; p += 2)
        kvp_segalloc_free(a, p, 1);
    CHECK_EQ(kvp_segalloc_free_blocks(a), 1);
    CHECK_EQ(kvp_segalloc_free_pages(a), 64);
    CHECK_EQ(kvp_segalloc_check(a), 0);
    kvp_segalloc_destroy(a);
}
