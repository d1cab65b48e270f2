/* test_connector_api.c -- the public connector API (kvpool_connector.h)
 * end to end against a real master and storage node: one scheduler and two
 * TP worker ranks in this process, a paged host-memory KV cache per rank.
 * A request is stored through the step bytes, finished (delay-free until
 * its stores are done), then a second request sharing the prefix is looked
 * up over the lookup socket, loaded into other blocks and compared byte for
 * byte; plus configuration errors, undecodable step bytes, the block hasher
 * against vLLM's vectors, stats and events. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/gpu.h"
#include "harness.h"
#include "kvpool.h"
#include "kvpool_connector.h"
#include "proc.h"

#define NB 32   /* blocks */
#define BS 16   /* tokens per block */
#define DIM 16  /* bytes per token per plane */
#define LAYERS 2
#define PLANE ((size_t)NB * BS * DIM)
#define TP 2
#define HL 32

typedef struct env {
    tp_master m;
    tp_store st;
    char cfg[256];
    char sock[108];
    kvp_conn_group g;
    kvp_conn_config c;
    kvp_conn_sched *s;
    kvp_conn_worker *w[TP];
    uint8_t *kv[TP][LAYERS]; /* (2, NB, BS, DIM) each */
    int dev;                 /* the KV caches are device memory (gpu.h's fake device) */
} env;

/* Bytes into / out of a KV cache, host or device. */
static void kv_put(env *e, uint8_t *dst, const uint8_t *src, size_t len)
{
    if (e->dev)
        kvp_gpu_memcpy(dst, src, len);
    else
        memcpy(dst, src, len);
}

static void kv_get(env *e, uint8_t *dst, const uint8_t *src, size_t len)
{
    kv_put(e, dst, src, len);
}

/* The engine's fence: remembers the highest step a store waited for. */
static _Atomic uint64_t fence_max;
static int fence(void *arg, uint64_t step)
{
    (void)arg;
    uint64_t cur = fence_max;
    while (step > cur && !atomic_compare_exchange_weak(&fence_max, &cur, step))
        ;
    return 0;
}

static void fill_block(env *e, int rank, uint32_t block, uint32_t seed)
{
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            uint8_t *b = e->kv[rank][l] + (size_t)p * PLANE + (size_t)block * BS * DIM;
            uint8_t v[BS * DIM];
            for (size_t i = 0; i < (size_t)BS * DIM; i++)
                v[i] = (uint8_t)(seed * 131u + (uint32_t)rank * 29u + (uint32_t)l * 7u +
                                 (uint32_t)p * 3u + (uint32_t)i);
            kv_put(e, b, v, sizeof v);
        }
}

static int same_block(env *e, int rank, uint32_t a, uint32_t b)
{
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            uint8_t x[BS * DIM], y[BS * DIM];
            kv_get(e, x, e->kv[rank][l] + (size_t)p * PLANE + (size_t)a * BS * DIM, sizeof x);
            kv_get(e, y, e->kv[rank][l] + (size_t)p * PLANE + (size_t)b * BS * DIM, sizeof y);
            if (memcmp(x, y, sizeof x) != 0)
                return 0;
        }
    return 1;
}

static int env_open_conn(env *e);

static int env_up_kv(env *e, int num_kv_heads, int dev)
{
    memset(e, 0, sizeof *e);
    e->dev = dev;
    if (dev)
        kvp_gpu_use_fake();
    if (tp_master_start(&e->m, NULL) != 0)
        return -1;
    if (tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "64MiB", NULL}))
        return -1;
    snprintf(e->cfg, sizeof e->cfg, "{\"master\": \"%s\", \"mode\": \"standalone-store\"}",
             e->m.addr);
    snprintf(e->sock, sizeof e->sock, "/tmp/kvp-conn-%d.sock", (int)getpid());
    e->g = (kvp_conn_group){.kind = KVP_CONN_FULL_ATTENTION, .block_size = BS,
                            .num_kv_heads = (uint32_t)num_kv_heads};
    kvp_conn_config_default(&e->c);
    e->c.model = "/models/org/Test-Model";
    e->c.groups = &e->g;
    e->c.ngroups = 1;
    e->c.lookup_socket = e->sock;
    e->c.store_config = e->cfg;
    e->c.tp_size = TP;
    e->c.num_blocks = NB;
    e->c.kv_events = true;
    e->c.fence = fence;
    return env_open_conn(e);
}

