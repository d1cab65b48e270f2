/*
 * follow.h -- a standby master following its cluster's leader (kvp_follow_*).
 *
 * One thread: finds the leader through etcd, connects with the node
 * credential, asks REPL_FOLLOW, and hands every REPL_DATA body to apply()
 * (in order, on that thread), acknowledging each applied frame (REPL_ACK).
 * A lost leader is looked up again every RETRY ms; a new connection gets a
 * fresh snapshot (it starts with RESET). Never follows its own address.
 */
#ifndef KVP_FOLLOW_H
#define KVP_FOLLOW_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_follow kvp_follow;

typedef struct kvp_follow_opts {
    const char *master;     /* etcd://HOST:PORT[,...]/CLUSTER */
    const char *self;       /* the address this master would publish */
    const char *token;      /* cluster token ("" = none) */
    const char *node_token; /* node credential ("" = none) */
    int timeout_ms;         /* per call */
    /* one REPL_DATA body: 0 and *seq, or a negative code (the connection
     * is dropped and the stream restarts from a snapshot) */
    int (*apply)(void *ctx, const uint8_t *body, size_t len, uint64_t *seq);
    void *ctx;
} kvp_follow_opts;

/* Starts the thread. 0 or KVP_ENOMEM / KVP_EINTERNAL_ERROR. The strings are copied. */
int kvp_follow_start(const kvp_follow_opts *o, kvp_follow **out);
/* Stops and joins it; after this apply() is never called again. */
void kvp_follow_stop(kvp_follow *f);
/* REPL_DATA frames applied so far (any thread). */
uint64_t kvp_follow_frames(const kvp_follow *f);
/* Whether it holds a complete copy of the index of the leader it follows
 * (or last followed): a snapshot's SYNCED applied since its RESET. Any thread. */
int kvp_follow_synced(const kvp_follow *f);

#endif
