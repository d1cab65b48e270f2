/*
 * master.h -- the master's metadata core: objects, index, segments and
 * their allocators, eviction, leases, pending puts, clients and liveness.
 *
 * The core is a state machine with no I/O and no clock of its own: every
 * entry point takes `now_ms` (a monotonic millisecond clock), so tests drive
 * it with an injected time. The service (service.c) owns sockets and calls
 * in here from its one loop thread; nothing here is thread-safe and nothing
 * needs to be (one thread owns all metadata, DESIGN §3).
 *
 * Object lifecycle (DESIGN §2): PUT_START creates a PENDING object holding
 * its allocations; PUT_END publishes it (COMPLETE); PUT_REVOKE, the writer's
 * disconnect or put_timeout reclaim it. Only COMPLETE objects are visible
 * to GET/EXIST/PREFIX.
 *
 * Every object is on exactly one of these lists, which is what makes victim
 * selection O(1):
 *   pending  PENDING objects, FIFO by put deadline
 *   leased   COMPLETE objects with read leases, FIFO by lease expiry
 *   lru      COMPLETE, unleased, unpinned objects; head = most recent use;
 *            one list per tenant
 *   (none)   COMPLETE, unleased, pinned objects
 * (and the SSD tier's diskio / disk lists, master.c). So the LRU lists hold
 * exactly the evictable objects: eviction pops the tail of the tenant fair
 * eviction chooses (the one most over its share of the pool, else the
 * tenant making room), and pending, leased and pinned objects can never be
 * chosen.
 */
#ifndef KVP_MASTER_H
#define KVP_MASTER_H

#include <stdint.h>

#include "common/buf.h"
#include "common/config.h"
#include "master/kvblk.h"
#include "proto/proto.h"

typedef struct kvp_master kvp_master;
typedef struct kvp_mclient kvp_mclient;

/* Per-connection session state, embedded in the service's connection. */
typedef struct kvp_msess {
    kvp_mclient *client; /* NULL until HELLO succeeded */
    int close_after;     /* set by the core: flush the response, then close */
    uint64_t peer;       /* the peer's address, hashed by the service (0 = unknown):
                            failed HELLOs back off per peer */
    char peer_addr[48];  /* the peer's address as text (service), for messages */
    uint32_t hold_ms;    /* set by the core with close_after: send the answer only
                            after this long (a refused HELLO of a peer backing off) */
    int follower;        /* set by the core: a standby that asked for the index
                            stream (REPL_FOLLOW); its output grows with it */
    int deferred;        /* set by the core: a request of this session is served
                            over several turns (kvp_master_jobs); serve none of
                            its later frames until the core clears it */
    int challenged;      /* set by the core: AUTH_CHALLENGE answered, `auth` holds
                            its transcript; the next HELLO consumes it */
    int auth_tcred;      /* the tenant credential the challenge's kid named, or -1 */
    kvp_auth_tx auth;    /* this connection's handshake (proto/auth.h) */
} kvp_msess;

/* Copies what it needs from cfg and loads cfg->tenant_tokens_file. 0,
 * KVP_ENOMEM, or KVP_ECONFIG (the tenant file; the reason is logged). */
int kvp_master_create(const kvp_config *cfg, uint64_t now_ms, kvp_master **out);
/*
 * A cluster of masters (ha/repl.h). The leader journals every change a new
 * leader needs (an object readable, or no longer in DRAM) as REPL_DATA
 * frames; kvp_master_push_repl hands them to every follower session. A
 * standby applies what it receives to its parked index (objects whose
 * segments have not mounted here); once it is leader, a segment mounting
 * with a parked id takes its objects back (its node kept the bytes), and
 * what is parked client_ttl after the takeover is dropped.
 */
typedef struct kvp_repl_state {
    uint64_t seq;        /* last record journaled */
    uint64_t acked;      /* lowest seq the in-sync followers acknowledged
                            (= seq when there are none) */
    uint32_t followers, in_sync;
} kvp_repl_state;
/* send() gets s = NULL for the snapshot file's copy (cfg->snapshot_file). */
void kvp_master_push_repl(kvp_master *m,
                          void (*send)(kvp_msess *s, const void *p, size_t n, void *ctx),
                          void *ctx);
/* The seq a PUT_END answered now waits for: the last journaled, or 0 when
 * no standby is in sync (nothing to wait for) or ha_sync does not apply
 * (cfg->ha_sync off, or no cfg->etcd: only a cluster's leader waits). */
