/*
 * service.c -- the master's epoll loop; see service.h.
 *
 * Connection states: OPEN (reading and answering) -> CLOSING (no more
 * reading; close once the output is flushed) -> closed. An OPEN connection
 * is in one of these:
 *   reading      EPOLLIN watched; read, then serve
 *   ready        on the `ready` list: complete frames left after the frame
 *                budget; served next turn (the loop then polls without
 *                sleeping)
 *   out_paused   unsent output above OUT_PAUSE: neither read nor served,
 *                EPOLLIN off, until EPOLLOUT drains it to half of that
 *   starved      on the `starved` list: its next frame does not fit the
 *                input budget; EPOLLIN off until charges drop
 * Until HELLO a connection is also on the `hello` FIFO (deadline
 * hello_timeout, same for all, so only the head is ever checked) and on its
 * address's FIFO, may send bodies of at most PRE_HELLO_FRAME bytes, and
 * counts against the pre-HELLO caps (7/8 of max_connections;
 * max_connections_per_address). A new connection over a cap evicts the
 * oldest pre-HELLO connection (of its address, or of all), so idle or
 * reopened connections cannot keep a prompt HELLO out; only when every
 * candidate was accepted in this very turn (it has not been read yet) is
 * the new one closed instead. Connections that completed HELLO are never
 * evicted. Accepting runs after a turn's events, and a new connection is
 * read at once: a client's HELLO is usually there already.
 *
 *   held         a refused HELLO of a peer backing off (master.h,
 *                kvp_msess.hold_ms): its answer is in `out` but sent only
 *                after hold_ms (the `held` FIFO, one delay for all), the
 *                connection unread meanwhile. It stays pre-HELLO (counted,
 *                evictable), so holds are bounded by the pre-HELLO caps.
 *
 * Input budget: every connection's `charge` counts the bytes its input
 * buffer may hold (>= in.len), and all charges together stay within
 * input_memory_budget. A read first charges the whole frame in hand (its
 * header says how long it is), so an admitted frame can always complete;
 * the buffer's pages become resident only as bytes arrive.
 */
#include "master/service.h"

#include <errno.h>
#include <malloc.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "common/sys.h"
#include "kvpool.h"
#include "master/kvev.h"
#include "master/master.h"
#include "master/snapfile.h"
#include "master/status.h"
#include "net/net.h"
#include "proto/proto.h"

#define KV_PUB_EVENTS 65536 /* KV events held back for a fuller batch, at most */
#define MOD "master"
#define FRAMES_PER_TURN 256           /* frames served per connection per turn */
#define READ_PER_TURN (1u << 20)      /* bytes read per connection per turn */
#define READ_AHEAD 65536u             /* bytes read past the frame in hand, budget allowing */
#define OUT_PAUSE (8u << 20)          /* stop serving input above this much unsent output */
#define ARENA_CAP (256u << 20)        /* decoded-request scratch per frame */
#define PRE_HELLO_FRAME 65536u        /* largest body before HELLO (HELLO bodies are < 3 KiB) */
#define IN_SMALL (256u << 10)         /* charges up to this may use the whole input budget */
#define ACCEPT_PER_TURN 256           /* accepts per turn, refused ones included */
#define ACCEPT_PAUSE_MIN_MS 100       /* EMFILE back-off: 100 ms, doubling ... */
#define ACCEPT_PAUSE_MAX_MS 1000      /* ... up to 1 s */
#define SUMMARY_MS 60000
#define STANDBY_READ_MS 200           /* a standby waits this long for a peer's first frame */
#define SNAP_SYNC_MS 1000              /* snapshot file: fdatasync period */
#define SNAP_MIN (64ull << 20)        /* ... rewritten past this size and ... */
#define SNAP_GROWTH 4                 /* ... this many times its last snapshot */
#define SNAP_RETRY_MS 1000            /* a failed rewrite is tried again after this */
#define REPL_WINDOW (1u << 20)        /* a follower's snapshot is produced only while its
                                         unsent output is below this (backpressure) */
#define GATE_POLL_MS 20                /* loop wake-up while answers wait for standbys */
#define ALIVE_MS 100                  /* clients of connections held back: kept alive this often */
#define STATUS_MS 1000                /* the HTTP endpoint's picture: republished this often */
#define STALL_MS 500                  /* a turn this much later than its wait: a stall */

/* Connections before HELLO, counted per source address (IPv4 address, or
 * IPv6 /64: one host owns a whole /64) in a chained hash map. */
#define ADDR_KEY 9
struct conn;
typedef struct addr_ent {
    struct addr_ent *next;
    uint8_t key[ADDR_KEY];
    uint32_t n;                       /* pre-HELLO connections, new ones being admitted included */
    struct conn *head, *tail;         /* its pre-HELLO connections, by accept time */
} addr_ent;

typedef struct conn {
    int fd;
    int closing;
    int want_out;       /* unsent output: EPOLLOUT wanted */
    uint32_t events;    /* what epoll watches for it now */
    int on_ready;
    int out_paused;     /* unsent output passed OUT_PAUSE: input waits for EPOLLOUT */
    int starved;        /* on s->starved: its next frame waits for input budget */
    kvp_buf in, out;
    size_t out_off;     /* bytes of `out` already sent */
    size_t in_head;     /* in: bytes at its front already served (only while on_ready) */
    size_t scan;        /* in: offset of the first frame not known to be complete */
    size_t charge;      /* in: bytes counted against the input budget (>= in.len) */
    uint64_t accepted_ms;
    uint64_t accept_turn; /* the loop turn that accepted it (eviction spares that turn's) */
    addr_ent *addr;     /* until HELLO: its address's count; NULL after */
    struct conn *addr_prev, *addr_next; /* its address's pre-HELLO FIFO */
    int held;           /* on s->held: output held until release_ms */
    uint64_t release_ms;
    struct conn *held_prev, *held_next;
    kvp_msess sess;
    struct conn *prev, *next;           /* all connections */
    struct conn *ready_next;
    struct conn *hello_prev, *hello_next; /* pre-HELLO FIFO, by accept time */
    struct conn *starved_prev, *starved_next;
    int on_pushed;
    struct conn *pushed_next;   /* connections with SEG_FREED output */
    uint64_t gate;      /* ha_sync: its output waits until the standbys acknowledged
                           this seq (an answered PUT_END); 0 = none */
    int gated;          /* counted in s->ngated: output held by the gate */
    char peer_log[KVP_NET_PEERLEN]; /* "HOST:PORT", for its log lines (kvp_log_set_peer) */
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
    /* pre-HELLO connections: FIFO (the deadline is the same for all, so the
     * head expires first), count, per-address counts */
    conn *hello_head, *hello_tail;
    uint32_t npre, pre_cap;
    uint64_t turn;      /* loop turns so far */
    int accept_due;     /* the listener was readable this turn */
    conn *held_head, *held_tail; /* held answers, by release time */
    addr_ent **amap;
    uint32_t amask;
    uint64_t aseed;
    /* input budget: sum of all charges; connections waiting for it */
    size_t in_used, in_budget;
    conn *starved, *starved_tail;
    int in_freed;       /* a charge dropped this turn: try the starved */
    /* EMFILE back-off: 0, or when to watch the listener again */
    uint64_t accept_resume_ms;
    uint32_t accept_pause_ms;
    uint64_t n_refused, n_evicted, n_held, n_hello_timeouts, n_input_waits, logged_limits;
    kvp_arena arena;
    uint64_t last_summary, last_requests, last_expired;
    uint64_t longest_turn_ms; /* the longest turn's work (logged at the end) */
    _Atomic int stop; /* set by kvp_mserver_stop from any thread or a signal handler */
    _Atomic uint64_t term_until; /* a leader's term is valid until then (0 = no term) */
    _Atomic int term_over;       /* the loop stopped because term_until passed */
    uint64_t repl_acked;         /* seq every in-sync standby acknowledged */
    kvp_snapfile *snap;          /* cfg.snapshot_file, or NULL */
    pthread_t standby_th;        /* kvp_mserver_standby: answers HELLOs "not the leader" */
    _Atomic int standby_on;
    uint64_t snap_synced_ms;     /* its last fdatasync */
    kvp_msnap *snap_sn;          /* its rewrite in progress (over turns), or NULL */
    kvp_buf snap_part;           /* the rewrite's part of this turn */
    uint64_t snap_t0, snap_retry_ms; /* when the rewrite began; no new one before */
    uint32_t ngated;             /* connections whose output waits for them */
    kvp_mstatus *status;         /* cfg.http: what the HTTP endpoint shows, or NULL */
    kvp_kvpub *kvpub;            /* cfg.kv_events: the KV events' publisher, or NULL */
    uint64_t kv_pub_ms;          /* when this turn's events were last handed to it */
    uint64_t n_refused_by[KVP_MREFUSE__COUNT]; /* accept refusals by reason */
    uint64_t alive_ms;           /* keep_starved_alive's last pass */
    /* HTTP lookups (kvp_mserver_lookup): other threads queue them, the loop
     * answers them (lookups_serve); every lk_ field but lk_due under lk_mu */
    pthread_mutex_t lk_mu;
    pthread_cond_t lk_cv;        /* (CLOCK_MONOTONIC) answers given, or the loop stopped */
    struct lk_req *lk_head, *lk_tail;
    int lk_closed;               /* the loop stopped: no more answers */
    int lk_due;                  /* the loop's own: its eventfd fired this turn */
};

