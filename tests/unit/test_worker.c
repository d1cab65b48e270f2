/* test_worker.c -- kvp_worker (spec §10-§12) against a real kvpool master
 * and storage node: store/load round trips into a paged host-memory KV
 * cache (2 layers, K/V planes, 64 blocks of 16 tokens), dedup through the
 * put answer, lookup hit lengths, TP 2 put striding and namespaces, a
 * killed storage node, staging-budget sub-batches with a missing key,
 * zero-key loads, a request finished while its store is in flight,
 * handle_preemptions before the forward, per-step fences, aborted async
 * loads, hybrid FA+SWA saves (delta, window, striding phase by rank, KV
 * events), DCP namespaces, load rotation / staging split / stop / oversize,
 * the -200-only back-off, partial tails under pressure and L clamping. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/keys.h"
#include "connector/worker.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define NB 64      /* blocks per layer */
#define BS 16      /* tokens per block */
#define DIM 8      /* bytes per token per plane */
#define LAYERS 2
#define PLANE (NB * BS * DIM)
#define LAYER_BYTES (2 * PLANE)
#define HL 32      /* hash length */
#define CHUNK_BYTES (LAYERS * 2 * BS * DIM)
#define NCH 6      /* chunks of the test request */
#define MODEL "org/test-model"

/* ------------------------------------------------------------ environment */

typedef struct env {
    tp_master m;
    tp_store st;
    char cfg[256];
} env;

static int store_up(env *e)
{
    return tp_store_start(&e->st, e->m.addr,
                          (const char *const[]){"--segment-size", "64MiB", NULL});
}

/* Master and (with_store) one 64 MiB storage node. */
static int env_up2(env *e, int with_store)
{
    memset(e, 0, sizeof *e);
    setenv("KVPOOL_FORCE_TCP", "1", 1); /* a killed node must be seen as dead */
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    if (with_store && store_up(e) != 0)
        return -1;
    snprintf(e->cfg, sizeof e->cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}",
             e->m.addr);
    return 0;
}

static int env_up(env *e) { return env_up2(e, 1); }

static void env_down(env *e)
{
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
}

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

/* Byte d of token position pos, layer l, plane p, for data seed s. */
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

/* Writes chunk k (tokens [k*BS, (k+1)*BS)) into block bids[k]. */
static void fill(cache *c, uint32_t seed, const uint32_t *bids, int n)
{
    for (int k = 0; k < n; k++)
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < 2; p++)
                for (int t = 0; t < BS; t++)
                    for (int d = 0; d < DIM; d++)
                        slot(c, l, p, bids[k], t)[d] = val(seed, (uint64_t)k * BS + t, l, p, d);
}

/* 1 = block holds chunk k of seed, 0 = block all zero, -1 = anything else. */
static int block_state(cache *c, uint32_t seed, uint32_t bid, int k)
{
    int good = 1, zero = 1;
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++)
            for (int t = 0; t < BS; t++)
                for (int d = 0; d < DIM; d++) {
                    uint8_t v = slot(c, l, p, bid, t)[d];
                    good &= v == val(seed, (uint64_t)k * BS + t, l, p, d);
                    zero &= v == 0;
                }
    return good ? 1 : zero ? 0 : -1;
}

/* Every block not in bids[0..n) is all zero. */
static int others_zero(cache *c, const uint32_t *bids, int n)
{
    for (uint32_t b = 0; b < NB; b++) {
        int used = 0;
        for (int i = 0; i < n; i++)
            used |= bids[i] == b;
        if (!used && block_state(c, 0, b, 0) != 0)
            return 0;
    }
    return 1;
}

static void hashes(uint8_t *h, int n, uint32_t seed)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < HL; k++)
            h[i * HL + k] = (uint8_t)(seed * 131 + (uint32_t)i * 31 + (uint32_t)k * 7 + 1);
}

/* ------------------------------------------------------------ workers */

static int fence_calls;
static uint64_t fence_steps[64]; /* step argument of each fence call */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static int gate_closed, gate_waiting;
static int fence_fail; /* the engine cannot fence: abandon the put */

static int fence_fn(void *arg, uint64_t st)
{
    (void)arg;
    pthread_mutex_lock(&gate_mu);
    if (fence_calls < 64)
        fence_steps[fence_calls] = st;
    fence_calls++;
    gate_waiting = 1;
    while (gate_closed)
        pthread_cond_wait(&gate_cv, &gate_mu);
    gate_waiting = 0;
    int fail = fence_fail;
    pthread_mutex_unlock(&gate_mu);
    return fail;
}

