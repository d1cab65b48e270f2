/* http.c -- the HTTP endpoint: routes, methods, credentials, limits. */
#include "net/http.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mem.h"
#include "common/secret.h"
#include "kvpool.h"
#include "net/net.h"

#define MOD "http"
#define MAX_CONNS 64
#define PER_ADDR 8
#define IDLE_S 10
#define CONN_MEM KVP_HTTP_CONN_MEM /* request line + headers; bigger is refused */
#define BODY_CAP (64u << 20) /* largest answer a handler may write */
#define CTYPE_TEXT "text/plain; charset=utf-8"
/* the status page's inline script and style reach nothing but this host */
#define CSP "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " \
            "connect-src 'self'; img-src data:; frame-ancestors 'none'"

struct kvp_http {
    struct MHD_Daemon *d;
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
    (void)req_cls;
    atomic_fetch_add_explicit(&h->requests, 1, memory_order_relaxed);
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
    h->d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h, /* first: it covers the rest */
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MAX_CONNS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)PER_ADDR,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONN_MEM, MHD_OPTION_END);
    if (!h->d) {
        close(fd);
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

void kvp_http_stop(kvp_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d); /* joins the thread, closes the listener */
    kvp_free(h);
}