/* One query of kvp_mserver_lookup, on its caller's stack. */
typedef struct lk_req {
    const char *tenant;
    size_t tlen;
    const kvp_hchain *chain;
    kvp_hprefix out;
    int rc;                      /* 1 while queued; then 0 or < 0 */
    struct lk_req *next;
} lk_req;

static void status_publish(kvp_mserver *s, uint64_t now);
static void publish_events(kvp_mserver *s);

/* ---------------------------------------------------------- address map */

static void addr_key(const struct sockaddr_storage *ss, uint8_t key[ADDR_KEY])
{
    memset(key, 0, ADDR_KEY);
    if (ss->ss_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)ss)->sin6_addr.s6_addr;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (memcmp(a, v4mapped, 12) == 0) {
            key[0] = 4;
            memcpy(key + 1, a + 12, 4);
        } else {
            key[0] = 6;
            memcpy(key + 1, a, 8);
        }
    } else if (ss->ss_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } /* else (unix, unknown): all share key 0 */
}

static uint32_t addr_hash(const kvp_mserver *s, const uint8_t key[ADDR_KEY])
{
    uint64_t h = 1469598103934665603ull ^ s->aseed; /* FNV-1a, seeded */
    for (int i = 0; i < ADDR_KEY; i++)
        h = (h ^ key[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32)) & s->amask;
}

static addr_ent *addr_find(kvp_mserver *s, const uint8_t key[ADDR_KEY], int create)
{
    addr_ent **b = &s->amap[addr_hash(s, key)];
    for (addr_ent *e = *b; e; e = e->next)
        if (memcmp(e->key, key, ADDR_KEY) == 0)
            return e;
    if (!create)
        return NULL;
    addr_ent *e = kvp_calloc(1, sizeof *e);
    if (!e)
        return NULL;
    memcpy(e->key, key, ADDR_KEY);
    e->next = *b;
    *b = e;
    return e;
}

/* One pre-HELLO connection of e's address went away (HELLO or close). */
static void addr_release(kvp_mserver *s, addr_ent *e)
{
    if (--e->n)
        return;
    addr_ent **pp = &s->amap[addr_hash(s, e->key)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    kvp_free(e);
}

/* ------------------------------------------------------------- interest */

/* Input is read only while the connection is open, its output drains and
 * its next frame has budget; with EPOLLIN off, level-triggered epoll does
 * not report the bytes waiting, so a waiting connection costs nothing. */
static void conn_arm(kvp_mserver *s, conn *c)
{
    uint32_t ev = (!c->closing && !c->out_paused && !c->starved ? EPOLLIN : 0u) |
                  (c->want_out ? EPOLLOUT : 0u);
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

/* ---------------------------------------------------------- input budget */

static void in_set_charge(kvp_mserver *s, conn *c, size_t charge)
{
    if (charge < c->charge)
        s->in_freed = 1;
    s->in_used = s->in_used - c->charge + charge;
    c->charge = charge;
}

/* Raises c's charge to `total` if the budget allows: charges up to IN_SMALL
 * may use all of it, larger ones 15/16, so a few large frames waiting for
 * their bytes never lock small requests (HELLO, STATS) out. 1 granted. */
static int in_grant(kvp_mserver *s, conn *c, size_t total)
{
    if (total <= c->charge)
        return 1;
    size_t limit = total <= IN_SMALL ? s->in_budget : s->in_budget - s->in_budget / 16;
    if (s->in_used - c->charge + total > limit)
        return 0;
    in_set_charge(s, c, total);
    return 1;
}

/* The largest body c may send now: small until HELLO. */
static uint32_t frame_limit(const kvp_mserver *s, const conn *c)
{
    uint32_t max = (uint32_t)s->cfg.max_frame;
    return c->sess.client || max < PRE_HELLO_FRAME ? max : PRE_HELLO_FRAME;
}

/* What c->in must be able to hold before the next recv: through the end of
 * the first incomplete frame when its header is in, else through a header.
 * Advances c->scan over complete frames. -1 on a header serve will refuse
 * (nothing more is read; the refusal answers it). */
static int in_need(const kvp_mserver *s, conn *c, size_t *need)
{
    uint32_t lim = frame_limit(s, c);
    while (c->in.len - c->scan >= KVP_FRAME_HDR) {
        kvp_frame_hdr h;
        if (kvp_frame_hdr_decode(c->in.data + c->scan, lim, &h) != 0)
            return -1;
        size_t end = c->scan + KVP_FRAME_HDR + (size_t)h.body_len;
        if (end > c->in.len) {
            *need = end;
            return 0;
        }
        c->scan = end;
    }
    *need = c->scan + KVP_FRAME_HDR;
    return 0;
}

/* c waits, unread, until its next frame fits the budget (try_wake). */
static void starve(kvp_mserver *s, conn *c)
{
    c->starved = 1;
    c->starved_next = NULL;
    c->starved_prev = s->starved_tail;
    if (s->starved_tail)
        s->starved_tail->starved_next = c;
    else
        s->starved = c;
    s->starved_tail = c;
    s->n_input_waits++;
    conn_arm(s, c);
}

static void unstarve(kvp_mserver *s, conn *c)
{
    if (c->starved_prev) c->starved_prev->starved_next = c->starved_next;
    else s->starved = c->starved_next;
    if (c->starved_next) c->starved_next->starved_prev = c->starved_prev;
    else s->starved_tail = c->starved_prev;
    c->starved = 0;
    c->starved_prev = c->starved_next = NULL;
}

/* Grants a waiting connection its next frame if that fits now, and
 * watches its input again. The need is computed afresh: serving since it
 * began to wait moved its frame to the front of the buffer. One still on
 * the ready list is tried when it leaves it (conn_work). */
static void try_wake(kvp_mserver *s, conn *c)
{
    if (c->on_ready)
        return;
    size_t need;
    if (in_need(s, c, &need) < 0 || need > c->in.cap || in_grant(s, c, need)) {
        unstarve(s, c); /* (the first two: serve decides, as in conn_readable) */
        conn_arm(s, c);
    }
}

/* Connections waiting for input memory send nothing the master reads, not
 * for want of trying: their clients are kept alive (every ALIVE_MS). */
static void keep_starved_alive(kvp_mserver *s, uint64_t now)
{
    if (now - s->alive_ms < ALIVE_MS)
        return;
    s->alive_ms = now;
    for (conn *c = s->starved; c; c = c->starved_next)
        kvp_master_sess_alive(s->m, &c->sess, now);
}

/* After charges dropped: tries, oldest first, every waiting connection. */
static void wake_starved(kvp_mserver *s)
{
    if (!s->in_freed)
        return;
    s->in_freed = 0;
    for (conn *c = s->starved, *nx; c && s->in_used < s->in_budget; c = nx) {
        nx = c->starved_next;
        try_wake(s, c);
    }
}

/* After serving: what c->in still holds is charged; an empty buffer gives
 * its memory back (kept up to READ_AHEAD, which stays charged). A partial
 * frame keeps its whole charge, so a frame once admitted can always
 * complete. */
static void in_settle(kvp_mserver *s, conn *c)
{
    c->scan = 0;
    if (c->in.len == 0) {
        kvp_buf_shrink(&c->in, READ_AHEAD);
        in_set_charge(s, c, c->in.alloc < c->charge ? c->in.alloc : c->charge);
    }
}

/* ------------------------------------------------------------ pre-HELLO */

static void hello_unlink(kvp_mserver *s, conn *c)
{
    if (c->hello_prev) c->hello_prev->hello_next = c->hello_next;
    else s->hello_head = c->hello_next;
    if (c->hello_next) c->hello_next->hello_prev = c->hello_prev;
    else s->hello_tail = c->hello_prev;
    c->hello_prev = c->hello_next = NULL;
    addr_ent *e = c->addr;
    if (c->addr_prev) c->addr_prev->addr_next = c->addr_next;
    else e->head = c->addr_next;
    if (c->addr_next) c->addr_next->addr_prev = c->addr_prev;
    else e->tail = c->addr_prev;
    c->addr_prev = c->addr_next = NULL;
    addr_release(s, c->addr);
    c->addr = NULL;
    s->npre--;
}

/* A held answer is sent (release_held) or its connection closed. */
static void held_unlink(kvp_mserver *s, conn *c)
{
    if (c->held_prev) c->held_prev->held_next = c->held_next;
    else s->held_head = c->held_next;
    if (c->held_next) c->held_next->held_prev = c->held_prev;
    else s->held_tail = c->held_prev;
    c->held_prev = c->held_next = NULL;
    c->held = 0;
}

/* -------------------------------------------------------- connections */

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
    if (c->addr)
        hello_unlink(s, c);
    if (c->held)
        held_unlink(s, c);
    if (c->starved)
        unstarve(s, c);
    if (c->gated)
        s->ngated--;
    in_set_charge(s, c, 0);
    kvp_buf_free(&c->in);
    kvp_buf_free(&c->out);
    kvp_free(c);
    s->nconns--;
}

static void mark_ready(kvp_mserver *s, conn *c, int more)
{
    if (more && !c->on_ready) {
        c->on_ready = 1;
        c->ready_next = s->ready;
        s->ready = c;
    }
}

/* Sends what it can. -1 when the peer is gone (caller closes). Output
 * paused above OUT_PAUSE resumes once half of that is left: its unserved
 * frames go back on the ready list. */
static int conn_flush(kvp_mserver *s, conn *c)
{
    if (c->gate > s->repl_acked) { /* released by release_gated */
        if (!c->gated) {
            c->gated = 1;
            s->ngated++;
        }
        c->want_out = 0;
        conn_arm(s, c);
        return 0;
    }
    c->gate = 0;
    while (c->out_off < c->out.len) {
        ssize_t n = kvp_sys.send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
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
    }
    c->want_out = c->out.len > 0;
    if (c->out_paused && c->out.len - c->out_off <= OUT_PAUSE / 2) {
        c->out_paused = 0;
        mark_ready(s, c, 1);
    }
    conn_arm(s, c);
    return 0;
}

/* Appends an error answer to c->out, echoing the request id of the frame at
 * the head of c->in when its header is there; c closes after the flush. */
static void answer_error(conn *c, int err)
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
    c->closing = 1;
}

