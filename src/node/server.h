/*
 * server.h -- the segment server: moves bytes between sockets and one
 * segment for remote clients (TCP), and hands the segment's memfd to
 * same-host clients (unix socket, SCM_RIGHTS).
 *
 * Protocol: the frames of proto.h. A connection starts with HELLO (same
 * message as the master's; the cluster token is checked). Then SEG_WRITE /
 * SEG_READ (TCP and unix) and SHM_ATTACH (unix only), pipelined. Every
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
} kvp_segserver_opts;

int kvp_segserver_start(kvp_segment *seg, const kvp_segserver_opts *o, kvp_segserver **out,
                        char *err, size_t errlen);
uint16_t kvp_segserver_port(const kvp_segserver *s);
/* Unix connections refused so far because of the peer's credentials. */
uint64_t kvp_segserver_peer_refused(const kvp_segserver *s);
/* Stops every thread, closes every connection, removes the unix socket. */
void kvp_segserver_stop(kvp_segserver *s);
#endif
