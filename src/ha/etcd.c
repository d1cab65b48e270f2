/* etcd.c -- etcd v3 HTTP/JSON gateway client (contracts in etcd.h). */
#include "ha/etcd.h"

#include <ctype.h>
#include <curl/curl.h>
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/secret.h"
#include "common/mem.h"
#include "kvpool.h"

#define MOD "etcd"

/* ------------------------------------------------------------ addresses */

int kvp_etcd_is_url(const char *s) { return s && strncmp(s, "etcd://", 7) == 0; }

static int fail(char *err, size_t errlen, const char *msg, const char *what)
{
    if (err && errlen)
        snprintf(err, errlen, "%s%s%s", msg, what ? ": " : "", what ? what : "");
    return KVP_EINVALID_PARAMS;
}

/* "HOST:PORT": a host of [A-Za-z0-9.-] (or [v6]), a port 1..65535. */
static int endpoint_ok(const char *p, size_t n)
{
    if (n == 0 || n > KVP_ETCD_MAX_HOST)
        return 0;
    const char *colon = NULL;
    for (size_t i = n; i-- > 0;)
        if (p[i] == ':') {
            colon = p + i;
            break;
        }
    if (!colon || colon == p || (size_t)(colon - p) + 1 >= n)
        return 0;
    for (const char *q = p; q < colon; q++)
        if (!isalnum((unsigned char)*q) && *q != '.' && *q != '-' && *q != '[' && *q != ']' &&
            *q != ':')
            return 0;
    unsigned long port = 0;
    for (const char *q = colon + 1; q < p + n; q++) {
        if (!isdigit((unsigned char)*q))
            return 0;
        port = port * 10 + (unsigned long)(*q - '0');
        if (port > 65535)
            return 0;
    }
    return port > 0;
}

int kvp_etcd_cluster_ok(const char *name, size_t n)
{
    if (!name || n == 0 || n > KVP_ETCD_MAX_CLUSTER)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '.' && name[i] != '_' && name[i] != '-')
            return 0;
    return 1;
}

/* ----------------------------------------------------- credentials */

static pthread_mutex_t auth_mu = PTHREAD_MUTEX_INITIALIZER;
static kvp_etcd_auth auth_cur; /* under auth_mu */

void kvp_etcd_auth_set(const kvp_etcd_auth *a)
{
    pthread_mutex_lock(&auth_mu);
    if (a)
        auth_cur = *a;
    else
        memset(&auth_cur, 0, sizeof auth_cur);
    pthread_mutex_unlock(&auth_mu);
}

/* A file key's value into out: readable, fits. 0 or KVP_ECONFIG. */
static int file_key(const char *key, const char *path, char *out, size_t cap, char *err,
                    size_t errlen)
{
    if (!path || !*path)
        return 0;
    if (strlen(path) >= cap || access(path, R_OK) != 0) {
        snprintf(err, errlen, "key \"%s\": cannot read %.200s", key, path);
        return KVP_ECONFIG;
    }
    snprintf(out, cap, "%s", path);
    return 0;
}

int kvp_etcd_auth_configure(const char *user, const char *password_file, const char *cacert,
                            const char *cert, const char *key, char *err, size_t errlen)
{
    kvp_etcd_auth a;
    memset(&a, 0, sizeof a);
    int has_user = user && *user, has_pw = password_file && *password_file;
    if (has_user != has_pw) {
        snprintf(err, errlen, "key \"%s\" needs key \"%s\" (etcd authentication)",
                 has_user ? "etcd_user" : "etcd_password_file",
                 has_user ? "etcd_password_file" : "etcd_user");
        return KVP_ECONFIG;
    }
    int rc = 0;
    if (has_user) {
        if (strlen(user) >= sizeof a.user) {
            snprintf(err, errlen, "key \"etcd_user\": longer than %zu bytes", sizeof a.user - 1);
            return KVP_ECONFIG;
        }
        snprintf(a.user, sizeof a.user, "%s", user);
        char why[300];
        rc = kvp_secret_read_file(password_file, a.password, sizeof a.password, why, sizeof why);
        if (rc) {
            snprintf(err, errlen, "key \"etcd_password_file\": %s", why);
            return KVP_ECONFIG;
        }
    }
    if ((cert && *cert) != (key && *key)) {
        snprintf(err, errlen, "keys \"etcd_cert\" and \"etcd_key\" go together");
        rc = KVP_ECONFIG;
    } else if (cert && *cert && !(cacert && *cacert)) {
        snprintf(err, errlen, "key \"etcd_cert\" needs key \"etcd_cacert\" (https)");
        rc = KVP_ECONFIG;
    }
    if (!rc)
        rc = file_key("etcd_cacert", cacert, a.cacert, sizeof a.cacert, err, errlen);
    if (!rc)
        rc = file_key("etcd_cert", cert, a.cert, sizeof a.cert, err, errlen);
    if (!rc)
        rc = file_key("etcd_key", key, a.key, sizeof a.key, err, errlen);
    if (!rc)
        kvp_etcd_auth_set(&a);
    memset(a.password, 0, sizeof a.password);
    return rc;
}

