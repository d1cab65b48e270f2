/*
 * mem.h -- the one allocation wrapper (counts bytes, can fail on purpose).
 *
 * Every heap allocation in kvpool goes through these functions so that
 *  - the live byte count is known (kvp_mem_used), and
 *  - tests can make the Nth allocation from now fail (kvp_mem_fail_nth),
 *    the primitive behind the fault-injection tests (SQLite faultsim style).
 * The functions never abort: NULL means out of memory and callers must
 * report KVP_ENOMEM. Thread-safe (counters are atomics).
 */
#ifndef KVP_MEM_H
#define KVP_MEM_H

#include <stddef.h>
#include <stdint.h>

void *kvp_malloc(size_t n);
void *kvp_calloc(size_t nmemb, size_t size);
void *kvp_realloc(void *p, size_t n);
void kvp_free(void *p);
char *kvp_strdup(const char *s);
char *kvp_strndup(const char *s, size_t n);

/*
 * Sized allocation: no header, the caller passes the same size to
 * kvp_sfree. For many small fixed-layout records (the master's objects),
 * where a 16-byte header per record would cost 10 % of the memory budget.
 */
void *kvp_salloc(size_t n);
void kvp_sfree(void *p, size_t n);

/* Bytes currently allocated through the wrapper. */
uint64_t kvp_mem_used(void);
/* Number of allocations made so far (successful or failed on purpose). */
uint64_t kvp_mem_allocs(void);

/*
 * Fault injection: the nth allocation from now (1 = the next one) fails,
 * and, if `sticky`, every one after it too. n == 0 disables injection.
 */
void kvp_mem_fail_nth(uint64_t n, int sticky);
/* How many allocations failed on purpose since the last kvp_mem_fail_nth. */
uint64_t kvp_mem_failed(void);

#endif
