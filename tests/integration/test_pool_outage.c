/* test_pool_outage.c -- "the engine outlives the pool": the public connector
 * API (kvpool_connector.h) with the pool down at open, started later, killed
 * in the middle of loads and restarted on the same address. One scheduler
 * and two TP worker ranks in this process over a paged host-memory KV cache
 * (as test_connector_api.c), a real `kvpool master` + `kvpool store` on
 * loopback. Every engine-facing call must return promptly whatever the
 * pool does; lookups miss while it is down, stores are skipped and counted,
 * loads in flight are reported failed (the engine recomputes them), and hits
 * come back once stores land again. The log says each outage once. Also:
 * configuration errors still fail at open; a master that accepts but never
 * answers costs one rpc_timeout at open, then the worker runs detached; a
 * client whose node restarted (a new segment) unmaps the old one. */
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client/client_int.h"
#include "client/xfer.h"
#include "common/log.h"
#include "harness.h"
#include "kvpool.h"
#include "kvpool_connector.h"
#include "net/net.h"
#include "proc.h"

#define NB 32   /* blocks */
#define BS 16   /* tokens per block */
#define DIM 16  /* bytes per token per plane */
#define LAYERS 2
#define PLANE ((size_t)NB * BS * DIM)
#define TP 2
#define HL 32
#define NA 64            /* request A: 4 blocks */
#define NBK (NA / BS)
#define NX 80            /* a request sharing A's 64 tokens: 5 blocks */
#define NBX (NX / BS)
#define PROMPT_MS 1500   /* what any engine-facing call may take (rpc_timeout is 2 s) */
#define ATTACH_MS 20000  /* the link's back-off is at most 10 s */

/* Worker warnings and errors, counted by a log sink (and still printed). */
static atomic_int warns, errors;
static void sink(void *ctx, const kvp_log_record *r)
{
    (void)ctx;
    if (strcmp(r->mod, "worker") == 0 && r->level == KVP_LOG_WARN)
        warns++;
    if (strcmp(r->mod, "worker") == 0 && r->level >= KVP_LOG_ERROR)
        errors++;
    ssize_t w = write(2, r->line, r->line_len);
    (void)w;
}
static const kvp_log_sink the_sink = {sink, NULL};

typedef struct env {
    char addr[64];
    tp_master m;
    tp_store st;
    char cfg[256];
    char sock[108];
    kvp_conn_group g;
    kvp_conn_config c;
    kvp_conn_sched *s;
    kvp_conn_worker *w[TP];
    uint8_t *kv[TP][LAYERS]; /* (2, NB, BS, DIM) each */
    uint32_t tok[NX];
    uint8_t hashes[8 * HL];
} env;

static void fill_block(env *e, int rank, uint32_t block, uint32_t seed)
{
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            uint8_t *b = e->kv[rank][l] + (size_t)p * PLANE + (size_t)block * BS * DIM;
            for (size_t i = 0; i < (size_t)BS * DIM; i++)
                b[i] = (uint8_t)(seed * 131u + (uint32_t)rank * 29u + (uint32_t)l * 7u +
                                 (uint32_t)p * 3u + (uint32_t)i);
        }
}

static int same_block(env *e, int rank, uint32_t a, uint32_t b)
{
    for (int l = 0; l < LAYERS; l++)
        for (int p = 0; p < 2; p++) {
            const uint8_t *x = e->kv[rank][l] + (size_t)p * PLANE + (size_t)a * BS * DIM;
            const uint8_t *y = e->kv[rank][l] + (size_t)p * PLANE + (size_t)b * BS * DIM;
            if (memcmp(x, y, (size_t)BS * DIM) != 0)
                return 0;
        }
    return 1;
}

/* `kvpool master` on e->addr and a 64 MiB `kvpool store` (what `kvpool serve` is,
 * in two processes). 0 or -1. */
static int pool_start(env *e)
{
    if (tp_master_start(&e->m, (const char *const[]){"--listen", e->addr, NULL}) != 0)
        return -1;
    return tp_store_start(&e->st, e->m.addr, (const char *const[]){"--segment-size", "64MiB",
                                                                   NULL});
}