static int env_up(env *e, int num_kv_heads) { return env_up_kv(e, num_kv_heads, 0); }

/* The halves closed (the pool and the KV caches stay): ready for
 * env_open_conn with another configuration. */
static void env_close_conn(env *e)
{
    kvp_conn_sched_close(e->s);
    e->s = NULL;
    for (int r = 0; r < TP; r++) {
        kvp_conn_worker_close(e->w[r]);
        e->w[r] = NULL;
    }
}

/* Opens the scheduler and the TP workers of e->c (KV caches allocated once). */
static int env_open_conn(env *e)
{
    int dev = e->dev;
    char err[256] = "";
    for (int r = 0; r < TP; r++) {
        kvp_conn_config wc = e->c;
        wc.tp_rank = r;
        if (kvp_conn_worker_open(&wc, &e->w[r], err, sizeof err) != 0) {
            fprintf(stderr, "worker_open: %s\n", err);
            return -1;
        }
        kvp_conn_tensor t[LAYERS];
        for (int l = 0; l < LAYERS; l++) {
            if (!e->kv[r][l])
                e->kv[r][l] = dev ? kvp_gpu_dev_alloc(0, 2 * PLANE) : calloc(1, 2 * PLANE);
            if (!e->kv[r][l])
                return -1;
            t[l] = (kvp_conn_tensor){.base = e->kv[r][l], .storage_len = 2 * PLANE,
                                     .elem_size = 1, .ndim = 4,
                                     .shape = {2, NB, BS, DIM},
                                     .stride = {PLANE, (size_t)BS * DIM, DIM, 1}};
        }
        if (kvp_conn_register_kv_caches(e->w[r], t, LAYERS) != 0)
            return -1;
    }
    if (kvp_conn_sched_open(&e->c, &e->s, err, sizeof err) != 0) {
        fprintf(stderr, "sched_open: %s\n", err);
        return -1;
    }
    return 0;
}

static void env_down(env *e)
{
    kvp_conn_sched_close(e->s);
    for (int r = 0; r < TP; r++) {
        kvp_conn_worker_close(e->w[r]);
        for (int l = 0; l < LAYERS; l++)
            if (e->dev)
                kvp_gpu_dev_free(e->kv[r][l]);
            else
                free(e->kv[r][l]);
    }
    CHECK_EQ(tp_store_stop(&e->st), 0);
    CHECK_EQ(tp_master_stop(&e->m), 0);
}

/* One engine step: build the bytes, every rank runs get_finished; the ids
 * every rank reported are handed back to the scheduler. Returns the
 * number of ids in both aggregated sets that equal `want` (or -1). */
static int step(env *e, const kvp_conn_step *st, const char *fin, int *sending, int *recving)
{
    const uint8_t *bytes;
    size_t len;
    if (kvp_conn_build_meta(e->s, st, &bytes, &len) != 0)
        return -1;
    int ns = 0, nr = 0;
    const char *finl[1] = {fin};
    for (int r = 0; r < TP; r++) {
        kvp_conn_ids ds = {0}, dr = {0};
        if (kvp_conn_get_finished(e->w[r], bytes, len, finl, fin ? 1 : 0, &ds, &dr) != 0)
            return -1;
        ns += (int)ds.n;
        nr += (int)dr.n;
        kvp_conn_ids_free(&ds);
        kvp_conn_ids_free(&dr);
    }
    *sending = ns;
    *recving = nr;
    return 0;
}

/* Steps with nothing scheduled until every rank reported (sending, recving)
 * for the request; drains the ranks between steps. */
static int until_reported(env *e, const char *fin, kvp_conn_str id, int want_send, int want_recv)
{
    int got_s = 0, got_r = 0;
    for (int i = 0; i < 50 && (got_s < want_send * TP || got_r < want_recv * TP); i++) {
        for (int r = 0; r < TP; r++)
            kvp_conn_worker_drain(e->w[r]);
        kvp_conn_step st = {0};
        int s = 0, rv = 0;
        if (step(e, &st, i == 0 ? fin : NULL, &s, &rv) != 0)
            return -1;
        got_s += s;
        got_r += rv;
    }
    (void)id;
    if (got_s == want_send * TP && got_r == want_recv * TP)
        return 0;
    fprintf(stderr, "reported sending %d recving %d\n", got_s, got_r);
    return -1;
}

