/* test_repl_sync.c -- who may follow a master's index (REPL_FOLLOW: only a
 * cluster's master, only to the node credential) and how long a follower
 * may hold a put (ha_sync: never longer than ha_sync_timeout after the put
 * was journaled, however the follower paces its acks). The master core is
 * driven in-process with an injected clock; the follower is simulated by
 * REPL_ACK frames. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/log.h"
#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "ha/repl.h"
#include "master/master.h"

#define MiB (1024ull * 1024)
#define NODE_TOKEN "node-secret-0123456789"

typedef struct core {
    kvp_config cfg;
    kvp_master *m;
    uint64_t now, next_id;
    kvp_arena a, ra;
    kvp_buf out, body;
    int32_t status;
    const uint8_t *resp;
    uint32_t resp_len;
} core;

static int core_init(core *c, int cluster, const char *node_token, uint64_t timeout_ms)
{
    memset(c, 0, sizeof *c);
    kvp_config_defaults(&c->cfg);
    c->cfg.log_level = KVP_LOG_ERROR;
    if (cluster) /* the core never dials it: only "in a cluster" matters here */
        snprintf(c->cfg.etcd, sizeof c->cfg.etcd, "http://127.0.0.1:1");
    snprintf(c->cfg.node_token, sizeof c->cfg.node_token, "%s", node_token);
    c->cfg.ha_sync = 1;
    c->cfg.ha_sync_timeout_ms = timeout_ms;
    c->now = 1000000;
    kvp_arena_init(&c->a, 64 * MiB);
    kvp_arena_init(&c->ra, 64 * MiB);
    kvp_buf_init(&c->out, 256 * MiB);
    kvp_buf_init(&c->body, 64 * MiB);
    kvp_log_set_level(KVP_LOG_ERROR);
    return kvp_master_create(&c->cfg, c->now, &c->m);
}

static void core_free(core *c)
{
    kvp_master_destroy(c->m);
    kvp_arena_free(&c->a);
    kvp_arena_free(&c->ra);
    kvp_buf_free(&c->out);
    kvp_buf_free(&c->body);
}

/* c->body as a request of op on s; the first frame of the answer (a
 * REPL_FOLLOW's snapshot frames follow it) decoded into status / resp. */
static void call(core *c, kvp_msess *s, uint16_t op, uint8_t flags)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, flags, op, ++c->next_id, (uint32_t)c->body.len, 0};
    kvp_buf_reset(&c->out);
    kvp_arena_reset(&c->a);
    kvp_arena_reset(&c->ra);
    CHECK(kvp_master_handle(c->m, s, &h, c->body.data, &c->a, &c->out, c->now) == 0);
    kvp_buf_reset(&c->body);
    c->status = 0;
    c->resp = NULL;
    c->resp_len = 0;
    if (!c->out.len)
        return;
    kvp_frame_hdr rh;
    const uint8_t *b;
    CHECK(kvp_frame_next(c->out.data, c->out.len, 1u << 30, &rh, &b) == 1);
    CHECK(rh.req_id == h.req_id && rh.op == op);
    c->status = rh.status;
    c->resp = b;
    c->resp_len = rh.body_len;
}

static int hello(core *c, kvp_msess *s, uint64_t id, const char *node_cred)
{
    memset(s, 0, sizeof *s);
    kvp_master_sess_open(c->m, s);
    kvp_auth_creds cr = hr_creds(NULL, node_cred, NULL, NULL);
    kvp_auth_tx t;
    hr_challenge(&c->body, &t, &cr);
    call(c, s, KVP_OP_AUTH_CHALLENGE, 0);
    if (c->status || hr_answer(&t, &cr, c->resp, c->resp_len) < 0)
        return c->status ? c->status : KVP_EPROTOCOL;
    hr_hello(&c->body, &t, &cr, id, "t");
    call(c, s, KVP_OP_HELLO, 0);
    return c->status;
}

static int follow(core *c, kvp_msess *s)
{
    call(c, s, KVP_OP_REPL_FOLLOW, 0);
    return c->status;
}

static void ack(core *c, kvp_msess *s, uint64_t seq)
{
    kvp_buf_u64(&c->body, seq);
    call(c, s, KVP_OP_REPL_ACK, KVP_FLAG_ONEWAY);
}

