/*
 * lookup.h -- the scheduler <-> worker-rank-0 lookup / admin channel
 * (spec §9), over a UNIX domain stream socket, with deadlines.
 *
 * The spec's channel (ZMQ REQ/REP) has no timeouts: a dead rank 0 blocks the
 * scheduler forever. Here every call is bounded: a lookup that does not get
 * its answer within the deadline reports a hit of 0 (the request is simply
 * recomputed), a reset reports KVP_ERPC_TIMEOUT. Never a hang (DESIGN §8).
 *
 * Wire format (all integers big-endian, as the spec's frames):
 *   frame    := u32 len | body            (1 <= len <= KVP_LOOKUP_MAX_FRAME)
 *   lookup   := u8 'L' | u32 num_tokens | u16 hash_len | hashes | u8 apply_eagle
 *               hashes: nhashes * hash_len bytes, nhashes = (len - 8) / hash_len;
 *               hash_len 0 <=> no hashes; hash_len <= KVP_LOOKUP_MAX_HASH_LEN;
 *               apply_eagle is 0 or 1
 *   reset    := u8 'R'
 *   replies  := u8 'L' | u32 hit            (answer to a lookup)
 *             | u8 'R' | u8 ok (1 / 0)       (answer to a reset)
 *             | u8 'E' | u8 0                (well-framed request, unknown tag)
 * A frame that is malformed in any other way (bad length, bad hash_len,
 * trailing bytes, apply_eagle not 0/1) closes that connection; the server
 * keeps serving the others. Requests on one connection are answered in order.
 *
 * Server: one thread (owned by worker rank 0) multiplexes the listening
 * socket and at most max_conns connections with poll(2); it calls the
 * callbacks from that thread, one request at a time (the callbacks need no
 * locking against each other).
 *
 * Who may talk (the socket runs a RESET that wipes the store):
 *  - the socket file is created 0600 whatever the umask (0660 and owned by
 *    the configured group, if one is), set between bind and listen, when
 *    no connect can succeed; so other users cannot even connect through
 *    the file system;
 *  - every accepted connection's SO_PEERCRED must pass
 *    kvp_lookup_peer_allowed: the server's effective uid (root is let in
 *    only when the server runs as root), or the configured group as the
 *    peer's effective (primary) gid -- SO_PEERCRED carries no
 *    supplementary groups. Any other peer is closed before it is read or
 *    takes a slot, counted (stats.rejected) and logged at most once a
 *    second with the count since the last line.
 *  - the path: nothing there, or a socket nobody listens on (unlinked: a
 *    dead server's). A regular file, a socket someone listens on, or one
 *    that cannot be probed is KVP_EINVALID_PARAMS with a logged reason,
 *    and is never removed. A path longer than sun_path allows is refused,
 *    by the server and the client alike.
 *
 * Slots a peer cannot hold: a connection with nothing pending is closed
 * after idle_ms; one that began a frame is closed if the frame is not whole
 * partial_ms after its first byte (or after the previous frame was
 * served). A new connection is never refused: when all max_conns slots are
 * taken, the idle connection quiet the longest (else the oldest partial
 * frame) is closed to make room (stats.evicted). So no number of idle or
 * stuck peers keeps the scheduler out.
 *
 * Client (scheduler): one background thread serializes all requests over
 * one connection (reconnecting after any error, so a restarted server is
 * picked up by the next request); lookups are futures keyed by request id
 * (§9.3). It talks only to a server that passes the same rule from its
 * side (SO_PEERCRED after connect: its own uid, or the configured group). A connection the server closed while it sat unused (idle
 * timeout, eviction) is reopened transparently: it is checked before each
 * request, and a request whose connection turns out closed before any
 * answer byte is sent once more on a new connection (the server never
 * closes a connection between running a request and answering it, so the
 * request did not run). Each request's deadline runs from its submission: a request still
 * queued when its deadline passes is answered 0 without I/O, so a hung
 * server costs one deadline, not one per queued request. On a timeout the
 * connection is closed (a late answer can never be taken for the next one).
 */
#ifndef KVP_LOOKUP_H
#define KVP_LOOKUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvpool.h"

