/*
 * sched.c -- the scheduler half of the connector (see sched.h).
 *
 * State (§8.1) is one record per request id, in a chained hash table, also
 * linked in creation order (the unfinished-id set's output order) and in
 * `_unfinished_requests` insertion order (phase 5 walks it). A record is
 * freed when it holds nothing: not in _unfinished_requests, not in the
 * unfinished id set, no load spec, no tracker.
 */
#include "connector/sched.h"

#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/log.h"
#include "common/mem.h"

#define MOD "sched"
#define NBUCKETS 4096u
#define STEP_ARENA_CAP ((size_t)1 << 30)
#define STEP_BYTES_CAP ((size_t)1 << 31)

struct ent {
    struct ent *hnext;
    struct ent *aprev, *anext; /* every record, creation order */
    struct ent *uprev, *unext; /* _unfinished_requests order */
    char *id;
    uint32_t id_len;
    bool in_ureq;              /* in _unfinished_requests */
    bool in_ids;               /* in _unfinished_request_ids */
    bool has_ls;
    bool has_tr;
    bool seen_this_step;       /* new or cached in the step being built */
    uint32_t save_meta;        /* 1 + index of its first saving meta in the step, 0: none */
    kvp_meta_load_spec ls;
    kvp_meta_tracker tr;
    kvp_meta_ids *alloc;       /* block ids recorded at alloc (owned) */
    uint32_t alloc_ngroups;
    uint8_t *hashes;           /* latest block hashes seen (owned, append-only) */
    uint32_t nhashes;
    uint8_t hash_len;
    size_t hcap;
    /* delta encoding: what every worker's mirror holds for this request
     * (counts of the arrays last sent; a prefix of the current arrays,
     * zeroed wherever an array is replaced rather than appended to) */
    bool sent;                 /* the mirrors hold an entry (drop it when gone) */
    uint32_t *sent_groups;     /* sent_ngroups counts (owned, sent_gcap slots) */
    uint32_t sent_ngroups, sent_gcap;
    uint32_t sent_hashes;
    uint8_t sent_hash_len;
    uint32_t sent_tokens;
    /* requests that loaded (sched.h, request_finished rule b) */
    bool load_failed;          /* a load of it failed: its lookups miss until it
                                  finishes (vLLM recomputes; the same hit would
                                  fail again while the master still lists it) */
    bool load_step;            /* a load meta is in the step being built */
    bool alloc_step;           /* update_state_after_alloc since the last build: a
                                  request preempted in this step was re-admitted */
    bool load_emitted;         /* a load meta reached the workers */
};

/* A finish-time boundary-state hand-off queued for the next build
 * (kvp_sched_register_finished_tail); everything owned. */
struct ftail {
    struct ftail *next;
    char *id;
    uint32_t id_len;
    kvp_meta_ids *blocks; /* ngroups tables */
    uint32_t ngroups;
    uint8_t *hashes;
    uint32_t nhashes;
    uint8_t hash_len;
    uint64_t prefill_end;
    kvp_meta_tail *tails;
    uint32_t ntails;
};

struct kvp_sched {
    kvp_sched_config cfg;
    struct ftail *ftails; /* queued finish-time hand-offs, registration order */
    struct ent *tab[NBUCKETS];
    struct ent *ahead, *atail;
    struct ent *uhead, *utail;
    kvp_meta_step step; /* the last build's output (arrays reused) */
    kvp_meta_base *bases; /* step.reqs' delta bases (parallel array) */
    uint32_t bases_cap;
    kvp_meta_str *drops;  /* mirror entries to drop with the next message (owned ids) */
    uint32_t ndrops, drops_cap;
    kvp_arena arena;    /* the last build's copies */
    kvp_buf bytes;
};


/* --------------------------------------------------------------- ops */

static int client_lookup(void *arg, const char *req_id, uint32_t id_len, uint32_t num_tokens,
                         const uint8_t *hashes, size_t nhashes, size_t hash_len, bool non_block,
                         bool apply_eagle, uint32_t *hit)
{
    return kvp_lookup_client_lookup(arg, req_id, id_len, num_tokens, hashes, nhashes, hash_len,
                                    non_block, apply_eagle, hit);
}
static void client_discard(void *arg, const char *req_id, uint32_t id_len)
{
    kvp_lookup_client_discard(arg, req_id, id_len);
}
static int client_reset(void *arg, bool *ok) { return kvp_lookup_client_reset(arg, ok); }

void kvp_sched_ops_client(kvp_lookup_client *c, kvp_sched_lookup_ops *ops)
{
    ops->lookup = client_lookup;
    ops->discard = client_discard;
    ops->reset = client_reset;
    ops->arg = c;
}

void kvp_sched_config_default(kvp_sched_config *c)
{
    memset(c, 0, sizeof *c);
    c->kv_role = KVP_SCHED_BOTH;
    c->load_async = true;
    c->lookup_async = false;
    c->enable_lookup = true;
}

/* ----------------------------------------------------------- records */

static uint32_t id_hash(const char *p, uint32_t n)
{
    uint32_t h = 2166136261u;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h % NBUCKETS;
}

/* Request ids: 1..KVP_META_MAX_ID bytes without NUL (workers and engines
 * carry them as C strings). */
static bool id_ok(const char *id, uint32_t n)
{
    return id && n >= 1 && n <= KVP_META_MAX_ID && !memchr(id, 0, n);
}

static struct ent *ent_find(kvp_sched *s, const char *id, uint32_t n)
{
    for (struct ent *e = s->tab[id_hash(id, n)]; e; e = e->hnext)
        if (e->id_len == n && memcmp(e->id, id, n) == 0)
            return e;
    return NULL;
}

static struct ent *ent_get(kvp_sched *s, const char *id, uint32_t n)
{
    struct ent *e = ent_find(s, id, n);
    if (e)
        return e;
    e = kvp_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->id = kvp_strndup(id, n);
    if (!e->id) {
        kvp_free(e);
        return NULL;
    }
    e->id_len = n;
    uint32_t b = id_hash(id, n);
    e->hnext = s->tab[b];
    s->tab[b] = e;
    e->aprev = s->atail;
    if (s->atail)
        s->atail->anext = e;
    else
        s->ahead = e;
    s->atail = e;
    return e;
}