static void mount(core *c, kvp_msess *s)
{
    static const char name[] = "127.0.0.1:7000";
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)name, sizeof name - 1}};
    kvp_seg_desc d = {77, {(const uint8_t *)name, sizeof name - 1}, 256 * MiB, 1, &ep, 0, 1, 0};
    kvp_msg_mount mm = {1, &d};
    kvp_enc_mount(&c->body, &mm);
    call(c, s, KVP_OP_MOUNT_SEGMENT, 0);
    CHECK(c->status == 0);
    kvp_msg_results r;
    kvp_proto_limits l;
    kvp_proto_limits_default(&l);
    CHECK(kvp_dec_results(c->resp, c->resp_len, &l, &c->ra, &r) == 0 && r.n == 1);
    CHECK(r.codes[0] == 0);
}

/* PUT_START + PUT_END of key-<i>: the object published (one journal record). */
static void put(core *c, kvp_msess *s, int i)
{
    char kb[32];
    kvp_bytes key = {(const uint8_t *)kb, (uint32_t)snprintf(kb, sizeof kb, "key-%06d", i)};
    uint64_t size = 4096, cs = 0xC0DE0000u + (uint64_t)i;
    kvp_msg_put_start ps = {{NULL, 0}, 1, 0, 0, {NULL, 0}, 1, &key, &size, NULL};
    kvp_enc_put_start(&c->body, &ps);
    call(c, s, KVP_OP_PUT_START, 0);
    CHECK(c->status == 0);
    kvp_msg_put_end pe = {{NULL, 0}, 1, &key, &cs};
    kvp_enc_put_end(&c->body, &pe);
    call(c, s, KVP_OP_PUT_END, 0);
    CHECK(c->status == 0);
}

static void drop_send(kvp_msess *s, const void *p, size_t n, void *ctx)
{
    (void)s, (void)p, (void)n, (void)ctx;
}

/* What the service does each loop turn: push the journal, judge the
 * followers. */
static void turn(core *c, kvp_repl_state *st)
{
    kvp_master_push_repl(c->m, drop_send, NULL);
    kvp_master_repl_state(c->m, c->now, st);
}

/* ------------------------------------------------------------------ tests */

/* A standalone master (no etcd) streams its index to nobody: not to a
 * plain client (the default: no node_token), not to a node-credential
 * holder; so ha_sync never holds its puts. */
TEST(repl_follow_refused_on_a_standalone_master)
{
    core c;
    CHECK(core_init(&c, 0, "", 1000) == 0);
    kvp_msess s;
    CHECK_EQ(hello(&c, &s, 11, NULL), 0);
    CHECK_EQ(follow(&c, &s), KVP_EILLEGAL_CLIENT);
    CHECK(!s.follower);
    CHECK_EQ(c.out.len, (size_t)KVP_FRAME_HDR); /* the refusal, no snapshot */
    kvp_master_sess_close(c.m, &s, c.now);
    core_free(&c);

    CHECK(core_init(&c, 0, NODE_TOKEN, 1000) == 0);
    kvp_msess n;
    CHECK_EQ(hello(&c, &n, 12, NODE_TOKEN), 0);
    mount(&c, &n);
    CHECK_EQ(follow(&c, &n), KVP_EILLEGAL_CLIENT);
    kvp_repl_state st;
    turn(&c, &st);
    CHECK_EQ(st.followers, 0u);
    put(&c, &n, 1);
    CHECK_EQ(kvp_master_repl_gate(c.m), 0u);
    kvp_master_sess_close(c.m, &n, c.now);
    core_free(&c);
}

/* A cluster's master streams it only to the node credential; without a
 * node_token, to nobody. */
TEST(repl_follow_needs_the_node_credential_in_a_cluster)
{
    core c;
    CHECK(core_init(&c, 1, "", 1000) == 0); /* a cluster without node_token */
    kvp_msess s;
    CHECK_EQ(hello(&c, &s, 21, NULL), 0);
    CHECK_EQ(follow(&c, &s), KVP_EILLEGAL_CLIENT);
    kvp_master_sess_close(c.m, &s, c.now);
    core_free(&c);

    CHECK(core_init(&c, 1, NODE_TOKEN, 1000) == 0);
    kvp_msess plain, node;
    CHECK_EQ(hello(&c, &plain, 22, NULL), 0);
    CHECK_EQ(follow(&c, &plain), KVP_EILLEGAL_CLIENT);
    CHECK(!plain.follower);
    CHECK_EQ(hello(&c, &node, 23, NODE_TOKEN), 0);
    CHECK_EQ(follow(&c, &node), 0);
    CHECK(node.follower);
    CHECK(c.out.len > (size_t)KVP_FRAME_HDR); /* the answer, then the snapshot */
    kvp_repl_state st;
    turn(&c, &st);
    CHECK_EQ(st.followers, 1u);
    kvp_master_sess_close(c.m, &plain, c.now);
    kvp_master_sess_close(c.m, &node, c.now);
    core_free(&c);
}

