/*
 * service.c -- the master's epoll loop; see service.h.
 *
 * Connection states: OPEN (reading and answering) -> CLOSING (no more
 * reading; close once the output is flushed) -> closed. A connection is on
 * the `ready` list while it has complete frames it has not served yet
 * (budget used up, or output paused); the loop then polls without sleeping.
 */
#include "master/service.h"

#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "kvpool.h"
#include "master/master.h"
#include "net/net.h"
#include "proto/proto.h"

#define MOD "master"
#define FRAMES_PER_TURN 256           /* frames served per connection per turn */
#define READ_PER_TURN (1u << 20)      /* bytes read per connection per turn */
#define OUT_PAUSE (8u << 20)          /* stop serving input above this much unsent output */
#define ARENA_CAP (256u << 20)        /* decoded-request scratch per frame */
#define SUMMARY_MS 60000

typedef struct conn {
    int fd;
    int closing;
    int want_out;       /* EPOLLOUT registered */
    int on_ready;
    kvp_buf in, out;
    size_t out_off;     /* bytes of `out` already sent */
    kvp_msess sess;
    struct conn *prev, *next;   /* all connections */
    struct conn *ready_next;
    int on_pushed;
    struct conn *pushed_next;   /* connections with SEG_FREED output */
} conn;

struct kvp_mserver {
    kvp_config cfg;
    kvp_master *m;
    int ep, lfd, evfd, sigfd;
    uint16_t port;
    uint32_t nconns;
    conn *conns;
    conn *ready;
    conn *pushed;
    kvp_arena arena;
    uint64_t last_summary, last_requests, last_expired;
    volatile int stop;
};

static void conn_close(kvp_mserver *s, conn *c)
{
    kvp_master_sess_close(s->m, &c->sess, kvp_now_ms());
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev) c->prev->next = c->next; else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->on_ready) { /* unlink from the ready list */
        conn **pp = &s->ready;
        while (*pp && *pp != c)
            pp = &(*pp)->ready_next;
        if (*pp)
            *pp = c->ready_next;
    }
    kvp_buf_free(&c->in);
    kvp_buf_free(&c->out);
    kvp_free(c);
    s->nconns--;
}

static void set_out_interest(kvp_mserver *s, conn *c, int want)
{
    if (c->want_out == want)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want;
}

/* Sends what it can. -1 when the peer is gone (caller closes). */
static int conn_flush(kvp_mserver *s, conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        c->out_off += (size_t)n;
    }
    if (c->out_off == c->out.len) {
        kvp_buf_reset(&c->out);
        c->out_off = 0;
        kvp_buf_shrink(&c->out, 1u << 20);
        set_out_interest(s, c, 0);
    } else {
        set_out_interest(s, c, 1);
    }
    return 0;
}

/* Answers a frame that could not be served, echoing its request id when the
 * header was readable; the connection is closed after the flush. */
static void refuse(kvp_mserver *s, conn *c, int err)
{
    uint64_t req_id = 0;
    uint16_t op = 0;
    if (c->in.len >= KVP_FRAME_HDR) {
        const uint8_t *p = c->in.data;
        op = (uint16_t)(p[4] | (p[5] << 8));
        for (int i = 7; i >= 0; i--)
            req_id = (req_id << 8) | p[8 + i];
    }
    size_t off = kvp_frame_begin(&c->out, op, KVP_FLAG_RESPONSE, req_id, err);
    kvp_frame_end(&c->out, off);
    kvp_master_note_bad_frame(s->m);
    c->closing = 1;
    KVP_WARN(MOD, "connection fd %d: %s; closing it", c->fd, kvp_strerror(err));
}

/* Serves up to FRAMES_PER_TURN complete frames from c->in. Returns 1 when
 * complete frames remain (budget or output pause), else 0. */