uint64_t kvp_master_repl_gate(const kvp_master *m);
/* Also marks as lagging (no longer waited for) a follower that leaves any
 * journaled record unacknowledged for more than cfg->ha_sync_timeout_ms
 * (judged by when that record was journaled, not by its last ack: a
 * follower cannot hold a put longer by pacing its acks), and as in sync
 * again one that acknowledged all that was journaled when it fell behind
 * and lacks nothing older than half the timeout. */
void kvp_master_repl_state(kvp_master *m, uint64_t now_ms, kvp_repl_state *st);
/* Standby, before its loop runs: one REPL_DATA body. 0 and *seq, or
 * KVP_EPROTOCOL (nothing applied) / KVP_ENOMEM. */
int kvp_master_repl_apply(kvp_master *m, const uint8_t *body, size_t len, uint64_t *seq);
/*
 * A snapshot of the index (RESET, every readable object and every parked
 * one, SYNCED) as REPL_DATA frames, produced over many calls so that no
 * loop turn grows with the index (master.c says why one cut at any moment
 * converges: the changes journaled meanwhile must reach the same reader
 * after what was made before them). start appends RESET (NULL: no
 * memory); each step appends the next records for about `budget` work
 * units (KVP_MASTER_SNAP_BUDGET: a fraction of a millisecond) and returns
 * 1 once SYNCED is appended, else 0; free stops it (at any point).
 */
typedef struct kvp_msnap kvp_msnap;
#define KVP_MASTER_SNAP_BUDGET (1u << 18)
kvp_msnap *kvp_master_snap_start(kvp_master *m, kvp_buf *out);
int kvp_master_snap_step(kvp_master *m, kvp_msnap *sn, kvp_buf *out, uint64_t budget);
uint64_t kvp_master_snap_count(const kvp_msnap *sn); /* objects written so far */
void kvp_master_snap_free(kvp_master *m, kvp_msnap *sn);
/* The whole snapshot in one call (before the loop runs, at shutdown, tests).
 * Returns the objects written. */
uint64_t kvp_master_snapshot(kvp_master *m, kvp_buf *out);
/* Advances the followers' snapshots (REPL_FOLLOW sends only the first
 * budget): out(s) gives the follower's output, or NULL while its unsent
 * output is above the window it is produced under (backpressure: no
 * faster than the socket drains). Call after kvp_master_push_repl (the
 * order the convergence needs). 1 when a snapshot has more to send and
 * its output had room (the loop should not sleep). */
int kvp_master_push_snaps(kvp_master *m, kvp_buf *(*out)(kvp_msess *s, void *ctx), void *ctx);
/* The standby became the leader at now_ms. */
void kvp_master_takeover(kvp_master *m, uint64_t now_ms);

/* Frees everything; sessions must have been closed first. */
void kvp_master_destroy(kvp_master *m);

/* The random id of this master instance (changes on restart). */
uint64_t kvp_master_id(const kvp_master *m);

/* A connection opened / closed. Closing the last connection of a client
 * revokes its pending puts (the writer is gone); its segments stay mounted
 * until the client's TTL expires, so a node can reconnect after a blip. */
void kvp_master_sess_open(kvp_master *m, kvp_msess *s);
void kvp_master_sess_close(kvp_master *m, kvp_msess *s, uint64_t now_ms);
/* The service read bytes of a frame of s not yet whole, or holds s's
 * input back for want of input memory: its client is not silent, however
 * long its frame takes (client_ttl judges clients that send nothing). */
void kvp_master_sess_alive(kvp_master *m, kvp_msess *s, uint64_t now_ms);
/* True when the session's client was dropped (TTL): close the connection. */
int kvp_master_sess_dead(const kvp_msess *s);

/*
 * Serves one request frame. Appends the whole response frame to `out`
 * (nothing for a ONEWAY request that succeeded). Returns 0, or a negative
 * code when `out` could not take the response (KVP_ENOMEM/KVP_ETOO_LARGE,
 * after which the connection should be closed). Decoding problems are
 * answered, not returned. `a` is scratch, reset by the caller per frame.
 */
int kvp_master_handle(kvp_master *m, kvp_msess *s, const kvp_frame_hdr *h, const uint8_t *body,
                      kvp_arena *a, kvp_buf *out, uint64_t now_ms);

/*
 * Timers: expires leases, pending puts and silent clients, and evicts in
 * the background above the high watermark. Does a bounded amount of work;
 * returns how many ms until it wants to run again (0 = more work pending).
 */
