/*
 * node.c -- a storage node: segment + segment server + master link; see
 * node.h.
 *
 * The link thread owns the kvp_rpc to the master. Its loop:
 *   no connection  -> open (HELLO); on failure sleep with backoff
 *                     (100 ms doubling to 2 s) and retry
 *   connected      -> MOUNT_SEGMENT (idempotent for its owner), then
 *                     HEARTBEAT every client_ttl/3; a failed call drops the
 *                     connection (back to "no connection"), a HEARTBEAT
 *                     answering another master_id or 0 segments remounts
 *   stop requested -> UNMOUNT_SEGMENT (best effort, bounded), close
 * `mounted` is written by the link thread only and read atomically.
 *
 * Revocations: a SEG_FREED frame raises the floors (grants.h) as it comes;
 * the link then runs the segment server's revocation barrier and, once it
 * returned, answers SEG_FREED_ACK with the frame's sequence number: the
 * master may reuse the space of quarantined allocations only then. Every
 * mount after the first (a reconnect, a master restart) first re-keys the
 * grants and runs a barrier that cuts every transfer in flight, so neither
 * a descriptor nor a transfer begun under the earlier mount outlives it
 * (the master adopts the new secret, and what it quarantined is released).
 *
 * Listen address and advertised TCP host (node_addr; a wildcard address
 * cannot be dialled, and a loopback one only from this host):
 *   listen given, specific host    -> advertise that host
 *   listen given, wildcard host    -> local_hostname if set explicitly, else
 *                                     the local address facing the master
 *                                     (kvp_net_source_for), else localhost
 *   no listen, local_hostname set  -> listen on and advertise local_hostname
 *   no listen, master on loopback  -> localhost (one machine)
 *   no listen, master elsewhere    -> listen on and advertise the address
 *                                     facing the master, port 0; this needs
 *                                     cluster_token and node_token (the
 *                                     segment is then open to the network),
 *                                     or insecure
 */
#include "node/node.h"

#include <errno.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/mem.h"
#include "common/prom.h"
#include "common/secret.h"
#include "common/ucx.h"
#include "ha/leader.h"
#include "kvpool.h"
#include "net/net.h"
#include "net/rpc.h"
#include "node/grants.h"
#include "node/nucx.h"
#include "node/segment.h"
#include "node/server.h"
#include "node/tier.h"
#include "node/unixsock.h"
#include "proto/proto.h"

#define MOD "node"
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000
#define BACKOFF_MAX_ETCD_MS 300 /* a cluster's master: each try asks etcd for the leader,
                                   and a takeover should be found within a try */
#define LINK_TIMEOUT_MS 3000  /* per master call, capped by rpc_timeout */
#define LINK_POLL_MS 100      /* how often an idle link looks at `stop` */

struct kvp_node {
    kvp_config cfg;
    kvp_segment *seg;
    kvp_segserver *srv;
    kvp_nucx *ucx;        /* the segment registered with UCX, NULL = no ucx transport */
    kvp_grants *grants;   /* descriptor checks; shared with srv */
    kvp_tier *tier;       /* the SSD tier, NULL = none */
    uint64_t seg_id, secret, client_id;
    uint32_t epoch;       /* mount attempts: the high half of generations */
    uint8_t session[KVP_SESSION_LEN]; /* from the master's HELLO: rejoin as client_id */
    uint64_t freed_notices; /* SEG_FREED entries applied (link thread) */
    uint64_t ack_want, ack_sent; /* SEG_FREED seq applied / acknowledged (link thread) */
    int remount;          /* the next mount follows an earlier one (link thread) */
    char name[320];       /* "HOST:PORT": segment name and tcp endpoint */
    char shm_addr[512];   /* "HOSTID:/path" */
    char unix_path[KVP_UNIXSOCK_PATH_MAX + 1];
    int link_timeout_ms;
    kvp_rpc *rpc;         /* link thread only (and start, before it runs) */
    uint64_t master_id;   /* last HELLO's */
    int mounted;          /* atomic */
    pthread_t th;
    int th_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;             /* under mu */
};

static char g_host_id[128];
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static void host_id_init(void)
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(g_host_id, sizeof g_host_id, f))
            g_host_id[strcspn(g_host_id, "\r\n")] = 0;
        fclose(f);
    }
    if (!g_host_id[0] && gethostname(g_host_id, sizeof g_host_id - 1) != 0)
        snprintf(g_host_id, sizeof g_host_id, "unknown-host");
    /* ':' separates the id from the path in the shm endpoint */
    for (char *p = g_host_id; *p; p++)
        if (*p == ':')
            *p = '_';
}

const char *kvp_node_host_id(void)
{
    pthread_once(&g_host_once, host_id_init);
    return g_host_id;
}

static uint64_t rand64(void)
{
    uint64_t v = 0;
    while (v == 0)
        if (getrandom(&v, sizeof v, 0) != sizeof v)
            v = kvp_now_ns() ^ ((uint64_t)getpid() << 32);
    return v;
}

