/* rpc.c -- blocking pipelined client connection; see rpc.h. */
#include "net/rpc.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/sys.h"
#include "ha/leader.h"
#include "kvpool.h"
#include "net/net.h"

struct kvp_rpc {
    int fd;
    int timeout_ms;
    uint32_t max_frame;
    uint64_t next_id;
    uint64_t client_id;
    uint64_t pushed;       /* unasked frames handed to on_push so far */
    kvp_buf out;
    kvp_buf in;
    size_t in_consumed; /* bytes of `in` handed out by the last recv */
    kvp_msg_hello_resp hello;
    void (*on_push)(void *ctx, const kvp_frame_hdr *h, const uint8_t *body);
    void *push_ctx;
};

/* kvp_net_wait with this module's error vocabulary. */
static int wait_fd(int fd, short ev, uint64_t deadline_ms)
{
    int rc = kvp_net_wait(fd, ev, deadline_ms);
    return rc == KVP_EIO ? KVP_ERPC_FAIL : rc;
}

uint64_t kvp_rpc_queue(kvp_rpc *r, uint16_t op, uint8_t flags, const void *body, size_t len)
{
    uint64_t id = ++r->next_id;
    size_t off = kvp_frame_begin(&r->out, op, flags, id, 0);
    kvp_buf_put(&r->out, body, len);
    kvp_frame_end(&r->out, off);
    return id;
}

void kvp_rpc_queue_raw(kvp_rpc *r, const void *p, size_t len) { kvp_buf_put(&r->out, p, len); }

int kvp_rpc_flush(kvp_rpc *r)
{
    if (r->out.err) {
        int e = r->out.err;
        kvp_buf_reset(&r->out);
        return e;
    }
    uint64_t deadline = kvp_now_ms() + (uint64_t)r->timeout_ms;
    size_t off = 0;
    while (off < r->out.len) {
        ssize_t n = kvp_sys.send(r->fd, r->out.data + off, r->out.len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(r->fd, POLLOUT, deadline);
            if (rc) {
                kvp_buf_reset(&r->out);
                return rc;
            }
            continue;
        }
        kvp_buf_reset(&r->out);
        return KVP_ERPC_FAIL;
    }
    kvp_buf_reset(&r->out);
    return 0;
}

/* Hands every complete pushed frame (ONEWAY, not RESPONSE) at the front of
 * `in` to on_push and consumes it. 1 when a response is at the front, 0
 * when no complete frame is, KVP_ERPC_FAIL for a bad or unexpected frame. */
static int take_pushes(kvp_rpc *r, kvp_frame_hdr *h, const uint8_t **body)
{
    kvp_buf_consume(&r->in, r->in_consumed);
    r->in_consumed = 0;
    for (;;) {
        int rc = kvp_frame_next(r->in.data, r->in.len, r->max_frame, h, body);
        if (rc < 0)
            return KVP_ERPC_FAIL;
        if (rc == 0)
            return 0;
        if (h->flags & KVP_FLAG_RESPONSE)
            return 1;
        if (!(h->flags & KVP_FLAG_ONEWAY))
            return KVP_ERPC_FAIL; /* servers do not ask clients questions */
        if (r->on_push)
            r->on_push(r->push_ctx, h, *body);
        r->pushed++;
        kvp_buf_consume(&r->in, KVP_FRAME_HDR + (size_t)h->body_len);
    }
}

/* One non-blocking read into `in`: bytes read, 0 nothing there (EAGAIN),
 * KVP_ERPC_FAIL closed or broken. */
static ssize_t fill(kvp_rpc *r)
{
    for (;;) {
        if (kvp_buf_reserve(&r->in, 65536) != 0)
            return KVP_ERPC_FAIL;
        ssize_t n = kvp_sys.recv(r->fd, r->in.data + r->in.len, r->in.alloc - r->in.len, MSG_DONTWAIT);
        if (n > 0) {
            r->in.len += (size_t)n;
            return n;
        }
        if (n == 0)
            return KVP_ERPC_FAIL;
        if (errno == EINTR)
            continue;
        return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : KVP_ERPC_FAIL;
    }
}

int kvp_rpc_recv(kvp_rpc *r, kvp_frame_hdr *h, const uint8_t **body)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)r->timeout_ms;
    for (;;) {
        int rc = take_pushes(r, h, body);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            r->in_consumed = KVP_FRAME_HDR + (size_t)h->body_len;
            return 0;
        }
        ssize_t n = fill(r);
        if (n < 0)
            return (int)n;
        if (n == 0 && (rc = wait_fd(r->fd, POLLIN, deadline)) != 0)
            return rc;
    }
}

