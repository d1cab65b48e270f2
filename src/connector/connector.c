/*
 * connector.c -- the public, engine-agnostic connector API
 * (include/kvpool_connector.h), prefix kvp_conn_.
 *
 * A thin facade: it validates the engine's configuration once, translates
 * the public structs to the internal modules' (sched.h, worker.h, meta.h,
 * lookup.h, blockhash.h) and owns the glue the engine would otherwise write:
 * the lookup channel (client in the scheduler, server on worker rank 0), the
 * per-worker decoding of the step bytes, the step counter the fence sees.
 * No connector logic lives here.
 *
 * Translation cost per step is O(requests + groups) small structs (the
 * block ids, hashes and tokens themselves are passed through by pointer),
 * allocated from a per-handle arena reset every step.
 */
#include "kvpool_connector.h"

#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mem.h"
#include "connector/blockhash.h"
#include "connector/coord.h"
#include "connector/keys.h"
#include "connector/lookup.h"
#include "connector/meta.h"
#include "connector/sched.h"
#include "connector/worker.h"

/* The public id-set and stats structs are layout-compatible with the
 * worker's, so they are passed through without copying. */
_Static_assert(sizeof(kvp_conn_ids) == sizeof(kvp_worker_ids), "ids layout");
_Static_assert(offsetof(kvp_conn_ids, n) == offsetof(kvp_worker_ids, n), "ids layout");
_Static_assert(offsetof(kvp_conn_ids, cap) == offsetof(kvp_worker_ids, cap), "ids layout");
_Static_assert(sizeof(kvp_conn_op_stats) == sizeof(kvp_worker_op_stats), "stats layout");
_Static_assert(offsetof(kvp_conn_op_stats, errors) == offsetof(kvp_worker_op_stats, errors),
               "stats layout");
_Static_assert((int)KVP_CONN_OP_COUNT == (int)KVP_WORKER_OP_COUNT, "stats ops");
_Static_assert((int)KVP_CONN_OP_STORE == (int)KVP_WORKER_OP_SAVE_PUT, "stats ops");
_Static_assert((int)KVP_CONN_OP_LOAD == (int)KVP_WORKER_OP_LOAD_GET, "stats ops");
_Static_assert((int)KVP_CONN_OP_LOOKUP == (int)KVP_WORKER_OP_LOOKUP_EXISTS, "stats ops");
_Static_assert(KVP_CONN_MAX_DIMS == KVP_TDB_MAX_DIMS, "tensor dims");
_Static_assert(sizeof(((kvp_conn_event *)0)->hash) >= KVP_META_MAX_HASH_LEN, "event hash");

#define GROUPS_MAX KVP_META_MAX_GROUPS
/* Per-step scratch limits (memory is taken only as used; a step's arena
 * keeps its high-water mark for the next step). A step translates or
 * decodes O(requests + groups) small structs: 1 GiB is a bound on a
 * runaway, not a budget. */
#define SCRATCH_CAP ((size_t)1 << 30)

void kvp_conn_config_default(kvp_conn_config *c)
{
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->role = KVP_CONN_BOTH;
    c->enable_lookup = true;
    c->load_async = true;
    c->tp_size = c->pp_size = c->pcp_size = c->dcp_size = 1;
    c->recv_threads = 2;
    c->lookup_gid = -1;
    c->pool_blocks = true;
}

static int fail(char *err, size_t errlen, const char *msg)
{
    if (err && errlen)
        snprintf(err, errlen, "%s", msg);
    return KVP_EINVALID_PARAMS;
}

/* The layouts of kvp_conn_config: the first ends after engine_group_ids;
 * the second adds config_fingerprint and config_description; the third
 * save_decode_cache and tp_independent. A caller's struct_size must be one of them; fields past
 * it read as their defaults. */
#define CONFIG_V1_SIZE (offsetof(kvp_conn_config, engine_group_ids) + sizeof(const int *))
#define CONFIG_V2_SIZE (offsetof(kvp_conn_config, config_description) + sizeof(const char *))
#define CONFIG_HAS(c, f) ((c)->struct_size >= offsetof(kvp_conn_config, f) + sizeof((c)->f))

/* c's save_decode_cache, false when its layout has none. */
static bool config_save_decode(const kvp_conn_config *c)
{
    return CONFIG_HAS(c, save_decode_cache) && c->save_decode_cache;
}

/* c's fingerprint and description, NULL when its layout has none. */
static const char *config_fp(const kvp_conn_config *c)
{
    return CONFIG_HAS(c, config_fingerprint) ? c->config_fingerprint : NULL;
}

