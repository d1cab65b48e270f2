/*
 * meta.c -- connector request structures and the step metadata encoding
 * (see meta.h for the layout and the contracts).
 */
#include "connector/meta.h"

#include <string.h>

#include "common/assert.h"
#include "common/mem.h"

enum {
    F_HAS_SAVE = 1 << 0,
    F_SAVE = 1 << 1,
    F_HAS_LAST = 1 << 2,
    F_LAST = 1 << 3,
    F_LOAD = 1 << 4,
    F_TOKENS = 1 << 5,
    F_PROMPT = 1 << 6,
    F_TAILS = 1 << 7,
};

/* Smallest encodings, for kvp_rd_count's "count vs bytes left" check. */
#define MIN_STR 5u                          /* u32 len + 1 byte */
#define MIN_REQ (MIN_STR + 1 + 1 + 8 + 4 + 1 + 4 + 4)
#define TAIL_SIZE 16u

/* A request id: 1..KVP_META_MAX_ID bytes, none of them NUL (engines and
 * the worker's finished lists carry ids as C strings). */
static bool id_bytes_ok(const void *p, uint32_t n)
{
    return p && n >= 1 && n <= KVP_META_MAX_ID && !memchr(p, 0, n);
}

/* ------------------------------------------------------------ step */

void kvp_meta_step_init(kvp_meta_step *s) { memset(s, 0, sizeof *s); }

void kvp_meta_step_free(kvp_meta_step *s)
{
    kvp_free(s->reqs);
    kvp_free(s->unfinished);
    kvp_free(s->preempted);
    memset(s, 0, sizeof *s);
}

/* Grows *arr (element size `es`) to hold n+1 elements. */
static int grow(void **arr, uint32_t n, uint32_t *cap, size_t es)
{
    if (n < *cap)
        return 0;
    if (n == UINT32_MAX)
        return KVP_EINVALID_PARAMS;
    uint32_t nc = *cap ? (*cap > UINT32_MAX / 2 ? UINT32_MAX : *cap * 2) : 8;
    void *p = kvp_realloc(*arr, (size_t)nc * es);
    if (!p)
        return KVP_ENOMEM;
    *arr = p;
    *cap = nc;
    return 0;
}

int kvp_meta_step_add_req(kvp_meta_step *s, const kvp_meta_req *r)
{
    int rc = grow((void **)&s->reqs, s->nreqs, &s->cap_reqs, sizeof *s->reqs);
    if (rc)
        return rc;
    s->reqs[s->nreqs++] = *r;
    return 0;
}

int kvp_meta_step_add_unfinished(kvp_meta_step *s, const char *id, uint32_t len)
{
    int rc = grow((void **)&s->unfinished, s->nunfinished, &s->cap_unfinished,
                  sizeof *s->unfinished);
    if (rc)
        return rc;
    s->unfinished[s->nunfinished++] = (kvp_meta_str){id, len};
    return 0;
}

int kvp_meta_step_add_preempted(kvp_meta_step *s, const char *id, uint32_t len)
{
    int rc = grow((void **)&s->preempted, s->npreempted, &s->cap_preempted,
                  sizeof *s->preempted);
    if (rc)
        return rc;
    s->preempted[s->npreempted++] = (kvp_meta_str){id, len};
    return 0;
}

/* ---------------------------------------------------------- tracker */

int kvp_meta_tracker_init(kvp_meta_tracker *t, const char *req_id, uint32_t req_id_len,
                          uint32_t ngroups)
{
    memset(t, 0, sizeof *t);
    if (!id_bytes_ok(req_id, req_id_len) || ngroups == 0 ||
        ngroups > KVP_META_MAX_GROUPS)
        return KVP_EINVALID_PARAMS;
    t->req_id = kvp_strndup(req_id, req_id_len);
    t->block_ids = kvp_calloc(ngroups, sizeof *t->block_ids);
    if (!t->req_id || !t->block_ids) {
        kvp_free(t->req_id);
        kvp_free(t->block_ids);
        memset(t, 0, sizeof *t);
        return KVP_ENOMEM;
    }
    t->req_id_len = req_id_len;
    t->ngroups = ngroups;
    return 0;
}

static void free_groups(kvp_meta_tracker *t)
{
    for (uint32_t g = 0; g < t->ngroups; g++)
        kvp_free(t->block_ids[g].ids);
    kvp_free(t->block_ids);
    t->block_ids = NULL;
    t->ngroups = 0;
}

int kvp_meta_tracker_set_tokens(kvp_meta_tracker *t, const uint32_t *ids, uint32_t n)
{
    uint32_t *c = NULL;
    if (ids && n) {
        c = kvp_malloc((size_t)n * sizeof *c);
        if (!c)
            return KVP_ENOMEM;
        memcpy(c, ids, (size_t)n * sizeof *c);
    }
    kvp_free(t->token_ids);
    t->token_ids = c;
    t->n_token_ids = c ? n : 0;
    t->token_cap = t->n_token_ids;
    return 0;
}

int kvp_meta_tracker_extend_tokens(kvp_meta_tracker *t, const uint32_t *all, uint32_t n)
{
    if (n <= t->n_token_ids)
        return 0;
    if (!all)
        return KVP_EINVALID_PARAMS;
    if (n > t->token_cap) {
        uint32_t nc = t->token_cap ? t->token_cap : 64;
        while (nc < n)
            nc = nc > UINT32_MAX / 2 ? n : nc * 2;
        uint32_t *p = kvp_realloc(t->token_ids, (size_t)nc * sizeof *p);
        if (!p)
            return KVP_ENOMEM;
        t->token_ids = p;
        t->token_cap = nc;
    }
    memcpy(t->token_ids + t->n_token_ids, all + t->n_token_ids,
           (size_t)(n - t->n_token_ids) * sizeof *all);
    t->n_token_ids = n;
    return 0;
}

