/*
 * hello_raw.h -- the HELLO handshake (proto/auth.h) spoken by hand, for
 * tests that talk raw protocol to a master or a storage node: build the
 * AUTH_CHALLENGE, take its answer, build the HELLO with the proofs; and a
 * blocking version of the whole exchange over a socket. Header-only.
 */
#ifndef KVP_TEST_HELLO_RAW_H
#define KVP_TEST_HELLO_RAW_H

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "net/rpc.h"
#include "proto/auth.h"
#include "proto/proto.h"

/* The credentials a raw client holds (NULL = none); session: 16 bytes or NULL. */
static inline kvp_auth_creds hr_creds(const char *cluster, const char *node, const char *tenant,
                                      const uint8_t *session)
{
    kvp_auth_creds c;
    memset(&c, 0, sizeof c);
    const char *t[3] = {cluster, node, tenant};
    for (int i = 0; i < 3; i++)
        if (t[i] && *t[i]) {
            c.key[i] = t[i];
            c.len[i] = strlen(t[i]);
        }
    if (session) {
        c.key[KVP_AUTH_SESSION] = session;
        c.len[KVP_AUTH_SESSION] = KVP_SESSION_LEN;
    }
    return c;
}

/* Appends the AUTH_CHALLENGE body announcing c; starts t. */
static inline void hr_challenge(kvp_buf *b, kvp_auth_tx *t, const kvp_auth_creds *c)
{
    kvp_auth_client_begin(t, c);
    kvp_msg_challenge ch = {KVP_PROTO_VERSION, {t->client_nonce, KVP_AUTH_NONCE}, t->has,
                            {t->kid, (t->has & KVP_AUTH_HAS(KVP_AUTH_TENANT)) ? KVP_AUTH_KID : 0}};
    kvp_enc_challenge(b, &ch);
}

/* Takes the challenge answer into t. 0 when the server proved all of c;
 * 1 + the credential it did not; -1 when the answer does not decode. */
static inline int hr_answer(kvp_auth_tx *t, const kvp_auth_creds *c, const uint8_t *body,
                            uint32_t len)
{
    kvp_msg_challenge_resp r;
    if (kvp_dec_challenge_resp(body, len, &r) != 0)
        return -1;
    return kvp_auth_client_verify(t, c, r.nonce.p, r.server_id, r.proof);
}

/* Appends a HELLO body proving c over t. */
static inline void hr_hello(kvp_buf *b, const kvp_auth_tx *t, const kvp_auth_creds *c,
                            uint64_t client_id, const char *name)
{
    uint8_t pr[KVP_AUTH__N][KVP_AUTH_PROOF];
    kvp_msg_hello h = {KVP_PROTO_VERSION, client_id,
                       {(const uint8_t *)name, name ? (uint32_t)strlen(name) : 0}, {{NULL, 0}}};
    kvp_auth_client_proofs(t, c, client_id, pr, h.proof);
    kvp_enc_hello(b, &h);
}

/* One blocking request / answer on fd (req_id as given). 0 and the answer
 * (status, body up to cap bytes) or -1 (transport, or a body too large). */
static inline int hr_fd_call(int fd, uint16_t op, uint64_t req_id, const void *body, uint32_t len,
                             int32_t *status, uint8_t *resp, uint32_t cap, uint32_t *rlen)
{
    uint8_t h[KVP_FRAME_HDR];
    kvp_frame_hdr fh = {KVP_PROTO_VERSION, 0, op, req_id, len, 0};
    kvp_frame_hdr_encode(h, &fh);
    if (send(fd, h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
        (len && send(fd, body, len, MSG_NOSIGNAL) != (ssize_t)len))
        return -1;
    size_t got = 0;
    while (got < sizeof h) {
        ssize_t n = recv(fd, h + got, sizeof h - got, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            return -1;
        got += n > 0 ? (size_t)n : 0;
    }
    if (kvp_frame_hdr_decode(h, cap, &fh) != 0)
        return -1;
    got = 0;
    while (got < fh.body_len) {
        ssize_t n = recv(fd, resp + got, fh.body_len - got, 0);
        if (n <= 0 && !(n < 0 && errno == EINTR))
            return -1;
        got += n > 0 ? (size_t)n : 0;
    }
    *status = fh.status;
    if (rlen)
        *rlen = fh.body_len;
    return 0;
}

/* AUTH_CHALLENGE + HELLO on fd proving c. 0 and the HELLO's status (and
 * its answer in *out when that is 0), or -1 (transport, an answer that
 * does not decode, or a server that could not prove c). */
static inline int hr_fd_hello(int fd, const kvp_auth_creds *c, uint64_t client_id,
                              const char *name, int32_t *status, kvp_msg_hello_resp *out)
{
    uint8_t body[512], resp[512];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_auth_tx t;
    hr_challenge(&b, &t, c);
    uint32_t rl = 0;
    if (hr_fd_call(fd, KVP_OP_AUTH_CHALLENGE, 1, body, (uint32_t)b.len, status, resp,
                   sizeof resp, &rl) != 0)
        return -1;
    if (*status != 0)
        return 0;
    if (hr_answer(&t, c, resp, rl) != 0)
        return -1;
    b = (kvp_buf){body, 0, sizeof body, sizeof body, 0};
    hr_hello(&b, &t, c, client_id, name);
    if (hr_fd_call(fd, KVP_OP_HELLO, 2, body, (uint32_t)b.len, status, resp, sizeof resp, &rl))
        return -1;
    if (*status == 0 && out && kvp_dec_hello_resp(resp, rl, out) != 0)
        return -1;
    return 0;
}

/*
 * AUTH_CHALLENGE + HELLO on r (opened with no_hello) proving c, as a
 * hostile client would: it goes on to HELLO whatever the server proved.
 * Returns the rpc error, or the status of the challenge when it failed,
 * else of the HELLO; *resp / *rlen: that answer's body (valid until the
 * next call on r). *proved (may be NULL): what hr_answer said.
 */
static inline int hr_rpc_hello(kvp_rpc *r, const kvp_auth_creds *c, const char *name,
                               int *proved, const uint8_t **resp, uint32_t *rlen)
{
    uint8_t body[512];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_auth_tx t;
    hr_challenge(&b, &t, c);
    int32_t st = 0;
    int rc = kvp_rpc_call(r, KVP_OP_AUTH_CHALLENGE, body, b.len, &st, resp, rlen);
    if (rc || st)
        return rc ? rc : st;
    int pv = hr_answer(&t, c, *resp, *rlen);
    if (proved)
        *proved = pv;
    b = (kvp_buf){body, 0, sizeof body, sizeof body, 0};
    hr_hello(&b, &t, c, kvp_rpc_client_id(r), name);
    rc = kvp_rpc_call(r, KVP_OP_HELLO, body, b.len, &st, resp, rlen);
    return rc ? rc : st;
}

#endif