/* ------------------------------------------------------------ endpoints */

static int add_endpoint(kvp_etcd_target *t, const char *p, size_t n, char *err, size_t errlen)
{
    int https = n > 8 && strncmp(p, "https://", 8) == 0;
    if (https || (n > 7 && strncmp(p, "http://", 7) == 0)) {
        if (t->n && https != t->https)
            return fail(err, errlen, "etcd endpoints mix http:// and https://", NULL);
        t->https = https;
        p += 7 + https;
        n -= 7 + (size_t)https;
    }
    if (n && p[n - 1] == '/')
        n--;
    if (!endpoint_ok(p, n))
        return fail(err, errlen, "etcd endpoint is not HOST:PORT", NULL);
    if (t->n >= KVP_ETCD_MAX_ENDPOINTS)
        return fail(err, errlen, "too many etcd endpoints (at most 8)", NULL);
    memcpy(t->endpoints[t->n], p, n);
    t->endpoints[t->n][n] = '\0';
    t->n++;
    return 0;
}

int kvp_etcd_parse_url(const char *s, kvp_etcd_target *t, char *err, size_t errlen)
{
    if (!s || !t)
        return fail(err, errlen, "no etcd address", NULL);
    memset(t, 0, sizeof *t);
    const char *p = s, *end;
    if (kvp_etcd_is_url(s)) {
        p = s + 7;
        const char *slash = strchr(p, '/');
        end = slash ? slash : p + strlen(p);
        const char *name = slash ? slash + 1 : "";
        size_t nl = strlen(name);
        if (nl == 0) {
            name = "default";
            nl = 7;
        }
        if (!kvp_etcd_cluster_ok(name, nl))
            return fail(err, errlen, "a cluster name is 1 to 64 letters, digits, '.', '_', '-'",
                        name);
        memcpy(t->cluster, name, nl);
    } else if (strncmp(s, "http://", 7) == 0 || strncmp(s, "https://", 8) == 0) {
        end = s + strlen(s);
        strcpy(t->cluster, "default");
    } else {
        return fail(err, errlen, "an etcd address is etcd://HOST:PORT[,HOST:PORT]/CLUSTER", s);
    }
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;
        int rc = add_endpoint(t, p, (size_t)(e - p), err, errlen);
        if (rc)
            return rc;
        p = comma ? comma + 1 : end;
        if (comma && p == end)
            return fail(err, errlen, "empty etcd endpoint", NULL);
    }
    if (t->n == 0)
        return fail(err, errlen, "no etcd endpoint", s);
    pthread_mutex_lock(&auth_mu);
    t->auth = auth_cur;
    pthread_mutex_unlock(&auth_mu);
    if (kvp_etcd_is_url(s) && t->auth.cacert[0])
        t->https = 1; /* etcd:// with a CA: the cluster's etcd speaks TLS */
    return 0;
}

/* -------------------------------------------------------------- base64 */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* NUL-terminated encoding of n bytes (caller frees), NULL on ENOMEM. */
static char *b64_encode(const uint8_t *p, size_t n)
{
    char *o = kvp_malloc((n + 2) / 3 * 4 + 1), *q = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *q++ = B64[v >> 18 & 63];
        *q++ = B64[v >> 12 & 63];
        *q++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *q = '\0';
    return o;
}

static int b64_val(char c)
{
    const char *x = c ? strchr(B64, c) : NULL;
    return x ? (int)(x - B64) : -1;
}

/* Strict decoding (padded, canonical length) of s into out (cap bytes).
 * Bytes written, -1 malformed, -2 too long for cap. */
static long b64_decode(const char *s, size_t n, uint8_t *out, size_t cap)
{
    if (n % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            if (s[i + k] == '=' && i + 4 == n && k >= 2) {
                v[k] = 0;
                pad++;
                continue;
            }
            if (pad || (v[k] = b64_val(s[i + k])) < 0)
                return -1;
        }
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | (uint32_t)v[3];
        size_t k = 3 - (size_t)pad;
        if (o + k > cap)
            return -2;
        out[o++] = (uint8_t)(w >> 16);
        if (k > 1)
            out[o++] = (uint8_t)(w >> 8);
        if (k > 2)
            out[o++] = (uint8_t)w;
    }
    return (long)o;
}

/* -------------------------------------------------------------- parsing */

/* An int64 etcd writes as a decimal string (or, leniently, a JSON integer).
 * Absent: *v = 0, ok. */
