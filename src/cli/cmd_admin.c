/*
 * cmd_admin.c -- `kvpool stat` and `kvpool reset`: administration through
 * the master (no data plane needed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/size.h"
#include "ha/leader.h"
#include "kvpool.h"
#include "net/rpc.h"
#include "proto/proto.h"

static int connect_master(const kvp_config *cfg, const char *cmd, kvp_rpc **r)
{
    char err[256];
    kvp_rpc_opts o = {.token = cfg->cluster_token[0] ? cfg->cluster_token : NULL,
                      .name = cmd,
                      .timeout_ms = (int)cfg->rpc_timeout_ms,
                      .tenant_token = cfg->tenant_token};
    int rc = kvp_rpc_open(cfg->master_addr, &o, r, err, sizeof err);
    char hint[512];
    if (rc)
        fprintf(stderr, "kvpool %s: %s%s\n", cmd, err, kvp_cli_tenant_hint(cfg, rc, hint, sizeof hint));
    return rc;
}


static void print_json_str(kvp_bytes b)
{
    for (uint32_t k = 0; k < b.len; k++) {
        uint8_t c = b.p[k];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 32 || c > 126)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

/* The configurations the pool holds (CONFIGS): *have = 1 with *cf set, 0
 * when the master predates CONFIGS (nothing to show); else an error. */
static int get_configs(kvp_rpc *r, const kvp_proto_limits *lim, kvp_arena *a,
                       kvp_msg_configs_resp *cf, int *have)
{
    int32_t st;
    const uint8_t *body;
    uint32_t len;
    *have = 0;
    memset(cf, 0, sizeof *cf);
    int rc = kvp_rpc_call(r, KVP_OP_CONFIGS, NULL, 0, &st, &body, &len);
    if (rc == 0 && st == KVP_EUNKNOWN_OP)
        return 0;
    if (rc == 0)
        rc = st;
    if (rc == 0)
        rc = kvp_dec_configs_resp(body, len, lim, a, cf);
    *have = rc == 0;
    return rc;
}

/* Keeps the configuration rows of tenant `only` (NULL: all). */
static void keep_tenant_configs(kvp_msg_configs_resp *cf, const char *only)
{
    uint32_t n = 0;
    for (uint32_t i = 0; only && i < cf->n; i++)
        if (cf->rows[i].tenant.len == strlen(only) &&
            !memcmp(cf->rows[i].tenant.p, only, cf->rows[i].tenant.len))
            cf->rows[n++] = cf->rows[i];
    if (only)
        cf->n = n;
}

static void print_json(const kvp_msg_stats_resp *s, const kvp_msg_configs_resp *cf,
                       const char *version)
{
    printf("{\"version\": \"%s\", \"counters\": {", version);
    for (uint32_t i = 0; i < s->n_counters && i < KVP_STAT__COUNT; i++)
        printf("%s\"%s\": %llu", i ? ", " : "", kvp_stat_name(i), (unsigned long long)s->counters[i]);
    printf("}, \"segments\": [");
    for (uint32_t i = 0; i < s->n_segs; i++) {
        const kvp_seg_stat *g = &s->segs[i];
        printf("%s{\"id\": \"%016llx\", \"name\": \"", i ? ", " : "", (unsigned long long)g->id);
        print_json_str(g->name);
        printf("\", \"capacity\": %llu, \"used\": %llu, \"objects\": %llu, \"largest_free\": %llu}",
               (unsigned long long)g->capacity, (unsigned long long)g->used,
               (unsigned long long)g->objects, (unsigned long long)g->largest_free);
    }
    printf("], \"tenants\": [");
    for (uint32_t i = 0; i < s->n_tenants; i++) {
        const kvp_tenant_stat *t = &s->tenants[i];
        printf("%s{\"name\": \"", i ? ", " : "");
        print_json_str(t->name);
        printf("\", \"objects\": %llu, \"bytes\": %llu, \"pool_bytes\": %llu, "
               "\"max_bytes\": %llu, \"max_objects\": %llu, \"share\": %u, "
               "\"evictions\": %llu, \"refused\": %llu}",
               (unsigned long long)t->objects, (unsigned long long)t->bytes,
               (unsigned long long)t->pool_bytes, (unsigned long long)t->max_bytes,
               (unsigned long long)t->max_objects, t->share, (unsigned long long)t->evictions,
               (unsigned long long)t->refused);
    }
    printf("]");
    if (cf) { /* "fingerprint": "" = the tenant's objects of configurations without a row */
        printf(", \"configs\": [");
        for (uint32_t i = 0; i < cf->n; i++) {
            const kvp_config_stat *c = &cf->rows[i];
            printf("%s{\"tenant\": \"", i ? ", " : "");
            print_json_str(c->tenant);
            printf("\", \"name\": \"");
            print_json_str(c->name);
            printf("\", \"fingerprint\": \"");
            print_json_str(c->fp);
            printf("\", \"objects\": %llu, \"bytes\": %llu}", (unsigned long long)c->objects,
                   (unsigned long long)c->bytes);
        }
        printf("]");
    }
    printf("}\n");
    fflush(stdout);
}

