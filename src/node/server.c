/*
 * server.c -- the segment server; see server.h.
 *
 * Threads: the acceptor accepts on the TCP and unix listeners and hands each
 * new connection to a worker (round-robin) through the worker's mutex-guarded
 * `incoming` list plus its eventfd. From then on only that worker touches
 * the connection. kvp_segserver_stop sets `stop`, signals the shared stop
 * eventfd (level-triggered: every thread sees it), joins, then frees.
 *
 * Per-connection input state machine (memcached style):
 *
 *   ST_HDR      reading the 24-byte frame header into c->hdr
 *   ST_SEGIO    SEG_WRITE / SEG_READ: reading the 56-byte kvp_seg_io
 *   ST_SMALL    AUTH_CHALLENGE / HELLO / SHM_ATTACH / UCX_ATTACH: reading a small
 *               body (<= SMALL_MAX)
 *   ST_WBODY    SEG_WRITE accepted: value bytes go straight from the socket
 *               into segment memory [wpos, wpos + left)
 *   ST_SKIP     discarding `left` bytes (refused SEG_WRITE, unknown op)
 *   ST_CLOSING  no more input; closed once queued answers are sent
 *
 * Invariants: ST_WBODY's range lies inside the segment (checked in
 * seg_check before entering); output items referencing segment memory
 * (SEG_READ answers) were bounds-checked the same way. Answers are queued
 * in a bounded ring (OUTQ); input is not read while the ring is full, so a
 * client that never reads cannot make the server buffer without bound.
 * Work per event is bounded (READ_BUDGET bytes, FRAME_BUDGET frames); the
 * epoll sets are level-triggered, so leftover input is seen next turn.
 *
 * Limits (server.h): the acceptor counts open connections (`nconns`,
 * atomic) and closes new ones beyond max_conns at once. Each worker keeps
 * its connections on two lists in arrival order, `pre` (no HELLO yet) and
 * `auth`; a connection moves once its HELLO is accepted. Beyond the worker's
 * share of max_pre_hello the head of `pre` (the oldest) is closed. Every
 * TICK_MS a worker closes the connections past their deadline: `pre` from
 * its head while they are too old (arrival order = deadline order), `auth`
 * by a scan (at most max_conns entries, 5 times a second). A connection's
 * last_ms is the last time a byte moved either way. A busy connection (a
 * frame in flight or answers unread) must also move min_rate bytes a second
 * over every rate window (win_ms, win_moved), or it is closed.
 *
 * Transfers in flight. A SEG_READ answer (an oitem with data) and a
 * SEG_WRITE body (ST_WBODY) are transfers: each remembers the descriptor's
 * range, generation and deadline (grants.h). Invariant: no byte moves
 * between the socket and the segment for a transfer past its deadline
 * (out_flush and the ST_WBODY read test it first: the connection is cut),
 * nor after a revocation barrier (kvp_segserver_revoke) that saw its grant
 * dead. The barrier: the caller raised the floors, then bumps `rev`
 * (release) and wakes every worker; a worker that sees a new `rev`
 * (acquire) re-tests every transfer of its connections against the floors
 * (kvp_grants_live) -- or, for a barrier asking for all, takes every
 * transfer as dead -- cuts the connections of dead ones (a cut SEG_WRITE is
 * never answered), then publishes `seen`. Every check that passed before
 * the floors rose queued its transfer before that worker's scan (same
 * thread), and every check after it sees the raised floors; so once every
 * worker's `seen` reached the barrier's number, no transfer on a revoked
 * grant moves another byte.
 */
#include "node/server.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/secret.h"
#include "common/sys.h"
#include "common/mem.h"
#include "kvpool.h"
#include "net/net.h"
#include "node/grants.h"
#include "node/server_internal.h"
#include "node/unixsock.h"
#include "proto/proto.h"

#define MOD "segserver"
#define OUTQ 64                  /* queued answers per connection */
#define SMALL_MAX 4096           /* largest HELLO / SHM_ATTACH body */
#define SMALL_RESP 96            /* largest small answer body (HELLO: 83, AUTH_CHALLENGE: 88) */
#define READ_BUDGET (8u << 20)   /* bytes read per connection per event */
#define FRAME_BUDGET 256         /* frames per connection per event */
#define SCRATCH 65536            /* per-worker discard buffer */
#define MAX_IOV 64
#define TICK_MS 200              /* deadline checks per worker */
#define MAX_CONNS 4096
#define HELLO_MS 5000
#define IDLE_MS 300000
#define STALL_MS 30000
#define BACKOFF_MIN_MS 100       /* listener pause when out of descriptors */
#define BACKOFF_MAX_MS 1000
#define MIN_RATE (64u << 10)     /* bytes a second a busy connection must move */
#define RATE_WINDOW_MS 10000     /* ... measured over this */

enum cstate { ST_HDR, ST_SEGIO, ST_SMALL, ST_WBODY, ST_SKIP, ST_CLOSING };

typedef struct oitem {
    uint8_t head[KVP_FRAME_HDR + SMALL_RESP]; /* header + small body */
    uint32_t hlen;
    const uint8_t *data; /* segment bytes (SEG_READ) or NULL */
    uint64_t dlen;
    uint64_t sent;       /* bytes of head+data already sent */
    int pass_fd;         /* fd to attach to the first byte, -1 = none */
    uint64_t gen;        /* data: the READ descriptor's generation */
    uint64_t deadline;   /* data: local ms after which no byte may go */
    int fixed;           /* data is not segment bytes but a body that lives as
                            long as the server (UCX_ATTACH): no transfer */
} oitem;

typedef struct conn {
    int fd;
    int is_unix;
    int hello_ok;
    int challenged;       /* AUTH_CHALLENGE answered: `auth` holds its transcript;
                             the next HELLO consumes it */
    kvp_auth_tx auth;
    enum cstate st;
    uint32_t interest;    /* current epoll events */
    kvp_frame_hdr h;      /* frame being read */
    uint8_t hdr[KVP_FRAME_HDR];
    uint8_t sio[KVP_SEG_IO_SIZE];
    uint8_t small[SMALL_MAX];
    uint32_t got;         /* bytes of hdr / sio / small read so far */
    uint8_t *wpos;        /* ST_WBODY: next segment byte */
    uint64_t left;        /* ST_WBODY / ST_SKIP: bytes still to read */
    uint64_t woff, wlen, wgen, wdeadline; /* ST_WBODY: the WRITE descriptor */
    int refused;          /* ST_SKIP after a refused SEG_WRITE: answer when done */
    oitem outq[OUTQ];
    uint32_t oh, on;      /* ring head, count */
    uint64_t born_ms;     /* accepted */
    uint64_t last_ms;     /* a byte last moved */
    int active;           /* a byte moved since last_ms was set */
    uint64_t moved;       /* bytes moved either way, ever */
    uint64_t win_ms, win_moved; /* rate window: start, `moved` then */
    struct clist *list;   /* the worker's list it is on, NULL = none yet */
    struct conn *prev, *next;
    char peer[KVP_NET_PEERLEN]; /* "HOST:PORT" or "unix", for its log lines; "" = unknown */
#ifdef KVP_FUZZING
    const uint8_t *feed;  /* server_internal.h: input from memory (fd < 0) */
    size_t feed_left;
#endif
} conn;

