/* http.c -- the HTTP endpoint: routes, methods, credentials, limits. */
#include "net/http.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "kvpool.h"
#include "net/net.h"

#define MOD "http"
#define MAX_CONNS 64   /* connections kept; one more evicts a waiting one */
#define PER_ADDR 8     /* the same, per client address */
/* libmicrohttpd's own limits sit above ours, so that an evicted connection
 * it has not closed yet never makes it refuse the newcomer that evicted it;
 * the connection table has a slot for every connection it may hold */
#define SLACK 16
#define MHD_CONNS (MAX_CONNS + SLACK)
#define MHD_PER_ADDR (PER_ADDR + SLACK)
#define IDLE_S 10
#define HDR_MS 5000    /* a request's headers complete within this, or it is closed */
#define WATCH_MS 200   /* how often the watchdog looks */
#define MAX_ARGS 64    /* query arguments; more is answered 400 */
#define CONN_MEM KVP_HTTP_CONN_MEM /* request line + headers; bigger is refused */
#define BODY_CAP (64u << 20) /* largest answer a handler may write */
#define CTYPE_TEXT "text/plain; charset=utf-8"
/* the status page's inline script and style reach nothing but this host */
#define CSP "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " \
            "connect-src 'self'; img-src data:; frame-ancestors 'none'"

/* A connection libmicrohttpd holds. Waiting (!in_req): its request line
 * and headers are not complete yet -- a new connection, or a kept-alive one
 * between requests -- since t0_ns. Evicted: shut down by us, not yet
 * closed by libmicrohttpd (fd stays valid until the CLOSED notification,
 * which frees the slot under the lock before the socket is closed). */
typedef struct conn_slot {
    int used, evicted, in_req;
    int fd;
    uint64_t t0_ns;
    struct sockaddr_storage addr;
} conn_slot;

struct kvp_http {
    struct MHD_Daemon *d;
    pthread_mutex_t mu; /* guards slots, stop */
    pthread_cond_t cv;
    pthread_t watch;
    int watching, stop;
    conn_slot slots[MHD_CONNS];
    _Atomic uint64_t evicted_n, late_n;
    uint16_t port;
    char what[32];
    char token[256];
    size_t token_len;
    kvp_http_route routes[KVP_HTTP_MAX_ROUTES];
    size_t nroutes;
    _Atomic uint64_t requests;
};

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    const kvp_http *h = cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    KVP_WARN_LIMITED(MOD, "%s: %s", h->what, line);
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const void *body,
                              size_t len, const char *ctype, const char *allow, int auth)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype ? ctype : CTYPE_TEXT);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", CSP);
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (auth)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"kvpool\"");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *text,
                                   const char *allow, int auth)
{
    return answer(c, status, text, strlen(text), CTYPE_TEXT, allow, auth);
}

/* The same client address (port ignored). */
static int same_addr(const struct sockaddr_storage *a, const struct sockaddr *b)
{
    if (a->ss_family != b->sa_family)
        return 0;
    if (b->sa_family == AF_INET)
        return !memcmp(&((const struct sockaddr_in *)(const void *)a)->sin_addr,
                       &((const struct sockaddr_in *)(const void *)b)->sin_addr,
                       sizeof(struct in_addr));
    if (b->sa_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return 0;
}

/* Shuts a connection down; libmicrohttpd sees the end of its stream on its
 * next poll and closes it. Under h->mu. */
static void evict(conn_slot *s)
{
    shutdown(s->fd, SHUT_RDWR);
    s->evicted = 1;
}

/* The accept policy (libmicrohttpd's thread, before the connection is
 * set up): past MAX_CONNS live connections, or PER_ADDR from this address,
 * the oldest waiting one (all of them, or this address's) is evicted to
 * make room; refused only when none is waiting (all are being answered).
 * A slow sender thus cannot hold a slot against a newcomer whose request
 * is quick, a probe's: that one is the newest, evicted last. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    kvp_http *h = cls;
    (void)addrlen;
    enum MHD_Result ok = MHD_YES;
    pthread_mutex_lock(&h->mu);
    size_t live = 0, mine = 0, used = 0;
    conn_slot *old = NULL, *old_mine = NULL;
    for (size_t i = 0; i < MHD_CONNS; i++) {
        conn_slot *s = &h->slots[i];
        if (!s->used)
            continue;
        used++;
        if (s->evicted)
            continue;
        live++;
        int m = same_addr(&s->addr, addr);
        mine += (size_t)m;
        if (s->in_req)
            continue;
        if (!old || s->t0_ns < old->t0_ns)
            old = s;
        if (m && (!old_mine || s->t0_ns < old_mine->t0_ns))
            old_mine = s;
    }
    if (used >= MHD_CONNS) {
        ok = MHD_NO; /* evicted ones not closed yet fill the table */
    } else if (mine >= PER_ADDR) {
        if (old_mine)
            evict(old_mine);
        else
            ok = MHD_NO;
    } else if (live >= MAX_CONNS) {
        if (old)
            evict(old);
        else
            ok = MHD_NO;
    }
    if (ok == MHD_YES && (mine >= PER_ADDR || live >= MAX_CONNS))
        atomic_fetch_add_explicit(&h->evicted_n, 1, memory_order_relaxed);
    pthread_mutex_unlock(&h->mu);
    return ok;
}

