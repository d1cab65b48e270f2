/*
 * bench_ha.c -- `kvpool bench ha`: what a cluster of masters costs and what
 * a failover looks like, against real processes on loopback, in one run.
 *
 * It starts its own etcd (loopback, free ports, a temp data dir; skipped,
 * exit status 0, when no etcd binary is installed) and, as children of this
 * binary (/proc/self/exe), two setups side by side:
 *   single   one `kvpool master` (no etcd) and one `kvpool store` node;
 *   cluster  two `kvpool master --etcd ... --cluster bench-ha` (a leader and
 *            a standby following its index, ha_sync as configured: on by
 *            default) and one `kvpool store --master etcd://.../bench-ha`.
 * Each node has a 1 GiB segment; the bench's clients use the public API
 * (kvpool.h) in standalone-store mode, so on this host they move bytes
 * through shared memory, as an engine beside its node would.
 *
 * Measured:
 *   (a) batch put and get (kvp_client_batch_put_from_multi_buffers /
 *       _get_into_multi_buffers) of 4 KiB x 256 (bound by the master's
 *       work per key), 64 KiB x 64 and 1 MiB x 16 values,
 *       --ops keys per shape and setup: keys/s and GB/s (10^9 B/s) from the
 *       summed batch times, the median batch time; at least MIN_ROUNDS
 *       batches per cell. Round r of both setups runs back to back (single
 *       first in even rounds, cluster first in odd ones) so that other load
 *       on the machine falls on both alike. Every batch is read back and
 *       compared byte for byte (untimed), then removed (untimed). Ratio
 *       cluster / single per shape and direction: the median of the rounds'
 *       ratios (batch time single / batch time cluster), which a burst of
 *       other load disturbs least; goal >= 0.9. The ratio of the totals is
 *       reported beside it.
 *   (b) --failovers times (default 3): publish --objects 64 KiB objects
 *       (default 1000; every put acknowledged), kill -9 the leader, then
 *       measure from the kill: when etcd names a new leader, when that
 *       leader counts the node's segment mounted again, the first put
 *       of a fresh key that succeeds, the first get of an object published
 *       before the kill that succeeds (bytes compared); then every object
 *       published so far (all rounds) is read back and compared, retried
 *       until the new leader has no parked object left or 20 s + 2 TTL after
 *       the kill: objects missing or wrong now that were fine before are
 *       what that failover lost. A fresh standby is then started (the
 *       killed master's replacement) and timed until the leader counts it in
 *       sync; the replication bytes of its snapshot are recorded.
 *   (c) replication: the leader's repl_bytes counter (bytes it sent to its
 *       standbys) over the timed put batches of (a) and over each publish of
 *       (b), per put and per million puts; repl_lag (journal records the
 *       slowest standby had not acknowledged) sampled every 20 ms by a
 *       second client while the cluster is loaded, its largest value; the
 *       bytes per removal (the untimed removals of (a)); and --index-objects
 *       4 KiB objects (default 200000) put through the cluster with the
 *       leader's and the standby's VmRSS read before and after: resident
 *       bytes per object on each (then removed again).
 * Keys are 100 bytes, as in `kvpool bench master`.
 *
 * --json: JSON on stdout, the text on stderr. Every process logs (level
 * info) into the temp dir; warnings and errors found there are listed at
 * the end (--keep-logs keeps the dir). Exit status 1 when a setup could not
 * start, a cell failed, a failover did not recover, or an acknowledged
 * object was lost or read back wrong; a ratio under its goal is reported,
 * not an error.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "common/clock.h"
#include "common/config.h"
#include "common/log.h"
#include "common/mem.h"
#include "ha/leader.h"
#include "kvpool.h"
#include "net/net.h"

#define CLUSTER "bench-ha"
#define SEGMENT_SIZE "1GiB"
#define KEYLEN 100
#define MAX_VALUES 256
#define BUF_BYTES ((size_t)16 << 20)
#define FO_SIZE ((size_t)64 << 10) /* the failover objects */
#define FO_BATCH 64
#define MAX_MASTERS 16             /* every master a run starts, dead ones included */
#define MAX_FAILOVERS 10
#define STAT_CAP (256u << 10)
#define SAMPLE_MS 20
#define MIN_ROUNDS 64 /* batches per cell at least */

typedef struct shape {
    const char *name, *title;
    uint32_t n;
    size_t size;
} shape;

static const shape shapes[] = {
    {"4KiB", "4 KiB x 256", 256, (size_t)4 << 10},
    {"64KiB", "64 KiB x 64", 64, (size_t)64 << 10},
    {"1MiB", "1 MiB x 16", 16, (size_t)1 << 20},
};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

enum { SET_SINGLE, SET_CLUSTER, NSETS };
static const char *const set_id[NSETS] = {"single", "cluster"};

typedef struct proc {
    pid_t pid;     /* 0: not running */
    char addr[64]; /* 127.0.0.1:PORT (masters) */
    char log[320];
    int status;    /* how it ended: exit code, 128 + signal; -1 still running / never */
    int on_own;    /* it had exited before we stopped it */
    int killed;    /* kill -9 on purpose (a failover) */
} proc;

typedef struct cell {
    int ok;
    uint64_t keys, rounds;
    uint64_t put_ns, get_ns; /* summed batch times */
    uint64_t *put_lat, *get_lat;
    double put_kops, get_kops, put_gbps, get_gbps, put_p50_us, get_p50_us;
    char why[192];
} cell;

typedef struct fo {
    int ok;
    long long takeover_ms, remount_ms, put_ms, get_ms, verified_ms, resync_ms;
    uint64_t published, checked, missing, wrong, lost, newly_wrong;
    long long adopted, adopt_dropped;
    uint64_t pub_repl_bytes, snapshot_bytes, snapshot_objects;
    char old_leader[64], new_leader[64];
    char why[192];
} fo;

typedef struct sampler {
    pthread_t th;
    int started;
    volatile int stop, active;
    kvp_client *c;
    long long lag_max;
    uint64_t samples;
    char *buf;
} sampler;

typedef struct hb {
    FILE *out;
    int json, keep;
    kvp_config cfg;
    uint64_t ops, nobj;
    int nfo;
    char dir[256];
    char etcd_bin[256];
    proc etcd, single, snode, hnode;
    proc m[MAX_MASTERS];
    int nm;
    char etcd_addr[64], url[160], flag[160];
    kvp_client *c[NSETS];
    char transport[NSETS][16];
    uint8_t *src, *dst;
    unsigned long long nonce, seq;
    char keybuf[MAX_VALUES][KEYLEN + 1];
    const char *keys[MAX_VALUES];
    char *statbuf;
    cell cells[NSETS][NSHAPES];
    double paired[NSHAPES][2]; /* cluster/single: median of the rounds' ratios; -1 none */
    uint64_t repl_put_bytes, repl_puts;
    long long lag_after_put_max;
    uint64_t repl_del_bytes, repl_dels; /* removals of (a), untimed */
    uint64_t nidx;                      /* index-memory objects (0 = skip) */
    struct {
        int ok;
        uint64_t objects;
        double leader_bytes, standby_bytes; /* RSS growth per object */
        double put_bytes, del_bytes;        /* repl_bytes per put / per removal */
        char why[192];
    } mem;
    sampler smp;
    fo fos[MAX_FAILOVERS];
    int nfo_done;
    uint64_t fo_published; /* failover objects put so far (indices 0..) */
    uint8_t *good;         /* per failover object: 1 read back right at the last check */
    char setup_why[256];
} hb;

/* ------------------------------------------------------------ processes */

static int log_fd = -1;

static void sink_fn(void *ctx, const kvp_log_record *r)
{
    (void)ctx;
    if (log_fd >= 0 && write(log_fd, r->line, r->line_len) < 0) {
        /* nowhere else to say it */
    }
}
static const kvp_log_sink bench_sink = {sink_fn, NULL};

/* Forks and execs exe with argv, stdin from /dev/null, stdout and stderr
 * appended to log; the child gets SIGTERM if we die. Only async-signal-safe
 * calls between fork and exec (the parent has threads). */
