/*
 * bench_segment.c -- `kvpool bench segment`: what a fresh `kvpool serve`
 * costs its first users, per segment size (--size, a list) and page kind
 * (regular pages; with --hugetlb also 2 MiB hugetlb pages, reserved for
 * those rounds through /proc/sys/vm/nr_hugepages and given back after).
 *
 * Each round starts `kvpool serve --segment-size S` as a real process (free
 * loopback ports, --http on one of them, a private --unix-dir, its log at
 * INFO into a temporary file) and measures, from the fork:
 *   port file  the master's port written (the node is mounted by then);
 *   ready      /readyz answers 200: what an orchestrator polls (the master
 *              serves and the node is mounted at it);
 *   first put  a client opened in this process once ready has put 4 KiB
 *              (retried every millisecond until it succeeds).
 * Then a fresh client process (this program, `bench segment --child`: no
 * state shared with the bench) opens a standalone-store client and times:
 *   open       kvp_client_open (connect + HELLO to the master);
 *   attach     the shared-memory attach, as its own counters record it
 *              (kvp_xfer_shm_stats: unix connect, HELLO, SHM_ATTACH with the
 *              memfd over SCM_RIGHTS, the fd's checks, mmap without
 *              MAP_POPULATE): measured where it happens, not inferred;
 *   first op   its first 4 KiB put less the median of the next five: all a
 *              first put pays extra (the attach, its chunk's populate, the
 *              segment's first SEGMENT_INFO), the black-box check of attach;
 * then 1 MiB puts of fresh keys, flat out, while the node's background
 * prefault runs (until /metrics, read every 50 ms, shows it finished, or
 * the puts have taken half the segment), and --puts more fresh keys once it has finished (the
 * earlier keys stay, so those land in memory the client has not touched
 * either: the only difference is whether the node's prefault is done).
 * Per phase: p50 / p99 of a put and the share of put time the client
 * spent populating chunks on first touch (kvp_xfer_shm_stats: the part of
 * the first-touch cost that sat on the puts' path). The client's RSS after
 * the attach and first puts, and its peak RSS (wait4; it counts the
 * segment pages the client mapped by putting into them, shared with the
 * node).
 *   prefault   from the serve log: the timestamps of its "faulting in" and
 *              "faulted in" lines (ms); GB/s = segment bytes / that time.
 *
 * Per size and page kind: medians and ranges over --rounds, and the
 * product's goals (ready < 1 s, attach < 10 ms in every round; puts during
 * the prefault not slower than after it: p50 ratio <= 1.25). A size the
 * machine cannot back is reported as refused with serve's message (the
 * node's size check is not bypassed). Table on stdout (stderr with --json),
 * JSON on stdout with --json. Exit status 1 when a round failed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench.h"
#include "cli/cli.h"
#include "client/client_int.h"
#include "client/xfer.h"
#include "common/clock.h"
#include "common/mem.h"
#include "common/size.h"
#include "kvpool.h"
#include "net/net.h"

#define CMD "bench segment"
#define MAX_SIZES 8
#define MAX_ROUNDS 20
#define VAL (1u << 20)          /* the timed puts' value size */
#define SMALL 4096              /* the attach puts' value size */
#define POLL_NS 50000000ull     /* the child reads the prefault's progress this often:
                                   a /metrics request to the node, untimed */
#define SLOW_RATIO 1.25         /* puts during the prefault "slowed": p50 above this x after */
#define HUGE_2M (2ull << 20)

/* ------------------------------------------------------------ results */

/* One round of one size and page kind. Times in ms unless named _us. */
typedef struct round_res {
    int ok;
    char why[256];
    double load1;                       /* 1-minute load average at its start */
    double port_ms, ready_ms, put_ms;   /* from the fork */
    double open_ms, attach_ms, first_op_ms, first_put_us, steady_put_us;
    int attaches;
    char transport[16];
    double rss_attach_kb, rss_peak_kb;
    double prefault_s, prefault_gbps;
    int hugetlb;                        /* the serve log says the segment is hugetlb */
    double during_n, during_p50_us, during_p99_us, during_pop_share, during_mb, front_mb;
    double after_n, after_p50_us, after_p99_us, after_pop_share;
} round_res;

/* The fields aggregated over rounds: name, offset, JSON name. */
#define F(x) offsetof(round_res, x)
static const struct field {
    const char *json;
    size_t off;
} fields[] = {
    {"port_file_ms", F(port_ms)},         {"ready_ms", F(ready_ms)},
    {"first_put_ms", F(put_ms)},          {"client_open_ms", F(open_ms)},
    {"attach_ms", F(attach_ms)},          {"first_op_extra_ms", F(first_op_ms)},
    {"first_put_4k_us", F(first_put_us)}, {"steady_put_4k_us", F(steady_put_us)},
    {"rss_after_attach_kb", F(rss_attach_kb)}, {"peak_rss_kb", F(rss_peak_kb)},
    {"prefault_s", F(prefault_s)},        {"prefault_gbps", F(prefault_gbps)},
    {"during_puts", F(during_n)},         {"during_p50_us", F(during_p50_us)},
    {"during_p99_us", F(during_p99_us)},  {"during_populate_share", F(during_pop_share)},
    {"during_put_mb", F(during_mb)},      {"prefault_front_mb", F(front_mb)},
    {"after_puts", F(after_n)},           {"after_p50_us", F(after_p50_us)},
    {"after_p99_us", F(after_p99_us)},    {"after_populate_share", F(after_pop_share)},
};
#undef F
#define NFIELDS ((int)(sizeof fields / sizeof fields[0]))

typedef struct stat3 {
    double med, lo, hi;
    int n; /* rounds with a value (< 0 = none, e.g. no put during the prefault) */
} stat3;

