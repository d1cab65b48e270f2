/* test_http.c -- the HTTP endpoint in process: a master's loop publishes
 * its picture while clients put and scrapers read /metrics and
 * /api/stats at once (the threaded path TSan checks); what the endpoint
 * answers, its limits on methods and paths, and the bearer token; and
 * /api/kv/lookup, which the HTTP thread hands to the loop and waits for
 * (answers as LOOKUP_HASHES does, bad arguments, a loop that is busy, not
 * running, stopping or a standby's). */
#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "harness.h"
#include "kvpool.h"
#include "master/kvapi.h"
#include "master/service.h"
#include "master/status.h"
#include "net/http.h"
#include "net/net.h"
#include "proc.h"

/* One request; the whole answer (status line, headers, body) into out. */
static int http_get(uint16_t port, const char *req, char *out, size_t cap)
{
    char addr[32], err[KVP_NET_ERRLEN];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    int fd = kvp_net_connect(addr, 2000, err, sizeof err);
    if (fd < 0)
        return -1;
    size_t n = strlen(req), got = 0, sent = 0;
    while (sent < n) { /* a server that refuses a long request may close before the end */
        ssize_t w = send(fd, req + sent, n - sent, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        sent += (size_t)w;
    }
    ssize_t r;
    while (got + 1 < cap && (r = read(fd, out + got, cap - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
    return (int)got;
}

static int status_of(const char *ans) { return strncmp(ans, "HTTP/1.1 ", 9) ? -1 : atoi(ans + 9); }

/* The value of the unlabeled sample `name` in an exposition, or -1. */
static long long sample(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; (p = strstr(p, name)) != NULL; p += n)
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return atoll(p + n + 1);
    return -1;
}

typedef struct env {
    kvp_mserver *s;
    kvp_http *h;
    pthread_t loop;
    char addr[64];
} env;

static void *loop_main(void *arg)
{
    kvp_mserver_run(arg);
    return NULL;
}

/* run: the loop thread starts (else the test runs it, or not) */
static int env_up_run(env *e, const char *token, int run)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:0");
    snprintf(cfg.http, sizeof cfg.http, "127.0.0.1:0");
    char err[256];
    REQUIRE(kvp_mserver_create(&cfg, 0, &e->s, err, sizeof err) == 0);
    snprintf(e->addr, sizeof e->addr, "127.0.0.1:%u", kvp_mserver_port(e->s));
    kvp_mstatus *st = kvp_mserver_status(e->s);
    REQUIRE(st != NULL);
    kvp_http_route r[] = {{.path = "/metrics", .fn = kvp_mstatus_metrics, .ctx = st},
                          {.path = "/api/stats", .fn = kvp_mstatus_api, .ctx = st},
                          {.path = "/", .fn = kvp_mstatus_page, .ctx = st},
                          {.path = "/readyz", .fn = kvp_mstatus_readyz, .ctx = st, .open = 1},
                          {.path = "/api/kv/lookup", .fn_req = kvp_kvapi_lookup, .ctx = e->s}};
    kvp_http_opts o = {.listen = "127.0.0.1:0", .token = token, .what = "master", .routes = r,
                       .nroutes = 5};
    REQUIRE(kvp_http_start(&o, &e->h, err, sizeof err) == 0);
    if (run)
        REQUIRE(pthread_create(&e->loop, NULL, loop_main, e->s) == 0);
    return 0;
}

static int env_up(env *e, const char *token) { return env_up_run(e, token, 1); }

static void env_down(env *e)
{
    kvp_http_stop(e->h);
    kvp_mserver_stop(e->s);
    pthread_join(e->loop, NULL);
    kvp_mserver_destroy(e->s);
}

typedef struct scraper {
    uint16_t port;
    _Atomic int stop;
    int n, bad;
} scraper;

static int get_json(uint16_t port, const char *target, const char *token, json_t **j);
static long long jint(const json_t *j, const char *k);

static void *scrape_main(void *arg)
{
    scraper *sc = arg;
    static char buf[1 << 20];
    while (!atomic_load(&sc->stop)) {
        const char *req = sc->n % 2 ? "GET /api/stats HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                                    : "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
        if (http_get(sc->port, req, buf, sizeof buf) <= 0 || status_of(buf) != 200)
            sc->bad++;
        sc->n++;
    }
    return NULL;
}

TEST(metrics_follow_puts_while_scraped)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    uint16_t port = kvp_http_port(e.h);
    scraper sc = {.port = port};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, scrape_main, &sc), 0);
    char conf[256], err[256];
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"16MiB\"}",
             e.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    char val[3000];
    memset(val, 'v', sizeof val);
    for (int i = 0; c && i < 40; i++) {
        char k[32];
        snprintf(k, sizeof k, "key-%d", i);
        CHECK_EQ(kvp_client_put(c, k, val, sizeof val), 0);
    }
    static char ans[1 << 20];
    long long objs = -1;
    for (uint64_t end = kvp_now_ms() + 5000; kvp_now_ms() < end && objs != 40; tp_sleep_ms(50)) {
        CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                       sizeof ans) > 0);
        const char *body = strstr(ans, "\r\n\r\n");
        objs = body ? sample(body + 4, "kvpool_objects") : -1;
    }
    CHECK_EQ(objs, 40);
    const char *body = strstr(ans, "\r\n\r\n") + 4;
    CHECK(sample(body, "kvpool_puts_total") >= 40);
    CHECK(sample(body, "kvpool_put_bytes_total") >= 40 * 3000);
    CHECK(strstr(body, "kvpool_request_duration_seconds_count{op=\"PUT_END\"}") != NULL);
    CHECK(strstr(body, "kvpool_master_role{role=\"single\"} 1") != NULL);
    CHECK(strstr(ans, "Content-Type: text/plain; version=0.0.4") != NULL);
    atomic_store(&sc.stop, 1);
    pthread_join(th, NULL);
    CHECK(sc.n > 0);
    CHECK_EQ(sc.bad, 0);
    kvp_client_close(c);
    CHECK(http_get(port, "GET /api/stats HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    CHECK(strstr(ans, "\"role\":\"single\"") != NULL && strstr(ans, "\"objects\":40") != NULL);
    CHECK(http_get(port, "GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    env_down(&e);
}

/* What clients moved per data path, from their heartbeat reports: in
 * /metrics (kvpool_client_bytes_total / _transfers_total by path and op)
 * and /api/stats ("paths"). The client closes before its first timed
 * heartbeat: its last report goes out at close. */
TEST(metrics_count_client_paths)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    uint16_t port = kvp_http_port(e.h);
    char conf[256], err[256];
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"16MiB\"}",
             e.addr);
    kvp_client *c = NULL;
    CHECK_EQ(kvp_client_open(conf, &c, err, sizeof err), 0);
    char val[3000], back[3000];
    memset(val, 'p', sizeof val);
    for (int i = 0; i < 5; i++) {
        char k[32];
        snprintf(k, sizeof k, "path-%d", i);
        CHECK_EQ(kvp_client_put(c, k, val, sizeof val), 0);
        CHECK_EQ(kvp_client_get(c, k, back, sizeof back), (int64_t)sizeof back);
    }
    CHECK_EQ(kvp_client_get(c, "path-0", back, sizeof back), (int64_t)sizeof back);
    kvp_transfer_stats ts;
    kvp_transfer_stats_init(&ts);
    CHECK_EQ(kvp_client_stats(c, &ts), 0);
    CHECK(ts.path[KVP_PATH_SHM].put_bytes == 15000 && ts.path[KVP_PATH_SHM].get_ops == 6);
    kvp_client_close(c);
    static char ans[1 << 20];
    const char *want = "kvpool_client_bytes_total{path=\"shm\",op=\"get\"} 18000\n";
    int found = 0;
    for (uint64_t end = kvp_now_ms() + 5000; kvp_now_ms() < end && !found; tp_sleep_ms(50)) {
        CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                       sizeof ans) > 0);
        found = strstr(ans, want) != NULL;
    }
    CHECK(found);
    static const char *const lines[] = {
        "# TYPE kvpool_client_bytes_total counter\n",
        "kvpool_client_bytes_total{path=\"shm\",op=\"put\"} 15000\n",
        "kvpool_client_bytes_total{path=\"tcp\",op=\"put\"} 0\n",
        "kvpool_client_bytes_total{path=\"ucx\",op=\"get\"} 0\n",
        "kvpool_client_transfers_total{path=\"shm\",op=\"put\"} 5\n",
        "kvpool_client_transfers_total{path=\"shm\",op=\"get\"} 6\n",
        "kvpool_client_transfers_total{path=\"tcp\",op=\"get\"} 0\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(ans, lines[i]))
            th_fail(__FILE__, __LINE__, "no %s", lines[i]);
    json_t *j = NULL;
    CHECK_EQ(get_json(port, "/api/stats", NULL, &j), 200);
    json_t *shm = json_object_get(json_object_get(j, "paths"), "shm");
    json_t *ucx = json_object_get(json_object_get(j, "paths"), "ucx");
    CHECK(shm && ucx);
    CHECK(jint(shm, "put_bytes") == 15000 && jint(shm, "get_bytes") == 18000 &&
          jint(shm, "put_ops") == 5 && jint(shm, "get_ops") == 6 && jint(ucx, "put_bytes") == 0);
    CHECK(jint(json_object_get(j, "counters"), "client_shm_get_bytes") == 18000);
    json_decref(j);
    env_down(&e);
}

