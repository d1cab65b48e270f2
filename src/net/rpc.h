/*
 * rpc.h -- a blocking connection to a kvpool server (master today), with
 * pipelining: queue many requests, flush once, then receive the answers.
 *
 * Every wait is bounded by a deadline: a server that does not answer gives
 * KVP_ERPC_TIMEOUT, a broken connection KVP_ERPC_FAIL; never a hang.
 * One kvp_rpc is used by one thread at a time.
 */
#ifndef KVP_RPC_H
#define KVP_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

typedef struct kvp_rpc kvp_rpc;

typedef struct kvp_rpc_opts {
    const char *token;     /* cluster token, NULL = none */
    const char *name;      /* client name for the server's logs */
    uint64_t client_id;    /* 0 = random */
    uint32_t max_frame;    /* largest response accepted (0 = 64 MiB) */
    int timeout_ms;        /* connect and per-call deadline (0 = 10 s) */
    int no_hello;          /* connect only (tests of the HELLO exchange) */
    const char *node_token;   /* node credential, NULL = none (may mount) */
    const char *tenant_token; /* tenant credential, NULL = none */
    uint8_t *session;      /* KVP_SESSION_LEN bytes, NULL = none: when not all zero,
                              presented to join client_id's session; the master's
                              answer is copied back */
    /* Frames the server sends unasked (ONEWAY, not RESPONSE: SEG_FREED to a
     * node) go here while kvp_rpc_recv / kvp_rpc_call / kvp_rpc_poll read;
     * NULL = dropped. Any other frame that is not an answer breaks the
     * connection (KVP_ERPC_FAIL). */
    void (*on_push)(void *ctx, const kvp_frame_hdr *h, const uint8_t *body);
    void *push_ctx;
} kvp_rpc_opts;

/* Connects and says HELLO, within timeout_ms in all; a connection closed
 * before the HELLO is answered (a server shedding connections that have not
 * said HELLO) is retried with back-off and jitter until then (rpc.c). 0 or
 * KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT / KVP_EAUTH / KVP_EAUTH_BACKOFF (wrong,
 * and the address failed too often: the message says how long its back-off
 * lasts) / KVP_EINVALID_VERSION, with a message in err. */
int kvp_rpc_open(const char *addr, const kvp_rpc_opts *o, kvp_rpc **out, char *err, size_t errlen);
void kvp_rpc_close(kvp_rpc *r);
int kvp_rpc_fd(const kvp_rpc *r);
uint64_t kvp_rpc_client_id(const kvp_rpc *r);
/* The server's HELLO answer. */
const kvp_msg_hello_resp *kvp_rpc_hello_resp(const kvp_rpc *r);

/* Queues a request frame; returns its request id (never 0). */
uint64_t kvp_rpc_queue(kvp_rpc *r, uint16_t op, uint8_t flags, const void *body, size_t len);
/* Queues raw bytes (tests of malformed frames). */
void kvp_rpc_queue_raw(kvp_rpc *r, const void *p, size_t len);
/* Sends everything queued. 0 or KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT. */
int kvp_rpc_flush(kvp_rpc *r);
/* Next response frame; *body valid until the next recv/call. */
int kvp_rpc_recv(kvp_rpc *r, kvp_frame_hdr *h, const uint8_t **body);
/* Waits up to timeout_ms for unasked frames and hands each to on_push;
 * returns as soon as some were handled (all that had arrived by then).
 * 0 (frames handled, or the timeout) or KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT
 * (a frame started but did not finish in time). */
int kvp_rpc_poll(kvp_rpc *r, int timeout_ms);
/* queue + flush + recv of the matching answer. *status = frame status. */
int kvp_rpc_call(kvp_rpc *r, uint16_t op, const void *body, size_t len, int32_t *status,
                 const uint8_t **resp, uint32_t *resp_len);
#endif