static void shared_prefix_body(int dev)
{
    env e;
    CHECK(env_up_kv(&e, 2, dev) == 0); /* two KV heads: each rank its own bytes and keys */

    /* request A: 64 tokens = 4 blocks, computed in blocks 1..4 */
    enum { NA = 64, NBK = NA / BS, NBX = 80 / BS };
    uint32_t tok[80];
    for (uint32_t i = 0; i < 80; i++)
        tok[i] = 1000 + i * 7;
    kvp_conn_hasher *h;
    CHECK(kvp_conn_hasher_new("sha256_cbor", "0", BS, &h) == 0);
    uint8_t hashes[8 * HL];
    size_t nh = 0, nh2 = 0;
    CHECK(kvp_conn_hasher_append(h, tok, NA, hashes, 8, &nh) == 0);
    CHECK_EQ(nh, (size_t)NBK);
    CHECK(kvp_conn_hasher_append(h, tok + NA, 16, hashes + nh * HL, 8 - nh, &nh2) == 0);
    CHECK_EQ(nh2, (size_t)1);
    kvp_conn_hasher_free(h);

    kvp_conn_request a = {.id = {"req-a", 5}, .tokens = tok, .num_tokens = NA,
                          .prompt_tokens = tok, .num_prompt_tokens = NA,
                          .block_hashes = hashes, .nhashes = NBK, .hash_len = HL};
    uint64_t nn = 99;
    bool async = true;
    CHECK_EQ(kvp_conn_get_num_new_matched_tokens(e.s, &a, 0, &nn, &async), 0);
    CHECK_EQ(nn, (uint64_t)0); /* empty pool */
    uint32_t ba[NBK] = {1, 2, 3, 4};
    for (int r = 0; r < TP; r++)
        for (uint32_t b = 0; b < NBK; b++)
            fill_block(&e, r, ba[b], b);
    kvp_conn_blocks bla = {ba, NBK};
    CHECK_EQ(kvp_conn_update_state_after_alloc(e.s, &a, &bla, 1, 0), 0);
    kvp_conn_new_req nr = {.req = &a, .num_scheduled_tokens = NA, .blocks = &bla, .ngroups = 1};
    kvp_conn_step st = {.new_reqs = &nr, .n_new = 1};
    int s = 0, rv = 0;
    CHECK_EQ(kvp_conn_worker_step(e.w[0]), (uint64_t)1);
    CHECK(step(&e, &st, NULL, &s, &rv) == 0);
    CHECK_EQ(kvp_conn_worker_step(e.w[0]), (uint64_t)2);
    bool delay = false;
    CHECK_EQ(kvp_conn_request_finished(e.s, a.id, &bla, 1, &delay), 0);
    CHECK(delay); /* its store was queued: blocks held until finished_sending */
    CHECK_EQ(until_reported(&e, "req-a", a.id, 1, 0), 0);
    CHECK_EQ(fence_max, (uint64_t)1); /* A's stores waited for step 1's writes */

    kvp_conn_stats stats;
    CHECK_EQ(kvp_conn_take_stats(e.w[0], &stats), 1);
    CHECK(stats.op[KVP_CONN_OP_STORE].keys >= 1);
    CHECK_EQ(stats.op[KVP_CONN_OP_STORE].failed_keys, (uint64_t)0);
    kvp_conn_event *ev;
    size_t nev;
    CHECK_EQ(kvp_conn_take_events(e.w[0], &ev, &nev), 0);
    CHECK(nev >= 1 && nev <= NBK);
    if (nev) {
        CHECK_EQ(ev[0].block_size, (uint32_t)BS);
        CHECK_EQ(ev[0].hash_len, (uint8_t)HL);
    }
    kvp_conn_events_free(ev, nev);

    /* request B: A's 64 tokens + 16 more; the pool has A's 4 blocks */
    kvp_conn_request b = {.id = {"req-b", 5}, .tokens = tok, .num_tokens = 80,
                          .prompt_tokens = tok, .num_prompt_tokens = 80,
                          .block_hashes = hashes, .nhashes = NBX, .hash_len = HL};
    CHECK_EQ(kvp_conn_get_num_new_matched_tokens(e.s, &b, 0, &nn, &async), 0);
    CHECK_EQ(nn, (uint64_t)NA);
    CHECK(async);
    uint32_t bb[NBX] = {10, 11, 12, 13, 14};
    kvp_conn_blocks blb = {bb, NBX};
    CHECK_EQ(kvp_conn_update_state_after_alloc(e.s, &b, &blb, 1, NA), 0);
    kvp_conn_step st2 = {0};
    CHECK(step(&e, &st2, NULL, &s, &rv) == 0);
    CHECK_EQ(until_reported(&e, NULL, b.id, 0, 1), 0);
    uint32_t *bad = NULL;
    size_t nbad = 9;
    for (int r = 0; r < TP; r++) {
        CHECK_EQ(kvp_conn_load_errors(e.w[r], &bad, &nbad), 0);
        CHECK_EQ(nbad, (size_t)0);
        kvp_conn_free(bad);
        for (uint32_t k = 0; k < NBK; k++)
            CHECK(same_block(&e, r, ba[k], bb[k]));
    }
    CHECK_EQ(kvp_conn_take_stats(e.w[1], &stats), 1);
    CHECK_EQ(stats.op[KVP_CONN_OP_LOAD].keys, (uint64_t)NBK);
    CHECK_EQ(stats.op[KVP_CONN_OP_LOAD].failed_keys, (uint64_t)0);

    /* B loaded: its blocks are kept until every rank reports it finished
     * sending (a load could still be writing into them) */
    CHECK_EQ(kvp_conn_request_finished(e.s, b.id, &blb, 1, &delay), 0);
    CHECK(delay);
    CHECK_EQ(until_reported(&e, "req-b", b.id, 1, 0), 0);

    /* a full-prompt hit is re-derived one boundary lower (a token must be
     * computed to sample the next one) */
    kvp_conn_request c = a;
    c.id = (kvp_conn_str){"req-c", 5};
    CHECK_EQ(kvp_conn_get_num_new_matched_tokens(e.s, &c, 0, &nn, &async), 0);
    CHECK_EQ(nn, (uint64_t)(NA - BS));

    /* an asynchronous lookup answers PENDING first, then the hit */
    kvp_conn_config ac = e.c;
    ac.lookup_async = true;
    kvp_conn_sched *as = NULL;
    char aerr[256];
    CHECK_EQ(kvp_conn_sched_open(&ac, &as, aerr, sizeof aerr), 0);
    kvp_conn_request ar = b;
    ar.id = (kvp_conn_str){"req-async", 9};
    int pend = 0, arc;
    while ((arc = kvp_conn_get_num_new_matched_tokens(as, &ar, 0, &nn, &async)) ==
               KVP_CONN_PENDING && pend < 2000) {
        pend++;
        usleep(1000);
    }
    CHECK_EQ(arc, 0);
    CHECK(pend >= 1); /* the first call did not wait */
    CHECK_EQ(nn, (uint64_t)NA);
    kvp_conn_sched_close(as);

    /* reset empties the pool: the same lookup now misses */
    CHECK(kvp_conn_reset_cache(e.s));
    kvp_conn_request d = b;
    d.id = (kvp_conn_str){"req-d", 5};
    CHECK_EQ(kvp_conn_get_num_new_matched_tokens(e.s, &d, 0, &nn, &async), 0);
    CHECK_EQ(nn, (uint64_t)0);
    env_down(&e);
}