/* Answers a frame that could not be served; the connection is closed after
 * the flush. */
static void refuse(kvp_mserver *s, conn *c, int err)
{
    answer_error(c, err);
    kvp_master_note_bad_frame(s->m);
    KVP_WARN_LIMITED(MOD, "connection fd %d: %s%s; closing it", c->fd, kvp_strerror(err),
                     c->sess.client ? "" : " (before HELLO)");
}

/* A leader's term past its deadline (kvp_mserver_set_term): the term may
 * be another master's by now, so nothing more is answered and the loop
 * stops. 1 then, else 0. */
static int term_ran_out(kvp_mserver *s, uint64_t now)
{
    uint64_t until = s->term_until;
    if (!until || now < until)
        return 0;
    if (!s->term_over)
        KVP_ERROR(MOD, "the leader's term ran out %llu ms ago: answering nothing more",
                  (unsigned long long)(now - until));
    s->term_over = 1;
    kvp_mserver_stop(s);
    return 1;
}

/* For the HTTP endpoint: the frame's op, time, and the status of the
 * answer it appended at out_before (none for a ONEWAY request). */
static void note_op(kvp_mserver *s, const kvp_frame_hdr *h, uint64_t ns, const kvp_buf *out,
                    size_t out_before)
{
    int32_t status = 0;
    if (out->len >= out_before + KVP_FRAME_HDR) {
        const uint8_t *p = out->data + out_before + 20;
        status = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
    }
    kvp_mstatus_op(s->status, h->op, ns, status);
}

/* Serves up to FRAMES_PER_TURN complete frames from c->in; stops early when
 * the unsent output passes OUT_PAUSE (c->out_paused). Returns 1 when it
 * stopped for the frame budget with complete frames left, else 0. */
static int conn_serve(kvp_mserver *s, conn *c)
{
    size_t pos = c->in_head;
    int served = 0, more = 0;
    while (!c->closing && !c->sess.deferred) { /* deferred: its answer comes first */
        if (c->out.len - c->out_off >= OUT_PAUSE) {
            c->out_paused = 1;
            break;
        }
        if (served == FRAMES_PER_TURN) {
            more = 1;
            break;
        }
        kvp_frame_hdr h;
        const uint8_t *body;
        int rc = kvp_frame_next(c->in.data + pos, c->in.len - pos, frame_limit(s, c), &h, &body);
        if (rc == 0)
            break;
        if (rc < 0) {
            kvp_buf_consume(&c->in, pos);
            pos = 0;
            refuse(s, c, rc);
            break;
        }
        kvp_arena_reset(&s->arena);
        uint64_t now = kvp_now_ms();
        if (term_ran_out(s, now)) {
            c->closing = 1;
            break;
        }
        size_t out_before = c->out.len;
        uint64_t t0 = s->status ? kvp_now_ns() : 0;
        if (kvp_master_handle(s->m, &c->sess, &h, body, &s->arena, &c->out, now) != 0) {
            c->closing = 1;
            break;
        }
        if (s->status)
            note_op(s, &h, kvp_now_ns() - t0, &c->out, out_before);
        pos += KVP_FRAME_HDR + (size_t)h.body_len;
        served++;
        if (h.op == KVP_OP_PUT_END) { /* ha_sync in a cluster: 0 otherwise */
            uint64_t g = kvp_master_repl_gate(s->m);
            if (g > c->gate)
                c->gate = g;
        }
        if (c->sess.close_after)
            c->closing = 1;
    }
    /* Served frames stay in place while complete ones are left: a memmove
     * of the rest every FRAMES_PER_TURN frames would make a long pipeline
     * of small frames quadratic. */
    if (more) {
        c->in_head = pos;
    } else {
        kvp_buf_consume(&c->in, pos);
        c->in_head = 0;
    }
    return more;
}

/* The core asked to delay c's answer (a refused HELLO of a peer backing
 * off; it closes after): c joins the tail of the held FIFO, unread. The
 * delay is the same for every hold, so the FIFO is in release order. */
static void hold(kvp_mserver *s, conn *c, uint64_t now)
{
    c->held = 1;
    c->release_ms = now + c->sess.hold_ms;
    c->sess.hold_ms = 0;
    c->held_next = NULL;
    c->held_prev = s->held_tail;
    if (s->held_tail)
        s->held_tail->held_next = c;
    else
        s->held_head = c;
    s->held_tail = c;
    s->n_held++;
    c->closing = 1; /* (the core set close_after too) */
    conn_arm(s, c);
}

/* Serves c and settles what serving changed: HELLO bookkeeping, the input
 * charge, the ready list. The caller flushes (conn_after). */
static void conn_work(kvp_mserver *s, conn *c)
{
    int more = conn_serve(s, c);
    if (c->addr && c->sess.client)
        hello_unlink(s, c); /* authenticated: no deadline, not counted per address */
    if (c->sess.hold_ms)
        hold(s, c, kvp_now_ms());
    in_settle(s, c);
    mark_ready(s, c, more);
    if (c->starved && !more)
        try_wake(s, c);
}

