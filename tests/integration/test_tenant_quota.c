/*
 * test_tenant_quota.c -- one tenant must not evict all others (the
 * hardening run against main 0a85b26: bob publishing 80 x 1 MiB into a
 * 64 MiB pool evicted all 8 of alice's objects), and per-tenant quotas
 * from the tenant tokens file (max_bytes, max_objects, share), reported by
 * STATS and `kvpool stat`. A real master and storage node; puts are raw
 * PUT_START + PUT_END (the master keeps metadata only, so no bytes move).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"
#include "tenant_peer.h"

#define NODE_TOKEN "node-secret-0123456789"
#define MiB (1ull << 20)

typedef struct env {
    char tpath[64];
    tp_master m;
    tp_store s;
    int up;
} env;

/* A master with this tenant tokens file and the node credential, and one
 * store with a segment of seg_size. 0 or -1. */
static int env_up(env *e, const char *tenants, const char *seg_size)
{
    memset(e, 0, sizeof *e);
    snprintf(e->tpath, sizeof e->tpath, "/tmp/kvp-quota-tenants-XXXXXX");
    if (tq_write_secret(e->tpath, tenants) != 0)
        return -1;
    setenv("KVPOOL_NODE_TOKEN", NODE_TOKEN, 1);
    int rc = tp_master_start(&e->m, (const char *const[]){"--tenant-tokens-file", e->tpath, NULL});
    if (rc == 0) {
        rc = tp_store_start(&e->s, e->m.addr,
                            (const char *const[]){"--segment-size", seg_size, NULL});
        if (rc)
            tp_master_kill(&e->m);
    }
    unsetenv("KVPOOL_NODE_TOKEN");
    e->up = rc == 0;
    return rc;
}

static void env_down(env *e)
{
    if (e->up) {
        tp_store_kill(&e->s);
        CHECK_EQ(tp_master_stop(&e->m), 0);
    }
    unlink(e->tpath);
}

/* How many of tenant's keys PREFIX-i (i < n) exist. */
static int count_existing(kvp_rpc *r, const char *tenant, const char *prefix, int n)
{
    int have = 0;
    char key[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s-%d", prefix, i);
        have += tq_exist(r, tenant, key) == 1;
    }
    return have;
}

/* Publishes n objects of size bytes, keys PREFIX-i; returns how many
 * succeeded. */
static int publish_n(kvp_rpc *r, const char *tenant, const char *prefix, int n, uint64_t size)
{
    int ok = 0;
    char key[64];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "%s-%d", prefix, i);
        /* -200 is back-pressure, retried as the connector does: the room a
         * put's evictions free is reused only once the node acknowledged
         * the frees (a node slowed by a loaded machine answers late) */
        int rc = KVP_ENO_AVAILABLE_HANDLE;
        for (int t = 0; t < 200 && rc == KVP_ENO_AVAILABLE_HANDLE; t++) {
            if (t)
                usleep(5000);
            rc = tq_publish(r, tenant, key, size);
        }
        ok += rc == 0;
    }
    return ok;
}

/* The attack: bob floods a 64 MiB pool with 80 x 1 MiB after alice stored
 * 8 x 1 MiB. With equal shares each tenant's fair share is 32 MiB: bob's
 * puts evict bob's own objects (he is over his share), alice keeps all 8.
 * On 0a85b26 one global LRU evicted alice's 8 first. */
TEST(flood_by_one_tenant_leaves_the_others)
{
    env e;
    int up = env_up(&e, "alice tok-alice-0123456789\nbob tok-bob-0123456789\n", "64MiB");
    CHECK_EQ(up, 0);
    if (up) {
        env_down(&e);
        return;
    }
    int rc;
    kvp_rpc *alice = tq_hello(e.m.addr, NULL, "tok-alice-0123456789", &rc);
    kvp_rpc *bob = tq_hello(e.m.addr, NULL, "tok-bob-0123456789", &rc);
    CHECK(alice && bob);
    if (alice && bob) {
        CHECK_EQ(publish_n(alice, "alice", "a", 8, MiB), 8);
        CHECK_EQ(publish_n(bob, "bob", "b", 80, MiB), 80); /* puts keep succeeding */
        CHECK_EQ(count_existing(alice, "alice", "a", 8), 8);
        int bobs = count_existing(bob, "bob", "b", 80);
        printf("  alice keeps 8 of 8, bob keeps %d of 80\n", bobs);
        CHECK(bobs >= 24 && bobs <= 56); /* bob's most recent ones, within the rest */
        CHECK_EQ(tq_exist(bob, "bob", "b-79"), 1); /* the newest stays */
        /* the figures: alice untouched, bob's evictions counted */
        kvp_arena a;
        kvp_arena_init(&a, 1 << 20);
        kvp_msg_stats_resp st;
        kvp_rpc *admin = tq_hello(e.m.addr, NULL, NULL, &rc);
        CHECK(admin != NULL);
        if (admin && tq_stats(admin, &a, &st) == 0) {
            const kvp_tenant_stat *ta = tq_tenant_row(&st, "alice");
            const kvp_tenant_stat *tb = tq_tenant_row(&st, "bob");
            CHECK(ta && tb);
            if (ta && tb) {
                CHECK_EQ(ta->objects, 8);
                CHECK_EQ(ta->pool_bytes, 8 * MiB);
                CHECK_EQ(ta->evictions, 0);
                CHECK_EQ(tb->objects, (uint64_t)bobs);
                CHECK_EQ(tb->evictions, (uint64_t)(80 - bobs));
                CHECK_EQ(tb->share, 1);
            }
        } else {
            CHECK(!"STATS failed");
        }
        /* a tenant-bound session sees only its own row */
        if (tq_stats(alice, &a, &st) == 0)
            CHECK(st.n_tenants == 1 && tq_tenant_row(&st, "alice") != NULL);
        else
            CHECK(!"STATS failed");
        kvp_arena_free(&a);
        kvp_rpc_close(admin);
    }
    kvp_rpc_close(alice);
    kvp_rpc_close(bob);
    env_down(&e);
}