static void gate_set(int closed)
{
    pthread_mutex_lock(&gate_mu);
    gate_closed = closed;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

static int gate_is_waiting(void)
{
    pthread_mutex_lock(&gate_mu);
    int r = gate_waiting;
    pthread_mutex_unlock(&gate_mu);
    return r;
}

typedef struct wopts {
    int tp_rank, tp_size, heads;
    uint64_t staging;
    const char *prefix;
    int mamba;        /* groups FA(16) + Mamba(16) with H = 4: partial hits */
    int capacity;     /* consumer without lookup */
    const kvp_worker_group *groups; /* custom groups (ngroups of them) */
    size_t ngroups;
    uint32_t hbs;     /* hash_block_size with custom groups */
    unsigned recv_threads;
    int dcp_rank, dcp_size;
    int consumer;     /* kv_consumer (with lookup unless capacity) */
    int save_decode;  /* save_decode_cache */
} wopts;

static kvp_worker *worker_open(const env *e, cache *c, const wopts *o)
{
    kvp_worker_group g[2] = {
        {.spec = {.kind = KVP_COORD_FULL, .block_size = BS},
         .key_spec = KVP_KEY_SPEC_ATTENTION,
         .num_kv_heads = o && o->heads ? o->heads : 8},
        {.spec = {.kind = KVP_COORD_MAMBA, .block_size = BS, .spec_tag = 1},
         .key_spec = KVP_KEY_SPEC_MAMBA},
    };
    int mamba = o && o->mamba;
    kvp_worker_cfg cfg = {
        .store_config = e->cfg,
        .model_path = MODEL,
        .cache_prefix = o ? o->prefix : NULL,
        .tp_rank = o ? o->tp_rank : 0,
        .tp_size = o && o->tp_size ? o->tp_size : 1,
        .pcp_size = 1, .dcp_rank = o ? o->dcp_rank : 0,
        .dcp_size = o && o->dcp_size ? o->dcp_size : 1, .pp_size = 1,
        .role = o && (o->capacity || o->consumer) ? KVP_WORKER_CONSUMER : KVP_WORKER_BOTH,
        .enable_lookup = !(o && o->capacity),
        .save_decode_cache = o && o->save_decode,
        .groups = g,
        .ngroups = mamba ? 2 : 1,
        .hash_block_size = mamba ? 4 : 0,
        .retention_interval = -1,
        .num_gpu_blocks = NB,
        .num_recv_threads = o && o->recv_threads ? o->recv_threads : 2,
        .staging_budget = o ? o->staging : 0,
        .enable_kv_events = 1,
        .fence = fence_fn,
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
    for (int l = 0; l < LAYERS; l++) {
        t[l] = (kvp_tdb_tensor){
            .base = c->layer[l], .storage_len = LAYER_BYTES, .elem_size = 1, .ndim = 4,
            .shape = {2, NB, BS, DIM}, .stride = {PLANE, BS * DIM, DIM, 1},
        };
    }
    if (kvp_worker_register_kv_caches(w, t, LAYERS) != 0) {
        kvp_worker_destroy(w);
        return NULL;
    }
    return w;
}

/* One request of the step: a save of n chunks, or a load. */
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

static void rq_load(rq *q, const char *id, uint32_t *bids, int n, const uint8_t *h,
                    uint64_t local, uint64_t hit)
{
    memset(q, 0, sizeof *q);
    q->id = id;
    q->ids = (kvp_meta_ids){bids, (uint32_t)n, 0};
    q->ls = (kvp_meta_load_spec){.vllm_cached_tokens = local, .kvpool_cached_tokens = hit,
                                 .can_load = true};
    q->r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_LOAD,
        .block_ids = &q->ids, .ngroups = 1, .block_hashes = h, .nhashes = (uint32_t)n,
        .hash_len = HL, .can_save = KVP_META_UNSET, .is_last_chunk = KVP_META_UNSET,
        .load_spec = &q->ls,
    };
}

/* Runs one step holding q (may be NULL) and reports whether id finished
 * sending / receiving in it. */
static int step(kvp_worker *w, rq *q, const char *fin, int *sent, int *recvd, const char *id)
{
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    if (q)
        kvp_meta_step_add_req(&s, &q->r);
    kvp_worker_ids ds = {0}, dr = {0};
    const char *f[1] = {fin};
    int rc = kvp_worker_get_finished(w, fin ? f : NULL, fin ? 1 : 0, &s, &ds, &dr);
    if (sent)
        *sent = kvp_worker_ids_has(&ds, id);
    if (recvd)
        *recvd = kvp_worker_ids_has(&dr, id);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_meta_step_free(&s);
    return rc;
}

/* Stores q and waits (bounded) until it is reported finished sending. */
static int store_wait(kvp_worker *w, rq *q)
{
    int sent = 0;
    REQUIRE(step(w, q, q->id, &sent, NULL, q->id) == 0);
    for (int i = 0; i < 1000 && !sent; i++) {
        tp_sleep_ms(5);
        REQUIRE(step(w, NULL, NULL, &sent, NULL, q->id) == 0);
    }
    REQUIRE(sent);
    return 0;
}

static int load_wait(kvp_worker *w, rq *q)
{
    int got = 0;
    REQUIRE(step(w, q, NULL, NULL, &got, q->id) == 0);
    for (int i = 0; i < 1000 && !got; i++) {
        tp_sleep_ms(5);
        REQUIRE(step(w, NULL, NULL, NULL, &got, q->id) == 0);
    }
    REQUIRE(got);
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

static int has_id(const uint32_t *ids, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == v)
            return 1;
    return 0;
}

/* ------------------------------------------------------------ tests */

TEST(worker_store_load_dedup_lookup)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    kvp_worker *w1 = worker_open(&e, &c1, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, NULL);
    CHECK(w1 && w2);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 1);
    uint32_t sb[NCH] = {5, 9, 2, 40, 17, 33};
    fill(&c1, 1, sb, NCH);
    rq q;
    rq_save(&q, "req-a", sb, NCH, h);
    CHECK_EQ(store_wait(w1, &q), 0);
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(w1, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 0);
    /* KV events: one BlockStored per chunk, parent chain in order */
    kvp_worker_event *ev = NULL;
    size_t nev = 0;
    CHECK_EQ(kvp_worker_take_events(w1, &ev, &nev), 0);
    CHECK_EQ(nev, NCH);
    for (size_t i = 0; i < nev; i++) {
        CHECK_EQ(ev[i].group, 0);
        CHECK_EQ(ev[i].block_size, BS);
        CHECK_EQ(ev[i].start, i * BS);
        CHECK(memcmp(ev[i].hash, h + i * HL, HL) == 0);
        CHECK_EQ(ev[i].has_parent, i > 0);
        if (i)
            CHECK(memcmp(ev[i].parent, h + (i - 1) * HL, HL) == 0);
    }
    kvp_worker_events_free(ev, nev);

    /* lookup from the other instance */
    uint32_t hit = 99;
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, NCH * BS);
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, (NCH - 1) * BS); /* whole prompt: one boundary lower */
    uint8_t hp[NCH * HL];
    memcpy(hp, h, sizeof hp);
    hp[3 * HL] ^= 0xff; /* chunk 3 unknown */
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS + 1, hp, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 3 * BS);
    uint8_t hn[NCH * HL];
    hashes(hn, NCH, 77);
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS + 1, hn, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_lookup(w2, 10, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    CHECK_EQ(kvp_worker_take_stats(w2, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOOKUP_EXISTS].count, 4);

    /* load into a zeroed cache, other block ids; every byte compared */
    uint32_t lb[NCH] = {60, 1, 7, 8, 50, 3};
    rq_load(&q, "req-b", lb, NCH, h, 0, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    uint32_t errs[NB];
    CHECK_EQ(take_errors(w2, errs, NB), 0);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c2, 1, lb[k], k), 1);
    CHECK(others_zero(&c2, lb, NCH));
    CHECK_EQ(kvp_worker_take_stats(w2, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].bytes, NCH * CHUNK_BYTES);

    /* a load after a 32-token local prefix only fetches chunks 2.. */
    uint32_t pb[NCH] = {20, 21, 22, 23, 24, 25};
    rq_load(&q, "req-c", pb, NCH, h, 2 * BS + 5, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    CHECK_EQ(block_state(&c2, 1, pb[0], 0), 0);
    CHECK_EQ(block_state(&c2, 1, pb[1], 1), 0);
    for (int k = 2; k < NCH; k++)
        CHECK_EQ(block_state(&c2, 1, pb[k], k), 1);

    /* dedup: the second instance stores the same prefix, moves 0 bytes */
    rq_save(&q, "req-d", lb, NCH, h);
    CHECK_EQ(store_wait(w2, &q), 0);
    CHECK_EQ(kvp_worker_take_stats(w2, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, NCH);
    CHECK_EQ(kvp_worker_take_events(w2, &ev, &nev), 0);
    CHECK_EQ(nev, 0);

    /* zero-key loads finish: nothing external, or everything local */
    rq_load(&q, "req-e", lb, NCH, h, 0, 0);
    CHECK_EQ(load_wait(w2, &q), 0);
    rq_load(&q, "req-f", lb, NCH, h, NCH * BS, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    CHECK_EQ(take_errors(w2, errs, NB), 0);

    /* reset: store emptied, lookup finds nothing */
    CHECK(kvp_worker_reset(w1) >= NCH);
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* TP 2: with one KV head the two ranks hold identical bytes (factor 2):
 * put striding makes them store disjoint halves that together cover every
 * chunk once, in one shared namespace; with two heads (factor 1) each rank
 * has its own namespace and loads its own bytes. */
TEST(worker_tp2_striding_and_namespaces)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c[2];
    kvp_worker *w[2];
    uint8_t h[NCH * HL];
    hashes(h, NCH, 2);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6}, lb[NCH] = {30, 31, 32, 33, 34, 35};
    kvp_worker_stats st;
    uint64_t keys = 0, bytes = 0;
    for (int r = 0; r < 2; r++) {
        cache_init(&c[r]);
        wopts o = {.tp_rank = r, .tp_size = 2, .heads = 1};
        w[r] = worker_open(&e, &c[r], &o);
        CHECK(w[r] != NULL);
        fill(&c[r], 2, sb, NCH);
        rq q;
        rq_save(&q, "tp-a", sb, NCH, h);
        CHECK_EQ(store_wait(w[r], &q), 0);
        CHECK_EQ(kvp_worker_take_stats(w[r], &st), 1);
        CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH / 2);
        CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 0);
        keys += st.op[KVP_WORKER_OP_SAVE_PUT].keys;
        bytes += st.op[KVP_WORKER_OP_SAVE_PUT].bytes;
        kvp_worker_event *ev = NULL;
        size_t nev = 0;
        kvp_worker_take_events(w[r], &ev, &nev);
        CHECK_EQ(nev, NCH / 2);
        for (size_t i = 0; i < nev; i++)
            CHECK_EQ(ev[i].start / BS % 2, (uint64_t)r); /* chunk % 2 == rank */
        kvp_worker_events_free(ev, nev);
    }
    CHECK_EQ(keys, NCH);
    CHECK_EQ(bytes, NCH * CHUNK_BYTES);
    for (int r = 0; r < 2; r++) {
        uint32_t hit = 0;
        CHECK_EQ(kvp_worker_lookup(w[r], NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
        CHECK_EQ(hit, NCH * BS);
        rq q;
        rq_load(&q, "tp-b", lb, NCH, h, 0, NCH * BS);
        CHECK_EQ(load_wait(w[r], &q), 0);
        uint32_t errs[NB];
        CHECK_EQ(take_errors(w[r], errs, NB), 0);
        for (int k = 0; k < NCH; k++)
            CHECK_EQ(block_state(&c[r], 2, lb[k], k), 1);
    }
    for (int r = 0; r < 2; r++) {
        kvp_worker_destroy(w[r]);
        cache_free(&c[r]);
    }

    /* factor 1: rank-private bytes (seed 10 + rank), private namespaces */
    uint8_t h2[NCH * HL];
    hashes(h2, NCH, 3);
    for (int r = 0; r < 2; r++) {
        cache_init(&c[r]);
        wopts o = {.tp_rank = r, .tp_size = 2, .heads = 2};
        w[r] = worker_open(&e, &c[r], &o);
        CHECK(w[r] != NULL);
        fill(&c[r], 10 + (uint32_t)r, sb, NCH);
        rq q;
        rq_save(&q, "ns-a", sb, NCH, h2);
        CHECK_EQ(store_wait(w[r], &q), 0);
        CHECK_EQ(kvp_worker_take_stats(w[r], &st), 1);
        CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
    }
    for (int r = 0; r < 2; r++) {
        rq q;
        rq_load(&q, "ns-b", lb, NCH, h2, 0, NCH * BS);
        CHECK_EQ(load_wait(w[r], &q), 0);
        for (int k = 0; k < NCH; k++)
            CHECK_EQ(block_state(&c[r], 10 + (uint32_t)r, lb[k], k), 1);
    }
    for (int r = 0; r < 2; r++) {
        kvp_worker_destroy(w[r]);
        cache_free(&c[r]);
    }
    env_down(&e);
}

/* Staging budget of two keys per sub-batch; chunk 1's object removed: the
 * first sub-batch loads chunk 0 and fails chunk 1, and every block after it
 * is reported invalid (never attempted). Then the storage node is killed:
 * every block of a load is reported, and no block holds wrong bytes. */
TEST(worker_load_failures)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    wopts o = {.staging = (2 * 12288 * 10 + 8) / 9}; /* usable = 2 keys */
    kvp_worker *w1 = worker_open(&e, &c1, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, &o);
    CHECK(w1 && w2);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 4);
    uint32_t sb[NCH] = {10, 11, 12, 13, 14, 15};
    fill(&c1, 4, sb, NCH);
    rq q;
    rq_save(&q, "f-a", sb, NCH, h);
    CHECK_EQ(store_wait(w1, &q), 0);

    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    struct kvp_key_meta md;
    CHECK_EQ(kvp_key_meta_init(&md, MODEL, NULL, 0, 0, 0, 0, 0), 0);
    char key[256];
    size_t klen;
    CHECK_EQ(kvp_key_build(&md, h + 1 * HL, HL, key, sizeof key, &klen), 0);
    CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
    kvp_client_close(cl);

    uint32_t lb[NCH] = {40, 41, 42, 43, 44, 45};
    rq_load(&q, "f-b", lb, NCH, h, 0, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    uint32_t errs[NB];
    size_t ne = take_errors(w2, errs, NB);
    CHECK_EQ(ne, NCH - 1);
    for (int k = 1; k < NCH; k++)
        CHECK(has_id(errs, ne, lb[k]));
    CHECK_EQ(block_state(&c2, 4, lb[0], 0), 1);
    for (int k = 1; k < NCH; k++)
        CHECK_EQ(block_state(&c2, 4, lb[k], k), 0);
    kvp_worker_stats st;
    kvp_worker_take_stats(w2, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1); /* later sub-batches not attempted */
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].failed_keys, 1);
    /* the same failure per request, taken once (engines with several groups) */
    kvp_worker_ids failed = {0};
    CHECK_EQ(kvp_worker_load_failed(w2, &failed), 0);
    CHECK_EQ(failed.n, 1);
    CHECK(kvp_worker_ids_has(&failed, "f-b"));
    kvp_worker_ids_free(&failed);
    CHECK_EQ(kvp_worker_load_failed(w2, &failed), 0);
    CHECK_EQ(failed.n, 0);

    /* storage node killed before a load */
    tp_store_kill(&e.st);
    uint32_t kb[NCH] = {50, 51, 52, 53, 54, 55};
    rq_load(&q, "f-c", kb, NCH, h, 0, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    ne = take_errors(w2, errs, NB);
    CHECK_EQ(ne, NCH);
    for (int k = 0; k < NCH; k++) {
        CHECK(has_id(errs, ne, kb[k]));
        CHECK(block_state(&c2, 4, kb[k], k) >= 0); /* loaded or untouched, never garbage */
    }
    CHECK_EQ(kvp_worker_load_failed(w2, &failed), 0);
    CHECK(failed.n == 1 && kvp_worker_ids_has(&failed, "f-c"));
    kvp_worker_ids_free(&failed);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* A request the engine finishes while its store waits in the fence is
 * reported finished-sending only after the store completed. */
TEST(worker_finished_while_store_in_flight)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 5);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12};
    fill(&c, 5, sb, NCH);
    gate_set(1);
    rq q;
    rq_save(&q, "inf-a", sb, NCH, h);
    int sent = 1;
    CHECK_EQ(step(w, &q, NULL, &sent, NULL, "inf-a"), 0);
    CHECK_EQ(sent, 0);
    for (int i = 0; i < 1000 && !gate_is_waiting(); i++)
        tp_sleep_ms(2);
    CHECK(gate_is_waiting());
    CHECK_EQ(step(w, NULL, "inf-a", &sent, NULL, "inf-a"), 0); /* finished now */
    CHECK_EQ(sent, 0);
    tp_sleep_ms(50);
    CHECK_EQ(step(w, NULL, NULL, &sent, NULL, "inf-a"), 0);
    CHECK_EQ(sent, 0); /* still in flight */
    gate_set(0);
    kvp_worker_drain(w);
    CHECK_EQ(step(w, NULL, NULL, &sent, NULL, "inf-a"), 0);
    CHECK_EQ(sent, 1);
    CHECK_EQ(step(w, NULL, NULL, &sent, NULL, "inf-a"), 0);
    CHECK_EQ(sent, 0); /* reported once */
    kvp_worker_stats st;
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
    /* a finished request that never saved is not reported (not delayed) */
    CHECK_EQ(step(w, NULL, "never", &sent, NULL, "never"), 0);
    CHECK_EQ(sent, 0);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* Partial-tail offload (§10.4) with partial hash hits (FA16 + Mamba16,
 * H = 4): a 12-token boundary stores FA's block 0 and Mamba's CoW block
 * under hash 2; a 13-token lookup hits 12; a load of 12 brings both back. */