/* The configuration keys stat and reset read, for their --help. */
static void print_admin_keys(const char *cmd)
{
    printf("\nA protected tenant's token comes from --tenant-token-file FILE or\n"
           "$KVPOOL_TENANT_TOKEN, never from a flag. The configuration keys %s reads,\n"
           "also from --config FILE (kvpool help config for all of them):\n", cmd);
    kvp_config_print_flags(stdout, KVP_KEY_ADMIN, NULL, 2);
}

/* With a tenant named (flag or file), only its row of the tenant table is
 * shown: keeps the rows of s->tenants named `only` (NULL: all). */
static void keep_tenant(kvp_msg_stats_resp *s, const char *only)
{
    uint32_t n = 0;
    for (uint32_t i = 0; only && i < s->n_tenants; i++)
        if (s->tenants[i].name.len == strlen(only) &&
            !memcmp(s->tenants[i].name.p, only, s->tenants[i].name.len))
            s->tenants[n++] = s->tenants[i];
    if (only)
        s->n_tenants = n;
}

/* A cluster's master (etcd://): who leads, at which epoch, who stands by,
 * and how far behind the standbys' copies of the index are (c: the
 * leader's counters). */
static void print_cluster(const char *url, const uint64_t *c)
{
    kvp_leader_info lead, mem[16];
    int has = 0, n = 0;
    char err[256];
    if (kvp_leader_cluster(url, &lead, &has, mem, 16, &n, err, sizeof err) != 0) {
        printf("cluster: %s\n", err);
        return;
    }
    if (has)
        printf("cluster leader %s, epoch %llu\n", lead.addr, (unsigned long long)lead.epoch);
    else
        printf("cluster: no leader elected\n");
    int shown = 0;
    for (int i = 0; i < n && i < 16; i++) {
        if (has && mem[i].id == lead.id)
            continue;
        printf("%s%s", shown++ ? ", " : "cluster standbys ", mem[i].addr);
    }
    printf("%s", shown ? "\n" : "cluster standbys: none\n");
    if (c[KVP_STAT_REPL_FOLLOWERS] == 0)
        printf("cluster index replication: no standby follows (a new leader would start "
               "empty)\n");
    else
        printf("cluster index replication: %llu standbys following, %llu in sync; seq %llu, "
               "lag %llu records, %llu MiB sent\n",
               (unsigned long long)c[KVP_STAT_REPL_FOLLOWERS],
               (unsigned long long)c[KVP_STAT_REPL_IN_SYNC],
               (unsigned long long)c[KVP_STAT_REPL_SEQ], (unsigned long long)c[KVP_STAT_REPL_LAG],
               (unsigned long long)(c[KVP_STAT_REPL_BYTES] >> 20));
    if (c[KVP_STAT_ADOPTED] || c[KVP_STAT_PARKED] || c[KVP_STAT_ADOPT_DROPPED])
        printf("cluster takeover: %llu objects kept, %llu waiting for their node, %llu dropped\n",
               (unsigned long long)c[KVP_STAT_ADOPTED], (unsigned long long)c[KVP_STAT_PARKED],
               (unsigned long long)c[KVP_STAT_ADOPT_DROPPED]);
}

/* Bytes as shown in a table: printable ASCII, else '?'; at most w. */
static void print_cell(kvp_bytes b, int w)
{
    int n = 0;
    for (uint32_t k = 0; k < b.len && n < w; k++, n++)
        putchar(b.p[k] >= 32 && b.p[k] < 127 ? b.p[k] : '?');
    for (; n < w; n++)
        putchar(' ');
}