int kvp_rpc_poll(kvp_rpc *r, int timeout_ms)
{
    uint64_t deadline = kvp_now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
    uint64_t before = r->pushed;
    for (;;) {
        kvp_frame_hdr h;
        const uint8_t *b;
        int rc = take_pushes(r, &h, &b);
        if (rc < 0)
            return rc;
        if (rc == 1)
            return KVP_ERPC_FAIL; /* an answer nobody asked for */
        if (r->pushed != before)
            return 0; /* what came was handled: the caller may answer it */
        int64_t left = (int64_t)(deadline - kvp_now_ms());
        if (left <= 0)
            return 0;
        struct pollfd p = {r->fd, POLLIN, 0};
        int n = kvp_sys.poll(&p, 1, (int)left);
        if (n < 0 && errno != EINTR)
            return KVP_ERPC_FAIL;
        if (n > 0 && fill(r) < 0)
            return KVP_ERPC_FAIL;
    }
}

int kvp_rpc_call(kvp_rpc *r, uint16_t op, const void *body, size_t len, int32_t *status,
                 const uint8_t **resp, uint32_t *resp_len)
{
    uint64_t id = kvp_rpc_queue(r, op, 0, body, len);
    int rc = kvp_rpc_flush(r);
    if (rc)
        return rc;
    for (;;) {
        kvp_frame_hdr h;
        const uint8_t *b;
        rc = kvp_rpc_recv(r, &h, &b);
        if (rc)
            return rc;
        if (h.req_id != id)
            continue; /* an answer to an earlier pipelined request */
        *status = h.status;
        if (resp)
            *resp = b;
        if (resp_len)
            *resp_len = h.body_len;
        return 0;
    }
}

/* The credentials the options hold (the session only when not all zero). */
static void opts_creds(const kvp_rpc_opts *o, kvp_auth_creds *c)
{
    static const uint8_t zero[KVP_SESSION_LEN];
    memset(c, 0, sizeof *c);
    const char *t[3] = {o->token, o->node_token, o->tenant_token};
    for (int i = 0; i < 3; i++)
        if (t[i] && *t[i]) {
            c->key[i] = t[i];
            c->len[i] = strlen(t[i]);
        }
    if (o->session && memcmp(o->session, zero, KVP_SESSION_LEN) != 0) {
        c->key[KVP_AUTH_SESSION] = o->session;
        c->len[KVP_AUTH_SESSION] = KVP_SESSION_LEN;
    }
}

/*
 * AUTH_CHALLENGE on r's fresh connection (proto/auth.h): the server must
 * prove every credential cr holds before any proof of ours is sent (a
 * forged master learns our nonce and the tenant key id, nothing else). 0
 * or the error, with a message in err.
 */
static int challenge(kvp_rpc *r, const char *addr, const kvp_auth_creds *cr, kvp_auth_tx *t,
                     char *err, size_t errlen)
{
    uint8_t body[128];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    if (kvp_auth_client_begin(t, cr) != 0) {
        snprintf(err, errlen, "HELLO to %s: no randomness for the challenge", addr);
        return KVP_EINTERNAL_ERROR;
    }
    kvp_msg_challenge ch = {KVP_PROTO_VERSION, {t->client_nonce, KVP_AUTH_NONCE}, t->has,
                            {t->kid, (t->has & KVP_AUTH_HAS(KVP_AUTH_TENANT)) ? KVP_AUTH_KID : 0}};
    kvp_enc_challenge(&b, &ch);
    int32_t st = 0;
    const uint8_t *resp;
    uint32_t rl;
    int rc = b.err ? b.err : kvp_rpc_call(r, KVP_OP_AUTH_CHALLENGE, b.data, b.len, &st, &resp, &rl);
    if (rc == 0)
        rc = st;
    kvp_msg_challenge_resp cr_resp;
    if (rc == 0 && kvp_dec_challenge_resp(resp, rl, &cr_resp) != 0)
        rc = KVP_EPROTOCOL;
    if (rc == KVP_EAGAIN) {
        snprintf(err, errlen, "%s is a standby master of a cluster, not its leader (name the "
                 "master etcd://ETCD/CLUSTER to follow the leader)", addr);
        return rc;
    }
    if (rc) {
        snprintf(err, errlen, "HELLO to %s failed: challenge: %s", addr, kvp_strerror(rc));
        return rc;
    }
    int bad = kvp_auth_client_verify(t, cr, cr_resp.nonce.p, cr_resp.server_id, cr_resp.proof);
    if (bad) {
        snprintf(err, errlen, "HELLO to %s refused by this client: the server did not prove it "
                 "holds our %s (ours is wrong, or it is not a genuine server of this cluster); "
                 "nothing secret was sent", addr, kvp_auth_cred_name(bad - 1));
        return KVP_EAUTH;
    }
    return 0;
}