#define TIMEOUT_MS 1000u
#define STEP_MS 10u
#define PUT_EVERY 5 /* steps */

/* Runs `ms` of puts (one every PUT_EVERY steps) against a cluster's
 * master with one follower that acknowledges every `ack_every` ms, each
 * time the seq that was current at its previous ack (lagging one period
 * behind, as a follower pacing its acks would). *max_hold: the longest a
 * put's answer was held (from its journaling until the in-sync followers
 * had it, or none was waited for); *synced_after: whether the follower
 * counted as in sync at the end. */
static void paced(uint64_t ack_every, uint64_t ms, uint64_t *max_hold, int *synced_end,
                  int *ever_out)
{
    core c;
    CHECK(core_init(&c, 1, NODE_TOKEN, TIMEOUT_MS) == 0);
    kvp_msess node, fol;
    CHECK(hello(&c, &node, 31, NODE_TOKEN) == 0);
    mount(&c, &node);
    put(&c, &node, 0);
    CHECK(hello(&c, &fol, 32, NODE_TOKEN) == 0);
    CHECK(follow(&c, &fol) == 0);
    kvp_repl_state st;
    turn(&c, &st);
    ack(&c, &fol, st.seq); /* the snapshot, at once */
    c.now += STEP_MS;
    turn(&c, &st);
    CHECK_EQ(st.in_sync, 1u);
    enum { MAXP = 4096 };
    static uint64_t pseq[MAXP], pms[MAXP];
    int np = 0, released = 0, key = 1;
    uint64_t last_ack_ms = c.now, prev_seen = st.seq;
    *max_hold = 0;
    *ever_out = 0;
    for (uint64_t t = 0, step = 0; t < ms; t += STEP_MS, step++) {
        c.now += STEP_MS;
        if (step % PUT_EVERY == 0 && np < MAXP) {
            put(&c, &node, key++);
            uint64_t g = kvp_master_repl_gate(c.m);
            if (g) { /* its answer waits for seq g */
                pseq[np] = g;
                pms[np++] = c.now;
            }
        }
        int acked_now = c.now - last_ack_ms >= ack_every;
        if (acked_now) {
            ack(&c, &fol, prev_seen);
            last_ack_ms = c.now;
        }
        turn(&c, &st);
        if (acked_now)
            prev_seen = st.seq; /* what it acknowledges next time */
        if (!st.in_sync)
            *ever_out = 1;
        /* answers released now: gate <= acked (acked = seq with none in sync) */
        while (released < np && pseq[released] <= st.acked) {
            uint64_t held = c.now - pms[released];
            if (held > *max_hold)
                *max_hold = held;
            released++;
        }
    }
    for (; released < np; released++) /* still held at the end */
        if (c.now - pms[released] > *max_hold)
            *max_hold = c.now - pms[released];
    *synced_end = st.in_sync == 1;
    kvp_master_sess_close(c.m, &fol, c.now);
    kvp_master_sess_close(c.m, &node, c.now);
    core_free(&c);
}

/* A follower acking every 0.9 s what was current at its previous ack: the
 * old rule (the timeout restarted at each ack that reached the last mark)
 * kept it in sync forever and held puts ~1.8 s. Now a put is held at most
 * ha_sync_timeout (plus the step and the journal clock's grain), the
 * follower stops counting as in sync and does not come back while it
 * keeps that pace. */
TEST(repl_paced_follower_holds_no_put_past_the_timeout)
{
    uint64_t hold;
    int synced, out;
    paced(900, 6000, &hold, &synced, &out);
    fprintf(stderr, "    follower acking every 900 ms, one period behind: longest hold %llu ms, "
                    "in sync at the end: %d\n",
            (unsigned long long)hold, synced);
    CHECK(hold <= TIMEOUT_MS + STEP_MS + TIMEOUT_MS / 64 + 1);
    CHECK(out);
    CHECK(!synced);
}

/* A follower that acks promptly (every step, one step behind) stays in
 * sync and holds puts only that long. */
TEST(repl_prompt_follower_stays_in_sync)
{
    uint64_t hold;
    int synced, out;
    paced(STEP_MS, 3000, &hold, &synced, &out);
    CHECK(!out);
    CHECK(synced);
    CHECK(hold <= 3 * STEP_MS);
}

/* ha_sync outside a cluster does nothing, and in a cluster with ha_sync
 * off the gate is open too. */
