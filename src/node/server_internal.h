/*
 * server_internal.h -- the segment server's per-connection state machine
 * driven from memory, for the fuzz target: no sockets, no threads. Only in
 * KVP_FUZZING builds.
 *
 * A connection made here has no descriptor; its input is the bytes given to
 * kvp_segserver_fuzz_feed, read by the very code the workers run, and its
 * answers are handed to a callback as they are queued instead of being sent.
 */
#ifndef KVP_SEGSERVER_INTERNAL_H
#define KVP_SEGSERVER_INTERNAL_H
#ifdef KVP_FUZZING

#include <stddef.h>
#include <stdint.h>

#include "node/server.h"

struct conn;

/* A server over seg with o's checks and limits, one worker, no listener and
 * no thread (o->listen is not used but must be set). Freed by
 * kvp_segserver_stop. 0 or -1. */
int kvp_segserver_fuzz_new(kvp_segment *seg, const kvp_segserver_opts *o, kvp_segserver **out);
struct conn *kvp_segserver_fuzz_conn(kvp_segserver *s, int is_unix);
void kvp_segserver_fuzz_conn_free(kvp_segserver *s, struct conn *c);

/* One answer as it would go out: head (frame header + small body), then
 * dlen bytes of the segment at data (SEG_READ), pass_fd riding along
 * (SHM_ATTACH; the segment's own fd, not to be closed). */
typedef void (*kvp_segserver_fuzz_answer_fn)(void *arg, const uint8_t *head, size_t hlen,
                                             const uint8_t *data, uint64_t dlen, int pass_fd);

/* The peer's next n bytes, through the state machine until all are read or
 * the connection is done with input. 1 while it stays open, 0 once it would
 * be closed (the rest is not read). Aborts when an invariant breaks (a write
 * range or an answer outside the segment, a state's counts past its buffer)
 * or the machine wedges (input left, none read, nothing answered). */
int kvp_segserver_fuzz_feed(kvp_segserver *s, struct conn *c, const uint8_t *p, size_t n,
                            kvp_segserver_fuzz_answer_fn fn, void *arg);

#endif
#endif
