/* kvblk.c -- engine KV blocks: the block index, lookups, snapshots and the
 * KV events of the master; see kvblk.h. */
#include "master/kvblk.h"

#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"
#include "master/index.h"

#define MOD "kvev"
#define NGROUPS (KVP_OBJ_MAX_GROUP + 1)
#define KEEP_EVENTS 65536 /* a stream's event array kept across takes, at most */

typedef struct kgroup {
    uint32_t block_size;
    uint16_t parts; /* 0 = not set yet */
} kgroup;

/* A closed batch not taken yet: events [from, end) of its stream. */
typedef struct kcut {
    uint64_t seq;
    uint32_t end;
} kcut;

/* One tenant's events and group table. */
typedef struct kstream {
    kgroup *grp;        /* NGROUPS, NULL until its first block */
    kvp_kvev *ev;       /* recorded since the last take, in order */
    uint32_t n, cap;
    kcut *cuts;         /* closed batches among them */
    uint32_t ncuts, cutcap;
    uint64_t seq;       /* the last batch's seq; 0 = none in this instance */
    uint64_t announced; /* objects with an event bit set */
    uint8_t started;    /* its first event (AllBlocksCleared) was recorded */
    uint8_t lost;       /* an event was lost since the last batch: skip a seq */
    uint8_t dirty;      /* on b->dirty */
    uint8_t warned;     /* a conflict was logged */
} kstream;

/* Batches of a released tenant, kept under its name until the next take. */
typedef struct kretired {
    char *topic;
    size_t len;
    kstream s; /* ev, n, cuts only */
} kretired;

struct kvp_kvblk {
    kvp_index ix;
    kstream *ts;        /* per tenant id */
    uint32_t nts;
    uint16_t *dirty;    /* tenants with events recorded since the last take */
    uint32_t ndirty;
    kretired *ret;
    uint32_t nret, retcap;
    int events;
    uint64_t pending;   /* events recorded since the last take */
    kvp_kvblk_tiers_fn tiers;
    kvp_kvblk_name_fn name;
    void *ctx;
    kvp_kvblk_stats st;
};

/* An engine's block hash is a cryptographic hash's bits already: a cheap
 * mix with the tenant and group places it (the index recomputes it for
 * every entry it moves, so it must be cheap). */
static inline uint64_t bhash(uint16_t t, uint64_t hash, unsigned group)
{
    uint64_t x = hash ^ (((uint64_t)t << 8 | group) + 1) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 32;
    x *= 0xD6E8FEB86659FD93ull;
    return x ^ (x >> 32);
}

static uint64_t obj_bhash(const kvp_obj *o) { return bhash(o->tenant, kvp_obj_blk(o), o->group); }

int kvp_kvblk_create(uint32_t max_tenants, int events, kvp_kvblk_tiers_fn tiers,
                     kvp_kvblk_name_fn name, void *ctx, kvp_kvblk **out)
{
    kvp_kvblk *b = kvp_calloc(1, sizeof *b);
    if (!b)
        return KVP_ENOMEM;
    b->nts = max_tenants;
    b->ts = kvp_calloc(max_tenants, sizeof *b->ts);
    b->dirty = kvp_calloc(max_tenants, sizeof *b->dirty);
    if (!b->ts || !b->dirty || kvp_index_init_by(&b->ix, 0, obj_bhash) != 0) {
        kvp_free(b->ts);
        kvp_free(b->dirty);
        kvp_free(b);
        return KVP_ENOMEM;
    }
    b->events = events;
    b->tiers = tiers;
    b->name = name;
    b->ctx = ctx;
    *out = b;
    return 0;
}

static void stream_free(kstream *s)
{
    kvp_free(s->grp);
    kvp_free(s->ev);
    kvp_free(s->cuts);
}

void kvp_kvblk_destroy(kvp_kvblk *b)
{
    if (!b)
        return;
    for (uint32_t t = 0; t < b->nts; t++)
        stream_free(&b->ts[t]);
    for (uint32_t i = 0; i < b->nret; i++) {
        kvp_free(b->ret[i].topic);
        stream_free(&b->ret[i].s);
    }
    kvp_free(b->ret);
    kvp_free(b->ts);
    kvp_free(b->dirty);
    kvp_index_free(&b->ix);
    kvp_free(b);
}

int kvp_kvblk_events(const kvp_kvblk *b) { return b->events; }