TEST(methods_paths_and_hostile_requests)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    uint16_t port = kvp_http_port(e.h);
    static char ans[1 << 20];
    CHECK(http_get(port, "DELETE /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 405);
    CHECK(strstr(ans, "Allow: GET, HEAD") != NULL);
    CHECK(http_get(port, "GET /metrics/x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 404);
    CHECK(http_get(port, "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    CHECK(strstr(ans, "text/html") != NULL && strstr(ans, "/api/stats") != NULL);
    /* a header past the connection's memory: refused, and the server goes on */
    size_t big = KVP_HTTP_CONN_MEM + (16 << 10);
    char *req = malloc(big + 128);
    if (req) {
        int o = sprintf(req, "GET /metrics HTTP/1.1\r\nHost: t\r\nX-Big: ");
        memset(req + o, 'a', big);
        strcpy(req + o + big, "\r\nConnection: close\r\n\r\n");
        int n = http_get(port, req, ans, sizeof ans);
        CHECK(n <= 0 || status_of(ans) >= 400);
        free(req);
    }
    CHECK(http_get(port, "garbage\r\n\r\n", ans, sizeof ans) >= 0);
    CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    env_down(&e);
}

TEST(a_token_is_required_once_set)
{
    env e;
    if (env_up(&e, "tok-123") != 0)
        return;
    uint16_t port = kvp_http_port(e.h);
    static char ans[65536];
    CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 401);
    CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok-12\r\n"
                         "Connection: close\r\n\r\n", ans, sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 401);
    CHECK(http_get(port, "GET /metrics HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer tok-123\r\n"
                         "Connection: close\r\n\r\n", ans, sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    /* the probes are open: they tell nothing but "ok" or why not */
    CHECK(http_get(port, "GET /readyz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    CHECK(http_get(port, "GET /nothing HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", ans,
                   sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 401);
    env_down(&e);
    /* beyond loopback without a token: refused, with the reason */
    kvp_http_route r[] = {{.path = "/x", .fn = kvp_mstatus_page}};
    kvp_http_opts o = {.listen = "0.0.0.0:0", .what = "master", .routes = r, .nroutes = 1};
    kvp_http *h = NULL;
    char err[512];
    CHECK_EQ(kvp_http_start(&o, &h, err, sizeof err), KVP_ECONFIG);
    CHECK(h == NULL && strstr(err, "HTTP endpoint") != NULL);
}

/* ------------------------------------------------------ /api/kv/lookup */

/* GET target (path and query) with an optional bearer token: the status
 * (-1: no answer) and, with j, the body parsed as JSON (NULL if it is not).
 * Thread-safe. */
static int get_json(uint16_t port, const char *target, const char *token, json_t **j)
{
    size_t cap = strlen(target) + 1024;
    char *req = malloc(cap), *ans = malloc(1 << 16);
    int st = -1;
    if (j)
        *j = NULL;
    if (req && ans) {
        snprintf(req, cap, "GET %s HTTP/1.1\r\nHost: t\r\n%s%s%sConnection: close\r\n\r\n", target,
                 token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "");
        if (http_get(port, req, ans, 1 << 16) > 0) {
            st = status_of(ans);
            const char *body = strstr(ans, "\r\n\r\n");
            if (j && body) {
                *j = json_loads(body + 4, 0, NULL);
                if (st != 401 && !strstr(ans, "Content-Type: application/json"))
                    st = -2; /* every answer of the route is JSON */
            }
        }
    }
    free(req);
    free(ans);
    return st;
}

static long long jint(const json_t *j, const char *k)
{
    const json_t *v = json_object_get(j, k);
    return json_is_integer(v) ? (long long)json_integer_value(v) : -1;
}

static const char *jstr(const json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}

/* An embedded client of the env's master, in tenant (NULL: default). */
static kvp_client *open_client(const env *e, const char *tenant)
{
    char conf[320], err[256];
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"16MiB\""
             "%s%s%s}",
             e->addr, tenant ? ", \"tenant\": \"" : "", tenant ? tenant : "", tenant ? "\"" : "");
    kvp_client *c = NULL;
    return kvp_client_open(conf, &c, err, sizeof err) == 0 ? c : NULL;
}

/* One object per block of the chain h[0..n) in group g (parts 1). */
static int put_chain(kvp_client *c, const char *prefix, const uint64_t *h, size_t n, uint8_t g)
{
    char keys[16][48], val[512];
    const char *kp[16];
    kvp_iov iov[16];
    const kvp_iov *iovp[16];
    size_t niov[16];
    kvp_block b[16];
    int64_t res[16];
    memset(val, 'b', sizeof val);
    REQUIRE(n <= 16);
    for (size_t i = 0; i < n; i++) {
        snprintf(keys[i], sizeof keys[i], "%s-%zu", prefix, i);
        kp[i] = keys[i];
        iov[i] = (kvp_iov){val, sizeof val};
        iovp[i] = &iov[i];
        niov[i] = 1;
        b[i] = (kvp_block){.hash = h[i], .parent = i ? h[i - 1] : 0, .block_size = 16,
                           .parts = 1, .group = g, .flags = i ? KVP_BLOCK_PARENT : 0};
    }
    kvp_put_opts o;
    kvp_put_opts_init(&o);
    o.blocks = b;
    REQUIRE(kvp_client_batch_put_opts(c, kp, iovp, niov, n, &o, res) == 0);
    for (size_t i = 0; i < n; i++)
        REQUIRE(res[i] >= 0); /* the bytes stored */
    return 0;
}

/* The HTTP answer for chain h[0..n) of group g in tenant (NULL: none
 * given) equals the client's LOOKUP_HASHES (c in that tenant) and names
 * the tenant, group and length; the prefix into *p. 0 or -1. */
static int same_as_lookup_hashes(const env *e, kvp_client *c, const char *tenant, const uint64_t *h,
                                 size_t n, uint8_t g, int hex, kvp_hash_prefix *p)
{
    char *q = malloc(64 + n * 24);
    REQUIRE(q);
    int o = sprintf(q, "/api/kv/lookup?");
    if (tenant)
        o += sprintf(q + o, "tenant=%s&", tenant);
    o += sprintf(q + o, "hashes=");
    for (size_t i = 0; i < n; i++)
        o += sprintf(q + o, hex ? "%s0x%llx" : "%s%llu", i ? "," : "", (unsigned long long)h[i]);
    if (g)
        sprintf(q + o, "&group=%u", g);
    json_t *j;
    int st = get_json(kvp_http_port(e->h), q, NULL, &j);
    free(q);
    kvp_hash_prefix want;
    size_t len = n;
    int rc = kvp_client_lookup_hashes(c, h, &len, &g, 1, &want);
    int ok = st == 200 && j && rc == 0 && jint(j, "dram") == want.dram &&
             jint(j, "disk") == want.disk && jint(j, "any") == want.any &&
             jint(j, "blocks") == (long long)n && jint(j, "group") == g &&
             !strcmp(jstr(j, "tenant"), tenant && tenant[0] ? tenant : "default");
    if (!ok) {
        char *d = j ? json_dumps(j, 0) : NULL;
        fprintf(stderr, "lookup: status %d, %s; LOOKUP_HASHES %d: %u %u %u\n", st,
                d ? d : "(no JSON)", rc, want.dram, want.disk, want.any);
        free(d);
    }
    json_decref(j);
    REQUIRE(ok);
    *p = want;
    return 0;
}

#define H0 0xfedcba9876543210ull /* 20 decimal digits */

TEST(kv_lookup_answers_as_lookup_hashes)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    kvp_client *c = open_client(&e, NULL), *acme = open_client(&e, "acme");
    CHECK(c && acme);
    uint64_t a[5] = {H0, H0 + 1, H0 + 2, H0 + 3, H0 + 4}, g2[2] = {H0 + 100, H0 + 101},
             b[2] = {7, 8};
    CHECK_EQ(put_chain(c, "a", a, 3, 0), 0); /* a[3], a[4] never put */
    CHECK_EQ(put_chain(c, "g", g2, 2, 2), 0);
    CHECK_EQ(put_chain(acme, "b", b, 2, 0), 0);
    kvp_hash_prefix p;
    /* a hit chain, in decimal and in hex; the tenant named or not */
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, a, 5, 0, 0, &p), 0);
    CHECK(p.dram == 3 && p.any == 3 && p.disk == 0);
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, a, 2, 0, 1, &p), 0);
    CHECK_EQ(p.any, 2);
    CHECK_EQ(same_as_lookup_hashes(&e, c, "default", a, 3, 0, 0, &p), 0);
    CHECK_EQ(p.any, 3);
    CHECK_EQ(same_as_lookup_hashes(&e, c, "", a, 4, 0, 0, &p), 0);
    CHECK_EQ(p.any, 3);
    /* a partial chain: its first block missing, nothing counts */
    uint64_t holed[3] = {H0 + 3, H0, H0 + 1};
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, holed, 3, 0, 0, &p), 0);
    CHECK(p.dram == 0 && p.any == 0);
    /* another group: its own chain; the same hashes in group 0 are not it */
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, g2, 2, 2, 0, &p), 0);
    CHECK_EQ(p.any, 2);
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, g2, 2, 0, 0, &p), 0);
    CHECK_EQ(p.any, 0);
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, g2, 2, 255, 0, &p), 0);
    CHECK_EQ(p.any, 0);
    /* tenants: acme's blocks are acme's; an unknown tenant holds nothing */
    CHECK_EQ(same_as_lookup_hashes(&e, acme, "acme", b, 2, 0, 0, &p), 0);
    CHECK_EQ(p.any, 2);
    CHECK_EQ(same_as_lookup_hashes(&e, c, NULL, b, 2, 0, 0, &p), 0);
    CHECK_EQ(p.any, 0);
    json_t *j;
    char q[256];
    snprintf(q, sizeof q, "/api/kv/lookup?hashes=%llu&tenant=nobody", (unsigned long long)H0);
    CHECK_EQ(get_json(kvp_http_port(e.h), q, NULL, &j), 200);
    CHECK(j && !strcmp(jstr(j, "tenant"), "nobody") && jint(j, "any") == 0 &&
          jint(j, "dram") == 0 && jint(j, "disk") == 0 && jint(j, "blocks") == 1);
    json_decref(j);
    /* the largest hash, and an encoded comma and tenant */
    CHECK_EQ(get_json(kvp_http_port(e.h),
                      "/api/kv/lookup?hashes=18446744073709551615%2C0xFFFFFFFFFFFFFFFF&tenant=ac%6De",
                      NULL, &j), 200);
    CHECK(j && !strcmp(jstr(j, "tenant"), "acme") && jint(j, "blocks") == 2 && jint(j, "any") == 0);
    json_decref(j);
    /* empty arguments are nothing; an empty name with a value is unknown */
    snprintf(q, sizeof q, "/api/kv/lookup?&hashes=%llu&&group=0&", (unsigned long long)H0);
    CHECK_EQ(get_json(kvp_http_port(e.h), q, NULL, &j), 200);
    CHECK(j && jint(j, "any") == 1 && jint(j, "blocks") == 1);
    json_decref(j);
    /* HEAD: the same status, no body */
    static char ans[4096];
    snprintf(q, sizeof q, "HEAD /api/kv/lookup?hashes=%llu HTTP/1.1\r\nHost: t\r\n"
             "Connection: close\r\n\r\n", (unsigned long long)H0);
    CHECK(http_get(kvp_http_port(e.h), q, ans, sizeof ans) > 0);
    CHECK_EQ(status_of(ans), 200);
    kvp_client_close(acme);
    kvp_client_close(c);
    env_down(&e);
}