/* Sleeps up to ms unless stopped. Returns 1 when stop was requested. */
static int nap(kvp_node *n, uint64_t ms)
{
    struct timespec ts = kvp_deadline_ms(ms);
    pthread_mutex_lock(&n->mu);
    while (!n->stop && pthread_cond_timedwait(&n->cv, &n->mu, &ts) != ETIMEDOUT)
        ;
    int s = n->stop;
    pthread_mutex_unlock(&n->mu);
    return s;
}

static int stopping(kvp_node *n)
{
    pthread_mutex_lock(&n->mu);
    int s = n->stop;
    pthread_mutex_unlock(&n->mu);
    return s;
}

static void set_mounted(kvp_node *n, int v) { __atomic_store_n(&n->mounted, v, __ATOMIC_RELEASE); }

static void link_drop(kvp_node *n)
{
    if (n->rpc) {
        kvp_rpc_close(n->rpc);
        n->rpc = NULL;
    }
    n->ack_want = n->ack_sent = 0;
    set_mounted(n, 0);
}

/* Applied SEG_FREED frames not yet acknowledged: stop their transfers
 * (barrier), then SEG_FREED_ACK. 0, or the connection's error (a barrier
 * that timed out is tried again on the next turn). */
static int link_ack(kvp_node *n)
{
    if (n->ack_want <= n->ack_sent || !n->rpc)
        return 0;
    if (kvp_segserver_revoke(n->srv, 0, LINK_POLL_MS) != 0)
        return 0;
    uint64_t v[2] = {n->seg_id, n->ack_want};
    kvp_msg_ids ids = {2, v};
    uint8_t body[32];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_enc_ids(&b, &ids);
    kvp_rpc_queue(n->rpc, KVP_OP_SEG_FREED_ACK, KVP_FLAG_ONEWAY, body, b.len);
    n->ack_sent = n->ack_want;
    return kvp_rpc_flush(n->rpc);
}

/* Before a mount that follows an earlier one: a new secret, and every
 * transfer in flight cut (see the top of the file). 0, or 1 when stopped. */
static int link_fence(kvp_node *n)
{
    n->ack_want = n->ack_sent = 0; /* the mount numbers its notices anew */
    n->secret = rand64();
    kvp_grants_rekey(n->grants, n->secret);
    while (kvp_segserver_revoke(n->srv, 1, 1000) != 0) {
        KVP_WARN(MOD, "segment server slow to stop its transfers before a remount");
        if (stopping(n))
            return 1;
    }
    return 0;
}

/* SEG_FREED from the master: revoke the freed allocations' descriptors. */
static void on_push(void *ctx, const kvp_frame_hdr *h, const uint8_t *body)
{
    kvp_node *n = ctx;
    if (h->op == KVP_OP_DISK_CMD && n->tier) {
        kvp_tier_command(n->tier, body, h->body_len);
        return;
    }
    if (h->op != KVP_OP_SEG_FREED)
        return;
    kvp_arena a;
    kvp_arena_init(&a, (size_t)h->body_len + 4096);
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    kvp_msg_seg_freed f;
    if (kvp_dec_seg_freed(body, h->body_len, &lim, &a, &f) == 0 && f.segment_id == n->seg_id) {
        for (uint32_t i = 0; i < f.n; i++)
            kvp_grants_freed(n->grants, f.freed[i].page, f.freed[i].pages, f.freed[i].generation,
                             (f.freed[i].flags & KVP_FREED_PUBLISHED) != 0);
        n->freed_notices += f.n;
        if (f.seq > n->ack_want)
            n->ack_want = f.seq; /* acknowledged after the barrier (link_ack) */
    }
    kvp_arena_free(&a);
}

/* A master that is not the one we knew holds none of our descriptors'
 * objects: a new secret invalidates every descriptor issued before. */
static void master_changed(kvp_node *n, uint64_t mid)
{
    if (n->master_id && mid != n->master_id) {
        KVP_INFO(MOD, "master %s restarted (id %016llx -> %016llx): remounting",
                 n->cfg.master_addr, (unsigned long long)n->master_id, (unsigned long long)mid);
        n->secret = rand64();
        kvp_grants_rekey(n->grants, n->secret);
    }
    n->master_id = mid;
}

/* Connects (HELLO). 0 or a negative code (message in err). */
static int link_open(kvp_node *n, char *err, size_t errlen)
{
    char nm[400];
    snprintf(nm, sizeof nm, "node %s", n->name);
    kvp_rpc_opts o = {.token = n->cfg.cluster_token,
                      .name = nm,
                      .client_id = n->client_id,
                      .timeout_ms = n->link_timeout_ms,
                      .node_token = n->cfg.node_token,
                      .tenant_token = n->cfg.tenant_token,
                      .session = n->session,
                      .on_push = on_push,
                      .push_ctx = n};
    uint64_t sent = kvp_now_ms();
    int rc = kvp_rpc_open(n->cfg.master_addr, &o, &n->rpc, err, errlen);
    if (rc == KVP_EAUTH && n->cfg.node_token[0]) {
        size_t k = strlen(err);
        snprintf(err + k, errlen - k, " (or the master has no node_token, or another one)");
    }
    if (rc == KVP_EILLEGAL_CLIENT) {
        /* our id is taken by someone without our session: be someone else
         * (the master drops what the old identity held at its TTL) */
        n->client_id = rand64();
        memset(n->session, 0, sizeof n->session);
    }
    if (rc) {
        n->rpc = NULL;
        return rc;
    }
    const kvp_msg_hello_resp *hr = kvp_rpc_hello_resp(n->rpc);
    kvp_grants_set_clock(n->grants, hr->now_ms, sent, kvp_now_ms());
    master_changed(n, hr->master_id);
    return 0;
}