static void on_conn(void *cls, struct MHD_Connection *c, void **socket_context,
                    enum MHD_ConnectionNotificationCode code)
{
    kvp_http *h = cls;
    pthread_mutex_lock(&h->mu);
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        conn_slot *s = NULL;
        for (size_t i = 0; i < MHD_CONNS && !s; i++)
            if (!h->slots[i].used)
                s = &h->slots[i];
        if (s && fi) {
            memset(s, 0, sizeof *s);
            s->used = 1;
            s->fd = fi->connect_fd;
            s->t0_ns = kvp_now_ns();
            if (ai && ai->client_addr) {
                socklen_t al = ai->client_addr->sa_family == AF_INET6
                                   ? (socklen_t)sizeof(struct sockaddr_in6)
                                   : (socklen_t)sizeof(struct sockaddr_in);
                memcpy(&s->addr, ai->client_addr, al);
            }
            *socket_context = s;
        } else if (fi) { /* cannot happen: as many slots as MHD's limit */
            shutdown(fi->connect_fd, SHUT_RDWR);
            *socket_context = NULL;
        }
    } else if (*socket_context) { /* CLOSED: before libmicrohttpd closes the socket */
        ((conn_slot *)*socket_context)->used = 0;
        *socket_context = NULL;
    }
    pthread_mutex_unlock(&h->mu);
}

static conn_slot *slot_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

/* A request answered: the connection waits for its next one from now. */
static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
    kvp_http *h = cls;
    (void)req_cls;
    (void)toe;
    conn_slot *s = slot_of(c);
    if (!s)
        return;
    pthread_mutex_lock(&h->mu);
    s->in_req = 0;
    s->t0_ns = kvp_now_ns();
    pthread_mutex_unlock(&h->mu);
}

/* Closes every connection that has waited HDR_MS for its headers, however
 * it paces its bytes (libmicrohttpd's timeout counts silence only). */
static void *watch_main(void *arg)
{
    kvp_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        struct timespec ts = kvp_deadline_ms(WATCH_MS);
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        uint64_t now = kvp_now_ns();
        for (size_t i = 0; i < MHD_CONNS && !h->stop; i++) {
            conn_slot *s = &h->slots[i];
            if (s->used && !s->evicted && !s->in_req &&
                now - s->t0_ns > (uint64_t)HDR_MS * 1000000u) {
                evict(s);
                atomic_fetch_add_explicit(&h->late_n, 1, memory_order_relaxed);
            }
        }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Too many query arguments: each one costs libmicrohttpd a record in the
 * connection's memory, and once that is spent it can no longer answer
 * (the client would wait for the idle timeout). Called with the whole
 * request target before libmicrohttpd splits the query; a query of more
 * than MAX_ARGS arguments is cut there (emptied, in libmicrohttpd's own
 * read buffer, which the URI points into) and the request is marked, so
 * that on_request answers 400. The mark becomes the request's *req_cls.
 * This leans on libmicrohttpd (0.9.75) calling the URI callback with its
 * own buffer before splitting the query there; a version that did not
 * would leave the query alone and hang again, which
 * too_many_query_arguments_are_answered_at_once (test_http.c) catches. */
static char too_many_args;

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls;
    (void)c;
    char *q = strchr(uri, '?');
    if (!q)
        return NULL;
    size_t n = 1;
    for (const char *p = q + 1; *p && *p != ' '; p++)
        n += *p == '&';
    if (n <= MAX_ARGS)
        return NULL;
    q[1] = '\0';
    return &too_many_args;
}

