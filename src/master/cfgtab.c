/*
 * cfgtab.c -- objects and bytes per configuration fingerprint. Contracts
 * are in cfgtab.h.
 */
#include "master/cfgtab.h"

#include <string.h>

#include "common/assert.h"
#include "common/mem.h"
#include "kvpool.h"

#define IX_SLOTS (4 * KVP_CFGTAB_MAX) /* a power of two, load <= 1/4 */

static int is_hex(uint8_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

int kvp_cfgtab_parse(const uint8_t *key, size_t len, kvp_cfgkey *out)
{
    static const char tag[] = "@cfg:";
    const size_t tl = sizeof tag - 1;
    if (!key || len < tl + KVP_CFGTAB_FP_MIN)
        return 0;
    /* the last "@cfg:"; its digits must run to '@' or the end */
    for (size_t at = len - tl + 1; at-- > 0;) {
        if (key[at] != '@' || memcmp(key + at, tag, tl) != 0)
            continue;
        size_t d = at + tl, n = 0;
        while (d + n < len && n <= KVP_CFGTAB_FP_MAX && is_hex(key[d + n]))
            n++;
        if (n < KVP_CFGTAB_FP_MIN || n > KVP_CFGTAB_FP_MAX || (d + n < len && key[d + n] != '@'))
            return 0; /* the last tag is malformed: the key names no configuration */
        *out = (kvp_cfgkey){.name = key, .namelen = at, .fp = key + d, .fplen = n};
        return 1;
    }
    return 0;
}

static size_t cut(size_t namelen)
{
    return namelen < KVP_CFGTAB_NAME_MAX - 1 ? namelen : KVP_CFGTAB_NAME_MAX - 1;
}

static uint32_t hash_of(uint16_t tenant, const uint8_t *name, size_t namelen, const uint8_t *fp,
                        size_t fplen)
{
    uint64_t h = 0xcbf29ce484222325ull ^ tenant;
    for (size_t i = 0; i < fplen; i++)
        h = (h ^ fp[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < namelen; i++)
        h = (h ^ name[i]) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

static int row_is(const kvp_cfgtab_row *r, uint16_t tenant, const kvp_cfgkey *k, size_t nl)
{
    return r->fplen == k->fplen && r->tenant == tenant && r->namelen == nl &&
           memcmp(r->fp, k->fp, k->fplen) == 0 && memcmp(r->name, k->name, nl) == 0;
}

static int64_t find_row(const kvp_cfgtab *t, uint16_t tenant, const kvp_cfgkey *k)
{
    size_t nl = cut(k->namelen);
    uint32_t i = hash_of(tenant, k->name, nl, k->fp, k->fplen) & t->ix_mask;
    for (;; i = (i + 1) & t->ix_mask) {
        uint16_t v = t->ix[i];
        if (!v)
            return -1;
        if (row_is(&t->rows[v - 1], tenant, k, nl))
            return v - 1;
    }
}

static void ix_rebuild(kvp_cfgtab *t)
{
    memset(t->ix, 0, (size_t)(t->ix_mask + 1) * sizeof *t->ix);
    for (uint32_t r = 0; r < KVP_CFGTAB_MAX; r++) {
        const kvp_cfgtab_row *w = &t->rows[r];
        if (!w->fplen)
            continue;
        uint32_t i = hash_of(w->tenant, (const uint8_t *)w->name, w->namelen,
                             (const uint8_t *)w->fp, w->fplen) &
                     t->ix_mask;
        while (t->ix[i])
            i = (i + 1) & t->ix_mask;
        t->ix[i] = (uint16_t)(r + 1);
    }
}

int kvp_cfgtab_init(kvp_cfgtab *t)
{
    memset(t, 0, sizeof *t);
    t->rows = kvp_calloc(KVP_CFGTAB_MAX, sizeof *t->rows);
    t->ix = kvp_calloc(IX_SLOTS, sizeof *t->ix);
    t->ix_mask = IX_SLOTS - 1;
    if (!t->rows || !t->ix) {
        kvp_cfgtab_free(t);
        return KVP_ENOMEM;
    }
    return 0;
}

void kvp_cfgtab_free(kvp_cfgtab *t)
{
    kvp_free(t->rows);
    kvp_free(t->ix);
    memset(t, 0, sizeof *t);
}

/* A slot for a new row: a free one, else one at 0 objects; -1 if none. */
static int64_t new_slot(const kvp_cfgtab *t)
{
    int64_t idle = -1;
    for (uint32_t r = 0; r < KVP_CFGTAB_MAX; r++) {
        if (!t->rows[r].fplen)
            return r;
        if (idle < 0 && t->rows[r].objects == 0)
            idle = r;
    }
    return idle;
}

void kvp_cfgtab_count(kvp_cfgtab *t, uint16_t tenant, const uint8_t *key, size_t len,
                      uint64_t size, int delta, uint64_t other[2])
{
    kvp_cfgkey k;
    if (!t->rows || !kvp_cfgtab_parse(key, len, &k))
        return;
    int64_t r = find_row(t, tenant, &k);
    if (r < 0 && delta > 0 && other[0] == 0 && (r = new_slot(t)) >= 0) {
        kvp_cfgtab_row *w = &t->rows[r];
        if (!w->fplen)
            t->nrows++;
        memset(w, 0, sizeof *w);
        w->tenant = tenant;
        w->fplen = (uint8_t)k.fplen;
        memcpy(w->fp, k.fp, k.fplen);
        w->namelen = (uint16_t)cut(k.namelen);
        memcpy(w->name, k.name, w->namelen);
        ix_rebuild(t);
    }
    uint64_t *c = r >= 0 ? &t->rows[r].objects : other, *b = r >= 0 ? &t->rows[r].bytes : other + 1;
    if (delta > 0) {
        c[0]++;
        b[0] += size;
    } else {
        KVP_ASSERT(c[0] > 0 && b[0] >= size);
        c[0]--;
        b[0] -= size;
    }
}

const kvp_cfgtab_row *kvp_cfgtab_find(const kvp_cfgtab *t, uint16_t tenant, const kvp_cfgkey *k)
{
    if (!t->rows)
        return NULL;
    int64_t r = find_row(t, tenant, k);
    return r >= 0 ? &t->rows[r] : NULL;
}

const kvp_cfgtab_row *kvp_cfgtab_slot(const kvp_cfgtab *t, uint32_t i)
{
    return t->rows && i < KVP_CFGTAB_MAX && t->rows[i].fplen ? &t->rows[i] : NULL;
}

int kvp_cfgtab_check(const kvp_cfgtab *t)
{
    if (!t->rows)
        return 0;
    uint32_t n = 0;
    for (uint32_t r = 0; r < KVP_CFGTAB_MAX; r++) {
        const kvp_cfgtab_row *w = &t->rows[r];
        if (!w->fplen)
            continue;
        n++;
        kvp_cfgkey k = {(const uint8_t *)w->name, (const uint8_t *)w->fp, w->namelen, w->fplen};
        if (w->fplen < KVP_CFGTAB_FP_MIN || w->fplen > KVP_CFGTAB_FP_MAX ||
            find_row(t, w->tenant, &k) != (int64_t)r)
            return -1;
    }
    return n == t->nrows ? 0 : -1;
}