/* MOUNT_SEGMENT. 0 or a negative code (message in err). */
static int link_mount(kvp_node *n, char *err, size_t errlen)
{
    kvp_bytes name = {(const uint8_t *)n->name, (uint32_t)strlen(n->name)};
    kvp_endpoint eps[3] = {{{(const uint8_t *)"tcp", 3}, name}};
    uint32_t neps = 1;
    if (n->unix_path[0])
        eps[neps++] = (kvp_endpoint){{(const uint8_t *)"shm", 3},
                                     {(const uint8_t *)n->shm_addr, (uint32_t)strlen(n->shm_addr)}};
    if (n->ucx) /* set up over the tcp endpoint's connection (UCX_ATTACH) */
        eps[neps++] = (kvp_endpoint){{(const uint8_t *)"ucx", 3}, name};
    /* a master that still holds the segment keeps its epoch; a fresh mount
     * takes this one, above every earlier, so its generations are too */
    kvp_seg_desc d = {n->seg_id, name, kvp_segment_size(n->seg), neps, eps, n->secret,
                      ++n->epoch, n->tier ? kvp_tier_capacity(n->tier) : 0};
    kvp_msg_mount m = {1, &d};
    uint8_t body[2048];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_enc_mount(&b, &m);
    if (b.err) {
        snprintf(err, errlen, "mount request too large");
        return KVP_EINVALID_PARAMS;
    }
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    int rc = kvp_rpc_call(n->rpc, KVP_OP_MOUNT_SEGMENT, body, b.len, &st, &resp, &rl);
    if (rc) {
        snprintf(err, errlen, "MOUNT_SEGMENT: %s", kvp_strerror(rc));
        return rc;
    }
    if (st) {
        snprintf(err, errlen, "MOUNT_SEGMENT refused: %s%s", kvp_strerror(st),
                 st == KVP_EILLEGAL_CLIENT && !n->cfg.node_token[0]
                     ? " (the master allows only holders of its node credential to mount: set "
                       "node_token, node_token_file or $KVPOOL_NODE_TOKEN, to the master's)"
                     : "");
        return st;
    }
    kvp_arena a;
    kvp_arena_init(&a, 4096);
    kvp_msg_results r;
    kvp_proto_limits lim;
    kvp_proto_limits_default(&lim);
    rc = kvp_dec_results(resp, rl, &lim, &a, &r);
    if (rc == 0)
        rc = r.n == 1 ? r.codes[0] : KVP_EPROTOCOL;
    kvp_arena_free(&a);
    if (rc == KVP_ENOT_SUPPORTED && n->ucx) {
        kvp_segserver_ucx_open(n->srv, 0);
        snprintf(err, errlen, "MOUNT_SEGMENT refused: the master protects tenants "
                              "(tenant_tokens_file) and a ucx node's remote key would expose "
                              "every tenant's bytes; use protocol tcp, or set key "
                              "\"ucx_insecure\" on the master to accept that");
        return rc;
    }
    if (rc) {
        snprintf(err, errlen, "MOUNT_SEGMENT: %s", kvp_strerror(rc));
        return rc;
    }
    if (n->ucx) /* a master accepted the ucx endpoint: the rkey may go out */
        kvp_segserver_ucx_open(n->srv, 1);
    set_mounted(n, 1);
    n->remount = 1;
    KVP_INFO(MOD, "segment %016llx (%s, %llu MiB) mounted at master %s",
             (unsigned long long)n->seg_id, n->name,
             (unsigned long long)(kvp_segment_size(n->seg) >> 20), n->cfg.master_addr);
    if (n->tier) { /* what the disk holds, for a master that may not know it */
        uint64_t k = kvp_tier_register(n->tier);
        if (k)
            KVP_INFO(MOD, "%llu SSD tier records reported to master %s", (unsigned long long)k,
                     n->cfg.master_addr);
    }
    return 0;
}

static int report_send(void *ctx, const uint8_t *body, size_t len)
{
    kvp_node *n = ctx;
    kvp_rpc_queue(n->rpc, KVP_OP_DISK_REPORT, KVP_FLAG_ONEWAY, body, len);
    return 0;
}

/* Sends the SSD tier's waiting reports (mounted only: they name the
 * segment). 0 or the connection's error. */
static int link_reports(kvp_node *n)
{
    if (!n->tier || !n->rpc || !__atomic_load_n(&n->mounted, __ATOMIC_ACQUIRE))
        return 0;
    kvp_tier_take(n->tier, report_send, n);
    return kvp_rpc_flush(n->rpc);
}