typedef struct clist {
    conn *head, *tail;
    int n;
} clist;

typedef struct worker {
    struct kvp_segserver *s;
    pthread_t th;
    int started;
    int ep, evfd;
    pthread_mutex_t mu;
    conn *incoming;       /* under mu, linked by next */
    clist pre, auth;      /* owned by the worker thread, oldest first */
    uint64_t tick_ms;     /* last deadline check */
    uint8_t *scratch;
    uint64_t seen;        /* atomic: the last revocation barrier scanned */
} worker;

struct kvp_segserver {
    kvp_segment *seg;
    uint8_t *base;
    uint64_t size;
    uint64_t segment_id;
    kvp_grants *grants;   /* the node's; outlives the server */
    const uint8_t *ucx_attach; /* UCX_ATTACH answer body, NULL = none (outlives the server) */
    uint32_t ucx_attach_len;
    int ucx_open;              /* atomic: UCX_ATTACH answered (kvp_segserver_ucx_open) */
    uint32_t max_frame;
    char token[256];
    char unix_path[KVP_UNIXSOCK_PATH_MAX + 1];
    int tcp_fd, unix_fd, stop_fd, acc_ep;
    uint16_t port;
    int nworkers;
    worker *w;
    pthread_t acc_th;
    int acc_started;
    int stop; /* atomic */
    kvp_proto_limits lim;
    kvp_unixsock_access access;  /* who besides our uid may use the unix socket */
    int max_conns, pre_cap;      /* pre_cap: pre-HELLO connections per worker */
    uint32_t hello_ms, idle_ms, stall_ms, rate_window_ms;
    uint64_t min_rate;           /* bytes a second */
    /* revocation barriers (kvp_segserver_revoke), under rev_mu: */
    pthread_mutex_t rev_mu;
    pthread_cond_t rev_cv;       /* a worker published `seen` */
    uint64_t rev;                /* atomic: the last barrier's number */
    uint64_t rev_all;            /* atomic: the last barrier that cuts every transfer */
    uint64_t nconns;             /* atomic: open connections, incoming included */
    /* atomic counters (kvp_segserver_stats) */
    uint64_t peer_refused, refused_full, evicted, hello_to, idle_to, stall_to, accept_pauses;
    uint64_t cut_revoked, cut_expired, cut_slow;
    uint64_t moved[2][2];        /* atomic: bytes [tcp, unix][read, written] */
    int paused;                  /* acceptor only: listeners out of acc_ep */
    uint32_t backoff_ms;         /* acceptor only: last pause, 0 = none since an accept */
    uint64_t resume_ms;          /* acceptor only: end of the pause */
};

static void count(uint64_t *ctr) { __atomic_add_fetch(ctr, 1, __ATOMIC_RELAXED); }

static void cl_push(clist *l, conn *c)
{
    c->list = l;
    c->next = NULL;
    c->prev = l->tail;
    if (l->tail)
        l->tail->next = c;
    else
        l->head = c;
    l->tail = c;
    l->n++;
}

static void cl_del(clist *l, conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        l->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        l->tail = c->prev;
    l->n--;
    c->list = NULL;
    c->prev = c->next = NULL;
}

/* ------------------------------------------------------------ output */

static oitem *out_push(conn *c)
{
    oitem *it = &c->outq[(c->oh + c->on) % OUTQ];
    c->on++;
    it->hlen = KVP_FRAME_HDR;
    it->data = NULL;
    it->dlen = 0;
    it->sent = 0;
    it->pass_fd = -1;
    it->gen = 0;
    it->deadline = 0;
    it->fixed = 0;
    return it;
}

/* Queues an answer to c->h with `status`, a small body and optional
 * segment bytes. The caller made sure the ring has room. */
static void answer(conn *c, int32_t status, const void *body, uint32_t blen,
                   const uint8_t *data, uint64_t dlen, int pass_fd)
{
    oitem *it = out_push(c);
    kvp_frame_hdr r = {KVP_PROTO_VERSION, KVP_FLAG_RESPONSE, c->h.op, c->h.req_id,
                       (uint32_t)(blen + dlen), status};
    kvp_frame_hdr_encode(it->head, &r);
    if (blen)
        memcpy(it->head + KVP_FRAME_HDR, body, blen);
    it->hlen = KVP_FRAME_HDR + blen;
    it->data = data;
    it->dlen = dlen;
    it->pass_fd = pass_fd;
}

/* 1 when an answer with segment bytes still to send is past its deadline. */
static int out_expired(const conn *c, uint64_t now)
{
    for (uint32_t k = 0; k < c->on; k++) {
        const oitem *it = &c->outq[(c->oh + k) % OUTQ];
        if (it->dlen && !it->fixed && it->sent < it->hlen + it->dlen && now > it->deadline)
            return 1;
    }
    return 0;
}

/* Sends queued answers. 0, or -1 when the peer is gone or an answer's
 * descriptor expired before all its bytes went (the connection is cut:
 * the answer cannot be finished). */