static void alloc_free(struct ent *e)
{
    for (uint32_t g = 0; g < e->alloc_ngroups; g++)
        kvp_free(e->alloc[g].ids);
    kvp_free(e->alloc);
    e->alloc = NULL;
    e->alloc_ngroups = 0;
}

static void ureq_remove(kvp_sched *s, struct ent *e)
{
    if (!e->in_ureq)
        return;
    KVP_ASSERT(e->uprev ? e->uprev->unext == e : s->uhead == e);
    KVP_ASSERT(e->unext ? e->unext->uprev == e : s->utail == e);
    if (e->uprev)
        e->uprev->unext = e->unext;
    else
        s->uhead = e->unext;
    if (e->unext)
        e->unext->uprev = e->uprev;
    else
        s->utail = e->uprev;
    e->uprev = e->unext = NULL;
    e->in_ureq = false;
    alloc_free(e);
}

static void ureq_append(kvp_sched *s, struct ent *e)
{
    if (e->in_ureq)
        return;
    KVP_ASSERT(!e->uprev && !e->unext && s->uhead != e);
    e->uprev = s->utail;
    e->unext = NULL;
    if (s->utail)
        s->utail->unext = e;
    else
        s->uhead = e;
    s->utail = e;
    e->in_ureq = true;
}

static void tracker_drop(struct ent *e)
{
    if (e->has_tr)
        kvp_meta_tracker_free(&e->tr);
    e->has_tr = false;
}

/* Queues e's id for the next message's drop list (the workers' mirrors
 * forget it). KVP_ENOMEM leaves the entry behind in the mirrors (memory
 * only: a later send of that id is a full one). */
static void drop_push(kvp_sched *s, struct ent *e)
{
    if (!e->sent)
        return;
    e->sent = false;
    e->sent_ngroups = e->sent_hashes = e->sent_tokens = 0;
    if (s->ndrops == s->drops_cap) {
        uint32_t nc = s->drops_cap ? s->drops_cap * 2 : 16;
        kvp_meta_str *p = kvp_realloc(s->drops, (size_t)nc * sizeof *p);
        if (!p) {
            KVP_WARN(MOD, "out of memory: the workers keep a mirror entry for %s", e->id);
            return;
        }
        s->drops = p;
        s->drops_cap = nc;
    }
    char *id = kvp_strndup(e->id, e->id_len);
    if (!id) {
        KVP_WARN(MOD, "out of memory: the workers keep a mirror entry for %s", e->id);
        return;
    }
    s->drops[s->ndrops++] = (kvp_meta_str){id, e->id_len};
}

static void drops_clear(kvp_sched *s)
{
    for (uint32_t i = 0; i < s->ndrops; i++)
        kvp_free((char *)s->drops[i].p);
    s->ndrops = 0;
}

static void ent_destroy(kvp_sched *s, struct ent *e)
{
    drop_push(s, e);
    ureq_remove(s, e);
    tracker_drop(e);
    struct ent **pp = &s->tab[id_hash(e->id, e->id_len)];
    while (*pp != e) {
        KVP_ASSERT(*pp != NULL); /* every record is in its bucket's chain */
        pp = &(*pp)->hnext;
    }
    *pp = e->hnext;
    if (e->aprev)
        e->aprev->anext = e->anext;
    else
        s->ahead = e->anext;
    if (e->anext)
        e->anext->aprev = e->aprev;
    else
        s->atail = e->aprev;
    kvp_free(e->hashes);
    kvp_free(e->sent_groups);
    kvp_free(e->id);
    kvp_free(e);
}

/* Frees e when it holds nothing any more. */
static void ent_maybe_free(kvp_sched *s, struct ent *e)
{
    if (!e->in_ureq && !e->in_ids && !e->has_ls && !e->has_tr)
        ent_destroy(s, e);
}

/*
 * Keeps e's copy of the request's block hashes current. Hash chains are
 * append-only, so only the new tail is copied; a different hash_len or a
 * shorter chain replaces the copy.
 */
static int ent_set_hashes(struct ent *e, const kvp_sched_request *r)
{
    uint32_t n = r->hash_len ? r->nhashes : 0;
    if (n && !r->block_hashes)
        return KVP_EINVALID_PARAMS;
    if (n == 0) {
        e->nhashes = 0;
        e->hash_len = 0;
        e->sent_hashes = 0;
        return 0;
    }
    size_t need = (size_t)n * r->hash_len;
    uint32_t keep = (r->hash_len == e->hash_len && n >= e->nhashes) ? e->nhashes : 0;
    if (need > e->hcap) {
        size_t cap = e->hcap ? e->hcap : 256;
        while (cap < need)
            cap *= 2;
        uint8_t *p = kvp_realloc(e->hashes, cap);
        if (!p)
            return KVP_ENOMEM;
        e->hashes = p;
        e->hcap = cap;
    }
    if (keep == 0)
        e->sent_hashes = 0; /* replaced, not appended: the next send is a full one */
    size_t off = (size_t)keep * r->hash_len;
    memcpy(e->hashes + off, r->block_hashes + off, need - off);
    e->nhashes = n;
    e->hash_len = r->hash_len;
    /* what the mirrors hold is a prefix of the current chain */
    KVP_ASSERT(need <= e->hcap && e->sent_hashes <= e->nhashes);
    return 0;
}

static bool ids_ok(const kvp_meta_ids *g, uint32_t ngroups)
{
    if (ngroups > KVP_META_MAX_GROUPS || (ngroups && !g))
        return false;
    for (uint32_t i = 0; i < ngroups; i++)
        if (g[i].n && !g[i].ids)
            return false;
    return true;
}

static bool req_ok(const kvp_sched_request *r)
{
    return r && id_ok(r->req_id, r->req_id_len) && (r->num_tokens == 0 || r->all_token_ids) &&
           (r->num_prompt_tokens == 0 || r->prompt_token_ids) &&
           r->hash_len <= KVP_META_MAX_HASH_LEN;
}

/* ---------------------------------------------------------- lifecycle */

