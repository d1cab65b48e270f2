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
    int64_t offset_ms;    /* atomic: the LATEST master clock - local clock
                             (the clock sample's upper bound) */
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

void kvp_grants_set_clock(kvp_grants *g, uint64_t master_ms, uint64_t sent_ms, uint64_t recv_ms)
{
    /* master_ms was read no earlier than sent_ms: now + (master_ms -
     * sent_ms) is never behind the master's clock (monotonic clocks drift
     * by parts per million between samples); the price is expiring up to
     * one round trip early */
    (void)recv_ms;
    ST(&g->offset_ms, (int64_t)(master_ms - sent_ms));
}

#define GEN_MAX (1ull << 62) /* 2g + 2 must not wrap */

static int pages_pass(const kvp_grants *g, uint64_t offset, uint64_t length, uint64_t limit)
{
    uint64_t p0 = offset >> 12, p1 = (offset + length + 4095) >> 12;
    for (uint64_t p = p0; p < p1; p++)
        if (LD(&g->floor[p]) > limit)
            return 0;
    return 1;
}

/* the largest floor an access with generation gen passes */
static uint64_t limit_of(uint64_t gen, uint32_t access)
{
    return access == KVP_ACCESS_WRITE ? 2 * gen : 2 * gen + 1;
}

int kvp_grants_live(const kvp_grants *g, uint64_t offset, uint64_t length, uint64_t generation,
                    uint32_t access)
{
    return pages_pass(g, offset, length, limit_of(generation, access));
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
                     uint64_t now_ms, uint64_t *deadline_ms)
{
    int err = access == KVP_ACCESS_WRITE ? KVP_EINVALID_WRITE : KVP_EINVALID_READ;
    /* phase 1: bounds, without overflow; a frame body is at most u32 */
    if (r->segment_id != segment_id || r->length == 0 || r->offset > g->size ||
        r->length > g->size - r->offset || r->length > UINT32_MAX - KVP_SEG_IO_SIZE ||
        (r->offset & 4095) || r->generation >= GEN_MAX) {
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
    int64_t off = LD(&g->offset_ms);
    int64_t master_now = (int64_t)now_ms + off;
    int64_t last = r->expires_ms > (uint64_t)INT64_MAX / 2 ? INT64_MAX / 2
                                                            : (int64_t)r->expires_ms;
    last += KVP_GRANT_SLACK_MS;
    if (master_now > last) {
        BUMP(&g->st.expired);
        return err;
    }
    /* phase 3: the allocation is still the live one on every page (and,
     * for a WRITE, its object not yet published) */
    if (!pages_pass(g, r->offset, r->length, limit_of(r->generation, access))) {
        BUMP(&g->st.stale);
        return err;
    }
    if (access == KVP_ACCESS_WRITE) {
        uint64_t p0 = r->offset >> 12, p1 = (r->offset + r->length + 4095) >> 12;
        for (uint64_t p = p0; p < p1; p++)
            raise_floor(&g->floor[p], 2 * r->generation);
    }
    if (deadline_ms)
        *deadline_ms = (uint64_t)(last - off);
    return 0;
}

void kvp_grants_freed(kvp_grants *g, uint32_t page, uint32_t pages, uint64_t generation,
                      int published)
{
    if (generation >= GEN_MAX)
        generation = GEN_MAX - 1; /* no descriptor of it passes the check anyway */
    uint64_t v = 2 * generation + (published ? 1 : 2);
    uint64_t end = (uint64_t)page + pages;
    if (end > g->npages)
        end = g->npages;
    for (uint64_t p = page; p < end; p++)
        raise_floor(&g->floor[p], v);
}

void kvp_grants_stats_get(const kvp_grants *g, kvp_grants_stats *out)
{
    out->forged = LD(&g->st.forged);
    out->wrong_access = LD(&g->st.wrong_access);
    out->expired = LD(&g->st.expired);
    out->stale = LD(&g->st.stale);
    out->out_of_bounds = LD(&g->st.out_of_bounds);
}