/* ============================================================ the index */

int kvp_kvblk_admit(kvp_kvblk *b, uint16_t t, const kvp_blkinfo *bi)
{
    if (!bi || (bi->flags & KVP_BLK_F_NONE))
        return 0;
    if (bi->group > KVP_OBJ_MAX_GROUP || bi->parts == 0 || bi->block_size == 0)
        return KVP_EINVALID_PARAMS;
    KVP_ASSERT(t < b->nts);
    kstream *s = &b->ts[t];
    if (!s->grp && !(s->grp = kvp_calloc(NGROUPS, sizeof *s->grp)))
        return 0;
    kgroup *g = &s->grp[bi->group];
    if (g->parts == 0) {
        g->parts = bi->parts;
        g->block_size = bi->block_size;
    } else if (g->parts != bi->parts || g->block_size != bi->block_size) {
        b->st.conflicts++;
        if (!s->warned) {
            s->warned = 1;
            KVP_WARN(MOD,
                     "tenant %u group %u: a put says %u parts of %u tokens, the tenant's blocks "
                     "have %u of %u: its objects are stored without their block (one model per "
                     "tenant)",
                     t, bi->group, bi->parts, bi->block_size, g->parts, g->block_size);
        }
        return 0;
    }
    return kvp_index_reserve(&b->ix) == 0 ? 1 : 0;
}

int kvp_kvblk_group(const kvp_kvblk *b, uint16_t t, uint8_t g, uint16_t *parts,
                    uint32_t *block_size)
{
    const kstream *s = &b->ts[t];
    if (!s->grp || g > KVP_OBJ_MAX_GROUP || !s->grp[g].parts)
        return 0;
    *parts = s->grp[g].parts;
    *block_size = s->grp[g].block_size;
    return 1;
}

int kvp_kvblk_reserve(kvp_kvblk *b) { return kvp_index_reserve(&b->ix); }

void kvp_kvblk_insert(kvp_kvblk *b, kvp_obj *o)
{
    KVP_ASSERT(o->blk && !o->ev_dram && !o->ev_disk);
    kvp_index_insert(&b->ix, obj_bhash(o), o);
    b->st.objects++;
}

static unsigned parts_of(const kvp_kvblk *b, const kvp_obj *o)
{
    const kstream *s = &b->ts[o->tenant];
    return s->grp ? s->grp[o->group].parts : 0;
}

static int same_block(const kvp_obj *a, const kvp_obj *o)
{
    return a->tenant == o->tenant && a->group == o->group && kvp_obj_blk(a) == kvp_obj_blk(o);
}

/* Other objects of o's block counted in tier `dram` (1) or disk (0). */
static unsigned others_counted(const kvp_kvblk *b, const kvp_obj *o, int dram)
{
    kvp_index_it it;
    unsigned n = 0;
    kvp_index_it_init(&b->ix, obj_bhash(o), &it);
    for (kvp_obj *a; (a = kvp_index_it_next(&b->ix, &it));)
        if (a != o && same_block(a, o) && (dram ? a->ev_dram : a->ev_disk))
            n++;
    return n;
}

/* ============================================================ the events */

static void stream_dirty(kvp_kvblk *b, uint16_t t)
{
    kstream *s = &b->ts[t];
    if (!s->dirty) {
        s->dirty = 1;
        b->dirty[b->ndirty++] = t;
    }
}

static int push(kvp_kvblk *b, kstream *s, const kvp_kvev *e)
{
    if (s->n == s->cap) {
        uint32_t nc = s->cap ? s->cap * 2 : 64;
        kvp_kvev *ne = kvp_realloc(s->ev, (size_t)nc * sizeof *ne);
        if (!ne) {
            s->lost = 1;
            b->st.lost++;
            return KVP_ENOMEM;
        }
        s->ev = ne;
        s->cap = nc;
    }
    s->ev[s->n++] = *e;
    b->st.events++;
    b->pending++;
    return 0;
}

static void record(kvp_kvblk *b, uint16_t t, const kvp_kvev *e)
{
    kstream *s = &b->ts[t];
    stream_dirty(b, t);
    if (!s->started && e->type != KVP_KVEV_CLEARED) {
        /* a stream's first words in this instance: forget what was said */
        kvp_kvev c = {.type = KVP_KVEV_CLEARED};
        push(b, s, &c);
    }
    s->started = 1;
    push(b, s, e);
}

