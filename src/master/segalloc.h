/*
 * segalloc.h -- per-segment space allocator (metadata only: the master never
 * touches segment memory).
 *
 * Units are 4 KiB pages; a segment has up to 2^32-1 pages (16 TiB).
 * Exact fit: an allocation of n pages takes exactly n pages (no rounding to
 * size classes); the rest of the chosen free block stays free. TLSF-like:
 * free blocks sit in segregated lists indexed by a two-level bitmap, so
 * allocate and free are O(1) (allocate may scan a bounded number of entries
 * of one list, see segalloc.c); free coalesces with both neighbours.
 *
 * Invariant that callers rely on: kvp_segalloc_free never allocates and
 * never fails. kvp_segalloc_alloc reserves, before it succeeds, any metadata
 * the matching free will need.
 *
 * Not thread-safe: owned by the master's loop thread.
 */
#ifndef KVP_SEGALLOC_H
#define KVP_SEGALLOC_H

#include <stdint.h>

#define KVP_PAGE_SHIFT 12
#define KVP_PAGE_SIZE (1u << KVP_PAGE_SHIFT)

typedef struct kvp_segalloc kvp_segalloc;

/* npages >= 1. 0, KVP_EINVALID_PARAMS or KVP_ENOMEM. */
int kvp_segalloc_create(uint32_t npages, kvp_segalloc **out);
void kvp_segalloc_destroy(kvp_segalloc *a);

/*
 * Allocates exactly n >= 1 pages. 0 and *off (first page) on success;
 * KVP_ENO_AVAILABLE_HANDLE when no free block of n pages is found;
 * KVP_ENOMEM when metadata could not be reserved (nothing changed then).
 */
int kvp_segalloc_alloc(kvp_segalloc *a, uint32_t n, uint32_t *off);

/*
 * Allocates exactly [off, off + n) (a new leader taking over the
 * allocations its predecessor made): 0; KVP_ENO_AVAILABLE_HANDLE when any
 * of it is not free; KVP_EINVALID_PARAMS out of range; KVP_ENOMEM (nothing
 * changed). O(1) when claims come in ascending order of off, else
 * O(free blocks). Freed like any allocation.
 */
int kvp_segalloc_claim(kvp_segalloc *a, uint32_t off, uint32_t n);
/* Frees a range returned by kvp_segalloc_alloc with the same n. O(1). */
void kvp_segalloc_free(kvp_segalloc *a, uint32_t off, uint32_t n);

uint32_t kvp_segalloc_pages(const kvp_segalloc *a);        /* capacity */
uint64_t kvp_segalloc_free_pages(const kvp_segalloc *a);   /* total free */
uint32_t kvp_segalloc_largest_free(const kvp_segalloc *a); /* largest free block */
uint32_t kvp_segalloc_free_blocks(const kvp_segalloc *a);  /* number of free blocks */

/* Self-check for tests: walks every structure, returns 0 if consistent. */
int kvp_segalloc_check(const kvp_segalloc *a);

#endif
