/* test_http.c -- the HTTP endpoint in process: a master's loop publishes
 * its picture while clients put and scrapers read /metrics and
 * /api/stats at once (the threaded path TSan checks); what the endpoint
 * answers, its limits on methods and paths, and the bearer token. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/config.h"
#include "harness.h"
#include "kvpool.h"
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
    size_t n = strlen(req), got = 0;
    if (write(fd, req, n) != (ssize_t)n) {
        close(fd);
        return -1;
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

static int env_up(env *e, const char *token)
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
    kvp_http_route r[] = {{"/metrics", kvp_mstatus_metrics, st, 0},
                          {"/api/stats", kvp_mstatus_api, st, 0},
                          {"/", kvp_mstatus_page, st, 0},
                          {"/readyz", kvp_mstatus_readyz, st, 1}};
    kvp_http_opts o = {.listen = "127.0.0.1:0", .token = token, .what = "master", .routes = r,
                       .nroutes = 4};
    REQUIRE(kvp_http_start(&o, &e->h, err, sizeof err) == 0);
    REQUIRE(pthread_create(&e->loop, NULL, loop_main, e->s) == 0);
    return 0;
}

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
    size_t big = 64 << 10;
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
    kvp_http_route r[] = {{"/x", kvp_mstatus_page, NULL, 0}};
    kvp_http_opts o = {.listen = "0.0.0.0:0", .what = "master", .routes = r, .nroutes = 1};
    kvp_http *h = NULL;
    char err[512];
    CHECK_EQ(kvp_http_start(&o, &h, err, sizeof err), KVP_ECONFIG);
    CHECK(h == NULL && strstr(err, "HTTP endpoint") != NULL);
}
