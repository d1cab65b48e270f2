/*
 * index.h -- (tenant, key) -> object hash index (internal to src/master).
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones). A slot is 8 bytes: the object pointer in the low 48 bits and
 * a 16-bit tag (hash bits 48..63) in the high bits, so most probes that
 * miss never touch the object. The load factor stays <= 3/4 (the table
 * doubles); growth rehashes every entry using the hash kept in the object.
 *
 * Hash = XXH3-64 of the key seeded with the tenant id.
 */
#ifndef KVP_INDEX_H
#define KVP_INDEX_H

#include <stdint.h>

#include "master/obj.h"

typedef struct kvp_index {
    uint64_t *slots;
    uint64_t mask; /* capacity - 1; capacity is a power of two */
    uint64_t count;
} kvp_index;

uint64_t kvp_index_hash(uint16_t tenant, const uint8_t *key, uint32_t len);
/* 0 or KVP_ENOMEM. */
int kvp_index_init(kvp_index *ix, uint64_t capacity_hint);
void kvp_index_free(kvp_index *ix);
kvp_obj *kvp_index_find(const kvp_index *ix, uint64_t h, uint16_t tenant, const uint8_t *key,
                        uint32_t len);
/* Makes room for one more entry (may grow). 0 or KVP_ENOMEM. */
int kvp_index_reserve(kvp_index *ix);
/* Inserts o (not present; o->hash set from h). Requires a prior successful
 * kvp_index_reserve; never fails. */
void kvp_index_insert(kvp_index *ix, uint64_t h, kvp_obj *o);
/* Removes o, which must be present. */
void kvp_index_remove(kvp_index *ix, kvp_obj *o);

/* Slot access for whole-table scans. A scan that removes the object at
 * slot i must look at slot i again (backward shift may have moved an
 * unvisited entry there); entries may be seen twice, never skipped. */
static inline kvp_obj *kvp_index_at(const kvp_index *ix, uint64_t i)
{
    return (kvp_obj *)(uintptr_t)(ix->slots[i] & 0xFFFFFFFFFFFFull);
}
#endif