void kvp_kvblk_cleared(kvp_kvblk *b, uint16_t t)
{
    if (!b->events)
        return;
    kvp_kvev c = {.type = KVP_KVEV_CLEARED};
    record(b, t, &c);
}

/* o's tier bits move to `now` (KVP_TIER_*): the edges of its block. */
static void sync_to(kvp_kvblk *b, kvp_obj *o, unsigned now, uint64_t parent, int has_parent)
{
    unsigned parts = parts_of(b, o);
    int had_any = o->ev_dram || o->ev_disk;
    for (int dram = 1; dram >= 0; dram--) {
        int want = (now & (dram ? KVP_TIER_DRAM : KVP_TIER_DISK)) != 0;
        int had = dram ? o->ev_dram : o->ev_disk;
        if (want == had)
            continue;
        unsigned n = others_counted(b, o, dram) + 1; /* with o: after a store, before a removal */
        if (dram)
            o->ev_dram = want;
        else
            o->ev_disk = want;
        if (n != parts)
            continue;
        kvp_kvev e = {.hash = kvp_obj_blk(o),
                      .type = want ? KVP_KVEV_STORED : KVP_KVEV_REMOVED,
                      .medium = dram ? KVP_KVEV_DRAM : KVP_KVEV_DISK,
                      .group = (uint8_t)o->group};
        if (want) {
            e.block_size = b->ts[o->tenant].grp[o->group].block_size;
            if (dram && has_parent) {
                e.parent = parent;
                e.has_parent = 1;
            }
        }
        record(b, o->tenant, &e);
    }
    int has_any = o->ev_dram || o->ev_disk;
    kstream *s = &b->ts[o->tenant];
    if (has_any && !had_any)
        s->announced++;
    else if (!has_any && had_any)
        s->announced--;
}

void kvp_kvblk_sync(kvp_kvblk *b, kvp_obj *o, uint64_t parent, int has_parent)
{
    if (b->events && o->blk && parts_of(b, o))
        sync_to(b, o, b->tiers(b->ctx, o), parent, has_parent);
}

void kvp_kvblk_remove(kvp_kvblk *b, kvp_obj *o)
{
    KVP_ASSERT(o->blk);
    if (b->events && parts_of(b, o))
        sync_to(b, o, 0, 0, 0);
    kvp_index_remove(&b->ix, o);
    KVP_ASSERT(b->st.objects > 0);
    b->st.objects--;
}

uint64_t kvp_kvblk_announced(const kvp_kvblk *b, uint16_t t) { return b->ts[t].announced; }

/* Numbers the stream's open events as one batch (none: nothing). */
static void close_open(kvp_kvblk *b, kstream *s, uint64_t wall_us)
{
    uint32_t from = s->ncuts ? s->cuts[s->ncuts - 1].end : 0;
    if (s->n == from)
        return;
    if (s->ncuts == s->cutcap) {
        uint32_t nc = s->cutcap ? s->cutcap * 2 : 4;
        kcut *ncut = kvp_realloc(s->cuts, (size_t)nc * sizeof *ncut);
        if (!ncut) { /* the events cannot be numbered: lost */
            b->st.lost += s->n - from;
            s->n = from;
            s->lost = 1;
            return;
        }
        s->cuts = ncut;
        s->cutcap = nc;
    }
    uint64_t seq = s->seq ? s->seq + 1 + s->lost : (wall_us ? wall_us : 1);
    s->lost = 0;
    s->seq = seq;
    s->cuts[s->ncuts++] = (kcut){seq, s->n};
    b->st.batches++;
}

uint64_t kvp_kvblk_close(kvp_kvblk *b, uint16_t t, uint64_t wall_us)
{
    kstream *s = &b->ts[t];
    if (b->events)
        close_open(b, s, wall_us);
    return s->seq;
}

static void hand_out(kstream *s, const char *topic, size_t len, kvp_kvblk_sink sink, void *ctx)
{
    uint32_t from = 0;
    for (uint32_t i = 0; i < s->ncuts; i++) {
        sink(ctx, topic, len, s->cuts[i].seq, s->ev + from, s->cuts[i].end - from);
        from = s->cuts[i].end;
    }
    s->n = s->ncuts = 0;
    if (s->cap > KEEP_EVENTS) { /* a burst: give its memory back */
        kvp_free(s->ev);
        s->ev = NULL;
        s->cap = 0;
    }
}

