/*
 * test_accept_sched.c -- spec §18 acceptance items of
 * test_mooncake_store_scheduler.py that tests/unit/test_sched.c does not
 * assert exactly: a full external hit keeps the L-aligned kvpool tokens
 * through to the load meta, a full local hit skips the load (and the step
 * saves instead), a partial-hash hit loads the sub-block tail (24), and
 * running requests APPEND blocks while resumed ones REPLACE them, within
 * one request's life. The mapping of every §18 item to a test is
 * docs/ACCEPTANCE.md.
 */
#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "connector/meta.h"
#include "connector/sched.h"
#include "harness.h"
#include "kvpool.h"

#define HL 8

static struct {
    int calls;
    uint32_t hit;
    uint32_t num_tokens;
    size_t nhashes;
} F;

static int f_lookup(void *arg, const char *req_id, uint32_t id_len, uint32_t num_tokens,
                    const uint8_t *hashes, size_t nhashes, size_t hash_len, bool non_block,
                    bool apply_eagle, uint32_t *hit)
{
    (void)arg, (void)req_id, (void)id_len, (void)hashes, (void)hash_len, (void)non_block,
        (void)apply_eagle;
    F.calls++;
    F.num_tokens = num_tokens;
    F.nhashes = nhashes;
    *hit = F.hit;
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

static kvp_sched *mk_sched(uint32_t L, uint32_t H, bool partial)
{
    memset(&F, 0, sizeof F);
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.block_size = L;
    c.hash_block_size = H;
    c.enable_partial_hash_hits = partial;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s = NULL;
    return kvp_sched_new(&c, &s) == 0 ? s : NULL;
}

typedef struct R {
    char id[8];
    uint32_t toks[256];
    uint8_t hs[256 * HL];
    kvp_sched_request r;
} R;

/* ntok tokens (prompt = all of them), one hash per H tokens. */
static void mk(R *x, const char *id, uint32_t ntok, uint32_t H)
{
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", id);
    for (uint32_t i = 0; i < 256; i++)
        x->toks[i] = 500 + i;
    for (uint32_t i = 0; i < ntok / H; i++)
        for (uint32_t b = 0; b < HL; b++)
            x->hs[i * HL + b] = (uint8_t)(i * 13 + b + 1);
    x->r = (kvp_sched_request){.req_id = x->id,
                               .req_id_len = (uint32_t)strlen(x->id),
                               .all_token_ids = x->toks,
                               .num_tokens = ntok,
                               .prompt_token_ids = x->toks,
                               .num_prompt_tokens = ntok,
                               .block_hashes = x->hs,
                               .nhashes = ntok / H,
                               .hash_len = HL};
}

#define ID(x) (x).r.req_id, (x).r.req_id_len

static kvp_meta_ids G(uint32_t *ids, uint32_t n)
{
    return (kvp_meta_ids){.ids = ids, .n = n, .cap = 0};
}

static bool ids_are(const kvp_meta_ids *g, const uint32_t *want, uint32_t n)
{
    if (g->n != n)
        return false;
    for (uint32_t i = 0; i < n; i++)
        if (g->ids[i] != want[i])
            return false;
    return true;
}

/* build_meta, and the worker's view (the delta byte string decoded through
 * a worker mirror, one per test process: the harness forks per test) agrees. */
static kvp_meta_mirror *mirror;
static int build(kvp_sched *s, const kvp_sched_step *st, const kvp_meta_step **m)
{
    const uint8_t *b;
    size_t len;
    REQUIRE(kvp_sched_build_meta(s, st, m, &b, &len) == 0);
    if (!mirror)
        mirror = kvp_meta_mirror_new();
    REQUIRE(mirror != NULL);
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_meta_step d;
    int rc = kvp_meta_decode_delta(mirror, b, len, &a, &d);
    bool eq = rc == 0 && kvp_meta_step_equal(&d, *m);
    kvp_arena_free(&a);
    REQUIRE(eq);
    return 0;
}

/*
 * A 64-token prompt fully present remotely: the worker answers the
 * re-derived, L-aligned 48 (never the whole prompt, §10.5). The scheduler
 * keeps kvpool_cached_tokens = 48 (not 63, not rounded further) and the
 * load meta the worker receives carries exactly that.
 */
TEST(full_external_hit_keeps_l_aligned_kvpool_tokens)
{
    kvp_sched *s = mk_sched(16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "a", 64, 16);
    F.hit = 48;
    uint64_t n = 0;
    bool async = false;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(F.num_tokens, 64);
    CHECK_EQ(F.nhashes, 4);
    CHECK_EQ(n, 48);
    CHECK(async);
    kvp_meta_load_spec ls;
    CHECK(kvp_sched_load_spec(s, ID(a), &ls));
    CHECK_EQ(ls.vllm_cached_tokens, 0);
    CHECK_EQ(ls.kvpool_cached_tokens, 48);
    CHECK_EQ(ls.kvpool_cached_tokens % 16, 0);
    uint32_t b[] = {4, 5, 6, 7};
    kvp_meta_ids g = G(b, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 48), 0);
    kvp_sched_step st = {0};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_LOAD);
    CHECK(q->load_spec && q->load_spec->can_load);
    CHECK_EQ(q->load_spec->kvpool_cached_tokens, 48);
    CHECK_EQ(q->load_spec->vllm_cached_tokens, 0);
    CHECK_EQ(q->token_len_chunk, 48);
    CHECK_EQ(q->can_save, KVP_META_FALSE);
    CHECK(ids_are(&q->block_ids[0], b, 4));
    CHECK_EQ(q->nhashes, 4);
    kvp_sched_free(s);
}