/* AUTH_CHALLENGE and HELLO on r's fresh connection, within r->timeout_ms.
 * The answer's master id must be the one that answered the challenge
 * (open_at then checks it against etcd's record). 0 or the error (a status of the
 * server, or the transport's), with a message in err. */
static int say_hello(kvp_rpc *r, const char *addr, const kvp_rpc_opts *o, char *err,
                     size_t errlen)
{
    kvp_auth_creds cr;
    kvp_auth_tx t;
    opts_creds(o, &cr);
    int rc = challenge(r, addr, &cr, &t, err, errlen);
    if (rc)
        return rc;
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    uint8_t pr[KVP_AUTH__N][KVP_AUTH_PROOF];
    kvp_msg_hello h = {KVP_PROTO_VERSION, r->client_id, {NULL, 0}, {{NULL, 0}}};
    kvp_auth_client_proofs(&t, &cr, r->client_id, pr, h.proof);
    if (o->name) {
        h.name.p = (const uint8_t *)o->name;
        h.name.len = (uint32_t)strlen(o->name);
    }
    kvp_enc_hello(&b, &h);
    int32_t st = 0;
    const uint8_t *resp;
    uint32_t rl;
    rc = b.err ? b.err : kvp_rpc_call(r, KVP_OP_HELLO, b.data, b.len, &st, &resp, &rl);
    kvp_buf_free(&b);
    kvp_msg_hello_backoff bo;
    if (rc == 0 && st == KVP_EAUTH_BACKOFF && kvp_dec_hello_backoff(resp, rl, &bo) == 0) {
        snprintf(err, errlen, "HELLO to %s failed: wrong credential, and too many failed attempts "
                 "from %.*s; retry in %u ms", addr, (int)bo.addr.len, (const char *)bo.addr.p,
                 bo.retry_ms);
        return KVP_EAUTH_BACKOFF;
    }
    if (rc == 0 && st != 0)
        rc = st;
    if (rc == 0)
        rc = kvp_dec_hello_resp(resp, rl, &r->hello);
    if (rc == 0 && r->hello.master_id != t.server_id)
        rc = KVP_EPROTOCOL; /* not the server that answered the challenge */
    if (rc == 0 && o->session)
        memcpy(o->session, r->hello.session, KVP_SESSION_LEN);
    if (rc == KVP_EAUTH && !cr.len[KVP_AUTH_CLUSTER])
        snprintf(err, errlen, "HELLO to %s failed: %s: the master requires a cluster token and "
                 "none was given (set cluster_token_file, or $KVPOOL_CLUSTER_TOKEN)", addr,
                 kvp_strerror(rc));
    else if (rc == KVP_EAGAIN) /* (a standby's only answer) */
        snprintf(err, errlen, "%s is a standby master of a cluster, not its leader (name the "
                 "master etcd://ETCD/CLUSTER to follow the leader)", addr);
    else if (rc)
        snprintf(err, errlen, "HELLO to %s failed: %s", addr, kvp_strerror(rc));
    return rc;
}

/* Waits before the next HELLO attempt: `step` ms (doubled by the caller,
 * 10 ms .. 500 ms) with jitter (half to all of it), never past deadline. */
