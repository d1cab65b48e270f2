/* test_sched.c -- connector/sched: the scheduler half (spec §8.2-§8.6, §16, §18). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/mem.h"
#include "connector/lookup.h"
#include "connector/meta.h"
#include "connector/sched.h"
#include "harness.h"
#include "kvpool.h"

#define HL 8

/* ------------------------------------------------------------ fakes */

static struct {
    int calls;
    int pending_left; /* answer PENDING this many times first */
    uint32_t hit;
    uint32_t num_tokens;
    size_t nhashes, hash_len;
    bool non_block, apply_eagle;
    int discards;
    int reset_rc;
    bool reset_ok;
} F;

static int f_lookup(void *arg, const char *req_id, uint32_t id_len, uint32_t num_tokens,
                    const uint8_t *hashes, size_t nhashes, size_t hash_len, bool non_block,
                    bool apply_eagle, uint32_t *hit)
{
    (void)arg, (void)req_id, (void)id_len, (void)hashes;
    F.calls++;
    F.num_tokens = num_tokens;
    F.nhashes = nhashes;
    F.hash_len = hash_len;
    F.non_block = non_block;
    F.apply_eagle = apply_eagle;
    if (non_block && F.pending_left > 0) {
        F.pending_left--;
        return KVP_LOOKUP_PENDING;
    }
    *hit = F.hit;
    return 0;
}
static void f_discard(void *arg, const char *req_id, uint32_t id_len)
{
    (void)arg, (void)req_id, (void)id_len;
    F.discards++;
}
static int f_reset(void *arg, bool *ok)
{
    (void)arg;
    *ok = F.reset_ok;
    return F.reset_rc;
}

static kvp_sched *mk_sched(int role, uint32_t L, uint32_t H, bool partial)
{
    memset(&F, 0, sizeof F);
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.kv_role = role;
    c.block_size = L;
    c.hash_block_size = H;
    c.enable_partial_hash_hits = partial;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s = NULL;
    if (kvp_sched_new(&c, &s) != 0)
        return NULL;
    return s;
}

/* A request: tokens 1000+i, hashes derived from (id, i), one per H tokens. */
typedef struct R {
    char id[16];
    uint32_t toks[512];
    uint8_t hs[512 * HL];
    kvp_sched_request r;
} R;

static void mk(R *x, const char *id, uint32_t ntok, uint32_t nprompt, uint64_t computed,
               uint32_t H)
{
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", id);
    for (uint32_t i = 0; i < 512; i++)
        x->toks[i] = 1000 + i;
    uint32_t nh = ntok / H;
    for (uint32_t i = 0; i < nh; i++)
        for (uint32_t b = 0; b < HL; b++)
            x->hs[i * HL + b] = (uint8_t)(id[0] * 31 + i * 7 + b + 1);
    x->r = (kvp_sched_request){.req_id = x->id,
                               .req_id_len = (uint32_t)strlen(x->id),
                               .all_token_ids = x->toks,
                               .num_tokens = ntok,
                               .prompt_token_ids = x->toks,
                               .num_prompt_tokens = nprompt,
                               .num_computed_tokens = computed,
                               .block_hashes = x->hs,
                               .nhashes = nh,
                               .hash_len = HL};
}

static kvp_meta_ids G(uint32_t *ids, uint32_t n)
{
    return (kvp_meta_ids){.ids = ids, .n = n, .cap = 0};
}

/* The worker side of the scheduler under test: one mirror fed every
 * message in order (a new scheduler gets a fresh mirror). */
static struct {
    kvp_sched *s;
    kvp_meta_mirror *m;
    size_t last_len;
} W;

static kvp_meta_mirror *mirror_of(kvp_sched *s)
{
    if (W.s != s || !W.m) {
        kvp_meta_mirror_free(W.m);
        W.m = kvp_meta_mirror_new();
        W.s = s;
    }
    return W.m;
}

/* Builds a step and checks that its byte string, decoded through the
 * workers' mirror (delta), gives exactly the same (full) step. */
static int build(kvp_sched *s, const kvp_sched_step *st, const kvp_meta_step **m)
{
    const uint8_t *b;
    size_t len;
    REQUIRE(kvp_sched_build_meta(s, st, m, &b, &len) == 0);
    kvp_meta_mirror *mir = mirror_of(s);
    REQUIRE(mir);
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_meta_step d;
    int rc = kvp_meta_decode_delta(mir, b, len, &a, &d);
    bool eq = rc == 0 && kvp_meta_step_equal(&d, *m);
    kvp_arena_free(&a);
    W.last_len = len;
    REQUIRE(rc == 0);
    REQUIRE(eq);
    return 0;
}

static const kvp_meta_req *find_req(const kvp_meta_step *m, const char *id)
{
    for (uint32_t i = 0; i < m->nreqs; i++)
        if (m->reqs[i].req_id.len == strlen(id) && memcmp(m->reqs[i].req_id.p, id, strlen(id)) == 0)
            return &m->reqs[i];
    return NULL;
}

static bool has_str(const kvp_meta_str *v, uint32_t n, const char *id)
{
    for (uint32_t i = 0; i < n; i++)
        if (v[i].len == strlen(id) && memcmp(v[i].p, id, v[i].len) == 0)
            return true;
    return false;
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

#define ID(x) (x).r.req_id, (x).r.req_id_len

/* ================================================================ §8.2 */

TEST(matched_worker_32_local_16)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n = 99;
    bool async = false;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    CHECK_EQ(n, 16);
    CHECK(async);
    CHECK_EQ(F.calls, 1);
    CHECK_EQ(F.num_tokens, 48);
    CHECK_EQ(F.nhashes, 3);
    CHECK_EQ(F.hash_len, HL);
    CHECK(!F.non_block);
    CHECK(F.apply_eagle);
    kvp_meta_load_spec ls;
    CHECK(kvp_sched_load_spec(s, ID(a), &ls));
    CHECK_EQ(ls.vllm_cached_tokens, 16);
    CHECK_EQ(ls.kvpool_cached_tokens, 32);
    CHECK(!ls.can_load);
    kvp_sched_free(s);
}

TEST(matched_local_32_no_gain_no_spec)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n = 99;
    bool async = true;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 32, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK(!async);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    /* full local hit beyond the remote one: no load either */
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 40, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_free(s);
}

TEST(matched_partial_hash_hits_sub_block_tail)
{
    /* H=4, L=16: worker 24, local 16 -> 8 */
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 4, true);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 4);
    F.hit = 24;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    CHECK_EQ(n, 8);
    CHECK(async);
    CHECK_EQ(F.nhashes, 12);
    kvp_meta_load_spec ls;
    CHECK(kvp_sched_load_spec(s, ID(a), &ls));
    CHECK_EQ(ls.kvpool_cached_tokens, 24);
    kvp_sched_free(s);
}

TEST(matched_sub_block_prompt_12)
{
    R a;
    mk(&a, "a", 12, 12, 0, 4);
    uint64_t n;
    bool async;
    /* with partial hits: looked up, 8 -> (8, true) */
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 4, true);
    CHECK(s);
    F.hit = 8;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(F.calls, 1);
    CHECK_EQ(n, 8);
    CHECK(async);
    kvp_sched_free(s);
    /* without: no RPC, (0, false) */
    s = mk_sched(KVP_SCHED_BOTH, 16, 4, false);
    CHECK(s);
    F.hit = 8;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(F.calls, 0);
    CHECK_EQ(n, 0);
    CHECK(!async);
    kvp_sched_free(s);
}

