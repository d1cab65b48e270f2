/*
 * leader.h -- a master's term through etcd, and how the others find it.
 *
 * The leader record is the etcd key /kvpool/<cluster>/leader, created by
 * kvp_etcd_campaign under the candidate's lease; its value is the JSON
 * {"addr": "HOST:PORT", "id": "<16 hex>"} (the address clients dial, the
 * master's instance id). The term's epoch is the key's creation revision:
 * etcd revisions only grow, so a later term always has a larger epoch.
 *
 * A candidate (kvp_leader_campaign) tries to create the key; while another
 * holds it, it is a standby: it polls the record every KVP_LEADER_POLL_MS
 * and tries again once the record is gone (the holder resigned or its lease
 * expired). Once it won, kvp_leader_start_keepalive renews the lease every
 * TTL/3 on a thread of its own; when the lease is gone, or no renewal
 * succeeded for TTL - TTL/4 (etcd unreachable: the lease may expire any
 * moment and a standby take over), or when the record read after a renewal
 * no longer names this term (deleted or overwritten in etcd: a standby may
 * win a new epoch while our lease lives), lost() is called once and the master
 * must stop serving at once (it is fenced by stopping, before etcd can hand
 * the term to another). kvp_leader_close resigns only its own term (the
 * epoch is compared in the same transaction) and revokes the lease.
 *
 * kvp_leader_resolve turns a master address into the one to dial: a plain
 * "HOST:PORT" is returned as is; "etcd://..." is looked up (the current
 * record; none = KVP_ERPC_FAIL "no leader").
 */
#ifndef KVP_LEADER_H
#define KVP_LEADER_H

#include <stddef.h>
#include <stdint.h>

#include "ha/etcd.h"

#define KVP_LEADER_POLL_MS 100
#define KVP_LEADER_ADDR_MAX 255

typedef struct kvp_leader kvp_leader;

typedef struct kvp_leader_info {
    char addr[KVP_LEADER_ADDR_MAX + 1];
    uint64_t id;
    uint64_t epoch;
} kvp_leader_info;

/* The record's key for cluster into out ("/kvpool/NAME/leader"). */
void kvp_leader_key(const char *cluster, char *out, size_t outlen);
/* Parses a record's value. 0 or KVP_EPROTOCOL. */
int kvp_leader_parse_value(const uint8_t *v, size_t n, kvp_leader_info *info);

/* addr -> the address to dial (outlen >= KVP_LEADER_ADDR_MAX + 1); info
 * (may be NULL) gets the record when addr names etcd. */
int kvp_leader_resolve(const char *addr, char *out, size_t outlen, kvp_leader_info *info,
                       char *err, size_t errlen);

/* What etcd says of the cluster url names: the leader (*has_leader) and the
 * members (every master running for it: leader and standbys, each under
 * its own lease), up to max of them in members, *n in all. */
int kvp_leader_cluster(const char *url, kvp_leader_info *leader, int *has_leader,
                       kvp_leader_info *members, int max, int *n, char *err, size_t errlen);

/* A candidate for t's cluster publishing addr and id; ttl_s the lease TTL
 * asked for (etcd may grant more; every deadline here counts from the TTL
 * asked for). */
int kvp_leader_open(const kvp_etcd_target *t, int64_t ttl_s, const char *addr, uint64_t id,
                    kvp_leader **out, char *err, size_t errlen);
/* Blocks until this candidate won (0), stop() returns non-zero
 * (KVP_ECLOSED) or etcd refused the credentials (KVP_EAUTH, logged); etcd
 * being unreachable is retried (and logged). */
int kvp_leader_campaign(kvp_leader *l, int (*stop)(void *arg), void *arg);
/* Before campaigning: once a leader seen by this campaign is gone, while
 * defer(arg) is true (not ready to lead: e.g. its copy of the index is not
 * complete), wait up to max_ms before trying, so a ready standby wins. */
void kvp_leader_set_defer(kvp_leader *l, int (*defer)(void *arg), void *arg, uint64_t max_ms);
uint64_t kvp_leader_epoch(const kvp_leader *l);
/* After a won campaign: until when (kvp_now_ms) the term is surely ours --
 * 3/4 of the TTL after the last lease grant or renewal was sent. */
uint64_t kvp_leader_valid_until(const kvp_leader *l);
/* After a won campaign: the keepalive thread. renewed(arg, valid_until)
 * (may be NULL) runs on it after each renewal; lost(arg, why) once, when the
 * term is given up. */
int kvp_leader_start_keepalive(kvp_leader *l, void (*lost)(void *arg, const char *why),
                               void (*renewed)(void *arg, uint64_t valid_until_ms), void *arg);
/* Stops the thread, resigns the term (if still ours) and revokes the lease. */
void kvp_leader_close(kvp_leader *l);

#endif