TEST(kv_lookup_refuses_bad_arguments)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    static char big[8192], many[4200 * 2 + 64], bad[200];
    snprintf(big, sizeof big, "/api/kv/lookup?hashes=1&tenant=%0256d", 0);
    int o = sprintf(many, "/api/kv/lookup?hashes=0");
    for (int i = 1; i < KVP_KVAPI_MAX_HASHES + 1; i++)
        o += sprintf(many + o, ",%d", i % 10);
    static const struct {
        const char *target, *says;
    } cases[] = {
        {"/api/kv/lookup", "hashes: missing"},
        {"/api/kv/lookup?group=1", "hashes: missing"},
        {"/api/kv/lookup?hashes=", "hashes: empty list"},
        {"/api/kv/lookup?hashes", "hashes: empty list"},
        {"/api/kv/lookup?hashes=12a", "hash 1 (\"12a\") is not an unsigned integer"},
        {"/api/kv/lookup?hashes=1,-1", "hash 2 (\"-1\") is not"},
        {"/api/kv/lookup?hashes=1,+2", "hash 2 (\" 2\") is not"},
        {"/api/kv/lookup?hashes=0x", "is not an unsigned integer"},
        {"/api/kv/lookup?hashes=0xg1", "is not an unsigned integer"},
        {"/api/kv/lookup?hashes=1.5", "is not an unsigned integer"},
        {"/api/kv/lookup?hashes=18446744073709551616", "is larger than 2^64-1"},
        {"/api/kv/lookup?hashes=0x10000000000000000", "is larger than 2^64-1"},
        {"/api/kv/lookup?hashes=99999999999999999999999999x", "is not an unsigned integer"},
        {"/api/kv/lookup?hashes=1,,2", "hash 2 of 3 is empty"},
        {"/api/kv/lookup?hashes=1,", "hash 2 of 2 is empty"},
        {"/api/kv/lookup?hashes=1&group=256", "group: \"256\" is not a number from 0 to 255"},
        {"/api/kv/lookup?hashes=1&group=x", "group:"},
        {"/api/kv/lookup?hashes=1&group=", "group:"},
        {"/api/kv/lookup?hashes=1&group", "group:"},
        {"/api/kv/lookup?hashes=1&hashes=2", "parameter \"hashes\" given twice"},
        {"/api/kv/lookup?hashes=1&group=1&group=1", "parameter \"group\" given twice"},
        {"/api/kv/lookup?hashes=1&foo=2", "unknown parameter \"foo\""},
        {"/api/kv/lookup?hashes=1&%22%0a=2", "unknown parameter \"??\""},
        {"/api/kv/lookup?hashes=1&=2", "unknown parameter \"\""},
        {"/api/kv/lookup?Hashes=1", "unknown parameter \"Hashes\""},
        {"/api/kv/lookup?hashes=1&tenant=a%00b", "tenant: holds a NUL byte"},
        {"/api/kv/lookup?hashes=1&tenant=%ff", "tenant: not UTF-8"},
        {big, "tenant: 256 bytes, at most 255"},
        {many, "hashes: 4097 given, at most 4096"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j;
        int st = get_json(kvp_http_port(e.h), cases[i].target, NULL, &j);
        const char *err = jstr(j, "error");
        if (st != 400 || !strstr(err, cases[i].says)) {
            snprintf(bad, sizeof bad, "%.100s", cases[i].target);
            fprintf(stderr, "%s: status %d, error \"%s\"\n", bad, st, err);
        }
        CHECK_EQ(st, 400);
        CHECK(strstr(err, cases[i].says) != NULL);
        json_decref(j);
    }
    env_down(&e);
}

