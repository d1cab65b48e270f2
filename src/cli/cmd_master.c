/* cmd_master.c -- `kvpool master`: run the metadata service. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/log.h"
#include "common/notify.h"
#include "ha/follow.h"
#include "ha/leader.h"
#include "kvpool.h"
#include "master/service.h"
#include "net/http.h"

static void help(void)
{
    printf("usage: kvpool master [--listen HOST:PORT] [--config FILE] [--port-file FILE]\n"
           "                     [--<config key> VALUE]...\n\n"
           "Runs the kvpool master: object metadata, allocation, eviction, leases and\n"
           "liveness. It never touches object bytes. Stops cleanly on SIGTERM/SIGINT.\n\n"
           "  --listen HOST:PORT  address to serve (default 127.0.0.1:50051; port 0 = any)\n"
           "  --config FILE       JSON configuration (default $KVPOOL_CONFIG, then\n"
           "                      $MOONCAKE_CONFIG_PATH)\n"
           "  --port-file FILE    write the bound port there once listening\n\n"
           "With --etcd URL (and --cluster NAME) several masters form a cluster: the one\n"
           "that wins etcd's election serves, the others wait as standbys and take over\n"
           "when its lease (--ha-lease-ttl) lapses; clients and nodes name the master\n"
           "etcd://HOST:PORT/NAME. A leader that loses its lease stops serving and exits 3.\n\n"
           "The keys the master reads are also flags (--lease-ttl 5s, --client-ttl 10s,\n"
           "...); kvpool help config prints what each key means:\n");
    kvp_config_print_flags(stdout, KVP_KEY_MASTER, NULL, 2);
}

/* ---------------------------------------------------------- election */

struct lost_ctx {
    kvp_mserver *s;
    int lost;
};

/* The leader's lease is gone (or unrenewable): stop serving at once. */
static void on_lost(void *arg, const char *why)
{
    struct lost_ctx *c = arg;
    (void)why;
    __atomic_store_n(&c->lost, 1, __ATOMIC_RELEASE);
    kvp_mserver_stop(c->s);
}

/* The lease was renewed: the term holds until then. */
static void on_renewed(void *arg, uint64_t valid_until_ms)
{
    struct lost_ctx *c = arg;
    kvp_mserver_set_term(c->s, valid_until_ms);
}

/* SIGTERM / SIGINT arrived (blocked: they wait for the server's signalfd). */
static int stop_requested(void *arg)
{
    (void)arg;
    sigset_t p;
    return sigpending(&p) == 0 && (sigismember(&p, SIGTERM) || sigismember(&p, SIGINT));
}

/* The address a leader publishes: advertise, else the listen host with the
 * bound port (a wildcard host cannot be dialled: refused). */
static int published_addr(const kvp_config *cfg, uint16_t port, char *out, size_t outlen)
{
    if (cfg->advertise[0])
        return snprintf(out, outlen, "%s", cfg->advertise) < (int)outlen ? 0 : -1;
    const char *c = strrchr(cfg->listen, ':');
    size_t hl = c ? (size_t)(c - cfg->listen) : 0;
    if (hl == 0 || (hl == 7 && !strncmp(cfg->listen, "0.0.0.0", 7)) ||
        (hl == 4 && !strncmp(cfg->listen, "[::]", 4)))
        return -1;
    return snprintf(out, outlen, "%.*s:%u", (int)hl, cfg->listen, port) < (int)outlen ? 0 : -1;
}

/* The follower's apply: the standby's core (its loop is not running). */
static int follow_apply(void *ctx, const uint8_t *body, size_t len, uint64_t *seq)
{
    return kvp_mserver_repl_apply(ctx, body, len, seq);
}

#define FOLLOW_TIMEOUT_MS 1000 /* a follower's calls (the stop waits for one at most) */

/* kvp_leader_set_defer's test: a standby without the whole index lets one
 * that has it take over first. */
static int not_synced(void *f) { return !kvp_follow_synced(f); }

/* Follows the leader's index while standing by (stopped before return). */
static kvp_follow *follow(const kvp_config *cfg, const kvp_etcd_target *t, const char *self,
                          kvp_mserver *s)
{
    char url[1200];
    size_t k = (size_t)snprintf(url, sizeof url, "etcd://");
    for (int i = 0; i < t->n && k < sizeof url; i++)
        k += (size_t)snprintf(url + k, sizeof url - k, "%s%s", i ? "," : "", t->endpoints[i]);
    if (k < sizeof url)
        snprintf(url + k, sizeof url - k, "/%s", t->cluster);
    kvp_follow_opts o = {.master = url,
                         .self = self,
                         .token = cfg->cluster_token,
                         .node_token = cfg->node_token,
                         .timeout_ms = FOLLOW_TIMEOUT_MS,
                         .apply = follow_apply,
                         .ctx = s};
    kvp_follow *f = NULL;
    if (kvp_follow_start(&o, &f) != 0)
        KVP_WARN("master", "cannot follow the leader's index: a takeover starts empty");
    return f;
}

/* Campaigns until this master is the leader (0; *out its term, *fol the
 * follower, still running), a signal
 * asked to stop (-1), or the configuration is wrong (2, message printed). */
