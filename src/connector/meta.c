/*
 * meta.c -- connector request structures and the step metadata encoding
 * (see meta.h for the layout and the contracts).
 */
#include "connector/meta.h"

#include <string.h>

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
#define MIN_REQ (MIN_STR + 1 + 1 + 8 + 4 + 1 + 4)
#define TAIL_SIZE 16u

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
    if (!req_id || req_id_len == 0 || req_id_len > KVP_META_MAX_ID || ngroups == 0 ||
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
    return 0;
}

void kvp_meta_tracker_reset(kvp_meta_tracker *t)
{
    free_groups(t);
    kvp_free(t->token_ids);
    t->token_ids = NULL;
    t->n_token_ids = 0;
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
    return s->p && s->len >= 1 && s->len <= KVP_META_MAX_ID;
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

static void put_str(kvp_buf *b, const kvp_meta_str *s) { kvp_buf_bytes(b, s->p, s->len); }

static void put_req(kvp_buf *b, const kvp_meta_req *r)
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
    put_str(b, &r->req_id);
    kvp_buf_u8(b, r->kind);
    kvp_buf_u8(b, f);
    kvp_buf_u64(b, r->token_len_chunk);
    kvp_buf_u32(b, r->ngroups);
    for (uint32_t g = 0; g < r->ngroups; g++) {
        kvp_buf_u32(b, r->block_ids[g].n);
        for (uint32_t i = 0; i < r->block_ids[g].n; i++)
            kvp_buf_u32(b, r->block_ids[g].ids[i]);
    }
    kvp_buf_u8(b, r->hash_len);
    kvp_buf_u32(b, r->nhashes);
    if (r->nhashes)
        kvp_buf_put(b, r->block_hashes, (size_t)r->nhashes * r->hash_len);
    if (r->load_spec) {
        kvp_buf_u64(b, r->load_spec->vllm_cached_tokens);
        kvp_buf_u64(b, r->load_spec->kvpool_cached_tokens);
        kvp_buf_u64(b, r->load_spec->token_len);
        kvp_buf_u8(b, r->load_spec->can_load ? 1 : 0);
    }
    if (f & F_TOKENS) {
        kvp_buf_u32(b, r->n_token_ids);
        for (uint32_t i = 0; i < r->n_token_ids; i++)
            kvp_buf_u32(b, r->token_ids[i]);
    }
    if (f & F_PROMPT)
        kvp_buf_u64(b, r->num_prompt_tokens);
    if (f & F_TAILS) {
        kvp_buf_u32(b, r->ntails);
        for (uint32_t i = 0; i < r->ntails; i++) {
            kvp_buf_u32(b, r->tails[i].group_id);
            kvp_buf_u32(b, r->tails[i].cow_block_id);
            kvp_buf_u64(b, r->tails[i].boundary_tokens);
        }
    }
}

int kvp_meta_encode(kvp_buf *b, const kvp_meta_step *s)
{
    if ((s->nreqs && !s->reqs) || (s->nunfinished && !s->unfinished) ||
        (s->npreempted && !s->preempted))
        return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < s->nreqs; i++) {
        int rc = req_check(&s->reqs[i]);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < s->nunfinished; i++)
        if (!str_ok(&s->unfinished[i]))
            return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < s->npreempted; i++)
        if (!str_ok(&s->preempted[i]))
            return KVP_EINVALID_PARAMS;
    kvp_buf_u32(b, KVP_META_MAGIC);
    kvp_buf_u8(b, KVP_META_VERSION);
    kvp_buf_u32(b, s->nreqs);
    for (uint32_t i = 0; i < s->nreqs; i++)
        put_req(b, &s->reqs[i]);
    kvp_buf_u32(b, s->nunfinished);
    for (uint32_t i = 0; i < s->nunfinished; i++)
        put_str(b, &s->unfinished[i]);
    kvp_buf_u32(b, s->npreempted);
    for (uint32_t i = 0; i < s->npreempted; i++)
        put_str(b, &s->preempted[i]);
    return b->err;
}

/* ----------------------------------------------------------- decode */