/* kill -9 of both: the pool crashed. */
static void pool_kill(env *e)
{
    tp_store_kill(&e->st);
    tp_master_kill(&e->m);
}

/* Scheduler and TP workers on e->addr, whatever the pool's state. */
static int engine_up(env *e, const char *extra_json)
{
    kvp_log_set_sink(&the_sink);
    snprintf(e->cfg, sizeof e->cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"2s\"%s}",
             e->addr, extra_json ? extra_json : "");
    snprintf(e->sock, sizeof e->sock, "/tmp/kvp-outage-%d.sock", (int)getpid());
    e->g = (kvp_conn_group){.kind = KVP_CONN_FULL_ATTENTION, .block_size = BS,
                            .num_kv_heads = TP};
    kvp_conn_config_default(&e->c);
    e->c.model = "/models/org/Outage-Model";
    e->c.groups = &e->g;
    e->c.ngroups = 1;
    e->c.lookup_socket = e->sock;
    e->c.store_config = e->cfg;
    e->c.tp_size = TP;
    e->c.num_blocks = NB;
    char err[512] = "";
    for (int r = 0; r < TP; r++) {
        kvp_conn_config wc = e->c;
        wc.tp_rank = r;
        uint64_t t0 = tp_now_ms();
        if (kvp_conn_worker_open(&wc, &e->w[r], err, sizeof err) != 0) {
            fprintf(stderr, "worker_open: %s\n", err);
            return -1;
        }
        if (tp_now_ms() - t0 > PROMPT_MS) {
            fprintf(stderr, "worker_open took %llu ms\n", (unsigned long long)(tp_now_ms() - t0));
            return -1;
        }
        kvp_conn_tensor t[LAYERS];
        for (int l = 0; l < LAYERS; l++) {
            if (!(e->kv[r][l] = calloc(1, 2 * PLANE)))
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
    for (uint32_t i = 0; i < NX; i++)
        e->tok[i] = 3000 + i * 11;
    kvp_conn_hasher *h;
    size_t nh = 0;
    if (kvp_conn_hasher_new("sha256_cbor", "0", BS, &h) != 0)
        return -1;
    int rc = kvp_conn_hasher_append(h, e->tok, NX, e->hashes, 8, &nh);
    kvp_conn_hasher_free(h);
    return rc == 0 && nh == NBX ? 0 : -1;
}

static void engine_down(env *e)
{
    kvp_conn_sched_close(e->s);
    for (int r = 0; r < TP; r++) {
        uint64_t t0 = tp_now_ms();
        kvp_conn_worker_close(e->w[r]);
        if (tp_now_ms() - t0 > 3000) /* the link thread stops within rpc_timeout */
            th_fail(__FILE__, __LINE__, "worker_close took %llu ms",
                    (unsigned long long)(tp_now_ms() - t0));
        for (int l = 0; l < LAYERS; l++)
            free(e->kv[r][l]);
    }
    kvp_log_set_sink(NULL);
}

static kvp_conn_pool_status pool_status(env *e, int r)
{
    kvp_conn_pool_status ps;
    kvp_conn_pool_status_init(&ps);
    if (kvp_conn_pool_status_get(e->w[r], &ps) != 0)
        th_fail(__FILE__, __LINE__, "kvp_conn_pool_status_get");
    return ps;
}

/* Waits (bounded) until every rank's pool is available (want 1) or not. */
static int wait_available(env *e, int want, unsigned ms)
{
    uint64_t end = tp_now_ms() + ms;
    for (;;) {
        int n = 0;
        for (int r = 0; r < TP; r++)
            n += pool_status(e, r).available == (want != 0);
        if (n == TP)
            return 0;
        if (tp_now_ms() > end)
            return -1;
        tp_sleep_ms(50);
    }
}

/* One engine step (build the bytes, every rank's get_finished), each call
 * bounded by PROMPT_MS; *sending / *recving: ids every rank reported. */
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
        uint64_t t0 = tp_now_ms();
        if (kvp_conn_get_finished(e->w[r], bytes, len, finl, fin ? 1 : 0, &ds, &dr) != 0)
            return -1;
        if (tp_now_ms() - t0 > PROMPT_MS)
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

/* Empty steps until every rank reported the request (finished first when
 * fin), draining the ranks between steps. */
static int until_reported(env *e, const char *fin, int want_send, int want_recv)
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
    if (got_s == want_send * TP && got_r == want_recv * TP)
        return 0;
    fprintf(stderr, "reported sending %d recving %d\n", got_s, got_r);
    return -1;
}

static kvp_conn_request req(env *e, const char *id, uint32_t ntok)
{
    return (kvp_conn_request){.id = {id, (uint32_t)strlen(id)}, .tokens = e->tok,
                              .num_tokens = ntok, .prompt_tokens = e->tok,
                              .num_prompt_tokens = ntok, .block_hashes = e->hashes,
                              .nhashes = ntok / BS, .hash_len = HL};
}

/* The lookup of r, timed: the hit, or -1 when it failed or was slow. */
static long lookup(env *e, const kvp_conn_request *r)
{
    uint64_t nn = 99, t0 = tp_now_ms();
    bool async = false;
    if (kvp_conn_get_num_new_matched_tokens(e->s, r, 0, &nn, &async) != 0)
        return -1;
    if (tp_now_ms() - t0 > PROMPT_MS) {
        fprintf(stderr, "lookup took %llu ms\n", (unsigned long long)(tp_now_ms() - t0));
        return -1;
    }
    return (long)nn;
}

/* Request `id` of A's 64 tokens, computed in blocks 1..4 (filled with the
 * same bytes every time), stored (or skipped), finished, reported. */
static int store_a(env *e, const char *id)
{
    kvp_conn_request a = req(e, id, NA);
    uint32_t ba[NBK] = {1, 2, 3, 4};
    for (int r = 0; r < TP; r++)
        for (uint32_t b = 0; b < NBK; b++)
            fill_block(e, r, ba[b], b);
    kvp_conn_blocks bl = {ba, NBK};
    REQUIRE(lookup(e, &a) >= 0);
    REQUIRE(kvp_conn_update_state_after_alloc(e->s, &a, &bl, 1, 0) == 0);
    kvp_conn_new_req nr = {.req = &a, .num_scheduled_tokens = NA, .blocks = &bl, .ngroups = 1};
    kvp_conn_step st = {.new_reqs = &nr, .n_new = 1};
    int s = 0, rv = 0;
    REQUIRE(step(e, &st, NULL, &s, &rv) == 0);
    bool delay = false;
    REQUIRE(kvp_conn_request_finished(e->s, a.id, &bl, 1, &delay) == 0);
    REQUIRE(delay);
    REQUIRE(until_reported(e, id, 1, 0) == 0);
    return 0;
}

/* Request `id` (A's tokens + 16) loads the hit it was given into blocks
 * 10..14 and finishes. Returns the number of blocks reported failed per
 * rank (the same on both: checked), or -1. *same: the loaded blocks equal
 * A's on every rank. */
static int load_x(env *e, const char *id, uint64_t hit, int *same)
{
    kvp_conn_request x = req(e, id, NX);
    uint32_t bx[NBX] = {10, 11, 12, 13, 14};
    for (int r = 0; r < TP; r++)
        for (uint32_t b = 0; b < NBX; b++)
            fill_block(e, r, bx[b], 77); /* poison */
    kvp_conn_blocks bl = {bx, NBX};
    REQUIRE(kvp_conn_update_state_after_alloc(e->s, &x, &bl, 1, hit) == 0);
    kvp_conn_step st = {0};
    int s = 0, rv = 0;
    REQUIRE(step(e, &st, NULL, &s, &rv) == 0);
    REQUIRE(until_reported(e, NULL, 0, 1) == 0);
    int nfail = -1;
    *same = 1;
    for (int r = 0; r < TP; r++) {
        uint32_t *bad = NULL;
        size_t nbad = 0;
        REQUIRE(kvp_conn_load_errors(e->w[r], &bad, &nbad) == 0);
        for (size_t i = 0; i < nbad; i++)
            REQUIRE(bad[i] >= 10 && bad[i] < 10 + NBK);
        kvp_conn_free(bad);
        REQUIRE(nfail < 0 || nfail == (int)nbad);
        nfail = (int)nbad;
        for (uint32_t k = 0; k < NBK; k++)
            *same &= same_block(e, r, 1 + k, bx[k]);
    }
    bool delay = false;
    REQUIRE(kvp_conn_request_finished(e->s, x.id, &bl, 1, &delay) == 0);
    REQUIRE(until_reported(e, id, delay ? 1 : 0, 0) == 0);
    return nfail;
}

TEST(engine_outlives_the_pool)
{
    env e;
    memset(&e, 0, sizeof e);
    CHECK_EQ(tp_free_addr(e.addr, sizeof e.addr), 0);

    /* 1. the pool is down when the engine starts: it starts anyway, detached */
    CHECK_EQ(engine_up(&e, NULL), 0);
    CHECK_EQ(warns, TP); /* one warning per rank, naming the master */
    for (int r = 0; r < TP; r++) {
        kvp_conn_pool_status ps = pool_status(&e, r);
        CHECK(!ps.available && !ps.attached);
        CHECK_EQ(ps.outages, 1);
    }
    kvp_conn_request x = req(&e, "x0", NX);
    CHECK_EQ(lookup(&e, &x), 0);
    CHECK_EQ(store_a(&e, "a0"), 0); /* skipped, counted */
    CHECK_EQ(lookup(&e, &x), 0);
    for (int r = 0; r < TP; r++)
        CHECK(pool_status(&e, r).skipped_stores >= 1);
    CHECK(pool_status(&e, 0).skipped_lookups >= 2); /* rank 0 answers the lookups */
    kvp_conn_stats stats;
    kvp_conn_take_stats(e.w[0], &stats);
    CHECK_EQ(stats.op[KVP_CONN_OP_STORE].count, 0); /* nothing was sent to the pool */

    /* 2. the pool starts: the ranks attach, stores land, lookups hit */
    CHECK_EQ(pool_start(&e), 0);
    CHECK_EQ(wait_available(&e, 1, ATTACH_MS), 0);
    for (int r = 0; r < TP; r++)
        CHECK(pool_status(&e, r).attached);
    CHECK_EQ(store_a(&e, "a1"), 0);
    CHECK_EQ(lookup(&e, &x), NA);
    int same = 0;
    x = req(&e, "x1", NX);
    CHECK_EQ(lookup(&e, &x), NA);
    CHECK_EQ(load_x(&e, "x1", NA, &same), 0);
    CHECK(same);
    CHECK_EQ(warns, TP); /* nothing more said */

    /* 3. the pool is killed with a load granted but not started: the load
     * fails (every block reported, the engine recomputes), nothing hangs */
    x = req(&e, "x2", NX);
    CHECK_EQ(lookup(&e, &x), NA);
    pool_kill(&e);
    CHECK_EQ(load_x(&e, "x2", NA, &same), NBK);
    x = req(&e, "x3", NX);
    CHECK_EQ(lookup(&e, &x), 0); /* down: a miss, at once */
    CHECK_EQ(wait_available(&e, 0, PROMPT_MS), 0);
    uint64_t skipped[TP];
    for (int r = 0; r < TP; r++)
        skipped[r] = pool_status(&e, r).skipped_stores;
    CHECK_EQ(store_a(&e, "a2"), 0); /* skipped */
    CHECK_EQ(lookup(&e, &x), 0);
    for (int r = 0; r < TP; r++) {
        kvp_conn_pool_status ps = pool_status(&e, r);
        CHECK(ps.attached && !ps.available);
        CHECK(ps.skipped_stores > skipped[r]);
    }
    /* the link confirms the outage: one warning per rank, no more */
    uint64_t end = tp_now_ms() + 5000;
    while ((pool_status(&e, 0).outages < 2 || pool_status(&e, 1).outages < 2) &&
           tp_now_ms() < end)
        tp_sleep_ms(50);
    CHECK_EQ(pool_status(&e, 0).outages, 2);
    CHECK_EQ(pool_status(&e, 1).outages, 2);
    CHECK_EQ(warns, 2 * TP);

    /* 4. the pool restarts on the same address (empty, a new segment): the
     * ranks reconnect, stores land again, hits resume */
    CHECK_EQ(pool_start(&e), 0);
    CHECK_EQ(wait_available(&e, 1, ATTACH_MS), 0);
    x = req(&e, "x4", NX);
    CHECK_EQ(lookup(&e, &x), 0); /* the new pool is empty */
    CHECK_EQ(store_a(&e, "a3"), 0);
    x = req(&e, "x5", NX);
    CHECK_EQ(lookup(&e, &x), NA);
    CHECK_EQ(load_x(&e, "x5", NA, &same), 0);
    CHECK(same);
    CHECK_EQ(warns, 2 * TP);
    CHECK_EQ(errors, 0);
    for (int r = 0; r < TP; r++)
        CHECK_EQ(pool_status(&e, r).outages, 2);
    engine_down(&e);
    CHECK_EQ(tp_store_stop(&e.st), 0);
    CHECK_EQ(tp_master_stop(&e.m), 0);
}

/* A master that accepts connections but never answers (a hung process): the
 * open costs one rpc_timeout, then the worker runs detached, and nothing
 * after that waits for it. */
TEST(silent_master_costs_one_timeout_at_open)
{
    char err[256];
    uint16_t port = 0;
    int lfd = kvp_net_listen("127.0.0.1:0", 16, &port, err, sizeof err); /* never accepted */
    CHECK(lfd >= 0);
    env e;
    memset(&e, 0, sizeof e);
    snprintf(e.addr, sizeof e.addr, "127.0.0.1:%u", port);
    kvp_log_set_sink(&the_sink);
    snprintf(e.cfg, sizeof e.cfg,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"500ms\"}",
             e.addr);
    e.g = (kvp_conn_group){.kind = KVP_CONN_FULL_ATTENTION, .block_size = BS};
    kvp_conn_config c;
    kvp_conn_config_default(&c);
    c.model = "m";
    c.groups = &e.g;
    c.ngroups = 1;
    c.enable_lookup = false;
    c.store_config = e.cfg;
    c.num_blocks = NB;
    kvp_conn_worker *w = NULL;
    uint64_t t0 = tp_now_ms();
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), 0);
    uint64_t dt = tp_now_ms() - t0;
    CHECK(dt >= 400 && dt < 2000);
    kvp_conn_pool_status ps;
    kvp_conn_pool_status_init(&ps);
    CHECK_EQ(kvp_conn_pool_status_get(w, &ps), 0);
    CHECK(!ps.available && !ps.attached);
    ps.struct_size = 8;
    CHECK_EQ(kvp_conn_pool_status_get(w, &ps), KVP_EINVALID_PARAMS);
    t0 = tp_now_ms();
    kvp_conn_worker_close(w);
    CHECK(tp_now_ms() - t0 < 1500); /* an attempt in progress: one rpc_timeout at most */
    kvp_log_set_sink(NULL);
    close(lfd);
}