static double fval(const round_res *r, int f) { return *(const double *)((const char *)r + fields[f].off); }

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and range of field f over the ok rounds where it is >= 0. */
static stat3 agg(const round_res *r, int n, int f)
{
    double v[MAX_ROUNDS];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (r[i].ok && fval(&r[i], f) >= 0)
            v[k++] = fval(&r[i], f);
    stat3 s = {-1, -1, -1, k};
    if (!k)
        return s;
    qsort(v, (size_t)k, sizeof *v, cmp_d);
    s.med = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
    s.lo = v[0];
    s.hi = v[k - 1];
    return s;
}

static int field_ix(const char *json)
{
    for (int f = 0; f < NFIELDS; f++)
        if (!strcmp(fields[f].json, json))
            return f;
    return -1;
}

/* ------------------------------------------------------------ helpers */

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static double ms_since(uint64_t t0) { return (double)(kvp_now_ns() - t0) / 1e6; }

/* GET path on 127.0.0.1:port over a fresh connection: the status code with
 * the body in out (NUL-terminated, cut at cap - 1), or -1. */
static int http_get(uint16_t port, const char *path, char *out, size_t cap)
{
    char addr[32], err[KVP_NET_ERRLEN], req[160];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    int fd = kvp_net_connect(addr, 2000, err, sizeof err);
    if (fd < 0)
        return -1;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n",
                     path);
    size_t got = 0;
    if (kvp_bench_write_all(fd, req, (size_t)n) != 0) {
        close(fd);
        return -1;
    }
    for (;;) {
        char tmp[16384];
        ssize_t r = read(fd, tmp, sizeof tmp);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        size_t k = got + (size_t)r < cap - 1 ? (size_t)r : cap - 1 - got;
        memcpy(out + got, tmp, k);
        got += k;
    }
    close(fd);
    out[got] = '\0';
    int code = -1;
    if (sscanf(out, "HTTP/1.%*d %d", &code) != 1)
        return -1;
    char *body = strstr(out, "\r\n\r\n");
    if (body)
        memmove(out, body + 4, strlen(body + 4) + 1);
    return code;
}

/* A sample of the node's /metrics (kvpool serve's endpoint), or -1. */
static int64_t metric(uint16_t port, const char *name, char *buf, size_t cap)
{
    if (http_get(port, "/metrics", buf, cap) != 200)
        return -1;
    size_t nl = strlen(name);
    for (const char *p = buf; (p = strstr(p, name)) != NULL; p += nl)
        if ((p == buf || p[-1] == '\n') && p[nl] == ' ')
            return strtoll(p + nl + 1, NULL, 10);
    return -1;
}

/* A loopback port nobody listens on now. */
static uint16_t free_port(void)
{
    uint16_t port = 0;
    char err[KVP_NET_ERRLEN];
    int fd = kvp_net_listen("127.0.0.1:0", 1, &port, err, sizeof err);
    if (fd < 0)
        return 0;
    close(fd);
    return port;
}

/* "key=value" of the child's report line: the value, or -1 when absent. */
static double kv_num(const char *line, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = line; (p = strstr(p, key)) != NULL; p += kl)
        if ((p == line || p[-1] == ' ') && p[kl] == '=')
            return strtod(p + kl + 1, NULL);
    return -1;
}

static uint64_t pct(uint64_t *v, size_t n, double q)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, kvp_bench_cmp_u64);
    return v[(size_t)((double)(n - 1) * q)];
}

/* VmHWM (peak) of this process in KiB, or -1. */
static double self_hwm_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = -1;
    unsigned long long v;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %llu kB", &v) == 1)
            kb = (double)v;
    if (f)
        fclose(f);
    return kb;
}

/* ------------------------------------------------------------ the child */

/*
 * `kvpool bench segment --child MASTER --child-http PORT --size S --puts N`:
 * the fresh client process. One line on stdout, "key=value ...", read by
 * the parent (kv_num); exit status 0, or 1 with the reason on stderr.
 */