TEST(store_then_load_shared_prefix_tp2) { shared_prefix_body(0); }

/* The same with the KV caches in device memory (the fake device: the CPU
 * cannot touch them): register_kv_caches finds them device memory, stores
 * and loads go by DMA, and the loaded blocks equal the stored ones. */
TEST(store_then_load_device_kv_tp2) { shared_prefix_body(1); }

/* Stores a request of ntok tokens in blocks 1.. (the ranks' bytes seeded by
 * seed) and waits until every rank stored it; its hashes into hashes. */
static int store_request(env *e, const char *id, const uint32_t *tok, uint32_t ntok,
                         uint8_t *hashes, uint32_t seed)
{
    kvp_conn_hasher *h;
    size_t nh = 0;
    if (kvp_conn_hasher_new("sha256_cbor", "0", BS, &h) != 0)
        return -1;
    int rc = kvp_conn_hasher_append(h, tok, ntok, hashes, 8, &nh);
    kvp_conn_hasher_free(h);
    if (rc != 0 || nh != ntok / BS || nh > 8)
        return -1;
    uint32_t ba[8];
    for (uint32_t b = 0; b < nh; b++) {
        ba[b] = 1 + b;
        for (int r = 0; r < TP; r++)
            fill_block(e, r, ba[b], seed + b);
    }
    kvp_conn_str rid = {id, (uint32_t)strlen(id)};
    kvp_conn_request a = {.id = rid, .tokens = tok, .num_tokens = ntok, .prompt_tokens = tok,
                          .num_prompt_tokens = ntok, .block_hashes = hashes,
                          .nhashes = (uint32_t)nh, .hash_len = HL};
    uint64_t nn = 0;
    bool async = true, delay = false;
    kvp_conn_blocks bl = {ba, (uint32_t)nh};
    if (kvp_conn_get_num_new_matched_tokens(e->s, &a, 0, &nn, &async) != 0 ||
        kvp_conn_update_state_after_alloc(e->s, &a, &bl, 1, 0) != 0)
        return -1;
    kvp_conn_new_req nr = {.req = &a, .num_scheduled_tokens = ntok, .blocks = &bl, .ngroups = 1};
    kvp_conn_step st = {.new_reqs = &nr, .n_new = 1};
    int s = 0, rv = 0;
    if (step(e, &st, NULL, &s, &rv) != 0 ||
        kvp_conn_request_finished(e->s, a.id, &bl, 1, &delay) != 0 || !delay)
        return -1;
    return until_reported(e, id, a.id, 1, 0);
}