/* CONFIGS of a session: every tenant's configurations for an unbound one,
 * its own tenant's only for a tenant-bound one (as STATS' tenant rows). */
static int configs_of(kvp_rpc *r, kvp_arena *a, kvp_msg_configs_resp *out)
{
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_CONFIGS, NULL, 0, &st, &resp, &rl);
    if (rc || st)
        return rc ? rc : st;
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    return kvp_dec_configs_resp(resp, rl, &lim, a, out);
}

static int has_config(const kvp_msg_configs_resp *c, const char *tenant, const char *fp,
                      uint64_t objects)
{
    for (uint32_t i = 0; i < c->n; i++)
        if (c->rows[i].tenant.len == strlen(tenant) &&
            !memcmp(c->rows[i].tenant.p, tenant, c->rows[i].tenant.len) &&
            c->rows[i].fp.len == strlen(fp) && !memcmp(c->rows[i].fp.p, fp, c->rows[i].fp.len))
            return c->rows[i].objects == objects;
    return 0;
}

TEST(configurations_are_shown_to_their_tenant_only)
{
    env e;
    int up = env_up(&e, "alice tok-alice-0123456789\nbob tok-bob-0123456789\n", "64MiB");
    CHECK_EQ(up, 0);
    if (up) {
        env_down(&e);
        return;
    }
    int rc;
    kvp_rpc *alice = tq_hello(e.m.addr, NULL, "tok-alice-0123456789", &rc);
    kvp_rpc *bob = tq_hello(e.m.addr, NULL, "tok-bob-0123456789", &rc);
    kvp_rpc *admin = tq_hello(e.m.addr, NULL, NULL, &rc);
    CHECK(alice && bob && admin);
    if (alice && bob && admin) {
        CHECK_EQ(tq_publish(alice, "alice", "m@cfg:0123456789abcdef@tp_rank:0@a", 4096), 0);
        CHECK_EQ(tq_publish(alice, "alice", "m@cfg:0123456789abcdef@tp_rank:0@b", 4096), 0);
        CHECK_EQ(tq_publish(bob, "bob", "m@cfg:fedcba9876543210@tp_rank:0@a", 4096), 0);
        kvp_arena a;
        kvp_arena_init(&a, 1 << 20);
        kvp_msg_configs_resp c;
        CHECK_EQ(configs_of(admin, &a, &c), 0);
        CHECK(c.n == 2 && has_config(&c, "alice", "0123456789abcdef", 2) &&
              has_config(&c, "bob", "fedcba9876543210", 1));
        CHECK_EQ(configs_of(alice, &a, &c), 0);
        CHECK(c.n == 1 && has_config(&c, "alice", "0123456789abcdef", 2));
        CHECK_EQ(configs_of(bob, &a, &c), 0);
        CHECK(c.n == 1 && has_config(&c, "bob", "fedcba9876543210", 1));
        kvp_arena_free(&a);
    }
    kvp_rpc_close(admin);
    kvp_rpc_close(alice);
    kvp_rpc_close(bob);
    env_down(&e);
}

/* max_bytes: a tenant over it evicts its own least recently used objects
 * first; with nothing of its own evictable (pending puts) the put is
 * refused with -200 (the connector backs off) and counted; a value larger
 * than the quota is refused outright (-2013). max_objects likewise. Other
 * tenants are not touched. `kvpool stat` shows the quotas. */