void kvp_meta_tracker_reset(kvp_meta_tracker *t)
{
    free_groups(t);
    kvp_free(t->token_ids);
    t->token_ids = NULL;
    t->n_token_ids = t->token_cap = 0;
    t->token_len = 0;
    t->num_saved_tokens = 0;
    t->has_pending_offload = false;
    t->prefill_end_tokens = 0;
}

void kvp_meta_tracker_free(kvp_meta_tracker *t)
{
    free_groups(t);
    kvp_free(t->token_ids);
    kvp_free(t->req_id);
    memset(t, 0, sizeof *t);
}

int kvp_meta_tracker_update(kvp_meta_tracker *t, const kvp_meta_ids *groups, uint32_t ngroups)
{
    if (ngroups != t->ngroups)
        return KVP_EINVALID_PARAMS; /* "Group count mismatch" (also after a reset) */
    /* reserve every group first so a failure changes nothing */
    for (uint32_t g = 0; g < ngroups; g++) {
        kvp_meta_ids *d = &t->block_ids[g];
        if (groups[g].n > UINT32_MAX - d->n)
            return KVP_EINVALID_PARAMS;
        uint32_t need = d->n + groups[g].n;
        if (need <= d->cap)
            continue;
        uint32_t nc = d->cap ? d->cap : 8;
        while (nc < need)
            nc = nc > UINT32_MAX / 2 ? need : nc * 2;
        uint32_t *p = kvp_realloc(d->ids, (size_t)nc * sizeof *p);
        if (!p)
            return KVP_ENOMEM;
        d->ids = p;
        d->cap = nc;
    }
    for (uint32_t g = 0; g < ngroups; g++) {
        kvp_meta_ids *d = &t->block_ids[g];
        if (groups[g].n)
            memcpy(d->ids + d->n, groups[g].ids, (size_t)groups[g].n * sizeof *d->ids);
        d->n += groups[g].n;
    }
    return 0;
}

int kvp_meta_tracker_replace(kvp_meta_tracker *t, const kvp_meta_ids *groups, uint32_t ngroups)
{
    if (ngroups == 0 || ngroups > KVP_META_MAX_GROUPS)
        return KVP_EINVALID_PARAMS;
    kvp_meta_ids *nb = kvp_calloc(ngroups, sizeof *nb);
    if (!nb)
        return KVP_ENOMEM;
    for (uint32_t g = 0; g < ngroups; g++) {
        uint32_t n = groups[g].n;
        if (!n)
            continue;
        nb[g].ids = kvp_malloc((size_t)n * sizeof *nb[g].ids);
        if (!nb[g].ids) {
            for (uint32_t k = 0; k < g; k++)
                kvp_free(nb[k].ids);
            kvp_free(nb);
            return KVP_ENOMEM;
        }
        memcpy(nb[g].ids, groups[g].ids, (size_t)n * sizeof *nb[g].ids);
        nb[g].n = nb[g].cap = n;
    }
    free_groups(t);
    t->block_ids = nb;
    t->ngroups = ngroups;
    return 0;
}

int kvp_meta_from_tracker(kvp_meta_tracker *t, uint64_t L, const kvp_meta_load_spec *load_spec,
                          bool skip_save, const uint8_t *hashes, uint32_t nhashes,
                          uint8_t hash_len, int8_t is_last_chunk, int64_t max_save_tokens,
                          uint8_t kind, kvp_meta_req *out)
{
    if (L == 0 || L > UINT64_MAX / 2 || (nhashes && (!hashes || hash_len == 0)))
        return KVP_EINVALID_PARAMS;
    uint64_t T = t->token_len;
    if (max_save_tokens >= 0 && (uint64_t)max_save_tokens < T)
        T = (uint64_t)max_save_tokens;
    /* ceil((saved + 1) / L) * L; a watermark this close to 2^64 saturates */
    uint64_t boundary = t->num_saved_tokens > UINT64_MAX - L
                            ? UINT64_MAX
                            : (t->num_saved_tokens / L + 1) * L;
    uint64_t to_save = T / L * L;
    bool skip = skip_save || to_save < boundary;
    if (load_spec && load_spec->can_load)
        skip = true; /* never save and load in one meta */
    if (skip && !load_spec)
        return 0;
    if (!skip)
        t->num_saved_tokens = to_save; /* the watermark advances at emission */
    memset(out, 0, sizeof *out);
    out->req_id = (kvp_meta_str){t->req_id, t->req_id_len};
    out->kind = kind;
    out->token_len_chunk = to_save;
    out->block_ids = t->block_ids;
    out->ngroups = t->ngroups;
    out->block_hashes = nhashes ? hashes : NULL;
    out->nhashes = nhashes;
    out->hash_len = nhashes ? hash_len : 0;
    out->can_save = skip ? KVP_META_FALSE : KVP_META_TRUE;
    out->is_last_chunk = is_last_chunk;
    out->load_spec = load_spec && load_spec->can_load ? load_spec : NULL;
    out->token_ids = t->n_token_ids ? t->token_ids : NULL;
    out->n_token_ids = t->n_token_ids;
    out->has_num_prompt_tokens = true;
    out->num_prompt_tokens = t->prefill_end_tokens;
    return 1;
}