struct kvp_http_req {
    struct MHD_Connection *c;
};

struct args_walk {
    kvp_http_arg_fn fn;
    void *ctx;
    int rc;
};

static enum MHD_Result arg_one(void *cls, enum MHD_ValueKind kind, const char *key,
                               size_t key_size, const char *value, size_t value_size)
{
    struct args_walk *w = cls;
    (void)kind;
    w->rc = w->fn(w->ctx, key ? key : "", key ? key_size : 0, value, value ? value_size : 0);
    return w->rc ? MHD_NO : MHD_YES;
}

int kvp_http_args(const kvp_http_req *req, kvp_http_arg_fn fn, void *ctx)
{
    struct args_walk w = {fn, ctx, 0};
    MHD_get_connection_values_n(req->c, MHD_GET_ARGUMENT_KIND, arg_one, &w);
    return w.rc;
}

/* "Bearer TOKEN" with the configured token (constant time in the token). */
static int authorized(const kvp_http *h, struct MHD_Connection *c)
{
    if (!h->token_len)
        return 1;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer ", 7) != 0)
        return 0;
    v += 7;
    while (*v == ' ')
        v++;
    size_t n = strlen(v);
    while (n && v[n - 1] == ' ')
        n--;
    return kvp_secret_equal(v, n, h->token, h->token_len);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload,
                                  size_t *upload_len, void **req_cls)
{
    kvp_http *h = cls;
    (void)version;
    (void)upload;
    atomic_fetch_add_explicit(&h->requests, 1, memory_order_relaxed);
    conn_slot *slot = slot_of(c);
    if (slot) { /* the headers are in: no longer waiting, not evictable */
        pthread_mutex_lock(&h->mu);
        slot->in_req = 1;
        pthread_mutex_unlock(&h->mu);
    }
    if (*req_cls == &too_many_args)
        return answer_text(c, MHD_HTTP_BAD_REQUEST, "too many query arguments\n", NULL, 0);
    if (strcmp(method, MHD_HTTP_METHOD_GET) && strcmp(method, MHD_HTTP_METHOD_HEAD))
        return answer_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", "GET, HEAD", 0);
    if (*upload_len) /* a GET with a body: not ours to read */
        return answer_text(c, MHD_HTTP_BAD_REQUEST, "a GET has no body\n", NULL, 0);
    const kvp_http_route *rt = NULL;
    for (size_t i = 0; i < h->nroutes; i++)
        if (!strcmp(h->routes[i].path, url))
            rt = &h->routes[i];
    /* the token first: without it, which paths exist is not told */
    if ((!rt || !rt->open) && !authorized(h, c))
        return answer_text(c, MHD_HTTP_UNAUTHORIZED, "a bearer token is needed\n", NULL, 1);
    if (!rt)
        return answer_text(c, MHD_HTTP_NOT_FOUND, "not found\n", NULL, 0);
    kvp_buf body;
    kvp_buf_init(&body, BODY_CAP);
    const char *ctype = NULL;
    kvp_http_req req = {c};
    int status = rt->fn_req ? rt->fn_req(rt->ctx, &req, &body, &ctype)
                            : rt->fn(rt->ctx, &body, &ctype);
    enum MHD_Result rc;
    if (body.err) {
        KVP_WARN_LIMITED(MOD, "%s: %s: the answer did not fit: %s", h->what, url,
                         kvp_strerror(body.err));
        rc = answer_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error\n", NULL, 0);
    } else {
        rc = answer(c, (unsigned)status, body.data ? (const void *)body.data : "", body.len,
                    ctype, NULL, 0);
    }
    kvp_buf_free(&body);
    return rc;
}