/* Reads what is available: at most READ_PER_TURN, only into budget granted
 * (the frame in hand whole, plus READ_AHEAD when it fits). When the next
 * frame does not fit, c waits unread (starve). -1: close the connection. */
static int conn_readable(kvp_mserver *s, conn *c)
{
    size_t got = 0;
    while (got < READ_PER_TURN && !c->closing) {
        size_t need;
        if (in_need(s, c, &need) < 0 || need > c->in.cap)
            break; /* a header to refuse, or frames to serve before more fits */
        size_t target = c->in.len + READ_AHEAD < c->in.cap ? c->in.len + READ_AHEAD : c->in.cap;
        if (target < need)
            target = need;
        if (!in_grant(s, c, target)) {
            target = need;
            if (!in_grant(s, c, need)) {
                starve(s, c);
                break;
            }
        }
        size_t want = target - c->in.len;
        if (want > READ_PER_TURN - got)
            want = READ_PER_TURN - got;
        if (kvp_buf_reserve(&c->in, target - c->in.len) != 0)
            return -1;
        ssize_t n = kvp_sys.recv(c->fd, c->in.data + c->in.len, want, 0);
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
    if (got && c->sess.client) /* a large frame arriving slowly is not silence */
        kvp_master_sess_alive(s->m, &c->sess, kvp_now_ms());
    return 0;
}

/* After serving: flush, and close when finished or broken. 1 when c was
 * closed (freed). */
static int conn_after(kvp_mserver *s, conn *c)
{
    if (c->held)
        return 0; /* release_held flushes it */
    if (conn_flush(s, c) < 0 || (c->closing && c->out.len == 0)) {
        conn_close(s, c);
        return 1;
    }
    return 0;
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

/* -------------------------------------------------------------- accept */

/* Closes c, a pre-HELLO connection, to make room for a new one. */
static void evict(kvp_mserver *s, conn *c, const char *why)
{
    const char *prev = kvp_log_get_peer();
    kvp_log_set_peer(c->peer_log);
    s->n_evicted++;
    KVP_WARN_LIMITED(MOD, "connection fd %d from %s closed before HELLO: %s", c->fd,
                     c->sess.peer_addr, why);
    conn_close(s, c);
    kvp_log_set_peer(prev);
}

/* May `c`, the oldest pre-HELLO connection of a set, make room? Not when
 * it was accepted this turn: it has not been read yet, and a client's
 * HELLO may be in its buffer. */
static int evictable(const kvp_mserver *s, const conn *c)
{
    return c && c->accept_turn != s->turn;
}

/*
 * Why a new connection from ss must be closed at once, or NULL; on NULL
 * *ent is its address's count, already incremented. Over a pre-HELLO cap
 * (all of them, or its address's) or max_connections, the oldest pre-HELLO
 * connection of that set is evicted to make room; the new one is refused
 * only when there is none to evict (all completed HELLO, or all came in
 * this turn).
 */
static const char *admit(kvp_mserver *s, const struct sockaddr_storage *ss, addr_ent **ent,
                         int *reason)
{
    *reason = KVP_MREFUSE_MAX_CONNS;
    if (s->nconns >= s->cfg.max_connections) {
        if (!evictable(s, s->hello_head))
            return "max_connections reached";
        evict(s, s->hello_head, "max_connections reached; a newer connection came");
    }
    *reason = KVP_MREFUSE_PRE_HELLO;
    if (s->npre >= s->pre_cap) {
        if (!evictable(s, s->hello_head))
            return "connections before HELLO at 7/8 of max_connections";
        evict(s, s->hello_head, "connections before HELLO at 7/8 of max_connections");
    }
    uint8_t key[ADDR_KEY];
    addr_key(ss, key);
    addr_ent *e = addr_find(s, key, 1);
    *reason = KVP_MREFUSE_MEMORY;
    if (!e)
        return "out of memory";
    *reason = KVP_MREFUSE_PER_ADDR;
    e->n++; /* counted first: evicting the last other one must not free e */
    if (e->n > s->cfg.max_conns_per_addr) {
        if (!evictable(s, e->head)) {
            addr_release(s, e);
            return "max_connections_per_address reached";
        }
        evict(s, e->head, "max_connections_per_address reached; a newer connection came");
    }
    *ent = e;
    return NULL;
}

/* The peer's address as text, for log lines and back-off answers. */
static void peer_text(const struct sockaddr_storage *ss, char *out, size_t outlen)
{
    const void *a = NULL;
    int fam = ss->ss_family;
    if (fam == AF_INET)
        a = &((const struct sockaddr_in *)ss)->sin_addr;
    else if (fam == AF_INET6)
        a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
    if (!a || !inet_ntop(fam, a, out, (socklen_t)outlen))
        snprintf(out, outlen, "?");
}

/* A new connection: pre-HELLO, at the tails of the deadline FIFO and its
 * address's FIFO. NULL when it could not be set up (fd closed). */
static conn *conn_open(kvp_mserver *s, int fd, addr_ent *e, const struct sockaddr_storage *ss,
                       socklen_t sl, uint64_t now)
{
    conn *c = kvp_calloc(1, sizeof *c);
    if (!c) {
        addr_release(s, e);
        close(fd);
        return NULL;
    }
    c->fd = fd;
    kvp_net_set_nodelay(fd);
    kvp_buf_init(&c->in, s->cfg.max_frame + KVP_FRAME_HDR);
    kvp_buf_init(&c->out, s->cfg.max_frame + KVP_FRAME_HDR + OUT_PAUSE + 4096);
    c->events = EPOLLIN;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        addr_release(s, e);
        close(fd);
        kvp_free(c);
        return NULL;
    }
    kvp_master_sess_open(s->m, &c->sess);
    c->sess.peer = peer_hash(ss, sl);
    peer_text(ss, c->sess.peer_addr, sizeof c->sess.peer_addr);
    kvp_net_peer_text(ss, c->peer_log, sizeof c->peer_log);
    c->accepted_ms = now;
    c->accept_turn = s->turn;
    c->addr = e;
    c->hello_prev = s->hello_tail;
    if (s->hello_tail)
        s->hello_tail->hello_next = c;
    else
        s->hello_head = c;
    s->hello_tail = c;
    c->addr_prev = e->tail;
    if (e->tail)
        e->tail->addr_next = c;
    else
        e->head = c;
    e->tail = c;
    s->npre++;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    return c;
}

static void conn_event(kvp_mserver *s, conn *c, uint32_t events);

/* Out of descriptors (or kernel memory): stop watching the listener for a
 * while, doubling, instead of being woken for the same error at once. */
static void accept_pause(kvp_mserver *s, int e, uint64_t now)
{
    s->accept_pause_ms = s->accept_pause_ms ? s->accept_pause_ms * 2 : ACCEPT_PAUSE_MIN_MS;
    if (s->accept_pause_ms > ACCEPT_PAUSE_MAX_MS)
        s->accept_pause_ms = ACCEPT_PAUSE_MAX_MS;
    s->accept_resume_ms = now + s->accept_pause_ms;
    struct epoll_event ev = {.events = 0, .data.ptr = &s->lfd};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, s->lfd, &ev);
    KVP_WARN_LIMITED(MOD, "accept: %s; not accepting for %u ms", strerror(e), s->accept_pause_ms);
}

static void accept_resume(kvp_mserver *s, uint64_t now)
{
    if (!s->accept_resume_ms || now < s->accept_resume_ms)
        return;
    s->accept_resume_ms = 0;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->lfd};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, s->lfd, &ev);
}

/* Accepts up to ACCEPT_PER_TURN connections, after the turn's events (an
 * eviction must not free a connection whose event is still to come); one
 * that cannot be admitted is accepted and closed at once (counted), so the
 * kernel's backlog never fills. Each new connection is read at once. */
