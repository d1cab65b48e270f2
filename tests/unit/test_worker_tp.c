/* test_worker_tp.c -- the TP-independent layout (kvp_worker_cfg.tp_independent,
 * keys "@kvh:<h>") against a real kvpool master and storage node: engines of
 * TP 1, 2 and 4 over one model of 4 KV heads (2 layers, K/V planes, NHD
 * blocks of 16 tokens) share their prefixes; each rank's load writes
 * exactly its own heads and moves exactly its share of the KV; a model of 2
 * KV heads on TP 4 (heads replicated on two ranks each) and an MLA latent on
 * TP 2 store each head once; a prefix counts as hit only when every head is
 * in the pool; the rank layout (tp_independent 0) shares nothing across TP
 * sizes (the contrast). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/mem.h"
#include "connector/keys.h"
#include "connector/worker.h"
#include "harness.h"
#include "kvpool.h"
#include "proc.h"

#define NB 32     /* blocks per layer */
#define BS 16     /* tokens per block */
#define HD 4      /* bytes per head per token */
#define LAYERS 2
#define HL 32     /* hash length */
#define NCH 5     /* chunks of the test request */
#define MODEL "org/tp-model"
/* the bytes of one head of one block, and of a whole block of G heads */
#define HEAD_BLOCK (LAYERS * 2 * BS * HD)

typedef struct env {
    tp_master m;
    tp_store st;
    char cfg[256];
} env;

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, NULL) != 0 ||
        tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "32MiB", NULL}))
        return -1;
    snprintf(e->cfg, sizeof e->cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}",
             e->m.addr);
    return 0;
}

static void env_down(env *e)
{
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
}

/* One rank's KV cache: per layer a tensor (2, NB, BS, nh, HD) of bytes
 * (vLLM's FlashAttention NHD layout), nh = the rank's heads; or, for MLA,
 * (NB, BS, HD) (one latent). */
typedef struct cache {
    int nh, mla;
    uint8_t *layer[LAYERS];
    size_t layer_bytes;
} cache;

static void cache_init(cache *c, int nh, int mla)
{
    c->nh = nh;
    c->mla = mla;
    c->layer_bytes = (size_t)(mla ? 1 : 2) * NB * BS * (size_t)nh * HD;
    for (int l = 0; l < LAYERS; l++)
        c->layer[l] = calloc(1, c->layer_bytes);
}

static void cache_free(cache *c)
{
    for (int l = 0; l < LAYERS; l++)
        free(c->layer[l]);
}

/* Byte d of token pos, layer l, plane p, GLOBAL head h. Never 0. */
static uint8_t val(uint64_t pos, int l, int p, int h, int d)
{
    uint64_t x = (pos + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)l << 20) ^ ((uint64_t)p << 12) ^
                 ((uint64_t)h << 6) ^ (uint64_t)d;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x | 1);
}

/* Local head j of block bid, layer l, plane p, token t. */
static uint8_t *slot(cache *c, int l, int p, uint32_t bid, int t, int j)
{
    if (c->mla)
        return c->layer[l] + ((size_t)bid * BS + (size_t)t) * HD;
    return c->layer[l] + (size_t)p * NB * BS * c->nh * HD +
           (((size_t)bid * BS + (size_t)t) * c->nh + (size_t)j) * HD;
}

/* Fills chunk k into bids[k] with heads h0 .. h0+nh-1. */
static void fill(cache *c, int h0, const uint32_t *bids, int n)
{
    for (int k = 0; k < n; k++)
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < (c->mla ? 1 : 2); p++)
                for (int t = 0; t < BS; t++)
                    for (int j = 0; j < c->nh; j++)
                        for (int d = 0; d < HD; d++)
                            slot(c, l, p, bids[k], t, j)[d] = val((uint64_t)k * BS + t, l, p,
                                                                  h0 + j, d);
}

/* 1 if every block bids[k] holds chunk k for heads h0.. of the cache. */
static int holds(cache *c, int h0, const uint32_t *bids, int n)
{
    for (int k = 0; k < n; k++)
        for (int l = 0; l < LAYERS; l++)
            for (int p = 0; p < (c->mla ? 1 : 2); p++)
                for (int t = 0; t < BS; t++)
                    for (int j = 0; j < c->nh; j++)
                        for (int d = 0; d < HD; d++)
                            if (slot(c, l, p, bids[k], t, j)[d] !=
                                val((uint64_t)k * BS + t, l, p, h0 + j, d))
                                return 0;
    return 1;
}

