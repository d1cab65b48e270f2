/*
 * test_master_backoff.c -- the master core's answer to failed HELLOs, with
 * an injected clock: credentials are always checked (the right token is
 * accepted from an address that keeps failing), the free failures are
 * answered at once with KVP_EAUTH, later ones with KVP_EAUTH_BACKOFF, the
 * address and the back-off left, held for the service (kvp_msess.hold_ms);
 * the record is per address and is forgotten after a quiet while.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "master/master.h"
#include "proto/proto.h"

typedef struct core {
    kvp_config cfg;
    kvp_master *m;
    uint64_t now, next_id;
    kvp_arena a;
    kvp_buf out, body;
} core;

typedef struct answer {
    int32_t status;
    uint32_t hold_ms;
    int close_after, authenticated;
    kvp_msg_hello_backoff bo; /* valid when status is KVP_EAUTH_BACKOFF */
    int bo_rc;
    char addr[KVP_BACKOFF_ADDR_MAX + 1];
} answer;

static int core_init(core *c)
{
    memset(c, 0, sizeof *c);
    kvp_config_defaults(&c->cfg);
    c->cfg.log_level = KVP_LOG_ERROR;
    snprintf(c->cfg.cluster_token, sizeof c->cfg.cluster_token, "%s", "right");
    c->now = 1000000;
    kvp_arena_init(&c->a, 1u << 20);
    kvp_buf_init(&c->out, 1u << 20);
    kvp_buf_init(&c->body, 1u << 20);
    kvp_log_set_level(KVP_LOG_ERROR);
    return kvp_master_create(&c->cfg, c->now, &c->m);
}

static void core_free(core *c)
{
    kvp_master_destroy(c->m);
    kvp_arena_free(&c->a);
    kvp_buf_free(&c->out);
    kvp_buf_free(&c->body);
}

/* One HELLO with `token` on a fresh connection from (peer, addr); the
 * session is closed afterwards, as the service does after the answer. */
static answer hello(core *c, uint64_t peer, const char *addr, const char *token)
{
    answer an = {0};
    kvp_msess s;
    kvp_master_sess_open(c->m, &s);
    s.peer = peer;
    snprintf(s.peer_addr, sizeof s.peer_addr, "%s", addr);
    /* the challenge, then the HELLO proving `token` (the client goes on
     * whatever the master proved: it is the guesser) */
    kvp_auth_creds cr = hr_creds(token, NULL, NULL, NULL);
    kvp_auth_tx t;
    kvp_buf_reset(&c->body);
    hr_challenge(&c->body, &t, &cr);
    kvp_frame_hdr ch = {KVP_PROTO_VERSION, 0, KVP_OP_AUTH_CHALLENGE, ++c->next_id,
                        (uint32_t)c->body.len, 0};
    kvp_buf_reset(&c->out);
    kvp_arena_reset(&c->a);
    kvp_frame_hdr rh;
    const uint8_t *body;
    if (kvp_master_handle(c->m, &s, &ch, c->body.data, &c->a, &c->out, c->now) != 0 ||
        kvp_frame_next(c->out.data, c->out.len, 1u << 20, &rh, &body) <= 0 || rh.status != 0 ||
        hr_answer(&t, &cr, body, rh.body_len) < 0) {
        an.status = 3;
        kvp_master_sess_close(c->m, &s, c->now);
        return an;
    }
    kvp_buf_reset(&c->body);
    hr_hello(&c->body, &t, &cr, ++c->next_id + 0x1000, "t");
    kvp_frame_hdr fh = {KVP_PROTO_VERSION, 0, KVP_OP_HELLO, c->next_id, (uint32_t)c->body.len, 0};
    kvp_buf_reset(&c->out);
    kvp_arena_reset(&c->a);
    if (kvp_master_handle(c->m, &s, &fh, c->body.data, &c->a, &c->out, c->now) != 0) {
        an.status = 1;
        return an;
    }
    if (kvp_frame_next(c->out.data, c->out.len, 1u << 20, &rh, &body) <= 0) {
        an.status = 2;
    } else {
        an.status = rh.status;
        if (rh.status == KVP_EAUTH_BACKOFF) {
            an.bo_rc = kvp_dec_hello_backoff(body, rh.body_len, &an.bo);
            if (an.bo_rc == 0)
                snprintf(an.addr, sizeof an.addr, "%.*s", (int)an.bo.addr.len,
                         (const char *)an.bo.addr.p);
        }
    }
    an.hold_ms = s.hold_ms;
    an.close_after = s.close_after;
    an.authenticated = s.client != NULL;
    kvp_master_sess_close(c->m, &s, c->now);
    return an;
}

TEST(right_token_accepted_while_the_address_backs_off)
{
    core c;
    CHECK_EQ(core_init(&c), 0);
    const uint64_t peer = 0xA11CE;
    answer a;
    for (int i = 0; i < 3; i++) { /* the free failures: at once, "wrong token" */
        a = hello(&c, peer, "10.0.0.7", "guess");
        CHECK_EQ(a.status, KVP_EAUTH);
        CHECK_EQ(a.hold_ms, 0u);
        CHECK(a.close_after);
        c.now += 10;
    }
    a = hello(&c, peer, "10.0.0.7", "guess"); /* backing off: late, and saying why */
    CHECK_EQ(a.status, KVP_EAUTH_BACKOFF);
    CHECK_EQ(a.hold_ms, 1000u);
    CHECK(a.close_after && !a.authenticated);
    CHECK_EQ(a.bo_rc, 0);
    CHECK(strcmp(a.addr, "10.0.0.7") == 0);
    /* the right token from the same address, at once */
    a = hello(&c, peer, "10.0.0.7", "right");
    CHECK_EQ(a.status, 0);
    CHECK(a.authenticated && !a.close_after && a.hold_ms == 0);
    /* ... and it does not reset the guesser: the back-off keeps growing */
    uint32_t last = 0;
    for (int i = 0; i < 12; i++) {
        c.now += 10;
        a = hello(&c, peer, "10.0.0.7", "guess");
        CHECK_EQ(a.status, KVP_EAUTH_BACKOFF);
        CHECK(a.bo.retry_ms >= last);
        last = a.bo.retry_ms;
    }
    CHECK(last > 0 && last <= 30000 - 1000); /* 30 s at most, less the held second */
    /* another address is not affected */
    a = hello(&c, 0xB0B, "10.0.0.8", "guess");
    CHECK_EQ(a.status, KVP_EAUTH);
    CHECK_EQ(a.hold_ms, 0u);
    /* quiet past the back-off and 30 s after the last failure: forgotten */
    c.now += 30000 + 30000;
    a = hello(&c, peer, "10.0.0.7", "guess");
    CHECK_EQ(a.status, KVP_EAUTH);
    CHECK_EQ(a.hold_ms, 0u);
    core_free(&c);
}

/* A peer the service could not hash (0) is never held (no shared record). */
TEST(unknown_peer_is_answered_at_once)
{
    core c;
    CHECK_EQ(core_init(&c), 0);
    for (int i = 0; i < 6; i++) {
        answer a = hello(&c, 0, "?", "guess");
        CHECK_EQ(a.status, KVP_EAUTH);
        CHECK_EQ(a.hold_ms, 0u);
    }
    core_free(&c);
}