static int child_main(const char *master, uint16_t http, uint64_t size, uint64_t puts)
{
    char why[256], *mbuf = kvp_malloc(1u << 20);
    uint8_t *val = kvp_malloc(VAL);
    uint64_t *lat = kvp_malloc((size_t)(size / VAL + 16) * sizeof *lat);
    if (!mbuf || !val || !lat) {
        fprintf(stderr, "kvpool " CMD ": out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < VAL; i++) /* touched before any timing */
        val[i] = (uint8_t)(i * 131 + 7);
    unsigned long long nonce = ((unsigned long long)getpid() << 32) ^ kvp_now_ns();
    char key[128];
    uint64_t t0 = kvp_now_ns();
    kvp_client *c = kvp_bench_client_open(master, NULL, 0, why, sizeof why);
    double open_ms = ms_since(t0);
    if (!c) {
        fprintf(stderr, "kvpool " CMD ": %s\n", why);
        return 1;
    }
    int ret = 1, rc;
    uint64_t small[6];
    for (int i = 0; i < 6; i++) { /* the first put attaches */
        snprintf(key, sizeof key, "bench-segment/%016llx/s%d", nonce, i);
        uint64_t s = kvp_now_ns();
        if ((rc = kvp_client_put(c, key, val, SMALL)) != 0) {
            fprintf(stderr, "kvpool " CMD ": 4 KiB put: %s\n", kvp_strerror(rc));
            goto out;
        }
        small[i] = kvp_now_ns() - s;
    }
    kvp_xfer_shm_stats st0;
    kvp_xfer_shm_stats_get(c->xfer, &st0);
    double rss_attach = self_hwm_kb();
    char desc[512], transport[16] = "unknown";
    if (kvp_client_describe(c, key, desc, sizeof desc) > 0) {
        const char *via = strstr(desc, " via ");
        if (via)
            snprintf(transport, sizeof transport, "%.*s", (int)strcspn(via + 5, " ;,\n"), via + 5);
    }
    uint64_t first = small[0];
    uint64_t steady = pct(small + 1, 5, 0.5);

    /* 1 MiB puts of fresh keys while the prefault runs: flat out, until
     * /metrics says it is done or the puts hold half the segment */
    int64_t faulted = metric(http, "kvpool_node_segment_faulted_bytes", mbuf, 1u << 20);
    int64_t segbytes = metric(http, "kvpool_node_segment_bytes", mbuf, 1u << 20);
    if (faulted < 0 || segbytes <= 0) {
        fprintf(stderr, "kvpool " CMD ": no prefault progress on /metrics (port %u)\n", http);
        goto out;
    }
    uint64_t nd = 0, seq = 0, sum_d = 0, poll_at = kvp_now_ns() + POLL_NS;
    kvp_xfer_shm_stats a, b;
    kvp_xfer_shm_stats_get(c->xfer, &a);
    while (faulted < segbytes && (nd + 1) * VAL <= (uint64_t)segbytes / 2) {
        snprintf(key, sizeof key, "bench-segment/%016llx/v%llu", nonce, (unsigned long long)seq++);
        uint64_t s = kvp_now_ns();
        if ((rc = kvp_client_put(c, key, val, VAL)) != 0) {
            fprintf(stderr, "kvpool " CMD ": 1 MiB put during the prefault: %s\n",
                    kvp_strerror(rc));
            goto out;
        }
        lat[nd] = kvp_now_ns() - s;
        sum_d += lat[nd++];
        if (kvp_now_ns() >= poll_at) { /* untimed */
            int64_t f = metric(http, "kvpool_node_segment_faulted_bytes", mbuf, 1u << 20);
            faulted = f >= 0 ? f : faulted;
            poll_at = kvp_now_ns() + POLL_NS;
        }
    }
    kvp_xfer_shm_stats_get(c->xfer, &b);
    double front_mb = (double)faulted / 1048576.0;
    uint64_t d50 = pct(lat, nd, 0.5), d99 = pct(lat, nd, 0.99);
    double dshare = sum_d ? (double)(b.populate_ns - a.populate_ns) / (double)sum_d : 0;

    /* wait for the prefault's end (bounded: 60 s + 50 MB/s) */
    uint64_t until = kvp_now_ns() + 60000000000ull + (uint64_t)segbytes * 20;
    while (faulted < segbytes && kvp_now_ns() < until) {
        sleep_ms(50);
        int64_t f = metric(http, "kvpool_node_segment_faulted_bytes", mbuf, 1u << 20);
        faulted = f >= 0 ? f : faulted;
    }
    if (faulted < segbytes) {
        fprintf(stderr, "kvpool " CMD ": the prefault did not finish (%lld of %lld bytes)\n",
                (long long)faulted, (long long)segbytes);
        goto out;
    }
    /* the same puts once it is done, on fresh keys (memory this client has
     * not touched either), up to 85 % of the segment in all */
    uint64_t room = (uint64_t)segbytes / 100 * 85 / VAL;
    uint64_t na_max = room > nd ? room - nd : 0, na = 0, sum_a = 0;
    if (puts < na_max)
        na_max = puts;
    kvp_xfer_shm_stats_get(c->xfer, &a);
    for (; na < na_max; na++) {
        snprintf(key, sizeof key, "bench-segment/%016llx/v%llu", nonce, (unsigned long long)seq++);
        uint64_t s = kvp_now_ns();
        if ((rc = kvp_client_put(c, key, val, VAL)) != 0) {
            fprintf(stderr, "kvpool " CMD ": 1 MiB put after the prefault: %s\n",
                    kvp_strerror(rc));
            goto out;
        }
        lat[na] = kvp_now_ns() - s;
        sum_a += lat[na];
    }
    kvp_xfer_shm_stats_get(c->xfer, &b);
    uint64_t a50 = pct(lat, na, 0.5), a99 = pct(lat, na, 0.99);
    double ashare = sum_a ? (double)(b.populate_ns - a.populate_ns) / (double)sum_a : 0;
    char re[96];
    snprintf(re, sizeof re, "^bench-segment/%016llx/", nonce);
    kvp_client_remove_regex(c, re, 1);
    printf("client_open_ms=%.3f attaches=%llu attach_ms=%.3f first_put_4k_us=%.1f steady_put_4k_us=%.1f "
           "first_op_extra_ms=%.3f rss_after_attach_kb=%.0f transport=%s during_puts=%llu "
           "during_p50_us=%.1f during_p99_us=%.1f during_populate_share=%.4f during_put_mb=%llu "
           "prefault_front_mb=%.0f after_puts=%llu after_p50_us=%.1f after_p99_us=%.1f "
           "after_populate_share=%.4f\n",
           open_ms, (unsigned long long)st0.attaches,
           st0.attaches ? (double)st0.attach_ns / (double)st0.attaches / 1e6 : -1.0,
           (double)first / 1e3, (double)steady / 1e3,
           ((double)first - (double)steady) / 1e6, rss_attach, transport,
           (unsigned long long)nd, nd ? (double)d50 / 1e3 : -1.0, nd ? (double)d99 / 1e3 : -1.0,
           nd ? dshare : -1.0, (unsigned long long)nd, front_mb, (unsigned long long)na,
           na ? (double)a50 / 1e3 : -1.0, na ? (double)a99 / 1e3 : -1.0, na ? ashare : -1.0);
    fflush(stdout);
    ret = 0;
out:
    kvp_client_close(c);
    kvp_free(mbuf);
    kvp_free(val);
    kvp_free(lat);
    return ret;
}

/* ------------------------------------------------------------ hugetlb */

#define NR_HUGE "/proc/sys/vm/nr_hugepages"

static volatile sig_atomic_t g_huge_restore = 0; /* a reservation to give back */
static char g_huge_old[32];                      /* nr_hugepages before it */

static long read_long(const char *path)
{
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static int write_str(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, s, strlen(s));
    close(fd);
    return n == (ssize_t)strlen(s) ? 0 : -1;
}

/* Free 2 MiB pages of the default pool (HugePages_Free when Hugepagesize
 * is 2048 kB), or -1. */
static long huge_free(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    long fr = -1, sz = -1;
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "HugePages_Free: %ld", &fr);
        sscanf(line, "Hugepagesize: %ld kB", &sz);
    }
    if (f)
        fclose(f);
    return sz == 2048 ? fr : -1;
}