static void hashes(uint8_t *h, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < HL; k++)
            h[i * HL + k] = (uint8_t)(131 + (uint32_t)i * 31 + (uint32_t)k * 7 + 1);
}

/* A worker of rank r of a TP tp engine over a model of `heads` KV heads
 * (mla: one latent). tpi: the TP-independent layout. */
static kvp_worker *worker_open(const env *e, cache *c, int r, int tp, int heads, int mla,
                               int tpi)
{
    kvp_worker_group g = {
        .spec = {.kind = KVP_COORD_FULL, .block_size = BS, .spec_tag = mla ? 1u : 0u},
        .key_spec = mla ? KVP_KEY_SPEC_MLA : KVP_KEY_SPEC_ATTENTION,
        .num_kv_heads = heads,
    };
    kvp_worker_cfg cfg = {
        .store_config = e->cfg, .model_path = MODEL,
        .tp_rank = r, .tp_size = tp, .pcp_size = 1, .dcp_size = 1, .pp_size = 1,
        .role = KVP_WORKER_BOTH, .enable_lookup = 1, .groups = &g, .ngroups = 1,
        .retention_interval = -1, .num_gpu_blocks = NB, .num_recv_threads = 1,
        .enable_kv_events = 1, .tp_independent = tpi,
        .config_fingerprint = "0123456789abcdef",
    };
    kvp_worker *w = NULL;
    char err[256] = "";
    int rc = kvp_worker_create(&cfg, &w, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "    kvp_worker_create: %s (%s)\n", err, kvp_err_name(rc));
        return NULL;
    }
    kvp_tdb_tensor t[LAYERS];
    size_t nh = (size_t)c->nh;
    for (int l = 0; l < LAYERS; l++)
        t[l] = mla ? (kvp_tdb_tensor){.base = c->layer[l], .storage_len = c->layer_bytes,
                                      .elem_size = 1, .ndim = 3, .shape = {NB, BS, HD},
                                      .stride = {BS * HD, HD, 1}}
                   : (kvp_tdb_tensor){.base = c->layer[l], .storage_len = c->layer_bytes,
                                      .elem_size = 1, .ndim = 5,
                                      .shape = {2, NB, BS, nh, HD},
                                      .stride = {NB * BS * nh * HD, BS * nh * HD, nh * HD, HD, 1}};
    if ((rc = kvp_worker_register_kv_caches(w, t, LAYERS)) != 0) {
        fprintf(stderr, "    register: %s\n", kvp_err_name(rc));
        kvp_worker_destroy(w);
        return NULL;
    }
    return w;
}

typedef struct rq {
    kvp_meta_ids ids;
    kvp_meta_load_spec ls;
    kvp_meta_req r;
} rq;

/* Runs one step holding r (may be NULL); *done = id finished (sending for
 * a save, receiving for a load). */
static int step(kvp_worker *w, kvp_meta_req *r, const char *fin, const char *id, int load,
                int *done)
{
    kvp_meta_step s;
    kvp_meta_step_init(&s);
    if (r)
        kvp_meta_step_add_req(&s, r);
    kvp_worker_ids ds = {0}, dr = {0};
    const char *f[1] = {fin};
    int rc = kvp_worker_get_finished(w, fin ? f : NULL, fin ? 1 : 0, &s, &ds, &dr);
    *done = kvp_worker_ids_has(load ? &dr : &ds, id);
    kvp_worker_ids_free(&ds);
    kvp_worker_ids_free(&dr);
    kvp_meta_step_free(&s);
    return rc;
}

static int run_wait(kvp_worker *w, kvp_meta_req *r, const char *id, int load)
{
    int done = 0;
    REQUIRE(step(w, r, load ? NULL : id, id, load, &done) == 0);
    for (int i = 0; i < 2000 && !done; i++) {
        tp_sleep_ms(5);
        REQUIRE(step(w, NULL, NULL, id, load, &done) == 0);
    }
    REQUIRE(done);
    return 0;
}