TEST(repl_gate_only_with_ha_sync_in_a_cluster)
{
    core c;
    CHECK(core_init(&c, 1, NODE_TOKEN, TIMEOUT_MS) == 0);
    c.cfg.ha_sync = 0;
    kvp_master_destroy(c.m);
    CHECK(kvp_master_create(&c.cfg, c.now, &c.m) == 0);
    kvp_msess node, fol;
    CHECK(hello(&c, &node, 41, NODE_TOKEN) == 0);
    mount(&c, &node);
    CHECK(hello(&c, &fol, 42, NODE_TOKEN) == 0);
    CHECK(follow(&c, &fol) == 0);
    kvp_repl_state st;
    turn(&c, &st);
    ack(&c, &fol, st.seq);
    turn(&c, &st);
    CHECK_EQ(st.in_sync, 1u);
    put(&c, &node, 1);
    CHECK_EQ(kvp_master_repl_gate(c.m), 0u);
    kvp_master_sess_close(c.m, &fol, c.now);
    kvp_master_sess_close(c.m, &node, c.now);
    core_free(&c);
}

/* --------------------------------- snapshots over turns, the follower cap */

/* Beyond max_followers a REPL_FOLLOW is refused (KVP_ELIMIT), and each
 * follower's output may hold at most its share of repl_buffer_budget (the
 * old core let any number follow, each holding up to 1 GiB). A place
 * freed is taken again. */
TEST(repl_followers_beyond_the_cap_are_refused)
{
    core c;
    CHECK(core_init(&c, 1, NODE_TOKEN, 1000) == 0);
    c.cfg.max_followers = 2;
    c.cfg.repl_buffer_budget = 64 * MiB;
    kvp_master_destroy(c.m);
    CHECK(kvp_master_create(&c.cfg, c.now, &c.m) == 0);
    kvp_msess f[3];
    for (int i = 0; i < 3; i++)
        CHECK_EQ(hello(&c, &f[i], 51 + (uint64_t)i, NODE_TOKEN), 0);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ(follow(&c, &f[i]), 0);
        CHECK(f[i].follower);
        CHECK(c.out.cap <= 32 * MiB); /* its share of the budget */
    }
    CHECK_EQ(follow(&c, &f[2]), KVP_ELIMIT);
    CHECK(!f[2].follower);
    CHECK_EQ(c.out.len, (size_t)KVP_FRAME_HDR); /* the refusal, no snapshot */
    kvp_repl_state st;
    turn(&c, &st);
    CHECK_EQ(st.followers, 2u);
    CHECK_EQ(follow(&c, &f[0]), 0); /* following again takes no second place */
    kvp_master_sess_close(c.m, &f[1], c.now);
    CHECK_EQ(follow(&c, &f[2]), 0);
    turn(&c, &st);
    CHECK_EQ(st.followers, 2u);
    kvp_master_sess_close(c.m, &f[0], c.now);
    kvp_master_sess_close(c.m, &f[2], c.now);
    core_free(&c);
}

#define SN 6000 /* objects: several snapshot budgets */
#define SN_MORE 1000

/* A standby's picture rebuilt from its stream: key number -> checksum
 * (0: absent). */
typedef struct standby {
    kvp_msess *s;
    kvp_buf stream; /* all it was sent */
    size_t applied;
    int full;       /* its window is full: no snapshot output now */
    int synced;     /* SYNCED seen */
    uint64_t cs[SN + SN_MORE];
    uint64_t pubs_before_synced; /* journal records of puts made meanwhile */
} standby;

static void sb_send(kvp_msess *s, const void *p, size_t n, void *ctx)
{
    standby *b = ctx;
    if (s == b->s)
        kvp_buf_put(&b->stream, p, n);
}

static kvp_buf *sb_out(kvp_msess *s, void *ctx)
{
    standby *b = ctx;
    return s == b->s && !b->full ? &b->stream : NULL;
}

static int key_no(kvp_bytes k)
{
    char t[16];
    if (k.len < 5 || k.len > 15)
        return -1;
    memcpy(t, k.p, k.len);
    t[k.len] = 0;
    return atoi(t + 4);
}

/* Applies what arrived since the last call. */
static void sb_apply(standby *b)
{
    while (b->applied < b->stream.len) {
        kvp_frame_hdr h;
        const uint8_t *body;
        CHECK(kvp_frame_next(b->stream.data + b->applied, b->stream.len - b->applied, 1u << 30,
                             &h, &body) == 1);
        b->applied += KVP_FRAME_HDR + h.body_len;
        if (h.op != KVP_OP_REPL_DATA)
            continue; /* the answer */
        kvp_repl_rd it;
        kvp_repl_rec r;
        uint64_t seq;
        CHECK(kvp_repl_open(&it, body, h.body_len, &seq) == 0);
        int rc;
        while ((rc = kvp_repl_next(&it, &r)) == 1) {
            int k = r.type == KVP_REPL_PUB || r.type == KVP_REPL_DEL ? key_no(r.key) : 0;
            CHECK(k >= 0 && k < SN + SN_MORE);
            if (r.type == KVP_REPL_RESET) {
                memset(b->cs, 0, sizeof b->cs);
                b->synced = 0;
            } else if (r.type == KVP_REPL_SYNCED) {
                b->synced = 1;
            } else if (r.type == KVP_REPL_PUB) {
                b->cs[k] = r.checksum;
                if (k >= SN && !b->synced)
                    b->pubs_before_synced++;
            } else {
                b->cs[k] = 0;
            }
        }
        CHECK_EQ(rc, 0);
    }
}