/* HEARTBEAT. 0 fine, 1 remount needed, < 0 connection trouble. */
static int link_heartbeat(kvp_node *n)
{
    int32_t st;
    const uint8_t *resp;
    uint32_t rl;
    uint64_t sent = kvp_now_ms();
    int rc = kvp_rpc_call(n->rpc, KVP_OP_HEARTBEAT, NULL, 0, &st, &resp, &rl);
    if (rc)
        return rc;
    if (st)
        return st;
    kvp_msg_heartbeat_resp h;
    if (kvp_dec_heartbeat_resp(resp, rl, &h) != 0)
        return KVP_EPROTOCOL;
    kvp_grants_set_clock(n->grants, h.now_ms, sent, kvp_now_ms());
    if (h.master_id != n->master_id || h.n_segments == 0) {
        KVP_WARN(MOD, "master %s no longer holds segment %016llx: remounting",
                 n->cfg.master_addr, (unsigned long long)n->seg_id);
        master_changed(n, h.master_id);
        set_mounted(n, 0);
        return 1;
    }
    return 0;
}

static void link_unmount(kvp_node *n)
{
    if (!n->rpc || !__atomic_load_n(&n->mounted, __ATOMIC_ACQUIRE))
        return;
    uint8_t body[16];
    kvp_buf b = {body, 0, sizeof body, sizeof body, 0};
    kvp_msg_ids ids = {1, &n->seg_id};
    kvp_enc_ids(&b, &ids);
    int32_t st;
    int rc = kvp_rpc_call(n->rpc, KVP_OP_UNMOUNT_SEGMENT, body, b.len, &st, NULL, NULL);
    if (rc || st)
        KVP_WARN(MOD, "unmount of segment %016llx: %s", (unsigned long long)n->seg_id,
                 kvp_strerror(rc ? rc : st));
    else
        KVP_INFO(MOD, "segment %016llx unmounted", (unsigned long long)n->seg_id);
    set_mounted(n, 0);
}

/* Connected and idle for ms: serves the master's SEG_FREED notices and
 * DISK_CMDs as they come, and sends the SSD tier's reports as they appear.
 * 1 stop requested, 0 time is up, < 0 the connection broke. */
static int link_wait(kvp_node *n, uint64_t ms)
{
    uint64_t end = kvp_now_ms() + ms;
    for (;;) {
        if (stopping(n))
            return 1;
        int rc = link_reports(n);
        if (rc)
            return rc;
        uint64_t now = kvp_now_ms();
        rc = link_ack(n);
        if (rc)
            return rc;
        if (now >= end)
            return 0;
        uint64_t slice = end - now < LINK_POLL_MS ? end - now : LINK_POLL_MS;
        /* the master's frames or the tier's reports, whichever comes; back
         * at once after frames, so SEG_FREED is acknowledged without delay
         * (the master's space waits for it) */
        struct pollfd p[2] = {{kvp_rpc_fd(n->rpc), POLLIN, 0},
                              {n->tier ? kvp_tier_wake_fd(n->tier) : -1, POLLIN, 0}};
        int k = poll(p, n->tier ? 2 : 1, (int)slice);
        rc = k > 0 && p[0].revents ? kvp_rpc_poll(n->rpc, 1) : kvp_rpc_poll(n->rpc, 0);
        if (rc)
            return rc;
    }
}

static void *link_main(void *arg)
{
    kvp_node *n = arg;
    uint64_t backoff = BACKOFF_MIN_MS;
    const uint64_t cap = kvp_etcd_is_url(n->cfg.master_addr) ? BACKOFF_MAX_ETCD_MS : BACKOFF_MAX_MS;
    int warned = 0;
    char err[512];
    while (!stopping(n)) {
        if (!n->rpc) {
            if (link_open(n, err, sizeof err) != 0) {
                if (!warned++)
                    KVP_WARN(MOD, "master %s: %s (retrying)", n->cfg.master_addr, err);
                if (nap(n, backoff))
                    break;
                backoff = backoff * 2 > cap ? cap : backoff * 2;
                continue;
            }
        }
        if (!__atomic_load_n(&n->mounted, __ATOMIC_ACQUIRE)) {
            if (n->remount && link_fence(n))
                break;
            if (link_mount(n, err, sizeof err) != 0) {
                KVP_WARN(MOD, "%s (retrying)", err);
                link_drop(n);
                if (nap(n, backoff))
                    break;
                backoff = backoff * 2 > cap ? cap : backoff * 2;
                continue;
            }
            backoff = BACKOFF_MIN_MS;
            warned = 0;
        }
        uint32_t ttl = kvp_rpc_hello_resp(n->rpc)->client_ttl_ms;
        if (ttl == 0)
            ttl = (uint32_t)n->cfg.client_ttl_ms;
        int rc = link_wait(n, ttl / 3 ? ttl / 3 : 1);
        if (rc == 1)
            break;
        if (rc == 0)
            rc = link_heartbeat(n);
        if (rc < 0) {
            KVP_WARN(MOD, "master %s: heartbeat: %s; reconnecting", n->cfg.master_addr,
                     kvp_strerror(rc));
            link_drop(n);
        }
    }
    link_unmount(n);
    link_drop(n);
    return NULL;
}

static int wildcard_host(const char *h)
{
    return !h[0] || !strcmp(h, "0.0.0.0") || !strcmp(h, "::");
}