/* ----------------------------------------------------------- encode */

static bool tri_ok(int8_t v) { return v >= KVP_META_UNSET && v <= KVP_META_TRUE; }

static bool str_ok(const kvp_meta_str *s)
{
    return id_bytes_ok(s->p, s->len);
}

static int req_check(const kvp_meta_req *r)
{
    if (!str_ok(&r->req_id) || r->kind >= KVP_META_KIND_COUNT ||
        r->ngroups > KVP_META_MAX_GROUPS || (r->ngroups && !r->block_ids) ||
        !tri_ok(r->can_save) || !tri_ok(r->is_last_chunk) ||
        r->hash_len > KVP_META_MAX_HASH_LEN || (r->nhashes == 0) != (r->hash_len == 0) ||
        (r->nhashes && !r->block_hashes) || (r->n_token_ids && !r->token_ids) ||
        (r->ntails && !r->tails))
        return KVP_EINVALID_PARAMS;
    if (r->can_save == KVP_META_TRUE && r->load_spec)
        return KVP_EINVALID_PARAMS; /* §16: never both save and load */
    for (uint32_t g = 0; g < r->ngroups; g++)
        if (r->block_ids[g].n && !r->block_ids[g].ids)
            return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < r->ntails; i++)
        if (r->tails[i].group_id >= r->ngroups)
            return KVP_EINVALID_PARAMS;
    return 0;
}

/*
 * The encoder writes through a cursor into space reserved up front (one
 * kvp_buf_reserve per request or id list instead of one per field).
 */
static inline void w8(uint8_t **p, uint8_t v) { *(*p)++ = v; }

static inline void w32(uint8_t **p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        (*p)[i] = (uint8_t)(v >> (8 * i));
    *p += 4;
}

static inline void w64(uint8_t **p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        (*p)[i] = (uint8_t)(v >> (8 * i));
    *p += 8;
}

static inline void wraw(uint8_t **p, const void *src, size_t n)
{
    if (n)
        memcpy(*p, src, n);
    *p += n;
}

/* n u32 values, little-endian (one copy on a little-endian host). */
static void w32s(uint8_t **p, const uint32_t *v, uint32_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    wraw(p, v, (size_t)n * sizeof *v);
#else
    for (uint32_t i = 0; i < n; i++)
        w32(p, v[i]);
#endif
}

/* A list of ids: u32 count, then each as u32 len | bytes. */
static void put_strs(kvp_buf *b, const kvp_meta_str *v, uint32_t n)
{
    size_t size = 4;
    for (uint32_t i = 0; i < n; i++)
        size += 4 + (size_t)v[i].len;
    if (kvp_buf_reserve(b, size))
        return;
    uint8_t *p = b->data + b->len;
    w32(&p, n);
    for (uint32_t i = 0; i < n; i++) {
        w32(&p, v[i].len);
        wraw(&p, v[i].p, v[i].len);
    }
    b->len += size;
}

static const kvp_meta_base NO_BASE = {NULL, 0, 0};

static int base_check(const kvp_meta_req *r, const kvp_meta_base *d)
{
    for (uint32_t g = 0; d->groups && g < r->ngroups; g++)
        if (d->groups[g] > r->block_ids[g].n)
            return KVP_EINVALID_PARAMS;
    if (d->hashes > r->nhashes || d->tokens > r->n_token_ids)
        return KVP_EINVALID_PARAMS;
    return 0;
}

static uint8_t req_flags(const kvp_meta_req *r)
{
    uint8_t f = 0;
    if (r->can_save != KVP_META_UNSET)
        f |= F_HAS_SAVE | (r->can_save == KVP_META_TRUE ? F_SAVE : 0);
    if (r->is_last_chunk != KVP_META_UNSET)
        f |= F_HAS_LAST | (r->is_last_chunk == KVP_META_TRUE ? F_LAST : 0);
    if (r->load_spec)
        f |= F_LOAD;
    if (r->n_token_ids)
        f |= F_TOKENS;
    if (r->has_num_prompt_tokens)
        f |= F_PROMPT;
    if (r->tails)
        f |= F_TAILS;
    return f;
}

/* Bytes of one encoded request (the layout in meta.h). */
static size_t req_size(const kvp_meta_req *r, const kvp_meta_base *d, uint8_t f)
{
    size_t n = 4 + (size_t)r->req_id.len + 1 + 1 + 8 + 4;
    for (uint32_t g = 0; g < r->ngroups; g++)
        n += 8 + 4 * (size_t)(r->block_ids[g].n - (d->groups ? d->groups[g] : 0));
    n += 1 + 4 + 4 + (size_t)(r->nhashes - d->hashes) * r->hash_len;
    if (f & F_LOAD)
        n += 8 + 8 + 8 + 1;
    if (f & F_TOKENS)
        n += 8 + 4 * (size_t)(r->n_token_ids - d->tokens);
    if (f & F_PROMPT)
        n += 8;
    if (f & F_TAILS)
        n += 4 + (size_t)TAIL_SIZE * r->ntails;
    return n;
}