static void del(core *c, kvp_msess *s, int i)
{
    char kb[32];
    kvp_bytes key = {(const uint8_t *)kb, (uint32_t)snprintf(kb, sizeof kb, "key-%06d", i)};
    kvp_msg_remove rm = {{NULL, 0}, 1, 1, &key};
    kvp_enc_remove(&c->body, &rm);
    call(c, s, KVP_OP_REMOVE, 0);
    CHECK(c->status == 0);
}

/* A snapshot of SN objects is not built in one request any more: the
 * REPL_FOLLOW answer carries its first budget, the rest goes out a budget
 * a turn (kvp_master_push_snaps), none while the standby's window is full;
 * a normal client's puts and removes are served between the turns, and
 * the standby still converges to the leader's index. It is waited for
 * only once it acknowledged the snapshot's end. */
TEST(repl_snapshot_spread_over_turns_converges)
{
    core c;
    CHECK(core_init(&c, 1, NODE_TOKEN, 1000) == 0);
    kvp_msess node, fol;
    CHECK_EQ(hello(&c, &node, 61, NODE_TOKEN), 0);
    mount(&c, &node);
    for (int i = 0; i < SN; i++)
        put(&c, &node, i);
    kvp_repl_state st;
    turn(&c, &st);
    CHECK_EQ(hello(&c, &fol, 62, NODE_TOKEN), 0);
    static standby b;
    memset(&b, 0, sizeof b);
    b.s = &fol;
    kvp_buf_init(&b.stream, 1024 * MiB);
    CHECK_EQ(follow(&c, &fol), 0);
    kvp_buf_put(&b.stream, c.out.data, c.out.len);
    sb_apply(&b);
    CHECK(!b.synced); /* not in one request */
    static uint64_t truth[SN + SN_MORE];
    for (int i = 0; i < SN; i++)
        truth[i] = 0xC0DE0000u + (uint64_t)i;
    int turns = 0, steps = 1, next = SN, removed = 0;
    while (!b.synced && turns < 10000) {
        turns++;
        b.full = turns % 3 == 0; /* now and then the socket does not drain */
        if (!b.full) {           /* a normal client, between the turns */
            put(&c, &node, next);
            truth[next] = 0xC0DE0000u + (uint64_t)next;
            next++;
            del(&c, &node, removed * 7);
            truth[removed * 7] = 0;
            removed++;
        }
        size_t before = b.stream.len;
        kvp_master_push_repl(c.m, sb_send, &b);
        int more = kvp_master_push_snaps(c.m, sb_out, &b);
        kvp_master_repl_state(c.m, c.now, &st);
        if (b.full) { /* nothing journaled, nothing produced */
            CHECK_EQ(b.stream.len, before);
            CHECK_EQ(more, 0);
        } else if (b.stream.len > before) {
            steps++;
        }
        sb_apply(&b);
        if (!b.synced) { /* acknowledging all it has is not enough before SYNCED */
            ack(&c, &fol, st.seq);
            kvp_master_repl_state(c.m, c.now, &st);
            CHECK_EQ(st.in_sync, 0u);
        }
        c.now += 1;
    }
    fprintf(stderr, "    %d objects: %d turns, %d steps, %llu puts journaled before SYNCED\n",
            SN, turns, steps, (unsigned long long)b.pubs_before_synced);
    CHECK(b.synced);
    CHECK(steps >= 4);
    CHECK(b.pubs_before_synced >= 3); /* puts served between the steps */
    int wrong = 0;
    for (int i = 0; i < SN + SN_MORE; i++)
        wrong += b.cs[i] != truth[i];
    CHECK_EQ(wrong, 0);
    ack(&c, &fol, st.seq);
    turn(&c, &st);
    CHECK_EQ(st.in_sync, 1u);
    kvp_buf_free(&b.stream);
    kvp_master_sess_close(c.m, &fol, c.now);
    kvp_master_sess_close(c.m, &node, c.now);
    core_free(&c);
}
