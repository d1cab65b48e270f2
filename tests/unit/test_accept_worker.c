/* test_accept_worker.c -- the worker items of the connector acceptance list
 * (spec §18, docs/ACCEPTANCE.md) that test_worker.c does not assert, against
 * a real kvpool master and storage node: save_put metrics with the spec's
 * numbers (2 keys, 512 bytes), stats reset after read, lookup metrics,
 * load_get partial-failure metrics and read leases given back, the staging
 * size of a 256-byte key (12288) and the ratio-scaled split, reset draining
 * the send queue before remove_all (with and without a send thread),
 * destroy draining queued jobs and surviving a dead store, and lookups:
 * one exist batch for a re-derived full hit, only reachable SWA chunks
 * probed, every rank's Mamba shard needed.
 *
 * Engine memory: 2 layers, K/V planes, 32 blocks of 16 tokens, 4 bytes per
 * token per plane, so one chunk (key) is 4 pieces of 64 = 256 bytes, the
 * size the spec's metric examples use. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/mem.h"
#include "connector/keys.h"
#include "connector/worker.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define NB 32      /* blocks per layer */
#define BS 16      /* tokens per block */
#define DIM 4      /* bytes per token per plane */
#define LAYERS 2
#define PLANE (NB * BS * DIM)
#define LAYER_BYTES (2 * PLANE)
#define HL 32      /* hash length */
#define KEY_BYTES (LAYERS * 2 * BS * DIM) /* 256 */
#define STAGING_KEY 12288u /* align_up(256, 4096) + 8192 */
#define MODEL "org/accept-model"

/* ------------------------------------------------------------ environment */

typedef struct env {
    tp_master m;
    tp_store st;
    char cfg[256];
} env;

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    setenv("KVPOOL_FORCE_TCP", "1", 1);
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    if (tp_store_start(&e->st, e->m.addr,
                       (const char *const[]){"--segment-size", "32MiB", NULL}) != 0)
        return -1;
    snprintf(e->cfg, sizeof e->cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"2s\"}",
             e->m.addr);
    return 0;
}

static void env_down(env *e)
{
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
}

#define ENV_UP(e)                                                                                 \
    do {                                                                                          \
        if (env_up(e) != 0) {                                                                     \
            env_down(e);                                                                          \
            th_fail(__FILE__, __LINE__, "env_up");                                                \
            return;                                                                               \
        }                                                                                         \
    } while (0)

/* ------------------------------------------------------------ engine memory */

typedef struct cache {
    uint8_t *layer[LAYERS];
} cache;

static void cache_init(cache *c)
{
    for (int l = 0; l < LAYERS; l++)
        c->layer[l] = calloc(1, LAYER_BYTES);
}

static void cache_free(cache *c)
{
    for (int l = 0; l < LAYERS; l++)
        free(c->layer[l]);
}

static uint8_t val(uint32_t s, uint64_t pos, int l, int p, int d)
{
    uint64_t x = (pos + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)s << 40) ^
                 ((uint64_t)l << 20) ^ ((uint64_t)p << 12) ^ (uint64_t)d;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x | 1); /* never 0: zero means "never written" */
}

static uint8_t *slot(cache *c, int l, int p, uint32_t bid, int t)
{
    return c->layer[l] + (size_t)p * PLANE + ((size_t)bid * BS + (size_t)t) * DIM;
}

/* Writes chunk k of data seed s into block bids[k]. */
static void fill(cache *c, uint32_t s, const uint32_t *bids, int n)
{
    for (int k = 0; k < n; k++)
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < 2; p++)
                for (int t = 0; t < BS; t++)
                    for (int d = 0; d < DIM; d++)
                        slot(c, l, p, bids[k], t)[d] = val(s, (uint64_t)k * BS + t, l, p, d);
}

/* 1 = block holds chunk k of seed s, 0 = all zero, -1 = anything else. */
static int block_state(cache *c, uint32_t s, uint32_t bid, int k)
{
    int good = 1, zero = 1;
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < BS; t++)
                for (int d = 0; d < DIM; d++) {
                    uint8_t v = slot(c, l, p, bid, t)[d];
                    good &= v == val(s, (uint64_t)k * BS + t, l, p, d);
                    zero &= v == 0;
                }
    return good ? 1 : zero ? 0 : -1;
}