/* "HOST:PORT", with brackets for an IPv6 host. */
static void join_addr(char *out, size_t len, const char *host, unsigned port)
{
    if (strchr(host, ':'))
        snprintf(out, len, "[%s]:%u", host, port);
    else
        snprintf(out, len, "%s:%u", host, port);
}

/* The segment server's listen address and the host advertised to clients
 * (the table at the top of the file). 0, or a negative code with err. */
static int node_addr(const kvp_node_opts *o, char *listen, size_t llen, char *host, size_t hlen,
                     char *err, size_t errlen)
{
    const kvp_config *cfg = o->cfg;
    int named = kvp_config_was_set(cfg, "local_hostname");
    char lhost[256], src[64];
    uint16_t lport;
    if (o->listen && *o->listen) {
        snprintf(listen, llen, "%s", o->listen);
        if (kvp_net_split(listen, lhost, sizeof lhost, &lport) != 0) {
            snprintf(err, errlen, "bad listen address \"%s\" (expected HOST:PORT)", listen);
            return KVP_EINVALID_PARAMS;
        }
        if (!wildcard_host(lhost))
            snprintf(host, hlen, "%s", lhost);
        else if (named || !cfg->master_addr[0])
            snprintf(host, hlen, "%s", cfg->local_hostname);
        else {
            char e[256];
            char dial[KVP_LEADER_ADDR_MAX + 1];
            int rc = kvp_leader_resolve(cfg->master_addr, dial, sizeof dial, NULL, e, sizeof e);
            if (rc == 0)
                rc = kvp_net_source_for(dial, host, hlen, e, sizeof e);
            if (rc) {
                snprintf(err, errlen, "listening on %s: cannot tell which address clients "
                         "should dial (%s); set local_hostname", listen, e);
                return rc;
            }
        }
        return 0;
    }
    snprintf(host, hlen, "%s", cfg->local_hostname);
    join_addr(listen, llen, cfg->local_hostname, 0);
    if (named || !cfg->master_addr[0])
        return 0;
    char e[256], dial[KVP_LEADER_ADDR_MAX + 1];
    int rc = kvp_leader_resolve(cfg->master_addr, dial, sizeof dial, NULL, e, sizeof e);
    if (rc == 0)
        rc = kvp_net_source_for(dial, src, sizeof src, e, sizeof e);
    if (rc) {
        snprintf(err, errlen, "master %s: %s", cfg->master_addr, e);
        return rc;
    }
    if (kvp_net_is_loopback(src))
        return 0; /* the master is on this machine, over loopback */
    int ct = cfg->cluster_token[0] != 0, nt = cfg->node_token[0] != 0;
    if (!cfg->insecure && (!ct || !nt)) {
        snprintf(err, errlen,
                 "the master %s is on another host, so this storage node would listen on %s, "
                 "reachable from other machines, and it has no %s: set %s%s%s "
                 "(docs/SECURITY.md), or choose the address with --listen, or pass --insecure",
                 cfg->master_addr, src,
                 !ct && !nt ? "cluster token and no node token" : !ct ? "cluster token" : "node token",
                 ct ? "" : "cluster_token (cluster_token_file or $KVPOOL_CLUSTER_TOKEN)",
                 !ct && !nt ? " and " : "",
                 nt ? "" : "node_token (node_token_file or $KVPOOL_NODE_TOKEN)");
        return KVP_ECONFIG;
    }
    snprintf(host, hlen, "%s", src);
    join_addr(listen, llen, src, 0);
    return 0;
}

/*
 * The segment server on a port of segment_port_min..segment_port_max (the
 * node was given no listen address; `listen` is node_addr's "HOST:0"): the
 * ports are tried in order from a random one, wrapping, until one binds, so
 * concurrent nodes spread over the range and a free port is always found.
 * 0, or the last port's error.
 */
static int segserver_start_ranged(kvp_node *n, kvp_segserver_opts *so,
                                  const kvp_segserver_limits *lim, const char *listen,
                                  char *err, size_t errlen)
{
    char host[256], addr[300];
    uint16_t unused;
    if (kvp_net_split(listen, host, sizeof host, &unused) != 0) {
        snprintf(err, errlen, "bad listen address \"%s\"", listen);
        return KVP_EINVALID_PARAMS;
    }
    uint64_t lo = n->cfg.segment_port_min, span = n->cfg.segment_port_max - lo + 1;
    uint64_t first = rand64() % span;
    int rc = KVP_EIO;
    for (uint64_t i = 0; i < span; i++) {
        join_addr(addr, sizeof addr, host, (unsigned)(lo + (first + i) % span));
        so->listen = addr;
        rc = kvp_segserver_start_lim(n->seg, so, lim, &n->srv, err, errlen);
        if (rc != KVP_EIO) /* bound, or an error another port cannot cure */
            break;
    }
    so->listen = NULL;
    if (rc == KVP_EIO) {
        char m[KVP_CONFIG_ERRLEN];
        snprintf(m, sizeof m, "%s", err);
        snprintf(err, errlen, "no free port in segment_port_min..segment_port_max "
                 "(%llu..%llu); last: %s", (unsigned long long)lo,
                 (unsigned long long)n->cfg.segment_port_max, m);
    }
    return rc;
}