/* Tokens the scheduler's lookup finds for tok (a fresh request id). */
static uint64_t lookup_tokens(env *e, const char *id, const uint32_t *tok, uint32_t ntok,
                              const uint8_t *hashes)
{
    kvp_conn_request q = {.id = {id, (uint32_t)strlen(id)}, .tokens = tok, .num_tokens = ntok,
                          .prompt_tokens = tok, .num_prompt_tokens = ntok,
                          .block_hashes = hashes, .nhashes = ntok / BS, .hash_len = HL};
    uint64_t nn = 0;
    bool async = false;
    if (kvp_conn_get_num_new_matched_tokens(e->s, &q, 0, &nn, &async) != 0)
        return UINT64_MAX;
    return nn;
}

/* config_fingerprint puts "@cfg:<fp>" in every key: a configuration never
 * finds another's blocks in one pool, each finds its own; worker rank 0
 * stores config_description once under the configuration's descriptor key. */
TEST(config_fingerprint_separates_configurations)
{
    static const char fa[] = "0123456789abcdef", fb[] = "fedcba9876543210";
    static const char desc[] = "{\"model\": \"Test-Model\", \"dtype\": \"bfloat16\"}";
    env e;
    memset(&e, 0, sizeof e);
    CHECK(env_up(&e, 2) == 0);
    env_close_conn(&e);
    e.c.config_fingerprint = fa;
    e.c.config_description = desc;
    CHECK(env_open_conn(&e) == 0);

    enum { N = 64 };
    uint32_t tok[N];
    for (uint32_t i = 0; i < N; i++)
        tok[i] = 5000 + i * 3;
    uint8_t hashes[8 * HL];
    CHECK(store_request(&e, "fp-a", tok, N, hashes, 7) == 0);
    CHECK_EQ(lookup_tokens(&e, "fp-a2", tok, N, hashes), (uint64_t)(N - BS));

    /* the pool holds fingerprinted keys (each rank its own: two KV heads)
     * and the descriptor, stored by rank 0 only */
    kvp_client *cl = NULL;
    char err[256];
    CHECK(kvp_client_open(e.cfg, &cl, err, sizeof err) == 0);
    if (!cl) {
        env_down(&e);
        return;
    }
    char k0[256], k1[256], hex[2 * HL + 1];
    for (int j = 0; j < HL; j++)
        snprintf(hex + 2 * j, 3, "%02x", hashes[j]);
    const char *keys[3] = {k0, k1, "Test-Model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"};
    snprintf(k0, sizeof k0, "Test-Model@cfg:%s@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s", fa,
             hex);
    snprintf(k1, sizeof k1, "Test-Model@cfg:%s@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@%s", fa,
             hex);
    int ex[3] = {0, 0, 1};
    CHECK_EQ(kvp_client_exist(cl, keys, 3, ex), 0);
    CHECK(ex[0] == 1 && ex[1] == 1 && ex[2] == 0);
    char got[256];
    int64_t n = kvp_client_get(cl, "Test-Model@cfg:0123456789abcdef@kvpool-config", got,
                               sizeof got);
    CHECK_EQ(n, (int64_t)strlen(desc));
    CHECK(n > 0 && memcmp(got, desc, (size_t)n) == 0);

    /* another configuration on the same pool: no hit, and its own store
     * is found by it alone */
    env_close_conn(&e);
    e.c.config_fingerprint = fb;
    e.c.config_description = NULL; /* no descriptor: none is stored */
    CHECK(env_open_conn(&e) == 0);
    CHECK_EQ(lookup_tokens(&e, "fp-b", tok, N, hashes), (uint64_t)0);
    CHECK(store_request(&e, "fp-b2", tok, N, hashes, 99) == 0);
    CHECK_EQ(lookup_tokens(&e, "fp-b3", tok, N, hashes), (uint64_t)(N - BS));
    CHECK(kvp_client_get(cl, "Test-Model@cfg:fedcba9876543210@kvpool-config", got, sizeof got) ==
          KVP_EOBJECT_NOT_FOUND);
    /* without a fingerprint: the in-tree connector's keys, none stored yet */
    env_close_conn(&e);
    e.c.config_fingerprint = NULL;
    CHECK(env_open_conn(&e) == 0);
    CHECK_EQ(lookup_tokens(&e, "fp-c", tok, N, hashes), (uint64_t)0);
    /* the first configuration again: its blocks are all there */
    env_close_conn(&e);
    e.c.config_fingerprint = fa;
    CHECK(env_open_conn(&e) == 0);
    CHECK_EQ(lookup_tokens(&e, "fp-a3", tok, N, hashes), (uint64_t)(N - BS));
    kvp_client_close(cl);
    env_down(&e);
}