/* The configurations block of `kvpool stat` (rows from CONFIGS). */
static void print_configs(const kvp_msg_configs_resp *cf)
{
    if (cf->n == 0) {
        printf("\n(no configuration fingerprints in keys: no kvpool.vllm engine stored here)\n");
        return;
    }
    printf("\n%-40s %-16s %-32s %10s %12s\n", "CONFIGURATION", "TENANT", "FINGERPRINT", "OBJECTS",
           "BYTES");
    for (uint32_t i = 0; i < cf->n; i++) {
        const kvp_config_stat *c = &cf->rows[i];
        char by[32];
        if (c->fp.len)
            print_cell(c->name, 40);
        else
            printf("%-40s", "(other configurations)");
        putchar(' ');
        print_cell(c->tenant, 16);
        putchar(' ');
        print_cell(c->fp.len ? c->fp : (kvp_bytes){(const uint8_t *)"-", 1}, 32);
        printf(" %10llu %12s\n", (unsigned long long)c->objects,
               kvp_size_format(c->bytes, by, sizeof by));
    }
    printf("(a configuration's description: kvpool get '<CONFIGURATION>@cfg:<FINGERPRINT>"
           "@kvpool-config')\n");
}

static void print_table(const kvp_msg_stats_resp *s)
{
    const uint64_t *c = s->counters;
    char a[32], b[32];
    uint64_t get = c[KVP_STAT_HITS] + c[KVP_STAT_MISSES];
    printf("objects %llu (%s), used %s of %s, hits %llu, misses %llu (hit rate %.1f%%)\n",
           (unsigned long long)c[KVP_STAT_OBJECTS], kvp_size_format(c[KVP_STAT_BYTES], a, sizeof a),
           kvp_size_format(c[KVP_STAT_USED], b, sizeof b),
           kvp_size_format(c[KVP_STAT_CAPACITY], (char[32]){0}, 32),
           (unsigned long long)c[KVP_STAT_HITS], (unsigned long long)c[KVP_STAT_MISSES],
           get ? 100.0 * (double)c[KVP_STAT_HITS] / (double)get : 0.0);
    printf("evictions %llu, leases %llu, pending puts %llu, clients %llu, segments %llu\n",
           (unsigned long long)c[KVP_STAT_EVICTIONS], (unsigned long long)c[KVP_STAT_LEASES],
           (unsigned long long)c[KVP_STAT_PENDING], (unsigned long long)c[KVP_STAT_CLIENTS],
           (unsigned long long)c[KVP_STAT_SEGMENTS]);
    if (s->n_counters > KVP_STAT_SPILL_PRESSURE && c[KVP_STAT_DISK_CAPACITY]) {
        char d[32], dc[32];
        printf("SSD tier: %llu objects (%s) of %s; spills %llu (%llu in flight, %llu failed), "
               "disk hits %llu, loads %llu (%llu failed), dropped %llu, registered %llu, "
               "puts backed off %llu\n",
               (unsigned long long)c[KVP_STAT_DISK_OBJECTS],
               kvp_size_format(c[KVP_STAT_DISK_BYTES], d, sizeof d),
               kvp_size_format(c[KVP_STAT_DISK_CAPACITY], dc, sizeof dc),
               (unsigned long long)c[KVP_STAT_SPILLS], (unsigned long long)c[KVP_STAT_SPILLING],
               (unsigned long long)c[KVP_STAT_SPILL_FAILS],
               (unsigned long long)c[KVP_STAT_DISK_HITS], (unsigned long long)c[KVP_STAT_LOADS],
               (unsigned long long)c[KVP_STAT_LOAD_FAILS],
               (unsigned long long)c[KVP_STAT_DISK_DROPPED],
               (unsigned long long)c[KVP_STAT_DISK_REGISTERED],
               (unsigned long long)c[KVP_STAT_SPILL_PRESSURE]);
        if (s->n_counters > KVP_STAT_DISK_DROPPED_PAGES) {
            char u[32], cb[32];
            printf("SSD tier files: %s; compaction moved %s, reclaimed %llu pages; %llu pages "
                   "dropped for room\n",
                   kvp_size_format(c[KVP_STAT_DISK_USED], u, sizeof u),
                   kvp_size_format(c[KVP_STAT_DISK_COMPACTED], cb, sizeof cb),
                   (unsigned long long)c[KVP_STAT_DISK_COMPACTED_PAGES],
                   (unsigned long long)c[KVP_STAT_DISK_DROPPED_PAGES]);
        }
    }
    /* what clients moved per data path, as of their last heartbeats */
    for (int p = 0; p < KVP_STAT_NPATHS && s->n_counters > (uint32_t)KVP_STAT_PATH(p, 3); p++) {
        char pb[32], gb[32];
        printf("path %s: put %s (%llu transfers), get %s (%llu transfers)\n", kvp_path_name(p),
               kvp_size_format(c[KVP_STAT_PATH(p, 0)], pb, sizeof pb),
               (unsigned long long)c[KVP_STAT_PATH(p, 2)],
               kvp_size_format(c[KVP_STAT_PATH(p, 1)], gb, sizeof gb),
               (unsigned long long)c[KVP_STAT_PATH(p, 3)]);
    }
    printf("\n%-16s  %-24s %12s %12s %6s %10s %12s\n", "SEGMENT", "NAME", "CAPACITY", "USED",
           "USE%", "REPLICAS", "LARGEST FREE");
    for (uint32_t i = 0; i < s->n_segs; i++) {
        const kvp_seg_stat *g = &s->segs[i];
        char cap[32], used[32], lf[32];
        printf("%016llx  %-24.*s %12s %12s %5.1f%% %10llu %12s\n", (unsigned long long)g->id,
               (int)(g->name.len > 24 ? 24 : g->name.len), (const char *)g->name.p,
               kvp_size_format(g->capacity, cap, sizeof cap), kvp_size_format(g->used, used, sizeof used),
               g->capacity ? 100.0 * (double)g->used / (double)g->capacity : 0.0,
               (unsigned long long)g->objects, kvp_size_format(g->largest_free, lf, sizeof lf));
    }
    if (s->n_segs == 0)
        printf("(no segments mounted)\n");
    if (s->n_tenants > 0)
        printf("\n%-24s %10s %12s %12s %12s %12s %6s %10s %8s\n", "TENANT", "OBJECTS", "BYTES",
               "POOL", "MAX BYTES", "MAX OBJECTS", "SHARE", "EVICTIONS", "REFUSED");
    for (uint32_t i = 0; i < s->n_tenants; i++) {
        const kvp_tenant_stat *t = &s->tenants[i];
        char by[32], pb[32], mb[32], mo[32];
        if (t->max_objects)
            snprintf(mo, sizeof mo, "%llu", (unsigned long long)t->max_objects);
        else
            snprintf(mo, sizeof mo, "-");
        printf("%-24.*s %10llu %12s %12s %12s %12s %6u %10llu %8llu\n",
               (int)(t->name.len > 24 ? 24 : t->name.len), (const char *)t->name.p,
               (unsigned long long)t->objects, kvp_size_format(t->bytes, by, sizeof by),
               kvp_size_format(t->pool_bytes, pb, sizeof pb),
               t->max_bytes ? kvp_size_format(t->max_bytes, mb, sizeof mb) : "-", mo, t->share,
               (unsigned long long)t->evictions, (unsigned long long)t->refused);
    }
    fflush(stdout);
}