static int save(kvp_worker *w, const char *id, uint32_t *bids, const uint8_t *h)
{
    rq q;
    memset(&q, 0, sizeof q);
    q.ids = (kvp_meta_ids){bids, NCH, 0};
    q.r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_NEW,
        .token_len_chunk = (uint64_t)NCH * BS, .block_ids = &q.ids, .ngroups = 1,
        .block_hashes = h, .nhashes = NCH, .hash_len = HL,
        .can_save = KVP_META_TRUE, .is_last_chunk = KVP_META_UNSET,
    };
    return run_wait(w, &q.r, id, 0);
}

static int load(kvp_worker *w, const char *id, uint32_t *bids, const uint8_t *h, uint64_t hit)
{
    rq q;
    memset(&q, 0, sizeof q);
    q.ids = (kvp_meta_ids){bids, NCH, 0};
    q.ls = (kvp_meta_load_spec){.vllm_cached_tokens = 0, .kvpool_cached_tokens = hit,
                                .can_load = true};
    q.r = (kvp_meta_req){
        .req_id = {id, (uint32_t)strlen(id)}, .kind = KVP_META_LOAD, .block_ids = &q.ids,
        .ngroups = 1, .block_hashes = h, .nhashes = NCH, .hash_len = HL,
        .can_save = KVP_META_UNSET, .is_last_chunk = KVP_META_UNSET, .load_spec = &q.ls,
    };
    return run_wait(w, &q.r, id, 1);
}

static uint32_t lookup(kvp_worker *w, const uint8_t *h)
{
    uint32_t hit = 12345;
    if (kvp_worker_lookup(w, NCH * BS + 1, h, NCH, HL, 1, &hit) != 0)
        return 12345;
    return hit;
}

static kvp_worker_op_stats op(kvp_worker *w, int o)
{
    kvp_worker_stats st;
    memset(&st, 0, sizeof st);
    kvp_worker_take_stats(w, &st);
    return st.op[o];
}

/* ------------------------------------------------------------ tests */

/* A TP 1 engine stores; TP 2 and TP 4 engines hit the whole prefix and
 * each rank's load writes exactly its heads and moves exactly its share:
 * bytes moved per hit / the reader's share = 1.0. The rank layout's TP 2
 * engine misses the same prompts. */
TEST(tp1_writer_tp2_tp4_readers_get_their_heads)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[NCH * HL];
    hashes(h, NCH);
    uint32_t wb[NCH] = {3, 7, 1, 20, 11};
    cache cw;
    cache_init(&cw, 4, 0);
    fill(&cw, 0, wb, NCH);
    kvp_worker *w = worker_open(&e, &cw, 0, 1, 4, 0, 1);
    CHECK(w != NULL);
    CHECK_EQ(save(w, "w1", wb, h), 0);
    kvp_worker_op_stats s = op(w, KVP_WORKER_OP_SAVE_PUT);
    CHECK_EQ(s.keys, NCH * 4); /* one object per head and block */
    CHECK_EQ(s.bytes, (uint64_t)NCH * 4 * HEAD_BLOCK);
    kvp_worker_event *ev = NULL;
    size_t nev = 0;
    CHECK_EQ(kvp_worker_take_events(w, &ev, &nev), 0);
    CHECK_EQ(nev, NCH); /* one BlockStored per block, not per head */
    kvp_worker_events_free(ev, nev);
    CHECK_EQ(lookup(w, h), NCH * BS); /* TP 1 on its own */

    for (int tp = 2; tp <= 4; tp *= 2) {
        int nh = 4 / tp;
        for (int r = 0; r < tp; r++) {
            cache c;
            cache_init(&c, nh, 0);
            kvp_worker *rw = worker_open(&e, &c, r, tp, 4, 0, 1);
            CHECK(rw != NULL);
            if (!rw) {
                cache_free(&c);
                continue;
            }
            uint32_t hit = lookup(rw, h);
            CHECK_EQ(hit, NCH * BS); /* every rank's lookup answers for the whole engine */
            uint32_t rb[NCH] = {9, 2, 30, 4, 15};
            char id[32];
            snprintf(id, sizeof id, "r-tp%d-%d", tp, r);
            CHECK_EQ(load(rw, id, rb, h, hit), 0);
            CHECK(holds(&c, r * nh, rb, NCH)); /* exactly heads r*nh .. r*nh+nh-1 */
            kvp_worker_op_stats g = op(rw, KVP_WORKER_OP_LOAD_GET);
            CHECK_EQ(g.keys, (uint64_t)NCH * nh);
            CHECK_EQ(g.failed_keys, 0);
            /* bytes moved per hit == the reader's share of the KV */
            CHECK_EQ(g.bytes, (uint64_t)NCH * nh * HEAD_BLOCK);
            kvp_worker_destroy(rw);
            cache_free(&c);
        }
    }
    /* the contrast: the rank layout keys the writer's TP rank */
    cache c;
    cache_init(&c, 2, 0);
    kvp_worker *old = worker_open(&e, &c, 0, 2, 4, 0, 0);
    CHECK(old != NULL);
    if (old)
        CHECK_EQ(lookup(old, h), 0);
    kvp_worker_destroy(old);
    cache_free(&c);
    kvp_worker_destroy(w);
    cache_free(&cw);
    env_down(&e);
}