static void hashes(uint8_t *h, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < HL; k++)
            h[i * HL + k] = (uint8_t)(seed * 131 + (uint32_t)i * 31 + (uint32_t)k * 7 + 3);
}

/* The key of chunk k of hashes h (TP 1, one group, no prefix). */
static int key_of(const uint8_t *h, int k, char *key, size_t cap)
{
    struct kvp_key_meta md;
    size_t len;
    REQUIRE(kvp_key_meta_init(&md, MODEL, NULL, 0, 0, 0, 0, 0) == 0);
    REQUIRE(kvp_key_build(&md, h + (size_t)k * HL, HL, key, cap, &len) == 0);
    return 0;
}

/* ------------------------------------------------------------ fence gate */

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed, gate_waiting;

static int fence_fn(void *arg, uint64_t st)
{
    (void)arg;
    (void)st;
    pthread_mutex_lock(&gate_mu);
    gate_waiting = 1;
    while (gate_closed)
        pthread_cond_wait(&gate_cv, &gate_mu);
    gate_waiting = 0;
    pthread_mutex_unlock(&gate_mu);
    return 0;
}

static void gate_set(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* Waits (bounded) until the send thread sits in the fence. */
static int gate_wait_entered(void)
{
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&gate_mu);
        int w = gate_waiting;
        pthread_mutex_unlock(&gate_mu);
        if (w)
            return 1;
        tp_sleep_ms(2);
    }
    return 0;
}

/* ------------------------------------------------------------ workers */

typedef struct wopts {
    enum kvp_worker_role role; /* 0 = BOTH */
    uint64_t staging;
    const kvp_worker_group *groups; /* NULL = one FA group of BS, 8 heads */
    size_t ngroups;
    uint32_t hbs;
    int tp_rank, tp_size;
} wopts;

static kvp_worker *worker_open(const env *e, cache *c, const wopts *o)
{
    kvp_worker_group g = {.spec = {.kind = KVP_COORD_FULL, .block_size = BS},
                          .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 8};
    kvp_worker_cfg cfg = {
        .store_config = e->cfg, .model_path = MODEL,
        .tp_rank = o ? o->tp_rank : 0, .tp_size = o && o->tp_size ? o->tp_size : 1,
        .pcp_size = 1, .dcp_size = 1, .pp_size = 1,
        .role = o && o->role ? o->role : KVP_WORKER_BOTH,
        .enable_lookup = 1, .groups = &g, .ngroups = 1,
        .retention_interval = -1,
        .num_gpu_blocks = NB, .num_recv_threads = 1,
        .staging_budget = o ? o->staging : 0, .enable_kv_events = 1, .fence = fence_fn,
    };
    if (o && o->groups) {
        cfg.groups = o->groups;
        cfg.ngroups = o->ngroups;
        cfg.hash_block_size = o->hbs;
    }
    kvp_worker *w = NULL;
    char err[256] = "";
    int rc = kvp_worker_create(&cfg, &w, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "    kvp_worker_create: %s (%s)\n", err, kvp_err_name(rc));
        return NULL;
    }
    kvp_tdb_tensor t[LAYERS];
    for (int l = 0; l < LAYERS; l++)
        t[l] = (kvp_tdb_tensor){
            .base = c->layer[l], .storage_len = LAYER_BYTES, .elem_size = 1, .ndim = 4,
            .shape = {2, NB, BS, DIM}, .stride = {PLANE, BS * DIM, DIM, 1},
        };
    if (kvp_worker_register_kv_caches(w, t, LAYERS) != 0) {
        kvp_worker_destroy(w);
        return NULL;
    }
    return w;
}

typedef struct rq {
    const char *id;
    kvp_meta_ids ids;
    kvp_meta_load_spec ls;
    kvp_meta_req r;
} rq;

static void rq_save(rq *q, const char *id, uint32_t *bids, int n, const uint8_t *h)
{
    memset(q, 0, sizeof *q);
    q->id = id;
    q->ids = (kvp_meta_ids){bids, (uint32_t)n, 0};
    q->r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_NEW,
        .token_len_chunk = (uint64_t)n * BS, .block_ids = &q->ids, .ngroups = 1,
        .block_hashes = h, .nhashes = (uint32_t)n, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET,
    };
}