TEST(worker_partial_tail_offload)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    wopts o = {.mamba = 1};
    kvp_worker *w1 = worker_open(&e, &c1, &o);
    kvp_worker *w2 = worker_open(&e, &c2, &o);
    CHECK(w1 && w2);
    uint8_t h[3 * HL];
    hashes(h, 3, 6);
    uint32_t fa[1] = {3}, mb[1] = {9}, cow[1] = {7};
    fill(&c1, 6, fa, 1);
    fill(&c1, 7, cow, 1);
    kvp_meta_ids ids[2] = {{fa, 1, 0}, {mb, 1, 0}};
    kvp_meta_tail tail = {.group_id = 1, .cow_block_id = 7, .boundary_tokens = 12};
    kvp_meta_req r = {
        .req_id = {"pt-a", 4}, .kind = KVP_META_TAIL, .token_len_chunk = 0, .block_ids = ids,
        .ngroups = 2, .block_hashes = h, .nhashes = 3, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET, .tails = &tail, .ntails = 1,
    };
    rq q = {.id = "pt-a", .r = r};
    CHECK_EQ(store_wait(w1, &q), 0);
    kvp_worker_stats st;
    kvp_worker_take_stats(w1, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 2 * CHUNK_BYTES);
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w2, 13, h, 3, HL, 1, &hit), 0);
    CHECK_EQ(hit, 12);
    CHECK_EQ(kvp_worker_lookup(w2, 12, h, 3, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0); /* whole prompt: re-derived at 8, whose hashes were never stored */

    uint32_t lfa[1] = {20}, lmb[1] = {21};
    kvp_meta_ids lids[2] = {{lfa, 1, 0}, {lmb, 1, 0}};
    kvp_meta_load_spec ls = {.kvpool_cached_tokens = 12, .can_load = true};
    kvp_meta_req lr = {
        .req_id = {"pt-b", 4}, .kind = KVP_META_LOAD, .block_ids = lids, .ngroups = 2,
        .block_hashes = h, .nhashes = 3, .hash_len = HL, .can_save = KVP_META_UNSET,
        .is_last_chunk = KVP_META_UNSET, .load_spec = &ls,
    };
    rq lq = {.id = "pt-b", .r = lr};
    CHECK_EQ(load_wait(w2, &lq), 0);
    uint32_t errs[NB];
    CHECK_EQ(take_errors(w2, errs, NB), 0);
    CHECK_EQ(block_state(&c2, 6, 20, 0), 1);
    CHECK_EQ(block_state(&c2, 7, 21, 0), 1);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* A resumed request's prefill (prompt + generated tokens) ends past its
 * prompt: the core still hands the state off at the ORIGINAL prompt's
 * checkpoint (12 here, the prefill of 30 tokens has its own at 28), and the
 * attention KV up to it is stored with it; a hand-off past the prefill's
 * checkpoint gets none. */
TEST(worker_resumed_partial_tail_keeps_attention_kv)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    wopts o = {.mamba = 1};
    kvp_worker *w = worker_open(&e, &c, &o);
    CHECK(w);
    uint8_t h[8 * HL];
    hashes(h, 8, 6);
    uint32_t fa[2] = {3, 4}, mb[2] = {9, 10};
    fill(&c, 6, fa, 2);
    fill(&c, 7, (uint32_t[]){7}, 1);
    kvp_meta_ids ids[2] = {{fa, 2, 0}, {mb, 2, 0}};
    kvp_meta_tail tail = {.group_id = 1, .cow_block_id = 7, .boundary_tokens = 12};
    kvp_meta_req r = {
        .req_id = {"rs-a", 4}, .kind = KVP_META_TAIL, .token_len_chunk = 0, .block_ids = ids,
        .ngroups = 2, .block_hashes = h, .nhashes = 7, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET,
        .has_num_prompt_tokens = true, .num_prompt_tokens = 30, .tails = &tail, .ntails = 1,
    };
    rq q = {.id = "rs-a", .r = r};
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_stats st;
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2); /* the state + FA's block clipped to 12 */
    /* prefill of 12 tokens (checkpoint 8): the state at 12 alone */
    tail.boundary_tokens = 12;
    r.req_id = (kvp_meta_str){"rs-b", 4};
    r.num_prompt_tokens = 12;
    r.nhashes = 3;
    rq q2 = {.id = "rs-b", .r = r};
    CHECK_EQ(store_wait(w, &q2), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 1); /* already stored by rs-a */
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 1);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* Preemption drops the request's queued store jobs (they never run) and
 * resets its resume offset; the finished report still waits for the job
 * that was running. A capacity-only worker does nothing. */
TEST(worker_preemption_and_capacity_only)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 8);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12};
    fill(&c, 8, sb, NCH);
    gate_set(1);
    rq q;
    rq_save(&q, "pre-a", sb, 2, h);
    int sent = 1;
    CHECK_EQ(step(w, &q, NULL, &sent, NULL, "pre-a"), 0);
    for (int i = 0; i < 1000 && !gate_is_waiting(); i++)
        tp_sleep_ms(2);
    CHECK(gate_is_waiting());
    rq_save(&q, "pre-a", sb, NCH, h); /* queued behind the running job */
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    kvp_meta_step_add_req(&s, &q.r);
    kvp_meta_step_add_preempted(&s, "pre-a", 5);
    kvp_worker_ids ds = {0}, dr = {0};
    CHECK_EQ(kvp_worker_get_finished(w, NULL, 0, &s, &ds, &dr), 0);
    CHECK_EQ(ds.n, 0);
    kvp_meta_step_free(&s);
    gate_set(0);
    kvp_worker_drain(w);
    kvp_worker_stats st;
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1); /* the queued job was dropped */
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    /* preempted, then finished: the scheduler did not delay its free (§8.5),
     * so it must never be reported finished-sending (the engine has
     * forgotten it) */
    CHECK_EQ(step(w, NULL, "pre-a", &sent, NULL, "pre-a"), 0);
    CHECK_EQ(sent, 0);
    /* resumed after preemption: stores from offset 0 again (dedups 0..1) */
    rq_save(&q, "pre-a", sb, NCH, h);
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 2);
    kvp_worker_destroy(w);

    wopts o = {.capacity = 1};
    kvp_worker *cw = worker_open(&e, &c, &o);
    CHECK(cw != NULL);
    CHECK(kvp_worker_capacity_only(cw));
    uint32_t hit = 7;
    CHECK_EQ(kvp_worker_lookup(cw, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    rq_save(&q, "cap-a", sb, NCH, h);
    CHECK_EQ(step(cw, &q, "cap-a", &sent, NULL, "cap-a"), 0);
    CHECK_EQ(sent, 0);
    kvp_worker_destroy(cw);
    cache_free(&c);
    env_down(&e);
}

/* save_decode_cache (sched.h, "Decode-phase saves"): a consumer's worker
 * serves the scheduler's save metas -- stored, reported finished-sending,
 * found by another instance and loaded byte for byte -- and a capacity-only
 * consumer with it is no longer capacity-only. Without it a consumer's
 * worker ignores a save meta: nothing stored, nothing reported. */
TEST(worker_consumer_save_decode_cache)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    wopts plain = {.consumer = 1}, dec = {.consumer = 1, .save_decode = 1};
    kvp_worker *wp = worker_open(&e, &c1, &plain);
    kvp_worker *wd = worker_open(&e, &c1, &dec);
    kvp_worker *wr = worker_open(&e, &c2, NULL);
    CHECK(wp && wd && wr);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 21);
    uint32_t sb[NCH] = {3, 7, 11, 13, 17, 19};
    fill(&c1, 21, sb, NCH);
    rq q;
    /* a plain consumer: the meta is ignored */
    rq_save(&q, "cons-a", sb, NCH, h);
    int sent = 1;
    CHECK_EQ(step(wp, &q, "cons-a", &sent, NULL, "cons-a"), 0);
    CHECK_EQ(sent, 0);
    kvp_worker_drain(wp);
    kvp_worker_stats st;
    kvp_worker_take_stats(wp, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 0);
    uint32_t hit = 7;
    CHECK_EQ(kvp_worker_lookup(wr, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    /* with save_decode_cache: stored and reported */
    rq_save(&q, "cons-b", sb, NCH, h);
    q.r.kind = KVP_META_RUNNING;
    CHECK_EQ(store_wait(wd, &q), 0);
    kvp_worker_take_stats(wd, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 0);
    CHECK_EQ(kvp_worker_lookup(wr, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, NCH * BS);
    uint32_t lb[NCH] = {40, 41, 42, 43, 44, 45};
    rq_load(&q, "cons-c", lb, NCH, h, 0, NCH * BS);
    CHECK_EQ(load_wait(wr, &q), 0);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c2, 21, lb[k], k), 1);
    kvp_worker_destroy(wp);
    kvp_worker_destroy(wd);
    kvp_worker_destroy(wr);
    /* capacity-only is "no lookup and no put" */
    wopts cap = {.capacity = 1, .save_decode = 1};
    kvp_worker *cw = worker_open(&e, &c1, &cap);
    CHECK(cw != NULL);
    CHECK(!kvp_worker_capacity_only(cw));
    kvp_worker_destroy(cw);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* Pressure back-off (§10.3): with no segment mounted every put answers
 * NO_AVAILABLE_HANDLE; the request's next jobs are skipped until any put
 * batch fully succeeds (after a node joined), which clears the gate. */
TEST(worker_pressure_backoff)
{
    env e;
    if (env_up2(&e, 0) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t ha[NCH * HL], hb[NCH * HL];
    hashes(ha, NCH, 11);
    hashes(hb, NCH, 12);
    uint32_t sa[NCH] = {1, 2, 3, 4, 5, 6}, sb2[NCH] = {11, 12, 13, 14, 15, 16};
    fill(&c, 11, sa, NCH);
    fill(&c, 12, sb2, NCH);
    rq q;
    kvp_worker_stats st;
    rq_save(&q, "pr-a", sa, 2, ha);
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "pr-a"), 0);
    kvp_worker_drain(w);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 2);
    rq_save(&q, "pr-a", sa, 4, ha); /* backed off: not attempted */
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "pr-a"), 0);
    kvp_worker_drain(w);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0);
    CHECK_EQ(store_up(&e), 0);
    rq_save(&q, "pr-b", sb2, NCH, hb); /* another request succeeds: gate cleared */
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
    rq_save(&q, "pr-a", sa, NCH, ha); /* resumes from offset 0: the failed range too */
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* Review fix: a malformed request fails alone. Its load is reported
 * finished at once with every block invalid; the good request of the same
 * step is stored; a malformed save is still reported when it finishes. */