TEST(matched_lookup_disabled_never_queries)
{
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.block_size = c.hash_block_size = 16;
    c.enable_lookup = false;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s;
    CHECK_EQ(kvp_sched_new(&c, &s), 0);
    memset(&F, 0, sizeof F);
    F.hit = 32;
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(F.calls, 0);
    kvp_sched_free(s);
    /* lookup enabled without a lookup op, L not a multiple of H: refused */
    c.enable_lookup = true;
    c.ops.lookup = NULL;
    CHECK_EQ(kvp_sched_new(&c, &s), KVP_EINVALID_PARAMS);
    c.ops.lookup = f_lookup;
    c.hash_block_size = 5;
    CHECK_EQ(kvp_sched_new(&c, &s), KVP_EINVALID_PARAMS);
}

TEST(matched_async_pending_then_hit)
{
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.block_size = c.hash_block_size = 16;
    c.lookup_async = true;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s;
    CHECK_EQ(kvp_sched_new(&c, &s), 0);
    memset(&F, 0, sizeof F);
    F.hit = 32;
    F.pending_left = 1;
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    uint64_t n = 5;
    bool async = true;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), KVP_LOOKUP_PENDING);
    CHECK(F.non_block);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 32);
    CHECK(async);
    kvp_sched_free(s);
}

/* ================================================================ §8.3 */

TEST(alloc_sets_can_load)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    /* the spec's assertion: external tokens == kvpool - vllm */
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 8), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 16), 0);
    kvp_meta_load_spec ls;
    CHECK(kvp_sched_load_spec(s, ID(a), &ls));
    CHECK(ls.can_load);
    bool in_ids = false;
    CHECK(kvp_sched_is_unfinished(s, ID(a), &in_ids));
    CHECK(in_ids);
    /* 0 external tokens cancels the load */
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    CHECK(kvp_sched_load_spec(s, ID(a), &ls));
    CHECK(!ls.can_load);
    kvp_sched_free(s);
}

/* A request whose load failed (named, or holding a failed block) misses on
 * its later lookups without asking the pool; others keep their hits. */
TEST(failed_load_makes_later_lookups_miss)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a, b, c;
    mk(&a, "a", 48, 48, 0, 16);
    mk(&b, "b", 48, 48, 0, 16);
    mk(&c, "c", 48, 48, 0, 16);
    F.hit = 32;
    F.calls = 0;
    uint64_t n;
    bool async;
    uint32_t ba[] = {1, 2, 3}, bb[] = {4, 5, 6}, bc[] = {7, 8, 9};
    kvp_meta_ids ga = G(ba, 3), gb = G(bb, 3), gc = G(bc, 3);
    R *all[] = {&a, &b, &c};
    kvp_meta_ids *gs[] = {&ga, &gb, &gc};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &all[i]->r, 0, &n, &async), 0);
        CHECK_EQ(n, 32);
        CHECK_EQ(kvp_sched_update_state_after_alloc(s, &all[i]->r, gs[i], 1, 32), 0);
    }
    CHECK_EQ(F.calls, 3);
    uint32_t bad[] = {99, 5}; /* 5 is b's; 99 nobody's */
    kvp_meta_str ids[] = {{"c", 1}, {"zz", 2}};
    CHECK_EQ(kvp_sched_loads_failed(s, ids, 2, bad, 2), 0);
    CHECK_EQ(kvp_sched_loads_failed(s, NULL, 1, NULL, 0), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 32); /* untouched */
    CHECK_EQ(F.calls, 4);
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &b.r, 0, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &c.r, 0, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(F.calls, 4); /* no lookup for b and c */
    kvp_sched_free(s);
}

/* ================================================================ §8.4 */

TEST(new_request_saves_block_aligned_prefix)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 50, 50, 0, 16);
    uint32_t b[] = {0, 1, 2, 3};
    kvp_meta_ids g = G(b, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 50, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_NEW);
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    CHECK_EQ(q->token_len_chunk, 48);
    CHECK(ids_are(&q->block_ids[0], b, 4));
    CHECK_EQ(q->n_token_ids, 50);
    CHECK_EQ(q->token_ids[49], 1049);
    CHECK(q->has_num_prompt_tokens);
    CHECK_EQ(q->num_prompt_tokens, 50);
    CHECK_EQ(q->is_last_chunk, KVP_META_TRUE);
    CHECK(q->load_spec == NULL);
    CHECK_EQ(q->nhashes, 3);
    CHECK(memcmp(q->block_hashes, a.hs, 3 * HL) == 0);
    CHECK_EQ(m->nunfinished, 1);
    CHECK(has_str(m->unfinished, 1, "a"));
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 48);
    kvp_sched_free(s);
}

/* Step 1 of the running-request goldens: prompt 64 (all_token_ids 44 or
 * 64), chunk of 44 with blocks [0,1]: saves 32 (watermark 32). */
static int chunk44(kvp_sched *s, R *a, uint32_t ntok)
{
    mk(a, "run", ntok, 64, 0, 16);
    a->r.num_prompt_tokens = 64;
    uint32_t b[] = {0, 1};
    kvp_meta_ids g = G(b, 2);
    REQUIRE(kvp_sched_update_state_after_alloc(s, &a->r, &g, 1, 0) == 0);
    kvp_sched_new_req nr = {.req = &a->r, .num_scheduled_tokens = 44, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    REQUIRE(build(s, &st, &m) == 0);
    REQUIRE(m->nreqs == 1 && m->reqs[0].token_len_chunk == 32);
    REQUIRE(m->reqs[0].is_last_chunk == KVP_META_FALSE);
    const kvp_meta_tracker *t = kvp_sched_tracker(s, a->r.req_id, a->r.req_id_len);
    REQUIRE(t && t->num_saved_tokens == 32 && t->token_len == 44);
    return 0;
}

TEST(running_watermark_32_token_len_44_to_48)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    CHECK_EQ(chunk44(s, &a, 64), 0);
    a.r.num_computed_tokens = 44;
    uint32_t nb[] = {2};
    kvp_meta_ids g = G(nb, 1);
    kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 4, .new_block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_RUNNING);
    CHECK_EQ(q->token_len_chunk, 48);
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    uint32_t want[] = {0, 1, 2};
    CHECK(ids_are(&q->block_ids[0], want, 3)); /* APPENDED */
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->token_len, 48);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 48);
    kvp_sched_free(s);
}

TEST(running_spec_tokens_not_counted)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    CHECK_EQ(chunk44(s, &a, 44), 0); /* all_token_ids holds 44 tokens */
    a.r.num_computed_tokens = 44;
    uint32_t nb[] = {2};
    kvp_meta_ids g = G(nb, 1);
    /* 3 scheduled draft tokens, not in all_token_ids */
    kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 3, .new_block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    const kvp_meta_tracker *t = kvp_sched_tracker(s, ID(a));
    CHECK_EQ(t->token_len, 44);
    uint32_t want[] = {0, 1, 2};
    CHECK(ids_are(&t->block_ids[0], want, 3)); /* blocks still appended */
    kvp_sched_free(s);
}

