/*
 * coord.c -- hybrid KV-cache hit / mask oracle (spec §7). See coord.h.
 *
 * The per-spec managers of vLLM core (§7.3) are pure functions here
 * (mgr_full, mgr_swa, mgr_mamba) over a presence predicate; the fixed-point
 * loop of §7.4 calls them per attention group (groups with an equal spec
 * merged). Managers write their block list straight into the caller's mask
 * of the attention group's first member; members are copied at the end.
 */
#include "connector/coord.h"

#include <string.h>

#include "common/mem.h"
#include "kvpool.h"

/* ---------------------------------------------------------------- pool */

struct kvp_coord_pool {
    size_t hash_len;
    size_t slot_len; /* 4-byte tag (group + 1, 0 = empty) + hash */
    size_t mask;     /* table size - 1 (power of two) */
    size_t count;
    uint8_t *slots;
};

static uint64_t pool_hash(uint32_t group, const uint8_t *h, size_t len)
{
    /* FNV-1a over the group and at most 16 hash bytes (the hashes are
     * already digests), then a final avalanche (splitmix64). */
    uint64_t x = 1469598103934665603ull;
    for (int i = 0; i < 4; i++) {
        x ^= (group >> (8 * i)) & 0xff;
        x *= 1099511628211ull;
    }
    size_t k = len < 16 ? len : 16;
    for (size_t i = 0; i < k; i++) {
        x ^= h[i];
        x *= 1099511628211ull;
    }
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint32_t slot_tag(const uint8_t *s)
{
    uint32_t t;
    memcpy(&t, s, 4);
    return t;
}

/* Index of (group, hash)'s slot or of the empty slot where it would go. */
static size_t pool_probe(const struct kvp_coord_pool *p, uint32_t group, const uint8_t *h)
{
    size_t i = (size_t)pool_hash(group, h, p->hash_len) & p->mask;
    for (;;) {
        const uint8_t *s = p->slots + i * p->slot_len;
        uint32_t t = slot_tag(s);
        if (t == 0 || (t == group + 1 && memcmp(s + 4, h, p->hash_len) == 0))
            return i;
        i = (i + 1) & p->mask;
    }
}

static int pool_alloc_table(struct kvp_coord_pool *p, size_t nslots)
{
    uint8_t *t = kvp_calloc(nslots, p->slot_len);
    if (!t)
        return KVP_ENOMEM;
    p->slots = t;
    p->mask = nslots - 1;
    return 0;
}

int kvp_coord_pool_create(struct kvp_coord_pool **out, size_t hash_len, size_t expected)
{
    if (!out || hash_len == 0 || hash_len > 1024)
        return KVP_EINVALID_PARAMS;
    *out = NULL;
    struct kvp_coord_pool *p = kvp_calloc(1, sizeof(*p));
    if (!p)
        return KVP_ENOMEM;
    p->hash_len = hash_len;
    p->slot_len = 4 + hash_len;
    size_t n = 16;
    while (n < expected * 2 && n < ((size_t)1 << 40))
        n <<= 1;
    int rc = pool_alloc_table(p, n);
    if (rc) {
        kvp_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void kvp_coord_pool_destroy(struct kvp_coord_pool *p)
{
    if (!p)
        return;
    kvp_free(p->slots);
    kvp_free(p);
}

static int pool_grow(struct kvp_coord_pool *p)
{
    uint8_t *old = p->slots;
    size_t oldn = p->mask + 1;
    int rc = pool_alloc_table(p, oldn * 2);
    if (rc)
        return rc; /* p unchanged */
    for (size_t i = 0; i < oldn; i++) {
        const uint8_t *s = old + i * p->slot_len;
        uint32_t t = slot_tag(s);
        if (t == 0)
            continue;
        size_t j = pool_probe(p, t - 1, s + 4);
        memcpy(p->slots + j * p->slot_len, s, p->slot_len);
    }
    kvp_free(old);
    return 0;
}

int kvp_coord_pool_add(struct kvp_coord_pool *p, uint32_t group, const uint8_t *hash)
{
    if (!p || !hash || group == UINT32_MAX)
        return KVP_EINVALID_PARAMS;
    size_t i = pool_probe(p, group, hash);
    if (slot_tag(p->slots + i * p->slot_len) != 0)
        return 0;
    if ((p->count + 1) * 2 > p->mask + 1) {
        int rc = pool_grow(p);
        if (rc)
            return rc;
        i = pool_probe(p, group, hash);
    }
    uint8_t *s = p->slots + i * p->slot_len;
    uint32_t t = group + 1;
    memcpy(s, &t, 4);
    memcpy(s + 4, hash, p->hash_len);
    p->count++;
    return 0;
}

int kvp_coord_pool_contains(const struct kvp_coord_pool *p, uint32_t group, const uint8_t *hash)
{
    if (!p || !hash || group == UINT32_MAX)
        return 0;
    size_t i = pool_probe(p, group, hash);
    return slot_tag(p->slots + i * p->slot_len) != 0;
}

size_t kvp_coord_pool_count(const struct kvp_coord_pool *p)
{
    return p ? p->count : 0;
}

size_t kvp_coord_pool_hash_len(const struct kvp_coord_pool *p)
{
    return p ? p->hash_len : 0;
}

int kvp_coord_pool_has_all(const struct kvp_coord_pool *p, const uint32_t *gids, size_t ngids,
                           const uint8_t *hash)
{
    if (!p)
        return 1;
    for (size_t i = 0; i < ngids; i++)
        if (!kvp_coord_pool_contains(p, gids[i], hash))
            return 0;
    return 1;
}

/* ---------------------------------------------------------------- sizes */

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int kvp_coord_resolve_block_sizes(const struct kvp_coord_group *groups, size_t ngroups,
                                  uint32_t hash_block_size, uint32_t *sched_out,
                                  uint32_t *hash_out)
{
    if (!groups || ngroups == 0 || !sched_out || !hash_out)
        return KVP_EINVALID_PARAMS;
    uint64_t l = 1, g = 0;
    for (size_t i = 0; i < ngroups; i++) {
        uint64_t b = groups[i].block_size;
        if (b == 0)
            return KVP_EINVALID_PARAMS;
        l = l / gcd64(l, b) * b;
        if (l > UINT32_MAX)
            return KVP_EINVALID_PARAMS;
        g = gcd64(g, b);
    }
    uint64_t h;
    if (ngroups == 1)
        h = groups[0].block_size;
    else
        h = hash_block_size ? hash_block_size : g;
    for (size_t i = 0; i < ngroups; i++)
        if (groups[i].block_size % h != 0)
            return KVP_EINVALID_PARAMS;
    *sched_out = (uint32_t)l;
    *hash_out = (uint32_t)h;
    return 0;
}

/* ---------------------------------------------------------------- coordinator */

/* One vLLM "attention group": a spec and the KV-cache groups sharing it. */
struct attn_group {
    struct kvp_coord_group spec;
    uint32_t gids[KVP_COORD_MAX_GROUPS];
    size_t ngids;
    int eagle;
};

struct kvp_coord {
    struct kvp_coord_group groups[KVP_COORD_MAX_GROUPS];
    size_t ngroups;
    uint32_t L, H;
    int partial;
    int64_t retention;
    uint32_t dcp;
    int eagle_group[KVP_COORD_MAX_GROUPS];
    struct attn_group ag[KVP_COORD_MAX_GROUPS]; /* full attention first */
    size_t nag;
};

static int same_spec(const struct kvp_coord_group *a, const struct kvp_coord_group *b)
{
    return a->kind == b->kind && a->block_size == b->block_size && a->spec_tag == b->spec_tag &&
           (a->kind != KVP_COORD_SWA || a->window == b->window);
}

int kvp_coord_create(struct kvp_coord **out, const struct kvp_coord_cfg *cfg)
{
    if (!out)
        return KVP_EINVALID_PARAMS;
    *out = NULL;
    if (!cfg || !cfg->groups || cfg->ngroups == 0 || cfg->ngroups > KVP_COORD_MAX_GROUPS)
        return KVP_EINVALID_PARAMS;
    uint32_t H = cfg->hash_block_size;
    if (H == 0)
        return KVP_EINVALID_PARAMS;
    uint64_t l = 1;
    for (size_t i = 0; i < cfg->ngroups; i++) {
        const struct kvp_coord_group *g = &cfg->groups[i];
        if (g->block_size == 0 || g->block_size % H != 0)
            return KVP_EINVALID_PARAMS;
        if (g->kind != KVP_COORD_FULL && g->kind != KVP_COORD_SWA && g->kind != KVP_COORD_MAMBA)
            return KVP_EINVALID_PARAMS;
        if (g->kind == KVP_COORD_SWA && g->window == 0)
            return KVP_EINVALID_PARAMS;
        l = l / gcd64(l, g->block_size) * g->block_size;
        if (l > UINT32_MAX)
            return KVP_EINVALID_PARAMS;
    }
    uint64_t L = cfg->scheduler_block_size ? cfg->scheduler_block_size : l;
    if (L % H != 0)
        return KVP_EINVALID_PARAMS;
    for (size_t i = 0; i < cfg->ngroups; i++)
        if (L % cfg->groups[i].block_size != 0)
            return KVP_EINVALID_PARAMS;

    struct kvp_coord *c = kvp_calloc(1, sizeof(*c));
    if (!c)
        return KVP_ENOMEM;
    memcpy(c->groups, cfg->groups, cfg->ngroups * sizeof(*cfg->groups));
    c->ngroups = cfg->ngroups;
    c->L = (uint32_t)L;
    c->H = H;
    c->retention = cfg->retention_interval < 0 ? -1 : cfg->retention_interval;
    c->dcp = cfg->dcp_world_size ? cfg->dcp_world_size : 1;
    for (size_t i = 0; i < c->ngroups; i++) {
        const struct kvp_coord_group *g = &c->groups[i];
        if (g->kind == KVP_COORD_MAMBA &&
            ((c->dcp == 1 && g->block_size > H) || (c->dcp > 1 && g->block_size >= H)))
            c->partial = 1;
    }

    /* Attention groups: merge equal specs (OR the eagle flags), then a
     * stable partition with full attention first (§7.2). */
    struct attn_group tmp[KVP_COORD_MAX_GROUPS];
    size_t ntmp = 0;
    for (size_t i = 0; i < c->ngroups; i++) {
        size_t j;
        for (j = 0; j < ntmp; j++)
            if (same_spec(&tmp[j].spec, &c->groups[i]))
                break;
        if (j == ntmp) {
            memset(&tmp[j], 0, sizeof(tmp[j]));
            tmp[j].spec = c->groups[i];
            ntmp++;
        }
        tmp[j].gids[tmp[j].ngids++] = (uint32_t)i;
        tmp[j].eagle |= c->groups[i].is_eagle ? 1 : 0;
    }
    int any_flag = 0;
    for (size_t j = 0; j < ntmp; j++)
        any_flag |= tmp[j].eagle;
    if (cfg->use_eagle && !any_flag)
        for (size_t j = 0; j < ntmp; j++)
            tmp[j].eagle = 1;
    for (int pass = 0; pass < 2; pass++)
        for (size_t j = 0; j < ntmp; j++)
            if ((tmp[j].spec.kind == KVP_COORD_FULL) == (pass == 0))
                c->ag[c->nag++] = tmp[j];
    for (size_t j = 0; j < c->nag; j++)
        for (size_t k = 0; k < c->ag[j].ngids; k++)
            c->eagle_group[c->ag[j].gids[k]] = c->ag[j].eagle;
    *out = c;
    return 0;
}

void kvp_coord_destroy(struct kvp_coord *c)
{
    kvp_free(c);
}

size_t kvp_coord_ngroups(const struct kvp_coord *c)
{
    return c->ngroups;
}

const struct kvp_coord_group *kvp_coord_group_spec(const struct kvp_coord *c, size_t g)
{
    return g < c->ngroups ? &c->groups[g] : NULL;
}

uint32_t kvp_coord_lcm_block_size(const struct kvp_coord *c)
{
    return c->L;
}

uint32_t kvp_coord_hash_block_size(const struct kvp_coord *c)
{
    return c->H;
}

int kvp_coord_partial_hits(const struct kvp_coord *c)
{
    return c->partial;
}

uint32_t kvp_coord_alignment(const struct kvp_coord *c)
{
    return c->partial ? c->H : c->L;
}

size_t kvp_coord_align_lookup_length(const struct kvp_coord *c, size_t n)
{
    size_t a = kvp_coord_alignment(c);
    return n / a * a;
}

int kvp_coord_is_eagle_group(const struct kvp_coord *c, size_t g)
{
    return g < c->ngroups ? c->eagle_group[g] : 0;
}

static size_t cdiv(size_t a, size_t b)
{
    return a / b + (a % b != 0);
}

size_t kvp_coord_mask_cap(const struct kvp_coord *c, size_t g, size_t tokens)
{
    return g < c->ngroups ? cdiv(tokens, c->groups[g].block_size) : 0;
}

int kvp_coord_block_hashes_for_spec(const struct kvp_coord_hashes *in, uint32_t hash_block_size,
                                    uint32_t block_size, struct kvp_coord_hashes *out)
{
    if (!in || !out || hash_block_size == 0 || block_size == 0 || block_size % hash_block_size)
        return KVP_EINVALID_PARAMS;
    size_t r = block_size / hash_block_size;
    size_t stride = in->stride ? in->stride : in->hash_len;
    out->hash_len = in->hash_len;
    out->n = in->n / r;
    out->stride = stride * r;
    out->data = out->n ? in->data + (r - 1) * stride : in->data;
    return 0;
}

/* ---------------------------------------------------------------- managers (§7.3) */

/* Inputs shared by the three managers for one call. */
struct mgr_ctx {
    const struct kvp_coord *c;
    const struct attn_group *ag;
    const struct kvp_coord_hashes *hs; /* the raw chain at H */
    const struct kvp_coord_pool *pool;
    size_t stride;
};

static const uint8_t *raw_hash(const struct mgr_ctx *m, size_t u)
{
    return m->hs->data + u * m->stride;
}

/* Hash of chunk i at the attention group's block size (compact rule). */
static const uint8_t *chunk_hash(const struct mgr_ctx *m, size_t i)
{
    size_t r = m->ag->spec.block_size / m->c->H;
    return raw_hash(m, (i + 1) * r - 1);
}

static size_t chunk_count(const struct mgr_ctx *m)
{
    return m->hs->n / (m->ag->spec.block_size / m->c->H);
}

static int present(const struct mgr_ctx *m, const uint8_t *h)
{
    return kvp_coord_pool_has_all(m->pool, m->ag->gids, m->ag->ngids, h);
}

static size_t min_sz(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* memset(bits, 0, n) that tolerates bits == NULL when n == 0. */
static void zero_bits(uint8_t *bits, size_t n)
{
    if (n)
        memset(bits, 0, n);
}

/*
 * Full attention: longest prefix of present chunks (the chain makes a miss
 * final), then, fine-grained (align < B, B % align == 0; align == H), the
 * highest present interior hash boundary of the first missing block; eagle
 * pops one block (B tokens); finally align the hit down and keep
 * ceil(hit/B) blocks. Returns the hit; out->len = blocks kept.
 */
static size_t mgr_full(const struct mgr_ctx *m, size_t maxlen, int drop, size_t align,
                       struct kvp_coord_mask *out)
{
    size_t B = m->ag->spec.block_size;
    size_t maxb = min_sz(maxlen / B, chunk_count(m));
    size_t len = 0;
    while (len < maxb && present(m, chunk_hash(m, len)))
        out->bits[len++] = 1;
    size_t hit = len * B;
    if (align < B && B % align == 0) {
        size_t r = B / align;
        size_t first = len * r;
        size_t hi = min_sz(min_sz(first + r - 1, maxlen / align), m->hs->n);
        for (size_t fi = hi; fi-- > first;) {
            if (present(m, raw_hash(m, fi))) {
                out->bits[len++] = 1;
                hit = (fi + 1) * align;
                break;
            }
        }
    }
    if (drop && len > 0) {
        len--;
        hit = hit >= B ? hit - B : 0;
    }
    hit -= hit % align;
    len = min_sz(len, cdiv(hit, B));
    out->len = len;
    return hit;
}

/*
 * Sliding window: right-to-left scan for a run of `need` present chunks
 * whose right end is aligned (eagle: one chunk more, aligned one chunk
 * earlier); else the leading run from chunk 0 (aligned down). Eagle then
 * pops one chunk and re-aligns. Chunks outside the kept run are null.
 */
static size_t mgr_swa(const struct mgr_ctx *m, size_t maxlen, int drop, size_t align,
                      struct kvp_coord_mask *out)
{
    size_t B = m->ag->spec.block_size;
    size_t need = cdiv(m->ag->spec.window - 1, B) + (drop ? 1 : 0);
    size_t maxb = min_sz(maxlen / B, chunk_count(m));
    zero_bits(out->bits, maxb);
    size_t run = 0, len = 0;
    int matched = 0;
    for (size_t i = maxb; i-- > 0;) {
        if (!present(m, chunk_hash(m, i))) {
            run = 0;
            continue;
        }
        if (run == 0 && B != align && ((drop ? i : i + 1) * B) % align != 0)
            continue;
        out->bits[i] = 1;
        run++;
        if (run >= need) {
            len = i + run;
            matched = 1;
            break;
        }
    }
    if (!matched) {
        len = run;
        while (B != align && (len * B) % align != 0)
            len--;
    }
    if (drop && len > 0) {
        len--;
        while (B != align && (len * B) % align != 0)
            len--;
    }
    out->len = len;
    return len * B;
}

/*
 * Mamba ("align"): only the state block at the hit point is needed. Fine
 * (align < B): highest present hash boundary u < min(maxlen/align, n);
 * coarse: highest present aligned chunk. Never drops an eagle block.
 */
static size_t mgr_mamba(const struct mgr_ctx *m, size_t maxlen, size_t align,
                        struct kvp_coord_mask *out)
{
    size_t B = m->ag->spec.block_size;
    out->len = 0;
    if (align < B && B % align == 0) {
        size_t r = B / align;
        for (size_t fi = min_sz(maxlen / align, m->hs->n); fi-- > 0;) {
            if (present(m, raw_hash(m, fi))) {
                size_t len = fi / r + 1;
                zero_bits(out->bits, len - 1);
                out->bits[len - 1] = 1;
                out->len = len;
                return (fi + 1) * align;
            }
        }
        return 0;
    }
    for (size_t i = min_sz(maxlen / B, chunk_count(m)); i-- > 0;) {
        if (((i + 1) * B) % align != 0)
            continue;
        if (present(m, chunk_hash(m, i))) {
            zero_bits(out->bits, i);
            out->bits[i] = 1;
            out->len = i + 1;
            return (i + 1) * B;
        }
    }
    return 0;
}

static size_t mgr_call(const struct mgr_ctx *m, size_t maxlen, int drop, size_t align,
                       struct kvp_coord_mask *out)
{
    switch (m->ag->spec.kind) {
    case KVP_COORD_FULL:
        return mgr_full(m, maxlen, drop, align, out);
    case KVP_COORD_SWA:
        return mgr_swa(m, maxlen, drop, align, out);
    default:
        return mgr_mamba(m, maxlen, align, out);
    }
}

/* ---------------------------------------------------------------- find (§7.4) */

int kvp_coord_find_longest_cache_hit(const struct kvp_coord *c,
                                     const struct kvp_coord_hashes *hashes, size_t max_length,
                                     const struct kvp_coord_pool *pool, int apply_eagle,
                                     struct kvp_coord_mask *masks, size_t *hit_out)
{
    if (!c || !hashes || !masks || !hit_out || (hashes->n && !hashes->data) || !hashes->hash_len)
        return KVP_EINVALID_PARAMS;
    if (pool && pool->hash_len != hashes->hash_len)
        return KVP_EINVALID_PARAMS;
    for (size_t g = 0; g < c->ngroups; g++) {
        if (masks[g].cap < kvp_coord_mask_cap(c, g, max_length) ||
            (masks[g].cap && !masks[g].bits))
            return KVP_EBUFFER_OVERFLOW;
        masks[g].first = 0;
        masks[g].len = 0;
        masks[g].all = 0;
    }
    size_t align = kvp_coord_alignment(c);
    struct mgr_ctx m = {.c = c,
                        .hs = hashes,
                        .pool = pool,
                        .stride = hashes->stride ? hashes->stride : hashes->hash_len};
    size_t hit;
    if (c->nag == 1) {
        m.ag = &c->ag[0];
        hit = mgr_call(&m, max_length, apply_eagle && m.ag->eagle, align, &masks[m.ag->gids[0]]);
    } else {
        /* Fixed point across attention groups (HybridKVCacheCoordinator). */
        size_t ag_hit[KVP_COORD_MAX_GROUPS];
        uint64_t computed = 0, verified_eagle = 0;
        int simple = c->nag == 2 && c->ag[0].spec.kind == KVP_COORD_FULL;
        hit = max_length;
        for (;;) {
            size_t cur = hit;
            for (size_t idx = 0; idx < c->nag; idx++) {
                const struct attn_group *ag = &c->ag[idx];
                uint64_t bit = (uint64_t)1 << idx;
                if (ag->spec.kind == KVP_COORD_FULL && (computed & bit)) {
                    cur = min_sz(cur, ag_hit[idx]); /* FA hits are prefix-closed */
                    continue;
                }
                int drop = apply_eagle && ag->eagle && !(verified_eagle & bit);
                size_t maxlen = cur;
                if (drop && ag->spec.kind != KVP_COORD_MAMBA) {
                    /* Peek one unit past cur so the pop lands on cur. */
                    size_t margin = (c->partial && ag->spec.kind == KVP_COORD_FULL &&
                                     ag->spec.block_size > c->H)
                                        ? c->H
                                        : ag->spec.block_size;
                    maxlen = min_sz(cur + margin, max_length);
                }
                m.ag = ag;
                size_t nw = mgr_call(&m, maxlen, drop, align, &masks[ag->gids[0]]);
                if (drop)
                    verified_eagle |= bit;
                else if (nw < cur)
                    verified_eagle = 0;
                cur = nw;
                ag_hit[idx] = nw;
                computed |= bit;
            }
            if (cur >= hit)
                break;
            hit = cur;
            if (simple)
                break;
        }
        for (size_t idx = 0; idx < c->nag; idx++) {
            const struct attn_group *ag = &c->ag[idx];
            if (ag->spec.kind != KVP_COORD_FULL)
                continue;
            struct kvp_coord_mask *mk = &masks[ag->gids[0]];
            mk->len = min_sz(mk->len, cdiv(hit, ag->spec.block_size));
        }
    }
    /* Scatter each attention group's block list to its other members. */
    for (size_t idx = 0; idx < c->nag; idx++) {
        const struct attn_group *ag = &c->ag[idx];
        const struct kvp_coord_mask *src = &masks[ag->gids[0]];
        for (size_t k = 1; k < ag->ngids; k++) {
            struct kvp_coord_mask *dst = &masks[ag->gids[k]];
            if (src->len)
                memcpy(dst->bits, src->bits, src->len);
            dst->len = src->len;
        }
    }
    *hit_out = hit;
    return 0;
}

int kvp_coord_load_mask(const struct kvp_coord *c, const struct kvp_coord_hashes *hashes,
                        size_t token_len, struct kvp_coord_mask *masks, size_t *hit_out)
{
    size_t hit = 0;
    int rc = kvp_coord_find_longest_cache_hit(c, hashes, token_len, NULL, 0, masks, &hit);
    if (rc == 0 && hit_out)
        *hit_out = hit;
    return rc;
}

/* ---------------------------------------------------------------- masks (§7.6) */

/* Python floor division for a possibly negative numerator. */
static int64_t floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

static void mark(struct kvp_coord_mask *out, size_t start, size_t end, int64_t lo, int64_t hi)
{
    if (lo < (int64_t)start)
        lo = (int64_t)start;
    if (hi > (int64_t)end)
        hi = (int64_t)end;
    for (int64_t i = lo; i < hi; i++)
        out->bits[i - (int64_t)start] = 1;
}

int kvp_coord_reachable_block_mask(const struct kvp_coord *c, size_t g, size_t start, size_t end,
                                   int use_eagle, int64_t retention, const int64_t *boundaries,
                                   size_t nboundaries, struct kvp_coord_mask *out)
{
    if (!c || !out || g >= c->ngroups || start > end || (nboundaries && !boundaries))
        return KVP_EINVALID_PARAMS;
    /* bits (cap >= end - start) are needed only for a non-dense answer */
    int short_buf = out->cap < end - start || (out->cap && !out->bits);
    const struct kvp_coord_group *spec = &c->groups[g];
    size_t B = spec->block_size;
    int64_t L = c->L;
    out->first = start;
    out->len = end - start;
    out->all = 1;
    /* Full attention is dense; an empty range is reported as dense too
     * (store_mask(0) -> all None). */
    if (spec->kind == KVP_COORD_FULL || start == end)
        return 0;
    if (spec->kind == KVP_COORD_SWA) {
        size_t need = cdiv(spec->window - 1, B) + (use_eagle ? 1 : 0);
        size_t shift = use_eagle ? 1 : 0;
        /* segment: L when retention is None, none when 0, else retention */
        size_t segment = retention < 0 ? (size_t)L : (size_t)retention;
        if (segment && need >= segment / B)
            return 0; /* every block is reachable */
        if (short_buf)
            return KVP_EBUFFER_OVERFLOW;
        zero_bits(out->bits, out->len);
        if (segment) {
            size_t per = segment / B;
            for (size_t i = start; i < end; i++)
                if (i >= shift && (i - shift) % per >= per - need)
                    out->bits[i - start] = 1;
        }
        out->all = 0;
        if (retention >= 0) {
            for (size_t k = 0; k < nboundaries; k++) {
                int64_t aligned = floordiv(boundaries[k], L) * L;
                int64_t e = aligned / (int64_t)B + (int64_t)shift;
                mark(out, start, end, e - (int64_t)need, e);
            }
        }
        return 0;
    }
    /* Mamba */
    if (retention < 0)
        return 0;
    if (retention > 0) {
        size_t per = (size_t)retention / B;
        if (per <= 1)
            return 0;
        if (short_buf)
            return KVP_EBUFFER_OVERFLOW;
        zero_bits(out->bits, out->len);
        for (size_t i = start; i < end; i++)
            if (i % per == per - 1)
                out->bits[i - start] = 1;
    } else {
        if (short_buf)
            return KVP_EBUFFER_OVERFLOW;
        zero_bits(out->bits, out->len);
    }
    out->all = 0;
    for (size_t k = 0; k < nboundaries; k++) {
        int64_t aligned = floordiv(boundaries[k], L) * L;
        int64_t blk = aligned / (int64_t)B - 1;
        mark(out, start, end, blk, blk + 1);
    }
    return 0;
}

static int reachable_masks(const struct kvp_coord *c, size_t aligned, size_t start_token,
                           int64_t num_prompt_tokens, int apply_eagle, int for_store,
                           struct kvp_coord_mask *masks)
{
    if (!c || !masks)
        return KVP_EINVALID_PARAMS;
    if (aligned % kvp_coord_alignment(c) != 0)
        return KVP_EINVALID_PARAMS;
    int64_t boundary = num_prompt_tokens >= 0 ? num_prompt_tokens - 1 : 0;
    size_t nb = (for_store && num_prompt_tokens >= 0) ? 1 : 0;
    int64_t retention = for_store ? c->retention : -1;
    for (size_t g = 0; g < c->ngroups; g++) {
        size_t B = c->groups[g].block_size;
        size_t end = aligned / B;
        size_t start = min_sz(end, cdiv(start_token, B));
        struct kvp_coord_mask *mk = &masks[g];
        if (for_store && c->groups[g].kind == KVP_COORD_MAMBA) {
            if (mk->cap < end - start || (mk->cap && !mk->bits))
                return KVP_EBUFFER_OVERFLOW;
            /* align-mode Mamba tables are not append-only: never stored here */
            mk->first = start;
            mk->len = end - start;
            mk->all = 0;
            zero_bits(mk->bits, mk->len);
            continue;
        }
        int rc = kvp_coord_reachable_block_mask(c, g, start, end,
                                                apply_eagle && c->eagle_group[g], retention,
                                                &boundary, nb, mk);
        if (rc)
            return rc;
    }
    return 0;
}

int kvp_coord_store_mask(const struct kvp_coord *c, size_t aligned_token_len, size_t start_token,
                         int64_t num_prompt_tokens, int apply_eagle, struct kvp_coord_mask *masks)
{
    return reachable_masks(c, aligned_token_len, start_token, num_prompt_tokens, apply_eagle, 1,
                           masks);
}

int kvp_coord_lookup_mask(const struct kvp_coord *c, size_t aligned_token_len, int apply_eagle,
                          struct kvp_coord_mask *masks)
{
    return reachable_masks(c, aligned_token_len, 0, -1, apply_eagle, 0, masks);
}