static void retry_pause(uint32_t step, uint64_t deadline)
{
    uint32_t j = 0;
    if (getrandom(&j, sizeof j, GRND_NONBLOCK) != sizeof j)
        j = (uint32_t)kvp_now_ns();
    uint64_t ms = step / 2 + j % (step / 2 + 1);
    uint64_t now = kvp_now_ms();
    if (now + ms > deadline)
        ms = deadline > now ? deadline - now : 0;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/*
 * Connects and says HELLO, within timeout_ms in all. A connection that
 * breaks before the HELLO is answered (a server over its limits closes or
 * evicts connections that have not said HELLO) is tried again, with a new
 * random client id unless the caller chose one, after a pause that doubles
 * (with jitter) until the deadline. A connect that fails (nothing listens,
 * or it timed out) and a definite answer (a wrong credential, with or
 * without back-off; another version) are not retried.
 */
#define STANDBY_RETRY_MS 100 /* a standby answered: etcd is asked again after this */

static int open_at(const char *addr, const kvp_leader_info *lead, const kvp_rpc_opts *o,
                   int timeout_ms, kvp_rpc **out, char *err, size_t errlen);

int kvp_rpc_open(const char *addr, const kvp_rpc_opts *o, kvp_rpc **out, char *err, size_t errlen)
{
    kvp_rpc_opts def = {0};
    if (!o)
        o = &def;
    if (!kvp_etcd_is_url(addr))
        return open_at(addr, NULL, o, o->timeout_ms, out, err, errlen);
    /* a cluster's master: the leader etcd names now (each open looks again,
     * so a reconnect follows a failover); a standby that answers (its
     * record was stale: the term moved on) sends us to look again */
    const int timeout = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    const uint64_t deadline = kvp_now_ms() + (uint64_t)timeout;
    for (;;) {
        char dial[KVP_LEADER_ADDR_MAX + 1];
        kvp_leader_info lead = {0};
        int rc = kvp_leader_resolve(addr, dial, sizeof dial, &lead, err, errlen);
        if (rc)
            return rc == KVP_ERPC_TIMEOUT ? rc : KVP_ERPC_FAIL;
        uint64_t now = kvp_now_ms();
        int left = now < deadline ? (int)(deadline - now) : 1;
        rc = open_at(dial, &lead, o, left, out, err, errlen);
        if (rc != KVP_EAGAIN || kvp_now_ms() + STANDBY_RETRY_MS >= deadline)
            return rc == KVP_EAGAIN ? KVP_ERPC_FAIL : rc;
        usleep(STANDBY_RETRY_MS * 1000);
    }
}

/* Connects to addr and says HELLO within timeout_ms; lead: the record that
 * named addr (its master id is checked), or NULL. */
static int open_at(const char *addr, const kvp_leader_info *lead_in, const kvp_rpc_opts *o,
                   int timeout_ms, kvp_rpc **out, char *err, size_t errlen)
{
    kvp_leader_info lead = {0};
    if (lead_in)
        lead = *lead_in;
    kvp_rpc *r = kvp_calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    r->timeout_ms = timeout_ms > 0 ? timeout_ms : 10000;
    r->max_frame = o->max_frame ? o->max_frame : 64u << 20;
    r->client_id = o->client_id;
    r->on_push = o->on_push;
    r->push_ctx = o->push_ctx;
    r->fd = -1;
    kvp_buf_init(&r->out, (size_t)r->max_frame * 4 + 4096);
    kvp_buf_init(&r->in, (size_t)r->max_frame + KVP_FRAME_HDR + 65536);
    const int timeout = r->timeout_ms;
    const uint64_t deadline = kvp_now_ms() + (uint64_t)timeout;
    uint32_t step = 10;
    for (;;) {
        if (!o->client_id)
            r->client_id = 0;
        while (r->client_id == 0)
            if (getrandom(&r->client_id, sizeof r->client_id, 0) != sizeof r->client_id)
                r->client_id = kvp_now_ns();
        uint64_t now = kvp_now_ms();
        int left = now < deadline ? (int)(deadline - now) : 1;
        r->fd = kvp_net_connect(addr, left, err, errlen);
        if (r->fd < 0) {
            int rc = r->fd;
            r->fd = -1;
            kvp_rpc_close(r);
            return rc;
        }
        if (o->no_hello)
            break;
        r->timeout_ms = left;
        int rc = say_hello(r, addr, o, err, errlen);
        r->timeout_ms = timeout;
        if (rc == 0)
            break;
        if (rc != KVP_ERPC_FAIL || kvp_now_ms() + step / 2 >= deadline) {
            kvp_rpc_close(r);
            return rc;
        }
        /* closed before the answer: a fresh connection, after a pause */
        close(r->fd);
        r->fd = -1;
        kvp_buf_reset(&r->in);
        kvp_buf_reset(&r->out);
        r->in_consumed = 0;
        retry_pause(step, deadline);
        step = step >= 250 ? 500 : step * 2;
    }
    /* the term's holder is the master etcd names: one that answers with
     * another id is not the leader (deposed, or its address reused) */
    if (lead.id && !o->no_hello && r->hello.master_id != lead.id) {
        snprintf(err, errlen, "%s is not the cluster's leader (etcd names master %016llx, epoch "
                              "%llu; it answered as %016llx)",
                 addr, (unsigned long long)lead.id, (unsigned long long)lead.epoch,
                 (unsigned long long)r->hello.master_id);
        kvp_rpc_close(r);
        return KVP_ERPC_FAIL;
    }
    r->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000; /* each call's from now on */
    *out = r;
    return 0;
}

void kvp_rpc_close(kvp_rpc *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    kvp_buf_free(&r->out);
    kvp_buf_free(&r->in);
    kvp_free(r);
}

int kvp_rpc_fd(const kvp_rpc *r) { return r->fd; }
uint64_t kvp_rpc_client_id(const kvp_rpc *r) { return r->client_id; }
const kvp_msg_hello_resp *kvp_rpc_hello_resp(const kvp_rpc *r) { return &r->hello; }