TEST(running_decode_not_saved_but_tracked)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "d", 32, 32, 0, 16);
    uint32_t b[] = {0, 1};
    kvp_meta_ids g = G(b, 2);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 32, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    /* decode steps: computed >= prefill end -> no meta; no new blocks (NULL) still advances */
    for (uint32_t k = 0; k < 20; k++) {
        a.r.num_tokens = 33 + k;
        a.r.num_computed_tokens = 32 + k;
        kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 1};
        kvp_sched_step st2 = {.cached = &c, .n_cached = 1};
        CHECK_EQ(build(s, &st2, &m), 0);
        CHECK_EQ(m->nreqs, 0);
    }
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->token_len, 52);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 32);
    kvp_sched_free(s);
}

/* An async load: hit 32, local 0, blocks [5,6] allocated, not scheduled. */
static int pending_load(kvp_sched *s, R *a)
{
    mk(a, "p", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n;
    bool async;
    REQUIRE(kvp_sched_get_num_new_matched_tokens(s, &a->r, 0, &n, &async) == 0);
    REQUIRE(n == 32 && async);
    uint32_t b[] = {5, 6};
    kvp_meta_ids g = G(b, 2);
    REQUIRE(kvp_sched_update_state_after_alloc(s, &a->r, &g, 1, 32) == 0);
    return 0;
}

TEST(pending_load_meta_never_saves)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    CHECK_EQ(pending_load(s, &a), 0);
    kvp_sched_step st = {0};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_LOAD);
    CHECK_EQ(q->can_save, KVP_META_FALSE);
    CHECK(q->load_spec);
    CHECK(q->load_spec->can_load);
    CHECK_EQ(q->load_spec->vllm_cached_tokens, 0);
    CHECK_EQ(q->load_spec->kvpool_cached_tokens, 32);
    CHECK_EQ(q->token_len_chunk, 32);
    uint32_t want[] = {5, 6};
    CHECK(ids_are(&q->block_ids[0], want, 2));
    CHECK(q->token_ids == NULL);
    CHECK_EQ(q->nhashes, 3);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 0); /* watermark stays 0 */
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));               /* popped */
    /* nothing saved, but the async load sent to the workers may still write
     * into the blocks: kept until the worker reports it (sched.h rule b) */
    bool delay = false;
    uint32_t ids0[] = {5, 6};
    kvp_meta_ids g0 = G(ids0, 2);
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g0, 1, &delay), 0);
    CHECK(delay);
    /* asked again (the engine's finish is idempotent): same answer */
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g0, 1, &delay), 0);
    CHECK(delay);
    /* the next step emits no second load */
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    kvp_sched_free(s);
}

TEST(pending_load_cancelled_is_dropped)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "p", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, NULL, 0, 0), 0);
    kvp_sched_step st = {0};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0); /* no save of uncomputed tokens */
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_free(s);
}

TEST(new_request_with_load_does_not_save)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    CHECK_EQ(pending_load(s, &a), 0);
    a.r.num_computed_tokens = 32;
    uint32_t b[] = {5, 6, 7};
    kvp_meta_ids g = G(b, 3);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 16, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].can_save, KVP_META_FALSE);
    CHECK(m->reqs[0].load_spec && m->reqs[0].load_spec->can_load);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 0);
    kvp_sched_free(s);
}

/* Saves 48 of a 48-token prompt, then preempts it. */
static int saved_then_preempted(kvp_sched *s, R *a, const kvp_meta_step **m)
{
    mk(a, "r", 48, 48, 0, 16);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    REQUIRE(kvp_sched_update_state_after_alloc(s, &a->r, &g, 1, 0) == 0);
    kvp_sched_new_req nr = {.req = &a->r, .num_scheduled_tokens = 48, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    REQUIRE(build(s, &st, m) == 0);
    REQUIRE((*m)->nreqs == 1 && (*m)->reqs[0].token_len_chunk == 48);
    kvp_meta_str pre = {a->id, (uint32_t)strlen(a->id)};
    kvp_sched_step st2 = {.preempted = &pre, .n_preempted = 1};
    REQUIRE(build(s, &st2, m) == 0);
    return 0;
}

TEST(preempted_then_finished_no_delay)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    const kvp_meta_step *m;
    CHECK_EQ(saved_then_preempted(s, &a, &m), 0);
    CHECK_EQ(m->npreempted, 1);
    CHECK(has_str(m->preempted, 1, "r"));
    CHECK(has_str(m->unfinished, m->nunfinished, "r")); /* stays in the id set */
    bool in_ids;
    CHECK(!kvp_sched_is_unfinished(s, ID(a), &in_ids));
    CHECK(in_ids);
    const kvp_meta_tracker *t = kvp_sched_tracker(s, ID(a));
    CHECK(t);
    CHECK_EQ(t->num_saved_tokens, 0); /* reset, object kept */
    CHECK_EQ(t->ngroups, 0);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    bool delay = true;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
    CHECK(!delay);
    /* finished: everything dropped, pending lookup discarded */
    kvp_meta_str fin = {a.id, 1};
    kvp_sched_step st = {.finished = &fin, .n_finished = 1};
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(F.discards, 1);
    CHECK_EQ(m->nunfinished, 0);
    CHECK(!kvp_sched_tracker(s, ID(a)));
    CHECK(!kvp_sched_is_unfinished(s, ID(a), &in_ids));
    CHECK(!in_ids);
    kvp_sched_free(s);
}

/* A load spec from a lookup whose allocation did not follow (no blocks
 * this step), then a preemption: the spec is dropped, nothing is loaded.
 * (Allocated and then preempted in one step cannot happen: a request waiting
 * for its load is not running; preempted then re-admitted is the next test.) */
TEST(preemption_clears_load_state)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "p", 48, 48, 0, 16);
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK(n == 32 && async);
    CHECK(kvp_sched_load_spec(s, ID(a), NULL));
    kvp_meta_str pre = {a.id, 1};
    kvp_sched_step st = {.preempted = &pre, .n_preempted = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0); /* no pending-load meta for it */
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_free(s);
}

TEST(resumed_with_load_does_not_save)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    const kvp_meta_step *m;
    CHECK_EQ(saved_then_preempted(s, &a, &m), 0);
    /* re-admitted: remote hit 32, local 0; the full new table is [7,8,9] */
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 32);
    uint32_t b[] = {7, 8, 9};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 32), 0);
    a.r.num_computed_tokens = 32;
    kvp_sched_cached_req c = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 16,
                              .new_block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_RESUMED);
    CHECK_EQ(q->can_save, KVP_META_FALSE);
    CHECK(q->load_spec && q->load_spec->can_load);
    CHECK(ids_are(&q->block_ids[0], b, 3)); /* REPLACED */
    kvp_sched_free(s);
}

/* A request preempted while decoding and re-admitted with an async pool
 * hit: the step that allocates it schedules nothing for it (vLLM holds it
 * in WAITING_FOR_REMOTE_KVS), and that step's meta carries its load. */
