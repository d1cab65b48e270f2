/*
 * index.h -- (tenant, key) -> object hash index (internal to src/master).
 *
 * Open addressing with linear probing and backward-shift deletion (no
 * tombstones). A slot is 8 bytes: the object pointer in the low 48 bits and
 * a 16-bit tag (hash bits 48..63) in the high bits, so most probes that
 * miss never touch the object. Placement uses the low 32 hash bits, which
 * the object keeps (o->hash), so tables up to 2^32 slots.
 *
 * Growth is incremental (bounded work, like Redis's dict): past 3/4 load a
 * table twice as large becomes current and the old one is drained by
 * kvp_index_step, a few slots per insert and a budget per timer tick.
 * While draining, lookups and removals look in both tables. Slots of the
 * old table below the drain cursor are all empty, so a probe there starts
 * at max(home, cursor) (its "effective home").
 *
 * Hash = XXH3-64 of the key seeded with the tenant id.
 *
 * The same table also indexes objects by another hash the object can
 * recompute (the block index of master/kvblk.c): kvp_index_init_by sets the
 * function, o->hash is left alone, and lookups go through kvp_index_it
 * (the caller compares the candidates).
 */
#ifndef KVP_INDEX_H
#define KVP_INDEX_H

#include <stdint.h>

#include "master/obj.h"

typedef struct kvp_index_scan kvp_index_scan;

typedef uint64_t (*kvp_index_hfn)(const kvp_obj *o);

typedef struct kvp_index {
    kvp_index_hfn hfn; /* an entry's hash; NULL = (tenant, key): o->hash */
    uint64_t *slots;  /* current table */
    uint64_t mask;    /* its capacity - 1 (a power of two) */
    uint64_t count;   /* entries in both tables */
    uint64_t *old;    /* table being drained, NULL when none */
    uint64_t old_mask;
    uint64_t old_count;
    uint64_t mig;     /* drain cursor: old slots below it are empty */
    uint64_t gen;     /* growths started so far */
    kvp_index_scan *scans; /* the scans in progress (a list), NULL when none */
} kvp_index;

/*
 * A whole-table scan spread over many calls (a REMOVE_ALL / REMOVE_REGEX
 * split across loop turns), while the index changes in between. Contract:
 * every entry present from kvp_index_scan_start to the end of the scan is
 * returned at least once; entries may be returned more than once; entries
 * inserted meanwhile may or may not be. How: the scan walks the current
 * table by slot; a backward-shift deletion that moves an entry from a slot
 * not yet visited to one already visited moves the cursor back to it
 * (delete_at); a growth (new table) restarts the walk at 0 once it is
 * drained, which the scan itself helps (growth doubles, so restarts are
 * few). Any number of scans may run at once (a removal job, each
 * follower's snapshot, the snapshot file's rewrite): the index keeps them
 * in a list and a deletion moves every cursor that needs it (cost: one
 * compare per scan per shifted entry). A scan must be stopped before its
 * memory goes or the index is freed.
 */
struct kvp_index_scan {
    uint64_t pos;     /* next slot of the current table to visit */
    uint64_t gen;     /* ix->gen the walk belongs to */
    int done;
    kvp_index_scan *next; /* the index's list of scans */
};
void kvp_index_scan_start(kvp_index *ix, kvp_index_scan *sc);
/* The next entry, or NULL when the scan is done (sc->done) or *budget is
 * spent (each slot visited or drained costs KVP_INDEX_SLOT_COST, taken off
 * *budget). */
kvp_obj *kvp_index_scan_next(kvp_index *ix, kvp_index_scan *sc, uint64_t *budget);
void kvp_index_scan_stop(kvp_index *ix, kvp_index_scan *sc);
#define KVP_INDEX_SLOT_COST 8

uint64_t kvp_index_hash(uint16_t tenant, const uint8_t *key, uint32_t len);
/* 0 or KVP_ENOMEM. */
int kvp_index_init(kvp_index *ix, uint64_t capacity_hint);
/* An index of objects by hfn(o) (not their key): kvp_index_insert leaves
 * o->hash alone; find with kvp_index_it. */
int kvp_index_init_by(kvp_index *ix, uint64_t capacity_hint, kvp_index_hfn hfn);
void kvp_index_free(kvp_index *ix);
kvp_obj *kvp_index_find(const kvp_index *ix, uint64_t h, uint16_t tenant, const uint8_t *key,
                        uint32_t len);
/* Makes room for one more entry (may start a growth, and drains a few
 * slots of an ongoing one). 0 or KVP_ENOMEM. */
int kvp_index_reserve(kvp_index *ix);
/* Inserts o (not present; o->hash set from h, unless the index has its own
 * hfn, then h must be hfn(o)). Requires a prior successful
 * kvp_index_reserve; never fails. */
void kvp_index_insert(kvp_index *ix, uint64_t h, kvp_obj *o);
/* Removes o, which must be present. */
void kvp_index_remove(kvp_index *ix, kvp_obj *o);
/* Drains up to `budget` slots of an ongoing growth; returns slots visited. */
uint64_t kvp_index_step(kvp_index *ix, uint64_t budget);
/* Completes an ongoing growth (before whole-table scans). */
static inline void kvp_index_settle(kvp_index *ix)
{
    while (ix->old)
        kvp_index_step(ix, UINT64_MAX);
}

/*
 * Every entry whose slot tag matches hash h, in probe order (both tables
 * while a growth drains): candidates the caller compares. The index must
 * not change during the walk.
 */
typedef struct kvp_index_it {
    uint64_t h, i;
    int old; /* walking the old table */
} kvp_index_it;
void kvp_index_it_init(const kvp_index *ix, uint64_t h, kvp_index_it *it);
/* The next candidate, NULL at the end. */
kvp_obj *kvp_index_it_next(const kvp_index *ix, kvp_index_it *it);

/* Starts loading the cache line of h's home slot (batched lookups). */
static inline void kvp_index_prefetch(const kvp_index *ix, uint64_t h)
{
    __builtin_prefetch(&ix->slots[h & ix->mask]);
}

/* Slot access for whole-table scans (call kvp_index_settle first). A scan
 * that removes the object at slot i must look at slot i again (backward
 * shift may have moved an unvisited entry there); entries may be seen
 * twice, never skipped. */
static inline kvp_obj *kvp_index_at(const kvp_index *ix, uint64_t i)
{
    return (kvp_obj *)(uintptr_t)(ix->slots[i] & 0xFFFFFFFFFFFFull);
}
#endif