static void put_req(kvp_buf *b, const kvp_meta_req *r, const kvp_meta_base *d)
{
    uint8_t f = req_flags(r);
    /* base_check ran: a delta never starts past the current arrays */
    KVP_ASSERT(d->hashes <= r->nhashes && d->tokens <= r->n_token_ids);
    size_t size = req_size(r, d, f);
    if (kvp_buf_reserve(b, size))
        return;
    uint8_t *p = b->data + b->len;
    w32(&p, r->req_id.len);
    wraw(&p, r->req_id.p, r->req_id.len);
    w8(&p, r->kind);
    w8(&p, f);
    w64(&p, r->token_len_chunk);
    w32(&p, r->ngroups);
    for (uint32_t g = 0; g < r->ngroups; g++) {
        uint32_t base = d->groups ? d->groups[g] : 0;
        w32(&p, base);
        w32(&p, r->block_ids[g].n - base);
        if (r->block_ids[g].n > base) /* (ids may be NULL when empty) */
            w32s(&p, r->block_ids[g].ids + base, r->block_ids[g].n - base);
    }
    w8(&p, r->hash_len);
    w32(&p, d->hashes);
    w32(&p, r->nhashes - d->hashes);
    if (r->nhashes > d->hashes)
        wraw(&p, r->block_hashes + (size_t)d->hashes * r->hash_len,
             (size_t)(r->nhashes - d->hashes) * r->hash_len);
    if (f & F_LOAD) {
        w64(&p, r->load_spec->vllm_cached_tokens);
        w64(&p, r->load_spec->kvpool_cached_tokens);
        w64(&p, r->load_spec->token_len);
        w8(&p, r->load_spec->can_load ? 1 : 0);
    }
    if (f & F_TOKENS) {
        w32(&p, d->tokens);
        w32(&p, r->n_token_ids - d->tokens);
        w32s(&p, r->token_ids + d->tokens, r->n_token_ids - d->tokens);
    }
    if (f & F_PROMPT)
        w64(&p, r->num_prompt_tokens);
    if (f & F_TAILS) {
        w32(&p, r->ntails);
        for (uint32_t i = 0; i < r->ntails; i++) {
            w32(&p, r->tails[i].group_id);
            w32(&p, r->tails[i].cow_block_id);
            w64(&p, r->tails[i].boundary_tokens);
        }
    }
    KVP_ASSERT(p == b->data + b->len + size); /* wrote exactly what req_size counted */
    b->len += size;
}

int kvp_meta_encode_delta(kvp_buf *b, const kvp_meta_step *s, const kvp_meta_base *bases,
                          const kvp_meta_str *drops, uint32_t ndrops)
{
    if ((s->nreqs && !s->reqs) || (s->nunfinished && !s->unfinished) ||
        (s->npreempted && !s->preempted) || (ndrops && !drops))
        return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < s->nreqs; i++) {
        int rc = req_check(&s->reqs[i]);
        if (rc == 0 && bases)
            rc = base_check(&s->reqs[i], &bases[i]);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < s->nunfinished; i++)
        if (!str_ok(&s->unfinished[i]))
            return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < s->npreempted; i++)
        if (!str_ok(&s->preempted[i]))
            return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < ndrops; i++)
        if (!str_ok(&drops[i]))
            return KVP_EINVALID_PARAMS;
    kvp_buf_u32(b, KVP_META_MAGIC);
    kvp_buf_u8(b, KVP_META_VERSION);
    put_strs(b, drops, ndrops);
    kvp_buf_u32(b, s->nreqs);
    for (uint32_t i = 0; i < s->nreqs; i++)
        put_req(b, &s->reqs[i], bases ? &bases[i] : &NO_BASE);
    put_strs(b, s->unfinished, s->nunfinished);
    put_strs(b, s->preempted, s->npreempted);
    return b->err;
}

int kvp_meta_encode(kvp_buf *b, const kvp_meta_step *s)
{
    return kvp_meta_encode_delta(b, s, NULL, NULL, 0);
}

/* ----------------------------------------------------------- mirror */

/* One request as the worker holds it: the full arrays received so far. */
typedef struct ment {
    struct ment *next;
    char *id; /* NUL-terminated */
    uint32_t id_len;
    uint32_t hash;
    uint64_t stamp;       /* generation of the message that last viewed it */
    kvp_meta_ids *groups; /* gcap slots; slots >= ngroups are empty */
    uint32_t ngroups, gcap;
    uint8_t *hashes;
    uint32_t nhashes;
    uint8_t hash_len;
    size_t hcap; /* bytes */
    uint32_t *toks;
    uint32_t ntoks, tcap;
} ment;

struct kvp_meta_mirror {
    ment **tab;
    uint32_t nb; /* buckets, a power of two */
    uint32_t count;
    uint64_t gen; /* messages decoded */
    /* arrays replaced while an earlier request of the same message still
     * views them: freed at the next decode */
    void **retired;
    uint32_t nret, retcap;
};

static uint32_t fnv(const uint8_t *p, uint32_t n)
{
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 16777619u;
    return h;
}

kvp_meta_mirror *kvp_meta_mirror_new(void)
{
    kvp_meta_mirror *m = kvp_calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->nb = 64;
    m->tab = kvp_calloc(m->nb, sizeof *m->tab);
    if (!m->tab) {
        kvp_free(m);
        return NULL;
    }
    return m;
}

static void ment_free(ment *e)
{
    for (uint32_t g = 0; g < e->gcap; g++)
        kvp_free(e->groups[g].ids);
    kvp_free(e->groups);
    kvp_free(e->hashes);
    kvp_free(e->toks);
    kvp_free(e->id);
    kvp_free(e);
}

static void retired_free(kvp_meta_mirror *m)
{
    for (uint32_t i = 0; i < m->nret; i++)
        kvp_free(m->retired[i]);
    m->nret = 0;
}