TEST(preempted_then_readmitted_async_load_is_emitted)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    const kvp_meta_step *m;
    CHECK_EQ(saved_then_preempted(s, &a, &m), 0);
    kvp_sched_step none = {0};
    CHECK_EQ(build(s, &none, &m), 0); /* steps go by before it is re-admitted */
    F.hit = 32;
    uint64_t n;
    bool async;
    a.r.num_computed_tokens = 0;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK(n == 32 && async);
    uint32_t b[] = {7, 8, 9};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 32), 0);
    CHECK_EQ(build(s, &none, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK(q->load_spec && q->load_spec->can_load);
    CHECK(ids_are(&q->block_ids[0], b, 3));
    kvp_sched_free(s);
}

/* vLLM's reset_prefix_cache(reset_running_requests=True) preempts a
 * request and re-admits it in the same schedule: the build then names it
 * preempted, and it already has its new allocation and pool hit. Its load
 * must go out (it waits for it in WAITING_FOR_REMOTE_KVS), on a full send. */
TEST(preempted_and_readmitted_in_one_step_keeps_its_load)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "r", 48, 48, 0, 16);
    uint32_t b0[] = {0, 1, 2};
    kvp_meta_ids g0 = G(b0, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g0, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 48, .block_ids = &g0,
                            .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    /* the same schedule: preempted, then re-admitted with a pool hit */
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK(n == 32 && async);
    uint32_t b[] = {7, 8, 9};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 32), 0);
    kvp_meta_str pre = {a.id, 1};
    kvp_sched_step st2 = {.preempted = &pre, .n_preempted = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(m->npreempted, 1);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK(q->load_spec && q->load_spec->can_load);
    CHECK(ids_are(&q->block_ids[0], b, 3));
    /* a preemption in a later step drops it as before */
    kvp_sched_step st3 = {.preempted = &pre, .n_preempted = 1};
    CHECK_EQ(build(s, &st3, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_free(s);
}

TEST(resumed_without_load_saves_48)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    const kvp_meta_step *m;
    CHECK_EQ(saved_then_preempted(s, &a, &m), 0);
    /* prompt 40 + 8 generated = 48 tokens recomputed from scratch */
    a.r.num_tokens = 48;
    a.r.num_prompt_tokens = 40;
    a.r.num_computed_tokens = 0;
    uint32_t b[] = {7, 8, 9};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_cached_req c = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 48,
                              .new_block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    CHECK_EQ(q->token_len_chunk, 48);
    CHECK_EQ(q->num_prompt_tokens, 48); /* prefill end = all tokens at resume */
    CHECK_EQ(q->n_token_ids, 48);
    CHECK(ids_are(&q->block_ids[0], b, 3));
    bool delay = false;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
    CHECK(delay);
    kvp_sched_free(s);
}

TEST(consumer_never_saves)
{
    kvp_sched *s = mk_sched(KVP_SCHED_CONSUMER, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "c", 48, 64, 0, 16);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 48, .block_ids = &g, .ngroups = 1};
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 9, .boundary_tokens = 40};
    kvp_sched_tail_req tr = {.req_id = "c", .req_id_len = 1, .tails = &tl, .ntails = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1, .tails = &tr, .n_tails = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    a.r.num_computed_tokens = 48;
    kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 16};
    kvp_sched_step st2 = {.cached = &c, .n_cached = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    bool delay = true;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
    CHECK(!delay);
    /* a consumer still loads */
    static R p;
    CHECK_EQ(pending_load(s, &p), 0);
    kvp_sched_step st3 = {0};
    CHECK_EQ(build(s, &st3, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].can_save, KVP_META_FALSE);
    CHECK(m->reqs[0].load_spec);
    kvp_sched_free(s);
}

/* ================================================ save_decode_cache */

static kvp_sched *mk_sched_dec(int role)
{
    memset(&F, 0, sizeof F);
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.kv_role = role;
    c.block_size = c.hash_block_size = 16;
    c.save_decode_cache = true;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    kvp_sched *s = NULL;
    return kvp_sched_new(&c, &s) == 0 ? s : NULL;
}

/* One decode step of x: position pos (its KV computed this step) with
 * all_token_ids = pos + 1 tokens and their full-block hashes; nb a new
 * block or NULL. Returns the meta of x in the step, NULL when none. */
static const kvp_meta_req *decode_step(kvp_sched *s, R *x, uint32_t pos, uint32_t *nb)
{
    x->r.num_tokens = pos + 1;
    x->r.nhashes = (pos + 1) / 16;
    x->r.num_computed_tokens = pos;
    kvp_meta_ids g = G(nb, nb ? 1 : 0);
    kvp_sched_cached_req c = {.req = &x->r, .num_scheduled_tokens = 1,
                              .new_block_ids = nb ? &g : NULL, .ngroups = nb ? 1 : 0};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    const kvp_meta_step *m;
    if (build(s, &st, &m) != 0)
        return NULL;
    return find_req(m, x->id);
}

/* A producer keeps saving in decode: each step that completes a block
 * emits a running save from the watermark, over the appended table and the
 * hashes the engine extended over generated tokens. */
TEST(save_decode_cache_producer_saves_decode_blocks)
{
    kvp_sched *s = mk_sched_dec(KVP_SCHED_BOTH);
    CHECK(s);
    static R a;
    mk(&a, "dp", 40, 40, 0, 16);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 40, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].token_len_chunk, 32);
    uint32_t b3 = 3;
    for (uint32_t pos = 40; pos < 64; pos++) {
        const kvp_meta_req *q = decode_step(s, &a, pos, pos == 48 ? &b3 : NULL);
        if (pos != 47 && pos != 63) {
            CHECK(q == NULL);
            continue;
        }
        CHECK(q != NULL);
        if (!q)
            break;
        CHECK_EQ(q->kind, KVP_META_RUNNING);
        CHECK_EQ(q->can_save, KVP_META_TRUE);
        CHECK(q->load_spec == NULL);
        CHECK_EQ(q->token_len_chunk, pos + 1);
        CHECK_EQ(q->nhashes, (pos + 1) / 16);
        CHECK(memcmp(q->block_hashes, a.hs, (size_t)q->nhashes * HL) == 0);
        uint32_t want[] = {0, 1, 2, 3};
        CHECK(ids_are(&q->block_ids[0], want, pos == 47 ? 3 : 4));
        CHECK_EQ(q->num_prompt_tokens, 40);
        /* the tokens of what it saves (KV events), prompt + generated */
        CHECK_EQ(q->n_token_ids, pos + 1);
        CHECK(q->token_ids && q->token_ids[pos] == 1000 + pos);
    }
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 64);
    bool delay = false;
    uint32_t all[] = {0, 1, 2, 3};
    kvp_meta_ids ga = G(all, 4);
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &ga, 1, &delay), 0);
    CHECK(delay);
    kvp_sched_free(s);
}

/* A consumer with save_decode_cache: the new request's step and its
 * chunked prefill emit nothing (tracked only), its first decode step saves
 * the prompt's whole blocks from token 0, later decode blocks follow, a
 * resumed request is not saved before its decode; the finish is delayed. */