static void rq_load(rq *q, const char *id, uint32_t *bids, int n, const uint8_t *h)
{
    memset(q, 0, sizeof *q);
    q->id = id;
    q->ids = (kvp_meta_ids){bids, (uint32_t)n, 0};
    q->ls = (kvp_meta_load_spec){.kvpool_cached_tokens = (uint64_t)n * BS, .can_load = true};
    q->r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_LOAD,
        .block_ids = &q->ids, .ngroups = 1, .block_hashes = h, .nhashes = (uint32_t)n,
        .hash_len = HL, .can_save = KVP_META_UNSET, .is_last_chunk = KVP_META_UNSET,
        .load_spec = &q->ls,
    };
}

/* One get_finished holding q (may be NULL). */
static int step(kvp_worker *w, rq *q)
{
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    if (q)
        kvp_meta_step_add_req(&s, &q->r);
    kvp_worker_ids ds = {0}, dr = {0};
    int rc = kvp_worker_get_finished(w, NULL, 0, &s, &ds, &dr);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_meta_step_free(&s);
    return rc;
}

/* Runs q's transfers to the end. */
static int run(kvp_worker *w, rq *q)
{
    REQUIRE(step(w, q) == 0);
    kvp_worker_drain(w);
    return 0;
}

static size_t take_errors(kvp_worker *w, uint32_t *out, size_t cap)
{
    uint32_t *ids = NULL;
    size_t n = 0;
    kvp_worker_load_errors(w, &ids, &n);
    for (size_t i = 0; i < n && i < cap; i++)
        out[i] = ids[i];
    kvp_free(ids);
    return n;
}

static int op_zero(const kvp_worker_op_stats *s)
{
    static const kvp_worker_op_stats z;
    return memcmp(s, &z, sizeof z) == 0;
}

/* ------------------------------------------------------------ stats §11 */

/* W6 save_put metrics with the spec's numbers: a 2-key save of 256-byte
 * chunks is ONE put of 2 keys and 512 bytes, status ok (no failed key, not
 * partial, no error); there is no separate save_exists operation (dedup is
 * the put's 0-byte answer). W45: a take after a take returns 0 with every
 * counter zero. W46: lookup_exists records one operation per lookup RPC
 * with the keys probed; a lookup below L makes no RPC and records nothing;
 * a lookup whose exist call fails is an error with every key failed. */
TEST(accept_save_put_lookup_metrics_and_reset_after_read)
{
    env e;
    ENV_UP(&e);
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[2 * HL];
    hashes(h, 2, 1);
    uint32_t sb[2] = {3, 7};
    fill(&c, 1, sb, 2);
    rq q;
    rq_save(&q, "m-a", sb, 2, h);
    uint64_t t0 = kvp_now_ns();
    CHECK_EQ(run(w, &q), 0);
    uint64_t wall = kvp_now_ns() - t0;
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    const kvp_worker_op_stats *p = &st.op[KVP_WORKER_OP_SAVE_PUT];
    CHECK_EQ(p->count, 1);
    CHECK_EQ(p->keys, 2);
    CHECK_EQ(p->bytes, 512);
    CHECK_EQ(p->failed_keys, 0);
    CHECK_EQ(p->existing_keys, 0);
    CHECK_EQ(p->partial, 0);
    CHECK_EQ(p->errors, 0);
    CHECK(p->total_ns > 0 && p->total_ns <= wall); /* one operation: */
    CHECK_EQ(p->max_ns, p->total_ns);              /* max == total */
    CHECK(op_zero(&st.op[KVP_WORKER_OP_LOAD_GET]));
    CHECK(op_zero(&st.op[KVP_WORKER_OP_LOOKUP_EXISTS]));

    /* reset after read */
    memset(&st, 0xab, sizeof st);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0);
    for (int op = 0; op < KVP_WORKER_OP_COUNT; op++)
        CHECK(op_zero(&st.op[op]));

    /* the same save again from another request: 2 keys "already there" */
    rq_save(&q, "m-b", sb, 2, h);
    CHECK_EQ(run(w, &q), 0);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].partial, 0);

    /* lookup metrics: 33 tokens over 2 stored chunks -> 2 keys probed */
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w, 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 32);
    uint8_t hm[2 * HL];
    memcpy(hm, h, sizeof hm);
    hm[HL] ^= 0x5a; /* chunk 1 unknown: present 0, not a failed key */
    CHECK_EQ(kvp_worker_lookup(w, 33, hm, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 16);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    p = &st.op[KVP_WORKER_OP_LOOKUP_EXISTS];
    CHECK_EQ(p->count, 2);
    CHECK_EQ(p->keys, 4);
    CHECK_EQ(p->bytes, 0);
    CHECK_EQ(p->failed_keys, 0);
    CHECK_EQ(p->errors, 0);
    CHECK(p->max_ns > 0 && p->max_ns <= p->total_ns);
    CHECK(op_zero(&st.op[KVP_WORKER_OP_SAVE_PUT]));
    CHECK_EQ(kvp_worker_lookup(w, 15, h, 2, HL, 1, &hit), 0); /* below L: no RPC */
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0);

    /* the master is gone: the exist call fails -> hit 0, one error */
    tp_master_kill(&e.m);
    hit = 9;
    CHECK_EQ(kvp_worker_lookup(w, 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].errors, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].failed_keys, 2);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* W20 load_get partial-failure metrics: one GET of 3 keys, one missing ->
 * count 1, keys 3, failed_keys 1, partial 1, errors 0, bytes = the 2
 * loaded keys; the missing chunk's block is the only load error. The read
 * leases of the GET are given back when it ends: a non-forced remove of a
 * loaded key succeeds at once (the lease TTL is 5 s). */
