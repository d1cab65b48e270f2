/*
 * test_hello_auth.c -- the HELLO handshake (proto/auth.h) against parties
 * that are not what they claim: a forged master (a listener in this test
 * that answers the challenge without knowing any token) learns no secret
 * and is refused by the client; a real master that cannot prove a
 * credential the client holds is refused too; a client without the right
 * proofs is refused by the master (KVP_EAUTH), and a proof replayed on
 * another connection is worthless.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "hello_raw.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proc.h"
#include "proto/proto.h"

#define CLUSTER "cluster-token-never-on-the-wire"
#define NODE "node-token-never-on-the-wire"
#define TENANT "tenant-token-never-on-the-wire"

/* ------------------------------------------------------- a forged master */

typedef struct fake {
    int lfd;
    uint16_t port;
    int junk_proofs;     /* answer the challenge with made-up proofs (else none) */
    uint8_t got[65536];  /* every byte the client sent */
    size_t ngot;
    int ops[16], nops;   /* the opcodes of its frames */
    pthread_t th;
} fake;

static void fake_answer(int fd, const kvp_frame_hdr *h, int junk)
{
    kvp_buf b;
    kvp_buf_init(&b, 1024);
    size_t off = kvp_frame_begin(&b, h->op, KVP_FLAG_RESPONSE, h->req_id, 0);
    if (h->op == KVP_OP_AUTH_CHALLENGE) {
        uint8_t nonce[KVP_AUTH_NONCE], proof[KVP_AUTH_PROOF];
        memset(nonce, 0x4e, sizeof nonce);
        memset(proof, 0x50, sizeof proof);
        kvp_bytes p = junk ? (kvp_bytes){proof, sizeof proof} : (kvp_bytes){NULL, 0};
        kvp_msg_challenge_resp r = {{nonce, sizeof nonce}, 0xF0F0, {p, p, p}};
        kvp_enc_challenge_resp(&b, &r);
    } else {
        kvp_msg_hello_resp r = {KVP_PROTO_VERSION, 0xF0F0, 1u << 20, 5000, 10000, 1, {0}, "fake"};
        kvp_enc_hello_resp(&b, &r);
    }
    kvp_frame_end(&b, off);
    (void)!send(fd, b.data, b.len, MSG_NOSIGNAL);
    kvp_buf_free(&b);
}

/* Accepts one connection, records what comes and answers every frame as a
 * master would that knows nothing, until the client closes. */
static void *fake_main(void *arg)
{
    fake *f = arg;
    struct pollfd p = {f->lfd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1)
        return NULL;
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0)
        return NULL;
    size_t used = 0;
    for (;;) {
        struct pollfd q = {fd, POLLIN, 0};
        if (poll(&q, 1, 10000) != 1)
            break;
        ssize_t n = recv(fd, f->got + f->ngot, sizeof f->got - f->ngot, 0);
        if (n <= 0)
            break;
        f->ngot += (size_t)n;
        kvp_frame_hdr h;
        const uint8_t *body;
        while (kvp_frame_next(f->got + used, f->ngot - used, 1u << 20, &h, &body) == 1) {
            if (f->nops < 16)
                f->ops[f->nops++] = h.op;
            fake_answer(fd, &h, f->junk_proofs);
            used += KVP_FRAME_HDR + h.body_len;
        }
    }
    close(fd);
    return NULL;
}