int kvp_sched_new(const kvp_sched_config *cfg, kvp_sched **out)
{
    if (!cfg || !out || cfg->block_size == 0 || cfg->hash_block_size == 0 ||
        cfg->block_size % cfg->hash_block_size != 0 || cfg->kv_role < KVP_SCHED_PRODUCER ||
        cfg->kv_role > KVP_SCHED_BOTH || (cfg->enable_lookup && !cfg->ops.lookup) ||
        !cfg->load_async) /* the worker loads in the background only (§10.2): a
                             synchronous load would let the engine compute on
                             blocks still being written */
        return KVP_EINVALID_PARAMS;
    kvp_sched *s = kvp_calloc(1, sizeof *s);
    if (!s)
        return KVP_ENOMEM;
    s->cfg = *cfg;
    kvp_meta_step_init(&s->step);
    kvp_arena_init(&s->arena, STEP_ARENA_CAP);
    kvp_buf_init(&s->bytes, STEP_BYTES_CAP);
    *out = s;
    return 0;
}

static void ftail_free(struct ftail *f)
{
    if (!f)
        return;
    for (uint32_t g = 0; f->blocks && g < f->ngroups; g++)
        kvp_free(f->blocks[g].ids);
    kvp_free(f->blocks);
    kvp_free(f->hashes);
    kvp_free(f->tails);
    kvp_free(f->id);
    kvp_free(f);
}

void kvp_sched_free(kvp_sched *s)
{
    if (!s)
        return;
    while (s->ftails) {
        struct ftail *f = s->ftails;
        s->ftails = f->next;
        ftail_free(f);
    }
    while (s->ahead)
        ent_destroy(s, s->ahead);
    drops_clear(s);
    kvp_free(s->drops);
    kvp_free(s->bases);
    kvp_meta_step_free(&s->step);
    kvp_arena_free(&s->arena);
    kvp_buf_free(&s->bytes);
    kvp_free(s);
}

/* ------------------------------------------------------------ §8.2 */

int kvp_sched_get_num_new_matched_tokens(kvp_sched *s, const kvp_sched_request *req,
                                         uint64_t num_computed_tokens, uint64_t *num_new,
                                         bool *load_async)
{
    if (!s || !req_ok(req) || !num_new || !load_async)
        return KVP_EINVALID_PARAMS;
    *num_new = 0;
    *load_async = false;
    if (!s->cfg.enable_lookup)
        return 0;
    /* fine-grained hits may land inside a block; otherwise a prefix shorter
     * than one block has no key granularity */
    uint32_t align = s->cfg.enable_partial_hash_hits ? s->cfg.hash_block_size : s->cfg.block_size;
    if (req->num_tokens < align)
        return 0;
    const struct ent *f = ent_find(s, req->req_id, req->req_id_len);
    if (f && f->load_failed)
        return 0;
    uint32_t hit = 0;
    int rc = s->cfg.ops.lookup(s->cfg.ops.arg, req->req_id, req->req_id_len, req->num_tokens,
                               req->block_hashes, req->hash_len ? req->nhashes : 0, req->hash_len,
                               s->cfg.lookup_async, true, &hit);
    if (rc == KVP_LOOKUP_PENDING)
        return KVP_LOOKUP_PENDING;
    if (rc < 0) {
        KVP_WARN(MOD, "lookup for %.*s failed (%d): treated as a miss", (int)req->req_id_len,
                 req->req_id, rc);
        hit = 0;
    }
    if (hit >= req->num_tokens) { /* at least one token must be left to compute (§10.5) */
        /* the worker floors below num_tokens (§10.5); more is a broken peer */
        KVP_WARN(MOD, "lookup for %.*s answered %u >= %u tokens: treated as a miss",
                 (int)req->req_id_len, req->req_id, hit, req->num_tokens);
        hit = 0;
    }
    if (hit <= num_computed_tokens)
        return 0;
    struct ent *e = ent_get(s, req->req_id, req->req_id_len);
    if (!e)
        return KVP_ENOMEM;
    e->ls = (kvp_meta_load_spec){.vllm_cached_tokens = num_computed_tokens,
                                 .kvpool_cached_tokens = hit,
                                 .token_len = 0,
                                 .can_load = false};
    e->has_ls = true;
    *num_new = hit - num_computed_tokens;
    *load_async = s->cfg.load_async;
    return 0;
}

/* ------------------------------------------------------------ §8.3 */

int kvp_sched_update_state_after_alloc(kvp_sched *s, const kvp_sched_request *req,
                                       const kvp_meta_ids *blocks, uint32_t ngroups,
                                       uint64_t num_external_tokens)
{
    if (!s || !req_ok(req) ||
        (num_external_tokens > 0 && (ngroups < 1 || !ids_ok(blocks, ngroups))))
        return KVP_EINVALID_PARAMS;
    struct ent *e = ent_get(s, req->req_id, req->req_id_len);
    if (!e)
        return KVP_ENOMEM;
    kvp_meta_ids *copy = NULL;
    uint32_t ncopy = 0;
    if (num_external_tokens > 0 && ngroups) {
        copy = kvp_calloc(ngroups, sizeof *copy);
        if (!copy)
            goto oom;
        for (ncopy = 0; ncopy < ngroups; ncopy++) {
            uint32_t n = blocks[ncopy].n;
            copy[ncopy].n = copy[ncopy].cap = n;
            if (n && !(copy[ncopy].ids = kvp_malloc((size_t)n * sizeof(uint32_t))))
                goto oom;
            if (n)
                memcpy(copy[ncopy].ids, blocks[ncopy].ids, (size_t)n * sizeof(uint32_t));
        }
    }
    if (ent_set_hashes(e, req) != 0)
        goto oom;
    alloc_free(e);
    ureq_append(s, e);
    e->alloc = copy;
    e->alloc_ngroups = ncopy;
    e->in_ids = true;
    e->alloc_step = true;
    if (!e->has_ls)
        return 0;
    if (num_external_tokens == 0) {
        e->ls.can_load = false;
        return 0;
    }
    if (num_external_tokens != e->ls.kvpool_cached_tokens - e->ls.vllm_cached_tokens) {
        KVP_ERROR(MOD, "request %s: %llu external tokens allocated, load spec says %llu - %llu",
                  e->id, (unsigned long long)num_external_tokens,
                  (unsigned long long)e->ls.kvpool_cached_tokens,
                  (unsigned long long)e->ls.vllm_cached_tokens);
        return KVP_EINVALID_PARAMS;
    }
    e->ls.can_load = true;
    return 0;
oom:
    for (uint32_t g = 0; copy && g < ngroups; g++)
        kvp_free(copy[g].ids);
    kvp_free(copy);
    ent_maybe_free(s, e);
    return KVP_ENOMEM;
}