static int num_field(json_t *o, const char *name, int64_t lo, uint64_t *v)
{
    json_t *x = json_object_get(o, name);
    *v = 0;
    if (!x)
        return 0;
    if (json_is_integer(x)) {
        json_int_t i = json_integer_value(x);
        if (i < lo)
            return -1;
        *v = (uint64_t)i;
        return 0;
    }
    if (!json_is_string(x))
        return -1;
    const char *s = json_string_value(x);
    size_t n = json_string_length(x), i0 = n && s[0] == '-';
    if ((i0 && lo >= 0) || n == i0 || n - i0 > 20)
        return -1;
    uint64_t r = 0;
    for (size_t i = i0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (r > (UINT64_MAX - d) / 10)
            return -1;
        r = r * 10 + d;
    }
    if ((i0 || lo < 0) && r > (uint64_t)INT64_MAX)
        return -1;
    *v = i0 ? (uint64_t)(-(int64_t)r) : r;
    return 0;
}

static int parse_kv(json_t *kv, kvp_etcd_answer *a, uint8_t *val, size_t cap)
{
    if (!json_is_object(kv))
        return KVP_EPROTOCOL;
    if (num_field(kv, "create_revision", 0, &a->kv.create_revision) ||
        num_field(kv, "mod_revision", 0, &a->kv.mod_revision) ||
        num_field(kv, "version", 0, &a->kv.version) || num_field(kv, "lease", 0, &a->kv.lease))
        return KVP_EPROTOCOL;
    json_t *v = json_object_get(kv, "value");
    a->kv.value_len = 0;
    if (v) {
        if (!json_is_string(v))
            return KVP_EPROTOCOL;
        long n = b64_decode(json_string_value(v), json_string_length(v), val, val ? cap : 0);
        if (n == -1)
            return KVP_EPROTOCOL;
        if (n == -2)
            return KVP_EBUFFER_OVERFLOW;
        a->kv.value_len = (size_t)n;
    }
    a->found = true;
    return 0;
}

/* The first kv of a range answer object r, when there is one. */
static int parse_range(json_t *r, kvp_etcd_answer *a, uint8_t *val, size_t cap)
{
    json_t *kvs = json_object_get(r, "kvs");
    if (!kvs)
        return 0;
    if (!json_is_array(kvs))
        return KVP_EPROTOCOL;
    if (json_array_size(kvs) == 0)
        return 0;
    return parse_kv(json_array_get(kvs, 0), a, val, cap);
}

static int parse_txn(json_t *root, kvp_etcd_answer *a, uint8_t *val, size_t cap)
{
    json_t *s = json_object_get(root, "succeeded");
    if (s && !json_is_boolean(s))
        return KVP_EPROTOCOL;
    a->succeeded = s && json_is_true(s);
    json_t *rs = json_object_get(root, "responses");
    if (!rs)
        return 0;
    if (!json_is_array(rs))
        return KVP_EPROTOCOL;
    json_t *r0 = json_array_get(rs, 0);
    if (!r0)
        return 0;
    if (!json_is_object(r0))
        return KVP_EPROTOCOL;
    json_t *rr = json_object_get(r0, "response_range");
    if (rr && !json_is_object(rr))
        return KVP_EPROTOCOL;
    return rr ? parse_range(rr, a, val, cap) : 0;
}

/* {"token": "..."}: 1..KVP_ETCD_MAX_TOKEN bytes of 0x21..0x7e into a->token. */
static int parse_token(json_t *obj, kvp_etcd_answer *a)
{
    json_t *t = json_object_get(obj, "token");
    if (!json_is_string(t))
        return KVP_EPROTOCOL;
    size_t n = json_string_length(t);
    const char *s = json_string_value(t);
    if (n == 0 || n > KVP_ETCD_MAX_TOKEN)
        return KVP_EPROTOCOL;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e)
            return KVP_EPROTOCOL;
    memcpy(a->token, s, n);
    a->token[n] = '\0';
    return 0;
}