TEST(worker_bad_request_fails_alone)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 21);
    uint32_t sb[NCH] = {20, 21, 22, 23, 24, 25};
    uint32_t lb[NCH] = {30, 31, 32, 33, 34, 35};
    fill(&c, 21, sb, NCH);
    rq good, badl, bads;
    rq_save(&good, "ok-a", sb, NCH, h);
    rq_load(&badl, "bad-l", lb, NCH, h, 0, (uint64_t)NCH * BS);
    kvp_meta_ids two[2] = {{lb, 3, 0}, {lb + 3, 3, 0}};
    badl.r.block_ids = two;
    badl.r.ngroups = 2; /* differs from the worker's single group */
    rq_save(&bads, "bad-s", sb, NCH, h);
    bads.r.hash_len = 0; /* hashes without a length */
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    CHECK_EQ(kvp_meta_step_add_req(&s, &good.r), 0);
    CHECK_EQ(kvp_meta_step_add_req(&s, &bads.r), 0);
    CHECK_EQ(kvp_meta_step_add_req(&s, &badl.r), 0);
    kvp_worker_ids ds = {0}, dr = {0};
    const char *fin[1] = {"bad-s"};
    CHECK_EQ(kvp_worker_get_finished(w, fin, 1, &s, &ds, &dr), 0);
    CHECK(kvp_worker_ids_has(&dr, "bad-l"));  /* finished at once */
    CHECK(kvp_worker_ids_has(&ds, "bad-s"));  /* tracked, nothing in flight */
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_meta_step_free(&s);
    uint32_t errs[64];
    size_t ne = take_errors(w, errs, 64);
    CHECK_EQ(ne, NCH);
    CHECK(has_id(errs, ne, 30) && has_id(errs, ne, 35));
    int sent = 0;
    CHECK_EQ(step(w, NULL, "ok-a", &sent, NULL, "ok-a"), 0);
    for (int i = 0; i < 1000 && !sent; i++) {
        tp_sleep_ms(5);
        CHECK_EQ(step(w, NULL, NULL, &sent, NULL, "ok-a"), 0);
    }
    CHECK(sent); /* the good request of the same step was stored */
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* ------------------------------------------------------------ preemption before the forward */

typedef struct hp_arg {
    kvp_worker *w;
    const char *id;
    int done;
    pthread_mutex_t mu;
} hp_arg;

static void *hp_main(void *p)
{
    hp_arg *a = p;
    const char *ids[1] = {a->id};
    kvp_worker_handle_preemptions(a->w, ids, 1);
    pthread_mutex_lock(&a->mu);
    a->done = 1;
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static int hp_done(hp_arg *a)
{
    pthread_mutex_lock(&a->mu);
    int d = a->done;
    pthread_mutex_unlock(&a->mu);
    return d;
}

/* §14: handle_preemptions returns only once the running store of the
 * request has finished reading engine memory; its queued store is dropped,
 * another request's queued store is not. Blocks overwritten by the engine
 * right after the return never reach the store. */
TEST(worker_handle_preemptions_before_forward)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c, c2;
    cache_init(&c);
    cache_init(&c2);
    kvp_worker *w = worker_open(&e, &c, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, NULL);
    CHECK(w && w2);
    uint8_t h[NCH * HL], hb[NCH * HL];
    hashes(h, NCH, 31);
    hashes(hb, NCH, 32);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12}, ob[NCH] = {20, 21, 22, 23, 24, 25};
    fill(&c, 31, sb, NCH);
    fill(&c, 32, ob, NCH);
    /* nothing in flight: returns at once, unknown ids are fine */
    const char *none[2] = {"hp-x", NULL};
    CHECK_EQ(kvp_worker_handle_preemptions(w, none, 2), 0);
    CHECK_EQ(kvp_worker_handle_preemptions(w, NULL, 1), KVP_EINVALID_PARAMS);

    gate_set(1);
    rq q;
    rq_save(&q, "hp-a", sb, 2, h); /* runs, held in the fence */
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "hp-a"), 0);
    for (int i = 0; i < 1000 && !gate_is_waiting(); i++)
        tp_sleep_ms(2);
    CHECK(gate_is_waiting());
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    rq q2, q3;
    rq_save(&q2, "hp-a", sb, NCH, h);  /* queued: must be dropped */
    rq_save(&q3, "hp-b", ob, NCH, hb); /* queued: another request, kept */
    kvp_meta_step_add_req(&s, &q2.r);
    kvp_meta_step_add_req(&s, &q3.r);
    kvp_worker_ids ds = {0}, dr = {0};
    CHECK_EQ(kvp_worker_get_finished(w, NULL, 0, &s, &ds, &dr), 0);
    kvp_meta_step_free(&s);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);

    hp_arg a = {.w = w, .id = "hp-a"};
    pthread_mutex_init(&a.mu, NULL);
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, hp_main, &a), 0);
    tp_sleep_ms(100);
    CHECK_EQ(hp_done(&a), 0); /* the running put has not read the blocks yet */
    kvp_worker_stats st;
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0);
    gate_set(0);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&a.mu);
    /* on return the running put is complete */
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 2 * CHUNK_BYTES);
    /* the engine now reuses hp-a's blocks */
    fill(&c, 99, sb, NCH);
    kvp_worker_drain(w);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1); /* hp-b only: hp-a's queued job dropped */
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w2, NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
    CHECK_EQ(hit, 2 * BS);
    uint32_t lb[2] = {40, 41};
    rq_load(&q, "hp-l", lb, 2, h, 0, 2 * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    CHECK_EQ(block_state(&c2, 31, 40, 0), 1); /* the pre-preemption bytes */
    CHECK_EQ(block_state(&c2, 31, 41, 1), 1);
    /* forgotten: finishing it later is not reported (free not delayed) */
    int sent = 1;
    CHECK_EQ(step(w, NULL, "hp-a", &sent, NULL, "hp-a"), 0);
    CHECK_EQ(sent, 0);
    /* resumed: stores from offset 0 again (chunks 0..1 dedup) */
    rq_save(&q, "hp-a", sb, NCH, h);
    fill(&c, 31, sb, NCH);
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 2);
    kvp_worker_destroy(w);
    kvp_worker_destroy(w2);
    cache_free(&c);
    cache_free(&c2);
    env_down(&e);
}

/* The fence gets the number of the get_finished call that enqueued the job
 * (its n-th call is step n). */
TEST(worker_fence_gets_enqueuing_step)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL], h2[NCH * HL];
    hashes(h, NCH, 33);
    hashes(h2, NCH, 34);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12};
    fill(&c, 33, sb, NCH);
    pthread_mutex_lock(&gate_mu);
    fence_calls = 0;
    pthread_mutex_unlock(&gate_mu);
    CHECK_EQ(step(w, NULL, NULL, NULL, NULL, "x"), 0); /* step 1 */
    CHECK_EQ(step(w, NULL, NULL, NULL, NULL, "x"), 0); /* step 2 */
    rq q;
    rq_save(&q, "fs-a", sb, 2, h);
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "fs-a"), 0); /* step 3 */
    kvp_worker_drain(w);
    CHECK_EQ(step(w, NULL, NULL, NULL, NULL, "x"), 0); /* step 4 */
    rq_save(&q, "fs-a", sb, 4, h);
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "fs-a"), 0); /* step 5 */
    kvp_worker_drain(w);
    pthread_mutex_lock(&gate_mu);
    int n = fence_calls;
    uint64_t s0 = fence_steps[0], s1 = fence_steps[1];
    pthread_mutex_unlock(&gate_mu);
    CHECK_EQ(n, 2);
    CHECK_EQ(s0, 3);
    CHECK_EQ(s1, 5);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* ------------------------------------------------------------ aborted async loads */