TEST(accept_load_get_partial_failure_metrics)
{
    env e;
    ENV_UP(&e);
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    kvp_worker *w1 = worker_open(&e, &c1, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, NULL);
    CHECK(w1 && w2);
    uint8_t h[3 * HL];
    hashes(h, 3, 2);
    uint32_t sb[3] = {1, 2, 3};
    fill(&c1, 2, sb, 3);
    rq q;
    rq_save(&q, "p-a", sb, 3, h);
    CHECK_EQ(run(w1, &q), 0);
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    char key[256];
    CHECK_EQ(key_of(h, 1, key, sizeof key), 0);
    CHECK_EQ(kvp_client_remove(cl, key, 1), 0);

    uint32_t lb[3] = {20, 21, 22};
    rq_load(&q, "p-b", lb, 3, h);
    CHECK_EQ(run(w2, &q), 0);
    uint32_t errs[NB];
    size_t ne = take_errors(w2, errs, NB);
    CHECK_EQ(ne, 1);
    CHECK_EQ(errs[0], 21);
    CHECK_EQ(block_state(&c2, 2, 20, 0), 1);
    CHECK_EQ(block_state(&c2, 2, 21, 1), 0);
    CHECK_EQ(block_state(&c2, 2, 22, 2), 1);
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(w2, &st), 1);
    const kvp_worker_op_stats *g = &st.op[KVP_WORKER_OP_LOAD_GET];
    CHECK_EQ(g->count, 1);
    CHECK_EQ(g->keys, 3);
    CHECK_EQ(g->bytes, 2 * KEY_BYTES);
    CHECK_EQ(g->failed_keys, 1);
    CHECK_EQ(g->partial, 1);
    CHECK_EQ(g->errors, 0);
    CHECK(op_zero(&st.op[KVP_WORKER_OP_SAVE_PUT]));

    /* leases given back: non-forced removes of the loaded keys succeed */
    for (int k = 0; k < 3; k += 2) {
        CHECK_EQ(key_of(h, k, key, sizeof key), 0);
        int rc = -1;
        for (int i = 0; i < 50 && rc != 0; i++) { /* 1 s at most, lease TTL 5 s */
            rc = kvp_client_remove(cl, key, 0);
            if (rc != 0)
                tp_sleep_ms(20);
        }
        CHECK_EQ(rc, 0);
    }
    kvp_client_close(cl);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* ------------------------------------------------------------ staging §10.7 */

/* Loads chunks 0..n-1 of h into lb with a fresh worker of the given budget;
 * returns the load_get stats and the load-error count. */
static int load_with_budget(env *e, uint64_t budget, const uint8_t *h, uint32_t *lb, int n,
                            cache *c, kvp_worker_stats *st, size_t *ne)
{
    wopts o = {.staging = budget};
    kvp_worker *w = worker_open(e, c, &o);
    REQUIRE(w != NULL);
    rq q;
    rq_load(&q, "s-l", lb, n, h);
    int rc = run(w, &q);
    uint32_t errs[NB];
    *ne = take_errors(w, errs, NB);
    kvp_worker_take_stats(w, st);
    kvp_worker_destroy(w);
    return rc;
}