static void huge_give_back(void)
{
    if (!g_huge_restore)
        return;
    write_str(NR_HUGE, g_huge_old); /* async-signal-safe: open, write, close */
    g_huge_restore = 0;
}

static void on_signal(int sig)
{
    huge_give_back();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Reserves `need` more free 2 MiB pages (nr_hugepages raised by what is
 * missing); given back by huge_give_back (also on SIGINT / SIGTERM / SIGHUP).
 * 0, or -1 with why (nothing left reserved). */
static int huge_reserve(uint64_t need, char *why, size_t wl)
{
    long old = read_long(NR_HUGE), fr = huge_free();
    if (old < 0 || fr < 0) {
        snprintf(why, wl, "cannot read %s or the 2 MiB huge page pool in /proc/meminfo", NR_HUGE);
        return -1;
    }
    if ((uint64_t)fr >= need)
        return 0;
    snprintf(g_huge_old, sizeof g_huge_old, "%ld\n", old);
    char want[32];
    snprintf(want, sizeof want, "%llu\n", (unsigned long long)((uint64_t)old + need - (uint64_t)fr));
    g_huge_restore = 1;
    if (write_str(NR_HUGE, want) != 0) {
        snprintf(why, wl, "cannot write %s: %s", NR_HUGE, strerror(errno));
        huge_give_back();
        return -1;
    }
    fr = huge_free();
    if (fr < 0 || (uint64_t)fr < need) {
        snprintf(why, wl, "the kernel reserved only %ld of the %llu free 2 MiB pages needed "
                 "(memory in use or fragmented)", fr < 0 ? 0 : fr, (unsigned long long)need);
        huge_give_back();
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ serve */

typedef struct srv {
    pid_t pid;
    char dir[64], log[96], pfile[96];
    char addr[64];
    uint16_t http;
    uint64_t t0; /* just before the fork */
} srv;

/* Starts `kvpool serve` on free loopback ports, its log into s->log. */
static int srv_start(srv *s, const char *size, char *why, size_t wl)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "/tmp/kvpool-segbench-XXXXXX");
    if (!mkdtemp(s->dir) || !(s->http = free_port())) {
        snprintf(why, wl, "temporary directory or free port: %s", strerror(errno));
        return -1;
    }
    snprintf(s->log, sizeof s->log, "%s/serve.log", s->dir);
    snprintf(s->pfile, sizeof s->pfile, "%s/port", s->dir);
    char http[32];
    snprintf(http, sizeof http, "127.0.0.1:%u", s->http);
    const char *argv[] = {"kvpool", "serve", "--segment-size", size, "--listen", "127.0.0.1:0",
                          "--port-file", s->pfile, "--http", http, "--unix-dir", s->dir,
                          "--log-level", "info", "--log-format", "text", NULL};
    fflush(stdout);
    fflush(stderr);
    s->t0 = kvp_now_ns();
    s->pid = fork();
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int in = open("/dev/null", O_RDONLY), out = open("/dev/null", O_WRONLY);
        int err = open(s->log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (in < 0 || out < 0 || err < 0)
            _exit(126);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    if (s->pid < 0) {
        snprintf(why, wl, "fork: %s", strerror(errno));
        return -1;
    }
    return 0;
}

/* The first line of the serve log containing `what` (its text in line). */
static int log_line(const srv *s, const char *what, char *line, size_t cap)
{
    FILE *f = fopen(s->log, "r");
    int found = 0;
    while (f && !found && fgets(line, (int)cap, f))
        found = strstr(line, what) != NULL;
    if (f)
        fclose(f);
    if (found)
        line[strcspn(line, "\n")] = '\0';
    return found;
}

/* Seconds of the day of a log line's timestamp (…THH:MM:SS.mmmZ), or -1. */
static double log_time(const char *line)
{
    int h, m, sec, ms;
    const char *t = strchr(line, 'T');
    if (!t || sscanf(t, "T%d:%d:%d.%dZ", &h, &m, &sec, &ms) != 4)
        return -1;
    return h * 3600.0 + m * 60.0 + sec + ms / 1000.0;
}

/* Stops it (SIGTERM, 30 s, then SIGKILL) if it runs; removes its files. */
static void srv_stop(srv *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        for (int i = 0; i < 3000 && waitpid(s->pid, NULL, WNOHANG) == 0; i++)
            sleep_ms(10);
        if (kill(s->pid, 0) == 0) {
            kill(s->pid, SIGKILL);
            waitpid(s->pid, NULL, 0);
        }
        s->pid = 0;
    }
    /* the log, the port file, and the node's socket if it was killed */
    DIR *d = s->dir[0] ? opendir(s->dir) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            unlinkat(dirfd(d), e->d_name, 0);
    if (d)
        closedir(d);
    rmdir(s->dir);
}

/* The serve process exited: its message (the log's last "kvpool serve:"
 * line, else the status) in why. */
static int srv_died(srv *s, char *why, size_t wl)
{
    int st;
    if (waitpid(s->pid, &st, WNOHANG) != s->pid)
        return 0;
    s->pid = 0;
    char line[512];
    if (log_line(s, "kvpool serve: ", line, sizeof line))
        snprintf(why, wl, "%s", strstr(line, "kvpool serve: "));
    else
        snprintf(why, wl, "kvpool serve exited (status %d)", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 1;
}

/* ------------------------------------------------------------ a round */

/* Runs the fresh client process; its report line in line. 0 or -1. */
static int run_child(const srv *s, const char *size, uint64_t puts, char *line, size_t cap,
                     double *peak_kb, char *why, size_t wl)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(why, wl, "pipe: %s", strerror(errno));
        return -1;
    }
    char hp[16], np[24];
    snprintf(hp, sizeof hp, "%u", s->http);
    snprintf(np, sizeof np, "%llu", (unsigned long long)puts);
    const char *argv[] = {"kvpool", "bench", "segment", "--child", s->addr, "--child-http", hp,
                          "--size", size, "--puts", np, NULL};
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(pfd[1], 1);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        snprintf(why, wl, "fork: %s", strerror(errno));
        return -1;
    }
    size_t got = 0;
    uint64_t until = kvp_now_ms() + 900000; /* the child bounds itself well within */
    while (got + 1 < cap && kvp_now_ms() < until) {
        struct pollfd p = {pfd[0], POLLIN, 0};
        if (poll(&p, 1, 1000) <= 0)
            continue;
        ssize_t r = read(pfd[0], line + got, cap - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    line[got] = '\0';
    close(pfd[0]);
    if (kvp_now_ms() >= until)
        kill(pid, SIGKILL);
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &st, 0, &ru) < 0 && errno == EINTR) {
    }
    *peak_kb = (double)ru.ru_maxrss;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !strchr(line, '\n')) {
        snprintf(why, wl, "the client process failed (status %d; its message is above)",
                 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        return -1;
    }
    return 0;
}

