/*
 * bench_connector.c -- `kvpool bench connector`: the connector's CPU
 * overhead, in-process (no servers; the scheduler's lookup channel is a
 * fake that answers a hit of 0).
 *
 *  1. scheduler: 256 requests with 2,000-token prompts (block size 16, one
 *     group, 32-byte block hashes) enter as new requests in one untimed
 *     step; then every timed step schedules all 256 as cached running
 *     requests and calls kvp_sched_build_meta once:
 *       decode   1 token each (a new block every 16 steps); no metas;
 *       decode + save_decode_cache  the same steps, every request saving
 *                the block it completes (all 256 together every 16th step:
 *                the p99 is that step);
 *       chunk16  a 16-token prefill chunk each (one new block each), so
 *                every request yields a save meta every step; prompts are
 *                2,000 + 16 x CHUNK_STEPS tokens, and a fresh scheduler is
 *                set up (untimed) every CHUNK_STEPS steps so the context
 *                stays within 2,000..3,024 tokens.
 *     Reported: median and p99 us per build_meta step (which includes the
 *     delta encoding) and the bytes it emits; the worker half of the
 *     step, kvp_meta_decode_delta of those bytes into one mirror (arena
 *     reset included), median and p99 us; every 8th step the decoded step
 *     is checked equal to the scheduler's full view. Target: build_meta +
 *     decode medians < 1 % of a 30 ms decode step, i.e. < 300 us.
 *  2. worker: kvp_tdb_process_tokens + kvp_tdb_prepare_values for 1,000
 *     chunks of 16 tokens on a K/V-first layout of 32 layers x 2 planes
 *     (fake tensors inside one malloc'd buffer; nothing is copied), us per
 *     1,000 blocks; and the coordinator's store_mask and
 *     find_longest_cache_hit (pool holding all 1,000 hashes) for a
 *     1,000-block request, one full-attention group.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/mem.h"
#include "connector/coord.h"
#include "connector/meta.h"
#include "connector/sched.h"
#include "connector/tokendb.h"
#include "kvpool.h"

#define NREQ 256
#define PROMPT 2000
#define BS 16
#define HLEN 32
#define DECODE_STEPS 1024
#define CHUNK_STEPS 64
#define CHUNK_ROUNDS 8
#define DECODE_US 30000.0

#define W_BLOCKS 1000
#define W_LAYERS 32
#define W_NUM_BLOCKS 2048
#define W_ITERS 200

typedef struct breq {
    char id[32];
    uint32_t *toks;
    uint8_t *hs;
    uint32_t *blocks; /* the request's block table (ids) */
    uint32_t nblocks;
    kvp_sched_request r;
} breq;