/* Only an unreachable pool opens detached: a configuration error is still
 * an error at open, with its message. */
TEST(configuration_errors_still_fail_at_open)
{
    tp_master m;
    char path[] = "/tmp/kvp-outage-token-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    CHECK(write(fd, "the-token\n", 10) == 10);
    close(fd);
    CHECK_EQ(tp_master_start(&m, (const char *const[]){"--cluster-token-file", path, NULL}), 0);
    kvp_conn_group g = {.kind = KVP_CONN_FULL_ATTENTION, .block_size = BS};
    kvp_conn_config c;
    kvp_conn_config_default(&c);
    c.model = "m";
    c.groups = &g;
    c.ngroups = 1;
    c.enable_lookup = false;
    c.num_blocks = NB;
    char cfg[512], err[512];
    kvp_conn_worker *w = NULL;
    struct {
        const char *json;
        int rc;
        const char *says;
    } cases[] = {
        {"{\"master\": \"%s\", ", KVP_ECONFIG, ""},                      /* not JSON */
        {"{\"master\": \"%s\", \"no_such_key\": 1}", KVP_ECONFIG, "no_such_key"},
        {"{\"master\": \"%s\", \"cluster_token\": \"wrong\"}", KVP_EAUTH, "HELLO"},
        {"{\"master\": \"%s\"}", KVP_EAUTH, "cluster token"}, /* none given */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cfg, sizeof cfg, cases[i].json, m.addr);
        c.store_config = cfg;
        err[0] = 0;
        CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), cases[i].rc);
        CHECK(w == NULL);
        if (!strstr(err, cases[i].says))
            th_fail(__FILE__, __LINE__, "case %zu: %s", i, err);
    }
    /* the right token: attached */
    snprintf(cfg, sizeof cfg, "{\"master\": \"%s\", \"cluster_token\": \"the-token\"}", m.addr);
    c.store_config = cfg;
    CHECK_EQ(kvp_conn_worker_open(&c, &w, err, sizeof err), 0);
    kvp_conn_pool_status ps;
    kvp_conn_pool_status_init(&ps);
    CHECK_EQ(kvp_conn_pool_status_get(w, &ps), 0);
    CHECK(ps.available && ps.attached);
    CHECK_EQ(ps.outages, 0);
    kvp_conn_worker_close(w);
    CHECK_EQ(tp_master_stop(&m), 0);
    unlink(path);
}