int kvp_etcd_parse(const char *body, size_t len, int kind, kvp_etcd_answer *a, uint8_t *val,
                   size_t cap)
{
    if (!body || !a || kind < KVP_ETCD_ANS_PLAIN || kind > KVP_ETCD_ANS_AUTH)
        return KVP_EINVALID_PARAMS;
    memset(a, 0, sizeof *a);
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return KVP_EPROTOCOL;
    int rc = KVP_EPROTOCOL;
    if (!json_is_object(root))
        goto out;
    /* an error answer: {"error": ..., "message": ..., "code": N} */
    json_t *code = json_object_get(root, "code");
    if (code || json_object_get(root, "error")) {
        json_t *msg = json_object_get(root, "message");
        if (!json_is_integer(code) || json_integer_value(code) <= 0 ||
            json_integer_value(code) > 1000 || (msg && !json_is_string(msg)))
            goto out;
        a->etcd_code = (int)json_integer_value(code);
        snprintf(a->message, sizeof a->message, "%s", msg ? json_string_value(msg) : "");
        rc = 0;
        goto out;
    }
    json_t *obj = root;
    if (kind == KVP_ETCD_ANS_KEEPALIVE) { /* a stream's one message: {"result": {...}} */
        obj = json_object_get(root, "result");
        if (!json_is_object(obj))
            goto out;
    }
    json_t *h = json_object_get(obj, "header");
    if (h && (!json_is_object(h) || num_field(h, "revision", 0, &a->revision)))
        goto out;
    switch (kind) {
    case KVP_ETCD_ANS_RANGE:
        rc = parse_range(obj, a, val, cap);
        break;
    case KVP_ETCD_ANS_TXN:
        rc = parse_txn(obj, a, val, cap);
        break;
    case KVP_ETCD_ANS_GRANT:
    case KVP_ETCD_ANS_KEEPALIVE: {
        uint64_t ttl;
        if (num_field(obj, "ID", 0, &a->lease_id) || num_field(obj, "TTL", INT64_MIN, &ttl))
            break;
        a->ttl = (int64_t)ttl;
        if (!json_object_get(obj, "TTL"))
            a->ttl = kind == KVP_ETCD_ANS_GRANT ? -1 : 0;
        rc = kind == KVP_ETCD_ANS_GRANT && (a->lease_id == 0 || a->ttl <= 0) ? KVP_EPROTOCOL : 0;
        break;
    }
    case KVP_ETCD_ANS_AUTH: /* the token goes into an HTTP header: no byte outside 0x21..0x7e */
        rc = parse_token(obj, a);
        break;
    default:
        rc = 0;
    }
out:
    json_decref(root);
    return rc;
}

int kvp_etcd_parse_list(const char *body, size_t len, kvp_etcd_list_fn f, void *arg)
{
    if (!body || !f)
        return KVP_EINVALID_PARAMS;
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    json_t *kvs = json_object_get(root, "kvs");
    int rc = json_is_object(root) && (!kvs || json_is_array(kvs)) ? 0 : KVP_EPROTOCOL;
    size_t n = kvs ? json_array_size(kvs) : 0;
    if (n > KVP_ETCD_MAX_LIST)
        rc = KVP_EPROTOCOL;
    uint8_t *kb = rc ? NULL : kvp_malloc(KVP_ETCD_MAX_KEY);
    uint8_t *vb = rc ? NULL : kvp_malloc(KVP_ETCD_MAX_VALUE);
    if (!rc && (!kb || !vb))
        rc = KVP_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        json_t *kv = json_array_get(kvs, i), *k = json_object_get(kv, "key");
        kvp_etcd_answer a;
        memset(&a, 0, sizeof a);
        if (!json_is_string(k)) {
            rc = KVP_EPROTOCOL;
            break;
        }
        long kl = b64_decode(json_string_value(k), json_string_length(k), kb, KVP_ETCD_MAX_KEY);
        if (kl <= 0 || (rc = parse_kv(kv, &a, vb, KVP_ETCD_MAX_VALUE)) != 0) {
            rc = rc ? (rc == KVP_EBUFFER_OVERFLOW ? KVP_EPROTOCOL : rc) : KVP_EPROTOCOL;
            break;
        }
        rc = f(kb, (size_t)kl, vb, a.kv.value_len, &a.kv, arg);
    }
    kvp_free(kb);
    kvp_free(vb);
    json_decref(root);
    return rc;
}

/* -------------------------------------------------------------- libcurl */

/* libcurl, loaded at the first open (a program that never speaks to etcd
 * does not need it). */
static struct {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(CURLcode);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    int ok;
    char why[200];
} C;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_load(void)
{
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(C.why, sizeof C.why, "etcd needs libcurl (libcurl.so.4): %s", dlerror());
        return;
    }
#define SYM(field, name)                                                                \
    if (!(*(void **)&C.field = dlsym(h, name))) {                                      \
        snprintf(C.why, sizeof C.why, "libcurl.so.4 lacks %s", name);                    \
        return;                                                                          \
    }
    SYM(global_init, "curl_global_init")
    SYM(easy_init, "curl_easy_init")
    SYM(easy_setopt, "curl_easy_setopt")
    SYM(easy_perform, "curl_easy_perform")
    SYM(easy_getinfo, "curl_easy_getinfo")
    SYM(easy_cleanup, "curl_easy_cleanup")
    SYM(easy_strerror, "curl_easy_strerror")
    SYM(slist_append, "curl_slist_append")
    SYM(slist_free_all, "curl_slist_free_all")
#undef SYM
    if (C.global_init(CURL_GLOBAL_NOTHING) != CURLE_OK) {
        snprintf(C.why, sizeof C.why, "curl_global_init failed");
        return;
    }
    C.ok = 1; /* the library stays loaded for the life of the process */
}