static int out_flush(struct kvp_segserver *srv, conn *c)
{
    if (c->on && out_expired(c, kvp_now_ms())) {
        count(&srv->cut_expired);
        KVP_WARN_LIMITED(MOD, "closed a connection whose read outlived its descriptor");
        return -1;
    }
    while (c->on) {
        oitem *first = &c->outq[c->oh];
        struct iovec iov[MAX_IOV];
        int n = 0;
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } cm;
        struct msghdr mh = {0};
        /* an fd rides alone on its item's first byte */
        int with_fd = first->pass_fd >= 0 && first->sent == 0;
        for (uint32_t k = 0; k < c->on && n + 2 <= MAX_IOV; k++) {
            oitem *it = &c->outq[(c->oh + k) % OUTQ];
            if (k > 0 && (with_fd || it->pass_fd >= 0))
                break;
            uint64_t s = it->sent;
            if (s < it->hlen) {
                iov[n].iov_base = it->head + s;
                iov[n++].iov_len = it->hlen - s;
                s = 0;
            } else {
                s -= it->hlen;
            }
            if (it->dlen > s) {
                iov[n].iov_base = (void *)(it->data + s);
                iov[n++].iov_len = it->dlen - s;
            }
        }
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        if (with_fd) {
            memset(&cm, 0, sizeof cm);
            mh.msg_control = cm.buf;
            mh.msg_controllen = sizeof cm.buf;
            struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
            ch->cmsg_level = SOL_SOCKET;
            ch->cmsg_type = SCM_RIGHTS;
            ch->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(ch), &first->pass_fd, sizeof(int));
        }
        ssize_t w = kvp_sys.sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->active |= w > 0;
        c->moved += (uint64_t)w;
        uint64_t adv = (uint64_t)w;
        while (adv && c->on) {
            oitem *it = &c->outq[c->oh];
            uint64_t rem = it->hlen + it->dlen - it->sent;
            uint64_t take = adv < rem ? adv : rem;
            it->sent += take;
            if (take > 0)
                it->pass_fd = -1; /* the fd went with the first byte */
            adv -= take;
            if (it->sent == it->hlen + it->dlen) {
                c->oh = (c->oh + 1) % OUTQ;
                c->on--;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------- input */

/* Reads up to n bytes into p. >0 bytes, 0 would block, -1 closed/error. */
static ssize_t rd(conn *c, void *p, size_t n)
{
#ifdef KVP_FUZZING
    if (c->fd < 0) {
        size_t k = n < c->feed_left ? n : c->feed_left;
        memcpy(p, c->feed, k);
        c->feed += k;
        c->feed_left -= k;
        return (ssize_t)k;
    }
#endif
    for (;;) {
        ssize_t r = kvp_sys.recv(c->fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            c->active = 1;
            c->moved += (uint64_t)r;
            return r;
        }
        if (r == 0)
            return -1;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        return -1;
    }
}

/* Refuses the frame in c->h and stops reading (the stream can no longer be
 * trusted). */
static void refuse_close(conn *c, int err)
{
    answer(c, err, NULL, 0, NULL, 0, -1);
    c->st = ST_CLOSING;
}

static void skip(conn *c, uint64_t n, int refused)
{
    c->left = n;
    c->refused = refused;
    c->st = n ? ST_SKIP : ST_HDR;
    if (!n && refused)
        answer(c, refused, NULL, 0, NULL, 0, -1);
}

/* Checks a seg_io for `access` (grants.h). 0 or KVP_EINVALID_READ/WRITE;
 * *deadline: when a transfer on it must stop. */
static int seg_check(const struct kvp_segserver *s, const kvp_replica *r, uint32_t access,
                     uint64_t *deadline)
{
    return kvp_grants_check(s->grants, s->segment_id, r, access, kvp_now_ms(), deadline);
}

/*
 * AUTH_CHALLENGE (proto/auth.h): a fresh nonce, this segment's id as the
 * server id, and the proof of the cluster token when the client holds one
 * and so does this server. Once per HELLO; before HELLO only.
 */
static void on_challenge(struct kvp_segserver *s, conn *c)
{
    kvp_msg_challenge ch;
    if (kvp_dec_challenge(c->small, c->h.body_len, &ch) != 0 || c->challenged || c->hello_ok) {
        refuse_close(c, KVP_EPROTOCOL);
        return;
    }
    if (ch.version != KVP_PROTO_VERSION) {
        refuse_close(c, KVP_EINVALID_VERSION);
        return;
    }
    kvp_auth_tx *t = &c->auth;
    memset(t, 0, sizeof *t);
    memcpy(t->client_nonce, ch.nonce.p, KVP_AUTH_NONCE);
    if (kvp_auth_nonce(t->server_nonce) != 0) {
        refuse_close(c, KVP_EINTERNAL_ERROR);
        return;
    }
    t->server_id = s->segment_id;
    t->has = ch.has;
    if (ch.kid.len)
        memcpy(t->kid, ch.kid.p, KVP_AUTH_KID);
    c->challenged = 1;
    uint8_t pr[KVP_AUTH_PROOF];
    kvp_msg_challenge_resp r = {{t->server_nonce, KVP_AUTH_NONCE}, s->segment_id, {{NULL, 0}}};
    size_t tl = strlen(s->token);
    if (tl && (t->has & KVP_AUTH_HAS(KVP_AUTH_CLUSTER))) {
        kvp_auth_server_proof(t, KVP_AUTH_CLUSTER, s->token, tl, pr);
        r.proof[KVP_AUTH_CLUSTER] = (kvp_bytes){pr, KVP_AUTH_PROOF};
    }
    uint8_t tmp[SMALL_RESP];
    kvp_buf b = {tmp, 0, sizeof tmp, sizeof tmp, 0};
    kvp_enc_challenge_resp(&b, &r);
    answer(c, 0, tmp, (uint32_t)b.len, NULL, 0, -1);
    c->st = ST_HDR;
}

/* HELLO: with a cluster token, the client's proof of it over this
 * connection's challenge (consumed either way). Other credentials mean
 * nothing here. */
static void on_hello(struct kvp_segserver *s, conn *c)
{
    kvp_msg_hello m;
    int challenged = c->challenged;
    c->challenged = 0;
    if (kvp_dec_hello(c->small, c->h.body_len, &s->lim, &m) != 0 || m.client_id == 0) {
        refuse_close(c, KVP_EPROTOCOL);
        return;
    }
    if (m.version != KVP_PROTO_VERSION) {
        refuse_close(c, KVP_EINVALID_VERSION);
        return;
    }
    size_t tl = strlen(s->token);
    if (tl) {
        uint8_t want[KVP_AUTH_PROOF];
        kvp_auth_client_proof(&c->auth, KVP_AUTH_CLUSTER, m.client_id, s->token, tl, want);
        if (!challenged || !(c->auth.has & KVP_AUTH_HAS(KVP_AUTH_CLUSTER)) ||
            !kvp_auth_proof_ok(m.proof[KVP_AUTH_CLUSTER].p, m.proof[KVP_AUTH_CLUSTER].len,
                               want)) {
            KVP_WARN_LIMITED(MOD, "HELLO from client %016llx refused: no proof of the cluster "
                                  "token", (unsigned long long)m.client_id);
            refuse_close(c, KVP_EAUTH);
            return;
        }
    }
    c->hello_ok = 1;
    kvp_msg_hello_resp r = {KVP_PROTO_VERSION, s->segment_id, s->max_frame, 0, 0, 0, {0},
                            KVPOOL_VERSION_STRING};
    uint8_t tmp[SMALL_RESP];
    kvp_buf b = {tmp, 0, sizeof tmp, sizeof tmp, 0};
    kvp_enc_hello_resp(&b, &r);
    answer(c, 0, tmp, (uint32_t)b.len, NULL, 0, -1);
    c->st = ST_HDR;
}

/* An attach request's body (u64 segment id) names this segment: 1; else
 * the refusal is answered and 0. */
static int attach_ours(struct kvp_segserver *s, conn *c)
{
    kvp_rd r;
    kvp_rd_init(&r, c->small, c->h.body_len);
    uint64_t id = kvp_rd_u64(&r);
    c->st = ST_HDR;
    if (kvp_rd_finish(&r) != 0)
        answer(c, KVP_EPROTOCOL, NULL, 0, NULL, 0, -1);
    else if (id != s->segment_id)
        answer(c, KVP_ESEGMENT_NOT_FOUND, NULL, 0, NULL, 0, -1);
    else
        return 1;
    return 0;
}

static void on_shm_attach(struct kvp_segserver *s, conn *c)
{
    if (!attach_ours(s, c))
        return;
    uint8_t sz[8];
    for (int i = 0; i < 8; i++)
        sz[i] = (uint8_t)(s->size >> (8 * i));
    answer(c, 0, sz, 8, NULL, 0, kvp_segment_fd(s->seg));
}

static void on_ucx_attach(struct kvp_segserver *s, conn *c)
{
    if (!attach_ours(s, c))
        return;
    if (!s->ucx_attach || !__atomic_load_n(&s->ucx_open, __ATOMIC_ACQUIRE)) {
        answer(c, KVP_ENOT_SUPPORTED, NULL, 0, NULL, 0, -1);
        return;
    }
    answer(c, 0, NULL, 0, s->ucx_attach, s->ucx_attach_len, -1);
    c->outq[(c->oh + c->on - 1) % OUTQ].fixed = 1;
}

/* A small body is in c->small: its op's handler. */
static void on_small(struct kvp_segserver *s, conn *c)
{
    if (c->h.op == KVP_OP_HELLO)
        on_hello(s, c);
    else if (c->h.op == KVP_OP_AUTH_CHALLENGE)
        on_challenge(s, c);
    else if (c->h.op == KVP_OP_SHM_ATTACH)
        on_shm_attach(s, c);
    else
        on_ucx_attach(s, c);
}

/* A whole header is in c->hdr: decide what comes next. */
static void on_header(struct kvp_segserver *s, conn *c)
{
    int rc = kvp_frame_hdr_decode(c->hdr, s->max_frame, &c->h);
    if (rc) {
        /* echo what we can of the request id */
        memset(&c->h, 0, sizeof c->h);
        for (int i = 7; i >= 0; i--)
            c->h.req_id = (c->h.req_id << 8) | c->hdr[8 + i];
        refuse_close(c, rc);
        return;
    }
    c->got = 0;
    if (c->h.flags & KVP_FLAG_RESPONSE) {
        refuse_close(c, KVP_EPROTOCOL);
        return;
    }
    if (!c->hello_ok && c->h.op != KVP_OP_HELLO && c->h.op != KVP_OP_AUTH_CHALLENGE) {
        refuse_close(c, KVP_ENO_HELLO);
        return;
    }
    switch (c->h.op) {
    case KVP_OP_AUTH_CHALLENGE:
    case KVP_OP_HELLO:
        if (c->h.body_len > SMALL_MAX) {
            refuse_close(c, KVP_EPROTOCOL);
            return;
        }
        c->st = ST_SMALL;
        break;
    case KVP_OP_SHM_ATTACH:
        if (!c->is_unix) {
            skip(c, c->h.body_len, KVP_ENOT_SUPPORTED);
            return;
        }
        if (c->h.body_len > SMALL_MAX) {
            refuse_close(c, KVP_EPROTOCOL);
            return;
        }
        c->st = ST_SMALL;
        break;
    case KVP_OP_UCX_ATTACH:
        if (c->h.body_len > SMALL_MAX) {
            refuse_close(c, KVP_EPROTOCOL);
            return;
        }
        c->st = ST_SMALL;
        break;
    case KVP_OP_SEG_WRITE:
        if (c->h.body_len < KVP_SEG_IO_SIZE) {
            refuse_close(c, KVP_EINVALID_WRITE);
            return;
        }
        c->st = ST_SEGIO;
        break;
    case KVP_OP_SEG_READ:
        if (c->h.body_len != KVP_SEG_IO_SIZE) {
            refuse_close(c, KVP_EINVALID_READ);
            return;
        }
        c->st = ST_SEGIO;
        break;
    default:
        skip(c, c->h.body_len, KVP_EUNKNOWN_OP);
        return;
    }
    if (c->st == ST_SMALL && c->h.body_len == 0)
        on_small(s, c);
}

static void on_seg_io(struct kvp_segserver *s, conn *c)
{
    kvp_replica r;
    kvp_dec_seg_io(c->sio, KVP_SEG_IO_SIZE, &r);
    c->got = 0;
    if (c->h.op == KVP_OP_SEG_READ) {
        c->st = ST_HDR;
        uint64_t dl;
        if (seg_check(s, &r, KVP_ACCESS_READ, &dl)) {
            answer(c, KVP_EINVALID_READ, NULL, 0, NULL, 0, -1);
        } else {
            answer(c, 0, NULL, 0, s->base + r.offset, r.length, -1);
            __atomic_fetch_add(&s->moved[!!c->is_unix][0], r.length, __ATOMIC_RELAXED);
            oitem *it = &c->outq[(c->oh + c->on - 1) % OUTQ];
            it->gen = r.generation;
            it->deadline = dl;
        }
        return;
    }
    uint64_t body_rest = (uint64_t)c->h.body_len - KVP_SEG_IO_SIZE;
    if (body_rest != r.length) {
        refuse_close(c, KVP_EINVALID_WRITE); /* the body cannot be delimited */
        return;
    }
    if (seg_check(s, &r, KVP_ACCESS_WRITE, &c->wdeadline)) {
        skip(c, body_rest, KVP_EINVALID_WRITE);
        return;
    }
    c->woff = r.offset;
    c->wlen = r.length;
    c->wgen = r.generation;
    c->wpos = s->base + r.offset;
    c->left = r.length;
    c->st = ST_WBODY;
}

#ifdef KVP_FUZZING
/* The state invariants of the top of the file; aborts when one breaks. */
static void fuzz_check(const kvp_segserver *s, const conn *c)
{
    const uint8_t *end = s->base + s->size;
    if (c->on > OUTQ)
        abort();
    if (c->st == ST_WBODY && (c->wpos < s->base || c->wpos > end ||
                              c->left > (uint64_t)(end - c->wpos)))
        abort();
    if ((c->st == ST_HDR && c->got > KVP_FRAME_HDR) ||
        (c->st == ST_SEGIO && c->got > KVP_SEG_IO_SIZE) ||
        (c->st == ST_SMALL && (c->h.body_len > SMALL_MAX || c->got > c->h.body_len)))
        abort();
    for (uint32_t k = 0; k < c->on; k++) {
        const oitem *it = &c->outq[(c->oh + k) % OUTQ];
        if (it->hlen > sizeof it->head ||
            (it->data && !it->fixed && (it->data < s->base || it->data > end ||
                                        it->dlen > (uint64_t)(end - it->data))) ||
            (it->fixed && (it->data != s->ucx_attach || it->dlen != s->ucx_attach_len)))
            abort();
    }
}
#endif

/* Reads and serves input within the budget. -1: close now. */
static int conn_input(worker *w, conn *c)
{
    struct kvp_segserver *s = w->s;
    size_t budget = READ_BUDGET;
    int frames = 0;
    while (c->st != ST_CLOSING && budget && frames < FRAME_BUDGET) {
        ssize_t n;
#ifdef KVP_FUZZING
        fuzz_check(s, c); /* before every read: it stays inside what is checked */
#endif
        switch (c->st) {
        case ST_HDR:
            if (c->on >= OUTQ)
                return 0; /* answers pending: wait for the peer to read */
            n = rd(c, c->hdr + c->got, KVP_FRAME_HDR - c->got);
            if (n <= 0)
                return (int)n;
            c->got += (uint32_t)n;
            if (c->got == KVP_FRAME_HDR) {
                frames++;
                on_header(s, c);
            }
            break;
        case ST_SEGIO:
            n = rd(c, c->sio + c->got, KVP_SEG_IO_SIZE - c->got);
            if (n <= 0)
                return (int)n;
            c->got += (uint32_t)n;
            if (c->got == KVP_SEG_IO_SIZE)
                on_seg_io(s, c);
            break;
        case ST_SMALL:
            n = rd(c, c->small + c->got, c->h.body_len - c->got);
            if (n <= 0)
                return (int)n;
            c->got += (uint32_t)n;
            if (c->got == c->h.body_len) {
                c->got = 0;
                on_small(s, c);
            }
            break;
        case ST_WBODY: {
            size_t want = c->left < budget ? (size_t)c->left : budget;
            if (kvp_now_ms() > c->wdeadline) { /* never answered: the body is cut */
                count(&s->cut_expired);
                KVP_WARN_LIMITED(MOD, "closed a connection whose write outlived its descriptor");
                return -1;
            }
            n = rd(c, c->wpos, want);
            if (n <= 0)
                return (int)n;
            c->wpos += n;
            c->left -= (uint64_t)n;
            budget -= (size_t)n;
            if (c->left == 0) {
                answer(c, 0, NULL, 0, NULL, 0, -1);
                __atomic_fetch_add(&s->moved[!!c->is_unix][1], c->wlen, __ATOMIC_RELAXED);
                c->st = ST_HDR;
            }
            break;
        }
        case ST_SKIP: {
            size_t want = c->left < SCRATCH ? (size_t)c->left : SCRATCH;
            n = rd(c, w->scratch, want);
            if (n <= 0)
                return (int)n;
            c->left -= (uint64_t)n;
            budget -= (size_t)n < budget ? (size_t)n : budget;
            if (c->left == 0) {
                c->st = ST_HDR;
                if (c->refused)
                    answer(c, c->refused, NULL, 0, NULL, 0, -1);
            }
            break;
        }
        case ST_CLOSING:
            break;
        }
    }
    return 0;
}

/* ------------------------------------------------------------ workers */

static void conn_free(worker *w, conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    if (c->list)
        cl_del(c->list, c);
    __atomic_sub_fetch(&w->s->nconns, 1, __ATOMIC_RELAXED);
    kvp_free(c);
}

static void set_interest(worker *w, conn *c)
{
    uint32_t ev = 0;
    if (c->st != ST_CLOSING && c->on < OUTQ)
        ev |= EPOLLIN;
    if (c->on)
        ev |= EPOLLOUT;
    if (ev != c->interest) {
        struct epoll_event e = {.events = ev, .data.ptr = c};
        epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &e);
        c->interest = ev;
    }
}

/* Log lines of the thread name c's peer until the next call (NULL: none). */
static void log_peer(const conn *c) { kvp_log_set_peer(c && c->peer[0] ? c->peer : NULL); }

static void conn_event_peer(worker *w, conn *c, uint32_t ev);

static void conn_event(worker *w, conn *c, uint32_t ev)
{
    log_peer(c);
    conn_event_peer(w, c, ev);
    log_peer(NULL);
}

static void conn_event_peer(worker *w, conn *c, uint32_t ev)
{
    if ((ev & EPOLLERR) || ((ev & EPOLLHUP) && !(ev & EPOLLIN))) {
        conn_free(w, c);
        return;
    }
    if (c->on && out_flush(w->s, c) < 0) {
        conn_free(w, c);
        return;
    }
    if ((ev & EPOLLIN) && conn_input(w, c) < 0) {
        conn_free(w, c);
        return;
    }
    if (c->on && out_flush(w->s, c) < 0) {
        conn_free(w, c);
        return;
    }
    if (c->st == ST_CLOSING && c->on == 0) {
        conn_free(w, c);
        return;
    }
    if (c->active) {
        c->last_ms = kvp_now_ms();
        c->active = 0;
    }
    if (c->hello_ok && c->list == &w->pre) {
        cl_del(&w->pre, c);
        cl_push(&w->auth, c);
    }
    set_interest(w, c);
}

/* Closes the connections past their deadline (see the top of the file). */
static void sweep(worker *w, uint64_t now)
{
    struct kvp_segserver *s = w->s;
    while (w->pre.head && now - w->pre.head->born_ms >= s->hello_ms) {
        count(&s->hello_to);
        log_peer(w->pre.head);
        KVP_WARN_LIMITED(MOD, "closed a connection that sent no HELLO within %u ms",
                         (unsigned)s->hello_ms);
        conn_free(w, w->pre.head);
    }
    for (conn *c = w->auth.head, *nx; c; c = nx) {
        nx = c->next;
        log_peer(c);
        int busy = c->st != ST_HDR || c->got || c->on;
        if (busy && ((c->st == ST_WBODY && now > c->wdeadline) || out_expired(c, now))) {
            count(&s->cut_expired);
            KVP_WARN_LIMITED(MOD, "closed a connection whose transfer outlived its descriptor");
            conn_free(w, c);
            continue;
        }
        if (!busy || now - c->win_ms >= s->rate_window_ms) {
            uint64_t el = now - c->win_ms;
            if (busy && (c->moved - c->win_moved) * 1000 < s->min_rate * el) {
                count(&s->cut_slow);
                KVP_WARN_LIMITED(MOD, "closed a connection moving %llu B/s (at least %llu B/s)",
                                 (unsigned long long)((c->moved - c->win_moved) * 1000 / el),
                                 (unsigned long long)s->min_rate);
                conn_free(w, c);
                continue;
            }
            c->win_ms = now;
            c->win_moved = c->moved;
        }
        if (now - c->last_ms < (busy ? s->stall_ms : s->idle_ms))
            continue;
        if (busy) {
            count(&s->stall_to);
            KVP_WARN_LIMITED(MOD, "closed a connection stalled for %u ms %s",
                             (unsigned)s->stall_ms,
                             c->on ? "with answers it does not read" : "in the middle of a frame");
        } else {
            count(&s->idle_to);
            kvp_log_limited(KVP_LOG_DEBUG, MOD, "closed a connection idle for %u ms",
                            (unsigned)s->idle_ms);
        }
        conn_free(w, c);
    }
    log_peer(NULL);
}

static void take_incoming(worker *w)
{
    uint64_t v;
    ssize_t r = read(w->evfd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&w->mu);
    conn *in = w->incoming;
    w->incoming = NULL;
    pthread_mutex_unlock(&w->mu);
    while (in) {
        conn *c = in;
        in = in->next;
        c->interest = EPOLLIN;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, c->fd, &e) < 0) {
            conn_free(w, c);
            continue;
        }
        cl_push(&w->pre, c);
        if (w->pre.n > w->s->pre_cap) {
            count(&w->s->evicted);
            log_peer(w->pre.head);
            KVP_WARN_LIMITED(MOD, "%d connections without HELLO on a worker: closed the oldest",
                             w->pre.n);
            conn_free(w, w->pre.head);
            log_peer(NULL);
        }
    }
}

