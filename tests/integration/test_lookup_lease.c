/*
 * test_lookup_lease.c -- "a hit stays a hit until it is loaded": EXIST_LEASE
 * against a real master (lease_ttl 1 s) and storage node, through the
 * client API (kvp_client_exist_lease) and the raw protocol.
 *
 *   - a key the leased lookup answered present survives eviction pressure
 *     (puts of twice the segment) until lease_ttl, then is evictable again;
 *     a get within it reads the value and takes the hold over, so the key
 *     is evictable at once after it
 *   - the sizes answered are the values' sizes; absent keys answer 0 / 0;
 *     a key of another client's tenant is not seen
 *   - bad requests (truncated body, an absurd count, a key over
 *     max_key_size, trailing bytes, an empty body) are refused with
 *     PROTOCOL, and the master goes on serving (the same connection, and
 *     the client's) -- test_master.c covers NO_HELLO and TOO_LARGE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kvpool.h"
#include "proc.h"
#include "tenant_peer.h"

#define KiB 1024u
#define VAL (256 * KiB) /* a 4 MiB segment holds 16 */

typedef struct env {
    tp_master m;
    tp_store s;
    kvp_client *c;
    int up;
} env;

static int env_up(env *e)
{
    memset(e, 0, sizeof *e);
    if (tp_master_start(&e->m, (const char *const[]){"--lease-ttl", "1s", NULL}) != 0)
        return -1;
    if (tp_store_start(&e->s, e->m.addr, (const char *const[]){"--segment-size", "4MiB", NULL})) {
        tp_master_kill(&e->m);
        return -1;
    }
    e->c = tp_client_open(e->m.addr, NULL);
    if (!e->c) {
        tp_store_kill(&e->s);
        tp_master_kill(&e->m);
        return -1;
    }
    e->up = 1;
    return 0;
}

static void env_down(env *e)
{
    if (!e->up)
        return;
    kvp_client_close(e->c);
    CHECK_EQ(tp_store_stop(&e->s), 0);
    CHECK_EQ(tp_master_stop(&e->m), 0);
}

/* Puts keys NAME-from .. NAME-(from+n-1), values of `size` bytes seeded by
 * their number; returns how many succeeded. */
static int put_range(kvp_client *c, const char *name, int from, int n, size_t size)
{
    uint8_t *v = malloc(size);
    int ok = 0;
    for (int i = from; i < from + n; i++) {
        char k[64];
        snprintf(k, sizeof k, "%s-%d", name, i);
        tp_fill(v, size, (uint64_t)i);
        ok += kvp_client_put(c, k, v, size) == 0;
    }
    free(v);
    return ok;
}

static int exists1(kvp_client *c, const char *key)
{
    int r = -1;
    return kvp_client_exist(c, &key, 1, &r) == 0 ? r : -1;
}

TEST(lookup_lease_survives_pressure_until_ttl)
{
    env e;
    if (env_up(&e) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(put_range(e.c, "held", 0, 4, VAL), 4);
    const char *keys[4] = {"held-0", "held-1", "held-2", "absent"};
    int present[4];
    uint64_t sizes[4];
    CHECK_EQ(kvp_client_exist_lease(e.c, keys, 2, present, sizes), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(present[i], KVP_TIER_DRAM);
        CHECK_EQ(sizes[i], VAL);
    }
    uint64_t t0 = tp_now_ms();
    /* pressure: twice the segment of new values; held-2 and held-3 (as
     * old, not held) go, the held ones stay */
    int ok = put_range(e.c, "churn", 0, 32, VAL);
    CHECK(ok >= 28); /* the puts keep succeeding: there is room to evict */
    if (tp_now_ms() - t0 < 900) { /* (a very slow host: the lease may be over) */
        CHECK_EQ(exists1(e.c, "held-0"), 1);
        CHECK_EQ(exists1(e.c, "held-1"), 1);
    }
    CHECK_EQ(exists1(e.c, "held-2"), 0);
    CHECK_EQ(exists1(e.c, "held-3"), 0);
    /* the load: a get reads the value (and takes held-0's hold over) */
    uint8_t *want = malloc(VAL), *got = malloc(VAL);
    tp_fill(want, VAL, 0);
    if (tp_now_ms() - t0 < 900) {
        CHECK_EQ(kvp_client_get(e.c, "held-0", got, VAL), VAL);
        CHECK(memcmp(want, got, VAL) == 0);
    }
    /* past lease_ttl: evictable again */
    while (tp_now_ms() - t0 < 1300)
        tp_sleep_ms(50);
    put_range(e.c, "churn", 100, 32, VAL);
    CHECK_EQ(exists1(e.c, "held-0"), 0);
    CHECK_EQ(exists1(e.c, "held-1"), 0);
    /* sizes: each value's own; absent: 0 / 0 */
    uint8_t small[100];
    memset(small, 7, sizeof small);
    CHECK_EQ(kvp_client_put(e.c, "sized-a", small, 1), 0);
    CHECK_EQ(kvp_client_put(e.c, "sized-b", small, sizeof small), 0);
    CHECK_EQ(kvp_client_put(e.c, "sized-c", want, 8193), 0);
    const char *sk[4] = {"sized-a", "sized-b", "sized-c", "sized-d"};
    CHECK_EQ(kvp_client_exist_lease(e.c, sk, 4, present, sizes), 0);
    CHECK_EQ(present[0], 1);
    CHECK_EQ(sizes[0], 1);
    CHECK_EQ(present[1], 1);
    CHECK_EQ(sizes[1], sizeof small);
    CHECK_EQ(present[2], 1);
    CHECK_EQ(sizes[2], 8193);
    CHECK_EQ(present[3], 0);
    CHECK_EQ(sizes[3], 0);
    /* an invalid key gets its own code; the call still runs */
    const char *bad[2] = {"", "sized-a"};
    CHECK_EQ(kvp_client_exist_lease(e.c, bad, 2, present, sizes), 0);
    CHECK(present[0] < 0);
    CHECK_EQ(present[1], 1);
    CHECK_EQ(kvp_client_exist_lease(e.c, bad, 2, NULL, sizes), KVP_EINVALID_PARAMS);
    CHECK_EQ(kvp_client_exist_lease(e.c, bad, 0, NULL, NULL), 0);
    /* another tenant does not see them */
    kvp_client *o = tp_client_open(e.m.addr, ", \"tenant\": \"other\"");
    CHECK(o != NULL);
    if (o) {
        CHECK_EQ(kvp_client_exist_lease(o, sk, 1, present, sizes), 0);
        CHECK_EQ(present[0], 0);
        kvp_client_close(o);
    }
    free(want);
    free(got);
    env_down(&e);
}

/* One raw request: its frame status (the body is not looked at). */
static int raw_status(kvp_rpc *r, const kvp_buf *b)
{
    int32_t st = 0;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_EXIST_LEASE, b->data, b->len, &st, &resp, &rl);
    return rc ? rc : st;
}