TEST(undecodable_step_bytes_are_an_error)
{
    env e;
    CHECK(env_up(&e, 2) == 0);
    kvp_conn_ids ds = {0}, dr = {0};
    uint8_t junk[16] = "KVCM-not-a-step";
    CHECK(kvp_conn_get_finished(e.w[0], junk, sizeof junk, NULL, 0, &ds, &dr) < 0);
    uint8_t zero[3] = {0};
    CHECK(kvp_conn_get_finished(e.w[0], zero, sizeof zero, NULL, 0, &ds, &dr) < 0);
    /* no step at all is fine */
    CHECK_EQ(kvp_conn_get_finished(e.w[0], NULL, 0, NULL, 0, &ds, &dr), 0);
    CHECK_EQ(ds.n + dr.n, (size_t)0);
    kvp_conn_ids_free(&ds);
    kvp_conn_ids_free(&dr);
    env_down(&e);
}

TEST(config_errors_are_named)
{
    kvp_conn_config c;
    kvp_conn_config_default(&c);
    char err[256];
    kvp_conn_sched *s = NULL;
    kvp_conn_worker *w = NULL;
    err[0] = 0;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "ngroups") != NULL);
    kvp_conn_group g[2] = {{.kind = KVP_CONN_FULL_ATTENTION, .block_size = 16},
                           {.kind = KVP_CONN_SLIDING_WINDOW, .block_size = 16}};
    c.groups = g;
    c.ngroups = 2;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "sliding_window") != NULL);
    g[1].sliding_window = 128;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "lookup_socket") != NULL);
    c.hash_block_size = 5;
    c.lookup_socket = "/tmp/kvp-conn-never.sock";
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "hash_block_size") != NULL);
    c.hash_block_size = 0;
    c.block_size = 24;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    c.block_size = 0;
    c.role = 7;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    c.role = KVP_CONN_BOTH;
    c.load_async = false;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "load_async") != NULL);
    c.load_async = true;
    CHECK_EQ(c.lookup_gid, -1); /* the default: no group */
    c.lookup_gid = -2;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "lookup_gid") != NULL);
    c.lookup_gid = UINT32_MAX;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    c.lookup_gid = -1;
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), 0);
    kvp_conn_sched_close(s);
    /* the fingerprint: 12..32 lower-case hex digits; a description needs one */
    static const char *const bad_fp[] = {"0123456789a", "0123456789ABCDEF", "0123456789abcdeg",
                                         "0123456789abcdef0123456789abcdef0"};
    for (size_t i = 0; i < sizeof bad_fp / sizeof bad_fp[0]; i++) {
        c.config_fingerprint = bad_fp[i];
        err[0] = 0;
        CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
        CHECK(strstr(err, "config_fingerprint") != NULL);
        CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), KVP_EINVALID_PARAMS);
    }
    c.config_fingerprint = NULL;
    c.config_description = "{}";
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "config_description") != NULL);
    c.config_fingerprint = "0123456789abcdef";
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), 0);
    kvp_conn_sched_close(s);
    /* the first layout (before config_fingerprint) is still accepted, its
     * missing fields read as none; other sizes are refused */
    c.config_description = "not read";
    c.config_fingerprint = "not read either";
    c.struct_size = offsetof(kvp_conn_config, config_fingerprint);
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), 0);
    kvp_conn_sched_close(s);
    c.struct_size = offsetof(kvp_conn_config, config_description);
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "struct_size") != NULL);
    /* the second layout (before tp_independent) too */
    c.config_fingerprint = "0123456789abcdef";
    c.config_description = NULL;
    c.struct_size = offsetof(kvp_conn_config, tp_independent);
    CHECK_EQ(kvp_conn_sched_open(&c, &s, err, sizeof err), 0);
    kvp_conn_sched_close(s);
    c.struct_size = sizeof c;
    c.config_fingerprint = c.config_description = NULL;

    c.tp_size = 2;
    c.tp_rank = 2;
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "rank") != NULL);
    c.tp_rank = 1;
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "model") != NULL);
    c.model = "m";
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "store_config") != NULL);
    c.store_config = "{\"master\": \"127.0.0.1:1\"}";
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(strstr(err, "num_blocks") != NULL);
    CHECK(w == NULL);
}