/* Runs one get_finished with the given finished ids and load requests. */
static int step_n(kvp_worker *w, rq **qs, int nq, const char *const *fin, size_t nfin,
                  kvp_worker_ids *ds, kvp_worker_ids *dr)
{
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    for (int i = 0; i < nq; i++)
        kvp_meta_step_add_req(&s, &qs[i]->r);
    memset(ds, 0, sizeof *ds);
    memset(dr, 0, sizeof *dr);
    int rc = kvp_worker_get_finished(w, fin, nfin, &s, ds, dr);
    kvp_meta_step_free(&s);
    return rc;
}

/* Contract with the scheduler: a request finished while its async load is
 * queued, running, or ended but unreported is reported in done_sending once
 * (after the load ended), besides done_recving. The storage node is frozen
 * (SIGSTOP) to hold a load in its GET. */
TEST(worker_aborted_load_reported_sending)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    wopts o = {.recv_threads = 1};
    kvp_worker *w1 = worker_open(&e, &c1, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, &o);
    CHECK(w1 && w2);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 35);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12};
    fill(&c1, 35, sb, NCH);
    rq q;
    rq_save(&q, "al-s", sb, NCH, h);
    CHECK_EQ(store_wait(w1, &q), 0);

    /* normal: load reported, then finished -> in done_sending too (the
     * scheduler delays the free of every request that loaded: the same
     * answer on every rank), exactly once */
    uint32_t nb[NCH] = {50, 51, 52, 53, 54, 55};
    rq_load(&q, "al-n", nb, NCH, h, 0, NCH * BS);
    CHECK_EQ(load_wait(w2, &q), 0);
    kvp_worker_ids ds, dr;
    const char *fn[1] = {"al-n"};
    CHECK_EQ(step_n(w2, NULL, 0, fn, 1, &ds, &dr), 0);
    CHECK(kvp_worker_ids_has(&ds, "al-n"));
    CHECK(!kvp_worker_ids_has(&dr, "al-n")); /* reported before */
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    CHECK_EQ(step_n(w2, NULL, 0, fn, 1, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);

    /* ended but not yet reported: both, in the same call */
    uint32_t eb[NCH] = {56, 57, 58, 59, 60, 61};
    rq_load(&q, "al-e", eb, NCH, h, 0, NCH * BS);
    rq *one[1] = {&q};
    CHECK_EQ(step_n(w2, one, 1, NULL, 0, &ds, &dr), 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_worker_drain(w2);
    const char *fe[1] = {"al-e"};
    CHECK_EQ(step_n(w2, NULL, 0, fe, 1, &ds, &dr), 0);
    CHECK(kvp_worker_ids_has(&ds, "al-e"));
    CHECK(kvp_worker_ids_has(&dr, "al-e"));
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, 0); /* once */
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);

    /* running (held in its GET by a frozen node) and queued. kill()
     * returns before the node stops, and al-r must be inside its GET (its
     * request unread in the frozen node's socket) before al-q is queued
     * and both are finished: waited for, not slept for. */
    CHECK_EQ(kill(e.st.pid, SIGSTOP), 0);
    CHECK_EQ(tp_proc_wait_stopped(e.st.pid, 5000), 0);
    long rx0 = tp_proc_rx_queued(e.st.pid);
    CHECK(rx0 >= 0);
    uint32_t rb[NCH] = {30, 31, 32, 33, 34, 35}, qb[NCH] = {40, 41, 42, 43, 44, 45};
    rq qr, qq;
    rq_load(&qr, "al-r", rb, NCH, h, 0, NCH * BS);
    rq_load(&qq, "al-q", qb, NCH, h, 0, NCH * BS);
    rq *first[1] = {&qr}, *second[1] = {&qq};
    CHECK_EQ(step_n(w2, first, 1, NULL, 0, &ds, &dr), 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    for (int i = 0; i < 5000 && tp_proc_rx_queued(e.st.pid) <= rx0; i++)
        tp_sleep_ms(2);
    CHECK(tp_proc_rx_queued(e.st.pid) > rx0); /* the single receive thread is in al-r's GET */
    CHECK_EQ(step_n(w2, second, 1, NULL, 0, &ds, &dr), 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    const char *fin[2] = {"al-r", "al-q"};
    CHECK_EQ(step_n(w2, NULL, 0, fin, 2, &ds, &dr), 0);
    CHECK(kvp_worker_ids_has(&ds, "al-q")); /* dropped unexecuted: ended */
    CHECK(kvp_worker_ids_has(&dr, "al-q"));
    CHECK(!kvp_worker_ids_has(&ds, "al-r")); /* still running */
    CHECK(!kvp_worker_ids_has(&dr, "al-r"));
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK(!kvp_worker_ids_has(&ds, "al-r"));
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    CHECK_EQ(kill(e.st.pid, SIGCONT), 0);
    int sent = 0, recvd = 0;
    for (int i = 0; i < 2000 && !sent; i++) {
        tp_sleep_ms(5);
        CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
        sent = kvp_worker_ids_has(&ds, "al-r");
        recvd |= kvp_worker_ids_has(&dr, "al-r");
        kvp_worker_ids_free(&ds);
        kvp_worker_ids_free(&dr);
    }
    CHECK(sent);
    CHECK(recvd); /* never later than done_sending */
    /* after done_sending no block of either request changes any more */
    uint8_t snap[NCH][2];
    for (int k = 0; k < NCH; k++) {
        snap[k][0] = slot(&c2, 0, 0, rb[k], 0)[0];
        snap[k][1] = slot(&c2, 0, 0, qb[k], 0)[0];
        CHECK_EQ(block_state(&c2, 35, qb[k], k), 0); /* the queued load never ran */
    }
    kvp_worker_drain(w2);
    tp_sleep_ms(50);
    for (int k = 0; k < NCH; k++) {
        CHECK_EQ(slot(&c2, 0, 0, rb[k], 0)[0], snap[k][0]);
        CHECK_EQ(slot(&c2, 0, 0, qb[k], 0)[0], snap[k][1]);
    }
    CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, 0); /* exactly once */
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* ------------------------------------------------------------ hybrid groups */

/* FA (B = 32) + SWA (B = 8, window 8): L = 32, H = 8. */
static const kvp_worker_group fa_swa[2] = {
    {.spec = {.kind = KVP_COORD_FULL, .block_size = 32},
     .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 1},
    {.spec = {.kind = KVP_COORD_SWA, .block_size = 8, .window = 8, .spec_tag = 1},
     .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 1},
};

typedef struct rq2 {
    kvp_meta_ids ids[2];
    kvp_meta_load_spec ls;
    kvp_meta_req r;
} rq2;

/* A save of the first `tokens` tokens over two groups (hashes at H). */
static void rq2_save(rq2 *q, const char *id, uint32_t *g0, uint32_t n0, uint32_t *g1, uint32_t n1,
                     const uint8_t *h, uint32_t nh, uint64_t tokens, const uint32_t *toks,
                     uint32_t ntoks)
{
    memset(q, 0, sizeof *q);
    q->ids[0] = (kvp_meta_ids){g0, n0, 0};
    q->ids[1] = (kvp_meta_ids){g1, n1, 0};
    q->r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_NEW, .token_len_chunk = tokens,
        .block_ids = q->ids, .ngroups = 2, .block_hashes = h, .nhashes = nh, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET, .token_ids = toks,
        .n_token_ids = ntoks,
    };
}

static void rq2_load(rq2 *q, const char *id, uint32_t *g0, uint32_t n0, uint32_t *g1, uint32_t n1,
                     const uint8_t *h, uint32_t nh, uint64_t local, uint64_t hit)
{
    rq2_save(q, id, g0, n0, g1, n1, h, nh, 0, NULL, 0);
    q->r.kind = KVP_META_LOAD;
    q->r.can_save = KVP_META_UNSET;
    q->ls = (kvp_meta_load_spec){.vllm_cached_tokens = local, .kvpool_cached_tokens = hit,
                                 .can_load = true};
    q->r.load_spec = &q->ls;
}

/* Stores a request and waits until it is reported finished sending. */
static int store2_wait(kvp_worker *w, rq2 *q)
{
    rq tmp = {.id = q->r.req_id.p, .r = q->r};
    return store_wait(w, &tmp);
}

/* Event of (group, start) in ev, or NULL. */
static const kvp_worker_event *ev_find(const kvp_worker_event *ev, size_t n, uint32_t g,
                                       uint64_t start)
{
    for (size_t i = 0; i < n; i++)
        if (ev[i].group == g && ev[i].start == start)
            return &ev[i];
    return NULL;
}

/* Checks one BlockStored event: group, B_g, token range and slice, and the
 * last sub-hash of the chunk (H < B). */
static int ev_ok(const kvp_worker_event *e, uint32_t g, uint32_t B, uint64_t start,
                 const uint8_t *h, const uint32_t *toks)
{
    REQUIRE(e != NULL);
    REQUIRE(e->group == g);
    REQUIRE(e->block_size == B);
    REQUIRE(e->start == start && e->end == start + B);
    REQUIRE(e->hash_len == HL);
    REQUIRE(memcmp(e->hash, h + ((start + B) / 8 - 1) * HL, HL) == 0);
    REQUIRE(e->n_token_ids == B && e->token_ids != NULL);
    REQUIRE(memcmp(e->token_ids, toks + start, B * sizeof *toks) == 0);
    return 0;
}

/* §10.3 golden over FA32 + SWA8/W8: T = 64 stores FA hs3, hs7 and SWA only
 * the in-window chunks hs3, hs7; a delta save from saved offset 32 stores FA
 * hs7 and SWA hs7 only. KV events carry group, B_g, token slice and the last
 * sub-hash (H = 8 < B = 32). */