static int f_lookup(void *arg, const char *req_id, uint32_t id_len, uint32_t num_tokens,
                    const uint8_t *hashes, size_t nhashes, size_t hash_len, bool non_block,
                    bool apply_eagle, uint32_t *hit)
{
    (void)arg, (void)req_id, (void)id_len, (void)num_tokens, (void)hashes, (void)nhashes;
    (void)hash_len, (void)non_block, (void)apply_eagle;
    *hit = 0;
    return 0;
}
static void f_discard(void *arg, const char *req_id, uint32_t id_len)
{
    (void)arg, (void)req_id, (void)id_len;
}
static int f_reset(void *arg, bool *ok)
{
    (void)arg;
    *ok = true;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct stats {
    double p50, p99, mean;
} stats;

static stats summarize(double *v, size_t n)
{
    stats s = {0, 0, 0};
    if (!n)
        return s;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    qsort(v, n, sizeof *v, cmp_d);
    s.p50 = v[n / 2];
    s.p99 = v[(size_t)((double)(n - 1) * 0.99)];
    s.mean = sum / (double)n;
    return s;
}

/* Requests with room for `maxtok` tokens (and hashes, blocks). */
static int reqs_alloc(breq *q, uint32_t maxtok)
{
    uint32_t maxblk = (maxtok + BS - 1) / BS;
    for (uint32_t i = 0; i < NREQ; i++) {
        q[i].toks = kvp_malloc((size_t)maxtok * sizeof *q[i].toks);
        q[i].hs = kvp_malloc((size_t)maxblk * HLEN);
        q[i].blocks = kvp_malloc((size_t)maxblk * sizeof *q[i].blocks);
        if (!q[i].toks || !q[i].hs || !q[i].blocks)
            return KVP_ENOMEM;
        for (uint32_t t = 0; t < maxtok; t++)
            q[i].toks[t] = 1000 + (t * 2654435761u + i) % 50000;
        for (uint32_t b = 0; b < maxblk; b++) {
            for (uint32_t k = 0; k < HLEN; k++)
                q[i].hs[(size_t)b * HLEN + k] = (uint8_t)(i * 131 + b * 7 + k * 13 + 1);
            q[i].blocks[b] = i * maxblk + b;
        }
    }
    return 0;
}

static void reqs_free(breq *q)
{
    for (uint32_t i = 0; i < NREQ; i++) {
        kvp_free(q[i].toks);
        kvp_free(q[i].hs);
        kvp_free(q[i].blocks);
    }
}

/* The request's state before a step: num_tokens known, computed given. */
static void req_set(breq *q, uint32_t i, int round, uint32_t ntok, uint32_t nprompt,
                    uint64_t computed)
{
    int l = snprintf(q[i].id, sizeof q[i].id, "req-%d-%u", round, i);
    q[i].r = (kvp_sched_request){.req_id = q[i].id,
                                 .req_id_len = (uint32_t)l,
                                 .all_token_ids = q[i].toks,
                                 .num_tokens = ntok,
                                 .prompt_token_ids = q[i].toks,
                                 .num_prompt_tokens = nprompt,
                                 .num_computed_tokens = computed,
                                 .block_hashes = q[i].hs,
                                 .nhashes = ntok / BS,
                                 .hash_len = HLEN};
}

static kvp_sched *sched_new(bool save_decode)
{
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.kv_role = KVP_SCHED_BOTH;
    c.save_decode_cache = save_decode;
    c.block_size = BS;
    c.hash_block_size = BS;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s = NULL;
    return kvp_sched_new(&c, &s) == 0 ? s : NULL;
}

/* The untimed first step: all NREQ requests new, PROMPT tokens scheduled
 * (prompt of nprompt tokens). */
static int first_step(kvp_sched *s, breq *q, int round, uint32_t nprompt, kvp_meta_ids *g,
                      kvp_sched_new_req *nr, kvp_meta_mirror *mir, kvp_arena *a)
{
    for (uint32_t i = 0; i < NREQ; i++) {
        req_set(q, i, round, nprompt, nprompt, 0);
        uint64_t num_new = 0;
        bool async = false;
        int rc = kvp_sched_get_num_new_matched_tokens(s, &q[i].r, 0, &num_new, &async);
        if (rc)
            return rc;
        q[i].nblocks = PROMPT / BS;
        g[i] = (kvp_meta_ids){.ids = q[i].blocks, .n = q[i].nblocks, .cap = 0};
        if ((rc = kvp_sched_update_state_after_alloc(s, &q[i].r, &g[i], 1, 0)) != 0)
            return rc;
        nr[i] = (kvp_sched_new_req){.req = &q[i].r, .num_scheduled_tokens = PROMPT,
                                    .block_ids = &g[i], .ngroups = 1};
    }
    kvp_sched_step st = {.new_reqs = nr, .n_new = NREQ};
    const kvp_meta_step *m;
    const uint8_t *bytes;
    size_t len;
    int rc = kvp_sched_build_meta(s, &st, &m, &bytes, &len);
    kvp_meta_step d;
    kvp_arena_reset(a);
    if (rc == 0)
        rc = kvp_meta_decode_delta(mir, bytes, len, a, &d);
    if (rc == 0 && !kvp_meta_step_equal(m, &d))
        rc = KVP_EPROTOCOL;
    return rc;
}

typedef struct sched_res {
    stats st;
    stats dec; /* worker: decode_delta of the step's bytes */
    size_t steps;
    double metas_per_step;
    double bytes_per_step;
} sched_res;

/* chunk = 1: decode (save_decode: with save_decode_cache); chunk = BS:
 * 16-token prefill chunks. */
static int bench_sched(uint32_t chunk, bool save_decode, sched_res *res)
{
    int rounds = chunk == 1 ? 1 : CHUNK_ROUNDS;
    uint32_t steps = chunk == 1 ? DECODE_STEPS : CHUNK_STEPS;
    uint32_t maxtok = PROMPT + chunk * steps + 1;
    breq *q = kvp_calloc(NREQ, sizeof *q);
    kvp_meta_ids *g = kvp_calloc(NREQ, sizeof *g);
    kvp_sched_new_req *nr = kvp_calloc(NREQ, sizeof *nr);
    kvp_sched_cached_req *cr = kvp_calloc(NREQ, sizeof *cr);
    double *lat = kvp_malloc((size_t)rounds * steps * sizeof *lat);
    double *dlat = kvp_malloc((size_t)rounds * steps * sizeof *dlat);
    size_t nlat = 0, metas = 0, bytes_total = 0;
    kvp_meta_mirror *mir = NULL;
    kvp_arena arena;
    kvp_arena_init(&arena, (size_t)1 << 28);
    int rc = KVP_ENOMEM;
    if (!q || !g || !nr || !cr || !lat || !dlat || reqs_alloc(q, maxtok))
        goto out;
    for (int round = 0; round < rounds; round++) {
        kvp_sched *s = sched_new(save_decode);
        kvp_meta_mirror_free(mir);
        mir = kvp_meta_mirror_new(); /* the worker side of this scheduler */
        if (!s || !mir) {
            kvp_sched_free(s);
            rc = KVP_ENOMEM;
            goto out;
        }
        /* decode: the prompt is PROMPT tokens; chunked: the whole prompt is
         * longer, PROMPT of it scheduled in the first step */
        uint32_t nprompt = chunk == 1 ? PROMPT : PROMPT + chunk * steps;
        if ((rc = first_step(s, q, round, nprompt, g, nr, mir, &arena)) != 0) {
            kvp_sched_free(s);
            goto out;
        }
        uint64_t computed = PROMPT;
        for (uint32_t k = 0; k < steps; k++) {
            /* the engine's per-step bookkeeping: not timed */
            for (uint32_t i = 0; i < NREQ; i++) {
                uint32_t ntok = chunk == 1 ? (uint32_t)computed + 1 : nprompt;
                req_set(q, i, round, ntok, nprompt, computed);
                bool newblk = computed % BS == 0; /* the step's tokens start a new block */
                if (newblk)
                    q[i].nblocks++;
                g[i] = (kvp_meta_ids){.ids = q[i].blocks + q[i].nblocks - 1, .n = 1, .cap = 0};
                cr[i] = (kvp_sched_cached_req){.req = &q[i].r, .resumed = false,
                                               .num_scheduled_tokens = chunk,
                                               .new_block_ids = newblk ? &g[i] : NULL,
                                               .ngroups = newblk ? 1 : 0};
            }
            kvp_sched_step st = {.cached = cr, .n_cached = NREQ};
            const kvp_meta_step *m;
            const uint8_t *bytes;
            size_t len;
            uint64_t t0 = kvp_now_ns();
            rc = kvp_sched_build_meta(s, &st, &m, &bytes, &len);
            uint64_t t1 = kvp_now_ns();
            kvp_meta_step d;
            if (rc == 0) {
                kvp_arena_reset(&arena);
                rc = kvp_meta_decode_delta(mir, bytes, len, &arena, &d);
            }
            uint64_t t2 = kvp_now_ns();
            if (rc == 0 && k % 8 == 0 && !kvp_meta_step_equal(m, &d))
                rc = KVP_EPROTOCOL; /* the worker must see exactly the full step */
            if (rc) {
                kvp_sched_free(s);
                goto out;
            }
            dlat[nlat] = (double)(t2 - t1) / 1e3;
            lat[nlat++] = (double)(t1 - t0) / 1e3;
            metas += m->nreqs;
            bytes_total += len;
            computed += chunk;
        }
        kvp_sched_free(s);
    }
    res->steps = nlat;
    res->metas_per_step = (double)metas / (double)nlat;
    res->bytes_per_step = (double)bytes_total / (double)nlat;
    res->st = summarize(lat, nlat);
    res->dec = summarize(dlat, nlat);
    rc = 0;
out:
    kvp_meta_mirror_free(mir);
    kvp_arena_free(&arena);
    kvp_free(dlat);
    if (q)
        reqs_free(q);
    kvp_free(q);
    kvp_free(g);
    kvp_free(nr);
    kvp_free(cr);
    kvp_free(lat);
    return rc;
}

typedef struct worker_res {
    stats prep;   /* process_tokens + prepare_values, us per 1,000 blocks */
    stats store;  /* store_mask, us */
    stats find;   /* find_longest_cache_hit, us */
    size_t pieces;
} worker_res;

static int bench_worker(worker_res *res)
{
    /* per layer: (2, W_NUM_BLOCKS, BS, 1 head, 8) fp16 -> 256 B per block per plane */
    const size_t hd = 8, esz = 2;
    size_t plane = (size_t)W_NUM_BLOCKS * BS * hd; /* elements */
    size_t layer_bytes = 2 * plane * esz;
    uint8_t *buf = kvp_malloc(layer_bytes * W_LAYERS);
    kvp_tdb_chunk *chunks = kvp_malloc(W_BLOCKS * sizeof *chunks);
    kvp_iov *iov = kvp_malloc((size_t)W_BLOCKS * W_LAYERS * 2 * sizeof *iov);
    uint32_t *bids = kvp_malloc(W_BLOCKS * sizeof *bids);
    uint32_t *cbids = kvp_malloc(W_BLOCKS * sizeof *cbids);
    uint8_t *hs = kvp_malloc((size_t)W_BLOCKS * HLEN);
    uint8_t *bits = kvp_malloc(W_BLOCKS);
    double *lat = kvp_malloc(W_ITERS * sizeof *lat);
    kvp_tdb_layout lay = {0};
    struct kvp_coord *co = NULL;
    struct kvp_coord_pool *pool = NULL;
    bool lay_ok = false;
    int rc = KVP_ENOMEM;
    if (!buf || !chunks || !iov || !bids || !cbids || !hs || !bits || !lat)
        goto out;
    if ((rc = kvp_tdb_layout_init(&lay, W_NUM_BLOCKS)) != 0)
        goto out;
    lay_ok = true;
    for (int l = 0; l < W_LAYERS; l++) {
        kvp_tdb_tensor t = {.base = buf + (size_t)l * layer_bytes, .storage_len = layer_bytes,
                            .elem_size = esz, .ndim = 5,
                            .shape = {2, W_NUM_BLOCKS, BS, 1, hd},
                            .stride = {plane, BS * hd, hd, hd, 1}};
        int kind = -1;
        if ((rc = kvp_tdb_layout_add_tensor(&lay, &t, &kind)) != 0)
            goto out;
        if (kind != KVP_TDB_KV_FIRST) {
            rc = KVP_EINVALID_PARAMS;
            goto out;
        }
    }
    kvp_tdb db;
    if ((rc = kvp_tdb_init(&db, BS, BS, &lay)) != 0)
        goto out;
    for (uint32_t b = 0; b < W_BLOCKS; b++) {
        bids[b] = (b * 7919u) % W_NUM_BLOCKS; /* scattered, distinct (7919 odd) */
        for (uint32_t k = 0; k < HLEN; k++)
            hs[(size_t)b * HLEN + k] = (uint8_t)(b * 7 + k * 13 + (b >> 8) * 29 + 1);
    }
    size_t cap = (size_t)W_BLOCKS * lay.nsegs;
    res->pieces = cap;
    for (int it = 0; it < W_ITERS; it++) {
        size_t n = 0;
        uint64_t t0 = kvp_now_ns();
        rc = kvp_tdb_process_tokens(&db, (uint64_t)W_BLOCKS * BS, W_BLOCKS, 0, NULL, 0, 1, 0,
                                    chunks, W_BLOCKS, &n);
        if (rc == 0)
            rc = kvp_tdb_prepare_values(&db, chunks, n, bids, W_BLOCKS, iov, cap, cbids);
        uint64_t t1 = kvp_now_ns();
        if (rc)
            goto out;
        if (n != W_BLOCKS) {
            rc = KVP_EINVALID_PARAMS;
            goto out;
        }
        lat[it] = (double)(t1 - t0) / 1e3;
    }
    res->prep = summarize(lat, W_ITERS);

    struct kvp_coord_group grp = {.kind = KVP_COORD_FULL, .block_size = BS};
    struct kvp_coord_cfg cfg = {.groups = &grp, .ngroups = 1, .scheduler_block_size = 0,
                                .hash_block_size = BS, .retention_interval = -1,
                                .dcp_world_size = 1};
    if ((rc = kvp_coord_create(&co, &cfg)) != 0 ||
        (rc = kvp_coord_pool_create(&pool, HLEN, W_BLOCKS)) != 0)
        goto out;
    for (uint32_t b = 0; b < W_BLOCKS; b++)
        if ((rc = kvp_coord_pool_add(pool, 0, hs + (size_t)b * HLEN)) != 0)
            goto out;
    size_t tokens = (size_t)W_BLOCKS * BS;
    struct kvp_coord_mask mask = {.bits = bits, .cap = W_BLOCKS};
    for (int it = 0; it < W_ITERS; it++) {
        uint64_t t0 = kvp_now_ns();
        rc = kvp_coord_store_mask(co, tokens, 0, (int64_t)tokens, 0, &mask);
        uint64_t t1 = kvp_now_ns();
        if (rc)
            goto out;
        lat[it] = (double)(t1 - t0) / 1e3;
    }
    res->store = summarize(lat, W_ITERS);
    struct kvp_coord_hashes h = {.data = hs, .n = W_BLOCKS, .hash_len = HLEN, .stride = 0};
    for (int it = 0; it < W_ITERS; it++) {
        size_t hit = 0;
        uint64_t t0 = kvp_now_ns();
        rc = kvp_coord_find_longest_cache_hit(co, &h, tokens, pool, 1, &mask, &hit);
        uint64_t t1 = kvp_now_ns();
        if (rc)
            goto out;
        if (hit + BS < tokens) { /* the whole request (eagle off) is in the pool */
            rc = KVP_EINVALID_PARAMS;
            goto out;
        }
        lat[it] = (double)(t1 - t0) / 1e3;
    }
    res->find = summarize(lat, W_ITERS);
    rc = 0;
out:
    kvp_coord_pool_destroy(pool);
    kvp_coord_destroy(co);
    if (lay_ok)
        kvp_tdb_layout_free(&lay);
    kvp_free(buf);
    kvp_free(chunks);
    kvp_free(iov);
    kvp_free(bids);
    kvp_free(cbids);
    kvp_free(hs);
    kvp_free(bits);
    kvp_free(lat);
    return rc;
}

int kvp_bench_connector(int argc, char **argv)
{
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL}, {NULL, KVP_CLI_TEXT}};
    const char *v[1] = {NULL};
    int rc = kvp_cli_scan(argc, argv, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool bench connector [--json]\n"
               "  the connector's CPU overhead, in-process (no servers):\n"
               "  scheduler build_meta per step for %d running requests (decode and\n"
               "  16-token chunks) and worker preparation per 1,000 blocks\n",
               NREQ);
        return 0;
    }
    if (rc < 0)
        return 2;
    int json = v[0] != NULL;
    FILE *out = json ? stderr : stdout;
    sched_res dec = {0}, chk = {0}, sdc = {0};
    worker_res w = {0};
    fprintf(out, "kvpool bench connector: %d requests, %d-token prompts, block size %d, "
                 "1 group\n", NREQ, PROMPT, BS);
    if ((rc = bench_sched(1, false, &dec)) != 0 || (rc = bench_sched(BS, false, &chk)) != 0 ||
        (rc = bench_sched(1, true, &sdc)) != 0) {
        fprintf(stderr, "kvpool bench connector: scheduler: %s\n", kvp_strerror(rc));
        return 1;
    }
    if ((rc = bench_worker(&w)) != 0) {
        fprintf(stderr, "kvpool bench connector: worker: %s\n", kvp_strerror(rc));
        return 1;
    }
    fprintf(out, "  %-34s %6s %10s %10s %10s %8s\n", "", "steps", "p50 us", "p99 us",
            "mean us", "% 30ms");
    const char *names[3] = {"build_meta, decode 1 tok x256", "build_meta, chunk 16 tok x256",
                            "build_meta, decode + save_decode"};
    const char *dnames[3] = {"  worker decode_delta, decode", "  worker decode_delta, chunk 16",
                             "  worker decode_delta, save_decode"};
    sched_res *sr[3] = {&dec, &chk, &sdc};
    for (int i = 0; i < 3; i++) {
        fprintf(out, "  %-34s %6zu %10.1f %10.1f %10.1f %7.3f%%   (%.0f metas, %.0f B/step)\n",
                names[i], sr[i]->steps, sr[i]->st.p50, sr[i]->st.p99, sr[i]->st.mean,
                100.0 * sr[i]->st.p50 / DECODE_US, sr[i]->metas_per_step,
                sr[i]->bytes_per_step);
        fprintf(out, "  %-34s %6zu %10.1f %10.1f %10.1f %7.3f%%\n", dnames[i], sr[i]->steps,
                sr[i]->dec.p50, sr[i]->dec.p99, sr[i]->dec.mean,
                100.0 * sr[i]->dec.p50 / DECODE_US);
    }
    fprintf(out, "  %-34s %6d %10.1f %10.1f %10.1f   (%zu pieces)\n",
            "worker prep, 1000 blocks 32Lx2", W_ITERS, w.prep.p50, w.prep.p99, w.prep.mean,
            w.pieces);
    fprintf(out, "  %-34s %6d %10.2f %10.2f %10.2f\n", "coord store_mask, 1000 blocks", W_ITERS,
            w.store.p50, w.store.p99, w.store.mean);
    fprintf(out, "  %-34s %6d %10.1f %10.1f %10.1f\n", "coord find_longest_hit, 1000 blk",
            W_ITERS, w.find.p50, w.find.p99, w.find.mean);
    fprintf(out, "  target build_meta + decode_delta p50 < 300 us (1 %% of a 30 ms decode "
                 "step): decode %s (%.1f us), chunk 16 %s (%.1f us), decode + save_decode "
                 "%s (%.1f us)\n",
            dec.st.p50 + dec.dec.p50 < 300 ? "met" : "NOT met", dec.st.p50 + dec.dec.p50,
            chk.st.p50 + chk.dec.p50 < 300 ? "met" : "NOT met", chk.st.p50 + chk.dec.p50,
            sdc.st.p50 + sdc.dec.p50 < 300 ? "met" : "NOT met", sdc.st.p50 + sdc.dec.p50);
    if (json) {
        printf("{\n  \"bench\": \"connector\",\n  \"requests\": %d,\n  \"prompt_tokens\": %d,\n"
               "  \"block_size\": %d,\n  \"decode_step_us\": %.0f,\n  \"sched\": [\n",
               NREQ, PROMPT, BS, DECODE_US);
        const char *keys[3] = {"decode_1", "chunk_16", "decode_1_save_decode_cache"};
        for (int i = 0; i < 3; i++)
            printf("    {\"mode\": \"%s\", \"steps\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, "
                   "\"mean_us\": %.1f, \"fraction_of_decode_step\": %.5f, "
                   "\"metas_per_step\": %.0f, \"meta_bytes_per_step\": %.0f, "
                   "\"decode_p50_us\": %.1f, \"decode_p99_us\": %.1f, "
                   "\"decode_mean_us\": %.1f, \"total_p50_us\": %.1f, "
                   "\"total_fraction_of_decode_step\": %.5f}%s\n",
                   keys[i], sr[i]->steps, sr[i]->st.p50, sr[i]->st.p99, sr[i]->st.mean,
                   sr[i]->st.p50 / DECODE_US, sr[i]->metas_per_step, sr[i]->bytes_per_step,
                   sr[i]->dec.p50, sr[i]->dec.p99, sr[i]->dec.mean,
                   sr[i]->st.p50 + sr[i]->dec.p50,
                   (sr[i]->st.p50 + sr[i]->dec.p50) / DECODE_US, i < 2 ? "," : "");
        printf("  ],\n  \"worker_prepare\": {\"blocks\": %d, \"layers\": %d, \"planes\": 2, "
               "\"pieces\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f},\n",
               W_BLOCKS, W_LAYERS, w.pieces, w.prep.p50, w.prep.p99, w.prep.mean);
        printf("  \"coord\": {\"blocks\": %d, \"store_mask_p50_us\": %.2f, "
               "\"store_mask_p99_us\": %.2f, \"find_longest_cache_hit_p50_us\": %.1f, "
               "\"find_longest_cache_hit_p99_us\": %.1f}\n}\n",
               W_BLOCKS, w.store.p50, w.store.p99, w.find.p50, w.find.p99);
    }
    return 0;
}