static pid_t spawn(const char *exe, const char *const *argv, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int in = open("/dev/null", O_RDONLY);
        int lf = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (in >= 0)
            dup2(in, 0);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
        }
        execv(exe, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Exit status of pid within ms (its code, 128 + signal), or -1. */
static int wait_exit(pid_t pid, unsigned ms)
{
    for (uint64_t end = kvp_now_ms() + ms;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (r < 0 || kvp_now_ms() >= end)
            return -1;
        usleep(10000);
    }
}

/* Stops p with sig (SIGKILL after 10 s) and records how it ended. */
static void proc_kill(proc *p, int sig)
{
    if (p->pid <= 0)
        return;
    int st = wait_exit(p->pid, 0);
    if (st >= 0) {
        p->on_own = 1;
    } else {
        kill(p->pid, sig);
        if ((st = wait_exit(p->pid, sig == SIGKILL ? 5000 : 10000)) < 0) {
            kill(p->pid, SIGKILL);
            st = wait_exit(p->pid, 5000);
        }
    }
    p->status = st;
    p->pid = 0;
}

/* A loopback port nobody listens on now: "127.0.0.1:PORT". */
static int free_addr(char *out, size_t n)
{
    char err[128];
    uint16_t port = 0;
    int fd = kvp_net_listen("127.0.0.1:0", 1, &port, err, sizeof err);
    if (fd < 0)
        return -1;
    close(fd);
    if (port == 0)
        return -1;
    snprintf(out, n, "127.0.0.1:%u", (unsigned)port);
    return 0;
}

static int addr_up(const char *addr)
{
    char err[128];
    int fd = kvp_net_connect(addr, 200, err, sizeof err);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

/* `kvpool <args...> --listen 127.0.0.1:0 --port-file F --log-level info`
 * (a master), logging to dir/name.log; waits up to 15 s for the port. */
static int start_master(hb *b, proc *p, const char *name, const char *const *args)
{
    char pf[320];
    snprintf(pf, sizeof pf, "%s/%s.port", b->dir, name);
    snprintf(p->log, sizeof p->log, "%s/%s.log", b->dir, name);
    unlink(pf);
    const char *argv[40];
    int n = 0;
    argv[n++] = "kvpool";
    for (int i = 0; args[i] && n < 32; i++)
        argv[n++] = args[i];
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--port-file";
    argv[n++] = pf;
    argv[n++] = "--log-level";
    argv[n++] = "info";
    argv[n] = NULL;
    p->status = -1;
    p->pid = spawn("/proc/self/exe", argv, p->log);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    for (uint64_t end = kvp_now_ms() + 15000; kvp_now_ms() < end; usleep(10000)) {
        FILE *f = fopen(pf, "r");
        unsigned port = 0;
        if (f) {
            int ok = fscanf(f, "%u", &port) == 1;
            fclose(f);
            if (ok) {
                snprintf(p->addr, sizeof p->addr, "127.0.0.1:%u", port);
                return 0;
            }
        }
        if (wait_exit(p->pid, 0) >= 0) {
            p->pid = 0;
            return -1;
        }
    }
    proc_kill(p, SIGKILL);
    return -1;
}

static int start_cluster_master(hb *b)
{
    if (b->nm == MAX_MASTERS)
        return -1;
    char name[32], ttl[32], sto[32];
    snprintf(name, sizeof name, "master-%d", b->nm);
    snprintf(ttl, sizeof ttl, "%llums", (unsigned long long)b->cfg.ha_lease_ttl_ms);
    snprintf(sto, sizeof sto, "%llums", (unsigned long long)b->cfg.ha_sync_timeout_ms);
    const char *args[] = {"master", "--etcd", b->flag, "--cluster", CLUSTER, "--ha-lease-ttl",
                          ttl, "--ha-sync", b->cfg.ha_sync ? "true" : "false",
                          "--ha-sync-timeout", sto, NULL};
    proc *p = &b->m[b->nm];
    if (start_master(b, p, name, args) != 0)
        return -1;
    return b->nm++;
}

static int start_node(hb *b, proc *p, const char *name, const char *master)
{
    snprintf(p->log, sizeof p->log, "%s/%s.log", b->dir, name);
    const char *argv[] = {"kvpool", "store", "--master", master, "--segment-size", SEGMENT_SIZE,
                          "--listen", "127.0.0.1:0", "--unix-dir", b->dir, "--log-level",
                          "info", NULL};
    p->status = -1;
    p->pid = spawn("/proc/self/exe", argv, p->log);
    if (p->pid < 0) {
        p->pid = 0;
        return -1;
    }
    return 0;
}

/* $KVPOOL_ETCD, else /usr/bin/etcd, /usr/local/bin/etcd. */
static int find_etcd(char *out, size_t n)
{
    const char *env = getenv("KVPOOL_ETCD");
    if (env && *env) {
        snprintf(out, n, "%s", env);
        return access(env, X_OK) == 0 ? 0 : -1;
    }
    static const char *const cands[] = {"/usr/bin/etcd", "/usr/local/bin/etcd", NULL};
    for (int i = 0; cands[i]; i++)
        if (access(cands[i], X_OK) == 0) {
            snprintf(out, n, "%s", cands[i]);
            return 0;
        }
    return -1;
}

static int start_etcd(hb *b)
{
    char peer[64], curl[96], purl[96], cluster[128], data[320];
    if (free_addr(b->etcd_addr, sizeof b->etcd_addr) || free_addr(peer, sizeof peer)) {
        snprintf(b->setup_why, sizeof b->setup_why, "etcd: no free loopback port");
        return -1;
    }
    snprintf(curl, sizeof curl, "http://%s", b->etcd_addr);
    snprintf(purl, sizeof purl, "http://%s", peer);
    snprintf(cluster, sizeof cluster, "kvp=%s", purl);
    snprintf(data, sizeof data, "%s/etcd-data", b->dir);
    snprintf(b->etcd.log, sizeof b->etcd.log, "%s/etcd.log", b->dir);
    const char *argv[] = {b->etcd_bin, "--name", "kvp", "--data-dir", data,
                          "--listen-client-urls", curl, "--advertise-client-urls", curl,
                          "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                          "--initial-cluster", cluster, "--log-level", "error", NULL};
    b->etcd.pid = spawn(b->etcd_bin, argv, b->etcd.log);
    if (b->etcd.pid < 0) {
        b->etcd.pid = 0;
        snprintf(b->setup_why, sizeof b->setup_why, "etcd: fork: %s", strerror(errno));
        return -1;
    }
    for (uint64_t end = kvp_now_ms() + 15000; kvp_now_ms() < end; usleep(50000)) {
        if (wait_exit(b->etcd.pid, 0) >= 0) {
            b->etcd.pid = 0;
            snprintf(b->setup_why, sizeof b->setup_why, "etcd exited at start (see %.200s)",
                     b->etcd.log);
            return -1;
        }
        if (addr_up(b->etcd_addr)) {
            snprintf(b->url, sizeof b->url, "etcd://%s/%s", b->etcd_addr, CLUSTER);
            snprintf(b->flag, sizeof b->flag, "http://%s", b->etcd_addr);
            return 0;
        }
    }
    snprintf(b->setup_why, sizeof b->setup_why, "etcd did not listen on %s within 15 s",
             b->etcd_addr);
    return -1;
}

/* The address etcd names the leader now, or "" (none or unreachable). */
static void leader_now(const hb *b, char *out, size_t n)
{
    char got[KVP_LEADER_ADDR_MAX + 1], err[256];
    if (kvp_leader_resolve(b->url, got, sizeof got, NULL, err, sizeof err) == 0)
        snprintf(out, n, "%.*s", (int)(n - 1), got);
    else
        out[0] = '\0';
}

static proc *master_at(hb *b, const char *addr)
{
    for (int i = 0; i < b->nm; i++)
        if (b->m[i].pid > 0 && !strcmp(b->m[i].addr, addr))
            return &b->m[i];
    return NULL;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(p);
    return 0;
}

/* ------------------------------------------------------------ clients */

static kvp_client *open_client(const char *master, int force_tcp, char *why, size_t wl)
{
    char m[300], conf[600];
    kvp_bench_json_escape(m, sizeof m, master);
    snprintf(conf, sizeof conf,
             "{\"master\": \"%s\", \"mode\": \"standalone-store\", \"rpc_timeout\": \"2s\"}", m);
    return kvp_bench_client_open_conf(conf, force_tcp, why, wl);
}

/* The master's counter name in a stat text, or -1. */
static long long counter(const char *buf, const char *name)
{
    char pat[80];
    snprintf(pat, sizeof pat, "\"%s\": ", name);
    const char *p = strstr(buf, pat);
    return p ? atoll(p + strlen(pat)) : -1;
}

/* Fetches c's master stats into buf (STAT_CAP): 0 or -1. */
static int stat_fetch(kvp_client *c, char *buf)
{
    buf[0] = '\0';
    return kvp_client_stat(c, buf, STAT_CAP) < 0 ? -1 : 0;
}

static long long stat1(hb *b, kvp_client *c, const char *name)
{
    return stat_fetch(c, b->statbuf) ? -1 : counter(b->statbuf, name);
}

static void *sampler_main(void *arg)
{
    sampler *s = arg;
    while (!s->stop) {
        if (s->active && stat_fetch(s->c, s->buf) == 0) {
            long long lag = counter(s->buf, "repl_lag");
            if (lag > s->lag_max)
                s->lag_max = lag;
            if (lag >= 0)
                s->samples++;
        }
        usleep(SAMPLE_MS * 1000);
    }
    return NULL;
}

static void make_keys(hb *b, const char *tag, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        char *k = b->keybuf[i];
        int l = snprintf(k, KEYLEN + 1, "kvpool-bench/ha-%016llx-%s@tp0@pcp0@dcp0@pp0@%020llu@",
                         b->nonce, tag, b->seq++);
        if (l < KEYLEN)
            memset(k + l, 'h', (size_t)(KEYLEN - l));
        k[KEYLEN] = '\0';
        b->keys[i] = k;
    }
}

/* Failover object i: its key into k (KEYLEN + 1) and, when v, its bytes. */
static void fo_key(const hb *b, uint64_t i, char *k)
{
    int l = snprintf(k, KEYLEN + 1, "kvpool-bench/ha-%016llx-kept@tp0@pcp0@dcp0@pp0@%020llu@",
                     b->nonce, (unsigned long long)i);
    if (l < KEYLEN)
        memset(k + l, 'k', (size_t)(KEYLEN - l));
    k[KEYLEN] = '\0';
}

static void fill(uint8_t *p, size_t len, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    for (size_t i = 0; i + 8 <= len; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

/* One batch of n values of size from base (put) or into base (get);
 * 0, or -1 with why. */
static int batch(kvp_client *c, const char *const *keys, uint8_t *base, uint32_t n,
                 size_t size, int is_put, char *why, size_t wl)
{
    kvp_iov iov[MAX_VALUES];
    const kvp_iov *iovs[MAX_VALUES];
    size_t niov[MAX_VALUES];
    int64_t res[MAX_VALUES];
    for (uint32_t i = 0; i < n; i++) {
        iov[i].base = base + i * size;
        iov[i].len = size;
        iovs[i] = &iov[i];
        niov[i] = 1;
    }
    int rc = is_put ? kvp_client_batch_put_from_multi_buffers(c, keys, iovs, niov, n, res)
                    : kvp_client_batch_get_into_multi_buffers(c, keys, iovs, niov, n, res);
    if (rc < 0) {
        snprintf(why, wl, "%s", kvp_strerror(rc));
        return -1;
    }
    for (uint32_t i = 0; i < n; i++)
        if (res[i] != (int64_t)size) {
            if (res[i] < 0)
                snprintf(why, wl, "key %u: %s", i, kvp_strerror((int)res[i]));
            else
                snprintf(why, wl, "key %u: %lld of %zu bytes", i, (long long)res[i], size);
            return -1;
        }
    return 0;
}

/* ------------------------------------------------------------ (a) throughput */

/* One round of setup si, shape s: put batch, get batch (timed), compare,
 * remove (untimed). The cluster's repl_bytes is read around the put. */
static int tput_round(hb *b, int si, const shape *s, int timed, char *why, size_t wl)
{
    kvp_client *c = b->c[si];
    cell *ce = &b->cells[si][s - shapes];
    make_keys(b, si ? "c" : "s", s->n);
    for (uint32_t i = 0; i < s->n; i++) { /* each value unique: a stale read shows */
        unsigned long long stamp = b->seq - s->n + i;
        memcpy(b->src + i * s->size, &stamp, sizeof stamp);
    }
    long long rb0 = si == SET_CLUSTER && timed ? stat1(b, c, "repl_bytes") : 0;
    uint64_t t0 = kvp_now_ns();
    if (batch(c, b->keys, b->src, s->n, s->size, 1, why, wl))
        return -1;
    uint64_t t1 = kvp_now_ns();
    if (si == SET_CLUSTER && timed) {
        if (stat_fetch(c, b->statbuf) == 0) {
            long long rb1 = counter(b->statbuf, "repl_bytes");
            long long lag = counter(b->statbuf, "repl_lag");
            if (rb0 >= 0 && rb1 >= rb0) {
                b->repl_put_bytes += (uint64_t)(rb1 - rb0);
                b->repl_puts += s->n;
            }
            if (lag > b->lag_after_put_max)
                b->lag_after_put_max = lag;
        }
    }
    memset(b->dst, 0, (size_t)s->n * s->size);
    uint64_t t2 = kvp_now_ns();
    if (batch(c, b->keys, b->dst, s->n, s->size, 0, why, wl))
        return -1;
    uint64_t t3 = kvp_now_ns();
    for (uint32_t i = 0; i < s->n; i++)
        if (memcmp(b->src + i * s->size, b->dst + i * s->size, s->size) != 0) {
            snprintf(why, wl, "value %u read back differs from what was put", i);
            return -1;
        }
    int rr[MAX_VALUES];
    long long rd0 = si == SET_CLUSTER && timed ? stat1(b, c, "repl_bytes") : -1;
    if (kvp_client_batch_remove(c, b->keys, s->n, 1, rr) < 0) {
        snprintf(why, wl, "remove failed");
        return -1;
    }
    if (rd0 >= 0) {
        long long rd1 = stat1(b, c, "repl_bytes");
        if (rd1 >= rd0) {
            b->repl_del_bytes += (uint64_t)(rd1 - rd0);
            b->repl_dels += s->n;
        }
    }
    if (timed) {
        ce->put_lat[ce->rounds] = t1 - t0;
        ce->get_lat[ce->rounds] = t3 - t2;
        ce->put_ns += t1 - t0;
        ce->get_ns += t3 - t2;
        ce->rounds++;
        ce->keys += s->n;
    }
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void run_throughput(hb *b)
{
    char why[192];
    for (int k = 0; k < NSHAPES; k++) {
        const shape *s = &shapes[k];
        uint64_t rounds = (b->ops + s->n - 1) / s->n;
        if (rounds < MIN_ROUNDS)
            rounds = MIN_ROUNDS;
        int failed[NSETS] = {0};
        for (int si = 0; si < NSETS; si++) {
            cell *ce = &b->cells[si][k];
            ce->put_lat = kvp_calloc(rounds, sizeof *ce->put_lat);
            ce->get_lat = kvp_calloc(rounds, sizeof *ce->get_lat);
            if (!ce->put_lat || !ce->get_lat) {
                snprintf(ce->why, sizeof ce->why, "out of memory");
                failed[si] = 1;
            } else if (tput_round(b, si, s, 0, why, sizeof why)) { /* warm-up */
                snprintf(ce->why, sizeof ce->why, "warm-up: %.170s", why);
                failed[si] = 1;
            }
        }
        b->smp.active = 1;
        for (uint64_t r = 0; r < rounds; r++) {
            kvp_bench_progress("throughput", 10, s->name, 6, (int)r, (int)rounds);
            for (int j = 0; j < NSETS; j++) {
                int si = (int)(r & 1) ? NSETS - 1 - j : j;
                if (failed[si])
                    continue;
                if (tput_round(b, si, s, 1, why, sizeof why)) {
                    snprintf(b->cells[si][k].why, sizeof b->cells[si][k].why, "round %llu: %.150s",
                             (unsigned long long)r, why);
                    failed[si] = 1;
                }
            }
        }
        b->smp.active = 0;
        kvp_bench_progress_clear(60);
        /* round r of both setups ran back to back: the median of their
         * ratios is what other load on the machine disturbs least */
        const cell *cs = &b->cells[SET_SINGLE][k], *cc = &b->cells[SET_CLUSTER][k];
        double *q = kvp_calloc(rounds, sizeof *q);
        for (int g = 0; g < 2; g++) {
            b->paired[k][g] = -1;
            if (failed[0] || failed[1] || !q || cs->rounds != cc->rounds || !cs->rounds)
                continue;
            for (uint64_t r = 0; r < cs->rounds; r++) {
                uint64_t ts = g ? cs->get_lat[r] : cs->put_lat[r];
                uint64_t tc = g ? cc->get_lat[r] : cc->put_lat[r];
                q[r] = tc ? (double)ts / (double)tc : 0;
            }
            qsort(q, cs->rounds, sizeof *q, cmp_d);
            b->paired[k][g] = cs->rounds & 1 ? q[cs->rounds / 2]
                                              : (q[cs->rounds / 2 - 1] + q[cs->rounds / 2]) / 2;
        }
        kvp_free(q);
        for (int si = 0; si < NSETS; si++) {
            cell *ce = &b->cells[si][k];
            if (failed[si] || !ce->rounds)
                continue;
            ce->ok = 1;
            double bytes = (double)ce->keys * (double)s->size;
            ce->put_kops = (double)ce->keys / ((double)ce->put_ns / 1e9);
            ce->get_kops = (double)ce->keys / ((double)ce->get_ns / 1e9);
            ce->put_gbps = bytes / (double)ce->put_ns;
            ce->get_gbps = bytes / (double)ce->get_ns;
            qsort(ce->put_lat, ce->rounds, sizeof *ce->put_lat, kvp_bench_cmp_u64);
            qsort(ce->get_lat, ce->rounds, sizeof *ce->get_lat, kvp_bench_cmp_u64);
            ce->put_p50_us = (double)ce->put_lat[ce->rounds / 2] / 1e3;
            ce->get_p50_us = (double)ce->get_lat[ce->rounds / 2] / 1e3;
        }
    }
}

/* ------------------------------------------------------------ (c) memory */

static long long wait_in_sync(hb *b, kvp_client *c, long long want, unsigned ms);

static uint64_t rss_of(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long kb = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

static void idx_key(const hb *b, uint64_t i, char *k)
{
    int l = snprintf(k, KEYLEN + 1, "kvpool-bench/ha-%016llx-index@tp0@pcp0@dcp0@pp0@%020llu@",
                     b->nonce, (unsigned long long)i);
    if (l < KEYLEN)
        memset(k + l, 'i', (size_t)(KEYLEN - l));
    k[KEYLEN] = '\0';
}

/* b->nidx 4 KiB objects put through the cluster: the leader's and the
 * standby's resident memory before and after, per object, and the stream's
 * bytes per put; then removed again (bytes per removal). */
static void run_index_memory(hb *b)
{
    kvp_client *c = b->c[SET_CLUSTER];
    char lead[64], why[192];
    leader_now(b, lead, sizeof lead);
    proc *l = master_at(b, lead), *sb = NULL;
    for (int i = 0; i < b->nm; i++)
        if (b->m[i].pid > 0 && &b->m[i] != l)
            sb = &b->m[i];
    if (!l || !sb || wait_in_sync(b, c, 1, 10000) < 0) {
        snprintf(b->mem.why, sizeof b->mem.why, "no leader with an in-sync standby");
        return;
    }
    const uint32_t n = 256;
    const size_t size = (size_t)4 << 10;
    char keys[256][KEYLEN + 1];
    const char *kp[256];
    uint64_t l0 = rss_of(l->pid), s0 = rss_of(sb->pid);
    long long rb0 = stat1(b, c, "repl_bytes");
    b->smp.active = 1;
    for (uint64_t done = 0; done < b->nidx; done += n) {
        uint32_t m = b->nidx - done < n ? (uint32_t)(b->nidx - done) : n;
        for (uint32_t i = 0; i < m; i++) {
            idx_key(b, done + i, keys[i]);
            kp[i] = keys[i];
            unsigned long long stamp = done + i;
            memcpy(b->src + i * size, &stamp, sizeof stamp);
        }
        if (batch(c, kp, b->src, m, size, 1, why, sizeof why)) {
            b->smp.active = 0;
            snprintf(b->mem.why, sizeof b->mem.why, "put %llu: %.160s",
                     (unsigned long long)done, why);
            return;
        }
    }
    b->smp.active = 0;
    /* with ha_sync every acknowledged put is applied; without, wait */
    for (uint64_t end = kvp_now_ms() + 10000;
         kvp_now_ms() < end && stat1(b, c, "repl_lag") != 0;)
        usleep(20000);
    long long rb1 = stat1(b, c, "repl_bytes");
    uint64_t l1 = rss_of(l->pid), s1 = rss_of(sb->pid);
    for (uint64_t done = 0; done < b->nidx; done += n) {
        uint32_t m = b->nidx - done < n ? (uint32_t)(b->nidx - done) : n;
        int rr[256];
        for (uint32_t i = 0; i < m; i++) {
            idx_key(b, done + i, keys[i]);
            kp[i] = keys[i];
        }
        if (kvp_client_batch_remove(c, kp, m, 1, rr) < 0) {
            snprintf(b->mem.why, sizeof b->mem.why, "remove failed");
            return;
        }
    }
    long long rb2 = stat1(b, c, "repl_bytes");
    b->mem.objects = b->nidx;
    b->mem.leader_bytes = ((double)l1 - (double)l0) / (double)b->nidx;
    b->mem.standby_bytes = ((double)s1 - (double)s0) / (double)b->nidx;
    if (rb0 >= 0 && rb1 >= rb0 && rb2 >= rb1) {
        b->mem.put_bytes = (double)(rb1 - rb0) / (double)b->nidx;
        b->mem.del_bytes = (double)(rb2 - rb1) / (double)b->nidx;
    }
    b->mem.ok = l0 && l1 && s0 && s1;
    if (!b->mem.ok)
        snprintf(b->mem.why, sizeof b->mem.why, "cannot read the masters' VmRSS");
}

/* ------------------------------------------------------------ (b) failover */

/* Puts failover objects [from, from + n) through c; 0 or -1 with why. */
static int publish(hb *b, kvp_client *c, uint64_t from, uint64_t n, char *why, size_t wl)
{
    char keys[FO_BATCH][KEYLEN + 1];
    const char *kp[FO_BATCH];
    for (uint64_t done = 0; done < n;) {
        uint32_t m = n - done < FO_BATCH ? (uint32_t)(n - done) : FO_BATCH;
        for (uint32_t i = 0; i < m; i++) {
            fo_key(b, from + done + i, keys[i]);
            kp[i] = keys[i];
            fill(b->src + i * FO_SIZE, FO_SIZE, from + done + i);
        }
        if (batch(c, kp, b->src, m, FO_SIZE, 1, why, wl))
            return -1;
        done += m;
    }
    return 0;
}

/* Reads failover objects [0, b->fo_published) back: per object good[i]
 * (1 right, 0 missing, 2 wrong bytes). Missing ones are retried until the
 * leader has nothing parked or until deadline_ms. Returns the number right. */
static uint64_t verify_all(hb *b, kvp_client *c, uint64_t deadline_ms, fo *f)
{
    char keys[FO_BATCH][KEYLEN + 1];
    const char *kp[FO_BATCH];
    uint64_t n = b->fo_published, right = 0;
    uint8_t *state = kvp_calloc(n ? n : 1, 1); /* 0 unknown/missing, 1 right, 2 wrong */
    if (!state)
        return 0;
    for (;;) {
        uint64_t left = 0;
        for (uint64_t from = 0; from < n;) {
            uint32_t m = 0;
            uint64_t idx[FO_BATCH];
            while (from < n && m < FO_BATCH) {
                if (state[from] == 0) {
                    fo_key(b, from, keys[m]);
                    kp[m] = keys[m];
                    idx[m++] = from;
                }
                from++;
            }
            if (!m)
                break;
            kvp_iov iov[FO_BATCH];
            const kvp_iov *iovs[FO_BATCH];
            size_t niov[FO_BATCH];
            int64_t res[FO_BATCH];
            for (uint32_t i = 0; i < m; i++) {
                iov[i].base = b->dst + i * FO_SIZE;
                iov[i].len = FO_SIZE;
                memset(iov[i].base, 0, FO_SIZE);
                iovs[i] = &iov[i];
                niov[i] = 1;
            }
            if (kvp_client_batch_get_into_multi_buffers(c, kp, iovs, niov, m, res) < 0) {
                left += m;
                continue;
            }
            for (uint32_t i = 0; i < m; i++) {
                if (res[i] != (int64_t)FO_SIZE) {
                    left++;
                    continue;
                }
                fill(b->src, FO_SIZE, idx[i]);
                if (memcmp(b->src, b->dst + i * FO_SIZE, FO_SIZE) == 0) {
                    state[idx[i]] = 1;
                    right++;
                } else {
                    state[idx[i]] = 2;
                }
            }
        }
        if (!left || kvp_now_ms() >= deadline_ms)
            break;
        long long parked = stat1(b, c, "parked");
        if (parked == 0 && left) {
            /* nothing more will come back: one more pass was just made */
            break;
        }
        usleep(100000);
    }
    f->missing = f->wrong = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (state[i] == 0)
            f->missing++;
        else if (state[i] == 2)
            f->wrong++;
    }
    for (uint64_t i = 0; i < n; i++) { /* what was right before and is not now: lost */
        if (b->good[i] == 1 && state[i] != 1) {
            if (state[i] == 2)
                f->newly_wrong++;
            else
                f->lost++;
        }
        b->good[i] = state[i];
    }
    kvp_free(state);
    return right;
}

/* Waits until the leader counts want standbys in sync (up to ms): the ms it
 * took, or -1. */
static long long wait_in_sync(hb *b, kvp_client *c, long long want, unsigned ms)
{
    uint64_t t0 = kvp_now_ms();
    while (kvp_now_ms() - t0 < ms) {
        if (stat1(b, c, "repl_in_sync") >= want)
            return (long long)(kvp_now_ms() - t0);
        usleep(20000);
    }
    return -1;
}

static void run_failover(hb *b, int r)
{
    fo *f = &b->fos[r];
    kvp_client *c = b->c[SET_CLUSTER];
    char why[192];
    memset(f, 0, sizeof *f);
    f->takeover_ms = f->remount_ms = f->put_ms = f->get_ms = f->verified_ms = f->resync_ms = -1;
    /* publish this round's objects (every put acknowledged) */
    long long rb0 = stat1(b, c, "repl_bytes");
    uint64_t from = b->fo_published;
    b->smp.active = 1;
    int prc = publish(b, c, from, b->nobj, why, sizeof why);
    b->smp.active = 0;
    if (prc) {
        snprintf(f->why, sizeof f->why, "publish: %.170s", why);
        return;
    }
    long long rb1 = stat1(b, c, "repl_bytes");
    if (rb0 >= 0 && rb1 >= rb0)
        f->pub_repl_bytes = (uint64_t)(rb1 - rb0);
    for (uint64_t i = from; i < from + b->nobj; i++)
        b->good[i] = 1; /* acknowledged: must survive */
    b->fo_published += b->nobj;
    f->published = b->fo_published;
    leader_now(b, f->old_leader, sizeof f->old_leader);
    proc *old = master_at(b, f->old_leader);
    if (!old) {
        char said[sizeof f->old_leader];
        memcpy(said, f->old_leader, sizeof said);
        snprintf(f->why, sizeof f->why, "etcd names no leader we started (\"%s\")", said);
        return;
    }
    /* the kill, and what the client sees from then on */
    char probe_key[KEYLEN + 1], get_key[KEYLEN + 1];
    fo_key(b, from, get_key); /* published just before the kill */
    uint64_t t0 = kvp_now_ms();
    old->killed = 1;
    proc_kill(old, SIGKILL);
    uint64_t deadline = t0 + 20000 + 2 * b->cfg.ha_lease_ttl_ms;
    int tries = 0;
    while (kvp_now_ms() < deadline &&
           (f->takeover_ms < 0 || f->remount_ms < 0 || f->put_ms < 0 || f->get_ms < 0)) {
        if (f->takeover_ms < 0) {
            leader_now(b, f->new_leader, sizeof f->new_leader);
            if (f->new_leader[0] && strcmp(f->new_leader, f->old_leader))
                f->takeover_ms = (long long)(kvp_now_ms() - t0);
        }
        if (f->takeover_ms >= 0 && f->remount_ms < 0 && stat1(b, c, "segments") >= 1)
            f->remount_ms = (long long)(kvp_now_ms() - t0); /* the node is back */
        if (f->put_ms < 0) {
            snprintf(probe_key, sizeof probe_key, "kvpool-bench/ha-%016llx-after-%d-%d",
                     b->nonce, r, tries++);
            fill(b->src, FO_SIZE, 0xA11CE + (uint64_t)tries);
            if (kvp_client_put(c, probe_key, b->src, FO_SIZE) == 0)
                f->put_ms = (long long)(kvp_now_ms() - t0);
        }
        if (f->get_ms < 0) {
            int64_t g = kvp_client_get(c, get_key, b->dst, FO_SIZE);
            if (g == (int64_t)FO_SIZE) {
                fill(b->src, FO_SIZE, from);
                if (memcmp(b->src, b->dst, FO_SIZE) == 0)
                    f->get_ms = (long long)(kvp_now_ms() - t0);
            }
        }
        /* a put or get served means the node was back, whatever the poll saw */
        long long served = f->put_ms >= 0 && (f->get_ms < 0 || f->put_ms < f->get_ms) ? f->put_ms
                                                                                   : f->get_ms;
        if (f->remount_ms < 0 || (served >= 0 && served < f->remount_ms))
            f->remount_ms = served;
        usleep(10000);
    }
    if (f->takeover_ms < 0 || f->remount_ms < 0 || f->put_ms < 0 || f->get_ms < 0) {
        snprintf(f->why, sizeof f->why,
                 "not recovered within %llu ms (takeover %lld, remount %lld, put %lld, get %lld "
                 "ms)",
                 (unsigned long long)(deadline - t0), f->takeover_ms, f->remount_ms, f->put_ms,
                 f->get_ms);
    }
    /* every object published so far, byte for byte */
    uint64_t right = verify_all(b, c, deadline, f);
    f->checked = b->fo_published;
    f->verified_ms = (long long)(kvp_now_ms() - t0);
    if (stat_fetch(c, b->statbuf) == 0) {
        f->adopted = counter(b->statbuf, "adopted");
        f->adopt_dropped = counter(b->statbuf, "adopt_dropped");
    }
    (void)right;
    /* the killed master's replacement: a fresh standby, until in sync */
    long long s0 = stat1(b, c, "repl_bytes");
    long long objs = stat1(b, c, "objects");
    uint64_t ts = kvp_now_ms();
    if (start_cluster_master(b) < 0) {
        if (!f->why[0])
            snprintf(f->why, sizeof f->why, "could not start a replacement standby");
        return;
    }
    long long w = wait_in_sync(b, c, 1, 20000);
    if (w >= 0) {
        f->resync_ms = (long long)(kvp_now_ms() - ts);
        long long s1 = stat1(b, c, "repl_bytes");
        if (s0 >= 0 && s1 >= s0)
            f->snapshot_bytes = (uint64_t)(s1 - s0);
        f->snapshot_objects = objs > 0 ? (uint64_t)objs : 0;
    } else if (!f->why[0]) {
        snprintf(f->why, sizeof f->why, "the replacement standby was not in sync within 20 s");
    }
    if (!f->why[0])
        f->ok = 1;
}

/* ------------------------------------------------------------ report */

/* cluster/single for shape k: the median of the paired rounds' ratios (the
 * goal's measure), or of the totals' keys/s; -1 when a cell is missing. */
static double ratio(const hb *b, int k, int get)
{
    const cell *s = &b->cells[SET_SINGLE][k], *c = &b->cells[SET_CLUSTER][k];
    return s->ok && c->ok ? b->paired[k][get] : -1;
}

static double ratio_totals(const hb *b, int k, int get)
{
    const cell *s = &b->cells[SET_SINGLE][k], *c = &b->cells[SET_CLUSTER][k];
    if (!s->ok || !c->ok)
        return -1;
    double d = get ? s->get_kops : s->put_kops;
    return d > 0 ? (get ? c->get_kops : c->put_kops) / d : -1;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

/* Median and max of field off over the failovers that recovered. */
static void fo_stats(const hb *b, size_t off, long long *med, long long *max)
{
    long long v[MAX_FAILOVERS];
    int n = 0;
    for (int i = 0; i < b->nfo_done; i++) {
        long long x = *(const long long *)((const char *)&b->fos[i] + off);
        if (x >= 0)
            v[n++] = x;
    }
    *med = *max = -1;
    if (!n)
        return;
    qsort(v, (size_t)n, sizeof *v, cmp_ll);
    *med = v[n / 2];
    *max = v[n - 1];
}

static double per_put(const hb *b)
{
    return b->repl_puts ? (double)b->repl_put_bytes / (double)b->repl_puts : 0;
}

static void print_text(const hb *b)
{
    FILE *o = b->out;
    fprintf(o, "kvpool bench ha: etcd %s, cluster %s: a leader + 1 standby, lease TTL %.1f s, "
               "ha_sync %s (timeout %llu ms); a " SEGMENT_SIZE " node per setup, transports "
               "%s/%s; %d-byte keys\n",
            b->etcd_addr, CLUSTER, (double)b->cfg.ha_lease_ttl_ms / 1e3,
            b->cfg.ha_sync ? "on" : "off", (unsigned long long)b->cfg.ha_sync_timeout_ms,
            b->transport[0], b->transport[1], KEYLEN);
    fprintf(o, "(a) batch put / get, --ops %llu keys and at least %d batches per shape and "
               "setup; round r of both setups back to back, the order alternating\n",
            (unsigned long long)b->ops, MIN_ROUNDS);
    fprintf(o, "  %-12s %-8s %12s %9s %9s %12s %9s %9s\n", "shape", "setup", "put keys/s",
            "put GB/s", "p50 ms", "get keys/s", "get GB/s", "p50 ms");
    for (int k = 0; k < NSHAPES; k++) {
        for (int si = 0; si < NSETS; si++) {
            const cell *c = &b->cells[si][k];
            if (c->ok)
                fprintf(o, "  %-12s %-8s %12.0f %9.2f %9.2f %12.0f %9.2f %9.2f\n",
                        shapes[k].title, set_id[si], c->put_kops, c->put_gbps,
                        c->put_p50_us / 1e3, c->get_kops, c->get_gbps, c->get_p50_us / 1e3);
            else
                fprintf(o, "  %-12s %-8s failed: %s\n", shapes[k].title, set_id[si], c->why);
        }
        double rp = ratio(b, k, 0), rg = ratio(b, k, 1);
        double tp = ratio_totals(b, k, 0), tg = ratio_totals(b, k, 1);
        char a[16], g[16], ta[16], tgs[16];
        snprintf(a, sizeof a, rp < 0 ? "-" : "%.3f", rp); /* 0.899 is not 0.90 */
        snprintf(g, sizeof g, rg < 0 ? "-" : "%.3f", rg);
        snprintf(ta, sizeof ta, tp < 0 ? "-" : "%.2f", tp);
        snprintf(tgs, sizeof tgs, tg < 0 ? "-" : "%.2f", tg);
        fprintf(o, "  %-12s %-8s put %s x (%s)  get %s x (%s)  goal >= 0.9 (median of the "
                   "rounds' ratios; of the totals: put %s, get %s)\n",
                shapes[k].title, "ratio", a, rp < 0 ? "n/a" : rp >= 0.9 ? "met" : "MISS", g,
                rg < 0 ? "n/a" : rg >= 0.9 ? "met" : "MISS", ta, tgs);
    }
    fprintf(o, "(b) failover: kill -9 of the leader, %d rounds, %llu x 64 KiB objects published "
               "before each (ms from the kill)\n",
            b->nfo, (unsigned long long)b->nobj);
    fprintf(o, "  %-5s %9s %8s %8s %8s %9s %8s %8s %6s %5s %8s %8s %7s\n", "round",
            "takeover", "remount", "1st put", "1st get", "verified", "checked", "missing",
            "wrong", "lost", "adopted", "dropped", "resync");
    for (int i = 0; i < b->nfo_done; i++) {
        const fo *f = &b->fos[i];
        fprintf(o, "  %-5d %9lld %8lld %8lld %8lld %9lld %8llu %8llu %6llu %5llu %8lld %8lld "
                   "%7lld\n",
                i + 1, f->takeover_ms, f->remount_ms, f->put_ms, f->get_ms, f->verified_ms,
                (unsigned long long)f->checked, (unsigned long long)f->missing,
                (unsigned long long)f->wrong,
                (unsigned long long)(f->lost + f->newly_wrong), f->adopted, f->adopt_dropped,
                f->resync_ms);
        if (f->why[0])
            fprintf(o, "        failed: %s\n", f->why);
    }
    long long med, max;
    fo_stats(b, offsetof(fo, put_ms), &med, &max);
    fprintf(o, "  first put after the kill: median %lld ms, max %lld ms", med, max);
    fo_stats(b, offsetof(fo, get_ms), &med, &max);
    fprintf(o, "; first get of a kept object: median %lld ms, max %lld ms (TTL %.1f s)\n", med,
            max, (double)b->cfg.ha_lease_ttl_ms / 1e3);
    double pp = per_put(b);
    fprintf(o, "(c) replication: %.1f bytes per put to the standby (%.1f MB per million puts, "
               "over %llu timed puts of (a)); repl_lag max %lld (%llu samples every %d ms), "
               "%lld right after a put batch\n",
            pp, pp, (unsigned long long)b->repl_puts, b->smp.lag_max,
            (unsigned long long)b->smp.samples, SAMPLE_MS, b->lag_after_put_max);
    if (b->repl_dels)
        fprintf(o, "  a removal: %.1f bytes to the standby (over %llu removals of (a))\n",
                (double)b->repl_del_bytes / (double)b->repl_dels,
                (unsigned long long)b->repl_dels);
    if (b->mem.ok)
        fprintf(o, "  %llu objects of 4 KiB in the index: resident memory +%.0f bytes per object "
                   "on the leader, +%.0f on the standby; %.1f bytes per put and %.1f per removal "
                   "on the stream\n",
                (unsigned long long)b->mem.objects, b->mem.leader_bytes, b->mem.standby_bytes,
                b->mem.put_bytes, b->mem.del_bytes);
    else if (b->nidx)
        fprintf(o, "  index memory: failed: %s\n", b->mem.why);
    for (int i = 0; i < b->nfo_done; i++) {
        const fo *f = &b->fos[i];
        if (!f->pub_repl_bytes && !f->snapshot_bytes)
            continue;
        fprintf(o, "  round %d: publish %.1f bytes per put; the new standby's snapshot %llu bytes "
                   "for %llu objects (%.1f per object)\n",
                i + 1, b->nobj ? (double)f->pub_repl_bytes / (double)b->nobj : 0,
                (unsigned long long)f->snapshot_bytes, (unsigned long long)f->snapshot_objects,
                f->snapshot_objects ? (double)f->snapshot_bytes / (double)f->snapshot_objects
                                    : 0);
    }
    for (int k = 0; k < NSHAPES && pp > 0; k++) {
        const cell *c = &b->cells[SET_CLUSTER][k];
        if (c->ok)
            fprintf(o, "  at the cluster's measured %s put rate (%.0f keys/s): %.2f MB/s on "
                       "the standby link\n",
                    shapes[k].title, c->put_kops, pp * c->put_kops / 1e6);
    }
}

static void print_json(const hb *b, int nwarn, int bad)
{
    char e[400];
    printf("{\n  \"bench\": \"ha\",\n  \"etcd\": \"%s\",\n  \"cluster\": \"%s\",\n"
           "  \"standbys\": 1,\n  \"lease_ttl_ms\": %llu,\n  \"ha_sync\": %s,\n"
           "  \"ha_sync_timeout_ms\": %llu,\n  \"segment_size\": \"%s\",\n  \"key_bytes\": %d,\n"
           "  \"transports\": {\"single\": \"%s\", \"cluster\": \"%s\"},\n"
           "  \"ops_per_cell\": %llu,\n  \"throughput\": [\n",
           b->etcd_addr, CLUSTER, (unsigned long long)b->cfg.ha_lease_ttl_ms,
           b->cfg.ha_sync ? "true" : "false", (unsigned long long)b->cfg.ha_sync_timeout_ms,
           SEGMENT_SIZE, KEYLEN, b->transport[0], b->transport[1], (unsigned long long)b->ops);
    int first = 1;
    for (int k = 0; k < NSHAPES; k++)
        for (int si = 0; si < NSETS; si++) {
            const cell *c = &b->cells[si][k];
            printf("%s    {\"setup\": \"%s\", \"shape\": \"%s\", \"values\": %u, "
                   "\"value_bytes\": %zu, \"status\": \"%s\"",
                   first ? "" : ",\n", set_id[si], shapes[k].name, shapes[k].n, shapes[k].size,
                   c->ok ? "ok" : "failed");
            first = 0;
            if (c->ok)
                printf(", \"keys\": %llu, \"put_keys_per_s\": %.0f, \"put_gbps\": %.3f, "
                       "\"put_p50_us\": %.1f, \"get_keys_per_s\": %.0f, \"get_gbps\": %.3f, "
                       "\"get_p50_us\": %.1f",
                       (unsigned long long)c->keys, c->put_kops, c->put_gbps, c->put_p50_us,
                       c->get_kops, c->get_gbps, c->get_p50_us);
            else {
                kvp_bench_json_escape(e, sizeof e, c->why);
                printf(", \"reason\": \"%s\"", e);
            }
            printf("}");
        }
    printf("\n  ],\n  \"ratios\": [\n");
    first = 1;
    for (int k = 0; k < NSHAPES; k++)
        for (int g = 0; g < 2; g++) {
            double r = ratio(b, k, g), t = ratio_totals(b, k, g);
            printf("%s    {\"ratio\": \"cluster/single\", \"shape\": \"%s\", \"op\": \"%s\", "
                   "\"method\": \"median of paired rounds\", ",
                   first ? "" : ",\n", shapes[k].name, g ? "get" : "put");
            first = 0;
            if (r < 0)
                printf("\"value\": null, \"value_totals\": null, \"target\": \">= 0.9\", "
                       "\"met\": null}");
            else
                printf("\"value\": %.3f, \"value_totals\": %.3f, \"target\": \">= 0.9\", "
                       "\"met\": %s}",
                       r, t, r >= 0.9 ? "true" : "false");
        }
    printf("\n  ],\n  \"failover\": {\"rounds\": %d, \"objects_per_round\": %llu, "
           "\"object_bytes\": %zu, \"results\": [\n",
           b->nfo, (unsigned long long)b->nobj, FO_SIZE);
    for (int i = 0; i < b->nfo_done; i++) {
        const fo *f = &b->fos[i];
        kvp_bench_json_escape(e, sizeof e, f->why);
        printf("%s    {\"round\": %d, \"status\": \"%s\", \"old_leader\": \"%s\", "
               "\"new_leader\": \"%s\", \"takeover_ms\": %lld, \"remount_ms\": %lld, "
               "\"first_put_ms\": %lld, "
               "\"first_get_ms\": %lld, \"verified_ms\": %lld, \"checked\": %llu, "
               "\"missing\": %llu, \"wrong\": %llu, \"lost\": %llu, \"newly_wrong\": %llu, "
               "\"adopted\": %lld, \"adopt_dropped\": %lld, \"resync_ms\": %lld, "
               "\"publish_repl_bytes\": %llu, \"snapshot_bytes\": %llu, "
               "\"snapshot_objects\": %llu%s%s%s}",
               i ? ",\n" : "", i + 1, f->ok ? "ok" : "failed", f->old_leader, f->new_leader,
               f->takeover_ms, f->remount_ms, f->put_ms, f->get_ms, f->verified_ms,
               (unsigned long long)f->checked, (unsigned long long)f->missing,
               (unsigned long long)f->wrong, (unsigned long long)f->lost,
               (unsigned long long)f->newly_wrong, f->adopted, f->adopt_dropped, f->resync_ms,
               (unsigned long long)f->pub_repl_bytes, (unsigned long long)f->snapshot_bytes,
               (unsigned long long)f->snapshot_objects, e[0] ? ", \"reason\": \"" : "", e,
               e[0] ? "\"" : "");
    }
    long long pm, px, gm, gx;
    fo_stats(b, offsetof(fo, put_ms), &pm, &px);
    fo_stats(b, offsetof(fo, get_ms), &gm, &gx);
    uint64_t lost = 0;
    for (int i = 0; i < b->nfo_done; i++)
        lost += b->fos[i].lost + b->fos[i].newly_wrong;
    printf("\n  ], \"first_put_ms_median\": %lld, \"first_put_ms_max\": %lld, "
           "\"first_get_ms_median\": %lld, \"first_get_ms_max\": %lld, \"objects_lost\": %llu},\n",
           pm, px, gm, gx, (unsigned long long)lost);
    double pp = per_put(b);
    printf("  \"replication\": {\"puts\": %llu, \"bytes\": %llu, \"bytes_per_put\": %.1f, "
           "\"bytes_per_million_puts\": %.0f, \"repl_lag_max\": %lld, \"repl_lag_samples\": %llu, "
           "\"repl_lag_sample_ms\": %d, \"repl_lag_after_put_max\": %lld, "
           "\"link_mb_per_s_at_put_rate\": {",
           (unsigned long long)b->repl_puts, (unsigned long long)b->repl_put_bytes, pp, pp * 1e6,
           b->smp.lag_max, (unsigned long long)b->smp.samples, SAMPLE_MS, b->lag_after_put_max);
    for (int k = 0; k < NSHAPES; k++) {
        const cell *c = &b->cells[SET_CLUSTER][k];
        printf("%s\"%s\": ", k ? ", " : "", shapes[k].name);
        if (c->ok)
            printf("%.3f", pp * c->put_kops / 1e6);
        else
            printf("null");
    }
    printf("}, \"removals\": %llu, \"bytes_per_removal\": %.1f},\n",
           (unsigned long long)b->repl_dels,
           b->repl_dels ? (double)b->repl_del_bytes / (double)b->repl_dels : 0.0);
    if (b->mem.ok)
        printf("  \"index_memory\": {\"objects\": %llu, \"value_bytes\": 4096, "
               "\"leader_rss_bytes_per_object\": %.0f, \"standby_rss_bytes_per_object\": %.0f, "
               "\"repl_bytes_per_put\": %.1f, \"repl_bytes_per_removal\": %.1f},\n",
               (unsigned long long)b->mem.objects, b->mem.leader_bytes, b->mem.standby_bytes,
               b->mem.put_bytes, b->mem.del_bytes);
    else {
        kvp_bench_json_escape(e, sizeof e, b->mem.why);
        printf("  \"index_memory\": {\"objects\": %llu, \"status\": \"%s\", "
               "\"reason\": \"%s\"},\n",
               (unsigned long long)b->nidx, b->nidx ? "failed" : "skipped", e);
    }
    printf("  \"process_warnings\": %d,\n  \"process_bad_exits\": %d\n}\n", nwarn, bad);
}

/* Lists the warning and error lines the processes logged, sanitizer
 * reports included (up to 30 on the text output), and every process that
 * ended other than by our SIGTERM with status 0 or our kill -9; returns
 * the number of lines, *bad the number of such processes. */
static int scan_logs(const hb *b, int *bad)
{
    const proc *ps[MAX_MASTERS + 4];
    const char *names[MAX_MASTERS + 4];
    int n = 0, total = 0, shown = 0;
    static char mnames[MAX_MASTERS][24];
    ps[n] = &b->single, names[n++] = "single-master";
    ps[n] = &b->snode, names[n++] = "single-node";
    ps[n] = &b->hnode, names[n++] = "cluster-node";
    for (int i = 0; i < b->nm; i++) {
        snprintf(mnames[i], sizeof mnames[i], "master-%d", i);
        ps[n] = &b->m[i], names[n++] = mnames[i];
    }
    *bad = 0;
    for (int i = 0; i < n; i++) {
        const proc *p = ps[i];
        if (p->killed || p->status < 0 || (p->status == 0 && !p->on_own))
            continue;
        (*bad)++;
        fprintf(b->out, "  %s: %s with status %d\n", names[i],
                p->on_own ? "exited by itself" : "stopped by SIGTERM", p->status);
    }
    char clog[320];
    snprintf(clog, sizeof clog, "%s/bench-client.log", b->dir);
    for (int i = 0; i <= n; i++) {
        const char *path = i < n ? ps[i]->log : clog;
        if (!path[0])
            continue;
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char line[1200];
        while (fgets(line, sizeof line, f)) {
            const char *z = strstr(line, "Z ");
            int logged = z && (z[2] == 'W' || z[2] == 'E') && z[3] == ' ';
            if (!logged && !strstr(line, "Sanitizer") && !strstr(line, "runtime error:"))
                continue;
            total++;
            if (shown++ < 30)
                fprintf(b->out, "  %s: %s%s", i < n ? names[i] : "bench-client", line,
                        strchr(line, '\n') ? "" : "\n");
        }
        fclose(f);
    }
    if (total > 30)
        fprintf(b->out, "  ... %d more\n", total - 30);
    return total;
}

/* ------------------------------------------------------------ command */

/* The masters and nodes it starts inherit $KVPOOL_NODE_TOKEN: a standby
 * follows its leader's index only with the node credential. One is made
 * up when it is not set; both setups get it alike. 0, or -1 (no entropy). */
static int node_token_env(void)
{
    const char *t = getenv("KVPOOL_NODE_TOKEN");
    if (t && *t)
        return 0;
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        return -1;
    char hex[2 * sizeof r + 1];
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(hex + 2 * i, 3, "%02x", r[i]);
    return setenv("KVPOOL_NODE_TOKEN", hex, 1);
}

static int setup(hb *b)
{
    char why[192];
    if (node_token_env() != 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not make up a node token");
        return -1;
    }
    /* single: a master alone and its node */
    const char *sargs[] = {"master", NULL};
    if (start_master(b, &b->single, "single-master", sargs) != 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not start the single master");
        return -1;
    }
    if (start_node(b, &b->snode, "single-node", b->single.addr) != 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not start the single node");
        return -1;
    }
    /* cluster: etcd, a leader, a standby, a node that finds the leader */
    if (start_etcd(b) != 0)
        return -1;
    int m0 = start_cluster_master(b);
    if (m0 < 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not start the first cluster master");
        return -1;
    }
    char lead[64] = "";
    for (uint64_t end = kvp_now_ms() + 15000; kvp_now_ms() < end && strcmp(lead, b->m[m0].addr);
         usleep(20000))
        leader_now(b, lead, sizeof lead);
    if (strcmp(lead, b->m[m0].addr)) {
        snprintf(b->setup_why, sizeof b->setup_why, "the first master was not elected in 15 s");
        return -1;
    }
    if (start_cluster_master(b) < 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not start the standby");
        return -1;
    }
    if (start_node(b, &b->hnode, "cluster-node", b->url) != 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "could not start the cluster node");
        return -1;
    }
    const char *masters[NSETS] = {b->single.addr, b->url};
    for (int si = 0; si < NSETS; si++) {
        if (!(b->c[si] = open_client(masters[si], 0, why, sizeof why))) {
            snprintf(b->setup_why, sizeof b->setup_why, "%s client: %s", set_id[si], why);
            return -1;
        }
        char probe[KEYLEN];
        snprintf(probe, sizeof probe, "kvpool-bench/ha-%016llx@probe%d", b->nonce, si);
        if (kvp_bench_client_probe(b->c[si], probe, b->src, b->transport[si], why,
                                   sizeof why) != 0) {
            snprintf(b->setup_why, sizeof b->setup_why, "%s setup: %s", set_id[si], why);
            return -1;
        }
    }
    if (wait_in_sync(b, b->c[SET_CLUSTER], 1, 20000) < 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "the standby was not in sync within 20 s");
        return -1;
    }
    if (!(b->smp.c = open_client(b->url, 0, why, sizeof why))) {
        snprintf(b->setup_why, sizeof b->setup_why, "sampler client: %s", why);
        return -1;
    }
    b->smp.buf = kvp_malloc(STAT_CAP);
    b->smp.lag_max = -1;
    if (!b->smp.buf || pthread_create(&b->smp.th, NULL, sampler_main, &b->smp) != 0) {
        snprintf(b->setup_why, sizeof b->setup_why, "sampler thread");
        return -1;
    }
    b->smp.started = 1;
    return 0;
}

/* The sampler and clients closed, then every process stopped (SIGTERM:
 * nodes first, then masters; etcd SIGKILL). Idempotent. */
static void stop_all(hb *b)
{
    if (b->smp.started) {
        b->smp.stop = 1;
        pthread_join(b->smp.th, NULL);
        b->smp.started = 0;
    }
    kvp_client_close(b->smp.c);
    b->smp.c = NULL;
    for (int si = 0; si < NSETS; si++) {
        kvp_client_close(b->c[si]);
        b->c[si] = NULL;
    }
    proc_kill(&b->snode, SIGTERM);
    proc_kill(&b->hnode, SIGTERM);
    proc_kill(&b->single, SIGTERM);
    for (int i = 0; i < b->nm; i++)
        proc_kill(&b->m[i], SIGTERM);
    proc_kill(&b->etcd, SIGKILL);
}

static void teardown(hb *b)
{
    stop_all(b);
    kvp_free(b->smp.buf);
    b->smp.buf = NULL;
    for (int si = 0; si < NSETS; si++)
        for (int k = 0; k < NSHAPES; k++) {
            kvp_free(b->cells[si][k].put_lat);
            kvp_free(b->cells[si][k].get_lat);
        }
}

static void usage(void)
{
    printf("usage: kvpool bench ha [--json] [--ops N] [--failovers N] [--objects N]\n"
           "                       [--index-objects N] [--ha-lease-ttl DURATION] [--ha-sync BOOL]\n"
           "                       [--keep-logs]\n"
           "  a cluster of masters against one master alone, in one run: it starts etcd\n"
           "  (loopback, free ports, temp data dir; skipped when etcd is not installed), a\n"
           "  master with its node, and a leader + standby (etcd election) with theirs\n"
           "  (a) batch put/get keys/s and GB/s, 4 KiB x 256, 64 KiB x 64 and 1 MiB x 16,\n"
           "      cluster/single\n"
           "  (b) kill -9 of the leader: ms to a new leader, the first put, the first get of\n"
           "      a kept object; every acknowledged object read back byte for byte\n"
           "  (c) replication bytes per put and removal (repl_bytes), repl_lag while loaded,\n"
           "      the leader's and the standby's memory per object\n"
           "  --json             JSON on stdout, the text on stderr\n"
           "  --ops N            keys per shape and setup in (a), 64..1000000 (default 4096;\n"
           "                     at least %d batches)\n"
           "  --failovers N      leader kills in (b), 0..%d (default 3)\n"
           "  --objects N        64 KiB objects published before each kill, 1..10000\n"
           "                     (default 1000)\n"
           "  --ha-lease-ttl D   the masters' lease TTL (default 2s); --ha-sync,\n"
           "                     --ha-sync-timeout likewise go to the masters\n"
           "  --index-objects N  4 KiB objects for the index memory of the leader and the\n"
           "                     standby in (c), 0..200000 (default 200000; 0 = skip)\n"
           "  --keep-logs        keep the temp dir with every process's log\n"
           "  etcd: $KVPOOL_ETCD, else /usr/bin/etcd or /usr/local/bin/etcd\n",
           MIN_ROUNDS, MAX_FAILOVERS);
}

int kvp_bench_ha(int argc, char **argv)
{
    static const kvp_cli_flag own[] = {
        {"json", KVP_CLI_BOOL},      {"ops", KVP_CLI_TEXT},          {"failovers", KVP_CLI_TEXT},
        {"objects", KVP_CLI_TEXT},   {"keep-logs", KVP_CLI_BOOL},    {"index-objects", KVP_CLI_TEXT},
        {NULL, KVP_CLI_TEXT}};
    const char *v[6] = {NULL};
    hb *b = kvp_calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "kvpool bench ha: out of memory\n");
        return 1;
    }
    kvp_config_defaults(&b->cfg);
    int rc = kvp_cli_parse(argc, argv, &b->cfg, own, v, NULL);
    if (rc == 1) {
        usage();
        kvp_free(b);
        return 0;
    }
    uint64_t nfo = 3;
    b->ops = 4096;
    b->nobj = 1000;
    b->nidx = 200000;
    if (rc < 0 ||
        (v[5] && kvp_cli_uint("bench ha", "index-objects", v[5], 0, 200000, &b->nidx) != 0) ||
        (v[1] && kvp_cli_uint("bench ha", "ops", v[1], 64, 1000000, &b->ops) != 0) ||
        (v[2] && kvp_cli_uint("bench ha", "failovers", v[2], 0, MAX_FAILOVERS, &nfo) != 0) ||
        (v[3] && kvp_cli_uint("bench ha", "objects", v[3], 1, 10000, &b->nobj) != 0)) {
        kvp_free(b);
        return 2;
    }
    b->nfo = (int)nfo;
    b->json = v[0] != NULL;
    b->keep = v[4] != NULL;
    b->out = b->json ? stderr : stdout;
    if (find_etcd(b->etcd_bin, sizeof b->etcd_bin) != 0) {
        const char *why = "no etcd binary ($KVPOOL_ETCD, /usr/bin/etcd, /usr/local/bin/etcd; "
                          "Debian package etcd-server)";
        fprintf(b->out, "kvpool bench ha: skipped: %s\n", why);
        if (b->json)
            printf("{\n  \"bench\": \"ha\",\n  \"status\": \"skipped\",\n  \"reason\": \"%s\"\n}\n",
                   why);
        kvp_free(b);
        return 0;
    }
    signal(SIGPIPE, SIG_IGN);
    int ret = 1;
    const char *tmp = getenv("TMPDIR");
    snprintf(b->dir, sizeof b->dir, "%s/kvpool-bench-ha-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    b->nonce = ((unsigned long long)getpid() << 32) ^ kvp_now_ns();
    snprintf(b->transport[0], 16, "-");
    snprintf(b->transport[1], 16, "-");
    b->src = kvp_malloc(BUF_BYTES);
    b->dst = kvp_malloc(BUF_BYTES);
    b->statbuf = kvp_malloc(STAT_CAP);
    b->good = kvp_calloc((size_t)(b->nobj * nfo + 1), 1);
    if (!b->src || !b->dst || !b->statbuf || !b->good || !mkdtemp(b->dir)) {
        fprintf(stderr, "kvpool bench ha: out of memory or no temp dir\n");
        b->dir[0] = '\0';
        goto out;
    }
    /* bytes written before any timing: first touches are slow */
    fill(b->src, BUF_BYTES, 1);
    memset(b->dst, 0, BUF_BYTES);
    char clog[320];
    snprintf(clog, sizeof clog, "%s/bench-client.log", b->dir);
    log_fd = open(clog, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd >= 0)
        kvp_log_set_sink(&bench_sink);
    if (setup(b) != 0) {
        fprintf(stderr, "kvpool bench ha: %s (logs in %s)\n", b->setup_why, b->dir);
        b->keep = 1;
        goto out;
    }
    run_throughput(b);
    if (b->nidx)
        run_index_memory(b);
    for (int r = 0; r < b->nfo; r++) {
        kvp_bench_progress("failover", 10, "", 0, r, b->nfo);
        run_failover(b, r);
        b->nfo_done = r + 1;
        if (!b->fos[r].ok && b->fos[r].takeover_ms < 0)
            break; /* no cluster left to fail over */
    }
    kvp_bench_progress_clear(60);
    stop_all(b);
    print_text(b);
    fprintf(b->out, "warnings and errors the processes logged, and how they ended:\n");
    int bad = 0, nwarn = scan_logs(b, &bad);
    if (!nwarn && !bad)
        fprintf(b->out, "  none; every process stopped cleanly\n");
    if (b->json)
        print_json(b, nwarn, bad);
    ret = bad ? 1 : 0;
    for (int si = 0; si < NSETS; si++)
        for (int k = 0; k < NSHAPES; k++)
            if (!b->cells[si][k].ok)
                ret = 1;
    for (int i = 0; i < b->nfo_done; i++)
        if (!b->fos[i].ok || b->fos[i].lost || b->fos[i].newly_wrong || b->fos[i].wrong)
            ret = 1;
    if (b->nfo_done < b->nfo)
        ret = 1;
out:
    teardown(b);
    kvp_log_set_sink(NULL);
    if (log_fd >= 0)
        close(log_fd);
    log_fd = -1;
    if (b->dir[0]) {
        if (b->keep)
            fprintf(b->out, "logs kept in %s\n", b->dir);
        else
            nftw(b->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
    kvp_free(b->src);
    kvp_free(b->dst);
    kvp_free(b->statbuf);
    kvp_free(b->good);
    kvp_free(b);
    return ret;
}