struct kvp_etcd {
    kvp_etcd_target t;
    int cur; /* the endpoint calls go to first */
    int timeout_ms;
    pthread_mutex_t lock;
    CURL *curl;
    struct curl_slist *hdrs;  /* Content-Type */
    struct curl_slist *ahdrs; /* Content-Type and Authorization: the token, NULL = none */
    int authed;               /* calls go with ahdrs (0: no token yet, or etcd dropped it) */
    char *ans; /* the answer being received (KVP_ETCD_MAX_ANSWER + 1) */
    size_t ans_len;
    int ans_over;
    char err[256];
};

static size_t on_data(char *p, size_t sz, size_t nm, void *arg)
{
    kvp_etcd *e = arg;
    size_t n = sz * nm;
    if (e->ans_len + n > KVP_ETCD_MAX_ANSWER) {
        e->ans_over = 1;
        return 0; /* aborts the transfer */
    }
    memcpy(e->ans + e->ans_len, p, n);
    e->ans_len += n;
    return n;
}

int kvp_etcd_open(const kvp_etcd_target *t, int timeout_ms, kvp_etcd **out)
{
    if (!t || !out || t->n < 1 || t->n > KVP_ETCD_MAX_ENDPOINTS || timeout_ms <= 0)
        return KVP_EINVALID_PARAMS;
    *out = NULL;
    pthread_once(&curl_once, curl_load);
    if (!C.ok) {
        KVP_ERROR(MOD, "%s", C.why);
        return KVP_ENOT_SUPPORTED;
    }
    if (t->https && !t->auth.cacert[0]) {
        KVP_ERROR(MOD, "https:// etcd endpoints need key \"etcd_cacert\" (the CA that signed "
                       "etcd's certificate)");
        return KVP_EINVALID_PARAMS;
    }
    kvp_etcd *e = kvp_calloc(1, sizeof *e);
    if (!e)
        return KVP_ENOMEM;
    e->t = *t;
    e->timeout_ms = timeout_ms;
    pthread_mutex_init(&e->lock, NULL);
    e->ans = kvp_malloc(KVP_ETCD_MAX_ANSWER + 1);
    e->curl = C.easy_init();
    e->hdrs = C.slist_append(NULL, "Content-Type: application/json");
    if (!e->ans || !e->curl || !e->hdrs) {
        kvp_etcd_close(e);
        return KVP_ENOMEM;
    }
    *out = e;
    return 0;
}

void kvp_etcd_close(kvp_etcd *e)
{
    if (!e)
        return;
    if (e->curl)
        C.easy_cleanup(e->curl);
    if (e->hdrs)
        C.slist_free_all(e->hdrs);
    if (e->ahdrs)
        C.slist_free_all(e->ahdrs);
    pthread_mutex_destroy(&e->lock);
    kvp_free(e->ans);
    memset(e->t.auth.password, 0, sizeof e->t.auth.password);
    kvp_free(e);
}

const char *kvp_etcd_endpoint(const kvp_etcd *e) { return e ? e->t.endpoints[e->cur] : ""; }
const char *kvp_etcd_last_error(const kvp_etcd *e) { return e ? e->err : ""; }

/* One POST of body to path at endpoint i. 0 (e->ans holds the answer, NUL
 * terminated), or KVP_ERPC_FAIL / KVP_ERPC_TIMEOUT / KVP_ETOO_LARGE with
 * e->err set; *reached: the endpoint answered HTTP at all. */
static int post_one(kvp_etcd *e, int i, const char *path, const char *body, long *http)
{
    char url[KVP_ETCD_MAX_HOST + 64];
    snprintf(url, sizeof url, "%s://%s%s", e->t.https ? "https" : "http", e->t.endpoints[i],
             path);
    CURL *c = e->curl;
    e->ans_len = 0;
    e->ans_over = 0;
    *http = 0;
    C.easy_setopt(c, CURLOPT_URL, url);
    C.easy_setopt(c, CURLOPT_POST, 1L);
    C.easy_setopt(c, CURLOPT_POSTFIELDS, body);
    C.easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    C.easy_setopt(c, CURLOPT_HTTPHEADER, e->authed ? e->ahdrs : e->hdrs);
    C.easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    C.easy_setopt(c, CURLOPT_WRITEDATA, e);
    C.easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    C.easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
    C.easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)e->timeout_ms);
    C.easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    C.easy_setopt(c, CURLOPT_PROTOCOLS_STR, e->t.https ? "https" : "http");
    if (e->t.https) { /* verified against the configured CA only */
        C.easy_setopt(c, CURLOPT_CAINFO, e->t.auth.cacert);
        C.easy_setopt(c, CURLOPT_CAPATH, (char *)NULL);
        C.easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
        C.easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
        if (e->t.auth.cert[0]) {
            C.easy_setopt(c, CURLOPT_SSLCERT, e->t.auth.cert);
            C.easy_setopt(c, CURLOPT_SSLKEY, e->t.auth.key);
        }
    }
    C.easy_setopt(c, CURLOPT_PROXY, ""); /* never through a proxy from the environment */
    CURLcode cc = C.easy_perform(c);
    if (e->ans_over) {
        snprintf(e->err, sizeof e->err, "etcd %s: answer larger than %u bytes", e->t.endpoints[i],
                 KVP_ETCD_MAX_ANSWER);
        return KVP_ETOO_LARGE;
    }
    if (cc != CURLE_OK) {
        snprintf(e->err, sizeof e->err, "etcd %s: %s", e->t.endpoints[i], C.easy_strerror(cc));
        return cc == CURLE_OPERATION_TIMEDOUT ? KVP_ERPC_TIMEOUT : KVP_ERPC_FAIL;
    }
    C.easy_getinfo(c, CURLINFO_RESPONSE_CODE, http);
    e->ans[e->ans_len] = '\0';
    return 0;
}

