/*
 * cucx.h -- the client's side of the "ucx" transport: one-sided UCX RMA
 * (ucp_put_nbx / ucp_get_nbx) between caller memory and a node's segment,
 * with the node's rkey from its UCX_ATTACH answer (node/nucx.h).
 *
 * One UCP context and worker per client (kvp_cucx), made on first use. The
 * worker is driven by one thread at a time (`mu`): a job issues its ops'
 * requests, then progresses the worker until they completed (yielding,
 * then napping, while nothing moves: kvp_ucx_idle). One endpoint and unpacked rkey
 * per node segment (kvp_cucx_peer), created with peer error handling: a
 * node that dies fails the requests in flight (TRANSFER_FAIL) and marks the
 * peer failed, so the next batch attaches again.
 *
 * Checksums (XXH3-64 through kvp_csum, as on the other paths): a put hashes each chunk of
 * the caller's bytes just before handing it to UCX (still in cache for the
 * copies UCX's software transports make); a get hashes each op's bytes once
 * its requests completed, while later ops are still in flight. A put is
 * complete only after a flush of the endpoint (remote completion), so
 * PUT_END never publishes bytes still on the wire.
 *
 * Thread-safe; ops and statuses as in xfer.h.
 */
#ifndef KVP_CUCX_H
#define KVP_CUCX_H

#include <stddef.h>
#include <stdint.h>

#include "client/xfer.h"

typedef struct kvp_cucx kvp_cucx;
typedef struct kvp_cucx_peer kvp_cucx_peer;

/* A context and worker. 0, or KVP_ENOT_SUPPORTED with the reason in err. */
int kvp_cucx_create(kvp_cucx **out, char *err, size_t errlen);
/* Frees the client's UCX state; every peer must be closed first. */
void kvp_cucx_destroy(kvp_cucx *u);

/* An endpoint to the node and its segment's rkey, from the UCX_ATTACH
 * answer body (decoded and checked here), into *pp: a new peer when *pp is
 * NULL, else *pp's endpoint and rkey are replaced in place (so a job that
 * holds the peer never sees it freed: jobs and this take `mu`). 0,
 * KVP_EPROTOCOL (a malformed answer; *pp unchanged), KVP_ENOMEM, or
 * KVP_ETRANSFER_FAIL (UCX refused the address or the rkey: *pp, if any,
 * stays failed). */
int kvp_cucx_connect(kvp_cucx *u, const uint8_t *attach, uint32_t len, kvp_cucx_peer **pp);
/* Closes the endpoint (forcibly) and frees: no job may hold p any more. */
void kvp_cucx_close(kvp_cucx *u, kvp_cucx_peer *p);
/* 1 once the endpoint failed (the node died, a deadline cut a job): the
 * peer must be closed and attached anew. */
int kvp_cucx_failed(const kvp_cucx_peer *p);

/* Runs n ops (status 1 = to do) of one segment: rep.offset / rep.length
 * within the registration (else INVALID_WRITE / INVALID_READ), every op
 * decided on return: 0, TRANSFER_FAIL (the endpoint failed), RPC_TIMEOUT
 * (the deadline passed; the endpoint is then closed and the peer failed). */
void kvp_cucx_run(kvp_cucx *u, kvp_cucx_peer *p, int is_write, kvp_xfer_op *const *ops,
                  size_t n, uint64_t deadline_ms);
#endif
