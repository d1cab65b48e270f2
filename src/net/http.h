/*
 * http.h -- the servers' HTTP endpoint (/metrics, /healthz, /readyz, the
 * master's status page), over libmicrohttpd.
 *
 * One thread of its own polls every connection (a second one, a watchdog,
 * closes connections whose headers are late); handlers run on it, one
 * request at a time, so a handler must be quick and must not block on the
 * server it describes (they read snapshots that the server publishes, see
 * master/status.h; the one exception, /api/kv/lookup, waits at most 2 s
 * for the master's loop, master/kvapi.h). Only GET and HEAD are served
 * (405 otherwise), on exact paths (404 otherwise; the query string is not
 * part of the path); a request body is refused, and so is a request line
 * or header past libmicrohttpd's memory per connection (KVP_HTTP_CONN_MEM:
 * with ordinary headers a URL of up to about 130 KB fits; a longer one is
 * answered 414, a long header 431, and within a few hundred bytes of the
 * bound the connection is closed unanswered); a query of more than 64
 * arguments is answered 400 at once (each costs libmicrohttpd memory of
 * the connection's; past it, it could not even answer).
 *
 * Slots, slow clients (a probe must stay answerable, and the token is only
 * checked once the headers are in): 64 connections, 8 per address. A
 * connection that is "waiting" -- its request line and headers not
 * complete, since it opened or since its previous answer -- is closed 5 s
 * on, however it paces its bytes, and 10 s of silence closes any. A new
 * connection past either limit evicts the oldest waiting one (of its
 * address, or of all), and is refused only when none waits: slow senders
 * cannot hold every slot against a probe, whose quick request is the
 * newest and evicted last (only a flood of new connections within the
 * probe's own round trip could take its place).
 *
 * Credentials follow the other listeners' rules (docs/SECURITY.md): an
 * address beyond loopback needs a token (or `insecure`); once a token is
 * set every request must carry "Authorization: Bearer TOKEN" (compared in
 * constant time), 401 otherwise -- except on the routes marked open (the
 * probes), so that a kubelet or a container health check needs no secret.
 */
#ifndef KVP_HTTP_H
#define KVP_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "common/buf.h"

typedef struct kvp_http kvp_http;

/* A route's handler: writes the body into out (empty for 204) and may set
 * *ctype (default "text/plain; charset=utf-8"); returns the HTTP status.
 * A body that out could not hold (out->err) is answered 500. */
typedef int (*kvp_http_fn)(void *ctx, kvp_buf *out, const char **ctype);

/* The request a kvp_http_req_fn answers: valid only during the call. */
typedef struct kvp_http_req kvp_http_req;
/* A handler that reads its request (the query string's arguments);
 * otherwise as kvp_http_fn. */
typedef int (*kvp_http_req_fn)(void *ctx, const kvp_http_req *req, kvp_buf *out,
                               const char **ctype);

/* Query arguments, percent-decoded ('+' is a space), in the order the URL
 * gives them: fn once per argument, value NULL for a bare "?name" (no
 * '='); lengths count bytes (a decoded value may hold NUL bytes). Stops at
 * fn's first nonzero return and returns it; 0 after the last argument. */
typedef int (*kvp_http_arg_fn)(void *ctx, const char *name, size_t nlen, const char *value,
                               size_t vlen);
int kvp_http_args(const kvp_http_req *req, kvp_http_arg_fn fn, void *ctx);

typedef struct kvp_http_route {
    const char *path; /* exact: "/metrics" */
    kvp_http_fn fn;   /* NULL when fn_req answers */
    void *ctx;
    int open;         /* served without the token: liveness and readiness
                         probes, which tell nothing but "ok" or why not */
    kvp_http_req_fn fn_req; /* instead of fn: a handler that reads the request */
} kvp_http_route;

#define KVP_HTTP_MAX_ROUTES 16
/* libmicrohttpd's memory per connection: the request line and headers
 * must fit in it (with its bookkeeping), so it bounds the URL. */
#define KVP_HTTP_CONN_MEM (128u << 10)

typedef struct kvp_http_opts {
    const char *listen;   /* HOST:PORT (port 0: any free one) */
    const char *token;    /* bearer token every request needs; NULL/"" = none */
    int insecure;         /* beyond loopback without a token */
    const char *what;     /* names the server in messages: "master" */
    const kvp_http_route *routes;
    size_t nroutes;       /* <= KVP_HTTP_MAX_ROUTES */
} kvp_http_opts;

/* Listens and starts the thread. 0, or KVP_ECONFIG / KVP_EIO with err. */
int kvp_http_start(const kvp_http_opts *o, kvp_http **out, char *err, size_t errlen);
uint16_t kvp_http_port(const kvp_http *h);
/* Requests answered so far (any status). */
uint64_t kvp_http_requests(const kvp_http *h);
/* Connections evicted to make room for a newer one, and closed for
 * headers not complete in time (see above). */
uint64_t kvp_http_evicted(const kvp_http *h);
uint64_t kvp_http_late(const kvp_http *h);
/* Stops the threads, closes every connection. NULL is a no-op. */
void kvp_http_stop(kvp_http *h);

#endif