static void on_accept(kvp_mserver *s, uint64_t now)
{
    for (int i = 0; i < ACCEPT_PER_TURN; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = kvp_sys.accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EINTR || e == ECONNABORTED)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM)
                accept_pause(s, e, now);
            else if (e != EAGAIN && e != EWOULDBLOCK)
                KVP_WARN_LIMITED(MOD, "accept: %s", strerror(e));
            return;
        }
        s->accept_pause_ms = 0;
        addr_ent *e = NULL;
        int reason;
        const char *why = admit(s, &ss, &e, &reason);
        if (why) {
            char pl[KVP_NET_PEERLEN];
            kvp_net_peer_text(&ss, pl, sizeof pl);
            kvp_log_set_peer(pl);
            s->n_refused++;
            s->n_refused_by[reason]++;
            KVP_WARN_LIMITED(MOD, "connection refused: %s", why);
            kvp_log_set_peer(NULL);
            close(fd);
            continue;
        }
        conn *c = conn_open(s, fd, e, &ss, sl, now);
        if (c)
            conn_event(s, c, EPOLLIN);
    }
}

/* Closes, with an error answer, every connection whose HELLO deadline has
 * passed: the FIFO's head is the oldest, so this stops at the first that
 * is still in time. */
static void expire_hellos(kvp_mserver *s, uint64_t now)
{
    while (s->hello_head && now - s->hello_head->accepted_ms >= s->cfg.hello_timeout_ms) {
        conn *c = s->hello_head;
        if (c->held) { /* its answer is due anyway */
            held_unlink(s, c);
            if (!conn_after(s, c))
                hello_unlink(s, c); /* output still to send; closes once it is */
            continue;
        }
        s->n_hello_timeouts++;
        kvp_log_set_peer(c->peer_log);
        KVP_WARN_LIMITED(MOD, "connection fd %d: no HELLO within %llu ms; closing it", c->fd,
                         (unsigned long long)s->cfg.hello_timeout_ms);
        kvp_buf_reset(&c->in); /* answer with request id 0: the frame in hand is not served */
        c->in_head = 0;
        answer_error(c, KVP_ENO_HELLO);
        conn_flush(s, c); /* best effort */
        conn_close(s, c);
        kvp_log_set_peer(NULL);
    }
}

/* Sends the held answers that are due (their connections close after). */
static void release_held(kvp_mserver *s, uint64_t now)
{
    while (s->held_head && s->held_head->release_ms <= now) {
        conn *c = s->held_head;
        held_unlink(s, c);
        conn_after(s, c);
    }
}

/* How long the loop may sleep: 0 with work on the ready list, else until
 * the core's next tick, the oldest HELLO deadline, the first held answer
 * or the accept resume. */
static int wait_ms(const kvp_mserver *s, uint32_t next_tick, uint64_t now)
{
    if (s->ready)
        return 0;
    uint64_t t = next_tick;
    if (s->hello_head) {
        uint64_t due = s->hello_head->accepted_ms + s->cfg.hello_timeout_ms;
        uint64_t d = due > now ? due - now : 0;
        if (d < t)
            t = d;
    }
    if (s->held_head) {
        uint64_t d = s->held_head->release_ms > now ? s->held_head->release_ms - now : 0;
        if (d < t)
            t = d;
    }
    if (s->accept_resume_ms) {
        uint64_t d = s->accept_resume_ms > now ? s->accept_resume_ms - now : 0;
        if (d < t)
            t = d;
    }
    if (s->ngated && t > GATE_POLL_MS) /* a standby that stops answering is noticed */
        t = GATE_POLL_MS;
    if (s->status && t > STATUS_MS) /* the HTTP endpoint's picture stays fresh */
        t = STATUS_MS;
    if (s->kvpub && t > 1 && kvp_master_events_pending(s->m)) /* events go out within 1 ms */
        t = 1;
    return (int)t;
}

static void snap_rewrite(kvp_mserver *s);

static int snap_apply(void *ctx, const uint8_t *body, size_t len)
{
    uint64_t seq;
    return kvp_master_repl_apply(ctx, body, len, &seq);
}

/* Loads the snapshot file into the parked index (the objects come back as
 * their segments mount, as after a takeover) and rewrites it compact. */
static int snap_open(kvp_mserver *s, char *err, size_t errlen)
{
    uint64_t frames = 0, t0 = kvp_now_ms();
    int rc = kvp_snapfile_open(s->cfg.snapshot_file, snap_apply, s->m, &frames, &s->snap, err,
                               errlen);
    if (rc)
        return rc;
    uint64_t st[KVP_STAT__COUNT];
    kvp_master_stats(s->m, st);
    if (st[KVP_STAT_PARKED]) {
        KVP_INFO(MOD, "snapshot_file %s: %llu objects in %llu frames loaded in %llu ms",
                 s->cfg.snapshot_file, (unsigned long long)st[KVP_STAT_PARKED],
                 (unsigned long long)frames, (unsigned long long)(kvp_now_ms() - t0));
        kvp_master_takeover(s->m, kvp_now_ms());
    }
    snap_rewrite(s);
    s->snap_synced_ms = kvp_now_ms();
    return 0;
}

/* Binds the KV events' sockets (cfg.kv_events, kv_events_replay). With
 * tenant_tokens_file each tenant's events need its credential (ZeroMQ's
 * PLAIN, master/kvev.h); beyond loopback they need `insecure` all the
 * same: PLAIN sends the token in the clear. 0 or < 0 with err. */
static int events_open(kvp_mserver *s, const kvp_config *cfg, char *err, size_t errlen)
{
    const char *eps[2] = {cfg->kv_events, cfg->kv_events_replay};
    for (int i = 0; i < 2; i++) {
        if (!eps[i][0])
            continue;
        int rc = kvp_secret_listen_check(eps[i] + 6 /* "tcp://" */, !cfg->tenant_tokens_file[0],
                                         cfg->insecure, i ? "the KV events' replay" : "the KV events",
                                         err, errlen);
        if (rc)
            return rc;
    }
    kvp_kvpub_cfg pc = {.pub = cfg->kv_events,
                        .replay = cfg->kv_events_replay,
                        .buffer_batches = (uint32_t)cfg->kv_events_buffer};
    kvp_tenant_cred *tc = NULL;
    kvp_kvpub_tenant *pt = NULL;
    size_t nt = 0;
    if (cfg->tenant_tokens_file[0]) { /* the master loaded it already: it is good */
        int rc = kvp_secret_tenants_load(cfg->tenant_tokens_file, &tc, &nt, err, errlen);
        if (rc)
            return rc;
        if (nt && !(pt = kvp_calloc(nt, sizeof *pt))) {
            explicit_bzero(tc, nt * sizeof *tc);
            kvp_free(tc);
            return KVP_ENOMEM;
        }
        for (size_t i = 0; i < nt; i++)
            pt[i] = (kvp_kvpub_tenant){tc[i].tenant, tc[i].token};
        pc.tenants = pt;
        pc.ntenants = nt;
    }
    int rc = kvp_kvpub_create(&pc, &s->kvpub, err, errlen);
    kvp_free(pt);
    if (tc)
        explicit_bzero(tc, nt * sizeof *tc);
    kvp_free(tc);
    if (rc)
        return rc;
    const char *r = kvp_kvpub_replay_endpoint(s->kvpub);
    KVP_INFO(MOD, "KV events on %s%s%s%s", kvp_kvpub_pub_endpoint(s->kvpub),
             r[0] ? ", replay on " : "", r,
             nt ? " (each tenant's with its token: ZeroMQ PLAIN)" : "");
    return 0;
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
    pthread_mutex_init(&s->lk_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->lk_cv, &ca);
    pthread_condattr_destroy(&ca);
    /* Connection buffers of large frames are freed when the frame is
     * served; a fixed mmap threshold (glibc raises its own after every such
     * free) keeps them mmapped, so their memory goes back to the system
     * instead of staying in the heap after a burst (or an attack) ends. */
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    s->ep = s->lfd = s->evfd = s->sigfd = -1;
    kvp_arena_init(&s->arena, ARENA_CAP);
    /* 1/8 of the connections is kept for those that completed HELLO */
    s->pre_cap = (uint32_t)(cfg->max_connections - cfg->max_connections / 8);
    /* kvp_config_validate refuses a budget whose 15/16 cannot hold one
     * largest frame; a config that skipped it gets the least that can */
    s->in_budget = (size_t)cfg->input_budget;
    size_t least = (size_t)(cfg->max_frame + KVP_FRAME_HDR) / 15 * 16 + 16;
    if (s->in_budget < least)
        s->in_budget = least;
    uint32_t nb = 64;
    while (nb < cfg->max_connections && nb < (1u << 16))
        nb <<= 1;
    s->amask = nb - 1;
    s->aseed = kvp_now_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)s;
    s->amap = kvp_calloc(nb, sizeof *s->amap);
    if (!s->amap) {
        snprintf(err, errlen, "out of memory");
        kvp_mserver_destroy(s);
        return KVP_ENOMEM;
    }
    int rc = kvp_master_create(cfg, kvp_now_ms(), &s->m);
    if (rc) {
        snprintf(err, errlen, "cannot create the master: %s", kvp_strerror(rc));
        kvp_mserver_destroy(s);
        return rc;
    }
    if (cfg->snapshot_file[0] && (rc = snap_open(s, err, errlen)) != 0) {
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
    if (cfg->kv_events[0] && (rc = events_open(s, cfg, err, errlen)) != 0) {
        kvp_mserver_destroy(s);
        return rc;
    }
    if (cfg->http[0]) {
        char host[256], where[300];
        uint16_t ignored;
        kvp_net_split(cfg->listen, host, sizeof host, &ignored);
        snprintf(where, sizeof where, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, s->port);
        if (!(s->status = kvp_mstatus_new(where))) {
            snprintf(err, errlen, "out of memory");
            kvp_mserver_destroy(s);
            return KVP_ENOMEM;
        }
        /* with etcd it stands by until kvp_mserver_takeover */
        kvp_mstatus_role(s->status, cfg->etcd[0] ? KVP_MROLE_STANDBY : KVP_MROLE_SINGLE);
        status_publish(s, kvp_now_ms());
    }
    *out = s;
    return 0;
}