/* ------------------------------------------------------------ §8.4 */

/*
 * Appends m (a meta of e) to the step with its delta base: what the
 * workers' mirrors hold of e's arrays (e->sent_*) when that is still a
 * prefix of m's arrays, else 0 (a full send). Then records m's counts as
 * sent.
 */
static int push_meta(kvp_sched *s, struct ent *e, const kvp_meta_req *m)
{
    if (s->step.nreqs == s->bases_cap) {
        uint32_t nc = s->bases_cap ? s->bases_cap * 2 : 64;
        kvp_meta_base *p = kvp_realloc(s->bases, (size_t)nc * sizeof *p);
        if (!p)
            return KVP_ENOMEM;
        s->bases = p;
        s->bases_cap = nc;
    }
    if (m->ngroups > e->sent_gcap) {
        uint32_t *p = kvp_realloc(e->sent_groups, (size_t)m->ngroups * sizeof *p);
        if (!p)
            return KVP_ENOMEM;
        e->sent_groups = p;
        e->sent_gcap = m->ngroups;
    }
    kvp_meta_base b = {NULL, 0, 0};
    if (e->sent) {
        if (m->ngroups && m->ngroups == e->sent_ngroups) {
            uint32_t *gb = kvp_arena_alloc(&s->arena, (size_t)m->ngroups * sizeof *gb);
            if (!gb)
                return KVP_ENOMEM;
            for (uint32_t g = 0; g < m->ngroups; g++)
                gb[g] = e->sent_groups[g] <= m->block_ids[g].n ? e->sent_groups[g] : 0;
            b.groups = gb;
        }
        if (m->hash_len == e->sent_hash_len && e->sent_hashes <= m->nhashes)
            b.hashes = e->sent_hashes;
        if (e->sent_tokens <= m->n_token_ids)
            b.tokens = e->sent_tokens;
    }
    int rc = kvp_meta_step_add_req(&s->step, m);
    if (rc)
        return rc;
    s->bases[s->step.nreqs - 1] = b;
    if (m->can_save == KVP_META_TRUE && !e->save_meta)
        e->save_meta = s->step.nreqs; /* phase 6 attaches partial tails to it */
    e->sent = true;
    e->sent_ngroups = m->ngroups;
    for (uint32_t g = 0; g < m->ngroups; g++)
        e->sent_groups[g] = m->block_ids[g].n;
    e->sent_hashes = m->nhashes;
    e->sent_hash_len = m->hash_len;
    e->sent_tokens = m->n_token_ids;
    if (m->load_spec)
        e->load_step = true;
    return 0;
}

static int add_meta(kvp_sched *s, struct ent *e, kvp_meta_req *m)
{
    /* the view must not point at the record's load spec (it is popped):
     * copy it into the step arena */
    if (m->load_spec) {
        kvp_meta_load_spec *ls = kvp_arena_alloc(&s->arena, sizeof *ls);
        if (!ls)
            return KVP_ENOMEM;
        *ls = *m->load_spec;
        m->load_spec = ls;
    }
    return push_meta(s, e, m);
}

/* New tracker for e (new or resumed request), replacing any old one. */
static int tracker_fresh(struct ent *e, uint64_t T, const kvp_meta_ids *ids, uint32_t ngroups,
                         const uint32_t *prefill, uint32_t nprefill)
{
    if (ngroups < 1 || !ids_ok(ids, ngroups))
        return KVP_EINVALID_PARAMS;
    tracker_drop(e);
    e->sent_ngroups = 0; /* a new table and token list: the next send is a full one */
    e->sent_tokens = 0;
    int rc = kvp_meta_tracker_init(&e->tr, e->id, e->id_len, ngroups);
    if (rc)
        return rc;
    e->has_tr = true;
    e->tr.token_len = T;
    uint32_t ntok = T < nprefill ? (uint32_t)T : nprefill;
    if ((rc = kvp_meta_tracker_replace(&e->tr, ids, ngroups)) != 0 ||
        (rc = kvp_meta_tracker_set_tokens(&e->tr, ntok ? prefill : NULL, ntok)) != 0)
        return rc;
    e->tr.num_saved_tokens = 0;
    e->tr.prefill_end_tokens = nprefill;
    return 0;
}

static int8_t last_chunk(uint64_t token_len, uint64_t prefill_end, uint64_t L)
{
    return token_len >= prefill_end / L * L ? KVP_META_TRUE : KVP_META_FALSE;
}

/* from_request_tracker with the record's hashes; emits when non-None. */
static int emit(kvp_sched *s, struct ent *e, const kvp_meta_load_spec *ls, bool skip_save,
                int8_t is_last, uint8_t kind)
{
    kvp_meta_req m;
    int rc = kvp_meta_from_tracker(&e->tr, s->cfg.block_size, ls, skip_save, e->hashes,
                                   e->nhashes, e->hash_len, is_last, -1, kind, &m);
    if (rc <= 0)
        return rc;
    return add_meta(s, e, &m);
}

/* New request (phase 3) or resumed request (phase 4): same shape. */
static int build_fresh(kvp_sched *s, struct ent *e, const kvp_sched_request *r, uint64_t T,
                       const kvp_meta_ids *ids, uint32_t ngroups, const uint32_t *prefill,
                       uint32_t nprefill, bool skip_save, uint8_t kind)
{
    kvp_meta_load_spec ls = e->ls;
    bool had_ls = e->has_ls;
    e->has_ls = false; /* popped */
    int rc = ent_set_hashes(e, r);
    if (rc == 0)
        rc = tracker_fresh(e, T, ids, ngroups, prefill, nprefill);
    if (rc)
        return rc;
    return emit(s, e, had_ls ? &ls : NULL, skip_save,
                last_chunk(e->tr.token_len, nprefill, s->cfg.block_size), kind);
}

