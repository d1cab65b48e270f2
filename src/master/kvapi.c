/* kvapi.c -- GET /api/kv/lookup: the query string parsed and checked, the
 * question handed to the master's loop, the answer as JSON; see kvapi.h. */
#include "master/kvapi.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/mem.h"
#include "kvpool.h"
#include "master/service.h"
#include "master/status.h"
#include "proto/proto.h"

#define MOD "http"
#define MAX_TENANT 255
#define SHOWN 40 /* bytes of a bad argument quoted in an error */

enum { SEEN_HASHES = 1, SEEN_GROUP = 2, SEEN_TENANT = 4 };

/* The query as parsed; err set at the first thing wrong. */
typedef struct query {
    uint64_t *hashes; /* kvp_malloc'd */
    uint32_t n;
    unsigned group;
    const char *tenant; /* the request's (libmicrohttpd's memory) */
    size_t tlen;
    unsigned seen;
    int nomem;
    char err[200];
} query;

/* p[0..n) quoted for an error message: printable ASCII, others as '?',
 * cut at SHOWN bytes. */
static void shown(const char *p, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && i < SHOWN && o + 4 < cap; i++)
        out[o++] = p[i] >= 0x20 && p[i] < 0x7f && p[i] != '"' && p[i] != '\\' ? p[i] : '?';
    if (n > SHOWN && o + 4 < cap)
        out[o++] = '.', out[o++] = '.', out[o++] = '.';
    out[o] = '\0';
}