static int elect(const kvp_config *cfg, kvp_mserver *s, kvp_leader **out, kvp_follow **fol)
{
    char err[256], addr[KVP_LEADER_ADDR_MAX + 1];
    kvp_etcd_target t;
    if (kvp_etcd_parse_url(cfg->etcd, &t, err, sizeof err) != 0) {
        fprintf(stderr, "kvpool master: --etcd %s: %s\n", cfg->etcd, err);
        return 2;
    }
    const char *slash = kvp_etcd_is_url(cfg->etcd) ? strchr(cfg->etcd + 7, '/') : NULL;
    int named = slash && slash[1]; /* etcd://.../NAME names the cluster itself */
    if (!named && !kvp_etcd_cluster_ok(cfg->cluster, strlen(cfg->cluster))) {
        fprintf(stderr, "kvpool master: --cluster %s: 1 to 64 letters, digits, '.', '_', '-'\n",
                cfg->cluster);
        return 2;
    }
    if (!named)
        snprintf(t.cluster, sizeof t.cluster, "%s", cfg->cluster);
    else if (strcmp(cfg->cluster, "default") != 0 && strcmp(cfg->cluster, t.cluster) != 0) {
        fprintf(stderr, "kvpool master: --etcd names cluster %s, --cluster %s\n", t.cluster,
                cfg->cluster);
        return 2;
    }
    if (published_addr(cfg, kvp_mserver_port(s), addr, sizeof addr) != 0) {
        fprintf(stderr, "kvpool master: --listen %s is a wildcard: give --advertise HOST:PORT, "
                        "the address clients dial\n", cfg->listen);
        return 2;
    }
    uint64_t id = kvp_mserver_master_id(s); /* clients check it after HELLO */
    kvp_leader *l;
    int64_t ttl = (int64_t)((cfg->ha_lease_ttl_ms + 999) / 1000);
    int rc = kvp_leader_open(&t, ttl, addr, id, &l, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpool master: %s\n", err);
        return 2;
    }
    KVP_INFO("master", "cluster %s: campaigning through etcd %s as %s", t.cluster,
             t.endpoints[0], addr);
    kvp_mserver_standby(s, 1);
    kvp_notify("READY=1\nSTATUS=standby: campaigning"); /* a standby serves its role */
    kvp_follow *f = follow(cfg, &t, addr, s);
    kvp_leader_set_defer(l, not_synced, f, 2 * cfg->ha_lease_ttl_ms);
    rc = kvp_leader_campaign(l, stop_requested, NULL);
    kvp_mserver_standby(s, 0); /* the loop takes the listener from here */
    if (rc != 0) {
        kvp_follow_stop(f);
        kvp_leader_close(l);
        if (rc == KVP_EAUTH) {
            fprintf(stderr, "kvpool master: etcd refused the credentials (keys etcd_user, "
                            "etcd_password_file)\n");
            return 2;
        }
        return -1;
    }
    *out = l;
    *fol = f; /* stopped once the keepalive runs: stopping may take a call's timeout */
    return 0;
}

int kvp_cmd_master(int argc, char **argv)
{
    kvp_config cfg;
    kvp_config_defaults(&cfg);
    static const kvp_cli_flag own[] = {{"port-file", KVP_CLI_TEXT}, {NULL, KVP_CLI_TEXT}};
    const char *vals[1] = {NULL};
    int rc = kvp_cli_parse_for(argc, argv, KVP_KEY_MASTER, &cfg, own, vals, NULL);
    if (rc == 1) {
        help();
        return 0;
    }
    if (rc < 0)
        return 2;
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);
    char err[256];
    kvp_mserver *s;
    rc = kvp_mserver_create(&cfg, 1, &s, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvpool master: %s\n", err);
        return 1;
    }
    if (vals[0]) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", vals[0]);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%u\n", kvp_mserver_port(s)) < 0 || fclose(f) != 0 ||
            rename(tmp, vals[0]) != 0) {
            fprintf(stderr, "kvpool master: cannot write port file %s\n", vals[0]);
            kvp_mserver_destroy(s);
            return 1;
        }
    }
    kvp_http *http; /* before the election: a standby shows itself too */
    if (kvp_cli_http_start("master", &cfg, s, NULL, &http) != 0) {
        kvp_mserver_destroy(s);
        return 1;
    }
    kvp_leader *l = NULL;
    kvp_follow *f = NULL;
    if (cfg.etcd[0] && (rc = elect(&cfg, s, &l, &f)) != 0) {
        if (rc < 0)
            kvp_notify("STOPPING=1");
        kvp_http_stop(http);
        kvp_mserver_destroy(s);
        return rc < 0 ? 0 : rc; /* < 0: stopped by a signal while standing by */
    }
    struct lost_ctx lc = {s, 0};
    if (l)
        kvp_mserver_set_term(s, kvp_leader_valid_until(l));
    if (l && kvp_leader_start_keepalive(l, on_lost, on_renewed, &lc) != 0) {
        fprintf(stderr, "kvpool master: cannot start the lease keepalive\n");
        kvp_follow_stop(f);
        kvp_leader_close(l);
        kvp_http_stop(http);
        kvp_mserver_destroy(s);
        return 1;
    }
    if (l) { /* the term is renewed from now on; the core is the loop's once joined */
        kvp_follow_stop(f);
        kvp_mserver_takeover(s);
    }
    kvp_notify(l ? "STATUS=leader" : "READY=1"); /* a leader was READY as a standby */
    rc = kvp_mserver_run(s);
    kvp_notify("STOPPING=1");
    /* run returned: nothing more is served; the keepalive thread (which
     * may touch s) ends before s goes, then the term is given up */
    kvp_leader_close(l);
    int over = __atomic_load_n(&lc.lost, __ATOMIC_ACQUIRE) || kvp_mserver_term_over(s);
    kvp_http_stop(http);
    kvp_mserver_destroy(s);
    KVP_INFO("master", "stopped");
    if (over)
        return 3;
    return rc ? 1 : 0;
}
