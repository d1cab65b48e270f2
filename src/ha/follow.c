/* follow.c -- a standby following its leader's index stream (follow.h). */
#include "ha/follow.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "ha/leader.h"
#include "ha/repl.h"
#include "kvpool.h"
#include "net/rpc.h"

#define MOD "follow"
#define RETRY_MS 100
#define POLL_MS 50
#define IDLE_ACK_MS 1000 /* an idle stream is acknowledged this often (any request
                            keeps a client alive; client_ttl is at least 1 s) */

struct kvp_follow {
    char master[1200], self[300], token[256], node_token[256];
    int timeout_ms;
    int (*apply)(void *ctx, const uint8_t *body, size_t len, uint64_t *seq);
    void *ctx;
    pthread_t th;
    _Atomic int stop;
    _Atomic uint64_t frames;
    _Atomic int synced;   /* the last snapshot is complete (SYNCED applied since its RESET) */
    /* the connection's state, for on_push */
    int bad;          /* apply refused a frame: reconnect */
    uint64_t seq;     /* last applied seq */
    int have_seq;
    char leader[KVP_LEADER_ADDR_MAX + 1];
};

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void on_push(void *ctx, const kvp_frame_hdr *h, const uint8_t *body)
{
    kvp_follow *f = ctx;
    if (h->op != KVP_OP_REPL_DATA || f->bad)
        return;
    uint64_t seq = 0;
    int rc = f->apply(f->ctx, body, h->body_len, &seq);
    if (rc) {
        KVP_WARN(MOD, "leader %s: index frame refused (%s): following again", f->leader,
                 kvp_strerror(rc));
        f->bad = 1;
        return;
    }
    f->seq = seq;
    f->have_seq = 1;
    f->frames++;
    kvp_repl_rd it;
    kvp_repl_rec r;
    if (kvp_repl_open(&it, body, h->body_len, &seq) != 0)
        return;
    while (kvp_repl_next(&it, &r) == 1) {
        if (r.type == KVP_REPL_RESET)
            f->synced = 0;
        else if (r.type == KVP_REPL_SYNCED)
            f->synced = 1;
    }
}

static int ack(kvp_rpc *r, uint64_t seq)
{
    uint8_t body[8];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_buf_u64(&b, seq);
    kvp_rpc_queue(r, KVP_OP_REPL_ACK, KVP_FLAG_ONEWAY, body, b.len);
    return kvp_rpc_flush(r);
}

/* One connection to the leader, until it breaks or we stop. */
static void follow_once(kvp_follow *f, int *warned)
{
    char err[512];
    kvp_leader_info li;
    if (kvp_leader_resolve(f->master, f->leader, sizeof f->leader, &li, err, sizeof err) != 0) {
        if (!(*warned)++)
            KVP_INFO(MOD, "no leader to follow yet: %s", err);
        return;
    }
    if (strcmp(f->leader, f->self) == 0)
        return; /* our own record (being resigned): wait for the next */
    kvp_rpc_opts o = {.token = f->token[0] ? f->token : NULL,
                      .name = "standby",
                      .timeout_ms = f->timeout_ms,
                      .node_token = f->node_token[0] ? f->node_token : NULL,
                      .max_frame = 16u << 20,
                      .on_push = on_push,
                      .push_ctx = f};
    kvp_rpc *r;
    if (kvp_rpc_open(f->leader, &o, &r, err, sizeof err) != 0) {
        if (!(*warned)++)
            KVP_WARN(MOD, "leader %s: %s (retrying)", f->leader, err);
        return;
    }
    f->bad = 0;
    f->have_seq = 0;
    int32_t st = 0;
    const uint8_t *rb;
    uint32_t rl;
    int rc = kvp_rpc_call(r, KVP_OP_REPL_FOLLOW, NULL, 0, &st, &rb, &rl);
    if (rc || st) {
        KVP_WARN(MOD, "leader %s refused to stream its index: %s", f->leader,
                 kvp_strerror(rc ? rc : st));
        kvp_rpc_close(r);
        nap_ms(1000);
        return;
    }
    KVP_INFO(MOD, "following leader %s (epoch %llu)", f->leader, (unsigned long long)li.epoch);
    *warned = 0;
    uint64_t acked = 0, acked_ms = kvp_now_ms();
    int acked_any = 0;
    while (!f->stop && !f->bad) {
        rc = kvp_rpc_poll(r, POLL_MS);
        if (rc)
            break;
        /* each frame applied is acknowledged; an idle stream too, now and
         * then, which keeps this standby alive at the leader (client_ttl) */
        uint64_t now = kvp_now_ms();
        if ((f->have_seq && (!acked_any || f->seq != acked)) || now - acked_ms >= IDLE_ACK_MS) {
            if (ack(r, f->seq) != 0)
                break;
            acked = f->seq;
            acked_any = f->have_seq;
            acked_ms = now;
        }
    }
    if (!f->stop)
        KVP_INFO(MOD, "leader %s: stream ended (%s)", f->leader,
                 f->bad ? "refused frame" : kvp_strerror(rc));
    kvp_rpc_close(r);
}

static void *follow_main(void *arg)
{
    kvp_follow *f = arg;
    int warned = 0;
    while (!f->stop) {
        follow_once(f, &warned);
        for (int i = 0; i < RETRY_MS / 10 && !f->stop; i++)
            nap_ms(10);
    }
    return NULL;
}

int kvp_follow_start(const kvp_follow_opts *o, kvp_follow **out)
{
    kvp_follow *f = kvp_calloc(1, sizeof *f);
    if (!f)
        return KVP_ENOMEM;
    snprintf(f->master, sizeof f->master, "%s", o->master);
    snprintf(f->self, sizeof f->self, "%s", o->self ? o->self : "");
    snprintf(f->token, sizeof f->token, "%s", o->token ? o->token : "");
    snprintf(f->node_token, sizeof f->node_token, "%s", o->node_token ? o->node_token : "");
    f->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 2000;
    f->apply = o->apply;
    f->ctx = o->ctx;
    if (pthread_create(&f->th, NULL, follow_main, f) != 0) {
        kvp_free(f);
        return KVP_EINTERNAL_ERROR;
    }
    *out = f;
    return 0;
}

void kvp_follow_stop(kvp_follow *f)
{
    if (!f)
        return;
    f->stop = 1;
    pthread_join(f->th, NULL);
    kvp_free(f);
}

uint64_t kvp_follow_frames(const kvp_follow *f) { return f->frames; }
int kvp_follow_synced(const kvp_follow *f) { return f && f->synced; }