/* W17: staging of a 256-byte key (4 pieces) is exactly 12288 bytes
 * (align_up(256, 4096) + 8192, the spec's staging([256, 512]) value):
 * raw budget 12288 loads it (alone per GET: usable = 11059 < 12288), raw
 * 12287 refuses it (no GET, every block invalid). W21: the split uses the
 * usable ratio 0.9: raw 2 x 12288 = 24576 -> usable 22118 -> one key per
 * GET although the raw budget holds both; raw ceil(2 x 12288 / 0.9) =
 * 27307 -> usable 24576 -> both keys in one GET. */
TEST(accept_staging_12288_and_ratio_scaled_split)
{
    env e;
    ENV_UP(&e);
    cache cs;
    cache_init(&cs);
    kvp_worker *ws = worker_open(&e, &cs, NULL);
    CHECK(ws != NULL);
    uint8_t h[2 * HL];
    hashes(h, 2, 3);
    uint32_t sb[2] = {4, 5}, lb[2] = {10, 11};
    fill(&cs, 3, sb, 2);
    rq q;
    rq_save(&q, "s-a", sb, 2, h);
    CHECK_EQ(run(ws, &q), 0);
    static const struct {
        uint64_t budget;
        uint64_t gets; /* GET operations */
        size_t errors; /* invalid blocks */
    } cases[] = {
        {STAGING_KEY, 2, 0},
        {STAGING_KEY - 1, 0, 2},
        {2 * STAGING_KEY, 2, 0},
        {(2 * STAGING_KEY * 10 + 8) / 9, 1, 0},
        {0, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cache c;
        cache_init(&c);
        kvp_worker_stats st;
        size_t ne = 99;
        CHECK_EQ(load_with_budget(&e, cases[i].budget, h, lb, 2, &c, &st, &ne), 0);
        if (st.op[KVP_WORKER_OP_LOAD_GET].count != cases[i].gets || ne != cases[i].errors)
            fprintf(stderr, "    budget %llu: %llu GETs, %zu errors\n",
                    (unsigned long long)cases[i].budget,
                    (unsigned long long)st.op[KVP_WORKER_OP_LOAD_GET].count, ne);
        CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, cases[i].gets);
        CHECK_EQ(ne, cases[i].errors);
        int want = cases[i].errors ? 0 : 1;
        CHECK_EQ(block_state(&c, 3, lb[0], 0), want);
        CHECK_EQ(block_state(&c, 3, lb[1], 1), want);
        if (cases[i].gets)
            CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].bytes, 2 * KEY_BYTES);
        cache_free(&c);
    }
    kvp_worker_destroy(ws);
    cache_free(&cs);
    env_down(&e);
}

/* ------------------------------------------------------------ reset §9.2 */

typedef struct bg {
    kvp_worker *w;
    int64_t result;
    int done;
    pthread_mutex_t mu;
} bg;