/* Drops every entry (after a decode error: the stream is desynchronised). */
static void mirror_clear(kvp_meta_mirror *m)
{
    for (uint32_t b = 0; b < m->nb; b++) {
        for (ment *e = m->tab[b], *nx; e; e = nx) {
            nx = e->next;
            ment_free(e);
        }
        m->tab[b] = NULL;
    }
    m->count = 0;
    retired_free(m);
}

void kvp_meta_mirror_free(kvp_meta_mirror *m)
{
    if (!m)
        return;
    mirror_clear(m);
    kvp_free(m->tab);
    kvp_free(m->retired);
    kvp_free(m);
}

uint32_t kvp_meta_mirror_count(const kvp_meta_mirror *m) { return m ? m->count : 0; }

static ment *ment_find(kvp_meta_mirror *m, const uint8_t *id, uint32_t n, uint32_t h)
{
    for (ment *e = m->tab[h & (m->nb - 1)]; e; e = e->next)
        if (e->hash == h && e->id_len == n && memcmp(e->id, id, n) == 0)
            return e;
    return NULL;
}

static void ment_drop(kvp_meta_mirror *m, const uint8_t *id, uint32_t n)
{
    uint32_t h = fnv(id, n);
    for (ment **pp = &m->tab[h & (m->nb - 1)]; *pp; pp = &(*pp)->next) {
        ment *e = *pp;
        if (e->hash == h && e->id_len == n && memcmp(e->id, id, n) == 0) {
            *pp = e->next;
            ment_free(e);
            m->count--;
            return;
        }
    }
}

/* The entry of id, created empty when missing; NULL on KVP_ENOMEM. */
static ment *ment_get(kvp_meta_mirror *m, const uint8_t *id, uint32_t n)
{
    uint32_t h = fnv(id, n);
    ment *e = ment_find(m, id, n, h);
    if (e)
        return e;
    if (m->count >= m->nb && m->nb <= UINT32_MAX / 4) { /* grow: load factor <= 1 */
        uint32_t nb = m->nb * 2;
        ment **t = kvp_calloc(nb, sizeof *t);
        if (!t)
            return NULL;
        for (uint32_t b = 0; b < m->nb; b++)
            for (ment *x = m->tab[b], *nx; x; x = nx) {
                nx = x->next;
                x->next = t[x->hash & (nb - 1)];
                t[x->hash & (nb - 1)] = x;
            }
        kvp_free(m->tab);
        m->tab = t;
        m->nb = nb;
    }
    e = kvp_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->id = kvp_strndup((const char *)id, n);
    if (!e->id) {
        kvp_free(e);
        return NULL;
    }
    e->id_len = n;
    e->hash = h;
    e->stamp = m->gen - 1;
    e->next = m->tab[h & (m->nb - 1)];
    m->tab[h & (m->nb - 1)] = e;
    m->count++;
    return e;
}

/* Room for one more retired pointer. */
static int retire_room(kvp_meta_mirror *m)
{
    if (m->nret < m->retcap)
        return 0;
    uint32_t nc = m->retcap ? m->retcap * 2 : 16;
    void **r = kvp_realloc(m->retired, (size_t)nc * sizeof *r);
    if (!r)
        return KVP_ENOMEM;
    m->retired = r;
    m->retcap = nc;
    return 0;
}

static int retire(kvp_meta_mirror *m, void *p)
{
    if (!p)
        return 0;
    if (retire_room(m))
        return KVP_ENOMEM;
    m->retired[m->nret++] = p;
    return 0;
}

/* Copies n little-endian u32 from the wire. */
static void copy_u32s(uint32_t *dst, const uint8_t *src, uint32_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n)
        memcpy(dst, src, (size_t)n * 4);
#else
    for (uint32_t i = 0; i < n; i++)
        dst[i] = (uint32_t)src[4 * i] | (uint32_t)src[4 * i + 1] << 8 |
                 (uint32_t)src[4 * i + 2] << 16 | (uint32_t)src[4 * i + 3] << 24;
#endif
}

/*
 * Makes *buf (capacity *cap bytes, `keep` bytes in use and kept) hold at
 * least `need` bytes. `shared`: an earlier request of this message views
 * the buffer, so it is neither reallocated nor overwritten: a new buffer
 * takes over and the old one is retired. 0 or KVP_ENOMEM.
 */
static int arr_room(kvp_meta_mirror *m, bool shared, void **buf, size_t *cap, size_t keep,
                    size_t need)
{
    if (shared && keep == 0 && *buf) { /* a full resend: do not write over the viewed copy */
        if (retire(m, *buf))
            return KVP_ENOMEM;
        *buf = NULL;
        *cap = 0;
    }
    if (need <= *cap)
        return 0;
    size_t nc = *cap > 64 ? *cap : 64;
    while (nc < need)
        nc *= 2;
    void *p;
    if (shared && *buf) {
        if (retire_room(m))
            return KVP_ENOMEM;
        p = kvp_malloc(nc);
        if (!p)
            return KVP_ENOMEM;
        memcpy(p, *buf, keep);
        m->retired[m->nret++] = *buf;
    } else {
        p = kvp_realloc(*buf, nc);
        if (!p)
            return KVP_ENOMEM;
    }
    *buf = p;
    *cap = nc;
    return 0;
}

/* ----------------------------------------------------------- decode */

/* Decoder state: the reader, the first non-protocol error (ENOMEM), and the
 * mirror (NULL: stateless, every base must be 0). */
typedef struct dec {
    kvp_rd r;
    kvp_arena *a;
    kvp_meta_mirror *m;
    int err;
} dec;

