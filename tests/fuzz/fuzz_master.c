/*
 * fuzz_master.c -- libFuzzer target: arbitrary byte streams served by the
 * master core, as from a hostile client on an established session.
 *
 * Each input is a stream of frames (kvp_frame_next); every complete frame
 * goes to kvp_master_handle exactly as the service would send it, with the
 * clock advancing per frame so leases, put timeouts and liveness fire. The
 * core's self-check must hold after every frame, every response must be a
 * well-formed frame, and the master is destroyed after each input (LeakSan
 * catches anything it loses).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/log.h"
#include "hello_raw.h"
#include "master/master.h"
#include "proto/proto.h"

/* kvp_master_push_freed's sink: what would go to the node is dropped. */
static kvp_buf *sink(kvp_msess *s, void *ctx)
{
    (void)s;
    kvp_buf *b = ctx;
    kvp_buf_reset(b);
    return b;
}

/* kvp_master_jobs's callback: a deferred answer lands in the frame's output */
static kvp_buf *job_out(kvp_msess *s, void *ctx)
{
    (void)s;
    return ctx;
}

static void serve(kvp_master *m, kvp_msess *s, kvp_arena *a, kvp_buf *out, uint16_t op,
                  const uint8_t *body, uint32_t len, uint64_t now)
{
    kvp_frame_hdr h = {KVP_PROTO_VERSION, 0, op, 1, len, 0};
    kvp_arena_reset(a);
    kvp_buf_reset(out);
    kvp_master_handle(m, s, &h, body, a, out, now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    cfg.max_segments = 8;
    cfg.max_connections = 8;
    cfg.max_tenants = 8;
    cfg.lease_ttl_ms = 50;
    cfg.put_timeout_ms = 100;
    cfg.client_ttl_ms = 1000;
    /* a cluster's master (the core never dials etcd) with a node token, so
     * that the session below, which presents it, may also follow the index */
    snprintf(cfg.etcd, sizeof cfg.etcd, "http://127.0.0.1:1");
    snprintf(cfg.node_token, sizeof cfg.node_token, "fuzz-node-token");
    kvp_log_set_level(KVP_LOG_OFF);
    kvp_master *m;
    uint64_t now = 1000;
    if (kvp_master_create(&cfg, now, &m) != 0)
        return 0;
    kvp_msess s;
    kvp_master_sess_open(m, &s);
    kvp_arena a;
    kvp_arena_init(&a, 16u << 20);
    kvp_buf out, b;
    kvp_buf_init(&out, 64u << 20);
    kvp_buf_init(&b, 1u << 20);
    /* an established session with one small segment that has an SSD tier:
     * DISK_REPORTs (segment 7) from the input drive spills, loads and
     * re-registration; the commands the master pushes are drained */
    kvp_auth_creds cr = hr_creds(NULL, "fuzz-node-token", NULL, NULL);
    kvp_auth_tx t;
    hr_challenge(&b, &t, &cr);
    serve(m, &s, &a, &out, KVP_OP_AUTH_CHALLENGE, b.data, (uint32_t)b.len, now);
    kvp_frame_hdr rh;
    const uint8_t *rb;
    if (kvp_frame_next(out.data, out.len, 1u << 30, &rh, &rb) != 1 || rh.status != 0 ||
        hr_answer(&t, &cr, rb, rh.body_len) != 0)
        abort();
    kvp_buf_reset(&b);
    hr_hello(&b, &t, &cr, 42, NULL);
    serve(m, &s, &a, &out, KVP_OP_HELLO, b.data, (uint32_t)b.len, now);
    kvp_buf_reset(&b);
    kvp_endpoint ep = {{(const uint8_t *)"tcp", 3}, {(const uint8_t *)"h:1", 3}};
    kvp_seg_desc sd = {7, {(const uint8_t *)"h:1", 3}, 64 * 4096, 1, &ep, 0, 1, 1ull << 30};
    kvp_msg_mount mm = {1, &sd};
    kvp_enc_mount(&b, &mm);
    serve(m, &s, &a, &out, KVP_OP_MOUNT_SEGMENT, b.data, (uint32_t)b.len, now);

    size_t pos = 0;
    while (pos < size) {
        kvp_frame_hdr h;
        const uint8_t *body;
        int rc = kvp_frame_next(data + pos, size - pos, 1u << 16, &h, &body);
        if (rc <= 0)
            break;
        pos += KVP_FRAME_HDR + h.body_len;
        now += h.req_id & 0xFF; /* the input steers the clock too */
        kvp_arena_reset(&a);
        kvp_buf_reset(&out);
        int hrc = kvp_master_handle(m, &s, &h, body, &a, &out, now);
        while (hrc == 0 && s.deferred) /* a whole-index job: its next turns */
            kvp_master_jobs(m, now, job_out, &out);
        if (hrc == 0 && !(h.flags & KVP_FLAG_ONEWAY)) {
            /* the answer, then only whole frames: a REPL_FOLLOW's answer is
             * followed by the index snapshot (REPL_DATA frames) */
            kvp_frame_hdr rh;
            const uint8_t *rb;
            if (kvp_frame_next(out.data, out.len, 1u << 30, &rh, &rb) != 1 ||
                rh.req_id != h.req_id)
                abort();
            size_t at = KVP_FRAME_HDR + rh.body_len;
            while (at < out.len) {
                if (h.op != KVP_OP_REPL_FOLLOW ||
                    kvp_frame_next(out.data + at, out.len - at, 1u << 30, &rh, &rb) != 1 ||
                    rh.op != KVP_OP_REPL_DATA)
                    abort();
                at += KVP_FRAME_HDR + rh.body_len;
            }
        }
        kvp_master_tick(m, now);
        kvp_master_push_freed(m, sink, &b);
        if (kvp_master_check(m) != 0)
            abort();
        if (s.close_after || kvp_master_sess_dead(&s))
            break;
    }
    kvp_master_sess_close(m, &s, now);
    if (kvp_master_check(m) != 0)
        abort();
    kvp_master_destroy(m);
    kvp_arena_free(&a);
    kvp_buf_free(&out);
    kvp_buf_free(&b);
    return 0;
}