TEST(lookup_lease_bad_requests_refused)
{
    env e;
    if (env_up(&e) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ(put_range(e.c, "k", 0, 1, 4096), 1);
    int rc;
    kvp_rpc *r = tq_hello(e.m.addr, NULL, NULL, &rc);
    CHECK(r != NULL);
    if (!r) {
        env_down(&e);
        return;
    }
    kvp_buf b;
    kvp_buf_init(&b, 1 << 20);
    /* truncated: a key's length promises more than is sent */
    kvp_bytes k = tq_bs("k-0");
    kvp_enc_keys(&b, &(kvp_msg_keys){tq_bs(""), 1, &k});
    b.len -= 2;
    CHECK_EQ(raw_status(r, &b), KVP_EPROTOCOL);
    /* an absurd count over a tiny body */
    kvp_buf_reset(&b);
    kvp_buf_u32(&b, 0);
    kvp_buf_u32(&b, 0xFFFFFFFFu);
    kvp_buf_u32(&b, 3);
    kvp_buf_put(&b, "k-0", 3);
    CHECK_EQ(raw_status(r, &b), KVP_EPROTOCOL);
    /* a key over max_key_size */
    kvp_buf_reset(&b);
    kvp_buf_u32(&b, 0);
    kvp_buf_u32(&b, 1);
    kvp_buf_u32(&b, 5000);
    for (int i = 0; i < 5000; i++)
        kvp_buf_u8(&b, 'x');
    CHECK_EQ(raw_status(r, &b), KVP_EPROTOCOL);
    /* trailing bytes; an empty body */
    kvp_buf_reset(&b);
    kvp_enc_keys(&b, &(kvp_msg_keys){tq_bs(""), 1, &k});
    kvp_buf_u8(&b, 0);
    CHECK_EQ(raw_status(r, &b), KVP_EPROTOCOL);
    kvp_buf_reset(&b);
    CHECK_EQ(raw_status(r, &b), KVP_EPROTOCOL);
    /* the same connection still works, and answers the real thing */
    kvp_buf_reset(&b);
    kvp_enc_keys(&b, &(kvp_msg_keys){tq_bs(""), 1, &k});
    int32_t st = -1;
    const uint8_t *resp;
    uint32_t rl;
    CHECK_EQ(kvp_rpc_call(r, KVP_OP_EXIST_LEASE, b.data, b.len, &st, &resp, &rl), 0);
    CHECK_EQ(st, 0);
    kvp_arena a;
    kvp_arena_init(&a, 1 << 20);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_exist_lease_resp x;
    CHECK_EQ(kvp_dec_exist_lease_resp(resp, rl, &lim, &a, &x), 0);
    CHECK_EQ(x.n, 1);
    CHECK_EQ(x.lease_ttl_ms, 1000);
    CHECK_EQ(x.ents[0].state, KVP_XL_LEASED);
    CHECK_EQ(x.ents[0].size, 4096);
    kvp_arena_free(&a);
    kvp_rpc_close(r);
    int alive_status = 0;
    CHECK(tp_master_alive(&e.m, &alive_status));
    int present = -1;
    uint64_t size = 0;
    const char *key = "k-0";
    CHECK_EQ(kvp_client_exist_lease(e.c, &key, 1, &present, &size), 0);
    CHECK_EQ(present, 1);
    CHECK_EQ(size, 4096);
    kvp_buf_free(&b);
    env_down(&e);
}
