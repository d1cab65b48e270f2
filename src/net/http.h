/*
 * http.h -- the servers' HTTP endpoint (/metrics, /healthz, /readyz, the
 * master's status page), over libmicrohttpd.
 *
 * One thread of its own polls every connection; handlers run on it, one
 * request at a time, so a handler must be quick and must not block on the
 * server it describes (they read snapshots that the server publishes, see
 * master/status.h). Only GET and HEAD are served (405 otherwise), on exact
 * paths (404 otherwise); a request body, a long URL or header is refused
 * by libmicrohttpd's memory limit. Limits: 64 connections, 8 per address,
 * 10 s of silence closes a connection.
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

typedef struct kvp_http_route {
    const char *path; /* exact: "/metrics" */
    kvp_http_fn fn;
    void *ctx;
    int open;         /* served without the token: liveness and readiness
                         probes, which tell nothing but "ok" or why not */
} kvp_http_route;

#define KVP_HTTP_MAX_ROUTES 16

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
/* Stops the thread, closes every connection. NULL is a no-op. */
void kvp_http_stop(kvp_http *h);

#endif