/* A lookup socket's path, with its NUL, must fit this (sun_path). */
#define KVP_LOOKUP_PATH_MAX 108

#define KVP_LOOKUP_MAX_FRAME (16u << 20) /* bytes of one frame body */
#define KVP_LOOKUP_MAX_HASH_LEN 256u
#define KVP_LOOKUP_MAX_ID 4096u          /* bytes of a request id */
#define KVP_LOOKUP_MAX_CONNS 32        /* default connection cap */
#define KVP_LOOKUP_MAX_CONNS_LIMIT 4096 /* the largest cap accepted */
#define KVP_LOOKUP_IDLE_MS 60000        /* default: nothing pending */
#define KVP_LOOKUP_PARTIAL_MS 2000      /* default: a frame begun, not whole */
#define KVP_LOOKUP_DEFAULT_DEADLINE_MS 2000

/* kvp_lookup_client_lookup: the answer is not ready yet (non-blocking). */
#define KVP_LOOKUP_PENDING 1

/*
 * Server callbacks, called from the server thread. `hashes` (nhashes *
 * hash_len bytes) is valid only during the call. lookup: return 0 and set
 * *hit, or a negative code (answered as a hit of 0). reset: return 0 for
 * "ok", anything else for "not ok".
 */
typedef struct kvp_lookup_handler {
    int (*lookup)(void *arg, uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                  size_t hash_len, int apply_eagle, uint32_t *hit);
    int (*reset)(void *arg);
    void *arg;
} kvp_lookup_handler;

typedef struct kvp_lookup_server kvp_lookup_server;

/* Server limits; a 0 field takes its default (all zero: the defaults). */
typedef struct kvp_lookup_server_opts {
    uint32_t max_conns;  /* connection cap (KVP_LOOKUP_MAX_CONNS), <= _LIMIT */
    uint32_t idle_ms;    /* close a connection quiet this long (KVP_LOOKUP_IDLE_MS) */
    uint32_t partial_ms; /* close a frame not whole this long (KVP_LOOKUP_PARTIAL_MS) */
    bool use_group;      /* false: the server's uid only */
    gid_t gid;           /* use_group: peers of this gid too; socket 0660, this group */
} kvp_lookup_server_opts;

void kvp_lookup_server_opts_default(kvp_lookup_server_opts *o);

/*
 * Binds `path` with mode 0600 (see "the path" above for what may already
 * be there), listens and starts the thread. opts NULL = the defaults.
 * Errors: KVP_EINVALID_PARAMS (NULL, path empty or too long for sun_path,
 * no lookup callback, max_conns over the limit, the path taken: a file that
 * is not a socket, a live socket, a socket that cannot be probed),
 * KVP_EIO (socket/bind/chown/chmod/listen/thread failure; chown to a
 * group needs the server to be a member, or root), KVP_ENOMEM. Every
 * error but the argument checks is logged with its reason.
 */
int kvp_lookup_server_start_opts(const char *path, const kvp_lookup_handler *h,
                                 const kvp_lookup_server_opts *opts, kvp_lookup_server **out);
/* kvp_lookup_server_start_opts with the default limits. */
int kvp_lookup_server_start(const char *path, const kvp_lookup_handler *h,
                            kvp_lookup_server **out);
/* Stops the thread, closes every connection, removes the socket file.
 * NULL is a no-op. */
void kvp_lookup_server_stop(kvp_lookup_server *s);
/* Requests answered so far (lookup + reset + unknown tags); for tests. */
uint64_t kvp_lookup_server_served(kvp_lookup_server *s);

/* Counters since start; readable from any thread. */
typedef struct kvp_lookup_server_stats {
    uint64_t served;   /* requests answered */
    uint64_t rejected; /* connections closed at accept: peer of another uid */
    uint64_t evicted;  /* connections closed to make room for a new one */
    uint64_t expired;  /* connections closed at their idle / partial deadline */
} kvp_lookup_server_stats;
void kvp_lookup_server_get_stats(kvp_lookup_server *s, kvp_lookup_server_stats *st);