/* The client under the connector: a `kvpool master` + `kvpool store` killed
 * and restarted on the same address. The client reconnects (a new HELLO), its
 * puts land on the new segment, and the old segment's shared memory -- the
 * dead node's, never to be used again -- is unmapped then. */
TEST(client_follows_a_restarted_pool_and_unmaps_the_old_segment)
{
    env e;
    memset(&e, 0, sizeof e);
    CHECK_EQ(tp_free_addr(e.addr, sizeof e.addr), 0);
    CHECK_EQ(pool_start(&e), 0);
    kvp_client *c = tp_client_open(e.addr, ", \"rpc_timeout\": \"2s\"");
    CHECK(c != NULL);
    uint8_t v[4096], back[4096];
    tp_fill(v, sizeof v, 1);
    CHECK_EQ(kvp_client_put(c, "k1", v, sizeof v), 0);
    CHECK_EQ(kvp_client_get(c, "k1", back, sizeof back), (int64_t)sizeof v);
    uint64_t old_id = 0, size = 0;
    CHECK_EQ(tp_master_seg_list(e.addr, &old_id, NULL, 0), 1);
    if (getenv("KVPOOL_FORCE_TCP") == NULL)
        CHECK(kvp_xfer_shm_map(c->xfer, old_id, &size) != NULL); /* attached over shm */
    pool_kill(&e);
    CHECK(kvp_client_put(c, "k2", v, sizeof v) < 0); /* fails, at once */
    CHECK_EQ(pool_start(&e), 0);
    uint64_t new_id = 0;
    CHECK_EQ(tp_master_seg_list(e.addr, &new_id, NULL, 0), 1);
    CHECK(new_id != old_id);
    tp_fill(v, sizeof v, 2);
    CHECK_EQ(kvp_client_put(c, "k2", v, sizeof v), 0);
    memset(back, 0, sizeof back);
    CHECK_EQ(kvp_client_get(c, "k2", back, sizeof back), (int64_t)sizeof v);
    CHECK(memcmp(v, back, sizeof v) == 0);
    CHECK(kvp_client_get(c, "k1", back, sizeof back) < 0); /* gone with the old pool */
    CHECK(kvp_xfer_shm_map(c->xfer, old_id, &size) == NULL);
    if (getenv("KVPOOL_FORCE_TCP") == NULL)
        CHECK(!kvp_xfer_has_segment(c->xfer, old_id)); /* freed, not only unmapped */
    kvp_client_close(c);
    CHECK_EQ(tp_store_stop(&e.st), 0);
    CHECK_EQ(tp_master_stop(&e.m), 0);
}
