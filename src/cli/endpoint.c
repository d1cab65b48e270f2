/* endpoint.c -- the servers' HTTP endpoint: which routes a command serves
 * and how the master's and the node's answers combine (kvpool serve). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/mem.h"
#include "common/prom.h"
#include "common/secret.h"
#include "master/kvapi.h"
#include "master/service.h"
#include "master/status.h"
#include "net/http.h"
#include "node/node.h"

/* What one endpoint describes; it lives as long as the process does (one
 * endpoint per process). */
static struct parts {
    kvp_mstatus *ms;
    kvp_node *node;
} g_parts;

static int metrics(void *ctx, kvp_buf *out, const char **ctype)
{
    struct parts *p = ctx;
    *ctype = KVP_PROM_CTYPE;
    if (p->ms)
        kvp_mstatus_write_metrics(p->ms, out);
    if (p->node)
        kvp_node_write_metrics(p->node, out);
    return 200;
}

static int healthz(void *ctx, kvp_buf *out, const char **ctype)
{
    struct parts *p = ctx;
    const char *why = "ok";
    int ok = !p->ms || kvp_mstatus_healthy(p->ms, &why);
    kvp_buf_printf(out, "%s\n", why);
    return ok ? 200 : 503;
}

static int readyz(void *ctx, kvp_buf *out, const char **ctype)
{
    struct parts *p = ctx;
    const char *why = "ok";
    int ok = !p->ms || kvp_mstatus_ready(p->ms, &why);
    if (ok && p->node && !kvp_node_mounted(p->node)) {
        ok = 0;
        why = "the storage node is not mounted at its master";
    }
    kvp_buf_printf(out, "%s\n", why);
    return ok ? 200 : 503;
}

int kvp_cli_http_start(const char *cmd, const kvp_config *cfg, kvp_mserver *master, kvp_node *node,
                       kvp_http **out)
{
    *out = NULL;
    kvp_mstatus *ms = master ? kvp_mserver_status(master) : NULL;
    if (!cfg->http[0])
        return 0;
    char token[256] = "", err[512];
    if (cfg->http_token_file[0] &&
        kvp_secret_read_file(cfg->http_token_file, token, sizeof token, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool %s: http_token_file: %s\n", cmd, err);
        return 1;
    }
    /* Tenants protected from each other: what the master's endpoint shows
     * (/metrics, /api/stats, the page, /api/kv/lookup) is every tenant's,
     * so it needs the operator's token even on loopback, where a tenant's
     * process may run too (docs/SECURITY.md). */
    if (ms && cfg->tenant_tokens_file[0] && !token[0]) {
        fprintf(stderr,
                "kvpool %s: key \"http\" needs key \"http_token_file\" with "
                "\"tenant_tokens_file\": the endpoint shows every tenant's objects\n",
                cmd);
        return 1;
    }
    g_parts = (struct parts){ms, node};
    kvp_http_route r[7];
    size_t n = 0;
    r[n++] = (kvp_http_route){.path = "/metrics", .fn = metrics, .ctx = &g_parts};
    r[n++] = (kvp_http_route){.path = "/healthz", .fn = healthz, .ctx = &g_parts, .open = 1};
    r[n++] = (kvp_http_route){.path = "/readyz", .fn = readyz, .ctx = &g_parts, .open = 1};
    if (ms) {
        r[n++] = (kvp_http_route){.path = "/", .fn = kvp_mstatus_page, .ctx = ms};
        r[n++] = (kvp_http_route){.path = "/api/stats", .fn = kvp_mstatus_api, .ctx = ms};
        /* Mooncake's route, which SGLang's check_server polls (MOONCAKE_COMPAT.md) */
        r[n++] = (kvp_http_route){.path = "/get_all_segments", .fn = kvp_mstatus_segments,
                                  .ctx = ms};
        /* asks the loop itself (master/kvapi.h); not open: the token guards it */
        r[n++] = (kvp_http_route){.path = "/api/kv/lookup", .fn_req = kvp_kvapi_lookup,
                                  .ctx = master};
    }
    kvp_http_opts o = {.listen = cfg->http,
                       .token = token,
                       .insecure = cfg->insecure,
                       .what = ms ? "master" : "storage node",
                       .routes = r,
                       .nroutes = n};
    int rc = kvp_http_start(&o, out, err, sizeof err);
    memset(token, 0, sizeof token);
    if (rc) {
        fprintf(stderr, "kvpool %s: %s\n", cmd, err);
        return 1;
    }
    return 0;
}