uint32_t kvp_master_tick(kvp_master *m, uint64_t now_ms);

/*
 * Advances the REMOVE_ALL / REMOVE_REGEX jobs by one turn's budget (about
 * a millisecond of work). A finished job's answer is appended to what
 * out_for returns for its session (NULL: not answered) and the session's
 * `deferred` is cleared. Returns 1 while jobs are left (call again next
 * turn without sleeping), else 0.
 */
int kvp_master_jobs(kvp_master *m, uint64_t now_ms, kvp_buf *(*out_for)(kvp_msess *s, void *ctx),
                    void *ctx);

/*
 * The service could not serve for `ms` (a long turn; the process was
 * stopped or descheduled): nothing could be read meanwhile, so every
 * client's silence clock and every pending put's deadline moves on by
 * `ms`. Nobody is judged dead for silence the master could not observe.
 */
void kvp_master_stalled(kvp_master *m, uint64_t ms, uint64_t now_ms);

/*
 * Sends the frees queued since the last call to the nodes owning the
 * segments, as SEG_FREED frames appended to the output `out_for` returns
 * for the node's session (NULL: that node is not told; its descriptors
 * still expire). The service calls it once per loop turn.
 */
void kvp_master_push_freed(kvp_master *m, kvp_buf *(*out_for)(kvp_msess *s, void *ctx),
                           void *ctx);

/*
 * KV events (cfg->kv_events, master/kvblk.h): hands the event batches
 * closed since the last call to sink, per tenant stream in order; the
 * service publishes them (master/kvev.h) once per loop turn. A no-op when
 * events are off.
 */
void kvp_master_take_events(kvp_master *m, kvp_kvblk_sink sink, void *ctx);
/* KV events recorded and not yet taken. */
uint64_t kvp_master_events_pending(const kvp_master *m);

/* LOOKUP_HASHES of one chain in the tenant named tenant[0..tlen) ("" =
 * "default"; an unknown tenant holds nothing), for the HTTP API (the
 * endpoint's token guards it; no session). */
void kvp_master_lookup(kvp_master *m, const char *tenant, size_t tlen, const kvp_hchain *c,
                       kvp_hprefix *out);

/* The service refused a frame it could not parse. */
void kvp_master_note_bad_frame(kvp_master *m);

/* Counters (enum kvp_stat) for logs and tests. */
void kvp_master_stats(const kvp_master *m, uint64_t out[KVP_STAT__COUNT]);
/*
 * The pool's picture for the HTTP endpoint (master/status.h): every
 * mounted segment, then every tenant that exists, at most max_* of each
 * (names whole: both are at most 255 bytes, and two that differ must not
 * share a metric series). The service calls it on its loop.
 */
typedef struct kvp_mview_seg {
    char name[256];
    uint64_t id, capacity, used, replicas, largest_free;
    uint64_t disk_capacity, disk_used, disk_objects, disk_bytes;
} kvp_mview_seg;
typedef struct kvp_mview_tenant {
    char name[256];
    uint64_t objects, bytes, pool_bytes, max_bytes, max_objects, evictions, refused;
    uint32_t share;
} kvp_mview_tenant;
void kvp_master_view(const kvp_master *m, kvp_mview_seg *segs, uint32_t max_segs, uint32_t *nsegs,
                     kvp_mview_tenant *tenants, uint32_t max_tenants, uint32_t *ntenants);
/* The standbys following this leader's index, at most max. */
typedef struct kvp_mview_standby {
    char peer[48];      /* its address */
    char name[64];      /* the name it gave at HELLO */
    uint64_t acked;     /* the last record it acknowledged */
    uint64_t lag;       /* records journaled since */
    int in_sync;        /* a PUT_END waits for it */
} kvp_mview_standby;
uint32_t kvp_master_view_standbys(const kvp_master *m, kvp_mview_standby *out, uint32_t max);
/* The configurations with objects (master/cfgtab.h), then each tenant's
 * "other" (name and fp empty); at most max; the count written. Names are
 * the master's bytes, cut to fit (the caller cleans them for display). */
typedef struct kvp_mview_config {
    char tenant[256];
    char name[256];
    char fp[33];
    uint64_t objects, bytes;
} kvp_mview_config;
uint32_t kvp_master_view_configs(const kvp_master *m, kvp_mview_config *out, uint32_t max);
/* Self-check for tests: index, lists and allocators agree. 0 if so. */
int kvp_master_check(const kvp_master *m);

#endif