static int conn_serve(kvp_mserver *s, conn *c)
{
    size_t pos = 0;
    int served = 0, more = 0;
    uint32_t max_frame = (uint32_t)s->cfg.max_frame;
    while (!c->closing) {
        if (served == FRAMES_PER_TURN || c->out.len - c->out_off >= OUT_PAUSE) {
            more = 1;
            break;
        }
        kvp_frame_hdr h;
        const uint8_t *body;
        int rc = kvp_frame_next(c->in.data + pos, c->in.len - pos, max_frame, &h, &body);
        if (rc == 0)
            break;
        if (rc < 0) {
            kvp_buf_consume(&c->in, pos);
            pos = 0;
            refuse(s, c, rc);
            break;
        }
        kvp_arena_reset(&s->arena);
        if (kvp_master_handle(s->m, &c->sess, &h, body, &s->arena, &c->out, kvp_now_ms()) != 0) {
            c->closing = 1;
            break;
        }
        pos += KVP_FRAME_HDR + (size_t)h.body_len;
        served++;
        if (c->sess.close_after)
            c->closing = 1;
    }
    kvp_buf_consume(&c->in, pos);
    if (c->in.len == 0)
        kvp_buf_shrink(&c->in, 1u << 20);
    return more;
}

/* Reads what is available (bounded), then serves. -1: close the connection. */
static int conn_readable(kvp_mserver *s, conn *c)
{
    size_t cap = c->in.cap, got = 0;
    while (got < READ_PER_TURN && !c->closing) {
        if (c->in.len == cap) {
            break; /* a whole frame fits `cap`: serve before reading more */
        }
        size_t want = cap - c->in.len < 65536 ? cap - c->in.len : 65536;
        if (kvp_buf_reserve(&c->in, want) != 0)
            return -1;
        ssize_t n = recv(c->fd, c->in.data + c->in.len, want, 0);
        if (n == 0)
            return -1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -1;
        }
        c->in.len += (size_t)n;
        got += (size_t)n;
        if ((size_t)n < want)
            break;
    }
    return 0;
}

static void mark_ready(kvp_mserver *s, conn *c, int more)
{
    if (more && !c->on_ready) {
        c->on_ready = 1;
        c->ready_next = s->ready;
        s->ready = c;
    }
}

/* After serving: flush, and close when finished or broken. */
static void conn_after(kvp_mserver *s, conn *c)
{
    if (conn_flush(s, c) < 0 || (c->closing && c->out.len == 0))
        conn_close(s, c);
}

/* The peer's address (not its port) hashed, for per-peer HELLO back-off. */
static uint64_t peer_hash(const struct sockaddr_storage *sa, socklen_t len)
{
    const void *p = NULL;
    size_t n = 0;
    if (sa->ss_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        p = &((const struct sockaddr_in *)sa)->sin_addr;
        n = sizeof(struct in_addr);
    } else if (sa->ss_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
        p = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        n = sizeof(struct in6_addr);
    }
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return n ? h | 1 : 0;
}

static void on_accept(kvp_mserver *s)
{
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t salen = sizeof sa;
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &salen, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                KVP_WARN(MOD, "accept: %s", strerror(errno));
            return;
        }
        if (s->nconns >= s->cfg.max_connections) {
            KVP_WARN(MOD, "connection refused: max_connections (%llu) reached",
                     (unsigned long long)s->cfg.max_connections);
            close(fd);
            continue;
        }
        conn *c = kvp_calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        kvp_net_set_nodelay(fd);
        kvp_buf_init(&c->in, s->cfg.max_frame + KVP_FRAME_HDR);
        kvp_buf_init(&c->out, s->cfg.max_frame + KVP_FRAME_HDR + OUT_PAUSE + 4096);
        kvp_master_sess_open(s->m, &c->sess);
        c->sess.peer = peer_hash(&sa, salen);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            close(fd);
            kvp_free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
    }
}