TEST(save_decode_cache_consumer_saves_from_first_decode)
{
    kvp_sched *s = mk_sched_dec(KVP_SCHED_CONSUMER);
    CHECK(s);
    static R a;
    mk(&a, "dc", 40, 40, 0, 16);
    uint32_t b[] = {0, 1};
    kvp_meta_ids g = G(b, 2);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 32, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    /* the prefill's last chunk: 8 tokens, block 2 appended, no meta */
    a.r.num_computed_tokens = 32;
    uint32_t b2 = 2;
    kvp_meta_ids g2 = G(&b2, 1);
    kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 8, .new_block_ids = &g2,
                              .ngroups = 1};
    kvp_sched_step st2 = {.cached = &c, .n_cached = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->token_len, 40);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 0);
    /* first decode step: the prompt's 2 whole blocks, from 0 */
    const kvp_meta_req *q = decode_step(s, &a, 40, NULL);
    CHECK(q != NULL);
    if (q) {
        CHECK_EQ(q->can_save, KVP_META_TRUE);
        CHECK_EQ(q->token_len_chunk, 32);
        uint32_t want[] = {0, 1, 2};
        CHECK(ids_are(&q->block_ids[0], want, 3));
    }
    for (uint32_t pos = 41; pos < 48; pos++) {
        q = decode_step(s, &a, pos, NULL);
        CHECK_EQ(q != NULL, pos == 47);
        if (q)
            CHECK_EQ(q->token_len_chunk, 48);
    }
    bool delay = false;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
    CHECK(delay);
    /* preempted, resumed with 48 tokens: no save in the resumed step, the
     * next decode step saves from 0 again (the worker dedups) */
    kvp_meta_str pre = {"dc", 2};
    kvp_sched_step st3 = {.preempted = &pre, .n_preempted = 1};
    CHECK_EQ(build(s, &st3, &m), 0);
    a.r.num_tokens = 49;
    a.r.nhashes = 3;
    a.r.num_computed_tokens = 0;
    uint32_t rb[] = {5, 6, 7, 8};
    kvp_meta_ids rg = G(rb, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &rg, 1, 0), 0);
    kvp_sched_cached_req rc = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 49,
                               .new_block_ids = &rg, .ngroups = 1};
    kvp_sched_step st4 = {.cached = &rc, .n_cached = 1};
    CHECK_EQ(build(s, &st4, &m), 0);
    CHECK(find_req(m, "dc") == NULL);
    q = decode_step(s, &a, 49, NULL);
    CHECK(q != NULL);
    if (q) {
        CHECK_EQ(q->token_len_chunk, 48);
        CHECK(ids_are(&q->block_ids[0], rb, 4));
    }
    kvp_sched_free(s);
}

/* A consumer with save_decode_cache that loaded: the load goes alone, the
 * decode saves start at token 0 (the loaded blocks are found present). */
TEST(save_decode_cache_consumer_load_then_save)
{
    kvp_sched *s = mk_sched_dec(KVP_SCHED_CONSUMER);
    CHECK(s);
    static R a;
    mk(&a, "dl", 40, 40, 0, 16);
    F.hit = 32;
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 32);
    uint32_t b[] = {4, 5, 6};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 32), 0);
    a.r.num_computed_tokens = 32;
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 8, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    const kvp_meta_req *q = find_req(m, "dl");
    CHECK(q && q->load_spec && q->can_save == KVP_META_FALSE);
    q = decode_step(s, &a, 40, NULL);
    CHECK(q && q->can_save == KVP_META_TRUE && q->token_len_chunk == 32 && !q->load_spec);
    kvp_sched_free(s);
}

TEST(unknown_cached_request_is_an_error)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "x", 48, 48, 0, 16);
    kvp_sched_cached_req c = {.req = &a.r, .num_scheduled_tokens = 16};
    kvp_sched_step st = {.cached = &c, .n_cached = 1};
    const kvp_meta_step *m;
    const uint8_t *b;
    size_t len;
    CHECK_EQ(kvp_sched_build_meta(s, &st, &m, &b, &len), KVP_EINVALID_PARAMS);
    /* new request that was never allocated */
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 16};
    kvp_sched_step st2 = {.new_reqs = &nr, .n_new = 1};
    CHECK_EQ(kvp_sched_build_meta(s, &st2, &m, &b, &len), KVP_EINVALID_PARAMS);
    /* the scheduler still works afterwards */
    kvp_sched_step st3 = {0};
    CHECK_EQ(build(s, &st3, &m), 0);
    kvp_sched_free(s);
}

/* ------------------------------------------------------ partial tails */

/* The seeds' rule in isolation: a finished request with a pending partial-
 * tail offload delays its free although nothing of it was saved yet (its
 * first chunk was shorter than a block); without the offload it does not. */
TEST(pending_tail_offload_delays_free_with_nothing_saved)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a, b;
    mk(&a, "p", 40, 40, 0, 16);
    mk(&b, "q", 40, 40, 0, 16);
    uint32_t ba[] = {0, 1, 2}, bb[] = {3, 4, 5};
    kvp_meta_ids ga = G(ba, 3), gb = G(bb, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &ga, 1, 0), 0);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &b.r, &gb, 1, 0), 0);
    kvp_sched_new_req nr[2] = {
        {.req = &a.r, .num_scheduled_tokens = 10, .block_ids = &ga, .ngroups = 1},
        {.req = &b.r, .num_scheduled_tokens = 10, .block_ids = &gb, .ngroups = 1}};
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 9, .boundary_tokens = 8};
    kvp_sched_tail_req tr = {.req_id = "p", .req_id_len = 1, .tails = &tl, .ntails = 1};
    kvp_sched_step st = {.new_reqs = nr, .n_new = 2, .tails = &tr, .n_tails = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(kvp_sched_tracker(s, ID(a))->num_saved_tokens, 0);
    CHECK(kvp_sched_tracker(s, ID(a))->has_pending_offload);
    CHECK_EQ(kvp_sched_tracker(s, ID(b))->num_saved_tokens, 0);
    CHECK(!kvp_sched_tracker(s, ID(b))->has_pending_offload);
    bool delay = false;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &ga, 1, &delay), 0);
    CHECK(delay); /* the offload still reads its blocks */
    delay = true;
    CHECK_EQ(kvp_sched_request_finished(s, ID(b), &gb, 1, &delay), 0);
    CHECK(!delay); /* nothing saved, nothing pending: freed at once */
    kvp_sched_free(s);
}