/* Every case of tests/vectors/block_hashes.txt without extra keys and with
 * a fixed seed (computed the way vLLM's hash_block_tokens does). */
typedef struct vcase {
    char name[96], algo[32], seed[32];
    unsigned bs;
    uint32_t tok[4096];
    size_t ntok;
    char hash[64][65];
    size_t nhash;
    int extra; /* extra keys or ids over 32 bits: not checked here */
} vcase;

static int check_case(const vcase *v)
{
    kvp_conn_hasher *h;
    if (kvp_conn_hasher_new(v->algo, v->seed, v->bs, &h) != 0)
        return -1;
    size_t hl = kvp_conn_hasher_hash_len(h);
    uint8_t out[64 * 32];
    size_t got = 0, n = 0;
    int ok = 1;
    /* appended in two uneven pieces: the chain must not depend on it */
    size_t cut = v->ntok / 3;
    if (kvp_conn_hasher_append(h, v->tok, cut, out, 64, &n) != 0)
        ok = 0;
    got = n;
    if (ok && kvp_conn_hasher_append(h, v->tok + cut, v->ntok - cut, out + got * hl, 64 - got,
                                     &n) != 0)
        ok = 0;
    got += n;
    if (ok && got != v->nhash)
        ok = 0;
    for (size_t i = 0; ok && i < got; i++) {
        char hex[65];
        for (size_t j = 0; j < hl; j++)
            snprintf(hex + 2 * j, 3, "%02x", out[i * hl + j]);
        if (strcmp(hex, v->hash[i]) != 0)
            ok = 0;
    }
    kvp_conn_hasher_free(h);
    return ok ? 1 : 0;
}

TEST(hasher_matches_vllm_vectors)
{
    FILE *f = fopen("tests/vectors/block_hashes.txt", "r");
    if (!f)
        SKIP("tests/vectors/block_hashes.txt not found (run from the repository root)");
    static char line[1 << 16];
    static vcase v;
    int checked = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (!strncmp(p, "case ", 5)) {
            memset(&v, 0, sizeof v);
            sscanf(p + 5, "%95s", v.name);
        } else if (!strncmp(p, "algo ", 5)) {
            sscanf(p + 5, "%31s", v.algo);
        } else if (!strncmp(p, "seed ", 5)) {
            sscanf(p + 5, "%31s", v.seed);
        } else if (!strncmp(p, "bs ", 3)) {
            v.bs = (unsigned)strtoul(p + 3, NULL, 10);
        } else if (!strncmp(p, "tokens ", 7)) {
            p += 7;
            while (*p && *p != '-' && *p != '\n' && v.ntok < 4096) {
                char *e;
                unsigned long long t = strtoull(p, &e, 10);
                if (e == p)
                    break;
                if (t > UINT32_MAX)
                    v.extra = 1; /* token ids are u32 in this API: not comparable */
                v.tok[v.ntok++] = (uint32_t)t;
                p = e;
            }
        } else if (!strncmp(p, "extra", 5)) {
            if (strncmp(p, "extra -", 7) != 0)
                v.extra = 1;
        } else if (!strncmp(p, "hash ", 5)) {
            if (v.nhash < 64)
                sscanf(p + 5, "%64s", v.hash[v.nhash++]);
        } else if (!strncmp(p, "end", 3)) {
            if (!v.extra && strcmp(v.seed, "-") != 0 && v.bs > 0 && v.nhash < 64) {
                if (check_case(&v) != 1)
                    fprintf(stderr, "    vector case %s failed\n", v.name);
                CHECK_EQ(check_case(&v), 1);
                checked++;
            }
        }
    }
    fclose(f);
    CHECK(checked >= 10);
}