TEST(worker_hybrid_delta_save_swa_window_events)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c, c2;
    cache_init(&c);
    cache_init(&c2);
    wopts o = {.groups = fa_swa, .ngroups = 2, .hbs = 8};
    kvp_worker *w = worker_open(&e, &c, &o);
    kvp_worker *w2 = worker_open(&e, &c2, &o);
    CHECK(w && w2);
    uint8_t h[8 * HL], h2[8 * HL];
    hashes(h, 8, 41);
    hashes(h2, 8, 42);
    uint32_t toks[64];
    for (int i = 0; i < 64; i++)
        toks[i] = 1000u + (uint32_t)i * 7u;
    uint32_t fa[2] = {1, 2}, swa[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    fill(&c, 41, fa, 2);
    fill(&c, 42, swa, 8);
    kvp_worker_stats st;
    kvp_worker_event *ev = NULL;
    size_t nev = 0;

    /* whole 64 tokens at once: SWA only in the window before each boundary */
    rq2 q;
    rq2_save(&q, "hy-w", fa, 2, swa, 8, h2, 8, 64, toks, 64);
    CHECK_EQ(store2_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 4);
    CHECK_EQ(kvp_worker_take_events(w, &ev, &nev), 0);
    CHECK_EQ(nev, 4);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 0, 0), 0, 32, 0, h2, toks), 0);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 0, 32), 0, 32, 32, h2, toks), 0);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 1, 24), 1, 8, 24, h2, toks), 0);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 1, 56), 1, 8, 56, h2, toks), 0);
    const kvp_worker_event *p = ev_find(ev, nev, 1, 56);
    CHECK(p && p->has_parent && memcmp(p->parent, h2 + 3 * HL, HL) == 0); /* same group */
    kvp_worker_events_free(ev, nev);

    /* delta: 32 tokens, then 64 from saved offset 32 */
    rq2_save(&q, "hy-d", fa, 2, swa, 8, h, 8, 32, toks, 64);
    CHECK_EQ(step(w, &(rq){.id = "hy-d", .r = q.r}, NULL, NULL, NULL, "hy-d"), 0);
    kvp_worker_drain(w);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(kvp_worker_take_events(w, &ev, &nev), 0);
    CHECK_EQ(nev, 2);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 0, 0), 0, 32, 0, h, toks), 0);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 1, 24), 1, 8, 24, h, toks), 0);
    kvp_worker_events_free(ev, nev);
    rq2_save(&q, "hy-d", fa, 2, swa, 8, h, 8, 64, toks, 64);
    CHECK_EQ(store2_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2); /* not re-checking 0..32 */
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].existing_keys, 0);
    CHECK_EQ(kvp_worker_take_events(w, &ev, &nev), 0);
    CHECK_EQ(nev, 2);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 0, 32), 0, 32, 32, h, toks), 0);
    CHECK_EQ(ev_ok(ev_find(ev, nev, 1, 56), 1, 8, 56, h, toks), 0);
    kvp_worker_events_free(ev, nev);

    /* another instance: lookup 65 -> 64; load 64 writes FA blocks and only
     * the SWA blocks inside the window (§18 hma: recv skips SWA blocks
     * before the window) */
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w2, 65, h, 8, HL, 1, &hit), 0);
    CHECK_EQ(hit, 64);
    uint32_t lfa[2] = {30, 31}, lswa[8] = {40, 41, 42, 43, 44, 45, 46, 47};
    rq2 l;
    rq2_load(&l, "hy-l", lfa, 2, lswa, 8, h, 8, 0, 64);
    rq lt = {.id = "hy-l", .r = l.r};
    CHECK_EQ(load_wait(w2, &lt), 0);
    uint32_t errs[NB];
    CHECK_EQ(take_errors(w2, errs, NB), 0);
    CHECK_EQ(block_state(&c2, 41, 30, 0), 1);
    CHECK_EQ(block_state(&c2, 41, 31, 1), 1);
    for (int k = 0; k < 8; k++)
        CHECK_EQ(block_state(&c2, 42, lswa[k], k), k == 7 ? 1 : 0);
    kvp_worker_take_stats(w2, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, 3);
    kvp_worker_destroy(w);
    kvp_worker_destroy(w2);
    cache_free(&c);
    cache_free(&c2);
    env_down(&e);
}

/* §4.5 over two groups: TP 2, one KV head (factor 2 for FA32 and SWA8/W8).
 * Rank r stores chunk c of group g iff c % 2 == (r + g) % 2 on the ABSOLUTE
 * chunk index, also for a delta save from saved offset 64; together the
 * ranks cover every needed chunk once, so both find the whole prefix and
 * load it without errors. */
TEST(worker_striding_phase_by_rank_two_groups)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[16 * HL];
    hashes(h, 16, 43);
    uint32_t fa[4] = {1, 2, 3, 4}, swa[16];
    for (int i = 0; i < 16; i++)
        swa[i] = 10u + (uint32_t)i;
    cache c[2];
    kvp_worker *w[2];
    for (int r = 0; r < 2; r++) {
        cache_init(&c[r]);
        wopts o = {.tp_rank = r, .tp_size = 2, .groups = fa_swa, .ngroups = 2, .hbs = 8};
        w[r] = worker_open(&e, &c[r], &o);
        CHECK(w[r] != NULL);
        fill(&c[r], 43, fa, 4);
        fill(&c[r], 44, swa, 16);
    }
    for (int pass = 0; pass < 2; pass++) {
        uint64_t T = pass ? 128 : 64;
        for (int r = 0; r < 2; r++) {
            rq2 q;
            rq2_save(&q, "st-a", fa, 4, swa, 16, h, 16, T, NULL, 0);
            if (pass)
                CHECK_EQ(store2_wait(w[r], &q), 0);
            else {
                rq t = {.id = "st-a", .r = q.r};
                CHECK_EQ(step(w[r], &t, NULL, NULL, NULL, "st-a"), 0);
                kvp_worker_drain(w[r]);
            }
            kvp_worker_event *ev = NULL;
            size_t nev = 0;
            kvp_worker_take_events(w[r], &ev, &nev);
            uint64_t lo = pass ? 64 : 0;
            if (r == 0) { /* FA even chunks, SWA odd (= every in-window chunk) */
                CHECK_EQ(nev, 3);
                CHECK(ev_find(ev, nev, 0, lo) != NULL);
                CHECK(ev_find(ev, nev, 1, lo + 24) != NULL);
                CHECK(ev_find(ev, nev, 1, lo + 56) != NULL);
            } else { /* FA odd chunks, no SWA chunk has its phase */
                CHECK_EQ(nev, 1);
                CHECK(ev_find(ev, nev, 0, lo + 32) != NULL);
            }
            kvp_worker_events_free(ev, nev);
        }
    }
    for (int r = 0; r < 2; r++) {
        uint32_t hit = 0;
        CHECK_EQ(kvp_worker_lookup(w[r], 129, h, 16, HL, 1, &hit), 0);
        CHECK_EQ(hit, 128);
        uint32_t lfa[4] = {30, 31, 32, 33}, lswa[16];
        for (int i = 0; i < 16; i++)
            lswa[i] = 40u + (uint32_t)i;
        rq2 l;
        rq2_load(&l, "st-l", lfa, 4, lswa, 16, h, 16, 0, 128);
        rq lt = {.id = "st-l", .r = l.r};
        CHECK_EQ(load_wait(w[r], &lt), 0);
        uint32_t errs[NB];
        CHECK_EQ(take_errors(w[r], errs, NB), 0);
        for (int k = 0; k < 4; k++)
            CHECK_EQ(block_state(&c[r], 43, lfa[k], k), 1);
        CHECK_EQ(block_state(&c[r], 44, lswa[15], 15), 1);
    }
    for (int r = 0; r < 2; r++) {
        kvp_worker_destroy(w[r]);
        cache_free(&c[r]);
    }
    env_down(&e);
}

/* DCP 2 (TP 2, factor 1): every rank stores every chunk in its own
 * namespace; a lookup needs both namespaces; each rank loads its own bytes
 * with no error (the put covers every rank's GET namespace). */
TEST(worker_dcp2_namespaces)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[NCH * HL];
    hashes(h, NCH, 45);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6}, lb[NCH] = {30, 31, 32, 33, 34, 35};
    cache c[2];
    kvp_worker *w[2];
    for (int r = 0; r < 2; r++) {
        cache_init(&c[r]);
        wopts o = {.tp_rank = r, .tp_size = 2, .heads = 1, .dcp_rank = r, .dcp_size = 2};
        w[r] = worker_open(&e, &c[r], &o);
        CHECK(w[r] != NULL);
        fill(&c[r], 45 + (uint32_t)r, sb, NCH);
    }
    uint32_t hit = 9;
    for (int r = 0; r < 2; r++) {
        rq q;
        rq_save(&q, "dcp-a", sb, NCH, h);
        CHECK_EQ(store_wait(w[r], &q), 0);
        kvp_worker_stats st;
        kvp_worker_take_stats(w[r], &st);
        CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, NCH); /* no striding */
        CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, NCH * CHUNK_BYTES);
        CHECK_EQ(kvp_worker_lookup(w[0], NCH * BS + 1, h, NCH, HL, 1, &hit), 0);
        CHECK_EQ(hit, r == 0 ? 0u : (uint32_t)(NCH * BS)); /* every DCP namespace needed */
    }
    for (int r = 0; r < 2; r++) {
        rq q;
        rq_load(&q, "dcp-l", lb, NCH, h, 0, NCH * BS);
        CHECK_EQ(load_wait(w[r], &q), 0);
        uint32_t errs[NB];
        CHECK_EQ(take_errors(w[r], errs, NB), 0);
        for (int k = 0; k < NCH; k++)
            CHECK_EQ(block_state(&c[r], 45 + (uint32_t)r, lb[k], k), 1);
    }
    for (int r = 0; r < 2; r++) {
        kvp_worker_destroy(w[r]);
        cache_free(&c[r]);
    }
    env_down(&e);
}

/* ------------------------------------------------------------ loads §10.6 / §10.7 */

/* Loads NCH chunks of hashes h into blocks lb with a worker at TP rank 1 of
 * 2 (one KV head: the shared namespace) and the given staging budget;
 * returns the load-error ids in errs (*ne) and the load_get stats. */