/*
 * The local prefix cache already holds everything the store has (48 of a
 * 64-token prompt): no load spec, (0, false); when the engine then
 * schedules the request with 0 external tokens, the step emits a plain
 * save (no load spec attached) of the block-aligned 64.
 */
TEST(full_local_hit_skips_load_and_saves)
{
    kvp_sched *s = mk_sched(16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "a", 64, 16);
    F.hit = 48;
    uint64_t n = 99;
    bool async = true;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 48, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK(!async);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    uint32_t b[] = {0, 1, 2, 3};
    kvp_meta_ids g = G(b, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    a.r.num_computed_tokens = 48;
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 16, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK(q->load_spec == NULL);
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    CHECK_EQ(q->token_len_chunk, 64);
    kvp_sched_free(s);
}

/*
 * Partial hash hits (H 4, L 16): the worker reports 24 (one and a half
 * blocks), the local prefix is 16. The request gets 8 external tokens,
 * and the load meta carries kvpool_cached_tokens 24: the sub-block tail
 * [16, 24) is loaded, not floored away to L (the save watermark part,
 * token_len_chunk, is L-aligned as always: 16).
 */
TEST(partial_hash_hit_loads_sub_block_tail_24)
{
    kvp_sched *s = mk_sched(16, 4, true);
    CHECK(s);
    static R a;
    mk(&a, "p", 30, 4);
    F.hit = 24;
    uint64_t n = 0;
    bool async = false;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    CHECK_EQ(n, 8);
    CHECK(async);
    uint32_t b[] = {3, 9};
    kvp_meta_ids g = G(b, 2);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 8), 0);
    kvp_sched_step st = {0};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK(q->load_spec && q->load_spec->can_load);
    CHECK_EQ(q->load_spec->vllm_cached_tokens, 16);
    CHECK_EQ(q->load_spec->kvpool_cached_tokens, 24);
    CHECK_EQ(q->can_save, KVP_META_FALSE);
    CHECK_EQ(q->token_len_chunk, 16);
    CHECK_EQ(q->nhashes, 7); /* the worker needs hashes up to 24/4 = 6 */
    CHECK(ids_are(&q->block_ids[0], b, 2));
    kvp_sched_free(s);
}

/*
 * One request's life: new (blocks [0,1]), running (+[2] APPENDED ->
 * [0,1,2]), preempted, resumed with the full new table [7,8,9,10]
 * (REPLACED, not appended to the old one), running again (+[11] appended).
 */
TEST(running_appends_resumed_replaces)
{
    kvp_sched *s = mk_sched(16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "r", 80, 16);
    uint32_t b0[] = {0, 1};
    kvp_meta_ids g0 = G(b0, 2);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g0, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 32, .block_ids = &g0, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].token_len_chunk, 32);

    a.r.num_computed_tokens = 32;
    uint32_t b1[] = {2};
    kvp_meta_ids g1 = G(b1, 1);
    kvp_sched_cached_req c1 = {.req = &a.r, .num_scheduled_tokens = 16, .new_block_ids = &g1,
                               .ngroups = 1};
    kvp_sched_step st1 = {.cached = &c1, .n_cached = 1};
    CHECK_EQ(build(s, &st1, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    uint32_t w1[] = {0, 1, 2};
    CHECK(ids_are(&m->reqs[0].block_ids[0], w1, 3));
    CHECK_EQ(m->reqs[0].token_len_chunk, 48);

    kvp_meta_str pre = {a.id, 1};
    kvp_sched_step st2 = {.preempted = &pre, .n_preempted = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->ngroups, 0);

    a.r.num_computed_tokens = 0;
    uint32_t b3[] = {7, 8, 9, 10};
    kvp_meta_ids g3 = G(b3, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g3, 1, 0), 0);
    kvp_sched_cached_req c3 = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 64,
                               .new_block_ids = &g3, .ngroups = 1};
    kvp_sched_step st3 = {.cached = &c3, .n_cached = 1};
    CHECK_EQ(build(s, &st3, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].kind, KVP_META_RESUMED);
    CHECK(ids_are(&m->reqs[0].block_ids[0], b3, 4));
    CHECK_EQ(m->reqs[0].token_len_chunk, 64); /* re-saved from 0 (dedup makes it cheap) */

    a.r.num_computed_tokens = 64;
    uint32_t b4[] = {11};
    kvp_meta_ids g4 = G(b4, 1);
    kvp_sched_cached_req c4 = {.req = &a.r, .num_scheduled_tokens = 16, .new_block_ids = &g4,
                               .ngroups = 1};
    kvp_sched_step st4 = {.cached = &c4, .n_cached = 1};
    CHECK_EQ(build(s, &st4, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    uint32_t w4[] = {7, 8, 9, 10, 11};
    CHECK(ids_are(&m->reqs[0].block_ids[0], w4, 5));
    CHECK_EQ(m->reqs[0].token_len_chunk, 80);
    kvp_sched_free(s);
}