/*
 * Whether a running request's step produces a save meta (phase_cached):
 * prefill chunks always for a storing role; decode steps only with
 * save_decode_cache; a consumer saves decode steps only (sched.h,
 * "Decode-phase saves"). The tracker advances whenever the request may
 * save at some later step, so that its table is whole by then.
 */
static bool running_tracks(const kvp_sched *s, bool decode)
{
    return !decode || s->cfg.save_decode_cache;
}

static bool running_saves(const kvp_sched *s, bool decode)
{
    return s->cfg.kv_role != KVP_SCHED_CONSUMER || decode;
}

/* skip_resumed: a resumed request's fresh tracker emits no save (a consumer). */
static int phase_cached(kvp_sched *s, const kvp_sched_cached_req *c, bool skip_resumed)
{
    const kvp_sched_request *r = c->req;
    if (!req_ok(r) || (c->new_block_ids && !ids_ok(c->new_block_ids, c->ngroups)))
        return KVP_EINVALID_PARAMS;
    struct ent *e = ent_find(s, r->req_id, r->req_id_len);
    if (!e || !e->in_ureq) {
        KVP_ERROR(MOD, "request %.*s is not in _unfinished_requests", (int)r->req_id_len,
                  r->req_id);
        return KVP_EINVALID_PARAMS;
    }
    e->seen_this_step = true;
    if (c->resumed) /* new_block_ids is the full table: REPLACE */
        return build_fresh(s, e, r, r->num_computed_tokens + c->num_scheduled_tokens,
                           c->new_block_ids, c->new_block_ids ? c->ngroups : 0, r->all_token_ids,
                           r->num_tokens, skip_resumed, KVP_META_RESUMED);
    if (!e->has_tr) {
        KVP_ERROR(MOD, "running request %s has no tracker", e->id);
        return KVP_EINVALID_PARAMS;
    }
    kvp_meta_tracker *t = &e->tr;
    /* only tokens already in all_token_ids count: drafts are not saved */
    uint64_t end = t->token_len + c->num_scheduled_tokens;
    if (end > r->num_tokens)
        end = r->num_tokens;
    if (end > t->token_len)
        t->token_len = end;
    bool decode = r->num_computed_tokens >= t->prefill_end_tokens;
    if (!running_tracks(s, decode))
        return 0; /* decode without save_decode_cache: not saved */
    int rc;
    /* the tokens of what it saves next (the worker's KV events name them) */
    uint64_t ntok = t->token_len < r->num_tokens ? t->token_len : r->num_tokens;
    if ((rc = kvp_meta_tracker_extend_tokens(t, r->all_token_ids, (uint32_t)ntok)) != 0)
        return rc;
    if (c->new_block_ids && c->ngroups &&
        (rc = kvp_meta_tracker_update(t, c->new_block_ids, c->ngroups)) != 0)
        return rc;
    if ((rc = ent_set_hashes(e, r)) != 0)
        return rc;
    if (!running_saves(s, decode))
        return 0; /* a consumer's chunked prefill: tracked, saved from its first decode */
    return emit(s, e, NULL, false, last_chunk(t->token_len, t->prefill_end_tokens,
                                                  s->cfg.block_size),
                KVP_META_RUNNING);
}

static int phase_pending_loads(kvp_sched *s)
{
    for (struct ent *e = s->uhead; e; e = e->unext) {
        if (e->seen_this_step || !e->has_ls)
            continue;
        kvp_meta_load_spec ls = e->ls;
        e->has_ls = false; /* popped */
        if (!ls.can_load)
            continue; /* nothing allocated for it: nothing to load, nothing computed to save */
        int rc = tracker_fresh(e, ls.kvpool_cached_tokens, e->alloc, e->alloc_ngroups, NULL, 0);
        if (rc)
            return rc;
        if ((rc = emit(s, e, &ls, false, KVP_META_UNSET, KVP_META_LOAD)) != 0)
            return rc;
    }
    return 0;
}

/*
 * The entries of one hand-off that can be stored (vLLM 0.33's
 * _handle_boundary_state_offloads filter): never the null block, never a
 * boundary past the request's prefill end (every other group stops saving
 * there, so such a state could never complete a hybrid hit). Copied into the
 * step arena; *n the number kept.
 */
static kvp_meta_tail *tails_kept(kvp_sched *s, const kvp_meta_tail *in, uint32_t nin,
                                 uint64_t prefill_end, uint32_t *n, int *rc)
{
    *n = 0;
    *rc = 0;
    kvp_meta_tail *copy = kvp_arena_alloc(&s->arena, (size_t)nin * sizeof *copy);
    if (!copy) {
        *rc = KVP_ENOMEM;
        return NULL;
    }
    for (uint32_t k = 0; k < nin; k++)
        if (in[k].cow_block_id != 0 && in[k].boundary_tokens > 0 &&
            in[k].boundary_tokens <= prefill_end)
            copy[(*n)++] = in[k];
    return copy;
}

/* A store-only meta (token_len_chunk 0 skips the normal save; can_save
 * takes the store path) carrying boundary-state puts. */
static kvp_meta_req tail_meta(const struct ent *e, const kvp_meta_ids *blocks, uint32_t ngroups,
                              const uint8_t *hashes, uint32_t nhashes, uint8_t hash_len,
                              uint64_t prefill_end, const kvp_meta_tail *tails, uint32_t ntails)
{
    kvp_meta_req m;
    memset(&m, 0, sizeof m);
    m.req_id = (kvp_meta_str){e->id, e->id_len};
    m.kind = KVP_META_TAIL;
    m.token_len_chunk = 0;
    m.block_ids = blocks;
    m.ngroups = ngroups;
    m.block_hashes = nhashes ? hashes : NULL;
    m.nhashes = nhashes;
    m.hash_len = nhashes ? hash_len : 0;
    m.can_save = KVP_META_TRUE;
    m.is_last_chunk = KVP_META_UNSET;
    m.has_num_prompt_tokens = true;
    m.num_prompt_tokens = prefill_end;
    m.tails = tails;
    m.ntails = ntails;
    return m;
}

/* 6. this step's boundary-state hand-offs: on the request's save meta of
 * the step when it has one, else a store-only meta. */