static int fake_start(fake *f, int junk)
{
    memset(f, 0, sizeof *f);
    f->junk_proofs = junk;
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t sl = sizeof sa;
    REQUIRE(f->lfd >= 0 && bind(f->lfd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            listen(f->lfd, 4) == 0 && getsockname(f->lfd, (struct sockaddr *)&sa, &sl) == 0);
    f->port = ntohs(sa.sin_port);
    REQUIRE(pthread_create(&f->th, NULL, fake_main, f) == 0);
    return 0;
}

static void fake_stop(fake *f)
{
    pthread_join(f->th, NULL);
    close(f->lfd);
}

static int contains(const uint8_t *p, size_t n, const char *s)
{
    return memmem(p, n, s, strlen(s)) != NULL;
}

/* The client (every credential, and a session secret to rejoin with)
 * meets a master that knows no token: it stops after the challenge, saying
 * which credential was not proved; the fake got no token, no session
 * secret and no HELLO (so no client proof either). */
static void forged(int junk)
{
    fake f;
    if (fake_start(&f, junk))
        return;
    char addr[64], err[512] = "";
    snprintf(addr, sizeof addr, "127.0.0.1:%u", f.port);
    uint8_t session[KVP_SESSION_LEN];
    memset(session, 0x5e, sizeof session);
    kvp_rpc_opts o = {.token = CLUSTER, .node_token = NODE, .tenant_token = TENANT,
                      .session = session, .client_id = 77, .name = "victim", .timeout_ms = 5000};
    kvp_rpc *r = NULL;
    int rc = kvp_rpc_open(addr, &o, &r, err, sizeof err);
    if (r)
        kvp_rpc_close(r);
    fake_stop(&f);
    CHECK_EQ(rc, KVP_EAUTH);
    CHECK(strstr(err, "did not prove it holds our cluster token") != NULL);
    CHECK(strstr(err, "nothing secret was sent") != NULL);
    CHECK(f.ngot > 0);
    CHECK(!contains(f.got, f.ngot, CLUSTER));
    CHECK(!contains(f.got, f.ngot, NODE));
    CHECK(!contains(f.got, f.ngot, TENANT));
    CHECK(memmem(f.got, f.ngot, session, sizeof session) == NULL);
    CHECK(f.nops >= 1);
    for (int i = 0; i < f.nops; i++)
        CHECK(f.ops[i] != KVP_OP_HELLO);
    printf("  forged master (%s proofs): %zu bytes received, %d frames, client: %s\n",
           junk ? "made-up" : "no", f.ngot, f.nops, err);
}

TEST(forged_master_without_proofs_learns_nothing)
{
    forged(0);
}

TEST(forged_master_with_made_up_proofs_learns_nothing)
{
    forged(1);
}

/* -------------------------------------------------------- real masters */

/* A real master without the cluster token (or the node credential) is
 * refused by a client that holds one, before any proof of ours goes. */
TEST(master_without_the_clients_token_is_refused)
{
    unsetenv("KVPOOL_CLUSTER_TOKEN");
    unsetenv("KVPOOL_NODE_TOKEN");
    tp_master m;
    CHECK_EQ(tp_master_start(&m, NULL), 0);
    if (!m.pid)
        return;
    char err[512] = "";
    kvp_rpc *r = NULL;
    kvp_rpc_opts o = {.token = CLUSTER, .name = "c", .timeout_ms = 5000};
    CHECK_EQ(kvp_rpc_open(m.addr, &o, &r, err, sizeof err), KVP_EAUTH);
    CHECK(strstr(err, "cluster token") != NULL);
    kvp_rpc_close(r);
    r = NULL;
    kvp_rpc_opts n = {.node_token = NODE, .name = "n", .timeout_ms = 5000};
    CHECK_EQ(kvp_rpc_open(m.addr, &n, &r, err, sizeof err), KVP_EAUTH);
    CHECK(strstr(err, "node credential") != NULL);
    kvp_rpc_close(r);
    /* holding nothing, a client is let in (the master asks for nothing) */
    r = NULL;
    kvp_rpc_opts none = {.name = "plain", .timeout_ms = 5000};
    CHECK_EQ(kvp_rpc_open(m.addr, &none, &r, err, sizeof err), 0);
    kvp_rpc_close(r);
    CHECK_EQ(tp_master_stop(&m), 0);
}

/* Against a master with the token: the right client gets in; wrong proofs
 * are refused with KVP_EAUTH; a HELLO captured on one connection (proofs
 * and all) is refused when replayed on another. */
TEST(master_refuses_wrong_and_replayed_proofs)
{
    setenv("KVPOOL_CLUSTER_TOKEN", CLUSTER, 1);
    tp_master m;
    int started = tp_master_start(&m, NULL);
    unsetenv("KVPOOL_CLUSTER_TOKEN");
    CHECK_EQ(started, 0);
    if (started)
        return;
    char err[512] = "";
    kvp_rpc *r = NULL;
    kvp_rpc_opts o = {.token = CLUSTER, .name = "right", .timeout_ms = 5000};
    CHECK_EQ(kvp_rpc_open(m.addr, &o, &r, err, sizeof err), 0);
    kvp_rpc_close(r);
    /* a hostile client goes on to HELLO with proofs of a guessed token */
    kvp_rpc_opts raw = {.name = "raw", .client_id = 0x1234, .timeout_ms = 5000, .no_hello = 1};
    r = NULL;
    CHECK_EQ(kvp_rpc_open(m.addr, &raw, &r, err, sizeof err), 0);
    kvp_auth_creds guess = hr_creds("guessed", NULL, NULL, NULL);
    const uint8_t *resp;
    uint32_t rl;
    int proved = -1;
    CHECK_EQ(hr_rpc_hello(r, &guess, "raw", &proved, &resp, &rl), KVP_EAUTH);
    CHECK_EQ(proved, 1 + KVP_AUTH_CLUSTER);
    kvp_rpc_close(r);
    /* a right HELLO recorded on connection A, replayed on connection B */
    kvp_rpc *a = NULL, *b = NULL;
    CHECK_EQ(kvp_rpc_open(m.addr, &raw, &a, err, sizeof err), 0);
    kvp_auth_creds good = hr_creds(CLUSTER, NULL, NULL, NULL);
    uint8_t body[512];
    kvp_buf bb = {body, 0, sizeof body, sizeof body, 0};
    kvp_auth_tx t;
    hr_challenge(&bb, &t, &good);
    int32_t st = -1;
    CHECK_EQ(kvp_rpc_call(a, KVP_OP_AUTH_CHALLENGE, body, bb.len, &st, &resp, &rl), 0);
    CHECK_EQ(st, 0);
    CHECK_EQ(hr_answer(&t, &good, resp, rl), 0);
    uint8_t hello[512];
    kvp_buf hb = {hello, 0, sizeof hello, sizeof hello, 0};
    hr_hello(&hb, &t, &good, 0x1234, "raw");
    /* B: its own challenge (the master's fresh nonce), then A's HELLO */
    CHECK_EQ(kvp_rpc_open(m.addr, &raw, &b, err, sizeof err), 0);
    kvp_auth_tx tb;
    bb = (kvp_buf){body, 0, sizeof body, sizeof body, 0};
    hr_challenge(&bb, &tb, &good);
    memcpy(body + 8, t.client_nonce, KVP_AUTH_NONCE); /* even A's client nonce */
    CHECK_EQ(kvp_rpc_call(b, KVP_OP_AUTH_CHALLENGE, body, bb.len, &st, &resp, &rl), 0);
    CHECK_EQ(st, 0);
    CHECK_EQ(kvp_rpc_call(b, KVP_OP_HELLO, hello, hb.len, &st, &resp, &rl), 0);
    CHECK_EQ(st, KVP_EAUTH);
    kvp_rpc_close(b);
    /* on A, where it was made, it is good */
    CHECK_EQ(kvp_rpc_call(a, KVP_OP_HELLO, hello, hb.len, &st, &resp, &rl), 0);
    CHECK_EQ(st, 0);
    kvp_rpc_close(a);
    CHECK_EQ(tp_master_stop(&m), 0);
}