static void one_round(const char *size, uint64_t puts, round_res *r)
{
    char why[256] = "", line[4096];
    memset(r, 0, sizeof *r);
    srv s = {0};
    double la[1] = {0};
    r->load1 = getloadavg(la, 1) == 1 ? la[0] : -1;
    if (srv_start(&s, size, why, sizeof why) != 0)
        goto fail;
    /* the port file: the master serves and the node is mounted */
    for (;;) {
        FILE *f = fopen(s.pfile, "r");
        unsigned port = 0;
        int ok = f && fscanf(f, "%u", &port) == 1;
        if (f)
            fclose(f);
        if (ok) {
            r->port_ms = ms_since(s.t0);
            snprintf(s.addr, sizeof s.addr, "127.0.0.1:%u", port);
            break;
        }
        if (srv_died(&s, why, sizeof why))
            goto fail;
        if (ms_since(s.t0) > 60000) {
            snprintf(why, sizeof why, "no port file within 60 s");
            goto fail;
        }
        sleep_ms(1);
    }
    for (;;) { /* /readyz */
        char body[512];
        if (http_get(s.http, "/readyz", body, sizeof body) == 200) {
            r->ready_ms = ms_since(s.t0);
            break;
        }
        if (srv_died(&s, why, sizeof why))
            goto fail;
        if (ms_since(s.t0) > 60000) {
            snprintf(why, sizeof why, "/readyz not 200 within 60 s");
            goto fail;
        }
        sleep_ms(1);
    }
    { /* a client opened now can put */
        static uint8_t v[SMALL];
        kvp_client *c = NULL;
        int rc = -1;
        while (ms_since(s.t0) < 60000) {
            if (!c)
                c = kvp_bench_client_open(s.addr, NULL, 0, why, sizeof why);
            if (c && (rc = kvp_client_put(c, "bench-segment/ready", v, sizeof v)) == 0)
                break;
            sleep_ms(1);
        }
        if (rc == 0) {
            r->put_ms = ms_since(s.t0);
            kvp_client_remove(c, "bench-segment/ready", 1);
        }
        kvp_client_close(c);
        if (rc != 0) {
            if (c)
                snprintf(why, sizeof why, "no 4 KiB put succeeded within 60 s: %s",
                         kvp_strerror(rc));
            goto fail;
        }
    }
    if (run_child(&s, size, puts, line, sizeof line, &r->rss_peak_kb, why, sizeof why) != 0)
        goto fail;
    for (int f = 0; f < NFIELDS; f++) {
        double *p = (double *)((char *)r + fields[f].off);
        if (fields[f].off != offsetof(round_res, rss_peak_kb) &&
            fields[f].off != offsetof(round_res, port_ms) &&
            fields[f].off != offsetof(round_res, ready_ms) &&
            fields[f].off != offsetof(round_res, put_ms) &&
            fields[f].off != offsetof(round_res, prefault_s) &&
            fields[f].off != offsetof(round_res, prefault_gbps))
            *p = kv_num(line, fields[f].json);
    }
    r->attaches = (int)kv_num(line, "attaches");
    const char *tp = strstr(line, "transport=");
    snprintf(r->transport, sizeof r->transport, "%.*s", tp ? (int)strcspn(tp + 10, " \n") : 1,
             tp ? tp + 10 : "?");
    /* the prefault, from the log (its end line follows its last progress
     * store by microseconds: wait a little for it) */
    char l0[512], l1[512];
    r->prefault_s = r->prefault_gbps = -1;
    for (int i = 0; i < 500 && !log_line(&s, " faulted in in ", l1, sizeof l1); i++)
        sleep_ms(10);
    if (log_line(&s, "segment: faulting in ", l0, sizeof l0) &&
        log_line(&s, " faulted in in ", l1, sizeof l1)) {
        double a = log_time(l0), b = log_time(l1);
        if (a >= 0 && b >= 0) {
            if (b < a)
                b += 86400;
            r->prefault_s = b - a;
            uint64_t bytes = 0;
            kvp_size_parse(size, &bytes);
            r->prefault_gbps = b > a ? (double)bytes / (b - a) / 1e9 : -1;
        }
        r->hugetlb = strstr(l0, "(hugetlb)") != NULL;
    }
    r->ok = 1;
    srv_stop(&s);
    return;
fail:
    snprintf(r->why, sizeof r->why, "%s", why);
    srv_stop(&s);
}

/* ------------------------------------------------------------ report */