static const char *config_desc(const kvp_conn_config *c)
{
    return CONFIG_HAS(c, config_description) ? c->config_description : NULL;
}

static int config_size_ok(const kvp_conn_config *c, char *err, size_t errlen)
{
    if (c->struct_size != sizeof *c && c->struct_size != CONFIG_V1_SIZE &&
        c->struct_size != CONFIG_V2_SIZE)
        return fail(err, errlen,
                    "config struct_size must be sizeof(kvp_conn_config) "
                    "(fill it with kvp_conn_config_default)");
    if (c->lookup_gid < -1 || c->lookup_gid >= (int64_t)UINT32_MAX)
        return fail(err, errlen, "lookup_gid must be -1 (none) or a group id");
    const char *fp = config_fp(c), *desc = config_desc(c);
    if (fp && *fp && !kvp_key_fingerprint_valid(fp))
        return fail(err, errlen, "config_fingerprint must be 12..32 lower-case hex digits");
    if (desc && *desc && (!fp || !*fp))
        return fail(err, errlen, "config_description needs config_fingerprint");
    if (desc && strnlen(desc, KVP_CONN_DESCRIPTION_MAX + 1) > KVP_CONN_DESCRIPTION_MAX)
        return fail(err, errlen, "config_description is longer than KVP_CONN_DESCRIPTION_MAX");
    return 0;
}

static bool reserved_zero(const uint64_t *r, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (r[i])
            return false;
    return true;
}

/* The internal group specs of the config; *L / *H resolved. */
static int groups_of(const kvp_conn_config *c, kvp_worker_group *wg, uint32_t *L, uint32_t *H,
                     char *err, size_t errlen)
{
    if (!c->groups || c->ngroups == 0 || c->ngroups > GROUPS_MAX)
        return fail(err, errlen, "ngroups must be 1..64");
    struct kvp_coord_group cg[GROUPS_MAX];
    for (size_t i = 0; i < c->ngroups; i++) {
        const kvp_conn_group *g = &c->groups[i];
        if (!reserved_zero(g->reserved, 2))
            return fail(err, errlen, "kvp_conn_group.reserved must be zero");
        memset(&wg[i], 0, sizeof wg[i]);
        switch (g->kind) {
        case KVP_CONN_FULL_ATTENTION:
            wg[i].spec.kind = KVP_COORD_FULL;
            wg[i].key_spec = g->mla ? KVP_KEY_SPEC_MLA : KVP_KEY_SPEC_ATTENTION;
            break;
        case KVP_CONN_SLIDING_WINDOW:
            if (g->sliding_window == 0)
                return fail(err, errlen, "a sliding-window group needs sliding_window > 0");
            wg[i].spec.kind = KVP_COORD_SWA;
            wg[i].spec.window = g->sliding_window;
            wg[i].key_spec = g->mla ? KVP_KEY_SPEC_SWA_MLA : KVP_KEY_SPEC_ATTENTION;
            break;
        case KVP_CONN_MAMBA:
            wg[i].spec.kind = KVP_COORD_MAMBA;
            wg[i].key_spec = KVP_KEY_SPEC_MAMBA;
            break;
        default:
            return fail(err, errlen, "unknown group kind");
        }
        if (g->block_size == 0)
            return fail(err, errlen, "a group needs block_size > 0");
        wg[i].spec.block_size = g->block_size;
        wg[i].spec.is_eagle = g->is_eagle;
        /* groups differing in MLA-ness never share an attention manager */
        wg[i].spec.spec_tag = g->mla ? 1u : 0u;
        wg[i].num_kv_heads = g->num_kv_heads ? (int)g->num_kv_heads : (c->tp_size > 0 ? c->tp_size : 1);
        cg[i] = wg[i].spec;
    }
    uint32_t l = 0, h = 0;
    if (kvp_coord_resolve_block_sizes(cg, c->ngroups, c->hash_block_size, &l, &h) != 0)
        return fail(err, errlen, "hash_block_size must divide every group block size");
    if (c->block_size) {
        if (c->block_size % l != 0)
            return fail(err, errlen, "block_size must be a multiple of every group block size");
        l = c->block_size;
    }
    *L = l;
    *H = h;
    return 0;
}

/*
 * The store configuration's "log_level" (common/log.h: an explicit key sets
 * the process level unless $KVPOOL_LOG_LEVEL is set), applied first thing
 * in both open paths so their own lines already obey it. The worker's
 * kvp_client_open applies it again and reports a bad configuration; the
 * scheduler uses nothing else from it, so there a configuration that does
 * not load is one WARN line, not a failure.
 */
