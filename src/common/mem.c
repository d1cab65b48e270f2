/*
 * mem.c -- counting allocator. A 16-byte header in front of every block
 * records its size, so kvp_free can keep the live byte count exact.
 */
#include "common/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define HDR 16 /* keeps the user pointer 16-byte aligned */

static atomic_uint_fast64_t mem_used;
static atomic_uint_fast64_t mem_allocs;
static atomic_uint_fast64_t fail_at;    /* allocation number that fails, 0 = none */
static atomic_int fail_sticky;
static atomic_uint_fast64_t mem_failed;

static int should_fail(void)
{
    uint64_t n = atomic_fetch_add(&mem_allocs, 1) + 1;
    uint64_t at = atomic_load(&fail_at);
    if (at == 0)
        return 0;
    if (n == at || (n > at && atomic_load(&fail_sticky))) {
        atomic_fetch_add(&mem_failed, 1);
        return 1;
    }
    return 0;
}

void *kvp_malloc(size_t n)
{
    if (n > SIZE_MAX - HDR || should_fail())
        return NULL;
    unsigned char *p = malloc(n + HDR);
    if (!p)
        return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&mem_used, n);
    return p + HDR;
}

/* calloc, not malloc+memset: large zeroed blocks come from fresh mmap pages
 * that stay untouched (not resident) until written. */
void *kvp_calloc(size_t nmemb, size_t size)
{
    if (size && nmemb > SIZE_MAX / size)
        return NULL;
    size_t n = nmemb * size;
    if (n > SIZE_MAX - HDR || should_fail())
        return NULL;
    unsigned char *p = calloc(1, n + HDR);
    if (!p)
        return NULL;
    memcpy(p, &n, sizeof n);
    atomic_fetch_add(&mem_used, n);
    return p + HDR;
}

void *kvp_realloc(void *p, size_t n)
{
    if (!p)
        return kvp_malloc(n);
    if (n > SIZE_MAX - HDR || should_fail())
        return NULL;
    unsigned char *h = (unsigned char *)p - HDR;
    size_t old;
    memcpy(&old, h, sizeof old);
    unsigned char *q = realloc(h, n + HDR);
    if (!q)
        return NULL;
    memcpy(q, &n, sizeof n);
    atomic_fetch_add(&mem_used, n);
    atomic_fetch_sub(&mem_used, old);
    return q + HDR;
}

void kvp_free(void *p)
{
    if (!p)
        return;
    unsigned char *h = (unsigned char *)p - HDR;
    size_t n;
    memcpy(&n, h, sizeof n);
    atomic_fetch_sub(&mem_used, n);
    free(h);
}

void *kvp_salloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = malloc(n);
    if (p)
        atomic_fetch_add(&mem_used, n);
    return p;
}

void kvp_sfree(void *p, size_t n)
{
    if (!p)
        return;
    atomic_fetch_sub(&mem_used, n);
    free(p);
}

char *kvp_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    char *d = kvp_malloc(len + 1);
    if (d) {
        memcpy(d, s, len);
        d[len] = '\0';
    }
    return d;
}

char *kvp_strdup(const char *s) { return kvp_strndup(s, strlen(s)); }

uint64_t kvp_mem_used(void) { return atomic_load(&mem_used); }
uint64_t kvp_mem_allocs(void) { return atomic_load(&mem_allocs); }
uint64_t kvp_mem_failed(void) { return atomic_load(&mem_failed); }

void kvp_mem_fail_nth(uint64_t n, int sticky)
{
    atomic_store(&fail_at, 0);
    atomic_store(&mem_failed, 0);
    atomic_store(&fail_sticky, sticky);
    if (n)
        atomic_store(&fail_at, atomic_load(&mem_allocs) + n);
}
