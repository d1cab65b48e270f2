/* index.c -- open-addressing (tenant, key) index; see index.h. */
#include "master/index.h"

#include <xxhash.h>

#include "common/mem.h"
#include "kvpool.h"

#define PTR_MASK 0xFFFFFFFFFFFFull
#define TAG(h) ((h) & ~PTR_MASK)

uint64_t kvp_index_hash(uint16_t tenant, const uint8_t *key, uint32_t len)
{
    return XXH3_64bits_withSeed(key, len, (XXH64_hash_t)tenant * 0x9E3779B97F4A7C15ull + 1);
}

int kvp_index_init(kvp_index *ix, uint64_t hint)
{
    uint64_t cap = 1024;
    while (cap < hint + hint / 3)
        cap <<= 1;
    ix->slots = kvp_calloc(cap, sizeof *ix->slots);
    if (!ix->slots)
        return KVP_ENOMEM;
    ix->mask = cap - 1;
    ix->count = 0;
    return 0;
}

void kvp_index_free(kvp_index *ix)
{
    kvp_free(ix->slots);
    ix->slots = NULL;
    ix->count = 0;
}

static inline uint64_t slot_hash_low(uint64_t slot)
{
    return ((kvp_obj *)(uintptr_t)(slot & PTR_MASK))->hash;
}

/* Rebuilds the index hash from the object: low 32 bits from o->hash, tag
 * bits from the slot itself. Enough for placement in tables up to 2^32. */
static inline uint64_t slot_home(uint64_t slot, uint64_t mask)
{
    return slot_hash_low(slot) & mask;
}

kvp_obj *kvp_index_find(const kvp_index *ix, uint64_t h, uint16_t tenant, const uint8_t *key,
                        uint32_t len)
{
    uint64_t i = h & ix->mask, tag = TAG(h);
    for (;;) {
        uint64_t s = ix->slots[i];
        if (s == 0)
            return NULL;
        if (TAG(s) == tag) {
            kvp_obj *o = (kvp_obj *)(uintptr_t)(s & PTR_MASK);
            if (o->tenant == tenant && o->keylen == len && memcmp(kvp_obj_key(o), key, len) == 0)
                return o;
        }
        i = (i + 1) & ix->mask;
    }
}

static void place(uint64_t *slots, uint64_t mask, uint64_t s)
{
    uint64_t i = slot_home(s, mask);
    while (slots[i])
        i = (i + 1) & mask;
    slots[i] = s;
}

int kvp_index_reserve(kvp_index *ix)
{
    uint64_t cap = ix->mask + 1;
    if ((ix->count + 1) * 4 <= cap * 3)
        return 0;
    uint64_t ncap = cap * 2, nmask = ncap - 1;
    uint64_t *ns = kvp_calloc(ncap, sizeof *ns);
    if (!ns)
        return KVP_ENOMEM;
    for (uint64_t i = 0; i < cap; i++)
        if (ix->slots[i])
            place(ns, nmask, ix->slots[i]);
    kvp_free(ix->slots);
    ix->slots = ns;
    ix->mask = nmask;
    return 0;
}

void kvp_index_insert(kvp_index *ix, uint64_t h, kvp_obj *o)
{
    o->hash = (uint32_t)h;
    place(ix->slots, ix->mask, TAG(h) | ((uint64_t)(uintptr_t)o & PTR_MASK));
    ix->count++;
}

void kvp_index_remove(kvp_index *ix, kvp_obj *o)
{
    uint64_t mask = ix->mask;
    uint64_t i = o->hash & mask;
    while ((ix->slots[i] & PTR_MASK) != ((uint64_t)(uintptr_t)o & PTR_MASK))
        i = (i + 1) & mask;
    /* backward-shift deletion: pull later cluster members whose home is
     * not cyclically in (i, j] into the hole */
    uint64_t j = i;
    for (;;) {
        ix->slots[i] = 0;
        for (;;) {
            j = (j + 1) & mask;
            if (ix->slots[j] == 0) {
                ix->count--;
                return;
            }
            uint64_t k = slot_home(ix->slots[j], mask);
            if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
                continue;
            break;
        }
        ix->slots[i] = ix->slots[j];
        i = j;
    }
}