int kvp_mserver_create(const kvp_config *cfg, int handle_signals, kvp_mserver **out, char *err,
                       size_t errlen)
{
    kvp_mserver *s = kvp_calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    s->cfg = *cfg;
    s->ep = s->lfd = s->evfd = s->sigfd = -1;
    kvp_arena_init(&s->arena, ARENA_CAP);
    int rc = kvp_master_create(cfg, kvp_now_ms(), &s->m);
    if (rc) {
        snprintf(err, errlen, "cannot create the master: %s", kvp_strerror(rc));
        kvp_mserver_destroy(s);
        return rc;
    }
    rc = kvp_secret_listen_check(cfg->listen, cfg->cluster_token[0] || cfg->tenant_tokens_file[0],
                                 cfg->insecure, "the master", err, errlen);
    if (rc) {
        kvp_mserver_destroy(s);
        return rc;
    }
    s->lfd = kvp_net_listen(cfg->listen, 1024, &s->port, err, errlen);
    if (s->lfd < 0) {
        rc = s->lfd;
        s->lfd = -1;
        kvp_mserver_destroy(s);
        return rc;
    }
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (handle_signals) {
        sigset_t ss;
        sigemptyset(&ss);
        sigaddset(&ss, SIGTERM);
        sigaddset(&ss, SIGINT);
        s->sigfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
    }
    if (s->ep < 0 || s->evfd < 0 || (handle_signals && s->sigfd < 0)) {
        snprintf(err, errlen, "epoll/eventfd/signalfd: %s", strerror(errno));
        kvp_mserver_destroy(s);
        return KVP_EIO;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->lfd};
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &ev);
    ev.data.ptr = &s->evfd;
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->evfd, &ev);
    if (s->sigfd >= 0) {
        ev.data.ptr = &s->sigfd;
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->sigfd, &ev);
    }
    *out = s;
    return 0;
}

uint16_t kvp_mserver_port(const kvp_mserver *s) { return s->port; }

void kvp_mserver_stop(kvp_mserver *s)
{
    uint64_t one = 1;
    s->stop = 1;
    ssize_t w = write(s->evfd, &one, sizeof one);
    (void)w;
}

static void summary(kvp_mserver *s, uint64_t now)
{
    if (now - s->last_summary < SUMMARY_MS)
        return;
    s->last_summary = now;
    uint64_t st[KVP_STAT__COUNT];
    kvp_master_stats(s->m, st);
    if (st[KVP_STAT_REQUESTS] == s->last_requests)
        return;
    s->last_requests = st[KVP_STAT_REQUESTS];
    KVP_INFO(MOD,
             "objects %llu, used %llu/%llu MiB, clients %llu, segments %llu, hits %llu, "
             "misses %llu, evictions %llu, leases %llu, pending %llu, requests %llu",
             (unsigned long long)st[KVP_STAT_OBJECTS], (unsigned long long)(st[KVP_STAT_USED] >> 20),
             (unsigned long long)(st[KVP_STAT_CAPACITY] >> 20),
             (unsigned long long)st[KVP_STAT_CLIENTS], (unsigned long long)st[KVP_STAT_SEGMENTS],
             (unsigned long long)st[KVP_STAT_HITS], (unsigned long long)st[KVP_STAT_MISSES],
             (unsigned long long)st[KVP_STAT_EVICTIONS], (unsigned long long)st[KVP_STAT_LEASES],
             (unsigned long long)st[KVP_STAT_PENDING], (unsigned long long)st[KVP_STAT_REQUESTS]);
}

/* kvp_master_push_freed's callback: the node's connection output; the
 * connection joins s->pushed to be flushed. */
static kvp_buf *freed_out(kvp_msess *ms, void *ctx)
{
    kvp_mserver *s = ctx;
    conn *c = (conn *)((char *)ms - offsetof(conn, sess));
    if (c->closing)
        return NULL;
    if (!c->on_pushed) {
        c->on_pushed = 1;
        c->pushed_next = s->pushed;
        s->pushed = c;
    }
    return &c->out;
}