static int load_rank1(env *e, cache *c, uint64_t budget, const uint8_t *h, uint32_t *lb,
                      uint32_t *errs, size_t *ne, kvp_worker_stats *st)
{
    wopts o = {.tp_rank = 1, .tp_size = 2, .heads = 1, .staging = budget};
    kvp_worker *w = worker_open(e, c, &o);
    REQUIRE(w != NULL);
    rq q;
    rq_load(&q, "rot-l", lb, NCH, h, 0, NCH * BS);
    int rc = load_wait(w, &q);
    *ne = take_errors(w, errs, NB);
    kvp_worker_take_stats(w, st);
    kvp_worker_destroy(w);
    return rc;
}

/* Rotation at tp_rank 1 (order: chunks 1..5, 0), staging split, stop after
 * the first failing sub-batch, oversized key, a dead node (all blocks
 * invalid). Staging per key = 12288. */
TEST(worker_load_rotation_split_stop_oversize)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache cs;
    cache_init(&cs);
    kvp_worker *ws = worker_open(&e, &cs, &(wopts){.heads = 1});
    CHECK(ws != NULL);
    uint8_t hm[NCH * HL], hk[NCH * HL];
    hashes(hm, NCH, 46);
    hashes(hk, NCH, 47);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6}, sb2[NCH] = {7, 8, 9, 10, 11, 12};
    fill(&cs, 46, sb, NCH);
    fill(&cs, 47, sb2, NCH);
    rq q;
    rq_save(&q, "rot-m", sb, NCH, hm);
    CHECK_EQ(store_wait(ws, &q), 0);
    rq_save(&q, "rot-k", sb2, NCH, hk);
    CHECK_EQ(store_wait(ws, &q), 0);
    /* chunk 2 of hm removed between save and load */
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    struct kvp_key_meta md;
    CHECK_EQ(kvp_key_meta_init(&md, MODEL, NULL, 0, 0, 0, 0, 0), 0);
    char key[256];
    size_t klen;
    CHECK_EQ(kvp_key_build(&md, hm + 2 * HL, HL, key, sizeof key, &klen), 0);
    CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
    kvp_client_close(cl);

    uint32_t lb[NCH] = {20, 21, 22, 23, 24, 25}, errs[NB];
    size_t ne = 0;
    kvp_worker_stats st;
    const uint64_t two = (2 * 12288 * 10 + 8) / 9; /* usable = 2 keys */

    /* A: no budget: one GET of every key; only chunk 2 invalid */
    cache c;
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 0, hm, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, 1);
    CHECK(has_id(errs, ne, lb[2]));
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].failed_keys, 1);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c, 46, lb[k], k), k == 2 ? 0 : 1);
    cache_free(&c);

    /* B: budget of 2 keys: batches {1,2} {3,4} {5,0}: the first fails at
     * chunk 2, the later ones are not attempted and reported invalid */
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, two, hm, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, NCH - 1);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(has_id(errs, ne, lb[k]), k != 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, 2);
    CHECK_EQ(block_state(&c, 46, lb[1], 1), 1);
    for (int k = 0; k < NCH; k++)
        if (k != 1)
            CHECK_EQ(block_state(&c, 46, lb[k], k), 0);
    cache_free(&c);

    /* C: budget of 2 keys, all present: 3 GETs of 2 keys, every byte right */
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, two, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 3);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].bytes, NCH * CHUNK_BYTES);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c, 47, lb[k], k), 1);
    CHECK(others_zero(&c, lb, NCH));
    cache_free(&c);

    /* D: the budget holds all: no split */
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, (NCH * 12288 * 10 + 8) / 9, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].keys, NCH);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c, 47, lb[k], k), 1);
    cache_free(&c);

    /* E: a key larger than the raw budget: no GET, every block invalid */
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 12287, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, NCH);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 0);
    CHECK(others_zero(&c, NULL, 0));
    cache_free(&c);

    /* F: the storage node died: every block of the load is reported */
    tp_store_kill(&e.st);
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 0, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, NCH);
    for (int k = 0; k < NCH; k++) {
        CHECK(has_id(errs, ne, lb[k]));
        CHECK(block_state(&c, 47, lb[k], k) >= 0); /* loaded or untouched */
    }
    cache_free(&c);

    kvp_worker_destroy(ws);
    cache_free(&cs);
    env_down(&e);
}

/* The seeds' staging rule: enable_offload and no budget = 1280 MiB, of
 * which $VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO is usable (here a ratio
 * that leaves exactly 2 keys of 12288 staging bytes: 3 GETs of 2); an
 * explicit budget wins; a bad ratio is refused. The tier log runs too. */
TEST(worker_disk_staging_default_and_ratio)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache cs;
    cache_init(&cs);
    kvp_worker *ws = worker_open(&e, &cs, &(wopts){.heads = 1});
    CHECK(ws != NULL);
    uint8_t hk[NCH * HL];
    hashes(hk, NCH, 48);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6}, lb[NCH] = {20, 21, 22, 23, 24, 25}, errs[NB];
    fill(&cs, 48, sb, NCH);
    rq q;
    rq_save(&q, "dsk-s", sb, NCH, hk);
    CHECK_EQ(store_wait(ws, &q), 0);
    kvp_worker_destroy(ws);
    char plain[256];
    snprintf(plain, sizeof plain, "%s", e.cfg);
    snprintf(e.cfg + strlen(e.cfg) - 1, sizeof e.cfg - strlen(e.cfg) + 1,
             ", \"enable_offload\": true}");
    setenv("VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO", "1.8310919404e-05", 1);
    setenv("VLLM_MOONCAKE_STORE_TIER_LOG", "1", 1);
    size_t ne = 0;
    kvp_worker_stats st;
    cache c;
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 0, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(ne, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 3);
    for (int k = 0; k < NCH; k++)
        CHECK_EQ(block_state(&c, 48, lb[k], k), 1);
    cache_free(&c);
    /* without enable_offload: no budget, one GET */
    char off[256];
    snprintf(off, sizeof off, "%s", e.cfg);
    snprintf(e.cfg, sizeof e.cfg, "%s", plain);
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 0, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    cache_free(&c);
    /* an explicit budget wins over the default */
    snprintf(e.cfg, sizeof e.cfg, "%s", off);
    cache_init(&c);
    CHECK_EQ(load_rank1(&e, &c, 1ull << 40, hk, lb, errs, &ne, &st), 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    cache_free(&c);
    /* a ratio outside (0, 1] is refused at create */
    setenv("VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO", "1.5", 1);
    cache_init(&c);
    CHECK(worker_open(&e, &c, NULL) == NULL);
    cache_free(&c);
    unsetenv("VLLM_MOONCAKE_DISK_STAGING_USABLE_RATIO");
    unsetenv("VLLM_MOONCAKE_STORE_TIER_LOG");
    cache_free(&cs);
    env_down(&e);
}

/* §10.3: only NO_AVAILABLE_HANDLE (-200) backs a request off. A storage
 * node that died while still mounted fails the transfer with another code:
 * the request's next job is attempted again. */
TEST(worker_only_no_handle_backs_off)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 48);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6};
    fill(&c, 48, sb, NCH);
    tp_store_kill(&e.st);
    kvp_worker_stats st;
    rq q;
    rq_save(&q, "nh-a", sb, 2, h);
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "nh-a"), 0);
    kvp_worker_drain(w);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1);
    CHECK(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys + st.op[KVP_WORKER_OP_SAVE_PUT].errors > 0);
    rq_save(&q, "nh-a", sb, 4, h); /* not backed off: attempted, from offset 0 */
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "nh-a"), 0);
    kvp_worker_drain(w);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 4);
    /* what the store still answers after the worker's puts (a node that
     * is unmounted stays so: the puts above saw no -200 either; the dead
     * segment was reported failing, but it is the only one, so placement
     * still tries it) */
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    uint8_t buf[64] = {1};
    kvp_iov iv = {buf, sizeof buf};
    const kvp_iov *ivp[1] = {&iv};
    size_t niv = 1;
    const char *k[1] = {"probe-key"};
    int64_t res = 0;
    int prc = kvp_client_batch_put_from_multi_buffers(cl, k, ivp, &niv, 1, &res);
    fprintf(stderr, "    probe put: rc %d result %lld\n", prc, (long long)res);
    CHECK(prc < 0 || (res < 0 && res != KVP_ENO_AVAILABLE_HANDLE));
    kvp_client_close(cl);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* §10.4 partial tail (FA16 + Mamba16, H = 4, boundary 20): with no segment
 * the tail put fails with NO_AVAILABLE_HANDLE, activates the gate and
 * leaves the saved offset at 0 (the normal save of that job is not done);
 * the next tail job of the request honours the gate; after another
 * request's success the request saves from offset 0. A NULL source block
 * is skipped. */