/* n elements of `es` bytes (at least one element, so that an empty but
 * present list is a non-NULL pointer). n is already bounded by the bytes
 * left, so n*es cannot overflow. */
static void *dalloc(dec *d, size_t n, size_t es)
{
    if (d->err || d->r.err)
        return NULL;
    void *p = kvp_arena_alloc(d->a, (n ? n : 1) * es);
    if (!p)
        d->err = KVP_ENOMEM;
    return p;
}

static void bad(dec *d)
{
    if (!d->r.err)
        d->r.err = KVP_EPROTOCOL;
}

static bool failed(const dec *d) { return d->r.err || d->err; }

static void get_str(dec *d, kvp_meta_str *s)
{
    kvp_bytes b = kvp_rd_bytes(&d->r, KVP_META_MAX_ID);
    s->p = NULL;
    s->len = 0;
    if (d->r.err)
        return;
    if (!id_bytes_ok(b.p, b.len)) {
        bad(d);
        return;
    }
    char *c = dalloc(d, (size_t)b.len + 1, 1);
    if (!c)
        return;
    memcpy(c, b.p, b.len);
    c[b.len] = '\0';
    s->p = c;
    s->len = b.len;
}

/* "u32 base | u32 n | n items of es bytes": checks the base against what
 * is held (`have`; stateless: 0) and returns the items (NULL on error). */
static const uint8_t *get_delta(dec *d, uint32_t have, size_t es, uint32_t max,
                                uint32_t *base, uint32_t *n)
{
    *base = kvp_rd_u32(&d->r);
    *n = kvp_rd_count(&d->r, es ? max : 0, es);
    if (d->r.err)
        return NULL;
    if ((*base != 0 && *base != have) || *n > UINT32_MAX - *base) {
        bad(d); /* stateless with a base, or out of step with the mirror */
        return NULL;
    }
    const uint8_t *src = kvp_rd_raw(&d->r, (size_t)*n * es);
    return d->r.err ? NULL : (src ? src : (const uint8_t *)"");
}

/* Applies one group's delta; fills the view's descriptor. */
static void get_group(dec *d, ment *e, bool shared, uint32_t g, kvp_meta_ids *view)
{
    uint32_t have = e ? e->groups[g].n : 0, base, n;
    const uint8_t *src = get_delta(d, have, 4, UINT32_MAX, &base, &n);
    if (!src)
        return;
    if (!e) {
        view->ids = dalloc(d, n, sizeof(uint32_t));
        if (view->ids)
            copy_u32s(view->ids, src, n);
        view->n = n;
        return;
    }
    kvp_meta_ids *gr = &e->groups[g];
    size_t cap = (size_t)gr->cap * 4;
    void *buf = gr->ids;
    if (arr_room(d->m, shared, &buf, &cap, (size_t)base * 4, (size_t)(base + n) * 4)) {
        d->err = KVP_ENOMEM;
        gr->ids = buf;
        gr->cap = (uint32_t)(cap / 4);
        return;
    }
    gr->ids = buf;
    gr->cap = (uint32_t)(cap / 4);
    if (n)
        copy_u32s(gr->ids + base, src, n);
    gr->n = base + n;
    view->ids = gr->ids;
    view->n = gr->n;
}

/* Sizes e's group slots for ngroups (new slots empty). */
static int groups_room(ment *e, uint32_t ngroups)
{
    if (ngroups <= e->gcap)
        return 0;
    kvp_meta_ids *p = kvp_realloc(e->groups, (size_t)ngroups * sizeof *p);
    if (!p)
        return KVP_ENOMEM;
    memset(p + e->gcap, 0, (size_t)(ngroups - e->gcap) * sizeof *p);
    e->groups = p;
    e->gcap = ngroups;
    return 0;
}

/* Groups [ngroups, e->ngroups) are gone from the request's table. */
static int groups_trim(kvp_meta_mirror *m, ment *e, bool shared, uint32_t ngroups)
{
    for (uint32_t g = ngroups; g < e->ngroups; g++) {
        if (shared) {
            if (retire(m, e->groups[g].ids))
                return KVP_ENOMEM;
        } else {
            kvp_free(e->groups[g].ids);
        }
        e->groups[g] = (kvp_meta_ids){NULL, 0, 0};
    }
    e->ngroups = ngroups;
    return 0;
}

