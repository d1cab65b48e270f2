/* index.c -- open-addressing (tenant, key) index with incremental growth;
 * see index.h. */
#include "master/index.h"

#include <xxhash.h>

#include "common/assert.h"
#include "common/mem.h"
#include "kvpool.h"

#define PTR_MASK 0xFFFFFFFFFFFFull
#define TAG(h) ((h) & ~PTR_MASK)
#define STEP_PER_INSERT 8 /* old slots drained per insert: > 4/3 needed */

uint64_t kvp_index_hash(uint16_t tenant, const uint8_t *key, uint32_t len)
{
    return XXH3_64bits_withSeed(key, len, (XXH64_hash_t)tenant * 0x9E3779B97F4A7C15ull + 1);
}

int kvp_index_init(kvp_index *ix, uint64_t hint) { return kvp_index_init_by(ix, hint, NULL); }

int kvp_index_init_by(kvp_index *ix, uint64_t hint, kvp_index_hfn hfn)
{
    ix->hfn = hfn;
    uint64_t cap = 1024;
    while (cap < hint + hint / 3)
        cap <<= 1;
    ix->slots = kvp_calloc(cap, sizeof *ix->slots);
    if (!ix->slots)
        return KVP_ENOMEM;
    ix->mask = cap - 1;
    ix->count = 0;
    ix->old = NULL;
    ix->old_mask = ix->old_count = ix->mig = 0;
    ix->gen = 0;
    ix->scans = NULL;
    return 0;
}

void kvp_index_free(kvp_index *ix)
{
    kvp_free(ix->slots);
    kvp_free(ix->old);
    ix->slots = ix->old = NULL;
    ix->count = ix->old_count = 0;
}

static inline kvp_obj *obj_of(uint64_t s) { return (kvp_obj *)(uintptr_t)(s & PTR_MASK); }

/* The hash an entry was placed by (its low 32 bits are what placement uses). */
static inline uint64_t ent_hash(kvp_index_hfn hfn, const kvp_obj *o)
{
    return hfn ? hfn(o) : o->hash;
}

/* Home of slot value s in a table of `mask`, no lower than `floor`. */
static inline uint64_t home(kvp_index_hfn hfn, uint64_t s, uint64_t mask, uint64_t floor)
{
    uint64_t h = (uint32_t)ent_hash(hfn, obj_of(s)) & mask;
    return h < floor ? floor : h;
}

static kvp_obj *find_in(const uint64_t *slots, uint64_t mask, uint64_t i, uint64_t h,
                        uint16_t tenant, const uint8_t *key, uint32_t len)
{
    uint64_t tag = TAG(h);
    for (;;) {
        uint64_t s = slots[i];
        if (s == 0)
            return NULL;
        if (TAG(s) == tag) {
            kvp_obj *o = obj_of(s);
            if (o->tenant == tenant && o->keylen == len && memcmp(kvp_obj_key(o), key, len) == 0)
                return o;
        }
        i = (i + 1) & mask;
    }
}

kvp_obj *kvp_index_find(const kvp_index *ix, uint64_t h, uint16_t tenant, const uint8_t *key,
                        uint32_t len)
{
    kvp_obj *o = find_in(ix->slots, ix->mask, h & ix->mask, h, tenant, key, len);
    if (!o && ix->old) {
        uint64_t i = (uint32_t)h & ix->old_mask;
        o = find_in(ix->old, ix->old_mask, i < ix->mig ? ix->mig : i, h, tenant, key, len);
    }
    return o;
}

/* Slot value s (whose entry hashes to h) at its first free slot from home. */
static void place_h(uint64_t *slots, uint64_t mask, uint64_t s, uint64_t h)
{
    uint64_t i = (uint32_t)h & mask;
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = s;
}

static void place(kvp_index_hfn hfn, uint64_t *slots, uint64_t mask, uint64_t s)
{
    place_h(slots, mask, s, ent_hash(hfn, obj_of(s)));
}

/* Backward-shift deletion of slot i: pull later cluster members whose
 * (effective) home is not cyclically in (i, j] into the hole. `sc`: the
 * scans walking this table (a list, or NULL); an entry moved from a slot
 * one has not visited to one it has takes its cursor back there. */
static void delete_at(kvp_index_hfn hfn, uint64_t *slots, uint64_t mask, uint64_t floor,
                      uint64_t i, kvp_index_scan *sc)
{
    uint64_t j = i;
    for (;;) {
        slots[i] = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (slots[j] == 0)
                return;
            uint64_t k = home(hfn, slots[j], mask, floor);
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        slots[i] = slots[j];
        for (kvp_index_scan *x = sc; x && i < j; x = x->next)
            if (i < x->pos && x->pos <= j)
                x->pos = i;
        i = j;
    }
}

uint64_t kvp_index_step(kvp_index *ix, uint64_t budget)
{
    uint64_t done = 0;
    while (ix->old && done < budget) {
        if (ix->mig > ix->old_mask || ix->old_count == 0) {
            kvp_free(ix->old);
            ix->old = NULL;
            ix->old_count = ix->mig = 0;
            break;
        }
        uint64_t s = ix->old[ix->mig];
        done++;
        if (s == 0) {
            ix->mig++;
            continue;
        }
        KVP_ASSERT(ix->old_count > 0);
        place(ix->hfn, ix->slots, ix->mask, s);
        delete_at(ix->hfn, ix->old, ix->old_mask, ix->mig, ix->mig, NULL); /* may refill old[mig] */
        ix->old_count--;
    }
    return done;
}