/* A step with many requests (the scale of a real batch: 512 new requests
 * of 4 blocks each): the scheduler's and the workers' per-step scratch must
 * not run out; every request is stored and reported finished on every rank. */
TEST(many_requests_in_one_step)
{
    env e;
    CHECK(env_up(&e, 2) == 0);
    enum { NR = 512, NBK = 4, NT = NBK * BS };
    static uint32_t tok[NR][NT];
    static uint8_t hs[NR][NBK * HL];
    static kvp_conn_request rq[NR];
    static kvp_conn_new_req nr[NR];
    static char ids[NR][16];
    static uint32_t blk[NBK] = {1, 2, 3, 4};
    kvp_conn_blocks bl = {blk, NBK};
    for (int r = 0; r < TP; r++)
        for (uint32_t b = 0; b < NBK; b++)
            fill_block(&e, r, blk[b], b + 7);
    for (int i = 0; i < NR; i++) {
        for (int t = 0; t < NT; t++)
            tok[i][t] = (uint32_t)(i * 100000 + t);
        kvp_conn_hasher *h;
        size_t nh = 0;
        CHECK_EQ(kvp_conn_hasher_new("xxhash_cbor", "0", BS, &h), 0);
        CHECK_EQ(kvp_conn_hasher_append(h, tok[i], NT, hs[i], NBK, &nh), 0);
        CHECK_EQ(nh, (size_t)NBK);
        kvp_conn_hasher_free(h);
        snprintf(ids[i], sizeof ids[i], "m-%d", i);
        rq[i] = (kvp_conn_request){.id = {ids[i], (uint32_t)strlen(ids[i])}, .tokens = tok[i],
                                   .num_tokens = NT, .prompt_tokens = tok[i],
                                   .num_prompt_tokens = NT, .block_hashes = hs[i],
                                   .nhashes = NBK, .hash_len = 16};
        CHECK_EQ(kvp_conn_update_state_after_alloc(e.s, &rq[i], &bl, 1, 0), 0);
        nr[i] = (kvp_conn_new_req){.req = &rq[i], .num_scheduled_tokens = NT, .blocks = &bl,
                                   .ngroups = 1};
    }
    kvp_conn_step st = {.new_reqs = nr, .n_new = NR};
    int s = 0, rv = 0;
    CHECK(step(&e, &st, NULL, &s, &rv) == 0);
    for (int r = 0; r < TP; r++)
        kvp_conn_worker_drain(e.w[r]);
    kvp_conn_stats stats;
    CHECK_EQ(kvp_conn_take_stats(e.w[0], &stats), 1);
    CHECK_EQ(stats.op[KVP_CONN_OP_STORE].keys, (uint64_t)NR * NBK);
    CHECK_EQ(stats.op[KVP_CONN_OP_STORE].failed_keys, (uint64_t)0);
    /* all finish in one step: every rank reports every id */
    static kvp_conn_str fin[NR];
    static const char *finc[NR];
    for (int i = 0; i < NR; i++) {
        bool delay = false;
        CHECK_EQ(kvp_conn_request_finished(e.s, rq[i].id, &bl, 1, &delay), 0);
        CHECK(delay);
        fin[i] = rq[i].id;
        finc[i] = ids[i];
    }
    kvp_conn_step st2 = {.finished = fin, .n_finished = NR};
    const uint8_t *bytes;
    size_t len;
    CHECK_EQ(kvp_conn_build_meta(e.s, &st2, &bytes, &len), 0);
    for (int r = 0; r < TP; r++) {
        kvp_conn_ids ds = {0}, dr = {0};
        CHECK_EQ(kvp_conn_get_finished(e.w[r], bytes, len, finc, NR, &ds, &dr), 0);
        CHECK_EQ(ds.n, (size_t)NR);
        kvp_conn_ids_free(&ds);
        kvp_conn_ids_free(&dr);
    }
    env_down(&e);
}