static void store_log_level(const char *store_config, int warn)
{
    if (!store_config || !*store_config)
        return;
    kvp_config *sc = kvp_malloc(sizeof *sc);
    char err[KVP_CONFIG_ERRLEN];
    if (!sc)
        return;
    kvp_config_defaults(sc);
    if (kvp_config_load_spec(sc, store_config, err, sizeof err) == 0)
        kvp_config_apply_log_level(sc);
    else if (warn) /* not err itself: it may quote a value, e.g. a token */
        KVP_WARN("connector",
                 "store_config does not load (the worker half reports why); the scheduler "
                 "reads only its log_level");
    kvp_free(sc);
}

static int ranks_ok(int size, int rank) { return size >= 1 && rank >= 0 && rank < size; }

/* ================================================================ scheduler */

struct kvp_conn_sched {
    kvp_sched *s;
    kvp_lookup_client *lk;
    uint64_t mamba; /* bit g: group g is a Mamba ("align") group */
    uint32_t ngroups;
    kvp_arena arena; /* per-call translation scratch */
};

int kvp_conn_sched_open(const kvp_conn_config *c, kvp_conn_sched **out, char *err, size_t errlen)
{
    *out = NULL;
    if (!c)
        return fail(err, errlen, "no config");
    if (config_size_ok(c, err, errlen))
        return KVP_EINVALID_PARAMS;
    store_log_level(c->store_config, 1);
    if (c->role < KVP_CONN_PRODUCER || c->role > KVP_CONN_BOTH)
        return fail(err, errlen, "unknown role");
    kvp_worker_group wg[GROUPS_MAX];
    uint32_t L, H;
    int rc = groups_of(c, wg, &L, &H, err, errlen);
    if (rc != 0)
        return rc;
    if (c->enable_lookup && (!c->lookup_socket || !*c->lookup_socket))
        return fail(err, errlen, "enable_lookup needs lookup_socket");
    if (!c->load_async)
        return fail(err, errlen, "load_async must be true: loads run in the background only");
    kvp_conn_sched *x = kvp_calloc(1, sizeof *x);
    if (!x)
        return KVP_ENOMEM;
    kvp_arena_init(&x->arena, SCRATCH_CAP);
    x->ngroups = (uint32_t)c->ngroups;
    for (size_t g = 0; g < c->ngroups; g++)
        if (c->groups[g].kind == KVP_CONN_MAMBA)
            x->mamba |= (uint64_t)1 << g;
    kvp_sched_config sc;
    kvp_sched_config_default(&sc);
    sc.kv_role = c->role; /* same numbering as enum kvp_sched_role */
    sc.load_async = c->load_async;
    sc.lookup_async = c->lookup_async;
    sc.enable_lookup = c->enable_lookup;
    sc.block_size = L;
    sc.hash_block_size = H;
    sc.enable_partial_hash_hits = c->partial_hash_hits;
    sc.save_decode_cache = config_save_decode(c);
    if (c->enable_lookup) {
        rc = kvp_lookup_client_open(c->lookup_socket, c->lookup_timeout_ms, &x->lk);
        if (rc != 0) {
            fail(err, errlen, "cannot open the lookup channel");
            goto bad;
        }
        if (c->lookup_gid >= 0)
            kvp_lookup_client_set_group(x->lk, (gid_t)c->lookup_gid);
        kvp_sched_ops_client(x->lk, &sc.ops);
    }
    rc = kvp_sched_new(&sc, &x->s);
    if (rc != 0) {
        fail(err, errlen, "invalid scheduler configuration");
        goto bad;
    }
    *out = x;
    return 0;
bad:
    kvp_conn_sched_close(x);
    return rc;
}

void kvp_conn_sched_close(kvp_conn_sched *s)
{
    if (!s)
        return;
    kvp_sched_free(s->s);
    kvp_lookup_client_close(s->lk);
    kvp_arena_free(&s->arena);
    kvp_free(s);
}

static void req_of(const kvp_conn_request *r, kvp_sched_request *o)
{
    *o = (kvp_sched_request){
        .req_id = r->id.p, .req_id_len = r->id.len,
        .all_token_ids = r->tokens, .num_tokens = r->num_tokens,
        .prompt_token_ids = r->prompt_tokens, .num_prompt_tokens = r->num_prompt_tokens,
        .num_computed_tokens = r->num_computed_tokens,
        .block_hashes = r->block_hashes, .nhashes = r->nhashes, .hash_len = r->hash_len,
    };
}

/* A view of public block tables as internal ones (ids are never written
 * through a view: cap 0). NULL with n == 0. */