TEST(partial_tail_rides_save_or_goes_alone)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a, z;
    mk(&a, "t", 40, 40, 0, 16);
    mk(&z, "u", 40, 40, 0, 16);
    uint32_t b[] = {0, 1, 2}, bz[] = {3, 4, 5};
    kvp_meta_ids g = G(b, 3), gz = G(bz, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &z.r, &gz, 1, 0), 0);
    kvp_sched_new_req nr[2] = {
        {.req = &a.r, .num_scheduled_tokens = 40, .block_ids = &g, .ngroups = 1},
        {.req = &z.r, .num_scheduled_tokens = 40, .block_ids = &gz, .ngroups = 1}};
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 9, .boundary_tokens = 40};
    kvp_sched_tail_req tr = {.req_id = "t", .req_id_len = 1, .tails = &tl, .ntails = 1};
    kvp_sched_step st = {.new_reqs = nr, .n_new = 2, .tails = &tr, .n_tails = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 2);
    const kvp_meta_req *q = find_req(m, "t");
    CHECK(q && q->can_save == KVP_META_TRUE && q->token_len_chunk == 32);
    CHECK_EQ(q->ntails, 1);
    CHECK_EQ(q->tails[0].cow_block_id, 9);
    CHECK_EQ(q->tails[0].boundary_tokens, 40);
    CHECK(find_req(m, "u")->tails == NULL);
    CHECK(kvp_sched_tracker(s, ID(a))->has_pending_offload);
    /* next step: no save for "u" (decode), offload-only meta */
    z.r.num_computed_tokens = 40;
    z.r.num_tokens = 41;
    kvp_sched_cached_req c = {.req = &z.r, .num_scheduled_tokens = 1};
    kvp_meta_tail tl2[2] = {{.group_id = 0, .cow_block_id = 11, .boundary_tokens = 40},
                            {.group_id = 0, .cow_block_id = 12, .boundary_tokens = 40}};
    kvp_sched_tail_req tr2 = {.req_id = "u", .req_id_len = 1, .tails = tl2, .ntails = 2};
    kvp_sched_step st2 = {.cached = &c, .n_cached = 1, .tails = &tr2, .n_tails = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    q = &m->reqs[0];
    CHECK_EQ(q->kind, KVP_META_TAIL);
    CHECK_EQ(q->token_len_chunk, 0);
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    CHECK_EQ(q->ntails, 2);
    CHECK_EQ(q->num_prompt_tokens, 40);
    CHECK(ids_are(&q->block_ids[0], bz, 3));
    CHECK_EQ(q->nhashes, 2);
    /* a pending offload delays the free even without a saved prefix */
    bool delay = false;
    CHECK_EQ(kvp_sched_request_finished(s, ID(z), &gz, 1, &delay), 0);
    CHECK(delay);
    /* finished in this step: the offload is dropped */
    kvp_meta_str fin = {"u", 1};
    kvp_sched_step st3 = {.finished = &fin, .n_finished = 1, .tails = &tr2, .n_tails = 1};
    CHECK_EQ(build(s, &st3, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    /* two boundaries for one request in one step (vLLM 0.33 offers every
     * retained boundary): both ride one store-only meta */
    tl2[1].boundary_tokens = 24;
    tr2.req_id = "t";
    kvp_sched_step st4 = {.tails = &tr2, .n_tails = 1};
    CHECK_EQ(build(s, &st4, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].ntails, 2);
    CHECK_EQ(m->reqs[0].tails[1].boundary_tokens, 24);
    kvp_sched_free(s);
}

/* register_finished_partial_tail (vLLM 0.33): a finishing request's last
 * boundary state is queued for the NEXT build as a store-only meta, and the
 * free waits for it; unusable hand-offs change nothing. */
TEST(finished_tail_is_stored_by_the_next_build)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "f", 40, 40, 0, 16);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 40, .block_ids = &g,
                            .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    bool queued = true;
    /* unusable: a boundary past the prefill, a null CoW block, a group that
     * does not exist, an unknown request */
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 9, .boundary_tokens = 48};
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, &tl, 1, &queued), 0);
    CHECK(!queued);
    tl.boundary_tokens = 36;
    tl.cow_block_id = 0;
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, &tl, 1, &queued), 0);
    CHECK(!queued);
    tl.cow_block_id = 9;
    tl.group_id = 1;
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, &tl, 1, &queued), 0);
    CHECK(!queued);
    tl.group_id = 0;
    CHECK_EQ(kvp_sched_register_finished_tail(s, "nobody", 6, &g, 1, &tl, 1, &queued), 0);
    CHECK(!queued);
    /* two boundaries in one hand-off: refused, as the reference asserts */
    kvp_meta_tail two[2] = {tl, tl};
    two[1].boundary_tokens = 20;
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, two, 2, &queued),
             KVP_EINVALID_PARAMS);
    CHECK(!kvp_sched_tracker(s, ID(a))->has_pending_offload);
    /* usable: queued, and the free that follows waits for the store */
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, &tl, 1, &queued), 0);
    CHECK(queued);
    CHECK(kvp_sched_tracker(s, ID(a))->has_pending_offload);
    CHECK_EQ(kvp_sched_register_finished_tail(s, "f", 1, &g, 1, &tl, 1, &queued),
             KVP_EINVALID_PARAMS); /* a second one while the first is queued */
    bool delay = false;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
    CHECK(delay);
    /* the next build carries it although the request finished in this step */
    kvp_meta_str fin = {"f", 1};
    kvp_sched_step st2 = {.finished = &fin, .n_finished = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    const kvp_meta_req *q = find_req(m, "f");
    CHECK(q != NULL);
    CHECK_EQ(q->kind, KVP_META_TAIL);
    CHECK_EQ(q->token_len_chunk, 0);
    CHECK_EQ(q->ntails, 1);
    CHECK_EQ(q->tails[0].cow_block_id, 9);
    CHECK_EQ(q->tails[0].boundary_tokens, 36);
    CHECK(ids_are(&q->block_ids[0], b, 3));
    /* delivered once */
    kvp_sched_step st3 = {0};
    CHECK_EQ(build(s, &st3, &m), 0);
    CHECK(find_req(m, "f") == NULL);
    kvp_sched_free(s);
}

TEST(finished_tail_ignored_by_a_consumer)
{
    kvp_sched *s = mk_sched(KVP_SCHED_CONSUMER, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "c", 40, 40, 0, 16);
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 9, .boundary_tokens = 36};
    bool queued = true;
    CHECK_EQ(kvp_sched_register_finished_tail(s, "c", 1, &g, 1, &tl, 1, &queued), 0);
    CHECK(!queued);
    kvp_sched_free(s);
}

/* ================================================================ §8.5 */

TEST(request_finished_delay_rules)
{
    kvp_sched *s = mk_sched(KVP_SCHED_PRODUCER, 16, 16, false);
    CHECK(s);
    bool delay = true;
    uint32_t b[] = {0, 1, 2};
    kvp_meta_ids g = G(b, 3), empty = G(NULL, 0);
    /* unknown request (aborted before scheduling) */
    CHECK_EQ(kvp_sched_request_finished(s, "nope", 4, &g, 1, &delay), 0);
    CHECK(!delay);
    /* tracker but nothing saved yet (sub-block prompt) */
    static R a;
    mk(&a, "f", 10, 10, 0, 16);
    kvp_meta_ids g1 = G(b, 1);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g1, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 10, .block_ids = &g1, .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0);
    delay = true;
    CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g1, 1, &delay), 0);
    CHECK(!delay);
    /* saved: delayed while it holds blocks */
    static R c;
    mk(&c, "g", 48, 48, 0, 16);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &c.r, &g, 1, 0), 0);
    kvp_sched_new_req nr2 = {.req = &c.r, .num_scheduled_tokens = 48, .block_ids = &g, .ngroups = 1};
    kvp_sched_step st2 = {.new_reqs = &nr2, .n_new = 1};
    CHECK_EQ(build(s, &st2, &m), 0);
    CHECK_EQ(kvp_sched_request_finished(s, ID(c), &g, 1, &delay), 0);
    CHECK(delay);
    CHECK_EQ(kvp_sched_request_finished(s, ID(c), &empty, 1, &delay), 0);
    CHECK(!delay);
    CHECK_EQ(kvp_sched_request_finished(s, ID(c), NULL, 0, &delay), 0);
    CHECK(!delay);
    kvp_sched_free(s);
}

/* A load sent to the workers, then the request finished or aborted:
 * delay_free (any role, with or without blocks); not before the load was
 * sent; still after a preemption and a second load. */