uint16_t kvp_mserver_port(const kvp_mserver *s) { return s->port; }
uint64_t kvp_mserver_master_id(const kvp_mserver *s) { return kvp_master_id(s->m); }

void kvp_mserver_set_term(kvp_mserver *s, uint64_t valid_until_ms) { s->term_until = valid_until_ms; }
int kvp_mserver_term_over(const kvp_mserver *s) { return s->term_over; }

/* A standby's listener: every connection gets its first frame answered
 * KVP_EAGAIN ("not the leader", the record the peer followed is stale),
 * then closed, so it looks the leader up again at once instead of waiting
 * out its HELLO timeout. */
static void standby_answer(int fd)
{
    uint8_t h[KVP_FRAME_HDR];
    size_t got = 0;
    uint64_t t0 = kvp_now_ms();
    while (got < sizeof h && kvp_now_ms() - t0 < STANDBY_READ_MS) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, STANDBY_READ_MS) <= 0)
            break;
        ssize_t n = recv(fd, h + got, sizeof h - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got == sizeof h) {
        uint64_t req_id = 0;
        for (int i = 7; i >= 0; i--)
            req_id = (req_id << 8) | h[8 + i];
        uint8_t out[KVP_FRAME_HDR + 16];
        kvp_buf b = {out, 0, sizeof out, sizeof out, 0};
        size_t off = kvp_frame_begin(&b, (uint16_t)(h[4] | (h[5] << 8)), KVP_FLAG_RESPONSE,
                                     req_id, KVP_EAGAIN);
        kvp_frame_end(&b, off);
        if (!b.err)
            (void)!send(fd, out, b.len, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close(fd);
}

static void *standby_main(void *arg)
{
    kvp_mserver *s = arg;
    while (s->standby_on) {
        struct pollfd p = {s->lfd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd;
        while ((fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0)
            standby_answer(fd);
    }
    return NULL;
}

/* The HTTP endpoint's picture, from the thread that owns the core. */
static void status_publish(kvp_mserver *s, uint64_t now)
{
    kvp_msvc v = {.conns = s->nconns,
                  .input_waits = s->n_input_waits,
                  .input_used = s->in_used,
                  .input_budget = s->in_budget,
                  .turns = s->turn,
                  .longest_turn_ms = s->longest_turn_ms,
                  .master_id = kvp_master_id(s->m)};
    if (s->kvpub) {
        kvp_kvpub_stats ks;
        kvp_kvpub_stats_get(s->kvpub, &ks);
        v.kv_events = 1;
        v.kv_sent = ks.batches;
        v.kv_dropped = ks.dropped;
        v.kv_replays = ks.replays;
        v.kv_replayed = ks.replayed_batches;
    }
    memcpy(v.refused, s->n_refused_by, sizeof v.refused);
    v.refused[KVP_MREFUSE_EVICTED] = s->n_evicted;
    v.refused[KVP_MREFUSE_HELLO_TIMEOUT] = s->n_hello_timeouts;
    v.refused[KVP_MREFUSE_HELLO_BACKOFF] = s->n_held;
    kvp_mstatus_publish(s->status, s->m, &v, now);
}

kvp_mstatus *kvp_mserver_status(kvp_mserver *s) { return s->status; }

void kvp_mserver_standby(kvp_mserver *s, int on)
{
    if (s->status && on)
        kvp_mstatus_role(s->status, KVP_MROLE_STANDBY);
    if (on && !s->standby_on) {
        s->standby_on = 1;
        if (pthread_create(&s->standby_th, NULL, standby_main, s) != 0)
            s->standby_on = 0;
    } else if (!on && s->standby_on) {
        s->standby_on = 0;
        pthread_join(s->standby_th, NULL);
    }
}

int kvp_mserver_repl_apply(kvp_mserver *s, const uint8_t *body, size_t len, uint64_t *seq)
{
    int rc = kvp_master_repl_apply(s->m, body, len, seq);
    uint64_t now = kvp_now_ms();
    if (s->status && kvp_mstatus_due(s->status, now)) /* the follower owns the core now */
        status_publish(s, now);
    return rc;
}

void kvp_mserver_takeover(kvp_mserver *s)
{
    kvp_master_takeover(s->m, kvp_now_ms());
    if (s->snap)
        snap_rewrite(s); /* the leader's picture it followed, not its own old one */
    if (s->status) {
        kvp_mstatus_role(s->status, KVP_MROLE_LEADER);
        status_publish(s, kvp_now_ms());
    }
}

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
    uint64_t lim = s->n_refused + s->n_evicted + s->n_held + s->n_hello_timeouts + s->n_input_waits;
    if (lim != s->logged_limits) {
        s->logged_limits = lim;
        KVP_INFO(MOD,
                 "limits so far: %llu connections refused, %llu evicted before HELLO for newer "
                 "ones, %llu refused HELLOs answered late (back-off), %llu closed without HELLO, "
                 "%llu waits for input memory (%zu of %zu bytes in use)",
                 (unsigned long long)s->n_refused, (unsigned long long)s->n_evicted,
                 (unsigned long long)s->n_held, (unsigned long long)s->n_hello_timeouts,
                 (unsigned long long)s->n_input_waits, s->in_used, s->in_budget);
    }
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

/* ------------------------------------------------------ HTTP lookups */

int kvp_mserver_lookup(kvp_mserver *s, const char *tenant, size_t tlen, const kvp_hchain *c,
                       kvp_hprefix *out, uint32_t wait_ms)
{
    lk_req q = {.tenant = tenant, .tlen = tlen, .chain = c, .rc = 1};
    struct timespec dl = kvp_deadline_ms(wait_ms);
    pthread_mutex_lock(&s->lk_mu);
    if (s->lk_closed) {
        pthread_mutex_unlock(&s->lk_mu);
        return KVP_ECLOSED;
    }
    if (s->lk_tail)
        s->lk_tail->next = &q;
    else
        s->lk_head = &q;
    s->lk_tail = &q;
    uint64_t one = 1; /* the loop wakes after the query is in: lookups_serve finds it */
    ssize_t w = write(s->evfd, &one, sizeof one);
    (void)w;
    while (q.rc == 1)
        if (pthread_cond_timedwait(&s->lk_cv, &s->lk_mu, &dl) == ETIMEDOUT && q.rc == 1) {
            lk_req **pp = &s->lk_head, *prev = NULL; /* withdrawn: the loop never sees it */
            while (*pp != &q) {
                prev = *pp;
                pp = &(*pp)->next;
            }
            *pp = q.next;
            if (s->lk_tail == &q)
                s->lk_tail = prev;
            q.rc = KVP_ERPC_TIMEOUT;
        }
    pthread_mutex_unlock(&s->lk_mu);
    if (q.rc == 0)
        *out = q.out;
    return q.rc;
}

/* The loop, once per turn its eventfd fired: answers every query queued.
 * Under the mutex: a query's memory is its caller's, who waits for it (or
 * withdraws it) under the same mutex. A lookup is at most 4096 hashes. */
static void lookups_serve(kvp_mserver *s, uint64_t now)
{
    pthread_mutex_lock(&s->lk_mu);
    if (s->lk_head && !term_ran_out(s, now)) { /* past the term: released as the loop stops */
        for (lk_req *q = s->lk_head; q; q = q->next) {
            kvp_master_lookup(s->m, q->tenant, q->tlen, q->chain, &q->out);
            q->rc = 0;
        }
        s->lk_head = s->lk_tail = NULL;
        pthread_cond_broadcast(&s->lk_cv);
    }
    pthread_mutex_unlock(&s->lk_mu);
}

/* The loop stopped: queries waiting are released, later ones refused. */
static void lookups_close(kvp_mserver *s)
{
    pthread_mutex_lock(&s->lk_mu);
    s->lk_closed = 1;
    for (lk_req *q = s->lk_head; q; q = q->next)
        q->rc = KVP_ECLOSED;
    s->lk_head = s->lk_tail = NULL;
    pthread_cond_broadcast(&s->lk_cv);
    pthread_mutex_unlock(&s->lk_mu);
}

/* kvp_master_take_events's sink: one batch to the publisher, which copies
 * it (a full queue drops it: a gap its subscribers see and mend). */
static void event_sink(void *ctx, const char *topic, size_t topic_len, uint64_t seq,
                       const kvp_kvev *ev, uint32_t n)
{
    kvp_mserver *s = ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int rc = kvp_kvpub_submit(s->kvpub, topic, topic_len, seq,
                              (double)ts.tv_sec + (double)ts.tv_nsec / 1e9, ev, n);
    if (rc)
        KVP_WARN_LIMITED(MOD, "a KV event batch (%u events) was dropped: %s", n,
                         kvp_strerror(rc));
}

/* The KV events of this turn go out, once per turn. */
static void publish_events(kvp_mserver *s) { kvp_master_take_events(s->m, event_sink, s); }

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

/* A follower's output drops what was sent once that is at least as much
 * as what is left (amortised: the bytes moved are at most the bytes sent),
 * so its buffer holds about its unsent bytes, which its share of
 * repl_buffer_budget bounds. */
static void repl_compact(conn *c)
{
    if (c->out_off && c->out_off >= c->out.len - c->out_off) {
        kvp_buf_consume(&c->out, c->out_off);
        c->out_off = 0;
    }
}

/* A follower whose output could not take the index stream is cut off. */
static int repl_cut(conn *c)
{
    if (!c->out.err)
        return 0;
    KVP_WARN(MOD, "standby %s: its unsent index stream would pass its share of "
                  "repl_buffer_budget (%zu bytes): cutting it off (it follows again)",
             c->sess.peer_addr, c->out.cap);
    c->closing = 1;
    return 1;
}

/* kvp_master_push_repl's callback: a follower's output. Past its bound the
 * standby is cut off (it follows again, from a snapshot). */
static void repl_send(kvp_msess *ms, const void *p, size_t n, void *ctx)
{
    kvp_mserver *s = ctx;
    if (!ms) { /* the snapshot file's copy */
        if (s->snap)
            kvp_snapfile_append(s->snap, p, n);
        return;
    }
    conn *c = (conn *)((char *)ms - offsetof(conn, sess));
    if (c->closing)
        return;
    repl_compact(c);
    kvp_buf_put(&c->out, p, n);
    if (repl_cut(c))
        return;
    freed_out(ms, s); /* joins s->pushed: flushed by push_freed */
}

/* kvp_master_push_snaps's callback: a follower's output while its unsent
 * bytes are below REPL_WINDOW, else NULL (the rest waits for the socket
 * to drain: EPOLLOUT). */
static kvp_buf *snap_out(kvp_msess *ms, void *ctx)
{
    conn *c = (conn *)((char *)ms - offsetof(conn, sess));
    if (c->closing || repl_cut(c) || c->out.len - c->out_off >= REPL_WINDOW)
        return NULL;
    repl_compact(c);
    return freed_out(ms, ctx); /* joins s->pushed: flushed by push_freed */
}

/* Writes a fresh snapshot over the snapshot file, in one go (before the
 * loop runs, and at shutdown). */
static void snap_abort(kvp_mserver *s);
static void snap_rewrite(kvp_mserver *s)
{
    snap_abort(s); /* a rewrite in progress is superseded */
    kvp_buf b;
    kvp_buf_init(&b, SIZE_MAX / 2);
    uint64_t t0 = kvp_now_ms(), n = kvp_master_snapshot(s->m, &b);
    if (b.err)
        KVP_ERROR(MOD, "snapshot_file %s: no memory for a snapshot", s->cfg.snapshot_file);
    else if (kvp_snapfile_rewrite(s->snap, b.data, b.len) == 0)
        KVP_INFO(MOD, "snapshot_file %s: %llu objects, %llu KiB, written in %llu ms",
                 s->cfg.snapshot_file, (unsigned long long)n, (unsigned long long)(b.len >> 10),
                 (unsigned long long)(kvp_now_ms() - t0));
    kvp_buf_free(&b);
}

/* Drops a rewrite in progress (its tmp file too). */
static void snap_abort(kvp_mserver *s)
{
    if (s->snap_sn) {
        kvp_master_snap_free(s->m, s->snap_sn);
        s->snap_sn = NULL;
    }
    if (s->snap)
        kvp_snapfile_abort(s->snap);
    kvp_buf_free(&s->snap_part);
}

/* The rewrite in progress, one budget further (after the turn's journal
 * went to both files: the order master.c's convergence needs). 1 when it
 * has more to do. */
static int snap_advance(kvp_mserver *s, uint64_t now)
{
    kvp_buf_reset(&s->snap_part);
    int done = kvp_master_snap_step(s->m, s->snap_sn, &s->snap_part, KVP_MASTER_SNAP_BUDGET);
    if (s->snap_part.err || !kvp_snapfile_rewriting(s->snap) ||
        kvp_snapfile_part(s->snap, s->snap_part.data, s->snap_part.len) != 0) {
        KVP_ERROR(MOD, "snapshot_file %s: rewrite failed (%s); tried again in %d ms",
                  s->cfg.snapshot_file, s->snap_part.err ? "no memory" : "i/o", SNAP_RETRY_MS);
        snap_abort(s);
        s->snap_retry_ms = now + SNAP_RETRY_MS;
        return 0;
    }
    kvp_buf_shrink(&s->snap_part, 4u << 20);
    if (!done)
        return 1;
    uint64_t n = kvp_master_snap_count(s->snap_sn);
    kvp_master_snap_free(s->m, s->snap_sn);
    s->snap_sn = NULL;
    kvp_buf_free(&s->snap_part);
    if (kvp_snapfile_commit(s->snap) == 0)
        KVP_INFO(MOD, "snapshot_file %s: rewritten, %llu objects, %llu KiB, over %llu ms",
                 s->cfg.snapshot_file, (unsigned long long)n,
                 (unsigned long long)(kvp_snapfile_size(s->snap) >> 10),
                 (unsigned long long)(kvp_now_ms() - s->snap_t0));
    else
        s->snap_retry_ms = now + SNAP_RETRY_MS;
    return 0;
}

/* The snapshot file: synced once a second; rewritten when the changes
 * appended since its snapshot pass SNAP_GROWTH times it (and SNAP_MIN), or
 * an append failed. The rewrite runs over loop turns, a budget a turn
 * (memory: one turn's part). 1 when it has more to do. */
static int snap_tend(kvp_mserver *s, uint64_t now)
{
    if (!s->snap)
        return 0;
    if (now - s->snap_synced_ms >= SNAP_SYNC_MS) {
        kvp_snapfile_sync(s->snap);
        s->snap_synced_ms = now;
    }
    if (s->snap_sn)
        return snap_advance(s, now);
    uint64_t size = kvp_snapfile_size(s->snap), base = kvp_snapfile_base(s->snap);
    if (now < s->snap_retry_ms ||
        !(kvp_snapfile_broken(s->snap) || (size > SNAP_MIN && size > base * SNAP_GROWTH)))
        return 0;
    kvp_buf_init(&s->snap_part, SIZE_MAX / 2);
    if (kvp_snapfile_begin(s->snap) != 0 ||
        !(s->snap_sn = kvp_master_snap_start(s->m, &s->snap_part))) {
        snap_abort(s);
        s->snap_retry_ms = now + SNAP_RETRY_MS;
        return 0;
    }
    s->snap_t0 = now;
    return snap_advance(s, now);
}

/* Sends the journal to the standbys and the snapshot file, then the next
 * part of the snapshots in progress; answers whose puts the standbys now
 * all hold go out. 1 when a snapshot has more to send now (the loop should
 * not sleep). */
static int push_repl(kvp_mserver *s, uint64_t now)
{
    kvp_master_push_repl(s->m, repl_send, s);
    int more = snap_tend(s, now);
    more |= kvp_master_push_snaps(s->m, snap_out, s);
    kvp_repl_state st;
    kvp_master_repl_state(s->m, now, &st);
    s->repl_acked = st.acked;
    if (!s->ngated)
        return more;
    for (conn *c = s->conns; c; c = c->next)
        if (c->gated && c->gate <= s->repl_acked) {
            c->gated = 0;
            s->ngated--;
            if (conn_flush(s, c) < 0)
                c->closing = 1; /* closed at its next event (EPOLLHUP) */
        }
    return more;
}

/* kvp_master_jobs's callback: a job's answer goes to the asker's output;
 * the frames it sent meanwhile are served from the next turn on. */
static kvp_buf *job_out(kvp_msess *ms, void *ctx)
{
    kvp_mserver *s = ctx;
    conn *c = (conn *)((char *)ms - offsetof(conn, sess));
    kvp_buf *out = freed_out(ms, ctx);
    if (out)
        mark_ready(s, c, 1);
    return out;
}

/* One epoll event of a connection: read and serve when it is watched for
 * input, then flush (EPOLLOUT lands here too). */
static void conn_event(kvp_mserver *s, conn *c, uint32_t events)
{
    kvp_log_set_peer(c->peer_log); /* its lines name it; cleared before every return */
    if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLIN)) {
        conn_close(s, c);
        kvp_log_set_peer(NULL);
        return;
    }
    /* the interest may have changed earlier in this batch */
    if ((events & EPOLLIN) && (c->events & EPOLLIN) && !c->on_ready) {
        if (conn_readable(s, c) < 0) {
            conn_close(s, c);
            kvp_log_set_peer(NULL);
            return;
        }
        conn_work(s, c);
    }
    conn_after(s, c);
    kvp_log_set_peer(NULL);
}

/* Connections with unserved frames from earlier turns; the list is
 * detached so each is served once per turn (conn_close unlinks from
 * s->ready, which is why this runs after the event loop). */
static void serve_ready(kvp_mserver *s)
{
    conn *r = s->ready;
    s->ready = NULL;
    while (r) {
        conn *c = r;
        r = r->ready_next;
        c->on_ready = 0;
        kvp_log_set_peer(c->peer_log);
        conn_work(s, c);
        conn_after(s, c);
        kvp_log_set_peer(NULL);
    }
}

/* Clients the core dropped by their TTL lose their connections. */
static void close_expired(kvp_mserver *s)
{
    uint64_t st[KVP_STAT__COUNT];
    kvp_master_stats(s->m, st);
    if (st[KVP_STAT_CLIENTS_EXPIRED] == s->last_expired)
        return;
    s->last_expired = st[KVP_STAT_CLIENTS_EXPIRED];
    for (conn *c = s->conns, *nx; c; c = nx) {
        nx = c->next;
        if (kvp_master_sess_dead(&c->sess))
            conn_close(s, c);
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
        uint64_t before = kvp_now_ms();
        int wait = wait_ms(s, next_tick, before);
        int n = kvp_sys.epoll_wait(s->ep, evs, 128, wait);
        uint64_t woke = kvp_now_ms();
        if (n < 0 && errno != EINTR) {
            KVP_ERROR(MOD, "epoll_wait: %s", strerror(errno));
            lookups_close(s);
            return KVP_EIO;
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &s->lfd) {
                s->accept_due = 1;
            } else if (p == &s->evfd) {
                uint64_t v;
                ssize_t rd = read(s->evfd, &v, sizeof v);
                (void)rd;
                s->lk_due = 1; /* a lookup, or a stop */
            } else if (p == &s->sigfd) {
                struct signalfd_siginfo si;
                if (read(s->sigfd, &si, sizeof si) == sizeof si)
                    KVP_INFO(MOD, "signal %u: shutting down", si.ssi_signo);
                s->stop = 1;
            } else {
                conn_event(s, p, evs[i].events);
            }
        }
        serve_ready(s);
        if (s->lk_due) {
            s->lk_due = 0;
            lookups_serve(s, kvp_now_ms());
        }
        if (s->accept_due) {
            s->accept_due = 0;
            on_accept(s, kvp_now_ms());
        }
        s->turn++;
        uint64_t now = kvp_now_ms();
        release_held(s, now);
        expire_hellos(s, now);
        accept_resume(s, now);
        wake_starved(s);
        /* input of this turn was read first; a turn that came far later
         * than its wait allowed (stopped, descheduled, a long turn) must
         * not count as its peers' silence */
        if (now - before > (uint64_t)wait + STALL_MS)
            kvp_master_stalled(s->m, now - before - (uint64_t)wait, now);
        keep_starved_alive(s, now);
        next_tick = kvp_master_tick(s->m, now);
        if (kvp_master_jobs(s->m, now, job_out, s))
            next_tick = 0;
        if (push_repl(s, now))
            next_tick = 0;
        push_freed(s);
        if (s->kvpub && kvp_master_events_pending(s->m) &&
            (now != s->kv_pub_ms || kvp_master_events_pending(s->m) >= KV_PUB_EVENTS)) {
            publish_events(s); /* at most once a millisecond: fewer, fuller batches */
            s->kv_pub_ms = now;
        }
        close_expired(s);
        summary(s, now);
        if (s->status && kvp_mstatus_due(s->status, now))
            status_publish(s, now);
        if (kvp_now_ms() - woke > s->longest_turn_ms)
            s->longest_turn_ms = kvp_now_ms() - woke;
    }
    lookups_close(s);
    KVP_INFO(MOD, "longest loop turn: %llu ms", (unsigned long long)s->longest_turn_ms);
    return 0;
}