static void get_req(dec *d, kvp_meta_req *r)
{
    kvp_rd *rd = &d->r;
    memset(r, 0, sizeof *r);
    r->can_save = r->is_last_chunk = KVP_META_UNSET;
    ment *e = NULL;
    bool shared = false;
    if (d->m) {
        kvp_bytes id = kvp_rd_bytes(rd, KVP_META_MAX_ID);
        if (rd->err)
            return;
        if (!id_bytes_ok(id.p, id.len)) {
            bad(d);
            return;
        }
        if (!(e = ment_get(d->m, id.p, id.len))) {
            d->err = KVP_ENOMEM;
            return;
        }
        shared = e->stamp == d->m->gen;
        r->req_id = (kvp_meta_str){e->id, e->id_len};
    } else {
        get_str(d, &r->req_id);
    }
    r->kind = kvp_rd_u8(rd);
    uint8_t f = kvp_rd_u8(rd);
    if (failed(d))
        return;
    if (r->kind >= KVP_META_KIND_COUNT || ((f & F_SAVE) && !(f & F_HAS_SAVE)) ||
        ((f & F_LAST) && !(f & F_HAS_LAST)) || ((f & F_SAVE) && (f & F_LOAD))) {
        bad(d);
        return;
    }
    if (f & F_HAS_SAVE)
        r->can_save = (f & F_SAVE) ? KVP_META_TRUE : KVP_META_FALSE;
    if (f & F_HAS_LAST)
        r->is_last_chunk = (f & F_LAST) ? KVP_META_TRUE : KVP_META_FALSE;
    r->token_len_chunk = kvp_rd_u64(rd);
    r->ngroups = kvp_rd_count(rd, KVP_META_MAX_GROUPS, 8);
    kvp_meta_ids *g = dalloc(d, r->ngroups, sizeof *g);
    if (!g)
        return;
    r->block_ids = g;
    if (e && groups_room(e, r->ngroups)) {
        d->err = KVP_ENOMEM;
        return;
    }
    for (uint32_t i = 0; i < r->ngroups && !failed(d); i++) {
        g[i].cap = 0;
        get_group(d, e, shared, i, &g[i]);
    }
    if (failed(d))
        return;
    if (e && groups_trim(d->m, e, shared, r->ngroups)) {
        d->err = KVP_ENOMEM;
        return;
    }
    r->hash_len = kvp_rd_u8(rd);
    if (rd->err)
        return;
    if (r->hash_len > KVP_META_MAX_HASH_LEN) {
        bad(d);
        return;
    }
    uint32_t have = e && e->hash_len == r->hash_len ? e->nhashes : 0, hb, hn;
    const uint8_t *hsrc = get_delta(d, have, r->hash_len, UINT32_MAX, &hb, &hn);
    if (!hsrc)
        return;
    r->nhashes = hb + hn;
    if ((r->nhashes == 0) != (r->hash_len == 0)) {
        bad(d);
        return;
    }
    if (e) {
        void *buf = e->hashes;
        size_t keep = (size_t)hb * r->hash_len, need = (size_t)r->nhashes * r->hash_len;
        int rc = arr_room(d->m, shared, &buf, &e->hcap, keep, need);
        e->hashes = buf;
        if (rc) {
            d->err = rc;
            return;
        }
        if (hn)
            memcpy(e->hashes + keep, hsrc, need - keep);
        e->nhashes = r->nhashes;
        e->hash_len = r->hash_len;
        r->block_hashes = r->nhashes ? e->hashes : NULL;
    } else if (r->nhashes) {
        uint8_t *h = dalloc(d, (size_t)hn * r->hash_len, 1);
        if (!h)
            return;
        memcpy(h, hsrc, (size_t)hn * r->hash_len);
        r->block_hashes = h;
    }
    if (f & F_LOAD) {
        kvp_meta_load_spec *ls = dalloc(d, 1, sizeof *ls);
        if (!ls)
            return;
        ls->vllm_cached_tokens = kvp_rd_u64(rd);
        ls->kvpool_cached_tokens = kvp_rd_u64(rd);
        ls->token_len = kvp_rd_u64(rd);
        uint8_t cl = kvp_rd_u8(rd);
        if (cl > 1)
            bad(d);
        ls->can_load = cl == 1;
        r->load_spec = ls;
    }
    if (f & F_TOKENS) {
        uint32_t tb, tn;
        const uint8_t *tsrc = get_delta(d, e ? e->ntoks : 0, 4, UINT32_MAX, &tb, &tn);
        if (!tsrc)
            return;
        if (tb + tn == 0) {
            bad(d); /* an empty list is encoded as "no token ids" */
            return;
        }
        if (e) {
            void *buf = e->toks;
            size_t cap = (size_t)e->tcap * 4;
            int rc = arr_room(d->m, shared, &buf, &cap, (size_t)tb * 4, (size_t)(tb + tn) * 4);
            e->toks = buf;
            e->tcap = (uint32_t)(cap / 4);
            if (rc) {
                d->err = rc;
                return;
            }
            copy_u32s(e->toks + tb, tsrc, tn);
            e->ntoks = tb + tn;
            r->token_ids = e->toks;
        } else {
            uint32_t *t = dalloc(d, tn, sizeof *t);
            if (!t)
                return;
            copy_u32s(t, tsrc, tn);
            r->token_ids = t;
        }
        r->n_token_ids = tb + tn;
    } else if (e) {
        e->ntoks = 0; /* None: the buffer is kept (an earlier view's contents stay) */
    }
    if (f & F_PROMPT) {
        r->has_num_prompt_tokens = true;
        r->num_prompt_tokens = kvp_rd_u64(rd);
    }
    if (f & F_TAILS) {
        uint32_t n = kvp_rd_count(rd, UINT32_MAX, TAIL_SIZE);
        kvp_meta_tail *t = dalloc(d, n, sizeof *t);
        if (!t)
            return;
        for (uint32_t i = 0; i < n && !rd->err; i++) {
            t[i].group_id = kvp_rd_u32(rd);
            t[i].cow_block_id = kvp_rd_u32(rd);
            t[i].boundary_tokens = kvp_rd_u64(rd);
            if (!rd->err && t[i].group_id >= r->ngroups)
                bad(d);
        }
        r->tails = t;
        r->ntails = n;
    }
    if (e)
        e->stamp = d->m->gen;
}

static kvp_meta_str *get_strs(dec *d, uint32_t *n)
{
    *n = kvp_rd_count(&d->r, UINT32_MAX, MIN_STR);
    kvp_meta_str *s = dalloc(d, *n, sizeof *s);
    for (uint32_t i = 0; s && i < *n && !failed(d); i++)
        get_str(d, &s[i]);
    return s;
}

