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
 * socket and at most KVP_LOOKUP_MAX_CONNS connections with poll(2); it calls
 * the callbacks from that thread, one request at a time (the callbacks need
 * no locking against each other). A connection that holds a partial frame
 * for longer than KVP_LOOKUP_IDLE_MS is dropped.
 *
 * Client (scheduler): one background thread serializes all requests over
 * one connection (reconnecting after any error, so a restarted server is
 * picked up by the next request); lookups are futures keyed by request id
 * (§9.3). Each request's deadline runs from its submission: a request still
 * queued when its deadline passes is answered 0 without I/O, so a hung
 * server costs one deadline, not one per queued request. On a timeout the
 * connection is closed (a late answer can never be taken for the next one).
 */
#ifndef KVP_LOOKUP_H
#define KVP_LOOKUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

#define KVP_LOOKUP_MAX_FRAME (16u << 20) /* bytes of one frame body */
#define KVP_LOOKUP_MAX_HASH_LEN 256u
#define KVP_LOOKUP_MAX_ID 4096u          /* bytes of a request id */
#define KVP_LOOKUP_MAX_CONNS 8
#define KVP_LOOKUP_IDLE_MS 10000
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

/*
 * Binds `path` (a stale socket file there is unlinked first; a path that
 * exists and is not a socket is KVP_EINVALID_PARAMS) and starts the thread.
 * Errors: KVP_EINVALID_PARAMS (NULL, path too long for sun_path, no lookup
 * callback), KVP_EIO (socket/bind/listen/thread failure), KVP_ENOMEM.
 */
int kvp_lookup_server_start(const char *path, const kvp_lookup_handler *h,
                            kvp_lookup_server **out);
/* Stops the thread, closes every connection, removes the socket file.
 * NULL is a no-op. */
void kvp_lookup_server_stop(kvp_lookup_server *s);
/* Requests answered so far (lookup + reset + unknown tags); for tests. */
uint64_t kvp_lookup_server_served(kvp_lookup_server *s);

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
/* Number of futures held (tests). */
size_t kvp_lookup_client_pending(kvp_lookup_client *c);
/* Stops the thread (interrupting any I/O), frees every future. Must not run
 * concurrently with other calls on c. NULL is a no-op. */
void kvp_lookup_client_close(kvp_lookup_client *c);

#endif