int kvp_cmd_stat(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL}, {"watch", KVP_CLI_TEXT},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[2] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_ADMIN, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool stat [--master HOST:PORT] [--json] [--watch SECONDS] [--tenant NAME]\n"
               "Shows the pool: objects, usage, hits, misses, evictions; the bytes clients\n"
               "put and got per data path (shm, tcp, ucx) as of their last heartbeats; per\n"
               "segment its capacity, usage, replicas and largest free block; per tenant its\n"
               "objects, bytes, pool bytes, quotas, share, evictions and refused puts (a\n"
               "session with a tenant token sees its own tenant only; --tenant NAME, or a\n"
               "configuration that names one, shows only that tenant's row); per engine\n"
               "configuration (the @cfg:<fingerprint> kvpool.vllm puts in its keys) its\n"
               "objects and bytes (a master older than this shows none). --watch repeats\n"
               "every SECONDS (default 2) until interrupted.\n");
        print_admin_keys("stat");
        return 0;
    }
    if (rc < 0)
        return 2;
    double every = 0;
    if (v[1] && kvp_cli_seconds("stat", "watch", v[1], 0, 1, 3600, &every) != 0)
        return 2;
    kvp_rpc *r;
    if (connect_master(&cfg, "stat", &r))
        return 1;
    kvp_arena a;
    kvp_arena_init(&a, 64u << 20);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    int ret = 0;
    for (;;) {
        int32_t st;
        const uint8_t *body;
        uint32_t len;
        kvp_msg_stats_resp s;
        kvp_arena_reset(&a);
        rc = kvp_rpc_call(r, KVP_OP_STATS, NULL, 0, &st, &body, &len);
        if (rc == 0)
            rc = st;
        if (rc == 0)
            rc = kvp_dec_stats_resp(body, len, &lim, &a, &s);
        /* a master before the per-path counters answers without them (not shown) */
        if (rc == 0 && s.n_counters < KVP_STAT_SHM_PUT_BYTES)
            rc = KVP_EPROTOCOL;
        if (rc) {
            char hint[512];
            fprintf(stderr, "kvpool stat: %s: %s%s\n", cfg.master_addr, kvp_strerror(rc),
                    kvp_cli_tenant_hint(&cfg, rc, hint, sizeof hint));
            ret = 1;
            break;
        }
        const char *only = kvp_config_was_set(&cfg, "tenant") ? cfg.tenant : NULL;
        keep_tenant(&s, only);
        kvp_msg_configs_resp cf;
        int have_cf = 0;
        int crc = get_configs(r, &lim, &a, &cf, &have_cf);
        if (have_cf)
            keep_tenant_configs(&cf, only);
        if (every > 0 && !v[0] && isatty(1))
            printf("\033[H\033[2J");
        /* the server's release, from the HELLO of the connection in use (proto.c
         * lets printable ASCII through; '"' and '\\' are dropped for the JSON) */
        char ver[KVP_SERVER_VERSION_MAX + 1];
        size_t vn = 0;
        for (const char *p = kvp_rpc_hello_resp(r)->server_version; *p; p++)
            if (*p != '"' && *p != '\\')
                ver[vn++] = *p;
        ver[vn] = '\0';
        if (v[0]) {
            print_json(&s, have_cf ? &cf : NULL, ver);
        } else {
            printf("master version %s\n", vn ? ver : "unknown");
            if (kvp_etcd_is_url(cfg.master_addr))
                print_cluster(cfg.master_addr, s.counters);
            print_table(&s);
            if (have_cf)
                print_configs(&cf);
            else if (crc)
                printf("\nconfigurations: %s\n", kvp_strerror(crc));
            fflush(stdout);
        }
        if (every <= 0)
            break;
        usleep((useconds_t)(every * 1e6));
        if (every > 0 && !v[0])
            printf("\n");
    }
    kvp_arena_free(&a);
    kvp_rpc_close(r);
    return ret;
}