/* segment_prefault: "auto" is background on a storage node (its memory is
 * the operator's promise: find an overcommitted machine at start), off in
 * an embedded client (the application's memory: it costs only what the pool
 * puts there, and a short-lived client never pays for the rest). */
static kvp_segment_prefault_mode prefault_mode(const char *v, int standalone)
{
    if (!strcmp(v, "sync"))
        return KVP_PREFAULT_SYNC;
    if (!strcmp(v, "off"))
        return KVP_PREFAULT_OFF;
    if (!strcmp(v, "background"))
        return KVP_PREFAULT_BACKGROUND;
    return standalone ? KVP_PREFAULT_BACKGROUND : KVP_PREFAULT_OFF;
}

/* protocol "ucx" or "rdma": registers the segment with UCX for one-sided
 * transfers (node/nucx.h), UCX bound to the network device of the node's
 * listen address (kvp_ucx_net_devices): with no credential that is loopback
 * only, like the node's own listener. Without UCX the node still serves shm
 * and tcp, and says why once. */
static void start_ucx(kvp_node *n, const kvp_config *cfg, const char *listen)
{
    if (strcmp(cfg->protocol, "ucx") != 0 && strcmp(cfg->protocol, "rdma") != 0)
        return;
    char why[256], host[256], dev[IF_NAMESIZE + 1];
    uint16_t port;
    int rc = kvp_net_split(listen, host, sizeof host, &port) != 0 ? KVP_ECONFIG : 0;
    if (rc)
        snprintf(why, sizeof why, "bad listen address %.200s", listen);
    else
        rc = kvp_ucx_net_devices(host, !cfg->cluster_token[0] && !cfg->insecure, dev,
                                 sizeof dev, why, sizeof why);
    if (!rc) {
        if (dev[0])
            KVP_INFO(MOD, "protocol %s: UCX limited to network device %s (listen %s)",
                     cfg->protocol, dev, listen);
        rc = kvp_nucx_start(kvp_segment_base(n->seg), kvp_segment_size(n->seg), dev, &n->ucx,
                            why, sizeof why);
    }
    if (rc) {
        n->ucx = NULL;
        KVP_WARN(MOD, "protocol %s: no UCX transport (%s); clients use shm and tcp",
                 cfg->protocol, why);
    } else {
        KVP_INFO(MOD, "protocol %s: segment registered with UCX", cfg->protocol);
    }
}