TEST(quotas_bytes_and_objects_enforced)
{
    env e;
    int up = env_up(&e,
                    "# tenant token [options]\n"
                    "carol tok-carol-0123456789 max_bytes=4MiB\n"
                    "dave tok-dave-0123456789 max_objects=3 share=2\n"
                    "erin tok-erin-0123456789\n",
                    "64MiB");
    CHECK_EQ(up, 0);
    if (up) {
        env_down(&e);
        return;
    }
    int rc;
    kvp_rpc *carol = tq_hello(e.m.addr, NULL, "tok-carol-0123456789", &rc);
    kvp_rpc *dave = tq_hello(e.m.addr, NULL, "tok-dave-0123456789", &rc);
    kvp_rpc *erin = tq_hello(e.m.addr, NULL, "tok-erin-0123456789", &rc);
    CHECK(carol && dave && erin);
    if (carol && dave && erin) {
        CHECK_EQ(publish_n(erin, "erin", "e", 4, MiB), 4);
        /* carol: 10 x 1 MiB under a 4 MiB quota -- the newest 4 stay */
        CHECK_EQ(publish_n(carol, "carol", "c", 10, MiB), 10);
        CHECK_EQ(count_existing(carol, "carol", "c", 10), 4);
        CHECK_EQ(tq_exist(carol, "carol", "c-9"), 1);
        CHECK_EQ(tq_exist(carol, "carol", "c-0"), 0);
        CHECK_EQ(tq_put_start(carol, "carol", "too-big", 5 * MiB, NULL), KVP_EOBJECT_TOO_LARGE);
        /* 4 pending puts take the quota; the 5th has nothing to evict */
        char key[32];
        for (int i = 0; i < 4; i++) {
            snprintf(key, sizeof key, "p-%d", i);
            CHECK_EQ(tq_put_start(carol, "carol", key, MiB, NULL), 0);
        }
        CHECK_EQ(tq_put_start(carol, "carol", "p-4", MiB, NULL), KVP_ENO_AVAILABLE_HANDLE);
        /* dave: 5 objects under max_objects=3 -- the newest 3 stay */
        CHECK_EQ(publish_n(dave, "dave", "d", 5, 4096), 5);
        CHECK_EQ(count_existing(dave, "dave", "d", 5), 3);
        for (int i = 0; i < 3; i++) {
            snprintf(key, sizeof key, "q-%d", i);
            CHECK_EQ(tq_put_start(dave, "dave", key, 4096, NULL), 0);
        }
        CHECK_EQ(tq_put_start(dave, "dave", "q-3", 4096, NULL), KVP_ENO_AVAILABLE_HANDLE);
        /* erin, with no quota, lost nothing */
        CHECK_EQ(count_existing(erin, "erin", "e", 4), 4);
        kvp_arena a;
        kvp_arena_init(&a, 1 << 20);
        kvp_msg_stats_resp st;
        kvp_rpc *admin = tq_hello(e.m.addr, NULL, NULL, &rc);
        CHECK(admin != NULL);
        if (admin && tq_stats(admin, &a, &st) == 0) {
            const kvp_tenant_stat *tc = tq_tenant_row(&st, "carol");
            const kvp_tenant_stat *td = tq_tenant_row(&st, "dave");
            const kvp_tenant_stat *te = tq_tenant_row(&st, "erin");
            CHECK(tc && td && te);
            if (tc && td && te) {
                CHECK_EQ(tc->max_bytes, 4 * MiB);
                CHECK_EQ(tc->pool_bytes, 4 * MiB);
                CHECK_EQ(tc->objects, 4); /* the 4 pending puts */
                CHECK_EQ(tc->evictions, 10);
                CHECK_EQ(tc->refused, 1);
                CHECK_EQ(td->max_objects, 3);
                CHECK_EQ(td->share, 2);
                CHECK_EQ(td->objects, 3);
                CHECK_EQ(td->refused, 1);
                CHECK_EQ(te->max_bytes, 0);
                CHECK_EQ(te->evictions, 0);
            }
        } else {
            CHECK(!"STATS failed");
        }
        kvp_arena_free(&a);
        kvp_rpc_close(admin);
        /* the CLI shows the table */
        char out[16384];
        int st_rc = tp_run_capture((const char *const[]){tp_kvpool_bin(), "stat", "--master",
                                                         e.m.addr, NULL},
                                   1, out, sizeof out, 10000);
        CHECK_EQ(st_rc, 0);
        CHECK(strstr(out, "TENANT") && strstr(out, "carol") && strstr(out, "4.0 MiB"));
        st_rc = tp_run_capture((const char *const[]){tp_kvpool_bin(), "stat", "--json",
                                                     "--master", e.m.addr, NULL},
                               1, out, sizeof out, 10000);
        CHECK_EQ(st_rc, 0);
        CHECK(strstr(out, "\"tenants\": [") && strstr(out, "\"max_objects\": 3, \"share\": 2"));
    }
    kvp_rpc_close(carol);
    kvp_rpc_close(dave);
    kvp_rpc_close(erin);
    env_down(&e);
}

/* A bad option in the tenant tokens file stops the master at start-up. */
TEST(bad_tenant_options_refuse_to_start)
{
    static const char *const bad[] = {
        "alice tok-alice-0123456789 max_bytes=lots\n",
        "alice tok-alice-0123456789 share=0\n",
        "alice tok-alice-0123456789 max_objects=3 max_objects=4\n",
        "alice tok-alice-0123456789 colour=blue\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        env e;
        int up = env_up(&e, bad[i], "8MiB");
        CHECK(up != 0);
        if (up == 0)
            printf("  started with: %s", bad[i]);
        env_down(&e);
    }
}