static int decode(kvp_meta_mirror *m, const void *p, size_t len, kvp_arena *a,
                  kvp_meta_step *out)
{
    dec d;
    memset(out, 0, sizeof *out);
    kvp_rd_init(&d.r, p, len);
    d.a = a;
    d.m = m;
    d.err = 0;
    uint32_t magic = kvp_rd_u32(&d.r);
    uint8_t ver = kvp_rd_u8(&d.r);
    if (d.r.err || magic != KVP_META_MAGIC)
        return KVP_EPROTOCOL;
    if (ver != KVP_META_VERSION)
        return KVP_EINVALID_VERSION;
    uint32_t ndrop = kvp_rd_count(&d.r, m ? UINT32_MAX : 0, MIN_STR);
    for (uint32_t i = 0; i < ndrop && !d.r.err; i++) {
        kvp_bytes id = kvp_rd_bytes(&d.r, KVP_META_MAX_ID);
        if (!d.r.err && !id_bytes_ok(id.p, id.len))
            bad(&d);
        if (!d.r.err)
            ment_drop(m, id.p, id.len);
    }
    kvp_meta_step s;
    memset(&s, 0, sizeof s);
    s.nreqs = kvp_rd_count(&d.r, UINT32_MAX, MIN_REQ);
    s.reqs = dalloc(&d, s.nreqs, sizeof *s.reqs);
    for (uint32_t i = 0; s.reqs && i < s.nreqs && !failed(&d); i++)
        get_req(&d, &s.reqs[i]);
    if (!failed(&d))
        s.unfinished = get_strs(&d, &s.nunfinished);
    if (!failed(&d))
        s.preempted = get_strs(&d, &s.npreempted);
    if (d.err)
        return d.err;
    if (kvp_rd_finish(&d.r))
        return KVP_EPROTOCOL;
    *out = s;
    return 0;
}

int kvp_meta_decode(const void *p, size_t len, kvp_arena *a, kvp_meta_step *out)
{
    return decode(NULL, p, len, a, out);
}

int kvp_meta_decode_delta(kvp_meta_mirror *m, const void *p, size_t len, kvp_arena *a,
                          kvp_meta_step *out)
{
    if (!m) {
        memset(out, 0, sizeof *out);
        return KVP_EINVALID_PARAMS;
    }
    retired_free(m);
    m->gen++;
    int rc = decode(m, p, len, a, out);
    if (rc)
        mirror_clear(m);
    return rc;
}

/* ----------------------------------------------------------- equality */

static bool str_eq(const kvp_meta_str *x, const kvp_meta_str *y)
{
    return x->len == y->len && (x->len == 0 || memcmp(x->p, y->p, x->len) == 0);
}

static bool req_eq(const kvp_meta_req *x, const kvp_meta_req *y)
{
    if (!str_eq(&x->req_id, &y->req_id) || x->kind != y->kind ||
        x->token_len_chunk != y->token_len_chunk || x->ngroups != y->ngroups ||
        x->nhashes != y->nhashes || x->hash_len != y->hash_len || x->can_save != y->can_save ||
        x->is_last_chunk != y->is_last_chunk || !x->load_spec != !y->load_spec ||
        x->n_token_ids != y->n_token_ids ||
        x->has_num_prompt_tokens != y->has_num_prompt_tokens || !x->tails != !y->tails ||
        x->ntails != y->ntails)
        return false;
    if (x->has_num_prompt_tokens && x->num_prompt_tokens != y->num_prompt_tokens)
        return false;
    for (uint32_t g = 0; g < x->ngroups; g++) {
        if (x->block_ids[g].n != y->block_ids[g].n)
            return false;
        if (x->block_ids[g].n && memcmp(x->block_ids[g].ids, y->block_ids[g].ids,
                                        (size_t)x->block_ids[g].n * sizeof(uint32_t)))
            return false;
    }
    if (x->nhashes &&
        memcmp(x->block_hashes, y->block_hashes, (size_t)x->nhashes * x->hash_len))
        return false;
    if (x->load_spec &&
        (x->load_spec->vllm_cached_tokens != y->load_spec->vllm_cached_tokens ||
         x->load_spec->kvpool_cached_tokens != y->load_spec->kvpool_cached_tokens ||
         x->load_spec->token_len != y->load_spec->token_len ||
         x->load_spec->can_load != y->load_spec->can_load))
        return false;
    if (x->n_token_ids &&
        memcmp(x->token_ids, y->token_ids, (size_t)x->n_token_ids * sizeof(uint32_t)))
        return false;
    for (uint32_t i = 0; i < x->ntails; i++)
        if (x->tails[i].group_id != y->tails[i].group_id ||
            x->tails[i].cow_block_id != y->tails[i].cow_block_id ||
            x->tails[i].boundary_tokens != y->tails[i].boundary_tokens)
            return false;
    return true;
}

bool kvp_meta_step_equal(const kvp_meta_step *x, const kvp_meta_step *y)
{
    if (x->nreqs != y->nreqs || x->nunfinished != y->nunfinished ||
        x->npreempted != y->npreempted)
        return false;
    for (uint32_t i = 0; i < x->nreqs; i++)
        if (!req_eq(&x->reqs[i], &y->reqs[i]))
            return false;
    for (uint32_t i = 0; i < x->nunfinished; i++)
        if (!str_eq(&x->unfinished[i], &y->unfinished[i]))
            return false;
    for (uint32_t i = 0; i < x->npreempted; i++)
        if (!str_eq(&x->preempted[i], &y->preempted[i]))
            return false;
    return true;
}
