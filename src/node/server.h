/*
 * server.h -- the segment server: moves bytes between sockets and one
 * segment for remote clients (TCP), and hands the segment's memfd to
 * same-host clients (unix socket, SCM_RIGHTS).
 *
 * Protocol: the frames of proto.h. A connection starts with HELLO (same
 * message as the master's; the cluster token is checked). Then SEG_WRITE /
 * SEG_READ (TCP and unix), SHM_ATTACH (unix only) and UCX_ATTACH (when the
 * node registered its segment with UCX: node/nucx.h), pipelined. Every
 * SEG_WRITE/SEG_READ is checked before any byte moves by the node's grants
 * (grants.h): segment id, bounds, tag, operation, expiry and generation.
 * Anything else is
 * refused with an error answer, and a SEG_WRITE whose body cannot be
 * trusted (length mismatch) closes the connection. Bytes go straight
 * between the socket and the segment (readv/writev), no intermediate copy.
 *
 * The unix socket (node/unixsock.h): the path must fit sun_path, only a
 * stale socket is replaced, the file is 0600 (0660 with a group), and every
 * accepted connection's SO_PEERCRED must be our uid or the group's.
 *
 * Threads: one acceptor plus `io_threads` workers, each with its own epoll
 * set; connections are spread round-robin.
 *
 * Limits (kvp_segserver_limits): at most `max_conns` connections; beyond, a new one is accepted and
 * closed at once. Of those, at most `max_pre_hello` (split evenly over the
 * workers) have not said HELLO yet; beyond, the oldest of them is closed to
 * make room, so a flood of silent connections cannot lock out clients that
 * authenticate. Deadlines, checked every 200 ms: HELLO within
 * `hello_timeout_ms` of the accept; a connection with no frame in flight and
 * nothing to send is closed after `idle_timeout_ms`; one in the middle of a
 * frame, or with answers its peer does not read, after `stall_timeout_ms`
 * without a byte moving, or as soon as it moved less than `min_rate` bytes a
 * second over a rate window. A transfer is cut (the connection closed, a
 * SEG_WRITE never answered) at its descriptor's deadline and at a
 * revocation barrier that finds its grant dead. Out of file descriptors (EMFILE, ENFILE, ENOBUFS,
 * ENOMEM), the acceptor stops polling its listeners for 100 ms, doubling to
 * 1 s while it lasts. Whatever a peer can cause is logged rate-limited.
 */
#ifndef KVP_SEGSERVER_H
#define KVP_SEGSERVER_H

#include <stddef.h>
#include <stdint.h>

#include "node/grants.h"
#include "node/segment.h"
#include "node/unixsock.h"

typedef struct kvp_segserver kvp_segserver;

typedef struct kvp_segserver_opts {
    const char *listen;        /* TCP "host:port" (port 0 = any) */
    const char *unix_path;     /* unix socket path; NULL = none */
    int io_threads;            /* >= 1 (default 2) */
    const char *cluster_token; /* NULL or "" = none */
    uint64_t segment_id;
    kvp_grants *grants;        /* checks descriptors; must outlive the server */
    kvp_unixsock_access unix_access; /* besides our uid, who may connect to the
                                        unix socket (zero = nobody) */
    const uint8_t *ucx_attach; /* the UCX_ATTACH answer body (node/nucx.h), NULL = no
                                  ucx transport (answered NOT_SUPPORTED); must
                                  outlive the server. Answered only while opened
                                  by kvp_segserver_ucx_open */
    uint32_t ucx_attach_len;
} kvp_segserver_opts;

/* Connection limits (a struct of their own so that kvp_segserver_opts'
 * positional initializers stay valid); 0 = the default. */
typedef struct kvp_segserver_limits {
    int max_conns;             /* open connections (4096) */
    int max_pre_hello;         /* of which before HELLO (max_conns / 4) */
    uint32_t hello_timeout_ms; /* accept .. HELLO answered (5 s) */
    uint32_t idle_timeout_ms;  /* no frame in flight, nothing to send (5 min) */
    uint32_t stall_timeout_ms; /* mid-frame or answers unread, no byte moved (30 s) */
    uint64_t min_rate;         /* bytes a second a busy connection moves at least (64 KiB) */
    uint32_t rate_window_ms;   /* ... averaged over windows of this (10 s) */
} kvp_segserver_limits;

typedef struct kvp_segserver_stats {
    uint64_t conns;            /* open now */
    uint64_t refused_full;     /* closed at accept: max_conns open */
    uint64_t evicted;          /* pre-HELLO connections closed for newer ones */
    uint64_t hello_timeouts, idle_timeouts, stall_timeouts;
    uint64_t accept_pauses;    /* listener pauses for want of descriptors */
    uint64_t peer_refused;     /* unix connections refused by SO_PEERCRED */
    uint64_t cut_revoked;      /* closed: a transfer's grant was revoked (barrier) */
    uint64_t cut_expired;      /* closed: a transfer outlived its descriptor */
    uint64_t cut_slow;         /* closed: busy below min_rate */
    uint64_t moved[2][2];      /* bytes served [tcp, unix][read (SEG_READ), written (SEG_WRITE)];
                                  a read counts when answered, a write once its body is in */
} kvp_segserver_stats;

int kvp_segserver_start(kvp_segment *seg, const kvp_segserver_opts *o, kvp_segserver **out,
                        char *err, size_t errlen);
/* The same with limits (NULL = every default). */
int kvp_segserver_start_lim(kvp_segment *seg, const kvp_segserver_opts *o,
                            const kvp_segserver_limits *lim, kvp_segserver **out, char *err,
                            size_t errlen);
uint16_t kvp_segserver_port(const kvp_segserver *s);
/* UCX_ATTACH is answered (the rkey handed out) only while open is 1: the
 * node opens it once a master accepted its mount with the ucx endpoint (a
 * master protecting tenants refuses that), and closes it when one refused
 * it. Starts closed. Any thread. */
void kvp_segserver_ucx_open(kvp_segserver *s, int open);
/* Unix connections refused so far because of the peer's credentials. */
uint64_t kvp_segserver_peer_refused(const kvp_segserver *s);
void kvp_segserver_stats_get(const kvp_segserver *s, kvp_segserver_stats *out);
/*
 * Revocation barrier: the caller has just revoked grants (raised floors,
 * kvp_grants_freed, or re-keyed). Returns once every worker has cut the
 * connections whose transfers (SEG_READ answers still sending, SEG_WRITE
 * bodies still arriving) are on a revoked grant -- with `all`, every
 * connection with a transfer in flight -- so that none of them moves
 * another byte: 0, or KVP_ERPC_TIMEOUT when some worker did not get there
 * within timeout_ms (then nothing is promised; call again). Any thread but
 * a worker; not in KVP_FUZZING servers made by kvp_segserver_fuzz_new.
 */
int kvp_segserver_revoke(kvp_segserver *s, int all, uint32_t timeout_ms);
/* Stops every thread, closes every connection, removes the unix socket. */
void kvp_segserver_stop(kvp_segserver *s);
#endif