/* 1 when a transfer of c is on a grant that is no longer live (all: every
 * transfer counts as such). */
static int has_dead_transfer(const struct kvp_segserver *s, const conn *c, int all)
{
    if (c->st == ST_WBODY &&
        (all || !kvp_grants_live(s->grants, c->woff, c->wlen, c->wgen, KVP_ACCESS_WRITE)))
        return 1;
    for (uint32_t k = 0; k < c->on; k++) {
        const oitem *it = &c->outq[(c->oh + k) % OUTQ];
        if (it->dlen && !it->fixed && it->sent < it->hlen + it->dlen &&
            (all || !kvp_grants_live(s->grants, (uint64_t)(it->data - s->base), it->dlen,
                                     it->gen, KVP_ACCESS_READ)))
            return 1;
    }
    return 0;
}

/* The worker's part of a revocation barrier (see the top of the file). */
static void revoke_scan(worker *w)
{
    struct kvp_segserver *s = w->s;
    uint64_t r = __atomic_load_n(&s->rev, __ATOMIC_ACQUIRE);
    if (r == w->seen)
        return;
    int all = __atomic_load_n(&s->rev_all, __ATOMIC_ACQUIRE) > w->seen;
    for (conn *c = w->auth.head, *nx; c; c = nx) {
        nx = c->next;
        if (has_dead_transfer(s, c, all)) {
            count(&s->cut_revoked);
            log_peer(c);
            KVP_WARN_LIMITED(MOD, "closed a connection whose transfer's grant was revoked");
            conn_free(w, c);
            log_peer(NULL);
        }
    }
    pthread_mutex_lock(&s->rev_mu);
    __atomic_store_n(&w->seen, r, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&s->rev_cv);
    pthread_mutex_unlock(&s->rev_mu);
}