static kvp_meta_ids *ids_of(kvp_arena *a, const kvp_conn_blocks *b, uint32_t n, int *rc)
{
    if (n == 0 || !b)
        return NULL;
    if (n > GROUPS_MAX) {
        *rc = KVP_EINVALID_PARAMS;
        return NULL;
    }
    kvp_meta_ids *v = kvp_arena_alloc(a, n * sizeof *v);
    if (!v) {
        *rc = KVP_ENOMEM;
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++)
        v[i] = (kvp_meta_ids){.ids = (uint32_t *)b[i].ids, .n = b[i].n, .cap = 0};
    return v;
}

int kvp_conn_get_num_new_matched_tokens(kvp_conn_sched *s, const kvp_conn_request *r,
                                        uint64_t num_computed_tokens, uint64_t *num_new,
                                        bool *load_async)
{
    kvp_sched_request sr;
    req_of(r, &sr);
    int rc = kvp_sched_get_num_new_matched_tokens(s->s, &sr, num_computed_tokens, num_new,
                                                  load_async);
    return rc == KVP_LOOKUP_PENDING ? KVP_CONN_PENDING : rc;
}

int kvp_conn_update_state_after_alloc(kvp_conn_sched *s, const kvp_conn_request *r,
                                      const kvp_conn_blocks *blocks, uint32_t ngroups,
                                      uint64_t num_external_tokens)
{
    kvp_arena_reset(&s->arena);
    int rc = 0;
    kvp_meta_ids *v = ids_of(&s->arena, blocks, ngroups, &rc);
    if (rc != 0)
        return rc;
    kvp_sched_request sr;
    req_of(r, &sr);
    return kvp_sched_update_state_after_alloc(s->s, &sr, v, v ? ngroups : 0, num_external_tokens);
}

int kvp_conn_build_meta(kvp_conn_sched *s, const kvp_conn_step *st, const uint8_t **bytes,
                        size_t *len)
{
    kvp_arena *a = &s->arena;
    kvp_arena_reset(a);
    int rc = 0;
    uint32_t nreq = st->n_new + st->n_cached;
    kvp_sched_request *rq = nreq ? kvp_arena_alloc(a, nreq * sizeof *rq) : NULL;
    kvp_sched_new_req *nr = st->n_new ? kvp_arena_alloc(a, st->n_new * sizeof *nr) : NULL;
    kvp_sched_cached_req *cr = st->n_cached ? kvp_arena_alloc(a, st->n_cached * sizeof *cr) : NULL;
    kvp_sched_tail_req *tr = st->n_tails ? kvp_arena_alloc(a, st->n_tails * sizeof *tr) : NULL;
    if ((nreq && !rq) || (st->n_new && !nr) || (st->n_cached && !cr) || (st->n_tails && !tr))
        return KVP_ENOMEM;
    for (uint32_t i = 0; i < st->n_new; i++) {
        const kvp_conn_new_req *p = &st->new_reqs[i];
        if (!p->req)
            return KVP_EINVALID_PARAMS;
        req_of(p->req, &rq[i]);
        kvp_meta_ids *v = ids_of(a, p->blocks, p->ngroups, &rc);
        if (rc != 0)
            return rc;
        nr[i] = (kvp_sched_new_req){.req = &rq[i], .num_scheduled_tokens = p->num_scheduled_tokens,
                                    .block_ids = v, .ngroups = v ? p->ngroups : 0};
    }
    for (uint32_t i = 0; i < st->n_cached; i++) {
        const kvp_conn_cached_req *p = &st->cached[i];
        if (!p->req)
            return KVP_EINVALID_PARAMS;
        kvp_sched_request *q = &rq[st->n_new + i];
        req_of(p->req, q);
        kvp_meta_ids *v = ids_of(a, p->blocks, p->ngroups, &rc);
        if (rc != 0)
            return rc;
        cr[i] = (kvp_sched_cached_req){.req = q, .resumed = p->resumed,
                                       .num_scheduled_tokens = p->num_scheduled_tokens,
                                       .new_block_ids = v, .ngroups = v ? p->ngroups : 0};
    }
    _Static_assert(sizeof(kvp_conn_tail) == sizeof(kvp_meta_tail), "tail layout");
    _Static_assert(offsetof(kvp_conn_tail, boundary_tokens) ==
                       offsetof(kvp_meta_tail, boundary_tokens), "tail layout");
    _Static_assert(sizeof(kvp_conn_str) == sizeof(kvp_meta_str), "str layout");
    _Static_assert(offsetof(kvp_conn_str, len) == offsetof(kvp_meta_str, len), "str layout");
    /* boundary states are Mamba groups' only: another group's entry is dropped */
    for (uint32_t i = 0; i < st->n_tails; i++) {
        const kvp_conn_tail_req *t = &st->tails[i];
        if (t->ntails && !t->tails)
            return KVP_EINVALID_PARAMS;
        kvp_meta_tail *kept = t->ntails ? kvp_arena_alloc(a, t->ntails * sizeof *kept) : NULL;
        if (t->ntails && !kept)
            return KVP_ENOMEM;
        uint32_t n = 0;
        for (uint32_t k = 0; k < t->ntails; k++)
            if (t->tails[k].group < s->ngroups && (s->mamba >> t->tails[k].group & 1))
                kept[n++] = (kvp_meta_tail){.group_id = t->tails[k].group,
                                            .cow_block_id = t->tails[k].cow_block_id,
                                            .boundary_tokens = t->tails[k].boundary_tokens};
        tr[i] = (kvp_sched_tail_req){.req_id = t->id.p, .req_id_len = t->id.len,
                                     .tails = kept, .ntails = n};
    }
    kvp_sched_step ss = {
        .new_reqs = nr, .n_new = st->n_new, .cached = cr, .n_cached = st->n_cached,
        .preempted = (const kvp_meta_str *)st->preempted, .n_preempted = st->n_preempted,
        .finished = (const kvp_meta_str *)st->finished, .n_finished = st->n_finished,
        .tails = tr, .n_tails = st->n_tails,
    };
    const kvp_meta_step *m;
    return kvp_sched_build_meta(s->s, &ss, &m, bytes, len);
}