static int phase_tails(kvp_sched *s, const kvp_sched_step *st)
{
    for (uint32_t i = 0; i < st->n_tails; i++) {
        const kvp_sched_tail_req *tr = &st->tails[i];
        if (!id_ok(tr->req_id, tr->req_id_len) || (tr->ntails && !tr->tails))
            return KVP_EINVALID_PARAMS;
        if (tr->ntails == 0)
            continue;
        struct ent *e = ent_find(s, tr->req_id, tr->req_id_len);
        if (!e || !e->has_tr || !e->in_ureq) {
            /* finished / preempted within this step: its blocks are going away */
            KVP_DEBUG(MOD, "dropping boundary-state offload for %.*s", (int)tr->req_id_len,
                      tr->req_id);
            continue;
        }
        uint32_t n;
        int rc;
        kvp_meta_tail *copy = tails_kept(s, tr->tails, tr->ntails, e->tr.prefill_end_tokens, &n,
                                         &rc);
        if (rc)
            return rc;
        if (n == 0)
            continue;
        e->tr.has_pending_offload = true;
        if (e->save_meta) { /* rides the request's save meta of this step */
            kvp_meta_req *q = &s->step.reqs[e->save_meta - 1];
            q->tails = copy;
            q->ntails = n;
            continue;
        }
        kvp_meta_req m = tail_meta(e, e->tr.block_ids, e->tr.ngroups, e->hashes, e->nhashes,
                                   e->hash_len, e->tr.prefill_end_tokens, copy, n);
        if ((rc = push_meta(s, e, &m)) != 0)
            return rc;
    }
    return 0;
}

/* Copies an owned table into the step arena (the view must outlive the
 * record, which is freed once emitted). */
static kvp_meta_ids *arena_ids(kvp_sched *s, const kvp_meta_ids *in, uint32_t n)
{
    kvp_meta_ids *out = kvp_arena_alloc(&s->arena, (size_t)(n ? n : 1) * sizeof *out);
    for (uint32_t g = 0; out && g < n; g++) {
        out[g] = (kvp_meta_ids){NULL, in[g].n, 0};
        if (in[g].n && !(out[g].ids = kvp_arena_alloc(&s->arena, (size_t)in[g].n * 4)))
            return NULL;
        if (in[g].n)
            memcpy(out[g].ids, in[g].ids, (size_t)in[g].n * 4);
    }
    return out;
}

/* 7. finish-time hand-offs registered since the last build (the request
 * may be in this step's finished list: its record was destroyed in phase 1,
 * and a transient one carries the meta -- a full send, dropped from the
 * workers' mirrors with the next message). */
static int phase_finished_tails(kvp_sched *s)
{
    while (s->ftails) {
        struct ftail *f = s->ftails;
        struct ent *e = ent_get(s, f->id, f->id_len);
        kvp_meta_ids *ids = e ? arena_ids(s, f->blocks, f->ngroups) : NULL;
        kvp_meta_tail *tl = ids ? kvp_arena_alloc(&s->arena, (size_t)f->ntails * sizeof *tl)
                                : NULL;
        uint8_t *h = tl && f->nhashes
                         ? kvp_arena_alloc(&s->arena, (size_t)f->nhashes * f->hash_len)
                         : NULL;
        if (!tl || (f->nhashes && !h))
            return KVP_ENOMEM; /* stays queued: retried by the next build */
        memcpy(tl, f->tails, (size_t)f->ntails * sizeof *tl);
        if (f->nhashes)
            memcpy(h, f->hashes, (size_t)f->nhashes * f->hash_len);
        /* the finish-time table need not extend what the mirrors hold: send
         * it whole, and whatever follows for this id whole too */
        e->sent_ngroups = e->sent_hashes = e->sent_tokens = 0;
        kvp_meta_req m = tail_meta(e, ids, f->ngroups, h, f->nhashes, f->hash_len,
                                   f->prefill_end, tl, f->ntails);
        /* the id from the arena: a transient record is freed at the end of
         * kvp_sched_build_meta, and the step it returns must stay readable */
        char *idc = kvp_arena_alloc(&s->arena, (size_t)f->id_len + 1);
        if (!idc)
            return KVP_ENOMEM;
        memcpy(idc, f->id, f->id_len);
        idc[f->id_len] = '\0';
        m.req_id = (kvp_meta_str){idc, f->id_len};
        int rc = push_meta(s, e, &m);
        if (rc)
            return rc;
        e->sent_ngroups = e->sent_hashes = e->sent_tokens = 0;
        s->ftails = f->next;
        ftail_free(f);
    }
    return 0;
}