typedef struct config {
    char size[32];
    uint64_t bytes;
    int hugetlb;        /* asked for hugetlb pages */
    int skipped;        /* not run: why */
    char why[256];
    int nr;
    round_res r[MAX_ROUNDS];
} config;

static const char *cell(char *buf, size_t n, stat3 s, const char *fmt)
{
    if (s.n == 0) {
        snprintf(buf, n, "-");
        return buf;
    }
    char a[24], b[24], c[24];
    snprintf(a, sizeof a, fmt, s.med);
    snprintf(b, sizeof b, fmt, s.lo);
    snprintf(c, sizeof c, fmt, s.hi);
    if (s.n == 1)
        snprintf(buf, n, "%s", a);
    else
        snprintf(buf, n, "%s (%s-%s)", a, b, c);
    return buf;
}

static stat3 S(const config *c, const char *f) { return agg(c->r, c->nr, field_ix(f)); }

/* A config's goals: 1 met, 0 missed, -1 not measured. */
static void goals(const config *c, int *ready, int *attach, int *puts, double *ratio50,
                  double *ratio99)
{
    stat3 rd = S(c, "ready_ms"), at = S(c, "attach_ms"), d = S(c, "during_p50_us"),
          a = S(c, "after_p50_us"), d9 = S(c, "during_p99_us"), a9 = S(c, "after_p99_us");
    *ready = rd.n ? rd.hi < 1000 : -1;
    *attach = at.n ? at.hi < 10 : -1;
    *ratio50 = d.n && a.n && a.med > 0 ? d.med / a.med : -1;
    *ratio99 = d9.n && a9.n && a9.med > 0 ? d9.med / a9.med : -1;
    *puts = *ratio50 < 0 ? -1 : *ratio50 <= SLOW_RATIO;
}

static const char *goal_word(int g) { return g < 0 ? "n/a" : g ? "met" : "MISSED"; }

static void print_table(FILE *o, const config *cf, int n, int rounds, uint64_t puts)
{
    fprintf(o, "kvpool bench segment: a fresh `kvpool serve` per round, %d rounds per row; "
               "median (range); ms unless said\n", rounds);
    fprintf(o, "  %-9s %-8s %-18s %-18s %-18s %-16s %-18s %-18s %-14s %-14s\n", "size", "pages",
            "port file", "ready (/readyz)", "first put", "client open", "attach", "first op +",
            "RSS attach MB", "RSS peak MB");
    char b[10][96];
    for (int i = 0; i < n; i++) {
        const config *c = &cf[i];
        const char *pk = c->hugetlb ? "hugetlb" : "regular";
        if (c->skipped) {
            fprintf(o, "  %-9s %-8s %s\n", c->size, pk, c->why);
            continue;
        }
        stat3 ra = S(c, "rss_after_attach_kb"), rp = S(c, "peak_rss_kb");
        ra.med /= 1024, ra.lo /= 1024, ra.hi /= 1024, rp.med /= 1024, rp.lo /= 1024, rp.hi /= 1024;
        fprintf(o, "  %-9s %-8s %-18s %-18s %-18s %-16s %-18s %-18s %-14s %-14s\n", c->size, pk,
                cell(b[0], 96, S(c, "port_file_ms"), "%.0f"), cell(b[1], 96, S(c, "ready_ms"), "%.0f"),
                cell(b[2], 96, S(c, "first_put_ms"), "%.0f"),
                cell(b[3], 96, S(c, "client_open_ms"), "%.2f"),
                cell(b[4], 96, S(c, "attach_ms"), "%.3f"),
                cell(b[5], 96, S(c, "first_op_extra_ms"), "%.2f"), cell(b[6], 96, ra, "%.0f"),
                cell(b[7], 96, rp, "%.0f"));
    }
    fprintf(o, "  1 MiB puts (us) while the prefault runs and after it (%llu), the share of put "
               "time spent populating fresh chunks, the prefault\n", (unsigned long long)puts);
    fprintf(o, "  %-9s %-8s %-11s %-16s %-18s %-14s %-7s %-16s %-18s %-9s %-16s %-14s\n", "size",
            "pages", "during n", "p50", "p99", "populate", "after n", "p50", "p99", "populate",
            "prefault s", "GB/s");
    for (int i = 0; i < n; i++) {
        const config *c = &cf[i];
        if (c->skipped)
            continue;
        fprintf(o, "  %-9s %-8s %-11s %-16s %-18s %-14s %-7s %-16s %-18s %-9s %-16s %-14s\n",
                c->size, c->hugetlb ? "hugetlb" : "regular",
                cell(b[0], 96, S(c, "during_puts"), "%.0f"),
                cell(b[1], 96, S(c, "during_p50_us"), "%.0f"),
                cell(b[2], 96, S(c, "during_p99_us"), "%.0f"),
                cell(b[3], 96, S(c, "during_populate_share"), "%.2f"),
                cell(b[4], 96, S(c, "after_puts"), "%.0f"),
                cell(b[5], 96, S(c, "after_p50_us"), "%.0f"),
                cell(b[6], 96, S(c, "after_p99_us"), "%.0f"),
                cell(b[7], 96, S(c, "after_populate_share"), "%.2f"),
                cell(b[8], 96, S(c, "prefault_s"), "%.2f"),
                cell(b[9], 96, S(c, "prefault_gbps"), "%.2f"));
    }
    fprintf(o, "  goals: ready < 1 s and attach < 10 ms in every round; puts during the prefault "
               "not slowed (p50 <= %.2fx after)\n", SLOW_RATIO);
    for (int i = 0; i < n; i++) {
        const config *c = &cf[i];
        if (c->skipped)
            continue;
        int g1, g2, g3;
        double r50, r99;
        goals(c, &g1, &g2, &g3, &r50, &r99);
        int hb = 0;
        for (int k = 0; k < c->nr; k++)
            hb += c->r[k].ok && c->r[k].hugetlb;
        fprintf(o, "  %-9s %-8s ready %s, attach %s, puts %s (during/after p50 %.2f, p99 %.2f); "
                   "hugetlb-backed rounds %d/%d\n",
                c->size, c->hugetlb ? "hugetlb" : "regular", goal_word(g1), goal_word(g2), goal_word(g3), r50, r99,
                hb, c->nr);
        for (int k = 0; k < c->nr; k++)
            if (!c->r[k].ok)
                fprintf(o, "    round %d failed: %s\n", k + 1, c->r[k].why);
    }
}