void kvp_mserver_destroy(kvp_mserver *s)
{
    if (!s)
        return;
    kvp_mserver_standby(s, 0);
    while (s->conns)
        conn_close(s, s->conns);
    /* the clean stop's own work first: the snapshot does not wait for the
     * KV events' sockets (their close is bounded too: kvev.h) */
    if (s->m)
        snap_abort(s); /* a rewrite in progress: done whole below (or dropped) */
    if (s->snap && s->m) {
        kvp_master_push_repl(s->m, repl_send, s); /* the last turn's changes */
        if (kvp_snapfile_size(s->snap) > kvp_snapfile_base(s->snap))
            snap_rewrite(s); /* compact for the next start */
    }
    kvp_snapfile_close(s->snap);
    s->snap = NULL;
    if (s->kvpub && s->m)
        publish_events(s); /* the last turn's */
    kvp_kvpub_destroy(s->kvpub);
    if (s->m)
        kvp_master_destroy(s->m);
    kvp_mstatus_free(s->status);
    kvp_arena_free(&s->arena);
    kvp_free(s->amap); /* empty: every connection was closed */
    if (s->lfd >= 0) close(s->lfd);
    if (s->ep >= 0) close(s->ep);
    if (s->evfd >= 0) close(s->evfd);
    if (s->sigfd >= 0) close(s->sigfd);
    pthread_cond_destroy(&s->lk_cv);
    pthread_mutex_destroy(&s->lk_mu);
    kvp_free(s);
}