/* A call: POST body (a JSON object, consumed) to path, trying the current
 * endpoint and then the others; parse the answer as kind. */
static int call_list(kvp_etcd *e, const char *path, json_t *body, int kind, kvp_etcd_answer *a,
                     uint8_t *val, size_t cap, kvp_etcd_list_fn lf, void *larg);

static int call(kvp_etcd *e, const char *path, json_t *body, int kind, kvp_etcd_answer *a,
                uint8_t *val, size_t cap)
{
    return call_list(e, path, body, kind, a, val, cap, NULL, NULL);
}

/* etcd's auth refusals: an invalid or expired token (16, Unauthenticated),
 * a denied permission (7), a wrong password or no user (3, with etcd's
 * words). */
static int auth_refusal(const kvp_etcd_answer *a)
{
    return a->etcd_code == 16 || a->etcd_code == 7 ||
           (a->etcd_code == 3 && (strstr(a->message, "authentication failed") ||
                                  strstr(a->message, "user name is empty") ||
                                  strstr(a->message, "invalid auth token")));
}

/* One try of a call over the endpoints (under e->lock; txt: the body). */
static int call_once(kvp_etcd *e, const char *path, const char *txt, int kind,
                     kvp_etcd_answer *a, uint8_t *val, size_t cap, kvp_etcd_list_fn lf,
                     void *larg)
{
    int rc = KVP_ERPC_FAIL;
    for (int k = 0; k < e->t.n; k++) {
        int i = (e->cur + k) % e->t.n;
        long http = 0;
        rc = post_one(e, i, path, txt, &http);
        if (rc == KVP_ERPC_FAIL || rc == KVP_ERPC_TIMEOUT)
            continue; /* not reached: the next endpoint */
        if (rc)
            break;
        e->cur = i;
        if (http == 503 || http == 502) { /* a member without quorum / a gateway: next */
            snprintf(e->err, sizeof e->err, "etcd %s: HTTP %ld", e->t.endpoints[i], http);
            rc = KVP_ERPC_FAIL;
            continue;
        }
        rc = kvp_etcd_parse(e->ans, e->ans_len, kind, a, val, cap);
        if (rc == KVP_EPROTOCOL)
            snprintf(e->err, sizeof e->err, "etcd %s: malformed answer (HTTP %ld)",
                     e->t.endpoints[i], http);
        else if (rc == KVP_EBUFFER_OVERFLOW)
            snprintf(e->err, sizeof e->err, "etcd %s: value larger than %zu bytes",
                     e->t.endpoints[i], cap);
        else if (rc == 0 && a->etcd_code) {
            snprintf(e->err, sizeof e->err, "etcd %s: %s (code %d)", e->t.endpoints[i],
                     a->message, a->etcd_code);
            /* NotFound (5) for a lease: etcd's "requested lease not found" */
            rc = a->etcd_code == 5 && strstr(a->message, "lease") ? KVP_ELEASE_EXPIRED
                 : auth_refusal(a)                                ? KVP_EAUTH
                                                                  : KVP_ERPC_FAIL;
        } else if (rc == 0 && http != 200) {
            snprintf(e->err, sizeof e->err, "etcd %s: HTTP %ld", e->t.endpoints[i], http);
            rc = KVP_ERPC_FAIL;
        } else if (rc == 0 && lf) {
            rc = kvp_etcd_parse_list(e->ans, e->ans_len, lf, larg);
            if (rc == KVP_EPROTOCOL)
                snprintf(e->err, sizeof e->err, "etcd %s: malformed list", e->t.endpoints[i]);
        }
        break;
    }
    return rc;
}