static void json_stat(const char *name, stat3 s, int last)
{
    if (s.n == 0)
        printf("      \"%s\": null%s\n", name, last ? "" : ",");
    else
        printf("      \"%s\": {\"median\": %.4g, \"min\": %.4g, \"max\": %.4g}%s\n", name, s.med,
               s.lo, s.hi, last ? "" : ",");
}

static void print_json(const config *cf, int n, int rounds, uint64_t puts)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned long long mem = (unsigned long long)sysconf(_SC_PHYS_PAGES) *
                             (unsigned long long)sysconf(_SC_PAGESIZE);
    char thp[128] = "unknown";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    if (f) {
        if (fgets(thp, sizeof thp, f))
            thp[strcspn(thp, "\n")] = '\0';
        fclose(f);
    }
    char esc[512];
    kvp_bench_json_escape(esc, sizeof esc, thp);
    printf("{\n  \"bench\": \"segment\",\n  \"rounds\": %d,\n  \"put_bytes\": %u,\n"
           "  \"puts_after\": %llu,\n  \"machine\": {\"cpus\": %ld, \"mem_bytes\": %llu, "
           "\"shmem_thp\": \"%s\"},\n  \"goals\": {\"ready_ms_below\": 1000, \"attach_ms_below\": 10, "
           "\"during_after_p50_at_most\": %.2f},\n  \"configs\": [\n",
           rounds, VAL, (unsigned long long)puts, cpus, mem, esc, SLOW_RATIO);
    for (int i = 0; i < n; i++) {
        const config *c = &cf[i];
        kvp_bench_json_escape(esc, sizeof esc, c->why);
        printf("    {\n      \"size\": \"%s\",\n      \"size_bytes\": %llu,\n"
               "      \"pages\": \"%s\",\n", c->size, (unsigned long long)c->bytes,
               c->hugetlb ? "hugetlb" : "regular");
        if (c->skipped) {
            printf("      \"status\": \"skipped\",\n      \"reason\": \"%s\"\n    }%s\n", esc,
                   i + 1 < n ? "," : "");
            continue;
        }
        int ok = 0, hb = 0;
        for (int k = 0; k < c->nr; k++)
            ok += c->r[k].ok, hb += c->r[k].ok && c->r[k].hugetlb;
        printf("      \"status\": \"%s\",\n      \"rounds_ok\": %d,\n"
               "      \"hugetlb_backed_rounds\": %d,\n", ok == c->nr ? "ok" : ok ? "partial" : "failed",
               ok, hb);
        for (int f2 = 0; f2 < NFIELDS; f2++)
            json_stat(fields[f2].json, agg(c->r, c->nr, f2), 0);
        int g1, g2, g3;
        double r50, r99;
        goals(c, &g1, &g2, &g3, &r50, &r99);
        printf("      \"during_after_p50_ratio\": %.3f,\n      \"during_after_p99_ratio\": %.3f,\n",
               r50, r99);
        printf("      \"goals_met\": {\"ready\": %s, \"attach\": %s, \"puts_not_slowed\": %s},\n",
               g1 < 0 ? "null" : g1 ? "true" : "false", g2 < 0 ? "null" : g2 ? "true" : "false",
               g3 < 0 ? "null" : g3 ? "true" : "false");
        printf("      \"per_round\": [\n");
        for (int k = 0; k < c->nr; k++) {
            const round_res *r = &c->r[k];
            if (!r->ok) {
                kvp_bench_json_escape(esc, sizeof esc, r->why);
                printf("        {\"ok\": false, \"reason\": \"%s\"}%s\n", esc,
                       k + 1 < c->nr ? "," : "");
                continue;
            }
            printf("        {\"ok\": true, \"load1\": %.2f, \"hugetlb\": %s, \"transport\": \"%s\", "
                   "\"attaches\": %d", r->load1, r->hugetlb ? "true" : "false", r->transport,
                   r->attaches);
            for (int f2 = 0; f2 < NFIELDS; f2++)
                printf(", \"%s\": %.4g", fields[f2].json, fval(r, f2));
            printf("}%s\n", k + 1 < c->nr ? "," : "");
        }
        printf("      ]\n    }%s\n", i + 1 < n ? "," : "");
    }
    printf("  ]\n}\n");
}

/* ------------------------------------------------------------ command */

static void usage(void)
{
    printf("usage: kvpool bench segment [--json] [--size SIZE[,SIZE...]] [--rounds N]\n"
           "                            [--puts N] [--hugetlb]\n"
           "  starts `kvpool serve --segment-size SIZE` (a fresh process per round) and\n"
           "  measures: ready (fork until /readyz is 200; until the port file; until a\n"
           "  client can put), a fresh client process's open and shm attach (SHM_ATTACH +\n"
           "  mmap, from the client's own counters) and its first put's extra cost, 1 MiB\n"
           "  put p50/p99 while the background prefault runs and after it, the prefault's\n"
           "  time and GB/s (serve log), the client's RSS\n"
           "  --json         JSON on stdout, the table on stderr\n"
           "  --size LIST    segment sizes, comma-separated (default 4GiB); one larger\n"
           "                 than the machine can back is reported as refused\n"
           "  --rounds N     fresh serve processes per size, 1..%d (default 3)\n"
           "  --puts N       1 MiB puts after the prefault, 1..100000 (default 200; at\n"
           "                 most what fits in 85 %% of the segment)\n"
           "  --hugetlb      also measure every size on 2 MiB hugetlb pages: reserves them\n"
           "                 (root: /proc/sys/vm/nr_hugepages) for those rounds and\n"
           "                 restores the old value after; a size it cannot reserve is\n"
           "                 reported as skipped\n",
           MAX_ROUNDS);
}

