/*
 * service.h -- the master's network service: one epoll thread that owns
 * the listener, every connection and the metadata core (master.h).
 *
 * Requests are pipelined: a connection may send many frames before reading
 * answers; they are served in order and answered by request id. Work per
 * loop iteration is bounded (frames per connection per turn, bytes read per
 * turn), so one busy client cannot starve the others. A connection whose
 * unsent output passes a bound stops being read until it drains.
 *
 * Limits against peers that never authenticate or never read
 * (docs/ARCHITECTURE.md, "Service"): before HELLO a connection may send
 * only a small frame (64 KiB body) and must complete HELLO within
 * cfg->hello_timeout_ms, else it is answered and closed; such connections
 * may hold 7/8 of cfg->max_connections and cfg->max_conns_per_addr per
 * address: a new one over a cap evicts the oldest of its set (service.c),
 * so a flood cannot keep a prompt HELLO out. A refused HELLO of a peer
 * backing off is answered late without blocking the loop. All input buffers
 * together hold at most cfg->input_budget bytes; a connection whose next
 * frame does not fit is not read until it does. Out of descriptors, the
 * listener is not watched for 100 ms .. 1 s. Peer-triggered log lines are
 * rate-limited.
 */
#ifndef KVP_SERVICE_H
#define KVP_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

typedef struct kvp_mserver kvp_mserver;

/*
 * Binds cfg->listen and builds the core. With handle_signals, SIGTERM and
 * SIGINT (which the caller must have blocked in every thread) stop the loop.
 * 0 or a negative code with a message in err.
 */
int kvp_mserver_create(const kvp_config *cfg, int handle_signals, kvp_mserver **out, char *err,
                       size_t errlen);
/* The bound TCP port (the real one when cfg->listen asked for port 0). */
uint16_t kvp_mserver_port(const kvp_mserver *s);
/* The core's instance id (HELLO answers it; a cluster's leader record names it). */
uint64_t kvp_mserver_master_id(const kvp_mserver *s);
/* Runs until stopped. 0 on a clean stop. */
int kvp_mserver_run(kvp_mserver *s);
/* Asks the loop to stop; callable from any thread or a signal handler. */
void kvp_mserver_stop(kvp_mserver *s);
/* A cluster's leader: the term is known valid until valid_until_ms
 * (kvp_now_ms clock; 0 = no term, the default). Before each request is
 * handled the deadline is checked: past it the master answers nothing more
 * and the loop stops (a leader stalled past its lease, e.g. stopped by a
 * signal, must not serve beside its successor). Any thread. */
void kvp_mserver_set_term(kvp_mserver *s, uint64_t valid_until_ms);
/* Whether the loop stopped because the term ran out. */
int kvp_mserver_term_over(const kvp_mserver *s);
/* A standby, before run(), from one thread at a time: a REPL_DATA body of
 * the leader's index stream (kvp_master_repl_apply). */
int kvp_mserver_repl_apply(kvp_mserver *s, const uint8_t *body, size_t len, uint64_t *seq);
/* A standby (before run()): on = a thread answers every connection's first
 * frame KVP_EAGAIN (not the leader) and closes it; off = stops it (joined). */
void kvp_mserver_standby(kvp_mserver *s, int on);
/* The standby won the election (before run()): what it followed is taken
 * over as its segments mount. */
void kvp_mserver_takeover(kvp_mserver *s);
/* Closes every connection and frees everything. Not while run() runs. */
void kvp_mserver_destroy(kvp_mserver *s);
/* cfg.http: what the HTTP endpoint shows (master/status.h); NULL without
 * it. Lives as long as s. */
struct kvp_mstatus;
struct kvp_mstatus *kvp_mserver_status(kvp_mserver *s);
/*
 * kvp_master_lookup for the HTTP API (master/kvapi.h), from any thread but
 * the loop's: the query joins a queue under a mutex, the loop is woken
 * through its eventfd and answers it in its next turn (while it runs: a
 * query made before run() waits for it), and the caller sleeps on a
 * condition variable meanwhile. 0 with *out; KVP_ERPC_TIMEOUT when no
 * answer came within wait_ms (the query is withdrawn); KVP_ECLOSED once the
 * loop has stopped (queries still waiting are released with it). tenant
 * and c are only read, and only until it returns. Every caller must have
 * returned before kvp_mserver_destroy (stop the HTTP endpoint first).
 */
struct kvp_hchain;
struct kvp_hprefix;
int kvp_mserver_lookup(kvp_mserver *s, const char *tenant, size_t tlen,
                       const struct kvp_hchain *c, struct kvp_hprefix *out, uint32_t wait_ms);
#endif