int kvp_http_start(const kvp_http_opts *o, kvp_http **out, char *err, size_t errlen)
{
    *out = NULL;
    if (o->nroutes > KVP_HTTP_MAX_ROUTES) {
        snprintf(err, errlen, "too many HTTP routes");
        return KVP_EINVALID_PARAMS;
    }
    for (size_t i = 0; i < o->nroutes; i++)
        if (!o->routes[i].fn == !o->routes[i].fn_req) {
            snprintf(err, errlen, "HTTP route %s: one handler, fn or fn_req", o->routes[i].path);
            return KVP_EINVALID_PARAMS;
        }
    const char *what = o->what ? o->what : "server";
    char host[256], what_http[64];
    uint16_t port;
    if (kvp_net_split(o->listen, host, sizeof host, &port) != 0) {
        snprintf(err, errlen, "http: bad address \"%s\" (expected HOST:PORT)", o->listen);
        return KVP_ECONFIG;
    }
    snprintf(what_http, sizeof what_http, "the %s's HTTP endpoint", what);
    size_t tlen = o->token ? strlen(o->token) : 0;
    int rc = kvp_secret_listen_check(o->listen, tlen > 0, o->insecure, what_http, err, errlen);
    if (rc)
        return rc;
    kvp_http *h = kvp_calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    if (tlen >= sizeof h->token) {
        snprintf(err, errlen, "http: the token is longer than %zu bytes", sizeof h->token - 1);
        kvp_free(h);
        return KVP_ECONFIG;
    }
    snprintf(h->what, sizeof h->what, "%s", what);
    memcpy(h->token, o->token ? o->token : "", tlen);
    h->token_len = tlen;
    memcpy(h->routes, o->routes, o->nroutes * sizeof *o->routes);
    h->nroutes = o->nroutes;
    char lerr[KVP_NET_ERRLEN];
    int fd = kvp_net_listen(o->listen, 64, &h->port, lerr, sizeof lerr);
    if (fd < 0) {
        snprintf(err, errlen, "http: %s", lerr);
        kvp_free(h);
        return KVP_EIO;
    }
    pthread_mutex_init(&h->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->cv, &ca);
    pthread_condattr_destroy(&ca);
    /* one polling thread: the callbacks below run on it, one at a time */
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, on_accept, h,
        on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* first: it covers the rest */
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MHD_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MHD_PER_ADDR,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONN_MEM, MHD_OPTION_NOTIFY_CONNECTION, on_conn, h,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_URI_LOG_CALLBACK, on_uri, h,
        MHD_OPTION_END);
    if (h->d && pthread_create(&h->watch, NULL, watch_main, h) == 0)
        h->watching = 1;
    if (!h->watching) {
        if (h->d)
            MHD_stop_daemon(h->d);
        else
            close(fd);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        snprintf(err, errlen, "http: cannot start the HTTP server on %s", o->listen);
        kvp_free(h);
        return KVP_EIO;
    }
    KVP_INFO(MOD, "%s: serving HTTP on %s (port %u)%s", what, o->listen, h->port,
             tlen ? ", bearer token required" : "");
    *out = h;
    return 0;
}

uint16_t kvp_http_port(const kvp_http *h) { return h->port; }

uint64_t kvp_http_requests(const kvp_http *h)
{
    return atomic_load_explicit(&h->requests, memory_order_relaxed);
}

uint64_t kvp_http_evicted(const kvp_http *h)
{
    return atomic_load_explicit(&h->evicted_n, memory_order_relaxed);
}

uint64_t kvp_http_late(const kvp_http *h)
{
    return atomic_load_explicit(&h->late_n, memory_order_relaxed);
}

void kvp_http_stop(kvp_http *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->mu);
    h->stop = 1; /* first: no shutdown() of a socket MHD_stop_daemon closes */
    pthread_cond_signal(&h->cv);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->watch, NULL);
    MHD_stop_daemon(h->d); /* joins the thread, closes the listener */
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    kvp_free(h);
}