int kvp_cmd_reset(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"yes", KVP_CLI_BOOL}, {"force", KVP_CLI_BOOL},
                                       {NULL, KVP_CLI_TEXT}};
    const char *v[2] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_ADMIN, &cfg, own, v, NULL);
    if (rc == 1) {
        printf("usage: kvpool reset [--master HOST:PORT] [--yes] [--force] [--tenant NAME]\n"
               "Removes every object of the tenant (the configuration key tenant, default\n"
               "\"default\"), and only that tenant's. Asks first unless --yes. Objects being\n"
               "read (leased) or pinned are kept unless --force.\n");
        print_admin_keys("reset");
        return 0;
    }
    if (rc < 0)
        return 2;
    if (!v[0]) {
        if (!isatty(0)) {
            fprintf(stderr, "kvpool reset: refusing without --yes (standard input is not a terminal)\n");
            return 2;
        }
        fprintf(stderr, "Remove every object of tenant \"%s\" on %s? [y/N] ", cfg.tenant,
                cfg.master_addr);
        char line[16];
        if (!fgets(line, sizeof line, stdin) || (line[0] != 'y' && line[0] != 'Y')) {
            fprintf(stderr, "kvpool reset: nothing removed\n");
            return 1;
        }
    }
    kvp_rpc *r;
    if (connect_master(&cfg, "reset", &r))
        return 1;
    kvp_buf b;
    kvp_buf_init(&b, 4096);
    const char *t = cfg.tenant;
    kvp_msg_remove_all m = {{(const uint8_t *)t, (uint32_t)strlen(t)}, v[1] ? 1 : 0};
    kvp_enc_remove_all(&b, &m);
    int32_t st;
    const uint8_t *body;
    uint32_t len;
    kvp_msg_remove_all_resp resp;
    rc = b.err ? b.err : kvp_rpc_call(r, KVP_OP_REMOVE_ALL, b.data, b.len, &st, &body, &len);
    if (rc == 0)
        rc = st;
    if (rc == 0)
        rc = kvp_dec_remove_all_resp(body, len, &resp);
    kvp_buf_free(&b);
    kvp_rpc_close(r);
    if (rc) {
        char hint[512];
        fprintf(stderr, "kvpool reset: %s: %s%s\n", cfg.master_addr, kvp_strerror(rc),
                kvp_cli_tenant_hint(&cfg, rc, hint, sizeof hint));
        return 1;
    }
    printf("removed %llu objects of tenant \"%s\"\n", (unsigned long long)resp.removed, cfg.tenant);
    return 0;
}