static void *reset_main(void *p)
{
    bg *a = p;
    int64_t r = kvp_worker_reset(a->w);
    pthread_mutex_lock(&a->mu);
    a->result = r;
    a->done = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static void *destroy_main(void *p)
{
    bg *a = p;
    kvp_worker_destroy(a->w);
    pthread_mutex_lock(&a->mu);
    a->done = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int bg_done(bg *a)
{
    pthread_mutex_lock(&a->mu);
    int d = a->done;
    pthread_mutex_unlock(&a->mu);
    return d;
}

/* C16: reset drains the send queue before remove_all. A save is running
 * (held in the engine fence) and another is queued when reset is called:
 * reset does not return while they wait; once the fence opens, both puts
 * run (4 keys, 1024 bytes stored), THEN the wipe removes exactly those 4
 * objects (the reset's count) and the pool is empty afterwards. Had the
 * wipe run first, it would have removed 0 objects and the 4 keys would
 * still be found. */
TEST(accept_reset_drains_send_queue_before_remove_all)
{
    env e;
    ENV_UP(&e);
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[2 * HL], h2[2 * HL];
    hashes(h, 2, 4);
    hashes(h2, 2, 5);
    uint32_t sb[2] = {1, 2}, sb2[2] = {3, 4};
    fill(&c, 4, sb, 2);
    fill(&c, 5, sb2, 2);
    gate_set(1);
    rq q, q2;
    rq_save(&q, "r-a", sb, 2, h);
    CHECK_EQ(step(w, &q), 0);
    CHECK(gate_wait_entered());
    rq_save(&q2, "r-b", sb2, 2, h2);
    CHECK_EQ(step(w, &q2), 0); /* queued behind r-a */
    bg a = {.w = w, .result = -12345};
    pthread_mutex_init(&a.mu, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, reset_main, &a), 0);
    tp_sleep_ms(150);
    CHECK_EQ(bg_done(&a), 0); /* waiting for the send queue */
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0); /* no put has run yet */
    gate_set(0);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&a.mu);
    CHECK_EQ(a.result, 4); /* the 4 objects the two puts stored */
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 4);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 4 * KEY_BYTES);
    uint32_t hit = 9;
    CHECK_EQ(kvp_worker_lookup(w, 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_lookup(w, 33, h2, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    char key[256];
    CHECK_EQ(key_of(h, 0, key, sizeof key), 0);
    CHECK(kvp_client_size(cl, key) < 0);
    kvp_client_close(cl);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* C17: a worker without a send thread (kv_consumer with lookup) resets at
 * once: it never queues a save (its step's save is ignored: no put
 * recorded), and its reset empties the pool another worker filled. */
TEST(accept_reset_without_send_thread)
{
    env e;
    ENV_UP(&e);
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    kvp_worker *wp = worker_open(&e, &c1, NULL);
    wopts o = {.role = KVP_WORKER_CONSUMER};
    kvp_worker *wc = worker_open(&e, &c2, &o);
    CHECK(wp && wc);
    CHECK(!kvp_worker_capacity_only(wc));
    uint8_t h[2 * HL];
    hashes(h, 2, 6);
    uint32_t sb[2] = {6, 7};
    fill(&c1, 6, sb, 2);
    fill(&c2, 6, sb, 2);
    rq q;
    rq_save(&q, "c-a", sb, 2, h);
    CHECK_EQ(run(wp, &q), 0);
    rq_save(&q, "c-b", sb, 2, h);
    CHECK_EQ(run(wc, &q), 0);
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(wc, &st), 0); /* the consumer stored nothing */
    gate_set(1); /* a fence the consumer must never wait for */
    uint64_t t0 = kvp_now_ns();
    CHECK_EQ(kvp_worker_reset(wc), 2);
    CHECK(kvp_now_ns() - t0 < 3000000000ull);
    gate_set(0);
    uint32_t hit = 9;
    CHECK_EQ(kvp_worker_lookup(wp, 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    kvp_worker_destroy(wc);
    kvp_worker_destroy(wp);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* ------------------------------------------------------------ close */

/* W47 / C18: destroy drains the queued jobs before it closes the store: a
 * save running in the fence and one queued when destroy is called are
 * both stored (another worker finds them), and destroy returns only after
 * that. destroy(NULL) is a no-op (the C form of "idempotent": a handle is
 * destroyed once). */
TEST(accept_destroy_drains_queued_jobs)
{
    env e;
    ENV_UP(&e);
    kvp_worker_destroy(NULL);
    cache c, c2;
    cache_init(&c);
    cache_init(&c2);
    kvp_worker *w = worker_open(&e, &c, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, NULL);
    CHECK(w && w2);
    uint8_t h[2 * HL], h2[2 * HL];
    hashes(h, 2, 7);
    hashes(h2, 2, 8);
    uint32_t sb[2] = {1, 2}, sb2[2] = {3, 4};
    fill(&c, 7, sb, 2);
    fill(&c, 8, sb2, 2);
    gate_set(1);
    rq q, q2;
    rq_save(&q, "d-a", sb, 2, h);
    CHECK_EQ(step(w, &q), 0);
    CHECK(gate_wait_entered());
    rq_save(&q2, "d-b", sb2, 2, h2);
    CHECK_EQ(step(w, &q2), 0);
    bg a = {.w = w};
    pthread_mutex_init(&a.mu, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, destroy_main, &a), 0);
    tp_sleep_ms(150);
    CHECK_EQ(bg_done(&a), 0); /* draining: the running save waits in the fence */
    gate_set(0);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&a.mu);
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w2, 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 32);
    CHECK_EQ(kvp_worker_lookup(w2, 33, h2, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 32); /* the queued save ran before the store was closed */
    kvp_worker_destroy(w2);
    cache_free(&c);
    cache_free(&c2);
    env_down(&e);
}

/* W47 "swallows errors": with the master and the storage node dead, a
 * worker with a save and a load queued is destroyed in bounded time (the
 * jobs fail inside, destroy reports nothing and leaks nothing). */
TEST(accept_destroy_with_dead_store)
{
    env e;
    ENV_UP(&e);
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[2 * HL];
    hashes(h, 2, 9);
    uint32_t sb[2] = {1, 2}, lb[2] = {5, 6};
    fill(&c, 9, sb, 2);
    tp_store_kill(&e.st);
    tp_master_kill(&e.m);
    rq q, l;
    rq_save(&q, "x-a", sb, 2, h);
    rq_load(&l, "x-b", lb, 2, h);
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    kvp_meta_step_add_req(&s, &q.r);
    kvp_meta_step_add_req(&s, &l.r);
    kvp_worker_ids ds = {0}, dr = {0};
    CHECK_EQ(kvp_worker_get_finished(w, NULL, 0, &s, &ds, &dr), 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_meta_step_free(&s);
    uint64_t t0 = kvp_now_ns();
    kvp_worker_destroy(w);
    uint64_t ms = (kvp_now_ns() - t0) / 1000000;
    fprintf(stderr, "    destroy with a dead store: %llu ms\n", (unsigned long long)ms);
    CHECK(ms < 10000); /* two RPCs of at most rpc_timeout (2 s) each */
    CHECK_EQ(block_state(&c, 9, lb[0], 0), 0); /* nothing loaded */
    cache_free(&c);
    env_down(&e);
}

/* ------------------------------------------------------------ lookup §10.5 */

/* A save over two groups of the first `tokens` tokens. */
typedef struct rq2 {
    kvp_meta_ids ids[2];
    kvp_meta_req r;
} rq2;

static void rq2_save(rq2 *q, const char *id, uint32_t *g0, uint32_t n0, uint32_t *g1,
                     uint32_t n1, const uint8_t *h, uint32_t nh, uint64_t tokens)
{
    memset(q, 0, sizeof *q);
    q->ids[0] = (kvp_meta_ids){g0, n0, 0};
    q->ids[1] = (kvp_meta_ids){g1, n1, 0};
    q->r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_NEW, .token_len_chunk = tokens,
        .block_ids = q->ids, .ngroups = 2, .block_hashes = h, .nhashes = nh, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET,
    };
}

static int run2(kvp_worker *w, rq2 *q)
{
    rq t = {.id = q->r.req_id.p, .r = q->r};
    return run(w, &t);
}

/* W39 "no 2nd RPC": a hit covering the whole prompt is re-derived one
 * boundary lower from the same exist answer (one lookup_exists operation).
 * W40 at the worker: FA32 + SWA8/W8, H 8, 96 tokens (the lookup mask has no
 * retention): the one exist batch probes the 3 FA chunks and only SWA
 * chunks 3, 7, 11 (6 keys, not 3 + 12); with FA chunk 0 and SWA chunk 3
 * stored (a 32-token save) the hit is 32. */
TEST(accept_lookup_one_rpc_and_reachable_swa_probes)
{
    env e;
    ENV_UP(&e);
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[2 * HL];
    hashes(h, 2, 10);
    uint32_t sb[2] = {1, 2};
    fill(&c, 10, sb, 2);
    rq q;
    rq_save(&q, "l-a", sb, 2, h);
    CHECK_EQ(run(w, &q), 0);
    kvp_worker_stats st;
    kvp_worker_take_stats(w, &st);
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w, 32, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 16);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].keys, 2);
    kvp_worker_destroy(w);

    static const kvp_worker_group fs[2] = {
        {.spec = {.kind = KVP_COORD_FULL, .block_size = 32},
         .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 8},
        {.spec = {.kind = KVP_COORD_SWA, .block_size = 8, .window = 8, .spec_tag = 1},
         .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 8},
    };
    wopts o = {.groups = fs, .ngroups = 2, .hbs = 8};
    w = worker_open(&e, &c, &o);
    CHECK(w != NULL);
    uint8_t h12[12 * HL];
    hashes(h12, 12, 11);
    uint32_t fa[1] = {1}, swa[4] = {10, 11, 12, 13};
    fill(&c, 11, fa, 1);
    fill(&c, 12, swa, 4);
    rq2 q2;
    rq2_save(&q2, "l-b", fa, 1, swa, 4, h12, 4, 32);
    CHECK_EQ(run2(w, &q2), 0);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2); /* FA chunk 0, SWA chunk 3 */
    CHECK_EQ(kvp_worker_lookup(w, 97, h12, 12, HL, 1, &hit), 0);
    CHECK_EQ(hit, 32);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].keys, 6);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* W35: FA16 (one KV head: shared between the 2 TP ranks) + Mamba16 (state
 * private to each rank): a boundary is a hit only when BOTH ranks' Mamba
 * shards of it are stored. Both ranks save 32 tokens of FA (normal saves
 * never store Mamba: its state is stored by partial-tail offloads, so the
 * Mamba objects are put directly under each rank's keys): lookup(33) = 32
 * on either rank; rank 1's Mamba shard at boundary 32 removed: 16; its
 * shard at 16 removed too: 0. */
TEST(accept_lookup_needs_every_mamba_shard)
{
    env e;
    ENV_UP(&e);
    static const kvp_worker_group fm[2] = {
        {.spec = {.kind = KVP_COORD_FULL, .block_size = BS},
         .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 1},
        {.spec = {.kind = KVP_COORD_MAMBA, .block_size = BS, .spec_tag = 1},
         .key_spec = KVP_KEY_SPEC_MAMBA},
    };
    uint8_t h[2 * HL];
    hashes(h, 2, 13);
    cache c[2];
    kvp_worker *w[2];
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    /* first states of another size than a load reads (KEY_BYTES a block in
     * every group): the lookup counts them as misses (its existing_keys) */
    uint8_t state[KEY_BYTES], small[64];
    memset(state, 0x5c, sizeof state);
    memset(small, 0x5c, sizeof small);
    char key[256];
    size_t klen;
    struct kvp_key_meta md[2];
    uint64_t fa_keys = 0;
    for (int r = 0; r < 2; r++) {
        cache_init(&c[r]);
        wopts o = {.groups = fm, .ngroups = 2, .tp_rank = r, .tp_size = 2};
        w[r] = worker_open(&e, &c[r], &o);
        CHECK(w[r] != NULL);
        uint32_t fa[2] = {1, 2}, mb[2] = {3, 4};
        fill(&c[r], 13, fa, 2);
        rq2 q;
        rq2_save(&q, "mb-a", fa, 2, mb, 2, h, 2, 32);
        CHECK_EQ(run2(w[r], &q), 0);
        kvp_worker_stats st;
        kvp_worker_take_stats(w[r], &st);
        fa_keys += st.op[KVP_WORKER_OP_SAVE_PUT].keys;
        CHECK_EQ(kvp_key_meta_init(&md[r], MODEL, NULL, r, 0, 0, 0, 1), 0);
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(kvp_key_build(&md[r], h + (size_t)k * HL, HL, key, sizeof key, &klen), 0);
            CHECK_EQ(kvp_client_put(cl, key, small, sizeof small), 0);
        }
    }
    CHECK_EQ(fa_keys, 2); /* FA striding: one chunk per rank */
    uint32_t hit = 0;
    kvp_worker_stats st;
    kvp_worker_take_stats(w[0], &st);
    CHECK_EQ(kvp_worker_lookup(w[0], 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_take_stats(w[0], &st), 1);
    CHECK(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].existing_keys > 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].failed_keys, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].errors, 0);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 2; k++) {
            CHECK_EQ(kvp_key_build(&md[r], h + (size_t)k * HL, HL, key, sizeof key, &klen), 0);
            CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
            CHECK_EQ(kvp_client_put(cl, key, state, sizeof state), 0);
        }
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(kvp_worker_lookup(w[r], 33, h, 2, HL, 1, &hit), 0);
        CHECK_EQ(hit, 32);
    }
    CHECK_EQ(kvp_key_build(&md[1], h + HL, HL, key, sizeof key, &klen), 0);
    CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
    for (int r = 0; r < 2; r++) {
        CHECK_EQ(kvp_worker_lookup(w[r], 33, h, 2, HL, 1, &hit), 0);
        CHECK_EQ(hit, 16);
    }
    CHECK_EQ(kvp_key_build(&md[1], h, HL, key, sizeof key, &klen), 0);
    CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
    CHECK_EQ(kvp_worker_lookup(w[0], 33, h, 2, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    kvp_client_close(cl);
    for (int r = 0; r < 2; r++) {
        kvp_worker_destroy(w[r]);
        cache_free(&c[r]);
    }
    env_down(&e);
}