int kvp_segserver_revoke(kvp_segserver *s, int all, uint32_t timeout_ms)
{
    pthread_mutex_lock(&s->rev_mu);
    uint64_t target = __atomic_load_n(&s->rev, __ATOMIC_RELAXED) + 1;
    if (all)
        __atomic_store_n(&s->rev_all, target, __ATOMIC_RELEASE);
    __atomic_store_n(&s->rev, target, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&s->rev_mu);
    for (int i = 0; i < s->nworkers; i++) {
        uint64_t one = 1;
        ssize_t wr = write(s->w[i].evfd, &one, sizeof one);
        (void)wr;
    }
    struct timespec ts = kvp_deadline_ms(timeout_ms);
    int rc = 0;
    pthread_mutex_lock(&s->rev_mu);
    for (int i = 0; i < s->nworkers && rc == 0; i++)
        while (__atomic_load_n(&s->w[i].seen, __ATOMIC_ACQUIRE) < target)
            if (pthread_cond_timedwait(&s->rev_cv, &s->rev_mu, &ts) == ETIMEDOUT) {
                rc = __atomic_load_n(&s->w[i].seen, __ATOMIC_ACQUIRE) < target ? KVP_ERPC_TIMEOUT
                                                                                : 0;
                break;
            }
    pthread_mutex_unlock(&s->rev_mu);
    return rc;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    struct epoll_event evs[64];
    w->tick_ms = kvp_now_ms();
    while (!__atomic_load_n(&w->s->stop, __ATOMIC_ACQUIRE)) {
        int n = kvp_sys.epoll_wait(w->ep, evs, 64, TICK_MS);
        if (n < 0 && errno != EINTR) {
            KVP_ERROR(MOD, "epoll_wait: %s", strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &w->s->stop_fd)
                continue; /* the loop condition sees `stop` */
            if (p == &w->evfd)
                take_incoming(w);
            else
                conn_event(w, p, evs[i].events);
        }
        revoke_scan(w);
        uint64_t now = kvp_now_ms();
        if (now - w->tick_ms >= TICK_MS) {
            w->tick_ms = now;
            sweep(w, now);
        }
    }
    return NULL;
}

