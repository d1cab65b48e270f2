/*
 * grants.c -- descriptor checks on the storage node; see grants.h.
 */
#include "node/grants.h"

#include "common/mem.h"
#include "kvpool.h"

struct kvp_grants {
    uint64_t size;
    uint64_t npages;
    uint64_t secret;      /* atomic */
    int64_t offset_ms;    /* atomic: master clock - local clock */
    uint64_t *floor;      /* per 4 KiB page; atomic entries */
    kvp_grants_stats st;  /* atomic counters */
};

#define LD(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define ST(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define BUMP(p) __atomic_fetch_add((p), 1, __ATOMIC_RELAXED)

int kvp_grants_create(uint64_t size, uint64_t secret, kvp_grants **out)
{
    kvp_grants *g = kvp_calloc(1, sizeof *g);
    if (!g)
        return KVP_ENOMEM;
    g->size = size;
    g->npages = (size + 4095) >> 12;
    g->secret = secret;
    /* calloc: untouched pages of the table cost no memory */
    g->floor = kvp_calloc(g->npages ? g->npages : 1, sizeof *g->floor);
    if (!g->floor) {
        kvp_free(g);
        return KVP_ENOMEM;
    }
    *out = g;
    return 0;
}

void kvp_grants_destroy(kvp_grants *g)
{
    if (!g)
        return;
    kvp_free(g->floor);
    kvp_free(g);
}

uint64_t kvp_grants_secret(const kvp_grants *g) { return LD(&g->secret); }
void kvp_grants_rekey(kvp_grants *g, uint64_t secret) { ST(&g->secret, secret); }

void kvp_grants_set_clock(kvp_grants *g, uint64_t master_ms, uint64_t local_ms)
{
    ST(&g->offset_ms, (int64_t)(master_ms - local_ms));
}

/* Raises floor[p] to at least v. */
static void raise_floor(uint64_t *f, uint64_t v)
{
    uint64_t cur = LD(f);
    while (cur < v && !__atomic_compare_exchange_n(f, &cur, v, 1, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
        ;
}

int kvp_grants_check(kvp_grants *g, uint64_t segment_id, const kvp_replica *r, uint32_t access,
                     uint64_t now_ms)
{
    int err = access == KVP_ACCESS_WRITE ? KVP_EINVALID_WRITE : KVP_EINVALID_READ;
    /* phase 1: bounds, without overflow; a frame body is at most u32 */
    if (r->segment_id != segment_id || r->length == 0 || r->offset > g->size ||
        r->length > g->size - r->offset || r->length > UINT32_MAX - KVP_SEG_IO_SIZE ||
        (r->offset & 4095)) {
        BUMP(&g->st.out_of_bounds);
        return err;
    }
    /* phase 2: issued by the master, for this operation, not expired */
    if (r->tag != kvp_replica_tag(LD(&g->secret), r)) {
        BUMP(&g->st.forged);
        return err;
    }
    if (r->access != access) {
        BUMP(&g->st.wrong_access);
        return err;
    }
    int64_t master_now = (int64_t)now_ms + LD(&g->offset_ms);
    if (master_now > (int64_t)r->expires_ms + KVP_GRANT_SLACK_MS) {
        BUMP(&g->st.expired);
        return err;
    }
    /* phase 3: the allocation is still the live one on every page */
    uint64_t p0 = r->offset >> 12, p1 = (r->offset + r->length + 4095) >> 12;
    for (uint64_t p = p0; p < p1; p++)
        if (LD(&g->floor[p]) > r->generation) {
            BUMP(&g->st.stale);
            return err;
        }
    if (access == KVP_ACCESS_WRITE)
        for (uint64_t p = p0; p < p1; p++)
            raise_floor(&g->floor[p], r->generation);
    return 0;
}

void kvp_grants_freed(kvp_grants *g, uint32_t page, uint32_t pages, uint64_t generation)
{
    uint64_t end = (uint64_t)page + pages;
    if (end > g->npages)
        end = g->npages;
    for (uint64_t p = page; p < end; p++)
        raise_floor(&g->floor[p], generation + 1);
}

void kvp_grants_stats_get(const kvp_grants *g, kvp_grants_stats *out)
{
    out->forged = LD(&g->st.forged);
    out->wrong_access = LD(&g->st.wrong_access);
    out->expired = LD(&g->st.expired);
    out->stale = LD(&g->st.stale);
    out->out_of_bounds = LD(&g->st.out_of_bounds);
}