int kvp_sched_register_finished_tail(kvp_sched *s, const char *req_id, uint32_t id_len,
                                     const kvp_meta_ids *block_ids, uint32_t ngroups,
                                     const kvp_meta_tail *tails, uint32_t ntails, bool *queued)
{
    if (!s || !id_ok(req_id, id_len) || !queued || !ids_ok(block_ids, ngroups) ||
        (ntails && !tails))
        return KVP_EINVALID_PARAMS;
    *queued = false;
    for (uint32_t k = 1; k < ntails; k++)
        if (tails[k].boundary_tokens != tails[0].boundary_tokens)
            return KVP_EINVALID_PARAMS; /* one boundary per request (the reference raises) */
    for (const struct ftail *f = s->ftails; f; f = f->next)
        if (f->id_len == id_len && memcmp(f->id, req_id, id_len) == 0)
            return KVP_EINVALID_PARAMS;
    if (s->cfg.kv_role == KVP_SCHED_CONSUMER || ntails == 0)
        return 0;
    struct ent *e = ent_find(s, req_id, id_len);
    uint64_t total = 0;
    for (uint32_t g = 0; g < ngroups; g++)
        total += block_ids[g].n;
    if (!e || !e->has_tr || total == 0 || ngroups != e->tr.ngroups ||
        tails[0].boundary_tokens > e->tr.prefill_end_tokens)
        return 0;
    for (uint32_t k = 0; k < ntails; k++)
        if (tails[k].cow_block_id == 0 || tails[k].group_id >= ngroups)
            return 0;
    struct ftail *f = kvp_calloc(1, sizeof *f);
    if (!f)
        return KVP_ENOMEM;
    f->id = kvp_strndup(req_id, id_len);
    f->id_len = id_len;
    f->ngroups = ngroups;
    f->blocks = kvp_calloc(ngroups, sizeof *f->blocks);
    f->tails = kvp_malloc((size_t)ntails * sizeof *f->tails);
    f->ntails = ntails;
    f->nhashes = e->nhashes;
    f->hash_len = e->hash_len;
    f->hashes = kvp_malloc(e->nhashes ? (size_t)e->nhashes * e->hash_len : 1);
    f->prefill_end = e->tr.prefill_end_tokens;
    bool ok = f->id && f->blocks && f->tails && f->hashes;
    for (uint32_t g = 0; ok && g < ngroups; g++) {
        uint32_t n = block_ids[g].n;
        f->blocks[g].n = f->blocks[g].cap = n;
        ok = (f->blocks[g].ids = kvp_malloc(n ? (size_t)n * 4 : 1)) != NULL;
        if (ok && n)
            memcpy(f->blocks[g].ids, block_ids[g].ids, (size_t)n * 4);
    }
    if (!ok) {
        ftail_free(f);
        return KVP_ENOMEM;
    }
    memcpy(f->tails, tails, (size_t)ntails * sizeof *f->tails);
    if (e->nhashes)
        memcpy(f->hashes, e->hashes, (size_t)e->nhashes * e->hash_len);
    struct ftail **pp = &s->ftails;
    while (*pp)
        pp = &(*pp)->next;
    *pp = f;
    e->tr.has_pending_offload = true; /* request_finished delays the free */
    *queued = true;
    return 0;
}

static int copy_str(kvp_sched *s, const kvp_meta_str *in, kvp_meta_str *out)
{
    if (!id_ok(in->p, in->len))
        return KVP_EINVALID_PARAMS;
    char *p = kvp_arena_alloc(&s->arena, (size_t)in->len + 1);
    if (!p)
        return KVP_ENOMEM;
    memcpy(p, in->p, in->len);
    p[in->len] = 0;
    *out = (kvp_meta_str){p, in->len};
    return 0;
}

static int build(kvp_sched *s, const kvp_sched_step *st)
{
    bool consumer = s->cfg.kv_role == KVP_SCHED_CONSUMER;
    int rc;
    /* 1. finished: forget everything about them */
    for (uint32_t i = 0; i < st->n_finished; i++) {
        const kvp_meta_str *id = &st->finished[i];
        if (!id_ok(id->p, id->len))
            return KVP_EINVALID_PARAMS;
        if (s->cfg.ops.discard)
            s->cfg.ops.discard(s->cfg.ops.arg, id->p, id->len);
        struct ent *e = ent_find(s, id->p, id->len);
        if (e)
            ent_destroy(s, e);
    }
    /* 2. preempted: drop the load spec, reset the tracker (kept), leave
     * _unfinished_requests but stay in the unfinished id set. One that vLLM
     * re-admitted in the same schedule (allocated after the preemption:
     * reset_prefix_cache with running requests does this) keeps the load
     * spec and its place: dropping them would leave it waiting for a load
     * that never comes (WAITING_FOR_REMOTE_KVS for good). */
    for (uint32_t i = 0; i < st->n_preempted; i++) {
        kvp_meta_str copy;
        if ((rc = copy_str(s, &st->preempted[i], &copy)) != 0 ||
            (rc = kvp_meta_step_add_preempted(&s->step, copy.p, copy.len)) != 0)
            return rc;
        struct ent *e = ent_find(s, copy.p, copy.len);
        if (!e)
            continue;
        if (e->has_tr)
            kvp_meta_tracker_reset(&e->tr);
        drop_push(s, e); /* the workers' mirrors forget it; a resume is a full send */
        if (e->alloc_step)
            continue;
        e->has_ls = false;
        ureq_remove(s, e);
    }
    /* 3. new requests */
    for (uint32_t i = 0; i < st->n_new; i++) {
        const kvp_sched_new_req *n = &st->new_reqs[i];
        const kvp_sched_request *r = n->req;
        if (!req_ok(r))
            return KVP_EINVALID_PARAMS;
        struct ent *e = ent_find(s, r->req_id, r->req_id_len);
        if (!e || !e->in_ureq) {
            KVP_ERROR(MOD, "new request %.*s was not allocated", (int)r->req_id_len, r->req_id);
            return KVP_EINVALID_PARAMS;
        }
        e->seen_this_step = true;
        if ((rc = build_fresh(s, e, r, r->num_computed_tokens + n->num_scheduled_tokens,
                              n->block_ids, n->ngroups, r->prompt_token_ids,
                              r->num_prompt_tokens, consumer, KVP_META_NEW)) != 0)
            return rc;
    }
    /* 4. cached requests (a consumer without save_decode_cache never saves
     * them: skipped entirely; resumed ones are never saved by a consumer) */
    for (uint32_t i = 0; i < st->n_cached; i++) {
        if (consumer && !s->cfg.save_decode_cache) {
            const kvp_sched_request *r = st->cached[i].req;
            struct ent *e = req_ok(r) ? ent_find(s, r->req_id, r->req_id_len) : NULL;
            if (e)
                e->seen_this_step = true;
            continue;
        }
        if ((rc = phase_cached(s, &st->cached[i], consumer)) != 0)
            return rc;
    }
    /* 5. pending async loads: allocated, not scheduled this step */
    if ((rc = phase_pending_loads(s)) != 0)
        return rc;
    /* 6. boundary-state hand-offs of this step */
    if (st->n_tails && !consumer && (rc = phase_tails(s, st)) != 0)
        return rc;
    /* 7. finish-time hand-offs */
    if ((rc = phase_finished_tails(s)) != 0)
        return rc;
    /* the unfinished id set, as of the end of the build */
    for (struct ent *e = s->ahead; e; e = e->anext)
        if (e->in_ids && (rc = kvp_meta_step_add_unfinished(&s->step, e->id, e->id_len)) != 0)
            return rc;
    return 0;
}

static void step_clear(kvp_sched *s)
{
    s->step.nreqs = s->step.nunfinished = s->step.npreempted = 0;
}