/* SO_PEERCRED check of a unix connection (the socket file's mode already
 * keeps others out; this holds even if the file or directory mode is
 * loosened). A refusal is counted and logged rate-limited. */
static int peer_ok(struct kvp_segserver *s, int fd)
{
    long uid;
    if (kvp_unixsock_peer_check(fd, &s->access, &uid))
        return 1;
    uint64_t n = __atomic_add_fetch(&s->peer_refused, 1, __ATOMIC_RELAXED);
    KVP_WARN_LIMITED(MOD, "unix socket %s: refused a connection from uid %ld (allowed: uid %u%s); "
                          "%llu refused so far",
                     s->unix_path, uid, (unsigned)geteuid(),
                     s->access.has_group ? " and the members of the shm group" : "",
                     (unsigned long long)n);
    return 0;
}

/* Puts the listeners in (on) or out of the acceptor's epoll set. */
static void listeners_arm(struct kvp_segserver *s, int on)
{
    int *l[2] = {&s->tcp_fd, &s->unix_fd};
    for (int i = 0; i < 2; i++) {
        if (*l[i] < 0)
            continue;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = l[i]};
        epoll_ctl(s->acc_ep, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, *l[i], &e);
    }
}

/* accept failed with err (out of descriptors or worse): pending connections
 * wait in the backlog while the listeners are paused, 100 ms doubling to 1 s. */
static void accept_pause(struct kvp_segserver *s, int err)
{
    uint32_t b = s->backoff_ms ? 2 * s->backoff_ms : BACKOFF_MIN_MS;
    s->backoff_ms = b > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : b;
    s->resume_ms = kvp_now_ms() + s->backoff_ms;
    listeners_arm(s, 0);
    s->paused = 1;
    count(&s->accept_pauses);
    KVP_WARN_LIMITED(MOD, "accept: %s; not accepting for %u ms (%llu connections open)",
                     strerror(err), (unsigned)s->backoff_ms,
                     (unsigned long long)__atomic_load_n(&s->nconns, __ATOMIC_RELAXED));
}