TEST(loaded_request_delays_free)
{
    for (int role = KVP_SCHED_PRODUCER; role <= KVP_SCHED_BOTH; role++) {
        kvp_sched *s = mk_sched(role, 16, 16, false);
        CHECK(s);
        static R a;
        CHECK_EQ(pending_load(s, &a), 0);
        uint32_t b[] = {5, 6};
        kvp_meta_ids g = G(b, 2);
        bool delay = true;
        /* load spec recorded, no meta built yet: nothing was sent */
        CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
        CHECK(!delay);
        kvp_sched_step st = {0};
        const kvp_meta_step *m;
        CHECK_EQ(build(s, &st, &m), 0);
        CHECK_EQ(m->nreqs, 1);
        CHECK(m->reqs[0].load_spec != NULL);
        /* aborted before finished_recving: delayed, even without blocks */
        CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
        CHECK(delay);
        CHECK_EQ(kvp_sched_request_finished(s, ID(a), NULL, 0, &delay), 0);
        CHECK(delay);
        /* another request that never loaded is not delayed */
        CHECK_EQ(kvp_sched_request_finished(s, "zz", 2, &g, 1, &delay), 0);
        CHECK(!delay);
        /* preempted, a second load is sent: armed again */
        kvp_meta_str pre = {a.id, 1};
        kvp_sched_step sp = {.preempted = &pre, .n_preempted = 1};
        CHECK_EQ(build(s, &sp, &m), 0);
        F.hit = 32;
        uint64_t n;
        bool async;
        CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
        CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 32), 0);
        CHECK_EQ(build(s, &st, &m), 0);
        CHECK_EQ(m->nreqs, 1);
        CHECK_EQ(kvp_sched_request_finished(s, ID(a), &g, 1, &delay), 0);
        CHECK(delay);
        kvp_sched_free(s);
    }
}

/* ================================================================ §8.6 */

/* reset_cache (§13): load specs and pending load tables dropped, then
 * reset_store's answer. */
TEST(reset_cache_clears_load_specs)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    CHECK_EQ(pending_load(s, &a), 0);
    CHECK(kvp_sched_load_spec(s, ID(a), NULL));
    F.reset_ok = true;
    CHECK(kvp_sched_reset_cache(s));
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_step st = {0};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 0); /* no pending-load meta any more */
    /* a lookup-only record (spec, no allocation) is gone entirely */
    static R c;
    mk(&c, "q", 48, 48, 0, 16);
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &c.r, 0, &n, &async), 0);
    CHECK_EQ(n, 32);
    F.reset_ok = false;
    CHECK(!kvp_sched_reset_cache(s)); /* the worker refused: false, specs still cleared */
    CHECK(!kvp_sched_load_spec(s, ID(c), NULL));
    bool in_ids = true;
    CHECK(!kvp_sched_is_unfinished(s, ID(c), &in_ids));
    CHECK(!in_ids);
    CHECK(!kvp_sched_reset_cache(NULL));
    kvp_sched_free(s);
}

TEST(reset_store_results)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    F.reset_ok = true;
    CHECK(kvp_sched_reset_store(s));
    F.reset_ok = false;
    CHECK(!kvp_sched_reset_store(s));
    F.reset_ok = true;
    F.reset_rc = KVP_ERPC_TIMEOUT;
    CHECK(!kvp_sched_reset_store(s));
    kvp_sched_free(s);
}

/* ============================================ through the real channel */

static int w_lookup(void *arg, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                    size_t hash_len, int apply_eagle, uint32_t *hit)
{
    (void)arg, (void)hashes, (void)hash_len, (void)apply_eagle;
    uint32_t h = (uint32_t)(nhashes >= 2 ? 32 : 0);
    *hit = h < num_tokens ? h : 0;
    return 0;
}
static int w_reset(void *arg)
{
    (*(int *)arg)++;
    return 0;
}