void kvp_kvblk_tenant_gone(kvp_kvblk *b, uint16_t t)
{
    kstream *s = &b->ts[t];
    kvp_free(s->grp);
    s->grp = NULL;
    s->warned = 0;
    KVP_ASSERT(s->announced == 0);
    if (!b->events || !s->started)
        return;
    close_open(b, s, 0);
    if (s->ncuts && b->nret == b->retcap) {
        uint32_t nc = b->retcap ? b->retcap * 2 : 4;
        kretired *nr = kvp_realloc(b->ret, (size_t)nc * sizeof *nr);
        if (nr) {
            b->ret = nr;
            b->retcap = nc;
        }
    }
    size_t len = 0;
    const char *name = b->name(b->ctx, t, &len);
    char *topic = s->ncuts && b->nret < b->retcap ? kvp_strndup(name, len) : NULL;
    if (topic) {
        kretired *r = &b->ret[b->nret++];
        r->topic = topic;
        r->len = len;
        memset(&r->s, 0, sizeof r->s);
        r->s.ev = s->ev;
        r->s.n = s->n;
        r->s.cap = s->cap;
        r->s.cuts = s->cuts;
        r->s.ncuts = s->ncuts;
        r->s.cutcap = s->cutcap;
        s->ev = NULL;
        s->cuts = NULL;
        s->cap = s->cutcap = 0;
    } else if (s->ncuts) {
        b->st.lost += s->n;
    }
    s->n = s->ncuts = 0;
    /* a stream used again starts over: AllBlocksCleared, a later seq */
    s->started = 0;
    s->seq = 0;
    s->lost = 0;
}

uint64_t kvp_kvblk_pending(const kvp_kvblk *b) { return b->pending; }

void kvp_kvblk_take(kvp_kvblk *b, uint64_t wall_us, kvp_kvblk_sink sink, void *ctx)
{
    b->pending = 0;
    for (uint32_t i = 0; i < b->nret; i++) {
        kretired *r = &b->ret[i];
        hand_out(&r->s, r->topic, r->len, sink, ctx);
        kvp_free(r->topic);
        stream_free(&r->s);
    }
    b->nret = 0;
    for (uint32_t i = 0; i < b->ndirty; i++) {
        uint16_t t = b->dirty[i];
        kstream *s = &b->ts[t];
        s->dirty = 0;
        close_open(b, s, wall_us);
        if (s->ncuts) {
            size_t len = 0;
            const char *name = b->name(b->ctx, t, &len);
            hand_out(s, name, len, sink, ctx);
        }
    }
    b->ndirty = 0;
}

/* ============================================================ queries */

void kvp_kvblk_lookup(const kvp_kvblk *b, uint16_t t, const kvp_hchain *c, kvp_hprefix *out)
{
    memset(out, 0, sizeof *out);
    const kstream *s = &b->ts[t];
    unsigned parts = s->grp && c->group <= KVP_OBJ_MAX_GROUP ? s->grp[c->group].parts : 0;
    if (!parts)
        return;
    int dram = 1, disk = 1, any = 1;
    for (uint32_t i = 0; i < c->n && (dram || disk || any); i++) {
        unsigned nd = 0, nk = 0, na = 0;
        kvp_index_it it;
        kvp_index_it_init(&b->ix, bhash(t, c->hashes[i], c->group), &it);
        for (kvp_obj *a; (a = kvp_index_it_next(&b->ix, &it));) {
            if (a->tenant != t || a->group != c->group || kvp_obj_blk(a) != c->hashes[i])
                continue;
            unsigned w = b->tiers(b->ctx, a);
            nd += (w & KVP_TIER_DRAM) != 0;
            nk += (w & KVP_TIER_DISK) != 0;
            na += w != 0;
        }
        dram = dram && nd >= parts;
        disk = disk && nk >= parts;
        any = any && na >= parts;
        out->dram += (uint32_t)dram;
        out->disk += (uint32_t)disk;
        out->any += (uint32_t)any;
    }
}

/* The object of a slot value of either table (index.h: the low 48 bits). */
static const kvp_obj *slot_obj(uint64_t s)
{
    return (const kvp_obj *)(uintptr_t)(s & 0xFFFFFFFFFFFFull);
}