/* 2 KV heads on TP 4: ranks 0, 1 hold head 0 and ranks 2, 3 head 1. All
 * four store, yet each head of each block is put once (the ranks sharing
 * a head stride the chunks); a TP 1 engine then reads everything, the
 * reverse direction. */
TEST(replicated_heads_stored_once_tp4_to_tp1)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[NCH * HL];
    hashes(h, NCH);
    uint32_t wb[NCH] = {3, 7, 1, 20, 11};
    uint64_t keys = 0, bytes = 0, existing = 0;
    for (int r = 0; r < 4; r++) {
        cache c;
        cache_init(&c, 1, 0);
        fill(&c, r / 2, wb, NCH);
        kvp_worker *w = worker_open(&e, &c, r, 4, 2, 0, 1);
        CHECK(w != NULL);
        if (w) {
            char id[16];
            snprintf(id, sizeof id, "w4-%d", r);
            CHECK_EQ(save(w, id, wb, h), 0);
            kvp_worker_op_stats s = op(w, KVP_WORKER_OP_SAVE_PUT);
            keys += s.keys, bytes += s.bytes, existing += s.existing_keys;
        }
        kvp_worker_destroy(w);
        cache_free(&c);
    }
    CHECK_EQ(keys, NCH * 2); /* one copy per head, not one per rank */
    CHECK_EQ(existing, 0);
    CHECK_EQ(bytes, (uint64_t)NCH * 2 * HEAD_BLOCK);
    cache c;
    cache_init(&c, 2, 0);
    kvp_worker *rw = worker_open(&e, &c, 0, 1, 2, 0, 1);
    CHECK(rw != NULL);
    if (rw) {
        uint32_t hit = lookup(rw, h);
        CHECK_EQ(hit, NCH * BS);
        uint32_t rb[NCH] = {9, 2, 30, 4, 15};
        CHECK_EQ(load(rw, "r1", rb, h, hit), 0);
        CHECK(holds(&c, 0, rb, NCH));
        CHECK_EQ(op(rw, KVP_WORKER_OP_LOAD_GET).bytes, (uint64_t)NCH * 2 * HEAD_BLOCK);
    }
    kvp_worker_destroy(rw);
    cache_free(&c);
    env_down(&e);
}

/* An MLA latent (one per block, identical on every rank): a TP 2 engine
 * stores it once; a TP 1 engine reads it. */
TEST(mla_latent_stored_once)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[NCH * HL];
    hashes(h, NCH);
    uint32_t wb[NCH] = {3, 7, 1, 20, 11};
    uint64_t keys = 0, bytes = 0;
    for (int r = 0; r < 2; r++) {
        cache c;
        cache_init(&c, 1, 1);
        fill(&c, 0, wb, NCH);
        kvp_worker *w = worker_open(&e, &c, r, 2, 1, 1, 1);
        CHECK(w != NULL);
        if (w) {
            CHECK_EQ(save(w, r ? "m1" : "m0", wb, h), 0);
            kvp_worker_op_stats s = op(w, KVP_WORKER_OP_SAVE_PUT);
            keys += s.keys, bytes += s.bytes;
        }
        kvp_worker_destroy(w);
        cache_free(&c);
    }
    CHECK_EQ(keys, NCH);
    CHECK_EQ(bytes, (uint64_t)NCH * LAYERS * BS * HD);
    cache c;
    cache_init(&c, 1, 1);
    kvp_worker *rw = worker_open(&e, &c, 0, 1, 1, 1, 1);
    CHECK(rw != NULL);
    if (rw) {
        uint32_t hit = lookup(rw, h);
        CHECK_EQ(hit, NCH * BS);
        uint32_t rb[NCH] = {9, 2, 30, 4, 15};
        CHECK_EQ(load(rw, "mr", rb, h, hit), 0);
        CHECK(holds(&c, 0, rb, NCH));
    }
    kvp_worker_destroy(rw);
    cache_free(&c);
    env_down(&e);
}