int kvp_node_start(const kvp_node_opts *o, kvp_node **out, char *err, size_t errlen)
{
    if (!o || !o->cfg) {
        snprintf(err, errlen, "node: no configuration");
        return KVP_EINVALID_PARAMS;
    }
    const kvp_config *cfg = o->cfg;
    if (cfg->global_segment_size < 4096) {
        snprintf(err, errlen, "global_segment_size %llu is too small (at least 4 KiB)",
                 (unsigned long long)cfg->global_segment_size);
        return KVP_EINVALID_PARAMS;
    }
    kvp_node *n = kvp_calloc(1, sizeof *n);
    if (!n) {
        snprintf(err, errlen, "out of memory");
        return KVP_ENOMEM;
    }
    n->cfg = *cfg;
    n->seg_id = rand64();
    n->secret = rand64();
    n->client_id = rand64();
    n->link_timeout_ms = cfg->rpc_timeout_ms < LINK_TIMEOUT_MS ? (int)cfg->rpc_timeout_ms
                                                               : LINK_TIMEOUT_MS;
    pthread_mutex_init(&n->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->cv, &ca);
    pthread_condattr_destroy(&ca);

    char listen[300], host[256];
    int rc = node_addr(o, listen, sizeof listen, host, sizeof host, err, errlen);
    if (rc)
        goto fail;
    kvp_unixsock_access ua;
    char dir[4096], sock[64];
    snprintf(sock, sizeof sock, KVP_UNIXSOCK_PREFIX "%016llx.sock", (unsigned long long)n->seg_id);
    rc = kvp_unixsock_group_parse(cfg->shm_group, &ua, err, errlen);
    if (!rc)
        rc = kvp_unixsock_rundir(o->unix_dir, &ua, sock, dir, sizeof dir, err, errlen);
    if (rc)
        goto fail;
    if (snprintf(n->unix_path, sizeof n->unix_path, "%s/%s", dir, sock) >=
        (int)sizeof n->unix_path) { /* kvp_unixsock_rundir checked it fits */
        snprintf(err, errlen, "unix socket path too long");
        rc = KVP_EINTERNAL_ERROR;
        goto fail;
    }
    kvp_unixsock_sweep(dir); /* sockets of nodes killed without a clean stop */
    char nm[32];
    snprintf(nm, sizeof nm, "kvpool-%016llx", (unsigned long long)n->seg_id);
    rc = kvp_secret_listen_check(listen, cfg->cluster_token[0], cfg->insecure,
                                 "the storage node", err, errlen);
    if (rc)
        goto fail;
    if (cfg->master_addr[0] && !o->master_optional) {
        /* before the segment is faulted in (seconds for a large one): a
         * master that is not there is said at once */
        char dial[KVP_LEADER_ADDR_MAX + 1];
        int fd = kvp_leader_resolve(cfg->master_addr, dial, sizeof dial, NULL, err, errlen);
        if (fd == 0)
            fd = kvp_net_connect(dial, n->link_timeout_ms, err, errlen);
        if (fd < 0) {
            rc = fd;
            goto fail;
        }
        close(fd);
    }
    rc = kvp_segment_create(cfg->global_segment_size, nm, &n->seg, err, errlen);
    if (rc)
        goto fail;
    if (cfg->enable_offload && (cfg->offload_dir[0] || o->standalone)) {
        rc = kvp_tier_open(cfg, n->seg, n->seg_id, &n->tier, err, errlen);
        if (rc)
            goto fail;
    }
    rc = kvp_grants_create(kvp_segment_size(n->seg), n->secret, &n->grants);
    if (rc) {
        snprintf(err, errlen, "out of memory (descriptor table)");
        goto fail;
    }
    /* sync: faulted in before the server starts; background: behind it,
     * started once the node's threads are (see below) */
    kvp_segment_prefault_mode pmode = prefault_mode(cfg->segment_prefault, o->standalone);
    if (pmode == KVP_PREFAULT_SYNC)
        kvp_segment_prefault(n->seg, pmode);
    start_ucx(n, cfg, listen);
    kvp_segserver_opts so = {listen, n->unix_path, o->io_threads > 0 ? o->io_threads : 2,
                             cfg->cluster_token, n->seg_id, n->grants, ua, NULL, 0};
    if (n->ucx)
        so.ucx_attach = kvp_nucx_attach_body(n->ucx, &so.ucx_attach_len);
    kvp_segserver_limits lim = {(int)cfg->node_max_connections,
                                (int)(cfg->node_max_connections / 4),
                                (uint32_t)cfg->hello_timeout_ms, (uint32_t)cfg->idle_timeout_ms,
                                (uint32_t)cfg->stall_timeout_ms, cfg->min_transfer_rate, 0};
    if (!(o->listen && *o->listen) && cfg->segment_port_min)
        rc = segserver_start_ranged(n, &so, &lim, listen, err, errlen);
    else
        rc = kvp_segserver_start_lim(n->seg, &so, &lim, &n->srv, err, errlen);
    if (rc) {
        n->srv = NULL;
        goto fail;
    }
    join_addr(n->name, sizeof n->name, host, kvp_segserver_port(n->srv));
    snprintf(n->shm_addr, sizeof n->shm_addr, "%s:%s", kvp_node_host_id(), n->unix_path);

    if (!cfg->master_addr[0]) {
        if (!o->master_optional) {
            snprintf(err, errlen, "no master address configured");
            rc = KVP_EINVALID_PARAMS;
            goto fail;
        }
    } else {
        if (!o->master_optional) {
            rc = link_open(n, err, errlen);
            if (!rc)
                rc = link_mount(n, err, errlen);
            if (rc)
                goto fail;
        }
        if (pthread_create(&n->th, NULL, link_main, n) != 0) {
            snprintf(err, errlen, "cannot start the master link thread");
            rc = KVP_EIO;
            goto fail;
        }
        n->th_started = 1;
    }
    /* last: thread stacks are mmaps, which wait for each of its madvise
     * calls (segment.h), so the node's threads are made before it runs */
    if (pmode == KVP_PREFAULT_BACKGROUND)
        kvp_segment_prefault(n->seg, pmode);
    *out = n;
    return 0;
fail:
    kvp_node_stop(n);
    return rc;
}

void kvp_node_stop(kvp_node *n)
{
    if (!n)
        return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    if (n->th_started)
        pthread_join(n->th, NULL);
    else
        link_unmount(n);
    link_drop(n);
    kvp_tier_close(n->tier); /* before the segment: loads write into it */
    kvp_segserver_stop(n->srv);
    kvp_nucx_stop(n->ucx); /* after the server: it hands out the attach body */
    kvp_grants_destroy(n->grants);
    kvp_segment_destroy(n->seg);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    kvp_free(n);
}

uint64_t kvp_node_segment_id(const kvp_node *n) { return n->seg_id; }
uint16_t kvp_node_port(const kvp_node *n) { return n->srv ? kvp_segserver_port(n->srv) : 0; }
const char *kvp_node_name(const kvp_node *n) { return n->name; }
int kvp_node_mounted(const kvp_node *n) { return __atomic_load_n(&n->mounted, __ATOMIC_ACQUIRE); }

/* One sample family with no labels. */
static void metric(kvp_buf *b, const char *name, const char *type, const char *help, uint64_t v)
{
    kvp_prom_family(b, name, type, help);
    kvp_prom_u64(b, name, NULL, v);
}