static void *acceptor_main(void *arg)
{
    struct kvp_segserver *s = arg;
    struct epoll_event evs[4];
    unsigned rr = 0;
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        int tmo = 1000;
        if (s->paused) {
            uint64_t now = kvp_now_ms();
            if (now >= s->resume_ms) {
                listeners_arm(s, 1);
                s->paused = 0;
            } else {
                tmo = (int)(s->resume_ms - now);
            }
        }
        int n = kvp_sys.epoll_wait(s->acc_ep, evs, 4, tmo);
        for (int i = 0; i < n; i++) {
            int *lfd = evs[i].data.ptr;
            if (lfd == &s->stop_fd)
                continue;
            while (!s->paused) {
                struct sockaddr_storage ss;
                socklen_t sl = sizeof ss;
                int fd = kvp_sys.accept4(*lfd, (struct sockaddr *)&ss, &sl,
                                         SOCK_NONBLOCK | SOCK_CLOEXEC);
                if (fd < 0) {
                    if (errno == EINTR || errno == ECONNABORTED)
                        continue;
                    if (errno != EAGAIN && errno != EWOULDBLOCK)
                        accept_pause(s, errno);
                    break;
                }
                s->backoff_ms = 0;
                if (lfd == &s->unix_fd && !peer_ok(s, fd)) {
                    close(fd);
                    continue;
                }
                if (__atomic_load_n(&s->nconns, __ATOMIC_RELAXED) >= (uint64_t)s->max_conns) {
                    /* counted before the close: a peer that saw the close
                     * then reads the stats finds it counted */
                    count(&s->refused_full);
                    close(fd);
                    char pl[KVP_NET_PEERLEN] = "unix";
                    if (lfd != &s->unix_fd)
                        kvp_net_peer_text(&ss, pl, sizeof pl);
                    kvp_log_set_peer(pl);
                    KVP_WARN_LIMITED(MOD, "%d connections open: closed a new one", s->max_conns);
                    kvp_log_set_peer(NULL);
                    continue;
                }
                conn *c = kvp_calloc(1, sizeof *c);
                if (!c) {
                    close(fd);
                    continue;
                }
                __atomic_add_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
                c->fd = fd;
                c->is_unix = lfd == &s->unix_fd;
                if (c->is_unix)
                    snprintf(c->peer, sizeof c->peer, "unix");
                else
                    kvp_net_peer_text(&ss, c->peer, sizeof c->peer);
                c->st = ST_HDR;
                c->born_ms = c->last_ms = c->win_ms = kvp_now_ms();
                if (!c->is_unix)
                    kvp_net_set_nodelay(fd);
                worker *w = &s->w[rr++ % (unsigned)s->nworkers];
                pthread_mutex_lock(&w->mu);
                c->next = w->incoming;
                w->incoming = c;
                pthread_mutex_unlock(&w->mu);
                uint64_t one = 1;
                ssize_t wr = write(w->evfd, &one, sizeof one);
                (void)wr;
            }
        }
    }
    return NULL;
}

/* -------------------------------------------------------------- setup */

static int opt_or(int v, int dflt) { return v > 0 ? v : dflt; }

/* The server's state, no descriptors or threads yet. */
static int server_new(kvp_segment *seg, const kvp_segserver_opts *o,
                      const kvp_segserver_limits *lim, int nworkers, kvp_segserver **out,
                      char *err, size_t errlen)
{
    static const kvp_segserver_limits dflt;
    if (!lim)
        lim = &dflt;
    if (!seg || !o || !o->listen || o->segment_id == 0 || !o->grants) {
        snprintf(err, errlen,
                 "segment server: segment, listen address, segment id and grants needed");
        return KVP_EINVALID_PARAMS;
    }
    if (o->cluster_token && strlen(o->cluster_token) >= 256) {
        snprintf(err, errlen, "cluster token too long");
        return KVP_EINVALID_PARAMS;
    }
    kvp_segserver *s = kvp_calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    s->seg = seg;
    s->base = kvp_segment_base(seg);
    s->size = kvp_segment_size(seg);
    s->segment_id = o->segment_id;
    s->grants = o->grants;
    s->ucx_attach = o->ucx_attach;
    s->ucx_attach_len = o->ucx_attach ? o->ucx_attach_len : 0;
    uint64_t mf = s->size + KVP_SEG_IO_SIZE;
    s->max_frame = mf > UINT32_MAX ? UINT32_MAX : (uint32_t)mf;
    if (o->cluster_token)
        snprintf(s->token, sizeof s->token, "%s", o->cluster_token);
    kvp_proto_limits_default(&s->lim);
    s->tcp_fd = s->unix_fd = s->stop_fd = s->acc_ep = -1;
    s->nworkers = nworkers;
    s->max_conns = opt_or(lim->max_conns, MAX_CONNS);
    int pre = opt_or(lim->max_pre_hello, s->max_conns / 4 > 0 ? s->max_conns / 4 : 1);
    pre = pre < s->max_conns ? pre : s->max_conns;
    s->pre_cap = (pre + nworkers - 1) / nworkers;
    s->hello_ms = lim->hello_timeout_ms ? lim->hello_timeout_ms : HELLO_MS;
    s->idle_ms = lim->idle_timeout_ms ? lim->idle_timeout_ms : IDLE_MS;
    s->stall_ms = lim->stall_timeout_ms ? lim->stall_timeout_ms : STALL_MS;
    s->min_rate = lim->min_rate ? lim->min_rate : MIN_RATE;
    s->rate_window_ms = lim->rate_window_ms ? lim->rate_window_ms : RATE_WINDOW_MS;
    pthread_mutex_init(&s->rev_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->rev_cv, &ca);
    pthread_condattr_destroy(&ca);
    s->w = kvp_calloc((size_t)s->nworkers, sizeof *s->w);
    if (!s->w) {
        snprintf(err, errlen, "out of memory");
        pthread_cond_destroy(&s->rev_cv);
        pthread_mutex_destroy(&s->rev_mu);
        kvp_free(s);
        return KVP_ENOMEM;
    }
    for (int i = 0; i < s->nworkers; i++) {
        s->w[i].s = s;
        s->w[i].ep = s->w[i].evfd = -1;
        pthread_mutex_init(&s->w[i].mu, NULL);
    }
    *out = s;
    return 0;
}

int kvp_segserver_start(kvp_segment *seg, const kvp_segserver_opts *o, kvp_segserver **out,
                        char *err, size_t errlen)
{
    return kvp_segserver_start_lim(seg, o, NULL, out, err, errlen);
}