TEST(worker_partial_tail_pressure_and_null)
{
    env e;
    if (env_up2(&e, 0) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    wopts o = {.mamba = 1};
    kvp_worker *w = worker_open(&e, &c, &o);
    CHECK(w != NULL);
    uint8_t h[8 * HL], hb[8 * HL], hc[8 * HL];
    hashes(h, 8, 51);
    hashes(hb, 8, 52);
    hashes(hc, 8, 53);
    uint32_t fa[2] = {3, 5}, mb[2] = {0, 9}, cow[1] = {7};
    fill(&c, 51, fa, 2);
    fill(&c, 52, cow, 1);
    kvp_meta_tail tail = {.group_id = 1, .cow_block_id = 7, .boundary_tokens = 20};
    rq2 q;
    rq2_save(&q, "tl-a", fa, 2, mb, 2, h, 5, 16, NULL, 0);
    q.r.tails = &tail;
    q.r.ntails = 1;
    q.r.kind = KVP_META_TAIL;
    kvp_worker_stats st;
    CHECK_EQ(step(w, &(rq){.id = "tl-a", .r = q.r}, NULL, NULL, NULL, "tl-a"), 0);
    kvp_worker_drain(w);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 1); /* the tail put only */
    /* the handed-off Mamba block and FA chunk 1 (from the last L boundary to
     * 20); FA chunk 0 is the normal save's */
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 2);
    /* gate active: the request's next (tail) job is skipped entirely */
    CHECK_EQ(step(w, &(rq){.id = "tl-a", .r = q.r}, NULL, NULL, NULL, "tl-a"), 0);
    kvp_worker_drain(w);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0);

    /* a node joins; another request's put fully succeeds: gate cleared */
    CHECK_EQ(store_up(&e), 0);
    uint32_t fb[1] = {20}, mbb[1] = {0};
    fill(&c, 53, fb, 1);
    rq2 qb;
    rq2_save(&qb, "tl-b", fb, 1, mbb, 1, hb, 4, 16, NULL, 0);
    CHECK_EQ(store2_wait(w, &qb), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 0);
    kvp_worker_event *ev = NULL;
    size_t nev = 0;
    kvp_worker_take_events(w, &ev, &nev);
    kvp_worker_events_free(ev, nev);
    /* tl-a resumes: its offset is still 0, so FA chunks 0 and 1 are saved */
    rq2_save(&q, "tl-a", fa, 2, mb, 2, h, 8, 32, NULL, 0);
    CHECK_EQ(store2_wait(w, &q), 0);
    kvp_worker_take_events(w, &ev, &nev);
    CHECK(ev_find(ev, nev, 0, 0) != NULL);
    CHECK(ev_find(ev, nev, 0, 16) != NULL);
    kvp_worker_events_free(ev, nev);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].failed_keys, 0);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 2 * CHUNK_BYTES); /* FA chunks 0, 1 */

    /* tail alone with the store up: 2 keys (the hand-off and FA 16..20) */
    uint32_t fc[2] = {30, 31}, mc[2] = {0, 32};
    fill(&c, 54, fc, 2);
    rq2 qc;
    rq2_save(&qc, "tl-c", fc, 2, mc, 2, hc, 5, 0, NULL, 0);
    qc.r.tails = &tail;
    qc.r.ntails = 1;
    qc.r.kind = KVP_META_TAIL;
    CHECK_EQ(store2_wait(w, &qc), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 2 * CHUNK_BYTES);
    kvp_worker_take_events(w, &ev, &nev);
    CHECK_EQ(nev, 2);
    CHECK(ev_find(ev, nev, 0, 0) == NULL);
    const kvp_worker_event *t = ev_find(ev, nev, 0, 16);
    CHECK(t && t->end == 20 && memcmp(t->hash, hc + 4 * HL, HL) == 0);
    t = ev_find(ev, nev, 1, 16);
    CHECK(t && t->end == 20 && memcmp(t->hash, hc + 4 * HL, HL) == 0);
    CHECK(ev_find(ev, nev, 1, 0) == NULL);
    kvp_worker_events_free(ev, nev);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* §10.3: token_len_chunk is floored to L (33 -> 2 keys; 15 -> no RPC at
 * all, the pin released and the request reported); a put the engine
 * cannot fence is abandoned (save_put error), the pin is released and the
 * range is retried by the next job (offset not advanced). */
TEST(worker_clamp_to_L_and_failed_fence)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c;
    cache_init(&c);
    kvp_worker *w = worker_open(&e, &c, NULL);
    CHECK(w != NULL);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 55);
    uint32_t sb[NCH] = {1, 2, 3, 4, 5, 6};
    fill(&c, 55, sb, NCH);
    kvp_worker_stats st;
    rq q;
    rq_save(&q, "cl-a", sb, 1, h);
    q.r.token_len_chunk = 15;
    CHECK_EQ(store_wait(w, &q), 0);
    CHECK_EQ(kvp_worker_take_stats(w, &st), 0); /* no RPC below L */
    rq_save(&q, "cl-b", sb, 3, h);
    q.r.token_len_chunk = 33;
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].keys, 2);

    uint8_t h2[NCH * HL];
    hashes(h2, NCH, 56);
    pthread_mutex_lock(&gate_mu);
    fence_fail = 1;
    pthread_mutex_unlock(&gate_mu);
    rq_save(&q, "cl-c", sb, 2, h2);
    CHECK_EQ(store_wait(w, &q), 0); /* pin released: reported */
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].errors, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 0);
    pthread_mutex_lock(&gate_mu);
    fence_fail = 0;
    pthread_mutex_unlock(&gate_mu);
    /* a failed job of the same request: the next job retries its range */
    pthread_mutex_lock(&gate_mu);
    fence_fail = 1;
    pthread_mutex_unlock(&gate_mu);
    uint8_t h3[NCH * HL];
    hashes(h3, NCH, 57);
    rq_save(&q, "cl-e", sb, 2, h3);
    CHECK_EQ(step(w, &q, NULL, NULL, NULL, "cl-e"), 0);
    kvp_worker_drain(w);
    pthread_mutex_lock(&gate_mu);
    fence_fail = 0;
    pthread_mutex_unlock(&gate_mu);
    rq_save(&q, "cl-e", sb, 4, h3);
    CHECK_EQ(store_wait(w, &q), 0);
    kvp_worker_take_stats(w, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].errors, 1);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].count, 2);
    CHECK_EQ(st.op[KVP_WORKER_OP_SAVE_PUT].bytes, 4 * CHUNK_BYTES); /* 0..1 retried */
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* §18 hma e2e: FA16 + SWA16/W32 saves 64 tokens; lookup(65) = 64,
 * lookup(64) = 48 (re-derived below the prompt). After SWA chunks 0-1 are
 * evicted from the store: lookup(65) = 64 still (only the window is
 * needed), lookup(64) = 0 (no lower boundary has its window). */
TEST(worker_fa_swa_lookup_after_eviction)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    static const kvp_worker_group g[2] = {
        {.spec = {.kind = KVP_COORD_FULL, .block_size = 16},
         .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 8},
        {.spec = {.kind = KVP_COORD_SWA, .block_size = 16, .window = 32, .spec_tag = 1},
         .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 8},
    };
    cache c;
    cache_init(&c);
    wopts o = {.groups = g, .ngroups = 2};
    kvp_worker *w = worker_open(&e, &c, &o);
    CHECK(w != NULL);
    uint8_t h[4 * HL];
    hashes(h, 4, 58);
    uint32_t fa[4] = {1, 2, 3, 4}, swa[4] = {5, 6, 7, 8};
    fill(&c, 58, fa, 4);
    fill(&c, 59, swa, 4);
    rq2 q;
    rq2_save(&q, "fs-a", fa, 4, swa, 4, h, 4, 64, NULL, 0);
    CHECK_EQ(store2_wait(w, &q), 0);
    uint32_t hit = 0;
    CHECK_EQ(kvp_worker_lookup(w, 65, h, 4, HL, 1, &hit), 0);
    CHECK_EQ(hit, 64);
    CHECK_EQ(kvp_worker_lookup(w, 64, h, 4, HL, 1, &hit), 0);
    CHECK_EQ(hit, 48);
    kvp_client *cl = NULL;
    CHECK_EQ(kvp_client_open(e.cfg, &cl, NULL, 0), 0);
    struct kvp_key_meta md;
    CHECK_EQ(kvp_key_meta_init(&md, MODEL, NULL, 0, 0, 0, 0, 1), 0);
    for (int k = 0; k < 2; k++) {
        char key[256];
        size_t klen;
        CHECK_EQ(kvp_key_build(&md, h + (size_t)k * HL, HL, key, sizeof key, &klen), 0);
        CHECK_EQ(kvp_client_remove(cl, key, 1), 0);
    }
    kvp_client_close(cl);
    CHECK_EQ(kvp_worker_lookup(w, 65, h, 4, HL, 1, &hit), 0);
    CHECK_EQ(hit, 64);
    CHECK_EQ(kvp_worker_lookup(w, 64, h, 4, HL, 1, &hit), 0);
    CHECK_EQ(hit, 0);
    kvp_worker_destroy(w);
    cache_free(&c);
    env_down(&e);
}

/* A running load of a request the engine finished stops after its current
 * sub-batch (budget: 2 keys per GET; the first GET is held by a frozen
 * node): one GET only, later blocks untouched, reported once in both sets. */
TEST(worker_aborted_load_stops_after_sub_batch)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    cache c1, c2;
    cache_init(&c1);
    cache_init(&c2);
    wopts o = {.recv_threads = 1, .staging = (2 * 12288 * 10 + 8) / 9};
    kvp_worker *w1 = worker_open(&e, &c1, NULL);
    kvp_worker *w2 = worker_open(&e, &c2, &o);
    CHECK(w1 && w2);
    uint8_t h[NCH * HL];
    hashes(h, NCH, 61);
    uint32_t sb[NCH] = {2, 4, 6, 8, 10, 12};
    fill(&c1, 61, sb, NCH);
    rq q;
    rq_save(&q, "as-s", sb, NCH, h);
    CHECK_EQ(store_wait(w1, &q), 0);
    CHECK_EQ(kill(e.st.pid, SIGSTOP), 0);
    CHECK_EQ(tp_proc_wait_stopped(e.st.pid, 5000), 0);
    long rx0 = tp_proc_rx_queued(e.st.pid);
    CHECK(rx0 >= 0);
    uint32_t lb[NCH] = {30, 31, 32, 33, 34, 35};
    rq_load(&q, "as-l", lb, NCH, h, 0, NCH * BS);
    kvp_worker_ids ds, dr;
    rq *one[1] = {&q};
    CHECK_EQ(step_n(w2, one, 1, NULL, 0, &ds, &dr), 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    for (int i = 0; i < 5000 && tp_proc_rx_queued(e.st.pid) <= rx0; i++)
        tp_sleep_ms(2); /* until the GET waits in the frozen node */
    const char *fin[1] = {"as-l"};
    CHECK_EQ(step_n(w2, NULL, 0, fin, 1, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, 0); /* still in its first GET */
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    CHECK_EQ(kill(e.st.pid, SIGCONT), 0);
    kvp_worker_drain(w2);
    CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK(kvp_worker_ids_has(&ds, "as-l"));
    CHECK(kvp_worker_ids_has(&dr, "as-l"));
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_worker_stats st;
    kvp_worker_take_stats(w2, &st);
    CHECK_EQ(st.op[KVP_WORKER_OP_LOAD_GET].count, 1);
    for (int k = 2; k < NCH; k++)
        CHECK_EQ(block_state(&c2, 61, lb[k], k), 0);
    CHECK_EQ(step_n(w2, NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, 0);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_worker_destroy(w1);
    kvp_worker_destroy(w2);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}