/*
 * The server's parsing, as pure functions (fuzzed: tests/fuzz/fuzz_lookup.c).
 *
 * kvp_lookup_frame_next: the frame at the front of p[0..n). 1: whole, *body
 * points at its body (inside p) and *body_len is 1..KVP_LOOKUP_MAX_FRAME,
 * the frame being 4 + *body_len bytes; 0: more bytes needed (nothing set);
 * KVP_EPROTOCOL: a length of 0 or over the maximum.
 */
int kvp_lookup_frame_next(const uint8_t *p, size_t n, const uint8_t **body, uint32_t *body_len);

/* One decoded request body; hashes points into the body (NULL if none). */
typedef struct kvp_lookup_req {
    uint8_t tag;         /* 'L', 'R' or any other (answered 'E') */
    uint32_t num_tokens; /* 'L' only, as every field below */
    const uint8_t *hashes;
    size_t nhashes, hash_len; /* nhashes * hash_len == body length - 8 */
    int apply_eagle;          /* 0 or 1 */
} kvp_lookup_req;

/*
 * kvp_lookup_decode: body p[0..n) as a request. 0 and *r set, or
 * KVP_EPROTOCOL (empty body, a lookup or reset not of the wire format
 * above); an unknown tag decodes (tag only), whatever follows it.
 */
int kvp_lookup_decode(const uint8_t *p, size_t n, kvp_lookup_req *r);

/* The credential rule, both directions: a peer may talk iff its uid is
 * ours (root included: only when we are root), or `group` is given and is
 * the peer's gid. */
bool kvp_lookup_peer_allowed(uid_t peer_uid, gid_t peer_gid, uid_t self_uid, const gid_t *group);

typedef struct kvp_lookup_client kvp_lookup_client;

/*
 * Creates the client and its thread; does not connect yet (the first
 * request does). deadline_ms 0 = KVP_LOOKUP_DEFAULT_DEADLINE_MS.
 * KVP_EINVALID_PARAMS, KVP_ENOMEM, KVP_EIO (thread).
 */
int kvp_lookup_client_open(const char *path, uint32_t deadline_ms, kvp_lookup_client **out);
/*
 * Lookup for req_id (§9.3). If no future exists for req_id one is submitted
 * with a copy of the arguments (an existing one is reused, whatever the new
 * arguments). non_block and not ready: KVP_LOOKUP_PENDING. Otherwise waits
 * (at most until that request's deadline), sets *hit (0 on timeout or any
 * channel error), consumes the future and returns 0.
 * Errors: KVP_EINVALID_PARAMS (id length 0 or > KVP_LOOKUP_MAX_ID, hash_len
 * over the limit, too many hashes for a frame), KVP_ENOMEM.
 */
int kvp_lookup_client_lookup(kvp_lookup_client *c, const char *req_id, uint32_t id_len,
                             uint32_t num_tokens, const uint8_t *hashes, size_t nhashes,
                             size_t hash_len, bool non_block, bool apply_eagle, uint32_t *hit);
/* Drops (and cancels) the future of req_id, if any. */
void kvp_lookup_client_discard(kvp_lookup_client *c, const char *req_id, uint32_t id_len);
/*
 * Blocking reset with the deadline: 0 and *ok set when the server answered,
 * KVP_ERPC_TIMEOUT (deadline passed) or KVP_ERPC_FAIL (no server, broken
 * connection, malformed answer) otherwise, KVP_ENOMEM.
 */
int kvp_lookup_client_reset(kvp_lookup_client *c, bool *ok);
/* A reset drains the worker's send queue before wiping the store, so it is
 * bounded by its own deadline (default KVP_LOOKUP_RESET_DEADLINE_MS), not
 * the lookup one. 0 = the default. */
#define KVP_LOOKUP_RESET_DEADLINE_MS 60000u
void kvp_lookup_client_set_reset_deadline(kvp_lookup_client *c, uint32_t ms);
/* Also talk to a server whose gid is `gid` (the server's use_group); call
 * before the first request. */
void kvp_lookup_client_set_group(kvp_lookup_client *c, gid_t gid);
/* Number of futures held (tests). */
size_t kvp_lookup_client_pending(kvp_lookup_client *c);
/* Stops the thread (interrupting any I/O), frees every future. Must not run
 * concurrently with other calls on c. NULL is a no-op. */
void kvp_lookup_client_close(kvp_lookup_client *c);

#endif