int kvp_conn_request_finished(kvp_conn_sched *s, kvp_conn_str id, const kvp_conn_blocks *blocks,
                              uint32_t ngroups, bool *delay_free)
{
    kvp_arena_reset(&s->arena);
    int rc = 0;
    kvp_meta_ids *v = ids_of(&s->arena, blocks, ngroups, &rc);
    if (rc != 0)
        return rc;
    return kvp_sched_request_finished(s->s, id.p, id.len, v, v ? ngroups : 0, delay_free);
}

int kvp_conn_register_finished_tail(kvp_conn_sched *s, kvp_conn_str id,
                                    const kvp_conn_blocks *blocks, uint32_t ngroups,
                                    const kvp_conn_tail *tails, uint32_t ntails, bool *queued)
{
    if (!s || !queued || (ntails && !tails))
        return KVP_EINVALID_PARAMS;
    *queued = false;
    kvp_arena_reset(&s->arena);
    int rc = 0;
    kvp_meta_ids *v = ids_of(&s->arena, blocks, ngroups, &rc);
    if (rc != 0)
        return rc;
    kvp_meta_tail *t = ntails ? kvp_arena_alloc(&s->arena, ntails * sizeof *t) : NULL;
    if (ntails && !t)
        return KVP_ENOMEM;
    for (uint32_t k = 0; k < ntails; k++) {
        if (tails[k].group >= s->ngroups || !(s->mamba >> tails[k].group & 1))
            return 0; /* only Mamba groups hand off boundary states: refused */
        t[k] = (kvp_meta_tail){.group_id = tails[k].group, .cow_block_id = tails[k].cow_block_id,
                               .boundary_tokens = tails[k].boundary_tokens};
    }
    return kvp_sched_register_finished_tail(s->s, id.p, id.len, v, v ? ngroups : 0, t, ntails,
                                            queued);
}

int kvp_conn_loads_failed(kvp_conn_sched *s, const kvp_conn_str *ids, uint32_t nids,
                          const uint32_t *blocks, size_t nblocks)
{
    return s ? kvp_sched_loads_failed(s->s, (const kvp_meta_str *)ids, nids, blocks, nblocks)
             : KVP_EINVALID_PARAMS;
}

bool kvp_conn_reset_cache(kvp_conn_sched *s) { return kvp_sched_reset_cache(s->s); }

/* ================================================================== worker */

struct kvp_conn_worker {
    kvp_worker *w;
    kvp_lookup_server *srv; /* rank 0 only */
    kvp_meta_mirror *mirror;
    kvp_arena arena;        /* the decoded step */
};

static int lk_lookup(void *arg, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                     size_t hash_len, int apply_eagle, uint32_t *hit)
{
    return kvp_worker_lookup(arg, num_tokens, hashes, nhashes, hash_len, apply_eagle, hit);
}

static int lk_reset(void *arg) { return kvp_worker_reset(arg) >= 0 ? 0 : -1; }

