/*
 * grants.h -- the storage node's check of replica descriptors: which
 * descriptors the master issued (tag), for which operation, until when, and
 * whether the allocation they name is still the live one.
 *
 * A descriptor (proto.h kvp_replica) is honoured when
 *   - its tag is kvp_replica_tag(secret, descriptor),
 *   - its access is the operation asked for (a GET's READ descriptor cannot
 *     write),
 *   - it has not expired: expires_ms + KVP_GRANT_SLACK_MS on the master's
 *     clock. The node maps its clock to the master's through samples taken
 *     around HELLO / HEARTBEAT calls (set_clock): the sample's round trip
 *     bounds its error, and every expiry test uses the LATEST the master's
 *     clock can read now, so a descriptor is never honoured past its
 *     expiry + slack in the master's time, however slow the link.
 *   - and its generation g passes the floor v of every 4 KiB page it
 *     covers: a READ needs v <= 2g + 1, a WRITE v <= 2g.
 * Floors only grow. A page's floor rises to 2g when a write with generation
 * g is accepted there (a newer allocation now owns the page, so older
 * descriptors of it are dead), to 2g + 1 when the master reports the object
 * of allocation g published (WRITE descriptors of it die, READs live on),
 * and to 2g + 2 when it reports the allocation freed (SEG_FREED). Generations
 * of one segment grow across remounts (the node's mount epoch is their high
 * half), so a floor never blocks a live allocation.
 *
 * A transfer in flight is not covered by the check that admitted it: the
 * segment server re-tests it (kvp_grants_live) after every revocation and
 * stops it at its deadline (kvp_grants_check's *deadline_ms).
 *
 * Threads: the segment server's workers check and note writes, the node's
 * master link applies revocations, clock and re-keying; every field is
 * accessed atomically, so no lock is needed. A check and a concurrent
 * revoke may race by one operation (the check passed just before the floor
 * rose): the segment server's revocation barrier (server.h) closes that
 * window before the node acknowledges the revocation.
 */
#ifndef KVP_GRANTS_H
#define KVP_GRANTS_H

#include <stdint.h>

#include "proto/proto.h"

#define KVP_GRANT_SLACK_MS 500 /* clock-offset error tolerated at expiry */

typedef struct kvp_grants kvp_grants;

/* For a segment of `size` bytes (multiple of 4 KiB). 0 or KVP_ENOMEM. */
int kvp_grants_create(uint64_t size, uint64_t secret, kvp_grants **out);
void kvp_grants_destroy(kvp_grants *g);

uint64_t kvp_grants_secret(const kvp_grants *g);
/* A new secret: every descriptor issued under the old one stops working
 * (the node moved to another master, which knows nothing of them). */
void kvp_grants_rekey(kvp_grants *g, uint64_t secret);

/* The master's clock read `master_ms` at some moment between our clock
 * reading `sent_ms` and `recv_ms` (a call's round trip). */
void kvp_grants_set_clock(kvp_grants *g, uint64_t master_ms, uint64_t sent_ms, uint64_t recv_ms);

/*
 * Checks descriptor r for `access` (KVP_ACCESS_*) against a segment of id
 * `segment_id` at local time now_ms. 0, or KVP_EINVALID_READ /
 * KVP_EINVALID_WRITE (by access) for a descriptor that is out of bounds,
 * forged, for the other operation, stale or expired. A WRITE that passes
 * raises the floors of its pages to 2 x its generation. On success
 * *deadline_ms (may be NULL) is the local time after which a transfer on r
 * must not move another byte (its expiry + slack, mapped conservatively).
 */
int kvp_grants_check(kvp_grants *g, uint64_t segment_id, const kvp_replica *r, uint32_t access,
                     uint64_t now_ms, uint64_t *deadline_ms);

/* 1 while a transfer admitted by kvp_grants_check for [offset, offset +
 * length), `generation`, `access` would still pass the floors, else 0. */
int kvp_grants_live(const kvp_grants *g, uint64_t offset, uint64_t length, uint64_t generation,
                    uint32_t access);

/* The allocation of `generation` at [page, page + pages) was freed
 * (published = 0: every descriptor dies) or its object published
 * (published = 1: WRITE descriptors die). Out of range pages are ignored. */
void kvp_grants_freed(kvp_grants *g, uint32_t page, uint32_t pages, uint64_t generation,
                      int published);

/* Refusals since creation, by reason (stale = generation below a floor). */
typedef struct kvp_grants_stats {
    uint64_t forged, wrong_access, expired, stale, out_of_bounds;
} kvp_grants_stats;
void kvp_grants_stats_get(const kvp_grants *g, kvp_grants_stats *out);

#endif