/* POST /v3/auth/authenticate: e->token, and the Authorization header. */
static int authenticate(kvp_etcd *e)
{
    json_t *b = json_pack("{s:s, s:s}", "name", e->t.auth.user, "password", e->t.auth.password);
    char *txt = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    if (!txt)
        return KVP_ENOMEM;
    kvp_etcd_answer a;
    e->authed = 0; /* asked without the old token */
    int rc = call_once(e, "/v3/auth/authenticate", txt, KVP_ETCD_ANS_AUTH, &a, NULL, 0, NULL,
                       NULL);
    memset(txt, 0, strlen(txt));
    free(txt);
    if (rc == KVP_EAUTH)
        snprintf(e->err, sizeof e->err, "etcd %s refused user \"%.100s\": %.100s",
                 e->t.endpoints[e->cur], e->t.auth.user, a.message);
    if (rc)
        return rc;
    char h[KVP_ETCD_MAX_TOKEN + 32];
    snprintf(h, sizeof h, "Authorization: %s", a.token);
    struct curl_slist *n = C.slist_append(NULL, "Content-Type: application/json");
    struct curl_slist *n2 = n ? C.slist_append(n, h) : NULL;
    memset(h, 0, sizeof h);
    memset(a.token, 0, sizeof a.token);
    if (!n2) {
        if (n)
            C.slist_free_all(n);
        return KVP_ENOMEM;
    }
    if (e->ahdrs)
        C.slist_free_all(e->ahdrs);
    e->ahdrs = n2;
    e->authed = 1;
    return 0;
}

/* call, and with lf every kv of a successful answer through it (under the
 * handle's lock: the answer buffer is the handle's). With a user: first
 * authenticated, and once more when etcd no longer takes the token. */
static int call_list(kvp_etcd *e, const char *path, json_t *body, int kind, kvp_etcd_answer *a,
                     uint8_t *val, size_t cap, kvp_etcd_list_fn lf, void *larg)
{
    char *txt = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!txt)
        return KVP_ENOMEM;
    pthread_mutex_lock(&e->lock);
    int rc = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (e->t.auth.user[0] && !e->authed && (rc = authenticate(e)) != 0)
            break;
        rc = call_once(e, path, txt, kind, a, val, cap, lf, larg);
        if (rc != KVP_EAUTH || !e->t.auth.user[0] || a->etcd_code != 16)
            break;
        e->authed = 0; /* expired or revoked: once more with a new one */
    }
    pthread_mutex_unlock(&e->lock);
    free(txt);
    return rc;
}

/* ---------------------------------------------------------------- calls */

static int key_ok(const char *key) { return key && *key && strlen(key) <= KVP_ETCD_MAX_KEY; }

/* A base64 JSON string of n bytes, NULL on ENOMEM. */
static json_t *b64_json(const void *p, size_t n)
{
    char *s = b64_encode(p, n);
    json_t *j = s ? json_string(s) : NULL;
    kvp_free(s);
    return j;
}

static json_t *u64_json(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return json_string(b);
}

int kvp_etcd_get(kvp_etcd *e, const char *key, uint8_t *val, size_t cap, kvp_etcd_kv *kv,
                 bool *found)
{
    if (!e || !key_ok(key) || !found || (cap && !val))
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:o}", "key", b64_json(key, strlen(key)));
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/kv/range", b, KVP_ETCD_ANS_RANGE, &a, val, cap) : KVP_ENOMEM;
    if (rc)
        return rc;
    *found = a.found;
    if (a.found && kv)
        *kv = a.kv;
    return 0;
}

int kvp_etcd_put(kvp_etcd *e, const char *key, const void *val, size_t len, uint64_t lease,
                 uint64_t *revision)
{
    if (!e || !key_ok(key) || len > KVP_ETCD_MAX_VALUE || (len && !val))
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:o, s:o}", "key", b64_json(key, strlen(key)), "value",
                          b64_json(val, len));
    if (b && lease && json_object_set_new(b, "lease", u64_json(lease)) != 0) {
        json_decref(b);
        b = NULL;
    }
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/kv/put", b, KVP_ETCD_ANS_PLAIN, &a, NULL, 0) : KVP_ENOMEM;
    if (rc == 0 && revision)
        *revision = a.revision;
    return rc;
}

int kvp_etcd_delete(kvp_etcd *e, const char *key)
{
    if (!e || !key_ok(key))
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:o}", "key", b64_json(key, strlen(key)));
    kvp_etcd_answer a;
    return b ? call(e, "/v3/kv/deleterange", b, KVP_ETCD_ANS_PLAIN, &a, NULL, 0) : KVP_ENOMEM;
}