int kvp_conn_worker_open(const kvp_conn_config *c, kvp_conn_worker **out, char *err,
                         size_t errlen)
{
    *out = NULL;
    if (!c)
        return fail(err, errlen, "no config");
    if (config_size_ok(c, err, errlen))
        return KVP_EINVALID_PARAMS;
    if (!ranks_ok(c->tp_size, c->tp_rank) || !ranks_ok(c->pp_size, c->pp_rank) ||
        !ranks_ok(c->pcp_size, c->pcp_rank) || !ranks_ok(c->dcp_size, c->dcp_rank))
        return fail(err, errlen, "every rank must satisfy 0 <= rank < size");
    if (!c->model || !*c->model)
        return fail(err, errlen, "model is required");
    if (!c->store_config || !*c->store_config)
        return fail(err, errlen, "store_config is required");
    store_log_level(c->store_config, 0);
    if (c->num_blocks == 0)
        return fail(err, errlen, "num_blocks must be > 0");
    static const enum kvp_worker_role roles[] = {
        [KVP_CONN_PRODUCER] = KVP_WORKER_PRODUCER,
        [KVP_CONN_CONSUMER] = KVP_WORKER_CONSUMER,
        [KVP_CONN_BOTH] = KVP_WORKER_BOTH,
    };
    if (c->role < KVP_CONN_PRODUCER || c->role > KVP_CONN_BOTH)
        return fail(err, errlen, "unknown role");
    kvp_worker_group wg[GROUPS_MAX];
    uint32_t L, H;
    int rc = groups_of(c, wg, &L, &H, err, errlen);
    if (rc != 0)
        return rc;
    bool rank0 = c->tp_rank == 0 && c->pp_rank == 0 && c->pcp_rank == 0 && c->dcp_rank == 0;
    if (c->enable_lookup && rank0 && (!c->lookup_socket || !*c->lookup_socket))
        return fail(err, errlen, "enable_lookup needs lookup_socket on rank 0");
    kvp_conn_worker *x = kvp_calloc(1, sizeof *x);
    if (!x)
        return KVP_ENOMEM;
    kvp_arena_init(&x->arena, SCRATCH_CAP);
    kvp_worker_cfg wc = {
        .store_config = c->store_config, .model_path = c->model, .cache_prefix = c->cache_prefix,
        .tp_rank = c->tp_rank, .tp_size = c->tp_size, .pcp_rank = c->pcp_rank,
        .pcp_size = c->pcp_size, .dcp_rank = c->dcp_rank, .dcp_size = c->dcp_size,
        .pp_rank = c->pp_rank, .pp_size = c->pp_size, .role = roles[c->role],
        .enable_lookup = c->enable_lookup, .groups = wg, .ngroups = c->ngroups,
        .hash_block_size = H, .use_eagle = c->use_eagle, .retention_interval = -1,
        .num_gpu_blocks = c->num_blocks, .num_recv_threads = c->recv_threads ? c->recv_threads : 2,
        .staging_budget = c->staging_budget, .enable_kv_events = c->kv_events,
        .pool_blocks = c->pool_blocks, .engine_group_ids = c->engine_group_ids,
        .fence = c->fence, .fence_arg = c->fence_arg,
        .config_fingerprint = config_fp(c), .config_description = config_desc(c),
        .save_decode_cache = config_save_decode(c),
        .tp_independent = CONFIG_HAS(c, tp_independent) && c->tp_independent,
    };
    rc = kvp_worker_create(&wc, &x->w, err, errlen);
    if (rc != 0)
        goto bad;
    x->mirror = kvp_meta_mirror_new();
    if (!x->mirror) {
        rc = KVP_ENOMEM;
        goto bad;
    }
    if (c->enable_lookup && rank0 && !kvp_worker_capacity_only(x->w)) {
        kvp_lookup_handler h = {.lookup = lk_lookup, .reset = lk_reset, .arg = x->w};
        kvp_lookup_server_opts lo = {.use_group = c->lookup_gid >= 0,
                                     .gid = c->lookup_gid >= 0 ? (gid_t)c->lookup_gid : 0};
        rc = kvp_lookup_server_start_opts(c->lookup_socket, &h, &lo, &x->srv);
        if (rc != 0) {
            if (err && errlen && strlen(c->lookup_socket) >= KVP_LOOKUP_PATH_MAX)
                snprintf(err, errlen,
                         "cannot serve the lookup channel on %s: the path is %zu bytes, a unix "
                         "socket's can have at most %d; set VLLM_RPC_BASE_PATH to a shorter "
                         "directory",
                         c->lookup_socket, strlen(c->lookup_socket), KVP_LOOKUP_PATH_MAX - 1);
            else if (err && errlen)
                snprintf(err, errlen, "cannot serve the lookup channel on %s: %s",
                         c->lookup_socket, kvp_err_name(rc));
            goto bad;
        }
    }
    *out = x;
    return 0;
bad:
    kvp_conn_worker_close(x);
    return rc;
}

