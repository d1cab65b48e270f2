/*
 * bench_segalloc.c -- function-level benchmark of the segment allocator.
 * Standalone (not part of `make bench`); build and run:
 *   cc -std=gnu11 -O2 -Iinclude -Isrc bench/bench_segalloc.c \
 *      src/master/segalloc.c src/common/mem.c -o build/bench_segalloc
 *   build/bench_segalloc
 * A 64 GiB segment (16M pages) is filled with 128..1024-page blocks, then
 * each step frees a random live block and allocates a random size. Printed:
 * time per free+alloc pair (loop total / steps; includes the loop's own
 * bookkeeping, no per-op clock reads).
 */
#include "common/mem.h"
#include "master/segalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t rs = 12345;
static uint64_t rnd(void)
{
    uint64_t z = (rs += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(void)
{
    const uint32_t np = 1u << 24, steps = 2000000;
    kvp_segalloc *a;
    if (kvp_segalloc_create(np, &a) != 0)
        return 1;
    uint32_t *off = malloc(np / 128 * sizeof *off), *len = malloc(np / 128 * sizeof *len);
    uint32_t *sz = malloc(steps * sizeof *sz), *victim = malloc(steps * sizeof *victim);
    if (!off || !len || !sz || !victim)
        return 1;
    uint32_t n = 0;
    for (;;) {
        uint32_t s = 128 + (uint32_t)(rnd() % 897);
        if (kvp_segalloc_alloc(a, s, &off[n]) != 0)
            break;
        len[n++] = s;
    }
    for (uint32_t i = 0; i < steps; i++) {
        sz[i] = 128 + (uint32_t)(rnd() % 897);
        victim[i] = (uint32_t)rnd();
    }
    uint64_t misses = 0;
    double t0 = now_ns();
    for (uint32_t i = 0; i < steps; i++) {
        uint32_t k = victim[i] % n;
        kvp_segalloc_free(a, off[k], len[k]);
        if (kvp_segalloc_alloc(a, sz[i], &off[k]) == 0) {
            len[k] = sz[i];
        } else {
            misses++;
            off[k] = off[n - 1];
            len[k] = len[n - 1];
            n--;
        }
    }
    double t = now_ns() - t0;
    printf("segalloc: %u pages, %u live blocks, %u free blocks, free+alloc %.1f ns "
           "per pair (%llu no-space), check %d\n",
           np, n, kvp_segalloc_free_blocks(a), t / steps, (unsigned long long)misses,
           kvp_segalloc_check(a));
    kvp_segalloc_destroy(a);
    free(off);
    free(len);
    free(sz);
    free(victim);
    return 0;
}