int kvp_etcd_list(kvp_etcd *e, const char *prefix, kvp_etcd_list_fn f, void *arg)
{
    size_t n = prefix ? strlen(prefix) : 0;
    if (!e || !key_ok(prefix) || !f || (uint8_t)prefix[n - 1] == 0xff)
        return KVP_EINVALID_PARAMS;
    char end[KVP_ETCD_MAX_KEY + 1];
    memcpy(end, prefix, n);
    end[n - 1] = (char)((uint8_t)end[n - 1] + 1); /* the first key past the prefix */
    json_t *b = json_pack("{s:o, s:o}", "key", b64_json(prefix, n), "range_end", b64_json(end, n));
    kvp_etcd_answer a;
    return b ? call_list(e, "/v3/kv/range", b, KVP_ETCD_ANS_PLAIN, &a, NULL, 0, f, arg)
             : KVP_ENOMEM;
}

int kvp_etcd_lease_grant(kvp_etcd *e, int64_t ttl_s, uint64_t *id)
{
    if (!e || ttl_s <= 0 || ttl_s > 86400 || !id)
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:I}", "TTL", (json_int_t)ttl_s);
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/lease/grant", b, KVP_ETCD_ANS_GRANT, &a, NULL, 0) : KVP_ENOMEM;
    if (rc == 0)
        *id = a.lease_id;
    return rc;
}

int kvp_etcd_lease_keepalive(kvp_etcd *e, uint64_t id, int64_t *ttl_s)
{
    if (!e || !id || !ttl_s)
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:o}", "ID", u64_json(id));
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/lease/keepalive", b, KVP_ETCD_ANS_KEEPALIVE, &a, NULL, 0)
               : KVP_ENOMEM;
    if (rc)
        return rc;
    if (a.ttl <= 0 || a.lease_id != id) {
        snprintf(e->err, sizeof e->err, "etcd %s: lease %llx expired", kvp_etcd_endpoint(e),
                 (unsigned long long)id);
        return KVP_ELEASE_EXPIRED;
    }
    *ttl_s = a.ttl;
    return 0;
}

int kvp_etcd_lease_revoke(kvp_etcd *e, uint64_t id)
{
    if (!e || !id)
        return KVP_EINVALID_PARAMS;
    json_t *b = json_pack("{s:o}", "ID", u64_json(id));
    kvp_etcd_answer a;
    return b ? call(e, "/v3/lease/revoke", b, KVP_ETCD_ANS_PLAIN, &a, NULL, 0) : KVP_ENOMEM;
}

int kvp_etcd_campaign(kvp_etcd *e, const char *key, const void *val, size_t len, uint64_t lease,
                      bool *won, kvp_etcd_kv *holder, uint8_t *hval, size_t hcap)
{
    if (!e || !key_ok(key) || len > KVP_ETCD_MAX_VALUE || (len && !val) || !lease || !won ||
        !holder || (hcap && !hval))
        return KVP_EINVALID_PARAMS;
    json_t *k = b64_json(key, strlen(key));
    json_t *b = k ? json_pack("{s:[{s:O, s:s, s:s, s:s}], s:[{s:{s:O, s:o, s:o}}], "
                              "s:[{s:{s:O}}]}",
                              "compare", "key", k, "target", "CREATE", "result", "EQUAL",
                              "createRevision", "0", "success", "requestPut", "key", k, "value",
                              b64_json(val, len), "lease", u64_json(lease), "failure",
                              "requestRange", "key", k)
                  : NULL;
    json_decref(k);
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/kv/txn", b, KVP_ETCD_ANS_TXN, &a, hval, hcap) : KVP_ENOMEM;
    if (rc)
        return rc;
    *won = a.succeeded;
    memset(holder, 0, sizeof *holder);
    if (a.succeeded) { /* the put's revision is the key's creation revision */
        if (a.revision == 0)
            return KVP_EPROTOCOL;
        holder->create_revision = holder->mod_revision = a.revision;
        holder->version = 1;
        holder->lease = lease;
        holder->value_len = len;
        return 0;
    }
    if (!a.found) /* the holder vanished between compare and range: impossible in one txn */
        return KVP_EPROTOCOL;
    *holder = a.kv;
    return 0;
}

int kvp_etcd_resign(kvp_etcd *e, const char *key, uint64_t epoch, bool *deleted)
{
    if (!e || !key_ok(key) || !epoch)
        return KVP_EINVALID_PARAMS;
    json_t *k = b64_json(key, strlen(key));
    json_t *b = k ? json_pack("{s:[{s:O, s:s, s:s, s:o}], s:[{s:{s:O}}]}", "compare", "key", k,
                              "target", "CREATE", "result", "EQUAL", "createRevision",
                              u64_json(epoch), "success", "requestDeleteRange", "key", k)
                  : NULL;
    json_decref(k);
    kvp_etcd_answer a;
    int rc = b ? call(e, "/v3/kv/txn", b, KVP_ETCD_ANS_TXN, &a, NULL, 0) : KVP_ENOMEM;
    if (rc == 0 && deleted)
        *deleted = a.succeeded;
    return rc;
}