void kvp_conn_worker_close(kvp_conn_worker *w)
{
    if (!w)
        return;
    kvp_lookup_server_stop(w->srv); /* no lookup may reach a closing worker */
    kvp_worker_destroy(w->w);
    kvp_meta_mirror_free(w->mirror);
    kvp_arena_free(&w->arena);
    kvp_free(w);
}

int kvp_conn_register_kv_caches(kvp_conn_worker *w, const kvp_conn_tensor *t, size_t n)
{
    if (!t || n == 0)
        return KVP_EINVALID_PARAMS;
    kvp_tdb_tensor *tt = kvp_calloc(n, sizeof *tt);
    if (!tt)
        return KVP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        if (!reserved_zero(t[i].reserved, 2) || t[i].ndim < 1 || t[i].ndim > KVP_CONN_MAX_DIMS) {
            kvp_free(tt);
            return KVP_EINVALID_PARAMS;
        }
        tt[i].base = t[i].base;
        tt[i].storage_len = t[i].storage_len;
        tt[i].elem_size = t[i].elem_size;
        tt[i].ndim = t[i].ndim;
        memcpy(tt[i].shape, t[i].shape, sizeof tt[i].shape);
        memcpy(tt[i].stride, t[i].stride, sizeof tt[i].stride);
    }
    int rc = kvp_worker_register_kv_caches(w->w, tt, n);
    kvp_free(tt);
    return rc;
}

int kvp_conn_handle_preemptions(kvp_conn_worker *w, const char *const *ids, size_t n)
{
    return kvp_worker_handle_preemptions(w->w, ids, n);
}

int kvp_conn_get_finished(kvp_conn_worker *w, const uint8_t *bytes, size_t len,
                          const char *const *finished, size_t nfinished,
                          kvp_conn_ids *done_sending, kvp_conn_ids *done_recving)
{
    kvp_meta_step st, *stp = NULL;
    kvp_arena_reset(&w->arena);
    if (bytes) {
        int rc = kvp_meta_decode_delta(w->mirror, bytes, len, &w->arena, &st);
        if (rc != 0)
            return rc;
        stp = &st;
    }
    return kvp_worker_get_finished(w->w, finished, nfinished, stp,
                                   (kvp_worker_ids *)done_sending,
                                   (kvp_worker_ids *)done_recving);
}

uint64_t kvp_conn_worker_step(kvp_conn_worker *w) { return kvp_worker_next_step(w->w); }

void kvp_conn_ids_free(kvp_conn_ids *s) { kvp_worker_ids_free((kvp_worker_ids *)s); }

int kvp_conn_load_errors(kvp_conn_worker *w, uint32_t **ids, size_t *n)
{
    return kvp_worker_load_errors(w->w, ids, n);
}

int kvp_conn_load_failed(kvp_conn_worker *w, kvp_conn_ids *out)
{
    return w && out ? kvp_worker_load_failed(w->w, (kvp_worker_ids *)out) : KVP_EINVALID_PARAMS;
}

void kvp_conn_free(void *p) { kvp_free(p); }

void kvp_conn_worker_drain(kvp_conn_worker *w) { kvp_worker_drain(w->w); }

int kvp_conn_take_stats(kvp_conn_worker *w, kvp_conn_stats *out)
{
    kvp_worker_stats ws;
    int r = kvp_worker_take_stats(w->w, &ws);
    memcpy(out->op, ws.op, sizeof out->op);
    return r;
}

void kvp_conn_pool_status_init(kvp_conn_pool_status *s)
{
    memset(s, 0, sizeof *s);
    s->struct_size = sizeof *s;
}

int kvp_conn_pool_status_get(kvp_conn_worker *w, kvp_conn_pool_status *out)
{
    if (!w || !out || out->struct_size != sizeof *out)
        return KVP_EINVALID_PARAMS;
    kvp_plink_status ps;
    kvp_worker_pool_status(w->w, &ps);
    out->available = ps.available != 0;
    out->attached = ps.attached != 0;
    out->unavailable_ms = ps.unavailable_ms;
    out->outages = ps.outages;
    out->skipped_stores = ps.skipped_stores;
    out->skipped_lookups = ps.skipped_lookups;
    out->failed_loads = ps.failed_loads;
    return 0;
}