int kvp_bench_segment(int argc, char **argv)
{
    static const kvp_cli_flag own[] = {{"json", KVP_CLI_BOOL},     {"size", KVP_CLI_TEXT},
                                       {"rounds", KVP_CLI_TEXT},   {"puts", KVP_CLI_TEXT},
                                       {"hugetlb", KVP_CLI_BOOL},  {"child", KVP_CLI_CONNECT},
                                       {"child-http", KVP_CLI_TEXT}, {NULL, KVP_CLI_TEXT}};
    const char *v[7] = {NULL};
    int rc = kvp_cli_scan(argc, argv, own, v, NULL);
    if (rc == 1) {
        usage();
        return 0;
    }
    if (rc < 0)
        return 2;
    uint64_t rounds = 3, puts = 200;
    if ((v[2] && kvp_cli_uint(CMD, "rounds", v[2], 1, MAX_ROUNDS, &rounds) != 0) ||
        (v[3] && kvp_cli_uint(CMD, "puts", v[3], 1, 100000, &puts) != 0))
        return 2;
    config *cf = kvp_calloc(2 * MAX_SIZES, sizeof *cf);
    if (!cf) {
        fprintf(stderr, "kvpool " CMD ": out of memory\n");
        return 1;
    }
    int nsz = 0;
    { /* --size: a comma-separated list, no empty item */
        const char *list = v[1] ? v[1] : "4GiB";
        for (const char *p = list;; p++) {
            size_t l = strcspn(p, ",");
            char t[sizeof cf[0].size], q[96];
            if (l == 0 || l >= sizeof t || nsz == MAX_SIZES) {
                fprintf(stderr, "kvpool " CMD ": flag --size: value %s %s (allowed: at most %d "
                        "sizes, comma-separated)\n", kvp_cli_quote(list, q, sizeof q),
                        nsz == MAX_SIZES ? "names too many sizes" : "has an empty or overlong item",
                        MAX_SIZES);
                kvp_free(cf);
                return 2;
            }
            memcpy(t, p, l);
            t[l] = '\0';
            if (kvp_cli_size(CMD, "size", t, 16u << 20, 1ull << 46, &cf[nsz].bytes) != 0) {
                kvp_free(cf);
                return 2;
            }
            snprintf(cf[nsz].size, sizeof cf[nsz].size, "%s", t);
            nsz++;
            p += l;
            if (!*p)
                break;
        }
    }
    if (v[5]) { /* the fresh client process */
        uint64_t hp = 0;
        int r = v[6] && kvp_cli_uint(CMD, "child-http", v[6], 1, 65535, &hp) == 0
                    ? child_main(v[5], (uint16_t)hp, cf[0].bytes, puts)
                    : 2;
        kvp_free(cf);
        return r;
    }
    int huge = v[4] != NULL;
    if (huge && access(NR_HUGE, W_OK) != 0) {
        fprintf(stderr, "kvpool " CMD ": --hugetlb reserves 2 MiB pages through %s, which this "
                "process cannot write (%s): run it as root, or without --hugetlb\n", NR_HUGE,
                strerror(errno));
        kvp_free(cf);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    if (huge) {
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGHUP, on_signal);
    }
    FILE *out = v[0] ? stderr : stdout;
    int n, ret = 0;
    /* the rows: size x page kind (cf[0..nsz) hold the sizes; spread from
     * the last so that none is overwritten before it is copied) */
    for (int i = nsz - 1; i >= 0; i--)
        for (int h = huge; h >= 0; h--) {
            config tmp = cf[i];
            tmp.hugetlb = h;
            tmp.nr = 0;
            cf[i * (huge + 1) + h] = tmp;
        }
    n = nsz * (huge + 1);
    for (int i = 0; i < n; i++) {
        config *c = &cf[i];
        char why[256];
        if (c->hugetlb) {
            if (c->bytes % HUGE_2M) {
                c->skipped = 1;
                snprintf(c->why, sizeof c->why, "skipped: not a multiple of 2 MiB");
                continue;
            }
            if (huge_reserve(c->bytes / HUGE_2M, why, sizeof why) != 0) {
                c->skipped = 1;
                snprintf(c->why, sizeof c->why, "skipped: %.200s", why);
                continue;
            }
        }
        for (int k = 0; k < (int)rounds; k++) {
            kvp_bench_progress(c->size, 8, c->hugetlb ? "hugetlb" : "regular", 7, k, (int)rounds);
            one_round(c->size, puts, &c->r[k]);
            c->nr = k + 1;
            if (!c->r[k].ok) {
                ret = 1;
                /* a size the machine cannot back is refused at once: say so
                 * for the row instead of repeating it */
                if (strstr(c->r[k].why, "exceeds the memory")) {
                    c->skipped = 1;
                    snprintf(c->why, sizeof c->why, "refused: %.200s", c->r[k].why);
                    ret = 0;
                    break;
                }
            }
            if (c->hugetlb && c->r[k].ok && !c->r[k].hugetlb) {
                fprintf(stderr, "kvpool " CMD ": %s round %d used regular pages although %llu "
                        "huge pages were reserved\n", c->size, k + 1,
                        (unsigned long long)(c->bytes / HUGE_2M));
                ret = 1;
            }
        }
        if (c->hugetlb)
            huge_give_back();
    }
    kvp_bench_progress_clear(60);
    print_table(out, cf, n, (int)rounds, puts);
    if (v[0])
        print_json(cf, n, (int)rounds, puts);
    kvp_free(cf);
    return ret;
}