int kvp_segserver_start_lim(kvp_segment *seg, const kvp_segserver_opts *o,
                            const kvp_segserver_limits *lim, kvp_segserver **out, char *err,
                            size_t errlen)
{
    kvp_segserver *s;
    int rc = server_new(seg, o, lim, o && o->io_threads > 0 ? o->io_threads : 2, &s, err,
                        errlen);
    if (rc)
        return rc;
    s->tcp_fd = kvp_net_listen(o->listen, 1024, &s->port, err, errlen);
    if (s->tcp_fd < 0) {
        rc = s->tcp_fd;
        s->tcp_fd = -1;
        goto fail;
    }
    if (o->unix_path && *o->unix_path) {
        s->access = o->unix_access;
        s->unix_fd = kvp_unixsock_listen(o->unix_path, &s->access, err, errlen);
        if (s->unix_fd < 0) {
            rc = s->unix_fd;
            s->unix_fd = -1;
            goto fail;
        }
        snprintf(s->unix_path, sizeof s->unix_path, "%s", o->unix_path);
    }
    s->stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    s->acc_ep = epoll_create1(EPOLL_CLOEXEC);
    if (s->stop_fd < 0 || s->acc_ep < 0) {
        snprintf(err, errlen, "eventfd/epoll: %s", strerror(errno));
        rc = KVP_EIO;
        goto fail;
    }
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &s->stop_fd};
    epoll_ctl(s->acc_ep, EPOLL_CTL_ADD, s->stop_fd, &e);
    e.data.ptr = &s->tcp_fd;
    epoll_ctl(s->acc_ep, EPOLL_CTL_ADD, s->tcp_fd, &e);
    if (s->unix_fd >= 0) {
        e.data.ptr = &s->unix_fd;
        epoll_ctl(s->acc_ep, EPOLL_CTL_ADD, s->unix_fd, &e);
    }
    for (int i = 0; i < s->nworkers; i++) {
        worker *w = &s->w[i];
        w->scratch = kvp_malloc(SCRATCH);
        w->ep = epoll_create1(EPOLL_CLOEXEC);
        w->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!w->scratch || w->ep < 0 || w->evfd < 0) {
            snprintf(err, errlen, "worker setup: %s", w->scratch ? strerror(errno) : "out of memory");
            rc = w->scratch ? KVP_EIO : KVP_ENOMEM;
            goto fail;
        }
        e.data.ptr = &s->stop_fd;
        epoll_ctl(w->ep, EPOLL_CTL_ADD, s->stop_fd, &e);
        e.data.ptr = &w->evfd;
        epoll_ctl(w->ep, EPOLL_CTL_ADD, w->evfd, &e);
    }
    for (int i = 0; i < s->nworkers; i++) {
        if (pthread_create(&s->w[i].th, NULL, worker_main, &s->w[i]) != 0) {
            snprintf(err, errlen, "cannot start a worker thread");
            rc = KVP_EIO;
            goto fail;
        }
        s->w[i].started = 1;
    }
    if (pthread_create(&s->acc_th, NULL, acceptor_main, s) != 0) {
        snprintf(err, errlen, "cannot start the acceptor thread");
        rc = KVP_EIO;
        goto fail;
    }
    s->acc_started = 1;
    KVP_INFO(MOD,
             "segment %016llx (%llu MiB) served on %s (port %u)%s%s, %d io threads, "
             "at most %d connections (%d per thread before HELLO), HELLO within %u ms, "
             "idle %u s, stalled %u s, at least %llu B/s over %u ms while busy",
             (unsigned long long)s->segment_id, (unsigned long long)(s->size >> 20), o->listen,
             s->port, s->unix_path[0] ? " and " : "", s->unix_path, s->nworkers, s->max_conns,
             s->pre_cap, (unsigned)s->hello_ms, (unsigned)(s->idle_ms / 1000),
             (unsigned)(s->stall_ms / 1000), (unsigned long long)s->min_rate,
             (unsigned)s->rate_window_ms);
    *out = s;
    return 0;
fail:
    kvp_segserver_stop(s);
    return rc;
}

uint16_t kvp_segserver_port(const kvp_segserver *s) { return s->port; }

void kvp_segserver_ucx_open(kvp_segserver *s, int open)
{
    __atomic_store_n(&s->ucx_open, open != 0, __ATOMIC_RELEASE);
}

uint64_t kvp_segserver_peer_refused(const kvp_segserver *s)
{
    return __atomic_load_n(&s->peer_refused, __ATOMIC_RELAXED);
}

void kvp_segserver_stats_get(const kvp_segserver *s, kvp_segserver_stats *out)
{
#define LD(f) __atomic_load_n(&s->f, __ATOMIC_RELAXED)
    *out = (kvp_segserver_stats){LD(nconns),   LD(refused_full),  LD(evicted),
                                 LD(hello_to), LD(idle_to),       LD(stall_to),
                                 LD(accept_pauses), LD(peer_refused), LD(cut_revoked),
                                 LD(cut_expired), LD(cut_slow),
                                 {{LD(moved[0][0]), LD(moved[0][1])},
                                  {LD(moved[1][0]), LD(moved[1][1])}}};
#undef LD
}

void kvp_segserver_stop(kvp_segserver *s)
{
    if (!s)
        return;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    if (s->stop_fd >= 0) {
        uint64_t one = 1;
        ssize_t wr = write(s->stop_fd, &one, sizeof one);
        (void)wr;
    }
    if (s->acc_started)
        pthread_join(s->acc_th, NULL);
    for (int i = 0; i < s->nworkers; i++) {
        worker *w = &s->w[i];
        if (w->started)
            pthread_join(w->th, NULL);
        while (w->pre.head)
            conn_free(w, w->pre.head);
        while (w->auth.head)
            conn_free(w, w->auth.head);
        while (w->incoming) {
            conn *c = w->incoming;
            w->incoming = c->next;
            close(c->fd);
            kvp_free(c);
        }
        if (w->ep >= 0)
            close(w->ep);
        if (w->evfd >= 0)
            close(w->evfd);
        kvp_free(w->scratch);
        pthread_mutex_destroy(&w->mu);
    }
    kvp_free(s->w);
    if (s->tcp_fd >= 0)
        close(s->tcp_fd);
    if (s->unix_fd >= 0) {
        close(s->unix_fd);
        unlink(s->unix_path);
    }
    if (s->stop_fd >= 0)
        close(s->stop_fd);
    if (s->acc_ep >= 0)
        close(s->acc_ep);
    pthread_cond_destroy(&s->rev_cv);
    pthread_mutex_destroy(&s->rev_mu);
    kvp_free(s);
}

/* ------------------------------------------ server_internal.h (fuzzing) */
#ifdef KVP_FUZZING

int kvp_segserver_fuzz_new(kvp_segment *seg, const kvp_segserver_opts *o, kvp_segserver **out)
{
    char err[256];
    kvp_segserver *s;
    if (server_new(seg, o, NULL, 1, &s, err, sizeof err) != 0)
        return -1;
    s->w[0].scratch = kvp_malloc(SCRATCH);
    if (!s->w[0].scratch) {
        kvp_segserver_stop(s);
        return -1;
    }
    *out = s;
    return 0;
}

struct conn *kvp_segserver_fuzz_conn(kvp_segserver *s, int is_unix)
{
    conn *c = kvp_calloc(1, sizeof *c);
    if (!c)
        return NULL;
    __atomic_add_fetch(&s->nconns, 1, __ATOMIC_RELAXED);
    c->fd = -1;
    c->is_unix = is_unix;
    c->st = ST_HDR;
    return c;
}

void kvp_segserver_fuzz_conn_free(kvp_segserver *s, struct conn *c) { conn_free(&s->w[0], c); }

int kvp_segserver_fuzz_feed(kvp_segserver *s, struct conn *c, const uint8_t *p, size_t n,
                            kvp_segserver_fuzz_answer_fn fn, void *arg)
{
    c->feed = p;
    c->feed_left = n;
    for (;;) {
        size_t before = c->feed_left;
        uint32_t queued = c->on;
        int rc = conn_input(&s->w[0], c);
        fuzz_check(s, c);
        int answered = c->on != queued;
        while (c->on) {
            const oitem *it = &c->outq[c->oh];
            fn(arg, it->head, it->hlen, it->data, it->dlen, it->pass_fd);
            c->oh = (c->oh + 1) % OUTQ;
            c->on--;
        }
        if (rc < 0 || c->st == ST_CLOSING)
            return 0;
        if (!c->feed_left)
            return 1;
        if (c->feed_left == before && !answered)
            abort(); /* wedged: input left, none read, nothing answered */
    }
}

#endif