int kvp_sched_build_meta(kvp_sched *s, const kvp_sched_step *st, const kvp_meta_step **meta,
                         const uint8_t **bytes, size_t *len)
{
    if (!s || !st || !meta || !bytes || !len || (st->n_new && !st->new_reqs) ||
        (st->n_cached && !st->cached) || (st->n_preempted && !st->preempted) ||
        (st->n_finished && !st->finished) || (st->n_tails && !st->tails))
        return KVP_EINVALID_PARAMS;
    step_clear(s);
    kvp_arena_reset(&s->arena);
    kvp_buf_reset(&s->bytes);
    int rc = build(s, st);
    if (rc == 0)
        rc = kvp_meta_encode_delta(&s->bytes, &s->step, s->bases, s->drops, s->ndrops);
    if (rc == 0)
        drops_clear(s); /* they are in the bytes */
    for (struct ent *e = s->ahead, *nx; e; e = nx) {
        nx = e->anext;
        e->seen_this_step = false;
        e->alloc_step = false;
        e->save_meta = 0;
        if (e->load_step && rc == 0)
            e->load_emitted = true;
        e->load_step = false;
        if (rc)
            /* metas counted as sent never left: every later send of a
             * request the mirrors may hold is a full one */
            e->sent_ngroups = e->sent_hashes = e->sent_tokens = 0;
        ent_maybe_free(s, e);
    }
    if (rc) {
        step_clear(s);
        return rc;
    }
    *meta = &s->step;
    *bytes = s->bytes.data;
    *len = s->bytes.len;
    return 0;
}

/* ------------------------------------------------------------ §8.5 */

int kvp_sched_request_finished(kvp_sched *s, const char *req_id, uint32_t id_len,
                               const kvp_meta_ids *block_ids, uint32_t ngroups, bool *delay_free)
{
    if (!s || !id_ok(req_id, id_len) || !delay_free || !ids_ok(block_ids, ngroups))
        return KVP_EINVALID_PARAMS;
    *delay_free = false;
    struct ent *e = ent_find(s, req_id, id_len);
    if (e && e->load_emitted) {
        /* a load may still be writing into the blocks: every worker
         * reports the id in finished_sending once its load job ended */
        *delay_free = true;
        return 0;
    }
    if (s->cfg.kv_role == KVP_SCHED_CONSUMER && !s->cfg.save_decode_cache)
        return 0;
    /* no tracker: aborted before it was scheduled; reset tracker: preempted */
    if (!e || !e->has_tr || (e->tr.num_saved_tokens == 0 && !e->tr.has_pending_offload))
        return 0;
    uint64_t total = 0;
    for (uint32_t g = 0; g < ngroups; g++)
        total += block_ids[g].n;
    *delay_free = total > 0; /* kept until the worker reports finished_sending */
    return 0;
}

/* ------------------------------------------------------------ §8.6 */

bool kvp_sched_reset_store(kvp_sched *s)
{
    if (!s || !s->cfg.ops.reset)
        return false;
    bool ok = false;
    int rc = s->cfg.ops.reset(s->cfg.ops.arg, &ok);
    if (rc != 0) {
        KVP_ERROR(MOD, "reset_store failed: %d", rc);
        return false;
    }
    if (ok)
        KVP_INFO(MOD, "store reset succeeded");
    else
        KVP_WARN(MOD, "store reset refused by the worker");
    return ok;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static bool holds_any(const struct ent *e, const uint32_t *sorted, size_t n)
{
    for (uint32_t g = 0; g < e->alloc_ngroups; g++)
        for (uint32_t i = 0; i < e->alloc[g].n; i++)
            if (e->alloc[g].ids[i] &&
                bsearch(&e->alloc[g].ids[i], sorted, n, sizeof *sorted, cmp_u32))
                return true;
    return false;
}

int kvp_sched_loads_failed(kvp_sched *s, const kvp_meta_str *ids, uint32_t nids,
                           const uint32_t *blocks, size_t nblocks)
{
    if (!s || (nids && !ids) || (nblocks && !blocks))
        return KVP_EINVALID_PARAMS;
    for (uint32_t i = 0; i < nids; i++) {
        struct ent *e = ent_find(s, ids[i].p, ids[i].len);
        if (e)
            e->load_failed = true;
    }
    if (nblocks == 0)
        return 0;
    uint32_t *sorted = kvp_malloc(nblocks * sizeof *sorted);
    if (!sorted)
        return KVP_ENOMEM;
    memcpy(sorted, blocks, nblocks * sizeof *sorted);
    qsort(sorted, nblocks, sizeof *sorted, cmp_u32);
    for (struct ent *e = s->uhead; e; e = e->unext)
        if (!e->load_failed && holds_any(e, sorted, nblocks))
            e->load_failed = true;
    kvp_free(sorted);
    return 0;
}

bool kvp_sched_reset_cache(kvp_sched *s)
{
    if (!s)
        return false;
    for (struct ent *e = s->ahead, *nx; e; e = nx) {
        nx = e->anext;
        e->has_ls = false;
        alloc_free(e); /* the block table of a pending async load */
        ent_maybe_free(s, e);
    }
    return kvp_sched_reset_store(s);
}

/* ---------------------------------------------------- introspection */

bool kvp_sched_load_spec(kvp_sched *s, const char *req_id, uint32_t id_len,
                         kvp_meta_load_spec *out)
{
    struct ent *e = id_ok(req_id, id_len) ? ent_find(s, req_id, id_len) : NULL;
    if (!e || !e->has_ls)
        return false;
    if (out)
        *out = e->ls;
    return true;
}

const kvp_meta_tracker *kvp_sched_tracker(kvp_sched *s, const char *req_id, uint32_t id_len)
{
    struct ent *e = id_ok(req_id, id_len) ? ent_find(s, req_id, id_len) : NULL;
    return e && e->has_tr ? &e->tr : NULL;
}

bool kvp_sched_is_unfinished(kvp_sched *s, const char *req_id, uint32_t id_len, bool *in_id_set)
{
    struct ent *e = id_ok(req_id, id_len) ? ent_find(s, req_id, id_len) : NULL;
    if (in_id_set)
        *in_id_set = e && e->in_ids;
    return e && e->in_ureq;
}