static int digit(char c, int base)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (base == 16 && c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (base == 16 && c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* p[0..n): an unsigned integer in decimal, or hex after "0x"; 0 with *v
 * when it is at most max, -1 when it is not a number, -2 when larger. */
static int parse_num(const char *p, size_t n, uint64_t max, uint64_t *v)
{
    int base = 10;
    if (n > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        base = 16;
        p += 2;
        n -= 2;
    }
    if (!n)
        return -1;
    uint64_t x = 0;
    int big = 0;
    for (size_t i = 0; i < n; i++) {
        int d = digit(p[i], base);
        if (d < 0)
            return -1;
        if (x > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            big = 1; /* read on: a later non-digit makes it "not a number" */
        else
            x = x * (uint64_t)base + (uint64_t)d;
    }
    if (big || x > max)
        return -2;
    *v = x;
    return 0;
}

static int fail(query *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(query *q, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->err, sizeof q->err, fmt, ap);
    va_end(ap);
    return 1;
}

static int parse_hashes(query *q, const char *v, size_t len)
{
    if (!v || !len)
        return fail(q, "hashes: empty list");
    size_t n = 1;
    for (size_t i = 0; i < len; i++)
        n += v[i] == ',';
    if (n > KVP_KVAPI_MAX_HASHES)
        return fail(q, "hashes: %zu given, at most %u", n, KVP_KVAPI_MAX_HASHES);
    if (!(q->hashes = kvp_malloc(n * sizeof *q->hashes))) {
        q->nomem = 1;
        return 1;
    }
    const char *p = v, *end = v + len;
    for (uint32_t i = 0; i < n; i++) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        size_t l = (size_t)((c ? c : end) - p);
        char s[SHOWN + 8];
        shown(p, l, s, sizeof s);
        if (!l)
            return fail(q, "hashes: hash %u of %zu is empty", i + 1, n);
        int rc = parse_num(p, l, UINT64_MAX, &q->hashes[i]);
        if (rc == -1)
            return fail(q, "hashes: hash %u (\"%s\") is not an unsigned integer (decimal, or "
                        "hex with 0x)", i + 1, s);
        if (rc == -2)
            return fail(q, "hashes: hash %u (\"%s\") is larger than 2^64-1", i + 1, s);
        p = c ? c + 1 : end;
    }
    q->n = (uint32_t)n;
    return 0;
}

/* kvp_http_args's callback: one argument. */
static int one_arg(void *ctx, const char *name, size_t nlen, const char *v, size_t vlen)
{
    query *q = ctx;
    if (!nlen && !v) /* "&&", a leading '&': nothing */
        return 0;
    static const struct {
        const char *name;
        unsigned bit;
    } known[] = {{"hashes", SEEN_HASHES}, {"group", SEEN_GROUP}, {"tenant", SEEN_TENANT}};
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (nlen == strlen(known[i].name) && !memcmp(name, known[i].name, nlen))
            bit = known[i].bit;
    char s[SHOWN + 8];
    shown(name, nlen, s, sizeof s);
    if (!bit)
        return fail(q, "unknown parameter \"%s\" (known: hashes, group, tenant)", s);
    if (q->seen & bit)
        return fail(q, "parameter \"%s\" given twice", s);
    q->seen |= bit;
    if (bit == SEEN_HASHES)
        return parse_hashes(q, v, vlen);
    if (bit == SEEN_GROUP) {
        uint64_t g = 0;
        char sv[SHOWN + 8];
        shown(v ? v : "", vlen, sv, sizeof sv);
        int rc = v ? parse_num(v, vlen, 255, &g) : -1;
        if (rc)
            return fail(q, "group: \"%s\" is not a number from 0 to 255", sv);
        q->group = (unsigned)g;
        return 0;
    }
    if (vlen > MAX_TENANT)
        return fail(q, "tenant: %zu bytes, at most %u", vlen, MAX_TENANT);
    if (vlen && memchr(v, '\0', vlen))
        return fail(q, "tenant: holds a NUL byte");
    q->tenant = v ? v : "";
    q->tlen = vlen;
    return 0;
}

/* {"error": msg}; msg is ASCII (user text passes through shown()). */
static int answer_error(kvp_buf *out, const char **ctype, int status, const char *msg)
{
    json_t *j = json_pack("{s:s}", "error", msg);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return out->err = KVP_ENOMEM, 500;
    kvp_buf_printf(out, "%s\n", text);
    free(text);
    *ctype = "application/json";
    return status;
}

int kvp_kvapi_lookup(void *ctx, const kvp_http_req *req, kvp_buf *out, const char **ctype)
{
    kvp_mserver *s = ctx;
    query q = {.tenant = "", .tlen = 0};
    int status = 200;
    json_t *tname = NULL;
    if (kvp_http_args(req, one_arg, &q) == 0 && !(q.seen & SEEN_HASHES))
        fail(&q, "hashes: missing (hashes=H1,H2,...: the chain's block hashes, in order)");
    if (q.nomem) {
        kvp_free(q.hashes);
        return out->err = KVP_ENOMEM, 500;
    }
    if (!q.err[0] && !(tname = json_stringn(q.tlen ? q.tenant : "default",
                                             q.tlen ? q.tlen : strlen("default"))))
        fail(&q, "tenant: not UTF-8");
    if (q.err[0]) {
        kvp_free(q.hashes);
        return answer_error(out, ctype, 400, q.err);
    }
    kvp_mstatus *st = kvp_mserver_status(s);
    const char *why = "ok";
    kvp_hprefix p = {0};
    int rc = 0;
    if (st && !kvp_mstatus_ready(st, &why)) {
        status = answer_error(out, ctype, 503, why);
    } else {
        kvp_hchain c = {.group = (uint8_t)q.group, .n = q.n, .hashes = q.hashes};
        rc = kvp_mserver_lookup(s, q.tenant, q.tlen, &c, &p, KVP_KVAPI_WAIT_MS);
        if (rc == KVP_ERPC_TIMEOUT) {
            KVP_WARN_LIMITED(MOD, "/api/kv/lookup: the master's loop did not answer in %u ms",
                             KVP_KVAPI_WAIT_MS);
            status = answer_error(out, ctype, 503, "the master's loop did not answer");
        } else if (rc == KVP_ECLOSED) {
            status = answer_error(out, ctype, 503, "the master is stopping");
        } else if (rc) {
            status = answer_error(out, ctype, 500, kvp_strerror(rc));
        }
    }
    if (status == 200) {
        json_t *j = json_pack("{s:O,s:I,s:I,s:I,s:I,s:I}", "tenant", tname, "group",
                              (json_int_t)q.group, "blocks", (json_int_t)q.n, "dram",
                              (json_int_t)p.dram, "disk", (json_int_t)p.disk, "any",
                              (json_int_t)p.any);
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (text) {
            kvp_buf_printf(out, "%s\n", text);
            free(text);
            *ctype = "application/json";
        } else {
            out->err = KVP_ENOMEM;
            status = 500;
        }
    }
    json_decref(tname);
    kvp_free(q.hashes);
    return status;
}