void kvp_node_write_metrics(kvp_node *n, kvp_buf *b)
{
    char l[400] = "";
    kvp_prom_family(b, "kvpool_node_info", "gauge", "This storage node's segment (HOST:PORT).");
    kvp_prom_label(l, sizeof l, "segment", n->name, strlen(n->name));
    kvp_prom_u64(b, "kvpool_node_info", l, 1);
    metric(b, "kvpool_node_mounted", "gauge", "1 while the master holds this node's mount.",
           (uint64_t)kvp_node_mounted(n));
    metric(b, "kvpool_node_segment_bytes", "gauge", "The segment's size.",
           kvp_segment_size(n->seg));
    metric(b, "kvpool_node_segment_faulted_bytes", "gauge",
           "Bytes of the segment faulted in so far.", kvp_segment_faulted(n->seg));
    kvp_segserver_stats ss;
    kvp_segserver_stats_get(n->srv, &ss);
    metric(b, "kvpool_node_connections", "gauge", "Open connections to the segment server.",
           ss.conns);
    static const char *const refused[] = {"max_connections", "evicted", "peer_credentials"};
    uint64_t rv[] = {ss.refused_full, ss.evicted, ss.peer_refused};
    kvp_prom_family(b, "kvpool_node_connections_refused_total", "counter",
                    "Connections refused at accept, by reason.");
    for (int i = 0; i < 3; i++) {
        char rl[64] = "";
        kvp_prom_label(rl, sizeof rl, "reason", refused[i], strlen(refused[i]));
        kvp_prom_u64(b, "kvpool_node_connections_refused_total", rl, rv[i]);
    }
    static const char *const closed[] = {"hello_timeout", "idle_timeout", "stall_timeout",
                                         "revoked",       "expired",      "slow"};
    uint64_t cv[] = {ss.hello_timeouts, ss.idle_timeouts, ss.stall_timeouts,
                     ss.cut_revoked,    ss.cut_expired,   ss.cut_slow};
    kvp_prom_family(b, "kvpool_node_connections_closed_total", "counter",
                    "Connections the segment server closed, by reason.");
    for (int i = 0; i < 6; i++) {
        char rl[64] = "";
        kvp_prom_label(rl, sizeof rl, "reason", closed[i], strlen(closed[i]));
        kvp_prom_u64(b, "kvpool_node_connections_closed_total", rl, cv[i]);
    }
    metric(b, "kvpool_node_accept_pauses_total", "counter",
           "Listener pauses for want of file descriptors.", ss.accept_pauses);
    kvp_disk_stats ds = {0};
    kvp_tier_stats ts = {0};
    if (n->tier) {
        kvp_tier_disk_stats(n->tier, &ds);
        kvp_tier_get_stats(n->tier, &ts);
    }
    kvp_prom_family(b, "kvpool_node_transfer_bytes_total", "counter",
                    "Value bytes this node moved, by path (tcp and unix: the segment server; "
                    "disk: the SSD tier) and direction.");
    static const char *const paths[] = {"tcp", "unix"};
    for (int p = 0; p < 2; p++)
        for (int d = 0; d < 2; d++) {
            char pl[64] = "";
            kvp_prom_label(pl, sizeof pl, "path", paths[p], strlen(paths[p]));
            kvp_prom_label(pl, sizeof pl, "dir", d ? "write" : "read", d ? 5 : 4);
            kvp_prom_u64(b, "kvpool_node_transfer_bytes_total", pl, ss.moved[p][d]);
        }
    kvp_prom_u64(b, "kvpool_node_transfer_bytes_total", "path=\"disk\",dir=\"read\"",
                 ds.read_bytes);
    kvp_prom_u64(b, "kvpool_node_transfer_bytes_total", "path=\"disk\",dir=\"write\"",
                 ds.write_bytes);
    metric(b, "kvpool_node_disk_capacity_bytes", "gauge", "The SSD tier's capacity (0 = none).",
           ds.capacity);
    metric(b, "kvpool_node_disk_used_bytes", "gauge", "Bytes of the SSD tier's page files.",
           ds.used);
    metric(b, "kvpool_node_disk_live_bytes", "gauge", "Bytes of the live records.",
           ds.live_bytes);
    metric(b, "kvpool_node_disk_records", "gauge", "Live records on the SSD tier.", ds.records);
    metric(b, "kvpool_node_disk_writes_total", "counter", "Records written.", ds.writes);
    metric(b, "kvpool_node_disk_write_errors_total", "counter", "Writes that failed.",
           ds.write_errors);
    metric(b, "kvpool_node_disk_pressure_total", "counter",
           "Writes refused with -200 (staging or disk full).", ds.pressure);
    metric(b, "kvpool_node_disk_reads_total", "counter", "Records read.", ds.reads);
    metric(b, "kvpool_node_disk_read_misses_total", "counter", "Reads of records not there.",
           ds.read_misses);
    metric(b, "kvpool_node_disk_corrupt_total", "counter", "Records found corrupt.", ds.corrupt);
    metric(b, "kvpool_node_disk_dropped_records_total", "counter", "Records dropped for room.",
           ds.dropped_records);
    metric(b, "kvpool_node_disk_compacted_bytes_total", "counter", "Bytes compaction moved.",
           ds.compacted_bytes);
    metric(b, "kvpool_node_spills_total", "counter", "Spills done for the master.", ts.spills);
    metric(b, "kvpool_node_spill_failures_total", "counter", "Spills that failed.",
           ts.spill_fails);
    metric(b, "kvpool_node_loads_total", "counter", "Loads back into DRAM done.", ts.loads);
    metric(b, "kvpool_node_load_failures_total", "counter", "Loads that failed.", ts.load_fails);
}