/* Only rank 0 of a TP 2 engine stored (heads 0, 1 of 4): a TP 1 engine,
 * and rank 1 of a TP 2 engine, find no prefix -- a block counts only when
 * every head the reading engine needs is there. */
TEST(hit_needs_every_head)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    uint8_t h[NCH * HL];
    hashes(h, NCH);
    uint32_t wb[NCH] = {3, 7, 1, 20, 11};
    cache c0, c1, c2;
    cache_init(&c0, 2, 0);
    cache_init(&c1, 4, 0);
    cache_init(&c2, 2, 0);
    fill(&c0, 0, wb, NCH);
    kvp_worker *w0 = worker_open(&e, &c0, 0, 2, 4, 0, 1);
    kvp_worker *r1 = worker_open(&e, &c1, 0, 1, 4, 0, 1);
    kvp_worker *r2 = worker_open(&e, &c2, 1, 2, 4, 0, 1);
    CHECK(w0 && r1 && r2);
    if (w0 && r1 && r2) {
        CHECK_EQ(save(w0, "half", wb, h), 0);
        CHECK_EQ(op(w0, KVP_WORKER_OP_SAVE_PUT).keys, NCH * 2);
        CHECK_EQ(lookup(r1, h), 0);
        CHECK_EQ(lookup(r2, h), 0);
        CHECK_EQ(lookup(w0, h), 0);
    }
    kvp_worker_destroy(w0);
    kvp_worker_destroy(r1);
    kvp_worker_destroy(r2);
    cache_free(&c0);
    cache_free(&c1);
    cache_free(&c2);
    env_down(&e);
}

/* Refused with a message: DCP, heads neither a multiple nor a divisor of
 * tp_size; a tensor whose heads cannot be told from the tokens. */
TEST(head_layout_refusals)
{
    env e;
    if (env_up(&e) != 0) {
        env_down(&e);
        th_fail(__FILE__, __LINE__, "env_up");
        return;
    }
    kvp_worker_group g = {.spec = {.kind = KVP_COORD_FULL, .block_size = BS},
                          .key_spec = KVP_KEY_SPEC_ATTENTION, .num_kv_heads = 6};
    kvp_worker_cfg cfg = {
        .store_config = e.cfg, .model_path = MODEL, .tp_rank = 0, .tp_size = 4, .pcp_size = 1,
        .dcp_size = 1, .pp_size = 1, .role = KVP_WORKER_BOTH, .enable_lookup = 1, .groups = &g,
        .ngroups = 1, .retention_interval = -1, .num_gpu_blocks = NB, .tp_independent = 1,
    };
    kvp_worker *w = NULL;
    char err[256] = "";
    CHECK_EQ(kvp_worker_create(&cfg, &w, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "multiple or a divisor") != NULL);
    g.num_kv_heads = 8;
    cfg.dcp_size = 2;
    CHECK_EQ(kvp_worker_create(&cfg, &w, err, sizeof err), KVP_ECONFIG);
    CHECK(strstr(err, "dcp_size") != NULL);
    /* 2 heads per rank, block_size 2: (2, NB, 2, 2, HD) could be either */
    cfg.dcp_size = 1;
    g.spec.block_size = 2;
    CHECK_EQ(kvp_worker_create(&cfg, &w, err, sizeof err), 0);
    static uint8_t mem[2 * NB * 2 * 2 * HD];
    kvp_tdb_tensor t = {.base = mem, .storage_len = sizeof mem, .elem_size = 1, .ndim = 5,
                        .shape = {2, NB, 2, 2, HD},
                        .stride = {NB * 2 * 2 * HD, 2 * 2 * HD, 2 * HD, HD, 1}};
    CHECK_EQ(kvp_worker_register_kv_caches(w, &t, 1), KVP_EINVALID_PARAMS);
    kvp_worker_destroy(w);
    env_down(&e);
}