TEST(kv_lookup_needs_the_token_and_bounds_the_url)
{
    env e;
    if (env_up(&e, "tok-123") != 0)
        return;
    uint16_t port = kvp_http_port(e.h);
    kvp_client *c = open_client(&e, NULL);
    CHECK(c != NULL);
    uint64_t a[2] = {H0, H0 + 1};
    CHECK_EQ(put_chain(c, "a", a, 2, 0), 0);
    /* the longest query: 4096 hashes of 20 digits, a 255-byte tenant, the token */
    size_t cap = 64 + KVP_KVAPI_MAX_HASHES * 21 + 300;
    char *q = malloc(cap);
    CHECK(q != NULL);
    int o = sprintf(q, "/api/kv/lookup?hashes=%llu,%llu", (unsigned long long)a[0],
                    (unsigned long long)a[1]);
    for (int i = 2; i < KVP_KVAPI_MAX_HASHES; i++)
        o += sprintf(q + o, ",%llu", 18446744073709551615ull - (unsigned long long)i);
    int end = o;
    sprintf(q + end, "&group=0&tenant=default");
    json_t *j;
    CHECK_EQ(get_json(port, q, NULL, &j), 401);
    json_decref(j);
    CHECK_EQ(get_json(port, q, "tok-12", &j), 401);
    json_decref(j);
    CHECK_EQ(get_json(port, q, "tok-123", &j), 200);
    CHECK(j && jint(j, "blocks") == KVP_KVAPI_MAX_HASHES && jint(j, "any") == 2);
    json_decref(j);
    o = end + sprintf(q + end, "&group=255&tenant=");
    memset(q + o, 'z', 255);
    q[o + 255] = '\0';
    CHECK_EQ(get_json(port, q, "tok-123", &j), 200);
    CHECK(j && strlen(jstr(j, "tenant")) == 255 && jint(j, "any") == 0 && jint(j, "group") == 255);
    json_decref(j);
    free(q);
    /* a URL past the connection's memory: refused (414) or cut off, never served */
    size_t huge = 2 * KVP_HTTP_CONN_MEM;
    q = malloc(huge + 64);
    CHECK(q != NULL);
    o = sprintf(q, "/api/kv/lookup?hashes=1");
    while ((size_t)o < huge)
        o += sprintf(q + o, ",1");
    int st = get_json(port, q, "tok-123", NULL);
    CHECK(st == -1 || st == 414 || st == 400);
    free(q);
    /* and the endpoint goes on */
    CHECK_EQ(get_json(port, "/api/kv/lookup?hashes=1", "tok-123", &j), 200);
    json_decref(j);
    kvp_client_close(c);
    env_down(&e);
}

