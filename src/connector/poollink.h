/*
 * poollink.h -- a connector worker's link to the pool: its store client and
 * whether the pool is available ("the engine outlives the pool": a KV cache
 * is an accelerator, its outage must never take inference down).
 *
 * States (one per link):
 *   UP        the client is open and the master answered last time: the
 *             worker's lookups, stores and loads use the client.
 *   DETACHED  kvp_client_open could not reach the master when the worker was
 *             created (KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT: nothing listens, the
 *             address does not answer, no etcd leader): there is no client.
 *   SUSPECT   an operation failed the way an unreachable master fails (the
 *             whole call, or every key, KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT); the
 *             link thread probes at once. A probe that is answered goes back
 *             to UP without a word (a dead storage node fails the same way
 *             while the master is fine); one that is not confirms the outage.
 *   DOWN      the outage is confirmed.
 * kvp_plink_client() hands out the client in UP and SUSPECT (one failed
 * call must not fail the loads that start while the probe runs); in
 * DETACHED and DOWN
 * the worker does without the pool: a lookup answers 0, a store job is
 * skipped, a load job fails at once (its blocks are reported, the engine
 * recomputes them), each counted (kvp_plink_skipped). None of them waits.
 *
 * The link thread sleeps while UP. Otherwise it tries again after a back-off
 * of 0.5 s doubling to 10 s (at once after a suspicion), interruptible by
 * kvp_plink_close: DETACHED reopens the client (kvp_client_open, bounded by
 * the configuration's rpc_timeout), registers the buffers recorded so far
 * and publishes it; SUSPECT / DOWN send one EXIST of one key through the
 * client (which reconnects, to a restarted master too: a new HELLO). An
 * answer that is not an error means UP again, and the back-off starts over.
 *
 * Log (never one line per request): DETACHED at open is one warning naming
 * the master and that the engine runs without the pool; a confirmed outage
 * is one warning; its end one info line ("pool reachable again") with how
 * long it lasted and what was skipped meanwhile. A retry that fails another
 * way than the last one (a master that now refuses our token) is one
 * warning per new error code.
 *
 * Thread-safety: every function but open and close may be called from any
 * thread at once. The client returned by kvp_plink_client / _any_client
 * stays valid until kvp_plink_close, which must not race with anything.
 */
#ifndef KVP_CONNECTOR_POOLLINK_H
#define KVP_CONNECTOR_POOLLINK_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool.h"

typedef struct kvp_plink kvp_plink;

/* Back-off between retries while the pool is unavailable. */
#define KVP_PLINK_BACKOFF_MIN_MS 500u
#define KVP_PLINK_BACKOFF_MAX_MS 10000u

/*
 * Opens the store client from `store_config` (kvp_client_open's argument;
 * copied, so that a retry reads it again). 0 with the link UP, or DETACHED
 * when kvp_client_open failed with KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT (one
 * warning logged, the link thread retries). Any other failure -- invalid
 * JSON or keys, a refused credential (KVP_EAUTH), an unresolvable host name,
 * a segment the machine cannot back -- is returned as kvp_client_open
 * returned it, with its message in err: a configuration error fails at once.
 */
int kvp_plink_open(const char *store_config, kvp_plink **out, char *err, size_t errlen);
/* Stops the link thread (waits for an attempt it is making: at most the
 * configuration's rpc_timeout), closes the client. NULL ok. */
void kvp_plink_close(kvp_plink *p);

/* The client unless the pool is known unavailable (UP, SUSPECT), else NULL.
 * Lock-free. */
kvp_client *kvp_plink_client(kvp_plink *p);
/*
 * How many times the pool became available: 1 after an open that reached
 * it, +1 at each attach after a DETACHED start and at the end of each
 * confirmed outage (a SUSPECT that the master answered is not one). What the
 * worker keeps in the pool besides blocks (the configuration descriptor) is
 * written again when the epoch changes: a restarted pool has lost it.
 */
uint64_t kvp_plink_epoch(kvp_plink *p);
/* The client whatever the state (NULL only while DETACHED): for requests
 * worth one attempt even while the pool looks down (a reset). */
kvp_client *kvp_plink_any_client(kvp_plink *p);

/*
 * The result of an operation made with a client of this link: the call's
 * return rc, and when it returned >= 0 the per-key results res[0..n) (one of
 * the two arrays, the other NULL). Returns 1 when it says the master is
 * unreachable (rc, or every key, KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT): the link
 * leaves UP (SUSPECT; nothing logged yet) and the caller should not log the
 * failure itself -- the link logs the outage once. Else 0.
 */
int kvp_plink_check(kvp_plink *p, int rc, const int64_t *res64, const int *res32, size_t n);

/* What the worker did without the pool (counted in kvp_plink_status). */
enum kvp_plink_skip { KVP_PLINK_SKIP_STORE, KVP_PLINK_SKIP_LOOKUP, KVP_PLINK_FAIL_LOAD };
void kvp_plink_skipped(kvp_plink *p, enum kvp_plink_skip what);

/*
 * Records engine memory to register with the client (kvp_client_register_
 * buffer): at once when the client is open, else when it opens. 0, or the
 * registration's error (logged by the caller), or KVP_ENOMEM.
 */
int kvp_plink_register_buffer(kvp_plink *p, void *base, size_t len);

typedef struct kvp_plink_status {
    int available;            /* UP */
    int attached;             /* the client is open (not DETACHED) */
    uint64_t unavailable_ms;  /* since when not UP (0 when UP) */
    uint64_t outages;         /* DETACHED at open + SUSPECT confirmed as DOWN */
    uint64_t skipped_stores, skipped_lookups, failed_loads; /* kvp_plink_skipped */
} kvp_plink_status;
/* Counters since open (monotonic). */
void kvp_plink_status_get(kvp_plink *p, kvp_plink_status *out);

#endif