int kvp_index_reserve(kvp_index *ix)
{
    if (ix->old)
        kvp_index_step(ix, STEP_PER_INSERT);
    uint64_t cap = ix->mask + 1;
    if ((ix->count + 1) * 4 <= cap * 3)
        return 0;
    kvp_index_settle(ix); /* only if inserts outran the drain: not expected */
    uint64_t *ns = kvp_calloc(cap * 2, sizeof *ns);
    if (!ns)
        return KVP_ENOMEM;
    ix->old = ix->slots;
    ix->old_mask = ix->mask;
    ix->old_count = ix->count;
    ix->mig = 0;
    ix->slots = ns;
    ix->mask = cap * 2 - 1;
    ix->gen++; /* a scan in progress starts over on the new table */
    return 0;
}

void kvp_index_insert(kvp_index *ix, uint64_t h, kvp_obj *o)
{
    /* kvp_index_reserve ran first: the table stays at most 3/4 full, and
     * pointers fit the 48 bits a slot keeps of them */
    KVP_ASSERT((ix->count + 1) * 4 <= (ix->mask + 1) * 3);
    KVP_ASSERT(((uintptr_t)o & ~(uintptr_t)PTR_MASK) == 0);
    if (!ix->hfn)
        o->hash = (uint32_t)h;
    place_h(ix->slots, ix->mask, TAG(h) | ((uint64_t)(uintptr_t)o & PTR_MASK), h);
    ix->count++;
}

/* Finds o by pointer from its (effective) home; the slot index or -1. */
static int64_t slot_of(kvp_index_hfn hfn, const uint64_t *slots, uint64_t mask, uint64_t floor,
                       const kvp_obj *o)
{
    uint64_t i = (uint32_t)ent_hash(hfn, o) & mask;
    if (i < floor)
        i = floor;
    for (;;) {
        if (slots[i] == 0)
            return -1;
        if (obj_of(slots[i]) == o)
            return (int64_t)i;
        i = (i + 1) & mask;
    }
}

void kvp_index_remove(kvp_index *ix, kvp_obj *o)
{
    int64_t i = slot_of(ix->hfn, ix->slots, ix->mask, 0, o);
    if (i >= 0) {
        delete_at(ix->hfn, ix->slots, ix->mask, 0, (uint64_t)i, ix->scans);
    } else {
        KVP_ASSERT(ix->old != NULL); /* o is in the index: if not new, then old */
        i = slot_of(ix->hfn, ix->old, ix->old_mask, ix->mig, o);
        KVP_ASSERT(i >= 0 && ix->old_count > 0);
        delete_at(ix->hfn, ix->old, ix->old_mask, ix->mig, (uint64_t)i, NULL);
        ix->old_count--;
    }
    KVP_ASSERT(ix->count > 0 && ix->count >= ix->old_count);
    ix->count--;
}

void kvp_index_it_init(const kvp_index *ix, uint64_t h, kvp_index_it *it)
{
    it->h = h;
    it->i = h & ix->mask;
    it->old = 0;
}

kvp_obj *kvp_index_it_next(const kvp_index *ix, kvp_index_it *it)
{
    uint64_t tag = TAG(it->h);
    for (;;) {
        const uint64_t *slots = it->old ? ix->old : ix->slots;
        uint64_t mask = it->old ? ix->old_mask : ix->mask;
        uint64_t s = slots[it->i];
        if (s == 0) {
            if (it->old || !ix->old)
                return NULL;
            it->old = 1; /* then the old table, from its effective home */
            uint64_t i = (uint32_t)it->h & ix->old_mask;
            it->i = i < ix->mig ? ix->mig : i;
            continue;
        }
        it->i = (it->i + 1) & mask;
        if (TAG(s) == tag)
            return obj_of(s);
    }
}

void kvp_index_scan_start(kvp_index *ix, kvp_index_scan *sc)
{
    for (const kvp_index_scan *x = ix->scans; x; x = x->next)
        KVP_ASSERT(x != sc); /* not started twice */
    sc->pos = 0;
    sc->gen = ix->gen;
    sc->done = 0;
    sc->next = ix->scans;
    ix->scans = sc;
}

kvp_obj *kvp_index_scan_next(kvp_index *ix, kvp_index_scan *sc, uint64_t *budget)
{
    while (!sc->done && *budget >= KVP_INDEX_SLOT_COST) {
        if (ix->old) {
            /* a growth: drain it, then walk the new table from its start */
            uint64_t n = *budget / KVP_INDEX_SLOT_COST;
            n = kvp_index_step(ix, n < 4096 ? n : 4096);
            *budget -= (n ? n : 1) * KVP_INDEX_SLOT_COST;
            continue;
        }
        if (sc->gen != ix->gen) {
            sc->gen = ix->gen;
            sc->pos = 0;
        }
        if (sc->pos > ix->mask) {
            sc->done = 1;
            break;
        }
        uint64_t s = ix->slots[sc->pos++];
        *budget -= KVP_INDEX_SLOT_COST;
        if (s)
            return obj_of(s);
    }
    return NULL;
}

void kvp_index_scan_stop(kvp_index *ix, kvp_index_scan *sc)
{
    for (kvp_index_scan **p = &ix->scans; *p; p = &(*p)->next)
        if (*p == sc) {
            *p = sc->next;
            sc->next = NULL;
            return;
        }
}