/* Decoder state: the reader plus the first non-protocol error (ENOMEM). */
typedef struct dec {
    kvp_rd r;
    kvp_arena *a;
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

static void get_str(dec *d, kvp_meta_str *s)
{
    kvp_bytes b = kvp_rd_bytes(&d->r, KVP_META_MAX_ID);
    s->p = NULL;
    s->len = 0;
    if (d->r.err)
        return;
    if (b.len == 0) {
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

static void get_u32s(dec *d, uint32_t n, uint32_t *out)
{
    for (uint32_t i = 0; i < n && !d->r.err; i++)
        out[i] = kvp_rd_u32(&d->r);
}

static void get_req(dec *d, kvp_meta_req *r)
{
    kvp_rd *rd = &d->r;
    memset(r, 0, sizeof *r);
    r->can_save = r->is_last_chunk = KVP_META_UNSET;
    get_str(d, &r->req_id);
    r->kind = kvp_rd_u8(rd);
    uint8_t f = kvp_rd_u8(rd);
    if (rd->err || d->err)
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
    r->ngroups = kvp_rd_count(rd, KVP_META_MAX_GROUPS, 4);
    kvp_meta_ids *g = dalloc(d, r->ngroups, sizeof *g);
    if (!g)
        return;
    r->block_ids = g;
    for (uint32_t i = 0; i < r->ngroups; i++) {
        g[i].cap = 0;
        g[i].n = kvp_rd_count(rd, UINT32_MAX, 4);
        g[i].ids = dalloc(d, g[i].n, sizeof(uint32_t));
        if (!g[i].ids)
            return;
        get_u32s(d, g[i].n, g[i].ids);
    }
    r->hash_len = kvp_rd_u8(rd);
    if (rd->err)
        return;
    if (r->hash_len > KVP_META_MAX_HASH_LEN) {
        bad(d);
        return;
    }
    r->nhashes = kvp_rd_count(rd, r->hash_len ? UINT32_MAX : 0, r->hash_len);
    if (rd->err)
        return;
    if ((r->nhashes == 0) != (r->hash_len == 0)) {
        bad(d);
        return;
    }
    if (r->nhashes) {
        size_t hb = (size_t)r->nhashes * r->hash_len;
        const uint8_t *src = kvp_rd_raw(rd, hb);
        uint8_t *h = dalloc(d, hb, 1);
        if (!src || !h)
            return;
        memcpy(h, src, hb);
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
        uint32_t n = kvp_rd_count(rd, UINT32_MAX, 4);
        if (!rd->err && n == 0) {
            bad(d); /* an empty list is encoded as "no token ids" */
            return;
        }
        uint32_t *t = dalloc(d, n, sizeof *t);
        if (!t)
            return;
        get_u32s(d, n, t);
        r->token_ids = t;
        r->n_token_ids = n;
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
}

static kvp_meta_str *get_strs(dec *d, uint32_t *n)
{
    *n = kvp_rd_count(&d->r, UINT32_MAX, MIN_STR);
    kvp_meta_str *s = dalloc(d, *n, sizeof *s);
    for (uint32_t i = 0; s && i < *n && !d->r.err && !d->err; i++)
        get_str(d, &s[i]);
    return s;
}

int kvp_meta_decode(const void *p, size_t len, kvp_arena *a, kvp_meta_step *out)
{
    dec d;
    memset(out, 0, sizeof *out);
    kvp_rd_init(&d.r, p, len);
    d.a = a;
    d.err = 0;
    uint32_t magic = kvp_rd_u32(&d.r);
    uint8_t ver = kvp_rd_u8(&d.r);
    if (d.r.err || magic != KVP_META_MAGIC)
        return KVP_EPROTOCOL;
    if (ver != KVP_META_VERSION)
        return KVP_EINVALID_VERSION;
    kvp_meta_step s;
    memset(&s, 0, sizeof s);
    s.nreqs = kvp_rd_count(&d.r, UINT32_MAX, MIN_REQ);
    s.reqs = dalloc(&d, s.nreqs, sizeof *s.reqs);
    for (uint32_t i = 0; s.reqs && i < s.nreqs && !d.r.err && !d.err; i++)
        get_req(&d, &s.reqs[i]);
    if (!d.r.err && !d.err)
        s.unfinished = get_strs(&d, &s.nunfinished);
    if (!d.r.err && !d.err)
        s.preempted = get_strs(&d, &s.npreempted);
    if (d.err)
        return d.err;
    if (kvp_rd_finish(&d.r))
        return KVP_EPROTOCOL;
    *out = s;
    return 0;
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