TEST(sched_over_lookup_channel)
{
    char path[108];
    snprintf(path, sizeof path, "/tmp/kvp-sched-%d.sock", (int)getpid());
    int resets = 0;
    kvp_lookup_handler h = {.lookup = w_lookup, .reset = w_reset, .arg = &resets};
    kvp_lookup_server *srv;
    CHECK_EQ(kvp_lookup_server_start(path, &h, &srv), 0);
    kvp_lookup_client *cl;
    CHECK_EQ(kvp_lookup_client_open(path, 1000, &cl), 0);
    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.block_size = c.hash_block_size = 16;
    kvp_sched_ops_client(cl, &c.ops);
    kvp_sched *s;
    CHECK_EQ(kvp_sched_new(&c, &s), 0);
    static R a;
    mk(&a, "a", 48, 48, 0, 16);
    uint64_t n;
    bool async;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    CHECK_EQ(n, 16);
    CHECK(kvp_sched_reset_store(s));
    CHECK_EQ(resets, 1);
    /* worker gone: a miss within the deadline, reset fails */
    kvp_lookup_server_stop(srv);
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 16, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK(!kvp_sched_reset_store(s));
    kvp_meta_str fin = {"a", 1};
    kvp_sched_step st = {.finished = &fin, .n_finished = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(kvp_lookup_client_pending(cl), 0);
    kvp_sched_free(s);
    kvp_lookup_client_close(cl);
}

/* ========================================================== many steps */

TEST(many_requests_lifecycle_and_oom)
{
    for (uint64_t fail = 0; fail < 40; fail++) {
        kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
        CHECK(s);
        static R r[6];
        uint32_t b[6][4];
        kvp_meta_ids g[6];
        kvp_sched_new_req nr[6];
        char nm[2] = "A";
        if (fail)
            kvp_mem_fail_nth(fail, 0);
        int rc = 0;
        for (int i = 0; i < 6 && rc == 0; i++) {
            nm[0] = (char)('A' + i);
            mk(&r[i], nm, 64, 64, 0, 16);
            for (int k = 0; k < 4; k++)
                b[i][k] = (uint32_t)(i * 4 + k);
            g[i] = G(b[i], 4);
            rc = kvp_sched_update_state_after_alloc(s, &r[i].r, &g[i], 1, 0);
            nr[i] = (kvp_sched_new_req){.req = &r[i].r, .num_scheduled_tokens = 64,
                                        .block_ids = &g[i], .ngroups = 1};
        }
        const kvp_meta_step *m;
        const uint8_t *bytes;
        size_t len;
        kvp_sched_step st = {.new_reqs = nr, .n_new = 6};
        if (rc == 0)
            rc = kvp_sched_build_meta(s, &st, &m, &bytes, &len);
        kvp_mem_fail_nth(0, 0);
        CHECK(rc == 0 || rc == KVP_ENOMEM);
        if (rc == 0 && !fail) {
            CHECK_EQ(m->nreqs, 6);
            CHECK_EQ(m->nunfinished, 6);
        }
        kvp_sched_free(s);
    }
}

/* Decodes the last build's bytes through the test mirror (after a direct
 * kvp_sched_build_meta call). */
static int mirror_check(kvp_sched *s, const kvp_meta_step *m, const uint8_t *b, size_t len)
{
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_meta_step d;
    int rc = kvp_meta_decode_delta(mirror_of(s), b, len, &a, &d);
    bool eq = rc == 0 && kvp_meta_step_equal(&d, m);
    kvp_arena_free(&a);
    REQUIRE(rc == 0);
    REQUIRE(eq);
    return 0;
}

/*
 * The delta message: a chunked prefill sends only the new blocks (much
 * less than the full encoding) and the worker still sees the full step;
 * failed builds (out of memory) are followed by full sends the mirror
 * accepts; preemption and finish drop the mirror entry (count back to 0);
 * a resume is a full send of the replaced table.
 */
TEST(sched_delta_messages_and_mirror)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    mk(&a, "d", 256, 256, 0, 16);
    uint32_t blocks[16];
    for (uint32_t i = 0; i < 16; i++)
        blocks[i] = 40 + i;
    kvp_meta_ids g = G(blocks, 2);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_new_req nr = {.req = &a.r, .num_scheduled_tokens = 32, .block_ids = &g,
                            .ngroups = 1};
    kvp_sched_step st = {.new_reqs = &nr, .n_new = 1};
    const kvp_meta_step *m;
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->reqs[0].n_token_ids, 32);
    CHECK_EQ(kvp_meta_mirror_count(W.m), 1);
    kvp_buf full;
    kvp_buf_init(&full, 1 << 20);
    uint64_t computed = 32;
    for (uint32_t k = 2; k < 10; k++) { /* 16-token chunks, one new block each */
        a.r.num_computed_tokens = computed;
        kvp_meta_ids ng = G(blocks + k, 1);
        kvp_sched_cached_req cr = {.req = &a.r, .num_scheduled_tokens = 16,
                                   .new_block_ids = &ng, .ngroups = 1};
        kvp_sched_step sc = {.cached = &cr, .n_cached = 1};
        if (k == 5) { /* out-of-memory builds in between: nothing sent */
            const uint8_t *b;
            size_t len;
            for (uint64_t fail = 1; fail < 8; fail++) {
                kvp_mem_fail_nth(fail, 0);
                kvp_sched_cached_req none = cr;
                none.num_scheduled_tokens = 0;
                none.new_block_ids = NULL;
                none.ngroups = 0;
                kvp_sched_step s0 = {.cached = &none, .n_cached = 1};
                int rc = kvp_sched_build_meta(s, &s0, &m, &b, &len);
                kvp_mem_fail_nth(0, 0);
                CHECK(rc == 0 || rc == KVP_ENOMEM);
                if (rc == 0)
                    CHECK_EQ(mirror_check(s, m, b, len), 0);
            }
        }
        CHECK_EQ(build(s, &sc, &m), 0);
        CHECK_EQ(m->nreqs, 1);
        CHECK_EQ(m->reqs[0].block_ids[0].n, k + 1);
        CHECK_EQ(m->reqs[0].token_len_chunk, computed + 16);
        kvp_buf_reset(&full);
        CHECK_EQ(kvp_meta_encode(&full, m), 0);
        if (k != 5)
            CHECK(W.last_len * 2 < full.len); /* the 32 tokens, 16 hashes are not resent */
        computed += 16;
    }
    /* preempted: the mirrors drop it */
    kvp_meta_str pre = {a.id, 1};
    kvp_sched_step sp = {.preempted = &pre, .n_preempted = 1};
    CHECK_EQ(build(s, &sp, &m), 0);
    CHECK_EQ(kvp_meta_mirror_count(W.m), 0);
    /* resumed with a new, shorter table: a full send */
    a.r.num_computed_tokens = 0;
    kvp_meta_ids rg = G(blocks + 12, 3);
    kvp_sched_cached_req rc = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 48,
                               .new_block_ids = &rg, .ngroups = 1};
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &rg, 1, 0), 0);
    kvp_sched_step sr = {.cached = &rc, .n_cached = 1};
    CHECK_EQ(build(s, &sr, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    CHECK_EQ(m->reqs[0].block_ids[0].n, 3);
    CHECK_EQ(m->reqs[0].block_ids[0].ids[0], 52);
    CHECK_EQ(kvp_meta_mirror_count(W.m), 1);
    /* finished: dropped */
    kvp_sched_step sf = {.finished = &pre, .n_finished = 1};
    CHECK_EQ(build(s, &sf, &m), 0);
    CHECK_EQ(kvp_meta_mirror_count(W.m), 0);
    kvp_buf_free(&full);
    kvp_sched_free(s);
}

TEST(hit_beyond_num_tokens_is_a_miss)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    F.hit = 64; /* a broken worker: more than the request has */
    uint64_t n = 1;
    bool async = true;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 0);
    CHECK(!async);
    CHECK(!kvp_sched_load_spec(s, ID(a), NULL));
    kvp_sched_free(s);
}

TEST(resumed_partial_tail_keeps_handoff_boundary)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    static R a;
    const kvp_meta_step *m;
    CHECK_EQ(saved_then_preempted(s, &a, &m), 0);
    /* resumed with 52 tokens (48 prompt + 4 generated), all recomputed */
    a.r.num_tokens = 52;
    a.r.num_computed_tokens = 0;
    uint32_t b[] = {7, 8, 9, 10};
    kvp_meta_ids g = G(b, 4);
    CHECK_EQ(kvp_sched_update_state_after_alloc(s, &a.r, &g, 1, 0), 0);
    kvp_sched_cached_req c = {.req = &a.r, .resumed = true, .num_scheduled_tokens = 52,
                              .new_block_ids = &g, .ngroups = 1};
    kvp_meta_tail tl = {.group_id = 0, .cow_block_id = 20, .boundary_tokens = 52};
    kvp_sched_tail_req tr = {.req_id = "r", .req_id_len = 1, .tails = &tl, .ntails = 1};
    kvp_sched_step st = {.cached = &c, .n_cached = 1, .tails = &tr, .n_tails = 1};
    CHECK_EQ(build(s, &st, &m), 0);
    CHECK_EQ(m->nreqs, 1);
    const kvp_meta_req *q = &m->reqs[0];
    CHECK_EQ(q->can_save, KVP_META_TRUE);
    CHECK_EQ(q->token_len_chunk, 48);
    CHECK_EQ(q->num_prompt_tokens, 52); /* the hand-off boundary is past the prompt */
    CHECK_EQ(q->ntails, 1);
    CHECK_EQ(q->tails[0].boundary_tokens, 52);
    kvp_sched_free(s);
}

/* Review fixes: a full-prompt hit leaves no token to compute (§10.5), so the
 * scheduler treats it as a broken answer; synchronous loading is refused
 * (the worker only loads in the background, §10.2). */
TEST(full_prompt_hit_is_a_miss_and_sync_load_refused)
{
    kvp_sched *s = mk_sched(KVP_SCHED_BOTH, 16, 16, false);
    CHECK(s);
    R a;
    mk(&a, "a", 48, 48, 0, 16);
    F.hit = 48;
    uint64_t n = 99;
    bool async = false;
    CHECK_EQ(kvp_sched_get_num_new_matched_tokens(s, &a.r, 0, &n, &async), 0);
    CHECK_EQ(n, 0);
    kvp_meta_load_spec ls;
    CHECK(!kvp_sched_load_spec(s, ID(a), &ls));
    kvp_sched_free(s);

    kvp_sched_config c;
    kvp_sched_config_default(&c);
    c.block_size = c.hash_block_size = 16;
    c.ops = (kvp_sched_lookup_ops){f_lookup, f_discard, f_reset, NULL};
    c.load_async = false;
    kvp_sched *t = NULL;
    CHECK_EQ(kvp_sched_new(&c, &t), KVP_EINVALID_PARAMS);
    CHECK(t == NULL);
}