typedef struct busy {
    const char *addr;
    _Atomic int stop;
    int ops, bad;
} busy;

/* A client keeping the loop busy: puts and gets of 64 KiB values. */
static void *busy_main(void *arg)
{
    busy *b = arg;
    char conf[256], err[256];
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"embedded\", \"global_segment_size\": \"32MiB\"}",
             b->addr);
    kvp_client *c = NULL;
    if (kvp_client_open(conf, &c, err, sizeof err) != 0) {
        b->bad++;
        return NULL;
    }
    char *val = malloc(65536);
    if (!val) {
        b->bad++;
        kvp_client_close(c);
        return NULL;
    }
    memset(val, 'x', 65536);
    for (int i = 0; !atomic_load(&b->stop); i++) {
        char k[48];
        snprintf(k, sizeof k, "busy-%p-%d", (void *)b, i % 64);
        kvp_client_remove(c, k, 1);
        if (kvp_client_put(c, k, val, 65536) != 0 || kvp_client_get(c, k, val, 65536) != 65536)
            b->bad++;
        b->ops++;
    }
    free(val);
    kvp_client_close(c);
    return NULL;
}

TEST(kv_lookup_answers_while_the_loop_is_busy)
{
    env e;
    if (env_up(&e, NULL) != 0)
        return;
    kvp_client *c = open_client(&e, NULL);
    CHECK(c != NULL);
    uint64_t a[4] = {H0, H0 + 1, H0 + 2, H0 + 3};
    CHECK_EQ(put_chain(c, "a", a, 4, 0), 0);
    busy b[3] = {{.addr = e.addr}, {.addr = e.addr}, {.addr = e.addr}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        CHECK_EQ(pthread_create(&th[i], NULL, busy_main, &b[i]), 0);
    tp_sleep_ms(200);
    char q[256];
    snprintf(q, sizeof q, "/api/kv/lookup?hashes=%llu,%llu,%llu,%llu,1", (unsigned long long)a[0],
             (unsigned long long)a[1], (unsigned long long)a[2], (unsigned long long)a[3]);
    uint64_t worst = 0;
    int n = 0, good = 0;
    for (uint64_t end = kvp_now_ms() + 2000; kvp_now_ms() < end; n++) {
        uint64_t t0 = kvp_now_ms();
        json_t *j;
        int st = get_json(kvp_http_port(e.h), q, NULL, &j);
        good += st == 200 && jint(j, "any") == 4 && jint(j, "blocks") == 5;
        json_decref(j);
        if (kvp_now_ms() - t0 > worst)
            worst = kvp_now_ms() - t0;
    }
    for (int i = 0; i < 3; i++) {
        atomic_store(&b[i].stop, 1);
        pthread_join(th[i], NULL);
    }
    fprintf(stderr, "%d lookups beside %d+%d+%d client ops, the slowest %llu ms\n", n, b[0].ops,
            b[1].ops, b[2].ops, (unsigned long long)worst);
    CHECK(n > 0);
    CHECK_EQ(good, n);
    CHECK(worst < KVP_KVAPI_WAIT_MS);
    CHECK(b[0].ops + b[1].ops + b[2].ops > 0);
    CHECK_EQ(b[0].bad + b[1].bad + b[2].bad, 0);
    kvp_client_close(c);
    env_down(&e);
}

typedef struct asker {
    uint16_t port;
    pthread_t th;
    int status;
    char error[128];
    uint64_t ms;
} asker;

static void *ask_main(void *arg)
{
    asker *a = arg;
    uint64_t t0 = kvp_now_ms();
    json_t *j;
    a->status = get_json(a->port, "/api/kv/lookup?hashes=1,2", NULL, &j);
    snprintf(a->error, sizeof a->error, "%s", jstr(j, "error"));
    json_decref(j);
    a->ms = kvp_now_ms() - t0;
    return NULL;
}

TEST(kv_lookup_without_a_serving_loop)
{
    env e;
    if (env_up_run(&e, NULL, 0) != 0) /* the loop is not running */
        return;
    uint16_t port = kvp_http_port(e.h);
    kvp_mstatus *st = kvp_mserver_status(e.s);
    /* a standby answers at once, as /readyz does */
    kvp_mstatus_role(st, KVP_MROLE_STANDBY);
    asker a = {.port = port};
    ask_main(&a);
    CHECK_EQ(a.status, 503);
    CHECK(strstr(a.error, "standby") != NULL && a.ms < 1000);
    kvp_mstatus_role(st, KVP_MROLE_SINGLE);
    /* nobody answers: 503 after the wait */
    ask_main(&a);
    CHECK_EQ(a.status, 503);
    CHECK(!strcmp(a.error, "the master's loop did not answer"));
    CHECK(a.ms >= KVP_KVAPI_WAIT_MS - 100 && a.ms < KVP_KVAPI_WAIT_MS + 1500);
    /* a query made before the loop runs is answered once it does */
    CHECK_EQ(pthread_create(&a.th, NULL, ask_main, &a), 0);
    tp_sleep_ms(300);
    CHECK_EQ(pthread_create(&e.loop, NULL, loop_main, e.s), 0);
    pthread_join(a.th, NULL);
    CHECK_EQ(a.status, 200);
    /* the loop stopped: refused at once */
    kvp_mserver_stop(e.s);
    pthread_join(e.loop, NULL);
    ask_main(&a);
    CHECK_EQ(a.status, 503);
    CHECK(!strcmp(a.error, "the master is stopping") && a.ms < 1000);
    kvp_http_stop(e.h);
    kvp_mserver_destroy(e.s);
    /* a query waiting when the loop stops is released, not left to time out */
    if (env_up_run(&e, NULL, 0) != 0)
        return;
    a = (asker){.port = kvp_http_port(e.h)};
    CHECK_EQ(pthread_create(&a.th, NULL, ask_main, &a), 0);
    tp_sleep_ms(300);
    kvp_mserver_stop(e.s);
    CHECK_EQ(pthread_create(&e.loop, NULL, loop_main, e.s), 0); /* stops at once */
    pthread_join(a.th, NULL);
    CHECK_EQ(a.status, 503);
    CHECK(!strcmp(a.error, "the master is stopping"));
    CHECK(a.ms < KVP_KVAPI_WAIT_MS);
    env_down(&e);
}

TEST(a_route_has_one_handler)
{
    kvp_http_route r[] = {{.path = "/x"}};
    kvp_http_opts o = {.listen = "127.0.0.1:0", .what = "master", .routes = r, .nroutes = 1};
    kvp_http *h = NULL;
    char err[512];
    CHECK_EQ(kvp_http_start(&o, &h, err, sizeof err), KVP_EINVALID_PARAMS);
    r[0] = (kvp_http_route){.path = "/x", .fn = kvp_mstatus_page, .fn_req = kvp_kvapi_lookup};
    CHECK_EQ(kvp_http_start(&o, &h, err, sizeof err), KVP_EINVALID_PARAMS);
    CHECK(h == NULL && strstr(err, "/x") != NULL);
}

/* --- slots, slow headers, arguments (a bare endpoint: /healthz, open) --- */

static int ok_fn(void *ctx, kvp_buf *out, const char **ctype)
{
    (void)ctx;
    (void)ctype;
    kvp_buf_printf(out, "ok\n");
    return 200;
}

static kvp_http *bare_up(const char *token)
{
    static const kvp_http_route r[] = {{.path = "/healthz", .fn = ok_fn, .open = 1},
                                       {.path = "/metrics", .fn = ok_fn}};
    kvp_http_opts o = {.listen = "127.0.0.1:0", .token = token, .what = "master",
                       .routes = r, .nroutes = 2};
    kvp_http *h = NULL;
    char err[512];
    return kvp_http_start(&o, &h, err, sizeof err) == 0 ? h : NULL;
}

/* A connection from 127.0.0.<src> to the endpoint; reads time out after
 * rcv_ms. */
static int connect_from(int src, uint16_t port, int rcv_ms)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)src);
    struct timeval tv = {.tv_sec = rcv_ms / 1000, .tv_usec = (rcv_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in d = {.sin_family = AF_INET, .sin_port = htons(port)};
    d.sin_addr.s_addr = htonl(0x7f000001u);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || connect(fd, (struct sockaddr *)&d, sizeof d)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* One request on its own connection from 127.0.0.<src>: the status, or -1
 * (refused, closed unanswered, or no answer within 2 s). */
static int ask_from(int src, uint16_t port, const char *req)
{
    int fd = connect_from(src, port, 2000);
    if (fd < 0)
        return -1;
    char ans[512];
    size_t got = 0;
    ssize_t r;
    if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
        close(fd);
        return -1;
    }
    while (got + 1 < sizeof ans && (r = read(fd, ans + got, sizeof ans - 1 - got)) > 0) {
        got += (size_t)r;
        ans[got] = '\0';
        if (strstr(ans, "\r\n\r\n"))
            break;
    }
    ans[got] = '\0';
    close(fd);
    return status_of(ans);
}

/* 1 when the server closed fd (end of stream or reset), 0 when still open. */
static int closed_by_server(int fd)
{
    char c;
    ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

#define PROBE "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

/* 64 connections from 8 addresses, each with an unfinished request: the
 * probes are answered at once, from a 9th address and from one of theirs,
 * with a token set (checked only after the headers). */
TEST(slow_headers_do_not_take_the_probes_slots)
{
    kvp_http *h = bare_up("sekrit");
    CHECK(h != NULL);
    uint16_t port = kvp_http_port(h);
    int fds[64];
    for (int i = 0; i < 64; i++) {
        fds[i] = connect_from(2 + i % 8, port, 100);
        CHECK(fds[i] >= 0);
        const char *part = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
        CHECK_EQ(send(fds[i], part, strlen(part), MSG_NOSIGNAL), (ssize_t)strlen(part));
    }
    usleep(200 * 1000); /* the server has taken them all in */
    uint64_t t0 = kvp_now_ms();
    CHECK_EQ(ask_from(1, port, PROBE), 200);
    CHECK_EQ(ask_from(3, port, PROBE), 200);
    CHECK_EQ(ask_from(10, port,
                      "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekrit\r\n"
                      "Connection: close\r\n\r\n"), 200);
    CHECK(kvp_now_ms() - t0 < 1500);
    CHECK(kvp_http_evicted(h) >= 2);
    int closed = 0;
    for (int i = 0; i < 64; i++) {
        closed += closed_by_server(fds[i]);
        close(fds[i]);
    }
    CHECK(closed >= 2); /* the oldest waiting ones made room */
    kvp_http_stop(h);
}

/* A request whose headers trickle in, a line every 400 ms (never 10 s of
 * silence): closed about 5 s after it opened, not served forever. A kept
 * alive connection is not closed while it is answered. */
TEST(headers_have_a_deadline_however_paced)
{
    kvp_http *h = bare_up(NULL);
    CHECK(h != NULL);
    uint16_t port = kvp_http_port(h);
    int fd = connect_from(1, port, 100);
    CHECK(fd >= 0);
    uint64_t t0 = kvp_now_ms(), closed_at = 0;
    const char *line0 = "GET /healthz HTTP/1.1\r\n";
    CHECK(send(fd, line0, strlen(line0), MSG_NOSIGNAL) > 0);
    for (int i = 0; kvp_now_ms() - t0 < 8000; i++) {
        usleep(400 * 1000);
        char hl[64];
        snprintf(hl, sizeof hl, "X-Slow-%d: 1\r\n", i);
        if (closed_by_server(fd) || send(fd, hl, strlen(hl), MSG_NOSIGNAL) < 0) {
            closed_at = kvp_now_ms() - t0;
            break;
        }
    }
    close(fd);
    CHECK(closed_at >= 4500 && closed_at < 7000);
    CHECK(kvp_http_late(h) >= 1);
    CHECK_EQ(ask_from(1, port, PROBE), 200);
    kvp_http_stop(h);
}

/* A query of 20,000 empty arguments is answered 400 at once (it used to
 * spend the connection's memory and wait for the idle timeout); 64 are
 * served. */
TEST(too_many_query_arguments_are_answered_at_once)
{
    kvp_http *h = bare_up(NULL);
    CHECK(h != NULL);
    uint16_t port = kvp_http_port(h);
    size_t n = 20000, cap = n + 128;
    char *req = malloc(cap);
    CHECK(req != NULL);
    int o = snprintf(req, cap, "GET /healthz?");
    memset(req + o, '&', n - 1);
    snprintf(req + o + n - 1, cap - (size_t)o - n + 1,
             " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    uint64_t t0 = kvp_now_ms();
    CHECK_EQ(ask_from(1, port, req), 400);
    CHECK(kvp_now_ms() - t0 < 1500);
    o = snprintf(req, cap, "GET /healthz?");
    for (int i = 0; i < 64; i++)
        o += snprintf(req + o, cap - (size_t)o, "%sa=%d", i ? "&" : "", i);
    snprintf(req + o, cap - (size_t)o, " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK_EQ(ask_from(1, port, req), 200);
    snprintf(req + o, cap - (size_t)o, "&b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK_EQ(ask_from(1, port, req), 400);
    free(req);
    kvp_http_stop(h);
}
