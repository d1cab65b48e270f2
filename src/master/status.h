/*
 * status.h -- what the master's HTTP endpoint shows: Prometheus metrics,
 * /api/stats (JSON), the status page, /healthz and /readyz.
 *
 * The master's core belongs to one thread (its loop, or before the loop
 * runs the standby's follower), so the HTTP thread never reads it: that
 * thread publishes a copy of the counters, segments and tenants here at
 * most once a second (kvp_mstatus_due / kvp_mstatus_publish), and every
 * request is answered from the last copy under a mutex. A scrape costs
 * the loop nothing; what it sees is at most a second old. Per-request
 * figures (latency per op, errors per code) are lock-free counters the
 * loop adds to as it serves (kvp_mstatus_op).
 */
#ifndef KVP_MSTATUS_H
#define KVP_MSTATUS_H

#include <stdint.h>

#include "common/buf.h"
#include "master/master.h"

typedef struct kvp_mstatus kvp_mstatus;

enum kvp_mrole { KVP_MROLE_SINGLE = 0, KVP_MROLE_STANDBY, KVP_MROLE_LEADER };

/* Why the service closed or refused a connection. */
enum kvp_mrefuse {
    KVP_MREFUSE_MAX_CONNS = 0, /* accept: max_connections open */
    KVP_MREFUSE_PRE_HELLO,     /* accept: too many connections before HELLO */
    KVP_MREFUSE_PER_ADDR,      /* accept: max_conns_per_addr from that address */
    KVP_MREFUSE_MEMORY,        /* accept: out of memory */
    KVP_MREFUSE_EVICTED,       /* closed before HELLO for a newer connection */
    KVP_MREFUSE_HELLO_TIMEOUT, /* closed: no HELLO in time */
    KVP_MREFUSE_HELLO_BACKOFF, /* a refused HELLO answered late (back-off) */
    KVP_MREFUSE__COUNT
};

/* The service's own figures, published with the core's. */
typedef struct kvp_msvc {
    uint64_t conns;
    uint64_t refused[KVP_MREFUSE__COUNT];
    uint64_t input_waits;      /* connections that waited for input memory */
    uint64_t input_used, input_budget;
    uint64_t turns, longest_turn_ms;
    uint64_t master_id;
    int kv_events;             /* the KV events' publisher runs (master/kvev.h) */
    uint64_t kv_sent, kv_dropped, kv_replays, kv_replayed; /* its batches, requests */
} kvp_msvc;

/* listen: the master's address, shown on the page. NULL when out of memory. */
kvp_mstatus *kvp_mstatus_new(const char *listen);
void kvp_mstatus_free(kvp_mstatus *st);

/* The owner thread. */
void kvp_mstatus_role(kvp_mstatus *st, int role);
/* One frame served: its op, how long it took, the answer's status. */
void kvp_mstatus_op(kvp_mstatus *st, uint16_t op, uint64_t ns, int32_t status);
/* 1 when a second has passed since the last publish. */
int kvp_mstatus_due(const kvp_mstatus *st, uint64_t now_ms);
void kvp_mstatus_publish(kvp_mstatus *st, const kvp_master *m, const kvp_msvc *svc,
                         uint64_t now_ms);

/* The HTTP thread: kvp_http_fn handlers, ctx = the kvp_mstatus. */
int kvp_mstatus_metrics(void *st, kvp_buf *out, const char **ctype);
int kvp_mstatus_api(void *st, kvp_buf *out, const char **ctype);
int kvp_mstatus_page(void *st, kvp_buf *out, const char **ctype);
/* Mooncake's GET /get_all_segments: the mounted segments' names, one a
 * line (empty: none yet); 503 on a standby. */
int kvp_mstatus_segments(void *st, kvp_buf *out, const char **ctype);
/* 200 while the loop publishes (a standby: while it follows); 503 when it
 * has not for 5 s (stuck). */
int kvp_mstatus_healthz(void *st, kvp_buf *out, const char **ctype);
/* 200 when serving clients: a single master, or the leader; 503 for a
 * standby ("standby") or a stuck loop. */
int kvp_mstatus_readyz(void *st, kvp_buf *out, const char **ctype);
/* Appends the metrics alone (no status), for an endpoint that serves
 * more than the master (kvpool serve). */
void kvp_mstatus_write_metrics(kvp_mstatus *st, kvp_buf *out);
/* The same checks as the handlers, as 1 (ok) or 0 with *why. */
int kvp_mstatus_healthy(kvp_mstatus *st, const char **why);
int kvp_mstatus_ready(kvp_mstatus *st, const char **why);

/* The status page (static HTML with its script). */
extern const char kvp_mstatus_html[];

#endif