int kvp_conn_take_events(kvp_conn_worker *w, kvp_conn_event **ev, size_t *n)
{
    kvp_worker_event *we = NULL;
    size_t wn = 0;
    *ev = NULL;
    *n = 0;
    int rc = kvp_worker_take_events(w->w, &we, &wn);
    if (rc != 0 || wn == 0)
        return rc;
    kvp_conn_event *e = kvp_calloc(wn, sizeof *e);
    if (!e) {
        kvp_worker_events_free(we, wn);
        return KVP_ENOMEM;
    }
    for (size_t i = 0; i < wn; i++) {
        e[i].group = we[i].group;
        e[i].block_size = we[i].block_size;
        e[i].hash_len = we[i].hash_len;
        memcpy(e[i].hash, we[i].hash, we[i].hash_len);
        e[i].has_parent = we[i].has_parent != 0;
        if (e[i].has_parent)
            memcpy(e[i].parent, we[i].parent, we[i].hash_len);
        e[i].start = we[i].start;
        e[i].end = we[i].end;
        e[i].token_ids = we[i].token_ids; /* ownership moves */
        e[i].n_token_ids = we[i].n_token_ids;
        we[i].token_ids = NULL;
        we[i].n_token_ids = 0;
    }
    kvp_worker_events_free(we, wn);
    *ev = e;
    *n = wn;
    return 0;
}

void kvp_conn_events_free(kvp_conn_event *ev, size_t n)
{
    for (size_t i = 0; ev && i < n; i++)
        kvp_free(ev[i].token_ids);
    kvp_free(ev);
}

/* ============================================================= block hashes */

struct kvp_conn_hasher {
    struct kvp_bh_chain ch;
    size_t hash_len;
    int64_t *tmp; /* widened tokens of one append */
    size_t tmp_cap;
    struct kvp_bh_hash *outs;
    size_t outs_cap;
};

int kvp_conn_hasher_new(const char *algo, const char *seed, uint32_t block_size,
                        kvp_conn_hasher **out)
{
    *out = NULL;
    enum kvp_bh_algo a;
    if (!algo || kvp_bh_algo_parse(algo, &a) != 0 || block_size == 0)
        return KVP_EINVALID_PARAMS;
    struct kvp_bh_hash none;
    int rc = kvp_bh_none_hash(a, seed, &none);
    if (rc != 0)
        return rc;
    kvp_conn_hasher *h = kvp_calloc(1, sizeof *h);
    if (!h)
        return KVP_ENOMEM;
    rc = kvp_bh_chain_init(&h->ch, a, &none, block_size, NULL, NULL);
    if (rc != 0) {
        kvp_free(h);
        return rc;
    }
    h->hash_len = kvp_bh_hash_len(a);
    *out = h;
    return 0;
}

int kvp_conn_hasher_append(kvp_conn_hasher *h, const uint32_t *tokens, size_t n, uint8_t *out,
                           size_t out_cap, size_t *nout)
{
    *nout = 0;
    if (n == 0)
        return 0;
    if (!tokens)
        return KVP_EINVALID_PARAMS;
    size_t need = (h->ch.npending + n) / h->ch.block_size;
    if (need > out_cap) {
        *nout = need;
        return KVP_EBUFFER_OVERFLOW;
    }
    if (n > h->tmp_cap) {
        int64_t *t = kvp_realloc(h->tmp, n * sizeof *t);
        if (!t)
            return KVP_ENOMEM;
        h->tmp = t;
        h->tmp_cap = n;
    }
    if (need > h->outs_cap) {
        struct kvp_bh_hash *o = kvp_realloc(h->outs, need * sizeof *o);
        if (!o)
            return KVP_ENOMEM;
        h->outs = o;
        h->outs_cap = need;
    }
    for (size_t i = 0; i < n; i++)
        h->tmp[i] = (int64_t)tokens[i];
    size_t got = 0;
    int rc = kvp_bh_chain_append(&h->ch, h->tmp, n, h->outs, need, &got);
    if (rc != 0)
        return rc;
    for (size_t i = 0; i < got; i++)
        memcpy(out + i * h->hash_len, h->outs[i].b, h->hash_len);
    *nout = got;
    return 0;
}

size_t kvp_conn_hasher_hash_len(const kvp_conn_hasher *h) { return h->hash_len; }

void kvp_conn_hasher_free(kvp_conn_hasher *h)
{
    if (!h)
        return;
    kvp_bh_chain_destroy(&h->ch);
    kvp_free(h->tmp);
    kvp_free(h->outs);
    kvp_free(h);
}