/* o's bits as the snapshot reports them: announced (events), or now. */
static unsigned snap_bits(const kvp_kvblk *b, const kvp_obj *o)
{
    if (!b->events)
        return b->tiers(b->ctx, o);
    return (o->ev_dram ? KVP_TIER_DRAM : 0u) | (o->ev_disk ? KVP_TIER_DISK : 0u);
}

/* Is o the first object of its block (probe order) with tier bit `bit`, and
 * does the block have all its parts there? */
static int block_leader(const kvp_kvblk *b, const kvp_obj *o, unsigned bit, unsigned parts)
{
    kvp_index_it it;
    unsigned n = 0;
    const kvp_obj *first = NULL;
    kvp_index_it_init(&b->ix, obj_bhash(o), &it);
    for (kvp_obj *a; (a = kvp_index_it_next(&b->ix, &it));) {
        if (!same_block(a, o) || !(snap_bits(b, a) & bit))
            continue;
        if (!first)
            first = a;
        n++;
    }
    return first == o && n >= parts;
}

static uint64_t snap_table(const kvp_kvblk *b, const uint64_t *slots, uint64_t mask, uint16_t t,
                           void (*fn)(void *, uint64_t, uint8_t, uint8_t), void *ctx)
{
    uint64_t n = 0;
    unsigned parts = 0;
    for (uint64_t i = 0; slots && i <= mask; i++) {
        const kvp_obj *o = slot_obj(slots[i]);
        if (!o || o->tenant != t || !(parts = parts_of(b, o)))
            continue;
        unsigned bits = snap_bits(b, o);
        for (unsigned bit = KVP_TIER_DRAM; bit <= KVP_TIER_DISK; bit <<= 1)
            if ((bits & bit) && block_leader(b, o, bit, parts)) {
                fn(ctx, kvp_obj_blk(o), (uint8_t)o->group, (uint8_t)bit);
                n++;
            }
    }
    return n;
}

uint64_t kvp_kvblk_snapshot(kvp_kvblk *b, uint16_t t,
                            void (*fn)(void *ctx, uint64_t hash, uint8_t group, uint8_t tier),
                            void *ctx)
{
    if (!b->ts[t].grp)
        return 0;
    return snap_table(b, b->ix.slots, b->ix.mask, t, fn, ctx) +
           (b->ix.old ? snap_table(b, b->ix.old, b->ix.old_mask, t, fn, ctx) : 0);
}

void kvp_kvblk_stats_get(const kvp_kvblk *b, kvp_kvblk_stats *st)
{
    *st = b->st;
    st->index_bytes = (b->ix.mask + 1) * 8 + (b->ix.old ? (b->ix.old_mask + 1) * 8 : 0);
}

/* Counts the table's entries and their tenants' announced objects; with
 * events, every object's bits must be where it is now (a tier move the
 * master did not sync shows here). UINT64_MAX when something is wrong. */
static uint64_t check_table(const kvp_kvblk *b, const uint64_t *slots, uint64_t mask,
                            uint64_t *ann)
{
    uint64_t n = 0;
    for (uint64_t i = 0; slots && i <= mask; i++) {
        const kvp_obj *o = slot_obj(slots[i]);
        if (!o)
            continue;
        n++;
        if (!o->blk || o->tenant >= b->nts)
            return UINT64_MAX;
        ann[o->tenant] += o->ev_dram || o->ev_disk;
        if (b->events && parts_of(b, o)) {
            unsigned w = b->tiers(b->ctx, o);
            if (o->ev_dram != !!(w & KVP_TIER_DRAM) || o->ev_disk != !!(w & KVP_TIER_DISK))
                return UINT64_MAX;
        } else if (o->ev_dram || o->ev_disk) {
            return UINT64_MAX;
        }
    }
    return n;
}

int kvp_kvblk_check(const kvp_kvblk *b)
{
    uint64_t *ann = kvp_calloc(b->nts, sizeof *ann);
    if (!ann)
        return 0; /* cannot check */
    uint64_t n = check_table(b, b->ix.slots, b->ix.mask, ann);
    uint64_t m = b->ix.old ? check_table(b, b->ix.old, b->ix.old_mask, ann) : 0;
    int bad = n == UINT64_MAX || m == UINT64_MAX || n + m != b->st.objects ||
              b->ix.count != b->st.objects;
    for (uint32_t t = 0; !bad && t < b->nts; t++)
        bad = ann[t] != b->ts[t].announced;
    kvp_free(ann);
    return bad ? -1 : 0;
}
