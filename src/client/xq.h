/*
 * xq.h -- an asynchronous transfer queue over one store client, prefix
 * kvp_xq_.
 *
 * For callers that must never wait on the network (vLLM's secondary-tier
 * interface: python/kvpool/vllm_tier.py): a job is a batch of puts from, or
 * gets into, caller memory registered with the client
 * (kvp_client_register_buffer); kvp_xq_submit copies the job's keys and
 * ranges and returns at once; the queue's own threads (at most `threads`,
 * started at create) run jobs first in, first out, each job as one batch
 * call of the client; finished jobs are collected with kvp_xq_poll, each
 * with a result per key (bytes moved, or a negative KVP_E* code: the
 * batch calls' contract, include/kvpool.h) and the seconds it ran.
 *
 * Contracts:
 *   - The client must stay open until kvp_xq_destroy returned, or hooks
 *     must guard each job (enter returns non-zero once the client is
 *     closing: that job's keys all get that code, nothing is moved).
 *   - The memory of a job must stay mapped and untouched by the caller (a
 *     get's ranges) or unchanged (a put's) until the job was polled, or
 *     kvp_xq_drain / kvp_xq_destroy returned.
 *   - Every submitted job is reported by kvp_xq_poll exactly once, even one
 *     that failed as a whole (every key carries the code); none is dropped.
 *   - kvp_xq_drain returns once no job is queued or running (their results
 *     wait for kvp_xq_poll). kvp_xq_destroy drains, joins the threads and
 *     frees the results nobody polled.
 *   - Thread-safe: any call from any thread, except kvp_xq_destroy, which
 *     no other call may overlap. Not fork-safe: a forked child must not use
 *     a queue its parent made.
 */
#ifndef KVP_CLIENT_XQ_H
#define KVP_CLIENT_XQ_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

typedef struct kvp_xq kvp_xq;

enum kvp_xq_op { KVP_XQ_PUT = 1, KVP_XQ_GET = 2 };

/* Called around each job on the thread that runs it: enter(arg) returns 0
 * to go on, or a negative code that becomes every key's result. */
typedef struct kvp_xq_hooks {
    int (*enter)(void *arg);
    void (*leave)(void *arg);
    void *arg;
} kvp_xq_hooks;

/* A finished job, as kvp_xq_poll hands it over; results[n] belong to the
 * receiver (kvp_xq_done_free). */
typedef struct kvp_xq_done {
    uint64_t id;
    int op;           /* enum kvp_xq_op */
    size_t n;
    int64_t *results; /* per key: bytes moved (>= 0; 0 for a put of a key that exists) or < 0 */
    uint64_t bytes;   /* sum of the non-negative results */
    double seconds;   /* from the job's start on a thread to its end */
} kvp_xq_done;

/* A queue of threads (1..64) over c; hooks may be NULL (copied).
 * 0, KVP_EINVALID_PARAMS, KVP_ENOMEM or KVP_EINTERNAL_ERROR (no thread). */
int kvp_xq_create(kvp_client *c, int threads, const kvp_xq_hooks *hooks, kvp_xq **out);

/* Queues job id: op over keys[i] <-> iovs[i] (one range per key), n >= 1.
 * Keys and ranges are copied. 0, KVP_EINVALID_PARAMS (bad op, n = 0, a
 * NULL key or range), KVP_ENOMEM, or KVP_ECLOSED while destroying. */
int kvp_xq_submit(kvp_xq *q, uint64_t id, int op, const char *const *keys, const kvp_iov *iovs,
                  size_t n);

/* Moves up to cap finished jobs into out (in the order they finished);
 * returns how many. Never blocks on a transfer. */
size_t kvp_xq_poll(kvp_xq *q, kvp_xq_done *out, size_t cap);

/* Jobs submitted and not yet handed over by kvp_xq_poll. */
size_t kvp_xq_pending(kvp_xq *q);

/* Waits until no job is queued or running. */
void kvp_xq_drain(kvp_xq *q);

/* Drains, ends the threads, frees everything. NULL is a no-op. */
void kvp_xq_destroy(kvp_xq *q);

/* Frees what a kvp_xq_done owns (its results). */
void kvp_xq_done_free(kvp_xq_done *d);

#endif