/* Tells nodes about frees and sends the notices. */
static void push_freed(kvp_mserver *s)
{
    kvp_master_push_freed(s->m, freed_out, s);
    while (s->pushed) {
        conn *c = s->pushed;
        s->pushed = c->pushed_next;
        c->on_pushed = 0;
        if (!c->want_out && conn_flush(s, c) < 0)
            c->closing = 1; /* closed at its next event (EPOLLHUP) */
    }
}

int kvp_mserver_run(kvp_mserver *s)
{
    struct epoll_event evs[128];
    uint32_t next_tick = 0;
    s->last_summary = kvp_now_ms();
    KVP_INFO(MOD, "listening on %s (port %u), lease_ttl %llu ms, client_ttl %llu ms",
             s->cfg.listen, s->port, (unsigned long long)s->cfg.lease_ttl_ms,
             (unsigned long long)s->cfg.client_ttl_ms);
    while (!s->stop) {
        int timeout = s->ready ? 0 : (int)next_tick;
        int n = epoll_wait(s->ep, evs, 128, timeout);
        if (n < 0 && errno != EINTR) {
            KVP_ERROR(MOD, "epoll_wait: %s", strerror(errno));
            return KVP_EIO;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &s->lfd) {
                on_accept(s);
            } else if (p == &s->evfd) {
                uint64_t v;
                ssize_t rd = read(s->evfd, &v, sizeof v);
                (void)rd;
            } else if (p == &s->sigfd) {
                struct signalfd_siginfo si;
                if (read(s->sigfd, &si, sizeof si) == sizeof si)
                    KVP_INFO(MOD, "signal %u: shutting down", si.ssi_signo);
                s->stop = 1;
            } else {
                conn *c = p;
                if (evs[i].events & (EPOLLERR | EPOLLHUP) && !(evs[i].events & EPOLLIN)) {
                    conn_close(s, c);
                    continue;
                }
                if ((evs[i].events & EPOLLIN) && !c->closing && !c->on_ready) {
                    if (conn_readable(s, c) < 0) {
                        conn_close(s, c);
                        continue;
                    }
                    mark_ready(s, c, conn_serve(s, c));
                }
                conn_after(s, c);
            }
        }
        /* connections with unserved frames from earlier turns; the list is
         * detached so each is served once per turn (conn_close unlinks from
         * s->ready, which is why this runs after the event loop above) */
        conn *r = s->ready;
        s->ready = NULL;
        while (r) {
            conn *c = r;
            r = r->ready_next;
            c->on_ready = 0;
            mark_ready(s, c, conn_serve(s, c));
            conn_after(s, c);
        }
        uint64_t now = kvp_now_ms();
        next_tick = kvp_master_tick(s->m, now);
        push_freed(s);
        uint64_t st[KVP_STAT__COUNT];
        kvp_master_stats(s->m, st);
        if (st[KVP_STAT_CLIENTS_EXPIRED] != s->last_expired) {
            s->last_expired = st[KVP_STAT_CLIENTS_EXPIRED];
            for (conn *c = s->conns, *nx; c; c = nx) { /* clients dropped by the TTL */
                nx = c->next;
                if (kvp_master_sess_dead(&c->sess))
                    conn_close(s, c);
            }
        }
        summary(s, now);
    }
    return 0;
}

void kvp_mserver_destroy(kvp_mserver *s)
{
    if (!s)
        return;
    while (s->conns)
        conn_close(s, s->conns);
    if (s->m)
        kvp_master_destroy(s->m);
    kvp_arena_free(&s->arena);
    if (s->lfd >= 0) close(s->lfd);
    if (s->ep >= 0) close(s->ep);
    if (s->evfd >= 0) close(s->evfd);
    if (s->sigfd >= 0) close(s->sigfd);
    kvp_free(s);
}
